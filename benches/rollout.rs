//! Rollout benchmarks, against the twin. Run with `cargo bench --bench rollout`; figures
//! are printed (as ratios where a ratio means something), never asserted.
//!
//! 1. Makespan: 3 control planes + 57 workers, 19 Longhorn volumes of 3 replicas on 3
//!    different workers, `maxUnavailable: 5`, no maintenance window; a Talos-only bump
//!    (v1.12.6 → v1.12.9) and a grouped Talos + Kubernetes bump (v1.33.5 → v1.33.7), run by
//!    the engine to completion on the twin's manual clock; and the grouped bump on a
//!    500-node fleet (3 + 497). The makespan is compared with the constraint lower bound
//!    (control planes one at a time, then the fewest worker batches any arrangement could
//!    use, each as long as the median node step, per stage), with the one-disruption-per-node
//!    bound (the same rounds once, each as long as the median node step that reboots it),
//!    and with rolling one node at a time; drains per worker are counted from the engine's
//!    cordons.
//! 2. Engine wall-clock overhead per node step, against the twin alone ticking through the
//!    same simulated span in the same increments.
//! 3. Peak resident memory of the real `ichor rollout` of the grouped bump against
//!    `ichor sim` with 500 nodes.
//! 4. The live ETA (`ichor::plan::eta`): its predicted end read at 25 %, 50 % and 75 % of
//!    the makespan, against the actual end, as a share of the makespan.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ichor::clock::{Clock, Timestamp};
use ichor::gate::{self, live};
use ichor::kube::KubeClient;
use ichor::plan::{Plan, PlanOptions};
use ichor::rollout::record::{self, RolloutRecord};
use ichor::rollout::{Progress, Rollout, RunOutcome, Target};
use ichor::sim::fixture::Fixture;
use ichor::sim::twin::{ClusterFolder, Twin, TwinOptions};
use ichor::talos::TalosClient;

type Error = Box<dyn std::error::Error>;

const CLUSTER: &str = "fleet";
const TALOS_BUMP: &str = "bump/talos";
const GROUPED_BUMP: &str = "bump/grouped";
/// The engine's identity in the lock.
const HOLDER: &str = "ichor-bench";

/// The generated fleet ([`Fixture::fleet`]) at `dir`: 3 control planes and `workers`
/// workers, `workers / 3` Longhorn volumes (rounded up) each with a replica on workers i,
/// i + n, i + 2n, `maxUnavailable: 5`, no maintenance window; branch `bump/talos` moves
/// Talos to v1.12.9, `bump/grouped` Talos to v1.12.9 and Kubernetes to v1.33.7.
fn repo(dir: &Path, workers: usize) -> Result<(), Error> {
    Fixture::fleet(workers, 5).build(dir)?;
    Ok(())
}

fn secs(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}m{:02}s", s / 60, s % 60)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The twin on a manual clock, started from `main`'s folder, and clients to it.
struct Setup {
    twin: Twin,
    kube: KubeClient,
    talos: TalosClient,
    _state: tempfile::TempDir,
}

async fn start_twin(repo: &Path) -> Result<Setup, Error> {
    let state = tempfile::tempdir()?;
    let folder = ClusterFolder::read(&repo.join("clusters").join(CLUSTER))?;
    let twin = Twin::start(
        Clock::manual(),
        &folder,
        state.path(),
        TwinOptions::default(),
    )
    .await?;
    twin.advance(Duration::from_secs(30));
    let kube = KubeClient::connect(Some(twin.kubeconfig())).await?;
    let clock = twin.talos.clock().clone();
    let talos = TalosClient::new(ichor::talos::config::load(twin.talosconfig(), None)?, clock);
    Ok(Setup {
        twin,
        kube,
        talos,
        _state: state,
    })
}

