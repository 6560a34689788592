//! The rollout record: the one piece of rollout state besides the lock, kept in the cluster
//! (ConfigMap `ichor-system/ichor-rollout-<cluster>`, key `record.json`) so that any ichor —
//! this process restarted, another replica, `ichor status` — sees the same thing. It holds
//! what cannot be observed: the target, the stage, each step's start marker (so deadlines
//! survive restarts), why it paused, and a bounded history. Everything else is re-observed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::gate::live::{lock_name, ICHOR_NAMESPACE};
use crate::kube::{KubeClient, KubeError};

pub const RECORD_KEY: &str = "record.json";
pub const RECORD_KIND: &str = "RolloutRecord";
/// History lines kept; older ones are dropped first.
pub const MAX_HISTORY: usize = 300;
/// Earlier rollouts remembered in `previous`.
pub const MAX_PREVIOUS: usize = 10;
/// The record is refused above this size when read (a ConfigMap holds at most 1 MiB).
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// Where the record lives: the lock's name, as a ConfigMap.
pub fn record_name(cluster: &str) -> String {
    lock_name(cluster)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    Running,
    Paused,
    Completed,
}

impl std::fmt::Display for RecordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecordState::Running => "running",
            RecordState::Paused => "paused",
            RecordState::Completed => "completed",
        })
    }
}

/// What the rollout carries the cluster to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// The commit of the GitOps repository whose release set this is.
    pub commit: String,
    pub talos: String,
    pub kubernetes: String,
}

/// A step's start marker (see [`super::step::StepMarker`]), as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id_before: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upgrade_requested: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pre_pulled: bool,
    /// The boot the target was installed ahead on (Talos ≥ 1.13): the node boots the
    /// target at its next reboot, so its step only reboots it from this boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_boot: Option<String>,
    /// The boot an install was sent on, before the call: one install per boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_sent_boot: Option<String>,
    /// Volumes with a replica on the node when the step began.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Fields a newer ichor wrote, kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The health checks as the rollout last read them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthRecord {
    /// The gate being waited at, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<HealthGate>,
    /// Each check's last state, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checks: BTreeMap<String, CheckRecord>,
    /// How many `between` gates this rollout has passed: a restarted engine going through
    /// the steps already done does not judge their gates again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub between_passed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl HealthRecord {
    pub fn is_empty(&self) -> bool {
        self.gate.is_none() && self.checks.is_empty() && self.between_passed == 0
    }
}

/// One gate: which (`before`, `between/talos/2`, `after`), where, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthGate {
    pub key: String,
    pub phase: String,
    /// Where in the rollout, in words (`after w-1`).
    pub at: String,
    pub started_at: String,
}

/// One check's last reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckRecord {
    /// The gate it was read at: before, between, after.
    pub phase: String,
    /// holds, settling (passing, not yet for stableFor) or failing.
    pub state: String,
    pub value: String,
    #[serde(default)]
    pub read: String,
    /// Since when it has been in this state.
    pub since: String,
    /// Since when it has passed without a break (what `stableFor` counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passing_since: Option<String>,
    /// Readings in a row that could not judge (what `errorLimit` counts).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub errors: u32,
}

/// Why the rollout stopped for a human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pause {
    pub stage: String,
    /// The step and node, when one node is the cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What was observed, for how long, and what would unblock it.
    pub reason: String,
    pub since: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageTime {
    pub stage: String,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub at: String,
    pub message: String,
}

/// The live ETA as the record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordEta {
    /// Nodes (or syncs) done, and in all.
    pub done: usize,
    pub total: usize,
    /// RFC 3339; with maintenance windows, counting only the time they let it work.
    pub ends_at: String,
    /// RFC 3339: when the next maintenance window opens, while none is open and a step
    /// waits for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window_at: Option<String>,
    /// The maintenance windows the rest needs (absent without windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<usize>,
}

impl RecordEta {
    pub fn of(e: &crate::plan::eta::Estimate) -> RecordEta {
        RecordEta {
            done: e.done,
            total: e.total,
            ends_at: e.end.rfc3339(),
            next_window_at: e.next_window.map(|t| t.rfc3339()),
            windows: (e.windows > 0 || e.next_window.is_some()).then_some(e.windows),
        }
    }
}

