//! The lease of a receive ring (protocol 12, `wire::ring_lease`): the policy of when a ring is
//! asked for, granted, refused, reclaimed and released. Sans-IO like the rest of the session:
//! the drivers register, bind and drop the memory; this module decides when.
//!
//! Each end's view of one ring:
//! - the grantee (the producer, who WRITEs the ring: the client for the server's ring) asks
//!   with a RingAsk when a body above the eager threshold finds no grant, waits for the answer
//!   (its bodies wait in its outbox as for a full ring), writes the ring once granted, and when
//!   the granter reclaims it stops placing bodies there and answers a RingRelease as soon as no
//!   WRITE of its into the ring is unretired ([`Session::next_lease_control`]). A body waiting
//!   after that asks again.
//! - the granter (the consumer: the server for its own ring) grants or refuses each ask (the
//!   driver decides with its caps and registers the ring, [`Session::ring_answer`]),
//!   reclaims a ring the peer has not written for its idle time ([`Session::sweep_own_ring`],
//!   driven by the worker's sweep), drops it when the RingRelease comes, and drops it anyway
//!   when none comes within the same time again ([`OwnSweep::Revoke`]: the window is gone, so
//!   a later WRITE of the peer fails with a remote access error and breaks only its session).
//!
//! What a peer may send and when is checked here ([`Session::check_lease_header`]): a grant
//! not asked for, an ask while one is asked or granted, a release not asked for, a reclaim with
//! no ring granted, or a ring body with no ring granted is a protocol violation (the session
//! closes). So at most one RingAsk and one RingRelease of a client are ever unanswered, which
//! is what the server reserves receive WQEs for (`endpoint::conn::srq_need`).

use std::time::{Duration, Instant};

use super::{RingConsumer, RingProducer, Role, Session};
use crate::status::Status;
use crate::wire::ring_lease::RingGrant;
use crate::wire::{Header, Kind};

/// The grantee's view of the peer's ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PeerRing {
    /// Given at the handshake, kept for the session's life (the client's ring at a server).
    Fixed,
    /// No grant, none asked for.
    None,
    /// A body waits for a grant: a RingAsk is due.
    AskDue,
    /// A RingAsk is on its way; the answer has not come.
    Asked,
    /// Granted: bodies go into it.
    Granted,
    /// The granter reclaims it: no new body goes into it; a RingRelease goes once none of our
    /// WRITEs into it is unretired. `wanted`: a body waits meanwhile (ask again after).
    Releasing { wanted: bool },
}

/// The granter's view of its own ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OwnRing {
    /// Given at the handshake, kept for the session's life (the client's own ring).
    Fixed,
    /// Nothing granted.
    None,
    /// A RingAsk arrived: the driver grants or refuses it ([`Session::ring_answer`]).
    Asked,
    /// The driver's answer, to send ([`Session::next_lease_control`]).
    Answer(Result<RingGrant, Status>),
    /// Granted; the consumer's `accepted` count was `mark` at the sweep of `since` (`None`:
    /// no sweep has seen it yet).
    Granted { mark: u32, since: Option<Instant> },
    /// The sweep of `since` found it idle: a RingReclaim is due.
    ReclaimDue { since: Instant },
    /// A RingReclaim went (due since `since`); the ring is written still until the RingRelease.
    Reclaiming { since: Instant },
    /// Dropped without a RingRelease (none came in time): the peer's late RingRelease is taken
    /// quietly, anything else of the ring is a protocol violation.
    Revoked,
}

/// A lease message to send ([`Session::next_lease_control`]); the driver writes its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseMsg {
    /// A RingAsk for this many bytes.
    Ask(u32),
    /// A RingRelease.
    Release,
    /// A granting RingGrant.
    Grant(RingGrant),
    /// A refusing RingGrant with this status.
    Refuse(Status),
    /// A RingReclaim.
    Reclaim,
}

