//! The same services on our runtime over the software NIC: the server's worker pinned to one
//! core; the per-thread client in the calling thread (one call in flight, then 32 async calls in
//! flight), the shareable `Channel` from 32 tokio tasks of a current-thread runtime in the calling
//! thread, and a server stream of the benchmark service (a producer thread per stream).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use rpc_core::codegen::{Reply, RequestContext};
use rpc_core::{Channel, ChannelConfig, ClientConfig, PollingPolicy, Server, Transport};
use rpc_perf::rpc::pb::bench_client::BenchClient;
use rpc_perf::rpc::pb::bench_server::BenchServer;
use rpc_perf::rpc::pb::StreamRequest;
use rpc_perf::rpc::BenchService;
use rpc_perf::stats::LatencyRecorder;

use crate::{Figures, Plan, StreamFigure};

#[allow(missing_docs, dead_code)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/ours/helloworld.rs"));
}

use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

type BoxError = Box<dyn std::error::Error>;

/// Our Greeter: answers "Hello NAME", as the tonic one.
pub struct OurGreeter;

impl Greeter for OurGreeter {
    fn say_hello(&self, _ctx: &RequestContext, request: HelloRequest) -> Reply<HelloReply> {
        HelloReply { message: format!("Hello {}", request.name) }.into()
    }
}

/// Runs every case of `plan` against one server (Greeter and Bench), its worker on
/// `server_core`.
///
/// # Errors
/// Server start, connect or call failures, or a wrong answer.
pub fn measure(
    plan: &Plan,
    server_core: Option<core_affinity::CoreId>,
    polling: PollingPolicy,
) -> Result<Figures, BoxError> {
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(polling)
        .worker_cores(server_core.map(|c| c.id).into_iter().collect())
        .credits_per_session(64)
        .srq_depth(4096)
        .ring_bytes(plan.ring_bytes())
        .max_peer_ring_bytes(plan.ring_bytes())
        .add_service(GreeterServer::new(OurGreeter))
        .add_service(BenchServer::new(BenchService::default()))
        .spawn("127.0.0.1:0")?;
    let addr = server.local_addr();
    let cfg = ClientConfig::default()
        .transport(Transport::Sim)
        .polling(polling)
        .window(plan.in_flight as u16)
        .ring_bytes(plan.ring_bytes());
    let client = GreeterClient::connect_with(addr, &cfg)?;
    let want = format!("Hello {}", plan.name);
    let req = HelloRequest { name: plan.name.clone() };
    let check = |r: HelloReply| -> Result<(), BoxError> {
        if r.message == want {
            Ok(())
        } else {
            Err(format!("answered {:?}, expected {want:?}", r.message).into())
        }
    };
    for _ in 0..plan.warmup {
        check(client.say_hello(&req)?)?;
    }
    let mut latency = LatencyRecorder::new();
    let mut prev = Instant::now();
    for _ in 0..plan.iters {
        check(client.say_hello(&req)?)?;
        let now = Instant::now();
        latency.record(now.duration_since(prev).as_nanos() as u64);
        prev = now;
    }

    // 32 async calls in flight from this thread, the oldest polled (answers come in order).
    let mut cx = Context::from_waker(Waker::noop());
    let mut q = VecDeque::with_capacity(plan.in_flight);
    let (mut sent, mut done) = (0u64, 0u64);
    let total = plan.warmup + plan.iters;
    let mut t0 = Instant::now();
    while done < total {
        while q.len() < plan.in_flight && sent < total {
            q.push_back(client.say_hello_async(&req));
            sent += 1;
        }
        if let Some(f) = q.front_mut() {
            if let Poll::Ready(r) = Pin::new(f).poll(&mut cx) {
                check(r?)?;
                q.pop_front();
                done += 1;
                if done == plan.warmup {
                    t0 = Instant::now();
                }
            }
        }
    }
    let client_rps = plan.iters as f64 / t0.elapsed().as_secs_f64();
    drop(q);
    drop(client);

    let channel_rps = channel_tasks(plan, addr, &cfg, &want)?;

    let bench = BenchClient::connect_with(addr, &cfg)?;
    let mut streams = Vec::new();
    for &(size, count) in &plan.streams {
        // Warm-up stream, then the measured one.
        take(&bench, size, plan.warmup.min(count))?;
        let t = Instant::now();
        take(&bench, size, count)?;
        streams.push(StreamFigure { size, count, secs: t.elapsed().as_secs_f64() });
    }
    drop(bench);
    server.shutdown();
    Ok(Figures { latency, client_rps: Some(client_rps), tasks_rps: channel_rps, streams })
}

/// `plan.in_flight` tokio tasks of a current-thread runtime in this thread share one `Channel`,
/// each awaiting one call at a time until the shared budget is used. Calls per second.
fn channel_tasks(
    plan: &Plan,
    addr: std::net::SocketAddr,
    cfg: &ClientConfig,
    want: &str,
) -> Result<f64, BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let ccfg = ChannelConfig::default().client(cfg.clone());
    let channel = rt.block_on(Channel::connect_with(addr, &ccfg))?;
    let stub = GreeterClient::from_channel(channel);
    let run = |calls: u64| -> Result<f64, BoxError> {
        let budget = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(calls));
        let t = Instant::now();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..plan.in_flight {
                let (stub, budget, want) = (stub.clone(), budget.clone(), want.to_string());
                let req = HelloRequest { name: plan.name.clone() };
                tasks.push(tokio::spawn(async move {
                    use std::sync::atomic::Ordering::Relaxed;
                    while budget.fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1)).is_ok() {
                        let r = stub.say_hello(req.clone()).await.map_err(|s| s.to_string())?;
                        if r.message != want {
                            return Err(format!("answered {:?}, expected {want:?}", r.message));
                        }
                    }
                    Ok(())
                }));
            }
            for t in tasks {
                t.await.map_err(|e| e.to_string())??;
            }
            Ok::<_, String>(())
        })?;
        Ok(calls as f64 / t.elapsed().as_secs_f64())
    };
    run(plan.warmup)?;
    let rps = run(plan.iters)?;
    drop(stub);
    drop(rt);
    Ok(rps)
}

/// Takes one stream of `count` messages of `size` bytes, each checked.
fn take(bench: &BenchClient, size: usize, count: u64) -> Result<(), BoxError> {
    let mut n = 0u64;
    for m in bench.stream(&StreamRequest { count, size: size as u32 })? {
        let m = m?;
        if m.payload.len() != size {
            return Err(format!("stream message {n}: {} bytes, expected {size}", m.payload.len()).into());
        }
        n += 1;
    }
    if n != count {
        return Err(format!("the stream ended after {n} of {count} messages").into());
    }
    Ok(())
}
