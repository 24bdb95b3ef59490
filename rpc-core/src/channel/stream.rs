//! Streams on the [`Channel`]: server streaming ([`Channel::server_stream`] →
//! [`StreamReceiver`]), client streaming ([`Channel::client_stream`] → [`ClientStreamCall`]) and
//! bidirectional ([`Channel::bidi_stream`] → a [`StreamSender`] and a [`StreamReceiver`], each
//! `Send + 'static`, usable from different tasks).
//!
//! The dispatcher that owns the session moves messages between it and the tasks: a task encodes
//! its message and queues it (at most [`STREAM_QUEUE`] wait; `send` waits for room, woken by the
//! dispatcher, which takes one per stream grant of the server); the dispatcher decodes the
//! server's messages into the receiver's queue (at most [`STREAM_QUEUE`]) and returns their
//! stream grants only as that queue has room, so a task that stops reading stalls the server's producer.
//! Memory per stream is bounded by the two queues and the stream's grants, whatever either
//! side's speed. The call's timeout is the whole stream's deadline. A stream opened while the
//! dispatcher's queue is full waits for room (its halves' futures stay pending, woken when the
//! dispatcher takes calls out), as unary calls do.
//!
//! # Dropping a half
//! As in tonic: dropping a [`StreamSender`] ends the caller's messages cleanly, as
//! [`StreamSender::finish`] (the server's request stream ends with `Ok(None)`; the server's
//! messages and its end still come to the receiver). Dropping a [`StreamReceiver`] (or a
//! [`ClientStreamCall`]) before the stream's end cancels the call: a Cancel goes to the server
//! (its request stream ends CANCELLED, its sink's sends fail CANCELLED) and a send waiting on
//! the sender ends CANCELLED. Whatever is dropped, every pending future of the other half ends
//! (with the stream's end or a status); none waits for ever.
//!
//! # Cancel safety
//! [`StreamReceiver::message`] is cancel-safe; [`StreamSender::send`] and
//! [`ClientStreamCall::send`] are not (a send that loses a `select!` race was not sent);
//! dropping [`ClientStreamCall::finish`]'s future cancels the call. Each says so in its docs.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;
use prost::Message;

use super::call::Job;
use super::dispatcher::{with_any_core, AnyCore};
use super::{Channel, Shared};
use crate::client::core::{CallId, StartMode};
use crate::client::{CallOptions, IntoRequest, StreamObs};
use crate::codegen::MethodId;
use crate::status::Status;
use crate::wire::{STREAM_IN, STREAM_OUT};

/// Messages that wait in each direction of a channel stream, between the tasks and the
/// dispatcher (beyond the stream's grants at either end).
pub const STREAM_QUEUE: usize = 16;

/// The caller's messages on their way to the dispatcher.
struct Outbound {
    queue: ArrayQueue<Vec<u8>>,
    /// A sending task waiting for room.
    waker: AtomicWaker,
    /// The caller ended its messages cleanly (the StreamEnd follows the queued ones).
    finished: AtomicBool,
    /// The StreamEnd was handed to the session (dispatcher only).
    end_sent: AtomicBool,
}

/// The server's messages and the stream's end on their way to the caller.
struct Inbound<Resp> {
    queue: ArrayQueue<Resp>,
    waker: AtomicWaker,
    /// The end: `Ok(None)` a clean end of a stream of server messages, `Ok(Some(answer))` the
    /// answer of a client stream, or the error that ended it.
    end: Mutex<Option<Result<Option<Resp>, Status>>>,
    ended: AtomicBool,
}

/// What the tasks and the dispatcher share of one stream.
struct StreamState<Resp> {
    out: Outbound,
    inb: Inbound<Resp>,
    /// A half was dropped before the stream's end: the dispatcher cancels the call.
    cancelled: AtomicBool,
}

