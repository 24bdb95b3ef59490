//! Fuzz property of the session against a hostile peer: one [`Session`] (either role) driven as a
//! worker or client drives it, while the peer's every header is built from the fuzzer's bytes, so
//! any field may lie (kinds, sessions, slots, generations, ring offsets and lengths, freed heads,
//! counts, stream flags). Used by `fuzz/fuzz_targets/session_peer.rs` and by a proptest of the
//! normal test suite, so `cargo test` always runs it on random input.
//!
//! Whatever the peer sends, the session never panics, never accepts more than it granted, never
//! places a body over a range a WRITE of ours still reads (whatever freed head the peer reports)
//! and keeps its memory bounded by its parameters (the invariants `Harness::check` and
//! `Harness::post_write` assert); a header it
//! refuses ends the run, as the drivers close the session then.

use std::time::{Duration, Instant};

use super::{Placement, Role, Session, SessionParams, MAX_STREAM_BUDGET};
use crate::status::Code;
use crate::wire::{Header, Kind, STREAM_BATCH, STREAM_IN, STREAM_OUT};

/// The fuzzer's bytes, read front to back; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A session under attack, the driver's view of it, and a fake clock.
struct Harness {
    s: Session,
    now: Instant,
    /// Client: calls started (slot, generation) and not yet taken back.
    calls: Vec<(u16, u32)>,
    /// Server: answers being sent in pieces (bytes still to place).
    pieces: Vec<u32>,
    /// The peer's model of our ring (it places bodies where it believes there is room).
    peer_ring: super::RingProducer,
    /// The peer's messages in progress through our ring: their headers and the bytes still to
    /// send.
    peer_rest: Vec<(Header, u32)>,
    /// The peer's last call slot (a server's peer numbers its calls).
    peer_slot: u16,
    /// Server: our Pings the peer has not answered.
    pings_owed: u32,
    /// Server: the peer's Pings since our last message.
    pings_since_ours: u32,
    /// Server: the peer's view of its own ring, which our answers are placed in (it frees each
    /// body or piece at once, as the runtime copies it out).
    peer_consumer: super::RingConsumer,
    /// Server: the freed head the peer last reported (every honest header carries it).
    peer_freed: u32,
    /// Server: our ring WRITEs not yet retired by a completion, oldest first: (ring mark,
    /// offset, length). Whatever freed head the peer reports, no placement overlaps one.
    writes: std::collections::VecDeque<(u32, u32, u32)>,
    /// The reassembly count and share when limits are set ([`Session::set_reassembly`]).
    reassembly: Option<(std::sync::Arc<super::HeldBytes>, u64)>,
}

const KINDS: [Kind; 15] = [
    Kind::Request,
    Kind::Response,
    Kind::RingReturn,
    Kind::Close,
    Kind::Cancel,
    Kind::Ping,
    Kind::Pong,
    Kind::StreamMsg,
    Kind::StreamEnd,
    Kind::StreamGrant,
    Kind::CancelAck,
    Kind::RingAsk,
    Kind::RingGrant,
    Kind::RingReclaim,
    Kind::RingRelease,
];

impl Harness {
    fn new(input: &mut Input<'_>) -> Harness {
        let role = if input.u8() & 1 == 0 { Role::Server } else { Role::Client };
        let credits = 1 + u16::from(input.u8() % 16);
        let eager_threshold = u32::from(input.u8()) * 4;
        let own_ring_len = 64 + u32::from(input.u16() % 8192);
        let peer_ring_len = 64 + u32::from(input.u16() % 8192);
        let max_message = own_ring_len.max(peer_ring_len) * 4 + u32::from(input.u16());
        let max_held = match role {
            Role::Server => usize::from(credits),
            Role::Client => usize::from(credits) * 2,
        };
        let params = SessionParams {
            id: 7,
            credits,
            eager_threshold,
            max_message,
            peer_ring_len,
            own_ring_len,
            max_held,
        };
        let now = Instant::now();
        let mut s = Session::new(role, params);
        s.set_peer_timeout(Some(Duration::from_secs(6)), now);
        let b = input.u8();
        if b & 1 == 1 {
            s.probe_while_idle();
        }
        // Reassembly limits (bits 1-2 of the same byte): none, a cap of one largest message, a
        // cap below it (every body in pieces refused), or a share of half a message.
        let (cap, share) = match (b >> 1) & 3 {
            1 => (u64::from(max_message), u64::MAX),
            2 => (u64::from(max_message) / 2, u64::MAX),
            3 => (u64::MAX, u64::from(max_message) / 2),
            _ => (0, 0),
        };
        let reassembly = (cap > 0).then(|| {
            let held = super::HeldBytes::new(cap, "ServerConfig::max_reassembly_bytes");
            s.set_reassembly(held.clone(), share, Duration::from_secs(10));
            (held, share)
        });
        Harness {
            s,
            now,
            calls: Vec::new(),
            pieces: Vec::new(),
            peer_ring: super::RingProducer::new(own_ring_len),
            peer_rest: Vec::new(),
            peer_slot: 0,
            pings_owed: 0,
            pings_since_ours: 0,
            peer_consumer: super::RingConsumer::new(peer_ring_len, 64),
            peer_freed: 0,
            writes: std::collections::VecDeque::new(),
            reassembly,
        }
    }

