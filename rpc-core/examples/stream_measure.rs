//! Server-streaming throughput on `sim` (not a test): one client takes the messages of one server
//! stream as fast as it can; messages/s and goodput at 32 B and 64 KiB per message, every message
//! checked byte for byte. The producer is a thread of the handler's own, the server has one worker.
//!
//! `cargo run --release -p rpc-core --example stream_measure [MIB_AT_64K] [MESSAGES_AT_32B]`
//! (defaults: 1024 MiB in 64 KiB messages, 2 000 000 messages of 32 B).

use std::time::Instant;

use rpc_core::codegen::*;
use rpc_core::{Client, ClientConfig, PollingPolicy, Server};

#[derive(Clone, PartialEq, prost::Message)]
struct ListReq {
    #[prost(uint64, tag = "1")]
    count: u64,
    #[prost(uint32, tag = "2")]
    size: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Chunk {
    #[prost(fixed64, tag = "1")]
    seq: u64,
    #[prost(bytes = "vec", tag = "2")]
    data: Vec<u8>,
}

const LIST: MethodId = method_id("/measure.Stream/List");

/// Message `seq` of `size` bytes: a window of a fixed pattern, shifted by `seq`.
fn window(pattern: &[u8], seq: u64, size: usize) -> &[u8] {
    let at = (seq % 251) as usize;
    &pattern[at..at + size]
}

fn pattern(size: usize) -> Vec<u8> {
    (0..size + 256).map(|i| (i * 7 + i / 256) as u8).collect()
}

struct StreamService;

impl Service for StreamService {
    const NAME: &'static str = "measure.Stream";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: LIST, name: "/measure.Stream/List" }];
    fn call(&self, _: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let req: ListReq = match decode(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        let (sink, reply) = ctx.stream::<Chunk>();
        std::thread::spawn(move || {
            let p = pattern(req.size as usize);
            for seq in 0..req.count {
                let data = window(&p, seq, req.size as usize).to_vec();
                if sink.send(&Chunk { seq, data }).is_err() {
                    return;
                }
            }
        });
        out.reply(reply);
    }
}

fn run(client: &Client, count: u64, size: u32) {
    let p = pattern(size as usize);
    let t0 = Instant::now();
    let stream = client
        .server_stream::<_, Chunk>(LIST, &ListReq { count, size }, &CallOptions::default())
        .expect("stream opens");
    let mut n = 0u64;
    for m in stream {
        let m = m.expect("a message");
        assert_eq!(m.seq, n, "in order");
        assert!(m.data == window(&p, n, size as usize), "message {n} differs");
        n += 1;
    }
    assert_eq!(n, count, "every message arrived");
    let secs = t0.elapsed().as_secs_f64();
    let bytes = count as f64 * f64::from(size);
    println!(
        "{size:>6} B x {count:>8}: {:>8.3} s  {:>9.0} messages/s  {:>8.1} MiB/s goodput",
        secs,
        count as f64 / secs,
        bytes / secs / f64::from(1u32 << 20)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let small: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
    let polling = PollingPolicy::SpinThenYield { spins: 1000 };
    let server = Server::builder()
        .polling(polling)
        .add_service(StreamService)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    let client = Client::connect_with(server.local_addr(), &ClientConfig::default().polling(polling))
        .expect("client connects");
    println!("sim, server streaming, one worker, producer thread, client thread (SpinThenYield)");
    run(&client, small, 32);
    run(&client, mib * 16, 64 << 10);
    drop(client);
    server.shutdown();
}
