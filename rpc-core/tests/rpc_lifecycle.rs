//! The call lifecycle end to end on `sim`: a dropped future reaches the server as a Cancel and
//! its slot comes back.
//! (The server's own DEADLINE_EXCEEDED and Cancel handling on the wire are in breaker.rs, with
//! its raw client; the idle probe against a stopped server process in sim_two_process_rpc.rs.)

mod rpc_support;

use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// A window of calls the server never answers (STASH keeps the responders), their futures
/// dropped: each sends a Cancel (the server counts it and answers CANCELLED, its responder
/// sees `is_cancelled`), and more calls than the window succeed afterwards. Before
/// cancellation on the wire, the four abandoned calls held the window forever: every later call
/// failed RESOURCE_EXHAUSTED.
#[test]
fn cancelled_and_dropped_futures_reach_the_server_and_their_slots_come_back() {
    let (server, stash) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().window(4)).unwrap();
    let mut futs: Vec<_> = (0..4u64)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &CallOptions::default()))
        .collect();
    // Let the handlers run (and stash their responders) before the futures go.
    wait_stashed("the 4 STASH handlers to run", 4, &stash, &client, &server);
    // Two cancelled explicitly, two dropped: the same on the wire.
    futs.drain(..2).for_each(ResponseFuture::cancel);
    assert_eq!(client.counters().cancels, 2, "one Cancel per cancelled future");
    drop(futs);
    assert_eq!(client.counters().cancels, 4, "one Cancel per dropped future");
    for i in 0..12u64 {
        let r = client
            .unary::<_, EchoMsg>(ECHO, &request(i, 16, 16), &CallOptions::deadline(Duration::from_secs(5)))
            .unwrap_or_else(|e| panic!("call {i} after the dropped futures: {e}"));
        check_reply(&r, i, 16);
    }
    wait_until(
        "the server to count the 4 Cancels",
        WAIT,
        || server.counters().cancels >= 4,
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    assert!(stash.lock().unwrap().iter().all(Responder::is_cancelled), "every responder was told");
    // The twelve calls needed only one abandoned slot back (its CANCELLED answer and its
    // CancelAck); nothing orders the other three answers before their replies, so wait for them.
    wait_until(
        "the four CANCELLED answers to arrive and be discarded",
        WAIT,
        || {
            client.progress();
            client.counters().late_replies >= 4
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    let c = client.counters();
    assert_eq!(c.late_replies, 4, "the four CANCELLED answers were discarded as acknowledgements");
    // A late answer from a responder whose call was cancelled is dropped and counted.
    for r in stash.lock().unwrap().drain(..) {
        r.send(Ok(EchoMsg::default()));
    }
    wait_until(
        "the server to drop and count the 4 late answers of cancelled calls",
        WAIT,
        || server.counters().late_answers >= 4,
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    check_reply(&client.unary(ECHO, &request(99, 4, 4), &CallOptions::default()).unwrap(), 99, 4);
    assert_eq!(client.counters().malformed, 0);
    drop(client);
    server.shutdown();
}

/// A call dropped before it was sent (it waited for a credit) never reaches the server: its
/// slot is free at once and no Cancel is sent for it.
#[test]
fn a_future_dropped_before_its_call_was_sent_frees_its_slot_without_a_cancel() {
    let (server, stash) = spawn(server().credits_per_session(1));
    let client = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    let first = client.unary_async::<_, EchoMsg>(STASH, &request(0, 8, 0), &CallOptions::default());
    let queued = client.unary_async::<_, EchoMsg>(STASH, &request(1, 8, 0), &CallOptions::default());
    drop(queued);
    assert_eq!(client.counters().cancels, 0, "nothing to cancel at the server");
    wait_until(
        "the first STASH call to reach its handler",
        WAIT,
        || {
            client.progress();
            !stash.lock().unwrap().is_empty()
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    stash.lock().unwrap().pop().unwrap().send(Ok(EchoMsg { seq: 7, ..Default::default() }));
    assert_eq!(block_on(first).unwrap().seq, 7);
    check_reply(&client.unary(ECHO, &request(3, 4, 4), &CallOptions::default()).unwrap(), 3, 4);
    assert_eq!(stash.lock().unwrap().len(), 0, "the dropped call's handler never ran");
    drop(client);
    server.shutdown();
}

/// Runs inline on the worker for `reply_len` ms: while it runs, that worker reads nothing, so
/// the Cancels of other calls wait unacknowledged.
struct Sleeper(std::sync::Arc<std::sync::atomic::AtomicBool>);

const SLEEP: MethodId = method_id("/test.Sleeper/Sleep");

impl Service for Sleeper {
    const NAME: &'static str = "test.Sleeper";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: SLEEP, name: "/test.Sleeper/Sleep" }];

    fn call(&self, _: MethodId, _: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let req = match decode::<EchoMsg>(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        self.0.store(true, std::sync::atomic::Ordering::Release);
        std::thread::sleep(Duration::from_millis(u64::from(req.reply_len)));
        out.reply(Reply::from(EchoMsg { seq: req.seq, ..Default::default() }));
    }
}

/// Dropping futures never waits, even when the abandoned calls reach `max_abandoned` while the
/// server cannot acknowledge them (its only worker is busy in a 2 s handler): the session
/// watches for an acknowledgement instead (`session::calls`), the acknowledgements arrive once
/// the worker runs again, and the session goes on (no reset, no reconnect). Before, the second
/// drop polled in the dropping thread until an acknowledgement came (about 2 s here).
#[test]
fn dropping_futures_at_the_abandon_cap_never_blocks() {
    let sleeping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (server, stash) = spawn(server().add_service(Sleeper(sleeping.clone())));
    let cfg = client_config().window(4).max_abandoned(2).peer_timeout(Some(Duration::from_secs(20)));
    let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
    let futs: Vec<_> = (0..2u64)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &CallOptions::default()))
        .collect();
    wait_stashed("the 2 STASH handlers to run", 2, &stash, &client, &server);
    // A second client occupies the server's only worker for 2 s.
    let other = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let slow = other.unary_async::<_, EchoMsg>(SLEEP, &request(9, 0, 2000), &CallOptions::default());
    wait_until(
        "the slow handler to start",
        WAIT,
        || {
            other.progress();
            sleeping.load(std::sync::atomic::Ordering::Acquire)
        },
        || format!("server {:?}, second client {:?}", server.counters(), other.counters()),
    );
    let t = Instant::now();
    drop(futs);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1), "dropping two futures at the cap took {took:?}");
    assert_eq!(client.counters().cancels, 2);
    assert_eq!(block_on(slow).unwrap().seq, 9);
    // The acknowledgements arrive; the slots come back on the same session.
    for i in 0..8u64 {
        let r = client
            .unary::<_, EchoMsg>(ECHO, &request(i, 16, 16), &CallOptions::deadline(Duration::from_secs(10)))
            .unwrap_or_else(|e| panic!("call {i} after the drops: {e}"));
        check_reply(&r, i, 16);
    }
    assert!(client.closed_reason().is_none());
    assert_eq!(client.reconnect_attempts(), 0);
    // The eight calls needed no abandoned slot back (two of the four are free): nothing orders the
    // CANCELLED answers before their replies, so wait for them.
    wait_until(
        "both CANCELLED answers to arrive and be discarded",
        WAIT,
        || {
            client.progress();
            client.counters().late_replies >= 2
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    assert_eq!(client.counters().late_replies, 2, "both acknowledgements discarded");
    drop((client, other));
    server.shutdown();
}
