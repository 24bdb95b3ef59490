//! What a run measured, printed as tables and written as JSON (`--json`).

use serde::Serialize;

use crate::cli::TestKind;
use crate::stats::{BandwidthSummary, LatencySummary};

/// One measurement: a test at one size.
#[derive(Clone, Debug, Serialize)]
pub struct TestResult {
    /// Which test.
    pub test: TestKind,
    /// Message size in bytes (for RPCs: the request payload).
    pub bytes: usize,
    /// RPC request payload in bytes (raw tests: `bytes`).
    pub req_bytes: usize,
    /// RPC response payload in bytes (raw tests: `bytes`; write_bw: 0).
    pub resp_bytes: usize,
    /// Operations in flight.
    pub concurrency: u32,
    /// The figures.
    #[serde(flatten)]
    pub measure: Measure,
}

/// Latency or bandwidth figures.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// Round-trip latency.
    Latency(LatencyMeasure),
    /// Bandwidth.
    Bandwidth(BandwidthSummary),
}

/// Round-trip latency figures and their distribution.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyMeasure {
    /// The summary, in ns.
    #[serde(flatten)]
    pub summary: LatencySummary,
    /// CDF points (ns, fraction at or below) for plots; not written to JSON.
    #[serde(skip)]
    pub cdf: Vec<(f64, f64)>,
}

impl TestResult {
    /// The latency summary, for latency tests.
    pub fn latency(&self) -> Option<&LatencySummary> {
        match &self.measure {
            Measure::Latency(m) => Some(&m.summary),
            Measure::Bandwidth(_) => None,
        }
    }

    /// The bandwidth summary, for bandwidth tests.
    pub fn bandwidth(&self) -> Option<&BandwidthSummary> {
        match &self.measure {
            Measure::Bandwidth(b) => Some(b),
            Measure::Latency(_) => None,
        }
    }
}

/// The whole run, as written by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Always `"rpc-perf"`.
    pub tool: &'static str,
    /// rpc-perf's version.
    pub version: &'static str,
    /// Provider name (`sim`, `ibverbs`).
    pub transport: String,
    /// Device name.
    pub device: String,
    /// Latency figures are round trip (never halved).
    pub latency_is_round_trip: bool,
    /// The flags that shape the figures.
    pub config: RunConfig,
    /// Every measurement, in the order run.
    pub results: Vec<TestResult>,
    /// rpc_lat p50 / send_lat p50 at each size both ran.
    pub rpc_over_send_lat_p50: Vec<SizeRatio>,
    /// Single-thread memcpy bandwidth of this machine at the RPC sizes of rpc_bw, in MB/s.
    pub memcpy: Vec<MemcpyFigure>,
}

/// The flags that shape the figures, recorded with them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunConfig {
    /// Both sides in one process.
    pub loopback: bool,
    /// Polling policy (`busy` or `yield`).
    pub poll: String,
    /// Unmeasured iterations per size.
    pub warmup: u64,
    /// Raw tests: outstanding WRITEs of write_bw.
    pub tx_depth: u32,
    /// Raw tests: one signaled WR in this many.
    pub cq_mod: u32,
    /// Raw tests: inline bytes asked for.
    pub inline_size: u32,
    /// Raw tests: receives through an SRQ.
    pub use_srq: bool,
    /// Receive WQEs asked with `-r` (raw tests' receive queue, RPC server's SRQ); `None`: the
    /// defaults.
    #[serde(default)]
    pub rx_depth: Option<u32>,
    /// write_lat: each side copied every message out of its receive area (`--copy-out`).
    pub copy_out: bool,
    /// RPC tests: the server's handlers (`--handlers`: inline, async, tokio).
    pub handlers: crate::cli::HandlerKind,
}

impl RunConfig {
    /// From the flags.
    pub fn from_args(a: &crate::cli::Args) -> Self {
        RunConfig {
            loopback: a.loopback,
            poll: format!("{:?}", a.poll).to_lowercase(),
            warmup: a.warmup,
            tx_depth: a.tx_depth,
            cq_mod: a.cq_mod,
            inline_size: a.inline_size,
            use_srq: a.use_srq,
            rx_depth: a.rx_depth,
            copy_out: a.copy_out,
            handlers: a.handlers,
        }
    }
}

/// A ratio at one size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SizeRatio {
    /// Message size in bytes.
    pub bytes: usize,
    /// The ratio.
    pub ratio: f64,
}

