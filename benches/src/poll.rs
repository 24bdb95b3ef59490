//! How a thread waits for work: spinning (the product's default) or spinning a little and then
//! yielding the core (tests, shared machines). Also the periodic slow checks of a waiting loop.

use std::time::{Duration, Instant};

use crate::cli::PollKind;

/// Empty polls before a yielding waiter gives up the core.
pub const SPINS_BEFORE_YIELD: u32 = 64;
/// Empty polls between two slow checks (clock, TCP peek).
const SLOW_CHECK_EVERY: u32 = 1 << 12;
/// How long a waiter may see nothing before it reports a stall.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits between empty polls. One per waiting loop; `progress()` when work was found.
#[derive(Debug)]
pub struct Waiter {
    kind: PollKind,
    empty: u32,
    since: Option<Instant>,
}

impl Waiter {
    /// A waiter with the given policy.
    pub fn new(kind: PollKind) -> Self {
        Waiter { kind, empty: 0, since: None }
    }

    /// Work was found: start counting empty polls again.
    #[inline]
    pub fn progress(&mut self) {
        self.empty = 0;
        self.since = None;
    }

    /// An empty poll. Returns true every few thousand empty polls: time for slow checks
    /// ([`Waiter::stalled`], a peek at the TCP channel).
    #[inline]
    pub fn idle(&mut self) -> bool {
        self.empty = self.empty.wrapping_add(1);
        match self.kind {
            PollKind::Busy => std::hint::spin_loop(),
            PollKind::Yield if self.empty > SPINS_BEFORE_YIELD => std::thread::yield_now(),
            PollKind::Yield => std::hint::spin_loop(),
        }
        self.empty % SLOW_CHECK_EVERY == 0
    }

    /// True once nothing happened for [`STALL_TIMEOUT`] (call from a slow check).
    pub fn stalled(&mut self) -> bool {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= STALL_TIMEOUT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_checks_are_periodic() {
        let mut w = Waiter::new(PollKind::Yield);
        let hits = (0..3 * SLOW_CHECK_EVERY).filter(|_| w.idle()).count();
        assert_eq!(hits, 3);
        w.progress();
        assert!(!w.stalled());
    }
}
