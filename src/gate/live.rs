//! The live half of the gate: what the cluster runs right now, read through ichor's own
//! Kubernetes and Talos clients, judged after the static items. Observing (I/O) and judging
//! (pure, tested without sockets) are separate: `observe` collects [`LiveFacts`], each fact
//! either a value or the error that kept it from being read; `items` turns them into
//! checklist items. A fact that could not be read makes its item `wait` with the error —
//! never a pass.

use crate::kube::inventory::{ApplicationStatus, DeprecatedApi, LeaseHolder, LiveNode, LiveVolume};
use crate::kube::{KubeClient, WorkloadStatus};
use crate::policy::{self, CheckItem, Status, TrapConfig, TrapNode};
use crate::releaseset::{HandoverMode, MinorVersion, Node, Role, Version};
use crate::talos::client::{CallOptions, EtcdMember, EtcdStatus, TalosClient};

use super::Change;

/// The namespace of ichor's own objects (the rollout lock, the rollout record).
pub const ICHOR_NAMESPACE: &str = "ichor-system";

/// The Lease that holds a cluster's rollout lock.
pub fn lock_name(cluster: &str) -> String {
    format!("ichor-rollout-{cluster}")
}

/// The cluster as observed. `Err` holds why a fact could not be read.
#[derive(Debug, Clone)]
pub struct LiveFacts {
    pub nodes: Result<Vec<LiveNode>, String>,
    pub volumes: Result<Vec<LiveVolume>, String>,
    pub etcd: Option<Result<EtcdView, String>>,
    pub lock: Result<Option<LeaseHolder>, String>,
    /// The CNI's workload as it runs (`None`: not found where that CNI installs it).
    pub cni: Result<Option<WorkloadStatus>, String>,
    /// The hand-over's Argo CD Application, when a hand-over is configured.
    pub handover: Option<Result<Option<ApplicationStatus>, String>>,
    pub deprecated_apis: Result<Vec<DeprecatedApi>, String>,
    /// What each node runs and how it is configured, for the Talos upgrade traps; `None`
    /// without Talos access.
    pub talos_nodes: Option<Result<Vec<TrapNode>, String>>,
    /// The talosconfig's endpoints (`None` without Talos access).
    pub talos_endpoints: Option<Vec<String>>,
    /// Each `before` health check of cluster.yaml and what it read now.
    pub health: Vec<(crate::health::HealthCheck, crate::health::Reading)>,
}

/// etcd as the control planes report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdView {
    pub members: Vec<EtcdMember>,
    /// Each control plane's own status, or why it could not be read: (node, status).
    pub statuses: Vec<(String, Result<EtcdStatus, String>)>,
    /// Each control plane's address: (node, internal IP), to find its member by peer URL
    /// when its own status does not answer.
    pub addresses: Vec<(String, String)>,
}

/// The host of a peer URL (`https://10.0.0.1:2380`, `https://[fd00::1]:2380`).
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    }
}

fn same_address(a: &str, b: &str) -> bool {
    match (a.parse::<std::net::IpAddr>(), b.parse::<std::net::IpAddr>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.eq_ignore_ascii_case(b),
    }
}

impl EtcdView {
    /// Whether `node` runs member `m`, by identity, never by name: Talos names the member
    /// with the kernel hostname (siderolabs/talos@149ffa97:internal/app/machined/pkg/
    /// system/services/etcd.go `argsForControlPlane`) while the Node is the lower-cased
    /// hostname or FQDN (siderolabs/talos@021c73c3:internal/app/machined/pkg/controllers/
    /// k8s/nodename.go). The member id the node's own EtcdStatus reports decides; a node
    /// that did not answer is found by its address in the member's peer URLs (Talos
    /// advertises the node's own address there).
    fn runs(&self, node: &str, m: &EtcdMember) -> bool {
        match self.statuses.iter().find(|(n, _)| n == node) {
            Some((_, Ok(st))) => st.member_id == m.id,
            _ => self
                .addresses
                .iter()
                .filter(|(n, _)| n == node)
                .any(|(_, ip)| m.peer_urls.iter().any(|u| same_address(url_host(u), ip))),
        }
    }

    /// The member `node` runs, found by identity ([`Self::runs`]).
    pub fn member_of(&self, node: &str) -> Option<&EtcdMember> {
        self.members.iter().find(|m| self.runs(node, m))
    }

    /// The control plane that runs member `m`, and how it answered.
    fn status_of(&self, m: &EtcdMember) -> Option<&(String, Result<EtcdStatus, String>)> {
        self.statuses.iter().find(|(node, _)| self.runs(node, m))
    }

    /// Each member of the member list with how it answered: `Ok` when the control plane
    /// that runs this member reports no errors and it is a voter, else why not. A member
    /// no control plane answers for (a machine replaced and never removed) is judged as
    /// what it is: down, and counting toward quorum (etcd counts every member of the
    /// cluster configuration: etcd-io/etcd server/etcdserver/api/membership/cluster.go at
    /// v3.5.17, `Members`/`VotingMembers`).
    pub fn member_health(&self) -> Vec<(&EtcdMember, Result<(), String>)> {
        self.members
            .iter()
            .map(|m| {
                let status = self.status_of(m);
                let health = if m.is_learner {
                    Err("a learner, still joining".to_string())
                } else {
                    match status {
                        None => Err(format!(
                            "member {:016x} answers nothing: no control plane reports it as its own; if its machine is gone, remove it with `talosctl etcd remove-member {:016x}`",
                            m.id, m.id
                        )),
                        Some((_, Err(e))) => Err(crate::releaseset::excerpt(e, 120)),
                        Some((_, Ok(st))) if st.is_learner => {
                            Err("a learner, still joining".to_string())
                        }
                        Some((_, Ok(st))) if !st.errors.is_empty() => Err(st.errors.join("; ")),
                        Some(_) => Ok(()),
                    }
                };
                (m, health)
            })
            .collect()
    }

    /// Members no control plane answers for: no machine behind them any more. They never
    /// heal by themselves; someone removes them.
    pub fn stale_members(&self) -> Vec<&EtcdMember> {
        self.members
            .iter()
            .filter(|m| self.status_of(m).is_none())
            .collect()
    }

