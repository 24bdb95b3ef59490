//! Command-line flags, perftest's where they mean the same (`-d -i -x -s -a -n -D -p -t -r -Q`).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// Default TCP port of the out-of-band exchange (perftest's `DEF_PORT`).
pub const DEFAULT_PORT: u16 = 18515;
/// Default message size in bytes (the goal's "small RPC": 32 B each way).
pub const DEFAULT_SIZE: usize = 32;
/// Largest message of a `-a` sweep: 8 MiB (perftest's `MAX_SIZE`).
pub const SWEEP_MAX: usize = 8 << 20;
/// Largest message of `-s`, `--req-size` and `--resp-size`: 64 MiB, the runtime's default
/// `max_message_size` (rpc-perf raises the limit of its own client and server by
/// [`ENVELOPE`] so that a payload of this size fits with its protobuf framing).
pub const MAX_SIZE: usize = 64 << 20;
/// Bytes of protobuf framing allowed around a payload (field tags, lengths, `resp_size`).
pub const ENVELOPE: usize = 64;

/// perftest-style latency and bandwidth of RPCs and of raw verbs, on the same transport.
///
/// `rpc-perf` serves; `rpc-perf HOST` connects to a server and runs the tests; `rpc-perf --loopback`
/// runs both sides in one process on two pinned cores. Latency is always reported as round trip.
/// `rpc-perf call` and `rpc-perf bench` call and benchmark any unary method of any server of
/// ours from its .proto, with requests written as JSON.
#[derive(Parser, Debug, Clone, PartialEq)]
#[command(name = "rpc-perf", version, about, max_term_width = 110, args_conflicts_with_subcommands = true)]
pub struct Args {
    /// Call or benchmark any method from its .proto (see `rpc-perf call --help`,
    /// `rpc-perf bench --help`).
    #[command(subcommand)]
    pub command: Option<crate::dynamic::args::Command>,

    /// Server to connect to (client mode). Without it, and without --loopback, rpc-perf serves.
    #[arg(value_name = "HOST", conflicts_with = "loopback")]
    pub host: Option<String>,

    /// Run server and client in this process, each on its own pinned core.
    #[arg(long)]
    pub loopback: bool,

    /// Tests to run, comma-separated.
    #[arg(long = "test", value_enum, value_delimiter = ',', default_values_t = [TestKind::RpcLat, TestKind::SendLat])]
    pub tests: Vec<TestKind>,

    /// NIC provider: `sim` (software NIC), `rdma` (libibverbs), or `auto` (rdma when a device exists).
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

    /// Message size in bytes, 1 to 64M (raw tests; RPC request and response unless
    /// --req-size/--resp-size).
    #[arg(short = 's', long, default_value_t = DEFAULT_SIZE, value_parser = parse_size)]
    pub size: usize,

    /// Sweep sizes 2, 4, 8, .. 8 MiB (perftest's -a; larger sizes with -s, up to 64 MiB).
    #[arg(short = 'a', long)]
    pub all: bool,

    /// RPC request payload in bytes (default: --size).
    #[arg(long, value_parser = parse_size)]
    pub req_size: Option<usize>,

    /// RPC response payload in bytes (default: --size).
    #[arg(long, value_parser = parse_size)]
    pub resp_size: Option<usize>,

    /// Iterations per size (default: 100000 for small messages, fewer above 8 KiB so that one size
    /// moves at most 1 GiB, and never fewer than 1000 up to 16 MiB per iteration, 16 above).
    #[arg(short = 'n', long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(5..))]
    pub iters: Option<u64>,

    /// Run each size for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration: Option<u64>,

    /// Iterations run before measuring, at each size (at most that size's default iterations,
    /// so that a 64 MiB run does not warm up with 64 GB).
    #[arg(long, default_value_t = 1000)]
    pub warmup: u64,

    /// Receive-ring bytes of the RPC tests' client and server (default: room for four messages
    /// of the largest size, 1M to 64M; `--ring-bytes 1M` is the runtime's default configuration,
    /// where larger messages go through the ring in pieces).
    #[arg(long, value_name = "BYTES", value_parser = parse_ring)]
    pub ring_bytes: Option<usize>,

