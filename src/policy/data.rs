//! Compatibility data: what ichor knows about which versions work together. Shipped rows
//! live in `policies/*.yaml` (embedded at build time); a repository's own `policies/` folder
//! extends and overrides them. Every row names its source and, for shipped rows, the day that
//! source was last read (`verified`).
//!
//! Precedence: shipped files first, then the repository's files in path order. A row with
//! the same key as an earlier one replaces it (talos: `version`; compatibility and endOfLife:
//! `component` + `version`; components: `component`; blockers and talosUpgradeNotes: `id`;
//! skew: field by field). `disabled: true` removes the earlier row. Two rows with the same
//! key in one layer are an error.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::releaseset::{excerpt, locate, DocumentError, MinorVersion, Version};

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
    (
        "policies/lifecycle.yaml",
        include_str!("../../policies/lifecycle.yaml"),
    ),
    (
        "policies/releases.yaml",
        include_str!("../../policies/releases.yaml"),
    ),
];

/// A calendar day in UTC, written `YYYY-MM-DD`: when a row's source was read, when a release
/// line reaches end of life, and "today" as the caller's clock says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date {
    year: u16,
    month: u8,
    day: u8,
}

impl Date {
    pub fn new(year: u16, month: u8, day: u8) -> Option<Date> {
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        let days = match month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        (1..=days)
            .contains(&day)
            .then_some(Date { year, month, day })
    }

