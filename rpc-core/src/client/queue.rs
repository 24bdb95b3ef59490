//! Calls waiting for a slot: the driver of the session's call queue
//! ([`crate::session::queue`], where its rules are: order, bound, deadline, abandon, break, the
//! blocking caller). It keeps the encoded bodies (and their spare buffers), starts the calls the
//! queue hands out in the session's slots ([`ClientCore`]) and counts what ends.

use std::time::Instant;

use prost::Message;

use super::core::{CallId, ClientCore, StartMode};
use crate::buffers::gather::{GatherBody, GATHER_MIN};
use crate::session::queue::{CallQueue, Dropped, Next, Queued, QueuedCall};
use crate::status::{Code, Status};
use crate::verbs::Provider;

/// A call, wherever it is: in a slot, or waiting for one (`seq` orders the queue).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ticket {
    Slot(CallId),
    Queued { seq: u64, deadline: Option<Instant> },
}

/// A body encoded once while its call waited (for a slot, or for a new session), handed to
/// [`ClientCore::start_with`] as a message when it can start: written whole into the send buffer, the mirror or the staging area,
/// its large `bytes` fields straight from the caller's memory (the one copy of those bytes before
/// the WRITE; see [`GatherBody`]).
#[derive(Debug)]
pub(crate) struct Gathered<'a>(pub(crate) &'a GatherBody);

impl Message for Gathered<'_> {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        self.0.put_into(buf);
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
    fn clear(&mut self) {}
}

/// Own buffers of queued bodies kept for reuse, and the largest kept (bytes).
const SPARE_BODIES: usize = 64;
const SPARE_MAX_LEN: usize = 64 << 10;

/// The calls of one session: those in its slots ([`ClientCore`]) and those waiting for one (the
/// session's [`CallQueue`], whose rules these are; this only carries them out).
pub(crate) struct Calls<P: Provider> {
    pub(crate) core: ClientCore<P>,
    queue: CallQueue<GatherBody>,
    spare: Vec<Vec<u8>>,
    /// Queued calls' captures of their response metadata (`CallOptions::capture_metadata`),
    /// by queue sequence number: registered with the core when the call starts.
    captures: Vec<(u64, crate::metadata::CapturedMetadata)>,
}

impl<P: Provider> Calls<P> {
    /// `core`'s calls, with at most `max_queued` waiting for a slot.
    pub(crate) fn new(core: ClientCore<P>, max_queued: usize) -> Calls<P> {
        Calls { core, queue: CallQueue::new(max_queued), spare: Vec::new(), captures: Vec::new() }
    }

    /// Calls waiting for a slot.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Starts a call: into a slot when one is free and nothing waits, else into the queue. A
    /// `blocking` call may wait for a send buffer or ring room (not for a slot); otherwise
    /// nothing here waits.
    ///
    /// # Errors
    /// UNAVAILABLE when the session is broken; RESOURCE_EXHAUSTED for a body over
    /// `max_message_size` or when `max_queued` calls already wait (naming the limit);
    /// DEADLINE_EXCEEDED when a blocking call's deadline passes while it waits for ring room.
    #[inline]
    pub(crate) fn start<M: Message>(
        &mut self,
        method: u32,
        req: &crate::metadata::WithMetadata<'_, M>,
        deadline: Option<Instant>,
        blocking: bool,
        flags: u8,
        capture: Option<&crate::metadata::CapturedMetadata>,
    ) -> Result<Ticket, Status> {
        if !self.queue.must_wait() {
            let mode = if blocking { StartMode::Now } else { StartMode::NoWait };
            if let Some(id) = self.core.start_with(method, req, deadline, mode, flags, capture)? {
                return Ok(Ticket::Slot(id));
            }
        } else if let Some(s) = self.core.broken() {
            return Err(s.clone());
        }
        self.start_queued(method, req, deadline, flags, capture)
    }

    /// [`Calls::start`] of a call that waits in the queue (out of line: the inlined part is the
    /// call that starts now).
    #[inline(never)]
    fn start_queued<M: Message>(
        &mut self,
        method: u32,
        req: &crate::metadata::WithMetadata<'_, M>,
        deadline: Option<Instant>,
        flags: u8,
        capture: Option<&crate::metadata::CapturedMetadata>,
    ) -> Result<Ticket, Status> {
        let in_flight = self.core.in_flight();
        let (spare, counters) = (&mut self.spare, &mut self.core.counters);
        let expired = |b| {
            counters.status(Code::DeadlineExceeded);
            recycle(spare, b);
        };
        if let Err(s) = self.queue.admit(in_flight, Instant::now, expired) {
            self.core.counters.status(Code::ResourceExhausted);
            return Err(s);
        }
        let len = req.encoded_len();
        self.core.check_len(len)?;
        // Encoded once, with its large `bytes` fields referenced, not copied: when the call
        // starts, they are copied once, into registered memory (a heap encoding copied every
        // byte twice before the WRITE, and a body over `SPARE_MAX_LEN` was a fresh allocation).
        // Its own bytes are all of a small body, and mostly tags and lengths of a large one (any
        // more grow the buffer as they come).
        let mut own = self.spare.pop().unwrap_or_default();
        own.reserve(len.min(GATHER_MIN));
        let body = GatherBody::encode(req, own);
        if let Err(e) =
            crate::buffers::bounded::check_exact::<crate::metadata::WithMetadata<'_, M>>(len, body.len())
        {
            // Not queued: a body that lies about its length fails now, as a started one does.
            recycle(&mut self.spare, body);
            return Err(self.core.encode_mismatch(e));
        }
        let seq = self.queue.push(QueuedCall { method, body, deadline, flags });
        if let Some(c) = capture {
            self.captures.push((seq, c.clone()));
        }
        Ok(Ticket::Queued { seq, deadline })
    }

