//! Streams end cleanly whatever half is dropped (issue 31): for each stream shape (server,
//! client, bidirectional) and each half (the client's sender, the client's receiver, the
//! server's sink or responder, the server's request stream), on the tokio `Channel` and on the
//! blocking `Client`, every pending receive on either side ends (with the stream's end or a
//! status) and never hangs.
//!
//! What each drop means (as tonic): the client's sender dropped is a half-close (as `finish`);
//! the client's receiver (or a whole client-streaming call) dropped cancels the call (the
//! server's request stream ends CANCELLED, its sink's sends fail CANCELLED); the server's sink
//! dropped ends the stream OK (a clean end); its responder dropped answers CANCELLED; its
//! request stream dropped lets the client send on until the answer.
//!
//! Every call has a deadline ([`DEADLINE`]) and every wait a bound ([`WAIT`]): a hang fails the
//! test (a DEADLINE_EXCEEDED where another end was due, or a wait that gave up) instead of
//! blocking CI. No timing is asserted.
//!
//! Then the "# Cancel safety" claims of the docs, each held by a test that races the future in
//! a biased `tokio::select!` against an always-ready branch ([`race`]), so it is dropped
//! whenever its first poll is pending: a cancel-safe receive loses no message, a send that
//! lost its race was not sent, a future polled by `&mut` keeps its answer.

mod rpc_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::{CallOptions, Channel, ChannelConfig, Client, PollingPolicy, ServerHandle};
use rpc_support::*;

/// Server streaming: the request's `seq` messages, then the sink is dropped (no `finish`).
const LIST_DROP: MethodId = method_id("/test.Drops/ListDrop");
/// Server streaming: messages until a send fails (the probe records how).
const LIST_ON: MethodId = method_id("/test.Drops/ListOn");
/// Client streaming: reads every message, answers their count.
const SUM: MethodId = method_id("/test.Drops/Sum");
/// Client streaming: drops the responder at once, then reads the request stream to its end.
const SUM_NO_ANSWER: MethodId = method_id("/test.Drops/SumNoAnswer");
/// Client streaming: drops the request stream at once, answers once the probe's `release` is set.
const SUM_DROP_REQ: MethodId = method_id("/test.Drops/SumDropReq");
/// Bidirectional: echoes each message; drops the sink at the request stream's end.
const ECHO: MethodId = method_id("/test.Drops/Echo");
/// Bidirectional: reads nothing (the client's sends stall at its grants) until cancelled.
const STALL: MethodId = method_id("/test.Drops/Stall");
/// Bidirectional: drops the sink at once, then reads the request stream to its end.
const ECHO_DROP_SINK: MethodId = method_id("/test.Drops/EchoDropSink");
/// Bidirectional: drops the request stream at once, sends [`SENT`] messages, drops the sink.
const ECHO_DROP_REQ: MethodId = method_id("/test.Drops/EchoDropReq");

/// Unary: answers the request's `seq` from another thread after 20 ms.
const LATER: MethodId = method_id("/test.Drops/Later");
/// Bidirectional: echoes each message after a short pause (the client's sends wait for room).
const ECHO_SLOW: MethodId = method_id("/test.Drops/EchoSlow");
/// Client streaming: reads with `message_async` raced against an expired timeout (cancelled
/// whenever nothing is there), answers the count, or DATA_LOSS at a gap.
const READ_RACED: MethodId = method_id("/test.Drops/ReadRaced");
/// Server streaming: sends `seq` messages with `send_async` raced against an expired timeout;
/// the sends that completed go to the probe's `sent`.
const SEND_RACED: MethodId = method_id("/test.Drops/SendRaced");

/// Unary, never answered: watches `Responder::cancelled` raced against an always-ready branch
/// (a new future each round), records CANCELLED in the probe's `sink` once one resolves.
const WATCH: MethodId = method_id("/test.Drops/Watch");

/// Messages ECHO_DROP_REQ sends.
const SENT: u64 = 5;

/// Every call's deadline: a blocking receive that never ends fails the test with
/// DEADLINE_EXCEEDED. Longer than [`WAIT`], which bounds the waits for the server's side (the
/// deadline would cancel the server's side too, passing for the cancel a test waits for) and
/// each `Channel` case as a whole.
const DEADLINE: Duration = Duration::from_secs(2 * WAIT.as_secs());

fn opts() -> CallOptions {
    CallOptions::deadline(DEADLINE)
}

fn msg(seq: u64) -> EchoMsg {
    EchoMsg { seq, payload: vec![seq as u8; 16], checksum: 0, reply_len: 0 }
}

