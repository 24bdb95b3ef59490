//! Quick measurement on `sim` (not a test): raw SEND/RECV ping-pong round trip, RPC round trip
//! (32-byte bodies each way, blocking calls), and RPC throughput at concurrency 32 with one client
//! and one server worker. Two pinned busy-polling threads: run it on an otherwise idle machine.
//!
//! `cargo run --release -p rpc-core --example rpc_measure [ITERS]`
//!
//! For instruction counts (callgrind), `RPC_MEASURE_COUNT=N` runs only N blocking Echo calls and
//! N blocking Fixed calls, both sides waiting on completion events (no time lost to spinning under
//! valgrind, which runs one thread at a time):
//! `RPC_MEASURE_COUNT=20000 valgrind --tool=callgrind target/release/examples/rpc_measure`
//! (under valgrind, add `RPC_SIM_SEGMENT_BYTES=1073741824`).
//!
//! `RPC_MEASURE_RAW=1` with `RPC_MEASURE_COUNT=N` runs N raw 32-byte SEND/RECV round trips
//! instead (no RPC runtime: the verbs, the send queue and receive pool of `buffers`, as the raw
//! `send_lat` rounds), both threads waiting on completion events: the floor under `unary32`.
//!
//! `RPC_MEASURE_CHAN=TASKS[xWINDOW]` with `RPC_MEASURE_COUNT=N` runs N Fixed calls through the
//! shareable handle (`Channel`) instead (`RPC_MEASURE_WINDOW=W`: from one blocking `Client`
//! keeping W `unary_async` calls in flight, its baseline): TASKS tokio tasks on a current-thread runtime, each
//! keeping WINDOW calls in flight (default 1), the dispatcher waiting on completion events
//! (`spins(0)`), the calls' polls driving for `RPC_MEASURE_POLL_SPIN` µs (default 0: one drive
//! per poll, the dispatcher thread does the waiting). `RPC_MEASURE_FIXED_ONLY=1` makes the
//! blocking mode run the N Fixed calls only (the calls the Channel mode makes),
//! `RPC_MEASURE_ECHO_ONLY=1` the N Echo calls only. `RPC_MEASURE_ASYNC=worker|tokio` serves Fixed
//! through an async handler (`spawn_async`) polled on the worker or spawned on tokio.
//! `RPC_MEASURE_METADATA=N` gives every counted call N metadata entries (`x-perf-I: value-I`),
//! `RPC_MEASURE_INTERCEPT=1` an interceptor on each end (the client's adds `x-perf-auth`, the
//! server's checks it), as `rpc-perf --metadata N --interceptors`. Per call:
//! (count with N - count with N=0) / N. `scripts/instr-count` runs the standard set.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use rpc_core::buffers::{Completions, RecvPool, SendPool, SendQueue};
use rpc_core::codegen::*;
use rpc_core::verbs::rc::{self, Endpoint, RcConfig};
use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::{
    CompletionQueue, Context, DeviceSelector, ProtectionDomain, Provider, QpCap, QpInitAttr, QueuePair,
};
use rpc_core::{Client, ClientConfig, PollingPolicy, Server};

#[derive(Clone, PartialEq, prost::Message)]
struct Blob {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
}

/// 32 bytes encoded, no heap allocation to decode.
#[derive(Clone, Copy, PartialEq, prost::Message)]
struct Fixed {
    #[prost(fixed64, tag = "1")]
    a: u64,
    #[prost(fixed64, tag = "2")]
    b: u64,
    #[prost(fixed64, tag = "3")]
    c: u64,
    #[prost(fixed32, tag = "4")]
    d: u32,
}

const ECHO: MethodId = method_id("/measure.Echo/Echo");
const FIXED: MethodId = method_id("/measure.Echo/Fixed");

/// Echo and Fixed; Fixed through an async handler on `asynchronous` when set.
#[derive(Default)]
struct EchoService {
    asynchronous: Option<AsyncRuntime>,
}

