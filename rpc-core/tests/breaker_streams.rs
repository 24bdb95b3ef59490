//! Breaking client-streaming and bidirectional streams: a raw peer (built from the public verbs,
//! buffers and wire modules) sending stream controls for calls that are not streams, in the wrong
//! direction, beyond its grants, with grants beyond any budget, twice, out of the ring, over
//! `max_message_size`; and misuse through the public API (send after finish, finish twice,
//! halves dropped early, a deadline of 0). The offender gets a clear error or a closed session
//! (counted as malformed), nothing panics or hangs, and other sessions are served on.

mod rpc_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::wire::{Header, Kind, STREAM_IN, STREAM_OUT};
use rpc_core::{CallOptions, Client, ServerHandle};
use rpc_support::*;

/// Client streaming: reads every message, answers their count.
const COUNT: MethodId = method_id("/test.Break/Count");
/// Client streaming: takes its request stream and drops it at once; answers once `RELEASE` is
/// set (or after 20 s).
const DROP_READER: MethodId = method_id("/test.Break/DropReader");
/// Server streaming: sends messages of 32 bytes until the stream is cancelled.
const FLOOD: MethodId = method_id("/test.Break/Flood");
/// Client streaming: holds its request stream unread until the call is cancelled.
const HOLD: MethodId = method_id("/test.Break/Hold");
/// Bidirectional: takes both halves and drops the sink at once (a clean end), then the reader.
const DROP_SINK: MethodId = method_id("/test.Break/DropSink");

struct Break;

/// DROP_READER may answer.
static RELEASE: AtomicBool = AtomicBool::new(false);

