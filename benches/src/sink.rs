//! Where results go while a run proceeds: printed as perftest tables on stdout (each row as soon
//! as its size is done) and collected for the JSON file, the plot and the closing ratios.

use crate::cli::TestKind;
use crate::progress::Progress;
use crate::report;
use crate::results::{RunReport, TestResult};

/// Prints and collects results.
pub struct Sink {
    /// Everything measured so far.
    pub report: RunReport,
    progress: Progress,
    show_progress: bool,
    current: Option<TestKind>,
}

impl Sink {
    /// A sink for a run on `transport`; progress bars shown when `show_progress`.
    pub fn new(transport: &str, show_progress: bool) -> Self {
        Sink {
            report: RunReport::new(transport, ""),
            progress: Progress::hidden(),
            show_progress,
            current: None,
        }
    }

    /// Prints a test's banner and table header, and starts its progress bar over `sizes` sizes.
    pub fn begin_test(&mut self, test: TestKind, sizes: usize, info: Vec<(&str, String)>) {
        if let Some((_, dev)) = info.iter().find(|(k, _)| *k == "Device") {
            if self.report.device.is_empty() {
                self.report.device = dev.clone();
            }
        }
        println!("{}", report::banner(title(test), &info));
        match test {
            TestKind::RpcBw | TestKind::ChanBw => {
                println!("{}{}", report::BW_HEADER, report::RPC_BW_HEADER_EXT)
            }
            TestKind::StreamBw | TestKind::StreamInBw | TestKind::StreamBidiBw => {
                println!("{}{}", report::BW_HEADER, report::STREAM_BW_HEADER_EXT)
            }
            TestKind::WriteBw | TestKind::SendBw => println!("{}", report::BW_HEADER),
            _ => println!("{}", report::LAT_HEADER),
        }
        self.progress = Progress::new(test.name(), sizes, self.show_progress);
        self.current = Some(test);
    }

    /// The current test's progress bar.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Prints a result row and keeps the result.
    pub fn result(&mut self, r: TestResult) {
        let line = if let Some(l) = r.latency() {
            report::latency_row(r.bytes, l)
        } else if let Some(b) = r.bandwidth() {
            if matches!(r.test, TestKind::RpcBw | TestKind::ChanBw) || r.test.is_stream() {
                format!("{}{}", report::bandwidth_row(r.bytes, b), report::rpc_bw_ext(b))
            } else {
                report::bandwidth_row(r.bytes, b)
            }
        } else {
            String::new()
        };
        self.progress.println(&line);
        self.report.results.push(r);
    }

    /// Ends the current test's table.
    pub fn end_test(&mut self) {
        self.progress.finish();
        println!("{}", report::RESULT_LINE);
        self.current = None;
    }
}

/// perftest-style title of a test.
pub fn title(test: TestKind) -> &'static str {
    match test {
        TestKind::RpcLat => "RPC Latency Test (rpc_lat, unary round trip)",
        TestKind::RpcBw => "RPC BW Test (rpc_bw, unary, payload both ways)",
        TestKind::ChanLat => {
            "Channel Latency Test (chan_lat, unary round trip, shareable handle, tokio tasks)"
        }
        TestKind::ChanBw => "Channel BW Test (chan_bw, unary, shareable handle, tokio tasks)",
        TestKind::StreamBw => "Stream BW Test (stream_bw, server streaming, one stream)",
        TestKind::StreamInBw => "Stream BW Test (stream_in_bw, client streaming, one stream)",
        TestKind::StreamBidiBw => {
            "Stream BW Test (stream_bidi_bw, bidirectional, one stream, each message answered)"
        }
        TestKind::SendLat => "Send Latency Test (send_lat, round trip)",
        TestKind::WriteLat => "RDMA Write Latency Test (write_lat, round trip)",
        TestKind::WriteBw => "RDMA Write BW Test (write_bw)",
        TestKind::SendBw => "Send BW Test (send_bw)",
    }
}