    /// A header from the peer. The peer plays by the rules (its own model of our ring, its
    /// credits, its streams) unless the fuzzer corrupts it: about one header in 32 has some
    /// fields chosen freely (kind, session, lengths, offsets, freed head, counts, stream flags),
    /// so the checks past the first ones are reached too.
    fn peer_header(&mut self, input: &mut Input<'_>) -> Header {
        let p = *self.s.params();
        let corrupt = if input.u8() < 0x08 { input.u8() } else { 0 };
        let role = self.s.role();
        // The kinds an honest peer of this role sends, most often the call-carrying ones.
        let honest: &[Kind] = match role {
            Role::Server => &[
                Kind::Request,
                Kind::Request,
                Kind::Request,
                Kind::StreamMsg,
                Kind::Cancel,
                Kind::StreamEnd,
                Kind::StreamGrant,
                Kind::RingReturn,
                Kind::Ping,
                Kind::Pong,
            ],
            Role::Client => &[
                Kind::Response,
                Kind::Response,
                Kind::Response,
                Kind::StreamMsg,
                Kind::CancelAck,
                Kind::StreamGrant,
                Kind::RingReturn,
                Kind::Ping,
                Kind::Pong,
            ],
        };
        let k = usize::from(input.u8());
        let mut kind = if corrupt & 1 != 0 { KINDS[k % KINDS.len()] } else { honest[k % honest.len()] };
        if corrupt == 0 && role == Role::Server {
            // What the server meters (`super::meter`), an honest client sends only when due: a
            // Pong for a Ping of ours, at most 4 Pings between two messages of ours, a RingReturn
            // for a body of ours in its ring.
            let due = match kind {
                Kind::Pong => self.pings_owed > 0,
                Kind::Ping => self.pings_since_ours < 4,
                Kind::RingReturn => self.peer_consumer.unreported() > 0,
                _ => true,
            };
            if !due {
                kind = Kind::Request;
            }
            match kind {
                Kind::Pong => self.pings_owed -= 1,
                Kind::Ping => self.pings_since_ours += 1,
                Kind::RingReturn => self.peer_freed = self.peer_consumer.take_freed(),
                _ => {}
            }
        }
        let pick = input.u8();
        let (slot, generation) = match role {
            // Mostly the client's own calls; now and then any slot of twice the window.
            Role::Client if pick & 3 == 0 => (u16::from(input.u8()) % (p.max_held as u16 * 2), 0),
            Role::Client if !self.calls.is_empty() => self.calls[usize::from(pick >> 2) % self.calls.len()],
            _ => {
                self.peer_slot = self.peer_slot.wrapping_add(u16::from(input.u8() % 2));
                (self.peer_slot % (p.credits * 2), u32::from(self.peer_slot / (p.credits * 2)))
            }
        };
        let mut h = Header { kind, slot, generation, session: p.id, ..Header::new(kind) };
        if matches!(kind, Kind::Request | Kind::Response | Kind::StreamMsg) {
            let total_len = match input.u8() % 4 {
                0 => u32::from(input.u8()).min(p.eager_threshold),
                1 => u32::from(input.u16()) % (p.own_ring_len + 1),
                2 => u32::from(input.u16()) % (p.max_message + 1),
                _ => input.u32() % (p.max_message + 1),
            };
            h.total_len = total_len;
            h.body_len = total_len;
            if total_len > p.eager_threshold {
                // Through our ring, where the peer's model of it has room: whole, or a piece.
                h.in_ring = true;
                let piece = (p.own_ring_len / 4).max(1);
                let whole = if input.u8() & 1 == 0 { self.peer_ring.reserve(total_len).ok() } else { None };
                match whole {
                    Some(off) => h.ring_offset = off,
                    None => match self.peer_ring.reserve_piece(total_len.min(piece), (piece / 4).max(1)) {
                        Some((off, n)) => {
                            h.ring_offset = off;
                            h.body_len = n;
                            // The rest of the message follows as more pieces, interleaved with
                            // the peer's other messages.
                            if n < total_len {
                                self.peer_rest.push((h, total_len - n));
                            }
                        }
                        None => h.ring_offset = u32::from(input.u16()) % p.own_ring_len,
                    },
                }
            }
            if kind == Kind::Request && input.u8() % 4 == 0 {
                h.stream = [STREAM_IN, STREAM_OUT, STREAM_IN | STREAM_OUT][usize::from(input.u8()) % 3];
                h.count = u16::from(input.u8() % 8);
            }
            if kind == Kind::Request {
                h.timeout_us = u32::from(input.u8()) * 1000;
            }
        }
        if kind == Kind::StreamGrant {
            h.count = u16::from(input.u8() % 16);
        }
        h.freed_head = self.peer_freed;
        if corrupt != 0 {
            if corrupt & 2 != 0 {
                h.session = input.u32();
            }
            if corrupt & 4 != 0 {
                h.in_ring = !h.in_ring;
                h.ring_offset = input.u32() % (p.own_ring_len + 2);
            }
            if corrupt & 8 != 0 {
                h.body_len = input.u32() % (h.total_len.max(p.own_ring_len) + 2);
                h.total_len = input.u32() % (p.max_message + 2);
            }
            if corrupt & 16 != 0 {
                h.freed_head = input.u32();
            }
            if corrupt & 32 != 0 {
                h.count = input.u16();
                h.stream = input.u8() & !STREAM_BATCH;
            }
            if corrupt & 64 != 0 {
                h.stream_taken = u32::from(input.u8());
                h.status = Code::Internal;
            }
            if corrupt & 128 != 0 {
                h.slot = input.u16();
                h.generation = input.u32();
            }
        }
        h
    }