impl<Resp> StreamState<Resp> {
    fn new() -> Arc<StreamState<Resp>> {
        Arc::new(StreamState {
            out: Outbound {
                queue: ArrayQueue::new(STREAM_QUEUE),
                waker: AtomicWaker::new(),
                finished: AtomicBool::new(false),
                end_sent: AtomicBool::new(false),
            },
            inb: Inbound {
                queue: ArrayQueue::new(STREAM_QUEUE),
                waker: AtomicWaker::new(),
                end: Mutex::new(None),
                ended: AtomicBool::new(false),
            },
            cancelled: AtomicBool::new(false),
        })
    }

    /// Stores the end (the first one wins) and wakes both halves.
    fn end(&self, r: Result<Option<Resp>, Status>) {
        self.stage_end(r);
        self.inb.waker.wake();
        self.out.waker.wake();
    }

    /// Stores the end (the first one wins) without waking: the driver wakes both halves with
    /// [`Job::release`] once it has published `in_flight`, as it does for unary calls.
    fn stage_end(&self, r: Result<Option<Resp>, Status>) {
        {
            let mut end = self.inb.end.lock().unwrap_or_else(|e| e.into_inner());
            if self.inb.ended.load(Ordering::Acquire) {
                return;
            }
            *end = Some(r);
            self.inb.ended.store(true, Ordering::Release);
        }
        while self.out.queue.pop().is_some() {}
    }
}

/// A stream as its dispatcher sees it.
struct StreamJob<Req, Resp> {
    method: MethodId,
    /// Fixed when the stream was opened (its time in the queue counts).
    deadline: Option<Instant>,
    flags: u8,
    /// Request metadata, encoded in front of the opening request.
    metadata: Option<Arc<crate::metadata::Metadata>>,
    /// Where the stream's end puts its response metadata (`CallOptions::capture_metadata`).
    capture: Option<crate::metadata::CapturedMetadata>,
    request: Mutex<Option<Req>>,
    state: Arc<StreamState<Resp>>,
    /// A message taken from the queue that found no stream grant: first in line (dispatcher only).
    held: Mutex<Option<Vec<u8>>>,
}

impl<Req, Resp> Job for StreamJob<Req, Resp>
where
    Req: Message + Send + 'static,
    Resp: Message + Default + Send + 'static,
{
    fn start(&self, core: &mut AnyCore) -> Result<CallId, Status> {
        let Some(req) = self.request.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Err(Status::internal("stream started twice"));
        };
        let deadline = self.deadline;
        let req = crate::metadata::WithMetadata::new(&req, self.metadata.as_deref());
        let flags = self.flags | req.flags();
        with_any_core!(core, c => c.start_with(self.method, &req, deadline, StartMode::Batched, flags, self.capture.as_ref()))?
            .ok_or_else(|| Status::internal("no free slot for a started stream"))
    }

    fn try_finish(&self, core: &mut AnyCore, id: CallId, expired: bool) -> bool {
        let st = &*self.state;
        if expired {
            with_any_core!(core, c => c.abandon_stream(id));
            st.stage_end(Err(Status::deadline_exceeded("the stream's deadline passed before its end")));
            return true;
        }
        // The caller's messages, one per stream grant.
        if self.flags & STREAM_IN != 0 {
            let mut sent = false;
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            while let Some(bytes) = held.take().or_else(|| st.out.queue.pop()) {
                match with_any_core!(core, c => c.stream_send_encoded(id, bytes)) {
                    Ok(None) => sent = true,
                    Ok(Some(back)) => {
                        // No stream grant: it waits first in line for the next grant.
                        *held = Some(back);
                        break;
                    }
                    // The server answered already (its answer ends the stream below), or the
                    // session broke: the caller's later sends fail.
                    Err(_) => {
                        while st.out.queue.pop().is_some() {}
                        break;
                    }
                }
            }
            if sent {
                st.out.waker.wake();
            }
            if st.out.finished.load(Ordering::Acquire)
                && held.is_none()
                && st.out.queue.is_empty()
                && !st.out.end_sent.swap(true, Ordering::AcqRel)
            {
                with_any_core!(core, c => c.stream_finish(id));
            }
        }
        if self.flags & STREAM_OUT != 0 {
            let mut got = false;
            while !st.inb.queue.is_full() {
                match with_any_core!(core, c => c.take_stream::<Resp>(id)) {
                    Some(Ok(Some(m))) => {
                        let _ = st.inb.queue.push(m);
                        got = true;
                    }
                    Some(end) => {
                        st.stage_end(end);
                        return true;
                    }
                    None => break,
                }
            }
            if got {
                st.inb.waker.wake();
            }
            false
        } else {
            match with_any_core!(core, c => c.take_done::<Resp>(id)) {
                Some(r) => {
                    st.stage_end(r.map(Some));
                    true
                }
                None => false,
            }
        }
    }

    fn release(&self, wakers: &mut Vec<std::task::Waker>) {
        // try_finish staged the end; both halves wake only now, after in_flight went down.
        wakers.extend(self.state.inb.waker.take());
        wakers.extend(self.state.out.waker.take());
    }

    fn fail(&self, status: Status) {
        self.state.end(Err(status));
    }

    fn is_cancelled(&self) -> bool {
        self.state.cancelled.load(Ordering::Acquire)
    }
}

