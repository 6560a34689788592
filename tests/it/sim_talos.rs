//! The Talos twin over the wire: a raw tonic client built from `proto/`, over real mutual
//! TLS on loopback, asserting on wire fields. Time moves only through a manual clock.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use ichor::clock::Clock;
use ichor::sim::talos::{
    Component, ConfigForm, NodeSpec, Role, TalosTwin, TalosTwinOptions, Timings,
};
use ichor::talos::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace};
use ichor::talos::proto::cosi::resource::state_client::StateClient;
use ichor::talos::proto::cosi::resource::GetRequest;
use ichor::talos::proto::machine::apply_configuration_request::Mode;
use ichor::talos::proto::machine::image_service_client::ImageServiceClient;
use ichor::talos::proto::machine::lifecycle_service_client::LifecycleServiceClient;
use ichor::talos::proto::machine::lifecycle_service_install_progress::Response as Progress;
use ichor::talos::proto::machine::machine_service_client::MachineServiceClient;
use ichor::talos::proto::machine::{
    self as m, image_service_pull_response, machine_status_event, ApplyConfigurationRequest,
    EventsRequest, ImagePullRequest, ImageServicePullRequest, InstallArtifactsSource,
    LifecycleServiceUpgradeRequest, ReadRequest, RebootRequest, UpgradeRequest,
};
use ichor::talos::proto::resource::config::MachineConfigSpec;
use prost::Message;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const S: fn(u64) -> Duration = Duration::from_secs;

fn node(name: &str, role: Role, ip: [u8; 4], talos: &str, form: ConfigForm) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        role,
        ip: ip.into(),
        talos_version: talos.into(),
        kubernetes_version: "v1.33.1".into(),
        kubelet_version: "v1.32.4".into(),
        config_form: form,
    }
}

/// Three control planes and two workers; `cp-1` on 1.13, the rest as given.
fn cluster(talos: &str) -> Vec<NodeSpec> {
    let v1 = ConfigForm::V1Alpha1;
    vec![
        node("cp-1", Role::ControlPlane, [10, 5, 0, 2], talos, v1),
        node("cp-2", Role::ControlPlane, [10, 5, 0, 3], talos, v1),
        node("cp-3", Role::ControlPlane, [10, 5, 0, 4], talos, v1),
        node("w-1", Role::Worker, [10, 5, 0, 10], talos, v1),
        node(
            "w-2",
            Role::Worker,
            [10, 5, 0, 11],
            "v1.14.0",
            ConfigForm::MultiDoc,
        ),
    ]
}

struct Sim {
    twin: TalosTwin,
    clock: Clock,
    _dir: tempfile::TempDir,
}

/// Client credentials as talosctl reads them from the talosconfig.
struct Creds {
    ca: String,
    crt: String,
    key: String,
}

impl Sim {
    async fn start(nodes: Vec<NodeSpec>) -> Result<Sim, Box<dyn std::error::Error>> {
        Self::start_with(nodes, TalosTwinOptions::default()).await
    }

    async fn start_with(
        nodes: Vec<NodeSpec>,
        options: TalosTwinOptions,
    ) -> Result<Sim, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let clock = Clock::manual();
        let twin = TalosTwin::start(clock.clone(), nodes, dir.path(), options).await?;
        Ok(Sim {
            twin,
            clock,
            _dir: dir,
        })
    }

    /// The admin credentials from the talosconfig file the twin wrote.
    fn admin(&self) -> Result<Creds, Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(self.twin.talosconfig_path())?;
        let doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
        let ctx_name = doc["context"].as_str().ok_or("no context")?;
        let ctx = &doc["contexts"][ctx_name];
        let field = |k: &str| -> Result<String, Box<dyn std::error::Error>> {
            let b64 = ctx[k].as_str().ok_or(format!("no {k}"))?;
            let pem = base64::engine::general_purpose::STANDARD.decode(b64)?;
            Ok(String::from_utf8(pem)?)
        };
        let key = field("key")?;
        // Talos labels Ed25519 keys `ED25519 PRIVATE KEY`; the body is plain PKCS#8.
        assert!(key.contains("ED25519 PRIVATE KEY"));
        Ok(Creds {
            ca: field("ca")?,
            crt: field("crt")?,
            key: key.replace("ED25519 PRIVATE KEY", "PRIVATE KEY"),
        })
    }

    fn reader(&self) -> Result<Creds, Box<dyn std::error::Error>> {
        let cert = self.twin.issue_client("reader", &["os:reader"])?;
        Ok(Creds {
            ca: self.twin.ca_pem().to_string(),
            crt: cert.cert_pem,
            key: cert.key_pem,
        })
    }

    fn addr(&self, node: &str) -> Result<SocketAddr, Box<dyn std::error::Error>> {
        Ok(self
            .twin
            .endpoint(node)
            .ok_or(format!("no endpoint {node}"))?)
    }

    async fn channel(&self, node: &str) -> Result<Channel, Box<dyn std::error::Error>> {
        connect(self.addr(node)?, Some(&self.admin()?), &self.admin()?.ca).await
    }

    async fn machine(
        &self,
        node: &str,
    ) -> Result<MachineServiceClient<Channel>, Box<dyn std::error::Error>> {
        Ok(MachineServiceClient::new(self.channel(node).await?))
    }
}

async fn connect(
    addr: SocketAddr,
    creds: Option<&Creds>,
    ca: &str,
) -> Result<Channel, Box<dyn std::error::Error>> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("127.0.0.1");
    if let Some(c) = creds {
        tls = tls.identity(Identity::from_pem(&c.crt, &c.key));
    }
    let channel = Channel::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(channel)
}

fn to_node<T>(msg: T, target: &str) -> Result<Request<T>, Box<dyn std::error::Error>> {
    let mut req = Request::new(msg);
    req.metadata_mut().insert("node", target.parse()?);
    Ok(req)
}

async fn version_tag(c: &mut MachineServiceClient<Channel>) -> Result<String, tonic::Status> {
    let r = c.version(()).await?.into_inner();
    Ok(r.messages[0]
        .version
        .as_ref()
        .map(|v| v.tag.clone())
        .unwrap_or_default())
}

async fn boot_id(
    c: &mut MachineServiceClient<Channel>,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut stream = c
        .read(ReadRequest {
            path: "/proc/sys/kernel/random/boot_id".into(),
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend(chunk.bytes);
    }
    Ok(String::from_utf8(out)?.trim().to_string())
}

/// The machine config as `talosctl get mc -o yaml` reads it: COSI Get, proto_spec bytes.
async fn machine_config(channel: Channel) -> Result<(String, String), Box<dyn std::error::Error>> {
    let r = StateClient::new(channel)
        .get(GetRequest {
            namespace: "config".into(),
            r#type: "MachineConfigs.config.talos.dev".into(),
            id: "v1alpha1".into(),
            options: None,
        })
        .await?
        .into_inner();
    let res = r.resource.ok_or("no resource")?;
    let md = res.metadata.ok_or("no metadata")?;
    let spec = MachineConfigSpec::decode(res.spec.ok_or("no spec")?.proto_spec.as_slice())?;
    Ok((String::from_utf8(spec.yaml_marshalled)?, md.version))
}

/// The Talos tag from COSI `runtime/Versions.runtime.talos.dev/version`, checking that the
/// proto and YAML renderings agree.
async fn cosi_version(ch: Channel) -> Result<String, Box<dyn std::error::Error>> {
    let r = StateClient::new(ch)
        .get(GetRequest {
            namespace: "runtime".into(),
            r#type: "Versions.runtime.talos.dev".into(),
            id: "version".into(),
            options: None,
        })
        .await?
        .into_inner();
    let spec = r.resource.and_then(|r| r.spec).ok_or("no spec")?;
    // VersionSpec { string version = 1; }: tag 0x0a, a one-byte length, the tag.
    let proto = spec.proto_spec.get(2..).ok_or("short proto_spec")?;
    assert_eq!(spec.proto_spec.first(), Some(&0x0a));
    let yaml: serde_yaml::Value = serde_yaml::from_str(&spec.yaml_spec)?;
    assert_eq!(yaml["version"].as_str(), Some(std::str::from_utf8(proto)?));
    Ok(std::str::from_utf8(proto)?.to_string())
}

fn apply(data: &str, mode: Mode, dry_run: bool) -> ApplyConfigurationRequest {
    ApplyConfigurationRequest {
        data: data.as_bytes().to_vec(),
        mode: mode as i32,
        dry_run,
        try_mode_timeout: None,
    }
}

fn stage_of(e: &m::Event) -> Option<(i32, bool)> {
    let data = e.data.as_ref()?;
    if data.type_url != "talos/runtime/machine.MachineStatusEvent" {
        return None;
    }
    let ev = m::MachineStatusEvent::decode(data.value.as_slice()).ok()?;
    Some((ev.stage, ev.status.map(|s| s.ready).unwrap_or(false)))
}

#[tokio::test]
async fn version_reports_the_node_tag_without_metadata() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut cp = sim.machine("cp-1").await?;
    let r = cp.version(()).await?.into_inner();
    assert_eq!(r.messages.len(), 1);
    let v = &r.messages[0];
    assert!(v.metadata.is_none(), "one-to-one replies carry no metadata");
    assert_eq!(v.version.as_ref().map(|v| v.tag.as_str()), Some("v1.13.2"));
    assert_eq!(v.platform.as_ref().map(|p| p.mode.as_str()), Some("metal"));
    assert_eq!(v.features.as_ref().map(|f| f.rbac), Some(true));
    Ok(())
}

