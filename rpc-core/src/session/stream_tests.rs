//! Streams between a client and a server session, headers carried by hand (sans-IO).

use super::*;
use crate::wire::{STREAM_IN, STREAM_OUT};
use std::time::Instant;

fn params(credits: u16) -> SessionParams {
    SessionParams {
        id: 5,
        credits,
        eager_threshold: 64,
        max_message: 1 << 20,
        peer_ring_len: 1024,
        own_ring_len: 1024,
        max_held: usize::from(credits),
    }
}

fn pair(credits: u16) -> (Session, Session) {
    (Session::new(Role::Client, params(credits)), Session::new(Role::Server, params(credits)))
}

/// Sends `h` from `from` to `to` as the drivers do: stamped, then handled.
fn carry(from: &mut Session, to: &mut Session, mut h: Header) -> Result<Incoming, &'static str> {
    from.stamp(&mut h);
    to.handle_header(&h, Instant::now)
}

/// Carries every control message `from` has due to `to`.
fn carry_controls(from: &mut Session, to: &mut Session) {
    while let Some(h) = from.next_control() {
        carry(from, to, h).unwrap();
    }
}

fn open(c: &mut Session, s: &mut Session, slot: u16, flags: u8) {
    let grants = c.stream_open(slot, 1, flags);
    let req =
        Header { method: 9, slot, generation: 1, stream: flags, count: grants, ..Header::new(Kind::Request) };
    carry(c, s, req).unwrap();
}

fn msg(slot: u16) -> Header {
    Header { slot, generation: 1, body_len: 3, total_len: 3, ..Header::new(Kind::StreamMsg) }
}

/// Server streaming: the client grants `cap` messages; the server sends exactly that many and is
/// then blocked at the grant limit for as long as the client's application takes nothing, with
/// no control message moving; each message taken lets exactly one more go (batched by a quarter
/// of the cap), so the client never holds more than `cap`.
#[test]
fn a_consumer_that_stops_reading_blocks_its_producer_at_the_grant_limit() {
    let (mut c, mut s) = pair(16);
    open(&mut c, &mut s, 0, STREAM_OUT);
    let cap = 8; // half the stream budget of a session of 16 credits
    let mut sent = 0;
    while s.stream_send(0, 1).unwrap() {
        carry(&mut s, &mut c, msg(0)).unwrap();
        sent += 1;
        assert!(sent <= 1000, "never blocked");
    }
    assert_eq!(sent, cap);
    assert_eq!(c.stream_receive_window(0, 1), Some((cap, 0)));
    for _ in 0..100 {
        assert!(!c.has_control(), "no grant returns while nothing is taken");
        assert_eq!(s.stream_send(0, 1), Ok(false), "producer stays blocked");
    }
    // A message beyond the grants is a protocol violation, not buffered.
    assert_eq!(carry(&mut s, &mut c, msg(0)).unwrap_err(), "stream message beyond its stream grants");
    let (mut c, mut s) = pair(16);
    open(&mut c, &mut s, 0, STREAM_OUT);
    for _ in 0..cap {
        assert!(s.stream_send(0, 1).unwrap());
        carry(&mut s, &mut c, msg(0)).unwrap();
    }
    for round in 0..50u32 {
        // The application takes messages: no credit per message, half the window at once.
        for _ in 0..cap / 2 - 1 {
            c.stream_consumed(0, 1);
        }
        assert!(!c.has_control(), "round {round}: a credit before half the window was taken");
        c.stream_consumed(0, 1);
        assert!(c.has_control(), "round {round}: no credit once half the window was taken");
        carry_controls(&mut c, &mut s);
        let mut more = 0;
        while s.stream_send(0, 1).unwrap() {
            carry(&mut s, &mut c, msg(0)).unwrap();
            more += 1;
        }
        assert_eq!(more, cap / 2, "round {round}: exactly what was taken");
        let (held, granted) = c.stream_receive_window(0, 1).unwrap();
        assert!(held + granted <= cap);
    }
}

