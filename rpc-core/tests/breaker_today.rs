//! Adversarial tests of today's changes: the request stream's cancel (reader drops what it did
//! not take), the sink of a call answered at once, the idle probe (FLAG_IDLE_PONGS, protocol 6)
//! and the Channel dispatcher's watch backoff.

#[path = "rpc_support/mod.rs"]
mod rpc_support;

use std::future::Future;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::verbs::rc::RcConfig;
use rpc_core::wire::{read_frame, write_frame, Frame, FLAG_IDLE_PONGS, HEADER_LEN, PROTOCOL_VERSION};
use rpc_core::{CallOptions, Channel, ChannelConfig, Client, PollingPolicy, ServerHandle};
use rpc_support::*;

const ASYNC_READ: MethodId = method_id("/test.Brk/AsyncRead");
const SYNC_READ: MethodId = method_id("/test.Brk/SyncRead");
const PANIC_SINK: MethodId = method_id("/test.Brk/PanicSink");
const ERR_BIDI: MethodId = method_id("/test.Brk/ErrBidi");
const SUM: MethodId = method_id("/test.Brk/Sum");
const LIST: MethodId = method_id("/test.Brk/List");
const DROP_EARLY: MethodId = method_id("/test.Brk/DropEarly");

#[derive(Default)]
struct Probe {
    /// Readers that finished (either way).
    done: AtomicU64,
    /// Failures seen by readers/producers (a gap, an end instead of a cancel, a Some after the end).
    failures: Mutex<Vec<String>>,
    /// Producers whose send returned an error.
    producers_cancelled: AtomicU64,
    /// DROP_EARLY handlers answer once this is set.
    release: AtomicBool,
    /// Looks that found the call cancelled with messages still queued.
    mid: AtomicU64,
    /// Messages taken before the cancel, summed.
    taken: AtomicU64,
}

impl Probe {
    fn fail(&self, s: String) {
        self.failures.lock().unwrap().push(s);
    }
}

struct ThreadWaker(std::thread::Thread, AtomicBool);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.1.store(true, Ordering::Release);
        self.0.unpark();
    }
}

/// A one-future executor woken only by the future's waker (a lost wake-up shows as a stall of
/// 5 s, reported by the caller).
fn run_async<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let tw = Arc::new(ThreadWaker(std::thread::current(), AtomicBool::new(false)));
    let w = Waker::from(tw.clone());
    let mut cx = Context::from_waker(&w);
    loop {
        tw.1.store(false, Ordering::Release);
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        let t = Instant::now();
        while !tw.1.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(5) {
            std::thread::park_timeout(Duration::from_secs(5));
        }
    }
}

fn msg(seq: u64, len: usize) -> EchoMsg {
    EchoMsg { seq, payload: payload(seq, len), checksum: 0, reply_len: 0 }
}

struct Brk {
    probe: Arc<Probe>,
}

/// Reads until an end or error checking order; then reads 20 more times (must never give Some).
fn check_reader(
    requests: &mut RequestStream<EchoMsg>,
    asynch: bool,
    probe: &Probe,
    what: &str,
    stall: bool,
) -> Result<EchoMsg, Status> {
    let next =
        |r: &mut RequestStream<EchoMsg>| if asynch { run_async(r.message_async()) } else { r.message() };
    let start = Instant::now();
    let mut n = 0u64;
    let end = loop {
        if stall && n >= 2 {
            std::thread::sleep(Duration::from_micros(150));
        }
        if requests.is_cancelled() && requests.queued() > 0 {
            probe.mid.fetch_add(1, Ordering::AcqRel);
        }
        match next(requests) {
            Ok(Some(m)) => {
                if m.seq != n {
                    probe.fail(format!("{what}: message {} arrived as {n}", m.seq));
                }
                n += 1;
            }
            Ok(None) => break Ok(EchoMsg { seq: n, ..Default::default() }),
            Err(e) => break Err(e),
        }
    };
    probe.taken.fetch_add(n, Ordering::AcqRel);
    if start.elapsed() > Duration::from_secs(4) {
        probe.fail(format!("{what}: reader stalled {:?} (lost wake-up?)", start.elapsed()));
    }
    for i in 0..20 {
        match next(requests) {
            Ok(None) => {}
            other => probe.fail(format!("{what}: look {i} after the end gave {other:?}")),
        }
    }
    end
}

