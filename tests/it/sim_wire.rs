//! Raw clients for the twin's sockets, shared by the hardening and property tests: HTTP/1.1
//! requests with arbitrary bytes as the body (over TLS for the Kubernetes side), and a Talos
//! gRPC channel from the talosconfig the twin wrote.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_rustls::rustls;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;
pub type Error = Box<dyn std::error::Error>;

/// One endpoint, with its token.
pub struct Wire {
    pub addr: SocketAddr,
    token: String,
    tls: Option<tokio_rustls::TlsConnector>,
}

pub struct Reply {
    pub code: u16,
    /// The body as JSON (`Null` when it is not JSON).
    pub body: Value,
    pub text: String,
}

impl Wire {
    /// The twin's Kubernetes API (HTTPS, trusting its CA).
    pub fn kube(t: &ichor::sim::kube::KubeTwin) -> Result<Wire, Error> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut t.ca_pem.as_bytes()) {
            roots.add(cert?)?;
        }
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Wire {
            addr: t.addr,
            token: t.token().to_string(),
            tls: Some(tokio_rustls::TlsConnector::from(Arc::new(cfg))),
        })
    }

    /// The GitHub emulator (plain HTTP).
    pub fn github(g: &ichor::sim::github::GithubTwin) -> Wire {
        Wire {
            addr: g.addr(),
            token: g.token().to_string(),
            tls: None,
        }
    }

    /// A TLS connection to the Kubernetes API that sends nothing yet.
    pub async fn tls_connect(
        &self,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Error> {
        let tls = self.tls.as_ref().ok_or("not a TLS endpoint")?;
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
        Ok(tls.connect(name, tcp).await?)
    }

    /// One request on a fresh connection.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Reply, Error> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("user-agent", "ichor-tests")
            .header("authorization", format!("Bearer {}", self.token));
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let req = req.body(Full::new(Bytes::from(body)))?;
        let resp = match &self.tls {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
                let stream = tls.connect(name, tcp).await?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(conn);
                sender.send_request(req).await?
            }
            None => {
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
                tokio::spawn(conn);
                sender.send_request(req).await?
            }
        };
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(Reply {
            code,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            text,
        })
    }

    pub async fn json(&self, method: &str, path: &str, body: &Value) -> Result<Reply, Error> {
        self.send(
            method,
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
    }
}

/// A Talos client configured from a talosconfig, as talosctl would be, dialing `endpoint`
/// (the context's first endpoint when `None`).
pub async fn talos_channel(
    talosconfig: &Path,
    endpoint: Option<SocketAddr>,
) -> Result<Channel, Error> {
    let cfg: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(talosconfig)?)?;
    let name = cfg["context"].as_str().ok_or("no context")?;
    let ctx = &cfg["contexts"][name];
    let b64 = |k: &str| -> Result<String, Error> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(ctx[k].as_str().ok_or("missing field")?)?;
        Ok(String::from_utf8(raw)?)
    };
    // Talos labels Ed25519 keys with its own PEM type; rustls wants PKCS#8 "PRIVATE KEY".
    let key = b64("key")?.replace("ED25519 PRIVATE KEY", "PRIVATE KEY");
    let endpoint = match endpoint {
        Some(a) => a.to_string(),
        None => ctx["endpoints"][0]
            .as_str()
            .ok_or("no endpoint")?
            .to_string(),
    };
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(b64("ca")?))
        .identity(Identity::from_pem(b64("crt")?, key))
        .domain_name("127.0.0.1");
    Ok(Channel::from_shared(format!("https://{endpoint}"))?
        .tls_config(tls)?
        .connect()
        .await?)
}

/// Every file under `dir`, path → bytes (to prove a directory was not written).
pub fn snapshot(dir: &Path) -> Result<std::collections::BTreeMap<String, Vec<u8>>, Error> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let path = entry.path();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(path);
            } else {
                let key = path.strip_prefix(dir)?.display().to_string();
                out.insert(key, std::fs::read(&path)?);
            }
        }
    }
    Ok(out)
}
