//! The Talos machine API over gRPC with mutual TLS: one endpoint per node, each routing on
//! the `node` metadata key as apid does. Every handler locks the model, brings it up to the
//! clock's time, acts, and wakes the open streams.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::clock::{Clock, Timestamp};
use crate::talos::proto::common::{self, ContainerdNamespace};
use crate::talos::proto::cosi::resource as cosi;
use crate::talos::proto::machine::{self, apply_configuration_request, machine_status_event};
use crate::talos::proto::resource::config::MachineConfigSpec;

use super::config::Component;
use super::model::{ApplyMode, ImageStore, Stage, TalosCluster, TalosError};

/// The model, the clock, and a revision counter that changes after every mutation so open
/// streams re-check the model.
pub(crate) struct Shared {
    pub(crate) model: Mutex<TalosCluster>,
    pub(crate) clock: Clock,
    pub(crate) changed: watch::Sender<u64>,
    /// What MachineService/Kubeconfig returns on a control plane, once a Kubernetes API runs.
    pub(crate) admin_kubeconfig: Mutex<Option<String>>,
    /// The call log, `<state-dir>/talos-audit.jsonl`: one JSON line per call that acts on a
    /// node (or could), so a test or a rehearsal counts what reached each node per boot.
    pub(crate) audit: Option<Mutex<std::fs::File>>,
}

/// What a call found on its node when it arrived.
pub(crate) struct Receipt {
    at: Timestamp,
    node: String,
    boot_id: String,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, TalosCluster> {
        // A poisoned lock means a handler panicked; the model itself stays usable.
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The model brought up to the clock's time. Applying due events is a change: the
    /// streams and the projector are woken for it (and only then).
    pub(crate) fn lock_synced(&self) -> MutexGuard<'_, TalosCluster> {
        let mut m = self.lock();
        if m.sync(self.clock.now()) > 0 {
            self.changed.send_modify(|v| *v += 1);
        }
        m
    }

    /// Runs `f` on the model brought up to the clock's time, then wakes the streams: `f`
    /// may change it.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut TalosCluster) -> R) -> R {
        let r = f(&mut self.lock_synced());
        self.changed.send_modify(|v| *v += 1);
        r
    }

    /// Runs `f` on the model brought up to the clock's time without counting as a change,
    /// so a reader (the projector) does not wake itself.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&TalosCluster) -> R) -> R {
        f(&self.lock_synced())
    }

    pub(crate) fn next_due(&self) -> Option<Timestamp> {
        self.lock().next_due()
    }

    /// The node's name and boot id as a call finds them on arrival.
    pub(crate) fn receipt(&self, node: usize) -> Receipt {
        self.read(|m| Receipt {
            at: m.now(),
            node: m.node(node).name.clone(),
            boot_id: m.node(node).boot_id.clone(),
        })
    }

    /// Appends one line to the call log: the call as it arrived, and the gRPC code it was
    /// answered with. A log that cannot be written is said once per call, never fatal.
    pub(crate) fn audit(
        &self,
        r: &Receipt,
        method: &str,
        request: serde_json::Value,
        code: tonic::Code,
    ) {
        use std::io::Write;
        let Some(file) = &self.audit else { return };
        let line = serde_json::json!({
            "at": r.at.rfc3339(),
            "node": r.node,
            "method": method,
            "bootId": r.boot_id,
            "request": request,
            "code": code as i32,
        });
        let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = writeln!(f, "{line}") {
            tracing::warn!(error = %e, "talos twin: cannot append to the call log");
        }
    }

    /// Applies due events; wakes the streams only if something happened.
    pub(crate) fn sync_now(&self) {
        drop(self.lock_synced());
    }

    /// Waits until the model may have changed: a mutation, or the next scheduled event
    /// coming due on the clock.
    async fn wait_change(&self, rx: &mut watch::Receiver<u64>) -> bool {
        let due = self.lock().next_due();
        let clock = self.clock.clone();
        // A stream's caller is busy while this waits for the world to change.
        let _parked = clock.parked();
        tokio::select! {
            r = rx.changed() => r.is_ok(),
            _ = async move {
                match due {
                    Some(t) => clock.sleep_until(t).await,
                    None => std::future::pending::<()>().await,
                }
            } => true,
        }
    }
}

/// The caller's `grpc-timeout` (gRPC over HTTP/2: digits and a unit, H M S m u n), read as
/// a span of the twin's clock: a deadline judged on simulated time, as a real node judges
/// it on its own.
fn grpc_timeout(md: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn status(e: TalosError) -> Status {
    match e {
        TalosError::Unavailable(m) => Status::unavailable(m),
        TalosError::NotFound(m) => Status::not_found(m),
        TalosError::InvalidArgument(m) => Status::invalid_argument(m),
        TalosError::Unimplemented(m) => Status::unimplemented(m),
        TalosError::FailedPrecondition(m) => Status::failed_precondition(m),
        TalosError::Internal(m) => Status::internal(m),
        TalosError::Unknown(m) => Status::unknown(m),
    }
}

/// Who may call a method (the authz table of the facts sheet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Admin,
    Operator,
    Reader,
    EtcdReader,
}

fn allowed(roles: &[String], access: Access) -> bool {
    roles.iter().any(|r| {
        matches!(
            (r.as_str(), access),
            ("os:admin", _)
                | (
                    "os:operator",
                    Access::Operator | Access::Reader | Access::EtcdReader
                )
                | ("os:reader", Access::Reader | Access::EtcdReader)
                | ("os:etcd:backup", Access::EtcdReader)
        )
    })
}

/// One node's API endpoint.
#[derive(Clone)]
pub(crate) struct NodeApi {
    pub(crate) shared: Arc<Shared>,
    /// Index of the node this endpoint belongs to.
    pub(crate) endpoint: usize,
}

enum Targets {
    One(usize),
    Many(Vec<(String, Result<usize, Status>)>),
}

/// Per-node reply messages carry `common.Metadata` at field 1.
trait WithMetadata: Default {
    fn set_metadata(&mut self, metadata: common::Metadata);
}

macro_rules! with_metadata {
    ($($t:ty),* $(,)?) => {
        $(impl WithMetadata for $t {
            fn set_metadata(&mut self, metadata: common::Metadata) {
                self.metadata = Some(metadata);
            }
        })*
    };
}

with_metadata!(
    machine::ApplyConfiguration,
    machine::EtcdForfeitLeadership,
    machine::EtcdMembers,
    machine::EtcdStatus,
    machine::ImagePull,
    machine::Reboot,
    machine::ServiceList,
    machine::Upgrade,
    machine::Version,
);