/// A message of 2000 bytes: two fill a SEND.
fn big(seq: u64) -> EchoMsg {
    EchoMsg { seq, payload: vec![seq as u8; 2000], checksum: 0, reply_len: 0 }
}

/// How a server reader's request stream ended, or how its producer's send failed.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    /// The request stream ended cleanly after this many messages.
    End(u64),
    /// The request stream, or a send of the sink, failed with this code.
    Failed(Code),
}

/// What the server's handlers saw.
#[derive(Default)]
struct Probe {
    /// Calls whose handler ran.
    entered: AtomicU64,
    /// How the last request stream read to its end ended.
    requests: Mutex<Option<Seen>>,
    /// How the last producer's sends ended (only LIST_ON and STALL record it).
    sink: Mutex<Option<Seen>>,
    /// SEND_RACED's sends that completed (the others were cancelled).
    sent: Mutex<Vec<u64>>,
    /// SUM_DROP_REQ answers once set (or its call is cancelled: then it records CANCELLED in
    /// `sink`).
    release: AtomicBool,
}

/// Reads `requests` to its end, recording how it ended; the messages read.
fn read_to_end(
    requests: &mut RequestStream<EchoMsg>,
    probe: &Probe,
    echo: Option<&StreamSink<EchoMsg>>,
) -> u64 {
    let mut n = 0;
    loop {
        match requests.message() {
            Ok(Some(m)) => {
                n += 1;
                if let Some(sink) = echo {
                    let _ = sink.send(&m);
                }
            }
            Ok(None) => {
                *probe.requests.lock().unwrap() = Some(Seen::End(n));
                return n;
            }
            Err(e) => {
                *probe.requests.lock().unwrap() = Some(Seen::Failed(e.code()));
                return n;
            }
        }
    }
}

struct Drops {
    probe: Arc<Probe>,
}

