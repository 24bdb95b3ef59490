//! Per-connection protocol state and policy, sans-IO, as quinn-proto's `Connection`: the one
//! home of the protocol's rules for both ends, which the client and the server workers drive.
//! Credits; the client's call slots with generations and what its requests carry, when a Cancel
//! may go and the abandon cap (`calls.rs`); the order of waiting messages and what never goes
//! ([`Outbox`]); the producer state of the peer's ring and the consumer state of our own; the
//! reassembly of bodies that arrive through the ring; and the life of calls and of the peer
//! (cancel, server-side deadlines, the idle probe, the idle timeout; see [`lifecycle`]); the
//! server's meter of what a client sends outside its credits ([`meter`]). No verbs and no clock:
//! inputs are received headers (`handle_header`), completions of what was posted
//! ([`Outbox::sent`]; ring WRITEs retired, [`Session::on_ring_written`]), body sizes
//! (`place_body`, `next_piece`) and `now` (`handle_timeout`);
//! outputs are placements, headers to send (`next_request`, `next_control`), answers
//! ([`Event::answer`]), events (`poll_event`) and complete messages.
//!
//! Ring bodies are untrusted while they sit in the ring (the peer can write it at any time), so the
//! receiver copies every ring body out once, into a buffer this session owns, and frees its ring
//! space at once ([`Session::piece_buffer`], [`Session::piece_done`]); nothing ever reads a body in
//! place. A body larger than the peer's ring, or than what it has free, travels in pieces of at
//! most a quarter of the ring ([`Session::next_piece`]), pipelined: the receiver copies one piece
//! out while the next is written.

mod budget;
mod calls;
mod credits;
#[doc(hidden)]
pub mod fuzz;
mod lease;
pub mod lifecycle;
pub mod meter;
mod outbox;
pub mod queue;
mod recycle;
mod ring;
mod slots;
mod stream;
pub mod tick;

pub use budget::{Charge, HeldBytes};
pub use calls::DEFAULT_ACK_TIMEOUT;
pub use credits::{srq_need, srq_need_ringless, SrqRoom};
pub use lease::{LeaseMsg, OwnSweep};
use lease::{OwnRing, PeerRing};
pub use lifecycle::Event;
use lifecycle::{CallLimit, IdleTimer, Liveness, Unanswered};
pub use outbox::{Front, Outbox, Queued, Waiting};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use recycle::{BodyRecycler, RecycledBody, SPARE_BODIES};

pub use ring::{RingConsumer, RingMark, RingProducer, RingReserveError, RingToken};

/// Fraction of the peer's ring one piece may take (a quarter: four pieces in flight pipeline).
const PIECE_FRACTION: u32 = 4;

/// Most pieces that are not the last of their message one ring holds at once: every such piece
/// takes at least `1 / PIECE_FRACTION²` of it.
pub const MAX_PIECES_IN_RING: u32 = PIECE_FRACTION * PIECE_FRACTION;

/// Most ring bodies and pieces a server keeps unfreed in a client's ring, for a session of
/// `credits`: `max(credits, MAX_PIECES_IN_RING)` (32 at the default 32 credits). A body waits
/// for the client to free one beyond it, as it waits for ring space. It bounds the RingReturns a
/// client may send (each must free at least one: `meter`), hence the receive WQEs reserved for
/// them (`endpoint::conn::srq_need`); at least [`MAX_PIECES_IN_RING`] so that one answer in
/// pieces streams through the ring at any credits. A client reports freed space once half of
/// them are freed unreported ([`Session::ring_return_due`]).
pub fn ring_units(credits: u16) -> u32 {
    u32::from(credits).max(MAX_PIECES_IN_RING)
}
pub use slots::{Abandoned, CallSlots, ResponseFate, SlotState};
pub use stream::{StreamError, STREAM_RESERVED_CREDITS};
use stream::{StreamSends, Streams};

use crate::status::Status;
use crate::wire::{Header, Kind, STREAM_IN, STREAM_OUT};

/// Most stream messages one end of a session holds or has granted at once, across its streams
/// (the stream budget is the session's credits up to this; each stream gets at most half).
pub const MAX_STREAM_BUDGET: u32 = 256;

/// A request still waiting for its handler's answer ([`Session::live_call`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveCall {
    /// When the client stops waiting (`None`: no deadline).
    pub deadline: Option<Instant>,
}

/// Which end of the connection this session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sends requests, receives responses.
    Client,
    /// Receives requests, sends responses.
    Server,
}

/// Limits both ends agreed on at handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionParams {
    /// Session id assigned by the server.
    pub id: u32,
    /// Requests allowed in flight.
    pub credits: u16,
    /// Bodies up to this many bytes travel in the SEND; larger ones through the peer's ring.
    pub eager_threshold: u32,
    /// Largest body in bytes either side may send.
    pub max_message: u32,
    /// Length of the peer's ring in bytes.
    pub peer_ring_len: u32,
    /// Length of our own ring in bytes.
    pub own_ring_len: u32,
    /// Most ring bodies held unreleased at once (the slot window on a client, credits on a server).
    pub max_held: usize,
}

/// Where an outgoing body goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// After the header in the SEND.
    Eager,
    /// In the peer's ring at this offset, reserved now (RDMA WRITE before the header SEND): queue
    /// it before anything else is placed.
    Ring(u32),
    /// In pieces through the peer's ring, as [`Session::next_piece`] grants space: the body is
    /// larger than a piece, or the ring has no contiguous room for it now.
    Pieces,
}

/// Why a body cannot be sent.
#[derive(Debug, PartialEq, Eq)]
pub enum PlaceError {
    /// Never (over `max_message_size`): RESOURCE_EXHAUSTED naming the limit.
    Refused(Status),
}

/// A body (or piece of one) the session accepted into our ring: copy `len` bytes at `offset` of
/// the ring into [`Session::piece_buffer`], then hand it to [`Session::piece_done`] before the
/// next header is handled.
#[derive(Debug, PartialEq, Eq)]
pub struct RingPiece {
    token: RingToken,
    /// Offset in our ring in bytes.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
    assembly: usize,
    dropped: bool,
}

impl RingPiece {
    /// A piece of a body refused over the reassembly cap ([`Session::set_reassembly`]): its
    /// bytes are not copied out, hand it to [`Session::piece_done`] at once (it frees its ring
    /// space and counts it).
    pub fn dropped(&self) -> bool {
        self.dropped
    }
}

/// A received message the session accepted.
#[derive(Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The header.
    pub header: Header,
    /// For a body (or piece) in our ring: where it is, to copy out.
    pub ring: Option<RingPiece>,
}

/// A message whose body arrived through the ring, complete and copied out.
#[derive(Debug, PartialEq, Eq)]
pub struct Complete {
    /// The header of its first piece, with `body_len` set to the whole body's length.
    pub header: Header,
    /// The whole body, owned (empty when `refused`).
    pub body: Vec<u8>,
    /// Client: the body was refused over the client's reassembly cap (its pieces were dropped
    /// as they arrived): the call ends with this RESOURCE_EXHAUSTED status naming the cap.
    pub refused: Option<Status>,
}

/// A ring message being received piece by piece.
#[derive(Debug)]
struct Assembly {
    header: Header,
    body: Vec<u8>,
    /// Its `total_len`, charged to the server's reassembly count while it arrives
    /// ([`Session::set_reassembly`]); given back when the message completes or the session goes.
    _charge: Option<Charge>,
    /// When its first piece arrived (with a reassembly timeout set only).
    since: Option<Instant>,
    /// Refused over the shared reassembly cap: its pieces are dropped as they arrive (no
    /// buffer, no charge), `dropped` counts their bytes.
    refused: bool,
    dropped: u64,
}

impl Assembly {
    /// Bytes of the message received so far.
    fn received(&self) -> u64 {
        if self.refused {
            self.dropped
        } else {
            self.body.len() as u64
        }
    }
}

/// What bodies arriving in pieces may hold ([`Session::set_reassembly`]).
#[derive(Debug)]
struct ReassemblyLimits {
    /// The count (server-wide, or the client's) the messages in progress are charged to.
    held: std::sync::Arc<HeldBytes>,
    /// Most bytes this session alone may hold charged (its share of `held`).
    share: u64,
    /// How long a message may take from its first piece to its last.
    timeout: Duration,
    /// An [`Event::ReassemblyExpired`] was reported (once: the driver closes the session).
    expired: bool,
}

/// The rule on piece sizes, checked on receive: every piece of a ring body but its message's
/// last holds at least `1 / MAX_PIECES_IN_RING` of the receiver's ring (what the receiver's
/// receive WQEs are reserved for, `endpoint::conn::srq_need`).
const SMALL_PIECE: &str = "ring piece smaller than 1/16 of the receiver's ring that is not its message's \
                           last (every other piece holds at least ring_len / 16 bytes)";

