//! Deterministic pair harness (as quinn's `tests/util.rs`): a client and a server session joined
//! by an in-memory wire that carries headers and models each ring's bytes, so every placement is
//! checked against unread data.

use super::*;
use crate::status::Code;
use proptest::prelude::*;
use std::collections::VecDeque;

type Ring = Vec<Option<u32>>;

struct Done {
    id: u32,
    len: u32,
}

struct Pair {
    client: Session,
    server: Session,
    slots: CallSlots<Done>,
    /// Calls waiting for a credit, with the bytes still to send when they go in pieces.
    pending_client: VecDeque<(Header, Option<u32>)>,
    /// Responses the server sends in pieces: header and bytes still to send.
    server_streams: VecDeque<(Header, u32)>,
    to_server: VecDeque<Header>,
    to_client: VecDeque<Header>,
    /// Ring marks of the client's (server's) WRITEs in flight, oldest first: a WRITE completes
    /// when the SEND after it is delivered, and only then is its range ours to reuse.
    client_writes: VecDeque<u32>,
    server_writes: VecDeque<u32>,
    server_ring: Ring,
    client_ring: Ring,
    server_held: VecDeque<Header>,
    pieces_sent: usize,
    calls: Vec<(u16, u32)>,
    next_id: u32,
}

fn params(credits: u16, eager: u32, ring: u32) -> SessionParams {
    SessionParams {
        id: 5,
        credits,
        eager_threshold: eager,
        max_message: 1 << 20,
        peer_ring_len: ring,
        own_ring_len: ring,
        max_held: credits as usize * 2,
    }
}

fn mark(ring: &mut Ring, off: u32, len: u32, id: u32) -> Result<(), TestCaseError> {
    for b in &mut ring[off as usize..(off + len) as usize] {
        prop_assert_eq!(*b, None, "placement over unread ring bytes");
        *b = Some(id);
    }
    Ok(())
}

fn unmark(ring: &mut Ring, off: u32, len: u32, id: u32) -> Result<(), TestCaseError> {
    for b in &mut ring[off as usize..(off + len) as usize] {
        prop_assert_eq!(*b, Some(id), "ring bytes changed under the reader");
        *b = None;
    }
    Ok(())
}

impl Pair {
    fn new(credits: u16, eager: u32, ring: u32) -> Pair {
        Pair {
            client: Session::new(Role::Client, params(credits, eager, ring)),
            server: Session::new(Role::Server, params(credits, eager, ring)),
            slots: CallSlots::new(credits * 2, credits),
            pending_client: VecDeque::new(),
            server_streams: VecDeque::new(),
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            client_writes: VecDeque::new(),
            server_writes: VecDeque::new(),
            server_ring: vec![None; ring as usize],
            client_ring: vec![None; ring as usize],
            server_held: VecDeque::new(),
            pieces_sent: 0,
            calls: Vec::new(),
            next_id: 1,
        }
    }

    fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    fn call(&mut self, len: u32) -> Result<(), TestCaseError> {
        if !self.slots.has_free() {
            return Ok(());
        }
        let id = self.id();
        let mut h = Header { method: id, body_len: len, total_len: len, ..Header::new(Kind::Request) };
        // As the runtime does: a ring reservation is queued at once, so only a call that is
        // sent now (a credit free, nothing waiting) may place its body in the ring directly.
        let now = self.pending_client.is_empty() && self.slots.in_flight() < self.slots.credits();
        let mut pieces = None;
        let eager = len <= self.client.params().eager_threshold;
        if !eager && !now && len <= self.client.params().max_message {
            pieces = Some(len);
        } else {
            match self.client.place_body(len as usize) {
                Ok(Placement::Eager) => {}
                Ok(Placement::Ring(off)) => {
                    h.in_ring = true;
                    h.ring_offset = off;
                    mark(&mut self.server_ring, off, len, id)?;
                    self.client_writes.push_back(self.client.ring_write_mark());
                }
                Ok(Placement::Pieces) => pieces = Some(len),
                Err(PlaceError::Refused(s)) => {
                    prop_assert_eq!(s.code(), Code::ResourceExhausted);
                    return Ok(());
                }
            }
        }
        let (slot, generation) = self.slots.start().unwrap();
        h.slot = slot;
        h.generation = generation;
        self.calls.push((slot, generation));
        self.pending_client.push_back((h, pieces));
        self.pump()
    }

    /// Sends calls while credits allow; a call in pieces sends what the server's ring has room
    /// for and keeps the rest (and every call behind it) waiting.
    fn pump(&mut self) -> Result<(), TestCaseError> {
        while let Some(&(h, pieces)) = self.pending_client.front() {
            let Some(mut remaining) = pieces else {
                let Some((slot, generation)) = self.slots.next_sendable() else { break };
                let (mut h, _) = self.pending_client.pop_front().unwrap();
                assert_eq!((h.slot, h.generation), (slot, generation), "sent in start order");
                self.client.stamp(&mut h);
                self.to_server.push_back(h);
                continue;
            };
            if remaining == h.total_len {
                // The first piece takes the credit.
                if self.slots.in_flight() >= self.slots.credits() {
                    break;
                }
            }
            while remaining > 0 {
                let Some((off, n)) = self.client.next_piece(remaining) else { break };
                if remaining == h.total_len {
                    let (slot, generation) = self.slots.next_sendable().unwrap();
                    assert_eq!((h.slot, h.generation), (slot, generation));
                }
                mark(&mut self.server_ring, off, n, h.method)?;
                self.client_writes.push_back(self.client.ring_write_mark());
                let mut p = Header { in_ring: true, ring_offset: off, body_len: n, ..h };
                self.client.stamp(&mut p);
                self.to_server.push_back(p);
                self.pieces_sent += 1;
                remaining -= n;
                self.pending_client[0].1 = Some(remaining);
            }
            if remaining > 0 {
                break;
            }
            self.pending_client.pop_front();
        }
        Ok(())
    }

