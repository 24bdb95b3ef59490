//! The measuring loops shared by every test: ping-pong latency (one timestamp per round trip,
//! perftest's `tposted[i+1] - tposted[i]`, from the cycle counter: [`crate::clock`]), and the
//! limit (iterations or duration).

use std::time::Duration;

use crate::cli::Limit;
use crate::error::PerfError;
use crate::progress::Progress;
use crate::stats::LatencyRecorder;

/// Iterations between two progress updates.
const PROGRESS_EVERY: u64 = 4096;

/// Runs `warmup` unmeasured round trips, then measured ones until `limit`, recording each round
/// trip's time in ns (the time between the starts of consecutive round trips, as perftest).
///
/// # Errors
/// The first error of `round_trip`.
pub fn latency<F>(
    limit: Limit,
    warmup: u64,
    progress: &Progress,
    mut round_trip: F,
) -> Result<LatencyRecorder, PerfError>
where
    F: FnMut() -> Result<(), PerfError>,
{
    for _ in 0..warmup {
        round_trip()?;
    }
    let mut rec = LatencyRecorder::new();
    crate::clock::warm();
    let start = crate::clock::now();
    let mut prev = start;
    let mut i = 0u64;
    loop {
        round_trip()?;
        let now = crate::clock::now();
        rec.record(now.nanos_since(prev));
        prev = now;
        i += 1;
        let elapsed = || Duration::from_nanos(now.nanos_since(start));
        let stop = match limit {
            Limit::Iters(n) => i >= n,
            Limit::Duration(d) => elapsed() >= d,
        };
        if stop {
            break;
        }
        if i % PROGRESS_EVERY == 0 {
            progress.fraction(fraction(limit, i, elapsed()));
        }
    }
    progress.fraction(1.0);
    Ok(rec)
}

/// True once `i` iterations or `elapsed` reach `limit`.
#[inline]
pub fn done(limit: Limit, i: u64, elapsed: std::time::Duration) -> bool {
    match limit {
        Limit::Iters(n) => i >= n,
        Limit::Duration(d) => elapsed >= d,
    }
}

/// How much of `limit` is done.
pub fn fraction(limit: Limit, i: u64, elapsed: std::time::Duration) -> f64 {
    match limit {
        Limit::Iters(n) => i as f64 / n.max(1) as f64,
        Limit::Duration(d) => elapsed.as_secs_f64() / d.as_secs_f64().max(1e-9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_warmup_plus_exact_iterations() {
        let mut calls = 0;
        let rec = latency(Limit::Iters(50), 7, &Progress::hidden(), || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 57);
        assert_eq!(rec.len(), 50);
    }

    #[test]
    fn stops_on_first_error() {
        let mut calls = 0;
        let r = latency(Limit::Iters(50), 0, &Progress::hidden(), || {
            calls += 1;
            if calls == 3 {
                Err(PerfError::Setup("boom".into()))
            } else {
                Ok(())
            }
        });
        assert_eq!(r.unwrap_err().to_string(), "boom");
        assert_eq!(calls, 3);
    }
}
