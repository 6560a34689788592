//! A live ETA: how long the rest of a rollout should take, from what this rollout has shown
//! so far, falling back to the plan's estimate.
//!
//! The plan gives each step an estimated duration; the steps run in plan order. Once some
//! have finished, the rollout's pace is known: actual time over planned time for what is
//! done. The rest is the plan's remaining estimate at that pace, less the time already spent
//! on the step under way. Pure: the caller says when each node (or sync) finished.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Plan, StageId};
use crate::clock::Timestamp;

/// A pace outside this band is taken as a measurement accident (a step that found its node
/// already done, a pause counted as work): the estimate never runs wild on one odd step.
const PACE: (f64, f64) = (0.2, 5.0);

#[derive(Debug, Clone)]
struct Tracked {
    stage: StageId,
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
}

/// The rollout's progress against its plan.
#[derive(Debug, Clone)]
pub struct Eta {
    steps: Vec<Tracked>,
    started: Timestamp,
    /// The planned total (seconds).
    planned_total: u64,
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
                    planned_start: s.start_secs,
                    planned_secs: s.duration_secs,
                    waiting: s.nodes.iter().cloned().collect(),
                    unit: s.nodes.is_empty(),
                    done_at: None,
                    earlier: false,
                    nodes: s.nodes.len().max(1),
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

    fn mark(&mut self, stage: StageId, node: Option<&str>, at: Timestamp, earlier: bool) {
        let step = self.steps.iter_mut().find(|s| {
            s.stage == stage
                && s.done_at.is_none()
                && match node {
                    Some(n) => s.waiting.contains(n),
                    None => s.unit,
                }
        });
        let Some(step) = step else {
            return;
        };
        if let Some(n) = node {
            step.waiting.remove(n);
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
        let (pace, observed) = match last_done {
            Some(at) if planned_done > 0 => {
                let actual = at.since(self.started).as_secs_f64();
                let pace = (actual / planned_done as f64).clamp(PACE.0, PACE.1);
                (pace, true)
            }
            _ => (1.0, false),
        };
        let planned_left: u64 = self
            .steps
            .iter()
            .filter(|s| s.done_at.is_none())
            .map(|s| s.planned_secs)
            .sum();
        // The step under way has been going since the last one finished (or the start).
        let under_way = now.since(last_done.unwrap_or(self.started)).as_secs_f64();
        let left = (planned_left as f64 * pace - under_way).max(0.0);
        let left = if planned_left == 0 { 0.0 } else { left };
        let remaining = Duration::from_secs_f64(left);
        Estimate {
            remaining,
            end: now.plus(remaining),
            done,
            total,
            observed,
        }
    }

    /// The plan's own total, for comparing with the actual one at the end.
    pub fn planned_total(&self) -> Duration {
        Duration::from_secs(self.planned_total)
    }
}

impl Estimate {
    /// "23/60 nodes, done ≈ 14:20 UTC": for a status description.
    pub fn short(&self) -> String {
        let t = self.end.rfc3339();
        format!(
            "{}/{} done, ends ≈ {} UTC",
            self.done,
            self.total,
            &t[11..16]
        )
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
                            "talos/w1",
                            StepKind::TalosUpgrade,
                            &["w-1", "w-2"],
                            300,
                            300,
                        ),
                        step(
                            "talos/w2",
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
}