    /// Copies a ring body out as the runtime does (checking it is still the sender's), then
    /// completes it. Returns the complete message's header, if any.
    fn take_ring(
        session: &mut Session,
        ring: &mut Ring,
        inc: Incoming,
    ) -> Result<Option<Header>, TestCaseError> {
        let Some(piece) = inc.ring else { return Ok(Some(inc.header)) };
        unmark(ring, piece.offset, piece.len, inc.header.method)?;
        let n = piece.len as usize;
        session.piece_buffer(&piece).extend(std::iter::repeat_n(0u8, n));
        let done = session.piece_done(piece).map_err(TestCaseError::fail)?;
        Ok(done.map(|c| {
            assert_eq!(c.body.len() as u32, c.header.total_len);
            c.header
        }))
    }

    fn server_deliver(&mut self) -> Result<(), TestCaseError> {
        let Some(h) = self.to_server.pop_front() else { return Ok(()) };
        if h.in_ring {
            let mark = self.client_writes.pop_front().expect("a WRITE per ring header");
            self.client.on_ring_written(mark);
        }
        let inc = self.server.handle_header(&h, std::time::Instant::now).map_err(TestCaseError::fail)?;
        if let Some(h) = Self::take_ring(&mut self.server, &mut self.server_ring, inc)? {
            if h.kind == Kind::Request {
                self.server_held.push_back(h);
            }
        }
        Ok(())
    }

    fn server_answer(&mut self, len: u32) -> Result<(), TestCaseError> {
        self.server_pump()?;
        let Some(&req) = self.server_held.front() else { return Ok(()) };
        let id = self.id();
        let mut h = Header {
            slot: req.slot,
            generation: req.generation,
            method: id,
            body_len: len,
            total_len: len,
            ..Header::new(Kind::Response)
        };
        let mut pieces = false;
        // As the worker does: behind answers still waiting, a body is not placed (it waits on
        // the heap, in order).
        let behind = !self.server_streams.is_empty()
            && len > self.server.params().eager_threshold
            && len <= self.server.params().max_message;
        match if behind { Ok(Placement::Pieces) } else { self.server.place_body(len as usize) } {
            Ok(Placement::Eager) => {}
            Ok(Placement::Ring(off)) => {
                h.in_ring = true;
                h.ring_offset = off;
                mark(&mut self.client_ring, off, len, id)?;
                self.server_writes.push_back(self.server.ring_write_mark());
            }
            Ok(Placement::Pieces) => pieces = true,
            Err(PlaceError::Refused(_)) => {
                h.status = Code::ResourceExhausted;
                h.body_len = 0;
                h.total_len = 0;
            }
        }
        self.server_held.pop_front();
        assert!(self.server.on_answer_for(req.slot, req.generation));
        if pieces {
            self.server_streams.push_back((h, len));
            return self.server_pump();
        }
        self.server.stamp(&mut h);
        self.to_client.push_back(h);
        Ok(())
    }

    fn server_pump(&mut self) -> Result<(), TestCaseError> {
        while let Some(&(h, mut remaining)) = self.server_streams.front() {
            while remaining > 0 {
                let Some((off, n)) = self.server.next_piece(remaining) else { return Ok(()) };
                mark(&mut self.client_ring, off, n, h.method)?;
                self.server_writes.push_back(self.server.ring_write_mark());
                let mut p = Header { in_ring: true, ring_offset: off, body_len: n, ..h };
                self.server.stamp(&mut p);
                self.to_client.push_back(p);
                self.pieces_sent += 1;
                remaining -= n;
                self.server_streams[0].1 = remaining;
            }
            self.server_streams.pop_front();
        }
        Ok(())
    }

    fn client_deliver(&mut self) -> Result<(), TestCaseError> {
        let Some(h) = self.to_client.pop_front() else { return Ok(()) };
        if h.in_ring {
            let mark = self.server_writes.pop_front().expect("a WRITE per ring header");
            self.server.on_ring_written(mark);
        }
        let inc = self.client.handle_header(&h, std::time::Instant::now).map_err(TestCaseError::fail)?;
        if let Some(h) = Self::take_ring(&mut self.client, &mut self.client_ring, inc)? {
            if h.kind == Kind::Response {
                let fate =
                    self.slots.on_response(h.slot, h.generation, Done { id: h.method, len: h.body_len });
                prop_assert!(matches!(fate, Ok(ResponseFate::Stored)));
            }
        }
        self.pump()
    }

    fn client_take(&mut self, pick: usize) -> Result<(), TestCaseError> {
        if self.calls.is_empty() {
            return Ok(());
        }
        let k = pick % self.calls.len();
        let (slot, generation) = self.calls[k];
        if let Some(done) = self.slots.take_done(slot, generation) {
            self.calls.swap_remove(k);
            prop_assert!(done.id != 0 && done.len <= 1 << 20);
        }
        Ok(())
    }

    fn ring_returns(&mut self) {
        if self.client.unreported_ring_bytes() > 0 {
            let mut h = Header::new(Kind::RingReturn);
            self.client.stamp(&mut h);
            self.to_server.push_back(h);
        }
        if self.server.unreported_ring_bytes() > 0 {
            let mut h = Header::new(Kind::RingReturn);
            self.server.stamp(&mut h);
            self.to_client.push_back(h);
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Call(u32),
    ServerDeliver,
    ServerAnswer(u32),
    ClientDeliver,
    ClientTake(u8),
    RingReturns,
}

fn op(max_len: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..max_len).prop_map(Op::Call),
        Just(Op::ServerDeliver),
        (0..max_len).prop_map(Op::ServerAnswer),
        Just(Op::ClientDeliver),
        any::<u8>().prop_map(Op::ClientTake),
        Just(Op::RingReturns),
    ]
}

