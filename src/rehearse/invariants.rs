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
use std::io::{Read, Seek};
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::clock::Timestamp;

use crate::policy::Policies;
use crate::releaseset::Version;
use crate::sim::talos::{Component, NodeObservation, Role};
use crate::sim::twin::Twin;

/// One rule broken at one instant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Violation {
    /// The rule's name (`maxUnavailable`, `controlPlanesDown`, `etcdQuorum`, `volumeHolders`,
    /// `kubeletSkew`, `supportedPair`, `forcedDeletion`, `operatorCordon`, and with the
    /// Talos call log watched: `installsPerBoot`, `fallbackSlot`, `leaseHeld`, `heldNode`,
    /// `quietWhilePaused`).
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

/// Where an operator's mark (a cordon, an `ichor.dev/hold`) stands
/// ([`Judge::operator_cordon`], [`Judge::operator_hold`]).
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
    /// The rules judged from what reached the nodes (the twin's Talos call log).
    calls: Option<CallRules>,
    /// Pods an operator deleted by hand (not ichor's forced deletions).
    operator_deletes: u64,
}

/// The Talos calls that disrupt a node: each must come with the lock held, on a node not
/// held, while the rollout is not paused, and an install at most once per boot.
const DISRUPTIVE: [&str; 3] = [
    "machine.LifecycleService/Upgrade",
    "machine.MachineService/Upgrade",
    "machine.MachineService/Reboot",
];
const INSTALLS: [&str; 2] = [
    "machine.LifecycleService/Upgrade",
    "machine.MachineService/Upgrade",
];

/// The rollout lock as the engine must hold it (the Lease in the twin's API server).
#[derive(Debug, Clone)]
pub struct LeaseRule {
    pub namespace: String,
    pub name: String,
    pub holder: String,
}

/// State of the rules judged from the Talos call log and the boot slots.
#[derive(Debug)]
struct CallRules {
    log: PathBuf,
    /// The log, opened once it exists (the judge reads it every tick).
    file: Option<std::fs::File>,
    /// Bytes of the log read so far (a partial last line is read again next time).
    offset: u64,
    /// Installs that reached each (node, boot id).
    installs: BTreeMap<(String, String), u32>,
    /// The Talos target: a node's fallback slot keeps its pre-rollout version until the
    /// node runs it.
    target_talos: Option<String>,
    /// Each node's Talos version when the judge first looked.
    before: BTreeMap<String, String>,
    lease: Option<LeaseRule>,
    /// Who held the Lease from when (`acquireTime`), oldest first, as seen tick by tick.
    holders: Vec<(Timestamp, String)>,
    /// Renewals of the engine's own holding seen (`renewTime`), and the lease duration.
    renewals: Vec<Timestamp>,
    lease_duration: Duration,
    /// Paused stretches: `[from, until)`, the last one open while paused.
    paused: Vec<(Timestamp, Option<Timestamp>)>,
    /// Nodes an operator holds (`ichor.dev/hold`), since when it stands.
    holds: BTreeMap<String, Timestamp>,
    /// Calls an operator made by hand: (node, from, until), not ichor's.
    by_hand: Vec<(String, Timestamp, Timestamp)>,
}

/// Until `node` runs `target`, one of its boot slots must still hold `before`, the version
/// it ran before the rollout: what it falls back to.
fn fallback_lost(
    node: &str,
    running: &str,
    before: &str,
    target: &str,
    slots: &[Option<String>],
) -> Option<Violation> {
    let bare = |v: &str| v.trim_start_matches('v').to_string();
    let at_target = bare(running) == bare(target);
    let kept = slots.iter().flatten().any(|s| bare(s) == bare(before));
    (!at_target && !kept).then(|| Violation {
        rule: "fallbackSlot",
        detail: format!(
            "{node} runs {running} and no boot slot holds {before}, its version before the rollout: {slots:?}"
        ),
    })
}

/// One line of the twin's Talos call log (`talos-audit.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TalosCall {
    pub at: Timestamp,
    pub node: String,
    pub method: String,
    pub boot_id: String,
    /// The gRPC code it was answered with (0: OK).
    pub code: i64,
}

