//! tonic-compare: the same helloworld Greeter on tonic over TCP loopback and on our runtime over
//! the software NIC, measured in one run (one call in flight, server and client on two pinned
//! cores), printed as perftest latency tables with the p50 ratio.
//!
//! ```text
//! cargo run --release --manifest-path benches/tonic-compare/Cargo.toml
//! ```

mod ours_side;
mod tonic_side;

use clap::Parser;
use rpc_perf::report;
use rpc_perf::stats::LatencyRecorder;

/// Compare the Greeter's round trip on tonic (TCP loopback) and on rpc-core (sim).
#[derive(Parser, Debug)]
#[command(name = "tonic-compare", version, about)]
struct Args {
    /// Measured calls on each side.
    #[arg(short = 'n', long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(5..))]
    iters: u64,
    /// Unmeasured calls first.
    #[arg(long, default_value_t = 2_000)]
    warmup: u64,
    /// Bytes of the `name` field (the reply is "Hello " + name).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..=65536))]
    name_len: u64,
    /// Let our side's waiting threads yield the core after a few empty polls (instead of
    /// busy-polling, which is the product's default and what the comparison is about).
    #[arg(long = "yield")]
    yield_poll: bool,
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
    let name = "x".repeat(args.name_len as usize);

    let bytes = args.name_len as usize;
    let ours = ours_side::measure(&name, args.warmup, args.iters, server_core, polling(args))?;
    print_table("rpc-core over sim (Greeter.SayHello, round trip)", bytes, &ours);
    let tonic = tonic_side::measure(&name, args.warmup, args.iters, server_core)?;
    print_table("tonic 0.14, HTTP/2 over TCP loopback (Greeter.SayHello, round trip)", bytes, &tonic);
    let (t, o) = (p50(&tonic), p50(&ours));
    println!(
        " p50 round trip: tonic {:.2} usec / ours {:.2} usec = {:.0}x",
        t / 1000.0,
        o / 1000.0,
        t / o.max(1.0)
    );
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