#[tokio::test]
async fn apply_configuration_modes_and_dry_run_on_1_13() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut cp = sim.machine("cp-1").await?;
    let (config, version) = machine_config(sim.channel("cp-1").await?).await?;
    assert!(config.contains("image: registry.k8s.io/kube-apiserver:v1.33.1"));

    assert!(config.contains("image: ghcr.io/siderolabs/kubelet:v1.32.4"));
    let bumped = config.replace("kube-apiserver:v1.33.1", "kube-apiserver:v1.34.0");
    // Dry run: reports the mode and the diff, changes nothing.
    let r = cp
        .apply_configuration(apply(&bumped, Mode::NoReboot, true))
        .await?;
    let msg = &r.into_inner().messages[0];
    assert_eq!(msg.mode, Mode::NoReboot as i32);
    assert!(msg.mode_details.contains("Dry run"), "{}", msg.mode_details);
    // Upstream's shape: the summary, then a unified diff of the active and the new config.
    assert!(
        msg.mode_details.starts_with(
            "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n@@ -"
        ),
        "{}",
        msg.mode_details
    );
    assert!(
        msg.mode_details
            .contains("-    image: registry.k8s.io/kube-apiserver:v1.33.1\n+    image: registry.k8s.io/kube-apiserver:v1.34.0\n"),
        "{}",
        msg.mode_details
    );
    let (after_dry, v_dry) = machine_config(sim.channel("cp-1").await?).await?;
    assert_eq!(
        (after_dry.as_str(), v_dry.as_str()),
        (config.as_str(), version.as_str())
    );

    // NO_REBOOT with only an image change: applied live, the static pod restarts.
    let r = cp
        .apply_configuration(apply(&bumped, Mode::NoReboot, false))
        .await?;
    assert_eq!(r.into_inner().messages[0].mode, Mode::NoReboot as i32);
    let (now, v_now) = machine_config(sim.channel("cp-1").await?).await?;
    assert_eq!(now, bumped);
    assert_ne!(v_now, version);
    let pod = |sim: &Sim| {
        sim.twin.with_model(|m| {
            m.node_by_name("cp-1")
                .and_then(|n| n.static_pod(Component::ApiServer).cloned())
        })
    };
    let p = pod(&sim).ok_or("no apiserver pod")?;
    assert_eq!(p.image, "registry.k8s.io/kube-apiserver:v1.34.0");
    assert!(!p.ready);
    // Not pre-pulled: the image is pulled into the CRI store first, then the pod restarts.
    sim.clock.advance(S(20));
    assert!(pod(&sim).is_some_and(|p| !p.ready));
    sim.clock.advance(S(40));
    assert!(pod(&sim).is_some_and(|p| p.ready));

    // A kubelet image change restarts the kubelet, which then reports the new version.
    let kubelet = bumped.replace("kubelet:v1.32.4", "kubelet:v1.34.0");
    cp.apply_configuration(apply(&kubelet, Mode::NoReboot, false))
        .await?;
    let kv = |sim: &Sim| {
        sim.twin.with_model(|m| {
            m.node_by_name("cp-1")
                .map(|n| (n.kubelet_version().to_string(), n.kubelet.healthy))
        })
    };
    assert_eq!(kv(&sim), Some(("v1.32.4".to_string(), false)));
    // Not pre-pulled: pulled first, then the kubelet restarts.
    sim.clock.advance(S(60));
    assert_eq!(kv(&sim), Some(("v1.34.0".to_string(), true)));

    // A change CanApplyImmediate does not allow (machine.env) is refused under NO_REBOOT
    // on 1.13 and nothing changes.
    let other = kubelet.replace("machine:\n", "machine:\n  env:\n    FOO: bar\n");
    let err = cp
        .apply_configuration(apply(&other, Mode::NoReboot, false))
        .await
        .err()
        .ok_or("expected a refusal")?;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("can't be applied in immediate mode")
            && err.message().contains("machine.env"),
        "{}",
        err.message()
    );
    // AUTO picks REBOOT for it (dry run, so the node stays up).
    let r = cp
        .apply_configuration(apply(&other, Mode::Auto, true))
        .await?;
    assert_eq!(r.into_inner().messages[0].mode, Mode::Reboot as i32);
    // STAGED keeps the running config and persists the new one.
    let r = cp
        .apply_configuration(apply(&other, Mode::Staged, false))
        .await?;
    assert_eq!(r.into_inner().messages[0].mode, Mode::Staged as i32);
    assert_eq!(machine_config(sim.channel("cp-1").await?).await?.0, kubelet);

    // Invalid YAML and out-of-range Kubernetes tags are InvalidArgument.
    let err = cp
        .apply_configuration(apply("version: [", Mode::NoReboot, false))
        .await
        .err()
        .ok_or("expected a refusal")?;
    assert_eq!(err.code(), Code::InvalidArgument);
    let too_new = kubelet.replace("kube-apiserver:v1.34.0", "kube-apiserver:v1.40.0");
    let err = cp
        .apply_configuration(apply(&too_new, Mode::NoReboot, false))
        .await
        .err()
        .ok_or("expected a refusal")?;
    assert_eq!(err.code(), Code::InvalidArgument);
    Ok(())
}

#[tokio::test]
async fn apply_configuration_on_1_14_multi_document() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    // w-2 runs 1.14 with the multi-document form.
    let mut w2 = sim.machine("w-2").await?;
    let (config, _) = machine_config(sim.channel("w-2").await?).await?;
    assert!(config.contains("kind: KubeletConfig"));
    let bumped = config.replace("kubelet:v1.32.4", "kubelet:v1.34.0");
    let err = w2
        .apply_configuration(apply(&bumped, Mode::Reboot, false))
        .await
        .err()
        .ok_or("REBOOT must be refused on 1.14")?;
    assert_eq!(err.code(), Code::Unimplemented);
    let r = w2
        .apply_configuration(apply(&bumped, Mode::Auto, false))
        .await?;
    assert_eq!(r.into_inner().messages[0].mode, Mode::NoReboot as i32);
    // Not pre-pulled: pulled first, then the kubelet restarts.
    sim.clock.advance(S(60));
    let kv = sim.twin.with_model(|m| {
        m.node_by_name("w-2")
            .map(|n| n.kubelet_version().to_string())
    });
    assert_eq!(kv.as_deref(), Some("v1.34.0"));
    // Setting a new document and its v1alpha1 counterpart together is invalid.
    let both = bumped.replacen(
        "machine:\n",
        "machine:\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.34.0\n",
        1,
    );
    let err = w2
        .apply_configuration(apply(&both, Mode::Auto, false))
        .await
        .err()
        .ok_or("conflict must be refused")?;
    assert_eq!(err.code(), Code::InvalidArgument);
    Ok(())
}

