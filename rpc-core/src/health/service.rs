//! The server side of `grpc.health.v1.Health`: `Check` answers inline on the worker from the
//! [`HealthReporter`]'s statuses; each `Watch` stream is a task on an [`AsyncRuntime`] that
//! sends the watched status, then each change, until the client cancels or the server drains.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;

use tokio::sync::watch;

use super::reporter::{HealthReporter, Phase, Statuses};
use super::v1::health_server::Health;
use super::v1::{HealthCheckRequest, HealthCheckResponse};
use super::ServingStatus;
use crate::dispatch::reply::{Reply, RequestContext};
use crate::dispatch::stream::{SinkEnd, StreamSink};
use crate::server::async_service::AsyncRuntime;
use crate::status::Status;

/// Longest service name quoted back in a NOT_FOUND message, in characters (a peer chose it).
const NAME_QUOTED: usize = 200;

/// Implements the generated `Health` trait over a reporter.
pub(crate) struct HealthService {
    reporter: HealthReporter,
    runtime: AsyncRuntime,
}

impl HealthService {
    /// Serves `reporter`'s statuses; `Watch` streams run on `runtime`.
    pub(crate) fn new(reporter: HealthReporter, runtime: AsyncRuntime) -> HealthService {
        HealthService { reporter, runtime }
    }
}

impl Health for HealthService {
    fn check(&self, _ctx: &RequestContext, request: HealthCheckRequest) -> Reply<HealthCheckResponse> {
        match self.reporter.status(&request.service) {
            Some(status) => HealthCheckResponse { status: status as i32 }.into(),
            None => {
                let name: String = request.service.chars().take(NAME_QUOTED).collect();
                Status::not_found(format!("unknown service {name:?}")).into()
            }
        }
    }

    fn watch(
        &self,
        _ctx: &RequestContext,
        request: HealthCheckRequest,
        sink: StreamSink<HealthCheckResponse>,
    ) {
        let rx = self.reporter.subscribe();
        // The stream ends when `WatchEnd` drops: after the last status at a drain, on a cancel
        // (harmless then), or with the task should its runtime shut down.
        let (sink, end) = sink.into_async();
        self.runtime.handle().spawn(watch_stream(rx, request.service, sink, WatchEnd(end)));
    }
}

/// Ends its stream OK when dropped.
struct WatchEnd(SinkEnd);

impl Drop for WatchEnd {
    fn drop(&mut self) {
        self.0.finish(Ok(()));
    }
}

/// One `Watch` stream: the status of `service` now, then each change of it, until the client
/// cancels (or its session or deadline ends the stream) or the server's drain closes it.
async fn watch_stream(
    mut rx: watch::Receiver<Statuses>,
    service: String,
    sink: StreamSink<HealthCheckResponse>,
    end: WatchEnd,
) {
    let mut sent: Option<ServingStatus> = None;
    loop {
        let (status, closed) = {
            let s = rx.borrow_and_update();
            (s.watched(&service), s.phase == Phase::Closed)
        };
        if sent != Some(status) {
            // Waits while the client's stream grants are used up; a change meanwhile is sent
            // next (only the latest status matters).
            if sink.send_async(&HealthCheckResponse { status: status as i32 }).await.is_err() {
                return;
            }
            sent = Some(status);
        }
        if closed {
            return;
        }
        let changed = {
            let mut changed = pin!(rx.changed());
            let mut cancelled = pin!(end.0.cancelled());
            std::future::poll_fn(|cx| {
                if cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                // An error: the reporter is gone with its server; the stream ends.
                changed.as_mut().poll(cx).map(|r| r.is_ok())
            })
            .await
        };
        if !changed {
            return;
        }
    }
}