    pub fn parse(text: &str) -> Result<Date, String> {
        let bad = || {
            format!(
                "`{}` is not a date; write YYYY-MM-DD, e.g. \"2026-03-10\"",
                excerpt(text, 40)
            )
        };
        let b = text.as_bytes();
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return Err(bad());
        }
        let num = |r: std::ops::Range<usize>| {
            text.get(r)
                .filter(|s| s.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|s| s.parse::<u16>().ok())
        };
        let (y, m, d) = (
            num(0..4).ok_or_else(bad)?,
            num(5..7).ok_or_else(bad)?,
            num(8..10).ok_or_else(bad)?,
        );
        Date::new(y, m as u8, d as u8).ok_or_else(|| format!("`{text}` is not a calendar day"))
    }

    /// Days since 1970-01-01 (Howard Hinnant's `days_from_civil`).
    pub fn days_since_epoch(self) -> i64 {
        let (m, d) = (i64::from(self.month), i64::from(self.day));
        let y = i64::from(self.year) - i64::from(m <= 2);
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// The day `days` days after 1970-01-01 (Hinnant's `civil_from_days`); years are clamped
    /// to 0..=9999 so any clock reading gives a printable date.
    pub fn from_days_since_epoch(days: i64) -> Date {
        let z = days.clamp(-719_468, 2_932_896) + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
        let year = (yoe + era * 400 + i64::from(month <= 2)).clamp(0, 9999) as u16;
        Date { year, month, day }
    }

    pub fn from_unix_millis(ms: u64) -> Date {
        Date::from_days_since_epoch((ms / 86_400_000) as i64)
    }

    /// Today in UTC by the system clock. Only the edges call this (the gate's entry point, the
    /// CLI); the checks take `today` as an argument so tests pass a fixed day.
    pub fn today_utc() -> Date {
        Date::from_unix_millis(crate::clock::Clock::system().now().as_millis())
    }

    /// Whole days from `self` to `later` (negative when `later` is earlier).
    pub fn days_until(self, later: Date) -> i64 {
        later.days_since_epoch() - self.days_since_epoch()
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

impl crate::releaseset::FromScalarText for Date {
    const EXPECTING: &'static str = "a date such as \"2026-03-10\"";
    fn from_text(text: &str) -> Result<Self, String> {
        Date::parse(text)
    }
    fn from_number(printed: &str) -> Result<Self, String> {
        Err(format!(
            "`{printed}` is not a date; write YYYY-MM-DD, e.g. \"2026-03-10\""
        ))
    }
}

impl<'de> Deserialize<'de> for Date {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::releaseset::deserialize_scalar(d)
    }
}

impl Serialize for Date {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

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

/// major.minor.patch of a release, the granularity version matches work at (pre-releases
/// are matched as their release).
pub type Release = (u64, u64, u64);

/// `1.19.0` for a release triple.
pub fn release_text((a, b, c): Release) -> String {
    format!("{a}.{b}.{c}")
}

fn release_of(v: &Version) -> Release {
    (v.major(), v.minor(), v.patch())
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

    /// The releases this match admits as a half-open interval `[lo, hi)` on
    /// major.minor.patch; `hi` is `None` without an upper bound. Comparators intersect.
    pub fn interval(&self) -> (Release, Option<Release>) {
        let req = match self {
            VersionMatch::Any => return ((0, 0, 0), None),
            VersionMatch::Minor(m) => {
                return (
                    (m.major, m.minor, 0),
                    Some((m.major, m.minor.saturating_add(1), 0)),
                )
            }
            VersionMatch::Req(req) => req,
        };
        let bump = |(a, b, c): Release, at: usize| -> Release {
            match at {
                0 => (a.saturating_add(1), 0, 0),
                1 => (a, b.saturating_add(1), 0),
                _ => (a, b, c.saturating_add(1)),
            }
        };
        let mut lo: Release = (0, 0, 0);
        let mut hi: Option<Release> = None;
        for c in &req.comparators {
            let v: Release = (c.major, c.minor.unwrap_or(0), c.patch.unwrap_or(0));
            // The last component the comparator names: 0 major, 1 minor, 2 patch.
            let last = match (c.minor, c.patch) {
                (None, _) => 0,
                (Some(_), None) => 1,
                _ => 2,
            };
            let (l, h): (Release, Option<Release>) = match c.op {
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
        (lo, hi)
    }

    /// Whether any release version can match (`>=1.18, <1.17` cannot). Pre-releases are
    /// matched as their release, so only major.minor.patch intervals matter.
    pub fn is_satisfiable(&self) -> bool {
        let (lo, hi) = self.interval();
        hi.is_none_or(|h| lo < h)
    }

    /// The lowest release this match admits that is newer than `v`, if any. A "bump to"
    /// hint may only point there: never at or below what the release set already has.
    pub fn lowest_above(&self, v: &Version) -> Option<Release> {
        let (lo, hi) = self.interval();
        let r = release_of(v);
        // A pre-release sits below its release, so the release itself is newer.
        let next = if v.semver().pre.is_empty() {
            (r.0, r.1, r.2.saturating_add(1))
        } else {
            r
        };
        let x = lo.max(next);
        hi.is_none_or(|h| x < h).then_some(x)
    }

    /// The first release after `v` that this match no longer admits (where a rule about
    /// these versions stops applying), if the match has an upper bound above `v`.
    pub fn first_release_after(&self, v: &Version) -> Option<Release> {
        self.interval().1.filter(|h| *h > release_of(v))
    }

    /// The lowest version this match admits, for ordering rows and writing hints.
    fn floor(&self) -> Option<Release> {
        match self {
            VersionMatch::Any => None,
            _ => Some(self.interval().0),
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
    /// How many minors a kubelet may lag the oldest apiserver at any time (the skew page's
    /// kubelet section: N-3 since 1.28).
    pub kubelet_max_older: u64,
    pub kubelet_newer_allowed: bool,
    pub source: String,
    pub verified: Option<Date>,
    pub origin: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SkewLayer {
    kubernetes_max_minor_step: Option<u64>,
    talos_max_minor_step: Option<u64>,
    kubelet_max_older_before_upgrade: Option<u64>,
    kubelet_max_older: Option<u64>,
    kubelet_newer_allowed: Option<bool>,
    source: Option<String>,
    verified: Option<Date>,
    #[serde(skip)]
    origin: Option<String>,
}

/// One Talos minor: the Kubernetes minors it supports and the oldest host it upgrades from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosRow {
    pub version: MinorVersion,
    pub kubernetes: KubeRange,
    #[serde(default)]
    pub upgrade_from: Option<Version>,
    /// The oldest etcd this Talos runs (`etcdMin`), from its release notes; a control plane
    /// on an older etcd blocks a move to this minor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_min: Option<Version>,
    /// The etcd a control plane of this minor runs when `cluster.etcd.image` pins none
    /// (`etcdDefault`: `constants.DefaultEtcdVersion` at the minor's .0 tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_default: Option<Version>,
    /// Where `etcdMin` and `etcdDefault` were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_source: Option<String>,
    pub source: String,
    /// The day `source` was last read and the row checked against it.
    #[serde(default)]
    pub verified: Option<Date>,
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
    /// Kubernetes patches below which a minor of the range is not supported, e.g.
    /// `["1.34.1"]`: Kubernetes 1.34 only from 1.34.1 (Flux).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_patch_min: Vec<Version>,
    pub source: String,
    #[serde(default)]
    pub verified: Option<Date>,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    #[serde(skip_deserializing)]
    pub origin: String,
}

/// Whether a row admits one Kubernetes version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admits {
    Yes,
    /// The Kubernetes minor is outside the row's range.
    OutOfRange,
    /// The minor is in range, but only from this patch on.
    BelowPatch(Version),
}

impl CompatRow {
    pub fn admits(&self, k8s: &Version) -> Admits {
        if !self.kubernetes.contains(k8s.minor_version()) {
            return Admits::OutOfRange;
        }
        match self
            .kubernetes_patch_min
            .iter()
            .find(|p| p.minor_version() == k8s.minor_version() && k8s < *p)
        {
            Some(p) => Admits::BelowPatch(p.clone()),
            None => Admits::Yes,
        }
    }

    /// The row's Kubernetes range, with its patch floors ("1.32–1.36, 1.34 from 1.34.1").
    pub fn range_text(&self) -> String {
        let mut s = self.kubernetes.to_string();
        for p in &self.kubernetes_patch_min {
            s.push_str(&format!(", {} from {}", p.minor_version(), p.normalized()));
        }
        s
    }
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
    /// Added to the computed hint, e.g. when the blocker concerns only some setups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    pub source: String,
    #[serde(default)]
    pub verified: Option<Date>,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    #[serde(skip_deserializing)]
    pub origin: String,
}

/// The day a component's release line (or Kubernetes or Talos minor: component `kubernetes`,
/// `talos`) stops getting fixes upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EolRow {
    pub component: String,
    pub version: VersionMatch,
    /// The last day of support; from this day on the line is past end of life.
    pub date: Date,
    pub source: String,
    #[serde(default)]
    pub verified: Option<Date>,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    #[serde(skip_deserializing)]
    pub origin: String,
}

/// What upstream publishes about a component's Kubernetes support, when it is not a matrix
/// ichor can turn into rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Matrix {
    /// Upstream publishes no compatibility matrix.
    None,
    /// Upstream publishes one; ichor has not verified it into rows yet.
    Unverified,
    /// Upstream publishes a support policy (e.g. "the latest three minors"), not a matrix.
    Policy,
}

/// Facts about a component as a whole: why ichor has no (or few) rows for it, and how its
/// versions are numbered. The checklist names them instead of "no compatibility data".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ComponentInfo {
    pub component: String,
    pub matrix: Matrix,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub source: String,
    #[serde(default)]
    pub verified: Option<Date>,
    /// Recorded for readers; the entry only ever produces warnings.
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    #[serde(skip_deserializing)]
    pub origin: String,
}

impl ComponentInfo {
    /// "upstream publishes no compatibility matrix for kube-vip", plus the note.
    pub fn describe(&self) -> String {
        let c = &self.component;
        let what = match self.matrix {
            Matrix::None => format!("upstream publishes no compatibility matrix for {c}"),
            Matrix::Unverified => format!(
                "upstream publishes a compatibility matrix for {c}, but ichor has not verified it into rows yet"
            ),
            Matrix::Policy => {
                format!("upstream publishes a support policy for {c}, not a Kubernetes matrix")
            }
        };
        match &self.note {
            Some(n) => format!("{what} ({n})"),
            None => what,
        }
    }
}

/// A Talos upgrade note the checklist raises as a warning when a Talos bump meets it.
/// Every condition given must hold, and Talos must move forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosNote {
    pub id: String,
    /// The bump crosses this release: base < `crosses` <= target (major.minor.patch, so a
    /// pre-release counts as its release).
    #[serde(default)]
    pub crosses: Option<Version>,
    /// The Talos the nodes run before the bump (the release set's base).
    #[serde(default)]
    pub from: Option<VersionMatch>,
    /// The target Talos.
    #[serde(default)]
    pub talos: Option<VersionMatch>,
    /// `cluster.yaml` `spec.talos.installerImage` is this image (without tag). Without an
    /// installer image to compare, the note does not apply.
    #[serde(default)]
    pub installer_image: Option<String>,
    pub message: String,
    #[serde(default)]
    pub hint: Option<String>,
    pub source: String,
    #[serde(default)]
    pub verified: Option<Date>,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing)]
    pub disabled: bool,
    #[serde(skip_deserializing)]
    pub origin: String,
}

