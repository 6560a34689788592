//! talosconfig, read exactly as talosctl reads it: `--talosconfig`, else `$TALOSCONFIG`,
//! else `$TALOS_HOME/config`, else `~/.talos/config`; the `context` names one entry of
//! `contexts`, whose `ca`, `crt` and `key` are base64-encoded PEM. Talos labels Ed25519 keys
//! `ED25519 PRIVATE KEY` (the body is PKCS#8); rustls wants `PRIVATE KEY`, so the label is
//! rewritten here. Endpoints without a port get Talos's 50000.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

/// The Talos API port (apid) added to endpoints written without one.
pub const DEFAULT_PORT: u16 = 50000;
/// The largest talosconfig read (they are a few KiB).
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no talosconfig: pass --talosconfig, or set TALOSCONFIG (or TALOS_HOME, or HOME for ~/.talos/config)")]
    NotFound,
    #[error("{path}: cannot read the talosconfig: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Deserialize)]
struct File {
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, RawContext>,
}

#[derive(Debug, Deserialize)]
struct RawContext {
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default)]
    nodes: Vec<String>,
    #[serde(default)]
    ca: Option<String>,
    #[serde(default)]
    crt: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

/// One `host:port` the client dials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// `10.0.0.1`, `10.0.0.1:50000`, `cp.example.com`, `[fd00::1]:50000` or `fd00::1`.
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let t = text.trim().trim_start_matches("https://");
        if t.is_empty() {
            return Err("an empty endpoint".into());
        }
        if let Ok(sock) = t.parse::<std::net::SocketAddr>() {
            return Ok(Endpoint {
                host: sock.ip().to_string(),
                port: sock.port(),
            });
        }
        if let Ok(ip) = t.parse::<std::net::IpAddr>() {
            return Ok(Endpoint {
                host: ip.to_string(),
                port: DEFAULT_PORT,
            });
        }
        match t.rsplit_once(':') {
            Some((host, port)) => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("endpoint `{t}`: `{port}` is not a port"))?;
                Ok(Endpoint {
                    host: host.trim_matches(['[', ']']).to_string(),
                    port,
                })
            }
            None => Ok(Endpoint {
                host: t.to_string(),
                port: DEFAULT_PORT,
            }),
        }
    }

    /// The `https://` URI tonic dials.
    pub fn uri(&self) -> String {
        if self.host.contains(':') {
            format!("https://[{}]:{}", self.host, self.port)
        } else {
            format!("https://{}:{}", self.host, self.port)
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// One talosconfig context, decoded.
#[derive(Clone)]
pub struct TalosContext {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    /// Default target nodes (talosctl's `-n` when none is given).
    pub nodes: Vec<String>,
    pub ca_pem: String,
    pub crt_pem: String,
    /// PKCS#8 PEM under the `PRIVATE KEY` label.
    pub key_pem: String,
}

// The key never reaches a log line.
impl std::fmt::Debug for TalosContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalosContext")
            .field("name", &self.name)
            .field("endpoints", &self.endpoints)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// Where the talosconfig is: the flag, then the environment, as talosctl looks.
pub fn locate(flag: Option<&Path>) -> Result<PathBuf, ConfigError> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = env("TALOSCONFIG") {
        return Ok(PathBuf::from(p));
    }
    if let Some(home) = env("TALOS_HOME") {
        return Ok(PathBuf::from(home).join("config"));
    }
    if let Some(home) = env("HOME") {
        let p = PathBuf::from(home).join(".talos/config");
        if p.exists() {
            return Ok(p);
        }
    }
    Err(ConfigError::NotFound)
}

/// Read the talosconfig at `path` and decode its current context (or `context` if given).
pub fn load(path: &Path, context: Option<&str>) -> Result<TalosContext, ConfigError> {
    let read_err = |message: String| ConfigError::Read {
        path: path.to_path_buf(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| read_err(e.to_string()))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(read_err(format!(
            "{} bytes; a talosconfig is at most {MAX_CONFIG_BYTES}",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?;
    parse(path, &text, context)
}

/// Decode `text` (the file at `path`, for messages).
pub fn parse(path: &Path, text: &str, context: Option<&str>) -> Result<TalosContext, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let file: File = serde_yaml::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let name = context
        .map(str::to_string)
        .or(file.context.clone())
        .ok_or_else(|| invalid("no `context` is set and none was chosen".into()))?;
    let raw = file.contexts.get(&name).ok_or_else(|| {
        invalid(format!(
            "context `{name}` is not in `contexts` (found: {})",
            file.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
        ))
    })?;
    if raw.endpoints.is_empty() {
        return Err(invalid(format!("context `{name}` has no endpoints")));
    }
    let endpoints = raw
        .endpoints
        .iter()
        .map(|e| Endpoint::parse(e).map_err(|m| invalid(format!("context `{name}`: {m}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let field = |k: &str, v: &Option<String>| -> Result<String, ConfigError> {
        let b64 = v
            .as_deref()
            .ok_or_else(|| invalid(format!("context `{name}` has no `{k}`")))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| invalid(format!("context `{name}`: `{k}` is not base64: {e}")))?;
        String::from_utf8(bytes)
            .map_err(|_| invalid(format!("context `{name}`: `{k}` is not PEM text")))
    };
    let ca_pem = field("ca", &raw.ca)?;
    let crt_pem = field("crt", &raw.crt)?;
    let key_pem = normalize_key(&field("key", &raw.key)?)
        .map_err(|m| invalid(format!("context `{name}`: `key`: {m}")))?;
    for (k, pem) in [("ca", &ca_pem), ("crt", &crt_pem)] {
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(invalid(format!(
                "context `{name}`: `{k}` holds no PEM certificate"
            )));
        }
    }
    Ok(TalosContext {
        name,
        endpoints,
        nodes: raw.nodes.clone(),
        ca_pem,
        crt_pem,
        key_pem,
    })
}

/// A private key as rustls reads it: PKCS#8 (v1, or v2 with the public key, both as Go and
/// OpenSSL write them) under `PRIVATE KEY`. Talos's own label is `ED25519 PRIVATE KEY`.
fn normalize_key(pem: &str) -> Result<String, String> {
    for label in [
        "ED25519 PRIVATE KEY",
        "PRIVATE KEY",
        "EC PRIVATE KEY",
        "RSA PRIVATE KEY",
    ] {
        if pem.contains(&format!("-----BEGIN {label}-----")) {
            return Ok(match label {
                "ED25519 PRIVATE KEY" => pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY"),
                _ => pem.to_string(),
            });
        }
    }
    Err("no PEM private key (expected PRIVATE KEY or ED25519 PRIVATE KEY)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

    fn config(key_label: &str, endpoints: &str) -> String {
        let key = format!("-----BEGIN {key_label}-----\nAAAA\n-----END {key_label}-----\n");
        format!(
            "context: lab\ncontexts:\n  lab:\n    endpoints: {endpoints}\n    nodes: [10.5.0.2]\n    ca: {}\n    crt: {}\n    key: {}\n  other:\n    endpoints: [10.9.9.9]\n",
            b64(CERT),
            b64(CERT),
            b64(&key)
        )
    }

    #[test]
    fn reads_a_context_with_both_key_labels_and_default_ports() {
        let p = Path::new("talosconfig");
        let c = parse(
            p,
            &config(
                "ED25519 PRIVATE KEY",
                "[10.5.0.2, \"10.5.0.3:50001\", cp.lab, \"[fd00::1]:50000\", \"fd00::2\"]",
            ),
            None,
        )
        .unwrap();
        assert_eq!(c.name, "lab");
        assert!(c.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let eps: Vec<String> = c.endpoints.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            eps,
            [
                "10.5.0.2:50000",
                "10.5.0.3:50001",
                "cp.lab:50000",
                "[fd00::1]:50000",
                "[fd00::2]:50000"
            ]
        );
        assert_eq!(c.endpoints[3].uri(), "https://[fd00::1]:50000");
        let c = parse(p, &config("PRIVATE KEY", "[10.5.0.2]"), None).unwrap();
        assert!(c.key_pem.contains("BEGIN PRIVATE KEY"));
        assert_eq!(c.nodes, ["10.5.0.2"]);
        assert!(
            !format!("{c:?}").contains("AAAA"),
            "no key material in Debug"
        );
    }

    #[test]
    fn errors_name_the_file_and_what_is_missing() {
        let p = Path::new("/x/talosconfig");
        let e = parse(p, &config("PRIVATE KEY", "[10.5.0.2]"), Some("nope")).unwrap_err();
        assert!(
            e.to_string()
                .contains("context `nope` is not in `contexts` (found: lab, other)"),
            "{e}"
        );
        let e = parse(p, &config("PRIVATE KEY", "[10.5.0.2]"), Some("other")).unwrap_err();
        assert!(e.to_string().contains("has no `ca`"), "{e}");
        let e = parse(p, &config("PRIVATE KEY", "[\"10.5.0.2:http\"]"), None).unwrap_err();
        assert!(e.to_string().contains("is not a port"), "{e}");
        let e = parse(p, &config("OPENSSH PRIVATE KEY", "[10.5.0.2]"), None).unwrap_err();
        assert!(e.to_string().contains("no PEM private key"), "{e}");
        assert!(e.to_string().starts_with("/x/talosconfig:"), "{e}");
    }
}
