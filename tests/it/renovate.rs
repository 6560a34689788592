//! The Renovate preset (renovate/ichor.json) against real Renovate, offline: a repository
//! holding the bundled fixture's release sets and one cluster per Talos spelling is
//! extracted with `--platform=local --dry-run=extract`, and every `# renovate:` line must
//! come out with the datasource, name and version the test reads from the file itself.
//! The real-Renovate test needs `renovate` (`ICHOR_RENOVATE` or on `PATH`; `scripts/test`
//! installs it) and is ignored by plain `cargo test`; the static checks of the preset always run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::homelab;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn preset_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("renovate/ichor.json")
}

fn preset() -> Result<Value, Box<dyn std::error::Error>> {
    Ok(serde_json::from_str(&std::fs::read_to_string(
        preset_path(),
    )?)?)
}

fn walk<'a>(v: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    out.push(x);
                }
                walk(x, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| walk(x, key, out)),
        _ => {}
    }
}

#[test]
fn the_preset_is_current_renovate_and_its_regexes_are_re2() -> TestResult {
    let p = preset()?;
    let mut found = Vec::new();
    walk(&p, "fileMatch", &mut found);
    assert!(
        found.is_empty(),
        "`fileMatch` was removed from Renovate; use managerFilePatterns"
    );
    let managers = p["customManagers"].as_array().ok_or("customManagers")?;
    assert!(!managers.is_empty());
    for m in managers {
        assert_eq!(m["customType"], "regex");
        assert!(
            m["managerFilePatterns"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "{m}"
        );
        // Renovate runs these with RE2: no look-around, no back-references.
        for re in m["matchStrings"].as_array().ok_or("matchStrings")? {
            let re = re.as_str().ok_or("a string")?;
            for bad in ["(?=", "(?!", "(?<=", "(?<!", "\\k<"] {
                assert!(!re.contains(bad), "RE2 refuses `{bad}` in {re}");
            }
            assert!(
                !(1..=9).any(|d| re.contains(&format!("\\{d}"))),
                "a back-reference in {re}"
            );
        }
    }
    // Automerge never ignores the status checks (that would skip ichor/gate).
    let mut ignore = Vec::new();
    walk(&p, "ignoreTests", &mut ignore);
    assert!(
        ignore.iter().all(|v| **v == Value::Bool(false)),
        "{ignore:?}"
    );
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/renovate.md"))?;
    assert!(doc.contains("github>OWNER/ichor//renovate/ichor") && doc.contains("ichor/gate"));
    Ok(())
}

/// One `# renovate:` line and the version line under it, read with plain string handling
/// (independently of the preset's regex).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Annotated {
    file: String,
    datasource: String,
    dep_name: String,
    package_name: Option<String>,
    registry_url: Option<String>,
    current_value: String,
}

fn annotations(file: &str, text: &str) -> Vec<Annotated> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix("renovate:") else {
            continue;
        };
        let fields: BTreeMap<&str, &str> = rest
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let next = lines.get(i + 1).copied().unwrap_or("");
        let value = next
            .split_once(':')
            .map(|(_, v)| v.trim())
            .unwrap_or("")
            .split(['#', ' '])
            .next()
            .unwrap_or("")
            .trim_matches(['"', '\'']);
        out.push(Annotated {
            file: file.to_string(),
            datasource: fields.get("datasource").unwrap_or(&"").to_string(),
            dep_name: fields.get("depName").unwrap_or(&"").to_string(),
            package_name: fields.get("packageName").map(|s| s.to_string()),
            registry_url: fields.get("registryUrl").map(|s| s.to_string()),
            current_value: value.to_string(),
        });
    }
    out
}

/// What the preset makes of a Talos spelling that no longer sees releases.
fn remapped(a: &Annotated) -> (String, String) {
    if a.dep_name == "ghcr.io/siderolabs/installer" || a.dep_name.contains("factory.talos.dev/") {
        ("github-releases".into(), "siderolabs/talos".into())
    } else {
        (a.datasource.clone(), a.dep_name.clone())
    }
}

