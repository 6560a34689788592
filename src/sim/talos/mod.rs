//! The twin's Talos side: simulated nodes ([`model`]) served over the Talos machine API
//! with mutual TLS, one loopback endpoint per node ([`TalosTwin`]).
//!
//! Fidelity notes (what is simulated and what is not):
//! - `node` metadata routing as apid does it (worker endpoints refuse forwarding). `nodes`
//!   one-to-many for the unary MachineService calls: replies tagged with `metadata.hostname`,
//!   per-node failures in `metadata.error`/`status` while the call succeeds; likewise the
//!   streaming Read. Other streaming methods and the other services refuse `nodes` with
//!   InvalidArgument (apid would fan out MachineService streams and LifecycleService too).
//! - A "live" change under NO_REBOOT is a component image change; any other difference needs
//!   a reboot (Talos' own CanApplyImmediate is broader).
//! - COSI State serves the MachineConfig resource (Get, List, Watch), MachineStatus, Version and
//!   the bootstrap Manifests (Get, List; manifests abridged to one object each); other resource
//!   types answer PermissionDenied "not supported", as Talos does for unknown types.
//! - Events honours `tail_events` and `with_actor_id`; `tail_id` and `tail_seconds` are
//!   ignored. Only MachineStatusEvents are emitted.
//! - A node that is down answers Unavailable instead of dropping the TCP connection.

pub mod config;
pub mod model;
mod server;
/// What a control plane renders as its bootstrap manifests (the whole twin seeds their
/// objects' ownership from them).
pub(crate) use server::manifests as bootstrap_manifests;
mod textdiff;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::rustls;
use tonic::transport::Server;

use crate::clock::{Clock, Timestamp};
use crate::sim::net::{self, NetLimits};
use crate::sim::pki::{self, CertificateAuthority, IssuedCert, KeyAlgorithm, PkiError};
use crate::talos::proto::cosi::resource::state_server::StateServer;
use crate::talos::proto::machine::image_service_server::ImageServiceServer;
use crate::talos::proto::machine::lifecycle_service_server::LifecycleServiceServer;
use crate::talos::proto::machine::machine_service_server::MachineServiceServer;

pub use config::{Component, ConfigForm, MachineConfig};
pub use model::{
    ApplyMode, BootSlots, Bootloader, EtcdMemberView, Faults, ImageStore, Kubelet, MachineEvent,
    ModelError, Node, NodeObservation, NodeSpec, Role, Stage, StaticPod, TalosCluster, TalosError,
    Timings,
};

/// The twin's Talos call log under the state directory (see `server::Shared::audit`).
pub const AUDIT_LOG: &str = "talos-audit.jsonl";

/// Talos and the Go client both cap gRPC messages at 32 MiB.
const MAX_MESSAGE: usize = 32 << 20;

#[derive(Clone, Debug)]
pub struct TalosTwinOptions {
    pub timings: Timings,
    pub faults: Faults,
    /// Name of the talosconfig context.
    pub context: String,
    /// Connection limits of every node's endpoint.
    pub net: NetLimits,
}

