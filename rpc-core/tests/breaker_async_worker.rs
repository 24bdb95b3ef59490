//! Breaking the worker's executor of async handlers (`dispatch/local.rs`, `spawn_async`,
//! `spawn_async_stream`) and deadline propagation (`context.rs`, `CallOptions`): futures that wake
//! themselves forever, stale wakers hammered from many threads after their slot was reused,
//! thousands of pending tasks whose session closes, panics after the first poll, contexts kept
//! after their call, streams that end at their first poll, calls a handler makes through a
//! `Channel` and whose own call is cancelled, shutdown with pending tasks, tokio timers in a
//! service made outside any runtime, the `Event` policy woken from another thread, and calls
//! made with a deadline that passed (inherited, or `deadline_at`) or that passes while queued.
//! Everything counts; nothing is timed.

mod rpc_support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::{Channel, ChannelConfig, Client, PollingPolicy, ServerHandle};
use rpc_support::*;

/// Wakes itself at every poll, forever (counts its polls in `spin_polls`).
const SPIN: MethodId = method_id("/test.Brk/Spin");
/// Pending forever, never woken (but for its call's end); holds a clone of `token`.
const PARK: MethodId = method_id("/test.Brk/Park");
/// Keeps its waker in `stale`, wakes itself once, answers at its second poll.
const STALE: MethodId = method_id("/test.Brk/Stale");
/// Pending until `gate_open`, its waker in `gate_waker`; counts its polls in `gate_polls`.
const GATE: MethodId = method_id("/test.Brk/Gate");
/// Wakes itself once, then panics at its second poll.
const PANIC_LATER: MethodId = method_id("/test.Brk/PanicLater");
/// Keeps its `AsyncContext` in `kept`; answers at its first poll (`seq` 0) or its second.
const KEEP: MethodId = method_id("/test.Brk/Keep");
/// Server streaming: sends `seq` messages with `send_async`, then ends with `reply_len` as the
/// status code (0: OK); with no await that waits when they fit in the sink.
const STREAM_NOW: MethodId = method_id("/test.Brk/StreamNow");
/// `tokio::time::sleep(reply_len ms)` and a `tokio::spawn`ed task, then answers `seq`.
const SLEEP: MethodId = method_id("/test.Brk/Sleep");
/// Calls PARK through `Probe::relay`, and answers with what it got.
const RELAY: MethodId = method_id("/test.Brk/Relay");

const METHODS: &[MethodDesc] = &[
    MethodDesc { id: SPIN, name: "/test.Brk/Spin" },
    MethodDesc { id: PARK, name: "/test.Brk/Park" },
    MethodDesc { id: STALE, name: "/test.Brk/Stale" },
    MethodDesc { id: GATE, name: "/test.Brk/Gate" },
    MethodDesc { id: PANIC_LATER, name: "/test.Brk/PanicLater" },
    MethodDesc { id: KEEP, name: "/test.Brk/Keep" },
    MethodDesc { id: STREAM_NOW, name: "/test.Brk/StreamNow" },
    MethodDesc { id: SLEEP, name: "/test.Brk/Sleep" },
    MethodDesc { id: RELAY, name: "/test.Brk/Relay" },
];

/// What the handlers report.
#[derive(Default)]
struct Probe {
    spin_polls: AtomicU64,
    /// Handlers' futures started (first polls of PARK, SPIN, GATE).
    started: AtomicUsize,
    /// Handlers' futures dropped (PARK, SPIN, GATE, RELAY, PANIC_LATER).
    dropped: AtomicUsize,
    /// Cloned into every PARK future: its strong count - 1 is how many are alive.
    token: Arc<()>,
    stale: Mutex<Vec<Waker>>,
    gate_open: AtomicBool,
    gate_waker: Mutex<Option<Waker>>,
    gate_polls: AtomicU64,
    kept: Mutex<Vec<AsyncContext>>,
    /// RELAY's channel.
    relay: Mutex<Option<Channel>>,
}

/// Counts its drop in `Probe::dropped`.
struct Dropped(Arc<Probe>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::AcqRel);
    }
}

/// A hand-written future (as an `async fn` would be): `step` runs at every poll.
struct Steps<F> {
    step: F,
    _dropped: Dropped,
}

impl<F: FnMut(&mut Context<'_>) -> Poll<Result<EchoMsg, Status>> + Unpin> Future for Steps<F> {
    type Output = Result<EchoMsg, Status>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        (self.step)(cx)
    }
}

