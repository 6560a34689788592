//! The static checklist: everything that can be decided from the two release sets, the
//! compatibility data and (when given) the nodes. One function per item; each returns the
//! item with its status, a message, and a hint when it did not pass.

use crate::releaseset::{Bump, ChangeKind, Component, ComponentId, MinorVersion, Node, Version};

use super::data::{Confidence, Policies};
use super::verdict::{CheckItem, Status};

/// Every static item for `bump`, plus the node items when `nodes` is known.
pub fn evaluate(bump: &Bump, policies: &Policies, nodes: Option<&[Node]>) -> Vec<CheckItem> {
    let mut items = vec![
        no_downgrade(bump),
        kubernetes_step(bump, policies),
        talos_step(bump, policies),
        talos_kubernetes_pairing(bump, policies),
        cni(bump, policies),
    ];
    for addon in &bump.head.spec.addons {
        items.push(addon_item(bump, policies, addon));
    }
    items.extend(blockers(bump, policies));
    if let Some(nodes) = nodes {
        items.push(nodes_talos(bump, policies, nodes));
        items.push(kubelet_skew(bump, policies, nodes));
    }
    items
}

/// A failing check becomes a warning when the data behind it is unconfirmed.
fn graded(confidence: Confidence, failed: bool) -> Status {
    match (failed, confidence.is_confirmed()) {
        (false, true) => Status::Pass,
        (false, false) | (true, false) => Status::Warn,
        (true, true) => Status::Fail,
    }
}

fn unconfirmed_note(confidence: Confidence) -> &'static str {
    if confidence.is_confirmed() {
        ""
    } else {
        " (data unconfirmed: treated as a warning)"
    }
}

pub fn no_downgrade(bump: &Bump) -> CheckItem {
    let title = "No component moves backwards";
    let down: Vec<String> = bump
        .changes
        .iter()
        .filter(|c| c.kind == ChangeKind::Downgrade)
        .map(|c| c.to_string())
        .collect();
    if down.is_empty() {
        CheckItem::new(
            "no-downgrade",
            title,
            Status::Pass,
            "no version moves backwards",
        )
    } else {
        CheckItem::new("no-downgrade", title, Status::Fail, format!("downgrade: {}", down.join("; ")))
            .hint("ichor only rolls forward; revert the version change, or bump to a newer release that fixes the problem")
    }
}

/// Step rule shared by Kubernetes and Talos: one minor at a time, no major jumps.
fn minor_step(
    id: &str,
    title: &str,
    what: &str,
    from: &Version,
    to: &Version,
    max_step: u64,
    source: &str,
) -> CheckItem {
    let (f, t) = (from.minor_version(), to.minor_version());
    if to <= from {
        let msg = if to == from {
            format!("{what} stays at {to}")
        } else {
            format!("{what} {from} → {to} is not an upgrade (see no-downgrade)")
        };
        return CheckItem::new(id, title, Status::Pass, msg);
    }
    match f.minors_to(t) {
        None => CheckItem::new(
            id,
            title,
            Status::Fail,
            format!("{what} {from} → {to} changes the major version"),
        )
        .hint(format!(
            "{what} major upgrades are not gated by ichor; stay on {}.x",
            f.major
        ))
        .source(source),
        Some(n) if n.unsigned_abs() > max_step => {
            // Name the skipped minors without enumerating them: the count comes from a PR.
            let first = f.next();
            let last = MinorVersion::new(t.major, t.minor.saturating_sub(1));
            let skipped = match n {
                2 => first.to_string(),
                3 => format!("{first} and {last}"),
                _ => format!("{first} through {last}"),
            };
            CheckItem::new(
                id,
                title,
                Status::Fail,
                format!(
                    "{what} {from} → {to} skips {skipped} ({n} minors at once; at most {max_step})"
                ),
            )
            .hint(format!(
                "upgrade to the latest {what} {} patch first, then to {t}",
                f.next()
            ))
            .source(source)
        }
        Some(0) => CheckItem::new(
            id,
            title,
            Status::Pass,
            format!("{what} {from} → {to} is a patch release"),
        ),
        Some(_) => CheckItem::new(
            id,
            title,
            Status::Pass,
            format!("{what} {from} → {to} moves one minor"),
        ),
    }
}

pub fn kubernetes_step(bump: &Bump, p: &Policies) -> CheckItem {
    minor_step(
        "kubernetes-step",
        "Kubernetes moves at most one minor",
        "Kubernetes",
        &bump.base.spec.kubernetes,
        &bump.head.spec.kubernetes,
        p.skew.kubernetes_max_minor_step,
        &p.skew.source,
    )
}

