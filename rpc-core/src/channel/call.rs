//! One call between a task and a dispatcher: the request until the dispatcher encodes it, the
//! result until the task takes it, and the waker of the task that waits.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use atomic_waker::AtomicWaker;
use prost::Message;

use super::dispatcher::{with_any_core, AnyCore};
use crate::client::core::CallId;
use crate::dispatch::service::MethodId;
use crate::status::Status;

const PENDING: u8 = 0;
const DONE: u8 = 1;
const CANCELLED: u8 = 2;

/// A result one thread produces once and one task waits for: the producer stores it and wakes
/// exactly the task registered last; nothing wakes itself.
pub(crate) struct Completion<T> {
    state: AtomicU8,
    result: Mutex<Option<T>>,
    waker: AtomicWaker,
}

impl<T> Completion<T> {
    pub(crate) fn new() -> Completion<T> {
        Completion { state: AtomicU8::new(PENDING), result: Mutex::new(None), waker: AtomicWaker::new() }
    }

    /// Stores the result and wakes the waiting task. Ignored when the waiter gave up or a result
    /// is already there.
    pub(crate) fn complete(&self, value: T) {
        if self.state.load(Ordering::Acquire) != PENDING {
            return;
        }
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        if self.state.compare_exchange(PENDING, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.waker.wake();
        } else {
            // Cancelled in between: the value is dropped here, on the producer's thread.
            self.result.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }

    /// Stores the result without handing it over yet (see [`Completion::release`]): the
    /// producer publishes what it must first (a driver, its count of calls in flight).
    pub(crate) fn stage(&self, value: T) {
        if self.state.load(Ordering::Acquire) == PENDING {
            *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        }
    }

    /// Hands over the staged result; the waiting task's waker goes into `wakers`, to be woken
    /// once the producer has let go of the session. When the waiter gave up meanwhile, the result
    /// is dropped here.
    pub(crate) fn release(&self, wakers: &mut Vec<Waker>) {
        if self.state.compare_exchange(PENDING, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            if let Some(w) = self.waker.take() {
                wakers.push(w);
            }
        } else if self.state.load(Ordering::Acquire) == CANCELLED {
            self.result.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }

    /// Forgets the registered waker: the waiter polls for itself for a while (it drives the
    /// session), so a completion meanwhile must not wake it.
    pub(crate) fn unregister(&self) {
        drop(self.waker.take());
    }

    /// The result, if it is there (no waker registered).
    pub(crate) fn try_take(&self) -> Option<Option<T>> {
        (self.state.load(Ordering::Acquire) == DONE)
            .then(|| self.result.lock().unwrap_or_else(|e| e.into_inner()).take())
    }

    /// The result once there; otherwise registers `cx`'s waker and returns `Pending`.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.state.load(Ordering::Acquire) != DONE {
            self.waker.register(cx.waker());
            // The result may have arrived between the check and the registration.
            if self.state.load(Ordering::Acquire) != DONE {
                return Poll::Pending;
            }
        }
        Poll::Ready(self.result.lock().unwrap_or_else(|e| e.into_inner()).take())
    }

    /// True once a result is stored.
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// The waiter gives up: a later result is dropped. False when the result was already there.
    pub(crate) fn cancel(&self) -> bool {
        self.state.compare_exchange(PENDING, CANCELLED, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// True when the waiter gave up.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.state.load(Ordering::Acquire) == CANCELLED
    }
}

/// A call as its dispatcher sees it, whatever its message types.
pub(crate) trait Job: Send + Sync {
    /// Encodes the request straight into the session's registered memory and starts the call.
    fn start(&self, core: &mut AnyCore) -> Result<CallId, Status>;
    /// Takes the call's result when it is finished and stages it for its task: true then (the
    /// driver hands it over with [`Job::release`]). `expired` (its deadline passed) ends it with
    /// DEADLINE_EXCEEDED when no answer is there.
    fn try_finish(&self, core: &mut AnyCore, id: CallId, expired: bool) -> bool;
    /// Hands the staged result to the task, its waker pushed to `wakers`.
    fn release(&self, wakers: &mut Vec<Waker>);
    /// Ends the call with `status` (before it started, or when the dispatcher stops).
    fn fail(&self, status: Status);
    /// True when the caller dropped its future.
    fn is_cancelled(&self) -> bool;
    /// True when the call's future drives the session itself whenever it is polled (a unary
    /// call): the dispatcher thread need not drive for it unless its task waits (a registered
    /// waker, counted in `Inner::waiters`). False (the default, streams): the dispatcher
    /// thread drives while it is in flight.
    fn polled_by_caller(&self) -> bool {
        false
    }
}

/// A unary call: method, request (until the dispatcher encodes it) and the completion.
pub(crate) struct UnaryJob<Req, Resp> {
    pub(crate) method: MethodId,
    pub(crate) timeout: Option<std::time::Duration>,
    pub(crate) request: Mutex<Option<Req>>,
    pub(crate) done: Completion<Result<Resp, Status>>,
}

impl<Req, Resp> Job for UnaryJob<Req, Resp>
where
    Req: Message + Send + 'static,
    Resp: Message + Default + Send + 'static,
{
    fn start(&self, core: &mut AnyCore) -> Result<CallId, Status> {
        let Some(req) = self.request.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Err(Status::internal("call started twice"));
        };
        // Queued calls share one doorbell: the dispatcher flushes after taking a batch.
        let deadline = self.timeout.map(|t| std::time::Instant::now() + t);
        let mode = crate::client::core::StartMode::Batched;
        with_any_core!(core, c => c.start(self.method, &req, deadline, mode))?
            .ok_or_else(|| Status::internal("no free slot for a started call"))
    }

    fn try_finish(&self, core: &mut AnyCore, id: CallId, expired: bool) -> bool {
        let r = if expired {
            with_any_core!(core, c => c.poll_call::<Resp>(id))
        } else {
            with_any_core!(core, c => c.take_done::<Resp>(id))
        };
        match r {
            Some(r) => {
                self.done.stage(r);
                true
            }
            None => false,
        }
    }

    fn release(&self, wakers: &mut Vec<Waker>) {
        self.done.release(wakers);
    }

    fn fail(&self, status: Status) {
        self.done.complete(Err(status));
    }

    fn is_cancelled(&self) -> bool {
        self.done.is_cancelled()
    }

    fn polled_by_caller(&self) -> bool {
        true
    }
}
