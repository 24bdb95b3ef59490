//! Serves the Greeter (proto/helloworld.proto) until killed.
//!
//! `hello-server --transport rdma [-d DEV] [--addr 0.0.0.0:50051]`

use clap::Parser;
use rpc_core::Server;
use rpc_examples::greeter::MyGreeter;
use rpc_examples::helloworld::greeter_server::GreeterServer;
use rpc_examples::transport_args::TransportArgs;

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
    let server = Server::builder()
        .transport(args.transport.transport())
        .polling(args.transport.poll)
        .add_service(GreeterServer::new(MyGreeter))
        .spawn(args.addr.as_str());
    match server {
        Ok(handle) => {
            println!("hello-server: Greeter listening on {}", handle.local_addr());
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("hello-server: error: {e}");
            std::process::exit(1);
        }
    }
}
