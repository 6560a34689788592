//! Compatibility data: what ichor knows about which versions work together. Shipped rows
//! live in `policies/*.yaml` (embedded at build time); a repository's own `policies/` folder
//! extends and overrides them. Every row names its source.
//!
//! Precedence: shipped files first, then the repository's files in path order. A row with
//! the same key as an earlier one replaces it (talos: `version`; compatibility:
//! `component` + `version`; blockers: `id`; skew: field by field). `disabled: true` removes
//! the earlier row. Two rows with the same key in one layer are an error.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::releaseset::{locate, DocumentError, MinorVersion, Version};

/// The policy files shipped inside the binary, by path.
pub const SHIPPED: &[(&str, &str)] = &[
    (
        "policies/kubernetes.yaml",
        include_str!("../../policies/kubernetes.yaml"),
    ),
    (
        "policies/talos.yaml",
        include_str!("../../policies/talos.yaml"),
    ),
    ("policies/cni.yaml", include_str!("../../policies/cni.yaml")),
    (
        "policies/addons.yaml",
        include_str!("../../policies/addons.yaml"),
    ),
    (
        "policies/blockers.yaml",
        include_str!("../../policies/blockers.yaml"),
    ),
];

/// How far a row can be trusted. Only `unconfirmed` changes the verdict: its failures are
/// warnings and its passes carry a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Confidence {
    #[default]
    Upstream,
    UpstreamMirror,
    Secondary,
    Unconfirmed,
}

impl Confidence {
    pub fn is_confirmed(self) -> bool {
        self != Confidence::Unconfirmed
    }
}

/// Inclusive range of Kubernetes minors; no `max` means no published upper bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeRange {
    pub min: MinorVersion,
    #[serde(default)]
    pub max: Option<MinorVersion>,
}

impl KubeRange {
    pub fn contains(&self, m: MinorVersion) -> bool {
        m >= self.min && self.max.is_none_or(|max| m <= max)
    }
}

impl fmt::Display for KubeRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.max {
            Some(max) if max == self.min => write!(f, "{}", self.min),
            Some(max) => write!(f, "{}–{}", self.min, max),
            None => write!(f, ">= {}", self.min),
        }
    }
}

/// Which versions of a component a row is about: `"1.18"` (every 1.18.x), a semver
/// requirement (`">=1.11.3, <1.12.0"`), an exact version (`"1.12.0"`) or `"*"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionMatch {
    Any,
    Minor(MinorVersion),
    Req(semver::VersionReq),
}

