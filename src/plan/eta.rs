//! A live ETA: how long the rest of a rollout should take, from what this rollout has shown
//! so far, falling back to the plan's estimate.
//!
//! The plan's steps fall into phases: the control planes of a stage one at a time, the
//! workers of a stage in the pool (started as slots free, `maxUnavailable` at once), a sync.
//! A phase whose nodes this run has seen finish is judged by them: the median node's time
//! for each node still to go, the workers' shared out over the pool's slots, less what the
//! nodes under way have already spent. A phase with nothing seen yet takes the plan's
//! estimate at the pace of what is done (actual over planned time), less the time already
//! spent on it if it is under way. Pure: the caller says when each node (or sync) started
//! and finished.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::window::{self, Work};
use super::{Plan, StageId, StepKind};
use crate::clock::Timestamp;
use crate::releaseset::MaintenanceWindow;

/// A pace outside this band is taken as a measurement accident (a step that found its node
/// already done, a pause counted as work): the estimate never runs wild on one odd step.
const PACE: (f64, f64) = (0.2, 5.0);

#[derive(Debug, Clone)]
struct Tracked {
    stage: StageId,
    /// A batch of workers the pool runs (`*/workers-N`): its nodes share the slots.
    pooled: bool,
    /// Planned offsets from the start (seconds).
    planned_start: u64,
    planned_secs: u64,
    /// Nodes still to finish; a step without nodes (a sync) finishes as one unit.
    waiting: BTreeSet<String>,
    unit: bool,
    done_at: Option<Timestamp>,
    /// Finished by an earlier run (a resume): counted as done, not in the pace.
    earlier: bool,
    /// Nodes of the step in all (for the "n of m" count).
    nodes: usize,
    /// When each node still waiting began, once it has.
    started: BTreeMap<String, Timestamp>,
    /// How long each node this run saw from start to finish took (seconds).
    took: Vec<u64>,
    /// When each of those nodes started and finished: its time outside the windows was
    /// work too.
    spans: Vec<(Timestamp, Timestamp)>,
    /// It starts only inside a maintenance window (every step but verify).
    gated: bool,
}

/// The rollout's progress against its plan.
#[derive(Debug, Clone)]
pub struct Eta {
    steps: Vec<Tracked>,
    started: Timestamp,
    /// The planned total (seconds).
    planned_total: u64,
    /// Only these windows start a step: the end counts window time only.
    windows: Vec<MaintenanceWindow>,
}

/// What [`Eta::estimate`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    pub remaining: Duration,
    pub end: Timestamp,
    /// Nodes (or syncs) done and in all.
    pub done: usize,
    pub total: usize,
    /// Whether the pace comes from this rollout (false: the plan's estimate as it is).
    pub observed: bool,
    /// With maintenance windows: when the next opens, while none is open and a step
    /// still waits for one.
    pub next_window: Option<Timestamp>,
    /// With maintenance windows: how many the rest needs (0 without windows).
    pub windows: usize,
}

impl Eta {
    /// Tracking `plan` from `started` on.
    pub fn new(plan: &Plan, started: Timestamp) -> Eta {
        let steps: Vec<Tracked> = plan
            .stages
            .iter()
            .flat_map(|stage| {
                stage.steps.iter().map(move |s| Tracked {
                    stage: stage.id,
                    pooled: s.is_worker_batch(),
                    planned_start: s.start_secs,
                    planned_secs: s.duration_secs,
                    waiting: s.nodes.iter().cloned().collect(),
                    unit: s.nodes.is_empty(),
                    done_at: None,
                    earlier: false,
                    nodes: s.nodes.len().max(1),
                    started: BTreeMap::new(),
                    took: Vec::new(),
                    spans: Vec::new(),
                    gated: s.kind != StepKind::Verify,
                })
            })
            .collect();
        let planned_total = steps
            .iter()
            .map(|s| s.planned_start + s.planned_secs)
            .max()
            .unwrap_or(0)
            .max(plan.estimate_secs);
        Eta {
            steps,
            started,
            planned_total,
            windows: Vec::new(),
        }
    }

    /// With the cluster's maintenance windows: the end counts only the time they let the
    /// rollout work, and the pace leaves out the waits between them.
    pub fn with_windows(mut self, windows: &[MaintenanceWindow]) -> Eta {
        self.windows = windows.to_vec();
        self
    }