impl Default for TalosTwinOptions {
    fn default() -> Self {
        TalosTwinOptions {
            timings: Timings::default(),
            faults: Faults::default(),
            context: "ichor-sim".to_string(),
            net: NetLimits::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    #[error("talos twin model: {0}")]
    Model(#[from] ModelError),
    #[error("talos twin certificates: {0}")]
    Pki(#[from] PkiError),
    #[error("binding the endpoint of node {node} on 127.0.0.1: {source}")]
    Bind {
        node: String,
        source: std::io::Error,
    },
    #[error("configuring TLS for node {node}: {message}")]
    Tls { node: String, message: String },
    #[error("opening the Talos call log {path}: {source}")]
    AuditLog {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A running Talos twin: the model and one mTLS gRPC endpoint per node.
pub struct TalosTwin {
    shared: Arc<server::Shared>,
    endpoints: Vec<(String, SocketAddr)>,
    talosconfig: PathBuf,
    ca: CertificateAuthority,
    admin: IssuedCert,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    driver_wakeups: Arc<AtomicU64>,
    /// TLS handshakes completed, over every endpoint.
    handshakes: Arc<AtomicU64>,
    /// Calls per gRPC method (`machine.MachineService/Version`), over every endpoint.
    calls: Arc<Mutex<std::collections::BTreeMap<String, u64>>>,
    node_time: NodeTime,
}

impl std::fmt::Debug for TalosTwin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalosTwin")
            .field("endpoints", &self.endpoints)
            .field("talosconfig", &self.talosconfig)
            .finish_non_exhaustive()
    }
}

impl TalosTwin {
    /// Builds the nodes, generates the OS CA and certificates, starts one endpoint per node
    /// on 127.0.0.1 (ephemeral ports) and writes `<state_dir>/talosconfig` with an `os:admin`
    /// certificate, the control-plane endpoints and every node's simulated IP.
    pub async fn start(
        clock: Clock,
        nodes: Vec<NodeSpec>,
        state_dir: &Path,
        options: TalosTwinOptions,
    ) -> Result<TalosTwin, TwinError> {
        let model = TalosCluster::new(&nodes, options.timings, options.faults, clock.now())?;
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(server::Shared {
            model: Mutex::new(model),
            clock,
            changed,
            admin_kubeconfig: Mutex::new(None),
            audit: std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(state_dir.join(AUDIT_LOG))
                .map_err(|source| TwinError::AuditLog {
                    path: state_dir.join(AUDIT_LOG),
                    source,
                })
                .map(Mutex::new)
                .map(Some)?,
        });
        let ca = CertificateAuthority::new("talos", Some(&options.context), KeyAlgorithm::Ed25519)?;
        let node_time = NodeTime::starting_now(shared.clock.clone());
        let (shutdown, _) = watch::channel(false);
        let mut endpoints = Vec::new();
        let mut tasks = Vec::new();
        let handshakes = Arc::new(AtomicU64::new(0));
        let calls: Arc<Mutex<std::collections::BTreeMap<String, u64>>> = Arc::default();
        for (index, spec) in nodes.iter().enumerate() {
            let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .map_err(|source| TwinError::Bind {
                    node: spec.name.clone(),
                    source,
                })?;
            let addr = listener.local_addr().map_err(|source| TwinError::Bind {
                node: spec.name.clone(),
                source,
            })?;
            let cert = ca.issue_server(
                &spec.name,
                std::slice::from_ref(&spec.name),
                &[IpAddr::V4(Ipv4Addr::LOCALHOST), spec.ip],
                KeyAlgorithm::Ed25519,
            )?;
            let tls = server_tls(&cert, ca.cert_der(), &node_time).map_err(|e| TwinError::Tls {
                node: spec.name.clone(),
                message: e.to_string(),
            })?;
            let api = server::NodeApi {
                shared: shared.clone(),
                endpoint: index,
            };
            let counted = calls.clone();
            let router = Server::builder()
                // Every call passes here first: counted by method, no span of its own.
                .trace_fn(move |req| {
                    let method = req.uri().path().trim_start_matches('/').to_string();
                    if let Ok(mut c) = counted.lock() {
                        *c.entry(method).or_default() += 1;
                    }
                    tracing::Span::none()
                })
                .http2_keepalive_interval(Some(options.net.keepalive))
                .http2_keepalive_timeout(Some(options.net.keepalive))
                .add_service(
                    MachineServiceServer::new(api.clone()).max_decoding_message_size(MAX_MESSAGE),
                )
                .add_service(ImageServiceServer::new(api.clone()))
                .add_service(LifecycleServiceServer::new(api.clone()))
                .add_service(StateServer::new(api));
            let mut stop = shutdown.subscribe();
            let name = spec.name.clone();
            // The handshake happens off the accept loop, under a timeout, in a bounded
            // number of slots: idle sockets cannot hold the endpoint.
            let incoming = net::tls_incoming(
                listener,
                tokio_rustls::TlsAcceptor::from(tls),
                options.net,
                shutdown.subscribe(),
                handshakes.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let signal = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = router.serve_with_incoming_shutdown(incoming, signal).await {
                    tracing::warn!(node = %name, error = %e, "talos twin endpoint stopped");
                }
            }));
            endpoints.push((spec.name.clone(), addr));
        }
        let driver_wakeups = Arc::new(AtomicU64::new(0));
        tasks.push(tokio::spawn(drive(
            shared.clone(),
            shutdown.subscribe(),
            driver_wakeups.clone(),
        )));
        let admin = ca.issue_client("admin", &["os:admin"], KeyAlgorithm::Ed25519)?;
        let context = pki::TalosContext {
            name: options.context.clone(),
            endpoints: nodes
                .iter()
                .zip(&endpoints)
                .filter(|(n, _)| n.role == Role::ControlPlane)
                .map(|(_, (_, addr))| addr.to_string())
                .collect(),
            nodes: nodes.iter().map(|n| n.ip.to_string()).collect(),
        };
        let talosconfig = pki::write_talosconfig(state_dir, &context, ca.cert_pem(), &admin)?;
        Ok(TalosTwin {
            shared,
            endpoints,
            talosconfig,
            ca,
            admin,
            shutdown,
            tasks,
            driver_wakeups,
            handshakes,
            calls,
            node_time,
        })
    }

    /// Every node's endpoint, in the order the nodes were given.
    pub fn endpoints(&self) -> &[(String, SocketAddr)] {
        &self.endpoints
    }

    /// The endpoint of one node.
    pub fn endpoint(&self, node: &str) -> Option<SocketAddr> {
        self.endpoints
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, a)| *a)
    }

