//! The apiserver's CA and serving certificate, from the twin's shared PKI, and the rustls
//! server configuration.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use tokio_rustls::rustls;

use crate::sim::pki::{CertificateAuthority, KeyAlgorithm, PkiError};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the apiserver certificates: {0}")]
    Generate(#[from] PkiError),
    #[error("building the TLS server configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The serving certificate and the CA that signed it (the kubeconfig trusts the CA).
pub struct ServingCert {
    pub ca_pem: String,
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

/// A cluster CA (ECDSA P-256, as the Kubernetes CA on Talos) and a serving certificate for
/// 127.0.0.1 and the in-cluster names.
pub fn generate() -> Result<ServingCert, TlsError> {
    let ca = CertificateAuthority::new("kubernetes", None, KeyAlgorithm::EcdsaP256)?;
    let dns: Vec<String> = ["localhost", "kubernetes", "kubernetes.default.svc"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let cert = ca.issue_server(
        "kube-apiserver",
        &dns,
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        KeyAlgorithm::EcdsaP256,
    )?;
    Ok(ServingCert {
        ca_pem: ca.cert_pem().to_string(),
        cert_der: cert.cert_der,
        key_der: cert.key_der,
    })
}

pub fn server_config(cert: &ServingCert) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_der.clone().into());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert_der.clone().into()], key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