impl Service for Drops {
    const NAME: &'static str = "test.Drops";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: LIST_DROP, name: "/test.Drops/ListDrop" },
        MethodDesc { id: LIST_ON, name: "/test.Drops/ListOn" },
        MethodDesc { id: SUM, name: "/test.Drops/Sum" },
        MethodDesc { id: SUM_NO_ANSWER, name: "/test.Drops/SumNoAnswer" },
        MethodDesc { id: SUM_DROP_REQ, name: "/test.Drops/SumDropReq" },
        MethodDesc { id: ECHO, name: "/test.Drops/Echo" },
        MethodDesc { id: STALL, name: "/test.Drops/Stall" },
        MethodDesc { id: ECHO_DROP_SINK, name: "/test.Drops/EchoDropSink" },
        MethodDesc { id: ECHO_DROP_REQ, name: "/test.Drops/EchoDropReq" },
        MethodDesc { id: LATER, name: "/test.Drops/Later" },
        MethodDesc { id: ECHO_SLOW, name: "/test.Drops/EchoSlow" },
        MethodDesc { id: READ_RACED, name: "/test.Drops/ReadRaced" },
        MethodDesc { id: SEND_RACED, name: "/test.Drops/SendRaced" },
        MethodDesc { id: WATCH, name: "/test.Drops/Watch" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let probe = self.probe.clone();
        probe.entered.fetch_add(1, Ordering::AcqRel);
        match method {
            LIST_DROP | LIST_ON => {
                let req: EchoMsg = match decode(body) {
                    Ok(r) => r,
                    Err(s) => return out.error(s),
                };
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    let mut seq = 0;
                    while method == LIST_ON || seq < req.seq {
                        if let Err(e) = sink.send(&msg(seq)) {
                            *probe.sink.lock().unwrap() = Some(Seen::Failed(e.code()));
                            return;
                        }
                        seq += 1;
                        if method == LIST_ON {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    // LIST_DROP: the sink goes without `finish`.
                    drop(sink);
                });
                out.reply(reply);
            }
            SUM | SUM_NO_ANSWER | SUM_DROP_REQ => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || match method {
                    SUM => {
                        let n = read_to_end(&mut requests, &probe, None);
                        // A responder cancelled meanwhile drops the answer (the client is gone).
                        responder.send(Ok(EchoMsg { seq: n, ..Default::default() }));
                    }
                    SUM_NO_ANSWER => {
                        drop(responder);
                        read_to_end(&mut requests, &probe, None);
                    }
                    _ => {
                        drop(requests);
                        while !probe.release.load(Ordering::Acquire) && !responder.is_cancelled() {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        if responder.is_cancelled() {
                            *probe.sink.lock().unwrap() = Some(Seen::Failed(Code::Cancelled));
                        }
                        responder.send(Ok(EchoMsg { seq: 777, ..Default::default() }));
                    }
                });
                out.reply(reply);
            }
            ECHO | STALL | ECHO_DROP_SINK | ECHO_DROP_REQ => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || match method {
                    ECHO => {
                        read_to_end(&mut requests, &probe, Some(&sink));
                        // The sink goes without `finish`.
                    }
                    STALL => {
                        while !sink.is_cancelled() {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        let e = sink.send(&msg(0)).expect_err("a send after the cancel fails");
                        *probe.sink.lock().unwrap() = Some(Seen::Failed(e.code()));
                        read_to_end(&mut requests, &probe, None);
                    }
                    ECHO_DROP_SINK => {
                        drop(sink);
                        read_to_end(&mut requests, &probe, None);
                    }
                    _ => {
                        drop(requests);
                        for seq in 0..SENT {
                            let _ = sink.send(&msg(seq));
                        }
                    }
                });
                out.reply(reply);
            }
            WATCH => {
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    rt.block_on(async {
                        let until = std::time::Instant::now() + WAIT;
                        while race(responder.cancelled()).await.is_none() {
                            if std::time::Instant::now() > until {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        *probe.sink.lock().unwrap() = Some(Seen::Failed(Code::Cancelled));
                    });
                });
                out.reply(reply);
            }
            LATER => {
                let req: EchoMsg = match decode(body) {
                    Ok(r) => r,
                    Err(s) => return out.error(s),
                };
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    responder.send(Ok(msg(req.seq)));
                });
                out.reply(reply);
            }
            ECHO_SLOW => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    while let Ok(Some(m)) = requests.message() {
                        std::thread::sleep(Duration::from_micros(200));
                        let _ = sink.send(&m);
                    }
                });
                out.reply(reply);
            }
            READ_RACED => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    let r = rt.block_on(async {
                        let mut n = 0;
                        loop {
                            match race(requests.message_async()).await {
                                Some(Ok(Some(m))) if m.seq == n => n += 1,
                                Some(Ok(Some(m))) => {
                                    return Err(Status::data_loss(format!("message {} came as {n}", m.seq)))
                                }
                                Some(Ok(None)) => return Ok(msg(n)),
                                Some(Err(e)) => return Err(e),
                                // Cancelled: nothing was there yet.
                                None => tokio::task::yield_now().await,
                            }
                        }
                    });
                    responder.send(r);
                });
                out.reply(reply);
            }
            SEND_RACED => {
                let req: EchoMsg = match decode(body) {
                    Ok(r) => r,
                    Err(s) => return out.error(s),
                };
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    rt.block_on(async {
                        for seq in 0..req.seq {
                            match race(sink.send_async(&msg(seq))).await {
                                Some(Ok(())) => probe.sent.lock().unwrap().push(seq),
                                Some(Err(_)) => return,
                                // Cancelled while the sink was full: not sent.
                                None => tokio::task::yield_now().await,
                            }
                        }
                    });
                    drop(sink);
                });
                out.reply(reply);
            }
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn start() -> (ServerHandle, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let h = server().add_service(Drops { probe: probe.clone() }).spawn("127.0.0.1:0").unwrap();
    (h, probe)
}

/// Waits (a hang guard) for `what` the probe must see.
#[track_caller]
fn until_seen(what: &str, probe: &Probe, slot: fn(&Probe) -> &Mutex<Option<Seen>>) -> Seen {
    wait_for(what, WAIT, || slot(probe).lock().unwrap().clone(), || probe_state(probe))
}

fn probe_state(probe: &Probe) -> String {
    format!(
        "entered {}, requests {:?}, sink {:?}",
        probe.entered.load(Ordering::Acquire),
        probe.requests.lock().unwrap(),
        probe.sink.lock().unwrap()
    )
}

#[track_caller]
fn until_entered(probe: &Probe, client: Option<&Client>) {
    wait_until(
        "the handler to run",
        WAIT,
        || {
            if let Some(c) = client {
                c.progress();
            }
            probe.entered.load(Ordering::Acquire) > 0
        },
        || probe_state(probe),
    );
}

