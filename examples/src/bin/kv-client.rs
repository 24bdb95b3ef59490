//! Runs the checking workload (values from 0 bytes to 6 MiB) against a running `kv-server`.
//!
//! `kv-client --transport rdma [-d DEV] [--addr HOST:50052]`

use clap::Parser;
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::kv::kv_client::KvClient;

/// Exercise a kv-server and check every answer.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The server's handshake address.
    #[arg(long, default_value = "127.0.0.1:50052")]
    addr: String,
    #[command(flatten)]
    transport: TransportArgs,
}

fn main() {
    cli::exit_on_error(env!("CARGO_BIN_NAME"), run(&Args::parse()));
}

fn run(args: &Args) -> Result<(), String> {
    let cfg = args.transport.client_config().ring_bytes(32 << 20);
    let client = KvClient::connect_with(args.addr.as_str(), &cfg)
        .map_err(|s| format!("connecting to {}: {s}", args.addr))?;
    let calls = rpc_examples::kv_workload::run(&client, &mut std::io::stdout()).map_err(|e| e.to_string())?;
    println!("kv-client: {calls} calls, every answer checked");
    Ok(())
}
