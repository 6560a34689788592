//! `ichor rehearse`: fixed seeds over the homelab fixture and a 3-control-plane, 8-worker
//! Longhorn fleet hold; a replayed seed strikes the same faults; and the checker catches
//! each rule broken on purpose in the twin, blaming an injected fault, not ichor, when the
//! fault made the last node unavailable.

use std::collections::BTreeSet;
use std::time::Duration;

use ichor::rehearse::{self, Cordon, FaultKind, Judge, Options, SeedOutcome, SeedReport, Summary};
use ichor::rollout::PlantedBug;
use ichor::sim::twin::TwinConfig;
use serde_json::{json, Value};

use crate::rollout::{setup, Setup};
use crate::{homelab, ichor, stderr, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn homelab_options() -> Options {
    Options {
        repo: homelab().to_path_buf(),
        base: "main".into(),
        head: "renovate/talos".into(),
        cluster: None,
        alphabet: FaultKind::ALL.to_vec(),
        keep_log: true,
        planted: None,
    }
}

/// Each report that does not hold, with its log, for the failure message.
fn not_holding(reports: &[SeedReport]) -> String {
    reports
        .iter()
        .filter(|r| !r.holds())
        .map(|r| format!("seed {} {:?}:\n{}", r.seed, r.outcome, r.log.join("\n")))
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[test]
fn fixed_seeds_over_the_homelab_hold() -> TestResult {
    let seeds: Vec<u64> = (1..=8).collect();
    let reports = rehearse::rehearse_seeds(&homelab_options(), &seeds, 2, &|_| {})?;
    let summary = Summary::of(&reports);
    assert!(summary.holds(), "{}", not_holding(&reports));
    assert_eq!(summary.seeds, 8);
    // The faults struck: every seed drew some, and every report carries its schedule.
    assert!(reports.iter().all(|r| !r.faults.is_empty()));
    assert!(summary.makespan_p50.is_some());
    Ok(())
}

/// Seeds the campaigns found not holding, each fixed since (docs/rehearse.md, "Found").
#[test]
fn regression_seeds_hold() -> TestResult {
    // 122: an A/B fallback's pause, resumed without the upgrade by hand its text asks for,
    // paused again at every resume until the run counted as stuck.
    // The alphabet as it was when the seed was found: a fault kind added later must not
    // change what this seed draws.
    let alphabet = FaultKind::parse_list(
        "engineKilled,pdbBlocks,nodeNeverReturns,kubeletSilent,etcdUnhealthy,apiErrors,\
         slowApply,replicasNeverRebuild,operatorCordon,leaseStolen,bootsWrongVersion,\
         installerFails,etcdStaleMember,slowInstallerPull,operatorHold,barePod",
    )?;
    let opts = Options {
        alphabet,
        ..homelab_options()
    };
    let reports = rehearse::rehearse_seeds(&opts, &[122], 1, &|_| {})?;
    assert!(Summary::of(&reports).holds(), "{}", not_holding(&reports));
    Ok(())
}

#[test]
fn fixed_seeds_over_a_longhorn_fleet_hold() -> TestResult {
    let dir = tempfile::tempdir()?;
    ichor::sim::fixture::Fixture::fleet(8, 2).build(dir.path())?;
    let opts = Options {
        repo: dir.path().to_path_buf(),
        head: "bump/grouped".into(),
        ..homelab_options()
    };
    let seeds: Vec<u64> = (1..=4).collect();
    let reports = rehearse::rehearse_seeds(&opts, &seeds, 2, &|_| {})?;
    assert!(Summary::of(&reports).holds(), "{}", not_holding(&reports));
    Ok(())
}

/// The seed fixes the schedule exactly; what the engine then does is judged the same way.
/// (Whether the whole event log repeats is measured in docs/rehearse.md, not asserted: the
/// twin's clock may move while a request crosses the loopback.)
#[test]
fn a_replayed_seed_strikes_the_same_faults_and_ends_the_same_way() -> TestResult {
    let opts = homelab_options();
    let a = rehearse::rehearse_seeds(&opts, &[7], 1, &|_| {})?;
    let b = rehearse::rehearse_seeds(&opts, &[7], 1, &|_| {})?;
    assert_eq!(a[0].faults, b[0].faults);
    assert_eq!(a[0].outcome, b[0].outcome);
    assert_eq!(a[0].outcome, SeedOutcome::Completed, "{}", not_holding(&a));
    // The schedule is in the log, in the same words.
    let scheduled = |r: &SeedReport| -> Vec<String> {
        r.log
            .iter()
            .filter(|l| l.contains(" scheduled "))
            .cloned()
            .collect()
    };
    assert_eq!(scheduled(&a[0]), scheduled(&b[0]));
    assert!(!scheduled(&a[0]).is_empty());
    Ok(())
}

async fn patch_node(s: &Setup, node: &str, unschedulable: bool) -> TestResult {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(s.raw.clone());
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await?;
    Ok(())
}

fn rules(v: &[ichor::rehearse::Violation]) -> BTreeSet<&'static str> {
    v.iter().map(|v| v.rule).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Two workers cordoned with `maxUnavailable: 1`: ichor's doing unless an operator cordoned
/// them; an operator's cordon lifted by anyone but the operator is a violation.
#[tokio::test]
async fn the_checker_catches_cordons_past_max_unavailable_and_a_lifted_operator_cordon(
) -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    assert!(Judge::new(1).judge(&s.twin).is_empty(), "a quiet cluster");
    patch_node(&s, "w-1", true).await?;
    patch_node(&s, "w-2", true).await?;
    s.twin.advance(Duration::from_secs(1));
    let found = Judge::new(1).judge(&s.twin);
    assert!(rules(&found).contains("maxUnavailable"), "{found:?}");
    // The same cordons, an operator's: nothing ichor broke.
    let mut judge = Judge::new(1);
    for n in ["w-1", "w-2"] {
        judge.operator_cordon(n, Cordon::Standing);
    }
    assert_eq!(judge.judge(&s.twin), vec![]);
    // Lifted while the operator still holds it: ichor must never do that.
    patch_node(&s, "w-1", false).await?;
    s.twin.advance(Duration::from_secs(1));
    let found = judge.judge(&s.twin);
    assert_eq!(
        rules(&found),
        BTreeSet::from(["operatorCordon"]),
        "{found:?}"
    );
    Ok(())
}

/// Two holders of one volume NotReady at once: a violation when nothing injected explains
/// it, the silent kubelets' doing when both were injected.
#[tokio::test]
async fn two_volume_holders_down_are_caught_and_blamed_on_the_fault_that_did_it() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    s.post_faults(json!({"kubeletDown": ["w-1", "w-2"]}))
        .await?;
    // Past the node-monitor grace period: both Nodes go NotReady.
    s.twin.advance(Duration::from_secs(120));
    let found = Judge::new(1).judge(&s.twin);
    assert!(rules(&found).contains("volumeHolders"), "{found:?}");
    assert!(rules(&found).contains("maxUnavailable"), "{found:?}");
    let mut judge = Judge::new(1);
    judge.set_faults(set(&["w-1", "w-2"]), BTreeSet::new());
    assert_eq!(judge.judge(&s.twin), vec![]);
    assert!(
        judge.attributed.iter().any(|a| a.contains("volumeHolders")),
        "{:?}",
        judge.attributed
    );
    Ok(())
}

