//! Bearer-token authentication with request metadata and interceptors, in one process on the
//! software NIC: the server's interceptor checks `authorization: Bearer <token>` on every call
//! before any handler runs (UNAUTHENTICATED otherwise); one client adds the token to every call
//! with its own interceptor, another sends it on one call through a `Request`, and a client
//! without it is refused.
//!
//! `hello-auth [--token TOKEN]`

use clap::Parser;
use rpc_core::{Code, Request, Status};
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::greeter::MyGreeter;
use rpc_examples::helloworld::greeter_client::GreeterClient;
use rpc_examples::helloworld::greeter_server::GreeterServer;
use rpc_examples::helloworld::HelloRequest;

/// Serve the Greeter behind a bearer token and call it with and without one.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The token the server accepts.
    #[arg(long, default_value = "s3cr3t")]
    token: String,
    #[command(flatten)]
    transport: TransportArgs,
}

fn main() {
    cli::exit_on_error(env!("CARGO_BIN_NAME"), run(&Args::parse()));
}

fn run(args: &Args) -> Result<(), String> {
    let expected = format!("Bearer {}", args.token);
    let server = args
        .transport
        .server()
        // Runs on the worker before every handler: a refusal answers the call, no handler runs.
        .interceptor(move |call| match call.metadata().get("authorization") {
            Some(t) if t == expected => Ok(()),
            Some(_) => Err(Status::unauthenticated("invalid bearer token")),
            None => Err(Status::unauthenticated(format!("{} needs a bearer token", call.method()))),
        })
        .add_service(GreeterServer::new(MyGreeter))
        .spawn("127.0.0.1:0")
        .map_err(|e| format!("starting the server: {e}"))?;
    let addr = server.local_addr();
    let req = HelloRequest { name: "auth".into() };

    // A client whose interceptor adds the token to every call.
    let bearer = format!("Bearer {}", args.token);
    let cfg = args.transport.client_config().interceptor(move |md| {
        md.insert("authorization", &bearer).map_err(|e| Status::internal(e.to_string()))
    });
    let authed = GreeterClient::connect_with(addr, &cfg).map_err(|s| format!("connecting: {s}"))?;
    let r = authed.say_hello(&req).map_err(|s| format!("SayHello with the interceptor's token: {s}"))?;
    println!("with the client interceptor's token: {}", r.message);

    // A plain client: refused, then accepted with the token on one call (tonic's `Request`).
    let plain = GreeterClient::connect_with(addr, &args.transport.client_config())
        .map_err(|s| format!("connecting: {s}"))?;
    match plain.say_hello(&req) {
        Err(s) if s.code() == Code::Unauthenticated => println!("without a token: refused: {s}"),
        other => return Err(format!("a call without a token was not refused: {other:?}")),
    }
    let mut with_token = Request::new(req.clone());
    with_token
        .metadata_mut()
        .insert("authorization", &format!("Bearer {}", args.token))
        .map_err(|e| e.to_string())?;
    let r = plain.say_hello(with_token).map_err(|s| format!("SayHello with a Request's token: {s}"))?;
    println!("with a Request's token: {}", r.message);
    drop((authed, plain));
    server.shutdown();
    Ok(())
}
