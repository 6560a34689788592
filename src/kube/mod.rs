//! ichor's Kubernetes client (kube-rs): the live inventory (nodes, volumes, static pods, the
//! CNI, the hand-over), the drain primitives the rollout uses (cordon/uncordon that remember
//! who cordoned, eviction through `policy/v1` that never deletes and never forces), the
//! removed-API metric, and Leases/ConfigMaps with optimistic concurrency for the lock and the
//! rollout record. Every error names what was asked.

pub mod access;
pub mod changes;
pub mod drain;
pub mod events;
pub mod inventory;
pub mod lease;
pub mod manifests;
pub mod objects;
mod transport;

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use drain::{DrainOptions, DrainOutcome, EvictOutcome, PodRef};
pub use inventory::{LiveNode, LiveVolume, MirrorPod, WorkloadStatus};
pub use lease::LockState;

/// The annotation ichor puts on a node it cordoned, valued with the rollout (its target
/// commit): ichor uncordons only what it cordoned in the same rollout.
pub const CORDONED_BY_ICHOR: &str = "ichor.dev/cordoned";

/// The field manager ichor cordons and uncordons with. A cordon stays ichor's only while
/// this manager owns the Node's `spec.unschedulable`: an operator's `kubectl uncordon` and
/// later `kubectl cordon` move the field to kubectl's manager (server-side field ownership:
/// kubernetes/kubernetes@master:staging/src/k8s.io/apimachinery/pkg/util/managedfields),
/// whatever ichor's mark still says.
pub const FIELD_MANAGER: &str = "ichor";
/// The annotation an operator puts on a node to hold it out of a rollout.
pub const HOLD: &str = "ichor.dev/hold";

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig {path}: {message}")]
    Config { path: String, message: String },
    #[error("Kubernetes API: {what}: {code} {reason}: {message}")]
    Api {
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("Kubernetes API unreachable: {what}: {detail}")]
    Unreachable { what: String, detail: String },
    #[error("Kubernetes API: {what}: {message}")]
    Reply { what: String, message: String },
}

impl KubeError {
    pub fn kind(&self) -> &'static str {
        match self {
            KubeError::Config { .. } => "config",
            KubeError::Api { code: 409, .. } => "conflict",
            KubeError::Api { code: 404, .. } => "not_found",
            KubeError::Api { .. } => "api",
            KubeError::Unreachable { .. } => "unreachable",
            KubeError::Reply { .. } => "reply",
        }
    }

    /// Worth retrying: 5xx, 429 and a lost connection; anything else is an answer.
    pub fn is_transient(&self) -> bool {
        match self {
            KubeError::Api { code, .. } => *code == 429 || *code >= 500,
            KubeError::Unreachable { .. } => true,
            _ => false,
        }
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, KubeError::Api { code: 409, .. })
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, KubeError::Api { code: 404, .. })
    }

    pub(crate) fn from_kube(what: impl Into<String>, e: kube::Error) -> KubeError {
        let what = what.into();
        match e {
            kube::Error::Api(s) => KubeError::Api {
                what,
                code: s.code,
                reason: s.reason.clone(),
                message: crate::releaseset::excerpt(&s.message, 300),
            },
            other => KubeError::Unreachable {
                what,
                detail: crate::releaseset::excerpt(&with_cause(&other), 300),
            },
        }
    }
}

/// An error with its innermost cause, which is what a person can act on: kube-rs says
/// "client error (Connect)", the OS under it "Connection refused (os error 111)".
fn with_cause(e: &dyn std::error::Error) -> String {
    let top = e.to_string();
    let mut cause = e.source();
    let mut last = None;
    while let Some(c) = cause {
        last = Some(c.to_string());
        cause = c.source();
    }
    match last {
        Some(inner) if !top.contains(&inner) => format!("{top}: {inner}"),
        _ => top,
    }
}

/// The API server's URL as a person may see it: scheme, host, port and path, never
/// userinfo.
fn server_of(uri: &http::Uri) -> String {
    let host = uri.host().unwrap_or("?");
    let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    let path = uri.path().trim_end_matches('/');
    format!(
        "{}://{host}{port}{path}",
        uri.scheme_str().unwrap_or("https")
    )
}

/// A connection to one cluster's API server.
#[derive(Clone)]
pub struct KubeClient {
    pub(crate) client: kube::Client,
    /// The API server, for messages.
    server: String,
    /// Each lease as last seen and when (on ichor's clock) it was first seen so: a lease
    /// expires from the time of observation, never from the holder's clock.
    pub(crate) leases: lease::Observed,
    /// Each lease as this client last wrote it, for the holder's one-write renewal.
    pub(crate) written: lease::Written,
    /// Watch streams this client may hold at once ([`changes::WATCH_STREAMS`]).
    pub(crate) watch_slots: changes::Slots,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient").finish_non_exhaustive()
    }
}

