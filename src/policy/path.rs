//! The path of a chained upgrade: from the versions a cluster runs to a release set that
//! moves Talos or Kubernetes more than one minor, the hops in between, each one supported
//! at every moment, mixed states included. Pure functions over the compatibility data.
//!
//! A state is what the control planes run (Talos, Kubernetes components and kubelets) and
//! what the workers run (Talos, kubelet). A hop moves one side:
//!
//! - control planes' Talos one minor (the control planes, one at a time);
//! - control planes' Kubernetes one minor (every apiserver, then controller-manager and
//!   scheduler, kube-proxy and manifests, then the control planes' kubelets: today's
//!   Kubernetes stages without the workers);
//! - the workers: their Talos by at most `talosMinorsPerReboot` minors and/or their kubelet
//!   by any number of minors, one drain per worker (today's one-drain worker stage).
//!
//! Control planes walk every minor; workers move only when a rule forces them or at the
//! end, so the search minimises hops, which is the number of worker drains plus the fixed
//! control-plane walk. The rules, each upstream:
//!
//! - every node's (Talos, kubelet) pair and every control plane's (Talos, components) pair
//!   lies in that Talos minor's Kubernetes range (policies `talos`: siderolabs/talos
//!   pkg/machinery/compatibility/talosNNN); Talos 1.15 refuses a machine config below its
//!   range, which the range says too;
//! - Talos's installer upgrades a host only from its `upgradeFrom` (talos_version.go
//!   `UpgradeableFrom`), judged on the host's major.minor.patch;
//! - kube-apiserver moves one minor at a time; before it moves to N every kubelet is at
//!   N - `kubeletMaxOlderBeforeUpgrade` or later; no kubelet is newer than an apiserver and
//!   none lags the oldest by more than `kubeletMaxOlder` (kubernetes/website
//!   content/en/releases/version-skew-policy.md);
//! - a worker switches its kubelet before it reboots into its new Talos (src/rollout's
//!   one-drain worker step), so it runs its old Talos with its new kubelet for a moment;
//! - control planes move Talos before workers do (ichor's order, docs/rollout.md).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use serde::Serialize;

use crate::releaseset::{MinorVersion, Version, Via};

use super::data::{Confidence, KubeRange, Policies};

/// What the path search knows about one Talos minor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TalosFacts {
    pub kubernetes: KubeRange,
    pub upgrade_from: Option<Version>,
    pub confidence: Confidence,
    pub source: String,
}

/// Everything the search decides with: the compatibility data narrowed to what a path
/// needs, the patches each minor lands on, and the cluster's opt-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub talos: BTreeMap<MinorVersion, TalosFacts>,
    pub kubelet_max_older_before_upgrade: u64,
    pub kubelet_max_older: u64,
    /// `spec.rollout.talosMinorsPerReboot`: Talos minors one worker reboot may move.
    pub talos_minors_per_reboot: u64,
    /// The version each intermediate minor lands on: `spec.via`, else the newest known patch.
    pub talos_patches: BTreeMap<MinorVersion, Landing>,
    pub kubernetes_patches: BTreeMap<MinorVersion, Landing>,
}

/// The version a chain lands on in one minor, and why that one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Landing {
    pub version: Version,
    pub source: String,
}

