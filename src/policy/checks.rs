//! The static checklist: everything that can be decided from the two release sets, the
//! compatibility data and (when given) the nodes. One function per item; each returns the
//! item with its status, a message, and a hint when it did not pass.
//!
//! Hints only ever point forward: "bump X to V" names a V newer than the release set's X.
//! When only older versions support a target, the item says no released version supports
//! it yet (a blocker to wait for) instead.

use crate::releaseset::{Bump, ChangeKind, Component, ComponentId, MinorVersion, Node, Version};

use super::data::{
    release_text, Admits, CompatRow, Confidence, Date, Matrix, Policies, VersionMatch,
};
use super::verdict::{CheckItem, Status};

/// Facts beyond the two release sets that some items need. The checks never read a clock
/// or a file themselves: the caller passes what it knows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context<'a> {
    /// Today, for end-of-life warnings; `None` leaves them out.
    pub today: Option<Date>,
    /// `cluster.yaml` `spec.talos.installerImage` (without tag), for upgrade notes about
    /// installer images; `None` when unknown.
    pub installer_image: Option<&'a str>,
    /// `cluster.yaml` `spec.rollout.talosMinorsPerReboot` for a chain's worker hops (0 or
    /// 1: one minor per reboot).
    pub talos_minors_per_reboot: u64,
}

impl<'a> Context<'a> {
    /// A context for a fixed day (tests, replays).
    pub fn at(today: Date) -> Self {
        Context {
            today: Some(today),
            installer_image: None,
            talos_minors_per_reboot: 1,
        }
    }

    /// Today by the system clock: for the gate's entry point only.
    pub fn system(installer_image: Option<&'a str>) -> Self {
        Context {
            today: Some(Date::today_utc()),
            installer_image,
            talos_minors_per_reboot: 1,
        }
    }

    pub fn with_installer_image(self, installer_image: Option<&'a str>) -> Self {
        Context {
            installer_image,
            ..self
        }
    }
}

/// Every static item for `bump`, plus the node items when `nodes` is known. Without a
/// [`Context`]: no end-of-life items and no installer-image notes.
pub fn evaluate(bump: &Bump, policies: &Policies, nodes: Option<&[Node]>) -> Vec<CheckItem> {
    evaluate_with(bump, policies, nodes, &Context::default())
}

