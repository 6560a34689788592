//! `KubeSeed`: a plain builder for a simulated cluster, so tests and the integration can make
//! "3 control planes + N workers, deployments spread over workers, PDBs, Longhorn volumes"
//! without YAML.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::model::{
    replica_object, Behaviour, Cluster, DeprecatedApi, Faults, CONTROL_PLANE_LABEL,
    LONGHORN_DRIVER, MIRROR_ANNOTATION,
};
use super::store::{ApiError, At};
use crate::clock::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    ControlPlane,
    Worker,
}

#[derive(Debug, Clone)]
pub struct NodeSeed {
    pub name: String,
    pub role: Role,
    pub ip: String,
    /// e.g. `v1.34.1`
    pub kubelet_version: String,
    /// e.g. `v1.11.3`; reported as osImage `Talos (v1.11.3)`.
    pub talos_version: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
}

#[derive(Debug, Clone)]
pub struct WorkloadSeed {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    pub replicas: u32,
    pub image: String,
    /// Pods mount an emptyDir (drain needs `--delete-emptydir-data`).
    pub empty_dir: bool,
    /// StatefulSets only: each pod gets a local-path volume pinned to one node
    /// (volumeClaimTemplate `data`, a PVC and a PV with node affinity per ordinal).
    pub local_storage: bool,
}

#[derive(Debug, Clone)]
pub struct PdbSeed {
    pub namespace: String,
    pub name: String,
    /// Selects pods with `app=<app>`.
    pub app: String,
    /// `minAvailable` (int or "50%") or, when `None`, `maxUnavailable`.
    pub min_available: Option<Value>,
    pub max_unavailable: Option<Value>,
    pub unhealthy_pod_eviction_policy: Option<String>,
}

#[derive(Debug, Clone)]
pub struct VolumeSeed {
    pub name: String,
    pub replicas: u32,
    /// The node the volume is attached to, if any: a bare pod there (`<name>-user` in
    /// `default`) mounts it.
    pub attached_to: Option<String>,
    /// A one-replica Deployment (namespace, name) that mounts the volume wherever it runs.
    pub used_by: Option<(String, String)>,
}

