//! The health gates (`spec.healthChecks`): `before` at pre-flight, `between` after each
//! node (or batch) is back and before the next starts (stage boundaries included), `after`
//! at the final verify.
//!
//! A gate is a step of the one shape: each round reads every check that applies, and the
//! gate is Done when each holds (passed without a break for its `stableFor`), Settling while
//! one does not, Failed once one has not held for its `timeout` — then the rollout pauses
//! naming the check, its last value and what it read. Time is ichor's clock; the gate's
//! start and each check's unbroken run of passes are in the rollout record, so a restarted
//! engine resumes the same gate with the same deadline (a resumed pause gets a new one,
//! as a resumed step does).

use std::collections::BTreeMap;
use std::time::Duration;

use super::record::{CheckRecord, HealthGate};
use super::step::StepState;
use super::{stage_key, Flow, Progress, Run};
use crate::clock::Timestamp;
use crate::health::{self, HealthCheck, Outcome, Phase, Reading, Verdict};
use crate::plan::StageId;

/// The time budget of one CEL evaluation (all the objects of one check), real time: the
/// bounds of `crate::health` keep it far below this; this is the backstop.
const CEL_BUDGET: Duration = Duration::from_secs(2);

/// Evaluations at once: one past its budget cannot be stopped (it runs on a blocking
/// thread) and keeps its slot until it ends, so at most this many can be left running.
const CEL_SLOTS: usize = 4;
static CEL_RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(CEL_SLOTS);

/// Read one check now: its objects through `crate::kube`, or Prometheus's answer.
pub async fn read_check(
    kube: &crate::kube::KubeClient,
    prometheus_credential: Option<&crate::prometheus::Credential>,
    check: &HealthCheck,
    now: Timestamp,
) -> Reading {
    if let Some(k) = &check.kubernetes {
        let objects = match kube
            .objects(
                &k.api_version,
                &k.kind,
                k.namespace.as_deref(),
                k.name.as_deref(),
                k.label_selector.as_deref(),
                health::MAX_MATCHES,
            )
            .await
        {
            Ok(o) => o,
            Err(e) if e.is_not_found() => {
                return Reading::fail(
                    format!(
                        "error: {} {} is not served by the cluster",
                        k.api_version, k.kind
                    ),
                    crate::releaseset::excerpt(&e.to_string(), 200),
                )
            }
            // The API server did not answer: nothing is known of the object.
            Err(e) => {
                return Reading::unknown(
                    "error: the object could not be read",
                    crate::releaseset::excerpt(&e.to_string(), 300),
                )
            }
        };
        return evaluate_bounded(k.expression.clone(), k.failure_expression.clone(), objects).await;
    }
    if let Some(p) = &check.prometheus {
        let max_age = p.max_sample_age.map(|d| d.as_duration());
        let ask = |query: &str| {
            let query = query.to_string();
            async move {
                match crate::prometheus::query(
                    &p.url,
                    &query,
                    prometheus_credential,
                    crate::prometheus::QUERY_TIMEOUT,
                )
                .await
                {
                    Ok(a) => health::judge_prometheus(a.status, &a.body, now, max_age),
                    Err(why) => Reading::unknown(format!("error: {why}"), p.url.clone()),
                }
            }
        };
        // The failure query first: a sample in its answer means broken beyond waiting.
        if let Some(q) = &p.failure_query {
            let r = ask(q).await;
            match r.outcome {
                Outcome::Pass => {
                    return Reading::failed(format!("failureQuery has {}", r.value), r.read)
                }
                Outcome::Fail => {}
                Outcome::Unknown | Outcome::Failed => {
                    return Reading {
                        value: format!("failureQuery: {}", r.value),
                        ..r
                    }
                }
            }
        }
        return ask(&p.query).await;
    }
    if let Some(a) = &check.alertmanager {
        return match crate::prometheus::alerts(
            &a.url,
            &a.matchers,
            a.include_silenced,
            crate::prometheus::QUERY_TIMEOUT,
        )
        .await
        {
            Ok(answer) => health::judge_alerts(answer.status, &answer.body),
            Err(why) => Reading::unknown(format!("error: {why}"), a.url.clone()),
        };
    }
    Reading::fail("error: the check has no kind", "")
}

