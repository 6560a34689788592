//! Durations as people write them in YAML: `90s`, `10m`, `1h30m`, `2h`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::scalar::{self, FromScalar};

/// The longest duration a document may give: a year.
pub const MAX_DURATION_DAYS: u64 = 366;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub fn from_secs(s: u64) -> Self {
        HumanDuration(Duration::from_secs(s))
    }
    pub fn from_mins(m: u64) -> Self {
        HumanDuration(Duration::from_secs(m * 60))
    }
    pub fn as_duration(self) -> Duration {
        self.0
    }

    /// Parse `90s`, `10m`, `1h30m`, `2d`. The total is bounded by [`MAX_DURATION_DAYS`]: a
    /// duration from a PR never overflows an estimate or a deadline.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let shown = super::version::excerpt(t, 32);
        if t.is_empty() {
            return Err("empty duration; expected e.g. 90s, 10m or 1h30m".into());
        }
        let too_long = || {
            format!("duration `{shown}` is longer than {MAX_DURATION_DAYS} days; expected e.g. 90s, 10m or 1h30m")
        };
        let mut total: u64 = 0;
        let mut digits = String::new();
        for c in t.chars() {
            if c.is_ascii_digit() {
                if digits.len() >= 12 {
                    return Err(too_long());
                }
                digits.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => {
                    return Err(format!(
                        "invalid duration `{shown}`: unknown unit `{}`; expected s, m, h or d (e.g. 90s, 10m, 1h30m)",
                        c.escape_default()
                    ))
                }
            };
            if digits.is_empty() {
                return Err(format!(
                    "invalid duration `{shown}`: a number must come before `{c}`"
                ));
            }
            let n: u64 = digits.parse().map_err(|_| too_long())?;
            total = n
                .checked_mul(unit)
                .and_then(|s| total.checked_add(s))
                .filter(|s| *s <= MAX_DURATION_DAYS * 86_400)
                .ok_or_else(too_long)?;
            digits.clear();
        }
        if !digits.is_empty() {
            return Err(format!(
                "invalid duration `{shown}`: `{}` has no unit; expected e.g. 90s, 10m or 1h30m",
                super::version::excerpt(&digits, 12)
            ));
        }
        Ok(HumanDuration(Duration::from_secs(total)))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.as_secs();
        let (d, h, m, sec) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60, s % 60);
        let mut out = String::new();
        if d > 0 {
            out.push_str(&format!("{d}d"));
        }
        if h > 0 {
            out.push_str(&format!("{h}h"));
        }
        if m > 0 {
            out.push_str(&format!("{m}m"));
        }
        if sec > 0 || out.is_empty() {
            out.push_str(&format!("{sec}s"));
        }
        f.write_str(&out)
    }
}

impl FromScalar for HumanDuration {
    const EXPECTING: &'static str = "a duration with a unit, e.g. 90s, 10m or 1h30m";
    fn from_text(text: &str) -> Result<Self, String> {
        HumanDuration::parse(text)
    }
    fn from_number(printed: &str) -> Result<Self, String> {
        Err(format!(
            "`{printed}` has no unit; expected a duration such as 90s, 10m or 1h30m"
        ))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar::deserialize(d)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!(HumanDuration::parse("90s").unwrap().0.as_secs(), 90);
        assert_eq!(HumanDuration::parse("1h30m").unwrap().0.as_secs(), 5400);
        assert_eq!(HumanDuration::parse("1h30m").unwrap().to_string(), "1h30m");
        assert_eq!(HumanDuration::parse("0s").unwrap().to_string(), "0s");
        assert!(HumanDuration::parse("10").unwrap_err().contains("no unit"));
        assert!(HumanDuration::parse("10y")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(HumanDuration::parse("m").is_err());
        assert_eq!(HumanDuration::parse("2d1h").unwrap().to_string(), "2d1h");
    }

    #[test]
    fn huge_durations_are_refused_not_wrapped() {
        for text in [
            "18446744073709551615s",
            "99999999999999999999h",
            "367d",
            "8785h",
            "366d1s",
        ] {
            let e = HumanDuration::parse(text).unwrap_err();
            assert!(e.contains("longer than 366 days"), "{text}: {e}");
        }
        assert_eq!(
            HumanDuration::parse("366d").unwrap().0.as_secs(),
            366 * 86_400
        );
        let e = HumanDuration::parse(&"9".repeat(1_000_000)).unwrap_err();
        assert!(e.len() < 200, "{e}");
    }
}
