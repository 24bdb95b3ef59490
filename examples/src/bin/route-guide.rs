//! tonic's route_guide served and exercised in one process on the software NIC: GetFeature
//! (unary), ListFeatures (server streaming), RecordRoute (client streaming) and RouteChat
//! (bidirectional), through a blocking client and through a shareable channel from tokio tasks;
//! every answer checked (exits 1 on a wrong one).
//!
//! `route-guide [--transport rdma -d DEV]`

use clap::Parser;
use rpc_core::{ChannelConfig, PollingPolicy};
use rpc_examples::cli::{self, TransportArgs};
use rpc_examples::route_guide::{run_blocking, run_channel, RouteGuideService};
use rpc_examples::routeguide::route_guide_client::RouteGuideClient;
use rpc_examples::routeguide::route_guide_server::RouteGuideServer;

/// Serve and exercise the route guide in one process.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
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
        .add_service(RouteGuideServer::new(RouteGuideService::new()))
        .spawn("127.0.0.1:0")
        .map_err(|e| format!("starting the server: {e}"))?;
    let cfg = args.transport.client_config();
    let client =
        RouteGuideClient::connect_with(server.local_addr(), &cfg).map_err(|s| format!("connecting: {s}"))?;
    run_blocking(&client, 1, &mut std::io::stdout()).map_err(|e| e.to_string())?;
    println!("route-guide: blocking client: all four RPC shapes checked");
    drop(client);
    let addr = server.local_addr();
    let rt = cli::tokio_runtime()?;
    let ccfg = ChannelConfig::default().client(cfg.polling(PollingPolicy::Event { spins: 0 }));
    rt.block_on(async move {
        let client = RouteGuideClient::connect_channel_with(addr, &ccfg)
            .await
            .map_err(|s| format!("connecting: {s}"))?;
        run_channel(&client, 2).await.map_err(|e| e.to_string())
    })?;
    println!("route-guide: channel from tokio tasks: all four RPC shapes checked");
    server.shutdown();
    Ok(())
}