impl Service for Break {
    const NAME: &'static str = "test.Break";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: COUNT, name: "/test.Break/Count" },
        MethodDesc { id: DROP_READER, name: "/test.Break/DropReader" },
        MethodDesc { id: FLOOD, name: "/test.Break/Flood" },
        MethodDesc { id: DROP_SINK, name: "/test.Break/DropSink" },
        MethodDesc { id: HOLD, name: "/test.Break/Hold" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, _body: Body<'_>, out: &mut ReplyWriter<'_>) {
        match method {
            COUNT => {
                let mut requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let mut n = 0;
                    let r = loop {
                        match requests.message() {
                            Ok(Some(_)) => n += 1,
                            Ok(None) => break Ok(EchoMsg { seq: n, ..Default::default() }),
                            Err(e) => break Err(e),
                        }
                    };
                    responder.send(r);
                });
                out.reply(reply);
            }
            DROP_READER => {
                drop(ctx.requests::<EchoMsg>());
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let give_up = Instant::now() + Duration::from_secs(20);
                    while !RELEASE.load(Ordering::Acquire) && Instant::now() < give_up {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    responder.send(Ok(EchoMsg { seq: 7, ..Default::default() }));
                });
                out.reply(reply);
            }
            FLOOD => {
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    let m = EchoMsg { payload: vec![7; 32], ..Default::default() };
                    while sink.send(&m).is_ok() {}
                });
                out.reply(reply);
            }
            HOLD => {
                let requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let give_up = Instant::now() + Duration::from_secs(30);
                    while !requests.is_cancelled() && Instant::now() < give_up {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    responder.send(Err(Status::cancelled("held")));
                });
                out.reply(reply);
            }
            DROP_SINK => {
                let requests = ctx.requests::<EchoMsg>();
                let (sink, reply) = ctx.stream::<EchoMsg>();
                drop(sink);
                drop(requests);
                out.reply(reply);
            }
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn start() -> (ServerHandle, Client) {
    // The raw clients' 8 credits granted at the handshake (none raised on demand).
    let h = server()
        .initial_credits(8)
        .add_service(Break)
        .add_service(TestService::default())
        .spawn("127.0.0.1:0")
        .unwrap();
    let c = Client::connect_with(h.local_addr(), &client_config()).unwrap();
    (h, c)
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let give_up = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A raw client with 8 credits (slots 0 to 7), a 1 KiB eager threshold and 1 MiB messages.
fn connect_raw(addr: std::net::SocketAddr) -> RawClient {
    RawClient::connect_with(addr, 8, 1024, 1 << 20)
}

fn request(slot: u16, method: MethodId, stream: u8, grants: u16) -> Header {
    Header { slot, generation: 1, method, stream, count: grants, ..Header::new(Kind::Request) }
}

fn control(kind: Kind, slot: u16, grants: u16) -> Header {
    Header { slot, generation: 1, count: grants, ..Header::new(kind) }
}

fn stream_msg(slot: u16, body: &[u8]) -> Header {
    let len = body.len() as u32;
    Header {
        slot,
        generation: 1,
        method: COUNT,
        body_len: len,
        total_len: len,
        ..Header::new(Kind::StreamMsg)
    }
}

/// An encoded EchoMsg with `seq`.
fn echo_body(seq: u64) -> Vec<u8> {
    use prost::Message;
    EchoMsg { seq, ..Default::default() }.encode_to_vec()
}

/// The server closes the raw session as malformed; another client is served.
fn closed_as_malformed(h: &ServerHandle, before: u64, what: &str) {
    until(what, || h.counters().malformed > before);
    assert_eq!(h.counters().malformed, before + 1, "{what}: closed once");
    let c = Client::connect_with(h.local_addr(), &client_config()).unwrap();
    check_reply(&c.unary(rpc_support::ECHO, &request_msg(3), &CallOptions::default()).unwrap(), 3, 10);
}

fn request_msg(seq: u64) -> EchoMsg {
    rpc_support::request(seq, 10, 10)
}

/// A unary round trip on the raw session: it is still served.
fn raw_unary_works(raw: &mut RawClient, slot: u16) {
    use prost::Message;
    let body = request_msg(9).encode_to_vec();
    let len = body.len() as u32;
    raw.send(Header { body_len: len, total_len: len, ..request(slot, rpc_support::ECHO, 0, 0) }, &body);
    let r = raw.wait_for(Kind::Response, slot);
    assert_eq!(r.status, Code::Ok);
}

#[test]
fn stream_controls_for_calls_that_are_not_streams_change_nothing() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    // Nothing open on slot 5: a StreamGrant, a StreamEnd, a StreamMsg (dropped: it may be a
    // message sent before the stream's answer reached the client).
    raw.send(control(Kind::StreamGrant, 5, 9), &[]);
    raw.send(control(Kind::StreamEnd, 5, 0), &[]);
    raw.send(stream_msg(5, &echo_body(1)), &echo_body(1));
    // A server stream (no client messages): its client ends "its messages" and sends one.
    raw.send(request(0, FLOOD, STREAM_OUT, 4), &[]);
    raw.wait_for(Kind::StreamMsg, 0);
    raw.send(control(Kind::StreamEnd, 0, 0), &[]);
    raw.send(control(Kind::Cancel, 0, 0), &[]);
    raw.wait_for(Kind::Response, 0);
    // Controls after the stream's answer (the slot's generation 1 is over).
    raw.send(control(Kind::StreamGrant, 0, 3), &[]);
    raw.send(control(Kind::StreamEnd, 0, 0), &[]);
    raw.send(control(Kind::Cancel, 0, 0), &[]);
    raw_unary_works(&mut raw, 1);
    assert_eq!(h.counters().malformed, 0);
    drop(raw);
    h.shutdown();
}

#[test]
fn stream_end_twice_and_a_cancel_after_the_end_answer_the_call_once() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    raw.send(request(2, COUNT, STREAM_IN, 0), &[]);
    raw.wait_for(Kind::StreamGrant, 2);
    for seq in 0..3 {
        raw.send(stream_msg(2, &echo_body(seq)), &echo_body(seq));
    }
    raw.send(control(Kind::StreamEnd, 2, 0), &[]);
    raw.send(control(Kind::StreamEnd, 2, 0), &[]);
    raw.send(control(Kind::Cancel, 2, 0), &[]);
    let r = raw.wait_for(Kind::Response, 2);
    assert!(matches!(r.status, Code::Ok | Code::Cancelled), "{r:?}");
    // Exactly one answer: nothing more comes for the slot.
    raw_unary_works(&mut raw, 3);
    assert!(
        !raw.inbox.iter().any(|(g, _)| g.kind == Kind::Response && g.slot == 2),
        "a second answer: {:?}",
        raw.inbox
    );
    assert_eq!(h.counters().malformed, 0);
    drop(raw);
    h.shutdown();
}

