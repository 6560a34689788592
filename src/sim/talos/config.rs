//! The machine configuration as a simulated node stores it: the exact submitted bytes plus
//! the parsed documents. Knows where each component image lives in the legacy v1alpha1 form
//! and in the 1.14 multi-document form, and which changes a node can apply without a reboot.

use std::collections::BTreeMap;

use serde_yaml::Value;

/// Which shape a node's config has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigForm {
    /// Everything in the `version: v1alpha1` document (`cluster.apiServer.image`, …).
    V1Alpha1,
    /// Talos 1.14: component settings in their own documents (`kind: KubeAPIServerConfig`, …).
    MultiDoc,
}

/// A Kubernetes component whose image lives in the machine config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

    /// The three control-plane static pods.
    pub const STATIC_PODS: [Component; 3] = [
        Component::ApiServer,
        Component::ControllerManager,
        Component::Scheduler,
    ];

    /// The Kubernetes name (`kube-apiserver`, …, `kubelet`).
    pub fn name(self) -> &'static str {
        match self {
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::Proxy => "kube-proxy",
            Component::Kubelet => "kubelet",
        }
    }

    /// Path of the image field in the v1alpha1 document.
    pub fn legacy_path(self) -> [&'static str; 3] {
        match self {
            Component::ApiServer => ["cluster", "apiServer", "image"],
            Component::ControllerManager => ["cluster", "controllerManager", "image"],
            Component::Scheduler => ["cluster", "scheduler", "image"],
            Component::Proxy => ["cluster", "proxy", "image"],
            Component::Kubelet => ["machine", "kubelet", "image"],
        }
    }

    /// The 1.14 document kind that replaces the v1alpha1 section.
    pub fn kind(self) -> &'static str {
        match self {
            Component::ApiServer => "KubeAPIServerConfig",
            Component::ControllerManager => "KubeControllerManagerConfig",
            Component::Scheduler => "KubeSchedulerConfig",
            Component::Proxy => "KubeProxyConfig",
            Component::Kubelet => "KubeletConfig",
        }
    }

    pub fn default_repository(self) -> &'static str {
        match self {
            Component::ApiServer => "registry.k8s.io/kube-apiserver",
            Component::ControllerManager => "registry.k8s.io/kube-controller-manager",
            Component::Scheduler => "registry.k8s.io/kube-scheduler",
            Component::Proxy => "registry.k8s.io/kube-proxy",
            Component::Kubelet => "ghcr.io/siderolabs/kubelet",
        }
    }

    /// Talos validates these tags against its supported Kubernetes range (since 1.11).
    fn range_checked(self) -> bool {
        !matches!(self, Component::Proxy)
    }
}

/// The Image Factory installer the twin's 1.14-form configurations name (the schematic in
/// upstream's `UnattendedInstallConfig` example, unattended_install.go at v1.14.0-rc.1).
pub const FACTORY_INSTALLER: &str =
    "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// The largest machine configuration a node accepts. Talos' own bound is the 32 MiB gRPC
/// message; real configurations, inline manifests included, stay within a few MiB.
pub const MAX_CONFIG: usize = 8 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to parse config: {0}")]
    Parse(String),
    #[error("the configuration is {len} bytes; the twin accepts at most {MAX_CONFIG}")]
    TooLarge { len: usize },
    #[error("unknown keys found during decoding: {0}")]
    UnknownKeys(String),
    /// A test named a node the twin does not have (a typo would otherwise pass unseen).
    #[error("the twin has no node {0:?}")]
    NoSuchNode(String),
    /// The node refused the apply (its answer).
    #[error("{0}")]
    Refused(String),
    #[error("config is missing the v1alpha1 document (version: v1alpha1)")]
    MissingV1Alpha1,
    #[error("{kind} document conflicts with v1alpha1 field {path}: set one or the other")]
    Conflict { kind: &'static str, path: String },
    /// A rule of upstream's config validation, with upstream's message.
    #[error("{0}")]
    Invalid(&'static str),
    #[error("{component} image {image:?} has no :v<version> tag")]
    BadTag {
        component: &'static str,
        image: String,
    },
    #[error(
        "{component} version {version} is not supported by Talos {talos} (supported: {min} to {max})"
    )]
    UnsupportedKubernetes {
        component: &'static str,
        version: String,
        talos: String,
        min: String,
        max: String,
    },
}

