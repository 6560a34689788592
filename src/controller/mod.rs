//! `ichor run`: the long-running controller. Sources (webhooks, polling a remote, a
//! repository on disk) put [`Event`]s on one queue; one loop takes them in order, coalesces
//! a burst (the newest head of a PR wins, older heads are dropped), and [`handle`]s each:
//! a PR head is gated and reported, the protected branch moving starts a rollout (in its
//! own task, one per cluster), a comment command is checked and acknowledged. Errors go
//! through one [`error_policy`] that decides the requeue; metrics are labelled by the
//! error's name.
//!
//! Observed state over stored cursors: what was judged and rolled out is remembered only
//! to save work; after a restart ichor re-reads the PRs, the branch and each cluster's
//! rollout record and carries on.

mod commands;
pub mod config;
mod gating;
pub mod http;
pub mod metrics;
mod rehearsing;
mod report;
mod rolling;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::forge::comment::Sticky;
use crate::forge::github::{GithubAuth, GithubClient, GithubConfig};
use crate::git::remote::{Credentials, Mirror, Remote};
use crate::git::GitError;
use crate::kube::KubeClient;
use crate::secret::Secret;
use crate::talos::TalosClient;

pub use config::Config;
pub use metrics::Metrics;
pub use report::{GateReport, Reporters, RolloutReport};
pub use rolling::{rollout_base, settings_at};