/// Client streaming: the server grants on open; the client sends within it, ends its messages
/// cleanly (a StreamEnd, not a Cancel); the answer closes the stream at both ends and a message
/// the client sent before it learned so is dropped, not a violation.
#[test]
fn client_stream_is_granted_by_the_server_and_ends_cleanly() {
    let (mut c, mut s) = pair(8);
    open(&mut c, &mut s, 3, STREAM_IN);
    assert_eq!(c.stream_send(3, 1), Ok(false), "nothing granted before the server's credit");
    assert!(s.has_control());
    carry_controls(&mut s, &mut c);
    assert_eq!(c.stream_send_grants(3, 1), Some(4));
    for _ in 0..4 {
        assert!(c.stream_send(3, 1).unwrap());
        carry(&mut c, &mut s, msg(3)).unwrap();
    }
    assert_eq!(c.stream_send(3, 1), Ok(false));
    assert_eq!(s.stream_receive_window(3, 1), Some((4, 0)));
    assert!(!s.stream_peer_ended(3, 1));
    c.stream_end(3, 1).unwrap();
    assert_eq!(c.stream_send(3, 1), Err(StreamError::NotSending));
    assert_eq!(c.stream_end(3, 1), Err(StreamError::NotSending));
    let end = c.next_control().unwrap();
    assert_eq!(end.kind, Kind::StreamEnd, "an end, not a cancel");
    carry(&mut c, &mut s, end).unwrap();
    assert!(s.stream_peer_ended(3, 1));
    assert!(s.live_call(3, 1).is_some(), "an ended stream is not a cancelled call");
    // The server answers: the stream is over.
    assert!(s.on_answer_for(3, 1));
    assert_eq!(s.streams_open(), 0);
    assert_eq!(s.stream_send(3, 1), Err(StreamError::NoStream));
    carry(&mut c, &mut s, msg(3)).expect("a late message for an answered stream is dropped");
    c.stream_close(3, 1);
    assert_eq!(c.streams_open(), 0);
}

/// Bidirectional, with the wrong direction refused: a server never sends on a client stream, a
/// client never receives server messages it did not open the stream for, a stream end to a
/// client is a violation, and a message on no stream at a client is one too.
#[test]
fn directions_are_enforced() {
    let (mut c, mut s) = pair(8);
    open(&mut c, &mut s, 1, STREAM_IN | STREAM_OUT);
    carry_controls(&mut s, &mut c);
    assert!(c.stream_send(1, 1).unwrap());
    assert!(s.stream_send(1, 1).unwrap());
    open(&mut c, &mut s, 2, STREAM_IN);
    assert_eq!(s.stream_send(2, 1), Err(StreamError::NotSending));
    carry_controls(&mut s, &mut c);
    assert!(c.stream_send(2, 1).unwrap());
    assert!(carry(&mut s, &mut c, msg(2)).is_err(), "server message on a client stream");
    let (mut c, mut s) = pair(8);
    let end = Header { slot: 0, generation: 1, ..Header::new(Kind::StreamEnd) };
    assert_eq!(carry(&mut s, &mut c, end).unwrap_err(), "stream end sent to a client");
    assert_eq!(carry(&mut s, &mut c, msg(0)).unwrap_err(), "stream message for no open stream");
}

/// The budget bounds all streams of a session together: with 16 credits, two streams take the
/// budget (8 each), a third gets nothing until one closes, then its first grant; a grant never
/// takes the last budget a stream with nothing granted needs.
#[test]
fn the_session_budget_bounds_every_stream_together() {
    let (mut c, mut s) = pair(16);
    assert_eq!(c.stream_open(0, 1, STREAM_OUT), 8);
    assert_eq!(c.stream_open(1, 1, STREAM_OUT), 8);
    assert_eq!(c.stream_open(2, 1, STREAM_OUT), 0, "budget spent");
    c.stream_close(0, 1);
    let grant = c.next_control().expect("the third stream's grant");
    assert_eq!((grant.kind, grant.slot, grant.count), (Kind::StreamGrant, 2, 8));
    // Reservation: with 2 free and two streams starving, each gets at least its first message.
    let (mut c, _) = pair(4);
    assert_eq!(c.stream_open(0, 1, STREAM_OUT), 2);
    assert_eq!(c.stream_open(1, 1, STREAM_OUT), 2);
    assert_eq!(c.stream_open(2, 1, STREAM_OUT), 0);
    assert_eq!(c.stream_open(3, 1, STREAM_OUT), 0);
    c.stream_close(0, 1);
    let a = c.next_control().unwrap();
    let b = c.next_control().unwrap();
    let mut got = [(a.slot, a.count), (b.slot, b.count)];
    got.sort();
    assert_eq!(got, [(2, 1), (3, 1)], "shared, not all to the first");
    let _ = &mut s;
}

