//! Plan renderings: a terminal listing, a Mermaid `gantt` block for PR comments, and
//! Markdown (ordered steps + the gantt). Every string from the documents goes through
//! `crate::escape` for the format it lands in.

use super::{count, Plan, Schedule};
use crate::clock::Timestamp;
use crate::escape::{self, MermaidIds};

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// An offset from the start: `01:30`, or `2d03:00` past a day (never wrapping at 24h).
pub(crate) fn hm(secs: u64) -> String {
    let (d, h, m) = (secs / DAY, (secs % DAY) / HOUR, (secs % HOUR) / MINUTE);
    if d > 0 {
        format!("{d}d{h:02}:{m:02}")
    } else {
        format!("{h:02}:{m:02}")
    }
}

/// A duration: `8m`, `1h30m`, `2d3h`, `0s`.
pub(crate) fn dur(secs: u64) -> String {
    let parts = [
        (secs / DAY, "d"),
        ((secs % DAY) / HOUR, "h"),
        ((secs % HOUR) / MINUTE, "m"),
        (secs % MINUTE, "s"),
    ];
    let out: String = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if out.is_empty() {
        "0s".into()
    } else {
        out
    }
}

/// The note that says there is nothing to do, when the plan has no stages.
fn nothing_to_do(p: &Plan) -> Option<&str> {
    if !p.stages.is_empty() {
        return None;
    }
    Some(
        p.notes
            .iter()
            .find(|n| n.starts_with("nothing to roll out"))
            .map(String::as_str)
            .unwrap_or("nothing to roll out"),
    )
}

/// Notes other than the one the headline already says.
fn other_notes(p: &Plan) -> impl Iterator<Item = &String> {
    let said = nothing_to_do(p);
    p.notes.iter().filter(move |n| Some(n.as_str()) != said)
}

/// Where the estimate falls with the maintenance windows: when the first step starts, when
/// the last ends, and how many windows that takes. Only times and counts, so it needs no
/// escaping.
pub(super) fn schedule_text(s: &Schedule) -> String {
    let when = |t: &str| {
        Timestamp::parse_rfc3339(t)
            .map(super::window::describe)
            .unwrap_or_else(|| t.to_string())
    };
    let start = if s.starts_at == s.from {
        "starts now, inside a maintenance window".to_string()
    } else {
        format!(
            "starts in the next maintenance window, {}",
            when(&s.starts_at)
        )
    };
    format!(
        "{start}; ends ≈ {}; needs {}",
        when(&s.ends_at),
        count(s.windows, "maintenance window")
    )
}

fn calendar_line(p: &Plan) -> Option<String> {
    p.schedule
        .as_ref()
        .map(|s| format!("calendar: {}", schedule_text(s)))
}

/// One line about the cluster, the batches and the estimate. The wording is ours; only the
/// numbers come from the plan, so it needs no escaping.
fn headline(p: &Plan) -> String {
    if let Some(nothing) = nothing_to_do(p) {
        return nothing.to_string();
    }
    let b = &p.worker_batches;
    let batches = if b.count == 0 {
        String::new()
    } else {
        format!(
            ", workers in {} (lower bound {}, maxUnavailable {}{})",
            count(b.count, "batch"),
            b.lower_bound,
            b.max_unavailable,
            if b.volume_aware { ", volume-aware" } else { "" }
        )
    };
    format!(
        "{}, {}{batches}; estimated {}",
        count(p.control_planes, "control plane"),
        count(p.workers, "worker"),
        dur(p.estimate_secs)
    )
}

pub fn text(p: &Plan) -> String {
    let t = escape::terminal;
    let mut out = format!(
        "plan for cluster {}: {}\n{}\n",
        t(&p.cluster),
        t(&p.summary),
        headline(p)
    );
    if let Some(line) = calendar_line(p) {
        out.push_str(&format!("{line}\n"));
    }
    for w in &p.warnings {
        out.push_str(&format!("warning: {}\n", t(w)));
    }
    if let Some(path) = &p.path {
        out.push_str("\nChain (control planes Talos/Kubernetes | workers Talos/kubelet):\n");
        for (i, st) in path.iter().enumerate() {
            let hop = if i == 0 {
                "now".to_string()
            } else {
                i.to_string()
            };
            let moves = st.moves.as_ref().map(|m| m.to_string()).unwrap_or_default();
            out.push_str(&format!(
                "  {hop:>3}. {}/{} | {}/{}  {}\n",
                st.control_planes.talos,
                st.control_planes.kubernetes,
                st.workers.talos,
                st.workers.kubelet,
                t(&moves)
            ));
        }
    }
    let mut n = 0;
    for (i, stage) in p.stages.iter().enumerate() {
        out.push_str(&format!("\nStage {} — {}\n", i + 1, t(&stage.title)));
        for s in &stage.steps {
            n += 1;
            out.push_str(&format!(
                "  {n:>3}. {:<7} +{:<6} {}\n",
                hm(s.start_secs),
                dur(s.duration_secs),
                t(&s.description)
            ));
        }
    }
    let mut notes = other_notes(p).peekable();
    if notes.peek().is_some() {
        out.push('\n');
        for note in notes {
            out.push_str(&format!("note: {}\n", t(note)));
        }
    }
    out
}

/// The chart's clock starts at local midnight of this day: a date without a time zone is
/// read in the viewer's zone, so the axis starts at 00:00 wherever the PR is read (a Unix
/// timestamp would start at 19:00 in New York). A January start keeps daylight-saving
/// changes out of all but very long plans.
const CHART_EPOCH_YEAR: i64 = 2000;

/// Beyond a year, the axis labels (day of the year) would repeat; such a plan is listed,
/// not drawn.
const MAX_CHART_SECS: u64 = 365 * DAY;

