//! Serves tonic's route_guide (proto/route_guide.proto) until killed.
//!
//! `route-guide-server --transport rdma [-d DEV] [--addr 0.0.0.0:10000]`

use clap::Parser;
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::route_guide::RouteGuideService;
use rpc_examples::routeguide::route_guide_server::RouteGuideServer;

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
    let server = args
        .transport
        .server()
        .add_health_service()
        .add_reflection()
        .add_service(RouteGuideServer::new(RouteGuideService::new()))
        .spawn(args.addr.as_str());
    cli::serve_until_killed(env!("CARGO_BIN_NAME"), "RouteGuide", server);
}
