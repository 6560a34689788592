//! ichor's client for the Talos machine API: mutual TLS from a talosconfig, a call about a
//! node routed through a control-plane endpoint with the `node` metadata key (as talosctl
//! does), failover across endpoints on Unavailable, a deadline on every call measured on
//! ichor's clock, and errors that name the node and the call.
//!
//! A call can be told to avoid an endpoint: the calls that watch a control plane while it
//! reboots must not travel through that control plane. Which node an endpoint *is* is
//! learned from etcd (the endpoint's local member id and the member list), which every
//! control plane answers without `node` metadata.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use prost::Message;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Status};

use super::config::{Endpoint, TalosContext};
use super::proto::common::ContainerdNamespace;
use super::proto::cosi::resource::state_client::StateClient;
use super::proto::cosi::resource::{GetRequest, ListRequest, Resource};
use super::proto::machine::apply_configuration_request::Mode as ApplyMode;
use super::proto::machine::image_service_client::ImageServiceClient;
use super::proto::machine::lifecycle_service_client::LifecycleServiceClient;
use super::proto::machine::machine_service_client::MachineServiceClient;
use super::proto::machine::{
    ApplyConfigurationRequest, EtcdForfeitLeadershipRequest, EtcdMemberListRequest,
    ImagePullRequest, ImageServicePullRequest, InstallArtifactsSource,
    LifecycleServiceUpgradeRequest, ReadRequest, RebootRequest, UpgradeRequest,
};
use super::proto::resource::config::MachineConfigSpec;
use crate::clock::Clock;

/// The deadline of a call when the caller gives none.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// How long dialling one endpoint may take (a network timeout, in real time).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest reply accepted (a machine config with inline manifests is well under this).
const MAX_REPLY: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TalosError {
    #[error("{call} on {node}: unreachable ({detail}; tried {tried})")]
    Unreachable {
        node: String,
        call: &'static str,
        tried: String,
        detail: String,
    },
    #[error("{call} on {node}: no answer within {}s (deadline)", after.as_secs_f64())]
    Deadline {
        node: String,
        call: &'static str,
        after: Duration,
    },
    #[error("{call} on {node}: permission denied by endpoint {endpoint}: {message} (the talosconfig certificate needs the os:admin role for this call)")]
    PermissionDenied {
        node: String,
        call: &'static str,
        endpoint: String,
        message: String,
    },
    #[error("{call} on {node}: not found: {message}")]
    NotFound {
        node: String,
        call: &'static str,
        message: String,
    },
    #[error("{call} on {node}: refused by the node ({code:?}): {message}")]
    Refused {
        node: String,
        call: &'static str,
        code: Code,
        message: String,
    },
    #[error("{call} on {node}: unexpected reply: {message}")]
    Reply {
        node: String,
        call: &'static str,
        message: String,
    },
    #[error("talosconfig context `{context}`: {message}")]
    Tls { context: String, message: String },
    #[error("{call} on {node}: mutual TLS with endpoint {endpoint} failed: {detail} (is the talosconfig's certificate expired, revoked or from another cluster?)")]
    Handshake {
        node: String,
        call: &'static str,
        endpoint: String,
        detail: String,
    },
    #[error("{call} on {node}: the installer exited with code {code} ({}){}", class.describe(), last_lines(last))]
    Installer {
        node: String,
        call: &'static str,
        code: i32,
        class: InstallerFailure,
        /// The installer's last messages, oldest first.
        last: Vec<String>,
    },
}

/// The class of an installer failure, from its exit code. From Talos 1.14 the installer
/// exits with one code per class (siderolabs/talos v1.14.0-rc.1
/// pkg/machinery/constants/constants.go `ExitInvalidInput` … `ExitInstall`, resolved in
/// pkg/installer/exitcode/exitcode.go); before 1.14 every failure is exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallerFailure {
    /// 1: no class (every failure of an installer before 1.14).
    Unknown,
    /// 2: the request or the configuration is wrong; trying again changes nothing.
    InvalidInput,
    /// 3: the node or the image cannot do this; trying again changes nothing.
    Unsupported,
    /// 4: the node's environment (disks, mounts) got in the way.
    Environment,
    /// 5: something the installer needs was not there (a registry, a file).
    Dependency,
    /// 6: reading or writing failed.
    Io,
    /// 7: writing the installation failed.
    Install,
    /// Any other code.
    Other,
}

impl InstallerFailure {
    pub fn from_code(code: i32) -> InstallerFailure {
        match code {
            1 => InstallerFailure::Unknown,
            2 => InstallerFailure::InvalidInput,
            3 => InstallerFailure::Unsupported,
            4 => InstallerFailure::Environment,
            5 => InstallerFailure::Dependency,
            6 => InstallerFailure::Io,
            7 => InstallerFailure::Install,
            _ => InstallerFailure::Other,
        }
    }

    /// Whether trying again may succeed: the environment, dependency, I/O and install
    /// classes (Omni retries these and treats invalid input and unsupported as permanent).
    /// An unclassified failure is not retried: a human reads the installer's messages.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            InstallerFailure::Environment
                | InstallerFailure::Dependency
                | InstallerFailure::Io
                | InstallerFailure::Install
        )
    }

    /// Whether the installer's last messages say its version preflight refused this host
    /// (the upgrade path itself): permanent, though 1.14 exits 4 (environment) for it
    /// (siderolabs/talos@v1.14.0-rc.1:cmd/installer/pkg/install/preflight.go `talosVersion`
    /// tags `UpgradeableFrom`'s refusal EnvironmentTag; pkg/machinery/compatibility
    /// `UpgradeableFrom`: "too old to upgrade", "too new to downgrade", "blacklisted",
    /// "not supported").
    pub fn version_refused(last: &[String]) -> bool {
        last.iter().any(|l| {
            l.contains("pre-flight checks failed")
                && [
                    "too old to upgrade",
                    "too new to downgrade",
                    "blacklisted",
                    "not supported",
                ]
                .iter()
                .any(|w| l.contains(w))
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            InstallerFailure::Unknown => {
                "unclassified: installers before Talos 1.14 exit 1 for every failure"
            }
            InstallerFailure::InvalidInput => "invalid input, permanent",
            InstallerFailure::Unsupported => "unsupported, permanent",
            InstallerFailure::Environment => "environment, retryable",
            InstallerFailure::Dependency => "dependency, retryable",
            InstallerFailure::Io => "I/O, retryable",
            InstallerFailure::Install => "install, retryable",
            InstallerFailure::Other => "unknown exit code",
        }
    }
}

