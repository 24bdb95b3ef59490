//! The reassembly policy of [`Session::set_reassembly`]: over the shared cap a body in pieces
//! refuses its call alone (its pieces dropped, the session kept); over its session's share it
//! closes the session; a client refuses an answer over its own cap and times out one that does
//! not finish.

use super::*;
use crate::status::Code;
use std::sync::Arc;

const RING: u32 = 1 << 20;
const PIECE: u32 = 256 << 10;

fn params() -> SessionParams {
    SessionParams {
        id: 5,
        credits: 4,
        eager_threshold: 16,
        max_message: 8 << 20,
        peer_ring_len: RING,
        own_ring_len: RING,
        max_held: 4,
    }
}

/// A session receiving bodies in pieces, with its own place in its ring.
struct Receiver {
    s: Session,
    at: u32,
}

impl Receiver {
    fn new(role: Role, held: &Arc<HeldBytes>, share: u64) -> Receiver {
        let mut s = Session::new(role, params());
        s.set_reassembly(held.clone(), share, Duration::from_secs(10));
        Receiver { s, at: 0 }
    }

    /// Receives one piece of `len` bytes of the body of `total` bytes on `slot` (a request at a
    /// server, a response at a client), copied out as a driver does (not when dropped).
    fn piece(&mut self, slot: u16, len: u32, total: u32, now: Instant) -> Result<Option<Complete>, String> {
        let kind = if self.s.role() == Role::Server { Kind::Request } else { Kind::Response };
        let h = Header {
            method: 1,
            session: 5,
            slot,
            generation: 1,
            in_ring: true,
            ring_offset: self.at,
            body_len: len,
            total_len: total,
            ..Header::new(kind)
        };
        let piece = self.s.handle_header(&h, || now).map_err(String::from)?.ring.expect("a ring piece");
        self.at = (self.at + len) % RING;
        if !piece.dropped() {
            let b = self.s.piece_buffer(&piece);
            b.resize(b.len() + len as usize, 7);
        }
        self.s.piece_done(piece).map_err(String::from)
    }

    /// Receives a whole body of `total` bytes on `slot` in pieces.
    fn body(&mut self, slot: u16, total: u32, now: Instant) -> Option<Complete> {
        let mut left = total;
        loop {
            let len = left.min(PIECE);
            let done = self.piece(slot, len, total, now).unwrap();
            left -= len;
            if left == 0 {
                return done;
            }
            assert!(done.is_none());
        }
    }
}

/// Two sessions share a 3 MiB cap: the first holds 2 MiB; the second's 2 MiB body would take
/// the count over the cap, so that call alone is answered RESOURCE_EXHAUSTED naming the cap and
/// its value, its pieces are dropped (nothing allocated or charged) while its session keeps
/// taking calls; once the first body is done, the same body of the second session goes through.
#[test]
fn over_the_shared_cap_a_body_refuses_its_call_not_its_session() {
    let t0 = Instant::now();
    let held = HeldBytes::new(3 << 20, "ServerConfig::max_reassembly_bytes");
    let mut a = Receiver::new(Role::Server, &held, 2 << 20);
    let mut b = Receiver::new(Role::Server, &held, 2 << 20);
    assert!(a.piece(0, PIECE, 2 << 20, t0).unwrap().is_none());
    assert_eq!(held.used(), 2 << 20);
    // b's body: refused at its first piece, answered at once.
    assert!(b.piece(0, PIECE, 2 << 20, t0).unwrap().is_none());
    let e = b.s.poll_event().expect("the refusal");
    assert!(matches!(e, Event::Refused { slot: 0, generation: 1, total_len: 2097152, .. }), "{e:?}");
    let (h, status) = e.answer().expect("an answer");
    assert_eq!((h.kind, h.slot, h.generation), (Kind::Response, 0, 1));
    assert_eq!(status.code(), Code::ResourceExhausted);
    for part in ["ServerConfig::max_reassembly_bytes", "3145728", "2097152"] {
        assert!(status.message().contains(part), "`{part}` not in {status}");
    }
    assert_eq!(b.s.live_call(0, 1), None, "the refused call is answered, not dispatched");
    assert_eq!(held.used(), 2 << 20, "nothing charged for the refused body");
    // b keeps taking calls meanwhile, and its refused body's pieces are dropped as they come.
    let eager = Header { method: 1, session: 5, slot: 1, generation: 1, ..Header::new(Kind::Request) };
    assert!(b.s.handle_header(&eager, || t0).is_ok());
    for _ in 0..6 {
        assert!(b.piece(0, PIECE, 2 << 20, t0).unwrap().is_none());
    }
    assert_eq!(b.s.assemblies(), 1);
    assert!(b.piece(0, PIECE, 2 << 20, t0).unwrap().is_none(), "the last piece dispatches nothing");
    assert_eq!((b.s.assemblies(), b.s.poll_event()), (0, None));
    // The first body finishes: its charge comes back, and b's next body is taken.
    for _ in 0..6 {
        assert!(a.piece(0, PIECE, 2 << 20, t0).unwrap().is_none());
    }
    assert!(a.piece(0, PIECE, 2 << 20, t0).unwrap().is_some());
    assert_eq!(held.used(), 0);
    b.s.on_answer_for(0, 1);
    let done = b.body(2, 2 << 20, t0).expect("complete");
    assert_eq!((done.body.len(), done.refused), (2 << 20, None));
}

