//! A dispatcher: one thread that owns one client session (its QP, CQ, SRQ and rings), takes calls
//! from a bounded lock-free queue, and completes them by waking the tasks that wait.
//!
//! Loop: take queued calls while the session has slots (each request is encoded straight into
//! the session's registered memory) → one doorbell for the batch → poll the CQ → hand finished
//! calls to their tasks → drop cancelled ones. With nothing to do it spins (`spins` empty
//! loops), then, with calls in flight, waits per the polling policy (`Event`: arms the CQ and
//! blocks on its completion channel, at most 1 ms at a time), and with none, parks until a caller
//! queues a call.

use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Waker;
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use super::call::{Completion, Job};
use crate::client::core::{CallId, ClientCore};
use crate::client::ClientConfig;
use crate::config::{PollingPolicy, EVENT_WAIT};
use crate::status::Status;
use crate::transport::Transport;

/// The session of a dispatcher, on either provider.
pub(crate) enum AnyCore {
    Sim(Box<ClientCore<crate::verbs::sim::Sim>>),
    #[cfg(feature = "ibverbs")]
    Rdma(Box<ClientCore<crate::verbs::ibverbs::Ibverbs>>),
}

/// Runs `$body` with `$c` bound to the concrete `ClientCore` of an [`AnyCore`].
macro_rules! with_any_core {
    ($core:expr, $c:ident => $body:expr) => {
        match $core {
            $crate::channel::dispatcher::AnyCore::Sim($c) => $body,
            #[cfg(feature = "ibverbs")]
            $crate::channel::dispatcher::AnyCore::Rdma($c) => $body,
        }
    };
}
pub(crate) use with_any_core;

impl AnyCore {
    fn connect(addr: impl ToSocketAddrs, cfg: &ClientConfig) -> Result<AnyCore, Status> {
        Ok(match &cfg.transport {
            Transport::Sim => AnyCore::Sim(Box::new(ClientCore::connect(
                addr,
                cfg,
                &crate::verbs::DeviceSelector::First,
                1,
                -1,
            )?)),
            #[cfg(feature = "ibverbs")]
            Transport::Rdma { device, port, gid_index } => {
                let sel: crate::verbs::DeviceSelector = device.parse().unwrap_or_default();
                AnyCore::Rdma(Box::new(ClientCore::connect(addr, cfg, &sel, *port, *gid_index)?))
            }
            #[cfg(not(feature = "ibverbs"))]
            Transport::Rdma { .. } => return Err(Transport::rdma_unavailable()),
        })
    }
}

/// What callers and the dispatcher thread share.
pub(crate) struct Inner {
    /// Calls waiting for the dispatcher (bounded: a full queue makes callers wait).
    pub(crate) queue: ArrayQueue<Arc<dyn Job>>,
    /// Set when the last handle is gone: the dispatcher ends its calls and closes the session.
    pub(crate) stop: AtomicBool,
    /// The dispatcher is parked (no calls in flight): a caller that queues one unparks it.
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
    /// Bumped by every dropped future, so the dispatcher looks for cancelled calls only then.
    pub(crate) cancels: AtomicU64,
    /// Calls started on the session and not yet finished or dropped.
    pub(crate) in_flight: AtomicUsize,
    /// Tasks waiting for room in a full queue, woken when the dispatcher takes calls.
    space: Mutex<Vec<Waker>>,
    space_wanted: AtomicBool,
}

impl Inner {
    /// Queues a call and wakes the dispatcher if it sleeps. Gives the call back when the queue
    /// is full.
    pub(crate) fn submit(&self, job: Arc<dyn Job>) -> Result<(), Arc<dyn Job>> {
        self.queue.push(job)?;
        self.wake();
        Ok(())
    }

    /// Unparks the dispatcher when it sleeps.
    pub(crate) fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Registers `waker` to be woken when the dispatcher takes calls out of the queue.
    pub(crate) fn wait_for_space(&self, waker: &Waker) {
        let mut w = self.space.lock().unwrap_or_else(|e| e.into_inner());
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        self.space_wanted.store(true, Ordering::SeqCst);
    }

    fn wake_space_waiters(&self) {
        if self.space_wanted.load(Ordering::SeqCst) {
            self.space_wanted.store(false, Ordering::SeqCst);
            let waiters = std::mem::take(&mut *self.space.lock().unwrap_or_else(|e| e.into_inner()));
            for w in waiters {
                w.wake();
            }
        }
    }
}

/// How a dispatcher thread is set up.
pub(crate) struct Setup<A> {
    pub(crate) addr: A,
    pub(crate) client: ClientConfig,
    pub(crate) queue_depth: usize,
    pub(crate) core_id: Option<usize>,
    pub(crate) name: String,
    pub(crate) spins: u32,
}