/// The shapes and halves the tests cover.
#[derive(Clone, Copy, Debug)]
enum Case {
    /// Server streaming, the client's receiver dropped: the server's producer sees CANCELLED.
    ServerStreamClientReceiver,
    /// Server streaming, the server's sink dropped: the client's receive ends cleanly.
    ServerStreamServerSink,
    /// Client streaming, the call dropped mid-stream: the server's request stream ends CANCELLED.
    ClientStreamClientCall,
    /// Client streaming, the answer's future dropped (Channel only): the server's answer is not
    /// wanted (its responder is cancelled).
    ClientStreamClientReceiver,
    /// Client streaming, the server's responder dropped: the client's `finish` ends CANCELLED.
    ClientStreamServerResponder,
    /// Client streaming, the server's request stream dropped: the client sends on and gets the
    /// answer.
    ClientStreamServerRequests,
    /// Bidirectional, the client's sender dropped (Channel only; the blocking stream is one
    /// object: its `finish` is the half-close): a half-close, every echo comes, then the end.
    BidiClientSender,
    /// Bidirectional, the client's receiver dropped: the server sees CANCELLED; a send waiting
    /// on the sender ends CANCELLED.
    BidiClientReceiver,
    /// Bidirectional, the server's sink dropped: the client's receive ends cleanly, the server's
    /// request stream ends.
    BidiServerSink,
    /// Bidirectional, the server's request stream dropped: the client sends on, gets the
    /// server's messages and the end.
    BidiServerRequests,
}

// ---- the tokio `Channel` ----

fn channel_config() -> ChannelConfig {
    ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500)
        .thread_name("chan-drops")
}

/// Runs `case` on a `Channel` under a two-thread tokio runtime, the whole of it bounded by
/// [`WAIT`].
fn channel_case(case: Case) {
    let (server, probe) = start();
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let ch = Channel::connect_with(addr, &channel_config()).await.unwrap();
        match tokio::time::timeout(WAIT, channel_run(case, &ch, &probe)).await {
            Ok(()) => {}
            Err(_) => fail(&format!("{case:?} hung: {}", probe_state(&probe))),
        }
    });
    drop(rt);
    server.shutdown();
}

