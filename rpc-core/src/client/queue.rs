//! Calls waiting for a slot: backpressure instead of refusal.
//!
//! A session has `window` call slots ([`ClientCore`]). A call that finds none free, or (when it
//! must not block) whose body cannot be placed yet for want of a send buffer or ring room, does
//! not fail: it is encoded once (onto the heap) and waits in this FIFO queue. The semantics,
//! which the shareable handle builds on:
//!
//! - **Order.** Waiting calls go on the wire in the order they were started. While any call
//!   waits, a new call waits behind it even if a slot is free.
//! - **Progress.** Whoever progresses the session (a future's poll, a blocking call's wait,
//!   [`Calls::progress`]) moves waiting calls into slots as slots and ring space free. A slot
//!   frees when its caller takes the answer (or drops the call and the answer arrives).
//! - **Bound.** At most `ClientConfig::max_queued_calls` calls wait; one more fails at once with
//!   RESOURCE_EXHAUSTED naming that field. Starting a non-blocking call never waits.
//! - **Deadline.** A waiting call whose deadline passes ends DEADLINE_EXCEEDED and is never sent.
//! - **Abandon.** A waiting call whose caller gives up is removed and never sent.
//! - **Break.** When the session breaks, waiting calls end UNAVAILABLE; they were never sent, and
//!   nothing re-sends them.
//! - **Blocking callers.** A blocking call that waits for a slot can only get one freed by an
//!   abandoned call's late answer (no other caller runs while it blocks): when no slot is free
//!   and none is abandoned, it fails at once with RESOURCE_EXHAUSTED instead of waiting forever.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use prost::Message;

use super::core::{CallId, ClientCore, StartMode};
use crate::status::{Code, Status};
use crate::verbs::Provider;

/// A call, wherever it is: in a slot, or waiting for one (`seq` orders the queue).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ticket {
    Slot(CallId),
    Queued { seq: u64, deadline: Option<Instant> },
}

/// A request body already encoded, handed to [`ClientCore::start`] as a message (it is copied,
/// not encoded again).
#[derive(Debug)]
pub(crate) struct Encoded<'a>(pub(crate) &'a [u8]);

impl Message for Encoded<'_> {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        buf.put_slice(self.0);
    }
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Send-only: never decoded.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0 = &[];
    }
}

struct Waiting {
    method: u32,
    body: Vec<u8>,
    deadline: Option<Instant>,
}

/// What became of a waiting call while its caller was not looking.
enum Resolved {
    Slot(CallId),
    Failed(Status),
}

/// Encoded bodies kept for reuse, and the largest kept (bytes).
const SPARE_BODIES: usize = 64;
const SPARE_MAX_LEN: usize = 64 << 10;

/// The calls of one session: those in its slots ([`ClientCore`]) and those waiting for one.
pub(crate) struct Calls<P: Provider> {
    pub(crate) core: ClientCore<P>,
    waiting: BTreeMap<u64, Waiting>,
    resolved: HashMap<u64, Resolved>,
    next_seq: u64,
    max_queued: usize,
    spare: Vec<Vec<u8>>,
}

fn queued_deadline() -> Status {
    Status::deadline_exceeded("deadline passed while the call waited for a slot (it was never sent)")
}

impl<P: Provider> Calls<P> {
    /// `core`'s calls, with at most `max_queued` waiting for a slot.
    pub(crate) fn new(core: ClientCore<P>, max_queued: usize) -> Calls<P> {
        Calls {
            core,
            waiting: BTreeMap::new(),
            resolved: HashMap::new(),
            next_seq: 0,
            max_queued,
            spare: Vec::new(),
        }
    }

    /// Calls waiting for a slot.
    pub(crate) fn queued(&self) -> usize {
        self.waiting.len()
    }

    /// Starts a call: into a slot when one is free and nothing waits, else into the queue. A
    /// `blocking` call may wait for a send buffer or ring room (not for a slot); otherwise
    /// nothing here waits.
    ///
    /// # Errors
    /// UNAVAILABLE when the session is broken; RESOURCE_EXHAUSTED for a body over
    /// `max_message_size` or when `max_queued` calls already wait (naming the limit);
    /// DEADLINE_EXCEEDED when a blocking call's deadline passes while it waits for ring room.
    pub(crate) fn start<M: Message>(
        &mut self,
        method: u32,
        req: &M,
        deadline: Option<Instant>,
        blocking: bool,
    ) -> Result<Ticket, Status> {
        if self.waiting.is_empty() {
            let mode = if blocking { StartMode::Now } else { StartMode::NoWait };
            if let Some(id) = self.core.start(method, req, deadline, mode)? {
                return Ok(Ticket::Slot(id));
            }
        } else if let Some(s) = self.core.broken() {
            return Err(s.clone());
        }
        if self.waiting.len() >= self.max_queued {
            self.core.counters.status(Code::ResourceExhausted);
            return Err(Status::resource_exhausted(format!(
                "{} calls in flight and {} waiting for a slot: ClientConfig::max_queued_calls ({}) is exceeded",
                self.core.in_flight(),
                self.waiting.len(),
                self.max_queued
            )));
        }
        let len = req.encoded_len();
        self.core.check_len(len)?;
        let mut body = self.spare.pop().unwrap_or_default();
        body.reserve(len);
        req.encode_raw(&mut body);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.waiting.insert(seq, Waiting { method, body, deadline });
        Ok(Ticket::Queued { seq, deadline })
    }