/// A machine configuration: the bytes as submitted and its parsed documents.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineConfig {
    raw: Vec<u8>,
    docs: Vec<Value>,
}

/// What changed between two configurations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    /// Component images that changed: (component, old, new).
    pub images: Vec<(Component, Option<String>, Option<String>)>,
    /// Dotted paths of every other change (`machine.install.image`, `KubeletConfig.extraArgs`).
    pub other: Vec<String>,
}

/// What upstream's `CanApplyImmediate` (machined's v1alpha1 runtime) lets a running node take
/// without a reboot: these v1alpha1 sections are copied over from the current config before
/// the two are compared, so changes under them do not count. Documents other than v1alpha1
/// are not compared at all.
const IMMEDIATE: &[&str] = &[
    "debug",
    "cluster",
    "machine.ca",
    "machine.acceptedCAs",
    "machine.time",
    "machine.certSANs",
    "machine.install",
    "machine.network",
    "machine.sysfs",
    "machine.sysctls",
    "machine.logging",
    "machine.controlPlane",
    "machine.kubelet",
    "machine.kernel",
    "machine.registries",
    "machine.pods",
    "machine.seccompProfiles",
    "machine.nodeAnnotations",
    "machine.nodeLabels",
    "machine.nodeTaints",
    // Only when `machine.features` exists on both sides (adding the section is a reboot).
    "machine.features.kubernetesTalosAPIAccess",
    "machine.features.kubePrism",
    "machine.features.hostDNS",
    "machine.features.imageCache",
    "machine.features.nodeAddressSortAlgorithm",
];

/// The keys Talos's config loader knows in the v1alpha1 document (v1.12/v1.13), per section;
/// it refuses a document with any other ("unknown keys found during decoding").
const KNOWN_TOP: &[&str] = &["version", "debug", "persist", "machine", "cluster"];
const KNOWN_MACHINE: &[&str] = &[
    "type",
    "token",
    "ca",
    "acceptedCAs",
    "certSANs",
    "controlPlane",
    "kubelet",
    "pods",
    "network",
    "disks",
    "install",
    "files",
    "env",
    "time",
    "sysctls",
    "sysfs",
    "registries",
    "systemDiskEncryption",
    "features",
    "udev",
    "logging",
    "kernel",
    "seccompProfiles",
    "baseRuntimeSpecOverrides",
    "nodeLabels",
    "nodeAnnotations",
    "nodeTaints",
];
const KNOWN_CLUSTER: &[&str] = &[
    "id",
    "secret",
    "controlPlane",
    "clusterName",
    "network",
    "token",
    "aescbcEncryptionSecret",
    "secretboxEncryptionSecret",
    "ca",
    "acceptedCAs",
    "aggregatorCA",
    "serviceAccount",
    "apiServer",
    "controllerManager",
    "proxy",
    "scheduler",
    "discovery",
    "etcd",
    "coreDNS",
    "externalCloudProvider",
    "extraManifests",
    "extraManifestHeaders",
    "inlineManifests",
    "adminKubeconfig",
    "allowSchedulingOnControlPlanes",
    "allowSchedulingOnMasters",
];

impl ConfigDiff {
    /// The changes that keep a running node from applying this diff without a reboot, as
    /// upstream's `CanApplyImmediate` decides: v1alpha1 paths outside [`IMMEDIATE`].
    /// Component images live under `machine.kubelet` / `cluster`, or in their own documents,
    /// so they never need one.
    pub fn needs_reboot(&self) -> Vec<String> {
        self.other
            .iter()
            .filter(|p| {
                let Some(rest) = p.strip_prefix("v1alpha1.") else {
                    // A whole v1alpha1 document added or removed needs a reboot; other
                    // documents are not compared.
                    return p.as_str() == "v1alpha1";
                };
                !IMMEDIATE.iter().any(|imm| {
                    rest == *imm || rest.strip_prefix(imm).is_some_and(|r| r.starts_with('.'))
                })
            })
            .cloned()
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.images.is_empty() && self.other.is_empty()
    }