#[test]
fn stream_messages_beyond_their_grants_close_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    // HOLD never reads, so no grant follows the first: one message more than it.
    raw.send(request(0, HOLD, STREAM_IN, 0), &[]);
    let granted = raw.wait_for(Kind::StreamGrant, 0).count;
    assert!(granted > 0 && u32::from(granted) <= rpc_core::session::MAX_STREAM_BUDGET);
    for seq in 0..u64::from(granted) {
        raw.send(stream_msg(0, &echo_body(seq)), &echo_body(seq));
    }
    // Up to its credits, the stream is fine.
    raw_unary_works(&mut raw, 1);
    assert_eq!(h.counters().malformed, 0);
    raw.send(stream_msg(0, &echo_body(99)), &echo_body(99));
    closed_as_malformed(&h, 0, "messages beyond the stream's grants");
    drop(raw);
    h.shutdown();
}

/// Stream SENDs hold request credits: a raw client (8 credits) that sends stream ends for a
/// call that is no stream (each harmless alone) beyond its credits plus the 8 only stream SENDs
/// use, while the worker is held (so no header of the server can have given one back), is
/// closed as malformed, and the server serves others. Before, such a flood was unbounded (each took a receive WQE).
#[test]
fn stream_sends_beyond_the_sessions_credits_close_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    let pool = u32::from(raw.credits) + u32::from(rpc_core::session::STREAM_RESERVED_CREDITS);
    for _ in 0..pool - 1 {
        raw.send(control(Kind::StreamEnd, 5, 0), &[]);
    }
    // Up to the pool with a request, it is legal (and its answer reports them taken).
    raw_unary_works(&mut raw, 1);
    assert_eq!(h.counters().malformed, 0);
    drop(raw);
    h.shutdown();
    // One more than the pool, all in the SRQ before the worker takes any (it is held by another
    // session's call), so no header of the server can have reported some of them meanwhile.
    let (hold, gate) = rpc_support::Hold::new();
    let h = server()
        .add_service(Break)
        .add_service(TestService::default())
        .add_service(hold)
        .spawn("127.0.0.1:0")
        .unwrap();
    let mut holder = connect_raw(h.local_addr());
    let mut raw = connect_raw(h.local_addr());
    holder.send(request(0, rpc_support::HOLD, 0, 0), &[]);
    until("the held call reaches its handler", || gate.entered());
    for _ in 0..=pool {
        raw.send(control(Kind::StreamEnd, 5, 0), &[]);
    }
    let give_up = Instant::now() + WAIT;
    while raw.sq.outstanding() > 0 && Instant::now() < give_up {
        raw.poll();
        std::thread::yield_now();
    }
    drop(gate);
    closed_as_malformed(&h, 0, "stream SENDs beyond credits + 8");
    drop((raw, holder));
    h.shutdown();
}

#[test]
fn a_stream_message_on_a_stream_whose_client_sends_none_closes_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    raw.send(request(0, FLOOD, STREAM_OUT, 2), &[]);
    raw.wait_for(Kind::StreamMsg, 0);
    raw.send(stream_msg(0, &echo_body(1)), &echo_body(1));
    closed_as_malformed(&h, 0, "a message in the wrong direction");
    drop(raw);
    h.shutdown();
}

#[test]
fn a_stream_message_after_the_clients_end_closes_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    // HOLD answers only once cancelled: the end and the message after it come before.
    raw.send(request(0, HOLD, STREAM_IN, 0), &[]);
    raw.wait_for(Kind::StreamGrant, 0);
    raw.send(control(Kind::StreamEnd, 0, 0), &[]);
    raw.send(stream_msg(0, &echo_body(1)), &echo_body(1));
    closed_as_malformed(&h, 0, "a message after StreamEnd");
    drop(raw);
    h.shutdown();
}

