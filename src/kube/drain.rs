//! The drain primitives, with one owner and no force: cordon records that ichor did it
//! (so ichor uncordons only what it cordoned); pods leave only through the `policy/v1`
//! Eviction API, whose 429 (a PodDisruptionBudget) is retried with backoff on ichor's clock
//! until the drain timeout, then reported with the pod and the budget that blocks —
//! never deleted, never forced. DaemonSet and mirror pods stay, as `kubectl drain
//! --ignore-daemonsets` leaves them; the drain ends when every evicted pod is gone.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{KubeClient, KubeError, CORDONED_BY_ICHOR, FIELD_MANAGER};
use crate::clock::Clock;

/// First and largest wait between eviction attempts of a blocked pod.
const BACKOFF_FIRST: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// With a watch on the node's pods: the least time between two lists of terminating pods,
/// and the most without a change.
const TERMINATING_GAP: Duration = Duration::from_secs(1);
/// How long pods evicted in the round that reached the drain's timeout get to go (a pod's
/// default `terminationGracePeriodSeconds` is 30 s, and kubelets report a little later).
const LAST_EVICTIONS_GRACE: Duration = Duration::from_secs(120);
const TERMINATING_QUIET: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// A DaemonSet's pod or a static pod's mirror: a drain leaves it.
    pub stays: bool,
    /// Deletion has begun (`deletionTimestamp`): waiting for its grace period.
    pub terminating: bool,
    /// No controller owns it: evicted, it is gone for good.
    pub unmanaged: bool,
    /// It has an `emptyDir` volume: a reboot keeps that data, an eviction loses it.
    pub empty_dir: bool,
    /// Succeeded or Failed: nothing runs, so nothing is lost by removing it.
    pub finished: bool,
}

/// What a drain may evict beyond `kubectl drain`'s defaults (cluster.yaml
/// `spec.rollout.drain`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainOptions {
    pub evict_unmanaged_pods: bool,
    pub delete_empty_dir_data: bool,
    /// ichor's own pod (`namespace/name`): its `emptyDir`s are scratch (the record lives in
    /// a ConfigMap), so they never refuse the drain of its own node, which would otherwise
    /// refuse on every default install.
    pub own_pod: Option<String>,
}

impl DrainOptions {
    /// Why `kubectl drain` would refuse to evict `pod` with these options (kubernetes/kubectl
    /// pkg/drain/filters.go at v0.33.0: `localStorageFilter`, `unreplicatedFilter`; a
    /// finished pod passes both).
    pub fn refuses(&self, pod: &PodRef) -> Option<&'static str> {
        if pod.stays || pod.finished || pod.terminating {
            return None;
        }
        if pod.unmanaged && !self.evict_unmanaged_pods {
            return Some("declares no controller, so nothing recreates it once evicted");
        }
        let own = self.own_pod.as_deref() == Some(pod.to_string().as_str());
        if pod.empty_dir && !self.delete_empty_dir_data && !own {
            return Some("has emptyDir data, which a reboot keeps and an eviction loses");
        }
        None
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// The API server accepted the eviction; the pod terminates with its grace period.
    Evicted,
    /// A PodDisruptionBudget does not allow it now (429).
    Blocked {
        budget: Option<String>,
        message: String,
    },
    /// The pod no longer exists.
    Gone,
    /// A 429 without a budget as its cause: API Priority and Fairness throttling the
    /// request, not a PodDisruptionBudget. Asked again after the server's `Retry-After`.
    Throttled { retry_after_secs: u64 },
    /// The pod matches more than one PodDisruptionBudget: the Eviction API answers 500 and
    /// never evicts it (kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go at
    /// v1.33.0). No wait fixes that; the budgets are named.
    MultipleBudgets { budgets: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
pub enum DrainOutcome {
    /// Every evictable pod is gone.
    Drained { evicted: Vec<String> },
    /// Pods `kubectl drain` would refuse, each with why; nothing was evicted.
    Refused { pods: Vec<(String, String)> },
    /// A pod more than one PodDisruptionBudget selects: the Eviction API refuses it for
    /// good; stop for a human at once.
    MultipleBudgets { pod: String, budgets: Vec<String> },
    /// Pods that came onto the node after the drain's first listing (a `kubectl debug
    /// node/…` pod, a pod placed by `nodeName`) that `kubectl drain` would refuse, each
    /// with why: left where they are, and the drain stops for a human. kubectl evicts only
    /// what it filtered; ichor filters every round alike.
    Appeared { pods: Vec<(String, String)> },
    /// The drain timeout passed with pods still blocked: stop for a human.
    Blocked {
        pod: String,
        budget: Option<String>,
        message: String,
        waited_secs: u64,
    },
}

fn pod_ref(p: &Pod) -> PodRef {
    let mirror = p
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let daemon = p
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| o.iter().any(|r| r.kind == "DaemonSet"));
    let unmanaged = !p
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| o.iter().any(|r| r.controller == Some(true)));
    let empty_dir = p
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some()));
    let finished = matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    PodRef {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        stays: mirror || daemon,
        terminating: p.metadata.deletion_timestamp.is_some(),
        unmanaged,
        empty_dir,
        finished,
    }
}

