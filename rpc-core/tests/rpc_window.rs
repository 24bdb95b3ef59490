//! 100 000 RPCs with a window of 32 outstanding async calls: every reply matched to its request,
//! the window really 32 calls at the server, and no receiver-not-ready wait at the NIC.

mod rpc_support;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use rpc_core::codegen::*;
use rpc_core::{Client, Transport};
use rpc_support::*;

/// The software NIC's count of RNR waits in this process (flow control is by credits, never by
/// RNR: with `rnr_retry = 7` an RNR is no error, only the NIC sees it), or `None` on a real NIC.
fn nic_rnr_stalls() -> Option<u64> {
    matches!(transport(), Transport::Sim).then(|| rpc_core::verbs::sim::stats().rnr_stalls)
}

#[test]
fn hundred_thousand_rpcs_with_a_window_of_32() {
    const N: u64 = 100_000;
    const WINDOW: usize = 32;
    let (server, stash) = spawn(server().credits_per_session(WINDOW as u16));
    let client = Client::connect_with(server.local_addr(), &client_config().window(WINDOW as u16)).unwrap();
    let rnr_before = nic_rnr_stalls();
    let mut cx = Context::from_waker(Waker::noop());

    // The window is WINDOW calls at the server: that many reach the handler (which holds them
    // unanswered) at once, and one more does not while they are held.
    let held: Vec<_> = (0..WINDOW as u64)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &CallOptions::default()))
        .collect();
    wait_stashed("the window's 32 calls to reach the server", WINDOW, &stash, &client, &server);
    let mut extra =
        Box::pin(client.unary_async::<_, EchoMsg>(STASH, &request(99, 8, 0), &CallOptions::default()));
    let extra_done = (0..2000).any(|_| {
        client.progress();
        std::thread::yield_now();
        extra.as_mut().poll(&mut cx).is_ready()
    });
    assert_eq!(stash.lock().unwrap().len(), WINDOW, "a call beyond the window reached the server");
    for r in stash.lock().unwrap().drain(..) {
        r.send(Ok(EchoMsg { seq: 7, ..Default::default() }));
    }
    for f in held {
        assert_eq!(block_on(f).expect("a held call, answered").seq, 7);
    }
    if !extra_done {
        // Queued behind the window (not refused): it goes now that slots are free.
        wait_until(
            "the call queued behind the window to reach the server once slots were free",
            WAIT,
            || {
                client.progress();
                !stash.lock().unwrap().is_empty()
            },
            || format!("server {:?}, client {:?}", server.counters(), client.counters()),
        );
        stash.lock().unwrap().drain(..).for_each(|r| r.send(Ok(EchoMsg::default())));
        let _ = block_on(extra.as_mut());
    }
    drop(extra);
    let base = client.counters();
    let mut inflight: VecDeque<(u64, ResponseFuture<'_, EchoMsg>)> = VecDeque::with_capacity(WINDOW);
    let mut next = 0u64;
    let mut done = 0u64;
    // Hang guard: some call must complete within `WAIT` of the previous one.
    let mut last_done = (Instant::now(), 0u64);
    while done < N {
        if done != last_done.1 {
            last_done = (Instant::now(), done);
        }
        assert!(
            last_done.0.elapsed() < WAIT,
            "no call completed for {WAIT:?} after {done} of {N}: in flight {:?}; server {:?}, client {:?}",
            inflight.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            server.counters(),
            client.counters()
        );
        while inflight.len() < WINDOW && next < N {
            let len = (next % 97) as usize;
            inflight.push_back((
                next,
                client.unary_async(ECHO, &request(next, len, len), &CallOptions::default()),
            ));
            next += 1;
        }
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
    let c = client.counters();
    assert_eq!(c.rpcs - base.rpcs, N);
    assert_eq!(c.with_code(Code::Ok) - base.with_code(Code::Ok), N);
    match (rnr_before, nic_rnr_stalls()) {
        (Some(before), Some(after)) => assert_eq!(after - before, 0, "RNR waits at the NIC"),
        _ => eprintln!("RNR waits not checked: only the software NIC counts them"),
    }
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