impl TalosCall {
    fn parse(line: &str) -> Option<TalosCall> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        Some(TalosCall {
            at: Timestamp::parse_rfc3339(v.get("at")?.as_str()?)?,
            node: v.get("node")?.as_str()?.to_string(),
            method: v.get("method")?.as_str()?.to_string(),
            boot_id: v.get("bootId")?.as_str()?.to_string(),
            code: v.get("code")?.as_i64()?,
        })
    }
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
            calls: None,
            operator_deletes: 0,
        }
    }

    /// An operator is about to delete a pod by hand: not a deletion of ichor's.
    pub fn operator_deleted_pod(&mut self) {
        self.operator_deletes += 1;
    }

    /// Also judge what reached the nodes, read from the twin's Talos call log at `log`:
    /// at most one install per node per boot; a node's fallback slot keeps the version it
    /// ran before until it runs `target_talos`; with `lease`, no disruptive call without the
    /// lock; no disruptive call on a held node or while paused.
    pub fn watch_calls(
        mut self,
        log: PathBuf,
        target_talos: Option<String>,
        lease: Option<LeaseRule>,
    ) -> Judge {
        self.calls = Some(CallRules {
            log,
            file: None,
            offset: 0,
            installs: BTreeMap::new(),
            target_talos,
            before: BTreeMap::new(),
            lease,
            holders: Vec::new(),
            renewals: Vec::new(),
            lease_duration: Duration::ZERO,
            paused: Vec::new(),
            holds: BTreeMap::new(),
            by_hand: Vec::new(),
        });
        self
    }

    /// The Talos calls reaching `node` from `from` to `until` are an operator's, by hand
    /// (`talosctl upgrade` after an A/B fallback): not judged as ichor's.
    pub fn operator_calls(&mut self, node: &str, from: Timestamp, until: Timestamp) {
        if let Some(c) = &mut self.calls {
            c.by_hand.push((node.to_string(), from, until));
        }
    }

    /// The rollout paused (`true`, at `now`) or was resumed (`false`): between the two no
    /// disruptive call may reach a node.
    pub fn paused(&mut self, on: bool, now: Timestamp) {
        let Some(c) = &mut self.calls else { return };
        let open = matches!(c.paused.last(), Some((_, None)));
        if on && !open {
            c.paused.push((now, None));
        } else if !on && open {
            if let Some((_, until)) = c.paused.last_mut() {
                *until = Some(now);
            }
        }
    }

    /// An operator's `ichor.dev/hold` on `node`, as it moves (see [`Cordon`]): once it
    /// stands, no disruptive call may reach the node until it is lifted.
    pub fn operator_hold(&mut self, node: &str, state: Cordon, now: Timestamp) {
        let Some(c) = &mut self.calls else { return };
        match state {
            Cordon::Standing => {
                c.holds.entry(node.to_string()).or_insert(now);
            }
            Cordon::Lifting | Cordon::Gone => {
                c.holds.remove(node);
            }
            Cordon::Setting => {}
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
            .unwrap_or(0)
            .saturating_sub(self.operator_deletes);
        if deletes > 0 {
            out.push(Violation {
                rule: "forcedDeletion",
                detail: format!("{deletes} pod(s) deleted directly, not evicted"),
            });
        }
        if let Some(c) = &mut self.calls {
            c.judge(twin, &mut out);
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

impl CallRules {
    fn judge(&mut self, twin: &Twin, out: &mut Vec<Violation>) {
        self.look_at_lease(twin);
        for call in self.new_calls() {
            self.judge_call(&call, out);
        }
        // The fallback slot: until a node runs the target, one of its slots still holds
        // what it ran before the rollout (a second install on one boot under GRUB
        // overwrites it: siderolabs/talos grub/boot_label.go `flip`).
        let slots: Vec<(String, String, Vec<Option<String>>)> = twin.talos.read(|m| {
            m.nodes()
                .iter()
                .map(|n| {
                    (
                        n.name.clone(),
                        n.talos_version.clone(),
                        n.boot.slots.to_vec(),
                    )
                })
                .collect()
        });
        for (node, running, slots) in slots {
            let before = self.before.entry(node.clone()).or_insert(running.clone());
            // A node an operator upgraded by hand keeps what the operator's install left.
            if self.by_hand.iter().any(|(n, _, _)| *n == node) {
                continue;
            }
            if let Some(target) = &self.target_talos {
                out.extend(fallback_lost(&node, &running, before, target, &slots));
            }
        }
    }

    /// Complete lines appended to the call log since the last look.
    fn new_calls(&mut self) -> Vec<TalosCall> {
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.log).ok();
        }
        let Some(f) = &mut self.file else {
            return Vec::new();
        };
        let mut text = String::new();
        if f.seek(std::io::SeekFrom::Start(self.offset)).is_err()
            || f.read_to_string(&mut text).is_err()
        {
            return Vec::new();
        }
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        self.offset += complete as u64;
        text[..complete]
            .lines()
            .filter_map(TalosCall::parse)
            .collect()
    }

    /// Who holds the Lease now: a new holding is remembered from its `acquireTime`, the
    /// engine's renewals from their `renewTime`.
    fn look_at_lease(&mut self, twin: &Twin) {
        let Some(rule) = &self.lease else { return };
        let lease = twin
            .kube
            .with(|c, _| c.get("leases", &rule.namespace, &rule.name));
        let Some(lease) = lease else { return };
        let field = |p: &str| lease.pointer(p).and_then(serde_json::Value::as_str);
        let time = |p: &str| field(p).and_then(Timestamp::parse_rfc3339);
        let (Some(holder), Some(acquired)) =
            (field("/spec/holderIdentity"), time("/spec/acquireTime"))
        else {
            return;
        };
        if self
            .holders
            .last()
            .is_none_or(|(t, h)| *t != acquired || h != holder)
        {
            self.holders.push((acquired, holder.to_string()));
        }
        if let Some(secs) = lease
            .pointer("/spec/leaseDurationSeconds")
            .and_then(serde_json::Value::as_u64)
        {
            self.lease_duration = Duration::from_secs(secs);
        }
        if holder == rule.holder {
            if let Some(renewed) = time("/spec/renewTime") {
                if self.renewals.last() != Some(&renewed) {
                    self.renewals.push(renewed);
                }
            }
        }
        // Keep a bounded history: calls are read within a tick or so of their instant.
        if self.holders.len() > 64 {
            self.holders.drain(..self.holders.len() - 64);
        }
        if self.renewals.len() > 256 {
            self.renewals.drain(..self.renewals.len() - 256);
        }
    }

    fn judge_call(&mut self, call: &TalosCall, out: &mut Vec<Violation>) {
        if !DISRUPTIVE.contains(&call.method.as_str()) {
            return;
        }
        let by_hand = self
            .by_hand
            .iter()
            .any(|(n, from, until)| *n == call.node && *from <= call.at && call.at <= *until);
        if by_hand {
            return;
        }
        let what = format!("{} on {} at {}", call.method, call.node, call.at.rfc3339());
        if INSTALLS.contains(&call.method.as_str()) && call.code == 0 {
            let n = self
                .installs
                .entry((call.node.clone(), call.boot_id.clone()))
                .or_insert(0);
            *n += 1;
            if *n > 1 {
                out.push(Violation {
                    rule: "installsPerBoot",
                    detail: format!("{what}: install {n} on boot {}", call.boot_id),
                });
            }
        }
        // Within one second of a hold or a pause the engine may have decided just before
        // it: the log's instants are whole seconds.
        let settled =
            |since: Timestamp| call.at.since(since) >= Duration::from_secs(1) && call.at > since;
        if let Some(since) = self.holds.get(&call.node) {
            if settled(*since) {
                out.push(Violation {
                    rule: "heldNode",
                    detail: format!("{what}, held since {}", since.rfc3339()),
                });
            }
        }
        if let Some((from, _)) = self
            .paused
            .iter()
            .find(|(from, until)| settled(*from) && until.is_none_or(|u| call.at < u))
        {
            out.push(Violation {
                rule: "quietWhilePaused",
                detail: format!("{what}, while paused since {}", from.rfc3339()),
            });
        }
        if let Some(rule) = &self.lease {
            let holding = self.holders.iter().rev().find(|(t, _)| *t < call.at);
            let ours = holding.is_none_or(|(_, h)| *h == rule.holder);
            let renewed = self.renewals.iter().rev().find(|t| **t <= call.at);
            let fresh = renewed.is_some_and(|r| call.at.since(*r) <= self.lease_duration);
            if !ours {
                let (since, by) = holding
                    .map(|(t, h)| (t.rfc3339(), h.as_str()))
                    .unwrap_or_default();
                out.push(Violation {
                    rule: "leaseHeld",
                    detail: format!("{what}, while {by} held the rollout lock (since {since})"),
                });
            } else if !fresh && !self.renewals.is_empty() {
                out.push(Violation {
                    rule: "leaseHeld",
                    detail: format!(
                        "{what}, the rollout lock last renewed at {} had lapsed",
                        renewed.map(|r| r.rfc3339()).unwrap_or_default()
                    ),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> CallRules {
        CallRules {
            log: PathBuf::new(),
            file: None,
            offset: 0,
            installs: BTreeMap::new(),
            target_talos: None,
            before: BTreeMap::new(),
            lease: Some(LeaseRule {
                namespace: "ichor-system".into(),
                name: "ichor-rollout-home".into(),
                holder: "ichor".into(),
            }),
            holders: vec![(Timestamp(0), "ichor".into())],
            renewals: vec![Timestamp(0)],
            lease_duration: Duration::from_secs(60),
            paused: Vec::new(),
            holds: BTreeMap::new(),
            by_hand: Vec::new(),
        }
    }

    fn call(secs: u64, method: &str, boot: &str) -> TalosCall {
        TalosCall {
            at: Timestamp(secs * 1000),
            node: "w-1".into(),
            method: method.into(),
            boot_id: boot.into(),
            code: 0,
        }
    }

    fn judged(r: &mut CallRules, calls: &[TalosCall]) -> Vec<&'static str> {
        let mut out = Vec::new();
        for c in calls {
            r.judge_call(c, &mut out);
        }
        out.into_iter().map(|v| v.rule).collect()
    }

    const INSTALL: &str = "machine.LifecycleService/Upgrade";
    const REBOOT: &str = "machine.MachineService/Reboot";

    #[test]
    fn a_second_install_on_one_boot_is_caught_and_one_per_boot_is_not() {
        let mut r = rules();
        let refused = TalosCall {
            code: 9,
            ..call(3, INSTALL, "b1")
        };
        assert_eq!(
            judged(
                &mut r,
                &[call(1, INSTALL, "b1"), refused, call(9, INSTALL, "b2")]
            ),
            Vec::<&str>::new()
        );
        assert_eq!(
            judged(&mut r, &[call(10, INSTALL, "b2")]),
            ["installsPerBoot"]
        );
    }

    #[test]
    fn a_disruptive_call_without_the_lock_is_caught() {
        let mut r = rules();
        // Renewed at 0 for 60 s: held at 30, lapsed at 61.
        assert!(judged(&mut r, &[call(30, REBOOT, "b1")]).is_empty());
        assert_eq!(judged(&mut r, &[call(61, REBOOT, "b1")]), ["leaseHeld"]);
        // Someone else took it at 40: a call at 41 is not ichor's to make.
        let mut r = rules();
        r.holders.push((Timestamp(40_000), "thief".into()));
        assert!(judged(&mut r, &[call(40, REBOOT, "b1")]).is_empty());
        assert_eq!(judged(&mut r, &[call(41, REBOOT, "b1")]), ["leaseHeld"]);
        // Reads are not judged.
        assert!(judged(&mut r, &[call(50, "machine.MachineService/Version", "b1")]).is_empty());
    }

    #[test]
    fn a_disruptive_call_on_a_held_node_or_while_paused_is_caught() {
        let mut r = rules();
        r.holds.insert("w-1".into(), Timestamp(10_000));
        // Decided in the same second the hold was set: not yet a break.
        assert!(judged(&mut r, &[call(10, REBOOT, "b1")]).is_empty());
        assert_eq!(judged(&mut r, &[call(12, REBOOT, "b1")]), ["heldNode"]);
        let mut r = rules();
        r.paused.push((Timestamp(20_000), Some(Timestamp(50_000))));
        assert!(judged(&mut r, &[call(15, REBOOT, "b1"), call(50, REBOOT, "b2")]).is_empty());
        assert_eq!(
            judged(&mut r, &[call(30, REBOOT, "b1")]),
            ["quietWhilePaused"]
        );
    }

    #[test]
    fn the_fallback_slot_keeps_the_old_version_until_the_node_runs_the_target() {
        let slots = |a: &str, b: &str| [Some(a.to_string()), Some(b.to_string())];
        // One install: the old version stays in the other slot.
        assert!(fallback_lost(
            "w-1",
            "v1.12.6",
            "v1.12.6",
            "v1.12.9",
            &slots("v1.12.6", "v1.12.9")
        )
        .is_none());
        // A second install on the same boot under GRUB: both slots hold the target.
        let lost = fallback_lost(
            "w-1",
            "v1.12.6",
            "v1.12.6",
            "v1.12.9",
            &slots("v1.12.9", "v1.12.9"),
        );
        assert_eq!(lost.map(|v| v.rule), Some("fallbackSlot"));
        // Once it runs the target, nothing is owed.
        assert!(fallback_lost(
            "w-1",
            "v1.12.9",
            "v1.12.6",
            "1.12.9",
            &slots("v1.12.9", "v1.12.9")
        )
        .is_none());
    }
}
