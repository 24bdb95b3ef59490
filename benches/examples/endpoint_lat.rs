//! Round trip of one session while its client endpoint carries sessions to many other servers (a
//! benchmark, not a test; issue 28 item 1): 32 B blocking unary calls on `sim` to one busy-polling
//! server, from a `Client` made on an `Endpoint` that also carries a session to each of `--idle N`
//! other servers (in this process, their workers waiting on completion events; each session made
//! one call, then idles). Prints p50 and p99 of the round trip, the device contexts the client side
//! opened (`SimStats::contexts_opened`) and the 1-minute load average.
//!
//! ```text
//! cargo run --release -p rpc-perf --example endpoint_lat -- [--idle N] [--iters N]
//! ```
//!
//! Defaults: `--idle 0`, `--iters 20000` (after 2,000 warm-up calls). Compare `--idle 0` with
//! `--idle 99` (one endpoint carrying sessions to 100 servers), alternating runs: wall-clock
//! figures on a shared machine are noisy.
//!
//! `--channel 1`: the same with `Channel`s (`ChannelConfig::default()`, one per server, the
//! measured one's calls awaited one at a time on a current-thread tokio runtime): every session
//! runs on the one unpinned dispatcher thread, whose count (threads named `rpc-dispatch`) is
//! printed too.

use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::verbs::sim;
use rpc_core::{
    CallOptions, Channel, ChannelConfig, ClientConfig, Endpoint, PollingPolicy, Server, ServerHandle,
    Transport,
};

/// The body, each way: prost's `BytesValue` shape (field 1, bytes), 32 bytes encoded.
type Body32 = Vec<u8>;

const ECHO: MethodId = method_id("/lat.Echo/Echo");

struct Echo;

impl Service for Echo {
    const NAME: &'static str = "lat.Echo";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: ECHO, name: "/lat.Echo/Echo" }];
    fn call(&self, _method: MethodId, _ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        match decode::<Body32>(body) {
            Ok(b) => out.reply(Reply::from(b)),
            Err(s) => out.error(s),
        }
    }
}

fn server(polling: PollingPolicy, credits: u16) -> ServerHandle {
    Server::builder()
        .transport(Transport::Sim)
        .polling(polling)
        .credits_per_session(credits)
        .ring_bytes(64 << 10)
        .max_sessions(4)
        .add_service(Echo)
        .spawn("127.0.0.1:0")
        .expect("server start")
}

fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split(' ').next().map(str::to_string))
        .unwrap_or_default()
}

fn main() {
    let (mut idle, mut iters, mut channel) = (0usize, 20_000usize, 0usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().and_then(|v| v.parse().ok());
        match (a.as_str(), v) {
            ("--idle", Some(n)) => idle = n,
            ("--iters", Some(n)) => iters = n,
            ("--channel", Some(n)) => channel = n,
            _ => {
                eprintln!("usage: endpoint_lat [--idle N] [--iters N] [--channel 0|1]");
                std::process::exit(2);
            }
        }
    }
    let load = load1();
    let busy = server(PollingPolicy::Busy, 32);
    let others: Vec<ServerHandle> = (0..idle).map(|_| server(PollingPolicy::Event { spins: 0 }, 4)).collect();
    if channel != 0 {
        return channels(&busy, &others, iters, &load);
    }
    let before = sim::stats().contexts_opened;
    let ep = Endpoint::new(&Transport::Sim).expect("endpoint");
    let small =
        ClientConfig::default().window(4).ring_bytes(64 << 10).polling(PollingPolicy::Event { spins: 0 });
    let idle_clients: Vec<_> = others
        .iter()
        .map(|s| {
            let c = ep.connect_with(s.local_addr(), &small).expect("connect an idle session");
            let _r: Body32 = c.unary(ECHO, &vec![7u8; 30], &CallOptions::default()).expect("a call");
            c
        })
        .collect();
    let cfg = ClientConfig::default().polling(PollingPolicy::Busy);
    let client = ep.connect_with(busy.local_addr(), &cfg).expect("connect");
    let opened = sim::stats().contexts_opened - before;
    let opts = CallOptions::default();
    let req: Body32 = vec![7u8; 30];
    for _ in 0..2_000 {
        let _r: Body32 = client.unary(ECHO, &req, &opts).unwrap();
    }
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let s = Instant::now();
        let _r: Body32 = client.unary(ECHO, &req, &opts).unwrap();
        t.push(s.elapsed());
    }
    let (p50, p99) = percentiles(t);
    println!(
        "endpoint_lat: sessions {} (idle {idle}), 32 B unary p50 {p50:.2} usec p99 {p99:.2} usec, client device contexts {opened}, load {load}",
        idle + 1,
    );
    drop(client);
    drop(idle_clients);
}

/// p50 and p99 of `t`, in µs.
fn percentiles(mut t: Vec<Duration>) -> (f64, f64) {
    t.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(t[t.len() / 2]), us(t[t.len() * 99 / 100]))
}

/// `--channel 1`: a `Channel` per server, every session on the one unpinned dispatcher thread.
fn channels(busy: &ServerHandle, others: &[ServerHandle], iters: usize, load: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let small = ChannelConfig::default().client(
        ClientConfig::default().window(4).ring_bytes(64 << 10).polling(PollingPolicy::Event { spins: 0 }),
    );
    let opts = CallOptions::default();
    let req: Body32 = vec![7u8; 30];
    let idle_channels: Vec<Channel> = others
        .iter()
        .map(|s| {
            let ch = Channel::connect_blocking(s.local_addr(), &small).expect("connect an idle channel");
            let _r: Body32 = rt.block_on(ch.unary::<Body32, Body32>(ECHO, &req, &opts)).expect("a call");
            ch
        })
        .collect();
    let ch = Channel::connect_blocking(busy.local_addr(), &ChannelConfig::default()).expect("connect");
    let t = rt.block_on(async {
        for _ in 0..2_000 {
            let _r: Body32 = ch.unary::<Body32, Body32>(ECHO, &req, &opts).await.unwrap();
        }
        let mut t = Vec::with_capacity(iters);
        for _ in 0..iters {
            let s = Instant::now();
            let _r: Body32 = ch.unary::<Body32, Body32>(ECHO, &req, &opts).await.unwrap();
            t.push(s.elapsed());
        }
        t
    });
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                .filter(|c| c.trim_end() == "rpc-dispatch")
                .count()
        })
        .unwrap_or(0);
    let (p50, p99) = percentiles(t);
    println!(
        "endpoint_lat --channel: channels {} (idle {}), 32 B unary p50 {p50:.2} usec p99 {p99:.2} usec, dispatcher threads {threads}, load {load}",
        others.len() + 1,
        others.len(),
    );
    drop(ch);
    drop(idle_channels);
}
