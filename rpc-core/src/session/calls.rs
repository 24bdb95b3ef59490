//! The client's calls, sans-IO: which call may go on the wire now (slots, credits, FIFO order:
//! [`CallSlots`]), what its request header carries (slot, generation, the time left of its
//! deadline, its stream's first credits), when its Cancel goes (at once, or after the last piece
//! of a request still leaving through the ring, never before), and the cap on calls abandoned
//! but not yet acknowledged.
//!
//! **Abandon cap.** A call abandoned on the wire keeps its slot until the server's answer to it
//! (its acknowledgement) arrives. When `max_abandoned` such calls wait, the session starts a
//! watch; if no acknowledgement arrives within the acknowledgement timeout (`peer_timeout`, 5 s
//! without one), [`Event::Unacknowledged`] tells the driver to reset the session. Nothing waits
//! for it: the caller that reached the cap returns at once, and calls started meanwhile queue
//! behind the held slots.
//!
//! The driver keeps what the calls carry (request bodies, answers) in arrays indexed by slot;
//! this module holds only their state and metadata.

use std::time::{Duration, Instant};

use super::lifecycle::Event;
use super::slots::{Abandoned, CallSlots, ResponseFate};
use super::Session;
use crate::wire::{Header, Kind};

/// What the acknowledgement timeout is without a `peer_timeout`.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// What a call waiting for a credit goes out with.
#[derive(Clone, Copy, Debug, Default)]
struct CallMeta {
    method: u32,
    deadline: Option<Instant>,
    /// Stream flags of the request ([`crate::wire::STREAM_OUT`]...; 0: unary).
    stream: u8,
    /// The request's body starts with a metadata block ([`crate::wire::METADATA`]).
    metadata: bool,
    /// Its use of the session's cached block: 0, [`crate::wire::METADATA_STORE`] or
    /// [`crate::wire::METADATA_CACHED`].
    metadata_cache: u8,
}

impl CallMeta {
    /// A call to `method` until `deadline` with the request `flags` of [`Session::start_call`].
    #[inline(always)]
    fn new(method: u32, deadline: Option<Instant>, flags: u8) -> CallMeta {
        use crate::wire::{METADATA, METADATA_CACHED, METADATA_STORE, STREAM_IN, STREAM_OUT};
        CallMeta {
            method,
            deadline,
            stream: flags & (STREAM_IN | STREAM_OUT),
            metadata: flags & METADATA != 0,
            metadata_cache: flags & (METADATA_STORE | METADATA_CACHED),
        }
    }
}

/// The client's side of the session's cached metadata block (protocol 11, see
/// [`crate::wire::METADATA_STORE`]): which block the server keeps, as far as the requests that
/// left tell, and the one request started to replace it that has not left yet.
///
/// A request may name the kept block ([`crate::wire::METADATA_CACHED`]) only while no store
/// waits to leave: requests leave in the order they started, and the server takes eager ones in
/// the order they arrive, so every request that names the block reaches the server after the
/// store that kept it and before any later one. A store abandoned before it left never reaches
/// the server: the block it carried is forgotten, and the one before it stays kept.
#[derive(Debug, Default)]
struct BlockCache {
    /// The entries (a [`crate::Metadata`]'s encoding without its head) of the block the server
    /// keeps once every request that left so far has arrived; `None` before any store left.
    kept: Option<Vec<u8>>,
    /// The store that has not left yet: its slot and generation.
    queued: Option<(u16, u32)>,
    /// That store's entries (its buffer reused from store to store).
    queued_block: Vec<u8>,
}

/// The watch started when the abandon cap was reached.
#[derive(Clone, Copy, Debug)]
struct AckWatch {
    since: Instant,
    /// Abandoned calls at that moment: one acknowledgement (fewer than these) ends the watch.
    abandoned: u16,
}

/// A client session's calls (see the module docs).
pub(super) struct Calls {
    pub(super) slots: CallSlots<()>,
    meta: Vec<CallMeta>,
    /// Calls abandoned on the wire at which the watch starts (1..=window).
    max_abandoned: u16,
    ack_timeout: Duration,
    watch: Option<AckWatch>,
    /// The session's cached metadata block.
    cache: BlockCache,
}

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calls")
            .field("window", &self.slots.window())
            .field("in_flight", &self.slots.in_flight())
            .field("abandoned", &self.slots.abandoned())
            .field("watch", &self.watch)
            .finish()
    }
}

