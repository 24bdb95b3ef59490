//! Client-streaming and bidirectional streams end to end (sim, or rxe0 in the Soft-RoCE tier):
//! many messages byte for byte, messages larger than the ring (in pieces), backpressure (a
//! server that stops reading stalls the client's `send` at the stream's grants), cancel from
//! either end, the deadline of the whole stream, a clean end distinct from a cancel, and a large
//! stream of 64 KiB messages.

mod rpc_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::STREAM_QUEUE;
use rpc_core::{CallOptions, Client, ServerHandle};
use rpc_support::*;

/// Client streaming: reads every message, checks it, answers the count and a digest.
const SUM: MethodId = method_id("/test.Up/Sum");
/// Client streaming: reads nothing until the probe's `release` is set, then as SUM.
const STALL: MethodId = method_id("/test.Up/Stall");
/// Client streaming: answers FAILED_PRECONDITION after 3 messages, reading no more.
const REFUSE: MethodId = method_id("/test.Up/Refuse");
/// Server streaming: the request's `seq` messages of its `reply_len` bytes.
const LIST: MethodId = method_id("/test.Up/List");
/// Server streaming, answered anyway: takes the stream's sink, starts a producer on it, and
/// answers FAILED_PRECONDITION at once (the producer records the CANCELLED its send returns).
const OOPS: MethodId = method_id("/test.Up/Oops");
/// Bidirectional: each message comes back (payload and seq) as it is read; the end after the
/// client's end.
const ECHO: MethodId = method_id("/test.Up/Echo");

/// A digest of a sequence of messages: order and every byte count.
fn digest(acc: u64, m: &EchoMsg) -> u64 {
    let mut h = acc ^ m.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for w in m.payload.chunks(8) {
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(b)).wrapping_mul(0x0100_0000_01b3).rotate_left(5);
    }
    h ^ m.payload.len() as u64
}

