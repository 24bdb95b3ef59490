//! A client session's receive buffers grow before the calls that need them: with the whole
//! window of calls in flight, every answer finds a receive WQE posted (no RNR wait), and the
//! session then holds what its window needs, not more.
//!
//! Alone in its binary: it reads the software NIC's process-wide RNR count.

mod rpc_support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use rpc_core::codegen::*;
use rpc_core::{Client, Transport};

use rpc_support::*;

/// 32 calls in flight on a session of window 32: the receive buffers double before the calls
/// that need them (16, 32, 48, 80, then 144 for 32 calls: `4 × 32 + 8` = 136 and 7 that may
/// wait for a repost, in chunks of 16),
/// and none of the 32 answers waits for a WQE. Fails with "32 calls in flight on 16 receive
/// buffers" when `ClientCore::cover_recv` is not called (and, timing allowing, with "answers
/// met an empty SRQ": RNR stalls).
#[test]
fn receive_buffers_grow_before_the_calls_that_need_them() {
    let (server, _) = spawn(server());
    let c = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    assert_eq!(c.counters().recv_buffers, 16);
    let rnr_before = rpc_core::verbs::sim::stats().rnr_stalls;
    let reqs: Vec<EchoMsg> = (0..32).map(|i| request(i, 32, 32)).collect();
    let mut futs: Vec<_> =
        reqs.iter().map(|r| c.unary_async::<_, EchoMsg>(ECHO, r, &CallOptions::default())).collect();
    let grown = c.counters().recv_buffers;
    assert_eq!(grown, 144, "32 calls in flight on {grown} receive buffers");
    let mut cx = Context::from_waker(Waker::noop());
    let mut done = 0;
    wait_until(
        "32 calls in flight answered",
        WAIT,
        || {
            futs.retain_mut(|f| match Pin::new(f).poll(&mut cx) {
                Poll::Ready(r) => {
                    let r = r.unwrap();
                    check_reply(&r, r.seq, 32);
                    done += 1;
                    false
                }
                Poll::Pending => true,
            });
            futs.is_empty()
        },
        || format!("client {:?}", c.counters()),
    );
    assert_eq!(done, 32);
    if matches!(transport(), Transport::Sim) {
        let rnr = rpc_core::verbs::sim::stats().rnr_stalls - rnr_before;
        assert_eq!(rnr, 0, "answers met an empty SRQ {rnr} times");
    }
    // Growth stops at what the window needs, and a second round adds nothing.
    let mut futs: Vec<_> =
        reqs.iter().map(|r| c.unary_async::<_, EchoMsg>(ECHO, r, &CallOptions::default())).collect();
    wait_until(
        "a second round answered",
        WAIT,
        || {
            futs.retain_mut(|f| !matches!(Pin::new(f).poll(&mut cx), Poll::Ready(Ok(_))));
            futs.is_empty()
        },
        || format!("client {:?}", c.counters()),
    );
    let after = c.counters();
    assert_eq!((after.recv_buffers, after.recv_buffer_bytes), (144, 144 * (4096 + 40)), "{after:?}");
    // A stream adds the stream budget (32 at window 32) before it opens: 4 × 32 + 8 + 32 and 7
    // that may wait for a repost, 175: 176 in chunks of 16 (a method the server lacks: the stream
    // ends UNIMPLEMENTED, after the growth).
    let stream = c.server_stream::<_, EchoMsg>(UNKNOWN, &request(1000, 32, 32), &CallOptions::default());
    assert_eq!(c.counters().recv_buffers, 176);
    if let Ok(mut s) = stream {
        assert!(s.next().is_some_and(|r| r.is_err()), "a stream of an unknown method answered");
    }
    drop(server);
}
