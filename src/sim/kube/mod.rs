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
//!   rolling updates; DaemonSets by `maxUnavailable`, or `OnDelete`), a scheduler (Ready, not
//!   cordoned, no NoSchedule taint, local-path PV node affinity, spread, the Multi-Attach wait
//!   of a ReadWriteOnce CSI volume), pod start delay and graceful termination on the clock,
//!   pod GC, PDB status, Longhorn robustness, replica re-sync and rebuild, VolumeAttachments
//!   (attach-detach controller and CSI external-attacher), the Eviction API per the
//!   apiserver.
//!
//! Authentication and RBAC as the apiserver's (`rbac`): the admin token is `system:masters`,
//! ServiceAccount tokens come from TokenRequest and are judged by the Roles and bindings held.
//!
//! Not simulated: admission and schema
//! validation (`fieldValidation` is accepted and ignored), protobuf, aggregated discovery,
//! deletecollection, finalizers and owner-reference garbage collection, resource
//! requests and priorities, tolerations of ordinary pods, new ReplicaSets per Deployment
//! revision (the twin updates the one ReplicaSet in place), SSA ownership of list items
//! (lists are owned whole); core/v1 and events.k8s.io/v1 Events are
//! stored apart (the apiserver serves one set of events in both shapes). A successful eviction answers 201 with a
//! `Status`, as the apiserver's create handler does.

pub mod apply;
pub mod audit;
pub mod http;
pub mod metrics;
pub mod model;
pub mod patch;
pub mod rbac;
pub mod resources;
pub mod seed;
pub mod select;
pub mod store;
pub mod table;
pub mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::sim::faults::FaultHook;
use crate::sim::net::NetLimits;
use crate::sim::state::{self, StateError};

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
    #[error("writing the kubeconfig: {0}")]
    Kubeconfig(#[from] StateError),
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
    stop: watch::Sender<bool>,
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
        Self::start_with_limits(clock, seed, behaviour, NetLimits::default(), state_dir).await
    }

    /// Like [`KubeTwin::start_with`], with the connection limits of the HTTPS listener.
    pub async fn start_with_limits(
        clock: Clock,
        seed: KubeSeed,
        behaviour: Behaviour,
        limits: NetLimits,
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
            fault_hook: Mutex::new(None),
            poke: Notify::new(),
            driver_wakeups: AtomicU64::new(0),
            audit: Default::default(),
            tokens: Default::default(),
            gauges: Default::default(),
            connections: Default::default(),
        });
        let url = format!("https://{addr}");
        let kubeconfig = state_dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &url, &cert.ca_pem, &token)?;
        let app = http::router(shared.clone());
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(http::serve(
            listener,
            tls_config,
            app,
            limits,
            shared.connections.clone(),
            stopped,
        ));
        let driver = tokio::spawn(drive(shared.clone()));
        Ok(KubeTwin {
            url,
            addr,
            kubeconfig,
            ca_pem: cert.ca_pem,
            token,
            shared,
            stop,
            tasks: vec![server, driver],
        })
    }

    /// Lets `POST /_twin/faults` reach the Talos and GitHub sides (the whole twin sets it).
    pub fn set_fault_hook(&self, hook: Arc<dyn FaultHook>) {
        *self
            .shared
            .fault_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    /// How many times the background driver has woken up. An idle twin wakes only when
    /// something is due on the clock.
    pub fn driver_wakeups(&self) -> u64 {
        self.shared.driver_wakeups.load(Ordering::Relaxed)
    }

    /// How many TCP connections the API server has accepted.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Every distinct request the API server answered after authentication (and the
    /// public `/version`, `/healthz`), as an authorizer sees it.
    pub fn audit(&self) -> &audit::Audit {
        &self.shared.audit
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
        let r = {
            let mut c = self.shared.lock();
            let now = self.shared.clock.now();
            f(&mut c, now)
        };
        // `f` may have scheduled something: let the driver look at the next due time.
        self.shared.poke.notify_one();
        r
    }

    /// Apply everything due at the clock's now.
    pub fn sync(&self) {
        drop(self.shared.lock());
    }
}

impl Drop for KubeTwin {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Keep the model moving with the clock, so watchers see changes without a request: sleep
/// until the next thing the controllers have due, or until the cluster changes (which may
/// schedule something sooner). An idle cluster with nothing due sleeps for good.
async fn drive(shared: Arc<http::Shared>) {
    let mut changes = shared.lock().store.subscribe_all();
    loop {
        // A due time already past after a sync is work waiting on a change (a replica with
        // no node to rebuild on, a pod with no node to run on), not on the clock.
        let due = {
            let c = shared.lock();
            c.next_due().filter(|t| *t > c.now())
        };
        let clock = shared.clock.clone();
        tokio::select! {
            _ = async move {
                match due {
                    Some(t) => clock.sleep_until(t).await,
                    None => std::future::pending::<()>().await,
                }
            } => {}
            // One look covers every change so far.
            r = changes.changed() => if r.is_err() {
                return;
            },
            _ = shared.poke.notified() => {}
        }
        shared.driver_wakeups.fetch_add(1, Ordering::Relaxed);
    }
}

fn write_kubeconfig(path: &Path, url: &str, ca_pem: &str, token: &str) -> Result<(), TwinError> {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ichor-twin\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: ichor-twin-admin\n  user:\n    token: {token}\ncontexts:\n- name: ichor-twin\n  context:\n    cluster: ichor-twin\n    user: ichor-twin-admin\n    namespace: default\ncurrent-context: ichor-twin\n"
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        state::prepare_dir(dir)?;
    }
    state::write_private(path, text.as_bytes())?;
    Ok(())
}
