//! The server's end of the client's messages (client streaming, bidirectional): a
//! [`RequestStream`] a handler reads from any thread (blocking, or awaiting in a task), filled by
//! the worker that owns the session as the client's messages arrive.
//!
//! Backpressure is end to end: the worker grants the client stream grants only as the handler
//! takes messages (each message taken is counted here; the worker returns their grants on its
//! next loop), so a handler that stops reading stalls the client's `send` once the stream's
//! grants (at most half the session's stream budget) are held here. The server's memory per
//! stream is bounded by those grants, whatever the client's speed.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::{Thread, ThreadId};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;
use prost::Message;

use super::reply::CancelFlag;
use crate::status::Status;

/// Bodies kept for reuse per stream.
const RECYCLE_COUNT: usize = 8;
/// Bodies of at most this capacity are reused; larger ones are freed.
const RECYCLE_MAX: usize = 64 << 10;

/// What the reader and the worker share.
pub(crate) struct SourceShared {
    /// Stream SENDs received and not yet taken (at most the stream's grants, so never more
    /// than [`crate::session::MAX_STREAM_BUDGET`]): an encoded message (count 0), or a batch of
    /// `count` messages in frames ([`crate::wire::STREAM_BATCH`], checked by the session).
    pub(crate) queue: ArrayQueue<(Vec<u8>, u16)>,
    /// The client ended its messages cleanly (set after its last message is queued).
    pub(crate) ended: AtomicBool,
    /// Raised by the worker when the call is over without the handler (cancel, deadline,
    /// session gone, or answered).
    pub(crate) cancelled: CancelFlag,
    /// Stream SENDs (messages, whole batches) taken since the worker last returned their grants.
    pub(crate) taken: AtomicU32,
    /// The handler dropped its [`RequestStream`]: messages arriving from here are dropped and
    /// their grants returned (else the client's sends stall at the grant limit forever).
    pub(crate) dropped: AtomicBool,
    /// A blocked reader's thread, woken when a message or the end arrives.
    waiter: Mutex<Option<Thread>>,
    waiting: AtomicBool,
    /// A reading task's waker.
    waker: AtomicWaker,
    /// The worker thread that fills the queue: a read on it cannot wait.
    worker: Option<ThreadId>,
    /// Emptied bodies the reader gave back, for the worker to copy the next SENDs into (so a
    /// SEND costs no allocation once the stream runs).
    free: ArrayQueue<Vec<u8>>,
}

impl SourceShared {
    pub(crate) fn new(worker: Option<ThreadId>) -> Arc<SourceShared> {
        Arc::new(SourceShared {
            queue: ArrayQueue::new(crate::session::MAX_STREAM_BUDGET as usize),
            ended: AtomicBool::new(false),
            cancelled: CancelFlag::default(),
            taken: AtomicU32::new(0),
            dropped: AtomicBool::new(false),
            waiter: Mutex::new(None),
            waiting: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            worker,
            free: ArrayQueue::new(RECYCLE_COUNT),
        })
    }

    /// Worker: a SEND's body (`bytes`) copied into a buffer the reader gave back (a new one only
    /// while none came back yet, or when it is too small).
    pub(crate) fn copy_in(&self, bytes: &[u8]) -> Vec<u8> {
        let mut v = self.free.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(bytes);
        v
    }

    /// Reader: a body it finished with goes back to the worker when no decoded message holds a
    /// slice of it any more; else it is kept (`held`) and tried again at the next look.
    fn recycle(&self, held: &mut Option<bytes::Bytes>) {
        let Some(b) = held.take() else { return };
        match b.try_into_mut() {
            Ok(m) if m.capacity() <= RECYCLE_MAX => {
                let _ = self.free.push(Vec::from(m));
            }
            Ok(_) => {}
            Err(b) => *held = Some(b),
        }
    }