/// Wakes a stream's dispatcher to look at its calls (a task queued a message, took one from a
/// full queue, or dropped a half); holds the stream's job until the dispatcher's queue takes it.
#[derive(Clone)]
struct Poke {
    shared: Arc<Shared>,
    dispatcher: usize,
    /// The stream's job while the dispatcher's queue was full when it opened (`queued` false).
    pending: Arc<Mutex<Option<Arc<dyn Job>>>>,
    queued: Arc<AtomicBool>,
}

impl Poke {
    /// The stream ended with `status`: a balanced channel's watcher of this per-server channel
    /// is told (an UNAVAILABLE marks the server down), as for a unary call's failure.
    #[cold]
    fn failed(&self, status: Status) -> Status {
        if let Some(w) = &self.shared.watch {
            w.failed(&status);
        }
        status
    }

    /// Hands the stream's job to its dispatcher if it is not there yet: true once it is; false
    /// while the queue is full (then `cx`'s task is woken when the dispatcher makes room).
    fn submitted(&self, cx: &mut Context<'_>) -> bool {
        if self.queued.load(Ordering::Acquire) {
            return true;
        }
        // (A stream that ended before it started has no dispatcher.)
        let Some(d) = self.shared.dispatchers.get(self.dispatcher) else { return true };
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for round in 0..2 {
            let Some(job) = pending.take() else { return true };
            match d.submit(job) {
                Ok(()) => {
                    self.queued.store(true, Ordering::Release);
                    drop(pending);
                    self.poke();
                    return true;
                }
                Err(job) => *pending = Some(job),
            }
            if round == 0 {
                // Room may come between the failed push and the registration: look once more.
                d.wait_for_space(cx.waker());
            }
        }
        d.want_driver();
        false
    }

    fn poke(&self) {
        let Some(d) = self.shared.dispatchers.get(self.dispatcher) else { return };
        d.changes.fetch_add(1, Ordering::AcqRel);
        // A stream's futures do not drive the session themselves: the dispatcher thread does.
        d.want_driver();
    }
}

