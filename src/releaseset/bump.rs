//! The difference between two release sets: which components move, from what to what, and
//! how (patch, minor, major, downgrade, added, removed).

use std::fmt;

use serde::Serialize;

use super::document::ReleaseSet;
use super::version::Version;

/// Which piece of the release set a change is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "type", content = "name", rename_all = "lowercase")]
pub enum ComponentId {
    Talos,
    Kubernetes,
    Cni(String),
    Addon(String),
}

impl ComponentId {
    /// The name compatibility data knows the component by.
    pub fn name(&self) -> &str {
        match self {
            ComponentId::Talos => "talos",
            ComponentId::Kubernetes => "kubernetes",
            ComponentId::Cni(n) | ComponentId::Addon(n) => n,
        }
    }
}

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComponentId::Talos => f.write_str("Talos"),
            ComponentId::Kubernetes => f.write_str("Kubernetes"),
            ComponentId::Cni(n) => write!(f, "{n} (CNI)"),
            ComponentId::Addon(n) => f.write_str(n),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Same major.minor, higher patch (or pre-release to release).
    Patch,
    /// Same major, higher minor; `minors` says how many (1 = the next minor).
    Minor {
        minors: u64,
    },
    Major,
    Downgrade,
    Added,
    Removed,
}

impl fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChangeKind::Patch => f.write_str("patch"),
            ChangeKind::Minor { minors: 1 } => f.write_str("minor"),
            ChangeKind::Minor { minors } => write!(f, "minor (+{minors})"),
            ChangeKind::Major => f.write_str("major"),
            ChangeKind::Downgrade => f.write_str("downgrade"),
            ChangeKind::Added => f.write_str("added"),
            ChangeKind::Removed => f.write_str("removed"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub component: ComponentId,
    pub from: Option<Version>,
    pub to: Option<Version>,
    pub kind: ChangeKind,
}

/// JSON: `{"component": "kubernetes", "name": "kubernetes", "from": "v1.33.5", "to":
/// "v1.34.2", "kind": "minor", "minors": 1}`; `type` is talos|kubernetes|cni|addon.
impl Serialize for Change {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        let ty = match &self.component {
            ComponentId::Talos => "talos",
            ComponentId::Kubernetes => "kubernetes",
            ComponentId::Cni(_) => "cni",
            ComponentId::Addon(_) => "addon",
        };
        m.serialize_entry("type", ty)?;
        m.serialize_entry("name", self.component.name())?;
        m.serialize_entry("from", &self.from)?;
        m.serialize_entry("to", &self.to)?;
        let kind = match self.kind {
            ChangeKind::Patch => "patch",
            ChangeKind::Minor { .. } => "minor",
            ChangeKind::Major => "major",
            ChangeKind::Downgrade => "downgrade",
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
        };
        m.serialize_entry("kind", kind)?;
        if let ChangeKind::Minor { minors } = self.kind {
            m.serialize_entry("minors", &minors)?;
        }
        m.end()
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.from, &self.to) {
            (Some(a), Some(b)) => write!(f, "{} {} → {} ({})", self.component, a, b, self.kind),
            (None, Some(b)) => write!(f, "{} {} (added)", self.component, b),
            (Some(a), None) => write!(f, "{} {} (removed)", self.component, a),
            (None, None) => write!(f, "{}", self.component),
        }
    }
}

/// Everything that moves from `base` to `head`, plus both release sets for context.
#[derive(Debug, Clone, Serialize)]
pub struct Bump {
    pub base: ReleaseSet,
    pub head: ReleaseSet,
    pub changes: Vec<Change>,
}

fn classify(from: &Version, to: &Version) -> Option<ChangeKind> {
    use std::cmp::Ordering::*;
    match to.cmp(from) {
        Equal => None,
        Less => Some(ChangeKind::Downgrade),
        Greater if to.major() != from.major() => Some(ChangeKind::Major),
        Greater if to.minor() != from.minor() => Some(ChangeKind::Minor {
            minors: to.minor() - from.minor(),
        }),
        Greater => Some(ChangeKind::Patch),
    }
}

