//! The client's call policy on a fake clock: request headers, Cancel order, the abandon cap.

use super::super::{Event, Role, Session, SessionParams, SlotState};
use super::*;

fn client(window: u16, credits: u16) -> Session {
    Session::new(
        Role::Client,
        SessionParams {
            id: 5,
            credits,
            eager_threshold: 16,
            max_message: 1 << 20,
            peer_ring_len: 1024,
            own_ring_len: 1024,
            max_held: usize::from(window),
        },
    )
}

/// A fake clock: a base instant plus a chosen offset.
struct Clock(Instant);

impl Clock {
    fn at(&self, ms: u64) -> Instant {
        self.0 + Duration::from_millis(ms)
    }
}

/// Calls go out in the order they started, within the credits; a header carries the time left
/// of its deadline (the clock read only for a call with one); the response frees the credit.
#[test]
fn requests_leave_in_order_within_credits_with_the_time_left() {
    let clock = Clock(Instant::now());
    let mut s = client(4, 2);
    assert!(s.call_goes_now());
    let a = s.start_call(7, Some(clock.at(30)), 0).unwrap();
    assert!(!s.call_goes_now(), "a call waits before it");
    let b = s.start_call(8, None, 0).unwrap();
    let c = s.start_call(9, None, 0).unwrap();
    let h = s.next_request(|| clock.at(10)).unwrap();
    assert_eq!((h.slot, h.generation, h.method, h.timeout_us), (a.0, a.1, 7, 20_000));
    let h = s.next_request(|| panic!("no deadline: the clock is not read")).unwrap();
    assert_eq!((h.slot, h.method, h.timeout_us), (b.0, 8, 0));
    assert!(s.next_request(|| clock.at(10)).is_none(), "two credits");
    assert!(!s.call_goes_now(), "no credit free");
    assert!(s.calls().credit_stalled());
    assert_eq!(s.on_response(a.0, a.1), Ok(ResponseFate::Stored));
    assert_eq!(s.next_request(|| clock.at(11)).map(|h| h.slot), Some(c.0));
    assert!(s.take_done(a.0, a.1));
    assert!(!s.take_done(a.0, a.1), "taken once");
    assert!(s.on_response(a.0, a.1).is_err(), "no call of that slot on the wire");
}

/// A call started to go now ([`Session::start_call_now`]) is in flight at once with the header
/// `next_request` would give it, never overtakes a queued call, takes a credit, and keeps the
/// block it stores as the session's cached one.
#[test]
fn a_call_that_goes_now_never_overtakes_a_queued_one() {
    use crate::wire::{METADATA, METADATA_CACHED, METADATA_STORE};
    let clock = Clock(Instant::now());
    let mut s = client(4, 2);
    let a = s.start_call(7, None, 0).unwrap();
    assert!(
        s.start_call_now(8, None, 0, None, || panic!("nothing starts")).is_none(),
        "a call is queued before it"
    );
    assert_eq!(s.calls().state(a.0), SlotState::Queued);
    assert_eq!(s.next_request(|| clock.at(0)).map(|h| h.slot), Some(a.0));
    let flags = METADATA | METADATA_STORE;
    let h = s.start_call_now(9, Some(clock.at(30)), flags, Some(b"k1v1"), || clock.at(10)).unwrap();
    assert_eq!((h.method, h.timeout_us, h.metadata, h.metadata_cache), (9, 20_000, true, METADATA_STORE));
    assert_ne!(h.slot, a.0);
    assert_eq!(s.calls().state(h.slot), SlotState::InFlight);
    assert_eq!(s.calls().in_flight(), 2);
    assert_eq!(s.metadata_cache_flag(b"k1v1", 4), METADATA_CACHED, "its block is kept");
    assert!(s.start_call_now(10, None, 0, None, || clock.at(10)).is_none(), "no credit free");
    assert_eq!(s.calls().in_flight(), 2);
    assert_eq!(s.on_response(h.slot, h.generation), Ok(ResponseFate::Stored));
    assert!(s.take_done(h.slot, h.generation));
    assert!(s.start_call_now(10, None, 0, None, || clock.at(10)).is_some(), "a credit came back");
}