impl Channel {
    fn open_stream<Req, Resp>(
        &self,
        id: MethodId,
        req: Req,
        flags: u8,
        opts: &CallOptions,
    ) -> (Arc<StreamState<Resp>>, Poke)
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        if let Some(b) = &self.shared.balance {
            match b.pick(opts.key()) {
                Ok(server) => return server.open_stream(id, req, flags, opts),
                Err(s) => {
                    // No server to pick: the stream ends at once with why.
                    let state = StreamState::new();
                    state.end(Err(s));
                    let poke = Poke {
                        shared: self.shared.clone(),
                        dispatcher: usize::MAX,
                        pending: Arc::new(Mutex::new(None)),
                        queued: Arc::new(AtomicBool::new(true)),
                    };
                    return (state, poke);
                }
            }
        }
        let state = StreamState::new();
        // An interceptor's refusal ends the stream with its status; nothing is sent.
        let (metadata, refused) = match self.metadata(opts) {
            Ok(m) => (m, None),
            Err(s) => (None, Some(s)),
        };
        let job = Arc::new(StreamJob {
            method: id,
            deadline: opts.effective_timeout().and_then(|t| Instant::now().checked_add(t)),
            flags,
            metadata,
            capture: opts.capture().cloned(),
            request: Mutex::new(Some(req)),
            state: state.clone(),
            held: Mutex::new(None),
        });
        if let Some(s) = refused {
            state.end(Err(s));
            let poke = Poke {
                shared: self.shared.clone(),
                dispatcher: 0,
                pending: Arc::new(Mutex::new(None)),
                queued: Arc::new(AtomicBool::new(false)),
            };
            return (state, poke);
        }
        let n = self.shared.dispatchers.len();
        let dispatcher = if n == 1 { 0 } else { self.shared.next.fetch_add(1, Ordering::Relaxed) % n };
        // A full queue: the job waits in the halves, which hand it over as room comes (as a
        // unary call does), instead of failing the stream.
        let (pending, queued) = match self.shared.dispatchers[dispatcher].submit(job) {
            Ok(()) => (None, true),
            Err(job) => (Some(job), false),
        };
        let poke = Poke {
            shared: self.shared.clone(),
            dispatcher,
            pending: Arc::new(Mutex::new(pending)),
            queued: Arc::new(AtomicBool::new(queued)),
        };
        poke.poke();
        (state, poke)
    }

    /// Opens a server stream: sends `req` to method `id` (a server-streaming method; generated
    /// stubs call this). The returned receiver yields the server's messages. `opts`' timeout is
    /// the deadline of the whole stream. `req` is the message or a reference to it
    /// ([`IntoRequest`]; a reference is cloned, since the stream keeps the message until its
    /// session encodes it).
    ///
    /// Errors come from the receiver: as [`Channel::unary`]'s. While the dispatcher's queue is
    /// full the stream waits for room (its futures stay pending), as unary calls do.
    pub fn server_stream<Req, Resp>(
        &self,
        id: MethodId,
        req: impl IntoRequest<Req>,
        opts: &CallOptions,
    ) -> StreamReceiver<Resp>
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let opts = IntoRequest::options(&req, opts).into_owned();
        let (observed, opts) = self.observe_stream(id, IntoRequest::message(&req).encoded_len(), opts);
        let (state, poke) = self.open_stream(id, IntoRequest::into_message(req), STREAM_OUT, &opts);
        StreamReceiver { state, poke, done: false, observed }
    }

    /// Opens a client stream to method `id`: send with [`ClientStreamCall::send`], then
    /// [`ClientStreamCall::finish`] for the answer. `opts`' timeout is the deadline of the whole
    /// stream. Errors as [`Channel::server_stream`].
    pub fn client_stream<Req, Resp>(&self, id: MethodId, opts: &CallOptions) -> ClientStreamCall<Req, Resp>
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let (observed, opts) = self.observe_stream(id, 0, opts.clone());
        let (state, poke) = self.open_stream::<(), Resp>(id, (), STREAM_IN, &opts);
        let tx = StreamSender {
            out: Arc::new(SenderState(state.clone())),
            poke: poke.clone(),
            done: false,
            _t: PhantomData,
        };
        ClientStreamCall { rx: StreamReceiver { state, poke, done: false, observed }, tx }
    }

    /// Opens a bidirectional stream to method `id`: the caller's messages go into the sender,
    /// the server's come out of the receiver (each half may move to its own task). `opts`'
    /// timeout is the deadline of the whole stream. Errors as [`Channel::server_stream`].
    pub fn bidi_stream<Req, Resp>(
        &self,
        id: MethodId,
        opts: &CallOptions,
    ) -> (StreamSender<Req>, StreamReceiver<Resp>)
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let (observed, opts) = self.observe_stream(id, 0, opts.clone());
        let (state, poke) = self.open_stream::<(), Resp>(id, (), STREAM_IN | STREAM_OUT, &opts);
        let tx = StreamSender {
            out: Arc::new(SenderState(state.clone())),
            poke: poke.clone(),
            done: false,
            _t: PhantomData,
        };
        (tx, StreamReceiver { state, poke, done: false, observed })
    }

    /// The record of a stream about to open, and its options, when `ClientConfig::observe`
    /// says so (a traced stream's carry its `traceparent`).
    fn observe_stream(
        &self,
        id: MethodId,
        req_bytes: usize,
        opts: CallOptions,
    ) -> (Option<Box<StreamObs>>, CallOptions) {
        if !self.observe.any() {
            return (None, opts);
        }
        let (obs, traced) = self.observe_call(id, req_bytes, &opts);
        (Some(StreamObs::new(obs)), traced.unwrap_or(opts))
    }
}