/// Starts a dispatcher thread, which connects its session; `connected` gets the outcome.
///
/// # Errors
/// UNAVAILABLE when the thread cannot be spawned.
pub(crate) fn spawn<A: ToSocketAddrs + Send + 'static>(
    setup: Setup<A>,
    connected: Arc<Completion<Result<(), Status>>>,
) -> Result<Arc<Inner>, Status> {
    let inner = Arc::new(Inner {
        queue: ArrayQueue::new(setup.queue_depth),
        stop: AtomicBool::new(false),
        sleeping: AtomicBool::new(false),
        thread: OnceLock::new(),
        cancels: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        space: Mutex::new(Vec::new()),
        space_wanted: AtomicBool::new(false),
    });
    let shared = inner.clone();
    let handle = std::thread::Builder::new()
        .name(setup.name.clone())
        .spawn(move || {
            if let Some(id) = setup.core_id {
                if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                    tracing::warn!(core = id, "dispatcher: could not pin to the core");
                }
            }
            let core = match AnyCore::connect(&setup.addr, &setup.client) {
                Ok(c) => c,
                Err(s) => {
                    connected.complete(Err(s));
                    return;
                }
            };
            connected.complete(Ok(()));
            drop(connected);
            Dispatcher {
                core,
                inner: shared,
                in_flight: Vec::new(),
                spins: setup.spins,
                policy: setup.client.polling,
            }
            .run();
        })
        .map_err(|e| Status::unavailable(format!("spawning a dispatcher thread: {e}")))?;
    let _ = inner.thread.set(handle.thread().clone());
    // Detached: it ends by itself once every handle is dropped (joining could block a caller's
    // executor thread).
    drop(handle);
    Ok(inner)
}

struct Dispatcher {
    core: AnyCore,
    inner: Arc<Inner>,
    in_flight: Vec<(CallId, Arc<dyn Job>)>,
    spins: u32,
    policy: PollingPolicy,
}

/// Longest park with nothing in flight (so a lost unpark costs at most this).
const PARK: Duration = Duration::from_millis(50);

impl Dispatcher {
    fn run(mut self) {
        let mut empty: u32 = 0;
        let mut cancels_seen = 0;
        loop {
            if self.inner.stop.load(Ordering::Acquire) {
                break;
            }
            let mut work = self.take_calls();
            let completions = with_any_core!(&mut self.core, c => c.dispatch_step());
            work += completions;
            let cancels = self.inner.cancels.load(Ordering::Acquire);
            // Deadlines are looked at every 64 empty loops while spinning, every loop after.
            let look = !self.in_flight.is_empty() && (empty >= self.spins || empty % 64 == 63);
            if work > 0 || cancels != cancels_seen || look {
                cancels_seen = cancels;
                work += self.finish_calls();
            }
            if work > 0 {
                empty = 0;
                continue;
            }
            empty = empty.saturating_add(1);
            if empty < self.spins {
                std::hint::spin_loop();
                continue;
            }
            if self.in_flight.is_empty() {
                self.park();
                continue;
            }
            match self.policy {
                PollingPolicy::Busy => std::hint::spin_loop(),
                PollingPolicy::SpinThenYield { .. } => std::thread::yield_now(),
                _ => {
                    if with_any_core!(&mut self.core, c => c.wait_cq(EVENT_WAIT)) > 0 {
                        self.finish_calls();
                    }
                }
            }
        }
        self.shut_down();
    }

    /// Starts queued calls while the session has slots; one doorbell for all of them.
    fn take_calls(&mut self) -> usize {
        let mut n = 0;
        while with_any_core!(&self.core, c => c.has_free_slot()) {
            let Some(job) = self.inner.queue.pop() else { break };
            n += 1;
            if job.is_cancelled() {
                continue;
            }
            match job.start(&mut self.core) {
                Ok(id) => self.in_flight.push((id, job)),
                Err(s) => job.fail(s),
            }
        }
        if n > 0 {
            self.inner.in_flight.store(self.in_flight.len(), Ordering::Release);
            self.inner.wake_space_waiters();
        }
        n
    }

    /// Delivers finished calls, ends expired ones, releases cancelled ones.
    fn finish_calls(&mut self) -> usize {
        let mut n = 0;
        let mut now = None;
        let mut i = 0;
        while i < self.in_flight.len() {
            let (id, job) = &self.in_flight[i];
            let expired = id.deadline.is_some_and(|d| *now.get_or_insert_with(Instant::now) >= d);
            let finished = if job.is_cancelled() {
                // The future was dropped: its late answer is discarded when it comes.
                with_any_core!(&mut self.core, c => c.abandon(*id));
                true
            } else {
                job.try_finish(&mut self.core, *id, expired)
            };
            if finished {
                self.in_flight.swap_remove(i);
                n += 1;
            } else {
                i += 1;
            }
        }
        if n > 0 {
            self.inner.in_flight.store(self.in_flight.len(), Ordering::Release);
        }
        n
    }

    fn park(&mut self) {
        self.inner.sleeping.store(true, Ordering::SeqCst);
        // A call queued before the flag was visible did not unpark us: look once more.
        if self.inner.queue.is_empty() && !self.inner.stop.load(Ordering::SeqCst) {
            std::thread::park_timeout(PARK);
        }
        self.inner.sleeping.store(false, Ordering::SeqCst);
    }

    fn shut_down(&mut self) {
        let gone = || Status::unavailable("the channel was dropped");
        while let Some(job) = self.inner.queue.pop() {
            job.fail(gone());
        }
        for (id, job) in self.in_flight.drain(..) {
            with_any_core!(&mut self.core, c => c.abandon(id));
            job.fail(gone());
        }
        self.inner.in_flight.store(0, Ordering::Release);
        with_any_core!(&mut self.core, c => c.close());
    }
}
