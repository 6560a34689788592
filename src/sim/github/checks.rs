//! Check runs as GitHub's Checks API keeps them (github/rest-api-description,
//! descriptions/api.github.com/api.github.com.2022-11-28.yaml, operations `checks/create`,
//! `checks/update`, `checks/list-for-ref`): only a GitHub App creates or updates one, and
//! only the App that created a run may change it; `output.title`, `summary` and `text` are
//! each at most 65,535 bytes (GitHub measures bytes: its 422 says "summary exceeds a
//! maximum bytesize of 65535", github/docs#35252); at most 50 annotations per request,
//! appended on every update; a conclusion completes the run; a suite (one App, one head)
//! keeps at most 1,000 runs of a name, deleting the oldest. Pure rules and data here; the
//! routes are in `api.rs`.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::clock::Timestamp;

/// GitHub's cap on `output.title`, `output.summary` and `output.text`, in bytes.
pub const MAX_OUTPUT_BYTES: usize = 65_535;
/// Annotations one request may carry.
pub const MAX_ANNOTATIONS_PER_REQUEST: usize = 50;
/// Runs of one name a suite keeps; older ones are deleted.
pub const MAX_RUNS_PER_NAME: usize = 1000;

/// The 403 GitHub answers a caller that is not a GitHub App (a personal access token).
pub const APP_ONLY: &str = "You must authenticate via a GitHub App.";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annotation {
    pub path: String,
    pub start_line: u64,
    pub end_line: u64,
    pub level: String,
    pub message: String,
    pub title: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckRun {
    pub id: u64,
    pub app_id: u64,
    pub app_slug: String,
    pub head_sha: String,
    pub name: String,
    /// queued, in_progress or completed.
    pub status: String,
    pub conclusion: Option<String>,
    pub title: Option<String>,
    pub summary: Option<String>,
    pub text: Option<String>,
    pub annotations: Vec<Annotation>,
    pub details_url: Option<String>,
    pub external_id: Option<String>,
    pub started_at: Timestamp,
    pub completed_at: Option<Timestamp>,
}

/// The body of `POST …/check-runs` and `PATCH …/check-runs/{id}` (name and head_sha only
/// on create).
#[derive(Deserialize, Default)]
pub struct CheckRunRequest {
    pub name: Option<String>,
    pub head_sha: Option<String>,
    pub status: Option<String>,
    pub conclusion: Option<String>,
    pub details_url: Option<String>,
    pub external_id: Option<String>,
    pub output: Option<OutputRequest>,
}

#[derive(Deserialize, Default)]
pub struct OutputRequest {
    pub title: Option<String>,
    pub summary: Option<String>,
    pub text: Option<String>,
    #[serde(default)]
    pub annotations: Vec<AnnotationRequest>,
}

#[derive(Deserialize)]
pub struct AnnotationRequest {
    pub path: Option<String>,
    pub start_line: Option<u64>,
    pub end_line: Option<u64>,
    pub annotation_level: Option<String>,
    pub message: Option<String>,
    pub title: Option<String>,
}

/// A refusal: the 422's `field`, `code` and `message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub code: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, code: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        field,
        code,
        message: message.into(),
    }
}

const STATUSES: [&str; 3] = ["queued", "in_progress", "completed"];
const CONCLUSIONS: [&str; 8] = [
    "action_required",
    "cancelled",
    "failure",
    "neutral",
    "success",
    "skipped",
    "stale",
    "timed_out",
];
const LEVELS: [&str; 3] = ["notice", "warning", "failure"];