#[tokio::test]
async fn legacy_upgrade_reboots_by_itself_with_a_new_boot_id() -> TestResult {
    let sim = Sim::start(cluster("v1.12.4")).await?;
    let mut w1 = sim.machine("w-1").await?;
    let before = boot_id(&mut w1).await?;
    assert_eq!(before.len(), 36);

    let mut events = w1
        .events(EventsRequest {
            tail_events: 0,
            ..Default::default()
        })
        .await?
        .into_inner();
    let hello = events.message().await?.ok_or("no hello")?;
    assert!(
        hello.data.is_none() && hello.id.is_empty(),
        "empty hello first"
    );

    let r = w1
        .upgrade(UpgradeRequest {
            image: "ghcr.io/siderolabs/installer:v1.13.0".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let ack = &r.messages[0];
    assert_eq!(ack.ack, "Upgrade request received");
    assert_eq!(ack.actor_id.len(), 36);

    let upgrading = events.message().await?.ok_or("no upgrading event")?;
    assert_eq!(upgrading.actor_id, ack.actor_id);
    assert_eq!(
        stage_of(&upgrading),
        Some((machine_status_event::MachineStage::Upgrading as i32, false))
    );
    sim.clock.advance(S(30));
    let rebooting = events.message().await?.ok_or("no rebooting event")?;
    assert_eq!(
        stage_of(&rebooting).map(|s| s.0),
        Some(machine_status_event::MachineStage::Rebooting as i32)
    );
    let err = events.message().await.err().ok_or("stream must break")?;
    assert_eq!(err.code(), Code::Unavailable);
    let err = w1.version(()).await.err().ok_or("down node must refuse")?;
    assert_eq!(err.code(), Code::Unavailable);

    sim.clock.advance(S(90));
    assert_eq!(version_tag(&mut w1).await?, "v1.13.0");
    let after = boot_id(&mut w1).await?;
    assert_ne!(after, before);
    // Reconnect with tail_events = -1: the buffered boot events end in RUNNING + ready.
    let mut events = w1
        .events(EventsRequest {
            tail_events: -1,
            ..Default::default()
        })
        .await?
        .into_inner();
    let _hello = events.message().await?;
    let mut seen = Vec::new();
    while let Some((stage, ready)) = events.message().await?.as_ref().and_then(stage_of) {
        seen.push((stage, ready));
        if ready {
            break;
        }
    }
    assert_eq!(
        seen.last(),
        Some(&(machine_status_event::MachineStage::Running as i32, true))
    );
    Ok(())
}

/// The system containerd through the CRI driver: where ichor pulls and runs an installer.
const SYSTEM: ContainerdInstance = ContainerdInstance {
    driver: ContainerDriver::Cri as i32,
    namespace: ContainerdNamespace::NsSystem as i32,
};

/// Pulls `image` into `node`'s system containerd; the pull stream's last response.
async fn pull_system(
    sim: &Sim,
    node: &str,
    image: &str,
) -> Result<Option<image_service_pull_response::Response>, Box<dyn std::error::Error>> {
    let mut images = ImageServiceClient::new(sim.channel(node).await?);
    let mut pull = images
        .pull(ImageServicePullRequest {
            containerd: Some(SYSTEM),
            image_ref: image.into(),
        })
        .await?
        .into_inner();
    let mut last = None;
    while let Some(item) = pull.message().await? {
        last = item.response;
    }
    Ok(last)
}

/// LifecycleService/Upgrade with `image` from the system containerd.
fn upgrade_request(image: &str) -> LifecycleServiceUpgradeRequest {
    LifecycleServiceUpgradeRequest {
        containerd: Some(SYSTEM),
        source: Some(InstallArtifactsSource {
            image_name: image.into(),
        }),
    }
}

/// Reads an install's progress stream to its end: the installer's exit code, if it sent one.
async fn exit_code(
    stream: &mut tonic::Streaming<ichor::talos::proto::machine::LifecycleServiceUpgradeResponse>,
) -> Result<Option<i32>, tonic::Status> {
    let mut exit = None;
    while let Some(r) = stream.message().await? {
        if let Some(Progress::ExitCode(code)) = r.progress.and_then(|p| p.response) {
            exit = Some(code);
        }
    }
    Ok(exit)
}

/// An install outlives its caller, as upstream waits for the installer on a detached
/// context and holds the service's lock until it exits
/// (siderolabs/talos@v1.13.9:internal/app/lifecycle/container.go `runInstallerContainer`,
/// lifecycle.go `Upgrade`): a second request meanwhile is refused "already in progress",
/// closing an unrelated Events or Watch stream does not touch it (N13), and the next
/// reboot boots what it wrote.
#[tokio::test]
async fn a_lifecycle_upgrade_outlives_its_caller_and_holds_the_lock_until_it_exits() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let installer = "ghcr.io/siderolabs/installer:v1.14.0";
    pull_system(&sim, "w-1", installer).await?;
    let request = || upgrade_request(installer);
    let mut lifecycle = LifecycleServiceClient::new(sim.channel("w-1").await?);
    let mut stream = lifecycle.upgrade(request()).await?.into_inner();
    let first = stream.message().await?.and_then(|r| r.progress?.response);
    assert!(matches!(first, Some(Progress::Message(_))), "{first:?}");
    let installing = || {
        sim.twin
            .read(|m| m.nodes().iter().any(|n| n.name == "w-1" && n.installing))
    };
    drop(stream);
    // An Events stream on the node, opened and closed while the installer runs.
    let mut w1 = sim.machine("w-1").await?;
    let mut events = w1
        .events(EventsRequest {
            tail_events: -1,
            ..Default::default()
        })
        .await?
        .into_inner();
    events.message().await?;
    drop(events);
    // Whatever the closed streams could do, give it the time to arrive.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(installing(), "the install died with a stream");
    let again = LifecycleServiceClient::new(sim.channel("w-1").await?)
        .upgrade(request())
        .await
        .err()
        .ok_or("a second install was taken while one runs")?;
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        again.message(),
        "another installation/upgrade is already in progress"
    );
    // The installer exits: the lock is free (an empty image name is refused past it).
    sim.clock.advance(S(20));
    assert!(!installing());
    let free = LifecycleServiceClient::new(sim.channel("w-1").await?)
        .upgrade(upgrade_request(""))
        .await
        .err()
        .ok_or("an empty installer image was taken")?;
    assert_eq!(free.code(), tonic::Code::InvalidArgument, "{free:?}");
    w1.reboot(RebootRequest::default()).await?;
    sim.clock.advance(S(90));
    assert_eq!(version_tag(&mut w1).await?, "v1.14.0");
    let fallback = sim.twin.read(|m| {
        m.node_by_name("w-1")
            .and_then(|n| n.boot.fallback().map(str::to_string))
    });
    assert_eq!(fallback.as_deref(), Some("v1.13.2"));
    Ok(())
}

/// A second install on one boot costs a GRUB node its way back: GRUB flips from grub.cfg's
/// Default and overwrites the running slot (siderolabs/talos internal/app/machined/pkg/
/// runtime/v1alpha1/bootloader/grub/upgrade.go `Upgrade`: `flip` before the assets). sd-boot
/// keeps the booted UKI (…/sdboot/sdboot.go at 06023fd1898a: `Probe` defaults to
/// `LoaderEntrySelected`). The call log counts what reached the node per boot.
#[tokio::test]
async fn a_second_install_on_one_boot_leaves_a_grub_node_no_fallback_and_the_log_shows_both(
) -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let installer = "ghcr.io/siderolabs/installer:v1.14.0";
    sim.twin
        .with_model(|m| m.set_bootloader("cp-1", ichor::sim::talos::Bootloader::SdBoot));
    for node in ["w-1", "cp-1"] {
        pull_system(&sim, node, installer).await?;
        for _ in 0..2 {
            let mut stream = LifecycleServiceClient::new(sim.channel(node).await?)
                .upgrade(upgrade_request(installer))
                .await?
                .into_inner();
            stream.message().await?;
            sim.clock.advance(S(20));
            assert_eq!(exit_code(&mut stream).await?, Some(0));
        }
    }
    let slots = |name: &str| {
        sim.twin
            .read(|m| m.node_by_name(name).map(|n| n.boot.clone()))
    };
    let grub = slots("w-1").ok_or("no w-1")?;
    assert_eq!(grub.fallback(), Some("v1.14.0"), "GRUB: {grub:?}");
    assert_eq!(
        grub.default, grub.booted,
        "GRUB wrote the running slot: {grub:?}"
    );
    let sdboot = slots("cp-1").ok_or("no cp-1")?;
    assert_eq!(sdboot.fallback(), Some("v1.13.2"), "sd-boot: {sdboot:?}");
    assert_eq!(sdboot.slots[sdboot.default].as_deref(), Some("v1.14.0"));

    let log = std::fs::read_to_string(sim.twin.audit_log_path())?;
    let installs: Vec<serde_json::Value> = log
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<serde_json::Value>, _>>()?
        .into_iter()
        .filter(|l| l["method"] == "machine.LifecycleService/Upgrade")
        .collect();
    assert_eq!(installs.len(), 4, "{log}");
    for l in &installs {
        assert_eq!(l["request"]["image"], installer);
        assert_eq!(l["code"], 0);
        assert!(l["bootId"].as_str().is_some_and(|b| b.len() == 36), "{l}");
        assert!(l["at"].as_str().is_some_and(|a| a.ends_with('Z')), "{l}");
    }
    assert_eq!(installs[0]["node"], "w-1");
    assert_eq!(installs[0]["bootId"], installs[1]["bootId"]);
    Ok(())
}

