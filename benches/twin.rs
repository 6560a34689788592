//! Twin benchmarks: start-up time and memory for 3 control planes + 200 workers + 2,000
//! pods, and how many simulated seconds pass per wall-clock second while every node reboots
//! at once (the twin's worst case: every node down, every pod rescheduled, every replica
//! rebuilt), and what an idle twin costs: CPU-seconds per idle minute of wall time (a twin
//! with no clients must sleep until its next simulated event).
//!
//! Then scale: at 60 and 500 nodes (3 control planes, the rest workers with three workload
//! pods each and Longhorn volumes of three replicas), the wall time of one
//! `Twin::advance(1s)` tick while nothing changes and while a rolling wave keeps five
//! workers rebooting (a rollout's steady state), the simulated seconds that pass per wall
//! second at that step, and the CPU an idle 500-node twin at 200x uses, alone and with a
//! client reading it. A tick should cost what changed, not the cluster's size.
//!
//! Run with `cargo bench --bench twin` (all sections) or `cargo bench --bench twin -- scale`
//! (one of `startup`, `idle`, `scale`, `scale-idle`); figures are printed, never asserted.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ichor::clock::Clock;
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};

/// Resident memory of this process in KiB (Linux), 0 where unknown.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) this process has used so far, from /proc/self/stat (Linux).
fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let utime: u64 = rest.get(11)?.parse().ok()?;
            let stime: u64 = rest.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn folder(dir: &std::path::Path, workers: usize) -> ClusterFolder {
    let mut inv = String::new();
    for i in 1..=3 {
        let _ = writeln!(
            inv,
            "      - {{name: cp-{i}, role: controlplane, address: 10.1.0.{i}}}"
        );
    }
    for i in 0..workers {
        let _ = writeln!(
            inv,
            "      - {{name: w-{i:03}, role: worker, address: 10.1.{}.{}, volumes: [pvc-{}]}}",
            1 + i / 200,
            1 + i % 200,
            i / 3
        );
    }
    std::fs::write(dir.join("release-set.yaml"), "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {name: bench}\nspec:\n  talos: v1.13.9\n  kubernetes: v1.35.2\n  cni: {name: cilium, version: 1.19.6}\n").expect("write");
    std::fs::write(dir.join("cluster.yaml"), format!("apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: bench}}\nspec:\n  volumes: {{provider: longhorn}}\n  inventory:\n    nodes:\n{inv}")).expect("write");
    ClusterFolder::read(dir).expect("folder")
}

/// Mean, median and worst of per-tick wall times, in milliseconds.
fn tick_stats(ticks: &mut [Duration]) -> String {
    if ticks.is_empty() {
        return "no ticks".into();
    }
    ticks.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let total: Duration = ticks.iter().sum();
    format!(
        "mean {:.3} ms, median {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms(total) / ticks.len() as f64,
        ms(ticks[ticks.len() / 2]),
        ms(ticks[(ticks.len() * 99 / 100).min(ticks.len() - 1)]),
        ms(ticks[ticks.len() - 1])
    )
}

/// One `advance` tick's cost at `workers + 3` nodes on the manual clock: idle, then with a
/// rolling wave of `down` workers rebooting at a time. Runs on a current-thread runtime
/// and never awaits while timing, so only `Twin::advance` is measured.
fn scale(workers: usize, down: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let nodes = workers + 3;
        let dir = tempfile::tempdir().expect("tempdir");
        let f = folder(dir.path(), workers);
        let config = TwinConfig { extra_pods: 3 * workers as u32, ..TwinConfig::default() };
        let t0 = Instant::now();
        let twin = Twin::start(Clock::manual(), &f, &dir.path().join("state"), TwinOptions { config, ..Default::default() }).await.expect("twin");
        let startup = t0.elapsed();
        // Let start-up settle: pods placed, volumes attached.
        twin.advance(Duration::from_secs(120));
        let (pods, volumes) = twin.kube.with(|c, _| (c.list("pods", None).len(), c.list("volumes", None).len()));
        println!("scale {nodes} nodes: {pods} pods, {volumes} volumes, start-up {:.0} ms", startup.as_secs_f64() * 1e3);
        let step = Duration::from_secs(1);

        // Idle: nothing changes but the clock (the kubelets' heartbeats every 10 s).
        let mut ticks = Vec::new();
        let t0 = Instant::now();
        for _ in 0..600 {
            let t = Instant::now();
            twin.advance(step);
            ticks.push(t.elapsed());
        }
        let wall = t0.elapsed();
        println!(
            "summary: scale {nodes} nodes, idle tick (advance 1s): {}; {:.0} simulated seconds per wall second",
            tick_stats(&mut ticks),
            600.0 / wall.as_secs_f64()
        );

        // Rolling wave: `down` workers rebooting at a time; when one is back up and Ready
        // on the Talos side, the next one reboots (checked between ticks, not timed).
        let mut next = 0usize;
        let mut slots: Vec<usize> = Vec::new();
        let mut reboots = 0;
        let mut ticks = Vec::new();
        let t0 = Instant::now();
        let mut timed = Duration::ZERO;
        for _ in 0..900 {
            twin.talos.with_model(|m| {
                slots.retain(|i| !m.node(*i).ready());
                while slots.len() < down {
                    let i = 3 + next % workers;
                    next += 1;
                    if m.reboot(i).is_ok() {
                        slots.push(i);
                        reboots += 1;
                    }
                }
            });
            let t = Instant::now();
            twin.advance(step);
            let e = t.elapsed();
            timed += e;
            ticks.push(e);
        }
        let wall = t0.elapsed();
        println!(
            "summary: scale {nodes} nodes, rolling tick ({down} down, {reboots} reboots in 900 s): {}; {:.0} simulated seconds per wall second ({:.0} counting the wave's own bookkeeping)",
            tick_stats(&mut ticks),
            900.0 / timed.as_secs_f64(),
            900.0 / wall.as_secs_f64()
        );
        twin.shutdown().await;
    });
}