impl Service for Brk {
    const NAME: &'static str = "test.Brk";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: ASYNC_READ, name: "/test.Brk/AsyncRead" },
        MethodDesc { id: SYNC_READ, name: "/test.Brk/SyncRead" },
        MethodDesc { id: PANIC_SINK, name: "/test.Brk/PanicSink" },
        MethodDesc { id: ERR_BIDI, name: "/test.Brk/ErrBidi" },
        MethodDesc { id: SUM, name: "/test.Brk/Sum" },
        MethodDesc { id: LIST, name: "/test.Brk/List" },
        MethodDesc { id: DROP_EARLY, name: "/test.Brk/DropEarly" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let probe = self.probe.clone();
        match method {
            ASYNC_READ | SYNC_READ | SUM => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let r =
                        check_reader(&mut requests, method == ASYNC_READ, &probe, "reader", method != SUM);
                    probe.done.fetch_add(1, Ordering::AcqRel);
                    if method != SUM {
                        // Every stream of these is cancelled by its client: an end is a bug.
                        match &r {
                            Err(e) if e.code() == Code::Cancelled => {}
                            other => {
                                probe.fail(format!("{method:#x}: a cancelled stream ended with {other:?}"))
                            }
                        }
                    }
                    responder.send(r);
                });
                out.reply(reply);
            }
            PANIC_SINK => {
                let (sink, _reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || produce_until_cancelled(&sink, &probe, "panic-sink", ()));
                panic!("handler panics after taking its sink (on purpose)");
            }
            ERR_BIDI => {
                let requests = ctx.requests::<EchoMsg>();
                let (sink, _reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || produce_until_cancelled(&sink, &probe, "err-bidi", requests));
                out.error(Status::failed_precondition("answered at once"));
            }
            DROP_EARLY => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let a = requests.message();
                    let b = requests.message();
                    drop(requests);
                    let start = Instant::now();
                    while !probe.release.load(Ordering::Acquire) && start.elapsed() < WAIT {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let ok = matches!((&a, &b), (Ok(Some(x)), Ok(Some(y))) if x.seq == 0 && y.seq == 1);
                    responder.send(if ok {
                        Ok(EchoMsg { seq: 2, ..Default::default() })
                    } else {
                        Err(Status::data_loss(format!("{a:?} {b:?}")))
                    });
                });
                out.reply(reply);
            }
            LIST => {
                let req: EchoMsg = match decode(body) {
                    Ok(r) => r,
                    Err(s) => return out.error(s),
                };
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    for seq in 0..req.seq {
                        if sink.send(&msg(seq, req.reply_len as usize)).is_err() {
                            probe.fail(format!("LIST producer cancelled at {seq}"));
                            return;
                        }
                    }
                });
                out.reply(reply);
            }
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

/// A producer on a sink whose call was answered at once: sends until its send fails (counted
/// in `producers_cancelled`), or records a failure after [`WAIT`]; `_keep` lives as long.
fn produce_until_cancelled<K>(sink: &StreamSink<EchoMsg>, probe: &Probe, what: &str, _keep: K) {
    let start = Instant::now();
    for seq in 0.. {
        if sink.send(&msg(seq, 64)).is_err() {
            probe.producers_cancelled.fetch_add(1, Ordering::AcqRel);
            return;
        }
        if start.elapsed() > WAIT {
            probe.fail(format!("{what} producer never cancelled"));
            return;
        }
    }
}

fn start() -> (ServerHandle, Arc<Probe>, Client) {
    let probe = Arc::new(Probe::default());
    // Granted 32 credits at the handshake: at the default 2 (raised on demand) the readers
    // test stalls with 204 of its 220 readers done (open: credits on demand, 2026-12-07).
    let h =
        server().initial_credits(32).add_service(Brk { probe: probe.clone() }).spawn("127.0.0.1:0").unwrap();
    let c = Client::connect_with(h.local_addr(), &client_config()).unwrap();
    (h, probe, c)
}