/// Events waiting beyond this are refused at the webhook (503); the reconcile catches up.
pub const QUEUE_CAPACITY: usize = 1024;
/// The most open PRs (or branches, in Git-only mode) gated per reconcile.
pub const MAX_OPEN_PULLS: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("git: {0}")]
    Git2(#[from] git2::Error),
    #[error(transparent)]
    Gate(#[from] crate::gate::GateError),
    #[error(transparent)]
    Forge(#[from] crate::forge::github::ForgeError),
    #[error(transparent)]
    Kube(#[from] crate::kube::KubeError),
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretError),
    #[error(transparent)]
    Config(#[from] crate::releaseset::DocumentError),
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The error's name, for metrics and the requeue decision.
    pub fn name(&self) -> &'static str {
        match self {
            Error::Git(_) | Error::Git2(_) => "git",
            Error::Gate(_) => "gate",
            Error::Forge(_) => "github",
            Error::Kube(_) => "kubernetes",
            Error::Secret(_) => "secret",
            Error::Config(_) => "config",
            Error::Other(_) => "other",
        }
    }

    /// How long GitHub asked ichor to wait, when this is a rate limit.
    pub fn rate_limited_for(&self) -> Option<Duration> {
        match self {
            Error::Forge(e) => e.retry_after(),
            _ => None,
        }
    }

    fn is_transient(&self) -> bool {
        match self {
            Error::Forge(e) => e.is_transient(),
            Error::Kube(e) => e.is_transient(),
            Error::Git(_) | Error::Git2(_) => true,
            _ => false,
        }
    }
}

/// The one error policy: log, count by name, and say when to look again.
pub fn error_policy(ctx: &Ctx, err: &Error) -> Option<Duration> {
    ctx.metrics.inc(
        "ichor_errors_total",
        "Errors while handling events, by the error's name.",
        &[("error", err.name())],
    );
    tracing::warn!(error = %err, kind = err.name(), "handling an event failed");
    if let Some(wait) = err.rate_limited_for() {
        return Some(wait);
    }
    err.is_transient().then_some(Duration::from_secs(30))
}

/// Something that happened, as the sources report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Look at everything again: the periodic reconcile, a missed webhook, startup.
    Reconcile,
    /// A PR was opened or its head moved (webhook).
    PullUpdated {
        number: u64,
        head_sha: String,
    },
    PullClosed {
        number: u64,
    },
    /// A branch moved (webhook `push`, or refs moving on disk).
    Pushed {
        branch: String,
    },
    /// A merge queue wants `ichor/gate` on its merge group's head (webhook `merge_group`).
    MergeGroup {
        head_sha: String,
        /// `gh-readonly-queue/<base>/pr-<n>-<sha>`
        head_ref: String,
        base_ref: String,
    },
    /// A PR comment (webhook `issue_comment`).
    Comment {
        number: u64,
        /// GitHub's id of the comment: a command runs once per comment, whatever the
        /// delivery id says (a captured delivery replays with a fresh one).
        comment_id: u64,
        created_at: Option<crate::clock::Timestamp>,
        author: String,
        body: String,
    },
}

/// A burst of events, in the order to handle them: the newest head of each PR only (the
/// older ones are stale: Renovate force-pushes), one reconcile, comments as they came.
/// Returns the events and how many were dropped as stale.
pub fn coalesce(batch: Vec<Event>) -> (Vec<Event>, usize) {
    let mut last_head: HashMap<u64, usize> = HashMap::new();
    let mut closed: HashMap<u64, usize> = HashMap::new();
    for (i, e) in batch.iter().enumerate() {
        match e {
            Event::PullUpdated { number, .. } => {
                last_head.insert(*number, i);
            }
            Event::PullClosed { number } => {
                closed.insert(*number, i);
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    let mut dropped = 0;
    let mut reconcile = false;
    let mut pushed = std::collections::BTreeSet::new();
    for (i, e) in batch.into_iter().enumerate() {
        match &e {
            Event::PullUpdated { number, .. } => {
                let superseded =
                    last_head.get(number) != Some(&i) || closed.get(number).is_some_and(|c| *c > i);
                if superseded {
                    dropped += 1;
                    continue;
                }
            }
            Event::Reconcile => {
                if reconcile {
                    continue;
                }
                reconcile = true;
            }
            Event::Pushed { branch } if !pushed.insert(branch.clone()) => continue,
            _ => {}
        }
        out.push(e);
    }
    (out, dropped)
}

/// One cluster this instance gates (and, with `act`, rolls out).
pub struct ClusterRuntime {
    pub name: String,
    pub act: bool,
    pub kube: Option<KubeClient>,
    pub talos: Option<Arc<TalosClient>>,
    /// Why the cluster's clients are missing, for the checklist.
    pub access_error: Option<String>,
    /// `/ichor pause`: the engine stops at its next safe point.
    pub paused_by: Mutex<Option<String>>,
    /// The controller is shutting down: pause at the next safe point and say so.
    pub stopping: AtomicBool,
    /// When this replica last took or renewed the cluster's controller lease.
    pub held_at: Mutex<Option<crate::clock::Timestamp>>,
    /// The lease was taken after a time without it (a standby taking over, a lease stolen
    /// or expired, the namespace created late): every open PR is judged again, since those
    /// seen meanwhile were skipped.
    pub regained: AtomicBool,
    /// `spec.rollout.paused` in cluster.yaml at the protected branch's tip, as last read.
    pub git_paused: AtomicBool,
    pub rollout: Mutex<Option<JoinHandle<()>>>,
    /// The branch tip this cluster's rollouts were last decided for.
    pub decided_tip: Mutex<Option<String>>,
    /// A newer tip would move a version back from the running rollout's target: the engine
    /// stops at its next safe point with this reason (ichor never downgrades).
    pub backwards: Mutex<Option<String>>,
}

impl ClusterRuntime {
    pub fn rolling(&self) -> bool {
        lock(&self.rollout)
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }
}

/// The reason a rollout pauses with when ichor stops; a restart resumes such a pause by itself.
pub const SHUTDOWN_REASON: &str =
    "ichor stopped (shutdown or a new version); the next ichor resumes from here";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the loop remembers between events.
#[derive(Default)]
pub struct LoopState {
    /// PR (or branch) → (head, base tip) last judged.
    pub judged: HashMap<String, (String, String)>,
    /// The sticky comment per (PR, cluster), to redraw with rollout progress.
    pub stickies: HashMap<(u64, String), Sticky>,
    /// The tip of the protected branch last seen.
    pub tip: Option<String>,
    /// Each PR's head as GitHub's API last reported it (never a webhook's, which may be
    /// old or lost): a verdict judged for another head meanwhile is dropped.
    pub latest_head: HashMap<u64, String>,
    /// Comments whose command ran (or was refused), by GitHub's comment id.
    pub seen_comments: commands::SeenComments,
    /// PRs where someone without write access was told once that ichor takes commands
    /// only from people with it.
    pub refusal_told: std::collections::HashSet<u64>,
    /// People GitHub last said have no write access, and when (kept a minute).
    pub no_write: HashMap<String, crate::clock::Timestamp>,
}

/// Everything the handlers share (kube-rs' `Context`).
pub struct Ctx {
    pub cfg: Config,
    pub clock: Clock,
    pub identity: String,
    pub mirror_dir: PathBuf,
    pub mirror: Arc<Mutex<Mirror>>,
    pub remote: Remote,
    pub github: Option<GithubClient>,
    pub webhook_secret: Option<Secret>,
    pub clusters: Vec<Arc<ClusterRuntime>>,
    pub reporters: Reporters,
    /// Git-only commands handled, and the key of this controller's acks.
    pub ledger: commands::CommandLedger,
    pub metrics: Arc<Metrics>,
    pub state: tokio::sync::Mutex<LoopState>,
    pub events: mpsc::Sender<Event>,
    pub ready: AtomicBool,
    pub dedupe: Mutex<crate::forge::webhook::Dedupe>,
    /// What the listeners allow (the defaults but in tests).
    pub limits: http::Limits,
    /// The webhook bodies being read, before their signatures are checked.
    pub body_reads: http::BodyReads,
    /// Counts handled batches, rollout reports and webhook bodies starting and ending to
    /// be read: tests and the demo wait on it instead of sleeping.
    pub activity: watch::Sender<u64>,
    /// One `gate.rehearse` at a time (rehearsing.rs).
    pub rehearsal: tokio::sync::Semaphore,
}

impl Ctx {
    fn bump(&self) {
        self.activity.send_modify(|n| *n += 1);
    }
}

impl Ctx {
    pub fn cluster(&self, name: &str) -> Option<&Arc<ClusterRuntime>> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// The name of the controller lease of a cluster.
    pub fn lease_name(cluster: &str) -> String {
        format!("ichor-controller-{cluster}")
    }

    /// Whether this replica acts for `cluster` now: it holds (or just took) the cluster's
    /// controller Lease in that cluster's own API. A cluster ichor cannot reach has no
    /// lease: it is gated from Git alone by whichever replica sees the event.
    /// A lease renewed within the last third of its duration still holds: answered
    /// without a request, since every PR's gate asks.
    pub async fn holds(&self, cluster: &ClusterRuntime) -> bool {
        let fresh = self.cfg.leader_election.lease_duration.as_duration() / 3;
        let renewed = *lock(&cluster.held_at);
        if renewed.is_some_and(|t| self.clock.now().since(t) < fresh) {
            return true;
        }
        self.renew(cluster).await
    }

    /// Take or renew the cluster's controller lease.
    pub async fn renew(&self, cluster: &ClusterRuntime) -> bool {
        let Some(kube) = &cluster.kube else {
            return true;
        };
        let le = &self.cfg.leader_election;
        let now = self.clock.now();
        let held = match kube
            .acquire_lease(
                &le.namespace,
                &Ctx::lease_name(&cluster.name),
                &self.identity,
                le.lease_duration.as_duration(),
                now,
            )
            .await
        {
            Ok(crate::kube::lease::LockState::Held) => true,
            Ok(crate::kube::lease::LockState::HeldBy { .. }) => false,
            Err(e) => {
                self.metrics.inc(
                    "ichor_api_errors_total",
                    "API errors by API and error.",
                    &[("api", "kubernetes"), ("error", e.kind())],
                );
                if e.kind() == "not_found" {
                    tracing::error!(cluster = %cluster.name, error = %e, "cannot take the controller lease: the namespace {} does not exist in this cluster; create it (kubectl apply -f deploy/namespace.yaml, or kubectl create namespace {}) — until then no PR is gated for this cluster", le.namespace, le.namespace);
                } else {
                    tracing::warn!(cluster = %cluster.name, error = %e, "cannot take the controller lease");
                }
                false
            }
        };
        self.metrics.set(
            "ichor_leader",
            "1 while this replica holds the cluster's controller lease.",
            &[("cluster", &cluster.name)],
            if held { 1.0 } else { 0.0 },
        );
        let was = lock(&cluster.held_at).replace(now).is_some();
        if !held {
            *lock(&cluster.held_at) = None;
        } else if !was {
            cluster.regained.store(true, Ordering::Relaxed);
            // Look now, not at the next poll.
            let _ = self.events.try_send(Event::Reconcile);
        }
        held
    }

    /// Fetch what moved from the repository into the mirror.
    pub async fn sync(&self) -> Result<Vec<crate::git::remote::RefMove>, Error> {
        let mirror = self.mirror.clone();
        let remote = self.remote.clone();
        let github = self.github.is_some();
        let moves = tokio::task::spawn_blocking(move || {
            let mut specs = vec!["+refs/heads/*:refs/heads/*"];
            // GitHub keeps every PR's head under refs/pull/, closed PRs' and forks' too:
            // those are fetched one open PR at a time ([`Ctx::fetch_pull`]), so no PR can
            // make the branches' fetch fail.
            if !github {
                specs.push("+refs/ichor/commands:refs/ichor/commands");
            }
            lock(&mirror).fetch(&remote, &specs)
        })
        .await
        .map_err(|e| Error::Other(format!("the fetch stopped: {e}")))??;
        self.ready.store(true, Ordering::Relaxed);
        Ok(moves)
    }

    /// Fetch the head of open PR `number` on its own, under `limits.prFetchBytes`, unless
    /// the mirror already has `sha` (the head the API reports).
    pub async fn fetch_pull(&self, number: u64, sha: &str) -> Result<(), crate::git::GitError> {
        let mirror = self.mirror.clone();
        let remote = self.remote.clone();
        let max_bytes = self.cfg.limits.pr_fetch_bytes;
        let sha = sha.to_string();
        tokio::task::spawn_blocking(move || {
            let mirror = lock(&mirror);
            let have = git2::Oid::from_str(&sha)
                .ok()
                .is_some_and(|oid| mirror.git2().find_commit(oid).is_ok());
            if have {
                return Ok(());
            }
            let limits = crate::git::remote::FetchLimits {
                max_bytes,
                ..mirror.limits()
            };
            let spec = format!("+refs/pull/{number}/head:refs/pull/{number}/head");
            mirror.fetch_within(&remote, &[&spec], limits).map(|_| ())
        })
        .await
        .map_err(|e| crate::git::GitError::Fetch {
            url: String::new(),
            message: format!("the fetch stopped: {e}"),
        })?
    }

    pub fn repo(&self) -> Result<crate::git::Repo, Error> {
        Ok(crate::git::Repo::open(&self.mirror_dir)?)
    }
}

/// Connect what the config names: the mirror, GitHub, each cluster's clients.
pub async fn connect(
    cfg: Config,
    clock: Clock,
    events: mpsc::Sender<Event>,
    limits: http::Limits,
) -> Result<Arc<Ctx>, Error> {
    let identity = cfg
        .leader_election
        .identity
        .clone()
        .or_else(|| std::env::var("ICHOR_POD_NAME").ok())
        .unwrap_or_else(crate::rollout::host_identity);
    let identity = format!("ichor-run/{identity}");
    crate::state::prepare_dir(&cfg.state_dir)
        .map_err(|e| Error::Other(format!("stateDir {}: {e}", cfg.state_dir.display())))?;
    let mirror_dir = cfg.state_dir.join("mirror.git");
    let mirror = Mirror::open(&mirror_dir)?;
    let url = match cfg.source() {
        config::Source::Remote(u) => u,
        config::Source::Path(p) => p.display().to_string(),
    };
    let credentials = git_credentials(&cfg)?;
    let known_hosts = cfg
        .credentials
        .git
        .as_ref()
        .and_then(|g| g.known_hosts_file.clone());
    let remote = Remote {
        url,
        credentials,
        known_hosts,
    };
    let github = match &cfg.credentials.github {
        Some(g) => {
            let auth = match (&g.token_file, &g.token_env, g.app_id) {
                (Some(f), _, _) => GithubAuth::Token(Secret::from_file(f)?),
                (None, Some(env), _) => GithubAuth::Token(Secret::from_env(env)?),
                (None, None, Some(app_id)) => GithubAuth::App {
                    app_id,
                    installation_id: g.installation_id.unwrap_or_default(),
                    private_key: Secret::from_file(g.private_key_file.as_deref().unwrap_or(
                        std::path::Path::new("/etc/ichor/github/app-private-key.pem"),
                    ))?,
                },
                (None, None, None) => {
                    return Err(Error::Other("credentials.github: no token or App".into()))
                }
            };
            let repo = cfg.github_repository().unwrap_or_default();
            Some(
                GithubClient::connect(
                    GithubConfig {
                        api_url: cfg.api_url(),
                        repo,
                        auth,
                    },
                    clock.clone(),
                )
                .await?,
            )
        }
        None => None,
    };
    let webhook_secret = match &cfg.webhook {
        Some(w) => Some(match (&w.secret_file, &w.secret_env) {
            (Some(f), _) => Secret::from_file(f)?,
            (None, Some(e)) => Secret::from_env(e)?,
            (None, None) => return Err(Error::Other("webhook: no secret".into())),
        }),
        None => None,
    };
    let mut clusters = Vec::new();
    for c in &cfg.clusters {
        let (kube, kube_error) = match KubeClient::connect(c.kubeconfig.as_deref()).await {
            Ok(k) => (Some(k), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let talos = match &c.talosconfig {
            Some(p) => {
                let ctx = crate::talos::config::load(p, None)
                    .map_err(|e| Error::Other(format!("cluster {}: {e}", c.name)))?;
                Some(Arc::new(TalosClient::new(ctx, clock.clone())))
            }
            None => None,
        };
        if c.act && kube.is_none() {
            return Err(Error::Other(format!(
                "cluster {}: cannot reach its Kubernetes API to act on it: {}",
                c.name,
                kube_error.unwrap_or_default()
            )));
        }
        clusters.push(Arc::new(ClusterRuntime {
            name: c.name.clone(),
            act: c.act,
            kube,
            talos,
            access_error: kube_error,
            paused_by: Mutex::new(None),
            git_paused: AtomicBool::new(false),
            held_at: Mutex::new(None),
            regained: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            rollout: Mutex::new(None),
            decided_tip: Mutex::new(None),
            backwards: Mutex::new(None),
        }));
    }
    let ledger =
        commands::CommandLedger::open(&cfg.state_dir, cfg.credentials.ack_key_file.as_deref())?;
    let notes = (!cfg.uses_github() || cfg.notes).then(|| {
        Arc::new(report::NotesSink {
            mirror: mirror_dir.clone(),
            remote: remote.clone(),
            lock: tokio::sync::Mutex::new(()),
            key: ledger.key.clone(),
            unpublished: Mutex::new(None),
        })
    });
    // The loop never sleeps out a rate limit: its calls answer at once, and the work is
    // queued again for when GitHub allows it (see `run_loop`).
    let github = github.map(|g| g.impatient());
    let reporters = Reporters {
        github: github.clone(),
        notes,
        clock: clock.clone(),
    };
    Ok(Arc::new(Ctx {
        cfg,
        clock,
        identity,
        mirror_dir,
        mirror: Arc::new(Mutex::new(mirror)),
        remote,
        github,
        webhook_secret,
        clusters,
        reporters,
        ledger,
        metrics: Arc::new(Metrics::default()),
        state: tokio::sync::Mutex::new(LoopState::default()),
        events,
        ready: AtomicBool::new(false),
        dedupe: Mutex::new(Default::default()),
        limits,
        body_reads: http::BodyReads::new(limits.webhook_in_flight),
        activity: watch::channel(0).0,
        rehearsal: tokio::sync::Semaphore::new(1),
    }))
}

fn git_credentials(cfg: &Config) -> Result<Credentials, Error> {
    let Some(g) = &cfg.credentials.git else {
        // A GitHub token also reads the repository over https.
        if let (config::Source::Remote(url), Some(gh)) = (cfg.source(), &cfg.credentials.github) {
            if url.starts_with("http") {
                if let Some(f) = &gh.token_file {
                    return Ok(Credentials::Token {
                        user: "x-access-token".into(),
                        token: Secret::from_file(f)?,
                    });
                }
                if let Some(e) = &gh.token_env {
                    return Ok(Credentials::Token {
                        user: "x-access-token".into(),
                        token: Secret::from_env(e)?,
                    });
                }
            }
        }
        return Ok(Credentials::None);
    };
    if let Some(key) = &g.ssh_key_file {
        return Ok(Credentials::SshKey {
            user: g.user.clone().unwrap_or_else(|| "git".into()),
            private_key: key.clone(),
            passphrase: None,
        });
    }
    if let Some(f) = &g.token_file {
        return Ok(Credentials::Token {
            user: g.user.clone().unwrap_or_else(|| "x-access-token".into()),
            token: Secret::from_file(f)?,
        });
    }
    Ok(Credentials::None)
}

/// A running controller: its HTTP addresses, its context, and how to stop it.
pub struct Running {
    pub ctx: Arc<Ctx>,
    /// `None` without a webhook secret: then nothing listens on `listen`.
    pub webhook_addr: Option<SocketAddr>,
    pub metrics_addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _watcher: Option<crate::git::watch::RefWatcher>,
}

impl Running {
    /// `http://<addr>/webhook`, when a webhook listener is bound.
    pub fn webhook_url(&self) -> Option<String> {
        self.webhook_addr.map(|a| format!("http://{a}/webhook"))
    }

    /// Wait until `cond` holds, checking after each thing the controller does, while
    /// `drive` moves a simulated clock (the twin's driver; `std::future::pending()` on a
    /// real one). False when `bound` of real time passes first: only a hang gets there.
    pub async fn wait_until(
        &self,
        drive: impl std::future::Future<Output = ()>,
        mut cond: impl FnMut() -> bool,
        bound: Duration,
    ) -> bool {
        let mut activity = self.ctx.activity.subscribe();
        let wait = async {
            loop {
                if cond() {
                    return true;
                }
                if activity.changed().await.is_err() {
                    return cond();
                }
            }
        };
        tokio::select! {
            r = tokio::time::timeout(bound, wait) => r.unwrap_or(false),
            _ = drive => false,
        }
    }

    /// Stop taking events, pause running rollouts at their next safe point (each records
    /// where it stopped), and wait for them.
    pub async fn shutdown(mut self) {
        for c in &self.ctx.clusters {
            c.stopping.store(true, Ordering::Relaxed);
        }
        let handles: Vec<JoinHandle<()>> = self
            .ctx
            .clusters
            .iter()
            .filter_map(|c| lock(&c.rollout).take())
            .collect();
        for h in handles {
            let _ = h.await;
        }
        self.stop.send_replace(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        // Hand the clusters over at once rather than after the leases run out.
        let le = &self.ctx.cfg.leader_election;
        for c in &self.ctx.clusters {
            if let Some(kube) = &c.kube {
                let _ = kube
                    .release_lease(&le.namespace, &Ctx::lease_name(&c.name), &self.ctx.identity)
                    .await;
            }
        }
        tracing::info!("ichor run stopped");
    }
}

/// Start the controller: connect, bind the listeners, start the loop and the sources.
pub async fn start(cfg: Config, clock: Clock) -> Result<Running, Error> {
    start_with(cfg, clock, http::Limits::default()).await
}

/// [`start`] with other listener limits (tests and benches: short timeouts, small caps).
pub async fn start_with(cfg: Config, clock: Clock, limits: http::Limits) -> Result<Running, Error> {
    let poll = cfg.poll_interval.as_duration();
    let local_path = match cfg.source() {
        config::Source::Path(p) => Some(p),
        config::Source::Remote(_) => None,
    };
    let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
    let ctx = connect(cfg, clock.clone(), tx.clone(), limits).await?;
    let (stop, stopped) = watch::channel(false);
    // Without a secret every delivery would be refused: nothing listens at all, so the
    // port is not there to attack.
    let webhook_listener = match &ctx.webhook_secret {
        Some(_) => Some(
            tokio::net::TcpListener::bind(ctx.cfg.listen)
                .await
                .map_err(|e| Error::Other(format!("listen {}: {e}", ctx.cfg.listen)))?,
        ),
        None => {
            tracing::info!(
                "no webhook secret configured: no webhook listener; ichor polls every {}",
                ctx.cfg.poll_interval
            );
            None
        }
    };
    let metrics_listener = tokio::net::TcpListener::bind(ctx.cfg.metrics_listen)
        .await
        .map_err(|e| Error::Other(format!("metricsListen {}: {e}", ctx.cfg.metrics_listen)))?;
    let webhook_addr = match &webhook_listener {
        Some(l) => Some(l.local_addr().map_err(|e| Error::Other(e.to_string()))?),
        None => None,
    };
    let metrics_addr = metrics_listener
        .local_addr()
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut tasks = Vec::new();
    if let Some(listener) = webhook_listener {
        tasks.push(tokio::spawn(http::serve(
            listener,
            http::webhook_router(ctx.clone()),
            http::Listener {
                name: "webhook",
                max_connections: limits.webhook_connections,
                header_timeout: limits.header_timeout,
            },
            ctx.metrics.clone(),
            stopped.clone(),
        )));
    }
    tasks.push(tokio::spawn(http::serve(
        metrics_listener,
        http::ops_router(ctx.clone()),
        http::Listener {
            name: "ops",
            max_connections: limits.ops_connections,
            header_timeout: limits.header_timeout,
        },
        ctx.metrics.clone(),
        stopped.clone(),
    )));
    // Git-only on disk: refs moving wake the loop at once.
    let watcher = match &local_path {
        Some(p) => {
            let (w, mut moved) = crate::git::watch::RefWatcher::start(p)?;
            let tx = tx.clone();
            let mut stopped = stopped.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        m = moved.recv() => {
                            if m.is_none() || tx.send(Event::Reconcile).await.is_err() {
                                return;
                            }
                        }
                        _ = stopped.changed() => return,
                    }
                }
            }));
            Some(w)
        }
        None => None,
    };
    // Each cluster's controller lease is renewed well within its duration, so a replica
    // keeps its clusters between events and a standby takes over only after a real loss.
    for cluster in ctx.clusters.iter().filter(|c| c.kube.is_some()) {
        let (ctx, cluster, mut stopped) = (ctx.clone(), cluster.clone(), stopped.clone());
        let every = ctx.cfg.leader_election.lease_duration.as_duration() / 3;
        tasks.push(tokio::spawn(async move {
            loop {
                ctx.renew(&cluster).await;
                tokio::select! {
                    _ = ctx.clock.sleep(every) => {}
                    _ = stopped.changed() => return,
                }
            }
        }));
    }
    tasks.push(tokio::spawn(run_loop(ctx.clone(), rx, poll, stopped)));
    let _ = tx.send(Event::Reconcile).await;
    let webhook = webhook_addr.map_or_else(|| "none".to_string(), |a| a.to_string());
    tracing::info!(webhook_addr = %webhook, %metrics_addr, identity = %ctx.identity, "ichor run started");
    Ok(Running {
        ctx,
        webhook_addr,
        metrics_addr,
        stop,
        tasks,
        _watcher: watcher,
    })
}

/// Take events until stopped: a burst is coalesced, each event handled, errors through
/// the error policy; a quiet period ends in a reconcile.
async fn run_loop(
    ctx: Arc<Ctx>,
    mut rx: mpsc::Receiver<Event>,
    poll: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let mut next_reconcile = ctx.clock.now().plus(poll);
    loop {
        let first = tokio::select! {
            e = rx.recv() => match e {
                Some(e) => e,
                None => return,
            },
            _ = ctx.clock.sleep_until(next_reconcile) => Event::Reconcile,
            _ = stopped.changed() => return,
        };
        let mut batch = vec![first];
        while let Ok(e) = rx.try_recv() {
            batch.push(e);
            if batch.len() >= QUEUE_CAPACITY {
                break;
            }
        }
        let (events, dropped) = coalesce(batch);
        for _ in 0..dropped {
            ctx.metrics.inc(
                "ichor_stale_events_total",
                "PR heads superseded by a newer head before they were judged.",
                &[],
            );
        }
        for e in events {
            if *stopped.borrow() {
                return;
            }
            if matches!(e, Event::Reconcile) {
                next_reconcile = ctx.clock.now().plus(poll);
            }
            ctx.metrics.inc(
                "ichor_events_total",
                "Events the loop has started to handle, by kind.",
                &[("event", e.kind())],
            );
            let again = e.clone();
            if let Err(err) = handle(&ctx, e).await {
                let after = error_policy(&ctx, &err);
                match (err.rate_limited_for(), again) {
                    // GitHub asked to wait: the event goes back on the queue once the wait
                    // is over, and the loop goes on with other work meanwhile.
                    (Some(wait), ev) if !matches!(ev, Event::Reconcile) => {
                        ctx.metrics.inc(
                            "ichor_requeued_events_total",
                            "Events put back on the queue because GitHub asked to wait.",
                            &[],
                        );
                        let (clock, tx) = (ctx.clock.clone(), ctx.events.clone());
                        tokio::spawn(async move {
                            clock.sleep(wait).await;
                            let _ = tx.send(ev).await;
                        });
                    }
                    _ => {
                        if let Some(after) = after {
                            next_reconcile = next_reconcile.min(ctx.clock.now().plus(after));
                        }
                    }
                }
            }
        }
        ctx.bump();
    }
}

impl Event {
    /// A fixed label for metrics: never anything a peer sent.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Reconcile => "reconcile",
            Event::PullUpdated { .. } => "pull_updated",
            Event::PullClosed { .. } => "pull_closed",
            Event::Pushed { .. } => "pushed",
            Event::MergeGroup { .. } => "merge_group",
            Event::Comment { .. } => "comment",
        }
    }
}

