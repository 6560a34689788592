//! Reading Alertmanager's answer to `GET /api/v2/alerts` (prometheus/alertmanager
//! `api/v2/openapi.yaml`, operation `getAlerts`): a JSON array of alerts, each with its
//! `labels` and a `status` of `{state, silencedBy, inhibitedBy}`. The check passes when the
//! array is empty: no active alert matches that is not silenced (unless `includeSilenced`)
//! and not inhibited.

use serde_json::Value;

use super::Reading;
use crate::releaseset::excerpt;

/// An alert as people name it: `KubeNodeNotReady{node="w-1",severity="critical"}`.
fn shown(alert: &Value) -> String {
    let labels = alert.get("labels").and_then(Value::as_object);
    let name = labels
        .and_then(|l| l.get("alertname"))
        .and_then(Value::as_str)
        .unwrap_or("?");
    let rest: Vec<String> = labels
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "alertname")
        .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or("")))
        .collect();
    excerpt(&format!("{name}{{{}}}", rest.join(",")), 160)
}

/// Judge the answer: HTTP `status` and the `body`.
pub fn judge(status: u16, body: &[u8]) -> Reading {
    // Alertmanager refuses a matcher it cannot parse with 400 and its reason as a JSON
    // string: an error of cluster.yaml, which no waiting changes.
    if status == 400 {
        let why = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
        return Reading::failed(
            format!("Alertmanager refused the matchers: {}", excerpt(&why, 200)),
            "HTTP 400",
        );
    }
    let alerts = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(a)) if status == 200 => a,
        _ => {
            return Reading::unknown(
                format!("error: Alertmanager answered HTTP {status} with no list of alerts"),
                excerpt(String::from_utf8_lossy(body).trim(), 200),
            )
        }
    };
    if alerts.is_empty() {
        return Reading::pass("0 alerts", "no matching alert is firing");
    }
    let mut names: Vec<String> = alerts.iter().take(5).map(shown).collect();
    if alerts.len() > 5 {
        names.push(format!("… {} more", alerts.len() - 5));
    }
    let n = alerts.len();
    Reading::fail(
        format!("{n} alert{} firing", if n == 1 { "" } else { "s" }),
        names.join("; "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Outcome;

    #[test]
    fn an_empty_list_passes_and_an_alert_fails_naming_it() {
        assert!(judge(200, b"[]").passes());
        let one = br#"[{"labels":{"alertname":"KubeNodeNotReady","node":"w-1"},"status":{"state":"active","silencedBy":[],"inhibitedBy":[]}}]"#;
        let r = judge(200, one);
        assert_eq!(r.outcome, Outcome::Fail);
        assert_eq!(r.value, "1 alert firing");
        assert_eq!(r.read, "KubeNodeNotReady{node=\"w-1\"}");
        let r = judge(400, br#""bad matcher format: sev""#);
        assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
        assert!(r.value.contains("bad matcher format"), "{r:?}");
        assert_eq!(judge(502, b"<html>").outcome, Outcome::Unknown);
        assert_eq!(judge(200, b"{}").outcome, Outcome::Unknown);
    }
}
