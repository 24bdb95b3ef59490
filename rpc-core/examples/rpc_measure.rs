//! Quick measurement on `sim` (not a test): raw SEND/RECV ping-pong round trip, RPC round trip
//! (32-byte bodies each way, blocking calls), and RPC throughput at concurrency 32 with one client
//! and one server worker. Two pinned busy-polling threads: run it on an otherwise idle machine.
//!
//! `cargo run --release -p rpc-core --example rpc_measure [ITERS]`

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use rpc_core::buffers::{RecvPool, SendPool, SendQueue};
use rpc_core::codegen::*;
use rpc_core::verbs::rc::{self, Endpoint, RcConfig};
use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::{
    CompletionQueue, Context, DeviceSelector, ProtectionDomain, Provider, QpCap, QpInitAttr, QueuePair,
    WorkCompletion,
};
use rpc_core::{Client, ClientConfig, PollingPolicy, Server};

#[derive(Clone, PartialEq, prost::Message)]
struct Blob {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
}

const ECHO: MethodId = method_id("/measure.Echo/Echo");

struct EchoService;

impl Service for EchoService {
    const NAME: &'static str = "measure.Echo";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: ECHO, name: "/measure.Echo/Echo" }];
    fn call(&self, _: MethodId, _: &RequestContext, body: &[u8], out: &mut ReplyWriter<'_>) {
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

fn side() -> Side {
    let ctx = Sim::open(&DeviceSelector::First).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, false).unwrap();
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
    Side { qp, cq, recv, pool, sq: SendQueue::new(256), _ctx: ctx }
}

fn endpoint(s: &Side) -> Endpoint {
    let port = s._ctx.query_port(1).unwrap();
    let gid = s._ctx.gid_table(1).unwrap()[0].gid;
    Endpoint { qp_num: s.qp.qp_num(), psn: 0, lid: port.lid, gid, mtu: port.active_mtu }
}

/// Sends 32 bytes and waits for the receive; returns when both completions are handled.
fn send_and_wait(s: &mut Side, wcs: &mut [WorkCompletion]) {
    let b = s.pool.acquire().unwrap();
    s.sq.send(&s.pool, b, 32);
    s.sq.flush(&s.qp, &mut s.pool, 1).unwrap();
    let mut got_recv = false;
    while !got_recv {
        let n = s.cq.poll(wcs).unwrap();
        for wc in &wcs[..n] {
            if let Some((_, wrs, bufs)) = rpc_core::buffers::split_send_wr_id(wc.wr_id) {
                s.pool.retire(usize::from(bufs));
                s.sq.on_completion(wrs);
            } else {
                s.recv.repost(wc.wr_id as u32);
                got_recv = true;
            }
        }
    }
    s.recv.flush().unwrap();
}

fn wait_recv_then_send(s: &mut Side, wcs: &mut [WorkCompletion]) {
    loop {
        let n = s.cq.poll(wcs).unwrap();
        let mut got = false;
        for wc in &wcs[..n] {
            if let Some((_, wrs, bufs)) = rpc_core::buffers::split_send_wr_id(wc.wr_id) {
                s.pool.retire(usize::from(bufs));
                s.sq.on_completion(wrs);
            } else {
                s.recv.repost(wc.wr_id as u32);
                got = true;
            }
        }
        if got {
            break;
        }
    }
    let b = s.pool.acquire().unwrap();
    s.sq.send(&s.pool, b, 32);
    s.sq.flush(&s.qp, &mut s.pool, 2).unwrap();
    s.recv.flush().unwrap();
}

fn raw_send_recv(iters: usize) -> Duration {
    let mut a = side();
    let mut b = side();
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    rc::connect(&a.qp, &RcConfig::default(), &ea, &eb).unwrap();
    rc::connect(&b.qp, &RcConfig::default(), &eb, &ea).unwrap();
    let total = iters + 1000;
    let echo = std::thread::spawn(move || {
        pin(1);
        let mut wcs = [WorkCompletion::default(); 16];
        for _ in 0..total {
            wait_recv_then_send(&mut b, &mut wcs);
        }
        b
    });
    pin(0);
    let mut wcs = [WorkCompletion::default(); 16];
    let mut samples = Vec::with_capacity(iters);
    for i in 0..total {
        let t = Instant::now();
        send_and_wait(&mut a, &mut wcs);
        if i >= 1000 {
            samples.push(t.elapsed());
        }
    }
    let _b = echo.join().unwrap();
    median(&mut samples)
}

fn main() {
    let iters: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let raw = raw_send_recv(iters);

    let server = Server::builder()
        .worker_cores(vec![1])
        .polling(PollingPolicy::Busy)
        .add_service(EchoService)
        .spawn("127.0.0.1:0")
        .unwrap();
    pin(0);
    let client = Client::connect_with(server.local_addr(), &ClientConfig::default().window(32)).unwrap();
    let req = Blob { data: vec![7u8; 30] }; // 32 bytes encoded
    assert_eq!(req.encoded_len(), 32);
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + 1000 {
        let t = Instant::now();
        let r: Blob = client.unary(ECHO, &req, &CallOptions::default()).unwrap();
        if i >= 1000 {
            samples.push(t.elapsed());
        }
        assert_eq!(r.data.len(), 30);
    }
    let rpc = median(&mut samples);

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
    println!("sim, 32-byte bodies, two pinned busy-polling threads, {iters} iterations (median round trip):");
    println!("  raw SEND/RECV ping-pong RTT : {:>8.0} ns", raw.as_nanos() as f64);
    println!(
        "  RPC unary RTT (blocking)    : {:>8.0} ns  ({:.2}x raw)",
        rpc.as_nanos() as f64,
        rpc.as_secs_f64() / raw.as_secs_f64()
    );
    println!(
        "  RPC throughput, window 32   : {:>8.2} M RPC/s ({n} RPCs in {secs:.2} s)",
        n as f64 / secs / 1e6
    );
    let c = client.counters();
    println!(
        "  client counters: rpcs {} credit stalls {} ring-full stalls {} rnr {}",
        c.rpcs, c.credit_stalls, c.ring_full_stalls, c.rnr_events
    );
    drop(client);
    server.shutdown();
}