    pub fn talosconfig_path(&self) -> &Path {
        &self.talosconfig
    }

    /// The call log: one JSON object per line (`at`, `node`, `method`, `bootId`, `request`,
    /// `code`), next to the talosconfig.
    pub fn audit_log_path(&self) -> PathBuf {
        self.talosconfig.with_file_name(AUDIT_LOG)
    }

    /// The OS CA certificate (PEM) clients trust.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The `os:admin` client certificate written into the talosconfig.
    pub fn admin_certificate(&self) -> &IssuedCert {
        &self.admin
    }

    /// Issues another client certificate from the OS CA with the given roles (e.g.
    /// `os:reader`), as `talosctl config new --roles` would.
    pub fn issue_client(&self, name: &str, roles: &[&str]) -> Result<IssuedCert, PkiError> {
        self.ca.issue_client(name, roles, KeyAlgorithm::Ed25519)
    }

    /// [`Self::issue_client`], expiring once `valid_for` of simulated time has passed (the
    /// nodes check validity against their own clock, which runs with the twin's).
    pub fn issue_client_expiring(
        &self,
        name: &str,
        roles: &[&str],
        valid_for: std::time::Duration,
    ) -> Result<IssuedCert, PkiError> {
        let end = self.node_time.now() + valid_for;
        self.ca
            .issue_client_until(name, roles, KeyAlgorithm::Ed25519, Some(end))
    }

    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    /// The admin kubeconfig the control planes hand out through MachineService/Kubeconfig
    /// (Talos renders it from the cluster CA and `cluster.controlPlane.endpoint`; the whole
    /// twin sets its Kubernetes API here). Without one, Kubeconfig answers Unavailable.
    pub fn set_admin_kubeconfig(&self, kubeconfig: String) {
        if let Ok(mut k) = self.shared.admin_kubeconfig.lock() {
            *k = Some(kubeconfig);
        }
    }

    /// Runs `f` on the model brought up to the clock's time, then wakes open streams.
    /// Use it to read node state for the Kubernetes projection or to set faults at run time.
    pub fn with_model<R>(&self, f: impl FnOnce(&mut TalosCluster) -> R) -> R {
        self.shared.with(f)
    }