    /// Human-readable summary, used for dry-run `mode_details`.
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "No changes.".to_string();
        }
        let mut out = String::new();
        for (c, old, new) in &self.images {
            out.push_str(&format!(
                "{} image: {} -> {}\n",
                c.name(),
                old.as_deref().unwrap_or("(unset)"),
                new.as_deref().unwrap_or("(unset)")
            ));
        }
        for p in &self.other {
            out.push_str(&format!("changed: {p}\n"));
        }
        out
    }
}

impl MachineConfig {
    /// Parses a (possibly multi-document) config and checks it the way Talos does on apply.
    /// `talos_version` is the node's version tag; it decides the Kubernetes range check.
    pub fn parse(bytes: &[u8], talos_version: &str) -> Result<Self, ConfigError> {
        if bytes.len() > MAX_CONFIG {
            return Err(ConfigError::TooLarge { len: bytes.len() });
        }
        let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Parse(e.to_string()))?;
        // Aliases are bounded before any value is built.
        crate::sim::yaml::check(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let mut docs = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(text) {
            let v = <Value as serde::Deserialize>::deserialize(doc)
                .map_err(|e| ConfigError::Parse(e.to_string()))?;
            if !v.is_null() {
                docs.push(v);
            }
        }
        let cfg = MachineConfig {
            raw: bytes.to_vec(),
            docs,
        };
        cfg.validate(talos_version)?;
        Ok(cfg)
    }

