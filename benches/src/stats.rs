//! Latency and bandwidth statistics: samples go into an HDR histogram (3 significant digits, so
//! every reported figure is within 0.1 % of the exact sample), figures come out in nanoseconds.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency sample kept: 60 s in ns. Longer samples are clamped to it (and counted).
pub const MAX_SAMPLE_NS: u64 = 60_000_000_000;

/// Collects latency samples in nanoseconds. Recording allocates nothing.
#[derive(Clone, Debug)]
pub struct LatencyRecorder {
    hist: Histogram<u64>,
    clamped: u64,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyRecorder {
    /// An empty recorder for samples from 1 ns to [`MAX_SAMPLE_NS`].
    pub fn new() -> Self {
        let hist =
            Histogram::new_with_bounds(1, MAX_SAMPLE_NS, 3).expect("static histogram bounds are valid");
        LatencyRecorder { hist, clamped: 0 }
    }

    /// Records one sample of `ns` nanoseconds (0 is recorded as 1 ns, over [`MAX_SAMPLE_NS`] as
    /// the maximum).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        let v = ns.clamp(1, MAX_SAMPLE_NS);
        if v != ns && ns > MAX_SAMPLE_NS {
            self.clamped += 1;
        }
        // In bounds by the clamp above, so this cannot fail.
        let _ = self.hist.record(v);
    }

    /// Adds `other`'s samples (one recorder per task, merged at the end).
    pub fn merge(&mut self, other: &LatencyRecorder) {
        // Same bounds on both sides, so this cannot fail.
        let _ = self.hist.add(&other.hist);
        self.clamped += other.clamped;
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Samples over [`MAX_SAMPLE_NS`] that were clamped.
    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    /// The underlying histogram (for the CDF plot).
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// The summary perftest prints (and more). `None` when empty.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.hist.is_empty() {
            return None;
        }
        let h = &self.hist;
        Some(LatencySummary {
            iterations: h.len(),
            min_ns: h.min() as f64,
            max_ns: h.max() as f64,
            typical_ns: h.value_at_quantile(0.5) as f64,
            avg_ns: h.mean(),
            stdev_ns: h.stdev(),
            p99_ns: h.value_at_quantile(0.99) as f64,
            p99_9_ns: h.value_at_quantile(0.999) as f64,
            p99_99_ns: h.value_at_quantile(0.9999) as f64,
        })
    }

    /// Points of the cumulative distribution: (latency in ns, fraction of samples at or below),
    /// one per distinct recorded bucket, ascending.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let total = self.hist.len() as f64;
        let mut out = Vec::new();
        let mut seen = 0u64;
        for v in self.hist.iter_recorded() {
            seen += v.count_at_value();
            out.push((self.hist.highest_equivalent(v.value_iterated_to()) as f64, seen as f64 / total));
        }
        out
    }
}

/// Latency figures of one run, in nanoseconds. `typical` is the median, as perftest's t_typical.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Samples measured.
    pub iterations: u64,
    /// Smallest sample.
    pub min_ns: f64,
    /// Largest sample.
    pub max_ns: f64,
    /// Median (p50).
    pub typical_ns: f64,
    /// Mean.
    pub avg_ns: f64,
    /// Standard deviation.
    pub stdev_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p99_9_ns: f64,
    /// 99.99th percentile.
    pub p99_99_ns: f64,
}

/// Bandwidth figures of one run. MB is 2^20 bytes, as perftest's MB/sec.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BandwidthSummary {
    /// Messages (or RPCs) completed.
    pub iterations: u64,
    /// Payload bytes per message (for an RPC: request + response payload).
    pub bytes_per_iter: u64,
    /// Wall time from the first post to the last completion, in ns.
    pub elapsed_ns: u64,
    /// Best rate over any completion window, in MB/s (2^20 bytes/s).
    pub peak_mb_per_s: f64,
    /// Average rate, in MB/s (2^20 bytes/s).
    pub avg_mb_per_s: f64,
    /// Messages per second, in millions.
    pub msg_rate_mpps: f64,
}

impl BandwidthSummary {
    /// Computes the summary of `iterations` messages of `bytes_per_iter` bytes in `elapsed_ns`,
    /// where the best completion window moved `peak_bytes` in `peak_ns` (pass 0, 0 when unknown:
    /// the peak is then the average).
    pub fn new(iterations: u64, bytes_per_iter: u64, elapsed_ns: u64, peak_bytes: u64, peak_ns: u64) -> Self {
        const MB: f64 = (1u64 << 20) as f64;
        let secs = elapsed_ns.max(1) as f64 / 1e9;
        let avg = (iterations as f64 * bytes_per_iter as f64) / secs / MB;
        let peak = if peak_ns == 0 { avg } else { peak_bytes as f64 / (peak_ns as f64 / 1e9) / MB };
        BandwidthSummary {
            iterations,
            bytes_per_iter,
            elapsed_ns,
            peak_mb_per_s: peak.max(avg),
            avg_mb_per_s: avg,
            msg_rate_mpps: iterations as f64 / secs / 1e6,
        }
    }

    /// Messages (RPCs) per second.
    pub fn per_second(&self) -> f64 {
        self.msg_rate_mpps * 1e6
    }

    /// Payload bytes per second (goodput), in bytes/s.
    pub fn goodput_bytes_per_s(&self) -> f64 {
        self.avg_mb_per_s * (1u64 << 20) as f64
    }
}