    /// Wall time from `from` to `to` that the rollout could work: all of it without
    /// windows; with them, the window time and the time nodes ran past a window's end.
    fn working(&self, from: Timestamp, to: Timestamp) -> f64 {
        if self.windows.is_empty() {
            return to.since(from).as_secs_f64();
        }
        let open = window::open_time(&self.windows, from, to);
        let past_end: std::time::Duration = self
            .steps
            .iter()
            .flat_map(|s| s.spans.iter())
            .map(|&(a, b)| (a.max(from), b.min(to)))
            .filter(|(a, b)| a < b)
            .map(|(a, b)| {
                b.since(a)
                    .saturating_sub(window::open_time(&self.windows, a, b))
            })
            .sum();
        (open + past_end).min(to.since(from)).as_secs_f64()
    }

    /// A node of `stage` began its step at `at` (an earlier run's start counts: the node
    /// has been out since). Unknown nodes are ignored.
    pub fn unit_started(&mut self, stage: StageId, node: &str, at: Timestamp) {
        if let Some(step) = self.step_of(stage, Some(node)) {
            step.started.entry(node.to_string()).or_insert(at);
        }
    }

    /// A node of `stage` finished at `at` (`None`: the stage's one unit without a node, such
    /// as the manifest sync). Unknown nodes are ignored.
    pub fn unit_done(&mut self, stage: StageId, node: Option<&str>, at: Timestamp) {
        self.mark(stage, node, at, false);
    }

    /// A node (or sync) an earlier run of this rollout finished: done, but its time says
    /// nothing about this run's pace.
    pub fn already_done(&mut self, stage: StageId, node: Option<&str>) {
        self.mark(stage, node, self.started, true);
    }

    fn step_of(&mut self, stage: StageId, node: Option<&str>) -> Option<&mut Tracked> {
        self.steps.iter_mut().find(|s| {
            s.stage == stage
                && s.done_at.is_none()
                && match node {
                    Some(n) => s.waiting.contains(n),
                    None => s.unit,
                }
        })
    }

    fn mark(&mut self, stage: StageId, node: Option<&str>, at: Timestamp, earlier: bool) {
        let Some(step) = self.step_of(stage, node) else {
            return;
        };
        if let Some(n) = node {
            step.waiting.remove(n);
            if let Some(began) = step.started.remove(n).filter(|_| !earlier) {
                step.took.push(at.since(began).as_secs());
                step.spans.push((began, at));
            }
        }
        if step.unit || step.waiting.is_empty() {
            step.done_at = Some(at);
            step.earlier = earlier;
        }
    }

    /// Every step of `stage` is done (the engine finished it), whatever units were reported.
    pub fn stage_done(&mut self, stage: StageId, at: Timestamp) {
        for s in self.steps.iter_mut().filter(|s| s.stage == stage) {
            s.waiting.clear();
            s.started.clear();
            s.done_at.get_or_insert(at);
        }
    }

