//! Serves tonic's route_guide (proto/route_guide.proto) until killed.
//!
//! `route-guide-server --transport rdma [-d DEV] [--addr 0.0.0.0:10000]`

use clap::Parser;
use rpc_core::Server;
use rpc_examples::route_guide::RouteGuideService;
use rpc_examples::routeguide::route_guide_server::RouteGuideServer;
use rpc_examples::transport_args::TransportArgs;

/// Serve the route guide.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TCP address of the handshake listener.
    #[arg(long, default_value = "0.0.0.0:10000")]
    addr: String,
    #[command(flatten)]
    transport: TransportArgs,
}

fn main() {
    let args = Args::parse();
    let server = Server::builder()
        .transport(args.transport.transport())
        .polling(args.transport.poll)
        .add_service(RouteGuideServer::new(RouteGuideService::new()))
        .spawn(args.addr.as_str());
    match server {
        Ok(handle) => {
            println!("route-guide-server: RouteGuide listening on {}", handle.local_addr());
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("route-guide-server: error: {e}");
            std::process::exit(1);
        }
    }
}
