//! The one edit ichor makes to a node's machine configuration (ADR 0057): from the node's
//! active configuration, change only the Kubernetes component image fields to the target
//! tag, in whichever form the node uses — the v1alpha1 paths (`cluster.apiServer.image`, …,
//! `machine.kubelet.image`), or from Talos 1.14 the per-component documents
//! (`KubeAPIServerConfig`, …, `KubeletConfig`) — and nothing else. Before anything is
//! applied, the edit is compared with the original document by document and path by path:
//! a difference anywhere but the chosen image fields refuses the edit and names the paths.

use serde::Deserialize;
use serde_yaml::{Mapping, Value};

/// A Kubernetes component whose image lives in the machine config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    ApiServer,
    ControllerManager,
    Scheduler,
    Proxy,
    Kubelet,
}

impl Component {
    pub const ALL: [Component; 5] = [
        Component::ApiServer,
        Component::ControllerManager,
        Component::Scheduler,
        Component::Proxy,
        Component::Kubelet,
    ];

    /// The field path in the v1alpha1 document.
    fn legacy_path(self) -> [&'static str; 3] {
        match self {
            Component::ApiServer => ["cluster", "apiServer", "image"],
            Component::ControllerManager => ["cluster", "controllerManager", "image"],
            Component::Scheduler => ["cluster", "scheduler", "image"],
            Component::Proxy => ["cluster", "proxy", "image"],
            Component::Kubelet => ["machine", "kubelet", "image"],
        }
    }

    /// The Talos 1.14 document kind that replaces the v1alpha1 section.
    fn kind(self) -> &'static str {
        match self {
            Component::ApiServer => "KubeAPIServerConfig",
            Component::ControllerManager => "KubeControllerManagerConfig",
            Component::Scheduler => "KubeSchedulerConfig",
            Component::Proxy => "KubeProxyConfig",
            Component::Kubelet => "KubeletConfig",
        }
    }

    /// The repository used when the config names no image.
    pub fn default_repository(self) -> &'static str {
        match self {
            Component::ApiServer => "registry.k8s.io/kube-apiserver",
            Component::ControllerManager => "registry.k8s.io/kube-controller-manager",
            Component::Scheduler => "registry.k8s.io/kube-scheduler",
            Component::Proxy => "registry.k8s.io/kube-proxy",
            Component::Kubelet => "ghcr.io/siderolabs/kubelet",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::Proxy => "kube-proxy",
            Component::Kubelet => "kubelet",
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EditError {
    #[error("the machine configuration is not YAML: {0}")]
    Yaml(String),
    #[error("the machine configuration has no v1alpha1 document (`version: v1alpha1`)")]
    NoV1alpha1,
    #[error("{component}: the config sets both the {kind} document and its v1alpha1 field; Talos refuses that, so ichor will not edit it")]
    BothForms {
        component: Component,
        kind: &'static str,
    },
    #[error("the edit would change more than the image fields: {}", paths.join(", "))]
    OtherPaths { paths: Vec<String> },
    #[error("`{0}` is not an image tag (expected v<version>, e.g. v1.34.2)")]
    BadTag(String),
}

/// The edited configuration and what moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageEdit {
    pub yaml: String,
    /// (component, image before — `None` when the config named none —, image after).
    pub images: Vec<(Component, Option<String>, String)>,
}

impl ImageEdit {
    pub fn is_noop(&self) -> bool {
        self.images
            .iter()
            .all(|(_, old, new)| old.as_deref() == Some(new))
    }
}

