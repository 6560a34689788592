//! The maintainers' audit of the compatibility data (`ichor policies audit`): rows whose
//! source was last read more than N days ago or never, and component versions in a set of
//! release sets (the bundled fixtures) that no row covers. Pure: the caller passes `today`
//! and the release sets.

use std::collections::BTreeMap;

use crate::releaseset::ReleaseSet;

use super::data::{Confidence, Date, Policies};

/// One row of any section, as the audit sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `compatibility`, `talos`, `blocker`, `endOfLife`, `component`, `talosUpgradeNote`, `skew`.
    pub kind: &'static str,
    /// What the row is about: "cilium 1.18", "ingress-nginx-retired".
    pub key: String,
    pub origin: String,
    pub source: String,
    pub verified: Option<Date>,
    pub confidence: Option<Confidence>,
}

/// A component version some release set uses and no row covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncovered {
    pub component: String,
    pub version: String,
    /// What the data does say about the component, if anything.
    pub known: Option<String>,
    /// The release sets it appears in.
    pub seen_in: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Audit {
    pub today: Date,
    pub max_age_days: u32,
    pub rows: usize,
    /// Rows verified more than `max_age_days` ago, with their age in days, oldest first.
    pub stale: Vec<(Entry, i64)>,
    /// Rows with no `verified` date.
    pub never: Vec<Entry>,
    pub release_sets: usize,
    pub uncovered: Vec<Uncovered>,
}

/// Every row of `p`, in section order.
pub fn entries(p: &Policies) -> Vec<Entry> {
    let mut out = vec![Entry {
        kind: "skew",
        key: "version-skew rules".into(),
        origin: p.skew.origin.clone(),
        source: p.skew.source.clone(),
        verified: p.skew.verified,
        confidence: None,
    }];
    out.extend(p.talos.iter().map(|r| Entry {
        kind: "talos",
        key: format!("talos {}", r.version),
        origin: r.origin.clone(),
        source: r.source.clone(),
        verified: r.verified,
        confidence: Some(r.confidence),
    }));
    out.extend(p.compatibility.iter().map(|r| Entry {
        kind: "compatibility",
        key: format!("{} {}", r.component, r.version),
        origin: r.origin.clone(),
        source: r.source.clone(),
        verified: r.verified,
        confidence: Some(r.confidence),
    }));
    out.extend(p.blockers.iter().map(|b| Entry {
        kind: "blocker",
        key: b.id.clone(),
        origin: b.origin.clone(),
        source: b.source.clone(),
        verified: b.verified,
        confidence: Some(b.confidence),
    }));
    out.extend(p.end_of_life.iter().map(|r| Entry {
        kind: "endOfLife",
        key: format!("{} {}", r.component, r.version),
        origin: r.origin.clone(),
        source: r.source.clone(),
        verified: r.verified,
        confidence: Some(r.confidence),
    }));
    out.extend(p.components.iter().map(|c| Entry {
        kind: "component",
        key: c.component.clone(),
        origin: c.origin.clone(),
        source: c.source.clone(),
        verified: c.verified,
        confidence: Some(c.confidence),
    }));
    out.extend(p.talos_notes.iter().map(|n| Entry {
        kind: "talosUpgradeNote",
        key: n.id.clone(),
        origin: n.origin.clone(),
        source: n.source.clone(),
        verified: n.verified,
        confidence: Some(n.confidence),
    }));
    out.extend(p.latest_patches.iter().map(|r| Entry {
        kind: "latestPatch",
        key: format!("{} {}", r.component, r.version),
        origin: r.origin.clone(),
        source: r.source.clone(),
        verified: r.verified,
        confidence: Some(r.confidence),
    }));
    out
}

/// Audit `p` as of `today` against `release_sets` (label, release set).
pub fn audit(
    p: &Policies,
    today: Date,
    max_age_days: u32,
    release_sets: &[(String, ReleaseSet)],
) -> Audit {
    let all = entries(p);
    let rows = all.len();
    let mut stale = Vec::new();
    let mut never = Vec::new();
    for e in all {
        match e.verified {
            None => never.push(e),
            Some(d) => {
                let age = d.days_until(today);
                if age > i64::from(max_age_days) {
                    stale.push((e, age));
                }
            }
        }
    }
    stale.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.key.cmp(&b.0.key)));

    let mut missing: BTreeMap<(String, String), Uncovered> = BTreeMap::new();
    for (label, rs) in release_sets {
        let spec = &rs.spec;
        let mut gaps: Vec<(String, String)> = Vec::new();
        if p.talos_row(spec.talos.minor_version()).is_none() {
            gaps.push(("talos".into(), spec.talos.minor_version().to_string()));
        }
        for c in std::iter::once(&spec.cni).chain(&spec.addons) {
            if p.rows_for(&c.name, &c.version).next().is_none() {
                gaps.push((c.name.clone(), c.version.to_string()));
            }
        }
        for (component, version) in gaps {
            let known = p.component_info(&component).map(|i| i.describe());
            let entry = missing
                .entry((component.clone(), version.clone()))
                .or_insert_with(|| Uncovered {
                    component,
                    version,
                    known,
                    seen_in: Vec::new(),
                });
            if !entry.seen_in.contains(label) {
                entry.seen_in.push(label.clone());
            }
        }
    }
    Audit {
        today,
        max_age_days,
        rows,
        stale,
        never,
        release_sets: release_sets.len(),
        uncovered: missing.into_values().collect(),
    }
}