/// Tracks the peak rate of a bandwidth run: the best rate over consecutive intervals of at
/// least `min_ns` each, measured between completion samples (so a burst of completions polled
/// together cannot fake a rate).
#[derive(Clone, Debug)]
pub struct PeakWindow {
    min_ns: u64,
    /// Start of the current interval: (ns since start, cumulative bytes).
    start: (u64, u64),
    best_bytes: u64,
    best_ns: u64,
}

impl PeakWindow {
    /// Default shortest interval: 1 ms.
    pub const DEFAULT_MIN_NS: u64 = 1_000_000;

    /// A tracker over intervals of at least `min_ns` ns (at least 1).
    pub fn new(min_ns: u64) -> Self {
        PeakWindow { min_ns: min_ns.max(1), start: (0, 0), best_bytes: 0, best_ns: 0 }
    }

    /// Notes that, at `t_ns` since the start, `total_bytes` bytes in all had completed.
    #[inline]
    pub fn completed(&mut self, t_ns: u64, total_bytes: u64) {
        let (t0, b0) = self.start;
        let dt = t_ns.saturating_sub(t0);
        if dt < self.min_ns {
            return;
        }
        let db = total_bytes.saturating_sub(b0);
        // db/dt > best_bytes/best_ns, in integers.
        if self.best_ns == 0
            || (db as u128) * (self.best_ns as u128) > (self.best_bytes as u128) * (dt as u128)
        {
            self.best_bytes = db;
            self.best_ns = dt;
        }
        self.start = (t_ns, total_bytes);
    }

    /// (bytes, ns) of the best interval; (0, 0) when no interval reached `min_ns`.
    pub fn best(&self) -> (u64, u64) {
        (self.best_bytes, self.best_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_samples() {
        let mut r = LatencyRecorder::new();
        // 1..=1000 ns: median 500, mean 500.5, p99 990, min 1, max 1000.
        for ns in 1..=1000 {
            r.record(ns);
        }
        let s = r.summary().unwrap();
        assert_eq!(s.iterations, 1000);
        assert_eq!(s.min_ns, 1.0);
        assert_eq!(s.max_ns, 1000.0);
        assert_eq!(s.typical_ns, 500.0);
        assert!((s.avg_ns - 500.5).abs() < 0.01, "{}", s.avg_ns);
        assert_eq!(s.p99_ns, 990.0);
        assert_eq!(s.p99_9_ns, 999.0);
        assert_eq!(s.p99_99_ns, 1000.0);
        // Population stdev of 1..=1000 is sqrt((1000^2 - 1) / 12) = 288.675.
        assert!((s.stdev_ns - 288.675).abs() < 0.01, "{}", s.stdev_ns);
    }

    #[test]
    fn empty_recorder_has_no_summary_and_zero_clamps() {
        let mut r = LatencyRecorder::new();
        assert!(r.summary().is_none());
        r.record(0);
        r.record(MAX_SAMPLE_NS + 5);
        assert_eq!(r.len(), 2);
        assert_eq!(r.clamped(), 1);
        let s = r.summary().unwrap();
        assert_eq!(s.min_ns, 1.0);
    }

    #[test]
    fn cdf_is_ascending_and_ends_at_one() {
        let mut r = LatencyRecorder::new();
        for ns in [100, 100, 200, 400] {
            r.record(ns);
        }
        let c = r.cdf();
        assert_eq!(c, vec![(100.0, 0.5), (200.0, 0.75), (400.0, 1.0)]);
    }

    #[test]
    fn bandwidth_in_perftest_units() {
        // 1000 messages of 1 MiB in 1 s: 1000 MB/s, 0.001 Mpps.
        let b = BandwidthSummary::new(1000, 1 << 20, 1_000_000_000, 0, 0);
        assert!((b.avg_mb_per_s - 1000.0).abs() < 1e-9);
        assert!((b.peak_mb_per_s - 1000.0).abs() < 1e-9);
        assert!((b.msg_rate_mpps - 0.001).abs() < 1e-12);
        assert!((b.per_second() - 1000.0).abs() < 1e-6);
        // A peak window of 2 MiB in 1 ms is 2000 MB/s.
        let b = BandwidthSummary::new(1000, 1 << 20, 1_000_000_000, 2 << 20, 1_000_000);
        assert!((b.peak_mb_per_s - 2000.0).abs() < 1e-9);
    }

    #[test]
    fn peak_is_the_best_interval_of_at_least_min() {
        let mut p = PeakWindow::new(10);
        assert_eq!(p.best(), (0, 0));
        // Samples (ns, cumulative bytes). Intervals close at >= 10 ns: 0->12 (600 B),
        // 12->22 (100 B, the burst at 13 is inside it), 22->40 (900 B).
        for (t, b) in [(5u64, 100u64), (12, 600), (13, 650), (22, 700), (30, 1000), (40, 1600)] {
            p.completed(t, b);
        }
        // Rates: 600/12 = 50, 100/10 = 10, 900/18 = 50 B/ns; the first best is kept on ties.
        assert_eq!(p.best(), (600, 12));
        p.completed(45, 2600); // 1000 B in 5 ns: shorter than the minimum, ignored
        assert_eq!(p.best(), (600, 12));
    }
}