#[tokio::test]
async fn lifecycle_upgrade_streams_progress_and_does_not_reboot() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let installer = "ghcr.io/siderolabs/installer:v1.14.0";
    let last = pull_system(&sim, "w-1", installer).await?;
    // The stream ends with the name the image is stored under, `name@digest`
    // (siderolabs/talos v1.13.9 internal/app/images/images.go).
    assert!(
        matches!(&last, Some(image_service_pull_response::Response::Name(n))
            if n.starts_with("ghcr.io/siderolabs/installer@sha256:")),
        "{last:?}"
    );

    let mut w1 = sim.machine("w-1").await?;
    let before = boot_id(&mut w1).await?;
    let mut lifecycle = LifecycleServiceClient::new(sim.channel("w-1").await?);
    let mut stream = lifecycle
        .upgrade(upgrade_request(installer))
        .await?
        .into_inner();
    let first = stream.message().await?.and_then(|r| r.progress?.response);
    assert!(matches!(first, Some(Progress::Message(_))), "{first:?}");
    sim.clock.advance(S(20));
    assert_eq!(exit_code(&mut stream).await?, Some(0));
    // No reboot: same boot id, same running version.
    assert_eq!(boot_id(&mut w1).await?, before);
    assert_eq!(version_tag(&mut w1).await?, "v1.13.2");
    assert_eq!(cosi_version(sim.channel("w-1").await?).await?, "v1.13.2");

    // The caller reboots; the node comes back on the new version.
    w1.reboot(RebootRequest::default()).await?;
    sim.clock.advance(S(90));
    assert_eq!(version_tag(&mut w1).await?, "v1.14.0");
    assert_eq!(cosi_version(sim.channel("w-1").await?).await?, "v1.14.0");
    assert_ne!(boot_id(&mut w1).await?, before);

    // An image that was never pulled into that instance: refused before the installer runs,
    // as upstream's lifecycle service looks the image up first (siderolabs/talos v1.13.9
    // internal/app/lifecycle/lifecycle.go: Internal "upgrade failed: …").
    let mut lifecycle = LifecycleServiceClient::new(sim.channel("w-2").await?);
    let refused = async {
        let mut stream = lifecycle
            .upgrade(upgrade_request("ghcr.io/siderolabs/installer:v1.14.1"))
            .await?
            .into_inner();
        while stream.message().await?.is_some() {}
        Ok::<(), tonic::Status>(())
    }
    .await
    .err()
    .ok_or("an image never pulled must be refused")?;
    assert_eq!(refused.code(), Code::Internal);
    assert!(refused.message().contains("not found"), "{refused:?}");
    Ok(())
}

#[tokio::test]
async fn lifecycle_and_image_services_are_absent_before_1_13() -> TestResult {
    let sim = Sim::start(cluster("v1.12.4")).await?;
    let mut images = ImageServiceClient::new(sim.channel("w-1").await?);
    let err = images
        .pull(ImageServicePullRequest {
            containerd: None,
            image_ref: "ghcr.io/siderolabs/installer:v1.13.0".into(),
        })
        .await
        .err()
        .ok_or("1.12 has no ImageService")?;
    assert_eq!(err.code(), Code::Unimplemented);
    let mut lifecycle = LifecycleServiceClient::new(sim.channel("w-1").await?);
    let err = lifecycle
        .upgrade(LifecycleServiceUpgradeRequest::default())
        .await
        .err()
        .ok_or("1.12 has no LifecycleService")?;
    assert_eq!(err.code(), Code::Unimplemented);
    Ok(())
}

#[tokio::test]
async fn image_pull_and_the_failing_pull_fault() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut cp = sim.machine("cp-1").await?;
    let r = cp
        .image_pull(ImagePullRequest {
            namespace: ContainerdNamespace::NsCri as i32,
            reference: "registry.k8s.io/kube-apiserver:v1.34.0".into(),
        })
        .await?
        .into_inner();
    assert_eq!(r.messages.len(), 1);
    let err = cp
        .image_pull(ImagePullRequest {
            namespace: ContainerdNamespace::NsUnknown as i32,
            reference: "registry.k8s.io/kube-apiserver:v1.34.0".into(),
        })
        .await
        .err()
        .ok_or("NS_UNKNOWN must be refused")?;
    assert_eq!(err.code(), Code::InvalidArgument);

    let broken = "ghcr.io/siderolabs/installer:v1.14.9";
    sim.twin.with_model(|m| m.set_failing_image(broken, true));
    let err = cp
        .image_pull(ImagePullRequest {
            namespace: ContainerdNamespace::NsSystem as i32,
            reference: broken.into(),
        })
        .await
        .err()
        .ok_or("failing pull")?;
    assert_eq!(err.code(), Code::NotFound);
    let mut images = ImageServiceClient::new(sim.channel("cp-1").await?);
    let err = images
        .pull(ImageServicePullRequest {
            containerd: Some(ContainerdInstance {
                driver: ContainerDriver::Cri as i32,
                namespace: ContainerdNamespace::NsSystem as i32,
            }),
            image_ref: broken.into(),
        })
        .await
        .err()
        .ok_or("failing pull")?;
    assert_eq!(err.code(), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn etcd_members_follow_reboots_and_quorum_is_lost_with_two_down() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut cp1 = sim.machine("cp-1").await?;
    let members = |r: m::EtcdMemberListResponse| {
        let mut names: Vec<String> = r.messages[0]
            .members
            .iter()
            .map(|m| m.hostname.clone())
            .collect();
        names.sort();
        names
    };
    let r = cp1
        .etcd_member_list(m::EtcdMemberListRequest::default())
        .await?;
    assert_eq!(members(r.into_inner()), vec!["cp-1", "cp-2", "cp-3"]);

    sim.machine("cp-2")
        .await?
        .reboot(RebootRequest::default())
        .await?;
    let r = cp1
        .etcd_member_list(m::EtcdMemberListRequest::default())
        .await?;
    assert_eq!(members(r.into_inner()), vec!["cp-1", "cp-3"]);
    let status = cp1.etcd_status(()).await?.into_inner();
    assert_ne!(
        status.messages[0].member_status.as_ref().map(|s| s.leader),
        Some(0)
    );

    sim.machine("cp-3")
        .await?
        .reboot(RebootRequest::default())
        .await?;
    let err = cp1.etcd_status(()).await.err().ok_or("quorum lost")?;
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("quorum"), "{}", err.message());
    let err = cp1
        .etcd_member_list(m::EtcdMemberListRequest::default())
        .await
        .err()
        .ok_or("quorum lost")?;
    assert_eq!(err.code(), Code::Unavailable);

    sim.clock.advance(S(90));
    let r = cp1
        .etcd_member_list(m::EtcdMemberListRequest::default())
        .await?;
    assert_eq!(members(r.into_inner()), vec!["cp-1", "cp-2", "cp-3"]);
    assert!(cp1.etcd_status(()).await.is_ok());
    Ok(())
}

#[tokio::test]
async fn etcd_forfeit_leadership_moves_the_leader() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let leader = sim
        .twin
        .with_model(|m| m.etcd_leader().map(str::to_string))
        .ok_or("no leader")?;
    let follower = ["cp-1", "cp-2", "cp-3"]
        .into_iter()
        .find(|n| *n != leader)
        .ok_or("no follower")?;
    let r = sim
        .machine(follower)
        .await?
        .etcd_forfeit_leadership(m::EtcdForfeitLeadershipRequest {})
        .await?;
    assert_eq!(r.into_inner().messages[0].member, "", "not the leader");

    let mut l = sim.machine(&leader).await?;
    let old_id = l.etcd_status(()).await?.into_inner().messages[0]
        .member_status
        .as_ref()
        .map(|s| s.leader);
    let r = l
        .etcd_forfeit_leadership(m::EtcdForfeitLeadershipRequest {})
        .await?;
    let new_leader = r.into_inner().messages[0].member.clone();
    assert!(!new_leader.is_empty() && new_leader != leader);
    let new_id = l.etcd_status(()).await?.into_inner().messages[0]
        .member_status
        .as_ref()
        .map(|s| s.leader);
    assert_ne!(new_id, old_id);
    Ok(())
}

