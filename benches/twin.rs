//! Twin benchmarks: start-up time and memory for 3 control planes + 200 workers + 2,000
//! pods, and how many simulated seconds pass per wall-clock second while every node reboots
//! at once (the twin's worst case: every node down, every pod rescheduled, every replica
//! rebuilt). Run with `cargo bench --bench twin`; figures are printed, never asserted.

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
        let twin = Twin::start(Clock::manual(), &f, &dir.path().join("state"), TwinOptions { config, github: None }).await.expect("twin");
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
