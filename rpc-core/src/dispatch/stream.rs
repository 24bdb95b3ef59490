//! The server's end of a server stream: a [`StreamSink`] a handler sends messages into from any
//! thread, drained by the worker that owns the session as the client gives it stream grants.
//!
//! Backpressure is end to end: the worker takes a SEND's worth of messages out of the sink only
//! with a stream grant in hand (the client grants more as its application takes messages),
//! and the sink holds at most [`SINK_DEPTH`] encoded messages and about [`SINK_BYTES`] bytes, so
//! [`StreamSink::send`] blocks while the client does not read. The server's memory per stream is
//! bounded by the sink plus the stream's grants, whatever the producer's speed.
//!
//! The producer frames its messages itself: [`StreamSink::send`] encodes each one, behind its
//! 4-byte length, straight into the stream's open batch ([`crate::wire::STREAM_BATCH`]), a
//! buffer of one eager body's size; a full batch is sealed into the queue, where the worker
//! takes it with one stream grant as one SEND, whole (no per-message work on the worker, which the
//! producer often shares a core with). A message too large for a batch goes alone, unframed.
//! The worker takes a batch still open only when the producer added nothing to it since its
//! last look (the producer paused, waits or is descheduled), so a stream that trickles is not
//! delayed and one that floods is not cut into small SENDs. Buffers circulate: the worker gives
//! the producer a spare body buffer of the session for each batch it takes, so nothing is
//! allocated per message or per batch. A waiting producer is woken once the sink is down to
//! half, so it runs in bursts instead of a context switch per message.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::reply::CancelFlag;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{Thread, ThreadId};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use prost::Message;

use crate::buffers::bounded::{encode_vec_exact, LenMismatch};
use crate::status::Status;
use crate::wire::{FRAME_LEN, MAX_BATCH};

/// Encoded messages a [`StreamSink`] holds before [`StreamSink::send`] blocks.
pub const SINK_DEPTH: usize = 256;

/// Bytes of encoded messages a [`StreamSink`] holds before [`StreamSink::send`] blocks: a send
/// waits while this much is queued (so the sink holds at most this plus one message).
pub const SINK_BYTES: usize = 1 << 20;

/// Buffers of at most this capacity go back to the producer for its next messages; larger ones
/// are freed.
const RECYCLE_MAX: usize = 16 << 10;

/// The batch the producer is filling.
#[derive(Default)]
struct OpenBatch {
    /// Frames: each message's 4-byte little-endian length, then the message.
    body: Vec<u8>,
    /// Messages in `body`.
    count: u16,
    /// Bytes of those messages (frames' lengths not counted).
    bytes: usize,
}

/// A SEND's worth of a server stream, sealed: `count` messages framed as a batch
/// ([`crate::wire::STREAM_BATCH`]), or one message alone, unframed (`count` 0).
pub(crate) struct Sealed {
    pub(crate) body: Vec<u8>,
    pub(crate) count: u16,
}

/// What the sink and the worker share.
pub(crate) struct SinkShared {
    /// SENDs sealed and waiting for a stream grant (at most one per message held, so it never
    /// overflows).
    queue: ArrayQueue<Sealed>,
    /// Messages and bytes in `queue`.
    queued_msgs: AtomicUsize,
    queued_bytes: AtomicUsize,
    /// The producer's open batch (a producer locks it per message; the worker only tries).
    open: Mutex<OpenBatch>,
    /// `open`'s count and bytes, stored under its lock, read by the worker and the room check
    /// without it.
    open_msgs: AtomicUsize,
    open_bytes: AtomicUsize,
    /// Most bytes of one batch body (the session's eager body size), at least one frame.
    batch_cap: usize,
    /// Emptied buffers for the producer's next batches (the worker gives them).
    free: ArrayQueue<Vec<u8>>,
    /// The stream's final status, once the handler finished (or dropped the sink).
    pub(crate) end: Mutex<Option<Result<(), Status>>>,
    pub(crate) ended: AtomicBool,
    /// The status of a producer's send that failed (the worker may have taken `end` since):
    /// later sends fail with it.
    failure: std::sync::OnceLock<Status>,
    /// Raised by the worker when the stream is over without the handler (cancel, deadline,
    /// session gone).
    pub(crate) cancelled: Arc<CancelFlag>,
    /// The producer waits for room: whom to wake.
    pub(crate) waiter: Mutex<Option<Thread>>,
    pub(crate) waiting: AtomicBool,
    /// A producing task waits for room ([`StreamSink::send_async`]).
    pub(crate) waker: atomic_waker::AtomicWaker,
    /// The worker thread that drains the sink: a send from it cannot wait for room.
    worker: Option<ThreadId>,
    /// Message bytes the worker took to send (what an observed stream records as its
    /// response size).
    sent_bytes: AtomicUsize,
}