/// CEL on a blocking thread under [`CEL_BUDGET`], in one of [`CEL_SLOTS`] slots: the
/// `failureExpression` first, then the expression.
async fn evaluate_bounded(
    expression: String,
    failure: Option<String>,
    objects: Vec<serde_json::Value>,
) -> Reading {
    let slot = match tokio::time::timeout(CEL_BUDGET, CEL_RUNNING.acquire()).await {
        Ok(Ok(slot)) => slot,
        _ => {
            return Reading::unknown(
                "error: every CEL evaluation slot is held by evaluations past their budget",
                "",
            )
        }
    };
    let task = tokio::task::spawn_blocking(move || {
        // Held until the evaluation ends, however long past the budget that is.
        let _slot = slot;
        if let Some(f) = failure {
            match health::compile(&f) {
                Ok(p) => {
                    if let Some(r) = health::evaluate_failure(&p, &objects) {
                        return r;
                    }
                }
                Err(e) => return Reading::fail(format!("error: {}", e.message), ""),
            }
        }
        match health::compile(&expression) {
            Ok(p) => health::evaluate(&p, &objects),
            Err(e) => Reading::fail(format!("error: {}", e.message), ""),
        }
    });
    match tokio::time::timeout(CEL_BUDGET, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Reading::unknown("error: the CEL evaluation failed", ""),
        Err(_) => Reading::unknown(
            format!(
                "error: the CEL evaluation took longer than {}s",
                CEL_BUDGET.as_secs()
            ),
            "",
        ),
    }
}

/// Prometheus answered 400 bad_data: the query does not parse (or its parameters are
/// wrong), which no amount of waiting changes. The field of cluster.yaml it names.
fn unparsable_field(r: &Reading) -> Option<&'static str> {
    if r.value.starts_with("query error bad_data:") {
        Some("query")
    } else if r.value.starts_with("failureQuery: query error bad_data:") {
        Some("failureQuery")
    } else {
        None
    }
}

/// The gate's state for one check this round.
pub fn state_of(v: &Verdict) -> &'static str {
    match v {
        Verdict::Holds => "holds",
        Verdict::Settling(_) => "settling",
        Verdict::Unknown { .. } => "unknown",
        Verdict::Fails => "failing",
        Verdict::Failed => "failed",
    }
}

/// One round of a gate, as the step shape says it: Done when every check holds, Settling
/// (with what it waits on) while one does not, Failed at once when one is broken beyond
/// waiting, and once one has not held past its timeout.
pub fn gate_state(
    rounds: &[(&HealthCheck, &Reading, &Verdict)],
    elapsed: Duration,
    node_timeout: crate::releaseset::HumanDuration,
    phase: Phase,
) -> StepState<()> {
    let mut open = Vec::new();
    for (c, r, v) in rounds {
        let timeout = c.timeout_or(node_timeout);
        match v {
            Verdict::Holds => continue,
            // A query Prometheus cannot parse never passes: an error of cluster.yaml, now.
            Verdict::Failed => {
                if let Some(field) = unparsable_field(r) {
                    return StepState::Failed(format!(
                        "health check `{}` ({}): Prometheus cannot parse spec.healthChecks[name={}].prometheus.{field} in cluster.yaml: {}; fix the query in a commit, then resume",
                        c.name,
                        phase.key(),
                        c.name,
                        r.value
                    ));
                }
                return StepState::Failed(format!(
                    "health check `{}` ({}) failed: {}; it read {}: {}; nothing waits this out: fix what it watches, then resume",
                    c.name,
                    phase.key(),
                    r.value,
                    c.subject(),
                    if r.read.is_empty() { "nothing" } else { &r.read },
                ));
            }
            _ if elapsed >= timeout => {
                return StepState::Failed(format!(
                    "health check `{}` ({}) has not held for {}s (timeout {}s): last value {}; it read {}: {}; fix what it watches (the rollout resumes by itself within the timeout only), then resume",
                    c.name,
                    phase.key(),
                    elapsed.as_secs(),
                    timeout.as_secs(),
                    r.value,
                    c.subject(),
                    if r.read.is_empty() { "nothing" } else { &r.read },
                ));
            }
            Verdict::Settling(_) => open.push(format!(
                "health check `{}` passes, and must hold for {} (stableFor)",
                c.name, c.stable_for
            )),
            Verdict::Unknown { errors } => open.push(format!(
                "health check `{}` could not judge ({errors} of {} tolerated in a row): {}",
                c.name, c.error_limit, r.value
            )),
            Verdict::Fails => open.push(format!("health check `{}`: {}", c.name, r.value)),
        }
    }
    if open.is_empty() {
        StepState::Done
    } else {
        StepState::Settling(open.join("; "))
    }
}

