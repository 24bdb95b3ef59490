//! Calls Greeter.SayHello on a running `hello-server`.
//!
//! `hello-client --transport rdma [-d DEV] [--addr HOST:50051] [--name NAME] [-n COUNT]`

use clap::Parser;
use rpc_core::ClientConfig;
use rpc_examples::helloworld::greeter_client::GreeterClient;
use rpc_examples::helloworld::HelloRequest;
use rpc_examples::transport_args::TransportArgs;

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
    let args = Args::parse();
    let cfg = ClientConfig::default().transport(args.transport.transport()).polling(args.transport.poll);
    let client = match GreeterClient::connect_with(args.addr.as_str(), &cfg) {
        Ok(c) => c,
        Err(s) => {
            eprintln!("hello-client: error: connecting to {}: {s}", args.addr);
            std::process::exit(1);
        }
    };
    for _ in 0..args.count {
        match client.say_hello(&HelloRequest { name: args.name.clone() }) {
            Ok(r) => println!("{}", r.message),
            Err(s) => {
                eprintln!("hello-client: error: SayHello: {s}");
                std::process::exit(1);
            }
        }
    }
}
