//! Request credits granted on demand (protocol 12): the policy of when a server raises or lowers
//! a session's credits, what it reserves of its worker's SRQ for them, and what either end may
//! send meanwhile. Sans-IO like the rest of the session: the drivers post the receive buffers;
//! this module decides how many a session holds.
//!
//! A server grants few credits at the handshake (`ServerConfig::initial_credits`) and reserves
//! [`srq_need`] of them. A request that arrives with every granted credit taken (one compare on
//! the request path) raises the session: the credits double, up to its ceiling (the client's
//! window, at most `ServerConfig::credits_per_session`), if the worker's SRQ has the room
//! ([`SrqRoom`]: receive WQEs posted beyond the sessions' reservations); a raise refused for lack
//! of room leaves the session at its credits (its calls queue at the client as they always did).
//! A session with no call for the idle time ([`Session::sweep_credits`], the worker's sweep) is
//! lowered back to its initial credits. Each change is a [`Kind::CreditGrant`] whose `count` is
//! the new credits; the client takes it at once (its window follows: a lowering stops new
//! starts, calls in flight go on) and answers a [`Kind::CreditAck`] once its calls in flight fit
//! the new count. Until the acknowledgement the server accepts up to the larger of the old and
//! new credits and keeps the larger reservation (RC ordering puts every request sent under the
//! old credits before the acknowledgement); at most one grant is unacknowledged, which the
//! reservation counts (its CreditAck).
//!
//! What a peer may send is checked here: a request beyond the credits accepted, a CreditAck
//! with no grant unacknowledged (or repeating another count), a CreditGrant sent to a server, a
//! CreditGrant above the client's window or while one is unacknowledged are protocol
//! violations (the session closes).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ring_units, Role, Session};
use crate::wire::{Header, Kind};

/// Receive WQEs of the worker's SRQ a server session of `credits` reserves:
/// `2 × credits + max(credits, 16) + 32` (128 at 32 credits, 52 at 2). What a client that keeps
/// the protocol can have sent before the worker takes any of it (a worker held in a handler
/// takes nothing):
///
/// | messages | at most | why |
/// |---|---|---|
/// | Requests (the last or only piece of each) and stream SENDs (stream messages, the last or only piece of each; stream grants; stream ends) | `credits` + [`super::STREAM_RESERVED_CREDITS`] (8) | credits return with the answers; a stream SEND holds a credit until a server header counts it taken (`stream_taken`), and only stream SENDs use the 8 beyond `credits` |
/// | other pieces of ring bodies, RingAsks and RingReleases | 16 | each piece holds at least 1/16 of the ring ([`Session::next_piece`]); the ring lease's messages (protocol 12) count as pieces in the meter, and a client sends them only once we reported every piece freed ([`super::meter`]) |
/// | Cancels | `credits` | a Cancel holds its call's credit until the server's CancelAck arrives ([`super::CallSlots`]), so each credit covers at most one request and one Cancel, a Cancel that crossed its call's answer included |
/// | RingReturns | `max(credits, 16)` | each must free a ring body or piece of ours ([`super::meter`]), and we keep at most [`ring_units`] of them unfreed in the client's ring |
/// | Pings, Pongs | 4 + 2 | as the meter allows ([`super::meter`]): [`super::meter::MAX_PINGS`] between two messages of ours (the client pings after a third and two thirds of its `peer_timeout` of silence, and two silences can overlap one of our messages), and at most [`super::meter::MAX_PONGS_OWED`] Pongs owed for our Pings |
/// | Close | 1 | |
/// | CreditAck | 1 | at most one CreditGrant is unacknowledged (this module) |
///
/// `credits` is what the session accepts now: its granted credits, or while a grant is
/// unacknowledged the larger of the old and new ones. The sessions of one worker together
/// reserve at most the SRQ depth, so such a session never makes another's SENDs wait for a
/// receive WQE (RNR), whatever its calls and streams do. The server closes a session that sends
/// requests or stream SENDs beyond the first row ([`Session::handle_header`]).
pub fn srq_need(credits: u16) -> u32 {
    let c = u32::from(credits);
    // Stream SENDs share the request credits, plus a few of their own.
    let requests_and_stream_sends = c + u32::from(super::STREAM_RESERVED_CREDITS);
    let pieces = super::MAX_PIECES_IN_RING;
    // One per credit: the credit stays taken until the Cancel is acknowledged.
    let cancels = c;
    // Each must free a ring body or piece of ours, and we keep at most this many unfreed.
    let ring_returns = ring_units(credits);
    // Pings of the client and Pongs it owes ours, as the meter allows (`session::meter`).
    let probe = u32::from(super::meter::MAX_PINGS + super::meter::MAX_PONGS_OWED);
    let close = 1;
    let credit_ack = 1;
    requests_and_stream_sends + pieces + cancels + ring_returns + probe + close + credit_ack
}