struct Brk {
    probe: Arc<Probe>,
    runtime: AsyncRuntime,
}

impl Brk {
    fn new(probe: &Arc<Probe>) -> Brk {
        Brk { probe: probe.clone(), runtime: AsyncRuntime::worker() }
    }

    fn steps<F>(&self, step: F) -> Steps<F>
    where
        F: FnMut(&mut Context<'_>) -> Poll<Result<EchoMsg, Status>> + Unpin,
    {
        Steps { step, _dropped: Dropped(self.probe.clone()) }
    }
}

impl Service for Brk {
    const NAME: &'static str = "test.Brk";
    const METHODS: &'static [MethodDesc] = METHODS;

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let req = match decode::<EchoMsg>(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        let p = self.probe.clone();
        let rt = &self.runtime;
        let seq = req.seq;
        let answer = EchoMsg { seq, ..Default::default() };
        match method {
            SPIN => {
                p.started.fetch_add(1, Ordering::AcqRel);
                let fut = self.steps(move |cx| {
                    p.spin_polls.fetch_add(1, Ordering::AcqRel);
                    cx.waker().wake_by_ref();
                    Poll::Pending
                });
                out.reply(spawn_async(rt, ctx, move |_| fut))
            }
            PARK => {
                p.started.fetch_add(1, Ordering::AcqRel);
                let token = p.token.clone();
                let ballast = vec![seq as u8; 4096];
                let fut = self.steps(move |_| {
                    let _ = (&token, &ballast);
                    Poll::Pending
                });
                out.reply(spawn_async(rt, ctx, move |_| fut))
            }
            STALE => {
                let mut first = true;
                let fut = self.steps(move |cx| {
                    if std::mem::take(&mut first) {
                        p.stale.lock().unwrap().push(cx.waker().clone());
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    Poll::Ready(Ok(answer.clone()))
                });
                out.reply(spawn_async(rt, ctx, move |_| fut))
            }
            GATE => {
                p.started.fetch_add(1, Ordering::AcqRel);
                let fut = self.steps(move |cx| {
                    p.gate_polls.fetch_add(1, Ordering::AcqRel);
                    if p.gate_open.load(Ordering::Acquire) {
                        return Poll::Ready(Ok(answer.clone()));
                    }
                    *p.gate_waker.lock().unwrap() = Some(cx.waker().clone());
                    // Opened between the look and the registration: answer now.
                    if p.gate_open.load(Ordering::Acquire) {
                        return Poll::Ready(Ok(answer.clone()));
                    }
                    Poll::Pending
                });
                out.reply(spawn_async(rt, ctx, move |_| fut))
            }
            PANIC_LATER => {
                let mut first = true;
                let fut = self.steps(move |cx| {
                    if std::mem::take(&mut first) {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    panic!("PANIC_LATER panics at its second poll (seq {seq})");
                });
                out.reply(spawn_async(rt, ctx, move |_| fut))
            }
            KEEP => out.reply(spawn_async(rt, ctx, move |actx| async move {
                p.kept.lock().unwrap().push(actx);
                if seq != 0 {
                    tokio::task::yield_now().await;
                }
                Ok(answer)
            })),
            STREAM_NOW => {
                let (sink, reply) = ctx.stream::<EchoMsg>();
                let code = req.reply_len;
                let size = req.payload.len();
                out.reply(spawn_async_stream(rt, ctx, sink, reply, move |_, sink| async move {
                    for i in 0..seq {
                        sink.send_async(&EchoMsg { seq: i, payload: payload(i, size), ..Default::default() })
                            .await?;
                    }
                    match code {
                        0 => Ok(()),
                        c => Err(Status::new(Code::from_i32(c as i32), format!("ended with code {c}"))),
                    }
                }))
            }
            SLEEP => out.reply(spawn_async(rt, ctx, move |_| async move {
                tokio::time::sleep(Duration::from_millis(u64::from(req.reply_len))).await;
                let spawned = tokio::spawn(async move { seq + 1 }).await;
                Ok(EchoMsg {
                    seq: spawned.map_err(|e| Status::internal(e.to_string()))? - 1,
                    ..Default::default()
                })
            })),
            RELAY => {
                let ch = p.relay.lock().unwrap().clone().expect("RELAY needs a channel");
                let dropped = Dropped(p);
                out.reply(spawn_async(rt, ctx, move |_| async move {
                    let _dropped = dropped;
                    ch.unary::<EchoMsg, EchoMsg>(
                        PARK,
                        EchoMsg { seq, ..Default::default() },
                        &CallOptions::default(),
                    )
                    .await
                }))
            }
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn start(probe: &Arc<Probe>, builder: rpc_core::ServerBuilder) -> ServerHandle {
    builder
        .add_service(Brk::new(probe))
        .add_service(TestService::default())
        .spawn("127.0.0.1:0")
        .expect("server starts")
}

fn connect(server: &ServerHandle) -> Client {
    Client::connect_with(server.local_addr(), &client_config()).expect("connect")
}

fn msg(seq: u64) -> EchoMsg {
    EchoMsg { seq, ..Default::default() }
}

/// `n` echo calls on `client`, each checked.
#[track_caller]
fn echoes(client: &Client, n: u64) {
    for i in 0..n {
        let r: EchoMsg = client.unary(ECHO, &request(i, 16, 8), &CallOptions::default()).expect("echo");
        check_reply(&r, i, 8);
    }
}

/// A future that wakes itself forever neither keeps the worker from serving other sessions (a
/// new one included) nor keeps it from stopping: `shutdown` drops it once `drain_timeout`
/// passed. Before the fix, the worker loop's `continue` after work (a task polled counts as
/// work) skipped the drain check forever: `shutdown` gave up on the worker after
/// `drain_timeout` + 5 s and left it spinning, the future never dropped.
#[test]
fn a_future_that_wakes_itself_forever_starves_no_session_and_does_not_stop_shutdown() {
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server().max_call_duration(None));
    // The spinner's client, on a thread of its own, progresses its session until told to stop
    // (its session stays open, answering the server's probes, through the shutdown).
    let stop = Arc::new(AtomicBool::new(false));
    let a = {
        let (addr, stop) = (server.local_addr(), stop.clone());
        std::thread::spawn(move || {
            let a = Client::connect_with(addr, &client_config()).expect("connect");
            let spin = a.unary_async::<EchoMsg, EchoMsg>(SPIN, &msg(1), &CallOptions::default());
            while !stop.load(Ordering::Acquire) {
                a.progress();
                std::thread::yield_now();
            }
            drop(spin);
        })
    };
    wait_until(
        "the spinning future to be polled",
        WAIT,
        || probe.spin_polls.load(Ordering::Acquire) > 100,
        || format!("{:?}", server.counters()),
    );
    // Other sessions, one opened while the worker spins, are served; the spinner runs on.
    let b = connect(&server);
    let before = probe.spin_polls.load(Ordering::Acquire);
    echoes(&b, 200);
    echoes(&connect(&server), 10);
    assert!(probe.spin_polls.load(Ordering::Acquire) > before, "the spinner starved");
    assert_eq!(probe.dropped.load(Ordering::Acquire), 0);
    drop(b);
    server.shutdown();
    let dropped = probe.dropped.load(Ordering::Acquire);
    stop.store(true, Ordering::Release);
    a.join().unwrap();
    assert_eq!(
        dropped, 1,
        "the spinning future was not dropped when shutdown returned: its worker never stopped"
    );
}

/// A waker kept from a task that ended, whose slot the next task took, called from four threads
/// forty thousand times: the slot's current task is polled for nothing (it must be, to show
/// the slot was reused), returns `Pending` again, and answers once, correctly, when its own
/// wake comes; other calls go on meanwhile.
#[test]
fn stale_wakers_hammered_from_many_threads_after_their_slot_was_reused_are_harmless() {
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server());
    let c = connect(&server);
    let r: EchoMsg = c.unary(STALE, &msg(7), &CallOptions::default()).expect("STALE answers");
    assert_eq!(r.seq, 7);
    assert_eq!(probe.stale.lock().unwrap().len(), 1);
    let gate = c.unary_async::<EchoMsg, EchoMsg>(GATE, &msg(9), &CallOptions::default());
    wait_until(
        "GATE's first poll",
        WAIT,
        || {
            c.progress();
            probe.gate_polls.load(Ordering::Acquire) >= 1
        },
        String::new,
    );
    let stale = probe.stale.lock().unwrap()[0].clone();
    let hammer: Vec<_> = (0..4)
        .map(|_| {
            let w = stale.clone();
            std::thread::spawn(move || {
                for i in 0..10_000 {
                    if i % 2 == 0 {
                        w.wake_by_ref();
                    } else {
                        // A clone woken by value (and dropped), as a timer or channel does.
                        let c = w.clone();
                        c.wake();
                    }
                }
            })
        })
        .collect();
    echoes(&connect(&server), 50);
    for h in hammer {
        h.join().unwrap();
    }
    wait_until(
        "a spurious poll of GATE (the stale waker's slot was reused)",
        WAIT,
        || {
            c.progress();
            probe.gate_polls.load(Ordering::Acquire) >= 2
        },
        || format!("{} polls", probe.gate_polls.load(Ordering::Acquire)),
    );
    assert_eq!(probe.dropped.load(Ordering::Acquire), 1, "only STALE's future is gone");
    probe.gate_open.store(true, Ordering::Release);
    probe.gate_waker.lock().unwrap().take().expect("GATE's waker").wake();
    let r = block_on(gate).expect("GATE answers");
    assert_eq!(r.seq, 9);
    // Stale wakes after everything ended: nothing to poll, nothing breaks.
    stale.wake_by_ref();
    echoes(&c, 5);
    let counters = server.counters();
    assert_eq!(counters.late_answers, 0, "{counters:?}");
    drop(c);
    server.shutdown();
    assert_eq!(probe.dropped.load(Ordering::Acquire), 2);
}

/// Two thousand pending tasks on one session (never woken), then the session closes: every
/// future is dropped (and all it held: the token's count comes back to one), and a second
/// round on a new session does the same after its calls are cancelled one by one.
#[test]
fn thousands_of_pending_tasks_are_all_dropped_when_their_session_closes() {
    const N: usize = 2000;
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server().credits_per_session(N as u16).max_sessions(2));
    for round in 1..=2 {
        let c =
            Client::connect_with(server.local_addr(), &client_config().window(N as u16)).expect("connect");
        let calls: Vec<_> = (0..N)
            .map(|i| c.unary_async::<EchoMsg, EchoMsg>(PARK, &msg(i as u64), &CallOptions::default()))
            .collect();
        wait_until(
            "every PARK future to start",
            WAIT,
            || {
                c.progress();
                probe.started.load(Ordering::Acquire) == round * N
            },
            || format!("{} started; {:?}", probe.started.load(Ordering::Acquire), server.counters()),
        );
        assert_eq!(Arc::strong_count(&probe.token), N + 1);
        if round == 1 {
            // The session closes (the client's Close) with every call pending.
            std::mem::forget(calls);
            drop(c);
        } else {
            // Each call cancelled.
            drop(calls);
            echoes(&c, 3);
        }
        wait_until(
            "every PARK future to be dropped",
            WAIT,
            || probe.dropped.load(Ordering::Acquire) == round * N,
            || format!("{} dropped; {:?}", probe.dropped.load(Ordering::Acquire), server.counters()),
        );
        assert_eq!(Arc::strong_count(&probe.token), 1, "round {round}: what the futures held");
    }
    let c = connect(&server);
    echoes(&c, 3);
    wait_until(
        "the counters to show the tasks",
        WAIT,
        || server.counters().async_tasks == 2 * N as u64,
        || format!("{:?}", server.counters()),
    );
    drop(c);
    server.shutdown();
}

/// A future that panics at its second poll (a task by then) answers INTERNAL naming the panic;
/// its future is dropped and the worker serves on.
#[test]
fn a_future_that_panics_after_its_first_poll_answers_internal() {
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server());
    let c = connect(&server);
    for i in 0..3 {
        let e = c.unary::<EchoMsg, EchoMsg>(PANIC_LATER, &msg(i), &CallOptions::default()).unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e}");
        assert!(e.message().contains("second poll"), "{e}");
        echoes(&c, 3);
    }
    wait_until("the futures dropped", WAIT, || probe.dropped.load(Ordering::Acquire) == 3, String::new);
    drop(c);
    server.shutdown();
}

/// An `AsyncContext` kept after its call was answered (at the first poll, or by a task), read
/// from another thread: `is_cancelled` is true, the call being over (as a Go context is done
/// when its RPC returns), whether its deadline is a minute ahead or has passed; never a panic.
#[test]
fn an_async_context_kept_after_its_call_answers_by_its_deadline() {
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server());
    let c = connect(&server);
    let short = Duration::from_millis(50);
    for (seq, timeout) in [(0, WAIT), (1, WAIT), (0, short), (1, short)] {
        let r: EchoMsg = c.unary(KEEP, &msg(seq), &CallOptions::deadline(timeout)).expect("KEEP");
        assert_eq!(r.seq, seq);
    }
    let kept = std::mem::take(&mut *probe.kept.lock().unwrap());
    assert_eq!(kept.len(), 4);
    let seen = std::thread::spawn(move || {
        let far: Vec<bool> = kept[..2].iter().map(|k| k.is_cancelled()).collect();
        while Instant::now() <= kept[2..].iter().filter_map(|k| k.deadline()).max().unwrap() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let near: Vec<bool> = kept[2..].iter().map(|k| k.is_cancelled()).collect();
        (far, near, kept)
    })
    .join()
    .unwrap();
    assert_eq!(seen.0, [true, true], "answered, deadline a minute ahead: the call is over");
    assert_eq!(seen.1, [true, true], "deadline passed");
    drop(c);
    echoes(&connect(&server), 3);
    let kept = seen.2;
    eprintln!("after the session closed: {:?}", kept.iter().map(|k| k.is_cancelled()).collect::<Vec<_>>());
    server.shutdown();
}