impl VersionMatch {
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t == "*" {
            return Ok(VersionMatch::Any);
        }
        let plain = t.strip_prefix('v').unwrap_or(t);
        if plain.split('.').count() == 2 && plain.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return MinorVersion::parse(plain)
                .map(VersionMatch::Minor)
                .map_err(|e| e.to_string());
        }
        if plain.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            // A bare version means exactly that version.
            return semver::VersionReq::parse(&format!("={plain}"))
                .map(VersionMatch::Req)
                .map_err(|e| format!("invalid version `{t}`: {e}"));
        }
        semver::VersionReq::parse(t)
            .map(VersionMatch::Req)
            .map_err(|e| format!("invalid version requirement `{t}`: {e}; expected \"1.18\", \">=1.11.3, <1.12.0\" or \"*\""))
    }

    pub fn matches(&self, v: &Version) -> bool {
        match self {
            VersionMatch::Any => true,
            VersionMatch::Minor(m) => v.minor_version() == *m,
            // Pre-releases match as their release would (1.37.0-rc.1 is a 1.37.0).
            VersionMatch::Req(r) => {
                let mut plain = v.semver().clone();
                plain.pre = semver::Prerelease::EMPTY;
                r.matches(&plain)
            }
        }
    }

    /// Whether any release version can match (`>=1.18, <1.17` cannot). Pre-releases are
    /// matched as their release, so only major.minor.patch intervals matter.
    pub fn is_satisfiable(&self) -> bool {
        let VersionMatch::Req(req) = self else {
            return true;
        };
        type V = (u64, u64, u64);
        let bump = |(a, b, c): V, at: usize| -> V {
            match at {
                0 => (a.saturating_add(1), 0, 0),
                1 => (a, b.saturating_add(1), 0),
                _ => (a, b, c.saturating_add(1)),
            }
        };
        let mut lo: V = (0, 0, 0);
        let mut hi: Option<V> = None;
        for c in &req.comparators {
            let v: V = (c.major, c.minor.unwrap_or(0), c.patch.unwrap_or(0));
            // The last component the comparator names: 0 major, 1 minor, 2 patch.
            let last = match (c.minor, c.patch) {
                (None, _) => 0,
                (Some(_), None) => 1,
                _ => 2,
            };
            let (l, h): (V, Option<V>) = match c.op {
                semver::Op::GreaterEq => (v, None),
                semver::Op::Greater => (bump(v, last), None),
                semver::Op::Less => ((0, 0, 0), Some(v)),
                semver::Op::LessEq => ((0, 0, 0), Some(bump(v, last))),
                semver::Op::Exact | semver::Op::Wildcard => (v, Some(bump(v, last))),
                semver::Op::Tilde => (v, Some(bump(v, last.min(1)))),
                semver::Op::Caret => {
                    let first_nonzero = if v.0 > 0 || last == 0 {
                        0
                    } else if v.1 > 0 || last == 1 {
                        1
                    } else {
                        2
                    };
                    (v, Some(bump(v, first_nonzero)))
                }
                _ => continue,
            };
            lo = lo.max(l);
            hi = match (hi, h) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        hi.is_none_or(|h| lo < h)
    }

    /// The lowest version this match admits, for ordering rows and writing hints.
    fn floor(&self) -> Option<semver::Version> {
        match self {
            VersionMatch::Any => None,
            VersionMatch::Minor(m) => Some(semver::Version::new(m.major, m.minor, 0)),
            VersionMatch::Req(r) => r
                .comparators
                .iter()
                .filter(|c| {
                    matches!(
                        c.op,
                        semver::Op::GreaterEq
                            | semver::Op::Exact
                            | semver::Op::Greater
                            | semver::Op::Caret
                            | semver::Op::Tilde
                    )
                })
                .map(|c| semver::Version::new(c.major, c.minor.unwrap_or(0), c.patch.unwrap_or(0)))
                .next(),
        }
    }
}

impl fmt::Display for VersionMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionMatch::Any => f.write_str("*"),
            VersionMatch::Minor(m) => write!(f, "{m}"),
            VersionMatch::Req(r) => write!(f, "{r}"),
        }
    }
}

impl crate::releaseset::FromScalarText for VersionMatch {
    const EXPECTING: &'static str =
        "a version match such as \"1.18\", \">=1.11.3, <1.12.0\" or \"*\"";
    fn from_text(text: &str) -> Result<Self, String> {
        VersionMatch::parse(text)
    }
    fn from_number(printed: &str) -> Result<Self, String> {
        Err(format!(
            "quote versions (\"{printed}\" may have lost a trailing zero)"
        ))
    }
}

impl<'de> Deserialize<'de> for VersionMatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::releaseset::deserialize_scalar(d)
    }
}

impl Serialize for VersionMatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Version-skew and upgrade-step rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkewPolicy {
    pub kubernetes_max_minor_step: u64,
    pub talos_max_minor_step: u64,
    pub kubelet_max_older_before_upgrade: u64,
    pub kubelet_newer_allowed: bool,
    pub source: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SkewLayer {
    kubernetes_max_minor_step: Option<u64>,
    talos_max_minor_step: Option<u64>,
    kubelet_max_older_before_upgrade: Option<u64>,
    kubelet_newer_allowed: Option<bool>,
    source: Option<String>,
}

/// One Talos minor: the Kubernetes minors it supports and the oldest host it upgrades from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosRow {
    pub version: MinorVersion,
    pub kubernetes: KubeRange,
    #[serde(default)]
    pub upgrade_from: Option<Version>,
    pub source: String,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    /// Which file the row came from (filled in on load).
    #[serde(skip_deserializing)]
    pub origin: String,
}

/// One component version range and the Kubernetes minors it supports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CompatRow {
    pub component: String,
    pub version: VersionMatch,
    pub kubernetes: KubeRange,
    pub source: String,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    #[serde(skip_deserializing)]
    pub origin: String,
}

/// A version another component must have, e.g. `{component: cilium, version: ">=1.19"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub component: String,
    pub version: VersionMatch,
}

