//! A fault schedule drawn from a seed: which faults strike, when (on the simulated clock,
//! measured from the rollout's start), on what, and for how long. The same seed over the
//! same cluster draws the same schedule, whatever the machine.
//!
//! Every fault here is one the twin models as upstream behaves (docs/twin.md, "Timings and
//! faults") and one the rollout can recover from once it is cleared: the rehearsal plays
//! the operator who clears it.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

/// The kinds of fault a schedule draws from (`--faults` names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultKind {
    /// The engine dies (its task dropped, as a killed process) and a new one starts from the
    /// record it left.
    EngineKilled,
    /// A PodDisruptionBudget allows no disruption, then allows again.
    PdbBlocks,
    /// A node that reboots does not come back until the fault clears.
    NodeNeverReturns,
    /// A kubelet stops posting status while its machine stays up: the Node goes NotReady.
    KubeletSilent,
    /// A control plane's etcd member is cut off from its peers.
    EtcdUnhealthy,
    /// A burst of Kubernetes API errors (500 or 429 with Retry-After).
    ApiErrors,
    /// A node's ApplyConfiguration blocks for a while before acting.
    SlowApply,
    /// A Longhorn volume's failed replicas are not rebuilt until the fault clears.
    ReplicasNeverRebuild,
    /// An operator cordons a node by hand (and uncordons it when the fault clears).
    OperatorCordon,
    /// Someone else takes the rollout lock (the Lease) and never renews it: it lapses.
    LeaseStolen,
    /// A node's next boot falls back to the version it ran (A/B fallback), until cleared.
    BootsWrongVersion,
    /// A node's installer ends with an exit code (1 unclassified … 7 install), until cleared.
    InstallerFails,
    /// An etcd member no machine answers for (a control plane replaced, never removed): it
    /// counts toward quorum until the operator removes it.
    EtcdStaleMember,
    /// A legacy (Talos ≤ 1.12) Upgrade's installer pull takes minutes.
    SlowInstallerPull,
    /// An operator puts `ichor.dev/hold` on a node (and removes it when the fault clears).
    OperatorHold,
    /// A pod with no controller appears on a node (a drain refuses it); the operator
    /// deletes it when the fault clears.
    BarePod,
}

impl FaultKind {
    pub const ALL: [FaultKind; 16] = [
        FaultKind::EngineKilled,
        FaultKind::PdbBlocks,
        FaultKind::NodeNeverReturns,
        FaultKind::KubeletSilent,
        FaultKind::EtcdUnhealthy,
        FaultKind::ApiErrors,
        FaultKind::SlowApply,
        FaultKind::ReplicasNeverRebuild,
        FaultKind::OperatorCordon,
        FaultKind::LeaseStolen,
        FaultKind::BootsWrongVersion,
        FaultKind::InstallerFails,
        FaultKind::EtcdStaleMember,
        FaultKind::SlowInstallerPull,
        FaultKind::OperatorHold,
        FaultKind::BarePod,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::EngineKilled => "engineKilled",
            FaultKind::PdbBlocks => "pdbBlocks",
            FaultKind::NodeNeverReturns => "nodeNeverReturns",
            FaultKind::KubeletSilent => "kubeletSilent",
            FaultKind::EtcdUnhealthy => "etcdUnhealthy",
            FaultKind::ApiErrors => "apiErrors",
            FaultKind::SlowApply => "slowApply",
            FaultKind::ReplicasNeverRebuild => "replicasNeverRebuild",
            FaultKind::OperatorCordon => "operatorCordon",
            FaultKind::LeaseStolen => "leaseStolen",
            FaultKind::BootsWrongVersion => "bootsWrongVersion",
            FaultKind::InstallerFails => "installerFails",
            FaultKind::EtcdStaleMember => "etcdStaleMember",
            FaultKind::SlowInstallerPull => "slowInstallerPull",
            FaultKind::OperatorHold => "operatorHold",
            FaultKind::BarePod => "barePod",
        }
    }

    /// `--faults a,b,c`: each name known, at least one.
    pub fn parse_list(text: &str) -> Result<Vec<FaultKind>, String> {
        let mut out = Vec::new();
        for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| {
                    format!(
                        "unknown fault {name:?}: expected one of {}",
                        FaultKind::ALL.map(FaultKind::name).join(", ")
                    )
                })?;
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        if out.is_empty() {
            return Err("--faults names no fault".into());
        }
        Ok(out)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a schedule can aim at: read from the twin before the rollout starts.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub control_planes: Vec<String>,
    pub workers: Vec<String>,
    /// `namespace/name`.
    pub pdbs: Vec<String>,
    pub volumes: Vec<String>,
    /// Each node's Talos version before the rollout (what a fallback boots).
    pub versions: std::collections::BTreeMap<String, String>,
    /// The rollout lock, `namespace/name`.
    pub lease: Option<String>,
    /// Whether any node runs Talos 1.12 or older (the legacy Upgrade pulls inside the call).
    pub legacy_upgrade: bool,
}

