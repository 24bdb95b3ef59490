//! The rpc-perf command. See `rpc-perf --help`.

use clap::Parser;
use rpc_perf::dynamic::args::Command;

fn main() {
    // The runtime's logs on stderr, filtered by RUST_LOG (default: warnings and errors only);
    // RUST_LOG=info shows, among others, the GID each side chose (`select_gid`).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = rpc_perf::Args::parse();
    let res = match &args.command {
        Some(Command::Call(c)) => rpc_perf::dynamic::call::run(c).map(|out| print!("{out}")),
        Some(Command::Bench(b)) => rpc_perf::dynamic::bench::run(b).map(drop),
        None if args.serve_rpc => rpc_perf::multi::serve(&args),
        None => rpc_perf::transport::run(&args).map(drop),
    };
    if let Err(e) = res {
        eprintln!("rpc-perf: error: {}", rpc_perf::dynamic::one_line(&e.to_string()));
        std::process::exit(1);
    }
}
