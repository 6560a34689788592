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
    /// The cluster's only node, and cluster.yaml accepts its downtime
    /// (`spec.rollout.acceptSingleNodeDowntime`): upgraded in place, never cordoned or
    /// drained (its pods have nowhere to go).
    pub in_place: bool,
    /// Volumes with a replica here and no healthy replica elsewhere: evicting their pods now
    /// could leave them without a copy (single-replica volumes are not listed; the plan says
    /// their workload is down for the duration).
    pub unprotected_volumes: Vec<String>,
    /// VolumeAttachments still attached to the node.
    pub attachments: Vec<String>,
    /// Of the volumes the node held when the step began, those not healthy again yet.
    pub degraded_volumes: Vec<String>,
    /// The kubelet version the Node reports (`status.nodeInfo.kubeletVersion`).
    pub kubelet: String,
    /// Talos's own MachineStatus says the machine is not ready yet (its unmet conditions:
    /// on a control plane the etcd service among them); read once the node runs the
    /// target on a new boot and its Node is Ready. `None`: ready, or not read.
    pub talos_unready: Option<String>,
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
    /// The boot the target was installed ahead on (Talos ≥ 1.13, LifecycleService): from
    /// this boot, a reboot is all the upgrade still needs.
    pub installed_boot: Option<String>,
    /// The boot an install (LifecycleService/Upgrade) was sent on, recorded before the call:
    /// at most one install reaches a node per boot, since a second one overwrites the slot
    /// the node would fall back to (GRUB) or deletes the booted UKI (sd-boot). On this boot
    /// the step only waits for that install and reboots into what it wrote.
    pub install_sent_boot: Option<String>,
    /// Volumes with a replica on the node when the step began: they must be healthy again
    /// before the node is given back.
    pub volumes: Vec<String>,
    /// This engine saw the upgrade call succeed. Not stored: an engine that restarts after
    /// recording `upgrade_requested` cannot know whether the call reached the node, so a
    /// node still up on its old boot is asked again — a reboot into what an install sent on
    /// this boot wrote (`install_sent_boot`), never a second install.
    pub upgrade_confirmed: bool,
}

impl StepMarker {
    pub fn to_record(&self) -> super::record::StepRecord {
        super::record::StepRecord {
            started_at: self.started_at.map(Timestamp::rfc3339),
            boot_id_before: self.boot_id_before.clone(),
            upgrade_requested: self.upgrade_requested,
            pre_pulled: self.pre_pulled,
            installed_boot: self.installed_boot.clone(),
            install_sent_boot: self.install_sent_boot.clone(),
            volumes: self.volumes.clone(),
            finished_at: None,
            extra: Default::default(),
        }
    }