    /// Registers the capture of the queued call `seq`, now started as `id`, if it has one (and
    /// drops those of calls that left the queue unstarted: their sequence numbers are lower).
    #[cold]
    fn capture_queued(&mut self, seq: u64, id: super::core::CallId) {
        self.captures.retain(|(s, _)| *s >= seq);
        if let Some(i) = self.captures.iter().position(|(s, _)| *s == seq) {
            let (_, c) = self.captures.swap_remove(i);
            self.core.capture(id, &c);
        }
    }

    /// Carries out the queue's rules: starts waiting calls while slots and ring space allow, in
    /// order; ends expired ones and, on a broken session, all of them.
    pub(crate) fn pump(&mut self) {
        if self.queue.is_empty() {
            return;
        }
        if let Some(s) = self.core.broken() {
            let s = s.clone();
            let spare = &mut self.spare;
            let n = self.queue.fail_all(&s, |b| recycle(spare, b));
            for _ in 0..n {
                self.core.counters.status(Code::Unavailable);
            }
            return;
        }
        // The clock is read once, and only when a waiting call has a deadline (this runs at
        // every poll while calls wait for a slot or for ring room).
        let mut now = None;
        let mut started = false;
        while let Some(next) =
            self.queue.next(|| *now.get_or_insert_with(Instant::now), self.core.has_free_slot())
        {
            match next {
                Next::Ended(code, body) => {
                    self.core.counters.status(code);
                    recycle(&mut self.spare, body);
                }
                Next::Start(seq, call) => {
                    let r = self.core.start_with(
                        call.method,
                        &crate::metadata::WithMetadata::new(&Gathered(&call.body), None),
                        call.deadline,
                        StartMode::NoWait,
                        call.flags,
                        None,
                    );
                    match r {
                        // No send buffer or ring room yet: first again, after the session progressed.
                        Ok(None) => {
                            self.queue.retry_first(seq, call);
                            break;
                        }
                        Ok(Some(id)) => {
                            started = true;
                            if !self.captures.is_empty() {
                                self.capture_queued(seq, id);
                            }
                            self.queue.started(seq, Ok((id.slot, id.generation)));
                        }
                        Err(s) => self.queue.started(seq, Err(s)),
                    }
                    recycle(&mut self.spare, call.body);
                }
            }
        }
        if started {
            self.core.flush();
        }
    }

    /// Polls a call once (progressing the session): its result when finished, `None` while it
    /// runs or waits. A waiting call that got a slot has its ticket updated.
    pub(crate) fn poll_call<R: Message + Default>(&mut self, t: &mut Ticket) -> Option<Result<R, Status>> {
        let mut progressed = false;
        loop {
            match *t {
                Ticket::Slot(id) => {
                    let r = self.core.poll_call(id);
                    self.pump();
                    return r;
                }
                Ticket::Queued { seq, deadline } => {
                    let spare = &mut self.spare;
                    match self.queue.poll(seq, Instant::now, |b| recycle(spare, b)) {
                        Queued::Started(slot, generation) => {
                            *t = Ticket::Slot(CallId { slot, generation, deadline });
                            continue;
                        }
                        Queued::Ended(s) => return Some(Err(s)),
                        Queued::Expired(s) => {
                            self.core.counters.status(Code::DeadlineExceeded);
                            return Some(Err(s));
                        }
                        Queued::Waiting if progressed => return None,
                        Queued::Waiting => {}
                    }
                    self.core.poll_step();
                    self.pump();
                    progressed = true;
                }
            }
        }
    }

    /// Blocks (progressing the session per the polling policy) until the call finishes.
    ///
    /// # Errors
    /// As the call's; RESOURCE_EXHAUSTED when it waits for a slot that no other caller can free
    /// while this one blocks (see [`CallQueue::refuse_blocking`]).
    pub(crate) fn wait<R: Message + Default>(&mut self, mut t: Ticket) -> Result<R, Status> {
        loop {
            if let Ticket::Slot(id) = t {
                return self.core.wait(id);
            }
            if let Some(r) = self.poll_call(&mut t) {
                return r;
            }
            if let Ticket::Queued { seq, .. } = t {
                let (free, freeing, window) =
                    (self.core.has_free_slot(), self.core.self_freeing_slots(), self.core.window());
                let spare = &mut self.spare;
                if let Some(s) = self.queue.refuse_blocking(seq, free, freeing, window, |b| recycle(spare, b))
                {
                    self.core.counters.status(Code::ResourceExhausted);
                    return Err(s);
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
            Ticket::Queued { seq, deadline } => match self.queue.abandon(seq) {
                Dropped::Waiting(body) => recycle(&mut self.spare, body),
                Dropped::Started(slot, generation) => {
                    self.core.abandon(CallId { slot, generation, deadline })
                }
                Dropped::Nothing => {}
            },
        }
    }

    /// Progresses the session once and moves waiting calls into freed slots.
    pub(crate) fn progress(&mut self) -> usize {
        let n = self.core.progress();
        self.pump();
        n
    }
}

/// Keeps an encoded body's own buffer for the next waiting call (its shared fields are released).
fn recycle(spare: &mut Vec<Vec<u8>>, body: GatherBody) {
    let mut body = body.into_own();
    if spare.len() < SPARE_BODIES && body.capacity() <= SPARE_MAX_LEN {
        body.clear();
        spare.push(body);
    }
}
