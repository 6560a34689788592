//! What ichor asks of the Kubernetes API: one row per resource, verbs and scope, each naming
//! the functions that make those requests. `deploy/`'s RBAC grants exactly the rows marked
//! [`Grant::Granted`] and nothing else; docs/cluster-access.md shows [`markdown`]'s
//! rendering of this table; the integration tests check both, and check every request the
//! client sends to the twin against [`covering`].

/// Where a row applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A cluster-scoped resource, or a namespaced one in every namespace: a ClusterRole.
    Cluster,
    /// One namespace: a Role there.
    Namespace(&'static str),
    /// A non-resource URL (a ClusterRole's `nonResourceURLs`); the row's `resource` is the path.
    Url,
}

/// Whether `deploy/` grants a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    Granted,
    /// Not granted, and why: the code copes without it (and says what to grant).
    Withheld(&'static str),
}

/// One row of what ichor needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The API group; `""` is the core group.
    pub group: &'static str,
    /// The resource's plural, with `/subresource` when it is one; for [`Scope::Url`] the path.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    /// The object names the grant is limited to (RBAC `resourceNames`); empty means any.
    pub names: &'static [&'static str],
    /// The functions that send these requests.
    pub needed_by: &'static str,
    pub why: &'static str,
    pub grant: Grant,
}

/// ichor's own namespace (the lock and the record); `gate::live::ICHOR_NAMESPACE`.
const ICHOR: &str = "ichor-system";
/// Where kube-proxy runs.
const KUBE_SYSTEM: &str = "kube-system";

