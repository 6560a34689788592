//! Issue 42 (i), N8: no disruptive act without the lease. A renewal older than the renew
//! deadline (client-go's `RenewDeadline`) lets no act go: a control plane whose install
//! outlived the lease is not rebooted unless the lock is renewed and still ours; and the
//! rollout record is written over the version it was read at, a conflict re-read and
//! judged, never overwritten by an engine that lost the rollout.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::time::Duration;

use ichor::gate::live;
use ichor::rollout::record::{self, RecordError, RolloutRecord, Stored, TargetRef};
use ichor::rollout::{Progress, RunOutcome};
use ichor::sim::twin::TwinConfig;
use serde_json::Value;

use crate::rollout::{setup, setup_on_1_13, Lines};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// While a control plane installs (Talos 1.13, LifecycleService; three minutes here), the
/// engine's lease renewals stop getting through (every Lease request 503, its other calls
/// answered), and another engine takes the lapsed lease. The install ends and etcd is fine,
/// yet no Reboot reaches the node: the reboot waits for a renewal, which finds the lease
/// taken once renewals get through again, a minute after the install's end.
#[tokio::test]
async fn an_install_that_outlives_the_lease_is_followed_by_no_reboot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = setup_on_1_13(dir.path(), "talos: v1.13.9", "kubernetes: v1.33.7").await?;
    s.twin
        .talos
        .with_model(|m| m.timings.install = Duration::from_secs(180));
    let lines = Lines::default();
    let report = |p: Progress| lines.push(p);
    let engine = s.engine(&report);
    let target = s.target();
    let installing = std::cell::RefCell::new(None::<String>);
    // When the install ended (the API stays lost for a minute more, then comes back).
    let ended = Cell::new(None::<ichor::clock::Timestamp>);
    let healed = Cell::new(false);
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || {
            if healed.get() {
                return;
            }
            let now = s.twin.clock.now();
            let Some(node) = installing.borrow().clone() else {
                let cordoned: BTreeSet<String> = s.twin.kube.with(|c, _| {
                    c.list("nodes", None)
                        .iter()
                        .filter(|n| n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true))
                        .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string))
                        .collect()
                });
                let found = s.twin.talos.with_model(|m| {
                    m.nodes()
                        .iter()
                        .find(|n| n.installing && n.is_control_plane() && cordoned.contains(&n.name))
                        .map(|n| n.name.clone())
                });
                if let Some(n) = found {
                    // The engine's renewals stop getting through (its other calls do);
                    // another engine takes the lease.
                    s.twin.kube.with(|c, now| {
                        c.set_leases_unreachable(true);
                        let _ = c.steal_lease(
                            live::ICHOR_NAMESPACE,
                            &live::lock_name("homelab"),
                            "another-engine",
                            now,
                        );
                    });
                    *installing.borrow_mut() = Some(n);
                }
                return;
            };
            let still = s.twin.talos.with_model(|m| {
                m.nodes().iter().any(|n| n.name == node && n.installing)
            });
            match ended.get() {
                None if !still => ended.set(Some(now)),
                Some(at) if now.since(at) >= Duration::from_secs(60) => {
                    s.twin.kube.with(|c, _| c.set_leases_unreachable(false));
                    healed.set(true);
                }
                _ => {}
            }
        }) => unreachable!(),
    };
    let node = installing
        .into_inner()
        .ok_or("no control plane installed in its step")?;
    assert!(ended.get().is_some(), "the install of {node} never ended");
    assert!(
        matches!(&outcome, RunOutcome::Refused(why) if why.contains("another-engine")),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    let log = std::fs::read_to_string(s.twin.talos.audit_log_path())?;
    let rebooted = log.lines().any(|l| {
        serde_json::from_str::<Value>(l).is_ok_and(|v| {
            v["method"] == "machine.MachineService/Reboot" && v["node"] == node.as_str()
        })
    });
    assert!(
        !rebooted,
        "{node} was rebooted after the lease lapsed and was taken"
    );
    Ok(())
}

/// Two engines racing on one record: the one whose lease lapsed writes over the version it
/// read, meets the other's write (409), re-reads it, and stops — the record stays the
/// other's. Two engines creating the record at once end with one record and one refusal.
#[tokio::test]
async fn an_engine_never_overwrites_the_record_another_engine_wrote() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let target = TargetRef {
        commit: "c0ffee".into(),
        talos: "v1.12.9".into(),
        kubernetes: "v1.33.7".into(),
    };
    let now = s.twin.clock.now();
    let fresh = |holder: &str| Stored {
        record: RolloutRecord::new("homelab", target.clone(), holder, now),
        resource_version: None,
    };
    // Both create it: one wins, the other is told who.
    let (mut a, mut b) = (fresh("engine-a"), fresh("engine-b"));
    record::save(&s.kube, &mut a).await?;
    match record::save(&s.kube, &mut b).await {
        Err(RecordError::Taken { holder }) => assert_eq!(holder, "engine-a"),
        other => return Err(format!("the second create: {other:?}").into()),
    }
    // Engine b takes over (a's lease lapsed) from what it reads, and writes.
    let mut b = record::load(&s.kube, "homelab").await?.ok_or("no record")?;
    b.record.holder = "engine-b".into();
    b.record.log(now, "engine b carries on");
    record::save(&s.kube, &mut b).await?;
    // Engine a, unaware, writes over the version it read.
    a.record.log(now, "engine a writes on");
    match record::save(&s.kube, &mut a).await {
        Err(RecordError::Taken { holder }) => assert_eq!(holder, "engine-b"),
        other => return Err(format!("the stale write: {other:?}").into()),
    }
    let kept = record::load(&s.kube, "homelab")
        .await?
        .ok_or("no record")?
        .record;
    assert_eq!(kept.holder, "engine-b");
    let said: Vec<&str> = kept.history.iter().map(|h| h.message.as_str()).collect();
    assert!(said.contains(&"engine b carries on"), "{said:?}");
    assert!(!said.contains(&"engine a writes on"), "{said:?}");
    // The same engine meeting its own record (a write whose answer was lost, a hand edit
    // of the version) writes again over it.
    b.resource_version = Some("1".into());
    b.record.log(now, "engine b again");
    record::save(&s.kube, &mut b).await?;
    Ok(())
}
