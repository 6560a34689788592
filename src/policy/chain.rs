//! The checklist for a change that moves Talos or Kubernetes more than one minor: the path
//! of hops it needs ([`super::path`]) and each intermediate state judged as the endpoints
//! are (the CNI and every add-on of the head release set, which the GitOps tool deploys at
//! merge, against every Kubernetes minor passed through; blockers and end of life per hop).

use crate::releaseset::{Bump, ChangeKind, ComponentId, ReleaseSet};

use super::checks::{addon_item, blockers, cni, end_of_life, Context};
use super::data::Policies;
use super::path::{self, ControlPlanes, Move, NoPath, Path, Rules, State, Workers};
use super::verdict::{CheckItem, Status};

/// Whether the rollout engine walks a path of hops. Until it does, a chain is shown and
/// judged but blocks: merged, it would run as one jump across the skipped minors.
pub const ENGINE_WALKS_CHAINS: bool = false;

/// Whether `bump` needs a chain: Talos or Kubernetes moves forward more than one minor.
pub fn needed(bump: &Bump) -> bool {
    [ComponentId::Talos, ComponentId::Kubernetes]
        .iter()
        .any(|c| {
            bump.change(c)
                .is_some_and(|c| matches!(c.kind, ChangeKind::Minor { minors } if minors > 1))
        })
        && [ComponentId::Talos, ComponentId::Kubernetes]
            .iter()
            .all(|c| {
                bump.change(c)
                    .is_none_or(|c| matches!(c.kind, ChangeKind::Minor { .. } | ChangeKind::Patch))
            })
}

/// The path from the base release set to the head's (both uniform: every node at the
/// release set's versions), under `p`, the head's `spec.via` and the cluster's opt-in.
pub fn path_for(bump: &Bump, p: &Policies, talos_minors_per_reboot: u64) -> Result<Path, NoPath> {
    let (b, h) = (&bump.base.spec, &bump.head.spec);
    let rules = Rules::new(p, &h.via, talos_minors_per_reboot);
    let start = State {
        control_planes: ControlPlanes {
            talos: b.talos.clone(),
            kubernetes: b.kubernetes.clone(),
        },
        workers: Workers {
            talos: b.talos.clone(),
            kubelet: b.kubernetes.clone(),
        },
        moves: None,
    };
    path::find(
        &start,
        &ControlPlanes {
            talos: h.talos.clone(),
            kubernetes: h.kubernetes.clone(),
        },
        &rules,
    )
}

/// "1) Talos v1.12.6 → 1.13.10 on control planes; 2) …", at most `max` hops then a count.
pub fn hop_list(path: &Path, max: usize) -> String {
    let hops: Vec<String> = path
        .states
        .iter()
        .filter_map(|s| s.moves.as_ref())
        .enumerate()
        .map(|(i, m)| format!("{}) {m}", i + 1))
        .collect();
    let mut out = hops
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if hops.len() > max {
        out.push_str(&format!("; and {} more", hops.len() - max));
    }
    out
}

/// A release set at one state of the chain: the head's components, the state's control
/// planes' Talos and Kubernetes.
fn at_state(head: &ReleaseSet, s: &State) -> ReleaseSet {
    let mut rs = head.clone();
    rs.spec.talos = s.control_planes.talos.clone();
    rs.spec.kubernetes = s.control_planes.kubernetes.clone();
    rs.spec.via = Default::default();
    rs
}