impl VolumeSeed {
    /// The namespace of the volume's PersistentVolumeClaim (named as the volume).
    pub fn claim_namespace(&self) -> &str {
        self.used_by
            .as_ref()
            .map_or("default", |(ns, _)| ns.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct BarePodSeed {
    pub namespace: String,
    pub name: String,
    pub node: String,
}

/// A cluster to start from.
#[derive(Debug, Clone)]
pub struct KubeSeed {
    pub kubernetes_version: String,
    pub talos_version: String,
    pub nodes: Vec<NodeSeed>,
    pub workloads: Vec<WorkloadSeed>,
    pub pdbs: Vec<PdbSeed>,
    pub daemonsets: Vec<(String, String, String)>,
    pub volumes: Vec<VolumeSeed>,
    /// local-path PVs: (name, node, claim namespace, claim name)
    pub local_pvs: Vec<(String, String, String, String)>,
    pub bare_pods: Vec<BarePodSeed>,
    /// Argo CD Applications: (name, sync status, health status)
    pub applications: Vec<(String, String, String)>,
    pub config_maps: Vec<(String, String, Value)>,
    pub leases: Vec<(String, String, String)>,
    pub deprecated_apis: Vec<DeprecatedApi>,
    /// Mirror pods for the control-plane static pods.
    pub static_pods: bool,
    /// Faults in force from the start (the configuration side; the run-time side is
    /// `Cluster`'s fault methods and `POST /_twin/faults`).
    pub faults: Faults,
}

impl Default for KubeSeed {
    fn default() -> Self {
        KubeSeed {
            kubernetes_version: "v1.34.1".into(),
            talos_version: "v1.11.3".into(),
            nodes: Vec::new(),
            workloads: Vec::new(),
            pdbs: Vec::new(),
            daemonsets: Vec::new(),
            volumes: Vec::new(),
            local_pvs: Vec::new(),
            bare_pods: Vec::new(),
            applications: Vec::new(),
            config_maps: Vec::new(),
            leases: Vec::new(),
            deprecated_apis: Vec::new(),
            static_pods: true,
            faults: Faults::default(),
        }
    }
}

fn v(version: &str) -> String {
    if version.starts_with('v') {
        version.to_string()
    } else {
        format!("v{version}")
    }
}

impl KubeSeed {
    pub fn new() -> Self {
        Self::default()
    }

    /// `control_planes` nodes `cp-1..` (10.5.0.11..) and `workers` nodes `worker-1..`
    /// (10.5.0.101..), no workloads.
    pub fn nodes(control_planes: usize, workers: usize) -> Self {
        let mut s = Self::default();
        for i in 1..=control_planes {
            s = s.node(
                &format!("cp-{i}"),
                Role::ControlPlane,
                &format!("10.5.0.{}", 10 + i),
            );
        }
        for i in 1..=workers {
            s = s.node(
                &format!("worker-{i}"),
                Role::Worker,
                &format!("10.5.{}.{}", (100 + i) / 250, (100 + i) % 250),
            );
        }
        s
    }

    /// A typical home cluster: nodes, kube-proxy and cilium DaemonSets, CoreDNS (2) with a
    /// PDB, a `web` Deployment (3, emptyDir) with `minAvailable: 2`, Longhorn volumes with 3
    /// replicas, the Argo CD Application for the CNI, and the control-plane mirror pods.
    pub fn typical(control_planes: usize, workers: usize) -> Self {
        Self::nodes(control_planes, workers)
            .daemonset("kube-system", "kube-proxy", "registry.k8s.io/kube-proxy")
            .daemonset("kube-system", "cilium", "quay.io/cilium/cilium:v1.18.2")
            .deployment("kube-system", "coredns", 2)
            .pdb_max_unavailable("kube-system", "coredns", "coredns", json!(1))
            .deployment_with_empty_dir("default", "web", 3)
            .pdb_min_available("default", "web", "web", json!(2))
            .longhorn_volume("pvc-data", 3)
            .application("cilium", "Synced", "Healthy")
    }

    pub fn versions(mut self, talos: &str, kubernetes: &str) -> Self {
        self.talos_version = v(talos);
        self.kubernetes_version = v(kubernetes);
        for n in &mut self.nodes {
            n.talos_version = self.talos_version.clone();
            n.kubelet_version = self.kubernetes_version.clone();
        }
        self
    }

    pub fn node(mut self, name: &str, role: Role, ip: &str) -> Self {
        self.nodes.push(NodeSeed {
            name: name.into(),
            role,
            ip: ip.into(),
            kubelet_version: self.kubernetes_version.clone(),
            talos_version: self.talos_version.clone(),
        });
        self
    }

    fn workload(
        mut self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
        replicas: u32,
        empty_dir: bool,
    ) -> Self {
        self.workloads.push(WorkloadSeed {
            kind,
            namespace: ns.into(),
            name: name.into(),
            replicas,
            image: format!("registry.example/{name}:1.0"),
            empty_dir,
            local_storage: false,
        });
        self
    }

    /// A StatefulSet whose pods keep their data on one node (local-path): a pod comes back
    /// only on its own node.
    pub fn statefulset_with_local_storage(mut self, ns: &str, name: &str, replicas: u32) -> Self {
        self = self.workload(WorkloadKind::StatefulSet, ns, name, replicas, false);
        if let Some(w) = self.workloads.last_mut() {
            w.local_storage = true;
        }
        self
    }

    pub fn deployment(self, ns: &str, name: &str, replicas: u32) -> Self {
        self.workload(WorkloadKind::Deployment, ns, name, replicas, false)
    }

    pub fn deployment_with_empty_dir(self, ns: &str, name: &str, replicas: u32) -> Self {
        self.workload(WorkloadKind::Deployment, ns, name, replicas, true)
    }

    pub fn statefulset(self, ns: &str, name: &str, replicas: u32) -> Self {
        self.workload(WorkloadKind::StatefulSet, ns, name, replicas, false)
    }

    pub fn daemonset(mut self, ns: &str, name: &str, image: &str) -> Self {
        self.daemonsets.push((ns.into(), name.into(), image.into()));
        self
    }

    pub fn pdb_min_available(mut self, ns: &str, name: &str, app: &str, min: Value) -> Self {
        self.pdbs.push(PdbSeed {
            namespace: ns.into(),
            name: name.into(),
            app: app.into(),
            min_available: Some(min),
            max_unavailable: None,
            unhealthy_pod_eviction_policy: None,
        });
        self
    }

    pub fn pdb_max_unavailable(mut self, ns: &str, name: &str, app: &str, max: Value) -> Self {
        self.pdbs.push(PdbSeed {
            namespace: ns.into(),
            name: name.into(),
            app: app.into(),
            min_available: None,
            max_unavailable: Some(max),
            unhealthy_pod_eviction_policy: None,
        });
        self
    }

    pub fn pdb(mut self, pdb: PdbSeed) -> Self {
        self.pdbs.push(pdb);
        self
    }

    pub fn bare_pod(mut self, ns: &str, name: &str, node: &str) -> Self {
        self.bare_pods.push(BarePodSeed {
            namespace: ns.into(),
            name: name.into(),
            node: node.into(),
        });
        self
    }

    pub fn longhorn_volume(mut self, name: &str, replicas: u32) -> Self {
        self.volumes.push(VolumeSeed {
            name: name.into(),
            replicas,
            attached_to: None,
            used_by: None,
        });
        self
    }

    /// A Longhorn volume mounted by a one-replica Deployment `ns/deployment` (its claim is
    /// `ns/<name>`): wherever the pod runs, the volume is attached there.
    pub fn longhorn_volume_used_by(
        mut self,
        name: &str,
        replicas: u32,
        ns: &str,
        deployment: &str,
    ) -> Self {
        self.volumes.push(VolumeSeed {
            name: name.into(),
            replicas,
            attached_to: None,
            used_by: Some((ns.into(), deployment.into())),
        });
        self
    }

    /// A Longhorn volume attached to (in use on) `node`: a bare pod `default/<name>-user`
    /// bound to `node` mounts it.
    pub fn longhorn_volume_attached(mut self, name: &str, replicas: u32, node: &str) -> Self {
        self.volumes.push(VolumeSeed {
            name: name.into(),
            replicas,
            attached_to: Some(node.into()),
            used_by: None,
        });
        self
    }

    /// One node's own versions, for a cluster caught mid-upgrade.
    pub fn node_versions(mut self, node: &str, talos: &str, kubelet: &str) -> Self {
        for n in self.nodes.iter_mut().filter(|n| n.name == node) {
            n.talos_version = v(talos);
            n.kubelet_version = v(kubelet);
        }
        self
    }

    /// A local-path PV pinned to `node`, bound to claim `ns/claim`.
    pub fn local_pv(mut self, name: &str, node: &str, ns: &str, claim: &str) -> Self {
        self.local_pvs
            .push((name.into(), node.into(), ns.into(), claim.into()));
        self
    }

    pub fn application(mut self, name: &str, sync: &str, health: &str) -> Self {
        self.applications
            .push((name.into(), sync.into(), health.into()));
        self
    }

    pub fn config_map(mut self, ns: &str, name: &str, data: Value) -> Self {
        self.config_maps.push((ns.into(), name.into(), data));
        self
    }

    pub fn lease(mut self, ns: &str, name: &str, holder: &str) -> Self {
        self.leases.push((ns.into(), name.into(), holder.into()));
        self
    }

    pub fn deprecated_api(
        mut self,
        group: &str,
        version: &str,
        resource: &str,
        removed_release: &str,
    ) -> Self {
        self.deprecated_apis.push(DeprecatedApi {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            subresource: String::new(),
            removed_release: removed_release.into(),
        });
        self
    }

    /// Fault: this PDB never allows a disruption.
    pub fn pdb_never_allows(mut self, ns: &str, name: &str) -> Self {
        self.faults
            .pdb_never_allows
            .insert((ns.into(), name.into()));
        self
    }

    pub fn without_static_pods(mut self) -> Self {
        self.static_pods = false;
        self
    }

    /// Build the cluster at `now`: every pod already running (seeded pods skip the start delay).
    pub fn build(&self, behaviour: Behaviour, now: Timestamp) -> Result<Cluster, ApiError> {
        let mut c = Cluster::new(behaviour, now);
        c.deprecated_apis = self.deprecated_apis.clone();
        c.faults = self.faults.clone();
        let mut namespaces: BTreeSet<String> = [
            "default",
            "kube-system",
            "kube-node-lease",
            "kube-public",
            "longhorn-system",
            "argocd",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        // Every namespace the seed puts something in exists.
        namespaces.extend(self.workloads.iter().map(|w| w.namespace.clone()));
        namespaces.extend(self.pdbs.iter().map(|p| p.namespace.clone()));
        namespaces.extend(self.daemonsets.iter().map(|d| d.0.clone()));
        namespaces.extend(self.bare_pods.iter().map(|p| p.namespace.clone()));
        namespaces.extend(self.config_maps.iter().map(|c| c.0.clone()));
        namespaces.extend(self.leases.iter().map(|l| l.0.clone()));
        namespaces.extend(self.local_pvs.iter().map(|p| p.2.clone()));
        namespaces.extend(self.volumes.iter().map(|v| v.claim_namespace().to_string()));
        for ns in &namespaces {
            c.upsert_quiet(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                            "status": {"phase": "Active"}}),
                now,
            )?;
        }
        for crd in crds() {
            c.upsert_quiet(crd, now)?;
        }
        // A cluster of control planes only schedules workloads on them: Talos registers a
        // control plane without its NoSchedule taint when the machine configuration sets
        // `cluster.allowSchedulingOnControlPlanes` (siderolabs/talos v1.13.9
        // pkg/machinery/config/types/v1alpha1/v1alpha1_types.go), which such a cluster must
        // set; that the twin's does is an assumption.
        let schedulable_cps = self.nodes.iter().all(|n| n.role == Role::ControlPlane);
        for n in &self.nodes {
            let mut object = node_object(n, now);
            if schedulable_cps {
                if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("taints");
                }
            }
            let node = c.upsert_quiet(object, now)?;
            // The kubelet's heartbeat Lease.
            let t = super::model::micro_time(now);
            c.upsert_quiet(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": n.name, "namespace": "kube-node-lease",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": n.name,
                                                  "uid": node["metadata"]["uid"]}]},
                "spec": {"holderIdentity": n.name, "leaseDurationSeconds": 40, "renewTime": t}}), now)?;
            if self.static_pods && n.role == Role::ControlPlane {
                for component in [
                    "kube-apiserver",
                    "kube-controller-manager",
                    "kube-scheduler",
                ] {
                    let image = format!("registry.k8s.io/{component}:{}", self.kubernetes_version);
                    c.upsert_quiet(mirror_pod(&node, component, &image, "1", now), now)?;
                }
            }
        }
        for (ns, name, image) in &self.daemonsets {
            let image = if image.contains(':') {
                image.clone()
            } else {
                format!("{image}:{}", self.kubernetes_version)
            };
            c.upsert_quiet(
                json!({
                    "apiVersion": "apps/v1", "kind": "DaemonSet",
                    "metadata": {"name": name, "namespace": ns, "labels": {"k8s-app": name}},
                    "spec": {"selector": {"matchLabels": {"k8s-app": name}},
                             "updateStrategy": {"type": "RollingUpdate"},
                             "template": {"metadata": {"labels": {"k8s-app": name}},
                                          "spec": {"containers": [{"name": name, "image": image}],
                                                   "hostNetwork": true, "tolerations": [{"operator": "Exists"}]}}},
                }),
                now,
            )?;
        }
        for w in &self.workloads {
            let labels = json!({"app": w.name});
            let mut pod_spec = json!({"containers": [{"name": w.name, "image": w.image}]});
            if w.empty_dir {
                pod_spec["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
                pod_spec["containers"][0]["volumeMounts"] =
                    json!([{"name": "scratch", "mountPath": "/scratch"}]);
            }
            let template = json!({"metadata": {"labels": labels}, "spec": pod_spec});
            match w.kind {
                WorkloadKind::Deployment => {
                    let d = c.upsert_quiet(json!({
                        "apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels},
                        "spec": {"replicas": w.replicas, "selector": {"matchLabels": labels}, "template": template},
                    }), now)?;
                    let hash = format!(
                        "{:x}",
                        w.name
                            .bytes()
                            .fold(0x5eedu32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
                            % 0xfffff
                    );
                    let mut rs_labels = labels.clone();
                    rs_labels["pod-template-hash"] = json!(hash);
                    let mut rs_template = template.clone();
                    rs_template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                    c.upsert_quiet(json!({
                        "apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "metadata": {"name": format!("{}-{}", w.name, hash), "namespace": w.namespace,
                                     "labels": rs_labels,
                                     "ownerReferences": [owner(&d)]},
                        "spec": {"replicas": w.replicas, "selector": {"matchLabels": rs_labels}, "template": rs_template},
                    }), now)?;
                }
                WorkloadKind::StatefulSet => {
                    let mut sts = json!({
                        "apiVersion": "apps/v1", "kind": "StatefulSet",
                        "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels},
                        "spec": {"replicas": w.replicas, "serviceName": w.name,
                                 "selector": {"matchLabels": labels}, "template": template},
                    });
                    if w.local_storage {
                        sts["spec"]["volumeClaimTemplates"] = json!([{
                            "metadata": {"name": "data"},
                            "spec": {"storageClassName": "local-path", "accessModes": ["ReadWriteOnce"],
                                     "resources": {"requests": {"storage": "1Gi"}}}}]);
                        let workers: Vec<&NodeSeed> = self
                            .nodes
                            .iter()
                            .filter(|n| n.role == Role::Worker)
                            .collect();
                        let hosts = if workers.is_empty() {
                            self.nodes.iter().collect()
                        } else {
                            workers
                        };
                        for i in 0..w.replicas as usize {
                            let Some(node) = hosts.get(i % hosts.len().max(1)) else {
                                break;
                            };
                            let claim = format!("data-{}-{}", w.name, i);
                            let pv = format!("pvc-{}-{}-{}", w.namespace, w.name, i);
                            c.upsert_quiet(
                                local_pv_object(&pv, &node.name, &w.namespace, &claim),
                                now,
                            )?;
                            c.upsert_quiet(json!({
                                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                "metadata": {"name": claim, "namespace": w.namespace, "labels": labels},
                                "spec": {"storageClassName": "local-path", "accessModes": ["ReadWriteOnce"],
                                         "resources": {"requests": {"storage": "1Gi"}}, "volumeName": pv},
                                "status": {"phase": "Bound"},
                            }), now)?;
                        }
                    }
                    c.upsert_quiet(sts, now)?;
                }
            }
        }
        for p in &self.bare_pods {
            c.upsert_quiet(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": p.name, "namespace": p.namespace, "labels": {"app": p.name}},
                "spec": {"nodeName": p.node, "containers": [{"name": p.name, "image": "busybox:1.36"}]},
                "status": {"phase": "Pending"},
            }), now)?;
        }
        for p in &self.pdbs {
            let mut spec = json!({"selector": {"matchLabels": {"app": p.app}}});
            if let Some(m) = &p.min_available {
                spec["minAvailable"] = m.clone();
            }
            if let Some(m) = &p.max_unavailable {
                spec["maxUnavailable"] = m.clone();
            }
            if let Some(pol) = &p.unhealthy_pod_eviction_policy {
                spec["unhealthyPodEvictionPolicy"] = json!(pol);
            }
            c.upsert_quiet(
                json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                            "metadata": {"name": p.name, "namespace": p.namespace}, "spec": spec}),
                now,
            )?;
        }
        let storage_nodes: Vec<&NodeSeed> = {
            let workers: Vec<&NodeSeed> = self
                .nodes
                .iter()
                .filter(|n| n.role == Role::Worker)
                .collect();
            if workers.is_empty() {
                self.nodes.iter().collect()
            } else {
                workers
            }
        };
        for (i, vol) in self.volumes.iter().enumerate() {
            c.upsert_quiet(json!({
                "apiVersion": "longhorn.io/v1beta2", "kind": "Volume",
                "metadata": {"name": vol.name, "namespace": "longhorn-system"},
                "spec": {"numberOfReplicas": vol.replicas, "size": "10737418240", "frontend": "blockdev",
                         "nodeID": vol.attached_to.clone().unwrap_or_default()},
                "status": {"state": "detached", "robustness": "unknown"},
            }), now)?;
            for r in 0..vol.replicas as usize {
                if storage_nodes.is_empty() {
                    break;
                }
                let node = &storage_nodes[(i + r) % storage_nodes.len()].name;
                let name = format!(
                    "{}-r-{:08x}",
                    vol.name,
                    ((i * 31 + r) as u32).wrapping_mul(2_654_435_761u32)
                );
                c.upsert_quiet(
                    replica_object("longhorn-system", &vol.name, &name, node, now),
                    now,
                )?;
            }
            // As the Longhorn CSI provisioner leaves it: a PersistentVolume named as the
            // volume, bound to a claim of the same name.
            let ns = vol.claim_namespace();
            for obj in longhorn_claim(&vol.name, ns, vol.replicas) {
                c.upsert_quiet(obj, now)?;
            }
            let mount = |pod: &str| {
                json!({"containers": [{"name": pod, "image": format!("registry.example/{pod}:1.0"),
                                       "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                       "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": vol.name}}]})
            };
            if let Some(node) = &vol.attached_to {
                let pod = format!("{}-user", vol.name);
                let mut spec = mount(&pod);
                spec["nodeName"] = json!(node);
                c.upsert_quiet(
                    json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": pod, "namespace": ns, "labels": {"app": pod}},
                           "spec": spec, "status": {"phase": "Pending"}}),
                    now,
                )?;
            }
            if let Some((_, name)) = &vol.used_by {
                let labels = json!({"app": name});
                let template = json!({"metadata": {"labels": labels}, "spec": mount(name)});
                let d = c.upsert_quiet(
                    json!({
                        "apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": name, "namespace": ns, "labels": labels},
                        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                                 "selector": {"matchLabels": labels}, "template": template},
                    }),
                    now,
                )?;
                let hash = format!(
                    "{:x}",
                    name.bytes()
                        .fold(0x5eedu32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
                        % 0xfffff
                );
                let mut rs_labels = labels.clone();
                rs_labels["pod-template-hash"] = json!(hash);
                let mut rs_template = template.clone();
                rs_template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                c.upsert_quiet(json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": format!("{name}-{hash}"), "namespace": ns,
                                 "labels": rs_labels, "ownerReferences": [owner(&d)]},
                    "spec": {"replicas": 1, "selector": {"matchLabels": rs_labels}, "template": rs_template},
                }), now)?;
            }
        }
        for (name, node, ns, claim) in &self.local_pvs {
            c.upsert_quiet(local_pv_object(name, node, ns, claim), now)?;
        }
        for (name, sync, health) in &self.applications {
            c.upsert_quiet(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": name, "namespace": "argocd"},
                "spec": {"project": "default",
                         "source": {"repoURL": "https://helm.cilium.io", "chart": name, "targetRevision": "1.18.2"},
                         "destination": {"server": "https://kubernetes.default.svc", "namespace": "kube-system"}},
                "status": {"sync": {"status": sync, "revision": "1.18.2"}, "health": {"status": health}},
            }), now)?;
        }
        for (ns, name, data) in &self.config_maps {
            c.upsert_quiet(
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name, "namespace": ns}, "data": data}),
                now,
            )?;
        }
        for (ns, name, holder) in &self.leases {
            let t = super::model::micro_time(now);
            c.upsert_quiet(
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": name, "namespace": ns},
                            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                                     "acquireTime": t, "renewTime": t, "leaseTransitions": 0}}),
                now,
            )?;
        }
        // Seeded pods start at once, as if the cluster had been running for a while.
        let saved = std::mem::replace(&mut c.behaviour.pod_start_delay, std::time::Duration::ZERO);
        c.sync(now);
        c.behaviour.pod_start_delay = saved;
        Ok(c)
    }
}

