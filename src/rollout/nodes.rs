//! What every node step shares: the live node, the right to start (pause, window, hold),
//! the observation the steps decide from, the step's start marker, the drain, and giving
//! nodes back on a pause.

use std::time::Duration;

use super::step::{self, NodeObservation, StepMarker};
use super::{stage_key, window, Flow, Progress, Run, PULL_DEADLINE, WAIT_EVERY};
use crate::kube::{DrainOptions, DrainOutcome, LiveNode, LiveVolume};
use crate::plan::StageId;
use crate::releaseset::{Role, Version, VolumeProvider};
use crate::talos::client::CallOptions;

/// The options of an image pull on `node`.
pub(super) fn pulling(node: &LiveNode) -> CallOptions<'_> {
    CallOptions {
        deadline: PULL_DEADLINE,
        ..around(node)
    }
}

/// Calls about a control plane never travel through it: it is the one that reboots. A
/// worker is no endpoint that forwards (apid on a worker refuses to), so nothing is
/// avoided for it, and the client need not ask each endpoint who it is (two etcd calls
/// per endpoint behind a VIP).
pub(super) fn around(node: &LiveNode) -> CallOptions<'_> {
    CallOptions {
        avoid: (node.role == Role::Controlplane).then_some(node.name.as_str()),
        ..CallOptions::default()
    }
}

pub(super) fn address(node: &LiveNode) -> String {
    node.internal_ip
        .clone()
        .unwrap_or_else(|| node.name.clone())
}

/// What a step knows of its next look before making it: what the look then reads
/// alongside the Talos API instead of after its answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Before<'o> {
    /// Nothing: the Talos API first, then what its answer says to read.
    Unknown,
    /// The step has not begun: the only question is whether the node is done already,
    /// which needs the target Talos, so a node that reports another reads nothing more
    /// (its Node, pods and volumes are read once it has begun).
    Start,
    /// The step has just begun: the node is about to be drained, so its Node, pods and
    /// volumes are read.
    Begun,
    /// The step's last look: this one likely reads what it read.
    Look(&'o NodeObservation),
}

impl Run<'_, '_> {
    /// What ichor's cordon mark says on a node this rollout cordoned: its target commit.
    pub(super) fn rollout_id(&self) -> &str {
        &self.target.commit
    }

    /// This rollout cordoned `node` (an older mark, or someone else's cordon, is not ours).
    pub(super) fn ours(&self, node: &LiveNode) -> bool {
        node.cordoned && node.cordoned_for.as_deref() == Some(self.rollout_id())
    }

    /// A single-node cluster whose cluster.yaml accepts the downtime: its node is upgraded
    /// in place, without cordon or drain (judged from a node list already read).
    fn in_place_among(&self, nodes: &[LiveNode]) -> bool {
        self.engine.policy.accept_single_node_downtime && nodes.len() == 1
    }

    /// On a single-node cluster the drain evicts everything with nowhere to go, ichor
    /// included, and leaves the only node cordoned: refused before anything is touched,
    /// unless cluster.yaml accepts the downtime.
    pub(super) async fn single_node_accepted(&self, stage: StageId) -> Flow<()> {
        let nodes = self.live_nodes(stage).await?;
        if nodes.len() != 1 || self.engine.policy.accept_single_node_downtime {
            return Ok(());
        }
        Err(self.pause(
            stage,
            nodes.first().map(|n| n.name.as_str()),
            format!(
                "{} is the cluster's only node: draining it evicts every pod with nowhere to go (ichor included) and upgrading it takes everything down, nothing was changed; set spec.rollout.acceptSingleNodeDowntime: true in cluster.yaml to upgrade it in place without a drain, accepting the downtime",
                nodes.first().map_or("the node", |n| n.name.as_str())
            ),
        ))
    }

    pub(super) async fn live_nodes(&self, stage: StageId) -> Flow<Vec<LiveNode>> {
        self.kube(stage, None, "list nodes", || self.engine.kube.nodes())
            .await
    }

