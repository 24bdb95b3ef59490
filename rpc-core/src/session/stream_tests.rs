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
    let credits = c.stream_open(slot, 1, flags);
    let req = Header { method: 9, slot, generation: 1, stream: flags, credits, ..Header::new(Kind::Request) };
    carry(c, s, req).unwrap();
}

fn msg(slot: u16) -> Header {
    Header { slot, generation: 1, body_len: 3, total_len: 3, ..Header::new(Kind::StreamMsg) }
}

/// Server streaming: the client grants `cap` messages; the server sends exactly that many and is
/// then blocked at the credit limit for as long as the client's application takes nothing, with
/// no control message moving; each message taken lets exactly one more go (batched by a quarter
/// of the cap), so the client never holds more than `cap`.
#[test]
fn a_consumer_that_stops_reading_blocks_its_producer_at_the_credit_limit() {
    let (mut c, mut s) = pair(16);
    open(&mut c, &mut s, 0, STREAM_OUT);
    let cap = 8; // half the budget of 16 credits
    let mut sent = 0;
    while s.stream_send(0, 1).unwrap() {
        carry(&mut s, &mut c, msg(0)).unwrap();
        sent += 1;
        assert!(sent <= 1000, "never blocked");
    }
    assert_eq!(sent, cap);
    assert_eq!(c.stream_receive_window(0, 1), Some((cap, 0)));
    for _ in 0..100 {
        assert!(!c.has_control(), "no credit returns while nothing is taken");
        assert_eq!(s.stream_send(0, 1), Ok(false), "producer stays blocked");
    }
    // A message beyond the credits is a protocol violation, not buffered.
    assert_eq!(carry(&mut s, &mut c, msg(0)).unwrap_err(), "stream message beyond its stream credits");
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
    assert_eq!(c.stream_send_credits(3, 1), Some(4));
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
    let credit = c.next_control().expect("the third stream's grant");
    assert_eq!((credit.kind, credit.slot, credit.credits), (Kind::StreamCredit, 2, 8));
    // Reservation: with 2 free and two streams starving, each gets at least its first message.
    let (mut c, _) = pair(4);
    assert_eq!(c.stream_open(0, 1, STREAM_OUT), 2);
    assert_eq!(c.stream_open(1, 1, STREAM_OUT), 2);
    assert_eq!(c.stream_open(2, 1, STREAM_OUT), 0);
    assert_eq!(c.stream_open(3, 1, STREAM_OUT), 0);
    c.stream_close(0, 1);
    let a = c.next_control().unwrap();
    let b = c.next_control().unwrap();
    let mut got = [(a.slot, a.credits), (b.slot, b.credits)];
    got.sort();
    assert_eq!(got, [(2, 1), (3, 1)], "shared, not all to the first");
    let _ = &mut s;
}

proptest::proptest! {
    /// Random interleavings of sending, delivering (in order, possibly delayed), taking and
    /// granting: the consumer never holds or has granted more than the cap, the producer never
    /// exceeds its credits (the consumer would refuse), and every message sent arrives.
    #[test]
    fn credits_bound_in_flight_and_held_messages(ops in proptest::collection::vec(0u8..4, 1..400)) {
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
