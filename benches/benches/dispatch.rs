//! What dispatching a call costs outside the NIC: the method id of a name, decoding the request
//! body (the facade's `decode`, as generated servers call it) and encoding the reply, for the
//! benchmark service's messages at 32 B and 1 MiB.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rpc_core::codegen::{decode, method_id, Body, Message};
use rpc_perf::rpc::pb::{EchoReply, EchoRequest};

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    let name = String::from("/rpcperf.Bench/Echo");
    g.bench_function("method_id", |b| b.iter(|| method_id(black_box(&name))));
    for (label, n) in [("32B", 32usize), ("1MiB", 1 << 20)] {
        let req = EchoRequest { payload: Bytes::from(vec![0x5a; n]), resp_size: n as u32 };
        let body = req.encode_to_vec();
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("decode_request_{label}"), |b| {
            b.iter(|| decode::<EchoRequest>(Body::slice(black_box(&body))).map(|r| r.payload.len()))
        });
        let reply = EchoReply { payload: Bytes::from(vec![0xa5; n]) };
        let mut out = vec![0u8; reply.encoded_len()];
        g.bench_function(format!("encode_reply_{label}"), |b| {
            b.iter(|| {
                let mut slice = &mut out[..];
                black_box(&reply).encode(&mut slice).map(|()| slice.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
