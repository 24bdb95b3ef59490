//! Tables as perftest prints them (`print_report_lat`, `print_report_bw`), with the same column
//! headers and printf formats, plus a 99.99 % column for latency and RPC columns for bandwidth.

use std::fmt::Write as _;

use crate::stats::{BandwidthSummary, LatencySummary};

/// perftest's `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's `RESULT_FMT_LAT` header, plus the 99.99 % column.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]   99.99% percentile[usec] ";

/// perftest's `RESULT_FMT` header (MB = 2^20 bytes).
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";

/// Extra columns of an RPC bandwidth row: calls per second and payload goodput.
pub const RPC_BW_HEADER_EXT: &str = "   RPCs/sec        Goodput[Gb/sec]";

/// The same columns for a stream: messages per second and streamed payload in Gbit/s.
pub const STREAM_BW_HEADER_EXT: &str = "   Msgs/sec        Goodput[Gb/sec]";

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

/// One latency row: perftest's `REPORT_FMT_LAT` (same widths and tabs) with the 99.99 % column
/// appended. All figures in µs.
pub fn latency_row(bytes: usize, s: &LatencySummary) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2} \t\t{:<7.2}",
        bytes,
        s.iterations,
        us(s.min_ns),
        us(s.max_ns),
        us(s.typical_ns),
        us(s.avg_ns),
        us(s.stdev_ns),
        us(s.p99_ns),
        us(s.p99_9_ns),
        us(s.p99_99_ns),
    )
}

/// One bandwidth row: perftest's `REPORT_FMT`.
pub fn bandwidth_row(bytes: usize, b: &BandwidthSummary) -> String {
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        bytes, b.iterations, b.peak_mb_per_s, b.avg_mb_per_s, b.msg_rate_mpps
    )
}

/// The RPC columns appended to a bandwidth row: RPCs per second and goodput (request + response
/// payload) in Gbit/s.
pub fn rpc_bw_ext(b: &BandwidthSummary) -> String {
    format!("   {:<12.0}    {:<7.3}", b.per_second(), b.goodput_bytes_per_s() * 8.0 / 1e9)
}

/// The banner printed before a test's table, in perftest's layout: a title and `key : value`
/// lines, two per row.
pub fn banner(title: &str, info: &[(&str, String)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{RESULT_LINE}");
    let _ = writeln!(out, "                    {title}");
    for pair in info.chunks(2) {
        let _ = write!(out, " {:<16}: {}", pair[0].0, pair[0].1);
        if let Some((k, v)) = pair.get(1) {
            let _ = write!(out, "\t\t{k:<15}: {v}");
        }
        out.push('\n');
    }
    let _ = write!(out, "{RESULT_LINE}");
    out
}

/// The overhead line comparing an RPC's median round trip with the raw one.
pub fn ratio_line(what: &str, bytes: usize, rpc_p50_ns: f64, raw_p50_ns: f64) -> String {
    format!(
        " {what} at {bytes} B: rpc_lat p50 {:.2} usec / send_lat p50 {:.2} usec = {:.2}x",
        us(rpc_p50_ns),
        us(raw_p50_ns),
        rpc_p50_ns / raw_p50_ns.max(1.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LatencySummary {
        LatencySummary {
            iterations: 1000,
            min_ns: 1040.0,
            max_ns: 4710.0,
            typical_ns: 1080.0,
            avg_ns: 1101.0,
            stdev_ns: 120.0,
            p99_ns: 1410.0,
            p99_9_ns: 4710.0,
            p99_99_ns: 4710.0,
        }
    }

    #[test]
    fn latency_row_matches_perftest_format() {
        // Checked against C printf (python %-formatting) of perftest's REPORT_FMT_LAT:
        // printf(" %-7lu %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f", ...)
        let row = latency_row(2, &sample());
        assert_eq!(
            row,
            " 2       1000          1.04           4.71         1.08     \t       1.10        \t0.12   \t\t1.41    \t\t4.71    \t\t4.71   "
        );
    }

    #[test]
    fn bandwidth_row_matches_perftest_format() {
        // 5000 x 65536 B in 0.05 s: 6250 MB/s, 0.1 Mpps.
        let b = BandwidthSummary::new(5000, 65536, 50_000_000, 0, 0);
        assert_eq!(
            bandwidth_row(65536, &b),
            " 65536      5000             6250.00            6250.00\t\t   0.100000"
        );
        assert_eq!(rpc_bw_ext(&b), "   100000          52.429 ");
    }

    #[test]
    fn headers_are_perftests() {
        assert!(LAT_HEADER.starts_with(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "));
        assert_eq!(RESULT_LINE.len(), 87);
    }

    #[test]
    fn banner_pairs_keys() {
        let b = banner(
            "Send Latency Test",
            &[("Transport", "sim".into()), ("Device", "sim0".into()), ("Latency", "round trip".into())],
        );
        let lines: Vec<&str> = b.lines().collect();
        assert_eq!(lines[0], RESULT_LINE);
        assert_eq!(lines[1], "                    Send Latency Test");
        assert_eq!(lines[2], " Transport       : sim\t\tDevice         : sim0");
        assert_eq!(lines[3], " Latency         : round trip");
        assert_eq!(lines[4], RESULT_LINE);
    }

    #[test]
    fn ratio_line_divides() {
        assert_eq!(
            ratio_line("overhead", 32, 900.0, 600.0),
            " overhead at 32 B: rpc_lat p50 0.90 usec / send_lat p50 0.60 usec = 1.50x"
        );
    }
}
