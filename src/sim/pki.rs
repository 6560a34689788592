//! Certificates for the twin: generated CAs, server and client certificates, and the
//! talosconfig a Talos client reads. Generic on purpose: the Talos side uses an Ed25519 OS CA
//! (as Talos does), the Kubernetes side an ECDSA CA for its HTTPS endpoint.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating a {0:?} key: {1}")]
    KeyGeneration(KeyAlgorithm, rcgen::Error),
    #[error("building certificate {name:?}: {source}")]
    Certificate { name: String, source: rcgen::Error },
    #[error(transparent)]
    Write(#[from] crate::sim::state::StateError),
    #[error("talosconfig YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("a client certificate can carry at most two roles, {0} were asked for")]
    TooManyRoles(usize),
    #[error("malformed certificate DER: {0}")]
    Der(&'static str),
}

/// Key types the twin issues. Talos' OS CA and admin certificate are Ed25519; the etcd and
/// Kubernetes CAs are ECDSA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAlgorithm {
    Ed25519,
    EcdsaP256,
}

impl KeyAlgorithm {
    fn generate(self) -> Result<KeyPair, PkiError> {
        let alg = match self {
            KeyAlgorithm::Ed25519 => &rcgen::PKCS_ED25519,
            KeyAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
        };
        KeyPair::generate_for(alg).map_err(|e| PkiError::KeyGeneration(self, e))
    }
}

/// A certificate with its private key, PEM encoded (`PRIVATE KEY`, PKCS#8).
#[derive(Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    pub key_pem: String,
    /// The same key as PKCS#8 DER, for rustls.
    pub key_der: Vec<u8>,
    pub algorithm: KeyAlgorithm,
}

impl std::fmt::Debug for IssuedCert {
    // Never print the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl IssuedCert {
    /// The key as Talos writes it: Ed25519 keys as Go's `x509.MarshalPKCS8PrivateKey` makes
    /// them (PKCS#8 v1: the seed only, 48 bytes) under the non-standard PEM label
    /// `ED25519 PRIVATE KEY`. ring's own encoding is PKCS#8 v2 (with the public key), which
    /// OpenSSL 3.0 refuses. Clients of real Talos must cope with the label.
    pub fn talos_key_pem(&self) -> String {
        match self.algorithm {
            KeyAlgorithm::Ed25519 => match ed25519_pkcs8_v1(&self.key_der) {
                Some(der) => pem("ED25519 PRIVATE KEY", &der),
                None => self.key_pem.replace("PRIVATE KEY", "ED25519 PRIVATE KEY"),
            },
            KeyAlgorithm::EcdsaP256 => self.key_pem.clone(),
        }
    }
}

