//! The safety rules, judged from the twin's own state (never from what the engine believes)
//! after every tick of the simulated clock: the rehearsal and the rollout tests share them.
//!
//! A rule broken by an injected fault is not ichor's doing: a kubelet that goes silent, or
//! an operator's cordon, makes a node unavailable without ichor. Which side broke a rule is
//! decided by who made the last node of the group unavailable: when that node is one a
//! fault explains, the moment is the operator's (reported, not a violation); when it is a
//! node ichor disrupted, ichor went past the rule and it is a violation.
//!
//! Nodes are named by their machines' hostnames throughout (what Talos and etcd call them);
//! the Kubernetes side's Node names are mapped back.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::policy::Policies;
use crate::releaseset::Version;
use crate::sim::talos::{Component, NodeObservation, Role};
use crate::sim::twin::Twin;

/// One rule broken at one instant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Violation {
    /// The rule's name (`maxUnavailable`, `controlPlanesDown`, `etcdQuorum`, `volumeHolders`,
    /// `kubeletSkew`, `supportedPair`, `forcedDeletion`, `operatorCordon`).
    pub rule: &'static str,
    /// What broke it, by name.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

/// The shipped compatibility data, parsed once per process: the checker runs every tick.
fn shipped_policies() -> Option<&'static Policies> {
    static POLICIES: std::sync::OnceLock<Option<Policies>> = std::sync::OnceLock::new();
    POLICIES.get_or_init(|| Policies::shipped().ok()).as_ref()
}

/// Where an operator's cordon stands ([`Judge::operator_cordon`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cordon {
    Setting,
    Standing,
    Lifting,
    Gone,
}

/// Who made a node unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum By {
    Ichor,
    Fault,
}

/// The checker for one run: it remembers since when each node is unavailable, so each
/// broken rule can be told apart as ichor's or a fault's.
#[derive(Debug)]
pub struct Judge {
    max_unavailable: usize,
    policies: Option<&'static Policies>,
    /// Nodes a fault makes unavailable right now (a silent kubelet, an operator's cordon).
    fault_out: BTreeSet<String>,
    /// Nodes an operator is cordoning, has cordoned or is uncordoning: not ichor's
    /// disruption.
    operator_cordons: BTreeSet<String>,
    /// Of those, the cordons in place: ichor must never lift them.
    standing_cordons: BTreeSet<String>,
    /// Control planes whose etcd member a fault cut off.
    etcd_cut_off: BTreeSet<String>,
    /// Since which tick each unavailable node is so.
    out_since: BTreeMap<String, u64>,
    tick: u64,
    /// Breaks of a rule a fault explains, for the log.
    pub attributed: Vec<String>,
}

impl Judge {
    pub fn new(max_unavailable: usize) -> Judge {
        Judge {
            max_unavailable,
            policies: shipped_policies(),
            fault_out: BTreeSet::new(),
            operator_cordons: BTreeSet::new(),
            standing_cordons: BTreeSet::new(),
            etcd_cut_off: BTreeSet::new(),
            out_since: BTreeMap::new(),
            tick: 0,
            attributed: Vec::new(),
        }
    }

    /// What the injected faults do right now: nodes they make unavailable (a silent
    /// kubelet), and control planes whose etcd member they cut off.
    pub fn set_faults(&mut self, fault_out: BTreeSet<String>, etcd_cut_off: BTreeSet<String>) {
        self.fault_out = fault_out;
        self.etcd_cut_off = etcd_cut_off;
    }

    /// An operator's cordon on `node`, as it moves: `Setting` before the request (its
    /// cordon is then not ichor's disruption), `Standing` once it is in place (ichor must
    /// keep it), `Lifting` before the operator's own uncordon, `Gone` after it.
    pub fn operator_cordon(&mut self, node: &str, state: Cordon) {
        let node = node.to_string();
        match state {
            Cordon::Setting => {
                self.operator_cordons.insert(node);
            }
            Cordon::Standing => {
                self.operator_cordons.insert(node.clone());
                self.standing_cordons.insert(node);
            }
            Cordon::Lifting => {
                self.standing_cordons.remove(&node);
            }
            Cordon::Gone => {
                self.standing_cordons.remove(&node);
                self.operator_cordons.remove(&node);
            }
        }
    }