/// The sender's view of a stream, whatever its response type.
trait SendSide: Send + Sync {
    fn out(&self) -> &Outbound;
    /// The stream is over (answered, failed, cancelled): sends fail.
    fn over(&self) -> bool;
    /// The receiver was dropped before the end: the call is cancelled.
    fn cancelled(&self) -> bool;
}

struct SenderState<Resp>(Arc<StreamState<Resp>>);

impl<Resp: Send> SendSide for SenderState<Resp> {
    fn out(&self) -> &Outbound {
        &self.0.out
    }
    fn over(&self) -> bool {
        self.0.inb.ended.load(Ordering::Acquire) || self.0.cancelled.load(Ordering::Acquire)
    }
    fn cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }
}

/// The caller's half of a client-streaming or bidirectional stream on a [`Channel`]:
/// `Send + 'static`. Dropping it ends the caller's messages cleanly, as
/// [`StreamSender::finish`] (as tonic does: a half-close, not a cancel; drop the
/// [`StreamReceiver`] to cancel).
pub struct StreamSender<Req> {
    out: Arc<dyn SendSide>,
    poke: Poke,
    done: bool,
    _t: PhantomData<fn(Req)>,
}

impl<Req: Message> StreamSender<Req> {
    /// Sends one message, after the ones sent before: encoded here, queued to the dispatcher.
    /// Waits (the future stays pending, woken by the dispatcher) while [`STREAM_QUEUE`] messages
    /// wait for the server's stream grants: a server that stops reading stalls the sender here.
    ///
    /// # Errors
    /// CANCELLED once the receiver was dropped before the stream's end (the call is cancelled);
    /// FAILED_PRECONDITION once the stream is over otherwise (the server answered, its deadline
    /// passed, the session broke: the receiver or `finish` gives why); INTERNAL when `msg`
    /// encodes to more or fewer bytes than its `encoded_len` gave (nothing of it is sent, the
    /// stream goes on).
    ///
    /// # Cancel safety
    /// Not cancel-safe, as tokio's `mpsc::Sender::send`: when the future is dropped before it
    /// completes (another `select!` branch won), the message was not sent and is lost (it is
    /// sent when the future completes `Ok`); the stream goes on, and later sends keep their
    /// order.
    pub async fn send(&mut self, msg: &Req) -> Result<(), Status> {
        if self.done {
            return Err(Status::failed_precondition("the stream's messages were ended (finish)"));
        }
        let len = msg.encoded_len();
        let mut v = Vec::new();
        // A message that does not encode to its `encoded_len` fails this send alone (nothing
        // is queued; the stream goes on).
        crate::buffers::bounded::encode_vec_exact(msg, &mut v, len)
            .map_err(|e| e.status("stream message"))?;
        let mut bytes = Some(v);
        let out = self.out.clone();
        let poke = self.poke.clone();
        std::future::poll_fn(move |cx: &mut Context<'_>| {
            if !poke.submitted(cx) {
                return Poll::Pending;
            }
            for _ in 0..2 {
                if out.cancelled() {
                    return Poll::Ready(Err(Status::cancelled(
                        "the stream was cancelled: its receiver was dropped before the end",
                    )));
                }
                if out.over() {
                    return Poll::Ready(Err(Status::failed_precondition(
                        "the stream is over; its end (the answer or the error) comes from the receiver",
                    )));
                }
                let Some(b) = bytes.take() else { return Poll::Ready(Ok(())) };
                match out.out().queue.push(b) {
                    Ok(()) => {
                        poke.poke();
                        return Poll::Ready(Ok(()));
                    }
                    Err(back) => bytes = Some(back),
                }
                // Room may come between the failed push and the registration: look once more.
                out.out().waker.register(cx.waker());
            }
            poke.poke();
            Poll::Pending
        })
        .await
    }

    /// Ends the caller's messages cleanly: a StreamEnd follows the messages queued (distinct
    /// from a cancel). The server's messages (bidirectional) or its answer still come.
    /// Dropping the sender does the same.
    pub fn finish(mut self) {
        self.half_close();
    }
}

