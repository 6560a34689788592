//! `ichor rollout` on a terminal: one progress bar per stage (indicatif), with what happens
//! printed above the bars; without a terminal (a pipe, CI, a log), plain lines stamped with
//! the time since the start. Every line is made inert for a terminal first: node and pod
//! names come from the cluster.

use std::sync::Mutex;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{stage_key, Progress};
use crate::clock::{Clock, Timestamp};
use crate::plan::StageId;

pub struct Terminal {
    clock: Clock,
    start: Timestamp,
    bars: Option<MultiProgress>,
    current: Mutex<Option<(StageId, ProgressBar)>>,
    /// Everything said, as printed (for the summary and for tests).
    lines: Mutex<Vec<String>>,
    /// The engine's last ETA, printed with the node it follows from.
    eta: Mutex<Option<String>>,
}

impl Terminal {
    /// Bars when `tty`, plain lines otherwise.
    pub fn new(clock: Clock, tty: bool) -> Self {
        let start = clock.now();
        Terminal {
            clock,
            start,
            bars: tty.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
            current: Mutex::new(None),
            lines: Mutex::new(Vec::new()),
            eta: Mutex::new(None),
        }
    }

    /// The ETA the engine said last, taken (each is printed once).
    fn eta(&self) -> Option<String> {
        self.eta.lock().ok()?.take()
    }

    fn stamp(&self) -> String {
        let t = self.clock.now().since(self.start).as_secs();
        format!("+{:02}:{:02}:{:02}", t / 3600, (t % 3600) / 60, t % 60)
    }

    fn line(&self, text: &str) {
        let line = format!("{}  {}", self.stamp(), crate::escape::terminal(text));
        match &self.bars {
            Some(m) => {
                let _ = m.println(&line);
            }
            None => eprintln!("{line}"),
        }
        if let Ok(mut l) = self.lines.lock() {
            l.push(line);
        }
    }

    /// What was said, in order.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn report(&self, p: Progress) {
        match &p {
            Progress::StageStarted { stage, units, .. } => {
                if let Some(m) = &self.bars {
                    let bar = m.add(ProgressBar::new(*units));
                    bar.set_style(
                        ProgressStyle::with_template("{prefix:>34} [{bar:30}] {pos}/{len} {msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_bar())
                            .progress_chars("=> "),
                    );
                    bar.set_prefix(stage_key(*stage));
                    if let Ok(mut c) = self.current.lock() {
                        *c = Some((*stage, bar));
                    }
                }
                self.line(&p.to_string());
            }
            Progress::Eta(e) => {
                if let Ok(mut last) = self.eta.lock() {
                    *last = Some(e.short());
                }
            }
            Progress::UnitDone { .. } => {
                let eta = self.eta();
                if let Ok(c) = self.current.lock() {
                    if let Some((_, bar)) = c.as_ref() {
                        bar.inc(1);
                        if let Some(eta) = &eta {
                            bar.set_message(eta.clone());
                        }
                    }
                }
                match eta {
                    Some(eta) => self.line(&format!("{p} ({eta})")),
                    None => self.line(&p.to_string()),
                }
            }
            Progress::StageFinished { .. } => {
                let _ = self.eta();
                if let Ok(mut c) = self.current.lock() {
                    if let Some((_, bar)) = c.take() {
                        bar.finish_with_message("done");
                    }
                }
                self.line(&p.to_string());
            }
            Progress::Waiting(w) => {
                if let Ok(c) = self.current.lock() {
                    if let Some((_, bar)) = c.as_ref() {
                        bar.set_message(crate::escape::terminal(&crate::releaseset::excerpt(
                            w, 60,
                        )));
                    }
                }
                self.line(&p.to_string());
            }
            // The table is for the PR's comment; a terminal has the notes of each gate.
            Progress::HealthChecks(_) => {}
            Progress::Note(_)
            | Progress::HealthCheckFailing { .. }
            | Progress::HealthCheckRecovered { .. }
            | Progress::Event(_) => self.line(&p.to_string()),
        }
    }

    /// Take the bars off the screen before the summary is printed.
    pub fn finish(&self) {
        if let Ok(mut c) = self.current.lock() {
            if let Some((_, bar)) = c.take() {
                bar.abandon();
            }
        }
        if let Some(m) = &self.bars {
            let _ = m.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_stamped_with_time_since_the_start_and_made_inert() {
        let clock = Clock::manual();
        let t = Terminal::new(clock.clone(), false);
        clock.advance(std::time::Duration::from_secs(3725));
        t.report(Progress::Note("node \u{1b}[31mw-1\u{1b}[0m drained".into()));
        let lines = t.lines();
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("+01:02:05  "), "{}", lines[0]);
        assert!(!lines[0].contains('\u{1b}'), "{}", lines[0]);
    }

    #[test]
    fn with_a_plan_each_node_done_says_how_far_and_when_it_ends() {
        let clock = Clock::manual();
        let plan = crate::plan::tests_support::two_worker_plan();
        let t = Terminal::new(clock.clone(), false);
        let mut eta = crate::plan::eta::Eta::new(&plan, clock.now());
        clock.advance(std::time::Duration::from_secs(600));
        eta.unit_done(StageId::Talos, Some("w-1"), clock.now());
        t.report(Progress::Eta(eta.estimate(clock.now())));
        t.report(Progress::UnitDone {
            stage: StageId::Talos,
            what: "w-1 runs Talos v1.12.6".into(),
            node: Some("w-1".into()),
        });
        let lines = t.lines();
        assert!(lines[0].ends_with(" UTC)"), "{}", lines[0]);
        assert!(lines[0].contains("(1/2 done, ends ≈ "), "{}", lines[0]);
    }
}
