//! Serves the key-value store (proto/kv.proto) until killed.
//!
//! `kv-server --transport rdma [-d DEV] [--addr 0.0.0.0:50052]`

use clap::Parser;
use rpc_core::Server;
use rpc_examples::kv::kv_server::KvServer;
use rpc_examples::kv_store::KvStore;
use rpc_examples::transport_args::TransportArgs;

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
    let server = Server::builder()
        .transport(args.transport.transport())
        .polling(args.transport.poll)
        .ring_bytes(RING_BYTES)
        .add_service(KvServer::new(KvStore::default()))
        .spawn(args.addr.as_str());
    match server {
        Ok(handle) => {
            println!("kv-server: Kv listening on {}", handle.local_addr());
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("kv-server: error: {e}");
            std::process::exit(1);
        }
    }
}
