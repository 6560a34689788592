//! Property tests: worker batches never break the volume or maxUnavailable rules; when the
//! pairing check passes, every (Talos, Kubernetes) pair the plan walks through is supported;
//! the document parsers never panic.

use std::collections::{BTreeSet, HashMap};

use ichor::plan::{plan, plan_batches, Placeable, PlanOptions};
use ichor::policy::{self, Policies, Status};
use ichor::releaseset::{Bump, Cluster, ReleaseSet};
use std::time::Duration;

use ichor::clock::Timestamp;
use ichor::releaseset::Version;
use ichor::rollout::step::{self, KubeletObservation, NodeObservation, StepMarker};
use proptest::prelude::*;

fn nodes_strategy() -> impl Strategy<Value = (Vec<Vec<u8>>, usize)> {
    // Up to 40 nodes, each holding replicas of up to 4 of 25 volumes.
    (
        prop::collection::vec(prop::collection::vec(0u8..25, 0..4), 0..40),
        1usize..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn batches_respect_max_unavailable_and_volumes((vols, k) in nodes_strategy()) {
        let owned: Vec<(String, Vec<String>)> = vols.iter().enumerate()
            .map(|(i, v)| (format!("w-{i}"), v.iter().map(|x| format!("vol-{x}")).collect()))
            .collect();
        let placeable: Vec<Placeable> = owned.iter().map(|(n, v)| Placeable { name: n, volumes: v }).collect();
        let b = plan_batches(&placeable, k, None);
        let volumes: HashMap<&str, &Vec<String>> = owned.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let mut seen = BTreeSet::new();
        for batch in &b.batches {
            prop_assert!(!batch.is_empty() && batch.len() <= k, "batch {:?} breaks maxUnavailable {}", batch, k);
            let mut in_batch = BTreeSet::new();
            for n in batch {
                prop_assert!(seen.insert(n.clone()), "{} placed twice", n);
                for v in volumes[n.as_str()] {
                    // A node listing a volume twice still holds one replica.
                    let dup_in_node = volumes[n.as_str()].iter().filter(|x| *x == v).count() > 1;
                    prop_assert!(in_batch.insert(v.clone()) || dup_in_node, "two nodes with volume {} in {:?}", v, batch);
                }
            }
        }
        prop_assert_eq!(seen.len(), owned.len());
        prop_assert!(b.batches.len() >= b.lower_bound);
    }

    #[test]
    fn pairing_holds_at_every_stage_when_the_check_passes(
        t0 in 7u64..15, dt in 0u64..3, k0 in 24u64..39, dk in 0u64..3,
    ) {
        let (t1, k1) = (t0 + dt, k0 + dk);
        let rs = |t: u64, k: u64| ReleaseSet::parse("rs", &format!(
            "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: p}}\nspec:\n  talos: v1.{t}.0\n  kubernetes: v1.{k}.0\n  cni: {{name: flannel, version: 0.28.8}}\n")).unwrap();
        let bump = Bump::between(&rs(t0, k0), &rs(t1, k1));
        let policies = Policies::shipped().unwrap();
        // A skip is judged as a chain (item `chain`, which blocks): no pairing item then.
        let passed = policy::evaluate(&bump, &policies, None).into_iter().find(|i| i.id == "talos-kubernetes").is_some_and(|i| i.status == Status::Pass);
        let cluster = Cluster::parse("c", "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {name: p}\nspec:\n  inventory:\n    nodes:\n      - {name: cp-1, role: controlplane}\n      - {name: w-1, role: worker}\n").unwrap();
        let nodes = cluster.spec.inventory.as_ref().unwrap().resolve(&bump.base);
        let p = plan("p", &bump, &cluster.spec, &nodes, &PlanOptions::default()).unwrap();
        // Talos always moves before Kubernetes.
        let talos_stage = p.stages.iter().position(|s| s.id == ichor::plan::StageId::Talos);
        let kube_stage = p.stages.iter().position(|s| s.id == ichor::plan::StageId::KubeApiserver);
        if let (Some(t), Some(k)) = (talos_stage, kube_stage) { prop_assert!(t < k); }
        if passed {
            // The first pair is what the cluster runs today; every later one is ichor's doing.
            for pair in p.pairings.iter().skip(1) {
                let row = policies.talos_row(pair.talos.minor_version());
                prop_assert!(row.is_some_and(|r| r.kubernetes.contains(pair.kubernetes.minor_version())),
                    "Talos {} with Kubernetes {} is unsupported but the check passed", pair.talos, pair.kubernetes);
            }
        }
    }

    #[test]
    fn release_set_parser_never_panics(text in "\\PC{0,400}") {
        let _ = ReleaseSet::parse("fuzz.yaml", &text);
        let _ = Cluster::parse("fuzz.yaml", &text);
    }

    #[test]
    fn release_set_parser_never_panics_on_near_valid_yaml(
        talos in "[v0-9.a-z-]{0,12}", k8s in "[v0-9.:]{0,10}", extra in "[a-zA-Z: \\-\\[\\]{}\n]{0,60}",
    ) {
        let text = format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: x}}\nspec:\n  talos: {talos}\n  kubernetes: {k8s}\n  cni: {{name: cilium, version: 1.18.3}}\n{extra}");
        if let Err(e) = ReleaseSet::parse("near.yaml", &text) {
            prop_assert!(e.to_string().starts_with("near.yaml"));
        }
        let ctext = format!("apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: x}}\nspec:\n  rollout: {{maxUnavailable: {k8s}, drainTimeout: {talos}}}\n{extra}");
        let _ = Cluster::parse("near.yaml", &ctext);
    }

    #[test]
    fn every_document_parser_takes_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let text = String::from_utf8_lossy(&bytes);
        let started = std::time::Instant::now();
        let _ = ReleaseSet::parse("fuzz.yaml", &text);
        let _ = Cluster::parse("fuzz.yaml", &text);
        let _ = Policies::load(&[("policies/fuzz.yaml".to_string(), text.to_string())]);
        let _ = ichor::releaseset::Version::parse(&text);
        let _ = ichor::releaseset::HumanDuration::parse(&text);
        let _ = ichor::policy::VersionMatch::parse(&text);
        // A hang detector, not a speed test: linear parsers finish 2 KB in microseconds.
        prop_assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    /// YAML-shaped input built from the constructs that have hurt parsers: nesting, aliases,
    /// anchors, block scalars, quotes, flow collections, BOMs and huge numbers.
    #[test]
    fn every_document_parser_takes_hostile_yaml(
        parts in prop::collection::vec(prop::sample::select(vec![
            "[", "]", "{", "}", "- ", "  ", "\n", ": ", "&a ", "*a", "|\n", ">-\n", "\"", "'",
            "# c\n", "\u{feff}", "talos: ", "kubernetes: ", "v1.33.5", "v1.99999999999.0",
            "18446744073709551615s", "nodes:\n", "- name: ", "role: controlplane", "apiVersion: ichor.dev/v1alpha1\n",
            "kind: ReleaseSet\n", "kind: Cluster\n", "spec:\n", "inventory:\n", "? ", ",", "!!str ", "<<: *a\n",
        ]), 0..200),
    ) {
        let text: String = parts.concat();
        let started = std::time::Instant::now();
        for r in [ReleaseSet::parse("h.yaml", &text).err(), Cluster::parse("h.yaml", &text).err()].into_iter().flatten() {
            prop_assert!(r.to_string().starts_with("h.yaml"), "{}", r);
            prop_assert!(r.to_string().len() < 2000, "error echoes too much: {}", r.to_string().len());
        }
        let _ = Policies::load(&[("policies/h.yaml".to_string(), text.clone())]);
        prop_assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn versions_never_overflow_the_checks(a in any::<u64>(), b in any::<u64>(), c in any::<u64>()) {
        // Whatever numbers a PR writes, parsing either refuses them or the checks run.
        let text = format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: x}}\nspec:\n  talos: v1.{a}.0\n  kubernetes: v{b}.{c}.0\n  cni: {{name: cilium, version: 1.18.3}}\n");
        let base = ReleaseSet::parse("b", "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {name: x}\nspec:\n  talos: v1.12.6\n  kubernetes: v1.33.5\n  cni: {name: cilium, version: 1.18.3}\n").unwrap();
        if let Ok(head) = ReleaseSet::parse("h", &text) {
            let bump = Bump::between(&base, &head);
            let items = policy::evaluate(&bump, &Policies::shipped().unwrap(), None);
            prop_assert!(items.iter().all(|i| i.message.len() < 1000));
        }
    }
}

