//! When a broken session may try to reconnect: exponential backoff with jitter (gRPC's
//! connection-backoff shape), sans-IO: the caller passes `now`, and the random source is a
//! seeded generator, so the schedule is tested deterministically.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::config::ClientConfig;
use crate::status::Status;

/// The parameters, validated (see the `reconnect_*` fields of [`ClientConfig`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct BackoffParams {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
    pub(crate) multiplier: f64,
    pub(crate) jitter: f64,
}

impl BackoffParams {
    /// The `reconnect_*` fields of `cfg`.
    ///
    /// # Errors
    /// INVALID_ARGUMENT naming the field out of range.
    pub(crate) fn from_config(cfg: &ClientConfig) -> Result<BackoffParams, Status> {
        let bad = |field: &str, v: String, range: &str| {
            Err(Status::invalid_argument(format!("ClientConfig::{field} {v} is not in {range}")))
        };
        if cfg.reconnect_initial_backoff.is_zero()
            || cfg.reconnect_initial_backoff > cfg.reconnect_max_backoff
        {
            return bad(
                "reconnect_initial_backoff",
                format!("{:?}", cfg.reconnect_initial_backoff),
                &format!("(0, reconnect_max_backoff = {:?}]", cfg.reconnect_max_backoff),
            );
        }
        if !(1.0..=100.0).contains(&cfg.reconnect_multiplier) {
            return bad("reconnect_multiplier", cfg.reconnect_multiplier.to_string(), "1.0..=100.0");
        }
        if !(0.0..=1.0).contains(&cfg.reconnect_jitter) {
            return bad("reconnect_jitter", cfg.reconnect_jitter.to_string(), "0.0..=1.0");
        }
        Ok(BackoffParams {
            initial: cfg.reconnect_initial_backoff,
            max: cfg.reconnect_max_backoff,
            multiplier: cfg.reconnect_multiplier,
            jitter: cfg.reconnect_jitter,
        })
    }
}

/// The reconnect schedule of one client.
///
/// After a break the first attempt may be made at once. After the k-th failed attempt in a row
/// (k ≥ 1) the next one waits `min(initial × multiplier^(k−1), max) × u`, with `u` uniform in
/// `[1 − jitter, 1 + jitter]`, capped at `max`. A successful connect resets the schedule.
#[derive(Debug)]
pub(crate) struct Backoff {
    params: BackoffParams,
    rng: fastrand::Rng,
    /// The nominal delay after the next failure (before jitter).
    nominal: Duration,
    /// No attempt before this instant.
    not_before: Option<Instant>,
    /// Failed attempts since the last success.
    failures: u32,
}

impl Backoff {
    /// A schedule drawing its jitter from `rng`.
    pub(crate) fn new(params: BackoffParams, rng: fastrand::Rng) -> Backoff {
        Backoff { nominal: params.initial, params, rng, not_before: None, failures: 0 }
    }

    /// `Ok` when an attempt may be made at `now`; otherwise the instant from which one may.
    pub(crate) fn check(&self, now: Instant) -> Result<(), Instant> {
        match self.not_before {
            Some(t) if now < t => Err(t),
            _ => Ok(()),
        }
    }

