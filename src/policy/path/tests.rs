use std::collections::{BTreeMap, HashMap, VecDeque};

use proptest::prelude::*;

use super::*;
use crate::releaseset::{Version, Via};

fn v(s: &str) -> Version {
    Version::parse(s).unwrap()
}

fn uniform(talos: &str, k8s: &str) -> State {
    State {
        control_planes: ControlPlanes {
            talos: v(talos),
            kubernetes: v(k8s),
        },
        workers: Workers {
            talos: v(talos),
            kubelet: v(k8s),
        },
        moves: None,
    }
}

fn target(talos: &str, k8s: &str) -> ControlPlanes {
    ControlPlanes {
        talos: v(talos),
        kubernetes: v(k8s),
    }
}

fn shipped(per_reboot: u64) -> Rules {
    Rules::new(&Policies::shipped().unwrap(), &Via::default(), per_reboot)
}

/// One line per state: `T1.13.10/1.33.6 | W1.12.6/1.33.5`.
fn lines(p: &Path) -> Vec<String> {
    p.states
        .iter()
        .map(|s| {
            format!(
                "{}/{} | {}/{}",
                s.control_planes.talos,
                s.control_planes.kubernetes,
                s.workers.talos,
                s.workers.kubelet
            )
        })
        .collect()
}