async fn channel_run(case: Case, ch: &Channel, probe: &Arc<Probe>) {
    let wait = |what: &'static str, slot: fn(&Probe) -> &Mutex<Option<Seen>>| {
        let probe = probe.clone();
        async move { tokio::task::spawn_blocking(move || until_seen(what, &probe, slot)).await.unwrap() }
    };
    let entered = || {
        let probe = probe.clone();
        async move { tokio::task::spawn_blocking(move || until_entered(&probe, None)).await.unwrap() }
    };
    match case {
        Case::ServerStreamClientReceiver => {
            let mut rx = ch.server_stream::<_, EchoMsg>(LIST_ON, msg(0), &opts());
            assert_eq!(rx.message().await.unwrap().map(|m| m.seq), Some(0));
            drop(rx);
            let seen = wait("the producer's send to fail", |p| &p.sink).await;
            assert_eq!(seen, Seen::Failed(Code::Cancelled));
        }
        Case::ServerStreamServerSink => {
            let mut rx = ch.server_stream::<_, EchoMsg>(LIST_DROP, msg(3), &opts());
            for seq in 0..3 {
                assert_eq!(rx.message().await.unwrap().map(|m| m.seq), Some(seq));
            }
            assert_eq!(rx.message().await.unwrap(), None, "a dropped sink is a clean end");
        }
        Case::ClientStreamClientCall => {
            let mut call = ch.client_stream::<EchoMsg, EchoMsg>(SUM, &opts());
            call.send(&msg(0)).await.unwrap();
            entered().await;
            drop(call);
            let seen = wait("the server's request stream to end", |p| &p.requests).await;
            assert_eq!(seen, Seen::Failed(Code::Cancelled), "a dropped call is a cancel, not an end");
        }
        Case::ClientStreamClientReceiver => {
            // SUM_DROP_REQ answers only once released: the answer's future waits, and is dropped.
            let mut call = ch.client_stream::<EchoMsg, EchoMsg>(SUM_DROP_REQ, &opts());
            call.send(&msg(0)).await.unwrap();
            entered().await;
            let finish = call.finish();
            tokio::select! {
                r = finish => panic!("the answer came before its release: {r:?}"),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            // The server's responder sees the cancel (its answer goes nowhere).
            let seen = wait("the server's responder to see the cancel", |p| &p.sink).await;
            assert_eq!(seen, Seen::Failed(Code::Cancelled));
            // The channel still serves the next call.
            let mut next = ch.client_stream::<EchoMsg, EchoMsg>(SUM, &opts());
            next.send(&msg(0)).await.unwrap();
            assert_eq!(next.finish().await.unwrap().seq, 1);
        }
        Case::ClientStreamServerResponder => {
            let mut call = ch.client_stream::<EchoMsg, EchoMsg>(SUM_NO_ANSWER, &opts());
            let _ = call.send(&msg(0)).await;
            let e = call.finish().await.expect_err("no answer");
            assert_eq!(e.code(), Code::Cancelled, "{e}");
            let seen = wait("the server's request stream to end", |p| &p.requests).await;
            assert!(matches!(seen, Seen::End(_) | Seen::Failed(_)), "{seen:?}");
        }
        Case::ClientStreamServerRequests => {
            let mut call = ch.client_stream::<EchoMsg, EchoMsg>(SUM_DROP_REQ, &opts());
            // Many SENDs' worth (2 messages fill an eager buffer): more than the stream's grants,
            // so they go only as the server's worker returns the grants of what it drops.
            for seq in 0..300 {
                call.send(&big(seq)).await.unwrap_or_else(|e| panic!("send {seq}: {e}"));
            }
            probe.release.store(true, Ordering::Release);
            assert_eq!(call.finish().await.unwrap().seq, 777);
        }
        Case::BidiClientSender => {
            let (mut tx, mut rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &opts());
            for seq in 0..3 {
                tx.send(&msg(seq)).await.unwrap();
            }
            drop(tx);
            for seq in 0..3 {
                assert_eq!(rx.message().await.unwrap().map(|m| m.seq), Some(seq));
            }
            assert_eq!(rx.message().await.unwrap(), None, "a dropped sender is a half-close");
            let seen = wait("the server's request stream to end", |p| &p.requests).await;
            assert_eq!(seen, Seen::End(3), "a dropped sender is an end, not a cancel");
        }
        Case::BidiClientReceiver => {
            // The server reads nothing: the sender's sends stall at its grants, in another task.
            let (mut tx, rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(STALL, &opts());
            let sender = tokio::spawn(async move {
                let mut seq = 0;
                loop {
                    if let Err(e) = tx.send(&msg(seq)).await {
                        return (seq, e);
                    }
                    seq += 1;
                }
            });
            entered().await;
            // Likely (not needed) for the sender to wait in a send when the receiver goes.
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(rx);
            let (sent, e) = sender.await.unwrap();
            assert_eq!(e.code(), Code::Cancelled, "after {sent} sends: {e}");
            let seen = wait("the server's sink to see the cancel", |p| &p.sink).await;
            assert_eq!(seen, Seen::Failed(Code::Cancelled));
            let seen = wait("the server's request stream to end", |p| &p.requests).await;
            assert_eq!(seen, Seen::Failed(Code::Cancelled));
        }
        Case::BidiServerSink => {
            let (mut tx, mut rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(ECHO_DROP_SINK, &opts());
            let _ = tx.send(&msg(0)).await;
            assert_eq!(rx.message().await.unwrap(), None, "a dropped sink is a clean end");
            // The stream is over: the client's sends fail, and the server's reader ends.
            let e = tx.send(&msg(1)).await.expect_err("the stream is over");
            assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
            let seen = wait("the server's request stream to end", |p| &p.requests).await;
            assert!(matches!(seen, Seen::End(_) | Seen::Failed(Code::Cancelled)), "{seen:?}");
        }
        Case::BidiServerRequests => {
            let (mut tx, mut rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(ECHO_DROP_REQ, &opts());
            for seq in 0..SENT {
                assert_eq!(rx.message().await.unwrap().map(|m| m.seq), Some(seq));
            }
            // Sends after the server's reader went are dropped by it, or fail once it answered.
            let _ = tx.send(&msg(0)).await;
            assert_eq!(rx.message().await.unwrap(), None);
            tx.finish();
        }
    }
}

macro_rules! channel_tests {
    ($($name:ident: $case:ident,)*) => {$(
        #[test]
        fn $name() {
            channel_case(Case::$case);
        }
    )*};
}

channel_tests! {
    channel_server_stream_receiver_dropped_cancels_the_producer: ServerStreamClientReceiver,
    channel_server_stream_sink_dropped_ends_the_receive_cleanly: ServerStreamServerSink,
    channel_client_stream_call_dropped_cancels_the_servers_reader: ClientStreamClientCall,
    channel_client_stream_answer_dropped_leaves_the_channel_serving: ClientStreamClientReceiver,
    channel_client_stream_responder_dropped_ends_finish_cancelled: ClientStreamServerResponder,
    channel_client_stream_requests_dropped_lets_the_client_send_on: ClientStreamServerRequests,
    channel_bidi_sender_dropped_is_a_half_close: BidiClientSender,
    channel_bidi_receiver_dropped_cancels_and_ends_a_waiting_send: BidiClientReceiver,
    channel_bidi_sink_dropped_ends_the_receive_cleanly: BidiServerSink,
    channel_bidi_requests_dropped_lets_the_client_send_on: BidiServerRequests,
}

// ---- the blocking `Client` ----

fn client_case(case: Case) {
    let (server, probe) = start();
    let c = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let seen = |what: &str, slot: fn(&Probe) -> &Mutex<Option<Seen>>| {
        wait_for(
            what,
            WAIT,
            || {
                c.progress();
                slot(&probe).lock().unwrap().clone()
            },
            || probe_state(&probe),
        )
    };
    match case {
        Case::ServerStreamClientReceiver => {
            let mut rx = c.server_stream::<_, EchoMsg>(LIST_ON, &msg(0), &opts()).unwrap();
            assert_eq!(rx.message().unwrap().map(|m| m.seq), Some(0));
            drop(rx);
            assert_eq!(seen("the producer's send to fail", |p| &p.sink), Seen::Failed(Code::Cancelled));
        }
        Case::ServerStreamServerSink => {
            let mut rx = c.server_stream::<_, EchoMsg>(LIST_DROP, &msg(3), &opts()).unwrap();
            for seq in 0..3 {
                assert_eq!(rx.message().unwrap().map(|m| m.seq), Some(seq));
            }
            assert_eq!(rx.message().unwrap(), None, "a dropped sink is a clean end");
        }
        Case::ClientStreamClientCall => {
            let mut call = c.client_stream::<EchoMsg, EchoMsg>(SUM, &opts()).unwrap();
            call.send(&msg(0)).unwrap();
            until_entered(&probe, Some(&c));
            drop(call);
            let s = seen("the server's request stream to end", |p| &p.requests);
            assert_eq!(s, Seen::Failed(Code::Cancelled), "a dropped call is a cancel, not an end");
        }
        Case::ClientStreamServerResponder => {
            let mut call = c.client_stream::<EchoMsg, EchoMsg>(SUM_NO_ANSWER, &opts()).unwrap();
            let _ = call.send(&msg(0));
            let e = call.finish().expect_err("no answer");
            assert_eq!(e.code(), Code::Cancelled, "{e}");
            let s = seen("the server's request stream to end", |p| &p.requests);
            assert!(matches!(s, Seen::End(_) | Seen::Failed(_)), "{s:?}");
        }
        Case::ClientStreamServerRequests => {
            let mut call = c.client_stream::<EchoMsg, EchoMsg>(SUM_DROP_REQ, &opts()).unwrap();
            // Many SENDs' worth (2 messages fill an eager buffer): more than the stream's grants,
            // so they go only as the server's worker returns the grants of what it drops.
            for seq in 0..300 {
                call.send(&big(seq)).unwrap_or_else(|e| panic!("send {seq}: {e}"));
            }
            probe.release.store(true, Ordering::Release);
            assert_eq!(call.finish().unwrap().seq, 777);
        }
        Case::BidiClientReceiver => {
            // The blocking stream is one object: dropping it cancels.
            let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(STALL, &opts()).unwrap();
            s.send(&msg(0)).unwrap();
            until_entered(&probe, Some(&c));
            drop(s);
            assert_eq!(
                seen("the server's sink to see the cancel", |p| &p.sink),
                Seen::Failed(Code::Cancelled)
            );
            assert_eq!(
                seen("the server's request stream to end", |p| &p.requests),
                Seen::Failed(Code::Cancelled)
            );
        }
        Case::BidiServerSink => {
            let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(ECHO_DROP_SINK, &opts()).unwrap();
            let _ = s.send(&msg(0));
            assert_eq!(s.message().unwrap(), None, "a dropped sink is a clean end");
            let e = s.send(&msg(1)).expect_err("the stream is over");
            assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
            let r = seen("the server's request stream to end", |p| &p.requests);
            assert!(matches!(r, Seen::End(_) | Seen::Failed(Code::Cancelled)), "{r:?}");
        }
        Case::BidiServerRequests => {
            let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(ECHO_DROP_REQ, &opts()).unwrap();
            for seq in 0..SENT {
                assert_eq!(s.message().unwrap().map(|m| m.seq), Some(seq));
            }
            let _ = s.send(&msg(0));
            assert_eq!(s.message().unwrap(), None);
        }
        Case::BidiClientSender | Case::ClientStreamClientReceiver => {
            unreachable!("no separate half on the blocking client")
        }
    }
    drop(c);
    server.shutdown();
}

macro_rules! client_tests {
    ($($name:ident: $case:ident,)*) => {$(
        #[test]
        fn $name() {
            client_case(Case::$case);
        }
    )*};
}

client_tests! {
    client_server_stream_receiver_dropped_cancels_the_producer: ServerStreamClientReceiver,
    client_server_stream_sink_dropped_ends_the_receive_cleanly: ServerStreamServerSink,
    client_client_stream_call_dropped_cancels_the_servers_reader: ClientStreamClientCall,
    client_client_stream_responder_dropped_ends_finish_cancelled: ClientStreamServerResponder,
    client_client_stream_requests_dropped_lets_the_client_send_on: ClientStreamServerRequests,
    client_bidi_dropped_cancels_the_servers_reader_and_sink: BidiClientReceiver,
    client_bidi_sink_dropped_ends_the_receive_cleanly: BidiServerSink,
    client_bidi_requests_dropped_lets_the_client_send_on: BidiServerRequests,
}

// ---- cancel safety (the "# Cancel safety" sections of the docs) ----

/// `f` polled once in a `tokio::select!` against a branch that is always ready: its output, or
/// `None` when it was pending (then it lost the race and was dropped).
async fn race<F: std::future::Future>(f: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        r = f => Some(r),
        () = std::future::ready(()) => None,
    }
}

/// Checks that `got` is `want`, naming the first difference (not printing thousands of numbers).
#[track_caller]
fn same_seqs(got: &[u64], want: &[u64], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        fail(&format!(
            "{what}: {} received, {} completed; first difference at {at}: received {:?}, completed {:?}",
            got.len(),
            want.len(),
            got.get(at),
            want.get(at)
        ));
    }
}

/// Runs `f` on a `Channel` under a two-thread runtime, bounded by [`WAIT`].
fn on_channel<F: std::future::Future<Output = ()>>(what: &str, f: impl FnOnce(Channel, Arc<Probe>) -> F) {
    let (server, probe) = start();
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let ch = Channel::connect_with(addr, &channel_config()).await.unwrap();
        if tokio::time::timeout(WAIT, f(ch, probe.clone())).await.is_err() {
            fail(&format!("{what} hung: {}", probe_state(&probe)));
        }
    });
    drop(rt);
    server.shutdown();
}