    /// The next piece of the peer's message in progress, if any (and if its model of our ring
    /// has room for it).
    fn peer_piece(&mut self, pick: u8) -> Option<Header> {
        if self.peer_rest.is_empty() {
            return None;
        }
        let i = usize::from(pick) % self.peer_rest.len();
        let (h, rest) = self.peer_rest[i];
        let piece = (self.s.params().own_ring_len / 4).max(1);
        let (off, n) = self.peer_ring.reserve_piece(rest.min(piece), (piece / 4).max(1).min(rest))?;
        if rest > n {
            self.peer_rest[i].1 = rest - n;
        } else {
            self.peer_rest.swap_remove(i);
        }
        Some(Header { ring_offset: off, body_len: n, ..h })
    }

    /// A header we send: stamped, and its freed head fed to the peer's model of our ring.
    fn send(&mut self, h: &mut Header) {
        self.s.stamp(h);
        self.pings_since_ours = 0;
        if h.kind == Kind::Ping {
            self.pings_owed += 1;
        }
        // The peer's WRITEs of what it placed have completed by now (its reuse of our ring is
        // bounded by the freed heads we send).
        let _ = self.peer_ring.on_written(self.peer_ring.tail());
        let _ = self.peer_ring.on_freed(h.freed_head);
    }

    /// Server: the WRITE of a placement of ours at `offset`, `len` bytes, is posted (after the
    /// body was encoded into the mirror there): no WRITE of ours in flight may read that range.
    fn post_write(&mut self, offset: u32, len: u32) {
        for &(_, o, n) in &self.writes {
            assert!(
                offset + len <= o || o + n <= offset,
                "placed {offset}+{len} over {o}+{n}, still read by a WRITE in flight"
            );
        }
        if len > 0 {
            self.writes.push_back((self.s.ring_write_mark(), offset, len));
        }
    }