    pub fn from_record(r: &super::record::StepRecord) -> StepMarker {
        StepMarker {
            started_at: r.started_at.as_deref().and_then(Timestamp::parse_rfc3339),
            boot_id_before: r.boot_id_before.clone(),
            upgrade_requested: r.upgrade_requested,
            pre_pulled: r.pre_pulled,
            installed_boot: r.installed_boot.clone(),
            install_sent_boot: r.install_sent_boot.clone(),
            volumes: r.volumes.clone(),
            upgrade_confirmed: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    PrePull,
    Cordon,
    Drain,
    /// The kubelet's image-only edit, NO_REBOOT (a worker of the one-drain stage only).
    SwitchKubelet,
    Upgrade,
    Uncordon,
}

/// Every step's one shape: what to do next, from what is observed now. `A` is the step's
/// own actions ([`Action`] for a Talos node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepState<A = Action> {
    Done,
    Act(A),
    /// Waiting for the node to get somewhere by itself; the text says where.
    Settling(String),
    /// Stop for a human: what was observed, for how long, what would unblock it.
    Failed(String),
}

/// Whether the Talos a node reports (`None` while it does not answer) is exactly the
/// target: a `v1.12.9-beta.0` node still moves to `v1.12.9`. `None` when unknown.
pub fn talos_at_target(talos: Option<&str>, target: &Version) -> Option<bool> {
    let v = Version::parse(talos?).ok()?;
    Some(v == *target)
}

fn at_target(obs: &NodeObservation, target: &Version) -> Option<bool> {
    talos_at_target(obs.talos.as_deref(), target)
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
            // Talos's readiness, which on a control plane includes its etcd service
            // (siderolabs/talos@v1.13.9:internal/app/machined/pkg/controllers/runtime/
            // machine_status.go `getReadinessChecks`): a member still catching up is not
            // back, so the next control plane waits here instead of pausing on etcd.
            if let Some(why) = &obs.talos_unready {
                return if timed_out {
                    StepState::Failed(format!(
                        "the node runs Talos {target} and its Node is Ready, but Talos has not reported the machine ready for {}s (node timeout {}s): {why}; check it with talosctl get machinestatus, then resume",
                        elapsed.as_secs(),
                        node_timeout.as_secs()
                    ))
                } else {
                    StepState::Settling(format!(
                        "waiting for Talos to report the machine ready ({why})"
                    ))
                };
            }
            if !obs.degraded_volumes.is_empty() {
                return if timed_out {
                    StepState::Failed(format!(
                        "{} still not healthy {}s after the node's step began (node timeout {}s): its replica on the node has not rebuilt; check the volume in Longhorn, then resume",
                        plural_list("volume", &obs.degraded_volumes),
                        elapsed.as_secs(),
                        node_timeout.as_secs()
                    ))
                } else {
                    StepState::Settling(format!(
                        "waiting for the replicas of {} to rebuild",
                        obs.degraded_volumes.join(", ")
                    ))
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
                    "the node has not answered the Talos API for {}s after its upgrade began (node timeout {}s): it may not have come back; /ichor retry cannot bring it back — reach its console or power-cycle it, and once its Talos API answers, /ichor retry carries on",
                    elapsed.as_secs(),
                    node_timeout.as_secs()
                ))
            } else if marker.upgrade_requested {
                StepState::Settling("waiting for the node to come back from its reboot".into())
            } else if marker.started_at.is_none() {
                StepState::Failed(
                    "the node does not answer the Talos API before its upgrade began".into(),
                )
            } else {
                // A hiccup of the API (or of the path to it) is waited out, within the step.
                StepState::Settling("waiting for the node's Talos API to answer".into())
            }
        }
        Some(false) => {
            let rebooted =
                matches!((&marker.boot_id_before, &obs.boot_id), (Some(b), Some(n)) if b != n);
            if marker.upgrade_requested && rebooted {
                return StepState::Failed(format!(
                    "the node rebooted but reports Talos {}, not {target}: the installer did not take and Talos booted its previous installation (A/B fallback); /ichor retry would only see the same boot — fix the cause (the installer image, its extensions or kernel arguments) in a commit, or upgrade the node by hand; once it reports {target}, /ichor retry carries on",
                    obs.talos.as_deref().unwrap_or("?")
                ));
            }
            // Recorded as requested by an engine that then stopped: the call may never have
            // reached the node. Still up on the same boot, it gets the upgrade again.
            if marker.upgrade_requested && !marker.upgrade_confirmed && !rebooted {
                return StepState::Act(Action::Upgrade);
            }
            if marker.upgrade_requested {
                return if timed_out {
                    StepState::Failed(format!(
                        "the upgrade was requested {}s ago and the node has not rebooted (node timeout {}s): its installer may be stuck; /ichor retry waits again without asking again — look at the node (`talosctl -n <node> dmesg`), upgrade or reboot it by hand; once it reports {target}, /ichor retry carries on",
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
            if obs.in_place {
                return StepState::Act(Action::Upgrade);
            }
            if !obs.cordoned {
                return StepState::Act(Action::Cordon);
            }
            if obs.pods_to_move > 0 {
                if !obs.unprotected_volumes.is_empty() {
                    return if timed_out {
                        StepState::Failed(format!(
                            "{} on the node has no healthy replica elsewhere after {}s (node timeout {}s): evicting its pods could lose the only good copy; let the volume rebuild, then resume",
                            plural_list("volume", &obs.unprotected_volumes),
                            elapsed.as_secs(),
                            node_timeout.as_secs()
                        ))
                    } else {
                        StepState::Settling(format!(
                            "waiting for a healthy replica of {} on another node before draining",
                            obs.unprotected_volumes.join(", ")
                        ))
                    };
                }
                return StepState::Act(Action::Drain);
            }
            if !obs.attachments.is_empty() {
                return if timed_out {
                    StepState::Failed(format!(
                        "{} still attached to the node {}s after its drain (node timeout {}s); a volume detached by force could corrupt, so ichor waits: check the CSI driver, then resume",
                        plural_list("volume attachment", &obs.attachments),
                        elapsed.as_secs(),
                        node_timeout.as_secs()
                    ))
                } else {
                    StepState::Settling(format!(
                        "waiting for {} to detach",
                        plural_list("volume attachment", &obs.attachments)
                    ))
                };
            }
            StepState::Act(Action::Upgrade)
        }
    }
}

/// What the one-drain worker stage sees of a worker besides its Talos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletObservation {
    /// The Node reports the target kubelet and is Ready on this boot.
    pub on_target: bool,
    /// The node's active configuration names the target kubelet image.
    pub switched: bool,
}

/// The next move for a worker of the one-drain stage: its Talos step ([`talos_node`]) with
/// the kubelet switched right before the upgrade, in the same drain, and the kubelet's
/// version checked before the node is given back. A worker whose Talos is already on the
/// target walks the kubelet's own step ([`super::components::component_step`]): cordon,
/// drain, switch, uncordon.
#[allow(clippy::too_many_arguments)] // the Talos step's inputs and the kubelet's
pub fn worker_node(
    target: &Version,
    kubelet_tag: &str,
    node: &str,
    obs: &NodeObservation,
    kubelet: &KubeletObservation,
    marker: &StepMarker,
    now: Timestamp,
    node_timeout: Duration,
) -> StepState {
    use super::components::{component_step, ComponentAction, ComponentObservation};
    match talos_node(target, obs, marker, now, node_timeout) {
        // Talos on the target, Ready on its new boot, its volumes healthy: the kubelet is
        // what is left before the node goes back.
        StepState::Done | StepState::Act(Action::Uncordon) => {
            let c = ComponentObservation {
                on_target: kubelet.on_target,
                switched: kubelet.switched,
                node: Some(obs.clone()),
            };
            let waited = marker.started_at.map(|s| now.since(s));
            match component_step("kubelet", node, kubelet_tag, &c, waited, node_timeout) {
                StepState::Done => StepState::Done,
                StepState::Act(ComponentAction::Cordon) => StepState::Act(Action::Cordon),
                StepState::Act(ComponentAction::Drain) => StepState::Act(Action::Drain),
                StepState::Act(ComponentAction::Switch) => StepState::Act(Action::SwitchKubelet),
                StepState::Act(ComponentAction::Uncordon) => StepState::Act(Action::Uncordon),
                StepState::Settling(s) => StepState::Settling(s),
                StepState::Failed(s) => StepState::Failed(s),
            }
        }
        // Drained, nothing attached: the kubelet first (the old Talos runs the new kubelet
        // for a moment, a pair the plan checked), then the upgrade whose reboot it shares.
        StepState::Act(Action::Upgrade) if !kubelet.switched => {
            StepState::Act(Action::SwitchKubelet)
        }
        other => other,
    }
}

// What a look reads. A step looks at its node every few seconds for minutes, and a read is
// most of a look's cost, so a look reads only what can change the step's next move. Each
// rule below is asked with what the look has read so far; tests/it/props.rs checks that
// no read they skip changes what `talos_node` or `worker_node` decides.

/// After the Talos API answered (or did not): whether anything on the Kubernetes side
/// can change the move. Not while the node does not answer, nor while it installs and
/// reboots (the upgrade requested, still on the old version): then its boot id decides.
pub fn reads_kubernetes(target: &Version, talos: Option<&str>, marker: &StepMarker) -> bool {
    match talos_at_target(talos, target) {
        Some(true) => true,
        Some(false) => !marker.upgrade_requested,
        None => false,
    }
}

/// With the Node read: whether the node's pods can. Before the upgrade they decide the
/// drain; on the target only a kubelet still to move (`kubelet_tag`, the one-drain stage)
/// on a Ready node could drain it again.
pub fn reads_pods(target: &Version, obs: &NodeObservation, kubelet_tag: Option<&str>) -> bool {
    match at_target(obs, target) {
        Some(false) => true,
        Some(true) => kubelet_tag.is_some_and(|t| obs.ready && obs.kubelet != t),
        None => false,
    }
}

/// With the pods counted: whether the volumes can. While pods are still to move (is a
/// healthy copy elsewhere?), and, Ready on the target, for the replicas the step waits to
/// rebuild.
pub fn reads_volumes(target: &Version, obs: &NodeObservation, marker: &StepMarker) -> bool {
    obs.pods_to_move > 0
        || (at_target(obs, target) == Some(true) && obs.ready && !marker.volumes.is_empty())
}

/// Whether the volume attachments can: drained on the old version, before the upgrade.
pub fn reads_attachments(target: &Version, obs: &NodeObservation, marker: &StepMarker) -> bool {
    at_target(obs, target) == Some(false)
        && !marker.upgrade_requested
        && obs.cordoned
        && obs.pods_to_move == 0
        && !obs.in_place
}

/// Whether a one-drain worker's configuration (is the kubelet switched?) can: when its
/// Talos step is done or about to upgrade, and the kubelet is not on the target yet.
pub fn reads_switched(talos_move: &StepState, kubelet_on_target: bool) -> bool {
    !kubelet_on_target
        && matches!(
            talos_move,
            StepState::Done | StepState::Act(Action::Uncordon) | StepState::Act(Action::Upgrade)
        )
}

impl NodeObservation {
    /// A node with nothing read yet but its Talos answer.
    pub fn unread(talos: Option<String>) -> NodeObservation {
        NodeObservation {
            talos,
            boot_id: None,
            ready: false,
            cordoned: false,
            cordoned_by_ichor: false,
            pods_to_move: 0,
            in_place: false,
            unprotected_volumes: Vec::new(),
            attachments: Vec::new(),
            degraded_volumes: Vec::new(),
            kubelet: String::new(),
            talos_unready: None,
        }
    }
}

/// `volume a, b` / `volumes a, b, c`.
pub fn plural_list(noun: &str, items: &[String]) -> String {
    let s = if items.len() == 1 { "" } else { "s" };
    format!("{noun}{s} {}", items.join(", "))
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
            in_place: false,
            unprotected_volumes: vec![],
            attachments: vec![],
            degraded_volumes: vec![],
            kubelet: "v1.33.5".into(),
            talos_unready: None,
        }
    }

    const T: Duration = Duration::from_secs(1800);

    #[test]
    fn the_only_node_of_a_cluster_that_accepts_the_downtime_is_upgraded_in_place() {
        let target = Version::parse("v1.12.9").unwrap();
        let mut m = StepMarker {
            started_at: Some(Timestamp(0)),
            pre_pulled: true,
            ..Default::default()
        };
        let mut o = obs(Some("v1.12.6"), Some("a"), true, false, 4);
        o.in_place = true;
        // Not cordoned, pods on it: straight to the upgrade.
        assert_eq!(
            talos_node(&target, &o, &m, Timestamp(1), T),
            StepState::Act(Action::Upgrade)
        );
        m.upgrade_requested = true;
        m.upgrade_confirmed = true;
        m.boot_id_before = Some("a".into());
        let back = NodeObservation {
            talos: Some("v1.12.9".into()),
            boot_id: Some("b".into()),
            ..o
        };
        // Back on the target and never cordoned: done, nothing to give back.
        assert_eq!(
            talos_node(&target, &back, &m, Timestamp(2), T),
            StepState::Done
        );
    }

    #[test]
    fn failures_retry_cannot_fix_say_what_will() {
        let target = Version::parse("v1.12.9").unwrap();
        let m = StepMarker {
            started_at: Some(Timestamp(0)),
            boot_id_before: Some("a".into()),
            pre_pulled: true,
            upgrade_requested: true,
            upgrade_confirmed: true,
            ..Default::default()
        };
        let late = Timestamp(0).plus(T + Duration::from_secs(1));
        let says = |o: &NodeObservation, at: Timestamp| match talos_node(&target, o, &m, at, T) {
            StepState::Failed(why) => why,
            other => panic!("expected a failure, got {other:?}"),
        };
        // A/B fallback: a new boot on the old version.
        let fell_back = says(
            &obs(Some("v1.12.6"), Some("b"), true, true, 0),
            Timestamp(1),
        );
        assert!(fell_back.contains("A/B fallback"), "{fell_back}");
        assert!(
            fell_back.contains("/ichor retry would only see"),
            "{fell_back}"
        );
        assert!(fell_back.contains("once it reports v1.12.9"), "{fell_back}");
        // Never rebooted: the same boot past the node timeout.
        let stuck = says(&obs(Some("v1.12.6"), Some("a"), true, true, 0), late);
        assert!(
            stuck.contains("waits again without asking again"),
            "{stuck}"
        );
        assert!(stuck.contains("once it reports v1.12.9"), "{stuck}");
        // Never came back: silent past the node timeout.
        let gone = says(&obs(None, None, false, true, 0), late);
        assert!(gone.contains("/ichor retry cannot bring it back"), "{gone}");
    }

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
        m.upgrade_confirmed = true;
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
            upgrade_confirmed: true,
            ..StepMarker::default()
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

    #[test]
    fn volumes_hold_the_drain_the_reboot_and_the_uncordon() {
        let target = Version::parse("v1.12.9").unwrap();
        let now = Timestamp(1_000_000);
        let mut m = StepMarker {
            started_at: Some(now),
            boot_id_before: Some("a".into()),
            pre_pulled: true,
            volumes: vec!["pvc-data".into()],
            ..Default::default()
        };
        let s = |o: &NodeObservation, m: &StepMarker, now| talos_node(&target, o, m, now, T);
        let mut o = obs(Some("v1.12.6"), Some("a"), true, true, 2);
        o.unprotected_volumes = vec!["pvc-data".into()];
        assert!(
            matches!(s(&o, &m, now), StepState::Settling(w) if w.contains("healthy replica of pvc-data"))
        );
        assert!(
            matches!(s(&o, &m, now.plus(T * 2)), StepState::Failed(w) if w.contains("no healthy replica elsewhere"))
        );
        let mut o = obs(Some("v1.12.6"), Some("a"), true, true, 0);
        o.attachments = vec!["csi-1".into()];
        assert!(
            matches!(s(&o, &m, now), StepState::Settling(w) if w.contains("volume attachment csi-1"))
        );
        m.upgrade_requested = true;
        m.upgrade_confirmed = true;
        let mut o = obs(Some("v1.12.9"), Some("b"), true, true, 0);
        o.degraded_volumes = vec!["pvc-data".into()];
        assert!(matches!(s(&o, &m, now), StepState::Settling(w) if w.contains("rebuild")));
        assert!(
            matches!(s(&o, &m, now.plus(T * 2)), StepState::Failed(w) if w.contains("has not rebuilt"))
        );
        o.degraded_volumes.clear();
        assert_eq!(s(&o, &m, now), StepState::Act(Action::Uncordon));
    }

    #[test]
    fn a_restarted_engine_re_requests_an_upgrade_the_node_never_saw() {
        let target = Version::parse("v1.12.9").unwrap();
        let now = Timestamp(1_000_000);
        let stored = StepMarker {
            started_at: Some(now),
            boot_id_before: Some("a".into()),
            pre_pulled: true,
            upgrade_requested: true,
            ..Default::default()
        };
        let m = StepMarker::from_record(&stored.to_record());
        assert!(!m.upgrade_confirmed);
        // Same boot, old version: the call may not have reached it.
        let o = obs(Some("v1.12.6"), Some("a"), true, true, 0);
        assert_eq!(
            talos_node(&target, &o, &m, now, T),
            StepState::Act(Action::Upgrade)
        );
        // Down: it did; wait for it.
        let o = obs(None, None, false, true, 0);
        assert!(matches!(
            talos_node(&target, &o, &m, now, T),
            StepState::Settling(_)
        ));
    }
}