pub fn talos_step(bump: &Bump, p: &Policies) -> CheckItem {
    let (from, to) = (&bump.base.spec.talos, &bump.head.spec.talos);
    let step = minor_step(
        "talos-step",
        "Talos moves at most one minor",
        "Talos",
        from,
        to,
        p.skew.talos_max_minor_step,
        "siderolabs/docs upgrading-talos.mdx: only adjacent minors are tested",
    );
    if step.status != Status::Pass || to <= from {
        return step;
    }
    // The installer of the target also refuses hosts older than its minimum.
    match p.talos_row(to.minor_version()) {
        None => CheckItem::new(step.id, step.title, Status::Warn, format!("no compatibility data for Talos {}", to.minor_version()))
            .hint(format!("add a `talos:` row for \"{}\" under policies/ in the repository", to.minor_version())),
        Some(row) => match &row.upgrade_from {
            Some(min) if talos_release(from) < talos_release(min) => CheckItem::new(
                step.id,
                step.title,
                graded(row.confidence, true),
                format!("the Talos {} installer upgrades only hosts at {} or later; the release set has {from}{}", row.version, min, unconfirmed_note(row.confidence)),
            )
            .hint(format!("upgrade Talos to {} or later first", min))
            .source(&row.source),
            _ => CheckItem { source: Some(row.source.clone()), ..step },
        },
    }
}

/// Talos goes first, so the pairing must hold at every stage: (T0, K0) → (T1, K0) → (T1, K1).
pub fn talos_kubernetes_pairing(bump: &Bump, p: &Policies) -> CheckItem {
    let id = "talos-kubernetes";
    let title = "Talos supports Kubernetes at every stage";
    let (t0, t1) = (&bump.base.spec.talos, &bump.head.spec.talos);
    let (k0, k1) = (&bump.base.spec.kubernetes, &bump.head.spec.kubernetes);
    let Some(row) = p.talos_row(t1.minor_version()) else {
        return CheckItem::new(
            id,
            title,
            Status::Warn,
            format!(
                "no compatibility data for Talos {}: cannot tell which Kubernetes it supports",
                t1.minor_version()
            ),
        )
        .hint(format!(
            "add a `talos:` row for \"{}\" under policies/ in the repository",
            t1.minor_version()
        ));
    };
    let range = row.kubernetes;
    let note = unconfirmed_note(row.confidence);
    let talos_moves = t1 != t0;
    if talos_moves && !range.contains(k0.minor_version()) {
        let hint = if k0.minor_version() < range.min {
            format!(
                "upgrade Kubernetes to {} or later on Talos {} first, then bump Talos",
                range.min,
                t0.minor_version()
            )
        } else {
            format!(
                "stay on a Talos that supports Kubernetes {}",
                k0.minor_version()
            )
        };
        return CheckItem::new(
            id,
            title,
            graded(row.confidence, true),
            format!("Talos {} supports Kubernetes {range}; the cluster runs {k0} while Talos upgrades first{note}", row.version),
        )
        .hint(hint)
        .source(&row.source);
    }
    if !range.contains(k1.minor_version()) {
        let needed = p
            .talos
            .iter()
            .filter(|r| {
                r.kubernetes.contains(k1.minor_version()) && r.version >= t1.minor_version()
            })
            .map(|r| r.version)
            .min();
        let hint = match needed {
            Some(v) => format!(
                "bump Talos to {v} first (or in the same change: Talos moves before Kubernetes)"
            ),
            None => format!("no known Talos supports Kubernetes {}", k1.minor_version()),
        };
        return CheckItem::new(
            id,
            title,
            graded(row.confidence, true),
            format!(
                "Talos {} supports Kubernetes {range}, not {}{note}",
                row.version,
                k1.minor_version()
            ),
        )
        .hint(hint)
        .source(&row.source);
    }
    // The pair the cluster runs today is not ichor's doing, but say so when it is unsupported.
    let current = p
        .talos_row(t0.minor_version())
        .filter(|r| !r.kubernetes.contains(k0.minor_version()));
    if let Some(r) = current {
        return CheckItem::new(
            id,
            title,
            Status::Warn,
            format!("the target pairing is supported, but the cluster already runs Talos {} with Kubernetes {k0}, outside {}", r.version, r.kubernetes),
        )
        .hint("bring the cluster back into a supported pairing as part of this upgrade")
        .source(&r.source);
    }
    let stages = if talos_moves && k0.minor_version() != k1.minor_version() {
        format!(
            "Talos {} supports Kubernetes {} and {} ({range})",
            row.version,
            k0.minor_version(),
            k1.minor_version()
        )
    } else {
        format!(
            "Talos {} supports Kubernetes {} ({range})",
            row.version,
            k1.minor_version()
        )
    };
    CheckItem::new(
        id,
        title,
        graded(row.confidence, false),
        format!("{stages}{note}"),
    )
    .source(&row.source)
}

/// What the compatibility rows say about `component` at `version` with Kubernetes `k8s`.
enum Support {
    NoData,
    Supported {
        confidence: Confidence,
        range: String,
        source: String,
    },
    Unsupported {
        confidence: Confidence,
        range: String,
        source: String,
    },
}

