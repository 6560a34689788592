//! `ichor rehearse`: run one bump many times on a twin of the cluster, each seed under its
//! own random faults, and say whether any safety rule broke (`ichor::rehearse` does the
//! work; this file reads the flags and prints).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ichor::rehearse::{self, FaultKind, Options, SeedOutcome, SeedReport, Summary};
use ichor::releaseset::HumanDuration;

use super::EXIT_INVALID;

pub struct Args {
    pub repo: PathBuf,
    pub base: String,
    pub head: String,
    pub cluster: Option<String>,
    pub seeds: Option<String>,
    pub seed: Option<u64>,
    pub jobs: Option<usize>,
    pub faults: Option<String>,
    pub json: bool,
}

/// Seeds one run may ask for: a bound on what one command line can cost.
pub const MAX_SEEDS: u64 = 1_000_000;
/// The seeds rehearsed when none are named.
const DEFAULT_SEEDS: (u64, u64) = (1, 20);

/// `A..B`, both ends included.
fn parse_seeds(text: &str) -> Result<(u64, u64), String> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| format!("--seeds {text:?}: expected A..B, e.g. 1..100"))?;
    let num = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("--seeds {text:?}: {s:?} is not a whole number"))
    };
    let (a, b) = (num(a)?, num(b)?);
    if b < a {
        return Err(format!("--seeds {text:?}: the end comes before the start"));
    }
    if b - a >= MAX_SEEDS {
        return Err(format!(
            "--seeds {text:?}: at most {MAX_SEEDS} seeds at once"
        ));
    }
    Ok((a, b))
}

fn invalid(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(EXIT_INVALID)
}

pub fn rehearse(a: Args) -> anyhow::Result<ExitCode> {
    let alphabet = match a.faults.as_deref().map(FaultKind::parse_list) {
        None => FaultKind::ALL.to_vec(),
        Some(Ok(list)) => list,
        Some(Err(e)) => return Ok(invalid(e)),
    };
    let seeds: Vec<u64> = match (a.seed, a.seeds.as_deref()) {
        (Some(_), Some(_)) => return Ok(invalid("give --seed or --seeds, not both")),
        (Some(n), None) => vec![n],
        (None, Some(text)) => match parse_seeds(text) {
            Ok((x, y)) => (x..=y).collect(),
            Err(e) => return Ok(invalid(e)),
        },
        (None, None) => (DEFAULT_SEEDS.0..=DEFAULT_SEEDS.1).collect(),
    };
    let jobs = match a.jobs {
        Some(0) => return Ok(invalid("--jobs must be at least 1")),
        Some(n) => n.min(256),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let replay = a.seed.is_some();
    let opts = Options {
        repo: a.repo,
        base: a.base,
        head: a.head,
        cluster: a.cluster,
        alphabet,
        keep_log: replay,
        planted: None,
    };
    if let Err(e) = rehearse::check(&opts) {
        return Ok(invalid(e));
    }
    let bar = (!a.json && std::io::stderr().is_terminal() && seeds.len() > 1).then(|| {
        let bar = indicatif::ProgressBar::new(seeds.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds  {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let broken = std::sync::atomic::AtomicUsize::new(0);
    let done = |r: &SeedReport| {
        if !r.holds() {
            broken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(bar) = &bar {
            bar.inc(1);
            let n = broken.load(std::sync::atomic::Ordering::Relaxed);
            if n > 0 {
                bar.set_message(format!("{n} not holding"));
            }
        }
    };
    let reports = match rehearse::rehearse_seeds(&opts, &seeds, jobs, &done) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let summary = Summary::of(&reports);
    if a.json {
        let doc = serde_json::json!({"seeds": reports, "summary": summary});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        if replay {
            for r in &reports {
                for line in &r.log {
                    println!("{line}");
                }
                println!();
            }
        }
        print!("{}", render(&opts, &reports, &summary));
    }
    Ok(if summary.holds() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn span(secs: Option<u64>) -> String {
    secs.map(|s| HumanDuration(Duration::from_secs(s)).to_string())
        .unwrap_or_else(|| "-".into())
}

/// The summary for a terminal.
fn render(opts: &Options, reports: &[SeedReport], s: &Summary) -> String {
    let mut out = String::new();
    let plural = |n: usize, one: &str, many: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {many}")
        }
    };
    out.push_str(&format!(
        "rehearsed {} → {} {} with random faults ({})\n",
        ichor::escape::terminal(&opts.base),
        ichor::escape::terminal(&opts.head),
        plural(s.seeds, "time", "times"),
        opts.alphabet
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let rules_broken: usize = reports.iter().map(|r| r.violations.len()).sum();
    out.push_str(&format!(
        "  completed      {} of {}\n",
        s.completed, s.seeds
    ));
    out.push_str(&format!(
        "  rules broken   {rules_broken}{}\n",
        if rules_broken > 0 {
            format!(" (in {})", plural(s.violations, "seed", "seeds"))
        } else {
            String::new()
        }
    ));
    out.push_str(&format!("  stuck          {}\n", s.stuck));
    let pauses: usize = s.pauses_by_cause.values().sum();
    let causes: Vec<String> = s
        .pauses_by_cause
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    out.push_str(&format!(
        "  pauses         {pauses}{}\n",
        if causes.is_empty() {
            String::new()
        } else {
            format!(" ({})", causes.join(", "))
        }
    ));
    out.push_str(&format!(
        "  makespan       p50 {}  p90 {}  max {} (simulated, under faults)\n",
        span(s.makespan_p50),
        span(s.makespan_p90),
        span(s.makespan_max)
    ));
    for r in reports.iter().filter(|r| !r.holds()) {
        let what = match r.outcome {
            SeedOutcome::Violation => r
                .violations
                .first()
                .map(|v| format!("{} at +{}s: {}", v.rule, v.at, v.action))
                .unwrap_or_default(),
            SeedOutcome::Stuck => r.stuck.clone().unwrap_or_default(),
            SeedOutcome::Completed => r
                .pauses
                .iter()
                .find(|p| p.fault.is_none())
                .map(|p| format!("a pause no injected fault explains: {}", p.cause))
                .unwrap_or_default(),
        };
        let cluster = opts
            .cluster
            .as_deref()
            .map(|c| format!(" --cluster {}", ichor::escape::terminal(c)))
            .unwrap_or_default();
        out.push_str(&format!(
            "seed {}: {}\n  replay: ichor rehearse --repo {} --base {} --head {}{cluster} --seed {}\n",
            r.seed,
            ichor::escape::terminal(&what),
            ichor::escape::terminal(&opts.repo.display().to_string()),
            ichor::escape::terminal(&opts.base),
            ichor::escape::terminal(&opts.head),
            r.seed
        ));
    }
    out.push_str(if s.holds() {
        "every seed held\n"
    } else {
        "NOT HOLDING\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_a_closed_range_bounded_in_size() {
        assert_eq!(parse_seeds("1..100"), Ok((1, 100)));
        assert_eq!(parse_seeds("7..7"), Ok((7, 7)));
        assert!(parse_seeds("9..1")
            .unwrap_err()
            .contains("before the start"));
        assert!(parse_seeds("1-9").unwrap_err().contains("A..B"));
        assert!(parse_seeds("a..9").unwrap_err().contains("\"a\""));
        assert!(parse_seeds("0..18446744073709551615")
            .unwrap_err()
            .contains("at most"));
    }
}