/// A Cancel goes at once for a call on the wire, only after the last piece for one still
/// leaving, never for one not sent (its slot is free at once).
#[test]
fn a_cancel_never_overtakes_its_request() {
    let clock = Clock(Instant::now());
    let mut s = client(4, 4);
    let a = s.start_call(1, None, 0).unwrap();
    let b = s.start_call(1, None, 0).unwrap();
    s.next_request(|| clock.at(0)).unwrap();
    s.next_request(|| clock.at(0)).unwrap();
    let c = s.start_call(1, None, 0).unwrap();
    assert_eq!(s.abandon_call(c.0, c.1, false, || clock.at(0)), Abandoned::Unsent);
    assert_eq!(s.calls().state(c.0), SlotState::Free);
    assert!(!s.has_control(), "nothing was sent: no Cancel");
    assert_eq!(s.abandon_call(a.0, a.1, false, || clock.at(0)), Abandoned::OnWire);
    assert_eq!(s.next_control(), Some(Header { slot: a.0, generation: a.1, ..Header::new(Kind::Cancel) }));
    assert_eq!(s.abandon_call(b.0, b.1, true, || clock.at(0)), Abandoned::OnWire);
    assert!(!s.has_control(), "its request is still leaving in pieces");
    s.request_left(a.0, a.1 + 1);
    assert!(!s.has_control(), "another generation: not this call");
    s.request_left(b.0, b.1);
    assert_eq!(s.next_control(), Some(Header { slot: b.0, generation: b.1, ..Header::new(Kind::Cancel) }));
    assert_eq!(s.on_response(a.0, a.1), Ok(ResponseFate::Discard(())), "its answer");
    assert_eq!(s.calls().state(a.0), SlotState::Abandoned, "its Cancel is not acknowledged yet");
    s.handle_header(&ack(a), || clock.at(0)).unwrap();
    assert_eq!(s.calls().state(a.0), SlotState::Free);
}

fn ack(c: (u16, u32)) -> Header {
    Header { session: 5, slot: c.0, generation: c.1, ..Header::new(Kind::CancelAck) }
}

fn response(c: (u16, u32)) -> Header {
    Header { session: 5, slot: c.0, generation: c.1, ..Header::new(Kind::Response) }
}

/// A Cancel holds its call's credit until the server acknowledged it, in whichever order the
/// answer and the acknowledgement arrive: a Cancel that crossed its call's answer never lets
/// the credit carry another request (and its Cancel) to the server while it still travels.
#[test]
fn a_cancel_holds_its_credit_until_acknowledged() {
    let clock = Clock(Instant::now());
    let mut s = client(4, 2);
    let a = s.start_call(1, None, 0).unwrap();
    let b = s.start_call(1, None, 0).unwrap();
    s.next_request(|| clock.at(0)).unwrap();
    s.next_request(|| clock.at(0)).unwrap();
    assert_eq!(s.abandon_call(a.0, a.1, false, || clock.at(0)), Abandoned::OnWire);
    assert_eq!(s.abandon_call(b.0, b.1, false, || clock.at(0)), Abandoned::OnWire);
    assert_eq!(s.next_control().map(|h| h.kind), Some(Kind::Cancel));
    assert_eq!(s.next_control().map(|h| h.kind), Some(Kind::Cancel));
    let c = s.start_call(1, None, 0).unwrap();
    // a: its answer crossed the Cancel (answer first, acknowledgement later).
    s.handle_header(&response(a), || clock.at(0)).unwrap();
    assert_eq!(s.on_response(a.0, a.1), Ok(ResponseFate::Discard(())));
    assert!(s.next_request(|| clock.at(0)).is_none(), "the credit waits for the acknowledgement");
    assert_eq!(s.calls().in_flight(), 2);
    // b: acknowledged first, answered CANCELLED after.
    s.handle_header(&ack(b), || clock.at(0)).unwrap();
    assert!(s.next_request(|| clock.at(0)).is_none(), "and for the answer");
    assert!(s.handle_header(&ack(b), || clock.at(0)).is_err(), "one acknowledgement per Cancel");
    let mut s2 = client(4, 2);
    let x = s2.start_call(1, None, 0).unwrap();
    s2.next_request(|| clock.at(0)).unwrap();
    assert!(s2.handle_header(&ack(x), || clock.at(0)).is_err(), "no Cancel was sent");
    s.handle_header(&response(b), || clock.at(0)).unwrap();
    assert_eq!(s.on_response(b.0, b.1), Ok(ResponseFate::Discard(())));
    assert_eq!(s.calls().state(b.0), SlotState::Free);
    assert_eq!(s.next_request(|| clock.at(0)).map(|h| h.slot), Some(c.0), "b's credit is back");
    assert!(s.next_request(|| clock.at(0)).is_none());
    s.handle_header(&ack(a), || clock.at(0)).unwrap();
    assert_eq!(s.calls().state(a.0), SlotState::Free);
    assert_eq!(s.calls().in_flight(), 1);
    assert_eq!(s.calls().abandoned(), 0);
}