    /// Every rule, against the twin as it is now.
    pub fn judge(&mut self, twin: &Twin) -> Vec<Violation> {
        self.tick += 1;
        let obs = twin.talos.observe();
        let (cordoned, not_ready, replicas) = twin.kube.with(|c, _| {
            let nodes = c.list("nodes", None);
            let named = |pred: &dyn Fn(&serde_json::Value) -> bool| -> BTreeSet<String> {
                nodes
                    .iter()
                    .filter(|n| pred(n))
                    .filter_map(|n| n.pointer("/metadata/name").and_then(|v| v.as_str()))
                    .map(str::to_string)
                    .collect()
            };
            let cordoned = named(&|n| {
                n.pointer("/spec/unschedulable")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false)
            });
            // The Node's Ready condition: a kubelet gone silent leaves its machine up.
            let not_ready = named(&|n| {
                !n.pointer("/status/conditions")
                    .and_then(|c| c.as_array())
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let replicas: Vec<(String, String)> = c
                .list("replicas", None)
                .iter()
                .filter_map(|r| {
                    Some((
                        r.pointer("/spec/volumeName")?.as_str()?.to_string(),
                        r.pointer("/spec/nodeID")?.as_str()?.to_string(),
                    ))
                })
                .collect();
            (cordoned, not_ready, replicas)
        });
        // The Kubernetes side names Nodes, which may differ from the machines' hostnames
        // (`registerWithFQDN`): every rule speaks of hostnames.
        let hostname_of: BTreeMap<String, String> = obs
            .iter()
            .map(|o| (twin.node_name(&o.name), o.name.clone()))
            .collect();
        let to_hostnames = |names: BTreeSet<String>| -> BTreeSet<String> {
            names
                .into_iter()
                .map(|n| hostname_of.get(&n).cloned().unwrap_or(n))
                .collect()
        };
        let (cordoned, not_ready) = (to_hostnames(cordoned), to_hostnames(not_ready));
        let replicas: Vec<(String, String)> = replicas
            .into_iter()
            .map(|(v, n)| {
                let host = hostname_of.get(&n).cloned().unwrap_or(n);
                (v, host)
            })
            .collect();
        let down = |o: &NodeObservation| !(o.up && o.ready) || not_ready.contains(&o.name);
        // Unavailable now, and since when. A node only an operator cordoned still runs its
        // workloads: it is not disrupted, and ichor leaves it alone.
        let out_now: BTreeSet<&str> = obs
            .iter()
            .filter(|o| {
                down(o) || (cordoned.contains(&o.name) && !self.operator_cordons.contains(&o.name))
            })
            .map(|o| o.name.as_str())
            .collect();
        self.out_since.retain(|n, _| out_now.contains(n.as_str()));
        for n in &out_now {
            self.out_since.entry((*n).to_string()).or_insert(self.tick);
        }
        let mut out = Vec::new();

        // A group over its limit: a violation when ichor made its newest member unavailable.
        let mut over = |rule: &'static str, members: Vec<&str>, limit: usize, what: String| {
            if members.len() <= limit {
                return;
            }
            let newest = members
                .iter()
                .map(|n| self.out_since.get(*n).copied().unwrap_or(self.tick))
                .max()
                .unwrap_or(self.tick);
            let by = if members.iter().any(|n| {
                self.out_since.get(*n).copied().unwrap_or(self.tick) == newest
                    && !self.fault_out.contains(*n)
                    && !self.etcd_cut_off.contains(*n)
            }) {
                By::Ichor
            } else {
                By::Fault
            };
            let detail = format!("{what}: {members:?}");
            match by {
                By::Ichor => out.push(Violation { rule, detail }),
                By::Fault => self
                    .attributed
                    .push(format!("{rule} (by a fault) {detail}")),
            }
        };

        let cps_down: Vec<&str> = obs
            .iter()
            .filter(|o| o.role == Role::ControlPlane && down(o))
            .map(|o| o.name.as_str())
            .collect();
        over(
            "controlPlanesDown",
            cps_down,
            1,
            "two control planes down".into(),
        );
        let workers_out: Vec<&str> = obs
            .iter()
            .filter(|o| o.role == Role::Worker && out_now.contains(o.name.as_str()))
            .map(|o| o.name.as_str())
            .collect();
        let max = self.max_unavailable;
        over(
            "maxUnavailable",
            workers_out,
            max,
            format!("more than {max} workers unavailable"),
        );
        // A single member has no quorum to keep while its node reboots.
        let cps = obs.iter().filter(|o| o.role == Role::ControlPlane).count();
        if cps > 1 && !twin.talos.with_model(|m| m.etcd_has_quorum()) {
            let members: Vec<&str> = obs
                .iter()
                .filter(|o| o.role == Role::ControlPlane)
                .filter(|o| down(o) || self.etcd_cut_off.contains(&o.name))
                .map(|o| o.name.as_str())
                .collect();
            over("etcdQuorum", members, 0, "etcd lost quorum".into());
        }
        // Never two holders of one volume down together.
        let down_nodes: BTreeSet<&str> = obs
            .iter()
            .filter(|o| down(o))
            .map(|o| o.name.as_str())
            .collect();
        let mut holders_down: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (v, n) in &replicas {
            if down_nodes.contains(n.as_str()) {
                holders_down.entry(v).or_default().insert(n);
            }
        }
        for (v, nodes) in holders_down {
            over(
                "volumeHolders",
                nodes.into_iter().collect(),
                1,
                format!("two holders of volume {v} down"),
            );
        }

        // Never a kubelet newer than any apiserver; every (Talos, Kubernetes) pair supported.
        let version = |s: &str| Version::parse(s.rsplit(':').next().unwrap_or(s)).ok();
        let apiservers: Vec<Version> = obs
            .iter()
            .flat_map(|o| o.static_pods.iter())
            .filter(|p| p.component == Component::ApiServer)
            .filter_map(|p| version(&p.image))
            .collect();
        for o in &obs {
            let Some(kubelet) = version(&o.kubelet_version) else {
                continue;
            };
            if let Some(oldest) = apiservers.iter().min() {
                if kubelet > *oldest {
                    out.push(Violation {
                        rule: "kubeletSkew",
                        detail: format!(
                            "kubelet {kubelet} on {} is newer than apiserver {oldest}",
                            o.name
                        ),
                    });
                }
            }
            if let (Some(p), Some(t)) = (self.policies, version(&o.talos_version)) {
                for k in apiservers.iter().chain(std::iter::once(&kubelet)) {
                    if p.supports("talos", &t, k) == Some(false) {
                        out.push(Violation {
                            rule: "supportedPair",
                            detail: format!("{} runs Talos {t} with Kubernetes {k}", o.name),
                        });
                    }
                }
            }
        }
        // No pod deleted except through an eviction: nothing forced.
        let deletes = twin
            .kube
            .audit()
            .counts()
            .get(&("delete".to_string(), "pods".to_string()))
            .copied()
            .unwrap_or(0);
        if deletes > 0 {
            out.push(Violation {
                rule: "forcedDeletion",
                detail: format!("{deletes} pod(s) deleted directly, not evicted"),
            });
        }
        // An operator's cordon stays until the operator lifts it.
        for n in &self.standing_cordons {
            if !cordoned.contains(n) {
                out.push(Violation {
                    rule: "operatorCordon",
                    detail: format!("{n}'s cordon, set by an operator, was removed"),
                });
            }
        }
        out.sort();
        out.dedup();
        out
    }
}
