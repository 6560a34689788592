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

mod components;
pub mod health;
mod lock;
mod manifests;
mod nodes;
mod pool;
mod prechecks;
pub mod record;
pub mod step;
mod talos;
pub mod terminal;
mod verify;
/// Maintenance windows live with the plan, whose estimates count them (pure, no I/O).
pub use crate::plan::window;

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::Mutex;

use crate::clock::{Clock, Timestamp};
use crate::gate::live::{lock_name, ICHOR_NAMESPACE};
use crate::gate::Change;
use crate::kube::{KubeClient, KubeError, LockState};
use crate::plan::{Plan, StageId, Step};
use crate::releaseset::{HumanDuration, RolloutPolicy, Version, VolumeProvider};
use crate::talos::machine_config::Component;
use crate::talos::TalosClient;

use record::{Pause, RecordState, RolloutRecord, Stored, TargetRef};
use step::StepMarker;

/// How long the lock is held without renewal.
pub const LOCK_DURATION: Duration = Duration::from_secs(60);
/// How long after its last renewal the lock still lets a disruptive act go: client-go's
/// `RenewDeadline`, which its leader election requires shorter than the lease
/// (client-go tools/leaderelection/leaderelection.go `NewLeaderElector`) and Kubernetes'
/// own components set to 10 s of 15 s (staging/src/k8s.io/component-base/config/v1alpha1/
/// defaults.go `RecommendedDefaultLeaderElectionConfiguration`); the same two thirds here.
/// Past it another engine may have taken an expired lease, so an act waits for a renewal.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(40);
/// How often an act that runs for minutes (a drain) looks whether the lock is still fresh.
const LEASE_LOOK_EVERY: Duration = Duration::from_secs(5);
/// How long transient API failures (5xx, 429, a dropped connection) are retried before the
/// rollout pauses on them.
pub const API_PATIENCE: Duration = Duration::from_secs(300);
/// How often a held node or a closed window is looked at again.
const WAIT_EVERY: Duration = Duration::from_secs(30);
/// An image pull's own deadline: an installer is hundreds of megabytes.
const PULL_DEADLINE: Duration = Duration::from_secs(600);
/// A NO_REBOOT apply's own deadline: it returns once the changed static pods restarted.
const APPLY_DEADLINE: Duration = Duration::from_secs(300);

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
    /// The live ETA after a node (or sync) or a stage finished; said just before that
    /// `UnitDone`/`StageFinished`, so a reader can print the two together.
    Eta(crate::plan::eta::Estimate),
    /// Every health check of the gate as just read, when one changed (`spec.healthChecks`).
    HealthChecks(Vec<crate::forge::comment::CheckLine>),
    /// A health check began failing at a gate (`spec.healthChecks`).
    HealthCheckFailing {
        name: String,
        value: String,
    },
    /// A health check that was failing holds again.
    HealthCheckRecovered {
        name: String,
        value: String,
    },
    /// A turn of the rollout's life, said once as it happens (for notifications).
    Event(Lifecycle),
}

/// The turns of a rollout people are told of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    /// The first run for this target; the plan's estimate in seconds.
    Started {
        estimate_secs: u64,
    },
    /// A paused rollout resumed.
    Resumed,
    Paused(Pause),
    Completed,
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
            Progress::Eta(e) => write!(f, "{}", e.short()),
            Progress::HealthChecks(checks) => write!(
                f,
                "health checks: {}",
                checks
                    .iter()
                    .map(|c| format!("{} {}", c.name, c.state))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Progress::HealthCheckFailing { name, value } => {
                write!(f, "health check {name} failing: {value}")
            }
            Progress::HealthCheckRecovered { name, value } => {
                write!(f, "health check {name} recovered: {value}")
            }
            Progress::Event(Lifecycle::Started { .. }) => f.write_str("rollout started"),
            Progress::Event(Lifecycle::Resumed) => f.write_str("rollout resumed"),
            Progress::Event(Lifecycle::Paused(p)) => write!(f, "rollout paused: {}", p.reason),
            Progress::Event(Lifecycle::Completed) => f.write_str("rollout completed"),
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

/// The stage and node of a record's step key (`talos/cp-1`, `kube-apiserver/cp-2`,
/// `manifests`), as the engine writes them.
pub fn stage_of_record_key(key: &str) -> Option<(StageId, Option<&str>)> {
    let (prefix, node) = match key.split_once('/') {
        Some((p, n)) => (p, Some(n)),
        None => (key, None),
    };
    let stage = match prefix {
        "talos" => StageId::Talos,
        "kube-apiserver" => StageId::KubeApiserver,
        "kube-controller-manager" => StageId::KubeControllerManagerScheduler,
        "kube-proxy" | "manifests" => StageId::KubeProxyManifests,
        "kubelet" => StageId::Kubelet,
        "worker" => StageId::Workers,
        _ => return None,
    };
    Some((stage, node))
}

pub fn stage_key(id: StageId) -> &'static str {
    match id {
        StageId::Talos => "talos",
        StageId::KubeApiserver => "kube-apiserver",
        StageId::KubeControllerManagerScheduler => "kube-controller-manager-scheduler",
        StageId::KubeProxyManifests => "kube-proxy-manifests",
        StageId::Kubelet => "kubelet",
        StageId::Workers => "workers",
        StageId::Verify => "verify",
    }
}