/// Protocol state of one connection.
#[derive(Debug)]
pub struct Session {
    role: Role,
    params: SessionParams,
    producer: RingProducer,
    /// The producer's state before and after the last ring placement ([`Session::unplace_body`]).
    placed: (RingMark, RingMark),
    consumer: RingConsumer,
    /// Server: requests received and not yet answered, with their deadlines; at most `credits`
    /// entries (allocated once). An answer for a call not listed here is a duplicate.
    unanswered: Vec<Unanswered>,
    /// Server: events for the driver (at most one per unanswered call, plus one).
    events: VecDeque<Event>,
    /// Call control messages to send: Cancels (client, at most the window), stream ends
    /// (client) and stream grants (both; at most one per open stream).
    controls: VecDeque<Header>,
    /// Open streams and their credits.
    streams: Streams,
    /// The request credits the client's stream SENDs hold ([`StreamSends`]).
    sends: StreamSends,
    liveness: Liveness,
    /// Server: the bound on a call's life ([`Session::set_call_limit`]).
    limit: CallLimit,
    /// Client: the call slots and what the calls go out with ([`calls`]).
    calls: calls::Calls,
    /// Ring messages being received (at most `max_held`, bounded by credits or the window).
    assemblies: Vec<Assembly>,
    /// Buffers of earlier ring messages, to copy the next ones into.
    recycler: std::sync::Arc<BodyRecycler>,
    closed: bool,
    /// Ring space was freed since [`Session::take_ring_return`] was last asked.
    ring_freed: bool,
    /// Server: CancelAcks waiting in `controls` (at most `credits`: a client holds a credit per
    /// Cancel until its acknowledgement arrives).
    acks_due: u16,
    /// Server: a request stored a metadata block as the session's cached one
    /// ([`crate::wire::METADATA_STORE`]; its bytes are the driver's).
    block_kept: bool,
    /// Server: the client answers Pings while idle ([`Session::probe_while_idle`]).
    probe_idle: bool,
    /// Server: the cap and timeout of bodies arriving in pieces (none on a client).
    reassembly: Option<ReassemblyLimits>,
    /// Server: the count that answers waiting on the heap for the client's ring are charged to.
    backlog: Option<std::sync::Arc<HeldBytes>>,
    /// Server: what the client sends outside its credits ([`meter`]).
    meter: meter::Meter,
    /// Server: how long the session has had no call ([`Session::handle_idle`]).
    idle: IdleTimer,
    /// Server: the server's load that responses report (requests admitted and not yet
    /// answered, over all its sessions; see [`Session::set_load`]), and this session's share of
    /// it as last added.
    load: Option<(std::sync::Arc<std::sync::atomic::AtomicU32>, u32)>,
    /// Client: the load the server reported on its last response (`u32::MAX`: none yet).
    peer_load: u32,
    /// The lease of the peer's ring, as its producer ([`lease`]; `Fixed` before protocol 12's
    /// [`Session::lease_peer_ring`]).
    peer_ring: PeerRing,
    /// The lease of our ring, as its consumer ([`lease`]; `Fixed` unless
    /// [`Session::lease_own_ring`]).
    own_ring: OwnRing,
    /// Whether a lease message may be due: kept by the lease states' setters
    /// ([`Session::lease_pending`]).
    lease_due: bool,
    /// The request credits granted now ([`credits`]; fixed at `params.credits` unless granted
    /// on demand).
    credits: credits::Credits,
}

