//! What a client session registers for its receive and send buffers: one chunk of 16 each at
//! the connect, one more chunk of receive buffers at its first call, which covers a call at a
//! time however long the session lives; more only before the calls that need them (issue 28: 20,000 client sessions of the default window on one
//! machine, where each registered its whole window's buffers before: 1.1 MiB a session). The
//! receive buffers are the endpoint's: its sessions share them (`endpoint::rx`).
//!
//! One test per binary here: the second reads the software NIC's process-wide RNR count.

mod rpc_support;

use rpc_core::{Client, Transport};
use rpc_support::*;

/// Bytes of one receive or send buffer at the default eager threshold: 4096 + the 40-byte header.
const BUF: u64 = 4096 + 40;

/// A session of the default window (32) registers 16 receive and 16 send buffers at the connect;
/// making one call at a time, 16 receive buffers more at its first call, and no more, whatever
/// the number of calls; 32 more at its first body above the eager threshold (either way), for the
/// pieces of ring bodies and their RingReturns. (Without those 32, 64 MiB answers in the
/// Soft-RoCE guest waited on RNR until their reassembly timed out.) Fails with "an idle session of
/// window 32 registered 168 receive buffers" when the client registers its whole window's
/// buffers at the connect (`RecvPool::new` of the SRQ's depth, before the endpoint's shared
/// receive side), and with "... send buffers: 290 KiB" when its send pool is not grown on
/// demand. Audited since the shared receive side (`ClientCore::cover_recv` claiming the whole
/// window at the first call): failed with "500 calls one at a time grew the session's buffers
/// beyond 32 and 16".
#[test]
fn a_session_making_one_call_at_a_time_registers_one_chunk_of_each() {
    let (server, _) = spawn(server());
    let c = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let idle = c.counters();
    assert_eq!(
        (idle.recv_buffers, idle.recv_buffer_bytes),
        (16, 16 * BUF),
        "an idle session of window 32 registered {} receive buffers",
        idle.recv_buffers
    );
    assert_eq!(
        idle.send_pool_bytes,
        16 * BUF,
        "an idle session of window 32 registered send buffers: {} KiB",
        idle.send_pool_bytes >> 10
    );
    for seq in 0..500 {
        echo_checked(&c, seq, 32, 32);
    }
    let eager = c.counters();
    assert_eq!(
        (eager.recv_buffers, eager.send_pool_bytes),
        (32, 16 * BUF),
        "500 calls one at a time grew the session's buffers beyond 32 and 16: {eager:?}"
    );
    // Answers above the eager threshold (through our ring): the first piece has the session
    // cover the messages of ring bodies (32 more, 64 in all), then nothing more.
    for seq in 500..510 {
        echo_checked(&c, seq, 32, 64 << 10);
    }
    let bulk = c.counters();
    assert_eq!((bulk.recv_buffers, bulk.rpcs), (64, 510), "{bulk:?}");
    // Another session on the same endpoint (this thread's) shares its receive buffers: the
    // endpoint registers its reserve (15: an idle session's 8 and 7 waiting reposts) once, and
    // each session's claim beyond it (36: 4 for its call, 32 for ring bodies' messages): 87, in
    // chunks of 16, 96 (two sessions of their own: 64 each).
    let e = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    for seq in 0..100 {
        echo_checked(&e, seq, 32, 64 << 10);
    }
    assert_eq!(
        (e.counters().recv_buffers, c.counters().recv_buffers),
        (96, 96),
        "two sessions of one endpoint do not share their receive buffers"
    );
    // A request above it, on a session that made eager calls only: covered before it goes out (on
    // an endpoint of its own, to see its own buffers).
    let own = rpc_core::Endpoint::new(&transport()).unwrap();
    let d = own.connect_with(server.local_addr(), &client_config()).unwrap();
    echo_checked(&d, 1, 32, 32);
    assert_eq!(d.counters().recv_buffers, 32);
    for seq in 2..12 {
        echo_checked(&d, seq, 64 << 10, 32);
    }
    assert_eq!(d.counters().recv_buffers, 64, "{:?}", d.counters());
    if matches!(transport(), Transport::Sim) {
        // Nothing waited for a receive buffer (a server SEND that finds the client's SRQ empty
        // waits on RNR retry).
        assert_eq!(rpc_core::verbs::sim::stats().rnr_stalls, 0, "a SEND met an empty SRQ");
    }
}
