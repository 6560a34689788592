//! The one clock. Everything that waits (rollout deadlines, twin reboots, poll intervals)
//! asks this clock, so the twin can run a simulated hour in a second and tests never sleep
//! on wall time.
//!
//! Three flavours share one type:
//! - `Clock::system()`: real time, for a real cluster.
//! - `Clock::scaled(speed)`: simulated time running `speed`× faster than the wall clock
//!   (`ichor sim --speed 60`).
//! - `Clock::manual()`: simulated time that moves only when `advance` is called; tests use it
//!   so every step is deterministic.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// A point in time as milliseconds since the Unix epoch. Plain data so it can be stored in
/// the rollout record, compared, and printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }
    pub fn as_millis(self) -> u64 {
        self.0
    }
    /// `self + d`, saturating at the end of representable time (never wraps).
    pub fn plus(self, d: Duration) -> Self {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }
    /// Time elapsed from `earlier` to `self`; zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
    /// RFC 3339 in UTC with second precision, e.g. `2026-11-30T07:12:06Z`.
    pub fn rfc3339(self) -> String {
        let secs = self.0 / 1000;
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
        let (y, mo, d) = civil_from_days(days as i64);
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
    }
    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-30T07:12:06.042Z`.
    pub fn rfc3339_millis(self) -> String {
        let seconds = Timestamp(self.0 / 1000 * 1000).rfc3339();
        format!("{}.{:03}Z", &seconds[..19], self.0 % 1000)
    }
}

impl Timestamp {
    /// Parse `YYYY-MM-DDTHH:MM:SSZ` or `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, the forms
    /// [`Timestamp::rfc3339`] and [`Timestamp::rfc3339_millis`] print).
    pub fn parse_rfc3339(text: &str) -> Option<Timestamp> {
        if let Some(head) = text.get(..19).filter(|_| text.len() == 24) {
            let frac = text.get(19..24)?.as_bytes();
            if frac[0] != b'.' || frac[4] != b'Z' || !frac[1..4].iter().all(u8::is_ascii_digit) {
                return None;
            }
            let ms: u64 = text.get(20..23)?.parse().ok()?;
            let whole = Timestamp::parse_rfc3339(&format!("{head}Z"))?;
            return Some(Timestamp(whole.0 + ms));
        }
        let b = text.as_bytes();
        if b.len() != 20
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b'T'
            || b[13] != b':'
            || b[16] != b':'
            || b[19] != b'Z'
        {
            return None;
        }
        let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
            return None;
        }
        let days = days_from_civil(y, mo as u32, d as u32);
        let secs = days * 86_400 + h * 3600 + mi * 60 + s;
        u64::try_from(secs)
            .ok()
            .and_then(|s| s.checked_mul(1000))
            .map(Timestamp)
    }
}

const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

impl Timestamp {
    /// HTTP's `Date` (RFC 9110 IMF-fixdate), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
    pub fn http_date(self) -> String {
        let secs = self.0 / 1000;
        let days = secs / 86_400;
        let rem = secs % 86_400;
        let (y, mo, d) = civil_from_days(days as i64);
        format!(
            "{}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
            WEEKDAYS[((days + 4) % 7) as usize],
            MONTHS[(mo - 1) as usize],
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }

    /// Parse an IMF-fixdate (the only form a server may send).
    pub fn parse_http_date(text: &str) -> Option<Timestamp> {
        let parts: Vec<&str> = text.split_ascii_whitespace().collect();
        let [_, d, mo, y, hms, "GMT"] = parts.as_slice() else {
            return None;
        };
        let mo = MONTHS.iter().position(|m| m == mo)? as u32 + 1;
        let (d, y): (u32, i64) = (d.parse().ok()?, y.parse().ok()?);
        let t: Vec<i64> = hms
            .split(':')
            .map(|p| p.parse().ok())
            .collect::<Option<_>>()?;
        let [h, mi, s] = t.as_slice() else {
            return None;
        };
        if !(1..=31).contains(&d)
            || !(0..24).contains(h)
            || !(0..60).contains(mi)
            || !(0..=60).contains(s)
        {
            return None;
        }
        let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s;
        u64::try_from(secs).ok()?.checked_mul(1000).map(Timestamp)
    }
}

/// (year, month, day) to days since 1970-01-01; Howard Hinnant's algorithm.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = (y - era * 400) as u64;
    let mp = if m > 2 { m - 3 } else { m + 9 } as u64;
    let doy = (153 * mp + 2) / 5 + d as u64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe as i64 - 719_468
}

