//! One call between a task and a dispatcher: the request until the dispatcher encodes it, the
//! result until the task takes it, and the waker of the task that waits.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

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
///
/// The result and the waker share one lock, so handing a result over (store it, mark it done,
/// take the waker) is one lock and unlock, as is taking it; `state` mirrors the outcome for
/// lock-free looks (written under the lock only).
pub(crate) struct Completion<T> {
    state: AtomicU8,
    slot: Mutex<Slot<T>>,
}

/// What a [`Completion`]'s lock guards.
struct Slot<T> {
    result: Option<T>,
    waker: Option<Waker>,
}

impl<T> Completion<T> {
    pub(crate) fn new() -> Completion<T> {
        Completion { state: AtomicU8::new(PENDING), slot: Mutex::new(Slot { result: None, waker: None }) }
    }

    /// Back to its state when new (its owner is the only one left: no atomic operation).
    pub(crate) fn reset(&mut self) {
        *self.state.get_mut() = PENDING;
        let slot = self.slot.get_mut().unwrap_or_else(|e| e.into_inner());
        slot.result = None;
        slot.waker = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<T>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores the result and wakes the waiting task. Ignored when the waiter gave up or a result
    /// is already there (the value is dropped here, on the producer's thread).
    pub(crate) fn complete(&self, value: T) {
        let mut wakers = Vec::new();
        self.finish(value, &mut wakers);
        for w in wakers {
            w.wake();
        }
    }

    /// Stores the result and marks it done; the waiting task's waker goes into `wakers`, to be
    /// woken once the producer has let go of the session. Ignored (the value dropped here) when
    /// the waiter gave up or a result is already there.
    pub(crate) fn finish(&self, value: T, wakers: &mut Vec<Waker>) {
        if self.state.load(Ordering::Acquire) != PENDING {
            return;
        }
        let mut slot = self.lock();
        if self.state.load(Ordering::Relaxed) != PENDING {
            drop(slot);
            return;
        }
        slot.result = Some(value);
        self.state.store(DONE, Ordering::Release);
        if let Some(w) = slot.waker.take() {
            wakers.push(w);
        }
    }

    /// Forgets the registered waker: the waiter polls for itself for a while (it drives the
    /// session), so a completion meanwhile must not wake it.
    pub(crate) fn unregister(&self) {
        let w = self.lock().waker.take();
        drop(w);
    }

    /// The result, if it is there (no waker registered).
    pub(crate) fn try_take(&self) -> Option<Option<T>> {
        (self.state.load(Ordering::Acquire) == DONE).then(|| self.lock().result.take())
    }

    /// The result once there; otherwise registers `cx`'s waker and returns `Pending`.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = self.lock();
        if self.state.load(Ordering::Acquire) == DONE {
            return Poll::Ready(slot.result.take());
        }
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => {
                let old = slot.waker.replace(cx.waker().clone());
                drop(slot);
                drop(old);
            }
        }
        Poll::Pending
    }

    /// True once a result is stored.
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// The waiter gives up: a later result is dropped. False when the result was already there
    /// (or the waiter gave up before).
    pub(crate) fn cancel(&self) -> bool {
        if self.state.load(Ordering::Acquire) != PENDING {
            return false;
        }
        let slot = self.lock();
        let pending = self.state.load(Ordering::Relaxed) == PENDING;
        if pending {
            self.state.store(CANCELLED, Ordering::Release);
        }
        drop(slot);
        pending
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
    /// A stream: takes what the session has for it (messages, its end) and moves its queued
    /// messages out; true when it is finished, its end staged for its task (the driver hands it
    /// over with [`Job::release`]). `expired` (its deadline passed) ends it with
    /// DEADLINE_EXCEEDED. Unary calls are finished with [`Job::finish`] instead.
    fn try_finish(&self, _core: &mut AnyCore, _id: CallId, _expired: bool) -> bool {
        false
    }
    /// Hands a stream's staged end to its tasks, their wakers pushed to `wakers`.
    fn release(&self, _wakers: &mut Vec<Waker>) {}
    /// A unary call whose answer is there, or whose deadline passed (`expired`: then
    /// DEADLINE_EXCEEDED unless the answer came): takes its result from the session and hands
    /// it to the task, its waker pushed to `wakers`. Called once the driver has published the
    /// calls still in flight.
    fn finish(&self, _core: &mut AnyCore, _id: CallId, _expired: bool, _wakers: &mut Vec<Waker>) {}
    /// Ends the call with `status` (before it started, or when the dispatcher stops).
    fn fail(&self, status: Status);
    /// True when the caller dropped its future.
    fn is_cancelled(&self) -> bool;
    /// True when the call's future drives the session itself whenever it is polled (a unary
    /// call): the dispatcher thread need not drive for it unless its task waits (a registered
    /// waker, counted in `Inner::waiters`), and it is finished with [`Job::finish`]. False
    /// (the default, streams): the dispatcher thread drives while it is in flight, and finishes
    /// it with [`Job::try_finish`].
    fn polled_by_caller(&self) -> bool {
        false
    }
}

