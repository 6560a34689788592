//! The twin's Kubernetes API server: a simulated cluster (store + controllers on the one
//! clock) served over HTTPS with a bearer token, answering real kubectl and kube-rs.
//!
//! Start it with [`KubeTwin::start`]; drive it through [`KubeTwin::with`] (node up/down,
//! Ready, kubelet version, mirror pods, faults) from the integration layer and tests.
//!
//! Simulated, and how:
//! - REST: discovery (`/version`, `/api`, `/apis`, resource lists with verbs, short names,
//!   subresources incl. `pods/eviction` → policy/v1), list (label/field selectors,
//!   limit/continue), get, create, update (resourceVersion preconditions → 409), delete,
//!   watch (resourceVersion replay, bookmarks, `sendInitialEvents`, 410 Expired as an ERROR
//!   event as the watch cache sends it), merge / strategic-merge / JSON patch, server-side
//!   apply with field ownership, `dryRun=All`, `/scale`, a stub `pods/log`, Tables for
//!   kubectl, metadata-only lists, metav1 Status errors, `/metrics` with
//!   `apiserver_requested_deprecated_apis`, `/openapi/v3` stubs.
//! - Controllers: ReplicaSet/StatefulSet/Deployment/DaemonSet (replacement pods, one-at-a-time
//!   rolling updates), a scheduler (Ready, not cordoned, no NoSchedule taint, local-path PV
//!   node affinity, spread), pod start delay and graceful termination on the clock, pod GC,
//!   PDB status, Longhorn robustness and replica rebuild, the Eviction API per the apiserver.
//!
//! Not simulated: authorization (the one token is cluster-admin), admission and schema
//! validation (`fieldValidation` is accepted and ignored), protobuf, aggregated discovery,
//! deletecollection, finalizers and owner-reference garbage collection, resource
//! requests and priorities, tolerations of ordinary pods, new ReplicaSets per Deployment
//! revision (the twin updates the one ReplicaSet in place), SSA ownership of list items
//! (lists are owned whole), node lease renewal; core/v1 and events.k8s.io/v1 Events are
//! stored apart (the apiserver serves one set of events in both shapes). A successful eviction answers 200 (the
//! documented code; the apiserver's create handler answers 201).

pub mod apply;
pub mod http;
pub mod model;
pub mod patch;
pub mod resources;
pub mod seed;
pub mod select;
pub mod store;
pub mod table;
pub mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
use tokio::task::JoinHandle;

pub use model::{Behaviour, Cluster, DeprecatedApi, Faults};
pub use seed::{KubeSeed, NodeSeed, PdbSeed, Role, VolumeSeed, WorkloadKind, WorkloadSeed};
pub use store::{ApiError, EventType, WatchEvent};

use crate::clock::{Clock, Timestamp};

#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("binding the apiserver socket on 127.0.0.1: {0}")]
    Bind(std::io::Error),
    #[error("writing the kubeconfig to {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("seeding the cluster: {0}")]
    Seed(#[from] ApiError),
}

/// A running simulated apiserver. Dropping it stops serving.
pub struct KubeTwin {
    /// `https://127.0.0.1:PORT`
    pub url: String,
    pub addr: SocketAddr,
    /// `<state_dir>/kubeconfig`
    pub kubeconfig: PathBuf,
    /// PEM of the CA that signed the serving certificate.
    pub ca_pem: String,
    token: String,
    shared: Arc<http::Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl KubeTwin {
    /// Start with the default behaviour delays.
    pub async fn start(clock: Clock, seed: KubeSeed, state_dir: &Path) -> Result<Self, TwinError> {
        Self::start_with(clock, seed, Behaviour::default(), state_dir).await
    }

    pub async fn start_with(
        clock: Clock,
        seed: KubeSeed,
        behaviour: Behaviour,
        state_dir: &Path,
    ) -> Result<Self, TwinError> {
        let cluster = seed.build(behaviour, clock.now())?;
        let cert = tls::generate()?;
        let tls_config = tls::server_config(&cert)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(TwinError::Bind)?;
        let addr = listener.local_addr().map_err(TwinError::Bind)?;
        let token = hex::encode(rand::random::<[u8; 24]>());
        let shared = Arc::new(http::Shared {
            cluster: Mutex::new(cluster),
            clock: clock.clone(),
            token: token.clone(),
            server_address: addr.to_string(),
            kubernetes_version: seed.kubernetes_version.clone(),
        });
        let url = format!("https://{addr}");
        let kubeconfig = state_dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &url, &cert.ca_pem, &token)?;
        let app = http::router(shared.clone());
        let server = tokio::spawn(http::serve(listener, tls_config, app));
        let driver = tokio::spawn(drive(shared.clone()));
        Ok(KubeTwin {
            url,
            addr,
            kubeconfig,
            ca_pem: cert.ca_pem,
            token,
            shared,
            tasks: vec![server, driver],
        })
    }

    /// The bearer token (also in the kubeconfig). Never log it.
    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    /// Run `f` on the cluster, synced to the clock's now (passed to `f`). The cluster is
    /// locked meanwhile: do not call back into the twin (or its HTTP API) from `f`.
    pub fn with<R>(&self, f: impl FnOnce(&mut Cluster, Timestamp) -> R) -> R {
        let mut c = self.shared.lock();
        let now = self.shared.clock.now();
        f(&mut c, now)
    }

    /// Apply everything due at the clock's now.
    pub fn sync(&self) {
        drop(self.shared.lock());
    }
}

impl Drop for KubeTwin {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Keep the model moving with the clock: on every manual `advance`, and a few times a
/// wall-second for scaled clocks, so watchers see changes without a request.
async fn drive(shared: Arc<http::Shared>) {
    let mut ticks = shared.clock.ticks();
    loop {
        tokio::select! {
            changed = ticks.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
        drop(shared.lock());
    }
}

fn write_kubeconfig(path: &Path, url: &str, ca_pem: &str, token: &str) -> Result<(), TwinError> {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ichor-twin\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: ichor-twin-admin\n  user:\n    token: {token}\ncontexts:\n- name: ichor-twin\n  context:\n    cluster: ichor-twin\n    user: ichor-twin-admin\n    namespace: default\ncurrent-context: ichor-twin\n"
    );
    let io = |source| TwinError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    Ok(())
}
