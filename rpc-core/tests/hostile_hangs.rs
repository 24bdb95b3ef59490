//! Calls that would hang: a client cancel reaches the handler that loops on `is_cancelled` (a
//! deferred `Responder`, an async handler's context handed to another thread, an inline
//! handler's `RequestContext` on the worker thread, a server stream's sink, a client stream's
//! reader), with no deadline set; the server's `max_call_duration`
//! bounds a call whose handler holds its responder forever (and an inline handler's
//! `is_cancelled`); and the client's abandon cap fires when the server granted fewer credits
//! than the window.

mod rpc_support;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::{CallOptions, Client, ServerHandle};
use rpc_support::*;

/// Defers; a thread holds the responder until `is_cancelled`.
const RESPONDER: MethodId = method_id("/test.Hangs/Responder");
/// Async: hands its context to a blocking task that loops until `is_cancelled`.
const ASYNC: MethodId = method_id("/test.Hangs/Async");
/// Server streaming: a thread holds the sink, sending nothing, until `is_cancelled`.
const SINK: MethodId = method_id("/test.Hangs/Sink");
/// Client streaming: a thread holds the reader, reading nothing, until `is_cancelled`.
const SOURCE: MethodId = method_id("/test.Hangs/Source");
/// Inline: loops on the worker until `RequestContext::is_cancelled`, then answers CANCELLED.
const INLINE: MethodId = method_id("/test.Hangs/Inline");

/// What the handlers saw.
#[derive(Default)]
struct Probe {
    /// Handlers that started.
    entered: AtomicU64,
    /// Handlers whose `is_cancelled` turned true.
    saw: AtomicU64,
}

struct Hangs {
    probe: Arc<Probe>,
}

/// Loops until `cancelled()`, then counts it.
fn hold(probe: Arc<Probe>, cancelled: impl Fn() -> bool + Send + 'static) {
    std::thread::spawn(move || {
        while !cancelled() {
            std::thread::sleep(Duration::from_millis(1));
        }
        probe.saw.fetch_add(1, Ordering::AcqRel);
    });
}