/// The record's key prefix of a node's step in `stage` (`talos/w-1`, `worker/w-1`,
/// `kubelet/w-1`), and the word its lines start with.
pub(super) fn step_prefix(stage: StageId) -> &'static str {
    match stage {
        StageId::Workers => "worker",
        StageId::Kubelet => "kubelet",
        StageId::KubeApiserver => "kube-apiserver",
        StageId::KubeControllerManagerScheduler => "kube-controller-manager",
        _ => "talos",
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
    /// The installer image without a tag (`cluster.yaml` `spec.talos.installerImage`); when
    /// `None`, each node's own (its configuration names it: `UnattendedInstallConfig` from
    /// Talos 1.14, else `.machine.install.image`).
    pub installer_image: Option<String>,
    pub volumes: VolumeProvider,
    /// Looked at before each node starts: `Some(reason)` pauses the rollout there
    /// (`paused: true` in cluster.yaml, a `/ichor pause`).
    pub pause_requested: Option<&'a (dyn Fn() -> Option<String> + Sync)>,
    pub report: Option<&'a (dyn Fn(Progress) + Sync)>,
    /// How often a settling node is observed again.
    pub observe_every: Duration,
    /// `spec.healthChecks` of the cluster (crate::health), judged at the gates.
    pub health_checks: Vec<crate::health::HealthCheck>,
    /// The bearer token for a Prometheus behind auth (the controller's config).
    pub prometheus_credential: Option<crate::prometheus::Credential>,
    /// A bug planted on purpose, so a test can show the rehearsal's checker catches it.
    /// Nothing outside tests sets it.
    #[doc(hidden)]
    pub planted: Option<PlantedBug>,
    /// ichor's own pod, `namespace/name` (deploy/ sets `ICHOR_POD_NAMESPACE` and
    /// `ICHOR_POD_NAME` from the downward API): its emptyDirs never refuse a drain.
    pub own_pod: Option<String>,
    /// One renewal at a time: the nodes of a batch check the lock together.
    renewing: Mutex<()>,
    /// When the last renewal that found the lock ours was sent (this engine's clock).
    renewed: std::sync::Mutex<Option<crate::clock::Timestamp>>,
}

/// The engine bugs a test may plant ([`Rollout::planted`]): each breaks one safety rule
/// the rehearsal's checker must then catch.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// The start rules forget `maxUnavailable`.
    IgnoreMaxUnavailable,
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
            installer_image: None,
            volumes: VolumeProvider::None,
            pause_requested: None,
            report: None,
            observe_every: Duration::from_secs(5),
            health_checks: Vec::new(),
            prometheus_credential: None,
            planted: None,
            own_pod: match (
                std::env::var("ICHOR_POD_NAMESPACE"),
                std::env::var("ICHOR_POD_NAME"),
            ) {
                (Ok(ns), Ok(name)) if !ns.is_empty() && !name.is_empty() => {
                    Some(format!("{ns}/{name}"))
                }
                _ => None,
            },
            renewing: Mutex::new(()),
            renewed: std::sync::Mutex::new(None),
        }
    }

    /// `maxUnavailable`, as the start rules read it.
    fn max_unavailable(&self) -> usize {
        match self.planted {
            Some(PlantedBug::IgnoreMaxUnavailable) => usize::MAX,
            None => self.policy.max_unavailable.get() as usize,
        }
    }

    /// The cluster's own settings from its `cluster.yaml`: rollout policy, volume
    /// provider, installer image.
    pub fn for_cluster(mut self, doc: &crate::releaseset::Cluster) -> Self {
        self.policy = doc.spec.rollout.clone();
        self.health_checks = doc.spec.health_checks.clone();
        self.volumes = doc.spec.volumes.provider;
        if let Some(i) = &doc.spec.talos.installer_image {
            self.installer_image = Some(i.clone());
        }
        self
    }
}