    /// Whether `node`'s member may go down now: every other member healthy and a voter, and
    /// quorum held without `node`. `own_may_be_down`: `node` may already be on its way down
    /// (a repeated upgrade call after a restart), so its own member is not required to
    /// answer. `Err` names the members in the way.
    pub fn may_take_down(&self, node: &str, own_may_be_down: bool) -> Result<(), String> {
        let health = self.member_health();
        let total = health.len();
        let own = self.member_of(node).map(|m| m.id);
        // A member that cannot be told apart is never assumed to be someone else's.
        if own.is_none() && total > 1 {
            return Err(format!(
                "cannot tell which of etcd's {total} members {node} runs: its EtcdStatus did not answer and no member's peer URL carries its address; taking it down could lose quorum — check `talosctl etcd members`, then resume"
            ));
        }
        let sick: Vec<String> = health
            .iter()
            .filter(|(m, _)| !(own_may_be_down && Some(m.id) == own))
            .filter_map(|(m, h)| h.as_ref().err().map(|e| format!("{} ({e})", m.hostname)))
            .collect();
        if !sick.is_empty() {
            return Err(format!(
                "etcd has {total} members and {} not healthy: {}; taking {node} down now could lose quorum — heal or remove {}, then resume",
                if sick.len() == 1 { "1 is".to_string() } else { format!("{} are", sick.len()) },
                sick.join(", "),
                if sick.len() == 1 { "it" } else { "them" }
            ));
        }
        // A single member has no quorum to keep: it restarts on its own data (the plan
        // warned that the API is down meanwhile).
        if total <= 1 {
            return Ok(());
        }
        let after = health
            .iter()
            .filter(|(m, h)| h.is_ok() && Some(m.id) != own)
            .count();
        if after * 2 <= total {
            return Err(format!(
                "etcd has {total} members and only {after} would remain with {node} down: quorum needs {}; add a control plane (or remove a stale member), then resume",
                total / 2 + 1
            ));
        }
        Ok(())
    }

    /// The control plane whose member leads etcd.
    pub fn leader_node(&self) -> Option<&str> {
        let leader = self.leader()?;
        self.status_of(leader).map(|(node, _)| node.as_str())
    }

    pub fn leader(&self) -> Option<&EtcdMember> {
        let id = self
            .statuses
            .iter()
            .find_map(|(_, s)| s.as_ref().ok().map(|s| s.leader))?;
        self.members.iter().find(|m| m.id == id)
    }
}

/// Where a CNI's agent runs, per the CNI's own install manifests.
pub fn cni_workload(cni: &str) -> &'static [(&'static str, &'static str)] {
    match cni {
        "cilium" => &[("kube-system", "cilium")],
        "calico" => &[
            ("calico-system", "calico-node"),
            ("kube-system", "calico-node"),
        ],
        "flannel" => &[
            ("kube-flannel", "kube-flannel-ds"),
            ("kube-system", "kube-flannel-ds"),
        ],
        _ => &[],
    }
}

/// Where an add-on's main workload runs, per its own install manifests (kind, namespace,
/// name), for the add-ons ichor knows; the rollout waits for one that must move first.
pub fn addon_workload(addon: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match addon {
        "cert-manager" => Some(("Deployment", "cert-manager", "cert-manager")),
        "longhorn" => Some(("DaemonSet", "longhorn-system", "longhorn-manager")),
        "ingress-nginx" => Some(("Deployment", "ingress-nginx", "ingress-nginx-controller")),
        "metallb" => Some(("Deployment", "metallb-system", "controller")),
        "external-dns" => Some(("Deployment", "external-dns", "external-dns")),
        _ => None,
    }
}

/// What to observe: the cluster's name (for its lock), its CNI when known, its volume
/// provider and the hand-over's Application.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub cluster: String,
    pub cni: Option<String>,
    pub volumes: crate::releaseset::VolumeProvider,
    /// `Some(None)`: a hand-over is configured without an Application.
    pub handover: Option<Option<crate::releaseset::ObjectRef>>,
    /// The `before` health checks (`spec.healthChecks`), read as live items.
    pub health_checks: Vec<crate::health::HealthCheck>,
    /// The bearer token for a Prometheus behind auth, bound to its URL (the controller's
    /// config, or `--prometheus-url` with `--prometheus-token-file`); never from the repository.
    pub prometheus_credential: Option<crate::prometheus::Credential>,
}