/// An earlier rollout, in one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Previous {
    pub target: TargetRef,
    pub state: RecordState,
    pub started_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutRecord {
    pub api_version: String,
    pub kind: String,
    pub cluster: String,
    pub target: TargetRef,
    pub state: RecordState,
    /// The stage running (or paused in); `None` before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    pub started_at: String,
    pub updated_at: String,
    /// Who last wrote it (the lock holder).
    pub holder: String,
    /// What the rollout waits on right now (a window, a hold, the CNI), when it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Pause>,
    /// Start markers by step key (`talos/cp-1`, `kubelet/w-3`, `apiserver/cp-2`).
    #[serde(default)]
    pub steps: BTreeMap<String, StepRecord>,
    #[serde(default)]
    pub stages: Vec<StageTime>,
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    #[serde(default)]
    pub previous: Vec<Previous>,
    /// The health checks' last readings and the gate waited at (`spec.healthChecks`).
    #[serde(default, skip_serializing_if = "HealthRecord::is_empty")]
    pub health: HealthRecord,
    /// While running: how far the rollout is and when it should end (the live ETA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<RecordEta>,
    /// Fields a newer ichor wrote, kept as they are: an older ichor resuming its rollout
    /// must not drop what the newer one will need.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl RolloutRecord {
    pub fn new(cluster: &str, target: TargetRef, holder: &str, now: Timestamp) -> Self {
        RolloutRecord {
            api_version: crate::gate::REPORT_API_VERSION.into(),
            kind: RECORD_KIND.into(),
            cluster: cluster.into(),
            target,
            state: RecordState::Running,
            stage: None,
            started_at: now.rfc3339(),
            updated_at: now.rfc3339(),
            holder: holder.into(),
            waiting: None,
            pause: None,
            steps: BTreeMap::new(),
            stages: Vec::new(),
            history: Vec::new(),
            previous: Vec::new(),
            health: HealthRecord::default(),
            eta: None,
            extra: BTreeMap::new(),
        }
    }

    /// A new rollout replacing this record: the old one becomes a line of `previous`.
    pub fn succeed(self, target: TargetRef, holder: &str, now: Timestamp) -> Self {
        let mut next = RolloutRecord::new(&self.cluster, target, holder, now);
        next.previous = self.previous;
        next.previous.insert(
            0,
            Previous {
                target: self.target,
                state: self.state,
                started_at: self.started_at,
                updated_at: self.updated_at,
            },
        );
        next.previous.truncate(MAX_PREVIOUS);
        next
    }

    pub fn log(&mut self, now: Timestamp, message: impl Into<String>) {
        self.history.push(HistoryEntry {
            at: now.rfc3339(),
            message: message.into(),
        });
        if self.history.len() > MAX_HISTORY {
            let drop = self.history.len() - MAX_HISTORY;
            self.history.drain(..drop);
        }
    }

    pub fn enter_stage(&mut self, stage: &str, now: Timestamp) {
        self.stage = Some(stage.to_string());
        if !self.stages.iter().any(|s| s.stage == stage) {
            self.stages.push(StageTime {
                stage: stage.to_string(),
                started_at: now.rfc3339(),
                finished_at: None,
            });
        }
    }

    pub fn finish_stage(&mut self, stage: &str, now: Timestamp) {
        if let Some(s) = self.stages.iter_mut().find(|s| s.stage == stage) {
            if s.finished_at.is_none() {
                s.finished_at = Some(now.rfc3339());
            }
        }
    }

    /// Seconds each finished stage took, in order.
    pub fn stage_secs(&self) -> Vec<(String, u64)> {
        self.stages
            .iter()
            .filter_map(|s| {
                let a = Timestamp::parse_rfc3339(&s.started_at)?;
                let b = Timestamp::parse_rfc3339(s.finished_at.as_deref()?)?;
                Some((s.stage.clone(), b.since(a).as_secs()))
            })
            .collect()
    }

    /// A few lines for `ichor status`.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "Rollout to {} (Talos {}, Kubernetes {}): {}",
            short(&self.target.commit),
            self.target.talos,
            self.target.kubernetes,
            self.state
        );
        if let Some(stage) = &self.stage {
            out.push_str(&format!(", stage {stage}"));
        }
        out.push_str(&format!(
            "\n  started {}, last update {} by {}\n",
            self.started_at, self.updated_at, self.holder
        ));
        if let Some(e) = &self.eta {
            out.push_str(&format!(
                "  {}/{} done, ends ≈ {}",
                e.done, e.total, e.ends_at
            ));
            if let Some(n) = e.windows {
                out.push_str(&format!(
                    ", counting maintenance-window time only ({} to go)",
                    crate::plan::count(n, "window")
                ));
            }
            out.push('\n');
            // Only the engine's own timestamp, re-read: nothing to escape.
            if let Some(t) = e
                .next_window_at
                .as_deref()
                .and_then(crate::clock::Timestamp::parse_rfc3339)
            {
                out.push_str(&format!(
                    "  next maintenance window opens {}\n",
                    crate::plan::window::describe(t)
                ));
            }
        }
        if let Some(w) = &self.waiting {
            out.push_str(&format!("  waiting: {}\n", crate::escape::terminal(w)));
        }
        if let Some(p) = &self.pause {
            out.push_str(&format!(
                "  paused since {} in {}{}: {}\n  resume with `ichor rollout --resume --rev {}` once that is fixed (a fix in cluster.yaml: --rev at the commit that carries it)\n",
                p.since,
                p.stage,
                p.node.as_deref().map(|n| format!(" at {n}")).unwrap_or_default(),
                crate::escape::terminal(&p.reason),
                crate::escape::terminal(&self.target.commit.chars().take(12).collect::<String>())
            ));
        }
        for (name, c) in &self.health.checks {
            out.push_str(&format!(
                "  health check {name} ({}): {}, last value {}\n",
                c.phase,
                c.state,
                crate::escape::terminal(&c.value)
            ));
        }
        for (stage, secs) in self.stage_secs() {
            out.push_str(&format!(
                "  {stage}: {}\n",
                crate::releaseset::HumanDuration::from_secs(secs)
            ));
        }
        for h in self.history.iter().rev().take(5).rev() {
            out.push_str(&format!(
                "  {}  {}\n",
                h.at,
                crate::escape::terminal(&h.message)
            ));
        }
        out
    }
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("the rollout record {ICHOR_NAMESPACE}/{name} is not readable ({why}); ichor will not guess where a rollout stands: inspect it with `kubectl -n {ICHOR_NAMESPACE} get configmap {name} -o yaml`, and delete it to start afresh")]
    Unreadable { name: String, why: String },
    /// Another engine wrote the record since this one read it.
    #[error("the rollout record was written by {holder} since this engine read it")]
    Taken { holder: String },
}