/// memcpy bandwidth at one size and what rpc_bw reached relative to it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemcpyFigure {
    /// Copy size in bytes.
    pub bytes: usize,
    /// memcpy bandwidth with the same buffers each time (cache-resident when they fit), in MB/s
    /// (2^20 bytes/s).
    pub hot_mb_per_s: f64,
    /// memcpy bandwidth through a 64 MiB working set, in MB/s.
    pub cold_mb_per_s: f64,
    /// rpc_bw average goodput at this size / hot memcpy bandwidth.
    pub rpc_fraction_of_hot: f64,
    /// rpc_bw average goodput at this size / cold memcpy bandwidth.
    pub rpc_fraction_of_cold: f64,
}

impl RunReport {
    /// A report with no results yet.
    pub fn new(transport: &str, device: &str) -> Self {
        RunReport {
            tool: "rpc-perf",
            version: env!("CARGO_PKG_VERSION"),
            transport: transport.to_string(),
            device: device.to_string(),
            latency_is_round_trip: true,
            config: RunConfig::default(),
            results: Vec::new(),
            rpc_over_send_lat_p50: Vec::new(),
            memcpy: Vec::new(),
        }
    }

    /// Fills `rpc_over_send_lat_p50` from the results: one entry per size where both rpc_lat
    /// (request size) and send_lat ran.
    pub fn compute_ratios(&mut self) {
        self.rpc_over_send_lat_p50 = self
            .results
            .iter()
            // A latency with several calls in flight is no ping-pong: no ratio against send_lat.
            .filter(|r| r.test == TestKind::RpcLat && r.concurrency == 1)
            .filter_map(|rpc| {
                let raw =
                    self.results.iter().find(|r| r.test == TestKind::SendLat && r.bytes == rpc.bytes)?;
                let (a, b) = (rpc.latency()?.typical_ns, raw.latency()?.typical_ns);
                Some(SizeRatio { bytes: rpc.bytes, ratio: a / b.max(1.0) })
            })
            .collect();
    }

    /// The JSON text.
    ///
    /// # Errors
    /// serde_json's error (never expected for these types).
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lat(test: TestKind, bytes: usize, p50: f64) -> TestResult {
        TestResult {
            test,
            bytes,
            req_bytes: bytes,
            resp_bytes: bytes,
            concurrency: 1,
            measure: Measure::Latency(LatencyMeasure {
                summary: LatencySummary {
                    iterations: 10,
                    min_ns: 1.0,
                    max_ns: 9.0,
                    typical_ns: p50,
                    avg_ns: 5.0,
                    stdev_ns: 1.0,
                    p99_ns: 8.0,
                    p99_9_ns: 9.0,
                    p99_99_ns: 9.0,
                },
                cdf: vec![(1.0, 1.0)],
            }),
        }
    }

    #[test]
    fn json_shape() {
        let mut r = RunReport::new("sim", "sim0");
        r.results.push(lat(TestKind::SendLat, 32, 600.0));
        r.results.push(lat(TestKind::RpcLat, 32, 900.0));
        r.results.push(TestResult {
            test: TestKind::WriteBw,
            bytes: 65536,
            req_bytes: 65536,
            resp_bytes: 0,
            concurrency: 128,
            measure: Measure::Bandwidth(BandwidthSummary::new(5000, 65536, 50_000_000, 0, 0)),
        });
        r.compute_ratios();
        let v: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
        assert_eq!(v["tool"], "rpc-perf");
        assert_eq!(v["transport"], "sim");
        assert_eq!(v["device"], "sim0");
        assert_eq!(v["latency_is_round_trip"], true);
        assert_eq!(v["config"]["use_srq"], false);
        let res = v["results"].as_array().unwrap();
        assert_eq!(res.len(), 3);
        assert_eq!(res[0]["test"], "send_lat");
        assert_eq!(res[0]["bytes"], 32);
        assert_eq!(res[0]["latency"]["typical_ns"], 600.0);
        assert_eq!(res[0]["latency"]["p99_99_ns"], 9.0);
        assert!(res[0]["latency"].get("cdf").is_none());
        assert_eq!(res[2]["test"], "write_bw");
        assert_eq!(res[2]["bandwidth"]["avg_mb_per_s"], 6250.0);
        assert_eq!(res[2]["bandwidth"]["iterations"], 5000);
        assert_eq!(v["rpc_over_send_lat_p50"][0]["bytes"], 32);
        assert_eq!(v["rpc_over_send_lat_p50"][0]["ratio"], 1.5);
    }
}
