//! The same Greeter on our runtime over the software NIC: server worker pinned to one core, the
//! blocking client in the calling thread, one call in flight.

use std::time::Instant;

use rpc_core::codegen::{Reply, RequestContext};
use rpc_core::{ClientConfig, PollingPolicy, Server, Transport};
use rpc_perf::stats::LatencyRecorder;

#[allow(missing_docs, dead_code)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/ours/helloworld.rs"));
}

use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// Our Greeter: answers "Hello NAME", as the tonic one.
pub struct OurGreeter;

impl Greeter for OurGreeter {
    fn say_hello(&self, _ctx: &RequestContext, request: HelloRequest) -> Reply<HelloReply> {
        HelloReply { message: format!("Hello {}", request.name) }.into()
    }
}

/// Measures `iters` SayHello round trips (after `warmup`), the server's worker on `server_core`.
///
/// # Errors
/// Server start, connect or call failures, or a wrong answer.
pub fn measure(
    name: &str,
    warmup: u64,
    iters: u64,
    server_core: Option<core_affinity::CoreId>,
    polling: PollingPolicy,
) -> Result<LatencyRecorder, Box<dyn std::error::Error>> {
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(polling)
        .worker_cores(server_core.map(|c| c.id).into_iter().collect())
        .add_service(GreeterServer::new(OurGreeter))
        .spawn("127.0.0.1:0")?;
    let cfg = ClientConfig::default().transport(Transport::Sim).polling(polling);
    let client = GreeterClient::connect_with(server.local_addr(), &cfg)?;
    let want = format!("Hello {name}");
    let req = HelloRequest { name: name.to_string() };
    for _ in 0..warmup {
        let r = client.say_hello(&req)?;
        if r.message != want {
            return Err(format!("answered {:?}, expected {want:?}", r.message).into());
        }
    }
    let mut rec = LatencyRecorder::new();
    let mut prev = Instant::now();
    for _ in 0..iters {
        client.say_hello(&req)?;
        let now = Instant::now();
        rec.record(now.duration_since(prev).as_nanos() as u64);
        prev = now;
    }
    drop(client);
    server.shutdown();
    Ok(rec)
}
