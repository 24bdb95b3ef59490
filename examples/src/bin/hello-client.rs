//! Calls Greeter.SayHello on a running `hello-server`.
//!
//! `hello-client --transport rdma [-d DEV] [--addr HOST:50051] [--name NAME] [-n COUNT]`

use clap::Parser;
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::helloworld::greeter_client::GreeterClient;
use rpc_examples::helloworld::HelloRequest;

/// Greet a hello-server.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The server's handshake address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: String,
    /// Who to greet.
    #[arg(long, default_value = "world")]
    name: String,
    /// How many calls.
    #[arg(short = 'n', long, default_value_t = 1)]
    count: u32,
    #[command(flatten)]
    transport: TransportArgs,
}

fn main() {
    cli::exit_on_error(env!("CARGO_BIN_NAME"), run(&Args::parse()));
}

fn run(args: &Args) -> Result<(), String> {
    let cfg = args.transport.client_config();
    let client = GreeterClient::connect_with(args.addr.as_str(), &cfg)
        .map_err(|s| format!("connecting to {}: {s}", args.addr))?;
    for _ in 0..args.count {
        let r = client
            .say_hello(&HelloRequest { name: args.name.clone() })
            .map_err(|s| format!("SayHello: {s}"))?;
        println!("{}", r.message);
    }
    Ok(())
}
