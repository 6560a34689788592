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

/// Ask Prometheus at `base` (e.g. `http://prometheus.monitoring.svc:9090`) for `query`,
/// with `credential`'s token only when the request's URL is inside its binding. An `Err`
/// says why there is no answer (unreachable, timed out, too large); an answer with an error
/// document is an `Ok` for the caller to judge. A redirect is an answer, never followed
/// (the client follows none), so no token crosses to another origin.
pub async fn query(
    base: &str,
    query: &str,
    credential: Option<&Credential>,
    timeout: Duration,
) -> Result<Answer, String> {
    let url = format!(
        "{}/api/v1/query?query={}",
        base.trim_end_matches('/'),
        encode(query)
    );
    let mut req = hyper::Request::get(url.as_str()).header("accept", "application/json");
    match credential.map(|c| c.token_for(&url)) {
        Some(Ok(t)) => req = req.header("authorization", format!("Bearer {}", t.expose())),
        Some(Err(why)) => tracing::debug!(base, "no credential sent: {why}"),
        None => {}
    }
    let req = req
        .body(Body::empty())
        .map_err(|e| format!("cannot build the request to {base}: {e}"))?;
    crate::outbound::call(req, timeout, MAX_ANSWER_BYTES)
        .await
        .map_err(|why| format!("Prometheus at {base} did not answer: {why}"))
}

/// Ask Alertmanager at `base` for the active alerts matching every one of `matchers`,
/// leaving out the inhibited ones and, unless `include_silenced`, the silenced ones
/// (`GET /api/v2/alerts`, prometheus/alertmanager `api/v2/openapi.yaml` `getAlerts`: one
/// `filter` parameter per matcher). No credential goes with it.
pub async fn alerts(
    base: &str,
    matchers: &[String],
    include_silenced: bool,
    timeout: Duration,
) -> Result<Answer, String> {
    let mut url = format!(
        "{}/api/v2/alerts?active=true&inhibited=false&silenced={include_silenced}",
        base.trim_end_matches('/')
    );
    for m in matchers {
        url.push_str("&filter=");
        url.push_str(&encode(m));
    }
    let req = hyper::Request::get(url.as_str())
        .header("accept", "application/json")
        .body(Body::empty())
        .map_err(|e| format!("cannot build the request to {base}: {e}"))?;
    crate::outbound::call(req, timeout, MAX_ANSWER_BYTES)
        .await
        .map_err(|why| format!("Alertmanager at {base} did not answer: {why}"))
}

/// A bearer token bound to the URL it belongs to (`clusters[].prometheus: {url, tokenFile}`
/// in the controller's config, or `--prometheus-url` with `--prometheus-token-file`). A
/// check names its own URL in cluster.yaml, which a pull request can write: the token goes
/// only to the bound origin under the bound path, and never over plain http off loopback.
#[derive(Debug, Clone)]
pub struct Credential {
    url: String,
    bound: Target,
    token: Secret,
}

/// Where a request goes: what decides whom a credential reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    scheme: String,
    host: String,
    port: u16,
    path: String,
}

/// The target of `url`, when a credential may ever go there: http(s), no userinfo, and
/// plain http only to a loopback host (anyone on the path reads an http header).
fn target(url: &str) -> Result<Target, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`{}` is not a URL: {e}", crate::escape::clip(url, 80)))?;
    let scheme = uri.scheme_str().unwrap_or("").to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        _ => return Err("a credential goes only over http(s)".into()),
    };
    let authority = uri.authority().ok_or("the URL names no host")?;
    if authority.as_str().contains('@') {
        return Err("the URL carries userinfo".into());
    }
    let host = authority.host().to_ascii_lowercase();
    if scheme == "http" && !is_loopback(&host) {
        return Err(format!(
            "plain http to `{host}`, which is not loopback: a bearer token goes only over https there"
        ));
    }
    Ok(Target {
        scheme,
        host,
        port: authority.port_u16().unwrap_or(default_port),
        path: uri.path().trim_end_matches('/').to_string(),
    })
}

/// `localhost` or a loopback address (127.0.0.0/8, ::1).
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Credential {
    /// Bind `token` to `url`; refused when no credential may go to `url` at all.
    pub fn new(url: &str, token: Secret) -> Result<Credential, String> {
        Ok(Credential {
            url: url.to_string(),
            bound: target(url)?,
            token,
        })
    }

    /// The URL the token is bound to (not secret).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The token for a request to `url`, or why it is withheld: another scheme, host or
    /// port, a path outside the bound one, or plain http off loopback.
    pub fn token_for(&self, url: &str) -> Result<&Secret, String> {
        let t = target(url)?;
        let same_origin = (t.scheme.as_str(), t.host.as_str(), t.port)
            == (
                self.bound.scheme.as_str(),
                self.bound.host.as_str(),
                self.bound.port,
            );
        let under =
            t.path == self.bound.path || t.path.starts_with(&format!("{}/", self.bound.path));
        if same_origin && under && !t.path.split('/').any(|s| s == "..") {
            Ok(&self.token)
        } else {
            Err(format!(
                "outside the URL the credential is bound to ({})",
                self.url
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(url: &str) -> Credential {
        Credential::new(url, Secret::new("t")).expect("a valid binding")
    }

    #[test]
    fn a_token_goes_only_to_its_origin_under_its_path() {
        let c = bound("https://prom.example:9090/prometheus/");
        assert!(c
            .token_for("https://PROM.example:9090/prometheus/api/v1/query?query=up")
            .is_ok());
        for other in [
            "https://prom.example:9091/prometheus/api/v1/query",
            "https://evil.example:9090/prometheus/api/v1/query",
            "https://prom.example.evil.example:9090/prometheus/api/v1/query",
            "http://prom.example:9090/prometheus/api/v1/query",
            "https://prom.example:9090/prometheus-other/api/v1/query",
            "https://prom.example:9090/prometheus/../admin",
            "https://me@prom.example:9090/prometheus/api/v1/query",
            "prom.example:9090/prometheus",
        ] {
            assert!(c.token_for(other).is_err(), "{other}");
        }
        // The default port is the scheme's.
        assert!(bound("https://prom.example")
            .token_for("https://prom.example:443/api/v1/query")
            .is_ok());
    }

    #[test]
    fn plain_http_carries_a_token_only_on_loopback() {
        for ok in [
            "http://127.0.0.1:9090",
            "http://127.0.0.2:9090",
            "http://localhost",
            "http://[::1]:9090",
        ] {
            assert!(Credential::new(ok, Secret::new("t")).is_ok(), "{ok}");
        }
        for refused in [
            "http://prom.monitoring.svc:9090",
            "http://localhost.evil.example",
            "http://10.0.0.1",
            "ftp://127.0.0.1",
        ] {
            assert!(
                Credential::new(refused, Secret::new("t")).is_err(),
                "{refused}"
            );
        }
    }
}