/// A peer granting credits beyond any stream's budget (a receiver never has more than half its
/// budget, at most MAX_STREAM_BUDGET, granted) would make the server move every message its
/// handler produces into the session's backlog while the peer reads nothing: unbounded memory.
#[test]
fn stream_grants_beyond_the_budget_in_the_request_close_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    raw.reading = false;
    raw.send(request(0, FLOOD, STREAM_OUT, u16::MAX), &[]);
    closed_as_malformed(&h, 0, "65535 credits in the request");
    drop(raw);
    h.shutdown();
}

/// Grants that are each within the budget but add up beyond it: the running total is what is
/// checked, not each grant alone. Three grants of half the budget, fewer SENDs than the
/// session's credits, so nothing but the total can close the session (sabotage: the total
/// check in `Session::handle_header` disabled: not closed).
#[test]
fn repeated_stream_grants_beyond_the_budget_close_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    assert!(raw.credits > 4, "room for the request and three grants within the credits");
    raw.reading = false;
    raw.send(request(0, FLOOD, STREAM_OUT, 1), &[]);
    let half = (rpc_core::session::MAX_STREAM_BUDGET / 2) as u16;
    for _ in 0..3 {
        raw.send(control(Kind::StreamGrant, 0, half), &[]);
    }
    closed_as_malformed(&h, 0, "grants adding up beyond the budget");
    drop(raw);
    h.shutdown();
}

#[test]
fn a_stream_message_out_of_the_ring_closes_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    raw.send(request(0, COUNT, STREAM_IN, 0), &[]);
    raw.wait_for(Kind::StreamGrant, 0);
    let len = 4096u32;
    let ring_len = raw.ring_len;
    raw.write(0, &vec![0x5a; len as usize], None);
    let h0 = Header { in_ring: true, ring_offset: ring_len - 16, ..stream_msg(0, &vec![0; len as usize]) };
    raw.send(h0, &[]);
    closed_as_malformed(&h, 0, "a ring range past the ring's end");
    drop(raw);
    h.shutdown();
}

#[test]
fn a_stream_message_over_max_message_size_closes_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    raw.send(request(0, COUNT, STREAM_IN, 0), &[]);
    raw.wait_for(Kind::StreamGrant, 0);
    // 64 MiB announced, in pieces, the first of 4 KiB.
    raw.write(0, &[0x5a; 4096], None);
    let h0 = Header { in_ring: true, body_len: 4096, total_len: 64 << 20, ..stream_msg(0, &[]) };
    raw.send(h0, &[]);
    closed_as_malformed(&h, 0, "a stream message over max_message_size");
    drop(raw);
    h.shutdown();
}

/// A batch header for `n` messages with `body`.
fn batch_msg(slot: u16, n: u16, body: &[u8]) -> Header {
    Header { stream: rpc_core::wire::STREAM_BATCH, count: n, ..stream_msg(slot, body) }
}

#[test]
fn a_stream_batch_whose_frames_do_not_add_up_closes_the_offender() {
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    raw.send(request(0, COUNT, STREAM_IN, 0), &[]);
    raw.wait_for(Kind::StreamGrant, 0);
    // Announces 3 messages, carries 2.
    let mut body = Vec::new();
    rpc_core::wire::push_frame(&mut body, &echo_body(1));
    rpc_core::wire::push_frame(&mut body, &echo_body(2));
    raw.send(batch_msg(0, 3, &body), &body);
    closed_as_malformed(&h, 0, "a batch short of its count");
    drop(raw);
    // A frame whose length runs past the body.
    let mut raw = connect_raw(h.local_addr());
    raw.send(request(0, COUNT, STREAM_IN, 0), &[]);
    raw.wait_for(Kind::StreamGrant, 0);
    let mut body = Vec::new();
    rpc_core::wire::push_frame(&mut body, &echo_body(1));
    body[0] = 100;
    raw.send(batch_msg(0, 1, &body), &body);
    closed_as_malformed(&h, 1, "a frame past the batch's end");
    drop(raw);
    h.shutdown();
}