/// Apply a create or update request to `run` (a fresh run on create), as GitHub does:
/// a conclusion completes the run, `completed` needs a conclusion, the output's fields are
/// checked for size, annotations are appended.
pub fn apply(run: &mut CheckRun, req: &CheckRunRequest, now: Timestamp) -> Result<(), Invalid> {
    if let Some(s) = &req.status {
        if !STATUSES.contains(&s.as_str()) {
            return Err(invalid(
                "status",
                "invalid",
                format!("status is not included in the list (got {s:?})"),
            ));
        }
    }
    if let Some(c) = &req.conclusion {
        if !CONCLUSIONS.contains(&c.as_str()) {
            return Err(invalid(
                "conclusion",
                "invalid",
                format!("conclusion is not included in the list (got {c:?})"),
            ));
        }
    }
    // "Providing conclusion will automatically set the status parameter to completed";
    // "Required if you provide … a status of completed".
    let status = match (&req.conclusion, &req.status) {
        (Some(_), _) => "completed".to_string(),
        (None, Some(s)) if s == "completed" && run.conclusion.is_none() => {
            return Err(invalid(
                "conclusion",
                "missing_field",
                "conclusion is required when status is completed",
            ))
        }
        (None, Some(s)) => s.clone(),
        (None, None) => run.status.clone(),
    };
    let mut annotations = Vec::new();
    if let Some(o) = &req.output {
        let (Some(title), Some(summary)) = (&o.title, &o.summary) else {
            return Err(invalid(
                "output",
                "missing_field",
                "output needs a title and a summary",
            ));
        };
        for (field, value) in [
            ("title", Some(title)),
            ("summary", Some(summary)),
            ("text", o.text.as_ref()),
        ] {
            if value.is_some_and(|v| v.len() > MAX_OUTPUT_BYTES) {
                return Err(invalid(
                    field,
                    "custom",
                    format!("{field} exceeds a maximum bytesize of {MAX_OUTPUT_BYTES}"),
                ));
            }
        }
        if o.annotations.len() > MAX_ANNOTATIONS_PER_REQUEST {
            return Err(invalid(
                "annotations",
                "custom",
                format!(
                    "at most {MAX_ANNOTATIONS_PER_REQUEST} annotations per request ({} sent)",
                    o.annotations.len()
                ),
            ));
        }
        for a in &o.annotations {
            let (Some(path), Some(start), Some(end), Some(level), Some(message)) = (
                &a.path,
                a.start_line,
                a.end_line,
                &a.annotation_level,
                &a.message,
            ) else {
                return Err(invalid(
                    "annotations",
                    "missing_field",
                    "an annotation needs path, start_line, end_line, annotation_level and message",
                ));
            };
            if !LEVELS.contains(&level.as_str()) || start == 0 || end < start {
                return Err(invalid(
                    "annotations",
                    "invalid",
                    "annotation_level is one of notice, warning, failure; lines start at 1",
                ));
            }
            annotations.push(Annotation {
                path: path.clone(),
                start_line: start,
                end_line: end,
                level: level.clone(),
                message: message.clone(),
                title: a.title.clone(),
            });
        }
        run.title = Some(title.clone());
        run.summary = Some(summary.clone());
        if o.text.is_some() {
            run.text = o.text.clone();
        }
    }
    run.annotations.extend(annotations);
    if req.conclusion.is_some() {
        run.conclusion = req.conclusion.clone();
    }
    if status != "completed" {
        // A run put back in progress has no conclusion.
        run.conclusion = None;
        run.completed_at = None;
    } else if run.completed_at.is_none() || req.conclusion.is_some() {
        run.completed_at = Some(now);
    }
    run.status = status;
    if req.details_url.is_some() {
        run.details_url = req.details_url.clone();
    }
    if req.external_id.is_some() {
        run.external_id = req.external_id.clone();
    }
    Ok(())
}

/// A suite keeps the newest [`MAX_RUNS_PER_NAME`] runs of a name: older ones go.
pub fn prune(runs: &mut Vec<CheckRun>, app_id: u64, head_sha: &str, name: &str) {
    let same = |r: &CheckRun| r.app_id == app_id && r.head_sha == head_sha && r.name == name;
    let count = runs.iter().filter(|r| same(r)).count();
    let mut excess = count.saturating_sub(MAX_RUNS_PER_NAME);
    runs.retain(|r| {
        if excess > 0 && same(r) {
            excess -= 1;
            return false;
        }
        true
    });
}

/// `filter=latest` (the default): the newest run of each (App, name); `all`: every run.
/// Newest first either way.
pub fn for_ref<'a>(
    runs: &'a [CheckRun],
    sha: &str,
    check_name: Option<&str>,
    app_id: Option<u64>,
    latest: bool,
) -> Vec<&'a CheckRun> {
    let mut out: Vec<&CheckRun> = Vec::new();
    for r in runs.iter().rev() {
        if r.head_sha != sha
            || check_name.is_some_and(|n| n != r.name)
            || app_id.is_some_and(|a| a != r.app_id)
        {
            continue;
        }
        if latest && out.iter().any(|o| o.app_id == r.app_id && o.name == r.name) {
            continue;
        }
        out.push(r);
    }
    out
}