    /// One node, read by name: one object whatever the cluster's size.
    pub(super) async fn live_node(&self, stage: StageId, name: &str) -> Flow<LiveNode> {
        self.kube(stage, Some(name), "get node", || self.engine.kube.node(name))
            .await?
            .ok_or_else(|| {
                self.pause(
                    stage,
                    Some(name),
                    format!("node {name} is in the plan but not in the cluster; re-plan from the live inventory"),
                )
            })
    }

    /// Before a node starts: not paused, inside a window, not held. Waits are reported and
    /// recorded; a pause request stops here. `true`: it had to wait.
    pub(super) async fn may_start(&self, stage: StageId, node: &str) -> Flow<bool> {
        self.may_go(stage, node, true).await
    }

    /// The right to go on with a step on `node`: not paused, inside a window, not held,
    /// and, for a step that takes the node out (`disrupts`), within `maxUnavailable` and
    /// the volume rule. A step that takes nothing down (kube-proxy's switch, the manifest
    /// sync) still obeys the first three, as every step does. `true`: it had to wait.
    pub(super) async fn may_go(&self, stage: StageId, node: &str, disrupts: bool) -> Flow<bool> {
        let mut waited = false;
        loop {
            if let Some(why) = self.engine.pause_requested.and_then(|f| f()) {
                return Err(self.pause(stage, Some(node), why));
            }
            let sibling = self.halted.lock().ok().and_then(|h| h.clone());
            if let Some(why) = sibling {
                return Err(self.pause(
                    stage,
                    Some(node),
                    format!("{node} {} ({why})", super::SIBLING_STOPPED),
                ));
            }
            let now = self.now();
            if let window::WindowState::Closed { opens_at } =
                window::state(&self.engine.policy.maintenance_windows, now)
            {
                self.waiting(
                    stage,
                    Some(format!(
                        "{node} starts in the next maintenance window, {}",
                        window::describe(opens_at)
                    )),
                )
                .await?;
                let wait = opens_at.since(now).min(WAIT_EVERY * 10);
                self.engine
                    .clock
                    .sleep(wait.max(Duration::from_secs(1)))
                    .await;
                waited = true;
                continue;
            }
            let live = self.live_node(stage, node).await?;
            let broken = if disrupts {
                self.would_break_rules(stage, &live).await?
            } else {
                None
            };
            if let Some(wait) = broken {
                self.waiting(stage, Some(wait)).await?;
                self.engine.clock.sleep(WAIT_EVERY).await;
                waited = true;
                continue;
            }
            if let Some(reason) = &live.hold {
                self.waiting(
                    stage,
                    Some(format!(
                        "{node} is held ({}={}); remove the annotation to let it go",
                        crate::kube::HOLD,
                        crate::releaseset::excerpt(reason, 120)
                    )),
                )
                .await?;
                self.engine.clock.sleep(WAIT_EVERY).await;
                waited = true;
                continue;
            }
            self.waiting(stage, None).await?;
            return Ok(waited);
        }
    }

    /// Whether `node` starting now would put more workers out than `maxUnavailable`
    /// (counting those already NotReady or cordoned, by anyone) or take down a second
    /// holder of a volume, judged from live placement against every node that is down,
    /// cordoned, or begun in this run. `Some(why)` holds it; checked and recorded under
    /// one lock, so the nodes of a batch decide one after the other.
    pub(super) async fn would_break_rules(
        &self,
        stage: StageId,
        node: &LiveNode,
    ) -> Flow<Option<String>> {
        let mut active = self.active.lock().await;
        if active.contains(&node.name) {
            return Ok(None);
        }
        let nodes = self.live_nodes(stage).await?;
        let volumes = self.volumes_of(stage, &node.name, true, &[]).await?;
        let max = self.engine.max_unavailable();
        let why = super::pool::rule_verdict(node, &nodes, &volumes, &active, max)
            .map(super::pool::Held::reason);
        if why.is_none() {
            active.insert(node.name.clone());
        }
        Ok(why)
    }

    pub(super) async fn volumes(&self, stage: StageId) -> Flow<Vec<LiveVolume>> {
        match self.engine.volumes {
            VolumeProvider::Longhorn => {
                self.kube(stage, None, "list longhorn volumes", || {
                    self.engine.kube.longhorn_volumes()
                })
                .await
            }
            VolumeProvider::LocalPath => {
                self.kube(stage, None, "list local volumes", || {
                    self.engine.kube.local_volumes()
                })
                .await
            }
            VolumeProvider::None => Ok(vec![]),
        }
    }

