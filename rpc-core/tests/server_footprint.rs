//! What a server registers for receive buffers: nothing while no session was admitted, then what
//! the admitted sessions of a worker reserve at once (`ServerConfig::srq_per_session` each),
//! in chunks of 64 buffers, kept for later sessions.

mod rpc_support;

use std::future::Future;

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// Bytes of one receive buffer at the default eager threshold: 4096 + the 40-byte header.
const BUF: u64 = 4096 + 40;

fn echo(c: &Client, seq: u64) {
    let r: EchoMsg = c.unary(ECHO, &request(seq, 32, 32), &CallOptions::default()).unwrap();
    check_reply(&r, seq, 32);
}

#[test]
fn receive_buffers_are_registered_as_sessions_are_admitted_and_kept() {
    // Defaults: 128 sessions of 32 credits on one worker, an SRQ of 16 256 WQEs.
    let (server, _) = spawn(server());
    let idle = server.counters();
    assert_eq!(
        (idle.recv_buffers, idle.recv_buffer_bytes),
        (0, 0),
        "an idle server registered receive buffers"
    );

    // One session of 32 credits reserves 2 x 32 + max(32, 16) + 31 = 127 WQEs: two chunks of 64.
    let a = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo(&a, 1);
    let one = server.counters();
    assert_eq!(one.recv_buffers, 128, "{one:?}");
    assert_eq!(one.recv_buffer_bytes, 128 * BUF);

    // A second one: 254 reserved, 256 buffers.
    let b = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo(&b, 2);
    echo(&a, 3);
    assert_eq!(server.counters().recv_buffers, 256);

    // Both go; the buffers stay, and a new session needs no more.
    drop((a, b));
    counters_when(&server, "both sessions closed", WAIT, |c| c.sessions_closed == 2);
    let c = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo(&c, 4);
    let after = server.counters();
    assert_eq!((after.recv_buffers, after.recv_buffer_bytes), (256, 256 * BUF), "{after:?}");

    // Eight sessions at once reserve 8 x 113 = 904 with no ring (the 15 WQEs of a ring's pieces
    // are reserved when one is granted), and the SRQ keeps room for one to take a ring: 919,
    // 960 buffers; every one is served with all its credits in flight.
    let more: Vec<Client> =
        (0..7).map(|_| Client::connect_with(server.local_addr(), &client_config()).unwrap()).collect();
    for (i, m) in more.iter().enumerate() {
        echo(m, 10 + i as u64);
    }
    assert_eq!(server.counters().recv_buffers, 960);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let reqs: Vec<EchoMsg> = (0..32).map(|i| request(100 + i, 32, 32)).collect();
    for m in more.iter().chain(std::iter::once(&c)) {
        let mut futs: Vec<_> =
            reqs.iter().map(|r| m.unary_async::<_, EchoMsg>(ECHO, r, &CallOptions::default())).collect();
        wait_until(
            "32 calls in flight answered",
            WAIT,
            || {
                futs.retain_mut(|f| match std::pin::Pin::new(f).poll(&mut cx) {
                    std::task::Poll::Ready(r) => {
                        r.unwrap();
                        false
                    }
                    std::task::Poll::Pending => true,
                });
                futs.is_empty()
            },
            || format!("server {:?}", server.counters()),
        );
    }
    assert_eq!(server.counters().recv_buffers, 960);
}

#[test]
fn an_explicit_srq_depth_is_never_exceeded() {
    // Room for six idle sessions (6 x 37 = 222 of 254; credits granted on demand): the buffers
    // end at the depth, not at the next chunk (256), and a seventh session (259) is refused.
    let (server, _) = spawn(server().srq_depth(254).initial_credits(2));
    let clients: Vec<Client> =
        (0..6).map(|_| Client::connect_with(server.local_addr(), &client_config()).unwrap()).collect();
    for (i, c) in clients.iter().enumerate() {
        echo(c, i as u64);
    }
    assert_eq!(server.counters().recv_buffers, 254);
    assert_eq!(server.counters().srq_reserved, 6 * 37);
    let e = Client::connect_with(server.local_addr(), &client_config())
        .and_then(|c| c.unary::<_, EchoMsg>(ECHO, &request(9, 32, 32), &CallOptions::default()).map(|_| c));
    let e = e.expect_err("a seventh session does not fit the SRQ");
    assert!(e.message().contains("srq_depth 254"), "{e}");
    assert_eq!(server.counters().recv_buffers, 254);
}
