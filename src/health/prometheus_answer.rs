//! Reading Prometheus's answer to an instant query (`GET /api/v1/query`): the envelope
//! `{"status": "success"|"error", "data": {"resultType", "result"}, "errorType", "error"}`
//! of its HTTP API. The query passes when the result has at least one fresh sample.
//!
//! Freshness: Prometheus stamps an instant query's samples with its own wall-clock time.
//! `maxSampleAge` compares those stamps with ichor's clock, so a Prometheus (or a proxy
//! before it) answering for a time long past, or far off ichor's clock, is not a pass.

use std::time::Duration;

use serde_json::Value;

use super::Reading;
use crate::clock::Timestamp;
use crate::releaseset::excerpt;

/// One sample of the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' labels as PromQL prints them, `{instance="a"}`.
    pub labels: String,
    pub value: String,
    /// Unix milliseconds.
    pub at_ms: u64,
}

fn sample(labels: String, pair: &Value) -> Option<Sample> {
    let ts = pair.get(0)?.as_f64()?;
    let value = pair.get(1)?.as_str()?.to_string();
    Some(Sample {
        labels,
        value,
        at_ms: (ts.max(0.0) * 1000.0) as u64,
    })
}

fn labels(metric: Option<&Value>) -> String {
    let Some(m) = metric.and_then(Value::as_object) else {
        return "{}".into();
    };
    let inner: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or("")))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// Judge the answer: HTTP `status`, the `body`, ichor's `now`, and the check's
/// `maxSampleAge`.
pub fn judge(status: u16, body: &[u8], now: Timestamp, max_age: Option<Duration>) -> Reading {
    let text = String::from_utf8_lossy(body);
    // An answer that is no API document (a proxy's error page) says nothing of the cluster.
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return Reading::unknown(
            format!("error: Prometheus answered HTTP {status} with no API document"),
            excerpt(text.trim(), 200),
        );
    };
    let field = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or("");
    if field("status") != "success" {
        let value = format!(
            "query error {}: {}",
            match field("errorType") {
                "" => "?",
                t => t,
            },
            excerpt(field("error"), 300)
        );
        // bad_data: the query does not parse, which no waiting changes. Every other type
        // (timeout, canceled, execution, unavailable, internal) is Prometheus failing to
        // answer this time.
        return if field("errorType") == "bad_data" {
            Reading::failed(value, format!("HTTP {status}"))
        } else {
            Reading::unknown(value, format!("HTTP {status}"))
        };
    }
    let data = doc.get("data");
    let kind = data
        .and_then(|d| d.get("resultType"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let result = data.and_then(|d| d.get("result"));
    let samples: Vec<Sample> = match (kind, result) {
        ("vector", Some(Value::Array(items))) => items
            .iter()
            .filter_map(|i| sample(labels(i.get("metric")), i.get("value")?))
            .collect(),
        ("scalar", Some(pair)) => sample("scalar".into(), pair).into_iter().collect(),
        _ => {
            return Reading::fail(
                format!("error: the query gave a {kind} result; a health check needs an instant vector or a scalar"),
                format!("HTTP {status}"),
            )
        }
    };
    let shown = |s: &[&Sample]| -> String {
        let mut parts: Vec<String> = s
            .iter()
            .take(5)
            .map(|s| {
                format!(
                    "{} {} at {}",
                    excerpt(&s.labels, 100),
                    s.value,
                    Timestamp::from_millis(s.at_ms).rfc3339()
                )
            })
            .collect();
        if s.len() > 5 {
            parts.push(format!("… {} more", s.len() - 5));
        }
        parts.join("; ")
    };
    let all: Vec<&Sample> = samples.iter().collect();
    if samples.is_empty() {
        return Reading::fail("0 samples", "an empty result");
    }
    // A NaN says nothing either way (Argo Rollouts judges it inconclusive, argo-rollouts#180).
    let numbers: Vec<&Sample> = samples
        .iter()
        .filter(|s| !s.value.eq_ignore_ascii_case("nan"))
        .collect();
    if numbers.is_empty() {
        return Reading::unknown(format!("{}, all NaN", plural(samples.len())), shown(&all));
    }
    let fresh: Vec<&Sample> = match max_age {
        None => numbers.clone(),
        Some(max) => numbers
            .iter()
            .copied()
            .filter(|s| now.since(Timestamp::from_millis(s.at_ms)) <= max)
            .collect(),
    };
    if fresh.is_empty() {
        let newest = samples.iter().map(|s| s.at_ms).max().unwrap_or(0);
        let age = now.since(Timestamp::from_millis(newest));
        // Stale is an answer for another time, not about now.
        return Reading::unknown(
            format!(
                "stale: the newest of {} is {}s old (maxSampleAge {}s)",
                plural(samples.len()),
                age.as_secs(),
                max_age.map_or(0, |m| m.as_secs())
            ),
            shown(&all),
        );
    }
    Reading::pass(plural(fresh.len()), shown(&fresh))
}

fn plural(n: usize) -> String {
    if n == 1 {
        "1 sample".into()
    } else {
        format!("{n} samples")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Outcome;

    const NOW_MS: u64 = 1_780_000_000_000;

    fn now() -> Timestamp {
        Timestamp::from_millis(NOW_MS)
    }

    #[test]
    fn vector_and_scalar_answers() {
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"__name__":"up","node":"w-1"}},"value":[{},"1"]}}]}}}}"#,
            NOW_MS as f64 / 1000.0 - 10.0
        );
        let r = judge(200, body.as_bytes(), now(), Some(Duration::from_secs(60)));
        assert!(r.passes(), "{r:?}");
        assert_eq!(r.value, "1 sample");
        assert!(
            r.read.contains("node=\"w-1\"") && r.read.contains(" 1 at "),
            "{r:?}"
        );
        let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(judge(200, empty.as_bytes(), now(), None).value, "0 samples");
        let scalar = format!(
            r#"{{"status":"success","data":{{"resultType":"scalar","result":[{},"3"]}}}}"#,
            NOW_MS / 1000
        );
        assert!(judge(200, scalar.as_bytes(), now(), None).passes());
    }

    #[test]
    fn stale_samples_and_errors_do_not_pass() {
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[{},"1"]}}]}}}}"#,
            NOW_MS / 1000 - 600
        );
        let r = judge(200, body.as_bytes(), now(), Some(Duration::from_secs(120)));
        assert!(!r.passes());
        assert!(
            r.value.contains("stale") && r.value.contains("600s old"),
            "{r:?}"
        );
        assert_eq!(r.outcome, Outcome::Unknown);
        let err = r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:5: parse error"}"#;
        let r = judge(400, err.as_bytes(), now(), None);
        assert!(!r.passes());
        assert!(
            r.value
                .starts_with("query error bad_data: invalid parameter"),
            "{r:?}"
        );
        assert_eq!(r.outcome, Outcome::Failed);
        let r = judge(502, b"<html>bad gateway</html>", now(), None);
        assert!(r.value.contains("HTTP 502"), "{r:?}");
        assert_eq!(r.outcome, Outcome::Unknown);
        let busy = r#"{"status":"error","errorType":"timeout","error":"query timed out"}"#;
        assert_eq!(
            judge(503, busy.as_bytes(), now(), None).outcome,
            Outcome::Unknown
        );
        let nan = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[{},"NaN"]}}]}}}}"#,
            NOW_MS / 1000
        );
        let r = judge(200, nan.as_bytes(), now(), None);
        assert_eq!(r.outcome, Outcome::Unknown, "{r:?}");
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(judge(200, matrix.as_bytes(), now(), None)
            .value
            .contains("matrix"));
    }
}
