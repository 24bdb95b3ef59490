//! Messages waiting to leave, in order, sans-IO: requests whose bodies go through the peer's
//! ring (client) and answers and stream messages waiting for a send buffer or ring space
//! (server). The driver keeps the bodies' memory (`B`) and posts what the session grants; this
//! module decides the order and what never goes:
//!
//! - **Order.** Messages leave in the order they were queued. A new message may skip the
//!   outbox (go straight into a send buffer) only while the outbox is empty; otherwise it waits
//!   behind the others ([`Outbox::is_empty`]).
//! - **One answer per call.** A server answer to a call the session no longer counts as
//!   unanswered (a deferred `Responder` answering after the handler did, or after the call was
//!   cancelled or expired and answered for it) is never sent: the client has its answer, and a
//!   second one would make it close the session ([`Front::Late`]).
//! - **Size.** A body over the agreed `max_message_size` becomes RESOURCE_EXHAUSTED naming the
//!   limit, sent in its place ([`Front::Refused`]).
//! - **A stream message that can never leave** (the memory its body needs could not be
//!   registered) fails its stream: it and the stream's other waiting messages never go (the
//!   peer must not read a stream with a gap in it), and the stream ends with that status
//!   ([`Outbox::fail_stream`]).
//! - **What leaving means.** When the last of a message is posted ([`Outbox::sent`]) an answer
//!   returns its credit ([`Session::on_answer_for`]) and a request whose caller gave up while
//!   it was leaving lets its Cancel follow ([`Session::request_left`]).

use std::collections::VecDeque;

use super::Session;
use crate::status::Status;
use crate::wire::{Header, Kind};

/// A body the driver sends, whole or in pieces.
pub trait Queued {
    /// Its message's header.
    fn header(&self) -> &Header;
    /// Its length in bytes.
    fn body_len(&self) -> usize;
    /// Nothing of it was posted yet.
    fn untouched(&self) -> bool;
}

/// A message in the outbox.
#[derive(Debug)]
pub enum Waiting<B> {
    /// A body to send (its header inside).
    Body(B),
    /// An error answer: the status's message goes as the eager body, its code in the header.
    Error(Header, Status),
}

impl<B: Queued> Waiting<B> {
    /// The message's header.
    pub fn header(&self) -> &Header {
        match self {
            Waiting::Body(b) => b.header(),
            Waiting::Error(h, _) => h,
        }
    }
}

/// What the driver does with the message at the front.
#[derive(Debug)]
pub enum Front<'a, B> {
    /// Post what it can of it; once all of it is posted, call [`Outbox::sent`].
    Send(&'a mut Waiting<B>),
    /// A second answer to one call, taken out: release its body, count it, never send it.
    Late(Waiting<B>),
    /// A body over the size limit, replaced by its RESOURCE_EXHAUSTED answer: release it.
    Refused(B),
}

/// The messages waiting to leave one connection (see the module docs).
#[derive(Debug)]
pub struct Outbox<B> {
    queue: VecDeque<Waiting<B>>,
}

impl<B> Default for Outbox<B> {
    fn default() -> Outbox<B> {
        Outbox { queue: VecDeque::new() }
    }
}

