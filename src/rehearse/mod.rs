//! `ichor rehearse`: the real engine (the code `ichor rollout` runs) against a twin of the
//! cluster, over the real protocols, under a fault schedule drawn from a seed, with every
//! safety rule judged from the twin's ground truth after every tick of its clock.
//!
//! One seed is one world: the twin built from the base revision's cluster folder, started
//! at the next opening of its maintenance window on the simulated clock, the schedule
//! [`schedule::draw`] gives, and the engine run until the target is reached. When the
//! rollout pauses, the rehearsal plays the operator: it names the injected fault that
//! explains the pause (a pause no fault explains is a finding), clears every active fault
//! and resumes, as `ichor rollout --resume` would. An engine kill drops the engine's task
//! at that instant, as a killed process, and starts a new one from the record it left.
//!
//! It sits beside `ichor demo`, above the rollout engine and the twin; nothing below it
//! imports it.

pub mod invariants;
pub mod schedule;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use crate::clock::{Clock, Timestamp};
use crate::gate::live::{lock_name, ICHOR_NAMESPACE};
use crate::gate::{self, live};
use crate::git::Repo;
use crate::kube::KubeClient;
use crate::plan::PlanOptions;
use crate::rollout::{Progress, Rollout, RunOutcome, Target};
use crate::sim::talos::Role;
use crate::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
use crate::talos::TalosClient;

pub use invariants::{Cordon, Judge, LeaseRule, Violation};
pub use schedule::{Fault, FaultKind};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Why a rehearsal could not run (not what it found: that is in the reports).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RehearseError(pub String);

/// What to rehearse.
#[derive(Debug, Clone)]
pub struct Options {
    pub repo: PathBuf,
    pub base: String,
    pub head: String,
    pub cluster: Option<String>,
    /// The faults a schedule may draw.
    pub alphabet: Vec<FaultKind>,
    /// Keep each seed's full event log in its report (always kept for a seed that broke a
    /// rule or got stuck).
    pub keep_log: bool,
    /// A bug planted in the engine, to show the checker catches it (tests only).
    #[doc(hidden)]
    pub planted: Option<crate::rollout::PlantedBug>,
}

/// How one seed ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SeedOutcome {
    /// The target reached, every rule held.
    Completed,
    /// A rule broke (the rollout may have finished anyway).
    Violation,
    /// The rollout could not finish once its faults were cleared.
    Stuck,
}

/// A pause and the injected fault that explains it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PauseSeen {
    /// Simulated seconds from the rollout's start.
    pub at: u64,
    pub cause: String,
    /// The fault that explains it (`kind target`), or none: a finding.
    pub fault: Option<String>,
}

/// A violation at its instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ViolationSeen {
    pub rule: &'static str,
    /// Simulated seconds from the rollout's start.
    pub at: u64,
    /// What was broken and by which nodes (the action that broke it is the last engine
    /// line before it in the log).
    pub action: String,
}

/// One seed's rehearsal.
#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    pub outcome: SeedOutcome,
    pub faults: Vec<Fault>,
    pub pauses: Vec<PauseSeen>,
    pub violations: Vec<ViolationSeen>,
    /// Simulated seconds from the start to the target, when it was reached.
    pub makespan: Option<u64>,
    /// Why it is stuck, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stuck: Option<String>,
    /// Everything that happened, in order: faults, the engine's lines, pauses, violations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub log: Vec<String>,
}

impl SeedReport {
    /// A pause no injected fault explains.
    pub fn unexplained_pauses(&self) -> usize {
        self.pauses.iter().filter(|p| p.fault.is_none()).count()
    }

    /// Whether this seed holds: completed, no rule broken, every pause explained.
    pub fn holds(&self) -> bool {
        self.outcome == SeedOutcome::Completed && self.unexplained_pauses() == 0
    }
}

/// Simulated time after which a seed's rollout counts as never ending.
pub const NEVER_ENDING: Duration = Duration::from_secs(24 * 3600);
/// Engine incarnations (first run, resumes, restarts) before a seed counts as stuck.
pub const MAX_INCARNATIONS: usize = 40;
/// The engine's Lease holder in a rehearsal.
const HOLDER: &str = "ichor-rehearse";
/// How long the operator takes to look at a pause before clearing its faults and resuming:
/// meanwhile nothing may be disrupted (`quietWhilePaused`).
pub const OPERATOR_REACTS: Duration = Duration::from_secs(300);

/// Check what can be checked before any seed runs: the repository, both revisions, the
/// cluster, its documents. An error here is bad input.
pub fn check(opts: &Options) -> Result<(), RehearseError> {
    checked(opts).map_err(|e| RehearseError(e.to_string()))
}