fn last_lines(last: &[String]) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!(
            "; last: {}",
            crate::releaseset::excerpt(&last.join(" | "), 300)
        )
    }
}

impl TalosError {
    /// The error's name, for metrics labels and retry decisions.
    /// The Talos API refuses ichor's credentials (a certificate expired, from a rotated or
    /// another CA, or without the role): no retry or wait changes that, and it is never a
    /// node "not answering".
    pub fn refuses_credentials(&self) -> bool {
        matches!(
            self,
            TalosError::Handshake { .. }
                | TalosError::Tls { .. }
                | TalosError::PermissionDenied { .. }
        )
    }

    pub fn kind(&self) -> &'static str {
        match self {
            TalosError::Unreachable { .. } => "unreachable",
            TalosError::Deadline { .. } => "deadline",
            TalosError::PermissionDenied { .. } => "permission_denied",
            TalosError::NotFound { .. } => "not_found",
            TalosError::Refused { .. } => "refused",
            TalosError::Reply { .. } => "reply",
            TalosError::Tls { .. } | TalosError::Handshake { .. } => "tls",
            TalosError::Installer { .. } => "installer",
        }
    }
}

/// Which upgrade API a node has: `LifecycleService/Upgrade` (Talos ≥ 1.13, no reboot of its
/// own) or the legacy `MachineService/Upgrade` (which drains and reboots by itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeApi {
    Lifecycle,
    Machine,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVersion {
    pub tag: String,
    pub upgrade_api: UpgradeApi,
}

impl NodeVersion {
    fn from_tag(tag: String) -> NodeVersion {
        let v = crate::releaseset::Version::parse(&tag).ok();
        // The new API arrived in 1.13.0-alpha.2; compare on major.minor as Talos's
        // version checks do (a 1.13 pre-release counts as 1.13).
        let upgrade_api = match v {
            Some(v) if (v.major(), v.minor()) >= (1, 13) => UpgradeApi::Lifecycle,
            _ => UpgradeApi::Machine,
        };
        NodeVersion { tag, upgrade_api }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub id: String,
    pub state: String,
    pub healthy: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    pub id: u64,
    pub hostname: String,
    pub peer_urls: Vec<String>,
    pub is_learner: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdStatus {
    pub member_id: u64,
    pub leader: u64,
    pub is_learner: bool,
    pub errors: Vec<String>,
    /// The etcd server's version: Talos fills `protocol_version` from etcd's own status
    /// reply (siderolabs/talos internal/app/machined/internal/server/v1alpha1/
    /// v1alpha1_server.go `EtcdStatus` at v1.13.9). Empty when the node did not say.
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub mode: ApplyMode,
    pub details: String,
    pub warnings: Vec<String>,
}

/// The node's machine configuration as COSI serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineConfig {
    /// The exact YAML as submitted, every document included.
    pub yaml: String,
    /// The resource version (a decimal counter).
    pub version: String,
}

/// Where an image is pulled so that the component that starts next finds it. Both live in
/// the CRI containerd (siderolabs/talos v1.13.9): `System` is its `system` namespace, where
/// the kubelet service pulls and runs the kubelet image
/// (internal/app/machined/pkg/system/services/kubelet.go) and where `talosctl upgrade` pulls
/// the installer by default (cmd/talosctl/cmd/talos/upgrade.go `--namespace system`, mapped
/// to {CRI, NS_SYSTEM} in image.go); `Cri` is `k8s.io`, where pods (static pods included)
/// find theirs. The legacy MachineService/ImagePull always uses the CRI containerd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageNamespace {
    System,
    Cri,
}

impl ImageNamespace {
    fn instance(self) -> super::proto::common::ContainerdInstance {
        use super::proto::common::{ContainerDriver, ContainerdInstance};
        ContainerdInstance {
            driver: ContainerDriver::Cri as i32,
            namespace: self.namespace() as i32,
        }
    }

    fn namespace(self) -> ContainerdNamespace {
        match self {
            ImageNamespace::System => ContainerdNamespace::NsSystem,
            ImageNamespace::Cri => ContainerdNamespace::NsCri,
        }
    }
}

/// The installer's instance, the same for its pull and for LifecycleService/Upgrade, which
/// runs the installer container from that instance's store (internal/app/lifecycle).
pub const INSTALLER_NAMESPACE: ImageNamespace = ImageNamespace::System;

/// How one call is routed and bounded.
#[derive(Debug, Clone, Copy)]
pub struct CallOptions<'a> {
    pub deadline: Duration,
    /// Do not carry the call through this node's endpoint (name or address).
    pub avoid: Option<&'a str>,
}

impl Default for CallOptions<'_> {
    fn default() -> Self {
        CallOptions {
            deadline: DEFAULT_DEADLINE,
            avoid: None,
        }
    }
}

/// What an endpoint is, learned from etcd: its member's hostname and peer addresses.
#[derive(Debug, Clone)]
struct EndpointIdentity {
    hostname: String,
    addresses: Vec<String>,
}

pub struct TalosClient {
    context: TalosContext,
    clock: Clock,
    channels: Mutex<HashMap<usize, Channel>>,
    identities: Mutex<HashMap<usize, EndpointIdentity>>,
    /// The endpoint that answered last; calls start there.
    preferred: Mutex<usize>,
}

impl std::fmt::Debug for TalosClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalosClient")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

fn status_text(s: &Status) -> String {
    crate::releaseset::excerpt(s.message(), 300)
}

impl TalosClient {
    pub fn new(context: TalosContext, clock: Clock) -> TalosClient {
        TalosClient {
            context,
            clock,
            channels: Mutex::new(HashMap::new()),
            identities: Mutex::new(HashMap::new()),
            preferred: Mutex::new(0),
        }
    }

    pub fn context(&self) -> &TalosContext {
        &self.context
    }

    pub fn endpoints(&self) -> &[Endpoint] {
        &self.context.endpoints
    }

    /// The endpoint that carried the last successful call (where the next one starts).
    pub fn last_endpoint(&self) -> Option<&Endpoint> {
        let i = self.preferred.lock().map(|p| *p).ok()?;
        self.context.endpoints.get(i)
    }