impl Audit {
    /// Whether anything needs a maintainer.
    pub fn is_clean(&self) -> bool {
        self.stale.is_empty() && self.never.is_empty() && self.uncovered.is_empty()
    }

    pub fn render_text(&self) -> String {
        let mut out = format!(
            "Policy audit on {}: {} rows; a source last read more than {} days ago is due for re-verification.\n",
            self.today, self.rows, self.max_age_days
        );
        let line = |e: &Entry| {
            let confidence = match e.confidence {
                Some(Confidence::Unconfirmed) => "  [unconfirmed]",
                _ => "",
            };
            format!(
                "  {:<16} {}{}\n      {}  source: {}\n",
                e.kind, e.key, confidence, e.origin, e.source
            )
        };
        out.push_str(&format!(
            "\nRows verified more than {} days ago ({}):\n",
            self.max_age_days,
            self.stale.len()
        ));
        for (e, age) in &self.stale {
            let verified = e.verified.map(|d| d.to_string()).unwrap_or_default();
            out.push_str(&line(e).replacen(
                "\n",
                &format!("  (verified {verified}, {age} days ago)\n"),
                1,
            ));
        }
        if self.stale.is_empty() {
            out.push_str("  none\n");
        }
        out.push_str(&format!(
            "\nRows never verified against their source ({}):\n",
            self.never.len()
        ));
        for e in &self.never {
            out.push_str(&line(e));
        }
        if self.never.is_empty() {
            out.push_str("  none\n");
        }
        out.push_str(&format!(
            "\nComponent versions in the {} release sets audited that no row covers ({}):\n",
            self.release_sets,
            self.uncovered.len()
        ));
        for u in &self.uncovered {
            out.push_str(&format!(
                "  {} {}  in {}\n",
                u.component,
                u.version,
                u.seen_in.join(", ")
            ));
            if let Some(k) = &u.known {
                out.push_str(&format!("      {k}\n"));
            }
        }
        if self.uncovered.is_empty() {
            out.push_str("  none\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn date(s: &str) -> Date {
        Date::parse(s).unwrap()
    }

    fn rs(cni: &str, addons: &str) -> ReleaseSet {
        ReleaseSet::parse(
            "t",
            &format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: t}}\nspec:\n  talos: v1.12.6\n  kubernetes: v1.33.5\n  cni: {cni}\n  addons: {addons}\n"),
        )
        .unwrap()
    }

    #[test]
    fn stale_and_never_verified_rows_are_listed_by_age() {
        let repo = vec![(
            "policies/local.yaml".to_string(),
            "compatibility:\n  - component: old-op\n    version: \"1.0\"\n    kubernetes: {min: \"1.30\"}\n    source: vendor page\n    verified: \"2026-01-01\"\n  - component: fresh-op\n    version: \"1.0\"\n    kubernetes: {min: \"1.30\"}\n    source: vendor page\n    verified: \"2026-11-30\"\n  - component: guess-op\n    version: \"1.0\"\n    kubernetes: {min: \"1.30\"}\n    source: a forum post\n".to_string(),
        )];
        let p = Policies::load(&repo).unwrap();
        let a = audit(&p, date("2026-12-01"), 90, &[]);
        let stale: Vec<&str> = a.stale.iter().map(|(e, _)| e.key.as_str()).collect();
        assert!(stale.contains(&"old-op 1.0"), "{stale:?}");
        assert!(!stale.contains(&"fresh-op 1.0"), "{stale:?}");
        let old = a.stale.iter().find(|(e, _)| e.key == "old-op 1.0").unwrap();
        assert_eq!(old.1, 334);
        assert!(a.never.iter().any(|e| e.key == "guess-op 1.0"));
        // A longer window makes the January row current.
        let a = audit(&p, date("2026-12-01"), 400, &[]);
        assert!(a.stale.iter().all(|(e, _)| e.key != "old-op 1.0"));
        assert!(a.render_text().contains("guess-op 1.0"));
    }

    #[test]
    fn shipped_confirmed_rows_are_all_verified() {
        let p = Policies::shipped().unwrap();
        let a = audit(&p, date("2026-12-01"), 3650, &[]);
        let confirmed_never: Vec<&Entry> = a
            .never
            .iter()
            .filter(|e| e.confidence.is_none_or(|c| c.is_confirmed()))
            .collect();
        assert!(
            confirmed_never.is_empty(),
            "every confirmed shipped row says when its source was read: {confirmed_never:#?}"
        );
    }

    #[test]
    fn release_set_versions_without_a_row_are_listed_once_with_where() {
        let p = Policies::shipped().unwrap();
        let sets = vec![
            (
                "a".to_string(),
                rs(
                    "{name: cilium, version: 1.18.3}",
                    "[{name: kube-vip, version: v0.9.1}, {name: longhorn, version: v1.10.3}]",
                ),
            ),
            (
                "b".to_string(),
                rs(
                    "{name: cilium, version: 1.30.0}",
                    "[{name: kube-vip, version: v0.9.1}]",
                ),
            ),
        ];
        let a = audit(&p, date("2026-12-01"), 90, &sets);
        let kv = a
            .uncovered
            .iter()
            .find(|u| u.component == "kube-vip")
            .unwrap();
        assert_eq!(kv.seen_in, ["a", "b"]);
        assert!(kv
            .known
            .as_deref()
            .unwrap_or("")
            .contains("no compatibility matrix"));
        assert!(a
            .uncovered
            .iter()
            .any(|u| u.component == "cilium" && u.version == "1.30.0"));
        assert!(a.uncovered.iter().all(|u| u.component != "longhorn"));
        assert_eq!(a.release_sets, 2);
    }
}
