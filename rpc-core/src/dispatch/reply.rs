//! What a handler sees and returns: [`RequestContext`], [`Reply`], [`ReplyWriter`], and the
//! [`Responder`] that answers a deferred call from any thread.

use std::cell::Cell;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use prost::Message;

use crate::buffers::bounded::{check_exact, encode_exact, LenMismatch};
use crate::buffers::{GatherBody, MirrorView};
use crate::session::{PlaceError, Placement, Session};
use crate::status::Status;

/// What a handler returns: a message, a status, or the marker of a deferred answer (from
/// [`RequestContext::defer`]).
pub struct Reply<T>(pub(crate) ReplyKind<T>);

pub(crate) enum ReplyKind<T> {
    Ready(Result<T, Status>),
    Deferred,
}

impl<T: Message> From<T> for Reply<T> {
    fn from(m: T) -> Reply<T> {
        Reply(ReplyKind::Ready(Ok(m)))
    }
}

impl<T> From<Status> for Reply<T> {
    fn from(s: Status) -> Reply<T> {
        Reply(ReplyKind::Ready(Err(s)))
    }
}

impl<T> From<Result<T, Status>> for Reply<T> {
    fn from(r: Result<T, Status>) -> Reply<T> {
        Reply(ReplyKind::Ready(r))
    }
}

/// A deferred answer travelling from a [`Responder`] to the worker that owns the session.
pub(crate) struct Deferred {
    pub(crate) conn: u32,
    pub(crate) slot: u16,
    pub(crate) generation: u32,
    pub(crate) method: u32,
    pub(crate) result: Result<GatherBody, Status>,
    /// An OK body that starts with response metadata ([`crate::ResponseMetadata`]; an error's
    /// travels in its status).
    pub(crate) metadata: bool,
}

/// The bounded queue of deferred answers into one worker.
pub(crate) struct DeferQueue {
    pub(crate) queue: ArrayQueue<Deferred>,
    /// Set when the worker stops: answers are dropped instead of queued.
    pub(crate) closed: AtomicBool,
    /// The worker thread, which empties the queue: it cannot wait for room in it (a handler that
    /// answers its own deferred call inline while the queue is full).
    pub(crate) worker: OnceLock<ThreadId>,
    /// Answers the worker thread gave while the queue was full (a lock and an allocation on that
    /// stall only); `overflowed` says when there are some.
    pub(crate) overflow: Mutex<Vec<Deferred>>,
    pub(crate) overflowed: AtomicBool,
}

impl DeferQueue {
    pub(crate) fn new(capacity: usize) -> Arc<DeferQueue> {
        Arc::new(DeferQueue {
            queue: ArrayQueue::new(capacity.max(1)),
            closed: AtomicBool::new(false),
            worker: OnceLock::new(),
            overflow: Mutex::new(Vec::new()),
            overflowed: AtomicBool::new(false),
        })
    }

    /// Takes the answers the worker thread put aside while the queue was full.
    pub(crate) fn take_overflow(&self) -> Vec<Deferred> {
        // A plain load first: the common case (nothing put aside) writes nothing.
        if !self.overflowed.load(Ordering::Acquire) || !self.overflowed.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.overflow.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// True when no answer waits (in the queue or put aside).
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty() && !self.overflowed.load(Ordering::Acquire)
    }

