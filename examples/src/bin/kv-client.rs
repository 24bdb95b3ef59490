//! Runs the checking workload (values from 0 bytes to 6 MiB) against a running `kv-server`.
//!
//! `kv-client --transport rdma [-d DEV] [--addr HOST:50052]`

use clap::Parser;
use rpc_core::ClientConfig;
use rpc_examples::kv::kv_client::KvClient;
use rpc_examples::transport_args::TransportArgs;

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
    let args = Args::parse();
    let cfg = ClientConfig::default()
        .transport(args.transport.transport())
        .polling(args.transport.poll)
        .ring_bytes(32 << 20);
    let client = match KvClient::connect_with(args.addr.as_str(), &cfg) {
        Ok(c) => c,
        Err(s) => {
            eprintln!("kv-client: error: connecting to {}: {s}", args.addr);
            std::process::exit(1);
        }
    };
    match rpc_examples::kv_workload::run(&client, &mut std::io::stdout()) {
        Ok(calls) => println!("kv-client: {calls} calls, every answer checked"),
        Err(e) => {
            eprintln!("kv-client: error: {e}");
            std::process::exit(1);
        }
    }
}
