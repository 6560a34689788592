//! `ichor check` and `ichor plan` on the homelab fixture, one test per pull-request branch.

use ichor::sim::fixture::{Expect, Fixture};
use serde_json::Value;

use crate::{homelab, ichor, stderr, stdout};

fn repo() -> String {
    homelab().to_string_lossy().into_owned()
}

fn check(base: &str, head: &str, output: &str) -> std::process::Output {
    ichor(&[
        "check",
        "--repo",
        &repo(),
        "--base",
        base,
        "--head",
        head,
        "--output",
        output,
    ])
}

/// The exit code and the report's only cluster section.
fn check_json(base: &str, head: &str) -> (i32, Value) {
    let o = check(base, head, "json");
    let code = o.status.code().unwrap_or(-1);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("json from {head}: {e}\n{}{}", stdout(&o), stderr(&o)));
    (code, only_cluster(v))
}

fn only_cluster(v: Value) -> Value {
    assert_eq!(v["apiVersion"], "ichor.dev/v1alpha1", "{v:#}");
    assert_eq!(v["kind"], "CheckReport", "{v:#}");
    assert_eq!(v["clusters"].as_array().map(Vec::len), Some(1), "{v:#}");
    v["clusters"][0].clone()
}

fn item<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["id"] == id))
        .unwrap_or_else(|| panic!("no item {id} in {v:#}"))
}

#[test]
fn every_fixture_branch_gets_its_expected_exit_code() {
    for b in Fixture::homelab().history.branches {
        let o = check(&b.base, &b.name, "text");
        let want = match b.expect {
            Expect::Pass | Expect::Warn => 0,
            Expect::Fail => 1,
            Expect::Invalid => 2,
            Expect::Wait => 3,
        };
        assert_eq!(
            o.status.code(),
            Some(want),
            "{}:\n{}{}",
            b.name,
            stdout(&o),
            stderr(&o)
        );
    }
}

#[test]
fn clean_patch_bump_passes_without_warnings() {
    let (code, v) = check_json("main", "renovate/cilium-1.18.x");
    assert_eq!(code, 0);
    assert_eq!(v["outcome"], "pass");
    // End-of-life warnings follow today's date (Talos 1.12 has ended); nothing else warns.
    let warnings: Vec<&Value> = v["items"]
        .as_array()
        .map(|a| a.iter().filter(|i| i["status"] == "warn").collect())
        .unwrap_or_default();
    assert!(
        warnings
            .iter()
            .all(|i| i["id"].as_str().is_some_and(|id| id.starts_with("eol/"))),
        "{warnings:?}"
    );
    assert_eq!(v["changes"][0]["type"], "cni");
    assert_eq!(v["changes"][0]["kind"], "patch");
    assert_eq!(v["changes"][0]["from"], "1.18.3");
    assert_eq!(v["changes"][0]["to"], "1.18.6");
}

#[test]
fn kubernetes_minor_blocked_by_the_cni_names_the_version_needed() {
    let (code, v) = check_json("main", "renovate/ghcr.io-siderolabs-kubelet-1.x");
    assert_eq!(code, 1);
    assert_eq!(v["outcome"], "blocked");
    let cni = item(&v, "cni");
    assert_eq!(cni["status"], "fail");
    assert_eq!(
        cni["message"],
        "Kubernetes 1.34 is blocked on cilium >= 1.19 (release set has 1.18.3)"
    );
    assert!(cni["hint"]
        .as_str()
        .unwrap_or("")
        .contains("cilium to >= 1.19"));
    assert!(cni["source"]
        .as_str()
        .unwrap_or("")
        .contains("cilium/cilium"));
    // Text output: the hint sits under the failing item.
    let text = stdout(&check(
        "main",
        "renovate/ghcr.io-siderolabs-kubelet-1.x",
        "text",
    ));
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("blocked on cilium"))
        .expect("cni line");
    assert!(lines[at + 1].contains("↳ bump cilium"), "{text}");
    assert!(text.contains("BLOCKED"));
}

#[test]
fn skipped_kubernetes_minor_fails() {
    let (code, v) = check_json("main", "renovate/ghcr.io-siderolabs-kubelet-1.35.x");
    assert_eq!(code, 1);
    // A skip is judged as the chain it needs: Kubernetes through 1.34 at its newest known
    // patch; it still blocks, since the rollout engine does not walk chains yet.
    let chain = item(&v, "chain");
    assert_eq!(chain["status"], "fail");
    let message = chain["message"].as_str().unwrap_or("");
    assert!(
        message.contains("Kubernetes v1.33.5 → v1.34.1 on control planes"),
        "{chain}"
    );
    assert!(
        chain["hint"]
            .as_str()
            .unwrap_or("")
            .contains("starting with a change to spec.kubernetes v1.34.1"),
        "{chain}"
    );
    assert_eq!(v["changes"][0]["minors"], 2);
}