/// Release sets: every distinct one on the bundled fixture's branches, and one cluster per
/// Talos and Kubernetes spelling the preset reads.
fn release_sets() -> Result<Vec<(String, String)>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    let fixture = git2::Repository::open(homelab())?;
    let mut seen = Vec::new();
    for b in fixture.branches(Some(git2::BranchType::Local))? {
        let (branch, _) = b?;
        let tree = branch.get().peel_to_tree()?;
        let Ok(entry) = tree.get_path(Path::new("clusters/homelab/release-set.yaml")) else {
            continue;
        };
        let blob = fixture.find_blob(entry.id())?;
        let text = String::from_utf8(blob.content().to_vec())?;
        if !seen.contains(&text) {
            seen.push(text.clone());
            out.push((
                format!("clusters/fixture-{}/release-set.yaml", seen.len()),
                text,
            ));
        }
    }
    assert!(
        seen.len() > 2,
        "the fixture's branches hold several release sets"
    );
    let spellings = [
        ("docker", "ghcr.io/siderolabs/installer", "v1.13.4"),
        (
            "docker",
            "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba",
            "'v1.13.4'",
        ),
        ("docker", "ghcr.io/siderolabs/installer-base", "v1.14.0"),
        ("docker", "ghcr.io/siderolabs/talos", "\"v1.14.0\""),
        ("custom.talos-factory", "siderolabs/talos", "v1.14.1   # pinned for the lab"),
        ("github-releases", "siderolabs/talos", "v1.13.2"),
    ];
    let kubernetes = [
        ("docker", "ghcr.io/siderolabs/kubelet"),
        ("docker", "registry.k8s.io/kube-apiserver"),
        ("github-releases", "kubernetes/kubernetes"),
    ];
    for (i, (ds, dep, version)) in spellings.iter().enumerate() {
        let (kds, kdep) = kubernetes[i % kubernetes.len()];
        out.push((
            format!("clusters/talos-{i}/release-set.yaml"),
            format!(
                "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata:\n  name: talos-{i}\nspec:\n  # renovate: datasource={ds} depName={dep}\n  talos: {version}\n  # renovate: datasource={kds} depName={kdep}\n  kubernetes: v1.34.2\n  cni:\n    name: cilium\n    # renovate: datasource=docker depName=cilium packageName=quay.io/cilium/cilium\n    version: 1.18.3\n  addons:\n    # renovate: datasource=helm depName=longhorn registryUrl=https://charts.longhorn.io\n    - version: v1.10.1\n      name: longhorn\n"
            ),
        ));
    }
    Ok(out)
}