/// The holder a stolen lock names.
pub const THIEF: &str = "rehearsal-thief";
/// The stale etcd member's hostname.
pub const STALE_MEMBER: &str = "cp-replaced";

/// One fault of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    /// Simulated time from the rollout's start.
    #[serde(serialize_with = "as_secs")]
    pub at: Duration,
    #[serde(rename = "fault")]
    pub kind: FaultKind,
    /// The node, PodDisruptionBudget or volume it strikes (none for an engine kill or an
    /// API burst).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// How long it lasts unless a pause clears it first (none: it clears itself, as an
    /// engine kill or an API burst does).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_secs")]
    pub lasts: Option<Duration>,
    /// Requests an API burst fails, and with which status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<(u32, u16)>,
    /// The installer's exit code, the version a fallback boots, a pull's delay: the
    /// fault's one parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with: Option<String>,
}

fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

fn opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(d.as_secs()),
        None => s.serialize_none(),
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(t) = &self.target {
            write!(f, " {t}")?;
        }
        if let Some((n, code)) = self.burst {
            write!(f, " ({n} requests answered {code})")?;
        }
        if let Some(w) = &self.with {
            write!(f, " ({w})")?;
        }
        if let Some(l) = self.lasts {
            write!(f, " for {}s", l.as_secs())?;
        }
        Ok(())
    }
}

impl Fault {
    /// The `/_twin/faults` fields this fault sets, given every fault active with it (each
    /// field is replaced whole, so it carries every active fault of its kind). `None` for
    /// the faults the rehearsal acts out itself (an engine kill, an operator's cordon).
    pub fn document(kind: FaultKind, active: &[&Fault]) -> Option<Value> {
        let targets = || -> Vec<String> {
            active
                .iter()
                .filter(|f| f.kind == kind)
                .filter_map(|f| f.target.clone())
                .collect()
        };
        let of_kind = || active.iter().filter(|f| f.kind == kind);
        let with_map = || -> serde_json::Map<String, Value> {
            of_kind()
                .filter_map(|f| Some((f.target.clone()?, json!(f.with.clone()?))))
                .collect()
        };
        Some(match kind {
            FaultKind::EngineKilled
            | FaultKind::OperatorCordon
            | FaultKind::OperatorHold
            | FaultKind::BarePod => return None,
            // Sent once when it strikes; it lapses by itself.
            FaultKind::LeaseStolen => {
                let f = of_kind().next_back()?;
                let (namespace, name) = f.target.as_deref()?.split_once('/')?;
                json!({"stealLease": {"namespace": namespace, "name": name, "holder": THIEF}})
            }
            FaultKind::BootsWrongVersion => json!({ "wrongVersion": with_map() }),
            FaultKind::SlowInstallerPull => json!({ "slowInstallerPull": with_map() }),
            FaultKind::InstallerFails => {
                let codes: serde_json::Map<String, Value> = of_kind()
                    .filter_map(|f| {
                        let code: i64 = f.with.as_deref()?.parse().ok()?;
                        Some((f.target.clone()?, json!(code)))
                    })
                    .collect();
                json!({ "installerExitCode": codes })
            }
            FaultKind::EtcdStaleMember => json!({"etcdStaleMembers": targets()}),
            FaultKind::PdbBlocks => json!({"pdbsNeverAllow": targets()}),
            FaultKind::NodeNeverReturns => json!({"nodesNeverReturn": targets()}),
            FaultKind::KubeletSilent => json!({"kubeletDown": targets()}),
            FaultKind::EtcdUnhealthy => json!({"etcdUnhealthy": targets()}),
            FaultKind::ReplicasNeverRebuild => json!({"replicasNeverRebuild": targets()}),
            FaultKind::SlowApply => {
                let map: serde_json::Map<String, Value> = active
                    .iter()
                    .filter(|f| f.kind == kind)
                    .filter_map(|f| Some((f.target.clone()?, json!("3m"))))
                    .collect();
                json!({ "slowApply": map })
            }
            FaultKind::ApiErrors => {
                let (count, status) = active
                    .iter()
                    .filter(|f| f.kind == kind)
                    .filter_map(|f| f.burst)
                    .next_back()
                    .unwrap_or((0, 500));
                json!({"apiErrorBurst": {"count": count, "status": status, "retryAfter": "2s"}})
            }
        })
    }
}