/// `StreamReceiver::message` is cancel-safe: raced against an expired timeout (dropped whenever
/// no message is there at its first poll), no message is lost.
#[test]
fn a_channel_receive_that_loses_a_select_loses_no_message() {
    on_channel("the raced receive", |ch, _| async move {
        const N: u64 = 300;
        let mut rx = ch.server_stream::<_, EchoMsg>(LIST_DROP, msg(N), &opts());
        let mut next = 0;
        let mut lost_races = 0u64;
        loop {
            match race(rx.message()).await {
                Some(Ok(Some(m))) => {
                    assert_eq!(m.seq, next, "a message lost after {lost_races} lost races");
                    next += 1;
                }
                Some(Ok(None)) => break,
                Some(Err(e)) => panic!("after {next}: {e}"),
                None => {
                    lost_races += 1;
                    tokio::task::yield_now().await;
                }
            }
        }
        assert_eq!(next, N, "every message, then the end ({lost_races} lost races)");
    });
}

/// `StreamSender::send` is not cancel-safe, as documented: a send that loses the race was not
/// sent (its message is lost); every send that completed was, in order.
#[test]
fn a_channel_send_that_loses_a_select_was_not_sent() {
    on_channel("the raced send", |ch, _| async move {
        let (mut tx, mut rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(ECHO_SLOW, &opts());
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(m) = rx.message().await.unwrap() {
                got.push(m.seq);
            }
            got
        });
        let mut sent = Vec::new();
        for seq in 0..400 {
            match race(tx.send(&msg(seq))).await {
                Some(Ok(())) => sent.push(seq),
                Some(Err(e)) => panic!("send {seq}: {e}"),
                None => tokio::task::yield_now().await,
            }
        }
        drop(tx);
        let got = reader.await.unwrap();
        same_seqs(&got, &sent, "the server got exactly the sends that completed (of 400)");
    });
}

