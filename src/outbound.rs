//! The HTTP(S) client for ichor's own outbound calls — Prometheus's query API and the
//! notification webhooks: http or https with the system's roots, one request at a time
//! under the caller's timeout, the answer read up to a bound.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio_rustls::rustls;

/// The TLS configuration, built once (reading the system's roots is not free). A machine
/// without roots still reaches plain-http servers; https then fails verification, said.
fn tls() -> Result<Arc<rustls::ClientConfig>, String> {
    static TLS: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    TLS.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
            .map_err(|e| format!("no TLS configuration: {e}"))
    })
    .clone()
}

/// A client for one call; connections are not pooled across calls (they are seconds apart).
pub fn client() -> Result<Client<HttpsConnector<HttpConnector>, Body>, String> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*tls()?).clone())
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// What a server answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Send `req`, read at most `max` bytes of the answer, all within `timeout`. `Err` says why
/// there is no answer, without the request's URL (a notification URL is a secret): the
/// caller names what it called.
pub async fn call(
    req: hyper::Request<Body>,
    timeout: Duration,
    max: usize,
) -> Result<Answer, String> {
    let client = client()?;
    let call = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("no answer: {}", cause(&e)))?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
            if let Some(d) = frame.data_ref() {
                if out.len() + d.len() > max {
                    return Err(format!("the answer is larger than {max} bytes"));
                }
                out.extend_from_slice(d);
            }
        }
        Ok(Answer { status, body: out })
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("no answer within {}s", timeout.as_secs()))?
}

/// An error with its causes; hyper's own words hold no URL.
fn cause(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}
