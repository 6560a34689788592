//! Stage 1, Talos: each node driven by [`super::step::talos_node`] from what is observed —
//! pre-pull, cordon, drain, upgrade (LifecycleService then Reboot on ≥ 1.13,
//! MachineService/Upgrade before), reboot, back Ready, uncordon — with etcd checked and
//! leadership moved off before a control plane goes down.

use super::nodes::{address, around, pulling, Before};
use super::step::{self, Action, StepState};
use super::{step_prefix, Flow, Progress, Run};
use crate::kube::changes::{Changes, Scope};
use crate::kube::LiveNode;
use crate::plan::StageId;
use crate::releaseset::Role;
use crate::talos::client::{CallOptions, ImageNamespace, MachineConfig, UpgradeApi};
use crate::talos::machine_config::{set_images, Component};

/// What a Talos node's step decides from; `kubelet` only in the one-drain worker stage.
struct Observed {
    node: step::NodeObservation,
    kubelet: Option<step::KubeletObservation>,
}

/// How many nodes pull their installer at once before the Talos stage: enough to take the
/// pulls off the critical path, few enough not to flood a registry or the nodes' uplinks.
const PRE_PULL_AHEAD: usize = 4;

/// Pulls ahead recorded in one write of the rollout record.
const PRE_PULLS_PER_WRITE: usize = 32;

/// The least time between two looks of a step woken by changes: a burst of them (a
/// drain's pods going) is one look.
const LOOK_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// Beats a settling step lets pass without a change before it looks anyway: what it waits
/// for may change where no watch sees (a node's Talos API coming back, a replica rebuilt
/// on another node), and a watch may miss what it should see.
const QUIET_BEATS: u32 = 12;

/// What an upgrade request does about the install (Talos ≥ 1.13), judged from the boot
/// the node runs and the step's marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Install {
    /// Talos ≤ 1.12: the legacy Upgrade installs and reboots in one call.
    NotHere,
    /// Installed (exit code 0) on this boot: a reboot is all it needs.
    Done,
    /// Sent on this boot, its end unknown: wait for it to exit, then reboot.
    Sent,
    /// Nothing sent on this boot (the boot it goes on, recorded before the call).
    Send(String),
}

