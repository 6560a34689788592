//! One node's Talos upgrade as a function of what is observed: every call of [`talos_node`]
//! looks at the node as it is now and says what to do next. Nothing here remembers progress
//! except the step's start marker (the boot id before the upgrade and when the step began,
//! kept in the rollout record), so a restarted engine re-observes and carries on.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::releaseset::Version;

/// What the engine sees of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeObservation {
    /// The Talos version the node's API reports; `None` while it does not answer.
    pub talos: Option<String>,
    /// The boot id; `None` while the node does not answer.
    pub boot_id: Option<String>,
    /// The Kubernetes Node is Ready.
    pub ready: bool,
    pub cordoned: bool,
    pub cordoned_by_ichor: bool,
    /// Pods a drain would move are still on the node.
    pub pods_to_move: usize,
}

/// Remembered from when the step began (the rollout record holds it across restarts).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepMarker {
    pub started_at: Option<Timestamp>,
    /// The boot id before the upgrade: a different one means the node rebooted.
    pub boot_id_before: Option<String>,
    /// The upgrade was requested (so a node still on the old version is settling, not idle).
    pub upgrade_requested: bool,
    pub pre_pulled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    PrePull,
    Cordon,
    Drain,
    Upgrade,
    Uncordon,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepState {
    Done,
    Act(Action),
    /// Waiting for the node to get somewhere by itself; the text says where.
    Settling(String),
    /// Stop for a human: what was observed, for how long, what would unblock it.
    Failed(String),
}

/// Exactly the target: a `v1.12.9-beta.0` node still moves to `v1.12.9`.
fn at_target(obs: &NodeObservation, target: &Version) -> Option<bool> {
    let v = Version::parse(obs.talos.as_deref()?).ok()?;
    Some(v == *target)
}