/// What apid reports for a node that failed in a one-to-many call.
fn error_metadata(hostname: String, e: &Status) -> common::Metadata {
    common::Metadata {
        hostname,
        error: e.message().to_string(),
        status: Some(crate::talos::proto::google::rpc::Status {
            code: e.code() as i32,
            message: e.message().to_string(),
            details: Vec::new(),
        }),
    }
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send + 'static>>;

fn stream_of<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> Stream<T> {
    Box::pin(ReceiverStream::new(rx))
}

impl NodeApi {
    /// The caller's roles (one per Subject O of the client certificate) must allow `access`.
    fn authorize<T>(&self, req: &Request<T>, access: Access) -> Result<(), Status> {
        let roles = match req.peer_certs() {
            Some(certs) => match certs.first() {
                Some(leaf) => crate::sim::pki::subject_organizations(leaf.as_ref())
                    .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?,
                None => return Err(Status::unauthenticated("no client certificate")),
            },
            None => return Err(Status::unauthenticated("no client certificate")),
        };
        if allowed(&roles, access) {
            Ok(())
        } else {
            Err(Status::permission_denied("not authorized"))
        }
    }

    /// Resolves one target as apid would dial it: by name or simulated IP.
    fn resolve(&self, m: &TalosCluster, target: &str) -> Result<usize, Status> {
        if target.contains(':') && target.parse::<std::net::IpAddr>().is_err() {
            return Err(Status::invalid_argument(format!(
                "invalid target {target:?}"
            )));
        }
        let index = m.find(target).ok_or_else(|| {
            Status::unavailable(format!(
                "connection error: desc = \"transport: Error while dialing: dial tcp {target}:50000: no route to host\""
            ))
        })?;
        if index != self.endpoint {
            if !m.node(self.endpoint).is_control_plane() {
                return Err(Status::permission_denied("no request forwarding"));
            }
            // apid dials the target's apid and relays grpc-go's dial error as the call's
            // status (siderolabs/talos internal/app/apid/pkg/backend/apid.go `GetConnection`;
            // the text is grpc-go's transport error): the endpoint itself answered, its
            // connection is fine.
            if m.check_up(index).is_err() {
                return Err(Status::unavailable(format!(
                    "connection error: desc = \"transport: Error while dialing: dial tcp {}:50000: connect: connection refused\"",
                    m.node(index).ip
                )));
            }
        }
        Ok(index)
    }

    /// Authorizes the caller and resolves the target node: the endpoint itself, or the one
    /// named by `node` metadata (forwarded as apid would). `nodes` is refused: apid allows
    /// one-to-many only for MachineService, and the twin fans out its unary calls and Read only.
    fn route<T>(&self, req: &Request<T>, access: Access) -> Result<usize, Status> {
        match self.targets(req, access)? {
            Targets::One(node) => Ok(node),
            Targets::Many(_) => Err(Status::invalid_argument(
                "one-2-many proxying is not supported for this method",
            )),
        }
    }

    /// Like [`NodeApi::route`], but `nodes` metadata gives one entry per listed target, each
    /// with the target as given and either its node or the error to report for it.
    fn targets<T>(&self, req: &Request<T>, access: Access) -> Result<Targets, Status> {
        self.authorize(req, access)?;
        let md = req.metadata();
        let m = self.shared.lock_synced();
        m.check_up(self.endpoint).map_err(status)?;
        let text = |v: &tonic::metadata::MetadataValue<tonic::metadata::Ascii>| {
            v.to_str()
                .map(str::to_string)
                .map_err(|_| Status::invalid_argument("node metadata is not ASCII"))
        };
        if md.get("nodes").is_some() {
            let mut names = Vec::new();
            for v in md.get_all("nodes") {
                names.extend(
                    text(v)?
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string),
                );
            }
            let many: Vec<_> = names
                .into_iter()
                .map(|name| {
                    let node = self.resolve(&m, &name);
                    (name, node)
                })
                .collect();
            if many
                .iter()
                .any(|(_, r)| matches!(r, Err(e) if e.code() == tonic::Code::PermissionDenied))
            {
                return Err(Status::permission_denied("no request forwarding"));
            }
            return Ok(Targets::Many(many));
        }
        let targets: Vec<_> = md.get_all("node").iter().collect();
        match targets.as_slice() {
            [] => Ok(Targets::One(self.endpoint)),
            [one] => Ok(Targets::One(self.resolve(&m, &text(one)?)?)),
            _ => Err(Status::invalid_argument(
                "node metadata must be single-valued",
            )),
        }
    }

    /// A unary MachineService call: one-to-one, or fanned out over `nodes` with each reply
    /// tagged with `metadata.hostname` and per-node failures reported in `metadata.error`
    /// while the call itself succeeds, as apid aggregates them.
    async fn unary<Req, Msg, F, Fut>(
        &self,
        request: Request<Req>,
        access: Access,
        call: F,
    ) -> Result<Vec<Msg>, Status>
    where
        Req: Clone + Send,
        Msg: WithMetadata + Send,
        F: Fn(NodeApi, usize, Req) -> Fut + Send + Sync,
        Fut: std::future::Future<Output = Result<Msg, Status>> + Send,
    {
        match self.targets(&request, access)? {
            Targets::One(node) => Ok(vec![call(self.clone(), node, request.into_inner()).await?]),
            Targets::Many(targets) => {
                let req = request.into_inner();
                let mut out = Vec::with_capacity(targets.len());
                for (hostname, node) in targets {
                    let reply = match node {
                        Ok(node) => call(self.clone(), node, req.clone()).await,
                        Err(e) => Err(e),
                    };
                    let (mut msg, error) = match reply {
                        Ok(msg) => (msg, None),
                        Err(e) => (Msg::default(), Some(e)),
                    };
                    msg.set_metadata(match error {
                        Some(e) => error_metadata(hostname, &e),
                        None => common::Metadata {
                            hostname,
                            ..Default::default()
                        },
                    });
                    out.push(msg);
                }
                Ok(out)
            }
        }
    }

    async fn apply_configuration_one(
        &self,
        node: usize,
        req: machine::ApplyConfigurationRequest,
    ) -> Result<machine::ApplyConfiguration, Status> {
        let logged = serde_json::json!({
            "mode": req.mode,
            "dryRun": req.dry_run,
            "tryModeTimeout": req.try_mode_timeout.as_ref().map(|d| d.seconds),
        });
        self.audited(
            node,
            "machine.MachineService/ApplyConfiguration",
            logged,
            self.apply_configuration_inner(node, req),
        )
        .await
    }

    async fn apply_configuration_inner(
        &self,
        node: usize,
        req: machine::ApplyConfigurationRequest,
    ) -> Result<machine::ApplyConfiguration, Status> {
        let mode = ApplyMode::from_i32(req.mode)
            .ok_or_else(|| Status::invalid_argument(format!("unknown apply mode {}", req.mode)))?;
        let try_timeout = req
            .try_mode_timeout
            .map(|d| Duration::from_secs(d.seconds.max(0) as u64));
        // Fault: a slow apply waits on the twin's clock, so the caller's deadline fires first.
        let delay = {
            let m = self.shared.lock();
            m.faults.slow_apply.get(&m.node(node).name).copied()
        };
        if let Some(d) = delay {
            let _parked = self.shared.clock.parked();
            self.shared.clock.sleep(d).await;
        }
        let outcome = self
            .sync_with(|m| m.apply_configuration(node, &req.data, mode, req.dry_run, try_timeout))
            .map_err(status)?;
        let mode = apply_configuration_request::Mode::try_from(outcome.mode as i32)
            .unwrap_or(apply_configuration_request::Mode::NoReboot);
        Ok(machine::ApplyConfiguration {
            metadata: None,
            warnings: outcome.warnings,
            mode: mode as i32,
            mode_details: outcome.mode_details,
        })
    }

    async fn etcd_forfeit_leadership_one(
        &self,
        node: usize,
        _request: machine::EtcdForfeitLeadershipRequest,
    ) -> Result<machine::EtcdForfeitLeadership, Status> {
        let member = self
            .audited(
                node,
                "machine.MachineService/EtcdForfeitLeadership",
                serde_json::json!({}),
                async {
                    self.sync_with(|m| m.forfeit_leadership(node))
                        .map_err(status)
                },
            )
            .await?;
        Ok(machine::EtcdForfeitLeadership {
            metadata: None,
            member,
        })
    }

    async fn etcd_member_list_one(
        &self,
        node: usize,
        _request: machine::EtcdMemberListRequest,
    ) -> Result<machine::EtcdMembers, Status> {
        let members = self.read_model(|m| {
            m.check_etcd(node)?;
            Ok(m.etcd_members())
        });
        let members = members.map_err(status)?;
        Ok(machine::EtcdMembers {
            metadata: None,
            legacy_members: members.iter().map(|m| m.hostname.clone()).collect(),
            members: members
                .iter()
                .map(|m| machine::EtcdMember {
                    id: m.id,
                    hostname: m.hostname.clone(),
                    peer_urls: vec![format!("https://{}:2380", m.ip)],
                    client_urls: vec![format!("https://{}:2379", m.ip)],
                    is_learner: false,
                })
                .collect(),
        })
    }

    async fn etcd_status_one(
        &self,
        node: usize,
        _request: (),
    ) -> Result<machine::EtcdStatus, Status> {
        let member_status = self
            .read_model(|m| {
                m.check_etcd(node)?;
                let n = m.node(node);
                let (leader, errors) = m.etcd_status(node);
                // etcd runs the pinned image, else the release's default.
                let pinned = n.pinned_etcd_version();
                let version = pinned.as_deref().unwrap_or(etcd_version(n.minor()));
                Ok(machine::EtcdMemberStatus {
                    protocol_version: version.to_string(),
                    db_size: 24 << 20,
                    db_size_in_use: 12 << 20,
                    leader,
                    raft_index: m.raft_term() * 1000,
                    raft_term: m.raft_term(),
                    raft_applied_index: m.raft_term() * 1000,
                    errors,
                    is_learner: false,
                    member_id: n.etcd_member_id,
                    storage_version: version
                        .rsplit_once('.')
                        .map_or("", |(mm, _)| mm)
                        .to_string()
                        + ".0",
                })
            })
            .map_err(status)?;
        Ok(machine::EtcdStatus {
            metadata: None,
            member_status: Some(member_status),
        })
    }

    async fn image_pull_one(
        &self,
        node: usize,
        req: machine::ImagePullRequest,
    ) -> Result<machine::ImagePull, Status> {
        let logged = serde_json::json!({ "image": req.reference, "namespace": req.namespace });
        self.audited(node, "machine.MachineService/ImagePull", logged, async {
            let store = legacy_namespace(req.namespace)?;
            self.sync_with(|m| m.pull_image(node, store, &req.reference))
                .map_err(status)
        })
        .await?;
        Ok(machine::ImagePull { metadata: None })
    }

    async fn reboot_one(
        &self,
        node: usize,
        request: machine::RebootRequest,
    ) -> Result<machine::Reboot, Status> {
        let mode = request.mode;
        let logged = serde_json::json!({ "mode": mode });
        let actor_id = self
            .audited(node, "machine.MachineService/Reboot", logged, async {
                self.sync_with(|m| {
                    if mode == machine::reboot_request::Mode::Force as i32
                        && m.node(node).minor() < 12
                    {
                        return Err(TalosError::InvalidArgument(
                            "reboot mode FORCE is supported since Talos v1.12".into(),
                        ));
                    }
                    m.reboot(node)
                })
                .map_err(status)
            })
            .await?;
        Ok(machine::Reboot {
            metadata: None,
            actor_id,
        })
    }

    async fn service_list_one(
        &self,
        node: usize,
        _request: (),
    ) -> Result<machine::ServiceList, Status> {
        let services = self.read_model(|m| {
            let n = m.node(node);
            let at = Some(timestamp(m.now()));
            let mut ids = vec!["apid", "containerd", "cri"];
            if n.is_control_plane() {
                ids.push("etcd");
            }
            ids.extend(["kubelet", "machined"]);
            if n.is_control_plane() {
                ids.push("trustd");
            }
            ids.push("udevd");
            ids.into_iter()
                .map(|id| {
                    let healthy = match id {
                        "kubelet" => n.kubelet.healthy,
                        // A member cut off from its peers fails its health check.
                        "etcd" => m.etcd_has_quorum() && !m.etcd_unhealthy(node),
                        _ => true,
                    };
                    let state = if id == "kubelet" && !healthy {
                        "Starting"
                    } else {
                        "Running"
                    };
                    machine::ServiceInfo {
                        id: id.to_string(),
                        state: state.to_string(),
                        events: Some(machine::ServiceEvents {
                            events: vec![machine::ServiceEvent {
                                msg: format!("Service {state}"),
                                state: state.to_string(),
                                ts: at,
                            }],
                        }),
                        health: Some(machine::ServiceHealth {
                            unknown: false,
                            healthy,
                            last_message: String::new(),
                            last_change: at,
                        }),
                    }
                })
                .collect()
        });
        Ok(machine::ServiceList {
            metadata: None,
            services,
        })
    }

    async fn upgrade_one(
        &self,
        node: usize,
        req: machine::UpgradeRequest,
        deadline: Option<Duration>,
    ) -> Result<machine::Upgrade, Status> {
        let request = serde_json::json!({
            "image": req.image, "preserve": req.preserve, "stage": req.stage, "force": req.force,
        });
        let actor_id = self
            .audited(node, "machine.MachineService/Upgrade", request, async {
                // The installer is pulled (and validated) before the call answers
                // (siderolabs/talos@v1.12.11:internal/app/machined/internal/server/v1alpha1/
                // v1alpha1_server.go `Upgrade` → internal/pkg/install/pull.go
                // `PullAndValidateInstallerImage`), on the twin's clock; the caller's
                // grpc-timeout, judged on that clock too, cancels the pull.
                let pull = self.read_model(|m| {
                    m.check_up(node).ok()?;
                    m.legacy_installer_pull(node, &req.image)
                });
                if let Some(d) = pull {
                    let _parked = self.shared.clock.parked();
                    match deadline {
                        Some(t) if t < d => {
                            self.shared.clock.sleep(t).await;
                            return Err(Status::deadline_exceeded(format!(
                                "context deadline exceeded: pulling {}",
                                req.image
                            )));
                        }
                        _ => self.shared.clock.sleep(d).await,
                    }
                }
                self.sync_with(|m| m.upgrade_legacy(node, &req.image, req.force))
                    .map_err(status)
            })
            .await?;
        Ok(machine::Upgrade {
            metadata: None,
            ack: "Upgrade request received".into(),
            actor_id,
        })
    }

    async fn version_one(&self, node: usize, _request: ()) -> Result<machine::Version, Status> {
        let tag = self.read_model(|m| m.node(node).talos_version.clone());
        Ok(machine::Version {
            metadata: None,
            version: Some(machine::VersionInfo {
                sha: format!("{:08x}", super::model::fnv1a(&tag) as u32),
                tag,
                built: String::new(),
                go_version: "go1.24.6".into(),
                os: "linux".into(),
                arch: "amd64".into(),
            }),
            platform: Some(machine::PlatformInfo {
                name: "metal".into(),
                mode: "metal".into(),
            }),
            features: Some(machine::FeaturesInfo { rbac: true }),
        })
    }

    fn sync_with<R>(&self, f: impl FnOnce(&mut TalosCluster) -> R) -> R {
        self.shared.with(f)
    }

    /// Runs one call on `node` and logs it (with the node's boot id at receipt and the code
    /// answered) in the call log.
    async fn audited<T>(
        &self,
        node: usize,
        method: &str,
        request: serde_json::Value,
        call: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let receipt = self.shared.receipt(node);
        let r = call.await;
        let code = match &r {
            Ok(_) => tonic::Code::Ok,
            Err(e) => e.code(),
        };
        self.shared.audit(&receipt, method, request, code);
        r
    }

    /// A read-only call: the model brought up to the clock's time, without counting as a
    /// change (which would wake every stream and the projector for nothing).
    fn read_model<R>(&self, f: impl FnOnce(&TalosCluster) -> R) -> R {
        self.shared.read(f)
    }
}