    /// Outstanding RPCs (rpc_lat default 1, rpc_bw default 32).
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub concurrency: Option<u32>,

    /// chan_lat / chan_bw: tokio tasks sharing one `Channel`, each keeping its share of -c calls
    /// in flight (at least one; default 1 for chan_lat, 8 for chan_bw).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub tasks: Option<u32>,

    /// chan_lat / chan_bw: worker threads of the tokio runtime the tasks run on.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub rt_threads: u32,

    /// chan_lat / chan_bw: the channel's dispatchers (one session each; unpinned, so all on the
    /// process's one unpinned dispatcher thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub dispatchers: u32,

    /// chan_lat / chan_bw: how long a call's poll may drive the channel's session waiting for
    /// its reply, in µs (`ChannelConfig::poll_spin`; 0: one step per poll, the dispatcher
    /// threads do the waiting).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub poll_spin: u64,

    /// Outstanding WRITEs of write_bw, in WQEs (perftest's -t).
    #[arg(short = 't', long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=15000))]
    pub tx_depth: u32,

    /// Receive WQEs posted (perftest's -r): the raw tests' receive queue (their own RQ, or the
    /// SRQ with --use-srq; default 64, cut to the device's max_qp_wr or max_srq_wr with a
    /// warning), and the SRQ depth of the RPC tests' server (`ServerConfig::srq_depth`; default:
    /// one session at full credits, 2 × credits + max(credits, 16) + 31, at least 4096; below one session's
    /// 2 × credits + max(credits, 16) + 31 the server refuses to start, naming the field).
    #[arg(short = 'r', long, value_name = "WQES", value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub rx_depth: Option<u32>,

    /// Signal one send WR in this many (perftest's -Q), at most --tx-depth.
    #[arg(short = 'Q', long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cq_mod: u32,

    /// Bytes sent inline by the raw tests (perftest's -I); 0 never inlines, as the RPC workers.
    #[arg(short = 'I', long, default_value_t = 220, value_parser = clap::value_parser!(u32).range(0..=912))]
    pub inline_size: u32,

    /// Raw tests receive through a shared receive queue, as the RPC workers do (perftest's
    /// --use_srq).
    #[arg(long)]
    pub use_srq: bool,

    /// TCP port of the out-of-band exchange (the RPC server listens on the next one).
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,

    /// How waiting threads poll: `busy` spins; `yield` spins a little then yields the core.
    #[arg(long, value_enum, default_value_t = PollKind::Busy)]
    pub poll: PollKind,

    /// write_lat: each side copies every message out of its receive area into a buffer of its
    /// own before answering (what any consumer of the bytes must do; the fair baseline of an
    /// RPC's size-dependent cost).
    #[arg(long)]
    pub copy_out: bool,

    /// Server side of the RPC tests: the benchmark service's handlers. `inline`: synchronous,
    /// on the worker; `async`: async handlers polled on the worker (the runtime's default for
    /// async services); `tokio`: async handlers spawned on a tokio runtime (the opt-in).
    #[arg(long, value_enum, default_value_t = HandlerKind::Inline)]
    pub handlers: HandlerKind,

    /// rpc_lat, rpc_bw: carry the bulk payloads in registered buffers (the client's request
    /// payload from `Client::alloc_registered`, the server's answers, with `--handlers inline`,
    /// from `RequestContext::alloc_registered`), so bodies above the eager threshold are
    /// WRITTEN straight from them with no copy. Without it, ordinary `Bytes` (one copy each).
    #[arg(long)]
    pub registered: bool,

    /// RPC tests on `--transport rdma`, client and server on one host: the same-host path
    /// (`ServerConfig::same_host_shm` on the server's worker core, `ClientConfig::same_host_shm`):
    /// the session runs on the software NIC's shared memory instead of the NIC's loopback. The
    /// server's workers (the RDMA one idle) share that core and poll with `--poll yield`.
    #[arg(long)]
    pub same_host_shm: bool,

