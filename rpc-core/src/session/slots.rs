//! The client's call slots: a fixed window of request slots with generations, and the credits
//! that bound how many requests are on the wire (sans-IO).
//!
//! A call takes a free slot (its generation increments), waits in FIFO order for a credit, goes
//! on the wire, and ends when its response arrives (the credit returns with it). A call whose
//! caller gave up (deadline passed, future dropped) before it was sent is dropped at once (its
//! slot is free again). One on the wire is *abandoned*: the driver sends a Cancel, and the slot
//! and its credit stay taken until the response arrives (the server answers every request once:
//! its answer or CANCELLED) and is discarded, so the server can no longer write into ring space
//! of the call and a late response can never land in a reused slot (the generation check rejects
//! anything else), **and** until the server's acknowledgement of the Cancel
//! ([`crate::wire::Kind::CancelAck`]) arrived. The second half is the rule that bounds what a
//! client can have sent that the server has not taken: a Cancel that crossed its call's answer
//! would otherwise free the credit while the Cancel still travels, and the credit's next request
//! (and its Cancel) would join it. With it, every credit covers at most one request and one
//! Cancel at the server ([`CallSlots::in_flight`] counts both), so the server's receive
//! reservation is a constant per credit (`endpoint::conn::srq_need`). A Cancel withdrawn before
//! it was posted ([`CallSlots::cancel_withdrawn`]) needs no acknowledgement.

use std::collections::VecDeque;

/// Where a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Not in use.
    Free,
    /// Encoded, waiting for a credit.
    Queued,
    /// On the wire, response not yet received.
    InFlight,
    /// Response received, not yet taken by the caller.
    Done,
    /// The caller gave up; the response will be discarded when it arrives, and the slot (and
    /// its credit) frees once the response and the acknowledgement of its Cancel both arrived.
    Abandoned,
}

/// What [`CallSlots::abandon`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Abandoned<T> {
    /// Not a call of this slot and generation, or abandoned already: nothing.
    Nothing,
    /// It had not been sent: the slot is free again (the caller releases the call's body).
    Unsent,
    /// It is on the wire: send a Cancel ([`CallSlots::cancel_queued`]); the slot frees when
    /// the response and the Cancel's acknowledgement arrived.
    OnWire,
    /// Its response had arrived: the slot is free again, here is the result to release.
    Answered(T),
}

/// What to do with a response that arrived.
#[derive(Debug, PartialEq, Eq)]
pub enum ResponseFate<T> {
    /// Stored for the caller ([`CallSlots::take_done`]).
    Stored,
    /// The call was abandoned: the result comes back so its buffers can be released.
    Discard(T),
}

struct Slot<T> {
    generation: u32,
    state: SlotState,
    /// On the wire (an abandoned call may still be queued: it is sent anyway, since its ring space
    /// is reserved, and its answer discarded).
    sent: bool,
    result: Option<T>,
    /// Abandoned: its Cancel was queued for the wire (its acknowledgement is awaited).
    cancel_sent: bool,
    /// Abandoned: its response arrived (and was discarded).
    answered: bool,
    /// Abandoned: the acknowledgement of its Cancel arrived.
    acked: bool,
}

/// A fixed window of call slots. `T` is what a response leaves for the caller.
pub struct CallSlots<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u16>,
    queue: VecDeque<u16>,
    credits: u16,
    in_flight: u16,
    /// Calls abandoned on the wire whose response has not arrived.
    abandoned: u16,
}

impl<T> CallSlots<T> {
    /// `window` slots (1..=u16::MAX), `credits` requests allowed on the wire (1..=window).
    pub fn new(window: u16, credits: u16) -> CallSlots<T> {
        let window = window.max(1);
        CallSlots {
            slots: (0..window)
                .map(|_| Slot {
                    generation: 0,
                    state: SlotState::Free,
                    sent: false,
                    result: None,
                    cancel_sent: false,
                    answered: false,
                    acked: false,
                })
                .collect(),
            free: (0..window).rev().collect(),
            queue: VecDeque::with_capacity(window as usize),
            credits: credits.clamp(1, window),
            in_flight: 0,
            abandoned: 0,
        }
    }