struct Run {
    plan: Plan,
    record: RolloutRecord,
    makespan: Duration,
    wall: Duration,
    /// Every tick of the driver, in simulated time.
    ticks: Vec<Duration>,
    /// Runs that stopped on the engine's own lock and were started again.
    restarts: usize,
    /// (when, the predicted end) after each node done, in simulated time since the start.
    etas: Vec<(Duration, Duration)>,
    /// Every line the engine said.
    lines: Vec<String>,
    /// Requests the twin answered, by kind (`list pods`, `Talos Version`), most first.
    requests: Vec<(String, u64)>,
    /// CPU seconds this process spent during the run (engine, twin and driver).
    cpu: f64,
}

/// The engine as `ichor rollout` sets it up, run to its end while the driver moves the
/// twin's clock.
async fn run_engine(repo: &Path, head: &str) -> Result<Run, Error> {
    let git = ichor::git::Repo::open(repo)?;
    let change = gate::load(&git, "main", head, None)?;
    let s = start_twin(repo).await?;
    let clock = s.twin.talos.clock().clone();
    s.kube.ensure_namespace(live::ICHOR_NAMESPACE).await?;
    let facts = live::observe(&s.kube, Some(&s.talos), &live::Subject::of(&change)).await;
    let nodes = live::live_nodes(&facts).ok_or("no live nodes")?;
    let plan = gate::plan_with(&change, &PlanOptions::default(), Some(&nodes))?;
    let doc = change.cluster_doc.clone().ok_or("no cluster.yaml")?;
    let lines = Mutex::new(Vec::<String>::new());
    let start = clock.now();
    let etas = Mutex::new(Vec::new());
    let wall0 = Instant::now();
    let units = std::sync::atomic::AtomicUsize::new(0);
    let report = |p: Progress| {
        // The engine's own live ETA, as the status and the comment show it.
        if let (Progress::Eta(e), Ok(mut seen)) = (&p, etas.lock()) {
            seen.push((clock.now().since(start), e.end.since(start)));
        }
        // A long rehearsal says how far it is, so slow is told from stuck.
        if matches!(p, Progress::UnitDone { .. }) {
            let n = units.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n % 50 == 0 {
                eprintln!(
                    "  … {n} units done after {:.0} s of wall time, {} simulated",
                    wall0.elapsed().as_secs_f64(),
                    secs(clock.now().since(start))
                );
            }
        }
        if let Ok(mut l) = lines.lock() {
            l.push(p.to_string());
        }
    };
    let mut engine = Rollout::new(&s.kube, &s.talos, clock.clone(), CLUSTER, HOLDER);
    engine.policy = doc.spec.rollout.clone();
    engine.volumes = doc.spec.volumes.provider;
    if let Some(i) = &doc.spec.talos.installer_image {
        engine.installer_image = Some(i.clone());
    }
    engine.report = Some(&report);
    let rs = &change.head_release_set.spec;
    let target = Target {
        commit: change
            .head
            .commit
            .map(|c| c.to_string())
            .unwrap_or_default(),
        talos: rs.talos.clone(),
        kubernetes: rs.kubernetes.clone(),
    };
    let ticks = RefCell::new(Vec::new());
    let mut last = start;
    let mut restarts = 0;
    let t0 = Instant::now();
    let cpu0 = cpu_secs(std::process::id()).unwrap_or(0.0);
    let outcome = loop {
        let outcome = tokio::select! {
            r = engine.run(&plan, &target, Some(&change), false) => r?,
            _ = s.twin.drive(Duration::from_secs(2), || {
                let now = clock.now();
                ticks.borrow_mut().push(now.since(last));
                last = now;
            }) => unreachable!("the driver never ends"),
        };
        // The engine stops when its own lock renewals race each other (it then reads itself
        // as "another holder"); the record stays `running`, so a new run continues at once,
        // as a restarted controller would. Counted and reported, never hidden.
        match &outcome {
            RunOutcome::Paused(p)
                if restarts < 100 && p.reason.contains(&format!("taken by {HOLDER};")) =>
            {
                restarts += 1;
            }
            _ => break outcome,
        }
    };
    let wall = t0.elapsed();
    let cpu = cpu_secs(std::process::id()).map_or(0.0, |c| c - cpu0);
    let makespan = clock.now().since(start);
    drop(engine);
    if !matches!(outcome, RunOutcome::Completed { .. }) {
        let lines = lines.lock().map(|l| l.clone()).unwrap_or_default();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n  ");
        return Err(format!("{head}: the rollout did not complete: {outcome:?}\n  {tail}").into());
    }
    let mut requests: Vec<(String, u64)> = s
        .twin
        .kube
        .audit()
        .counts()
        .into_iter()
        .map(|((verb, resource), n)| (format!("{verb} {resource}"), n))
        .chain(s.twin.talos.calls().into_iter().map(|(method, n)| {
            let short = method.rsplit('/').next().unwrap_or(&method).to_string();
            (format!("Talos {short}"), n)
        }))
        .collect();
    requests.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let record = record::load(&s.kube, CLUSTER)
        .await?
        .ok_or("no rollout record")?
        .record;
    s.twin.shutdown().await;
    let lines = lines.into_inner().unwrap_or_default();
    Ok(Run {
        plan,
        record,
        makespan,
        wall,
        ticks: ticks.into_inner(),
        restarts,
        etas: etas.into_inner().unwrap_or_default(),
        lines,
        requests,
        cpu,
    })
}

