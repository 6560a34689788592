//! Twin benchmarks: start-up time and memory for 3 control planes + 200 workers + 2,000
//! pods, and how many simulated seconds pass per wall-clock second while every node reboots
//! at once (the twin's worst case: every node down, every pod rescheduled, every replica
//! rebuilt), and what an idle twin costs: CPU-seconds per idle minute of wall time (a twin
//! with no clients must sleep until its next simulated event). Run with
//! `cargo bench --bench twin`; figures are printed, never asserted.

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

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
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
