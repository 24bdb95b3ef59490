//! Timestamps of the measuring loops: the CPU's time-stamp counter, read through `quanta` (one
//! `RDTSC`, no system call), calibrated against the OS monotonic clock once per process; where
//! the TSC is not invariant (no `constant_tsc`/`nonstop_tsc`, as under some hypervisors),
//! `quanta` reads the OS monotonic clock instead. Why: in the Soft-RoCE guest (qemu) one
//! `clock_gettime` costs about 1 µs, which inflated every round trip measured there; on this
//! project's KVM machines `Instant::now()` costs about 20 ns, an `RDTSC` about 10.
//!
//! A [`Stamp`] is a raw counter value: only differences of two stamps of one process mean
//! anything ([`Stamp::nanos_since`]).

use std::sync::OnceLock;

/// The process's calibrated clock (calibrated on first use: about 10 ms, once).
fn clock() -> &'static quanta::Clock {
    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

/// A point in time, as the raw counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u64);

/// Now. Call [`warm`] before a measuring loop so that the first stamp does not pay the
/// calibration.
#[inline(always)]
pub fn now() -> Stamp {
    Stamp(clock().raw())
}

/// Calibrates the clock now (outside any measured interval).
pub fn warm() {
    let _ = clock();
}

impl Stamp {
    /// Nanoseconds from `earlier` to `self` (0 when `earlier` is later).
    #[inline(always)]
    pub fn nanos_since(self, earlier: Stamp) -> u64 {
        if self.0 <= earlier.0 {
            return 0;
        }
        clock().delta_as_nanos(earlier.0, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_agree_with_the_os_clock_within_a_few_percent() {
        warm();
        let (t0, i0) = (now(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (t1, i1) = (now(), std::time::Instant::now());
        let ours = t1.nanos_since(t0) as f64;
        let os = i1.duration_since(i0).as_nanos() as f64;
        assert!((ours / os - 1.0).abs() < 0.05, "counter {ours} ns against the OS clock's {os} ns");
        assert_eq!(t0.nanos_since(t1), 0, "a later stamp minus an earlier one only");
    }
}