/// A session that alone would hold more than its share (2.5 MiB) is closed: the reason names
/// `max_reassembly_bytes_per_session` and the driver counts it as over the cap; the shared
/// count is untouched by the refused body.
#[test]
fn over_its_share_a_session_is_closed() {
    let t0 = Instant::now();
    let held = HeldBytes::new(64 << 20, "ServerConfig::max_reassembly_bytes");
    let mut a = Receiver::new(Role::Server, &held, 5 << 19);
    assert!(a.piece(0, PIECE, 2 << 20, t0).unwrap().is_none());
    let e = a.piece(1, PIECE, 1 << 20, t0).unwrap_err();
    assert!(e.contains("ServerConfig::max_reassembly_bytes_per_session"), "{e}");
    assert!(is_reassembly_cap(&violation(&e)));
    assert_eq!(held.used(), 2 << 20);
    // Within the share, a second body is taken.
    assert!(a.piece(1, PIECE, 512 << 10, t0).unwrap().is_none());
    assert_eq!(held.used(), (2 << 20) + (512 << 10));
}

/// A client's answer over its own cap ends its call RESOURCE_EXHAUSTED naming
/// `ClientConfig::max_reassembly_bytes` once its last piece is in (nothing kept meanwhile); an
/// answer that does not finish within the reassembly timeout becomes
/// [`Event::ReassemblyExpired`].
#[test]
fn a_client_refuses_answers_over_its_cap_and_times_out_unfinished_ones() {
    let t0 = Instant::now();
    let held = HeldBytes::new(1 << 20, "ClientConfig::max_reassembly_bytes");
    let mut c = Receiver::new(Role::Client, &held, u64::MAX);
    let done = c.body(0, 2 << 20, t0).expect("the call ends");
    let status = done.refused.expect("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("ClientConfig::max_reassembly_bytes (1048576 bytes)"), "{status}");
    assert_eq!((done.body.len(), held.peak()), (0, 0));
    // Within the cap: taken whole.
    let ok = c.body(1, 1 << 20, t0).expect("complete");
    assert_eq!((ok.body.len(), ok.refused), (1 << 20, None));
    // A hostile server starts an answer and never finishes it.
    assert!(c.piece(2, PIECE, 1 << 20, t0).unwrap().is_none());
    assert_eq!(c.s.poll_timeout(true), Some(t0 + Duration::from_secs(10)));
    c.s.handle_timeout(t0 + Duration::from_secs(10), true);
    assert_eq!(c.s.poll_event(), Some(Event::ReassemblyExpired { waited: Duration::from_secs(10) }));
}