impl Drop for Session {
    /// Takes this session's unanswered requests back out of the server's load.
    fn drop(&mut self) {
        if let Some((load, share)) = &self.load {
            load.fetch_sub(*share, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Session {
    /// A fresh session.
    pub fn new(role: Role, params: SessionParams) -> Session {
        Session {
            role,
            params,
            producer: match role {
                // Our bodies in the client's ring, capped: each RingReturn must free one.
                Role::Server => {
                    RingProducer::with_max_units(params.peer_ring_len, ring_units(params.credits))
                }
                Role::Client => RingProducer::new(params.peer_ring_len),
            },
            placed: (RingProducer::new(0).mark(), RingProducer::new(0).mark()),
            consumer: RingConsumer::new(params.own_ring_len, params.max_held.max(1)),
            unanswered: match role {
                Role::Server => Vec::with_capacity(usize::from(params.credits)),
                Role::Client => Vec::new(),
            },
            events: VecDeque::with_capacity(usize::from(params.credits) + 1),
            controls: VecDeque::with_capacity(params.max_held.max(usize::from(params.credits))),
            streams: Streams::new(u32::from(params.credits).min(MAX_STREAM_BUDGET)),
            sends: StreamSends::default(),
            liveness: Liveness::new(None),
            limit: CallLimit::default(),
            calls: match role {
                Role::Client => {
                    calls::Calls::new(params.max_held.min(usize::from(u16::MAX)) as u16, params.credits)
                }
                Role::Server => calls::Calls::new(1, 1),
            },
            assemblies: Vec::new(),
            // Spare buffers for the bodies that may be held at once, received or waiting to be
            // sent: at most our ring's length plus two largest messages together (fresh memory
            // costs a page fault per 4 KiB on first touch, more than the copy into it). Two: a
            // pipelined client has one answer its caller still reads, one complete and waiting
            // to be taken, and the next arriving; with room for one, every third 64 MiB answer
            // of `rpc_bw -s 64M` came back over the budget and the next one faulted in fresh
            // pages.
            recycler: BodyRecycler::new(
                params.max_held,
                (params.own_ring_len as usize)
                    .saturating_add((params.max_message as usize).saturating_mul(2)),
            ),
            closed: false,
            ring_freed: false,
            acks_due: 0,
            block_kept: false,
            probe_idle: false,
            reassembly: None,
            backlog: None,
            meter: meter::Meter::new(params.own_ring_len),
            idle: IdleTimer::default(),
            load: None,
            peer_load: u32::MAX,
            peer_ring: PeerRing::Fixed,
            own_ring: OwnRing::Fixed,
            lease_due: false,
            credits: credits::Credits::fixed(params.credits),
        }
    }

    /// Server: the count of requests admitted and not yet answered that every session of the
    /// server shares; its value goes into each response's `count` (protocol 8, the server's
    /// load for clients' balancers). The session adds its own unanswered requests to it as they
    /// change (one atomic add when a request is admitted, one when the count changed since the
    /// last message sent) and takes them back when dropped.
    pub fn set_load(&mut self, load: std::sync::Arc<std::sync::atomic::AtomicU32>) {
        self.load = Some((load, 0));
    }

    /// Server: brings this session's share of the server's load up to date.
    #[inline]
    fn sync_load(&mut self) -> u32 {
        let Some((load, share)) = &mut self.load else { return 0 };
        let now = self.unanswered.len() as u32;
        if now == *share {
            return load.load(std::sync::atomic::Ordering::Relaxed);
        }
        let delta = now.wrapping_sub(*share);
        *share = now;
        load.fetch_add(delta, std::sync::atomic::Ordering::Relaxed).wrapping_add(delta)
    }

    /// Client: the load the server reported on its last response (its requests admitted and
    /// not yet answered, over all its sessions); `None` before the first response.
    pub fn peer_load(&self) -> Option<u32> {
        (self.peer_load != u32::MAX).then_some(self.peer_load)
    }

    /// Bodies that arrive in pieces are charged (their `total_len`, from the first piece until
    /// the last) to `held` (a server: shared by every session of the server; a client: its
    /// own). Bodies in one piece are copied out at once and never charged.
    ///
    /// - One that would take this session's own charges over `share` bytes closes the session
    ///   (a protocol violation naming `ServerConfig::max_reassembly_bytes_per_session`,
    ///   [`is_reassembly_cap`]); pass `u64::MAX` for no share (a client).
    /// - One that would take `held` over its cap refuses that call alone, the session stays
    ///   open: its pieces are accepted and dropped as they arrive (their ring space freed, no
    ///   buffer, nothing charged: [`RingPiece::dropped`]); a server answers the call at once
    ///   with RESOURCE_EXHAUSTED naming the cap ([`Event::Refused`]), a client ends it so when
    ///   its last piece is in ([`Complete::refused`]).
    /// - One whose last piece has not arrived `timeout` after its first becomes
    ///   [`Event::ReassemblyExpired`] (the driver closes the session).
    pub fn set_reassembly(&mut self, held: std::sync::Arc<HeldBytes>, share: u64, timeout: Duration) {
        self.reassembly = Some(ReassemblyLimits { held, share, timeout, expired: false });
    }

    /// The share of the reassembly count this session alone may hold, in bytes
    /// ([`Session::set_reassembly`]; `None` when no reassembly limits are set).
    pub fn reassembly_share(&self) -> Option<u64> {
        self.reassembly.as_ref().map(|r| r.share)
    }

    /// Server: answers that wait on the heap for room in the client's ring are charged to
    /// `held` ([`Session::charge_backlog`]).
    pub fn set_backlog(&mut self, held: std::sync::Arc<HeldBytes>) {
        self.backlog = Some(held);
    }

    /// Server: charges an answer (or stream message) of `bytes` that is to wait on the heap
    /// until the client's ring has room (a body in the staging area or in a send buffer holds
    /// no more memory and is not charged: pass 0). `None` when nothing is charged (no count set,
    /// or 0 bytes); the [`Charge`] gives the bytes back when dropped (the body sent, dropped or
    /// the session closed).
    ///
    /// # Errors
    /// The reason to close the session with, naming the cap (`ServerConfig::max_backlog_bytes`)
    /// and its value, when the charge would take the server's count over it.
    pub fn charge_backlog(&self, bytes: u64) -> Result<Option<Charge>, String> {
        match &self.backlog {
            Some(h) if bytes > 0 => h
                .charge(bytes, "an answer waiting on the heap for the client's ring")
                .map(Some)
                .map_err(|e| format!("answers waiting on a slow reader: {e}")),
            _ => Ok(None),
        }
    }

    /// The agreed parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// This end's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Server: requests received and not yet answered.
    pub fn unanswered(&self) -> u16 {
        self.unanswered.len() as u16
    }

    /// Server: whether the request `(slot, generation)` was received and not yet answered.
    pub fn is_unanswered(&self, slot: u16, generation: u32) -> bool {
        self.unanswered.iter().any(|c| (c.slot, c.generation) == (slot, generation))
    }

    /// Server: the request `(slot, generation)` when it still waits for its handler's answer
    /// (unanswered, not cancelled, not expired), with its deadline (from its `timeout_us`;
    /// `None`: no deadline). `None` when it does not: drop it undispatched.
    #[inline]
    pub fn live_call(&self, slot: u16, generation: u32) -> Option<LiveCall> {
        let c = self.unanswered.iter().find(|c| (c.slot, c.generation) == (slot, generation))?;
        (!c.ended).then_some(LiveCall { deadline: c.deadline })
    }

    /// Enables the idle probe from `now` on: while this end waits for the peer, a Ping after a
    /// third of `peer_timeout` of silence, [`Event::PeerDead`] after all of it (`None`: never).
    pub fn set_peer_timeout(&mut self, peer_timeout: Option<Duration>, now: Instant) {
        self.liveness = Liveness::new(peer_timeout);
        self.liveness.last_check = Some(now);
    }

    /// Server: closes the session once it has had no call in flight for `idle_timeout` (`None`:
    /// never; the default). See [`Session::handle_idle`].
    pub fn set_idle_timeout(&mut self, idle_timeout: Option<Duration>) {
        self.idle.timeout = idle_timeout;
    }

    /// Server: a look at the session's idleness at `now` (the driver's idle sweep, at most every
    /// quarter of `idle_timeout`): the time it has had no call in flight (no unanswered call, no
    /// open stream, no message arriving in pieces, no answer sent since the previous look) when
    /// that reached `idle_timeout`: send a Close and close it (a clean close: the client
    /// reconnects on its next call). Measured from the first look that found it idle, so the
    /// session closes between `idle_timeout` and `idle_timeout` plus the sweep's period after its
    /// last call. Pings and ring returns do not count as calls.
    ///
    /// A session whose client answers probes while idle ([`Session::probe_while_idle`]: a
    /// `Channel` or a blocking `Client`, whose endpoint's progress thread answers) is never
    /// closed for being idle while the probe is on ([`Session::set_peer_timeout`]): the probe
    /// finds it dead within `peer_timeout` when it stops answering. With the probe off it is
    /// closed for being idle as any other. Every idle session is thus reclaimed one way or the
    /// other, whatever its client asked.
    pub fn handle_idle(&mut self, now: Instant) -> Option<Duration> {
        if self.probe_idle && self.liveness.peer_timeout.is_some() {
            return None;
        }
        let busy =
            !self.unanswered.is_empty() || !self.streams.list.is_empty() || !self.assemblies.is_empty();
        self.idle.look(now, busy)
    }

    /// Server: bounds the life of every call received from now on to `max` (`None`: no bound),
    /// measured from the first [`Session::handle_timeout`] that sees it (never shorter than
    /// `max`; no clock read per call): past it, the call ends with [`Event::Overran`]. `now` is
    /// the driver's clock now.
    pub fn set_call_limit(&mut self, max: Option<Duration>, now: Instant) {
        self.limit = CallLimit { max, last: Some(now) };
    }

    /// Server: the client said in its handshake that it answers Pings while it has no call on
    /// the wire ([`crate::wire::FLAG_IDLE_PONGS`]): the idle probe watches this session also
    /// while no call is unanswered ([`Session::watches_peer`]), so a client process that stopped
    /// (SIGSTOP, hung) is found within `peer_timeout` even when idle.
    pub fn probe_while_idle(&mut self) {
        self.probe_idle = true;
    }

    /// Server: whether this end expects something from the client now (the `waiting` of
    /// [`Session::poll_timeout`] and [`Session::handle_timeout`]): a call unanswered, or the
    /// client answers probes while idle and the probe is on ([`Session::set_peer_timeout`]).
    #[inline]
    pub fn watches_peer(&self) -> bool {
        self.has_open_calls() || self.probe_idle && self.liveness.peer_timeout.is_some()
    }

    /// Server: a call unanswered or a body arriving in pieces: what a received message may have
    /// brought a deadline with ([`Session::poll_timeout`]; the idle probe's never comes sooner
    /// for a message).
    #[inline]
    pub fn has_open_calls(&self) -> bool {
        !self.unanswered.is_empty() || self.reassembly.is_some() && !self.assemblies.is_empty()
    }

    /// When [`Session::handle_timeout`] has something to do next (`waiting`: this end expects
    /// something from the peer): the earliest deadline of an unanswered call, or of the probe.
    pub fn poll_timeout(&self, waiting: bool) -> Option<Instant> {
        let calls = self.unanswered.iter().filter(|c| !c.ended).filter_map(|c| c.deadline).min();
        let limit = self.limit.next(&self.unanswered);
        [calls, limit, self.liveness.next(waiting), self.calls.next_timeout(), self.reassembly_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// When the oldest body arriving in pieces runs out of its reassembly timeout.
    fn reassembly_deadline(&self) -> Option<Instant> {
        let r = self.reassembly.as_ref().filter(|r| !r.expired)?;
        self.assemblies.iter().filter_map(|a| a.since).min().map(|t| t + r.timeout)
    }

    /// Applies the passage of time up to `now`. `waiting`: this end expects something from the
    /// peer (client: calls on the wire; server: unanswered calls). Expired calls and a dead peer
    /// become [`Event`]s, and so does the abandon cap's watch when no acknowledgement came
    /// ([`Event::Unacknowledged`]); a due probe becomes a Ping in [`Session::next_control`].
    pub fn handle_timeout(&mut self, now: Instant, waiting: bool) {
        for c in self.unanswered.iter_mut().filter(|c| !c.ended) {
            if c.deadline.is_some_and(|d| d <= now) {
                c.ended = true;
                self.events.push_back(Event::Expired { slot: c.slot, generation: c.generation });
            }
        }
        self.limit.check(&mut self.unanswered, now, &mut self.events);
        if let Some(silent) = self.liveness.check(now, waiting) {
            self.events.push_back(Event::PeerDead { silent });
        }
        if let Some(e) = self.calls.check(now) {
            self.events.push_back(e);
        }
        if let Some(at) = self.reassembly_deadline().filter(|&d| d <= now) {
            if let Some(r) = self.reassembly.as_mut() {
                r.expired = true;
                let started = at.checked_sub(r.timeout).unwrap_or(at);
                self.events
                    .push_back(Event::ReassemblyExpired { waited: now.saturating_duration_since(started) });
            }
        }
    }

    /// The next event for the driver, oldest first.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Client: the caller gave up on `(slot, generation)`, which is on the wire: a Cancel goes to
    /// the server (from [`Session::next_control`]). The slot and its credit are reused only once
    /// the call's response (the server answers every request exactly once) and the Cancel's
    /// acknowledgement arrived (see [`CallSlots`]).
    pub(crate) fn cancel(&mut self, slot: u16, generation: u32) {
        if self.calls.slots.cancel_queued(slot, generation) {
            self.controls.push_back(Header { slot, generation, ..Header::new(Kind::Cancel) });
        }
    }

    /// Whether a control message waits to be sent ([`Session::next_control`]). Inlined: a few
    /// compares on the hot path.
    #[inline(always)]
    pub fn has_control(&self) -> bool {
        self.liveness.pong_due
            || self.liveness.ping_due
            || !self.controls.is_empty()
            || self.credit_ack_ready()
    }

    /// The next control message to send (a Pong, a Ping, a Cancel or a stream control; the caller stamps and
    /// queues it). Take it only when a send buffer is at hand: it is gone from the session.
    pub fn next_control(&mut self) -> Option<Header> {
        if std::mem::take(&mut self.liveness.pong_due) {
            return Some(Header::new(Kind::Pong));
        }
        if std::mem::take(&mut self.liveness.ping_due) {
            if self.role == Role::Server {
                self.meter.pinged();
            }
            return Some(Header::new(Kind::Ping));
        }
        if let Some(ack) = self.take_credit_ack() {
            return Some(ack);
        }
        let i = if self.role == Role::Client && !self.stream_send_room() {
            // A client's stream controls hold a request credit each: they wait for one, the
            // others (Cancels) go.
            self.controls.iter().position(|c| !matches!(c.kind, Kind::StreamEnd | Kind::StreamGrant))?
        } else {
            0
        };
        let h = self.controls.remove(i)?;
        match h.kind {
            Kind::CancelAck => self.acks_due -= 1,
            Kind::StreamEnd | Kind::StreamGrant if self.role == Role::Client => self.sends.unreturned += 1,
            _ => {}
        }
        Some(h)
    }

    /// True once a Close was received or sent.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Marks the session closed (a Close is being sent, or the connection failed): nothing more
    /// is received, so the bodies arriving in pieces are dropped (their reassembly charges given
    /// back now).
    pub fn close(&mut self) {
        self.closed = true;
        self.assemblies.clear();
    }

    /// Chooses where a body of `len` bytes goes and, for [`Placement::Ring`], reserves its
    /// space in the peer's ring.
    ///
    /// # Errors
    /// [`PlaceError::Refused`] (RESOURCE_EXHAUSTED naming `max_message_size`) when it can never be
    /// sent; nothing was reserved.
    #[inline]
    pub fn place_body(&mut self, len: usize) -> Result<Placement, PlaceError> {
        self.check_len(len).map_err(PlaceError::Refused)?;
        if len <= self.params.eager_threshold as usize {
            return Ok(Placement::Eager);
        }
        if !self.peer_ring_ready() {
            // No grant of the peer's ring (protocol 12): the body waits as for a full ring,
            // and a RingAsk is due.
            self.want_peer_ring();
            return Ok(Placement::Pieces);
        }
        let before = self.producer.mark();
        match self.producer.reserve(len as u32) {
            Ok(off) => {
                self.placed = (before, self.producer.mark());
                Ok(Placement::Ring(off))
            }
            Err(RingReserveError::Full | RingReserveError::TooLarge { .. }) => Ok(Placement::Pieces),
        }
    }

    /// Takes back the ring space the last [`Session::place_body`] reserved ([`Placement::Ring`]),
    /// for a body that will not be sent (it did not encode to its `encoded_len`); call it before
    /// anything else is placed. Returns false, changing nothing, when something was.
    pub fn unplace_body(&mut self) -> bool {
        self.producer.rewind(self.placed.0, self.placed.1)
    }

    /// Whether a body of `len` bytes may be sent at all.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming `max_message_size` when `len` exceeds it.
    #[inline]
    pub fn check_len(&self, len: usize) -> Result<(), Status> {
        if len > self.params.max_message as usize {
            return Err(Status::resource_exhausted(format!(
                "message of {len} bytes exceeds max_message_size of {} bytes",
                self.params.max_message
            )));
        }
        Ok(())
    }

    /// Largest piece in bytes: a quarter of the peer's ring (at least 1).
    pub fn max_piece(&self) -> u32 {
        (self.params.peer_ring_len / PIECE_FRACTION).max(1)
    }

    /// Reserves the next piece of a body of which `remaining` bytes (at least 1) are still to be
    /// sent: `(offset, length)` in the peer's ring, at most [`Session::max_piece`] and at least a
    /// quarter of that (or `remaining`, when smaller). `None` while the ring lacks that much room
    /// (a ring-full stall: wait for the peer to free). Queue the piece before anything else is
    /// placed. Allocates nothing.
    #[inline]
    pub fn next_piece(&mut self, remaining: u32) -> Option<(u32, u32)> {
        if !self.peer_ring_ready() {
            self.want_peer_ring();
            return None;
        }
        let max = self.max_piece();
        self.producer.reserve_piece(remaining.min(max), max / PIECE_FRACTION)
    }

    /// The mark of the ring WRITE of the body (or piece) placed last, to queue with that WRITE
    /// (`SendQueue::write`): the producer's tail right after it. A WRITE of only the first part
    /// of the last placement (a body posted as several pieces) takes this mark less the bytes
    /// placed after its end. Queue the WRITE before anything else is placed.
    #[inline]
    pub fn ring_write_mark(&self) -> u32 {
        self.producer.tail()
    }

    /// Whether the body placed last may go out as one more piece ([`Session::split_ring_body`]):
    /// a server keeps at most [`ring_units`] bodies and pieces unfreed in the client's ring.
    #[inline]
    pub fn may_split_ring_body(&self) -> bool {
        self.producer.may_split()
    }

    /// The body placed last goes out in pieces (pipelined): one of them ends `behind` bytes
    /// before its end. Call in piece order, after [`Session::may_split_ring_body`] said yes
    /// (then this succeeds). Returns false when the piece may not be cut (send the rest as one).
    #[inline]
    pub fn split_ring_body(&mut self, behind: u32) -> bool {
        self.producer.split_last(self.producer.tail().wrapping_sub(behind))
    }

    /// A polled completion of ours retired the ring WRITE of `mark` and every one before it
    /// (`SendQueue::take_ring_mark`): its bytes may be placed again once the peer has freed them
    /// too. The producer reuses only bytes both freed by the peer and retired here, so a peer
    /// that reports space freed early cannot make us encode into a range a posted WRITE of ours
    /// still reads. A mark out of order or not of ours (a driver bug) is ignored.
    #[inline]
    pub fn on_ring_written(&mut self, mark: u32) {
        let _ = self.producer.on_written(mark);
    }

    /// Fills the session id and the freed head of our ring into an outgoing header.
    #[inline]
    pub fn stamp(&mut self, h: &mut Header) {
        if self.role == Role::Server && h.kind == Kind::Response {
            // The worker's eager answers take these values straight into their bytes
            // (`stamp_response`): one code path, so both stamp alike.
            let s = self.stamp_response();
            h.session = s.session;
            h.freed_head = s.freed_head;
            h.stream_taken = s.stream_taken;
            h.count = s.count;
            return;
        }
        h.session = self.params.id;
        h.freed_head = self.consumer.take_freed();
        if self.role == Role::Server {
            h.stream_taken = self.sends.taken;
            self.sends.reported = self.sends.taken;
            self.meter.sent();
            if h.kind == Kind::Response {
                let load = self.sync_load();
                h.count = load.min(u32::from(u16::MAX)) as u16;
            }
        }
    }

    /// Server: what [`Session::stamp`] writes on a response header, as values (the worker
    /// encodes its eager answers with them in place, [`crate::wire::Header`] unbuilt): the
    /// session id, the freed head, the stream SENDs taken, the load (the call's fields zero).
    #[inline(always)]
    pub(crate) fn stamp_response(&mut self) -> crate::wire::EagerResponse {
        let freed_head = self.consumer.take_freed();
        let stream_taken = self.sends.taken;
        self.sends.reported = self.sends.taken;
        self.meter.sent();
        let count = self.sync_load().min(u32::from(u16::MAX)) as u16;
        crate::wire::EagerResponse {
            session: self.params.id,
            freed_head,
            stream_taken,
            count,
            ..Default::default()
        }
    }

    /// What requests and the client's stream SENDs not yet taken by the server add up to at
    /// most: `credits` + [`STREAM_RESERVED_CREDITS`] (the server's SRQ reserves it,
    /// `endpoint::conn::srq_need`).
    fn send_pool(&self) -> u32 {
        u32::from(self.credits.accept) + u32::from(STREAM_RESERVED_CREDITS)
    }

    /// Client: whether a stream SEND (a message, a stream grant, a stream end) may go now: it
    /// holds a request credit until the server counts it taken (the session's `StreamSends`).
    #[inline]
    pub fn stream_send_room(&self) -> bool {
        let c = &self.calls.slots;
        self.sends.may_send(c.in_flight(), c.queued(), c.credits(), self.send_pool())
    }

    /// Client: stream SENDs sent that the server has not yet counted taken (each holds a
    /// request credit).
    pub fn stream_sends_unreturned(&self) -> u32 {
        self.sends.unreturned
    }

    /// Client: whether the requests on the wire and the stream SENDs not yet counted taken leave
    /// a credit for one more request.
    #[inline]
    fn request_room(&self) -> bool {
        u32::from(self.calls.slots.in_flight()) + self.sends.unreturned < self.send_pool()
    }

    /// Server: a response is being sent for one request, the oldest unanswered (returns its
    /// credit). The runtime names the call with [`Session::on_answer_for`], which also refuses a
    /// second answer.
    pub fn on_answer(&mut self) {
        self.idle.answers = self.idle.answers.wrapping_add(1);
        if !self.unanswered.is_empty() {
            self.unanswered.remove(0);
        }
    }

    /// Server: a response is being sent for the request `(slot, generation)` (returns its
    /// credit). Returns false, changing nothing, when that request is not waiting for an answer
    /// (a second answer to one call, e.g. a deferred one after the handler also answered or
    /// panicked): such an answer must not be sent.
    pub fn on_answer_for(&mut self, slot: u16, generation: u32) -> bool {
        self.idle.answers = self.idle.answers.wrapping_add(1);
        match self.unanswered.iter().position(|c| (c.slot, c.generation) == (slot, generation)) {
            Some(i) => {
                self.unanswered.swap_remove(i);
                if !self.streams.list.is_empty() {
                    self.stream_close(slot, generation);
                }
                true
            }
            None => false,
        }
    }

    /// Bytes of our ring freed since a header last told the peer.
    pub fn unreported_ring_bytes(&self) -> u32 {
        self.consumer.unreported()
    }

    /// Whether the bytes of our ring freed since a header last told the peer are worth a RingReturn
    /// message of their own (when no other message carries them): at least a quarter of the
    /// ring (a whole largest piece), or any amount once no message is arriving in pieces. While
    /// a message arrives and less is unreported, the peer is not waiting for it: with all it
    /// placed copied out and freed, it sees more than three quarters of the ring free, room for
    /// any piece; and its pieces still in flight bring their headers, after which this is asked
    /// again.
    ///
    /// Drivers ask [`Session::take_ring_return`], which also knows whether the peer can be
    /// waiting for the space.
    ///
    /// A client also sends one when half of the bodies and pieces the server may keep unfreed
    /// in our ring ([`ring_units`]) are freed unreported, whatever their bytes.
    ///
    /// A server also sends one when the client's stream SENDs it took and did not report, with
    /// its unanswered requests, hold every credit of the client (it may wait for the count).
    pub fn ring_return_due(&self) -> bool {
        let unreported = self.consumer.unreported();
        (unreported > 0
            && (unreported >= self.consumer.len() / PIECE_FRACTION
                || self.assemblies.is_empty()
                || self.units_return_due()))
            || self.stream_return_due()
    }

    /// Client: whether half of the ring bodies and pieces the server may keep unfreed in our ring
    /// ([`ring_units`]) are freed unreported: the server may be waiting for the count, not
    /// for bytes (a body in pieces arriving while small bodies were freed).
    fn units_return_due(&self) -> bool {
        self.role == Role::Client && self.consumer.unreported_units() * 2 >= ring_units(self.credits.granted)
    }

    /// Server: whether the client's stream SENDs taken and unreported are worth a RingReturn of
    /// their own ([`StreamSends::full`]).
    fn stream_return_due(&self) -> bool {
        self.role == Role::Server && self.sends.full(self.unanswered.len(), self.send_pool())
    }

    /// Whether ring space was freed, or (server) enough of the client's stream SENDs were taken
    /// unreported, since [`Session::take_ring_return`] was last asked (inlined: the drivers' fast
    /// check before posting).
    #[inline]
    pub fn ring_freed(&self) -> bool {
        self.ring_freed || self.sends.due
    }

    /// Whether a RingReturn message should be posted now for the ring space freed since this was
    /// last asked (the flag is cleared either way: a later message carries the head). The peer
    /// needs our ring only to send into it: a server answers only calls in flight, so a client
    /// with none in flight and nothing arriving in pieces lets its next request carry the head;
    /// a client may start a call at any time, so a server tells it whenever
    /// [`Session::ring_return_due`]. For the client's stream SENDs taken unreported, a server
    /// sends one only when no control message waits (which would carry the count).
    #[inline]
    pub fn take_ring_return(&mut self) -> bool {
        // A control message waiting (a stream grant, a CancelAck) carries the count: the
        // drivers queue those right after asking this.
        if std::mem::take(&mut self.sends.due) && self.stream_return_due() && !self.has_control() {
            self.ring_freed = false;
            return true;
        }
        if !std::mem::take(&mut self.ring_freed) {
            return false;
        }
        let peer_may_send = match self.role {
            Role::Server => true,
            Role::Client => self.calls.slots.in_flight() > 0 || !self.assemblies.is_empty(),
        };
        peer_may_send && self.ring_return_due()
    }

    /// Releases a ring body (frees it, in order).
    pub fn release(&mut self, token: RingToken) {
        self.consumer.release(token);
        self.ring_freed = true;
    }

    /// Validates a decoded header against the session state and applies it: its piggy-backed
    /// freed head, a Cancel (server: [`Event::Cancelled`] when the call is unanswered), a Ping (a
    /// Pong becomes due). `now` is read only for the first piece of a request with a timeout (its
    /// deadline).
    ///
    /// # Errors
    /// A reason when the peer broke the protocol (wrong session id, wrong direction, more requests
    /// than credits, stream grants beyond
    /// any stream budget, a ring body out of place, a freed head out of range): close the connection.
    #[inline(always)]
    pub fn handle_header(
        &mut self,
        h: &Header,
        now: impl FnOnce() -> Instant,
    ) -> Result<Incoming, &'static str> {
        self.apply_header(h, now).map(|ring| Incoming { header: *h, ring })
    }

    /// [`Session::handle_header`] without the header copied into its result: the ring piece of
    /// a ring body, `None` for an eager one.
    #[inline(always)]
    fn apply_header(
        &mut self,
        h: &Header,
        now: impl FnOnce() -> Instant,
    ) -> Result<Option<RingPiece>, &'static str> {
        // The common case, inlined into the drivers: a unary request at a server or a response
        // at a client, eager. The same checks in the same order as the general path below.
        if !h.in_ring && h.stream == 0 && h.session == self.params.id {
            match (self.role, h.kind) {
                (Role::Server, Kind::Request) => return self.eager_request(h, now),
                (Role::Client, Kind::Response) => return self.eager_response(h),
                _ => {}
            }
        }
        self.handle_any_header(h, now)
    }

    /// [`Session::handle_header`] of an eager unary request at a server.
    #[inline(always)]
    fn eager_request(
        &mut self,
        h: &Header,
        now: impl FnOnce() -> Instant,
    ) -> Result<Option<RingPiece>, &'static str> {
        self.liveness.rx_seen = true;
        if h.total_len > self.params.max_message {
            return Err("body larger than max_message_size");
        }
        self.producer.on_freed(h.freed_head).map_err(|()| "freed head outside the ring's used range")?;
        if h.stream_taken != 0 {
            return Err("a client's message carries a stream count");
        }
        self.check_credit()?;
        if h.metadata_cache != 0 {
            self.check_block_cache(h)?;
        }
        let deadline = (h.timeout_us > 0).then(|| now() + Duration::from_micros(u64::from(h.timeout_us)));
        self.admit_call(h, deadline);
        Ok(None)
    }

    /// Server: a request's use of the session's cached metadata block (protocol 11): a store
    /// keeps one from now on (the driver keeps its bytes); naming one before any store is a
    /// protocol violation. Header decoding checked the flags' combinations (eager requests only).
    #[cold]
    fn check_block_cache(&mut self, h: &Header) -> Result<(), &'static str> {
        if h.metadata_cache == crate::wire::METADATA_CACHED && !self.block_kept {
            return Err("a request names the cached metadata block before any request stored one");
        }
        self.block_kept = true;
        Ok(())
    }

    /// [`Session::handle_header`] of an eager response at a client.
    #[inline(always)]
    fn eager_response(&mut self, h: &Header) -> Result<Option<RingPiece>, &'static str> {
        self.liveness.rx_seen = true;
        if h.total_len > self.params.max_message {
            return Err("body larger than max_message_size");
        }
        self.producer.on_freed(h.freed_head).map_err(|()| "freed head outside the ring's used range")?;
        self.sends.on_taken(h.stream_taken)?;
        self.peer_load = u32::from(h.count);
        Ok(None)
    }

    /// [`Session::handle_header`] of any header (ring bodies, pieces, streams, controls).
    #[inline(never)]
    fn handle_any_header(
        &mut self,
        h: &Header,
        now: impl FnOnce() -> Instant,
    ) -> Result<Option<RingPiece>, &'static str> {
        if h.session != self.params.id {
            return Err("header for another session");
        }
        self.liveness.rx_seen = true;
        match (self.role, h.kind) {
            (Role::Server, Kind::Request)
            | (Role::Client, Kind::Response)
            | (Role::Server, Kind::Cancel | Kind::StreamEnd)
            | (Role::Client, Kind::CancelAck)
            | (_, Kind::RingReturn | Kind::Close | Kind::Ping | Kind::Pong)
            | (_, Kind::StreamMsg | Kind::StreamGrant)
            | (_, Kind::RingAsk | Kind::RingGrant | Kind::RingReclaim | Kind::RingRelease)
            | (_, Kind::CreditGrant | Kind::CreditAck) => {}
            (Role::Server, Kind::Response) => return Err("response sent to a server"),
            (Role::Client, Kind::Request) => return Err("request sent to a client"),
            (Role::Client, Kind::Cancel) => return Err("cancel sent to a client"),
            (Role::Server, Kind::CancelAck) => return Err("cancel acknowledgement sent to a server"),
            (Role::Client, Kind::StreamEnd) => return Err("stream end sent to a client"),
        }
        if h.total_len > self.params.max_message {
            return Err("body larger than max_message_size");
        }
        // Protocol 12's ring lease (`lease`): a RingGrant's freed head counts the new ring's
        // consumer, which the producer starts over with.
        let units_freed = if self.check_lease_header(h)? {
            0
        } else {
            self.producer.on_freed(h.freed_head).map_err(|()| "freed head outside the ring's used range")?
        };
        if self.role == Role::Client && h.kind == Kind::Response {
            self.peer_load = u32::from(h.count);
        }
        match self.role {
            Role::Client => self.sends.on_taken(h.stream_taken)?,
            Role::Server if h.stream_taken != 0 => return Err("a client's message carries a stream count"),
            Role::Server => {}
        }
        let mut clock = Clock { read: Some(now), at: None };
        let mut first = true;
        // The last (or only) piece of its message.
        let mut last = true;
        // The first piece of a body refused over the reassembly cap.
        let mut refused_call = false;
        let ring = if h.in_ring {
            if h.total_len <= self.params.eager_threshold {
                return Err("ring body at or below the eager threshold");
            }
            let assembly = match self
                .assemblies
                .iter()
                .position(|a| a.header.kind == h.kind && a.header.slot == h.slot && h.kind != Kind::Close)
            {
                Some(i) => {
                    let a = &self.assemblies[i].header;
                    if a.generation != h.generation
                        || a.method != h.method
                        || a.total_len != h.total_len
                        || a.status != h.status
                    {
                        return Err("ring piece does not continue its message");
                    }
                    let have = self.assemblies[i].received() + u64::from(h.body_len);
                    if have > u64::from(h.total_len) {
                        return Err("ring pieces exceed their message's total_len");
                    }
                    first = false;
                    last = have == u64::from(h.total_len);
                    i
                }
                None => {
                    if h.body_len > h.total_len {
                        return Err("ring piece longer than its message's total_len");
                    }
                    last = h.body_len == h.total_len;
                    if self.assemblies.len() >= self.params.max_held.max(usize::from(self.params.credits)) {
                        return Err("more ring messages in progress than calls in flight");
                    }
                    usize::MAX
                }
            };
            if !last && h.body_len < self.params.own_ring_len / MAX_PIECES_IN_RING {
                return Err(SMALL_PIECE);
            }
            if first && self.role == Role::Server && h.kind == Kind::Request {
                self.check_credit()?;
            }
            if !last && self.role == Role::Server {
                self.meter.piece()?;
            }
            // A body that will wait for more pieces is charged whole (what its buffer grows to)
            // before anything is allocated for it: over this session's share it closes the
            // session, over the shared cap it refuses the call (`set_reassembly`).
            let charge = match &self.reassembly {
                Some(r) if first && !last => {
                    let total = u64::from(h.total_len);
                    let mine: u64 =
                        self.assemblies.iter().filter_map(|a| a._charge.as_ref()).map(Charge::bytes).sum();
                    if mine.saturating_add(total) > r.share {
                        return Err(REASSEMBLY_SHARE);
                    }
                    Some((r.held.charge(total, "a body in pieces").ok(), clock.now()))
                }
                _ => None,
            };
            let refused = matches!(charge, Some((None, _)));
            let token = self.consumer.accept(h.ring_offset, h.body_len)?;
            let assembly = if assembly == usize::MAX && refused {
                // Nothing is kept of a refused body: no buffer, its pieces counted as they go.
                self.assemblies.push(Assembly {
                    header: Header { body_len: h.total_len, ..*h },
                    body: Vec::new(),
                    _charge: None,
                    since: charge.and_then(|(_, t)| t),
                    refused: true,
                    dropped: 0,
                });
                self.assemblies.len() - 1
            } else if assembly == usize::MAX {
                // Up to `max_message_size` per message, announced by the peer: an allocation
                // that fails closes the session instead of aborting the process.
                // A peer announces `total_len` with its first piece, which may be 1 byte: reserve
                // the whole message only when it arrives in one piece, else twice the first piece
                // (at least 64 KiB), so memory follows the bytes that really arrive; the buffer
                // grows as pieces come in (below: doubling, never past `total_len`; large
                // reallocations move pages, they are not copied). A failed allocation closes the
                // session instead of aborting.
                let upfront = h.total_len.min(h.body_len.saturating_mul(2).max(64 << 10));
                // A spare buffer of the message's size class is reused when there is one (its
                // pages are mapped already: no fresh allocation, whatever `total_len` says).
                let Some(body) = self.recycler.take_for(upfront as usize, h.total_len as usize) else {
                    return Err("no memory for the message's buffer");
                };
                let (charge, since) = charge.map_or((None, None), |(c, t)| (c, t));
                self.assemblies.push(Assembly {
                    header: Header { body_len: h.total_len, ..*h },
                    body,
                    _charge: charge,
                    since,
                    refused: false,
                    dropped: 0,
                });
                self.assemblies.len() - 1
            } else if self.assemblies[assembly].refused {
                assembly
            } else {
                let body = &mut self.assemblies[assembly].body;
                let need = body.len() + h.body_len as usize;
                if body.capacity() < need {
                    // Doubling keeps the reallocations few; capped at the message's length
                    // (checked against `max_message_size` above, and `need` against it), so the
                    // finished buffer is exactly `total_len` (1 MiB + 4 B takes 1 MiB + 4 B, not
                    // 2 MiB).
                    let target = body.capacity().saturating_mul(2).min(h.total_len as usize).max(need);
                    if body.try_reserve_exact(target - body.len()).is_err() {
                        return Err("no memory for the message's buffer");
                    }
                }
                assembly
            };
            let dropped = self.assemblies[assembly].refused;
            refused_call = refused;
            Some(RingPiece { token, offset: h.ring_offset, len: h.body_len, assembly, dropped })
        } else {
            if self.role == Role::Server && h.kind == Kind::Request {
                self.check_credit()?;
            }
            None
        };
        if self.role == Role::Server
            && (matches!(h.kind, Kind::StreamEnd | Kind::StreamGrant) || (h.kind == Kind::StreamMsg && last))
        {
            // Every stream SEND holds one of the client's credits until a header reports it taken.
            self.sends.take(self.unanswered.len(), self.send_pool())?;
        }
        match h.kind {
            Kind::Request if first && h.metadata_cache != 0 && self.role == Role::Server => {
                self.check_block_cache(h)?;
                let deadline = clock.deadline(h.timeout_us);
                if h.stream != 0 {
                    if u32::from(h.count) > MAX_STREAM_BUDGET {
                        return Err("stream grants beyond any stream budget");
                    }
                    self.open_peer_stream(h, deadline);
                } else {
                    self.admit_call(h, deadline);
                }
            }
            Kind::Request if first && h.stream != 0 => {
                if u32::from(h.count) > MAX_STREAM_BUDGET {
                    return Err("stream grants beyond any stream budget");
                }
                let deadline = clock.deadline(h.timeout_us);
                self.open_peer_stream(h, deadline);
            }
            Kind::StreamMsg if first => self.on_stream_msg(h)?,
            Kind::StreamGrant => {
                if let Some(i) = self.streams.find(h.slot, h.generation) {
                    // A consumer never has more than its budget (at most MAX_STREAM_BUDGET)
                    // granted: more would let the peer make us queue every message our
                    // application produces while it reads none (unbounded memory).
                    let st = &mut self.streams.list[i];
                    let grants = st.send_grants.saturating_add(u32::from(h.count));
                    if grants > MAX_STREAM_BUDGET {
                        return Err("stream grants beyond any stream budget");
                    }
                    st.send_grants = grants;
                }
            }
            Kind::StreamEnd => {
                if let Some(i) = self.streams.find(h.slot, h.generation) {
                    self.streams.list[i].peer_ended = true;
                }
            }
            Kind::Request if first => {
                self.admit_call(h, clock.deadline(h.timeout_us));
            }
            Kind::Close => self.closed = true,
            Kind::Ping => {
                if self.role == Role::Server {
                    self.meter.ping()?;
                }
                self.liveness.pong_due = true;
            }
            Kind::Pong if self.role == Role::Server => self.meter.pong()?,
            Kind::RingReturn if self.role == Role::Server => self.meter.ring_return(units_freed)?,
            Kind::Cancel => {
                // Every Cancel is acknowledged (the client holds the call's credit until then);
                // a client keeping that rule never has more than `credits` of them waiting.
                if self.acks_due >= self.credits.accept {
                    return Err("more Cancels unacknowledged than credits");
                }
                self.acks_due += 1;
                self.controls.push_back(Header {
                    slot: h.slot,
                    generation: h.generation,
                    ..Header::new(Kind::CancelAck)
                });
                // A call answered already (its answer is on its way) or cancelled twice changes
                // nothing more.
                let c = self.unanswered.iter_mut().find(|c| (c.slot, c.generation) == (h.slot, h.generation));
                if let Some(c) = c.filter(|c| !c.ended) {
                    c.ended = true;
                    self.events.push_back(Event::Cancelled { slot: h.slot, generation: h.generation });
                }
            }
            Kind::CancelAck => self.calls.slots.on_cancel_ack(h.slot, h.generation)?,
            Kind::CreditGrant | Kind::CreditAck => self.on_credit_header(h)?,
            _ => {}
        }
        if refused_call && self.role == Role::Server {
            self.refuse_call(h);
        }
        Ok(ring)
    }

