//! Serves the key-value store (proto/kv.proto) until killed.
//!
//! `kv-server --transport rdma [-d DEV] [--addr 0.0.0.0:50052]`

use clap::Parser;
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::kv::kv_server::KvServer;
use rpc_examples::kv_store::KvStore;

/// Serve the key-value store.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TCP address of the handshake listener.
    #[arg(long, default_value = "0.0.0.0:50052")]
    addr: String,
    #[command(flatten)]
    transport: TransportArgs,
}

/// Receive-ring bytes per session: bulk values up to 8 MiB, with room to spare.
pub const RING_BYTES: u32 = 32 << 20;

fn main() {
    let args = Args::parse();
    let server = args
        .transport
        .server()
        .ring_bytes(RING_BYTES)
        // Its clients (kv-client) ask for a 32 MiB ring too: mirror it (the default cap is 4 MiB).
        .max_peer_ring_bytes(32 << 20)
        .add_health_service()
        .add_reflection()
        .add_service(KvServer::new(KvStore::default()))
        .spawn(args.addr.as_str());
    cli::serve_until_killed(env!("CARGO_BIN_NAME"), "Kv", server);
}