    /// The remaining time and the expected end, as of `now`.
    pub fn estimate(&self, now: Timestamp) -> Estimate {
        let total = self.steps.iter().map(|s| s.nodes).sum();
        let done = self
            .steps
            .iter()
            .map(|s| match s.done_at {
                Some(_) => s.nodes,
                None if s.unit => 0,
                None => s.nodes - s.waiting.len(),
            })
            .sum();
        // Planned seconds of the finished steps, and when the last of them finished.
        let planned_done: u64 = self
            .steps
            .iter()
            .filter(|s| s.done_at.is_some() && !s.earlier)
            .map(|s| s.planned_secs)
            .sum();
        let last_done = self
            .steps
            .iter()
            .filter(|s| !s.earlier)
            .filter_map(|s| s.done_at)
            .max();
        let (pace, mut observed) = match last_done {
            Some(at) if planned_done > 0 => {
                let actual = self.working(self.started, at);
                let pace = (actual / planned_done as f64).clamp(PACE.0, PACE.1);
                (pace, true)
            }
            _ => (1.0, false),
        };
        // The phase under way has been going since the last step finished (or the start).
        let mut under_way = self.working(last_done.unwrap_or(self.started), now);
        let mut left = 0.0;
        // What is left of each open step, in order, for the calendar.
        let mut work: Vec<Work> = Vec::new();
        for phase in self.phases() {
            let open: Vec<&Tracked> = phase.iter().filter(|s| s.done_at.is_none()).collect();
            if open.is_empty() {
                continue;
            }
            let mut took: Vec<u64> = phase.iter().flat_map(|s| s.took.iter().copied()).collect();
            let phase_left = if took.is_empty() || open.iter().any(|s| s.unit) {
                let planned: u64 = open.iter().map(|s| s.planned_secs).sum();
                let spent = std::mem::take(&mut under_way);
                (planned as f64 * pace - spent).max(0.0)
            } else {
                observed = true;
                under_way = 0.0;
                took.sort_unstable();
                let median = took[took.len() / 2] as f64;
                // What each node under way still needs, and the nodes not begun.
                let mut work = 0.0;
                let mut longest: f64 = 0.0;
                for s in &open {
                    for n in &s.waiting {
                        let need = match s.started.get(n) {
                            Some(began) => (median - now.since(*began).as_secs_f64()).max(0.0),
                            None => median,
                        };
                        work += need;
                        longest = longest.max(need);
                    }
                }
                let slots = if phase[0].pooled {
                    phase.iter().map(|s| s.nodes).max().unwrap_or(1)
                } else {
                    1
                };
                (work / slots as f64).max(longest)
            };
            left += phase_left;
            // Shared out over the open steps as planned; a step with a node under way
            // needs no window to go on.
            let planned: u64 = open.iter().map(|s| s.planned_secs).sum();
            for s in &open {
                let share = match planned {
                    0 => phase_left / open.len() as f64,
                    p => phase_left * s.planned_secs as f64 / p as f64,
                };
                work.push(Work {
                    secs: share.round() as u64,
                    gated: s.gated && s.started.is_empty(),
                });
            }
        }
        let remaining = Duration::from_secs_f64(left);
        let (end, next_window, windows) = if self.windows.is_empty() {
            (now.plus(remaining), None, 0)
        } else {
            let c = window::calendar(&self.windows, now, &work);
            let waits = work.iter().any(|w| w.gated)
                && matches!(
                    window::state(&self.windows, now),
                    window::WindowState::Closed { .. }
                );
            // The calendar rounds each share to a second; never end before the work does.
            (
                c.ends_at.max(now.plus(remaining)),
                waits.then(|| window::next_open(&self.windows, now)),
                c.windows,
            )
        };
        Estimate {
            remaining,
            end,
            done,
            total,
            observed,
            next_window,
            windows,
        }
    }

    /// The steps in plan order, cut where the stage or the way its nodes run changes: a
    /// stage's control planes, its worker pool, a sync.
    fn phases(&self) -> impl Iterator<Item = &[Tracked]> {
        self.steps
            .chunk_by(|a, b| a.stage == b.stage && a.pooled == b.pooled && !a.unit && !b.unit)
    }

    /// The plan's own total, for comparing with the actual one at the end.
    pub fn planned_total(&self) -> Duration {
        Duration::from_secs(self.planned_total)
    }
}

