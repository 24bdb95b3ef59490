//! Messages whose `encoded_len` lies (a hand-written `prost::Message` whose `encode_raw` writes
//! more, or fewer, bytes than it said), on every encode path: the server's inline, deferred and
//! async answers (eager, in the client's ring, staged, on the heap, waiting behind another
//! answer), its stream sinks, the client's requests (eager, ring, staging, heap), its stream
//! sends (eager, batched, in the outbox) and a `Channel`'s requests and stream sends. Each
//! fails that call INTERNAL naming `encoded_len`; nothing half-written reaches the peer (the
//! ring space reserved for it is taken back), the session stays open, the next call of the same
//! size succeeds byte for byte, and no buffer token leaks.

mod rpc_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BufMut;
use rpc_core::codegen::*;
use rpc_core::{CallOptions, Channel, ChannelConfig, Client, PollingPolicy, ServerHandle};
use rpc_support::*;

/// Answers `Liar { msg: EchoMsg of reply_len payload bytes, delta: seq as i64 }` inline.
const LIE: MethodId = method_id("/test.Lies/Lie");
/// As LIE, deferred: answered from another thread through its `Responder`.
const LIE_DEFER: MethodId = method_id("/test.Lies/LieDefer");
/// As LIE, from an async handler.
const LIE_ASYNC: MethodId = method_id("/test.Lies/LieAsync");
const LIE_ASYNC_WORKER: MethodId = method_id("/test.Lies/LieAsyncWorker");
/// Server streaming: `checksum` honest messages of `reply_len` payload bytes, then the liar
/// (`seq` as its delta); the producer's result goes to the probe.
const LIE_STREAM: MethodId = method_id("/test.Lies/LieStream");
/// Client streaming: waits for the probe's `release`, then reads every message (each an
/// `EchoMsg` whose `seq` counts from 0) and answers their count and the sum of their payloads'
/// FNV-1a.
const READ: MethodId = method_id("/test.Lies/Read");

/// Server (client's ring, in bytes: 64 KiB, the smallest allowed) and client sizes: eager up to
/// 256 bytes, a ring body up to a quarter of the 64 KiB ring, staged up to 128 KiB (twice the
/// ring), else the heap.
const RING: u32 = 64 << 10;
const EAGER: u32 = 256;

/// Payload sizes that put an `EchoMsg` eager, in the ring, in the staging area and on the heap.
const SIZES: [usize; 4] = [100, 1000, 32_000, 160_000];
/// Deltas: claims 3 bytes more than written (writes fewer), claims 3 fewer (writes more).
const DELTAS: [i64; 2] = [3, -3];

/// A message that encodes as `msg` but whose `encoded_len` is `msg`'s plus `delta`.
#[derive(Clone, Debug, Default, PartialEq)]
struct Liar {
    msg: EchoMsg,
    delta: i64,
}

impl prost::Message for Liar {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.msg.encode_raw(buf);
    }
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        self.msg.merge_field(tag, wire_type, buf, ctx)
    }
    fn encoded_len(&self) -> usize {
        (self.msg.encoded_len() as i64 + self.delta).max(0) as usize
    }
    fn clear(&mut self) {
        self.msg.clear();
    }
}

fn echo(seq: u64, len: usize) -> EchoMsg {
    let p = payload(seq, len);
    EchoMsg { seq, checksum: fnv64(&p), payload: p, reply_len: 0 }
}

fn liar(seq: u64, len: usize, delta: i64) -> Liar {
    Liar { msg: echo(seq, len), delta }
}

/// What the server's streams saw.
#[derive(Default)]
struct Probe {
    /// LIE_STREAM: the producer's liar send failed INTERNAL (anything else is recorded in `last`).
    sink_failed: AtomicBool,
    last: Mutex<String>,
    /// READ may read.
    release: AtomicBool,
    /// READ streams answered.
    reads: AtomicU64,
}

struct Lies {
    probe: Arc<Probe>,
}