fn checked(opts: &Options) -> Result<(), Error> {
    let repo = Repo::open(&opts.repo)?;
    let change = gate::load(&repo, &opts.base, &opts.head, opts.cluster.as_deref())?;
    if change.cluster_doc.is_none() {
        return Err(format!(
            "clusters/{}/cluster.yaml does not exist at {}: the twin is built from it",
            change.cluster, opts.base
        )
        .into());
    }
    Ok(())
}

/// Rehearse one seed on the current (single-threaded) runtime.
pub async fn rehearse_seed(opts: &Options, seed: u64) -> Result<SeedReport, RehearseError> {
    let run = async {
        let state = tempfile::tempdir()?;
        let world = World::build(opts, state.path()).await?;
        world.run(opts, seed).await
    };
    run.await.map_err(|e: Error| RehearseError(e.to_string()))
}

/// Rehearse `seeds` on `jobs` threads, each seed on a runtime of its own (one thread, the
/// simulated clock), calling `done` as each finishes. Reports come back in seed order.
pub fn rehearse_seeds(
    opts: &Options,
    seeds: &[u64],
    jobs: usize,
    done: &(dyn Fn(&SeedReport) + Sync),
) -> Result<Vec<SeedReport>, RehearseError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<BTreeMap<usize, Result<SeedReport, String>>> = Default::default();
    std::thread::scope(|scope| -> Result<(), RehearseError> {
        let mut handles = Vec::new();
        for _ in 0..jobs.max(1).min(seeds.len().max(1)) {
            let (next, results) = (&next, &results);
            let h = std::thread::Builder::new()
                // A rollout's futures nest deep; see `runtime()` in src/main.rs.
                .stack_size(8 << 20)
                .spawn_scoped(scope, move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(&seed) = seeds.get(i) else { break };
                    let r = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())
                        .and_then(|rt| {
                            rt.block_on(rehearse_seed(opts, seed))
                                .map_err(|e| e.to_string())
                        });
                    if let Ok(report) = &r {
                        done(report);
                    }
                    if let Ok(mut m) = results.lock() {
                        m.insert(i, r);
                    }
                })
                .map_err(|e| RehearseError(format!("start a rehearsal thread: {e}")))?;
            handles.push(h);
        }
        for h in handles {
            h.join()
                .map_err(|_| RehearseError("a rehearsal thread panicked".into()))?;
        }
        Ok(())
    })?;
    let results = results
        .into_inner()
        .map_err(|_| RehearseError("a rehearsal thread panicked".into()))?;
    let mut out = Vec::new();
    for (i, r) in results {
        out.push(r.map_err(|e| RehearseError(format!("seed {}: {e}", seeds[i])))?);
    }
    Ok(out)
}

/// The summary of many seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub seeds: usize,
    pub completed: usize,
    pub violations: usize,
    pub stuck: usize,
    #[serde(rename = "unexplainedPauses")]
    pub unexplained_pauses: usize,
    /// Pauses by the fault kind that explains them (`unexplained` for none).
    #[serde(rename = "pausesByCause")]
    pub pauses_by_cause: BTreeMap<String, usize>,
    /// Makespan percentiles over the seeds that completed, in simulated seconds.
    #[serde(rename = "makespanP50")]
    pub makespan_p50: Option<u64>,
    #[serde(rename = "makespanP90")]
    pub makespan_p90: Option<u64>,
    #[serde(rename = "makespanMax")]
    pub makespan_max: Option<u64>,
}

impl Summary {
    pub fn of(reports: &[SeedReport]) -> Summary {
        let count = |o: SeedOutcome| reports.iter().filter(|r| r.outcome == o).count();
        let mut pauses_by_cause = BTreeMap::new();
        for p in reports.iter().flat_map(|r| &r.pauses) {
            let key = p
                .fault
                .as_deref()
                .and_then(|f| f.split_whitespace().next())
                .unwrap_or("unexplained")
                .to_string();
            *pauses_by_cause.entry(key).or_insert(0) += 1;
        }
        let mut spans: Vec<u64> = reports.iter().filter_map(|r| r.makespan).collect();
        spans.sort_unstable();
        let pct = |p: usize| -> Option<u64> {
            if spans.is_empty() {
                return None;
            }
            let i = ((spans.len() * p).div_ceil(100)).saturating_sub(1);
            spans.get(i.min(spans.len() - 1)).copied()
        };
        Summary {
            seeds: reports.len(),
            completed: count(SeedOutcome::Completed),
            violations: count(SeedOutcome::Violation),
            stuck: count(SeedOutcome::Stuck),
            unexplained_pauses: reports.iter().map(SeedReport::unexplained_pauses).sum(),
            pauses_by_cause,
            makespan_p50: pct(50),
            makespan_p90: pct(90),
            makespan_max: spans.last().copied(),
        }
    }

    /// Every seed held.
    pub fn holds(&self) -> bool {
        self.completed == self.seeds && self.unexplained_pauses == 0
    }