proptest! {
    /// Random interleavings of calls, deliveries, answers, takes and credit returns: no ring
    /// placement ever overlaps unread bytes, every header is accepted, every response reaches its
    /// own slot, and once everything drains both rings are empty.
    #[test]
    fn session_pair_operation_sequences(
        credits in 1u16..6, eager in 0u32..64, ring in 64u32..512,
        ops in proptest::collection::vec(op(600), 1..400),
    ) {
        let mut p = Pair::new(credits, eager, ring);
        for o in ops {
            match o {
                Op::Call(n) => p.call(n)?,
                Op::ServerDeliver => p.server_deliver()?,
                Op::ServerAnswer(n) => p.server_answer(n)?,
                Op::ClientDeliver => p.client_deliver()?,
                Op::ClientTake(k) => p.client_take(k as usize)?,
                Op::RingReturns => p.ring_returns(),
            }
            prop_assert!(p.slots.in_flight() <= credits);
            prop_assert!(p.server.unanswered() <= credits);
        }
        // Drain: deliver everything, answering with empty bodies.
        for _ in 0..10_000 {
            if p.to_server.is_empty() && p.to_client.is_empty() && p.server_held.is_empty()
                && p.calls.is_empty() && p.pending_client.is_empty() && p.server_streams.is_empty() {
                break;
            }
            p.server_deliver()?;
            p.server_answer(0)?;
            p.client_deliver()?;
            p.client_take(0)?;
            p.ring_returns();
            p.pump()?;
            p.server_pump()?;
        }
        prop_assert!(p.calls.is_empty(), "every call completed");
        prop_assert!(p.server_streams.is_empty() && p.pending_client.is_empty());
        prop_assert!(p.server_ring.iter().all(Option::is_none));
        prop_assert!(p.client_ring.iter().all(Option::is_none));
    }
}

#[test]
fn refuses_only_what_exceeds_the_message_limit_naming_it() {
    let mut s = Session::new(Role::Client, params(4, 16, 100));
    assert_eq!(s.place_body(16), Ok(Placement::Eager));
    assert_eq!(s.place_body(100), Ok(Placement::Ring(0)));
    assert_eq!(s.place_body(101), Ok(Placement::Pieces), "larger than the ring: in pieces");
    assert_eq!(s.place_body(17), Ok(Placement::Pieces), "the ring is full: in pieces");
    assert_eq!(s.place_body(1 << 20), Ok(Placement::Pieces));
    match s.place_body((1 << 20) + 1) {
        Err(PlaceError::Refused(st)) => {
            assert_eq!(st.code(), Code::ResourceExhausted);
            assert_eq!(st.message(), "message of 1048577 bytes exceeds max_message_size of 1048576 bytes");
        }
        other => panic!("{other:?}"),
    }
}

/// Bodies at the edges of the ring, in both directions, many in flight: every one arrives
/// complete, in pieces when it must, and the rings drain.
#[test]
fn bodies_at_the_ring_edges_travel_in_pieces_both_ways() {
    let ring = 256;
    for len in [ring - 1, ring, ring + 1, 3 * ring + 7, 0, 17, 64 * ring] {
        let mut p = Pair::new(4, 16, ring);
        let mut started = 0;
        for _ in 0..6 {
            p.call(len).unwrap();
            started += 1;
        }
        for _ in 0..100_000 {
            if p.calls.is_empty() {
                break;
            }
            p.server_deliver().unwrap();
            p.server_answer(len).unwrap();
            p.client_deliver().unwrap();
            p.client_take(0).unwrap();
            p.ring_returns();
            p.pump().unwrap();
            p.server_pump().unwrap();
            if started < 40 && p.calls.len() < 6 && p.slots.has_free() {
                p.call(len).unwrap();
                started += 1;
            }
        }
        assert!(
            p.calls.is_empty(),
            "len {len}: every call completed; pending {} streams {} held {} to_server {} to_client {} in_flight {} client used {} server used {} asm {} {}",
            p.pending_client.len(),
            p.server_streams.len(),
            p.server_held.len(),
            p.to_server.len(),
            p.to_client.len(),
            p.slots.in_flight(),
            p.client.producer.used(),
            p.server.producer.used(),
            p.client.assemblies(),
            p.server.assemblies(),
        );
        assert!(p.server_ring.iter().all(Option::is_none) && p.client_ring.iter().all(Option::is_none));
        if len > ring {
            assert!(p.pieces_sent >= 2 * (len / (ring / 4)) as usize, "len {len}: {} pieces", p.pieces_sent);
        }
    }
}

#[test]
fn pieces_must_continue_their_message() {
    let mut s = Session::new(Role::Server, params(2, 16, 100));
    let first = Header {
        method: 1,
        session: 5,
        slot: 0,
        generation: 3,
        in_ring: true,
        body_len: 25,
        total_len: 60,
        ..Header::new(Kind::Request)
    };
    let inc = s.handle_header(&first, std::time::Instant::now).unwrap();
    let piece = inc.ring.unwrap();
    s.piece_buffer(&piece).extend([0u8; 25]);
    assert_eq!(s.piece_done(piece), Ok(None));
    assert_eq!(s.unanswered(), 1, "the first piece takes the credit");
    let other_gen = Header { generation: 4, ring_offset: 25, ..first };
    assert_eq!(
        s.handle_header(&other_gen, std::time::Instant::now).unwrap_err(),
        "ring piece does not continue its message"
    );
    let mut s2 = Session::new(Role::Server, params(2, 16, 100));
    let inc = s2.handle_header(&first, std::time::Instant::now).unwrap();
    let piece = inc.ring.unwrap();
    s2.piece_buffer(&piece).extend([0u8; 25]);
    s2.piece_done(piece).unwrap();
    let over = Header { ring_offset: 25, body_len: 36, ..first };
    assert_eq!(
        s2.handle_header(&over, std::time::Instant::now).unwrap_err(),
        "ring pieces exceed their message's total_len"
    );
    let last = Header { ring_offset: 25, body_len: 35, ..first };
    let piece = s2.handle_header(&last, std::time::Instant::now).unwrap().ring.unwrap();
    s2.piece_buffer(&piece).extend([1u8; 35]);
    let done = s2.piece_done(piece).unwrap().unwrap();
    assert_eq!(done.body.len(), 60);
    assert_eq!(done.header.body_len, 60);
    assert_eq!(s2.unanswered(), 1, "later pieces take no credit");
    let huge = Header { total_len: (1 << 20) + 1, slot: 1, ..first };
    assert_eq!(
        s2.handle_header(&huge, std::time::Instant::now).unwrap_err(),
        "body larger than max_message_size"
    );
}