/// Figure 4 for one bump: |predicted end − actual end| ÷ makespan, as the ETA stood at 25 %,
/// 50 % and 75 % of the rollout.
fn report_eta(name: &str, run: &Run) {
    let total = run.makespan.as_secs_f64().max(1.0);
    if std::env::var("ICHOR_BENCH_ETAS").is_ok() {
        for st in &run.plan.stages {
            let secs: u64 = st.steps.iter().map(|s| s.duration_secs).sum();
            println!(
                "  PLAN {:?} {} steps {}s first start {}",
                st.id,
                st.steps.len(),
                secs,
                st.steps.first().map(|s| s.start_secs).unwrap_or(0)
            );
        }
        for (when, end) in &run.etas {
            println!("  ETA at {} predicts {}", when.as_secs(), end.as_secs());
        }
    }
    let mut parts = Vec::new();
    for share in [0.25, 0.5, 0.75] {
        let at = Duration::from_secs_f64(total * share);
        let predicted = run
            .etas
            .iter()
            .take_while(|(when, _)| *when <= at)
            .last()
            .map(|(_, end)| *end)
            .unwrap_or(Duration::from_secs(run.plan.estimate_secs));
        let error = (predicted.as_secs_f64() - total).abs() / total;
        parts.push(format!("{:.0} %: {:.1} %", share * 100.0, error * 100.0));
    }
    println!(
        "summary: {name}: ETA error (|predicted end − actual end| ÷ makespan) at {}",
        parts.join(", ")
    );
}

/// Durations in simulated seconds of the record's steps, per stage (`talos`,
/// `kube-apiserver`, …, `kubelet` from `<stage>/<node>`; `manifests`), and how many of them
/// run one at a time (on a control plane, or not on a node).
fn step_secs(rec: &RolloutRecord) -> Vec<(String, Vec<u64>, usize)> {
    let mut out: Vec<(String, Vec<u64>, usize)> = Vec::new();
    for (key, s) in &rec.steps {
        let (stage, node) = key.split_once('/').unwrap_or((key, ""));
        let parse = |t: &Option<String>| t.as_deref().and_then(Timestamp::parse_rfc3339);
        let (Some(a), Some(b)) = (parse(&s.started_at), parse(&s.finished_at)) else {
            continue;
        };
        let i = match out.iter().position(|(k, _, _)| k == stage) {
            Some(i) => i,
            None => {
                out.push((stage.to_string(), Vec::new(), 0));
                out.len() - 1
            }
        };
        out[i].1.push(b.since(a).as_secs());
        out[i].2 += usize::from(node.is_empty() || node.starts_with("cp-"));
    }
    out
}