impl LeaseMsg {
    /// The message's header (the driver adds the body: [`crate::wire::ring_lease`]).
    pub fn header(&self) -> Header {
        match self {
            LeaseMsg::Ask(_) => Header::new(Kind::RingAsk),
            LeaseMsg::Release => Header::new(Kind::RingRelease),
            LeaseMsg::Grant(_) => Header::new(Kind::RingGrant),
            LeaseMsg::Refuse(s) => Header { status: s.code(), ..Header::new(Kind::RingGrant) },
            LeaseMsg::Reclaim => Header::new(Kind::RingReclaim),
        }
    }
}

/// What the granter's sweep asks of the driver ([`Session::sweep_own_ring`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnSweep {
    /// Nothing to do.
    Keep,
    /// A RingReclaim is due (queue the session's controls).
    Reclaim,
    /// The peer did not release in time: drop the ring (its window with it) now.
    Revoke,
}

impl Session {
    /// Client: the server's ring is granted on demand (protocol 12); call once, before anything
    /// is placed. Without it the peer's ring is the one the handshake gave.
    pub fn lease_peer_ring(&mut self) {
        self.set_peer_ring(PeerRing::None);
    }

    /// Server: our ring is granted on demand (protocol 12); call once, before any header is
    /// handled. Without it our ring is the one the handshake gave.
    pub fn lease_own_ring(&mut self) {
        self.set_own_ring(OwnRing::None);
    }

    /// Whether bodies may be placed in the peer's ring now (given at the handshake, or granted
    /// and not being reclaimed).
    #[inline]
    pub fn peer_ring_ready(&self) -> bool {
        matches!(self.peer_ring, PeerRing::Fixed | PeerRing::Granted)
    }

    /// A body above the eager threshold looks for the peer's ring: whether it may be placed
    /// now; if not, a grant is asked for (a RingAsk is due, unless asked already) and the body
    /// waits as for a full ring.
    pub fn ask_peer_ring(&mut self) -> bool {
        self.want_peer_ring();
        self.peer_ring_ready()
    }

    /// A body found no grant ([`Session::place_body`], [`Session::next_piece`]): ask for one
    /// (a RingAsk is due) unless asked already or being released.
    #[cold]
    pub(crate) fn want_peer_ring(&mut self) {
        match &mut self.peer_ring {
            PeerRing::None => self.set_peer_ring(PeerRing::AskDue),
            PeerRing::Releasing { wanted } => *wanted = true,
            _ => {}
        }
    }

    /// Whether a lease message may be due ([`Session::next_lease_control`]): one load (the
    /// flag the setters keep; the drivers ask at every flush, and the states' niche-packed
    /// discriminants cost a dozen instructions to match).
    #[inline]
    pub fn lease_pending(&self) -> bool {
        debug_assert_eq!(self.lease_due, self.lease_due_now(), "lease_due out of step with the lease states");
        self.lease_due
    }

    /// [`Session::lease_pending`] computed from the states.
    fn lease_due_now(&self) -> bool {
        matches!(self.peer_ring, PeerRing::AskDue | PeerRing::Releasing { .. })
            || matches!(self.own_ring, OwnRing::Answer(_) | OwnRing::ReclaimDue { .. })
    }

    /// The one way `peer_ring` changes state: keeps [`Session::lease_pending`]'s flag.
    #[inline]
    fn set_peer_ring(&mut self, r: PeerRing) {
        self.peer_ring = r;
        self.lease_due = self.lease_due_now();
    }

    /// The one way `own_ring` changes state: keeps [`Session::lease_pending`]'s flag.
    #[inline]
    fn set_own_ring(&mut self, r: OwnRing) {
        self.own_ring = r;
        self.lease_due = self.lease_due_now();
    }