/// A payload of `len` bytes for `seq`, fast to make in a debug build (a word at a time).
fn words(seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn msg(seq: u64, len: usize) -> EchoMsg {
    EchoMsg { seq, payload: words(seq, len), checksum: 0, reply_len: 0 }
}

/// What the server's readers saw.
#[derive(Default)]
struct Probe {
    /// Messages taken by readers.
    taken: AtomicU64,
    /// A reader's stream ended with an error (cancelled).
    cancelled: AtomicBool,
    /// A reader's stream ended cleanly.
    ended: AtomicBool,
    /// STALL readers may read.
    release: AtomicBool,
    /// How the last stream a reader read ended, for failure messages.
    last: std::sync::Mutex<String>,
}

struct UpService {
    probe: Arc<Probe>,
}

/// Reads the whole stream: (count, digest), or the error that ended it.
fn read_all(requests: &mut RequestStream<EchoMsg>, probe: &Probe) -> Result<EchoMsg, Status> {
    let mut n = 0u64;
    let mut acc = 0u64;
    loop {
        match requests.message() {
            Ok(Some(m)) => {
                if m.seq != n {
                    let e = Status::data_loss(format!("message {} arrived as {n}", m.seq));
                    *probe.last.lock().unwrap() = format!("ended after {n} messages: {e}");
                    return Err(e);
                }
                acc = digest(acc, &m);
                n += 1;
                probe.taken.fetch_add(1, Ordering::AcqRel);
            }
            Ok(None) => {
                *probe.last.lock().unwrap() = format!("ended cleanly after {n} messages");
                probe.ended.store(true, Ordering::Release);
                return Ok(EchoMsg { seq: n, checksum: acc, payload: Vec::new(), reply_len: 0 });
            }
            Err(e) => {
                *probe.last.lock().unwrap() = format!("ended after {n} messages: {e}");
                probe.cancelled.store(true, Ordering::Release);
                return Err(e);
            }
        }
    }
}

impl Service for UpService {
    const NAME: &'static str = "test.Up";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: SUM, name: "/test.Up/Sum" },
        MethodDesc { id: STALL, name: "/test.Up/Stall" },
        MethodDesc { id: REFUSE, name: "/test.Up/Refuse" },
        MethodDesc { id: ECHO, name: "/test.Up/Echo" },
        MethodDesc { id: LIST, name: "/test.Up/List" },
        MethodDesc { id: OOPS, name: "/test.Up/Oops" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let probe = self.probe.clone();
        match method {
            LIST => {
                let req: EchoMsg = match decode(body) {
                    Ok(r) => r,
                    Err(s) => return out.error(s),
                };
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    for seq in 0..req.seq {
                        if sink.send(&msg(seq, req.reply_len as usize)).is_err() {
                            probe.cancelled.store(true, Ordering::Release);
                            return;
                        }
                    }
                });
                out.reply(reply);
            }
            OOPS => {
                let (sink, _reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    for seq in 0.. {
                        if sink.send(&msg(seq, 100)).is_err() {
                            *probe.last.lock().unwrap() = format!("the producer's send {seq} failed");
                            probe.cancelled.store(true, Ordering::Release);
                            return;
                        }
                    }
                });
                out.error(Status::failed_precondition("answered, not streamed"));
            }
            SUM | STALL | REFUSE => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    if method == STALL {
                        while !probe.release.load(Ordering::Acquire) && !requests.is_cancelled() {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    if method == REFUSE {
                        for _ in 0..3 {
                            let _ = requests.message();
                        }
                        return responder.send(Err(Status::failed_precondition("three is enough")));
                    }
                    responder.send(read_all(&mut requests, &probe));
                });
                out.reply(reply);
            }
            ECHO => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || loop {
                    match requests.message() {
                        Ok(Some(m)) => {
                            probe.taken.fetch_add(1, Ordering::AcqRel);
                            if sink.send(&m).is_err() {
                                probe.cancelled.store(true, Ordering::Release);
                                return;
                            }
                        }
                        Ok(None) => {
                            probe.ended.store(true, Ordering::Release);
                            return;
                        }
                        Err(_) => {
                            probe.cancelled.store(true, Ordering::Release);
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

fn start() -> (ServerHandle, Arc<Probe>, Client) {
    let probe = Arc::new(Probe::default());
    let h = server().add_service(UpService { probe: probe.clone() }).spawn("127.0.0.1:0").unwrap();
    let c = Client::connect_with(h.local_addr(), &client_config()).unwrap();
    (h, probe, c)
}

/// [`wait_until`] `f`, reporting what the server's readers saw.
#[track_caller]
fn until(what: &str, probe: &Probe, f: impl FnMut() -> bool) {
    wait_until(what, WAIT, f, || {
        format!(
            "readers took {}, cancelled {}, ended {}, last stream: {}",
            probe.taken.load(Ordering::Acquire),
            probe.cancelled.load(Ordering::Acquire),
            probe.ended.load(Ordering::Acquire),
            probe.last.lock().unwrap_or_else(|e| e.into_inner())
        )
    });
}

/// Sends `count` messages of `size` bytes on a client stream and checks the server's digest.
fn upload(c: &Client, count: u64, size: usize) {
    upload_with(c, count, size, &CallOptions::default());
}

fn upload_with(c: &Client, count: u64, size: usize, opts: &CallOptions) {
    let mut s = c.client_stream::<EchoMsg, EchoMsg>(SUM, opts).unwrap();
    let mut acc = 0;
    for seq in 0..count {
        let m = msg(seq, size);
        acc = digest(acc, &m);
        s.send(&m).unwrap();
    }
    let r = s.finish().unwrap();
    assert_eq!(r.seq, count, "every message arrived, in order");
    assert_eq!(r.checksum, acc, "every byte arrived");
}

/// A handler that takes a stream's sink and answers the call at once: the answer ends the
/// stream, so the sink's producer gets CANCELLED (it does not wait forever for a worker that
/// never takes its messages), and the sink is not the next deferred call's (the worker's
/// per-call context kept it, and the next client stream's answer was preceded by the
/// producer's messages).
#[test]
fn a_sink_of_a_call_answered_at_once_is_cancelled_not_left_to_the_next_call() {
    let (_h, probe, c) = start();
    let mut s = c.server_stream::<_, EchoMsg>(OOPS, &EchoMsg::default(), &CallOptions::default()).unwrap();
    let e = s.message().unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    drop(s);
    until("the producer to see its stream cancelled", &probe, || probe.cancelled.load(Ordering::Acquire));
    probe.cancelled.store(false, Ordering::Release);
    for _ in 0..3 {
        upload(&c, 50, 100);
    }
    assert!(!probe.cancelled.load(Ordering::Acquire));
}

#[test]
fn client_stream_of_many_messages_arrives_byte_for_byte() {
    let (_h, probe, c) = start();
    upload(&c, 2000, 32);
    upload(&c, 256, 64 << 10);
    upload(&c, 0, 0);
    assert!(probe.ended.load(Ordering::Acquire));
    assert!(!probe.cancelled.load(Ordering::Acquire), "a finished stream is an end, not a cancel");
}

#[test]
fn client_stream_messages_larger_than_the_ring_arrive_in_pieces_byte_for_byte() {
    let (_h, _probe, c) = start();
    // 3 MiB each, three times the server's ring: each goes in pieces. Mixed with small ones.
    let mut s = c.client_stream::<EchoMsg, EchoMsg>(SUM, &CallOptions::default()).unwrap();
    let mut acc = 0;
    for seq in 0..7u64 {
        let m = msg(seq, if seq % 2 == 0 { 3 << 20 } else { 17 });
        acc = digest(acc, &m);
        s.send(&m).unwrap();
    }
    let r = s.finish().unwrap();
    assert_eq!((r.seq, r.checksum), (7, acc));
}

#[test]
fn bidi_stream_echoes_many_messages_byte_for_byte_in_order() {
    let (_h, probe, c) = start();
    for (count, size) in [(3000u64, 24usize), (200, 64 << 10), (4, 3 << 20)] {
        let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::default()).unwrap();
        let ahead = 6;
        let mut next = 0u64;
        let check = |m: EchoMsg, seq: u64| {
            assert_eq!(m.seq, seq, "echo in order");
            assert!(m.payload == words(seq, size), "echo {seq} of {size} bytes differs");
        };
        for seq in 0..count {
            s.send(&msg(seq, size)).unwrap();
            if seq >= ahead {
                check(s.message().unwrap().expect("an echo"), next);
                next += 1;
            }
        }
        s.finish();
        while next < count {
            check(s.message().unwrap().expect("an echo"), next);
            next += 1;
        }
        assert_eq!(s.message().unwrap(), None, "a clean end after the client's end");
        until("the reader to see the end", &probe, || probe.ended.load(Ordering::Acquire));
        probe.ended.store(false, Ordering::Release);
    }
    assert!(!probe.cancelled.load(Ordering::Acquire));
}

#[test]
fn a_server_that_stops_reading_stalls_the_clients_send_at_the_grant_limit() {
    let (_h, probe, c) = start();
    let mut s = c.client_stream::<EchoMsg, EchoMsg>(STALL, &CallOptions::default()).unwrap();
    let mut sent = 0u64;
    let mut acc = 0;
    let mut stable_since = Instant::now();
    let give_up = Instant::now() + WAIT;
    // Try to send for 300 ms after the last accepted message: the credits run out and stay out.
    while stable_since.elapsed() < Duration::from_millis(300) {
        let m = msg(sent, 1000);
        if s.try_send(&m).unwrap() {
            acc = digest(acc, &m);
            sent += 1;
            stable_since = Instant::now();
        }
        assert!(Instant::now() < give_up, "the sender never stalled ({sent} sent)");
        std::thread::yield_now();
    }
    // The stream's grants: half the session's stream budget (the window, 32 by default), each
    // a SEND of one message or a batch of those that waited for a credit, plus the client's one
    // open batch waiting for the next (batches: an eager buffer of 4096 bytes, messages of at
    // least 1000 bytes and a frame's length each).
    let batched = 4096 / (rpc_core::wire::FRAME_LEN as u64 + 1000);
    assert!(
        sent <= (16 + 1) * batched,
        "the client sent {sent} messages to a server that reads none: above the credits"
    );
    assert!(sent >= 4, "only {sent} sent: the server granted (almost) no credits");
    assert_eq!(probe.taken.load(Ordering::Acquire), 0);
    // Reading lets it go on to the end, and a blocking send waits its turn.
    probe.release.store(true, Ordering::Release);
    for seq in sent..sent + 500 {
        let m = msg(seq, 1000);
        acc = digest(acc, &m);
        s.send(&m).unwrap();
    }
    let r = s.finish().unwrap();
    assert_eq!((r.seq, r.checksum), (sent + 500, acc));
}

#[test]
fn the_client_cancels_by_dropping_its_stream_and_the_reader_sees_a_cancel_not_an_end() {
    let (_h, probe, c) = start();
    let mut s = c.client_stream::<EchoMsg, EchoMsg>(SUM, &CallOptions::default()).unwrap();
    for seq in 0..5 {
        s.send(&msg(seq, 100)).unwrap();
    }
    until("the reader to take the messages", &probe, || {
        c.progress();
        probe.taken.load(Ordering::Acquire) == 5
    });
    drop(s);
    until("the reader to see the cancel", &probe, || {
        c.progress();
        probe.cancelled.load(Ordering::Acquire)
    });
    assert!(!probe.ended.load(Ordering::Acquire), "a cancel is not an end");
    // The slot and credits came back: the same client streams again.
    upload(&c, 100, 10);
}

#[test]
fn the_client_cancels_a_bidi_stream_and_the_server_sees_it() {
    let (_h, probe, c) = start();
    let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::default()).unwrap();
    for seq in 0..3 {
        s.send(&msg(seq, 10)).unwrap();
        assert_eq!(s.message().unwrap().unwrap().seq, seq);
    }
    drop(s);
    until("the server to see the cancel", &probe, || {
        c.progress();
        probe.cancelled.load(Ordering::Acquire)
    });
    assert!(!probe.ended.load(Ordering::Acquire));
    upload(&c, 10, 10);
}

#[test]
fn the_server_ends_a_client_stream_early_and_the_client_gets_its_answer() {
    let (_h, _probe, c) = start();
    let mut s = c.client_stream::<EchoMsg, EchoMsg>(REFUSE, &CallOptions::default()).unwrap();
    let give_up = Instant::now() + WAIT;
    let mut seq = 0;
    let e = loop {
        match s.send(&msg(seq, 100)) {
            Ok(()) => seq += 1,
            Err(e) => break e,
        }
        assert!(Instant::now() < give_up, "sends never failed after the server's answer");
    };
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(seq >= 3);
    let answer = s.finish().unwrap_err();
    assert_eq!((answer.code(), answer.message()), (Code::FailedPrecondition, "three is enough"));
    upload(&c, 10, 10);
}

#[test]
fn the_deadline_ends_the_whole_client_stream_at_both_ends() {
    let (_h, probe, c) = start();
    let mut s = c
        .client_stream::<EchoMsg, EchoMsg>(STALL, &CallOptions::deadline(Duration::from_millis(300)))
        .unwrap();
    let t0 = Instant::now();
    let mut n = 0u64;
    let e = loop {
        match s.send(&msg(n, 64)) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 10_000, "a stalled server took {n} messages");
    };
    // The client's own deadline, or the server's DEADLINE_EXCEEDED answer arrived first (then the
    // send says the server ended the stream, and `finish` gives that answer).
    assert!(matches!(e.code(), Code::DeadlineExceeded | Code::FailedPrecondition), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(250), "ended after {:?}", t0.elapsed());
    assert_eq!(s.finish().unwrap_err().code(), Code::DeadlineExceeded);
    until("the reader to see the stream end", &probe, || {
        c.progress();
        probe.cancelled.load(Ordering::Acquire)
    });
    assert!(!probe.ended.load(Ordering::Acquire));
}