impl Subject {
    pub fn of(change: &Change) -> Subject {
        Subject {
            cluster: change.cluster.clone(),
            cni: Some(change.head_release_set.spec.cni.name.clone()),
            volumes: change
                .cluster_doc
                .as_ref()
                .map(|c| c.spec.volumes.provider)
                .unwrap_or_default(),
            handover: change.cluster_doc.as_ref().and_then(|c| {
                let h = &c.spec.cni.handover;
                (h.mode != HandoverMode::Disabled).then(|| h.argocd_application.clone())
            }),
            health_checks: change
                .cluster_doc
                .as_ref()
                .map(|c| {
                    c.spec
                        .health_checks
                        .iter()
                        .filter(|h| h.applies(crate::health::Phase::Before))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            prometheus_credential: None,
        }
    }

    /// The same subject, reading Prometheus with `credential` (bound to its URL).
    pub fn with_prometheus_credential(
        mut self,
        credential: Option<crate::prometheus::Credential>,
    ) -> Subject {
        self.prometheus_credential = credential;
        self
    }
}

/// The CNIs ichor knows where to find, for `status` without a release set.
pub const KNOWN_CNIS: [&str; 3] = ["cilium", "calico", "flannel"];

/// Read everything the live items need. Never fails: each fact carries its own error.
pub async fn observe(
    kube: &KubeClient,
    talos: Option<&TalosClient>,
    subject: &Subject,
) -> LiveFacts {
    let s = |e: crate::kube::KubeError| e.to_string();
    let nodes = kube.nodes().await.map_err(s);
    let volumes = match subject.volumes {
        crate::releaseset::VolumeProvider::Longhorn => kube.longhorn_volumes().await.map_err(s),
        crate::releaseset::VolumeProvider::LocalPath => kube.local_volumes().await.map_err(s),
        crate::releaseset::VolumeProvider::None => Ok(vec![]),
    };
    let lock = kube
        .lease_holder(ICHOR_NAMESPACE, &lock_name(&subject.cluster))
        .await
        .map_err(s);
    let candidates: Vec<&str> = match &subject.cni {
        Some(c) => vec![c.as_str()],
        None => KNOWN_CNIS.to_vec(),
    };
    let mut cni = Ok(None);
    'found: for c in candidates {
        for (ns, name) in cni_workload(c) {
            match kube.daemonset(ns, name).await {
                Ok(Some(w)) => {
                    cni = Ok(Some(w));
                    break 'found;
                }
                Ok(None) => {}
                Err(e) => {
                    cni = Err(e.to_string());
                    break 'found;
                }
            }
        }
    }
    let handover = match subject.handover.clone() {
        Some(Some(app)) => Some(kube.application(&app.namespace, &app.name).await.map_err(s)),
        Some(None) => Some(Err("no argocdApplication configured".into())),
        None => None,
    };
    let deprecated_apis = kube.deprecated_apis().await.map_err(s);
    let etcd = match (talos, &nodes) {
        (Some(t), Ok(ns)) => Some(observe_etcd(t, ns).await),
        (Some(_), Err(e)) => Some(Err(format!("no node list to find the control planes: {e}"))),
        (None, _) => None,
    };
    let talos_nodes = match (talos, &nodes) {
        (Some(t), Ok(ns)) => {
            let view = etcd.as_ref().and_then(|e| e.as_ref().ok());
            Some(Ok(observe_trap_nodes(t, ns, view).await))
        }
        (Some(_), Err(e)) => Some(Err(format!("no node list to find the nodes: {e}"))),
        (None, _) => None,
    };
    // Prometheus stamps its answers with wall time: the gate judges them on the wall clock.
    let mut health = Vec::new();
    for c in &subject.health_checks {
        let now = crate::clock::Clock::system().now();
        let r = crate::rollout::health::read_check(
            kube,
            subject.prometheus_credential.as_ref(),
            c,
            now,
        )
        .await;
        health.push((c.clone(), r));
    }
    LiveFacts {
        health,
        nodes,
        volumes,
        etcd,
        lock,
        cni,
        handover,
        deprecated_apis,
        talos_nodes,
        talos_endpoints: talos.map(|t| t.endpoints().iter().map(|e| e.to_string()).collect()),
    }
}

/// Each node's running Talos, machine configuration, boot loader and (control planes) etcd,
/// read over the Talos API; every fact carries its own error. A control plane's etcd
/// version comes from `etcd`'s statuses when they were read already.
pub async fn observe_trap_nodes(
    talos: &TalosClient,
    nodes: &[LiveNode],
    etcd: Option<&EtcdView>,
) -> Vec<TrapNode> {
    let opts = CallOptions::default();
    let one = |n: &LiveNode| {
        let addr = n.internal_ip.clone().unwrap_or_else(|| n.name.clone());
        let control_plane = n.role == Role::Controlplane;
        let listed = n.talos.clone();
        let name = n.name.clone();
        let known = etcd.and_then(|v| {
            v.statuses
                .iter()
                .find(|(cp, _)| *cp == n.name)
                .map(|(_, st)| st.clone())
        });
        async move {
            let s = |e: crate::talos::TalosError| e.to_string();
            // The Version reply is what decides ichor's upgrade API; the Node's osImage is
            // the fallback when the node does not answer.
            let talos_version = match talos.version(&addr, opts).await {
                Ok(v) => Version::parse(&v.tag).map_err(|e| e.to_string()),
                Err(e) => match listed.as_deref().map(Version::parse) {
                    Some(Ok(v)) => Ok(v),
                    _ => Err(s(e)),
                },
            };
            let config = match talos.machine_config(&addr, opts).await {
                Ok(mc) => {
                    use crate::talos::machine_config::{install_settings, kube_proxy_enabled};
                    install_settings(&mc.yaml).and_then(|i| {
                        Ok(TrapConfig {
                            grub_builds_cmdline: i.grub_builds_cmdline(),
                            installer_image: i
                                .installer_image
                                .map(|(img, path)| (img, path.to_string())),
                            extra_kernel_args: i.extra_kernel_args,
                            etcd_image: i.etcd_image,
                            kube_proxy_enabled: kube_proxy_enabled(&mc.yaml)?,
                        })
                    })
                }
                Err(e) => Err(s(e)),
            };
            let booted_with_uki = talos.booted_with_uki(&addr, opts).await.map_err(s);
            let etcd = if control_plane {
                let status = match known {
                    Some(st) => st,
                    None => talos.etcd_status(&addr, opts).await.map_err(s),
                };
                Some(status.and_then(|st| match st.version.as_str() {
                    "" => Err("no etcd version in the member status".to_string()),
                    v => Version::parse(v).map_err(|e| format!("etcd version `{v}`: {e}")),
                }))
            } else {
                None
            };
            TrapNode {
                name,
                control_plane,
                talos: talos_version,
                config,
                booted_with_uki,
                etcd,
            }
        }
    };
    // A few nodes at a time: a large cluster's calls all travel through one endpoint.
    use futures_util::StreamExt;
    futures_util::stream::iter(nodes.iter().map(one))
        .buffered(8)
        .collect()
        .await
}

async fn observe_etcd(talos: &TalosClient, nodes: &[LiveNode]) -> Result<EtcdView, String> {
    observe_etcd_around(talos, nodes, None).await
}

/// etcd's member list and every control plane's own status; calls never travel through
/// `avoid` (a node about to reboot), though its own status is still asked of it.
pub async fn observe_etcd_around(
    talos: &TalosClient,
    nodes: &[LiveNode],
    avoid: Option<&str>,
) -> Result<EtcdView, String> {
    let cps: Vec<&LiveNode> = nodes
        .iter()
        .filter(|n| n.role == Role::Controlplane)
        .collect();
    let addr = |n: &LiveNode| n.internal_ip.clone().unwrap_or_else(|| n.name.clone());
    // With one control plane there is no other way to reach etcd.
    let avoid = if cps.len() <= 1 { None } else { avoid };
    let opts = CallOptions {
        avoid,
        ..CallOptions::default()
    };
    let mut members = Err("no control plane answered".to_string());
    for cp in cps.iter().filter(|cp| Some(cp.name.as_str()) != avoid) {
        match talos.etcd_members(&addr(cp), opts).await {
            Ok(m) => {
                members = Ok(m);
                break;
            }
            Err(e) => members = Err(e.to_string()),
        }
    }
    let members = members?;
    let mut statuses = Vec::new();
    for cp in &cps {
        let st = talos
            .etcd_status(&addr(cp), opts)
            .await
            .map_err(|e| e.to_string());
        statuses.push((cp.name.clone(), st));
    }
    let addresses = cps
        .iter()
        .filter_map(|cp| Some((cp.name.clone(), cp.internal_ip.clone()?)))
        .collect();
    Ok(EtcdView {
        members,
        statuses,
        addresses,
    })
}

/// The live nodes as the static node items take them, with their volumes.
/// The Node whose etcd member leads, when etcd was read: the plan lists it last among the
/// control planes' Talos steps, as the run takes it.
pub fn etcd_leader(facts: &LiveFacts) -> Option<String> {
    let view = facts.etcd.as_ref()?.as_ref().ok()?;
    view.leader_node().map(str::to_string)
}

pub fn live_nodes(facts: &LiveFacts) -> Option<Vec<Node>> {
    let nodes = facts.nodes.as_ref().ok()?;
    let volumes = facts.volumes.as_ref().ok();
    nodes
        .iter()
        .map(|n| {
            let vols = volumes
                .map(|vs| {
                    vs.iter()
                        .filter(|v| v.holders.contains(&n.name))
                        .map(|v| v.name.clone())
                        .collect()
                })
                .unwrap_or_default();
            n.to_node(vols)
        })
        .collect()
}

/// A cluster of one node: refused unless cluster.yaml accepts the downtime (the rollout
/// refuses it the same way).
fn single_node_item(change: &Change, nodes: &[LiveNode]) -> Option<CheckItem> {
    let [only] = nodes else {
        return None;
    };
    let (id, title) = ("live/single-node", "A node can be drained elsewhere");
    let accepted = change
        .cluster_doc
        .as_ref()
        .is_some_and(|d| d.spec.rollout.accept_single_node_downtime);
    Some(if accepted {
        CheckItem::new(
            id,
            title,
            Status::Warn,
            format!("{} is the cluster's only node: it is upgraded in place, without a drain, and everything on it is down while it reboots (cluster.yaml accepts this)", only.name),
        )
        .source("live")
    } else {
        CheckItem::new(
            id,
            title,
            Status::Fail,
            format!("{} is the cluster's only node: draining it evicts every pod with nowhere to go (ichor included), and upgrading it takes everything down", only.name),
        )
        .hint("set spec.rollout.acceptSingleNodeDowntime: true in cluster.yaml to upgrade it in place without a drain, accepting the downtime, or add a node")
        .source("live")
    })
}

/// One talosconfig endpoint in front of several control planes (one address, or a VIP):
/// while the node behind it reboots, the calls about it have nowhere else to go.
fn endpoints_item(endpoints: &[String], nodes: &[LiveNode]) -> CheckItem {
    let (id, title) = (
        "live/talos-endpoints",
        "The talosconfig reaches every control plane",
    );
    let cps = nodes
        .iter()
        .filter(|n| n.role == Role::Controlplane)
        .count();
    match endpoints {
        [one] if cps > 1 => CheckItem::new(
            id,
            title,
            Status::Warn,
            format!("the talosconfig names a single endpoint ({one}) for {cps} control planes: while the control plane behind it reboots (or a VIP moves), ichor waits for it to answer again instead of watching through another"),
        )
        .hint("list every control plane's address under the context's endpoints (talosctl config endpoint IP1 IP2 IP3)")
        .source("live"),
        _ => CheckItem::new(
            id,
            title,
            Status::Pass,
            format!("{} endpoint(s) for {cps} control plane(s)", endpoints.len()),
        )
        .source("live"),
    }
}

fn wait(id: &str, title: &str, what: &str, e: &str) -> CheckItem {
    CheckItem::new(
        id,
        title,
        Status::Wait,
        format!("cannot read {what}: {}", crate::releaseset::excerpt(e, 300)),
    )
    .hint("check the credentials and that the cluster is reachable, then re-run the gate")
    .source("live")
}

/// The live items for `change`, after the static ones.
pub fn items(change: &Change, facts: &LiveFacts) -> Vec<CheckItem> {
    let bump = &change.bump;
    let target_k8s = bump.head.spec.kubernetes.minor_version();
    let mut out = Vec::new();
    out.extend(crate::rollout::health::live_items(&facts.health));

    // Nodes Ready.
    let (id, title) = ("live/nodes-ready", "Every node is Ready");
    out.push(match &facts.nodes {
        Err(e) => wait(id, title, "the nodes", e),
        Ok(nodes) => {
            let not: Vec<&str> = nodes.iter().filter(|n| !n.ready).map(|n| n.name.as_str()).collect();
            if nodes.is_empty() {
                CheckItem::new(id, title, Status::Wait, "the API server lists no nodes").source("live")
            } else if !not.is_empty() {
                CheckItem::new(id, title, Status::Wait, format!("not Ready: {}", not.join(", ")))
                    .hint("an upgrade starts only on a healthy cluster; the gate re-evaluates once they are Ready")
                    .source("live")
            } else {
                CheckItem::new(id, title, Status::Pass, format!("all {} nodes are Ready", nodes.len())).source("live")
            }
        }
    });

    // etcd.
    if let Some(etcd) = &facts.etcd {
        out.push(etcd_item(etcd));
    }

    let rolls_nodes = bump.base.spec.talos != bump.head.spec.talos
        || bump.base.spec.kubernetes != bump.head.spec.kubernetes;
    if let (Ok(nodes), true) = (&facts.nodes, rolls_nodes) {
        if let Some(item) = single_node_item(change, nodes) {
            out.push(item);
        }
        if let Some(endpoints) = &facts.talos_endpoints {
            out.push(endpoints_item(endpoints, nodes));
        }
    }

    // Each node's running Talos and kubelet, as the static node items judge them.
    match live_nodes(facts) {
        Some(nodes) => {
            for mut item in [
                policy::nodes_talos(bump, &change.policies, &nodes),
                policy::kubelet_skew(bump, &change.policies, &nodes),
            ] {
                item.id = format!("live/{}", item.id);
                item.source = Some("live".into());
                out.push(item);
            }
        }
        None => {
            let why = facts
                .nodes
                .as_ref()
                .err()
                .cloned()
                .unwrap_or_else(|| "a node reports no Talos or kubelet version".into());
            out.push(wait(
                "live/nodes-talos",
                "Every node can take the Talos upgrade",
                "the nodes' versions",
                &why,
            ));
        }
    }

    // The Talos upgrade traps, from what each node runs and how it is configured.
    if let Some(trap_nodes) = &facts.talos_nodes {
        let installer = change
            .cluster_doc
            .as_ref()
            .and_then(|d| d.spec.talos.installer_image.as_deref());
        let replaces_kube_proxy = change
            .cluster_doc
            .as_ref()
            .is_some_and(|d| d.spec.cni.replaces_kube_proxy);
        let judge = |nodes: &[TrapNode]| -> Vec<CheckItem> {
            [
                policy::extra_kernel_args(bump, nodes),
                policy::etcd_version(bump, &change.policies, nodes),
                policy::installer_images(bump, &change.policies, installer, nodes),
                policy::kube_proxy(bump, replaces_kube_proxy, nodes),
            ]
            .into_iter()
            .flatten()
            .collect()
        };
        match trap_nodes {
            Ok(nodes) => out.extend(judge(nodes)),
            // The items that apply to this change, each saying it could not be judged.
            Err(e) => out.extend(judge(&[]).into_iter().map(|item| {
                let status = if item.status == Status::Warn || item.status == Status::Pass {
                    Status::Warn
                } else {
                    Status::Wait
                };
                CheckItem {
                    status,
                    message: format!(
                        "could not be judged: cannot read the nodes: {}",
                        crate::releaseset::excerpt(e, 300)
                    ),
                    hint: Some("check the credentials and that the cluster is reachable, then re-run the gate".into()),
                    ..item
                }
            })),
        }
    }

    // One rollout at a time.
    let (id, title) = ("live/rollout-lock", "No rollout is in progress");
    out.push(match &facts.lock {
        Err(e) => wait(id, title, "the rollout lock", e),
        Ok(Some(h)) => CheckItem::new(
            id,
            title,
            Status::Wait,
            format!(
                "a rollout holds the lock ({}/{}, holder {})",
                ICHOR_NAMESPACE,
                lock_name(&change.cluster),
                h.holder
            ),
        )
        .hint("the gate re-evaluates when that rollout ends")
        .source("live"),
        Ok(None) => {
            CheckItem::new(id, title, Status::Pass, "no rollout holds the lock").source("live")
        }
    });

    // The CNI hand-over.
    let (id, title) = ("live/cni-handover", "The CNI hand-over is complete");
    out.push(match &facts.handover {
        None => CheckItem::new(id, title, Status::Pass, "no hand-over is configured (mode disabled)").source("live"),
        Some(Err(e)) => wait(id, title, "the hand-over's Argo CD Application", e),
        Some(Ok(None)) => CheckItem::new(id, title, Status::Fail, "the hand-over's Argo CD Application does not exist: Talos still owns the CNI, and re-applying its inline manifests would roll the CNI back")
            .hint("finish the hand-over (the Application synced and healthy), or set spec.cni.handover.mode: disabled")
            .source("live"),
        Some(Ok(Some(app))) if app.complete() => CheckItem::new(id, title, Status::Pass, format!("Argo CD owns the CNI ({}, {})", app.sync, app.health)).source("live"),
        Some(Ok(Some(app))) => CheckItem::new(id, title, Status::Fail, format!("the hand-over is not complete (Application {}, {}): re-applying Talos's inline manifests would roll the CNI back", app.sync, app.health))
            .hint("let Argo CD finish the hand-over (Synced and Healthy) before upgrading Kubernetes")
            .source("live"),
    });

    // The CNI actually running supports the target.
    let cni = &bump.head.spec.cni.name;
    let (id, title) = ("live/cni-running", "The CNI running supports the target");
    out.push(match &facts.cni {
        Err(e) => wait(id, title, "the CNI's DaemonSet", e),
        Ok(None) => CheckItem::new(
            id,
            title,
            Status::Warn,
            format!(
                "no {cni} DaemonSet found where {cni} installs it; cannot tell which version runs"
            ),
        )
        .hint("check that the release set's CNI is the one the cluster runs")
        .source("live"),
        Ok(Some(w)) => cni_running_item(change, w, target_k8s),
    });

    // Removed APIs still requested.
    let (id, title) = ("live/removed-apis", "No removed API is still in use");
    out.push(match &facts.deprecated_apis {
        // ADR 0057 pre-check 5: removed APIs warn, never gate, and a failed scrape is
        // recorded as Unknown, so an unreadable /metrics (often just RBAC) never holds a PR.
        Err(e) => CheckItem::new(
            id,
            title,
            Status::Warn,
            format!(
                "Unknown: cannot read the API server's metrics: {}",
                crate::releaseset::excerpt(e, 300)
            ),
        )
        .hint("grant ichor `get` on the non-resource URL /metrics (deploy/rbac.yaml does) to learn which removed APIs are still requested")
        .source("apiserver_requested_deprecated_apis"),
        Ok(apis) => {
            let removed: Vec<String> = apis
                .iter()
                .filter(|a| {
                    a.removed_release
                        .as_deref()
                        .and_then(|r| MinorVersion::parse(r).ok())
                        .is_some_and(|r| r <= target_k8s)
                })
                .map(|a| {
                    let gv = if a.group.is_empty() { a.version.clone() } else { format!("{}/{}", a.group, a.version) };
                    format!("{gv} {} (removed in {})", a.resource, a.removed_release.as_deref().unwrap_or("?"))
                })
                .collect();
            if removed.is_empty() {
                CheckItem::new(id, title, Status::Pass, format!("no API removed by Kubernetes {target_k8s} was requested")).source("live")
            } else {
                CheckItem::new(id, title, Status::Warn, format!("still requested, removed by Kubernetes {target_k8s} or earlier: {}", removed.join("; ")))
                    .hint("move those clients to the replacement API before the upgrade; their requests will fail after it")
                    .source("apiserver_requested_deprecated_apis")
            }
        }
    });
    out
}

fn etcd_item(etcd: &Result<EtcdView, String>) -> CheckItem {
    let (id, title) = ("live/etcd", "etcd is healthy with quorum to spare");
    let view = match etcd {
        Err(e) => return wait(id, title, "etcd", e),
        Ok(v) => v,
    };
    let learners: Vec<&str> = view
        .members
        .iter()
        .filter(|m| m.is_learner)
        .map(|m| m.hostname.as_str())
        .collect();
    // Judged from the member list, not from the Nodes: a stale member counts.
    let unhealthy: Vec<String> = view
        .member_health()
        .into_iter()
        .filter(|(m, _)| !m.is_learner)
        .filter_map(|(m, h)| h.err().map(|e| format!("{} ({e})", m.hostname)))
        // A control plane that does not answer and is not in the list is down too.
        .chain(view.statuses.iter().filter_map(|(n, s)| match s {
            Err(e) if view.member_of(n).is_none() => {
                Some(format!("{n} ({})", crate::releaseset::excerpt(e, 120)))
            }
            _ => None,
        }))
        .collect();
    let n = view.members.len();
    let stale: Vec<String> = view
        .stale_members()
        .iter()
        .map(|m| format!("{} ({:016x})", m.hostname, m.id))
        .collect();
    if !stale.is_empty() {
        return CheckItem::new(
            id,
            title,
            Status::Fail,
            format!(
                "{n} members, and {} no control plane answers for: {}; each counts toward quorum, so taking a control plane down could lose it",
                stale.len(),
                stale.join(", ")
            ),
        )
        .hint("remove a member whose machine is gone with `talosctl etcd remove-member ID`")
        .source("live");
    }
    if !learners.is_empty() {
        return CheckItem::new(
            id,
            title,
            Status::Wait,
            format!("learner member(s) still joining: {}", learners.join(", ")),
        )
        .hint("wait until every member is promoted to a voter")
        .source("live");
    }
    if !unhealthy.is_empty() {
        return CheckItem::new(
            id,
            title,
            Status::Wait,
            format!(
                "{} of {n} members unhealthy: {}",
                unhealthy.len(),
                unhealthy.join(", ")
            ),
        )
        .hint("a control-plane upgrade takes a member down; start only with every member healthy")
        .source("live");
    }
    let leader = view
        .leader()
        .map_or("unknown".to_string(), |m| m.hostname.clone());
    if n == 2 {
        // The rollout refuses to take either down (`may_take_down`): say so now rather
        // than start and pause on the first control plane.
        return CheckItem::new(id, title, Status::Fail, format!("2 members (leader {leader}): with either down etcd loses quorum, so ichor will not reboot a control plane"))
            .hint("add a third control plane (or go down to one and accept the API downtime), then retry")
            .source("live");
    }
    if n < 3 {
        return CheckItem::new(id, title, Status::Warn, format!("{n} member(s) (leader {leader}): with one down etcd loses quorum, so the Kubernetes API is unavailable while each control plane upgrades"))
            .hint("run three control planes for upgrades without API downtime")
            .source("live");
    }
    CheckItem::new(
        id,
        title,
        Status::Pass,
        format!("{n} healthy members, leader {leader}; quorum holds with one down"),
    )
    .source("live")
}

fn cni_running_item(change: &Change, w: &WorkloadStatus, target: MinorVersion) -> CheckItem {
    let (id, title) = ("live/cni-running", "The CNI running supports the target");
    let cni = &change.head_release_set.spec.cni.name;
    let Some(running) = w.version.as_deref().and_then(|v| Version::parse(v).ok()) else {
        return CheckItem::new(
            id,
            title,
            Status::Warn,
            format!(
                "{}/{} runs {}: no version in its image tag",
                w.namespace,
                w.name,
                w.images.join(", ")
            ),
        )
        .source("live");
    };
    if !w.rolled_out() {
        return CheckItem::new(
            id,
            title,
            Status::Wait,
            format!(
                "{cni} is still rolling out ({}/{} updated, {} ready)",
                w.updated, w.desired, w.ready
            ),
        )
        .hint("the gate re-evaluates once the CNI's DaemonSet has rolled out")
        .source("live");
    }
    let k8s = &change.head_release_set.spec.kubernetes;
    match change.policies.supports(cni, &running, k8s) {
        None => CheckItem::new(
            id,
            title,
            Status::Warn,
            format!("no compatibility data for {cni} {running}, which the cluster runs"),
        )
        .source("live"),
        Some(true) => CheckItem::new(
            id,
            title,
            Status::Pass,
            format!("{cni} {running} runs and supports Kubernetes {target}"),
        )
        .source("live"),
        Some(false) => {
            let want = change
                .policies
                .lowest_supporting(cni, k8s, &running)
                .map_or_else(
                    || "a release that supports it".to_string(),
                    |s| format!(">= {}", s.version),
                );
            CheckItem::new(id, title, Status::Wait, format!("the cluster still runs {cni} {running}, which does not support Kubernetes {target}"))
                .hint(format!("this change can merge once {cni} {want} is rolled out (merge the CNI bump first)"))
                .source("live")
        }
    }
}

/// The live items for a rollout run by `holder`: as [`items`], without the rollout-lock
/// item when `holder` itself holds the lock (a run of its own that was killed or paused is
/// no reason to wait).
pub fn items_for_holder(change: &Change, facts: &LiveFacts, holder: &str) -> Vec<CheckItem> {
    let own_lock = facts
        .lock
        .as_ref()
        .ok()
        .and_then(|l| l.as_ref())
        .is_some_and(|l| l.holder == holder);
    items(change, facts)
        .into_iter()
        .filter(|i| !(own_lock && i.id == "live/rollout-lock"))
        .collect()
}

/// Where the live inventory and `spec.inventory` disagree, one line each.
pub fn inventory_drift(static_nodes: &[Node], live: &[Node]) -> Vec<String> {
    let mut out = Vec::new();
    for s in static_nodes {
        match live.iter().find(|l| l.name == s.name) {
            None => out.push(format!(
                "{} is in spec.inventory but not in the cluster",
                s.name
            )),
            Some(l) => {
                if l.role != s.role {
                    out.push(format!(
                        "{}: role {} in the cluster, {} in spec.inventory",
                        s.name, l.role, s.role
                    ));
                }
                if l.talos != s.talos {
                    out.push(format!(
                        "{}: runs Talos {}, spec.inventory says {}",
                        s.name, l.talos, s.talos
                    ));
                }
                if l.kubelet != s.kubelet {
                    out.push(format!(
                        "{}: runs kubelet {}, spec.inventory says {}",
                        s.name, l.kubelet, s.kubelet
                    ));
                }
                let (mut a, mut b) = (l.volumes.clone(), s.volumes.clone());
                a.sort();
                b.sort();
                if a != b && !s.volumes.is_empty() {
                    out.push(format!(
                        "{}: holds volumes [{}], spec.inventory says [{}]",
                        s.name,
                        a.join(", "),
                        b.join(", ")
                    ));
                }
            }
        }
    }
    for l in live {
        if !static_nodes.iter().any(|s| s.name == l.name) {
            out.push(format!(
                "{} runs in the cluster but is not in spec.inventory",
                l.name
            ));
        }
    }
    out
}

/// `ichor status`: the facts as one report (JSON: camelCase, errors as strings).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub cluster: Option<String>,
    pub nodes: Vec<LiveNode>,
    pub volumes: Vec<LiveVolume>,
    pub etcd: Option<EtcdReport>,
    pub cni: Option<WorkloadStatus>,
    pub handover: Option<ApplicationStatus>,
    pub removed_apis_in_use: Vec<DeprecatedApi>,
    pub rollout_lock: Option<LeaseHolder>,
    /// What could not be read, by fact.
    pub errors: std::collections::BTreeMap<&'static str, String>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdReport {
    pub members: Vec<String>,
    pub leader: Option<String>,
    pub learners: Vec<String>,
    pub unhealthy: Vec<String>,
}