    /// The volumes `node` holds a replica of (when `held`) and those named in `known`, each
    /// with all its replicas: what judging one node needs, read at the cost of that node's
    /// volumes.
    pub(super) async fn volumes_of(
        &self,
        stage: StageId,
        node: &str,
        held: bool,
        known: &[String],
    ) -> Flow<Vec<LiveVolume>> {
        match self.engine.volumes {
            VolumeProvider::Longhorn => {
                self.kube(
                    stage,
                    Some(node),
                    "list the node's longhorn volumes",
                    || {
                        self.engine
                            .kube
                            .longhorn_volumes_of(held.then_some(node), known)
                    },
                )
                .await
            }
            _ => self.volumes(stage).await,
        }
    }

    /// The node's Talos API at a look: its boot id and the version it runs (`None` each
    /// while it does not answer). On a boot already seen, the version is the one read on it
    /// (a node runs what it booted until it boots again); a new boot is asked afresh.
    async fn talos_look(
        &self,
        stage: StageId,
        node: &LiveNode,
    ) -> Flow<(Option<String>, Option<String>)> {
        let e = self.engine;
        let addr = address(node);
        let opts = around(node);
        // A node that does not answer is mid-reboot (or gone, which the timeout says); a
        // refused certificate is neither, and no wait changes it: said at once, as it is.
        let refused = |err: crate::talos::TalosError| {
            self.pause(
                stage,
                Some(&node.name),
                format!("the Talos API refuses ichor's credentials: {err}; renew the talosconfig ichor reads (docs/cluster-access.md), then resume"),
            )
        };
        let boot_id = match e.talos.boot_id(&addr, opts).await {
            Ok(b) => Some(b),
            Err(err) if err.refuses_credentials() => return Err(refused(err)),
            Err(_) => None,
        };
        let seen = boot_id.as_ref().and_then(|b| {
            let booted = self.booted.lock().ok()?;
            booted
                .get(&node.name)
                .filter(|(on, _)| on == b)
                .map(|(_, v)| v.clone())
        });
        let talos = match (&boot_id, seen) {
            (None, _) => None,
            (Some(_), Some(v)) => Some(v),
            (Some(b), None) => match e.talos.version(&addr, opts).await {
                Ok(v) => {
                    self.remember_boot(&node.name, b, &v.tag);
                    Some(v.tag)
                }
                Err(err) if err.refuses_credentials() => return Err(refused(err)),
                Err(_) => None,
            },
        };
        // A boot id without a version (down between the two calls) is a node not answering.
        let boot_id = talos.as_ref().and(boot_id);
        Ok((boot_id, talos))
    }

    /// The version `node` reported on boot `boot`: it runs it until it boots again.
    pub(super) fn remember_boot(&self, node: &str, boot: &str, tag: &str) {
        if let Ok(mut booted) = self.booted.lock() {
            booted.insert(node.to_string(), (boot.to_string(), tag.to_string()));
        }
    }

