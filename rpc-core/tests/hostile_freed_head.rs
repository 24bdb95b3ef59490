//! A client that reports ring space freed before the server's WRITE into it is done (a lying
//! `freed_head`) cannot make the server encode a new answer into the send-mirror range a posted
//! or queued WRITE of it still reads: the server reuses only what is both freed by the peer and
//! retired by its own polled completions. Before, the next answer was encoded over the first
//! one's mirror range before its WRITE went out (on the software NIC a plain write racing the NIC
//! thread's read, undefined behaviour): the liar received its first answer with the second one's
//! bytes. The good client of the same server keeps calling throughout.
//!
//! Sabotaged: `RingProducer::reserve` taking only the peer's head: "answer 10 at ring offset 0
//! garbled: failed to decode Protobuf message: invalid tag value: 0"-like decode failure of the
//! first answer; `Session::on_ring_written` doing nothing: the third answer went in pieces
//! ("one ring body").

mod rpc_support;

use std::time::Instant;

use rpc_core::codegen::*;
use rpc_core::wire::{Header, Kind, HEADER_LEN};
use rpc_core::Client;
use rpc_support::*;

/// The liar's ring (bytes): room for two answers of [`ANSWER`] side by side.
const RING: usize = 256 << 10;

/// Payload bytes of each answer: its encoded body is above `ROTATE_BODY_MAX` (96 KiB), so a ring
/// the server believes empty takes it at offset 0, over the first answer's range.
const ANSWER: usize = 100 << 10;

fn echo_request(session: u32, slot: u16, body: &[u8], freed_head: u32) -> Header {
    Header {
        method: ECHO,
        slot,
        body_len: body.len() as u32,
        total_len: body.len() as u32,
        session,
        freed_head,
        ..Header::new(Kind::Request)
    }
}

/// The encoded length of the server's answer to `seq` with `reply_len` payload bytes (what its
/// ring tail advances by when it places the answer at offset 0 of an empty ring).
fn answer_len(seq: u64, reply_len: usize) -> u32 {
    let p = payload(seq ^ 0xffff, reply_len);
    EchoMsg { seq, checksum: fnv64(&p), payload: p, reply_len: 0 }.encoded_len() as u32
}

/// Takes the answer for `slot` out of the liar's ring and checks it is the answer to `seq`.
fn ring_answer(c: &mut RawClient, slot: u16, seq: u64) -> Header {
    let h = c.wait_for(Kind::Response, slot);
    assert_eq!(h.status, rpc_core::Code::Ok, "{h:?}");
    assert!(h.in_ring && h.body_len == h.total_len, "one ring body: {h:?}");
    let mut body = Vec::new();
    assert!(c.peer.ring.copy_out(h.ring_offset, h.body_len, &mut body));
    let r = <EchoMsg as Message>::decode(&body[..])
        .unwrap_or_else(|e| panic!("answer {seq} at ring offset {} garbled: {e}", h.ring_offset));
    assert_eq!(r.seq, seq, "answer {seq} at ring offset {} carries answer {}'s bytes", h.ring_offset, r.seq);
    check_reply(&r, seq, ANSWER);
    h
}

#[test]
fn a_lying_freed_head_cannot_make_the_server_reuse_a_mirror_range_its_write_still_reads() {
    let (hold, gate) = Hold::new();
    let entered = gate.entered_flag();
    let server = server()
        .credits_per_session(4)
        .add_service(TestService::default())
        .add_service(hold)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    let addr = server.local_addr();
    let good = Client::connect_with(addr, &client_config()).expect("the good client connects");
    let good_call = |seq: u64| {
        let r = good
            .unary::<_, EchoMsg>(ECHO, &request(seq, 64, 200 << 10), &CallOptions::default())
            .expect("the good client's call");
        check_reply(&r, seq, 200 << 10);
    };
    good_call(1);

    let peer = RawPeer::new(256, 16, HEADER_LEN + 4096, RING, 1);
    let mut c = RawClient::connect_peer(peer, addr, 4, 4096, 1 << 20);
    let s = c.session;
    // Slot 0 holds the worker, so that both requests below arrive before it polls again and are
    // handled in one batch: the first answer's WRITE is still queued (not even posted) when the
    // second request's freed head arrives.
    c.send_eager(Header { method: HOLD, session: s, ..Header::new(Kind::Request) }, &[]);
    let give_up = Instant::now() + WAIT;
    while !entered.load(std::sync::atomic::Ordering::Acquire) {
        assert!(Instant::now() < give_up, "the held call never reached its handler");
        c.poll();
        std::thread::yield_now();
    }
    let (one, two) = (10u64, 20u64);
    let first = request(one, 16, ANSWER).encode_to_vec();
    c.send_eager(echo_request(s, 1, &first, 0), &first);
    // The lie: the first answer (at offset 0 of the empty ring, ending at its length) is freed
    // before it was even written.
    let lie = answer_len(one, ANSWER);
    let second = request(two, 16, ANSWER).encode_to_vec();
    c.send_eager(echo_request(s, 2, &second, lie), &second);
    wait_until(
        "both requests to land",
        WAIT,
        || {
            c.poll();
            c.sq.outstanding() == 0
        },
        String::new,
    );
    drop(gate);
    c.wait_for(Kind::Response, 0);

    let h1 = ring_answer(&mut c, 1, one);
    assert_eq!(h1.ring_offset, 0);
    let h2 = ring_answer(&mut c, 2, two);
    assert_eq!(h2.ring_offset, h1.body_len, "placed after the first answer, still being written");
    // The liar's session lives on: an honest head now, and another call.
    let third = request(30, 16, ANSWER).encode_to_vec();
    let freed = h2.ring_offset + h2.body_len;
    c.send_eager(Header { generation: 1, ..echo_request(s, 1, &third, freed) }, &third);
    ring_answer(&mut c, 1, 30);

    good_call(2);
    assert_eq!(server.counters().sessions_closed, 0, "{:?}", server.counters());
    drop(c);
    good_call(3);
    drop(good);
    server.shutdown();
}