impl Calls {
    /// `window` slots, `credits` on the wire; the cap defaults to the most calls that can be
    /// abandoned on the wire ([`Calls::cap_max`]).
    pub(super) fn new(window: u16, credits: u16) -> Calls {
        let slots = CallSlots::new(window, credits);
        let window = slots.window();
        let max_abandoned = window.min(slots.credits()).max(1);
        Calls {
            slots,
            meta: vec![CallMeta::default(); usize::from(window)],
            max_abandoned,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            watch: None,
            cache: BlockCache::default(),
        }
    }

    /// The most calls that can be abandoned on the wire at once: each holds its credit until
    /// acknowledged, so the credits the server granted when fewer than the window (a cap above
    /// them would never be reached).
    fn cap_max(&self) -> u16 {
        self.slots.window().min(self.slots.credits()).max(1)
    }

    /// When the watch ends the session.
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        self.watch.map(|w| w.since + self.ack_timeout)
    }

    /// Applies `now` to the watch: ended by an acknowledgement, or expired (an event).
    pub(super) fn check(&mut self, now: Instant) -> Option<Event> {
        let w = self.watch?;
        if self.slots.abandoned() < w.abandoned {
            self.watch = None;
            return None;
        }
        let waited = now.saturating_duration_since(w.since);
        if waited < self.ack_timeout {
            return None;
        }
        self.watch = None;
        Some(Event::Unacknowledged { abandoned: self.slots.abandoned(), waited })
    }
}

impl BlockCache {
    /// The request `(slot, generation)` with [`crate::wire::METADATA_STORE`] left: its block is
    /// the one the server keeps from now on.
    #[cold]
    fn left(&mut self, slot: u16, generation: u32) {
        if self.queued == Some((slot, generation)) {
            self.queued = None;
            let kept = self.kept.get_or_insert_with(Vec::new);
            std::mem::swap(kept, &mut self.queued_block);
        }
    }
}

impl Session {
    /// Client: the call slots (window, credits, states).
    #[inline]
    pub fn calls(&self) -> &CallSlots<()> {
        &self.calls.slots
    }

    /// Client: sets the abandon cap (`max_abandoned`, at most the window and at most the credits
    /// the server granted: only calls on the wire are abandoned on it, and they hold a credit
    /// each) and how long the session waits for an acknowledgement once it is reached
    /// (`ack_timeout`).
    pub fn set_abandon_cap(&mut self, max_abandoned: u16, ack_timeout: Duration) {
        self.calls.max_abandoned = max_abandoned.clamp(1, self.calls.cap_max());
        self.calls.ack_timeout = ack_timeout;
    }

    /// Client: takes a free slot for a call to `method` and queues it for a credit. `flags`: the
    /// request's stream flags ([`crate::wire::STREAM_IN`], [`crate::wire::STREAM_OUT`]) and
    /// [`crate::wire::METADATA`] when its body starts with a metadata block. `None` when every
    /// slot is taken.
    #[inline]
    pub fn start_call(&mut self, method: u32, deadline: Option<Instant>, flags: u8) -> Option<(u16, u32)> {
        let (slot, generation) = self.calls.slots.start()?;
        self.calls.meta[slot as usize] = CallMeta::new(method, deadline, flags);
        Some((slot, generation))
    }

    /// Client: how a request whose message encodes to `message_len` bytes carries the metadata
    /// block of `entries` (a [`crate::Metadata`]'s encoding without its 6-byte head): naming
    /// the session's cached block ([`crate::wire::METADATA_CACHED`]: it equals the one the
    /// server keeps and no store waits to leave), replacing it
    /// ([`crate::wire::METADATA_STORE`]: no store waits to leave and the block is at most
    /// [`crate::wire::MAX_CACHED_BLOCK`] bytes), or 0: in full, the cache untouched. Only an
    /// eager request (its body, with the block when it carries one, at most the eager
    /// threshold) takes part. A call started with [`crate::wire::METADATA_STORE`] is given its
    /// block by [`Session::store_block`] before anything else starts.
    #[inline]
    pub fn metadata_cache_flag(&self, entries: &[u8], message_len: usize) -> u8 {
        let c = &self.calls.cache;
        let eager = self.params.eager_threshold as usize;
        if c.queued.is_some() || message_len > eager {
            return 0;
        }
        let block = crate::metadata::BLOCK_HEAD + entries.len();
        if c.kept.as_deref() == Some(entries) {
            crate::wire::METADATA_CACHED
        } else if block <= crate::wire::MAX_CACHED_BLOCK && message_len + block <= eager {
            crate::wire::METADATA_STORE
        } else {
            0
        }
    }