    /// Server: the body in pieces of `h` (a request or a stream message, its first piece) was
    /// refused over the shared reassembly cap: its call, when still unanswered, ends now with
    /// [`Event::Refused`] (RESOURCE_EXHAUSTED naming the cap); the session stays open.
    #[cold]
    fn refuse_call(&mut self, h: &Header) {
        let Some(r) = &self.reassembly else { return };
        let (cap, field) = (r.held.cap(), r.held.field());
        let c = self.unanswered.iter_mut().find(|c| (c.slot, c.generation) == (h.slot, h.generation));
        if let Some(c) = c.filter(|c| !c.ended) {
            c.ended = true;
            self.events.push_back(Event::Refused {
                slot: h.slot,
                generation: h.generation,
                total_len: h.total_len,
                cap,
                field,
            });
        }
    }

    /// One received message as its completion delivered it: `msg` the bytes in the receive
    /// buffer, `overlong` when the message did not fit the buffer, `invalidated_key` when it
    /// came as SEND_WITH_INV. Checks, decodes ([`Header::decode`]) and applies the header
    /// ([`Session::handle_header`]). The one receive path of both ends.
    ///
    /// # Errors
    /// The reason to close the session with (the peer broke the protocol): log it, count it as
    /// malformed, close.
    #[inline(always)]
    pub fn receive(
        &mut self,
        msg: &[u8],
        overlong: bool,
        invalidated_key: bool,
        now: impl FnOnce() -> Instant,
    ) -> Result<Incoming, String> {
        let mut header = Header::new(Kind::Request);
        let ring = self.receive_into(msg, overlong, invalidated_key, now, &mut header)?;
        Ok(Incoming { header, ring })
    }