#[tokio::test]
async fn node_metadata_routes_like_apid() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut cp = sim.machine("cp-1").await?;
    // By IP and by name, through a control-plane endpoint.
    let r = cp.version(to_node((), "10.5.0.11")?).await?.into_inner();
    assert_eq!(
        r.messages[0].version.as_ref().map(|v| v.tag.as_str()),
        Some("v1.14.0")
    );
    let r = cp.version(to_node((), "w-2")?).await?.into_inner();
    assert_eq!(
        r.messages[0].version.as_ref().map(|v| v.tag.as_str()),
        Some("v1.14.0")
    );
    // COSI and LifecycleService are routed too.
    let mut state = StateClient::new(sim.channel("cp-1").await?);
    let r = state
        .get(to_node(
            GetRequest {
                namespace: "config".into(),
                r#type: "MachineConfigs.config.talos.dev".into(),
                id: "v1alpha1".into(),
                options: None,
            },
            "10.5.0.11",
        )?)
        .await?
        .into_inner();
    let spec = r.resource.and_then(|r| r.spec).ok_or("no spec")?;
    assert!(String::from_utf8(
        MachineConfigSpec::decode(spec.proto_spec.as_slice())?.yaml_marshalled
    )?
    .contains("kind: KubeletConfig"));
    // Workers refuse forwarding.
    let mut w = sim.machine("w-1").await?;
    let err = w
        .version(to_node((), "cp-1")?)
        .await
        .err()
        .ok_or("no forwarding")?;
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(err.message(), "no request forwarding");
    // A worker may still name itself.
    assert!(w.version(to_node((), "10.5.0.10")?).await.is_ok());
    // Unknown target, several values, a target with a port.
    let err = cp
        .version(to_node((), "10.9.9.9")?)
        .await
        .err()
        .ok_or("unknown")?;
    assert_eq!(err.code(), Code::Unavailable);
    let mut req = Request::new(());
    req.metadata_mut().append("node", "cp-2".parse()?);
    req.metadata_mut().append("node", "cp-3".parse()?);
    let err = cp.version(req).await.err().ok_or("multi-valued")?;
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = cp
        .version(to_node((), "cp-2:50000")?)
        .await
        .err()
        .ok_or("port")?;
    assert_eq!(err.code(), Code::InvalidArgument);
    // Control-plane-only APIs on a worker.
    let err = cp
        .etcd_member_list(to_node(m::EtcdMemberListRequest::default(), "w-1")?)
        .await
        .err()
        .ok_or("worker has no etcd")?;
    assert_eq!(err.code(), Code::Unimplemented);
    Ok(())
}

#[tokio::test]
async fn refusals_without_a_client_certificate_and_for_readers() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let addr = sim.addr("cp-1")?;
    let ca = sim.twin.ca_pem().to_string();

    // No client certificate: the handshake is refused (at connect or at the first call).
    let refused = match connect(addr, None, &ca).await {
        Err(_) => true,
        Ok(ch) => MachineServiceClient::new(ch).version(()).await.is_err(),
    };
    assert!(
        refused,
        "a client without a certificate must not get an answer"
    );

    // A certificate from another CA is refused as well.
    let other = ichor::sim::pki::CertificateAuthority::new(
        "other",
        None,
        ichor::sim::pki::KeyAlgorithm::Ed25519,
    )?;
    let stranger =
        other.issue_client("x", &["os:admin"], ichor::sim::pki::KeyAlgorithm::Ed25519)?;
    let creds = Creds {
        ca: ca.clone(),
        crt: stranger.cert_pem,
        key: stranger.key_pem,
    };
    let refused = match connect(addr, Some(&creds), &ca).await {
        Err(_) => true,
        Ok(ch) => MachineServiceClient::new(ch).version(()).await.is_err(),
    };
    assert!(
        refused,
        "a certificate from another CA must not get an answer"
    );

    // os:reader: read-only calls work, admin calls are PermissionDenied.
    let reader = sim.reader()?;
    let ch = connect(addr, Some(&reader), &reader.ca).await?;
    let mut c = MachineServiceClient::new(ch.clone());
    assert_eq!(version_tag(&mut c).await?, "v1.13.2");
    assert!(c.service_list(()).await.is_ok());
    assert!(c
        .etcd_member_list(m::EtcdMemberListRequest::default())
        .await
        .is_ok());
    for err in [
        c.apply_configuration(apply("version: v1alpha1\n", Mode::NoReboot, true))
            .await
            .err(),
        c.read(ReadRequest {
            path: "/proc/sys/kernel/random/boot_id".into(),
        })
        .await
        .err(),
        c.reboot(RebootRequest::default()).await.err(),
        c.upgrade(UpgradeRequest::default()).await.err(),
        c.etcd_forfeit_leadership(m::EtcdForfeitLeadershipRequest {})
            .await
            .err(),
    ] {
        let err = err.ok_or("reader must be refused")?;
        assert_eq!(err.code(), Code::PermissionDenied);
        assert_eq!(err.message(), "not authorized");
    }
    // MachineConfig is a sensitive resource: admin only.
    let err = machine_config(ch).await.err().ok_or("sensitive")?;
    let status = err.downcast_ref::<tonic::Status>().ok_or("not a status")?;
    assert_eq!(status.code(), Code::PermissionDenied);
    Ok(())
}

#[tokio::test]
async fn fault_a_node_that_never_returns() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    sim.twin.with_model(|m| m.set_never_return("w-1", true));
    let mut w1 = sim.machine("w-1").await?;
    w1.reboot(RebootRequest::default()).await?;
    sim.clock.advance(S(3600));
    let err = w1.version(()).await.err().ok_or("still down")?;
    assert_eq!(err.code(), Code::Unavailable);
    assert!(sim
        .twin
        .with_model(|m| m.node_by_name("w-1").is_some_and(|n| !n.ready())));
    // Clearing the fault lets it finish booting.
    sim.twin.with_model(|m| m.set_never_return("w-1", false));
    sim.clock.advance(S(90));
    assert_eq!(version_tag(&mut w1).await?, "v1.13.2");
    Ok(())
}

#[tokio::test]
async fn fault_a_slow_apply_exceeds_the_callers_deadline() -> TestResult {
    let mut options = TalosTwinOptions::default();
    options.faults.slow_apply.insert("cp-1".into(), S(600));
    let sim = Sim::start_with(cluster("v1.13.2"), options).await?;
    let mut cp = sim.machine("cp-1").await?;
    let (config, version) = machine_config(sim.channel("cp-1").await?).await?;
    let bumped = config.replace("kube-apiserver:v1.33.1", "kube-apiserver:v1.34.0");
    let mut req = Request::new(apply(&bumped, Mode::NoReboot, false));
    // The twin waits 600 simulated seconds that never pass; the wall-clock deadline fires.
    req.set_timeout(Duration::from_millis(300));
    let err = tokio::time::timeout(S(10), cp.apply_configuration(req))
        .await?
        .err()
        .ok_or("the apply must not answer in time")?;
    // tonic reports its own expired deadline as Cancelled "Timeout expired"; a Go client
    // reports DeadlineExceeded. Either way the call did not complete.
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert_eq!(machine_config(sim.channel("cp-1").await?).await?.1, version);
    Ok(())
}

#[tokio::test]
async fn machine_config_resource_and_custom_timings() -> TestResult {
    let options = TalosTwinOptions {
        timings: Timings {
            reboot: S(10),
            ..Timings::default()
        },
        ..TalosTwinOptions::default()
    };
    let sim = Sim::start_with(cluster("v1.11.5"), options).await?;
    let mut state = StateClient::new(sim.channel("cp-1").await?);
    let r = state
        .get(GetRequest {
            namespace: "config".into(),
            r#type: "MachineConfigs.config.talos.dev".into(),
            id: "v1alpha1".into(),
            options: None,
        })
        .await?
        .into_inner();
    let res = r.resource.ok_or("no resource")?;
    let md = res.metadata.ok_or("no metadata")?;
    assert_eq!(
        (md.namespace.as_str(), md.id.as_str()),
        ("config", "v1alpha1")
    );
    // Before 1.12 yaml_spec is the raw config.
    assert!(res
        .spec
        .ok_or("no spec")?
        .yaml_spec
        .starts_with("version: v1alpha1"));
    let err = state
        .get(GetRequest {
            namespace: "config".into(),
            r#type: "MachineConfigs.config.talos.dev".into(),
            id: "nope".into(),
            options: None,
        })
        .await
        .err()
        .ok_or("missing id")?;
    assert_eq!(err.code(), Code::NotFound);

    let mut cp = sim.machine("cp-1").await?;
    cp.reboot(RebootRequest::default()).await?;
    sim.clock.advance(S(10));
    assert!(cp.version(()).await.is_ok());
    Ok(())
}