/// The next move for one node's Talos upgrade to `target`, given `obs`, the step's marker,
/// `now` and the per-node timeout.
pub fn talos_node(
    target: &Version,
    obs: &NodeObservation,
    marker: &StepMarker,
    now: Timestamp,
    node_timeout: Duration,
) -> StepState {
    let elapsed = marker.started_at.map(|s| now.since(s)).unwrap_or_default();
    let timed_out = marker.started_at.is_some() && elapsed > node_timeout;
    match at_target(obs, target) {
        // Upgraded (or never needed it): finish by giving the node back.
        Some(true) => {
            let rebooted = match (&marker.boot_id_before, &obs.boot_id) {
                (Some(before), Some(now)) => before != now,
                _ => true,
            };
            if !rebooted && marker.upgrade_requested {
                return StepState::Failed(format!(
                    "the node reports Talos {} but its boot id did not change: the upgrade did not reboot it",
                    target
                ));
            }
            if !obs.ready {
                return if timed_out {
                    StepState::Failed(format!(
                        "the node runs Talos {target} but has not been Ready for {}s (node timeout {}s); check its kubelet",
                        elapsed.as_secs(),
                        node_timeout.as_secs()
                    ))
                } else {
                    StepState::Settling("waiting for the node to be Ready".into())
                };
            }
            if obs.cordoned && obs.cordoned_by_ichor {
                return StepState::Act(Action::Uncordon);
            }
            StepState::Done
        }
        // Not answering: mid-reboot, or gone.
        None => {
            if timed_out {
                StepState::Failed(format!(
                    "the node has not answered the Talos API for {}s after its upgrade began (node timeout {}s): it may not have come back",
                    elapsed.as_secs(),
                    node_timeout.as_secs()
                ))
            } else if marker.upgrade_requested {
                StepState::Settling("waiting for the node to come back from its reboot".into())
            } else {
                StepState::Failed(
                    "the node does not answer the Talos API before its upgrade began".into(),
                )
            }
        }
        Some(false) => {
            let rebooted =
                matches!((&marker.boot_id_before, &obs.boot_id), (Some(b), Some(n)) if b != n);
            if marker.upgrade_requested && rebooted {
                return StepState::Failed(format!(
                    "the node rebooted but reports Talos {}, not {target}: the installer did not take",
                    obs.talos.as_deref().unwrap_or("?")
                ));
            }
            if marker.upgrade_requested {
                return if timed_out {
                    StepState::Failed(format!(
                        "the upgrade was requested {}s ago and the node has not rebooted (node timeout {}s)",
                        elapsed.as_secs(),
                        node_timeout.as_secs()
                    ))
                } else {
                    StepState::Settling("waiting for the node to install and reboot".into())
                };
            }
            if !marker.pre_pulled {
                return StepState::Act(Action::PrePull);
            }
            if !obs.cordoned {
                return StepState::Act(Action::Cordon);
            }
            if obs.pods_to_move > 0 {
                return StepState::Act(Action::Drain);
            }
            StepState::Act(Action::Upgrade)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(
        talos: Option<&str>,
        boot: Option<&str>,
        ready: bool,
        cordoned: bool,
        pods: usize,
    ) -> NodeObservation {
        NodeObservation {
            talos: talos.map(str::to_string),
            boot_id: boot.map(str::to_string),
            ready,
            cordoned,
            cordoned_by_ichor: cordoned,
            pods_to_move: pods,
        }
    }

    const T: Duration = Duration::from_secs(1800);

    #[test]
    fn a_node_walks_through_the_steps_in_order() {
        let target = Version::parse("v1.12.9").unwrap();
        let now = Timestamp(1_000_000);
        let mut m = StepMarker {
            started_at: Some(now),
            boot_id_before: Some("a".into()),
            ..Default::default()
        };
        let s = |o: &NodeObservation, m: &StepMarker| talos_node(&target, o, m, now, T);
        assert_eq!(
            s(&obs(Some("v1.12.6"), Some("a"), true, false, 3), &m),
            StepState::Act(Action::PrePull)
        );
        m.pre_pulled = true;
        assert_eq!(
            s(&obs(Some("v1.12.6"), Some("a"), true, false, 3), &m),
            StepState::Act(Action::Cordon)
        );
        assert_eq!(
            s(&obs(Some("v1.12.6"), Some("a"), true, true, 3), &m),
            StepState::Act(Action::Drain)
        );
        assert_eq!(
            s(&obs(Some("v1.12.6"), Some("a"), true, true, 0), &m),
            StepState::Act(Action::Upgrade)
        );
        m.upgrade_requested = true;
        assert!(matches!(
            s(&obs(Some("v1.12.6"), Some("a"), true, true, 0), &m),
            StepState::Settling(_)
        ));
        assert!(matches!(
            s(&obs(None, None, false, true, 0), &m),
            StepState::Settling(_)
        ));
        assert!(matches!(
            s(&obs(Some("v1.12.9"), Some("b"), false, true, 0), &m),
            StepState::Settling(_)
        ));
        assert_eq!(
            s(&obs(Some("v1.12.9"), Some("b"), true, true, 0), &m),
            StepState::Act(Action::Uncordon)
        );
        assert_eq!(
            s(&obs(Some("v1.12.9"), Some("b"), true, false, 0), &m),
            StepState::Done
        );
    }

    #[test]
    fn failures_name_what_was_observed() {
        let target = Version::parse("v1.12.9").unwrap();
        let start = Timestamp(1_000_000);
        let late = start.plus(T + Duration::from_secs(1));
        let m = StepMarker {
            started_at: Some(start),
            boot_id_before: Some("a".into()),
            upgrade_requested: true,
            pre_pulled: true,
        };
        let s = |o: &NodeObservation, now| talos_node(&target, o, &m, now, T);
        // Never came back.
        assert!(
            matches!(s(&obs(None, None, false, true, 0), late), StepState::Failed(m) if m.contains("not have come back"))
        );
        // Came back on the wrong version.
        assert!(
            matches!(s(&obs(Some("v1.12.6"), Some("b"), true, true, 0), start), StepState::Failed(m) if m.contains("did not take"))
        );
        // At the target without a reboot.
        assert!(
            matches!(s(&obs(Some("v1.12.9"), Some("a"), true, true, 0), start), StepState::Failed(m) if m.contains("did not reboot"))
        );
        // Back but never Ready.
        assert!(
            matches!(s(&obs(Some("v1.12.9"), Some("b"), false, true, 0), late), StepState::Failed(m) if m.contains("not been Ready"))
        );
    }

    #[test]
    fn a_node_already_at_the_target_is_done_and_someone_elses_cordon_stays() {
        let target = Version::parse("v1.12.9").unwrap();
        let mut o = obs(Some("v1.12.9"), Some("a"), true, true, 0);
        o.cordoned_by_ichor = false;
        assert_eq!(
            talos_node(&target, &o, &StepMarker::default(), Timestamp(0), T),
            StepState::Done
        );
        // A pre-release of the target is not the target: it moves to the release.
        let o = obs(Some("v1.12.9-beta.0"), Some("a"), true, false, 0);
        assert_eq!(
            talos_node(&target, &o, &StepMarker::default(), Timestamp(0), T),
            StepState::Act(Action::PrePull)
        );
    }
}