impl<Req> StreamSender<Req> {
    /// Ends the caller's messages (once): the dispatcher sends the StreamEnd after the queued
    /// ones.
    fn half_close(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.out.out().finished.store(true, Ordering::Release);
        self.poke.poke();
    }
}

impl<Req> Drop for StreamSender<Req> {
    /// A half-close, as [`StreamSender::finish`] (nothing to do once the stream is over).
    fn drop(&mut self) {
        if !self.out.over() {
            self.half_close();
        }
    }
}

/// The server's messages of a stream on a [`Channel`] (server streaming, the receiving half of
/// a bidirectional one): `Send + 'static`. Dropping it before the stream's end cancels the call:
/// a Cancel goes to the server, and a send waiting on the [`StreamSender`] ends CANCELLED.
pub struct StreamReceiver<Resp> {
    state: Arc<StreamState<Resp>>,
    poke: Poke,
    done: bool,
    /// The stream's span and metrics (`ClientConfig::observe`), until its end.
    observed: Option<Box<StreamObs>>,
}

impl<Resp: Message + Default> StreamReceiver<Resp> {
    /// The next message: `Ok(Some(m))`, or `Ok(None)` at the stream's clean end (the server
    /// finished it with OK). Woken by the dispatcher (no polling). Taking a message from a full
    /// queue lets the dispatcher return stream grants to the server.
    ///
    /// # Errors
    /// The stream's final status when not OK: the server's error, DEADLINE_EXCEEDED at the
    /// stream's deadline, UNAVAILABLE when the session broke or the channel was dropped.
    /// After the end (either way) every call returns `Ok(None)`.
    ///
    /// # Cancel safety
    /// Cancel-safe: a message is taken from the queue only when the future completes with it,
    /// so when `message()` loses a `tokio::select!` race no message is lost (the next call
    /// returns it).
    pub async fn message(&mut self) -> Result<Option<Resp>, Status> {
        let r = std::future::poll_fn(|cx| self.poll_message(cx)).await;
        if self.observed.is_some() {
            StreamObs::received(&mut self.observed, &r);
        }
        r
    }

    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Resp>, Status>> {
        if self.done {
            return Poll::Ready(Ok(None));
        }
        if !self.poke.submitted(cx) {
            return Poll::Pending;
        }
        for _ in 0..2 {
            let was_full = self.state.inb.queue.is_full();
            if let Some(m) = self.state.inb.queue.pop() {
                if was_full {
                    self.poke.poke();
                }
                return Poll::Ready(Ok(Some(m)));
            }
            if self.state.inb.ended.load(Ordering::Acquire) {
                // Messages are queued before the end: the queue is empty for good.
                self.done = true;
                let end = self.state.inb.end.lock().unwrap_or_else(|e| e.into_inner()).take();
                return Poll::Ready(match end {
                    Some(Ok(_)) | None => Ok(None),
                    Some(Err(s)) => Err(self.poke.failed(s)),
                });
            }
            self.state.inb.waker.register(cx.waker());
        }
        // Nothing here: make sure the dispatcher drives the session meanwhile.
        self.poke.poke();
        Poll::Pending
    }

