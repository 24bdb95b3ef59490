//! rpc_lat and rpc_bw: unary calls of the benchmark service (proto/bench.proto) through the
//! runtime, on the same provider as the raw tests. The rpc-perf server runs an RPC server for it;
//! the client learns its port over the out-of-band channel and calls it.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use rpc_core::codegen::{Reply, RequestContext, RequestStream, Responder, Status, StreamSink};
use rpc_core::{ClientConfig, PollingPolicy, Server, ServerHandle, Transport};

use crate::cli::{Args, HandlerKind, Limit, PollKind, TestKind, ENVELOPE, MAX_SIZE};
use crate::error::PerfError;
use crate::oob::{Msg, OobChannel, OOB_VERSION};
use crate::progress::Progress;
use crate::results::{Measure, TestResult};
use crate::rpc_async::AsyncBenchService;
use crate::sink::Sink;
use crate::stats::{BandwidthSummary, LatencyRecorder, PeakWindow};
use crate::transport::Resolved;

/// The generated messages and stubs of `package rpcperf`.
#[allow(missing_docs)]
pub mod pb {
    rpc_core::include_proto!("rpcperf");
}

use pb::bench_client::BenchClient;
use pb::bench_server::{Bench, BenchServer};
use pb::{EchoReply, EchoRequest, StreamRequest};

/// Most completions between two samples of the peak-rate window in rpc_bw (fewer for large
/// messages: one sample per MiB moved, at least one per call).
pub(crate) const PEAK_BATCH_MAX: u64 = 256;

/// The benchmark service: answers `resp_size` bytes, sliced from one preallocated buffer (no
/// allocation or copy per call on the server beyond the runtime's own).
pub struct BenchService {
    payload: Bytes,
    /// `--registered`: answers are slices of a registered buffer of the worker's pool.
    registered: bool,
}

impl BenchService {
    /// The service of `--registered` (`registered`) or ordinary answers.
    pub fn new(registered: bool) -> BenchService {
        BenchService { registered, ..BenchService::default() }
    }

    /// The service answering at most `max` bytes, from a payload of its own (the server
    /// processes of `--servers`: not the 64 MiB static payload each).
    pub fn sized(max: usize) -> BenchService {
        BenchService { payload: Bytes::from(vec![0xa5u8; max]), registered: false }
    }

    /// `n` bytes of a registered buffer of the handler's worker: allocated at the worker's first
    /// answer of more bytes than the one it keeps (one per worker thread, the next power of
    /// two); the static payload when the allocation fails (said on stderr).
    fn registered_payload(&self, ctx: &RequestContext, n: usize) -> Bytes {
        thread_local! {
            static REGISTERED: std::cell::RefCell<Option<Bytes>> = const { std::cell::RefCell::new(None) };
        }
        REGISTERED.with(|r| {
            let mut r = r.borrow_mut();
            if r.as_ref().is_none_or(|b| b.len() < n) {
                *r = Some(match ctx.alloc_registered(n.next_power_of_two()) {
                    Ok(mut b) => {
                        b.fill(0xa5);
                        b.freeze()
                    }
                    Err(e) => {
                        eprintln!("rpc-perf: --registered: {e}; answering from ordinary memory");
                        self.payload.clone()
                    }
                });
            }
            r.as_ref().map_or_else(|| self.payload.slice(..n), |b| b.slice(..n))
        })
    }
}

/// The reply payload: [`MAX_SIZE`] bytes allocated once per process and never freed, so that a
/// reply is a slice of a static `Bytes` (no reference count touched per call, unlike a slice of
/// a shared `Bytes`, which costs two atomic operations per call).
pub(crate) fn static_payload() -> &'static [u8] {
    static PAYLOAD: OnceLock<&'static [u8]> = OnceLock::new();
    PAYLOAD.get_or_init(|| Box::leak(vec![0xa5u8; MAX_SIZE].into_boxed_slice()))
}

impl Default for BenchService {
    fn default() -> Self {
        BenchService { payload: Bytes::from_static(static_payload()), registered: false }
    }
}