#[test]
fn skipped_talos_minor_fails() {
    let (code, v) = check_json("main", "renovate/siderolabs-talos-1.14.x");
    assert_eq!(code, 1);
    let chain = item(&v, "chain");
    assert_eq!(chain["status"], "fail");
    assert!(
        chain["message"]
            .as_str()
            .unwrap_or("")
            .contains("Talos v1.12.6 → v1.13.10 on control planes"),
        "{chain}"
    );
}

#[test]
fn talos_target_that_cannot_run_the_current_kubernetes_fails() {
    let (code, v) = check_json("homelab-2026-03", "renovate/siderolabs-talos-1.x");
    assert_eq!(code, 1);
    let pairing = item(&v, "talos-kubernetes");
    assert_eq!(pairing["status"], "fail");
    assert!(
        pairing["message"]
            .as_str()
            .unwrap_or("")
            .contains("the cluster runs v1.30.14"),
        "{pairing}"
    );
    assert_eq!(
        pairing["hint"],
        "upgrade Kubernetes to 1.31 or later on Talos 1.12 first, then bump Talos"
    );
}

#[test]
fn downgrade_fails() {
    let (code, v) = check_json("main", "revert-kubelet-v1.33.4");
    assert_eq!(code, 1);
    assert_eq!(item(&v, "no-downgrade")["status"], "fail");
    assert_eq!(v["changes"][0]["kind"], "downgrade");
}

#[test]
fn unknown_addon_warns_but_passes() {
    let (code, v) = check_json("main", "feat/external-dns");
    assert_eq!(code, 0);
    assert_eq!(v["outcome"], "pass");
    let addon = item(&v, "addon/external-dns");
    assert_eq!(addon["status"], "warn");
    assert!(addon["message"]
        .as_str()
        .unwrap_or("")
        .contains("unknown add-on"));
    assert_eq!(v["changes"][0]["kind"], "added");
}

#[test]
fn malformed_release_set_exits_2_naming_file_and_line() {
    let o = check("main", "chore/tidy-release-set", "text");
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("clusters/homelab/release-set.yaml:11:15:"),
        "{err}"
    );
    assert!(
        err.contains("invalid version `v1.34`: the patch number is missing"),
        "{err}"
    );
    assert!(
        err.contains("chore/tidy-release-set"),
        "names the revision: {err}"
    );
    assert!(stdout(&o).is_empty());
}

/// Issue 43 F4: a branch behind main is judged as the controller judges its PR, from the
/// merge base: main's later bumps are not phantom downgrades of the branch.
#[test]
fn a_branch_behind_main_is_judged_from_the_merge_base() {
    let o = check("main", "renovate/siderolabs-talos-1.x", "json");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        v["base"]["rev"]
            .as_str()
            .is_some_and(|r| r.contains("merge base of main")),
        "{v:#}"
    );
    let cluster = only_cluster(v);
    assert_eq!(
        item(&cluster, "no-downgrade")["status"],
        "pass",
        "{cluster:#}"
    );
    assert_eq!(
        item(&cluster, "talos-kubernetes")["status"],
        "fail",
        "{cluster:#}"
    );
}

/// Issue 43 F5: a script reading `.outcome` never lets a broken document through, and the
/// plan's JSON carries the error it printed on stderr.
#[test]
fn json_on_invalid_input_says_invalid_and_carries_the_error() {
    let o = check("main", "chore/tidy-release-set", "json");
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["outcome"], "invalid", "{v:#}");
    assert_eq!(v["exitCode"], 2, "{v:#}");
    let cluster = only_cluster(v);
    assert_eq!(cluster["outcome"], "invalid", "{cluster:#}");
    assert!(
        cluster["error"]
            .as_str()
            .is_some_and(|e| e.contains("the patch number is missing")),
        "{cluster:#}"
    );
    let o = ichor(&[
        "plan",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "chore/tidy-release-set",
        "--output",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["outcome"], "invalid", "{v:#}");
    assert_eq!(v["errors"][0]["cluster"], "homelab", "{v:#}");
    assert!(
        v["errors"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("the patch number is missing")),
        "{v:#}"
    );
}

