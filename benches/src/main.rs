//! The rpc-perf command. See `rpc-perf --help`.

use clap::Parser;

fn main() {
    let args = rpc_perf::Args::parse();
    if let Err(e) = rpc_perf::transport::run(&args) {
        eprintln!("rpc-perf: error: {e}");
        std::process::exit(1);
    }
}
