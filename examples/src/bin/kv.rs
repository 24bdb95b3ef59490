//! The key-value store served and exercised in one process on the software NIC: values from
//! 0 bytes to 6 MiB (SEND path and RDMA WRITE ring path), every answer checked.
//!
//! `kv`

use clap::Parser;
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::kv::kv_client::KvClient;
use rpc_examples::kv::kv_server::KvServer;
use rpc_examples::kv_store::KvStore;

/// Serve and exercise the key-value store in one process.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    transport: TransportArgs,
}

fn main() {
    cli::exit_on_error(env!("CARGO_BIN_NAME"), run(&Args::parse()));
}

fn run(args: &Args) -> Result<(), String> {
    let server = args
        .transport
        .server()
        .ring_bytes(32 << 20)
        .max_peer_ring_bytes(32 << 20)
        .add_service(KvServer::new(KvStore::default()))
        .spawn("127.0.0.1:0")
        .map_err(|e| format!("starting the server: {e}"))?;
    let cfg = args.transport.client_config().ring_bytes(32 << 20);
    let client = KvClient::connect_with(server.local_addr(), &cfg).map_err(|s| format!("connecting: {s}"))?;
    let calls = rpc_examples::kv_workload::run(&client, &mut std::io::stdout()).map_err(|e| e.to_string())?;
    println!("kv: {calls} calls, every answer checked");
    drop(client);
    server.shutdown();
    Ok(())
}