/// Everything ichor's Kubernetes client asks for.
pub const ACCESS: &[Access] = &[
    Access {
        group: "",
        resource: "nodes",
        verbs: &["get", "list", "watch", "patch"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::nodes (list); KubeClient::node (get: a step watching its own node); KubeClient::changes_of (list, watch: a settling step wakes on its Node's changes); KubeClient::cordon, KubeClient::uncordon (get, patch)",
        why: "inventory (roles, versions, boot ids, readiness); cordon and uncordon with ichor's `ichor.dev/cordoned` mark (valued with the rollout's target commit)",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "pods",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::pods_on (all namespaces, by node); KubeClient::mirror_pods (kube-system); KubeClient::changes_of (list, watch, by node); KubeClient::budgets_of (get: the pod's labels)",
        why: "what a drain must move off a node; the static pods' mirror pods and their images; which budgets select a pod the Eviction API refuses for more than one",
        grant: Grant::Granted,
    },
    Access {
        group: "policy",
        resource: "poddisruptionbudgets",
        verbs: &["list"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::budgets_of (list, in the pod's namespace)",
        why: "a pod under more than one PodDisruptionBudget is never evicted (500 from the Eviction API): the pause names the budgets",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "pods/eviction",
        verbs: &["create"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::evict, KubeClient::drain",
        why: "drains go only through the Eviction API, which respects PodDisruptionBudgets (never `delete`)",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "persistentvolumes",
        verbs: &["list"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::local_volumes",
        why: "node-local volumes (one copy, on one node) for volume-aware batches",
        grant: Grant::Granted,
    },
    Access {
        group: "storage.k8s.io",
        resource: "volumeattachments",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::volume_attachments; KubeClient::changes_of (list, watch)",
        why: "a drain waits until the node's volumes are detached",
        grant: Grant::Granted,
    },
    Access {
        group: "apps",
        resource: "daemonsets",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &["cilium", "calico-node", "kube-flannel-ds"],
        needed_by: "KubeClient::daemonset from gate::live::observe (the CNI agents of gate::live::cni_workload)",
        why: "the CNI actually running and its roll-out",
        grant: Grant::Granted,
    },
    Access {
        group: "apps",
        resource: "daemonsets",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &["longhorn-manager"],
        needed_by: "KubeClient::daemonset from the rollout's add-on wait (gate::live::addon_workload)",
        why: "an add-on that must move before Kubernetes, and its roll-out",
        grant: Grant::Granted,
    },
    Access {
        group: "apps",
        resource: "deployments",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &["cert-manager", "ingress-nginx-controller", "controller", "external-dns"],
        needed_by: "KubeClient::deployment from the rollout's add-on wait (gate::live::addon_workload)",
        why: "an add-on that must move before Kubernetes, and its roll-out",
        grant: Grant::Granted,
    },
    Access {
        group: "longhorn.io",
        resource: "volumes",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::longhorn_volumes, KubeClient::longhorn_volumes_of (by name); KubeClient::changes_of (list, watch, by name)",
        why: "Longhorn volumes, their wanted replica count and robustness",
        grant: Grant::Granted,
    },
    Access {
        group: "longhorn.io",
        resource: "replicas",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::longhorn_volumes, KubeClient::longhorn_volumes_of (by node and volume label); KubeClient::changes_of (list, watch, by node and volume label)",
        why: "which nodes hold each volume's running replicas",
        grant: Grant::Granted,
    },
    Access {
        group: "argoproj.io",
        resource: "applications",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::application from gate::live::observe",
        why: "the CNI hand-over's Application (its namespace and name come from cluster.yaml)",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "/metrics",
        verbs: &["get"],
        scope: Scope::Url,
        names: &[],
        needed_by: "KubeClient::deprecated_apis",
        why: "`apiserver_requested_deprecated_apis`: removed APIs still requested",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[ICHOR],
        needed_by: "KubeClient::ensure_namespace (from the rollout)",
        why: "ichor's own namespace exists",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "namespaces",
        verbs: &["create"],
        scope: Scope::Cluster,
        names: &[],
        needed_by: "KubeClient::ensure_namespace, only when the namespace is missing",
        why: "creates ichor-system when nothing else did",
        grant: Grant::Withheld("deploy/ creates ichor-system (ichor runs in it), and `create` cannot be limited to one name: it would allow any namespace"),
    },
    Access {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
        scope: Scope::Namespace(ICHOR),
        names: &[],
        needed_by: "KubeClient::acquire_lease, KubeClient::release_lease, KubeClient::lease_holder",
        why: "the rollout lock, with resourceVersion preconditions",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "events",
        verbs: &["create"],
        scope: Scope::Namespace("default"),
        names: &[],
        needed_by: "KubeClient::node_event (ichor run's rollouts)",
        why: "an Event on each Node ichor upgrades (`kubectl describe node` shows it); Events of cluster-scoped objects live in `default`",
        grant: Grant::Granted,
    },
    Access {
        group: "",
        resource: "configmaps",
        verbs: &["get", "create", "update"],
        scope: Scope::Namespace(ICHOR),
        names: &[],
        needed_by: "KubeClient::config_map, KubeClient::put_config_map",
        why: "the rollout record, with resourceVersion preconditions",
        grant: Grant::Granted,
    },
    // The bootstrap-manifest sync (rollout stage 2c) runs with the admin kubeconfig Talos
    // issues (MachineService/Kubeconfig), as Talos's field manager, never with this
    // ServiceAccount (ADR 0057): ichor's own RBAC holds no write on what Talos renders. After
    // the sync ichor only watches kube-proxy roll out.
    Access {
        group: "apps",
        resource: "daemonsets",
        verbs: &["get"],
        scope: Scope::Namespace(KUBE_SYSTEM),
        names: &["kube-proxy"],
        needed_by: "rollout: kube-proxy's roll-out after the bootstrap-manifest sync (stage 2c)",
        why: "kube-proxy's DaemonSet rolled out on the new Kubernetes version",
        grant: Grant::Granted,
    },
];

/// One request as an authorizer sees it (kube-apiserver's request attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, …
    pub verb: &'a str,
    pub group: &'a str,
    /// The resource's plural with `/subresource`, or the path of a non-resource request.
    pub resource: &'a str,
    /// `None` for cluster-scoped resources, all-namespace requests and non-resource URLs.
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub non_resource: bool,
}

impl Access {
    /// Whether this row allows `req`, with RBAC's matching: a Role only in its namespace,
    /// `resourceNames` only for requests that name an object.
    pub fn allows(&self, req: &Request) -> bool {
        if !self.verbs.contains(&req.verb) {
            return false;
        }
        match self.scope {
            Scope::Url => return req.non_resource && self.resource == req.resource,
            _ if req.non_resource => return false,
            Scope::Namespace(ns) if req.namespace != Some(ns) => return false,
            _ => {}
        }
        if self.group != req.group || self.resource != req.resource {
            return false;
        }
        self.names.is_empty() || req.name.is_some_and(|n| self.names.contains(&n))
    }
}

/// The granted row that allows `req`, if any.
pub fn covering(req: &Request) -> Option<&'static Access> {
    ACCESS
        .iter()
        .find(|a| a.grant == Grant::Granted && a.allows(req))
}

fn scope_text(a: &Access) -> String {
    match a.scope {
        Scope::Cluster => "cluster".to_string(),
        Scope::Namespace(ns) => format!("`{ns}`"),
        Scope::Url => "non-resource URL".to_string(),
    }
}

fn resource_text(a: &Access) -> String {
    match (a.scope, a.group) {
        (Scope::Url, _) => format!("`{}`", a.resource),
        (_, "") => a.resource.to_string(),
        (_, g) => format!("{g} {}", a.resource),
    }
}

fn names_text(a: &Access) -> String {
    if a.names.is_empty() {
        "any".to_string()
    } else {
        a.names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The table as docs/cluster-access.md shows it: what `deploy/` grants, then what it
/// withholds and why.
pub fn markdown() -> String {
    let mut out = String::from(
        "| resource | verbs | where | names | needed by | why |\n|---|---|---|---|---|---|\n",
    );
    for a in ACCESS.iter().filter(|a| a.grant == Grant::Granted) {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            resource_text(a),
            a.verbs.join(", "),
            scope_text(a),
            names_text(a),
            a.needed_by,
            a.why
        ));
    }
    out.push_str("\nNot granted by `deploy/`:\n\n| resource | verbs | names | needed by | why not |\n|---|---|---|---|---|\n");
    for a in ACCESS {
        if let Grant::Withheld(reason) = a.grant {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                resource_text(a),
                a.verbs.join(", "),
                names_text(a),
                a.needed_by,
                reason
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        namespace: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Request<'a> {
        Request {
            verb,
            group,
            resource,
            namespace,
            name,
            non_resource: false,
        }
    }

    #[test]
    fn rows_match_as_rbac_does() {
        // A Role holds only in its namespace.
        assert!(covering(&req(
            "update",
            "coordination.k8s.io",
            "leases",
            Some(ICHOR),
            Some("x")
        ))
        .is_some());
        assert!(covering(&req(
            "update",
            "coordination.k8s.io",
            "leases",
            Some("default"),
            Some("x")
        ))
        .is_none());
        // resourceNames hold only for named requests.
        assert!(covering(&req("get", "", "namespaces", None, Some(ICHOR))).is_some());
        assert!(covering(&req("get", "", "namespaces", None, Some("default"))).is_none());
        assert!(covering(&req(
            "get",
            "apps",
            "daemonsets",
            Some("kube-system"),
            Some("cilium")
        ))
        .is_some());
        assert!(covering(&req("list", "apps", "daemonsets", None, None)).is_none());
        // Withheld rows allow nothing.
        assert!(covering(&req("create", "", "namespaces", None, Some(ICHOR))).is_none());
        // Subresources are their own resource; a delete is never granted.
        assert!(covering(&req(
            "create",
            "",
            "pods/eviction",
            Some("default"),
            Some("p")
        ))
        .is_some());
        assert!(covering(&req("create", "", "pods", Some("default"), None)).is_none());
        assert!(covering(&req("delete", "", "pods", Some("default"), Some("p"))).is_none());
        let metrics = Request {
            non_resource: true,
            ..req("get", "", "/metrics", None, None)
        };
        assert!(covering(&metrics).is_some());
        let other = Request {
            resource: "/logs",
            ..metrics.clone()
        };
        assert!(covering(&other).is_none());
    }

    #[test]
    fn no_row_is_a_wildcard_and_every_verb_is_a_kubernetes_verb() {
        const VERBS: &[&str] = &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ];
        for a in ACCESS {
            assert!(!a.resource.contains('*') && !a.group.contains('*'), "{a:?}");
            assert!(a.names.iter().all(|n| !n.contains('*')), "{a:?}");
            assert!(a.verbs.iter().all(|v| VERBS.contains(v)), "{a:?}");
            assert!(!a.verbs.contains(&"delete"), "ichor never deletes: {a:?}");
            assert!(!a.needed_by.is_empty() && !a.why.is_empty(), "{a:?}");
        }
    }
}