    /// The lease message to send now, if any. As grantee: a RingAsk (for the handshake's ring
    /// length) or a RingRelease, once none of our WRITEs into the reclaimed ring is unretired
    /// (then the ring is forgotten: nothing is placed until a new grant). As granter: the answer
    /// to an ask (a grant starts our ring's consumer over: queue it before anything else, so
    /// every later header's freed head counts the new ring) or a RingReclaim. Take it only when
    /// a send buffer is at hand: it is gone from the session.
    pub fn next_lease_control(&mut self) -> Option<LeaseMsg> {
        match self.peer_ring {
            PeerRing::AskDue => {
                self.set_peer_ring(PeerRing::Asked);
                return Some(LeaseMsg::Ask(self.params.peer_ring_len));
            }
            // Only once the granter reported every body and piece freed (the RingReclaim
            // carries its freed head; bodies that crossed it are reported by a RingReturn): the
            // server meters the lease messages as pieces, so none may be on its receive queue
            // next to ours.
            PeerRing::Releasing { wanted } if self.producer.unretired() == 0 && self.producer.used() == 0 => {
                self.set_peer_ring(if wanted { PeerRing::AskDue } else { PeerRing::None });
                return Some(LeaseMsg::Release);
            }
            _ => {}
        }
        let own = std::mem::replace(&mut self.own_ring, OwnRing::None);
        self.lease_due = self.lease_due_now();
        match own {
            OwnRing::Answer(Ok(g)) => {
                self.consumer = RingConsumer::new(g.len, self.params.max_held.max(1));
                self.params.own_ring_len = g.len;
                self.set_own_ring(OwnRing::Granted { mark: self.consumer.accepted(), since: None });
                Some(LeaseMsg::Grant(g))
            }
            OwnRing::Answer(Err(s)) => Some(LeaseMsg::Refuse(s)),
            OwnRing::ReclaimDue { since } => {
                self.set_own_ring(OwnRing::Reclaiming { since });
                Some(LeaseMsg::Reclaim)
            }
            other => {
                self.set_own_ring(other);
                None
            }
        }
    }