/// [`evaluate`] with the facts of `ctx` (today, the installer image).
pub fn evaluate_with(
    bump: &Bump,
    policies: &Policies,
    nodes: Option<&[Node]>,
    ctx: &Context,
) -> Vec<CheckItem> {
    // A change that skips minors is judged as the chain of hops it needs (its path and
    // every intermediate state); the live node items look at the chain's first step.
    let chain = super::chain::needed(bump);
    let first_step = chain
        .then(|| super::chain::path_for(bump, policies, ctx.talos_minors_per_reboot).ok())
        .flatten()
        .map(|path| super::chain::first_step(bump, &path));
    let mut items = vec![no_downgrade(bump)];
    if chain {
        items.extend(super::chain::items(bump, policies, ctx));
    } else {
        items.push(kubernetes_step(bump, policies));
        items.push(talos_step(bump, policies));
        items.push(talos_kubernetes_pairing(bump, policies));
    }
    items.push(cni(bump, policies));
    for addon in &bump.head.spec.addons {
        items.push(addon_item(bump, policies, addon));
    }
    items.extend(blockers(bump, policies));
    items.extend(talos_notes(bump, policies, ctx.installer_image));
    if let Some(today) = ctx.today {
        items.extend(end_of_life(bump, policies, today));
    }
    if let Some(nodes) = nodes {
        let step = first_step.as_ref().unwrap_or(bump);
        items.push(nodes_talos(step, policies, nodes));
        items.push(kubelet_skew(step, policies, nodes));
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

/// Appended to a hint that points at a version whose support is only unconfirmed.
fn unconfirmed_target(confidence: Confidence) -> &'static str {
    if confidence.is_confirmed() {
        ""
    } else {
        "; that version's data is unconfirmed"
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
        // Only a newer Talos can be the fix: rows for older minors never count.
        let needed = p
            .talos
            .iter()
            .filter(|r| r.kubernetes.contains(k1.minor_version()) && r.version > t1.minor_version())
            .min_by_key(|r| r.version);
        let hint = if k1.minor_version() < range.min {
            format!(
                "Talos {} runs Kubernetes {} or later: target Kubernetes {} or later",
                row.version, range.min, range.min
            )
        } else {
            match needed {
                Some(r) => format!(
                    "bump Talos to {} first (or in the same change: Talos moves before Kubernetes){}",
                    r.version,
                    unconfirmed_target(r.confidence)
                ),
                None => format!(
                    "no released Talos supports Kubernetes {} yet: wait for one",
                    k1.minor_version()
                ),
            }
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
        /// Why the first (confirmed, where any is) failing row refuses `k8s`.
        reason: Admits,
        /// That row's lowest Kubernetes minor.
        min: MinorVersion,
    },
}

fn support(p: &Policies, component: &str, version: &Version, k8s: &Version) -> Support {
    let rows: Vec<&CompatRow> = p.rows_for(component, version).collect();
    if rows.is_empty() {
        return Support::NoData;
    }
    let summary = |rs: &[&CompatRow]| {
        let confidence = rs.iter().map(|r| r.confidence).max().unwrap_or_default();
        let range = rs
            .iter()
            .map(|r| r.range_text())
            .collect::<Vec<_>>()
            .join(" and ");
        let source = rs
            .iter()
            .map(|r| r.source.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        (confidence, range, source)
    };
    // Every matching row must admit the version (a general and a narrower row intersect).
    let failing: Vec<&CompatRow> = rows
        .iter()
        .copied()
        .filter(|r| r.admits(k8s) != Admits::Yes)
        .collect();
    if failing.is_empty() {
        let (confidence, range, source) = summary(&rows);
        return Support::Supported {
            confidence,
            range,
            source,
        };
    }
    // A confirmed failing row outweighs unconfirmed ones.
    let confirmed: Vec<&CompatRow> = failing
        .iter()
        .copied()
        .filter(|r| r.confidence.is_confirmed())
        .collect();
    let chosen = if confirmed.is_empty() {
        failing
    } else {
        confirmed
    };
    let (confidence, range, source) = summary(&chosen);
    let first = chosen[0];
    Support::Unsupported {
        confidence,
        range,
        source,
        reason: first.admits(k8s),
        min: first.kubernetes.min,
    }
}

/// "the rows cover longhorn 1.10.0 to 1.13", for a version the rows do not know.
fn coverage(p: &Policies, component: &str) -> Option<String> {
    let rows: Vec<&CompatRow> = p
        .compatibility
        .iter()
        .filter(|r| r.component == component && r.version != VersionMatch::Any)
        .collect();
    let text = |r: &CompatRow| match &r.version {
        VersionMatch::Minor(m) => m.to_string(),
        other => release_text(other.interval().0),
    };
    let (first, last) = (rows.first()?, rows.last()?);
    Some(if rows.len() == 1 {
        format!("ichor's rows cover {component} {} only", first.version)
    } else {
        format!(
            "ichor's rows cover {component} {} to {}",
            text(first),
            text(last)
        )
    })
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
    let change = bump.change(&kid);
    let moved = change.is_some();
    let mut targets = vec![k1];
    if moved && k0.minor_version() != k1.minor_version() && k0 < k1 {
        targets.insert(0, k0);
    }
    let kind = if is_cni { "CNI" } else { "add-on" };
    let info = p.component_info(&c.name);
    if !p.knows_component(&c.name) {
        let Some(info) = info else {
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
        };
        let check = match info.matrix {
            Matrix::None => format!("check the {} release notes", c.name),
            Matrix::Unverified | Matrix::Policy => {
                format!("check what upstream says ({})", info.source)
            }
        };
        return CheckItem::new(
            id,
            title,
            Status::Warn,
            format!(
                "unknown {kind} `{}`: {}, so ichor cannot vouch for it",
                c.name,
                info.describe()
            ),
        )
        .hint(format!(
            "{check} for Kubernetes {}; once tested, add `compatibility:` rows for `{}` under policies/ in the repository",
            k1.minor_version(),
            c.name
        ))
        .source(&info.source);
    }
    let mut supported_msgs = Vec::new();
    let mut status = Status::Pass;
    let mut sources = Vec::new();
    for k in targets {
        let km = k.minor_version();
        match support(p, &c.name, &c.version, k) {
            Support::NoData => {
                let mut message = format!("no compatibility data for {} {}", c.name, c.version);
                if let Some(cover) = coverage(p, &c.name) {
                    message.push_str(&format!(" ({cover})"));
                }
                if let Some(info) = info {
                    message.push_str(&format!("; {}", info.describe()));
                }
                return CheckItem::new(id, title, Status::Warn, message).hint(format!(
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
                    "{} {} supports Kubernetes {km} ({range}){}",
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
                reason,
                min,
            } => {
                let is_target = k == k1 && k1 != k0;
                let (message, hint) = match reason {
                    Admits::BelowPatch(floor) => (
                        if is_target {
                            format!("Kubernetes {k} is blocked on {}: {} {} supports Kubernetes {km} only from {} ({range})", c.name, c.name, c.version, floor.normalized())
                        } else {
                            format!("{} {} supports Kubernetes {km} only from {} ({range}), and the cluster runs {k}", c.name, c.version, floor.normalized())
                        },
                        format!(
                            "upgrade Kubernetes to {} or later (the first {km} patch {} supports)",
                            floor.normalized(),
                            c.name
                        ),
                    ),
                    _ => unsupported_text(
                        p,
                        c,
                        change.and_then(|ch| ch.from.as_ref()),
                        k,
                        is_target,
                        &range,
                        min,
                    ),
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

/// Message and hint for a component version whose Kubernetes range misses `k`. The hint
/// names a newer version that supports `k` when the rows know one, and never an older one.
fn unsupported_text(
    p: &Policies,
    c: &Component,
    base_version: Option<&Version>,
    k: &Version,
    is_target: bool,
    range: &str,
    min: MinorVersion,
) -> (String, String) {
    let (name, v, km) = (&c.name, &c.version, k.minor_version());
    if let Some(s) = p.lowest_supporting(name, k, v) {
        let message = if is_target {
            format!(
                "Kubernetes {km} is blocked on {name} >= {} (release set has {v})",
                s.version
            )
        } else {
            format!("{name} {v} supports Kubernetes {range}, and the cluster runs {k}")
        };
        let hint = format!(
            "bump {name} to >= {} first (a version that supports Kubernetes {km}){}",
            s.version,
            unconfirmed_target(s.confidence)
        );
        return (message, hint);
    }
    if km < min {
        // The version is too new for `k`; older versions may support it, but pointing there
        // would be a downgrade.
        let message = if is_target {
            format!("Kubernetes {km} is blocked on {name}: {name} {v} needs Kubernetes {min} or later ({range}), and no newer {name} that ichor knows supports {km}")
        } else {
            format!(
                "{name} {v} needs Kubernetes {min} or later ({range}), and the cluster runs {k}"
            )
        };
        let hint = match base_version.filter(|b| *b < v) {
            Some(b) => format!("keep {name} at {b} until Kubernetes reaches {min}, then bump it"),
            None => format!("no newer {name} supports Kubernetes {km}: move Kubernetes to {min} or later first, or add a row under policies/ if you have tested one"),
        };
        return (message, hint);
    }
    let message = if is_target {
        format!("Kubernetes {km} is blocked on {name}: no released version supports it yet (release set has {v}; {name} {v} supports {range})")
    } else {
        format!("{name} {v} supports Kubernetes {range}, and the cluster runs {k}")
    };
    let hint = format!("no released {name} supports Kubernetes {km} yet: wait for one, or add a row under policies/ if you have tested one");
    (message, hint)
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
        let mut present = None;
        if let Some(name) = &b.component {
            match find(name) {
                Some(v) if b.version.as_ref().is_none_or(|m| m.matches(v)) => {
                    present = Some((name, v))
                }
                _ => continue,
            }
        }
        let unmet: Vec<(&str, &VersionMatch, &Version)> = b
            .requires
            .iter()
            .filter_map(|r| match find(&r.component) {
                Some(v) if !r.version.matches(v) => Some((r.component.as_str(), &r.version, v)),
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
        let disable = format!(
            "disable blocker `{}` under policies/ once it no longer applies",
            b.id
        );
        let (message, mut hint) = if unmet.is_empty() {
            // Blocked by presence: moving past the matched versions, or removing the
            // component, lifts it.
            let hint = match (present, &b.version) {
                (Some((name, v)), Some(m)) => match m.first_release_after(v) {
                    Some(r) => format!("bump {name} to {} or later first (the blocker covers {name} {m}), or remove it from the release set", release_text(r)),
                    None => format!("remove {name} from the release set, or {disable}"),
                },
                (Some((name, _)), None) => {
                    format!("remove {name} from the release set, or {disable}")
                }
                _ => disable.clone(),
            };
            (b.message.clone(), hint)
        } else {
            let listed: Vec<String> = unmet
                .iter()
                .map(|(c, m, v)| format!("{c} {m} (release set has {v})"))
                .collect();
            let forward: Vec<String> = unmet
                .iter()
                .filter(|(_, m, v)| m.lowest_above(v).is_some())
                .map(|(c, m, _)| format!("{c} to {m}"))
                .collect();
            let stuck: Vec<String> = unmet
                .iter()
                .filter(|(_, m, v)| m.lowest_above(v).is_none())
                .map(|(c, m, v)| format!("{c} {v} is past `{m}` and no newer {c} meets it"))
                .collect();
            let mut parts = Vec::new();
            if !forward.is_empty() {
                parts.push(format!("bump {} first", forward.join(" and ")));
            }
            if !stuck.is_empty() {
                parts.push(format!(
                    "{}: the blocker holds until its rule changes; {disable}",
                    stuck.join(" and ")
                ));
            }
            (
                format!(
                    "{target} is blocked on {}: {}",
                    listed.join(" and "),
                    b.message
                ),
                parts.join("; "),
            )
        };
        if let Some(extra) = &b.hint {
            hint = format!("{hint}; {extra}");
        }
        items.push(
            CheckItem::new(
                format!("blocker/{}", b.id),
                format!("Known blocker {}", b.id),
                graded(b.confidence, true),
                format!("{message}{}", unconfirmed_note(b.confidence)),
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

/// Talos upgrade notes the bump meets: release notes that need a human (remove a plugin,
/// set a flag, change the installer image). Always warnings: the static gate cannot see
/// whether the cluster is affected.
pub fn talos_notes(bump: &Bump, p: &Policies, installer_image: Option<&str>) -> Vec<CheckItem> {
    let (t0, t1) = (&bump.base.spec.talos, &bump.head.spec.talos);
    if t1 <= t0 {
        return Vec::new();
    }
    let same_image = |want: &str| {
        installer_image.is_some_and(|have| {
            have.trim_end_matches('/')
                .eq_ignore_ascii_case(want.trim_end_matches('/'))
        })
    };
    p.talos_notes
        .iter()
        .filter(|n| {
            n.crosses.as_ref().is_none_or(|x| {
                talos_release(t0) < talos_release(x) && talos_release(x) <= talos_release(t1)
            }) && n.from.as_ref().is_none_or(|m| m.matches(t0))
                && n.talos.as_ref().is_none_or(|m| m.matches(t1))
                && n.installer_image.as_deref().is_none_or(same_image)
        })
        .map(|n| {
            let hint = n.hint.clone().unwrap_or_else(|| {
                format!("act on the note before merging, then re-run the gate; disable note `{}` under policies/ if it does not concern this cluster", n.id)
            });
            CheckItem::new(
                format!("talos-note/{}", n.id),
                format!("Talos upgrade note {}", n.id),
                Status::Warn,
                format!("Talos {t0} → {t1}: {}", n.message),
            )
            .hint(hint)
            .source(&n.source)
        })
        .collect()
}

/// A warning for each component of the head release set that is past end of life on
/// `today`: whether the change lands on it or the release set stays on it.
pub fn end_of_life(bump: &Bump, p: &Policies, today: Date) -> Vec<CheckItem> {
    let head = &bump.head.spec;
    let mut parts: Vec<(ComponentId, &Version)> = vec![
        (ComponentId::Talos, &head.talos),
        (ComponentId::Kubernetes, &head.kubernetes),
        (ComponentId::Cni(head.cni.name.clone()), &head.cni.version),
    ];
    parts.extend(
        head.addons
            .iter()
            .map(|a| (ComponentId::Addon(a.name.clone()), &a.version)),
    );
    let mut items = Vec::new();
    for (id, v) in parts {
        let name = id.name();
        let Some(row) = p.end_of_life_for(name, v, today) else {
            continue;
        };
        let lands = bump.change(&id).is_some_and(|c| c.to.as_ref() == Some(v));
        let how = if lands {
            "this change moves to it"
        } else {
            "the release set stays on it"
        };
        let note = row
            .note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let hint = match eol_successor(p, name, v, today, &head.kubernetes) {
            Some(s) => format!(
                "bump {id} to >= {s} (the lowest newer release ichor knows that is still supported)"
            ),
            None => format!(
                "no newer {id} release that ichor knows is still supported: check upstream for a successor"
            ),
        };
        items.push(
            CheckItem::new(
                format!("eol/{name}"),
                format!("{id} is supported upstream"),
                Status::Warn,
                format!(
                    "{id} {v} reached end of life on {}{note}: upstream no longer fixes it, and {how}",
                    row.date
                ),
            )
            .hint(hint)
            .source(&row.source),
        );
    }
    items
}

/// The lowest release of `name` newer than `v` that is not past end of life on `today` and
/// (where rows exist) supports Kubernetes `k8s`.
fn eol_successor(
    p: &Policies,
    name: &str,
    v: &Version,
    today: Date,
    k8s: &Version,
) -> Option<String> {
    let mut candidates = p.versions_above(name, v);
    if name == "talos" {
        candidates.extend(
            p.talos
                .iter()
                .filter(|r| {
                    r.version > v.minor_version() && r.kubernetes.contains(k8s.minor_version())
                })
                .filter_map(|r| {
                    Version::parse(&format!("{}.0", r.version))
                        .ok()
                        .map(|x| (x, r.version.to_string()))
                }),
        );
    }
    for r in p.end_of_life.iter().filter(|r| r.component == name) {
        if let Some(hi) = r.version.first_release_after(v) {
            if let Ok(x) = Version::parse(&release_text(hi)) {
                candidates.push((x, release_text(hi)));
            }
        }
    }
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    candidates
        .into_iter()
        .filter(|(x, _)| x > v)
        .find(|(x, _)| {
            p.end_of_life_for(name, x, today).is_none() && p.supports(name, x, k8s) != Some(false)
        })
        .map(|(_, text)| text)
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
    // Whether any bad node is more than a step behind (else each is only below the
    // installer's minimum host, which a patch of its own minor may fix).
    let mut any_too_far = false;
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
            any_too_far |= too_far;
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
        .hint(nodes_hint(
            target,
            row.and_then(|r| r.upgrade_from.as_ref()),
            any_too_far,
        ))
        .source("inventory")
    }
}

/// Where nodes left behind must go first. Always forward: a node too far behind goes to the
/// minor just below the target (above its own); a node only below the installer's minimum
/// goes to that minimum (above it by definition).
fn nodes_hint(target: &Version, min: Option<&Version>, any_too_far: bool) -> String {
    match (any_too_far, min, target.minor_version().prev()) {
        (false, Some(min), _) => format!("upgrade these nodes to Talos {min} or later first"),
        (_, _, Some(prev)) => format!("bring these nodes to the latest Talos {prev} patch first"),
        (_, _, None) => format!("bring these nodes to a Talos that {target} upgrades from first"),
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
    // ADR 0057 pre-check 1: each kubelet is judged against what its node runs, so a node
    // left behind is refused rather than jumped several minors to the target.
    let mut would_jump = Vec::new();
    let step = p.skew.kubernetes_max_minor_step;
    for n in nodes.iter().filter(|n| &n.kubelet != base) {
        let k = n.kubelet.minor_version();
        if k < oldest_ok {
            too_old.push(format!("{} ({}, {})", n.name, n.kubelet, n.role));
        } else if k.major == target.major && k.minor.saturating_add(step) < target.minor {
            would_jump.push(format!(
                "{} ({}, {} minors)",
                n.name,
                n.kubelet,
                target.minor - k.minor
            ));
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
    if !would_jump.is_empty() {
        return CheckItem::new(
            id,
            title,
            Status::Fail,
            format!(
                "kubelets more than {step} minor behind {target} would jump minors: {}",
                would_jump.join(", ")
            ),
        )
        .hint(format!(
            "move those kubelets one minor at a time up to {}.{} first",
            target.major,
            target.minor.saturating_sub(step)
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

// ---- Talos upgrade traps, judged from what each node runs and how it is configured ----

/// What the gate read from one node for the Talos upgrade traps (`src/gate/live.rs` reads
/// it over the Talos API). Each fact is a value or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrapNode {
    pub name: String,
    pub control_plane: bool,
    /// The Talos the node runs (its Version reply).
    pub talos: Result<Version, String>,
    /// What its active machine configuration says.
    pub config: Result<TrapConfig, String>,
    /// Whether it booted a UKI through systemd-boot; `Ok(None)`: the API does not say.
    pub booted_with_uki: Result<Option<bool>, String>,
    /// A control plane's running etcd (its EtcdStatus); `None` for a worker.
    pub etcd: Option<Result<Version, String>>,
}

/// The parts of a node's machine configuration the traps need.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrapConfig {
    /// The installer image the configuration names, with the path that names it
    /// (`UnattendedInstallConfig.installer.image` or `machine.install.image`).
    pub installer_image: Option<(String, String)>,
    pub extra_kernel_args: Vec<String>,
    /// A GRUB boot builds its kernel command line on the host from `extraKernelArgs`:
    /// `grubUseUKICmdline` false and no `UnattendedInstallConfig`.
    pub grub_builds_cmdline: bool,
    /// `.cluster.etcd.image`, when the configuration pins one.
    pub etcd_image: Option<String>,
    /// The configuration deploys kube-proxy (`cluster.proxy.disabled` is not true, or
    /// `KubeProxyConfig.enabled` is not false).
    pub kube_proxy_enabled: bool,
}

/// ichor upgrades a node through LifecycleService/Upgrade once the node *runs* Talos 1.13 or
/// later, through the legacy MachineService/Upgrade before (src/talos/client.rs `UpgradeApi`;
/// a 1.13 pre-release counts as 1.13).
fn lifecycle_upgrade(running: &Version) -> bool {
    (running.major(), running.minor()) >= (1, 13)
}

const LIFECYCLE_SOURCE: &str = "siderolabs/talos internal/app/lifecycle/lifecycle.go@v1.13.9";

/// The `extraKernelArgs` trap: LifecycleService/Upgrade does not pass
/// `.machine.install.extraKernelArgs` to the installer (lifecycle.go at v1.13.9 builds its
/// options with `WithUpgrade` and `WithForce` only; the legacy sequence adds
/// `WithExtraKernelArgs` from the config), and a GRUB install without `grubUseUKICmdline`
/// builds the kernel command line from those options (cmd/installer/pkg/install/install.go).
/// So a node ichor upgrades through LifecycleService, booted by GRUB, that keeps kernel
/// arguments there reboots without them. `None` when the change does not upgrade Talos to
/// 1.13 or later.
pub fn extra_kernel_args(bump: &Bump, nodes: &[TrapNode]) -> Option<CheckItem> {
    let (t0, t1) = (&bump.base.spec.talos, &bump.head.spec.talos);
    if talos_release(t1) <= talos_release(t0) || !lifecycle_upgrade(t1) {
        return None;
    }
    let (id, title) = (
        "live/extra-kernel-args",
        "Kernel arguments survive the Talos upgrade",
    );
    let (mut grub, mut unknown_loader, mut unjudged, mut legacy) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for n in nodes {
        let running = match &n.talos {
            Ok(v) => v,
            Err(e) => {
                unjudged.push(format!("{} (its Talos version: {})", n.name, excerpt(e)));
                continue;
            }
        };
        // A node already on the target is not upgraded by this change.
        if talos_release(running) >= talos_release(t1) {
            continue;
        }
        let cfg = match &n.config {
            Ok(c) => c,
            Err(e) => {
                unjudged.push(format!(
                    "{} (its machine configuration: {})",
                    n.name,
                    excerpt(e)
                ));
                continue;
            }
        };
        if cfg.extra_kernel_args.is_empty() || !cfg.grub_builds_cmdline {
            continue;
        }
        let args = cfg.extra_kernel_args.join(" ");
        if !lifecycle_upgrade(running) {
            legacy.push(format!("{} (Talos {running})", n.name));
            continue;
        }
        match &n.booted_with_uki {
            // systemd-boot boots the UKI's own command line; extraKernelArgs never applied.
            Ok(Some(true)) => {}
            Ok(Some(false)) => grub.push(format!(
                "{} (booted by GRUB; extraKernelArgs: {args})",
                n.name
            )),
            Ok(None) | Err(_) => {
                unknown_loader.push(format!("{} (extraKernelArgs: {args})", n.name))
            }
        }
    }
    let mut parts = Vec::new();
    if !grub.is_empty() {
        parts.push(format!(
            "these nodes would reboot without their kernel arguments: {}",
            grub.join("; ")
        ));
    }
    if !unknown_loader.is_empty() {
        parts.push(format!(
            "these nodes would too if booted by GRUB, i.e. on GRUB nodes (the API does not report their boot loader): {}",
            unknown_loader.join("; ")
        ));
    }
    if !unjudged.is_empty() {
        parts.push(format!("could not be judged for {}", unjudged.join("; ")));
    }
    let later = if legacy.is_empty() {
        String::new()
    } else {
        format!(
            "; {} keep theirs this time (upgraded through the legacy MachineService/Upgrade, which passes them) but not in their next upgrade",
            legacy.join(", ")
        )
    };
    if parts.is_empty() {
        return Some(
            CheckItem::new(
                id,
                title,
                Status::Pass,
                format!(
                    "no node ichor upgrades through LifecycleService/Upgrade keeps kernel arguments in .machine.install.extraKernelArgs with GRUB building its command line ({LIFECYCLE_SOURCE}){later}"
                ),
            )
            .source(LIFECYCLE_SOURCE),
        );
    }
    Some(
        CheckItem::new(
            id,
            title,
            Status::Warn,
            format!(
                "Talos {t1}: ichor upgrades nodes on Talos 1.13 or later through LifecycleService/Upgrade, which does not pass .machine.install.extraKernelArgs to the installer, and GRUB without .machine.install.grubUseUKICmdline builds the kernel command line from them ({LIFECYCLE_SOURCE}; cmd/installer/pkg/install/install.go@v1.13.9; siderolabs/talos#13967): {}{later}",
                parts.join("; ")
            ),
        )
        .hint("move the arguments into the boot image (an Image Factory schematic's extraKernelArgs, so the UKI carries them) and set .machine.install.grubUseUKICmdline: true, or upgrade these nodes yourself through the legacy MachineService/Upgrade (`talosctl upgrade --legacy`, deprecated, removed in Talos 1.18) before merging")
        .source(LIFECYCLE_SOURCE),
    )
}

fn excerpt(text: &str) -> String {
    crate::releaseset::excerpt(text, 160)
}

/// The version an image's tag names (`registry.k8s.io/etcd:v3.5.17`, `…:3.6.4-0`).
fn image_tag_version(image: &str) -> Option<Version> {
    let no_digest = image.split('@').next().unwrap_or(image);
    let (_, tag) = no_digest.rsplit_once(':')?;
    if tag.contains('/') {
        return None;
    }
    Version::parse(tag).ok()
}

/// An image reference without its tag and digest, for comparing repositories.
fn image_repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => no_digest,
    }
}

/// Whether kube-proxy is where cluster.yaml says it is. The plan rolls kube-proxy unless
/// `spec.cni.replacesKubeProxy`; Talos deploys it (renders its DaemonSet among the bootstrap
/// manifests) unless the control planes' configuration disables it (`cluster.proxy.disabled`,
/// `KubeProxyConfig.enabled`: pkg/machinery/config/types/v1alpha1/v1alpha1_types.go@v1.13.9).
/// A CNI said to replace kube-proxy while Talos still deploys it leaves kube-proxy on the old
/// version and both programming Services: a failure. The other way round the kube-proxy step
/// finds nothing to roll: a warning. Only for a change that moves Kubernetes.
pub fn kube_proxy(bump: &Bump, replaces: bool, nodes: &[TrapNode]) -> Option<CheckItem> {
    let (k0, k1) = (&bump.base.spec.kubernetes, &bump.head.spec.kubernetes);
    if k1 <= k0 {
        return None;
    }
    let (id, title) = (
        "live/kube-proxy",
        "kube-proxy is deployed as cluster.yaml says",
    );
    const SOURCE: &str =
        "siderolabs/talos pkg/machinery/config/types/v1alpha1/v1alpha1_types.go@v1.13.9";
    let (mut deployed, mut disabled, mut unjudged) = (Vec::new(), Vec::new(), Vec::new());
    for n in nodes.iter().filter(|n| n.control_plane) {
        match &n.config {
            Ok(c) if c.kube_proxy_enabled => deployed.push(n.name.as_str()),
            Ok(_) => disabled.push(n.name.as_str()),
            Err(e) => unjudged.push(format!("{} ({})", n.name, excerpt(e))),
        }
    }
    let item =
        |status: Status, message: String| CheckItem::new(id, title, status, message).source(SOURCE);
    if replaces && !deployed.is_empty() {
        return Some(
            item(
                Status::Fail,
                format!(
                    "cluster.yaml says spec.cni.replacesKubeProxy: true, so ichor would not move kube-proxy, but the machine configuration of {} deploys it (cluster.proxy.disabled is not true): kube-proxy would stay on Kubernetes {k0}",
                    deployed.join(", ")
                ),
            )
            .hint("disable kube-proxy on the control planes (cluster.proxy.disabled: true, or KubeProxyConfig enabled: false) or set spec.cni.replacesKubeProxy: false in cluster.yaml"),
        );
    }
    if !unjudged.is_empty() {
        return Some(
            item(
                Status::Wait,
                format!(
                    "cannot tell whether Talos deploys kube-proxy: could not read the machine configuration of {}",
                    unjudged.join("; ")
                ),
            )
            .hint("check the talosconfig (reading the machine configuration needs os:admin) and that the control planes answer"),
        );
    }
    if !replaces && !disabled.is_empty() {
        return Some(
            item(
                Status::Warn,
                format!(
                    "the machine configuration of {} disables kube-proxy, but cluster.yaml does not say spec.cni.replacesKubeProxy: the plan's kube-proxy step will find nothing to roll there",
                    disabled.join(", ")
                ),
            )
            .hint("set spec.cni.replacesKubeProxy: true in cluster.yaml when the CNI replaces kube-proxy"),
        );
    }
    let message = if replaces {
        "the CNI replaces kube-proxy and no control plane's configuration deploys it".to_string()
    } else {
        "every control plane's configuration deploys kube-proxy, which ichor moves with Kubernetes"
            .to_string()
    };
    Some(item(Status::Pass, message))
}

/// etcd for the target Talos: a control plane whose etcd is older than the target's
/// `etcdMin` (policies/talos.yaml) blocks the move. Each control plane is judged from the
/// etcd it runs (EtcdStatus); when that cannot be read, from the image its configuration
/// pins (`.cluster.etcd.image`), else from its Talos release's default etcd. A pin below the
/// minimum blocks too: Talos keeps running the pinned image after the upgrade.
pub fn etcd_version(bump: &Bump, p: &Policies, nodes: &[TrapNode]) -> Option<CheckItem> {
    let (t0, t1) = (&bump.base.spec.talos, &bump.head.spec.talos);
    if talos_release(t1) <= talos_release(t0) {
        return None;
    }
    let row = p.talos_row(t1.minor_version())?;
    let min = row.etcd_min.as_ref()?;
    let source = row
        .etcd_source
        .clone()
        .unwrap_or_else(|| row.source.clone());
    let (id, title) = (
        "live/etcd-version",
        "etcd is recent enough for the target Talos",
    );
    let below = |v: &Version| talos_release(v) < talos_release(min);
    let (mut old, mut unjudged, mut fine) = (Vec::new(), Vec::new(), Vec::new());
    for n in nodes.iter().filter(|n| n.control_plane) {
        let pin = n.config.as_ref().ok().and_then(|c| c.etcd_image.clone());
        let pinned = pin.as_deref().map(|i| (i, image_tag_version(i)));
        if let Some((image, Some(v))) = &pinned {
            if below(v) {
                old.push(format!("{} pins .cluster.etcd.image {image}", n.name));
                continue;
            }
        }
        match &n.etcd {
            Some(Ok(v)) if below(v) => old.push(format!("{} runs etcd {v}", n.name)),
            Some(Ok(v)) => fine.push(format!("{} {v}", n.name)),
            other => {
                let why = match other {
                    Some(Err(e)) => format!("EtcdStatus: {}", excerpt(e)),
                    _ => "no EtcdStatus".to_string(),
                };
                // What it runs, as its configuration and release say.
                match (&pinned, &n.config, &n.talos) {
                    (Some((_, Some(v))), _, _) => fine.push(format!("{} {v} (pinned)", n.name)),
                    (Some((image, None)), _, _) => unjudged.push(format!(
                        "{} ({why}; .cluster.etcd.image {image} names no version)",
                        n.name
                    )),
                    (None, Ok(_), Ok(t)) => {
                        match p
                            .talos_row(t.minor_version())
                            .and_then(|r| r.etcd_default.as_ref())
                        {
                            Some(d) if below(d) => old.push(format!(
                                "{} runs Talos {t}, whose default etcd is {d}",
                                n.name
                            )),
                            Some(d) => fine.push(format!("{} {d} (Talos {t}'s default)", n.name)),
                            None => unjudged.push(format!(
                                "{} ({why}; no default etcd known for Talos {t})",
                                n.name
                            )),
                        }
                    }
                    (None, Err(e), _) => unjudged.push(format!(
                        "{} ({why}; machine configuration: {})",
                        n.name,
                        excerpt(e)
                    )),
                    (None, Ok(_), Err(e)) => {
                        unjudged.push(format!("{} ({why}; Talos version: {})", n.name, excerpt(e)))
                    }
                }
            }
        }
    }
    if !old.is_empty() {
        let default = p
            .talos_row(t0.minor_version())
            .and_then(|r| r.etcd_default.as_ref())
            .map_or(String::new(), |d| {
                format!(" (Talos {}'s default is {d})", t0.minor_version())
            });
        return Some(
            CheckItem::new(
                id,
                title,
                Status::Fail,
                format!(
                    "Talos {t1} runs only etcd {} or later ({source}): {}",
                    min.minor_version(),
                    old.join("; ")
                ),
            )
            .hint(format!(
                "while on Talos {t0}, move etcd to {}: set .cluster.etcd.image to an etcd {} image or remove the pin{default}, let every member restart healthy, then re-run the gate",
                min.minor_version(),
                min.minor_version()
            ))
            .source(source),
        );
    }
    if !unjudged.is_empty() {
        return Some(
            CheckItem::new(
                id,
                title,
                Status::Wait,
                format!(
                    "could not judge the etcd of {} against Talos {t1}'s minimum etcd {} ({source})",
                    unjudged.join("; "),
                    min.minor_version()
                ),
            )
            .hint("check the credentials (reading the machine configuration needs os:admin) and that every control plane answers, then re-run the gate")
            .source(source),
        );
    }
    if fine.is_empty() {
        return Some(
            CheckItem::new(
                id,
                title,
                Status::Wait,
                "no control plane found to judge etcd by",
            )
            .hint("check that the cluster's control planes are listed, then re-run the gate")
            .source(source),
        );
    }
    Some(
        CheckItem::new(
            id,
            title,
            Status::Pass,
            format!(
                "etcd on every control plane is {} or later, as Talos {t1} needs ({source}): {}",
                min.minor_version(),
                fine.join(", ")
            ),
        )
        .source(source),
    )
}

/// The installer image for the target, as the nodes' configurations name it, when
/// `cluster.yaml` names none (`spec.talos.installerImage`; the static note judges that one).
/// Each Talos note with an `installerImage` that the bump meets applies to the image each
/// node names: `UnattendedInstallConfig.installer.image` (Talos 1.14,
/// pkg/machinery/config/types/runtime/unattended_install.go at v1.14.0-rc.1), else
/// `.machine.install.image`. `None` when no such note applies.
pub fn installer_images(
    bump: &Bump,
    p: &Policies,
    cluster_installer: Option<&str>,
    nodes: &[TrapNode],
) -> Option<CheckItem> {
    let (t0, t1) = (&bump.base.spec.talos, &bump.head.spec.talos);
    if cluster_installer.is_some() || t1 <= t0 {
        return None;
    }
    let same = |a: &str, b: &str| {
        image_repository(a)
            .trim_end_matches('/')
            .eq_ignore_ascii_case(b.trim_end_matches('/'))
    };
    let notes: Vec<_> = p
        .talos_notes
        .iter()
        .filter(|n| {
            n.installer_image.is_some()
                && n.crosses.as_ref().is_none_or(|x| {
                    talos_release(t0) < talos_release(x) && talos_release(x) <= talos_release(t1)
                })
                && n.from.as_ref().is_none_or(|m| m.matches(t0))
                && n.talos.as_ref().is_none_or(|m| m.matches(t1))
        })
        .collect();
    if notes.is_empty() {
        return None;
    }
    let (id, title) = (
        "live/installer-image",
        "The installer image the nodes name exists for the target",
    );
    let (mut unjudged, mut unnamed, mut named) = (Vec::new(), Vec::new(), Vec::new());
    for n in nodes {
        match &n.config {
            Err(e) => unjudged.push(format!("{} ({})", n.name, excerpt(e))),
            Ok(c) => match &c.installer_image {
                None => unnamed.push(n.name.clone()),
                Some((image, path)) => named.push((n.name.as_str(), image.as_str(), path.as_str())),
            },
        }
    }
    for note in &notes {
        let want = note.installer_image.as_deref().unwrap_or_default();
        let hit: Vec<String> = named
            .iter()
            .filter(|(_, image, _)| same(image, want))
            .map(|(node, image, path)| format!("{node} ({path}: {image})"))
            .collect();
        if !hit.is_empty() {
            return Some(
                CheckItem::new(
                    id,
                    title,
                    Status::Warn,
                    format!(
                        "Talos {t0} → {t1}, cluster.yaml names no spec.talos.installerImage, and these nodes' configurations name {want}, which note `{}` says does not exist for the target ({}): {}",
                        note.id,
                        note.source,
                        hit.join("; ")
                    ),
                )
                .hint(note.hint.clone().unwrap_or_else(|| "name an installer that exists for the target in cluster.yaml spec.talos.installerImage, then re-run the gate".into()))
                .source(&note.source),
            );
        }
    }
    let sources: Vec<&str> = notes.iter().map(|n| n.source.as_str()).collect();
    if !unjudged.is_empty() || !unnamed.is_empty() {
        let mut why = Vec::new();
        if !unjudged.is_empty() {
            why.push(format!(
                "the configuration could not be read on {}",
                unjudged.join("; ")
            ));
        }
        if !unnamed.is_empty() {
            why.push(format!(
                "{} name no installer image (neither UnattendedInstallConfig.installer.image nor .machine.install.image)",
                unnamed.join(", ")
            ));
        }
        return Some(
            CheckItem::new(
                id,
                title,
                Status::Warn,
                format!(
                    "could not judge the installer for Talos {t1} ({}): {}",
                    sources.join("; "),
                    why.join("; ")
                ),
            )
            .hint("name the installer in cluster.yaml spec.talos.installerImage (an Image Factory installer, factory.talos.dev/<platform>-installer/<schematic>), then re-run the gate")
            .source(sources.join("; ")),
        );
    }
    let mut images: Vec<String> = named
        .iter()
        .map(|(node, image, path)| format!("{node} ({path}: {image})"))
        .collect();
    images.dedup();
    Some(
        CheckItem::new(
            id,
            title,
            Status::Pass,
            format!(
                "the nodes' configurations name installers the notes for Talos {t1} do not rule out ({}): {}; cluster.yaml names no spec.talos.installerImage, and ichor installs the image named there",
                sources.join("; "),
                images.join("; ")
            ),
        )
        .source(sources.join("; ")),
    )
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
            &["my-operator@v0.19.0", "external-dns@v0.19.0"],
        );
        let item = addon_item(&b, &p(), &unknown.spec.addons[0]);
        assert_eq!(item.status, Status::Warn);
        assert!(
            item.message.contains("unknown add-on `my-operator`"),
            "{}",
            item.message
        );
        // A component the data knows of without rows: the warning names what upstream has.
        let item = addon_item(&b, &p(), &unknown.spec.addons[1]);
        assert_eq!(item.status, Status::Warn);
        assert!(
            item.message.contains("upstream publishes a compatibility matrix for external-dns, but ichor has not verified it"),
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
        // Within the skew, but the kubelet would go 1.32 → 1.34 in one step.
        let behind = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5"),
            node("w-1", Role::Worker, "v1.12.6", "v1.32.9"),
        ];
        let item = kubelet_skew(&b, &p(), &behind);
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert!(
            item.message.contains("w-1 (v1.32.9, 2 minors)"),
            "{}",
            item.message
        );
        let patch_behind = vec![node("w-1", Role::Worker, "v1.12.6", "v1.33.0")];
        assert_eq!(kubelet_skew(&b, &p(), &patch_behind).status, Status::Pass);
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

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn day(s: &str) -> Date {
        Date::parse(s).unwrap()
    }

    /// One case per shipped compatibility row: a version inside the row, the Kubernetes
    /// range upstream gives for it, and the patch floors. The test checks the version just
    /// inside and just outside each end of the range, and that every row has a case.
    /// (component, a version inside the row, Kubernetes min, max, patch floors).
    type RowCase = (
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
        &'static [&'static str],
    );

    const ROWS: &[RowCase] = &[
        ("cilium", "1.14.0", "1.19", Some("1.27"), &[]),
        ("cilium", "1.15.6", "1.26", Some("1.29"), &[]),
        ("cilium", "1.16.0", "1.27", Some("1.30"), &[]),
        ("cilium", "1.17.18", "1.28", Some("1.31"), &[]),
        ("cilium", "1.18.3", "1.30", Some("1.33"), &[]),
        ("cilium", "1.19.8", "1.32", Some("1.35"), &[]),
        ("cilium", "1.20.2", "1.33", Some("1.36"), &[]),
        ("calico", "3.29.4", "1.29", Some("1.32"), &[]),
        ("calico", "3.30.2", "1.31", Some("1.35"), &[]),
        ("calico", "3.31.0", "1.32", Some("1.35"), &[]),
        ("calico", "3.32.1", "1.34", Some("1.36"), &[]),
        ("calico", "3.33.0", "1.35", Some("1.37"), &[]),
        ("flannel", "0.27.4", "1.19", None, &[]),
        ("cert-manager", "1.14.7", "1.24", Some("1.31"), &[]),
        ("cert-manager", "1.15.5", "1.25", Some("1.32"), &[]),
        ("cert-manager", "1.16.0", "1.25", Some("1.32"), &[]),
        ("cert-manager", "1.17.2", "1.29", Some("1.33"), &[]),
        ("cert-manager", "1.18.2", "1.29", Some("1.33"), &[]),
        ("cert-manager", "1.19.3", "1.31", Some("1.35"), &[]),
        ("cert-manager", "1.20.2", "1.32", Some("1.35"), &[]),
        ("cert-manager", "1.21.0", "1.33", Some("1.36"), &[]),
        ("cloudnative-pg", "1.24.4", "1.28", Some("1.31"), &[]),
        ("cloudnative-pg", "1.25.1", "1.29", Some("1.32"), &[]),
        ("cloudnative-pg", "1.26.0", "1.30", Some("1.33"), &[]),
        ("cloudnative-pg", "1.27.0", "1.31", Some("1.33"), &[]),
        ("cloudnative-pg", "1.28.2", "1.32", Some("1.35"), &[]),
        ("cloudnative-pg", "1.29.0", "1.33", Some("1.35"), &[]),
        ("cloudnative-pg", "1.30.0", "1.34", Some("1.36"), &[]),
        ("rook", "1.14.1", "1.25", Some("1.29"), &[]),
        ("rook", "1.14.2", "1.25", Some("1.30"), &[]),
        ("rook", "1.15.3", "1.26", Some("1.31"), &[]),
        ("rook", "1.16.8", "1.27", Some("1.32"), &[]),
        ("rook", "1.17.8", "1.28", Some("1.32"), &[]),
        ("rook", "1.17.9", "1.28", Some("1.33"), &[]),
        ("rook", "1.18.10", "1.29", Some("1.33"), &[]),
        ("rook", "1.18.11", "1.29", Some("1.34"), &[]),
        ("rook", "1.19.9", "1.30", Some("1.35"), &[]),
        ("rook", "1.19.10", "1.30", Some("1.35"), &[]),
        ("rook", "1.20.6", "1.31", Some("1.36"), &[]),
        ("argocd", "2.13.4", "1.27", Some("1.30"), &[]),
        ("argocd", "2.14.0", "1.28", Some("1.31"), &[]),
        ("argocd", "3.0.6", "1.29", Some("1.32"), &[]),
        ("argocd", "3.1.10", "1.30", Some("1.33"), &[]),
        ("argocd", "3.1.11", "1.31", Some("1.34"), &[]),
        ("argocd", "3.2.3", "1.30", Some("1.33"), &[]),
        ("argocd", "3.2.4", "1.31", Some("1.34"), &[]),
        ("argocd", "3.3.4", "1.31", Some("1.34"), &[]),
        ("argocd", "3.3.5", "1.32", Some("1.35"), &[]),
        ("argocd", "3.4.2", "1.32", Some("1.35"), &[]),
        ("argocd", "3.5.1", "1.33", Some("1.36"), &[]),
        ("flux", "2.3.0", "1.28", None, &[]),
        ("flux", "2.4.0", "1.28", None, &[]),
        ("flux", "2.5.1", "1.30", None, &[]),
        ("flux", "2.6.4", "1.31", None, &[]),
        ("flux", "2.7.5", "1.32", None, &["1.34.1"]),
        ("flux", "2.8.0", "1.33", None, &["1.34.1"]),
        ("flux", "2.9.1", "1.33", None, &["1.34.1"]),
        ("ingress-nginx", "1.11.8", "1.26", Some("1.30"), &[]),
        ("ingress-nginx", "1.12.1", "1.28", Some("1.32"), &[]),
        ("ingress-nginx", "1.13.9", "1.29", Some("1.33"), &[]),
        ("ingress-nginx", "1.14.5", "1.30", Some("1.34"), &[]),
        ("ingress-nginx", "1.15.1", "1.31", Some("1.35"), &[]),
        ("longhorn", "1.8.3", "1.25", None, &[]),
        ("longhorn", "1.9.0", "1.25", None, &[]),
        ("longhorn", "1.11.2", "1.25", None, &[]),
        ("longhorn", "1.11.3", "1.34", None, &[]),
        ("longhorn", "1.12.2", "1.25", None, &[]),
        ("longhorn", "1.13.0", "1.34", None, &[]),
        ("openebs", "4.4.0", "1.23", None, &[]),
        ("metrics-server", "0.6.4", "1.25", None, &[]),
        ("metrics-server", "0.7.2", "1.27", None, &[]),
        ("metrics-server", "0.8.0", "1.31", None, &[]),
        ("metrics-server", "0.9.0", "1.34", None, &[]),
        ("velero", "1.14.2", "1.18", None, &[]),
        ("velero", "1.15.0", "1.18", None, &[]),
        ("velero", "1.16.1", "1.18", None, &[]),
        ("velero", "1.17.0", "1.18", None, &[]),
        ("velero", "1.18.0", "1.18", None, &[]),
        ("kube-prometheus", "0.15.0", "1.31", Some("1.33"), &[]),
        ("kube-prometheus", "0.17.0", "1.33", Some("1.35"), &[]),
        ("kube-prometheus", "0.18.1", "1.33", Some("1.36"), &[]),
        ("gateway-api", "1.4.1", "1.30", None, &[]),
        ("gateway-api", "1.5.0", "1.31", None, &[]),
        ("gateway-api", "1.6.1", "1.32", None, &[]),
    ];

    /// Kubernetes `minor` ± `delta` as a patch release that no patch floor concerns.
    fn k8s(minor: &str, delta: i64) -> Version {
        let m = MinorVersion::parse(minor).unwrap();
        v(&format!("{}.{}.5", m.major, m.minor as i64 + delta))
    }

    #[test]
    fn every_row_admits_just_inside_and_refuses_just_outside_its_range() {
        let p = p();
        for (c, ver, min, max, floors) in ROWS {
            let at = |k: &Version| p.supports(c, &v(ver), k);
            let case = format!("{c} {ver}");
            assert_eq!(at(&k8s(min, 0)), Some(true), "{case} at its min {min}");
            assert_eq!(at(&k8s(min, -1)), Some(false), "{case} below its min {min}");
            match max {
                Some(max) => {
                    assert_eq!(at(&k8s(max, 0)), Some(true), "{case} at its max {max}");
                    assert_eq!(at(&k8s(max, 1)), Some(false), "{case} above its max {max}");
                }
                None => assert_eq!(at(&k8s("1.40", 0)), Some(true), "{case}: no upper bound"),
            }
            for f in *floors {
                let f = v(f);
                let below = v(&format!("{}.{}.{}", f.major(), f.minor(), f.patch() - 1));
                assert_eq!(at(&f), Some(true), "{case} at its patch floor {f}");
                assert_eq!(at(&below), Some(false), "{case} below its patch floor {f}");
            }
        }
        // Every shipped row has a case.
        for row in &p.compatibility {
            assert!(
                ROWS.iter()
                    .any(|(c, ver, ..)| *c == row.component && row.version.matches(&v(ver))),
                "no case for the row {} {}",
                row.component,
                row.version
            );
        }
    }

    #[test]
    fn every_talos_row_matches_the_upstream_table() {
        // (minor, Kubernetes min, max, upgradeFrom): siderolabs/talos compatibility/talosNNN.
        let table = [
            ("1.7", "1.25", "1.30", "1.4.0"),
            ("1.8", "1.26", "1.31", "1.5.0"),
            ("1.9", "1.27", "1.32", "1.8.0"),
            ("1.10", "1.28", "1.33", "1.8.0"),
            ("1.11", "1.29", "1.34", "1.9.0"),
            ("1.12", "1.30", "1.35", "1.10.0"),
            ("1.13", "1.31", "1.36", "1.11.0"),
            ("1.14", "1.33", "1.37", "1.12.0"),
            ("1.15", "1.33", "1.38", "1.13.0"),
        ];
        let p = p();
        assert_eq!(p.talos.len(), table.len());
        for (t, min, max, from) in table {
            let row = p.talos_row(MinorVersion::parse(t).unwrap()).unwrap();
            let m = |s: &str, d: i64| k8s(s, d).minor_version();
            assert!(row.kubernetes.contains(m(min, 0)), "{t}");
            assert!(!row.kubernetes.contains(m(min, -1)), "{t}");
            assert!(row.kubernetes.contains(m(max, 0)), "{t}");
            assert!(!row.kubernetes.contains(m(max, 1)), "{t}");
            assert_eq!(row.upgrade_from, Some(v(from)), "{t}");
        }
    }

    /// A bump of Kubernetes from `k0` to `k1` with `addon` on a Talos that supports both.
    fn k8s_bump(k0: &str, k1: &str, cni: &str, addons: &[&str]) -> Bump {
        bump(
            rs("v1.13.9", k0, cni, addons),
            rs("v1.13.9", k1, cni, addons),
        )
    }

    #[test]
    fn calico_rows_follow_tigera_docs() {
        // 3.30 was extended to 1.35 in January 2026; 3.29-3.32 are upstream, 3.33 is not.
        let item = cni(&k8s_bump("v1.34.2", "v1.35.1", "calico@v3.30.2", &[]), &p());
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        assert!(item.source.as_deref().unwrap_or("").contains("f81996f"));
        let item = cni(&k8s_bump("v1.35.1", "v1.36.0", "calico@v3.30.2", &[]), &p());
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert_eq!(
            item.hint.as_deref(),
            Some("bump calico to >= 3.32 first (a version that supports Kubernetes 1.36)")
        );
        for (cni_version, k0, k1) in [
            ("calico@v3.29.4", "v1.31.2", "v1.32.1"),
            ("calico@v3.31.0", "v1.34.2", "v1.35.1"),
            ("calico@v3.32.1", "v1.35.1", "v1.36.0"),
        ] {
            let item = cni(&k8s_bump(k0, k1, cni_version, &[]), &p());
            assert_eq!(item.status, Status::Pass, "{cni_version}: {}", item.message);
            assert!(
                item.source
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("tigera/docs"),
                "{cni_version}: {:?}",
                item.source
            );
        }
        let b = bump(
            rs("v1.14.1", "v1.36.2", "calico@v3.33.0", &[]),
            rs("v1.14.1", "v1.37.0", "calico@v3.33.0", &[]),
        );
        assert_eq!(cni(&b, &p()).status, Status::Warn, "3.33 is unconfirmed");
    }

    #[test]
    fn rook_1_14_supports_1_30_from_1_14_2() {
        let item = addon_item(
            &k8s_bump("v1.29.9", "v1.30.4", "cilium@1.16.0", &["rook@v1.14.2"]),
            &p(),
            &rs("v1.13.9", "v1.30.4", "cilium@1.16.0", &["rook@v1.14.2"])
                .spec
                .addons[0],
        );
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        let b = k8s_bump("v1.29.9", "v1.30.4", "cilium@1.16.0", &["rook@v1.14.1"]);
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert_eq!(
            item.hint.as_deref(),
            Some("bump rook to >= 1.14.2 first (a version that supports Kubernetes 1.30)")
        );
    }

    #[test]
    fn longhorn_1_12_supports_kubernetes_from_1_25() {
        // The issue's case: Kubernetes 1.33 with Longhorn v1.12.2 passes, with no hint at all
        // (it used to say "bump longhorn to >=1.10.0, <1.11.3 first").
        let b = k8s_bump("v1.32.9", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.12.2"]);
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        assert_eq!(item.hint, None);
        assert!(item.source.as_deref().unwrap_or("").contains("v5.3.0"));
        // 1.11.3 and 1.13 still need 1.34; from 1.11.3, 1.12 is the way forward.
        let b = k8s_bump("v1.32.9", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.11.3"]);
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert_eq!(
            item.hint.as_deref(),
            Some("bump longhorn to >= 1.12 first (a version that supports Kubernetes 1.33)")
        );
        let b = k8s_bump("v1.32.9", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.13.0"]);
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail);
        assert!(
            !item.hint.as_deref().unwrap_or("").contains("bump"),
            "{:?}",
            item.hint
        );
    }

    #[test]
    fn a_wrong_row_never_proposes_a_downgrade() {
        // Reinstate the pre-correction Longhorn row: only older versions support 1.33 then,
        // and the item says no newer version does instead of "bump to >=1.10.0, <1.11.3".
        let repo = vec![(
            "policies/old.yaml".to_string(),
            "compatibility:\n  - component: longhorn\n    version: \"1.12\"\n    disabled: true\n    kubernetes: {min: \"1.25\"}\n    source: x\n  - component: longhorn\n    version: \">=1.12.1, <1.13.0\"\n    kubernetes: {min: \"1.34\"}\n    source: the pre-correction row\n".to_string(),
        )];
        let policies = Policies::load(&repo).unwrap();
        let b = k8s_bump("v1.32.9", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.12.2"]);
        let item = addon_item(&b, &policies, &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail);
        let hint = item.hint.as_deref().unwrap_or("");
        assert!(!hint.contains("bump longhorn"), "{hint}");
        assert!(
            hint.contains("no newer longhorn supports Kubernetes 1.33"),
            "{hint}"
        );
        assert!(
            item.message
                .contains("no newer longhorn that ichor knows supports 1.33"),
            "{}",
            item.message
        );
        // The component moved there in this change: keep the version it had.
        let b = bump(
            rs("v1.13.9", "v1.32.9", "cilium@1.18.3", &["longhorn@v1.10.3"]),
            rs("v1.13.9", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.12.2"]),
        );
        let item = addon_item(&b, &policies, &b.head.spec.addons[0]);
        assert_eq!(
            item.hint.as_deref(),
            Some("keep longhorn at v1.10.3 until Kubernetes reaches 1.34, then bump it")
        );
    }

    #[test]
    fn talos_1_14_is_unconfirmed_until_it_is_released() {
        let row = p().talos_row(MinorVersion::new(1, 14)).cloned().unwrap();
        assert_eq!(row.confidence, Confidence::Unconfirmed);
        let note = row.note.unwrap_or_default();
        assert!(
            note.contains("1.33-1.37") && note.contains("1.32-1.37"),
            "{note}"
        );
        let b = bump(
            rs("v1.13.9", "v1.36.3", "cilium@1.20.2", &[]),
            rs("v1.14.1", "v1.36.3", "cilium@1.20.2", &[]),
        );
        let item = talos_kubernetes_pairing(&b, &p());
        assert_eq!(item.status, Status::Warn, "{}", item.message);
        assert!(
            item.message.contains("data unconfirmed"),
            "{}",
            item.message
        );
        // A hint towards 1.14 says its data is unconfirmed.
        let item =
            talos_kubernetes_pairing(&from_base("v1.13.9", "v1.37.0", "cilium@1.20.2"), &p());
        let hint = item.hint.unwrap_or_default();
        assert!(
            hint.contains("bump Talos to 1.14 first") && hint.contains("unconfirmed"),
            "{hint}"
        );
    }

    #[test]
    fn a_prerelease_host_counts_as_its_release_everywhere() {
        // Talos 1.14 upgrades from 1.12.0; a 1.12.0-beta.0 host counts as 1.12.0.
        let mut two = p();
        two.skew.talos_max_minor_step = 2;
        let b = bump(
            rs("v1.12.0-beta.0", "v1.33.5", "cilium@1.19.1", &[]),
            rs("v1.14.1", "v1.33.5", "cilium@1.19.1", &[]),
        );
        let item = talos_step(&b, &two);
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        let b = bump(
            rs("v1.11.9", "v1.33.5", "cilium@1.19.1", &[]),
            rs("v1.14.1", "v1.33.5", "cilium@1.19.1", &[]),
        );
        let mut three = p();
        three.skew.talos_max_minor_step = 3;
        assert_ne!(talos_step(&b, &three).status, Status::Pass);
        // Same rule for nodes running something else than the release set.
        let b = from_base("v1.13.9", "v1.33.5", "cilium@1.18.3");
        let nodes = vec![
            node("cp-1", Role::Controlplane, "v1.12.6", "v1.33.5"),
            node("w-1", Role::Worker, "v1.12.0-beta.0", "v1.33.5"),
        ];
        let mut strict = p();
        if let Some(r) = strict
            .talos
            .iter_mut()
            .find(|r| r.version == MinorVersion::new(1, 13))
        {
            r.upgrade_from = Some(v("1.12.0"));
        }
        assert_eq!(nodes_talos(&b, &strict, &nodes).status, Status::Pass);
        let nodes = vec![node("w-1", Role::Worker, "v1.11.9", "v1.33.5")];
        let item = nodes_talos(&b, &strict, &nodes);
        assert_eq!(item.status, Status::Fail);
        assert_eq!(
            item.hint.as_deref(),
            Some("bring these nodes to the latest Talos 1.12 patch first")
        );
        // A node below a patch-level minimum in the minor just below: the hint is that minimum.
        if let Some(r) = strict
            .talos
            .iter_mut()
            .find(|r| r.version == MinorVersion::new(1, 13))
        {
            r.upgrade_from = Some(v("1.12.3"));
        }
        let nodes = vec![node("w-1", Role::Worker, "v1.12.1", "v1.33.5")];
        assert_eq!(
            nodes_talos(&b, &strict, &nodes).hint.as_deref(),
            Some("upgrade these nodes to Talos 1.12.3 or later first")
        );
    }

    #[test]
    fn argocd_early_patches_claim_one_minor_less() {
        let item = |version: &str, k0: &str, k1: &str| {
            let addon = format!("argocd@v{version}");
            let b = k8s_bump(k0, k1, "cilium@1.19.1", &[&addon]);
            addon_item(&b, &p(), &b.head.spec.addons[0])
        };
        for (version, k0, k1, want) in [
            ("3.1.5", "v1.33.5", "v1.34.2", Status::Fail),
            ("3.1.11", "v1.33.5", "v1.34.2", Status::Pass),
            ("3.2.3", "v1.33.5", "v1.34.2", Status::Fail),
            ("3.2.4", "v1.33.5", "v1.34.2", Status::Pass),
            ("3.3.4", "v1.34.2", "v1.35.1", Status::Fail),
            ("3.3.5", "v1.34.2", "v1.35.1", Status::Pass),
        ] {
            let i = item(version, k0, k1);
            assert_eq!(i.status, want, "argocd {version} → {k1}: {}", i.message);
        }
        // The early patches do test the minor below.
        let b = bump(
            rs("v1.12.9", "v1.30.9", "cilium@1.18.3", &["argocd@v3.1.5"]),
            rs("v1.12.9", "v1.30.10", "cilium@1.18.3", &["argocd@v3.1.5"]),
        );
        assert_eq!(
            addon_item(&b, &p(), &b.head.spec.addons[0]).status,
            Status::Pass
        );
        assert_eq!(
            item("3.1.5", "v1.33.5", "v1.34.2").hint.as_deref(),
            Some("bump argocd to >= 3.1.11 first (a version that supports Kubernetes 1.34)")
        );
    }

    #[test]
    fn flux_needs_kubernetes_1_34_1() {
        let b = k8s_bump("v1.33.5", "v1.34.0", "cilium@1.19.1", &["flux@v2.7.3"]);
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert!(
            item.message.contains("only from 1.34.1"),
            "{}",
            item.message
        );
        assert_eq!(
            item.hint.as_deref(),
            Some("upgrade Kubernetes to 1.34.1 or later (the first 1.34 patch flux supports)")
        );
        let b = k8s_bump("v1.33.5", "v1.34.1", "cilium@1.19.1", &["flux@v2.7.3"]);
        assert_eq!(
            addon_item(&b, &p(), &b.head.spec.addons[0]).status,
            Status::Pass
        );
        // Flux moving while the cluster still runs 1.34.0.
        let b = bump(
            rs("v1.13.9", "v1.34.0", "cilium@1.19.1", &["flux@v2.6.4"]),
            rs("v1.13.9", "v1.34.0", "cilium@1.19.1", &["flux@v2.8.0"]),
        );
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert!(
            item.message.contains("the cluster runs v1.34.0"),
            "{}",
            item.message
        );
    }

    #[test]
    fn end_of_life_warns_with_the_date_from_the_clock_passed_in() {
        let b = from_base("v1.12.6", "v1.33.7", "cilium@1.18.3");
        let base_items = |today: &str| {
            let b = bump(
                rs(
                    "v1.12.6",
                    "v1.33.5",
                    "cilium@1.18.3",
                    &["cert-manager@v1.18.2"],
                ),
                rs(
                    "v1.12.6",
                    "v1.33.7",
                    "cilium@1.18.3",
                    &["cert-manager@v1.18.2"],
                ),
            );
            evaluate_with(&b, &p(), None, &Context::at(day(today)))
        };
        let items = base_items("2026-12-01");
        let eol = items.iter().find(|i| i.id == "eol/cert-manager").unwrap();
        assert_eq!(eol.status, Status::Warn);
        assert!(
            eol.message
                .contains("v1.18.2 reached end of life on 2026-03-10"),
            "{}",
            eol.message
        );
        assert!(eol.message.contains("stays on it"), "{}", eol.message);
        // 1.19 ended too, so the hint skips it; 1.20 supports Kubernetes 1.33.
        assert_eq!(
            eol.hint.as_deref(),
            Some("bump cert-manager to >= 1.20 (the lowest newer release ichor knows that is still supported)")
        );
        // The day before: nothing. Without a day: nothing.
        assert!(base_items("2026-03-09")
            .iter()
            .all(|i| !i.id.starts_with("eol/")));
        assert!(evaluate(&b, &p(), None)
            .iter()
            .all(|i| !i.id.starts_with("eol/")));
        // On the day itself, and landing on it.
        let b = bump(
            rs(
                "v1.12.6",
                "v1.33.5",
                "cilium@1.18.3",
                &["cert-manager@v1.18.2"],
            ),
            rs(
                "v1.12.6",
                "v1.33.5",
                "cilium@1.18.3",
                &["cert-manager@v1.19.3"],
            ),
        );
        // (The shipped data also ends Talos 1.12 on 2026-04-27: look at cert-manager only.)
        let cert_manager = |today: &str| -> Vec<CheckItem> {
            end_of_life(&b, &p(), day(today))
                .into_iter()
                .filter(|i| i.id == "eol/cert-manager")
                .collect()
        };
        let items = cert_manager("2026-07-08");
        assert_eq!(items.len(), 1);
        assert!(
            items[0].message.contains("this change moves to it"),
            "{}",
            items[0].message
        );
        assert!(cert_manager("2026-07-07").is_empty());
        // Kubernetes and Talos minors from a repository row.
        let repo = vec![(
            "policies/eol.yaml".to_string(),
            "endOfLife:\n  - component: kubernetes\n    version: \"1.33\"\n    date: \"2026-06-28\"\n    source: kubernetes.io/releases\n  - component: talos\n    version: \"<1.13.0\"\n    date: \"2026-10-01\"\n    source: siderolabs\n".to_string(),
        )];
        let policies = Policies::load(&repo).unwrap();
        let b = from_base("v1.12.6", "v1.33.7", "cilium@1.18.3");
        let items = end_of_life(&b, &policies, day("2026-12-01"));
        let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["eol/talos", "eol/kubernetes"]);
        assert_eq!(
            items[0].hint.as_deref(),
            Some("bump Talos to >= 1.13 (the lowest newer release ichor knows that is still supported)")
        );
        assert!(
            items[1]
                .message
                .contains("Kubernetes v1.33.7 reached end of life on 2026-06-28"),
            "{}",
            items[1].message
        );
    }

    #[test]
    fn new_components_block_and_pass() {
        // metrics-server rows are unconfirmed until read upstream: warnings either way.
        let b = k8s_bump(
            "v1.32.9",
            "v1.33.5",
            "cilium@1.18.3",
            &["metrics-server@v0.7.2"],
        );
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Warn, "{}", item.message);
        assert!(
            item.message.contains("supports Kubernetes 1.33"),
            "{}",
            item.message
        );
        let b = k8s_bump(
            "v1.32.9",
            "v1.33.5",
            "cilium@1.18.3",
            &["metrics-server@v0.9.0"],
        );
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Warn, "{}", item.message);
        assert!(
            item.message.contains("needs Kubernetes 1.34 or later"),
            "{}",
            item.message
        );
        // Confirmed by a repository, the same rows pass and block.
        let repo = vec![(
            "policies/ms.yaml".to_string(),
            "compatibility:\n  - component: metrics-server\n    version: \"0.7\"\n    kubernetes: {min: \"1.27\"}\n    source: read upstream\n  - component: metrics-server\n    version: \"0.9\"\n    kubernetes: {min: \"1.34\"}\n    source: read upstream\nblockers:\n  - id: metallb-bgp-kubernetes-1.36\n    component: metallb\n    version: \"<0.16.0\"\n    kubernetes: \">=1.36\"\n    message: BGP objects rejected\n    source: metallb/metallb#3034\n".to_string(),
        )];
        let confirmed = Policies::load(&repo).unwrap();
        let item = addon_item(&b, &confirmed, &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        let b = k8s_bump(
            "v1.32.9",
            "v1.33.5",
            "cilium@1.18.3",
            &["metrics-server@v0.7.2"],
        );
        assert_eq!(
            addon_item(&b, &confirmed, &b.head.spec.addons[0]).status,
            Status::Pass
        );

        // MetalLB before 0.16.0 on Kubernetes 1.36: a blocker, a warning while unconfirmed.
        let metallb = |version: &str, k0: &str, k1: &str, p: &Policies| {
            let addon = format!("metallb@v{version}");
            blockers(&k8s_bump(k0, k1, "cilium@1.20.2", &[&addon]), p)
        };
        let items = metallb("0.15.2", "v1.35.3", "v1.36.1", &p());
        assert_eq!(items[0].id, "blocker/metallb-bgp-kubernetes-1.36");
        assert_eq!(items[0].status, Status::Warn);
        let hint = items[0].hint.as_deref().unwrap_or("");
        assert!(
            hint.starts_with("bump metallb to 0.16.0 or later first"),
            "{hint}"
        );
        assert!(hint.contains("no BGP peers"), "{hint}");
        assert_eq!(
            metallb("0.15.2", "v1.35.3", "v1.36.1", &confirmed)[0].status,
            Status::Fail
        );
        assert_eq!(
            metallb("0.16.0", "v1.35.3", "v1.36.1", &confirmed)[0].id,
            "blockers"
        );
        assert_eq!(
            metallb("0.15.2", "v1.34.3", "v1.35.1", &confirmed)[0].id,
            "blockers"
        );

        // external-dns before 0.18 on Kubernetes 1.33 (app versions; the 1.x chart does not match).
        let b = k8s_bump(
            "v1.32.9",
            "v1.33.5",
            "cilium@1.18.3",
            &["external-dns@v0.17.1"],
        );
        let items = blockers(&b, &p());
        assert_eq!(items[0].id, "blocker/external-dns-kubernetes-1.33");
        assert!(items[0]
            .hint
            .as_deref()
            .unwrap_or("")
            .starts_with("bump external-dns to 0.18.0 or later first"));
        let b = k8s_bump(
            "v1.32.9",
            "v1.33.5",
            "cilium@1.18.3",
            &["external-dns@v0.18.0"],
        );
        assert_eq!(blockers(&b, &p())[0].id, "blockers");

        // No matrix upstream: the warning says so.
        let b = k8s_bump("v1.32.9", "v1.33.5", "cilium@1.18.3", &["kube-vip@v0.9.2"]);
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Warn);
        assert!(
            item.message
                .contains("upstream publishes no compatibility matrix for kube-vip"),
            "{}",
            item.message
        );
        // An older line the rows do not cover says what they do cover.
        let b = k8s_bump("v1.32.9", "v1.33.5", "cilium@1.18.3", &["longhorn@v1.7.2"]);
        let item = addon_item(&b, &p(), &b.head.spec.addons[0]);
        assert_eq!(item.status, Status::Warn);
        assert!(
            item.message.contains("rows cover longhorn 1.8.0 to 1.13"),
            "{}",
            item.message
        );
    }

    #[test]
    fn talos_upgrade_notes_apply_where_the_bump_crosses_them() {
        let ids = |t0: &str, t1: &str, image: Option<&str>| -> Vec<String> {
            let b = bump(
                rs(t0, "v1.33.5", "cilium@1.18.3", &[]),
                rs(t1, "v1.33.5", "cilium@1.18.3", &[]),
            );
            talos_notes(&b, &p(), image)
                .into_iter()
                .map(|i| {
                    assert_eq!(i.status, Status::Warn);
                    i.id
                })
                .collect()
        };
        // The move onto 1.13 goes through the legacy MachineService/Upgrade, which passes
        // extraKernelArgs; the moves from 1.13 on do not.
        assert_eq!(
            ids("v1.12.9", "v1.13.2", None),
            ["talos-note/talos-1.13-nvidia-runtimeclass"]
        );
        assert_eq!(
            ids("v1.13.0", "v1.13.2", None),
            ["talos-note/talos-1.13-grub-extra-kernel-args"]
        );
        // A pre-release host of 1.13.0 counts as 1.13.0: already across.
        assert!(!ids("v1.13.0-beta.0", "v1.13.2", None)
            .iter()
            .any(|i| i.contains("nvidia")));
        assert!(ids("v1.12.9", "v1.12.11", None).is_empty());
        let on_1_14 = [
            "talos-note/talos-1.13-grub-extra-kernel-args",
            "talos-note/talos-1.14-etcd-3.6",
            "talos-note/talos-1.14-etcd-http-port",
        ];
        let ghcr = Some("ghcr.io/siderolabs/installer");
        let mut with_ghcr = on_1_14.to_vec();
        with_ghcr.push("talos-note/talos-1.14-no-ghcr-installer");
        assert_eq!(ids("v1.13.9", "v1.14.1", ghcr), with_ghcr);
        assert_eq!(
            ids(
                "v1.13.9",
                "v1.14.1",
                Some("factory.talos.dev/metal-installer/abc")
            ),
            on_1_14
        );
        assert_eq!(ids("v1.13.9", "v1.14.1", None), on_1_14);
        // Within 1.14 the etcd notes are behind.
        assert_eq!(
            ids("v1.14.0", "v1.14.1", None),
            ["talos-note/talos-1.13-grub-extra-kernel-args"]
        );
        assert!(!ids("v1.12.9", "v1.13.2", ghcr)
            .iter()
            .any(|i| i.contains("ghcr")));
        // Through evaluate_with, from the installer image the caller passes.
        let b = bump(
            rs("v1.13.9", "v1.34.2", "cilium@1.19.1", &[]),
            rs("v1.14.1", "v1.34.2", "cilium@1.19.1", &[]),
        );
        let ctx = Context::default().with_installer_image(ghcr);
        let item = evaluate_with(&b, &p(), None, &ctx)
            .into_iter()
            .find(|i| i.id == "talos-note/talos-1.14-no-ghcr-installer")
            .unwrap();
        assert!(
            item.hint
                .as_deref()
                .unwrap_or("")
                .contains("factory.talos.dev"),
            "{:?}",
            item.hint
        );
    }

    /// Every version a hint tells the user to move to, with what it is compared against:
    /// (subject, version text, the version the release set has).
    fn hint_targets(hint: &str, b: &Bump) -> Vec<(String, String, Version)> {
        let words: Vec<&str> = hint.split_whitespace().collect();
        let mut out = Vec::new();
        for i in 0..words.len() {
            let lead =
                if words[i] == "to" && i >= 2 && ["bump", "upgrade", "and"].contains(&words[i - 2])
                {
                    Some((words[i - 1], i + 1))
                } else if words[i] == "target" && words.get(i + 1) == Some(&"Kubernetes") {
                    Some(("Kubernetes", i + 2))
                } else {
                    None
                };
            let Some((subject, mut at)) = lead else {
                continue;
            };
            if words.get(at) == Some(&">=") {
                at += 1;
            }
            let Some(text) = words.get(at) else { continue };
            let text = text
                .trim_start_matches(">=")
                .trim_end_matches([',', ';', ':', ')']);
            // Talos and Kubernetes hints are about the running (base) version; component
            // hints about the head's, which is the version that fails.
            let (head, base) = (&b.head.spec, &b.base.spec);
            let current = match subject {
                "Talos" => Some(base.talos.clone()),
                "Kubernetes" => Some(base.kubernetes.clone()),
                name if head.cni.name == name => Some(head.cni.version.clone()),
                name => head
                    .addons
                    .iter()
                    .find(|a| a.name == name)
                    .map(|a| a.version.clone()),
            };
            if let Some(current) = current {
                out.push((subject.to_string(), text.to_string(), current));
            }
        }
        out
    }

    /// `text` is newer than `current`: a minor ("1.19") beyond its minor, or a version above it.
    fn is_forward(text: &str, current: &Version) -> bool {
        if text.matches('.').count() == 1 {
            MinorVersion::parse(text).unwrap() > current.minor_version()
        } else {
            Version::parse(text).unwrap() > *current
        }
    }

    #[test]
    fn no_hint_ever_points_backwards() {
        // The shipped data, and data with the pre-correction Longhorn row and a blocker
        // whose requirement a newer version can never meet.
        let wrong = Policies::load(&[(
            "policies/wrong.yaml".to_string(),
            "compatibility:\n  - component: longhorn\n    version: \"1.12\"\n    disabled: true\n    kubernetes: {min: \"1.25\"}\n    source: x\n  - component: longhorn\n    version: \">=1.12.1, <1.13.0\"\n    kubernetes: {min: \"1.34\"}\n    source: x\nblockers:\n  - id: odd\n    kubernetes: \">=1.30\"\n    requires: [{component: cilium, version: \"<1.19\"}, {component: rook, version: \">=1.20\"}]\n    message: m\n    source: s\n".to_string(),
        )])
        .unwrap();
        let today = Context::at(day("2026-12-01"));
        let mut checked = 0;
        for policies in [p(), wrong] {
            let mut check = |b: &Bump| {
                for item in evaluate_with(b, &policies, None, &today) {
                    let Some(hint) = &item.hint else { continue };
                    for (subject, text, current) in hint_targets(hint, b) {
                        checked += 1;
                        assert!(
                            is_forward(&text, &current),
                            "{}: hint points {subject} back to {text} from {current}: {hint}",
                            item.id
                        );
                    }
                }
            };
            // Every row's versions against every Kubernetes step, staying and moving.
            let versions: Vec<(String, String)> = policies
                .compatibility
                .iter()
                .filter(|r| r.version != VersionMatch::Any)
                .flat_map(|r| {
                    let (a, b, c) = r.version.interval().0;
                    [(a, b, c), (a, b, c + 3)]
                        .map(|(a, b, c)| (r.component.clone(), format!("{a}.{b}.{c}")))
                })
                .collect();
            for k in 25..=39u64 {
                let (k0, k1) = (format!("v1.{}.4", k - 1), format!("v1.{k}.2"));
                let talos = policies
                    .talos
                    .iter()
                    .find(|r| {
                        r.kubernetes.contains(MinorVersion::new(1, k - 1))
                            && r.kubernetes.contains(MinorVersion::new(1, k))
                    })
                    .map(|r| format!("v{}.3", r.version))
                    .unwrap_or_else(|| "v1.13.9".into());
                for (i, (c, ver)) in versions.iter().enumerate() {
                    let is_cni = ["cilium", "calico", "flannel"].contains(&c.as_str());
                    let this = format!("{c}@v{ver}");
                    let prev = versions
                        .get(i.wrapping_sub(1))
                        .filter(|(pc, _)| pc == c)
                        .map(|(pc, pv)| format!("{pc}@v{pv}"))
                        .unwrap_or_else(|| this.clone());
                    let (cni0, cni1, add0, add1) = if is_cni {
                        (prev.clone(), this.clone(), vec![], vec![])
                    } else {
                        (
                            "cilium@1.18.3".into(),
                            "cilium@1.18.3".into(),
                            vec![prev.as_str()],
                            vec![this.as_str()],
                        )
                    };
                    // Kubernetes moves with the component staying, and with it moving.
                    check(&bump(
                        rs(&talos, &k0, &cni1, &add1),
                        rs(&talos, &k1, &cni1, &add1),
                    ));
                    check(&bump(
                        rs(&talos, &k0, &cni0, &add0),
                        rs(&talos, &k1, &cni1, &add1),
                    ));
                }
            }
            // Talos against Kubernetes: every pair of minors one or two apart.
            for t in 7..=15u64 {
                for step in 0..=2u64 {
                    for k in 24..=39u64 {
                        let (t0, t1) = (format!("v1.{t}.2"), format!("v1.{}.1", t + step));
                        let (k0, k1) = (format!("v1.{k}.3"), format!("v1.{}.1", k + step % 2));
                        check(&bump(
                            rs(
                                &t0,
                                &k0,
                                "cilium@1.18.3",
                                &["cert-manager@v1.17.2", "ingress-nginx@v1.15.1"],
                            ),
                            rs(
                                &t1,
                                &k1,
                                "cilium@1.18.3",
                                &["cert-manager@v1.17.2", "ingress-nginx@v1.15.1"],
                            ),
                        ));
                    }
                }
            }
        }
        assert!(checked > 1000, "only {checked} hint versions checked");
    }

    #[test]
    fn kube_proxy_is_judged_from_the_control_planes_configuration() {
        let bump = Bump::between(
            &rs("1.11.5", "1.33.5", "cilium@1.18.4", &[]),
            &rs("1.11.5", "1.34.1", "cilium@1.18.4", &[]),
        );
        let with = |enabled: bool| {
            let mut n = trap("cp-1", true, "1.11.5");
            if let Ok(c) = &mut n.config {
                c.kube_proxy_enabled = enabled;
            }
            n
        };
        let worker = {
            let mut n = trap("w-1", false, "1.11.5");
            n.config = Err("not read".into());
            n
        };
        let judged = |replaces: bool, nodes: &[TrapNode]| {
            let i = kube_proxy(&bump, replaces, nodes).expect("a Kubernetes bump is judged");
            (i.status, i.message)
        };
        assert_eq!(judged(false, &[with(true), worker.clone()]).0, Status::Pass);
        assert_eq!(judged(true, &[with(false), worker.clone()]).0, Status::Pass);
        let (s, m) = judged(true, &[with(true)]);
        assert_eq!(s, Status::Fail, "{m}");
        assert!(m.contains("cp-1") && m.contains("1.33.5"), "{m}");
        assert_eq!(judged(false, &[with(false)]).0, Status::Warn);
        let mut unread = with(true);
        unread.config = Err("PermissionDenied".into());
        assert_eq!(judged(false, &[unread]).0, Status::Wait);
        // Talos-only bumps do not move kube-proxy.
        let talos_only = Bump::between(
            &rs("1.11.5", "1.33.5", "cilium@1.18.4", &[]),
            &rs("1.11.6", "1.33.5", "cilium@1.18.4", &[]),
        );
        assert!(kube_proxy(&talos_only, true, &[with(true)]).is_none());
    }

    fn trap(name: &str, control_plane: bool, talos: &str) -> TrapNode {
        TrapNode {
            name: name.into(),
            control_plane,
            talos: Ok(v(talos)),
            config: Ok(TrapConfig {
                installer_image: Some((
                    format!("ghcr.io/siderolabs/installer:{talos}"),
                    "machine.install.image".into(),
                )),
                extra_kernel_args: vec![],
                grub_builds_cmdline: false,
                etcd_image: None,
                kube_proxy_enabled: true,
            }),
            booted_with_uki: Ok(Some(false)),
            etcd: control_plane.then(|| Ok(v("3.6.9"))),
        }
    }

    fn talos_bump(t0: &str, t1: &str) -> Bump {
        bump(
            rs(t0, "v1.34.2", "cilium@1.19.1", &[]),
            rs(t1, "v1.34.2", "cilium@1.19.1", &[]),
        )
    }

    fn with_args(
        mut n: TrapNode,
        grub_builds: bool,
        uki: Result<Option<bool>, String>,
    ) -> TrapNode {
        if let Ok(c) = &mut n.config {
            c.extra_kernel_args = vec!["console=ttyS1,115200".into(), "net.ifnames=0".into()];
            c.grub_builds_cmdline = grub_builds;
        }
        n.booted_with_uki = uki;
        n
    }

    #[test]
    fn extra_kernel_args_warn_for_grub_nodes_upgraded_through_lifecycle_service() {
        let b = talos_bump("v1.13.9", "v1.14.1");
        let nodes = vec![
            trap("cp-1", true, "v1.13.9"),
            with_args(trap("w-1", false, "v1.13.9"), true, Ok(Some(false))),
            // systemd-boot boots the UKI's own command line.
            with_args(trap("w-2", false, "v1.13.9"), true, Ok(Some(true))),
            // The boot loader is not reported: named, as "on GRUB nodes".
            with_args(
                trap("w-3", false, "v1.13.9"),
                true,
                Err("not supported".into()),
            ),
            // grubUseUKICmdline: true.
            with_args(trap("w-4", false, "v1.13.9"), false, Ok(Some(false))),
            // Already on the target: not upgraded by this change.
            with_args(trap("w-5", false, "v1.14.1"), true, Ok(Some(false))),
        ];
        let item = extra_kernel_args(&b, &nodes).unwrap();
        assert_eq!(item.id, "live/extra-kernel-args");
        assert_eq!(item.status, Status::Warn, "{}", item.message);
        let m = &item.message;
        assert!(
            m.contains("w-1 (booted by GRUB; extraKernelArgs: console=ttyS1,115200 net.ifnames=0)"),
            "{m}"
        );
        assert!(m.contains("on GRUB nodes") && m.contains("w-3"), "{m}");
        for quiet in ["w-2", "w-4", "w-5", "cp-1"] {
            assert!(!m.contains(quiet), "{quiet}: {m}");
        }
        assert!(
            m.contains("internal/app/lifecycle/lifecycle.go@v1.13.9"),
            "{m}"
        );
        let hint = item.hint.unwrap_or_default();
        assert!(
            hint.contains("--legacy") && hint.contains("grubUseUKICmdline: true"),
            "{hint}"
        );

        // Onto 1.13 from 1.12: the legacy API passes them; the next upgrade will not.
        let b = talos_bump("v1.12.9", "v1.13.2");
        let nodes = vec![with_args(
            trap("w-1", false, "v1.12.9"),
            true,
            Ok(Some(false)),
        )];
        let item = extra_kernel_args(&b, &nodes).unwrap();
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        assert!(
            item.message
                .contains("w-1 (Talos v1.12.9) keep theirs this time"),
            "{}",
            item.message
        );
        // No Talos move, or a target before 1.13: nothing to judge.
        assert!(extra_kernel_args(&talos_bump("v1.13.9", "v1.13.9"), &nodes).is_none());
        assert!(extra_kernel_args(&talos_bump("v1.12.4", "v1.12.9"), &nodes).is_none());
        // A configuration that cannot be read is said so, never a pass.
        let mut unread = trap("w-9", false, "v1.13.9");
        unread.config = Err("PermissionDenied: not authorized".into());
        let item = extra_kernel_args(&talos_bump("v1.13.9", "v1.13.10"), &[unread]).unwrap();
        assert_eq!(item.status, Status::Warn);
        assert!(
            item.message.contains(
                "could not be judged for w-9 (its machine configuration: PermissionDenied"
            ),
            "{}",
            item.message
        );
    }

    #[test]
    fn etcd_older_than_3_6_blocks_talos_1_14_from_what_each_control_plane_runs() {
        let b = talos_bump("v1.13.9", "v1.14.1");
        let healthy = vec![
            trap("cp-1", true, "v1.13.9"),
            trap("cp-2", true, "v1.13.9"),
            trap("w-1", false, "v1.13.9"),
        ];
        let item = etcd_version(&b, &p(), &healthy).unwrap();
        assert_eq!(item.id, "live/etcd-version");
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        assert!(
            item.message.contains("cp-1 3.6.9") && !item.message.contains("w-1"),
            "{}",
            item.message
        );
        assert!(
            item.message.contains("hack/release.toml@v1.14.0-rc.1"),
            "{}",
            item.message
        );

        // A member on 3.5, and one whose configuration pins a 3.5 image.
        let mut old = healthy.clone();
        old[0].etcd = Some(Ok(v("3.5.21")));
        if let Ok(c) = &mut old[1].config {
            c.etcd_image = Some("registry.k8s.io/etcd:v3.5.17@sha256:abc".into());
        }
        let item = etcd_version(&b, &p(), &old).unwrap();
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert!(
            item.message.contains("cp-1 runs etcd 3.5.21"),
            "{}",
            item.message
        );
        assert!(
            item.message
                .contains("cp-2 pins .cluster.etcd.image registry.k8s.io/etcd:v3.5.17"),
            "{}",
            item.message
        );
        assert!(
            item.message.contains("only etcd 3.6 or later"),
            "{}",
            item.message
        );
        let hint = item.hint.unwrap_or_default();
        assert!(
            hint.contains("while on Talos v1.13.9")
                && hint.contains("Talos 1.13's default is 3.6.9"),
            "{hint}"
        );

        // EtcdStatus unreadable: the pin, else the running release's default.
        let mut fallback = healthy.clone();
        fallback[0].etcd = Some(Err("Unavailable: node rebooting".into()));
        let item = etcd_version(&b, &p(), &fallback).unwrap();
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        assert!(
            item.message
                .contains("cp-1 3.6.9 (Talos v1.13.9's default)"),
            "{}",
            item.message
        );
        fallback[0].talos = Ok(v("v1.10.7"));
        let item = etcd_version(&b, &p(), &fallback).unwrap();
        assert_eq!(item.status, Status::Fail, "{}", item.message);
        assert!(
            item.message.contains("default etcd is 3.5.21"),
            "{}",
            item.message
        );
        // Nothing to judge by: wait, never pass.
        fallback[0].config = Err("PermissionDenied: not authorized".into());
        let item = etcd_version(&b, &p(), &fallback).unwrap();
        assert_eq!(item.status, Status::Wait, "{}", item.message);
        assert!(
            item.message.contains("cp-1 (EtcdStatus: Unavailable"),
            "{}",
            item.message
        );

        // Only a move to a Talos with an etcd minimum is judged.
        assert!(etcd_version(&talos_bump("v1.12.9", "v1.13.2"), &p(), &old).is_none());
        assert!(etcd_version(&talos_bump("v1.14.0", "v1.14.0"), &p(), &old).is_none());
    }

    #[test]
    fn installer_images_the_nodes_name_are_judged_when_cluster_yaml_names_none() {
        let b = talos_bump("v1.13.9", "v1.14.1");
        let ghcr = vec![trap("cp-1", true, "v1.13.9"), trap("w-1", false, "v1.13.9")];
        let item = installer_images(&b, &p(), None, &ghcr).unwrap();
        assert_eq!(item.id, "live/installer-image");
        assert_eq!(item.status, Status::Warn, "{}", item.message);
        assert!(
            item.message
                .contains("cp-1 (machine.install.image: ghcr.io/siderolabs/installer:v1.13.9)"),
            "{}",
            item.message
        );
        assert!(
            item.message.contains("w-1") && item.message.contains("talos-1.14-no-ghcr-installer"),
            "{}",
            item.message
        );
        assert!(item.hint.unwrap_or_default().contains("factory.talos.dev"));

        // A 1.14 configuration keeps it in UnattendedInstallConfig.
        let factory = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.0";
        let mut multi = trap("w-2", false, "v1.14.0");
        if let Ok(c) = &mut multi.config {
            c.installer_image = Some((
                factory.into(),
                "UnattendedInstallConfig.installer.image".into(),
            ));
        }
        let item = installer_images(&b, &p(), None, &[multi.clone()]).unwrap();
        assert_eq!(item.status, Status::Pass, "{}", item.message);
        assert!(
            item.message
                .contains("w-2 (UnattendedInstallConfig.installer.image: factory.talos.dev/"),
            "{}",
            item.message
        );
        if let Ok(c) = &mut multi.config {
            c.installer_image = Some((
                "GHCR.io/siderolabs/installer:v1.14.0".into(),
                "UnattendedInstallConfig.installer.image".into(),
            ));
        }
        let item = installer_images(&b, &p(), None, &[multi.clone()]).unwrap();
        assert_eq!(item.status, Status::Warn, "{}", item.message);
        assert!(
            item.message
                .contains("w-2 (UnattendedInstallConfig.installer.image: GHCR.io"),
            "{}",
            item.message
        );

        // Unreadable or unnamed: could not be judged.
        let mut unnamed = trap("w-3", false, "v1.14.0");
        if let Ok(c) = &mut unnamed.config {
            c.installer_image = None;
        }
        let mut unread = trap("w-4", false, "v1.13.9");
        unread.config = Err("PermissionDenied: not authorized".into());
        let item = installer_images(&b, &p(), None, &[unnamed, unread]).unwrap();
        assert_eq!(item.status, Status::Warn, "{}", item.message);
        assert!(
            item.message.contains("could not judge")
                && item.message.contains("w-3 name no installer image")
                && item.message.contains("w-4 (PermissionDenied"),
            "{}",
            item.message
        );

        // cluster.yaml's image is the static note's to judge; before 1.14 nothing applies.
        assert!(installer_images(&b, &p(), Some("ghcr.io/siderolabs/installer"), &ghcr).is_none());
        assert!(installer_images(&talos_bump("v1.12.9", "v1.13.2"), &p(), None, &ghcr).is_none());
    }
}
