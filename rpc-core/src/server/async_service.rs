//! Async handlers: a generated async service's adapter decodes the request on the worker, defers
//! the answer ([`RequestContext::defer`]) and runs the handler's future on a tokio runtime; the
//! future's output is the answer, sent back through the [`Responder`] to the worker. The future
//! is dropped when the client cancels the call (its CANCEL reaches the worker, which raises the
//! responder's flag and wakes the task), when the session closes, or at the call's deadline.
//!
//! The synchronous, inline handlers stay the fastest path (no hop to another thread); an async
//! handler costs a task spawn and the deferred answer's trip through the worker's queue.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Instant;

use prost::Message;

use crate::dispatch::reply::{panic_text, CallInfo, Reply, RequestContext, Responder};
use crate::dispatch::stream::StreamSink;
use crate::status::Status;

/// Where async handlers run: a tokio runtime's handle.
///
/// [`AsyncRuntime::current_or_default`] takes the runtime the adapter is created in, or else a
/// multi-thread runtime this library builds once (threads `rpc-async`, as many as tokio's default
/// of one per core) and shares between all async services.
/// The runtime must have its time driver on (`enable_time`/`enable_all`) for calls with a
/// deadline.
#[derive(Clone, Debug)]
pub struct AsyncRuntime {
    handle: tokio::runtime::Handle,
}

impl AsyncRuntime {
    /// Runs handlers on `handle`'s runtime.
    pub fn from_handle(handle: tokio::runtime::Handle) -> AsyncRuntime {
        AsyncRuntime { handle }
    }

    /// The runtime of the calling thread when there is one, else the shared runtime this library
    /// builds on first use.
    ///
    /// # Panics
    /// When the shared runtime cannot be built (the OS refused its threads).
    pub fn current_or_default() -> AsyncRuntime {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            return AsyncRuntime { handle };
        }
        static SHARED: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
        let rt = SHARED.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .thread_name("rpc-async")
                .enable_all()
                .build()
                .expect("building the async handlers' runtime")
        });
        AsyncRuntime { handle: rt.handle().clone() }
    }

    /// The runtime's handle.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

/// What an async handler knows of its call: an owned copy of the [`RequestContext`]'s
/// [`CallInfo`] (method, peer, deadline; the handler's future is dropped at the deadline).
pub type AsyncContext = CallInfo;

/// Runs an async handler for the call of `ctx`: defers the answer, spawns `handler`'s future on
/// `runtime`, and answers with its output. The future is dropped, and the call answered
/// DEADLINE_EXCEEDED, when the call's deadline passes first; a panic in it answers INTERNAL.
/// Returns the deferred marker the adapter hands to the reply writer.
pub fn spawn_async<T, F, Fut>(runtime: &AsyncRuntime, ctx: &RequestContext, handler: F) -> Reply<T>
where
    T: Message + Send + 'static,
    F: FnOnce(AsyncContext) -> Fut,
    Fut: Future<Output = Result<T, Status>> + Send + 'static,
{
    let (responder, reply) = ctx.defer::<T>();
    let mut actx: AsyncContext = ctx.info.clone();
    // The handler (and what it hands its context to) sees the Cancel the responder sees.
    actx.cancel = Some(responder.flag());
    let deadline = actx.deadline;
    let method = actx.method;
    let fut = CatchPanic { inner: Box::pin(handler(actx)), method };
    runtime.handle.spawn(answer(responder, fut, deadline));
    reply
}

async fn answer<T: Message>(
    responder: Responder<T>,
    fut: impl Future<Output = Result<T, Status>>,
    deadline: Option<Instant>,
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
}

/// Runs an async streaming handler (server streaming, bidirectional) for the call of `ctx`,
/// whose `sink` and deferred `reply` came from [`RequestContext::stream`]: spawns `handler`'s
/// future on `runtime` with the sink; its output ends the stream (`Ok(())` cleanly, an error
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
    let (sink, ender) = sink.into_async();
    let mut actx: AsyncContext = ctx.info.clone();
    // The handler sees the stream end as its sink does.
    actx.cancel = Some(ender.flag());
    let fut = CatchPanic { inner: Box::pin(handler(actx, sink)), method };
    runtime.handle.spawn(async move {
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
    });
    reply
}

/// A handler's future whose panic becomes an INTERNAL answer.
struct CatchPanic<T> {
    inner: Pin<Box<dyn Future<Output = Result<T, Status>> + Send>>,
    method: &'static str,
}

impl<T> Future for CatchPanic<T> {
    type Output = Result<T, Status>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let method = self.method;
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