/// A 403 from the authorizer: RBAC's words (kubernetes/kubernetes@v1.33.0:
/// staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/writers.go
/// `forbiddenMessage`: `User "…" cannot create resource "pods/eviction" …`). The Eviction
/// API's own 403s (pkg/registry/core/pod/storage/eviction.go `checkAndDecrement`: "pdb
/// disruptions allowed is negative", "DisruptedPods map too big …") and NamespaceLifecycle's
/// ("unable to create new content in namespace … because it is being terminated") are not.
fn rbac_refusal(message: &str) -> bool {
    message.contains(" cannot ") && message.contains(" resource \"")
}

/// `The disruption budget web-pdb needs 2 healthy pods …` → `web-pdb`.
fn budget_name(message: &str) -> Option<String> {
    let rest = message.split("disruption budget ").nth(1)?;
    let name = rest.split_whitespace().next()?;
    Some(name.trim_end_matches([',', '.']).to_string())
}

fn as_ichor() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// Whether `spec.unschedulable` is still ichor's: its field manager owns the field. A Node
/// that records no owner of it (managedFields stripped) is judged by the mark alone.
fn cordon_is_ichors(n: &Node) -> bool {
    let owners: Vec<&str> = n
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            e.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:unschedulable").is_some())
        })
        .filter_map(|e| e.manager.as_deref())
        .collect();
    owners.is_empty() || owners.contains(&FIELD_MANAGER)
}

impl KubeClient {
    /// Cordon `node` and mark it with the rollout it belongs to (`rollout`, the target
    /// commit). Idempotent; a node someone else cordoned stays theirs (no mark is added, so
    /// ichor will not uncordon it). The patch carries the resourceVersion read, so a cordon
    /// by someone else in between makes it a conflict, not a takeover.
    pub async fn cordon(&self, node: &str, rollout: &str) -> Result<(), KubeError> {
        // A 409 means the Node changed since it was read (its kubelet's status, or someone's
        // cordon): read it again and decide afresh, as client-go's RetryOnConflict does.
        let mut tries = 0;
        loop {
            match self.cordon_once(node, rollout).await {
                Err(e) if e.is_conflict() && tries < 5 => tries += 1,
                other => return other,
            }
        }
    }

    async fn cordon_once(&self, node: &str, rollout: &str) -> Result<(), KubeError> {
        let api = Api::<Node>::all(self.client.clone());
        let n = api
            .get(node)
            .await
            .map_err(|e| KubeError::from_kube(format!("get node {node}"), e))?;
        if n.spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
        {
            return Ok(());
        }
        let patch = json!({
            "metadata": {
                "annotations": {CORDONED_BY_ICHOR: rollout},
                "resourceVersion": n.metadata.resource_version,
            },
            "spec": {"unschedulable": true}
        });
        api.patch(node, &as_ichor(), &Patch::Merge(&patch))
            .await
            .map_err(|e| KubeError::from_kube(format!("cordon node {node}"), e))?;
        Ok(())
    }

    /// Uncordon `node` if this rollout (`rollout`) cordoned it and the cordon is still the
    /// one ichor wrote (its field manager owns `spec.unschedulable`); `false` when it was not
    /// ichor's to uncordon. A mark left on a schedulable node (someone uncordoned it by
    /// hand) is cleared, so a later cordon by an operator is never taken for ichor's.
    pub async fn uncordon(&self, node: &str, rollout: &str) -> Result<bool, KubeError> {
        // As for `cordon`: a conflict is read again and decided afresh.
        let mut tries = 0;
        loop {
            match self.uncordon_once(node, rollout).await {
                Err(e) if e.is_conflict() && tries < 5 => tries += 1,
                other => return other,
            }
        }
    }