proptest::proptest! {
    /// Random interleavings of sending, delivering (in order, possibly delayed), taking and
    /// granting: the consumer never holds or has granted more than the cap, the producer never
    /// exceeds its grants (the consumer would refuse), and every message sent arrives.
    #[test]
    fn grants_bound_in_flight_and_held_messages(ops in proptest::collection::vec(0u8..4, 1..400)) {
        let (mut c, mut s) = pair(8);
        open(&mut c, &mut s, 0, STREAM_OUT);
        let mut wire = 0u32;
        let (mut sent, mut arrived, mut taken) = (0u32, 0u32, 0u32);
        for op in ops {
            match op {
                0 => if s.stream_send(0, 1).unwrap() { wire += 1; sent += 1; },
                1 => if wire > 0 { wire -= 1; arrived += 1; carry(&mut s, &mut c, msg(0)).unwrap(); },
                2 => if arrived > taken { taken += 1; c.stream_consumed(0, 1); },
                _ => carry_controls(&mut c, &mut s),
            }
            let (held, granted) = c.stream_receive_window(0, 1).unwrap();
            proptest::prop_assert!(held + wire <= 4, "held {} + on the wire {}", held, wire);
            proptest::prop_assert!(held + granted <= 4);
            proptest::prop_assert_eq!(held, arrived - taken);
        }
        proptest::prop_assert_eq!(sent, arrived + wire);
    }
}

/// Starts a call through the client's slots and credits and carries its request to the server.
fn start(c: &mut Session, s: &mut Session, flags: u8) -> (u16, u32) {
    let call = c.start_call(9, None, flags).expect("a free slot");
    let h = c.next_request(Instant::now).expect("a free credit");
    carry(c, s, h).unwrap();
    call
}

fn stream_msg(slot: u16, generation: u32) -> Header {
    Header { slot, generation, body_len: 3, total_len: 3, ..Header::new(Kind::StreamMsg) }
}

/// A client's stream messages hold request credits: with two client streams' messages on the
/// wire, only the requests that leave room in `credits + STREAM_RESERVED_CREDITS` go, the next
/// waits although its slot credits are free, and once the server took the messages a header of
/// the server gives those credits back: a RingReturn of its own when its application reads
/// nothing (so nothing else goes).
#[test]
fn client_stream_messages_hold_request_credits_until_the_server_counts_them_taken() {
    let (mut c, mut s) = pair(16);
    let pool = 16 + u32::from(STREAM_RESERVED_CREDITS);
    let a = start(&mut c, &mut s, STREAM_IN);
    let b = start(&mut c, &mut s, STREAM_IN);
    carry_controls(&mut s, &mut c);
    let mut wire = Vec::new();
    for (slot, generation) in [a, b] {
        while c.stream_send(slot, generation).unwrap() {
            wire.push(stream_msg(slot, generation));
        }
    }
    assert_eq!(wire.len(), 16, "two windows of 8");
    assert_eq!(c.stream_sends_unreturned(), 16);
    for _ in 0..8 {
        c.start_call(7, None, 0).unwrap();
        if let Some(h) = c.next_request(Instant::now) {
            wire.push(h);
        }
    }
    assert_eq!(c.calls().in_flight(), 8, "2 streams + 6 calls + 16 stream messages = {pool}");
    assert_eq!(c.calls().queued(), 2, "slot credits free, the pool is not");
    assert!(c.calls().in_flight() < c.calls().credits());
    // Everything the client sent is legal at the server.
    for h in wire {
        carry(&mut c, &mut s, h).unwrap();
    }
    assert!(s.ring_return_due(), "16 of the client's credits taken and unreported");
    // Its application reads none of them: nothing else would go to the client.
    assert!(s.ring_freed() && s.take_ring_return());
    carry(&mut s, &mut c, Header::new(Kind::RingReturn)).unwrap();
    assert_eq!(c.stream_sends_unreturned(), 0, "the RingReturn counted the stream messages taken");
    assert!(!s.ring_return_due());
    let mut more = 0;
    while c.next_request(Instant::now).is_some() {
        more += 1;
    }
    assert_eq!(more, 2, "the waiting calls go");
    // Calls first: with every slot credit on the wire, the streams have the 8 of their own.
    let (mut c, mut s) = pair(16);
    let a = start(&mut c, &mut s, STREAM_IN);
    let b = start(&mut c, &mut s, STREAM_IN);
    carry_controls(&mut s, &mut c);
    for _ in 0..14 {
        start(&mut c, &mut s, 0);
    }
    let mut sent = 0;
    for (slot, generation) in [a, b] {
        while c.stream_send(slot, generation).unwrap() {
            carry(&mut c, &mut s, stream_msg(slot, generation)).unwrap();
            sent += 1;
        }
    }
    assert_eq!(sent, STREAM_RESERVED_CREDITS, "16 requests + 8 stream messages = {pool}");
    assert_eq!(c.stream_send_grants(b.0, b.1), Some(8), "stream grants left, no request credit");
}

