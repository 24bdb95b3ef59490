//! Two workers and 64 sessions driven from one thread: connections spread over the workers and
//! every reply reaches its own session.

mod rpc_support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

#[test]
fn two_workers_and_64_sessions() {
    let (server, _) = spawn(server().worker_cores(vec![0, 1]).credits_per_session(4).ring_bytes(64 * 1024));
    let cfg = client_config().window(4).ring_bytes(64 * 1024).eager_threshold(1024);
    let clients: Vec<Client> =
        (0..64).map(|_| Client::connect_with(server.local_addr(), &cfg).unwrap()).collect();
    let mut cx = Context::from_waker(Waker::noop());
    for round in 0..20u64 {
        let mut futs: Vec<(u64, usize, ResponseFuture<'_, EchoMsg>)> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let seq = round * 1000 + i as u64;
                let len = if i % 8 == 0 { 3000 } else { 16 };
                (seq, len, c.unary_async(ECHO, &request(seq, len, len), &CallOptions::default()))
            })
            .collect();
        let left = std::cell::Cell::new(futs.len());
        wait_until(
            &format!("round {round}'s 64 calls to be answered"),
            WAIT,
            || {
                futs.retain_mut(|(seq, len, f)| match Pin::new(f).poll(&mut cx) {
                    Poll::Ready(r) => {
                        check_reply(&r.unwrap(), *seq, *len);
                        false
                    }
                    Poll::Pending => true,
                });
                left.set(futs.len());
                futs.is_empty()
            },
            || format!("{} calls unanswered; server {:?}", left.get(), server.counters()),
        );
    }
    for c in &clients {
        assert_eq!(c.counters().rpcs, 20);
    }
    drop(clients);
    wait_until(
        "the server to publish the 64 dropped clients' sessions closed",
        WAIT,
        || server.counters().sessions_closed >= 64,
        || format!("server {:?}, per worker {:?}", server.counters(), server.worker_counters()),
    );
    let c = server.counters();
    assert_eq!(c.sessions_opened, 64);
    assert_eq!(c.rpcs, 64 * 20);
    // Both workers served: connections go to the least-loaded worker, 32 each.
    let per_worker: Vec<(u64, u64)> =
        server.worker_counters().iter().map(|w| (w.sessions_opened, w.rpcs)).collect();
    assert_eq!(per_worker, [(32, 32 * 20), (32, 32 * 20)], "(sessions, rpcs) per worker");
    server.shutdown();
}

/// A client that connects while its worker is busy (a handler holding it for longer than the
/// listener once waited for a window bind, 2 s) gets its session once the worker binds the
/// window: the worker wakes the listener then, and the listener does not give up before
/// `handshake_timeout`.
#[test]
fn a_handshake_waits_for_a_busy_worker_to_bind_the_window() {
    use std::time::Duration;
    // The gate releases the worker also when an assertion fails (else it would hold shutdown).
    let (hold, gate) = Hold::new();
    let server = server()
        .handshake_timeout(Duration::from_secs(30))
        .add_service(hold)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    let addr = server.local_addr();
    let cfg = client_config().connect_timeout(Duration::from_secs(30));
    let first = Client::connect_with(addr, &cfg).unwrap();
    let mut call = first.unary_async::<_, EchoMsg>(HOLD, &EchoMsg::default(), &CallOptions::default());
    let mut cx = Context::from_waker(Waker::noop());
    wait_until(
        "the HOLD call to reach its handler",
        WAIT,
        || {
            assert!(Pin::new(&mut call).poll(&mut cx).is_pending());
            gate.entered()
        },
        || format!("server {:?}, client {:?}", server.counters(), first.counters()),
    );
    // The worker is held in the handler: a new session's window is not bound until it returns.
    let cfg2 = cfg.clone();
    let second = std::thread::spawn(move || Client::connect_with(addr, &cfg2));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!second.is_finished(), "the second client's handshake was answered while its worker was held");
    drop(gate);
    block_on(call).unwrap();
    let second = second.join().unwrap().unwrap_or_else(|e| panic!("the second client: {e}"));
    let _: EchoMsg = second.unary(HOLD, &EchoMsg::default(), &CallOptions::default()).unwrap();
    drop((first, second));
    server.shutdown();
}

/// A handler that never returns does not hang the server's shutdown: once `drain_timeout` and
/// the 5 s grace after it have passed, `shutdown` leaves the held worker running (an error is
/// logged) and returns; the worker finishes when the handler returns. (Before, `shutdown` joined
/// the worker, so it blocked as long as the handler did.)
#[test]
fn shutdown_returns_while_an_inline_handler_never_does() {
    use std::time::Duration;
    let (hold, gate) = Hold::new();
    let server = server()
        .drain_timeout(Duration::from_millis(100))
        .add_service(hold)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    let addr = server.local_addr();
    let holder = std::thread::spawn(move || {
        let c = Client::connect_with(addr, &client_config()).unwrap();
        // Answered once the gate opens, or UNAVAILABLE when the server closed the session first.
        let _ = c.unary::<_, EchoMsg>(HOLD, &EchoMsg::default(), &CallOptions::default());
    });
    wait_until(
        "the HOLD call to reach its handler",
        WAIT,
        || gate.entered(),
        || format!("{:?}", server.counters()),
    );
    let (done, returned) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        server.shutdown();
        let _ = done.send(());
    });
    // 100 ms + 5 s is what shutdown may take; 30 s is a hang guard (test.Hold itself gives up
    // after WAIT, 60 s, so a shutdown that waits for the handler returns only after that).
    let in_time = returned.recv_timeout(Duration::from_secs(30)).is_ok();
    drop(gate);
    assert!(in_time, "shutdown waited for a handler that does not return");
    holder.join().unwrap();
}