/// Handle one event (controller-rs' `reconcile`).
pub async fn handle(ctx: &Arc<Ctx>, event: Event) -> Result<(), Error> {
    tracing::debug!(?event, "event");
    match event {
        Event::Reconcile | Event::Pushed { .. } => reconcile(ctx).await,
        // A delivery only says "look now": GitHub neither orders deliveries nor redelivers
        // a lost one, so the head judged is the one the API reports.
        Event::PullUpdated { number, .. } => {
            ctx.sync().await?;
            gating::gate_pull_number(ctx, number, false)
                .await
                .map(|_| ())
        }
        Event::PullClosed { number } => {
            let mut st = ctx.state.lock().await;
            st.latest_head.remove(&number);
            st.judged.remove(&number.to_string());
            // A merge shows up as the branch moving: look at it now.
            drop(st);
            reconcile(ctx).await
        }
        Event::MergeGroup {
            head_sha,
            head_ref,
            base_ref,
        } => {
            ctx.sync().await?;
            // The group's head is what lands on the base: judged against it like a PR.
            let c = gating::Candidate {
                key: head_ref.clone(),
                pr: None,
                branch: head_ref,
                head: head_sha,
                base_ref,
                from_fork: false,
            };
            gating::gate(ctx, &c, false).await.map(|_| ())
        }
        Event::Comment {
            number,
            comment_id,
            created_at,
            author,
            body,
        } => {
            let c = commands::Comment {
                number,
                id: comment_id,
                created_at,
                author: &author,
                body: &body,
            };
            commands::on_comment(ctx, &c).await
        }
    }
}