/// What a node of a batch says when it did not begin because a sibling stopped.
const SIBLING_STOPPED: &str = "did not begin: a node of its batch stopped";

/// Why the stages stopped before the end.
enum Stop {
    Pause(Pause),
    /// The lock went to someone else: stop, and write nothing more.
    LockLost(String),
}

type Flow<T> = Result<T, Stop>;

impl Rollout<'_> {
    fn say(&self, p: Progress) {
        tracing::info!(cluster = %self.cluster, "{p}");
        if let Some(r) = self.report {
            r(p);
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
        // A re-run of a completed rollout (a verify) is not news when it completes again.
        let was_completed = matches!(&stored, Some(s) if s.record.target.commit == target.commit
            && s.record.state == RecordState::Completed);
        // What people are told of: a first start, or a resume of a pause.
        let event = match &stored {
            Some(s) if s.record.target.commit == target.commit => (resume
                && s.record.state == RecordState::Paused)
                .then_some(Lifecycle::Resumed)
                .or_else(|| {
                    (!s.record
                        .history
                        .iter()
                        .any(|h| h.message.starts_with("started: ")))
                    .then_some(Lifecycle::Started {
                        estimate_secs: plan.estimate_secs,
                    })
                }),
            _ => Some(Lifecycle::Started {
                estimate_secs: plan.estimate_secs,
            }),
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
                // Each attempt gets its own deadline, after a pause and after an engine that
                // stopped (killed, its node lost, the lock lost) alike: a step continued
                // after its node timeout would otherwise fail every settling state at once.
                if matches!(was, RecordState::Paused | RecordState::Running) {
                    for step in s.record.steps.values_mut() {
                        if step.started_at.is_some() && step.finished_at.is_none() {
                            step.started_at = Some(now.rfc3339());
                        }
                    }
                }
                // A health gate keeps its deadline across a restart (it waits on the owner's
                // check, not on a node ichor acts on); a resume asked for gets a fresh one.
                if was == RecordState::Paused {
                    if let Some(g) = s.record.health.gate.as_mut() {
                        g.started_at = now.rfc3339();
                    }
                }
                match was {
                    RecordState::Paused => s.record.log(now, "resumed"),
                    RecordState::Running => s.record.log(now, "continued after the engine stopped"),
                    RecordState::Completed => s.record.log(now, "re-run: verifying"),
                }
                s
            }
            Some(s) => {
                // A newer target replaces a paused rollout, never silently: the new record
                // says what it superseded and why that one had stopped.
                let superseded = (s.record.state == RecordState::Paused).then(|| {
                    format!(
                        "supersedes the rollout to {} (Talos {}, Kubernetes {}), paused in {}: {}",
                        crate::releaseset::excerpt(&s.record.target.commit, 12),
                        s.record.target.talos,
                        s.record.target.kubernetes,
                        s.record
                            .pause
                            .as_ref()
                            .map_or("?".to_string(), |p| match &p.node {
                                Some(n) => format!("{} at {n}", p.stage),
                                None => p.stage.clone(),
                            }),
                        s.record.pause.as_ref().map_or(String::new(), |p| {
                            crate::releaseset::excerpt(&p.reason, 300)
                        })
                    )
                });
                let mut record = s.record.succeed(target.to_ref(), &self.holder, now);
                if let Some(line) = superseded {
                    record.log(now, line);
                }
                Stored {
                    record,
                    resource_version: s.resource_version,
                }
            }
            None => Stored {
                record: RolloutRecord::new(&self.cluster, target.to_ref(), &self.holder, now),
                resource_version: None,
            },
        };
        // What an earlier run of this rollout finished counts as done, not in the pace.
        let mut eta =
            crate::plan::eta::Eta::new(plan, now).with_windows(&self.policy.maintenance_windows);
        for (key, step) in &stored.record.steps {
            let began = step
                .started_at
                .as_deref()
                .filter(|_| step.finished_at.is_none())
                .and_then(Timestamp::parse_rfc3339);
            if step.finished_at.is_none() && began.is_none() {
                continue;
            }
            let Some((stage, node)) = stage_of_record_key(key) else {
                continue;
            };
            match (began, node) {
                // Out since an earlier run: its time so far counts toward its need.
                (Some(at), Some(node)) => eta.unit_started(stage, node, at),
                (Some(_), None) => {}
                (None, _) => eta.already_done(stage, node),
            }
        }
        let run = Run {
            engine: self,
            target,
            change,
            plan,
            stored: Mutex::new(stored),
            active: Mutex::new(Default::default()),
            halted: std::sync::Mutex::new(None),
            eta: std::sync::Mutex::new(eta),
            gating: Default::default(),
            booted: Default::default(),
            switched_on: Default::default(),
            installers: Default::default(),
        };
        run.update(|r| {
            r.state = RecordState::Running;
            r.pause = None;
            r.waiting = None;
            if !r.history.iter().any(|h| h.message.starts_with("started: ")) {
                r.log(now, format!("started: {}", plan.summary));
            }
        })
        .await
        .map_err(RolloutError::from)?;
        if let Some(e) = event {
            self.say(Progress::Event(e));
        }

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
                if !was_completed {
                    self.say(Progress::Event(Lifecycle::Completed));
                }
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
                self.say(Progress::Event(Lifecycle::Paused(p.clone())));
                Ok(RunOutcome::Paused(p))
            }
            Err(Stop::LockLost(holder)) => {
                // Someone else is in charge now: touch nothing, write nothing (the record is
                // theirs). Said as a refusal, so the controller tries again once the lock is
                // free, and the record shows it then ("continued after the engine stopped").
                let stage = run
                    .stored
                    .lock()
                    .await
                    .record
                    .stage
                    .clone()
                    .unwrap_or_default();
                Ok(RunOutcome::Refused(format!(
                    "the rollout lock was taken by {holder} during stage {stage}; every action stopped at once, and this rollout continues once the lock is free"
                )))
            }
        }
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