/// The node as a look would see it with every read done, and what the kubelet's
/// configuration says.
#[derive(Debug, Clone)]
struct Full {
    obs: NodeObservation,
    marker: StepMarker,
    config_switched: bool,
    elapsed: u64,
}

fn full_strategy() -> impl Strategy<Value = Full> {
    let talos = prop::sample::select(vec![
        None,
        Some("v1.12.6"),
        Some("v1.12.9"),
        Some("v1.12.9-beta.0"),
        Some("garbage"),
    ]);
    let boot = prop::sample::select(vec![None, Some("a"), Some("b")]);
    let kubelet = prop::sample::select(vec!["v1.33.5", "v1.33.7", ""]);
    let names = prop::collection::vec(prop::sample::select(vec!["vol-1", "vol-2", "vol-3"]), 0..3);
    (
        (talos, boot.clone(), any::<[bool; 4]>(), 0usize..3, kubelet),
        (names.clone(), names.clone(), names),
        (boot, any::<[bool; 5]>(), any::<bool>(), 0u64..4000),
    )
        .prop_map(
            |(
                (talos, boot, [ready, cordoned, ours, in_place], pods, kubelet),
                (unprotected, attachments, held),
                (
                    before,
                    [started, requested, confirmed, pre_pulled, installed],
                    config_switched,
                    elapsed,
                ),
            )| {
                let strs = |v: Vec<&str>| v.into_iter().map(str::to_string).collect::<Vec<_>>();
                let marker = StepMarker {
                    started_at: started.then_some(Timestamp(0)),
                    boot_id_before: before.map(str::to_string),
                    upgrade_requested: requested,
                    pre_pulled,
                    installed_boot: installed.then(|| "a".to_string()),
                    install_sent_boot: None,
                    volumes: strs(held.clone()),
                    upgrade_confirmed: confirmed,
                };
                // A degraded volume is one the step recorded (what the look derives it from).
                let degraded: Vec<String> =
                    strs(held).into_iter().filter(|v| v != "vol-3").collect();
                let obs = NodeObservation {
                    talos: talos.map(str::to_string),
                    boot_id: boot.map(str::to_string),
                    ready,
                    cordoned,
                    cordoned_by_ichor: cordoned && ours,
                    pods_to_move: pods,
                    in_place,
                    unprotected_volumes: strs(unprotected),
                    attachments: strs(attachments),
                    degraded_volumes: degraded,
                    kubelet: kubelet.to_string(),
                    talos_unready: None,
                };
                Full {
                    obs,
                    marker,
                    config_switched,
                    elapsed,
                }
            },
        )
}