/// A batch takes one stream grant and reaches the reader as its messages: every credit the
/// server granted carries 50 messages, none is refused, and the handler counts them all.
#[test]
fn a_batch_takes_one_grant_and_reaches_the_reader_message_by_message() {
    use prost::Message;
    let (h, _c) = start();
    let mut raw = connect_raw(h.local_addr());
    raw.send(request(0, COUNT, STREAM_IN, 0), &[]);
    let granted = raw.wait_for(Kind::StreamGrant, 0).count;
    let mut body = Vec::new();
    for _ in 0..50 {
        rpc_core::wire::push_frame(&mut body, &echo_body(0));
    }
    for _ in 0..granted {
        raw.send(batch_msg(0, 50, &body), &body);
    }
    raw.send(control(Kind::StreamEnd, 0, 0), &[]);
    let (r, body) = loop {
        let (r, body) = raw.response(Duration::from_secs(20)).expect("the answer");
        if r.kind == Kind::Response && r.slot == 0 {
            break (r, body);
        }
    };
    assert_eq!(r.status, Code::Ok, "{r:?}");
    let counted = EchoMsg::decode(&body[..]).unwrap().seq;
    assert_eq!(counted, 50 * u64::from(granted), "every message of the {granted} batches");
    assert_eq!(h.counters().malformed, 0);
    drop(raw);
    h.shutdown();
}

// ---- misuse through the public API ----

#[test]
fn bidi_send_after_finish_and_finish_twice_are_clear_errors() {
    let (_h, c) = start();
    // HOLD answers only once cancelled: the stream stays open after the finish.
    let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(HOLD, &CallOptions::default()).unwrap();
    s.send(&request_msg(0)).unwrap();
    s.finish();
    s.finish();
    let e = s.send(&request_msg(1)).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("ended (finish)"), "{e}");
    assert_eq!(s.try_send(&request_msg(2)).unwrap_err().code(), Code::FailedPrecondition);
    drop(s);
    // A handler that drops its sink at once: a clean end, then the end again.
    let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(DROP_SINK, &CallOptions::default()).unwrap();
    assert_eq!(s.message().unwrap(), None);
    assert_eq!(s.message().unwrap(), None, "after the end, the end again");
    let e = s.send(&request_msg(3)).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    s.finish();
    drop(s);
    check_reply(&c.unary(rpc_support::ECHO, &request_msg(4), &CallOptions::default()).unwrap(), 4, 10);
}

#[test]
fn a_handler_that_drops_its_request_stream_lets_the_client_send_on_and_finish() {
    let (_h, c) = start();
    let mut s = c.client_stream::<EchoMsg, EchoMsg>(DROP_READER, &CallOptions::default()).unwrap();
    // Far more than any stream's grants: each message dropped for want of a reader returns
    // its credit, so no send stalls (the handler answers only after them).
    for seq in 0..400 {
        s.send(&request_msg(seq)).unwrap();
    }
    RELEASE.store(true, Ordering::Release);
    assert_eq!(s.finish().unwrap().seq, 7);
    check_reply(&c.unary(rpc_support::ECHO, &request_msg(5), &CallOptions::default()).unwrap(), 5, 10);
}

#[test]
fn dropping_a_bidi_stream_in_odd_orders_cancels_and_frees_it() {
    let (h, c) = start();
    for round in 0..3 {
        let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(FLOOD, &CallOptions::default()).unwrap();
        match round {
            0 => {}
            1 => {
                s.finish();
            }
            _ => {
                let _ = s.message().unwrap();
                s.finish();
            }
        }
        drop(s);
    }
    check_reply(&c.unary(rpc_support::ECHO, &request_msg(6), &CallOptions::default()).unwrap(), 6, 10);
    until("the server's streams to close", || h.counters().malformed == 0 && c.closed_reason().is_none());
}

