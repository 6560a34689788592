//! Maintenance windows: whether a node may start now, and if not, when it may; and where a
//! rollout's working time falls on the calendar. Windows are weekly, in UTC, and may cross
//! midnight (`sun 23:00` for `4h` opens Monday's first hours too). Only the start of a node
//! is gated: a node that began inside a window finishes, since stopping it halfway would
//! leave it cordoned or down. Pure: the caller says what time it is.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::releaseset::{MaintenanceWindow, Weekday};

const DAY_MS: u64 = 86_400_000;
const WEEK_MS: u64 = 7 * DAY_MS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// Any time (no window configured) or inside one.
    Open,
    /// Outside every window; the next one opens at this instant.
    Closed { opens_at: Timestamp },
}

fn day_index(d: Weekday) -> u64 {
    match d {
        Weekday::Mon => 0,
        Weekday::Tue => 1,
        Weekday::Wed => 2,
        Weekday::Thu => 3,
        Weekday::Fri => 4,
        Weekday::Sat => 5,
        Weekday::Sun => 6,
    }
}

/// Milliseconds since the start of the week (Monday 00:00 UTC). 1970-01-01 was a Thursday.
fn week_offset(t: Timestamp) -> u64 {
    (t.as_millis() + 3 * DAY_MS) % WEEK_MS
}

/// Every occurrence of `windows` that can contain or follow `t` within a week, as
/// (start, end) in milliseconds since the epoch: last week's (which may run into this one),
/// this week's and next week's.
fn occurrences(windows: &[MaintenanceWindow], t: Timestamp) -> Vec<(u64, u64)> {
    let now = t.as_millis();
    let week_start = now - week_offset(t);
    let mut out = Vec::new();
    for w in windows {
        let len = u64::try_from(w.duration.0.as_millis())
            .unwrap_or(u64::MAX)
            .min(WEEK_MS);
        let start_in_day = (u64::from(w.start.hour) * 60 + u64::from(w.start.minute)) * 60_000;
        for d in &w.days {
            let in_week = day_index(*d) * DAY_MS + start_in_day;
            let weeks = [
                week_start.checked_sub(WEEK_MS),
                Some(week_start),
                week_start.checked_add(WEEK_MS),
            ];
            for ws in weeks.into_iter().flatten() {
                if let Some(start) = ws.checked_add(in_week) {
                    out.push((start, start.saturating_add(len)));
                }
            }
        }
    }
    out
}

/// Whether `now` falls inside one of `windows`, or when the next one opens.
pub fn state(windows: &[MaintenanceWindow], now: Timestamp) -> WindowState {
    if windows.is_empty() {
        return WindowState::Open;
    }
    let t = now.as_millis();
    let all = occurrences(windows, now);
    if all.iter().any(|&(s, e)| s <= t && t < e) {
        return WindowState::Open;
    }
    match all.iter().map(|&(s, _)| s).filter(|&s| s > t).min() {
        Some(ms) => WindowState::Closed {
            opens_at: Timestamp::from_millis(ms),
        },
        // Windows without days never open; say so by a week's wait, the caller reports it.
        None => WindowState::Closed {
            opens_at: now.plus(Duration::from_millis(WEEK_MS)),
        },
    }
}

/// The window `t` falls in, as the instant it opened (the earliest, where windows overlap);
/// `None` outside every window or without windows.
fn opened_at(windows: &[MaintenanceWindow], t: Timestamp) -> Option<Timestamp> {
    let ms = t.as_millis();
    occurrences(windows, t)
        .into_iter()
        .filter(|&(s, e)| s <= ms && ms < e)
        .map(|(s, _)| s)
        .min()
        .map(Timestamp::from_millis)
}

/// When the windows open at `t` all have closed (windows that overlap or touch count as
/// one); `None` outside every window.
fn open_until(windows: &[MaintenanceWindow], t: Timestamp) -> Option<Timestamp> {
    let mut end = None::<u64>;
    let mut at = t.as_millis();
    // Each pass moves to a later end; a week of touching windows ends the walk too.
    for _ in 0..64 {
        let next = occurrences(windows, Timestamp::from_millis(at))
            .into_iter()
            .filter(|&(s, e)| s <= at && at < e)
            .map(|(_, e)| e)
            .max();
        match next {
            Some(e) if e > at => {
                end = Some(e);
                at = e;
            }
            _ => break,
        }
    }
    end.map(Timestamp::from_millis)
}