/// How full the worker slots were: the workers' step time over `max` slots for the span
/// from the first worker's start to the last one's finish (1.00: never an idle slot), and
/// the mean step beside the median the bounds use. Said for the pooled stage only; the mean
/// step in seconds.
fn occupancy(rec: &RolloutRecord, max: u32) -> Option<u64> {
    let parse = |t: &Option<String>| t.as_deref().and_then(Timestamp::parse_rfc3339);
    let spans: Vec<(Timestamp, Timestamp)> = rec
        .steps
        .iter()
        .filter(|(k, _)| k.starts_with("worker/") || k.starts_with("talos/w-"))
        .filter_map(|(_, s)| Some((parse(&s.started_at)?, parse(&s.finished_at)?)))
        .collect();
    let (Some(first), Some(last)) = (
        spans.iter().map(|(a, _)| *a).min(),
        spans.iter().map(|(_, b)| *b).max(),
    ) else {
        return None;
    };
    let busy: u64 = spans.iter().map(|(a, b)| b.since(*a).as_secs()).sum();
    let span = last.since(first).as_secs().max(1);
    let mean = busy / spans.len().max(1) as u64;
    println!(
        "  worker slots: {} of step time over {max} slots × {} = {:.2} full; mean worker step {}",
        secs(Duration::from_secs(busy)),
        secs(Duration::from_secs(span)),
        busy as f64 / (max as f64 * span as f64),
        secs(Duration::from_secs(mean)),
    );
    Some(mean)
}

/// Figure 1 for one bump.
fn report_makespan(name: &str, run: &Run) {
    let b = &run.plan.worker_batches;
    println!(
        "{name}: {} control planes + {} workers, maxUnavailable {}; the plan made {} worker batches, lower bound {} (ratio {:.2})",
        run.plan.control_planes,
        run.plan.workers,
        b.max_unavailable,
        b.count,
        b.lower_bound,
        b.count as f64 / b.lower_bound.max(1) as f64
    );
    let mut bound = 0u64;
    let mut serial = 0u64;
    for (stage, durations, cps) in step_secs(&run.record) {
        let per_node = median(durations.clone());
        let workers = durations.len() - cps;
        // Control planes one at a time; workers in the fewest batches any plan could make.
        let rounds = cps + if workers > 0 { b.lower_bound } else { 0 };
        bound += rounds as u64 * per_node;
        serial += durations.len() as u64 * per_node;
        println!(
            "  {stage}: {} node steps, per-node median {} (min {}, max {}); lower bound {rounds} × median",
            durations.len(),
            secs(Duration::from_secs(per_node)),
            secs(Duration::from_secs(durations.iter().copied().min().unwrap_or(0))),
            secs(Duration::from_secs(durations.iter().copied().max().unwrap_or(0))),
        );
    }
    let makespan = run.makespan.as_secs();
    // The physical limit: one disruption per node — control planes one at a time, then the
    // fewest worker rounds any arrangement could use, each as long as the median node step
    // that reboots it (Talos, or the one-drain worker step).
    let steps = step_secs(&run.record);
    let reboot = |stage: &str| {
        steps
            .iter()
            .find(|(s, _, _)| s == stage)
            .map(|(_, d, _)| median(d.clone()))
    };
    let node_step = reboot("worker").or_else(|| reboot("talos")).unwrap_or(0);
    let one_disruption = (run.plan.control_planes as u64 + b.lower_bound as u64)
        * reboot("talos").unwrap_or(node_step).max(node_step);
    // Drains per worker: the cordons the engine said, over the workers.
    let cordons = run
        .lines
        .iter()
        .filter(|l| l.contains(" w-") && l.ends_with(": cordoned"))
        .count();
    println!(
        "summary: {name}: makespan / one-disruption-per-node bound = {:.2} ({} / {}); drains per worker = {:.2}",
        makespan as f64 / one_disruption.max(1) as f64,
        secs(run.makespan),
        secs(Duration::from_secs(one_disruption)),
        cordons as f64 / run.plan.workers.max(1) as f64
    );
    // The same bound counted with the mean worker step: what no arrangement of these very
    // steps could beat; the gap to the median's bound is how unequal the steps were.
    if let Some(mean) = occupancy(&run.record, b.max_unavailable) {
        let with_mean = (run.plan.control_planes as u64 + b.lower_bound as u64)
            * reboot("talos").unwrap_or(mean).max(mean);
        println!(
            "  makespan / one-disruption-per-node bound with the mean step = {:.2} ({} / {})",
            makespan as f64 / with_mean.max(1) as f64,
            secs(run.makespan),
            secs(Duration::from_secs(with_mean)),
        );
    }
    if run.restarts > 0 {
        println!(
            "  note: the engine stopped {} times on its own lock (\"the rollout lock was taken by {HOLDER}\": concurrent renewals of the Lease conflict) and was started again at once; the makespan includes those restarts",
            run.restarts
        );
    }
    println!(
        "  simulated makespan {}; constraint lower bound {}; one node at a time {}",
        secs(run.makespan),
        secs(Duration::from_secs(bound)),
        secs(Duration::from_secs(serial))
    );
    println!(
        "summary: {name}: makespan / lower bound = {:.2}; one-at-a-time / makespan = {:.2}",
        makespan as f64 / bound.max(1) as f64,
        serial as f64 / makespan.max(1) as f64
    );
}