    /// RPC tests (rpc_lat, rpc_bw): N small ASCII metadata entries per request
    /// (`x-perf-I: value-I`), 0 to 64. Default 0 (no metadata on the wire).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub metadata: u16,

    /// RPC tests: a client interceptor adding one entry (`x-perf-auth`) to every call and a
    /// server interceptor checking it (UNAUTHENTICATED without it). Give it to both ends (the
    /// serving rpc-perf and the client; --loopback: once).
    #[arg(long)]
    pub interceptors: bool,

    /// RPC tests: per-method metrics on both ends (`Observe::metrics`), recorded by the
    /// Prometheus exporter's recorder installed without an HTTP listener (the full recording
    /// path, nothing scraped). Give it to both ends, as --interceptors.
    #[arg(long)]
    pub metrics: bool,

    /// rpc_lat, rpc_bw with --loopback on sim: the RPC servers are N processes of this binary
    /// (one worker each, all pinned to the server core of --cores, polling per --server-poll),
    /// and the client opens a session to each from its one thread, so all N sessions share one
    /// endpoint (one device context). rpc_lat times one call at a time on the first session
    /// while the others idle (each made one call first); rpc_bw keeps -c calls in flight spread
    /// round robin over the N sessions. Compare with `--servers 1` (the same setup with one
    /// server process); the banner counts the client's device contexts.
    #[arg(long, value_name = "N", requires = "loopback", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub servers: Option<u32>,

    /// --servers: how the server processes' workers poll. `event` sleeps on completion events
    /// (the default: N processes sharing one core would starve each other busy-polling);
    /// `yield` spins a little, then yields the core; `busy` spins.
    #[arg(long, value_enum, default_value_t = ServerPoll::Event)]
    pub server_poll: ServerPoll,

    /// --servers: how the first server process (rpc_lat's) polls; default --server-poll. With
    /// `--first-server-poll busy` the idle servers sleep and the probe's server spins, so the
    /// latency is the client endpoint's, not a wake-up's.
    #[arg(long, value_enum)]
    pub first_server_poll: Option<ServerPoll>,

    /// Internal (spawned by --servers): serve the benchmark service on sim, print `addr ADDR`,
    /// serve until stdin closes.
    #[arg(long, hide = true, conflicts_with_all = ["host", "loopback", "servers"])]
    pub serve_rpc: bool,

    /// Cores for --loopback as `SERVER,CLIENT` (default: the first two cores).
    #[arg(long, value_name = "S,C", value_delimiter = ',')]
    pub cores: Option<Vec<usize>>,

    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Draw each latency test's percentiles (every size, on a log "nines" axis) and the size sweep (raw and RPC side by side) to FILE (SVG).
    #[arg(long, value_name = "FILE", value_parser = parse_svg_path)]
    pub plot: Option<PathBuf>,

    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,

    /// Server mode: serve clients one after another until killed, and keep the benchmark service
    /// (proto/bench.proto) up on TCP port `-p`+1 all along, for `rpc-perf call` and
    /// `rpc-perf bench` (default: serve one client, then exit, as perftest).
    #[arg(long, conflicts_with_all = ["host", "loopback"])]
    pub persist: bool,
}