pub fn json(base: &str, repo: &str, run: &CheckRun) -> Value {
    let url = format!("{base}/repos/{repo}/check-runs/{}", run.id);
    json!({
        "id": run.id,
        "node_id": super::json::node_id("CR", run.id),
        "head_sha": run.head_sha,
        "external_id": run.external_id.clone().unwrap_or_default(),
        "url": url,
        "html_url": format!("https://github.com/{repo}/runs/{}", run.id),
        "details_url": run.details_url,
        "status": run.status,
        "conclusion": run.conclusion,
        "started_at": run.started_at.rfc3339(),
        "completed_at": run.completed_at.map(|t| t.rfc3339()),
        "output": {
            "title": run.title,
            "summary": run.summary,
            "text": run.text,
            "annotations_count": run.annotations.len(),
            "annotations_url": format!("{url}/annotations"),
        },
        "name": run.name,
        "check_suite": { "id": run.app_id * 1_000 + 1 },
        "app": { "id": run.app_id, "slug": run.app_slug, "name": run.app_slug },
        "pull_requests": [],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> CheckRun {
        CheckRun {
            id: 1,
            app_id: 7,
            app_slug: "ichor".into(),
            head_sha: "a".repeat(40),
            name: "ichor/gate".into(),
            status: "queued".into(),
            conclusion: None,
            title: None,
            summary: None,
            text: None,
            annotations: vec![],
            details_url: None,
            external_id: None,
            started_at: Timestamp::from_millis(0),
            completed_at: None,
        }
    }

    fn output(summary: String, annotations: usize) -> OutputRequest {
        OutputRequest {
            title: Some("t".into()),
            summary: Some(summary),
            text: None,
            annotations: (0..annotations)
                .map(|i| AnnotationRequest {
                    path: Some("f".into()),
                    start_line: Some(i as u64 + 1),
                    end_line: Some(i as u64 + 1),
                    annotation_level: Some("failure".into()),
                    message: Some("m".into()),
                    title: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_conclusion_completes_and_completed_needs_one() {
        let now = Timestamp::from_millis(5);
        let mut run = fresh();
        let req = CheckRunRequest {
            status: Some("completed".into()),
            ..Default::default()
        };
        assert_eq!(
            apply(&mut run, &req, now).map_err(|e| e.field),
            Err("conclusion")
        );
        let req = CheckRunRequest {
            conclusion: Some("failure".into()),
            ..Default::default()
        };
        assert!(apply(&mut run, &req, now).is_ok());
        assert_eq!(
            (run.status.as_str(), run.completed_at),
            ("completed", Some(now))
        );
        let req = CheckRunRequest {
            status: Some("in_progress".into()),
            ..Default::default()
        };
        assert!(apply(&mut run, &req, now).is_ok());
        assert_eq!(run.conclusion, None);
    }

    #[test]
    fn outputs_are_bounded_in_bytes_and_annotations_appended() {
        let now = Timestamp::from_millis(5);
        let mut run = fresh();
        // 32,768 two-byte characters: fewer characters than the cap, more bytes.
        let req = CheckRunRequest {
            output: Some(output("é".repeat(32_768), 0)),
            ..Default::default()
        };
        let e = apply(&mut run, &req, now).err();
        assert_eq!(
            e.map(|e| e.message),
            Some("summary exceeds a maximum bytesize of 65535".to_string())
        );
        let req = CheckRunRequest {
            output: Some(output("s".into(), 51)),
            ..Default::default()
        };
        assert!(apply(&mut run, &req, now).is_err());
        for _ in 0..2 {
            let req = CheckRunRequest {
                output: Some(output("s".into(), 50)),
                ..Default::default()
            };
            assert!(apply(&mut run, &req, now).is_ok());
        }
        assert_eq!(run.annotations.len(), 100);
    }

    #[test]
    fn a_suite_keeps_the_newest_thousand_of_a_name() {
        let mut runs: Vec<CheckRun> = (0..1005).map(|i| CheckRun { id: i, ..fresh() }).collect();
        prune(&mut runs, 7, &"a".repeat(40), "ichor/gate");
        assert_eq!(runs.len(), 1000);
        assert_eq!(runs[0].id, 5);
        let latest = for_ref(&runs, &"a".repeat(40), Some("ichor/gate"), None, true);
        assert_eq!(latest.iter().map(|r| r.id).collect::<Vec<_>>(), [1004]);
    }
}