impl Rules {
    pub fn new(policies: &Policies, via: &Via, talos_minors_per_reboot: u64) -> Rules {
        let talos = policies
            .talos
            .iter()
            .map(|r| {
                (
                    r.version,
                    TalosFacts {
                        kubernetes: r.kubernetes,
                        upgrade_from: r.upgrade_from.clone(),
                        confidence: r.confidence,
                        source: r.source.clone(),
                    },
                )
            })
            .collect();
        let patches = |component: &str, pins: &[Version]| {
            let mut out: BTreeMap<MinorVersion, Landing> = policies
                .latest_patches
                .iter()
                .filter(|r| r.component == component)
                .map(|r| {
                    (
                        r.version,
                        Landing {
                            // Spelled as image tags and release sets spell them (`v1.13.10`).
                            version: Version::parse(&r.latest.tag())
                                .unwrap_or_else(|_| r.latest.clone()),
                            source: format!("newest known patch: {}", r.source),
                        },
                    )
                })
                .collect();
            for v in pins {
                out.insert(
                    v.minor_version(),
                    Landing {
                        version: v.clone(),
                        source: "pinned in the release set's spec.via".into(),
                    },
                );
            }
            out
        };
        Rules {
            talos,
            kubelet_max_older_before_upgrade: policies.skew.kubelet_max_older_before_upgrade,
            kubelet_max_older: policies.skew.kubelet_max_older,
            talos_minors_per_reboot: talos_minors_per_reboot.max(1),
            talos_patches: patches("talos", &via.talos),
            kubernetes_patches: patches("kubernetes", &via.kubernetes),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControlPlanes {
    pub talos: Version,
    pub kubernetes: Version,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workers {
    pub talos: Version,
    pub kubelet: Version,
}

/// One version moving, `from` → `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shift {
    pub from: Version,
    pub to: Version,
}

/// What one hop changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "on", rename_all = "camelCase")]
pub enum Move {
    /// Talos on the control planes, one at a time.
    #[serde(rename_all = "camelCase")]
    ControlPlanes {
        #[serde(skip_serializing_if = "Option::is_none")]
        talos: Option<Shift>,
        #[serde(skip_serializing_if = "Option::is_none")]
        kubernetes: Option<Shift>,
    },
    /// Each worker once: its kubelet and/or its Talos in one drain.
    #[serde(rename_all = "camelCase")]
    Workers {
        #[serde(skip_serializing_if = "Option::is_none")]
        talos: Option<Shift>,
        #[serde(skip_serializing_if = "Option::is_none")]
        kubelet: Option<Shift>,
        /// Both move: which goes first inside the drain, so the pair the worker runs in
        /// between is supported.
        #[serde(skip_serializing_if = "Option::is_none")]
        first: Option<First>,
    },
}

/// Inside one worker's drain, which of its two moves goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum First {
    /// The kubelet switches (NO_REBOOT), then Talos upgrades and reboots: the worker runs
    /// its old Talos with the new kubelet in between (today's one-drain worker step).
    Kubelet,
    /// Talos upgrades and reboots with the old kubelet, then the kubelet switches: for a
    /// worker whose old Talos cannot run the new kubelet.
    Talos,
}

impl Move {
    pub fn on_workers(&self) -> bool {
        matches!(self, Move::Workers { .. })
    }
}

impl fmt::Display for Move {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, on, second) = match self {
            Move::ControlPlanes { talos, kubernetes } => {
                (talos, kubernetes, "control planes", "Kubernetes")
            }
            Move::Workers { talos, kubelet, .. } => (talos, kubelet, "workers", "kubelet"),
        };
        let parts: Vec<String> = [("Talos", a), (second, b)]
            .into_iter()
            .filter_map(|(what, s)| s.as_ref().map(|s| format!("{what} {} → {}", s.from, s.to)))
            .collect();
        write!(f, "{} on {on}", parts.join(" and "))
    }
}

/// One state of the chain; `moves` says what the hop into it changed (`None` for the state
/// the cluster runs now).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub control_planes: ControlPlanes,
    pub workers: Workers,
    pub moves: Option<Move>,
}

/// The states in order, from the one the cluster runs to the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Path {
    pub states: Vec<State>,
    /// Intermediate versions whose data is less than upstream's word (the landing patches'
    /// and the Talos rows' sources), for the reader.
    #[serde(skip)]
    pub landings: Vec<(String, Landing)>,
    /// Whether a Talos row the path relies on is unconfirmed.
    #[serde(skip)]
    pub unconfirmed: bool,
}

impl Path {
    pub fn hops(&self) -> usize {
        self.states.len().saturating_sub(1)
    }

    /// How many times each worker is drained.
    pub fn worker_drains(&self) -> usize {
        self.states
            .iter()
            .filter(|s| s.moves.as_ref().is_some_and(Move::on_workers))
            .count()
    }

    /// Every Kubernetes minor an apiserver runs along the way, in order.
    pub fn kubernetes_minors(&self) -> Vec<MinorVersion> {
        let mut out: Vec<MinorVersion> = Vec::new();
        for s in &self.states {
            let m = s.control_planes.kubernetes.minor_version();
            if out.last() != Some(&m) {
                out.push(m);
            }
        }
        out
    }