/// A stream handler that ends at its first poll with its messages in the sink: the client gets
/// every message, in order, then the end it gave (OK or an error); one that fills the sink
/// waits (a task) and gets the same.
#[test]
fn a_stream_that_ends_at_its_first_poll_delivers_its_queued_messages_then_its_end() {
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server());
    let c = connect(&server);
    // Messages of 8 bytes (many to a SEND), and of 3000 (one per SEND: the client's stream
    // grants run out with most of them still in the sink when the handler's end comes).
    let small = [
        (0u64, 0u32),
        (1, 0),
        (10, 0),
        (SINK_DEPTH as u64, 0),
        (5, Code::Aborted as u32),
        (3 * SINK_DEPTH as u64, 0),
    ];
    let big = [(40, 0), (40, Code::Aborted as u32), (300, 0)];
    let cases = small.into_iter().map(|(n, c)| (n, c, 8)).chain(big.into_iter().map(|(n, c)| (n, c, 3000)));
    for (n, code, size) in cases {
        let mut s = c
            .server_stream::<EchoMsg, EchoMsg>(
                STREAM_NOW,
                &EchoMsg { seq: n, reply_len: code, payload: vec![0; size], ..Default::default() },
                &CallOptions::default(),
            )
            .expect("stream opens");
        let mut got = 0;
        let end = loop {
            match s.message() {
                Ok(Some(m)) => {
                    assert_eq!(m.seq, got, "{n} messages: out of order");
                    assert_eq!(m.payload, payload(got, size), "{n} messages: message {got}'s payload");
                    got += 1;
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        assert_eq!(got, n, "{n} messages then code {code}: {end:?}");
        match code {
            0 => assert!(end.is_ok(), "{n}: {end:?}"),
            c => assert_eq!(end.unwrap_err().code() as u32, c),
        }
    }
    echoes(&c, 3);
    drop(c);
    server.shutdown();
}

/// An async handler on the worker calls PARK on another server through a `Channel`; its own
/// call is cancelled by its client: its future is dropped, which drops the `Channel` call,
/// which cancels PARK, whose future is dropped on the other server. The same through a channel
/// to its own server (PARK served by the same worker, which must not deadlock).
#[test]
fn a_relay_whose_call_is_cancelled_cancels_the_call_it_made() {
    let back_probe = Arc::new(Probe::default());
    let back = start(&back_probe, server());
    let front_probe = Arc::new(Probe::default());
    let front = start(&front_probe, server());
    let cfg = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500);
    for (target, target_probe, what) in
        [(&back, &back_probe, "another server"), (&front, &front_probe, "its own server")]
    {
        *front_probe.relay.lock().unwrap() =
            Some(Channel::connect_blocking(target.local_addr(), &cfg).expect("channel"));
        let c = connect(&front);
        for i in 0..5 {
            let started = target_probe.started.load(Ordering::Acquire);
            let front_dropped = front_probe.dropped.load(Ordering::Acquire);
            let target_dropped = target_probe.dropped.load(Ordering::Acquire);
            let call = c.unary_async::<EchoMsg, EchoMsg>(RELAY, &msg(i), &CallOptions::default());
            wait_until(
                &format!("{what}: PARK to start"),
                WAIT,
                || {
                    c.progress();
                    target_probe.started.load(Ordering::Acquire) == started + 1
                },
                || format!("front {:?}", front.counters()),
            );
            call.cancel();
            // RELAY's future on the front; PARK's on the target (the same probe for the front).
            let (front_want, target_want) = if std::ptr::eq(target, &front) {
                (front_dropped + 2, front_dropped + 2)
            } else {
                (front_dropped + 1, target_dropped + 1)
            };
            wait_until(
                &format!("{what}: RELAY's and PARK's futures dropped"),
                WAIT,
                || {
                    c.progress();
                    front_probe.dropped.load(Ordering::Acquire) == front_want
                        && target_probe.dropped.load(Ordering::Acquire) == target_want
                },
                || {
                    format!(
                        "front dropped {}, target dropped {}; front {:?}, target {:?}",
                        front_probe.dropped.load(Ordering::Acquire),
                        target_probe.dropped.load(Ordering::Acquire),
                        front.counters(),
                        target.counters()
                    )
                },
            );
            echoes(&c, 2);
        }
        assert_eq!(Arc::strong_count(&target_probe.token), 1, "{what}");
    }
    front_probe.relay.lock().unwrap().take();
    front.shutdown();
    back.shutdown();
}

/// Shutdown with pending tasks (never woken): it returns, and every future was dropped.
#[test]
fn shutdown_with_pending_tasks_drops_every_future() {
    // Within the client's window (32): every call goes on the wire.
    const N: usize = 30;
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server().drain_timeout(Duration::from_millis(200)));
    let c = connect(&server);
    let calls: Vec<_> = (0..N)
        .map(|i| c.unary_async::<EchoMsg, EchoMsg>(PARK, &msg(i as u64), &CallOptions::default()))
        .collect();
    wait_until(
        "every PARK future to start",
        WAIT,
        || {
            c.progress();
            probe.started.load(Ordering::Acquire) == N
        },
        String::new,
    );
    server.shutdown();
    assert_eq!(probe.dropped.load(Ordering::Acquire), N, "futures dropped when shutdown returned");
    assert_eq!(Arc::strong_count(&probe.token), 1);
    drop(calls);
}

