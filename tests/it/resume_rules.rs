//! Issue 42 (c), N4, (j): a step recorded as begun but not yet disruptive is judged again
//! by every start rule before it disrupts anything (a hold, the window, a pause request,
//! `maxUnavailable`, the volume rule), on each path a resume takes: a control plane's
//! step, a worker of the pool, and stage (c), whose window, holds and pause are checked
//! before each of its acts.

use std::time::Duration;

use ichor::rollout::{Progress, Rollout, RunOutcome};
use ichor::sim::twin::TwinConfig;
use serde_json::{json, Value};

use crate::rollout::{
    hold, never_ended, paused, run_once, setup, setup_keeping_kube_proxy, Lines, Setup,
    NEVER_ENDING,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

/// Resume the paused rollout with `engine` while the clock moves and `side` runs beside
/// it: the outcome and `side`'s result, when it finished.
async fn resumed_alongside<T>(
    s: &Setup,
    engine: &Rollout<'_>,
    side: impl std::future::Future<Output = T>,
) -> Result<(RunOutcome, Option<T>), Error> {
    crate::rollout::run_alongside_as(s, engine, true, side).await
}

/// Cordon or uncordon `node` as an operator's `kubectl` does.
async fn operator_cordon(s: &Setup, node: &str, on: bool) -> Result<(), kube::Error> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(s.raw.clone());
    nodes
        .patch(
            node,
            &kube::api::PatchParams {
                field_manager: Some("kubectl-cordon".into()),
                ..Default::default()
            },
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": on}})),
        )
        .await
        .map(|_| ())
}

async fn cordoned(s: &Setup, node: &str) -> Result<bool, Error> {
    Ok(s.kube
        .nodes()
        .await?
        .into_iter()
        .any(|n| n.name == node && n.cordoned))
}

/// The resumed run said the wait before it cordoned the node (a later stage's wait on
/// the same node does not count).
fn held_before_cordoned(lines: &[String], wait: &str, cordon: &str) -> TestResult {
    let at = |needle: &str| lines.iter().position(|l| l.contains(needle));
    match (at(wait), at(cordon)) {
        (Some(w), Some(c)) if w < c => Ok(()),
        (w, c) => Err(format!(
            "the wait ({w:?}) did not come before the cordon ({c:?}):\n{lines:#?}"
        )
        .into()),
    }
}

/// A control plane paused in its pre-pull (begun, nothing disrupted) and held by an
/// operator meanwhile: the resumed rollout waits on the hold before cordoning it, and goes
/// once the hold is gone.
#[tokio::test]
async fn a_control_plane_begun_before_a_pause_waits_for_a_hold_set_meanwhile() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let installer = format!(
        "{}:v1.12.9",
        s.doc().spec.talos.installer_image.clone().ok_or("image")?
    );
    s.post_faults(json!({"failingImages": [installer]})).await?;
    let (outcome, _, _) = run_once(&s, false).await?;
    let p = paused(outcome)?;
    let cp = p.node.clone().ok_or("the pause names its node")?;
    assert!(cp.starts_with("cp-"), "{p:?}");
    let rec = s.record().await?;
    assert!(
        rec.steps
            .get(&format!("talos/{cp}"))
            .is_some_and(|m| m.started_at.is_some()),
        "the step was begun: {:?}",
        rec.steps
    );
    hold(&s, &cp, Some("firmware update")).await?;
    s.post_faults(json!({"failingImages": []})).await?;
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let held = format!("{cp} is held");
    let report = |p: Progress| {
        if matches!(&p, Progress::Waiting(w) if w.contains(&held)) {
            notify.notify_one();
        }
        lines.push(p);
    };
    let engine = s.engine(&report);
    let release = async {
        notify.notified().await;
        let was_cordoned = cordoned(&s, &cp).await.ok();
        let _ = hold(&s, &cp, None).await;
        was_cordoned
    };
    let (outcome, side) = resumed_alongside(&s, &engine, release).await?;
    let was_cordoned = side.ok_or_else(|| {
        format!(
            "the resumed step never waited on its hold: {outcome:?}\n{:#?}",
            lines.all()
        )
    })?;
    assert_eq!(was_cordoned, Some(false), "{cp} was cordoned while held");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    held_before_cordoned(&lines.all(), &held, &format!("talos {cp}: cordoned"))?;
    Ok(())
}

/// A worker paused in its drain (a budget that never allows; the pause gives the node
/// back) is begun and not disrupted. Another worker, holding replicas of the same volumes,
/// is cordoned by an operator meanwhile: the resumed worker waits (its slot and its
/// volumes), not cordoned, until that cordon is lifted, then the rollout completes.
#[tokio::test]
async fn a_worker_begun_before_a_pause_is_judged_again_by_the_rules_on_resume() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let pdb = s.first_pdb()?;
    s.post_faults(json!({"pdbsNeverAllow": [pdb]})).await?;
    let (outcome, _, _) = run_once(&s, false).await?;
    let p = paused(outcome)?;
    let w = p.node.clone().ok_or("the pause names its node")?;
    assert!(w.starts_with("w-"), "{p:?}");
    assert!(!cordoned(&s, &w).await?, "{w} was given back at the pause");
    // Another worker, one already upgraded if there is one: every homelab worker holds a
    // replica of each volume, and maxUnavailable is 1.
    let rec = s.record().await?;
    let done = |n: &str| {
        rec.steps
            .get(&format!("talos/{n}"))
            .is_some_and(|m| m.finished_at.is_some())
    };
    let workers: Vec<String> = s
        .kube
        .nodes()
        .await?
        .into_iter()
        .map(|n| n.name)
        .filter(|n| n.starts_with("w-") && *n != w)
        .collect();
    let other = workers
        .iter()
        .find(|n| done(n))
        .or(workers.first())
        .cloned()
        .ok_or("another worker")?;
    operator_cordon(&s, &other, true).await?;
    s.post_faults(json!({"pdbsNeverAllow": []})).await?;
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let waits = format!("{w} waits");
    let report = |p: Progress| {
        if matches!(&p, Progress::Waiting(x) if x.contains(&waits)) {
            notify.notify_one();
        }
        lines.push(p);
    };
    let engine = s.engine(&report);
    let release = async {
        notify.notified().await;
        let was_cordoned = cordoned(&s, &w).await.ok();
        let _ = operator_cordon(&s, &other, false).await;
        was_cordoned
    };
    let (outcome, side) = resumed_alongside(&s, &engine, release).await?;
    let was_cordoned = side.ok_or_else(|| {
        format!(
            "the resumed worker was never held by the rules: {outcome:?}\n{:#?}",
            lines.all()
        )
    })?;
    assert_eq!(was_cordoned, Some(false), "{w} was cordoned beside {other}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    held_before_cordoned(&lines.all(), &waits, &format!(" {w}: cordoned"))?;
    Ok(())
}