/// Figure 2: the engine's wall time per node step, and the twin alone through the same
/// ticks (the driver's loop: yield, 1 ms sleep, advance).
async fn report_overhead(name: &str, repo: &Path, run: &Run) -> Result<(), Error> {
    let s = start_twin(repo).await?;
    let t0 = Instant::now();
    for &tick in &run.ticks {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        s.twin.advance(tick);
    }
    let alone = t0.elapsed();
    s.twin.shutdown().await;
    let steps = run.record.steps.len().max(1);
    let simulated: Duration = run.ticks.iter().sum();
    println!(
        "  engine + twin: {:.2} s wall for {} simulated in {} ticks ({} steps in the record): {:.1} ms per step, twin's own work and the driver's 1 ms sleeps included",
        run.wall.as_secs_f64(),
        secs(simulated),
        run.ticks.len(),
        steps,
        run.wall.as_secs_f64() * 1e3 / steps as f64
    );
    println!(
        "  twin alone, same {} ticks (same loop, no client): {:.2} s wall; the difference is {:.1} ms per step",
        run.ticks.len(),
        alone.as_secs_f64(),
        (run.wall.as_secs_f64() - alone.as_secs_f64()) * 1e3 / steps as f64
    );
    println!(
        "summary: {name}: engine+twin / twin-alone wall time = {:.2}; {:.1} ms wall per node step",
        run.wall.as_secs_f64() / alone.as_secs_f64().max(1e-9),
        run.wall.as_secs_f64() * 1e3 / steps as f64
    );
    println!(
        "  CPU during the run: {:.2} s over {:.2} s wall ({:.2} of the 2 cores busy on average)",
        run.cpu,
        run.wall.as_secs_f64(),
        run.cpu / run.wall.as_secs_f64().max(1e-9)
    );
    let total: u64 = run.requests.iter().map(|(_, n)| n).sum();
    let top: Vec<String> = run
        .requests
        .iter()
        .take(16)
        .map(|(what, n)| format!("{what} {:.1}", *n as f64 / steps as f64))
        .collect();
    println!(
        "  requests per node step: {:.1} ({}; the setup's own included)",
        total as f64 / steps as f64,
        top.join(", ")
    );
    Ok(())
}

/// The `ichor` binary cargo built for this bench.
fn ichor_bin() -> PathBuf {
    option_env!("CARGO_BIN_EXE_ichor")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("ichor"))
        })
        .unwrap_or_else(|| PathBuf::from("ichor"))
}

/// (VmHWM, VmRSS) of a process in KiB, None once it is gone.
fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// CPU time (user + system) a process has used, from /proc/<pid>/stat.
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n    ")
}

