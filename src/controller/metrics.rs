//! Prometheus metrics in the text exposition format, without a metrics crate: a handful of
//! counters, gauges and histograms, labelled by what happened (the outcome, the error's
//! name), never by anything unbounded such as a sha or a PR number.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Histogram buckets for durations, in seconds: a step is seconds to tens of minutes, a
/// stage up to hours.
const BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0,
];

/// At most this many label sets per metric: a bound against a label that should not vary.
const MAX_SERIES: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

struct Family {
    kind: Kind,
    help: &'static str,
    series: BTreeMap<String, Series>,
}

#[derive(Clone, Default)]
struct Series {
    value: f64,
    buckets: [u64; BUCKETS.len()],
    count: u64,
}

#[derive(Default)]
pub struct Metrics {
    families: Mutex<BTreeMap<&'static str, Family>>,
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let v: String = v
            .chars()
            .take(100)
            .flat_map(|c| match c {
                '\\' => vec!['\\', '\\'],
                '"' => vec!['\\', '"'],
                '\n' => vec!['\\', 'n'],
                c => vec![c],
            })
            .collect();
        let _ = write!(out, "{k}=\"{v}\"");
    }
    out
}

impl Metrics {
    fn with(
        &self,
        name: &'static str,
        kind: Kind,
        help: &'static str,
        pairs: &[(&str, &str)],
        f: impl FnOnce(&mut Series),
    ) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name).or_insert_with(|| Family {
            kind,
            help,
            series: BTreeMap::new(),
        });
        let key = labels(pairs);
        if !family.series.contains_key(&key) && family.series.len() >= MAX_SERIES {
            return;
        }
        f(family.series.entry(key).or_default());
    }

    pub fn inc(&self, name: &'static str, help: &'static str, pairs: &[(&str, &str)]) {
        self.with(name, Kind::Counter, help, pairs, |s| s.value += 1.0);
    }

    pub fn set(&self, name: &'static str, help: &'static str, pairs: &[(&str, &str)], v: f64) {
        self.with(name, Kind::Gauge, help, pairs, |s| s.value = v);
    }

    pub fn observe(
        &self,
        name: &'static str,
        help: &'static str,
        pairs: &[(&str, &str)],
        secs: f64,
    ) {
        self.with(name, Kind::Histogram, help, pairs, |s| {
            s.value += secs;
            s.count += 1;
            for (i, b) in BUCKETS.iter().enumerate() {
                if secs <= *b {
                    s.buckets[i] += 1;
                }
            }
        });
    }

    /// The value of a counter or gauge (tests and the demo read it).
    pub fn value(&self, name: &str, pairs: &[(&str, &str)]) -> f64 {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        families
            .get(name)
            .and_then(|f| f.series.get(&labels(pairs)))
            .map_or(0.0, |s| if s.count > 0 { s.count as f64 } else { s.value })
    }

    /// The sum of a counter over all its label sets.
    pub fn total(&self, name: &str) -> f64 {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        families
            .get(name)
            .map_or(0.0, |f| f.series.values().map(|s| s.value).sum())
    }

    pub fn render(&self) -> String {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for (name, f) in families.iter() {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {kind}", f.help);
            for (l, s) in &f.series {
                let braced = |extra: &str| -> String {
                    match (l.is_empty(), extra.is_empty()) {
                        (true, true) => String::new(),
                        (true, false) => format!("{{{extra}}}"),
                        (false, true) => format!("{{{l}}}"),
                        (false, false) => format!("{{{l},{extra}}}"),
                    }
                };
                match f.kind {
                    Kind::Counter | Kind::Gauge => {
                        let _ = writeln!(out, "{name}{} {}", braced(""), s.value);
                    }
                    Kind::Histogram => {
                        for (i, b) in BUCKETS.iter().enumerate() {
                            let _ = writeln!(
                                out,
                                "{name}_bucket{} {}",
                                braced(&format!("le=\"{b}\"")),
                                s.buckets[i]
                            );
                        }
                        let _ = writeln!(out, "{name}_bucket{} {}", braced("le=\"+Inf\""), s.count);
                        let _ = writeln!(out, "{name}_sum{} {}", braced(""), s.value);
                        let _ = writeln!(out, "{name}_count{} {}", braced(""), s.count);
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_text_format() {
        let m = Metrics::default();
        m.inc("ichor_gates_total", "Gates.", &[("outcome", "pass")]);
        m.inc("ichor_gates_total", "Gates.", &[("outcome", "pass")]);
        m.inc("ichor_gates_total", "Gates.", &[("outcome", "bl\"ocked")]);
        m.observe("ichor_step_seconds", "Steps.", &[("step", "talos")], 42.0);
        let text = m.render();
        assert!(text.contains("# TYPE ichor_gates_total counter"));
        assert!(text.contains("ichor_gates_total{outcome=\"pass\"} 2"));
        assert!(text.contains("outcome=\"bl\\\"ocked\""));
        assert!(text.contains("ichor_step_seconds_bucket{step=\"talos\",le=\"60\"} 1"));
        assert!(text.contains("ichor_step_seconds_bucket{step=\"talos\",le=\"30\"} 0"));
        assert!(text.contains("ichor_step_seconds_count{step=\"talos\"} 1"));
        assert_eq!(m.value("ichor_gates_total", &[("outcome", "pass")]), 2.0);
        assert_eq!(m.total("ichor_gates_total"), 3.0);
    }

    #[test]
    fn series_are_bounded() {
        let m = Metrics::default();
        for i in 0..1000 {
            m.inc("x_total", "X.", &[("n", &i.to_string())]);
        }
        assert_eq!(m.total("x_total"), MAX_SERIES as f64);
    }
}