/// A `common.ContainerdInstance` as siderolabs/talos v1.13.9 (unchanged through v1.14.0-rc.1)
/// internal/app/internal/ctrhelper/ctrhelper.go `ContainerdInstanceHelper` reads it: the
/// driver, then the namespace (NS_UNKNOWN, also an absent instance, is refused), then the
/// CRI namespace with the containerd driver; each InvalidArgument, Go's enum names in the text.
fn containerd_instance(c: Option<common::ContainerdInstance>) -> Result<ImageStore, TalosError> {
    use common::ContainerDriver;
    let c = c.unwrap_or_default();
    let driver = ContainerDriver::try_from(c.driver).map_err(|_| {
        TalosError::InvalidArgument(format!("invalid containerd driver {}", c.driver))
    })?;
    let namespace = match ContainerdNamespace::try_from(c.namespace) {
        Ok(ns @ (ContainerdNamespace::NsSystem | ContainerdNamespace::NsCri)) => ns,
        Ok(ns) => {
            return Err(TalosError::InvalidArgument(format!(
                "invalid containerd namespace {}",
                ns.as_str_name()
            )))
        }
        Err(_) => {
            return Err(TalosError::InvalidArgument(format!(
                "invalid containerd namespace {}",
                c.namespace
            )))
        }
    };
    match (driver, namespace) {
        (ContainerDriver::Containerd, ContainerdNamespace::NsCri) => Err(
            TalosError::InvalidArgument("cannot use CRI namespace with containerd driver".into()),
        ),
        (ContainerDriver::Containerd, _) => Ok(ImageStore::SystemContainerd),
        (ContainerDriver::Cri, ContainerdNamespace::NsCri) => Ok(ImageStore::CriK8s),
        (ContainerDriver::Cri, _) => Ok(ImageStore::CriSystem),
    }
}