/// `2000-01-01 00:08:00` for an offset of 480 seconds.
fn chart_time(secs: u64) -> String {
    let days = (secs / DAY) as i64;
    let (y, m, d) = civil_from_days(days_from_civil(CHART_EPOCH_YEAR, 1, 1) + days);
    let rest = secs % DAY;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / HOUR,
        (rest % HOUR) / MINUTE,
        rest % MINUTE
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// A Mermaid gantt. Each task has an explicit start, a local date-time offset from
/// [`CHART_EPOCH_YEAR`]: Mermaid 11 reads a bare number under `dateFormat X` as
/// milliseconds, which put every step at 00:00. The chart's dates are not today's, so no
/// "today" line.
pub fn mermaid(p: &Plan) -> String {
    let title = format!("ichor plan for {} ({})", p.cluster, p.summary);
    let end = p
        .steps()
        .map(|s| s.start_secs.saturating_add(s.duration_secs.max(1)))
        .max()
        .unwrap_or(0);
    let drawable = end <= MAX_CHART_SECS;
    let mut out = format!(
        "gantt\n    title {}\n    dateFormat YYYY-MM-DD HH:mm:ss\n    axisFormat {}\n    todayMarker off\n",
        escape::mermaid_text(&if drawable {
            title
        } else {
            format!(
                "{title}, estimated {}: too long to draw",
                dur(p.estimate_secs)
            )
        }),
        if end <= DAY { "%H:%M" } else { "day %-j %H:%M" }
    );
    if !drawable {
        return out;
    }
    let mut ids = MermaidIds::default();
    for stage in &p.stages {
        out.push_str(&format!(
            "    section {}\n",
            escape::mermaid_text(&stage.title)
        ));
        for s in &stage.steps {
            let name = if s.nodes.is_empty() {
                s.id.clone()
            } else {
                s.nodes.join(", ")
            };
            out.push_str(&format!(
                "    {} :{}, {}, {}s\n",
                escape::mermaid_text(&name),
                ids.id(&s.id),
                chart_time(s.start_secs),
                // A zero-length bar would not show.
                s.duration_secs.max(1)
            ));
        }
    }
    out
}

pub fn markdown(p: &Plan) -> String {
    let md = escape::md_text;
    let mut out = format!(
        "### ichor plan — {}: {}\n\n{}\n\n",
        escape::md_code(&p.cluster),
        md(&p.summary),
        headline(p)
    );
    if let Some(line) = calendar_line(p) {
        out.push_str(&format!("{line}\n\n"));
    }
    if !p.warnings.is_empty() {
        // GitHub shows this as a warning box; elsewhere it is a block quote.
        out.push_str("> [!WARNING]\n");
        for (i, w) in p.warnings.iter().enumerate() {
            if i > 0 {
                out.push_str(">\n");
            }
            out.push_str(&format!("> {}\n", md(w)));
        }
        out.push('\n');
    }
    if let Some(path) = &p.path {
        out.push_str(&chain_markdown(path));
    }
    let mut n = 0;
    for stage in &p.stages {
        out.push_str(&format!("**{}**\n\n", md(&stage.title)));
        for s in &stage.steps {
            n += 1;
            out.push_str(&format!(
                "{n}. `{}` {} — {}\n",
                hm(s.start_secs),
                md(&s.description),
                dur(s.duration_secs)
            ));
        }
        out.push('\n');
    }
    for note in other_notes(p) {
        out.push_str(&format!("- {}\n", md(note)));
    }
    if !p.stages.is_empty() {
        out.push_str(&format!("\n```mermaid\n{}```\n", mermaid(p)));
    }
    out
}

/// The chain as a table of states: hop, Talos on control planes / workers, Kubernetes
/// apiservers / kubelets, what moves.
fn chain_markdown(path: &[crate::policy::path::State]) -> String {
    let md = escape::md_text;
    let mut out = String::from(
        "**Chain of hops** (each state supported, mixed states included)\n\n| hop | Talos: control planes | Talos: workers | Kubernetes: apiservers | kubelets: workers | what moves |\n|---|---|---|---|---|---|\n",
    );
    for (i, st) in path.iter().enumerate() {
        let hop = if i == 0 {
            "now".to_string()
        } else {
            i.to_string()
        };
        let moves = st.moves.as_ref().map(|m| m.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "| {hop} | {} | {} | {} | {} | {} |\n",
            md(&st.control_planes.talos.to_string()),
            md(&st.workers.talos.to_string()),
            md(&st.control_planes.kubernetes.to_string()),
            md(&st.workers.kubelet.to_string()),
            md(&moves)
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_durations_past_a_day_do_not_wrap() {
        assert_eq!(hm(0), "00:00");
        assert_eq!(hm(90 * 60), "01:30");
        assert_eq!(hm(51 * HOUR), "2d03:00");
        assert_eq!(hm(u64::MAX), "213503982334601d07:00");
        assert_eq!(dur(0), "0s");
        assert_eq!(dur(480), "8m");
        assert_eq!(dur(5400), "1h30m");
        assert_eq!(dur(51 * HOUR + 5), "2d3h5s");
    }

    #[test]
    fn chart_times_count_from_local_midnight() {
        assert_eq!(chart_time(0), "2000-01-01 00:00:00");
        assert_eq!(chart_time(480), "2000-01-01 00:08:00");
        assert_eq!(chart_time(DAY + 3 * HOUR + 61), "2000-01-02 03:01:01");
        // 2000 is a leap year: day 59 is 29 February, day 365 the last of the year.
        assert_eq!(chart_time(59 * DAY), "2000-02-29 00:00:00");
        assert_eq!(chart_time(365 * DAY), "2000-12-31 00:00:00");
    }
}