#[test]
fn grouped_talos_and_kubernetes_pass_and_plan_talos_first() {
    let (code, v) = check_json("main", "renovate/talos");
    assert_eq!(code, 0, "{v:#}");
    let o = ichor(&[
        "plan",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--output",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).expect("plan json");
    assert_eq!(report["kind"], "PlanReport");
    let plan = &report["plans"][0];
    assert_eq!(plan["gate"], "pass");
    let stages: Vec<&str> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap_or(""))
        .collect();
    // Each worker drained once: Talos on the control planes, the Kubernetes stages, then
    // the workers' kubelet and Talos together.
    assert_eq!(
        stages,
        [
            "talos",
            "kube-apiserver",
            "kube-controller-manager-scheduler",
            "kube-proxy-manifests",
            "kubelet",
            "workers",
            "verify"
        ]
    );
    let step_ids = |stage: usize| -> Vec<String> {
        plan["stages"][stage]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(step_ids(0), ["talos/cp-1", "talos/cp-2", "talos/cp-3"]);
    assert_eq!(
        step_ids(5),
        ["worker/workers-1", "worker/workers-2", "worker/workers-3"]
    );
    // Every Longhorn volume has a replica on each worker: one worker at a time.
    assert_eq!(plan["workerBatches"]["count"], 3);
    assert_eq!(plan["workerBatches"]["lowerBound"], 3);
    assert_eq!(report["base"]["rev"], "main");
    assert!(plan["estimateSecs"].as_u64().unwrap_or(0) > 0);
    assert_eq!(plan["pairings"][1]["talos"], "v1.12.9");
    assert_eq!(
        plan["pairings"][1]["kubernetes"], "v1.33.5",
        "Talos moves while Kubernetes stays"
    );
    // --two-pass keeps every node's Talos first, each worker drained again for its kubelet.
    let o = ichor(&[
        "plan",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--two-pass",
        "--output",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).expect("plan json");
    let plan = &report["plans"][0];
    let stages: Vec<&str> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap_or(""))
        .collect();
    assert!(!stages.contains(&"workers"), "{stages:?}");
    let talos_steps: Vec<&str> = plan["stages"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        talos_steps,
        [
            "talos/cp-1",
            "talos/cp-2",
            "talos/cp-3",
            "talos/workers-1",
            "talos/workers-2",
            "talos/workers-3"
        ]
    );
    assert!(plan["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap_or("").contains("--two-pass")));
}

#[test]
fn plan_renders_mermaid_and_text() {
    let o = ichor(&[
        "plan",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--output",
        "mermaid",
    ]);
    let m = stdout(&o);
    assert!(m.starts_with("gantt\n"), "{m}");
    assert!(m.contains("section Talos v1.12.6 → v1.12.9"));
    assert!(
        m.contains("cp-1 :talos-cp-1, 2000-01-01 00:00:00, 480s"),
        "{m}"
    );
    let o = ichor(&[
        "plan",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--ichor-node",
        "w-1",
    ]);
    let t = stdout(&o);
    assert!(t.contains("workers in 3 batches (lower bound 3"), "{t}");
    let last_worker = t.lines().rfind(|l| l.contains("worker w-")).unwrap_or("");
    assert!(
        last_worker.contains("w-1"),
        "the node running ichor goes last: {t}"
    );
}

#[test]
fn plan_refuses_an_ichor_node_outside_the_inventory() {
    let o = ichor(&[
        "plan",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--ichor-node",
        "nosuch",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains(
            "--ichor-node `nosuch` is not a node in the inventory (nodes: cp-1, cp-2, cp-3, w-1, w-2, w-3)"
        ),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty());
}

#[test]
fn usage_errors_exit_2() {
    let o = ichor(&["check", "--repo", &repo(), "--base", "main"]);
    assert_eq!(o.status.code(), Some(2));
    let o = ichor(&[
        "check",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "no-such-branch",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown revision `no-such-branch`"),
        "{}",
        stderr(&o)
    );
    let o = ichor(&[
        "check",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "main",
        "--cluster",
        "prod",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("cluster `prod` not found") && stderr(&o).contains("found: homelab"),
        "{}",
        stderr(&o)
    );
    let o = ichor(&[
        "check",
        "--repo",
        "/nonexistent/repo",
        "--base",
        "main",
        "--head",
        "main",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("cannot open git repository"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn markdown_output_is_a_table() {
    let o = check(
        "main",
        "renovate/ghcr.io-siderolabs-kubelet-1.x",
        "markdown",
    );
    let md = stdout(&o);
    assert!(md.contains("| | Check | Result |"), "{md}");
    assert!(
        md.contains("| ❌ | CNI cilium supports Kubernetes |"),
        "{md}"
    );
}

#[test]
fn demo_runs_end_to_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = ichor(&[
        "demo",
        "--dir",
        &dir.path().join("homelab").to_string_lossy(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    // Every branch judged from Git alone first.
    assert!(
        out.contains("renovate/talos                               PASS"),
        "{out}"
    );
    // Renovate's PRs arrive by webhook; the blocked one is red with its reason.
    assert!(out.contains("webhook pull_request.opened → ichor"), "{out}");
    assert!(
        out.contains("failure — blocked: Kubernetes 1.34 is blocked on cilium >= 1.19"),
        "{out}"
    );
    assert!(
        out.contains("<!-- ichor:sticky cluster=homelab -->"),
        "{out}"
    );
    assert!(out.contains("```mermaid"), "{out}");
    // The good one passes live (etcd through the Talos API, the hand-over through Kubernetes).
    assert!(
        out.contains("success — passed: talos v1.12.6 → v1.12.9, kubernetes v1.33.5 → v1.33.7"),
        "{out}"
    );
    assert!(out.contains("3 healthy members, leader cp-1"), "{out}");
    assert!(out.contains("Argo CD owns the CNI"), "{out}");
    // Merged, it is rolled out: Talos on the control planes, then Kubernetes, then each
    // worker once for both, and the comment follows.
    let talos_done = out
        .find("talos cp-3: on v1.12.9, Ready")
        .expect("Talos progress");
    let kubelet_done = out
        .find("kubelet cp-3: on v1.33.7, Ready")
        .expect("kubelet progress");
    let worker_done = out
        .find("worker w-3: on Talos v1.12.9 and kubelet v1.33.7, Ready")
        .expect("worker progress");
    assert!(
        talos_done < kubelet_done && kubelet_done < worker_done,
        "{out}"
    );
    assert!(
        out.contains("success — done: every node runs Talos v1.12.9 and Kubernetes v1.33.7"),
        "{out}"
    );
    assert!(out.contains("✅ **Done**"), "{out}");
    assert!(out.contains("rollouts completed 1"), "{out}");
}

#[test]
fn a_change_cannot_relax_the_policies_it_is_judged_by() {
    let (code, v) = check_json("main", "feat/kubernetes-1.34-with-local-policy");
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(item(&v, "cni")["status"], "fail");
    let policies = item(&v, "policies");
    assert_eq!(policies["status"], "warn");
    assert!(policies["message"]
        .as_str()
        .unwrap_or("")
        .contains("base revision's policies"));
}

#[test]
fn repository_policies_at_the_base_are_applied() {
    // Once the local row is merged, the same bump passes: build that history.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r");
    let mut fixture = Fixture::homelab();
    let branch = fixture
        .history
        .branches
        .iter()
        .find(|b| b.name == "feat/kubernetes-1.34-with-local-policy")
        .cloned()
        .expect("branch");
    let mut policy_only = branch.commits[0].clone();
    policy_only.edits.remove(0);
    policy_only.date = "2026-11-25T08:00:00Z".into();
    policy_only.message = "Local cilium compatibility row".into();
    fixture.history.main.push(policy_only);
    fixture
        .history
        .branches
        .retain(|b| b.name == "renovate/ghcr.io-siderolabs-kubelet-1.x");
    fixture.build(&path).expect("build");
    let o = ichor(&[
        "check",
        "--repo",
        &path.to_string_lossy(),
        "--base",
        "main",
        "--head",
        "renovate/ghcr.io-siderolabs-kubelet-1.x",
        "--output",
        "json",
    ]);
    let v = only_cluster(serde_json::from_slice(&o.stdout).expect("json"));
    let cni = item(&v, "cni");
    assert_eq!(cni["status"], "pass", "{v:#}");
    assert!(
        cni["source"].as_str().unwrap_or("").contains("our lab"),
        "{cni}"
    );
}

/// A repository of two clusters, the second without cluster.yaml.
fn two_clusters() -> (tempfile::TempDir, String) {
    let rs = |name: &str, k8s: &str| {
        format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: {name}}}\nspec:\n  talos: v1.12.6\n  kubernetes: {k8s}\n  cni: {{name: cilium, version: 1.18.3}}\n")
    };
    let home = rs("home", "v1.33.5");
    let lab = rs("lab", "v1.33.5");
    let tree = [
        ("clusters/home/release-set.yaml", home.as_str()),
        ("clusters/lab/release-set.yaml", lab.as_str()),
    ];
    let history = "people: {me: {name: Me, email: me@example.com}}\nmain:\n  - {message: init, author: me, date: \"2026-11-01T00:00:00Z\", tree: true}\nbranches:\n  - name: bump\n    expect: pass\n    title: bump\n    commits:\n      - message: bump lab\n        author: me\n        date: \"2026-11-02T00:00:00Z\"\n        edits: [{file: clusters/lab/release-set.yaml, find: \"kubernetes: v1.33.5\", replace: \"kubernetes: v1.33.7\"}]\n";
    let fixture = Fixture::parse("two", &tree, history).expect("fixture");
    let dir = tempfile::tempdir().expect("tempdir");
    fixture.build(dir.path()).expect("build");
    let path = dir.path().to_string_lossy().into_owned();
    (dir, path)
}

#[test]
fn several_clusters_need_cluster_and_cluster_yaml_is_optional_for_check() {
    let (_dir, repo) = two_clusters();
    // Without --cluster, every cluster the change touches is judged: here only lab.
    let o = ichor(&[
        "check", "--repo", &repo, "--base", "main", "--head", "bump", "--output", "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = only_cluster(serde_json::from_slice(&o.stdout).expect("json"));
    assert_eq!(v["cluster"], "lab");
    let o = ichor(&[
        "check",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "bump",
        "--cluster",
        "lab",
        "--output",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = only_cluster(serde_json::from_slice(&o.stdout).expect("json"));
    assert!(item(&v, "documents")["message"]
        .as_str()
        .unwrap_or("")
        .contains("no cluster.yaml (static checks only)"));
    assert!(
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["id"] != "nodes-talos"),
        "no node items without an inventory"
    );
    // The other cluster did not change.
    let o = ichor(&[
        "check",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "bump",
        "--cluster",
        "home",
        "--output",
        "json",
    ]);
    let v = only_cluster(serde_json::from_slice(&o.stdout).expect("json"));
    assert_eq!(v["changes"].as_array().map(Vec::len), Some(0));
    // plan needs an inventory.
    let o = ichor(&[
        "plan",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "bump",
        "--cluster",
        "lab",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("clusters/lab/cluster.yaml at main")
            && stderr(&o).contains("does not exist"),
        "{}",
        stderr(&o)
    );
}

/// Issue 43 item 11: `--version` names the commit and the date of the compatibility data
/// the binary ships (the newest `verified` date under policies/).
#[test]
fn version_names_the_commit_and_the_compatibility_data_date() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let mut newest = String::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{e}")) {
        let text = std::fs::read_to_string(entry.map(|e| e.path()).unwrap_or_default())
            .unwrap_or_default();
        for line in text.lines() {
            if let Some(d) = line.trim_start().strip_prefix("verified:") {
                let d = d.trim().trim_matches('"').to_string();
                if d > newest {
                    newest = d;
                }
            }
        }
    }
    assert_eq!(newest.len(), 10, "{newest}");
    let o = ichor(&["--version"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.starts_with("ichor 0."), "{out}");
    assert!(
        out.contains(&format!("compatibility data verified up to {newest}")),
        "{out}"
    );
    let commit = out
        .split("commit ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("");
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{out}"
    );
}

/// The demo's Talos skip: `plan --output json` gains `path`, the chain's states from the one
/// the cluster runs to the target, each with what its hop moves.
#[test]
fn a_skip_plans_its_chain_as_path() {
    let o = ichor(&[
        "plan",
        "--repo",
        &repo(),
        "--base",
        "main",
        "--head",
        "renovate/siderolabs-talos-1.14.x",
        "--output",
        "json",
        "--allow-blocked",
    ]);
    let report: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    let path = report["plans"][0]["path"]
        .as_array()
        .unwrap_or_else(|| panic!("no path in {report:#}"))
        .clone();
    assert_eq!(path.len(), 5, "{path:#?}");
    assert_eq!(path[0]["controlPlanes"]["talos"], "v1.12.6");
    assert_eq!(path[0]["workers"]["kubelet"], "v1.33.5");
    assert!(path[0]["moves"].is_null());
    assert_eq!(path[1]["controlPlanes"]["talos"], "v1.13.10");
    assert_eq!(path[1]["moves"]["on"], "controlPlanes");
    assert_eq!(path[1]["workers"]["talos"], "v1.12.6");
    assert_eq!(path[4]["workers"]["talos"], "v1.14.3");
    assert_eq!(path[4]["moves"]["on"], "workers");
    let drains = path
        .iter()
        .filter(|s| s["moves"]["on"] == "workers")
        .count();
    assert_eq!(drains, 2, "one drain per Talos minor walked");
}