#[tokio::test]
async fn cosi_watch_reports_machine_config_changes() -> TestResult {
    use ichor::talos::proto::cosi::resource::{EventType, WatchOptions, WatchRequest};
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let (config, _) = machine_config(sim.channel("cp-2").await?).await?;
    let mut state = StateClient::new(sim.channel("cp-1").await?);
    let mut watch = state
        .watch(to_node(
            WatchRequest {
                namespace: "config".into(),
                r#type: "MachineConfigs.config.talos.dev".into(),
                id: Some("v1alpha1".into()),
                options: Some(WatchOptions::default()),
                api_version: 1,
            },
            "cp-2",
        )?)
        .await?
        .into_inner();
    let ready = watch.message().await?.ok_or("no first response")?;
    assert!(ready.event.is_empty(), "empty first WatchResponse");
    let created = watch.message().await?.ok_or("no initial event")?;
    assert_eq!(created.event[0].event_type, EventType::Created as i32);
    let v0 = created.event[0]
        .resource
        .as_ref()
        .and_then(|r| r.metadata.as_ref())
        .map(|m| m.version.clone());

    let bumped = config.replace("kube-scheduler:v1.33.1", "kube-scheduler:v1.34.0");
    sim.machine("cp-2")
        .await?
        .apply_configuration(apply(&bumped, Mode::NoReboot, false))
        .await?;
    let updated = watch.message().await?.ok_or("no update")?;
    let e = &updated.event[0];
    assert_eq!(e.event_type, EventType::Updated as i32);
    let v1 = e
        .resource
        .as_ref()
        .and_then(|r| r.metadata.as_ref())
        .map(|m| m.version.clone());
    assert_ne!(v1, v0, "the resource version moves with the config");
    let spec = e
        .resource
        .as_ref()
        .and_then(|r| r.spec.as_ref())
        .ok_or("no spec")?;
    let yaml = MachineConfigSpec::decode(spec.proto_spec.as_slice())?.yaml_marshalled;
    assert_eq!(String::from_utf8(yaml)?, bumped);
    Ok(())
}

#[tokio::test]
async fn observations_follow_the_clock_without_any_call() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let before = sim.twin.observe();
    let w1 = before.iter().find(|n| n.name == "w-1").ok_or("w-1")?;
    assert!(w1.up && w1.ready && !w1.etcd_member);
    assert_eq!(w1.kubelet_version, "v1.32.4");
    assert_eq!(w1.talos_version, "v1.13.2");
    let cp1 = before.iter().find(|n| n.name == "cp-1").ok_or("cp-1")?;
    assert!(cp1.etcd_member && cp1.static_pods.len() == 3);
    assert!(cp1.static_pods.iter().all(|p| p.ready));

    sim.machine("w-1")
        .await?
        .reboot(RebootRequest::default())
        .await?;
    let mut changes = sim.twin.changes();
    changes.borrow_and_update();
    sim.clock.advance(S(90));
    // The twin's driver applies the return on its own and announces it.
    tokio::time::timeout(S(10), changes.changed()).await??;
    let after = sim.twin.with_model(|m| m.observe());
    let w1_after = after.iter().find(|n| n.name == "w-1").ok_or("w-1")?;
    assert!(w1_after.ready);
    assert_ne!(w1_after.boot_id, w1.boot_id);
    Ok(())
}

#[tokio::test]
async fn nodes_metadata_fans_out_unary_calls_like_apid() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    sim.machine("cp-3")
        .await?
        .reboot(RebootRequest::default())
        .await?;
    let mut cp = sim.machine("cp-1").await?;
    let mut req = Request::new(());
    for n in ["cp-1", "10.5.0.11", "cp-3", "10.9.9.9"] {
        req.metadata_mut().append("nodes", n.parse()?);
    }
    let r = cp.version(req).await?.into_inner();
    let rows: Vec<(String, String, Option<i32>, String)> = r
        .messages
        .iter()
        .map(|v| {
            let md = v.metadata.clone().unwrap_or_default();
            (
                md.hostname,
                v.version
                    .as_ref()
                    .map(|v| v.tag.clone())
                    .unwrap_or_default(),
                md.status.map(|s| s.code),
                md.error,
            )
        })
        .collect();
    assert_eq!(rows.len(), 4);
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str()),
        ("cp-1", "v1.13.2")
    );
    assert_eq!(
        (rows[1].0.as_str(), rows[1].1.as_str()),
        ("10.5.0.11", "v1.14.0")
    );
    assert!(rows[0].2.is_none() && rows[0].3.is_empty());
    // Failing targets are reported in metadata while the call succeeds.
    assert_eq!(rows[2].0, "cp-3");
    assert_eq!(rows[2].2, Some(Code::Unavailable as i32));
    assert!(!rows[2].3.is_empty());
    assert_eq!(rows[3].2, Some(Code::Unavailable as i32));

    // Workers cannot fan out; COSI refuses one-to-many.
    let mut w = sim.machine("w-1").await?;
    let mut req = Request::new(());
    req.metadata_mut().append("nodes", "cp-1".parse()?);
    let err = w.version(req).await.err().ok_or("no forwarding")?;
    assert_eq!(err.code(), Code::PermissionDenied);
    let mut state = StateClient::new(sim.channel("cp-1").await?);
    let mut req = Request::new(GetRequest {
        namespace: "config".into(),
        r#type: "MachineConfigs.config.talos.dev".into(),
        id: "v1alpha1".into(),
        options: None,
    });
    req.metadata_mut().append("nodes", "cp-2".parse()?);
    let err = state.get(req).await.err().ok_or("cosi one-to-many")?;
    assert_eq!(err.code(), Code::InvalidArgument);
    Ok(())
}

#[tokio::test]
async fn legacy_upgrade_refusals_on_control_planes_and_failing_installer() -> TestResult {
    let sim = Sim::start(cluster("v1.12.4")).await?;
    let installer = "ghcr.io/siderolabs/installer:v1.13.0";
    let up = |image: &str| UpgradeRequest {
        image: image.into(),
        ..Default::default()
    };
    sim.machine("cp-1").await?.upgrade(up(installer)).await?;
    // One control plane at a time, unless forced: cp-1's upgrade sequence has stopped its
    // etcd member, so cp-2's etcd validation finds it not healthy (a plain Go error: Unknown).
    let err = sim
        .machine("cp-2")
        .await?
        .upgrade(up(installer))
        .await
        .err()
        .ok_or("second control plane must wait")?;
    assert_eq!(err.code(), Code::Unknown);
    assert!(
        err.message()
            .starts_with("error validating etcd for upgrade: etcd member ")
            && err
                .message()
                .contains("is not healthy; all members must be healthy to perform an upgrade"),
        "{}",
        err.message()
    );
    // While cp-1 is down, etcd is not fully healthy: still refused.
    sim.clock.advance(S(30));
    let err = sim
        .machine("cp-2")
        .await?
        .upgrade(up(installer))
        .await
        .err()
        .ok_or("unhealthy etcd")?;
    assert_eq!(err.code(), Code::Unknown);
    // A failing installer pull, and an upgrade path the installer refuses.
    sim.twin
        .with_model(|m| m.set_failing_image("ghcr.io/siderolabs/installer:v1.13.1", true));
    let mut w1 = sim.machine("w-1").await?;
    let err = w1
        .upgrade(up("ghcr.io/siderolabs/installer:v1.13.1"))
        .await
        .err()
        .ok_or("failing pull")?;
    assert_eq!(err.code(), Code::NotFound);
    let err = w1
        .upgrade(up("ghcr.io/siderolabs/installer:v1.15.0"))
        .await
        .err()
        .ok_or("too far")?;
    assert_eq!(err.code(), Code::FailedPrecondition);
    Ok(())
}