/// The server closes a client that sends stream SENDs or requests beyond what its credits hold
/// (stream ends for no stream, which are otherwise harmless: a flood of them was unbounded), and
/// a client refuses a server that counts more taken than were sent.
#[test]
fn stream_sends_beyond_the_credits_are_refused_at_both_ends() {
    let (mut c, mut s) = pair(4);
    let pool = 4 + u32::from(STREAM_RESERVED_CREDITS);
    let end = Header { slot: 3, generation: 1, ..Header::new(Kind::StreamEnd) };
    for _ in 0..pool {
        carry(&mut c, &mut s, end).unwrap();
    }
    assert_eq!(carry(&mut c, &mut s, end).unwrap_err(), "stream SENDs beyond the session's credits");
    let (mut c, mut s) = pair(4);
    for _ in 0..pool - 1 {
        carry(&mut c, &mut s, end).unwrap();
    }
    let req = Header { method: 9, slot: 0, generation: 1, ..Header::new(Kind::Request) };
    carry(&mut c, &mut s, req).unwrap();
    let req = Header { slot: 1, ..req };
    assert_eq!(carry(&mut c, &mut s, req).unwrap_err(), "request beyond the granted credits");
    // Once a server header reported them, the credits are back.
    let mut pong = Header::new(Kind::Pong);
    s.stamp(&mut pong);
    assert_eq!(pong.stream_taken, pool - 1);
    carry(&mut c, &mut s, req).unwrap();
    // A server counting more taken than the client sent.
    let (mut c, mut s) = pair(4);
    let lie = Header { stream_taken: 1, ..Header::new(Kind::Pong) };
    assert_eq!(carry(&mut s, &mut c, lie).map(|_| ()), Ok(()), "stamped by the server: its real count 0");
    let mut lie = Header { session: 5, ..Header::new(Kind::Pong) };
    lie.stream_taken = 1;
    assert_eq!(
        c.handle_header(&lie, Instant::now).unwrap_err(),
        "stream SENDs counted taken beyond those sent"
    );
    let bad = Header { stream_taken: 1, session: 5, ..Header::new(Kind::Ping) };
    assert_eq!(s.handle_header(&bad, Instant::now).unwrap_err(), "a client's message carries a stream count");
}

/// A client whose every request credit is held by its stream calls still moves its streams, on
/// the credits only stream SENDs use: its messages and stream ends go, a few at a time, as the
/// server's counts come back.
#[test]
fn streams_holding_every_request_credit_still_move() {
    let (mut c, mut s) = pair(2);
    let a = start(&mut c, &mut s, STREAM_IN);
    let b = start(&mut c, &mut s, STREAM_IN);
    assert_eq!(c.calls().in_flight(), c.calls().credits());
    let mut sent = 0;
    for _ in 0..40 {
        carry_controls(&mut s, &mut c);
        let mut on_wire = Vec::new();
        for (slot, generation) in [a, b] {
            while c.stream_send(slot, generation).unwrap() {
                on_wire.push(stream_msg(slot, generation));
            }
        }
        assert!(c.stream_sends_unreturned() <= u32::from(STREAM_RESERVED_CREDITS));
        for h in on_wire {
            carry(&mut c, &mut s, h).unwrap();
            sent += 1;
        }
        for (slot, generation) in [a, b] {
            while s.stream_receive_window(slot, generation).unwrap().0 > 0 {
                s.stream_consumed(slot, generation);
            }
        }
        if s.take_ring_return() {
            carry(&mut s, &mut c, Header::new(Kind::RingReturn)).unwrap();
        }
    }
    assert!(sent >= 40, "{sent} messages in 40 rounds");
    c.stream_end(a.0, a.1).unwrap();
    c.stream_end(b.0, b.1).unwrap();
    carry_controls(&mut s, &mut c);
    carry_controls(&mut c, &mut s);
    assert!(s.stream_peer_ended(a.0, a.1) && s.stream_peer_ended(b.0, b.1));
}

