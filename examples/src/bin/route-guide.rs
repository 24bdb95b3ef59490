//! tonic's route_guide served and exercised in one process on the software NIC: GetFeature
//! (unary), ListFeatures (server streaming), RecordRoute (client streaming) and RouteChat
//! (bidirectional), through a blocking client and through a shareable channel from tokio tasks;
//! every answer checked (exits 1 on a wrong one).
//!
//! `route-guide [--transport rdma -d DEV]`

use clap::Parser;
use rpc_core::{ChannelConfig, ClientConfig, PollingPolicy, Server};
use rpc_examples::route_guide::{run_blocking, run_channel, RouteGuideService};
use rpc_examples::routeguide::route_guide_client::RouteGuideClient;
use rpc_examples::routeguide::route_guide_server::RouteGuideServer;
use rpc_examples::transport_args::TransportArgs;

/// Serve and exercise the route guide in one process.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    transport: TransportArgs,
}

fn main() {
    if let Err(e) = run(&Args::parse()) {
        eprintln!("route-guide: error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let server = Server::builder()
        .transport(args.transport.transport())
        .polling(args.transport.poll)
        .add_service(RouteGuideServer::new(RouteGuideService::new()))
        .spawn("127.0.0.1:0")
        .map_err(|e| format!("starting the server: {e}"))?;
    let cfg = ClientConfig::default().transport(args.transport.transport()).polling(args.transport.poll);
    let client =
        RouteGuideClient::connect_with(server.local_addr(), &cfg).map_err(|s| format!("connecting: {s}"))?;
    run_blocking(&client, 1, &mut std::io::stdout()).map_err(|e| e.to_string())?;
    println!("route-guide: blocking client: all four RPC shapes checked");
    drop(client);
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
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