    /// The Kubernetes versions an apiserver runs along the way, in order.
    pub fn kubernetes_versions(&self) -> Vec<Version> {
        let mut out: Vec<Version> = Vec::new();
        for s in &self.states {
            let v = &s.control_planes.kubernetes;
            if out.last() != Some(v) {
                out.push(v.clone());
            }
        }
        out
    }
}

/// Why no path exists: the hop that cannot be taken and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoPath {
    /// "Talos 1.14 → 1.15 on control planes".
    pub hop: String,
    pub why: String,
    /// What would open the path, when one thing would.
    pub hint: Option<String>,
    pub source: Option<String>,
}

impl fmt::Display for NoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.hop, self.why)
    }
}

/// The minors of one state, the search's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    cp_talos: u64,
    cp_k8s: u64,
    w_talos: u64,
    w_kubelet: u64,
}

/// The start and the target, as versions; the searched minors come from them.
struct Ends<'a> {
    start: &'a State,
    target: &'a ControlPlanes,
    talos_major: u64,
    k8s_major: u64,
}

/// Why a hop is refused, and what would open it.
struct Refusal {
    why: String,
    hint: Option<String>,
    source: Option<String>,
}

impl Refusal {
    fn new(why: String, source: Option<String>) -> Refusal {
        Refusal {
            why,
            hint: None,
            source,
        }
    }
}

struct Search<'a> {
    rules: &'a Rules,
    ends: Ends<'a>,
}