    /// The observable state of every node, brought up to the clock's time. A read: it
    /// signals [`TalosTwin::changes`] only if due events were applied on the way.
    pub fn observe(&self) -> Vec<NodeObservation> {
        self.shared.read(|m| m.observe())
    }

    /// Reads the model brought up to the clock's time; like [`TalosTwin::observe`], it
    /// signals [`TalosTwin::changes`] only if due events were applied on the way.
    pub fn read<R>(&self, f: impl FnOnce(&TalosCluster) -> R) -> R {
        self.shared.read(f)
    }

    /// When the next scheduled event is due.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.shared.read(|m| m.next_due())
    }

    /// How many times the event driver has woken up.
    pub fn driver_wakeups(&self) -> u64 {
        self.driver_wakeups.load(Ordering::Relaxed)
    }

    /// TLS handshakes completed on the endpoints so far: one per connection a client
    /// opened. A client that keeps its connections shows a number that does not grow with
    /// its calls.
    pub fn handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::Relaxed)
    }

    /// Calls so far per gRPC method (`machine.MachineService/Version`), every endpoint's.
    pub fn calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// A receiver that changes after every change of the model (an RPC acting, or a
    /// scheduled event applied by the twin's driver).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// Applies every event due by the clock's current time.
    pub fn sync(&self) {
        self.shared.sync_now()
    }

    /// Stops every endpoint and waits for them to finish.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }
}

/// Applies scheduled events as they come due on the clock, so subscribers and open
/// streams see reboots and restarts without anyone calling in.
async fn drive(
    shared: Arc<server::Shared>,
    mut stop: watch::Receiver<bool>,
    wakeups: Arc<AtomicU64>,
) {
    loop {
        wakeups.fetch_add(1, Ordering::Relaxed);
        // Subscribe before reading the next due time, so a mutation in between is not missed.
        let mut changed = shared.changed.subscribe();
        let due = shared.next_due();
        let clock = shared.clock.clone();
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            r = changed.changed() => if r.is_err() { return },
            _ = async move {
                match due {
                    Some(t) => clock.sleep_until(t).await,
                    None => std::future::pending::<()>().await,
                }
            } => shared.sync_now(),
        }
    }
}

/// The node's wall clock: the real time the twin started, moved on by the simulated time
/// since. A node checks a client certificate's validity against its own clock (Go's
/// crypto/tls `verifyClientCertificate` with `Config.Time` unset, as apid runs it), so a
/// certificate expires when simulated time passes its end.
#[derive(Clone, Debug)]
struct NodeTime {
    clock: Clock,
    wall_start: std::time::SystemTime,
    sim_start: crate::clock::Timestamp,
}

impl NodeTime {
    fn starting_now(clock: Clock) -> NodeTime {
        let sim_start = clock.now();
        NodeTime {
            clock,
            wall_start: std::time::SystemTime::now(),
            sim_start,
        }
    }

    fn now(&self) -> std::time::SystemTime {
        self.wall_start + self.clock.now().since(self.sim_start)
    }
}

/// The client-certificate check of a node: the OS CA's, at the node's time.
#[derive(Debug)]
struct NodeClientVerifier {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    time: NodeTime,
}

impl rustls::server::danger::ClientCertVerifier for NodeClientVerifier {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let now = rustls::pki_types::UnixTime::since_unix_epoch(
            self.time
                .now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
        );
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The endpoint's TLS: Talos' mutual TLS, a client certificate from the OS CA required.
fn server_tls(
    cert: &IssuedCert,
    ca_der: &[u8],
    time: &NodeTime,
) -> Result<Arc<rustls::ServerConfig>, Box<dyn std::error::Error + Send + Sync>> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca_der.to_vec()))?;
    let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let clients = Arc::new(NodeClientVerifier {
        inner,
        time: time.clone(),
    });
    let key = PrivateKeyDer::Pkcs8(cert.key_der.clone().into());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(clients)
        .with_single_cert(vec![CertificateDer::from(cert.cert_der.clone())], key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

impl Drop for TalosTwin {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
