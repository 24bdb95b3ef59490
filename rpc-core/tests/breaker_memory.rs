//! Breaker review: what a hostile client's unfinished messages in pieces cost the server's
//! memory. Own test binary: a counting global allocator sees every allocation of the process
//! (the in-process server's included), so nothing else may run here.
//!
//! A peer that sends, per credit, one header and the smallest first piece it may (1/16 of the
//! server's ring: 64 KiB of the default 1 MiB; a 1-byte one is refused since issue 27, see
//! `hostile_admission.rs`) announcing `total_len = max_message_size` (64 MiB by default) must
//! not make the receiver reserve credits × 64 MiB per session: the assembly buffer grows with the bytes that arrived (validated first; see
//! `buffers::gather` and the session's reassembly), so the server's heap stays small. (Found by
//! this test: the first piece once reserved the whole announced `total_len` at once, 2 GiB per
//! session at default credits, and a failed allocation aborts the whole server.)
mod rpc_support;

use std::time::{Duration, Instant};

use rpc_core::buffers::{SendMirror, SendPool, SendQueue};
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::wire::{read_frame, write_frame, Frame, Header, Kind, HEADER_LEN};
use rpc_support::*;

/// Counts the process's live heap bytes (`live_bytes`).
#[global_allocator]
static A: Counting = Counting;

#[test]
fn smallest_first_pieces_make_the_server_reserve_little_each() {
    const CREDITS: u16 = 8;
    // Room in the reassembly cap, and in one session's share of it, for every announced body
    // (each is charged its 64 MiB).
    let (server, _) = spawn(
        server()
            .credits_per_session(CREDITS)
            .max_reassembly_bytes(512 << 20)
            .max_reassembly_bytes_per_session(512 << 20),
    );
    let peer = RawPeer::new(256, 16, HEADER_LEN + 4096, 1 << 16, 1);
    let mut tcp = std::net::TcpStream::connect(server.local_addr()).unwrap();
    write_frame(&mut tcp, &Frame::Handshake(peer.handshake(CREDITS, 4096, 64 << 20, 0))).unwrap();
    let Frame::Handshake(reply) = read_frame(&mut tcp).unwrap() else { panic!("refused") };
    peer.connect(&RcConfig::default(), &reply);
    let mut pool = SendPool::<Sim>::new(&peer.pd, 16, HEADER_LEN + 64).unwrap();
    let mut mirror = SendMirror::<Sim>::new(&peer.pd, reply.ring_len as usize).unwrap();
    let mut sq = SendQueue::new(64, 16);
    // Let the server settle, then take the baseline.
    std::thread::sleep(Duration::from_millis(200));
    let before = live_bytes();
    let total = reply.max_message.min(64 << 20);
    let piece = reply.ring_len / 16;
    for slot in 0..CREDITS {
        let off = u32::from(slot) * piece;
        assert!(mirror.write_at(off, &vec![0x77; piece as usize]));
        sq.write(&mirror, off, piece, reply.ring_addr, reply.ring_rkey, off + piece);
        let h = Header {
            method: RAW,
            slot,
            in_ring: true,
            ring_offset: off,
            body_len: piece,
            total_len: total,
            session: reply.session,
            ..Header::new(Kind::Request)
        };
        let mut b = pool.acquire().unwrap();
        h.encode_into(pool.buf_mut(&mut b)).unwrap();
        sq.send(&mut pool, b, HEADER_LEN as u32, false);
    }
    sq.flush(&peer.qp, &mut pool, 1).unwrap();
    // Wait for the worker to take them (its counters do not show pieces: watch memory).
    let give_up = Instant::now() + Duration::from_secs(5);
    let mut grown = 0;
    while Instant::now() < give_up {
        grown = live_bytes() - before;
        if grown > (total as isize) * (CREDITS as isize) / 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("{CREDITS} first pieces of {piece} bytes (total_len {total}) grew the heap by {grown} bytes");
    assert_eq!(server.counters().malformed, 0, "the pieces were legal");
    assert_eq!(
        server.counters().reassembly_bytes,
        u64::from(CREDITS) * u64::from(total),
        "each charged whole"
    );
    let sent = (CREDITS as isize) * (HEADER_LEN as isize + piece as isize);
    assert!(
        grown < 64 * sent + (4 << 20),
        "{sent} bytes from the peer made the server hold {grown} bytes (credits × max_message_size)"
    );
    drop((sq, mirror, pool, peer, tcp));
    server.shutdown();
}