/// Receive WQEs a server session of `credits` reserves while it holds no receive ring (protocol
/// 12's ring lease): [`srq_need`] with one WQE for pieces (its one RingAsk) instead of
/// [`super::MAX_PIECES_IN_RING`]; the other 15 are reserved when a ring is granted
/// ([`Session::reserve_ring_pieces`]). 37 at 2 credits.
pub fn srq_need_ringless(credits: u16) -> u32 {
    srq_need(credits) - (super::MAX_PIECES_IN_RING - 1)
}

/// A worker's SRQ as its sessions share it: receive WQEs posted, and reserved by the live
/// sessions. What is posted beyond the reservations is the pool that raises come from.
///
/// A session's reservation has two parts: its base, [`srq_need_ringless`] of its initial
/// credits (what it may send while idle: its first requests, a RingAsk, the probe, a Close),
/// and its extra (credits raised above the initial ones, a granted ring's pieces). Extras are
/// always reserved one by one. The bases are reserved one by one only up to `idle_share` WQEs
/// for all the worker's sessions together (`ServerConfig::srq_idle_wqes`): beyond it the
/// idle sessions share them, as every RPC system with one receive queue does (eRPC's sessions
/// share one RQ of a few thousand entries). What sharing gives up: when more idle sessions send
/// at once than the WQEs posted beyond the extras (between two polls of the worker, or while it
/// is held in a handler), some SENDs meet an empty SRQ and wait on RNR retry (the QPs retry
/// without limit, `rnr_retry` 7: a delay, nothing lost) until the worker reposts; with
/// `u32::MAX` no SEND of a session that keeps the protocol ever waits on another's.
///
/// One atomic word (bases in the high half, extras in the low): the listener reserves bases
/// for the sessions it admits, the worker's sessions their extras; both are rare next to calls.
#[derive(Debug)]
pub struct SrqRoom {
    /// `base << 32 | extra`: the sessions' bases summed, and their extras summed.
    reserved: AtomicU64,
    /// Most WQEs the bases are counted as (`ServerConfig::srq_idle_wqes`).
    idle_share: u32,
    posted: AtomicU32,
    /// What the live sessions would reserve at their most credits with a ring beyond their
    /// bases ([`srq_need`] of each one's ceiling less its base), summed; with the bases (as
    /// shared) it is what the listener posts, up to the SRQ's depth.
    full: AtomicU32,
    raised: AtomicU64,
    lowered: AtomicU64,
    refused: AtomicU64,
}