    fn push(&self, mut d: Deferred) {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            match self.queue.push(d) {
                Ok(()) => return,
                Err(back) => {
                    if self.worker.get() == Some(&std::thread::current().id()) {
                        // Waiting would wait for ourselves: put it aside for the worker's next look.
                        self.overflow.lock().unwrap_or_else(|e| e.into_inner()).push(back);
                        self.overflowed.store(true, Ordering::Release);
                        return;
                    }
                    d = back;
                    std::thread::yield_now();
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct CallTarget {
    pub(crate) conn: u32,
    pub(crate) slot: u16,
    pub(crate) generation: u32,
    pub(crate) method: u32,
}

/// Given to a handler with each request.
pub struct RequestContext {
    /// The method, the client and the deadline (read through `Deref`: `ctx.method()`...).
    pub(crate) info: CallInfo,
    pub(crate) queue: Arc<DeferQueue>,
    pub(crate) target: CallTarget,
    pub(crate) deferred: Cell<bool>,
    /// Set by [`RequestContext::defer`]: the flag the worker raises when the deferred call is
    /// cancelled, expires or loses its session (taken by the worker after the handler returns).
    pub(crate) cancel_flag: Cell<Option<Arc<CancelFlag>>>,
    /// Set by [`RequestContext::stream`]: the sink the worker drains (taken after the handler
    /// returns).
    pub(crate) stream: Cell<Option<Arc<super::stream::SinkShared>>>,
    /// Set by [`RequestContext::requests`]: the queue the worker fills with the client's stream
    /// messages (taken after the handler returns).
    pub(crate) source: Cell<Option<Arc<super::source::SourceShared>>>,
    /// The request opened a stream of client messages ([`crate::wire::STREAM_IN`]).
    pub(crate) stream_in: Cell<bool>,
    /// Most bytes of one stream SEND's body on this call's session (its eager body size): the
    /// size of a server stream's batches.
    pub(crate) batch_cap: Cell<usize>,
    /// `ServerConfig::max_call_duration`.
    pub(crate) limit: Option<std::time::Duration>,
    /// The handler's first [`RequestContext::is_cancelled`] (reset per call): `limit` counts
    /// from there.
    pub(crate) first_look: Cell<Option<Instant>>,
    /// The worker's look into what arrived while the handler runs (set once, at its creation).
    pub(crate) peek: Option<std::rc::Rc<dyn CancelPeek>>,
    /// The worker's executor of async handlers' tasks (set once, at its creation; `None`: no
    /// worker, async handlers are spawned on their tokio runtime).
    pub(crate) local: Option<std::rc::Rc<super::local::LocalTasks>>,
    /// Number of the QP the request came on (refilled per request).
    pub(crate) qp_num: u32,
    /// A Cancel of this call (or a Close of its session) was seen (reset per request).
    pub(crate) cancel_seen: Cell<bool>,
    /// The call's span and metrics when the server observes calls (`ServerConfig::observe`):
    /// an async handler takes it, else the worker ends it when the handler returns.
    pub(crate) observed: Cell<Option<crate::observe::Observed>>,
    /// In place of `observed` when only metrics are on: the call's start, made an `Observed`
    /// only when an async handler takes it ([`RequestContext::take_observed`]).
    pub(crate) started: Cell<Option<crate::observe::ServerStart>>,
    /// The response's headers and trailers the handler set ([`RequestContext::set_headers`]),
    /// taken by its answer (emptied per request).
    pub(crate) response: Cell<Option<Box<crate::metadata::ResponseMetadata>>>,
    /// The worker's pool of registered buffers (set once, at its creation; `None`: no worker).
    pub(crate) registered: Option<Arc<crate::buffers::RegisteredPool>>,
}

/// A worker's look, from a running inline handler, into the completions that arrived since it
/// was dispatched (implemented by the worker, which owns the CQ).
pub(crate) trait CancelPeek {
    /// True when a Cancel of the call (`qp_num`, `slot`, `generation`) or a Close of its session
    /// is among the messages received and not handled yet. Polls the CQ; takes nothing.
    fn cancel_arrived(&self, qp_num: u32, slot: u16, generation: u32) -> bool;
}

impl RequestContext {
    /// A worker's context, refilled for each request it dispatches.
    pub(crate) fn new(queue: Arc<DeferQueue>, batch_cap: usize, limit: Option<std::time::Duration>) -> Self {
        RequestContext {
            info: CallInfo {
                method: "",
                peer: SocketAddr::from(([0, 0, 0, 0], 0)),
                deadline: None,
                cancel: None,
                metadata: None,
            },
            queue,
            target: CallTarget { conn: 0, slot: 0, generation: 0, method: 0 },
            deferred: Cell::new(false),
            cancel_flag: Cell::new(None),
            stream: Cell::new(None),
            source: Cell::new(None),
            stream_in: Cell::new(false),
            batch_cap: Cell::new(batch_cap),
            limit,
            first_look: Cell::new(None),
            peek: None,
            local: None,
            qp_num: 0,
            cancel_seen: Cell::new(false),
            observed: Cell::new(None),
            started: Cell::new(None),
            response: Cell::new(None),
            registered: None,
        }
    }

    /// A registered buffer of `len` bytes from the worker's pool (in the protection domain of
    /// every session the worker serves) to fill and carry, frozen
    /// ([`crate::buffers::RegisteredBytesMut::freeze`]), in a `bytes` field of the answer or of
    /// a stream message: a body above the eager threshold sends its bytes by an RDMA WRITE
    /// straight from it, with no copy (see [`crate::buffers::registered`]). An async handler or
    /// a [`Responder`] on another thread may allocate here first and fill it there.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming the pool's bound (`ServerConfig::registered_buffer_bytes`)
    /// when it is reached, or when the context has no worker (a handler called directly, in a
    /// test); nothing is taken.
    pub fn alloc_registered(&self, len: usize) -> Result<crate::buffers::RegisteredBytesMut, Status> {
        match &self.registered {
            Some(p) => p.alloc(len),
            None => Err(Status::resource_exhausted("no worker, so no registered buffers")),
        }
    }

    /// The call's observation, taken (an async handler's task, a deferred answer): its
    /// `Observed`, or one made from its start.
    pub(crate) fn take_observed(&self) -> Option<crate::observe::Observed> {
        self.observed.take().or_else(|| self.started.take().map(crate::observe::ServerStart::observed))
    }
}

/// What a handler knows of its call: the method, the client, the deadline. A [`RequestContext`]
/// derefs to it; an async handler gets an owned copy (`AsyncContext`), which also sees the call
/// end ([`CallInfo::is_cancelled`]).
#[derive(Clone, Debug)]
pub struct CallInfo {
    pub(crate) method: &'static str,
    pub(crate) peer: SocketAddr,
    pub(crate) deadline: Option<Instant>,
    /// An async handler's: the flag its `Responder` reads (raised on Cancel, expiry,
    /// `max_call_duration`, session closed). `None` in a [`RequestContext`].
    pub(crate) cancel: Option<Arc<CancelFlag>>,
    /// The request's metadata (`None`: it sent none).
    pub(crate) metadata: Option<Arc<crate::metadata::Metadata>>,
}

impl CallInfo {
    /// An async handler's context ([`crate::AsyncContext`], and its clones): sets the response's
    /// headers (replacing any set before), as [`RequestContext::set_headers`] does for an inline
    /// handler (a [`RequestContext`] answers this call itself). Set before the handler's
    /// future returns; no effect on a context that is not an async handler's.
    pub fn set_headers(&self, headers: crate::metadata::Metadata) {
        if let Some(c) = &self.cancel {
            c.edit_response(|md| *md.headers_mut() = headers);
        }
    }

    /// An async handler's context: sets the response's trailers (replacing any set before), as
    /// [`CallInfo::set_headers`] the headers.
    pub fn set_trailers(&self, trailers: crate::metadata::Metadata) {
        if let Some(c) = &self.cancel {
            c.edit_response(|md| *md.trailers_mut() = trailers);
        }
    }

    /// Full name of the called method, `"/package.Service/Method"`.
    pub fn method(&self) -> &str {
        self.method
    }

    /// TCP address of the client (the address its handshake came from).
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The request metadata the client sent (empty when it sent none).
    pub fn metadata(&self) -> &crate::metadata::Metadata {
        static EMPTY: crate::metadata::Metadata = crate::metadata::Metadata::EMPTY;
        self.metadata.as_deref().unwrap_or(&EMPTY)
    }

    /// When the caller stops waiting (from the call's timeout), if it set one. An async
    /// handler's future is dropped then and the call answered DEADLINE_EXCEEDED.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// An async handler's context (`AsyncContext`, and its clones: work the handler hands to
    /// another thread may watch it): true once the call no longer wants an answer: the client
    /// cancelled it (future dropped, explicit cancel), its deadline passed, it ran past the
    /// server's `max_call_duration`, or the session closed; and, for a unary call, once it has
    /// been answered (its handler's future returned), so work the handler left running learns
    /// that the call is over, as a Go handler's context is done when its RPC returns. Reads the clock only for a call
    /// with a deadline. Through a [`RequestContext`], that context's
    /// [`RequestContext::is_cancelled`] answers instead.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.is_raised())
            || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// A server interceptor (tonic's `Interceptor` on the server side): see
/// [`crate::ServerConfig::interceptor`]. It runs inline on the worker thread, so it must not block.
#[derive(Clone)]
pub struct ServerInterceptor(Arc<InterceptFn>);

/// What a [`ServerInterceptor`] runs.
type InterceptFn = dyn Fn(&CallInfo) -> Result<(), Status> + Send + Sync;

impl ServerInterceptor {
    /// An interceptor running `f`.
    pub fn new(f: impl Fn(&CallInfo) -> Result<(), Status> + Send + Sync + 'static) -> Self {
        ServerInterceptor(Arc::new(f))
    }

    /// Runs it for the call of `info`.
    ///
    /// # Errors
    /// The interceptor's status.
    pub fn intercept(&self, info: &CallInfo) -> Result<(), Status> {
        (self.0)(info)
    }
}

impl std::fmt::Debug for ServerInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerInterceptor(..)")
    }
}

impl std::ops::Deref for RequestContext {
    type Target = CallInfo;

    fn deref(&self) -> &CallInfo {
        &self.info
    }
}

/// The text of a caught panic's payload (a `&str` or `String`; empty for anything else).
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

impl RequestContext {
    /// Sets the response's headers (replacing any set before): they travel with its answer, OK
    /// or error (an error's in its [`Status::metadata`] at the client, with its trailers), and
    /// a client reads them through `CallOptions::capture_metadata`. For a deferred answer, set
    /// them before [`RequestContext::defer`] or on the [`Responder`]. Nothing is sent for an
    /// empty map. The client refuses more than its `ClientConfig::max_metadata_bytes` (8 KiB by
    /// default) of headers and trailers together; an error's, with its message, must fit the
    /// eager body (4 KiB by default) or they are dropped, the message saying so.
    pub fn set_headers(&self, headers: crate::metadata::Metadata) {
        let mut md = self.response.take().unwrap_or_default();
        *md.headers_mut() = headers;
        self.response.set(Some(md));
    }

    /// Sets the response's trailers (replacing any set before), as
    /// [`RequestContext::set_headers`] the headers. An error's trailers also come from its
    /// [`Status::metadata_mut`] and its details.
    pub fn set_trailers(&self, trailers: crate::metadata::Metadata) {
        let mut md = self.response.take().unwrap_or_default();
        *md.trailers_mut() = trailers;
        self.response.set(Some(md));
    }

    /// True once the call no longer wants an answer, so a long handler may stop early: its
    /// deadline passed (the client gave up and sent a Cancel; the server answers
    /// DEADLINE_EXCEEDED itself), it ran past the server's `max_call_duration` (counted from the
    /// handler's first look here), the client cancelled it (a dropped call future, an explicit
    /// cancel) or closed its session, or, once the handler took a [`Responder`] or a stream
    /// ([`RequestContext::defer`], [`RequestContext::stream`]), what that one's
    /// `is_cancelled` sees. Once true, stays true for this call.
    ///
    /// Cost: reads the clock, and, until it answers true, polls the worker's CQ once (an inline
    /// handler runs on the worker thread, which handles the client's messages only after it
    /// returns, so this looks among those that arrived meanwhile for a Cancel of this call,
    /// without taking them: one empty CQ poll when nothing arrived). It sees a
    /// Cancel among the first 32 completions not handled yet (the worker's poll batch); past
    /// that, the deadline and `max_call_duration` still bound the call. Long work belongs on
    /// another thread (defer, or an async handler), which keeps the worker serving the other
    /// sessions meanwhile.
    pub fn is_cancelled(&self) -> bool {
        let now = Instant::now();
        if self.info.deadline.is_some_and(|d| now >= d) {
            return true;
        }
        if let Some(limit) = self.limit {
            let first = self.first_look.get().unwrap_or(now);
            self.first_look.set(Some(first));
            if now.saturating_duration_since(first) >= limit {
                return true;
            }
        }
        let flag = self.cancel_flag.take();
        let raised = flag.as_ref().is_some_and(|f| f.is_raised());
        self.cancel_flag.set(flag);
        if raised || self.cancel_seen.get() {
            return true;
        }
        // The worker handles the client's messages only after the handler returns: look at what
        // arrived meanwhile (a Cancel of this call, a Close of its session).
        let t = self.target;
        let seen = self.peek.as_ref().is_some_and(|p| p.cancel_arrived(self.qp_num, t.slot, t.generation));
        self.cancel_seen.set(seen);
        seen
    }

    /// Defers the answer: returns a [`Responder`] to answer later from any thread, and the marker
    /// the handler returns now. A second call gives a responder whose answer is ignored (the first
    /// answer wins).
    pub fn defer<T: Message>(&self) -> (Responder<T>, Reply<T>) {
        self.defer_with(Arc::new(CancelFlag::default()))
    }

    /// As [`RequestContext::defer`], with the flag the worker raises for the call.
    pub(crate) fn defer_with<T: Message>(&self, cancelled: Arc<CancelFlag>) -> (Responder<T>, Reply<T>) {
        let first = !self.deferred.replace(true);
        let target = first.then(|| (self.queue.clone(), self.target));
        if first {
            // Headers and trailers set so far go with the deferred answer.
            if let Some(md) = self.response.take() {
                cancelled.set_response(md);
            }
            self.cancel_flag.set(Some(cancelled.clone()));
        }
        (Responder { target, cancelled, _t: PhantomData }, Reply(ReplyKind::Deferred))
    }
}

impl RequestContext {
    /// Server streaming: returns the [`StreamSink`](super::stream::StreamSink) to send the
    /// stream's messages with, from any thread, and the marker the handler returns now. The
    /// stream ends when the sink is dropped (OK) or finished with a status; its deadline is the
    /// call's. Only for a call that opened a stream of server messages (a generated
    /// server-streaming method); a second call gives a sink whose messages go nowhere.
    pub fn stream<T: Message>(&self) -> (super::stream::StreamSink<T>, Reply<()>) {
        // Deferred like `defer`, but the worker answers the stream when it ends.
        let first = !self.deferred.replace(true);
        let cancelled = Arc::new(CancelFlag::default());
        if !first {
            cancelled.raise();
        }
        let shared = super::stream::SinkShared::new(
            cancelled.clone(),
            self.queue.worker.get().copied(),
            self.batch_cap.get(),
        );
        if first {
            // Headers and trailers set so far go with the stream's end.
            if let Some(md) = self.response.take() {
                cancelled.set_response(md);
            }
            self.cancel_flag.set(Some(cancelled));
            self.stream.set(Some(shared.clone()));
        }
        (super::stream::StreamSink::new(shared), Reply(ReplyKind::Deferred))
    }
}

impl RequestContext {
    /// Client streaming, bidirectional: returns the [`RequestStream`](super::source::RequestStream)
    /// of the client's messages, to read from any thread (or task). Answer the call as usual
    /// (a client-streaming method defers its answer with [`RequestContext::defer`]; a
    /// bidirectional one sends its messages through [`RequestContext::stream`]). Only for a call
    /// that opened a stream of client messages; a second call, or a call without that stream,
    /// gives a stream that is empty and ended.
    pub fn requests<T: Message + Default>(&self) -> super::source::RequestStream<T> {
        let shared = super::source::SourceShared::new(self.queue.worker.get().copied());
        let taken = self.source.take();
        if taken.is_some() || !self.stream_in.get() {
            shared.ended.store(true, Ordering::Release);
            self.source.set(taken);
        } else {
            self.source.set(Some(shared.clone()));
        }
        super::source::RequestStream::new(shared)
    }
}

/// The flag the worker raises when a deferred call no longer wants an answer; raising it wakes
/// the task awaiting [`Responder::cancelled`], if any.
#[derive(Default, Debug)]
pub(crate) struct CancelFlag {
    raised: AtomicBool,
    waker: atomic_waker::AtomicWaker,
    /// The response metadata an async handler or a [`Responder`]'s holder set, for the answer.
    response: std::sync::Mutex<Option<Box<crate::metadata::ResponseMetadata>>>,
    /// `response` holds headers (the worker's one load per stream message: a stream's headers
    /// go with its next message, [`CancelFlag::take_headers`]).
    headers_set: AtomicBool,
    /// The record of a deferred call or a stream (`ServerConfig::observe`), ended by its answer
    /// (or by the worker, when the call ends without one).
    observed: std::sync::Mutex<Option<crate::observe::Observed>>,
}

impl CancelFlag {
    /// Keeps the call's record until its answer.
    pub(crate) fn set_observed(&self, o: crate::observe::Observed) {
        *self.observed.lock().unwrap_or_else(|e| e.into_inner()) = Some(o);
    }

    /// Takes the call's record (to end it).
    pub(crate) fn take_observed(&self) -> Option<crate::observe::Observed> {
        self.observed.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Changes the response metadata the call's answer carries.
    pub(crate) fn edit_response(&self, f: impl FnOnce(&mut crate::metadata::ResponseMetadata)) {
        let mut g = self.response.lock().unwrap_or_else(|e| e.into_inner());
        let md = g.get_or_insert_with(Box::default);
        f(md);
        self.headers_set.store(!md.headers().is_empty(), Ordering::Release);
    }

    /// Sets the response metadata the call's answer carries.
    pub(crate) fn set_response(&self, md: Box<crate::metadata::ResponseMetadata>) {
        let mut g = self.response.lock().unwrap_or_else(|e| e.into_inner());
        self.headers_set.store(!md.headers().is_empty(), Ordering::Release);
        *g = Some(md);
    }

    /// Takes the response metadata set for the call's answer.
    pub(crate) fn take_response(&self) -> Option<Box<crate::metadata::ResponseMetadata>> {
        let mut g = self.response.lock().unwrap_or_else(|e| e.into_inner());
        self.headers_set.store(false, Ordering::Release);
        g.take()
    }

    /// Worker, sending a stream message: the stream's headers, taken (its trailers stay for its
    /// end), when some were set and their block is at most `room` bytes (else they wait for a
    /// message with room, or the end). One atomic load when none were set.
    #[inline]
    pub(crate) fn take_headers(&self, room: usize) -> Option<crate::metadata::Metadata> {
        if !self.headers_set.load(Ordering::Acquire) {
            return None;
        }
        self.take_headers_locked(room)
    }

    #[cold]
    fn take_headers_locked(&self, room: usize) -> Option<crate::metadata::Metadata> {
        let mut g = self.response.lock().unwrap_or_else(|e| e.into_inner());
        let md = g.as_mut()?;
        if md.headers().is_empty() || md.headers().encoded_len() > room {
            return None;
        }
        self.headers_set.store(false, Ordering::Release);
        Some(std::mem::take(md.headers_mut()))
    }

    /// Raises the flag and wakes the task that waits for it.
    pub(crate) fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub(crate) fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Registers the task to wake when the flag is raised.
    pub(crate) fn register(&self, waker: &std::task::Waker) {
        self.waker.register(waker);
    }
}

/// Answers a deferred call from any thread. Dropping it unsent answers CANCELLED.
pub struct Responder<T> {
    target: Option<(Arc<DeferQueue>, CallTarget)>,
    cancelled: Arc<CancelFlag>,
    _t: PhantomData<fn(T)>,
}

impl<T> Responder<T> {
    /// Sets the answer's headers (replacing any set before), as
    /// [`RequestContext::set_headers`] does for an answer given at once.
    pub fn set_headers(&self, headers: crate::metadata::Metadata) {
        self.cancelled.edit_response(|md| *md.headers_mut() = headers);
    }

    /// Sets the answer's trailers (replacing any set before), as
    /// [`RequestContext::set_trailers`].
    pub fn set_trailers(&self, trailers: crate::metadata::Metadata) {
        self.cancelled.edit_response(|md| *md.trailers_mut() = trailers);
    }

    /// True once the call no longer wants an answer: the client cancelled it (future dropped,
    /// its deadline passed), the server answered DEADLINE_EXCEEDED at the call's deadline, or
    /// the session closed. A [`Responder::send`] after that is dropped by the worker (counted in
    /// `Counters::late_answers`).
    pub fn is_cancelled(&self) -> bool {
        self.target.is_none() || self.cancelled.is_raised()
    }

    /// Resolves once [`Responder::is_cancelled`] is true: woken by the worker when it raises the
    /// flag (no polling), so a task can `select!` its work against it and stop early.
    ///
    /// # Cancel safety
    /// Cancel-safe: the future only looks at the flag; dropping it loses nothing, and a new one
    /// resolves at once once the call is cancelled.
    pub fn cancelled(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        std::future::poll_fn(move |cx| {
            if self.is_cancelled() {
                return std::task::Poll::Ready(());
            }
            self.cancelled.waker.register(cx.waker());
            if self.is_cancelled() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }
}

impl<T: Message> Responder<T> {
    /// Sends the answer (encoded here, in the calling thread, then queued to the worker). When the
    /// server has stopped or the client is gone, the answer is dropped. A message that encodes
    /// to more or fewer bytes than its `encoded_len` gave is answered INTERNAL instead.
    pub fn send(mut self, result: Result<T, Status>) {
        if let Some((q, t)) = self.target.take() {
            // Large `bytes` fields are referenced, not copied (the worker copies each piece
            // once into the send mirror).
            if let Some(o) = self.cancelled.take_observed() {
                o.finish_with(&result, Message::encoded_len);
            }
            // A message that does not encode to its `encoded_len` answers INTERNAL.
            let response = self.cancelled.take_response().filter(|md| !md.is_empty());
            let metadata = response.is_some() && result.is_ok();
            let result = match (result, response) {
                (Ok(m), None) => encode_gathered(&m),
                (Ok(m), Some(md)) => encode_gathered(&crate::metadata::WithResponseMetadata {
                    blocks: crate::metadata::ResponseMetadata::encode_blocks(Some(&md), None),
                    message: m,
                }),
                (Err(s), md) => Err(with_response(s, md)),
            };
            q.push(Deferred {
                conn: t.conn,
                slot: t.slot,
                generation: t.generation,
                method: t.method,
                result,
                metadata,
            });
        }
    }
}

impl<T> Drop for Responder<T> {
    fn drop(&mut self) {
        if let Some((q, t)) = self.target.take() {
            if let Some(o) = self.cancelled.take_observed() {
                o.finish(crate::Code::Cancelled, 0);
            }
            q.push(Deferred {
                conn: t.conn,
                slot: t.slot,
                generation: t.generation,
                method: t.method,
                result: Err(Status::cancelled("deferred call dropped without an answer")),
                metadata: false,
            });
        }
    }
}

/// `m` encoded onto the heap, its large `bytes` fields referenced; INTERNAL when it does not
/// encode to its `encoded_len`.
fn encode_gathered<M: Message>(m: &M) -> Result<GatherBody, Status> {
    let len = m.encoded_len();
    let body = GatherBody::encode(m, Vec::with_capacity(GatherBody::own_capacity_for(len)));
    check_exact::<M>(len, body.len()).map(|()| body).map_err(|e| e.status("answer"))
}

/// An error answer `s` with the response metadata its handler set (`md`): the headers and
/// trailers join the status's metadata, as gRPC's trailers-only response carries them.
pub(crate) fn with_response(mut s: Status, md: Option<Box<crate::metadata::ResponseMetadata>>) -> Status {
    if let Some(md) = md {
        for (k, v) in md.headers().iter().chain(md.trailers().iter()) {
            // Checked when they were inserted.
            let _ = match v {
                crate::MetadataValue::Ascii(a) => s.metadata_mut().insert(k, a),
                crate::MetadataValue::Binary(b) => s.metadata_mut().insert_bin(k, b),
            };
        }
    }
    s
}

/// Where an encoded body ended up.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Nothing written yet.
    Unset,
    /// `len` bytes after the header in the send buffer.
    Eager(u32),
    /// `len` bytes at `offset` of the send mirror (to RDMA WRITE to the same offset of the peer's ring).
    Ring { offset: u32, len: u32 },
    /// `len` bytes at `offset` of the staging area (its free span when the handler ran), to commit
    /// and send in pieces as the peer's ring grants space.
    Staged { offset: u32, len: u32 },
    /// An error status to send.
    Error(Status),
    /// The handler deferred its answer.
    Deferred,
    /// No send buffer was free, or the body goes in pieces (larger than a piece of the peer's
    /// ring, or no room for it now) and the staging area had no room: it waits on the heap.
    Spilled(Box<GatherBody>),
    /// A body above the eager threshold that fits the staging area but finds no room there now
    /// (or earlier answers wait): the message itself waits, unencoded, and is encoded straight
    /// into the staging area when its turn comes ([`LateBody`]), instead of onto the heap and
    /// then again into the send mirror for each piece.
    Later(Box<dyn LateBody>),
    /// A body above the eager threshold encoded as a gather list while registered buffers of
    /// the worker's pool are alive (it may carry some): it waits on the heap (its own bytes;
    /// its `bytes` fields referenced) and goes through the peer's ring as ring space allows,
    /// its registered bytes WRITTEN in place ([`crate::buffers::RegisteredPool`]).
    Gathered(Box<GatherBody>),
}

/// An answer's message kept unencoded until the staging area has room for it (type-erased:
/// the worker's outbox holds answers of every method).
pub(crate) trait LateBody: Send {
    /// `encoded_len()` of the message, in bytes, when it was answered.
    fn len(&self) -> usize;
    /// Encodes the message into `dst`, exactly [`LateBody::len`] bytes long (never panics).
    ///
    /// # Errors
    /// [`LenMismatch`] when it writes more or fewer bytes: `dst` must not be sent.
    fn encode_into(&self, dst: &mut [u8]) -> Result<(), LenMismatch>;
}

impl std::fmt::Debug for dyn LateBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LateBody({} bytes)", self.len())
    }
}

struct Unencoded<M> {
    msg: M,
    len: usize,
}

impl<M: Message> LateBody for Unencoded<M> {
    fn len(&self) -> usize {
        self.len
    }
    fn encode_into(&self, dst: &mut [u8]) -> Result<(), LenMismatch> {
        encode_exact(&self.msg, dst)
    }
}

/// The free span of the staging area a reply above the eager threshold may be encoded into.
pub(crate) struct StagingSpan<'a> {
    /// Its offset in the staging area.
    pub(crate) offset: u32,
    /// Its bytes.
    pub(crate) bytes: &'a mut [u8],
    /// Bodies up to this many bytes are eager (never staged).
    pub(crate) eager_threshold: u32,
    /// Spare body buffers of the session, for a body that fits neither (encoded onto the heap).
    pub(crate) spare: &'a crate::session::BodyRecycler,
    /// The whole staging area's length in bytes: a body up to this long waits unencoded
    /// ([`Outcome::Later`]) when `bytes` has no room for it.
    pub(crate) total: u32,
    /// The worker's pool of registered buffers: while some of them are alive (the handler may
    /// have just allocated one), a body above the eager threshold is encoded as a gather list
    /// ([`Outcome::Gathered`]).
    pub(crate) registered: Option<&'a crate::buffers::RegisteredPool>,
}

/// Encodes a body that waits for ring space into the staging span when it fits (one copy, no
/// allocation); keeps it unencoded when it would fit the staging area once earlier bodies left
/// (one copy later, a box of the message's size now); else onto the heap. A message that does
/// not encode to its `encoded_len` is an INTERNAL error, nothing staged.
fn stage<M: Message + 'static>(msg: M, len: usize, staging: &mut StagingSpan<'_>) -> Outcome {
    if len > staging.eager_threshold as usize {
        if let Some(dst) = staging.bytes.get_mut(..len) {
            // Not committed here: the worker commits a `Staged` outcome only.
            return match encode_exact(&msg, dst) {
                Ok(()) => Outcome::Staged { offset: staging.offset, len: len as u32 },
                Err(e) => Outcome::Error(e.status("answer")),
            };
        }
        if len <= staging.total as usize {
            return Outcome::Later(Box::new(Unencoded { msg, len }));
        }
    }
    onto_heap(msg, len, staging.spare, Outcome::Spilled)
}

/// Encodes `msg` onto the heap (its large `bytes` fields referenced), as `outcome` says.
fn onto_heap<M: Message>(
    msg: M,
    len: usize,
    spare: &crate::session::BodyRecycler,
    outcome: fn(Box<GatherBody>) -> Outcome,
) -> Outcome {
    match spare.take(GatherBody::own_capacity_for(len)) {
        Some(own) => {
            let body = GatherBody::encode(&msg, own);
            match check_exact::<M>(len, body.len()) {
                // Boxed: an `Outcome` is moved a few times per answer, and a gather body is 80 bytes.
                Ok(()) => outcome(Box::new(body)),
                Err(e) => Outcome::Error(e.status("answer")),
            }
        }
        None => Outcome::Error(Status::resource_exhausted(format!("no memory for an answer of {len} bytes"))),
    }
}

/// Encodes `msg` into the eager area, into the send mirror at a reserved ring offset, or into the
/// staging area. A message that writes more or fewer bytes than its `encoded_len` gave is
/// answered INTERNAL, nothing of it sent: the ring space reserved for it is taken back (a range
/// reserved and not sent would leave the peer waiting at that offset). Inlined into
/// [`ReplyWriter::encode_other`], the writer's path for a body that is not eager (an eager one
/// goes straight into the send buffer, [`ReplyWriter::reply`]).
#[inline(always)]
pub(crate) fn encode_body<M: Message + 'static>(
    msg: M,
    eager: &mut [u8],
    mirror: &mut MirrorView<'_>,
    staging: &mut StagingSpan<'_>,
    session: Option<&mut Session>,
) -> Outcome {
    let len = msg.encoded_len();
    if len > staging.eager_threshold as usize && staging.registered.is_some_and(|p| p.has_live()) {
        return onto_heap(msg, len, staging.spare, Outcome::Gathered);
    }
    let Some(session) = session else {
        // No send buffer was free, or earlier answers wait: this one waits behind them.
        return stage(msg, len, staging);
    };
    let placement = match session.place_body(len) {
        Ok(p) => p,
        Err(PlaceError::Refused(s)) => return Outcome::Error(s),
    };
    let (dst, outcome) = match placement {
        // Larger than a piece or no room now: the body waits and goes in pieces.
        Placement::Pieces => return stage(msg, len, staging),
        Placement::Eager => (eager.get_mut(..len), Outcome::Eager(len as u32)),
        Placement::Ring(off) => {
            if mirror.is_empty() {
                // No send mirror registered (the connection's first ring body, or its first
                // after they were given back): the range goes back, and the body waits
                // unencoded while the worker registers them (`Conn::encode_later`).
                session.unplace_body();
                return stage(msg, len, staging);
            }
            (mirror.range_mut(off, len as u32), Outcome::Ring { offset: off, len: len as u32 })
        }
    };
    let encoded = match dst {
        // `dst` is exactly `encoded_len()` bytes: encode without prost measuring the message again.
        Some(dst) => encode_exact(&msg, dst).map_err(|e| e.status("answer")),
        None => Err(Status::internal(format!("no buffer space for a body of {len} bytes"))),
    };
    match encoded {
        Ok(()) => outcome,
        Err(s) => {
            if matches!(outcome, Outcome::Ring { .. }) {
                // Placed just now, nothing since: the rewind cannot fail (a range left reserved
                // would only make the next ring body land past where the peer looks: its
                // session, not this call, would fail).
                session.unplace_body();
            }
            Outcome::Error(s)
        }
    }
}