/// The record as stored, with the ConfigMap's resourceVersion for the next write.
#[derive(Debug, Clone)]
pub struct Stored {
    pub record: RolloutRecord,
    pub resource_version: Option<String>,
}

/// Read the cluster's record; `None` when there is none.
pub async fn load(kube: &KubeClient, cluster: &str) -> Result<Option<Stored>, RecordError> {
    let name = record_name(cluster);
    let Some(cm) = kube.config_map(ICHOR_NAMESPACE, &name).await? else {
        return Ok(None);
    };
    let unreadable = |why: String| RecordError::Unreadable {
        name: name.clone(),
        why,
    };
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(RECORD_KEY))
        .ok_or_else(|| unreadable(format!("no {RECORD_KEY} key")))?;
    if text.len() > MAX_RECORD_BYTES {
        return Err(unreadable(format!("{} bytes", text.len())));
    }
    // The apiVersion first: a record from a newer ichor may not parse as this one's.
    let version = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| {
            v.get("apiVersion")
                .and_then(|a| a.as_str())
                .map(str::to_string)
        });
    if let Some(v) = version.filter(|v| v != crate::gate::REPORT_API_VERSION) {
        return Err(unreadable(format!(
            "apiVersion {} is not this ichor's ({}): a newer ichor wrote it; run that version (or newer) to continue the rollout",
            crate::releaseset::excerpt(&v, 40),
            crate::gate::REPORT_API_VERSION
        )));
    }
    let record: RolloutRecord = serde_json::from_str(text)
        .map_err(|e| unreadable(crate::releaseset::excerpt(&e.to_string(), 200)))?;
    if record.kind != RECORD_KIND || record.cluster != cluster {
        return Err(unreadable(format!(
            "kind {} for cluster {}, expected {RECORD_KIND} for {cluster}",
            crate::releaseset::excerpt(&record.kind, 40),
            crate::releaseset::excerpt(&record.cluster, 80)
        )));
    }
    Ok(Some(Stored {
        record,
        resource_version: cm.metadata.resource_version,
    }))
}