impl SinkShared {
    /// A sink whose batches hold at most `batch_cap` bytes (raised to one frame of one byte).
    pub(crate) fn new(
        cancelled: Arc<CancelFlag>,
        worker: Option<ThreadId>,
        batch_cap: usize,
    ) -> Arc<SinkShared> {
        Arc::new(SinkShared {
            queue: ArrayQueue::new(SINK_DEPTH),
            queued_msgs: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
            open: Mutex::new(OpenBatch::default()),
            open_msgs: AtomicUsize::new(0),
            open_bytes: AtomicUsize::new(0),
            batch_cap: batch_cap.max(FRAME_LEN + 1),
            free: ArrayQueue::new(SINK_DEPTH),
            end: Mutex::new(None),
            ended: AtomicBool::new(false),
            failure: std::sync::OnceLock::new(),
            cancelled,
            waiter: Mutex::new(None),
            waiting: AtomicBool::new(false),
            waker: atomic_waker::AtomicWaker::new(),
            worker,
            sent_bytes: AtomicUsize::new(0),
        })
    }

    fn lock_open(&self) -> MutexGuard<'_, OpenBatch> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Messages held (sealed and open).
    fn held(&self) -> usize {
        self.queued_msgs.load(Ordering::Acquire) + self.open_msgs.load(Ordering::Acquire)
    }

    /// Room for one more message.
    fn has_room(&self) -> bool {
        self.held() < SINK_DEPTH
            && self.queued_bytes.load(Ordering::Acquire) + self.open_bytes.load(Ordering::Acquire)
                < SINK_BYTES
    }