/// An abandoned call answered while its Cancel still waited to be posted sends no Cancel and
/// frees its slot and credit at once (no acknowledgement will come).
#[test]
fn a_cancel_not_yet_posted_is_withdrawn_by_the_answer() {
    let clock = Clock(Instant::now());
    let mut s = client(2, 1);
    let a = s.start_call(1, None, 0).unwrap();
    s.next_request(|| clock.at(0)).unwrap();
    assert_eq!(s.abandon_call(a.0, a.1, false, || clock.at(0)), Abandoned::OnWire);
    assert!(s.has_control());
    assert_eq!(s.on_response(a.0, a.1), Ok(ResponseFate::Discard(())));
    assert!(!s.has_control(), "the Cancel is withdrawn");
    assert_eq!(s.calls().state(a.0), SlotState::Free);
    assert_eq!(s.calls().in_flight(), 0);
    assert!(s.handle_header(&ack(a), || clock.at(0)).is_err(), "no acknowledgement is owed");
}

/// Reaching the abandon cap never waits: it starts a watch, which one acknowledgement ends;
/// without one within the acknowledgement timeout it becomes `Unacknowledged` (once).
#[test]
fn the_abandon_cap_resets_the_session_only_without_an_acknowledgement() {
    let clock = Clock(Instant::now());
    let mut s = client(4, 4);
    s.set_abandon_cap(2, Duration::from_millis(100));
    let calls: Vec<_> = (0..3).map(|_| s.start_call(1, None, 0).unwrap()).collect();
    for _ in 0..3 {
        s.next_request(|| clock.at(0)).unwrap();
    }
    s.abandon_call(calls[0].0, calls[0].1, false, || panic!("below the cap: no clock"));
    assert_eq!(s.poll_timeout(false), None, "below the cap: nothing timed");
    s.abandon_call(calls[1].0, calls[1].1, false, || clock.at(10));
    assert_eq!(s.poll_timeout(false), Some(clock.at(110)));
    s.abandon_call(calls[2].0, calls[2].1, false, || panic!("the watch runs already"));
    s.handle_timeout(clock.at(109), false);
    assert_eq!(s.poll_event(), None);
    s.handle_timeout(clock.at(110), false);
    assert_eq!(
        s.poll_event(),
        Some(Event::Unacknowledged { abandoned: 3, waited: Duration::from_millis(100) })
    );
    s.handle_timeout(clock.at(500), false);
    assert_eq!(s.poll_event(), None, "reported once");

    // An acknowledgement within the timeout ends the watch.
    let mut s = client(4, 4);
    s.set_abandon_cap(2, Duration::from_millis(100));
    let calls: Vec<_> = (0..2).map(|_| s.start_call(1, None, 0).unwrap()).collect();
    for c in &calls {
        s.next_request(|| clock.at(0)).unwrap();
        s.abandon_call(c.0, c.1, false, || clock.at(0));
    }
    assert_eq!(s.poll_timeout(false), Some(clock.at(100)));
    assert_eq!(s.on_response(calls[0].0, calls[0].1), Ok(ResponseFate::Discard(())));
    s.handle_timeout(clock.at(1000), false);
    assert_eq!(s.poll_event(), None, "acknowledged in time");
    assert_eq!(s.poll_timeout(false), None);
}