/// A unary call polled by `&mut` in a `select!` loop is cancel-safe: the rounds the other
/// branch wins lose nothing, and the answer comes.
#[test]
fn a_unary_call_polled_by_reference_in_select_keeps_its_answer() {
    on_channel("the raced unary call", |ch, _| async move {
        let mut call = ch.unary::<EchoMsg, EchoMsg>(LATER, msg(7), &opts());
        let mut rounds = 0u64;
        let r = loop {
            tokio::select! {
                r = &mut call => break r,
                () = tokio::time::sleep(Duration::from_millis(1)) => rounds += 1,
            }
        };
        assert_eq!(r.unwrap_or_else(|e| panic!("after {rounds} lost rounds: {e}")).seq, 7);
    });
}

/// A dropped `Channel::connect_with` stops the dispatcher threads it started.
#[test]
fn a_dropped_channel_connect_leaves_no_dispatcher_behind() {
    let (server, probe) = start();
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let alive = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
            .filter(|n| n.starts_with("chan-dropcon"))
            .count()
    };
    rt.block_on(async {
        let cfg = channel_config().thread_name("chan-dropcon").dispatchers(2);
        // The first poll starts the dispatchers; their handshakes take longer than one poll.
        let mut dropped = 0;
        for _ in 0..20 {
            match race(Channel::connect_with(addr, &cfg)).await {
                None => dropped += 1,
                Some(ch) => drop(ch.unwrap()),
            }
        }
        assert!(dropped > 0, "every connect completed within one poll");
        // A connect after dropped ones works.
        let ch = Channel::connect_with(addr, &cfg).await.unwrap();
        let r = ch.unary::<EchoMsg, EchoMsg>(LATER, msg(1), &opts()).await.unwrap();
        assert_eq!(r.seq, 1);
    });
    wait_until(
        "the dropped connects' dispatchers to end",
        WAIT,
        || alive() == 0,
        || format!("{} dispatcher threads alive; {}", alive(), probe_state(&probe)),
    );
    drop(rt);
    server.shutdown();
}

