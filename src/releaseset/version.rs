//! Versions as users write them: `v1.36.2` or `1.36.2`. The semantic version is normalised
//! (no `v`), the original spelling is kept for display, and image tags are built from the
//! normalised form so a tag can never come out as `vv1.36.2`.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::scalar::{self, FromScalar};

/// The longest version string accepted (`v1.36.2-rc.1` is 12).
pub const MAX_VERSION_LEN: usize = 64;
/// The largest major, minor or patch number accepted. Dates (20261201) fit; anything that
/// could make arithmetic on versions allocate, loop or overflow does not.
pub const MAX_VERSION_NUMBER: u64 = 999_999_999;

/// At most `max` characters of `text`, for error messages about hostile values: a 50 MB
/// value is never echoed back whole. Control characters are shown escaped.
pub fn excerpt(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Clone, Debug)]
pub struct Version {
    raw: String,
    semver: semver::Version,
}

impl Version {
    /// Parse `v1.2.3`, `1.2.3` or with a pre-release (`v1.37.0-rc.1`).
    ///
    /// Refused on purpose, each with its own reason: surrounding white space, an upper-case
    /// `V`, build metadata (`+a`: semver gives it no precedence and `+` cannot appear in an
    /// image tag), more than [`MAX_VERSION_LEN`] characters, or a number above
    /// [`MAX_VERSION_NUMBER`] (nothing downstream may compute with an unbounded number).
    pub fn parse(raw: &str) -> Result<Self, VersionError> {
        if raw.len() > MAX_VERSION_LEN {
            return Err(VersionError::new(
                raw,
                &format!("longer than {MAX_VERSION_LEN} characters"),
            ));
        }
        if raw.trim() != raw || raw.is_empty() {
            return Err(VersionError::new(
                raw,
                if raw.trim().is_empty() {
                    "it is empty"
                } else {
                    "it has white space around it"
                },
            ));
        }
        if raw.starts_with('V') {
            return Err(VersionError::new(
                raw,
                "the prefix must be a lower-case `v` (as in image tags)",
            ));
        }
        let body = raw.strip_prefix('v').unwrap_or(raw);
        if body.starts_with(['v', 'V']) {
            return Err(VersionError::new(raw, "more than one leading `v`"));
        }
        if let Some((_, build)) = body.split_once('+') {
            return Err(VersionError::new(
                raw,
                &format!("build metadata `+{}` is not allowed: it does not order versions (semver), and `+` cannot appear in an image tag", excerpt(build, 20)),
            ));
        }
        let core = body.split('-').next().unwrap_or(body);
        let numeric = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
        if core.split('.').count() < 3 && core.split('.').all(numeric) {
            return Err(VersionError::new(raw, "the patch number is missing"));
        }
        if let Some(big) = core.split('.').find(|p| {
            numeric(p) && (p.len() > 9 || p.parse::<u64>().map_or(true, |n| n > MAX_VERSION_NUMBER))
        }) {
            return Err(VersionError::new(
                raw,
                &format!(
                    "the number {} is larger than {MAX_VERSION_NUMBER}",
                    excerpt(big, 12)
                ),
            ));
        }
        let semver =
            semver::Version::parse(body).map_err(|e| VersionError::new(raw, &e.to_string()))?;
        Ok(Version {
            raw: raw.to_string(),
            semver,
        })
    }

    /// The spelling from the document, for display (`v1.36.2` or `1.36.2`).
    pub fn original(&self) -> &str {
        &self.raw
    }

    pub fn semver(&self) -> &semver::Version {
        &self.semver
    }

    pub fn major(&self) -> u64 {
        self.semver.major
    }
    pub fn minor(&self) -> u64 {
        self.semver.minor
    }
    pub fn patch(&self) -> u64 {
        self.semver.patch
    }

    /// `major.minor`, the unit compatibility data is written in.
    pub fn minor_version(&self) -> MinorVersion {
        MinorVersion {
            major: self.semver.major,
            minor: self.semver.minor,
        }
    }

    /// Normalised, without `v`: `1.36.2`.
    pub fn normalized(&self) -> String {
        self.semver.to_string()
    }

    /// Image tag form, exactly one `v`: `v1.36.2`.
    pub fn tag(&self) -> String {
        format!("v{}", self.semver)
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.semver == other.semver
    }
}
impl Eq for Version {}
impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.semver.cmp(&other.semver)
    }
}
impl std::hash::Hash for Version {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.semver.hash(state)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl std::str::FromStr for Version {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::parse(s)
    }
}

impl FromScalar for Version {
    const EXPECTING: &'static str = "a version string like v1.36.2";
    fn from_text(text: &str) -> Result<Self, String> {
        Version::parse(text).map_err(|e| e.to_string())
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar::deserialize(d)
    }
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version `{text}`: {reason}; expected MAJOR.MINOR.PATCH with an optional leading `v`, e.g. v1.36.2")]
pub struct VersionError {
    pub text: String,
    pub reason: String,
}

impl VersionError {
    fn new(text: &str, reason: &str) -> Self {
        VersionError {
            text: excerpt(text, 40),
            reason: reason.to_string(),
        }
    }
}

/// `major.minor`, e.g. Kubernetes 1.36 or Talos 1.13.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MinorVersion {
    pub major: u64,
    pub minor: u64,
}

impl MinorVersion {
    pub fn new(major: u64, minor: u64) -> Self {
        MinorVersion { major, minor }
    }