fn no_failures(probe: &Probe) {
    let f = probe.failures.lock().unwrap();
    assert!(f.is_empty(), "{} failures, first: {:?}", f.len(), &f[..f.len().min(5)]);
}

fn upload(c: &Client, count: u64) {
    let mut s = c.client_stream::<EchoMsg, EchoMsg>(SUM, &CallOptions::default()).unwrap();
    for seq in 0..count {
        s.send(&msg(seq, 40)).unwrap();
    }
    let r = s.finish().unwrap();
    assert_eq!(r.seq, count, "every message of an upload arrived");
}

/// Attack 1: readers (async and blocking, slow now and then) racing a client's cancel: what they
/// take is 0, 1, 2, ... then CANCELLED, then only Ok(None); no stall; the session still serves.
#[test]
fn readers_racing_a_cancel_take_a_gapless_prefix_then_only_the_end() {
    let (h, probe, c) = start();
    let rounds = 200u64;
    for round in 0..rounds {
        let method = if round % 2 == 0 { ASYNC_READ } else { SYNC_READ };
        let mut s = c.client_stream::<EchoMsg, EchoMsg>(method, &CallOptions::default()).unwrap();
        let n = 5 + (round * 37) % 150;
        for seq in 0..n {
            match s.try_send(&msg(seq, 16 + (seq as usize % 3) * 600)) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => panic!("round {round}: send {seq}: {e}"),
            }
        }
        drop(s); // cancel while the reader is mid-queue
        if round % 10 == 9 {
            upload(&c, 100);
        }
    }
    wait_until(
        "every reader to finish",
        WAIT,
        || {
            c.progress();
            probe.done.load(Ordering::Acquire) >= rounds + rounds / 10
        },
        || {
            format!(
                "done {:?}, failures {:?}, server {:?}",
                probe.done,
                probe.failures.lock().unwrap(),
                h.counters()
            )
        },
    );
    no_failures(&probe);
    let mid = probe.mid.load(Ordering::Acquire);
    // How often a cancel found messages still queued depends on the scheduling (about 110 of
    // 200 rounds on an idle 2-core machine, none on a loaded one): reported, not asserted; the
    // unit test `dispatch::source::tests::a_cancel_racing_the_reader_never_leaves_a_gap_in_what_it_takes`
    // forces the race.
    eprintln!("cancels seen mid-queue: {mid}, taken {}", probe.taken.load(Ordering::Acquire));
    upload(&c, 500);
}

