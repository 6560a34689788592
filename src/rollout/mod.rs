//! The rollout engine: carries a cluster from the release set it runs to a target, in the
//! plan's order, one observation at a time.
//!
//! - Talos: control planes one at a time (etcd healthy with quorum to spare, leadership
//!   moved off first), then the worker batches, the nodes of a batch together. Each node is
//!   driven by [`step::talos_node`] from what is observed.
//! - Kubernetes (ADR 0057): kube-apiserver on each control plane, controller-manager and
//!   scheduler, kube-proxy and the bootstrap-manifest sync once every apiserver runs the
//!   target, then the kubelets (control planes, then worker batches), each cordoned, drained
//!   and volume-checked. A component switch is the image-field-only edit of the node's own
//!   machine configuration: images pre-pulled, a dry run, then NO_REBOOT, each call with its
//!   own deadline; verified from the Kubernetes API.
//!
//! What cannot be observed lives in the [`record`] (target, stage, step start markers, pause,
//! history), written as it changes, so a restarted engine continues where it stood. One Lease
//! per cluster keeps rollouts apart; losing it stops every action at once. A failure pauses
//! with its root cause, and nodes ichor cordoned that are healthy go back into service.

pub mod record;
pub mod step;
pub mod terminal;
pub mod window;

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::Mutex;

use crate::clock::{Clock, Timestamp};
use crate::gate::live::{lock_name, ICHOR_NAMESPACE};
use crate::gate::Change;
use crate::kube::{DrainOutcome, KubeClient, KubeError, LiveNode, LiveVolume, LockState};
use crate::plan::{Plan, StageId, Step, StepKind};
use crate::policy::Status;
use crate::releaseset::{HumanDuration, Role, RolloutPolicy, Version, VolumeProvider};
use crate::talos::client::{CallOptions, ImageNamespace, UpgradeApi};
use crate::talos::machine_config::{set_images, Component};
use crate::talos::proto::machine::apply_configuration_request::Mode as ApplyMode;
use crate::talos::TalosClient;

use record::{Pause, RecordState, RolloutRecord, Stored, TargetRef};
use step::{Action, NodeObservation, StepMarker, StepState};

/// How long the lock is held without renewal.
pub const LOCK_DURATION: Duration = Duration::from_secs(60);
/// How long transient API failures (5xx, 429, a dropped connection) are retried before the
/// rollout pauses on them.
pub const API_PATIENCE: Duration = Duration::from_secs(300);
/// How often a held node or a closed window is looked at again.
const WAIT_EVERY: Duration = Duration::from_secs(30);
/// An image pull's own deadline: an installer is hundreds of megabytes.
const PULL_DEADLINE: Duration = Duration::from_secs(600);

/// The options of an image pull on `node`.
fn pulling(node: &LiveNode) -> CallOptions<'_> {
    CallOptions {
        deadline: PULL_DEADLINE,
        avoid: Some(&node.name),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Record(#[from] record::RecordError),
}

/// The release set a rollout carries the cluster to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The GitOps commit the release set comes from.
    pub commit: String,
    pub talos: Version,
    pub kubernetes: Version,
}

impl Target {
    /// As the rollout record stores it.
    pub fn to_ref(&self) -> TargetRef {
        TargetRef {
            commit: self.commit.clone(),
            talos: self.talos.to_string(),
            kubernetes: self.kubernetes.to_string(),
        }
    }
}

/// What a run ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every stage done; seconds per stage, in order.
    Completed { stages: Vec<(String, u64)> },
    /// Stopped for a human, with the root cause (also in the record).
    Paused(Pause),
    /// Nothing was done: another rollout holds the lock.
    Refused(String),
}

/// Progress as it happens, for a terminal, a PR comment or a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    StageStarted {
        stage: StageId,
        title: String,
        /// Nodes (or syncs) the stage will finish, for a progress bar.
        units: u64,
    },
    /// One node (or the manifest sync) of the stage is done.
    UnitDone {
        stage: StageId,
        what: String,
        /// The node it was, when it was one (for an Event on that Node).
        node: Option<String>,
    },
    StageFinished {
        stage: StageId,
        secs: u64,
    },
    /// Something done or seen, as one line.
    Note(String),
    /// The rollout waits on something outside it (a window, a hold, the CNI).
    Waiting(String),
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Progress::StageStarted { title, .. } => write!(f, "stage: {title}"),
            Progress::UnitDone { what, .. } => write!(f, "{what}"),
            Progress::StageFinished { stage, secs } => write!(
                f,
                "stage {} done in {}",
                stage_key(*stage),
                HumanDuration::from_secs(*secs)
            ),
            Progress::Note(s) => f.write_str(s),
            Progress::Waiting(s) => write!(f, "waiting: {s}"),
        }
    }
}

/// This machine's host name, cut to what a Lease holder may carry (the pod name in a pod).
pub fn host_identity() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL either way.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let host = if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "localhost".into()
    };
    clean_identity(&host)
}

/// Letters, digits, `-`, `.` and `_`, at most 60: safe in a Lease holder and a log line.
pub fn clean_identity(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .take(60)
        .collect()
}

pub fn stage_key(id: StageId) -> &'static str {
    match id {
        StageId::Talos => "talos",
        StageId::KubeApiserver => "kube-apiserver",
        StageId::KubeControllerManagerScheduler => "kube-controller-manager-scheduler",
        StageId::KubeProxyManifests => "kube-proxy-manifests",
        StageId::Kubelet => "kubelet",
        StageId::Verify => "verify",
    }
}

/// What the engine needs: the clients, ichor's clock, who it is, and the cluster's policy.
pub struct Rollout<'a> {
    pub kube: &'a KubeClient,
    pub talos: &'a TalosClient,
    pub clock: Clock,
    pub cluster: String,
    /// This engine's identity in the lock.
    pub holder: String,
    pub policy: RolloutPolicy,
    /// The installer image without a tag (`cluster.yaml` `spec.talos.installerImage`).
    pub installer_image: String,
    pub volumes: VolumeProvider,
    /// Looked at before each node starts: `Some(reason)` pauses the rollout there
    /// (`paused: true` in cluster.yaml, a `/ichor pause`).
    pub pause_requested: Option<&'a (dyn Fn() -> Option<String> + Sync)>,
    pub report: Option<&'a (dyn Fn(Progress) + Sync)>,
    /// How often a settling node is observed again.
    pub observe_every: Duration,
    /// One renewal at a time: the nodes of a batch check the lock together.
    renewing: Mutex<()>,
}