#[test]
#[ignore = "needs renovate: scripts/test installs it"]
fn real_renovate_extracts_every_annotated_version() -> TestResult {
    let renovate = crate::tools::RENOVATE.path();
    let work = tempfile::tempdir()?;
    let repo_dir = work.path().join("repo");
    std::fs::create_dir_all(&repo_dir)?;
    let files = release_sets()?;
    for (path, text) in &files {
        let p = repo_dir.join(path);
        std::fs::create_dir_all(p.parent().ok_or("a parent")?)?;
        std::fs::write(p, text)?;
    }
    // A `# renovate:` line outside a release set is not the preset's business.
    std::fs::write(
        repo_dir.join("clusters/talos-0/cluster.yaml"),
        "spec:\n  # renovate: datasource=docker depName=example.invalid/not-extracted\n  image: v9.9.9\n",
    )?;
    // The preset as the repository's own config: what `extends` would bring in.
    std::fs::copy(preset_path(), repo_dir.join("renovate.json"))?;
    let repo = git2::Repository::init(&repo_dir)?;
    let mut index = repo.index()?;
    index.add_all(["*"], git2::IndexAddOption::DEFAULT, None)?;
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let sig = git2::Signature::now("ichor test", "test@ichor.invalid")?;
    repo.commit(Some("HEAD"), &sig, &sig, "release sets", &tree, &[])?;

    // The config validator next to it, strictly, as repository config.
    let validator = renovate.with_file_name("renovate-config-validator");
    assert!(
        validator.exists(),
        "{} is not beside {}: install Renovate with scripts/install-renovate",
        validator.display(),
        renovate.display()
    );
    {
        let out = Command::new(&validator)
            .args(["--strict", "--no-global"])
            .arg(preset_path())
            .output()?;
        assert!(
            out.status.success(),
            "renovate-config-validator --strict: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let out = Command::new(&renovate)
        .current_dir(&repo_dir)
        .args([
            "--platform=local",
            "--dry-run=extract",
            "--onboarding=false",
            "--require-config=optional",
        ])
        .env("LOG_FORMAT", "json")
        .env("LOG_LEVEL", "debug")
        .env("RENOVATE_BASE_DIR", work.path().join("renovate-base"))
        .env_remove("RENOVATE_CONFIG_FILE")
        .env_remove("RENOVATE_TOKEN")
        .env_remove("GITHUB_COM_TOKEN")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "renovate failed ({}): {}\n{}",
        out.status,
        stdout.lines().rev().take(20).collect::<Vec<_>>().join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut extracted = None;
    for line in stdout.lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let msg = entry["msg"].as_str().unwrap_or("");
        if entry["level"].as_u64().is_some_and(|l| l >= 50) {
            panic!("renovate logged an error: {line}");
        }
        if msg == "RE2 not usable, falling back to RegExp" {
            eprintln!("NOTICE: this Renovate runs without RE2 (installed with ICHOR_RENOVATE_RE2=skip); the preset's regexes were checked for RE2 syntax statically");
        }
        if msg == "Extracted dependencies" {
            extracted = Some(entry["packageFiles"].clone());
        }
    }
    let extracted = extracted.ok_or("no \"Extracted dependencies\" message in Renovate's log")?;
    let regex = extracted["regex"]
        .as_array()
        .ok_or("no package files from the regex manager")?;
    let mut got: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for pf in regex {
        let file = pf["packageFile"].as_str().ok_or("packageFile")?.to_string();
        got.entry(file)
            .or_default()
            .extend(pf["deps"].as_array().ok_or("deps")?.iter());
    }
    // Only release sets.
    let expected_files: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    for file in got.keys() {
        assert!(
            expected_files.contains(&file.as_str()),
            "{file} is not a release set"
        );
    }
    let mut total = 0;
    for (path, text) in &files {
        let want = annotations(path, text);
        let deps = got.get(path).map(Vec::as_slice).unwrap_or(&[]);
        assert_eq!(deps.len(), want.len(), "{path}: {deps:#?}");
        for (a, dep) in want.iter().zip(deps) {
            let (datasource, dep_name) = remapped(a);
            assert_eq!(dep["datasource"], datasource.as_str(), "{path}: {dep}");
            assert_eq!(dep["depName"], dep_name.as_str(), "{path}: {dep}");
            assert_eq!(
                dep["currentValue"],
                a.current_value.as_str(),
                "{path}: {dep}"
            );
            if let Some(p) = &a.package_name {
                assert_eq!(dep["packageName"], p.as_str(), "{path}: {dep}");
            }
            if let Some(url) = &a.registry_url {
                let urls: Vec<&str> = dep["registryUrls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|u| u.trim_end_matches('/'))
                    .collect();
                assert_eq!(urls, [url.trim_end_matches('/')], "{path}: {dep}");
            }
            // Looked up later, never skipped for a reason of the preset's making.
            let skip = dep["skipReason"].as_str().unwrap_or("");
            assert!(
                skip.is_empty() || skip == "github-token-required",
                "{path}: skipped ({skip}): {dep}"
            );
            total += 1;
        }
    }
    assert!(total >= 20, "only {total} annotated versions seen");
    Ok(())
}