    /// Worker: a message or the end arrived, or the call is over: wake the reader.
    pub(crate) fn wake(&self) {
        self.waker.wake();
        if self.waiting.swap(false, Ordering::AcqRel) {
            if let Some(t) = self.waiter.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                t.unpark();
            }
        }
    }

    /// Drops the messages queued, counted as taken (their grants return): the reader is gone.
    pub(crate) fn drop_queued(&self) {
        while self.queue.pop().is_some() {
            self.taken.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Worker: the call is over without the handler: the reader's next look returns CANCELLED
    /// and drops the messages it did not take. The worker never pops a live reader's queue: a pop
    /// racing the reader's would take a message ahead of the one the reader takes, and the reader
    /// would go on past a gap (seen on rxe0 as "message 9 arrived as 0" after a cancel).
    pub(crate) fn cancel(&self) {
        self.cancelled.raise();
        self.wake();
    }

    /// One look: a message, the end (`Some(Ok(None))`), the cancellation, or `None` for nothing
    /// yet. `cur` is the reader's place in a batch it is taking.
    fn poll_once<T: Message + Default>(
        &self,
        cur: &mut Option<Batch>,
        last: &mut Option<bytes::Bytes>,
    ) -> Option<Result<Option<T>, Status>> {
        // The body of the message taken before goes back once the caller dropped that message.
        self.recycle(last);
        if self.cancelled.is_raised() {
            // The call is over: what was not taken is dropped here, by the queue's one consumer
            // while the reader lives (see `cancel`), so what the reader took is a gapless prefix.
            *cur = None;
            while self.queue.pop().is_some() {}
            return Some(Err(Status::cancelled(
                "the stream was cancelled, expired or lost its session before the client ended it",
            )));
        }
        if let Some(r) = self.next_message::<T>(cur, last) {
            return Some(r.map(Some));
        }
        if self.ended.load(Ordering::Acquire) {
            // The end is set after the last message was queued: look once more.
            return Some(self.next_message::<T>(cur, last).map_or(Ok(None), |r| r.map(Some)));
        }
        None
    }
}

/// A reader's place in a batch: the batch (`bytes` fields of its messages are slices of it), the
/// offset of the next frame, and the messages left.
pub(crate) struct Batch {
    body: bytes::Bytes,
    at: usize,
    left: u16,
}

impl SourceShared {
    /// The next message, from the batch being taken or the queue; a SEND's grant is counted
    /// as taken with its last message.
    /// `last` keeps the body of a single message or a finished batch for recycling.
    fn next_message<T: Message + Default>(
        &self,
        cur: &mut Option<Batch>,
        last: &mut Option<bytes::Bytes>,
    ) -> Option<Result<T, Status>> {
        let undecodable = |e: prost::DecodeError| {
            Status::invalid_argument(format!(
                "cannot decode {}: {}",
                std::any::type_name::<T>(),
                super::service::decode_error_text(&e)
            ))
        };
        loop {
            if let Some(b) = cur {
                // The session checked the frames: a missing one only ends the batch early.
                let frame = crate::wire::frame_at(&b.body, b.at);
                b.left = b.left.saturating_sub(1);
                let r = frame.map(|(s, e)| T::decode(b.body.slice(s..e)).map_err(undecodable));
                match frame {
                    Some((_, end)) if b.left > 0 => b.at = end,
                    _ => {
                        if let Some(done) = cur.take() {
                            self.recycle(last);
                            *last = Some(done.body);
                        }
                        self.taken.fetch_add(1, Ordering::AcqRel);
                    }
                }
                match r {
                    Some(r) => return Some(r),
                    None => continue,
                }
            }
            let (bytes, count) = self.queue.pop()?;
            if count == 0 {
                self.taken.fetch_add(1, Ordering::AcqRel);
                // `bytes` fields become slices of this buffer: no second copy.
                let body = bytes::Bytes::from(bytes);
                let r = T::decode(body.clone()).map_err(undecodable);
                self.recycle(last);
                *last = Some(body);
                return Some(r);
            }
            *cur = Some(Batch { body: bytes::Bytes::from(bytes), at: 0, left: count });
        }
    }
}

/// The client's messages of a client-streaming or bidirectional call, in order, read from any
/// thread (`Send`): [`RequestStream::message`] blocks, [`RequestStream::message_async`] is for a task.
/// Each message taken returns its stream grant to the client (batched by the worker), so a
/// handler that stops reading stalls the client's sender at the stream's grant limit.
/// Dropping it drops the messages queued and every later one, returning their grants: the
/// client's sends go on until the call's answer.
///
/// The client's end: a `finish` (or, on a `Channel`, its `StreamSender` dropped: a half-close,
/// as in tonic) ends the stream with `Ok(None)`; a cancel (a `Channel`'s `StreamReceiver` or
/// `ClientStreamCall` dropped, a blocking stream dropped before its end, the deadline, the
/// session gone) ends it CANCELLED. Either way a reader waiting in `message` wakes.
pub struct RequestStream<T> {
    shared: Arc<SourceShared>,
    done: bool,
    /// The batch being taken.
    cur: Option<Batch>,
    /// The body of the last message or batch taken, back to the worker once unshared.
    last: Option<bytes::Bytes>,
    _t: PhantomData<fn() -> T>,
}

impl<T> RequestStream<T> {
    pub(crate) fn new(shared: Arc<SourceShared>) -> RequestStream<T> {
        RequestStream { shared, done: false, cur: None, last: None, _t: PhantomData }
    }

    /// True once the call is over without the handler: the client cancelled it, its deadline
    /// passed, the session closed, or it was answered.
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancelled.is_raised()
    }

    /// Stream SENDs (messages or batches of them) received and not yet taken.
    pub fn queued(&self) -> usize {
        self.shared.queue.len()
    }
}

