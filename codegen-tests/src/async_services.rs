//! Implementations of the async server traits (`proto/codegen/asynchronous.proto`): each answer
//! says what the handler saw (method, deadline, thread), and a guard counts handler futures that
//! were dropped before they finished.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpc_core::codegen::{AsyncContext, Status};

use crate::codegen::asynchronous::{self, Answer, Ask};

/// Counts of handler futures.
#[derive(Debug, Default)]
pub struct Seen {
    /// Futures polled at least once (the handler's body began).
    pub started: AtomicUsize,
    /// Futures dropped before they finished (a deadline passed, the call was cancelled).
    pub dropped: AtomicUsize,
    /// Futures that finished.
    pub finished: AtomicUsize,
}

/// Implements `Lookup` and `AsyncContext`.
#[derive(Debug, Default, Clone)]
pub struct AsyncImpl {
    /// Shared with the test.
    pub seen: Arc<Seen>,
}

/// Counts a drop unless disarmed.
struct Guard<'a>(&'a Seen, bool);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let c = if self.1 { &self.0.finished } else { &self.0.dropped };
        c.fetch_add(1, Ordering::SeqCst);
    }
}

impl AsyncImpl {
    async fn answer(&self, ctx: AsyncContext, request: Ask) -> Result<Answer, Status> {
        self.seen.started.fetch_add(1, Ordering::SeqCst);
        let mut guard = Guard(&self.seen, false);
        if request.delay_ms > 0 {
            // Waits at its first poll whatever the clock: a sleep of a millisecond whose first
            // poll comes after its deadline (a thread preempted on a loaded machine) is ready at
            // once, which made `e2e_async` count one task fewer than it expects (33, not 34).
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(u64::from(request.delay_ms))).await;
        }
        if request.panic {
            panic!("async handler panics on purpose ({})", request.key);
        }
        guard.1 = true;
        Ok(Answer {
            value: format!("value of {}", request.key),
            method: ctx.method().to_owned(),
            had_deadline: ctx.deadline().is_some(),
            thread: std::thread::current().name().unwrap_or_default().to_owned(),
        })
    }
}

impl asynchronous::lookup_server::Lookup for AsyncImpl {
    async fn get(&self, ctx: AsyncContext, request: Ask) -> Result<Answer, Status> {
        self.answer(ctx, request).await
    }
    async fn slow(&self, ctx: AsyncContext, request: Ask) -> Result<Answer, Status> {
        self.answer(ctx, request).await
    }
}

impl asynchronous::async_context_server::AsyncContext for AsyncImpl {
    async fn call(&self, ctx: AsyncContext, request: Ask) -> Result<Answer, Status> {
        self.answer(ctx, request).await
    }
}

impl asynchronous::pipe_server::Pipe for AsyncImpl {
    async fn watch(
        &self,
        _ctx: AsyncContext,
        request: Ask,
        sink: rpc_core::codegen::StreamSink<Answer>,
    ) -> Result<(), Status> {
        for i in 0..request.delay_ms {
            let value = format!("{} {i}", request.key);
            sink.send_async(&Answer { value, ..Default::default() }).await?;
        }
        if request.panic {
            return Err(Status::aborted("watch ends with an error on purpose"));
        }
        Ok(())
    }

    async fn join(
        &self,
        _ctx: AsyncContext,
        mut requests: rpc_core::codegen::RequestStream<Ask>,
    ) -> Result<Answer, Status> {
        let mut keys = Vec::new();
        while let Some(m) = requests.message_async().await? {
            keys.push(m.key);
        }
        Ok(Answer { value: keys.join(","), ..Default::default() })
    }

    async fn shout(
        &self,
        _ctx: AsyncContext,
        mut requests: rpc_core::codegen::RequestStream<Ask>,
        sink: rpc_core::codegen::StreamSink<Answer>,
    ) -> Result<(), Status> {
        self.seen.started.fetch_add(1, Ordering::SeqCst);
        let mut guard = Guard(&self.seen, false);
        while let Some(m) = requests.message_async().await? {
            sink.send_async(&Answer { value: m.key.to_uppercase(), ..Default::default() }).await?;
        }
        guard.1 = true;
        Ok(())
    }
}