/// Each rule of upstream's `CanApplyImmediate` on a 1.13 node, by a NO_REBOOT dry run (the
/// check comes before the dry run answers), plus the loader's refusal of unknown keys and
/// the 1.14 rules.
#[tokio::test]
async fn no_reboot_follows_can_apply_immediate_and_unknown_keys_are_refused() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut cp = sim.machine("cp-1").await?;
    let (config, _) = machine_config(sim.channel("cp-1").await?).await?;
    let under_machine =
        |section: &str| config.replace("machine:\n", &format!("machine:\n{section}"));
    let immediate = [
        ("debug", config.replace("debug: false", "debug: true")),
        ("cluster", config.replace("clusterName: sim", "clusterName: sim2")),
        ("machine.network", config.replace("hostname: cp-1", "hostname: cp-one")),
        ("machine.install", config.replace("disk: /dev/sda", "disk: /dev/sdb")),
        ("machine.kubelet", config.replace("  kubelet:\n", "  kubelet:\n    extraArgs:\n      v: \"2\"\n")),
        ("machine.sysctls", under_machine("  sysctls:\n    net.core.somaxconn: \"65535\"\n")),
        ("machine.sysfs", under_machine("  sysfs:\n    devices.system.cpu.cpu0.cpufreq.scaling_governor: performance\n")),
        ("machine.certSANs", under_machine("  certSANs:\n    - cp.example.org\n")),
        ("machine.kernel", under_machine("  kernel:\n    modules:\n      - name: br_netfilter\n")),
        ("machine.nodeLabels", under_machine("  nodeLabels:\n    zone: a\n")),
        ("machine.nodeAnnotations", under_machine("  nodeAnnotations:\n    team: infra\n")),
        ("machine.nodeTaints", under_machine("  nodeTaints:\n    dedicated: infra:NoSchedule\n")),
        ("machine.time", under_machine("  time:\n    servers:\n      - time.cloudflare.com\n")),
        ("machine.registries", under_machine("  registries:\n    mirrors:\n      docker.io:\n        endpoints:\n          - https://mirror.example.org\n")),
        ("machine.pods", under_machine("  pods:\n    - apiVersion: v1\n      kind: Pod\n      metadata:\n        name: x\n")),
        ("machine.logging", under_machine("  logging:\n    destinations:\n      - endpoint: udp://10.0.0.1:514\n        format: json_lines\n")),
        ("machine.controlPlane", under_machine("  controlPlane:\n    scheduler:\n      disabled: true\n")),
    ];
    for (what, cfg) in &immediate {
        assert_ne!(cfg, &config, "{what}: the edit changed nothing");
        let r = cp
            .apply_configuration(apply(cfg, Mode::NoReboot, true))
            .await
            .map_err(|e| format!("{what} must apply immediately: {}", e.message()))?;
        assert_eq!(
            r.into_inner().messages[0].mode,
            Mode::NoReboot as i32,
            "{what}"
        );
        let r = cp.apply_configuration(apply(cfg, Mode::Auto, true)).await?;
        assert_eq!(
            r.into_inner().messages[0].mode,
            Mode::NoReboot as i32,
            "AUTO, {what}"
        );
    }
    let reboot = [
        ("machine.env", under_machine("  env:\n    http_proxy: http://proxy:3128\n")),
        ("machine.type", config.replace("type: controlplane", "type: worker")),
        ("machine.files", under_machine("  files:\n    - path: /var/f\n      op: create\n      content: x\n      permissions: 0o644\n")),
        ("machine.features", under_machine("  features:\n    kubePrism:\n      enabled: true\n")),
    ];
    for (what, cfg) in &reboot {
        let err = cp
            .apply_configuration(apply(cfg, Mode::NoReboot, true))
            .await
            .err()
            .ok_or(format!("{what} needs a reboot"))?;
        assert_eq!(err.code(), Code::InvalidArgument, "{what}");
        assert!(err.message().contains(what), "{what}: {}", err.message());
        let r = cp.apply_configuration(apply(cfg, Mode::Auto, true)).await?;
        assert_eq!(
            r.into_inner().messages[0].mode,
            Mode::Reboot as i32,
            "AUTO, {what}"
        );
    }
    // Unknown keys: the loader refuses them, whatever the mode.
    for (key, cfg) in [
        ("machine.bogus", under_machine("  bogus: 1\n")),
        (
            "cluster.nope",
            config.replace("cluster:\n", "cluster:\n  nope: 1\n"),
        ),
        ("extra", format!("{config}extra: 1\n")),
    ] {
        let err = cp
            .apply_configuration(apply(&cfg, Mode::Staged, true))
            .await
            .err()
            .ok_or(format!("{key} must be refused"))?;
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().contains("unknown keys") && err.message().contains(key),
            "{key}: {}",
            err.message()
        );
    }
    // 1.14: REBOOT is Unimplemented and AUTO is NO_REBOOT even for machine.env.
    let mut w2 = sim.machine("w-2").await?;
    let (multi, _) = machine_config(sim.channel("w-2").await?).await?;
    let env = multi.replace("machine:\n", "machine:\n  env:\n    FOO: bar\n");
    let err = w2
        .apply_configuration(apply(&env, Mode::Reboot, true))
        .await
        .err()
        .ok_or("REBOOT on 1.14")?;
    assert_eq!(err.code(), Code::Unimplemented);
    let r = w2
        .apply_configuration(apply(&env, Mode::Auto, true))
        .await?;
    assert_eq!(r.into_inner().messages[0].mode, Mode::NoReboot as i32);
    Ok(())
}