    /// [`Session::receive`] with the header decoded into `h` ([`Header::decode_into`]) instead
    /// of returned: the ring piece of a ring body, `None` for an eager one. On an error `h` is
    /// left unspecified.
    ///
    /// # Errors
    /// As [`Session::receive`]'s.
    #[inline(always)]
    pub fn receive_into(
        &mut self,
        msg: &[u8],
        overlong: bool,
        invalidated_key: bool,
        now: impl FnOnce() -> Instant,
        h: &mut Header,
    ) -> Result<Option<RingPiece>, String> {
        if invalidated_key || overlong {
            return Err(refused_completion(invalidated_key));
        }
        if let Err(e) = Header::decode_into(msg, h) {
            return Err(malformed(e));
        }
        if h.stream & crate::wire::STREAM_BATCH != 0 {
            // Checked whole before anything reads it (the readers walk its frames unchecked).
            check_batch(msg, h.count, h.metadata)?;
        }
        self.apply_header(h, now).map_err(violation)
    }

    /// Server: the request of `h` (its first piece) is unanswered from now on, until `deadline`
    /// (`None`: none), its life under the call limit not yet seen; the client's stream SENDs'
    /// count follows.
    #[inline(always)]
    fn admit_call(&mut self, h: &Header, deadline: Option<Instant>) {
        self.unanswered.push(Unanswered {
            slot: h.slot,
            generation: h.generation,
            deadline,
            ended: false,
            since: None,
        });
        self.sends.note(self.unanswered.len(), self.send_pool());
        self.sync_load();
        // Every granted credit taken: a raise may be due (`credits`).
        self.credits.since_flush = self.credits.since_flush.wrapping_add(1);
        if self.unanswered.len() == usize::from(self.credits.granted)
            || self.credits.since_flush == self.credits.granted
        {
            self.credits_full();
        }
    }