impl<'a> Rollout<'a> {
    pub fn new(
        kube: &'a KubeClient,
        talos: &'a TalosClient,
        clock: Clock,
        cluster: &str,
        holder: &str,
    ) -> Self {
        Rollout {
            kube,
            talos,
            clock,
            cluster: cluster.into(),
            holder: holder.into(),
            policy: RolloutPolicy::default(),
            installer_image: "ghcr.io/siderolabs/installer".into(),
            volumes: VolumeProvider::None,
            pause_requested: None,
            report: None,
            observe_every: Duration::from_secs(5),
            renewing: Mutex::new(()),
        }
    }

    /// The cluster's own settings from its `cluster.yaml`: rollout policy, volume
    /// provider, installer image.
    pub fn for_cluster(mut self, doc: &crate::releaseset::Cluster) -> Self {
        self.policy = doc.spec.rollout.clone();
        self.volumes = doc.spec.volumes.provider;
        if let Some(i) = &doc.spec.talos.installer_image {
            self.installer_image = i.clone();
        }
        self
    }
}

/// Why the stages stopped before the end.
enum Stop {
    Pause(Pause),
    /// The lock went to someone else: stop, and write nothing more.
    LockLost(String),
}

type Flow<T> = Result<T, Stop>;

/// Calls about `node` never travel through `node` itself: it is the one that reboots.
fn around(node: &LiveNode) -> CallOptions<'_> {
    CallOptions {
        avoid: Some(&node.name),
        ..CallOptions::default()
    }
}

fn address(node: &LiveNode) -> String {
    node.internal_ip
        .clone()
        .unwrap_or_else(|| node.name.clone())
}

impl Rollout<'_> {
    fn say(&self, p: Progress) {
        tracing::info!(cluster = %self.cluster, "{p}");
        if let Some(r) = self.report {
            r(p);
        }
    }

    async fn acquire(&self) -> Result<LockState, KubeError> {
        let _one = self.renewing.lock().await;
        self.kube
            .acquire_lease(
                ICHOR_NAMESPACE,
                &lock_name(&self.cluster),
                &self.holder,
                LOCK_DURATION,
                self.clock.now(),
            )
            .await
    }

    /// Renew the lock until it is lost; then say who has it. A failing renewal is retried
    /// every second; the engine stops acting well before the lease could expire unrenewed.
    async fn keep_lock(&self) -> String {
        let every = LOCK_DURATION / 4;
        let margin = Duration::from_secs(15);
        let mut renewed = self.clock.now();
        let mut wait = every;
        loop {
            self.clock.sleep(wait).await;
            match self.acquire().await {
                Ok(LockState::Held) => {
                    renewed = self.clock.now();
                    wait = every;
                }
                Ok(LockState::HeldBy { holder }) => return holder,
                Err(e) => {
                    if self.clock.now().since(renewed) + margin >= LOCK_DURATION {
                        return format!(
                            "nobody (it could not be renewed for {}s: {e})",
                            self.clock.now().since(renewed).as_secs()
                        );
                    }
                    wait = Duration::from_secs(1);
                }
            }
        }
    }

    /// Run `plan` to `target`. `change` (when given) lets the engine re-check the live
    /// gate before the Kubernetes stages and wait for the CNI; `resume` continues a rollout
    /// the record shows paused for the same target.
    pub async fn run(
        &self,
        plan: &Plan,
        target: &Target,
        change: Option<&Change>,
        resume: bool,
    ) -> Result<RunOutcome, RolloutError> {
        patiently(&self.clock, "create the ichor-system namespace", || {
            self.kube.ensure_namespace(ICHOR_NAMESPACE)
        })
        .await?;
        if let LockState::HeldBy { holder } =
            patiently(&self.clock, "take the rollout lock", || self.acquire()).await?
        {
            return Ok(RunOutcome::Refused(format!(
                "another rollout holds the lock {ICHOR_NAMESPACE}/{} ({holder})",
                lock_name(&self.cluster)
            )));
        }
        let now = self.clock.now();
        let stored = match record::load(self.kube, &self.cluster).await {
            Ok(s) => s,
            Err(e) => {
                self.release_lock().await;
                return Err(e.into());
            }
        };
        let stored = match stored {
            Some(mut s) if s.record.target.commit == target.commit => {
                if s.record.state == RecordState::Paused && !resume {
                    self.release_lock().await;
                    if let Some(p) = s.record.pause.clone() {
                        return Ok(RunOutcome::Paused(p));
                    }
                }
                let was = s.record.state;
                s.record.holder = self.holder.clone();
                match was {
                    RecordState::Paused => s.record.log(now, "resumed"),
                    RecordState::Running => s.record.log(now, "continued after the engine stopped"),
                    RecordState::Completed => s.record.log(now, "re-run: verifying"),
                }
                s
            }
            Some(s) => Stored {
                record: s.record.succeed(target.to_ref(), &self.holder, now),
                resource_version: s.resource_version,
            },
            None => Stored {
                record: RolloutRecord::new(&self.cluster, target.to_ref(), &self.holder, now),
                resource_version: None,
            },
        };
        let run = Run {
            engine: self,
            target,
            change,
            plan,
            stored: Mutex::new(stored),
        };
        run.update(|r| {
            r.state = RecordState::Running;
            r.pause = None;
            r.waiting = None;
            if r.history.is_empty() {
                r.log(now, format!("started: {}", plan.summary));
            }
        })
        .await
        .map_err(RolloutError::from)?;

        let outcome = tokio::select! {
            r = run.stages() => r,
            holder = self.keep_lock() => Err(Stop::LockLost(holder)),
        };
        match outcome {
            Ok(()) => {
                let now = self.clock.now();
                run.update(|r| {
                    r.state = RecordState::Completed;
                    r.stage = None;
                    r.waiting = None;
                    r.log(now, "completed");
                })
                .await?;
                self.release_lock().await;
                let stages = run.stored.lock().await.record.stage_secs();
                Ok(RunOutcome::Completed { stages })
            }
            Err(Stop::Pause(p)) => {
                run.release_nodes().await;
                let now = self.clock.now();
                let pause = p.clone();
                // Best effort: the pause is also returned to the caller.
                let _ = run
                    .update(|r| {
                        r.state = RecordState::Paused;
                        r.waiting = None;
                        r.log(now, format!("paused: {}", pause.reason));
                        r.pause = Some(pause);
                    })
                    .await;
                self.release_lock().await;
                Ok(RunOutcome::Paused(p))
            }
            Err(Stop::LockLost(holder)) => {
                // Someone else is in charge now: touch nothing, write nothing.
                let stage = run
                    .stored
                    .lock()
                    .await
                    .record
                    .stage
                    .clone()
                    .unwrap_or_default();
                Ok(RunOutcome::Paused(Pause {
                    stage,
                    node: None,
                    reason: format!(
                        "the rollout lock was taken by {holder}; every action stopped at once"
                    ),
                    since: self.clock.now().rfc3339(),
                }))
            }
        }
    }

    async fn release_lock(&self) {
        // Best effort: an unreleased lock expires after LOCK_DURATION anyway.
        let _ = self
            .kube
            .release_lease(ICHOR_NAMESPACE, &lock_name(&self.cluster), &self.holder)
            .await;
    }
}

