//! etcd members by identity, not by name: with `registerWithFQDN` (Talos registers each
//! Node as its lower-cased FQDN while etcd names the member with the short hostname) the
//! engine still finds each control plane's member, so an unhealthy or stale member, or a
//! two-member etcd, stops a control plane from going down, and the leader still goes last.

use std::time::Duration;

use ichor::rollout::RunOutcome;
use ichor::sim::twin::{RegisterWithFqdn, TwinConfig};

use crate::rollout::{paused, run_once, setup, setup_edited, Lines, Setup};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn fqdn() -> TwinConfig {
    TwinConfig {
        register_with_fqdn: Some(RegisterWithFqdn {
            domain: "Example.org".into(),
        }),
        ..TwinConfig::default()
    }
}

/// The homelab without its third control plane.
fn two_control_planes(text: &str) -> String {
    text.replace(
        "      - {name: cp-3, role: controlplane, address: 10.0.10.13}\n",
        "",
    )
}

/// Nodes a client patched (cordons), as the twin's audit log shows them.
fn node_patches(s: &Setup) -> Vec<String> {
    s.twin
        .kube
        .audit()
        .entries()
        .into_iter()
        .filter(|e| e.resource == "nodes" && e.verb == "patch")
        .map(|e| e.name.clone())
        .collect()
}

/// The engine alone (no pre-flight gate before it) to its end.
async fn engine_only(s: &Setup) -> Result<RunOutcome, Box<dyn std::error::Error>> {
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let target = s.target();
    let run = engine.run(&s.plan, &target, None, false);
    let outcome = tokio::select! {
        r = run => r?,
        _ = s.twin.drive(Duration::from_secs(2), || {}) => unreachable!("the driver never ends"),
    };
    Ok(outcome)
}

#[tokio::test]
async fn the_twin_registers_nodes_under_their_lower_cased_fqdn_and_etcd_keeps_hostnames(
) -> TestResult {
    let s = setup(fqdn()).await?;
    let names: Vec<String> = s.kube.nodes().await?.into_iter().map(|n| n.name).collect();
    assert!(names.contains(&"cp-1.example.org".to_string()), "{names:?}");
    assert!(names.contains(&"w-3.example.org".to_string()), "{names:?}");
    let members = s
        .talos
        .etcd_members("10.0.10.11", Default::default())
        .await?;
    let mut hostnames: Vec<String> = members.into_iter().map(|m| m.hostname).collect();
    hostnames.sort();
    assert_eq!(hostnames, ["cp-1", "cp-2", "cp-3"]);
    Ok(())
}

/// Two members: either down loses quorum. Matched by name, the node's own member counted
/// as staying and the first control plane rebooted; by identity, the engine refuses
/// before anything is cordoned.
#[tokio::test]
async fn with_fqdn_names_two_control_planes_are_refused_before_either_goes_down() -> TestResult {
    let s = setup_edited(fqdn(), &two_control_planes).await?;
    let p = paused(engine_only(&s).await?)?;
    assert!(p.reason.contains("quorum needs 2"), "{}", p.reason);
    assert_eq!(
        node_patches(&s),
        Vec::<String>::new(),
        "nothing is cordoned"
    );
    for o in s.twin.talos.observe() {
        assert!(o.up, "{} went down", o.name);
        assert_eq!(o.talos_version, "v1.12.6", "{} moved", o.name);
    }
    assert!(s.twin.talos.with_model(|m| m.etcd_has_quorum()));
    // The pre-flight gate says it before the engine starts.
    let s = setup_edited(fqdn(), &two_control_planes).await?;
    let (o, _, _) = run_once(&s, false).await?;
    let p = paused(o)?;
    assert!(p.reason.contains("loses quorum"), "{}", p.reason);
    Ok(())
}

/// An unhealthy member on another control plane stops the first one going down, with
/// FQDN Node names as with short ones.
#[tokio::test]
async fn with_fqdn_names_an_unhealthy_or_stale_member_still_stops_a_control_plane() -> TestResult {
    for (unhealthy, stale, named) in [
        (vec!["cp-3".to_string()], vec![], "cp-3"),
        (vec![], vec!["cp-old".to_string()], "cp-old"),
    ] {
        let mut config = fqdn();
        config.faults.etcd_unhealthy = unhealthy;
        config.faults.etcd_stale_members = stale;
        let s = setup(config).await?;
        let p = paused(engine_only(&s).await?)?;
        assert!(p.reason.contains(named), "{}", p.reason);
        assert!(
            p.node
                .as_deref()
                .is_some_and(|n| n.ends_with(".example.org")),
            "{p:?}"
        );
        for o in s.twin.talos.observe() {
            assert!(o.up, "{} went down", o.name);
            assert_eq!(o.talos_version, "v1.12.6", "{} moved", o.name);
        }
    }
    Ok(())
}

/// The leader is found by the member id its node reports, so it goes last with FQDN Node
/// names too (by name it never matched, and went first in plan order).
#[tokio::test]
async fn with_fqdn_names_the_etcd_leader_is_the_last_control_plane_to_upgrade() -> TestResult {
    let s = setup(fqdn()).await?;
    s.twin.talos.with_model(|m| {
        while let Some(leader) = m.etcd_leader().map(str::to_string) {
            if leader == "cp-1" {
                break;
            }
            let i = m.nodes().iter().position(|n| n.name == leader).unwrap_or(0);
            if m.forfeit_leadership(i).is_err() {
                break;
            }
        }
    });
    let leader = s
        .twin
        .talos
        .with_model(|m| m.etcd_leader().map(str::to_string));
    assert_eq!(leader.as_deref(), Some("cp-1"));
    let (o, seen, lines) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "invariants broken: {seen:?}");
    assert!(matches!(o, RunOutcome::Completed { .. }), "{o:?}");
    let order: Vec<String> = lines
        .all()
        .iter()
        .filter(|l| l.contains("upgrade to v1.12.9 requested"))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(1)
                .map(|n| n.trim_end_matches(':').to_string())
        })
        .filter(|n| n.starts_with("cp-"))
        .collect();
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(
        order.last().map(String::as_str),
        Some("cp-1.example.org"),
        "{order:?}"
    );
    Ok(())
}