/// A connection's send mirror and staging area as a [`ReplyWriter`] reaches them: only for a body
/// above the eager threshold, or one that must wait (no send buffer was free), so the writer of
/// an eager answer never builds their views. Type-erased: the worker's connections are generic
/// over the provider, the writer is not.
pub(crate) trait SendSpace {
    /// The send mirror's view (of none when none is registered), the free span of the staging
    /// area as `(offset, bytes)` (empty when `spare` is false or none is registered), and the
    /// whole staging area's length in bytes.
    fn views(&mut self, spare: bool) -> (MirrorView<'_>, u32, &mut [u8], u32);
}

/// Where a handler writes its answer: straight into the registered send buffer (or the send
/// mirror of the peer's ring for bodies above the eager threshold). No allocation.
pub struct ReplyWriter<'a> {
    /// The response metadata the handler set ([`RequestContext::set_headers`]).
    pub(crate) response: &'a Cell<Option<Box<crate::metadata::ResponseMetadata>>>,
    /// The answer's body starts with its response metadata ([`crate::wire::METADATA`]).
    pub(crate) metadata: bool,
    pub(crate) eager: &'a mut [u8],
    /// A body shorter than this many bytes is encoded straight into `eager`: one more than the
    /// least of the eager threshold, the session's `max_message` and `eager`'s length; 0 when
    /// `session` is `None` (every body then takes [`ReplyWriter::encode_other`]).
    pub(crate) eager_fit: usize,
    /// Bodies up to this many bytes are eager (never staged).
    pub(crate) eager_threshold: u32,
    /// The send mirror and staging area, looked at only for a body that is not eager.
    pub(crate) space: &'a mut dyn SendSpace,
    /// Nothing waits before this answer: it may take staging space.
    pub(crate) backlog_empty: bool,
    /// Spare body buffers of the session, for a body encoded onto the heap.
    pub(crate) spare: &'a crate::session::BodyRecycler,
    /// The worker's pool of registered buffers ([`StagingSpan::registered`]).
    pub(crate) registered: Option<&'a crate::buffers::RegisteredPool>,
    /// `None` when no send buffer was free: the answer is encoded into the heap and sent later.
    pub(crate) session: Option<&'a mut Session>,
    pub(crate) outcome: Outcome,
}