/// Days since 1970-01-01 to (year, month, day); Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = (z - era * 146_097) as u64;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe as i64 + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[derive(Clone)]
pub struct Clock {
    inner: Arc<Inner>,
}

enum Mode {
    System,
    Scaled {
        speed: f64,
        wall_start: Instant,
        sim_start: Timestamp,
    },
    Manual,
}

struct Inner {
    mode: Mode,
    /// Manual mode: the current time. Other modes: unused.
    now: Mutex<Timestamp>,
    /// Manual mode: tells [`Clock::ticks`] receivers whenever time moves.
    tick: watch::Sender<Timestamp>,
    /// Manual mode: the deadlines of the sleeps in progress, so a simulation driver can move
    /// time straight to the next one (`(deadline, id)`; a dropped sleep removes itself),
    /// each with the waker to call when time reaches it. Moving time wakes only the sleeps
    /// it ends, not every sleeper.
    sleepers: Mutex<std::collections::BTreeMap<(Timestamp, u64), Option<std::task::Waker>>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Requests in flight: a caller waiting for an answer, or a server working on one
    /// ([`Clock::busy`]). A simulation driver does not move time while one is unanswered,
    /// so a call's deadline measures the simulated world, not how loaded the machine is.
    busy: AtomicUsize,
    /// Answers that wait for simulated time on purpose ([`Clock::parked`]): a twin's
    /// handler sleeping on this clock, so time may move although its caller is busy.
    parked: AtomicUsize,
    /// Told whenever a request stops counting as in flight, so a simulation driver waiting
    /// for the clock to be quiet wakes on the answer rather than polling for it.
    answered: tokio::sync::Notify,
}

/// Counts one request in flight until dropped ([`Clock::busy`]).
#[must_use = "the request counts only while the guard lives"]
pub struct Busy {
    inner: Arc<Inner>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.inner.busy.fetch_sub(1, Ordering::SeqCst);
        self.inner.answered.notify_waiters();
    }
}

/// Counts one answer waiting for simulated time until dropped ([`Clock::parked`]).
#[must_use = "the wait counts only while the guard lives"]
pub struct Parked {
    inner: Arc<Inner>,
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.inner.parked.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Removes a manual sleep's deadline when the sleep ends or is dropped.
struct Sleeper<'c> {
    clock: &'c Clock,
    key: (Timestamp, u64),
}

impl Drop for Sleeper<'_> {
    fn drop(&mut self) {
        self.clock.lock_sleepers().remove(&self.key);
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match &self.inner.mode {
            Mode::System => "system".to_string(),
            Mode::Scaled { speed, .. } => format!("scaled x{speed}"),
            Mode::Manual => "manual".to_string(),
        };
        f.debug_struct("Clock")
            .field("mode", &mode)
            .field("now", &self.now())
            .finish()
    }
}

fn wall_now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The slowest and fastest [`Clock::try_scaled`] accepts. Beyond 100 000x, a year of wall
/// time is 3 000 simulated centuries, and the millisecond timestamps run out within a
/// human lifetime; below 0.001x, a simulated second lasts over 15 minutes.
pub const MIN_SPEED: f64 = 0.001;
pub const MAX_SPEED: f64 = 100_000.0;

/// Why a clock cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClockError {
    #[error(
        "speed {0} is out of range: expected a number of simulated seconds per wall-clock second from {MIN_SPEED} to {MAX_SPEED}"
    )]
    Speed(f64),
}