    /// Number of slots.
    pub fn window(&self) -> u16 {
        self.slots.len() as u16
    }

    /// Credits granted by the server.
    pub fn credits(&self) -> u16 {
        self.credits
    }

    /// The server granted `credits` (clamped to 1..=window): calls start while fewer are in
    /// flight; a lowering below the calls in flight stops new starts only.
    pub fn set_credits(&mut self, credits: u16) {
        self.credits = credits.clamp(1, self.window());
    }

    /// Credits in use: requests on the wire, abandoned ones included until their response and
    /// their Cancel's acknowledgement arrived (at most [`CallSlots::credits`]).
    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    /// Slots taken: calls queued for a credit, on the wire, or finished and not yet taken by
    /// their caller (at most [`CallSlots::window`]).
    pub fn used(&self) -> u16 {
        (self.slots.len() - self.free.len()) as u16
    }

    /// Calls abandoned on the wire not yet released (response or Cancel acknowledgement awaited).
    pub fn abandoned(&self) -> u16 {
        self.abandoned
    }

    /// Whether `(slot, generation)` is a call abandoned on the wire, response not yet arrived.
    pub fn is_abandoned(&self, slot: u16, generation: u32) -> bool {
        self.slots
            .get(slot as usize)
            .is_some_and(|s| s.generation == generation && s.state == SlotState::Abandoned && !s.answered)
    }

    /// The Cancel of the abandoned call `(slot, generation)` is queued for the wire: its credit
    /// is now held until the Cancel's acknowledgement arrives too. Returns false (send no
    /// Cancel) when the call is not abandoned on the wire, already answered, or its Cancel was
    /// queued already.
    pub fn cancel_queued(&mut self, slot: u16, generation: u32) -> bool {
        let Some(s) = self.slots.get_mut(slot as usize) else { return false };
        if s.generation != generation || s.state != SlotState::Abandoned || s.answered || s.cancel_sent {
            return false;
        }
        s.cancel_sent = true;
        true
    }

    /// The queued Cancel of `(slot, generation)` was taken back before it was posted (its
    /// response arrived first): no acknowledgement will come; the slot frees if answered.
    pub fn cancel_withdrawn(&mut self, slot: u16, generation: u32) {
        let Some(s) = self.slots.get_mut(slot as usize) else { return };
        if s.generation == generation && s.state == SlotState::Abandoned && s.cancel_sent && !s.acked {
            s.cancel_sent = false;
            self.release_if_settled(slot);
        }
    }

