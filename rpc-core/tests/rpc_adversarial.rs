//! Adversarial probes of the runtime (review): handlers that misuse deferral, hostile TCP peers,
//! admission limits and shutdown races. Everything on `sim` (or the transport under test) with a
//! yielding polling policy and one worker unless a probe needs two.

mod rpc_support;

use rpc_core::codegen::*;
use rpc_core::{Client, ServerHandle};
use rpc_support::*;

const HOSTILE: &str = "test.Hostile";
const DEFER_THEN_PANIC: MethodId = method_id("/test.Hostile/DeferThenPanic");
const DEFER_THEN_REPLY: MethodId = method_id("/test.Hostile/DeferThenReply");
const PING: MethodId = method_id("/test.Hostile/Ping");
const LIE: MethodId = method_id("/test.Hostile/Lie");
const BIG: MethodId = method_id("/test.Hostile/Big");

/// A hand-written message whose `encoded_len` claims 10 bytes more than it encodes.
#[derive(Clone, Debug, Default, PartialEq)]
struct ShortMsg(Vec<u8>);

impl prost::Message for ShortMsg {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }
    fn encoded_len(&self) -> usize {
        self.0.len() + 10
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Handlers that answer a call twice: they defer and then panic or answer directly too.
struct Hostile;

impl Service for Hostile {
    const NAME: &'static str = HOSTILE;
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: DEFER_THEN_PANIC, name: "/test.Hostile/DeferThenPanic" },
        MethodDesc { id: DEFER_THEN_REPLY, name: "/test.Hostile/DeferThenReply" },
        MethodDesc { id: PING, name: "/test.Hostile/Ping" },
        MethodDesc { id: LIE, name: "/test.Hostile/Lie" },
        MethodDesc { id: BIG, name: "/test.Hostile/Big" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let req = match decode::<EchoMsg>(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        match method {
            DEFER_THEN_PANIC => {
                let (_responder, _marker) = ctx.defer::<EchoMsg>();
                // The responder is dropped while unwinding: it answers too.
                panic!("handler panics after deferring (seq {})", req.seq);
            }
            DEFER_THEN_REPLY => {
                let (responder, _marker) = ctx.defer::<EchoMsg>();
                responder.send(Ok(EchoMsg { seq: req.seq + 1000, ..Default::default() }));
                out.reply(Reply::from(EchoMsg { seq: req.seq, ..Default::default() }));
            }
            // A bulk answer (above the eager threshold) that encodes shorter than announced.
            LIE => out.reply(Reply::from(ShortMsg(vec![0x0a; req.reply_len as usize]))),
            BIG => out.reply(Reply::from(EchoMsg {
                seq: req.seq,
                payload: payload(req.seq, req.reply_len as usize),
                ..Default::default()
            })),
            _ => out.reply(Reply::from(EchoMsg { seq: req.seq, ..Default::default() })),
        }
    }
}

fn spawn_hostile() -> ServerHandle {
    server().add_service(Hostile).spawn("127.0.0.1:0").expect("server starts")
}

fn ping(client: &Client, seq: u64) -> Result<EchoMsg, Status> {
    client.unary::<_, EchoMsg>(PING, &EchoMsg { seq, ..Default::default() }, &CallOptions::default())
}

/// A call answered twice (a handler that defers and then panics; one that defers, sends through
/// the responder and also answers directly) gets one answer, and the session survives: before
/// the fix the second answer reached the client as a response for a call no longer on the wire,
/// and the client closed the session (every later call UNAVAILABLE).
#[test]
fn a_call_answered_twice_gets_one_answer_and_the_session_survives() {
    let server = spawn_hostile();
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();

    let err = client
        .unary::<_, EchoMsg>(
            DEFER_THEN_PANIC,
            &EchoMsg { seq: 1, ..Default::default() },
            &CallOptions::default(),
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert!(err.message().contains("panicked"), "{err}");
    for seq in 0..20 {
        assert_eq!(ping(&client, seq).map(|r| r.seq), Ok(seq), "call {seq} after the double answer");
    }

    let r = client
        .unary::<_, EchoMsg>(
            DEFER_THEN_REPLY,
            &EchoMsg { seq: 7, ..Default::default() },
            &CallOptions::default(),
        )
        .unwrap();
    assert_eq!(r.seq, 7, "the first answer wins");
    for seq in 0..20 {
        assert_eq!(ping(&client, seq).map(|r| r.seq), Ok(seq), "call {seq} after the double answer");
    }
    assert_eq!(client.closed_reason(), None);
    assert_eq!(client.counters().malformed, 0);
    drop(client);
    server.shutdown();
}

/// A client that writes stray bytes on its TCP liveness channel and then goes away without a
/// Close: its server session is still freed. Before the fix the listener peeked at the channel,
/// saw the stray byte forever, never noticed the close, and the session (QP, rings, buffers, a
/// place under `max_sessions`) leaked until the server stopped.
#[test]
fn stray_bytes_on_the_tcp_channel_do_not_hide_the_peer_closing() {
    use std::io::Write;
    use std::net::TcpStream;

    use rpc_core::wire::{read_frame, write_frame, Frame};

    let (server, _) = spawn(server());
    let keep = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let peer = RawPeer::new(64, 8, 4096, 1 << 16, 1);
    let hello = peer.handshake(2, 1024, 1 << 20, 0);
    let mut tcp = TcpStream::connect(server.local_addr()).unwrap();
    write_frame(&mut tcp, &Frame::Handshake(hello)).unwrap();
    let Frame::Handshake(_) = read_frame(&mut tcp).unwrap() else { panic!("refused") };
    wait_until(
        "the server to publish the raw peer's session opened",
        WAIT,
        || {
            keep.progress();
            server.counters().sessions_opened >= 2
        },
        || format!("server {:?}", server.counters()),
    );
    tcp.write_all(b"garbage after the handshake").unwrap();
    drop(tcp);
    // Hang guard only (the close is noticed within milliseconds): without the fix it never is.
    wait_until(
        "the session of the vanished peer to be freed",
        WAIT,
        || {
            keep.progress();
            server.counters().sessions_closed >= 1
        },
        || format!("server {:?}", server.counters()),
    );
    assert_eq!(server.counters().sessions_closed, 1, "the session of the vanished peer is freed");
    check_reply(&keep.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    drop(peer);
    drop(keep);
    server.shutdown();
}

/// Sessions with different credits on one worker: admission sums what each reserves of the SRQ
/// (`2 × credits + max(credits, 16) + 31` receive WQEs), so the SRQ is never over-committed and
/// flow control never leans on RNR. Before the fix the listener multiplied the session count by the *new* session's
/// need, so small sessions were admitted after large ones past the SRQ depth (here 2 × 113 + 2 × 35
/// = 296 WQEs reserved on an SRQ of 296, and a third small one refused; before 2026-12-05 a
/// session of 1 credit reserved 34).
#[test]
fn srq_admission_sums_the_credits_of_every_session() {
    assert_eq!(
        (rpc_core::ServerConfig::srq_per_session(32), rpc_core::ServerConfig::srq_per_session(1)),
        (128, 50)
    );
    // Sessions start at their full credits here, and hold no ring (its 15 pieces WQEs come
    // with it): 113 and 35.
    let (big, small) = (rpc_core::session::srq_need_ringless(32), rpc_core::session::srq_need_ringless(1));
    assert_eq!((big, small), (113, 35));
    let (server, _) = spawn(server().srq_depth(296).credits_per_session(32).initial_credits(32));
    let connect = |window: u16| Client::connect_with(server.local_addr(), &client_config().window(window));
    let big: Vec<Client> = (0..2).map(|_| connect(32).expect("2 × 113 WQEs fit in 296")).collect();
    let small =
        [connect(1).expect("2 × 113 + 35 fit in 296"), connect(1).expect("2 × 113 + 2 × 35 = 296 fit")];
    let err = connect(1).expect_err("2 × 113 + 3 × 35 = 331 WQEs do not fit in 296");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("srq_depth"), "{err}");
    // Freeing a large session makes room again.
    drop(big);
    wait_until(
        "the server to close the 2 large sessions",
        WAIT,
        || server.counters().sessions_closed >= 2,
        || format!("server {:?}", server.counters()),
    );
    assert_eq!(server.counters().sessions_closed, 2);
    let again = connect(32).expect("room again after the large sessions closed");
    check_reply(&again.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    check_reply(&small[0].unary(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap(), 2, 8);
    drop((again, small));
    server.shutdown();
}

/// A client connecting while the server drains for shutdown is refused UNAVAILABLE. Before the
/// fix the handshake succeeded and the session went to the least-loaded worker, which with
/// several workers is typically one that had already drained and stopped: nobody served the
/// session, and its Open sat in a dead worker's control queue (once that bounded queue filled up,
/// the listener spun on it forever and `shutdown` never returned).
#[test]
fn connecting_during_shutdown_is_refused() {
    let (server, stash) = spawn(server().drain_timeout(std::time::Duration::from_secs(60)));
    let addr = server.local_addr();
    let a = Client::connect_with(addr, &client_config()).unwrap();
    // One call held by the server keeps it draining.
    let held = a.unary_async::<_, EchoMsg>(STASH, &request(1, 8, 8), &CallOptions::default());
    wait_until(
        "the held call to reach the server",
        WAIT,
        || {
            a.progress();
            !stash.lock().unwrap().is_empty()
        },
        || format!("server {:?}, client {:?}", server.counters(), a.counters()),
    );
    let stopper = std::thread::spawn(move || server.shutdown());
    // Draining has begun once new calls are answered UNAVAILABLE.
    let e = wait_for(
        "a call to be refused once the server drains",
        WAIT,
        || a.unary::<_, EchoMsg>(ECHO, &request(2, 8, 8), &CallOptions::deadline(WAIT)).err(),
        || format!("client {:?}", a.counters()),
    );
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("shutting down"), "{e}");
    let err = Client::connect_with(addr, &client_config()).expect_err("no new session while draining");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("shutting down"), "{err}");
    // Answer the held call: the drain ends and shutdown returns.
    stash.lock().unwrap().drain(..).for_each(|r| r.send(Ok(EchoMsg { seq: 1, ..Default::default() })));
    assert_eq!(block_on(held).map(|r| r.seq), Ok(1));
    stopper.join().unwrap();
    drop(a);
}

/// TCP peers that connect and then send nothing, or half a handshake frame, do not hold up other
/// clients: handshakes progress without blocking the listener. Before the fix the listener read
/// each handshake blocking (up to `handshake_timeout`, 5 s by default), so one silent peer
/// stalled every later connection and liveness check: a client queued behind it timed out.
#[test]
fn silent_and_half_handshakes_do_not_block_other_clients() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    let (server, _) = spawn(server().handshake_timeout(Duration::from_secs(30)));
    let addr = server.local_addr();
    let silent = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(&[1, 0x40]).unwrap(); // frame type and half of the length
    let client = Client::connect_with(addr, &client_config().connect_timeout(Duration::from_secs(3)))
        .expect("a client behind silent handshakes connects");
    check_reply(&client.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    // A peer that closes mid-handshake is forgotten; the others still connect.
    drop(half);
    let second = Client::connect_with(addr, &client_config().connect_timeout(Duration::from_secs(3)))
        .expect("a second client connects");
    check_reply(&second.unary(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap(), 2, 8);
    drop((client, second));
    server.shutdown();
    // Shutdown closes the silent peer's connection (no handshake, no session).
    let mut silent = silent;
    silent.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(silent.read(&mut b).ok(), Some(0), "the silent peer's connection is closed");
}

/// Async calls whose bulk responses share the client's ring, awaited in the opposite order: the
/// first response sits in the ring (done, not yet taken) while the second needs its space. The
/// second must still complete. Before the fix the server waited for ring space the client would
/// free only when the first future was polled, which the caller does after the second: a
/// deadlock (here cut short by the deadline, which is only a hang guard).
#[test]
fn bulk_responses_awaited_out_of_order_do_not_deadlock_the_ring() {
    use std::time::Duration;

    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().ring_bytes(64 << 10)).unwrap();
    let len = 40 << 10;
    let first = client.unary_async::<_, EchoMsg>(ECHO, &request(1, 8, len), &CallOptions::default());
    // The first response arrives and waits in the ring for its future.
    wait_until(
        "the first bulk response to arrive",
        WAIT,
        || {
            client.progress();
            client.counters().bytes_in > 0
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    let opts = CallOptions::deadline(Duration::from_secs(10));
    let second = client.unary_async::<_, EchoMsg>(ECHO, &request(2, 8, len), &opts);
    check_reply(&block_on(second).expect("the second bulk response arrives"), 2, len);
    check_reply(&block_on(first).expect("the first bulk response is intact"), 1, len);
    // The same with a blocking call behind a finished async one.
    let third = client.unary_async::<_, EchoMsg>(ECHO, &request(3, 8, len), &CallOptions::default());
    let before = client.counters().bytes_in;
    wait_until(
        "the third bulk response to arrive",
        WAIT,
        || {
            client.progress();
            client.counters().bytes_in > before
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    check_reply(
        &client.unary(ECHO, &request(4, 8, len), &opts).expect("the blocking call completes"),
        4,
        len,
    );
    check_reply(&block_on(third).unwrap(), 3, len);
    drop(client);
    server.shutdown();
}

/// More sessions per worker than a worker can number (its session index shares a 31-bit tag with
/// a generation in every send `wr_id`) is refused at start, naming the field. Before the fix the
/// server started, and a worker's sessions from index 32768 on had the top bit of their tag cut
/// off: their send completions matched no session, their send buffers were never retired and
/// the sessions stalled.
#[test]
fn more_sessions_per_worker_than_the_tag_holds_is_refused() {
    let err = server().max_sessions(40_000).add_service(TestService::default()).spawn("127.0.0.1:0").err();
    let err = err.expect("40000 sessions on one worker is refused");
    assert!(err.to_string().contains("max_sessions"), "{err}");
    let ok = server()
        .max_sessions(32_767)
        .srq_depth(4096)
        .add_service(TestService::default())
        .spawn("127.0.0.1:0");
    ok.expect("32767 sessions on one worker is fine").shutdown();
}

/// The default SRQ depth is sized for `max_sessions` at full credits; when the device cannot
/// hold that with every idle session reserving its own WQEs (`srq_idle_wqes` `u32::MAX`),
/// spawning fails naming every field involved (not a session refused much later); with the
/// idle sessions sharing (the default `srq_idle_wqes`), the same server spawns. Sabotaged: the
/// spawn check summing the idle reservations without the share: the shared server failed
/// ("4096 idle sessions sharing 4096 WQEs").
#[test]
fn limits_are_validated_together_at_spawn() {
    let err = server()
        .max_sessions(4096)
        .initial_credits(2)
        .srq_idle_wqes(u32::MAX)
        .add_service(TestService::default())
        .spawn("127.0.0.1:0")
        .err();
    let err = err.expect("4096 idle sessions need more receive WQEs than the device has").to_string();
    for field in
        ["srq_depth", "max_sessions 4096", "initial_credits 2", "worker_cores", "max_srq_wr", "srq_idle_wqes"]
    {
        assert!(err.contains(field), "{field} in: {err}");
    }
    let shared = server().max_sessions(4096).initial_credits(2).add_service(TestService::default());
    shared.spawn("127.0.0.1:0").expect("4096 idle sessions sharing 4096 WQEs").shutdown();
    // The defaults serve the default max_sessions.
    let c = rpc_core::ServerConfig::default();
    assert_eq!(c.effective_srq_depth(), c.max_sessions as u64 * (3 * u64::from(c.credits_per_session) + 32));
    let ok = server().add_service(TestService::default()).spawn("127.0.0.1:0");
    ok.expect("the defaults are consistent").shutdown();
}

/// A bulk body that encodes shorter than its `encoded_len` (a hand-written `Message` that lies)
/// keeps the ring accounting of both ends: the server answers INTERNAL and takes back the ring
/// space it had reserved for the body, the client refuses its own such request INTERNAL before
/// sending anything, and later bulk messages still line up. Before the first fix the server
/// answered INTERNAL without the ring body it had reserved space for, so its next bulk answer
/// arrived off the client's expected ring offset and the client closed the session; and the
/// client sent the stale bytes of an earlier message in the gap.
#[test]
fn a_bulk_body_shorter_than_its_encoded_len_keeps_the_ring_in_step() {
    let server = server().ring_bytes(64 << 10).add_service(Hostile).add_service(TestService::default());
    let server = server.spawn("127.0.0.1:0").unwrap();
    let config = client_config().ring_bytes(64 << 10).eager_threshold(256);
    let client = Client::connect_with(server.local_addr(), &config).unwrap();
    let big = |seq: u64| {
        let req = EchoMsg { seq, reply_len: 4 << 10, ..Default::default() };
        client.unary::<_, EchoMsg>(BIG, &req, &CallOptions::default()).map(|r| fnv64(&r.payload))
    };
    assert_eq!(big(1), Ok(fnv64(&payload(1, 4 << 10))));
    // A 1010-byte ring body right after the first answer; the next answers follow it unwrapped.
    let req = EchoMsg { seq: 2, reply_len: 1000, ..Default::default() };
    let err = client.unary::<_, EchoMsg>(LIE, &req, &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    for seq in 3..8 {
        assert_eq!(big(seq), Ok(fnv64(&payload(seq, 4 << 10))), "bulk answer {seq}");
    }
    // Client side: the server's ring (16 KiB) takes a 10 000-byte body at 0, then, wrapping, the
    // short body would go at 0 again: it is refused, and the next body takes its place.
    let r: EchoMsg = client.unary(RAW, &RawBytes(vec![0xff; 10_000]), &CallOptions::default()).unwrap();
    assert_eq!(r.seq, 10_000);
    let e = client.unary::<_, EchoMsg>(RAW, &ShortMsg(vec![1; 9_000]), &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e}");
    assert!(e.message().contains("encoded_len"), "{e}");
    let r: EchoMsg = client.unary(RAW, &RawBytes(vec![2; 9_010]), &CallOptions::default()).unwrap();
    assert_eq!((r.seq, r.checksum), (9_010, fnv64(&[2; 9_010])));
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

/// A server that writes stray bytes on the TCP liveness channel and then closes it (its QP stays
/// up and never answers): the client's call ends UNAVAILABLE. Before the fix the client peeked at
/// the channel, saw the stray byte forever and never noticed the close: the call hung (here cut
/// short by a deadline that is only a hang guard).
#[test]
fn stray_bytes_from_the_server_do_not_hide_its_tcp_closing() {
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    use rpc_core::verbs::{CompletionQueue, WorkCompletion};
    use rpc_core::wire::{read_frame, write_frame, Frame, HEADER_LEN};

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let fake = std::thread::spawn(move || {
        let (mut tcp, _) = listener.accept().unwrap();
        let Frame::Handshake(hello) = read_frame(&mut tcp).unwrap() else { panic!("no handshake") };
        let peer = RawPeer::new(256, 64, HEADER_LEN + 4096, 1 << 16, 7);
        peer.connect(&Default::default(), &hello);
        let reply =
            peer.handshake(hello.credits.min(8), hello.eager_threshold.min(4096), hello.max_message, 77);
        write_frame(&mut tcp, &Frame::Handshake(reply)).unwrap();
        // Take the request, then garbage on the channel and close it; the QP stays up, silent.
        let mut wcs = [WorkCompletion::default(); 4];
        wait_until(
            "the fake server to receive the request",
            WAIT,
            || peer.cq.poll(&mut wcs).unwrap() > 0,
            String::new,
        );
        tcp.write_all(b"stray").unwrap();
        drop(tcp);
        let _ = done_rx.recv();
        drop(peer);
    });
    let client = Client::connect_with(addr, &client_config()).unwrap();
    let err = client
        .unary::<_, EchoMsg>(ECHO, &request(1, 8, 8), &CallOptions::deadline(Duration::from_secs(20)))
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(client.closed_reason().is_some());
    done_tx.send(()).unwrap();
    fake.join().unwrap();
}

/// A handler that answers its own deferred call inline (`defer()` then `send()` in the handler)
/// while the worker's deferred-answer queue is full: the worker is the only thread that empties
/// that queue, so it must not wait for room. Before the fix it spun forever (every session of
/// the worker hung, and shutdown with it); the full queue is reached deterministically here by
/// holding the handler until 4096 (the queue's capacity) other deferred answers are queued.
#[test]
fn a_worker_answering_inline_into_its_full_deferred_queue_does_not_deadlock() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const STASH: MethodId = method_id("/test.Inline/Stash");
    const INLINE: MethodId = method_id("/test.Inline/Inline");
    const N: usize = 4096;

    #[derive(Default)]
    struct Inline {
        stash: Mutex<Vec<Responder<EchoMsg>>>,
        entered: AtomicBool,
        go: AtomicBool,
    }
    struct InlineService(Arc<Inline>);
    impl Service for InlineService {
        const NAME: &'static str = "test.Inline";
        const METHODS: &'static [MethodDesc] = &[
            MethodDesc { id: STASH, name: "/test.Inline/Stash" },
            MethodDesc { id: INLINE, name: "/test.Inline/Inline" },
        ];
        fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
            let req = match decode::<EchoMsg>(body) {
                Ok(r) => r,
                Err(s) => return out.error(s),
            };
            let (responder, marker) = ctx.defer::<EchoMsg>();
            if method == STASH {
                self.0.stash.lock().unwrap().push(responder);
            } else {
                // Hold the worker until the queue is full, then answer inline.
                self.0.entered.store(true, Ordering::Release);
                while !self.0.go.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                responder.send(Ok(EchoMsg { seq: req.seq, ..Default::default() }));
            }
            out.reply(marker);
        }
    }

    let state = Arc::new(Inline::default());
    let server = server()
        .credits_per_session(2048)
        .srq_depth(16384)
        .drain_timeout(Duration::from_secs(60))
        .add_service(InlineService(state.clone()))
        .spawn("127.0.0.1:0")
        .unwrap();
    let stashers: Vec<Client> = (0..2)
        .map(|_| Client::connect_with(server.local_addr(), &client_config().window(2048)).unwrap())
        .collect();
    let stashed: Vec<_> = (0..N as u64)
        .map(|seq| {
            let c = &stashers[seq as usize % 2];
            c.unary_async::<_, EchoMsg>(
                STASH,
                &EchoMsg { seq, ..Default::default() },
                &CallOptions::default(),
            )
        })
        .collect();
    wait_until(
        "the 4096 STASH calls to reach their handler",
        WAIT,
        || {
            stashers.iter().for_each(|c| {
                c.progress();
            });
            state.stash.lock().unwrap().len() >= N
        },
        || format!("{} stashed; server {:?}", state.stash.lock().unwrap().len(), server.counters()),
    );
    // The worker enters the inline handler and waits there.
    let inline = std::thread::spawn({
        let addr = server.local_addr();
        move || {
            let c = Client::connect_with(addr, &client_config()).unwrap();
            c.unary::<_, EchoMsg>(INLINE, &EchoMsg { seq: 9, ..Default::default() }, &CallOptions::default())
                .map(|r| r.seq)
        }
    });
    // Once the inline call is in its handler, fill the queue (the worker is held in the handler
    // and does not drain it) and let the handler go on.
    wait_until(
        "the inline call to enter its handler",
        WAIT,
        || state.entered.load(Ordering::Acquire),
        || format!("server {:?}", server.counters()),
    );
    for r in state.stash.lock().unwrap().drain(..) {
        r.send(Ok(EchoMsg::default()));
    }
    state.go.store(true, Ordering::Release);
    // The deadlock this checks for would keep the worker (and the inline call) forever.
    wait_until(
        "the inline call to return (the worker answering into its full deferred queue)",
        WAIT,
        || inline.is_finished(),
        || format!("server {:?}", server.counters()),
    );
    assert_eq!(inline.join().unwrap(), Ok(9), "the inline answer arrives");
    for f in stashed {
        assert_eq!(block_on(f).map(|r| r.seq), Ok(0));
    }
    drop(stashers);
    server.shutdown();
}

/// The documented largest window and credits (4096) connect and work. Before the fix the QP asked
/// for 2 × (2 × 4096 + 8) + 8 = 16 408 send WQEs, above the device's `max_qp_wr` of 16 384 (the
/// same as Soft-RoCE's), and the connection failed UNAVAILABLE.
#[test]
fn the_largest_window_connects() {
    let (server, _) = spawn(server().credits_per_session(4096).srq_depth(16384));
    let client = Client::connect_with(server.local_addr(), &client_config().window(4096))
        .expect("window 4096 is in the documented range");
    let calls: Vec<_> = (0..64u64)
        .map(|seq| client.unary_async::<_, EchoMsg>(ECHO, &request(seq, 8, 8), &CallOptions::default()))
        .collect();
    for (seq, f) in calls.into_iter().enumerate() {
        check_reply(&block_on(f).unwrap(), seq as u64, 8);
    }
    drop(client);
    server.shutdown();
}

/// Auth tokens longer than the handshake carries (256 bytes) are configuration errors reported as
/// such. Before the fix a server with a 300-byte token started and refused every client
/// UNAUTHENTICATED, and a client's 70 000-byte token overflowed the frame's 16-bit length (the
/// server read a mangled frame and left the rest of the token in the TCP stream).
#[test]
fn auth_tokens_longer_than_the_handshake_carries_are_refused_locally() {
    let err = server().auth_token(vec![7u8; 300]).add_service(TestService::default()).spawn("127.0.0.1:0");
    let err = err.err().expect("a 300-byte server token is a config error");
    assert!(err.to_string().contains("auth_token"), "{err}");
    let (server, _) = spawn(server());
    let err = Client::connect_with(server.local_addr(), &client_config().auth_token(vec![1u8; 70_000]))
        .expect_err("a 70000-byte client token is refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("auth_token"), "{err}");
    let ok = Client::connect_with(server.local_addr(), &client_config().auth_token(vec![1u8; 256]));
    check_reply(&ok.unwrap().unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    server.shutdown();
}

/// Ring space freed while a request is queued but not yet posted is still reported to the server.
/// Here: a bulk answer X is taken after call A was queued (async calls are posted at the next
/// progress); A's header was stamped before X's ring space was freed. Before the fix the client
/// skipped the credit message because a message (A) was pending, A carried the old freed head,
/// and the server waited forever for ring space to answer A (cut short here by A's deadline,
/// only a hang guard).
#[test]
fn ring_space_freed_behind_a_queued_request_is_reported() {
    use std::time::Duration;

    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().ring_bytes(64 << 10)).unwrap();
    let len = 40 << 10;
    let x = client.unary_async::<_, EchoMsg>(ECHO, &request(1, 8, len), &CallOptions::default());
    wait_until(
        "X's bulk answer to arrive",
        WAIT,
        || {
            client.progress();
            client.counters().bytes_in > 0
        },
        || format!("server {:?}, client {:?}", server.counters(), client.counters()),
    );
    // A is queued, not posted; then X is taken (its ring space freed).
    let opts = CallOptions::deadline(Duration::from_secs(10));
    let a = client.unary_async::<_, EchoMsg>(ECHO, &request(2, 8, len), &opts);
    check_reply(&block_on(x).unwrap(), 1, len);
    check_reply(&block_on(a).expect("A's bulk answer finds ring space"), 2, len);
    drop(client);
    server.shutdown();
}