/// What a look reads of `full`, following the read rules of src/rollout/step.rs in the
/// order src/rollout/nodes.rs `observe` asks them.
fn looked(
    full: &NodeObservation,
    marker: &StepMarker,
    target: &Version,
    tag: Option<&str>,
) -> NodeObservation {
    let mut o = NodeObservation::unread(full.talos.clone());
    if !step::reads_kubernetes(target, full.talos.as_deref(), marker) {
        if o.talos.is_some() {
            o.boot_id = full.boot_id.clone();
        }
        return o;
    }
    o.boot_id = full.boot_id.clone();
    o.ready = full.ready;
    o.cordoned = full.cordoned;
    o.cordoned_by_ichor = full.cordoned_by_ichor;
    o.in_place = full.in_place;
    o.kubelet = full.kubelet.clone();
    if step::reads_pods(target, &o, tag) {
        o.pods_to_move = full.pods_to_move;
    }
    if step::reads_volumes(target, &o, marker) {
        o.unprotected_volumes = full.unprotected_volumes.clone();
        o.degraded_volumes = full.degraded_volumes.clone();
    }
    if step::reads_attachments(target, &o, marker) {
        o.attachments = full.attachments.clone();
    }
    o
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// A look skips a read only where whatever it would return cannot change the step's
    /// next move: for a Talos node and for a one-drain worker with its kubelet.
    #[test]
    fn a_read_a_look_skips_never_changes_the_next_move(f in full_strategy()) {
        let target = Version::parse("v1.12.9").unwrap();
        let tag = "v1.33.7";
        let now = Timestamp(f.elapsed * 1000);
        let timeout = Duration::from_secs(1800);
        let talos_only = looked(&f.obs, &f.marker, &target, None);
        prop_assert_eq!(
            step::talos_node(&target, &f.obs, &f.marker, now, timeout),
            step::talos_node(&target, &talos_only, &f.marker, now, timeout),
            "read {:?}", talos_only
        );
        // A kubelet that runs the target was switched to it: the configuration says so.
        let config_switched = f.config_switched || (f.obs.ready && f.obs.kubelet == tag);
        let kubelet = |o: &NodeObservation, read_config: bool| {
            let on_target = o.ready && o.kubelet == tag;
            KubeletObservation { on_target, switched: on_target || (read_config && config_switched) }
        };
        let full_kubelet = kubelet(&f.obs, true);
        let seen = looked(&f.obs, &f.marker, &target, Some(tag));
        let seen_move = step::talos_node(&target, &seen, &f.marker, now, timeout);
        let read_config = seen.talos.is_some()
            && step::reads_switched(&seen_move, seen.ready && seen.kubelet == tag);
        prop_assert_eq!(
            step::worker_node(&target, tag, "w-1", &f.obs, &full_kubelet, &f.marker, now, timeout),
            step::worker_node(&target, tag, "w-1", &seen, &kubelet(&seen, read_config), &f.marker, now, timeout),
            "read {:?}", seen
        );
    }
}