/// Shrink the record to well inside a ConfigMap, whatever the cluster's size, shedding what
/// matters least first: history (oldest half at a time), then the detail of finished steps
/// (a finished step needs only its times), then the earlier rollouts. Unfinished steps are
/// never shed: they are what a restart resumes from. Returns the record as JSON.
pub fn fit(record: &mut RolloutRecord) -> String {
    let size = |r: &RolloutRecord| serde_json::to_string(r).unwrap_or_default();
    let mut text = size(record);
    let small = |t: &str| t.len() <= MAX_RECORD_BYTES / 2;
    while !small(&text) && !record.history.is_empty() {
        let half = record.history.len().div_ceil(2);
        record.history.drain(..half);
        text = size(record);
    }
    if !small(&text) {
        for step in record
            .steps
            .values_mut()
            .filter(|s| s.finished_at.is_some())
        {
            step.boot_id_before = None;
            step.volumes.clear();
        }
        text = size(record);
    }
    if !small(&text) {
        record.previous.clear();
        text = size(record);
    }
    text
}

/// Write the record, over the resourceVersion it was read at. A conflict is re-read and
/// judged: written by another holder, another engine took the rollout over (a lease that
/// lapsed), so nothing is overwritten and the caller stops ([`RecordError::Taken`]); by
/// this holder (a hand edit, a write whose answer was lost), written again over it, once.
pub async fn save(kube: &KubeClient, stored: &mut Stored) -> Result<(), RecordError> {
    let name = record_name(&stored.record.cluster);
    let mut text = serde_json::to_string(&stored.record).map_err(|e| RecordError::Unreadable {
        name: name.clone(),
        why: e.to_string(),
    })?;
    if text.len() > MAX_RECORD_BYTES / 2 {
        text = fit(&mut stored.record);
    }
    let cm = |rv: Option<String>| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ICHOR_NAMESPACE.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "ichor".to_string(),
                )]
                .into(),
            ),
            resource_version: rv,
            ..Default::default()
        },
        data: Some([(RECORD_KEY.to_string(), text.clone())].into()),
        ..Default::default()
    };
    let written = match kube
        .put_config_map(&cm(stored.resource_version.clone()))
        .await
    {
        Ok(w) => w,
        Err(e) if e.is_conflict() => {
            let current = match load(kube, &stored.record.cluster).await {
                Ok(Some(now)) if now.record.holder != stored.record.holder => {
                    return Err(RecordError::Taken {
                        holder: now.record.holder,
                    })
                }
                Ok(Some(now)) => now.resource_version,
                // Deleted meanwhile: created afresh. Unreadable: the version alone, as the
                // record written is this engine's own.
                Ok(None) => None,
                Err(RecordError::Unreadable { .. }) => kube
                    .config_map(ICHOR_NAMESPACE, &name)
                    .await?
                    .and_then(|c| c.metadata.resource_version),
                Err(e) => return Err(e),
            };
            kube.put_config_map(&cm(current)).await?
        }
        Err(e) => return Err(e.into()),
    };
    stored.resource_version = written.metadata.resource_version;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(c: &str) -> TargetRef {
        TargetRef {
            commit: c.into(),
            talos: "v1.12.6".into(),
            kubernetes: "v1.34.1".into(),
        }
    }

    #[test]
    fn history_is_bounded_and_keeps_the_newest() {
        let mut r = RolloutRecord::new("home", target("a"), "me", Timestamp(0));
        for i in 0..(MAX_HISTORY + 20) {
            r.log(Timestamp(i as u64 * 1000), format!("line {i}"));
        }
        assert_eq!(r.history.len(), MAX_HISTORY);
        assert_eq!(
            r.history.last().map(|h| h.message.as_str()),
            Some(format!("line {}", MAX_HISTORY + 19).as_str())
        );
    }

    #[test]
    fn a_new_target_keeps_the_old_rollout_as_a_line() {
        let mut r = RolloutRecord::new("home", target("a"), "me", Timestamp(0));
        r.state = RecordState::Completed;
        let mut next = r.succeed(target("b"), "me", Timestamp(5000));
        assert_eq!(next.previous.len(), 1);
        assert_eq!(next.previous[0].target.commit, "a");
        assert_eq!(next.state, RecordState::Running);
        for i in 0..20 {
            next = next.succeed(target(&format!("c{i}")), "me", Timestamp(9000));
        }
        assert_eq!(next.previous.len(), MAX_PREVIOUS);
    }

    /// Issue 43 F11: the hint a paused record prints is a command that runs as printed.
    #[test]
    fn a_pause_names_a_resume_command_that_runs() {
        let mut r = RolloutRecord::new(
            "home",
            target("3f2a9c01d4e5b6a7c8d9e0f1a2b3c4d5e6f7a8b9"),
            "me",
            Timestamp(0),
        );
        r.state = RecordState::Paused;
        r.pause = Some(Pause {
            stage: "kubelet".into(),
            node: Some("w-1".into()),
            reason: "the drain waited".into(),
            since: Timestamp(0).rfc3339(),
        });
        let text = r.render_text();
        assert!(
            text.contains("`ichor rollout --resume --rev 3f2a9c01d4e5`"),
            "{text}"
        );
    }

    #[test]
    fn stage_durations_come_from_the_stored_times() {
        let mut r = RolloutRecord::new("home", target("a"), "me", Timestamp(0));
        r.enter_stage("talos", Timestamp(0));
        r.finish_stage("talos", Timestamp(90_000));
        r.enter_stage("kube-apiserver", Timestamp(90_000));
        assert_eq!(r.stage_secs(), vec![("talos".to_string(), 90)]);
        // Re-entering a stage after a restart keeps its first start.
        r.enter_stage("talos", Timestamp(200_000));
        assert_eq!(r.stages.len(), 2);
    }

    #[test]
    fn fields_a_newer_ichor_wrote_are_kept() {
        let r = RolloutRecord::new("home", target("a"), "me", Timestamp(0));
        let mut v = serde_json::to_value(&r).unwrap();
        v["drainPlan"] = serde_json::json!({"order": ["w-1"]});
        v["steps"] =
            serde_json::json!({"talos/w-1": {"startedAt": "2026-01-01T00:00:00Z", "surge": 2}});
        let back: RolloutRecord = serde_json::from_value(v).unwrap();
        let again = serde_json::to_value(&back).unwrap();
        assert_eq!(again["drainPlan"]["order"][0], "w-1");
        assert_eq!(again["steps"]["talos/w-1"]["surge"], 2);
    }

    #[test]
    fn a_record_of_any_cluster_size_fits_a_config_map() {
        let mut r = RolloutRecord::new("home", target("a"), "me", Timestamp(0));
        for i in 0..5000 {
            // A batch in flight; everything before it finished.
            let finished = i >= 5;
            r.steps.insert(
                format!("talos/node-{i:05}"),
                StepRecord {
                    started_at: Some(Timestamp(1000).rfc3339()),
                    boot_id_before: Some(format!("{:0>36}", i)),
                    volumes: (0..30).map(|v| format!("pvc-{i}-{v:0>40}")).collect(),
                    finished_at: finished.then(|| Timestamp(2000).rfc3339()),
                    ..StepRecord::default()
                },
            );
            r.log(Timestamp(i), format!("line {i}"));
        }
        assert!(serde_json::to_string(&r).unwrap().len() > MAX_RECORD_BYTES);
        let text = fit(&mut r);
        assert!(text.len() <= MAX_RECORD_BYTES / 2, "{} bytes", text.len());
        // Unfinished steps keep everything a restart resumes from.
        let open = &r.steps["talos/node-00000"];
        assert!(open.boot_id_before.is_some() && open.volumes.len() == 30);
        assert_eq!(r.steps.len(), 5000);
    }

    #[test]
    fn the_record_round_trips_through_json() {
        let mut r = RolloutRecord::new("home", target("a"), "me", Timestamp(0));
        r.steps.insert(
            "talos/cp-1".into(),
            StepRecord {
                started_at: Some(Timestamp(1000).rfc3339()),
                boot_id_before: Some("b-1".into()),
                upgrade_requested: true,
                ..StepRecord::default()
            },
        );
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"upgradeRequested\":true"));
        let back: RolloutRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }
}