impl StatusReport {
    pub fn new(subject: &Subject, f: &LiveFacts) -> StatusReport {
        let mut errors = std::collections::BTreeMap::new();
        let mut take = |k: &'static str, e: Option<&String>| {
            if let Some(e) = e {
                errors.insert(k, e.clone());
            }
        };
        take("nodes", f.nodes.as_ref().err());
        take("volumes", f.volumes.as_ref().err());
        take("cni", f.cni.as_ref().err());
        take("rolloutLock", f.lock.as_ref().err());
        take("removedApis", f.deprecated_apis.as_ref().err());
        if let Some(Err(e)) = &f.handover {
            take("handover", Some(e));
        }
        if let Some(Err(e)) = &f.etcd {
            take("etcd", Some(e));
        }
        let etcd = match &f.etcd {
            Some(Ok(v)) => Some(EtcdReport {
                members: v.members.iter().map(|m| m.hostname.clone()).collect(),
                leader: v.leader().map(|m| m.hostname.clone()),
                learners: v
                    .members
                    .iter()
                    .filter(|m| m.is_learner)
                    .map(|m| m.hostname.clone())
                    .collect(),
                unhealthy: v
                    .statuses
                    .iter()
                    .filter(|(_, s)| s.as_ref().map_or(true, |s| !s.errors.is_empty()))
                    .map(|(n, _)| n.clone())
                    .collect(),
            }),
            _ => None,
        };
        StatusReport {
            api_version: super::REPORT_API_VERSION,
            kind: "StatusReport",
            cluster: Some(subject.cluster.clone()).filter(|c| !c.is_empty()),
            nodes: f.nodes.clone().unwrap_or_default(),
            volumes: f.volumes.clone().unwrap_or_default(),
            etcd,
            cni: f.cni.clone().ok().flatten(),
            handover: f.handover.clone().and_then(|h| h.ok().flatten()),
            removed_apis_in_use: f.deprecated_apis.clone().unwrap_or_default(),
            rollout_lock: f.lock.clone().ok().flatten(),
            errors,
        }
    }

    /// A table a person reads at a glance; every string from the cluster is escaped.
    pub fn render_text(&self) -> String {
        use crate::escape::terminal as t;
        let mut out = match &self.cluster {
            Some(c) => format!("cluster {} (live)\n\n", t(c)),
            None => "cluster (live)\n\n".to_string(),
        };
        let rows: Vec<[String; 7]> = self
            .nodes
            .iter()
            .map(|n| {
                [
                    t(&n.name),
                    n.role.to_string(),
                    t(n.talos.as_deref().unwrap_or("-")),
                    t(&n.kubelet),
                    if n.ready { "yes" } else { "NO" }.to_string(),
                    match (n.cordoned, n.cordoned_by_ichor) {
                        (false, _) => "no".into(),
                        (true, true) => "yes (ichor)".into(),
                        (true, false) => "yes".into(),
                    },
                    n.hold.as_deref().map_or("-".into(), t),
                ]
            })
            .collect();
        let head = [
            "NODE", "ROLE", "TALOS", "KUBELET", "READY", "CORDONED", "HOLD",
        ];
        let mut w = head.map(|h| h.chars().count());
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut l = String::from(" ");
            for (i, c) in cells.iter().enumerate() {
                l.push_str(&format!(" {:<width$}", c, width = w[i]));
            }
            l.trim_end().to_string() + "\n"
        };
        out.push_str(&line(&head.map(String::from)));
        for r in &rows {
            out.push_str(&line(r));
        }
        out.push('\n');
        out.push_str(&match &self.etcd {
            Some(e) => format!(
                "etcd        {} members ({}), leader {}{}{}\n",
                e.members.len(),
                t(&e.members.join(", ")),
                t(e.leader.as_deref().unwrap_or("unknown")),
                if e.learners.is_empty() {
                    String::new()
                } else {
                    format!("; learners: {}", t(&e.learners.join(", ")))
                },
                if e.unhealthy.is_empty() {
                    "; all healthy".to_string()
                } else {
                    format!("; UNHEALTHY: {}", t(&e.unhealthy.join(", ")))
                },
            ),
            None => "etcd        not read (no talosconfig)\n".into(),
        });
        out.push_str(&match &self.cni {
            Some(c) => format!(
                "CNI         {}/{} {} ({}/{} updated, {} ready)\n",
                t(&c.namespace),
                t(&c.name),
                t(c.version.as_deref().unwrap_or("(version unknown)")),
                c.updated,
                c.desired,
                c.ready
            ),
            None => "CNI         not found\n".into(),
        });
        out.push_str(&match &self.handover {
            Some(h) => format!(
                "hand-over   Argo CD {}, {} ({})\n",
                t(&h.sync),
                t(&h.health),
                if h.complete() {
                    "complete"
                } else {
                    "NOT complete"
                }
            ),
            None => "hand-over   none configured (or not read)\n".into(),
        });
        let removed: Vec<String> = self
            .removed_apis_in_use
            .iter()
            .map(|a| {
                format!(
                    "{}/{} {} (removed in {})",
                    a.group,
                    a.version,
                    a.resource,
                    a.removed_release.as_deref().unwrap_or("?")
                )
            })
            .collect();
        // What could not be read is said so, never as "none" or "free" (the error follows).
        out.push_str(&format!(
            "removed APIs requested  {}\n",
            if self.errors.contains_key("removedApis") {
                "unknown (could not be read)".to_string()
            } else if removed.is_empty() {
                "none".to_string()
            } else {
                t(&removed.join("; "))
            }
        ));
        out.push_str(&match &self.rollout_lock {
            _ if self.errors.contains_key("rolloutLock") => {
                "rollout lock  unknown (could not be read)\n".into()
            }
            Some(h) => format!("rollout lock  held by {}\n", t(&h.holder)),
            None => "rollout lock  free\n".into(),
        });
        if !self.volumes.is_empty() {
            let degraded: Vec<&str> = self
                .volumes
                .iter()
                .filter(|v| v.degraded())
                .map(|v| v.name.as_str())
                .collect();
            out.push_str(&format!(
                "volumes     {} ({} not healthy{})\n",
                self.volumes.len(),
                degraded.len(),
                if degraded.is_empty() {
                    String::new()
                } else {
                    format!(": {}", t(&degraded.join(", ")))
                }
            ));
        }
        for (k, e) in &self.errors {
            out.push_str(&format!("could not read {k}: {}\n", t(e)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    /// Issue 43 F10: a lock or removed-API list that could not be read is never shown as
    /// "free" or "none".
    #[test]
    fn status_never_says_free_or_none_for_what_it_could_not_read() {
        let mut errors = std::collections::BTreeMap::new();
        errors.insert("rolloutLock", "unreachable".to_string());
        errors.insert("removedApis", "unreachable".to_string());
        let r = StatusReport {
            api_version: "v",
            kind: "StatusReport",
            cluster: None,
            nodes: vec![],
            volumes: vec![],
            etcd: None,
            cni: None,
            handover: None,
            removed_apis_in_use: vec![],
            rollout_lock: None,
            errors,
        };
        let text = r.render_text();
        assert!(!text.contains("lock  free"), "{text}");
        assert!(!text.contains("requested  none"), "{text}");
        assert!(text.contains("rollout lock  unknown"), "{text}");
    }

    use super::*;

    fn node(name: &str, role: Role, talos: &str, kubelet: &str, volumes: &[&str]) -> Node {
        Node {
            name: name.into(),
            role,
            talos: Version::parse(talos).unwrap(),
            kubelet: Version::parse(kubelet).unwrap(),
            volumes: volumes.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn drift_names_every_disagreement() {
        let listed = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5", &[]),
            node("w-1", Role::Worker, "v1.12.6", "v1.33.5", &["pvc-a"]),
            node("w-gone", Role::Worker, "v1.12.6", "v1.33.5", &[]),
        ];
        let live = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5", &[]),
            node(
                "w-1",
                Role::Worker,
                "v1.12.4",
                "v1.32.9",
                &["pvc-a", "pvc-b"],
            ),
            node("w-new", Role::Worker, "v1.12.6", "v1.33.5", &[]),
        ];
        let d = inventory_drift(&listed, &live);
        assert_eq!(d.len(), 5, "{d:?}");
        assert!(
            d.iter()
                .any(|l| l == "w-1: runs Talos v1.12.4, spec.inventory says v1.12.6"),
            "{d:?}"
        );
        assert!(
            d.iter().any(|l| l.contains("w-1: runs kubelet v1.32.9")),
            "{d:?}"
        );
        assert!(
            d.iter().any(|l| l.contains("holds volumes [pvc-a, pvc-b]")),
            "{d:?}"
        );
        assert!(
            d.iter()
                .any(|l| l == "w-gone is in spec.inventory but not in the cluster"),
            "{d:?}"
        );
        assert!(
            d.iter()
                .any(|l| l == "w-new runs in the cluster but is not in spec.inventory"),
            "{d:?}"
        );
        assert!(inventory_drift(&listed[..1], &live[..1]).is_empty());
    }

    #[test]
    fn etcd_with_too_few_members_warns_and_a_learner_waits() {
        let member = |id, name: &str, learner| EtcdMember {
            id,
            hostname: name.into(),
            peer_urls: vec![],
            is_learner: learner,
        };
        let status = |id| EtcdStatus {
            member_id: id,
            leader: 1,
            is_learner: false,
            errors: vec![],
            version: String::new(),
        };
        let one = EtcdView {
            members: vec![member(1, "cp-1", false)],
            statuses: vec![("cp-1".into(), Ok(status(1)))],
            addresses: vec![],
        };
        assert_eq!(etcd_item(&Ok(one.clone())).status, Status::Warn);
        // Two: the rollout will not take either down, and the gate says so.
        let mut two = one;
        two.members.push(member(2, "cp-2", false));
        two.statuses.push(("cp-2".into(), Ok(status(2))));
        let item = etcd_item(&Ok(two));
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert!(item.message.contains("loses quorum"), "{}", item.message);
        let learner = EtcdView {
            members: vec![
                member(1, "cp-1", false),
                member(2, "cp-2", false),
                member(3, "cp-3", true),
            ],
            // Every member answers (a member no control plane answers for is stale).
            statuses: vec![
                ("cp-1".into(), Ok(status(1))),
                ("cp-2".into(), Ok(status(2))),
                (
                    "cp-3".into(),
                    Ok(EtcdStatus {
                        is_learner: true,
                        ..status(3)
                    }),
                ),
            ],
            addresses: vec![],
        };
        let item = etcd_item(&Ok(learner));
        assert_eq!(item.status, Status::Wait);
        assert!(item.message.contains("cp-3"), "{}", item.message);
        assert_eq!(etcd_item(&Err("down".into())).status, Status::Wait);
    }

    #[test]
    fn a_stale_member_counts_for_quorum_and_is_named() {
        let member = |id, name: &str| EtcdMember {
            id,
            hostname: name.into(),
            peer_urls: vec![format!("https://10.0.0.{id}:2380")],
            is_learner: false,
        };
        let status = |id| EtcdStatus {
            member_id: id,
            leader: 1,
            is_learner: false,
            errors: vec![],
            version: String::new(),
        };
        // Four members, three machines: with one of them down, 2 of 4 is no quorum.
        let view = EtcdView {
            members: vec![
                member(1, "cp-1"),
                member(2, "cp-2"),
                member(3, "cp-3"),
                member(4, "cp-old"),
            ],
            statuses: vec![
                ("cp-1".into(), Ok(status(1))),
                ("cp-2".into(), Ok(status(2))),
                ("cp-3".into(), Ok(status(3))),
            ],
            addresses: (1..=3)
                .map(|i| (format!("cp-{i}"), format!("10.0.0.{i}")))
                .collect(),
        };
        let why = view.may_take_down("cp-1", false).unwrap_err();
        assert!(
            why.contains("cp-old") && why.contains("answers nothing"),
            "{why}"
        );
        let item = etcd_item(&Ok(view.clone()));
        assert_eq!(item.status, Status::Fail);
        assert!(item.message.contains("cp-old"), "{}", item.message);
        // Healthy three: one may go.
        let mut three = view.clone();
        three.members.pop();
        assert_eq!(three.may_take_down("cp-1", false), Ok(()));
        // Two members: either down loses quorum.
        let mut two = three.clone();
        two.members.pop();
        two.statuses.pop();
        assert!(two
            .may_take_down("cp-1", false)
            .unwrap_err()
            .contains("quorum needs 2"));
        // One member: nothing to keep.
        let mut one = two.clone();
        one.members.pop();
        one.statuses.pop();
        assert_eq!(one.may_take_down("cp-1", false), Ok(()));
        // A repeat after a restart: the node itself may already be down.
        let mut going = three.clone();
        going.statuses[0] = ("cp-1".into(), Err("unavailable".into()));
        assert!(going.may_take_down("cp-1", false).is_err());
        assert_eq!(going.may_take_down("cp-1", true), Ok(()));
        // ... but a node whose member cannot be told apart is never let down.
        going.addresses.clear();
        assert!(going
            .may_take_down("cp-1", true)
            .unwrap_err()
            .contains("cannot tell"));
    }

    /// Nodes registered under their FQDN (`registerWithFQDN`) or lower-cased from a
    /// capitalised hostname never match their member by name; the member id each reports,
    /// or its address in the peer URLs, finds it.
    #[test]
    fn a_node_is_matched_to_its_member_by_identity_not_by_name() {
        let member = |id, name: &str| EtcdMember {
            id,
            hostname: name.into(),
            peer_urls: vec![format!("https://[fd00::{id}]:2380")],
            is_learner: false,
        };
        let status = |id| EtcdStatus {
            member_id: id,
            leader: 2,
            is_learner: false,
            errors: vec![],
            version: String::new(),
        };
        let fqdn = |i| format!("cp-{i}.example.org");
        let view = EtcdView {
            members: vec![member(1, "CP-1"), member(2, "CP-2")],
            statuses: vec![(fqdn(1), Ok(status(1))), (fqdn(2), Ok(status(2)))],
            addresses: vec![(fqdn(1), "fd00::1".into()), (fqdn(2), "fd00:0::2".into())],
        };
        // Two members: the node's own member counts as going, so quorum would be lost.
        let why = view.may_take_down(&fqdn(1), false).unwrap_err();
        assert!(why.contains("quorum needs 2"), "{why}");
        assert_eq!(view.leader_node(), Some(fqdn(2).as_str()));
        assert_eq!(view.member_of(&fqdn(2)).map(|m| m.id), Some(2));
        // Three, one of them on its way down after a restart: found by its peer URL, it
        // is the one allowed not to answer.
        let mut three = view.clone();
        three.members.push(member(3, "CP-3"));
        three.statuses.push((fqdn(3), Ok(status(3))));
        three.addresses.push((fqdn(3), "fd00::3".into()));
        three.statuses[0].1 = Err("unavailable".into());
        assert_eq!(three.may_take_down(&fqdn(1), true), Ok(()));
        assert!(three.stale_members().is_empty());
        // An unhealthy other member still stops it.
        three.statuses[2].1 = Ok(EtcdStatus {
            errors: vec!["slow disk".into()],
            ..status(3)
        });
        let why = three.may_take_down(&fqdn(1), true).unwrap_err();
        assert!(why.contains("CP-3 (slow disk)"), "{why}");
    }
}
