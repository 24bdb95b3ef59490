//! The Greeter served and called in one process on the software NIC, the tokio way: one
//! `Channel` (the shareable handle) cloned into `--tasks` tasks of a multi-thread runtime, each
//! making `--calls` calls, every reply checked.
//!
//! `hello-tokio [--tasks N] [--calls N]`

use clap::Parser;
use rpc_core::{ChannelConfig, PollingPolicy};
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::greeter::MyGreeter;
use rpc_examples::helloworld::greeter_client::GreeterClient;
use rpc_examples::helloworld::greeter_server::GreeterServer;
use rpc_examples::helloworld::HelloRequest;

/// Serve the Greeter and call it from many tokio tasks through one channel.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Tasks sharing the channel.
    #[arg(long, default_value_t = 8)]
    tasks: u32,
    /// Calls per task.
    #[arg(long, default_value_t = 1000)]
    calls: u32,
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
    let addr = server.local_addr();
    println!("server: Greeter on {addr} ({:?})", args.transport.transport);
    let rt = cli::tokio_runtime()?;
    // The dispatcher sleeps on completion events when it has nothing to do.
    let cfg = ChannelConfig::default()
        .client(args.transport.client_config().polling(PollingPolicy::Event { spins: 0 }));
    let (tasks, calls) = (args.tasks, args.calls);
    let total = rt.block_on(async move {
        let client =
            GreeterClient::connect_channel_with(addr, &cfg).await.map_err(|s| format!("connecting: {s}"))?;
        let mut handles = Vec::new();
        for t in 0..tasks {
            let client = client.clone();
            handles.push(tokio::spawn(async move {
                for i in 0..calls {
                    let name = format!("task {t} call {i}");
                    let r = client
                        .say_hello(HelloRequest { name: name.clone() })
                        .await
                        .map_err(|s| format!("SayHello: {s}"))?;
                    if r.message != format!("Hello {name}") {
                        return Err(format!("got {:?} for {name:?}", r.message));
                    }
                }
                Ok::<u32, String>(calls)
            }));
        }
        let mut total = 0;
        for h in handles {
            total += h.await.map_err(|e| format!("task: {e}"))??;
        }
        Ok::<u32, String>(total)
    })?;
    println!("client: {total} replies from {tasks} tasks over one channel, all checked");
    drop(rt);
    server.shutdown();
    Ok(())
}