/// One benchmark.
#[derive(
    ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[value(rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    /// Unary RPC round trip (one call in flight unless -c).
    RpcLat,
    /// Unary RPC throughput and goodput with -c calls in flight.
    RpcBw,
    /// Unary RPC round trip through the shareable handle (`Channel`) from --tasks tokio tasks.
    ChanLat,
    /// Unary RPC throughput through the shareable handle from --tasks tokio tasks, -c in flight.
    ChanBw,
    /// Server-streaming messages/s and goodput: one stream of -n messages of -s bytes.
    StreamBw,
    /// Client-streaming messages/s and goodput: one stream of -n messages of -s bytes to the server.
    StreamInBw,
    /// Bidirectional streaming: -n messages of -s bytes each way, each answered by the server.
    StreamBidiBw,
    /// Raw SEND/RECV ping-pong round trip.
    SendLat,
    /// Raw SEND/RECV message rate and bandwidth, -t outstanding (as ib_send_bw).
    SendBw,
    /// Raw RDMA WRITE ping-pong round trip, polling the last byte (as ib_write_lat).
    WriteLat,
    /// Raw RDMA WRITE bandwidth (as ib_write_bw).
    WriteBw,
}

impl TestKind {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            TestKind::RpcLat => "rpc_lat",
            TestKind::RpcBw => "rpc_bw",
            TestKind::ChanLat => "chan_lat",
            TestKind::ChanBw => "chan_bw",
            TestKind::StreamBw => "stream_bw",
            TestKind::StreamInBw => "stream_in_bw",
            TestKind::StreamBidiBw => "stream_bidi_bw",
            TestKind::SendLat => "send_lat",
            TestKind::SendBw => "send_bw",
            TestKind::WriteLat => "write_lat",
            TestKind::WriteBw => "write_bw",
        }
    }

    /// True for ping-pong latency tests, false for bandwidth tests.
    pub fn is_latency(self) -> bool {
        matches!(self, TestKind::RpcLat | TestKind::ChanLat | TestKind::SendLat | TestKind::WriteLat)
    }

    /// True for the RPC tests (as opposed to raw verbs).
    pub fn is_rpc(self) -> bool {
        matches!(
            self,
            TestKind::RpcLat
                | TestKind::RpcBw
                | TestKind::ChanLat
                | TestKind::ChanBw
                | TestKind::StreamBw
                | TestKind::StreamInBw
                | TestKind::StreamBidiBw
        )
    }

    /// True for the streaming tests.
    pub fn is_stream(self) -> bool {
        matches!(self, TestKind::StreamBw | TestKind::StreamInBw | TestKind::StreamBidiBw)
    }

    /// True for the tests of the shareable handle (`Channel`).
    pub fn is_channel(self) -> bool {
        matches!(self, TestKind::ChanLat | TestKind::ChanBw)
    }
}

/// Which NIC provider carries the tests.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// `rdma` when an RDMA device exists (or -d is given), else `sim`.
    Auto,
    /// The software NIC.
    Sim,
    /// libibverbs.
    Rdma,
}

/// How a waiting thread polls.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PollKind {
    /// Spin on the CQ (the product's default).
    Busy,
    /// Spin a little, then `std::thread::yield_now()` (for tests and shared machines).
    Yield,
}

/// How the server processes of `--servers` poll.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerPoll {
    /// Spin on the CQ (`PollingPolicy::Busy`).
    Busy,
    /// Spin a little, then yield the core (`PollingPolicy::SpinThenYield`).
    Yield,
    /// Sleep on completion events (`PollingPolicy::Event { spins: 0 }`).
    Event,
}

impl ServerPoll {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ServerPoll::Busy => "busy",
            ServerPoll::Yield => "yield",
            ServerPoll::Event => "event",
        }
    }
}

/// Which handlers the RPC server runs (`--handlers`).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerKind {
    /// Synchronous handlers, inline on the worker.
    #[default]
    Inline,
    /// Async handlers polled on the worker (`AsyncRuntime::worker`).
    Async,
    /// Async handlers spawned on the tokio runtime the library shares
    /// (`AsyncRuntime::current_or_default`).
    Tokio,
}

/// Parses a byte count: a number with an optional `K`, `M` or `G` suffix (binary: 1K = 1024),
/// from 1 byte to [`MAX_SIZE`] (64 MiB).
///
/// # Errors
/// A message naming the accepted forms and range.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let bytes = parse_bytes(s)?;
    if !(1..=MAX_SIZE).contains(&bytes) {
        return Err(format!(
            "{bytes} bytes is outside 1..={MAX_SIZE} (64M, the runtime's default max_message_size)"
        ));
    }
    Ok(bytes)
}

/// A number with an optional binary `K`, `M` or `G` suffix.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1usize << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = digits.parse().map_err(|_| format!("`{s}` is not a byte count (e.g. 32, 4K, 1M)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("`{s}` is too large"))
}