/// How much of `from..to` lies inside a window: the time a rollout could have worked.
pub fn open_time(windows: &[MaintenanceWindow], from: Timestamp, to: Timestamp) -> Duration {
    if windows.is_empty() {
        return to.since(from);
    }
    let mut open = Duration::ZERO;
    let mut at = from;
    // Each pass passes a window or a gap; a span of years is cut short, not walked forever.
    for _ in 0..10_000 {
        if at >= to {
            break;
        }
        match open_until(windows, at) {
            Some(end) => {
                open += end.min(to).since(at);
                at = end;
            }
            None => match state(windows, at) {
                WindowState::Closed { opens_at } if opens_at > at => at = opens_at,
                _ => break,
            },
        }
    }
    open
}

/// One step of a rollout as the calendar sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// Its working time.
    pub secs: u64,
    /// It may start only inside a window (every step but the final verify, and but a step
    /// already under way).
    pub gated: bool,
}

/// Where a rollout's working time falls on the calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    /// When the first step that needs a window may start: now, or when the next opens.
    pub first_start: Timestamp,
    pub ends_at: Timestamp,
    /// The windows in which some step starts (0 without windows).
    pub windows: usize,
}

/// `work` laid out from `now` on: a gated step waits for the next window and, once
/// started, runs to its end even past the window (the engine gates only a node's start,
/// so it is never left cordoned or down). Steps run one after another, as the plan's
/// timeline has them.
pub fn calendar(windows: &[MaintenanceWindow], now: Timestamp, work: &[Work]) -> Calendar {
    let mut at = now;
    let mut first_start = None;
    let mut count = 0;
    let mut last_window = None;
    for w in work {
        if w.gated {
            at = next_open(windows, at);
            first_start.get_or_insert(at);
            let opened = opened_at(windows, at);
            if opened.is_some() && opened != last_window {
                count += 1;
                last_window = opened;
            }
        }
        at = at.plus(Duration::from_secs(w.secs));
    }
    Calendar {
        first_start: first_start.unwrap_or(now),
        ends_at: at,
        windows: count,
    }
}

/// `now` when a node may start now, else when the next window opens.
pub fn next_open(windows: &[MaintenanceWindow], now: Timestamp) -> Timestamp {
    match state(windows, now) {
        WindowState::Open => now,
        WindowState::Closed { opens_at } => opens_at,
    }
}

