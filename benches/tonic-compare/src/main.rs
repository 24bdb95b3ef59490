//! tonic-compare: the same services on tonic over TCP loopback and on our runtime over the
//! software NIC, measured in one run (server and client on two pinned cores):
//!
//! 1. Greeter.SayHello round trip, one call in flight (perftest latency table, p50 ratio);
//! 2. SayHello with 32 calls in flight: tonic from 32 tasks sharing one channel; ours from 32
//!    tasks sharing one `Channel` (same shape), and from the per-thread client with 32 async
//!    calls in flight (calls/s, ratio);
//! 3. a server stream (rpcperf.Bench/Stream) of 32 B and of 64 KiB messages (messages/s and
//!    goodput, ratio). Both servers answer from slices of one static payload.
//!
//! ```text
//! cargo run --release --manifest-path benches/tonic-compare/Cargo.toml
//! ```

mod ours_side;
mod tonic_side;

use clap::Parser;
use rpc_perf::report;
use rpc_perf::stats::LatencyRecorder;

/// Compare tonic (TCP loopback) and rpc-core (sim): latency, 32 in flight, server streaming.
#[derive(Parser, Debug)]
#[command(name = "tonic-compare", version, about)]
struct Args {
    /// Measured calls of each unary case on each side.
    #[arg(short = 'n', long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(5..))]
    iters: u64,
    /// Unmeasured calls first (and the warm-up stream's messages).
    #[arg(long, default_value_t = 2_000)]
    warmup: u64,
    /// Bytes of the `name` field (the reply is "Hello " + name).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..=65536))]
    name_len: u64,
    /// Calls in flight in the concurrent case (tasks on each side).
    #[arg(short = 'c', long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=64))]
    in_flight: u64,
    /// Messages of the 32-byte stream.
    #[arg(long, default_value_t = 200_000)]
    small_messages: u64,
    /// Messages of the 64 KiB stream.
    #[arg(long, default_value_t = 4_096)]
    large_messages: u64,
    /// Let our side's waiting threads yield the core after a few empty polls (instead of
    /// busy-polling, which is the product's default and what the comparison is about).
    #[arg(long = "yield")]
    yield_poll: bool,
}

/// What both sides run.
pub struct Plan {
    /// The Greeter's `name`.
    pub name: String,
    /// Unmeasured calls (and warm-up stream messages).
    pub warmup: u64,
    /// Measured calls per unary case.
    pub iters: u64,
    /// Calls in flight in the concurrent case.
    pub in_flight: usize,
    /// Streams measured: (message bytes, messages).
    pub streams: Vec<(usize, u64)>,
}

impl Plan {
    /// Receive-ring bytes for the largest stream message (four in flight, at least 1 MiB).
    pub fn ring_bytes(&self) -> u32 {
        let max = self.streams.iter().map(|s| s.0).max().unwrap_or(0);
        rpc_perf::rpc::ring_bytes_for(max)
    }
}

/// One stream's figures.
pub struct StreamFigure {
    /// Message payload bytes.
    pub size: usize,
    /// Messages taken.
    pub count: u64,
    /// Seconds from opening the stream to its end.
    pub secs: f64,
}

/// What one side measured.
pub struct Figures {
    /// One call in flight.
    pub latency: LatencyRecorder,
    /// Ours only: the per-thread client with `in_flight` async calls, calls/s.
    pub client_rps: Option<f64>,
    /// `in_flight` tasks sharing one channel, calls/s.
    pub tasks_rps: f64,
    /// The streams, in plan order.
    pub streams: Vec<StreamFigure>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("tonic-compare: error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let (server_core, client_core) = (cores.first().copied(), cores.get(1).copied());
    if let Some(c) = client_core {
        core_affinity::set_for_current(c);
    }
    let plan = Plan {
        name: "x".repeat(args.name_len as usize),
        warmup: args.warmup,
        iters: args.iters,
        in_flight: args.in_flight as usize,
        streams: vec![(32, args.small_messages), (64 << 10, args.large_messages)],
    };

    let bytes = args.name_len as usize;
    let ours = ours_side::measure(&plan, server_core, polling(args))?;
    print_table("rpc-core over sim (Greeter.SayHello, round trip)", bytes, &ours.latency);
    let tonic = tonic_side::measure(&plan, server_core)?;
    print_table("tonic 0.14, HTTP/2 over TCP loopback (Greeter.SayHello, round trip)", bytes, &tonic.latency);
    let (t, o) = (p50(&tonic.latency), p50(&ours.latency));
    println!(
        " p50 round trip: tonic {:.2} usec / ours {:.2} usec = {:.0}x",
        t / 1000.0,
        o / 1000.0,
        t / o.max(1.0)
    );

    let c = plan.in_flight;
    println!("{}", report::banner(&format!("Greeter.SayHello, {c} calls in flight"), &[]));
    println!(" {:<62} {:>14}", "side", "calls/sec");
    println!(
        " {:<62} {:>14.0}",
        format!("tonic: {c} tasks share one channel (current-thread runtime)"),
        tonic.tasks_rps
    );
    println!(
        " {:<62} {:>14.0}",
        format!("ours: {c} tasks share one Channel (current-thread runtime)"),
        ours.tasks_rps
    );
    if let Some(r) = ours.client_rps {
        println!(" {:<62} {:>14.0}", format!("ours: per-thread Client, {c} async calls in flight"), r);
    }
    println!(" ratio (Channel / tonic): {:.1}x", ours.tasks_rps / tonic.tasks_rps.max(1.0));
    println!("{}", report::RESULT_LINE);

    println!("{}", report::banner("rpcperf.Bench/Stream, one server stream", &[]));
    println!(
        " {:<8} {:>9} {:<6} {:>14} {:>18} {:>8}",
        "#bytes", "messages", "side", "messages/sec", "goodput[MiB/sec]", "ratio"
    );
    for (o, t) in ours.streams.iter().zip(&tonic.streams) {
        let rate = |f: &StreamFigure| f.count as f64 / f.secs;
        let mib = |f: &StreamFigure| f.count as f64 * f.size as f64 / f.secs / f64::from(1u32 << 20);
        println!(" {:<8} {:>9} {:<6} {:>14.0} {:>18.1}", t.size, t.count, "tonic", rate(t), mib(t));
        println!(
            " {:<8} {:>9} {:<6} {:>14.0} {:>18.1} {:>7.1}x",
            o.size,
            o.count,
            "ours",
            rate(o),
            mib(o),
            rate(o) / rate(t).max(1e-9)
        );
    }
    println!("{}", report::RESULT_LINE);
    Ok(())
}

fn p50(r: &LatencyRecorder) -> f64 {
    r.summary().map_or(0.0, |s| s.typical_ns)
}

fn print_table(title: &str, bytes: usize, rec: &LatencyRecorder) {
    println!("{}", report::banner(title, &[("Latency", "round trip".into())]));
    println!("{}", report::LAT_HEADER);
    if let Some(s) = rec.summary() {
        println!("{}", report::latency_row(bytes, &s));
    }
    println!("{}", report::RESULT_LINE);
}

fn polling(args: &Args) -> rpc_core::PollingPolicy {
    if args.yield_poll {
        rpc_core::PollingPolicy::SpinThenYield { spins: 64 }
    } else {
        rpc_core::PollingPolicy::Busy
    }
}
