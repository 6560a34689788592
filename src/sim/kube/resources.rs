//! The resource types the twin serves: enough of core, apps, policy, coordination,
//! apiextensions, Longhorn and Argo CD for kubectl and ichor. Resources are named by their
//! plural, which is unique across the groups served here.

/// One served resource (a REST collection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Subresources served under this resource, e.g. `status`, `eviction`.
    pub subresources: &'static [&'static str],
    /// The store's key for these objects: the plural, unless another group serves the same
    /// plural (events.k8s.io `events` → `events.events.k8s.io`).
    pub storage: &'static str,
}

impl ResourceType {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    /// `pods` or `leases.coordination.k8s.io`, as apiserver messages name a resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    /// A custom resource, described by a CRD in the store.
    pub fn is_custom(&self) -> bool {
        matches!(
            self.group,
            "longhorn.io" | "argoproj.io" | "postgresql.cnpg.io"
        )
    }
}

#[allow(clippy::too_many_arguments)]
const fn rt(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    subresources: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        subresources,
        storage: plural,
    }
}

/// Every resource type served, in discovery order.
pub const RESOURCES: &[ResourceType] = &[
    rt(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        &["status"],
    ),
    rt(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        &["status"],
    ),
    rt(
        "",
        "v1",
        "pods",
        "pod",
        "Pod",
        true,
        &["po"],
        &["eviction", "log", "status"],
    ),
    rt(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        &[],
    ),
    rt("", "v1", "secrets", "secret", "Secret", true, &[], &[]),
    rt(
        "",
        "v1",
        "services",
        "service",
        "Service",
        true,
        &["svc"],
        &["status"],
    ),
    rt(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        // TokenRequest (`kubectl create token`), see `rbac::Tokens`.
        &["token"],
    ),
    rt("", "v1", "events", "event", "Event", true, &["ev"], &[]),
    rt(
        "",
        "v1",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        &["status"],
    ),
    rt(
        "",
        "v1",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        &["status"],
    ),
    rt(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
        &["scale", "status"],
    ),
    rt(
        "apps",
        "v1",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        &["rs"],
        &["scale", "status"],
    ),
    rt(
        "apps",
        "v1",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        true,
        &["sts"],
        &["scale", "status"],
    ),
    rt(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["ds"],
        &["status"],
    ),
    rt(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        &["status"],
    ),
    rt(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        &[],
    ),
    rt(
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "volumeattachment",
        "VolumeAttachment",
        false,
        &[],
        &["status"],
    ),
    // Stored, not enforced (the twin has no pod network): `kubectl apply -k deploy/` takes
    // ichor's whole base.
    rt(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "networkpolicy",
        "NetworkPolicy",
        true,
        &["netpol"],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
        &[],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        &[],
    ),
    // Answered, never stored: see `http::access_review`.
    rt(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
        false,
        &[],
        &[],
    ),
    rt(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        &["status"],
    ),
    rt(
        "longhorn.io",
        "v1beta2",
        "volumes",
        "volume",
        "Volume",
        true,
        &["lhv"],
        &["status"],
    ),
    rt(
        "longhorn.io",
        "v1beta2",
        "replicas",
        "replica",
        "Replica",
        true,
        &["lhr"],
        &["status"],
    ),
    // CloudNativePG's Cluster, as its operator's CRD installs it (cloudnative-pg
    // config/crd/bases/postgresql.cnpg.io_clusters.yaml): served like every custom
    // resource, with a status subresource. A health check's CEL reads it.
    rt(
        "postgresql.cnpg.io",
        "v1",
        "clusters",
        "cluster",
        "Cluster",
        true,
        &[],
        &["status"],
    ),
    rt(
        "argoproj.io",
        "v1alpha1",
        "applications",
        "application",
        "Application",
        true,
        &["app", "apps"],
        &[],
    ),
    // kube-rs' event recorder writes events.k8s.io/v1 Events.
    ResourceType {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        subresources: &[],
        storage: "events.events.k8s.io",
    },
];

/// The resource stored under this key: its plural, or `events.events.k8s.io`.
pub fn by_plural(plural: &str) -> Option<&'static ResourceType> {
    RESOURCES.iter().find(|r| r.storage == plural)
}

/// The resource served at `group/version/plural`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource for an object's `apiVersion` and `kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// The groups other than core, each with its one version, in discovery order.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}