/// A service made outside any tokio runtime (`AsyncRuntime::worker()` with no runtime around):
/// its handlers' `tokio::time::sleep` and `tokio::spawn` work, in the context of the runtime
/// the library shares; many at once too.
#[test]
fn tokio_timers_and_spawn_work_in_a_service_made_outside_any_runtime() {
    assert!(tokio::runtime::Handle::try_current().is_err());
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server());
    let c = connect(&server);
    for i in 0..10 {
        let r: EchoMsg = c
            .unary(SLEEP, &EchoMsg { seq: i, reply_len: 2, ..Default::default() }, &CallOptions::default())
            .expect("SLEEP");
        assert_eq!(r.seq, i);
    }
    let calls: Vec<_> = (0..20)
        .map(|i| {
            c.unary_async::<EchoMsg, EchoMsg>(
                SLEEP,
                &EchoMsg { seq: i, reply_len: 5, ..Default::default() },
                &CallOptions::default(),
            )
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(block_on(call).expect("SLEEP").seq, i as u64);
    }
    drop(c);
    server.shutdown();
}

/// The `Event` policy: the worker blocks on its CQ's channel when idle; a task woken from
/// another thread meanwhile still runs (within the policy's 1 ms bound), fifty times over.
#[test]
fn a_task_woken_from_another_thread_while_the_worker_sleeps_on_events_runs() {
    let probe = Arc::new(Probe::default());
    let server = start(&probe, server().polling(PollingPolicy::Event { spins: 0 }));
    let c = connect(&server);
    for i in 0..50 {
        probe.gate_open.store(false, Ordering::Release);
        let polls = probe.gate_polls.load(Ordering::Acquire);
        let gate = c.unary_async::<EchoMsg, EchoMsg>(GATE, &msg(i), &CallOptions::default());
        wait_until(
            "GATE's first poll",
            WAIT,
            || {
                c.progress();
                probe.gate_polls.load(Ordering::Acquire) > polls
            },
            String::new,
        );
        let p = probe.clone();
        std::thread::spawn(move || {
            // Let the worker go to sleep first, most times.
            for _ in 0..(i % 5) * 100 {
                std::thread::yield_now();
            }
            p.gate_open.store(true, Ordering::Release);
            if let Some(w) = p.gate_waker.lock().unwrap().take() {
                w.wake();
            }
        })
        .join()
        .unwrap();
        assert_eq!(block_on(gate).expect("GATE").seq, i);
    }
    drop(c);
    server.shutdown();
}