    /// The one line a gated PR's comment carries (Markdown): how many times it was
    /// rehearsed, what broke, the makespan, and how to replay the first seed that did not
    /// hold. `asked` seeds were asked for; fewer ran when the time budget ran out.
    pub fn gate_line(&self, reports: &[SeedReport], asked: usize, replay: &str) -> String {
        let span = |s: Option<u64>| {
            s.map(|s| crate::releaseset::HumanDuration(Duration::from_secs(s)).to_string())
                .unwrap_or_else(|| "-".into())
        };
        let times = if self.seeds == 1 { "time" } else { "times" };
        let mut line = format!("Rehearsed {} {times} with random faults", self.seeds);
        if self.seeds < asked {
            line.push_str(&format!(
                " ({} of {asked} seeds within the time budget)",
                self.seeds
            ));
        }
        let broken: usize = reports.iter().map(|r| r.violations.len()).sum();
        let rules = if broken == 1 { "rule" } else { "rules" };
        line.push_str(&format!(": {broken} {rules} broken"));
        if self.stuck > 0 {
            line.push_str(&format!(", {} stuck", self.stuck));
        }
        if self.unexplained_pauses > 0 {
            line.push_str(&format!(
                ", {} unexplained pause{}",
                self.unexplained_pauses,
                if self.unexplained_pauses == 1 {
                    ""
                } else {
                    "s"
                }
            ));
        }
        line.push_str(&format!(
            "; makespan p50 {}, p90 {} (simulated, under faults)",
            span(self.makespan_p50),
            span(self.makespan_p90)
        ));
        if let Some(r) = reports.iter().find(|r| !r.holds()) {
            let what = r
                .violations
                .first()
                .map(|v| v.rule.to_string())
                .unwrap_or_else(|| format!("{:?}", r.outcome).to_lowercase());
            line.push_str(&format!(
                ". First: seed {} ({what}); replay with: {replay} --seed {}",
                r.seed, r.seed
            ));
        }
        line.push('.');
        line
    }
}

/// ichor's clients on `twin` (Kubernetes, Talos, on the twin's clock) and a plain kube-rs
/// client for what an operator does by hand: what a rehearsal and the rollout tests share.
pub async fn clients(twin: &Twin) -> Result<(KubeClient, TalosClient, kube::Client), Error> {
    let kube = KubeClient::connect(Some(twin.kubeconfig())).await?;
    let clock = twin.talos.clock().clone();
    let talos = TalosClient::new(crate::talos::config::load(twin.talosconfig(), None)?, clock);
    let kc = kube::config::Kubeconfig::read_from(twin.kubeconfig())?;
    let raw = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
    )?;
    Ok((kube, talos, raw))
}

/// The twin of the cluster and ichor's clients on it, ready to roll.
struct World {
    twin: Twin,
    kube: KubeClient,
    talos: TalosClient,
    raw: kube::Client,
    change: gate::Change,
    plan: crate::plan::Plan,
}

impl World {
    async fn build(opts: &Options, state: &Path) -> Result<World, Error> {
        let repo = Repo::open(&opts.repo)?;
        let change = gate::load(&repo, &opts.base, &opts.head, opts.cluster.as_deref())?;
        // The cluster as the base revision describes it: what runs before the merge.
        let base = repo.resolve(&opts.base)?;
        let dir = state.join("cluster");
        std::fs::create_dir_all(&dir)?;
        for f in ["cluster.yaml", "release-set.yaml"] {
            let path = format!("clusters/{}/{f}", change.cluster);
            let text = repo
                .read_file(&base, &path)?
                .ok_or_else(|| format!("{path} does not exist at {}", opts.base))?;
            std::fs::write(dir.join(f), text)?;
        }
        let windows = change
            .cluster_doc
            .as_ref()
            .map(|d| d.spec.rollout.maintenance_windows.clone())
            .unwrap_or_default();
        // A fixed start (the manual clock's), moved to the window's opening: every seed and
        // every machine starts from the same instant.
        let start = crate::rollout::window::next_open(&windows, Clock::manual().now());
        let twin = Twin::start(
            Clock::manual_at(start),
            &ClusterFolder::read(&dir)?,
            &state.join("twin"),
            TwinOptions {
                config: TwinConfig::default(),
                github: None,
            },
        )
        .await?;
        twin.advance(Duration::from_secs(30));
        let (kube, talos, raw) = clients(&twin).await?;
        let facts = live::observe(&kube, Some(&talos), &live::Subject::of(&change)).await;
        let nodes = live::live_nodes(&facts).ok_or("the twin's nodes could not be read")?;
        let plan = gate::plan_with(&change, &PlanOptions::default(), Some(&nodes))?;
        Ok(World {
            twin,
            kube,
            talos,
            raw,
            change,
            plan,
        })
    }