/// A server that grants fewer credits than the window: the cap counts the credits (a cap of the
/// window would never be reached, since only calls on the wire are abandoned on it). Sabotaged:
/// clamped to the window alone, `max_abandoned` stayed 8 and no watch started (`None`).
#[test]
fn the_abandon_cap_counts_the_credits_the_server_granted() {
    let clock = Clock(Instant::now());
    for mut s in [client(8, 2), {
        let mut s = client(8, 2);
        s.set_abandon_cap(8, Duration::from_millis(100));
        s
    }] {
        assert_eq!(s.max_abandoned(), 2);
        let calls: Vec<_> = (0..4).map(|_| s.start_call(1, None, 0).unwrap()).collect();
        while s.next_request(|| clock.at(0)).is_some() {}
        assert_eq!(s.calls().in_flight(), 2, "two credits");
        for c in &calls[..2] {
            s.abandon_call(c.0, c.1, false, || clock.at(10));
        }
        assert!(s.poll_timeout(false).is_some(), "the watch started at two abandoned calls");
    }
}

/// Delivers a ring body of `len` bytes at `offset` for `(slot, generation)` of `kind` and copies
/// it out as a driver does (freeing its ring space).
fn ring_body(s: &mut Session, kind: Kind, slot: u16, generation: u32, offset: u32, len: u32) {
    let h = Header {
        session: 5,
        method: 1,
        slot,
        generation,
        body_len: len,
        total_len: len,
        in_ring: true,
        ring_offset: offset,
        ..Header::new(kind)
    };
    let inc = s.handle_header(&h, Instant::now).unwrap();
    let piece = inc.ring.expect("a ring body");
    s.piece_buffer(&piece).extend(std::iter::repeat_n(0u8, len as usize));
    s.piece_done(piece).unwrap().expect("whole");
}

/// Freed ring space is worth a RingReturn only while the peer can need it: a client's server
/// answers only calls in flight (with none, the next request carries the head); a server's
/// client may call at any time. Asked once per freeing; nothing freed, nothing to send.
#[test]
fn a_ring_return_goes_only_when_the_peer_may_send() {
    let mut c = client(4, 4);
    assert!(!c.ring_freed() && !c.take_ring_return());
    let a = c.start_call(1, None, 0).unwrap();
    let b = c.start_call(1, None, 0).unwrap();
    c.next_request(Instant::now).unwrap();
    c.next_request(Instant::now).unwrap();
    ring_body(&mut c, Kind::Response, a.0, a.1, 0, 100);
    assert_eq!(c.on_response(a.0, a.1), Ok(ResponseFate::Stored));
    assert!(c.ring_freed());
    assert!(c.take_ring_return(), "call b is in flight: its answer may need the space");
    assert!(!c.take_ring_return(), "once per freeing");
    ring_body(&mut c, Kind::Response, b.0, b.1, 100, 100);
    assert_eq!(c.on_response(b.0, b.1), Ok(ResponseFate::Stored));
    assert!(c.ring_freed());
    assert!(!c.take_ring_return(), "nothing in flight: the next request carries the head");
    assert!(!c.ring_freed());

    let mut s = Session::new(Role::Server, SessionParams { max_held: 4, ..*c.params() });
    ring_body(&mut s, Kind::Request, 0, 1, 0, 100);
    assert!(s.take_ring_return(), "a client may start a call at any time");
    let mut h = Header::new(Kind::Response);
    s.stamp(&mut h);
    assert!(!s.take_ring_return(), "nothing freed since");
}