    async fn uncordon_once(&self, node: &str, rollout: &str) -> Result<bool, KubeError> {
        let api = Api::<Node>::all(self.client.clone());
        let n = api
            .get(node)
            .await
            .map_err(|e| KubeError::from_kube(format!("get node {node}"), e))?;
        let mark = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CORDONED_BY_ICHOR))
            .cloned();
        let cordoned = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let Some(mark) = mark else {
            return Ok(false);
        };
        let ours = cordoned && mark == rollout && cordon_is_ichors(&n);
        if cordoned && !ours {
            return Ok(false);
        }
        // Ours to uncordon, or a stale mark on a schedulable node to clear.
        let mut patch = json!({
            "metadata": {
                "annotations": {CORDONED_BY_ICHOR: null},
                "resourceVersion": n.metadata.resource_version,
            },
        });
        if ours {
            patch["spec"] = json!({"unschedulable": null});
        }
        api.patch(node, &as_ichor(), &Patch::Merge(&patch))
            .await
            .map_err(|e| KubeError::from_kube(format!("uncordon node {node}"), e))?;
        Ok(ours)
    }

    /// The pods bound to `node`.
    pub async fn pods_on(&self, node: &str) -> Result<Vec<PodRef>, KubeError> {
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&lp)
            .await
            .map_err(|e| KubeError::from_kube(format!("list pods on {node}"), e))?;
        Ok(pods
            .items
            .iter()
            // A field selector the server ignored must not widen the drain.
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(pod_ref)
            .collect())
    }

    /// One eviction through `policy/v1`. Never a delete.
    pub async fn evict(&self, pod: &PodRef) -> Result<EvictOutcome, KubeError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let params = EvictParams {
            delete_options: None,
            post_options: PostParams::default(),
        };
        match api.evict(&pod.name, &params).await {
            Ok(_) => Ok(EvictOutcome::Evicted),
            // A budget's 429 carries it as its cause (eviction.go `createTooManyRequestsError`
            // with a `DisruptionBudget` cause); any other 429 is the server throttling.
            Err(kube::Error::Api(s)) if s.code == 429 => {
                let cause = s
                    .details
                    .as_ref()
                    .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
                    .map(|c| c.message.clone());
                match cause {
                    Some(cause) => Ok(EvictOutcome::Blocked {
                        budget: budget_name(&cause),
                        message: crate::releaseset::excerpt(&cause, 300),
                    }),
                    None => Ok(EvictOutcome::Throttled {
                        retry_after_secs: s
                            .details
                            .as_ref()
                            .map(|d| u64::from(d.retry_after_seconds))
                            .filter(|r| *r > 0)
                            .unwrap_or(1)
                            .min(60),
                    }),
                }
            }
            Err(kube::Error::Api(s))
                if s.code == 500 && s.message.contains("more than one PodDisruptionBudget") =>
            {
                Ok(EvictOutcome::MultipleBudgets {
                    budgets: self.budgets_of(pod).await?,
                })
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(EvictOutcome::Gone),
            // A 403 that is not RBAC's is the Eviction API or an admission plugin refusing
            // this eviction for now, not ichor's rights: waited on as a budget is, and named
            // as what it is when the drain times out.
            Err(kube::Error::Api(s)) if s.code == 403 && !rbac_refusal(&s.message) => {
                Ok(EvictOutcome::Blocked {
                    budget: None,
                    message: format!(
                        "the Eviction API refused it (403): {}",
                        crate::releaseset::excerpt(&s.message, 300)
                    ),
                })
            }
            Err(e) => Err(KubeError::from_kube(format!("evict pod {pod}"), e)),
        }
    }

    /// The PodDisruptionBudgets of `pod`'s namespace whose selector matches its labels
    /// (`matchLabels` and `matchExpressions`, as the Eviction API selects them).
    pub async fn budgets_of(&self, pod: &PodRef) -> Result<Vec<String>, KubeError> {
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        let what = || format!("budgets of pod {pod}");
        let p = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace)
            .get_opt(&pod.name)
            .await
            .map_err(|e| KubeError::from_kube(what(), e))?;
        let labels = p.and_then(|p| p.metadata.labels).unwrap_or_default();
        let pdbs = Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &pod.namespace)
            .list(&ListParams::default())
            .await
            .map_err(|e| KubeError::from_kube(what(), e))?;
        Ok(pdbs
            .items
            .iter()
            .filter(|b| {
                b.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .is_some_and(|sel| selects(sel, &labels))
            })
            .filter_map(|b| b.metadata.name.clone())
            .map(|n| format!("{}/{n}", pod.namespace))
            .collect())
    }

    /// Evict every pod on `node` that a drain moves, retrying blocked ones with backoff
    /// until `timeout`, then wait until they are gone. The node must already be cordoned.
    ///
    /// First, as `kubectl drain` does before it evicts anything: pods it would refuse with
    /// `options` (no controller, `emptyDir` data) refuse the whole drain, and nothing moves.
    ///
    /// With `wake` (watches on the node's pods), the wait for terminating pods lists them
    /// again when one changes, else every 10 s; without, every 2 s.
    pub async fn drain(
        &self,
        node: &str,
        timeout: Duration,
        clock: &Clock,
        options: DrainOptions,
        wake: Option<&super::changes::Changes>,
    ) -> Result<DrainOutcome, KubeError> {
        let started = clock.now();
        let mut deadline = started.plus(timeout);
        // A round that evicted something just as the timeout came gets one more spell for
        // those pods to go: found by `ichor rehearse` (a budget that allowed again in the
        // last round paused the drain naming no pod).
        let mut extended = false;
        let mut evicted: Vec<String> = Vec::new();
        let mut backoff = BACKOFF_FIRST;
        let first = self.pods_on(node).await?;
        // What was on the node when the drain began: anything else found later was put
        // back after an eviction.
        let initial: std::collections::HashSet<String> =
            first.iter().map(|p| p.to_string()).collect();
        let refused: Vec<(String, String)> = first
            .iter()
            .filter_map(|p| {
                options
                    .refuses(p)
                    .map(|why| (p.to_string(), why.to_string()))
            })
            .collect();
        if !refused.is_empty() {
            return Ok(DrainOutcome::Refused { pods: refused });
        }
        // The first round evicts what the refusal check just listed; each later round lists
        // again (what went, what a controller put back).
        let mut listed = Some(first);
        loop {
            let pods = match listed.take() {
                Some(pods) => pods,
                None => self.pods_on(node).await?,
            };
            let pods: Vec<PodRef> = pods.into_iter().filter(|p| !p.stays).collect();
            if pods.is_empty() {
                return Ok(DrainOutcome::Drained { evicted });
            }
            // Every round is filtered as the first was, before anything of it is evicted.
            let appeared: Vec<(String, String)> = pods
                .iter()
                .filter_map(|p| {
                    options
                        .refuses(p)
                        .map(|why| (p.to_string(), why.to_string()))
                })
                .collect();
            if !appeared.is_empty() {
                return Ok(DrainOutcome::Appeared { pods: appeared });
            }
            let mut blocked = None;
            let mut throttled = 0;
            let mut moved = false;
            for p in pods.iter().filter(|p| !p.terminating) {
                match self.evict(p).await? {
                    EvictOutcome::Evicted => {
                        moved = true;
                        if !evicted.contains(&p.to_string()) {
                            evicted.push(p.to_string());
                        }
                    }
                    EvictOutcome::Gone => {}
                    EvictOutcome::Blocked { budget, message } => {
                        blocked.get_or_insert((p.to_string(), budget, message));
                    }
                    EvictOutcome::Throttled { retry_after_secs } => {
                        throttled = throttled.max(retry_after_secs);
                    }
                    EvictOutcome::MultipleBudgets { budgets } => {
                        return Ok(DrainOutcome::MultipleBudgets {
                            pod: p.to_string(),
                            budgets,
                        });
                    }
                }
            }
            let now = clock.now();
            if now >= deadline && moved && blocked.is_none() && !extended {
                extended = true;
                deadline = now.plus(LAST_EVICTIONS_GRACE);
            }
            if now >= deadline {
                // Still blocked by a budget, or still terminating past the timeout: a human
                // decides; ichor never deletes or forces.
                let (pod, budget, message) = blocked.unwrap_or_else(|| {
                    // No budget in the way: pods still terminating, or pods a controller put
                    // back on the node after their eviction. Named, either way.
                    let named = |back: bool| -> Vec<String> {
                        pods.iter()
                            .filter(|p| initial.contains(&p.to_string()) != back)
                            .filter(|p| back || p.terminating)
                            .take(5)
                            .map(|p| p.to_string())
                            .collect()
                    };
                    let (terminating, back) = (named(false), named(true));
                    let mut why = Vec::new();
                    if terminating.is_empty() && back.is_empty() {
                        // Evicted in this very round, or their evictions throttled: named,
                        // never an empty list.
                        let left: Vec<String> = pods.iter().take(5).map(|p| p.to_string()).collect();
                        why.push(format!("not gone yet: {}", left.join(", ")));
                    }
                    if !terminating.is_empty() {
                        why.push(format!("still terminating: {}", terminating.join(", ")));
                    }
                    if !back.is_empty() {
                        why.push(format!(
                            "recreated on the node after their eviction (a controller that ignores the cordon, or a pod that tolerates it): {}",
                            back.join(", ")
                        ));
                    }
                    let first = terminating
                        .first()
                        .or(back.first())
                        .cloned()
                        .or_else(|| pods.first().map(|p| p.to_string()))
                        .unwrap_or_default();
                    (first, None, format!("after the drain timeout, {}", why.join("; ")))
                });
                return Ok(DrainOutcome::Blocked {
                    pod,
                    budget,
                    message,
                    waited_secs: now.since(started).as_secs(),
                });
            }
            if let (Some(wake), None, 0) = (wake, &blocked, throttled) {
                // Only terminating pods left, and a watch says when one goes: at most one
                // list a second (a burst of deletions is one), else one per quiet spell.
                clock
                    .sleep_until(now.plus(TERMINATING_GAP).min(deadline))
                    .await;
                tokio::select! {
                    _ = wake.changed(super::changes::Scope::EVERYTHING) => {}
                    _ = clock.sleep_until(now.plus(TERMINATING_QUIET).min(deadline)) => {}
                }
                continue;
            }
            let wait = if blocked.is_some() {
                let w = backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                w
            } else if throttled > 0 {
                // The server asked to be left alone this long; no budget is involved.
                Duration::from_secs(throttled)
            } else {
                // Only terminating pods left: their grace periods run on the cluster's clock.
                Duration::from_secs(2)
            };
            clock.sleep_until(now.plus(wait).min(deadline)).await;
        }
    }
}