impl Service for Hangs {
    const NAME: &'static str = "test.Hangs";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: RESPONDER, name: "/test.Hangs/Responder" },
        MethodDesc { id: ASYNC, name: "/test.Hangs/Async" },
        MethodDesc { id: SINK, name: "/test.Hangs/Sink" },
        MethodDesc { id: SOURCE, name: "/test.Hangs/Source" },
        MethodDesc { id: INLINE, name: "/test.Hangs/Inline" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, _body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let probe = self.probe.clone();
        if method != ASYNC {
            probe.entered.fetch_add(1, Ordering::AcqRel);
        }
        match method {
            RESPONDER => {
                let (responder, reply) = ctx.defer::<EchoMsg>();
                hold(probe, move || responder.is_cancelled());
                out.reply(reply);
            }
            ASYNC => {
                out.reply(spawn_async(&AsyncRuntime::current_or_default(), ctx, move |actx| async move {
                    // Counted once the future runs: a Cancel before that drops it unpolled.
                    probe.entered.fetch_add(1, Ordering::AcqRel);
                    hold(probe, move || actx.is_cancelled());
                    std::future::pending::<Result<EchoMsg, Status>>().await
                }))
            }
            SINK => {
                let (sink, reply) = ctx.stream::<EchoMsg>();
                hold(probe, move || sink.is_cancelled());
                out.reply(reply);
            }
            SOURCE => {
                let requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                hold(probe, move || requests.is_cancelled());
                // Answered by its drop once the call is over.
                std::thread::spawn(move || {
                    while !responder.is_cancelled() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
                out.reply(reply);
            }
            INLINE => {
                while !ctx.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                probe.saw.fetch_add(1, Ordering::AcqRel);
                out.error(Status::cancelled("the handler saw is_cancelled"));
            }
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn start(builder: rpc_core::ServerBuilder) -> (ServerHandle, Arc<Probe>, Client) {
    let probe = Arc::new(Probe::default());
    let server = builder.add_service(Hangs { probe: probe.clone() }).spawn("127.0.0.1:0").unwrap();
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    (server, probe, client)
}

#[track_caller]
fn until(what: &str, client: &Client, probe: &Probe, mut f: impl FnMut(&Probe) -> bool) {
    wait_until(
        what,
        WAIT,
        || {
            client.progress();
            f(probe)
        },
        || {
            format!(
                "entered {}, saw {}",
                probe.entered.load(Ordering::Acquire),
                probe.saw.load(Ordering::Acquire)
            )
        },
    );
}

/// Polls `f` (which progresses the client) until the handler has entered.
fn poll_until_entered<F: Future + Unpin>(f: &mut F, client: &Client, probe: &Probe, n: u64) {
    let mut cx = Context::from_waker(Waker::noop());
    until("the handler to start", client, probe, |p| {
        assert!(std::pin::Pin::new(&mut *f).poll(&mut cx).is_pending(), "the call ended");
        p.entered.load(Ordering::Acquire) >= n
    });
}

/// A client that drops its call (no deadline) reaches the handler holding it: a deferred
/// `Responder`, an async handler's context (`AsyncContext::is_cancelled`, on another thread), an
/// inline handler looping on `RequestContext::is_cancelled` on the worker thread, a server
/// stream's sink and a client stream's reader each see `is_cancelled`. Sabotaged: the async
/// context without the responder's flag (`actx.cancel` unset): "the handlers to see the cancel"
/// gave up with entered 2, saw 1; the inline context without the worker's look into its CQ
/// (`peek` left `None`): gave up with entered 3, saw 2.
#[test]
fn a_dropped_call_reaches_its_handler_without_a_deadline() {
    let (server, probe, client) = start(server());
    let opts = CallOptions::default();
    for (n, method) in [RESPONDER, ASYNC, INLINE].into_iter().enumerate() {
        let mut f = Box::pin(client.unary_async::<_, EchoMsg>(method, &EchoMsg::default(), &opts));
        poll_until_entered(&mut f, &client, &probe, n as u64 + 1);
        drop(f);
        until("the handler to see the cancel", &client, &probe, |p| {
            p.saw.load(Ordering::Acquire) == n as u64 + 1
        });
    }
    let s = client.server_stream::<_, EchoMsg>(SINK, &EchoMsg::default(), &opts).unwrap();
    until("the sink's handler to start", &client, &probe, |p| p.entered.load(Ordering::Acquire) == 4);
    drop(s);
    until("the sink to see the cancel", &client, &probe, |p| p.saw.load(Ordering::Acquire) == 4);
    let s = client.client_stream::<EchoMsg, EchoMsg>(SOURCE, &opts).unwrap();
    until("the reader's handler to start", &client, &probe, |p| p.entered.load(Ordering::Acquire) == 5);
    drop(s);
    until("the reader to see the cancel", &client, &probe, |p| p.saw.load(Ordering::Acquire) == 5);
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

/// The Cancel of a call already waits on the worker when its inline handler starts (it arrived
/// while the worker was held by another handler, so it is polled in the same batch as the
/// request, behind it): `RequestContext::is_cancelled` finds it among the completions the worker
/// has not handled yet. Sabotaged: the worker's look skipping the completions that were in the
/// batch before its `poll_more` (reading only those it adds): "the inline handler to see the
/// cancel" gave up with entered 1, saw 0 (and the test above still passed).
#[test]
fn a_cancel_polled_with_its_request_reaches_the_inline_handler() {
    let (hold_svc, gate) = Hold::new();
    let probe = Arc::new(Probe::default());
    let server = server()
        .add_service(hold_svc)
        .add_service(Hangs { probe: probe.clone() })
        .spawn("127.0.0.1:0")
        .unwrap();
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let opts = CallOptions::default();
    let mut cx = Context::from_waker(Waker::noop());
    let mut held = Box::pin(client.unary_async::<_, EchoMsg>(HOLD, &EchoMsg::default(), &opts));
    wait_until(
        "the held call to reach its handler",
        WAIT,
        || {
            assert!(held.as_mut().poll(&mut cx).is_pending());
            gate.entered()
        },
        String::new,
    );
    let mut inline = Box::pin(client.unary_async::<_, EchoMsg>(INLINE, &EchoMsg::default(), &opts));
    assert!(inline.as_mut().poll(&mut cx).is_pending());
    drop(inline);
    // Both SENDs land in the worker's CQ while its handler holds it.
    for _ in 0..50 {
        client.progress();
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(gate);
    block_on(held).expect("the held call is answered once released");
    until("the inline handler to see the cancel", &client, &probe, |p| {
        p.entered.load(Ordering::Acquire) == 1 && p.saw.load(Ordering::Acquire) == 1
    });
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

/// A call with no deadline whose handler holds its responder forever ends at the server's
/// `max_call_duration`: answered DEADLINE_EXCEEDED naming the setting, and the holder sees
/// `is_cancelled`; so does an async handler's context; an inline handler looping on
/// `RequestContext::is_cancelled` stops that long after its first look. Sabotaged: the worker
/// not giving the session its limit (`set_call_limit` removed): the deferred call never ended
/// (block_on gave up after WAIT); `is_cancelled` without the `limit` check: the inline handler
/// never stopped, and the client closed the session after its `peer_timeout` (UNAVAILABLE).
#[test]
fn max_call_duration_ends_calls_whose_handlers_never_answer() {
    let (server, probe, client) = start(server().max_call_duration(Some(Duration::from_millis(200))));
    for (n, method) in [RESPONDER, ASYNC].into_iter().enumerate() {
        let f = client.unary_async::<_, EchoMsg>(method, &EchoMsg::default(), &CallOptions::default());
        let e = block_on(f).unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
        assert!(e.message().contains("max_call_duration"), "{e}");
        until("the holder to see is_cancelled", &client, &probe, |p| {
            p.saw.load(Ordering::Acquire) == n as u64 + 1
        });
    }
    let e = client.unary::<_, EchoMsg>(INLINE, &EchoMsg::default(), &CallOptions::default()).unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::Cancelled, "the handler saw is_cancelled"));
    // The worker serves on.
    let e =
        block_on(client.unary_async::<_, EchoMsg>(RESPONDER, &EchoMsg::default(), &CallOptions::default()));
    assert_eq!(e.unwrap_err().code(), Code::DeadlineExceeded);
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

/// The call bound fires at its own time whatever timer the session had: on a session whose
/// idle probe set its timer far ahead (the client answers Pings while idle; `peer_timeout` 600 s:
/// a Ping every 200 s) and on one with no timer at all before the call (no probe). The worker
/// visits only the sessions whose timer is due, so a call that brings a deadline must bring the
/// session's timer forward. Sabotaged: the worker's `on_completion` not moving a set timer to the
/// next tick for a call: "peer_timeout Some(600s), call 2: the 200 ms bound ended it after
/// 8.4s" (the probe's timer, 200 s ahead, clamped to the wheel's span); not arming an unset one
/// either: "peer_timeout None, call 2: ... gave up after 60.0s ... (block_on)".
#[test]
fn a_call_bound_ends_the_call_whatever_timer_the_session_had() {
    for peer_timeout in [Some(Duration::from_secs(600)), None] {
        let (server, _probe, client) =
            start(server().max_call_duration(Some(Duration::from_millis(200))).peer_timeout(peer_timeout));
        // The first call ends by the bound, so the session's first timers (set at the connect)
        // have fired: the second finds the probe's timer 200 s ahead, or none.
        for call in 1..=2 {
            let f = client.unary_async::<_, EchoMsg>(RESPONDER, &EchoMsg::default(), &CallOptions::default());
            let started = std::time::Instant::now();
            let e = block_on(f).unwrap_err();
            let took = started.elapsed();
            assert_eq!(e.code(), Code::DeadlineExceeded, "peer_timeout {peer_timeout:?}, call {call}: {e}");
            assert!(
                e.message().contains("max_call_duration"),
                "peer_timeout {peer_timeout:?}, call {call}: {e}"
            );
            // A timer beyond the wheel's span (8.2 s) fires at the span's end: a bound kept late
            // by the far timer ends the call only then (8.4 s). Not a measure of speed: 20 times
            // the bound, half the span.
            assert!(
                took < Duration::from_secs(4),
                "peer_timeout {peer_timeout:?}, call {call}: the 200 ms bound ended it after {took:.1?}"
            );
        }
        drop(client);
        server.shutdown();
    }
}

/// `max_call_duration` 0 is refused at spawn, naming the field. Sabotaged: the check removed:
/// the server spawned.
#[test]
fn a_zero_max_call_duration_is_refused() {
    let r = server()
        .max_call_duration(Some(Duration::ZERO))
        .add_service(TestService::default())
        .spawn("127.0.0.1:0");
    let e = r.err().expect("refused").to_string();
    assert!(e.contains("max_call_duration"), "{e}");
}

/// A server that grants 2 credits to a client whose window is 32 (and `max_abandoned` 32): two
/// calls abandoned on a worker that takes nothing (held inline) reach the cap, and with no
/// acknowledgement within the acknowledgement timeout (5 s without `peer_timeout`) the client
/// resets the session instead of waiting forever. Then the client reconnects and serves.
/// Sabotaged: the cap clamped to the window alone: the session was never reset (the waiting
/// call ended DEADLINE_EXCEEDED at its hang guard).
#[test]
fn the_abandon_cap_fires_when_the_server_granted_fewer_credits_than_the_window() {
    let (hold_svc, gate) = Hold::new();
    let server = server()
        .credits_per_session(2)
        .add_service(hold_svc)
        .add_service(TestService::default())
        .spawn("127.0.0.1:0")
        .unwrap();
    let config = client_config().peer_timeout(None).window(32).max_abandoned(32);
    let client = Client::connect_with(server.local_addr(), &config).unwrap();
    let opts = CallOptions::default();
    let mut cx = Context::from_waker(Waker::noop());
    let mut calls: Vec<_> = (0..2)
        .map(|_| Box::pin(client.unary_async::<_, EchoMsg>(HOLD, &EchoMsg::default(), &opts)))
        .collect();
    wait_until(
        "the held call to reach its handler",
        WAIT,
        || {
            for f in &mut calls {
                assert!(f.as_mut().poll(&mut cx).is_pending());
            }
            gate.entered()
        },
        String::new,
    );
    drop(calls);
    // A call waiting for a slot (both are held by the abandoned calls) progresses the session;
    // the deadline is a hang guard.
    let e = client.unary::<_, EchoMsg>(ECHO, &request(0, 8, 8), &CallOptions::deadline(WAIT)).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("max_abandoned"), "{e}");
    drop(gate);
    let r = client.unary::<_, EchoMsg>(ECHO, &request(1, 8, 8), &opts).expect("a call on a new session");
    check_reply(&r, 1, 8);
    drop(client);
    server.shutdown();
}