/// The chain's items: `chain` (the path, or the hop that makes it impossible) and every
/// intermediate state's checks that do not pass, each named by its hop.
pub fn items(bump: &Bump, p: &Policies, ctx: &Context) -> Vec<CheckItem> {
    let id = "chain";
    let title = "A supported chain of hops leads to the target";
    let (b, h) = (&bump.base.spec, &bump.head.spec);
    let ends = [
        ("Talos", &b.talos, &h.talos),
        ("Kubernetes", &b.kubernetes, &h.kubernetes),
    ]
    .iter()
    .filter(|(_, from, to)| from != to)
    .map(|(what, from, to)| format!("{what} {from} → {to}"))
    .collect::<Vec<_>>()
    .join(" and ");
    let path = match path_for(bump, p, ctx.talos_minors_per_reboot) {
        Ok(path) => path,
        Err(e) => {
            let mut item = CheckItem::new(
                id,
                title,
                Status::Fail,
                format!("no supported chain for {ends}: the hop {e}"),
            )
            .hint(e.hint.clone().unwrap_or_else(|| {
                "move the blocked component in a change of its own first, or target a version the data lets the chain reach".into()
            }));
            if let Some(s) = &e.source {
                item = item.source(s);
            }
            return vec![item];
        }
    };
    let mut items = Vec::new();
    let drains = path.worker_drains();
    let message = format!(
        "{ends} needs {} hops, every state supported, each worker drained {}: {}",
        path.hops(),
        match drains {
            1 => "once".to_string(),
            2 => "twice".to_string(),
            n => format!("{n} times"),
        },
        hop_list(&path, 12)
    );
    let first = path
        .states
        .iter()
        .filter_map(|s| s.moves.as_ref())
        .find_map(|m| match m {
            Move::ControlPlanes { talos: Some(t), .. } => Some(format!("spec.talos {}", t.to)),
            Move::ControlPlanes {
                kubernetes: Some(k),
                ..
            } => Some(format!("spec.kubernetes {}", k.to)),
            _ => None,
        });
    let landed: Vec<String> = path
        .landings
        .iter()
        .map(|(what, l)| format!("{what} {} ({})", l.version, l.source))
        .collect();
    let mut item = if ENGINE_WALKS_CHAINS {
        let status = if path.unconfirmed {
            Status::Warn
        } else {
            Status::Pass
        };
        CheckItem::new(id, title, status, message)
    } else {
        CheckItem::new(id, title, Status::Fail, message).hint(format!(
            "ichor does not roll a chain out yet: merged, it would jump the skipped minors at once; move one minor at a time{}",
            first
                .map(|f| format!(", starting with a change to {f}"))
                .unwrap_or_default()
        ))
    };
    if !landed.is_empty() {
        item = item.source(landed.join("; "));
    }
    items.push(item);

    // Every intermediate control-plane state, judged with the head's components.
    let mut hop_items = Vec::new();
    let mut passed_through = Vec::new();
    for (i, pair) in path.states.windows(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let Some(m) = &b.moves else { continue };
        if m.on_workers() {
            continue;
        }
        let at_target = b.control_planes.talos == bump.head.spec.talos
            && b.control_planes.kubernetes == bump.head.spec.kubernetes;
        if at_target {
            continue;
        }
        if a.control_planes.kubernetes != b.control_planes.kubernetes {
            passed_through.push(b.control_planes.kubernetes.to_string());
        }
        let hop = Bump::between(&at_state(&bump.head, a), &at_state(&bump.head, b));
        let mut found = vec![cni(&hop, p)];
        found.extend(bump.head.spec.addons.iter().map(|a| addon_item(&hop, p, a)));
        found.extend(blockers(&hop, p));
        if let Some(today) = ctx.today {
            found.extend(
                end_of_life(&hop, p, today)
                    .into_iter()
                    .filter(|it| it.id == "eol/talos" || it.id == "eol/kubernetes"),
            );
        }
        for mut it in found.into_iter().filter(|it| it.status != Status::Pass) {
            it.id = format!("hop-{}/{}", i + 1, it.id);
            it.title = format!("Hop {} ({m}): {}", i + 1, it.title);
            hop_items.push(it);
        }
    }
    if hop_items.is_empty() {
        let through = if passed_through.is_empty() {
            String::new()
        } else {
            format!(" (Kubernetes {} on the way)", passed_through.join(", "))
        };
        items.push(CheckItem::new(
            "chain-hops",
            "Every intermediate state passes the checklist",
            Status::Pass,
            format!(
                "the CNI, every add-on and the blockers pass at every intermediate state{through}"
            ),
        ));
    }
    items.extend(hop_items);
    items
}

/// The first step of the chain as a bump (base → the first Talos and the first Kubernetes
/// the chain lands on), for the items that judge live nodes against where they go next.
pub fn first_step(bump: &Bump, path: &Path) -> Bump {
    let mut head = bump.base.clone();
    if let Some(t) = path.states.iter().find_map(|s| match &s.moves {
        Some(Move::ControlPlanes { talos: Some(t), .. }) => Some(t.to.clone()),
        _ => None,
    }) {
        head.spec.talos = t;
    }
    if let Some(k) = path.states.iter().find_map(|s| match &s.moves {
        Some(Move::ControlPlanes {
            kubernetes: Some(k),
            ..
        }) => Some(k.to.clone()),
        _ => None,
    }) {
        head.spec.kubernetes = k;
    }
    Bump::between(&bump.base, &head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Context;

    fn rs(talos: &str, k8s: &str) -> ReleaseSet {
        ReleaseSet::parse(
            "rs.yaml",
            &format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: t}}\nspec:\n  talos: {talos}\n  kubernetes: {k8s}\n  cni: {{name: cilium, version: 1.19.6}}\n  addons:\n    - {{name: cert-manager, version: v1.20.2}}\n"),
        )
        .unwrap()
    }

    /// A blocker on an intermediate Kubernetes minor only (neither end) is named with its hop.
    #[test]
    fn an_intermediate_state_is_judged_and_named_by_its_hop() {
        let bump = Bump::between(&rs("v1.13.9", "v1.33.5"), &rs("v1.14.6", "v1.36.3"));
        assert!(needed(&bump));
        let repo = vec![(
            "policies/mine.yaml".to_string(),
            "blockers:\n  - id: mid\n    component: cilium\n    kubernetes: \"1.34\"\n    message: \"cilium drops pods on 1.34\"\n    source: \"test\"\n".to_string(),
        )];
        let p = Policies::load(&repo).unwrap();
        let items = items(&bump, &p, &Context::default());
        let hop = items
            .iter()
            .find(|i| i.id.ends_with("/blocker/mid"))
            .unwrap_or_else(|| panic!("{items:#?}"));
        assert_eq!(hop.status, Status::Fail);
        assert!(
            hop.title
                .contains("Kubernetes v1.33.5 → v1.34.1 on control planes"),
            "{hop:?}"
        );
        assert!(!items.iter().any(|i| i.id == "chain-hops"), "{items:#?}");
        // Without the blocker every intermediate state passes.
        let items = super::items(&bump, &Policies::shipped().unwrap(), &Context::default());
        assert!(
            items
                .iter()
                .any(|i| i.id == "chain-hops" && i.status == Status::Pass),
            "{items:#?}"
        );
        let chain = &items[0];
        assert_eq!(
            chain.status,
            Status::Fail,
            "the engine does not walk chains yet"
        );
        assert!(chain.message.contains("each worker drained"), "{chain:?}");
    }

    #[test]
    fn one_minor_is_not_a_chain() {
        let bump = Bump::between(&rs("v1.13.9", "v1.35.4"), &rs("v1.14.6", "v1.36.3"));
        assert!(!needed(&bump));
    }
}
