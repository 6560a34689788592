//! The Talos upgrade traps in the live gate (issue 15 item 9), judged from each node's live
//! configuration and versions, read through ichor's own Talos client over real mutual TLS
//! from the whole twin (the homelab folder at the Talos and Kubernetes versions a test
//! names). Time moves only through the twin's manual clock.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor::clock::Clock;
use ichor::gate::{self, live, Change};
use ichor::kube::KubeClient;
use ichor::policy::{CheckItem, Status};
use ichor::releaseset::{Bump, ReleaseSet};
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
use ichor::talos::{CallOptions, TalosClient};
use serde_yaml::Value;

use crate::homelab;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// What the fixture's main runs; each test moves it to the versions it needs.
const MAIN_TALOS: &str = "v1.12.6";
const MAIN_KUBERNETES: &str = "v1.33.5";
/// Supported by Talos 1.13 and 1.14 alike.
const KUBERNETES: &str = "v1.34.2";

struct Live {
    twin: Twin,
    kube: KubeClient,
    talos: TalosClient,
    _state: tempfile::TempDir,
}

/// The homelab folder as main has it, with its nodes on `talos`.
fn folder(dir: &Path, talos: &str) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let repo = ichor::git::Repo::open(homelab())?;
    let main = repo.resolve("main")?;
    let out = dir.join("homelab");
    std::fs::create_dir_all(&out)?;
    for f in ["cluster.yaml", "release-set.yaml"] {
        let text = repo
            .read_file(&main, &format!("clusters/homelab/{f}"))?
            .ok_or("missing in the fixture")?
            .replace(MAIN_TALOS, talos)
            .replace(MAIN_KUBERNETES, KUBERNETES);
        std::fs::write(out.join(f), text)?;
    }
    Ok(out)
}

async fn start(talos: &str) -> Result<Live, Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let twin = Twin::start(
        Clock::manual(),
        &ClusterFolder::read(&folder(state.path(), talos)?)?,
        state.path(),
        TwinOptions {
            config: TwinConfig::default(),
            github: None,
        },
    )
    .await?;
    twin.advance(Duration::from_secs(30));
    let kube = KubeClient::connect(Some(twin.kubeconfig())).await?;
    let ctx = ichor::talos::config::load(twin.talosconfig(), None)?;
    let talos = TalosClient::new(ctx, twin.talos.clock().clone());
    Ok(Live {
        twin,
        kube,
        talos,
        _state: state,
    })
}

/// The fixture's cluster moving Talos `from` → `to`; `installer`: keep cluster.yaml's
/// `spec.talos.installerImage` (else the cluster names none).
fn change(from: &str, to: &str, installer: bool) -> Result<Change, Box<dyn std::error::Error>> {
    let repo = ichor::git::Repo::open(homelab())?;
    let mut change = gate::load(&repo, "main", "main", None)?;
    let text =
        serde_yaml::to_string(&change.base_release_set)?.replace(MAIN_KUBERNETES, KUBERNETES);
    change.base_release_set = ReleaseSet::parse("base", &text.replace(MAIN_TALOS, from))?;
    change.head_release_set = ReleaseSet::parse("head", &text.replace(MAIN_TALOS, to))?;
    change.bump = Bump::between(&change.base_release_set, &change.head_release_set);
    if !installer {
        if let Some(doc) = change.cluster_doc.as_mut() {
            doc.spec.talos.installer_image = None;
        }
    }
    Ok(change)
}

async fn judge(l: &Live, change: &Change) -> Vec<CheckItem> {
    let facts = live::observe(&l.kube, Some(&l.talos), &live::Subject::of(change)).await;
    live::items(change, &facts)
}

fn item<'a>(items: &'a [CheckItem], id: &str) -> &'a CheckItem {
    items
        .iter()
        .find(|i| i.id == id)
        .unwrap_or_else(|| panic!("no item {id} in {items:#?}"))
}

fn text(i: &CheckItem) -> String {
    format!("{} {}", i.message, i.hint.clone().unwrap_or_default())
}

fn configure(l: &Live, node: &str, paths: &[(&str, Value)]) -> Result<(), String> {
    let paths: Vec<(String, Value)> = paths
        .iter()
        .map(|(p, v)| (p.to_string(), v.clone()))
        .collect();
    l.twin
        .talos
        .with_model(|m| m.configure_node(node, &paths))
        .map_err(|e| e.to_string())
}

fn args() -> Value {
    Value::Sequence(vec![Value::String("console=ttyS1,115200".into())])
}