/// How many faults a seed draws: at most this many, at least one.
pub const MAX_FAULTS: u64 = 4;

/// The schedule of `seed`: up to [`MAX_FAULTS`] faults of the kinds in `alphabet` that
/// have something to strike, at times within `horizon` (the plan's estimate), sorted by time.
pub fn draw(seed: u64, alphabet: &[FaultKind], targets: &Targets, horizon: Duration) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let usable: Vec<FaultKind> = alphabet
        .iter()
        .copied()
        .filter(|k| match k {
            FaultKind::PdbBlocks => !targets.pdbs.is_empty(),
            FaultKind::EtcdUnhealthy => targets.control_planes.len() > 1,
            FaultKind::ReplicasNeverRebuild => !targets.volumes.is_empty(),
            FaultKind::KubeletSilent
            | FaultKind::NodeNeverReturns
            | FaultKind::SlowApply
            | FaultKind::OperatorCordon => {
                !targets.workers.is_empty() || !targets.control_planes.is_empty()
            }
            FaultKind::EngineKilled | FaultKind::ApiErrors => true,
            FaultKind::LeaseStolen => targets.lease.is_some(),
            FaultKind::EtcdStaleMember => !targets.control_planes.is_empty(),
            FaultKind::SlowInstallerPull => targets.legacy_upgrade,
            FaultKind::BarePod => !targets.workers.is_empty(),
            FaultKind::BootsWrongVersion | FaultKind::InstallerFails | FaultKind::OperatorHold => {
                !targets.workers.is_empty() || !targets.control_planes.is_empty()
            }
        })
        .collect();
    if usable.is_empty() {
        return Vec::new();
    }
    let horizon = horizon.max(Duration::from_secs(60)).as_secs();
    let count = rng.random_range(1..=MAX_FAULTS);
    let mut out = Vec::new();
    for _ in 0..count {
        let kind = usable[rng.random_range(0..usable.len())];
        let at = Duration::from_secs(rng.random_range(0..horizon));
        let lasts = Some(Duration::from_secs(rng.random_range(60..=1800)));
        let pick =
            |rng: &mut StdRng, list: &[String]| list[rng.random_range(0..list.len())].clone();
        let any_node: Vec<String> = targets
            .control_planes
            .iter()
            .chain(targets.workers.iter())
            .cloned()
            .collect();
        // What it strikes, how long, and its one parameter (the draws keep their order).
        let (target, lasts, burst, with) = match kind {
            FaultKind::EngineKilled => (None, None, None, None),
            FaultKind::ApiErrors => {
                let n = rng.random_range(1..=20);
                let status = if rng.random_bool(0.5) { 500 } else { 429 };
                (None, None, Some((n, status)), None)
            }
            FaultKind::PdbBlocks => (Some(pick(&mut rng, &targets.pdbs)), lasts, None, None),
            FaultKind::EtcdUnhealthy => (
                Some(pick(&mut rng, &targets.control_planes)),
                lasts,
                None,
                None,
            ),
            FaultKind::ReplicasNeverRebuild => {
                (Some(pick(&mut rng, &targets.volumes)), lasts, None, None)
            }
            FaultKind::KubeletSilent
            | FaultKind::NodeNeverReturns
            | FaultKind::SlowApply
            | FaultKind::OperatorCordon
            | FaultKind::OperatorHold => (Some(pick(&mut rng, &any_node)), lasts, None, None),
            FaultKind::LeaseStolen => (targets.lease.clone(), None, None, None),
            FaultKind::EtcdStaleMember => (Some(STALE_MEMBER.to_string()), lasts, None, None),
            FaultKind::BarePod => (Some(pick(&mut rng, &targets.workers)), lasts, None, None),
            FaultKind::BootsWrongVersion => {
                let node = pick(&mut rng, &any_node);
                let version = targets.versions.get(&node).cloned();
                (Some(node), lasts, None, version)
            }
            FaultKind::InstallerFails => {
                let code = rng.random_range(1..=7u8);
                (
                    Some(pick(&mut rng, &any_node)),
                    lasts,
                    None,
                    Some(code.to_string()),
                )
            }
            FaultKind::SlowInstallerPull => {
                let secs = rng.random_range(30..=600u64);
                let node = pick(&mut rng, &any_node);
                (Some(node), lasts, None, Some(format!("{secs}s")))
            }
        };
        let fault = Fault {
            at,
            kind,
            target,
            lasts,
            burst,
            with,
        };
        // One fault per (kind, target) at a time keeps clearing simple and unambiguous.
        if !out
            .iter()
            .any(|f: &Fault| f.kind == fault.kind && f.target == fault.target)
        {
            out.push(fault);
        }
    }
    out.sort_by(|a, b| a.at.cmp(&b.at).then(a.kind.cmp(&b.kind)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets {
            control_planes: vec!["cp-1".into(), "cp-2".into(), "cp-3".into()],
            workers: vec!["w-1".into(), "w-2".into()],
            pdbs: vec!["default/web".into()],
            volumes: vec!["pvc-1".into()],
            versions: [("w-1".to_string(), "v1.12.6".to_string())].into(),
            lease: Some("ichor-system/ichor-rollout-home".into()),
            legacy_upgrade: true,
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let h = Duration::from_secs(3600);
        let a = draw(7, &FaultKind::ALL, &targets(), h);
        assert_eq!(a, draw(7, &FaultKind::ALL, &targets(), h));
        let differs = (8..40).any(|s| draw(s, &FaultKind::ALL, &targets(), h) != a);
        assert!(differs);
        assert!(!a.is_empty() && a.len() as u64 <= MAX_FAULTS);
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(a.iter().all(|f| f.at < h));
    }

    #[test]
    fn the_alphabet_bounds_what_is_drawn_and_faults_without_a_target_are_left_out() {
        let only = [FaultKind::PdbBlocks, FaultKind::EngineKilled];
        for seed in 0..50 {
            for f in draw(seed, &only, &targets(), Duration::from_secs(600)) {
                assert!(only.contains(&f.kind), "{f}");
            }
        }
        let none = Targets {
            pdbs: vec![],
            ..targets()
        };
        assert!((0..50)
            .all(|s| draw(s, &[FaultKind::PdbBlocks], &none, Duration::from_secs(600)).is_empty()));
    }

    #[test]
    fn a_fault_list_names_known_faults_only() {
        assert_eq!(
            FaultKind::parse_list("pdbBlocks, engineKilled,pdbBlocks"),
            Ok(vec![FaultKind::PdbBlocks, FaultKind::EngineKilled])
        );
        let e = FaultKind::parse_list("pdbBlocks,meteor").unwrap_err();
        assert!(e.contains("meteor") && e.contains("engineKilled"), "{e}");
        assert!(FaultKind::parse_list(" , ").is_err());
    }

    #[test]
    fn a_document_carries_every_active_fault_of_its_kind_and_clears_with_none() {
        let f = |t: &str| Fault {
            at: Duration::ZERO,
            kind: FaultKind::PdbBlocks,
            target: Some(t.into()),
            lasts: None,
            burst: None,
            with: None,
        };
        let (a, b) = (f("default/a"), f("default/b"));
        assert_eq!(
            Fault::document(FaultKind::PdbBlocks, &[&a, &b]),
            Some(json!({"pdbsNeverAllow": ["default/a", "default/b"]}))
        );
        assert_eq!(
            Fault::document(FaultKind::PdbBlocks, &[]),
            Some(json!({"pdbsNeverAllow": []}))
        );
        assert_eq!(Fault::document(FaultKind::EngineKilled, &[]), None);
    }
}
