//! Backpressure, not refusal (issue 11, part 4): a call that finds every slot taken waits for
//! one (in order, encoded once) instead of failing; only the configured bound on waiting calls
//! (`ClientConfig::max_queued_calls`) refuses; starting an async call never blocks.

mod rpc_support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// Polls every future round robin until all are ready; outputs in their order.
///
/// # Panics
/// When no future gets ready for [`WAIT`] (naming those still pending).
#[track_caller]
fn join_all<T>(mut futs: Vec<ResponseFuture<'_, T>>) -> Vec<Result<T, Status>>
where
    T: Message + Default,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut out: Vec<Option<Result<T, Status>>> = futs.iter().map(|_| None).collect();
    let mut left = futs.len();
    let mut last = (Instant::now(), left);
    while left > 0 {
        if left != last.1 {
            last = (Instant::now(), left);
        }
        if last.0.elapsed() >= WAIT {
            let pending: Vec<usize> =
                out.iter().enumerate().filter(|(_, o)| o.is_none()).map(|(i, _)| i).collect();
            panic!("join_all: no call ended for {WAIT:?}; {left} pending: {pending:?}");
        }
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let Poll::Ready(r) = Pin::new(f).poll(&mut cx) {
                    *o = Some(r);
                    left -= 1;
                }
            }
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn hundred_concurrent_async_calls_on_a_default_client_all_succeed() {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let futs: Vec<_> = (0..100u64)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 24, 24), &CallOptions::default()))
        .collect();
    // The default window is 32: at least the rest wait for a slot.
    assert!(client.queued_calls() >= 68, "{} calls queued", client.queued_calls());
    for (i, r) in join_all(futs).into_iter().enumerate() {
        check_reply(&r.unwrap_or_else(|s| panic!("call {i}: {s}")), i as u64, 24);
    }
    assert_eq!(client.queued_calls(), 0);
    let c = client.counters();
    assert_eq!(c.with_code(Code::Ok), 100);
    drop(client);
    server.shutdown();
}

#[test]
fn two_thousand_async_calls_the_excess_over_the_bound_is_refused_naming_the_field() {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let futs: Vec<_> = (0..2000u64)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 16, 16), &CallOptions::default()))
        .collect();
    assert_eq!(client.queued_calls(), 1024, "the default bound, full");
    let results = join_all(futs);
    let ok = results.iter().take_while(|r| r.is_ok()).count();
    // Those in slots (at most the window of 32) plus the 1024 that waited succeed, in order.
    assert!((1025..=1024 + 32).contains(&ok), "{ok} succeeded");
    for (i, r) in results.iter().enumerate() {
        match r {
            Ok(m) => check_reply(m, i as u64, 16),
            Err(s) => {
                assert!(i >= ok, "call {i} failed before a later one succeeded: {s}");
                assert_eq!(s.code(), Code::ResourceExhausted, "call {i}: {s}");
                assert!(s.message().contains("ClientConfig::max_queued_calls"), "{s}");
            }
        }
    }
    let c = client.counters();
    assert_eq!(c.with_code(Code::Ok), ok as u64);
    assert_eq!(c.with_code(Code::ResourceExhausted), (2000 - ok) as u64);
    // The queue drained: the client works on.
    check_reply(&client.unary(ECHO, &request(5000, 8, 8), &CallOptions::default()).unwrap(), 5000, 8);
    drop(client);
    server.shutdown();
}

#[test]
fn a_bound_of_zero_refuses_a_call_that_finds_the_window_full() {
    let (server, _) = spawn(server());
    let cfg = client_config().window(4).max_queued_calls(0);
    let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
    let futs: Vec<_> = (0..4)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 8, 8), &CallOptions::default()))
        .collect();
    // Refused at the start: ready at the first poll (it would wait forever otherwise, since
    // the four are not polled).
    let mut over = client.unary_async::<_, EchoMsg>(ECHO, &request(9, 8, 8), &CallOptions::default());
    let Poll::Ready(r) = Pin::new(&mut over).poll(&mut Context::from_waker(Waker::noop())) else {
        panic!("the call waits for a slot with max_queued_calls(0)");
    };
    drop(over);
    let err = r.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("ClientConfig::max_queued_calls (0)"), "{err}");
    for (i, r) in join_all(futs).into_iter().enumerate() {
        check_reply(&r.unwrap(), i as u64, 8);
    }
    drop(client);
    server.shutdown();
}