/// Streams `total` bytes in 64 KiB messages through a client stream and a bidi echo, every byte
/// checked.
fn stream_in_64_kib_messages(total: u64) {
    let (h, _probe, _) = start();
    // No idle probe: a ring return the server forgets would stall the client until its deadline
    // (its Ping would otherwise fetch the freed head every 2 s).
    let c = Client::connect_with(h.local_addr(), &client_config().peer_timeout(None)).unwrap();
    let size = 64 << 10;
    let count = total / size as u64;
    let t0 = Instant::now();
    upload_with(&c, count, size, &CallOptions::deadline(Duration::from_secs(600)));
    eprintln!("client stream: {total} bytes in {:?}", t0.elapsed());
    let t0 = Instant::now();
    let mut s =
        c.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::deadline(Duration::from_secs(600))).unwrap();
    let (mut sent, mut next) = (0, 0);
    // One thread both ways: send while credits allow, else take what came back.
    let mut m = msg(0, size);
    // Hang guard: something goes out or comes back within `WAIT`.
    let mut last = (Instant::now(), 0);
    while next < count {
        if sent + next != last.1 {
            last = (Instant::now(), sent + next);
        }
        assert!(
            last.0.elapsed() < WAIT,
            "the bidi echo made no progress for {WAIT:?}: {sent} sent, {next} of {count} back; client {:?}",
            c.counters()
        );
        if sent < count && s.try_send(&m).unwrap() {
            sent += 1;
            m = msg(sent, size);
            if sent == count {
                s.finish();
            }
            continue;
        }
        if let Some(r) = s.try_message() {
            let e = r.unwrap().expect("an echo");
            assert_eq!(e.seq, next);
            assert!(e.payload == words(next, size), "echo {next} differs");
            next += 1;
        }
    }
    assert_eq!(s.message().unwrap(), None);
    eprintln!("bidi echo: {total} bytes each way in {:?}", t0.elapsed());
}