/// A unary call: its request (until the dispatcher encodes it; `None` for a call its caller
/// started at once) and its completion. Reused by the next call of the same types made on the
/// thread that dropped it (see [`UnaryJob::new_or_spare`], [`UnaryJob::recycle`]).
pub(crate) struct UnaryJob<Req, Resp> {
    pub(crate) request: Mutex<Option<Queued<Req>>>,
    pub(crate) done: Completion<Result<Resp, Status>>,
}

/// A queued call's request, until a driver encodes it.
pub(crate) struct Queued<Req> {
    pub(crate) method: MethodId,
    /// When the caller stops waiting: fixed when the call was made (its time in the queue
    /// counts, and an inherited or `deadline_at` deadline stays where it was).
    pub(crate) deadline: Option<std::time::Instant>,
    pub(crate) req: Req,
    /// Request metadata, encoded in front of the message.
    pub(crate) metadata: Option<Arc<crate::metadata::Metadata>>,
    /// Where the response's metadata goes (`CallOptions::capture_metadata`).
    pub(crate) capture: Option<crate::metadata::CapturedMetadata>,
}

/// Finished unary calls' states kept per thread for reuse, at most this many.
const SPARE_CALLS: usize = 64;

thread_local! {
    /// States of finished unary calls dropped on this thread, each no longer referenced by
    /// anyone else (so no stale waker, driver or task can touch one after its reuse), reset.
    static SPARE: RefCell<Vec<Arc<dyn Any + Send + Sync>>> = const { RefCell::new(Vec::new()) };
}

impl<Req, Resp> UnaryJob<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    /// A fresh call state: the last one this thread gave back when its types match (no
    /// allocation, no atomic operation), else a new one.
    pub(crate) fn new_or_spare() -> Arc<UnaryJob<Req, Resp>> {
        // (Not during the thread's teardown, when its locals may be gone.)
        let spare = SPARE
            .try_with(|s| {
                let mut s = s.try_borrow_mut().ok()?;
                // Another type's: left for its own next call.
                s.pop()?.downcast::<UnaryJob<Req, Resp>>().map_err(|other| s.push(other)).ok()
            })
            .ok()
            .flatten();
        spare.unwrap_or_else(|| Arc::new(UnaryJob { request: Mutex::new(None), done: Completion::new() }))
    }

    /// Keeps `job` for the next call of these types made on this thread, if nobody else holds it
    /// (a driver still does while it hands the call over; then it is just dropped).
    pub(crate) fn recycle(mut job: Arc<UnaryJob<Req, Resp>>) {
        let Some(j) = Arc::get_mut(&mut job) else { return };
        j.done.reset();
        *j.request.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        let job: Arc<dyn Any + Send + Sync> = job;
        let _ = SPARE.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                if s.len() < SPARE_CALLS {
                    s.push(job);
                }
            }
        });
    }
}

impl<Req, Resp> Job for UnaryJob<Req, Resp>
where
    Req: Message + Send + 'static,
    Resp: Message + Default + Send + 'static,
{
    fn start(&self, core: &mut AnyCore) -> Result<CallId, Status> {
        let Some(q) = self.request.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Err(Status::internal("call started twice"));
        };
        // Queued calls share one doorbell: the dispatcher flushes after taking a batch.
        let deadline = q.deadline;
        let mode = crate::client::core::StartMode::Batched;
        let req = crate::metadata::WithMetadata::new(&q.req, q.metadata.as_deref());
        with_any_core!(core, c => c.start_with(q.method, &req, deadline, mode, req.flags(), q.capture.as_ref()))?
            .ok_or_else(|| Status::internal("no free slot for a started call"))
    }

    fn finish(&self, core: &mut AnyCore, id: CallId, expired: bool, wakers: &mut Vec<Waker>) {
        let r = if expired {
            with_any_core!(core, c => c.poll_call::<Resp>(id))
        } else {
            with_any_core!(core, c => c.take_done::<Resp>(id))
        };
        let r = r.unwrap_or_else(|| Err(Status::internal("a finished call's answer was not there")));
        self.done.finish(r, wakers);
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