fn owner(obj: &Value) -> Value {
    json!({"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
           "uid": obj["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true})
}

/// The PersistentVolume and PersistentVolumeClaim (both named `volume`, the claim in `ns`)
/// of a Longhorn volume, as the Longhorn CSI provisioner binds them.
pub fn longhorn_claim(volume: &str, ns: &str, replicas: u32) -> [Value; 2] {
    let modes = json!(["ReadWriteOnce"]);
    [
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": volume, "annotations": {"pv.kubernetes.io/provisioned-by": LONGHORN_DRIVER}},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": modes, "volumeMode": "Filesystem",
                     "storageClassName": "longhorn", "persistentVolumeReclaimPolicy": "Delete",
                     "csi": {"driver": LONGHORN_DRIVER, "volumeHandle": volume, "fsType": "ext4",
                             "volumeAttributes": {"numberOfReplicas": replicas.to_string(),
                                                  "staleReplicaTimeout": "30"}},
                     "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": volume}},
            "status": {"phase": "Bound"},
        }),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": volume, "namespace": ns,
                         "annotations": {"pv.kubernetes.io/bind-completed": "yes",
                                         "volume.kubernetes.io/storage-provisioner": LONGHORN_DRIVER}},
            "spec": {"accessModes": modes, "storageClassName": "longhorn", "volumeMode": "Filesystem",
                     "resources": {"requests": {"storage": "10Gi"}}, "volumeName": volume},
            "status": {"phase": "Bound", "accessModes": modes, "capacity": {"storage": "10Gi"}},
        }),
    ]
}

