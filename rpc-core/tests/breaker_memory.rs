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

use rpc_core::wire::{Header, Kind, HEADER_LEN};
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
    // Connected, and the server's ring granted (protocol 12: asked for first).
    let mut c = RawClient::connect_peer(
        RawPeer::new(256, 16, HEADER_LEN + 4096, 1 << 16, 1),
        server.local_addr(),
        CREDITS,
        4096,
        64 << 20,
    );
    // Let the server settle, then take the baseline.
    std::thread::sleep(Duration::from_millis(200));
    let before = live_bytes();
    let total = c.max_message.min(64 << 20);
    let piece = c.ring_len / 16;
    for slot in 0..CREDITS {
        let off = u32::from(slot) * piece;
        assert!(c.mirror.write_at(off, &vec![0x77; piece as usize]));
        c.sq.write(&c.mirror, off, piece, c.ring.0, c.ring.1, off + piece);
        let h = Header {
            method: RAW,
            slot,
            in_ring: true,
            ring_offset: off,
            body_len: piece,
            total_len: total,
            session: c.session,
            ..Header::new(Kind::Request)
        };
        let mut b = c.pool.acquire().unwrap();
        h.encode_into(c.pool.buf_mut(&mut b)).unwrap();
        c.sq.send(&mut c.pool, b, HEADER_LEN as u32, false);
    }
    c.sq.flush(&c.peer.qp, &mut c.pool, 1).unwrap();
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
    drop(c);
    server.shutdown();
}