/// Attack 2: a handler that takes ctx.stream() and then panics (and one that answers a bidi at
/// once while holding its request stream), followed by many streamed calls of every kind.
#[test]
fn a_sink_taken_then_a_panic_is_cancelled_and_later_calls_are_clean() {
    let (h, probe, c) = start();
    for i in 0..20u64 {
        let mut s =
            c.server_stream::<_, EchoMsg>(PANIC_SINK, &EchoMsg::default(), &CallOptions::default()).unwrap();
        let e = s.message().expect_err("a panicking handler's stream must end in an error");
        assert_eq!(e.code(), Code::Internal, "round {i}: {e}");
        drop(s);
        let mut b = c.bidi_stream::<EchoMsg, EchoMsg>(ERR_BIDI, &CallOptions::default()).unwrap();
        for seq in 0..5 {
            if b.send(&msg(seq, 32)).is_err() {
                break;
            }
        }
        let e = loop {
            match b.message() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("round {i}: a clean end from a call answered with an error"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.code(), Code::FailedPrecondition, "round {i}: {e}");
        drop(b);
        upload(&c, 30);
        let mut l = c.server_stream::<_, EchoMsg>(LIST, &msg(25, 0), &CallOptions::default()).unwrap();
        for seq in 0..25 {
            let m = l.message().unwrap().unwrap_or_else(|| panic!("round {i}: LIST ended at {seq}"));
            assert_eq!(m.seq, seq, "round {i}: a LIST message from another call's sink?");
        }
        assert!(l.message().unwrap().is_none(), "round {i}: LIST did not end after 25");
    }
    wait_until(
        "every producer to see its stream cancelled",
        WAIT,
        || {
            c.progress();
            probe.producers_cancelled.load(Ordering::Acquire) >= 40
        },
        || format!("{:?} producers cancelled; server {:?}", probe.producers_cancelled, h.counters()),
    );
    no_failures(&probe);
}

/// A raw session whose handshake carries `flags`.
fn raw_with_flags(addr: std::net::SocketAddr, flags: u16) -> RawClient {
    let peer = RawPeer::new(256, 16, HEADER_LEN + 4096, 1 << 16, 1);
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let mut hs = peer.handshake(4, 4096, 1 << 20, 0);
    hs.flags = flags;
    write_frame(&mut tcp, &Frame::Handshake(hs)).unwrap();
    let reply = match read_frame(&mut tcp).unwrap() {
        Frame::Handshake(r) => r,
        other => panic!("refused: {other:?}"),
    };
    tcp.set_read_timeout(None).unwrap();
    peer.connect(&RcConfig::default(), &reply);
    let session = reply.session;
    RawClient::over(peer, &reply, session, tcp)
}

/// The server's answer to a handshake tweaked by `tweak`.
fn refusal(addr: std::net::SocketAddr, tweak: impl FnOnce(&mut rpc_core::wire::Handshake)) -> String {
    let peer = RawPeer::new(64, 4, HEADER_LEN + 4096, 1 << 16, 1);
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let mut hs = peer.handshake(4, 4096, 1 << 20, 0);
    tweak(&mut hs);
    write_frame(&mut tcp, &Frame::Handshake(hs)).unwrap();
    match read_frame(&mut tcp) {
        Ok(Frame::Refusal(r)) => format!("{:?}: {}", r.code, r.message),
        other => panic!("not a refusal: {other:?}"),
    }
}

/// Attack 3a: unknown flag bits and an old protocol version get a clear refusal; the server
/// still serves afterwards.
#[test]
fn unknown_flags_and_an_old_version_are_refused_clearly() {
    let (h, _) = spawn(server());
    for bits in [0x0002u16, 0x8000, 0xffff, FLAG_IDLE_PONGS | 0x0100] {
        let r = refusal(h.local_addr(), |hs| hs.flags = bits);
        assert!(r.contains("flags"), "flags {bits:#x}: refusal {r:?} does not name 'flags'");
    }
    for v in [PROTOCOL_VERSION - 1, 0, PROTOCOL_VERSION + 1] {
        let r = refusal(h.local_addr(), |hs| hs.version = v);
        assert!(r.contains(&format!("protocol {v}")), "version {v}: refusal {r:?}");
    }
    let c = Client::connect_with(h.local_addr(), &client_config()).unwrap();
    let r: EchoMsg = c.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap();
    check_reply(&r, 1, 8);
}

/// Attack 3b: a raw client that says it answers Pings while idle and never does is closed
/// after peer_timeout (not before), while a raw client without the flag, equally silent and
/// idle, is left alone and a live Client is served throughout.
#[test]
fn an_idle_client_that_promised_pongs_and_never_answers_is_closed_others_served() {
    let t = Duration::from_millis(600);
    let (h, _) = spawn(server().peer_timeout(Some(t)));
    let c = Client::connect_with(h.local_addr(), &client_config()).unwrap();
    let opened = Instant::now();
    let mut liar = raw_with_flags(h.local_addr(), FLAG_IDLE_PONGS);
    let mut quiet = raw_with_flags(h.local_addr(), 0);
    let mut seq = 0;
    let found = loop {
        let _ = liar.try_poll();
        let _ = quiet.try_poll();
        seq += 1;
        let r: EchoMsg = c.unary(ECHO, &request(seq, 8, 8), &CallOptions::default()).unwrap();
        check_reply(&r, seq, 8);
        if h.counters().peers_lost >= 1 {
            break opened.elapsed();
        }
        assert!(opened.elapsed() < Duration::from_secs(20), "never closed: {:?}", h.counters());
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(found >= t.mul_f32(0.9), "closed after {found:?}, before peer_timeout {t:?}");
    // Two more timeouts: the flagless idle raw session and the live client stay.
    let until = Instant::now() + 3 * t;
    while Instant::now() < until {
        let _ = quiet.try_poll();
        seq += 1;
        let r: EchoMsg = c.unary(ECHO, &request(seq, 8, 8), &CallOptions::default()).unwrap();
        check_reply(&r, seq, 8);
        std::thread::sleep(Duration::from_millis(20));
    }
    let k = h.counters();
    assert_eq!(k.peers_lost, 1, "only the liar is lost: {k:?}");
    assert!(!quiet.dead, "the flagless idle session was closed");
}

fn chan_config(name: &str) -> ChannelConfig {
    ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500)
        .thread_name(name)
}

/// Attack 3c: Channels (2 dispatchers, and one with the default config) idle for several peer
/// timeouts while a thread burns a core are not closed, and serve afterwards.
#[test]
fn idle_channels_on_a_loaded_machine_stay_open_for_many_peer_timeouts() {
    let t = Duration::from_millis(700);
    let (h, _) = spawn(server().peer_timeout(Some(t)));
    let a = Channel::connect_blocking(h.local_addr(), &chan_config("brk-idle").dispatchers(2)).unwrap();
    let b = Channel::connect_blocking(
        h.local_addr(),
        &ChannelConfig::default().client(client_config()).thread_name("brk-idle-d"),
    )
    .unwrap();
    for (i, ch) in [&a, &b].into_iter().enumerate() {
        for k in 0..4u64 {
            let r = block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(k, 8, 8), &CallOptions::default()))
                .unwrap();
            check_reply(&r, k, 8);
        }
        let _ = i;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let burner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = x.wrapping_mul(31).wrapping_add(1);
                std::hint::black_box(x);
            }
        })
    };
    std::thread::sleep(5 * t);
    stop.store(true, Ordering::Relaxed);
    burner.join().unwrap();
    let k = h.counters();
    assert_eq!((k.peers_lost, k.sessions_closed), (0, 0), "an idle Channel session was closed: {k:?}");
    for ch in [&a, &b] {
        for k in 10..14u64 {
            let r = block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(k, 8, 8), &CallOptions::default()))
                .unwrap_or_else(|e| panic!("after idling: {e}; server {:?}", h.counters()));
            check_reply(&r, k, 8);
        }
    }
}