fn stop(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The simulated speed of figure 3 (`ICHOR_BENCH_SPEED`, default 200): a 500-node twin
/// may not keep up with 200x on a small machine, and the rollout's 30 s call deadlines are
/// then 0.15 s of wall time.
fn memory_speed() -> String {
    std::env::var("ICHOR_BENCH_SPEED")
        .ok()
        .filter(|s| s.parse::<f64>().is_ok_and(|v| (1.0..=1000.0).contains(&v)))
        .unwrap_or_else(|| "200".into())
}

/// How long figure 3 samples (`ICHOR_BENCH_SECS`, default 90).
fn memory_secs() -> u64 {
    std::env::var("ICHOR_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| (10..=3600).contains(s))
        .unwrap_or(90)
}

/// Figure 3: `ichor sim` with 500 nodes and `ichor rollout` against it.
async fn report_memory() -> Result<(), Error> {
    const NODES: usize = 500;
    let speed = memory_speed();
    let bin = ichor_bin();
    let tmp = tempfile::tempdir()?;
    let repo_dir = tmp.path().join("repo");
    repo(&repo_dir, NODES - 3)?;
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home)?;
    let state = tmp.path().join("sim-state");
    let out = |name: &str| -> Result<Stdio, Error> {
        Ok(std::fs::File::create(tmp.path().join(name))?.into())
    };
    let cmd = |args: &[&std::ffi::OsStr]| {
        let mut c = Command::new(&bin);
        c.args(args)
            .env("HOME", &home)
            .env("XDG_STATE_HOME", home.join("state"))
            .stdin(Stdio::null());
        c
    };
    let cluster = repo_dir.join("clusters").join(CLUSTER);
    let t0 = Instant::now();
    let mut sim = cmd(&[
        "sim".as_ref(),
        "--cluster".as_ref(),
        cluster.as_os_str(),
        "--speed".as_ref(),
        speed.as_ref(),
        "--state-dir".as_ref(),
        state.as_os_str(),
    ])
    .stdout(out("sim.out")?)
    .stderr(out("sim.err")?)
    .spawn()?;
    let (kubeconfig, talosconfig) = (state.join("kubeconfig"), state.join("talosconfig"));
    let kube = loop {
        if let Ok(Some(status)) = sim.try_wait() {
            return Err(format!(
                "ichor sim exited ({status}):\n    {}",
                tail(&tmp.path().join("sim.err"), 20)
            )
            .into());
        }
        if t0.elapsed() > Duration::from_secs(180) {
            stop(&mut sim);
            return Err("ichor sim did not answer within 180 s".into());
        }
        if kubeconfig.exists() && talosconfig.exists() {
            if let Ok(k) = KubeClient::connect(Some(&kubeconfig)).await {
                if k.nodes().await.is_ok_and(|n| n.len() == NODES) {
                    break k;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "  ichor sim with {NODES} nodes at {speed}x answered after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let mut rollout = cmd(&[
        "rollout".as_ref(),
        "--repo".as_ref(),
        repo_dir.as_os_str(),
        "--rev".as_ref(),
        GROUPED_BUMP.as_ref(),
        "--base".as_ref(),
        "main".as_ref(),
        "--kubeconfig".as_ref(),
        kubeconfig.as_os_str(),
        "--talosconfig".as_ref(),
        talosconfig.as_os_str(),
        "--yes".as_ref(),
        "--time-scale".as_ref(),
        speed.as_ref(),
    ])
    .stdout(out("rollout.out")?)
    .stderr(out("rollout.err")?)
    .spawn()?;
    let (mut peak, mut last_rss, mut sim_peak) = (0u64, 0u64, 0u64);
    let (mut cpu, mut sim_cpu) = (0.0f64, 0.0f64);
    let sim_cpu0 = cpu_secs(sim.id()).unwrap_or(0.0);
    let t0 = Instant::now();
    let mut exited = None;
    while t0.elapsed() < Duration::from_secs(memory_secs()) {
        if let Some((hwm, rss)) = memory_kib(rollout.id()) {
            peak = peak.max(hwm);
            last_rss = rss;
        }
        cpu = cpu_secs(rollout.id()).unwrap_or(cpu);
        sim_cpu = cpu_secs(sim.id()).map_or(sim_cpu, |c| c - sim_cpu0);
        if let Some((hwm, _)) = memory_kib(sim.id()) {
            sim_peak = sim_peak.max(hwm);
        }
        if let Ok(Some(status)) = rollout.try_wait() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ran = t0.elapsed();
    let reached = match record::load(&kube, CLUSTER).await {
        Ok(Some(s)) => {
            let steps = &s.record.steps;
            let finished = steps.values().filter(|s| s.finished_at.is_some()).count();
            format!(
                "the record shows {} node steps started, {finished} finished",
                steps.len()
            )
        }
        Ok(None) => "no rollout record yet (still in the live gate or the plan)".into(),
        Err(e) => format!("the record could not be read: {e}"),
    };
    let exited = exited.or_else(|| stop(&mut rollout));
    stop(&mut sim);
    match exited {
        Some(status) if !status.success() => {
            println!(
                "summary: ichor rollout on {NODES} nodes exited {status} after {:.1} s (peak RSS before that {:.1} MiB):\n    stdout: {}\n    stderr: {}",
                ran.as_secs_f64(),
                peak as f64 / 1024.0,
                tail(&tmp.path().join("rollout.out"), 15),
                tail(&tmp.path().join("rollout.err"), 15)
            );
            return Ok(());
        }
        Some(_) => println!("  ichor rollout finished after {:.1} s", ran.as_secs_f64()),
        None => println!(
            "  ichor rollout still running after {:.1} s; stopped; {reached}",
            ran.as_secs_f64()
        ),
    }
    println!(
        "  CPU over those {:.0} s: ichor rollout {:.1} s, ichor sim {:.1} s (2 cores shared); the rollout's last lines:\n    {}",
        ran.as_secs_f64(),
        cpu,
        sim_cpu,
        tail(&tmp.path().join("rollout.err"), 3)
    );
    println!(
        "  last VmRSS {:.1} MiB; ichor sim's own peak {:.1} MiB",
        last_rss as f64 / 1024.0,
        sim_peak as f64 / 1024.0
    );
    // A peak taken before the engine started is the gate's, not the rollout's: say so.
    let phase = if reached.starts_with("no rollout record") {
        " (the engine never started: still in the live gate)"
    } else {
        ""
    };
    println!(
        "summary: ichor rollout on {NODES} nodes: peak RSS {:.1} MiB, {:.0} KiB per node{phase}",
        peak as f64 / 1024.0,
        peak as f64 / NODES as f64
    );
    Ok(())
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        repo(dir.path(), 57).expect("repository");
        let fleet = tempfile::tempdir().expect("tempdir");
        repo(fleet.path(), 497).expect("repository");
        // `ICHOR_BENCH_ONLY=memory` runs figure 3 alone, `=60` the 60-node fleet alone, `=500`
        // the 500-node grouped rehearsal alone.
        let only = std::env::var("ICHOR_BENCH_ONLY").unwrap_or_default();
        let runs: Vec<(&str, &Path, &str)> = [
            ("talos-only", dir.path(), TALOS_BUMP),
            ("grouped", dir.path(), GROUPED_BUMP),
            ("grouped 500", fleet.path(), GROUPED_BUMP),
        ]
        .into_iter()
        .filter(|(name, _, _)| match only.as_str() {
            "" => true,
            "60" => !name.ends_with("500"),
            "500" => name.ends_with("500"),
            _ => false,
        })
        .collect();
        for (name, dir, head) in runs {
            match run_engine(dir, head).await {
                Ok(run) => {
                    report_makespan(name, &run);
                    report_eta(name, &run);
                    if let Err(e) = report_overhead(name, dir, &run).await {
                        println!("summary: {name}: the twin alone failed: {e}");
                    }
                }
                Err(e) => println!("summary: {name}: {e}"),
            }
        }
        if only.is_empty() || only == "memory" {
            if let Err(e) = report_memory().await {
                println!("summary: ichor rollout memory: {e}");
            }
        }
    });
}