    /// Applies one header from the peer as the drivers do: refused, the session is closed (the
    /// run ends); a ring piece is copied out (zeros of its length) and completed.
    fn receive(&mut self, h: Header) -> Result<(), ()> {
        let now = self.now;
        let inc = self.s.handle_header(&h, || now).map_err(drop)?;
        if let Some(piece) = inc.ring {
            let len = piece.len as usize;
            if !piece.dropped() {
                let buf = self.s.piece_buffer(&piece);
                buf.resize(buf.len() + len, 0);
            }
            if let Some(done) = self.s.piece_done(piece).map_err(drop)? {
                assert!(
                    done.refused.is_some() || done.body.len() as u64 == u64::from(done.header.total_len),
                    "a message's whole body"
                );
                if self.s.role() == Role::Client {
                    return self.client_answer(&done.header);
                }
            }
        } else if self.s.role() == Role::Client && inc.header.kind == Kind::Response {
            return self.client_answer(&inc.header);
        }
        Ok(())
    }

    /// Client: a complete response (eager, or the last piece of a ring body).
    fn client_answer(&mut self, h: &Header) -> Result<(), ()> {
        self.s.on_response(h.slot, h.generation).map_err(drop)?;
        Ok(())
    }

    /// One step of the local driver, chosen by the fuzzer.
    fn drive(&mut self, input: &mut Input<'_>) {
        match input.u8() % 6 {
            0 => {
                // Send what waits: controls (Pongs, Pings, CancelAcks, grants), and the ring head.
                for _ in 0..64 {
                    let Some(mut c) = self.s.next_control() else { break };
                    self.send(&mut c);
                }
                if self.s.take_ring_return() {
                    let mut h = Header::new(Kind::RingReturn);
                    self.send(&mut h);
                }
            }
            1 => {
                self.now += Duration::from_millis(u64::from(input.u16()));
                let waiting = match self.s.role() {
                    Role::Server => self.s.watches_peer(),
                    Role::Client => self.s.calls().in_flight() > 0,
                };
                self.s.handle_timeout(self.now, waiting);
                while self.s.poll_event().is_some() {}
            }
            2 => match self.s.role() {
                Role::Server => self.server_answer(input),
                Role::Client => self.client_call(input),
            },
            3 => {
                // Answers in pieces go on as the peer frees its ring.
                if let Some(&first) = self.pieces.first() {
                    let mut remaining = first;
                    while let Some((off, n)) = self.s.next_piece(remaining) {
                        remaining -= n;
                        self.post_write(off, n);
                        if let Ok(t) = self.peer_consumer.accept(off, n) {
                            self.peer_consumer.release(t);
                        }
                        if remaining == 0 {
                            break;
                        }
                    }
                    if remaining == 0 {
                        self.pieces.remove(0);
                    } else {
                        self.pieces[0] = remaining;
                    }
                }
            }
            5 => {
                // A completion retires our oldest WRITEs, in posting order.
                let mut last = None;
                for _ in 0..=input.u8() % 4 {
                    let Some((mark, ..)) = self.writes.pop_front() else { break };
                    last = Some(mark);
                }
                if let Some(mark) = last {
                    self.s.on_ring_written(mark);
                }
            }
            4 if self.s.role() == Role::Client && !self.calls.is_empty() => {
                // The caller gives up on a call, or takes its answer.
                let k = usize::from(input.u8()) % self.calls.len();
                let (slot, generation) = self.calls[k];
                if self.s.take_done(slot, generation) {
                    self.calls.swap_remove(k);
                } else {
                    let now = self.now;
                    let _ = self.s.abandon_call(slot, generation, false, || now);
                    self.calls.swap_remove(k);
                }
            }
            _ => {}
        }
    }

    /// Server: the peer copies out a body we placed in its ring at `offset` and frees it.
    fn peer_takes(&mut self, offset: u32, len: u32) {
        if let Ok(t) = self.peer_consumer.accept(offset, len) {
            self.peer_consumer.release(t);
        }
    }

    /// Server: answers the oldest unanswered call with a body of the fuzzer's length.
    fn server_answer(&mut self, input: &mut Input<'_>) {
        let Some(c) = self.s.unanswered.first().copied() else { return };
        if !self.s.on_answer_for(c.slot, c.generation) {
            return;
        }
        // Half of them at most twice the peer's ring, so that ring placements, wrapping and
        // reuse of the ring (and of the ranges our WRITEs still read) are common.
        let len = match input.u8() & 1 {
            0 => u32::from(input.u16()),
            _ => u32::from(input.u16()) % (2 * self.s.params().peer_ring_len),
        };
        match self.s.place_body(len as usize) {
            Ok(Placement::Pieces) => self.pieces.push(len),
            Ok(Placement::Ring(off)) => {
                self.post_write(off, len);
                self.peer_takes(off, len);
            }
            Ok(Placement::Eager) | Err(_) => {}
        }
        let mut h = Header { slot: c.slot, generation: c.generation, ..Header::new(Kind::Response) };
        self.send(&mut h);
    }

