//! The apiserver's own CA and serving certificate (rcgen), until the twin's shared PKI
//! (`src/sim/pki.rs`) takes over.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio_rustls::rustls;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the apiserver certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("building the TLS server configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// A CA (in the kubeconfig) and the serving certificate it signed.
pub struct ServingCert {
    pub ca_pem: String,
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

pub fn generate() -> Result<ServingCert, TlsError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "kubernetes");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default.svc".to_string(),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;
    Ok(ServingCert {
        ca_pem: ca_cert.pem(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    })
}

/// rustls server config (ring provider), offering h2 and http/1.1.
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