    /// Client: the granting RingGrant's ring of `len` bytes (its header was checked by
    /// [`Session::handle_header`]): bodies go into it from an empty state.
    ///
    /// # Errors
    /// A protocol violation when `len` is not the length the handshake gave (close the session).
    pub fn ring_granted(&mut self, len: u32) -> Result<(), &'static str> {
        if len != self.params.peer_ring_len {
            return Err("ring granted of another length than the handshake's");
        }
        self.producer = match self.role {
            Role::Server => RingProducer::with_max_units(len, super::ring_units(self.params.credits)),
            Role::Client => RingProducer::new(len),
        };
        self.placed = (self.producer.mark(), self.producer.mark());
        self.set_peer_ring(PeerRing::Granted);
        Ok(())
    }

    /// Client: the RingGrant refused the ask: no grant now. The driver fails the bodies that
    /// waited for it (RESOURCE_EXHAUSTED naming the cap, from the refusal); a later body asks
    /// again.
    pub fn ring_refused(&mut self) {
        if self.peer_ring == PeerRing::Asked {
            self.set_peer_ring(PeerRing::None);
        }
    }

    /// Whether our ring is granted (or fixed): ring bodies may arrive.
    #[inline]
    pub fn own_ring_live(&self) -> bool {
        matches!(
            self.own_ring,
            OwnRing::Fixed
                | OwnRing::Granted { .. }
                | OwnRing::ReclaimDue { .. }
                | OwnRing::Reclaiming { .. }
        )
    }

    /// Whether a RingAsk waits for the driver's answer ([`Session::ring_answer`]).
    pub fn own_ring_asked(&self) -> bool {
        self.own_ring == OwnRing::Asked
    }

    /// Server: the driver's answer to the RingAsk: a ring it registered (and bound to the QP)
    /// for the peer, or the refusal's status (RESOURCE_EXHAUSTED naming the cap). Sent with the
    /// session's next controls ([`Session::next_lease_control`]). Ignored unless asked.
    pub fn ring_answer(&mut self, answer: Result<RingGrant, Status>) {
        if self.own_ring == OwnRing::Asked {
            self.set_own_ring(OwnRing::Answer(answer));
        }
    }

    /// Server: the RingRelease arrived, or the ring was revoked: whether the driver must drop
    /// the ring now (it holds one no peer may write any more).
    pub fn own_ring_droppable(&self) -> bool {
        matches!(self.own_ring, OwnRing::None | OwnRing::Revoked)
    }

    /// Server, from the worker's sweep: a granted ring the peer has not written since the
    /// sweep `idle` ago (no body accepted, none held or arriving in pieces) is reclaimed
    /// ([`OwnSweep::Reclaim`]); one reclaimed `idle` ago with no RingRelease is revoked
    /// ([`OwnSweep::Revoke`]).
    pub fn sweep_own_ring(&mut self, now: Instant, idle: Duration) -> OwnSweep {
        match self.own_ring {
            OwnRing::Granted { mark, since } => {
                let at = self.consumer.accepted();
                match since {
                    Some(t) if at == mark && !self.consumer.holds() && self.assemblies.is_empty() => {
                        if now.saturating_duration_since(t) >= idle {
                            self.set_own_ring(OwnRing::ReclaimDue { since: now });
                            return OwnSweep::Reclaim;
                        }
                    }
                    _ => self.set_own_ring(OwnRing::Granted { mark: at, since: Some(now) }),
                }
                OwnSweep::Keep
            }
            OwnRing::ReclaimDue { since } | OwnRing::Reclaiming { since }
                if now.saturating_duration_since(since) >= idle =>
            {
                self.set_own_ring(OwnRing::Revoked);
                OwnSweep::Revoke
            }
            _ => OwnSweep::Keep,
        }
    }

    /// The lease rules of a received header (before anything else of it is applied): who may
    /// send which lease message when, and a ring body only into a live ring. Returns whether
    /// the header's `freed_head` is to be skipped (a RingGrant's, which counts the new ring's
    /// consumer: the producer starts over with it).
    ///
    /// # Errors
    /// A protocol violation (close the session).
    pub(super) fn check_lease_header(&mut self, h: &Header) -> Result<bool, &'static str> {
        if h.in_ring && !self.own_ring_live() {
            return Err("ring body with no ring granted");
        }
        match (self.role, h.kind) {
            (Role::Server, Kind::RingAsk) => {
                // Metered as a piece (`endpoint::conn::srq_need`'s row of pieces).
                self.meter.piece()?;
                if self.own_ring != OwnRing::None {
                    return Err("ring asked for while one is granted, asked for or not released");
                }
                self.set_own_ring(OwnRing::Asked);
            }
            (Role::Server, Kind::RingRelease) => {
                self.meter.piece()?;
                if !matches!(self.own_ring, OwnRing::Reclaiming { .. } | OwnRing::Revoked) {
                    return Err("ring release not asked for");
                }
                self.set_own_ring(OwnRing::None);
            }
            (Role::Client, Kind::RingGrant) => {
                if self.peer_ring != PeerRing::Asked {
                    return Err("ring grant not asked for");
                }
                // The driver reads its body: `ring_granted` or `ring_refused`.
                return Ok(true);
            }
            (Role::Client, Kind::RingReclaim) => {
                if self.peer_ring != PeerRing::Granted {
                    return Err("ring reclaim with no ring granted");
                }
                self.set_peer_ring(PeerRing::Releasing { wanted: false });
            }
            (Role::Server, Kind::RingGrant | Kind::RingReclaim) => {
                return Err("ring grant or reclaim sent to a server")
            }
            (Role::Client, Kind::RingAsk | Kind::RingRelease) => {
                return Err("ring ask or release sent to a client")
            }
            _ => {}
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{Placement, SessionParams};
    use crate::status::Code;

    const RING: u32 = 1 << 16;

    fn session(role: Role) -> Session {
        let params = SessionParams {
            id: 5,
            credits: 4,
            eager_threshold: 1024,
            max_message: 1 << 20,
            peer_ring_len: RING,
            own_ring_len: RING,
            max_held: 8,
        };
        let mut s = Session::new(role, params);
        match role {
            Role::Client => s.lease_peer_ring(),
            Role::Server => s.lease_own_ring(),
        }
        s
    }

    fn header(kind: Kind) -> Header {
        Header { session: 5, ..Header::new(kind) }
    }

    #[test]
    fn a_body_without_a_grant_waits_asks_once_and_goes_into_the_granted_ring() {
        let t = Instant::now();
        let mut c = session(Role::Client);
        assert!(!c.lease_pending(), "nothing asked while idle");
        assert_eq!(c.place_body(4096), Ok(Placement::Pieces), "waits as for a full ring");
        assert_eq!(c.next_piece(4096), None);
        assert_eq!(c.next_lease_control(), Some(LeaseMsg::Ask(RING)));
        assert_eq!(c.next_lease_control(), None, "one ask");
        assert_eq!(c.place_body(4096), Ok(Placement::Pieces));
        assert_eq!(c.next_lease_control(), None, "still one ask");
        c.handle_header(&header(Kind::RingGrant), || t).unwrap();
        assert_eq!(c.ring_granted(RING / 2), Err("ring granted of another length than the handshake's"));
        c.ring_granted(RING).unwrap();
        assert_eq!(c.place_body(4096), Ok(Placement::Ring(0)));
        assert!(c.ask_peer_ring());
        // A second grant was never asked for.
        assert!(c.handle_header(&header(Kind::RingGrant), || t).is_err());
    }

    #[test]
    fn after_a_refusal_a_later_body_asks_again() {
        let t = Instant::now();
        let mut c = session(Role::Client);
        assert!(!c.ask_peer_ring());
        assert_eq!(c.next_lease_control(), Some(LeaseMsg::Ask(RING)));
        let refused = Header { status: Code::ResourceExhausted, ..header(Kind::RingGrant) };
        c.handle_header(&refused, || t).unwrap();
        c.ring_refused();
        assert!(!c.lease_pending(), "no ask until a body wants the ring");
        assert!(!c.ask_peer_ring());
        assert_eq!(c.next_lease_control(), Some(LeaseMsg::Ask(RING)));
    }

    #[test]
    fn a_reclaimed_ring_is_released_only_once_no_write_is_unretired_and_all_is_freed() {
        let t = Instant::now();
        let granted = || {
            let mut c = session(Role::Client);
            assert!(!c.ask_peer_ring());
            c.next_lease_control();
            c.handle_header(&header(Kind::RingGrant), || t).unwrap();
            c.ring_granted(RING).unwrap();
            assert_eq!(c.place_body(4096), Ok(Placement::Ring(0)));
            let mark = c.ring_write_mark();
            // The reclaim crosses the body: its WRITE is in flight, and not freed yet.
            c.handle_header(&header(Kind::RingReclaim), || t).unwrap();
            assert!(c.lease_pending());
            assert_eq!(c.next_lease_control(), None);
            assert_eq!(c.place_body(4096), Ok(Placement::Pieces), "nothing new goes into it");
            (c, mark)
        };
        let freed = |mark| Header { freed_head: mark, ..header(Kind::RingReturn) };
        // Freed by the server (early, or our completion not polled yet): still unretired.
        let (mut c, mark) = granted();
        c.handle_header(&freed(mark), || t).unwrap();
        assert_eq!(c.next_lease_control(), None, "a WRITE of ours is unretired");
        c.on_ring_written(mark);
        assert_eq!(c.next_lease_control(), Some(LeaseMsg::Release));
        // The body that waited asks again.
        assert_eq!(c.next_lease_control(), Some(LeaseMsg::Ask(RING)));
        // Retired but not freed: the server may not have taken it yet.
        let (mut c, mark) = granted();
        c.on_ring_written(mark);
        assert_eq!(c.next_lease_control(), None, "the server has not freed the body yet");
        c.handle_header(&freed(mark), || t).unwrap();
        assert_eq!(c.next_lease_control(), Some(LeaseMsg::Release));
        // A reclaim with no ring granted is a violation.
        assert!(c.handle_header(&header(Kind::RingReclaim), || t).is_err());
    }

    /// Also checks [`Session::lease_pending`]'s flag through the granter's states. Sabotaged:
    /// with `set_own_ring` not updating the flag, it failed ("lease_due out of step with the
    /// lease states").
    #[test]
    fn the_granter_reclaims_an_idle_ring_and_revokes_it_when_no_release_comes() {
        let t = Instant::now();
        let idle = Duration::from_millis(100);
        let at = |ms| t + Duration::from_millis(ms);
        let mut s = session(Role::Server);
        assert!(!s.own_ring_live());
        s.handle_header(&header(Kind::RingAsk), || t).unwrap();
        assert!(s.own_ring_asked());
        assert!(!s.lease_pending(), "nothing to send before the driver answers");
        let g = RingGrant { addr: 4096, len: RING, rkey: 9 };
        s.ring_answer(Ok(g));
        assert!(s.lease_pending(), "the answer waits to be sent");
        assert!(!s.own_ring_live(), "no body before the grant leaves");
        assert_eq!(s.next_lease_control(), Some(LeaseMsg::Grant(g)));
        assert!(!s.lease_pending(), "the grant was taken");
        assert!(s.own_ring_live());
        // The first sweep that sees it starts its idle time.
        assert_eq!(s.sweep_own_ring(at(1000), idle), OwnSweep::Keep);
        assert_eq!(s.sweep_own_ring(at(1050), idle), OwnSweep::Keep);
        assert!(!s.lease_pending());
        assert_eq!(s.sweep_own_ring(at(1100), idle), OwnSweep::Reclaim);
        assert!(s.lease_pending(), "the reclaim waits to be sent");
        assert_eq!(s.next_lease_control(), Some(LeaseMsg::Reclaim));
        assert!(!s.lease_pending(), "the reclaim was taken");
        assert!(s.own_ring_live(), "bodies that crossed the reclaim are taken");
        assert!(!s.own_ring_droppable());
        assert_eq!(s.sweep_own_ring(at(1150), idle), OwnSweep::Keep);
        assert_eq!(s.sweep_own_ring(at(1200), idle), OwnSweep::Revoke);
        assert!(s.own_ring_droppable() && !s.own_ring_live());
        assert_eq!(
            s.handle_header(
                &Header { in_ring: true, body_len: 2048, total_len: 2048, ..header(Kind::Request) },
                || t
            )
            .map(|_| ()),
            Err("ring body with no ring granted")
        );
    }

    #[test]
    fn the_granter_keeps_a_written_ring_and_takes_the_release_it_asked_for() {
        let t = Instant::now();
        let idle = Duration::from_millis(100);
        let at = |ms| t + Duration::from_millis(ms);
        let mut s = session(Role::Server);
        assert!(s.handle_header(&header(Kind::RingRelease), || t).is_err(), "a release never asked for");
        let mut s = session(Role::Server);
        s.handle_header(&header(Kind::RingAsk), || t).unwrap();
        s.ring_answer(Ok(RingGrant { addr: 4096, len: RING, rkey: 9 }));
        s.next_lease_control();
        assert!(s.handle_header(&header(Kind::RingAsk), || t).is_err(), "asked while granted");
        let mut s = session(Role::Server);
        s.handle_header(&header(Kind::RingAsk), || t).unwrap();
        s.ring_answer(Ok(RingGrant { addr: 4096, len: RING, rkey: 9 }));
        s.next_lease_control();
        assert_eq!(s.sweep_own_ring(at(0), idle), OwnSweep::Keep);
        // A body between two sweeps starts the idle time over.
        let body =
            Header { in_ring: true, method: 3, body_len: 2048, total_len: 2048, ..header(Kind::Request) };
        let piece = s.handle_header(&body, || t).unwrap().ring.expect("a ring body");
        s.piece_buffer(&piece).resize(2048, 0);
        assert!(s.piece_done(piece).unwrap().is_some());
        assert_eq!(s.sweep_own_ring(at(100), idle), OwnSweep::Keep, "written since the last sweep");
        assert_eq!(s.sweep_own_ring(at(150), idle), OwnSweep::Keep);
        assert_eq!(s.sweep_own_ring(at(200), idle), OwnSweep::Reclaim);
        assert_eq!(s.next_lease_control(), Some(LeaseMsg::Reclaim));
        assert!(!s.own_ring_droppable());
        s.handle_header(&header(Kind::RingRelease), || t).unwrap();
        assert!(s.own_ring_droppable() && !s.own_ring_live());
        // Asked for again after the release: a new grant.
        s.handle_header(&header(Kind::RingAsk), || t).unwrap();
        assert!(s.own_ring_asked());
    }
}