/// A send either sees the deadline itself (DEADLINE_EXCEEDED) or finds the server's answer
/// already there (FAILED_PRECONDITION, documented: the call's result is its answer); either way
/// the call's result is DEADLINE_EXCEEDED, at once.
#[test]
fn a_stream_deadline_of_zero_ends_at_once_deadline_exceeded() {
    let (_h, c) = start();
    let opts = CallOptions::deadline(Duration::ZERO);
    let started = Instant::now();
    let sent = |r: Result<(), Status>| {
        if let Err(e) = r {
            assert!(matches!(e.code(), Code::DeadlineExceeded | Code::FailedPrecondition), "{e}");
        }
    };
    for _ in 0..20 {
        let mut s = c.client_stream::<EchoMsg, EchoMsg>(COUNT, &opts).unwrap();
        sent(s.send(&request_msg(1)));
        let e = s.finish().unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
        let mut s = c.bidi_stream::<EchoMsg, EchoMsg>(COUNT, &opts).unwrap();
        sent(s.send(&request_msg(1)));
        s.finish();
        let e = s.message().unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
        drop(s);
        // Drives the session: the abandoned streams' acknowledgements come in (streams do not
        // wait for held slots; 32 back-to-back would find the window full).
        check_reply(&c.unary(rpc_support::ECHO, &request_msg(8), &CallOptions::default()).unwrap(), 8, 10);
    }
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    check_reply(&c.unary(rpc_support::ECHO, &request_msg(7), &CallOptions::default()).unwrap(), 7, 10);
}

/// Applies what the server sent `c` to its client session `sess` (answers, CancelAcks and stream
/// messages included); returns how many messages arrived.
fn apply_incoming(c: &mut RawClient, sess: &mut rpc_core::session::Session) -> usize {
    let mut n = 0;
    while let Some((h, _)) = c.poll() {
        sess.handle_header(&h, Instant::now).expect("a legal message from the server");
        if h.kind == Kind::Response {
            sess.on_response(h.slot, h.generation).expect("an answer to a call on the wire");
        }
        n += 1;
    }
    // The raw client keeps CancelAcks apart (and drops RingReturns, whose counts a later
    // message carries again).
    for (slot, generation) in std::mem::take(&mut c.acks) {
        let ack = Header { slot, generation, session: c.session, ..Header::new(Kind::CancelAck) };
        sess.handle_header(&ack, Instant::now).expect("a CancelAck for a Cancel sent");
        n += 1;
    }
    n
}