/// A pod deleted directly (what `kubectl drain --disable-eviction` or a force does) is
/// caught: only evictions may move pods.
#[tokio::test]
async fn a_pod_deleted_instead_of_evicted_is_caught() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(s.raw.clone());
    let list = pods.list(&Default::default()).await?;
    let pod = list
        .items
        .iter()
        .find(|p| p.metadata.namespace.as_deref() == Some("default"))
        .ok_or("a pod in default")?;
    let ns: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(s.raw.clone(), "default");
    ns.delete(
        pod.metadata.name.as_deref().ok_or("a name")?,
        &Default::default(),
    )
    .await?;
    let found = Judge::new(1).judge(&s.twin);
    assert!(rules(&found).contains("forcedDeletion"), "{found:?}");
    Ok(())
}

#[test]
fn the_command_refuses_bad_input_with_exit_2_and_changes_nothing() {
    let repo = homelab().display().to_string();
    for (args, needle) in [
        (vec!["--faults", "meteor"], "unknown fault \"meteor\""),
        (vec!["--seeds", "9..1"], "before the start"),
        (vec!["--seed", "1", "--seeds", "1..2"], "not both"),
        (vec!["--jobs", "0"], "at least 1"),
    ] {
        let mut all = vec![
            "rehearse",
            "--repo",
            &repo,
            "--base",
            "main",
            "--head",
            "renovate/talos",
        ];
        all.extend(args.iter().copied());
        let o = ichor(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    let o = ichor(&[
        "rehearse",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "no-such-branch",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no-such-branch"), "{}", stderr(&o));
}

#[test]
fn json_output_is_one_document_with_every_seed_and_a_summary() -> TestResult {
    let repo = homelab().display().to_string();
    let o = ichor(&[
        "rehearse",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--seeds",
        "3..4",
        "--jobs",
        "2",
        "--output",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o))?;
    let seeds = doc["seeds"].as_array().ok_or("seeds")?;
    assert_eq!(seeds.len(), 2);
    assert_eq!(seeds[0]["seed"], 3);
    assert_eq!(seeds[1]["seed"], 4);
    for s in seeds {
        assert_eq!(s["outcome"], "completed", "{s}");
        let f = &s["faults"][0];
        assert!(f["at"].is_u64() && f["fault"].is_string(), "{s}");
        assert!(s["violations"].as_array().is_some_and(Vec::is_empty), "{s}");
        assert!(s["makespan"].is_u64(), "{s}");
    }
    assert_eq!(doc["summary"]["seeds"], 2);
    assert_eq!(doc["summary"]["completed"], 2);
    assert_eq!(doc["summary"]["violations"], 0);
    Ok(())
}

/// A bug planted in the engine's start rule is caught by the checker, from the twin's
/// ground truth, and named by its rule; the same seeds without it hold.
fn planted(bug: PlantedBug, alphabet: &[FaultKind], rule: &str, seeds: &[u64]) -> TestResult {
    let dir = tempfile::tempdir()?;
    ichor::sim::fixture::Fixture::fleet(8, 1).build(dir.path())?;
    let honest = Options {
        repo: dir.path().to_path_buf(),
        head: "bump/grouped".into(),
        alphabet: alphabet.to_vec(),
        ..homelab_options()
    };
    let buggy = Options {
        planted: Some(bug),
        ..honest.clone()
    };
    let caught = rehearse::rehearse_seeds(&buggy, seeds, 2, &|_| {})?;
    let broke: Vec<u64> = caught
        .iter()
        .filter(|r| r.violations.iter().any(|v| v.rule == rule))
        .map(|r| r.seed)
        .collect();
    assert!(
        !broke.is_empty(),
        "the planted {bug:?} went unseen: {}",
        caught
            .iter()
            .map(|r| format!("seed {} {:?}\n{}", r.seed, r.outcome, r.log.join("\n")))
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    eprintln!("the planted {bug:?} broke {rule} on seeds {broke:?}");
    let clean = rehearse::rehearse_seeds(&honest, &broke, 2, &|_| {})?;
    assert!(Summary::of(&clean).holds(), "{}", not_holding(&clean));
    Ok(())
}

#[test]
fn a_planted_bug_that_forgets_max_unavailable_is_caught() -> TestResult {
    planted(
        PlantedBug::IgnoreMaxUnavailable,
        &[FaultKind::KubeletSilent],
        "maxUnavailable",
        &[1, 2],
    )
}