    /// Producer, holding `open`: queues `body` of `count` messages (`bytes` of them) as one SEND.
    fn push_sealed(&self, body: Vec<u8>, count: u16, bytes: usize) {
        // Counted before it is visible, so the worker's subtraction never underflows.
        self.queued_msgs.fetch_add(usize::from(count.max(1)), Ordering::AcqRel);
        self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if let Err(lost) = self.queue.push(Sealed { body, count }) {
            // Unreachable: the queue holds SINK_DEPTH SENDs of at least one message each, and a
            // message is added only while fewer than SINK_DEPTH are held.
            self.queued_msgs.fetch_sub(usize::from(lost.count.max(1)), Ordering::AcqRel);
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Producer or worker, holding `open`: its messages, taken out as a batch (None when empty).
    fn take_open(&self, open: &mut OpenBatch) -> Option<(Vec<u8>, u16, usize)> {
        if open.count == 0 {
            return None;
        }
        let taken = (std::mem::take(&mut open.body), open.count, open.bytes);
        open.count = 0;
        open.bytes = 0;
        self.open_msgs.store(0, Ordering::Release);
        self.open_bytes.store(0, Ordering::Release);
        Some(taken)
    }

    /// Producer, holding `open`: seals the open batch into the queue.
    fn seal(&self, open: &mut OpenBatch) {
        if let Some((body, count, bytes)) = self.take_open(open) {
            self.push_sealed(body, count, bytes);
        }
    }

    /// Producer: `msg` framed into the open batch (or queued alone when too large for one), if
    /// the sink has room; false (nothing encoded) when it has none or the stream ended.
    ///
    /// # Errors
    /// [`LenMismatch`] when `msg` does not encode to its `encoded_len` (nothing of it is kept).
    fn put<T: Message>(&self, msg: &T) -> Result<bool, LenMismatch> {
        let len = msg.encoded_len();
        let mut open = self.lock_open();
        // Under the lock: producers (a `&StreamSink` may be shared) add one at a time, and the
        // stream ends (`end`, which sets `ended` under it) either before this look, refusing the
        // message, or after the message is in the batch it seals (the worker sends the end only
        // behind it). Looked at before the lock only, the worker could have sent the end and
        // the message, accepted, would never leave.
        if !self.has_room() || self.ended.load(Ordering::Acquire) {
            return Ok(false);
        }
        if FRAME_LEN + len > self.batch_cap {
            // Alone, unframed, behind the batch before it.
            self.seal(&mut open);
            let mut body = self.free.pop().unwrap_or_default();
            if let Err(e) = encode_vec_exact(msg, &mut body, len) {
                let _ = self.free.push(body);
                return Err(e);
            }
            self.push_sealed(body, 0, len);
            return Ok(true);
        }
        if open.count > 0 && (open.body.len() + FRAME_LEN + len > self.batch_cap || open.count == MAX_BATCH) {
            self.seal(&mut open);
        }
        if open.count == 0 && open.body.capacity() < self.batch_cap {
            // A buffer the worker gave back, or (until one comes back) a new one.
            let mut body = self.free.pop().unwrap_or_default();
            body.reserve(self.batch_cap);
            open.body = body;
        }
        let at = open.body.len();
        open.body.extend_from_slice(&(len as u32).to_le_bytes());
        if let Err(e) = encode_vec_exact(msg, &mut open.body, len) {
            // The frame goes too: the batch is as it was.
            open.body.truncate(at);
            return Err(e);
        }
        open.count += 1;
        open.bytes += len;
        self.open_msgs.store(usize::from(open.count), Ordering::Release);
        self.open_bytes.store(open.bytes, Ordering::Release);
        Ok(true)
    }

    /// Producer: `msg` did not encode to its `encoded_len`: the stream ends INTERNAL behind the
    /// messages sent before it (they still leave, in order: the client reads a prefix of what was
    /// sent, then the status), later sends fail, and the send returns that status.
    ///
    /// Nothing is dropped here: the worker pops this sink concurrently, and a producer that
    /// emptied the queue while the worker took from it would lose a message from the middle of
    /// the stream (the client read messages 0 and 2).
    #[cold]
    fn failed(&self, e: LenMismatch) -> Status {
        let s = e.status("stream message");
        let _ = self.failure.set(s.clone());
        end(self, Err(s.clone()));
        s
    }

    /// The stream was ended (by `finish`, a drop or a failed send): a send now fails, with the
    /// failed send's code when there was one, else FAILED_PRECONDITION.
    fn ended_status(&self) -> Option<Status> {
        if !self.ended.load(Ordering::Acquire) {
            return None;
        }
        Some(match self.failure.get() {
            Some(s) => Status::new(s.code(), format!("the stream already ended: {}", s.message())),
            None => Status::failed_precondition("the stream already ended"),
        })
    }

    /// Worker: the next SEND waiting: a sealed one, else the open batch when `take_open` and the
    /// producer is not adding to it right now (its lock is free).
    pub(crate) fn pop(&self, take_open: bool) -> Option<Sealed> {
        let m = self.pop_unsent(take_open)?;
        let frames = FRAME_LEN * usize::from(m.count);
        self.sent_bytes.fetch_add(m.body.len() - frames, Ordering::Relaxed);
        Some(m)
    }

    /// Message bytes the worker took to send so far ([`SinkShared::pop`]).
    pub(crate) fn sent_bytes(&self) -> usize {
        self.sent_bytes.load(Ordering::Relaxed)
    }

    /// [`SinkShared::pop`] without counting the SEND as sent.
    fn pop_unsent(&self, take_open: bool) -> Option<Sealed> {
        if let Some(m) = self.pop_sealed() {
            return Some(m);
        }
        if !take_open || self.open_msgs.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut open = self.open.try_lock().ok()?;
        // Producers seal under this lock: a batch sealed since the look above (then the open
        // batch is a newer one) goes first, else the open batch would overtake it.
        if let Some(m) = self.pop_sealed() {
            return Some(m);
        }
        let (body, count, _) = self.take_open(&mut open)?;
        Some(Sealed { body, count })
    }

    /// Worker: the oldest sealed SEND, its messages and bytes no longer counted as queued.
    fn pop_sealed(&self) -> Option<Sealed> {
        let m = self.queue.pop()?;
        self.queued_msgs.fetch_sub(usize::from(m.count.max(1)), Ordering::AcqRel);
        let bytes = if m.count == 0 { m.body.len() } else { m.body.len() - FRAME_LEN * usize::from(m.count) };
        self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        Some(m)
    }

    /// Messages in the open batch (the worker compares two looks to see the producer pause).
    pub(crate) fn open_count(&self) -> usize {
        self.open_msgs.load(Ordering::Acquire)
    }

    /// True when no message is held (sealed or open).
    pub(crate) fn is_empty(&self) -> bool {
        self.held() == 0
    }

    /// Worker: drops every message waiting.
    pub(crate) fn clear(&self) {
        while self.pop_unsent(false).is_some() {}
        let mut open = self.lock_open();
        let _ = self.take_open(&mut open);
    }

    /// Worker: an emptied buffer for the producer's next batch.
    pub(crate) fn recycle(&self, mut buf: Vec<u8>) {
        if buf.capacity() > 0 && buf.capacity() <= RECYCLE_MAX {
            buf.clear();
            let _ = self.free.push(buf);
        }
    }

    /// Worker, after taking messages: wakes a waiting producer once the sink is down to half
    /// (a burst of room, not a wake-up per message).
    pub(crate) fn wake_if_low(&self) {
        if self.held() <= SINK_DEPTH / 2 && self.queued_bytes.load(Ordering::Acquire) <= SINK_BYTES / 2 {
            self.wake();
        }
    }

    /// Worker: the stream is over (or the sink has room): wake the producer.
    pub(crate) fn wake(&self) {
        self.waker.wake();
        if self.waiting.swap(false, Ordering::AcqRel) {
            if let Some(t) = self.waiter.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                t.unpark();
            }
        }
    }

    /// Worker: the final status once the handler ended the stream and every message left.
    pub(crate) fn take_end(&self) -> Option<Result<(), Status>> {
        if !self.ended.load(Ordering::Acquire) || !self.is_empty() {
            return None;
        }
        self.end.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Worker: the call is over without the producer (cancelled, expired, answered, its session
    /// gone): its next send returns CANCELLED, what waits is dropped, a waiting producer wakes.
    pub(crate) fn cancel(&self) {
        self.cancelled.raise();
        self.wake();
        self.clear();
    }

    /// Worker: ends the stream with `status` (a message it can never send), dropping what waits.
    pub(crate) fn fail(&self, status: Status) {
        self.cancelled.raise();
        {
            // `ended` under the open lock, as `end` sets it: a producer's `put` either came
            // before (its message is cleared below) or sees it and refuses, so no message is
            // sealed behind the clear and left to hold the end back.
            let _open = self.lock_open();
            *self.end.lock().unwrap_or_else(|e| e.into_inner()) = Some(Err(status));
            self.ended.store(true, Ordering::Release);
        }
        self.clear();
        self.wake();
    }
}

/// Sends the messages of a server stream, from any thread (`Send`). Get it from
/// [`RequestContext::stream`](super::reply::RequestContext::stream). Dropping it ends the stream
/// with OK (a clean end-of-stream); [`StreamSink::finish`] ends it with a status.
///
/// # Dropped without `finish`
/// The stream ends OK after the messages sent before, as in tonic, where a response stream
/// that ends (its sender dropped) ends the call with an OK status: the client's receive yields
/// those messages, then its clean end (`Ok(None)`), never a hang. A producer that fails and
/// means the client to know says so with `finish(Err(status))`. (An async handler's sink is
/// the exception: its future's output ends the stream, whenever the sink is dropped.)
pub struct StreamSink<T> {
    shared: Arc<SinkShared>,
    /// Dropping the sink ends the stream OK (not for an async handler's sink: its future's
    /// output ends the stream).
    end_on_drop: bool,
    _t: PhantomData<fn(T)>,
}

/// The end of an async handler's stream: ends it with the future's output, or sees it cancelled.
pub(crate) struct SinkEnd {
    shared: Arc<SinkShared>,
}

impl SinkEnd {
    /// Ends the stream with `result` after every message sent before.
    pub(crate) fn finish(&self, result: Result<(), Status>) {
        end(&self.shared, result);
    }

    /// The flag raised when the stream is over without the handler.
    pub(crate) fn flag(&self) -> Arc<CancelFlag> {
        self.shared.cancelled.clone()
    }

    /// Resolves once the stream is over without the handler (cancelled, expired, session gone).
    pub(crate) fn cancelled(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        std::future::poll_fn(move |cx| {
            if self.shared.cancelled.is_raised() {
                return std::task::Poll::Ready(());
            }
            self.shared.cancelled.register(cx.waker());
            if self.shared.cancelled.is_raised() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }
}

fn end(shared: &SinkShared, result: Result<(), Status>) {
    // What the open batch holds leaves before the end; `ended` is set under the open lock, so
    // a producer's `put` either came before (sealed here) or sees it and refuses.
    let mut open = shared.lock_open();
    shared.seal(&mut open);
    let mut end = shared.end.lock().unwrap_or_else(|e| e.into_inner());
    if !shared.ended.load(Ordering::Acquire) {
        *end = Some(result);
        shared.ended.store(true, Ordering::Release);
    }
    drop(end);
    drop(open);
}

impl<T> StreamSink<T> {
    pub(crate) fn new(shared: Arc<SinkShared>) -> StreamSink<T> {
        StreamSink { shared, end_on_drop: true, _t: PhantomData }
    }

    /// For an async handler: the sink it sends with (whose drop does not end the stream) and the
    /// end that its future's output goes to.
    pub(crate) fn into_async(mut self) -> (StreamSink<T>, SinkEnd) {
        self.end_on_drop = false;
        let ender = SinkEnd { shared: self.shared.clone() };
        (self, ender)
    }

    /// True once the stream is over without us: the client cancelled it (its stream dropped, its
    /// deadline passed), the server answered DEADLINE_EXCEEDED at the stream's deadline, or the
    /// session closed. Later sends fail.
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancelled.is_raised()
    }

    /// Sets the stream's response headers (replacing any set before). Set before its first
    /// `send` (or before `ctx.stream()`), they travel in front of its first message, as gRPC
    /// sends headers, and a client reads them through `CallOptions::capture_metadata` as that
    /// message arrives; set later, with the next message that leaves, or with its end (an
    /// error's also in its `Status`). See [`crate::ResponseMetadata`].
    pub fn set_headers(&self, headers: crate::metadata::Metadata) {
        self.shared.cancelled.edit_response(|md| *md.headers_mut() = headers);
    }

    /// Sets the stream's trailers (replacing any set before), sent with its end.
    pub fn set_trailers(&self, trailers: crate::metadata::Metadata) {
        self.shared.cancelled.edit_response(|md| *md.trailers_mut() = trailers);
    }

    /// Ends the stream with `result` (OK: a clean end; an error status: the client's stream
    /// ends with it), after every message sent before.
    pub fn finish(self, result: Result<(), Status>) {
        self.end(result);
    }

    fn end(&self, result: Result<(), Status>) {
        end(&self.shared, result);
    }
}

impl<T: Message> StreamSink<T> {
    /// Sends one message (encoded here, in the calling thread). Blocks while [`SINK_DEPTH`]
    /// messages wait for the client's stream grants: a client that stops reading stalls the producer
    /// here.
    ///
    /// # Errors
    /// CANCELLED once the stream is over without us ([`StreamSink::is_cancelled`]); INTERNAL
    /// when `msg` encodes to more or fewer bytes than its `encoded_len` gave (a hand-written
    /// `Message`): the stream then ends with that status after the messages sent before it
    /// (they all reach the client, in order), nothing of `msg` sent, and every later send fails
    /// with that code; RESOURCE_EXHAUSTED for a send on the worker thread (inline in the handler) that finds
    /// [`SINK_DEPTH`] messages queued (it cannot wait for the worker it blocks). The message is
    /// dropped.
    pub fn send(&self, msg: &T) -> Result<(), Status> {
        loop {
            if self.is_cancelled() {
                return Err(Status::cancelled("the stream was cancelled, expired or lost its session"));
            }
            if let Some(s) = self.shared.ended_status() {
                return Err(s);
            }
            match self.shared.put(msg) {
                Ok(true) => return Ok(()),
                // Refused because the stream ended since the look above: fail as it says.
                Ok(false) if self.shared.ended.load(Ordering::Acquire) => continue,
                Ok(false) => {}
                Err(e) => return Err(self.shared.failed(e)),
            }
            if self.shared.worker == Some(std::thread::current().id()) {
                // Waiting would wait for ourselves: the worker drains the sink only after the
                // handler returns.
                return Err(Status::resource_exhausted(format!(
                    "a handler sent more than SINK_DEPTH ({SINK_DEPTH}) stream messages inline: \
                     send from a thread of its own"
                )));
            }
            *self.shared.waiter.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
            // A read-modify-write, as the worker's `swap(false)` in `wake`: whichever comes
            // second sees the other's change (a plain store may wait in the store buffer while
            // the look at the room below reads the old state and the worker reads `waiting`
            // false: a lost wake-up).
            let _ = self.shared.waiting.swap(true, Ordering::AcqRel);
            if !self.shared.has_room() && !self.is_cancelled() {
                // Woken by the worker when it takes messages; the timeout covers a session that
                // vanished without a look at this stream.
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
    }

    /// Sends one message from a task (async handlers): as [`StreamSink::send`], but waits for room
    /// by yielding to the executor, woken by the worker when it takes a message (no polling).
    ///
    /// # Errors
    /// CANCELLED once the stream is over without us ([`StreamSink::is_cancelled`]); INTERNAL as
    /// [`StreamSink::send`]. The message is dropped.
    ///
    /// # Cancel safety
    /// Not cancel-safe, as tokio's `mpsc::Sender::send`: when the future is dropped before it
    /// completes (another `tokio::select!` branch won), the message was not sent and is lost
    /// (it is queued only when the future completes `Ok`); the stream goes on.
    pub async fn send_async(&self, msg: &T) -> Result<(), Status> {
        std::future::poll_fn(|cx| {
            for _ in 0..2 {
                if self.is_cancelled() {
                    return std::task::Poll::Ready(Err(Status::cancelled(
                        "the stream was cancelled, expired or lost its session",
                    )));
                }
                if let Some(s) = self.shared.ended_status() {
                    return std::task::Poll::Ready(Err(s));
                }
                match self.shared.put(msg) {
                    Ok(true) => return std::task::Poll::Ready(Ok(())),
                    Ok(false) => {}
                    Err(e) => return std::task::Poll::Ready(Err(self.shared.failed(e))),
                }
                // Room may come between the failed put and the registration: look once more.
                self.shared.waker.register(cx.waker());
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// Messages waiting in the sink for the client's stream grants (at most [`SINK_DEPTH`]).
    pub fn queued(&self) -> usize {
        self.shared.held()
    }
}

impl<T> Drop for StreamSink<T> {
    fn drop(&mut self) {
        if self.end_on_drop {
            self.end(Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message of `n` payload bytes (`Vec<u8>` encodes as field 1: `n + 2` bytes for `n < 128`).
    fn msg(n: usize, fill: u8) -> Vec<u8> {
        vec![fill; n]
    }

    fn sink(batch_cap: usize) -> Arc<SinkShared> {
        SinkShared::new(Arc::new(CancelFlag::default()), None, batch_cap)
    }

    /// The messages of a sealed SEND, decoded.
    fn messages(s: &Sealed) -> Vec<Vec<u8>> {
        if s.count == 0 {
            return vec![Vec::<u8>::decode(&s.body[..]).unwrap()];
        }
        crate::wire::batch_frames(&s.body, s.count).unwrap().map(|m| Vec::<u8>::decode(m).unwrap()).collect()
    }

    /// A producer sharing the sink (`&StreamSink` is `Sync`) looks at `ended` in `send`, then
    /// another producer's send fails (a message that lies about its `encoded_len`: the stream
    /// ends) and the worker, finding the sink empty, takes the end and sends it; only then does
    /// the first producer's `put` run. The message must be refused: accepted, its send
    /// returned Ok for a message that never leaves (the stream is over). Sabotaged (`put`
    /// without its look at `ended` under the open lock): put accepted it.
    #[test]
    fn a_message_put_after_the_worker_took_the_end_is_refused_not_lost() {
        let s = sink(1000);
        assert!(s.ended_status().is_none(), "the honest producer looked: not ended");
        let _ = s.failed(LenMismatch { type_name: "Liar", claimed: 3, wrote: None });
        assert!(matches!(s.take_end(), Some(Err(_))), "the worker took the end: the stream is over");
        assert!(!s.put(&msg(10, 1)).unwrap(), "a message put after the end was accepted (and lost)");
        assert!(s.is_empty());
        assert_eq!(s.ended_status().map(|st| st.code()), Some(crate::status::Code::Internal));
    }

    #[test]
    fn the_worker_takes_batches_in_the_order_the_producer_filled_them() {
        // A producer sealing a batch (pushed to the queue) and opening the next, racing a worker
        // that takes the open batch whenever the queue looks empty: the worker must never take
        // the open batch while an older sealed one is queued (the client would get a stream's
        // messages out of order; seen on rxe0 as a server stream starting at message 169).
        // 3 messages of 6 bytes (+ a frame's length) per batch, so batches seal all the time.
        const N: u32 = 1_000_000;
        let s = sink(3 * (FRAME_LEN + 6));
        let producer = {
            let s = s.clone();
            std::thread::spawn(move || {
                for seq in 0..N {
                    while !s.put(&seq.to_le_bytes().to_vec()).unwrap() {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut next = 0u32;
        while next < N {
            let Some(b) = s.pop(true) else {
                std::thread::yield_now();
                continue;
            };
            for m in messages(&b) {
                let seq = u32::from_le_bytes(m.try_into().unwrap());
                assert_eq!(seq, next, "message {seq} taken where {next} was due");
                next += 1;
            }
            s.recycle(b.body);
        }
        producer.join().unwrap();
    }

    #[test]
    fn the_producer_frames_messages_into_batches_that_fill_one_send() {
        // 30-byte messages, 34 with their frame: two fit 100 bytes, the third seals them.
        let s = sink(100);
        for i in 0..5 {
            assert!(s.put(&msg(28, i)).unwrap());
        }
        assert_eq!(s.held(), 5);
        let a = s.pop(false).expect("the first two, sealed by the third");
        assert_eq!((a.count, a.body.len()), (2, 68));
        assert_eq!(messages(&a), vec![msg(28, 0), msg(28, 1)]);
        let b = s.pop(false).expect("the next two");
        assert_eq!(messages(&b), vec![msg(28, 2), msg(28, 3)]);
        // The fifth is still open: the worker takes it only when asked to.
        assert!(s.pop(false).is_none());
        assert_eq!(s.open_count(), 1);
        let c = s.pop(true).expect("the open batch");
        assert_eq!(messages(&c), vec![msg(28, 4)]);
        assert!(s.is_empty() && s.pop(true).is_none());
    }

    #[test]
    fn a_message_too_large_for_a_batch_goes_alone_after_the_batch_before_it() {
        let s = sink(100);
        assert!(s.put(&msg(10, 1)).unwrap());
        assert!(s.put(&msg(200, 2)).unwrap());
        assert!(s.put(&msg(10, 3)).unwrap());
        let a = s.pop(false).unwrap();
        assert_eq!((a.count, messages(&a)), (1, vec![msg(10, 1)]));
        let b = s.pop(false).unwrap();
        assert_eq!((b.count, messages(&b)), (0, vec![msg(200, 2)]), "unframed");
        assert!(s.pop(false).is_none());
        assert_eq!(messages(&s.pop(true).unwrap()), vec![msg(10, 3)]);
    }

    #[test]
    fn the_end_seals_the_open_batch_and_waits_for_it_to_leave() {
        let s = sink(4096);
        assert!(s.put(&msg(5, 7)).unwrap());
        end(&s, Ok(()));
        assert!(s.take_end().is_none(), "a message is still held");
        let a = s.pop(false).expect("sealed by the end");
        assert_eq!(messages(&a), vec![msg(5, 7)]);
        assert_eq!(s.take_end().map(|r| r.is_ok()), Some(true));
    }

    #[test]
    fn the_sink_holds_at_most_sink_depth_messages_and_refills_from_the_worker() {
        let s = sink(4096);
        let mut n = 0;
        while s.put(&msg(1, 0)).unwrap() {
            n += 1;
            assert!(n <= SINK_DEPTH, "no bound");
        }
        assert_eq!(n, SINK_DEPTH);
        assert!(!s.has_room());
        let mut taken = 0;
        while let Some(b) = s.pop(true) {
            taken += usize::from(b.count.max(1));
            s.recycle(b.body);
        }
        assert_eq!(taken, SINK_DEPTH);
        assert!(s.has_room() && s.put(&msg(1, 0)).unwrap());
    }

    #[test]
    fn the_byte_bound_holds_for_large_messages() {
        let s = sink(4096);
        let big = msg(64 << 10, 1);
        let mut n = 0;
        while s.put(&big).unwrap() {
            n += 1;
            assert!(n <= SINK_DEPTH);
        }
        // A send waits once SINK_BYTES are held: at most that plus one message.
        assert_eq!(n, SINK_BYTES.div_ceil(big.encoded_len()));
    }
}