struct CountingWaker(AtomicUsize);
impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// Attack 4: calls polled once and then left (their task never comes back until woken) are
/// completed by the dispatcher thread: ECHOs at once, and a DEFER answered after 3 peer
/// timeouts (the server probes meanwhile: the dispatcher must answer for the stranded session).
#[test]
fn a_stranded_channel_session_is_completed_by_its_dispatcher_and_kept_alive() {
    let t = Duration::from_millis(500);
    let (h, _) = spawn(server().peer_timeout(Some(t)));
    let ch = Channel::connect_blocking(h.local_addr(), &chan_config("brk-strand")).unwrap();
    for round in 0..5u64 {
        let waker = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let w = Waker::from(waker.clone());
        let mut cx = Context::from_waker(&w);
        let slow_ms = if round == 0 { 3 * t.as_millis() as usize } else { 5 };
        let mut slow =
            Box::pin(ch.unary::<EchoMsg, EchoMsg>(DEFER, request(99, 0, slow_ms), &CallOptions::default()));
        let mut calls: Vec<_> = (0..6u64)
            .map(|k| Box::pin(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(k, 8, 8), &CallOptions::default())))
            .collect();
        let mut pending = 0;
        let mut done = vec![false; calls.len()];
        for (k, c) in calls.iter_mut().enumerate() {
            if let Poll::Ready(r) = c.as_mut().poll(&mut cx) {
                check_reply(&r.unwrap(), k as u64, 8);
                done[k] = true;
            } else {
                pending += 1;
            }
        }
        let slow_pending = slow.as_mut().poll(&mut cx).is_pending();
        assert!(slow_pending, "a DEFER of {slow_ms} ms answered at its first poll");
        // Nobody polls now: only the dispatcher thread can finish these.
        let started = Instant::now();
        let until = started + WAIT;
        while waker.0.load(Ordering::Acquire) < pending + 1 {
            assert!(
                Instant::now() < until,
                "round {round}: {} of {} wakes after {:?}; stats {:?}; server {:?}",
                waker.0.load(Ordering::Acquire),
                pending + 1,
                started.elapsed(),
                ch.stats(),
                h.counters()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        for (k, c) in calls.iter_mut().enumerate().filter(|(k, _)| !done[*k]) {
            let Poll::Ready(r) = c.as_mut().poll(&mut cx) else {
                panic!("round {round}: call {k} woken but not ready")
            };
            check_reply(&r.unwrap(), k as u64, 8);
        }
        // The slow one: ready after its delay (its wake may have been the last).
        let until = Instant::now() + WAIT;
        let r = loop {
            if let Poll::Ready(r) = slow.as_mut().poll(&mut cx) {
                break r;
            }
            assert!(Instant::now() < until, "round {round}: slow never ready; {:?}", h.counters());
            std::thread::sleep(Duration::from_millis(5));
        };
        let r = r.unwrap_or_else(|e| {
            panic!("round {round}: stranded DEFER failed: {e}; server {:?}", h.counters())
        });
        assert_eq!(r.seq, 99);
    }
    let k = h.counters();
    assert_eq!(k.peers_lost, 0, "the stranded session was declared dead: {k:?}");
}

/// Attack 1b: a handler that reads two messages and drops its RequestStream: the client's
/// stream goes on (grants come back) for many times the stream budget, then ends and gets the
/// handler's answer.
#[test]
fn a_dropped_request_stream_still_returns_grants() {
    let (h, probe, c) = start();
    for round in 0..3 {
        probe.release.store(false, Ordering::Release);
        let mut s = c.client_stream::<EchoMsg, EchoMsg>(DROP_EARLY, &CallOptions::default()).unwrap();
        for seq in 0..3000u64 {
            let give_up = Instant::now() + Duration::from_secs(20);
            while !s.try_send(&msg(seq, 100)).unwrap_or_else(|e| panic!("round {round}: send {seq}: {e}")) {
                c.progress();
                assert!(
                    Instant::now() < give_up,
                    "round {round}: stalled at message {seq}: grants not returned; server {:?}",
                    h.counters()
                );
                std::thread::yield_now();
            }
        }
        probe.release.store(true, Ordering::Release);
        let r = s.finish().unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(r.seq, 2);
    }
    upload(&c, 200);
}

/// Attack 3d: a call made on a Channel (it starts at once, before its first poll) and awaited
/// only later (a task that does something else first: `let f = ch.unary(..); sleep.await;
/// f.await`), for a few peer timeouts. The server answered it at once, so nothing is unanswered;
/// but the Channel promised Pongs while idle (FLAG_IDLE_PONGS), and its dispatcher neither
/// drives (no task waits) nor looks (a call is in flight): the probe's Pings go unanswered.
#[test]
fn a_channel_call_awaited_only_later_does_not_get_the_session_closed() {
    let t = Duration::from_millis(500);
    let (h, _) = spawn(server().peer_timeout(Some(t)));
    let ch = Channel::connect_blocking(h.local_addr(), &chan_config("brk-later")).unwrap();
    let r = block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(1, 8, 8), &CallOptions::default())).unwrap();
    check_reply(&r, 1, 8);
    let later = ch.unary::<EchoMsg, EchoMsg>(ECHO, request(2, 8, 8), &CallOptions::default());
    let before = (ch.in_flight(), ch.calls_started());
    std::thread::sleep(4 * t);
    let k = h.counters();
    let r = block_on(later);
    assert_eq!(
        (k.peers_lost, k.sessions_closed),
        (0, 0),
        "the server closed a Channel session whose call was answered and not yet awaited: {k:?}; the call then gave {r:?}; (in_flight, started) before the wait {before:?}"
    );
    check_reply(&r.unwrap(), 2, 8);
}
