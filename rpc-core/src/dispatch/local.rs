//! The worker's local executor: async handlers' futures polled on the worker thread that
//! received their request, between two polls of its CQ (as thread-per-core runtimes do: no hop
//! to another thread, no second runtime competing for the cores).
//!
//! A handler's future is first polled inline, inside the dispatch of its request: a future that
//! completes then (an `async fn` with no `.await` that waits) answers as an inline handler does,
//! with no task, no deferred answer and no allocation of the executor's. A future that returns
//! `Pending` becomes a task in a slot of [`LocalTasks`]; its waker, which any thread may call,
//! puts the slot's index on the ready list, and the worker loop polls the ready tasks
//! ([`LocalTasks::run_ready`]) at its next iteration.
//!
//! Each slot owns one waker for its lifetime (an `Arc` allocated when the slot is first used, and
//! reused by every later task of the slot): a wake from a task that ended earlier in the slot
//! polls the slot's current task once for nothing, which a future allows.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use super::reply::panic_text;

/// A task: a future whose output was handed on (an answer sent, a stream ended) by the time it
/// completes.
pub(crate) type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

/// Indices of slots whose task was woken, pushed by wakers from any thread.
#[derive(Default)]
struct ReadyList {
    /// Set with a push, cleared by the worker when it takes the list: a plain load per worker
    /// iteration when nothing was woken.
    any: AtomicBool,
    list: Mutex<Vec<u32>>,
}

/// A slot's waker.
struct SlotWake {
    index: u32,
    /// The slot is on the ready list (cleared by the worker before it polls the slot's task, so
    /// a wake during the poll puts it back).
    queued: AtomicBool,
    ready: Arc<ReadyList>,
}

impl Wake for SlotWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready.list.lock().unwrap_or_else(|e| e.into_inner()).push(self.index);
            self.ready.any.store(true, Ordering::Release);
        }
    }
}

struct Slot {
    waker: Waker,
    wake: Arc<SlotWake>,
    task: Option<Task>,
}

struct Task {
    fut: LocalFuture,
    /// The tokio runtime whose context the task is polled in (its timers, its I/O, `spawn`).
    context: Option<tokio::runtime::Handle>,
}

/// A slot taken for a future's first poll ([`LocalTasks::reserve`]): filled with its task when
/// the poll returned `Pending` ([`LocalTasks::fill`]), else given back ([`LocalTasks::release`]).
pub(crate) struct Reserved {
    index: u32,
    waker: Waker,
}

impl Reserved {
    /// The waker the first poll registers: the slot's.
    pub(crate) fn waker(&self) -> &Waker {
        &self.waker
    }
}

/// One worker's tasks. Used on the worker thread only (`!Send`); its wakers are `Send`.
#[derive(Default)]
pub(crate) struct LocalTasks {
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<u32>>,
    ready: Arc<ReadyList>,
    /// The ready list taken by `run_ready`, kept for its allocation.
    scratch: RefCell<Vec<u32>>,
    /// Tasks in slots (not yet completed or dropped).
    live: Cell<usize>,
    /// Tasks ever filled (`Counters::async_tasks`).
    spawned: Cell<u64>,
}

impl LocalTasks {
    /// A slot for a future's first poll: a free one, or a new one (its waker allocated once).
    pub(crate) fn reserve(&self) -> Reserved {
        let mut slots = self.slots.borrow_mut();
        let index = match self.free.borrow_mut().pop() {
            Some(i) => i,
            None => {
                let index = slots.len() as u32;
                let wake =
                    Arc::new(SlotWake { index, queued: AtomicBool::new(false), ready: self.ready.clone() });
                slots.push(Slot { waker: Waker::from(wake.clone()), wake, task: None });
                index
            }
        };
        let slot = &slots[index as usize];
        // A wake left from the slot's earlier task may still be on the ready list: a second entry
        // for this one costs one poll for nothing.
        slot.wake.queued.store(false, Ordering::Release);
        Reserved { index, waker: slot.waker.clone() }
    }

    /// Gives back a slot whose future completed at its first poll.
    pub(crate) fn release(&self, r: Reserved) {
        self.free.borrow_mut().push(r.index);
    }

    /// Keeps `fut` (its first poll returned `Pending`) in the slot, to be polled when woken.
    pub(crate) fn fill(&self, r: Reserved, fut: LocalFuture, context: Option<tokio::runtime::Handle>) {
        self.slots.borrow_mut()[r.index as usize].task = Some(Task { fut, context });
        self.live.set(self.live.get() + 1);
        self.spawned.set(self.spawned.get() + 1);
    }

    /// Tasks ever filled: futures that waited at their first poll.
    pub(crate) fn spawned(&self) -> u64 {
        self.spawned.get()
    }