    fn targets(&self) -> schedule::Targets {
        let obs = self.twin.talos.observe();
        let of = |role: Role| -> Vec<String> {
            obs.iter()
                .filter(|o| o.role == role)
                .map(|o| o.name.clone())
                .collect()
        };
        let (pdbs, volumes) = self.twin.kube.with(|c, _| {
            let field =
                |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
            let pdbs = c
                .list("poddisruptionbudgets", None)
                .iter()
                .filter_map(|p| {
                    Some(format!(
                        "{}/{}",
                        field(p, "/metadata/namespace")?,
                        field(p, "/metadata/name")?
                    ))
                })
                .collect();
            let volumes = c
                .list("volumes", None)
                .iter()
                .filter_map(|v| field(v, "/metadata/name"))
                .collect();
            (pdbs, volumes)
        });
        let versions = obs
            .iter()
            .map(|o| {
                let v = o.talos_version.trim_start_matches('v');
                (o.name.clone(), format!("v{v}"))
            })
            .collect();
        let legacy_upgrade = obs.iter().any(|o| {
            crate::sim::talos::config::parse_version(&o.talos_version)
                .is_some_and(|(major, minor, _)| major == 1 && minor <= 12)
        });
        schedule::Targets {
            control_planes: of(Role::ControlPlane),
            workers: of(Role::Worker),
            pdbs,
            volumes,
            versions,
            lease: Some(format!(
                "{ICHOR_NAMESPACE}/{}",
                lock_name(&self.change.cluster)
            )),
            legacy_upgrade,
        }
    }

    fn target(&self) -> Target {
        let rs = &self.change.head_release_set.spec;
        Target {
            commit: self
                .change
                .head
                .commit
                .map(|c| c.to_string())
                .unwrap_or_default(),
            talos: rs.talos.clone(),
            kubernetes: rs.kubernetes.clone(),
        }
    }

    async fn run(self, opts: &Options, seed: u64) -> Result<SeedReport, Error> {
        let doc = self
            .change
            .cluster_doc
            .clone()
            .ok_or("the cluster has no cluster.yaml")?;
        let max_unavailable = doc.spec.rollout.max_unavailable.get() as usize;
        let faults = schedule::draw(
            seed,
            &opts.alphabet,
            &self.targets(),
            Duration::from_secs(self.plan.estimate_secs),
        );
        let clock = self.twin.clock.clone();
        let t0 = clock.now();
        let target = self.target();
        let run = Run {
            world: &self,
            t0,
            log: std::sync::Mutex::new(Vec::new()),
            judge: RefCell::new(Judge::new(max_unavailable).watch_calls(
                self.twin.talos.audit_log_path(),
                Some(target.talos.to_string()),
                Some(LeaseRule {
                    namespace: ICHOR_NAMESPACE.to_string(),
                    name: lock_name(&self.change.cluster),
                    holder: HOLDER.to_string(),
                }),
            )),
            violations: RefCell::new(Vec::new()),
            pending: RefCell::new(faults.clone()),
            active: RefCell::new(Vec::new()),
            applied: RefCell::new(Vec::new()),
            void_cordons: RefCell::new(BTreeSet::new()),
        };
        for f in &faults {
            run.say(format!("scheduled {f} at +{}s", f.at.as_secs()));
        }
        let mut pauses = Vec::new();
        let mut resume = false;
        let mut stuck = None;
        let mut makespan = None;
        for incarnation in 0.. {
            if incarnation >= MAX_INCARNATIONS {
                stuck = Some(format!("{MAX_INCARNATIONS} engine runs did not finish"));
                break;
            }
            let (log, engine_clock) = (&run.log, clock.clone());
            let report = move |p: Progress| {
                say(
                    log,
                    engine_clock.now().since(t0).as_secs(),
                    format!("engine: {p}"),
                );
            };
            let mut engine = Rollout::new(
                &self.kube,
                &self.talos,
                clock.clone(),
                &self.change.cluster,
                HOLDER,
            )
            .for_cluster(&doc);
            engine.report = Some(&report);
            engine.planted = opts.planted;
            let ended = tokio::select! {
                r = engine.run(&self.plan, &target, Some(&self.change), resume) => Some(r),
                _ = self.twin.drive(Duration::from_secs(2), || run.judge_now()) => unreachable!("the driver never ends"),
                () = run.faults_until_kill() => None,
                _ = clock.sleep_until(t0.plus(NEVER_ENDING)) => {
                    stuck = Some(format!("not done after {} simulated hours", NEVER_ENDING.as_secs() / 3600));
                    break;
                }
            };
            drop(engine);
            match ended {
                None => {
                    run.say("engine killed; a new one starts from its record".into());
                    resume = false;
                }
                Some(Ok(RunOutcome::Completed { .. })) => {
                    run.judge_now();
                    let behind = run.behind_target(&target);
                    if behind.is_empty() {
                        makespan = Some(clock.now().since(t0).as_secs());
                        run.say("completed".into());
                    } else {
                        run.violation(
                            "completedAtTarget",
                            format!("the rollout said done while {}", behind.join(", ")),
                        );
                    }
                    break;
                }
                Some(Ok(RunOutcome::Paused(p))) => {
                    let cause = match &p.node {
                        Some(n) => format!("{} {n}: {}", p.stage, p.reason),
                        None => format!("{}: {}", p.stage, p.reason),
                    };
                    let fault = run.explain(&p);
                    run.say(format!(
                        "paused: {cause} — explained by {}",
                        fault.as_deref().unwrap_or("no injected fault (a finding)")
                    ));
                    pauses.push(PauseSeen {
                        at: clock.now().since(t0).as_secs(),
                        cause,
                        fault,
                    });
                    run.operator_reacts().await;
                    run.clear_all().await?;
                    // After an A/B fallback ichor waits for the node to be upgraded by
                    // hand (its pause says so): the operator does, then resumes.
                    if let Some(node) = run.fell_back(&p, &target) {
                        run.upgrade_by_hand(&node, &target).await?;
                    }
                    run.judge.borrow_mut().paused(false, clock.now());
                    resume = true;
                }
                Some(Ok(RunOutcome::Refused(why))) => {
                    // The lock taken by someone else: the controller tries again once it is
                    // free, as a new engine reading the record.
                    let Some(fault) = run.explain_refusal(&why) else {
                        stuck = Some(format!("refused: {why}"));
                        break;
                    };
                    run.say(format!("refused: {why} — explained by {fault}"));
                    pauses.push(PauseSeen {
                        at: clock.now().since(t0).as_secs(),
                        cause: format!("refused: {why}"),
                        fault: Some(fault),
                    });
                    run.wait(crate::rollout::LOCK_DURATION + Duration::from_secs(5))
                        .await;
                    resume = false;
                }
                Some(Err(e)) => {
                    // As an operator would: run it again (the record says where it stood).
                    run.say(format!("engine error: {e}; run again"));
                    pauses.push(PauseSeen {
                        at: clock.now().since(t0).as_secs(),
                        cause: format!("error: {e}"),
                        fault: run.explain_error(),
                    });
                    run.operator_reacts().await;
                    run.clear_all().await?;
                    run.judge.borrow_mut().paused(false, clock.now());
                    resume = true;
                }
            }
        }
        let violations = run.violations.into_inner();
        let outcome = if !violations.is_empty() {
            SeedOutcome::Violation
        } else if makespan.is_some() {
            SeedOutcome::Completed
        } else {
            if stuck.is_none() {
                stuck = Some("the rollout did not reach its target".into());
            }
            SeedOutcome::Stuck
        };
        let mut log = run.log.into_inner().unwrap_or_else(|e| e.into_inner());
        log.extend(
            run.judge
                .into_inner()
                .attributed
                .into_iter()
                .map(|a| format!("(a fault, not ichor) {a}")),
        );
        let keep = opts.keep_log || outcome != SeedOutcome::Completed;
        Ok(SeedReport {
            seed,
            outcome,
            faults,
            pauses,
            violations,
            makespan,
            stuck,
            log: if keep { log } else { Vec::new() },
        })
    }
}