    /// Client: the call `(slot, generation)`, just started with [`crate::wire::METADATA_STORE`],
    /// carries the block of `entries`: once it leaves, that is the block the server keeps.
    pub fn store_block(&mut self, slot: u16, generation: u32, entries: &[u8]) {
        let c = &mut self.calls.cache;
        c.queued = Some((slot, generation));
        c.queued_block.clear();
        c.queued_block.extend_from_slice(entries);
    }

    /// Client: takes a free slot for a call to `method` that goes on the wire at once (the
    /// driver queues its request before anything else; see [`Session::call_goes_now`]), with
    /// the request's `flags` as [`Session::start_call`]'s and, when they have
    /// [`crate::wire::METADATA_STORE`], the `block` it stores (as [`Session::store_block`]'s
    /// `entries`). The call is in flight from here; returns its request header, as
    /// [`Session::next_request`] would have given it. `None`, nothing taken, when it cannot go
    /// now (no free slot, a call queued before it, no credit).
    #[inline(always)]
    pub fn start_call_now(
        &mut self,
        method: u32,
        deadline: Option<Instant>,
        flags: u8,
        block: Option<&[u8]>,
        now: impl FnOnce() -> Instant,
    ) -> Option<Header> {
        if !self.request_room() {
            return None;
        }
        let (slot, generation) = self.calls.slots.start_now()?;
        let m = CallMeta::new(method, deadline, flags);
        if m.metadata_cache == crate::wire::METADATA_STORE {
            if let Some(entries) = block {
                self.store_block(slot, generation, entries);
            }
        }
        Some(self.request_header(slot, generation, m, now))
    }

    /// Client: whether a call started now goes on the wire at once (a credit is free and no call
    /// waits before it). Only such a call may take a ring reservation
    /// ([`super::Placement::Ring`]), which must be queued before anything else is placed.
    #[inline]
    pub fn call_goes_now(&self) -> bool {
        let c = &self.calls.slots;
        c.queued() == 0 && c.in_flight() < c.credits() && self.request_room()
    }

    /// Client: the header of the next queued call that may go on the wire now (a credit is
    /// free), in the order the calls started: its slot, generation, method, the time left of
    /// its deadline (`now` is read only for a call with one; at least 1 µs) and, for a stream,
    /// its first credits. The call counts as in flight from here. `None` when nothing may go.
    #[inline(always)]
    pub fn next_request(&mut self, now: impl FnOnce() -> Instant) -> Option<Header> {
        // Inlined into the driver's loop: usually nothing waits, and that costs a few compares.
        // The client's stream SENDs not yet counted taken hold request credits too.
        if !self.request_room() {
            return None;
        }
        let (slot, generation) = self.calls.slots.next_sendable()?;
        let m = self.calls.meta[slot as usize];
        Some(self.request_header(slot, generation, m, now))
    }

    /// The request header of the call `(slot, generation)` with `m`, which just went in flight
    /// ([`Session::next_request`], [`Session::start_call_now`]): its slot, generation, method,
    /// the time left of its deadline (`now` is read only for a call with one; at least 1 µs)
    /// and, for a stream, its first credits (the stream opens here). Its request has left from
    /// here on (a block it stores is the one the server keeps).
    #[inline(always)]
    fn request_header(
        &mut self,
        slot: u16,
        generation: u32,
        m: CallMeta,
        now: impl FnOnce() -> Instant,
    ) -> Header {
        let timeout_us = m.deadline.map_or(0, |d| {
            d.saturating_duration_since(now()).as_micros().clamp(1, u128::from(u32::MAX)) as u32
        });
        let mut h = Header {
            slot,
            generation,
            method: m.method,
            timeout_us,
            metadata: m.metadata,
            metadata_cache: m.metadata_cache,
            ..Header::new(Kind::Request)
        };
        if m.metadata_cache == crate::wire::METADATA_STORE {
            self.calls.cache.left(slot, generation);
        }
        if m.stream != 0 {
            h.stream = m.stream;
            h.count = self.stream_open(slot, generation, m.stream);
        }
        h
    }