/// Talos 1.13 nodes upgrade through LifecycleService/Upgrade, which drops
/// `.machine.install.extraKernelArgs`: a GRUB node that keeps them there (grubUseUKICmdline
/// false) is named; a systemd-boot node (SecurityState `bootedWithUKI`) is not; and the
/// twin refuses the arguments beside grubUseUKICmdline: true, as Talos's validation does.
#[tokio::test]
async fn a_grub_node_with_extra_kernel_args_is_named_before_a_lifecycle_upgrade() -> TestResult {
    let l = start("v1.13.9").await?;
    let to_1_14 = change("v1.13.9", "v1.14.1", true)?;
    // Configurations generated for 1.12 and later use the UKI command line.
    let items = judge(&l, &to_1_14).await;
    let i = item(&items, "live/extra-kernel-args");
    assert_eq!(i.status, Status::Pass, "{}", text(i));

    let refused = configure(&l, "w-1", &[("machine.install.extraKernelArgs", args())]);
    assert_eq!(
        refused,
        Err("install.extraKernelArgs and install.grubUseUKICmdline can't be used together".into())
    );
    for node in ["w-1", "w-2"] {
        configure(
            &l,
            node,
            &[
                ("machine.install.grubUseUKICmdline", Value::Bool(false)),
                ("machine.install.extraKernelArgs", args()),
            ],
        )?;
    }
    l.twin
        .talos
        .with_model(|m| m.set_booted_with_uki("w-2", true));
    assert_eq!(
        l.talos
            .booted_with_uki("10.0.10.22", CallOptions::default())
            .await?,
        Some(true)
    );
    let items = judge(&l, &to_1_14).await;
    let i = item(&items, "live/extra-kernel-args");
    assert_eq!(i.status, Status::Warn, "{}", text(i));
    let t = text(i);
    assert!(
        t.contains("w-1 (booted by GRUB; extraKernelArgs: console=ttyS1,115200)"),
        "{t}"
    );
    assert!(!t.contains("w-2") && !t.contains("cp-1"), "{t}");
    assert!(
        t.contains("internal/app/lifecycle/lifecycle.go@v1.13.9"),
        "{t}"
    );
    assert!(
        t.contains("talosctl upgrade --legacy") && t.contains("grubUseUKICmdline: true"),
        "{t}"
    );
    // A patch within 1.13 goes through LifecycleService too.
    let items = judge(&l, &change("v1.13.9", "v1.13.10", true)?).await;
    assert_eq!(item(&items, "live/extra-kernel-args").status, Status::Warn);
    Ok(())
}

/// The move onto 1.13 goes through the legacy MachineService/Upgrade, which passes the
/// arguments: no warning now, and the item says the next upgrade will not.
#[tokio::test]
async fn kernel_args_on_a_1_12_node_survive_the_legacy_upgrade_onto_1_13() -> TestResult {
    let l = start("v1.12.9").await?;
    configure(
        &l,
        "w-3",
        &[
            ("machine.install.grubUseUKICmdline", Value::Bool(false)),
            ("machine.install.extraKernelArgs", args()),
        ],
    )?;
    let items = judge(&l, &change("v1.12.9", "v1.13.2", true)?).await;
    let i = item(&items, "live/extra-kernel-args");
    assert_eq!(i.status, Status::Pass, "{}", text(i));
    assert!(
        i.message
            .contains("w-3 (Talos v1.12.9) keep theirs this time"),
        "{}",
        i.message
    );
    Ok(())
}

/// Talos 1.14 runs only etcd 3.6 or later: a control plane whose configuration pins a 3.5
/// image (and so runs it, as the twin's EtcdStatus reports) blocks the move; the port
/// move is a warning of its own.
#[tokio::test]
async fn an_etcd_older_than_3_6_blocks_the_move_to_talos_1_14() -> TestResult {
    let l = start("v1.13.9").await?;
    let to_1_14 = change("v1.13.9", "v1.14.1", true)?;
    let items = judge(&l, &to_1_14).await;
    let i = item(&items, "live/etcd-version");
    assert_eq!(i.status, Status::Pass, "{}", text(i));
    assert!(
        i.message.contains("cp-1 3.6.9") && i.message.contains("cp-3 3.6.9"),
        "{}",
        i.message
    );

    configure(
        &l,
        "cp-2",
        &[(
            "cluster.etcd.image",
            Value::String("registry.k8s.io/etcd:v3.5.21".into()),
        )],
    )?;
    assert_eq!(
        l.talos
            .etcd_status("10.0.10.12", CallOptions::default())
            .await?
            .version,
        "3.5.21"
    );
    let items = judge(&l, &to_1_14).await;
    let i = item(&items, "live/etcd-version");
    assert_eq!(i.status, Status::Fail, "{}", text(i));
    let t = text(i);
    assert!(
        t.contains("cp-2 pins .cluster.etcd.image registry.k8s.io/etcd:v3.5.21"),
        "{t}"
    );
    assert!(!t.contains("cp-1") && !t.contains("cp-3"), "{t}");
    assert!(
        t.contains("hack/release.toml@v1.14.0-rc.1 [notes.etcd]"),
        "{t}"
    );
    assert!(
        t.contains("while on Talos v1.13.9, move etcd to 3.6"),
        "{t}"
    );
    // Not a move to 1.14: nothing to judge.
    let items = judge(&l, &change("v1.13.9", "v1.13.10", true)?).await;
    assert!(
        !items.iter().any(|i| i.id == "live/etcd-version"),
        "{items:#?}"
    );

    // The static checklist warns about the HTTP port either way.
    let v = gate::verdict(&to_1_14);
    let port = v
        .items
        .iter()
        .find(|i| i.id == "talos-note/talos-1.14-etcd-http-port")
        .ok_or("no port note")?;
    assert_eq!(port.status, Status::Warn);
    assert!(
        port.message.contains("2383") && port.message.contains("2379"),
        "{}",
        port.message
    );
    Ok(())
}