    /// Parse `1.36`, `v1.36` or a full version (`1.36.2`, whose patch is ignored).
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let raw = text.trim();
        let body = raw.strip_prefix('v').unwrap_or(raw);
        let number = |p: &str| {
            p.parse::<u64>()
                .ok()
                .filter(|n| *n <= MAX_VERSION_NUMBER && !p.starts_with('+'))
        };
        let mut parts = body.splitn(3, '.');
        let major = parts.next().and_then(number);
        let minor = parts
            .next()
            .map(|p| p.split(['-', '+']).next().unwrap_or(p))
            .and_then(number);
        match (major, minor) {
            (Some(major), Some(minor)) => Ok(MinorVersion { major, minor }),
            _ => Err(VersionError {
                text: excerpt(raw, 40),
                reason: format!(
                    "expected MAJOR.MINOR, e.g. 1.36, each at most {MAX_VERSION_NUMBER}"
                ),
            }),
        }
    }

    /// How many minors `to` is ahead of `self` (same major only; `None` across majors).
    pub fn minors_to(self, to: MinorVersion) -> Option<i64> {
        // i128 cannot overflow for two u64s; the clamp only matters for values no parser
        // admits (numbers are bounded by MAX_VERSION_NUMBER).
        (self.major == to.major).then(|| {
            let d = i128::from(to.minor) - i128::from(self.minor);
            d.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
        })
    }

    pub fn next(self) -> MinorVersion {
        MinorVersion::new(self.major, self.minor.saturating_add(1))
    }

    pub fn prev(self) -> Option<MinorVersion> {
        self.minor
            .checked_sub(1)
            .map(|m| MinorVersion::new(self.major, m))
    }
}

impl fmt::Display for MinorVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromScalar for MinorVersion {
    const EXPECTING: &'static str = "a minor version like \"1.36\"";
    fn from_text(text: &str) -> Result<Self, String> {
        MinorVersion::parse(text).map_err(|e| e.to_string())
    }
    // `1.30` as a YAML float prints as `1.3`: refuse rather than misread.
    fn from_number(printed: &str) -> Result<Self, String> {
        Err(format!(
            "write minor versions as quoted strings (\"{printed}\" may have lost a trailing zero)"
        ))
    }
}

impl<'de> Deserialize<'de> for MinorVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar::deserialize(d)
    }
}

impl Serialize for MinorVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_v_is_optional_and_the_tag_has_exactly_one() {
        let a = Version::parse("v1.36.0").unwrap();
        let b = Version::parse("1.36.0").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.tag(), "v1.36.0");
        assert_eq!(b.tag(), "v1.36.0");
        assert_eq!(a.original(), "v1.36.0");
        assert_eq!(b.original(), "1.36.0");
        assert_eq!(a.normalized(), "1.36.0");
    }

    #[test]
    fn double_v_and_short_versions_are_refused() {
        assert!(Version::parse("vv1.36.0").is_err());
        let e = Version::parse("1.36").unwrap_err();
        assert!(e.to_string().contains("MAJOR.MINOR.PATCH"), "{e}");
    }

    #[test]
    fn odd_spellings_are_refused_with_their_reason() {
        for (text, reason) in [
            ("V1.33.6", "lower-case `v`"),
            (" v1.33.6 ", "white space"),
            ("v1.33.6\n", "white space"),
            ("", "empty"),
            ("v1.33.5+a", "build metadata"),
            ("1.33.5+build.7", "image tag"),
            ("v1.2147483648.0", "larger than"),
            ("v1.18446744073709551615.0", "larger than"),
            ("v1.1000000000.0", "larger than"),
        ] {
            let e = Version::parse(text).unwrap_err();
            assert!(e.to_string().contains(reason), "{text:?}: {e}");
        }
        assert!(Version::parse(&"1".repeat(10_000)).is_err());
        let e = Version::parse(&format!("v1.2.3-{}", "x".repeat(100_000))).unwrap_err();
        assert!(
            e.to_string().len() < 300,
            "the value is not echoed whole: {e}"
        );
        // Dates as numbers still work.
        assert_eq!(Version::parse("20261201.0.1").unwrap().major(), 20261201);
    }

    #[test]
    fn minor_arithmetic_cannot_overflow() {
        let lo = MinorVersion::new(1, 0);
        let hi = MinorVersion::new(1, u64::MAX);
        assert_eq!(lo.minors_to(hi), Some(i64::MAX));
        assert_eq!(hi.minors_to(lo), Some(i64::MIN));
        assert_eq!(hi.next(), hi);
        assert!(MinorVersion::parse("1.99999999999").is_err());
    }

    #[test]
    fn prereleases_order_before_their_release() {
        let rc = Version::parse("v1.37.0-rc.1").unwrap();
        let ga = Version::parse("v1.37.0").unwrap();
        assert!(rc < ga);
        assert_eq!(rc.tag(), "v1.37.0-rc.1");
    }

    #[test]
    fn minor_versions() {
        assert_eq!(
            MinorVersion::parse("v1.36").unwrap(),
            MinorVersion::new(1, 36)
        );
        assert_eq!(
            MinorVersion::parse("1.37.0-rc.1").unwrap(),
            MinorVersion::new(1, 37)
        );
        assert_eq!(
            MinorVersion::new(1, 35).minors_to(MinorVersion::new(1, 37)),
            Some(2)
        );
        assert_eq!(
            MinorVersion::new(1, 35).minors_to(MinorVersion::new(2, 0)),
            None
        );
        assert!(MinorVersion::parse("one.two").is_err());
    }
}