impl Default for SrqRoom {
    fn default() -> SrqRoom {
        SrqRoom {
            reserved: AtomicU64::new(0),
            idle_share: u32::MAX,
            posted: AtomicU32::new(0),
            full: AtomicU32::new(0),
            raised: AtomicU64::new(0),
            lowered: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

/// What a packed reservation word counts against the SRQ: the bases (at most `share`) and the
/// extras.
fn counted(word: u64, share: u32) -> u32 {
    let (base, extra) = ((word >> 32) as u32, word as u32);
    base.min(share).saturating_add(extra)
}

impl SrqRoom {
    /// An SRQ with nothing posted or reserved, whose sessions each reserve all they need.
    pub fn new() -> Arc<SrqRoom> {
        SrqRoom::sharing(u32::MAX)
    }

    /// An SRQ with nothing posted or reserved, whose sessions' bases count as at most
    /// `idle_share` WQEs together (`ServerConfig::srq_idle_wqes`; `u32::MAX`: no sharing).
    pub fn sharing(idle_share: u32) -> Arc<SrqRoom> {
        Arc::new(SrqRoom { idle_share, ..SrqRoom::default() })
    }

    /// WQEs reserved by the live sessions: their bases (at most the idle share) and extras.
    pub fn reserved(&self) -> u32 {
        counted(self.reserved.load(Ordering::Relaxed), self.idle_share)
    }

    /// The live sessions' bases summed, shared or not (`srq_need_ringless` of each one's
    /// initial credits).
    pub fn bases(&self) -> u32 {
        (self.reserved.load(Ordering::Relaxed) >> 32) as u32
    }

    /// WQEs posted to the SRQ.
    pub fn posted(&self) -> u32 {
        self.posted.load(Ordering::Relaxed)
    }

    /// `n` more WQEs were posted (never taken back while the server runs).
    pub fn add_posted(&self, n: u32) {
        self.posted.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `base` to the bases and `extra` to the extras if what is reserved stays within
    /// `cap`. Returns what was reserved before, or `Err` with it when it does not fit.
    fn take(&self, base: u32, extra: u32, cap: u32) -> Result<u32, u32> {
        let share = self.idle_share;
        self.reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                let b = ((w >> 32) as u32).checked_add(base)?;
                let e = (w as u32).checked_add(extra)?;
                let after = u64::from(b) << 32 | u64::from(e);
                (counted(after, share) <= cap).then_some(after)
            })
            .map(|w| counted(w, share))
            .map_err(|w| counted(w, share))
    }

    /// Reserves a session's base of `n` WQEs (it is being admitted) if the reservations stay
    /// within `cap`, the SRQ depth (its buffers are registered after). Returns the reservations
    /// before it, or `Err` with them when it does not fit.
    pub fn admit(&self, n: u32, cap: u32) -> Result<u32, u32> {
        self.take(n, 0, cap)
    }

    /// The session of [`SrqRoom::admit`]`(n)` is gone.
    pub fn leave(&self, n: u32) {
        self.reserved.fetch_sub(u64::from(n) << 32, Ordering::Relaxed);
    }

    /// Reserves `n` WQEs of a session's extra if the reservations stay within `cap`, what is
    /// posted. Returns the reservations before it, or `Err` with them when it does not fit.
    pub fn reserve(&self, n: u32, cap: u32) -> Result<u32, u32> {
        self.take(0, n, cap)
    }

    /// Gives `n` WQEs of a session's extra back.
    pub fn give_back(&self, n: u32) {
        self.reserved.fetch_sub(u64::from(n), Ordering::Relaxed);
    }

    /// A session admitted with its base may reach `n` WQEs more ([`srq_need`] of its most
    /// credits less its base): returns what the live sessions may reach together (their bases
    /// as shared, and this for each), which the listener posts (up to the SRQ's depth) so that
    /// raises and ring grants find room.
    pub fn add_full(&self, n: u32) -> u32 {
        let full = self.full.fetch_add(n, Ordering::Relaxed) + n;
        self.bases().min(self.idle_share).saturating_add(full)
    }

    /// The session of [`SrqRoom::add_full`]`(n)` is gone.
    pub fn sub_full(&self, n: u32) {
        self.full.fetch_sub(n, Ordering::Relaxed);
    }

    /// Raises granted, lowerings granted and raises refused for lack of room, since the start.
    pub fn grants(&self) -> (u64, u64, u64) {
        (
            self.raised.load(Ordering::Relaxed),
            self.lowered.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// One end's view of the session's request credits.
#[derive(Debug)]
pub(super) struct Credits {
    /// The credits granted last (the client's after it took the grant).
    pub(super) granted: u16,
    /// Server: what requests are accepted up to: `granted`, or while a grant is unacknowledged
    /// the larger of the old and new credits. The SRQ reservation is [`srq_need`] of it.
    pub(super) accept: u16,
    /// Server: the credits of a lowering (the handshake's).
    initial: u16,
    /// A CreditGrant of this count was sent (server) or taken (client) and not acknowledged.
    pub(super) unacked: Option<u16>,
    /// Client: the CreditAck of `unacked` is to go once the calls in flight fit it.
    pub(super) ack_due: bool,
    /// Server: requests admitted since our sends were last posted: when they reach the
    /// credits granted, the client had every credit in flight at once (none of their answers
    /// had left), though an inline handler answered each before the next was admitted.
    pub(super) since_flush: u16,
    /// Server: the SRQ this session reserves in (none: credits fixed at the handshake's).
    room: Option<Arc<SrqRoom>>,
    /// Server: the answers count at the sweep of `since` (none: no sweep saw the session idle).
    idle_mark: Option<(u32, Instant)>,
    /// Server: WQEs the reservation holds less than [`srq_need`] of `accept`: the pieces row
    /// beyond one while no receive ring is granted (15), else 0.
    ringless: u32,
    /// Server: its base in the SRQ ([`SrqRoom::admit`]: [`srq_need_ringless`] of `initial`);
    /// the rest of its reservation is its extra.
    base: u32,
    /// Server: what this session counts in its SRQ's `full` ([`SrqRoom::add_full`]).
    full: u32,
}

impl Credits {
    /// Credits fixed at `credits` (what a session without on-demand grants has).
    pub(super) fn fixed(credits: u16) -> Credits {
        Credits {
            granted: credits,
            accept: credits,
            initial: credits,
            unacked: None,
            ack_due: false,
            since_flush: 0,
            room: None,
            idle_mark: None,
            ringless: 0,
            base: 0,
            full: 0,
        }
    }
}

impl Drop for Credits {
    /// A server session's reservation goes back to its worker's SRQ with it.
    fn drop(&mut self) {
        if let Some(room) = &self.room {
            room.leave(self.base);
            room.give_back(srq_need(self.accept) - self.ringless - self.base);
            room.sub_full(self.full);
        }
    }
}

impl Session {
    /// Server: credits are granted on demand (protocol 12): the session starts at `initial`
    /// (1 ..= its ceiling, `params.credits`), whose [`srq_need_ringless`] the caller reserved
    /// as its base in `room` ([`SrqRoom::admit`]; no receive ring is granted yet,
    /// [`Session::lease_own_ring`]) and counted [`srq_need`] of the ceiling less it with
    /// [`SrqRoom::add_full`]; the session gives both back when dropped. Raises and a ring's
    /// pieces come from `room`'s WQEs posted beyond the reservations. Call once, after
    /// `lease_own_ring` and before any header is handled.
    pub fn grant_on_demand(&mut self, room: Arc<SrqRoom>, initial: u16) {
        let initial = initial.clamp(1, self.params.credits.max(1));
        let ringless = if self.own_ring_live() { 0 } else { srq_need(initial) - srq_need_ringless(initial) };
        let base = srq_need_ringless(initial);
        let full = srq_need(self.params.credits) - base;
        self.credits = Credits { room: Some(room), ringless, base, full, ..Credits::fixed(initial) };
        self.producer.set_max_units(ring_units(initial));
    }

    /// Server: a receive ring is about to be granted: reserves the WQEs of the pieces row its
    /// bodies may take (15 more than a ringless session holds) from the worker's SRQ room.
    /// Returns false, reserving nothing, when the SRQ has no room (refuse the ring).
    pub fn reserve_ring_pieces(&mut self) -> bool {
        let c = &mut self.credits;
        let Some(room) = &c.room else { return true };
        if c.ringless == 0 {
            return true;
        }
        if room.reserve(c.ringless, room.posted()).is_err() {
            return false;
        }
        c.ringless = 0;
        true
    }

    /// Server: the receive ring is gone (released, revoked, or its grant failed): the pieces
    /// row's WQEs go back to the worker's SRQ.
    pub fn release_ring_pieces(&mut self) {
        let c = &mut self.credits;
        let Some(room) = &c.room else { return };
        if c.ringless == 0 {
            c.ringless = super::MAX_PIECES_IN_RING - 1;
            room.give_back(c.ringless);
        }
    }

    /// Client: the handshake granted `credits` of the window (`params.credits`); a CreditGrant
    /// changes them.
    pub fn set_granted(&mut self, credits: u16) {
        let c = credits.clamp(1, self.params.credits.max(1));
        self.credits = Credits::fixed(c);
        self.calls.slots.set_credits(c);
    }

    /// The credits granted now (a client's: its window's bound; a server's: the last granted).
    pub fn credits(&self) -> u16 {
        self.credits.granted
    }

    /// Server: receive WQEs this session reserves of its worker's SRQ now ([`srq_need`] of the
    /// credits it accepts).
    pub fn srq_reserved(&self) -> u32 {
        srq_need(self.credits.accept) - self.credits.ringless
    }

    /// Our sends were posted (answers among them): requests admitted from now on count anew
    /// toward the raise signal (a request taking the last credit). A store.
    #[inline]
    pub fn on_flushed(&mut self) {
        self.credits.since_flush = 0;
    }

    /// Server: a request took the last granted credit (every credit unanswered, or as many
    /// requests admitted since our sends were last posted): raise the session if it may grow
    /// and the SRQ has room (the CreditGrant goes with the session's next controls).
    #[cold]
    #[inline(never)]
    pub(super) fn credits_full(&mut self) {
        let c = &mut self.credits;
        let Some(room) = &c.room else { return };
        if c.unacked.is_some() || c.granted >= self.params.credits {
            return;
        }
        let new = c.granted.saturating_mul(2).clamp(c.granted + 1, self.params.credits);
        let more = srq_need(new) - srq_need(c.accept);
        if room.reserve(more, room.posted()).is_err() {
            room.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        room.raised.fetch_add(1, Ordering::Relaxed);
        c.granted = new;
        c.accept = new;
        c.unacked = Some(new);
        self.producer.set_max_units(ring_units(new));
        self.controls.push_back(Header { count: new, ..Header::new(Kind::CreditGrant) });
    }

    /// Server, from the worker's sweep at `now`: a session raised above its initial credits
    /// that has had no call since the sweep `idle` ago (nothing unanswered, no stream, no body
    /// arriving, no Cancel to acknowledge, none of our bodies unfreed in the client's ring, no
    /// answer sent) is lowered back to them: a CreditGrant is due (queue the session's
    /// controls). Returns whether it was.
    pub fn sweep_credits(&mut self, now: Instant, idle: Duration) -> bool {
        let c = &self.credits;
        if c.room.is_none() || c.unacked.is_some() || c.granted <= c.initial {
            return false;
        }
        let answers = self.idle.answers;
        let quiet = self.unanswered.is_empty()
            && self.streams.list.is_empty()
            && self.assemblies.is_empty()
            && self.acks_due == 0
            && self.producer.units() == 0;
        match self.credits.idle_mark {
            Some((mark, since)) if quiet && mark == answers => {
                if now.saturating_duration_since(since) < idle {
                    return false;
                }
            }
            _ => {
                self.credits.idle_mark = quiet.then_some((answers, now));
                return false;
            }
        }
        let c = &mut self.credits;
        c.idle_mark = None;
        c.granted = c.initial;
        c.unacked = Some(c.initial);
        if let Some(room) = &c.room {
            room.lowered.fetch_add(1, Ordering::Relaxed);
        }
        // Bodies placed from now on keep within the new credits' RingReturns (none is unfreed
        // now), so the reservation may shrink at the acknowledgement.
        self.producer.set_max_units(ring_units(c.initial));
        self.controls.push_back(Header { count: c.initial, ..Header::new(Kind::CreditGrant) });
        true
    }

    /// The credit rules of a received CreditGrant or CreditAck.
    ///
    /// # Errors
    /// A protocol violation (close the session).
    #[cold]
    #[inline(never)]
    pub(super) fn on_credit_header(&mut self, h: &Header) -> Result<(), &'static str> {
        match (self.role, h.kind) {
            (Role::Server, Kind::CreditAck) => {
                let c = &mut self.credits;
                if c.unacked != Some(h.count) {
                    return Err("credit acknowledgement for no grant");
                }
                c.unacked = None;
                if let Some(room) = &c.room {
                    room.give_back(srq_need(c.accept) - srq_need(c.granted));
                }
                c.accept = c.granted;
                // Every credit may be taken already (the client waits for more): raise now.
                if self.unanswered.len() >= usize::from(self.credits.granted) {
                    self.credits_full();
                }
            }
            (Role::Server, Kind::CreditGrant) => return Err("credit grant sent to a server"),
            (Role::Client, Kind::CreditAck) => return Err("credit acknowledgement sent to a client"),
            (Role::Client, Kind::CreditGrant) => {
                if self.credits.unacked.is_some() {
                    return Err("credit grant while one is unacknowledged");
                }
                if h.count > self.params.credits {
                    return Err("credits granted above the window asked");
                }
                let c = &mut self.credits;
                c.granted = h.count;
                c.accept = h.count;
                c.unacked = Some(h.count);
                c.ack_due = true;
                self.calls.slots.set_credits(h.count);
            }
            _ => {}
        }
        Ok(())
    }

    /// Client: whether the CreditAck of the grant taken may go now: the calls in flight fit the
    /// new credits, and with the stream SENDs not yet counted taken the new send pool.
    #[inline]
    pub(super) fn credit_ack_ready(&self) -> bool {
        self.credits.ack_due
            && self.calls.slots.in_flight() <= self.credits.granted
            && u32::from(self.calls.slots.in_flight()) + self.sends.unreturned <= self.send_pool()
    }

    /// Client: the CreditAck to send now, if one is ready ([`Session::credit_ack_ready`]).
    pub(super) fn take_credit_ack(&mut self) -> Option<Header> {
        if !self.credit_ack_ready() {
            return None;
        }
        self.credits.ack_due = false;
        let count = self.credits.unacked.take()?;
        Some(Header { count, ..Header::new(Kind::CreditAck) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{ResponseFate, SessionParams};

    const WINDOW: u16 = 8;

    fn params(credits: u16) -> SessionParams {
        SessionParams {
            id: 5,
            credits,
            eager_threshold: 1024,
            max_message: 1 << 20,
            peer_ring_len: 1 << 16,
            own_ring_len: 1 << 16,
            max_held: usize::from(WINDOW),
        }
    }

    /// A server session of ceiling `WINDOW` at 2 credits on an SRQ with `spare` WQEs posted
    /// beyond its reservation, and its client.
    fn pair(spare: u32) -> (Session, Session, Arc<SrqRoom>) {
        let room = SrqRoom::new();
        let mut server = Session::new(Role::Server, params(WINDOW));
        server.lease_own_ring();
        room.admit(srq_need_ringless(2), u32::MAX).unwrap();
        room.add_posted(srq_need_ringless(2) + spare);
        server.grant_on_demand(room.clone(), 2);
        let mut client = Session::new(Role::Client, params(WINDOW));
        client.set_granted(2);
        (server, client, room)
    }

    /// Starts calls at the client while it may and delivers their requests to the server.
    fn send_calls(client: &mut Session, server: &mut Session, n: usize) -> Vec<Header> {
        let t = Instant::now();
        let mut sent = Vec::new();
        for _ in 0..n {
            client.start_call(7, None, 0).expect("a free slot");
        }
        while let Some(mut h) = client.next_request(|| t) {
            client.stamp(&mut h);
            server.handle_header(&h, || t).expect("a request within the credits");
            sent.push(h);
        }
        // The server posts what it queued (nothing answered: the raise signal is unanswered
        // calls alone here).
        server.on_flushed();
        sent
    }

    /// Answers `reqs` at the server and delivers the responses to the client.
    fn answer(client: &mut Session, server: &mut Session, reqs: &[Header]) {
        let t = Instant::now();
        for r in reqs {
            assert!(server.on_answer_for(r.slot, r.generation));
            let mut h =
                Header { slot: r.slot, generation: r.generation, method: 7, ..Header::new(Kind::Response) };
            server.stamp(&mut h);
            client.handle_header(&h, || t).unwrap();
            // Posted (as the driver's flush does after queueing).
            server.on_flushed();
            assert_eq!(client.on_response(r.slot, r.generation), Ok(ResponseFate::Stored));
            assert!(client.take_done(r.slot, r.generation));
        }
    }

    /// Moves every control message of `from` to `to`.
    fn controls(from: &mut Session, to: &mut Session) -> Vec<Header> {
        let t = Instant::now();
        let mut moved = Vec::new();
        while from.has_control() {
            let Some(mut h) = from.next_control() else { break };
            from.stamp(&mut h);
            to.handle_header(&h, || t).unwrap();
            moved.push(h);
        }
        moved
    }

    /// A session that uses all its credits is raised, doubling, to its ceiling, from the SRQ's
    /// room; the server accepts the new credits at once and keeps the reservation they need.
    /// Sabotaged: `credits_full` returning at once: failed ("one grant per raise").
    #[test]
    fn a_full_session_is_raised_to_its_ceiling_and_reserves_for_it() {
        let (mut server, mut client, room) = pair(1000);
        assert_eq!(room.reserved(), srq_need_ringless(2));
        let mut all = Vec::new();
        // Two calls take both credits (the second raises to 4), two more all 4 (to 8).
        for want in [4, 8] {
            all.extend(send_calls(&mut client, &mut server, 2));
            let grants = controls(&mut server, &mut client);
            assert_eq!(grants.len(), 1, "one grant per raise");
            assert_eq!((grants[0].kind, grants[0].count), (Kind::CreditGrant, want));
            assert_eq!(room.reserved(), srq_need_ringless(want));
            assert_eq!(client.credits(), want);
            let acks = controls(&mut client, &mut server);
            assert_eq!((acks[0].kind, acks[0].count), (Kind::CreditAck, want));
        }
        all.extend(send_calls(&mut client, &mut server, 4));
        assert_eq!((server.credits(), client.credits()), (WINDOW, WINDOW));
        assert_eq!(server.unanswered(), WINDOW);
        assert_eq!(room.grants(), (2, 0, 0));
        // At the ceiling: no more raises.
        assert!(!server.has_control());
        answer(&mut client, &mut server, &all);
        drop(server);
        assert_eq!(room.reserved(), 0, "a dropped session gives its reservation back");
    }

    /// With no room in the SRQ the raise is refused and the session goes on at its credits.
    /// Sabotaged: the room check against `u32::MAX` instead of what is posted: failed ("no
    /// grant").
    #[test]
    fn a_raise_without_room_leaves_the_session_at_its_credits() {
        let (mut server, mut client, room) = pair(0);
        let reqs = send_calls(&mut client, &mut server, 4);
        assert_eq!(reqs.len(), 2, "two credits: two calls on the wire, two queued");
        assert!(!server.has_control(), "no grant");
        assert_eq!(room.grants(), (0, 0, 1));
        assert_eq!(room.reserved(), srq_need_ringless(2));
        answer(&mut client, &mut server, &reqs);
        let more = send_calls(&mut client, &mut server, 0);
        assert_eq!(more.len(), 2, "the queued calls go as credits return");
        answer(&mut client, &mut server, &more);
        assert_eq!(client.credits(), 2);
    }

    /// A raised session idle for `credit_idle` is lowered back to its initial credits; the
    /// server accepts the old credits until the acknowledgement and gives the reservation back
    /// with it; the client acknowledges only once its calls in flight fit. Sabotaged: the sweep's
    /// `mark == answers` check dropped: failed (lowered while calls came and went).
    #[test]
    fn an_idle_session_is_lowered_and_gives_its_reservation_back_at_the_ack() {
        let (mut server, mut client, room) = pair(1000);
        let reqs = send_calls(&mut client, &mut server, 2);
        controls(&mut server, &mut client);
        controls(&mut client, &mut server);
        answer(&mut client, &mut server, &reqs);
        assert_eq!(server.credits(), 4);
        let t0 = Instant::now();
        let idle = Duration::from_secs(1);
        assert!(!server.sweep_credits(t0, idle), "the first look only marks");
        // A call between two looks keeps it raised.
        let reqs = send_calls(&mut client, &mut server, 1);
        answer(&mut client, &mut server, &reqs);
        assert!(!server.sweep_credits(t0 + idle, idle));
        assert!(!server.sweep_credits(t0 + idle + idle / 2, idle), "idle for half the time");
        // Calls started before the lowering arrives are on the wire under the old credits.
        let before = send_calls(&mut client, &mut server, 3);
        assert_eq!(before.len(), 3);
        answer(&mut client, &mut server, &before);
        assert!(!server.sweep_credits(t0 + 3 * idle, idle));
        assert!(server.sweep_credits(t0 + 4 * idle, idle), "idle for `idle`: lowered");
        assert_eq!(room.grants(), (1, 1, 0));
        // The client has 3 calls on the wire when the grant comes: no ack until 2 fit.
        let wire = send_calls(&mut client, &mut server, 3);
        assert_eq!(wire.len(), 3);
        let grant = controls(&mut server, &mut client);
        assert_eq!((grant[0].kind, grant[0].count), (Kind::CreditGrant, 2));
        assert_eq!(client.credits(), 2);
        assert!(controls(&mut client, &mut server).is_empty(), "3 in flight do not fit 2");
        assert_eq!(room.reserved(), srq_need_ringless(4), "the old reservation until the ack");
        answer(&mut client, &mut server, &wire[..1]);
        assert!(client.has_control(), "2 in flight fit 2");
        // One more answered before the ack arrives (an ack that finds every credit taken
        // raises again at once).
        answer(&mut client, &mut server, &wire[1..2]);
        let ack = controls(&mut client, &mut server);
        assert_eq!((ack[0].kind, ack[0].count), (Kind::CreditAck, 2));
        assert_eq!(room.reserved(), srq_need_ringless(2));
        assert!(!server.has_control(), "no raise: a credit is free");
        answer(&mut client, &mut server, &wire[2..]);
        assert_eq!((server.credits(), client.credits()), (2, 2));
    }

    /// What a peer may not send about credits closes its session, naming why. Sabotaged:
    /// `on_credit_header`'s unacked check (an ack with no grant accepted).
    #[test]
    fn credit_messages_out_of_place_are_violations() {
        let t = Instant::now();
        let (mut server, mut client, _room) = pair(1000);
        let ack = Header { count: 2, session: 5, ..Header::new(Kind::CreditAck) };
        assert_eq!(server.handle_header(&ack, || t).unwrap_err(), "credit acknowledgement for no grant");
        let grant = Header { count: 4, session: 5, ..Header::new(Kind::CreditGrant) };
        assert_eq!(server.handle_header(&grant, || t).unwrap_err(), "credit grant sent to a server");
        assert_eq!(client.handle_header(&ack, || t).unwrap_err(), "credit acknowledgement sent to a client");
        let over = Header { count: WINDOW + 1, ..grant };
        assert_eq!(client.handle_header(&over, || t).unwrap_err(), "credits granted above the window asked");
        client.handle_header(&grant, || t).unwrap();
        assert_eq!(
            client.handle_header(&grant, || t).unwrap_err(),
            "credit grant while one is unacknowledged"
        );
        // Requests beyond the two granted.
        let (mut server, _, _) = pair(0);
        let req = |slot| Header { slot, generation: 1, method: 7, session: 5, ..Header::new(Kind::Request) };
        server.handle_header(&req(0), || t).unwrap();
        server.handle_header(&req(1), || t).unwrap();
        assert_eq!(server.handle_header(&req(2), || t).unwrap_err(), "request beyond the granted credits");
    }

    /// A ring grant reserves the pieces row and its release gives it back.
    #[test]
    fn the_pieces_row_follows_the_ring() {
        let (mut server, _, room) = pair(15);
        assert_eq!(server.srq_reserved(), srq_need_ringless(2));
        assert!(server.reserve_ring_pieces());
        assert_eq!(room.reserved(), srq_need(2));
        assert_eq!(server.srq_reserved(), srq_need(2));
        server.release_ring_pieces();
        assert_eq!(room.reserved(), srq_need_ringless(2));
        let (mut full, _, _) = pair(14);
        assert!(!full.reserve_ring_pieces(), "no room for the pieces row: no ring");
    }

    /// Idle sessions share `idle_share` WQEs: their bases count as at most that many together,
    /// so a worker admits sessions past what their bases sum to, while extras (a raise, a ring's
    /// pieces) are still reserved one by one against what is posted. Sabotaged: `counted`
    /// ignoring the share (bases summed): failed ("idle session 13 refused at 481 reserved").
    #[test]
    fn idle_sessions_share_their_bases_and_extras_stay_reserved_one_by_one() {
        let base = srq_need_ringless(2);
        let room = SrqRoom::sharing(4 * base);
        let depth = 512;
        for i in 0..100 {
            room.admit(base, depth).unwrap_or_else(|r| panic!("idle session {i} refused at {r} reserved"));
        }
        assert_eq!(room.reserved(), 4 * base, "the bases count as the share");
        assert_eq!(room.bases(), 100 * base);
        room.add_posted(depth);
        // Extras take what is posted beyond the shared bases, and no more.
        let room_left = depth - 4 * base;
        assert!(room.reserve(room_left, room.posted()).is_ok());
        assert!(room.reserve(1, room.posted()).is_err(), "an extra beyond what is posted");
        // The extras fill the SRQ, and a session is still admitted: past the share a base adds
        // nothing.
        assert!(room.admit(base, depth).is_ok(), "past the share a base adds nothing");
        room.give_back(room_left);
        for _ in 0..101 {
            room.leave(base);
        }
        assert_eq!((room.reserved(), room.bases()), (0, 0));
        // Without sharing, the same SRQ holds 13 idle sessions of 37 WQEs.
        let strict = SrqRoom::new();
        let admitted = (0..100).take_while(|_| strict.admit(base, depth).is_ok()).count();
        assert_eq!(admitted as u32, depth / base, "unshared, 512 WQEs hold 13 idle sessions");
    }
}