#[test]
fn protocol_violations_are_reported() {
    let mut s = Session::new(Role::Server, params(1, 16, 100));
    let req = Header { method: 1, session: 5, ..Header::new(Kind::Request) };
    assert!(s.handle_header(&Header { session: 6, ..req }, std::time::Instant::now).is_err());
    s.handle_header(&req, std::time::Instant::now).unwrap();
    assert_eq!(
        s.handle_header(&req, std::time::Instant::now).unwrap_err(),
        "request beyond the granted credits"
    );
    let mut s = Session::new(Role::Server, params(2, 16, 100));
    let ring = Header { in_ring: true, ring_offset: 50, body_len: 60, total_len: 60, ..req };
    assert!(s.handle_header(&ring, std::time::Instant::now).is_err());
    let small = Header { in_ring: true, ring_offset: 0, body_len: 10, total_len: 10, ..req };
    assert!(s.handle_header(&small, std::time::Instant::now).is_err());
    assert!(s.handle_header(&Header { freed_head: 7, ..req }, std::time::Instant::now).is_err());
}

/// A fake clock: a base instant plus a chosen offset, never read from the system while a test
/// runs.
struct Clock(std::time::Instant);

impl Clock {
    fn at(&self, ms: u64) -> std::time::Instant {
        self.0 + std::time::Duration::from_millis(ms)
    }
}

fn request(slot: u16, generation: u32, timeout_us: u32) -> Header {
    Header { method: 1, session: 5, slot, generation, timeout_us, ..Header::new(Kind::Request) }
}

/// A Cancel for an unanswered call ends it once (an event, the call no longer live); a Cancel
/// for a call answered already, a second Cancel, or one for an unknown call changes nothing; a
/// client refuses a Cancel.
#[test]
fn cancel_ends_an_unanswered_call_once() {
    let clock = Clock(std::time::Instant::now());
    let mut s = Session::new(Role::Server, params(2, 16, 100));
    s.handle_header(&request(0, 1, 0), || clock.at(0)).unwrap();
    s.handle_header(&request(1, 1, 0), || clock.at(0)).unwrap();
    assert!(s.live_call(0, 1).is_some());
    let cancel = Header { session: 5, slot: 0, generation: 1, ..Header::new(Kind::Cancel) };
    let ack = |slot, generation| Some(Header { slot, generation, ..Header::new(Kind::CancelAck) });
    s.handle_header(&cancel, || clock.at(1)).unwrap();
    assert_eq!(s.poll_event(), Some(Event::Cancelled { slot: 0, generation: 1 }));
    assert_eq!(s.next_control(), ack(0, 1), "every Cancel is acknowledged");
    assert_eq!(s.live_call(0, 1), None, "dropped undispatched");
    assert!(s.is_unanswered(0, 1), "still owed its CANCELLED answer (which returns the credit)");
    s.handle_header(&cancel, || clock.at(2)).unwrap();
    assert_eq!(s.poll_event(), None, "a second cancel changes nothing");
    assert_eq!(s.next_control(), ack(0, 1));
    assert!(s.on_answer_for(1, 1));
    s.handle_header(&Header { slot: 1, ..cancel }, || clock.at(2)).unwrap();
    s.handle_header(&Header { slot: 1, generation: 9, ..cancel }, || clock.at(2)).unwrap();
    assert_eq!(s.poll_event(), None, "answered or unknown calls: nothing to end");
    assert_eq!(s.next_control(), ack(1, 1), "a Cancel that crossed its answer is acknowledged too");
    assert_eq!(s.next_control(), ack(1, 9));
    assert_eq!(s.next_control(), None);
    assert!(s.on_answer_for(0, 1));
    assert_eq!(s.unanswered(), 0);
    // A client keeps a credit per unacknowledged Cancel: more than `credits` waiting is a
    // broken client (and would grow the queue of acknowledgements without bound).
    s.handle_header(&cancel, || clock.at(3)).unwrap();
    s.handle_header(&cancel, || clock.at(3)).unwrap();
    assert_eq!(
        s.handle_header(&cancel, || clock.at(3)).unwrap_err(),
        "more Cancels unacknowledged than credits"
    );
    let mut c = Session::new(Role::Client, params(2, 16, 100));
    assert_eq!(c.handle_header(&cancel, || clock.at(0)).unwrap_err(), "cancel sent to a client");
    let a = c.start_call(1, None, 0).unwrap();
    c.next_request(|| clock.at(0)).unwrap();
    c.cancel(a.0, a.1);
    assert!(!c.has_control(), "a call not abandoned is not cancelled");
    c.abandon_call(a.0, a.1, false, || clock.at(0));
    assert!(c.has_control());
    assert_eq!(c.next_control(), Some(Header { slot: a.0, generation: a.1, ..Header::new(Kind::Cancel) }));
    assert!(!c.has_control());
    assert_eq!(
        s.handle_header(&Header { session: 5, ..Header::new(Kind::CancelAck) }, || clock.at(0)).unwrap_err(),
        "cancel acknowledgement sent to a server"
    );
}

