//! Durations as people write them in YAML: `90s`, `10m`, `1h30m`, `2h`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::scalar::{self, FromScalar};

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

    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("empty duration; expected e.g. 90s, 10m or 1h30m".into());
        }
        let mut total: u64 = 0;
        let mut digits = String::new();
        for c in t.chars() {
            if c.is_ascii_digit() {
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
                        "invalid duration `{t}`: unknown unit `{c}`; expected s, m, h or d (e.g. 90s, 10m, 1h30m)"
                    ))
                }
            };
            let n: u64 = digits
                .parse()
                .map_err(|_| format!("invalid duration `{t}`: a number must come before `{c}`"))?;
            total = total.saturating_add(n.saturating_mul(unit));
            digits.clear();
        }
        if !digits.is_empty() {
            return Err(format!(
                "invalid duration `{t}`: `{digits}` has no unit; expected e.g. 90s, 10m or 1h30m"
            ));
        }
        Ok(HumanDuration(Duration::from_secs(total)))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.as_secs();
        let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
        let mut out = String::new();
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
    }
}
