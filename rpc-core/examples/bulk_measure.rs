//! Bulk unary calls with the default configuration on `sim` (not a test): N calls each carrying
//! SIZE bytes of request body (a `bytes` field) and a 16-byte reply, one in flight, between one
//! client and one server worker (two pinned busy-polling threads: run it on an idle machine).
//! Prints the median call time and the request goodput, next to a memcpy of SIZE bytes in this
//! process (what the software NIC's RDMA WRITE of SIZE bytes costs at least).
//!
//! `cargo run --release -p rpc-core --no-default-features --example bulk_measure [SIZE] [N]`
//! (defaults: 64 MiB, 20 calls). SIZE must stay within the default `max_message_size` (64 MiB)
//! minus the few bytes of protobuf framing. With `BULK_MEASURE_EVENTS=1` both sides wait on
//! completion events (for callgrind: `BULK_MEASURE_EVENTS=1 valgrind --tool=callgrind ... SIZE N`).

use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::{Client, ClientConfig, PollingPolicy, Server};

#[derive(Clone, PartialEq, prost::Message)]
struct Blob {
    #[prost(bytes = "bytes", tag = "1")]
    data: bytes::Bytes,
}

const PUT: MethodId = method_id("/measure.Bulk/Put");

struct Bulk;

impl Service for Bulk {
    const NAME: &'static str = "measure.Bulk";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: PUT, name: "/measure.Bulk/Put" }];
    fn call(&self, _: MethodId, _: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        match decode::<Blob>(body) {
            // The reply says how many bytes arrived and their sum (so the body is really read).
            Ok(b) => {
                let sum = b.data.iter().fold(0u64, |s, &x| s.wrapping_add(u64::from(x)));
                let mut reply = Vec::with_capacity(16);
                reply.extend_from_slice(&(b.data.len() as u64).to_le_bytes());
                reply.extend_from_slice(&sum.to_le_bytes());
                out.reply(Reply::from(Blob { data: reply.into() }))
            }
            Err(s) => out.error(s),
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or((64 << 20) - 16);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    // BULK_MEASURE_EVENTS=1: both sides wait on completion events instead of spinning (for
    // instruction counts under callgrind, which runs one thread at a time).
    let polling = if std::env::var_os("BULK_MEASURE_EVENTS").is_some() {
        PollingPolicy::Event { spins: 0 }
    } else {
        PollingPolicy::Busy
    };
    let server = Server::builder()
        .worker_cores(vec![1])
        .polling(polling)
        .add_service(Bulk)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: 0 });
    let client = Client::connect_with(server.local_addr(), &ClientConfig::default().polling(polling))
        .expect("connects");
    let req = Blob { data: vec![3u8; size].into() };
    let want_sum = 3 * size as u64;
    let mut times = Vec::with_capacity(n);
    for i in 0..=n {
        let t = Instant::now();
        let r: Blob = client.unary(PUT, &req, &CallOptions::default()).expect("call succeeds");
        let dt = t.elapsed();
        let got = u64::from_le_bytes(r.data[..8].try_into().unwrap());
        let sum = u64::from_le_bytes(r.data[8..16].try_into().unwrap());
        assert_eq!((got, sum), (size as u64, want_sum), "the server got every byte");
        if i > 0 {
            times.push(dt); // the first call warms the rings and allocations up
        }
    }
    times.sort();
    let med = times[times.len() / 2];
    // memcpy of `size` bytes, cold source and destination (fresh each time, as a 64 MiB body is).
    let mut copies: Vec<Duration> = (0..5)
        .map(|_| {
            let src = vec![5u8; size];
            let mut dst = vec![0u8; size];
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            t.elapsed()
        })
        .collect();
    copies.sort();
    let copy = copies[2];
    let gbps = |d: Duration| size as f64 / d.as_secs_f64() / 1e9;
    println!(
        "bulk unary, default configuration: {size} B request, {n} calls: median {:.2} ms = {:.2} GB/s goodput; \
         memcpy of {size} B: {:.2} ms = {:.2} GB/s; ratio {:.0} %",
        med.as_secs_f64() * 1e3,
        gbps(med),
        copy.as_secs_f64() * 1e3,
        gbps(copy),
        100.0 * gbps(med) / gbps(copy)
    );
    let c = client.counters();
    println!(
        " client counters: ring-full stalls {}, window fallbacks {}",
        c.ring_full_stalls, c.window_fallbacks
    );
    drop(client);
    server.shutdown();
}