impl Bump {
    pub fn between(base: &ReleaseSet, head: &ReleaseSet) -> Bump {
        let mut changes = Vec::new();
        let mut moved = |component: ComponentId, from: Option<&Version>, to: Option<&Version>| {
            let kind = match (from, to) {
                (Some(a), Some(b)) => classify(a, b),
                (None, Some(_)) => Some(ChangeKind::Added),
                (Some(_), None) => Some(ChangeKind::Removed),
                (None, None) => None,
            };
            if let Some(kind) = kind {
                changes.push(Change {
                    component,
                    from: from.cloned(),
                    to: to.cloned(),
                    kind,
                });
            }
        };
        let (b, h) = (&base.spec, &head.spec);
        moved(ComponentId::Talos, Some(&b.talos), Some(&h.talos));
        moved(
            ComponentId::Kubernetes,
            Some(&b.kubernetes),
            Some(&h.kubernetes),
        );
        if b.cni.name == h.cni.name {
            moved(
                ComponentId::Cni(h.cni.name.clone()),
                Some(&b.cni.version),
                Some(&h.cni.version),
            );
        } else {
            moved(
                ComponentId::Cni(b.cni.name.clone()),
                Some(&b.cni.version),
                None,
            );
            moved(
                ComponentId::Cni(h.cni.name.clone()),
                None,
                Some(&h.cni.version),
            );
        }
        for a in &b.addons {
            let to = h
                .addons
                .iter()
                .find(|x| x.name == a.name)
                .map(|x| &x.version);
            moved(ComponentId::Addon(a.name.clone()), Some(&a.version), to);
        }
        for a in h
            .addons
            .iter()
            .filter(|a| !b.addons.iter().any(|x| x.name == a.name))
        {
            moved(ComponentId::Addon(a.name.clone()), None, Some(&a.version));
        }
        Bump {
            base: base.clone(),
            head: head.clone(),
            changes,
        }
    }

    pub fn change(&self, component: &ComponentId) -> Option<&Change> {
        self.changes.iter().find(|c| &c.component == component)
    }

    pub fn talos_moves(&self) -> bool {
        self.change(&ComponentId::Talos).is_some()
    }

    pub fn kubernetes_moves(&self) -> bool {
        self.change(&ComponentId::Kubernetes).is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// One line, e.g. "Talos v1.13.8 → v1.14.3, Kubernetes 1.35.4 → 1.35.6".
    pub fn summary(&self) -> String {
        if self.changes.is_empty() {
            return "no version changes".into();
        }
        self.changes
            .iter()
            .map(|c| match (&c.from, &c.to) {
                (Some(a), Some(b)) => format!("{} {a} → {b}", c.component.name()),
                (None, Some(b)) => format!("+{} {b}", c.component.name()),
                (Some(a), None) => format!("-{} {a}", c.component.name()),
                (None, None) => c.component.name().to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs(talos: &str, k8s: &str, cni: (&str, &str), addons: &[(&str, &str)]) -> ReleaseSet {
        let mut text = format!(
            "apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: t}}\nspec:\n  talos: {talos}\n  kubernetes: {k8s}\n  cni: {{name: {}, version: {}}}\n  addons:\n",
            cni.0, cni.1
        );
        for (n, v) in addons {
            text.push_str(&format!("    - {{name: {n}, version: {v}}}\n"));
        }
        if addons.is_empty() {
            text = text.replace("  addons:\n", "");
        }
        ReleaseSet::parse("t", &text).unwrap()
    }

    #[test]
    fn classifies_every_kind_of_move() {
        let base = rs(
            "v1.13.8",
            "v1.35.4",
            ("cilium", "1.19.6"),
            &[("cert-manager", "v1.20.0"), ("rook", "v1.19.0")],
        );
        let head = rs(
            "v1.14.1",
            "v1.35.2",
            ("cilium", "2.0.0"),
            &[("cert-manager", "v1.20.3"), ("flux", "v2.8.0")],
        );
        let bump = Bump::between(&base, &head);
        let kind = |c: ComponentId| bump.change(&c).map(|c| c.kind);
        assert_eq!(
            kind(ComponentId::Talos),
            Some(ChangeKind::Minor { minors: 1 })
        );
        assert_eq!(kind(ComponentId::Kubernetes), Some(ChangeKind::Downgrade));
        assert_eq!(
            kind(ComponentId::Cni("cilium".into())),
            Some(ChangeKind::Major)
        );
        assert_eq!(
            kind(ComponentId::Addon("cert-manager".into())),
            Some(ChangeKind::Patch)
        );
        assert_eq!(
            kind(ComponentId::Addon("rook".into())),
            Some(ChangeKind::Removed)
        );
        assert_eq!(
            kind(ComponentId::Addon("flux".into())),
            Some(ChangeKind::Added)
        );
    }

    #[test]
    fn skipped_minors_are_counted_and_v_spelling_is_not_a_change() {
        let base = rs("v1.13.8", "1.35.4", ("cilium", "1.19.6"), &[]);
        let head = rs("1.13.8", "v1.37.0", ("cilium", "v1.19.6"), &[]);
        let bump = Bump::between(&base, &head);
        assert_eq!(bump.changes.len(), 1, "{:?}", bump.changes);
        assert_eq!(bump.changes[0].kind, ChangeKind::Minor { minors: 2 });
    }

    #[test]
    fn a_cni_swap_is_a_removal_and_an_addition() {
        let bump = Bump::between(
            &rs("v1.13.8", "v1.35.4", ("flannel", "0.28.8"), &[]),
            &rs("v1.13.8", "v1.35.4", ("cilium", "1.19.6"), &[]),
        );
        let kinds: Vec<_> = bump.changes.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, vec![ChangeKind::Removed, ChangeKind::Added]);
    }
}