/// A call made by a handler after the deadline it inherits has passed fails DEADLINE_EXCEEDED
/// without going on the wire: the server it calls sees no request (its handler, which would
/// run with microseconds left, never runs).
#[test]
fn a_call_whose_inherited_deadline_passed_never_reaches_the_other_server() {
    const LATE: MethodId = method_id("/test.Late/Late");
    struct Late {
        back: std::net::SocketAddr,
        got: Arc<Mutex<Vec<Status>>>,
    }
    impl Service for Late {
        const NAME: &'static str = "test.Late";
        const METHODS: &'static [MethodDesc] = &[MethodDesc { id: LATE, name: "/test.Late/Late" }];
        fn call(&self, _m: MethodId, ctx: &RequestContext, _b: Body<'_>, out: &mut ReplyWriter<'_>) {
            let client = Client::connect_with(self.back, &client_config()).expect("connect to the back");
            let deadline = ctx.deadline().expect("a deadline");
            while Instant::now() <= deadline {
                std::thread::yield_now();
            }
            let r = client.unary::<EchoMsg, EchoMsg>(PARK, &request(1, 16, 0), &CallOptions::default());
            self.got.lock().unwrap().push(r.unwrap_err());
            out.reply(Reply::from(EchoMsg::default()));
        }
    }
    let back_probe = Arc::new(Probe::default());
    let back = start(&back_probe, server());
    let got = Arc::new(Mutex::new(Vec::new()));
    let front = server()
        .add_service(Late { back: back.local_addr(), got: got.clone() })
        .spawn("127.0.0.1:0")
        .unwrap();
    let client = connect(&front);
    const N: usize = 5;
    for _ in 0..N {
        // DEADLINE_EXCEEDED, or the handler's late answer when it came before the client looked
        // at the clock: not what this test is about.
        let _ = client.unary::<EchoMsg, EchoMsg>(
            LATE,
            &EchoMsg::default(),
            &CallOptions::deadline(Duration::from_millis(20)),
        );
    }
    wait_until("the handlers to finish", WAIT, || got.lock().unwrap().len() == N, String::new);
    for e in got.lock().unwrap().iter() {
        assert_eq!(e.code(), Code::DeadlineExceeded, "the inner call: {e}");
    }
    let c = back.counters();
    assert_eq!(back_probe.started.load(Ordering::Acquire), 0, "PARK ran with its deadline passed");
    assert_eq!(c.bytes_in, 0, "requests whose deadline had passed reached the back: {c:?}");
    assert_eq!(c.by_code.iter().sum::<u64>(), 0, "the back answered calls: {c:?}");
    drop(client);
    front.shutdown();
    back.shutdown();
}

