//! Async handlers. A generated async service's adapter decodes the request on the worker and
//! hands the handler's future to [`spawn_async`] (or [`spawn_async_stream`]), which runs it where
//! the service's [`AsyncRuntime`] says:
//!
//! - **On the worker** (the default, [`AsyncRuntime::worker`]): the future is polled on the worker
//!   thread that received the request, first inline (a future that completes at once answers as
//!   an inline handler does: no task, no hop between threads), then, when it waits, as a task of
//!   the worker's local executor, polled between two polls of the CQ when woken. No second
//!   runtime competes for the cores. Its polls run in a tokio runtime's context (the one the
//!   service was made in, else a shared one this library builds on first use), so tokio's
//!   timers, I/O and `tokio::spawn` work inside it; but they run on the worker thread, so a
//!   handler that blocks the thread (blocking I/O, a lock held long, `std::thread::sleep`, heavy
//!   computation) stalls every session of that worker, as an inline handler would.
//! - **On a tokio runtime** (opt-in, [`AsyncRuntime::from_handle`],
//!   [`AsyncRuntime::current_or_default`]): the future is spawned on the runtime and its output
//!   travels back to the worker through a [`Responder`]: a hop between threads each way and a
//!   task spawn per call, and the runtime's threads compete with the busy-polling workers for the
//!   cores; in exchange, a handler may block a runtime thread without stalling the worker.
//!
//! Either way the future is dropped when the client cancels the call (its CANCEL reaches the
//! worker, which raises the call's flag and wakes the task), when the session closes, or at the
//! call's deadline; a panic in it answers INTERNAL.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use prost::Message;

use crate::dispatch::reply::{panic_text, CallInfo, CancelFlag, Reply, ReplyKind, RequestContext, Responder};
use crate::dispatch::stream::StreamSink;
use crate::status::Status;

/// Where async handlers run: on the worker that received the request (the default), or on a tokio
/// runtime (opt-in): see [`AsyncRuntime::worker`] and [`AsyncRuntime::from_handle`] for the trade-off.
#[derive(Clone, Debug)]
pub struct AsyncRuntime {
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    /// Polled on the worker, in this runtime's context (`None`: the shared runtime's, built when
    /// a handler is first polled).
    Worker(Option<tokio::runtime::Handle>),
    /// Spawned on this runtime.
    Tokio(tokio::runtime::Handle),
}

/// The runtime this library builds once, on first use, and shares: multi-thread, threads
/// `rpc-async`, as many as tokio's default of one per core, time and I/O drivers on.
///
/// # Panics
/// When the runtime cannot be built (the OS refused its threads).
pub(crate) fn shared_runtime() -> &'static tokio::runtime::Runtime {
    static SHARED: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    SHARED.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("rpc-async")
            .enable_all()
            .build()
            .expect("building the async handlers' runtime")
    })
}

impl Default for AsyncRuntime {
    /// [`AsyncRuntime::worker`].
    fn default() -> AsyncRuntime {
        AsyncRuntime::worker()
    }
}

impl AsyncRuntime {
    /// Handlers' futures are polled on the worker thread that received the request (the
    /// default): first inline (a future that completes answers as an inline handler does, no
    /// task, no hop between threads), then as a task of the worker's executor, polled between
    /// CQ polls when woken. No second runtime competes for the cores; but a handler that blocks
    /// the thread stalls every session of its worker (use [`AsyncRuntime::from_handle`] then). They see the tokio runtime of the calling thread, when there is one, as their
    /// context (timers, I/O, `tokio::spawn`); otherwise the shared runtime this library builds
    /// when a handler is first polled (threads `rpc-async`, one per core, idle unless used).
    /// The runtime must have its time driver on (`enable_time`/`enable_all`) for handlers that
    /// use tokio's timers.
    pub fn worker() -> AsyncRuntime {
        AsyncRuntime { kind: Kind::Worker(tokio::runtime::Handle::try_current().ok()) }
    }

    /// Opt-in: handlers' futures are spawned on `handle`'s runtime, and their answers go back to
    /// the worker (for handlers that block, or that must run on that runtime's threads): a task
    /// spawn and a hop between threads each way per call, and the runtime's threads compete with
    /// the busy-polling workers for the cores. The
    /// runtime must have its time driver on for calls with a deadline.
    pub fn from_handle(handle: tokio::runtime::Handle) -> AsyncRuntime {
        AsyncRuntime { kind: Kind::Tokio(handle) }
    }

    /// Opt-in, as [`AsyncRuntime::from_handle`]: on the runtime of the calling thread when there
    /// is one, else on the shared runtime this library builds on first use.
    ///
    /// # Panics
    /// When the shared runtime cannot be built (the OS refused its threads).
    pub fn current_or_default() -> AsyncRuntime {
        let handle =
            tokio::runtime::Handle::try_current().unwrap_or_else(|_| shared_runtime().handle().clone());
        AsyncRuntime { kind: Kind::Tokio(handle) }
    }