/// (j): stage (c) judges a pause request before each of its acts, not only at its start:
/// asked once kube-proxy moved on one control plane, it switches no other.
#[tokio::test]
async fn a_pause_asked_for_inside_stage_c_stops_it_before_its_next_act() -> TestResult {
    let s = setup_keeping_kube_proxy().await?;
    let lines = Lines::default();
    let switched = std::sync::atomic::AtomicBool::new(false);
    let report = |p: Progress| {
        if matches!(&p, Progress::Note(n) if n.starts_with("kube-proxy image on")) {
            switched.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        lines.push(p);
    };
    let pause = || {
        switched
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| "paused in cluster.yaml (spec.rollout.paused: true)".to_string())
    };
    let mut engine = s.engine(&report);
    engine.pause_requested = Some(&pause);
    let target = s.target();
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || {}) => unreachable!("the driver never ends"),
        _ = s.twin.clock.sleep(NEVER_ENDING) => return Err(never_ended(&s).await),
    };
    let p = paused(outcome)?;
    assert_eq!(p.stage, "kube-proxy-manifests", "{p:?}\n{:#?}", lines.all());
    assert!(p.reason.contains("spec.rollout.paused"), "{}", p.reason);
    let moved = lines
        .all()
        .iter()
        .filter(|l| l.contains("kube-proxy image on"))
        .count();
    assert_eq!(moved, 1, "{:#?}", lines.all());
    Ok(())
}

/// (d) gap 1, N5: a drain's later rounds are filtered as its first is. A pod with no
/// controller placed on the node by `nodeName` while the drain waits on a budget (as
/// `kubectl debug node/…` makes one) is never evicted: the drain stops naming it.
#[tokio::test]
async fn a_bare_pod_that_comes_onto_a_draining_node_is_never_evicted() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let pdb = s.first_pdb()?;
    let ns = pdb.split('/').next().unwrap_or("default").to_string();
    s.post_faults(json!({"pdbsNeverAllow": [pdb]})).await?;
    let lines = Lines::default();
    let report = |p: Progress| lines.push(p);
    let engine = s.engine(&report);
    let target = s.target();
    // A worker cordoned with a pod of the budget's namespace still on it, not terminating:
    // its drain is held by the budget. Since when each was seen so.
    let seen: std::cell::RefCell<std::collections::BTreeMap<String, ichor::clock::Timestamp>> =
        Default::default();
    let placed = std::cell::RefCell::new(None::<String>);
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || {
            if placed.borrow().is_some() {
                return;
            }
            let now = s.twin.clock.now();
            let held: Vec<String> = s.twin.kube.with(|c, _| {
                let cordoned: Vec<String> = c
                    .list("nodes", None)
                    .iter()
                    .filter(|n| n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true))
                    .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string))
                    .filter(|n| n.starts_with("w-"))
                    .collect();
                let pods = c.list("pods", Some(&ns));
                cordoned
                    .into_iter()
                    .filter(|n| {
                        pods.iter().any(|p| {
                            p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(n.as_str())
                                && p.pointer("/metadata/deletionTimestamp").is_none()
                        })
                    })
                    .collect()
            });
            let mut seen = seen.borrow_mut();
            seen.retain(|n, _| held.contains(n));
            for n in held {
                let since = *seen.entry(n.clone()).or_insert(now);
                if now.since(since) >= Duration::from_secs(20) {
                    let made = s.twin.kube.with(|c, now| {
                        c.upsert(
                            json!({
                                "apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": "node-debugger", "namespace": "default"},
                                "spec": {"nodeName": n, "containers": [{"name": "debugger", "image": "busybox:1.36"}]},
                            }),
                            now,
                        )
                        .is_ok()
                    });
                    if made {
                        *placed.borrow_mut() = Some(n);
                    }
                    return;
                }
            }
        }) => unreachable!(),
        _ = s.twin.clock.sleep(NEVER_ENDING) => return Err(never_ended(&s).await),
    };
    let node = placed
        .into_inner()
        .ok_or("no drain was held by the budget")?;
    let p = paused(outcome)?;
    assert_eq!(p.node.as_deref(), Some(node.as_str()), "{p:?}");
    assert!(
        p.reason.contains("default/node-debugger") && p.reason.contains("came onto the node"),
        "{}",
        p.reason
    );
    let left = s.twin.kube.with(|c, _| {
        c.list("pods", Some("default")).iter().any(|p| {
            p.pointer("/metadata/name").and_then(Value::as_str) == Some("node-debugger")
                && p.pointer("/metadata/deletionTimestamp").is_none()
        })
    });
    assert!(left, "the bare pod was evicted");
    Ok(())
}
