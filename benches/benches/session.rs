//! Session bookkeeping (rpc_core::session), sans-IO: one whole call cycle through a client and a
//! server session and the client's call slots, per iteration, as the workers drive it (a ring
//! body's reassembly buffer included: it is allocated per message).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rpc_core::session::{CallSlots, Placement, Role, Session, SessionParams};
use rpc_core::wire::{Header, Kind};

fn params() -> SessionParams {
    SessionParams {
        id: 5,
        credits: 32,
        eager_threshold: 4096,
        max_message: 16 << 20,
        peer_ring_len: 8 << 20,
        own_ring_len: 8 << 20,
        max_held: 64,
    }
}

/// One call: slot start → send → place → stamp → server accepts → answers → client accepts →
/// slot done. `len` bytes of request body (eager or ring).
fn cycle(client: &mut Session, server: &mut Session, slots: &mut CallSlots<u32>, len: usize) {
    let (slot, generation) = slots.start().expect("a free slot");
    let (slot2, _) = slots.next_sendable().expect("credit available");
    debug_assert_eq!(slot, slot2);
    let mut req = Header::new(Kind::Request);
    req.slot = slot;
    req.generation = generation;
    req.method = 0x1234_5678;
    req.body_len = len as u32;
    req.total_len = len as u32;
    match client.place_body(len).expect("room") {
        Placement::Eager => {}
        Placement::Ring(off) => {
            req.in_ring = true;
            req.ring_offset = off;
            // Its WRITE completes at once (the runtime learns it from a polled completion).
            client.on_ring_written(client.ring_write_mark());
        }
        Placement::Pieces => unreachable!("the ring is never full here"),
    }
    client.stamp(&mut req);
    let inc = server.handle_header(black_box(&req), std::time::Instant::now).expect("valid request");
    if let Some(piece) = inc.ring {
        // The runtime copies the body out of the ring here (the copy is not this bench's).
        let n = piece.len as usize;
        server.piece_buffer(&piece).resize(n, 0);
        black_box(server.piece_done(piece).expect("complete"));
    }
    server.on_answer();
    let mut resp = Header::new(Kind::Response);
    resp.slot = slot;
    resp.generation = generation;
    server.stamp(&mut resp);
    client.handle_header(black_box(&resp), std::time::Instant::now).expect("valid response");
    slots.on_response(slot, generation, 7).expect("in flight");
    black_box(slots.take_done(slot, generation));
}

fn session(c: &mut Criterion) {
    let mut g = c.benchmark_group("session");
    for (name, len) in [("eager_call_32B", 32usize), ("ring_call_64KiB", 64 << 10)] {
        let mut client = Session::new(Role::Client, params());
        let mut server = Session::new(Role::Server, params());
        let mut slots = CallSlots::<u32>::new(32, 32);
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| b.iter(|| cycle(&mut client, &mut server, &mut slots, len)));
    }
    g.finish();
}

criterion_group!(benches, session);
criterion_main!(benches);
