//! Serves the Greeter (proto/helloworld.proto) until killed.
//!
//! `hello-server --transport rdma [-d DEV] [--addr 0.0.0.0:50051]`

use clap::Parser;
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::greeter::MyGreeter;
use rpc_examples::helloworld::greeter_server::GreeterServer;

/// Serve the helloworld Greeter.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TCP address of the handshake listener.
    #[arg(long, default_value = "0.0.0.0:50051")]
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
        .add_service(GreeterServer::new(MyGreeter))
        .spawn(args.addr.as_str());
    cli::serve_until_killed(env!("CARGO_BIN_NAME"), "Greeter", server);
}
