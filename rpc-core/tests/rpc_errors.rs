//! Status codes end to end: unknown method, undecodable body, handler panic (the worker
//! survives), deadline expiry (the late reply is discarded, never delivered to a reused slot),
//! deferred answers from another thread, a dropped responder.

mod rpc_support;

use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

fn setup() -> (rpc_core::ServerHandle, Client) {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    (server, client)
}

#[test]
fn unknown_method_is_unimplemented() {
    let (server, client) = setup();
    let err = client.unary::<_, EchoMsg>(UNKNOWN, &request(1, 4, 4), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    // The server names only the id (the raw client registered no name for it).
    assert_eq!(err.message(), format!("method id {UNKNOWN:#010x} is not served by this server"));
    check_reply(&client.unary(ECHO, &request(2, 4, 4), &CallOptions::default()).unwrap(), 2, 4);
    drop(client);
    server.shutdown();
}

#[test]
fn undecodable_body_is_invalid_argument() {
    let (server, client) = setup();
    let err = client
        .unary::<_, EchoMsg>(ECHO, &WrongShape { text: "not a number".into() }, &CallOptions::default())
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("EchoMsg"), "{}", err.message());
    drop(client);
    server.shutdown();
}

#[test]
fn handler_panic_is_internal_and_the_worker_survives() {
    let (server, client) = setup();
    for seq in 0..3 {
        let err =
            client.unary::<_, EchoMsg>(PANIC, &request(seq, 4, 4), &CallOptions::default()).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(err.message().contains("panicked"), "{}", err.message());
        assert!(err.message().contains("/test.Echo/Panic"), "{}", err.message());
        check_reply(
            &client.unary(ECHO, &request(100 + seq, 4, 4), &CallOptions::default()).unwrap(),
            100 + seq,
            4,
        );
    }
    drop(client);
    server.shutdown();
}

#[test]
fn deadline_expires_and_the_late_reply_is_discarded() {
    let (server, client) = setup();
    // The handler answers after 300 ms from another thread; the caller waits 20 ms.
    let err = client
        .unary::<_, EchoMsg>(DEFER, &request(1, 0, 300), &CallOptions::deadline(Duration::from_millis(20)))
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    // The slot stays reserved until the server can no longer answer into it; new calls use other
    // slots and get their own answers, never the late one.
    for seq in 10..20 {
        check_reply(&client.unary(ECHO, &request(seq, 8, 8), &CallOptions::default()).unwrap(), seq, 8);
    }
    // The server answered the call itself (DEADLINE_EXCEEDED at the deadline it was sent, or
    // CANCELLED on the client's Cancel), so the handler's answer 300 ms later finds it answered and
    // is dropped at the server. Which reached the client first is a race: the server's answer, if
    // it came in before the client's own deadline check (the call then ends with it), or the
    // client's abandon, when the server's answer is a late reply the client discards. Either way
    // the client ends the call DEADLINE_EXCEEDED once and sees nothing more of it.
    wait_until(
        "the server to drop the handler's answer 300 ms after the deadline",
        WAIT,
        || {
            client.progress();
            server.counters().late_answers > 0
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    assert_eq!(server.counters().late_answers, 1);
    let counters = client.counters();
    assert!(counters.late_replies <= 1, "{counters:?}");
    assert_eq!(counters.with_code(Code::DeadlineExceeded), 1, "{counters:?}");
    check_reply(&client.unary(ECHO, &request(30, 8, 8), &CallOptions::default()).unwrap(), 30, 8);
    drop(client);
    server.shutdown();
}

#[test]
fn deferred_answers_come_from_another_thread() {
    let (server, client) = setup();
    let futs: Vec<_> = (0..8u64)
        .map(|i| {
            client.unary_async::<_, EchoMsg>(
                DEFER,
                &request(i, 0, (8 - i as usize) * 2),
                &CallOptions::default(),
            )
        })
        .collect();
    for (i, f) in futs.into_iter().enumerate() {
        assert_eq!(block_on(f).unwrap().seq, i as u64);
    }
    let err =
        client.unary::<_, EchoMsg>(DROP_RESPONDER, &request(9, 0, 0), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Cancelled);
    drop(client);
    server.shutdown();
}

#[test]
fn bad_configuration_names_the_field() {
    let err = rpc_core::Server::builder().ring_bytes(0).spawn("127.0.0.1:0").err().unwrap();
    assert!(err.to_string().contains("ring_bytes"), "{err}");
    let err = rpc_core::Server::builder()
        .credits_per_session(100)
        .srq_depth(50)
        .spawn("127.0.0.1:0")
        .err()
        .unwrap();
    assert!(err.to_string().contains("srq_depth"), "{err}");
    struct Twice;
    impl Service for Twice {
        const NAME: &'static str = "test.Twice";
        const METHODS: &'static [MethodDesc] = &[MethodDesc { id: ECHO, name: "/test.Twice/Echo" }];
        fn call(&self, _: MethodId, _: &RequestContext, _: Body<'_>, out: &mut ReplyWriter<'_>) {
            out.error(Status::internal("unused"));
        }
    }
    let err = rpc_core::Server::builder()
        .add_service(TestService::default())
        .add_service(Twice)
        .spawn("127.0.0.1:0")
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(text.contains("/test.Echo/Echo") && text.contains("/test.Twice/Echo"), "{text}");
    let err = Client::connect_with("127.0.0.1:1", &client_config().window(0)).err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[test]
fn auth_token_is_checked() {
    let (server, _) = spawn(server().auth_token(b"sesame".to_vec()));
    let err = Client::connect_with(server.local_addr(), &client_config().auth_token(b"wrong".to_vec()))
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("auth_token"), "{}", err.message());
    let client =
        Client::connect_with(server.local_addr(), &client_config().auth_token(b"sesame".to_vec())).unwrap();
    check_reply(&client.unary(ECHO, &request(1, 4, 4), &CallOptions::default()).unwrap(), 1, 4);
    drop(client);
    server.shutdown();
}

/// Both sides block on their completion channels between calls and are woken by completion
/// events, not by the 1 ms bound on each wait: on sim the NIC counts the events delivered (no
/// other test of this binary arms a CQ, so they are this test's). A policy that never armed or
/// never waited would still answer every call, a millisecond late, and fail here.
#[test]
fn event_polling_server_answers_after_sleeping() {
    use rpc_core::PollingPolicy;
    let events =
        || matches!(transport(), rpc_core::Transport::Sim).then(|| rpc_core::verbs::sim::stats().cq_events);
    let before = events();
    let (server, _) = spawn(server().polling(PollingPolicy::Event { spins: 10 }));
    let client = Client::connect_with(
        server.local_addr(),
        &client_config().polling(PollingPolicy::Event { spins: 10 }),
    )
    .unwrap();
    for seq in 0..50u64 {
        if seq % 10 == 0 {
            // Let both sides block on their completion channels.
            std::thread::sleep(Duration::from_millis(5));
        }
        check_reply(&client.unary(ECHO, &request(seq, 100, 100), &CallOptions::default()).unwrap(), seq, 100);
    }
    match (before, events()) {
        // After each of the 5 sleeps at least the server's CQ, armed and waited on, gets the
        // request's completion as an event.
        (Some(b), Some(a)) => assert!(a - b >= 5, "{} completion events delivered", a - b),
        _ => eprintln!("completion events not counted: only the software NIC counts them"),
    }
    drop(client);
    server.shutdown();
}
