//! The Prometheus HTTP API, as ichor's health checks use it: one instant query,
//! `GET <url>/api/v1/query?query=…`, under a timeout, with an optional bearer token (from
//! the controller's config, never from the repository; never logged). PromQL is evaluated
//! by Prometheus only; what the answer means is `crate::health::judge_prometheus`.
//!
//! Plain http only: a Prometheus behind TLS is reached through a plain-http Service or
//! proxy for now (an https URL is refused with that said).

use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use crate::secret::Secret;

/// How long one query may take, connection included.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read; a health check needs a few samples, not a dump.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What Prometheus answered: the HTTP status and body (an error document included).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

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
    if base.starts_with("https://") {
        return Err(
            "https is not supported yet; reach Prometheus over plain http (its in-cluster Service)"
                .into(),
        );
    }
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
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let call = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("Prometheus at {base} did not answer: {}", cause(&e)))?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading Prometheus's answer: {e}"))?;
            if let Some(d) = frame.data_ref() {
                if out.len() + d.len() > MAX_ANSWER_BYTES {
                    return Err(format!(
                        "Prometheus's answer is larger than {MAX_ANSWER_BYTES} bytes; narrow the query"
                    ));
                }
                out.extend_from_slice(d);
            }
        }
        Ok(Answer { status, body: out })
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| {
        format!(
            "Prometheus at {base} did not answer within {}s",
            timeout.as_secs()
        )
    })?
}

fn cause(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn queries_are_encoded() {
        assert_eq!(
            super::encode("up{job=\"a b\"} == 1"),
            "up%7Bjob%3D%22a%20b%22%7D%20%3D%3D%201"
        );
    }
}