impl Service for Lies {
    const NAME: &'static str = "test.Lies";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: LIE, name: "/test.Lies/Lie" },
        MethodDesc { id: LIE_DEFER, name: "/test.Lies/LieDefer" },
        MethodDesc { id: LIE_ASYNC, name: "/test.Lies/LieAsync" },
        MethodDesc { id: LIE_ASYNC_WORKER, name: "/test.Lies/LieAsyncWorker" },
        MethodDesc { id: LIE_STREAM, name: "/test.Lies/LieStream" },
        MethodDesc { id: READ, name: "/test.Lies/Read" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        if method == READ {
            let mut requests = ctx.requests::<EchoMsg>();
            let (responder, reply) = ctx.defer::<EchoMsg>();
            let probe = self.probe.clone();
            std::thread::spawn(move || {
                while !probe.release.load(Ordering::Acquire) && !requests.is_cancelled() {
                    std::thread::yield_now();
                }
                let (mut n, mut sum) = (0u64, 0u64);
                let r = loop {
                    match requests.message() {
                        Ok(Some(m)) if m.seq == n && fnv64(&m.payload) == m.checksum => {
                            n += 1;
                            sum = sum.wrapping_add(m.checksum);
                        }
                        Ok(Some(m)) => break Err(Status::data_loss(format!("message {n} arrived as {m:?}"))),
                        Ok(None) => break Ok(EchoMsg { seq: n, checksum: sum, ..Default::default() }),
                        Err(e) => break Err(e),
                    }
                };
                probe.reads.fetch_add(1, Ordering::AcqRel);
                responder.send(r);
            });
            return out.reply(reply);
        }
        let req = match decode::<EchoMsg>(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        let m = liar(req.seq, req.reply_len as usize, req.seq as i64);
        match method {
            LIE => out.reply(Reply::from(m)),
            LIE_DEFER => {
                let (responder, reply) = ctx.defer::<Liar>();
                std::thread::spawn(move || responder.send(Ok(m)));
                out.reply(reply);
            }
            LIE_ASYNC => {
                out.reply(spawn_async(&AsyncRuntime::current_or_default(), ctx, |_| async move { Ok(m) }))
            }
            // Polled on the worker: complete at its first poll, answered inline.
            LIE_ASYNC_WORKER => {
                out.reply(spawn_async(&AsyncRuntime::worker(), ctx, |_| async move { Ok(m) }))
            }
            LIE_STREAM => {
                let (sink, reply) = ctx.stream::<Liar>();
                let probe = self.probe.clone();
                std::thread::spawn(move || {
                    for i in 0..req.checksum {
                        if let Err(e) = sink.send(&liar(i, req.reply_len as usize, 0)) {
                            *probe.last.lock().unwrap() = format!("honest message {i}: {e}");
                            return;
                        }
                    }
                    match sink.send(&m) {
                        Err(e) if e.code() == Code::Internal && e.message().contains("encoded_len") => {
                            // The stream is over: an honest send after the liar fails too.
                            match sink.send(&liar(9, req.reply_len as usize, 0)) {
                                Err(e) if e.code() == Code::Internal => {
                                    probe.sink_failed.store(true, Ordering::Release)
                                }
                                r => *probe.last.lock().unwrap() = format!("a send after the liar's: {r:?}"),
                            }
                        }
                        r => *probe.last.lock().unwrap() = format!("the liar's send: {r:?}"),
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
    let server = server()
        .ring_bytes(RING)
        .add_service(Lies { probe: probe.clone() })
        .add_service(TestService::default())
        .spawn("127.0.0.1:0")
        .unwrap();
    let client =
        Client::connect_with(server.local_addr(), &client_config().ring_bytes(RING).eager_threshold(EAGER))
            .unwrap();
    (server, probe, client)
}

#[track_caller]
fn assert_internal<T>(r: Result<T, Status>, what: &str) {
    match r {
        Err(e) if e.code() == Code::Internal && e.message().contains("encoded_len") => {}
        Err(e) => panic!("{what}: {e:?}"),
        Ok(_) => panic!("{what}: Ok"),
    }
}

/// An honest ECHO of `len` bytes each way (the liar's path) succeeds byte for byte.
#[track_caller]
fn honest_echo(client: &Client, seq: u64, len: usize, what: &str) {
    let r = client.unary::<_, EchoMsg>(ECHO, &request(seq, len, len), &CallOptions::default());
    let r = r.unwrap_or_else(|e| {
        panic!("{what}: the next call failed: {e:?} (closed: {:?})", client.closed_reason())
    });
    check_reply(&r, seq, len);
}

#[track_caller]
fn assert_clean(client: &Client) {
    assert_eq!(client.closed_reason(), None);
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0, "buffer tokens leaked");
}

/// Answers of every size that lie both ways, from inline, deferred and async handlers.
/// Sabotaged: the reply encoder writing through `&mut [u8]` again (panics, caught, INTERNAL) left
/// the ring reservation unsent: the next ring-sized answer closed the client's session ("ring
/// body at 1010, expected ...": the next call UNAVAILABLE); with `Bounded` but without
/// `unplace_body` the same; without the `check_exact` of the heap path and of `Responder::send`
/// the liars' answers came back OK.
#[test]
fn answers_that_lie_fail_internal_and_the_session_serves_on() {
    let (server, _probe, client) = start();
    let mut seq = 0;
    for method in [LIE, LIE_DEFER, LIE_ASYNC, LIE_ASYNC_WORKER] {
        for len in SIZES {
            for delta in DELTAS {
                seq += 1;
                let what = format!("method {method:#x}, {len} bytes, delta {delta}");
                let req = EchoMsg { seq: delta as u64, reply_len: len as u32, ..Default::default() };
                assert_internal(client.unary::<_, EchoMsg>(method, &req, &CallOptions::default()), &what);
                honest_echo(&client, seq, len, &what);
            }
        }
    }
    assert_clean(&client);
    drop(client);
    server.shutdown();
}

/// An answer that lies, dispatched while a large answer before it waits for ring space: it waits
/// unencoded and fails when its turn comes. Sabotaged: `LateBody::encode_into` committing what a
/// short liar wrote (its length unchecked): the liar's answer arrived as a truncated body and
/// failed to decode on the client (DATA_LOSS/INVALID_ARGUMENT, not INTERNAL).
#[test]
fn an_answer_that_lies_behind_a_waiting_answer_fails_internal() {
    let (server, _probe, client) = start();
    let opts = CallOptions::default();
    for delta in DELTAS {
        // 200 KB through a 64 KiB ring: in pieces, each waiting for the client to free the last.
        let big = client.unary_async::<_, EchoMsg>(ECHO, &request(1, 16, 200_000), &opts);
        let req = EchoMsg { seq: delta as u64, reply_len: 8000, ..Default::default() };
        let lie = client.unary_async::<_, EchoMsg>(LIE, &req, &opts);
        check_reply(&block_on(big).unwrap(), 1, 200_000);
        assert_internal(block_on(lie), &format!("delta {delta}"));
        honest_echo(&client, 2, 8000, "after the late liar");
    }
    assert_clean(&client);
    drop(client);
    server.shutdown();
}

/// A stream sink's message that lies (in a batch, and alone) ends its stream INTERNAL after the
/// honest messages before it, every one of them delivered in order; the producer's send returns
/// that status. Sabotaged: `put` encoding into the batch unchecked: the client read a batch whose
/// frame lengths did not add up and closed the session; alone, the liar arrived and failed to
/// decode (not INTERNAL); the liar's failure emptying the sink while the worker popped it (as
/// before 2026-12-05): the client read honest message 2 where 1 was due, or fewer than 3.
#[test]
fn a_stream_message_that_lies_ends_its_stream_internal() {
    let (server, probe, client) = start();
    for len in [10, 1000, 8000] {
        for delta in DELTAS {
            let what = format!("{len} bytes, delta {delta}");
            probe.sink_failed.store(false, Ordering::Release);
            let req = EchoMsg { seq: delta as u64, reply_len: len as u32, checksum: 3, ..Default::default() };
            let mut s =
                client.server_stream::<_, EchoMsg>(LIE_STREAM, &req, &CallOptions::default()).unwrap();
            let mut got = 0;
            let end = loop {
                match s.message() {
                    Ok(Some(m)) => {
                        assert_eq!(m, echo(got, len), "{what}: honest message {got}");
                        got += 1;
                    }
                    r => break r,
                }
            };
            // Every honest message sent before the liar arrives, then the liar's status.
            assert_eq!(got, 3, "{what}: honest messages before the end");
            assert_internal(end, &what);
            wait_until(
                "the producer to see its liar fail",
                WAIT,
                || probe.sink_failed.load(Ordering::Acquire),
                || probe.last.lock().unwrap().clone(),
            );
            honest_echo(&client, 7, len, &what);
        }
    }
    assert_clean(&client);
    drop(client);
    server.shutdown();
}

/// Requests that lie, eager, in the server's ring, staged and on the heap, started at once and
/// waiting for a slot. Sabotaged: the ring case without `unplace_body` (the range reserved and
/// never sent): the next ring request landed past where the server looked and the server closed
/// the session (next call UNAVAILABLE); writing through `&mut [u8]`: "attempt to subtract with
/// overflow"/"advance out of bounds" panicked the test's thread.
#[test]
fn requests_that_lie_fail_internal_taking_nothing() {
    let (server, _probe, client) = start();
    let opts = CallOptions::default();
    let mut seq = 0;
    for len in SIZES {
        for delta in DELTAS {
            seq += 1;
            let what = format!("{len} bytes, delta {delta}");
            assert_internal(client.unary::<_, EchoMsg>(RAW, &liar(seq, len, delta), &opts), &what);
            // Async: the same path, or the queue when the slot is taken.
            let f = client.unary_async::<_, EchoMsg>(RAW, &liar(seq, len, delta), &opts);
            assert_internal(block_on(f), &format!("{what}, async"));
            honest_echo(&client, seq, len, &what);
        }
    }
    assert_clean(&client);
    drop(client);
    server.shutdown();
}

/// Client stream sends that lie: with a credit (eager, and through the outbox), and framed into
/// the open batch while the server reads nothing. Each fails INTERNAL; the stream goes on and
/// the server reads exactly the honest messages. Sabotaged: the batch path counting a liar's
/// frame (`write` unchecked): the server's reader saw a message out of order (DATA_LOSS) or the
/// batch's frames did not add up; without `stream_unsend` the stream ran out of credits and the
/// honest sends after the liars stalled until the stream's deadline.
#[test]
fn stream_sends_that_lie_fail_internal_and_the_stream_goes_on() {
    let (server, probe, client) = start();
    for len in [10, 1000, 40_000] {
        probe.release.store(false, Ordering::Release);
        // The deadline is a hang guard: a send credit lost to each liar would stall the stream.
        let mut s = client.client_stream::<Liar, EchoMsg>(READ, &CallOptions::deadline(WAIT)).unwrap();
        // Open (the first message waits for the stream's first credit).
        let m = liar(0, len, 0);
        s.send(&m).unwrap();
        let (mut n, mut sum) = (1u64, m.msg.checksum);
        // While the server reads nothing: liar, liar, honest... until the credits and the batch
        // run out. A liar is refused unencoded (`Ok(false)`) only where an honest message is too.
        loop {
            let mut refused = false;
            for delta in DELTAS {
                match s.try_send(&liar(n, len, delta)) {
                    Ok(false) => refused = true,
                    r => assert_internal(r, &format!("{len} bytes, delta {delta}")),
                }
            }
            let m = liar(n, len, 0);
            if !s.try_send(&m).unwrap() {
                break;
            }
            assert!(!refused, "{len} bytes: a liar was refused where an honest message went");
            n += 1;
            sum = sum.wrapping_add(m.msg.checksum);
            assert!(n < 10_000, "no end of credits");
        }
        assert!(n > 0, "no credit at all");
        probe.release.store(true, Ordering::Release);
        // More liars than the stream has credits, each sent with a credit in hand.
        for _ in 0..100 {
            for delta in DELTAS {
                assert_internal(
                    s.send(&liar(n, len, delta)),
                    &format!("{len} bytes, delta {delta}, reading"),
                );
            }
            let m = liar(n, len, 0);
            s.send(&m).unwrap();
            n += 1;
            sum = sum.wrapping_add(m.msg.checksum);
        }
        let r = s.finish().unwrap();
        assert_eq!((r.seq, r.checksum), (n, sum), "{len} bytes: the honest messages, all and only");
        honest_echo(&client, 1, len, "after the stream");
    }
    assert_clean(&client);
    drop(client);
    server.shutdown();
}

/// A `Channel`'s requests and stream sends that lie fail INTERNAL; the channel serves on.
/// Sabotaged: the channel's stream send through `encode_to_vec` unchecked: the liar arrived at the
/// server, which read a message out of order (DATA_LOSS), not the honest count.
#[test]
fn channel_requests_and_stream_sends_that_lie_fail_internal() {
    let (server, probe, client) = start();
    drop(client);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let config = ChannelConfig::default()
        .client(
            client_config()
                .ring_bytes(RING)
                .eager_threshold(EAGER)
                .polling(PollingPolicy::Event { spins: 0 }),
        )
        .spins(500)
        .thread_name("lies");
    let ch = rt.block_on(Channel::connect_with(server.local_addr(), &config)).unwrap();
    let opts = CallOptions::default();
    rt.block_on(async {
        for len in SIZES {
            for delta in DELTAS {
                let what = format!("{len} bytes, delta {delta}");
                assert_internal(ch.unary::<_, EchoMsg>(RAW, liar(1, len, delta), &opts).await, &what);
                let r: EchoMsg = ch.unary(ECHO, request(2, len, len), &opts).await.unwrap();
                check_reply(&r, 2, len);
            }
        }
        probe.release.store(true, Ordering::Release);
        let mut call = ch.client_stream::<Liar, EchoMsg>(READ, &opts);
        let (mut n, mut sum) = (0u64, 0u64);
        for len in [10, 1000, 40_000] {
            for delta in DELTAS {
                assert_internal(
                    call.send(&liar(n, len, delta)).await,
                    &format!("stream, {len} bytes, delta {delta}"),
                );
            }
            let m = liar(n, len, 0);
            call.send(&m).await.unwrap();
            n += 1;
            sum = sum.wrapping_add(m.msg.checksum);
        }
        let r = call.finish().await.unwrap();
        assert_eq!((r.seq, r.checksum), (n, sum));
    });
    drop(ch);
    drop(rt);
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0, "buffer tokens leaked");
    server.shutdown();
}