impl Search<'_> {
    /// The version a side runs at `minor`: where it starts, the target, else the landing
    /// patch (`spec.via`, else the newest known).
    fn version(&self, talos: bool, minor: u64, workers: bool) -> Result<Version, Refusal> {
        let e = &self.ends;
        let (what, major, start, target, landings, pin) = if talos {
            let start = if workers {
                &e.start.workers.talos
            } else {
                &e.start.control_planes.talos
            };
            (
                "Talos",
                e.talos_major,
                start,
                &e.target.talos,
                &self.rules.talos_patches,
                "talos",
            )
        } else {
            let start = if workers {
                &e.start.workers.kubelet
            } else {
                &e.start.control_planes.kubernetes
            };
            (
                "Kubernetes",
                e.k8s_major,
                start,
                &e.target.kubernetes,
                &self.rules.kubernetes_patches,
                "kubernetes",
            )
        };
        let m = MinorVersion::new(major, minor);
        if start.minor_version() == m {
            return Ok(start.clone());
        }
        if target.minor_version() == m {
            return Ok(target.clone());
        }
        match landings.get(&m) {
            Some(l) => Ok(l.version.clone()),
            None => Err(Refusal {
                why: format!("no known patch of {what} {m} to land on"),
                hint: Some(format!(
                    "pin a {what} {m} patch in release-set.yaml `spec.via.{pin}`, or add a `latestPatches` row for {pin} \"{m}\" under policies/"
                )),
                source: None,
            }),
        }
    }

    fn talos_version(&self, minor: u64, workers: bool) -> Result<Version, Refusal> {
        self.version(true, minor, workers)
    }

    fn kubernetes_version(&self, minor: u64, workers: bool) -> Result<Version, Refusal> {
        self.version(false, minor, workers)
    }

    fn facts(&self, minor: u64) -> Result<&TalosFacts, Refusal> {
        let m = MinorVersion::new(self.ends.talos_major, minor);
        self.rules.talos.get(&m).ok_or(Refusal {
            why: format!("no compatibility data for Talos {m}"),
            hint: Some(format!(
                "add a `talos:` row for \"{m}\" under policies/ in the repository"
            )),
            source: None,
        })
    }

    /// Talos `t` runs Kubernetes `k` (a node's (Talos, kubelet) pair, or a control plane's
    /// (Talos, components) pair).
    fn pair(&self, t: u64, k: u64, who: &str) -> Result<(), Refusal> {
        let f = self.facts(t)?;
        let km = MinorVersion::new(self.ends.k8s_major, k);
        if f.kubernetes.contains(km) {
            return Ok(());
        }
        let tm = MinorVersion::new(self.ends.talos_major, t);
        Err(Refusal {
            why: format!(
                "{who} would run Talos {tm} with Kubernetes {km}, and Talos {tm} supports Kubernetes {} only",
                f.kubernetes
            ),
            hint: None,
            source: Some(f.source.clone()),
        })
    }

    /// Talos `to`'s installer accepts a host at `host`.
    fn upgradable(&self, host: &Version, to: u64) -> Result<(), Refusal> {
        let f = self.facts(to)?;
        match &f.upgrade_from {
            Some(min) if release(host) < release(min) => Err(Refusal {
                why: format!(
                    "the Talos {} installer upgrades only hosts at {min} or later, and the nodes run {host}",
                    MinorVersion::new(self.ends.talos_major, to)
                ),
                hint: None,
                source: Some(f.source.clone()),
            }),
            _ => Ok(()),
        }
    }

    /// The hops out of `k`, each with the state it leads to or why it is refused; control
    /// planes first, then the workers' biggest moves, so ties keep workers late.
    fn moves(&self, k: Key, goal: Key) -> Vec<(String, Result<Key, Refusal>)> {
        let mut out = Vec::new();
        let tm = |m: u64| MinorVersion::new(self.ends.talos_major, m);
        let km = |m: u64| MinorVersion::new(self.ends.k8s_major, m);
        if k.cp_talos < goal.cp_talos {
            let to = k.cp_talos + 1;
            let hop = format!("Talos {} → {} on control planes", tm(k.cp_talos), tm(to));
            let r = self
                .talos_version(k.cp_talos, false)
                .and_then(|host| {
                    self.talos_version(to, false)?;
                    self.upgradable(&host, to)?;
                    self.pair(to, k.cp_k8s, "a control plane")
                })
                .map(|()| Key { cp_talos: to, ..k });
            out.push((hop, r));
        }
        if k.cp_k8s < goal.cp_k8s {
            let to = k.cp_k8s + 1;
            let hop = format!("Kubernetes {} → {} on control planes", km(k.cp_k8s), km(to));
            let r = self
                .kubernetes_version(to, false)
                .and_then(|_| {
                    self.pair(k.cp_talos, to, "a control plane")?;
                    let lag = self
                        .rules
                        .kubelet_max_older_before_upgrade
                        .min(self.rules.kubelet_max_older);
                    let floor = to.saturating_sub(lag);
                    if k.w_kubelet < floor {
                        return Err(Refusal::new(
                            format!(
                                "the workers' kubelets run {} and an apiserver moves to {} only while every kubelet is at {} or later",
                                km(k.w_kubelet),
                                km(to),
                                km(floor)
                            ),
                            None,
                        ));
                    }
                    Ok(())
                })
                .map(|()| Key { cp_k8s: to, ..k });
            out.push((hop, r));
        }
        let top_talos = (k.w_talos + self.rules.talos_minors_per_reboot)
            .min(k.cp_talos)
            .min(goal.w_talos);
        let top_kubelet = k.cp_k8s.min(goal.w_kubelet);
        for t in (k.w_talos..=top_talos).rev() {
            for l in (k.w_kubelet..=top_kubelet).rev() {
                if (t, l) == (k.w_talos, k.w_kubelet) {
                    continue;
                }
                let mut parts = Vec::new();
                if t != k.w_talos {
                    parts.push(format!("Talos {} → {}", tm(k.w_talos), tm(t)));
                }
                if l != k.w_kubelet {
                    parts.push(format!("kubelet {} → {}", km(k.w_kubelet), km(l)));
                }
                let hop = format!("{} on workers", parts.join(" and "));
                let r = (|| {
                    self.talos_version(t, true)?;
                    self.kubernetes_version(l, true)?;
                    if t != k.w_talos {
                        let host = self.talos_version(k.w_talos, true)?;
                        self.upgradable(&host, t)?;
                    }
                    self.pair(t, l, "a worker")?;
                    // In between, the worker runs old Talos with the new kubelet (kubelet
                    // first) or new Talos with the old kubelet (Talos first).
                    if t != k.w_talos && l != k.w_kubelet {
                        self.pair(k.w_talos, l, "a worker")
                            .or_else(|e| self.pair(t, k.w_kubelet, "a worker").map_err(|_| e))?;
                    }
                    if k.cp_k8s.saturating_sub(l) > self.rules.kubelet_max_older {
                        return Err(Refusal::new(
                            format!(
                                "the kubelet {} would lag the apiservers' {} by more than {} minors",
                                km(l),
                                km(k.cp_k8s),
                                self.rules.kubelet_max_older
                            ),
                            None,
                        ));
                    }
                    Ok(Key {
                        w_talos: t,
                        w_kubelet: l,
                        ..k
                    })
                })();
                out.push((hop, r));
            }
        }
        out
    }

    fn state(&self, k: Key, moves: Option<Move>) -> Result<State, Refusal> {
        Ok(State {
            control_planes: ControlPlanes {
                talos: self.talos_version(k.cp_talos, false)?,
                kubernetes: self.kubernetes_version(k.cp_k8s, false)?,
            },
            workers: Workers {
                talos: self.talos_version(k.w_talos, true)?,
                kubelet: self.kubernetes_version(k.w_kubelet, true)?,
            },
            moves,
        })
    }
}