/// Whether a label selector selects `labels`: every `matchLabels` pair and every
/// `matchExpressions` requirement (In, NotIn, Exists, DoesNotExist) holds; an empty
/// selector selects everything (policy/v1 PodDisruptionBudget semantics).
fn selects(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let pairs = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    pairs && exprs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N14: ichor's own emptyDirs never refuse its own node's drain; another pod's do.
    #[test]
    fn ichors_own_pod_never_refuses_its_own_nodes_drain() {
        let pod = |name: &str| PodRef {
            namespace: "ichor-system".into(),
            name: name.into(),
            stays: false,
            terminating: false,
            unmanaged: false,
            empty_dir: true,
            finished: false,
        };
        let options = DrainOptions {
            own_pod: Some("ichor-system/ichor-7d9f-abcde".into()),
            ..Default::default()
        };
        assert_eq!(options.refuses(&pod("ichor-7d9f-abcde")), None);
        assert!(options.refuses(&pod("other-7d9f-abcde")).is_some());
        assert!(DrainOptions::default()
            .refuses(&pod("ichor-7d9f-abcde"))
            .is_some());
    }

    /// (d) gap 3: RBAC's 403 is told apart from the Eviction API's own and admission's.
    #[test]
    fn only_the_authorizers_403_reads_as_rbac() {
        assert!(rbac_refusal(
            r#"pods "web-1" is forbidden: User "system:serviceaccount:ichor-system:ichor" cannot create resource "pods/eviction" in API group "" in the namespace "default""#
        ));
        for not in [
            r#"poddisruptionbudgets.policy "web" is forbidden: pdb disruptions allowed is negative"#,
            r#"poddisruptionbudgets.policy "web" is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller"#,
            r#"pods "web-1" is forbidden: unable to create new content in namespace apps because it is being terminated"#,
        ] {
            assert!(!rbac_refusal(not), "{not}");
        }
    }

    #[test]
    fn a_selector_selects_by_labels_and_expressions() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let labels: std::collections::BTreeMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "front".to_string()),
        ]
        .into();
        let sel = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        assert!(selects(
            &sel(serde_json::json!({"matchLabels": {"app": "web"}})),
            &labels
        ));
        assert!(!selects(
            &sel(serde_json::json!({"matchLabels": {"app": "db"}})),
            &labels
        ));
        assert!(selects(
            &sel(serde_json::json!({"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "edge"]},
            {"key": "canary", "operator": "DoesNotExist"}]})),
            &labels
        ));
        assert!(!selects(
            &sel(serde_json::json!({"matchExpressions": [
            {"key": "app", "operator": "NotIn", "values": ["web"]}]})),
            &labels
        ));
        assert!(selects(&sel(serde_json::json!({})), &labels));
    }

    #[test]
    fn the_budget_is_named_from_the_cause() {
        assert_eq!(
            budget_name("The disruption budget web-pdb needs 2 healthy pods and has 2 currently")
                .as_deref(),
            Some("web-pdb")
        );
        assert_eq!(budget_name("Cannot evict pod"), None);
    }
}
