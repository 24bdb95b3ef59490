//! A peer that goes away: every in-flight call ends UNAVAILABLE and resources are freed; the
//! server frees a vanished client's session.

mod rpc_support;

use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// A server shut down with 10 calls in flight, their futures not polled yet: each ends
/// UNAVAILABLE when polled, and so does the next call. (The endpoint's progress thread's look
/// may see the session end before the futures do: either way the calls end in
/// `ClientCore::break_conn`.) Sabotaged (`break_conn` not failing the calls in flight,
/// `fail_calls` skipped): failed with "gave up after 60.0s waiting for a future to be ready
/// (block_on)".
#[test]
fn server_killed_with_calls_in_flight_fails_them_all_unavailable() {
    let (server, stash) = spawn(server().drain_timeout(Duration::ZERO));
    let client = Client::connect_with(server.local_addr(), &client_config().window(16)).unwrap();
    check_reply(&client.unary(ECHO, &request(1, 4, 4), &CallOptions::default()).unwrap(), 1, 4);
    let futs: Vec<_> = (0..10u64)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 64, 0), &CallOptions::default()))
        .collect();
    // All ten reached the handler (it keeps their responders and never answers).
    wait_stashed("the 10 STASH calls to reach their handler", 10, &stash, &client, &server);
    server.shutdown();
    for f in futs {
        let err = block_on(f).unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    }
    let err = client.unary::<_, EchoMsg>(ECHO, &request(2, 4, 4), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(client.closed_reason().is_some());
    assert_eq!(client.counters().with_code(Code::Unavailable), 10);
    // Answering now goes nowhere and does not panic.
    for r in stash.lock().unwrap().drain(..) {
        r.send(Ok(EchoMsg::default()));
    }
}

#[test]
fn client_gone_frees_its_session_and_others_continue() {
    let (server, _) = spawn(server());
    let keep = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    for round in 0..5u64 {
        let gone = Client::connect_with(server.local_addr(), &client_config()).unwrap();
        let _pending = gone.unary_async::<_, EchoMsg>(DEFER, &request(round, 8, 5), &CallOptions::default());
        check_reply(&gone.unary(ECHO, &request(round, 8, 8), &CallOptions::default()).unwrap(), round, 8);
        drop(_pending);
        drop(gone);
        check_reply(
            &keep.unary(ECHO, &request(50 + round, 8, 8), &CallOptions::default()).unwrap(),
            50 + round,
            8,
        );
    }
    wait_until(
        "the server to close the 5 gone clients' sessions",
        WAIT,
        || {
            keep.progress();
            server.counters().sessions_closed >= 5
        },
        || format!("server {:?}, kept client {:?}", server.counters(), keep.counters()),
    );
    assert_eq!(server.counters().sessions_opened, 6);
    drop(keep);
    server.shutdown();
}
