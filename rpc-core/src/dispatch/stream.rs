//! The server's end of a server stream: a [`StreamSink`] a handler sends messages into from any
//! thread, drained by the worker that owns the session as the client grants stream credits.
//!
//! Backpressure is end to end: the worker takes a message out of the sink only with a stream
//! credit in hand (the client grants credits as its application takes messages), and the sink
//! holds at most [`SINK_DEPTH`] encoded messages and about [`SINK_BYTES`] bytes, so
//! [`StreamSink::send`] blocks while the client does not read. The server's memory per stream is
//! bounded by the sink plus the stream's credits, whatever the producer's speed.
//!
//! The hot path allocates nothing: a message is encoded into a buffer the worker gave back
//! (`free`), the worker copies it into the stream's next SEND (several small ones into one
//! batch, [`crate::wire::STREAM_BATCH`]) and returns the buffer. A waiting producer is woken
//! once the sink is down to half (not per message taken), so it runs in bursts instead of a
//! context switch per message.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::reply::CancelFlag;
use std::sync::{Arc, Mutex};
use std::thread::{Thread, ThreadId};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use prost::Message;

use crate::status::Status;

/// Encoded messages a [`StreamSink`] holds before [`StreamSink::send`] blocks.
pub const SINK_DEPTH: usize = 256;

/// Bytes of encoded messages a [`StreamSink`] holds before [`StreamSink::send`] blocks: a send
/// waits while this much is queued (so the sink holds at most this plus one message).
pub const SINK_BYTES: usize = 1 << 20;

/// Buffers of at most this capacity go back to the producer for its next messages; larger ones
/// are freed.
const RECYCLE_MAX: usize = 16 << 10;

/// What the sink and the worker share.
pub(crate) struct SinkShared {
    /// Encoded messages waiting for a stream credit.
    pub(crate) queue: ArrayQueue<Vec<u8>>,
    /// Bytes of the messages in `queue`.
    pub(crate) queued_bytes: AtomicUsize,
    /// Emptied buffers for the producer's next messages (the worker gives them back).
    free: ArrayQueue<Vec<u8>>,
    /// The stream's final status, once the handler finished (or dropped the sink).
    pub(crate) end: Mutex<Option<Result<(), Status>>>,
    pub(crate) ended: AtomicBool,
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
}

impl SinkShared {
    pub(crate) fn new(cancelled: Arc<CancelFlag>, worker: Option<ThreadId>) -> Arc<SinkShared> {
        Arc::new(SinkShared {
            queue: ArrayQueue::new(SINK_DEPTH),
            queued_bytes: AtomicUsize::new(0),
            free: ArrayQueue::new(SINK_DEPTH),
            end: Mutex::new(None),
            ended: AtomicBool::new(false),
            cancelled,
            waiter: Mutex::new(None),
            waiting: AtomicBool::new(false),
            waker: atomic_waker::AtomicWaker::new(),
            worker,
        })
    }

    /// Worker: the next message waiting, with its bytes no longer counted.
    pub(crate) fn pop(&self) -> Option<Vec<u8>> {
        let m = self.queue.pop()?;
        self.queued_bytes.fetch_sub(m.len(), Ordering::AcqRel);
        Some(m)
    }

    /// Worker: drops every message waiting.
    pub(crate) fn clear(&self) {
        while self.pop().is_some() {}
    }

    /// Worker: a message's buffer, copied out, goes back to the producer.
    pub(crate) fn recycle(&self, mut buf: Vec<u8>) {
        if buf.capacity() <= RECYCLE_MAX {
            buf.clear();
            let _ = self.free.push(buf);
        }
    }

    /// Room for one more message.
    fn has_room(&self) -> bool {
        !self.queue.is_full() && self.queued_bytes.load(Ordering::Acquire) < SINK_BYTES
    }