    /// An attempt made at `now` failed: returns the delay until the next one may be made.
    pub(crate) fn on_failure(&mut self, now: Instant) -> Duration {
        let j = self.params.jitter;
        let factor = 1.0 - j + 2.0 * j * self.rng.f64();
        let delay = self.nominal.mul_f64(factor).min(self.params.max);
        self.not_before = Some(now + delay);
        self.nominal = self.nominal.mul_f64(self.params.multiplier).min(self.params.max);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// An attempt succeeded: the next break starts the schedule over.
    pub(crate) fn on_success(&mut self) {
        self.nominal = self.params.initial;
        self.not_before = None;
        self.failures = 0;
    }

    /// Failed attempts since the last success.
    #[cfg(test)]
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// `Ok` when a session to `peer` that broke for `reason` may try to reconnect at `now`.
    ///
    /// # Errors
    /// UNAVAILABLE naming why the session broke and when the next attempt may be made (what a
    /// call made meanwhile ends with, without connecting).
    pub(crate) fn due(&self, peer: SocketAddr, reason: &Status, now: Instant) -> Result<(), Status> {
        self.check(now).map_err(|at| {
            Status::unavailable(format!(
                "the session to {peer} broke ({}); next reconnect attempt in {} ms",
                reason.message(),
                ms_ceil(at - now)
            ))
        })
    }

    /// The attempt made at `now` to reconnect the session to `peer`, which broke for `reason`,
    /// failed with `error`: records it ([`Backoff::on_failure`]) and returns the UNAVAILABLE the
    /// calls waiting for it end with, naming the attempt and when the next one may be made.
    pub(crate) fn failed(
        &mut self,
        peer: SocketAddr,
        reason: &Status,
        error: &Status,
        now: Instant,
    ) -> Status {
        let delay = self.on_failure(now);
        tracing::info!(%peer, error = %error, ?delay, "reconnect attempt failed");
        Status::unavailable(format!(
            "the session to {peer} broke ({}); reconnect attempt {} failed ({}); next attempt in {} ms",
            reason.message(),
            self.failures,
            error.message(),
            ms_ceil(delay)
        ))
    }
}

/// `d` in whole milliseconds, rounded up (a call told "in 0 ms" would try too early).
fn ms_ceil(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(jitter: f64) -> BackoffParams {
        BackoffParams {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            multiplier: 2.0,
            jitter,
        }
    }

    /// Delays of `n` failures in a row, each attempt made as soon as allowed (fake clock).
    fn schedule(b: &mut Backoff, t0: Instant, n: usize) -> Vec<Duration> {
        let mut now = t0;
        (0..n)
            .map(|_| {
                assert_eq!(b.check(now), Ok(()), "an attempt is allowed when the last delay ran out");
                let d = b.on_failure(now);
                assert_eq!(b.check(now), Err(now + d));
                assert_eq!(b.check(now + d - Duration::from_nanos(1)), Err(now + d));
                now += d;
                d
            })
            .collect()
    }

    #[test]
    fn without_jitter_the_delay_grows_by_the_multiplier_up_to_the_cap() {
        let t0 = Instant::now();
        let mut b = Backoff::new(params(0.0), fastrand::Rng::with_seed(1));
        let ms: Vec<u128> = schedule(&mut b, t0, 8).iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(b.failures(), 8);
    }

    #[test]
    fn jitter_stays_in_its_band_and_a_seed_gives_the_same_schedule() {
        let t0 = Instant::now();
        let mut a = Backoff::new(params(0.2), fastrand::Rng::with_seed(42));
        let mut b = Backoff::new(params(0.2), fastrand::Rng::with_seed(42));
        let mut c = Backoff::new(params(0.2), fastrand::Rng::with_seed(43));
        let (da, db, dc) = (schedule(&mut a, t0, 12), schedule(&mut b, t0, 12), schedule(&mut c, t0, 12));
        assert_eq!(da, db, "same seed, same schedule");
        assert_ne!(da, dc, "another seed, another schedule");
        let mut nominal = 100.0f64;
        for d in &da {
            let ms = d.as_secs_f64() * 1e3;
            assert!(
                ms >= nominal * 0.8 - 1e-6 && ms <= (nominal * 1.2).min(2000.0) + 1e-6,
                "{ms} vs {nominal}"
            );
            nominal = (nominal * 2.0).min(2000.0);
        }
        // Jitter is real: not every delay is the nominal one.
        assert!(da.iter().take(4).zip([100u64, 200, 400, 800]).any(|(d, n)| *d != Duration::from_millis(n)));
    }

    #[test]
    fn success_resets_the_schedule() {
        let t0 = Instant::now();
        let mut b = Backoff::new(params(0.0), fastrand::Rng::with_seed(1));
        schedule(&mut b, t0, 4);
        b.on_success();
        assert_eq!(b.check(t0), Ok(()), "the first attempt after a success is immediate");
        assert_eq!(b.failures(), 0);
        assert_eq!(b.on_failure(t0), Duration::from_millis(100));
    }

    #[test]
    fn config_out_of_range_is_refused_naming_the_field() {
        let ok = ClientConfig::default();
        let p = BackoffParams::from_config(&ok).unwrap();
        assert_eq!(p.initial, Duration::from_millis(100));
        assert_eq!(p.max, Duration::from_secs(10));
        for (cfg, field) in [
            (ok.clone().reconnect_initial_backoff(Duration::ZERO), "reconnect_initial_backoff"),
            (ok.clone().reconnect_initial_backoff(Duration::from_secs(11)), "reconnect_initial_backoff"),
            (ok.clone().reconnect_multiplier(0.5), "reconnect_multiplier"),
            (ok.clone().reconnect_multiplier(f64::NAN), "reconnect_multiplier"),
            (ok.clone().reconnect_jitter(1.5), "reconnect_jitter"),
        ] {
            let e = BackoffParams::from_config(&cfg).unwrap_err();
            assert_eq!(e.code(), crate::status::Code::InvalidArgument);
            assert!(e.message().contains(field), "{e}");
        }
    }
}