/// `call`, one request, retried while it fails transiently (5xx, 429, unreachable, no
/// answer within [`KUBE_CALL_DEADLINE`]), with [`Backoff`].
async fn patiently<T, F, Fut>(clock: &Clock, what: &str, mut call: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, KubeError>>,
{
    retried(clock, what, || answered(clock, what, call())).await
}

/// `call`, a run of requests and waits on the clock (a drain) bounded by its own
/// timeout, retried as [`patiently`] retries one request.
async fn retried<T, F, Fut>(clock: &Clock, what: &str, mut call: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, KubeError>>,
{
    let mut backoff = Backoff::new(clock);
    loop {
        let began = clock.now();
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "{what}: retrying");
                // Patience counts a streak of failures: an attempt that ran past one call's
                // deadline before it failed was answered meanwhile (a drain's rounds, minutes
                // of waiting on a budget), so its one error starts a new streak instead of
                // pausing on the time the drain has taken.
                if clock.now().since(began) > KUBE_CALL_DEADLINE {
                    backoff = Backoff::new(clock);
                }
                if !backoff.again().await {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long one Kubernetes call may go unanswered, on ichor's clock: kube-rs's own read
/// timeout is 295 s of real time, and a connection that hangs must not hold a step longer
/// than a Talos call may.
pub const KUBE_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// One Kubernetes call within [`KUBE_CALL_DEADLINE`] of ichor's clock (an unanswered call is
/// a lost connection: worth retrying), counted in flight meanwhile ([`Clock::busy`]).
async fn answered<T, E: From<KubeError>>(
    clock: &Clock,
    what: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let _busy = clock.busy();
    tokio::select! {
        r = call => r,
        _ = clock.sleep(KUBE_CALL_DEADLINE) => Err(KubeError::Unreachable {
            what: what.to_string(),
            detail: format!("no answer within {}s (deadline)", KUBE_CALL_DEADLINE.as_secs()),
        }.into()),
    }
}

/// Why a Kubernetes call paused the rollout, named for what it is: only an outage (5xx,
/// 429, unreachable) "kept failing"; a 403, 404 or 422 is an answer, and a reply ichor
/// cannot read is a bug.
fn api_pause_reason(what: &str, e: &KubeError) -> String {
    match e {
        KubeError::Api { code: 403, .. } => format!(
            "the Kubernetes API forbids {what}: {e}; grant ichor's ServiceAccount that verb (docs/cluster-access.md lists what ichor needs), then resume"
        ),
        KubeError::Api { code: 404, .. } => format!(
            "the Kubernetes API has no such object ({what}): {e}; check that it exists (or the API group is served), then resume"
        ),
        KubeError::Api { code: 422, .. } => format!(
            "the Kubernetes API refused the request as invalid ({what}): {e}; this is a bug in ichor or an admission policy, report it"
        ),
        KubeError::Reply { .. } => format!(
            "ichor could not read the Kubernetes API's answer ({what}): {e}; this is a bug in ichor, report it"
        ),
        _ if e.is_transient() => format!(
            "the Kubernetes API kept failing ({what}): {e}; resume once it answers"
        ),
        _ => format!("the Kubernetes API refused {what}: {e}; resume once it is fixed"),
    }
}

/// One run: the engine, what it runs, and the record it keeps.
struct Run<'r, 'a> {
    engine: &'r Rollout<'a>,
    target: &'r Target,
    change: Option<&'r Change>,
    plan: &'r Plan,
    stored: Mutex<Stored>,
    /// Nodes begun in this run and not finished: down, draining or about to be. Held while
    /// a node decides whether it may start, so two nodes of a batch decide one at a time.
    active: Mutex<std::collections::BTreeSet<String>>,
    /// A node of the running batch paused, and why: its siblings that have not begun do not
    /// begin (those already under way finish what they started).
    halted: std::sync::Mutex<Option<String>>,
    /// The live ETA of this run, written into the record with every write.
    eta: std::sync::Mutex<crate::plan::eta::Eta>,
    /// `between` health gates open now: no worker starts while one is.
    gating: std::sync::atomic::AtomicUsize,
    /// The Talos version each node reported, by the boot it reported it on: a node runs
    /// the version it booted until it boots again, so a look that finds the same boot id
    /// need not ask again (`nodes.rs` `observe`).
    booted: std::sync::Mutex<std::collections::HashMap<String, (String, String)>>,
    /// The boot on which each one-drain worker's configuration was read naming the target
    /// kubelet: until it boots again, its looks need not read it again (`talos.rs`).
    switched_on: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// The installer each node's configuration names, read once per run (`talos.rs`).
    installers: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Run<'_, '_> {
    fn now(&self) -> Timestamp {
        self.engine.clock.now()
    }

    /// Whether a step of this rollout has begun (an installer only pulled ahead has not:
    /// it disrupted nothing).
    async fn begun(&self) -> bool {
        self.stored
            .lock()
            .await
            .record
            .steps
            .values()
            .any(|s| s.started_at.is_some())
    }

    fn say(&self, p: Progress) {
        let estimate = self.eta.lock().ok().and_then(|mut eta| {
            let now = self.now();
            match &p {
                Progress::UnitDone { stage, node, .. } => {
                    eta.unit_done(*stage, node.as_deref(), now)
                }
                Progress::StageFinished { stage, .. } => eta.stage_done(*stage, now),
                _ => return None,
            }
            Some(eta.estimate(now))
        });
        if let Some(e) = estimate {
            self.engine.say(Progress::Eta(e));
        }
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
        mut call: F,
    ) -> Flow<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, KubeError>>,
    {
        let clock = &self.engine.clock;
        self.kube_run(stage, node, what, || answered(clock, what, call()))
            .await
    }

    /// A run of Kubernetes calls and waits bounded by its own timeout (a drain): retried
    /// with patience like one call, but never cut off at one call's deadline.
    async fn kube_run<T, F, Fut>(
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
        retried(&self.engine.clock, what, call)
            .await
            .map_err(|e| self.pause(stage, node, api_pause_reason(what, &e)))
    }

    async fn update(&self, f: impl FnOnce(&mut RolloutRecord)) -> Result<(), record::RecordError> {
        let mut s = self.stored.lock().await;
        f(&mut s.record);
        s.record.eta = match (s.record.state, self.eta.lock()) {
            (RecordState::Running, Ok(eta)) => {
                Some(record::RecordEta::of(&eta.estimate(self.now())))
            }
            _ => None,
        };
        s.record.updated_at = self.now().rfc3339();
        s.record.holder = self.engine.holder.clone();
        let mut backoff = Backoff::new(&self.engine.clock);
        loop {
            let save = record::save(self.engine.kube, &mut s);
            match answered(&self.engine.clock, "write the rollout record", save).await {
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
        self.update(f).await.map_err(|e| match e {
            // Another engine wrote the record since this one read it: it holds the rollout.
            record::RecordError::Taken { holder } => Stop::LockLost(holder),
            e => self.pause(stage, None, format!("cannot write the rollout record: {e}")),
        })
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
        let mut rec = m.to_record();
        self.write(stage, |r| {
            // What a newer ichor wrote on this step stays.
            if let Some(old) = r.steps.get(key) {
                rec.extra = old.extra.clone();
            }
            r.steps.insert(key.to_string(), rec);
        })
        .await
    }

    async fn finish_marker(&self, stage: StageId, key: &str) -> Flow<()> {
        if let Some((_, node)) = key.split_once('/') {
            self.active.lock().await.remove(node);
        }
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

    /// The installers pulled ahead on every node still to upgrade (a pull disrupts
    /// nothing), then the stages. The pulls go first rather than alongside the first
    /// steps: on a loaded machine, pulls in flight beside a control plane's calls made
    /// those calls miss their deadlines on the twin's fast clock.
    async fn stages(&self) -> Flow<()> {
        self.before_start().await?;
        self.health_before().await?;
        for stage in self
            .plan
            .stages
            .iter()
            .filter(|s| matches!(s.id, StageId::Talos | StageId::Workers))
        {
            self.pre_pull_ahead(stage.id, &stage.steps).await?;
        }
        self.stages_in_order().await?;
        // "Completed" is written only after verify saw every node at the target: a plan with
        // nothing left (a resume on a newer commit, a re-run) verifies too.
        if !self.plan.stages.iter().any(|s| s.id == StageId::Verify) {
            Box::pin(self.verify()).await?;
        }
        Ok(())
    }

    async fn stages_in_order(&self) -> Flow<()> {
        // The `between` health gate follows every disruptive unit but the last: a step, or
        // a worker of a pooled stage.
        let total: usize = self
            .plan
            .stages
            .iter()
            .filter(|s| s.id != StageId::Verify)
            .flat_map(|s| s.steps.iter())
            .map(|s| {
                if s.is_worker_batch() {
                    s.nodes.len()
                } else {
                    1
                }
            })
            .sum();
        let gates = Mutex::new(0usize);
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
            // Worker batches go through the pool: no barrier between them.
            let (workers, mut steps): (Vec<&Step>, Vec<&Step>) =
                stage.steps.iter().partition(|s| s.is_worker_batch());
            let between = |step: &Step| {
                let after = if step.nodes.is_empty() {
                    step.description.clone()
                } else {
                    step.nodes.join(", ")
                };
                let gates = &gates;
                async move {
                    let mut done = gates.lock().await;
                    self.health_between(id, &after, &mut done, total).await
                }
            };
            // Each stage's work is boxed: held inline, every arm's future sat in this
            // function's poll frame, which in a debug build came near tokio's 2 MiB stack.
            match id {
                StageId::Talos => {
                    while !steps.is_empty() {
                        let next = self.leader_last(&steps).await;
                        let step = steps.remove(next);
                        // Installs ahead (Talos ≥ 1.13): the next control plane installs
                        // while this one is out, one node ahead as the pool is one round.
                        let ahead = match steps.is_empty() {
                            true => None,
                            false => steps
                                .get(self.leader_last(&steps).await)
                                .and_then(|s| s.nodes.first()),
                        };
                        let install = async {
                            match ahead {
                                Some(n) if self.window_open() => {
                                    self.install_ahead(id, n).await.map(|_| ())
                                }
                                _ => Ok(()),
                            }
                        };
                        let (done, installed) = Box::pin(async {
                            tokio::join!(
                                self.batch(id, step, |n| self.talos_node(id, n, None)),
                                install
                            )
                        })
                        .await;
                        if let Err(Stop::LockLost(h)) = installed {
                            return Err(Stop::LockLost(h));
                        }
                        if let Err(stop) = done {
                            return Err(self.naming_installed_ahead(id, stop).await);
                        }
                        between(step).await?;
                    }
                    let node_step = |n, seen| self.talos_node(id, n, seen);
                    Box::pin(self.pool(id, &workers, node_step, &gates, total)).await?;
                }
                StageId::KubeApiserver => {
                    self.before_kubernetes().await?;
                    for step in steps {
                        Box::pin(
                            self.batch(id, step, |n| {
                                self.component(id, n, &[Component::ApiServer])
                            }),
                        )
                        .await?;
                        between(step).await?;
                    }
                }
                StageId::KubeControllerManagerScheduler => {
                    for step in steps {
                        Box::pin(self.batch(id, step, |n| {
                            self.component(
                                id,
                                n,
                                &[Component::ControllerManager, Component::Scheduler],
                            )
                        }))
                        .await?;
                        between(step).await?;
                    }
                }
                StageId::KubeProxyManifests => {
                    for step in steps {
                        Box::pin(self.proxy_and_manifests(step)).await?;
                        between(step).await?;
                    }
                }
                StageId::Kubelet => {
                    self.apiservers_on_target(id).await?;
                    let kubelet = |n| self.component(id, n, &[Component::Kubelet]);
                    for step in steps {
                        Box::pin(self.batch(id, step, kubelet)).await?;
                        between(step).await?;
                    }
                    Box::pin(self.pool(id, &workers, |n, _| kubelet(n), &gates, total)).await?;
                }
                StageId::Workers => {
                    // Every apiserver on the target before any worker's kubelet moves.
                    self.apiservers_on_target(id).await?;
                    for step in steps {
                        Box::pin(self.batch(id, step, |n| self.talos_node(id, n, None))).await?;
                        between(step).await?;
                    }
                    let node_step = |n, seen| self.talos_node(id, n, seen);
                    Box::pin(self.pool(id, &workers, node_step, &gates, total)).await?;
                }
                StageId::Verify => {
                    Box::pin(self.verify()).await?;
                    Box::pin(self.health_after(id)).await?;
                }
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

    /// Which of the Talos steps left goes next: the first, unless it is the control plane
    /// leading etcd and another control plane is still to go — then that one. The leader
    /// goes last, so the others' reboots cost no election (its own reboot costs one, after
    /// leadership is handed over). Judged from etcd each time (leadership moves); when etcd
    /// cannot be read the plan's order stands.
    async fn leader_last(&self, steps: &[&Step]) -> usize {
        let one_cp = |s: &Step, nodes: &[crate::kube::LiveNode]| match s.nodes.as_slice() {
            [n] => nodes
                .iter()
                .any(|l| &l.name == n && l.role == crate::releaseset::Role::Controlplane),
            _ => false,
        };
        // A step an earlier run began (and did not finish) goes first, whoever leads now:
        // starting another control plane beside it could take two down.
        {
            let stored = self.stored.lock().await;
            let begun = steps.iter().position(|s| {
                s.nodes.iter().any(|n| {
                    stored
                        .record
                        .steps
                        .get(&format!("talos/{n}"))
                        .is_some_and(|m| m.started_at.is_some() && m.finished_at.is_none())
                })
            });
            if let Some(i) = begun {
                return i;
            }
        }
        let Ok(nodes) = self.engine.kube.nodes().await else {
            return 0;
        };
        if !steps.first().is_some_and(|s| one_cp(s, &nodes)) {
            return 0;
        }
        let Ok(view) =
            crate::gate::live::observe_etcd_around(self.engine.talos, &nodes, None).await
        else {
            return 0;
        };
        // The Node that runs the leading member, by identity (its name may differ from the
        // member's: an FQDN, a capital letter).
        let Some(leader) = view.leader_node().map(str::to_string) else {
            return 0;
        };
        if steps[0].nodes.first() != Some(&leader) {
            return 0;
        }
        steps
            .iter()
            .position(|s| one_cp(s, &nodes) && s.nodes.first() != Some(&leader))
            .unwrap_or(0)
    }

    /// The nodes of one step together: each finishes what it started even when another
    /// pauses (stopping halfway would leave it down), then the first pause wins.
    async fn batch<'s, F, Fut>(&'s self, stage: StageId, step: &'s Step, f: F) -> Flow<()>
    where
        F: Fn(&'s str) -> Fut,
        Fut: Future<Output = Flow<()>> + 's,
    {
        let results = join_all(step.nodes.iter().map(|n| {
            let node = f(n.as_str());
            async move {
                let r = node.await;
                if let Err(Stop::Pause(p)) = &r {
                    if let Ok(mut h) = self.halted.lock() {
                        h.get_or_insert_with(|| {
                            format!(
                                "{} paused: {}",
                                n,
                                crate::releaseset::excerpt(&p.reason, 200)
                            )
                        });
                    }
                }
                r
            }
        }))
        .await;
        if let Ok(mut h) = self.halted.lock() {
            *h = None;
        }
        let mut first = None;
        let mut held_back = None;
        for r in results {
            match r {
                Ok(()) => {}
                Err(Stop::LockLost(h)) => return Err(Stop::LockLost(h)),
                // The root cause wins over a sibling that only did not begin because of it.
                Err(Stop::Pause(p)) if p.reason.contains(SIBLING_STOPPED) => {
                    held_back.get_or_insert(Stop::Pause(p));
                }
                Err(p) => {
                    first.get_or_insert(p);
                }
            }
        }
        let first = first.or(held_back);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> KubeError {
        KubeError::Api {
            what: "cordon node w-1".into(),
            code,
            reason: "x".into(),
            message: "m".into(),
        }
    }

    #[test]
    fn an_answer_is_not_an_outage() {
        assert!(api_pause_reason("cordon", &api(403)).contains("forbids"));
        assert!(api_pause_reason("cordon", &api(404)).contains("no such object"));
        assert!(api_pause_reason("cordon", &api(422)).contains("invalid"));
        assert!(api_pause_reason("cordon", &api(503)).contains("kept failing"));
        let decode = KubeError::Reply {
            what: "list nodes".into(),
            message: "missing field".into(),
        };
        assert!(api_pause_reason("list nodes", &decode).contains("bug"));
        for c in [403, 404, 422] {
            assert!(!api_pause_reason("x", &api(c)).contains("kept failing"));
        }
    }

    /// N11: a drain that waited 5.5 minutes on a budget and then met one 503 is tried
    /// again, not paused on the time the drain had taken; a streak of failures still ends
    /// the patience.
    #[tokio::test]
    async fn patience_counts_a_streak_of_failures_not_the_time_a_drain_took() {
        let clock = Clock::manual();
        let tries = std::sync::atomic::AtomicU32::new(0);
        let drain = || async {
            match tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                // The first round waits on a budget for 330 s, then one request fails.
                0 => {
                    clock.sleep(Duration::from_secs(330)).await;
                    Err(api(503))
                }
                _ => Ok("drained"),
            }
        };
        let driver = async {
            loop {
                tokio::task::yield_now().await;
                clock.advance(Duration::from_secs(1));
            }
        };
        let r = tokio::select! {
            r = retried(&clock, "drain", drain) => r,
            () = driver => unreachable!(),
        };
        assert_eq!(r.ok(), Some("drained"));
        // Failures one after the other still give up after API_PATIENCE.
        let start = clock.now();
        let failing = || async { Err::<(), _>(api(503)) };
        let r = tokio::select! {
            r = retried(&clock, "drain", failing) => r,
            () = async { loop { tokio::task::yield_now().await; clock.advance(Duration::from_secs(1)); } } => unreachable!(),
        };
        assert!(r.is_err());
        assert!(clock.now().since(start) >= API_PATIENCE);
    }
}