/// Waits between retries of a transient failure on ichor's clock: 1 s doubling to 30 s,
/// for at most [`API_PATIENCE`].
struct Backoff<'c> {
    clock: &'c Clock,
    start: Timestamp,
    wait: Duration,
}

impl<'c> Backoff<'c> {
    fn new(clock: &'c Clock) -> Self {
        Backoff {
            clock,
            start: clock.now(),
            wait: Duration::from_secs(1),
        }
    }

    /// Wait before the next try; `false` when patience ran out (then no wait).
    async fn again(&mut self) -> bool {
        if self.clock.now().since(self.start) >= API_PATIENCE {
            return false;
        }
        self.clock.sleep(self.wait).await;
        self.wait = (self.wait * 2).min(Duration::from_secs(30));
        true
    }
}

/// `call`, retried while it fails transiently (5xx, 429, unreachable), with [`Backoff`].
async fn patiently<T, F, Fut>(clock: &Clock, what: &str, mut call: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, KubeError>>,
{
    let mut backoff = Backoff::new(clock);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "{what}: retrying");
                if !backoff.again().await {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// One run: the engine, what it runs, and the record it keeps.
struct Run<'r, 'a> {
    engine: &'r Rollout<'a>,
    target: &'r Target,
    change: Option<&'r Change>,
    plan: &'r Plan,
    stored: Mutex<Stored>,
}

impl Run<'_, '_> {
    fn now(&self) -> Timestamp {
        self.engine.clock.now()
    }

    fn say(&self, p: Progress) {
        self.engine.say(p)
    }

    fn pause(&self, stage: StageId, node: Option<&str>, reason: impl Into<String>) -> Stop {
        Stop::Pause(Pause {
            stage: stage_key(stage).into(),
            node: node.map(str::to_string),
            reason: reason.into(),
            since: self.now().rfc3339(),
        })
    }

    /// A Kubernetes call with patience; when patience runs out, a pause naming the call.
    async fn kube<T, F, Fut>(
        &self,
        stage: StageId,
        node: Option<&str>,
        what: &str,
        call: F,
    ) -> Flow<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, KubeError>>,
    {
        patiently(&self.engine.clock, what, call)
            .await
            .map_err(|e| {
                self.pause(
                    stage,
                    node,
                    format!(
                        "the Kubernetes API kept failing ({what}): {e}; resume once it answers"
                    ),
                )
            })
    }

    async fn update(&self, f: impl FnOnce(&mut RolloutRecord)) -> Result<(), record::RecordError> {
        let mut s = self.stored.lock().await;
        f(&mut s.record);
        s.record.updated_at = self.now().rfc3339();
        s.record.holder = self.engine.holder.clone();
        let mut backoff = Backoff::new(&self.engine.clock);
        loop {
            match record::save(self.engine.kube, &mut s).await {
                Ok(()) => return Ok(()),
                Err(record::RecordError::Kube(e)) if e.is_transient() => {
                    if !backoff.again().await {
                        return Err(e.into());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Write to the record, pausing when it cannot be written (the record is what makes a
    /// restart safe).
    async fn write(&self, stage: StageId, f: impl FnOnce(&mut RolloutRecord)) -> Flow<()> {
        self.update(f)
            .await
            .map_err(|e| self.pause(stage, None, format!("cannot write the rollout record: {e}")))
    }

    async fn marker(&self, key: &str) -> StepMarker {
        self.stored
            .lock()
            .await
            .record
            .steps
            .get(key)
            .map(StepMarker::from_record)
            .unwrap_or_default()
    }

    async fn store_marker(&self, stage: StageId, key: &str, m: &StepMarker) -> Flow<()> {
        let rec = m.to_record();
        self.write(stage, |r| {
            r.steps.insert(key.to_string(), rec);
        })
        .await
    }

    async fn finish_marker(&self, stage: StageId, key: &str) -> Flow<()> {
        let now = self.now().rfc3339();
        self.write(stage, |r| {
            if let Some(s) = r.steps.get_mut(key) {
                s.finished_at.get_or_insert(now);
            }
        })
        .await
    }

    async fn waiting(&self, stage: StageId, what: Option<String>) -> Flow<()> {
        let same = self.stored.lock().await.record.waiting == what;
        if same {
            return Ok(());
        }
        let now = self.now();
        let said = what.clone();
        // Recorded first, then said: whoever hears of the wait finds it in the record.
        self.write(stage, |r| {
            if let Some(w) = &what {
                r.log(now, format!("waiting: {w}"));
            }
            r.waiting = what;
        })
        .await?;
        if let Some(w) = said {
            self.say(Progress::Waiting(w));
        }
        Ok(())
    }

    /// Check the lock right before a disruptive action, so a stolen lock stops it.
    async fn check_lock(&self, stage: StageId, node: &str) -> Flow<()> {
        match self
            .kube(stage, Some(node), "renew the rollout lock", || {
                self.engine.acquire()
            })
            .await?
        {
            LockState::Held => Ok(()),
            LockState::HeldBy { holder } => Err(Stop::LockLost(holder)),
        }
    }

    async fn live_nodes(&self, stage: StageId) -> Flow<Vec<LiveNode>> {
        self.kube(stage, None, "list nodes", || self.engine.kube.nodes())
            .await
    }

    async fn live_node(&self, stage: StageId, name: &str) -> Flow<LiveNode> {
        self.live_nodes(stage)
            .await?
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| {
                self.pause(
                    stage,
                    Some(name),
                    format!("node {name} is in the plan but not in the cluster; re-plan from the live inventory"),
                )
            })
    }

    async fn stages(&self) -> Flow<()> {
        for stage in &self.plan.stages {
            let id = stage.id;
            let units: u64 = stage
                .steps
                .iter()
                .map(|s| s.nodes.len().max(1) as u64)
                .sum();
            let now = self.now();
            self.write(id, |r| r.enter_stage(stage_key(id), now))
                .await?;
            self.say(Progress::StageStarted {
                stage: id,
                title: stage.title.clone(),
                units,
            });
            match id {
                StageId::Talos => {
                    for step in &stage.steps {
                        self.batch(id, step, |n| self.talos_node(n)).await?;
                    }
                }
                StageId::KubeApiserver => {
                    self.before_kubernetes().await?;
                    for step in &stage.steps {
                        self.batch(id, step, |n| self.component(id, n, &[Component::ApiServer]))
                            .await?;
                    }
                }
                StageId::KubeControllerManagerScheduler => {
                    for step in &stage.steps {
                        self.batch(id, step, |n| {
                            self.component(
                                id,
                                n,
                                &[Component::ControllerManager, Component::Scheduler],
                            )
                        })
                        .await?;
                    }
                }
                StageId::KubeProxyManifests => {
                    for step in &stage.steps {
                        self.proxy_and_manifests(step).await?;
                    }
                }
                StageId::Kubelet => {
                    for step in &stage.steps {
                        self.batch(id, step, |n| self.component(id, n, &[Component::Kubelet]))
                            .await?;
                    }
                }
                StageId::Verify => self.verify().await?,
            }
            let now = self.now();
            self.write(id, |r| r.finish_stage(stage_key(id), now))
                .await?;
            let secs = self
                .stored
                .lock()
                .await
                .record
                .stage_secs()
                .into_iter()
                .find(|(s, _)| s == stage_key(id))
                .map(|(_, s)| s)
                .unwrap_or(0);
            self.say(Progress::StageFinished { stage: id, secs });
        }
        Ok(())
    }

    /// The nodes of one step together: each finishes what it started even when another
    /// pauses (stopping halfway would leave it down), then the first pause wins.
    async fn batch<'s, F, Fut>(&'s self, stage: StageId, step: &'s Step, f: F) -> Flow<()>
    where
        F: Fn(&'s str) -> Fut,
        Fut: Future<Output = Flow<()>> + 's,
    {
        let results = join_all(step.nodes.iter().map(|n| f(n.as_str()))).await;
        let mut first = None;
        for r in results {
            match r {
                Ok(()) => {}
                Err(Stop::LockLost(h)) => return Err(Stop::LockLost(h)),
                Err(p) => {
                    first.get_or_insert(p);
                }
            }
        }
        match first {
            Some(p) => Err(p),
            None => {
                if step.nodes.is_empty() {
                    self.say(Progress::UnitDone {
                        node: None,
                        stage,
                        what: step.description.clone(),
                    });
                }
                Ok(())
            }
        }
    }

    /// Before a node starts: not paused, inside a window, not held. Waits are reported and
    /// recorded; a pause request stops here.
    async fn may_start(&self, stage: StageId, node: &str) -> Flow<()> {
        loop {
            if let Some(why) = self.engine.pause_requested.and_then(|f| f()) {
                return Err(self.pause(stage, Some(node), why));
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
                continue;
            }
            let live = self.live_node(stage, node).await?;
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
                continue;
            }
            return self.waiting(stage, None).await;
        }
    }

    async fn volumes(&self, stage: StageId) -> Flow<Vec<LiveVolume>> {
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

    async fn observe(
        &self,
        stage: StageId,
        node: &LiveNode,
        marker: &StepMarker,
    ) -> Flow<NodeObservation> {
        let e = self.engine;
        let addr = address(node);
        let opts = around(node);
        let talos = e.talos.version(&addr, opts).await.ok().map(|v| v.tag);
        let boot_id = match talos {
            Some(_) => e.talos.boot_id(&addr, opts).await.ok(),
            None => None,
        };
        let live = self
            .live_nodes(stage)
            .await?
            .into_iter()
            .find(|n| n.name == node.name);
        let name = node.name.as_str();
        let pods = self
            .kube(stage, Some(name), "list the node's pods", || {
                e.kube.pods_on(name)
            })
            .await?
            .into_iter()
            .filter(|p| !p.stays)
            .count();
        let volumes = self.volumes(stage).await?;
        let unprotected = volumes
            .iter()
            .filter(|v| v.nodes.iter().any(|n| n == name) && !v.single_replica)
            .filter(|v| {
                let elsewhere = v.nodes.iter().any(|n| n != name);
                let healthy = v.robustness.as_deref().is_none_or(|r| r == "healthy");
                !(elsewhere && healthy)
            })
            .map(|v| v.name.clone())
            .collect();
        let degraded = marker
            .volumes
            .iter()
            .filter(|want| {
                volumes.iter().any(|v| {
                    &v.name == *want
                        && (v.nodes.is_empty()
                            || v.robustness.as_deref().is_some_and(|r| r != "healthy"))
                })
            })
            .cloned()
            .collect();
        let attachments = self
            .kube(stage, Some(name), "list volume attachments", || {
                e.kube.volume_attachments(name)
            })
            .await?;
        Ok(NodeObservation {
            talos,
            boot_id,
            ready: live.as_ref().is_some_and(|n| n.ready),
            cordoned: live.as_ref().is_some_and(|n| n.cordoned),
            cordoned_by_ichor: live.as_ref().is_some_and(|n| n.cordoned_by_ichor),
            pods_to_move: pods,
            unprotected_volumes: unprotected,
            attachments,
            degraded_volumes: degraded,
        })
    }

    /// Begin a node's step: wait for the right to start, then record the marker. Says
    /// which single-replica volumes go down with it.
    async fn begin(
        &self,
        stage: StageId,
        key: &str,
        node: &LiveNode,
        marker: &mut StepMarker,
    ) -> Flow<()> {
        if marker.started_at.is_some() {
            return Ok(());
        }
        self.may_start(stage, &node.name).await?;
        let volumes = self.volumes(stage).await?;
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
        marker.started_at = Some(self.now());
        marker.volumes = held
            .iter()
            .filter(|v| !v.single_replica)
            .map(|v| v.name.clone())
            .collect();
        if marker.boot_id_before.is_none() {
            marker.boot_id_before = self
                .engine
                .talos
                .boot_id(&address(node), around(node))
                .await
                .ok();
        }
        self.store_marker(stage, key, marker).await
    }

    /// Drive one node to the target Talos.
    async fn talos_node(&self, name: &str) -> Flow<()> {
        let stage = StageId::Talos;
        let e = self.engine;
        let target = &self.target.talos;
        let timeout = e.policy.node_timeout.as_duration();
        let key = format!("talos/{name}");
        let node = self.live_node(stage, name).await?;
        let addr = address(&node);
        let mut marker = self.marker(&key).await;
        let mut obs = self.observe(stage, &node, &marker).await?;
        if step::talos_node(target, &obs, &marker, self.now(), timeout) == StepState::Done {
            self.say(Progress::UnitDone {
                node: Some(name.to_string()),
                stage,
                what: format!("talos {name}: on {target}"),
            });
            return Ok(());
        }
        if marker.started_at.is_none() {
            self.begin(stage, &key, &node, &mut marker).await?;
            obs = self.observe(stage, &node, &marker).await?;
        }
        let installer = format!("{}:{}", e.installer_image, target.tag());
        let mut last_settling = String::new();
        loop {
            let state = step::talos_node(target, &obs, &marker, self.now(), timeout);
            match state {
                StepState::Done => {
                    self.finish_marker(stage, &key).await?;
                    self.say(Progress::UnitDone {
                        node: Some(name.to_string()),
                        stage,
                        what: format!("talos {name}: on {target}, Ready, back in service"),
                    });
                    return Ok(());
                }
                StepState::Failed(why) => return Err(self.pause(stage, Some(name), why)),
                StepState::Settling(w) => {
                    if w != last_settling {
                        self.say(Progress::Note(format!("talos {name}: {w}")));
                        last_settling = w;
                    }
                    e.clock.sleep(e.observe_every).await;
                }
                StepState::Act(Action::PrePull) => {
                    let api = self.upgrade_api(stage, &node).await?;
                    // A failed pull pauses before anything is disrupted.
                    if let Err(err) = e
                        .talos
                        .pull_image(
                            &addr,
                            &installer,
                            ImageNamespace::System,
                            api,
                            pulling(&node),
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
                    self.store_marker(stage, &key, &marker).await?;
                    self.say(Progress::Note(format!(
                        "talos {name}: pre-pulled {installer}"
                    )));
                }
                StepState::Act(Action::Cordon) => {
                    self.check_lock(stage, name).await?;
                    self.kube(stage, Some(name), "cordon", || e.kube.cordon(name))
                        .await?;
                    self.say(Progress::Note(format!("talos {name}: cordoned")));
                }
                StepState::Act(Action::Drain) => {
                    self.check_lock(stage, name).await?;
                    self.drain(stage, name).await?;
                }
                StepState::Act(Action::Upgrade) => {
                    // A repeat (the engine stopped around the first request) was judged
                    // before the first; the node may already be leaving etcd.
                    let again = marker.upgrade_requested;
                    if node.role == Role::Controlplane && !again {
                        self.etcd_ready_for(&node).await?;
                    }
                    self.check_lock(stage, name).await?;
                    let api = match self.upgrade_api(stage, &node).await {
                        Ok(api) => api,
                        // Gone between the look and the act: the first request reached it.
                        Err(_) if again => {
                            marker.upgrade_confirmed = true;
                            obs = self.observe(stage, &node, &marker).await?;
                            continue;
                        }
                        Err(stop) => return Err(stop),
                    };
                    // Recorded before the call: a restart then knows the node may be going.
                    marker.upgrade_requested = true;
                    self.store_marker(stage, &key, &marker).await?;
                    match self.upgrade(&node, &installer, api).await {
                        Ok(()) => {
                            marker.upgrade_confirmed = true;
                            self.say(Progress::Note(format!(
                                "talos {name}: upgrade to {target} requested ({})",
                                match api {
                                    UpgradeApi::Lifecycle => "LifecycleService, then reboot",
                                    UpgradeApi::Machine => "MachineService/Upgrade, which reboots",
                                }
                            )));
                        }
                        Err(err) => {
                            // A repeated request may meet a node already on its way down.
                            let now = self.observe(stage, &node, &marker).await?;
                            let going = now.talos.is_none() || now.boot_id != marker.boot_id_before;
                            if again && going {
                                marker.upgrade_confirmed = true;
                            } else {
                                return Err(self.pause(
                                    stage,
                                    Some(name),
                                    format!("the upgrade to {installer} was refused: {err}"),
                                ));
                            }
                        }
                    }
                }
                StepState::Act(Action::Uncordon) => {
                    self.kube(stage, Some(name), "uncordon", || e.kube.uncordon(name))
                        .await?;
                }
            }
            obs = self.observe(stage, &node, &marker).await?;
        }
    }

    async fn upgrade_api(&self, stage: StageId, node: &LiveNode) -> Flow<UpgradeApi> {
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

    async fn upgrade(
        &self,
        node: &LiveNode,
        installer: &str,
        api: UpgradeApi,
    ) -> Result<(), crate::talos::TalosError> {
        let e = self.engine;
        let addr = address(node);
        let opts = around(node);
        match api {
            UpgradeApi::Lifecycle => {
                // The install streams progress and may take minutes: its own deadline.
                let long = CallOptions {
                    deadline: e.policy.node_timeout.as_duration(),
                    ..opts
                };
                e.talos.upgrade_lifecycle(&addr, installer, long).await?;
                e.talos.reboot(&addr, opts).await
            }
            // Talos ≤ 1.12 cordons, drains and reboots by itself; ichor has drained
            // already, so there is one drain owner and its drain finds nothing to move.
            UpgradeApi::Machine => e
                .talos
                .upgrade_legacy(&addr, installer, opts)
                .await
                .map(|_| ()),
        }
    }

    /// Evict what must move, or pause naming the pod and its budget. Never deletes, never
    /// forces.
    async fn drain(&self, stage: StageId, name: &str) -> Flow<()> {
        let e = self.engine;
        let outcome = self
            .kube(stage, Some(name), "drain", || {
                e.kube
                    .drain(name, e.policy.drain_timeout.as_duration(), &e.clock)
            })
            .await?;
        match outcome {
            DrainOutcome::Drained { evicted } => {
                self.say(Progress::Note(format!(
                    "{} {name}: drained ({} pods evicted)",
                    stage_key(stage),
                    evicted.len()
                )));
                Ok(())
            }
            DrainOutcome::Blocked {
                pod,
                budget,
                message,
                waited_secs,
            } => Err(self.pause(
                stage,
                Some(name),
                format!(
                    "the drain waited {waited_secs}s on {pod}{}: {message}; ichor never deletes or forces a pod — let the budget allow it (scale up, or fix the unhealthy replica), then resume",
                    budget
                        .map(|b| format!(" (PodDisruptionBudget {b})"))
                        .unwrap_or_default()
                ),
            )),
        }
    }

    /// Before a control plane goes down: every etcd member healthy (so quorum holds with
    /// this one down), and leadership moved off it.
    async fn etcd_ready_for(&self, node: &LiveNode) -> Flow<()> {
        let stage = StageId::Talos;
        let e = self.engine;
        let addr = address(node);
        let opts = around(node);
        let fail = |why: String| self.pause(stage, Some(&node.name), why);
        let members = e.talos.etcd_members(&addr, opts).await.map_err(|err| {
            fail(format!(
                "cannot read etcd before taking {} down: {err}",
                node.name
            ))
        })?;
        if members.len() < 3 {
            // One or two members have no quorum to spare; the plan warned of it.
            return Ok(());
        }
        let cps: Vec<LiveNode> = self
            .live_nodes(stage)
            .await?
            .into_iter()
            .filter(|n| n.role == Role::Controlplane)
            .collect();
        for cp in &cps {
            match e.talos.etcd_status(&address(cp), opts).await {
                Ok(s) if s.errors.is_empty() && !s.is_learner => {}
                Ok(s) => {
                    return Err(fail(format!(
                        "etcd member on {} is not healthy ({}); taking {} down now would lose quorum — heal the member, then resume",
                        cp.name,
                        if s.is_learner { "a learner".to_string() } else { s.errors.join("; ") },
                        node.name
                    )))
                }
                Err(err) => {
                    return Err(fail(format!(
                        "etcd member on {} does not answer ({err}); taking {} down now would lose quorum — heal the member, then resume",
                        cp.name, node.name
                    )))
                }
            }
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

    /// Whether `components` on `node` already run `tag`, as the Kubernetes API shows.
    async fn runs(
        &self,
        stage: StageId,
        node: &str,
        components: &[Component],
        tag: &str,
    ) -> Flow<bool> {
        let e = self.engine;
        if components == [Component::Kubelet] {
            let n = self
                .live_nodes(stage)
                .await?
                .into_iter()
                .find(|n| n.name == node);
            return Ok(n.is_some_and(|n| n.kubelet == tag && n.ready));
        }
        let pods = self
            .kube(stage, Some(node), "list mirror pods", || {
                e.kube.mirror_pods()
            })
            .await?;
        Ok(components.iter().all(|c| {
            pods.iter().any(|p| {
                p.node == node
                    && p.component == c.name()
                    && crate::kube::inventory::image_tag(&p.image) == Some(tag)
                    && p.ready
            })
        }))
    }

    /// Switch `components` on one node to the target Kubernetes, verified from the API.
    async fn component(&self, stage: StageId, name: &str, components: &[Component]) -> Flow<()> {
        let e = self.engine;
        let target = &self.target.kubernetes;
        let tag = target.tag();
        let what: Vec<&str> = components.iter().map(|c| c.name()).collect();
        let what = what.join(" and ");
        let key = format!("{}/{name}", components[0].name());
        let kubelet = components == [Component::Kubelet];
        let node = self.live_node(stage, name).await?;
        let mut marker = self.marker(&key).await;
        if self.runs(stage, name, components, &tag).await? {
            if kubelet && node.cordoned_by_ichor {
                self.kube(stage, Some(name), "uncordon", || e.kube.uncordon(name))
                    .await?;
            }
            if marker.started_at.is_some() {
                self.finish_marker(stage, &key).await?;
            }
            self.say(Progress::UnitDone {
                node: Some(name.to_string()),
                stage,
                what: format!("{what} {name}: on {tag}"),
            });
            return Ok(());
        }
        self.begin(stage, &key, &node, &mut marker).await?;
        let started = marker.started_at.unwrap_or_else(|| self.now());
        let timeout = e.policy.node_timeout.as_duration();
        let deadline = started.plus(timeout);
        let addr = address(&node);
        let opts = around(&node);
        if kubelet {
            // A kubelet restart is a disruption like a reboot: the workloads move first,
            // and only once every volume they use has a healthy copy elsewhere.
            self.check_lock(stage, name).await?;
            self.kube(stage, Some(name), "cordon", || e.kube.cordon(name))
                .await?;
            loop {
                let obs = self.observe(stage, &node, &marker).await?;
                if obs.unprotected_volumes.is_empty() || obs.pods_to_move == 0 {
                    break;
                }
                if self.now() >= deadline {
                    return Err(self.pause(
                        stage,
                        Some(name),
                        format!(
                            "{} on {name} has no healthy replica elsewhere after {}s (node timeout); evicting its pods could lose the only good copy",
                            step::plural_list("volume", &obs.unprotected_volumes),
                            self.now().since(started).as_secs()
                        ),
                    ));
                }
                e.clock.sleep(e.observe_every).await;
            }
            self.drain(stage, name).await?;
        }
        let mc = e.talos.machine_config(&addr, opts).await.map_err(|err| {
            self.pause(
                stage,
                Some(name),
                format!("cannot read the machine configuration: {err}"),
            )
        })?;
        let edit = set_images(&mc.yaml, &tag, components).map_err(|err| {
            self.pause(
                stage,
                Some(name),
                format!("the image-only edit is refused: {err}"),
            )
        })?;
        if !edit.is_noop() {
            let api = self.upgrade_api(stage, &node).await?;
            for (c, _, image) in &edit.images {
                // The kubelet runs as a system container; static pods run in the CRI.
                let ns = if *c == Component::Kubelet {
                    ImageNamespace::System
                } else {
                    ImageNamespace::Cri
                };
                e.talos
                    .pull_image(&addr, image, ns, api, pulling(&node))
                    .await
                    .map_err(|err| {
                        self.pause(
                            stage,
                            Some(name),
                            format!("pre-pulling {image} failed, nothing was switched: {err}"),
                        )
                    })?;
            }
            e.talos
                .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, true, opts)
                .await
                .map_err(|err| {
                    self.pause(
                        stage,
                        Some(name),
                        format!("the dry run of the image-only edit was refused: {err}"),
                    )
                })?;
            self.check_lock(stage, name).await?;
            // Its own deadline (the call's), not the step's: a slow node fails this call
            // with a clear error instead of eating the time of everything after it.
            e.talos
                .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, false, opts)
                .await
                .map_err(|err| {
                    self.pause(
                        stage,
                        Some(name),
                        format!("applying the image-only edit (NO_REBOOT) failed: {err}; resume to check and retry"),
                    )
                })?;
            self.say(Progress::Note(format!("{what} {name}: switched to {tag}")));
        }
        // Verified from the Kubernetes API, within the node timeout.
        loop {
            if self.runs(stage, name, components, &tag).await? {
                break;
            }
            if self.now() >= deadline {
                return Err(self.pause(
                    stage,
                    Some(name),
                    format!(
                        "{what} on {name} still not on {tag} and Ready after {}s (node timeout {}s)",
                        self.now().since(started).as_secs(),
                        timeout.as_secs()
                    ),
                ));
            }
            e.clock.sleep(e.observe_every).await;
        }
        if kubelet {
            self.kube(stage, Some(name), "uncordon", || e.kube.uncordon(name))
                .await?;
        }
        self.finish_marker(stage, &key).await?;
        self.say(Progress::UnitDone {
            node: Some(name.to_string()),
            stage,
            what: format!("{what} {name}: on {tag}, Ready"),
        });
        Ok(())
    }

    /// Before stage (a): the Talos stage changed what nodes run, so the live pre-checks run
    /// again (skew, pairing, Ready, the CNI hand-over); a CNI that must move first is waited
    /// for, reported, up to the node timeout.
    async fn before_kubernetes(&self) -> Flow<()> {
        let stage = StageId::KubeApiserver;
        let Some(change) = self.change else {
            return Ok(());
        };
        let e = self.engine;
        let subject = crate::gate::live::Subject::of(change);
        let start = self.now();
        let timeout = e.policy.node_timeout.as_duration();
        loop {
            let facts = crate::gate::live::observe(e.kube, Some(e.talos), &subject).await;
            let items = crate::gate::live::items(change, &facts);
            let blocking: Vec<&crate::policy::CheckItem> = items
                .iter()
                // The lock is ours; etcd was checked before each control plane.
                .filter(|i| !i.id.ends_with("rollout-lock"))
                .filter(|i| matches!(i.status, Status::Fail | Status::Wait))
                .collect();
            let cni_only = blocking.iter().all(|i| i.id == "live/cni-running");
            let mut why: Vec<String> = blocking
                .iter()
                .map(|i| format!("{}: {}", i.id, i.message))
                .collect();
            // Only the CNI and add-ons are worth waiting for: they move by themselves
            // (Argo CD, Flux); ichor never applies them.
            let fail_now = !cni_only;
            if !fail_now {
                why.extend(self.addons_behind(change).await?);
            }
            if why.is_empty() {
                return self.waiting(stage, None).await;
            }
            if fail_now || self.now().since(start) >= timeout {
                return Err(self.pause(
                    stage,
                    None,
                    format!(
                        "the live pre-checks before the Kubernetes stages do not pass{}: {}",
                        if fail_now {
                            String::new()
                        } else {
                            format!(" after {}s", self.now().since(start).as_secs())
                        },
                        why.join("; ")
                    ),
                ));
            }
            self.waiting(
                stage,
                Some(format!(
                    "the CNI or an add-on must move first ({})",
                    why.join("; ")
                )),
            )
            .await?;
            e.clock.sleep(WAIT_EVERY).await;
        }
    }

    /// Add-ons of the release set, found where they install themselves, whose running
    /// version does not support the target Kubernetes or that are still rolling out to the
    /// release set's version: each as a reason to wait.
    async fn addons_behind(&self, change: &Change) -> Flow<Vec<String>> {
        let stage = StageId::KubeApiserver;
        let e = self.engine;
        let k8s = &self.target.kubernetes;
        let mut out = Vec::new();
        for a in &change.head_release_set.spec.addons {
            let Some((kind, ns, name)) = crate::gate::live::addon_workload(&a.name) else {
                continue;
            };
            let what = format!("get {kind} {ns}/{name}");
            let w = if kind == "Deployment" {
                self.kube(stage, None, &what, || e.kube.deployment(ns, name))
                    .await?
            } else {
                self.kube(stage, None, &what, || e.kube.daemonset(ns, name))
                    .await?
            };
            let Some(w) = w else { continue };
            let Some(running) = w.version.as_deref().and_then(|v| Version::parse(v).ok()) else {
                continue;
            };
            let unsupported = change.policies.supports(&a.name, &running, k8s) == Some(false);
            let rolling = running != a.version && !w.rolled_out();
            if unsupported || rolling {
                out.push(format!(
                    "{} {ns}/{name} runs {running}{}, the release set says {}",
                    a.name,
                    if unsupported {
                        format!(", which does not support Kubernetes {k8s}")
                    } else {
                        format!(" ({}/{} updated)", w.updated, w.desired)
                    },
                    a.version
                ));
            }
        }
        Ok(out)
    }

    /// (c): kube-proxy on every control plane (unless the CNI replaces it), then the
    /// bootstrap manifests applied as Talos's field manager, then kube-proxy's DaemonSet
    /// rolled out on the target.
    async fn proxy_and_manifests(&self, step: &Step) -> Flow<()> {
        let stage = StageId::KubeProxyManifests;
        let e = self.engine;
        let tag = self.target.kubernetes.tag();
        let cps: Vec<LiveNode> = self
            .live_nodes(stage)
            .await?
            .into_iter()
            .filter(|n| n.role == Role::Controlplane)
            .collect();
        let key = "manifests".to_string();
        let mut marker = self.marker(&key).await;
        if marker.started_at.is_none() {
            marker.started_at = Some(self.now());
            self.store_marker(stage, &key, &marker).await?;
        }
        let started = marker.started_at.unwrap_or_else(|| self.now());
        let proxy = step.kind == StepKind::KubeProxyAndManifests;
        if proxy {
            for cp in &cps {
                let addr = address(cp);
                let opts = CallOptions::default();
                let mc = e.talos.machine_config(&addr, opts).await.map_err(|err| {
                    self.pause(
                        stage,
                        Some(&cp.name),
                        format!("cannot read the machine configuration: {err}"),
                    )
                })?;
                let edit = set_images(&mc.yaml, &tag, &[Component::Proxy]).map_err(|err| {
                    self.pause(
                        stage,
                        Some(&cp.name),
                        format!("the image-only edit is refused: {err}"),
                    )
                })?;
                if edit.is_noop() {
                    continue;
                }
                let api = self.upgrade_api(stage, cp).await?;
                for (_, _, image) in &edit.images {
                    e.talos
                        .pull_image(
                            &addr,
                            image,
                            ImageNamespace::Cri,
                            api,
                            CallOptions {
                                deadline: PULL_DEADLINE,
                                ..opts
                            },
                        )
                        .await
                        .map_err(|err| {
                            self.pause(
                                stage,
                                Some(&cp.name),
                                format!("pre-pulling {image} failed, nothing was switched: {err}"),
                            )
                        })?;
                }
                for dry in [true, false] {
                    if !dry {
                        self.check_lock(stage, &cp.name).await?;
                    }
                    e.talos
                        .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, dry, opts)
                        .await
                        .map_err(|err| {
                            self.pause(
                                stage,
                                Some(&cp.name),
                                format!(
                                    "{} the kube-proxy image edit failed: {err}",
                                    if dry { "the dry run of" } else { "applying" }
                                ),
                            )
                        })?;
                }
                self.say(Progress::Note(format!(
                    "kube-proxy image on {}: {tag}",
                    cp.name
                )));
            }
        }
        // The manifests as a control plane renders them now (any one: they are the same).
        let mut manifests = Err("no control plane".to_string());
        for cp in &cps {
            match e
                .talos
                .bootstrap_manifests(&address(cp), CallOptions::default())
                .await
            {
                Ok(m) => {
                    manifests = Ok(m);
                    break;
                }
                Err(err) => manifests = Err(err.to_string()),
            }
        }
        let manifests = manifests.map_err(|err| {
            self.pause(
                stage,
                None,
                format!("cannot read the bootstrap manifests from a control plane: {err}"),
            )
        })?;
        let objects = crate::kube::manifests::objects(&manifests)
            .map_err(|err| self.pause(stage, None, err.to_string()))?;
        self.check_lock(stage, "").await?;
        let applied = self
            .kube(stage, None, "apply the bootstrap manifests", || {
                e.kube.sync_manifests(&objects)
            })
            .await
            .map_err(|stop| match stop {
                Stop::Pause(mut p) if p.reason.contains(" 403 ") => {
                    p.reason = format!(
                        "{}; grant ichor that write (docs/cluster-access.md) or apply that object by hand, then resume",
                        p.reason
                    );
                    Stop::Pause(p)
                }
                other => other,
            })?;
        let changed: Vec<String> = applied
            .iter()
            .filter(|a| a.changed)
            .map(|a| a.to_string())
            .collect();
        self.say(Progress::Note(format!(
            "bootstrap manifests: {} objects, {} changed{}",
            applied.len(),
            changed.len(),
            if changed.is_empty() {
                String::new()
            } else {
                format!(" ({})", changed.join(", "))
            }
        )));
        if proxy {
            let timeout = e.policy.node_timeout.as_duration();
            loop {
                let ds = self
                    .kube(stage, None, "get the kube-proxy DaemonSet", || {
                        e.kube.daemonset("kube-system", "kube-proxy")
                    })
                    .await?;
                match ds {
                    None => {
                        self.say(Progress::Note("kube-proxy: no DaemonSet kube-system/kube-proxy in the cluster; nothing to roll".into()));
                        break;
                    }
                    Some(w) if w.version.as_deref() == Some(tag.as_str()) && w.rolled_out() => {
                        break
                    }
                    Some(w) => {
                        if self.now().since(started) >= timeout {
                            return Err(self.pause(
                                stage,
                                None,
                                format!(
                                    "kube-proxy has not rolled out on {tag} after {}s: {}/{} updated, {} ready, image {}",
                                    self.now().since(started).as_secs(),
                                    w.updated,
                                    w.desired,
                                    w.ready,
                                    w.images.join(", ")
                                ),
                            ));
                        }
                    }
                }
                e.clock.sleep(e.observe_every).await;
            }
        }
        self.finish_marker(stage, &key).await?;
        self.say(Progress::UnitDone {
            node: None,
            stage,
            what: if proxy {
                format!("kube-proxy on {tag} and the bootstrap manifests in sync")
            } else {
                "bootstrap manifests in sync".into()
            },
        });
        Ok(())
    }

    /// The end: every node on the target, Ready, and nothing ichor cordoned left so.
    async fn verify(&self) -> Flow<()> {
        let stage = StageId::Verify;
        let nodes = self.live_nodes(stage).await?;
        let talos = self.target.talos.to_string();
        let k8s = self.target.kubernetes.tag();
        let mut wrong = Vec::new();
        for n in &nodes {
            if n.cordoned_by_ichor {
                let name = n.name.as_str();
                self.kube(stage, Some(name), "uncordon", || {
                    self.engine.kube.uncordon(name)
                })
                .await?;
            }
            let talos_ok = n
                .talos
                .as_deref()
                .and_then(|t| Version::parse(t).ok())
                .is_none_or(|t| t == self.target.talos);
            if !n.ready || n.kubelet != k8s || !talos_ok {
                wrong.push(format!(
                    "{} (Talos {}, kubelet {}, {})",
                    n.name,
                    n.talos.as_deref().unwrap_or("?"),
                    n.kubelet,
                    if n.ready { "Ready" } else { "NotReady" }
                ));
            }
        }
        if !wrong.is_empty() {
            return Err(self.pause(
                stage,
                None,
                format!(
                    "after every stage, not every node runs the target: {}",
                    wrong.join("; ")
                ),
            ));
        }
        self.say(Progress::UnitDone {
            node: None,
            stage,
            what: format!("every node on Talos {talos} and Kubernetes {k8s}, Ready"),
        });
        Ok(())
    }

    /// On a pause: nodes ichor cordoned that are Ready and not mid-upgrade go back into
    /// service, so a paused cluster runs at full capacity.
    async fn release_nodes(&self) {
        let e = self.engine;
        let Ok(nodes) = e.kube.nodes().await else {
            return;
        };
        let steps = self.stored.lock().await.record.steps.clone();
        for n in nodes.iter().filter(|n| n.cordoned_by_ichor && n.ready) {
            // Mid-upgrade: the Talos upgrade was requested and the node is not back on
            // the target yet; it stays out of service until it is.
            let mid = steps.get(&format!("talos/{}", n.name)).is_some_and(|s| {
                s.upgrade_requested
                    && s.finished_at.is_none()
                    && n.talos
                        .as_deref()
                        .and_then(|t| Version::parse(t).ok())
                        .as_ref()
                        != Some(&self.target.talos)
            });
            if !mid {
                let _ = e.kube.uncordon(&n.name).await;
                self.say(Progress::Note(format!(
                    "{}: uncordoned while paused",
                    n.name
                )));
            }
        }
    }
}