/// `secs` as a Duration, saturating instead of panicking on huge, negative or NaN values.
fn saturating_secs_f64(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

impl Clock {
    fn new(mode: Mode, start: Timestamp) -> Self {
        let (tick, _) = watch::channel(start);
        Clock {
            inner: Arc::new(Inner {
                mode,
                now: Mutex::new(start),
                tick,
                sleepers: Mutex::new(std::collections::BTreeMap::new()),
                next_id: std::sync::atomic::AtomicU64::new(0),
                busy: AtomicUsize::new(0),
                parked: AtomicUsize::new(0),
                answered: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Real time.
    pub fn system() -> Self {
        Self::new(Mode::System, wall_now())
    }

    /// Simulated time starting now and running `speed` times faster than the wall clock.
    /// A speed that is not a positive number is treated as 1; others are clamped to
    /// [`MIN_SPEED`]..=[`MAX_SPEED`]. Use [`Clock::try_scaled`] to refuse them instead.
    pub fn scaled(speed: f64) -> Self {
        let speed = if speed.is_finite() && speed > 0.0 {
            speed.clamp(MIN_SPEED, MAX_SPEED)
        } else {
            1.0
        };
        Self::scaled_from(speed, wall_now())
    }

    /// Like [`Clock::scaled`], but a speed outside [`MIN_SPEED`]..=[`MAX_SPEED`] (or not a
    /// number) is an error.
    pub fn try_scaled(speed: f64) -> Result<Self, ClockError> {
        if !(MIN_SPEED..=MAX_SPEED).contains(&speed) {
            return Err(ClockError::Speed(speed));
        }
        Ok(Self::scaled_from(speed, wall_now()))
    }

    /// Scaled simulated time that starts at `start` instead of the wall clock's now (to
    /// rehearse a later date); `speed` is checked as in [`Clock::try_scaled`].
    pub fn scaled_at(speed: f64, start: Timestamp) -> Result<Self, ClockError> {
        if !(MIN_SPEED..=MAX_SPEED).contains(&speed) {
            return Err(ClockError::Speed(speed));
        }
        Ok(Self::scaled_from(speed, start))
    }

    fn scaled_from(speed: f64, start: Timestamp) -> Self {
        Self::new(
            Mode::Scaled {
                speed,
                wall_start: Instant::now(),
                sim_start: start,
            },
            start,
        )
    }

    /// Simulated time that starts at `start` and moves only through [`Clock::advance`].
    pub fn manual_at(start: Timestamp) -> Self {
        Self::new(Mode::Manual, start)
    }

    /// Simulated time that starts at a fixed, reproducible instant (2026-01-01T00:00:00Z).
    pub fn manual() -> Self {
        Self::manual_at(Timestamp(1_767_225_600_000))
    }

    pub fn now(&self) -> Timestamp {
        match &self.inner.mode {
            Mode::System => wall_now(),
            Mode::Scaled {
                speed,
                wall_start,
                sim_start,
            } => {
                let wall = wall_start.elapsed().as_secs_f64() * speed;
                sim_start.plus(saturating_secs_f64(wall))
            }
            Mode::Manual => *self.lock_now(),
        }
    }

    fn lock_sleepers(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::BTreeMap<(Timestamp, u64), Option<std::task::Waker>>,
    > {
        self.inner
            .sleepers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Manual mode: the earliest deadline of a sleep in progress, if any.
    pub fn next_wakeup(&self) -> Option<Timestamp> {
        self.lock_sleepers().keys().next().map(|(t, _)| *t)
    }

    fn lock_now(&self) -> std::sync::MutexGuard<'_, Timestamp> {
        // A poisoned lock only means a panic elsewhere; the timestamp itself is always valid.
        self.inner.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Manual mode: move time forward by `d` and wake every sleeper whose deadline passed.
    /// Other modes: no effect (time moves by itself).
    pub fn advance(&self, d: Duration) {
        if let Mode::Manual = self.inner.mode {
            let now = {
                let mut now = self.lock_now();
                *now = now.plus(d);
                *now
            };
            // Time is set before the sleeps are read: a sleep that registers meanwhile reads
            // the new time after registering (see `sleep_until`), so none is missed.
            let due: Vec<std::task::Waker> = self
                .lock_sleepers()
                .range_mut(..=(now, u64::MAX))
                .filter_map(|(_, waker)| waker.take())
                .collect();
            for waker in due {
                waker.wake();
            }
            self.inner.tick.send_replace(now);
        }
    }

    /// Manual mode: move time to `t` if it is later than now.
    pub fn advance_to(&self, t: Timestamp) {
        let now = self.now();
        if t > now {
            self.advance(t.since(now));
        }
    }

    /// Wait until the clock reads at least `t`.
    pub async fn sleep_until(&self, t: Timestamp) {
        match &self.inner.mode {
            Mode::System => {
                let d = t.since(wall_now());
                if !d.is_zero() {
                    tokio::time::sleep(d).await;
                }
            }
            Mode::Scaled { speed, .. } => loop {
                let left = t.since(self.now());
                if left.is_zero() {
                    return;
                }
                // At least a millisecond: a sub-millisecond remainder must not spin.
                let wall = saturating_secs_f64(left.as_secs_f64() / speed);
                tokio::time::sleep(wall.max(Duration::from_millis(1))).await;
            },
            Mode::Manual => {
                let id = self
                    .inner
                    .next_id
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let key = (t, id);
                let _sleeper = Sleeper { clock: self, key };
                std::future::poll_fn(|cx| {
                    if self.now() >= t {
                        return std::task::Poll::Ready(());
                    }
                    self.lock_sleepers().insert(key, Some(cx.waker().clone()));
                    // Read again once registered: time that moved in between woke nobody.
                    if self.now() >= t {
                        std::task::Poll::Ready(())
                    } else {
                        std::task::Poll::Pending
                    }
                })
                .await
            }
        }
    }

    /// Wait for `d` of this clock's time.
    pub async fn sleep(&self, d: Duration) {
        let t = self.now().plus(d);
        self.sleep_until(t).await
    }

    /// Wait for the next beat of `every`: the next time the clock reads a whole multiple of
    /// it (a full `every` when it reads one now). Steps that look again on a beat look
    /// together: a real engine wakes once a beat rather than once per step, and a twin
    /// moves its time once for all of them.
    pub async fn sleep_to_beat(&self, every: Duration) {
        let every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        let now = self.now().as_millis();
        let wait = every_ms - now % every_ms;
        self.sleep_until(Timestamp(now.saturating_add(wait))).await
    }

    /// Marks a request in flight until the guard drops: a client waiting for an answer, or
    /// a server working on one. Costs two atomic operations; only a simulation driver reads
    /// the count ([`Clock::quiet`]).
    pub fn busy(&self) -> Busy {
        self.inner.busy.fetch_add(1, Ordering::SeqCst);
        Busy {
            inner: self.inner.clone(),
        }
    }

    /// Marks an answer that waits for simulated time (a twin's handler sleeping on this
    /// clock while its caller is busy) until the guard drops.
    pub fn parked(&self) -> Parked {
        self.inner.parked.fetch_add(1, Ordering::SeqCst);
        self.inner.answered.notify_waiters();
        Parked {
            inner: self.inner.clone(),
        }
    }

    /// Whether every request in flight waits for simulated time: then, and only then, a
    /// simulation driver moves time without changing what the callers see.
    pub fn quiet(&self) -> bool {
        self.inner.busy.load(Ordering::SeqCst) <= self.inner.parked.load(Ordering::SeqCst)
    }

    /// Returns once the clock is [`quiet`](Clock::quiet): at once if it is, else when the
    /// last request in flight is answered (or parks on the clock).
    pub async fn until_quiet(&self) {
        loop {
            let answered = self.inner.answered.notified();
            tokio::pin!(answered);
            // Registered before the check, so an answer between the two is not missed.
            answered.as_mut().enable();
            if self.quiet() {
                return;
            }
            answered.await;
        }
    }

    /// A receiver that changes whenever manual time moves (never for other modes). Lets a
    /// simulation driver react to `advance` without polling.
    pub fn ticks(&self) -> watch::Receiver<Timestamp> {
        self.inner.tick.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_knows_its_next_wakeup_and_forgets_dropped_sleeps() {
        let c = Clock::manual();
        let start = c.now();
        assert_eq!(c.next_wakeup(), None);
        let c2 = c.clone();
        let long = tokio::spawn(async move { c2.sleep(Duration::from_secs(60)).await });
        let c3 = c.clone();
        let short = tokio::spawn(async move { c3.sleep(Duration::from_secs(5)).await });
        while c.lock_sleepers().len() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(c.next_wakeup(), Some(start.plus(Duration::from_secs(5))));
        c.advance(Duration::from_secs(5));
        let _ = short.await;
        assert_eq!(c.next_wakeup(), Some(start.plus(Duration::from_secs(60))));
        long.abort();
        let _ = long.await;
        assert_eq!(c.next_wakeup(), None);
    }

    /// Moving time wakes the sleeps it ends and no other: a sleep is polled again only
    /// when its own deadline is reached.
    #[tokio::test]
    async fn moving_time_wakes_only_the_sleeps_it_ends() {
        use std::future::Future;
        use std::sync::atomic::AtomicUsize;
        let c = Clock::manual();
        let polls = Arc::new(AtomicUsize::new(0));
        let (c2, p2) = (c.clone(), polls.clone());
        let far = tokio::spawn(async move {
            let mut sleep = std::pin::pin!(c2.sleep(Duration::from_secs(3600)));
            std::future::poll_fn(|cx| {
                p2.fetch_add(1, Ordering::SeqCst);
                sleep.as_mut().poll(cx)
            })
            .await;
        });
        while c.lock_sleepers().is_empty() {
            tokio::task::yield_now().await;
        }
        let first = polls.load(Ordering::SeqCst);
        for _ in 0..100 {
            c.advance(Duration::from_secs(1));
            tokio::task::yield_now().await;
        }
        assert_eq!(
            polls.load(Ordering::SeqCst),
            first,
            "not woken before its deadline"
        );
        c.advance(Duration::from_secs(3500));
        let _ = far.await;
        assert!(polls.load(Ordering::SeqCst) > first);
        assert_eq!(c.next_wakeup(), None);
    }

    #[tokio::test]
    async fn until_quiet_returns_when_the_last_request_is_answered_or_parks() {
        let c = Clock::manual();
        c.until_quiet().await;
        let (a, b) = (c.busy(), c.busy());
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.until_quiet().await });
        tokio::task::yield_now().await;
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one request is still in flight");
        // The other parks on the clock: time may move.
        let parked = c.parked();
        let _ = waiter.await;
        assert!(c.quiet());
        drop(parked);
        assert!(!c.quiet());
        drop(b);
        assert!(c.quiet());
    }

    #[test]
    fn timestamp_formats_as_rfc3339() {
        assert_eq!(Timestamp(0).rfc3339(), "1970-01-01T00:00:00Z");
        let t = Timestamp(1_767_225_600_042);
        assert_eq!(t.rfc3339_millis(), "2026-01-01T00:00:00.042Z");
        assert_eq!(Timestamp::parse_rfc3339(&t.rfc3339_millis()), Some(t));
        for bad in [
            "2026-01-01T00:00:00.04Z",
            "2026-01-01T00:00:00,042Z",
            "2026-01-01T00:00:00.04xZ",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(
            Timestamp(1_767_225_600_000).rfc3339(),
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            Timestamp(1_796_023_926_000).rfc3339(),
            "2026-11-30T07:32:06Z"
        );
    }

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_only_when_advanced() {
        let clock = Clock::manual();
        let start = clock.now();
        let c = clock.clone();
        let sleeper = tokio::spawn(async move {
            c.sleep(Duration::from_secs(60)).await;
            c.now()
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(30));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(30));
        let woke_at = sleeper.await.unwrap_or_default();
        assert_eq!(woke_at.since(start), Duration::from_secs(60));
    }

    #[tokio::test]
    async fn sleepers_on_a_beat_wake_together_on_its_next_multiple() {
        let clock = Clock::manual_at(Timestamp(1_000_002_000));
        let every = Duration::from_secs(5);
        let woke = |c: Clock, after: Duration| {
            tokio::spawn(async move {
                c.sleep(after).await;
                c.sleep_to_beat(every).await;
                c.now()
            })
        };
        // Begun 1 s apart, on a beat of 5 s: both wake at the next multiple of 5 s after.
        let a = woke(clock.clone(), Duration::from_secs(1));
        let b = woke(clock.clone(), Duration::from_secs(2));
        for _ in 0..10 {
            tokio::task::yield_now().await;
            clock.advance(Duration::from_millis(500));
        }
        let (a, b) = (a.await.unwrap_or_default(), b.await.unwrap_or_default());
        assert_eq!(a, Timestamp(1_000_005_000));
        assert_eq!(b, a);
        // On a beat already, it waits a whole one.
        clock.advance_to(Timestamp(1_000_010_000));
        let c = clock.clone();
        let on_beat = tokio::spawn(async move {
            c.sleep_to_beat(every).await;
            c.now()
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(5));
        assert_eq!(on_beat.await.unwrap_or_default(), Timestamp(1_000_015_000));
    }

    #[test]
    fn extreme_speeds_are_refused_or_clamped_and_never_panic() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e18, 1e308, 1e-9] {
            assert!(
                matches!(Clock::try_scaled(bad), Err(ClockError::Speed(_))),
                "{bad}"
            );
            // The lenient constructor clamps; reading it must not panic.
            let _ = Clock::scaled(bad).now();
        }
        assert!(Clock::try_scaled(MAX_SPEED).is_ok());
        assert!(Clock::try_scaled(MIN_SPEED).is_ok());
        assert_eq!(Timestamp(5).plus(Duration::MAX), Timestamp(u64::MAX));
        assert_eq!(saturating_secs_f64(1e308), Duration::MAX);
        assert_eq!(saturating_secs_f64(f64::NAN), Duration::ZERO);
    }

    #[test]
    fn scaled_clock_runs_faster_than_the_wall() {
        let clock = Clock::scaled(1000.0);
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        // 5 ms of wall time is at least 5 s of simulated time at x1000.
        assert!(clock.now().since(a) >= Duration::from_secs(5));
    }
}
