//! The helloworld Greeter on tonic over TCP loopback: server on a one-worker tokio runtime pinned
//! to one core, client on a current-thread runtime in the calling thread, one call in flight.

use std::time::Instant;

use rpc_perf::stats::LatencyRecorder;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt as _;

#[allow(missing_docs, dead_code, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tonic/helloworld.rs"));
}

use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// The tonic Greeter: answers "Hello NAME".
#[derive(Default)]
pub struct TonicGreeter;

#[tonic::async_trait]
impl Greeter for TonicGreeter {
    async fn say_hello(
        &self,
        req: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, tonic::Status> {
        Ok(tonic::Response::new(HelloReply { message: format!("Hello {}", req.into_inner().name) }))
    }
}

/// Sets TCP_NODELAY on an accepted connection, as tonic's own listener does.
fn nodelay(s: std::io::Result<tokio::net::TcpStream>) -> std::io::Result<tokio::net::TcpStream> {
    let s = s?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Measures `iters` SayHello round trips (after `warmup`), the server pinned to `server_core`.
///
/// # Errors
/// Runtime, bind, connect or call failures.
pub fn measure(
    name: &str,
    warmup: u64,
    iters: u64,
    server_core: Option<core_affinity::CoreId>,
) -> Result<LatencyRecorder, Box<dyn std::error::Error>> {
    let srt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .on_thread_start(move || {
            if let Some(c) = server_core {
                core_affinity::set_for_current(c);
            }
        })
        .build()?;
    let listener = srt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = srt.spawn(
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(TonicGreeter))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener).map(nodelay), async {
                let _ = stop_rx.await;
            }),
    );

    let crt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let rec = crt.block_on(async {
        let mut client = GreeterClient::connect(format!("http://{addr}")).await?;
        let want = format!("Hello {name}");
        for _ in 0..warmup {
            let r = client.say_hello(HelloRequest { name: name.to_string() }).await?;
            if r.get_ref().message != want {
                return Err(format!("tonic answered {:?}, expected {want:?}", r.get_ref().message).into());
            }
        }
        let mut rec = LatencyRecorder::new();
        let mut prev = Instant::now();
        for _ in 0..iters {
            client.say_hello(HelloRequest { name: name.to_string() }).await?;
            let now = Instant::now();
            rec.record(now.duration_since(prev).as_nanos() as u64);
            prev = now;
        }
        Ok::<_, Box<dyn std::error::Error>>(rec)
    })?;
    // Close the client's connection (its tasks live on `crt`) before the graceful shutdown,
    // which waits for open connections.
    drop(crt);
    let _ = stop_tx.send(());
    srt.block_on(server)??;
    Ok(rec)
}