/// Many sessions streaming at once while their worker takes nothing, each raw client sending
/// everything a client [`rpc_core::session::Session`] of its own allows (the protocol's rule,
/// not this test's): per session three client streams (their messages and stream ends), a
/// server stream (the stream grants for the messages it received), every unary call its
/// credits still allow and a Cancel per call (no RingReturn: the server wrote nothing into its
/// ring, and the server's meter closes a session whose RingReturn frees nothing; see
/// `session::meter`). Stream SENDs hold request
/// credits, so all of it stays within `ServerConfig::srq_per_session` per session, and on an SRQ
/// sized for exactly these sessions no SEND waits for a receive WQE (RNR). Before stream SENDs
/// held credits, a session sent 32 stream messages, 3 stream ends and stream grants on top of
/// its 32 requests, and the SENDs waited.
#[test]
fn many_sessions_streaming_at_once_stay_within_their_srq_reservations() {
    use rpc_core::session::Session;
    const SESSIONS: usize = 4;
    const CREDITS: u16 = 32;
    let (hold, gate) = rpc_support::Hold::new();
    let server = server()
        .max_sessions(SESSIONS)
        .credits_per_session(CREDITS)
        .initial_credits(CREDITS)
        .ring_bytes(1 << 16)
        .add_service(Break)
        .add_service(TestService::default())
        .add_service(hold)
        .spawn("127.0.0.1:0")
        .unwrap();
    let reserved = rpc_core::ServerConfig::srq_per_session(CREDITS);
    let now = Instant::now;
    let mut peers = Vec::new();
    // Phase 1, the worker free: each session opens its streams and gets the server's grants and
    // a window of the server stream's messages (read, not yet taken by the application).
    for _ in 0..SESSIONS {
        let mut c = RawClient::connect_with(server.local_addr(), CREDITS, 1024, 1 << 20);
        let mut sess = c.client_session();
        let mut streams = Vec::new();
        for (method, flags) in [(HOLD, STREAM_IN), (HOLD, STREAM_IN), (HOLD, STREAM_IN), (FLOOD, STREAM_OUT)]
        {
            let call = sess.start_call(method, None, flags).expect("a free slot");
            let mut h = sess.next_request(now).expect("a free credit");
            sess.stamp(&mut h);
            c.send_eager(h, &[]);
            streams.push(call);
        }
        let (flood, cap) = (streams[3], u32::from(CREDITS) / 2);
        until("the grants and a window of the server stream", || {
            apply_incoming(&mut c, &mut sess);
            let granted =
                streams[..3].iter().map(|&(s, g)| sess.stream_send_grants(s, g).unwrap()).sum::<u32>();
            granted == u32::from(CREDITS) && sess.stream_receive_window(flood.0, flood.1) == Some((cap, 0))
        });
        peers.push((c, sess, streams));
    }
    // Phase 2: a call holds the worker.
    {
        let (c, sess, _) = &mut peers[0];
        sess.start_call(rpc_support::HOLD, None, 0).expect("a free slot");
        let mut h = sess.next_request(now).expect("a credit for the held call");
        sess.stamp(&mut h);
        c.send_eager(h, &[]);
        until("the held call reaches its handler", || gate.entered());
    }
    // Phase 3: every session sends all its own session allows.
    let msg = echo_body(1);
    let mut sent = vec![0u32; SESSIONS];
    for (i, (c, sess, streams)) in peers.iter_mut().enumerate() {
        let mut send = |c: &mut RawClient, sess: &mut Session, mut h: Header, body: &[u8]| {
            sess.stamp(&mut h);
            c.send_eager(h, body);
            sent[i] += 1;
        };
        let flood = streams[3];
        while sess.stream_receive_window(flood.0, flood.1).is_some_and(|(held, _)| held > 0) {
            sess.stream_consumed(flood.0, flood.1);
        }
        for &(slot, generation) in &streams[..3] {
            while sess.stream_send(slot, generation).unwrap() {
                let len = msg.len() as u32;
                let h = Header {
                    slot,
                    generation,
                    body_len: len,
                    total_len: len,
                    ..Header::new(Kind::StreamMsg)
                };
                send(c, sess, h, &msg);
            }
            sess.stream_end(slot, generation).unwrap();
        }
        let mut calls = Vec::new();
        while let Some(call) = sess.start_call(rpc_support::RAW, None, 0) {
            let Some(h) = sess.next_request(now) else {
                sess.abandon_call(call.0, call.1, false, now);
                break;
            };
            calls.push(call);
            send(c, sess, h, &[]);
        }
        for (slot, generation) in calls.into_iter().chain(streams.iter().copied()) {
            sess.abandon_call(slot, generation, false, now);
        }
        while let Some(h) = sess.next_control() {
            send(c, sess, h, &[]);
        }
    }
    let give_up = Instant::now() + WAIT;
    while peers.iter().any(|(c, _, _)| c.sq.outstanding() > 0) && Instant::now() < give_up {
        for (c, _, _) in peers.iter_mut() {
            c.poll();
        }
        std::thread::yield_now();
    }
    let stalls: u64 = peers.iter().map(|(c, _, _)| c.peer.qp.rnr_stalls()).sum();
    drop(gate);
    assert_eq!(
        stalls, 0,
        "{sent:?} messages of sessions reserving {reserved} WQEs each waited for a receive WQE"
    );
    for &n in &sent {
        assert!(n <= reserved, "{n} messages sent, {reserved} reserved");
        assert!(n > u32::from(CREDITS) + 3, "{n} messages: the streams' share is in");
    }
    // The server found all of it legal: it answers every call and acknowledges every Cancel.
    let give_up = Instant::now() + WAIT;
    while !peers.iter_mut().all(|(c, sess, _)| {
        apply_incoming(c, sess);
        sess.calls().in_flight() == 0
    }) {
        let state: Vec<_> = peers
            .iter()
            .map(|(_, s, _)| (s.calls().in_flight(), s.calls().abandoned(), s.stream_sends_unreturned()))
            .collect();
        let dead: Vec<_> = peers.iter().map(|(c, _, _)| (c.dead, c.inbox.len())).collect();
        assert!(
            Instant::now() < give_up,
            "every call answered and every Cancel acknowledged: {state:?} {dead:?} {:?}",
            server.counters()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(server.counters().malformed, 0);
    drop(peers);
    server.shutdown();
}