/// A local-path PV pinned to `node`, bound to claim `ns/claim`.
pub fn local_pv_object(name: &str, node: &str, ns: &str, claim: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {"local.path.provisioner/selected-node": node}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "local-path", "persistentVolumeReclaimPolicy": "Delete",
                 "hostPath": {"path": format!("/var/local-path-provisioner/{name}"), "type": "DirectoryOrCreate"},
                 "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": claim},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
        "status": {"phase": "Bound"},
    })
}

/// A Node as Talos' kubelet registers it.
pub fn node_object(n: &NodeSeed, now: Timestamp) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
    });
    let mut spec =
        json!({"podCIDR": format!("10.244.{}.0/24", n.ip.rsplit('.').next().unwrap_or("0"))});
    if n.role == Role::ControlPlane {
        labels[CONTROL_PLANE_LABEL] = json!("");
        spec["taints"] = json!([{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}]);
    }
    let t = now.rfc3339();
    let cond = |kind: &str, status: &str, reason: &str, msg: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": msg,
               "lastHeartbeatTime": t, "lastTransitionTime": t})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "labels": labels,
                     "annotations": {"talos.dev/owned-labels": "[]", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": spec,
        "status": {
            "addresses": [{"type": "InternalIP", "address": n.ip}, {"type": "Hostname", "address": n.name}],
            "capacity": {"cpu": "4", "memory": "8029820Ki", "pods": "110", "ephemeral-storage": "102305Mi"},
            "allocatable": {"cpu": "4", "memory": "7927420Ki", "pods": "110", "ephemeral-storage": "96432Mi"},
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "nodeInfo": {
                "kubeletVersion": n.kubelet_version, "kubeProxyVersion": "",
                "osImage": format!("Talos ({})", n.talos_version),
                "kernelVersion": "6.12.48-talos", "containerRuntimeVersion": "containerd://2.1.4",
                "operatingSystem": "linux", "architecture": "amd64",
                "machineID": format!("{:032x}", n.name.len() as u128 * 0x9e37_79b9_7f4a_7c15),
                "systemUUID": "", "bootID": "",
            },
        },
    })
}