/// A request's deadline runs from its arrival (its `timeout_us`); `poll_timeout` names the
/// earliest; `handle_timeout` before it does nothing, at it the call expires once.
#[test]
fn deadlines_expire_at_the_server_on_the_fake_clock() {
    let clock = Clock(std::time::Instant::now());
    let mut s = Session::new(Role::Server, params(3, 16, 100));
    s.handle_header(&request(0, 1, 50_000), || clock.at(10)).unwrap();
    s.handle_header(&request(1, 1, 20_000), || clock.at(20)).unwrap();
    s.handle_header(&request(2, 1, 0), || panic!("no deadline: the clock is not read")).unwrap();
    assert_eq!(s.live_call(0, 1), Some(LiveCall { deadline: Some(clock.at(60)) }));
    assert_eq!(s.live_call(2, 1), Some(LiveCall { deadline: None }));
    assert_eq!(s.poll_timeout(true), Some(clock.at(40)));
    s.handle_timeout(clock.at(39), true);
    assert_eq!(s.poll_event(), None);
    s.handle_timeout(clock.at(40), true);
    assert_eq!(s.poll_event(), Some(Event::Expired { slot: 1, generation: 1 }));
    assert_eq!(s.poll_event(), None);
    assert!(s.live_call(1, 1).is_none() && s.live_call(0, 1).is_some() && s.live_call(2, 1).is_some());
    assert_eq!(s.poll_timeout(true), Some(clock.at(60)), "an expired call is not timed again");
    s.handle_timeout(clock.at(1000), true);
    assert_eq!(s.poll_event(), Some(Event::Expired { slot: 0, generation: 1 }));
    assert_eq!(s.poll_event(), None, "each call expires once; the one without a deadline never");
    assert!(s.on_answer_for(1, 1) && s.on_answer_for(0, 1));
    assert_eq!(s.poll_timeout(false), None);
}

/// `max_call_duration`: a call, with or without a deadline, is bounded from the first timer
/// check that sees it (no clock read when it arrives); past the bound it ends once with
/// `Overran`, answered DEADLINE_EXCEEDED naming the setting. Sabotaged: `CallLimit::check` never
/// ending a call: no `Overran` at 1110 ms.
#[test]
fn calls_end_at_the_servers_max_call_duration_on_the_fake_clock() {
    let clock = Clock(std::time::Instant::now());
    let mut s = Session::new(Role::Server, params(3, 16, 100));
    s.set_call_limit(Some(Duration::from_millis(100)), clock.at(0));
    assert_eq!(s.poll_timeout(true), None, "no call: nothing timed");
    s.handle_header(&request(0, 1, 0), || panic!("no deadline: the clock is not read")).unwrap();
    s.handle_header(&request(1, 1, 5_000_000), || clock.at(5)).unwrap();
    assert_eq!(s.poll_timeout(true), Some(clock.at(0)), "due for a look now");
    s.handle_timeout(clock.at(10), true);
    assert_eq!(s.poll_event(), None);
    assert_eq!(s.poll_timeout(true), Some(clock.at(110)));
    s.handle_header(&request(2, 1, 0), || panic!("no deadline: the clock is not read")).unwrap();
    s.handle_timeout(clock.at(109), true);
    assert_eq!(s.poll_event(), None);
    s.handle_timeout(clock.at(110), true);
    let (a, b) = (s.poll_event(), s.poll_event());
    let limit = Duration::from_millis(100);
    assert_eq!(a, Some(Event::Overran { slot: 0, generation: 1, limit }));
    assert_eq!(b, Some(Event::Overran { slot: 1, generation: 1, limit }));
    assert_eq!(s.poll_event(), None, "the call seen at 109 ms has 100 ms from there");
    let (_, status) = a.unwrap().answer().unwrap();
    assert_eq!(status.code(), crate::status::Code::DeadlineExceeded);
    assert!(status.message().contains("max_call_duration"), "{status:?}");
    assert!(s.live_call(0, 1).is_none() && s.live_call(2, 1).is_some());
    s.handle_timeout(clock.at(1110), true);
    assert_eq!(s.poll_event(), Some(Event::Overran { slot: 2, generation: 1, limit }));
    assert_eq!(s.poll_event(), None, "each once");
    assert_eq!(s.poll_timeout(true), None);
}

/// The idle probe: while waiting, a Ping after a third of `peer_timeout` of silence, another
/// after two thirds, PeerDead after all of it; anything received restarts the silence; a Ping
/// received makes a Pong due; nothing happens while not waiting, and a long gap between checks
/// (nobody watching) is not counted as silence.
#[test]
fn idle_probe_pings_then_declares_the_peer_dead_on_the_fake_clock() {
    let clock = Clock(std::time::Instant::now());
    let mut c = Session::new(Role::Client, params(2, 16, 100));
    c.handle_timeout(clock.at(0), true);
    assert!(!c.has_control(), "no probe configured");
    c.set_peer_timeout(Some(std::time::Duration::from_millis(300)), clock.at(0));
    c.handle_timeout(clock.at(0), true);
    assert_eq!(c.poll_timeout(true), Some(clock.at(100)));
    assert_eq!(c.poll_timeout(false), None, "not waiting: nothing to time");
    c.handle_timeout(clock.at(99), true);
    assert!(!c.has_control());
    c.handle_timeout(clock.at(100), true);
    assert_eq!(c.next_control(), Some(Header::new(Kind::Ping)));
    c.handle_timeout(clock.at(150), true);
    assert!(!c.has_control(), "one Ping per third");
    c.handle_timeout(clock.at(200), true);
    assert_eq!(c.next_control(), Some(Header::new(Kind::Ping)));
    // The Pong arrives: silence starts again from the next check.
    c.handle_header(&Header { session: 5, ..Header::new(Kind::Pong) }, || clock.at(0)).unwrap();
    c.handle_timeout(clock.at(250), true);
    c.handle_timeout(clock.at(349), true);
    assert!(!c.has_control() && c.poll_event().is_none());
    c.handle_timeout(clock.at(350), true);
    assert_eq!(c.next_control(), Some(Header::new(Kind::Ping)));
    for t in [400, 450, 500, 549] {
        c.handle_timeout(clock.at(t), true);
        let _ = c.next_control();
        assert_eq!(c.poll_event(), None, "at {t} ms");
    }
    c.handle_timeout(clock.at(550), true);
    assert_eq!(c.poll_event(), Some(Event::PeerDead { silent: std::time::Duration::from_millis(300) }));

    // Not waiting: never a Ping nor a death, and waiting again starts a fresh silence.
    let mut s = Session::new(Role::Server, params(2, 16, 100));
    s.set_peer_timeout(Some(std::time::Duration::from_millis(300)), clock.at(0));
    assert_eq!(s.poll_timeout(true), Some(clock.at(0)), "a first check is due at once when waiting");
    for t in (0..2000).step_by(50) {
        s.handle_timeout(clock.at(t), false);
    }
    assert!(!s.has_control() && s.poll_event().is_none());
    s.handle_timeout(clock.at(2050), true);
    s.handle_timeout(clock.at(2100), true);
    assert!(!s.has_control(), "silence counts from when waiting began");
    // A gap longer than two probe intervals between checks: nobody watched, nothing counted.
    s.handle_timeout(clock.at(9000), true);
    assert!(!s.has_control() && s.poll_event().is_none());
    // A Ping received: a Pong is due at once.
    s.handle_header(&Header { session: 5, ..Header::new(Kind::Ping) }, || clock.at(0)).unwrap();
    assert_eq!(s.next_control(), Some(Header::new(Kind::Pong)));
}