/// The anchors' example (reference §3 pitfall 1): from Talos 1.12 with Kubernetes 1.32 to
/// 1.15 with 1.38 the control planes must interleave T1.13 → K1.33 → T1.14, since Talos
/// 1.14 runs 1.33 or later (1.15 too, and refuses a config below); workers follow once per
/// Talos minor with their kubelet riding along.
#[test]
fn control_planes_interleave_talos_and_kubernetes() {
    let p = find(
        &uniform("v1.12.6", "v1.32.4"),
        &target("v1.15.0", "v1.38.0"),
        &shipped(1),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let cp: Vec<String> = p
        .states
        .iter()
        .filter_map(|s| match &s.moves {
            Some(Move::ControlPlanes { talos: Some(t), .. }) => {
                Some(format!("T{}", t.to.minor_version()))
            }
            Some(Move::ControlPlanes {
                kubernetes: Some(k),
                ..
            }) => Some(format!("K{}", k.to.minor_version())),
            _ => None,
        })
        .collect();
    assert!(
        cp.join(" ").starts_with("T1.13 K1.33 T1.14 "),
        "{:#?}",
        lines(&p)
    );
    assert_eq!(cp.len(), 3 + 6, "{:#?}", lines(&p));
    assert_eq!(p.worker_drains(), 3, "{:#?}", lines(&p));
    // Intermediate minors land on their newest known patch; the ends are the release sets'.
    assert!(p
        .states
        .iter()
        .any(|s| s.control_planes.talos == v("1.13.10")));
    assert!(p
        .states
        .iter()
        .any(|s| s.control_planes.kubernetes == v("1.36.3")));
    assert_eq!(p.states[0], uniform("v1.12.6", "v1.32.4"));
    let last = p.states.last().unwrap();
    assert_eq!(last.workers.talos, v("v1.15.0"));
    assert_eq!(last.workers.kubelet, v("v1.38.0"));
}

/// The issue's example: Talos 1.12 → 1.14 and Kubernetes 1.33 → 1.36 drains each worker
/// twice (the Talos minors walked), not five times; control planes walk all five minors.
#[test]
fn workers_are_drained_once_per_talos_minor() {
    let p = find(
        &uniform("v1.12.6", "v1.33.5"),
        &target("v1.14.6", "v1.36.3"),
        &shipped(1),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.worker_drains(), 2, "{:#?}", lines(&p));
    assert_eq!(p.hops(), 2 + 3 + 2, "{:#?}", lines(&p));
}

/// With `talosMinorsPerReboot: 2` the Talos 1.14 installer takes a 1.12 host in one reboot,
/// but the skew page's prerequisite (kubelets at N-2 before the apiserver moves to N) still
/// makes the kubelet move once before 1.36; a repository that reads the kubelet section's
/// N-3 instead drains each worker once.
#[test]
fn two_talos_minors_per_reboot_drains_once_where_the_skew_allows() {
    let start = uniform("v1.12.6", "v1.33.5");
    let to = target("v1.14.6", "v1.36.3");
    let p = find(&start, &to, &shipped(2)).unwrap();
    assert_eq!(p.worker_drains(), 2, "{:#?}", lines(&p));
    let mut rules = shipped(2);
    rules.kubelet_max_older_before_upgrade = 3;
    let p = find(&start, &to, &rules).unwrap();
    assert_eq!(p.worker_drains(), 1, "{:#?}", lines(&p));
    // The one drain moves Talos first: Talos 1.12 cannot run the kubelet 1.36.
    match &p.states.last().unwrap().moves {
        Some(Move::Workers { first, .. }) => assert_eq!(*first, Some(First::Talos)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn via_pins_the_intermediate_patch() {
    let policies = Policies::shipped().unwrap();
    let via = Via {
        talos: vec![v("v1.13.9")],
        kubernetes: vec![v("v1.34.6"), v("v1.35.4")],
    };
    let p = find(
        &uniform("v1.12.6", "v1.33.5"),
        &target("v1.14.6", "v1.36.3"),
        &Rules::new(&policies, &via, 1),
    )
    .unwrap();
    assert!(p
        .states
        .iter()
        .any(|s| s.control_planes.talos == v("v1.13.9")));
    assert!(p
        .states
        .iter()
        .any(|s| s.control_planes.kubernetes == v("v1.34.6")));
    assert!(!p
        .states
        .iter()
        .any(|s| s.control_planes.talos == v("1.13.10")));
}

#[test]
fn a_minor_without_a_known_patch_names_the_hop_and_how_to_pin_it() {
    let mut rules = shipped(1);
    rules.talos_patches.remove(&MinorVersion::new(1, 13));
    let e = find(
        &uniform("v1.12.6", "v1.33.5"),
        &target("v1.14.6", "v1.36.3"),
        &rules,
    )
    .unwrap_err();
    assert_eq!(e.hop, "Talos 1.12 → 1.13 on control planes", "{e:?}");
    assert!(e.why.contains("no known patch of Talos 1.13"), "{e:?}");
    assert!(
        e.hint.as_deref().unwrap_or("").contains("spec.via.talos"),
        "{e:?}"
    );
}

/// A gap in the data: no Talos runs both sides of a Kubernetes minor the chain must cross.
#[test]
fn an_impossible_chain_names_the_hop_and_why() {
    let mut rules = shipped(1);
    // Talos 1.14 made to start at Kubernetes 1.37 while 1.13 stops at 1.36.
    if let Some(f) = rules.talos.get_mut(&MinorVersion::new(1, 14)) {
        f.kubernetes.min = MinorVersion::new(1, 37);
    }
    let e = find(
        &uniform("v1.12.6", "v1.33.5"),
        &target("v1.14.6", "v1.37.0"),
        &rules,
    )
    .unwrap_err();
    assert!(
        e.hop == "Talos 1.13 → 1.14 on control planes"
            || e.hop == "Kubernetes 1.36 → 1.37 on control planes",
        "{e:?}"
    );
    assert!(e.why.contains("supports Kubernetes"), "{e:?}");
    assert!(e.source.is_some(), "{e:?}");
}

#[test]
fn backwards_or_across_majors_is_no_path() {
    let e = find(
        &uniform("v1.13.6", "v1.33.5"),
        &target("v1.12.6", "v1.33.5"),
        &shipped(1),
    )
    .unwrap_err();
    assert!(e.why.contains("backwards"), "{e:?}");
}

#[test]
fn the_json_shape_is_the_issues() {
    let p = find(
        &uniform("v1.12.6", "v1.33.5"),
        &target("v1.13.10", "v1.35.4"),
        &shipped(1),
    )
    .unwrap();
    let j = serde_json::to_value(&p).unwrap();
    let s = &j["states"];
    assert_eq!(s[0]["controlPlanes"]["talos"], "v1.12.6");
    assert_eq!(s[0]["workers"]["kubelet"], "v1.33.5");
    assert!(s[0]["moves"].is_null());
    assert_eq!(s[1]["moves"]["on"], "controlPlanes");
    assert_eq!(s[1]["moves"]["talos"]["to"], "v1.13.10");
}

// ---- properties, judged by a checker written apart from the search ----

/// Every node's pairs at one moment of a hop.
struct Moment {
    /// (Talos, components, kubelet) per control plane.
    cps: Vec<(u64, u64, u64)>,
    apiservers: Vec<u64>,
    /// (Talos, kubelet) per worker.
    workers: Vec<(u64, u64)>,
}

fn in_range(r: &Rules, t: u64, k: u64) -> bool {
    r.talos
        .get(&MinorVersion::new(1, t))
        .is_some_and(|f| f.kubernetes.contains(MinorVersion::new(1, k)))
}

fn moment_ok(r: &Rules, m: &Moment) -> bool {
    let lo = *m.apiservers.iter().min().unwrap();
    let hi = *m.apiservers.iter().max().unwrap();
    let kubelets: Vec<u64> = m
        .cps
        .iter()
        .map(|c| c.2)
        .chain(m.workers.iter().map(|w| w.1))
        .collect();
    let cp_talos_min = m.cps.iter().map(|c| c.0).min().unwrap();
    m.cps
        .iter()
        .all(|&(t, c, l)| in_range(r, t, c) && in_range(r, t, l))
        && m.workers.iter().all(|&(t, l)| in_range(r, t, l))
        && hi - lo <= 1
        && kubelets
            .iter()
            .all(|&l| l <= lo && lo - l <= r.kubelet_max_older)
        && (hi == lo
            || kubelets
                .iter()
                .all(|&l| l + r.kubelet_max_older_before_upgrade >= hi))
        && m.workers.iter().all(|&(t, _)| t <= cp_talos_min)
}

fn upgrades_from(r: &Rules, host: u64, to: u64) -> bool {
    r.talos.get(&MinorVersion::new(1, to)).is_some_and(|f| {
        f.upgrade_from
            .as_ref()
            .is_none_or(|min| (1, host, 1) >= (min.major(), min.minor(), min.patch()))
    })
}

type K4 = (u64, u64, u64, u64);

/// Whether `a` → `b` is one hop whose every moment is supported.
fn hop_ok(r: &Rules, a: K4, b: K4) -> bool {
    let (ct, ck, wt, wl) = a;
    let (ct2, ck2, wt2, wl2) = b;
    let moments: Vec<Vec<Moment>> = if (ct2, ck2, wt2, wl2) == (ct + 1, ck, wt, wl) {
        if !upgrades_from(r, ct, ct2) {
            return false;
        }
        vec![vec![Moment {
            cps: vec![(ct, ck, ck), (ct2, ck, ck)],
            apiservers: vec![ck],
            workers: vec![(wt, wl)],
        }]]
    } else if (ct2, ck2, wt2, wl2) == (ct, ck + 1, wt, wl) {
        vec![vec![
            Moment {
                cps: vec![(ct, ck, ck), (ct, ck2, ck)],
                apiservers: vec![ck, ck2],
                workers: vec![(wt, wl)],
            },
            Moment {
                cps: vec![(ct, ck2, ck), (ct, ck2, ck2)],
                apiservers: vec![ck2],
                workers: vec![(wt, wl)],
            },
        ]]
    } else if (ct2, ck2) == (ct, ck) && wt2 >= wt && wl2 >= wl && (wt2, wl2) != (wt, wl) {
        if wt2 - wt > r.talos_minors_per_reboot || (wt2 != wt && !upgrades_from(r, wt, wt2)) {
            return false;
        }
        // Either order inside the drain will do.
        [(wt, wl2), (wt2, wl)]
            .into_iter()
            .map(|mid| {
                vec![Moment {
                    cps: vec![(ct, ck, ck)],
                    apiservers: vec![ck],
                    workers: vec![(wt, wl), mid, (wt2, wl2)],
                }]
            })
            .collect()
    } else {
        return false;
    };
    moments
        .iter()
        .any(|order| order.iter().all(|m| moment_ok(r, m)))
}

fn key(s: &State) -> K4 {
    (
        s.control_planes.talos.minor(),
        s.control_planes.kubernetes.minor(),
        s.workers.talos.minor(),
        s.workers.kubelet.minor(),
    )
}

/// The shortest number of hops by a plain breadth-first search over every candidate
/// state in the box, judged by `hop_ok` only.
fn shortest(r: &Rules, from: K4, goal: K4) -> Option<usize> {
    let mut dist: HashMap<K4, usize> = HashMap::from([(from, 0)]);
    let mut q = VecDeque::from([from]);
    while let Some(a) = q.pop_front() {
        if a == goal {
            return dist.get(&a).copied();
        }
        let d = dist[&a];
        let mut next = vec![(a.0 + 1, a.1, a.2, a.3), (a.0, a.1 + 1, a.2, a.3)];
        for t in a.2..=goal.2 {
            for l in a.3..=goal.3 {
                next.push((a.0, a.1, t, l));
            }
        }
        for b in next {
            if b.0 <= goal.0 && b.1 <= goal.1 && !dist.contains_key(&b) && hop_ok(r, a, b) {
                dist.insert(b, d + 1);
                q.push_back(b);
            }
        }
    }
    None
}

/// Synthetic data: Talos minors 8..=16, each with a Kubernetes window and an upgradeFrom,
/// every minor with a landing patch `.1`.
fn rules_strategy() -> impl Strategy<Value = Rules> {
    (
        proptest::collection::vec((0u64..3, 2u64..7, 1u64..4), 9),
        1u64..4,
        0u64..2,
        1u64..3,
    )
        .prop_map(|(rows, before, extra, per)| {
            let mut talos = BTreeMap::new();
            let mut talos_patches = BTreeMap::new();
            let mut kubernetes_patches = BTreeMap::new();
            for (i, (d, w, u)) in rows.into_iter().enumerate() {
                let m = 8 + i as u64;
                let min = 18 + m + d;
                talos.insert(
                    MinorVersion::new(1, m),
                    TalosFacts {
                        kubernetes: KubeRange {
                            min: MinorVersion::new(1, min),
                            max: Some(MinorVersion::new(1, min + w)),
                        },
                        upgrade_from: Some(v(&format!("1.{}.0", m - u))),
                        confidence: Confidence::Upstream,
                        source: format!("talos{m}.go"),
                    },
                );
                talos_patches.insert(
                    MinorVersion::new(1, m),
                    Landing {
                        version: v(&format!("1.{m}.1")),
                        source: "test".into(),
                    },
                );
            }
            for k in 20..50 {
                kubernetes_patches.insert(
                    MinorVersion::new(1, k),
                    Landing {
                        version: v(&format!("1.{k}.1")),
                        source: "test".into(),
                    },
                );
            }
            Rules {
                talos,
                kubelet_max_older_before_upgrade: before,
                kubelet_max_older: (before + extra).min(3),
                talos_minors_per_reboot: per,
                talos_patches,
                kubernetes_patches,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every hop of every path found keeps every node's pair supported at every moment; no
    /// shorter path exists; and where none is found the plain search finds none either,
    /// while the error names a hop.
    #[test]
    fn paths_are_supported_shortest_and_refusals_name_the_hop(
        r in rules_strategy(),
        t0 in 8u64..14,
        dk0 in 0u64..5,
        dt in 0u64..4,
        dk in 0u64..6,
    ) {
        let t1 = (t0 + dt).min(16);
        let k0 = 18 + t0 + dk0;
        let k1 = k0 + dk;
        let from = (t0, k0, t0, k0);
        let goal = (t1, k1, t1, k1);
        // The start must itself be supported (a cluster outside its data is another item's).
        prop_assume!(moment_ok(&r, &Moment { cps: vec![(t0, k0, k0)], apiservers: vec![k0], workers: vec![(t0, k0)] }));
        let start = uniform(&format!("1.{t0}.1"), &format!("1.{k0}.1"));
        let to = target(&format!("1.{t1}.1"), &format!("1.{k1}.1"));
        let expected = shortest(&r, from, goal);
        match find(&start, &to, &r) {
            Ok(p) => {
                prop_assert_eq!(key(&p.states[0]), from);
                prop_assert_eq!(key(p.states.last().unwrap()), goal);
                for pair in p.states.windows(2) {
                    prop_assert!(hop_ok(&r, key(&pair[0]), key(&pair[1])), "{:?} → {:?}", key(&pair[0]), key(&pair[1]));
                }
                prop_assert_eq!(Some(p.hops()), expected);
            }
            Err(e) => {
                prop_assert_eq!(expected, None, "find refused a chain the plain search walks: {}", e);
                prop_assert!(e.hop.contains('→') && e.hop.contains(" on "), "{:?}", e);
                prop_assert!(!e.why.is_empty());
            }
        }
    }
}

#[test]
fn release_set_via_parses_and_refuses_a_minor_twice() {
    use crate::releaseset::ReleaseSet;
    let doc = |via: &str| {
        format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: t}}\nspec:\n  talos: v1.14.6\n  kubernetes: v1.36.3\n  cni: {{name: cilium, version: 1.19.6}}\n  via: {via}\n")
    };
    let rs = ReleaseSet::parse(
        "rs.yaml",
        &doc("{talos: [v1.13.9], kubernetes: [v1.34.6, v1.35.4]}"),
    )
    .unwrap();
    assert_eq!(rs.spec.via.kubernetes.len(), 2);
    let e = ReleaseSet::parse("rs.yaml", &doc("{kubernetes: [v1.34.6, v1.34.7]}")).unwrap_err();
    assert!(e.to_string().contains("pins 1.34 twice"), "{e}");
    let e = ReleaseSet::parse("rs.yaml", &doc("{helm: [v3.0.0]}")).unwrap_err();
    assert!(e.to_string().contains("helm"), "{e}");
}

#[test]
fn shipped_latest_patches_load_and_a_repository_overrides_them() {
    let p = Policies::shipped().unwrap();
    let t = p.latest_patch("talos", MinorVersion::new(1, 13)).unwrap();
    assert_eq!(t.latest, v("1.13.10"));
    assert!(!t.source.is_empty());
    let repo = vec![(
        "policies/mine.yaml".to_string(),
        "latestPatches:\n  - component: talos\n    version: \"1.13\"\n    latest: \"1.13.11\"\n    source: \"my notes\"\n".to_string(),
    )];
    let p = Policies::load(&repo).unwrap();
    assert_eq!(
        p.latest_patch("talos", MinorVersion::new(1, 13))
            .unwrap()
            .latest,
        v("1.13.11")
    );
    let bad = vec![(
        "policies/mine.yaml".to_string(),
        "latestPatches:\n  - component: talos\n    version: \"1.13\"\n    latest: \"1.14.1\"\n    source: \"x\"\n".to_string(),
    )];
    let e = Policies::load(&bad).unwrap_err();
    assert!(e.to_string().contains("is not a 1.13 patch"), "{e}");
}