impl Run<'_, '_> {
    /// Before any node goes down: the installer pulled on every node still to upgrade, a few
    /// at a time, so no node's turn waits on its pull (the pull moves nothing; each is
    /// recorded as `prePulled` in the node's step, which has not begun, a batch of them per
    /// write). A pull that fails here is only said: the node's own step pulls again, and
    /// pauses on a failure before anything is disrupted.
    pub(super) async fn pre_pull_ahead(
        &self,
        stage: StageId,
        steps: &[crate::plan::Step],
    ) -> Flow<()> {
        use futures_util::stream::{self, StreamExt};
        let prefix = step_prefix(stage);
        let e = self.engine;
        let target = &self.target.talos;
        let nodes: Vec<&str> = steps
            .iter()
            .flat_map(|s| s.nodes.iter().map(String::as_str))
            .collect();
        let mut todo = Vec::new();
        for name in nodes {
            let m = self.marker(&format!("{prefix}/{name}")).await;
            if !m.pre_pulled && m.started_at.is_none() {
                todo.push(name.to_string());
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        let live = self.live_nodes(stage).await?;
        let mut pulls = stream::iter(todo)
            .map(|name: String| {
                let live = &live;
                async move {
                    // The node's own step says it is gone.
                    let node = live.iter().find(|n| n.name == name)?;
                    let addr = address(node);
                    let v = e.talos.version(&addr, around(node)).await.ok()?;
                    if crate::releaseset::Version::parse(&v.tag).ok().as_ref() == Some(target) {
                        return None;
                    }
                    // A failure is said by the node's own step.
                    let installer = self.installer(stage, node).await.ok()?;
                    match e
                        .talos
                        .pull_image(&addr, &installer, ImageNamespace::System, v.upgrade_api, pulling(node))
                        .await
                    {
                        Ok(_) => {
                            self.say(Progress::Note(format!(
                                "{prefix} {name}: pre-pulled {installer} ahead of its turn"
                            )));
                            Some(name)
                        }
                        Err(err) => {
                            self.say(Progress::Note(format!(
                                "{prefix} {name}: pre-pulling {installer} ahead failed ({err}); its own step pulls again"
                            )));
                            None
                        }
                    }
                }
            })
            .buffer_unordered(PRE_PULL_AHEAD);
        // Recorded a batch at a time: each write is the whole record, which on 500 nodes is
        // large, and a pull lost to a restart is only pulled again (the image is there).
        let mut pulled = 0;
        let mut unrecorded: Vec<String> = Vec::new();
        while let Some(done) = pulls.next().await {
            unrecorded.extend(done);
            if unrecorded.len() >= PRE_PULLS_PER_WRITE {
                pulled += unrecorded.len();
                self.mark_pre_pulled(stage, std::mem::take(&mut unrecorded))
                    .await?;
            }
        }
        drop(pulls);
        pulled += unrecorded.len();
        self.mark_pre_pulled(stage, unrecorded).await?;
        if pulled > 0 {
            self.say(Progress::Note(format!(
                "the installer is pulled ahead on {pulled} {}, {PRE_PULL_AHEAD} at a time",
                if pulled == 1 { "node" } else { "nodes" }
            )));
        }
        Ok(())
    }

    /// `prePulled` on the steps of `nodes` not begun, in one write.
    async fn mark_pre_pulled(&self, stage: StageId, nodes: Vec<String>) -> Flow<()> {
        if nodes.is_empty() {
            return Ok(());
        }
        let prefix = step_prefix(stage);
        self.write(stage, |r| {
            for name in &nodes {
                let m = r.steps.entry(format!("{prefix}/{name}")).or_default();
                if m.started_at.is_none() {
                    m.pre_pulled = true;
                }
            }
        })
        .await
    }

    /// Note on a step not begun what was done ahead of its turn, in one write: a step that
    /// began meanwhile keeps its own marker.
    async fn mark_ahead(
        &self,
        stage: StageId,
        key: &str,
        f: impl FnOnce(&mut super::record::StepRecord),
    ) -> Flow<()> {
        self.write(stage, |r| {
            let m = r.steps.entry(key.to_string()).or_default();
            if m.started_at.is_none() {
                f(m);
            }
        })
        .await
    }

    /// Drive one node to the target Talos (the Talos stage), or one worker to the target
    /// Talos and kubelet in one drain (the one-drain [`StageId::Workers`] stage). `seen`:
    /// the Node as the pool saw it when it started the step, read a moment ago (its name,
    /// role and address are what the step takes from it; every look reads it afresh).
    pub(super) async fn talos_node(
        &self,
        stage: StageId,
        name: &str,
        seen: Option<LiveNode>,
    ) -> Flow<()> {
        let e = self.engine;
        let target = &self.target.talos;
        let kubelet_tag = self.target.kubernetes.tag();
        let timeout = e.policy.node_timeout.as_duration();
        let prefix = step_prefix(stage);
        let key = format!("{prefix}/{name}");
        let node = match seen {
            Some(node) => node,
            None => self.live_node(stage, name).await?,
        };
        let mut marker = self.marker(&key).await;
        let decide = |obs: &Observed, marker: &step::StepMarker| match &obs.kubelet {
            Some(k) => step::worker_node(
                target,
                &kubelet_tag,
                name,
                &obs.node,
                k,
                marker,
                self.now(),
                timeout,
            ),
            None => step::talos_node(target, &obs.node, marker, self.now(), timeout),
        };
        let done = |what: &str| Progress::UnitDone {
            node: Some(name.to_string()),
            stage,
            what: format!("{prefix} {name}: {what}"),
        };
        let on = match stage {
            StageId::Workers => format!("on Talos {target} and kubelet {kubelet_tag}"),
            _ => format!("on {target}"),
        };
        let begun = marker.started_at.is_some();
        if !begun {
            let obs = self
                .observe_talos(stage, &node, &marker, Before::Start)
                .await?;
            if decide(&obs, &marker) == StepState::Done {
                self.say(done(&on));
                return Ok(());
            }
            Box::pin(self.begin(stage, &key, &node, &mut marker)).await?;
        }
        let first = if begun {
            Before::Unknown
        } else {
            Before::Begun
        };
        let mut obs = self.observe_talos(stage, &node, &marker, first).await?;
        if begun && decide(&obs, &marker) == StepState::Done {
            self.say(done(&on));
            return Ok(());
        }
        // Begun by an earlier run and nothing disrupted yet: it earns its start again (a
        // hold, a window, a pause, the rules may have changed while it was stopped).
        if begun
            && self.undisrupted(&obs.node, &marker)
            && Box::pin(self.judge_again(stage, &key, name, &mut marker)).await?
        {
            obs = self
                .observe_talos(stage, &node, &marker, Before::Unknown)
                .await?;
        }
        let installer = Box::pin(self.installer(stage, &node)).await?;
        let mut last_settling = String::new();
        // While it settles, the step looks when what it reads changes (its watches say so),
        // else after a quiet while: most looks of a waiting step used to find nothing.
        let changes = e.kube.changes_of(name, &marker.volumes, &e.clock);
        // Each action is boxed, as the looks are: inline, they all sat in this function's
        // poll frame, which a debug build's 2 MiB worker stack must hold.
        loop {
            match decide(&obs, &marker) {
                StepState::Done => {
                    self.finish_marker(stage, &key).await?;
                    self.say(done(&format!("{on}, Ready, back in service")));
                    return Ok(());
                }
                StepState::Failed(why) => return Err(self.pause(stage, Some(name), why)),
                StepState::Settling(w) => {
                    if w != last_settling {
                        self.say(Progress::Note(format!("{prefix} {name}: {w}")));
                        last_settling = w;
                    }
                    let scope = self.wakes_on(&obs.node, &marker, stage);
                    self.settle(&changes, scope).await;
                }
                StepState::Act(Action::PrePull) => {
                    Box::pin(self.pre_pull(stage, &node, &installer, &key, &mut marker)).await?;
                }
                StepState::Act(Action::Cordon) => {
                    // Judged before anything is disrupted: a control plane whose reboot
                    // would cost etcd its quorum is not even cordoned.
                    if node.role == Role::Controlplane {
                        Box::pin(self.etcd_may_lose(&node, false)).await?;
                    }
                    self.check_lock(stage, name).await?;
                    self.kube(stage, Some(name), "cordon", || {
                        e.kube.cordon(name, self.rollout_id())
                    })
                    .await?;
                    self.say(Progress::Note(format!("{prefix} {name}: cordoned")));
                }
                StepState::Act(Action::Drain) => {
                    self.check_lock(stage, name).await?;
                    Box::pin(self.drain(stage, name, Some(&changes))).await?;
                }
                StepState::Act(Action::SwitchKubelet) => {
                    Box::pin(self.switch(stage, &node, &[Component::Kubelet], "kubelet")).await?;
                }
                StepState::Act(Action::Upgrade) => {
                    Box::pin(self.request_upgrade(stage, &node, &installer, &key, &mut marker))
                        .await?;
                }
                StepState::Act(Action::Uncordon) => {
                    self.kube(stage, Some(name), "uncordon", || {
                        e.kube.uncordon(name, self.rollout_id())
                    })
                    .await?;
                }
            }
            // What changed so far, this look reads.
            changes.take();
            obs = self
                .observe_talos(stage, &node, &marker, Before::Look(&obs.node))
                .await?;
        }
    }

    /// What a settling step's next look would read, so what may change its next move: its
    /// Node always (reading only the Talos API while it reboots, the Node back and Ready
    /// says a look may find it up), the rest as the read rules say (`step::reads_*`).
    fn wakes_on(
        &self,
        obs: &step::NodeObservation,
        marker: &step::StepMarker,
        stage: StageId,
    ) -> Scope {
        let target = &self.target.talos;
        if !step::reads_kubernetes(target, obs.talos.as_deref(), marker) {
            return Scope::NODE;
        }
        let kubelet_tag = (stage == StageId::Workers).then(|| self.target.kubernetes.tag());
        Scope::NODE
            .and(
                Scope::PODS,
                step::reads_pods(target, obs, kubelet_tag.as_deref()),
            )
            .and(Scope::REPLICAS, step::reads_volumes(target, obs, marker))
            .and(
                Scope::ATTACHMENTS,
                step::reads_attachments(target, obs, marker),
            )
    }

    /// Wait for a settling step's next look: on a change to what it reads (at least
    /// [`LOOK_GAP`] after its last look, so a burst of changes is one look), else after
    /// [`QUIET_BEATS`] beats. Every part of a change a look judges is watched (a replica and
    /// then its volume are two changes), so nothing waits on a beat after a change. A node's
    /// timeout is judged at a look, so it is at most that late.
    async fn settle(&self, changes: &Changes, scope: Scope) {
        let e = self.engine;
        let last = e.clock.now();
        let quiet = async {
            for _ in 0..QUIET_BEATS {
                e.clock.sleep_to_beat(e.observe_every).await;
            }
        };
        let changed = tokio::select! {
            _ = quiet => false,
            _ = changes.changed(scope) => true,
        };
        let gap = e.clock.now().since(last);
        if changed && gap < LOOK_GAP {
            e.clock.sleep(LOOK_GAP - gap).await;
        }
    }

    /// The node as its Talos step sees it, and, in the one-drain stage, its kubelet: the
    /// Node's version and whether the active configuration names the target image (read
    /// only while the node answers and its kubelet is not on the target yet).
    async fn observe_talos(
        &self,
        stage: StageId,
        node: &LiveNode,
        marker: &step::StepMarker,
        before: Before<'_>,
    ) -> Flow<Observed> {
        // Boxed: a look's reads in flight together make a large future, and every step
        // awaits several looks (a debug build's worker stack would not hold it).
        let mut obs = Box::pin(self.observe(stage, node, marker, before)).await?;
        // Done needs Talos's own word too, read only when all else says done: on the
        // target, on a new boot, the Node Ready. A read that fails is a machine not
        // known ready.
        let rebooted =
            matches!((&marker.boot_id_before, &obs.boot_id), (Some(b), Some(n)) if b != n);
        if marker.started_at.is_some()
            && rebooted
            && obs.ready
            && step::talos_at_target(obs.talos.as_deref(), &self.target.talos) == Some(true)
        {
            obs.talos_unready = match self
                .engine
                .talos
                .machine_unready(&address(node), around(node))
                .await
            {
                Ok(unmet) => unmet,
                Err(err) => Some(format!("its MachineStatus could not be read: {err}")),
            };
        }
        if stage != StageId::Workers {
            return Ok(Observed {
                node: obs,
                kubelet: None,
            });
        }
        let tag = self.target.kubernetes.tag();
        let on_target = obs.ready && obs.kubelet == tag;
        // Whether the switch is done matters only when the Talos step is done or about to
        // upgrade (the switch comes first): read then only.
        let talos_move = step::talos_node(
            &self.target.talos,
            &obs,
            marker,
            self.now(),
            self.engine.policy.node_timeout.as_duration(),
        );
        // Read once per boot: a configuration seen naming the target on this boot is taken
        // to still name it until the node boots again (a new boot is read afresh).
        let seen_on_this_boot = || {
            let seen = self.switched_on.lock();
            seen.is_ok_and(|s| obs.boot_id.is_some() && s.get(&node.name) == obs.boot_id.as_ref())
        };
        let switched = on_target
            || (obs.talos.is_some()
                && step::reads_switched(&talos_move, on_target)
                && (seen_on_this_boot()
                    || match self
                        .engine
                        .talos
                        .machine_config(&address(node), around(node))
                        .await
                    {
                        Ok(mc) => {
                            let named = set_images(&mc.yaml, &tag, &[Component::Kubelet])
                                .is_ok_and(|e| e.is_noop());
                            if let (true, Some(boot), Ok(mut seen)) =
                                (named, &obs.boot_id, self.switched_on.lock())
                            {
                                seen.insert(node.name.clone(), boot.clone());
                            }
                            named
                        }
                        // Not answering now: the switch reads it again, and pauses if it
                        // cannot.
                        Err(_) => false,
                    }));
        Ok(Observed {
            node: obs,
            kubelet: Some(step::KubeletObservation {
                on_target,
                switched,
            }),
        })
    }

    /// The installer pulled on the node before anything is disrupted; a failure pauses.
    async fn pre_pull(
        &self,
        stage: StageId,
        node: &LiveNode,
        installer: &str,
        key: &str,
        marker: &mut step::StepMarker,
    ) -> Flow<()> {
        let name = node.name.as_str();
        let api = self.upgrade_api(stage, node).await?;
        if let Err(err) = self
            .engine
            .talos
            .pull_image(
                &address(node),
                installer,
                ImageNamespace::System,
                api,
                pulling(node),
            )
            .await
        {
            return Err(self.pause(
                stage,
                Some(name),
                format!("pre-pulling {installer} failed, nothing was disrupted: {err}"),
            ));
        }
        marker.pre_pulled = true;
        self.store_marker(stage, key, marker).await?;
        self.say(Progress::Note(format!(
            "{} {name}: pre-pulled {installer}",
            step_prefix(stage)
        )));
        Ok(())
    }

    /// Ask the node to upgrade: etcd judged again (a control plane), the lock checked, the
    /// request recorded before the call (a restart then knows the node may be going), then
    /// the call. A repeat after a restart may meet the node already on its way down.
    async fn request_upgrade(
        &self,
        stage: StageId,
        node: &LiveNode,
        installer: &str,
        key: &str,
        marker: &mut step::StepMarker,
    ) -> Flow<()> {
        let name = node.name.as_str();
        let target = &self.target.talos;
        // Judged again before every call, a repeat after a restart too (the cluster may
        // have changed meanwhile); on a repeat the node itself may already be going down.
        let again = marker.upgrade_requested;
        if node.role == Role::Controlplane {
            self.etcd_ready_for(node, again).await?;
        }
        self.check_lock(stage, name).await?;
        let api = match self.upgrade_api(stage, node).await {
            Ok(api) => api,
            // Gone between the look and the act: the first request reached it.
            Err(_) if again => {
                marker.upgrade_confirmed = true;
                return Ok(());
            }
            Err(stop) => return Err(stop),
        };
        // On Talos ≥ 1.13 at most one install reaches a node per boot: the boot is read
        // first, and an install already sent on it (ahead, or by an engine that stopped
        // mid-call) is waited for and rebooted into, never sent again.
        let install = match api {
            UpgradeApi::Machine => Install::NotHere,
            UpgradeApi::Lifecycle => {
                let boot = match self
                    .engine
                    .talos
                    .boot_id(&address(node), around(node))
                    .await
                {
                    Ok(b) => b,
                    Err(_) if again => {
                        marker.upgrade_confirmed = true;
                        return Ok(());
                    }
                    Err(err) => {
                        return Err(self.pause(
                            stage,
                            Some(name),
                            format!("cannot read the node's boot id, so cannot tell whether an install already reached this boot; nothing was sent: {err}"),
                        ))
                    }
                };
                if marker.installed_boot.as_ref() == Some(&boot) {
                    Install::Done
                } else if marker.install_sent_boot.as_ref() == Some(&boot) {
                    Install::Sent
                } else {
                    Install::Send(boot)
                }
            }
        };
        if !again {
            if let Some(said) = self.pending_at_reboot(node).await {
                self.say(Progress::Note(format!("{} {said}", step_prefix(stage))));
            }
        }
        marker.upgrade_requested = true;
        if let Install::Send(boot) = &install {
            marker.install_sent_boot = Some(boot.clone());
        }
        self.store_marker(stage, key, marker).await?;
        match self.upgrade(stage, node, installer, &install).await? {
            Ok(()) => {
                marker.upgrade_confirmed = true;
                self.say(Progress::Note(format!(
                    "{} {name}: upgrade to {target} requested ({})",
                    step_prefix(stage),
                    match (api, &install) {
                        (UpgradeApi::Lifecycle, Install::Send(_)) =>
                            "LifecycleService, then reboot",
                        (UpgradeApi::Lifecycle, Install::Done) => "installed ahead, reboot",
                        (UpgradeApi::Lifecycle, _) =>
                            "installed on this boot already, reboot into what it wrote",
                        (UpgradeApi::Machine, _) => "MachineService/Upgrade, which reboots",
                    }
                )));
                // An install whose end nobody saw may have failed: the boot is judged as it
                // comes — the target is done, the old version gets its install on the new
                // boot (one per boot still), within the node timeout.
                if install == Install::Sent {
                    marker.upgrade_requested = false;
                    marker.installed_boot = None;
                    self.store_marker(stage, key, marker).await?;
                }
                Ok(())
            }
            // A retryable installer failure is tried again on a fresh boot, never on this
            // one (it may have written the switch already): the drained node is rebooted
            // into whatever the installer left, and the step judges it — the target booted
            // is done, the old version gets its install on the new boot.
            Err(crate::talos::TalosError::Installer {
                class, code, last, ..
            }) if class.retryable()
                && !crate::talos::client::InstallerFailure::version_refused(&last)
                && matches!(install, Install::Send(_)) =>
            {
                self.say(Progress::Note(format!(
                    "{} {name}: the installer exited with code {code} ({}{}); rebooting to try again on a fresh boot",
                    step_prefix(stage),
                    class.describe(),
                    last.last().map(|l| format!(": {l}")).unwrap_or_default()
                )));
                self.check_lock(stage, name).await?;
                if let Err(err) = self.engine.talos.reboot(&address(node), around(node)).await {
                    return Err(self.pause(
                        stage,
                        Some(name),
                        format!("the installer exited with code {code} and the reboot to try again on a fresh boot was refused: {err}"),
                    ));
                }
                marker.upgrade_requested = false;
                self.store_marker(stage, key, marker).await
            }
            Err(err) => {
                // A repeated request may meet a node already on its way down, or still in
                // the upgrade sequence the first request started.
                let now = Box::pin(self.observe(stage, node, marker, Before::Unknown)).await?;
                let going = now.talos.is_none() || now.boot_id != marker.boot_id_before;
                if again && (going || self.upgrading(node).await) {
                    marker.upgrade_confirmed = true;
                    Ok(())
                } else {
                    Err(self.pause(
                        stage,
                        Some(name),
                        format!("the upgrade to {installer} was refused: {err}"),
                    ))
                }
            }
        }
    }

    /// What the reboot this step ends with does to an operator's pending configuration,
    /// said before the upgrade is requested: a STAGED configuration on disk becomes the
    /// active one at the next boot, and a TRY (never persisted) is gone with the boot
    /// (siderolabs/talos@v1.13.9:internal/app/machined/internal/server/v1alpha1/
    /// v1alpha1_server.go `ApplyConfiguration`, …/controllers/config/acquire.go). Reads
    /// that fail say nothing: this only informs, the reboot is the step's.
    async fn pending_at_reboot(&self, node: &LiveNode) -> Option<String> {
        let talos = self.engine.talos;
        let (addr, opts) = (address(node), around(node));
        let active = talos.machine_config(&addr, opts).await.ok()?;
        let name = &node.name;
        match talos.persistent_machine_config(&addr, opts).await.ok()? {
            Some(on_disk) => {
                let paths =
                    crate::talos::machine_config::pending_changes(&active.yaml, &on_disk.yaml)
                        .ok()?;
                (!paths.is_empty()).then(|| {
                    format!(
                        "{name}: its STAGED configuration applies at this reboot ({}); an operator staged it, ichor does not undo it",
                        crate::releaseset::excerpt(&paths.join(", "), 300)
                    )
                })
            }
            None => {
                let tag = talos.version(&addr, opts).await.ok()?.tag;
                let modern = crate::releaseset::Version::parse(&tag)
                    .is_ok_and(|v| (v.major(), v.minor()) >= (1, 10));
                (modern && active.version.trim() != "1").then(|| {
                    format!(
                        "{name}: its active configuration changed in this boot without being persisted (a TRY); the reboot ends it and the node boots its configuration on disk"
                    )
                })
            }
        }
    }

    /// Whether the node runs its upgrade sequence (or the reboot that ends it). On Talos ≤
    /// 1.12 a repeated MachineService/Upgrade meets that sequence: the sequencer is locked
    /// (siderolabs/talos v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/
    /// v1alpha1_controller.go `Run`: "sequence not started: locked"), and on a control plane
    /// the pre-upgrade etcd check finds the node's own member already stopped
    /// (internal/pkg/etcd/etcd.go `ValidateForUpgrade`). That is the node upgrading, not a
    /// refusal.
    async fn upgrading(&self, node: &LiveNode) -> bool {
        matches!(
            self.engine.talos.machine_stage(&address(node), around(node)).await,
            Ok(Some(stage)) if ["upgrading", "rebooting", "shutting down"].contains(&stage.as_str())
        )
    }

    /// The installer of the target for `node`: cluster.yaml's `spec.talos.installerImage`,
    /// else the repository the node's own configuration names (an Image Factory schematic
    /// carries its extensions; Talos 1.14 publishes no `ghcr.io/siderolabs/installer`, and a
    /// 1.14 configuration keeps the image in `UnattendedInstallConfig`), tagged with the
    /// target.
    async fn installer(&self, stage: StageId, node: &LiveNode) -> Flow<String> {
        let e = self.engine;
        let tag = self.target.talos.tag();
        if let Some(repo) = &e.installer_image {
            return Ok(format!("{repo}:{tag}"));
        }
        // Read once per run: what a node's configuration names is its installer for the
        // whole rollout (the pre-pull, the install ahead and its own step agree).
        if let Some(known) = self
            .installers
            .lock()
            .ok()
            .and_then(|m| m.get(&node.name).cloned())
        {
            return Ok(known);
        }
        let fail = |why: String| self.pause(stage, Some(&node.name), why);
        let mc = e
            .talos
            .machine_config(&address(node), around(node))
            .await
            .map_err(|err| {
                fail(format!(
                    "cannot read which installer the node names (cluster.yaml names none): {err}"
                ))
            })?;
        let settings = crate::talos::machine_config::install_settings(&mc.yaml).map_err(|err| {
            fail(format!(
                "cannot read which installer the node names (cluster.yaml names none): {err}"
            ))
        })?;
        match settings.installer_image {
            Some((image, _)) => {
                let installer = format!("{}:{tag}", crate::talos::machine_config::repository(&image));
                if let Ok(mut m) = self.installers.lock() {
                    m.insert(node.name.clone(), installer.clone());
                }
                Ok(installer)
            }
            None => Err(fail(
                "neither cluster.yaml (spec.talos.installerImage) nor the node's configuration names an installer image; set spec.talos.installerImage, then resume".into(),
            )),
        }
    }

    pub(super) async fn upgrade_api(&self, stage: StageId, node: &LiveNode) -> Flow<UpgradeApi> {
        match self
            .engine
            .talos
            .version(&address(node), around(node))
            .await
        {
            Ok(v) => Ok(v.upgrade_api),
            Err(e) => Err(self.pause(
                stage,
                Some(&node.name),
                format!("cannot read the node's Talos version: {e}"),
            )),
        }
    }

    /// Install the target on a Talos ≥ 1.13 node (LifecycleService/Upgrade): the node keeps
    /// serving, and boots the target at its next reboot. Sent once: the caller has recorded
    /// the boot it is sent on, and nothing here asks again — a second install on the same
    /// boot overwrites the slot the node would fall back to (GRUB flips from grub.cfg's
    /// Default, siderolabs/talos@main:internal/app/machined/pkg/runtime/v1alpha1/bootloader/
    /// grub/upgrade.go) or deletes the booted UKI (…/bootloader/sdboot/sdboot.go), and
    /// upstream runs an install on after its caller went away
    /// (@v1.13.9:internal/app/lifecycle/container.go `runInstallerContainer`).
    pub(super) async fn install(
        &self,
        node: &LiveNode,
        installer: &str,
    ) -> Result<(), crate::talos::TalosError> {
        let e = self.engine;
        let addr = address(node);
        // The install streams progress and may take minutes: its own deadline.
        let long = CallOptions {
            deadline: e.policy.node_timeout.as_duration(),
            ..around(node)
        };
        let name = e
            .talos
            .pull_installer(&addr, installer, around(node))
            .await?;
        e.talos.install_pulled(&addr, &name, long).await.map(|_| ())
    }

    /// Wait for an install sent on this boot to exit (the lifecycle service's lock free),
    /// asked without risking a second install; within the node timeout.
    async fn install_exited(&self, node: &LiveNode) -> Result<(), crate::talos::TalosError> {
        let e = self.engine;
        let addr = address(node);
        let give_up = self.now().plus(e.policy.node_timeout.as_duration());
        let wait = std::time::Duration::from_secs(10);
        loop {
            match e.talos.lifecycle_idle(&addr, around(node)).await {
                Ok(true) => return Ok(()),
                Ok(false) if self.now().plus(wait) < give_up => {
                    self.say(Progress::Note(format!(
                        "talos {}: the install sent on this boot still runs; looking again in {}s",
                        node.name,
                        wait.as_secs()
                    )));
                    e.clock.sleep(wait).await;
                }
                Ok(false) => {
                    return Err(crate::talos::TalosError::Reply {
                        node: node.name.clone(),
                        call: "LifecycleService/Upgrade",
                        message: "the install sent on this boot still runs after the node timeout; its installer may be stuck".into(),
                    })
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The upgrade itself: on Talos ≥ 1.13 the install (unless one was sent on this boot
    /// already: then its end is waited for) then ichor's own reboot, into whatever the
    /// install wrote — the step judges the version the node comes back on; before 1.13, the
    /// legacy call.
    ///
    /// A control plane's etcd is judged again between its install (minutes) and its reboot:
    /// neither Talos's install nor its Reboot checks etcd, so this is the only guard.
    pub(super) async fn upgrade(
        &self,
        stage: StageId,
        node: &LiveNode,
        installer: &str,
        install: &Install,
    ) -> Flow<Result<(), crate::talos::TalosError>> {
        let e = self.engine;
        let addr = address(node);
        let written = match install {
            Install::Done => Ok(()),
            Install::Sent => self.install_exited(node).await,
            Install::Send(_) => match self.install(node, installer).await {
                Ok(()) => Ok(()),
                // The installer ran to its end and failed: said, not retried on this boot.
                Err(err @ crate::talos::TalosError::Installer { .. }) => Err(err),
                // Taken or not, it may run on: wait for it, then boot what it wrote.
                Err(err) => {
                    self.say(Progress::Note(format!(
                        "talos {}: the install ended without its exit code ({err}); waiting for it to exit, then rebooting into what it wrote",
                        node.name
                    )));
                    self.install_exited(node).await
                }
            },
            // Talos ≤ 1.12 cordons, drains and reboots by itself; ichor has drained
            // already, so there is one drain owner and its drain finds nothing to move.
            // The call pulls and validates the installer before it answers (siderolabs/
            // talos@v1.12.11:internal/app/machined/internal/server/v1alpha1/
            // v1alpha1_server.go `Upgrade`, internal/pkg/install/pull.go), into the system
            // containerd that is emptied at every boot: it gets a pull's deadline, as Omni
            // gives it minutes; a 30 s deadline cancelled every slow pull, and each retry
            // pulled again.
            Install::NotHere => {
                return Ok(e
                    .talos
                    .upgrade_legacy(&addr, installer, pulling(node))
                    .await
                    .map(|_| ()))
            }
        };
        if let Err(err) = written {
            return Ok(Err(err));
        }
        if node.role == Role::Controlplane && *install != Install::Done {
            self.etcd_ready_for(node, false).await?;
        }
        // The install took minutes: the lock is renewed again before the reboot, so an
        // engine whose lease lapsed meanwhile (another may hold it now) reboots nothing.
        self.check_lock(stage, &node.name).await?;
        Ok(e.talos.reboot(&addr, around(node)).await)
    }

    /// Ahead of a worker's turn (Talos ≥ 1.13): the target installed while the node still
    /// serves, so its own step only drains and reboots it. Recorded as the boot it was
    /// installed on; the step has not begun. A failure is only said: the node's own step
    /// installs again, and pauses if that fails. Only a lost lock stops the rollout here.
    /// `false`: the node's Talos installs and reboots in one call (≤ 1.12), so nothing is
    /// installed ahead on it.
    pub(super) async fn install_ahead(&self, stage: StageId, name: &str) -> Flow<bool> {
        let e = self.engine;
        let prefix = step_prefix(stage);
        let key = format!("{prefix}/{name}");
        let m = self.marker(&key).await;
        if m.started_at.is_some() || m.installed_boot.is_some() {
            return Ok(true);
        }
        let Ok(Some(node)) = e.kube.node(name).await else {
            return Ok(true);
        };
        let addr = address(&node);
        // The boot id first, then the version: remembered for the node's own step, the
        // version then belongs to that boot or a later one (a look on a later boot misses
        // the remembered one and asks again), never to an earlier one.
        let boot = e.talos.boot_id(&addr, around(&node)).await;
        let Ok(v) = e.talos.version(&addr, around(&node)).await else {
            return Ok(true);
        };
        let on_target =
            crate::releaseset::Version::parse(&v.tag).ok().as_ref() == Some(&self.target.talos);
        if v.upgrade_api != UpgradeApi::Lifecycle {
            return Ok(false);
        }
        if on_target {
            return Ok(true);
        }
        let Ok(boot) = boot else {
            return Ok(true);
        };
        // Sent on this boot already (by an engine that stopped mid-install): never again.
        // Its end is waited for here as the install itself would have been; the node's own
        // step reboots into what it wrote.
        if m.install_sent_boot.as_ref() == Some(&boot) {
            match self.install_exited(&node).await {
                Ok(()) => self.say(Progress::Note(format!(
                    "{prefix} {name}: the install sent ahead of its turn on this boot has exited; its turn reboots into what it installed"
                ))),
                Err(err) => self.say(Progress::Note(format!(
                    "{prefix} {name}: the install sent ahead of its turn on this boot: {err}; its own step waits for it"
                ))),
            }
            return Ok(true);
        }
        self.remember_boot(name, &boot, &v.tag);
        let Ok(installer) = self.installer(stage, &node).await else {
            return Ok(true); // said by the node's own step
        };
        // Writing the node's disk is acting on it: only while the lock is ours.
        self.check_lock(stage, name).await?;
        // Pulled first: a failed pull sends nothing. Then the boot recorded, then the call.
        if let Err(err) = e
            .talos
            .pull_installer(&addr, &installer, around(&node))
            .await
        {
            self.say(Progress::Note(format!(
                "{prefix} {name}: pulling {installer} ahead failed ({err}); its own step installs"
            )));
            return Ok(true);
        }
        let sent = boot.clone();
        self.mark_ahead(stage, &key, |m| m.install_sent_boot = Some(sent))
            .await?;
        if self.marker(&key).await.started_at.is_some() {
            return Ok(true); // the step began meanwhile: it installs
        }
        match self.install(&node, &installer).await {
            Ok(()) => {
                self.mark_ahead(stage, &key, |m| m.installed_boot = Some(boot))
                    .await?;
                self.say(Progress::Note(format!(
                    "{prefix} {name}: installed {installer} ahead of its turn (boots it at its reboot)"
                )));
            }
            Err(err) => self.say(Progress::Note(format!(
                "{prefix} {name}: installing {installer} ahead failed ({err}); its own step waits for it to exit and reboots into what it wrote"
            ))),
        }
        Ok(true)
    }

    /// Before a NO_REBOOT apply of "active + image edit": nothing else may be pending on the
    /// node. A STAGED configuration waits in the persistent one for the next reboot, and a
    /// TRY's rollback target is there too; NO_REBOOT persists what it applies, so it would
    /// drop the staged change or make the trial permanent (siderolabs/talos v1.13.9
    /// internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go
    /// `ApplyConfiguration`). Pauses naming the node and the paths.
    pub(super) async fn no_pending_config(
        &self,
        stage: StageId,
        node: &str,
        addr: &str,
        active: &MachineConfig,
        opts: CallOptions<'_>,
    ) -> Flow<()> {
        let fail = |why: String| self.pause(stage, Some(node), why);
        let persistent = self
            .engine
            .talos
            .persistent_machine_config(addr, opts)
            .await
            .map_err(|err| fail(format!("cannot read the configuration on disk: {err}")))?;
        let Some(persistent) = persistent else {
            return self
                .no_try_since_boot(stage, node, addr, active, opts)
                .await;
        };
        let paths =
            crate::talos::machine_config::pending_changes(&active.yaml, &persistent.yaml)
                .map_err(|err| fail(format!("cannot compare the configuration on disk: {err}")))?;
        if paths.is_empty() {
            return Ok(());
        }
        Err(fail(format!(
            "unrelated pending configuration change on {node}: {} (a STAGED configuration waiting for the next reboot, or a TRY running); a NO_REBOOT apply would overwrite it — reboot the node to apply it or apply the active configuration again to drop it, then resume",
            crate::releaseset::excerpt(&paths.join(", "), 300)
        )))
    }

    /// A node without the `persistent` resource: Talos before 1.10 has none, and from 1.10
    /// it exists only once an apply in this boot persisted something — a configuration
    /// read from STATE at boot is set active once and not persisted again
    /// (siderolabs/talos@v1.13.9:internal/app/machined/pkg/controllers/config/acquire.go
    /// `Run`). The active resource is then created at version 1 and bumped by every later
    /// SetConfig (cosi-project/runtime pkg/state/impl/inmem/collection.go `Create`,
    /// `Update`), and the only apply that sets it without persisting is a TRY
    /// (v1alpha1_server.go `ApplyConfiguration`; runtime `RollbackToConfigAfter`). So a
    /// version above 1 means a TRY ran in this boot, and may still run: ichor's dry run
    /// would cancel its rollback and its NO_REBOOT apply would persist it. Pauses.
    async fn no_try_since_boot(
        &self,
        stage: StageId,
        node: &str,
        addr: &str,
        active: &MachineConfig,
        opts: CallOptions<'_>,
    ) -> Flow<()> {
        let fail = |why: String| self.pause(stage, Some(node), why);
        let tag = self
            .engine
            .talos
            .version(addr, opts)
            .await
            .map_err(|err| fail(format!("cannot read the node's Talos version: {err}")))?
            .tag;
        let before_1_10 =
            crate::releaseset::Version::parse(&tag).is_ok_and(|v| (v.major(), v.minor()) < (1, 10));
        if before_1_10 || active.version.trim() == "1" {
            return Ok(());
        }
        Err(fail(format!(
            "unrelated pending configuration change on {node}: its active configuration changed in this boot (version {}) and nothing was persisted — a TRY (talosctl apply-config --mode try) running or rolled back; ichor's dry run would cancel its rollback and its NO_REBOOT apply would make it permanent — let the TRY roll back (or reboot the node), apply the configuration to keep with NO_REBOOT, then resume",
            crate::releaseset::excerpt(&active.version, 20)
        )))
    }

    /// Talos's own verdict on an image-only edit: the dry run's diff may move only the image
    /// lines the edit moved. Pauses listing the other lines Talos reports.
    pub(super) fn dry_run_verdict(
        &self,
        stage: StageId,
        node: &str,
        details: &str,
        edit: &crate::talos::machine_config::ImageEdit,
    ) -> Flow<()> {
        let other = beyond_images(details, edit);
        if other.is_empty() {
            return Ok(());
        }
        Err(self.pause(
            stage,
            Some(node),
            format!(
                "Talos's dry run of the image-only edit on {node} changes more than the images: {}; nothing was applied — find what else differs in the node's configuration (talosctl get machineconfig), settle it, then resume",
                crate::releaseset::excerpt(&other.join(" | "), 400)
            ),
        ))
    }

    /// Whether `node`'s etcd member may go down now, judged from etcd's own member list
    /// (never from the Kubernetes Nodes: a stale member of a replaced machine counts toward
    /// quorum and answers nothing). Refuses naming the members in the way.
    pub(super) async fn etcd_may_lose(
        &self,
        node: &LiveNode,
        again: bool,
    ) -> Flow<crate::gate::live::EtcdView> {
        let stage = StageId::Talos;
        let nodes = self.live_nodes(stage).await?;
        let view =
            crate::gate::live::observe_etcd_around(self.engine.talos, &nodes, Some(&node.name))
                .await
                .map_err(|err| {
                    self.pause(
                        stage,
                        Some(&node.name),
                        format!("cannot read etcd before taking {} down: {err}", node.name),
                    )
                })?;
        view.may_take_down(&node.name, again)
            .map_err(|why| self.pause(stage, Some(&node.name), why))?;
        Ok(view)
    }

    /// Right before a control plane goes down: etcd judged again, and leadership moved off
    /// it.
    pub(super) async fn etcd_ready_for(&self, node: &LiveNode, again: bool) -> Flow<()> {
        let stage = StageId::Talos;
        let e = self.engine;
        let addr = address(node);
        let opts = around(node);
        let fail = |why: String| self.pause(stage, Some(&node.name), why);
        let view = self.etcd_may_lose(node, again).await?;
        // A single member leads alone: there is no one to hand leadership to.
        if view.members.len() <= 1 {
            return Ok(());
        }
        if again {
            // The node may already be down: nothing to forfeit.
            let _ = e.talos.etcd_forfeit_leadership(&addr, opts).await;
            return Ok(());
        }
        e.talos
            .etcd_forfeit_leadership(&addr, opts)
            .await
            .map_err(|err| {
                fail(format!(
                    "could not move etcd leadership off {}: {err}",
                    node.name
                ))
            })?;
        Ok(())
    }
}

/// The lines of a dry run's diff other than the image lines `edit` moves. The diff is
/// "Config diff:" then a unified diff of the active and the new configuration (siderolabs/
/// talos v1.13.9 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go
/// `generateDiff`, pkg/machinery/textdiff; the same shape since 1.9). Without a diff there
/// is nothing to judge (the persistent-configuration check has run before); a diff too large
/// to display is not judged as fine.
pub fn beyond_images(details: &str, edit: &crate::talos::machine_config::ImageEdit) -> Vec<String> {
    let Some((_, diff)) = details.split_once("Config diff:") else {
        return Vec::new();
    };
    let image = |line: &str| -> Option<String> {
        let v = line.trim().strip_prefix("image:")?.trim();
        Some(v.trim_matches(|c| c == '"' || c == '\'').to_string())
    };
    let adds_a_section = edit.images.iter().any(|(_, old, _)| old.is_none());
    let mut other = Vec::new();
    for line in diff.lines() {
        if line.starts_with("--- ") || line.starts_with("+++ ") {
            continue;
        }
        if line.starts_with("@@") {
            if line.contains("diff too large") {
                other.push(line.to_string());
            }
            continue;
        }
        let ok = if let Some(removed) = line.strip_prefix('-') {
            image(removed).is_some_and(|v| {
                edit.images
                    .iter()
                    .any(|(_, old, _)| old.as_deref() == Some(v.as_str()))
            })
        } else if let Some(added) = line.strip_prefix('+') {
            image(added).is_some_and(|v| edit.images.iter().any(|(_, _, new)| *new == v))
                // An image the configuration did not name comes with its section's key.
                || (adds_a_section && added.trim_end().ends_with(':') && !added.trim().contains(' '))
        } else {
            true
        };
        if !ok && other.len() < 20 {
            other.push(crate::releaseset::excerpt(line, 120));
        }
    }
    other
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::talos::machine_config::{Component, ImageEdit};

    fn edit() -> ImageEdit {
        ImageEdit {
            yaml: String::new(),
            images: vec![(
                Component::Kubelet,
                Some("ghcr.io/siderolabs/kubelet:v1.33.5".into()),
                "ghcr.io/siderolabs/kubelet:v1.34.1".into(),
            )],
        }
    }

    #[test]
    fn only_the_moved_image_lines_pass_the_dry_run_verdict() {
        let clean = "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n@@ -3,5 +3,5 @@\n machine:\n   kubelet:\n-    image: ghcr.io/siderolabs/kubelet:v1.33.5\n+    image: ghcr.io/siderolabs/kubelet:v1.34.1\n   network:\n";
        assert!(beyond_images(clean, &edit()).is_empty());
        let extra = clean.replace("   network:\n", "-  sysctls: {a: 1}\n+  sysctls: {a: 2}\n");
        assert_eq!(
            beyond_images(&extra, &edit()),
            vec![
                "-  sysctls: {a: 1}".to_string(),
                "+  sysctls: {a: 2}".to_string()
            ]
        );
        // Another image than the edit's is not the edit.
        let other = clean.replace("v1.34.1", "v1.35.0");
        assert_eq!(beyond_images(&other, &edit()).len(), 1);
        assert_eq!(
            beyond_images("Dry run summary:\nx\nConfig diff:\n\n@@ -1,90000 +1,90000 @@ diff too large to display\n", &edit()).len(),
            1
        );
        assert!(
            beyond_images("Dry run summary:\nx\nConfig diff:\n\nNo changes.", &edit()).is_empty()
        );
        assert!(beyond_images("Applied configuration without a reboot", &edit()).is_empty());
    }
}