/// The DER prefix of an Ed25519 PKCS#8 v1 document, up to the 32-byte seed: SEQUENCE,
/// version 0, AlgorithmIdentifier 1.3.101.112, OCTET STRING { OCTET STRING (32) }.
const ED25519_PKCS8_V1: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// An Ed25519 PKCS#8 document (v1 or v2) rewritten as v1; None if it is not one.
fn ed25519_pkcs8_v1(der: &[u8]) -> Option<Vec<u8>> {
    // Both versions share everything after the outer length and version byte up to the seed.
    if der.len() < 48 || der.get(5..16)? != &ED25519_PKCS8_V1[5..16] {
        return None;
    }
    let mut out = ED25519_PKCS8_V1.to_vec();
    out.extend_from_slice(der.get(16..48)?);
    Some(out)
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A certificate authority that can issue server and client certificates.
pub struct CertificateAuthority {
    params: CertificateParams,
    key: KeyPair,
    cert_pem: String,
    cert_der: Vec<u8>,
    algorithm: KeyAlgorithm,
    issued_at: SystemTime,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// How long everything the twin issues stays valid: ten years from issue.
pub const VALIDITY: Duration = Duration::from_secs(3650 * 86_400);
/// How far before the issue time certificates start to be valid, for a client whose clock
/// runs a little behind.
pub const BACKDATE: Duration = Duration::from_secs(3600);

/// Sets the window to [issued_at - BACKDATE, issued_at + VALIDITY]. Clients check it
/// against their wall clock, never the twin's (possibly simulated) one, so `issued_at` is
/// a wall time too.
fn validity(params: &mut CertificateParams, issued_at: SystemTime) {
    let since_epoch = issued_at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + since_epoch.saturating_sub(BACKDATE);
    params.not_after = epoch + since_epoch.saturating_add(VALIDITY);
}

impl CertificateAuthority {
    /// A self-signed CA issued now (wall clock). `organization` is the Subject O (Talos
    /// puts the cluster name there).
    pub fn new(
        common_name: &str,
        organization: Option<&str>,
        algorithm: KeyAlgorithm,
    ) -> Result<Self, PkiError> {
        Self::new_at(common_name, organization, algorithm, SystemTime::now())
    }

    /// A CA issued at `issued_at`; so is everything it issues (see [`VALIDITY`]).
    pub fn new_at(
        common_name: &str,
        organization: Option<&str>,
        algorithm: KeyAlgorithm,
        issued_at: SystemTime,
    ) -> Result<Self, PkiError> {
        let key = algorithm.generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(o) = organization {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, issued_at);
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::Certificate {
                name: common_name.to_string(),
                source,
            })?;
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            params,
            key,
            algorithm,
            issued_at,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    fn issue(
        &self,
        params: CertificateParams,
        name: &str,
        algorithm: KeyAlgorithm,
    ) -> Result<IssuedCert, PkiError> {
        self.issue_until(params, name, algorithm, None)
    }

    fn issue_until(
        &self,
        mut params: CertificateParams,
        name: &str,
        algorithm: KeyAlgorithm,
        not_after: Option<SystemTime>,
    ) -> Result<IssuedCert, PkiError> {
        let key = algorithm.generate()?;
        params.use_authority_key_identifier_extension = true;
        // The CA's window: a leaf never outlives its issuer.
        validity(&mut params, self.issued_at);
        if let Some(end) = not_after {
            let since_epoch = end.duration_since(UNIX_EPOCH).unwrap_or_default();
            params.not_after = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
        }
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|source| PkiError::Certificate {
                name: name.to_string(),
                source,
            })?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
            algorithm,
        })
    }

    /// A server certificate (ExtKeyUsage ServerAuth) for the given DNS names and IPs.
    pub fn issue_server(
        &self,
        common_name: &str,
        dns_names: &[String],
        ips: &[IpAddr],
        algorithm: KeyAlgorithm,
    ) -> Result<IssuedCert, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for dns in dns_names {
            let name = dns
                .as_str()
                .try_into()
                .map_err(|source| PkiError::Certificate {
                    name: dns.clone(),
                    source,
                })?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, common_name, algorithm)
    }

    /// A client certificate with one Subject O per role (`os:admin`, `os:reader`, …) and
    /// ExtKeyUsage exactly ClientAuth, as Talos requires since 1.13.
    pub fn issue_client(
        &self,
        common_name: &str,
        organizations: &[&str],
        algorithm: KeyAlgorithm,
    ) -> Result<IssuedCert, PkiError> {
        self.issue_client_until(common_name, organizations, algorithm, None)
    }

    /// [`Self::issue_client`], valid only until `not_after` (a certificate that expires).
    pub fn issue_client_until(
        &self,
        common_name: &str,
        organizations: &[&str],
        algorithm: KeyAlgorithm,
        not_after: Option<SystemTime>,
    ) -> Result<IssuedCert, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        // rcgen keeps one value per attribute type, so a second O goes in under the same OID
        // spelled as a custom type; more than two roles is not supported.
        match organizations {
            [] => {}
            [one] => params
                .distinguished_name
                .push(DnType::OrganizationName, *one),
            [one, two] => {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, *one);
                params
                    .distinguished_name
                    .push(DnType::CustomDnType(vec![2, 5, 4, 10]), *two);
            }
            _ => return Err(PkiError::TooManyRoles(organizations.len())),
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue_until(params, common_name, algorithm, not_after)
    }
}

/// One talosconfig context.
#[derive(Clone, Debug)]
pub struct TalosContext {
    pub name: String,
    /// `host:port` of the endpoints a client dials.
    pub endpoints: Vec<String>,
    /// Default target nodes (sent as `node`/`nodes` metadata).
    pub nodes: Vec<String>,
}

