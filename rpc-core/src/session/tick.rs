//! When a driver that polls looks at its timers (the idle probe, the abandon watch, the control
//! channel): one rule for every polling loop of a client, sans-IO.
//!
//! The checks run when [`CHECK_INTERVAL`] has passed since the last ones, so they cost the same
//! however long a poll lasts. Reading the clock for that is itself rationed by a counter: an
//! empty poll that kept its core (a spin, an async poll) weighs 1, one that yielded or blocked
//! (it may have lasted a loaded machine's time slice, or a whole event wait) weighs
//! [`SLEPT_WEIGHT`], an event wait that a completion event ended (it lasted at most one event
//! wait, usually microseconds) weighs [`WOKEN_WEIGHT`], and the clock is read once the weights
//! reach [`CLOCK_AFTER`]: every 4096 spins (a busy poll pays an add and a compare), every 16
//! yields or timed-out waits, every 256 woken waits. Polls that found work do not count and do
//! not reset the count, so steady traffic still reaches the checks.

use std::time::{Duration, Instant};

/// Least time between two checks.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(1);

/// Weight of empty polls after which the clock is read.
pub const CLOCK_AFTER: u32 = 4096;

/// Weight of an empty poll that yielded or blocked (a spin weighs 1).
pub const SLEPT_WEIGHT: u32 = CLOCK_AFTER / 16;

/// Weight of an event wait that a completion event ended: it lasted at most one event wait
/// (`config::EVENT_WAIT`, 1 ms), and usually microseconds (the peer answered), so it weighs as
/// much as 16 spins: the clock is read once per 256 of them (a blocking client waits once per
/// call), and at most 256 ms of waits that each ended just before their timeout pass between
/// two readings while the peer sends a message a millisecond (a silent peer's waits time out:
/// [`SLEPT_WEIGHT`]).
pub const WOKEN_WEIGHT: u32 = SLEPT_WEIGHT / 16;

/// The rule's state (see the module docs).
#[derive(Debug, Default)]
pub struct Tick {
    weight: u32,
    /// The earliest next check (`None`: due at the first clock reading).
    next: Option<Instant>,
}

impl Tick {
    /// A fresh rule: the first clock reading finds the checks due.
    pub fn new() -> Tick {
        Tick::default()
    }

    /// An empty poll that kept its core. True when the checks are due now (`now` is read only
    /// when the count says so).
    #[inline]
    pub fn spun(&mut self, now: impl FnOnce() -> Instant) -> bool {
        self.add(1, now)
    }

    /// An empty poll that yielded or blocked. True when the checks are due now.
    #[inline]
    pub fn slept(&mut self, now: impl FnOnce() -> Instant) -> bool {
        self.add(SLEPT_WEIGHT, now)
    }

    /// `n` empty polls that yielded or blocked, at once (a look that stands for `n` rounds of
    /// looks). True when the checks are due now.
    #[inline]
    pub fn slept_for(&mut self, n: u32, now: impl FnOnce() -> Instant) -> bool {
        self.add(SLEPT_WEIGHT.saturating_mul(n.max(1)), now)
    }

    /// An event wait that a completion event ended (see [`WOKEN_WEIGHT`]). True when the checks
    /// are due now.
    #[inline]
    pub fn woken(&mut self, now: impl FnOnce() -> Instant) -> bool {
        self.add(WOKEN_WEIGHT, now)
    }

    #[inline]
    fn add(&mut self, weight: u32, now: impl FnOnce() -> Instant) -> bool {
        self.weight += weight;
        if self.weight < CLOCK_AFTER {
            return false;
        }
        self.weight = 0;
        self.due(now())
    }

    /// Whether the checks are due at `now` (and if so, the next ones are not before
    /// `now + CHECK_INTERVAL`).
    #[cold]
    fn due(&mut self, now: Instant) -> bool {
        if self.next.is_some_and(|n| now < n) {
            return false;
        }
        self.next = Some(now + CHECK_INTERVAL);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A look that stands for 8 rounds of looks weighs as 8 empty ones: two of them read the
    /// clock, as 16 single looks do (a spaced-out idle look keeps the control connection read
    /// about 800 ms apart). Sabotaged (`slept_for` weighing as one `slept`): "the 2nd look of 8
    /// rounds did not read the clock".
    #[test]
    fn a_look_standing_for_rounds_weighs_as_many() {
        let reads = Cell::new(0u32);
        let now = || {
            reads.set(reads.get() + 1);
            Instant::now()
        };
        let mut tick = Tick::new();
        assert!(!tick.slept_for(8, now), "the 1st look of 8 rounds read the clock");
        assert!(tick.slept_for(8, now), "the 2nd look of 8 rounds did not read the clock");
        assert_eq!(reads.get(), 1);
        let mut single = Tick::new();
        let due: Vec<bool> = (0..16).map(|_| single.slept_for(1, now)).collect();
        assert_eq!(due.iter().position(|&d| d), Some(15), "16 single looks: the 16th reads the clock");
    }

    /// Spins read the clock once per 4096, yields or waits once per 16, whatever mix; the
    /// checks run at most once per interval; a slow poll (a 10 ms yield on a loaded machine)
    /// cannot stretch the time between checks beyond 16 such polls.
    #[test]
    fn the_clock_is_read_by_count_and_the_checks_run_by_time() {
        let base = Instant::now();
        let t = Cell::new(base);
        let reads = Cell::new(0u32);
        let now = || {
            reads.set(reads.get() + 1);
            t.get()
        };
        let mut tick = Tick::new();
        // Busy polling, 100 ns a poll: one clock reading per 4096 polls, a check at most per 1 ms.
        let mut checks = 0;
        for _ in 0..100_000 {
            t.set(t.get() + Duration::from_nanos(100));
            checks += u32::from(tick.spun(now));
        }
        assert_eq!(reads.get(), 100_000 / 4096);
        // Readings at 0.41 ms steps; a check at the first reading at least 1 ms after the last
        // check: 0.41, 1.64, 2.87, 4.10, 5.32, 6.55, 7.78, 9.01 ms.
        assert_eq!(checks, 8, "10 ms of spinning: at most one check per 1 ms");
        // Yields of 10 ms each: a reading per 16 of them, each due (160 ms apart).
        let mut tick = Tick::new();
        reads.set(0);
        let mut gaps = Vec::new();
        let mut last = t.get();
        for _ in 0..64 {
            t.set(t.get() + Duration::from_millis(10));
            if tick.slept(now) {
                gaps.push(t.get() - last);
                last = t.get();
            }
        }
        assert_eq!(reads.get(), 4);
        assert!(gaps.iter().all(|g| *g <= Duration::from_millis(170)), "{gaps:?}");
        // A mix: 15 yields and 256 spins read the clock once.
        let mut tick = Tick::new();
        reads.set(0);
        for _ in 0..15 {
            tick.slept(now);
        }
        for _ in 0..255 {
            tick.spun(now);
        }
        assert_eq!(reads.get(), 0);
        tick.spun(now);
        assert_eq!(reads.get(), 1);
        // Within the interval the reading finds nothing due.
        for _ in 0..16 {
            assert!(!tick.slept(now), "the clock has not moved");
        }
        // Event waits that a completion ended: a reading per 256 of them, each due when they
        // lasted 1 ms (just short of their timeout): at most 256 ms between checks.
        let mut tick = Tick::new();
        reads.set(0);
        let mut checks = 0;
        for _ in 0..1024 {
            t.set(t.get() + Duration::from_millis(1));
            checks += u32::from(tick.woken(now));
        }
        assert_eq!((reads.get(), checks), (4, 4));
    }
}