/// A server session whose client answers probes while idle (its handshake's FLAG_IDLE_PONGS)
/// is watched with no call unanswered: a Ping after a third of `peer_timeout` of silence,
/// PeerDead after all of it; a session of a client without the flag is not watched while idle.
#[test]
fn an_idle_client_that_answers_probes_is_probed_and_declared_dead_on_the_fake_clock() {
    let clock = Clock(std::time::Instant::now());
    let t = std::time::Duration::from_millis(300);
    let mut plain = Session::new(Role::Server, params(2, 16, 100));
    plain.set_peer_timeout(Some(t), clock.at(0));
    let mut probed = Session::new(Role::Server, params(2, 16, 100));
    probed.set_peer_timeout(Some(t), clock.at(0));
    probed.probe_while_idle();
    assert!(!plain.watches_peer() && probed.watches_peer());
    let mut off = Session::new(Role::Server, params(2, 16, 100));
    off.probe_while_idle();
    assert!(!off.watches_peer(), "without a peer_timeout there is no probe: nothing to watch");
    assert_eq!(plain.poll_timeout(plain.watches_peer()), None, "idle, not probed: no timer");
    assert_eq!(probed.poll_timeout(probed.watches_peer()), Some(clock.at(0)));
    let mut pings = 0;
    for ms in (0..300).step_by(50) {
        for s in [&mut plain, &mut probed] {
            let waiting = s.watches_peer();
            s.handle_timeout(clock.at(ms), waiting);
        }
        assert!(!plain.has_control() && plain.poll_event().is_none(), "at {ms} ms");
        while let Some(h) = probed.next_control() {
            assert_eq!(h, Header::new(Kind::Ping), "at {ms} ms");
            pings += 1;
        }
        assert_eq!(probed.poll_event(), None, "at {ms} ms");
    }
    assert_eq!(pings, 2, "a Ping after a third and after two thirds of the silence");
    probed.handle_timeout(clock.at(300), probed.watches_peer());
    assert_eq!(probed.poll_event(), Some(Event::PeerDead { silent: t }));
}

/// A message in pieces ends in a buffer of exactly its `total_len` (doubling stops there: a
/// message of 1 MiB and 4 B takes 1 MiB and 4 B, not 2 MiB), and an announced `total_len` alone
/// allocates nothing of its size: a 1-byte first piece of a message at the limit is refused (a
/// piece that is not its message's last holds at least 1/16 of the ring), the smallest legal one
/// (128 KiB of a 2 MiB ring) reserves twice it, one over the limit is refused before any buffer
/// exists.
#[test]
fn assembly_buffers_are_sized_by_total_len_and_a_hostile_one_allocates_nothing() {
    let max_message = 4 << 20;
    let p = SessionParams { max_message, ..params(2, 16, 2 << 20) };
    let mut s = Session::new(Role::Server, p);
    let total = (1 << 20) + 4;
    let first = Header {
        method: 1,
        session: 5,
        slot: 0,
        generation: 3,
        in_ring: true,
        body_len: 256 << 10,
        total_len: total,
        ..Header::new(Kind::Request)
    };
    let mut offset = 0u32;
    let mut caps = Vec::new();
    let done = loop {
        let len = (256 << 10).min(total - offset);
        let h = Header { ring_offset: offset, body_len: len, ..first };
        let piece = s.handle_header(&h, std::time::Instant::now).unwrap().ring.unwrap();
        let buf = s.piece_buffer(&piece);
        assert!(buf.capacity() >= buf.len() + len as usize, "room for the piece before it is copied");
        buf.extend(std::iter::repeat_n(7u8, len as usize));
        caps.push(buf.capacity());
        offset += len;
        if let Some(done) = s.piece_done(piece).unwrap() {
            break done;
        }
    };
    assert_eq!(done.body.len(), total as usize);
    assert_eq!(done.body.capacity(), total as usize, "capacities piece by piece: {caps:?}");
    assert!(caps.windows(2).all(|w| w[0] <= w[1]) && caps.len() == 5, "{caps:?}");

    let mut s = Session::new(Role::Server, p);
    let hostile = Header { slot: 1, body_len: 1, total_len: max_message, ..first };
    assert_eq!(s.handle_header(&hostile, std::time::Instant::now).unwrap_err(), super::SMALL_PIECE);
    assert_eq!(s.assemblies(), 0, "no buffer for the refused piece");
    let smallest = Header { body_len: (2 << 20) / 16, ..hostile };
    let piece = s.handle_header(&smallest, std::time::Instant::now).unwrap().ring.unwrap();
    assert!(s.piece_buffer(&piece).capacity() <= 256 << 10, "{}", s.piece_buffer(&piece).capacity());
    let over = Header { slot: 0, total_len: max_message + 1, ring_offset: 1, ..first };
    assert_eq!(
        s.handle_header(&over, std::time::Instant::now).unwrap_err(),
        "body larger than max_message_size"
    );
    assert_eq!(s.assemblies(), 1, "no buffer for the refused message");
}