/// `RequestStream::message_async` is cancel-safe: a reader that races it against an expired
/// timeout loses no message (the server answers DATA_LOSS at a gap).
#[test]
fn a_request_stream_read_that_loses_a_select_loses_no_message() {
    on_channel("the raced server read", |ch, _| async move {
        let mut call = ch.client_stream::<EchoMsg, EchoMsg>(READ_RACED, &opts());
        for seq in 0..300 {
            call.send(&msg(seq)).await.unwrap();
        }
        assert_eq!(call.finish().await.unwrap().seq, 300);
    });
}

/// `StreamSink::send_async` is not cancel-safe, as documented: a send that loses the race was
/// not sent; every one that completed was, in order.
#[test]
fn a_sink_send_that_loses_a_select_was_not_sent() {
    on_channel("the raced server send", |ch, probe| async move {
        let mut rx = ch.server_stream::<_, EchoMsg>(SEND_RACED, msg(3000), &opts());
        let mut got = Vec::new();
        while let Some(m) = rx.message().await.unwrap() {
            got.push(m.seq);
            if got.len() % 64 == 0 {
                // Let the sink fill, so some sends wait for room (and lose their race).
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let sent = probe.sent.lock().unwrap().clone();
        same_seqs(&got, &sent, "the client got exactly the sends that completed (of 3000)");
    });
}

/// `Responder::cancelled` is cancel-safe: a watcher that drops it every round (it loses an
/// always-ready race) still sees the cancel.
#[test]
fn a_responder_cancelled_future_dropped_every_round_still_sees_the_cancel() {
    on_channel("the raced cancel watch", |ch, probe| async move {
        let call = ch.unary::<EchoMsg, EchoMsg>(WATCH, msg(0), &opts());
        let mut call = Box::pin(call);
        // Sent (and the handler running) before the call is dropped.
        while probe.entered.load(Ordering::Acquire) == 0 {
            assert!(race(&mut call).await.is_none(), "WATCH never answers");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(call);
        let probe2 = probe.clone();
        let seen = tokio::task::spawn_blocking(move || {
            until_seen("the watcher to see the cancel", &probe2, |p| &p.sink)
        })
        .await
        .unwrap();
        assert_eq!(seen, Seen::Failed(Code::Cancelled));
    });
}

/// A blocking client's `unary_async` future polled by `&mut` in a `select!` loop is
/// cancel-safe: the rounds the other branch wins lose nothing, and the answer comes.
#[test]
fn a_client_async_call_polled_by_reference_in_select_keeps_its_answer() {
    let (server, _probe) = start();
    let c = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let req = msg(5);
        let mut call = Box::pin(c.unary_async::<EchoMsg, EchoMsg>(LATER, &req, &opts()));
        let mut rounds = 0u64;
        let r = tokio::time::timeout(WAIT, async {
            loop {
                match race(&mut call).await {
                    Some(r) => break r,
                    None => {
                        rounds += 1;
                        tokio::task::yield_now().await;
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| fail("the raced call hung"));
        assert_eq!(r.unwrap_or_else(|e| panic!("after {rounds} lost rounds: {e}")).seq, 5);
    });
    drop(c);
    server.shutdown();
}