/// Parses a ring length: a byte count as [`parse_size`], from 4 KiB to 1 GiB (the runtime's
/// `ring_bytes` range for rpc-perf's messages).
///
/// # Errors
/// A message naming the range.
pub fn parse_ring(s: &str) -> Result<usize, String> {
    let bytes = parse_bytes(s)?;
    if !(4096..=1 << 30).contains(&bytes) {
        return Err(format!("ring of {bytes} bytes is outside 4096..=1073741824 (4K to 1G)"));
    }
    Ok(bytes)
}

/// Accepts a path ending in `.svg`.
///
/// # Errors
/// A message asking for an .svg name.
pub fn parse_svg_path(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    match p.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(p),
        _ => Err(format!("`{s}`: the plot is drawn as SVG; give a file name ending in .svg")),
    }
}

/// The sizes of a `-a` sweep: powers of two from 2 bytes to [`SWEEP_MAX`], as perftest's.
pub fn sweep_sizes() -> Vec<usize> {
    (1..=SWEEP_MAX.trailing_zeros()).map(|e| 1usize << e).collect()
}

impl Args {
    /// Message sizes to run: the sweep with `-a`, else `--size`.
    pub fn sizes(&self) -> Vec<usize> {
        if self.all {
            sweep_sizes()
        } else {
            vec![self.size]
        }
    }

    /// RPC request and response payload sizes for a run at `size`.
    pub fn rpc_sizes(&self, size: usize) -> (usize, usize) {
        if self.all {
            (size, size)
        } else {
            (self.req_size.unwrap_or(size), self.resp_size.unwrap_or(size))
        }
    }

    /// Calls in flight for `test`.
    pub fn concurrency_for(&self, test: TestKind) -> u32 {
        self.concurrency.unwrap_or(if matches!(test, TestKind::RpcBw | TestKind::ChanBw) { 32 } else { 1 })
    }

    /// Tokio tasks of a chan_* test.
    pub fn tasks_for(&self, test: TestKind) -> u32 {
        self.tasks.unwrap_or(if test == TestKind::ChanBw { 8 } else { 1 })
    }

    /// Warm-up iterations for `bytes` per iteration: `--warmup`, at most [`default_iters`].
    pub fn warmup_for(&self, bytes_per_iter: usize) -> u64 {
        self.warmup.min(default_iters(bytes_per_iter))
    }

    /// How long to run one size: a number of iterations or a duration.
    pub fn limit_for(&self, bytes_per_iter: usize) -> Limit {
        match (self.duration, self.iters) {
            (Some(secs), _) => Limit::Duration(std::time::Duration::from_secs(secs)),
            (None, Some(n)) => Limit::Iters(n),
            (None, None) => Limit::Iters(default_iters(bytes_per_iter)),
        }
    }

    /// Checks combinations clap cannot express.
    ///
    /// # Errors
    /// A message naming the flags in conflict.
    pub fn validate(&self) -> Result<(), String> {
        if self.cq_mod > self.tx_depth {
            return Err(format!(
                "--cq-mod {} must not exceed --tx-depth {} (a signaled WR must fit in the send queue)",
                self.cq_mod, self.tx_depth
            ));
        }
        if self.tests.is_empty() {
            return Err("--test needs at least one test".into());
        }
        if self.all && (self.req_size.is_some() || self.resp_size.is_some()) {
            return Err("-a/--all sweeps request and response together; drop --req-size/--resp-size".into());
        }
        if self.servers.is_some() {
            if let Some(t) = self.tests.iter().find(|t| !matches!(t, TestKind::RpcLat | TestKind::RpcBw)) {
                return Err(format!("--servers runs rpc_lat and rpc_bw only; drop {} from --test", t.name()));
            }
            if self.transport == TransportKind::Rdma || self.ib_dev.is_some() {
                return Err(
                    "--servers runs on sim only (its server processes share memory with the client)".into()
                );
            }
            if self.registered || self.same_host_shm || self.handlers != HandlerKind::Inline {
                return Err(
                    "--servers: drop --registered, --same-host-shm and --handlers (inline handlers only)"
                        .into(),
                );
            }
        }
        if let Some(c) = &self.cores {
            if c.len() != 2 {
                return Err(format!("--cores takes two core numbers, SERVER,CLIENT; got {}", c.len()));
            }
            if c[0] == c[1] {
                return Err(format!("--cores {},{}: server and client need two different cores", c[0], c[1]));
            }
        }
        Ok(())
    }
}