/// `Sat 02:00 UTC` for a timestamp, for messages.
pub fn describe(t: Timestamp) -> String {
    let names = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let off = week_offset(t);
    let day = (off / DAY_MS) as usize;
    let mins = (off % DAY_MS) / 60_000;
    format!(
        "{} {:02}:{:02} UTC ({})",
        names.get(day).unwrap_or(&"?"),
        mins / 60,
        mins % 60,
        t.rfc3339()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::releaseset::{HumanDuration, TimeOfDay};

    fn at(text: &str) -> Timestamp {
        Timestamp::parse_rfc3339(text).unwrap()
    }

    fn window(days: &[Weekday], h: u8, m: u8, hours: u64) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.to_vec(),
            start: TimeOfDay { hour: h, minute: m },
            duration: HumanDuration::from_secs(hours * 3600),
        }
    }

    #[test]
    fn no_window_means_any_time() {
        assert_eq!(state(&[], at("2026-12-01T12:00:00Z")), WindowState::Open);
    }

    #[test]
    fn inside_and_outside_a_saturday_window() {
        // 2026-12-05 is a Saturday.
        let w = [window(&[Weekday::Sat], 2, 0, 4)];
        assert_eq!(state(&w, at("2026-12-05T03:00:00Z")), WindowState::Open);
        assert_eq!(
            state(&w, at("2026-12-05T06:00:00Z")),
            WindowState::Closed {
                opens_at: at("2026-12-12T02:00:00Z")
            }
        );
        assert_eq!(
            state(&w, at("2026-12-01T12:00:00Z")),
            WindowState::Closed {
                opens_at: at("2026-12-05T02:00:00Z")
            }
        );
        assert!(describe(at("2026-12-05T02:00:00Z")).starts_with("Sat 02:00 UTC"));
    }

    #[test]
    fn a_window_crossing_midnight_and_the_week_boundary() {
        // Sunday 23:00 for 4 hours: open on Monday 01:00 (2026-11-30 is a Monday).
        let w = [window(&[Weekday::Sun], 23, 0, 4)];
        assert_eq!(state(&w, at("2026-11-30T01:00:00Z")), WindowState::Open);
        assert_eq!(state(&w, at("2026-11-29T23:30:00Z")), WindowState::Open);
        assert_eq!(
            state(&w, at("2026-11-30T03:00:00Z")),
            WindowState::Closed {
                opens_at: at("2026-12-06T23:00:00Z")
            }
        );
    }

    #[test]
    fn the_earliest_of_several_windows_opens_next() {
        let w = [
            window(&[Weekday::Fri], 22, 0, 2),
            window(&[Weekday::Wed, Weekday::Sat], 1, 30, 1),
        ];
        // Tuesday noon: Wednesday 01:30 is next.
        assert_eq!(
            state(&w, at("2026-12-01T12:00:00Z")),
            WindowState::Closed {
                opens_at: at("2026-12-02T01:30:00Z")
            }
        );
    }

    fn work(secs: &[(u64, bool)]) -> Vec<Work> {
        secs.iter()
            .map(|&(secs, gated)| Work { secs, gated })
            .collect()
    }

    #[test]
    fn a_rollout_merged_on_a_weekday_starts_in_the_weekend_window() {
        // Saturday and Sunday from 06:00 for 6 hours; merged on Tuesday noon.
        let w = [window(&[Weekday::Sat, Weekday::Sun], 6, 0, 6)];
        let c = calendar(
            &w,
            at("2026-12-01T12:00:00Z"),
            &work(&[(600, true), (600, true), (600, true), (300, false)]),
        );
        assert_eq!(c.first_start, at("2026-12-05T06:00:00Z"));
        assert_eq!(c.ends_at, at("2026-12-05T06:35:00Z"));
        assert_eq!(c.windows, 1);
    }

    #[test]
    fn a_window_shorter_than_a_step_starts_one_step_each() {
        // Every day from 02:00 for 5 minutes; each 20-minute step starts in its own window
        // and finishes outside it; the verify that ends the rollout waits for none.
        let every_day = [
            Weekday::Mon,
            Weekday::Tue,
            Weekday::Wed,
            Weekday::Thu,
            Weekday::Fri,
            Weekday::Sat,
            Weekday::Sun,
        ];
        let w = [MaintenanceWindow {
            days: every_day.to_vec(),
            start: TimeOfDay { hour: 2, minute: 0 },
            duration: HumanDuration::from_secs(300),
        }];
        let c = calendar(
            &w,
            at("2026-12-01T12:00:00Z"),
            &work(&[(1200, true), (1200, true), (1200, true), (300, false)]),
        );
        assert_eq!(c.first_start, at("2026-12-02T02:00:00Z"));
        assert_eq!(c.ends_at, at("2026-12-04T02:25:00Z"));
        assert_eq!(c.windows, 3);
    }

    #[test]
    fn without_windows_the_calendar_is_the_working_time() {
        let now = at("2026-12-01T12:00:00Z");
        let c = calendar(&[], now, &work(&[(600, true), (300, false)]));
        assert_eq!(
            (c.first_start, c.ends_at, c.windows),
            (now, at("2026-12-01T12:15:00Z"), 0)
        );
    }

    #[test]
    fn a_step_under_way_finishes_before_the_rest_waits_for_a_window() {
        // Resumed on Tuesday with a node out: it finishes now, the next waits for Saturday.
        let w = [window(&[Weekday::Sat], 6, 0, 6)];
        let c = calendar(
            &w,
            at("2026-12-01T12:00:00Z"),
            &work(&[(600, false), (600, true)]),
        );
        assert_eq!(c.first_start, at("2026-12-05T06:00:00Z"));
        assert_eq!(c.ends_at, at("2026-12-05T06:10:00Z"));
        assert_eq!(c.windows, 1);
    }

    #[test]
    fn overlapping_windows_are_one_window_and_open_time_counts_them_once() {
        let w = [
            window(&[Weekday::Sat], 2, 0, 4),
            window(&[Weekday::Sat], 4, 0, 4),
        ];
        // Steps at 02:00 and 05:30 start in the same (joined) window.
        let c = calendar(
            &w,
            at("2026-12-05T02:00:00Z"),
            &work(&[(3 * 3600 + 1800, true), (600, true)]),
        );
        assert_eq!(c.windows, 1);
        assert_eq!(
            open_time(&w, at("2026-12-04T00:00:00Z"), at("2026-12-06T00:00:00Z")),
            Duration::from_secs(6 * 3600)
        );
        let weekend = [window(&[Weekday::Sat, Weekday::Sun], 6, 0, 6)];
        assert_eq!(
            open_time(
                &weekend,
                at("2026-12-04T12:00:00Z"),
                at("2026-12-06T10:00:00Z")
            ),
            Duration::from_secs(10 * 3600)
        );
        assert_eq!(
            open_time(&[], at("2026-12-04T12:00:00Z"), at("2026-12-04T13:00:00Z")),
            Duration::from_secs(3600)
        );
    }
}