    /// True when handlers run on the worker ([`AsyncRuntime::worker`]).
    pub fn on_worker(&self) -> bool {
        matches!(self.kind, Kind::Worker(_))
    }

    /// The tokio runtime handlers run on (opt-in), or whose context they are polled in on the
    /// worker (the shared runtime, built now if needed, when the service was made outside one).
    ///
    /// # Panics
    /// When the shared runtime cannot be built (the OS refused its threads).
    pub fn handle(&self) -> tokio::runtime::Handle {
        match &self.kind {
            Kind::Worker(Some(h)) | Kind::Tokio(h) => h.clone(),
            Kind::Worker(None) => shared_runtime().handle().clone(),
        }
    }

    /// The handle whose context a future polled on the worker enters.
    fn context(&self) -> &tokio::runtime::Handle {
        match &self.kind {
            Kind::Worker(Some(h)) | Kind::Tokio(h) => h,
            Kind::Worker(None) => shared_runtime().handle(),
        }
    }
}

/// What an async handler knows of its call: an owned copy of the [`RequestContext`]'s
/// [`CallInfo`] (method, peer, deadline; the handler's future is dropped at the deadline).
pub type AsyncContext = CallInfo;

/// Runs an async handler for the call of `ctx` where `runtime` says, and answers with its
/// output. On the worker (the default), its future is first polled here, inline: one that
/// completes answers at once as an inline handler does; one that waits defers the answer and
/// becomes a task of the worker's executor. On a tokio runtime (opt-in), the answer is deferred
/// and the future spawned. The future is dropped, and the call answered DEADLINE_EXCEEDED, when
/// the call's deadline passes first; a panic in it answers INTERNAL. Returns the answer, or the
/// deferred marker, that the adapter hands to the reply writer.
pub fn spawn_async<T, F, Fut>(runtime: &AsyncRuntime, ctx: &RequestContext, handler: F) -> Reply<T>
where
    T: Message + Send + 'static,
    F: FnOnce(AsyncContext) -> Fut,
    Fut: Future<Output = Result<T, Status>> + Send + 'static,
{
    let method = ctx.info.method;
    let mut actx: AsyncContext = ctx.info.clone();
    // The handler (and what it hands its context to) sees the call end as the responder does.
    let flag = Arc::new(CancelFlag::default());
    actx.cancel = Some(flag.clone());
    let deadline = actx.deadline;
    // Observed (`ServerConfig::observe`): in flight from now until the task answers.
    let observed = ctx.take_observed().map(|mut o| {
        o.in_flight();
        Box::new(o)
    });
    let mut fut = CatchPanic { inner: Box::pin(handler(actx)), method, deadline, observed };
    match (&runtime.kind, ctx.local.as_ref()) {
        (Kind::Worker(_), Some(local)) => {
            let context = runtime.context();
            let slot = local.reserve();
            let first = {
                let _entered = context.enter();
                Pin::new(&mut fut).poll(&mut Context::from_waker(slot.waker()))
            };
            match first {
                Poll::Ready(r) => {
                    local.release(slot);
                    // Its headers and trailers go with the answer the writer gives now.
                    if let Some(md) = flag.take_response() {
                        ctx.response.set(Some(md));
                    }
                    // Answered: what the handler left running sees the call over.
                    flag.raise();
                    Reply(ReplyKind::Ready(r))
                }
                Poll::Pending => {
                    let (responder, reply) = ctx.defer_with::<T>(flag.clone());
                    // The worker raises the flag when the call ends without us (cancel, session
                    // closed, deadline: it answers then): the task wakes and drops the future.
                    flag.register(slot.waker());
                    local.fill(slot, Box::pin(answer(responder, fut, None, flag)), Some(context.clone()));
                    reply
                }
            }
        }
        // The tokio opt-in, or a context of no worker's.
        (kind, _) => {
            let handle = match kind {
                Kind::Tokio(h) => h,
                Kind::Worker(_) => runtime.context(),
            };
            let (responder, reply) = ctx.defer_with::<T>(flag.clone());
            handle.spawn(answer(responder, fut, deadline, flag));
            reply
        }
    }
}

/// Runs `fut` and answers the call with its output through `responder`; then raises `over` (the
/// handler's [`AsyncContext::is_cancelled`]), so work the handler left running sees the call
/// over.
async fn answer<T: Message>(
    responder: Responder<T>,
    fut: impl Future<Output = Result<T, Status>>,
    deadline: Option<Instant>,
    over: Arc<CancelFlag>,
) {
    let r = {
        // Dropped (with the handler's future) when the client cancels the call or its session
        // closes: the worker raises the responder's flag and wakes this task.
        let mut fut = std::pin::pin!(fut);
        let mut cancelled = std::pin::pin!(responder.cancelled());
        let run = std::future::poll_fn(|cx| {
            if cancelled.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            fut.as_mut().poll(cx).map(Some)
        });
        match deadline {
            None => run.await,
            Some(d) => match tokio::time::timeout_at(d.into(), run).await {
                Ok(r) => r,
                Err(_) => Some(Err(Status::deadline_exceeded(
                    "the call's deadline passed before its handler answered",
                ))),
            },
        }
    };
    match r {
        Some(r) => responder.send(r),
        // Nobody wants the answer any more.
        None => drop(responder),
    }
    over.raise();
}