impl KubeClient {
    /// From `--kubeconfig`, else `$KUBECONFIG` / `~/.kube/config`, else the in-cluster
    /// service account — the order kubectl and kube-rs use.
    pub async fn connect(kubeconfig: Option<&Path>) -> Result<KubeClient, KubeError> {
        let config = match kubeconfig {
            Some(path) => {
                let err = |message: String| KubeError::Config {
                    path: path.display().to_string(),
                    message,
                };
                let kc = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
                kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| err(e.to_string()))?
            }
            None => kube::Config::infer().await.map_err(|e| KubeError::Config {
                path: "$KUBECONFIG, ~/.kube/config or the in-cluster service account".into(),
                message: e.to_string(),
            })?,
        };
        // kube-rs retries 429/503/504 by itself, in real time and out of sight. A 429 on an
        // eviction is a PodDisruptionBudget speaking, and every wait must run on ichor's
        // clock: ichor decides about retries itself.
        let mut config = config;
        config.default_retry = false;
        let server = server_of(&config.cluster_url);
        let client = transport::client_of(config).map_err(|e| KubeError::Config {
            path: kubeconfig.map_or("(inferred)".into(), |p| p.display().to_string()),
            message: e.to_string(),
        })?;
        Ok(KubeClient {
            client,
            server,
            leases: Default::default(),
            written: Default::default(),
            watch_slots: Default::default(),
        })
    }

    /// From a kubeconfig held in memory (the admin kubeconfig Talos hands out through its
    /// API); `what` names where it came from in errors. The text is a credential: it is
    /// never logged, and errors never quote it.
    pub async fn from_kubeconfig_text(text: &str, what: &str) -> Result<KubeClient, KubeError> {
        let err = |message: String| KubeError::Config {
            path: what.to_string(),
            message,
        };
        // kube-rs's parse errors quote no values; cut them anyway.
        let kc = Kubeconfig::from_yaml(text)
            .map_err(|e| err(crate::releaseset::excerpt(&e.to_string(), 200)))?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| err(crate::releaseset::excerpt(&e.to_string(), 200)))?;
        config.default_retry = false;
        let server = server_of(&config.cluster_url);
        let client = transport::client_of(config).map_err(|e| err(e.to_string()))?;
        Ok(KubeClient {
            client,
            server,
            leases: Default::default(),
            written: Default::default(),
            watch_slots: Default::default(),
        })
    }

    /// At most `streams` watches at once instead of [`changes::WATCH_STREAMS`]: for an API
    /// server that allows fewer streams per connection.
    pub fn with_watch_streams(mut self, streams: usize) -> KubeClient {
        self.watch_slots = changes::Slots::new(streams);
        self
    }

    /// How many more watches this client may open now.
    pub fn free_watch_streams(&self) -> usize {
        self.watch_slots.free()
    }

    /// `None` when the API server answers at all (an answer, even a refusal, is an
    /// answer); else the one line that says so: the server and the innermost cause.
    pub async fn unreachable(&self) -> Option<String> {
        match self.client.apiserver_version().await {
            Ok(_) | Err(kube::Error::Api(_)) => None,
            Err(e) => {
                let detail = match KubeError::from_kube("get /version", e) {
                    KubeError::Unreachable { detail, .. } => detail,
                    other => other.to_string(),
                };
                Some(format!(
                    "cannot reach the Kubernetes API server {}: {detail}",
                    self.server
                ))
            }
        }
    }

    /// Create the namespace if it does not exist (ichor's own `ichor-system`, for the lock
    /// and the record; `deploy/` creates it too).
    pub async fn ensure_namespace(&self, name: &str) -> Result<(), KubeError> {
        use k8s_openapi::api::core::v1::Namespace;
        let api = Api::<Namespace>::all(self.client.clone());
        let what = format!("namespace {name}");
        if api
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), e))?
            .is_some()
        {
            return Ok(());
        }
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .map_err(|e| KubeError::Reply {
                what: what.clone(),
                message: e.to_string(),
            })?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(KubeError::from_kube(what, e)),
        }
    }

    /// A ConfigMap with its resourceVersion, or `None`.
    pub async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, KubeError> {
        Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(format!("get configmap {namespace}/{name}"), e))
    }

    /// Create or replace a ConfigMap. A replace carries the resourceVersion it read, so a
    /// concurrent writer makes it fail with a conflict (409) instead of being overwritten;
    /// the caller re-reads and decides again.
    pub async fn put_config_map(&self, cm: &ConfigMap) -> Result<ConfigMap, KubeError> {
        let ns = cm.metadata.namespace.clone().unwrap_or_default();
        let name = cm.metadata.name.clone().unwrap_or_default();
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &ns);
        let what = format!("write configmap {ns}/{name}");
        let r = if cm.metadata.resource_version.is_some() {
            api.replace(&name, &PostParams::default(), cm).await
        } else {
            api.create(&PostParams::default(), cm).await
        };
        r.map_err(|e| KubeError::from_kube(what, e))
    }
}