/// The newest known patch of one Talos or Kubernetes minor: where a chained upgrade lands
/// when it passes through that minor (Talos: "upgrade to the latest patch release of all
/// intermediate minor releases", siderolabs/docs upgrading-talos.mdx).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LatestPatch {
    /// `talos` or `kubernetes`.
    pub component: String,
    pub version: MinorVersion,
    pub latest: Version,
    pub source: String,
    #[serde(default)]
    pub verified: Option<Date>,
    #[serde(default)]
    pub confidence: Confidence,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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
    #[serde(default, rename = "endOfLife")]
    end_of_life: Vec<EolRow>,
    #[serde(default)]
    components: Vec<ComponentInfo>,
    #[serde(default, rename = "talosUpgradeNotes")]
    talos_notes: Vec<TalosNote>,
    #[serde(default, rename = "latestPatches")]
    latest_patches: Vec<LatestPatch>,
}

/// Everything ichor knows, merged from the shipped data and the repository's overrides.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Policies {
    pub skew: SkewPolicy,
    pub talos: Vec<TalosRow>,
    pub compatibility: Vec<CompatRow>,
    pub blockers: Vec<Blocker>,
    pub end_of_life: Vec<EolRow>,
    pub components: Vec<ComponentInfo>,
    pub talos_notes: Vec<TalosNote>,
    pub latest_patches: Vec<LatestPatch>,
}