/// Writes `<dir>/talosconfig` in the format talosctl reads (CA, certificate and key as base64
/// PEM; an Ed25519 key under Talos' own PEM label). Returns the path. The file is mode 0600.
pub fn write_talosconfig(
    dir: &Path,
    context: &TalosContext,
    ca_pem: &str,
    client: &IssuedCert,
) -> Result<PathBuf, PkiError> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let mut ctx = serde_yaml::Mapping::new();
    ctx.insert("endpoints".into(), context.endpoints.clone().into());
    if !context.nodes.is_empty() {
        ctx.insert("nodes".into(), context.nodes.clone().into());
    }
    ctx.insert("ca".into(), b64(ca_pem).into());
    ctx.insert("crt".into(), b64(&client.cert_pem).into());
    ctx.insert("key".into(), b64(&client.talos_key_pem()).into());
    let mut contexts = serde_yaml::Mapping::new();
    contexts.insert(context.name.clone().into(), ctx.into());
    let mut root = serde_yaml::Mapping::new();
    root.insert("context".into(), context.name.clone().into());
    root.insert("contexts".into(), contexts.into());
    let text = serde_yaml::to_string(&root)?;

    crate::sim::state::prepare_dir(dir)?;
    let path = dir.join("talosconfig");
    crate::sim::state::write_private(&path, text.as_bytes())?;
    Ok(path)
}

/// The Subject Organization (O) values of a DER certificate, in order. Talos maps each O of
/// the client certificate to one role; this is how the twin reads them.
pub fn subject_organizations(cert_der: &[u8]) -> Result<Vec<String>, PkiError> {
    let mut cert = Der::new(cert_der);
    let mut cert = cert.enter(0x30, "certificate")?;
    let mut tbs = cert.enter(0x30, "tbsCertificate")?;
    if tbs.peek() == Some(0xa0) {
        tbs.skip("version")?;
    }
    tbs.skip("serialNumber")?;
    tbs.skip("signature")?;
    tbs.skip("issuer")?;
    tbs.skip("validity")?;
    let mut subject = tbs.enter(0x30, "subject")?;
    // OID 2.5.4.10 (organizationName), DER encoded.
    const ORG: &[u8] = &[0x55, 0x04, 0x0a];
    let mut orgs = Vec::new();
    while !subject.is_empty() {
        let mut rdn = subject.enter(0x31, "RDN")?;
        while !rdn.is_empty() {
            let mut atv = rdn.enter(0x30, "attribute")?;
            let (tag, oid) = atv.read("attribute type")?;
            if tag != 0x06 {
                return Err(PkiError::Der("attribute type is not an OID"));
            }
            let (_, value) = atv.read("attribute value")?;
            if oid == ORG {
                orgs.push(String::from_utf8_lossy(value).into_owned());
            }
        }
    }
    Ok(orgs)
}

/// A minimal DER reader: just enough to walk to the certificate subject.
struct Der<'a> {
    rest: &'a [u8],
}