proptest::proptest! {
    /// Random interleavings of unary calls, two client streams and a server stream, each message
    /// delivered in order (possibly late) in both directions: the server never refuses the
    /// client, and the requests and stream SENDs on the wire to it (not yet taken) never exceed
    /// `credits + STREAM_RESERVED_CREDITS`, what its SRQ reserves for them.
    #[test]
    fn requests_and_stream_sends_on_the_wire_stay_within_the_reservation(
        credits in 1u16..24,
        ops in proptest::collection::vec(0u8..9, 1..500),
    ) {
        use std::collections::VecDeque;
        let (mut c, mut s) = pair(credits);
        let pool = usize::from(credits) + usize::from(STREAM_RESERVED_CREDITS);
        let mut to_s: VecDeque<Header> = VecDeque::new();
        let mut to_c: VecDeque<Header> = VecDeque::new();
        let mut streams: Vec<(u16, u32, u8)> = Vec::new();
        let mut unary: VecDeque<(u16, u32)> = VecDeque::new();
        let mut started = 0;
        for op in ops {
            match op {
                0 => {
                    // A call: the first three are streams.
                    let flags = [STREAM_IN, STREAM_IN, STREAM_OUT].get(started).copied().unwrap_or(0);
                    if c.start_call(9, None, flags).is_some() {
                        started += 1;
                    }
                }
                1 => {
                    while let Some(mut h) = c.next_request(Instant::now) {
                        if h.stream != 0 {
                            streams.push((h.slot, h.generation, h.stream));
                        }
                        c.stamp(&mut h);
                        to_s.push_back(h);
                    }
                }
                2 => {
                    for &(slot, generation, flags) in &streams {
                        if flags == STREAM_IN && c.stream_send(slot, generation) == Ok(true) {
                            let mut h = stream_msg(slot, generation);
                            c.stamp(&mut h);
                            to_s.push_back(h);
                        }
                    }
                    while let Some(mut h) = c.next_control() {
                        c.stamp(&mut h);
                        to_s.push_back(h);
                    }
                }
                3 | 4 => if let Some(h) = to_s.pop_front() {
                    s.handle_header(&h, Instant::now).map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}: {h:?}")))?;
                    if h.kind == Kind::Request && h.stream == 0 {
                        unary.push_back((h.slot, h.generation));
                    }
                },
                5 => {
                    if let Some((slot, generation)) = unary.pop_front() {
                        proptest::prop_assert!(s.on_answer_for(slot, generation));
                        let mut h = Header { slot, generation, method: 9, ..Header::new(Kind::Response) };
                        s.stamp(&mut h);
                        to_c.push_back(h);
                    }
                    for &(slot, generation, flags) in &streams {
                        if flags == STREAM_IN {
                            while s.stream_receive_window(slot, generation).is_some_and(|w| w.0 > 0) {
                                s.stream_consumed(slot, generation);
                            }
                        } else if s.stream_send(slot, generation) == Ok(true) {
                            let mut h = stream_msg(slot, generation);
                            s.stamp(&mut h);
                            to_c.push_back(h);
                        }
                    }
                    while let Some(mut h) = s.next_control() {
                        s.stamp(&mut h);
                        to_c.push_back(h);
                    }
                    if s.take_ring_return() {
                        let mut h = Header::new(Kind::RingReturn);
                        s.stamp(&mut h);
                        to_c.push_back(h);
                    }
                }
                6 | 7 => if let Some(h) = to_c.pop_front() {
                    c.handle_header(&h, Instant::now).map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}: {h:?}")))?;
                    if h.kind == Kind::Response {
                        c.on_response(h.slot, h.generation).unwrap();
                        c.take_done(h.slot, h.generation);
                    }
                },
                _ => {
                    for &(slot, generation, flags) in &streams {
                        if flags == STREAM_OUT {
                            while c.stream_receive_window(slot, generation).is_some_and(|w| w.0 > 0) {
                                c.stream_consumed(slot, generation);
                            }
                        }
                    }
                }
            }
            let counted = to_s
                .iter()
                .filter(|h| matches!(h.kind, Kind::Request | Kind::StreamMsg | Kind::StreamEnd | Kind::StreamGrant))
                .count();
            proptest::prop_assert!(counted <= pool, "{} requests and stream SENDs on the wire, {} reserved", counted, pool);
        }
    }
}

/// The metadata flag on a stream message is the server's (its stream's headers): a client's
/// stream message with it is a protocol violation; a server's is taken.
#[test]
fn only_a_servers_stream_message_may_carry_headers() {
    let (mut c, mut s) = pair(16);
    open(&mut c, &mut s, 0, STREAM_IN);
    carry_controls(&mut s, &mut c);
    assert!(c.stream_send(0, 1).unwrap());
    let with_headers = Header { metadata: true, ..msg(0) };
    assert_eq!(
        carry(&mut c, &mut s, with_headers).unwrap_err(),
        "the metadata flag on a client's stream message"
    );
    let (mut c, mut s) = pair(16);
    open(&mut c, &mut s, 0, STREAM_OUT);
    assert!(s.stream_send(0, 1).unwrap());
    carry(&mut s, &mut c, Header { metadata: true, ..msg(0) }).unwrap();
}
