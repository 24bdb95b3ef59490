//! Flags of `rpc-perf call` and `rpc-perf bench`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;

use crate::cli::{PollKind, TransportKind, DEFAULT_PORT};

/// The subcommands that call any service from its `.proto`.
#[derive(Subcommand, Debug, Clone, PartialEq)]
pub enum Command {
    /// Call one method of a running server with a request written as JSON; print the reply as
    /// JSON (grpcurl for this framework). Unary methods only: streaming methods (which generated
    /// stubs call) are refused with a message naming the method.
    ///
    /// Example: rpc-perf call 127.0.0.1:50052 kv.Kv/Get --proto proto/kv.proto --data '{"key":"a"}'
    Call(CallArgs),
    /// Benchmark one method of a running server: perftest-style latency table, calls/s, status
    /// counts (ghz for this framework). Unary methods only: streaming methods are refused with a
    /// message naming the method (stream rates: `rpc-core --example stream_measure`).
    ///
    /// Example: rpc-perf bench 127.0.0.1:50052 kv.Kv/Get --proto proto/kv.proto --data '{"key":"a"}' -c 32
    Bench(BenchArgs),
}

/// Where the service is defined.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ProtoArgs {
    /// The .proto file defining the service (repeatable). Compiled at run time: no protoc needed.
    /// Default: none, and the service's definition is asked of the server's reflection service
    /// (grpc.reflection.v1, as grpcurl does; a server adds it with `add_reflection()`).
    #[arg(long = "proto", value_name = "FILE.proto")]
    pub protos: Vec<PathBuf>,
    /// Directory searched for imports (repeatable); default: the directory of each --proto file.
    /// The well-known types (google/protobuf/*.proto) are built in.
    #[arg(short = 'I', long = "import-path", value_name = "DIR")]
    pub includes: Vec<PathBuf>,
}

/// Which NIC carries the calls (the same flags as the benchmarks).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct NicArgs {
    /// NIC provider: `sim` (software NIC), `rdma` (libibverbs), or `auto` (rdma when a device
    /// exists). Must match the server's.
    #[arg(long, value_enum, default_value_t = TransportKind::Auto)]
    pub transport: TransportKind,
    /// RDMA device, by name (mlx5_0, rxe0) or index; default: the first one.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// Port of the device (1-based).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    pub ib_port: u8,
    /// GID index; -1 picks one automatically (RoCEv2 with an IPv4 address first).
    #[arg(short = 'x', long = "gid-index", default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1..=255))]
    pub gid_index: i32,
    /// How the waiting client polls: `busy` spins; `yield` spins a little then yields the core.
    #[arg(long, value_enum, default_value_t = PollKind::Busy)]
    pub poll: PollKind,
    /// TCP port of the server when HOST has none.
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
}

/// `rpc-perf call`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct CallArgs {
    /// Server address, HOST or HOST:PORT (the server's TCP handshake port; default port: -p).
    #[arg(value_name = "HOST", required_unless_present_any = ["list", "describe"])]
    pub host: Option<String>,
    /// Method to call: package.Service/Method.
    #[arg(value_name = "METHOD", required_unless_present_any = ["list", "describe"])]
    pub method: Option<String>,
    /// Where the service is defined.
    #[command(flatten)]
    pub proto: ProtoArgs,
    /// The request as JSON (proto3 JSON mapping; bytes as base64), `@FILE` to read it from a
    /// file, or `-` for standard input. Default: `{}` (every field at its default).
    #[arg(long, value_name = "JSON|@FILE|-", allow_hyphen_values = true)]
    pub data: Option<String>,
    /// Print the services and methods the .proto files define (without --proto: the services
    /// the server at HOST lists over reflection; `rpc-perf call HOST list` too), and exit.
    #[arg(long, conflicts_with = "describe")]
    pub list: bool,
    /// Print the fields of message NAME (or the methods of service NAME), by full name
    /// (`package.Message`), and exit.
    #[arg(long, value_name = "NAME")]
    pub describe: Option<String>,
    /// Deadline of the call, e.g. `500ms`, `2s`, `250us` (default: none). After it the call ends
    /// with DEADLINE_EXCEEDED.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// Which NIC, and the server's port.
    #[command(flatten)]
    pub nic: NicArgs,
}

/// `rpc-perf bench`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct BenchArgs {
    /// Server address, HOST or HOST:PORT (the server's TCP handshake port; default port: -p).
    #[arg(value_name = "HOST")]
    pub host: String,
    /// Method to benchmark: package.Service/Method (unary).
    #[arg(value_name = "METHOD")]
    pub method: String,
    /// Where the service is defined.
    #[command(flatten)]
    pub proto: ProtoArgs,
    /// A request as JSON, `@FILE` (one JSON object, or an array of them) or `-` (stdin).
    /// Repeatable: the payloads are sent round-robin. Each is encoded once, before the run.
    /// Default: `{}`.
    #[arg(long, value_name = "JSON|@FILE|-", allow_hyphen_values = true)]
    pub data: Vec<String>,
    /// Measured calls (default 100000 unless -D).
    #[arg(short = 'n', long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of calls.
    #[arg(short = 'D', long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration: Option<u64>,
    /// Calls in flight at most (the client's window).
    #[arg(short = 'c', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub concurrency: u32,
    /// Unmeasured calls before the run (after one probe call that checks the method is served).
    #[arg(long, default_value_t = 1000)]
    pub warmup: u64,
    /// Open loop: start calls at this many per second, whatever the answers do (at most -c in
    /// flight; a call that has to wait for room is late, and its latency counts from when it
    /// should have started, so queueing is not hidden). Default: closed loop (a new call as soon
    /// as one finishes).
    #[arg(long, value_name = "CALLS_PER_S", value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Deadline of each call, e.g. `500us`, `10ms`, `1s` (default: none). Late calls end with
    /// DEADLINE_EXCEEDED and are counted.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// Decode every reply as the method's output message and count undecodable ones (off by
    /// default: replies are only counted, so the measurement is the transport's, not JSON's).
    #[arg(long)]
    pub check: bool,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the latency distribution (CDF) to FILE (SVG).
    #[arg(long, value_name = "FILE", value_parser = crate::cli::parse_svg_path)]
    pub plot: Option<PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Which NIC, and the server's port.
    #[command(flatten)]
    pub nic: NicArgs,
}

impl BenchArgs {
    /// How long the measured part runs: `-D` seconds, `-n` calls, or 100000 calls.
    pub fn limit(&self) -> crate::cli::Limit {
        match (self.duration, self.iters) {
            (Some(s), _) => crate::cli::Limit::Duration(Duration::from_secs(s)),
            (None, Some(n)) => crate::cli::Limit::Iters(n),
            (None, None) => crate::cli::Limit::Iters(100_000),
        }
    }
}

/// Parses a duration: a number with a unit `ns`, `us`, `ms`, `s` or `m` (a bare number is
/// seconds), e.g. `250us`, `1.5s`.
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration (e.g. 500us, 10ms, 2s)"))?;
    let scale = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" => 60.0,
        u => return Err(format!("`{s}`: unknown unit `{u}` (ns, us, ms, s, m)")),
    };
    let secs = v * scale;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("`{s}` is outside (0, 24h]"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1e9 => Ok(r),
        _ => Err(format!("`{s}`: calls per second, a number in (0, 1e9]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("3 weeks").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("soon").unwrap_err().contains("not a duration"));
        assert!(parse_rate("0").is_err());
        assert_eq!(parse_rate("1000"), Ok(1000.0));
    }
}