fn support(p: &Policies, component: &str, version: &Version, k8s: MinorVersion) -> Support {
    let rows: Vec<_> = p.rows_for(component, version).collect();
    if rows.is_empty() {
        return Support::NoData;
    }
    // Every matching row must admit the version (a general and a narrower row intersect).
    let failing: Vec<_> = rows
        .iter()
        .filter(|r| !r.kubernetes.contains(k8s))
        .collect();
    let pick = |rs: &[&&super::data::CompatRow]| {
        let confidence = rs.iter().map(|r| r.confidence).max().unwrap_or_default();
        let range = rs
            .iter()
            .map(|r| r.kubernetes.to_string())
            .collect::<Vec<_>>()
            .join(" and ");
        let source = rs
            .iter()
            .map(|r| r.source.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        (confidence, range, source)
    };
    if failing.is_empty() {
        let all: Vec<_> = rows.iter().collect();
        let (confidence, range, source) = pick(&all);
        Support::Supported {
            confidence,
            range,
            source,
        }
    } else {
        // A confirmed failing row outweighs unconfirmed ones.
        let confirmed: Vec<_> = failing
            .iter()
            .copied()
            .filter(|r| r.confidence.is_confirmed())
            .collect();
        let (confidence, range, source) = if confirmed.is_empty() {
            pick(&failing)
        } else {
            pick(&confirmed)
        };
        Support::Unsupported {
            confidence,
            range,
            source,
        }
    }
}

/// The CNI or an add-on against the target Kubernetes (and the current one when the
/// component itself moves, since it may roll out before Kubernetes does).
fn component_item(
    bump: &Bump,
    p: &Policies,
    id: String,
    title: String,
    c: &Component,
    is_cni: bool,
) -> CheckItem {
    let (k0, k1) = (&bump.base.spec.kubernetes, &bump.head.spec.kubernetes);
    let kid = if is_cni {
        ComponentId::Cni(c.name.clone())
    } else {
        ComponentId::Addon(c.name.clone())
    };
    let moved = bump.change(&kid).is_some();
    let mut targets = vec![k1.minor_version()];
    if moved && k0.minor_version() != k1.minor_version() && k0 < k1 {
        targets.insert(0, k0.minor_version());
    }
    let kind = if is_cni { "CNI" } else { "add-on" };
    if !p.knows_component(&c.name) {
        return CheckItem::new(
            id,
            title,
            Status::Warn,
            format!(
                "unknown {kind} `{}`: no compatibility data, so ichor cannot vouch for it",
                c.name
            ),
        )
        .hint(format!(
            "add `compatibility:` rows for `{}` under policies/ in the repository",
            c.name
        ));
    }
    let mut supported_msgs = Vec::new();
    let mut status = Status::Pass;
    let mut sources = Vec::new();
    for k in targets {
        match support(p, &c.name, &c.version, k) {
            Support::NoData => {
                return CheckItem::new(
                    id,
                    title,
                    Status::Warn,
                    format!("no compatibility data for {} {}", c.name, c.version),
                )
                .hint(format!(
                    "add a `compatibility:` row for {} {} under policies/ in the repository",
                    c.name,
                    c.version.minor_version()
                ));
            }
            Support::Supported {
                confidence,
                range,
                source,
            } => {
                status = status.max(graded(confidence, false));
                supported_msgs.push(format!(
                    "{} {} supports Kubernetes {k} ({range}){}",
                    c.name,
                    c.version,
                    unconfirmed_note(confidence)
                ));
                sources.push(source);
            }
            Support::Unsupported {
                confidence,
                range,
                source,
            } => {
                let lowest = p.lowest_supporting(&c.name, k);
                let message = if k == k1.minor_version() && k1 != k0 {
                    match &lowest {
                        Some(req) => format!("Kubernetes {k} is blocked on {} {req} (release set has {})", c.name, c.version),
                        None => format!("Kubernetes {k} is blocked on {}: no known version supports it (release set has {})", c.name, c.version),
                    }
                } else {
                    format!(
                        "{} {} supports Kubernetes {range}, and the cluster runs {k}",
                        c.name, c.version
                    )
                };
                let hint = match lowest {
                    Some(req) => format!("bump {} to {req} first (a version that supports Kubernetes {k})", c.name),
                    None => format!("wait for a {} release that supports Kubernetes {k}, or add a row under policies/ if you have tested one", c.name),
                };
                return CheckItem::new(
                    id,
                    title,
                    graded(confidence, true),
                    format!("{message}{}", unconfirmed_note(confidence)),
                )
                .hint(hint)
                .source(source);
            }
        }
    }
    let mut item = CheckItem::new(id, title, status, supported_msgs.join("; "));
    sources.dedup();
    if !sources.is_empty() {
        item = item.source(sources.join("; "));
    }
    if status == Status::Warn {
        item = item.hint("confirm the support range upstream, then mark the row `confidence: upstream` under policies/");
    }
    item
}

pub fn cni(bump: &Bump, p: &Policies) -> CheckItem {
    let (b, h) = (&bump.base.spec.cni, &bump.head.spec.cni);
    if b.name != h.name {
        return CheckItem::new(
            "cni",
            "CNI supports Kubernetes",
            Status::Fail,
            format!("the CNI changes from {} to {}: a CNI migration is not an upgrade ichor can gate or roll", b.name, h.name),
        )
        .hint(format!("keep spec.cni.name `{}` and migrate the CNI by hand", b.name));
    }
    component_item(
        bump,
        p,
        "cni".into(),
        format!("CNI {} supports Kubernetes", h.name),
        h,
        true,
    )
}

pub fn addon_item(bump: &Bump, p: &Policies, addon: &Component) -> CheckItem {
    component_item(
        bump,
        p,
        format!("addon/{}", addon.name),
        format!("{} supports Kubernetes", addon.name),
        addon,
        false,
    )
}

/// Every blocker that applies to the target, or one passing item when none does.
pub fn blockers(bump: &Bump, p: &Policies) -> Vec<CheckItem> {
    let head = &bump.head.spec;
    let find = |name: &str| -> Option<&Version> {
        if head.cni.name == name {
            Some(&head.cni.version)
        } else {
            head.addons
                .iter()
                .find(|a| a.name == name)
                .map(|a| &a.version)
        }
    };
    let mut items = Vec::new();
    for b in &p.blockers {
        if b.kubernetes
            .as_ref()
            .is_some_and(|m| !m.matches(&head.kubernetes))
            || b.talos.as_ref().is_some_and(|m| !m.matches(&head.talos))
        {
            continue;
        }
        if let Some(name) = &b.component {
            match find(name) {
                Some(v) if b.version.as_ref().is_none_or(|m| m.matches(v)) => {}
                _ => continue,
            }
        }
        let unmet: Vec<String> = b
            .requires
            .iter()
            .filter_map(|r| match find(&r.component) {
                Some(v) if !r.version.matches(v) => Some(format!(
                    "{} {} (release set has {v})",
                    r.component, r.version
                )),
                _ => None,
            })
            .collect();
        if !b.requires.is_empty() && unmet.is_empty() {
            continue;
        }
        let target = match (&b.kubernetes, &b.talos) {
            (Some(_), _) => format!("Kubernetes {}", head.kubernetes.minor_version()),
            (None, Some(_)) => format!("Talos {}", head.talos.minor_version()),
            _ => "this release set".to_string(),
        };
        let (message, hint) = if unmet.is_empty() {
            (b.message.clone(), format!("remove {} from the release set, or disable blocker `{}` under policies/ once it no longer applies", b.component.as_deref().unwrap_or("the component"), b.id))
        } else {
            (
                format!(
                    "{target} is blocked on {}: {}",
                    unmet.join(" and "),
                    b.message
                ),
                format!("bump {} first", unmet.join(" and ")),
            )
        };
        items.push(
            CheckItem::new(
                format!("blocker/{}", b.id),
                format!("Known blocker {}", b.id),
                graded(b.confidence, true),
                message,
            )
            .hint(hint)
            .source(&b.source),
        );
    }
    if items.is_empty() {
        items.push(CheckItem::new(
            "blockers",
            "No known blocker applies",
            Status::Pass,
            format!("no known blocker applies ({} checked)", p.blockers.len()),
        ));
    }
    items
}

/// Each node's running Talos can take the target: at most one minor behind and not older
/// than the installer's minimum host version.
pub fn nodes_talos(bump: &Bump, p: &Policies, nodes: &[Node]) -> CheckItem {
    let id = "nodes-talos";
    let title = "Every node can take the Talos upgrade";
    let target = &bump.head.spec.talos;
    let row = p.talos_row(target.minor_version());
    // Nodes at the base release set's version are judged by `talos-step`; this item is
    // about the nodes that run something else (left behind, or upgraded by hand).
    let base = &bump.base.spec.talos;
    let mut bad = Vec::new();
    let mut ahead = Vec::new();
    for n in nodes.iter().filter(|n| &n.talos != base) {
        if &n.talos > target {
            ahead.push(format!("{} runs {}", n.name, n.talos));
            continue;
        }
        if &n.talos == target {
            continue;
        }
        let step = n.talos.minor_version().minors_to(target.minor_version());
        let too_far = step.is_none_or(|s| s.unsigned_abs() > p.skew.talos_max_minor_step);
        let too_old = row
            .and_then(|r| r.upgrade_from.as_ref())
            .is_some_and(|min| talos_release(&n.talos) < talos_release(min));
        if too_far || too_old {
            bad.push(format!("{} runs {}", n.name, n.talos));
        }
    }
    if !ahead.is_empty() {
        return CheckItem::new(
            id,
            title,
            Status::Fail,
            format!(
                "Talos {target} would move nodes backwards: {}",
                ahead.join(", ")
            ),
        )
        .hint(format!(
            "ichor only rolls forward; target at least the newest Talos a node runs (not {target})"
        ))
        .source("inventory");
    }
    let others: Vec<String> = nodes
        .iter()
        .filter(|n| &n.talos != base)
        .map(|n| format!("{} ({})", n.name, n.talos))
        .collect();
    if bad.is_empty() {
        let msg = if others.is_empty() {
            format!(
                "all {} nodes run the release set's Talos {base}",
                nodes.len()
            )
        } else {
            format!(
                "{} node(s) run another Talos than the release set: {}; each can take {target}",
                others.len(),
                others.join(", ")
            )
        };
        CheckItem::new(id, title, Status::Pass, msg).source("inventory")
    } else {
        CheckItem::new(
            id,
            title,
            Status::Fail,
            format!(
                "cannot upgrade to Talos {target} directly: {}",
                bad.join(", ")
            ),
        )
        .hint(format!(
            "bring these nodes to the latest Talos {} patch first",
            target
                .minor_version()
                .prev()
                .map(|m| m.to_string())
                .unwrap_or_default()
        ))
        .source("inventory")
    }
}

/// Talos compares host versions on major.minor.patch only (its `talos_version_test.go`): a
/// `1.12.0-beta.0` host counts as 1.12.0 for the installer's upgrade-from rule.
pub fn talos_release(v: &Version) -> (u64, u64, u64) {
    (v.major(), v.minor(), v.patch())
}

/// Before the apiserver moves, every kubelet must be recent enough; and no kubelet may be
/// newer than the apiserver it talks to.
pub fn kubelet_skew(bump: &Bump, p: &Policies, nodes: &[Node]) -> CheckItem {
    let id = "kubelet-skew";
    let title = "Kubelet versions are within the skew policy";
    let target = bump.head.spec.kubernetes.minor_version();
    let max_older = p.skew.kubelet_max_older_before_upgrade;
    let oldest_ok = MinorVersion::new(target.major, target.minor.saturating_sub(max_older));
    // Kubelets at the base release set's version are judged by the static items
    // (`kubernetes-step`, `no-downgrade`); this item is about the ones that differ.
    let base = &bump.base.spec.kubernetes;
    let mut too_old = Vec::new();
    let mut too_new = Vec::new();
    for n in nodes.iter().filter(|n| &n.kubelet != base) {
        let k = n.kubelet.minor_version();
        if k < oldest_ok {
            too_old.push(format!("{} ({}, {})", n.name, n.kubelet, n.role));
        }
        if !p.skew.kubelet_newer_allowed && n.kubelet > bump.head.spec.kubernetes {
            too_new.push(format!("{} ({})", n.name, n.kubelet));
        }
    }
    if !too_new.is_empty() {
        return CheckItem::new(
            id,
            title,
            Status::Fail,
            format!(
                "kubelets newer than the target apiserver {}: {}",
                bump.head.spec.kubernetes,
                too_new.join(", ")
            ),
        )
        .hint("a kubelet is never newer than an apiserver; target at least the newest kubelet")
        .source(&p.skew.source);
    }
    if !too_old.is_empty() {
        return CheckItem::new(
            id,
            title,
            Status::Fail,
            format!(
                "kubelets older than {oldest_ok} cannot stay behind an apiserver at {target}: {}",
                too_old.join(", ")
            ),
        )
        .hint(format!(
            "upgrade those kubelets to {oldest_ok} or later first"
        ))
        .source(&p.skew.source);
    }
    let others: Vec<String> = nodes
        .iter()
        .filter(|n| &n.kubelet != base)
        .map(|n| format!("{} ({})", n.name, n.kubelet))
        .collect();
    let msg = if others.is_empty() {
        format!(
            "all {} kubelets run the release set's Kubernetes {base}",
            nodes.len()
        )
    } else {
        format!(
            "{} kubelet(s) differ from the release set: {}; all within {max_older} minors of {target} and none newer",
            others.len(),
            others.join(", ")
        )
    };
    CheckItem::new(id, title, Status::Pass, msg).source(&p.skew.source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::releaseset::{ReleaseSet, Role};

    /// A release set from a compact spec: talos, kubernetes, cni "name@version", add-ons.
    fn rs(talos: &str, k8s: &str, cni: &str, addons: &[&str]) -> ReleaseSet {
        let comp = |s: &str| {
            let (n, v) = s.split_once('@').unwrap();
            format!("{{name: {n}, version: {v}}}")
        };
        let addons: Vec<String> = addons
            .iter()
            .map(|a| format!("    - {}\n", comp(a)))
            .collect();
        let text = format!(
            "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: t}}\nspec:\n  talos: {talos}\n  kubernetes: {k8s}\n  cni: {}\n  addons:\n{}",
            comp(cni),
            addons.concat()
        );
        ReleaseSet::parse(
            "t",
            &text.replace("  addons:\n\n", "").trim_end().replace(
                "  addons:",
                if addons.is_empty() {
                    "  addons: []"
                } else {
                    "  addons:"
                },
            ),
        )
        .unwrap()
    }

    fn bump(base: ReleaseSet, head: ReleaseSet) -> Bump {
        Bump::between(&base, &head)
    }

    fn p() -> Policies {
        Policies::shipped().unwrap()
    }

    const BASE: (&str, &str, &str) = ("v1.12.6", "v1.33.5", "cilium@1.18.3");

    fn from_base(talos: &str, k8s: &str, cni: &str) -> Bump {
        bump(
            rs(BASE.0, BASE.1, BASE.2, &["cert-manager@v1.20.2"]),
            rs(talos, k8s, cni, &["cert-manager@v1.20.2"]),
        )
    }

    #[test]
    fn no_downgrade_passes_and_fails() {
        assert_eq!(
            no_downgrade(&from_base("v1.12.6", "v1.33.7", "cilium@1.18.3")).status,
            Status::Pass
        );
        let item = no_downgrade(&from_base("v1.12.6", "v1.33.4", "cilium@1.18.3"));
        assert_eq!(item.status, Status::Fail);
        assert!(
            item.message.contains("v1.33.5 → v1.33.4"),
            "{}",
            item.message
        );
        assert!(item.hint.is_some());
    }

    #[test]
    fn kubernetes_step_passes_one_minor_and_fails_a_skip() {
        assert_eq!(
            kubernetes_step(&from_base("v1.12.6", "v1.34.2", "cilium@1.18.3"), &p()).status,
            Status::Pass
        );
        let item = kubernetes_step(&from_base("v1.12.6", "v1.35.0", "cilium@1.18.3"), &p());
        assert_eq!(item.status, Status::Fail);
        assert!(item.message.contains("skips 1.34"), "{}", item.message);
        assert_eq!(
            item.hint.as_deref(),
            Some("upgrade to the latest Kubernetes 1.34 patch first, then to 1.35")
        );
        assert_eq!(
            kubernetes_step(&from_base("v1.12.6", "v2.0.0", "cilium@1.18.3"), &p()).status,
            Status::Fail
        );
    }

    #[test]
    fn talos_step_passes_one_minor_and_fails_a_skip_or_an_unknown_target() {
        assert_eq!(
            talos_step(&from_base("v1.13.9", "v1.33.5", "cilium@1.18.3"), &p()).status,
            Status::Pass
        );
        let item = talos_step(&from_base("v1.14.2", "v1.33.5", "cilium@1.18.3"), &p());
        assert_eq!(item.status, Status::Fail);
        assert!(item.message.contains("skips 1.13"), "{}", item.message);
        assert_eq!(
            talos_step(&from_base("v1.12.9", "v1.33.5", "cilium@1.18.3"), &p()).status,
            Status::Pass
        );
        // A policy that allows two minors still refuses hosts older than the installer's minimum.
        let mut relaxed = p();
        relaxed.skew.talos_max_minor_step = 3;
        let b = bump(
            rs("v1.9.5", "v1.30.1", "cilium@1.18.3", &[]),
            rs("v1.12.0", "v1.30.1", "cilium@1.18.3", &[]),
        );
        let item = talos_step(&b, &relaxed);
        assert_eq!(item.status, Status::Fail);
        assert!(
            item.message
                .contains("upgrades only hosts at 1.10.0 or later"),
            "{}",
            item.message
        );
        let b = bump(
            rs("v1.15.0", "v1.36.1", "cilium@1.18.3", &[]),
            rs("v1.16.0", "v1.36.1", "cilium@1.18.3", &[]),
        );
        assert_eq!(talos_step(&b, &p()).status, Status::Warn);
    }

    #[test]
    fn pairing_holds_at_every_stage() {
        // Talos first: the target Talos must support the running Kubernetes.
        let b = bump(
            rs("v1.12.4", "v1.30.14", "cilium@1.18.3", &[]),
            rs("v1.13.9", "v1.30.14", "cilium@1.18.3", &[]),
        );
        let item = talos_kubernetes_pairing(&b, &p());
        assert_eq!(item.status, Status::Fail);
        assert!(
            item.message
                .contains("Talos 1.13 supports Kubernetes 1.31–1.36; the cluster runs v1.30.14"),
            "{}",
            item.message
        );
        assert_eq!(
            item.hint.as_deref(),
            Some("upgrade Kubernetes to 1.31 or later on Talos 1.12 first, then bump Talos")
        );
        // And the target Kubernetes.
        let item =
            talos_kubernetes_pairing(&from_base("v1.12.6", "v1.36.0", "cilium@1.18.3"), &p());
        assert_eq!(item.status, Status::Fail);
        assert!(
            item.hint
                .as_deref()
                .unwrap_or("")
                .contains("bump Talos to 1.13 first"),
            "{:?}",
            item.hint
        );
        // Both together, in the right order.
        let item =
            talos_kubernetes_pairing(&from_base("v1.13.9", "v1.34.1", "cilium@1.18.3"), &p());
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        assert!(item.message.contains("1.33 and 1.34"), "{}", item.message);
        // Unknown Talos: warn, never pass silently.
        assert_eq!(
            talos_kubernetes_pairing(&from_base("v1.16.0", "v1.33.5", "cilium@1.18.3"), &p())
                .status,
            Status::Warn
        );
        // Unconfirmed row (Talos 1.15): its failure is a warning.
        let b = bump(
            rs("v1.14.1", "v1.32.3", "cilium@1.18.3", &[]),
            rs("v1.15.0", "v1.32.3", "cilium@1.18.3", &[]),
        );
        assert_eq!(talos_kubernetes_pairing(&b, &p()).status, Status::Warn);
    }

    #[test]
    fn cni_blocks_with_the_version_needed() {
        let item = cni(&from_base("v1.12.6", "v1.34.2", "cilium@1.18.3"), &p());
        assert_eq!(item.status, Status::Fail);
        assert_eq!(
            item.message,
            "Kubernetes 1.34 is blocked on cilium >= 1.19 (release set has 1.18.3)"
        );
        assert_eq!(
            item.hint.as_deref(),
            Some("bump cilium to >= 1.19 first (a version that supports Kubernetes 1.34)")
        );
        assert_eq!(
            cni(&from_base("v1.12.6", "v1.33.7", "cilium@1.18.3"), &p()).status,
            Status::Pass
        );
        // A CNI bump must also support the Kubernetes still running while it rolls out.
        let b = bump(
            rs("v1.12.6", "v1.32.4", "cilium@1.18.3", &[]),
            rs("v1.12.6", "v1.33.1", "cilium@1.20.1", &[]),
        );
        let item = cni(&b, &p());
        assert_eq!(
            item.status,
            Status::Warn,
            "1.20 data is unconfirmed: {}",
            item.message
        );
        // Unconfirmed data that supports: a warning, not a pass.
        let b = bump(
            rs("v1.13.6", "v1.35.1", "cilium@1.20.1", &[]),
            rs("v1.13.6", "v1.36.1", "cilium@1.20.1", &[]),
        );
        assert_eq!(cni(&b, &p()).status, Status::Warn);
        // A CNI swap is refused.
        assert_eq!(
            cni(&from_base("v1.12.6", "v1.33.5", "calico@3.30.2"), &p()).status,
            Status::Fail
        );
        // A CNI without data for that version warns.
        assert_eq!(
            cni(&from_base("v1.12.6", "v1.33.5", "cilium@1.30.0"), &p()).status,
            Status::Warn
        );
    }

    #[test]
    fn addons_pass_fail_and_warn_when_unknown() {
        let ok = addon_item(
            &from_base("v1.12.6", "v1.34.2", "cilium@1.18.3"),
            &p(),
            &rs(
                "v1.12.6",
                "v1.34.2",
                "cilium@1.18.3",
                &["cert-manager@v1.20.2"],
            )
            .spec
            .addons[0],
        );
        assert_eq!(ok.status, Status::Pass, "{}", ok.message);
        let b = bump(
            rs(
                "v1.13.6",
                "v1.35.2",
                "cilium@1.18.3",
                &["cert-manager@v1.20.2"],
            ),
            rs(
                "v1.13.6",
                "v1.36.0",
                "cilium@1.18.3",
                &["cert-manager@v1.20.2"],
            ),
        );
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail);
        assert_eq!(
            item.message,
            "Kubernetes 1.36 is blocked on cert-manager >= 1.21 (release set has v1.20.2)"
        );
        let b = from_base("v1.12.6", "v1.33.5", "cilium@1.18.3");
        let unknown = rs(
            "v1.12.6",
            "v1.33.5",
            "cilium@1.18.3",
            &["external-dns@v0.19.0"],
        );
        let item = addon_item(&b, &p(), &unknown.spec.addons[0]);
        assert_eq!(item.status, Status::Warn);
        assert!(
            item.message.contains("unknown add-on `external-dns`"),
            "{}",
            item.message
        );
        // Longhorn's narrower row for 1.11.3+ intersects with nothing broader: needs 1.34.
        let b = bump(
            rs("v1.12.6", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.10.3"]),
            rs("v1.12.6", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.11.3"]),
        );
        assert_eq!(
            addon_item(&b, &p(), &b.head.spec.addons[0]).status,
            Status::Fail
        );
    }

    #[test]
    fn blockers_apply_by_presence_and_by_requirement() {
        let b = bump(
            rs(
                "v1.13.6",
                "v1.35.2",
                "cilium@1.19.6",
                &["ingress-nginx@v1.15.1"],
            ),
            rs(
                "v1.13.6",
                "v1.36.0",
                "cilium@1.19.6",
                &["ingress-nginx@v1.15.1"],
            ),
        );
        let items = blockers(&b, &p());
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].id, "blocker/ingress-nginx-retired");
        assert_eq!(items[0].status, Status::Fail);
        let b = bump(
            rs(
                "v1.13.6",
                "v1.35.2",
                "cilium@1.19.6",
                &["ingress-nginx@v1.15.1"],
            ),
            rs(
                "v1.13.6",
                "v1.35.3",
                "cilium@1.19.6",
                &["ingress-nginx@v1.15.1"],
            ),
        );
        assert_eq!(blockers(&b, &p())[0].status, Status::Pass);

        // The operator's own rule: "core 1.37 is blocked on CNI >= 1.19 and operator >= 2.4".
        let repo = vec![(
            "policies/gate.yaml".to_string(),
            "blockers:\n  - id: core-1.37\n    kubernetes: \">=1.37\"\n    requires:\n      - {component: cilium, version: \">=1.19\"}\n      - {component: my-operator, version: \">=2.4\"}\n    message: core 1.37 needs the new CNI and operator\n    source: platform team\n".to_string(),
        )];
        let policies = Policies::load(&repo).unwrap();
        let b = bump(
            rs(
                "v1.14.2",
                "v1.36.3",
                "cilium@1.18.3",
                &["my-operator@2.3.0"],
            ),
            rs(
                "v1.14.2",
                "v1.37.0",
                "cilium@1.18.3",
                &["my-operator@2.3.0"],
            ),
        );
        let items = blockers(&b, &policies);
        assert_eq!(items[0].status, Status::Fail);
        assert!(items[0].message.starts_with("Kubernetes 1.37 is blocked on cilium >=1.19 (release set has 1.18.3) and my-operator >=2.4 (release set has 2.3.0)"), "{}", items[0].message);
        let b = bump(
            rs(
                "v1.14.2",
                "v1.36.3",
                "cilium@1.19.1",
                &["my-operator@2.4.0"],
            ),
            rs(
                "v1.14.2",
                "v1.37.0",
                "cilium@1.19.1",
                &["my-operator@2.4.0"],
            ),
        );
        assert_eq!(blockers(&b, &policies)[0].id, "blockers");
    }

    fn node(name: &str, role: Role, talos: &str, kubelet: &str) -> Node {
        Node {
            name: name.into(),
            role,
            talos: Version::parse(talos).unwrap(),
            kubelet: Version::parse(kubelet).unwrap(),
            volumes: vec![],
        }
    }

    #[test]
    fn node_items_find_nodes_left_behind() {
        let b = from_base("v1.13.9", "v1.33.5", "cilium@1.18.3");
        let good = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5"),
            node("w-1", Role::Worker, "v1.12.6", "v1.33.5"),
        ];
        assert_eq!(nodes_talos(&b, &p(), &good).status, Status::Pass);
        let behind = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5"),
            node("w-1", Role::Worker, "v1.11.2", "v1.33.5"),
        ];
        let item = nodes_talos(&b, &p(), &behind);
        assert_eq!(item.status, Status::Fail);
        assert!(
            item.message.contains("w-1 runs v1.11.2"),
            "{}",
            item.message
        );

        let b = from_base("v1.12.6", "v1.34.1", "cilium@1.19.1");
        assert_eq!(kubelet_skew(&b, &p(), &good).status, Status::Pass);
        let old = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5"),
            node("w-1", Role::Worker, "v1.12.6", "v1.31.2"),
        ];
        let item = kubelet_skew(&b, &p(), &old);
        assert_eq!(item.status, Status::Fail);
        assert!(item.message.contains("w-1"), "{}", item.message);
        // Nodes at the base versions are left to talos-step and no-downgrade (no duplicates).
        let skip = from_base("v1.14.2", "v1.33.4", "cilium@1.18.3");
        assert_eq!(nodes_talos(&skip, &p(), &good).status, Status::Pass);
        assert_eq!(kubelet_skew(&skip, &p(), &good).status, Status::Pass);
        let newer = vec![node("w-1", Role::Worker, "v1.12.6", "v1.35.0")];
        assert!(kubelet_skew(&b, &p(), &newer)
            .message
            .contains("newer than the target apiserver"));
    }

    #[test]
    fn a_node_ahead_of_the_target_fails() {
        // The release set moves to v1.12.9, but a node already runs v1.13.0.
        let b = from_base("v1.12.9", "v1.33.5", "cilium@1.18.3");
        let nodes = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5"),
            node("w-1", Role::Worker, "v1.13.0", "v1.33.5"),
        ];
        let item = nodes_talos(&b, &p(), &nodes);
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert!(item.message.contains("backwards"), "{}", item.message);
        assert!(
            item.message.contains("w-1 runs v1.13.0"),
            "{}",
            item.message
        );
    }

    #[test]
    fn a_prerelease_host_counts_as_its_release_for_upgrade_from() {
        let v = |s: &str| Version::parse(s).unwrap();
        assert_eq!(
            talos_release(&v("1.12.0-beta.0")),
            talos_release(&v("1.12.0"))
        );
        assert!(talos_release(&v("1.11.9")) < talos_release(&v("1.12.0-alpha.1")));
    }

    #[test]
    fn a_huge_minor_jump_is_judged_without_enumerating_it() {
        let b = from_base("v1.12.6", "v1.999999999.0", "cilium@1.18.3");
        let item = kubernetes_step(&b, &p());
        assert_eq!(item.status, Status::Fail);
        assert!(
            item.message.contains("skips 1.34 through 1.999999998"),
            "{}",
            item.message
        );
        assert!(
            item.message.contains("999999966 minors at once"),
            "{}",
            item.message
        );
    }

    #[test]
    fn evaluate_lists_every_item_once() {
        let b = from_base("v1.12.6", "v1.33.7", "cilium@1.18.3");
        let ids: Vec<String> = evaluate(&b, &p(), None).into_iter().map(|i| i.id).collect();
        assert_eq!(
            ids,
            [
                "no-downgrade",
                "kubernetes-step",
                "talos-step",
                "talos-kubernetes",
                "cni",
                "addon/cert-manager",
                "blockers"
            ]
        );
        assert!(evaluate(&b, &p(), None)
            .iter()
            .all(|i| i.status == Status::Pass));
    }
}