    /// Client: a response for `(slot, generation)` arrived (the session checked its header).
    /// [`ResponseFate::Stored`]: the driver keeps the answer for the caller;
    /// [`ResponseFate::Discard`]: the call was abandoned (this was its acknowledgement), release it.
    ///
    /// # Errors
    /// The reason when no call of that slot and generation is on the wire: close the session.
    #[inline]
    pub fn on_response(&mut self, slot: u16, generation: u32) -> Result<ResponseFate<()>, &'static str> {
        if self.streams_open() > 0 {
            self.stream_close(slot, generation);
        }
        let fate = self.calls.slots.on_response(slot, generation, ()).map_err(|(reason, ())| reason)?;
        if fate == ResponseFate::Discard(()) {
            self.withdraw_cancel(slot, generation);
        }
        Ok(fate)
    }

    /// An abandoned call was answered while its Cancel still waited to be posted: the Cancel is
    /// not sent (nothing is left to cancel), so no acknowledgement is awaited.
    #[cold]
    fn withdraw_cancel(&mut self, slot: u16, generation: u32) {
        let before = self.controls.len();
        self.controls.retain(|c| !(c.kind == Kind::Cancel && (c.slot, c.generation) == (slot, generation)));
        if self.controls.len() != before {
            self.calls.slots.cancel_withdrawn(slot, generation);
        }
    }

    /// Client: whether `(slot, generation)` has its answer; if so its slot is free again (the
    /// driver hands the answer it kept to the caller).
    #[inline]
    pub fn take_done(&mut self, slot: u16, generation: u32) -> bool {
        self.calls.slots.take_done(slot, generation).is_some()
    }

    /// Client: the caller gave up on `(slot, generation)` (future dropped, deadline passed,
    /// explicit cancel). On the wire, its Cancel is queued now, or, when `leaving` (its request
    /// is still being sent in pieces), by [`Session::request_left`] after its last piece: the
    /// server must never see a Cancel overtake pieces of its call, whose slot may be reused once
    /// the Cancel is answered. Reaching the abandon cap starts the acknowledgement watch at
    /// `now` (read only then). See [`Abandoned`] for what the driver releases.
    pub fn abandon_call(
        &mut self,
        slot: u16,
        generation: u32,
        leaving: bool,
        now: impl FnOnce() -> Instant,
    ) -> Abandoned<()> {
        let r = self.calls.slots.abandon(slot, generation);
        if r == Abandoned::Unsent && self.calls.cache.queued == Some((slot, generation)) {
            // It never reaches the server: the block before it stays kept.
            self.calls.cache.queued = None;
        }
        if r == Abandoned::OnWire {
            if !leaving {
                self.cancel(slot, generation);
            }
            let abandoned = self.calls.slots.abandoned();
            if abandoned >= self.calls.max_abandoned && self.calls.watch.is_none() {
                self.calls.watch = Some(AckWatch { since: now(), abandoned });
            }
        }
        r
    }

    /// Client: the last piece of the request `(slot, generation)` left: its Cancel follows now
    /// if its caller gave up while it was leaving.
    pub fn request_left(&mut self, slot: u16, generation: u32) {
        if self.calls.slots.is_abandoned(slot, generation) {
            self.cancel(slot, generation);
        }
    }

    /// Client: the connection is gone: every queued or in-flight call is done (the driver gives
    /// each the session's failure), abandoned ones are freed. Returns how many calls failed.
    pub fn fail_calls(&mut self) -> usize {
        self.calls.watch = None;
        self.calls.cache = BlockCache::default();
        self.calls.slots.fail_all(|| ())
    }

    /// Client: the abandoned calls held at which the watch starts.
    pub fn max_abandoned(&self) -> u16 {
        self.calls.max_abandoned
    }
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