/// How long one measurement runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// Exactly this many measured iterations.
    Iters(u64),
    /// As many iterations as fit in this time.
    Duration(std::time::Duration),
}

/// Default iterations for `bytes` per iteration: 100000, reduced so that one size moves at most
/// 1 GiB, never below 1000 up to 16 MiB per iteration (8 MiB each way), never below 16 above.
pub fn default_iters(bytes: usize) -> u64 {
    const BUDGET: u64 = 1 << 30;
    let floor = if bytes <= 2 * SWEEP_MAX { 1000 } else { 16 };
    (BUDGET / bytes.max(1) as u64).clamp(floor, 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("rpc-perf").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_are_the_main_job() {
        let a = parse(&["--loopback"]).unwrap();
        assert!(a.loopback);
        assert_eq!(a.host, None);
        assert_eq!(a.tests, vec![TestKind::RpcLat, TestKind::SendLat]);
        assert_eq!(a.transport, TransportKind::Auto);
        assert_eq!((a.ib_port, a.gid_index, a.size, a.port), (1, -1, 32, 18515));
        assert_eq!(a.sizes(), vec![32]);
        assert_eq!(a.rpc_sizes(32), (32, 32));
        assert_eq!(a.concurrency_for(TestKind::RpcLat), 1);
        assert_eq!(a.concurrency_for(TestKind::RpcBw), 32);
        assert_eq!(a.limit_for(32), Limit::Iters(100_000));
        assert_eq!(a.poll, PollKind::Busy);
        a.validate().unwrap();
    }

    #[test]
    fn perftest_flags() {
        let a = parse(&[
            "server1",
            "-d",
            "mlx5_0",
            "-i",
            "2",
            "-x",
            "3",
            "-s",
            "4K",
            "-n",
            "500",
            "--transport",
            "rdma",
            "--test",
            "send_lat,write_bw",
            "-t",
            "64",
            "-Q",
            "16",
            "-c",
            "8",
            "--req-size",
            "1M",
            "--resp-size",
            "16",
        ])
        .unwrap();
        assert_eq!(a.host.as_deref(), Some("server1"));
        assert_eq!(a.ib_dev.as_deref(), Some("mlx5_0"));
        assert_eq!((a.ib_port, a.gid_index, a.size), (2, 3, 4096));
        assert_eq!(a.tests, vec![TestKind::SendLat, TestKind::WriteBw]);
        assert_eq!(a.transport, TransportKind::Rdma);
        assert_eq!((a.tx_depth, a.cq_mod, a.concurrency), (64, 16, Some(8)));
        assert_eq!(a.rpc_sizes(4096), (1 << 20, 16));
        assert_eq!(a.limit_for(4096), Limit::Iters(500));
        let a = parse(&["-a", "-D", "2", "--loopback", "--test", "write_lat", "--poll", "yield"]).unwrap();
        assert_eq!(a.sizes().len(), 23);
        assert_eq!(a.sizes()[0], 2);
        assert_eq!(*a.sizes().last().unwrap(), 8 << 20);
        assert_eq!(a.limit_for(1 << 20), Limit::Duration(std::time::Duration::from_secs(2)));
        assert_eq!(a.poll, PollKind::Yield);
        assert!(!a.use_srq);
        assert!(parse(&["--use-srq"]).unwrap().use_srq);
        assert_eq!(a.inline_size, 220);
        assert_eq!(parse(&["-I", "0"]).unwrap().inline_size, 0);
        assert!(parse(&["-I", "913"]).is_err());
        assert_eq!(parse(&["-x", "-1"]).unwrap().gid_index, -1);
    }

    #[test]
    fn bad_flags_are_clap_errors() {
        use clap::error::ErrorKind;
        assert_eq!(parse(&["--test", "nope"]).unwrap_err().kind(), ErrorKind::InvalidValue);
        assert_eq!(parse(&["-x", "-2"]).unwrap_err().kind(), ErrorKind::ValueValidation);
        assert_eq!(parse(&["-i", "0"]).unwrap_err().kind(), ErrorKind::ValueValidation);
        assert_eq!(parse(&["-n", "10", "-D", "1"]).unwrap_err().kind(), ErrorKind::ArgumentConflict);
        assert_eq!(parse(&["host", "--loopback"]).unwrap_err().kind(), ErrorKind::ArgumentConflict);
        assert_eq!(parse(&["--transport", "tcp"]).unwrap_err().kind(), ErrorKind::InvalidValue);
        let e = parse(&["-s", "65M"]).unwrap_err().to_string();
        assert!(e.contains("outside 1..=67108864 (64M, the runtime's default max_message_size)"), "{e}");
        let e = parse(&["--req-size", "67108865"]).unwrap_err().to_string();
        assert!(e.contains("outside 1..=67108864"), "{e}");
        let e = parse(&["-s", "abc"]).unwrap_err().to_string();
        assert!(e.contains("not a byte count"), "{e}");
        let e = parse(&["--plot", "x.png"]).unwrap_err().to_string();
        assert!(e.contains("ending in .svg"), "{e}");
        let a = parse(&["-t", "8", "-Q", "9"]).unwrap();
        assert!(a.validate().unwrap_err().contains("--cq-mod 9 must not exceed --tx-depth 8"));
        let a = parse(&["-a", "--req-size", "8"]).unwrap();
        assert!(a.validate().unwrap_err().contains("drop --req-size"));
        let a = parse(&["--cores", "1,1"]).unwrap();
        assert!(a.validate().unwrap_err().contains("two different cores"));
        let a = parse(&["--cores", "1"]).unwrap();
        assert!(a.validate().unwrap_err().contains("takes two core numbers"));
    }

    #[test]
    fn servers_flags() {
        let a = parse(&["--loopback", "--servers", "8", "--test", "rpc_bw"]).unwrap();
        assert_eq!((a.servers, a.server_poll, a.first_server_poll), (Some(8), ServerPoll::Event, None));
        a.validate().unwrap();
        let a = parse(&[
            "--loopback",
            "--servers",
            "100",
            "--server-poll",
            "yield",
            "--first-server-poll",
            "busy",
        ])
        .unwrap();
        assert_eq!((a.server_poll, a.first_server_poll), (ServerPoll::Yield, Some(ServerPoll::Busy)));
        assert!(a.validate().unwrap_err().contains("drop send_lat from --test"));
        assert!(parse(&["--servers", "2"]).is_err(), "--servers needs --loopback");
        assert!(parse(&["--loopback", "--servers", "0"]).is_err());
        let a = parse(&["--loopback", "--servers", "2", "--test", "rpc_lat", "--transport", "rdma"]).unwrap();
        assert!(a.validate().unwrap_err().contains("sim only"));
        assert!(parse(&["--serve-rpc", "--loopback"]).is_err());
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("32"), Ok(32));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1G").is_err());
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("9M"), Ok(9 << 20));
        assert_eq!(default_iters(32), 100_000);
        assert_eq!(default_iters(1 << 20), 1024);
        assert_eq!(default_iters(8 << 20), 1000);
        assert_eq!(default_iters(16 << 20), 1000);
        assert_eq!(default_iters(128 << 20), 16);
        let a = parse(&["-s", "64M"]).unwrap();
        assert_eq!(a.sizes(), vec![64 << 20]);
        assert_eq!((a.warmup_for(32), a.warmup_for(128 << 20)), (1000, 16));
        assert_eq!(parse(&["--warmup", "3"]).unwrap().warmup_for(128 << 20), 3);
        assert_eq!(a.ring_bytes, None);
        assert_eq!(parse(&["--ring-bytes", "1M"]).unwrap().ring_bytes, Some(1 << 20));
        assert!(parse(&["--ring-bytes", "2G"])
            .unwrap_err()
            .to_string()
            .contains("outside 4096..=1073741824"));
    }
}