impl Bench for BenchService {
    fn echo(&self, ctx: &RequestContext, req: EchoRequest) -> Reply<EchoReply> {
        let n = req.resp_size as usize;
        if n > self.payload.len() {
            return Status::invalid_argument(format!("resp_size {n} is over the {MAX_SIZE}-byte limit"))
                .into();
        }
        if self.registered {
            return EchoReply { payload: self.registered_payload(ctx, n) }.into();
        }
        EchoReply { payload: self.payload.slice(..n) }.into()
    }

    /// `count` messages of `size` bytes from a producer thread (a send inline in the handler
    /// could not wait for credits), each a slice of the static payload; then a clean end.
    fn stream(&self, _ctx: &RequestContext, req: StreamRequest, sink: StreamSink<EchoReply>) {
        let n = req.size as usize;
        if n > self.payload.len() {
            sink.finish(Err(Status::invalid_argument(format!("size {n} is over the {MAX_SIZE}-byte limit"))));
            return;
        }
        let payload = self.payload.slice(..n);
        let spawned = std::thread::Builder::new().name("bench-stream".into()).spawn(move || {
            for _ in 0..req.count {
                if sink.send(&EchoReply { payload: payload.clone() }).is_err() {
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            // The sink moved into the closure that was not run: it ends the stream when dropped
            // with it, so the client sees a clean end with fewer messages and says so.
            eprintln!("rpc-perf: Bench.Stream: spawning the producer thread: {e}");
        }
    }

    /// Reads the client's messages on a thread of its own (an inline handler cannot wait for
    /// them) and answers their count and payload bytes.
    fn upload(
        &self,
        _ctx: &RequestContext,
        requests: RequestStream<EchoRequest>,
        responder: Responder<StreamRequest>,
    ) {
        let spawned = std::thread::Builder::new().name("bench-upload".into()).spawn(move || {
            let (mut count, mut bytes) = (0u64, 0u32);
            for m in requests {
                match m {
                    Ok(m) => {
                        count += 1;
                        bytes = bytes.wrapping_add(m.payload.len() as u32);
                    }
                    Err(s) => return responder.send(Err(s)),
                }
            }
            responder.send(Ok(StreamRequest { count, size: bytes }));
        });
        if let Err(e) = spawned {
            eprintln!("rpc-perf: Bench.Upload: spawning the reader thread: {e}");
        }
    }

    /// Answers each of the client's messages with one of `resp_size` payload bytes (a slice of
    /// the static payload), from a thread of its own.
    fn exchange(
        &self,
        _ctx: &RequestContext,
        requests: RequestStream<EchoRequest>,
        sink: StreamSink<EchoReply>,
    ) {
        let payload = self.payload.clone();
        let spawned = std::thread::Builder::new().name("bench-exchange".into()).spawn(move || {
            for m in requests {
                let Ok(m) = m else { return };
                let n = (m.resp_size as usize).min(payload.len());
                if sink.send(&EchoReply { payload: payload.slice(..n) }).is_err() {
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            eprintln!("rpc-perf: Bench.Exchange: spawning the echo thread: {e}");
        }
    }
}

/// The runtime's transport for the resolved provider and the flags.
pub fn runtime_transport(resolved: Resolved, args: &Args) -> Transport {
    match resolved {
        Resolved::Sim => Transport::Sim,
        Resolved::Rdma => Transport::Rdma {
            device: args.ib_dev.clone().unwrap_or_default(),
            port: args.ib_port,
            gid_index: args.gid_index,
        },
    }
}

/// The runtime's polling policy for `--poll`.
pub fn polling(kind: PollKind) -> PollingPolicy {
    match kind {
        PollKind::Busy => PollingPolicy::Busy,
        PollKind::Yield => PollingPolicy::SpinThenYield { spins: crate::poll::SPINS_BEFORE_YIELD },
    }
}

/// Receive-ring bytes for messages up to `max_size`: room for four in flight, 1 MiB .. 64 MiB
/// (larger messages go through the ring in pieces, as with the runtime's default 1 MiB ring).
pub fn ring_bytes_for(max_size: usize) -> u32 {
    (4 * (max_size as u64 + (64 << 10))).next_power_of_two().clamp(1 << 20, 64 << 20) as u32
}

/// The `max_message_size` of rpc-perf's own client and server: [`MAX_SIZE`] payload bytes and
/// their protobuf framing.
pub const MESSAGE_LIMIT: u32 = (MAX_SIZE + ENVELOPE) as u32;

/// The RPC server side of a session: one RPC server, restarted when a test needs bigger rings
/// or more credits than the running one has.
pub struct ServerState {
    resolved: Resolved,
    worker_core: Option<usize>,
    bind: String,
    running: Option<(ServerHandle, u32, u16)>,
}

impl ServerState {
    /// State for a session on `resolved`, the RPC server's worker pinned to `worker_core`,
    /// listening on `bind` (`host:port`).
    pub fn new(resolved: Resolved, worker_core: Option<usize>, bind: String) -> Self {
        ServerState { resolved, worker_core, bind, running: None }
    }

    /// Makes sure the server runs with rings for `max_size`-byte messages and `concurrency`
    /// credits (restarting it with bigger ones if needed); returns its TCP port.
    ///
    /// # Errors
    /// [`PerfError::Setup`] for limits out of range or a server that cannot start.
    pub fn ensure(
        &mut self,
        args: &Args,
        what: &str,
        max_size: usize,
        concurrency: u32,
    ) -> Result<u16, PerfError> {
        if !(1..=MAX_SIZE).contains(&max_size) || !(1..=4096).contains(&concurrency) {
            return Err(PerfError::Setup(format!(
                "{what}: client asked for {max_size}-byte messages and {concurrency} calls in flight; limits are 1..={MAX_SIZE} (64M) and 1..=4096"
            )));
        }
        let ring = args.ring_bytes.map_or_else(|| ring_bytes_for(max_size), |r| r as u32);
        let credits = concurrency.max(32) as u16;
        let fits = matches!(&self.running, Some((_, r, c)) if *r >= ring && *c >= credits);
        if !fits {
            if let Some((h, _, _)) = self.running.take() {
                h.shutdown();
            }
            let builder = Server::builder()
                .transport(runtime_transport(self.resolved, args))
                .polling(polling(args.poll))
                .worker_cores(self.worker_core.into_iter().collect())
                .ring_bytes(ring)
                // rpc-perf's client asks for the same ring: mirror it (the default cap is 4 MiB).
                .max_peer_ring_bytes(ring)
                .max_message_size(MESSAGE_LIMIT)
                .credits_per_session(credits)
                // `-r`: the SRQ's receive WQEs; by default room for this session at full credits
                // (the runtime registers and posts only what its sessions reserve).
                .srq_depth(
                    args.rx_depth.unwrap_or(rpc_core::ServerConfig::srq_per_session(credits).max(4096)),
                )
                .observe(observe(args));
            let builder = if args.same_host_shm {
                // The session goes to the same-host workers on the worker's core, and the idle
                // RDMA worker there yields it after a few empty polls (both yield: one policy).
                builder
                    .same_host_shm(Some(self.worker_core.into_iter().collect()))
                    .polling(polling(crate::cli::PollKind::Yield))
            } else {
                builder
            };
            let builder = if args.interceptors {
                builder.interceptor(|info| match info.metadata().get(AUTH_KEY) {
                    Some(AUTH_VALUE) => Ok(()),
                    _ => Err(rpc_core::Status::unauthenticated("rpc-perf --interceptors: no x-perf-auth")),
                })
            } else {
                builder
            };
            let builder = match args.handlers {
                HandlerKind::Inline => {
                    builder.add_service(BenchServer::new(BenchService::new(args.registered)))
                }
                HandlerKind::Async => builder.add_service(AsyncBenchService::default().server(false)),
                HandlerKind::Tokio => builder.add_service(AsyncBenchService::default().server(true)),
            };
            // `rpc-perf call HOST:PORT rpcperf.Bench/Echo` needs no --proto (nothing per call).
            let handle = builder.add_reflection().spawn(self.bind.as_str()).map_err(|e| {
                let in_use = matches!(&e, rpc_core::ServerError::Listen { source, .. }
                        if source.kind() == std::io::ErrorKind::AddrInUse);
                let hint = if in_use { crate::run::PORT_IN_USE } else { "" };
                PerfError::Setup(format!("starting the RPC server on {}: {e}{hint}", self.bind))
            })?;
            self.running = Some((handle, ring, credits));
        }
        Ok(self.running.as_ref().map_or(0, |(h, _, _)| h.local_addr().port()))
    }

    /// Serves an RPC test after the client's `Setup`: makes sure the server runs with rings for
    /// `max_size` and `concurrency` credits, tells the client its port, and waits for `Done`.
    ///
    /// # Errors
    /// [`PerfError::Setup`] when the server cannot start; channel errors.
    pub fn serve(
        &mut self,
        args: &Args,
        test: TestKind,
        max_size: usize,
        concurrency: u32,
        ch: &mut OobChannel,
    ) -> Result<(), PerfError> {
        let port = self.ensure(args, test.name(), max_size, concurrency)?;
        ch.send(&Msg::RpcServer { port })?;
        ch.expect(&Msg::Done, "while the client runs the RPC test")?;
        Ok(())
    }
}

impl Drop for ServerState {
    fn drop(&mut self) {
        if let Some((h, _, _)) = self.running.take() {
            h.shutdown();
        }
    }
}

pub(crate) fn rpc_err(what: &str, s: Status) -> PerfError {
    PerfError::Rpc(format!("{what}: {s}"))
}

/// What the client side of every RPC test (rpc_*, chan_*, stream_bw) does first: the sizes to
/// run, the `Setup` exchange that makes the server side start an RPC server fit for them, and
/// that server's address.
pub(crate) struct Started {
    /// Sizes to run (`-a` or `-s`).
    pub sizes: Vec<usize>,
    /// The RPC server.
    pub addr: SocketAddr,
    /// The provider the test runs on.
    pub resolved: Resolved,
}

/// Sends the test's `Setup` (largest request or response over `args`' sizes, `concurrency`
/// credits) and learns the RPC server's port.
///
/// # Errors
/// Channel errors; a peer without an address.
pub(crate) fn start(
    args: &Args,
    resolved: Resolved,
    test: TestKind,
    concurrency: u32,
    ch: &mut OobChannel,
) -> Result<Started, PerfError> {
    let sizes = args.sizes();
    let max_size = sizes.iter().map(|&s| args.rpc_sizes(s)).map(|(a, b)| a.max(b)).max().unwrap_or(args.size);
    ch.send(&Msg::Setup { version: OOB_VERSION, test, max_size, concurrency })?;
    let Msg::RpcServer { port } = ch.expect(&Msg::RpcServer { port: 0 }, "after an RPC setup")? else {
        unreachable!("expect checks the variant")
    };
    let peer =
        ch.peer_addr().ok_or_else(|| PerfError::Setup("the out-of-band peer has no address".into()))?;
    Ok(Started { sizes, addr: SocketAddr::new(peer.ip(), port), resolved })
}

/// The client configuration of an RPC test: transport, `poll`, `window` calls in flight, rings
/// for the largest size of the run.
pub(crate) fn client_config(
    args: &Args,
    resolved: Resolved,
    poll: PollingPolicy,
    window: u16,
) -> ClientConfig {
    let max_size =
        args.sizes().iter().map(|&s| args.rpc_sizes(s)).map(|(a, b)| a.max(b)).max().unwrap_or(args.size);
    let cfg = ClientConfig::default()
        .transport(runtime_transport(resolved, args))
        .polling(poll)
        .window(window)
        .ring_bytes(args.ring_bytes.map_or_else(|| ring_bytes_for(max_size), |r| r as u32))
        .max_message_size(MESSAGE_LIMIT)
        .same_host_shm(args.same_host_shm)
        .observe(observe(args));
    if args.interceptors {
        cfg.interceptor(|md| {
            md.insert(AUTH_KEY, AUTH_VALUE).map_err(|e| rpc_core::Status::internal(e.to_string()))
        })
    } else {
        cfg
    }
}

/// The metadata entry `--interceptors` adds and checks.
const AUTH_KEY: &str = "x-perf-auth";
const AUTH_VALUE: &str = "Bearer rpc-perf";

/// `Bench.Echo`'s method id (for calls with options through the stub's client).
pub(crate) const ECHO_ID: rpc_core::codegen::MethodId = rpc_core::codegen::method_id("/rpcperf.Bench/Echo");

/// What `--metrics` turns on (installing the recorder once per process).
pub(crate) fn observe(args: &Args) -> rpc_core::Observe {
    if !args.metrics {
        return rpc_core::Observe::OFF;
    }
    static RECORDER: std::sync::Once = std::sync::Once::new();
    RECORDER.call_once(|| {
        match metrics_exporter_prometheus::PrometheusBuilder::new()
            .set_buckets(rpc_core::observe::DURATION_BUCKETS)
            .and_then(|b| b.install_recorder())
        {
            // The recorder keeps histogram samples until upkeep drains them (as a scrape would).
            Ok(handle) => {
                let _ = std::thread::Builder::new().name("rpc-perf-metrics".into()).spawn(move || loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    handle.run_upkeep();
                });
            }
            Err(e) => eprintln!("rpc-perf: --metrics: installing the Prometheus recorder: {e}"),
        }
    });
    rpc_core::Observe::default().metrics(true)
}

/// The options of every call of an RPC test: `--metadata N` entries (none by default).
pub(crate) fn call_options(args: &Args) -> rpc_core::CallOptions {
    if args.metadata == 0 {
        return rpc_core::CallOptions::default();
    }
    let mut md = rpc_core::Metadata::new();
    for i in 0..args.metadata {
        // Keys and values of this shape are always valid.
        let _ = md.insert(&format!("x-perf-{i}"), &format!("value-{i}"));
    }
    rpc_core::CallOptions::default().with_metadata(md)
}

/// The banner lines of an RPC test: transport, server, concurrency, then `extra` (the test's
/// own), poll, eager threshold and ring, the request and response sizes when one size is run
/// and `sizes` is set, and `what` (how the figures are taken).
pub(crate) fn banner_info(
    args: &Args,
    started: &Started,
    cfg: &ClientConfig,
    concurrency: String,
    extra: Vec<(&'static str, String)>,
    sizes: bool,
    what: (&'static str, &'static str),
) -> Vec<(&'static str, String)> {
    let transport = match started.resolved {
        Resolved::Sim => "sim",
        Resolved::Rdma => "rdma (ibverbs)",
    };
    let mut info = vec![
        ("Transport", transport.to_string()),
        ("Server", started.addr.to_string()),
        ("Concurrency", concurrency),
    ];
    info.extend(extra);
    info.push(("Poll", format!("{:?}", args.poll).to_lowercase()));
    info.push(("Eager threshold", format!("{}[B]", cfg.eager_threshold)));
    info.push(("Ring", format!("{}[B]", cfg.ring_bytes)));
    if sizes && !args.all {
        let (q, r) = args.rpc_sizes(args.size);
        info.push(("Request size", format!("{q}[B]")));
        info.push(("Response size", format!("{r}[B]")));
    }
    info.push((what.0, what.1.to_string()));
    info
}

/// Runs `measure` at each size of the run (request and response payload sizes, the limit for
/// that size, the progress bar) and hands each result to `sink`; `concurrency` is recorded with
/// it.
///
/// # Errors
/// The first error of `measure`.
pub(crate) fn each_size<F>(
    args: &Args,
    test: TestKind,
    started: &Started,
    concurrency: u32,
    sink: &mut Sink,
    mut measure: F,
) -> Result<(), PerfError>
where
    F: FnMut(usize, usize, Limit, &Progress) -> Result<Measure, PerfError>,
{
    for (slot, &size) in started.sizes.iter().enumerate() {
        sink.progress().start_size(slot, size);
        let (req_size, resp_size) = args.rpc_sizes(size);
        let limit = args.limit_for(req_size + resp_size);
        let measure = measure(req_size, resp_size, limit, sink.progress())?;
        sink.progress().fraction(1.0);
        sink.result(TestResult {
            test,
            bytes: req_size,
            req_bytes: req_size,
            resp_bytes: resp_size,
            concurrency,
            measure,
        });
    }
    Ok(())
}

/// Ends an RPC test once its client is closed: tells the server side, closes the table.
///
/// # Errors
/// Channel errors.
pub(crate) fn finish(ch: &mut OobChannel, sink: &mut Sink) -> Result<(), PerfError> {
    ch.send(&Msg::Done)?;
    sink.end_test();
    Ok(())
}

/// The benchmark request for `req_size` bytes out and `resp_size` back.
pub(crate) fn echo_request(req_size: usize, resp_size: usize) -> EchoRequest {
    EchoRequest { payload: Bytes::from(vec![0x5au8; req_size]), resp_size: resp_size as u32 }
}

/// [`echo_request`] with its payload in a registered buffer of `client`'s pool (`--registered`).
///
/// # Errors
/// The pool's refusal (over `ClientConfig::registered_buffer_bytes`).
fn registered_request(
    client: &rpc_core::Client,
    req_size: usize,
    resp_size: usize,
) -> Result<EchoRequest, PerfError> {
    let mut b = client.alloc_registered(req_size).map_err(|s| rpc_err("--registered", s))?;
    b.fill(0x5a);
    Ok(EchoRequest { payload: b.freeze(), resp_size: resp_size as u32 })
}

/// Client side of an RPC test over all sizes.
///
/// # Errors
/// Setup, connect, call and channel errors.
pub fn run_client(
    args: &Args,
    resolved: Resolved,
    test: TestKind,
    ch: &mut OobChannel,
    sink: &mut Sink,
) -> Result<(), PerfError> {
    if args.servers.is_some() {
        return crate::multi::run_client(args, resolved, test, sink);
    }
    let concurrency = args.concurrency_for(test);
    let started = start(args, resolved, test, concurrency, ch)?;
    let addr = started.addr;
    let cfg = client_config(args, resolved, polling(args.poll), concurrency as u16);
    let client =
        BenchClient::connect_with(addr, &cfg).map_err(|s| rpc_err(&format!("connecting to {addr}"), s))?;
    let what = if test == TestKind::RpcLat {
        ("Latency", "round trip, per call")
    } else {
        ("BW", "request + response payload")
    };
    let info = banner_info(args, &started, &cfg, concurrency.to_string(), Vec::new(), true, what);
    sink.begin_test(test, started.sizes.len(), info);
    let opts = call_options(args);
    each_size(args, test, &started, concurrency, sink, |req_size, resp_size, limit, progress| {
        let req = if args.registered {
            registered_request(client.client(), req_size, resp_size)?
        } else {
            echo_request(req_size, resp_size)
        };
        let warmup = args.warmup_for(req_size + resp_size);
        Ok(if test == TestKind::RpcLat {
            let rec = if concurrency == 1 {
                blocking_latency(&client, &req, &opts, limit, warmup, progress)?
            } else {
                let mut rec = LatencyRecorder::new();
                windowed(&client, &req, &opts, concurrency, limit, warmup, progress, Some(&mut rec))?;
                rec
            };
            crate::raw::latency_measure(&rec)
        } else {
            Measure::Bandwidth(windowed(&client, &req, &opts, concurrency, limit, warmup, progress, None)?)
        })
    })?;
    let c = client.client().counters();
    drop(client);
    finish(ch, sink)?;
    println!(
        " client counters: rpcs {}, credit stalls {}, ring-full stalls {}; sim RNR waits {}",
        c.rpcs,
        c.credit_stalls,
        c.ring_full_stalls,
        rpc_core::verbs::sim::stats().rnr_stalls
    );
    Ok(())
}

/// One blocking call per round trip.
pub(crate) fn blocking_latency(
    client: &BenchClient,
    req: &EchoRequest,
    opts: &rpc_core::CallOptions,
    limit: Limit,
    warmup: u64,
    progress: &Progress,
) -> Result<LatencyRecorder, PerfError> {
    let want = req.resp_size as usize;
    crate::measure::latency(limit, warmup, progress, || {
        let r = client.echo_with(req, opts).map_err(|s| rpc_err("Bench.Echo", s))?;
        check_len(r.payload.len(), want)
    })
}

#[inline]
pub(crate) fn check_len(got: usize, want: usize) -> Result<(), PerfError> {
    if got == want {
        Ok(())
    } else {
        Err(PerfError::Rpc(format!("Bench.Echo answered {got} bytes, expected {want}")))
    }
}

/// Keeps `window` async calls in flight until `limit` (after `warmup` calls), polling the oldest
/// (answers arrive in order). With `per_call`, records each call's round trip (two clock reads
/// per call); the throughput figures are returned either way.
#[allow(clippy::too_many_arguments)]
fn windowed(
    client: &BenchClient,
    req: &EchoRequest,
    opts: &rpc_core::CallOptions,
    window: u32,
    limit: Limit,
    warmup: u64,
    progress: &Progress,
    mut per_call: Option<&mut LatencyRecorder>,
) -> Result<BandwidthSummary, PerfError> {
    let want = req.resp_size as usize;
    let window = window as usize;
    let mut cx = Context::from_waker(Waker::noop());
    let mut q = VecDeque::with_capacity(window);
    let timed = per_call.is_some();
    let bytes_per_call = (req.payload.len() + want) as u64;

    // Warm-up: the same pipeline, unmeasured.
    let (mut sent, mut done) = (0u64, 0u64);
    while done < warmup {
        while q.len() < window && sent < warmup {
            q.push_back((
                client.client().unary_async::<EchoRequest, EchoReply>(ECHO_ID, req, opts),
                None::<crate::clock::Stamp>,
            ));
            sent += 1;
        }
        if let Some((f, _)) = q.front_mut() {
            if let Poll::Ready(r) = Pin::new(f).poll(&mut cx) {
                check_len(r.map_err(|s| rpc_err("Bench.Echo", s))?.payload.len(), want)?;
                q.pop_front();
                done += 1;
            }
        }
    }

    let peak_batch = ((1u64 << 20) / bytes_per_call.max(1)).clamp(1, PEAK_BATCH_MAX);
    let mut peak = PeakWindow::new(PeakWindow::DEFAULT_MIN_NS);
    let start = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    let mut issuing = true;
    loop {
        while issuing && q.len() < window {
            let t = if timed { Some(crate::clock::now()) } else { None };
            q.push_back((client.client().unary_async::<EchoRequest, EchoReply>(ECHO_ID, req, opts), t));
            sent += 1;
            if let Limit::Iters(n) = limit {
                issuing = sent < n;
            }
        }
        let Some((f, t0)) = q.front_mut() else { break };
        if let Poll::Ready(r) = Pin::new(f).poll(&mut cx) {
            if let (Some(rec), Some(t0)) = (per_call.as_deref_mut(), *t0) {
                rec.record(crate::clock::now().nanos_since(t0));
            }
            check_len(r.map_err(|s| rpc_err("Bench.Echo", s))?.payload.len(), want)?;
            q.pop_front();
            done += 1;
            if done % peak_batch == 0 {
                let e = start.elapsed();
                peak.completed(e.as_nanos() as u64, done * bytes_per_call);
                progress.fraction(crate::measure::fraction(limit, done, e));
                if let Limit::Duration(d) = limit {
                    issuing = issuing && e < d;
                }
            }
        }
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    progress.fraction(1.0);
    let (pb, pns) = peak.best();
    Ok(BandwidthSummary::new(done, bytes_per_call, elapsed, pb, pns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes() {
        assert_eq!(ring_bytes_for(32), 1 << 20);
        assert_eq!(ring_bytes_for(1 << 20), 8 << 20);
        assert_eq!(ring_bytes_for(8 << 20), 64 << 20);
        assert_eq!(ring_bytes_for(64 << 20), 64 << 20);
    }

    #[test]
    fn the_size_limit_is_the_runtimes_default_message_limit() {
        assert_eq!(MAX_SIZE, rpc_core::ClientConfig::default().max_message_size as usize);
        assert_eq!(MAX_SIZE, rpc_core::ServerConfig::default().max_message_size as usize);
        let framed = echo_request(MAX_SIZE, MAX_SIZE);
        assert!(prost::Message::encoded_len(&framed) <= MESSAGE_LIMIT as usize);
        let reply = EchoReply { payload: Bytes::from_static(static_payload()) };
        assert!(prost::Message::encoded_len(&reply) <= MESSAGE_LIMIT as usize);
    }
}