/// A rule that holds an upgrade, e.g. "core 1.37 is blocked on cilium >= 1.19 and
/// cloudnative-pg >= 1.30", or "ingress-nginx blocks Kubernetes >= 1.36".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Blocker {
    pub id: String,
    /// Target Kubernetes versions the blocker applies to.
    #[serde(default)]
    pub kubernetes: Option<VersionMatch>,
    /// Target Talos versions the blocker applies to.
    #[serde(default)]
    pub talos: Option<VersionMatch>,
    /// The blocker applies only while this component is in the release set…
    #[serde(default)]
    pub component: Option<String>,
    /// …at a version matching this.
    #[serde(default)]
    pub version: Option<VersionMatch>,
    /// What must hold first. Empty: the blocker holds as long as it applies.
    #[serde(default)]
    pub requires: Vec<Requirement>,
    pub message: String,
    pub source: String,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    #[serde(skip_deserializing)]
    pub origin: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    skew: Option<SkewLayer>,
    #[serde(default)]
    talos: Vec<TalosRow>,
    #[serde(default)]
    compatibility: Vec<CompatRow>,
    #[serde(default)]
    blockers: Vec<Blocker>,
}

/// Everything ichor knows, merged from the shipped data and the repository's overrides.
#[derive(Debug, Clone, Serialize)]
pub struct Policies {
    pub skew: SkewPolicy,
    pub talos: Vec<TalosRow>,
    pub compatibility: Vec<CompatRow>,
    pub blockers: Vec<Blocker>,
}

/// One layer of policy files: (path, text) pairs.
pub type PolicyLayer<'a> = &'a [(String, String)];

impl Policies {
    /// The data shipped in the binary.
    pub fn shipped() -> Result<Policies, DocumentError> {
        Self::load(&[])
    }

    /// Shipped data overridden by the repository's `policies/**` files (path, text).
    pub fn load(repo_files: PolicyLayer) -> Result<Policies, DocumentError> {
        let shipped: Vec<(String, String)> = SHIPPED
            .iter()
            .map(|(p, t)| (format!("(shipped) {p}"), t.to_string()))
            .collect();
        let mut merged = Merged::default();
        merged.apply_layer(&shipped)?;
        merged.apply_layer(repo_files)?;
        merged.finish()
    }

    pub fn talos_row(&self, minor: MinorVersion) -> Option<&TalosRow> {
        self.talos.iter().find(|r| r.version == minor)
    }

    /// Rows about `component` that match `version`.
    pub fn rows_for<'a>(
        &'a self,
        component: &'a str,
        version: &'a Version,
    ) -> impl Iterator<Item = &'a CompatRow> + 'a {
        self.compatibility
            .iter()
            .filter(move |r| r.component == component && r.version.matches(version))
    }

    pub fn knows_component(&self, component: &str) -> bool {
        self.compatibility.iter().any(|r| r.component == component)
    }

    /// The lowest known version of `component` whose rows support Kubernetes `k8s`, as a
    /// requirement text (">= 1.19"), for hints.
    pub fn lowest_supporting(&self, component: &str, k8s: MinorVersion) -> Option<String> {
        let mut rows: Vec<&CompatRow> = self
            .compatibility
            .iter()
            .filter(|r| r.component == component && r.kubernetes.contains(k8s))
            .collect();
        rows.sort_by_key(|r| r.version.floor());
        rows.first().map(|r| match &r.version {
            VersionMatch::Minor(m) => format!(">= {m}"),
            VersionMatch::Any => "any version".to_string(),
            VersionMatch::Req(req) => req.to_string(),
        })
    }
}

#[derive(Default)]
struct Merged {
    skew: SkewLayer,
    talos: BTreeMap<MinorVersion, TalosRow>,
    compatibility: BTreeMap<(String, String), CompatRow>,
    blockers: BTreeMap<String, Blocker>,
}