fn release(v: &Version) -> (u64, u64, u64) {
    (v.major(), v.minor(), v.patch())
}

/// Versions further apart than this many minors are not searched: more than any chain
/// Talos or Kubernetes publishes, and a bound on the work a pull request can ask for.
pub const MAX_CHAIN_MINORS: u64 = 12;

/// The shortest path from `start` to `target` under `rules`: control planes walk every
/// minor, workers are drained as few times as the rules allow. `start` may be mixed (the
/// workers behind the control planes); the target is uniform.
pub fn find(start: &State, target: &ControlPlanes, rules: &Rules) -> Result<Path, NoPath> {
    let s = &start.control_planes;
    let w = &start.workers;
    let talos_major = target.talos.major();
    let k8s_major = target.kubernetes.major();
    let no = |hop: String, why: String| NoPath {
        hop,
        why,
        hint: None,
        source: None,
    };
    for (what, from, to) in [
        ("Talos", &s.talos, &target.talos),
        ("Talos", &w.talos, &target.talos),
        ("Kubernetes", &s.kubernetes, &target.kubernetes),
        ("Kubernetes", &w.kubelet, &target.kubernetes),
    ] {
        if from.major() != to.major() {
            return Err(no(
                format!("{what} {from} → {to}"),
                "changes the major version; ichor walks minors only".into(),
            ));
        }
        if to.minor() < from.minor() {
            return Err(no(
                format!("{what} {from} → {to}"),
                "moves backwards; ichor only rolls forward".into(),
            ));
        }
        if to.minor() - from.minor() > MAX_CHAIN_MINORS {
            return Err(no(
                format!("{what} {from} → {to}"),
                format!("moves more than {MAX_CHAIN_MINORS} minors"),
            ));
        }
    }
    let ends = Ends {
        start,
        target,
        talos_major,
        k8s_major,
    };
    let search = Search { rules, ends };
    let from = Key {
        cp_talos: s.talos.minor(),
        cp_k8s: s.kubernetes.minor(),
        w_talos: w.talos.minor(),
        w_kubelet: w.kubelet.minor(),
    };
    let goal = Key {
        cp_talos: target.talos.minor(),
        cp_k8s: target.kubernetes.minor(),
        w_talos: target.talos.minor(),
        w_kubelet: target.kubernetes.minor(),
    };
    // Breadth first: every hop costs one, so the first time the goal is reached is the
    // shortest; the order of `moves` breaks ties.
    let mut parent: HashMap<Key, (Key, String)> = HashMap::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = vec![from];
    let mut refusals: Vec<(Key, String, Refusal)> = Vec::new();
    while let Some(k) = queue.pop_front() {
        if k == goal {
            break;
        }
        for (hop, r) in search.moves(k, goal) {
            match r {
                Ok(next) if !seen.contains(&next) => {
                    seen.push(next);
                    parent.insert(next, (k, hop));
                    queue.push_back(next);
                }
                Ok(_) => {}
                Err(e) => refusals.push((k, hop, e)),
            }
        }
    }
    if !seen.contains(&goal) {
        return Err(explain(&seen, from, goal, refusals));
    }
    let mut keys = vec![goal];
    while let Some((p, _)) = keys.last().and_then(|k| parent.get(k)) {
        keys.push(*p);
    }
    keys.reverse();
    let mut states = Vec::new();
    let mut prev: Option<State> = None;
    for k in keys {
        let mut st = search.state(k, None).map_err(|r| NoPath {
            hop: "a state of the chain".into(),
            why: r.why,
            hint: r.hint,
            source: r.source,
        })?;
        if let Some(p) = &prev {
            st.moves = Some(move_between(p, &st, rules));
        }
        prev = Some(st.clone());
        states.push(st);
    }
    let unconfirmed = states.iter().any(|s| {
        [&s.control_planes.talos, &s.workers.talos].iter().any(|t| {
            rules
                .talos
                .get(&t.minor_version())
                .is_some_and(|f| !f.confidence.is_confirmed())
        })
    });
    let mut landings: Vec<(String, Landing)> = Vec::new();
    for st in &states {
        for (what, v, map) in [
            ("Talos", &st.control_planes.talos, &rules.talos_patches),
            (
                "Kubernetes",
                &st.control_planes.kubernetes,
                &rules.kubernetes_patches,
            ),
        ] {
            if let Some(l) = map.get(&v.minor_version()).filter(|l| &l.version == v) {
                let is_end = v == &target.talos
                    || v == &target.kubernetes
                    || v == &s.talos
                    || v == &s.kubernetes;
                if !is_end && !landings.iter().any(|(_, x)| x == l) {
                    landings.push((what.to_string(), l.clone()));
                }
            }
        }
    }
    Ok(Path {
        states,
        landings,
        unconfirmed,
    })
}