/// The session's cached metadata block (protocol 11), client side: a block is stored by an eager
/// request and named by the requests after it once that request left; while a store waits to
/// leave, blocks travel in full; a store abandoned before it left leaves the block before it
/// kept; a block too large for the eager threshold, or over the cap, travels in full.
#[test]
fn a_metadata_block_is_named_only_once_the_request_that_stored_it_left() {
    use crate::wire::{METADATA, METADATA_CACHED, METADATA_STORE};
    let clock = Clock(Instant::now());
    let mut s = client(8, 1);
    let (a, b) = (&b"aaa"[..], &b"bbb"[..]);
    let start = |s: &mut Session, entries: &[u8]| {
        let flag = s.metadata_cache_flag(entries, 4);
        let call =
            s.start_call(1, None, if flag == METADATA_CACHED { flag } else { METADATA | flag }).unwrap();
        if flag == METADATA_STORE {
            s.store_block(call.0, call.1, entries);
        }
        (call, flag)
    };
    // Nothing kept: the first request stores its block.
    let (c1, f) = start(&mut s, a);
    assert_eq!(f, METADATA_STORE);
    // It has not left (one credit, free now; it leaves with `next_request`): the next travels in full.
    assert_eq!(s.metadata_cache_flag(a, 4), 0, "a store waits to leave");
    let h = s.next_request(|| clock.at(0)).unwrap();
    assert_eq!((h.slot, h.metadata, h.metadata_cache), (c1.0, true, METADATA_STORE));
    // It left: the same block is named, another one stored.
    assert_eq!(s.metadata_cache_flag(a, 4), METADATA_CACHED);
    assert_eq!(s.metadata_cache_flag(b, 4), METADATA_STORE);
    // Too large for the eager threshold (16): in full, nothing changes.
    assert_eq!(s.metadata_cache_flag(b, 8), 0, "4 + 6 + 3 + 8 bytes is over the eager threshold");
    assert_eq!(s.metadata_cache_flag(a, 17), 0, "the message alone is over it");
    // A request naming the block queues behind the credit; it goes out as it started.
    let (c2, f) = start(&mut s, a);
    assert_eq!(f, METADATA_CACHED);
    // A store of `b` queues behind it, and is abandoned before it leaves.
    let (c3, f) = start(&mut s, b);
    assert_eq!(f, METADATA_STORE);
    assert_eq!(s.metadata_cache_flag(a, 4), 0, "the store of b waits to leave");
    assert_eq!(s.abandon_call(c3.0, c3.1, false, || clock.at(0)), Abandoned::Unsent);
    assert_eq!(s.metadata_cache_flag(a, 4), METADATA_CACHED, "b never reaches the server: a is kept");
    assert_eq!(s.metadata_cache_flag(b, 4), METADATA_STORE);
    assert_eq!(s.on_response(c1.0, c1.1), Ok(ResponseFate::Stored));
    let h = s.next_request(|| clock.at(0)).unwrap();
    assert_eq!((h.slot, h.metadata, h.metadata_cache), (c2.0, false, METADATA_CACHED));
    // A store that leaves replaces the block.
    let (c4, _) = start(&mut s, b);
    assert_eq!(s.on_response(c2.0, c2.1), Ok(ResponseFate::Stored));
    let h = s.next_request(|| clock.at(0)).unwrap();
    assert_eq!((h.slot, h.metadata_cache), (c4.0, METADATA_STORE));
    assert_eq!(s.metadata_cache_flag(b, 4), METADATA_CACHED);
    assert_eq!(s.metadata_cache_flag(a, 4), METADATA_STORE);
    // Over the cap: in full.
    let big = vec![b'x'; crate::wire::MAX_CACHED_BLOCK];
    let mut wide = client(8, 1);
    wide.params.eager_threshold = 4096;
    assert_eq!(wide.metadata_cache_flag(&big, 4), 0, "a block over MAX_CACHED_BLOCK is not stored");
    assert_eq!(wide.metadata_cache_flag(&big[..100], 4), METADATA_STORE);
    // A broken session forgets it.
    assert_eq!(s.fail_calls(), 1);
    assert_eq!(s.metadata_cache_flag(b, 4), METADATA_STORE);
}