    async fn channel(&self, index: usize) -> Result<Channel, String> {
        if let Some(c) = self
            .channels
            .lock()
            .ok()
            .and_then(|m| m.get(&index).cloned())
        {
            return Ok(c);
        }
        let ep = &self.context.endpoints[index];
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.context.ca_pem))
            .identity(Identity::from_pem(
                &self.context.crt_pem,
                &self.context.key_pem,
            ))
            .domain_name(ep.host.clone());
        let channel = Channel::from_shared(ep.uri())
            .map_err(|e| format!("endpoint {ep}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tls_config(tls)
            .map_err(|e| format!("endpoint {ep}: TLS: {e}"))?
            .connect()
            .await
            .map_err(|e| format!("endpoint {ep}: {}", error_chain(&e)))?;
        if let Ok(mut m) = self.channels.lock() {
            m.insert(index, channel.clone());
        }
        Ok(channel)
    }

    /// Run `f` against endpoints until one answers: start with the last one that did, skip
    /// the one to avoid, move on when an endpoint is unreachable or answers Unavailable.
    async fn call<T, F, Fut>(
        &self,
        node: &str,
        call: &'static str,
        opts: CallOptions<'_>,
        f: F,
    ) -> Result<T, TalosError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        // In flight until answered: a simulation driver holds its time still meanwhile
        // (the twin's handlers that wait for simulated time say so), so the deadline
        // measures the node, not how loaded the machine running both is.
        let _busy = self.clock.busy();
        let n = self.context.endpoints.len();
        let start = self.preferred.lock().map(|p| *p).unwrap_or(0);
        let deadline = self.clock.now().plus(opts.deadline);
        let mut queue: Vec<usize> = (0..n).map(|i| (start + i) % n).collect();
        let mut next = 0;
        // Endpoints that are the node to avoid, kept for last: a node is avoided only when
        // another endpoint can carry the call. With one control plane, one endpoint, or a
        // VIP the node holds, the call goes through the node itself (and a node on its way
        // back answers through itself once it is up).
        let mut the_node = Vec::new();
        let mut last_resort = false;
        let mut tried = Vec::new();
        let mut last = "no endpoint left to try".to_string();
        loop {
            let i = match queue.get(next) {
                Some(i) => *i,
                None if !last_resort && !the_node.is_empty() => {
                    queue = std::mem::take(&mut the_node);
                    next = 0;
                    last_resort = true;
                    continue;
                }
                None => break,
            };
            next += 1;
            // Judged one endpoint at a time, so a call asks who an endpoint is only until
            // one that is not the node answers.
            if let (Some(avoid), false) = (opts.avoid, last_resort) {
                let left = deadline.since(self.clock.now());
                if self.endpoint_is(i, avoid, left).await {
                    the_node.push(i);
                    continue;
                }
            }
            tried.push(self.context.endpoints[i].to_string());
            let attempt = async {
                let channel = self.channel(i).await.map_err(Err)?;
                f(channel).await.map_err(Ok)
            };
            let outcome = tokio::select! {
                r = attempt => r,
                _ = self.clock.sleep_until(deadline) => {
                    return Err(TalosError::Deadline { node: node.to_string(), call, after: opts.deadline });
                }
            };
            match outcome {
                Ok(v) => {
                    if let Ok(mut p) = self.preferred.lock() {
                        *p = i;
                    }
                    return Ok(v);
                }
                // A TLS failure is the real error, not "unreachable": every endpoint
                // checks the same certificate, so say so now.
                Err(Err(dial)) if is_tls_failure(&dial) => {
                    return Err(TalosError::Handshake {
                        node: node.to_string(),
                        call,
                        endpoint: self.context.endpoints[i].to_string(),
                        detail: crate::releaseset::excerpt(&dial, 300),
                    })
                }
                // With TLS 1.3 the node judges the client certificate after the client has
                // finished its handshake, so the refusal arrives with the first request: a
                // transport error whose cause is the node's alert (an expired certificate,
                // an unknown CA). Only a transport error carries a cause.
                Err(Ok(s))
                    if std::error::Error::source(&s)
                        .is_some_and(|cause| is_tls_failure(&error_chain(cause))) =>
                {
                    let cause = std::error::Error::source(&s)
                        .map(error_chain)
                        .unwrap_or_default();
                    return Err(TalosError::Handshake {
                        node: node.to_string(),
                        call,
                        endpoint: self.context.endpoints[i].to_string(),
                        detail: crate::releaseset::excerpt(&cause, 300),
                    });
                }
                // Could not dial this endpoint: try the next.
                Err(Err(dial)) => last = dial,
                // The endpoint answered that its apid could not dial the node the call
                // is for (grpc-go's dial error, relayed): every endpoint dials that same
                // node, so asking the others only repeats the answer while it reboots.
                Err(Ok(s))
                    if s.code() == Code::Unavailable
                        && std::error::Error::source(&s).is_none()
                        && s.message().contains("Error while dialing") =>
                {
                    last = format!("{}: {}", self.context.endpoints[i], status_text(&s));
                    break;
                }
                Err(Ok(s)) if s.code() == Code::Unavailable => {
                    last = format!("{}: {}", self.context.endpoints[i], status_text(&s));
                    // A status with a transport cause is our connection failing: it may be
                    // stale (the endpoint rebooted), so dial afresh next time. One the
                    // endpoint sent (apid relaying that the node it forwards to is down)
                    // came over a working connection: redialing would cost a handshake per
                    // call while a node reboots.
                    if std::error::Error::source(&s).is_some() {
                        if let Ok(mut m) = self.channels.lock() {
                            m.remove(&i);
                        }
                    }
                }
                Err(Ok(s)) => return Err(self.typed(node, call, &s, opts.deadline, i)),
            }
        }
        Err(TalosError::Unreachable {
            node: node.to_string(),
            call,
            tried: if tried.is_empty() {
                "none: the talosconfig names no endpoint".into()
            } else {
                tried.join(", ")
            },
            detail: last,
        })
    }

    fn typed(
        &self,
        node: &str,
        call: &'static str,
        s: &Status,
        deadline: Duration,
        endpoint: usize,
    ) -> TalosError {
        let (node, message) = (node.to_string(), status_text(s));
        match s.code() {
            Code::DeadlineExceeded => TalosError::Deadline {
                node,
                call,
                after: deadline,
            },
            // tonic reports its own expired timer as Cancelled "Timeout expired".
            Code::Cancelled if s.message().contains("Timeout expired") => TalosError::Deadline {
                node,
                call,
                after: deadline,
            },
            Code::PermissionDenied | Code::Unauthenticated => TalosError::PermissionDenied {
                node,
                call,
                endpoint: self.context.endpoints[endpoint].to_string(),
                message,
            },
            Code::NotFound => TalosError::NotFound {
                node,
                call,
                message,
            },
            code => TalosError::Refused {
                node,
                call,
                code,
                message,
            },
        }
    }

    /// Whether endpoint `i` is the node `who` (a name or an address).
    async fn endpoint_is(&self, i: usize, who: &str, deadline: Duration) -> bool {
        if self.context.endpoints[i].host == who {
            return true;
        }
        let known = self.identities.lock().ok().and_then(|m| m.get(&i).cloned());
        let id = match known {
            Some(id) => Some(id),
            None => self.identify(i, deadline).await,
        };
        match id {
            Some(id) => id.hostname == who || id.addresses.iter().any(|a| a == who),
            // An endpoint we cannot identify is not known to be the node: keep it.
            None => false,
        }
    }

    async fn identify(&self, i: usize, deadline: Duration) -> Option<EndpointIdentity> {
        let channel = self.channel(i).await.ok()?;
        let work = async {
            let mut c = MachineServiceClient::new(channel).max_decoding_message_size(MAX_REPLY);
            let status = c.etcd_status(()).await.ok()?.into_inner();
            let own = status.messages.first()?.member_status.as_ref()?.member_id;
            let members = c
                .etcd_member_list(EtcdMemberListRequest { query_local: false })
                .await
                .ok()?
                .into_inner();
            let m = members
                .messages
                .first()?
                .members
                .iter()
                .find(|m| m.id == own)?
                .clone();
            Some(EndpointIdentity {
                hostname: m.hostname,
                addresses: m.peer_urls.iter().filter_map(|u| url_host(u)).collect(),
            })
        };
        let id = tokio::select! {
            r = work => r,
            _ = self.clock.sleep(deadline) => None,
        }?;
        // Only an endpoint that is the member's own name or address is that node for good.
        // A VIP, a load balancer or a DNS name answers from whichever node holds it now
        // (Talos moves its VIP when the holder goes down), so it is asked again each time.
        let host = &self.context.endpoints[i].host;
        let own = id.hostname == *host || id.addresses.iter().any(|a| a == host);
        if own {
            if let Ok(mut m) = self.identities.lock() {
                m.insert(i, id.clone());
            }
        }
        Some(id)
    }

    fn request<M>(&self, msg: M, node: &str, deadline: Duration) -> Result<Request<M>, Status> {
        let mut r = Request::new(msg);
        let value = node.parse().map_err(|_| {
            Status::invalid_argument(format!("node `{node}` is not valid metadata"))
        })?;
        r.metadata_mut().insert("node", value);
        // Real servers also learn the deadline (grpc-timeout), so they stop working on it.
        r.set_timeout(deadline);
        Ok(r)
    }

    fn machine(c: Channel) -> MachineServiceClient<Channel> {
        MachineServiceClient::new(c).max_decoding_message_size(MAX_REPLY)
    }

    /// The node's Talos version and which upgrade API it has.
    pub async fn version(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<NodeVersion, TalosError> {
        let r = self
            .call(node, "Version", opts, |c| async move {
                Self::machine(c)
                    .version(self.request((), node, opts.deadline)?)
                    .await
            })
            .await?
            .into_inner();
        let msg = first(r.messages, node, "Version")?;
        node_error(msg.metadata.as_ref(), node, "Version")?;
        let tag = msg.version.map(|v| v.tag).unwrap_or_default();
        if tag.is_empty() {
            return Err(reply(node, "Version", "no version tag"));
        }
        Ok(NodeVersion::from_tag(tag))
    }

    pub async fn services(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Vec<Service>, TalosError> {
        let r = self
            .call(node, "ServiceList", opts, |c| async move {
                Self::machine(c)
                    .service_list(self.request((), node, opts.deadline)?)
                    .await
            })
            .await?
            .into_inner();
        let msg = first(r.messages, node, "ServiceList")?;
        node_error(msg.metadata.as_ref(), node, "ServiceList")?;
        Ok(msg
            .services
            .into_iter()
            .map(|s| Service {
                id: s.id,
                state: s.state,
                healthy: s.health.is_some_and(|h| h.healthy && !h.unknown),
            })
            .collect())
    }

    pub async fn etcd_members(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Vec<EtcdMember>, TalosError> {
        let r = self
            .call(node, "EtcdMemberList", opts, |c| async move {
                Self::machine(c)
                    .etcd_member_list(self.request(
                        EtcdMemberListRequest { query_local: false },
                        node,
                        opts.deadline,
                    )?)
                    .await
            })
            .await?
            .into_inner();
        let msg = first(r.messages, node, "EtcdMemberList")?;
        node_error(msg.metadata.as_ref(), node, "EtcdMemberList")?;
        Ok(msg
            .members
            .into_iter()
            .map(|m| EtcdMember {
                id: m.id,
                hostname: m.hostname,
                peer_urls: m.peer_urls,
                is_learner: m.is_learner,
            })
            .collect())
    }

    pub async fn etcd_status(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<EtcdStatus, TalosError> {
        let r = self
            .call(node, "EtcdStatus", opts, |c| async move {
                Self::machine(c)
                    .etcd_status(self.request((), node, opts.deadline)?)
                    .await
            })
            .await?
            .into_inner();
        let msg = first(r.messages, node, "EtcdStatus")?;
        node_error(msg.metadata.as_ref(), node, "EtcdStatus")?;
        let s = msg
            .member_status
            .ok_or_else(|| reply(node, "EtcdStatus", "no member status"))?;
        Ok(EtcdStatus {
            member_id: s.member_id,
            leader: s.leader,
            is_learner: s.is_learner,
            errors: s.errors,
            version: crate::releaseset::excerpt(s.protocol_version.trim(), 60),
        })
    }

    /// Move etcd leadership off `node`; the member that took it, if the node led.
    pub async fn etcd_forfeit_leadership(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Option<String>, TalosError> {
        let r = self
            .call(node, "EtcdForfeitLeadership", opts, |c| async move {
                Self::machine(c)
                    .etcd_forfeit_leadership(self.request(
                        EtcdForfeitLeadershipRequest {},
                        node,
                        opts.deadline,
                    )?)
                    .await
            })
            .await?
            .into_inner();
        let msg = first(r.messages, node, "EtcdForfeitLeadership")?;
        node_error(msg.metadata.as_ref(), node, "EtcdForfeitLeadership")?;
        Ok(Some(msg.member).filter(|m| !m.is_empty()))
    }

    /// Pre-pull `image` on `node`: ImageService/Pull where the node has the new API,
    /// MachineService/ImagePull before. Returns the name the image is stored under: the
    /// `name@digest` the Pull stream ends with (internal/app/images/images.go `Pull`), or
    /// the reference itself on the legacy API.
    pub async fn pull_image(
        &self,
        node: &str,
        image: &str,
        namespace: ImageNamespace,
        api: UpgradeApi,
        opts: CallOptions<'_>,
    ) -> Result<String, TalosError> {
        match api {
            UpgradeApi::Machine => {
                let r = self
                    .call(node, "ImagePull", opts, |c| async move {
                        Self::machine(c)
                            .image_pull(self.request(
                                ImagePullRequest {
                                    namespace: namespace.namespace() as i32,
                                    reference: image.to_string(),
                                },
                                node,
                                opts.deadline,
                            )?)
                            .await
                    })
                    .await?
                    .into_inner();
                for m in &r.messages {
                    node_error(m.metadata.as_ref(), node, "ImagePull")?;
                }
                Ok(image.to_string())
            }
            UpgradeApi::Lifecycle => {
                let name = self
                    .call(node, "ImageService/Pull", opts, |c| async move {
                        let mut stream = ImageServiceClient::new(c)
                            .pull(self.request(
                                ImageServicePullRequest {
                                    containerd: Some(namespace.instance()),
                                    image_ref: image.to_string(),
                                },
                                node,
                                opts.deadline,
                            )?)
                            .await?
                            .into_inner();
                        use super::proto::machine::image_service_pull_response::Response;
                        let mut name = None;
                        while let Some(m) = stream.message().await? {
                            if let Some(Response::Name(n)) = m.response {
                                name = Some(n);
                            }
                        }
                        Ok(name)
                    })
                    .await?;
                name.filter(|n| !n.is_empty()).ok_or_else(|| {
                    reply(
                        node,
                        "ImageService/Pull",
                        "the pull ended without naming the pulled image",
                    )
                })
            }
        }
    }

    /// ApplyConfiguration of `config` (the whole document set).
    pub async fn apply_configuration(
        &self,
        node: &str,
        config: &str,
        mode: ApplyMode,
        dry_run: bool,
        opts: CallOptions<'_>,
    ) -> Result<Applied, TalosError> {
        let r = self
            .call(node, "ApplyConfiguration", opts, |c| async move {
                Self::machine(c)
                    .apply_configuration(self.request(
                        ApplyConfigurationRequest {
                            data: config.as_bytes().to_vec(),
                            mode: mode as i32,
                            dry_run,
                            try_mode_timeout: None,
                        },
                        node,
                        opts.deadline,
                    )?)
                    .await
            })
            .await?
            .into_inner();
        let msg = first(r.messages, node, "ApplyConfiguration")?;
        node_error(msg.metadata.as_ref(), node, "ApplyConfiguration")?;
        Ok(Applied {
            mode: ApplyMode::try_from(msg.mode).unwrap_or(mode),
            details: msg.mode_details,
            warnings: msg.warnings,
        })
    }

    /// The legacy MachineService/Upgrade (Talos ≤ 1.12): the node drains, installs and
    /// reboots by itself. Returns the acknowledgement.
    pub async fn upgrade_legacy(
        &self,
        node: &str,
        image: &str,
        opts: CallOptions<'_>,
    ) -> Result<String, TalosError> {
        let r = self
            .call(node, "MachineService/Upgrade", opts, |c| async move {
                Self::machine(c)
                    .upgrade(self.request(
                        UpgradeRequest {
                            image: image.to_string(),
                            preserve: false,
                            stage: false,
                            force: false,
                            reboot_mode: 0,
                        },
                        node,
                        opts.deadline,
                    )?)
                    .await
            })
            .await?
            .into_inner();
        let msg = first(r.messages, node, "MachineService/Upgrade")?;
        node_error(msg.metadata.as_ref(), node, "MachineService/Upgrade")?;
        Ok(msg.ack)
    }

    /// LifecycleService/Upgrade (Talos ≥ 1.13), as `talosctl upgrade` does it: pull the
    /// installer into [`INSTALLER_NAMESPACE`] (a no-op when the pre-pull put it there), then
    /// ask for the upgrade naming that containerd instance and the name the pull returned —
    /// upstream runs the installer container from that instance's store and refuses a
    /// request without one ("invalid containerd namespace NS_UNKNOWN"). Streams progress
    /// until the installer's exit code; it does not reboot (ichor's own Reboot follows).
    pub async fn upgrade_lifecycle(
        &self,
        node: &str,
        image: &str,
        opts: CallOptions<'_>,
    ) -> Result<Vec<String>, TalosError> {
        let name = self.pull_installer(node, image, opts).await?;
        self.install_pulled(node, &name, opts).await
    }

    /// Pulls the installer where LifecycleService/Upgrade looks for it; the name it is
    /// stored under (`name@digest`).
    pub async fn pull_installer(
        &self,
        node: &str,
        image: &str,
        opts: CallOptions<'_>,
    ) -> Result<String, TalosError> {
        self.pull_image(
            node,
            image,
            INSTALLER_NAMESPACE,
            UpgradeApi::Lifecycle,
            opts,
        )
        .await
    }

    /// LifecycleService/Upgrade of an installer already pulled (`name` as the pull returned
    /// it). Sent once: a stream that breaks after the node took the request is not retried
    /// on another endpoint (the install runs on without its caller, and a second install on
    /// the same boot overwrites the fallback), it ends as "no exit code".
    pub async fn install_pulled(
        &self,
        node: &str,
        name: &str,
        opts: CallOptions<'_>,
    ) -> Result<Vec<String>, TalosError> {
        self.call(node, "LifecycleService/Upgrade", opts, |c| async move {
            let mut stream = LifecycleServiceClient::new(c)
                .upgrade(self.request(
                    LifecycleServiceUpgradeRequest {
                        containerd: Some(INSTALLER_NAMESPACE.instance()),
                        source: Some(InstallArtifactsSource {
                            image_name: name.to_string(),
                        }),
                    },
                    node,
                    opts.deadline,
                )?)
                .await?
                .into_inner();
            use super::proto::machine::lifecycle_service_install_progress::Response as P;
            let mut progress = Vec::new();
            loop {
                match stream.message().await {
                    Ok(Some(m)) => match m.progress.and_then(|p| p.response) {
                        Some(P::Message(text)) => progress.push(text),
                        Some(P::ExitCode(code)) => return Ok((progress, Some(code))),
                        None => {}
                    },
                    Ok(None) => break,
                    // Taken by the node, then broken: never asked again from here.
                    Err(e) => {
                        progress.push(format!("stream broke: {}", e.message()));
                        break;
                    }
                }
            }
            // Upstream sends the exit code last; a stream without one did not finish.
            Ok((progress, None))
        })
        .await
        .and_then(|(progress, code)| match code {
            Some(0) => Ok(progress),
            Some(code) => Err(TalosError::Installer {
                node: node.to_string(),
                call: "LifecycleService/Upgrade",
                code,
                class: InstallerFailure::from_code(code),
                last: progress
                    .iter()
                    .rev()
                    .take(3)
                    .rev()
                    .map(|l| l.trim().to_string())
                    .collect(),
            }),
            None => Err(reply(
                node,
                "LifecycleService/Upgrade",
                &format!(
                    "the installer's progress ended without an exit code{}",
                    progress
                        .last()
                        .map(|l| format!(" ({})", l.trim()))
                        .unwrap_or_default()
                ),
            )),
        })
    }

    /// Whether the node's lifecycle service is free, asked without risking an install: an
    /// Upgrade with no image name. Upstream takes the service's lock first and answers
    /// FailedPrecondition "another installation/upgrade is already in progress" while an
    /// installer runs; past the lock it refuses the empty name with InvalidArgument
    /// "installer image name is required" (siderolabs/talos@v1.13.9:
    /// internal/app/lifecycle/lifecycle.go `Upgrade`).
    pub async fn lifecycle_idle(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<bool, TalosError> {
        let r = self
            .call(node, "LifecycleService/Upgrade", opts, |c| async move {
                let answer = LifecycleServiceClient::new(c)
                    .upgrade(self.request(
                        LifecycleServiceUpgradeRequest {
                            containerd: Some(INSTALLER_NAMESPACE.instance()),
                            source: Some(InstallArtifactsSource {
                                image_name: String::new(),
                            }),
                        },
                        node,
                        opts.deadline,
                    )?)
                    .await;
                match answer {
                    Ok(_) => Ok(Err("the node took an Upgrade without an image".to_string())),
                    Err(e) if e.code() == tonic::Code::InvalidArgument => Ok(Ok(true)),
                    Err(e)
                        if e.code() == tonic::Code::FailedPrecondition
                            && e.message().contains("already in progress") =>
                    {
                        Ok(Ok(false))
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        r.map_err(|m| reply(node, "LifecycleService/Upgrade", &m))
    }

    pub async fn reboot(&self, node: &str, opts: CallOptions<'_>) -> Result<(), TalosError> {
        let r = self
            .call(node, "Reboot", opts, |c| async move {
                Self::machine(c)
                    .reboot(self.request(RebootRequest { mode: 0 }, node, opts.deadline)?)
                    .await
            })
            .await?
            .into_inner();
        for m in &r.messages {
            node_error(m.metadata.as_ref(), node, "Reboot")?;
        }
        Ok(())
    }

    /// The node's boot id (`/proc/sys/kernel/random/boot_id`): it changes on every boot.
    pub async fn boot_id(&self, node: &str, opts: CallOptions<'_>) -> Result<String, TalosError> {
        let bytes = self
            .call(node, "Read", opts, |c| async move {
                let mut stream = Self::machine(c)
                    .read(self.request(
                        ReadRequest {
                            path: "/proc/sys/kernel/random/boot_id".into(),
                        },
                        node,
                        opts.deadline,
                    )?)
                    .await?
                    .into_inner();
                let mut out = Vec::new();
                while let Some(chunk) = stream.message().await? {
                    if out.len() + chunk.bytes.len() > 4096 {
                        return Err(Status::out_of_range("boot id longer than 4 KiB"));
                    }
                    out.extend(chunk.bytes);
                }
                Ok(out)
            })
            .await?;
        let id = String::from_utf8_lossy(&bytes).trim().to_string();
        if id.is_empty() {
            return Err(reply(node, "Read", "empty boot id"));
        }
        Ok(id)
    }

    /// The admin kubeconfig Talos generates on a control plane (MachineService/Kubeconfig:
    /// one `common.Data` whose bytes are a `.tar.gz` holding the file `kubeconfig`; admin
    /// only; Unimplemented on a worker). The text is a credential: never log it.
    pub async fn kubeconfig(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<String, TalosError> {
        let archive = self
            .call(node, "Kubeconfig", opts, |c| async move {
                let mut stream = Self::machine(c)
                    .kubeconfig(self.request((), node, opts.deadline)?)
                    .await?
                    .into_inner();
                let mut out = Vec::new();
                while let Some(chunk) = stream.message().await? {
                    if let Some(m) = chunk.metadata.as_ref().filter(|m| !m.error.is_empty()) {
                        let code = m
                            .status
                            .as_ref()
                            .map_or(Code::Unknown, |s| Code::from_i32(s.code));
                        return Err(Status::new(code, m.error.clone()));
                    }
                    if out.len() + chunk.bytes.len() > super::archive::MAX_KUBECONFIG {
                        return Err(Status::out_of_range("kubeconfig archive larger than 1 MiB"));
                    }
                    out.extend(chunk.bytes);
                }
                Ok(out)
            })
            .await?;
        super::archive::kubeconfig_from_tar_gz(&archive).map_err(|e| reply(node, "Kubeconfig", &e))
    }

    /// One COSI resource; `None` when the node has no such resource.
    pub async fn get_resource(
        &self,
        node: &str,
        namespace: &str,
        kind: &str,
        id: &str,
        opts: CallOptions<'_>,
    ) -> Result<Option<Resource>, TalosError> {
        let r = self
            .call(node, "cosi Get", opts, |c| async move {
                StateClient::new(c)
                    .max_decoding_message_size(MAX_REPLY)
                    .get(self.request(
                        GetRequest {
                            namespace: namespace.into(),
                            r#type: kind.into(),
                            id: id.into(),
                            options: None,
                        },
                        node,
                        opts.deadline,
                    )?)
                    .await
            })
            .await;
        match r {
            Ok(r) => Ok(r.into_inner().resource),
            Err(TalosError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The node's machine stage (`booting`, `running`, `upgrading`, `rebooting`, …) from its
    /// `runtime/MachineStatuses.runtime.talos.dev/machine` resource (siderolabs/talos v1.12.0
    /// pkg/machinery/resources/runtime/machine_status.go: `stage` in the YAML spec, spelled
    /// as machinestage_enumer.go's lower-case names). `None` when the node keeps no status.
    pub async fn machine_stage(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Option<String>, TalosError> {
        let Some(r) = self
            .get_resource(
                node,
                "runtime",
                "MachineStatuses.runtime.talos.dev",
                "machine",
                opts,
            )
            .await?
        else {
            return Ok(None);
        };
        let yaml = r.spec.map(|s| s.yaml_spec).unwrap_or_default();
        let spec: serde_yaml::Value = serde_yaml::from_str(&yaml)
            .map_err(|e| reply(node, "cosi Get", &format!("MachineStatus spec: {e}")))?;
        Ok(spec
            .get("stage")
            .and_then(serde_yaml::Value::as_str)
            .map(str::to_string))
    }

    /// Talos's own readiness (COSI `runtime/MachineStatuses.runtime.talos.dev/machine`):
    /// `Ok(None)` when the machine is running and ready, else what is unmet (its
    /// `unmetConditions` as "name: reason", or the stage). Upstream's checks are time,
    /// network, the services apid, machined, kubelet (and etcd, trustd on a control plane),
    /// static pods and the Node's Ready (siderolabs/talos@v1.13.9:internal/app/machined/
    /// pkg/controllers/runtime/machine_status.go). A node without the resource: `Ok(None)`.
    pub async fn machine_unready(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Option<String>, TalosError> {
        let Some(r) = self
            .get_resource(
                node,
                "runtime",
                "MachineStatuses.runtime.talos.dev",
                "machine",
                opts,
            )
            .await?
        else {
            return Ok(None);
        };
        let yaml = r.spec.map(|s| s.yaml_spec).unwrap_or_default();
        let spec: serde_yaml::Value = serde_yaml::from_str(&yaml)
            .map_err(|e| reply(node, "cosi Get", &format!("MachineStatus spec: {e}")))?;
        let stage = spec.get("stage").and_then(serde_yaml::Value::as_str);
        let status = spec.get("status");
        let ready = status
            .and_then(|s| s.get("ready"))
            .and_then(serde_yaml::Value::as_bool)
            .unwrap_or(false);
        if ready && stage == Some("running") {
            return Ok(None);
        }
        let unmet: Vec<String> = status
            .and_then(|s| s.get("unmetConditions"))
            .and_then(serde_yaml::Value::as_sequence)
            .map(|conds| {
                conds
                    .iter()
                    .map(|c| {
                        let field = |k: &str| {
                            c.get(k)
                                .and_then(serde_yaml::Value::as_str)
                                .unwrap_or_default()
                        };
                        format!("{}: {}", field("name"), field("reason"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let said = if unmet.is_empty() {
            format!("stage {}", stage.unwrap_or("unknown"))
        } else {
            unmet.join("; ")
        };
        Ok(Some(crate::releaseset::excerpt(&said, 300)))
    }

    /// Every COSI resource of a kind in a namespace.
    pub async fn list_resources(
        &self,
        node: &str,
        namespace: &str,
        kind: &str,
        opts: CallOptions<'_>,
    ) -> Result<Vec<Resource>, TalosError> {
        self.call(node, "cosi List", opts, |c| async move {
            let mut stream = StateClient::new(c)
                .max_decoding_message_size(MAX_REPLY)
                .list(self.request(
                    ListRequest {
                        namespace: namespace.into(),
                        r#type: kind.into(),
                        options: None,
                    },
                    node,
                    opts.deadline,
                )?)
                .await?
                .into_inner();
            let mut out = Vec::new();
            while let Some(m) = stream.message().await? {
                out.extend(m.resource);
            }
            Ok(out)
        })
        .await
    }

    /// Watch one COSI resource until its version differs from `than` (or it appears, when
    /// `than` is `None`), and return it; `None` when it is destroyed. Bounded by the
    /// deadline. The server first sends an empty message (the watch is ready), then the
    /// current state, then changes.
    pub async fn watch_resource_change(
        &self,
        node: &str,
        namespace: &str,
        kind: &str,
        id: &str,
        than: Option<&str>,
        opts: CallOptions<'_>,
    ) -> Result<Option<Resource>, TalosError> {
        use super::proto::cosi::resource::{EventType, WatchOptions, WatchRequest};
        self.call(node, "cosi Watch", opts, |c| async move {
            let mut stream = StateClient::new(c)
                .max_decoding_message_size(MAX_REPLY)
                .watch(self.request(
                    WatchRequest {
                        namespace: namespace.into(),
                        r#type: kind.into(),
                        id: Some(id.into()),
                        options: Some(WatchOptions::default()),
                        api_version: 1,
                    },
                    node,
                    opts.deadline,
                )?)
                .await?
                .into_inner();
            while let Some(msg) = stream.message().await? {
                for ev in msg.event {
                    if let Some(e) = ev.error.filter(|e| !e.is_empty()) {
                        return Err(Status::internal(e));
                    }
                    match EventType::try_from(ev.event_type) {
                        Ok(EventType::Destroyed) if than.is_some() => return Ok(None),
                        Ok(EventType::Created) | Ok(EventType::Updated) => {
                            let version = ev
                                .resource
                                .as_ref()
                                .and_then(|r| r.metadata.as_ref())
                                .map(|m| m.version.as_str());
                            if version.is_some() && version != than {
                                return Ok(ev.resource);
                            }
                        }
                        _ => {}
                    }
                }
            }
            Err(Status::unavailable(
                "the watch ended before the resource changed",
            ))
        })
        .await
    }

    /// The bootstrap manifests Talos holds for the cluster (`Manifests.kubernetes.talos.dev`
    /// in `controlplane`), as (id, YAML) pairs: what `talosctl upgrade-k8s` syncs.
    pub async fn bootstrap_manifests(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Vec<(String, String)>, TalosError> {
        let resources = self
            .list_resources(node, "controlplane", "Manifests.kubernetes.talos.dev", opts)
            .await?;
        Ok(resources
            .into_iter()
            .map(|r| {
                let id = r.metadata.map(|m| m.id).unwrap_or_default();
                let yaml = r.spec.map(|s| s.yaml_spec).unwrap_or_default();
                (id, yaml)
            })
            .collect())
    }

    /// The node's active machine configuration (COSI `MachineConfigs.config.talos.dev`
    /// `v1alpha1`, from `proto_spec`, which holds the exact submitted bytes in every version).
    pub async fn machine_config(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<MachineConfig, TalosError> {
        self.machine_config_resource(node, "v1alpha1", opts)
            .await?
            .ok_or_else(|| {
                reply(
                    node,
                    "cosi Get",
                    "the node has no active machine configuration",
                )
            })
    }

    /// The configuration on the node's disk (COSI `MachineConfigs` id `persistent`, since
    /// Talos 1.10): it differs from the active one while a STAGED configuration waits for
    /// the next reboot or a TRY runs. `None` on a node without that resource.
    pub async fn persistent_machine_config(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Option<MachineConfig>, TalosError> {
        self.machine_config_resource(node, "persistent", opts).await
    }

    async fn machine_config_resource(
        &self,
        node: &str,
        id: &str,
        opts: CallOptions<'_>,
    ) -> Result<Option<MachineConfig>, TalosError> {
        let Some(res) = self
            .get_resource(node, "config", "MachineConfigs.config.talos.dev", id, opts)
            .await?
        else {
            return Ok(None);
        };
        let version = res.metadata.map(|m| m.version).unwrap_or_default();
        let spec = res
            .spec
            .ok_or_else(|| reply(node, "cosi Get", "machine configuration without a spec"))?;
        let decoded = MachineConfigSpec::decode(spec.proto_spec.as_slice()).map_err(|e| {
            reply(
                node,
                "cosi Get",
                &format!("machine configuration spec: {e}"),
            )
        })?;
        let yaml = String::from_utf8(decoded.yaml_marshalled)
            .map_err(|_| reply(node, "cosi Get", "machine configuration is not UTF-8"))?;
        Ok(Some(MachineConfig { yaml, version }))
    }

    /// Whether the node booted a UKI through systemd-boot (`Some(true)`) or not — GRUB
    /// (`Some(false)`), from COSI `runtime/SecurityStates.talos.dev/securitystate`
    /// `bootedWithUKI`, which machined sets from the boot loader's EFI variables
    /// (siderolabs/talos internal/app/machined/pkg/controllers/runtime/security_state.go,
    /// pkg/machinery/resources/runtime/security_status.go at v1.13.9). `None`: the node has
    /// no such resource.
    pub async fn booted_with_uki(
        &self,
        node: &str,
        opts: CallOptions<'_>,
    ) -> Result<Option<bool>, TalosError> {
        /// `talos.resource.definitions.runtime.SecurityStateSpec`, the one field read.
        #[derive(Clone, PartialEq, prost::Message)]
        struct SecurityStateSpec {
            #[prost(bool, tag = "5")]
            booted_with_uki: bool,
        }
        let Some(res) = self
            .get_resource(
                node,
                "runtime",
                "SecurityStates.talos.dev",
                "securitystate",
                opts,
            )
            .await?
        else {
            return Ok(None);
        };
        let spec = res
            .spec
            .ok_or_else(|| reply(node, "cosi Get", "security state without a spec"))?;
        let decoded = SecurityStateSpec::decode(spec.proto_spec.as_slice())
            .map_err(|e| reply(node, "cosi Get", &format!("security state spec: {e}")))?;
        Ok(Some(decoded.booted_with_uki))
    }
}

fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next()?;
    let host = match hostport.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => hostport,
    };
    Some(host.trim_matches(['[', ']']).to_string())
}

fn first<T>(messages: Vec<T>, node: &str, call: &'static str) -> Result<T, TalosError> {
    messages
        .into_iter()
        .next()
        .ok_or_else(|| reply(node, call, "no message in the reply"))
}

fn reply(node: &str, call: &'static str, message: &str) -> TalosError {
    TalosError::Reply {
        node: node.to_string(),
        call,
        message: message.to_string(),
    }
}

/// A node's failure carried in `metadata.error` (how apid reports one node of many).
fn node_error(
    md: Option<&super::proto::common::Metadata>,
    node: &str,
    call: &'static str,
) -> Result<(), TalosError> {
    match md {
        Some(m) if !m.error.is_empty() => Err(TalosError::Refused {
            node: node.to_string(),
            call,
            code: m
                .status
                .as_ref()
                .map_or(Code::Unknown, |s| Code::from_i32(s.code)),
            message: crate::releaseset::excerpt(&m.error, 300),
        }),
        _ => Ok(()),
    }
}

/// Whether a dial error is the TLS handshake failing (a certificate refused either way),
/// as rustls words it, rather than the network.
fn is_tls_failure(dial: &str) -> bool {
    let d = dial.to_ascii_lowercase();
    [
        "certificate",
        "received fatal alert",
        "handshake",
        "unknownca",
        "unknown issuer",
    ]
    .iter()
    .any(|k| d.contains(k))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_api_follows_the_version() {
        assert_eq!(
            NodeVersion::from_tag("v1.12.6".into()).upgrade_api,
            UpgradeApi::Machine
        );
        assert_eq!(
            NodeVersion::from_tag("v1.13.0".into()).upgrade_api,
            UpgradeApi::Lifecycle
        );
        assert_eq!(
            NodeVersion::from_tag("v1.13.0-beta.0".into()).upgrade_api,
            UpgradeApi::Lifecycle
        );
        assert_eq!(
            NodeVersion::from_tag("garbage".into()).upgrade_api,
            UpgradeApi::Machine
        );
    }

    #[test]
    fn hosts_of_peer_urls() {
        assert_eq!(
            url_host("https://10.5.0.2:2380").as_deref(),
            Some("10.5.0.2")
        );
        assert_eq!(
            url_host("https://[fd00::2]:2380").as_deref(),
            Some("fd00::2")
        );
        assert_eq!(url_host("cp-1").as_deref(), Some("cp-1"));
    }
}