#[test]
fn sixteen_mib_streamed_in_64_kib_messages_both_ways_byte_for_byte() {
    stream_in_64_kib_messages(16 << 20);
}

/// Run by `scripts/test` in release (too slow in the test profile):
/// `cargo test --release -p rpc-core --test rpc_stream_in -- --ignored --exact one_gib_streamed_in_64_kib_messages_both_ways_byte_for_byte`
#[test]
#[ignore = "1 GiB each way: scripts/test runs it in release (see the doc comment)"]
fn one_gib_streamed_in_64_kib_messages_both_ways_byte_for_byte() {
    stream_in_64_kib_messages(1 << 30);
}

// ---- The same streams on the shareable Channel, from tasks of a multi-thread tokio runtime. ----

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn channel(h: &ServerHandle) -> rpc_core::Channel {
    let cfg = rpc_core::ChannelConfig::default()
        .client(client_config().polling(rpc_core::PollingPolicy::Event { spins: 0 }))
        .spins(500);
    rpc_core::Channel::connect_blocking(h.local_addr(), &cfg).unwrap()
}

#[test]
fn channel_streams_of_every_shape_from_eight_tasks_byte_for_byte() {
    let (h, probe, _c) = start();
    let ch = channel(&h);
    let rt = runtime();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let ch = ch.clone();
            tasks.push(tokio::spawn(async move {
                let size = [16usize, 3000, 70_000][t as usize % 3];
                // Server streaming.
                let mut rx = ch.server_stream::<_, EchoMsg>(
                    LIST,
                    EchoMsg { seq: 300, reply_len: size as u32, ..Default::default() },
                    &CallOptions::default(),
                );
                for seq in 0..300 {
                    let m = rx.message().await.unwrap().expect("a message");
                    assert_eq!(m.seq, seq);
                    assert!(m.payload == words(seq, size), "task {t}: message {seq} differs");
                }
                assert_eq!(rx.message().await.unwrap(), None);
                // Client streaming.
                let mut up = ch.client_stream::<EchoMsg, EchoMsg>(SUM, &CallOptions::default());
                let mut acc = 0;
                for seq in 0..300 {
                    let m = msg(seq + t, size);
                    acc = digest(acc, &EchoMsg { seq, ..m.clone() });
                    up.send(&EchoMsg { seq, ..m }).await.unwrap();
                }
                let r = up.finish().await.unwrap();
                assert_eq!((r.seq, r.checksum), (300, acc), "task {t}: client stream");
                // Bidirectional, the two halves in two tasks.
                let (mut tx, mut rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::default());
                let sender = tokio::spawn(async move {
                    for seq in 0..300 {
                        tx.send(&msg(seq, size)).await.unwrap();
                    }
                    tx.finish();
                });
                for seq in 0..300 {
                    let m = rx.message().await.unwrap().expect("an echo");
                    assert_eq!(m.seq, seq);
                    assert!(m.payload == words(seq, size), "task {t}: echo {seq} differs");
                }
                assert_eq!(rx.message().await.unwrap(), None, "a clean end after the client's end");
                sender.await.unwrap();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    assert!(!probe.cancelled.load(Ordering::Acquire));
    assert_eq!(ch.in_flight(), 0);
}

#[test]
fn a_channel_sender_stalls_on_a_server_that_stops_reading_and_cancels_when_dropped() {
    let (h, probe, _c) = start();
    let ch = channel(&h);
    let rt = runtime();
    rt.block_on(async {
        let mut up = ch.client_stream::<EchoMsg, EchoMsg>(STALL, &CallOptions::default());
        let mut sent = 0u64;
        loop {
            let m = msg(sent, 1000);
            let send = up.send(&m);
            match tokio::time::timeout(Duration::from_millis(300), send).await {
                Ok(r) => {
                    r.unwrap();
                    sent += 1;
                    assert!(sent < 10_000, "a server that reads nothing took {sent} messages");
                }
                Err(_) => break,
            }
        }
        // The stream's grants (16), each a SEND of one message or a batch of those that waited
        // for a credit, + the open batch waiting for the next (an eager buffer of 4096 bytes,
        // messages of 1000 bytes and a frame's length each) + the queue to the dispatcher + the
        // one held back when the batch is full.
        let batched = 4096 / (rpc_core::wire::FRAME_LEN as u64 + 1000);
        let bound = (16 + 1) * batched + STREAM_QUEUE as u64 + 1;
        assert!(sent <= bound, "{sent} messages went to a server that reads none (bound {bound})");
        assert!(sent >= 4, "only {sent} sent: no credits were granted");
        // Messages that found no credit were framed into a batch, not held one by one.
        let unbatched = 16 + STREAM_QUEUE as u64 + 1;
        assert!(sent > unbatched, "{sent} sent: no more than one per credit (+ queue, + held)");
        drop(up);
    });
    wait_until(
        "the reader to see the cancel",
        WAIT,
        || probe.cancelled.load(Ordering::Acquire),
        || {
            format!(
                "its stream: {:?}, ended {}; channel {:?}; client counters {:?}; server counters {:?}; in flight {}",
                probe.last.lock().unwrap(),
                probe.ended.load(Ordering::Acquire),
                ch.stats(),
                ch.counters(),
                h.counters(),
                ch.in_flight()
            )
        },
    );
    assert!(!probe.ended.load(Ordering::Acquire));
    // A receiver dropped mid-stream cancels it too; the channel goes on.
    probe.cancelled.store(false, Ordering::Release);
    rt.block_on(async {
        let (mut tx, mut rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::default());
        tx.send(&msg(0, 8)).await.unwrap();
        assert_eq!(rx.message().await.unwrap().unwrap().seq, 0);
        drop(rx);
        until("the server to see the cancel", &probe, || probe.cancelled.load(Ordering::Acquire));
        assert!(tx.send(&msg(1, 8)).await.is_err(), "a cancelled stream takes no more messages");
        let mut up = ch.client_stream::<EchoMsg, EchoMsg>(SUM, &CallOptions::default());
        up.send(&msg(0, 8)).await.unwrap();
        assert_eq!(up.finish().await.unwrap().seq, 1);
    });
}

#[test]
fn the_deadline_ends_a_channel_stream() {
    let (h, probe, _c) = start();
    let ch = channel(&h);
    runtime().block_on(async {
        let mut rx = ch.server_stream::<_, EchoMsg>(
            LIST,
            EchoMsg { seq: u64::MAX, reply_len: 8, ..Default::default() },
            &CallOptions::deadline(Duration::from_millis(300)),
        );
        let t0 = Instant::now();
        // Bounded: a deadline never enforced would stream forever.
        let e = tokio::time::timeout(WAIT, async {
            loop {
                match rx.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("an endless stream ended cleanly"),
                    Err(e) => break e,
                }
            }
        })
        .await
        .unwrap_or_else(|_| fail(&format!("the 300 ms deadline did not end the endless stream in {WAIT:?}")));
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
        assert!(t0.elapsed() >= Duration::from_millis(250));
    });
    until("the producer to see the end", &probe, || probe.cancelled.load(Ordering::Acquire));
}

// ---- A peer killed mid-stream: the other end of the stream ends, it does not hang. ----

const PEER_ENV: &str = "RPC_STREAM_PEER_PROCESS";

/// The child's entry point (run by the tests below, never on its own): `server` serves `UpService`
/// and prints its address; `client:ADDR` streams to ADDR's SUM until killed.
#[test]
#[ignore = "the peer side of the killed-peer tests; they run it in a child process"]
fn peer_process() {
    let Ok(role) = std::env::var(PEER_ENV) else { return };
    if role == "server" {
        let probe = Arc::new(Probe::default());
        let h = server().add_service(UpService { probe }).spawn("127.0.0.1:0").unwrap();
        println!("\nSERVER {}", h.local_addr());
        loop {
            std::thread::park();
        }
    }
    if let Some(addr) = role.strip_prefix("client:") {
        let c = Client::connect_with(addr, &client_config()).unwrap();
        let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::default()).unwrap();
        for seq in 0.. {
            s.send(&msg(seq, 5000)).unwrap();
            assert_eq!(s.message().unwrap().unwrap().seq, seq);
            if seq == 10 {
                println!("\nSTREAMING");
            }
        }
    }
}

fn spawn_peer(role: &str) -> (std::process::Child, std::io::BufReader<std::process::ChildStdout>) {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--ignored", "--exact", "peer_process", "--nocapture", "--test-threads=1"])
        .env(PEER_ENV, role)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawning the peer process");
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

fn read_line_with(out: &mut impl std::io::BufRead, prefix: &str) -> String {
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the peer exited before {prefix:?}");
        if let Some(rest) = line.trim().strip_prefix(prefix) {
            return rest.to_owned();
        }
    }
}

#[test]
fn a_server_killed_mid_stream_ends_the_clients_streams_unavailable() {
    let (mut child, mut out) = spawn_peer("server");
    let addr: std::net::SocketAddr = read_line_with(&mut out, "SERVER ").parse().unwrap();
    let c = Client::connect_with(addr, &client_config()).unwrap();
    let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::default()).unwrap();
    for seq in 0..20 {
        s.send(&msg(seq, 3000)).unwrap();
        assert_eq!(s.message().unwrap().unwrap().seq, seq);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = Instant::now();
    let e = loop {
        match s.send(&msg(99, 3000)) {
            Ok(()) => match s.try_message() {
                Some(Err(e)) => break e,
                Some(Ok(None)) => panic!("a stream cut off ended cleanly"),
                _ => {}
            },
            Err(e) => break e,
        }
        assert!(t0.elapsed() < WAIT, "the stream outlived its server by {WAIT:?}; client {:?}", c.counters());
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    let e = s.message().unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
}

#[test]
fn a_client_killed_mid_stream_ends_the_servers_reader_and_sink() {
    let (h, probe, _c) = start();
    let (mut child, mut out) = spawn_peer(&format!("client:{}", h.local_addr()));
    read_line_with(&mut out, "STREAMING");
    assert!(!probe.cancelled.load(Ordering::Acquire));
    child.kill().unwrap();
    child.wait().unwrap();
    until("the server's stream to end with the client gone", &probe, || {
        probe.cancelled.load(Ordering::Acquire)
    });
    assert!(!probe.ended.load(Ordering::Acquire), "a killed client is not a clean end");
}

/// Streams opened while the dispatcher's queue is full wait for room (as unary calls do)
/// instead of failing RESOURCE_EXHAUSTED: a queue of one, 24 streams opened at once.
#[test]
fn channel_streams_opened_on_a_full_dispatcher_queue_wait_for_room() {
    let (h, _probe, _c) = start();
    let cfg = rpc_core::ChannelConfig::default()
        .client(client_config().polling(rpc_core::PollingPolicy::Event { spins: 0 }))
        .spins(500)
        .queue_depth(1);
    let ch = rpc_core::Channel::connect_blocking(h.local_addr(), &cfg).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let mut rxs: Vec<_> = (0..24)
            .map(|_| {
                ch.server_stream::<_, EchoMsg>(
                    LIST,
                    EchoMsg { seq: 20, reply_len: 16, ..Default::default() },
                    &CallOptions::default(),
                )
            })
            .collect();
        for (i, rx) in rxs.iter_mut().enumerate() {
            for seq in 0..20 {
                let m = rx.message().await.unwrap_or_else(|e| panic!("stream {i}: {e}")).expect("a message");
                assert_eq!(m.seq, seq);
                assert!(m.payload == words(seq, 16), "stream {i}: message {seq} differs");
            }
            assert_eq!(rx.message().await.unwrap(), None);
        }
    });
}