/// A `Channel` call with an absolute deadline (`deadline_at`, or the one it inherits) that
/// passes while the call waits in the channel's queue (every slot taken) fails
/// DEADLINE_EXCEEDED; it is not started later with its time counted anew from then (which
/// lets it run, and succeed, long after its deadline).
#[test]
fn a_channel_call_whose_deadline_passes_while_queued_fails_deadline_exceeded() {
    let (server, stash) = spawn(server());
    let cfg = ChannelConfig::default()
        .client(client_config().window(1).polling(PollingPolicy::Event { spins: 0 }))
        .dispatchers(1)
        .spins(500);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ch = Channel::connect_blocking(server.local_addr(), &cfg).expect("channel");
    // The one slot is held by a stashed call.
    let held = ch.unary::<EchoMsg, EchoMsg>(STASH, msg(1), &CallOptions::default());
    wait_until("the stash", WAIT, || stash.lock().unwrap().len() == 1, String::new);
    let deadline = Instant::now() + Duration::from_millis(50);
    let queued =
        ch.unary::<EchoMsg, EchoMsg>(ECHO, request(2, 8, 8), &CallOptions::deadline_at(Some(deadline)));
    while Instant::now() <= deadline + Duration::from_millis(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    stash.lock().unwrap().pop().unwrap().send(Ok(msg(1)));
    let (held, queued) = rt.block_on(async { (held.await, queued.await) });
    assert_eq!(held.expect("the held call").seq, 1);
    let e = queued.expect_err("a call whose deadline passed while it was queued answered");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    drop(ch);
    server.shutdown();
}