/// Receives one request of `total` bytes on `slot` in pieces of a quarter of the 1 MiB ring.
fn receive_in_pieces(s: &mut Session, slot: u16, total: u32, at: &mut u32) -> Complete {
    let mut got = 0;
    loop {
        let len = (256 << 10).min(total - got);
        let h = Header {
            method: 1,
            session: 5,
            slot,
            generation: 1,
            in_ring: true,
            ring_offset: *at,
            body_len: len,
            total_len: total,
            ..Header::new(Kind::Request)
        };
        let piece = s.handle_header(&h, std::time::Instant::now).unwrap().ring.unwrap();
        s.piece_buffer(&piece).extend(std::iter::repeat_n(slot as u8, len as usize));
        *at = (*at + len) % (1 << 20);
        got += len;
        // The server's report of the freed space (a client writes only into space reported).
        s.stamp(&mut Header::new(Kind::RingReturn));
        if let Some(done) = s.piece_done(piece).unwrap() {
            return done;
        }
    }
}

/// The buffers of two largest messages wait as spares once their `Bytes` are dropped (a
/// pipelined client holds one answer its caller reads and one complete while the next arrives),
/// and the next two large messages are copied into them: no fresh pages.
#[test]
fn two_largest_bodies_come_back_and_are_reused() {
    let max_message = 4 << 20;
    let p = SessionParams { max_message, ..params(4, 16, 1 << 20) };
    let mut s = Session::new(Role::Server, p);
    let mut at = 0;
    let a = receive_in_pieces(&mut s, 0, max_message, &mut at);
    let b = receive_in_pieces(&mut s, 1, max_message, &mut at);
    let ptrs = [a.body.as_ptr(), b.body.as_ptr()];
    let (a, b) = (s.body_bytes(a.body), s.body_bytes(b.body));
    assert_eq!((a[0], b[0]), (0, 1));
    drop((a, b));
    assert_eq!(s.spare_bodies().spare_count(), 2, "both large buffers are kept");
    let c = receive_in_pieces(&mut s, 2, max_message, &mut at);
    let d = receive_in_pieces(&mut s, 3, max_message, &mut at);
    assert!(ptrs.contains(&c.body.as_ptr()) && ptrs.contains(&d.body.as_ptr()), "reused");
    assert_eq!(s.spare_bodies().spare_count(), 0);
}

/// The server's reassembly rules: a body in pieces is charged its `total_len` to the shared count
/// from its first piece until its last (a body in one piece never), one that would go over the
/// cap is refused (its call alone, before anything is allocated), and one that does not finish
/// within the timeout becomes [`Event::ReassemblyExpired`] (measured from its first piece, with
/// a fake clock). The refusal itself: `reassembly_tests.rs`.
#[test]
fn bodies_in_pieces_are_charged_capped_and_timed_out() {
    let ring = 1 << 20;
    let p = SessionParams { max_message: 8 << 20, ..params(4, 16, ring) };
    let held = super::HeldBytes::new(3 << 20, "ServerConfig::max_reassembly_bytes");
    let t0 = std::time::Instant::now();
    let mut s = Session::new(Role::Server, p);
    s.set_reassembly(held.clone(), u64::MAX, Duration::from_secs(10));
    let piece = |slot: u16, offset: u32, len: u32, total: u32| Header {
        method: 1,
        session: 5,
        slot,
        generation: 1,
        in_ring: true,
        ring_offset: offset,
        body_len: len,
        total_len: total,
        ..Header::new(Kind::Request)
    };
    // One piece, whole: copied out at once, never charged.
    let whole = s.handle_header(&piece(0, 0, 64 << 10, 64 << 10), || t0).unwrap().ring.unwrap();
    s.piece_buffer(&whole).resize(64 << 10, 0);
    assert!(s.piece_done(whole).unwrap().is_some());
    assert_eq!(held.used(), 0);
    // The first piece of a 2 MiB body charges 2 MiB.
    let first = s.handle_header(&piece(1, 64 << 10, 256 << 10, 2 << 20), || t0).unwrap().ring.unwrap();
    s.piece_buffer(&first).resize(256 << 10, 0);
    assert!(s.piece_done(first).unwrap().is_none());
    assert_eq!(held.used(), 2 << 20);
    assert!(s.watches_peer(), "a body in pieces arms the timers");
    // Another of 2 MiB would take the count to 4 MiB, over its 3 MiB cap: its call is refused,
    // nothing held for it, the session open.
    let over = piece(2, 320 << 10, 256 << 10, 2 << 20);
    let dropped = s.handle_header(&over, || t0).unwrap().ring.unwrap();
    assert!(dropped.dropped());
    assert!(s.piece_done(dropped).unwrap().is_none());
    assert!(matches!(s.poll_event(), Some(Event::Refused { slot: 2, .. })));
    assert_eq!((held.used(), s.assemblies()), (2 << 20, 2));
    // The first body never finishes: expired 10 s after its first piece, not before.
    assert_eq!(s.poll_timeout(true), Some(t0 + Duration::from_secs(10)));
    s.handle_timeout(t0 + Duration::from_millis(9_999), true);
    assert_eq!(s.poll_event(), None);
    s.handle_timeout(t0 + Duration::from_secs(10), true);
    assert_eq!(s.poll_event(), Some(Event::ReassemblyExpired { waited: Duration::from_secs(10) }));
    // Once reported; the driver closes the session, which gives its charge back.
    s.handle_timeout(t0 + Duration::from_secs(11), true);
    assert_eq!(s.poll_event(), None);
    drop(s);
    assert_eq!(held.used(), 0);
}