/// One layer of policy files: (path, text) pairs.
pub type PolicyLayer<'a> = &'a [(String, String)];

/// A version the hints may point to: the lowest one newer than the release set's that the
/// rows support, and how far that support is confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suggestion {
    /// "1.19" (a whole minor line) or "1.14.2".
    pub version: String,
    pub confidence: Confidence,
}

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

    /// The newest known patch of `component` (`talos` or `kubernetes`) at `minor`.
    pub fn latest_patch(&self, component: &str, minor: MinorVersion) -> Option<&LatestPatch> {
        self.latest_patches
            .iter()
            .find(|r| r.component == component && r.version == minor)
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

    pub fn component_info(&self, component: &str) -> Option<&ComponentInfo> {
        self.components.iter().find(|c| c.component == component)
    }

    /// The end-of-life row for `component` at `version` reached by `today` (the earliest
    /// date when several match).
    pub fn end_of_life_for(
        &self,
        component: &str,
        version: &Version,
        today: Date,
    ) -> Option<&EolRow> {
        self.end_of_life
            .iter()
            .filter(|r| r.component == component && r.version.matches(version) && r.date <= today)
            .min_by_key(|r| r.date)
    }

    /// Whether every row about `component` at `version` admits Kubernetes `k8s`; `None`
    /// without rows for that version.
    pub fn supports(&self, component: &str, version: &Version, k8s: &Version) -> Option<bool> {
        let mut rows = self.rows_for(component, version).peekable();
        rows.peek()?;
        Some(rows.all(|r| r.admits(k8s) == Admits::Yes))
    }

    /// Release floors of `component`'s rows newer than `above`, lowest first, each with the
    /// text a hint prints for it ("1.19" for a whole minor line, else "1.14.2").
    pub fn versions_above(&self, component: &str, above: &Version) -> Vec<(Version, String)> {
        let mut out: Vec<(Version, String)> = Vec::new();
        // Rows matching `above` hold nothing newer to point at, and `*` rows name no version.
        for r in self.compatibility.iter().filter(|r| {
            r.component == component && r.version != VersionMatch::Any && !r.version.matches(above)
        }) {
            let Some(lo) = r.version.lowest_above(above) else {
                continue;
            };
            let Ok(v) = Version::parse(&release_text(lo)) else {
                continue;
            };
            let text = match &r.version {
                VersionMatch::Minor(m) if (m.major, m.minor, 0) == lo => m.to_string(),
                _ => release_text(lo),
            };
            if !out.iter().any(|(o, _)| *o == v) {
                out.push((v, text));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The lowest version of `component` newer than `above` (the release set's) whose rows
    /// support Kubernetes `k8s`, for hints. Never a version at or below `above`: when only
    /// older versions support `k8s`, there is nothing to bump to and this is `None`.
    pub fn lowest_supporting(
        &self,
        component: &str,
        k8s: &Version,
        above: &Version,
    ) -> Option<Suggestion> {
        self.versions_above(component, above)
            .into_iter()
            .find(|(v, _)| self.supports(component, v, k8s) == Some(true))
            .map(|(v, text)| Suggestion {
                version: text,
                confidence: self
                    .rows_for(component, &v)
                    .map(|r| r.confidence)
                    .max()
                    .unwrap_or_default(),
            })
    }
}

#[derive(Default)]
struct Merged {
    skew: SkewLayer,
    talos: BTreeMap<MinorVersion, TalosRow>,
    compatibility: BTreeMap<(String, String), CompatRow>,
    blockers: BTreeMap<String, Blocker>,
    end_of_life: BTreeMap<(String, String), EolRow>,
    components: BTreeMap<String, ComponentInfo>,
    talos_notes: BTreeMap<String, TalosNote>,
    latest_patches: BTreeMap<(String, MinorVersion), LatestPatch>,
}

/// Insert or (with `disabled`) remove a row by key.
fn put<K: Ord, V>(map: &mut BTreeMap<K, V>, key: K, row: V, disabled: bool) {
    if disabled {
        map.remove(&key);
    } else {
        map.insert(key, row);
    }
}

impl Merged {
    fn apply_layer(&mut self, files: PolicyLayer) -> Result<(), DocumentError> {
        // Keys seen in this layer, to refuse duplicates within one layer.
        let mut talos_seen = BTreeMap::new();
        let mut compat_seen = BTreeMap::new();
        let mut blocker_seen = BTreeMap::new();
        let mut eol_seen = BTreeMap::new();
        let mut component_seen = BTreeMap::new();
        let mut note_seen = BTreeMap::new();
        let mut patch_seen = BTreeMap::new();
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
                l.kubelet_max_older = s.kubelet_max_older.or(l.kubelet_max_older);
                l.kubelet_newer_allowed = s.kubelet_newer_allowed.or(l.kubelet_newer_allowed);
                if s.source.is_some() {
                    // The source and its verification date travel together.
                    l.source = s.source;
                    l.verified = s.verified;
                    l.origin = Some(path.clone());
                }
            }
            for mut row in file.talos {
                let key = row.version;
                duplicate(
                    &mut talos_seen,
                    key,
                    path,
                    text,
                    "talos",
                    &format!("version: \"{key}\""),
                    || format!("talos row for {key}"),
                )?;
                row.origin = path.clone();
                let off = row.disabled;
                put(&mut self.talos, key, row, off);
            }
            for mut row in file.compatibility {
                let key = (row.component.clone(), row.version.to_string());
                duplicate(
                    &mut compat_seen,
                    key.clone(),
                    path,
                    text,
                    "compatibility",
                    &format!("component: {}", row.component),
                    || format!("compatibility row for {} {}", key.0, key.1),
                )?;
                row.origin = path.clone();
                let off = row.disabled;
                put(&mut self.compatibility, key, row, off);
            }
            for mut b in file.blockers {
                let key = b.id.clone();
                duplicate(
                    &mut blocker_seen,
                    key.clone(),
                    path,
                    text,
                    "blockers",
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
                let off = b.disabled;
                put(&mut self.blockers, key, b, off);
            }
            for mut row in file.end_of_life {
                let key = (row.component.clone(), row.version.to_string());
                duplicate(
                    &mut eol_seen,
                    key.clone(),
                    path,
                    text,
                    "endOfLife",
                    &format!("component: {}", row.component),
                    || format!("endOfLife row for {} {}", key.0, key.1),
                )?;
                row.origin = path.clone();
                let off = row.disabled;
                put(&mut self.end_of_life, key, row, off);
            }
            for mut c in file.components {
                let key = c.component.clone();
                duplicate(
                    &mut component_seen,
                    key.clone(),
                    path,
                    text,
                    "components",
                    &format!("component: {key}"),
                    || format!("components entry for {key}"),
                )?;
                c.origin = path.clone();
                let off = c.disabled;
                put(&mut self.components, key, c, off);
            }
            for mut n in file.talos_notes {
                let key = n.id.clone();
                duplicate(
                    &mut note_seen,
                    key.clone(),
                    path,
                    text,
                    "talosUpgradeNotes",
                    &format!("id: {key}"),
                    || format!("talosUpgradeNotes entry `{key}`"),
                )?;
                n.origin = path.clone();
                let off = n.disabled;
                put(&mut self.talos_notes, key, n, off);
            }
            for mut r in file.latest_patches {
                let key = (r.component.clone(), r.version);
                duplicate(
                    &mut patch_seen,
                    key.clone(),
                    path,
                    text,
                    "latestPatches",
                    &format!("version: \"{}\"", r.version),
                    || format!("latestPatches row for {} {}", key.0, key.1),
                )?;
                r.origin = path.clone();
                let off = r.disabled;
                put(&mut self.latest_patches, key, r, off);
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
            kubelet_max_older: s.kubelet_max_older.unwrap_or(3),
            kubelet_newer_allowed: s.kubelet_newer_allowed.unwrap_or(false),
            source: s.source.unwrap_or_else(|| "ichor defaults".into()),
            verified: s.verified,
            origin: s.origin.unwrap_or_default(),
        };
        let by_floor = |a: &VersionMatch, b: &VersionMatch| a.floor().cmp(&b.floor());
        let mut compatibility: Vec<CompatRow> = self.compatibility.into_values().collect();
        compatibility.sort_by(|a, b| {
            a.component
                .cmp(&b.component)
                .then(by_floor(&a.version, &b.version))
        });
        let mut end_of_life: Vec<EolRow> = self.end_of_life.into_values().collect();
        end_of_life.sort_by(|a, b| {
            a.component
                .cmp(&b.component)
                .then(by_floor(&a.version, &b.version))
        });
        Ok(Policies {
            skew,
            talos: self.talos.into_values().collect(),
            compatibility,
            blockers: self.blockers.into_values().collect(),
            end_of_life,
            components: self.components.into_values().collect(),
            talos_notes: self.talos_notes.into_values().collect(),
            latest_patches: self.latest_patches.into_values().collect(),
        })
    }
}

/// Like [`locate`], but counting only lines after the top-level `section:` key, so a needle
/// shared by two sections (`component: x`) points into the right one.
fn locate_in(text: &str, section: &str, needle: &str, nth: usize) -> Option<(usize, usize)> {
    let header = format!("{section}:");
    let start = text
        .lines()
        .position(|l| l.starts_with(&header))
        .unwrap_or(0);
    let rest: String = text
        .lines()
        .skip(start)
        .take_while({
            let mut first = true;
            move |l| {
                // Stop at the next top-level key.
                let top = !first && !l.is_empty() && !l.starts_with([' ', '-', '#', '\t']);
                first = false;
                !top
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    locate(&rest, needle, nth)
        .or_else(|| locate(&rest, needle, 0))
        .map(|(l, c)| (l + start, c))
}

/// Refuse rows that contradict themselves, at their line: a Kubernetes range whose `min` is
/// above its `max`, a version match nothing can satisfy, a requirement of `*` (which any
/// version meets, so the hint it would produce means nothing), a patch floor outside its
/// row's range, a Talos note with no condition.
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
    let mut nth: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut at = |section: &'static str, needle: String| {
        let n = nth.entry((section, needle.clone())).or_insert(0);
        *n += 1;
        locate_in(text, section, &needle, *n - 1)
    };
    for r in &file.latest_patches {
        let pos = at("latestPatches", format!("version: \"{}\"", r.version));
        if r.component != "talos" && r.component != "kubernetes" {
            return Err(DocumentError::at(
                path,
                pos,
                format!(
                    "latestPatches row {} {}: component must be `talos` or `kubernetes`",
                    excerpt(&r.component, 40),
                    r.version
                ),
            ));
        }
        if r.latest.minor_version() != r.version {
            return Err(DocumentError::at(
                path,
                pos,
                format!(
                    "latestPatches row {} {}: latest {} is not a {} patch",
                    r.component, r.version, r.latest, r.version
                ),
            ));
        }
    }
    for row in &file.talos {
        let pos = at("talos", format!("version: \"{}\"", row.version));
        range(&row.kubernetes, format!("talos row {}", row.version), pos)?;
    }
    for row in &file.compatibility {
        let pos = at("compatibility", format!("component: {}", row.component));
        let what = format!("compatibility row {} {}", row.component, row.version);
        range(&row.kubernetes, what.clone(), pos)?;
        matches(&row.version, what.clone(), pos)?;
        if let Some(p) = row
            .kubernetes_patch_min
            .iter()
            .find(|p| !row.kubernetes.contains(p.minor_version()))
        {
            return Err(DocumentError::at(
                path,
                pos,
                format!("{what}: kubernetesPatchMin {p} is for Kubernetes {}, outside the row's range {}", p.minor_version(), row.kubernetes),
            ));
        }
    }
    for b in &file.blockers {
        let pos = at("blockers", format!("id: {}", b.id));
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
    for row in &file.end_of_life {
        let pos = at("endOfLife", format!("component: {}", row.component));
        matches(
            &row.version,
            format!("endOfLife row {} {}", row.component, row.version),
            pos,
        )?;
    }
    for c in &file.components {
        at("components", format!("component: {}", c.component));
    }
    for n in &file.talos_notes {
        let pos = at("talosUpgradeNotes", format!("id: {}", n.id));
        let what = format!("talosUpgradeNotes `{}`", n.id);
        for m in [&n.from, &n.talos].into_iter().flatten() {
            matches(m, what.clone(), pos)?;
        }
        if n.crosses.is_none() && n.from.is_none() && n.talos.is_none() && !n.disabled {
            return Err(DocumentError::at(
                path,
                pos,
                format!("{what}: say when the note applies with `crosses` (a release the bump crosses), `from` (the Talos before) or `talos` (the target)"),
            ));
        }
        if let Some(image) = &n.installer_image {
            let last = image.rsplit('/').next().unwrap_or(image);
            if image.trim().is_empty() || last.contains(':') || image.contains('@') {
                return Err(DocumentError::at(
                    path,
                    pos,
                    format!("{what}: installerImage `{}` must be an image name without a tag or digest, as in cluster.yaml spec.talos.installerImage", excerpt(image, 80)),
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
    section: &str,
    needle: &str,
    what: impl Fn() -> String,
) -> Result<(), DocumentError> {
    let n = seen.entry(key).or_insert(0);
    *n += 1;
    if *n > 1 {
        return Err(DocumentError::at(
            path,
            locate_in(text, section, needle, *n - 1),
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
        let low = |c: &str, k8s: &str, above: &str| {
            p.lowest_supporting(c, &v(k8s), &v(above))
                .map(|s| s.version)
        };
        assert_eq!(low("cilium", "1.34.0", "1.18.3").as_deref(), Some("1.19"));
        assert_eq!(low("cilium", "1.99.0", "1.18.3"), None);
        // A patch split: the hint names the first patch that supports the target.
        assert_eq!(low("rook", "1.30.0", "1.14.1").as_deref(), Some("1.14.2"));
        assert_eq!(low("argocd", "1.34.0", "3.1.5").as_deref(), Some("3.1.11"));
        // Never at or below the release set's version, even when older versions support it.
        assert_eq!(low("cilium", "1.27.0", "1.18.3"), None);
        assert_eq!(low("cert-manager", "1.26.0", "1.17.2"), None);
    }

    #[test]
    fn a_wrong_row_cannot_make_the_hint_point_backwards() {
        // The Longhorn row as it was before the correction: 1.12.1+ needing Kubernetes 1.34.
        let repo = vec![(
            "policies/old.yaml".to_string(),
            "compatibility:\n  - component: longhorn\n    version: \"1.12\"\n    disabled: true\n    kubernetes: {min: \"1.25\"}\n    source: x\n  - component: longhorn\n    version: \">=1.12.1, <1.13.0\"\n    kubernetes: {min: \"1.34\"}\n    source: the pre-correction row\n".to_string(),
        )];
        let p = Policies::load(&repo).unwrap();
        assert_eq!(
            p.supports("longhorn", &v("1.12.2"), &v("1.33.5")),
            Some(false)
        );
        // Only 1.10.0-1.11.2 support 1.33: older than v1.12.2, so there is nothing to bump to.
        assert_eq!(
            p.lowest_supporting("longhorn", &v("1.33.5"), &v("1.12.2")),
            None
        );
    }

    #[test]
    fn dates_parse_strictly_and_count_days() {
        let d = |s: &str| Date::parse(s).unwrap();
        assert_eq!(d("2026-03-10").to_string(), "2026-03-10");
        assert!(d("2026-03-10") < d("2026-07-08"));
        assert_eq!(d("2026-08-22").days_until(d("2026-12-01")), 101);
        assert_eq!(d("2026-12-01").days_until(d("2026-08-22")), -101);
        assert_eq!(d("1970-01-01").days_since_epoch(), 0);
        assert_eq!(d("2024-02-29").days_until(d("2024-03-01")), 1);
        for bad in [
            "2026-02-29",
            "2026-13-01",
            "2026-00-10",
            "2026-3-10",
            "26-03-10",
            "2026-03-10T00:00:00Z",
            "２026-03-10",
            "",
        ] {
            assert!(Date::parse(bad).is_err(), "{bad}");
        }
        // Round trip through days, and the clock's millisecond form.
        for s in ["1970-01-01", "2000-02-29", "2026-12-01", "2100-03-01"] {
            assert_eq!(Date::from_days_since_epoch(d(s).days_since_epoch()), d(s));
        }
        assert_eq!(
            Date::from_unix_millis(1_796_083_200_000 + 3_600_000).to_string(),
            "2026-12-01"
        );
    }

    #[test]
    fn version_matches_point_forward_only() {
        let m = |t: &str| VersionMatch::parse(t).unwrap();
        let r = |t: &str, above: &str| m(t).lowest_above(&v(above)).map(release_text);
        assert_eq!(r(">=1.19", "1.18.3").as_deref(), Some("1.19.0"));
        assert_eq!(r(">=1.19", "1.19.4").as_deref(), Some("1.19.5"));
        assert_eq!(r("<1.20", "1.20.1"), None);
        assert_eq!(r("1.19", "1.20.0"), None);
        assert_eq!(r(">=1.20.0", "1.20.0-rc.1").as_deref(), Some("1.20.0"));
        let after = |t: &str, at: &str| m(t).first_release_after(&v(at)).map(release_text);
        assert_eq!(after("<0.16.0", "0.15.2").as_deref(), Some("0.16.0"));
        assert_eq!(after("1.18", "1.18.3").as_deref(), Some("1.19.0"));
        assert_eq!(after(">=1.0", "1.2.0"), None);
    }

    #[test]
    fn lifecycle_sections_load_override_and_disable() {
        let p = Policies::shipped().unwrap();
        let today = Date::parse("2026-12-01").unwrap();
        let eol = p
            .end_of_life_for("cert-manager", &v("v1.18.2"), today)
            .unwrap();
        assert_eq!(eol.date.to_string(), "2026-03-10");
        assert!(p
            .end_of_life_for("cert-manager", &v("v1.20.2"), today)
            .is_none());
        assert!(p
            .end_of_life_for(
                "cert-manager",
                &v("v1.19.1"),
                Date::parse("2026-07-07").unwrap()
            )
            .is_none());
        assert!(p.component_info("kube-vip").is_some());
        assert!(p
            .talos_notes
            .iter()
            .any(|n| n.id == "talos-1.14-no-ghcr-installer"));
        let repo = vec![(
            "policies/local.yaml".to_string(),
            "endOfLife:\n  - component: kubernetes\n    version: \"1.33\"\n    date: 2026-06-28\n    source: kubernetes.io releases page\n  - component: cert-manager\n    version: \"1.18\"\n    disabled: true\n    date: \"2026-03-10\"\n    source: x\ncomponents:\n  - component: kube-vip\n    matrix: unverified\n    note: our lab tracks it\n    source: us\ntalosUpgradeNotes:\n  - id: talos-1.13-nvidia-runtimeclass\n    disabled: true\n    message: x\n    source: x\n".to_string(),
        )];
        let p = Policies::load(&repo).unwrap();
        assert!(p
            .end_of_life_for("kubernetes", &v("v1.33.5"), today)
            .is_some());
        // The disabled 1.18 row leaves the general `<1.18.0` row, which 1.18.2 does not match.
        assert!(p
            .end_of_life_for("cert-manager", &v("v1.18.2"), today)
            .is_none());
        assert_eq!(
            p.component_info("kube-vip").unwrap().matrix,
            Matrix::Unverified
        );
        assert!(p
            .talos_notes
            .iter()
            .all(|n| n.id != "talos-1.13-nvidia-runtimeclass"));
    }

    #[test]
    fn bad_lifecycle_rows_are_refused_at_their_line() {
        let load =
            |text: &str| Policies::load(&[("policies/a.yaml".to_string(), text.to_string())]);
        let e = load("endOfLife:\n  - component: x\n    version: \"1.0\"\n    date: \"2026-02-30\"\n    source: s\n").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("not a calendar day"), "{e}");
        let e = load("compatibility:\n  - component: x\n    version: \"1.0\"\n    kubernetes: {min: \"1.30\"}\n    source: s\nendOfLife:\n  - component: x\n    version: \">=2, <1\"\n    date: \"2026-02-10\"\n    source: s\n").unwrap_err();
        assert_eq!(
            e.line,
            Some(7),
            "points into endOfLife, not compatibility: {e}"
        );
        let e = load("compatibility:\n  - component: flux\n    version: \"9.9\"\n    kubernetes: {min: \"1.35\"}\n    kubernetesPatchMin: [\"1.34.1\"]\n    source: s\n").unwrap_err();
        assert!(e.message.contains("outside the row's range"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
        let e = load("talosUpgradeNotes:\n  - id: n\n    message: m\n    source: s\n").unwrap_err();
        assert!(e.message.contains("say when the note applies"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
        let e = load("talosUpgradeNotes:\n  - id: n\n    talos: \">=1.14\"\n    installerImage: ghcr.io/siderolabs/installer:v1.14.0\n    message: m\n    source: s\n").unwrap_err();
        assert!(e.message.contains("without a tag"), "{e}");
        let e = load("components:\n  - component: a\n    matrix: none\n    source: s\n  - component: a\n    matrix: policy\n    source: s\n").unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        let e = load("compatibility:\n  - component: x\n    version: \"1.0\"\n    kubernetes: {min: \"1.30\"}\n    source: s\n    verified: 2026\n").unwrap_err();
        assert!(e.message.contains("not a date"), "{e}");
    }
}
