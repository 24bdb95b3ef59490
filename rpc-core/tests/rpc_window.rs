//! 100 000 RPCs with a window of 32 outstanding async calls: every reply matched to its request.

mod rpc_support;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

#[test]
fn hundred_thousand_rpcs_with_a_window_of_32() {
    const N: u64 = 100_000;
    const WINDOW: usize = 32;
    let (server, _) = spawn(server().credits_per_session(WINDOW as u16));
    let client = Client::connect_with(server.local_addr(), &client_config().window(WINDOW as u16)).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    let mut inflight: VecDeque<(u64, ResponseFuture<'_, EchoMsg>)> = VecDeque::with_capacity(WINDOW);
    let mut next = 0u64;
    let mut done = 0u64;
    let mut max_inflight = 0;
    while done < N {
        while inflight.len() < WINDOW && next < N {
            let len = (next % 97) as usize;
            inflight.push_back((
                next,
                client.unary_async(ECHO, &request(next, len, len), &CallOptions::default()),
            ));
            next += 1;
        }
        max_inflight = max_inflight.max(inflight.len());
        // Poll every outstanding call once; completed ones leave the window in any order.
        let mut i = 0;
        while i < inflight.len() {
            let (seq, fut) = &mut inflight[i];
            match Pin::new(fut).poll(&mut cx) {
                Poll::Ready(r) => {
                    let seq = *seq;
                    let r = r.unwrap_or_else(|s| panic!("call {seq}: {s}"));
                    check_reply(&r, seq, (seq % 97) as usize);
                    inflight.remove(i);
                    done += 1;
                }
                Poll::Pending => i += 1,
            }
        }
    }
    assert_eq!(max_inflight, WINDOW);
    let c = client.counters();
    assert_eq!(c.rpcs, N);
    assert_eq!(c.with_code(Code::Ok), N);
    assert_eq!(c.rnr_events, 0);
    drop(inflight);
    drop(client);
    server.shutdown();
}

#[test]
fn more_calls_than_the_window_wait_for_a_slot_not_lost() {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().window(4)).unwrap();
    let futs: Vec<_> = (0..4)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 8, 8), &CallOptions::default()))
        .collect();
    // The fifth waits for a slot; polling it alone progresses the session, but its slot frees
    // only when one of the four is taken by its future.
    let mut over = client.unary_async::<_, EchoMsg>(ECHO, &request(9, 8, 8), &CallOptions::default());
    assert_eq!(client.queued_calls(), 1);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..100 {
        assert!(Pin::new(&mut over).poll(&mut cx).is_pending());
    }
    for (i, f) in futs.into_iter().enumerate() {
        check_reply(&block_on(f).unwrap(), i as u64, 8);
    }
    check_reply(&block_on(over).unwrap(), 9, 8);
    drop(client);
    server.shutdown();
}