    /// Server: a request opened a stream (its first piece): it is unanswered like any request,
    /// and the client's messages get their first grant.
    #[cold]
    fn open_peer_stream(&mut self, h: &Header, deadline: Option<Instant>) {
        self.admit_call(h, deadline);
        let i = self.streams.open(
            h.slot,
            h.generation,
            h.stream & STREAM_IN != 0,
            h.stream & STREAM_OUT != 0,
            u32::from(h.count),
        );
        let g = self.streams.grant(i);
        if g > 0 {
            let c = stream::grant_header(&self.streams.list[i], g);
            self.push_grant(c);
        }
    }

    /// A stream message arrived (its first piece): it takes one of the credits granted to it.
    /// On a server, a message for a stream that ended is dropped by the driver (the client sent
    /// it before the answer reached it); a client always has the stream open until its answer.
    fn on_stream_msg(&mut self, h: &Header) -> Result<(), &'static str> {
        if h.metadata && self.role == Role::Server {
            return Err("the metadata flag on a client's stream message");
        }
        let Some(i) = self.streams.find(h.slot, h.generation) else {
            return match self.role {
                Role::Server => Ok(()),
                Role::Client => Err("stream message for no open stream"),
            };
        };
        let st = &mut self.streams.list[i];
        if !st.receives || st.peer_ended {
            return Err("stream message on a stream whose sender sends none, or ended");
        }
        if st.granted == 0 {
            return Err("stream message beyond its stream grants");
        }
        st.granted -= 1;
        st.held += 1;
        Ok(())
    }

    /// Queues a StreamGrant, merged into one already waiting for the same stream.
    fn push_grant(&mut self, c: Header) {
        if let Some(q) = self
            .controls
            .iter_mut()
            .find(|q| q.kind == Kind::StreamGrant && (q.slot, q.generation) == (c.slot, c.generation))
        {
            q.count = q.count.saturating_add(c.count);
        } else {
            self.controls.push_back(c);
        }
    }

    /// Client: the request `(slot, generation)` that opens a stream ([`STREAM_IN`] and/or
    /// [`STREAM_OUT`] in `flags`) goes on the wire now: the stream opens, and the returned
    /// credits (the server messages granted at once, 0 for a stream without server messages)
    /// go into the request's `credits`.
    pub fn stream_open(&mut self, slot: u16, generation: u32, flags: u8) -> u16 {
        let i = self.streams.open(slot, generation, flags & STREAM_OUT != 0, flags & STREAM_IN != 0, 0);
        self.streams.grant(i) as u16
    }

    /// Takes one send credit of the stream `(slot, generation)` for a message to send now.
    /// `Ok(false)`: no credit (the consumer has not taken enough yet): wait for its grant.
    ///
    /// # Errors
    /// [`StreamError::NoStream`] when the stream is not open (answered, never opened);
    /// [`StreamError::NotSending`] when this end sends no messages on it or ended them.
    pub fn stream_send(&mut self, slot: u16, generation: u32) -> Result<bool, StreamError> {
        let i = self.streams.find(slot, generation).ok_or(StreamError::NoStream)?;
        let st = &mut self.streams.list[i];
        if !st.sends || st.ended {
            return Err(StreamError::NotSending);
        }
        if st.send_grants == 0 {
            return Ok(false);
        }
        if self.role == Role::Client {
            // A client's stream SEND holds a request credit until the server counts it taken.
            let c = &self.calls.slots;
            if !self.sends.may_send(c.in_flight(), c.queued(), c.credits(), self.send_pool()) {
                return Ok(false);
            }
            self.sends.unreturned += 1;
        }
        let st = &mut self.streams.list[i];
        st.send_grants -= 1;
        Ok(true)
    }

    /// Gives back the send credit the last [`Session::stream_send`] of the stream took, for a
    /// message that was not sent after all (it did not encode to its `encoded_len`).
    pub fn stream_unsend(&mut self, slot: u16, generation: u32) {
        let Some(i) = self.streams.find(slot, generation) else { return };
        self.streams.list[i].send_grants += 1;
        if self.role == Role::Client {
            self.sends.unreturned = self.sends.unreturned.saturating_sub(1);
        }
    }

    /// Send credits of the stream `(slot, generation)`: messages this end may send now (`None`:
    /// no open stream).
    pub fn stream_send_grants(&self, slot: u16, generation: u32) -> Option<u32> {
        Some(self.streams.list[self.streams.find(slot, generation)?].send_grants)
    }

    /// Messages of the stream `(slot, generation)` received and not yet taken, and credits
    /// granted and not yet used (`None`: no open stream).
    pub fn stream_receive_window(&self, slot: u16, generation: u32) -> Option<(u32, u32)> {
        let s = &self.streams.list[self.streams.find(slot, generation)?];
        Some((s.held, s.granted))
    }

    /// Client: ends the client's messages on the stream `(slot, generation)` (a clean end, not a
    /// cancel): a StreamEnd goes to the server; later sends are refused.
    ///
    /// # Errors
    /// As [`Session::stream_send`].
    pub fn stream_end(&mut self, slot: u16, generation: u32) -> Result<(), StreamError> {
        let i = self.streams.find(slot, generation).ok_or(StreamError::NoStream)?;
        let st = &mut self.streams.list[i];
        if !st.sends || st.ended {
            return Err(StreamError::NotSending);
        }
        st.ended = true;
        self.controls.push_back(Header { slot, generation, ..Header::new(Kind::StreamEnd) });
        Ok(())
    }

    /// Server: whether the client ended its messages on the stream (its StreamEnd arrived).
    pub fn stream_peer_ended(&self, slot: u16, generation: u32) -> bool {
        self.streams.find(slot, generation).is_some_and(|i| self.streams.list[i].peer_ended)
    }

    /// The application took one received message of the stream `(slot, generation)`: its credit
    /// returns to the producer (batched; a StreamGrant from [`Session::next_control`]).
    pub fn stream_consumed(&mut self, slot: u16, generation: u32) {
        let Some(i) = self.streams.find(slot, generation) else { return };
        let st = &mut self.streams.list[i];
        if st.held == 0 {
            return;
        }
        st.held -= 1;
        self.streams.used = self.streams.used.saturating_sub(1);
        let g = self.streams.grant(i);
        if g > 0 {
            let c = stream::grant_header(&self.streams.list[i], g);
            self.push_grant(c);
        }
    }

    /// The stream `(slot, generation)` is over (client: its response arrived or the session
    /// failed; server: its answer is being sent, called by [`Session::on_answer_for`]): its
    /// budget returns to the other streams. Messages still held are the application's to drop.
    pub fn stream_close(&mut self, slot: u16, generation: u32) {
        let Some(i) = self.streams.find(slot, generation) else { return };
        let mut due = Vec::new();
        self.streams.close(i, &mut |h| due.push(h));
        for c in due {
            self.push_grant(c);
        }
    }

    /// Streams open.
    pub fn streams_open(&self) -> usize {
        self.streams.list.len()
    }

    fn check_credit(&self) -> Result<(), &'static str> {
        if self.unanswered.len() >= usize::from(self.credits.accept)
            || self.unanswered.len() as u64 + u64::from(self.sends.unreported())
                >= u64::from(self.send_pool())
        {
            return Err("request beyond the granted credits");
        }
        Ok(())
    }

    /// Where the bytes of `piece` go: the end of its message's buffer (which has room for them).
    /// The caller copies exactly `piece.len` bytes out of the ring and appends them.
    pub fn piece_buffer(&mut self, piece: &RingPiece) -> &mut Vec<u8> {
        &mut self.assemblies[piece.assembly].body
    }

    /// The piece was copied out: frees its ring space (in order) and returns the message once all
    /// its pieces are in.
    ///
    /// # Errors
    /// A reason when the caller appended a different number of bytes than the piece has (the
    /// message cannot be trusted): close the connection.
    pub fn piece_done(&mut self, piece: RingPiece) -> Result<Option<Complete>, &'static str> {
        self.consumer.release(piece.token);
        self.ring_freed = true;
        let a = &mut self.assemblies[piece.assembly];
        if a.refused {
            a.dropped += u64::from(piece.len);
            if a.dropped < u64::from(a.header.total_len) {
                return Ok(None);
            }
            let a = self.assemblies.swap_remove(piece.assembly);
            // A server answered the call when its first piece came (`Event::Refused`).
            return Ok(match (self.role, &self.reassembly) {
                (Role::Client, Some(r)) => Some(Complete {
                    refused: Some(refused_status(a.header.total_len, r.held.cap(), r.held.field())),
                    header: a.header,
                    body: Vec::new(),
                }),
                _ => None,
            });
        }
        let a = &self.assemblies[piece.assembly];
        if a.body.len() > a.header.total_len as usize {
            return Err("ring piece copied past its message's total_len");
        }
        if a.body.len() < a.header.total_len as usize {
            return Ok(None);
        }
        let a = self.assemblies.swap_remove(piece.assembly);
        Ok(Some(Complete { header: a.header, body: a.body, refused: None }))
    }

    /// The spare body buffers of this session (received bodies come back there; bodies waiting
    /// on the heap to be sent are encoded into them and given back once copied out).
    pub fn spare_bodies(&self) -> &std::sync::Arc<BodyRecycler> {
        &self.recycler
    }

    /// A complete body as `Bytes` whose buffer is reused for a later message of this session
    /// once the last `Bytes` sharing it is dropped (on any thread).
    pub fn body_bytes(&self, body: Vec<u8>) -> bytes::Bytes {
        RecycledBody::new(body, self.recycler.clone()).into_bytes()
    }

    /// Ring messages being received (partly arrived).
    pub fn assemblies(&self) -> usize {
        self.assemblies.len()
    }
}