/// One line of a seed's log, stamped with its simulated offset.
fn say(log: &std::sync::Mutex<Vec<String>>, at: u64, line: String) {
    if let Ok(mut l) = log.lock() {
        l.push(format!("+{at:>6}s {line}"));
    }
}

/// The state of one seed's run, shared by the engine's driver, the fault schedule and the
/// checker (one thread: RefCells, never borrowed across an await).
struct Run<'w> {
    world: &'w World,
    t0: Timestamp,
    /// Also written by the engine's progress callback, which must be `Sync`.
    log: std::sync::Mutex<Vec<String>>,
    judge: RefCell<Judge>,
    violations: RefCell<Vec<ViolationSeen>>,
    /// Faults still to strike, in time order.
    pending: RefCell<Vec<Fault>>,
    /// Faults striking now, with the instant each clears by itself.
    active: RefCell<Vec<(Fault, Option<Timestamp>)>>,
    /// Every fault that struck so far (a pause may come after its fault cleared).
    applied: RefCell<Vec<Fault>>,
    /// Operator cordons that found the node cordoned already, so sent nothing.
    void_cordons: RefCell<BTreeSet<String>>,
}

impl Run<'_> {
    fn offset(&self) -> u64 {
        self.world.twin.clock.now().since(self.t0).as_secs()
    }

    fn say(&self, line: String) {
        say(&self.log, self.offset(), line);
    }

    fn violation(&self, rule: &'static str, action: String) {
        let at = self.offset();
        self.say(format!("VIOLATION {rule}: {action}"));
        self.violations
            .borrow_mut()
            .push(ViolationSeen { rule, at, action });
    }

    /// The operator's reaction time after a pause: the world goes on (and is judged), the
    /// engine is gone, nothing may be disrupted.
    async fn operator_reacts(&self) {
        self.judge
            .borrow_mut()
            .paused(true, self.world.twin.clock.now());
        self.wait(OPERATOR_REACTS).await;
    }

    /// Let `d` of simulated time pass with no engine, judging every tick.
    async fn wait(&self, d: Duration) {
        let clock = &self.world.twin.clock;
        tokio::select! {
            biased;
            _ = self.world.twin.drive(Duration::from_secs(2), || self.judge_now()) => {}
            _ = clock.sleep(d) => {}
        }
    }

    /// Every rule, now; a rule newly broken is recorded once per stretch it stays broken.
    fn judge_now(&self) {
        let found = self.judge.borrow_mut().judge(&self.world.twin);
        for v in found {
            let already = self
                .violations
                .borrow()
                .iter()
                .any(|s| s.rule == v.rule && s.action == v.detail);
            if !already {
                self.violation(v.rule, v.detail);
            }
        }
    }

    /// Nodes not at the target, as a list of "node runs X".
    fn behind_target(&self, target: &Target) -> Vec<String> {
        let (talos, kubernetes) = (target.talos.to_string(), target.kubernetes.to_string());
        let mut out = Vec::new();
        for o in self.world.twin.talos.observe() {
            if o.talos_version != talos {
                out.push(format!("{} runs Talos {}", o.name, o.talos_version));
            }
            if !o.kubelet_version.ends_with(&kubernetes) {
                out.push(format!("{} runs kubelet {}", o.name, o.kubelet_version));
            }
            for p in &o.static_pods {
                if !p.image.ends_with(&format!(":{kubernetes}")) {
                    out.push(format!("{} runs {}", o.name, p.image));
                }
            }
        }
        out
    }

    /// Strike and clear faults as their times come, until an engine kill is due (then
    /// return: the caller drops the engine).
    async fn faults_until_kill(&self) {
        loop {
            let next_strike = self.pending.borrow().first().map(|f| self.t0.plus(f.at));
            let next_clear = self
                .active
                .borrow()
                .iter()
                .filter_map(|(_, until)| *until)
                .min();
            let next = match (next_strike, next_clear) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => return std::future::pending().await,
            };
            self.world.twin.clock.sleep_until(next).await;
            let now = self.world.twin.clock.now();
            // Clear what is due first, then strike.
            let due: Vec<Fault> = {
                let mut active = self.active.borrow_mut();
                let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut *active)
                    .into_iter()
                    .partition(|(_, until)| until.is_some_and(|u| u <= now));
                *active = keep;
                due.into_iter().map(|(f, _)| f).collect()
            };
            for f in due {
                self.say(format!("fault cleared: {f}"));
                if let Err(e) = self.post_kind(f.kind, Some(&f), false).await {
                    self.say(format!("(could not clear {f}: {e})"));
                }
            }
            let strike: Vec<Fault> = {
                let mut pending = self.pending.borrow_mut();
                let n = pending
                    .iter()
                    .take_while(|f| self.t0.plus(f.at) <= now)
                    .count();
                pending.drain(..n).collect()
            };
            for f in strike {
                self.say(format!("fault: {f}"));
                self.applied.borrow_mut().push(f.clone());
                if f.kind == FaultKind::EngineKilled {
                    return;
                }
                let until = f.lasts.map(|l| now.plus(l));
                if f.lasts.is_some() {
                    self.active.borrow_mut().push((f.clone(), until));
                }
                if let Err(e) = self.post_kind(f.kind, Some(&f), true).await {
                    self.say(format!("(could not strike {f}: {e})"));
                }
            }
        }
    }

    /// Send the twin the current state of `kind`'s faults (after `changed` struck or
    /// cleared), and tell the checker what the faults do now.
    async fn post_kind(
        &self,
        kind: FaultKind,
        changed: Option<&Fault>,
        on: bool,
    ) -> Result<(), Error> {
        if kind == FaultKind::OperatorCordon {
            // The checker excuses the cordon from before it is set to after it is lifted,
            // and holds ichor to it only while it stands.
            if let Some(node) = changed.and_then(|f| f.target.as_deref()) {
                if on && self.cordoned(node).await? {
                    // `kubectl cordon` on a cordoned node says "already cordoned" and sends
                    // nothing: no cordon of the operator's stands, and none is lifted later.
                    self.say(format!("operator: {node} already cordoned, nothing sent"));
                    self.void_cordons.borrow_mut().insert(node.to_string());
                    return Ok(());
                }
                if !on && self.void_cordons.borrow_mut().remove(node) {
                    return Ok(());
                }
                let (before, after) = if on {
                    (Cordon::Setting, Cordon::Standing)
                } else {
                    (Cordon::Lifting, Cordon::Gone)
                };
                self.judge.borrow_mut().operator_cordon(node, before);
                self.cordon(node, on).await?;
                self.judge.borrow_mut().operator_cordon(node, after);
            }
            return Ok(());
        }
        if kind == FaultKind::OperatorHold {
            if let Some(node) = changed.and_then(|f| f.target.as_deref()) {
                let now = || self.world.twin.clock.now();
                let (before, after) = if on {
                    (Cordon::Setting, Cordon::Standing)
                } else {
                    (Cordon::Lifting, Cordon::Gone)
                };
                self.judge.borrow_mut().operator_hold(node, before, now());
                self.hold(node, on).await?;
                self.judge.borrow_mut().operator_hold(node, after, now());
            }
            return Ok(());
        }
        if kind == FaultKind::BarePod {
            if let Some(node) = changed.and_then(|f| f.target.as_deref()) {
                self.bare_pod(node, on).await?;
            }
            return Ok(());
        }
        self.tell_judge();
        let active: Vec<Fault> = self
            .active
            .borrow()
            .iter()
            .map(|(f, _)| f.clone())
            .collect();
        let mut refs: Vec<&Fault> = active.iter().collect();
        // A burst or a stolen lock is not "active" for a duration: it is sent once.
        if matches!(kind, FaultKind::ApiErrors | FaultKind::LeaseStolen) && on {
            if let Some(f) = changed {
                refs.push(f);
            }
        }
        let Some(doc) = Fault::document(kind, &refs) else {
            return Ok(());
        };
        self.post(doc).await
    }

    fn tell_judge(&self) {
        let active = self.active.borrow();
        let of = |k: FaultKind| -> BTreeSet<String> {
            active
                .iter()
                .filter(|(f, _)| f.kind == k)
                .filter_map(|(f, _)| f.target.clone())
                .collect()
        };
        self.judge
            .borrow_mut()
            .set_faults(of(FaultKind::KubeletSilent), of(FaultKind::EtcdUnhealthy));
    }

    async fn post(&self, doc: Value) -> Result<(), Error> {
        let req = http::Request::post("/_twin/faults")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&doc)?)?;
        self.world.raw.request_text(req).await?;
        Ok(())
    }

    /// Whether the Node of machine `node` is cordoned now.
    async fn cordoned(&self, node: &str) -> Result<bool, Error> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.world.raw.clone());
        let n = nodes.get(&self.world.twin.node_name(node)).await?;
        Ok(n.spec.and_then(|s| s.unschedulable).unwrap_or(false))
    }

    /// An operator's `kubectl annotate node N ichor.dev/hold=…` (or its removal).
    async fn hold(&self, node: &str, on: bool) -> Result<(), Error> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.world.raw.clone());
        let value = on.then_some("rehearsal: an operator holds this node");
        nodes
            .patch(
                &self.world.twin.node_name(node),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"annotations": {crate::kube::HOLD: value}}}),
                ),
            )
            .await?;
        Ok(())
    }

    /// A pod with no controller bound to `node` (someone's `kubectl run` with a node
    /// name), or the operator's deletion of it.
    async fn bare_pod(&self, node: &str, on: bool) -> Result<(), Error> {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.world.raw.clone(), "default");
        let name = format!("rehearsal-bare-{node}");
        if on {
            let pod = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "nodeName": self.world.twin.node_name(node),
                    "containers": [{"name": "shell", "image": "docker.io/library/busybox:1.36"}]
                }
            });
            pods.create(&Default::default(), &serde_json::from_value(pod)?)
                .await?;
        } else {
            self.judge.borrow_mut().operator_deleted_pod();
            match pods.delete(&name, &Default::default()).await {
                Ok(_) => {}
                // Gone already (its node's drain or a reboot took it): nothing to delete.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// An operator's `kubectl cordon` / `uncordon`.
    async fn cordon(&self, node: &str, on: bool) -> Result<(), Error> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.world.raw.clone());
        nodes
            .patch(
                &self.world.twin.node_name(node),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"unschedulable": on}})),
            )
            .await?;
        Ok(())
    }

    /// The operator's fix before a resume: every active fault cleared.
    async fn clear_all(&self) -> Result<(), Error> {
        let cleared: Vec<Fault> = self.active.borrow_mut().drain(..).map(|(f, _)| f).collect();
        let kinds: BTreeSet<FaultKind> = cleared.iter().map(|f| f.kind).collect();
        for f in &cleared {
            self.say(format!("operator clears {f}"));
        }
        let acted = |k: FaultKind| {
            matches!(
                k,
                FaultKind::OperatorCordon | FaultKind::OperatorHold | FaultKind::BarePod
            )
        };
        for f in cleared.iter().filter(|f| acted(f.kind)) {
            self.post_kind(f.kind, Some(f), false).await?;
        }
        for k in kinds.into_iter().filter(|k| !acted(*k)) {
            self.post_kind(k, None, false).await?;
        }
        self.tell_judge();
        Ok(())
    }

    /// The injected fault that explains a pause: the latest one that struck whose target
    /// the pause names (its node, or its reason), or whose kind the reason describes.
    fn explain(&self, p: &crate::rollout::record::Pause) -> Option<String> {
        let applied = self.applied.borrow();
        let reason = p.reason.to_lowercase();
        applied
            .iter()
            .rev()
            .find(|f| {
                let named = f.target.as_deref().is_some_and(|t| {
                    let short = t.rsplit('/').next().unwrap_or(t);
                    p.node.as_deref() == Some(t) || p.reason.contains(short)
                });
                let described = match f.kind {
                    FaultKind::ApiErrors => {
                        reason.contains("500")
                            || reason.contains("429")
                            || reason.contains("too many")
                    }
                    FaultKind::LeaseStolen => reason.contains(schedule::THIEF),
                    _ => false,
                };
                named || described
            })
            .map(|f| f.to_string())
    }

    /// The node a pause is about when a `bootsWrongVersion` fault explains it and the node
    /// still runs another version than the target.
    fn fell_back(&self, p: &crate::rollout::record::Pause, target: &Target) -> Option<String> {
        let node = p.node.as_deref()?;
        let host = self
            .world
            .twin
            .talos
            .observe()
            .into_iter()
            .find(|o| o.name == node || self.world.twin.node_name(&o.name) == node)?;
        let explained = self.applied.borrow().iter().any(|f| {
            f.kind == FaultKind::BootsWrongVersion && f.target.as_deref() == Some(&host.name)
        });
        let behind = host.talos_version.trim_start_matches('v')
            != target.talos.to_string().trim_start_matches('v');
        (explained && behind).then_some(host.name)
    }

    /// The remedy an A/B fallback's pause names: `talosctl upgrade` of that node by hand to
    /// the target (legacy Upgrade on Talos ≤ 1.12; install, then reboot, from 1.13), and a
    /// wait until it reports the target. Its calls are the operator's, not ichor's.
    async fn upgrade_by_hand(&self, node: &str, target: &Target) -> Result<(), Error> {
        let twin = &self.world.twin;
        let (ip, legacy, image) = twin
            .talos
            .read(|m| {
                let i = m.find(node)?;
                let n = m.node(i);
                let repo = n.config.installer_image()?;
                let repo = crate::talos::machine_config::repository(&repo);
                let legacy = !n.has_lifecycle_api();
                Some((
                    n.ip.to_string(),
                    legacy,
                    format!("{repo}:{}", target.talos.tag()),
                ))
            })
            .ok_or_else(|| format!("{node}: no installer image to upgrade it by hand"))?;
        self.say(format!("operator: talosctl upgrade {node} --image {image}"));
        let from = twin.clock.now();
        // talosctl waits for the legacy Upgrade's pull inside the call.
        let opts = crate::talos::CallOptions {
            deadline: Duration::from_secs(600),
            ..Default::default()
        };
        let talos = &self.world.talos;
        let done = async {
            if legacy {
                talos.upgrade_legacy(&ip, &image, opts).await.map(|_| ())
            } else {
                talos.upgrade_lifecycle(&ip, &image, opts).await?;
                talos.reboot(&ip, opts).await
            }
        };
        let answered = tokio::select! {
            biased;
            r = done => r,
            _ = twin.drive(Duration::from_secs(2), || self.judge_now()) => unreachable!("the driver never ends"),
        };
        self.judge
            .borrow_mut()
            .operator_calls(node, from, twin.clock.now());
        if let Err(e) = answered {
            self.say(format!("operator: the upgrade by hand failed: {e}"));
            return Ok(());
        }
        // Until it reports the target (a node that never returns is another fault's).
        let back = async {
            loop {
                let at_target = twin.talos.observe().iter().any(|o| {
                    o.name == node
                        && o.ready
                        && o.talos_version.trim_start_matches('v')
                            == target.talos.to_string().trim_start_matches('v')
                });
                if at_target {
                    return;
                }
                twin.clock.sleep(Duration::from_secs(10)).await;
            }
        };
        tokio::select! {
            biased;
            () = back => self.say(format!("operator: {node} is back on {}", target.talos)),
            _ = twin.clock.sleep(Duration::from_secs(1800)) => self.say(format!("operator: {node} not back on the target after 30 minutes")),
            _ = twin.drive(Duration::from_secs(2), || self.judge_now()) => {}
        }
        Ok(())
    }

    /// A refusal is explained by a stolen lock it names.
    fn explain_refusal(&self, why: &str) -> Option<String> {
        if !why.contains(schedule::THIEF) {
            return None;
        }
        self.applied
            .borrow()
            .iter()
            .rev()
            .find(|f| f.kind == FaultKind::LeaseStolen)
            .map(|f| f.to_string())
    }

    /// An engine error is explained by an API burst (the only fault that makes calls fail).
    fn explain_error(&self) -> Option<String> {
        self.applied
            .borrow()
            .iter()
            .rev()
            .find(|f| f.kind == FaultKind::ApiErrors)
            .map(|f| f.to_string())
    }
}