    /// Awaits the answer of a client stream (its end carries it).
    async fn answer(&mut self) -> Result<Resp, Status> {
        let state = self.state.clone();
        let poke = self.poke.clone();
        let r = std::future::poll_fn(|cx| {
            if !poke.submitted(cx) {
                return Poll::Pending;
            }
            for _ in 0..2 {
                if state.inb.ended.load(Ordering::Acquire) {
                    let end = state.inb.end.lock().unwrap_or_else(|e| e.into_inner()).take();
                    return Poll::Ready(match end {
                        Some(Ok(Some(a))) => Ok(a),
                        Some(Ok(None)) | None => {
                            Err(Status::internal("a client stream ended without an answer"))
                        }
                        Some(Err(s)) => Err(poke.failed(s)),
                    });
                }
                state.inb.waker.register(cx.waker());
            }
            poke.poke();
            Poll::Pending
        })
        .await;
        self.done = true;
        StreamObs::answered(self.observed.take(), &r);
        r
    }
}

impl<Resp> Drop for StreamReceiver<Resp> {
    /// Cancels the call (unless it is over): the end is CANCELLED here at once, which wakes a
    /// send waiting on the sender (the dispatcher then abandons the call: a Cancel goes out).
    fn drop(&mut self) {
        if !self.done && !self.state.inb.ended.load(Ordering::Acquire) {
            self.state.cancelled.store(true, Ordering::Release);
            self.state.end(Err(Status::cancelled("the stream's receiver was dropped before its end")));
            self.poke.poke();
        }
    }
}

/// A client-streaming call on a [`Channel`] ([`Channel::client_stream`]): `Send + 'static`.
/// Dropping it before [`ClientStreamCall::finish`] returns cancels the call (a Cancel goes to
/// the server: its request stream ends CANCELLED).
pub struct ClientStreamCall<Req, Resp> {
    // The receiver first: dropped first, it cancels the call before the sender's drop could
    // half-close it.
    rx: StreamReceiver<Resp>,
    tx: StreamSender<Req>,
}

impl<Req: Message, Resp: Message + Default> ClientStreamCall<Req, Resp> {
    /// Sends one message (as [`StreamSender::send`]: waits while the server's stream grants and the
    /// queue are used up).
    ///
    /// # Errors
    /// As [`StreamSender::send`]; [`ClientStreamCall::finish`] then gives the server's answer.
    ///
    /// # Cancel safety
    /// As [`StreamSender::send`]: not cancel-safe (a send that loses a `select!` race was not
    /// sent, and its message is lost); the call goes on.
    pub async fn send(&mut self, msg: &Req) -> Result<(), Status> {
        self.tx.send(msg).await
    }

    /// Ends the caller's messages cleanly and awaits the server's answer.
    ///
    /// # Errors
    /// The server's status; DEADLINE_EXCEEDED at the stream's deadline; UNAVAILABLE when the
    /// session broke.
    ///
    /// # Cancel safety
    /// Not cancel-safe: the future owns the call, so dropping it before it completes (another
    /// `select!` branch won) cancels the call and its answer is lost. To race the answer
    /// against something else, pin the future and poll it by `&mut` in each round.
    pub async fn finish(self) -> Result<Resp, Status> {
        let ClientStreamCall { mut rx, tx } = self;
        tx.finish();
        rx.answer().await
    }
}
