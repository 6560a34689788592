//! `ichor rehearse` benchmarks: seeds per minute and peak memory per job, for the homelab
//! fixture's grouped bump (`renovate/talos`) and for an 11-node Longhorn fleet (3 control
//! planes, 8 workers, `bump/grouped`), each seed under its own random faults.
//!
//! Run with `cargo bench --bench rehearse`; `ICHOR_BENCH_SEEDS` (default 1000) sets how many
//! seeds each fixture runs, `ICHOR_BENCH_JOBS` (default 2) how many at once, and
//! `ICHOR_BENCH_ONLY=homelab|fleet` runs one fixture. Figures are printed, never asserted;
//! a seed that does not hold is named with its replay command.

use std::path::Path;
use std::time::Instant;

use ichor::rehearse::{self, FaultKind, Options, Summary};
use ichor::sim::fixture::Fixture;

type Error = Box<dyn std::error::Error>;

/// The peak resident memory of this process so far, in KiB (Linux `VmHWM`), 0 where unknown.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn bench(name: &str, repo: &Path, head: &str, seeds: u64, jobs: usize) -> Result<(), Error> {
    let opts = Options {
        repo: repo.to_path_buf(),
        base: "main".into(),
        head: head.into(),
        cluster: None,
        alphabet: FaultKind::ALL.to_vec(),
        keep_log: false,
        planted: None,
    };
    let list: Vec<u64> = (1..=seeds).collect();
    let before = peak_rss_kib();
    let started = Instant::now();
    let reports = rehearse::rehearse_seeds(&opts, &list, jobs, &|_| {})?;
    let wall = started.elapsed();
    let s = Summary::of(&reports);
    let per_minute = seeds as f64 / wall.as_secs_f64() * 60.0;
    println!(
        "{name}: {seeds} seeds with --jobs {jobs} in {:.0} s: {per_minute:.0} seeds per minute",
        wall.as_secs_f64()
    );
    println!(
        "{name}: peak RSS {} MiB for the process ({} MiB per job; {} MiB before)",
        peak_rss_kib() / 1024,
        peak_rss_kib() / 1024 / jobs as u64,
        before / 1024
    );
    println!(
        "{name}: completed {} of {}, violations {}, stuck {}, unexplained pauses {}, pauses {:?}",
        s.completed, s.seeds, s.violations, s.stuck, s.unexplained_pauses, s.pauses_by_cause
    );
    let m = |v: Option<u64>| v.map_or("-".to_string(), |s| format!("{}m{:02}s", s / 60, s % 60));
    println!(
        "{name}: makespan under faults p50 {} p90 {} max {}",
        m(s.makespan_p50),
        m(s.makespan_p90),
        m(s.makespan_max)
    );
    for r in reports.iter().filter(|r| !r.holds()) {
        let unexplained = r
            .pauses
            .iter()
            .find(|p| p.fault.is_none())
            .map(|p| &p.cause);
        println!(
            "{name}: seed {} {:?}: violation {:?}, stuck {:?}, unexplained pause {:?} — replay with `ichor rehearse --repo <the fixture> --base main --head {head} --seed {}`",
            r.seed,
            r.outcome,
            r.violations.first(),
            r.stuck,
            unexplained,
            r.seed
        );
    }
    Ok(())
}

fn main() -> Result<(), Error> {
    let seeds = env_number("ICHOR_BENCH_SEEDS", 1000);
    let jobs = env_number("ICHOR_BENCH_JOBS", 2).max(1) as usize;
    let only = std::env::var("ICHOR_BENCH_ONLY").ok();
    let dir = tempfile::tempdir()?;
    if only.as_deref().is_none_or(|o| o == "homelab") {
        let repo = dir.path().join("homelab");
        Fixture::homelab().build(&repo)?;
        bench("homelab grouped", &repo, "renovate/talos", seeds, jobs)?;
    }
    if only.as_deref().is_none_or(|o| o == "fleet") {
        let repo = dir.path().join("fleet");
        Fixture::fleet(8, 2).build(&repo)?;
        bench("fleet 3+8 grouped", &repo, "bump/grouped", seeds, jobs)?;
    }
    Ok(())
}