    /// A look's Kubernetes reads, asked together so a look costs the slowest of them, not
    /// their sum: the Node (and whether the node is upgraded in place), with `pods` the
    /// pods a drain would move, with `volumes` the node's volumes (`Some(held)`, as
    /// [`Run::volumes_of`] asks them). Never a list of every Node, but where the cluster's
    /// only node may be upgraded in place: a step looks every few seconds, and on 500 nodes
    /// such a list is megabytes.
    #[allow(clippy::type_complexity)] // three reads, each its own answer
    async fn kube_look(
        &self,
        stage: StageId,
        node: &LiveNode,
        marker: &StepMarker,
        pods: bool,
        volumes: Option<bool>,
    ) -> (
        Flow<(Option<LiveNode>, bool)>,
        Flow<Option<usize>>,
        Flow<Option<(bool, Vec<LiveVolume>)>>,
    ) {
        let e = self.engine;
        let name = node.name.as_str();
        let live = async {
            if e.policy.accept_single_node_downtime {
                let nodes = self.live_nodes(stage).await?;
                let in_place = self.in_place_among(&nodes);
                Ok((nodes.into_iter().find(|n| n.name == node.name), in_place))
            } else {
                let live = self
                    .kube(stage, Some(name), "get the node", || e.kube.node(name))
                    .await?;
                Ok((live, false))
            }
        };
        let pods = async {
            if pods {
                self.pods_to_move(stage, name).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let volumes = async {
            match volumes {
                Some(held) => self
                    .volumes_of(stage, name, held, &marker.volumes)
                    .await
                    .map(|v| Some((held, v))),
                None => Ok(None),
            }
        };
        tokio::join!(live, pods, volumes)
    }

    /// The pods on `name` a drain would move.
    async fn pods_to_move(&self, stage: StageId, name: &str) -> Flow<usize> {
        let pods = self
            .kube(stage, Some(name), "list the node's pods", || {
                self.engine.kube.pods_on(name)
            })
            .await?;
        Ok(pods.into_iter().filter(|p| !p.stays).count())
    }

    /// The node as a step decides from it; `before` says what the step knows of this look
    /// before it is made.
    pub(super) async fn observe(
        &self,
        stage: StageId,
        node: &LiveNode,
        marker: &StepMarker,
        before: Before<'_>,
    ) -> Flow<NodeObservation> {
        let e = self.engine;
        // A Talos step reads only what can change its next move (the rules in step.rs); a
        // kubelet's step (the components stage) reads the Node and its pods every time.
        let target = &self.target.talos;
        let talos_step = matches!(stage, StageId::Talos | StageId::Workers);
        let kubelet_tag = (stage == StageId::Workers).then(|| self.target.kubernetes.tag());
        let name = node.name.as_str();
        // A kubelet's step reads the Kubernetes side every time; a Talos step whenever the
        // node answers, before its upgrade is requested and once it runs the target
        // (`step::reads_kubernetes`). When the step expects that, both sides are asked at
        // once, so a look costs one round of requests, not two; the volumes too, when the
        // last look read them (or the step has just begun), asked as that look asked them.
        // A node that does not answer drops what was read alongside, and what the rules do
        // not read this time is not used.
        let (early, early_pods, early_volumes) = match before {
            Before::Unknown => (!talos_step || !marker.upgrade_requested, true, None),
            Before::Start => (false, false, None),
            Before::Begun => (true, true, Some(true)),
            Before::Look(o) => {
                let on_target = step::talos_at_target(o.talos.as_deref(), target) == Some(true);
                let early = !talos_step || !marker.upgrade_requested || on_target;
                let pods = !talos_step
                    || !on_target
                    || step::reads_pods(target, o, kubelet_tag.as_deref());
                let volumes = if talos_step {
                    step::reads_volumes(target, o, marker)
                } else {
                    o.pods_to_move > 0
                };
                let held = !talos_step || o.pods_to_move > 0;
                (early, pods, (early && volumes).then_some(held))
            }
        };
        let ((boot_id, talos), early_reads) = if early {
            // Boxed, as the reads of every look: a debug build's worker stack holds each
            // future's frame.
            let kube = Box::pin(self.kube_look(stage, node, marker, early_pods, early_volumes));
            let (talos, kube) = tokio::join!(self.talos_look(stage, node), kube);
            (talos?, Some(kube))
        } else {
            (self.talos_look(stage, node).await?, None)
        };
        let not_done = matches!(before, Before::Start)
            && step::talos_at_target(talos.as_deref(), target) == Some(false);
        if talos_step && (not_done || !step::reads_kubernetes(target, talos.as_deref(), marker)) {
            // Not begun and not on the target, or down, or installing and rebooting:
            // whether it is done, or whether it rebooted, is all that decides.
            return Ok(NodeObservation {
                boot_id,
                ..NodeObservation::unread(talos)
            });
        }
        let on_talos_target =
            talos_step && step::talos_at_target(talos.as_deref(), target) == Some(true);
        let (live, pods_read, volumes_read) = match early_reads {
            Some((live, pods, volumes)) => (live?, pods?, volumes?),
            None => {
                let (live, pods_now, _) =
                    Box::pin(self.kube_look(stage, node, marker, !on_talos_target, None)).await;
                (live?, pods_now?, None)
            }
        };
        let (live, in_place) = live;
        // Ready only from a kubelet heard since this boot: after a reboot the Node's Ready
        // stays the pre-reboot one until the node-monitor grace period passes, and the
        // kubelet reports the boot it runs on in `nodeInfo.bootID` (kubernetes/kubernetes
        // pkg/kubelet/nodestatus/setters.go at v1.33.0, `MachineInfo`).
        let ready = live
            .as_ref()
            .is_some_and(|n| n.ready && boot_id.as_deref().is_none_or(|b| n.boot_id == b));
        let mut obs = NodeObservation {
            boot_id,
            ready,
            cordoned: live.as_ref().is_some_and(|n| n.cordoned),
            cordoned_by_ichor: live.as_ref().is_some_and(|n| self.ours(n)),
            in_place,
            kubelet: live.as_ref().map(|n| n.kubelet.clone()).unwrap_or_default(),
            ..NodeObservation::unread(talos)
        };
        // Off the Talos target the pods always count; on it, as the rule says.
        let pods_count = !on_talos_target || step::reads_pods(target, &obs, kubelet_tag.as_deref());
        obs.pods_to_move = match pods_read {
            Some(n) if pods_count => n,
            None if pods_count => self.pods_to_move(stage, name).await?,
            _ => 0,
        };
        let volumes = async {
            let wanted = if talos_step {
                step::reads_volumes(target, &obs, marker)
            } else {
                obs.pods_to_move > 0
            };
            // What the node holds now matters only while its pods are still to move (a
            // healthy copy elsewhere?); afterwards only the volumes its start held.
            let held = !talos_step || obs.pods_to_move > 0;
            match volumes_read {
                _ if !wanted => Ok(Vec::new()),
                Some((read_held, read)) if read_held == held => Ok(read),
                _ => self.volumes_of(stage, name, held, &marker.volumes).await,
            }
        };
        let attachments = async {
            if talos_step && step::reads_attachments(target, &obs, marker) {
                self.kube(stage, Some(name), "list volume attachments", || {
                    e.kube.volume_attachments(name)
                })
                .await
            } else {
                Ok(Vec::new())
            }
        };
        let (volumes, attachments) = tokio::join!(volumes, attachments);
        let (volumes, attachments) = (volumes?, attachments?);
        obs.unprotected_volumes = volumes
            .iter()
            .filter(|v| v.nodes.iter().any(|n| n == name) && !v.single_replica)
            .filter(|v| {
                let elsewhere = v.nodes.iter().any(|n| n != name);
                let healthy = !v.degraded();
                !(elsewhere && healthy)
            })
            .map(|v| v.name.clone())
            .collect();
        obs.degraded_volumes = marker
            .volumes
            .iter()
            .filter(|want| {
                volumes
                    .iter()
                    .any(|v| &v.name == *want && (v.nodes.is_empty() || v.degraded()))
            })
            .cloned()
            .collect();
        obs.attachments = attachments;
        Ok(obs)
    }

    /// Begin a node's step: wait for the right to start, then record the marker. Says
    /// which single-replica volumes go down with it.
    pub(super) async fn begin(
        &self,
        stage: StageId,
        key: &str,
        node: &LiveNode,
        marker: &mut StepMarker,
    ) -> Flow<()> {
        if marker.started_at.is_some() {
            return Ok(());
        }
        // The right to start, the node's volumes and its boot id, asked together: one
        // round of requests instead of three in a row. What is recorded must be read once
        // the start is granted, so a start that had to wait (a window, a hold, the rules)
        // reads them again.
        let need_boot = marker.boot_id_before.is_none();
        let boot_id = || async {
            if need_boot {
                self.engine
                    .talos
                    .boot_id(&address(node), around(node))
                    .await
                    .ok()
            } else {
                None
            }
        };
        let volumes = || self.volumes_of(stage, &node.name, true, &[]);
        // Boxed: the right to start reads nodes and volumes itself, and a debug build's
        // worker stack holds each future's frame.
        let (waited, volumes_now, boot_now) = tokio::join!(
            Box::pin(self.may_start(stage, &node.name)),
            volumes(),
            boot_id()
        );
        let (volumes, boot_id) = if waited? {
            tokio::join!(volumes(), boot_id())
        } else {
            (volumes_now, boot_now)
        };
        let volumes = volumes?;
        let held: Vec<&LiveVolume> = volumes
            .iter()
            .filter(|v| v.nodes.iter().any(|n| n == &node.name))
            .collect();
        for v in held.iter().filter(|v| v.single_replica) {
            self.say(Progress::Note(format!(
                "{}: volume {} has its only replica here; its workload is down until the node is back",
                node.name, v.name
            )));
        }
        let now = self.now();
        marker.started_at = Some(now);
        if let Ok(mut eta) = self.eta.lock() {
            eta.unit_started(stage, &node.name, now);
        }
        marker.volumes = held
            .iter()
            .filter(|v| !v.single_replica)
            .map(|v| v.name.clone())
            .collect();
        if need_boot {
            marker.boot_id_before = boot_id;
        }
        self.store_marker(stage, key, marker).await
    }

    /// A step an earlier run began, seen now: whether it has disrupted nothing yet (ichor
    /// has not cordoned its node and asked no upgrade). Such a step was only recorded (a
    /// pause in its pre-pull or drain gives the node back, a kill can land before the
    /// cordon), so it earns its start again as a fresh one does.
    pub(super) fn undisrupted(&self, obs: &NodeObservation, marker: &StepMarker) -> bool {
        marker.started_at.is_some() && !marker.upgrade_requested && !obs.cordoned_by_ichor
    }

    /// A begun but undisrupted step judged again, before its first disruptive act, by every
    /// rule a fresh start obeys: a pause request, the window, holds, `maxUnavailable` and
    /// the volume rule (a control plane's etcd is judged at its cordon, as always). Waiting
    /// for the right re-bases its deadline, as a fresh start's begins once it is granted.
    /// `true`: it had to wait (what was observed before is stale).
    pub(super) async fn judge_again(
        &self,
        stage: StageId,
        key: &str,
        node: &str,
        marker: &mut StepMarker,
    ) -> Flow<bool> {
        let waited = Box::pin(self.may_start(stage, node)).await?;
        if waited {
            marker.started_at = Some(self.now());
            self.store_marker(stage, key, marker).await?;
        }
        Ok(waited)
    }

    /// Evict what must move, or pause naming the pod and its budget. Never deletes, never
    /// forces.
    pub(super) async fn drain(
        &self,
        stage: StageId,
        name: &str,
        wake: Option<&crate::kube::changes::Changes>,
    ) -> Flow<()> {
        let e = self.engine;
        let outcome = loop {
            let drain = Box::pin(self.kube_run(stage, Some(name), "drain", || {
                e.kube.drain(
                    name,
                    e.policy.drain_timeout.as_duration(),
                    &e.clock,
                    DrainOptions {
                        evict_unmanaged_pods: e.policy.drain.evict_unmanaged_pods,
                        delete_empty_dir_data: e.policy.drain.delete_empty_dir_data,
                        own_pod: e.own_pod.clone(),
                    },
                    wake,
                )
            }));
            // No eviction once the lock went unrenewed past its renew deadline (another
            // engine may hold it by now): the drain stops where it is, and goes on (it
            // lists the node afresh) only once the lock is renewed and still ours.
            let lapsed = async {
                loop {
                    e.clock.sleep(super::LEASE_LOOK_EVERY).await;
                    if !e.lease_fresh() {
                        return;
                    }
                }
            };
            tokio::select! {
                r = drain => break r?,
                () = lapsed => self.check_lock(stage, name).await?,
            }
        };
        match outcome {
            DrainOutcome::Refused { pods } => {
                let unmanaged = pods.iter().any(|(_, why)| why.contains("no controller"));
                let empty_dir = pods.iter().any(|(_, why)| why.contains("emptyDir"));
                let keys: Vec<&str> = [
                    (unmanaged, "spec.rollout.drain.evictUnmanagedPods: true"),
                    (empty_dir, "spec.rollout.drain.deleteEmptyDirData: true"),
                ]
                .into_iter()
                .filter_map(|(on, k)| on.then_some(k))
                .collect();
                let named: Vec<String> = pods
                    .iter()
                    .take(10)
                    .map(|(p, why)| format!("{p} ({why})"))
                    .collect();
                Err(self.pause(
                    stage,
                    Some(name),
                    format!(
                        "the drain of {name} would evict {}{}, which kubectl drain refuses too; nothing was evicted — move or delete {} yourself and resume, or accept the loss with {} in cluster.yaml on the protected branch, then resume from that commit (ichor rollout --resume --rev main; under ichor run the merge carries the rollout on)",
                        named.join(", "),
                        if pods.len() > 10 { format!(" and {} more", pods.len() - 10) } else { String::new() },
                        if pods.len() == 1 { "it" } else { "them" },
                        keys.join(" and ")
                    ),
                ))
            }
            DrainOutcome::Drained { evicted } => {
                self.say(Progress::Note(format!(
                    "{} {name}: drained ({} pod{} evicted)",
                    stage_key(stage),
                    evicted.len(),
                    if evicted.len() == 1 { "" } else { "s" }
                )));
                Ok(())
            }
            DrainOutcome::Appeared { pods } => {
                let named: Vec<String> = pods
                    .iter()
                    .take(10)
                    .map(|(p, why)| format!("{p} ({why})"))
                    .collect();
                Err(self.pause(
                    stage,
                    Some(name),
                    format!(
                        "during the drain of {name}, {}{} came onto the node, which kubectl drain refuses to evict; left where {} — move or delete {} yourself, then resume",
                        named.join(", "),
                        if pods.len() > 10 { format!(" and {} more", pods.len() - 10) } else { String::new() },
                        if pods.len() == 1 { "it is" } else { "they are" },
                        if pods.len() == 1 { "it" } else { "them" },
                    ),
                ))
            }
            DrainOutcome::MultipleBudgets { pod, budgets } => Err(self.pause(
                stage,
                Some(name),
                format!(
                    "{pod} is selected by more than one PodDisruptionBudget ({}): the Eviction API never evicts such a pod, and ichor never deletes or forces one — make one budget cover it, then resume",
                    if budgets.is_empty() { "the API did not say which".to_string() } else { budgets.join(", ") }
                ),
            )),
            DrainOutcome::Blocked {
                pod,
                budget,
                message,
                waited_secs,
            } => Err(self.pause(
                stage,
                Some(name),
                match budget {
                    Some(b) => format!(
                        "the drain waited {waited_secs}s on {pod} (PodDisruptionBudget {b}): {message}; ichor never deletes or forces a pod — let the budget allow it (scale up, or fix the unhealthy replica), then resume"
                    ),
                    None if message.starts_with("the Eviction API refused it") => format!(
                        "the drain waited {waited_secs}s on {pod}: {message}; ichor never deletes or forces a pod — fix what the refusal names (a budget the disruption controller has not caught up with, a namespace being deleted), then resume"
                    ),
                    None => format!(
                        "the drain waited {waited_secs}s on {pod}: {message}; ichor never deletes or forces a pod — stop what puts pods back on the cordoned node (a toleration of node.kubernetes.io/unschedulable, a node pinning) or let them finish terminating, then resume"
                    ),
                },
            )),
        }
    }

    /// On a pause: nodes ichor cordoned that are Ready and not mid-upgrade go back into
    /// service, so a paused cluster runs at full capacity.
    pub(super) async fn release_nodes(&self) {
        let e = self.engine;
        let Ok(nodes) = e.kube.nodes().await else {
            return;
        };
        let steps = self.stored.lock().await.record.steps.clone();
        for n in nodes.iter().filter(|n| self.ours(n) && n.ready) {
            // Mid-upgrade: the Talos upgrade was requested and the node is not back on
            // the target yet; it stays out of service until it is.
            let mid = ["talos", "worker"].iter().any(|prefix| {
                steps.get(&format!("{prefix}/{}", n.name)).is_some_and(|s| {
                    s.upgrade_requested
                        && s.finished_at.is_none()
                        && n.talos
                            .as_deref()
                            .and_then(|t| Version::parse(t).ok())
                            .as_ref()
                            != Some(&self.target.talos)
                })
            });
            if !mid {
                let _ = e.kube.uncordon(&n.name, self.rollout_id()).await;
                self.say(Progress::Note(format!(
                    "{}: uncordoned while paused",
                    n.name
                )));
            }
        }
    }
}