/// The `before` checks as live items of the PR's checklist: a failing one makes the gate
/// wait, naming it (the rollout's own `before` gate adds `stableFor` and the timeout).
pub fn live_items(readings: &[(HealthCheck, Reading)]) -> Vec<crate::policy::CheckItem> {
    use crate::policy::{CheckItem, Status};
    readings
        .iter()
        .map(|(c, r)| {
            let id = format!("live/health/{}", c.name);
            let title = format!("Health check {} passes", c.name);
            let what = if r.read.is_empty() {
                c.subject()
            } else {
                format!("{}: {}", c.subject(), r.read)
            };
            let message = crate::releaseset::excerpt(&format!("{}; read {what}", r.value), 400);
            if r.passes() {
                CheckItem::new(&id, &title, Status::Pass, message).source("live")
            } else if let Some(field) = unparsable_field(r) {
                CheckItem::new(&id, &title, Status::Fail, message)
                    .hint(format!("an error of cluster.yaml: Prometheus cannot parse spec.healthChecks[name={}].prometheus.{field}; fix the query", c.name))
                    .source("live")
            } else if r.outcome == Outcome::Failed {
                CheckItem::new(&id, &title, Status::Fail, message)
                    .hint("broken beyond waiting (its failureExpression or failureQuery holds): the rollout would pause at once; fix what it watches")
                    .source("live")
            } else {
                CheckItem::new(&id, &title, Status::Wait, message)
                    .hint("the rollout starts once it passes (spec.healthChecks, when: before); the gate re-evaluates")
                    .source("live")
            }
        })
        .collect()
}

impl Run<'_, '_> {
    /// The `before` gate: once, before anything is touched (a begun rollout has passed it).
    pub(super) async fn health_before(&self) -> Flow<()> {
        let stage = self.plan.stages.first().map_or(StageId::Talos, |s| s.id);
        if self.begun().await {
            return Ok(());
        }
        self.health_gate(
            Phase::Before,
            stage,
            "before".into(),
            "before the rollout starts",
        )
        .await
    }

    /// The `between` gate after `step`, the `done`-th of `total` disruptive steps: none
    /// after the last (the `after` gate follows).
    pub(super) async fn health_between(
        &self,
        stage: StageId,
        after: &str,
        done: &mut usize,
        total: usize,
    ) -> Flow<()> {
        *done += 1;
        let any = self
            .engine
            .health_checks
            .iter()
            .any(|c| c.applies(Phase::Between));
        if *done >= total || !any {
            return Ok(());
        }
        let passed = self.stored.lock().await.record.health.between_passed;
        if (*done as u64) <= passed {
            return Ok(());
        }
        self.health_gate(
            Phase::Between,
            stage,
            format!("between/{}/{}", stage_key(stage), done),
            &format!("after {after}"),
        )
        .await?;
        let n = *done as u64;
        self.write(stage, |r| r.health.between_passed = n).await
    }

    pub(super) async fn health_after(&self, stage: StageId) -> Flow<()> {
        self.health_gate(Phase::After, stage, "after".into(), "at the final verify")
            .await
    }