#[test]
fn a_blocking_call_with_a_full_window_waits_for_a_slot_and_succeeds() {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().window(4)).unwrap();
    // Four calls answered 200 ms from now, abandoned: their slots free when the late answers
    // arrive.
    for i in 0..4 {
        let f = client.unary_async::<_, EchoMsg>(DEFER, &request(i, 1, 200), &CallOptions::default());
        drop(f);
    }
    let r = client.unary::<_, EchoMsg>(ECHO, &request(7, 10, 10), &CallOptions::default());
    check_reply(&r.unwrap(), 7, 10);
    assert!(client.counters().late_replies >= 1, "a late answer freed the slot");
    drop(client);
    server.shutdown();
}

#[test]
fn a_blocking_call_behind_slots_only_futures_can_free_fails_at_once_instead_of_hanging() {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    let held: Vec<_> = (0..2)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 8, 8), &CallOptions::default()))
        .collect();
    // Nobody can poll `held` while the blocking call waits: it could only end at its deadline.
    let err = client
        .unary::<_, EchoMsg>(ECHO, &request(9, 8, 8), &CallOptions::deadline(Duration::from_secs(20)))
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("ClientConfig::window"), "{err}");
    for (i, r) in join_all(held).into_iter().enumerate() {
        check_reply(&r.unwrap(), i as u64, 8);
    }
    drop(client);
    server.shutdown();
}

/// Waits until the server has published at least `n` answered RPCs, then a little longer, and
/// returns the count.
fn server_rpcs_settled(server: &rpc_core::ServerHandle, n: u64) -> u64 {
    wait_until(
        &format!("the server to publish {n} answered RPCs"),
        WAIT,
        || server.counters().rpcs >= n,
        || format!("server {:?}", server.counters()),
    );
    std::thread::sleep(Duration::from_millis(100));
    server.counters().rpcs
}

#[test]
fn a_waiting_call_whose_deadline_passes_ends_deadline_exceeded_and_is_never_sent() {
    let (server, stash) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    // Two calls the server holds: the window is full.
    let held: Vec<_> = (0..2)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &CallOptions::default()))
        .collect();
    wait_stashed("the 2 held calls to reach the server", 2, &stash, &client, &server);
    let late = client.unary_async::<_, EchoMsg>(
        ECHO,
        &request(3, 8, 8),
        &CallOptions::deadline(Duration::from_millis(50)),
    );
    // Another, not polled until the window frees: the queue itself must expire it. Its
    // deadline is later than `late`'s (with the same one, a loaded machine could see both pass
    // in the poll that ends `late`).
    let unpolled = client.unary_async::<_, EchoMsg>(
        ECHO,
        &request(5, 8, 8),
        &CallOptions::deadline(Duration::from_millis(300)),
    );
    let unpolled_deadline = Instant::now() + Duration::from_millis(300);
    assert_eq!(client.queued_calls(), 2);
    let err = block_on(late).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(err.message().contains("never sent"), "{err}");
    assert_eq!(client.queued_calls(), 1);
    // Past `unpolled`'s deadline before anything frees a slot for it.
    std::thread::sleep(unpolled_deadline.saturating_duration_since(Instant::now()));
    // Free the window; a later call goes on the wire after anything sent before it.
    for (i, r) in stash.lock().unwrap().drain(..).enumerate() {
        r.send(Ok(EchoMsg { seq: i as u64, ..Default::default() }));
    }
    for r in join_all(held) {
        r.unwrap();
    }
    let err = block_on(unpolled).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert_eq!(client.queued_calls(), 0);
    check_reply(&client.unary(ECHO, &request(4, 8, 8), &CallOptions::default()).unwrap(), 4, 8);
    // Two stashed and the last one: the expired calls never reached the server.
    assert_eq!(server_rpcs_settled(&server, 3), 3);
    assert_eq!(client.counters().with_code(Code::DeadlineExceeded), 2);
    drop(client);
    server.shutdown();
}