fn documents(yaml: &str) -> Result<Vec<Value>, EditError> {
    let mut docs = Vec::new();
    for d in serde_yaml::Deserializer::from_str(yaml) {
        let v = Value::deserialize(d).map_err(|e| EditError::Yaml(e.to_string()))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

fn is_v1alpha1(doc: &Value) -> bool {
    doc.get("version").and_then(Value::as_str) == Some("v1alpha1") && doc.get("kind").is_none()
}

fn kind_of(doc: &Value) -> Option<&str> {
    doc.get("kind").and_then(Value::as_str)
}

/// The repository part of an image reference: no tag, no digest.
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rsplit_once(':') {
        // A `:` after the last `/` is a tag; before it, a registry port.
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => no_digest,
    }
}

/// Set `components`' images to `tag` (e.g. `v1.34.2`) in `config`, in the form the node
/// uses, and prove that nothing else changed.
pub fn set_images(
    config: &str,
    tag: &str,
    components: &[Component],
) -> Result<ImageEdit, EditError> {
    if !tag.starts_with('v') || crate::releaseset::Version::parse(tag).is_err() {
        return Err(EditError::BadTag(crate::releaseset::excerpt(tag, 40)));
    }
    let original = documents(config)?;
    let mut docs = original.clone();
    let legacy = docs
        .iter()
        .position(is_v1alpha1)
        .ok_or(EditError::NoV1alpha1)?;
    let mut images = Vec::new();
    for &c in components {
        let kind_doc = docs.iter().position(|d| kind_of(d) == Some(c.kind()));
        let [a, b, field] = c.legacy_path();
        let legacy_image = docs[legacy]
            .get(a)
            .and_then(|s| s.get(b))
            .and_then(|s| s.get(field))
            .and_then(Value::as_str)
            .map(str::to_string);
        let (slot, old): (&mut Value, Option<String>) = match kind_doc {
            Some(i) => {
                if legacy_image.is_some() {
                    return Err(EditError::BothForms {
                        component: c,
                        kind: c.kind(),
                    });
                }
                let old = docs[i]
                    .get("image")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                (&mut docs[i], old)
            }
            None => {
                let section = entry(entry(&mut docs[legacy], a), b);
                (section, legacy_image)
            }
        };
        let repo = old
            .as_deref()
            .map(repository)
            .unwrap_or(c.default_repository());
        let new = format!("{repo}:{tag}");
        set(slot, "image", Value::String(new.clone()));
        images.push((c, old, new));
    }
    let allowed: Vec<String> = images
        .iter()
        .map(
            |(c, _, _)| match docs.iter().any(|d| kind_of(d) == Some(c.kind())) {
                true => format!("{}.image", c.kind()),
                false => c.legacy_path().join("."),
            },
        )
        .collect();
    let yaml = docs
        .iter()
        .map(|d| serde_yaml::to_string(d).map_err(|e| EditError::Yaml(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?
        .join("---\n");
    let other: Vec<String> = changed_paths(&original, &documents(&yaml)?)
        .into_iter()
        .filter(|p| !allowed.contains(p))
        .collect();
    if !other.is_empty() {
        return Err(EditError::OtherPaths { paths: other });
    }
    Ok(ImageEdit { yaml, images })
}

/// The changes a node's configuration on disk (`persistent`) holds beyond the active one,
/// image fields aside: a STAGED configuration waiting for the next reboot, or the config a
/// TRY would roll back to (siderolabs/talos v1.13.9 v1alpha1_server.go `ApplyConfiguration`:
/// STAGED persists only; TRY sets the active config only; NO_REBOOT persists and activates,
/// so it would overwrite either). Empty when nothing but images differs.
pub fn pending_changes(active: &str, persistent: &str) -> Result<Vec<String>, EditError> {
    let (a, p) = (documents(active)?, documents(persistent)?);
    Ok(changed_paths(&a, &p)
        .into_iter()
        .filter(|path| !is_image_path(path))
        .collect())
}

/// A component's image field, in either form (`machine.kubelet.image`, `KubeletConfig.image`).
pub fn is_image_path(path: &str) -> bool {
    Component::ALL
        .iter()
        .any(|c| path == c.legacy_path().join(".") || path == format!("{}.image", c.kind()))
}

/// Every dotted path whose value differs between two document sets (`cluster.network.podSubnets`,
/// `KubeletConfig.extraArgs`); a document is named by its kind (`v1alpha1` for the legacy one).
pub fn changed_paths(old: &[Value], new: &[Value]) -> Vec<String> {
    let key = |d: &Value| -> String {
        match (kind_of(d), is_v1alpha1(d)) {
            (_, true) => "v1alpha1".into(),
            (Some(k), _) => match d.get("name").and_then(Value::as_str) {
                Some(n) => format!("{k}/{n}"),
                None => k.to_string(),
            },
            (None, _) => "document".into(),
        }
    };
    let index = |docs: &[Value]| -> std::collections::BTreeMap<String, Value> {
        docs.iter().map(|d| (key(d), d.clone())).collect()
    };
    let (a, b) = (index(old), index(new));
    let mut out = Vec::new();
    for k in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
        // Paths inside the legacy document read as Talos writes them (`cluster.proxy.image`).
        let prefix = if k == "v1alpha1" {
            String::new()
        } else {
            k.clone()
        };
        diff(&prefix, a.get(k), b.get(k), &mut out);
    }
    out
}

fn diff(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<String>) {
    // A section present on one side only is compared leaf by leaf with an empty one, so a
    // new `cluster.scheduler.image` reads as that path, not as all of `cluster.scheduler`.
    let empty = Value::Mapping(Mapping::new());
    let (a, b) = match (a, b) {
        (None, Some(y)) if y.is_mapping() => (Some(&empty), b),
        (Some(x), None) if x.is_mapping() => (a, Some(&empty)),
        other => other,
    };
    match (a, b) {
        (Some(Value::Mapping(x)), Some(Value::Mapping(y))) => {
            let mut keys: Vec<&Value> = x.keys().collect();
            keys.extend(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let name = match k {
                    Value::String(s) => s.clone(),
                    other => serde_yaml::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                };
                let p = if path.is_empty() {
                    name
                } else {
                    format!("{path}.{name}")
                };
                diff(&p, x.get(k), y.get(k), out);
            }
        }
        (x, y) if x != y => out.push(if path.is_empty() {
            "(document)".into()
        } else {
            path.to_string()
        }),
        _ => {}
    }
}

/// The mapping under `key`, created empty when absent (or when not a mapping, which the
/// path check then reports as a change of its own).
fn entry<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
    if !v.is_mapping() {
        *v = Value::Mapping(Mapping::new());
    }
    let Value::Mapping(m) = v else {
        unreachable!("made a mapping just above")
    };
    let slot = m
        .entry(Value::String(key.to_string()))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if !slot.is_mapping() {
        *slot = Value::Mapping(Mapping::new());
    }
    slot
}

fn set(v: &mut Value, key: &str, value: Value) {
    if let Value::Mapping(m) = v {
        m.insert(Value::String(key.to_string()), value);
    }
}

/// What a node's configuration says about how Talos installs it, read for the gate's upgrade
/// traps. Each field is where upstream keeps it:
/// - the installer image: the `UnattendedInstallConfig` document's `installer.image` (Talos
///   1.14, siderolabs/talos pkg/machinery/config/types/runtime/unattended_install.go at
///   v1.14.0-rc.1), else `.machine.install.image` (v1alpha1_types.go `InstallConfig`);
/// - `.machine.install.extraKernelArgs` and `.machine.install.grubUseUKICmdline` (absent is
///   false: v1alpha1_provider.go `GrubUseUKICmdline` at v1.13.9; with an
///   `UnattendedInstallConfig` the installer always uses the UKI command line,
///   cmd/installer/cmd/installer/install.go at v1.14.0-rc.1);
/// - `.cluster.etcd.image`, the etcd a control plane runs when it pins one
///   (v1alpha1_etcdconfig.go `Image`: the release's default otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstallSettings {
    /// The installer image the configuration names, and the path it is named at.
    pub installer_image: Option<(String, &'static str)>,
    pub extra_kernel_args: Vec<String>,
    pub grub_use_uki_cmdline: bool,
    /// The configuration has an `UnattendedInstallConfig` document.
    pub unattended_install: bool,
    pub etcd_image: Option<String>,
}

impl InstallSettings {
    /// Whether a GRUB boot builds its kernel command line on the host from
    /// `extraKernelArgs` (cmd/installer/pkg/install/install.go at v1.13.9: the legacy
    /// command line is used only without `grubUseUKICmdline`).
    pub fn grub_builds_cmdline(&self) -> bool {
        !self.grub_use_uki_cmdline && !self.unattended_install
    }
}

/// The `UnattendedInstallConfig` path of the installer image.
pub const UNATTENDED_IMAGE_PATH: &str = "UnattendedInstallConfig.installer.image";
/// The v1alpha1 path of the installer image.
pub const INSTALL_IMAGE_PATH: &str = "machine.install.image";

/// Read [`InstallSettings`] from a node's configuration. A value of the wrong shape is an
/// error naming its path, never a guess.
pub fn install_settings(config: &str) -> Result<InstallSettings, String> {
    let docs = documents(config).map_err(|e| e.to_string())?;
    let v1 = docs
        .iter()
        .find(|d| is_v1alpha1(d))
        .ok_or_else(|| EditError::NoV1alpha1.to_string())?;
    let at = |path: &[&str]| -> Option<&Value> {
        let mut v = v1;
        for k in path {
            v = v.get(*k)?;
        }
        (!v.is_null()).then_some(v)
    };
    let text = |path: &[&str]| -> Result<Option<String>, String> {
        match at(path) {
            None => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(_) => Err(format!("{} is not a string", path.join("."))),
        }
    };
    let mut out = InstallSettings::default();
    let unattended = docs
        .iter()
        .find(|d| kind_of(d) == Some("UnattendedInstallConfig"));
    if let Some(doc) = unattended {
        out.unattended_install = true;
        match doc.get("installer").and_then(|i| i.get("image")) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.trim().is_empty() => {}
            Some(Value::String(s)) => {
                out.installer_image = Some((s.trim().to_string(), UNATTENDED_IMAGE_PATH))
            }
            Some(_) => return Err(format!("{UNATTENDED_IMAGE_PATH} is not a string")),
        }
    }
    if out.installer_image.is_none() {
        out.installer_image =
            text(&["machine", "install", "image"])?.map(|i| (i, INSTALL_IMAGE_PATH));
    }
    out.extra_kernel_args = match at(&["machine", "install", "extraKernelArgs"]) {
        None => Vec::new(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                Value::Bool(b) => Ok(b.to_string()),
                _ => Err(
                    "machine.install.extraKernelArgs holds a value that is not a string"
                        .to_string(),
                ),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("machine.install.extraKernelArgs is not a list".into()),
    };
    out.grub_use_uki_cmdline = match at(&["machine", "install", "grubUseUKICmdline"]) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("machine.install.grubUseUKICmdline is not a boolean".into()),
    };
    out.etcd_image = text(&["cluster", "etcd", "image"])?;
    Ok(out)
}

/// Whether the configuration deploys kube-proxy: the v1alpha1 `cluster.proxy.disabled`
/// (pkg/machinery/config/types/v1alpha1/v1alpha1_types.go `ProxyConfig.Disabled`, default
/// false) or, in the multi-document form, `KubeProxyConfig.enabled` (default true). Talos
/// renders the kube-proxy DaemonSet among the bootstrap manifests only when it is deployed.
pub fn kube_proxy_enabled(config: &str) -> Result<bool, String> {
    let docs = documents(config).map_err(|e| e.to_string())?;
    if let Some(doc) = docs.iter().find(|d| kind_of(d) == Some("KubeProxyConfig")) {
        return match doc.get("enabled") {
            None | Some(Value::Null) => Ok(true),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err("KubeProxyConfig.enabled is not a boolean".into()),
        };
    }
    let v1 = docs
        .iter()
        .find(|d| is_v1alpha1(d))
        .ok_or_else(|| EditError::NoV1alpha1.to_string())?;
    match v1
        .get("cluster")
        .and_then(|c| c.get("proxy"))
        .and_then(|p| p.get("disabled"))
    {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(!*b),
        Some(_) => Err("cluster.proxy.disabled is not a boolean".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEGACY: &str = "version: v1alpha1
machine:
  type: controlplane
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v1.33.5
    extraArgs:
      rotate-server-certificates: true
  install:
    image: ghcr.io/siderolabs/installer:v1.12.6
cluster:
  apiServer:
    image: registry.example.com:5000/kube-apiserver:v1.33.5@sha256:abc
    certSANs: [10.0.0.1]
  controllerManager:
    image: registry.k8s.io/kube-controller-manager:v1.33.5
  proxy:
    image: registry.k8s.io/kube-proxy:v1.33.5
";

    #[test]
    fn legacy_form_changes_only_the_image_fields() {
        let e = set_images(LEGACY, "v1.34.2", &Component::ALL).unwrap();
        let after = documents(&e.yaml).unwrap();
        let paths = changed_paths(&documents(LEGACY).unwrap(), &after);
        assert_eq!(
            paths,
            [
                "machine.kubelet.image",
                "cluster.apiServer.image",
                "cluster.controllerManager.image",
                "cluster.proxy.image",
                "cluster.scheduler.image",
            ]
        );
        let img = |c: Component| e.images.iter().find(|i| i.0 == c).unwrap().2.clone();
        assert_eq!(
            img(Component::ApiServer),
            "registry.example.com:5000/kube-apiserver:v1.34.2"
        );
        assert_eq!(
            img(Component::Kubelet),
            "ghcr.io/siderolabs/kubelet:v1.34.2"
        );
        // The scheduler named no image: Talos's default repository, now pinned.
        assert_eq!(
            img(Component::Scheduler),
            "registry.k8s.io/kube-scheduler:v1.34.2"
        );
        assert!(e.yaml.contains("rotate-server-certificates: true"));
        assert!(
            e.yaml.contains("installer:v1.12.6"),
            "the installer is not a component image"
        );
    }

    #[test]
    fn kube_proxy_is_deployed_unless_the_configuration_says_otherwise() {
        assert_eq!(kube_proxy_enabled(LEGACY), Ok(true));
        let off = LEGACY.replace("  proxy:\n", "  proxy:\n    disabled: true\n");
        assert_eq!(kube_proxy_enabled(&off), Ok(false));
        let odd = LEGACY.replace("  proxy:\n", "  proxy:\n    disabled: maybe\n");
        assert!(kube_proxy_enabled(&odd).is_err_and(|e| e.contains("cluster.proxy.disabled")));
        let multi = "version: v1alpha1\nmachine:\n  type: controlplane\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nimage: registry.k8s.io/kube-proxy:v1.33.5\n";
        assert_eq!(kube_proxy_enabled(multi), Ok(true));
        assert_eq!(
            kube_proxy_enabled(&format!("{multi}enabled: false\n")),
            Ok(false)
        );
    }

    #[test]
    fn multi_document_form_edits_the_component_documents() {
        let multi = "version: v1alpha1\nmachine:\n  type: worker\n---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: ghcr.io/siderolabs/kubelet:v1.33.5\nextraArgs: {a: b}\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nimage: registry.k8s.io/kube-proxy:v1.33.5\n";
        let e = set_images(multi, "v1.34.2", &[Component::Kubelet, Component::Proxy]).unwrap();
        let paths = changed_paths(&documents(multi).unwrap(), &documents(&e.yaml).unwrap());
        assert_eq!(paths, ["KubeProxyConfig.image", "KubeletConfig.image"]);
        assert!(!e.is_noop());
        let again =
            set_images(&e.yaml, "v1.34.2", &[Component::Kubelet, Component::Proxy]).unwrap();
        assert!(again.is_noop(), "idempotent");
    }

    #[test]
    fn refuses_what_talos_refuses_and_bad_tags() {
        let both = format!("{LEGACY}---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: x:v1\n");
        assert!(matches!(
            set_images(&both, "v1.34.2", &[Component::Kubelet]),
            Err(EditError::BothForms { .. })
        ));
        assert_eq!(
            set_images("machine: {}\n", "v1.34.2", &[Component::Kubelet]),
            Err(EditError::NoV1alpha1)
        );
        assert!(matches!(
            set_images(LEGACY, "1.34.2", &[Component::Kubelet]),
            Err(EditError::BadTag(_))
        ));
        assert!(matches!(
            set_images(LEGACY, "v1.34.2\nmachine: x", &[Component::Kubelet]),
            Err(EditError::BadTag(_))
        ));
    }

    #[test]
    fn a_section_that_is_not_a_mapping_is_named_not_overwritten_silently() {
        let odd = "version: v1alpha1\nmachine:\n  kubelet: disabled\n";
        match set_images(odd, "v1.34.2", &[Component::Kubelet]) {
            Err(EditError::OtherPaths { paths }) => assert_eq!(paths, ["machine.kubelet"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn repositories_keep_ports_and_lose_digests() {
        assert_eq!(repository("r:5000/a/b:v1@sha256:x"), "r:5000/a/b");
        assert_eq!(repository("r:5000/a/b"), "r:5000/a/b");
        assert_eq!(repository("a/b:v1"), "a/b");
    }

    #[test]
    fn install_settings_read_where_each_form_keeps_them() {
        let legacy = install_settings(LEGACY).unwrap();
        assert_eq!(
            legacy.installer_image,
            Some((
                "ghcr.io/siderolabs/installer:v1.12.6".into(),
                INSTALL_IMAGE_PATH
            ))
        );
        assert!(legacy.extra_kernel_args.is_empty() && legacy.etcd_image.is_none());
        // Absent grubUseUKICmdline is false: GRUB builds the command line on the host.
        assert!(legacy.grub_builds_cmdline());

        let args = LEGACY.replace(
            "  install:\n",
            "  install:\n    extraKernelArgs: [console=ttyS1, net.ifnames=0]\n    grubUseUKICmdline: false\n",
        ) + "  etcd:\n    image: registry.k8s.io/etcd:v3.5.17\n";
        let s = install_settings(&args).unwrap();
        assert_eq!(s.extra_kernel_args, ["console=ttyS1", "net.ifnames=0"]);
        assert!(s.grub_builds_cmdline());
        assert_eq!(
            s.etcd_image.as_deref(),
            Some("registry.k8s.io/etcd:v3.5.17")
        );
        let uki = LEGACY.replace("  install:\n", "  install:\n    grubUseUKICmdline: true\n");
        assert!(!install_settings(&uki).unwrap().grub_builds_cmdline());

        // Talos 1.14: the UnattendedInstallConfig document names the installer, and with
        // it the installer always uses the UKI command line.
        let multi = "version: v1alpha1\nmachine:\n  type: worker\n---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: factory.talos.dev/metal-installer/abc:v1.14.0\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == \"/dev/sda\"\n";
        let s = install_settings(multi).unwrap();
        assert_eq!(
            s.installer_image,
            Some((
                "factory.talos.dev/metal-installer/abc:v1.14.0".into(),
                UNATTENDED_IMAGE_PATH
            ))
        );
        assert!(s.unattended_install && !s.grub_builds_cmdline());
        let empty = multi.replace(
            "  image: factory.talos.dev/metal-installer/abc:v1.14.0\n",
            "  image: \"\"\n",
        );
        assert_eq!(install_settings(&empty).unwrap().installer_image, None);
    }

    #[test]
    fn install_settings_of_the_wrong_shape_name_the_path() {
        let bad = |from: &str, to: &str| install_settings(&LEGACY.replace(from, to)).unwrap_err();
        assert!(bad(
            "  install:\n",
            "  install:\n    extraKernelArgs: console=ttyS1\n"
        )
        .contains("machine.install.extraKernelArgs is not a list"));
        assert!(
            bad("  install:\n", "  install:\n    grubUseUKICmdline: maybe\n")
                .contains("grubUseUKICmdline is not a boolean")
        );
        assert!(bad(
            "    image: ghcr.io/siderolabs/installer:v1.12.6\n",
            "    image: [a]\n"
        )
        .contains("machine.install.image is not a string"));
        assert_eq!(
            install_settings("machine: {}\n").unwrap_err(),
            EditError::NoV1alpha1.to_string()
        );
        assert!(install_settings("version: v1alpha1\n: [\n").is_err());
    }
}
