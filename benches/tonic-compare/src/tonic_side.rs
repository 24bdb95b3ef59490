//! The same services on tonic over TCP loopback: the server on a one-worker tokio runtime pinned
//! to one core; the client on a current-thread runtime in the calling thread (one call in flight,
//! then 32 tasks sharing one channel, each awaiting one call at a time), and a server stream of
//! the benchmark service.

use std::pin::Pin;
use std::time::Instant;

use rpc_perf::stats::LatencyRecorder;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt as _};

use crate::{Figures, Plan, StreamFigure};

#[allow(missing_docs, dead_code, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tonic/helloworld.rs"));
}

#[allow(missing_docs, dead_code, clippy::all)]
pub mod bench_pb {
    include!(concat!(env!("OUT_DIR"), "/tonic/rpcperf.rs"));
}

use bench_pb::bench_client::BenchClient;
use bench_pb::bench_server::{Bench, BenchServer};
use bench_pb::{EchoReply, EchoRequest, StreamRequest};
use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

type BoxError = Box<dyn std::error::Error>;

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

/// The benchmark service on tonic: replies and stream messages are slices of one static payload,
/// as ours are.
pub struct TonicBench {
    payload: prost::bytes::Bytes,
}

impl Default for TonicBench {
    fn default() -> Self {
        TonicBench { payload: prost::bytes::Bytes::from_static(&[0xa5; 1 << 20]) }
    }
}

impl TonicBench {
    fn slice(&self, n: u32) -> Result<prost::bytes::Bytes, tonic::Status> {
        let n = n as usize;
        if n > self.payload.len() {
            return Err(tonic::Status::invalid_argument(format!("{n} bytes is over the 1 MiB limit")));
        }
        Ok(self.payload.slice(..n))
    }
}

type MessageStream = Pin<Box<dyn Stream<Item = Result<EchoReply, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Bench for TonicBench {
    async fn echo(
        &self,
        req: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, tonic::Status> {
        Ok(tonic::Response::new(EchoReply { payload: self.slice(req.into_inner().resp_size)? }))
    }

    type StreamStream = MessageStream;

    async fn stream(
        &self,
        req: tonic::Request<StreamRequest>,
    ) -> Result<tonic::Response<MessageStream>, tonic::Status> {
        let req = req.into_inner();
        let payload = self.slice(req.size)?;
        let messages =
            tokio_stream::iter((0..req.count).map(move |_| Ok(EchoReply { payload: payload.clone() })));
        Ok(tonic::Response::new(Box::pin(messages)))
    }

    async fn upload(
        &self,
        req: tonic::Request<tonic::Streaming<EchoRequest>>,
    ) -> Result<tonic::Response<StreamRequest>, tonic::Status> {
        let mut stream = req.into_inner();
        let (mut count, mut size) = (0u64, 0u32);
        while let Some(m) = stream.message().await? {
            count += 1;
            size = size.wrapping_add(m.payload.len() as u32);
        }
        Ok(tonic::Response::new(StreamRequest { count, size }))
    }

    type ExchangeStream = MessageStream;

    async fn exchange(
        &self,
        req: tonic::Request<tonic::Streaming<EchoRequest>>,
    ) -> Result<tonic::Response<MessageStream>, tonic::Status> {
        let payload = self.payload.clone();
        let answers = req.into_inner().map(move |m| {
            let n = m?.resp_size as usize;
            if n > payload.len() {
                return Err(tonic::Status::invalid_argument(format!("{n} bytes is over the 1 MiB limit")));
            }
            Ok(EchoReply { payload: payload.slice(..n) })
        });
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

/// Sets TCP_NODELAY on an accepted connection, as tonic's own listener does.
fn nodelay(s: std::io::Result<tokio::net::TcpStream>) -> std::io::Result<tokio::net::TcpStream> {
    let s = s?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Runs every case of `plan` against one tonic server (Greeter and Bench) pinned to
/// `server_core`.
///
/// # Errors
/// Runtime, bind, connect or call failures, or a wrong answer.
pub fn measure(plan: &Plan, server_core: Option<core_affinity::CoreId>) -> Result<Figures, BoxError> {
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
            .add_service(BenchServer::new(TonicBench::default()))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener).map(nodelay), async {
                let _ = stop_rx.await;
            }),
    );

    let crt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let figures = crt.block_on(async {
        let mut client = GreeterClient::connect(format!("http://{addr}")).await?;
        let want = format!("Hello {}", plan.name);
        let req = HelloRequest { name: plan.name.clone() };
        for _ in 0..plan.warmup {
            let r = client.say_hello(req.clone()).await?;
            if r.get_ref().message != want {
                return Err(format!("tonic answered {:?}, expected {want:?}", r.get_ref().message).into());
            }
        }
        let mut latency = LatencyRecorder::new();
        let mut prev = Instant::now();
        for _ in 0..plan.iters {
            client.say_hello(req.clone()).await?;
            let now = Instant::now();
            latency.record(now.duration_since(prev).as_nanos() as u64);
            prev = now;
        }
        tasks(plan, &client, &want, plan.warmup).await?;
        let tasks_rps = tasks(plan, &client, &want, plan.iters).await?;

        let mut bench = BenchClient::connect(format!("http://{addr}")).await?;
        let mut streams = Vec::new();
        for &(size, count) in &plan.streams {
            take(&mut bench, size, plan.warmup.min(count)).await?;
            let t = Instant::now();
            take(&mut bench, size, count).await?;
            streams.push(StreamFigure { size, count, secs: t.elapsed().as_secs_f64() });
        }
        Ok::<_, BoxError>(Figures { latency, client_rps: None, tasks_rps, streams })
    })?;
    // Close the client's connections (their tasks live on `crt`) before the graceful shutdown,
    // which waits for open connections.
    drop(crt);
    let _ = stop_tx.send(());
    srt.block_on(server)??;
    Ok(figures)
}

/// `plan.in_flight` tasks share one tonic channel (cloned clients), each awaiting one call at a
/// time, until `calls` calls are done. Calls per second.
async fn tasks(
    plan: &Plan,
    client: &GreeterClient<tonic::transport::Channel>,
    want: &str,
    calls: u64,
) -> Result<f64, BoxError> {
    let budget = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(calls));
    let t = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..plan.in_flight {
        let (mut client, budget, want) = (client.clone(), budget.clone(), want.to_string());
        let req = HelloRequest { name: plan.name.clone() };
        handles.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering::Relaxed;
            while budget.fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1)).is_ok() {
                let r = client.say_hello(req.clone()).await.map_err(|s| s.to_string())?;
                if r.get_ref().message != want {
                    return Err(format!("tonic answered {:?}, expected {want:?}", r.get_ref().message));
                }
            }
            Ok(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    Ok(calls as f64 / t.elapsed().as_secs_f64())
}

/// Takes one stream of `count` messages of `size` bytes, each checked.
async fn take(
    bench: &mut BenchClient<tonic::transport::Channel>,
    size: usize,
    count: u64,
) -> Result<(), BoxError> {
    let mut s = bench.stream(StreamRequest { count, size: size as u32 }).await?.into_inner();
    let mut n = 0u64;
    while let Some(m) = s.message().await? {
        if m.payload.len() != size {
            return Err(
                format!("tonic stream message {n}: {} bytes, expected {size}", m.payload.len()).into()
            );
        }
        n += 1;
    }
    if n != count {
        return Err(format!("the tonic stream ended after {n} of {count} messages").into());
    }
    Ok(())
}