/// The legacy MachineService/ImagePull: always the CRI containerd, the namespace from the
/// request (v1alpha1_images.go `containerdNamespaceHelper`, v1.13.9: InvalidArgument
/// "invalid namespace NS_UNKNOWN").
fn legacy_namespace(ns: i32) -> Result<ImageStore, Status> {
    match ContainerdNamespace::try_from(ns) {
        Ok(ContainerdNamespace::NsSystem) => Ok(ImageStore::CriSystem),
        Ok(ContainerdNamespace::NsCri) => Ok(ImageStore::CriK8s),
        Ok(other) => Err(Status::invalid_argument(format!(
            "invalid namespace {}",
            other.as_str_name()
        ))),
        Err(_) => Err(Status::invalid_argument(format!("invalid namespace {ns}"))),
    }
}

fn lifecycle_check(m: &TalosCluster, node: usize, service: &str) -> Result<(), Status> {
    if m.node(node).has_lifecycle_api() {
        Ok(())
    } else {
        Err(Status::unimplemented(format!(
            "unknown service {service} (Talos {} has no such API; it arrived in v1.13)",
            m.node(node).talos_version
        )))
    }
}

fn timestamp(t: Timestamp) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (t.as_millis() / 1000) as i64,
        nanos: ((t.as_millis() % 1000) * 1_000_000) as i32,
    }
}

fn etcd_version(talos_minor: u64) -> &'static str {
    match talos_minor {
        0..=6 => "3.5.11",
        7 => "3.5.13",
        8 => "3.5.16",
        9 => "3.5.17",
        10 => "3.5.21",
        11 => "3.6.4",
        12 => "3.6.7",
        13 => "3.6.9",
        _ => "3.7.1",
    }
}

const MACHINE_CONFIG_TYPE: &str = "MachineConfigs.config.talos.dev";

fn machine_config_resource(
    m: &TalosCluster,
    node: usize,
    id: &str,
) -> Result<cosi::Resource, Status> {
    let n = m.node(node);
    let (config, version) = match id {
        "v1alpha1" => (&n.config, n.config_version),
        // The on-disk copy exists as a resource since 1.10, and only once an apply in this
        // boot persisted something (acquire.go does not persist a config read from STATE).
        "persistent" if n.minor() >= 10 && n.persistent_resource => {
            (&n.persistent_config, n.persistent_version)
        }
        _ => {
            return Err(Status::not_found(format!(
                "resource {MACHINE_CONFIG_TYPE}(config/{id}@undefined) doesn't exist"
            )))
        }
    };
    let raw = config.raw().to_vec();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let mut annotations = std::collections::HashMap::new();
    // Since 1.12 yaml_spec is a YAML string scalar holding the config.
    let yaml_spec = if n.minor() >= 12 {
        annotations.insert("talos.dev/yaml-spec".to_string(), "1".to_string());
        serde_yaml::to_string(&serde_yaml::Value::String(text)).unwrap_or_default()
    } else {
        text
    };
    let at = timestamp(m.now());
    Ok(cosi::Resource {
        metadata: Some(cosi::Metadata {
            namespace: "config".into(),
            r#type: MACHINE_CONFIG_TYPE.into(),
            id: id.into(),
            version: version.to_string(),
            owner: String::new(),
            phase: "running".into(),
            created: Some(at),
            updated: Some(at),
            finalizers: Vec::new(),
            labels: Default::default(),
            annotations,
        }),
        spec: Some(cosi::Spec {
            proto_spec: MachineConfigSpec {
                yaml_marshalled: raw,
            }
            .encode_to_vec(),
            yaml_spec,
        }),
    })
}

const MANIFEST_TYPE: &str = "Manifests.kubernetes.talos.dev";

/// CoreDNS image when `cluster.coreDNS.image` is unset.
pub const DEFAULT_COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.12.1";

/// The bootstrap manifests a control-plane node renders (`controlplane/Manifests`), ids in
/// Talos's style, each a YAML sequence of objects (upstream's `ManifestSpec.MarshalYAML`
/// renders the bare item list; the resource is non-sensitive). Workers render none. kube-proxy and CoreDNS
/// follow the active config and drop out when `cluster.proxy.disabled` (or
/// `KubeProxyConfig.enabled: false`) / `cluster.coreDNS.disabled` are set.
pub(crate) fn manifests(m: &TalosCluster, node: usize) -> Vec<(&'static str, String)> {
    let n = m.node(node);
    if !n.is_control_plane() {
        return Vec::new();
    }
    let disabled = |section: &str| {
        n.config
            .v1alpha1_value(&["cluster", section, "disabled"])
            .and_then(serde_yaml::Value::as_bool)
            .unwrap_or(false)
    };
    let mut out = vec![(
        "00-kubelet-bootstrapping-token",
        "- apiVersion: v1\n  kind: Secret\n  metadata:\n    name: bootstrap-token-ichor0\n    namespace: kube-system\n  type: bootstrap.kubernetes.io/token\n  stringData:\n    token-id: ichor0\n    usage-bootstrap-authentication: \"true\"\n".to_string(),
    )];
    // The multi-document form says it in `KubeProxyConfig.enabled` (default true).
    let proxy_doc_off = n.config.docs().iter().any(|d| {
        d.get("kind").and_then(serde_yaml::Value::as_str) == Some("KubeProxyConfig")
            && d.get("enabled").and_then(serde_yaml::Value::as_bool) == Some(false)
    });
    if !disabled("proxy") && !proxy_doc_off {
        let image = n.config.image(Component::Proxy).unwrap_or_else(|| {
            format!(
                "{}:{}",
                Component::Proxy.default_repository(),
                n.kubelet_version()
            )
        });
        out.push((
            "10-kube-proxy",
            format!(
                "- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata:\n    name: kube-proxy\n    namespace: kube-system\n    labels:\n      k8s-app: kube-proxy\n  spec:\n    selector:\n      matchLabels:\n        k8s-app: kube-proxy\n    template:\n      metadata:\n        labels:\n          k8s-app: kube-proxy\n      spec:\n        containers:\n          - name: kube-proxy\n            image: {}\n",
                yaml_scalar(&image)
            ),
        ));
    }
    if !disabled("coreDNS") {
        let image = n
            .config
            .v1alpha1_value(&["cluster", "coreDNS", "image"])
            .and_then(serde_yaml::Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_COREDNS_IMAGE)
            .to_string();
        out.push((
            "11-core-dns",
            format!(
                "- apiVersion: apps/v1\n  kind: Deployment\n  metadata:\n    name: coredns\n    namespace: kube-system\n    labels:\n      k8s-app: kube-dns\n  spec:\n    selector:\n      matchLabels:\n        k8s-app: kube-dns\n    template:\n      metadata:\n        labels:\n          k8s-app: kube-dns\n      spec:\n        containers:\n          - name: coredns\n            image: {}\n",
                yaml_scalar(&image)
            ),
        ));
    }
    out.push((
        "11-kube-config-in-cluster",
        "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: kubeconfig-in-cluster\n    namespace: kube-system\n".to_string(),
    ));
    out
}

