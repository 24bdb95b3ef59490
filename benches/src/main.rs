//! The rpc-perf command. See `rpc-perf --help`.

use clap::Parser;
use rpc_perf::dynamic::args::Command;

fn main() {
    let args = rpc_perf::Args::parse();
    let res = match &args.command {
        Some(Command::Call(c)) => rpc_perf::dynamic::call::run(c).map(|out| print!("{out}")),
        Some(Command::Bench(b)) => rpc_perf::dynamic::bench::run(b).map(drop),
        None => rpc_perf::transport::run(&args).map(drop),
    };
    if let Err(e) = res {
        eprintln!("rpc-perf: error: {}", rpc_perf::dynamic::one_line(&e.to_string()));
        std::process::exit(1);
    }
}