    /// The server acknowledged the Cancel of `(slot, generation)`; the slot frees if answered.
    ///
    /// # Errors
    /// A reason when no Cancel of that call awaits an acknowledgement: close the connection.
    pub fn on_cancel_ack(&mut self, slot: u16, generation: u32) -> Result<(), &'static str> {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return Err("cancel acknowledgement for a slot outside the window");
        };
        if s.generation != generation || s.state != SlotState::Abandoned || !s.cancel_sent || s.acked {
            return Err("cancel acknowledgement for no Cancel awaiting one");
        }
        s.acked = true;
        self.release_if_settled(slot);
        Ok(())
    }

    /// Frees an abandoned slot (and its credit) once nothing of it can still arrive or wait at
    /// the server: answered, and its Cancel acknowledged or never sent.
    fn release_if_settled(&mut self, slot: u16) {
        let s = &mut self.slots[slot as usize];
        if s.state == SlotState::Abandoned && s.answered && (s.acked || !s.cancel_sent) {
            s.state = SlotState::Free;
            s.sent = false;
            self.free.push(slot);
            self.abandoned -= 1;
            self.in_flight -= 1;
        }
    }

    /// Calls waiting for a credit.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// State of `slot`.
    pub fn state(&self, slot: u16) -> SlotState {
        self.slots.get(slot as usize).map_or(SlotState::Free, |s| s.state)
    }

    /// Whether a free slot exists.
    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Takes a free slot for a new call and queues it for a credit. Returns `(slot, generation)`,
    /// or `None` when all `window` slots are taken.
    #[inline]
    pub fn start(&mut self) -> Option<(u16, u32)> {
        let slot = self.free.pop()?;
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        s.state = SlotState::Queued;
        s.sent = false;
        s.cancel_sent = false;
        s.answered = false;
        s.acked = false;
        self.queue.push_back(slot);
        Some((slot, s.generation))
    }

    /// Takes a free slot for a new call that goes on the wire at once, without queueing: in
    /// flight from here, as [`CallSlots::start`] then [`CallSlots::next_sendable`] would have
    /// it. `None` (nothing taken) when no slot is free, a call waits for a credit (it goes
    /// first), or every credit is in use.
    #[inline(always)]
    pub fn start_now(&mut self) -> Option<(u16, u32)> {
        if self.in_flight >= self.credits || !self.queue.is_empty() {
            return None;
        }
        let slot = self.free.pop()?;
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        s.state = SlotState::InFlight;
        s.sent = true;
        s.cancel_sent = false;
        s.answered = false;
        s.acked = false;
        self.in_flight += 1;
        Some((slot, s.generation))
    }

    /// The next queued call that may go on the wire now (a credit is free); it is counted in flight.
    /// `None` when nothing is queued (or every credit is in use: a credit stall, see
    /// [`CallSlots::credit_stalled`]).
    #[inline]
    pub fn next_sendable(&mut self) -> Option<(u16, u32)> {
        if self.in_flight >= self.credits {
            return None;
        }
        let slot = self.queue.pop_front()?;
        let s = &mut self.slots[slot as usize];
        s.state = SlotState::InFlight;
        s.sent = true;
        self.in_flight += 1;
        Some((slot, s.generation))
    }

    /// True when calls wait and every credit is in use.
    pub fn credit_stalled(&self) -> bool {
        !self.queue.is_empty() && self.in_flight >= self.credits
    }

    /// A response for `(slot, generation)` arrived; `result` is what the caller will get.
    ///
    /// # Errors
    /// A reason, with `result` given back, when no call of that slot and generation is on the
    /// wire (a peer bug or a malformed header): the connection must close.
    pub fn on_response(
        &mut self,
        slot: u16,
        generation: u32,
        result: T,
    ) -> Result<ResponseFate<T>, (&'static str, T)> {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return Err(("response for a slot outside the window", result));
        };
        if s.generation != generation {
            return Err(("response with a stale generation", result));
        }
        if !s.sent {
            return Err(("response for a call not yet sent", result));
        }
        let fate = match s.state {
            SlotState::InFlight => {
                s.state = SlotState::Done;
                s.result = Some(result);
                ResponseFate::Stored
            }
            SlotState::Abandoned if !s.answered => {
                s.answered = true;
                self.release_if_settled(slot);
                return Ok(ResponseFate::Discard(result));
            }
            _ => return Err(("response for a slot with no call on the wire", result)),
        };
        s.sent = false;
        self.in_flight -= 1;
        Ok(fate)
    }

    /// Takes the result of a finished call, freeing its slot. `None` when `(slot, generation)` is
    /// not finished.
    #[inline]
    pub fn take_done(&mut self, slot: u16, generation: u32) -> Option<T> {
        let s = self.slots.get_mut(slot as usize)?;
        if s.generation != generation || s.state != SlotState::Done {
            return None;
        }
        s.state = SlotState::Free;
        self.free.push(slot);
        s.result.take()
    }

    /// The results of finished calls not yet taken by their callers, mutable (their owner may move
    /// what they hold, e.g. copy a body out of a ring so the ring can be freed).
    pub fn done_results_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        self.slots.iter_mut().filter(|s| s.state == SlotState::Done).filter_map(|s| s.result.as_mut())
    }

    /// The caller gives up on `(slot, generation)` (deadline passed, future dropped, explicit
    /// cancel); see [`Abandoned`] for what the caller does next.
    pub fn abandon(&mut self, slot: u16, generation: u32) -> Abandoned<T> {
        let Some(s) = self.slots.get_mut(slot as usize) else { return Abandoned::Nothing };
        if s.generation != generation {
            return Abandoned::Nothing;
        }
        match s.state {
            SlotState::Queued => {
                s.state = SlotState::Free;
                self.free.push(slot);
                self.queue.retain(|&q| q != slot);
                Abandoned::Unsent
            }
            SlotState::InFlight => {
                s.state = SlotState::Abandoned;
                self.abandoned += 1;
                Abandoned::OnWire
            }
            SlotState::Done => {
                s.state = SlotState::Free;
                self.free.push(slot);
                s.result.take().map_or(Abandoned::Nothing, Abandoned::Answered)
            }
            SlotState::Free | SlotState::Abandoned => Abandoned::Nothing,
        }
    }

    /// The connection is gone: every queued or in-flight call ends with `fail()`, abandoned ones
    /// are freed. Returns how many calls were failed.
    pub fn fail_all(&mut self, mut fail: impl FnMut() -> T) -> usize {
        let mut n = 0;
        self.queue.clear();
        for (i, s) in self.slots.iter_mut().enumerate() {
            match s.state {
                SlotState::Queued | SlotState::InFlight => {
                    s.state = SlotState::Done;
                    s.result = Some(fail());
                    n += 1;
                }
                SlotState::Abandoned => {
                    s.state = SlotState::Free;
                    self.free.push(i as u16);
                }
                SlotState::Free | SlotState::Done => {}
            }
        }
        self.in_flight = 0;
        self.abandoned = 0;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn credits_bound_the_wire_and_responses_return_them() {
        let mut s: CallSlots<u32> = CallSlots::new(4, 2);
        let a = s.start().unwrap();
        let b = s.start().unwrap();
        let c = s.start().unwrap();
        assert_eq!(s.next_sendable(), Some(a));
        assert_eq!(s.next_sendable(), Some(b));
        assert_eq!(s.next_sendable(), None);
        assert!(s.credit_stalled());
        assert_eq!(s.on_response(a.0, a.1, 10), Ok(ResponseFate::Stored));
        assert_eq!(s.next_sendable(), Some(c));
        assert_eq!(s.take_done(a.0, a.1), Some(10));
        assert_eq!(s.take_done(a.0, a.1), None);
    }

    #[test]
    fn late_reply_never_lands_in_a_reused_slot() {
        let mut s: CallSlots<u32> = CallSlots::new(1, 1);
        let a = s.start().unwrap();
        s.next_sendable().unwrap();
        assert_eq!(s.abandon(a.0, a.1), Abandoned::OnWire); // deadline passed
        assert_eq!(s.abandoned(), 1);
        assert!(s.start().is_none(), "the slot stays taken until the late reply arrives");
        assert_eq!(s.on_response(a.0, a.1, 1), Ok(ResponseFate::Discard(1)));
        assert_eq!(s.abandoned(), 0);
        let b = s.start().unwrap();
        assert_eq!(b.0, a.0);
        assert_ne!(b.1, a.1);
        s.next_sendable().unwrap();
        assert!(s.on_response(a.0, a.1, 2).is_err(), "old generation refused");
        assert_eq!(s.on_response(b.0, b.1, 3), Ok(ResponseFate::Stored));
        assert_eq!(s.take_done(b.0, b.1), Some(3));
    }

    #[test]
    fn a_call_abandoned_before_it_was_sent_frees_its_slot_at_once() {
        let mut s: CallSlots<u32> = CallSlots::new(2, 1);
        let a = s.start().unwrap();
        let b = s.start().unwrap();
        assert_eq!(s.next_sendable(), Some(a));
        assert_eq!(s.abandon(b.0, b.1), Abandoned::Unsent);
        assert_eq!(s.queued(), 0, "never sent");
        assert_eq!(s.abandoned(), 0);
        assert!(s.has_free());
        assert_eq!(s.on_response(a.0, a.1, 4), Ok(ResponseFate::Stored));
        assert_eq!(s.abandon(a.0, a.1), Abandoned::Answered(4));
        assert_eq!(s.abandon(a.0, a.1), Abandoned::Nothing);
    }

    #[test]
    fn fail_all_ends_every_call() {
        let mut s: CallSlots<i32> = CallSlots::new(3, 1);
        let a = s.start().unwrap();
        let b = s.start().unwrap();
        s.next_sendable().unwrap();
        assert_eq!(s.fail_all(|| -1), 2);
        assert_eq!(s.take_done(a.0, a.1), Some(-1));
        assert_eq!(s.take_done(b.0, b.1), Some(-1));
        assert_eq!(s.in_flight(), 0);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Start,
        Send,
        Respond(u8),
        Take(u8),
        Abandon(u8),
        Ack(u8),
    }

    proptest! {
        /// Random call sequences: in flight never exceeds the credits, every stored response is
        /// the one sent for that slot and generation, and slots are never lost.
        #[test]
        fn operation_sequences_keep_invariants(
            window in 1u16..8, credits in 1u16..8,
            ops in proptest::collection::vec(prop_oneof![
                Just(Op::Start), Just(Op::Send), any::<u8>().prop_map(Op::Respond),
                any::<u8>().prop_map(Op::Take), any::<u8>().prop_map(Op::Abandon),
                any::<u8>().prop_map(Op::Ack)], 1..300),
        ) {
            let mut s: CallSlots<(u16, u32)> = CallSlots::new(window, credits);
            let mut wire: Vec<(u16, u32)> = Vec::new();
            let mut calls: Vec<(u16, u32)> = Vec::new();
            // Cancels sent and not acknowledged; those whose call was answered hold a credit
            // without being on the wire.
            let mut cancels: Vec<(u16, u32)> = Vec::new();
            for op in ops {
                match op {
                    Op::Start => { if let Some(c) = s.start() { calls.push(c); } }
                    Op::Send => { if let Some(c) = s.next_sendable() { wire.push(c); } }
                    Op::Respond(i) if !wire.is_empty() => {
                        let c = wire.remove(i as usize % wire.len());
                        prop_assert!(s.on_response(c.0, c.1, c).is_ok());
                    }
                    Op::Take(i) if !calls.is_empty() => {
                        let k = i as usize % calls.len();
                        let c = calls[k];
                        if let Some(r) = s.take_done(c.0, c.1) { prop_assert_eq!(r, c); calls.remove(k); }
                    }
                    Op::Abandon(i) if !calls.is_empty() => {
                        let c = calls.remove(i as usize % calls.len());
                        match s.abandon(c.0, c.1) {
                            Abandoned::Answered(r) => prop_assert_eq!(r, c),
                            // Half of them send their Cancel.
                            Abandoned::OnWire if i % 2 == 0 => {
                                prop_assert!(s.cancel_queued(c.0, c.1));
                                prop_assert!(!s.cancel_queued(c.0, c.1), "one Cancel per call");
                                cancels.push(c);
                            }
                            _ => {}
                        }
                    }
                    Op::Ack(i) if !cancels.is_empty() => {
                        let c = cancels.remove(i as usize % cancels.len());
                        prop_assert!(s.on_cancel_ack(c.0, c.1).is_ok());
                        prop_assert!(s.on_cancel_ack(c.0, c.1).is_err(), "acknowledged once");
                    }
                    _ => {}
                }
                prop_assert!(s.in_flight() <= s.credits());
                let held = cancels.iter().filter(|c| !wire.contains(c)).count();
                prop_assert_eq!(s.in_flight() as usize, wire.len() + held, "a Cancel holds its credit");
            }
            for c in wire.drain(..) { prop_assert!(s.on_response(c.0, c.1, c).is_ok()); }
            for c in cancels.drain(..) { prop_assert!(s.on_cancel_ack(c.0, c.1).is_ok()); }
            while let Some(c) = s.next_sendable() { prop_assert!(s.on_response(c.0, c.1, c).is_ok()); }
            for c in calls.drain(..) { let _ = s.abandon(c.0, c.1); }
            prop_assert_eq!(s.free.len(), window as usize, "every slot is free again");
        }
    }
}
