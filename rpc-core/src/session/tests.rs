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
    ring: Option<(RingToken, u32, u32)>,
}

struct Pair {
    client: Session,
    server: Session,
    slots: CallSlots<Done>,
    pending_client: VecDeque<Header>,
    to_server: VecDeque<Header>,
    to_client: VecDeque<Header>,
    server_ring: Ring,
    client_ring: Ring,
    server_held: VecDeque<(Header, Option<RingToken>)>,
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
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            server_ring: vec![None; ring as usize],
            client_ring: vec![None; ring as usize],
            server_held: VecDeque::new(),
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
        let mut h = Header { method: id, body_len: len, ..Header::new(Kind::Request) };
        match self.client.place_body(len as usize) {
            Ok(Placement::Eager) => {}
            Ok(Placement::Ring(off)) => {
                h.in_ring = true;
                h.ring_offset = off;
                mark(&mut self.server_ring, off, len, id)?;
            }
            Err(PlaceError::RingFull) => return Ok(()),
            Err(PlaceError::Refused(s)) => {
                prop_assert_eq!(s.code(), Code::ResourceExhausted);
                return Ok(());
            }
        }
        let (slot, generation) = self.slots.start().unwrap();
        h.slot = slot;
        h.generation = generation;
        self.calls.push((slot, generation));
        self.pending_client.push_back(h);
        self.pump();
        Ok(())
    }

    fn pump(&mut self) {
        while let Some((slot, generation)) = self.slots.next_sendable() {
            let mut h = self.pending_client.pop_front().unwrap();
            assert_eq!((h.slot, h.generation), (slot, generation), "sent in start order");
            self.client.stamp(&mut h);
            self.to_server.push_back(h);
        }
    }

    fn server_deliver(&mut self) -> Result<(), TestCaseError> {
        let Some(h) = self.to_server.pop_front() else { return Ok(()) };
        let inc = self.server.handle_header(&h).map_err(TestCaseError::fail)?;
        if h.kind == Kind::Request {
            self.server_held.push_back((h, inc.ring));
        }
        Ok(())
    }

    fn server_answer(&mut self, len: u32) -> Result<(), TestCaseError> {
        let Some(&(req, token)) = self.server_held.front() else { return Ok(()) };
        let id = self.id();
        let mut h = Header {
            slot: req.slot,
            generation: req.generation,
            method: id,
            credits: 1,
            body_len: len,
            ..Header::new(Kind::Response)
        };
        match self.server.place_body(len as usize) {
            Ok(Placement::Eager) => {}
            Ok(Placement::Ring(off)) => {
                h.in_ring = true;
                h.ring_offset = off;
                mark(&mut self.client_ring, off, len, id)?;
            }
            Err(PlaceError::RingFull) => return Ok(()),
            Err(PlaceError::Refused(_)) => {
                h.status = Code::ResourceExhausted;
                h.body_len = 0;
            }
        }
        self.server_held.pop_front();
        if let Some(t) = token {
            unmark(&mut self.server_ring, req.ring_offset, req.body_len, req.method)?;
            self.server.release(t);
        }
        assert!(self.server.on_answer_for(req.slot, req.generation));
        self.server.stamp(&mut h);
        self.to_client.push_back(h);
        Ok(())
    }

    fn client_deliver(&mut self) -> Result<(), TestCaseError> {
        let Some(h) = self.to_client.pop_front() else { return Ok(()) };
        let inc = self.client.handle_header(&h).map_err(TestCaseError::fail)?;
        if h.kind == Kind::Response {
            let ring = inc.ring.map(|t| (t, h.ring_offset, h.body_len));
            let fate = self.slots.on_response(h.slot, h.generation, Done { id: h.method, ring });
            prop_assert!(matches!(fate, Ok(ResponseFate::Stored)));
            self.pump();
        }
        Ok(())
    }

    fn client_take(&mut self, pick: usize) -> Result<(), TestCaseError> {
        if self.calls.is_empty() {
            return Ok(());
        }
        let k = pick % self.calls.len();
        let (slot, generation) = self.calls[k];
        if let Some(done) = self.slots.take_done(slot, generation) {
            self.calls.swap_remove(k);
            if let Some((t, off, len)) = done.ring {
                unmark(&mut self.client_ring, off, len, done.id)?;
                self.client.release(t);
            }
        }
        Ok(())
    }

    fn credit_returns(&mut self) {
        if self.client.unreported_ring_bytes() > 0 {
            let mut h = Header::new(Kind::CreditReturn);
            self.client.stamp(&mut h);
            self.to_server.push_back(h);
        }
        if self.server.unreported_ring_bytes() > 0 {
            let mut h = Header::new(Kind::CreditReturn);
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
    CreditReturns,
}

fn op(max_len: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..max_len).prop_map(Op::Call),
        Just(Op::ServerDeliver),
        (0..max_len).prop_map(Op::ServerAnswer),
        Just(Op::ClientDeliver),
        any::<u8>().prop_map(Op::ClientTake),
        Just(Op::CreditReturns),
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
                Op::CreditReturns => p.credit_returns(),
            }
            prop_assert!(p.slots.in_flight() <= credits);
            prop_assert!(p.server.unanswered() <= credits);
        }
        // Drain: deliver everything, answering with empty bodies.
        for _ in 0..10_000 {
            if p.to_server.is_empty() && p.to_client.is_empty() && p.server_held.is_empty()
                && p.calls.is_empty() && p.pending_client.is_empty() {
                break;
            }
            p.server_deliver()?;
            p.server_answer(0)?;
            p.client_deliver()?;
            p.client_take(0)?;
            p.credit_returns();
        }
        prop_assert!(p.calls.is_empty(), "every call completed");
        prop_assert!(p.server_ring.iter().all(Option::is_none));
        prop_assert!(p.client_ring.iter().all(Option::is_none));
    }
}

#[test]
fn refuses_what_can_never_fit_naming_the_limit() {
    let mut s = Session::new(Role::Client, params(4, 16, 100));
    assert_eq!(s.place_body(16), Ok(Placement::Eager));
    assert_eq!(s.place_body(100), Ok(Placement::Ring(0)));
    match s.place_body(101) {
        Err(PlaceError::Refused(st)) => {
            assert_eq!(st.code(), Code::ResourceExhausted);
            assert!(st.message().contains("ring of 100 bytes"), "{}", st.message());
        }
        other => panic!("{other:?}"),
    }
    match s.place_body((1 << 20) + 1) {
        Err(PlaceError::Refused(st)) => {
            assert!(st.message().contains("max_message_size"), "{}", st.message())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn protocol_violations_are_reported() {
    let mut s = Session::new(Role::Server, params(1, 16, 100));
    let req = Header { method: 1, session: 5, ..Header::new(Kind::Request) };
    assert!(s.handle_header(&Header { session: 6, ..req }).is_err());
    s.handle_header(&req).unwrap();
    assert_eq!(s.handle_header(&req).unwrap_err(), "request beyond the granted credits");
    let mut s = Session::new(Role::Server, params(2, 16, 100));
    let ring = Header { in_ring: true, ring_offset: 50, body_len: 60, ..req };
    assert!(s.handle_header(&ring).is_err());
    let small = Header { in_ring: true, ring_offset: 0, body_len: 10, ..req };
    assert!(s.handle_header(&small).is_err());
    assert!(s.handle_header(&Header { freed_head: 7, ..req }).is_err());
}
