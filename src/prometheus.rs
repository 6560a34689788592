//! The Prometheus HTTP API, as ichor's health checks use it: one instant query,
//! `GET <url>/api/v1/query?query=…`, under a timeout, with an optional bearer token (from
//! the controller's config, never from the repository; never logged). PromQL is evaluated
//! by Prometheus only; what the answer means is `crate::health::judge_prometheus`.
//!
//! http or https (the system's roots), through `crate::outbound`.

use std::time::Duration;

use axum::body::Body;

use crate::secret::Secret;

/// How long one query may take, connection included.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read; a health check needs a few samples, not a dump.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

pub use crate::outbound::Answer;

/// Percent-encoding of a query parameter (RFC 3986 unreserved characters stay).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Ask Prometheus at `base` (e.g. `http://prometheus.monitoring.svc:9090`) for `query`.
/// An `Err` says why there is no answer (unreachable, timed out, too large); an answer
/// with an error document is an `Ok` for the caller to judge.
pub async fn query(
    base: &str,
    query: &str,
    token: Option<&Secret>,
    timeout: Duration,
) -> Result<Answer, String> {
    let url = format!(
        "{}/api/v1/query?query={}",
        base.trim_end_matches('/'),
        encode(query)
    );
    let mut req = hyper::Request::get(url.as_str()).header("accept", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {}", t.expose()));
    }
    let req = req
        .body(Body::empty())
        .map_err(|e| format!("cannot build the request to {base}: {e}"))?;
    crate::outbound::call(req, timeout, MAX_ANSWER_BYTES)
        .await
        .map_err(|why| format!("Prometheus at {base} did not answer: {why}"))
}
