//! Calls all four RPCs of a route-guide-server and checks every answer (exits 1 on a wrong
//! one): through a blocking client, then through a channel from tokio tasks.
//!
//! `route-guide-client --transport rdma [-d DEV] [--addr 127.0.0.1:10000]`

use clap::Parser;
use rpc_core::{ChannelConfig, ClientConfig, PollingPolicy};
use rpc_examples::route_guide::{run_blocking, run_channel};
use rpc_examples::routeguide::route_guide_client::RouteGuideClient;
use rpc_examples::transport_args::TransportArgs;

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
    if let Err(e) = run(&Args::parse()) {
        eprintln!("route-guide-client: error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let cfg = ClientConfig::default().transport(args.transport.transport()).polling(args.transport.poll);
    let client =
        RouteGuideClient::connect_with(args.addr.as_str(), &cfg).map_err(|s| format!("connecting: {s}"))?;
    // This run's chat notes at a location of their own (another client's do not mix in).
    let run = (std::process::id() % 1_000_000) as i32 * 2 + 10;
    run_blocking(&client, run, &mut std::io::stdout()).map_err(|e| e.to_string())?;
    println!("route-guide-client: blocking client: all four RPC shapes checked");
    drop(client);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
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