    /// Worker, after taking messages: wakes a waiting producer once the sink is down to half
    /// (a burst of room, not a wake-up per message).
    pub(crate) fn wake_if_low(&self) {
        if self.queue.len() <= SINK_DEPTH / 2 && self.queued_bytes.load(Ordering::Acquire) <= SINK_BYTES / 2 {
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
        if !self.ended.load(Ordering::Acquire) || !self.queue.is_empty() {
            return None;
        }
        self.end.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Sends the messages of a server stream, from any thread (`Send`). Get it from
/// [`RequestContext::stream`](super::reply::RequestContext::stream). Dropping it ends the stream
/// with OK (a clean end-of-stream); [`StreamSink::finish`] ends it with a status.
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
    let mut end = shared.end.lock().unwrap_or_else(|e| e.into_inner());
    if !shared.ended.load(Ordering::Acquire) {
        *end = Some(result);
        shared.ended.store(true, Ordering::Release);
    }
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
    /// messages wait for the client's credits: a client that stops reading stalls the producer
    /// here.
    ///
    /// # Errors
    /// CANCELLED once the stream is over without us ([`StreamSink::is_cancelled`]);
    /// RESOURCE_EXHAUSTED for a send on the worker thread (inline in the handler) that finds
    /// [`SINK_DEPTH`] messages queued (it cannot wait for the worker it blocks). The message is
    /// dropped.
    pub fn send(&self, msg: &T) -> Result<(), Status> {
        let mut bytes = self.encode(msg);
        loop {
            if self.is_cancelled() {
                return Err(Status::cancelled("the stream was cancelled, expired or lost its session"));
            }
            match self.try_push(bytes) {
                Ok(()) => return Ok(()),
                Err(back) => bytes = back,
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
            self.shared.waiting.store(true, Ordering::Release);
            if !self.shared.has_room() && !self.is_cancelled() {
                // Woken by the worker when it takes a message; the timeout covers a session that
                // vanished without a look at this stream.
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
    }

    /// Sends one message from a task (async handlers): as [`StreamSink::send`], but waits for room
    /// by yielding to the executor, woken by the worker when it takes a message (no polling).
    ///
    /// # Errors
    /// CANCELLED once the stream is over without us ([`StreamSink::is_cancelled`]). The message
    /// is dropped.
    pub async fn send_async(&self, msg: &T) -> Result<(), Status> {
        let mut bytes = Some(self.encode(msg));
        std::future::poll_fn(|cx| {
            let cancelled = || Status::cancelled("the stream was cancelled, expired or lost its session");
            for _ in 0..2 {
                if self.is_cancelled() {
                    return std::task::Poll::Ready(Err(cancelled()));
                }
                let Some(b) = bytes.take() else { return std::task::Poll::Ready(Ok(())) };
                match self.try_push(b) {
                    Ok(()) => return std::task::Poll::Ready(Ok(())),
                    Err(back) => bytes = Some(back),
                }
                // Room may come between the failed push and the registration: look once more.
                self.shared.waker.register(cx.waker());
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// `msg` encoded into a recycled buffer (a fresh one only while none came back yet).
    fn encode(&self, msg: &T) -> Vec<u8> {
        let mut buf = self.shared.free.pop().unwrap_or_default();
        buf.reserve(msg.encoded_len());
        msg.encode_raw(&mut buf);
        buf
    }

    /// Queues `bytes` when the sink has room, else gives them back.
    fn try_push(&self, bytes: Vec<u8>) -> Result<(), Vec<u8>> {
        if !self.shared.has_room() {
            return Err(bytes);
        }
        let len = bytes.len();
        // Counted before it is visible, so the worker's subtraction never underflows.
        self.shared.queued_bytes.fetch_add(len, Ordering::AcqRel);
        self.shared.queue.push(bytes).inspect_err(|_| {
            self.shared.queued_bytes.fetch_sub(len, Ordering::AcqRel);
        })
    }

    /// Messages waiting in the sink for the client's credits (at most [`SINK_DEPTH`]).
    pub fn queued(&self) -> usize {
        self.shared.queue.len()
    }
}

impl<T> Drop for StreamSink<T> {
    fn drop(&mut self) {
        if self.end_on_drop {
            self.end(Ok(()));
        }
    }
}