impl Merged {
    fn apply_layer(&mut self, files: PolicyLayer) -> Result<(), DocumentError> {
        // Keys seen in this layer, to refuse duplicates within one layer.
        let mut talos_seen = BTreeMap::new();
        let mut compat_seen = BTreeMap::new();
        let mut blocker_seen = BTreeMap::new();
        for (path, text) in files {
            let file: PolicyFile = if text.trim().is_empty() {
                PolicyFile::default()
            } else {
                crate::releaseset::yaml::parse(path, text)?
            };
            validate_file(path, text, &file)?;
            if let Some(s) = file.skew {
                let l = &mut self.skew;
                l.kubernetes_max_minor_step =
                    s.kubernetes_max_minor_step.or(l.kubernetes_max_minor_step);
                l.talos_max_minor_step = s.talos_max_minor_step.or(l.talos_max_minor_step);
                l.kubelet_max_older_before_upgrade = s
                    .kubelet_max_older_before_upgrade
                    .or(l.kubelet_max_older_before_upgrade);
                l.kubelet_newer_allowed = s.kubelet_newer_allowed.or(l.kubelet_newer_allowed);
                l.source = s.source.or(l.source.take());
            }
            for mut row in file.talos {
                let key = row.version;
                duplicate(
                    &mut talos_seen,
                    key,
                    path,
                    text,
                    &format!("version: \"{key}\""),
                    || format!("talos row for {key}"),
                )?;
                row.origin = path.clone();
                if row.disabled {
                    self.talos.remove(&key);
                } else {
                    self.talos.insert(key, row);
                }
            }
            for mut row in file.compatibility {
                let key = (row.component.clone(), row.version.to_string());
                duplicate(
                    &mut compat_seen,
                    key.clone(),
                    path,
                    text,
                    &format!("component: {}", row.component),
                    || format!("compatibility row for {} {}", key.0, key.1),
                )?;
                row.origin = path.clone();
                if row.disabled {
                    self.compatibility.remove(&key);
                } else {
                    self.compatibility.insert(key, row);
                }
            }
            for mut b in file.blockers {
                let key = b.id.clone();
                duplicate(
                    &mut blocker_seen,
                    key.clone(),
                    path,
                    text,
                    &format!("id: {key}"),
                    || format!("blocker `{key}`"),
                )?;
                if b.requires.is_empty() && b.component.is_none() && !b.disabled {
                    return Err(DocumentError::at(
                        path,
                        locate(text, &format!("id: {key}"), 0),
                        format!("blocker `{key}` needs `requires` (what must hold first) or `component` (whose presence blocks)"),
                    ));
                }
                b.origin = path.clone();
                if b.disabled {
                    self.blockers.remove(&key);
                } else {
                    self.blockers.insert(key, b);
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Policies, DocumentError> {
        let s = self.skew;
        let skew = SkewPolicy {
            kubernetes_max_minor_step: s.kubernetes_max_minor_step.unwrap_or(1),
            talos_max_minor_step: s.talos_max_minor_step.unwrap_or(1),
            kubelet_max_older_before_upgrade: s.kubelet_max_older_before_upgrade.unwrap_or(2),
            kubelet_newer_allowed: s.kubelet_newer_allowed.unwrap_or(false),
            source: s.source.unwrap_or_else(|| "ichor defaults".into()),
        };
        let mut compatibility: Vec<CompatRow> = self.compatibility.into_values().collect();
        compatibility.sort_by(|a, b| {
            a.component
                .cmp(&b.component)
                .then(a.version.floor().cmp(&b.version.floor()))
        });
        Ok(Policies {
            skew,
            talos: self.talos.into_values().collect(),
            compatibility,
            blockers: self.blockers.into_values().collect(),
        })
    }
}

/// Refuse rows that contradict themselves, at their line: a Kubernetes range whose `min` is
/// above its `max`, a version match nothing can satisfy, a requirement of `*` (which any
/// version meets, so the hint it would produce means nothing).
fn validate_file(path: &str, text: &str, file: &PolicyFile) -> Result<(), DocumentError> {
    let range = |r: &KubeRange, what: String, at: Option<(usize, usize)>| {
        match r.max {
        Some(max) if max < r.min => Err(DocumentError::at(
            path,
            at,
            format!("{what}: kubernetes.min {} is above kubernetes.max {max}; the range admits no Kubernetes", r.min),
        )),
        _ => Ok(()),
    }
    };
    let matches = |m: &VersionMatch, what: String, at: Option<(usize, usize)>| {
        if m.is_satisfiable() {
            Ok(())
        } else {
            Err(DocumentError::at(
                path,
                at,
                format!("{what}: `{m}` matches no version; write a range whose lower bound is below its upper bound, e.g. \">=1.18, <1.19\""),
            ))
        }
    };
    let mut nth: BTreeMap<String, usize> = BTreeMap::new();
    let mut at = |needle: String| {
        let n = nth.entry(needle.clone()).or_insert(0);
        *n += 1;
        locate(text, &needle, *n - 1).or_else(|| locate(text, &needle, 0))
    };
    for row in &file.talos {
        let pos = at(format!("version: \"{}\"", row.version));
        range(&row.kubernetes, format!("talos row {}", row.version), pos)?;
    }
    for row in &file.compatibility {
        let pos = at(format!("component: {}", row.component));
        let what = format!("compatibility row {} {}", row.component, row.version);
        range(&row.kubernetes, what.clone(), pos)?;
        matches(&row.version, what, pos)?;
    }
    for b in &file.blockers {
        let pos = at(format!("id: {}", b.id));
        let what = format!("blocker `{}`", b.id);
        for m in [&b.kubernetes, &b.talos, &b.version].into_iter().flatten() {
            matches(m, what.clone(), pos)?;
        }
        if b.version.is_some() && b.component.is_none() {
            return Err(DocumentError::at(
                path,
                pos,
                format!("{what}: `version` says which versions of `component` the blocker is about, but there is no `component`"),
            ));
        }
        for r in &b.requires {
            matches(&r.version, format!("{what} requires {}", r.component), pos)?;
            if r.version == VersionMatch::Any {
                return Err(DocumentError::at(
                    path,
                    pos,
                    format!("{what}: requiring {} `*` is met by every version, so it can never block; name the version that must be reached, e.g. \">=1.19\"", r.component),
                ));
            }
        }
    }
    Ok(())
}

/// Refuse the second row with `key` in one layer; count occurrences so the error points at
/// the repeated line.
fn duplicate<K: Ord>(
    seen: &mut BTreeMap<K, usize>,
    key: K,
    path: &str,
    text: &str,
    needle: &str,
    what: impl Fn() -> String,
) -> Result<(), DocumentError> {
    let n = seen.entry(key).or_insert(0);
    *n += 1;
    if *n > 1 {
        return Err(DocumentError::at(
            path,
            locate(text, needle, *n - 1).or_else(|| locate(text, needle, 0)),
            format!("{} is defined twice in this layer; keep one (a repository row with the same key overrides a shipped one)", what()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn shipped_data_loads_and_every_row_has_a_source() {
        let p = Policies::shipped().unwrap();
        assert!(p.talos.len() >= 8);
        assert!(p.compatibility.iter().all(|r| !r.source.is_empty()));
        assert!(p.talos.iter().all(|r| !r.source.is_empty()));
        assert_eq!(p.skew.kubernetes_max_minor_step, 1);
        let row = p.talos_row(MinorVersion::new(1, 13)).unwrap();
        assert!(row.kubernetes.contains(MinorVersion::new(1, 36)));
        assert!(!row.kubernetes.contains(MinorVersion::new(1, 37)));
    }

    #[test]
    fn version_matches() {
        assert!(VersionMatch::parse("1.18").unwrap().matches(&v("1.18.3")));
        assert!(!VersionMatch::parse("1.18").unwrap().matches(&v("1.19.0")));
        let r = VersionMatch::parse(">=1.11.3, <1.12.0").unwrap();
        assert!(r.matches(&v("v1.11.4")) && !r.matches(&v("1.11.2")));
        assert!(VersionMatch::parse("1.12.0").unwrap().matches(&v("1.12.0")));
        assert!(!VersionMatch::parse("1.12.0").unwrap().matches(&v("1.12.1")));
        assert!(VersionMatch::parse(">=1.36")
            .unwrap()
            .matches(&v("1.37.0-rc.1")));
        assert!(VersionMatch::parse("bogus").is_err());
    }

    #[test]
    fn repository_rows_override_extend_and_disable() {
        let repo = vec![(
            "policies/local.yaml".to_string(),
            "skew:\n  kubeletMaxOlderBeforeUpgrade: 1\ncompatibility:\n  - component: cilium\n    version: \"1.18\"\n    kubernetes: {min: \"1.30\", max: \"1.34\"}\n    source: our lab\n  - component: mycorp-operator\n    version: \"2.4\"\n    kubernetes: {min: \"1.35\"}\n    source: vendor mail\nblockers:\n  - id: ingress-nginx-retired\n    disabled: true\n    message: x\n    source: x\n".to_string(),
        )];
        let p = Policies::load(&repo).unwrap();
        assert_eq!(p.skew.kubelet_max_older_before_upgrade, 1);
        assert_eq!(
            p.skew.kubernetes_max_minor_step, 1,
            "other skew fields keep the shipped value"
        );
        let version = v("1.18.3");
        let cilium: Vec<_> = p.rows_for("cilium", &version).collect();
        assert_eq!(cilium.len(), 1);
        assert_eq!(cilium[0].kubernetes.max, Some(MinorVersion::new(1, 34)));
        assert_eq!(cilium[0].origin, "policies/local.yaml");
        assert!(p.knows_component("mycorp-operator"));
        assert!(p.blockers.iter().all(|b| b.id != "ingress-nginx-retired"));
    }

    #[test]
    fn a_duplicate_in_one_layer_is_an_error_with_its_line() {
        let repo = vec![(
            "policies/a.yaml".to_string(),
            "compatibility:\n  - component: x\n    version: \"1.0\"\n    kubernetes: {min: \"1.30\"}\n    source: s\n  - component: x\n    version: \"1.0\"\n    kubernetes: {min: \"1.31\"}\n    source: s\n".to_string(),
        )];
        let e = Policies::load(&repo).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("defined twice"), "{e}");
    }

    #[test]
    fn bad_policy_file_names_file_and_line() {
        let repo = vec![(
            "policies/a.yaml".to_string(),
            "talos:\n  - version: \"1.13\"\n    kubernetes: {min: 1.31}\n    source: s\n"
                .to_string(),
        )];
        let e = Policies::load(&repo).unwrap_err();
        assert_eq!(e.file, "policies/a.yaml");
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("quoted"), "{e}");
    }

    #[test]
    fn contradicting_rows_are_refused_at_their_line() {
        let load =
            |text: &str| Policies::load(&[("policies/a.yaml".to_string(), text.to_string())]);
        let e = load("compatibility:\n  - component: x\n    version: \"1.0\"\n    kubernetes: {min: \"1.30\"}\n    source: s\n  - component: x\n    version: \"1.1\"\n    kubernetes: {min: \"1.33\", max: \"1.31\"}\n    source: s\n").unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(
            e.message.contains("min 1.33 is above kubernetes.max 1.31"),
            "{e}"
        );
        let e = load("compatibility:\n  - component: cilium\n    version: \">=1.18, <1.17\"\n    kubernetes: {min: \"1.30\"}\n    source: s\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("matches no version"), "{e}");
        let e = load("blockers:\n  - id: b\n    kubernetes: \">=1.34\"\n    requires: [{component: cilium, version: \"*\"}]\n    message: m\n    source: s\n").unwrap_err();
        assert!(e.message.contains("met by every version"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
        let e = load("talos:\n  - version: \"1.13\"\n    kubernetes: {min: \"1.36\", max: \"1.30\"}\n    source: s\n").unwrap_err();
        assert!(e.message.contains("admits no Kubernetes"), "{e}");
    }

    #[test]
    fn satisfiable_matches() {
        let sat = |t: &str| VersionMatch::parse(t).unwrap().is_satisfiable();
        for t in [
            "*",
            "1.18",
            ">=1.18, <1.19",
            ">1.18.0, <1.18.2",
            "~1.2",
            "^0.3",
            "=1.2.3",
            "<=1.2, >=1.2.9",
            ">=1.0.0, <1.0.1",
        ] {
            assert!(sat(t), "{t}");
        }
        for t in [
            ">=1.18, <1.17",
            ">1.2.3, <1.2.4",
            ">=2, <1",
            "~1.2, >=1.3",
            "^1.2, <1.0",
            "=1.2.3, =1.2.4",
            ">1.2, <=1.2",
        ] {
            assert!(!sat(t), "{t}");
        }
    }

    #[test]
    fn lowest_supporting_version_for_hints() {
        let p = Policies::shipped().unwrap();
        assert_eq!(
            p.lowest_supporting("cilium", MinorVersion::new(1, 34))
                .as_deref(),
            Some(">= 1.19")
        );
        assert_eq!(
            p.lowest_supporting("cilium", MinorVersion::new(1, 99)),
            None
        );
    }
}