/// The reason a session closes when a body in pieces would take what it alone holds for
/// reassembly over its share of the server's cap.
const REASSEMBLY_SHARE: &str = "a body in pieces would take this session's memory held for reassembly over \
                                its share (ServerConfig::max_reassembly_bytes_per_session)";

/// Whether `reason` (from [`Session::receive`]) closes the session for going over its share of
/// the server's reassembly cap (the driver counts it apart).
pub fn is_reassembly_cap(reason: &str) -> bool {
    reason.ends_with(REASSEMBLY_SHARE)
}

/// The status of a call whose body in pieces of `total_len` bytes was refused over the
/// reassembly cap of `cap` bytes set by the configuration `field`.
pub(crate) fn refused_status(total_len: u32, cap: u64, field: &str) -> Status {
    Status::resource_exhausted(format!(
        "a body of {total_len} bytes arriving in pieces would take the memory held for reassembly over \
         {field} ({cap} bytes): the call is refused, the session stays open"
    ))
}

/// The driver's clock for one received header: read at most once, and only when needed (a
/// deadline, a body that starts arriving in pieces).
struct Clock<F> {
    read: Option<F>,
    at: Option<Instant>,
}

impl<F: FnOnce() -> Instant> Clock<F> {
    fn now(&mut self) -> Option<Instant> {
        if self.at.is_none() {
            self.at = self.read.take().map(|f| f());
        }
        self.at
    }