    /// Tasks not yet completed.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.live.get()
    }

    /// True when a task was woken since the last [`LocalTasks::run_ready`] (one atomic load).
    #[inline]
    pub(crate) fn has_ready(&self) -> bool {
        self.ready.any.load(Ordering::Acquire)
    }

    /// Polls every task woken since the last call, once each (a task woken while it runs is
    /// polled at the next call). Returns how many were polled. A task that panics outside its
    /// handler (whose panics answer INTERNAL) is dropped, which answers its call CANCELLED.
    pub(crate) fn run_ready(&self) -> usize {
        if !self.ready.any.swap(false, Ordering::AcqRel) {
            return 0;
        }
        let mut batch = std::mem::take(&mut *self.scratch.borrow_mut());
        std::mem::swap(&mut batch, &mut *self.ready.list.lock().unwrap_or_else(|e| e.into_inner()));
        let mut polled = 0;
        for &index in &batch {
            // Taken out while it runs: the slot table may be touched meanwhile (a task that
            // wakes itself, or another slot reserved by code it calls).
            let (task, waker) = {
                let mut slots = self.slots.borrow_mut();
                let Some(slot) = slots.get_mut(index as usize) else { continue };
                slot.wake.queued.store(false, Ordering::Release);
                match slot.task.take() {
                    Some(t) => (t, slot.waker.clone()),
                    None => continue,
                }
            };
            polled += 1;
            let Task { mut fut, context } = task;
            let done = {
                let _entered = context.as_ref().map(|h| h.enter());
                let mut cx = Context::from_waker(&waker);
                match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
                    Ok(Poll::Ready(())) => true,
                    Ok(Poll::Pending) => false,
                    Err(p) => {
                        tracing::error!(panic = %panic_text(&*p), "an async handler's task panicked; dropped");
                        true
                    }
                }
            };
            if done {
                self.live.set(self.live.get() - 1);
                self.free.borrow_mut().push(index);
                // Dropped after the slot table is let go: its drop may run the handler's code.
                drop(fut);
            } else {
                self.slots.borrow_mut()[index as usize].task = Some(Task { fut, context });
            }
        }
        batch.clear();
        *self.scratch.borrow_mut() = batch;
        polled
    }

    /// Drops every task (the worker is stopping): their answers go nowhere.
    pub(crate) fn clear(&self) {
        let tasks: Vec<Task> = self.slots.borrow_mut().iter_mut().filter_map(|s| s.task.take()).collect();
        self.live.set(0);
        drop(tasks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A future pending until its flag is set, counting its polls.
    struct Gate {
        open: Arc<AtomicBool>,
        waker: Arc<Mutex<Option<Waker>>>,
        polls: Arc<AtomicUsize>,
    }

    impl Future for Gate {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.open.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn a_task_runs_when_woken_from_another_thread_and_its_slot_is_reused() {
        let tasks = LocalTasks::default();
        let open = Arc::new(AtomicBool::new(false));
        let waker = Arc::new(Mutex::new(None));
        let polls = Arc::new(AtomicUsize::new(0));
        let mut fut: LocalFuture =
            Box::pin(Gate { open: open.clone(), waker: waker.clone(), polls: polls.clone() });
        let r = tasks.reserve();
        let first = r.index;
        assert!(fut.as_mut().poll(&mut Context::from_waker(r.waker())).is_pending());
        tasks.fill(r, fut, None);
        assert_eq!(tasks.live(), 1);
        // Not woken: not polled.
        assert!(!tasks.has_ready());
        assert_eq!(tasks.run_ready(), 0);
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        open.store(true, Ordering::Release);
        let w = waker.lock().unwrap().take().unwrap();
        std::thread::spawn(move || {
            // Twice: queued once.
            w.wake_by_ref();
            w.wake();
        })
        .join()
        .unwrap();
        assert!(tasks.has_ready());
        assert_eq!(tasks.run_ready(), 1);
        assert_eq!(polls.load(Ordering::Relaxed), 2);
        assert_eq!(tasks.live(), 0);
        // The slot is free again.
        let r = tasks.reserve();
        assert_eq!(r.index, first);
        tasks.release(r);
    }

    #[test]
    fn a_task_woken_while_it_runs_is_polled_again() {
        let tasks = LocalTasks::default();
        let polls = Arc::new(AtomicUsize::new(0));
        let p = polls.clone();
        // Yields twice, waking itself each time.
        let mut left = 2;
        let mut fut: LocalFuture = Box::pin(std::future::poll_fn(move |cx| {
            p.fetch_add(1, Ordering::Relaxed);
            if left == 0 {
                return Poll::Ready(());
            }
            left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }));
        let r = tasks.reserve();
        assert!(fut.as_mut().poll(&mut Context::from_waker(r.waker())).is_pending());
        tasks.fill(r, fut, None);
        assert_eq!(tasks.run_ready(), 1);
        assert_eq!(tasks.run_ready(), 1);
        assert_eq!(tasks.live(), 0);
        assert_eq!(polls.load(Ordering::Relaxed), 3);
        assert_eq!(tasks.run_ready(), 0);
    }

    #[test]
    fn a_panicking_task_is_dropped_and_its_slot_freed() {
        let tasks = LocalTasks::default();
        let mut first = true;
        let mut fut: LocalFuture = Box::pin(std::future::poll_fn(move |cx| {
            if std::mem::take(&mut first) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            panic!("boom");
        }));
        let r = tasks.reserve();
        assert!(fut.as_mut().poll(&mut Context::from_waker(r.waker())).is_pending());
        tasks.fill(r, fut, None);
        assert_eq!(tasks.run_ready(), 1);
        assert_eq!(tasks.live(), 0);
        assert_eq!(tasks.free.borrow().len(), 1);
    }
}