/// The mirror pod the kubelet posts for a control-plane static pod on `node` (a stored
/// Node: its name, InternalIP and uid go into the pod).
pub fn mirror_pod(
    node_obj: &Value,
    component: &str,
    image: &str,
    config_version: &str,
    now: Timestamp,
) -> Value {
    let t = now.rfc3339();
    let node = super::store::name_of(node_obj);
    let ip = super::model::internal_ip(node_obj).unwrap_or_default();
    let uid = node_obj.at("/metadata/uid").cloned().unwrap_or(json!(""));
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{component}-{node}"), "namespace": "kube-system",
            "labels": {"k8s-app": component, "tier": "control-plane"},
            "annotations": {MIRROR_ANNOTATION: format!("{component}-{config_version}"),
                            "kubernetes.io/config.source": "file",
                            "talos.dev/config-version": config_version},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": true}],
        },
        "spec": {"nodeName": node, "hostNetwork": true, "priorityClassName": "system-cluster-critical",
                 "containers": [{"name": component, "image": image}]},
        "status": {"phase": "Running", "hostIP": ip, "podIP": ip, "startTime": t,
                   "hostIPs": [{"ip": ip}], "podIPs": [{"ip": ip}],
                   "conditions": [
                       {"type": "Initialized", "status": "True", "lastTransitionTime": t},
                       {"type": "Ready", "status": "True", "lastTransitionTime": t},
                       {"type": "ContainersReady", "status": "True", "lastTransitionTime": t},
                       {"type": "PodScheduled", "status": "True", "lastTransitionTime": t}],
                   "containerStatuses": [{"name": component, "image": image, "imageID": image_id(image),
                                          "containerID": format!("containerd://{component}-{node}-{config_version}"),
                                          "ready": true, "started": true,
                                          "restartCount": 0, "state": {"running": {"startedAt": t}}}]},
    })
}

