//! Calls all four RPCs of a route-guide-server and checks every answer (exits 1 on a wrong
//! one): through a blocking client, then through a channel from tokio tasks.
//!
//! `route-guide-client --transport rdma [-d DEV] [--addr 127.0.0.1:10000]`

use clap::Parser;
use rpc_core::{ChannelConfig, PollingPolicy};
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::route_guide::{run_blocking, run_channel};
use rpc_examples::routeguide::route_guide_client::RouteGuideClient;

/// Exercise a route-guide-server.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TCP address of the server's handshake listener.
    #[arg(long, default_value = "127.0.0.1:10000")]
    addr: String,
    #[command(flatten)]
    transport: TransportArgs,
}

fn main() {
    cli::exit_on_error(env!("CARGO_BIN_NAME"), run(&Args::parse()));
}

fn run(args: &Args) -> Result<(), String> {
    let cfg = args.transport.client_config();
    let client =
        RouteGuideClient::connect_with(args.addr.as_str(), &cfg).map_err(|s| format!("connecting: {s}"))?;
    // This run's chat notes at a location of their own (another client's do not mix in).
    let run = (std::process::id() % 1_000_000) as i32 * 2 + 10;
    run_blocking(&client, run, &mut std::io::stdout()).map_err(|e| e.to_string())?;
    println!("route-guide-client: blocking client: all four RPC shapes checked");
    drop(client);
    let rt = cli::tokio_runtime()?;
    let ccfg = ChannelConfig::default().client(cfg.polling(PollingPolicy::Event { spins: 0 }));
    let addr = args.addr.clone();
    rt.block_on(async move {
        let client = RouteGuideClient::connect_channel_with(addr, &ccfg)
            .await
            .map_err(|s| format!("connecting: {s}"))?;
        run_channel(&client, run + 1).await.map_err(|e| e.to_string())
    })?;
    println!("route-guide-client: channel from tokio tasks: all four RPC shapes checked");
    Ok(())
}