    fn validate(&self, talos_version: &str) -> Result<(), ConfigError> {
        let Some(v1) = self.v1alpha1() else {
            return Err(ConfigError::MissingV1Alpha1);
        };
        let mut unknown = Vec::new();
        let keys = |v: Option<&Value>, known: &[&str], at: &str, out: &mut Vec<String>| {
            if let Some(m) = v.and_then(Value::as_mapping) {
                for k in m.keys() {
                    let name = key_name(k);
                    if !known.contains(&name.as_str()) {
                        out.push(if at.is_empty() {
                            name
                        } else {
                            format!("{at}.{name}")
                        });
                    }
                }
            }
        };
        keys(Some(v1), KNOWN_TOP, "", &mut unknown);
        keys(v1.get("machine"), KNOWN_MACHINE, "machine", &mut unknown);
        keys(v1.get("cluster"), KNOWN_CLUSTER, "cluster", &mut unknown);
        if !unknown.is_empty() {
            return Err(ConfigError::UnknownKeys(unknown.join(", ")));
        }
        for c in Component::ALL {
            if self.kind_doc(c).is_some() && self.legacy_image(c).is_some() {
                return Err(ConfigError::Conflict {
                    kind: c.kind(),
                    path: c.legacy_path().join("."),
                });
            }
        }
        // siderolabs/talos pkg/machinery/config/types/runtime/unattended_install.go
        // (v1.14.0-rc.1) `V1Alpha1ConflictValidate`: the document replaces .machine.install.
        if self.unattended_install().is_some()
            && v1.get("machine").and_then(|m| m.get("install")).is_some()
        {
            return Err(ConfigError::Invalid(
                "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)",
            ));
        }
        // v1alpha1_validation.go (v1.13.9): the UKI's command line leaves no room for
        // arguments built on the host.
        let install = v1.get("machine").and_then(|m| m.get("install"));
        let extra = install
            .and_then(|i| i.get("extraKernelArgs"))
            .and_then(Value::as_sequence)
            .is_some_and(|a| !a.is_empty());
        let uki = install
            .and_then(|i| i.get("grubUseUKICmdline"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if extra && uki {
            return Err(ConfigError::Invalid(
                "install.extraKernelArgs and install.grubUseUKICmdline can't be used together",
            ));
        }
        let talos = parse_version(talos_version);
        for c in Component::ALL {
            let Some(image) = self.image(c) else { continue };
            let Some(k8s) = image_version(&image) else {
                return Err(ConfigError::BadTag {
                    component: c.name(),
                    image,
                });
            };
            // Since Talos 1.11 config validation rejects out-of-range Kubernetes tags.
            if let Some((1, minor, _)) = talos {
                if minor >= 11 && c.range_checked() {
                    let (min, max) = supported_kubernetes(minor);
                    let (_, kminor, _) = parse_version(&k8s).unwrap_or((0, 0, 0));
                    if kminor < min || kminor > max {
                        return Err(ConfigError::UnsupportedKubernetes {
                            component: c.name(),
                            version: k8s,
                            talos: talos_version.to_string(),
                            min: format!("1.{min}"),
                            max: format!("1.{max}"),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// A fresh config for a node, in the requested form. `kubernetes` (control-plane and
    /// proxy images) and `kubelet` are version tags like `v1.33.1`.
    pub fn generate(
        hostname: &str,
        control_plane: bool,
        talos_version: &str,
        kubernetes: &str,
        kubelet: &str,
        form: ConfigForm,
    ) -> String {
        let img = |c: Component| {
            let tag = if c == Component::Kubelet {
                kubelet
            } else {
                kubernetes
            };
            format!("{}:{}", c.default_repository(), tag)
        };
        let machine_type = if control_plane {
            "controlplane"
        } else {
            "worker"
        };
        let mut out = String::new();
        out.push_str("version: v1alpha1\n");
        out.push_str("debug: false\n");
        out.push_str("persist: true\n");
        out.push_str("machine:\n");
        out.push_str(&format!("  type: {machine_type}\n"));
        out.push_str("  token: simulated.token0000000\n");
        if form == ConfigForm::V1Alpha1 {
            out.push_str(&format!(
                "  kubelet:\n    image: {}\n",
                img(Component::Kubelet)
            ));
        }
        out.push_str(&format!("  network:\n    hostname: {hostname}\n"));
        // How `talosctl gen config` writes the install section: with a 1.12 or later
        // contract it sets grubUseUKICmdline (pkg/machinery/config/generate/init.go and
        // worker.go, `GrubUseUKICmdlineDefault` in config/contract.go, v1.13.9); with 1.14
        // the UnattendedInstallConfig document replaces .machine.install (generate/init.go
        // `unattendedInstallConfig`, v1.14.0-rc.1), below.
        if form == ConfigForm::V1Alpha1 {
            out.push_str(&format!(
                "  install:\n    disk: /dev/sda\n    image: ghcr.io/siderolabs/installer:{talos_version}\n"
            ));
            if parse_version(talos_version)
                .is_some_and(|(major, minor, _)| (major, minor) >= (1, 12))
            {
                out.push_str("    grubUseUKICmdline: true\n");
            }
        }
        out.push_str("cluster:\n");
        out.push_str("  clusterName: sim\n");
        out.push_str("  controlPlane:\n    endpoint: https://sim.local:6443\n");
        out.push_str("  network:\n    dnsDomain: cluster.local\n");
        if form == ConfigForm::V1Alpha1 {
            if control_plane {
                for c in Component::STATIC_PODS {
                    let [_, section, _] = c.legacy_path();
                    out.push_str(&format!("  {section}:\n    image: {}\n", img(c)));
                }
            }
            out.push_str(&format!("  proxy:\n    image: {}\n", img(Component::Proxy)));
        } else {
            let mut kinds = vec![Component::Kubelet, Component::Proxy];
            if control_plane {
                kinds.extend(Component::STATIC_PODS);
            }
            for c in kinds {
                out.push_str(&format!(
                    "---\napiVersion: v1alpha1\nkind: {}\nimage: {}\n",
                    c.kind(),
                    img(c)
                ));
            }
            // The installer from the Image Factory (1.14 publishes no ghcr installer:
            // hack/release.toml [notes.defaultInstaller], v1.14.0-rc.1), here the schematic
            // of upstream's own example.
            out.push_str(&format!(
                "---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: {FACTORY_INSTALLER}:{talos_version}\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == \"/dev/sda\"\n  wipe: false\n"
            ));
        }
        out
    }

    /// The `UnattendedInstallConfig` document (Talos 1.14), if the config has one.
    pub fn unattended_install(&self) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d.get("kind").and_then(Value::as_str) == Some("UnattendedInstallConfig"))
    }

    /// The installer image the config names: `UnattendedInstallConfig.installer.image`,
    /// else `.machine.install.image`.
    pub fn installer_image(&self) -> Option<String> {
        let named = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        match self.unattended_install() {
            Some(doc) => named(doc.get("installer").and_then(|i| i.get("image"))),
            None => named(self.v1alpha1_value(&["machine", "install", "image"])),
        }
    }

    /// The etcd image `.cluster.etcd.image` pins, if any.
    pub fn etcd_image(&self) -> Option<String> {
        self.v1alpha1_value(&["cluster", "etcd", "image"])
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// The documents, in order.
    pub fn docs(&self) -> &[Value] {
        &self.docs
    }

    /// This configuration with kube-proxy not deployed, as `talosctl gen config` writes it for
    /// a CNI that replaces kube-proxy: `KubeProxyConfig.enabled: false` in the multi-document
    /// form, else `cluster.proxy.disabled: true` (pkg/machinery/config/types/v1alpha1/
    /// v1alpha1_types.go `ProxyConfig.Disabled`; setting both is a validation error upstream).
    pub fn without_kube_proxy(&self, talos_version: &str) -> Result<MachineConfig, ConfigError> {
        let proxy_doc = self
            .docs
            .iter()
            .position(|d| d.get("kind").and_then(Value::as_str) == Some("KubeProxyConfig"));
        let Some(i) = proxy_doc else {
            return self.with_values(
                &[("cluster.proxy.disabled".to_string(), Value::Bool(true))],
                talos_version,
            );
        };
        let mut docs = self.docs.clone();
        if let Value::Mapping(m) = &mut docs[i] {
            m.insert(Value::String("enabled".into()), Value::Bool(false));
        }
        Self::from_docs(&docs, talos_version)
    }

    /// The configuration these documents make, as Talos would read it back.
    fn from_docs(docs: &[Value], talos_version: &str) -> Result<MachineConfig, ConfigError> {
        let text = docs
            .iter()
            .map(|d| serde_yaml::to_string(d).map_err(|e| ConfigError::Parse(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?
            .join("---\n");
        MachineConfig::parse(text.as_bytes(), talos_version)
    }

    /// This configuration with dotted v1alpha1 `paths` set (the `stagedConfig` fault).
    pub fn with_values(
        &self,
        paths: &[(String, Value)],
        talos_version: &str,
    ) -> Result<MachineConfig, ConfigError> {
        let mut docs = self.docs.clone();
        let doc = docs
            .iter_mut()
            .find(|d| d.get("version").and_then(Value::as_str) == Some("v1alpha1"))
            .ok_or_else(|| ConfigError::Parse("no v1alpha1 document".into()))?;
        for (path, value) in paths {
            let mut at = &mut *doc;
            let keys: Vec<&str> = path.split('.').collect();
            for (i, key) in keys.iter().enumerate() {
                if !at.is_mapping() {
                    *at = Value::Mapping(Default::default());
                }
                let Value::Mapping(m) = at else {
                    return Err(ConfigError::Parse(format!("{path}: not a mapping")));
                };
                let k = Value::String((*key).to_string());
                if i + 1 == keys.len() {
                    m.insert(k, value.clone());
                    break;
                }
                at = m
                    .entry(k)
                    .or_insert_with(|| Value::Mapping(Default::default()));
            }
        }
        Self::from_docs(&docs, talos_version)
    }

    /// The exact bytes as submitted.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    pub fn form(&self) -> ConfigForm {
        if self.docs.iter().any(|d| d.get("kind").is_some()) {
            ConfigForm::MultiDoc
        } else {
            ConfigForm::V1Alpha1
        }
    }

    fn v1alpha1(&self) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d.get("version").and_then(Value::as_str) == Some("v1alpha1"))
    }

    fn kind_doc(&self, c: Component) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d.get("kind").and_then(Value::as_str) == Some(c.kind()))
    }

    fn legacy_image(&self, c: Component) -> Option<String> {
        let mut v = self.v1alpha1()?;
        for key in c.legacy_path() {
            v = v.get(key)?;
        }
        v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
    }

    /// A value under the v1alpha1 document, e.g. `["cluster", "coreDNS", "image"]`.
    pub fn v1alpha1_value(&self, path: &[&str]) -> Option<&Value> {
        let mut v = self.v1alpha1()?;
        for key in path {
            v = v.get(*key)?;
        }
        Some(v)
    }

    /// The image a component runs with under this config, from whichever form holds it.
    pub fn image(&self, c: Component) -> Option<String> {
        if let Some(doc) = self.kind_doc(c) {
            return doc.get("image").and_then(Value::as_str).map(str::to_string);
        }
        self.legacy_image(c)
    }

    /// The documents with every component image blanked, so a comparison shows only the
    /// changes a reboot would be needed for.
    fn without_images(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for doc in &self.docs {
            let mut doc = doc.clone();
            let key = match doc.get("kind").and_then(Value::as_str) {
                Some(kind) => kind.to_string(),
                None => "v1alpha1".to_string(),
            };
            if key == "v1alpha1" {
                for c in Component::ALL {
                    let [a, b, field] = c.legacy_path();
                    if let Some(section) = doc.get_mut(a).and_then(|v| v.get_mut(b)) {
                        if let Some(m) = section.as_mapping_mut() {
                            m.remove(field);
                            if m.is_empty() {
                                if let Some(top) = doc.get_mut(a).and_then(Value::as_mapping_mut) {
                                    top.remove(b);
                                }
                            }
                        }
                    }
                }
            } else if let Some(m) = doc.as_mapping_mut() {
                if Component::ALL.iter().any(|c| c.kind() == key) {
                    m.remove("image");
                }
            }
            out.push((key, doc));
        }
        out
    }

    /// What changed from `self` to `new`.
    pub fn diff(&self, new: &MachineConfig) -> ConfigDiff {
        let mut d = ConfigDiff::default();
        for c in Component::ALL {
            let (a, b) = (self.image(c), new.image(c));
            if a != b {
                d.images.push((c, a, b));
            }
        }
        let old: BTreeMap<String, Value> = self.without_images().into_iter().collect();
        let newer: BTreeMap<String, Value> = new.without_images().into_iter().collect();
        for (k, v) in &old {
            match newer.get(k) {
                Some(n) => diff_values(k, v, n, &mut d.other),
                None => d.other.push(k.clone()),
            }
        }
        for k in newer.keys() {
            if !old.contains_key(k) {
                d.other.push(k.clone());
            }
        }
        d
    }
}

fn diff_values(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Mapping(ma), Value::Mapping(mb)) => {
            for (k, va) in ma {
                let key = format!("{path}.{}", key_name(k));
                match mb.get(k) {
                    Some(vb) => diff_values(&key, va, vb, out),
                    None => out.push(key),
                }
            }
            for k in mb.keys() {
                if !ma.contains_key(k) {
                    out.push(format!("{path}.{}", key_name(k)));
                }
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

fn key_name(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

/// `major.minor.patch` of a version like `v1.13.2`, `1.14.0-rc.1` or `v1.33.1-fat`.
pub fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().trim_start_matches('v');
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().unwrap_or("0").parse().ok()?;
    Some((major, minor, patch))
}

/// The version tag of an image reference (`repo:v1.33.1@sha256:…` → `v1.33.1`), if it is a
/// `v<semver>` tag.
pub fn image_version(image: &str) -> Option<String> {
    let without_digest = image.split('@').next()?;
    let last = without_digest.rsplit('/').next()?;
    let (_, tag) = last.rsplit_once(':')?;
    if !tag.starts_with('v') {
        return None;
    }
    parse_version(tag)?;
    Some(tag.to_string())
}

/// Kubernetes minors a Talos 1.x minor supports (facts sheet §9: 1.6 → 1.24–1.29, and each
/// Talos minor shifts the window by one).
pub fn supported_kubernetes(talos_minor: u64) -> (u64, u64) {
    (talos_minor + 18, talos_minor + 23)
}

/// Whether a node running `host` may install Talos `target` (the installer's
/// `UpgradeableFrom` rule, facts sheet §9).
pub fn upgradeable_from(host: &str, target: &str) -> Result<(), String> {
    let (Some((1, h, _)), Some((1, t, _))) = (parse_version(host), parse_version(target)) else {
        return Err(format!("cannot compare Talos versions {host} and {target}"));
    };
    let min = match t {
        0..=5 => 0,
        6 => 3,
        7 => 4,
        8 => 5,
        9 | 10 => 8,
        _ => t - 2,
    };
    if h < min {
        return Err(format!(
            "host version {host} is too old to upgrade to {target}: the minimum is 1.{min}.0"
        ));
    }
    if h >= t + 2 {
        return Err(format!(
            "host version {host} is too new to downgrade to {target}: it must be below 1.{}.0",
            t + 2
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy() -> MachineConfig {
        let text = MachineConfig::generate(
            "cp-1",
            true,
            "v1.13.2",
            "v1.33.1",
            "v1.33.1",
            ConfigForm::V1Alpha1,
        );
        MachineConfig::parse(text.as_bytes(), "v1.13.2").expect("generated config parses")
    }

    #[test]
    fn images_are_found_in_both_forms() {
        let cfg = legacy();
        assert_eq!(
            cfg.image(Component::ApiServer).as_deref(),
            Some("registry.k8s.io/kube-apiserver:v1.33.1")
        );
        let text = MachineConfig::generate(
            "cp-1",
            true,
            "v1.14.0",
            "v1.34.0",
            "v1.34.0",
            ConfigForm::MultiDoc,
        );
        let multi = MachineConfig::parse(text.as_bytes(), "v1.14.0").expect("parses");
        assert_eq!(multi.form(), ConfigForm::MultiDoc);
        assert_eq!(
            multi.image(Component::Kubelet).as_deref(),
            Some("ghcr.io/siderolabs/kubelet:v1.34.0")
        );
    }

    #[test]
    fn diff_separates_image_changes_from_the_rest() {
        let old = legacy();
        let text = String::from_utf8_lossy(old.raw())
            .replace("kube-apiserver:v1.33.1", "kube-apiserver:v1.34.0")
            .replace("disk: /dev/sda", "disk: /dev/sdb");
        let new = MachineConfig::parse(text.as_bytes(), "v1.13.2").expect("parses");
        let d = old.diff(&new);
        assert_eq!(d.images.len(), 1);
        assert_eq!(d.images[0].0, Component::ApiServer);
        assert_eq!(d.other, vec!["v1alpha1.machine.install.disk".to_string()]);
    }

    #[test]
    fn validation_refuses_conflicts_and_out_of_range_tags() {
        let text = MachineConfig::generate("cp-1", true, "v1.14.0", "v1.34.0", "v1.34.0", ConfigForm::V1Alpha1)
            + "---\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: registry.k8s.io/kube-apiserver:v1.34.0\n";
        assert!(matches!(
            MachineConfig::parse(text.as_bytes(), "v1.14.0"),
            Err(ConfigError::Conflict { .. })
        ));
        let text = MachineConfig::generate(
            "cp-1",
            true,
            "v1.11.0",
            "v1.36.0",
            "v1.36.0",
            ConfigForm::V1Alpha1,
        );
        assert!(matches!(
            MachineConfig::parse(text.as_bytes(), "v1.11.0"),
            Err(ConfigError::UnsupportedKubernetes { .. })
        ));
        assert!(matches!(
            MachineConfig::parse(b"machine: {}", "v1.11.0"),
            Err(ConfigError::MissingV1Alpha1)
        ));
    }

    #[test]
    fn features_apply_immediately_only_field_by_field_on_an_existing_section() {
        let base = legacy();
        let with = |features: &str| {
            let text = String::from_utf8_lossy(base.raw())
                .replace("machine:\n", &format!("machine:\n  features:\n{features}"));
            MachineConfig::parse(text.as_bytes(), "v1.13.2").expect("valid")
        };
        let a = with("    rbac: true\n");
        let prism = with("    rbac: true\n    kubePrism:\n      enabled: true\n");
        let rbac = with("    rbac: false\n");
        assert!(a.diff(&prism).needs_reboot().is_empty());
        assert_eq!(
            rbac.diff(&a).needs_reboot(),
            ["v1alpha1.machine.features.rbac"]
        );
        assert_eq!(base.diff(&a).needs_reboot(), ["v1alpha1.machine.features"]);
    }

    #[test]
    fn upgrade_paths_follow_the_installer_rule() {
        assert!(upgradeable_from("v1.11.3", "v1.13.0").is_ok());
        assert!(upgradeable_from("v1.10.3", "v1.13.0").is_err());
        assert!(upgradeable_from("v1.8.0", "v1.10.0").is_ok());
        assert!(upgradeable_from("v1.14.0", "v1.12.0").is_err());
    }

    #[test]
    fn generated_install_sections_follow_the_contract_and_validation_follows_talos() {
        let gen = |talos: &str, form| {
            MachineConfig::generate("w-1", false, talos, "v1.33.1", "v1.33.1", form)
        };
        let v1_11 = gen("v1.11.5", ConfigForm::V1Alpha1);
        assert!(v1_11.contains("image: ghcr.io/siderolabs/installer:v1.11.5"));
        assert!(!v1_11.contains("grubUseUKICmdline"), "{v1_11}");
        assert!(gen("v1.12.6", ConfigForm::V1Alpha1).contains("    grubUseUKICmdline: true\n"));
        let multi = gen("v1.14.0", ConfigForm::MultiDoc);
        let cfg = MachineConfig::parse(multi.as_bytes(), "v1.14.0").unwrap();
        assert!(!multi.contains("  install:\n"), "{multi}");
        assert_eq!(
            cfg.installer_image(),
            Some(format!("{FACTORY_INSTALLER}:v1.14.0"))
        );
        // Both forms of the install section at once, as Talos refuses it.
        let both = multi.replace("machine:\n", "machine:\n  install:\n    disk: /dev/sda\n");
        assert_eq!(
            MachineConfig::parse(both.as_bytes(), "v1.14.0").unwrap_err().to_string(),
            "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)"
        );
        let args = gen("v1.13.2", ConfigForm::V1Alpha1).replace(
            "    grubUseUKICmdline: true\n",
            "    grubUseUKICmdline: true\n    extraKernelArgs: [console=ttyS1]\n",
        );
        assert_eq!(
            MachineConfig::parse(args.as_bytes(), "v1.13.2")
                .unwrap_err()
                .to_string(),
            "install.extraKernelArgs and install.grubUseUKICmdline can't be used together"
        );
        let pinned = gen("v1.13.2", ConfigForm::V1Alpha1).replace(
            "cluster:\n",
            "cluster:\n  etcd:\n    image: registry.k8s.io/etcd:v3.5.21\n",
        );
        let cfg = MachineConfig::parse(pinned.as_bytes(), "v1.13.2").unwrap();
        assert_eq!(
            cfg.etcd_image().as_deref(),
            Some("registry.k8s.io/etcd:v3.5.21")
        );
    }
}