impl ReplyWriter<'_> {
    /// Answers with `r`: encodes a message, records a status, or notes that the call was deferred.
    /// Only the first answer counts. A message above the eager threshold that must wait for the
    /// peer's ring and finds the staging area full is kept and encoded when its turn comes.
    #[inline(always)]
    pub fn reply<T: Message + 'static>(&mut self, r: Reply<T>) {
        if !matches!(self.outcome, Outcome::Unset) {
            return;
        }
        let outcome = match r.0 {
            ReplyKind::Ready(Ok(m)) => match self.response.take() {
                None => self.encode(m),
                Some(md) => self.with_metadata(m, md),
            },
            ReplyKind::Ready(Err(s)) => Outcome::Error(with_response(s, self.response.take())),
            ReplyKind::Deferred => Outcome::Deferred,
        };
        // The value replaced is `Unset` (checked above), which owns nothing: forgotten, not
        // dropped (an assignment would call the out-of-line drop of `Outcome` on every answer).
        std::mem::forget(std::mem::replace(&mut self.outcome, outcome));
    }

    /// Answers with an error status. Only the first answer counts.
    pub fn error(&mut self, status: Status) {
        if matches!(self.outcome, Outcome::Unset) {
            self.outcome = Outcome::Error(with_response(status, self.response.take()));
        }
    }

    /// Encodes `m`: a body that fits the send buffer's eager area goes straight into it (what
    /// [`encode_body`] does for it, without building the views of the send mirror and the
    /// staging area); any other through [`ReplyWriter::encode_other`].
    #[inline(always)]
    fn encode<T: Message + 'static>(&mut self, m: T) -> Outcome {
        let len = m.encoded_len();
        if len < self.eager_fit {
            if let Some(dst) = self.eager.get_mut(..len) {
                // `dst` is exactly `encoded_len()` bytes: encode without prost measuring it again.
                return match encode_exact(&m, dst) {
                    Ok(()) => Outcome::Eager(len as u32),
                    Err(e) => Outcome::Error(e.status("answer")),
                };
            }
        }
        self.encode_other(m)
    }

    /// Encodes `m` where [`encode_body`] places it (a ring body, a body that waits, a refused
    /// one), with the views of the send mirror and the staging area.
    #[inline(never)]
    fn encode_other<T: Message + 'static>(&mut self, m: T) -> Outcome {
        let (mirror, offset, bytes, total) = self.space.views(self.backlog_empty);
        let mut mirror = mirror;
        let mut staging = StagingSpan {
            offset,
            bytes,
            eager_threshold: self.eager_threshold,
            spare: self.spare,
            total,
            registered: self.registered,
        };
        encode_body(m, self.eager, &mut mirror, &mut staging, self.session.as_deref_mut())
    }

    /// Encodes `m` with the response metadata `md` in front ([`crate::ResponseMetadata`]).
    #[cold]
    #[inline(never)]
    fn with_metadata<T: Message + 'static>(
        &mut self,
        m: T,
        md: Box<crate::metadata::ResponseMetadata>,
    ) -> Outcome {
        if md.is_empty() {
            return self.encode(m);
        }
        self.metadata = true;
        let blocks = crate::metadata::ResponseMetadata::encode_blocks(Some(&md), None);
        let m = crate::metadata::WithResponseMetadata { blocks, message: m };
        self.encode(m)
    }
}
