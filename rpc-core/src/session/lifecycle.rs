//! The life of calls and of the peer, sans-IO: server-side call deadlines, cancellation, and the
//! idle probe of the RDMA path. Driven by [`super::Session`]: received headers feed it, the
//! driver calls [`super::Session::handle_timeout`] with `now` when [`super::Session::poll_timeout`]
//! says so (or on its own coarser tick), and takes control messages to send
//! ([`super::Session::next_control`]) and events ([`super::Session::poll_event`]).
//!
//! Liveness: the peer is *silent* while nothing arrives from it. A driver that is waiting for the
//! peer (calls outstanding) sends a Ping after `peer_timeout / 3` of silence, again after each
//! further third, and reports [`Event::PeerDead`] after `peer_timeout` of silence. Only a process
//! that runs answers a Ping (a NIC acknowledges a SEND even for a stopped process), so a
//! SIGSTOPped or hung peer is detected, not only a vanished host. Arrivals are noted with a flag
//! (no clock read per message); the clock is read only by `handle_timeout`, so silence is measured
//! from the first check that saw the last arrival (never shorter than the real silence).

use std::time::{Duration, Instant};

use crate::status::Status;
use crate::wire::{Header, Kind};

/// Something the driver must act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Server: the client cancelled the unanswered call `(slot, generation)`: answer it CANCELLED
    /// now (tell its deferred `Responder`); a later answer is dropped.
    Cancelled {
        /// Call slot.
        slot: u16,
        /// Slot generation.
        generation: u32,
    },
    /// Server: the unanswered call's deadline passed: answer it DEADLINE_EXCEEDED now (tell its
    /// deferred `Responder`); a later answer is dropped.
    Expired {
        /// Call slot.
        slot: u16,
        /// Slot generation.
        generation: u32,
    },
    /// Nothing arrived from the peer for `peer_timeout` while this end waited for it, probes
    /// included: close the session; its calls end UNAVAILABLE.
    PeerDead {
        /// The silence observed.
        silent: Duration,
    },
    /// Server: the unanswered call ran past the server's `max_call_duration` (`limit`): answer it
    /// DEADLINE_EXCEEDED now, naming the setting (tell its deferred `Responder`); a later
    /// answer is dropped.
    Overran {
        /// Call slot.
        slot: u16,
        /// Slot generation.
        generation: u32,
        /// The bound it ran past.
        limit: Duration,
    },
    /// Client: `max_abandoned` calls were abandoned on the wire and no acknowledgement of any
    /// arrived within the acknowledgement timeout: reset the session (its calls end
    /// UNAVAILABLE) instead of starving the window.
    Unacknowledged {
        /// Calls abandoned and not acknowledged.
        abandoned: u16,
        /// How long the session waited for one acknowledgement.
        waited: Duration,
    },
    /// Server: a body that started arriving in pieces has not finished within the reassembly
    /// timeout ([`super::Session::set_reassembly`]): close the session (it frees the body).
    ReassemblyExpired {
        /// How long the body has been arriving.
        waited: Duration,
    },
    /// Server: the body in pieces of the unanswered call (a request, or a message of its
    /// stream) would take the memory held for reassembly over its shared cap: answer the call
    /// RESOURCE_EXHAUSTED naming the cap now (tell its deferred `Responder`); its pieces are
    /// dropped as they arrive and the session stays open ([`super::Session::set_reassembly`]).
    Refused {
        /// Call slot.
        slot: u16,
        /// Slot generation.
        generation: u32,
        /// The body's announced length in bytes.
        total_len: u32,
        /// The cap in bytes.
        cap: u64,
        /// The configuration field that sets the cap.
        field: &'static str,
    },
}

impl Event {
    /// Server: the answer an event that ends a call gives it now, as an error answer for the
    /// outbox (its header and status): CANCELLED for [`Event::Cancelled`], DEADLINE_EXCEEDED for
    /// [`Event::Expired`], RESOURCE_EXHAUSTED for [`Event::Refused`]. `None` for the events that end the session instead.
    pub fn answer(&self) -> Option<(Header, Status)> {
        let (slot, generation, status) = match *self {
            Event::Cancelled { slot, generation } => {
                (slot, generation, Status::cancelled("the client cancelled the call"))
            }
            Event::Expired { slot, generation } => {
                (slot, generation, Status::deadline_exceeded("the call's deadline passed before its answer"))
            }
            Event::Overran { slot, generation, limit } => (
                slot,
                generation,
                Status::deadline_exceeded(format!(
                    "the call ran past the server's max_call_duration of {} ms (ServerConfig::max_call_duration)",
                    limit.as_millis()
                )),
            ),
            Event::Refused { slot, generation, total_len, cap, field } => {
                (slot, generation, super::refused_status(total_len, cap, field))
            }
            Event::PeerDead { .. } | Event::Unacknowledged { .. } | Event::ReassemblyExpired { .. } => {
                return None
            }
        };
        Some((Header { slot, generation, ..Header::new(Kind::Response) }, status))
    }
}

/// A request received and not yet answered (server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Unanswered {
    pub(super) slot: u16,
    pub(super) generation: u32,
    /// When the client stops waiting, from the request's `timeout_us`.
    pub(super) deadline: Option<Instant>,
    /// Cancelled or expired: an answer is already decided (CANCELLED / DEADLINE_EXCEEDED).
    pub(super) ended: bool,
    /// The first timer check that saw it (its [`CallLimit`] counts from there).
    pub(super) since: Option<Instant>,
}