impl<'a> Der<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Der { rest: bytes }
    }
    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
    fn peek(&self) -> Option<u8> {
        self.rest.first().copied()
    }
    fn read(&mut self, what: &'static str) -> Result<(u8, &'a [u8]), PkiError> {
        let (&tag, rest) = self.rest.split_first().ok_or(PkiError::Der(what))?;
        let (&first, mut rest) = rest.split_first().ok_or(PkiError::Der(what))?;
        let len = if first < 0x80 {
            first as usize
        } else {
            let n = (first & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n {
                return Err(PkiError::Der(what));
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | *b as usize);
            rest = &rest[n..];
            len
        };
        if rest.len() < len {
            return Err(PkiError::Der(what));
        }
        let (body, after) = rest.split_at(len);
        self.rest = after;
        Ok((tag, body))
    }
    fn enter(&mut self, tag: u8, what: &'static str) -> Result<Der<'a>, PkiError> {
        let (t, body) = self.read(what)?;
        if t != tag {
            return Err(PkiError::Der(what));
        }
        Ok(Der::new(body))
    }
    fn skip(&mut self, what: &'static str) -> Result<(), PkiError> {
        self.read(what).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_cert_carries_one_organization_per_role() -> Result<(), PkiError> {
        let ca = CertificateAuthority::new("talos", Some("sim"), KeyAlgorithm::Ed25519)?;
        let admin = ca.issue_client("admin", &["os:admin", "os:reader"], KeyAlgorithm::Ed25519)?;
        assert_eq!(
            subject_organizations(&admin.cert_der)?,
            vec!["os:admin".to_string(), "os:reader".to_string()]
        );
        assert!(admin.talos_key_pem().contains("BEGIN ED25519 PRIVATE KEY"));
        let server = ca.issue_server(
            "node",
            &["cp-1".to_string()],
            &["127.0.0.1".parse().map_err(|_| PkiError::Der("ip"))?],
            KeyAlgorithm::EcdsaP256,
        )?;
        assert!(subject_organizations(&server.cert_der)?.is_empty());
        assert!(server.key_pem.contains("BEGIN PRIVATE KEY"));
        Ok(())
    }

    #[test]
    fn talosconfig_has_the_talosctl_shape() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ca = CertificateAuthority::new("talos", None, KeyAlgorithm::Ed25519)?;
        let admin = ca.issue_client("admin", &["os:admin"], KeyAlgorithm::Ed25519)?;
        let ctx = TalosContext {
            name: "sim".into(),
            endpoints: vec!["127.0.0.1:50000".into()],
            nodes: vec!["10.5.0.2".into()],
        };
        let path = write_talosconfig(dir.path(), &ctx, ca.cert_pem(), &admin)?;
        let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
        assert_eq!(doc["context"].as_str(), Some("sim"));
        let ca_b64 = doc["contexts"]["sim"]["ca"].as_str().unwrap_or_default();
        let ca_pem = base64::engine::general_purpose::STANDARD.decode(ca_b64)?;
        assert_eq!(String::from_utf8(ca_pem)?, ca.cert_pem());
        assert_eq!(
            doc["contexts"]["sim"]["nodes"][0].as_str(),
            Some("10.5.0.2")
        );
        Ok(())
    }
}

#[cfg(test)]
mod validity_tests {
    use std::sync::Arc;

    use tokio_rustls::rustls::{
        self,
        client::danger::ServerCertVerifier,
        pki_types::{CertificateDer, ServerName, UnixTime},
        RootCertStore,
    };

    use super::*;

    const YEAR: Duration = Duration::from_secs(365 * 86_400);

    /// A twin started a year from now (the old fixed notAfter was 2027-01-01) issues
    /// certificates a real TLS verifier accepts for ten years from then, and not outside.
    #[test]
    fn certificates_are_valid_for_ten_years_from_their_issue_time(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let issued = SystemTime::now() + YEAR;
        let at = |t: SystemTime| {
            UnixTime::since_unix_epoch(t.duration_since(UNIX_EPOCH).unwrap_or_default())
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());

        let kube =
            CertificateAuthority::new_at("kubernetes", None, KeyAlgorithm::EcdsaP256, issued)?;
        let server = kube.issue_server(
            "kube-apiserver",
            &["localhost".to_string()],
            &[],
            KeyAlgorithm::EcdsaP256,
        )?;
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from(kube.cert_der().to_vec()))?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()?;
        let name = ServerName::try_from("localhost")?;
        let leaf = CertificateDer::from(server.cert_der.clone());
        let server_ok = |t: SystemTime| {
            verifier
                .verify_server_cert(&leaf, &[], &name, &[], at(t))
                .is_ok()
        };
        assert!(server_ok(issued));
        assert!(server_ok(issued + 9 * YEAR));
        assert!(
            server_ok(issued - Duration::from_secs(60)),
            "backdated for skew"
        );
        assert!(!server_ok(issued + 11 * YEAR));
        assert!(!server_ok(issued - Duration::from_secs(86_400)));

        // The Talos side: an Ed25519 OS CA and an os:admin client certificate.
        let talos =
            CertificateAuthority::new_at("talos", Some("sim"), KeyAlgorithm::Ed25519, issued)?;
        let admin = talos.issue_client("admin", &["os:admin"], KeyAlgorithm::Ed25519)?;
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from(talos.cert_der().to_vec()))?;
        let clients =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()?;
        let leaf = CertificateDer::from(admin.cert_der.clone());
        let client_ok = |t: SystemTime| clients.verify_client_cert(&leaf, &[], at(t)).is_ok();
        assert!(client_ok(issued + 9 * YEAR));
        assert!(!client_ok(issued + 11 * YEAR));
        Ok(())
    }
}