/// A string as a YAML flow scalar (quoted when it needs to be).
fn yaml_scalar(s: &str) -> String {
    serde_yaml::to_string(&serde_yaml::Value::String(s.to_string()))
        .map(|y| y.trim_end().to_string())
        .unwrap_or_default()
}

fn manifest_resource(m: &TalosCluster, node: usize, id: &str, yaml: String) -> cosi::Resource {
    let at = timestamp(m.now());
    cosi::Resource {
        metadata: Some(cosi::Metadata {
            namespace: "controlplane".into(),
            r#type: MANIFEST_TYPE.into(),
            id: id.into(),
            version: m.node(node).config_version.to_string(),
            owner: "k8s.ManifestController".into(),
            phase: "running".into(),
            created: Some(at),
            updated: Some(at),
            finalizers: Vec::new(),
            labels: Default::default(),
            annotations: Default::default(),
        }),
        spec: Some(cosi::Spec {
            proto_spec: Vec::new(),
            yaml_spec: yaml,
        }),
    }
}

fn manifest_resources(m: &TalosCluster, node: usize) -> Vec<cosi::Resource> {
    manifests(m, node)
        .into_iter()
        .map(|(id, yaml)| manifest_resource(m, node, id, yaml))
        .collect()
}

/// The metadata of a `runtime` resource a machined controller owns, created and updated
/// `at` (the twin makes them afresh on each read).
fn runtime_metadata(
    kind: &str,
    id: &str,
    version: &str,
    owner: &str,
    at: prost_types::Timestamp,
) -> cosi::Metadata {
    cosi::Metadata {
        namespace: "runtime".into(),
        r#type: kind.into(),
        id: id.into(),
        version: version.into(),
        owner: owner.into(),
        phase: "running".into(),
        created: Some(at),
        updated: Some(at),
        finalizers: Vec::new(),
        labels: Default::default(),
        annotations: Default::default(),
    }
}

const VERSION_TYPE: &str = "Versions.runtime.talos.dev";

/// `talos.resource.definitions.runtime.VersionSpec`.
#[derive(Clone, PartialEq, prost::Message)]
struct VersionSpec {
    #[prost(string, tag = "1")]
    version: String,
}

/// `runtime/Versions.runtime.talos.dev/version`: the running Talos tag (non-sensitive).
/// machined creates it afresh at every boot, so its version is always 1; after an upgrade
/// and the reboot it carries the new tag.
fn version_resource(m: &TalosCluster, node: usize) -> cosi::Resource {
    let tag = m.node(node).talos_version.clone();
    let at = timestamp(m.now());
    cosi::Resource {
        metadata: Some(runtime_metadata(
            VERSION_TYPE,
            "version",
            "1",
            "runtime.VersionController",
            at,
        )),
        spec: Some(cosi::Spec {
            yaml_spec: format!("version: {}\n", yaml_scalar(&tag)),
            proto_spec: VersionSpec { version: tag }.encode_to_vec(),
        }),
    }
}

const SECURITY_STATE_TYPE: &str = "SecurityStates.talos.dev";

/// `talos.resource.definitions.runtime.SecurityStateSpec`, the field the twin models.
#[derive(Clone, PartialEq, prost::Message)]
struct SecurityStateSpec {
    #[prost(bool, tag = "5")]
    booted_with_uki: bool,
}

/// `runtime/SecurityStates.talos.dev/securitystate` (non-sensitive): whether the node booted
/// a UKI through systemd-boot (pkg/machinery/resources/runtime/security_status.go and
/// internal/app/machined/pkg/controllers/runtime/security_state.go, v1.13.9; `bootedWithUKI`
/// is omitted from the YAML when false).
fn security_state_resource(m: &TalosCluster, node: usize) -> cosi::Resource {
    let uki = m.node(node).booted_with_uki;
    let at = timestamp(m.now());
    cosi::Resource {
        metadata: Some(runtime_metadata(
            SECURITY_STATE_TYPE,
            "securitystate",
            "1",
            "runtime.SecurityStateController",
            at,
        )),
        spec: Some(cosi::Spec {
            yaml_spec: if uki {
                "bootedWithUKI: true\n".into()
            } else {
                "{}\n".into()
            },
            proto_spec: SecurityStateSpec {
                booted_with_uki: uki,
            }
            .encode_to_vec(),
        }),
    }
}

const MACHINE_STATUS_TYPE: &str = "MachineStatuses.runtime.talos.dev";

/// `runtime/MachineStatuses.runtime.talos.dev/machine`, what `talosctl get machinestatus`
/// shows: the stage and readiness (spec in YAML only; the twin sends no proto_spec for it).
fn machine_status_resource(m: &TalosCluster, node: usize) -> cosi::Resource {
    let n = m.node(node);
    let stage = match n.stage {
        Stage::Booting => "booting",
        Stage::Running => "running",
        Stage::Rebooting => "rebooting",
        Stage::Upgrading => "upgrading",
    };
    // Upstream's checks that the twin models: the etcd service on a control plane
    // ("services": "etcd not healthy") and the Node's Ready ("nodeReady") —
    // siderolabs/talos@v1.13.9:internal/app/machined/pkg/controllers/runtime/
    // machine_status.go `getReadinessChecks`, `servicesCheck`, `nodeReadyCheck`.
    let mut unmet = Vec::new();
    if n.is_control_plane() && n.up && m.etcd_unhealthy(node) {
        unmet.push(("services", "etcd not healthy".to_string()));
    }
    if !n.ready() {
        unmet.push(("nodeReady", format!("node {:?} is not ready", n.name)));
    }
    let ready = unmet.is_empty();
    let unmet = if ready {
        "[]".to_string()
    } else {
        unmet
            .iter()
            .map(|(name, reason)| {
                format!(
                    "\n        - name: {name}\n          reason: {}",
                    serde_yaml::to_string(reason).unwrap_or_default().trim_end()
                )
            })
            .collect::<String>()
    };
    let at = timestamp(m.now());
    cosi::Resource {
        metadata: Some(runtime_metadata(
            MACHINE_STATUS_TYPE,
            "machine",
            &n.config_version.to_string(),
            "runtime.MachineStatusController",
            at,
        )),
        spec: Some(cosi::Spec {
            proto_spec: Vec::new(),
            yaml_spec: format!(
                "stage: {stage}\nstatus:\n    ready: {ready}\n    unmetConditions: {unmet}\n"
            ),
        }),
    }
}

fn machine_status_any(stage: Stage, ready: bool) -> prost_types::Any {
    let stage = match stage {
        Stage::Booting => machine_status_event::MachineStage::Booting,
        Stage::Running => machine_status_event::MachineStage::Running,
        Stage::Rebooting => machine_status_event::MachineStage::Rebooting,
        Stage::Upgrading => machine_status_event::MachineStage::Upgrading,
    };
    prost_types::Any {
        type_url: "talos/runtime/machine.MachineStatusEvent".into(),
        value: machine::MachineStatusEvent {
            stage: stage as i32,
            status: Some(machine_status_event::MachineStatus {
                ready,
                unmet_conditions: Vec::new(),
            }),
        }
        .encode_to_vec(),
    }
}

