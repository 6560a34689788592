//! Benchmarks of the pure core and Git reading (speed is measured here, never asserted in
//! tests). Run with `cargo bench --bench core`.
//!
//! - `check/10-commits` vs `check/10000-commits`: gating touches only the two revisions, so
//!   the ratio of the two should stay near 1 however long the history.
//! - `gate+plan/5000-nodes`: the checklist with an inventory and the plan for 5,000 nodes
//!   holding 50,000 volume replicas; the batch count is printed next to its lower bound.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use git2::{Repository, Signature, Time};
use ichor::gate;
use ichor::git::{write_tree, Repo};
use ichor::plan::{plan, PlanOptions};
use ichor::policy::{self, Policies};
use ichor::releaseset::{Bump, Cluster, ReleaseSet};

const RELEASE_SET: &str = "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {name: bench}\nspec:\n  talos: v1.12.6\n  kubernetes: v1.33.PATCH\n  cni: {name: cilium, version: 1.18.3}\n  addons:\n    - {name: cert-manager, version: v1.20.2}\n    - {name: longhorn, version: v1.10.3}\n";

/// A repository whose `main` has `n` commits, each touching the release set or another file.
fn history(dir: &Path, n: usize) -> Repository {
    let repo = Repository::init_bare(dir).expect("init");
    let mut files = BTreeMap::new();
    files.insert("README.md".to_string(), String::new());
    let mut parent: Option<git2::Oid> = None;
    for i in 0..n {
        files.insert(
            "clusters/bench/release-set.yaml".into(),
            RELEASE_SET.replace("PATCH", &(i % 7).to_string()),
        );
        files.insert("README.md".into(), format!("commit {i}\n"));
        let tree = repo
            .find_tree(write_tree(&repo, &files).expect("tree"))
            .expect("tree");
        let sig = Signature::new(
            "bench",
            "bench@example.com",
            &Time::new(1_700_000_000 + i as i64, 0),
        )
        .expect("sig");
        let parents: Vec<git2::Commit> = parent
            .map(|p| repo.find_commit(p).expect("parent"))
            .into_iter()
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        parent = Some(
            repo.commit(
                Some("refs/heads/main"),
                &sig,
                &sig,
                &format!("commit {i}"),
                &tree,
                &refs,
            )
            .expect("commit"),
        );
    }
    repo
}

fn check(repo: &Repo, base: &str, head: &str) -> policy::Outcome {
    let change = gate::load(repo, base, head, None).expect("load");
    gate::verdict(&change).outcome
}

fn mean(f: impl Fn(), iters: u32) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed() / iters
}

fn bench_check(c: &mut Criterion) {
    let small_dir = tempfile::tempdir().expect("tempdir");
    let big_dir = tempfile::tempdir().expect("tempdir");
    history(small_dir.path(), 10);
    history(big_dir.path(), 10_000);
    let small = Repo::open(small_dir.path()).expect("open");
    let big = Repo::open(big_dir.path()).expect("open");
    let (base, head) = ("main~1", "main");
    // The first commit by SHA: `main~9999` would make the revision syntax itself walk history.
    let first = {
        let repo = big.git2();
        let mut walk = repo.revwalk().expect("revwalk");
        walk.push_ref("refs/heads/main").expect("main");
        walk.last().expect("a commit").expect("oid").to_string()
    };
    let first = first.as_str();
    let mut g = c.benchmark_group("check");
    g.sample_size(30);
    g.bench_function("10-commits", |b| b.iter(|| check(&small, base, head)));
    g.bench_function("10000-commits", |b| b.iter(|| check(&big, base, head)));
    // The far ends of the history: still only two trees are read.
    g.bench_function("10000-commits-first-vs-last", |b| {
        b.iter(|| check(&big, first, head))
    });
    g.finish();
    let t_small = mean(|| _ = check(&small, base, head), 200);
    let t_big = mean(|| _ = check(&big, base, head), 200);
    let t_far = mean(|| _ = check(&big, first, head), 200);
    println!(
        "summary: check on 10,000 commits / on 10 commits = {:.2}x; first-vs-last / adjacent = {:.2}x",
        t_big.as_secs_f64() / t_small.as_secs_f64(),
        t_far.as_secs_f64() / t_big.as_secs_f64()
    );
}

/// 3 control planes and 4,997 workers; 16,667 volumes with three replicas each, on
/// pseudo-randomly chosen distinct workers (a fixed linear congruential sequence).
fn big_cluster() -> (Bump, Cluster) {
    let rs = |t: &str, k: &str| {
        ReleaseSet::parse("rs", &format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: big}}\nspec:\n  talos: {t}\n  kubernetes: {k}\n  cni: {{name: cilium, version: 1.19.6}}\n  addons:\n    - {{name: cert-manager, version: v1.20.2}}\n")).expect("rs")
    };
    let bump = Bump::between(&rs("v1.12.6", "v1.33.5"), &rs("v1.13.9", "v1.34.2"));
    let workers = 4_997usize;
    let mut volumes: Vec<Vec<String>> = vec![Vec::new(); workers];
    let mut x: u64 = 42;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as usize
    };
    for v in 0..16_667 {
        let mut holders: Vec<usize> = Vec::new();
        while holders.len() < 3 {
            let w = next() % workers;
            if !holders.contains(&w) {
                holders.push(w);
            }
        }
        for w in holders {
            volumes[w].push(format!("pvc-{v}"));
        }
    }
    let mut text = String::from("apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {name: big}\nspec:\n  rollout: {maxUnavailable: 50}\n  volumes: {provider: longhorn}\n  inventory:\n    nodes:\n");
    for i in 1..=3 {
        text.push_str(&format!("      - {{name: cp-{i}, role: controlplane}}\n"));
    }
    for (i, vols) in volumes.iter().enumerate() {
        text.push_str(&format!(
            "      - {{name: w-{i:04}, role: worker, volumes: [{}]}}\n",
            vols.join(", ")
        ));
    }
    (
        bump,
        Cluster::parse("cluster.yaml", &text).expect("cluster"),
    )
}

fn bench_gate_plan(c: &mut Criterion) {
    let (bump, cluster) = big_cluster();
    let policies = Policies::shipped().expect("policies");
    let nodes = cluster
        .spec
        .inventory
        .as_ref()
        .expect("inventory")
        .resolve(&bump.base);
    let replicas: usize = nodes.iter().map(|n| n.volumes.len()).sum();
    let run = || {
        let items = policy::evaluate(&bump, &policies, Some(&nodes));
        let p = plan("big", &bump, &cluster.spec, &nodes, &PlanOptions::default()).expect("plan");
        (items.len(), p)
    };
    let (_, p) = run();
    println!(
        "summary: {} nodes, {replicas} volume replicas, maxUnavailable 50: {} worker batches, lower bound {} ({:.3}x the bound)",
        nodes.len(),
        p.worker_batches.count,
        p.worker_batches.lower_bound,
        p.worker_batches.count as f64 / p.worker_batches.lower_bound as f64
    );
    let mut g = c.benchmark_group("gate+plan");
    g.sample_size(10);
    g.bench_function("5000-nodes-50000-replicas", |b| b.iter(run));
    g.finish();
}

criterion_group!(benches, bench_check, bench_gate_plan);
criterion_main!(benches);