impl Estimate {
    /// "23/60 done, ends ≈ 14:20 UTC": for a status description. With windows the end may
    /// be days away, so it carries the date, and a wait names the window it waits for:
    /// "1/7 done, ends ≈ 2026-12-12 07:40 UTC, next window Sat 06:00 UTC".
    pub fn short(&self) -> String {
        let t = self.end.rfc3339();
        let mut out = if self.windows == 0 && self.next_window.is_none() {
            format!(
                "{}/{} done, ends ≈ {} UTC",
                self.done,
                self.total,
                &t[11..16]
            )
        } else {
            format!(
                "{}/{} done, ends ≈ {} {} UTC",
                self.done,
                self.total,
                &t[..10],
                &t[11..16]
            )
        };
        if let Some(w) = self.next_window {
            let d = window::describe(w);
            let day_time = d.split(" (").next().unwrap_or(&d);
            out.push_str(&format!(", next window {day_time}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Stage, Step, StepKind};

    fn step(id: &str, kind: StepKind, nodes: &[&str], start: u64, secs: u64) -> Step {
        Step {
            id: id.into(),
            kind,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            description: id.into(),
            start_secs: start,
            duration_secs: secs,
        }
    }

    fn plan() -> Plan {
        Plan {
            cluster: "c".into(),
            summary: String::new(),
            control_planes: 1,
            workers: 4,
            stages: vec![
                Stage {
                    id: StageId::Talos,
                    title: "Talos".into(),
                    steps: vec![
                        step("talos/cp-1", StepKind::TalosUpgrade, &["cp-1"], 0, 300),
                        step(
                            "talos/workers-1",
                            StepKind::TalosUpgrade,
                            &["w-1", "w-2"],
                            300,
                            300,
                        ),
                        step(
                            "talos/workers-2",
                            StepKind::TalosUpgrade,
                            &["w-3", "w-4"],
                            600,
                            300,
                        ),
                    ],
                },
                Stage {
                    id: StageId::KubeProxyManifests,
                    title: "sync".into(),
                    steps: vec![step("manifests", StepKind::Manifests, &[], 900, 100)],
                },
            ],
            worker_batches: crate::plan::BatchReport {
                max_unavailable: 2,
                count: 2,
                lower_bound: 2,
                volume_aware: false,
            },
            estimate_secs: 1000,
            pairings: vec![],
            notes: vec![],
            warnings: vec![],
            ichor_node: None,
            schedule: None,
            path: None,
        }
    }

    const T0: u64 = 1_800_000_000_000;
    fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(T0 + secs * 1000)
    }

    #[test]
    fn before_anything_finishes_the_plan_is_the_estimate() {
        let eta = Eta::new(&plan(), at(0));
        let e = eta.estimate(at(0));
        assert_eq!(e.remaining, Duration::from_secs(1000));
        assert!(!e.observed);
        assert_eq!((e.done, e.total), (0, 6));
        // Time spent on the first step counts against it.
        assert_eq!(eta.estimate(at(100)).remaining, Duration::from_secs(900));
    }

    #[test]
    fn the_pace_seen_so_far_scales_what_is_left() {
        let mut eta = Eta::new(&plan(), at(0));
        // The control plane took twice the plan: the rest should too.
        eta.unit_done(StageId::Talos, Some("cp-1"), at(600));
        let e = eta.estimate(at(600));
        assert!(e.observed);
        assert_eq!(e.remaining, Duration::from_secs(2 * 700));
        assert_eq!(e.end, at(600 + 1400));
        // One node of a batch is not the batch.
        eta.unit_done(StageId::Talos, Some("w-2"), at(1100));
        assert_eq!(eta.estimate(at(1100)).done, 2);
        assert_eq!(eta.estimate(at(1100)).remaining, Duration::from_secs(900));
        eta.unit_done(StageId::Talos, Some("w-1"), at(1200));
        // Done 600 planned seconds in 1200: pace 2, 400 planned left.
        assert_eq!(eta.estimate(at(1200)).remaining, Duration::from_secs(800));
        // A node nobody planned changes nothing; the sync is one unit.
        eta.unit_done(StageId::Talos, Some("w-9"), at(1200));
        eta.stage_done(StageId::Talos, at(1800));
        eta.unit_done(StageId::KubeProxyManifests, None, at(2000));
        let e = eta.estimate(at(2000));
        assert_eq!((e.remaining, e.done, e.total), (Duration::ZERO, 6, 6));
        assert_eq!(
            e.short(),
            format!("6/6 done, ends ≈ {} UTC", &at(2000).rfc3339()[11..16])
        );
    }

    #[test]
    fn a_resumed_rollout_counts_what_an_earlier_run_did_but_not_in_its_pace() {
        let mut eta = Eta::new(&plan(), at(5000));
        eta.already_done(StageId::Talos, Some("cp-1"));
        let e = eta.estimate(at(5000));
        assert_eq!((e.done, e.observed), (1, false));
        assert_eq!(e.remaining, Duration::from_secs(700));
        // This run's own first batch sets the pace: 300 planned in 600.
        eta.unit_done(StageId::Talos, Some("w-1"), at(5600));
        eta.unit_done(StageId::Talos, Some("w-2"), at(5600));
        let e = eta.estimate(at(5600));
        assert_eq!((e.done, e.observed), (3, true));
        assert_eq!(e.remaining, Duration::from_secs(800));
    }

    #[test]
    fn an_odd_step_does_not_run_the_estimate_wild() {
        let mut eta = Eta::new(&plan(), at(0));
        // A node already at the target finishes at once.
        eta.unit_done(StageId::Talos, Some("cp-1"), at(0));
        let e = eta.estimate(at(0));
        assert_eq!(e.remaining, Duration::from_secs_f64(700.0 * PACE.0));
        let mut slow = Eta::new(&plan(), at(0));
        slow.unit_done(StageId::Talos, Some("cp-1"), at(300 * 100));
        assert_eq!(
            slow.estimate(at(300 * 100)).remaining,
            Duration::from_secs_f64(700.0 * PACE.1)
        );
    }

    #[test]
    fn nodes_seen_finish_judge_the_rest_of_their_phase() {
        let mut eta = Eta::new(&plan(), at(0));
        eta.unit_started(StageId::Talos, "cp-1", at(0));
        eta.unit_done(StageId::Talos, Some("cp-1"), at(100));
        // A third of the plan's time: the workers, not seen yet, at that pace.
        let third = |secs: f64| secs / 3.0;
        let e = eta.estimate(at(100));
        assert!((e.remaining.as_secs_f64() - third(600.0 + 100.0)).abs() < 0.01);
        // Workers take longer than the control plane did; once one is seen, the pool's
        // rest is judged by the workers alone: w-2 is under way, w-3 and w-4 have not
        // begun, two slots.
        eta.unit_started(StageId::Talos, "w-1", at(100));
        eta.unit_started(StageId::Talos, "w-2", at(100));
        eta.unit_done(StageId::Talos, Some("w-1"), at(500));
        let e = eta.estimate(at(500));
        assert!(e.observed);
        assert!((e.remaining.as_secs_f64() - (400.0 + third(100.0))).abs() < 0.01);
        eta.unit_started(StageId::Talos, "w-3", at(500));
        eta.unit_done(StageId::Talos, Some("w-2"), at(520));
        // Median 420: w-3 needs 400 more and w-4, not begun, 420: two slots share 820
        // seconds of work, but w-4 alone needs 420. The sync, not seen, goes at the pace
        // of the steps done: 600 planned seconds in 520.
        let sync = 100.0 * 520.0 / 600.0;
        let e = eta.estimate(at(520));
        assert!((e.remaining.as_secs_f64() - (420.0 + sync)).abs() < 0.01);
        // A node past the median needs nothing more; the one not begun still needs all.
        let e = eta.estimate(at(2000));
        assert!((e.remaining.as_secs_f64() - (420.0 + sync)).abs() < 0.01);
    }

    fn saturday(minutes: u64) -> Vec<MaintenanceWindow> {
        use crate::releaseset::{HumanDuration, TimeOfDay, Weekday};
        vec![MaintenanceWindow {
            days: vec![Weekday::Sat],
            start: TimeOfDay { hour: 6, minute: 0 },
            duration: HumanDuration::from_secs(minutes * 60),
        }]
    }

    fn utc(text: &str) -> Timestamp {
        Timestamp::parse_rfc3339(text).unwrap()
    }

    #[test]
    fn with_windows_the_end_counts_window_time_and_the_wait_is_named() {
        // Merged on a Tuesday; the window opens on Saturday at 06:00 for an hour.
        let eta = Eta::new(&plan(), utc("2026-12-01T12:00:00Z")).with_windows(&saturday(60));
        let e = eta.estimate(utc("2026-12-01T12:00:00Z"));
        assert_eq!(e.remaining, Duration::from_secs(1000));
        assert_eq!(e.next_window, Some(utc("2026-12-05T06:00:00Z")));
        assert_eq!(e.end, utc("2026-12-05T06:16:40Z"));
        assert_eq!(e.windows, 1);
        assert_eq!(
            e.short(),
            "0/6 done, ends ≈ 2026-12-05 06:16 UTC, next window Sat 06:00 UTC"
        );
        // Days of waiting are no work done: the estimate is whole on Friday.
        let e = eta.estimate(utc("2026-12-04T12:00:00Z"));
        assert_eq!(e.remaining, Duration::from_secs(1000));
        assert_eq!(e.end, utc("2026-12-05T06:16:40Z"));
        // Inside the window, its time counts against the step under way.
        let e = eta.estimate(utc("2026-12-05T06:01:40Z"));
        assert_eq!(e.remaining, Duration::from_secs(900));
        assert_eq!(e.next_window, None);
    }

    #[test]
    fn with_windows_the_pace_leaves_out_the_wait_and_a_short_window_takes_another_week() {
        let mut eta = Eta::new(&plan(), utc("2026-12-01T12:00:00Z")).with_windows(&saturday(15));
        eta.unit_started(StageId::Talos, "cp-1", utc("2026-12-05T06:00:00Z"));
        eta.unit_done(StageId::Talos, Some("cp-1"), utc("2026-12-05T06:10:00Z"));
        let e = eta.estimate(utc("2026-12-05T06:10:00Z"));
        // 300 planned seconds took 600 of window time (not the four days since the start):
        // pace 2, so 700 planned seconds are 1400 more.
        assert_eq!(e.remaining, Duration::from_secs(1400));
        // The first batch starts in this window (06:10–06:20); the second waits a week,
        // and the sync follows it inside that window.
        assert_eq!(e.end, utc("2026-12-12T06:13:20Z"));
        assert_eq!((e.windows, e.next_window), (2, None));
        // Once the window closed with the batch still out, the next opening is named.
        eta.unit_started(StageId::Talos, "w-1", utc("2026-12-05T06:10:00Z"));
        eta.unit_started(StageId::Talos, "w-2", utc("2026-12-05T06:10:00Z"));
        let e = eta.estimate(utc("2026-12-05T06:16:00Z"));
        assert_eq!(e.next_window, Some(utc("2026-12-12T06:00:00Z")));
    }
}