impl<B: Queued> Outbox<B> {
    /// Nothing waits: a new message may go straight out.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The header of the message at the front, if any.
    pub fn front_header(&self) -> Option<Header> {
        self.queue.front().map(|m| *m.header())
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Queues a message behind the others.
    pub fn push(&mut self, m: Waiting<B>) {
        self.queue.push_back(m);
    }

    /// Whether a message of the call `(slot, generation)` waits (a request still leaving).
    pub fn holds(&self, slot: u16, generation: u32) -> bool {
        self.queue.iter().any(|m| {
            let h = m.header();
            (h.slot, h.generation) == (slot, generation)
        })
    }

    /// Whether a message of `kind` of the call `(slot, generation)` waits.
    pub fn holds_kind(&self, slot: u16, generation: u32, kind: Kind) -> bool {
        self.queue.iter().any(|m| {
            let h = m.header();
            (h.slot, h.generation, h.kind) == (slot, generation, kind)
        })
    }

    /// Takes out the waiting messages of `kind` of the call `(slot, generation)` of which nothing
    /// was posted (a cancelled stream's messages not yet begun: they never go), for the driver to
    /// release.
    pub fn take_unsent(&mut self, slot: u16, generation: u32, kind: Kind) -> Vec<B> {
        let mut taken = Vec::new();
        let mut i = 0;
        while i < self.queue.len() {
            let m = &self.queue[i];
            let h = *m.header();
            let untouched = match m {
                Waiting::Body(b) => b.untouched(),
                Waiting::Error(..) => true,
            };
            if (h.slot, h.generation, h.kind) == (slot, generation, kind) && untouched {
                if let Some(Waiting::Body(b)) = self.queue.remove(i) {
                    taken.push(b);
                }
            } else {
                i += 1;
            }
        }
        taken
    }

    /// Takes out every waiting unary request of which nothing was posted (the client's: bodies
    /// above the eager threshold waiting for the server's ring, which was refused), for the
    /// driver to fail and release.
    pub fn take_unsent_requests(&mut self) -> Vec<B> {
        let mut taken = Vec::new();
        let mut i = 0;
        while i < self.queue.len() {
            let m = &self.queue[i];
            let h = m.header();
            let untouched = matches!(m, Waiting::Body(b) if b.untouched());
            if h.kind == Kind::Request && h.stream == 0 && untouched {
                if let Some(Waiting::Body(b)) = self.queue.remove(i) {
                    taken.push(b);
                }
            } else {
                i += 1;
            }
        }
        taken
    }

    /// Takes every waiting message out (the connection is gone).
    pub fn drain(&mut self) -> impl Iterator<Item = Waiting<B>> + '_ {
        self.queue.drain(..)
    }

    /// The message at the front after the session's checks (see [`Front`]); `None` when
    /// nothing waits.
    pub fn front(&mut self, session: &Session) -> Option<Front<'_, B>> {
        let m = self.queue.front_mut()?;
        let h = *m.header();
        let untouched = match m {
            Waiting::Body(b) => b.untouched(),
            Waiting::Error(..) => true,
        };
        if h.kind == Kind::Response && untouched && !session.is_unanswered(h.slot, h.generation) {
            return self.queue.pop_front().map(Front::Late);
        }
        if let Waiting::Body(b) = m {
            if let Err(s) = session.check_len(b.body_len()) {
                return match std::mem::replace(m, Waiting::Error(h, s)) {
                    Waiting::Body(b) => Some(Front::Refused(b)),
                    Waiting::Error(..) => None,
                };
            }
        }
        self.queue.front_mut().map(Front::Send)
    }

    /// The front message, a stream message of which nothing was posted, can never be sent (the
    /// memory its body needs could not be registered): it fails its stream. It and the stream's
    /// other waiting messages of which nothing was posted are taken out and returned for the
    /// driver to release; the stream's answer, when it waits already (its producer ended the
    /// stream), goes as `status` instead (its body returned too). Returns `Some(status)` when
    /// no answer of the stream waits: the driver ends the stream with it, as a producer's error
    /// ends it (the answer then comes behind what waits now). Nothing happens (`None`, nothing
    /// taken) when the front is not such a message.
    pub fn fail_stream(&mut self, status: Status) -> (Vec<B>, Option<Status>) {
        let Some(Waiting::Body(front)) = self.queue.front() else { return (Vec::new(), None) };
        let h = *front.header();
        if h.kind != Kind::StreamMsg || !front.untouched() {
            return (Vec::new(), None);
        }
        let mut taken = self.take_unsent(h.slot, h.generation, Kind::StreamMsg);
        let answer = self.queue.iter_mut().find(|m| {
            let a = m.header();
            (a.slot, a.generation, a.kind) == (h.slot, h.generation, Kind::Response)
        });
        match answer {
            Some(m) => {
                let a = Header { metadata: false, ..*m.header() };
                if let Waiting::Body(b) = std::mem::replace(m, Waiting::Error(a, status)) {
                    taken.push(b);
                }
                (taken, None)
            }
            None => (taken, Some(status)),
        }
    }

    /// The front message was posted whole: it leaves the outbox, and the session learns what
    /// that means (an answer returns its credit; a request abandoned while leaving lets its
    /// Cancel follow). Returns it.
    pub fn sent(&mut self, session: &mut Session) -> Option<Waiting<B>> {
        let m = self.queue.pop_front()?;
        let h = *m.header();
        match h.kind {
            Kind::Response => {
                session.on_answer_for(h.slot, h.generation);
            }
            Kind::Request => session.request_left(h.slot, h.generation),
            _ => {}
        }
        Some(m)
    }
}

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