/// Everything again: fetch, gate every open PR whose head is new, roll out what reached
/// the protected branch, run Git-only commands.
pub async fn reconcile(ctx: &Arc<Ctx>) -> Result<(), Error> {
    ctx.metrics
        .inc("ichor_reconciles_total", "Reconciles run.", &[]);
    ctx.sync().await?;
    if let Some(gh) = ctx.github.as_ref().filter(|g| g.repository_id().is_none()) {
        // Once, so webhooks of the repository renamed or transferred are still known by id.
        if let Err(e) = gh.learn_repository_id().await {
            tracing::debug!(error = %e, "the repository's id is not known yet");
        }
    }
    gating::gate_open(ctx).await?;
    rolling::on_branch(ctx).await?;
    if ctx.github.is_none() {
        commands::git_commands(ctx).await?;
    }
    ctx.reporters.publish_notes().await
}

/// The clusters a repository revision holds, and whether there are several.
pub(crate) fn several_clusters(repo: &crate::git::Repo, rev: &str) -> bool {
    repo.resolve(rev)
        .and_then(|r| repo.clusters(&r))
        .map(|c| c.len() > 1)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(n: u64, h: &str) -> Event {
        Event::PullUpdated {
            number: n,
            head_sha: h.into(),
        }
    }

    #[test]
    fn a_burst_keeps_the_newest_head_of_each_pr() {
        let (out, dropped) = coalesce(vec![
            up(1, "a"),
            Event::Reconcile,
            up(2, "x"),
            up(1, "b"),
            Event::Reconcile,
            Event::Comment {
                number: 1,
                comment_id: 7,
                created_at: None,
                author: "u".into(),
                body: "/ichor plan".into(),
            },
            up(3, "y"),
            Event::PullClosed { number: 3 },
        ]);
        assert_eq!(dropped, 2);
        assert_eq!(out[0], Event::Reconcile);
        assert_eq!(out[1], up(2, "x"));
        assert_eq!(out[2], up(1, "b"));
        assert!(matches!(out[3], Event::Comment { .. }));
        assert_eq!(out[4], Event::PullClosed { number: 3 });
        assert_eq!(out.len(), 5);
    }
}