#[tonic::async_trait]
impl machine::machine_service_server::MachineService for NodeApi {
    async fn apply_configuration(
        &self,
        request: Request<machine::ApplyConfigurationRequest>,
    ) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
        let messages = self
            .unary(request, Access::Admin, |api, node, request| async move {
                api.apply_configuration_one(node, request).await
            })
            .await?;
        Ok(Response::new(machine::ApplyConfigurationResponse {
            messages,
        }))
    }

    async fn etcd_forfeit_leadership(
        &self,
        request: Request<machine::EtcdForfeitLeadershipRequest>,
    ) -> Result<Response<machine::EtcdForfeitLeadershipResponse>, Status> {
        let messages = self
            .unary(request, Access::Admin, |api, node, request| async move {
                api.etcd_forfeit_leadership_one(node, request).await
            })
            .await?;
        Ok(Response::new(machine::EtcdForfeitLeadershipResponse {
            messages,
        }))
    }

    async fn etcd_member_list(
        &self,
        request: Request<machine::EtcdMemberListRequest>,
    ) -> Result<Response<machine::EtcdMemberListResponse>, Status> {
        let messages = self
            .unary(
                request,
                Access::EtcdReader,
                |api, node, request| async move { api.etcd_member_list_one(node, request).await },
            )
            .await?;
        Ok(Response::new(machine::EtcdMemberListResponse { messages }))
    }

    async fn etcd_status(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::EtcdStatusResponse>, Status> {
        let messages = self
            .unary(
                request,
                Access::EtcdReader,
                |api, node, request| async move { api.etcd_status_one(node, request).await },
            )
            .await?;
        Ok(Response::new(machine::EtcdStatusResponse { messages }))
    }

    type EventsStream = Stream<machine::Event>;

    async fn events(
        &self,
        request: Request<machine::EventsRequest>,
    ) -> Result<Response<Self::EventsStream>, Status> {
        let node = self.route(&request, Access::Reader)?;
        let req = request.into_inner();
        let (epoch, mut next) = self.sync_with(|m| {
            let n = m.node(node);
            let len = n.events.len();
            let start = match req.tail_events {
                t if t < 0 => 0,
                t => len.saturating_sub(t as usize),
            };
            (n.events_epoch, start)
        });
        let (tx, rx) = mpsc::channel(64);
        let shared = self.shared.clone();
        let endpoint = self.endpoint;
        tokio::spawn(async move {
            // The empty hello tells the client the stream is open.
            if tx.send(Ok(machine::Event::default())).await.is_err() {
                return;
            }
            let mut changed = shared.changed.subscribe();
            loop {
                let (batch, gone) = {
                    let m = shared.lock_synced();
                    let n = m.node(node);
                    let batch: Vec<_> = if n.events_epoch == epoch {
                        let b = n.events.get(next..).unwrap_or_default().to_vec();
                        next = n.events.len();
                        b
                    } else {
                        Vec::new()
                    };
                    let gone = !n.up || n.events_epoch != epoch || !m.node(endpoint).up;
                    (batch, gone)
                };
                for e in batch {
                    if !req.with_actor_id.is_empty() && e.actor_id != req.with_actor_id {
                        continue;
                    }
                    let event = machine::Event {
                        metadata: None,
                        data: Some(machine_status_any(e.stage, e.ready)),
                        id: e.id,
                        actor_id: e.actor_id,
                    };
                    if tx.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                if gone {
                    // The node went down: the connection drops, as with a real reboot.
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "connection lost: node is rebooting",
                        )))
                        .await;
                    return;
                }
                tokio::select! {
                    alive = shared.wait_change(&mut changed) => if !alive { return },
                    // The caller went; nothing else on the node notices (an install runs on).
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }

    async fn image_pull(
        &self,
        request: Request<machine::ImagePullRequest>,
    ) -> Result<Response<machine::ImagePullResponse>, Status> {
        let messages = self
            .unary(request, Access::Operator, |api, node, request| async move {
                api.image_pull_one(node, request).await
            })
            .await?;
        Ok(Response::new(machine::ImagePullResponse { messages }))
    }

    type KubeconfigStream = Stream<common::Data>;

    /// As siderolabs/talos v1.13.9 internal/app/machined/internal/server/v1alpha1/
    /// v1alpha1_server.go `Kubeconfig`: admin only (authz table in
    /// internal/app/machined/pkg/system/services/machined.go), control planes only
    /// (internal/app/internal/machinehelper `CheckControlplane`: Unimplemented "kubeconfig is
    /// only available on control plane nodes"), one `common.Data` holding a `.tar.gz` of the
    /// file `kubeconfig` (mode 0600), the tar writer never closed.
    async fn kubeconfig(
        &self,
        request: Request<()>,
    ) -> Result<Response<Self::KubeconfigStream>, Status> {
        let node = self.route(&request, Access::Admin)?;
        if !self.shared.read(|m| m.node(node).is_control_plane()) {
            return Err(Status::unimplemented(
                "kubeconfig is only available on control plane nodes",
            ));
        }
        let text = self
            .shared
            .admin_kubeconfig
            .lock()
            .ok()
            .and_then(|k| k.clone())
            // Assumption: a twin without a Kubernetes API has no endpoint to put in it.
            .ok_or_else(|| Status::unavailable("the twin runs no Kubernetes API"))?;
        let mtime = self.shared.clock.now().as_millis() / 1000;
        let bytes =
            crate::talos::archive::tar_gz_one_file("kubeconfig", 0o600, mtime, text.as_bytes());
        let (tx, rx) = mpsc::channel(1);
        // A fresh channel with room for the one message: the send cannot fail.
        let _ = tx.try_send(Ok(common::Data {
            metadata: None,
            bytes,
        }));
        Ok(Response::new(stream_of(rx)))
    }

    type ReadStream = Stream<common::Data>;

    async fn read(
        &self,
        request: Request<machine::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        let targets = self.targets(&request, Access::Admin)?;
        let path = request.into_inner().path;
        let read = |node: usize| {
            self.read_model(|m| {
                let n = m.node(node);
                match path.as_str() {
                    "/proc/sys/kernel/random/boot_id" => {
                        Ok(format!("{}\n", n.boot_id).into_bytes())
                    }
                    "/system/state/config.yaml" => Ok(n.persistent_config.raw().to_vec()),
                    "/" | "/proc" | "/system" | "/system/state" => {
                        Err(Status::invalid_argument("path must be a regular file"))
                    }
                    other => Err(Status::not_found(format!(
                        "open {other}: no such file or directory"
                    ))),
                }
            })
        };
        let messages = match targets {
            Targets::One(node) => vec![common::Data {
                metadata: None,
                bytes: read(node)?,
            }],
            // apid fans a stream out: every message of a node carries its hostname, and a
            // node that fails sends one message holding only the error; the call succeeds.
            Targets::Many(targets) => targets
                .into_iter()
                .map(|(hostname, node)| match node.and_then(read) {
                    Ok(bytes) => common::Data {
                        metadata: Some(common::Metadata {
                            hostname,
                            ..Default::default()
                        }),
                        bytes,
                    },
                    Err(e) => common::Data {
                        metadata: Some(error_metadata(hostname, &e)),
                        bytes: Vec::new(),
                    },
                })
                .collect(),
        };
        let (tx, rx) = mpsc::channel(messages.len().max(1));
        // A fresh channel with room for every message: these sends cannot fail.
        for data in messages {
            let _ = tx.try_send(Ok(data));
        }
        Ok(Response::new(stream_of(rx)))
    }

    async fn reboot(
        &self,
        request: Request<machine::RebootRequest>,
    ) -> Result<Response<machine::RebootResponse>, Status> {
        let messages = self
            .unary(request, Access::Operator, |api, node, request| async move {
                api.reboot_one(node, request).await
            })
            .await?;
        Ok(Response::new(machine::RebootResponse { messages }))
    }

    async fn service_list(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::ServiceListResponse>, Status> {
        let messages = self
            .unary(request, Access::Reader, |api, node, request| async move {
                api.service_list_one(node, request).await
            })
            .await?;
        Ok(Response::new(machine::ServiceListResponse { messages }))
    }

    async fn upgrade(
        &self,
        request: Request<machine::UpgradeRequest>,
    ) -> Result<Response<machine::UpgradeResponse>, Status> {
        let deadline = grpc_timeout(request.metadata());
        let messages = self
            .unary(request, Access::Admin, |api, node, request| async move {
                api.upgrade_one(node, request, deadline).await
            })
            .await?;
        Ok(Response::new(machine::UpgradeResponse { messages }))
    }

    async fn version(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::VersionResponse>, Status> {
        let messages = self
            .unary(request, Access::Reader, |api, node, request| async move {
                api.version_one(node, request).await
            })
            .await?;
        Ok(Response::new(machine::VersionResponse { messages }))
    }
}

#[tonic::async_trait]
impl machine::image_service_server::ImageService for NodeApi {
    type PullStream = Stream<machine::ImageServicePullResponse>;

    async fn pull(
        &self,
        request: Request<machine::ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        let node = self.route(&request, Access::Operator)?;
        let req = request.into_inner();
        // internal/app/images/images.go `Pull` (v1.13.9, v1.14.0-rc.1): the instance first,
        // then the pull; the last message names the image pinned by digest.
        let logged = serde_json::json!({
            "image": req.image_ref,
            "containerd": req.containerd.map(|c| serde_json::json!({
                "driver": c.driver, "namespace": c.namespace,
            })),
        });
        let (pinned, already) = self
            .audited(node, "machine.ImageService/Pull", logged, async {
                self.sync_with(|m| {
                    lifecycle_check(m, node, "machine.ImageService")?;
                    let store = containerd_instance(req.containerd).map_err(status)?;
                    m.pull_image(node, store, &req.image_ref).map_err(status)
                })
            })
            .await?;
        use machine::image_service_pull_layer_progress::Status as Layer;
        use machine::image_service_pull_response::Response as Item;
        let progress = |status: Layer| machine::ImageServicePullResponse {
            response: Some(Item::PullProgress(machine::ImageServicePullProgress {
                layer_id: "sha256:0000000000000000000000000000000000000000000000000000000000000001"
                    .into(),
                progress: Some(machine::ImageServicePullLayerProgress {
                    status: status as i32,
                    elapsed: Some(prost_types::Duration::default()),
                    offset: 0,
                    total: 0,
                }),
            })),
        };
        let mut items = if already {
            vec![progress(Layer::AlreadyExists)]
        } else {
            vec![
                progress(Layer::DownloadComplete),
                progress(Layer::ExtractComplete),
            ]
        };
        items.push(machine::ImageServicePullResponse {
            response: Some(Item::Name(pinned)),
        });
        let (tx, rx) = mpsc::channel(items.len());
        for item in items {
            // The channel holds every item: sending cannot fail.
            let _ = tx.try_send(Ok(item));
        }
        Ok(Response::new(stream_of(rx)))
    }
}

#[tonic::async_trait]
impl machine::lifecycle_service_server::LifecycleService for NodeApi {
    type UpgradeStream = Stream<machine::LifecycleServiceUpgradeResponse>;

    async fn upgrade(
        &self,
        request: Request<machine::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        let node = self.route(&request, Access::Admin)?;
        let req = request.into_inner();
        let image = req.source.map(|s| s.image_name).unwrap_or_default();
        let logged = serde_json::json!({
            "image": image,
            "containerd": req.containerd.map(|c| serde_json::json!({
                "driver": c.driver, "namespace": c.namespace,
            })),
        });
        // internal/app/lifecycle/lifecycle.go `Upgrade` (v1.13.9, v1.14.0-rc.1): the image
        // name, then the installer container in the request's containerd instance, which
        // must already hold the image under exactly that name.
        let started = self
            .audited(node, "machine.LifecycleService/Upgrade", logged, async {
                self.sync_with(|m| {
                    lifecycle_check(m, node, "machine.LifecycleService")?;
                    m.start_install(node, containerd_instance(req.containerd), &image)
                        .map_err(status)
                })
            })
            .await?;
        use machine::lifecycle_service_install_progress::Response as P;
        let msg = |p: P| {
            Ok(machine::LifecycleServiceUpgradeResponse {
                progress: Some(machine::LifecycleServiceInstallProgress { response: Some(p) }),
            })
        };
        let (tx, rx) = mpsc::channel(8);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let done_at = match started {
                Ok(t) => t,
                Err((code, refusal)) => {
                    let _ = tx.send(msg(P::Message(refusal))).await;
                    let _ = tx.send(msg(P::ExitCode(code))).await;
                    return;
                }
            };
            // The caller going away changes nothing on the node: upstream waits for the
            // installer on a detached context and holds the service's lock until it exits
            // (siderolabs/talos@v1.13.9:internal/app/lifecycle/container.go
            // `runInstallerContainer`, `task.Wait(detachedCtx)`; lifecycle.go `Upgrade`,
            // `defer s.lock.Unlock()`). The model finishes the install on its own clock.
            if tx
                .send(msg(P::Message(format!("installing {image}"))))
                .await
                .is_err()
            {
                return;
            }
            {
                // The caller reads the stream (busy) while the install takes its time.
                let _parked = shared.clock.parked();
                tokio::select! {
                    _ = shared.clock.sleep_until(done_at) => {}
                    _ = tx.closed() => return,
                }
            }
            let finished = shared.with(|m| {
                let n = m.node(node);
                !n.installing && n.installed_version().is_some()
            });
            if finished {
                let _ = tx
                    .send(msg(P::Message(
                        "upgrade written to disk; reboot to activate".into(),
                    )))
                    .await;
                let _ = tx.send(msg(P::ExitCode(0))).await;
            } else {
                let _ = tx
                    .send(Err(Status::unavailable(
                        "installation interrupted: node rebooted",
                    )))
                    .await;
            }
        });
        Ok(Response::new(stream_of(rx)))
    }
}

#[tonic::async_trait]
impl cosi::state_server::State for NodeApi {
    async fn get(
        &self,
        request: Request<cosi::GetRequest>,
    ) -> Result<Response<cosi::GetResponse>, Status> {
        let sensitive = request.get_ref().r#type == MACHINE_CONFIG_TYPE;
        let node = self.route(
            &request,
            if sensitive {
                Access::Admin
            } else {
                Access::Reader
            },
        )?;
        let req = request.into_inner();
        if req.r#type == MANIFEST_TYPE {
            let found = self.read_model(|m| {
                manifest_resources(m, node).into_iter().find(|r| {
                    req.namespace == "controlplane"
                        && r.metadata.as_ref().is_some_and(|md| md.id == req.id)
                })
            });
            return match found {
                Some(resource) => Ok(Response::new(cosi::GetResponse {
                    resource: Some(resource),
                })),
                None => Err(Status::not_found(format!(
                    "resource {MANIFEST_TYPE}({}/{}@undefined) doesn't exist",
                    req.namespace, req.id
                ))),
            };
        }
        if req.r#type == SECURITY_STATE_TYPE {
            if req.namespace != "runtime" || req.id != "securitystate" {
                return Err(Status::not_found(format!(
                    "resource {SECURITY_STATE_TYPE}({}/{}@undefined) doesn't exist",
                    req.namespace, req.id
                )));
            }
            let resource = self.read_model(|m| security_state_resource(m, node));
            return Ok(Response::new(cosi::GetResponse {
                resource: Some(resource),
            }));
        }
        if req.r#type == MACHINE_STATUS_TYPE || req.r#type == VERSION_TYPE {
            let id = if req.r#type == VERSION_TYPE {
                "version"
            } else {
                "machine"
            };
            if req.namespace != "runtime" || req.id != id {
                return Err(Status::not_found(format!(
                    "resource {}({}/{}@undefined) doesn't exist",
                    req.r#type, req.namespace, req.id
                )));
            }
            let resource = self.read_model(|m| {
                if req.r#type == VERSION_TYPE {
                    version_resource(m, node)
                } else {
                    machine_status_resource(m, node)
                }
            });
            return Ok(Response::new(cosi::GetResponse {
                resource: Some(resource),
            }));
        }
        if req.r#type != MACHINE_CONFIG_TYPE {
            return Err(Status::permission_denied(format!(
                "resource type {:?} is not supported",
                req.r#type
            )));
        }
        if req.namespace != "config" {
            return Err(Status::not_found(format!(
                "resource {MACHINE_CONFIG_TYPE}({}/{}@undefined) doesn't exist",
                req.namespace, req.id
            )));
        }
        let resource = self.read_model(|m| machine_config_resource(m, node, &req.id))?;
        Ok(Response::new(cosi::GetResponse {
            resource: Some(resource),
        }))
    }

    type ListStream = Stream<cosi::ListResponse>;

    async fn list(
        &self,
        request: Request<cosi::ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let sensitive = request.get_ref().r#type == MACHINE_CONFIG_TYPE;
        let node = self.route(
            &request,
            if sensitive {
                Access::Admin
            } else {
                Access::Reader
            },
        )?;
        let req = request.into_inner();
        if matches!(
            req.r#type.as_str(),
            MACHINE_STATUS_TYPE | MANIFEST_TYPE | VERSION_TYPE
        ) {
            let items = self.read_model(|m| {
                if req.r#type == MANIFEST_TYPE {
                    if req.namespace == "controlplane" {
                        manifest_resources(m, node)
                    } else {
                        Vec::new()
                    }
                } else if req.namespace != "runtime" {
                    Vec::new()
                } else if req.r#type == VERSION_TYPE {
                    vec![version_resource(m, node)]
                } else {
                    vec![machine_status_resource(m, node)]
                }
            });
            let (tx, rx) = mpsc::channel(items.len().max(1));
            for resource in items {
                let _ = tx.try_send(Ok(cosi::ListResponse {
                    resource: Some(resource),
                }));
            }
            return Ok(Response::new(stream_of(rx)));
        }
        if req.r#type != MACHINE_CONFIG_TYPE {
            return Err(Status::permission_denied(format!(
                "resource type {:?} is not supported",
                req.r#type
            )));
        }
        let items = self.read_model(|m| {
            let mut ids = vec!["v1alpha1"];
            let n = m.node(node);
            if n.minor() >= 10 && n.persistent_resource {
                ids.push("persistent");
            }
            ids.into_iter()
                .filter(|_| req.namespace == "config")
                .map(|id| machine_config_resource(m, node, id))
                .collect::<Result<Vec<_>, _>>()
        })?;
        let (tx, rx) = mpsc::channel(items.len().max(1));
        for resource in items {
            let _ = tx.try_send(Ok(cosi::ListResponse {
                resource: Some(resource),
            }));
        }
        Ok(Response::new(stream_of(rx)))
    }

    type WatchStream = Stream<cosi::WatchResponse>;

    async fn watch(
        &self,
        request: Request<cosi::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let sensitive = request.get_ref().r#type == MACHINE_CONFIG_TYPE;
        let node = self.route(
            &request,
            if sensitive {
                Access::Admin
            } else {
                Access::Reader
            },
        )?;
        let req = request.into_inner();
        if req.r#type != MACHINE_CONFIG_TYPE {
            return Err(Status::permission_denied(format!(
                "resource type {:?} is not supported",
                req.r#type
            )));
        }
        let bootstrap = req.options.as_ref().is_some_and(|o| o.bootstrap_contents);
        let ids: Vec<String> = match &req.id {
            Some(id) => vec![id.clone()],
            None => {
                // A kind watch covers `persistent` too: it shows up (Created) once an apply
                // persists something.
                let persistent = self.read_model(|m| m.node(node).minor() >= 10);
                let mut ids = vec!["v1alpha1".to_string()];
                if persistent {
                    ids.push("persistent".to_string());
                }
                ids
            }
        };
        let in_namespace = req.namespace == "config";
        let (tx, rx) = mpsc::channel(16);
        let shared = self.shared.clone();
        let endpoint = self.endpoint;
        tokio::spawn(async move {
            let event = |event_type: cosi::EventType,
                         resource: Option<cosi::Resource>,
                         old: Option<cosi::Resource>| cosi::Event {
                resource,
                old,
                error: None,
                event_type: event_type as i32,
                bookmark: None,
            };
            let snapshot = |m: &TalosCluster| -> Vec<Option<cosi::Resource>> {
                ids.iter()
                    .map(|id| {
                        in_namespace
                            .then(|| machine_config_resource(m, node, id).ok())
                            .flatten()
                    })
                    .collect()
            };
            // The empty response says the watch is established.
            if tx.send(Ok(cosi::WatchResponse::default())).await.is_err() {
                return;
            }
            let mut last = {
                let m = shared.lock_synced();
                snapshot(&m)
            };
            let mut initial = Vec::new();
            if req.id.is_some() {
                // A single-resource watch starts with its current state, or a tombstone.
                initial.push(match &last[0] {
                    Some(r) => event(cosi::EventType::Created, Some(r.clone()), None),
                    None => event(cosi::EventType::Destroyed, None, None),
                });
            } else if bootstrap {
                initial.extend(
                    last.iter()
                        .flatten()
                        .map(|r| event(cosi::EventType::Created, Some(r.clone()), None)),
                );
                if req.api_version >= 1 {
                    initial.push(event(cosi::EventType::Bootstrapped, None, None));
                }
            }
            for e in initial {
                if tx
                    .send(Ok(cosi::WatchResponse { event: vec![e] }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let mut changed = shared.changed.subscribe();
            loop {
                tokio::select! {
                    alive = shared.wait_change(&mut changed) => if !alive { return },
                    // The caller went; nothing else on the node notices (an install runs on).
                    _ = tx.closed() => return,
                }
                let (now, gone) = {
                    let m = shared.lock_synced();
                    let gone = !m.node(node).up || !m.node(endpoint).up;
                    (snapshot(&m), gone)
                };
                if gone {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "connection lost: node is rebooting",
                        )))
                        .await;
                    return;
                }
                for (old, new) in last.iter().zip(&now) {
                    let version = |r: &Option<cosi::Resource>| {
                        r.as_ref().map(|r| {
                            (
                                r.spec.as_ref().map(|s| s.proto_spec.clone()),
                                r.metadata.as_ref().map(|m| m.version.clone()),
                            )
                        })
                    };
                    if version(old) != version(new) {
                        // COSI's events: a new resource Created, a gone one Destroyed
                        // (carrying what it was), else Updated with the old one.
                        let e = match (old, new) {
                            (None, Some(_)) => event(cosi::EventType::Created, new.clone(), None),
                            (Some(_), None) => event(cosi::EventType::Destroyed, old.clone(), None),
                            _ => event(cosi::EventType::Updated, new.clone(), old.clone()),
                        };
                        if tx
                            .send(Ok(cosi::WatchResponse { event: vec![e] }))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                last = now;
            }
        });
        Ok(Response::new(stream_of(rx)))
    }
}