impl Service for EchoService {
    const NAME: &'static str = "measure.Echo";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: ECHO, name: "/measure.Echo/Echo" },
        MethodDesc { id: FIXED, name: "/measure.Echo/Fixed" },
    ];
    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        if method == FIXED {
            return match (decode::<Fixed>(body), &self.asynchronous) {
                (Ok(f), None) => out.reply(Reply::from(Fixed { a: f.a + 1, ..f })),
                (Ok(f), Some(rt)) => {
                    out.reply(spawn_async(rt, ctx, move |_| async move { Ok(Fixed { a: f.a + 1, ..f }) }))
                }
                (Err(s), _) => out.error(s),
            };
        }
        match decode::<Blob>(body) {
            Ok(b) => out.reply(Reply::from(b)),
            Err(s) => out.error(s),
        }
    }
}

fn pin(core: usize) {
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Side {
    qp: <Sim as Provider>::QueuePair,
    cq: <Sim as Provider>::CompletionQueue,
    recv: RecvPool<Sim>,
    pool: SendPool<Sim>,
    sq: SendQueue,
    _ctx: <Sim as Provider>::Context,
}

/// A raw side; `events`: its CQ raises completion events (`raw_count`'s waits).
fn side_with(events: bool) -> Side {
    let ctx = Sim::open(&DeviceSelector::First).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, events).unwrap();
    let recv = RecvPool::<Sim>::new(&pd, 64, 256).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: Some(recv.srq()),
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap();
    let pool = SendPool::<Sim>::new(&pd, 64, 256).unwrap();
    Side { qp, cq, recv, pool, sq: SendQueue::new(256, 64), _ctx: ctx }
}

fn endpoint(s: &Side) -> Endpoint {
    let port = s._ctx.query_port(1).unwrap();
    let gid = s._ctx.gid_table(1).unwrap()[0].gid;
    Endpoint { qp_num: s.qp.qp_num(), psn: 0, lid: port.lid, gid, mtu: port.active_mtu }
}

/// Sends 32 bytes and waits for the receive; returns when both completions are handled.
fn send_and_wait(s: &mut Side, wcs: &mut Completions<16>) {
    let b = s.pool.acquire().unwrap();
    s.sq.send(&mut s.pool, b, 32, true);
    s.sq.flush(&s.qp, &mut s.pool, 1).unwrap();
    loop {
        wcs.poll(&s.cq).unwrap();
        if handle(s, wcs) {
            break;
        }
    }
    s.recv.flush().unwrap();
}

/// Handles what `wcs` holds: send completions retire send buffers, receives are reposted
/// (posted with the next flush). True when a receive completed.
fn handle(s: &mut Side, wcs: &mut Completions<16>) -> bool {
    let mut got = false;
    for c in &mut *wcs {
        if c.send_tag().is_some() {
            s.sq.on_completion(c, &mut s.pool);
        } else {
            if let Some(buf) = s.recv.take(c) {
                s.recv.repost(buf);
            }
            got = true;
        }
    }
    got
}

fn wait_recv_then_send(s: &mut Side, wcs: &mut Completions<16>) {
    loop {
        wcs.poll(&s.cq).unwrap();
        if handle(s, wcs) {
            break;
        }
    }
    let b = s.pool.acquire().unwrap();
    s.sq.send(&mut s.pool, b, 32, true);
    s.sq.flush(&s.qp, &mut s.pool, 2).unwrap();
    s.recv.flush().unwrap();
}

/// A connected raw QP pair on two sim hosts.
fn raw_pair() -> (Side, Side) {
    raw_pair_with(false)
}

/// [`raw_pair`], the CQs raising completion events when `events`.
fn raw_pair_with(events: bool) -> (Side, Side) {
    let a = side_with(events);
    let b = side_with(events);
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    rc::connect(&a.qp, &RcConfig::default(), &ea, &eb).unwrap();
    rc::connect(&b.qp, &RcConfig::default(), &eb, &ea).unwrap();
    (a, b)
}

/// One round of raw ping-pong: the echo side runs on a thread pinned to core 1 for the round.
fn raw_round(pair: (Side, Side), iters: usize) -> (Duration, (Side, Side)) {
    let (mut a, mut b) = pair;
    let total = iters + 100;
    let echo = std::thread::spawn(move || {
        pin(1);
        let mut wcs = Completions::<16>::new();
        for _ in 0..total {
            wait_recv_then_send(&mut b, &mut wcs);
        }
        b
    });
    let mut wcs = Completions::<16>::new();
    let mut samples = Vec::with_capacity(iters);
    for i in 0..total {
        let t = Instant::now();
        send_and_wait(&mut a, &mut wcs);
        if i >= 100 {
            samples.push(t.elapsed());
        }
    }
    let b = echo.join().unwrap();
    (median(&mut samples), (a, b))
}

