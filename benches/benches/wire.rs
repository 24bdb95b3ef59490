//! Message header encode/decode (rpc_core::wire): done once per message on each side.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rpc_core::wire::{Header, Kind, HEADER_LEN};
use rpc_core::Code;

fn request_header() -> Header {
    Header {
        kind: Kind::Request,
        in_ring: false,
        stream: 0,
        metadata: false,
        metadata_cache: 0,
        count: 0,
        status: Code::Ok,
        slot: 7,
        generation: 42,
        method: 0x1234_5678,
        body_len: 32,
        ring_offset: 0,
        freed_head: 4096,
        timeout_us: 0,
        stream_taken: 0,
        session: 5,
        total_len: 32,
    }
}

fn header(c: &mut Criterion) {
    let h = request_header();
    let mut out = [0u8; HEADER_LEN];
    c.bench_function("header/encode", |b| {
        b.iter(|| {
            black_box(&h).encode(&mut out);
            black_box(&out);
        })
    });
    let mut msg = vec![0u8; HEADER_LEN + 32];
    h.encode_into(&mut msg).expect("room for the header");
    assert_eq!(Header::decode(&msg).expect("valid header"), h);
    c.bench_function("header/decode", |b| b.iter(|| Header::decode(black_box(&msg))));
    let short = &msg[..HEADER_LEN - 1];
    c.bench_function("header/decode_truncated", |b| b.iter(|| Header::decode(black_box(short)).is_err()));
}

criterion_group!(benches, header);
criterion_main!(benches);