/// The talosconfig key is Go's PKCS#8 v1 form (48 bytes: the seed only) under Talos's
/// `ED25519 PRIVATE KEY` label; with the standard label OpenSSL loads it (OpenSSL 3.0
/// refuses ring's v2 form, and knows no `ED25519 PRIVATE KEY` label for either).
#[tokio::test]
#[ignore = "needs openssl: scripts/test installs it"]
async fn the_talosconfig_key_is_pkcs8_v1_as_go_writes_it_and_openssl_loads_it() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let text = std::fs::read_to_string(sim.twin.talosconfig_path())?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let ctx = &doc["contexts"][doc["context"].as_str().ok_or("no context")?];
    let pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD.decode(ctx["key"].as_str().ok_or("no key")?)?,
    )?;
    assert!(
        pem.starts_with("-----BEGIN ED25519 PRIVATE KEY-----\n"),
        "{pem}"
    );
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(body)?;
    assert_eq!(der.len(), 48, "PKCS#8 v1: no public key");
    assert_eq!(
        der[..16],
        [
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20
        ]
    );
    // The key still authenticates (rustls loads v1), as every other test here shows too.
    let mut cp = sim.machine("cp-1").await?;
    cp.version(()).await?;
    let openssl = crate::tools::OPENSSL.path();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("key.pem");
    std::fs::write(&path, pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY"))?;
    let out = std::process::Command::new(openssl)
        .args(["pkey", "-noout", "-in"])
        .arg(&path)
        .output()?;
    assert!(
        out.status.success(),
        "openssl pkey: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test]
async fn cosi_serves_the_machine_status() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut state = StateClient::new(sim.channel("w-1").await?);
    let get = |id: &str| GetRequest {
        namespace: "runtime".into(),
        r#type: "MachineStatuses.runtime.talos.dev".into(),
        id: id.into(),
        options: None,
    };
    let r = state.get(get("machine")).await?.into_inner();
    let res = r.resource.ok_or("no resource")?;
    let md = res.metadata.ok_or("no metadata")?;
    assert_eq!(
        (md.namespace.as_str(), md.id.as_str()),
        ("runtime", "machine")
    );
    let spec: serde_yaml::Value = serde_yaml::from_str(&res.spec.ok_or("no spec")?.yaml_spec)?;
    assert_eq!(spec["stage"], "running");
    assert_eq!(spec["status"]["ready"], true);
    let err = state
        .get(get("other"))
        .await
        .err()
        .ok_or("only `machine` exists")?;
    assert_eq!(err.code(), Code::NotFound);
    let mut list = state
        .list(ichor::talos::proto::cosi::resource::ListRequest {
            namespace: "runtime".into(),
            r#type: "MachineStatuses.runtime.talos.dev".into(),
            options: None,
        })
        .await?
        .into_inner();
    let mut n = 0;
    while let Some(m) = list.message().await? {
        n += usize::from(m.resource.is_some());
    }
    assert_eq!(n, 1);
    Ok(())
}

#[tokio::test]
async fn cosi_serves_bootstrap_manifests_following_the_config() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let list = |ch: Channel| async move {
        let mut state = StateClient::new(ch);
        let mut s = state
            .list(ichor::talos::proto::cosi::resource::ListRequest {
                namespace: "controlplane".into(),
                r#type: "Manifests.kubernetes.talos.dev".into(),
                options: None,
            })
            .await?
            .into_inner();
        let mut out = Vec::new();
        while let Some(m) = s.message().await? {
            let res = m.resource.ok_or("no resource")?;
            let md = res.metadata.ok_or("no metadata")?;
            let spec = res.spec.ok_or("no spec")?;
            assert!(spec.proto_spec.is_empty());
            out.push((md.id, md.version, spec.yaml_spec));
        }
        Ok::<_, Box<dyn std::error::Error>>(out)
    };
    let image_in = |items: &[(String, String, String)], id: &str| -> Option<String> {
        let (_, _, yaml) = items.iter().find(|(i, _, _)| i == id)?;
        let v: serde_yaml::Value = serde_yaml::from_str(yaml).ok()?;
        v[0]["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .map(str::to_string)
    };
    let before = list(sim.channel("cp-1").await?).await?;
    for (id, _, yaml) in &before {
        let v: serde_yaml::Value = serde_yaml::from_str(yaml)?;
        assert!(
            v.as_sequence().is_some_and(|s| !s.is_empty()),
            "{id}: {yaml}"
        );
    }
    let ids: Vec<&str> = before.iter().map(|(i, _, _)| i.as_str()).collect();
    assert_eq!(
        ids,
        [
            "00-kubelet-bootstrapping-token",
            "10-kube-proxy",
            "11-core-dns",
            "11-kube-config-in-cluster"
        ]
    );
    assert_eq!(
        image_in(&before, "11-core-dns").as_deref(),
        Some("registry.k8s.io/coredns/coredns:v1.12.1")
    );
    let proxy = image_in(&before, "10-kube-proxy").ok_or("no kube-proxy image")?;
    assert!(proxy.starts_with("registry.k8s.io/kube-proxy:"), "{proxy}");
    // Workers render no bootstrap manifests.
    assert!(list(sim.channel("w-1").await?).await?.is_empty());

    // Get one by id; a missing id is NotFound.
    let mut state = StateClient::new(sim.channel("cp-1").await?);
    let get = |id: &str| GetRequest {
        namespace: "controlplane".into(),
        r#type: "Manifests.kubernetes.talos.dev".into(),
        id: id.into(),
        options: None,
    };
    let r = state.get(get("11-core-dns")).await?.into_inner();
    let md = r.resource.and_then(|r| r.metadata).ok_or("no metadata")?;
    assert_eq!(md.id, "11-core-dns");
    let err = state.get(get("99-none")).await.err().ok_or("missing id")?;
    assert_eq!(err.code(), Code::NotFound);

    // A new kube-proxy image and a CoreDNS image in the config show up, version bumped.
    let (config, _) = machine_config(sim.channel("cp-1").await?).await?;
    let new_proxy = "registry.k8s.io/kube-proxy:v1.34.0";
    let changed = config.replace(&proxy, new_proxy).replacen(
        "cluster:\n",
        "cluster:\n  coreDNS:\n    image: registry.k8s.io/coredns/coredns:v1.13.0\n",
        1,
    );
    assert_ne!(changed, config);
    let mut cp = sim.machine("cp-1").await?;
    cp.apply_configuration(apply(&changed, Mode::NoReboot, false))
        .await?;
    let after = list(sim.channel("cp-1").await?).await?;
    assert_eq!(
        image_in(&after, "10-kube-proxy").as_deref(),
        Some(new_proxy)
    );
    assert_eq!(
        image_in(&after, "11-core-dns").as_deref(),
        Some("registry.k8s.io/coredns/coredns:v1.13.0")
    );
    assert_ne!(after[1].1, before[1].1, "resource version bumps");
    Ok(())
}

#[tokio::test]
async fn nodes_metadata_fans_out_read_with_one_node_down() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    sim.machine("cp-3")
        .await?
        .reboot(RebootRequest::default())
        .await?;
    let mut cp = sim.machine("cp-1").await?;
    let mut req = Request::new(m::ReadRequest {
        path: "/proc/sys/kernel/random/boot_id".into(),
    });
    for n in ["cp-1", "cp-3"] {
        req.metadata_mut().append("nodes", n.parse()?);
    }
    let mut stream = cp.read(req).await?.into_inner();
    let mut got = Vec::new();
    while let Some(d) = stream.message().await? {
        got.push(d);
    }
    assert_eq!(got.len(), 2);
    let md0 = got[0].metadata.clone().ok_or("no metadata")?;
    assert_eq!(md0.hostname, "cp-1");
    assert!(md0.error.is_empty() && md0.status.is_none());
    let boot = String::from_utf8(got[0].bytes.clone())?;
    assert_eq!(boot.trim().len(), 36, "{boot:?}");
    // The node that is down contributes one message with only the error; the call succeeds.
    let md1 = got[1].metadata.clone().ok_or("no metadata")?;
    assert_eq!(md1.hostname, "cp-3");
    assert!(got[1].bytes.is_empty());
    assert!(!md1.error.is_empty());
    assert_eq!(md1.status.map(|s| s.code), Some(Code::Unavailable as i32));
    Ok(())
}

#[tokio::test]
async fn bootstrap_manifests_follow_the_kube_proxy_config_document_on_1_14() -> TestResult {
    let multi = ConfigForm::MultiDoc;
    let sim = Sim::start(vec![
        node("cp-1", Role::ControlPlane, [10, 5, 0, 2], "v1.14.0", multi),
        node("w-1", Role::Worker, [10, 5, 0, 10], "v1.14.0", multi),
    ])
    .await?;
    let proxy_image = |ch: Channel| async move {
        let r = StateClient::new(ch)
            .get(GetRequest {
                namespace: "controlplane".into(),
                r#type: "Manifests.kubernetes.talos.dev".into(),
                id: "10-kube-proxy".into(),
                options: None,
            })
            .await?
            .into_inner();
        let res = r.resource.ok_or("no resource")?;
        let version = res.metadata.ok_or("no metadata")?.version;
        let yaml: serde_yaml::Value = serde_yaml::from_str(&res.spec.ok_or("no spec")?.yaml_spec)?;
        let image = yaml[0]["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .ok_or("no image")?
            .to_string();
        Ok::<_, Box<dyn std::error::Error>>((image, version))
    };
    let (before, v1) = proxy_image(sim.channel("cp-1").await?).await?;
    assert_eq!(before, "registry.k8s.io/kube-proxy:v1.33.1");
    let (config, _) = machine_config(sim.channel("cp-1").await?).await?;
    assert!(config.contains("kind: KubeProxyConfig"), "{config}");
    let new = "registry.k8s.io/kube-proxy:v1.34.1";
    let changed = config.replace(&before, new);
    let r = sim
        .machine("cp-1")
        .await?
        .apply_configuration(apply(&changed, Mode::NoReboot, false))
        .await?;
    assert_eq!(r.into_inner().messages[0].mode, Mode::NoReboot as i32);
    // No reboot, no clock: the resource follows the active config at once.
    let (after, v2) = proxy_image(sim.channel("cp-1").await?).await?;
    assert_eq!(after, new);
    assert_ne!(v1, v2, "the resource version bumps with the config");
    Ok(())
}

/// A TRY reverts after its timeout unless another request comes first: any request but TRY
/// cancels the rollback, a dry run included (siderolabs/talos v1.13.9
/// internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go `ApplyConfiguration`
/// cancels it before it even parses the request).
#[tokio::test]
async fn a_try_reverts_unless_another_request_even_a_dry_run_cancels_the_rollback() -> TestResult {
    let sim = Sim::start(cluster("v1.13.2")).await?;
    let mut cp = sim.machine("cp-1").await?;
    let (config, _) = machine_config(sim.channel("cp-1").await?).await?;
    let tried = config.replace("hostname: cp-1", "hostname: cp-one");
    // Left alone, a TRY reverts after a minute.
    let r = cp
        .apply_configuration(apply(&tried, Mode::Try, false))
        .await?;
    let details = &r.into_inner().messages[0].mode_details;
    assert_eq!(
        details,
        "Applied configuration without a reboot\nThe config is applied in 'try' mode and will be automatically reverted back in 1m0s"
    );
    assert_eq!(machine_config(sim.channel("cp-1").await?).await?.0, tried);
    sim.clock.advance(S(61));
    assert_eq!(machine_config(sim.channel("cp-1").await?).await?.0, config);
    // A dry run inside the window makes the trial stay.
    cp.apply_configuration(apply(&tried, Mode::Try, false))
        .await?;
    cp.apply_configuration(apply(&config, Mode::NoReboot, true))
        .await?;
    sim.clock.advance(S(61));
    assert_eq!(machine_config(sim.channel("cp-1").await?).await?.0, tried);
    Ok(())
}