fn move_between(a: &State, b: &State, rules: &Rules) -> Move {
    let kubelet_first_ok = |a: &State, b: &State| {
        rules
            .talos
            .get(&a.workers.talos.minor_version())
            .is_some_and(|f| f.kubernetes.contains(b.workers.kubelet.minor_version()))
    };
    let shift = |x: &Version, y: &Version| {
        (x != y).then(|| Shift {
            from: x.clone(),
            to: y.clone(),
        })
    };
    let w_talos = shift(&a.workers.talos, &b.workers.talos);
    let w_kubelet = shift(&a.workers.kubelet, &b.workers.kubelet);
    if w_talos.is_some() || w_kubelet.is_some() {
        let first = (w_talos.is_some() && w_kubelet.is_some()).then(|| {
            if kubelet_first_ok(a, b) {
                First::Kubelet
            } else {
                First::Talos
            }
        });
        Move::Workers {
            talos: w_talos,
            kubelet: w_kubelet,
            first,
        }
    } else {
        Move::ControlPlanes {
            talos: shift(&a.control_planes.talos, &b.control_planes.talos),
            kubernetes: shift(&a.control_planes.kubernetes, &b.control_planes.kubernetes),
        }
    }
}

/// The impossible hop: from the reachable state furthest along, the control-plane hop the
/// chain needs next (Talos first where both are refused is not assumed: the refusal of
/// the state nearest the goal is named, control planes before workers).
fn explain(seen: &[Key], from: Key, goal: Key, refusals: Vec<(Key, String, Refusal)>) -> NoPath {
    let progress = |k: &Key| {
        (k.cp_talos - from.cp_talos)
            + (k.cp_k8s - from.cp_k8s)
            + (k.w_talos - from.w_talos)
            + (k.w_kubelet - from.w_kubelet)
    };
    // The furthest reachable state that still has a refused hop out of it.
    let best = seen
        .iter()
        .filter(|k| refusals.iter().any(|(r, _, _)| r == *k))
        .max_by_key(|k| {
            (
                progress(k),
                std::cmp::Reverse(seen.iter().position(|s| s == *k)),
            )
        })
        .copied()
        .unwrap_or(from);
    let refused = refusals
        .into_iter()
        .filter(|(k, _, _)| *k == best)
        .min_by_key(|(_, hop, _)| !hop.ends_with("on control planes"));
    match refused {
        Some((_, hop, r)) => NoPath {
            hop,
            why: r.why,
            hint: r.hint,
            source: r.source,
        },
        None => NoPath {
            hop: format!(
                "the chain to Talos 1.{} and Kubernetes 1.{}",
                goal.cp_talos, goal.cp_k8s
            ),
            why: "no hop leads on".into(),
            hint: None,
            source: None,
        },
    }
}

#[cfg(test)]
mod tests;