/// A digest-style image ID (fake but stable), as kubelet reports in containerStatuses.
pub fn image_id(image: &str) -> String {
    let repo = image.split(':').next().unwrap_or(image);
    let h = image.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{repo}@sha256:{h:016x}{h:016x}{h:016x}{h:016x}")
}

fn crd(
    group: &str,
    version: &str,
    plural: &str,
    singular: &str,
    kind: &str,
    short: &[&str],
) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": singular, "kind": kind, "listKind": format!("{kind}List"), "shortNames": short},
                 "versions": [{"name": version, "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                               "subresources": {"status": {}}}]},
        "status": {"acceptedNames": {"plural": plural, "kind": kind},
                   "conditions": [{"type": "Established", "status": "True"}, {"type": "NamesAccepted", "status": "True"}],
                   "storedVersions": [version]},
    })
}

/// The CRDs of the custom resources served.
pub fn crds() -> Vec<Value> {
    vec![
        crd(
            "longhorn.io",
            "v1beta2",
            "volumes",
            "volume",
            "Volume",
            &["lhv"],
        ),
        crd(
            "longhorn.io",
            "v1beta2",
            "replicas",
            "replica",
            "Replica",
            &["lhr"],
        ),
        crd(
            "postgresql.cnpg.io",
            "v1",
            "clusters",
            "cluster",
            "Cluster",
            &[],
        ),
        crd(
            "argoproj.io",
            "v1alpha1",
            "applications",
            "application",
            "Application",
            &["app", "apps"],
        ),
    ]
}