/// The server's bound on the life of a call (`ServerConfig::max_call_duration`), whatever its
/// deadline: a handler that holds its `Responder` forever cannot hold the call's slot and the
/// client's credit forever. No clock read per call: a call's time counts from the first timer
/// check that sees it, so a call is never cut shorter than the bound.
#[derive(Debug, Default)]
pub(super) struct CallLimit {
    /// `None`: no bound.
    pub(super) max: Option<Duration>,
    /// The last `now` given to the session: when calls not yet seen by a check are due for one.
    pub(super) last: Option<Instant>,
}

impl CallLimit {
    /// When [`CallLimit::check`] has something to do for `calls`.
    pub(super) fn next(&self, calls: &[Unanswered]) -> Option<Instant> {
        let max = self.max?;
        calls.iter().filter(|c| !c.ended).filter_map(|c| c.since.map_or(self.last, |s| Some(s + max))).min()
    }

    /// Stamps the calls not seen yet with `now` and ends those past the bound
    /// ([`Event::Overran`]).
    pub(super) fn check(
        &mut self,
        calls: &mut [Unanswered],
        now: Instant,
        events: &mut std::collections::VecDeque<Event>,
    ) {
        self.last = Some(now);
        let Some(limit) = self.max else { return };
        for c in calls.iter_mut().filter(|c| !c.ended) {
            match c.since {
                None => c.since = Some(now),
                Some(s) if now.saturating_duration_since(s) >= limit => {
                    c.ended = true;
                    events.push_back(Event::Overran { slot: c.slot, generation: c.generation, limit });
                }
                Some(_) => {}
            }
        }
    }
}

/// Idle-probe state of one session.
#[derive(Debug)]
pub(super) struct Liveness {
    /// `None`: no probing.
    pub(super) peer_timeout: Option<Duration>,
    /// Something arrived since the last check.
    pub(super) rx_seen: bool,
    /// When silence started (at the check that last saw an arrival).
    pub(super) quiet_since: Option<Instant>,
    /// The last check (a gap longer than two probe intervals since then resets the silence:
    /// nobody was watching).
    pub(super) last_check: Option<Instant>,
    /// Pings sent in the current silence.
    pub(super) pings: u32,
    /// The last check was made while waiting (silence counts only from a waiting check on).
    pub(super) was_waiting: bool,
    /// A Ping or a Pong waits to be sent.
    pub(super) ping_due: bool,
    pub(super) pong_due: bool,
}

impl Liveness {
    pub(super) fn new(peer_timeout: Option<Duration>) -> Liveness {
        Liveness {
            peer_timeout,
            rx_seen: false,
            quiet_since: None,
            last_check: None,
            pings: 0,
            was_waiting: false,
            ping_due: false,
            pong_due: false,
        }
    }

    fn interval(t: Duration) -> Duration {
        (t / 3).max(Duration::from_millis(1))
    }

    /// The next instant at which [`Liveness::check`] has something to do, when `waiting`.
    pub(super) fn next(&self, waiting: bool) -> Option<Instant> {
        let t = self.peer_timeout?;
        if !waiting {
            return None;
        }
        let Some(q) = self.quiet_since.filter(|_| self.was_waiting) else { return self.last_check };
        let ping = q + Liveness::interval(t) * (self.pings + 1);
        Some(ping.min(q + t))
    }

    /// Applies the passage of time. `waiting`: this end expects something from the peer (calls
    /// outstanding). Returns the silence when the peer is to be declared dead.
    pub(super) fn check(&mut self, now: Instant, waiting: bool) -> Option<Duration> {
        let t = self.peer_timeout?;
        let interval = Liveness::interval(t);
        // A driver checks at least at each `next()` (one interval apart): a gap of two intervals
        // means nobody was watching (the thread did not run), and that is not the peer's silence.
        let unwatched = self.last_check.is_none_or(|c| now.saturating_duration_since(c) > 2 * interval);
        self.last_check = Some(now);
        let was_waiting = std::mem::replace(&mut self.was_waiting, waiting);
        if self.rx_seen || !waiting || !was_waiting || unwatched || self.quiet_since.is_none() {
            self.rx_seen = false;
            self.quiet_since = Some(now);
            self.pings = 0;
            return None;
        }
        let silent = now.saturating_duration_since(self.quiet_since?);
        if silent >= t {
            return Some(silent);
        }
        if silent >= interval * (self.pings + 1) {
            self.pings += 1;
            self.ping_due = true;
        }
        None
    }
}

/// Server: how long a session has had no call in flight, for `ServerConfig::idle_timeout`
/// (as gRPC's `max_connection_idle`): [`super::Session::handle_idle`] is asked now and then
/// (the worker's idle sweep), never per message; an answer sent since the last look
/// (`answered`, one store per answer) or a call, stream or message in pieces in flight now makes
/// the session busy again. Pings, Pongs and ring returns do not: a client that only probes is
/// idle.
#[derive(Debug, Default)]
pub(super) struct IdleTimer {
    /// `None`: sessions are never closed for being idle.
    pub(super) timeout: Option<Duration>,
    /// Answers sent (a wrapping count; the credits' idle sweep reads it too).
    pub(super) answers: u32,
    /// `answers` at the last look.
    seen: u32,
    /// The first look that found the session idle (and every look since did).
    pub(super) since: Option<Instant>,
}

impl IdleTimer {
    /// A look at `now`; `busy`: a call, stream or message in pieces is in flight. Returns how
    /// long the session has been idle when that is `timeout` or more.
    pub(super) fn look(&mut self, now: Instant, busy: bool) -> Option<Duration> {
        let timeout = self.timeout?;
        let answered = std::mem::replace(&mut self.seen, self.answers) != self.answers;
        if busy || answered {
            self.since = None;
            return None;
        }
        let idle = now.saturating_duration_since(*self.since.get_or_insert(now));
        (idle >= timeout).then_some(idle)
    }
}