/// Without `spec.talos.installerImage` in cluster.yaml, the installer each node's
/// configuration names is judged: `.machine.install.image` on a 1.13 node, the
/// `UnattendedInstallConfig` document's `installer.image` on a 1.14 one.
#[tokio::test]
async fn the_installer_the_nodes_name_is_judged_when_cluster_yaml_names_none() -> TestResult {
    let l = start("v1.13.9").await?;
    let items = judge(&l, &change("v1.13.9", "v1.14.1", false)?).await;
    let i = item(&items, "live/installer-image");
    assert_eq!(i.status, Status::Warn, "{}", text(i));
    let t = text(i);
    for n in ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"] {
        assert!(
            t.contains(&format!(
                "{n} (machine.install.image: ghcr.io/siderolabs/installer:v1.13.9)"
            )),
            "{n}: {t}"
        );
    }
    assert!(t.contains("factory.talos.dev"), "{t}");
    // cluster.yaml names one: the static note judges that one instead.
    let items = judge(&l, &change("v1.13.9", "v1.14.1", true)?).await;
    assert!(
        !items.iter().any(|i| i.id == "live/installer-image"),
        "{items:#?}"
    );

    drop(l);
    let l = start("v1.14.0").await?;
    let within = change("v1.14.0", "v1.14.1", false)?;
    let items = judge(&l, &within).await;
    let i = item(&items, "live/installer-image");
    assert_eq!(i.status, Status::Pass, "{}", text(i));
    assert!(
        i.message.contains(
            "w-1 (UnattendedInstallConfig.installer.image: factory.talos.dev/metal-installer/"
        ),
        "{}",
        i.message
    );
    // An operator's ghcr image in the document is named where it lives.
    let (yaml, _) = {
        let mc = l
            .talos
            .machine_config("10.0.10.21", CallOptions::default())
            .await?;
        (mc.yaml, mc.version)
    };
    let ghcr = yaml.replace(
        "image: factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.0",
        "image: ghcr.io/siderolabs/installer:v1.14.0",
    );
    assert_ne!(ghcr, yaml, "{yaml}");
    l.talos
        .apply_configuration(
            "10.0.10.21",
            &ghcr,
            ichor::talos::proto::machine::apply_configuration_request::Mode::NoReboot,
            false,
            CallOptions::default(),
        )
        .await?;
    let items = judge(&l, &within).await;
    let i = item(&items, "live/installer-image");
    assert_eq!(i.status, Status::Warn, "{}", text(i));
    assert!(
        i.message.contains(
            "w-1 (UnattendedInstallConfig.installer.image: ghcr.io/siderolabs/installer:v1.14.0)"
        ),
        "{}",
        i.message
    );
    assert!(!i.message.contains("w-2"), "{}", i.message);
    Ok(())
}

/// With a reader's certificate the machine configuration is out of reach (it is sensitive:
/// admin only): the items that need it say they could not be judged and why, never pass;
/// etcd is still judged from what each control plane's EtcdStatus reports.
#[tokio::test]
async fn an_unreadable_configuration_is_reported_as_not_judged() -> TestResult {
    let l = start("v1.13.9").await?;
    let reader = l.twin.talos.issue_client("reader", &["os:reader"])?;
    let mut ctx = l.talos.context().clone();
    ctx.crt_pem = reader.cert_pem;
    ctx.key_pem = reader.key_pem;
    let talos = TalosClient::new(ctx, l.twin.talos.clock().clone());
    let change = change("v1.13.9", "v1.14.1", false)?;
    let facts = live::observe(&l.kube, Some(&talos), &live::Subject::of(&change)).await;
    let items = live::items(&change, &facts);
    let i = item(&items, "live/extra-kernel-args");
    assert_eq!(i.status, Status::Warn, "{}", text(i));
    assert!(
        i.message
            .contains("could not be judged for cp-1 (its machine configuration: ")
            && i.message.contains("not authorized"),
        "{}",
        i.message
    );
    let i = item(&items, "live/installer-image");
    assert_eq!(i.status, Status::Warn, "{}", text(i));
    assert!(
        i.message.contains("could not judge")
            && i.message.contains("w-3 (")
            && i.message.contains("not authorized"),
        "{}",
        i.message
    );
    let i = item(&items, "live/etcd-version");
    assert_eq!(i.status, Status::Pass, "{}", text(i));
    Ok(())
}