#[test]
fn a_dropped_waiting_call_is_never_sent() {
    let (server, stash) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().window(1)).unwrap();
    let held = client.unary_async::<_, EchoMsg>(STASH, &request(0, 8, 0), &CallOptions::default());
    wait_until(
        "the held call to reach the server",
        WAIT,
        || {
            client.progress();
            !stash.lock().unwrap().is_empty()
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    drop(client.unary_async::<_, EchoMsg>(ECHO, &request(1, 8, 8), &CallOptions::default()));
    assert_eq!(client.queued_calls(), 0, "dropping the future removed the waiting call");
    stash.lock().unwrap().pop().unwrap().send(Ok(EchoMsg::default()));
    block_on(held).unwrap();
    check_reply(&client.unary(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap(), 2, 8);
    assert_eq!(server_rpcs_settled(&server, 2), 2);
    drop(client);
    server.shutdown();
}

/// Echo, after waiting (on the worker thread: the whole server stalls) for the gate to open.
struct Gated {
    gate: Arc<(Mutex<bool>, Condvar)>,
}

const GATED: MethodId = method_id("/test.Gated/Echo");

impl Service for Gated {
    const NAME: &'static str = "test.Gated";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: GATED, name: "/test.Gated/Echo" }];

    fn call(&self, _method: MethodId, _ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let (open, cv) = &*self.gate;
        let mut g = open.lock().unwrap();
        while !*g {
            g = cv.wait(g).unwrap();
        }
        drop(g);
        match decode::<EchoMsg>(body) {
            Ok(req) => {
                let p = payload(req.seq ^ 0xffff, req.reply_len as usize);
                out.reply(Reply::from(EchoMsg {
                    seq: req.seq,
                    checksum: fnv64(&p),
                    payload: p,
                    reply_len: 0,
                }))
            }
            Err(s) => out.error(s),
        }
    }
}

fn open_gate(gate: &(Mutex<bool>, Condvar)) {
    *gate.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
    gate.1.notify_all();
}

/// Opens the gate when dropped, so that a failing test unwinds instead of hanging in the server's
/// shutdown (its worker would wait at the gate forever).
struct OpenOnDrop(Arc<(Mutex<bool>, Condvar)>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        open_gate(&self.0);
    }
}

#[test]
fn starting_async_calls_against_a_stalled_server_returns_at_once() {
    const N: u64 = 40;
    const LEN: usize = 16 << 10; // above the eager threshold: through the server's ring
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let server =
        server().ring_bytes(64 << 10).add_service(Gated { gate: gate.clone() }).spawn("127.0.0.1:0").unwrap();
    let _open = OpenOnDrop(gate.clone());
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    // If starting blocked (waiting for ring room the stalled server never frees), only this
    // watchdog would end it, much later: it records that it had to.
    let started = Arc::new(AtomicBool::new(false));
    let watchdog_fired = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (gate, started, fired) = (gate.clone(), started.clone(), watchdog_fired.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(30);
            while !started.load(Ordering::Acquire) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !started.load(Ordering::Acquire) {
                fired.store(true, Ordering::Release);
                open_gate(&gate);
            }
        })
    };
    // The 64 KiB ring holds 4 such bodies and the staging area 8 more; 40 are started.
    let futs: Vec<_> = (0..N)
        .map(|i| client.unary_async::<_, EchoMsg>(GATED, &request(i, LEN, 8), &CallOptions::default()))
        .collect();
    started.store(true, Ordering::Release);
    assert!(
        !watchdog_fired.load(Ordering::Acquire),
        "starting the calls blocked until the watchdog opened the gate"
    );
    assert!(client.queued_calls() > 0, "some calls wait for ring room");
    open_gate(&gate);
    for (i, r) in join_all(futs).into_iter().enumerate() {
        check_reply(&r.unwrap_or_else(|s| panic!("call {i}: {s}")), i as u64, 8);
    }
    watchdog.join().unwrap();
    drop(client);
    server.shutdown();
}