impl<T: Message + Default> RequestStream<T> {
    /// Blocks for the next message: `Ok(Some(m))`, or `Ok(None)` once the client ended its
    /// messages cleanly (`finish`). After the end (either way) every call returns `Ok(None)`.
    ///
    /// # Errors
    /// CANCELLED when the call is over before the client's end (it cancelled, the deadline
    /// passed, the session closed), from the first look after that: messages not taken by then
    /// are dropped, so what was taken is the stream's first messages, in order, with no gap;
    /// INVALID_ARGUMENT for a message that does not decode (the
    /// stream goes on); FAILED_PRECONDITION on the worker thread with nothing queued (an inline
    /// handler cannot wait for the worker it blocks: read from a thread of its own).
    pub fn message(&mut self) -> Result<Option<T>, Status> {
        if self.done {
            return Ok(None);
        }
        loop {
            if let Some(r) = self.shared.poll_once::<T>(&mut self.cur, &mut self.last) {
                self.done = matches!(r, Ok(None)) || self.is_cancelled() && r.is_err();
                return r;
            }
            if self.shared.worker == Some(std::thread::current().id()) {
                return Err(Status::failed_precondition(
                    "a handler read its request stream inline on the worker thread: read it from a thread of \
                     its own (or an async handler)",
                ));
            }
            *self.shared.waiter.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
            // A read-modify-write, as the worker's `swap(false)` in `wake`: whichever comes second
            // sees the other (a plain store could sit in the store buffer while the look below
            // reads the old state and the worker reads `waiting` false: a lost wake-up, the
            // producer or reader asleep until its timeout; it happened 96 times in a 2 s stream_bw).
            let _ = self.shared.waiting.swap(true, Ordering::AcqRel);
            if self.shared.queue.is_empty()
                && !self.shared.ended.load(Ordering::Acquire)
                && !self.is_cancelled()
            {
                // Woken by the worker; the timeout covers a session that vanished unseen.
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
    }

    /// Awaits the next message (for async handlers): as [`RequestStream::message`], woken by the
    /// worker (no polling).
    ///
    /// # Errors
    /// As [`RequestStream::message`] (never FAILED_PRECONDITION).
    ///
    /// # Cancel safety
    /// Cancel-safe: a message is taken only when the future completes with it, so when
    /// `message_async()` loses a `tokio::select!` race no message is lost (the next call
    /// returns it).
    pub async fn message_async(&mut self) -> Result<Option<T>, Status> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<T>, Status>> {
        if self.done {
            return Poll::Ready(Ok(None));
        }
        let mut r = self.shared.poll_once::<T>(&mut self.cur, &mut self.last);
        if r.is_none() {
            self.shared.waker.register(cx.waker());
            r = self.shared.poll_once::<T>(&mut self.cur, &mut self.last);
        }
        match r {
            Some(r) => {
                self.done = matches!(r, Ok(None)) || self.is_cancelled() && r.is_err();
                Poll::Ready(r)
            }
            None => Poll::Pending,
        }
    }
}

impl<T> Drop for RequestStream<T> {
    fn drop(&mut self) {
        // The worker checks `dropped` before it queues a message and drops what it queued
        // once it sees it set, so every message is dropped (and its grant returned) once.
        self.shared.dropped.store(true, Ordering::Release);
        if self.cur.take().is_some() {
            self.shared.taken.fetch_add(1, Ordering::AcqRel);
        }
        self.shared.drop_queued();
    }
}

impl<T: Message + Default> Iterator for RequestStream<T> {
    type Item = Result<T, Status>;

    fn next(&mut self) -> Option<Result<T, Status>> {
        self.message().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker's side: a SEND of one message (`Vec<u8>` encoded) or a batch of them.
    fn send_single(s: &SourceShared, m: &[u8]) -> *const u8 {
        let v = s.copy_in(&m.to_vec().encode_to_vec());
        let p = v.as_ptr();
        s.queue.push((v, 0)).unwrap();
        p
    }

    fn send_batch(s: &SourceShared, ms: &[&[u8]]) -> *const u8 {
        let mut body = Vec::new();
        for m in ms {
            crate::wire::push_frame(&mut body, &m.to_vec().encode_to_vec());
        }
        let v = s.copy_in(&body);
        let p = v.as_ptr();
        s.queue.push((v, ms.len() as u16)).unwrap();
        p
    }

    #[test]
    fn bodies_go_back_to_the_worker_once_the_reader_dropped_their_messages() {
        let s = SourceShared::new(None);
        let mut r = RequestStream::<Vec<u8>>::new(s.clone());
        let first = send_single(&s, b"one");
        assert_eq!(r.message().unwrap().unwrap(), b"one");
        // Taken and dropped: the next look gives its body back, and the next SEND reuses it.
        let second = send_batch(&s, &[b"two", b"three"]);
        assert_ne!(first, second, "the first body was still the reader's");
        assert_eq!(r.message().unwrap().unwrap(), b"two");
        assert_eq!(send_single(&s, b"four"), first, "the first body came back");
        assert_eq!(r.message().unwrap().unwrap(), b"three");
        assert_eq!(r.message().unwrap().unwrap(), b"four");
        assert_eq!(send_single(&s, b"five"), second, "the batch's body came back");
    }

    /// The worker cancels while the reader takes queued messages (a handler polling
    /// `is_cancelled` between reads, as rpc_stream_in's STALL handler does): what the reader
    /// takes is 0, 1, 2, ... then CANCELLED, never a message past a gap.
    #[test]
    fn a_cancel_racing_the_reader_never_leaves_a_gap_in_what_it_takes() {
        let queued = crate::session::MAX_STREAM_BUDGET as usize;
        for round in 0..400 {
            let s = SourceShared::new(None);
            let mut r = RequestStream::<Vec<u8>>::new(s.clone());
            for i in 0..queued {
                send_single(&s, &(i as u32).to_le_bytes());
            }
            let start = Arc::new(std::sync::Barrier::new(2));
            let worker = {
                let (s, start) = (s.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    s.cancel();
                })
            };
            start.wait();
            let mut next = 0u32;
            loop {
                match r.message() {
                    Ok(Some(m)) => {
                        assert_eq!(m, next.to_le_bytes(), "round {round}: message {next} due");
                        next += 1;
                    }
                    Ok(None) => panic!("round {round}: an end, not a cancel"),
                    Err(e) => {
                        assert_eq!(e.code(), crate::status::Code::Cancelled, "round {round}: {e}");
                        break;
                    }
                }
            }
            worker.join().unwrap();
            assert!(s.queue.is_empty(), "round {round}: the reader dropped what it did not take");
        }
    }
}
