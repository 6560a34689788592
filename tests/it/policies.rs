//! `ichor policies audit`: the maintainers' view of the shipped data.

use crate::{ichor, stderr, stdout};

#[test]
fn audit_lists_stale_rows_and_fixture_versions_without_a_row() {
    let o = ichor(&["policies", "audit", "--today", "2026-12-01"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("Policy audit on 2026-12-01:"), "{out}");
    // Rows read on 2026-08-22 are 101 days old: past the default 90.
    assert!(out.contains("Rows verified more than 90 days ago"), "{out}");
    assert!(
        out.contains("cilium 1.18  (verified 2026-08-22, 101 days ago)"),
        "{out}"
    );
    // Corrected rows were re-read on 2026-12-01.
    assert!(!out.contains("calico 3.30  (verified"), "{out}");
    // Rows taken on trust.
    let never = out.split("Rows never verified").nth(1).unwrap_or_default();
    assert!(never.contains("metrics-server 0.9  [unconfirmed]"), "{out}");
    // The fixture's external-dns uses its Helm chart number, which no row covers.
    assert!(
        out.contains("external-dns 1.19.0  in homelab@feat/external-dns"),
        "{out}"
    );
}

#[test]
fn audit_window_and_bad_dates() {
    let o = ichor(&[
        "policies",
        "audit",
        "--today",
        "2026-12-01",
        "--max-age",
        "400",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).contains("Rows verified more than 400 days ago (0):\n  none"),
        "{}",
        stdout(&o)
    );
    let o = ichor(&["policies", "audit", "--today", "2026-13-01"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--today: `2026-13-01` is not a calendar day"),
        "{}",
        stderr(&o)
    );
}

/// A repository whose cluster.yaml names the ghcr installer, with a branch bumping Talos
/// 1.13 → 1.14 and keeping cert-manager 1.19 (end of life on 2026-07-08).
fn ghcr_installer_repo() -> (tempfile::TempDir, String) {
    let rs = "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {name: lab}\nspec:\n  talos: v1.13.9\n  kubernetes: v1.34.2\n  cni: {name: cilium, version: 1.19.1}\n  addons:\n    - {name: cert-manager, version: v1.19.3}\n";
    let cluster = "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {name: lab}\nspec:\n  talos:\n    endpoints: [10.0.0.1]\n    installerImage: ghcr.io/siderolabs/installer\n";
    let tree = [
        ("clusters/lab/release-set.yaml", rs),
        ("clusters/lab/cluster.yaml", cluster),
    ];
    let history = "people: {me: {name: Me, email: me@example.com}}\nmain:\n  - {message: init, author: me, date: \"2026-11-01T00:00:00Z\", tree: true}\nbranches:\n  - name: talos-1.14\n    expect: warn\n    title: Talos 1.14\n    commits:\n      - message: Talos 1.14\n        author: me\n        date: \"2026-11-02T00:00:00Z\"\n        edits: [{file: clusters/lab/release-set.yaml, find: \"talos: v1.13.9\", replace: \"talos: v1.14.1\"}]\n";
    let fixture = ichor::sim::fixture::Fixture::parse("ghcr", &tree, history).expect("fixture");
    let dir = tempfile::tempdir().expect("tempdir");
    fixture.build(dir.path()).expect("build");
    let path = dir.path().to_string_lossy().into_owned();
    (dir, path)
}

#[test]
fn the_gate_passes_the_installer_image_and_today_to_the_checklist() {
    let (_dir, repo) = ghcr_installer_repo();
    let o = ichor(&[
        "check",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "talos-1.14",
        "--output",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    let items = v["clusters"][0]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let find = |id: &str| items.iter().find(|i| i["id"] == id).cloned();
    let note = find("talos-note/talos-1.14-no-ghcr-installer")
        .unwrap_or_else(|| panic!("no installer note in {v:#}"));
    assert_eq!(note["status"], "warn");
    assert!(note["hint"]
        .as_str()
        .unwrap_or("")
        .contains("factory.talos.dev"));
    // cert-manager 1.19 ended on 2026-07-08; the gate judges with the system date.
    let ended = ichor::policy::Date::parse("2026-07-08").expect("date");
    let eol = find("eol/cert-manager");
    if ichor::policy::Date::today_utc() >= ended {
        let eol = eol.unwrap_or_else(|| panic!("no eol item in {v:#}"));
        assert_eq!(eol["status"], "warn");
        assert!(eol["message"].as_str().unwrap_or("").contains("2026-07-08"));
    } else {
        assert!(eol.is_none(), "{eol:?}");
    }
}