/// Runs an async streaming handler (server streaming, bidirectional) for the call of `ctx`,
/// whose `sink` and deferred `reply` came from [`RequestContext::stream`]: runs `handler`'s
/// future with the sink where `runtime` says (as [`spawn_async`]: on the worker, first polled
/// inline; or spawned on a tokio runtime); its output ends the stream (`Ok(())` cleanly, an error
/// status otherwise) after the messages sent before. The future is dropped when the client
/// cancels, the session closes or the stream's deadline passes (the worker answers then); a panic
/// ends the stream INTERNAL. Returns `reply` for the reply writer.
pub fn spawn_async_stream<T, F, Fut>(
    runtime: &AsyncRuntime,
    ctx: &RequestContext,
    sink: StreamSink<T>,
    reply: Reply<()>,
    handler: F,
) -> Reply<()>
where
    T: Message + Send + 'static,
    F: FnOnce(AsyncContext, StreamSink<T>) -> Fut,
    Fut: Future<Output = Result<(), Status>> + Send + 'static,
{
    let method = ctx.method;
    let deadline = ctx.info.deadline;
    let (sink, ender) = sink.into_async();
    let mut actx: AsyncContext = ctx.info.clone();
    // The handler sees the stream end as its sink does.
    let flag = ender.flag();
    actx.cancel = Some(flag.clone());
    let fut = CatchPanic { inner: Box::pin(handler(actx, sink)), method, deadline, observed: None };
    let task = async move {
        let r = {
            let mut fut = std::pin::pin!(fut);
            let mut cancelled = std::pin::pin!(ender.cancelled());
            std::future::poll_fn(|cx| {
                if cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                fut.as_mut().poll(cx).map(Some)
            })
            .await
        };
        if let Some(r) = r {
            ender.finish(r);
        }
    };
    match (&runtime.kind, ctx.local.as_ref()) {
        (Kind::Worker(_), Some(local)) => {
            let context = runtime.context();
            let mut task = Box::pin(task);
            let slot = local.reserve();
            let first = {
                let _entered = context.enter();
                task.as_mut().poll(&mut Context::from_waker(slot.waker()))
            };
            if first.is_ready() {
                // Ended at once (its messages wait in the sink for the worker).
                local.release(slot);
            } else {
                flag.register(slot.waker());
                local.fill(slot, task, Some(context.clone()));
            }
        }
        (kind, _) => {
            let handle = match kind {
                Kind::Tokio(h) => h,
                Kind::Worker(_) => runtime.context(),
            };
            handle.spawn(task);
        }
    }
    reply
}

/// A handler's future whose panic becomes an INTERNAL answer, and whose polls mark the thread as
/// serving its call (the calls it makes inherit the call's deadline).
struct CatchPanic<T> {
    inner: Pin<Box<dyn Future<Output = Result<T, Status>> + Send>>,
    method: &'static str,
    deadline: Option<Instant>,
    /// The call's span and metrics (`ServerConfig::observe`): entered around every poll,
    /// ended with the answer.
    observed: Option<Box<crate::observe::Observed>>,
}

impl<T: Message> Future for CatchPanic<T> {
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.observed.is_some() {
            return self.poll_observed(cx);
        }
        self.poll_plain(cx)
    }
}

impl<T: Message> CatchPanic<T> {
    /// [`CatchPanic::poll_plain`] inside the call's span and trace context, ending its record
    /// with the answer.
    #[cold]
    fn poll_observed(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T, Status>> {
        let entered = self.observed.as_ref().map(|o| o.enter());
        let p = self.as_mut().poll_plain(cx);
        drop(entered);
        if let Poll::Ready(r) = &p {
            if let Some(o) = self.observed.take() {
                o.finish_with(r, |m| m.encoded_len());
            }
        }
        p
    }

    fn poll_plain(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T, Status>> {
        let method = self.method;
        let _serving = crate::context::serving(self.deadline);
        match catch_unwind(AssertUnwindSafe(|| self.inner.as_mut().poll(cx))) {
            Ok(p) => p,
            Err(panic) => {
                let mut what = panic_text(&*panic);
                if what.is_empty() {
                    what = "a non-string panic".into();
                }
                tracing::warn!(method, panic = %what, "async handler panicked");
                Poll::Ready(Err(Status::internal(format!("handler of {method} panicked: {what}"))))
            }
        }
    }
}