    /// Client: starts a call and sends what may go.
    fn client_call(&mut self, input: &mut Input<'_>) {
        let stream = match input.u8() % 4 {
            0 => STREAM_IN,
            1 => STREAM_OUT | STREAM_IN,
            _ => 0,
        };
        if let Some(call) = self.s.start_call(1, None, stream) {
            self.calls.push(call);
        }
        let now = self.now;
        while let Some(mut h) = self.s.next_request(|| now) {
            self.send(&mut h);
        }
    }

    /// What holds whatever the peer sent.
    fn check(&self) {
        let s = &self.s;
        let p = s.params();
        let credits = usize::from(p.credits);
        match s.role() {
            Role::Server => {
                assert!(s.unanswered.len() <= credits, "more requests unanswered than credits");
                assert!(s.events.len() <= credits + 1, "events: {} for {credits} credits", s.events.len());
                assert!(usize::from(s.acks_due) <= credits, "CancelAcks due beyond the credits");
            }
            Role::Client => {
                assert!(s.calls().in_flight() <= p.credits, "more calls in flight than credits");
            }
        }
        assert!(
            s.assemblies.len() <= p.max_held.max(credits),
            "{} messages in reassembly for max_held {}",
            s.assemblies.len(),
            p.max_held
        );
        for a in &s.assemblies {
            assert!(a.body.len() <= a.header.total_len as usize, "an assembly past its total_len");
            assert!(a.header.total_len <= p.max_message, "an assembly over max_message");
            assert!(!a.refused || a.body.is_empty() && a._charge.is_none(), "a refused body kept");
        }
        if let Some((held, share)) = &self.reassembly {
            let charged: u64 =
                s.assemblies.iter().filter_map(|a| a._charge.as_ref()).map(|c| c.bytes()).sum();
            assert_eq!(charged, held.used(), "the count is this session's charges");
            assert!(charged <= held.cap() && charged <= *share, "{charged} bytes held over the cap or share");
        }
        assert!(s.streams.list.len() <= credits * 2 + 1, "{} streams open", s.streams.list.len());
        // Controls waiting: a CancelAck per credit, a grant per stream, a Cancel per call slot.
        let bound = credits + s.streams.list.len() + p.max_held + 2;
        assert!(s.controls.len() <= bound, "{} controls waiting (bound {bound})", s.controls.len());
        for st in &s.streams.list {
            assert!(st.send_grants <= MAX_STREAM_BUDGET, "stream send grants beyond the budget");
        }
    }
}

/// Drives one session against a peer whose headers come from `data` (see the module docs).
///
/// # Panics
/// When an invariant breaks (that is the point: the fuzzer reports it).
#[doc(hidden)]
pub fn fuzz_session(data: &[u8]) {
    let mut input = Input(data);
    let mut h = Harness::new(&mut input);
    while !input.is_empty() && !h.s.is_closed() {
        if input.u8() & 1 == 0 {
            let pick = input.u8();
            let header = match h.peer_piece(pick >> 1) {
                Some(piece) if pick & 1 == 0 => piece,
                _ => h.peer_header(&mut input),
            };
            if h.receive(header).is_err() {
                h.check();
                return;
            }
        } else {
            h.drive(&mut input);
        }
        h.check();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        /// The fuzz property on random input, so `cargo test` exercises it without cargo-fuzz.
        #[test]
        fn a_hostile_peer_breaks_no_session_invariant(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            super::fuzz_session(&data);
        }
    }

    /// Found by `cargo fuzz run session_peer`: a first ring piece longer than its message's
    /// `total_len` was accepted and copied out (up to a ring's length past the message) before
    /// `piece_done` refused it; now the header is refused before anything is copied.
    #[test]
    fn a_first_piece_longer_than_its_message_is_refused_before_the_copy() {
        super::fuzz_session(&[
            1, 0, 0, 0, 10, 0, 0, 1, 0, 0, 0, 10, 0, 8, 190, 190, 136, 179, 13, 33, 190, 190, 190, 28, 190,
            190, 190, 176, 0, 190,
        ]);
    }
}
