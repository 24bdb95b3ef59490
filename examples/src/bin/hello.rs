//! The Greeter served and called in one process on the software NIC: a blocking call and an
//! async one, each reply checked.
//!
//! `hello [--name NAME]`

use std::future::Future;
use std::task::{Context, Poll, Waker};

use clap::Parser;
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::greeter::MyGreeter;
use rpc_examples::helloworld::greeter_client::GreeterClient;
use rpc_examples::helloworld::greeter_server::GreeterServer;
use rpc_examples::helloworld::HelloRequest;

/// Serve and call the Greeter in one process.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Who to greet.
    #[arg(long, default_value = "world")]
    name: String,
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
        .add_service(GreeterServer::new(MyGreeter))
        .spawn("127.0.0.1:0")
        .map_err(|e| format!("starting the server: {e}"))?;
    println!("server: Greeter on {} ({:?})", server.local_addr(), args.transport.transport);
    let cfg = args.transport.client_config();
    let client =
        GreeterClient::connect_with(server.local_addr(), &cfg).map_err(|s| format!("connecting: {s}"))?;
    let want = format!("Hello {}", args.name);
    let req = HelloRequest { name: args.name.clone() };

    let r = client.say_hello(&req).map_err(|s| format!("SayHello: {s}"))?;
    println!("client (blocking): {}", r.message);
    let r = block_on(client.say_hello_async(&req)).map_err(|s| format!("SayHello (async): {s}"))?;
    println!("client (async):    {}", r.message);
    if r.message != want {
        return Err(format!("got {:?}, expected {want:?}", r.message));
    }
    drop(client);
    server.shutdown();
    Ok(())
}

/// Drives a future in this thread: the runtime's futures progress when polled.
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}