    /// The deadline of a request with `timeout_us` (0: none).
    fn deadline(&mut self, timeout_us: u32) -> Option<Instant> {
        if timeout_us == 0 {
            return None;
        }
        self.now().map(|t| t + Duration::from_micros(u64::from(timeout_us)))
    }
}

/// Why a received message is refused before its header is read: SEND_WITH_INV
/// (`invalidated_key`), or longer than a receive buffer.
#[cold]
#[inline(never)]
fn refused_completion(invalidated_key: bool) -> String {
    if invalidated_key {
        // Nothing in the protocol invalidates a key: the peer killed a ring's window.
        "protocol violation: the peer invalidated a key (SEND_WITH_INV)".into()
    } else {
        "message longer than a receive buffer".into()
    }
}

#[cold]
#[inline(never)]
fn malformed(e: crate::wire::WireError) -> String {
    format!("malformed header: {e}")
}

#[cold]
#[inline(never)]
fn violation(reason: &str) -> String {
    format!("protocol violation: {reason}")
}

/// Checks a stream batch's frames ([`crate::wire::batch_frames`]), after its metadata block
/// (`metadata`: the stream's headers, [`crate::wire::METADATA`]).
#[inline(never)]
fn check_batch(msg: &[u8], count: u16, metadata: bool) -> Result<(), String> {
    let body = msg.get(crate::wire::HEADER_LEN..).unwrap_or(&[]);
    let frames = if metadata {
        let at = crate::wire::metadata_block_len(body)
            .ok_or_else(|| "malformed stream batch: a metadata block longer than the body".to_string())?;
        &body[at..]
    } else {
        body
    };
    crate::wire::batch_frames(frames, count).map(drop).map_err(|e| format!("malformed stream batch: {e}"))
}

#[cfg(test)]
mod meter_tests;
#[cfg(test)]
mod reassembly_tests;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