    /// Moves waiting calls into slots while slots and ring space allow, in order; ends expired
    /// ones DEADLINE_EXCEEDED and, on a broken session, all of them UNAVAILABLE.
    pub(crate) fn pump(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        if let Some(s) = self.core.broken() {
            let s = Status::unavailable(format!(
                "{} (the call waited for a slot and was never sent)",
                s.message()
            ));
            for (seq, w) in std::mem::take(&mut self.waiting) {
                self.core.counters.status(Code::Unavailable);
                self.resolved.insert(seq, Resolved::Failed(s.clone()));
                self.recycle(w.body);
            }
            return;
        }
        let now = Instant::now();
        let mut started = false;
        while let Some(e) = self.waiting.first_entry() {
            if e.get().deadline.is_some_and(|d| now >= d) {
                let seq = *e.key();
                let w = e.remove();
                self.core.counters.status(Code::DeadlineExceeded);
                self.resolved.insert(seq, Resolved::Failed(queued_deadline()));
                self.recycle(w.body);
                continue;
            }
            if !self.core.has_free_slot() {
                break;
            }
            let seq = *e.key();
            let w = e.get();
            match self.core.start(w.method, &Encoded(&w.body), w.deadline, StartMode::NoWait) {
                Ok(None) => break,
                Ok(Some(id)) => {
                    started = true;
                    self.resolved.insert(seq, Resolved::Slot(id));
                }
                Err(s) => {
                    self.resolved.insert(seq, Resolved::Failed(s));
                }
            }
            let w = self.waiting.remove(&seq).expect("the first entry");
            self.recycle(w.body);
        }
        if started {
            self.core.flush();
        }
    }

    fn recycle(&mut self, mut body: Vec<u8>) {
        if self.spare.len() < SPARE_BODIES && body.capacity() <= SPARE_MAX_LEN {
            body.clear();
            self.spare.push(body);
        }
    }

    /// Polls a call once (progressing the session): its result when finished, `None` while it
    /// runs or waits. A waiting call that got a slot has its ticket updated.
    pub(crate) fn poll_call<R: Message + Default>(&mut self, t: &mut Ticket) -> Option<Result<R, Status>> {
        loop {
            match *t {
                Ticket::Slot(id) => {
                    let r = self.core.poll_call(id);
                    self.pump();
                    return r;
                }
                Ticket::Queued { seq, deadline } => {
                    match self.resolved.remove(&seq) {
                        Some(Resolved::Slot(id)) => {
                            *t = Ticket::Slot(id);
                            continue;
                        }
                        Some(Resolved::Failed(s)) => return Some(Err(s)),
                        None => {}
                    }
                    if !self.waiting.contains_key(&seq) {
                        return Some(Err(Status::internal("the call is not known to this session")));
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        self.remove(seq);
                        self.core.counters.status(Code::DeadlineExceeded);
                        return Some(Err(queued_deadline()));
                    }
                    self.core.poll_step();
                    self.pump();
                    if self.resolved.contains_key(&seq) {
                        continue;
                    }
                    return None;
                }
            }
        }
    }

    /// Blocks (progressing the session per the polling policy) until the call finishes.
    ///
    /// # Errors
    /// As the call's; RESOURCE_EXHAUSTED when it waits for a slot that no other caller can free
    /// while this one blocks (see the module docs).
    pub(crate) fn wait<R: Message + Default>(&mut self, mut t: Ticket) -> Result<R, Status> {
        loop {
            if let Ticket::Slot(id) = t {
                return self.core.wait(id);
            }
            if let Some(r) = self.poll_call(&mut t) {
                return r;
            }
            if let Ticket::Queued { seq, .. } = t {
                if !self.core.has_free_slot() && self.core.self_freeing_slots() == 0 {
                    self.remove(seq);
                    self.core.counters.status(Code::ResourceExhausted);
                    return Err(Status::resource_exhausted(format!(
                        "all {} slots (ClientConfig::window) are held by calls that only their own \
                         futures can finish, and a blocking call cannot wait for them: poll or drop \
                         those futures first",
                        self.core.window()
                    )));
                }
                // Ends at once on a broken session: the next poll reports it.
                let _ = self.core.wait_step(None);
            }
        }
    }

    /// The caller gave up on a call: a waiting one is removed (never sent).
    pub(crate) fn abandon(&mut self, t: Ticket) {
        match t {
            Ticket::Slot(id) => self.core.abandon(id),
            Ticket::Queued { seq, .. } => {
                if !self.remove(seq) {
                    if let Some(Resolved::Slot(id)) = self.resolved.remove(&seq) {
                        self.core.abandon(id);
                    }
                }
            }
        }
    }

    /// Removes a waiting call; false when it was not waiting.
    fn remove(&mut self, seq: u64) -> bool {
        match self.waiting.remove(&seq) {
            Some(w) => {
                self.recycle(w.body);
                true
            }
            None => false,
        }
    }

    /// Progresses the session once and moves waiting calls into freed slots.
    pub(crate) fn progress(&mut self) -> usize {
        let n = self.core.progress();
        self.pump();
        n
    }
}
