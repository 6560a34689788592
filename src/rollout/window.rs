//! Maintenance windows: whether a node may start now, and if not, when it may. Windows are
//! weekly, in UTC, and may cross midnight (`sun 23:00` for `4h` opens Monday's first hours
//! too). Only the start of a node is gated: a node that began inside a window finishes,
//! since stopping it halfway would leave it cordoned or down.

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

/// Whether `now` falls inside one of `windows`, or when the next one opens.
pub fn state(windows: &[MaintenanceWindow], now: Timestamp) -> WindowState {
    if windows.is_empty() {
        return WindowState::Open;
    }
    let offset = week_offset(now);
    let week_start = now.as_millis() - offset;
    let mut next: Option<u64> = None;
    for w in windows {
        let len = u64::try_from(w.duration.0.as_millis())
            .unwrap_or(u64::MAX)
            .min(WEEK_MS);
        let start_in_day = (u64::from(w.start.hour) * 60 + u64::from(w.start.minute)) * 60_000;
        for d in &w.days {
            let start = day_index(*d) * DAY_MS + start_in_day;
            let open_now = |s: u64| offset >= s && offset < s.saturating_add(len);
            // An occurrence that began last week may run into this one.
            if open_now(start) || (offset + WEEK_MS >= start && offset + WEEK_MS < start + len) {
                return WindowState::Open;
            }
            let until = if start > offset {
                start - offset
            } else {
                start + WEEK_MS - offset
            };
            next = Some(next.map_or(until, |n| n.min(until)));
        }
    }
    match next {
        Some(ms) => WindowState::Closed {
            opens_at: Timestamp::from_millis(week_start + offset + ms),
        },
        // Windows without days never open; say so by a week's wait, the caller reports it.
        None => WindowState::Closed {
            opens_at: now.plus(Duration::from_millis(WEEK_MS)),
        },
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
}