/// A freed head from the peer ahead of our own WRITEs' completions frees nothing those WRITEs
/// still read: the next body waits (in pieces, where no WRITE reads), and the range is reused
/// once a completion retires its WRITE ([`Session::on_ring_written`]). Sabotaged: `reserve`
/// taking only the peer's head: the second body was placed at 0, over the first one's WRITE;
/// `on_ring_written` doing nothing: the last body never went back to 0 (`Pieces`).
#[test]
fn a_freed_head_ahead_of_our_completions_frees_nothing_still_written() {
    let mut s = Session::new(Role::Client, params(4, 16, 1000));
    assert_eq!(s.place_body(600), Ok(Placement::Ring(0)));
    let written = s.ring_write_mark();
    // The server claims the 600 bytes freed before our WRITE of them completed.
    let lie = Header { session: 5, freed_head: 600, ..Header::new(Kind::RingReturn) };
    s.handle_header(&lie, std::time::Instant::now).expect("a freed head within what we placed");
    assert_eq!(s.place_body(600), Ok(Placement::Pieces), "0..600 is still read by our WRITE");
    assert_eq!(s.next_piece(600), Some((600, 250)), "a piece where no WRITE reads");
    let piece = s.ring_write_mark();
    s.on_ring_written(written);
    s.on_ring_written(piece);
    let freed = Header { session: 5, freed_head: piece, ..Header::new(Kind::RingReturn) };
    s.handle_header(&freed, std::time::Instant::now).unwrap();
    assert_eq!(s.place_body(600), Ok(Placement::Ring(0)), "retired and freed: reused");
}

#[test]
fn responses_report_the_servers_requests_unanswered_over_its_sessions() {
    let load = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut a = Session::new(Role::Server, params(4, 16, 100));
    let mut b = Session::new(Role::Server, params(4, 16, 100));
    a.set_load(load.clone());
    b.set_load(load.clone());
    let req = |slot: u16| Header { method: 1, session: 5, slot, generation: 1, ..Header::new(Kind::Request) };
    for slot in 0..3 {
        a.handle_header(&req(slot), std::time::Instant::now).unwrap();
    }
    b.handle_header(&req(0), std::time::Instant::now).unwrap();
    assert_eq!(load.load(std::sync::atomic::Ordering::Relaxed), 4);
    // `a` answers one: its response reports the 3 still unanswered over both sessions.
    assert!(a.on_answer_for(0, 1));
    let mut h = Header { slot: 0, generation: 1, ..Header::new(Kind::Response) };
    a.stamp(&mut h);
    assert_eq!(h.count, 3);
    // Only responses carry it.
    let mut r = Header::new(Kind::RingReturn);
    a.stamp(&mut r);
    assert_eq!(r.count, 0);
    // A session dropped with requests unanswered takes them back.
    drop(a);
    assert_eq!(load.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The client keeps what the last response said.
    let mut c = Session::new(Role::Client, params(4, 16, 100));
    assert_eq!(c.peer_load(), None);
    let _ = c.handle_header(&Header { session: 5, count: 7, ..h }, std::time::Instant::now);
    assert_eq!(c.peer_load(), Some(7));
}

/// A server's batch that starts with the stream's headers: its frames are checked past the
/// block, and a block that claims more bytes than the body is refused (a hostile server).
#[test]
fn a_batch_after_a_metadata_block_is_checked_past_it() {
    let batch = |block_len: u32, block: &[u8]| {
        let mut msg = vec![0u8; crate::wire::HEADER_LEN];
        msg.extend_from_slice(&block_len.to_le_bytes());
        msg.extend_from_slice(block);
        crate::wire::push_frame(&mut msg, b"one");
        crate::wire::push_frame(&mut msg, b"two");
        msg
    };
    // A block of no entries: length 2 (its entry count).
    let good = batch(2, &0u16.to_le_bytes());
    assert_eq!(super::check_batch(&good, 2, true), Ok(()));
    // Read as frames from the block's start, the same bytes are malformed.
    assert!(super::check_batch(&good, 2, false).is_err());
    // A block longer than the body, and one that swallows a frame.
    for len in [u32::MAX - 3, u32::MAX, 1000] {
        let e = super::check_batch(&batch(len, &0u16.to_le_bytes()), 2, true).unwrap_err();
        assert!(e.contains("metadata block longer than the body"), "{e}");
    }
    assert!(super::check_batch(&batch(2 + 7, &0u16.to_le_bytes()), 2, true).is_err());
    // Too short for a length at all.
    let mut short = vec![0u8; crate::wire::HEADER_LEN];
    short.extend_from_slice(&[1, 0]);
    assert!(super::check_batch(&short, 1, true).is_err());
}

/// A server takes a request naming the session's cached metadata block only after one stored a
/// block (protocol 11), on a unary request and on a stream's opening one alike.
#[test]
fn a_request_may_name_the_cached_metadata_block_only_after_a_store() {
    use crate::wire::{METADATA_CACHED, METADATA_STORE};
    let now = std::time::Instant::now;
    let named = Header { metadata_cache: METADATA_CACHED, ..request(0, 1, 0) };
    let mut s = Session::new(Role::Server, params(4, 16, 100));
    assert_eq!(
        s.handle_header(&named, now).unwrap_err(),
        "a request names the cached metadata block before any request stored one"
    );
    let mut s = Session::new(Role::Server, params(4, 16, 100));
    let opens = Header { stream: crate::wire::STREAM_OUT, count: 1, ..named };
    assert!(s.handle_header(&opens, now).is_err(), "a stream's opening request too");
    let mut s = Session::new(Role::Server, params(4, 16, 100));
    s.handle_header(&Header { metadata: true, metadata_cache: METADATA_STORE, ..request(0, 1, 0) }, now)
        .unwrap();
    s.handle_header(&Header { slot: 1, ..named }, now).unwrap();
    s.handle_header(&Header { slot: 2, ..opens }, now).unwrap();
}