/// CPU of a twin on a scaled clock with no clients, and with one client that touches the
/// Kubernetes side every 50 ms of wall time (as any request does: the model is brought up
/// to date before it answers).
fn scaled_idle(runtime: &tokio::runtime::Runtime, workers: usize, speed: f64) {
    runtime.block_on(async {
        let nodes = workers + 3;
        let dir = tempfile::tempdir().expect("tempdir");
        let f = folder(dir.path(), workers);
        let clock = Clock::try_scaled(speed).expect("speed");
        let config = TwinConfig { extra_pods: 3 * workers as u32, ..TwinConfig::default() };
        let twin = Twin::start(clock, &f, &dir.path().join("state"), TwinOptions { config, ..Default::default() }).await.expect("twin");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (cpu0, wall0) = (cpu_time(), Instant::now());
        tokio::time::sleep(Duration::from_secs(10)).await;
        let ratio = (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64();
        println!(
            "summary: scale {nodes} nodes at {speed}x, idle without clients: {:.2} CPU-seconds per idle minute ({:.1}% of one core)",
            ratio * 60.0,
            ratio * 100.0
        );
        let (cpu0, wall0) = (cpu_time(), Instant::now());
        while wall0.elapsed() < Duration::from_secs(10) {
            twin.kube.sync();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ratio = (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64();
        println!(
            "summary: scale {nodes} nodes at {speed}x, idle with a client reading every 50 ms: {:.2} CPU-seconds per minute ({:.1}% of one core)",
            ratio * 60.0,
            ratio * 100.0
        );
        twin.shutdown().await;
    });
}

fn main() {
    // `cargo bench` passes `--bench`; a plain argument picks one section.
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let run = |section: &str| only.as_deref().is_none_or(|o| o == section);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if run("startup") {
        runtime.block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let f = folder(dir.path(), 200);
            let config = TwinConfig { extra_pods: 2_000, ..TwinConfig::default() };
            let before = rss_kib();
            let t0 = Instant::now();
            let twin = Twin::start(Clock::manual(), &f, &dir.path().join("state"), TwinOptions { config, ..Default::default() }).await.expect("twin");
            let startup = t0.elapsed();
            let pods = twin.kube.with(|c, _| c.list("pods", None).len());
            println!(
                "summary: twin start-up with 203 nodes and {pods} pods: {:.0} ms, resident memory +{:.1} MiB",
                startup.as_secs_f64() * 1e3,
                (rss_kib().saturating_sub(before)) as f64 / 1024.0
            );

            // The reboot wave: every node reboots at once; advance until all are Ready again.
            twin.talos.with_model(|m| {
                for i in 0..203 {
                    let _ = m.reboot(i);
                }
            });
            let simulated = Duration::from_secs(300);
            let t0 = Instant::now();
            twin.advance(simulated);
            let wall = t0.elapsed();
            let ready = twin.kube.with(|c, _| {
                c.list("nodes", None)
                    .iter()
                    .filter(|n| n.pointer("/status/conditions").and_then(|c| c.as_array()).is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")))
                    .count()
            });
            println!(
                "summary: full reboot wave, {}s simulated in {:.2}s wall: {:.0} simulated seconds per wall second ({ready}/203 nodes Ready after)",
                simulated.as_secs(),
                wall.as_secs_f64(),
                simulated.as_secs_f64() / wall.as_secs_f64()
            );
            twin.shutdown().await;
        });
    }

    if run("idle") {
        runtime.block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let f = folder(dir.path(), 200);
            // Idle: the same cluster on a scaled clock (as `ichor sim --speed 60` runs it), no
            // clients. Let start-up work settle, then measure CPU over a wall interval.
            let state = dir.path().join("idle-state");
            let clock = Clock::try_scaled(60.0).expect("speed");
            let config = TwinConfig { extra_pods: 2_000, ..TwinConfig::default() };
            let twin = Twin::start(clock, &f, &state, TwinOptions { config, ..Default::default() }).await.expect("twin");
            tokio::time::sleep(Duration::from_secs(5)).await;
            let (cpu0, wall0, wake0) = (cpu_time(), Instant::now(), twin.wakeups());
            tokio::time::sleep(Duration::from_secs(20)).await;
            let (cpu, wall, wake) = (cpu_time() - cpu0, wall0.elapsed(), twin.wakeups());
            let ratio = cpu.as_secs_f64() / wall.as_secs_f64();
            println!(
                "summary: idle twin (203 nodes, 60x): {:.2} CPU-seconds per idle minute ({:.2}% of one core); wakeups in {:.0}s: projector {}, talos driver {}, kube driver {}",
                ratio * 60.0,
                ratio * 100.0,
                wall.as_secs_f64(),
                wake.projector - wake0.projector,
                wake.talos - wake0.talos,
                wake.kube - wake0.kube,
            );
            twin.shutdown().await;
        });
    }

    if run("scale") {
        scale(57, 5);
        scale(497, 5);
    }
    if run("scale-idle") {
        scaled_idle(&runtime, 497, 200.0);
    }
}