fn rpc_round<Q: Message, R: Message + Default>(
    client: &Client,
    id: MethodId,
    req: &Q,
    iters: usize,
) -> Duration {
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + 100 {
        let t = Instant::now();
        let _r: R = client.unary(id, req, &CallOptions::default()).unwrap();
        if i >= 100 {
            samples.push(t.elapsed());
        }
    }
    median(&mut samples)
}

fn main() {
    let iters: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let rounds = 10;
    let per_round = (iters / rounds).max(1000);
    let start_server = || {
        Server::builder()
            .worker_cores(vec![1])
            .polling(PollingPolicy::Busy)
            .srq_depth(std::env::var("SRQ").ok().and_then(|v| v.parse().ok()).unwrap_or(4096))
            .max_sessions(std::env::var("SESSIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(1024))
            .add_service(EchoService::default())
            .spawn("127.0.0.1:0")
            .unwrap()
    };
    pin(0);
    if let Some(n) = std::env::var("RPC_MEASURE_COUNT").ok().and_then(|v| v.parse::<usize>().ok()) {
        if let Ok(spec) = std::env::var("RPC_MEASURE_CHAN") {
            return chan_count(n, &spec);
        }
        if let Some(w) = std::env::var("RPC_MEASURE_WINDOW").ok().and_then(|v| v.parse::<usize>().ok()) {
            return window_count(n, w);
        }
        if std::env::var("RPC_MEASURE_RAW").is_ok_and(|v| v == "1") {
            return raw_count(n);
        }
        return count_only(n);
    }
    let req = Blob { data: vec![7u8; 30] }; // 32 bytes encoded
    assert_eq!(req.encoded_len(), 32);
    let fixed = Fixed { a: 1, b: 2, c: 3, d: 4 };
    assert_eq!(fixed.encoded_len(), 32);
    // Alternate short rounds so that load from other processes hits both alike; the server runs
    // only during its rounds, so the raw rounds get core 1 to themselves.
    let mut pair = raw_pair();
    let (mut raws, mut rpcs, mut fixeds) = (Vec::new(), Vec::new(), Vec::new());
    let rounds = if std::env::var("RPC_MEASURE_THROUGHPUT_ONLY").is_ok() { 0 } else { rounds };
    for _ in 0..rounds {
        let (r, p) = raw_round(pair, per_round);
        pair = p;
        raws.push(r);
        let server = start_server();
        let client = Client::connect_with(server.local_addr(), &ClientConfig::default().window(32)).unwrap();
        rpcs.push(rpc_round::<Blob, Blob>(&client, ECHO, &req, per_round));
        fixeds.push(rpc_round::<Fixed, Fixed>(&client, FIXED, &fixed, per_round));
        drop(client);
        server.shutdown();
    }
    if std::env::var("RPC_MEASURE_LATENCY_ONLY").is_ok() {
        println!("raw {:?} rpc {:?} fixed {:?}", median(&mut raws), median(&mut rpcs), median(&mut fixeds));
        return;
    }
    let server = start_server();
    let client = Client::connect_with(server.local_addr(), &ClientConfig::default().window(32)).unwrap();
    if rounds == 0 {
        raws.push(Duration::from_nanos(1));
        rpcs.push(Duration::from_nanos(1));
        fixeds.push(Duration::from_nanos(1));
    }
    let (raw, rpc, rpc_fixed) = (median(&mut raws), median(&mut rpcs), median(&mut fixeds));
    let best = |v: &[Duration]| v.iter().min().copied().unwrap_or_default();
    let (raw_min, rpc_min, fixed_min) = (best(&raws), best(&rpcs), best(&fixeds));

    // Throughput: 32 async calls outstanding.
    let n = iters * 10;
    let mut cx = TaskContext::from_waker(Waker::noop());
    let mut q: VecDeque<ResponseFuture<'_, Blob>> = VecDeque::with_capacity(32);
    let start = Instant::now();
    let (mut sent, mut done) = (0usize, 0usize);
    while done < n {
        while q.len() < 32 && sent < n {
            q.push_back(client.unary_async(ECHO, &req, &CallOptions::default()));
            sent += 1;
        }
        if let Some(f) = q.front_mut() {
            if let Poll::Ready(r) = Pin::new(f).poll(&mut cx) {
                r.unwrap();
                q.pop_front();
                done += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(q);
    println!(
        "sim, 32-byte bodies, two pinned busy-polling threads, {rounds} alternating rounds of {per_round} \
         round trips (median of round medians; best round in brackets):"
    );
    println!(
        "  raw SEND/RECV ping-pong RTT : {:>8.0} ns  [{:>4} ns]",
        raw.as_nanos() as f64,
        raw_min.as_nanos()
    );
    println!(
        "  RPC unary RTT (blocking)    : {:>8.0} ns  [{:>4} ns]  ({:.2}x raw)",
        rpc.as_nanos() as f64,
        rpc_min.as_nanos(),
        rpc.as_secs_f64() / raw.as_secs_f64()
    );
    println!(
        "  RPC unary RTT, no-alloc msg : {:>8.0} ns  [{:>4} ns]  ({:.2}x raw)",
        rpc_fixed.as_nanos() as f64,
        fixed_min.as_nanos(),
        rpc_fixed.as_secs_f64() / raw.as_secs_f64()
    );
    println!(
        "  RPC throughput, window 32   : {:>8.2} M RPC/s ({n} RPCs in {secs:.2} s)",
        n as f64 / secs / 1e6
    );
    let c = client.counters();
    println!(
        "  client counters: rpcs {} credit stalls {} ring-full stalls {}; sim RNR waits {}",
        c.rpcs,
        c.credit_stalls,
        c.ring_full_stalls,
        rpc_core::verbs::sim::stats().rnr_stalls
    );
    drop(client);
    server.shutdown();
}

/// `RPC_MEASURE_OBSERVE=metrics|tracing|all`: what the counting modes' client and server
/// observe (`Observe`); `metrics` and `all` install the Prometheus exporter's recorder (no HTTP
/// listener), `tracing` has no subscriber (spans disabled: the cost of tracing on and unused).
fn observe() -> rpc_core::Observe {
    let o = rpc_core::Observe::default();
    let (tracing, metrics) = match std::env::var("RPC_MEASURE_OBSERVE").as_deref() {
        Ok("metrics") => (false, true),
        Ok("tracing") => (true, false),
        Ok("all") => (true, true),
        _ => return o,
    };
    if metrics {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // Installing the recorder calibrates its clock (once per process, for as long as
            // calibration takes, which varies): on a thread of its own (counted as "other"), so
            // that it is not counted as the calls' cost.
            let handle = std::thread::spawn(|| {
                metrics_exporter_prometheus::PrometheusBuilder::new()
                    .set_buckets(rpc_core::observe::DURATION_BUCKETS)
                    .unwrap()
                    .install_recorder()
                    .unwrap()
            })
            .join()
            .unwrap();
            // The recorder's histograms hold samples until drained.
            std::thread::spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                handle.run_upkeep();
            });
        });
    }
    o.tracing(tracing).metrics(metrics)
}

/// The server of the counting modes: one worker on core 1 that waits on completion events
/// (`Event { spins: 0 }`), serving `EchoService`.
fn counting_server() -> rpc_core::ServerHandle {
    let asynchronous = match std::env::var("RPC_MEASURE_ASYNC").as_deref() {
        Ok("worker") => Some(AsyncRuntime::worker()),
        Ok("tokio") => Some(AsyncRuntime::current_or_default()),
        _ => None,
    };
    let builder =
        Server::builder().worker_cores(vec![1]).polling(PollingPolicy::Event { spins: 0 }).observe(observe());
    let builder = if intercepting() {
        builder.interceptor(|info| match info.metadata().get(AUTH_KEY) {
            Some(AUTH_VALUE) => Ok(()),
            _ => Err(rpc_core::Status::unauthenticated("rpc_measure: no x-perf-auth")),
        })
    } else {
        builder
    };
    builder.add_service(EchoService { asynchronous }).spawn("127.0.0.1:0").unwrap()
}

/// The entry `RPC_MEASURE_INTERCEPT=1`'s client interceptor adds and its server interceptor
/// checks (as `rpc-perf --interceptors`).
const AUTH_KEY: &str = "x-perf-auth";
const AUTH_VALUE: &str = "Bearer rpc-perf";

/// `RPC_MEASURE_INTERCEPT=1`: an interceptor on each end (the client's inserts `x-perf-auth`,
/// the server's checks it), as `rpc-perf --interceptors`.
fn intercepting() -> bool {
    std::env::var("RPC_MEASURE_INTERCEPT").is_ok_and(|v| v == "1")
}

/// The counting modes' client configuration: `Event { spins: 0 }`, `observe()`, and the
/// interceptor of `RPC_MEASURE_INTERCEPT=1`.
fn counting_client(cfg: ClientConfig) -> ClientConfig {
    let cfg = cfg.polling(PollingPolicy::Event { spins: 0 }).observe(observe());
    if intercepting() {
        cfg.interceptor(|md| {
            md.insert(AUTH_KEY, AUTH_VALUE).map_err(|e| rpc_core::Status::internal(e.to_string()))
        })
    } else {
        cfg
    }
}

/// The options of the counting modes' calls: `RPC_MEASURE_METADATA=N` entries
/// `x-perf-I: value-I` (as `rpc-perf --metadata N`), none by default.
fn counting_options() -> CallOptions {
    let n = std::env::var("RPC_MEASURE_METADATA").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    if n == 0 {
        return CallOptions::default();
    }
    let mut md = rpc_core::Metadata::new();
    for i in 0..n {
        md.insert(&format!("x-perf-{i}"), &format!("value-{i}")).unwrap();
    }
    CallOptions::default().with_metadata(md)
}

/// `RPC_MEASURE_COUNT=N`: N blocking Echo (32-byte `Vec` body) and N blocking Fixed calls, one
/// session, both sides `Event { spins: 0 }` (an idle side blocks, so empty polls stay few and steady), for instruction counts per RPC.
fn count_only(n: usize) {
    let server = counting_server();
    let cfg = counting_client(ClientConfig::default().window(32));
    let opts = counting_options();
    let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
    // RPC_MEASURE_SIZE=N: Echo bodies of N data bytes instead of 30 (e.g. to count the ring path).
    let size = std::env::var("RPC_MEASURE_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let req = Blob { data: vec![7u8; size] };
    let fixed = Fixed { a: 1, b: 2, c: 3, d: 4 };
    let echo = std::env::var("RPC_MEASURE_FIXED_ONLY").map_or(true, |v| v != "1");
    for _ in 0..n * usize::from(echo) {
        let r: Blob = client.unary(ECHO, &req, &opts).unwrap();
        assert_eq!(r, req);
    }
    let fixed_calls = if std::env::var("RPC_MEASURE_ECHO_ONLY").is_ok_and(|v| v == "1") { 0 } else { n };
    for _ in 0..fixed_calls {
        let r: Fixed = client.unary(FIXED, &fixed, &opts).unwrap();
        assert_eq!(r.a, 2);
    }
    println!("{} RPCs", client.counters().rpcs);
    drop(client);
    server.shutdown();
}

/// Polls `s`'s CQ until a receive completed, handling send completions; when a poll finds
/// nothing, arms the CQ, polls once more (a completion before the arming raises no event) and
/// blocks for the event. The receive buffer is reposted (posted with the next flush).
fn wait_recv_event(s: &mut Side, wcs: &mut Completions<16>) {
    loop {
        if wcs.poll(&s.cq).unwrap() == 0 {
            s.cq.req_notify(false).unwrap();
            if wcs.poll(&s.cq).unwrap() == 0 {
                s.cq.wait(None).unwrap();
                continue;
            }
        }
        if handle(s, wcs) {
            return;
        }
    }
}

/// Sends 32 bytes from a send buffer of `s`, inline, and posts the receive buffers waiting.
fn send32(s: &mut Side) {
    let b = s.pool.acquire().unwrap();
    s.sq.send(&mut s.pool, b, 32, true);
    s.sq.flush(&s.qp, &mut s.pool, 1).unwrap();
    s.recv.flush().unwrap();
}

/// The echo side of `raw_count` (its own function: `scripts/instr-count` reports the thread
/// that runs it as the responder, in the worker's column).
#[inline(never)]
fn raw_echo(mut b: Side, n: usize) -> Side {
    let mut wcs = Completions::<16>::new();
    for _ in 0..n {
        wait_recv_event(&mut b, &mut wcs);
        send32(&mut b);
    }
    b
}

/// `RPC_MEASURE_RAW=1` (see the module docs): N raw 32-byte SEND/RECV round trips, both threads
/// waiting on completion events as the RPC counts do.
fn raw_count(n: usize) {
    let (mut a, b) = raw_pair_with(true);
    let echo = std::thread::spawn(move || raw_echo(b, n));
    let mut wcs = Completions::<16>::new();
    for _ in 0..n {
        send32(&mut a);
        wait_recv_event(&mut a, &mut wcs);
    }
    let _b = echo.join().unwrap();
    println!("{n} round trips");
}

/// `RPC_MEASURE_WINDOW=W` (see the module docs): N Fixed calls from one blocking `Client`, W
/// `unary_async` calls in flight, the oldest polled (as `rpc-perf --test rpc_bw`): the baseline of
/// the Channel's `RPC_MEASURE_CHAN=1xW`.
fn window_count(n: usize, window: usize) {
    let server = counting_server();
    let cfg = counting_client(ClientConfig::default().window(window.clamp(1, 4096) as u16));
    let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
    let fixed = Fixed { a: 1, b: 2, c: 3, d: 4 };
    let opts = counting_options();
    let mut cx = TaskContext::from_waker(Waker::noop());
    let mut q = VecDeque::with_capacity(window);
    let mut sent = 0;
    loop {
        while sent < n && q.len() < window {
            q.push_back(client.unary_async::<Fixed, Fixed>(FIXED, &fixed, &opts));
            sent += 1;
        }
        let Some(f) = q.front_mut() else { break };
        match Pin::new(f).poll(&mut cx) {
            Poll::Ready(r) => {
                assert_eq!(r.unwrap().a, 2);
                q.pop_front();
            }
            // Nothing came: let the server's worker run (valgrind runs one thread at a time).
            Poll::Pending => std::thread::yield_now(),
        }
    }
    drop(q);
    println!("{} RPCs", client.counters().rpcs);
    drop(client);
    server.shutdown();
}

/// `RPC_MEASURE_CHAN=TASKS[xWINDOW]` (see the module docs): N Fixed calls through a `Channel`.
fn chan_count(n: usize, spec: &str) {
    let (tasks, window) = match spec.split_once('x') {
        Some((t, w)) => (t.parse::<usize>().unwrap_or(1), w.parse::<usize>().unwrap_or(1)),
        None => (spec.parse::<usize>().unwrap_or(1), 1),
    };
    let poll_spin = std::env::var("RPC_MEASURE_POLL_SPIN").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let server = counting_server();
    let window32 = (tasks * window).clamp(1, 4096) as u16;
    let cfg = rpc_core::ChannelConfig::default()
        .client(counting_client(ClientConfig::default().window(window32)))
        .spins(0)
        .queue_depth((4 * tasks * window).max(64))
        .poll_spin(Duration::from_micros(poll_spin));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ch = rt.block_on(rpc_core::Channel::connect_with(server.local_addr(), &cfg)).unwrap();
    let each = n / tasks.max(1);
    let fixed = Fixed { a: 1, b: 2, c: 3, d: 4 };
    let opts = counting_options();
    rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let ch = ch.clone();
                let opts = opts.clone();
                tokio::spawn(async move {
                    let mut q = VecDeque::with_capacity(window);
                    let mut sent = 0;
                    loop {
                        while sent < each && q.len() < window {
                            q.push_back(ch.unary::<Fixed, Fixed>(FIXED, fixed, &opts));
                            sent += 1;
                        }
                        let Some(call) = q.pop_front() else { break };
                        let r = call.await.unwrap();
                        assert_eq!(r.a, 2);
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
    });
    println!("{} RPCs; {:?}", ch.counters().rpcs, ch.stats());
    drop(ch);
    drop(rt);
    server.shutdown();
}