    /// Wait at one gate until every check of `phase` holds, or pause.
    async fn health_gate(&self, phase: Phase, stage: StageId, key: String, at: &str) -> Flow<()> {
        let e = self.engine;
        let checks: Vec<&HealthCheck> = e
            .health_checks
            .iter()
            .filter(|c| c.applies(phase))
            .collect();
        if checks.is_empty() {
            return Ok(());
        }
        let now = self.now();
        // The same gate as the record's (a restarted engine): its start and runs of passes.
        let (start, mut since) = {
            let s = self.stored.lock().await;
            match &s.record.health.gate {
                Some(g) if g.key == key => (
                    Timestamp::parse_rfc3339(&g.started_at).unwrap_or(now),
                    s.record
                        .health
                        .checks
                        .iter()
                        .map(|(n, c)| {
                            let run = health::Run {
                                passing_since: c
                                    .passing_since
                                    .as_deref()
                                    .and_then(Timestamp::parse_rfc3339),
                                errors: c.errors,
                            };
                            (n.clone(), run)
                        })
                        .collect::<BTreeMap<_, _>>(),
                ),
                _ => (now, BTreeMap::new()),
            }
        };
        let gate = HealthGate {
            key: key.clone(),
            phase: phase.key().into(),
            at: at.into(),
            started_at: start.rfc3339(),
        };
        self.write(stage, |r| r.health.gate = Some(gate)).await?;
        loop {
            if let Some(why) = e.pause_requested.and_then(|f| f()) {
                return Err(self.pause(stage, None, why));
            }
            let now = self.now();
            let mut readings = Vec::new();
            for c in &checks {
                let r = read_check(e.kube, e.prometheus_credential.as_ref(), c, now).await;
                let entry = since.entry(c.name.clone()).or_default();
                let v = health::judge_stability(
                    &r,
                    entry,
                    c.stable_for.as_duration(),
                    c.error_limit,
                    now,
                );
                readings.push((*c, r, v));
            }
            let rounds: Vec<(&HealthCheck, &Reading, &Verdict)> =
                readings.iter().map(|(c, r, v)| (*c, r, v)).collect();
            let state = gate_state(&rounds, now.since(start), e.policy.node_timeout, phase);
            let turned = self
                .record_checks(stage, phase, &readings, &since, now)
                .await?;
            for (name, value, failing) in turned {
                self.say(if failing {
                    Progress::HealthCheckFailing { name, value }
                } else {
                    Progress::HealthCheckRecovered { name, value }
                });
            }
            if !matches!(state, StepState::Settling(_)) {
                // Each check's state and last value, for the PR's comment and the log.
                let states: Vec<String> = readings
                    .iter()
                    .map(|(c, r, v)| format!("{} {} ({})", c.name, state_of(v), r.value))
                    .collect();
                self.say(Progress::Note(format!(
                    "health checks {at}: {}",
                    states.join(", ")
                )));
            }
            match state {
                StepState::Done => {
                    self.write(stage, |r| r.health.gate = None).await?;
                    return self.waiting(stage, None).await;
                }
                StepState::Failed(why) => {
                    self.write(stage, |r| r.health.gate = None).await?;
                    return Err(self.pause(stage, None, why));
                }
                StepState::Settling(what) => {
                    self.waiting(stage, Some(format!("{at}: {what}"))).await?;
                }
                StepState::Act(()) => {}
            }
            e.clock.sleep_to_beat(e.observe_every).await;
        }
    }

    /// Each check's state into the record, written only when something a reader would see
    /// changed (not every round); the checks that just began failing (`true`) or hold again
    /// after failing (`false`), with their value.
    async fn record_checks(
        &self,
        stage: StageId,
        phase: Phase,
        readings: &[(&HealthCheck, Reading, Verdict)],
        since: &BTreeMap<String, health::Run>,
        now: Timestamp,
    ) -> Flow<Vec<(String, String, bool)>> {
        let mut next = self.stored.lock().await.record.health.checks.clone();
        let mut changed = false;
        let mut failing = Vec::new();
        for (c, r, v) in readings {
            let rec = CheckRecord {
                phase: phase.key().into(),
                state: state_of(v).into(),
                value: crate::releaseset::excerpt(&r.value, 300),
                read: crate::releaseset::excerpt(&r.read, 600),
                since: now.rfc3339(),
                passing_since: since
                    .get(&c.name)
                    .and_then(|r| r.passing_since)
                    .map(Timestamp::rfc3339),
                errors: since.get(&c.name).map_or(0, |r| r.errors),
            };
            match next.get(&c.name) {
                Some(old)
                    if old.phase == rec.phase
                        && old.state == rec.state
                        && old.value == rec.value
                        && old.passing_since == rec.passing_since
                        && old.errors == rec.errors => {}
                old => {
                    if rec.state == "failing" && old.is_none_or(|o| o.state != "failing") {
                        failing.push((c.name.clone(), rec.value.clone(), true));
                    }
                    if rec.state == "holds" && old.is_some_and(|o| o.state == "failing") {
                        failing.push((c.name.clone(), rec.value.clone(), false));
                    }
                    next.insert(c.name.clone(), rec);
                    changed = true;
                }
            }
        }
        if changed {
            let lines = next
                .iter()
                .map(|(name, c)| crate::forge::comment::CheckLine {
                    name: name.clone(),
                    gate: c.phase.clone(),
                    state: c.state.clone(),
                    value: c.value.clone(),
                })
                .collect();
            self.write(stage, |r| r.health.checks = next).await?;
            self.say(Progress::HealthChecks(lines));
        }
        Ok(failing)
    }
}
