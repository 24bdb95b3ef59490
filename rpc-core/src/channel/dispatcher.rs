//! Dispatchers: each a client session (its QP, CQ, SRQ and rings) behind a lock that is only
//! ever tried, with a bounded lock-free queue of calls; one dispatcher thread per core (per
//! entry of `ChannelConfig::core_ids`, one for the unpinned sessions, and per
//! `ChannelConfig::thread_name`) carries every session placed there, of every channel, and
//! drives a session when no caller does.
//!
//! Whoever holds a session drives it ([`Driver::step`]): takes queued calls while the session
//! has slots (each request is encoded straight into the session's registered memory) → one
//! doorbell for the batch (and for calls their callers started at once, [`Inner::start_now`])
//! → polls the CQ → hands finished calls to their tasks → releases cancelled ones. A caller's
//! poll drives it when it is free (see [`super::UnaryCall`]), so a
//! call can go out and come back on the caller's own thread with no hop between threads. A
//! driver that leaves with calls queued or in flight either finished other tasks' calls (woken
//! now, or queued to run since an earlier wake), or its own call is
//! done (its task goes on and polls its next call): the session is "owed" to them, they drive it
//! when polled. Otherwise it hands the session to the dispatcher thread
//! ([`Inner::want_driver`]: the session's flag, its thread's flag and, when the thread sleeps,
//! an unpark). All of this is per session: the flags (`wanted`, `owed`, `contended`), the
//! counts (`waiters`, `in_flight`, `passive`) and the lock live in the session's [`Inner`];
//! the thread's [`Hub`] adds one flag that says "look at your sessions' flags", and the park.
//!
//! The dispatcher thread drives a session only for tasks that wait (their poll returned
//! `Pending`, counted in [`Inner::waiters`]), for streams (whose futures never drive the
//! session), and for messages the session still has to post once no call is in flight (a
//! dropped call's Cancel that follows the last piece of its request, or found no send buffer:
//! no task will poll for it): with none of these, every call in flight belongs to a running task
//! that drives it when it polls. It sleeps until a driver leaves work to it; while a session has
//! calls in flight it looks at it every [`WATCH`] (spacing out to [`WATCH_MAX`] while callers
//! keep driving) and takes over when waiting tasks exist and no caller drove since its last
//! look (a task that did not come back); idle sessions get a look every [`PARK`], all in one
//! round (one wake-up for any number of them), which answers the server's Pings
//! ([`FLAG_IDLE_PONGS`]) and tells a balanced channel's watcher of a broken session.
//!
//! The same thread, run by a client [`Endpoint`] as its progress thread ([`watch_idle`], in the
//! endpoint's own registry of one), carries only idle looks: of the blocking `Client`s made from
//! the endpoint ([`IdleLook`]), each behind a lock the look only tries, in the rounds every
//! [`PARK`], so those clients answer the server's idle probe too. A client whose looks keep
//! finding nothing is looked at in every 2nd, 4th, then 8th round only ([`IdleLooks`]: 400 ms
//! apart, well inside the probe's third of `peer_timeout` between Pings), so thousands of idle
//! clients on one endpoint cost a few percent of a core, not a fifth of one.
//!
//! Many sessions on one thread, fairly: a round of the thread steps each session it drives once
//! (a busy session does not hold up the others), and between rounds the looks of the sessions it
//! does not drive go on (a session driven for a task that waits on a slow server, or one that
//! broke, keeps nobody else's Pings unanswered). Nothing on the thread blocks for one session:
//! the TCP connect and handshake of a new session, and the redial of a broken one
//! ([`spawn_redial`], which holds the session only to begin and to end the attempt), run on a
//! short-lived thread of their own, which hands the session (back) to the dispatcher thread. A
//! session whose channel is dropped has its calls ended and is closed by the thread
//! ([`Inner::close`]); the thread ends when it carries none ([`Hub`]).
//!
//! Waiting for completions: driving, the thread spins (the most `spins` of the sessions it
//! drives, yielding every [`YIELD_EVERY`] empty rounds), then waits per the most eager polling
//! policy among them (`Busy` spins, `SpinThenYield` yields, `Event` waits). An event wait
//! cannot block on several CQs at once (each session has its own CQ and completion channel),
//! so: driving exactly one session, the thread arms its CQ, lets the session go and blocks on
//! its completion channel (a completion wakes it at once), for at most 1 ms when it is the
//! thread's only session (as a thread of its own did) and [`SHARED_WAIT`] (200 µs) when it
//! carries others (their handoffs and looks wait at most that); driving several, it parks for
//! at most [`SHARED_WAIT`] (a handoff unparks it at once; completions of the sessions it drives
//! are seen at the end of the park). A completion channel shared by the CQs of a thread's
//! sessions (libibverbs allows one `ibv_comp_channel` for many CQs) would let it block on all
//! of them; not done yet.
//!
//! Threads that spin, on the benchmark's 2 cores with a current-thread runtime: the server's
//! worker (one core) and the runtime's thread, whose calls' polls drive the session (at most
//! [`super::ChannelConfig::poll_spin`] without a completion at a time); the dispatcher thread
//! sleeps, waking every [`WATCH`] to [`WATCH_MAX`] while calls are in flight, and spins only
//! while every task waits (the runtime's thread is idle then).

use std::cell::RefCell;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError, Weak};
use std::task::Waker;
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use prost::Message;

use super::call::{Completion, Job};
use crate::client::backoff::{Backoff, BackoffParams};
use crate::client::core::{CallId, ClientCore, StartMode};
use crate::client::endpoint::{AnyNic, Endpoint};
use crate::client::ClientConfig;
use crate::config::{PollingPolicy, EVENT_WAIT};
use crate::dispatch::service::MethodId;
use crate::endpoint::counters::Counters;
use crate::status::Status;
use crate::wire::FLAG_IDLE_PONGS;

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

/// A handle to a dispatcher session's CQ, for a completion-event wait outside the session.
pub(crate) enum AnyCq {
    Sim(<crate::verbs::sim::Sim as crate::verbs::Provider>::CompletionQueue),
    #[cfg(feature = "ibverbs")]
    Rdma(<crate::verbs::ibverbs::Ibverbs as crate::verbs::Provider>::CompletionQueue),
}

impl AnyCq {
    /// Blocks until the armed CQ signals or `timeout` passes (an error counts as a wake-up:
    /// the session finds out when it is next driven).
    fn wait(&self, timeout: Duration) {
        use crate::verbs::CompletionQueue;
        let _ = match self {
            AnyCq::Sim(cq) => cq.wait(Some(timeout)),
            #[cfg(feature = "ibverbs")]
            AnyCq::Rdma(cq) => cq.wait(Some(timeout)),
        };
    }
}

impl AnyCore {
    /// Arms the CQ for a wait outside the session: see [`ClientCore::arm_cq`].
    fn arm_cq(&mut self) -> Option<(usize, AnyCq)> {
        match self {
            AnyCore::Sim(c) => c.arm_cq().map(|(n, cq)| (n, AnyCq::Sim(cq))),
            #[cfg(feature = "ibverbs")]
            AnyCore::Rdma(c) => c.arm_cq().map(|(n, cq)| (n, AnyCq::Rdma(cq))),
        }
    }

    /// Connects a dispatcher's session on `endpoint` (the device context and PD it shares with
    /// the other sessions of its core). Its handshake says the client answers Pings while idle
    /// ([`FLAG_IDLE_PONGS`]): the dispatcher thread looks at an idle session every [`PARK`]
    /// ([`idle_look`]), so the server may probe it and find a stopped process. With
    /// `ClientConfig::same_host_shm` to a server on this host, on the same-host path (the
    /// connecting thread's software-NIC endpoint) when the server takes it.
    fn connect(addrs: &[SocketAddr], cfg: &ClientConfig, endpoint: &Endpoint) -> Result<AnyCore, Status> {
        #[cfg(feature = "ibverbs")]
        if let Some(core) = crate::client::same_host(addrs, cfg, endpoint, FLAG_IDLE_PONGS) {
            return Ok(AnyCore::Sim(Box::new(core)));
        }
        let addr = addrs;
        Ok(match endpoint.nic() {
            AnyNic::Sim(nic) => AnyCore::Sim(Box::new(ClientCore::connect(addr, cfg, nic, FLAG_IDLE_PONGS)?)),
            #[cfg(feature = "ibverbs")]
            AnyNic::Rdma(nic) => {
                AnyCore::Rdma(Box::new(ClientCore::connect(addr, cfg, nic, FLAG_IDLE_PONGS)?))
            }
        })
    }
}

/// What callers and the dispatcher thread share.
pub(crate) struct Inner {
    /// Calls waiting for a driver (bounded: a full queue makes callers wait).
    pub(crate) queue: ArrayQueue<Arc<dyn Job>>,
    /// The session, held by whoever drives it (only ever `try_lock`ed on the data path, so an
    /// unlock never has a sleeper to wake). `None` until connected and after shutdown.
    session: Mutex<Option<Driver>>,
    /// Set when the last handle is gone: the dispatcher ends its calls and closes the session.
    pub(crate) stop: AtomicBool,
    /// A caller's poll found the session held: the dispatcher thread, when it holds it, lets it
    /// go after its step (the caller drives; two threads spinning on one session would share a
    /// core on a small machine).
    contended: AtomicBool,
    /// Someone left work for the dispatcher thread, or the channel is gone (with [`Hub::wanted`],
    /// which the thread checks before it parks).
    wanted: AtomicBool,
    /// A driver left calls in flight having woken other tasks: the next poll of any call drives
    /// the session (or hands it to the dispatcher thread).
    owed: AtomicBool,
    /// The dispatcher thread carrying the session, once connected.
    hub: OnceLock<Arc<Hub>>,
    /// `ChannelConfig::spins` and `ClientConfig::polling` of the session's channel: how its
    /// dispatcher thread waits when it drives it and nothing comes.
    spins: u32,
    policy: PollingPolicy,
    /// Bumped by a task that changed one of its calls for the driver to act on (a dropped
    /// future or stream half, a stream message queued or taken, a stream finished): a driver
    /// looks at every call in flight only when it moved (or its deadline look is due).
    pub(crate) changes: AtomicU64,
    /// Calls started on the session and not yet finished or dropped (published before the
    /// tasks of finished calls are woken).
    pub(crate) in_flight: AtomicUsize,
    /// Unary calls whose poll returned `Pending` with the task's waker registered, not polled
    /// since: tasks that sleep until a driver wakes them. While there are none (every call's
    /// task is running and polls its calls itself) and no stream is in flight, the dispatcher
    /// thread has nothing to drive for.
    pub(crate) waiters: AtomicUsize,
    /// Streams in flight (as [`Inner::in_flight`] is published): their futures never drive the
    /// session, the dispatcher thread does.
    passive: AtomicUsize,
    /// Tasks waiting for room in a full queue, woken when a driver takes calls.
    space: Mutex<Vec<Waker>>,
    space_wanted: AtomicBool,
    /// How long a caller's poll drives the session waiting for an imminent reply.
    pub(crate) poll_spin: Duration,
    /// Calls started (encoded into registered memory and posted) by a caller's poll, and by
    /// the dispatcher thread.
    pub(crate) started_by_callers: AtomicU64,
    started_by_thread: AtomicU64,
    /// How the session was driven (see [`super::ChannelStats`]).
    pub(crate) stats: Stats,
    /// A driver found the session broken with calls queued and the backoff allowing an attempt:
    /// the dispatcher thread starts a reconnect ([`spawn_redial`]; a connect blocks, so never
    /// on a caller's thread nor on the dispatcher thread).
    redial_wanted: AtomicBool,
    /// A thread reconnects the session now ([`spawn_redial`]): the calls queued wait for it,
    /// and nobody drives the broken session for them (the attempt's end hands it to the
    /// dispatcher thread).
    redialing: AtomicBool,
    /// Reconnect attempts made (successful or not).
    pub(crate) reconnect_attempts: AtomicU64,
    /// The first connect failed (the thread is gone): calls queued meanwhile end with this
    /// status (a balanced channel queues calls on a server still connecting).
    failed: OnceLock<Status>,
    /// A balanced channel's watcher of this server: told when the idle session is found broken.
    watch: Option<Arc<dyn super::Watch>>,
    /// The load the server reported on the last response (`u32::MAX`: none yet), published
    /// with each batch of finished calls, and how many times it was published.
    pub(crate) load: std::sync::atomic::AtomicU32,
    pub(crate) load_seq: AtomicU64,
    /// The server's address once connected (the last session's, after a reconnect): what a
    /// traced call's span names as its peer (read on that cold path only).
    peer: Mutex<Option<SocketAddr>>,
}

/// Counters of how a dispatcher's session is driven: relaxed atomics, bumped once per drive,
/// wake or park (not per call), for [`super::Channel::stats`].
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) caller_drives: AtomicU64,
    pub(crate) caller_busy: AtomicU64,
    pub(crate) thread_drives: AtomicU64,
    pub(crate) thread_runs: AtomicU64,
    pub(crate) handoffs: AtomicU64,
    pub(crate) unparks: AtomicU64,
    pub(crate) wakes: AtomicU64,
    pub(crate) steps: AtomicU64,
    pub(crate) empty_steps: AtomicU64,
    pub(crate) event_waits: AtomicU64,
    pub(crate) in_flight_at_start: AtomicU64,
}

/// Adds `n` to a statistics counter any thread may bump.
#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Adds `n` to a statistics counter only the session's holder writes (a load and a store, no
/// locked instruction).
#[inline]
fn bump_held(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

thread_local! {
    /// The wakers a driver collected, woken once it has let go of the session.
    static WAKE_BATCH: RefCell<Vec<Waker>> = const { RefCell::new(Vec::new()) };
}

/// What one drive by a caller did.
pub(crate) struct Drove {
    /// Completions handled and calls started.
    pub(crate) work: usize,
    /// Other tasks woken.
    pub(crate) woke: usize,
    /// It left calls queued or in flight with no task woken and its own call not done: unless
    /// the caller drives again, it hands the session to the dispatcher thread
    /// ([`Inner::want_driver`]) once it has counted itself among the waiters.
    pub(crate) unattended: bool,
}

impl Inner {
    /// The server's address, once connected.
    pub(crate) fn peer(&self) -> Option<SocketAddr> {
        *self.peer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a call (it goes out with the next step of whoever drives the session). Gives the
    /// call back when the queue is full.
    pub(crate) fn submit(&self, job: Arc<dyn Job>) -> Result<(), Arc<dyn Job>> {
        self.queue.push(job)
    }

    /// Starts a unary call at once, when nothing is queued (calls keep their order) and the
    /// session is free with a slot and room for the request: encodes it straight into the
    /// session's registered memory (it goes out with the next step of whoever drives, which
    /// rings one doorbell for all calls started since). `make` builds the call's job (with the
    /// status when the start failed: the call ends with it). `None`: the call is to be queued.
    pub(crate) fn start_now<M: Message, J: Job + 'static>(
        &self,
        method: MethodId,
        req: &crate::metadata::WithMetadata<'_, M>,
        flags: u8,
        timeout: Option<Duration>,
        capture: Option<&crate::metadata::CapturedMetadata>,
        make: impl FnOnce(Option<Status>) -> Arc<J>,
    ) -> Option<Arc<J>> {
        if !self.queue.is_empty() {
            return None;
        }
        let mut g = self.try_session()?;
        let d = g.as_mut().expect("checked by try_session");
        let deadline = timeout.map(|t| Instant::now() + t);
        // Alone on the session (one call at a time): posted now, as a blocking call is (no
        // pass through the send queue). Otherwise with the driver's next step, so that calls
        // started back to back share one doorbell.
        let mode = if d.in_flight.is_empty() { StartMode::NoWaitNow } else { StartMode::NoWait };
        match with_any_core!(&mut d.core, c => c.start_with(method, req, deadline, mode, flags, capture)) {
            Ok(Some(id)) => {
                let job = make(None);
                let at_start = d.in_flight.len() as u64 + 1;
                d.in_flight.push(InFlight { id, job: job.clone(), unary: true });
                bump_held(&self.started_by_callers, 1);
                bump_held(&self.stats.in_flight_at_start, at_start);
                self.in_flight.store(d.in_flight.len(), Ordering::Release);
                Some(job)
            }
            Ok(None) => None,
            // Queued: the driver reconnects first, or fails it naming the backoff.
            Err(_) if with_any_core!(&d.core, c => c.broken().is_some()) => None,
            Err(s) => Some(make(Some(s))),
        }
    }

    /// The first connect failed (or found no dispatcher thread): calls queued meanwhile (a
    /// balanced channel's), and any that come later, end with `status`.
    #[cold]
    fn connect_failed(&self, status: Status, connected: &Completion<Result<(), Status>>) {
        let _ = self.failed.set(status.clone());
        fail_queued(self, &status);
        connected.complete(Err(status));
    }

    /// Tells the dispatcher thread to look at the session's flags (unparks it when it sleeps).
    /// Before the session joined its thread, nothing: the thread looks at a session as it
    /// joins.
    fn wake(&self) {
        if let Some(hub) = self.hub.get() {
            if hub.poke() {
                bump(&self.stats.unparks, 1);
            }
        }
    }

    /// The channel is gone: the dispatcher thread ends the session's calls, closes it and
    /// forgets it.
    pub(crate) fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wanted.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Hands the session to the dispatcher thread: work is left and no caller will drive it.
    pub(crate) fn want_driver(&self) {
        bump(&self.stats.handoffs, 1);
        self.wanted.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Takes the session if it is free (and connected).
    fn try_session(&self) -> Option<MutexGuard<'_, Option<Driver>>> {
        let g = match self.session.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        if g.is_none() {
            drop(g);
            self.not_connected();
            return None;
        }
        Some(g)
    }

    /// No session: still connecting, shut down, or its first connect failed (then the calls
    /// queued end with that failure: no thread is left to take them).
    #[cold]
    #[inline(never)]
    fn not_connected(&self) {
        if let Some(s) = self.failed.get() {
            fail_queued(self, s);
        }
    }

    /// A caller drives the session, if it is free, until `done()` holds, `spin` passes with no
    /// completion, or (with `others_first`) another call finished; then lets it go. What it
    /// leaves is owed to the tasks it woke (or to the caller's own task, whose call is done),
    /// or else [`Drove::unattended`]. `None` when another thread holds the session.
    pub(crate) fn drive(&self, spin: Duration, others_first: bool, done: &dyn Fn() -> bool) -> Option<Drove> {
        let Some(mut g) = self.try_session() else {
            bump(&self.stats.caller_busy, 1);
            // The dispatcher thread, if it is the holder, leaves the session to us.
            self.contended.store(true, Ordering::Relaxed);
            return None;
        };
        self.owed.store(false, Ordering::Relaxed);
        let d = g.as_mut().expect("checked by try_session");
        d.delivered = 0;
        let mut drove = Drove { work: 0, woke: 0, unattended: false };
        let mut since: Option<Instant> = None;
        let mut spins = 0u32;
        let mut steps = 0u64;
        let mut empty = 0u64;
        let mut own;
        loop {
            let work = d.step(self, true);
            steps += 1;
            empty += u64::from(work == 0);
            drove.work += work;
            own = done();
            // Others' calls finished: their tasks (woken now, or queued to run since an earlier
            // wake) poll next; holding on would keep them from issuing their next calls.
            if own || (others_first && d.delivered > 0) || !d.has_work() {
                break;
            }
            if work > 0 {
                since = None;
                spins = 0;
                continue;
            }
            if spin.is_zero() {
                // One step per poll: no empty spins, no clock read.
                break;
            }
            spins += 1;
            if spins % 16 == 0 {
                let now = Instant::now();
                if now.duration_since(*since.get_or_insert(now)) >= spin {
                    break;
                }
            }
            std::hint::spin_loop();
        }
        let calls = d.has_calls() || !self.queue.is_empty();
        let owes = d.owes_sends();
        drove.woke = d.woken();
        let delivered = std::mem::take(&mut d.delivered);
        let batch = d.take_wakers();
        bump_held(&self.stats.caller_drives, 1);
        bump_held(&self.stats.steps, steps);
        bump_held(&self.stats.empty_steps, empty);
        bump_held(&self.stats.wakes, batch.len() as u64);
        drop(g);
        wake_all(batch);
        if calls && (delivered > 0 || own) {
            // The tasks whose calls finished (woken now or earlier, and not yet polled), or this
            // caller's own task (its call is done: it goes on and polls its next call soon),
            // drive it next; should none come back, the dispatcher thread, which watches the
            // session while calls are in flight, takes it over after one look (every [`WATCH`]
            // to [`WATCH_MAX`]) without a caller's drive. No unpark (a system call and a thread
            // switch on the caller's core) per call.
            self.owed.store(true, Ordering::Release);
        } else if (calls || owes) && !self.redialing.load(Ordering::SeqCst) {
            // Nobody will come back for it: with no call in flight, messages still to post
            // (a dropped call's Cancel) are no task's to drive. (Calls queued while a reconnect
            // runs wait for it: its end hands the session to the dispatcher thread.)
            drove.unattended = true;
        }
        Some(drove)
    }

    /// True when a driver left the session to the tasks it woke: the caller polled now should
    /// drive it.
    pub(crate) fn is_owed(&self) -> bool {
        self.owed.load(Ordering::Relaxed)
    }

    /// [`Inner::drive`], handing what it leaves unattended (or, when another thread holds the
    /// session, everything) to the dispatcher thread.
    pub(crate) fn drive_or_hand_off(&self, spin: Duration, done: &dyn Fn() -> bool) {
        match self.drive(spin, true, done) {
            Some(d) if !d.unattended => {}
            _ => self.want_driver(),
        }
    }

    /// The session's counters (waits while another thread drives it: one step, or a caller's
    /// drive of at most about `poll_spin` without a completion; a reconnect holds it only to
    /// begin and end its attempt, not across the connect: [`spawn_redial`]).
    pub(crate) fn counters(&self) -> Counters {
        let g = self.session.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref()
            .map(|d| {
                let mut sum = d.redial.retired.clone();
                sum.add(&with_any_core!(&d.core, c => c.counters_now()));
                sum
            })
            .unwrap_or_default()
    }

    /// The receive side of the session's endpoint and its gauges ([`ClientCore::recv_side`]),
    /// `None` before the session connects.
    pub(crate) fn recv_side(&self) -> Option<(usize, u64, u64)> {
        let g = self.session.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(|d| with_any_core!(&d.core, c => c.recv_side()))
    }

    /// Calls started by callers' polls and by the dispatcher thread.
    pub(crate) fn started(&self) -> (u64, u64) {
        (self.started_by_callers.load(Ordering::Relaxed), self.started_by_thread.load(Ordering::Relaxed))
    }

    /// Registers `waker` to be woken when a driver takes calls out of the queue.
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

/// Wakes a driver's collected wakers (after it let go of the session), keeping the buffer.
fn wake_all(mut batch: Vec<Waker>) {
    if batch.capacity() == 0 {
        // Nothing to wake ([`Driver::take_wakers`] of an empty batch), nothing to keep.
        return;
    }
    for w in batch.drain(..) {
        w.wake();
    }
    // (Not during the thread's teardown, when its locals may be gone: a call dropped then.)
    let _ = WAKE_BATCH.try_with(|b| {
        if let Ok(mut b) = b.try_borrow_mut() {
            if b.capacity() < batch.capacity() {
                *b = batch;
            }
        }
    });
}

/// How a dispatcher's session is set up.
pub(crate) struct Setup<A> {
    pub(crate) addr: A,
    pub(crate) client: ClientConfig,
    pub(crate) queue_depth: usize,
    pub(crate) core_id: Option<usize>,
    /// The dispatcher thread that carries the session: the one of this name on `core_id` (see
    /// [`Hub`]).
    pub(crate) name: String,
    pub(crate) spins: u32,
    pub(crate) poll_spin: Duration,
    /// A balanced channel's watcher of this server (see [`super::Watch`]).
    pub(crate) watch: Option<Arc<dyn super::Watch>>,
}

/// Pins the calling thread to `core` (`None`: leaves it unpinned).
fn pin(core: Option<usize>) {
    if let Some(id) = core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
            tracing::warn!(core = id, "dispatcher: could not pin to the core");
        }
    }
}

/// Starts a dispatcher's session: a short-lived thread (pinned as the dispatcher thread is)
/// resolves the address, connects and hands the session to the dispatcher thread of its core
/// ([`Hub::join`], which starts that thread if it is not running); `connected` gets the outcome.
/// A connect blocks (TCP, handshake), so it never runs on the dispatcher thread, where it would
/// hold up every other session there.
///
/// # Errors
/// UNAVAILABLE when the connecting thread cannot be spawned.
pub(crate) fn spawn<A: ToSocketAddrs + Send + 'static>(
    setup: Setup<A>,
    connected: Arc<Completion<Result<(), Status>>>,
) -> Result<Arc<Inner>, Status> {
    let inner = Arc::new(Inner {
        queue: ArrayQueue::new(setup.queue_depth),
        session: Mutex::new(None),
        stop: AtomicBool::new(false),
        contended: AtomicBool::new(false),
        wanted: AtomicBool::new(false),
        owed: AtomicBool::new(false),
        hub: OnceLock::new(),
        spins: setup.spins,
        policy: setup.client.polling,
        changes: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        waiters: AtomicUsize::new(0),
        passive: AtomicUsize::new(0),
        space: Mutex::new(Vec::new()),
        space_wanted: AtomicBool::new(false),
        poll_spin: setup.poll_spin,
        started_by_callers: AtomicU64::new(0),
        started_by_thread: AtomicU64::new(0),
        stats: Stats::default(),
        redial_wanted: AtomicBool::new(false),
        redialing: AtomicBool::new(false),
        reconnect_attempts: AtomicU64::new(0),
        failed: OnceLock::new(),
        watch: setup.watch.clone(),
        load: std::sync::atomic::AtomicU32::new(u32::MAX),
        load_seq: AtomicU64::new(0),
        peer: Mutex::new(None),
    });
    let shared = inner.clone();
    let handle = std::thread::Builder::new()
        .name(format!("{}-connect", setup.name))
        .spawn(move || {
            pin(setup.core_id);
            let first = BackoffParams::from_config(&setup.client).and_then(|params| {
                let addrs: Vec<SocketAddr> = setup
                    .addr
                    .to_socket_addrs()
                    .map_err(|e| Status::unavailable(format!("resolving the server address: {e}")))?
                    .collect();
                // The endpoint of this dispatcher's core, shared with every other Channel's
                // sessions there: one device context per core, however many servers.
                let endpoint = Endpoint::per_core(&setup.client.transport, setup.core_id)?;
                Ok((AnyCore::connect(&addrs[..], &setup.client, &endpoint)?, addrs, params, endpoint))
            });
            let (core, addrs, params, endpoint) = match first {
                Ok(c) => c,
                Err(s) => return shared.connect_failed(s, &connected),
            };
            *shared.peer.lock().unwrap_or_else(|e| e.into_inner()) = Some(with_any_core!(&core, c => c.peer));
            let redial = Redial {
                target: Arc::new(Target { addrs, config: setup.client.clone(), endpoint }),
                backoff: Backoff::new(params, fastrand::Rng::new()),
                retired: Counters::default(),
            };
            *shared.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(Driver {
                core,
                in_flight: Vec::new(),
                passive: 0,
                wakers: Vec::new(),
                finished: Vec::new(),
                answered: Vec::new(),
                changes_seen: 0,
                delivered: 0,
                empty: 0,
                looks: 0,
                redial,
                told_broken: false,
            });
            if let Err(s) = Hub::join(setup.core_id, &setup.name, &shared) {
                // No thread to carry the session: it closes, and calls end with why.
                let d = shared.session.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(mut d) = d {
                    with_any_core!(&mut d.core, c => c.close());
                }
                return shared.connect_failed(s, &connected);
            }
            connected.complete(Ok(()));
        })
        .map_err(|e| Status::unavailable(format!("spawning a thread to connect: {e}")))?;
    // Detached: it ends once the session is connected and handed over (or failed).
    drop(handle);
    Ok(inner)
}

/// A call started on the session.
struct InFlight {
    id: CallId,
    job: Arc<dyn Job>,
    /// [`Job::polled_by_caller`] (a unary call), read once.
    unary: bool,
}

/// The session and the calls on it, driven by whoever holds it.
pub(crate) struct Driver {
    core: AnyCore,
    in_flight: Vec<InFlight>,
    /// Calls in flight whose futures do not drive the session (streams): the dispatcher thread
    /// drives for them.
    passive: usize,
    /// Wakers of the tasks whose calls finished in this hold of the session.
    wakers: Vec<Waker>,
    /// Streams finished in this step, handed over once the count in flight is published.
    finished: Vec<Arc<dyn Job>>,
    /// Unary calls answered (or expired: `true`) in this step, their answers taken from the
    /// session and handed over once the count in flight is published.
    answered: Vec<(InFlight, bool)>,
    changes_seen: u64,
    /// Calls handed to their tasks since the holder took the session.
    delivered: usize,
    /// Steps in a row that found nothing to do.
    empty: u32,
    /// Empty steps between two looks at deadlines.
    looks: u32,
    /// How the session is replaced when it breaks.
    redial: Redial,
    /// A balanced channel's watcher was told the session broke ([`idle_look`]; cleared when a
    /// reconnect replaces it).
    told_broken: bool,
}

/// How a dispatcher replaces a broken session, as a [`crate::Client`] does: lazily (a call
/// queued after the break asks for it), to the addresses resolved at the first connect, no
/// sooner than the backoff of `ClientConfig::reconnect_*` allows. Calls made while the backoff
/// runs end UNAVAILABLE naming why the session broke and when the next attempt may be made;
/// calls made while an attempt runs wait for it; calls waiting for an attempt that fails end
/// with its error.
struct Redial {
    /// Where and how to connect (shared with the redial thread, which connects without the
    /// session).
    target: Arc<Target>,
    backoff: Backoff,
    /// Counters of the sessions replaced so far.
    retired: Counters,
}

/// Where a dispatcher's sessions connect: the addresses resolved at the first connect, the
/// channel's client config, and the endpoint of the dispatcher's core.
struct Target {
    addrs: Vec<SocketAddr>,
    config: ClientConfig,
    endpoint: Endpoint,
}

/// A reconnect attempt under way ([`Driver::begin_redial`] to [`Driver::end_redial`]): why the
/// session broke, and where it was connected.
struct Attempt {
    target: Arc<Target>,
    peer: SocketAddr,
    reason: Status,
}

/// Empty steps between two looks at the calls' deadlines while a driver spins.
const LOOK_EVERY: u32 = 64;

impl Driver {
    /// One round: queued calls started while slots are free (one doorbell), the CQ polled once,
    /// finished calls handed over (their wakers collected, see [`Driver::take_wakers`]),
    /// cancelled ones released, deadlines looked at now and then. Returns the work done (calls
    /// started + completions).
    fn step(&mut self, inner: &Inner, by_caller: bool) -> usize {
        let mut work = self.take_calls(inner, by_caller);
        let completions = with_any_core!(&mut self.core, c => c.dispatch_step());
        work += completions;
        let changes = inner.changes.load(Ordering::Acquire);
        let look = !self.in_flight.is_empty() && {
            self.looks += 1;
            self.looks % LOOK_EVERY == 0
        };
        let full = changes != self.changes_seen || look;
        if work > 0 || full {
            self.changes_seen = changes;
            work += self.finish_calls(inner, full);
        }
        if work > 0 {
            self.empty = 0;
        } else {
            self.empty = self.empty.saturating_add(1);
        }
        work
    }

    /// Calls started and not yet finished, or messages the session still has to post (a
    /// dropped call's Cancel that found no send buffer, a stream's end): either way the session
    /// must be driven again.
    fn has_work(&self) -> bool {
        self.has_calls() || self.owes_sends()
    }

    /// A full pass over the calls in flight ([`Driver::finish_calls`] with `full`) has
    /// something to look at: a future dropped or a stream changed since the last pass, a
    /// stream in flight, or a call with a deadline.
    fn wants_look(&self, inner: &Inner) -> bool {
        self.changes_seen != inner.changes.load(Ordering::Acquire)
            || self.passive > 0
            || self.in_flight.iter().any(|f| f.id.deadline.is_some())
    }

    /// Calls started and not yet finished.
    fn has_calls(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// The session holds messages that leave only when it is driven (see
    /// [`ClientCore::owes_sends`]): no task waits for them, so the dispatcher thread drives for
    /// them as it does for waiting tasks.
    fn owes_sends(&self) -> bool {
        with_any_core!(&self.core, c => c.owes_sends())
    }

    /// Tasks to wake so far.
    fn woken(&self) -> usize {
        self.wakers.len()
    }

    /// The wakers collected, to be woken once the session is let go.
    fn take_wakers(&mut self) -> Vec<Waker> {
        if self.wakers.is_empty() {
            // Nothing to wake (most steps): no buffer changes hands, no thread-local touched.
            return Vec::new();
        }
        let spare = WAKE_BATCH
            .try_with(|b| b.try_borrow_mut().map(|mut b| std::mem::take(&mut *b)).unwrap_or_default());
        let spare = spare.unwrap_or_default();
        std::mem::replace(&mut self.wakers, spare)
    }

    /// Starts queued calls while the session has slots; one doorbell for all of them.
    fn take_calls(&mut self, inner: &Inner, by_caller: bool) -> usize {
        if !inner.queue.is_empty() && with_any_core!(&self.core, c => c.broken().is_some()) {
            return self.queued_on_broken(inner);
        }
        let mut n = 0;
        let mut at_start = 0u64;
        let before = self.in_flight.len();
        // `is_empty` first: two loads, where a pop of an empty queue costs a SeqCst fence (every
        // step of a driver looks, most find nothing).
        while !inner.queue.is_empty() && with_any_core!(&self.core, c => c.has_free_slot()) {
            let Some(job) = inner.queue.pop() else { break };
            n += 1;
            if job.is_cancelled() {
                continue;
            }
            match job.start(&mut self.core) {
                Ok(id) => {
                    at_start += self.in_flight.len() as u64 + 1;
                    let unary = job.polled_by_caller();
                    self.passive += usize::from(!unary);
                    self.in_flight.push(InFlight { id, job, unary });
                }
                Err(s) => job.fail(s),
            }
        }
        if n > 0 {
            let started = (self.in_flight.len() - before) as u64;
            let by = if by_caller { &inner.started_by_callers } else { &inner.started_by_thread };
            bump_held(by, started);
            bump_held(&inner.stats.in_flight_at_start, at_start);
            // The doorbell for the batch rings in the progress step that follows.
            inner.in_flight.store(self.in_flight.len(), Ordering::Release);
            inner.passive.store(self.passive, Ordering::Relaxed);
            inner.wake_space_waiters();
        }
        n
    }

    /// Calls queued on a broken session: while an attempt runs, and when the backoff allows
    /// one, they wait for the reconnect ([`spawn_redial`]); otherwise they end UNAVAILABLE
    /// naming when the next attempt may be made. Returns the calls ended.
    #[cold]
    #[inline(never)]
    fn queued_on_broken(&mut self, inner: &Inner) -> usize {
        if inner.redialing.load(Ordering::SeqCst) {
            // The attempt's end hands the session to the dispatcher thread: they go out on the
            // new session, or end with the attempt's error.
            return 0;
        }
        let (peer, reason) = with_any_core!(&self.core, c => (c.peer, c.broken().cloned()));
        let reason = reason.unwrap_or_else(|| Status::unavailable("the session broke"));
        match self.redial.backoff.due(peer, &reason, Instant::now()) {
            Ok(()) => {
                inner.redial_wanted.store(true, Ordering::SeqCst);
                inner.want_driver();
                0
            }
            Err(status) => fail_queued(inner, &status),
        }
    }

    /// Starts replacing a broken session when calls wait for it and the backoff allows (on the
    /// redial thread, [`spawn_redial`], under the session's lock): the broken session's calls
    /// end (with its status) and the attempt is counted. The connect itself runs without the
    /// session ([`AnyCore::connect`], then [`Driver::end_redial`]). `None`: no attempt now.
    #[cold]
    #[inline(never)]
    fn begin_redial(&mut self, inner: &Inner) -> Option<Attempt> {
        let reason = with_any_core!(&self.core, c => c.broken().cloned())?;
        let peer = with_any_core!(&self.core, c => c.peer);
        if inner.queue.is_empty() || self.redial.backoff.due(peer, &reason, Instant::now()).is_err() {
            // Nothing waits for it, or a call came in between and was told to wait.
            return None;
        }
        self.fail_in_flight(inner, &reason);
        inner.reconnect_attempts.fetch_add(1, Ordering::Relaxed);
        Some(Attempt { target: self.redial.target.clone(), peer, reason })
    }

    /// Ends an attempt begun by [`Driver::begin_redial`] with the outcome of its connect (back
    /// under the session's lock): the new session replaces the broken one (its counters kept),
    /// or the calls queued end with the attempt's error and the backoff grows.
    #[cold]
    #[inline(never)]
    fn end_redial(&mut self, inner: &Inner, attempt: Attempt, connected: Result<AnyCore, Status>) {
        let Attempt { peer, reason, .. } = attempt;
        match connected {
            Ok(core) => {
                // (None: no call starts on a broken session.)
                self.fail_in_flight(inner, &reason);
                let old = std::mem::replace(&mut self.core, core);
                self.redial.retired.add(&with_any_core!(&old, c => c.counters.clone()));
                drop(old);
                self.redial.backoff.on_success();
                self.told_broken = false;
                let peer = with_any_core!(&self.core, c => c.peer);
                *inner.peer.lock().unwrap_or_else(|e| e.into_inner()) = Some(peer);
                tracing::info!(%peer, why = reason.message(), "channel reconnected");
            }
            Err(e) => {
                let status = self.redial.backoff.failed(peer, &reason, &e, Instant::now());
                fail_queued(inner, &status);
            }
        }
    }

    /// Ends the calls of a broken session with its status (those its break failed and not yet
    /// handed over are handed over first).
    fn fail_in_flight(&mut self, inner: &Inner, reason: &Status) {
        self.finish_calls(inner, true);
        for InFlight { id, job, .. } in self.in_flight.drain(..) {
            with_any_core!(&mut self.core, c => c.abandon(id));
            job.fail(reason.clone());
        }
        self.passive = 0;
        inner.in_flight.store(0, Ordering::Release);
        inner.passive.store(0, Ordering::Relaxed);
    }

    /// Delivers finished calls, ends expired ones, releases cancelled ones; publishes the count
    /// still in flight before any of their tasks can see its result (or is woken).
    ///
    /// Without `full` (completions came, no future was dropped, no look at deadlines due), a
    /// unary call is looked at only when its slot has its answer (a compare, no call through
    /// the job): the scan costs a few ns per call in flight, not two virtual calls. A unary
    /// call's answer stays in the session until the count is published; then one call through
    /// its job decodes it and hands it over (one lock of the call's state).
    fn finish_calls(&mut self, inner: &Inner, full: bool) -> usize {
        let mut n = 0;
        let mut now = None;
        let mut i = 0;
        while i < self.in_flight.len() {
            let f = &self.in_flight[i];
            let answered = f.unary && with_any_core!(&self.core, c => c.is_answered(f.id));
            if !full && f.unary && !answered {
                i += 1;
                continue;
            }
            let (id, job) = (&f.id, &f.job);
            let expired = id.deadline.is_some_and(|d| *now.get_or_insert_with(Instant::now) >= d);
            if job.is_cancelled() {
                // The future was dropped: its late answer is discarded when it comes (a
                // stream's held messages and unsent ones are dropped too).
                with_any_core!(&mut self.core, c => c.abandon_stream(*id));
                let f = self.in_flight.swap_remove(i);
                self.passive -= usize::from(!f.unary);
                n += 1;
            } else if f.unary {
                if answered || expired {
                    let f = self.in_flight.swap_remove(i);
                    self.answered.push((f, expired));
                    n += 1;
                } else {
                    i += 1;
                }
            } else if job.try_finish(&mut self.core, *id, expired) {
                let f = self.in_flight.swap_remove(i);
                self.passive -= 1;
                self.finished.push(f.job);
                n += 1;
            } else {
                i += 1;
            }
        }
        if n > 0 {
            inner.in_flight.store(self.in_flight.len(), Ordering::Release);
            inner.passive.store(self.passive, Ordering::Relaxed);
            if let Some(l) = with_any_core!(&self.core, c => c.peer_load()) {
                // For a balanced channel's power of two choices (two stores per batch).
                inner.load.store(l, Ordering::Relaxed);
                bump_held(&inner.load_seq, 1);
            }
            self.delivered += self.finished.len() + self.answered.len();
            for (f, expired) in self.answered.drain(..) {
                f.job.finish(&mut self.core, f.id, expired, &mut self.wakers);
            }
            for job in self.finished.drain(..) {
                job.release(&mut self.wakers);
            }
        }
        n
    }

    /// Ends every call (the channel is gone) and closes the session.
    fn shut_down(&mut self, inner: &Inner) {
        let gone = || Status::unavailable("the channel was dropped");
        while let Some(job) = inner.queue.pop() {
            job.fail(gone());
        }
        self.passive = 0;
        for InFlight { id, job, .. } in self.in_flight.drain(..) {
            with_any_core!(&mut self.core, c => c.abandon(id));
            job.fail(gone());
        }
        inner.in_flight.store(0, Ordering::Release);
        inner.passive.store(0, Ordering::Relaxed);
        with_any_core!(&mut self.core, c => c.close());
    }
}

/// Ends the calls queued now with `status` (those whose futures were dropped are let go); one
/// queued meanwhile (its caller saw an earlier call end) is left to the next driver, which tells
/// it what holds then. Returns how many were taken.
fn fail_queued(inner: &Inner, status: &Status) -> usize {
    let mut n = 0;
    for _ in 0..inner.queue.len() {
        let Some(job) = inner.queue.pop() else { break };
        n += 1;
        if !job.is_cancelled() {
            job.fail(status.clone());
        }
    }
    if n > 0 {
        inner.wake_space_waiters();
    }
    n
}

/// Empty rounds between two yields of a dispatcher thread that spins (a few µs of spinning).
/// While it spins, the tasks it drives for may already be woken (by a caller's drive) and wait
/// for the core it holds: on two cores with a busy-polling server worker, the runtime's thread
/// and this one share the other. At 1,024 (tens of µs, a scheduler slice under load) `rpc-perf
/// --test chan_bw -c 32` showed 37 dispatcher steps per call and lost its calls to it; at 16,
/// half the steps and about 7 % more calls in the same run (load 8.5, the same binary
/// alternating).
const YIELD_EVERY: u32 = 16;

/// How often a dispatcher thread looks at its idle sessions (all of them in one round, so
/// many idle sessions cost one wake-up per round, not one each), and its longest park (a lost
/// unpark, or a session left to tasks that were never polled, costs at most this).
const PARK: Duration = Duration::from_millis(50);

/// How often the dispatcher thread first looks at a session with calls queued or in flight that
/// callers drive: when no caller drove it since the last look, it takes over. While callers keep
/// driving it, the looks space out, doubling up to [`WATCH_MAX`]; a session left to tasks that
/// did not come back waits at most about twice the current spacing (0.4 ms after a take-over,
/// 3.2 ms after a long run of callers' drives).
pub(crate) const WATCH: Duration = Duration::from_micros(200);

/// The widest spacing of those looks. Each look is a wake-up of a thread that shares the cores
/// with busy-polling callers and workers: at a fixed 200 µs, 5,000 wake-ups a second cost
/// `chan_bw -c 32 --tasks 8` about a tenth of its calls on two cores.
const WATCH_MAX: Duration = Duration::from_micros(1600);

/// The longest event wait of a dispatcher thread that carries more than one session: the most
/// a handoff or a due look of another session waits while the thread blocks on one session's
/// CQ, and the park of a thread that drives several sessions and found nothing to do (it
/// cannot block on several CQs; an unpark ends the park at once).
const SHARED_WAIT: Duration = WATCH;

/// A session the dispatcher thread only looks at while nobody else holds it, every [`PARK`]
/// (a blocking [`crate::Client`]'s, whose calls its own thread drives): the look handles what
/// arrived, so the server's idle probe gets its Pong ([`FLAG_IDLE_PONGS`]). The session is
/// behind a lock that the look only tries: a caller that holds it drives the session itself.
pub(crate) trait IdleLook: Send + Sync {
    /// One look: one poll of the session's CQ and what it brought handled, when its lock is
    /// free; nothing when a caller holds it. `rounds`: the rounds of [`PARK`] since its last look
    /// (1 or more: [`IdleLooks`]), which its timers count as that many empty looks. True when the
    /// session was busy: a caller held it, or the look handled something.
    fn idle_look(&self, rounds: u32) -> bool;
}

/// Looks in a row that found a session idle before its looks space out, and again before
/// each doubling of the spacing ([`IdleLooks`]).
const QUIET_LOOKS: u8 = 4;

/// The widest spacing of an idle session's looks, in rounds of [`PARK`]: 8 (400 ms).
const IDLE_ROUNDS_MAX: u8 = 8;

/// The sessions a dispatcher thread only looks at while idle ([`IdleLook`]: the blocking
/// `Client`s of a client endpoint), and the spacing of their looks: every round of [`PARK`]
/// while its looks find the session busy; after [`QUIET_LOOKS`] looks that found it idle, every
/// 2nd round, after as many more every 4th, then every 8th ([`IDLE_ROUNDS_MAX`], 400 ms); each
/// busy look halves the spacing again (a session that stays busy is looked at every round after
/// three). A Ping then waits at most 400 ms for its Pong (the server probes every third of its
/// `peer_timeout`, 2 s by default, and gives up after the whole of it). A session whose client is
/// gone is dropped at its next look. Measured with 20,000 idle sessions in 4 client processes
/// (`sessions` benchmark, the server probing every 2 s, load 5-7): the client processes took
/// 19.3 % of a core with a look every round, 8.7 % when a busy look brought back every round,
/// 7.3 % as here (4.7 % with the probe off; about 450 ns a look, its cache misses mostly).
#[derive(Default)]
struct IdleLooks {
    slots: Vec<IdleSlot>,
}

struct IdleSlot {
    look: Weak<dyn IdleLook>,
    /// Rounds left before its next look.
    skip: u8,
    /// Its looks that found it idle, less [`QUIET_LOOKS`] per busy one (0 to 3 × [`QUIET_LOOKS`]).
    quiet: u8,
}

impl IdleLooks {
    fn push(&mut self, look: Weak<dyn IdleLook>) {
        self.slots.push(IdleSlot { look, skip: 0, quiet: 0 });
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// One round: looks at the sessions whose look is due (a session skipped touches nothing of
    /// its own: no cold cache line), and forgets those gone.
    fn round(&mut self) {
        self.slots.retain_mut(|s| {
            if s.skip > 0 {
                s.skip -= 1;
                return true;
            }
            let Some(look) = s.look.upgrade() else { return false };
            let rounds = Self::spacing(s.quiet);
            s.quiet = if look.idle_look(u32::from(rounds)) {
                // Busy (a Ping answered, a caller at work): one step closer, not all the way
                // back: a Ping every 2 s costs about 8 looks per 2 s, not 14.
                s.quiet.saturating_sub(QUIET_LOOKS)
            } else {
                (s.quiet + 1).min(3 * QUIET_LOOKS)
            };
            s.skip = Self::spacing(s.quiet) - 1;
            true
        });
    }

    /// Rounds between looks after `quiet` looks in a row that found the session idle.
    fn spacing(quiet: u8) -> u8 {
        (1u8 << (quiet / QUIET_LOOKS).min(3)).min(IDLE_ROUNDS_MAX)
    }
}

/// Dispatcher threads by core and name, at most one each: the process-wide registry of the
/// `Channel`s' threads, or an endpoint's (its progress thread, [`watch_idle`]).
pub(crate) type Hubs = Mutex<Vec<Arc<Hub>>>;

/// What joins a dispatcher thread: a `Channel`'s session, which it drives and looks at, or a
/// session it only looks at while idle.
enum Joining {
    Session(Arc<Inner>),
    Idle(Weak<dyn IdleLook>),
}

/// The dispatcher thread of one core (one for the unpinned sessions) and name: it carries every
/// session placed there, of every channel, from [`Hub::join`] until the session's channel is
/// dropped, and the idle looks of the sessions [`watch_idle`] gave it while they live; it ends
/// when it carries none.
pub(crate) struct Hub {
    core: Option<usize>,
    name: String,
    /// The registry it is in (`None`: [`HUBS`]), which it leaves when it retires.
    home: Option<Arc<Hubs>>,
    /// Some session wants the thread (its [`Inner::wanted`] says which, its [`Inner::stop`]
    /// why), or one joined: looked at by the thread before it parks and after each round.
    wanted: AtomicBool,
    /// The thread is parked: whoever wants it unparks it.
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
    /// Sessions that joined and that the thread has not taken yet.
    joining: Mutex<Vec<Joining>>,
    /// Something was put in `joining` since the thread last took it (set before the poke that
    /// tells it): the thread locks `joining` only then, not at every handoff.
    joined: AtomicBool,
}

/// The `Channel`s' dispatcher threads running, by core and name.
static HUBS: Hubs = Mutex::new(Vec::new());

/// Gives `look` to the dispatcher thread named `name` of `home` (an endpoint's progress
/// thread), starting it when it is not running: every [`PARK`] it tries `look`'s lock and, when
/// free, looks at the session ([`IdleLook::idle_look`]), until `look` is gone.
///
/// # Errors
/// UNAVAILABLE when the thread cannot be spawned.
pub(crate) fn watch_idle(home: &Arc<Hubs>, name: &str, look: Weak<dyn IdleLook>) -> Result<(), Status> {
    Hub::enter(Some(home), None, name, |hub| {
        hub.joining.lock().unwrap_or_else(|e| e.into_inner()).push(Joining::Idle(look));
    })
}

impl Hub {
    /// Hands a connected session to the dispatcher thread named `name` on `core` (`NAME-K` on
    /// core K, `NAME` unpinned), starting that thread when it is not running.
    ///
    /// # Errors
    /// UNAVAILABLE when the thread cannot be spawned.
    fn join(core: Option<usize>, name: &str, inner: &Arc<Inner>) -> Result<(), Status> {
        Hub::enter(None, core, name, |hub| {
            let _ = inner.hub.set(hub.clone());
            hub.joining.lock().unwrap_or_else(|e| e.into_inner()).push(Joining::Session(inner.clone()));
        })
    }

    /// Runs `add` (which puts something in the thread's `joining`) on the dispatcher thread
    /// named `name` on `core` in the registry `home` (`None`: [`HUBS`]), starting that thread
    /// when it is not running, and pokes it.
    ///
    /// # Errors
    /// UNAVAILABLE when the thread cannot be spawned.
    fn enter(
        home: Option<&Arc<Hubs>>,
        core: Option<usize>,
        name: &str,
        add: impl FnOnce(&Arc<Hub>),
    ) -> Result<(), Status> {
        // Held until the session is in `joining`: a thread that found itself with no session
        // retires under this lock, so it never retires with one about to join.
        let mut hubs = home.map_or(&HUBS, |h| &**h).lock().unwrap_or_else(|e| e.into_inner());
        let hub = match hubs.iter().find(|h| h.core == core && h.name == name) {
            Some(h) => h.clone(),
            None => {
                let hub = Arc::new(Hub {
                    core,
                    name: name.to_owned(),
                    home: home.cloned(),
                    wanted: AtomicBool::new(false),
                    sleeping: AtomicBool::new(false),
                    thread: OnceLock::new(),
                    joining: Mutex::new(Vec::new()),
                    joined: AtomicBool::new(false),
                });
                let thread_name = match core {
                    Some(k) => format!("{name}-{k}"),
                    None => name.to_owned(),
                };
                let mine = hub.clone();
                let handle = std::thread::Builder::new()
                    .name(thread_name)
                    .spawn(move || {
                        pin(core);
                        Dispatcher::new(mine).run();
                    })
                    .map_err(|e| Status::unavailable(format!("spawning a dispatcher thread: {e}")))?;
                let _ = hub.thread.set(handle.thread().clone());
                // Detached: it ends by itself once it carries no session (joining could block
                // a caller's executor thread).
                drop(handle);
                hubs.push(hub.clone());
                hub
            }
        };
        add(&hub);
        hub.joined.store(true, Ordering::SeqCst);
        hub.poke();
        Ok(())
    }

    /// Tells the thread to look at its sessions' flags; unparks it when it sleeps (true then).
    fn poke(&self) -> bool {
        self.wanted.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
                return true;
            }
        }
        false
    }

    /// Sleeps until poked (or `timeout` passes), unless poked meanwhile.
    fn park(&self, timeout: Duration) {
        self.sleeping.store(true, Ordering::SeqCst);
        // A poke before the flag was visible did not unpark us: look once more.
        if !self.wanted.load(Ordering::SeqCst) {
            std::thread::park_timeout(timeout);
        }
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// The thread carries no session: it leaves the registry and ends, unless one is joining
    /// (then false).
    fn retire(self: &Arc<Self>) -> bool {
        let mut hubs = self.home.as_deref().unwrap_or(&HUBS).lock().unwrap_or_else(|e| e.into_inner());
        if !self.joining.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return false;
        }
        hubs.retain(|h| !Arc::ptr_eq(h, self));
        true
    }
}

/// A session on a dispatcher thread, and the thread's watch over it.
struct Slot {
    inner: Arc<Inner>,
    /// Callers' drives counted at the last look while calls were in flight.
    seen: Option<u64>,
    /// The spacing of those looks ([`WATCH`] to [`WATCH_MAX`]).
    watch: Duration,
    /// When the thread looks at it next (while it does not drive it).
    next: Instant,
    /// Driven by the thread: the callers' drives counted when it began.
    driving: Option<u64>,
}

/// A dispatcher thread: the sessions it carries and what it knows of them.
struct Dispatcher {
    hub: Arc<Hub>,
    slots: Vec<Slot>,
    /// Sessions it only looks at while idle, in rounds every [`PARK`] (dropped once gone).
    idle: IdleLooks,
    /// Slots it drives.
    driving: usize,
    /// The earliest `next` of the slots it does not drive.
    next_look: Instant,
    /// When its idle sessions are looked at next (every [`PARK`], all in one round).
    idle_round: Instant,
    /// Rounds in a row in which no session it drives had work.
    empty: u32,
}

impl Dispatcher {
    fn new(hub: Arc<Hub>) -> Dispatcher {
        let now = Instant::now();
        Dispatcher {
            hub,
            slots: Vec::new(),
            idle: IdleLooks::default(),
            driving: 0,
            next_look: now + PARK,
            idle_round: now + PARK,
            empty: 0,
        }
    }

    /// Callers drive their own calls: the thread sleeps until one leaves work to it (or its
    /// channel is dropped), and looks at each session when its look is due (see
    /// [`Dispatcher::look`]). While it drives sessions, each round steps each of them once (one
    /// busy session does not hold up the others), and the looks of the others go on.
    fn run(mut self) {
        loop {
            if self.driving == 0 {
                let timeout = if self.slots.is_empty() && self.idle.is_empty() {
                    if self.hub.retire() {
                        return;
                    }
                    PARK
                } else {
                    self.next_look.saturating_duration_since(Instant::now())
                };
                if !timeout.is_zero() {
                    self.hub.park(timeout);
                }
            }
            if self.hub.wanted.load(Ordering::Relaxed) && self.hub.wanted.swap(false, Ordering::SeqCst) {
                self.take_wanted();
            }
            if self.driving < self.slots.len() || !self.idle.is_empty() {
                let now = Instant::now();
                if now >= self.next_look {
                    self.looks(now);
                }
            }
            if self.driving > 0 {
                self.drive_round();
            }
        }
    }

    /// Takes the sessions that joined, and drives those that want the thread (or closes those
    /// whose channel is gone).
    #[inline(never)]
    fn take_wanted(&mut self) {
        if self.hub.joined.load(Ordering::Relaxed) && self.hub.joined.swap(false, Ordering::SeqCst) {
            self.take_joined();
        }
        let mut i = 0;
        while i < self.slots.len() {
            let s = &self.slots[i];
            // One it drives keeps its flag until it stops driving it ([`Dispatcher::leave`]).
            if s.driving.is_none()
                && s.inner.wanted.load(Ordering::Relaxed)
                && s.inner.wanted.swap(false, Ordering::SeqCst)
            {
                if s.inner.stop.load(Ordering::Acquire) {
                    if self.close(i) {
                        continue;
                    }
                } else {
                    self.start_driving(i);
                }
            }
            i += 1;
        }
    }

    /// Takes the sessions (and idle looks) that joined the thread; a session is driven at once.
    #[cold]
    fn take_joined(&mut self) {
        let joined = std::mem::take(&mut *self.hub.joining.lock().unwrap_or_else(|e| e.into_inner()));
        for joining in joined {
            let inner = match joining {
                Joining::Session(inner) => inner,
                Joining::Idle(look) => {
                    self.idle.push(look);
                    self.next_look = self.next_look.min(self.idle_round);
                    continue;
                }
            };
            // Driven at once: calls queued while it connected go out.
            inner.wanted.store(true, Ordering::SeqCst);
            let next = self.idle_round;
            self.slots.push(Slot { inner, seen: None, watch: WATCH, next, driving: None });
        }
    }

    fn start_driving(&mut self, i: usize) {
        let s = &mut self.slots[i];
        bump(&s.inner.stats.thread_runs, 1);
        s.inner.contended.store(false, Ordering::Relaxed);
        s.driving = Some(s.inner.stats.caller_drives.load(Ordering::Relaxed));
        self.driving += 1;
        self.empty = 0;
    }

    /// Stops driving slot `i` (its calls are left to their tasks, or it has none): it is
    /// watched again from now. A session handed back to the thread meanwhile (a caller that
    /// drove it left work) is driven again at once.
    fn leave(&mut self, i: usize) {
        let inner = &*self.slots[i].inner;
        if !inner.stop.load(Ordering::Acquire)
            && inner.wanted.load(Ordering::Relaxed)
            && inner.wanted.swap(false, Ordering::SeqCst)
        {
            self.driving -= 1;
            self.start_driving(i);
            return;
        }
        let now = Instant::now();
        if self.idle_round <= now {
            self.idle_round = now + PARK;
        }
        let s = &mut self.slots[i];
        s.driving = None;
        self.driving -= 1;
        s.seen = None;
        s.watch = WATCH;
        let inner = &*s.inner;
        s.next = if inner.stop.load(Ordering::Acquire) {
            // Closed at the next look.
            now
        } else if inner.redialing.load(Ordering::SeqCst) {
            // The attempt's end hands it back ([`Inner::want_driver`]).
            self.idle_round
        } else if !inner.queue.is_empty() || inner.in_flight.load(Ordering::Acquire) > 0 {
            now + WATCH
        } else {
            self.idle_round
        };
        self.next_look = self.next_look.min(s.next);
    }

    /// Ends the calls of slot `i`'s session, whose channel is gone, closes it and drops the
    /// slot (true), unless a caller holds it now (then tried again at its next look).
    #[cold]
    fn close(&mut self, i: usize) -> bool {
        let inner = self.slots[i].inner.clone();
        let g = match inner.session.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let Some(mut g) = g else {
            let next = Instant::now() + WATCH;
            self.slots[i].next = next;
            self.next_look = self.next_look.min(next);
            return false;
        };
        if let Some(mut d) = g.take() {
            d.shut_down(&inner);
        }
        drop(g);
        if self.slots[i].driving.is_some() {
            self.driving -= 1;
        }
        self.slots.swap_remove(i);
        true
    }

    /// Looks at every session it does not drive whose look is due; closes those whose channel
    /// is gone.
    fn looks(&mut self, now: Instant) {
        if now >= self.idle_round {
            self.idle_round = now + PARK;
            self.idle.round();
        }
        let mut i = 0;
        while i < self.slots.len() {
            let s = &self.slots[i];
            if s.driving.is_none() && now >= s.next {
                if s.inner.stop.load(Ordering::Acquire) {
                    if self.close(i) {
                        continue;
                    }
                } else {
                    self.look(i, now);
                }
            }
            i += 1;
        }
        self.next_look = self
            .slots
            .iter()
            .filter(|s| s.driving.is_none())
            .map(|s| s.next)
            .fold(self.idle_round, Instant::min);
    }

    /// One look at a session it does not drive. With calls in flight: it takes over when tasks
    /// wait (or streams are in flight) and no caller drove the session since the last look (a
    /// task that did not come back); otherwise, when no caller drove it either, it looks
    /// ([`idle_look`]: nobody else does), and looks again later, spacing the looks out while
    /// callers keep driving. Idle: an idle look every [`PARK`].
    fn look(&mut self, i: usize, now: Instant) {
        let s = &mut self.slots[i];
        let inner = &*s.inner;
        if inner.redialing.load(Ordering::SeqCst) {
            // Nothing to drive or answer on the broken session; the attempt's end hands it
            // back ([`Inner::want_driver`]).
            s.watch = WATCH;
            s.seen = None;
            s.next = self.idle_round;
            return;
        }
        let busy = !inner.queue.is_empty() || inner.in_flight.load(Ordering::Acquire) > 0;
        // Work no caller's poll will do by itself: tasks waiting (or streams, whose futures
        // never drive: counted as in flight alone).
        let needed = inner.waiters.load(Ordering::SeqCst) > 0 || inner.passive.load(Ordering::Relaxed) > 0;
        let drives = inner.stats.caller_drives.load(Ordering::Relaxed);
        if busy && needed && s.seen == Some(drives) {
            s.seen = None;
            s.watch = WATCH;
            self.start_driving(i);
        } else if busy {
            if s.seen == Some(drives) {
                // Calls in flight that no task waits for and no caller drove since the last
                // look (futures not polled yet, answers not taken): nobody else looks at the
                // session, so this thread does (what arrives is taken; the server's Pings, due
                // while a call is unanswered or, with FLAG_IDLE_PONGS, any time, are answered,
                // else the server would close a session whose caller only waits).
                idle_look(inner);
            }
            if s.seen.is_some() {
                // Looked at since the last look, by callers or by this thread: look again later.
                s.watch = (s.watch * 2).min(WATCH_MAX);
            }
            s.seen = Some(drives);
            s.next = now + s.watch;
        } else {
            s.watch = WATCH;
            s.seen = None;
            idle_look(inner);
            s.next = self.idle_round;
        }
    }

    /// One step of each session it drives; after a round with no work anywhere, spins, and
    /// after the most eager of their `spins` empty rounds waits per the most eager of their
    /// polling policies ([`Dispatcher::wait`]).
    fn drive_round(&mut self) {
        let mut work = 0;
        for i in 0..self.slots.len() {
            if let Some(callers) = self.slots[i].driving {
                match drive_step(&self.slots[i].inner, callers) {
                    Some(w) => work += w,
                    None => self.leave(i),
                }
            }
        }
        if work > 0 || self.driving == 0 {
            self.empty = 0;
            return;
        }
        self.empty = self.empty.saturating_add(1);
        let (spins, policy) = self.eagerest();
        if self.empty < spins {
            if self.empty % YIELD_EVERY == 0 {
                // Nothing came for a while: let a thread that shares this core run (on the
                // benchmark's 2 cores, the server's worker or the runtime's thread, whose work
                // is what we wait for).
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return;
        }
        match policy {
            PollingPolicy::Busy => std::hint::spin_loop(),
            PollingPolicy::SpinThenYield { .. } => std::thread::yield_now(),
            PollingPolicy::Event { .. } => self.wait(),
        }
    }

    /// The most `spins` and the most eager polling policy (busy, then yield, then events) of
    /// the sessions it drives: a thread that serves several spins as much as the most eager
    /// of them asked.
    fn eagerest(&self) -> (u32, PollingPolicy) {
        let mut spins = 0;
        let mut policy = PollingPolicy::Event { spins: 0 };
        for s in self.slots.iter().filter(|s| s.driving.is_some()) {
            spins = spins.max(s.inner.spins);
            policy = match (policy, s.inner.policy) {
                (PollingPolicy::Busy, _) | (_, PollingPolicy::Busy) => PollingPolicy::Busy,
                (p @ PollingPolicy::SpinThenYield { .. }, _)
                | (_, p @ PollingPolicy::SpinThenYield { .. }) => p,
                (p, _) => p,
            };
        }
        (spins, policy)
    }

    /// The event wait of a thread whose driven sessions had nothing for a while (after each
    /// wait, and what came before it, deadlines are looked at too). Driving one session: arms
    /// its CQ, lets the session go and blocks on its completion channel, for at most
    /// [`EVENT_WAIT`] when it is the thread's only session and [`SHARED_WAIT`] otherwise (the
    /// others' handoffs and looks wait for the end of it); a caller's poll meanwhile drives
    /// the session itself. Driving several: parks for at most [`SHARED_WAIT`] (a handoff
    /// unparks it; their completions are seen at the end of it).
    fn wait(&mut self) {
        let one = self.driving == 1;
        let mut armed = None;
        for i in 0..self.slots.len() {
            if self.slots[i].driving.is_none() {
                continue;
            }
            let inner = &*self.slots[i].inner;
            let Some(mut g) = inner.try_session() else {
                // A caller holds it: it drives.
                self.leave(i);
                continue;
            };
            let d = g.as_mut().expect("checked by try_session");
            // Completions the arming poll took (their calls are finished now: no step
            // follows before the wait).
            let mut polled = 0;
            if one {
                armed = d.core.arm_cq();
                polled = armed.as_ref().map_or(0, |a| a.0);
            }
            // A full look (deadlines, dropped futures, streams) only when there is something
            // for it: the step before the wait found nothing else to do.
            let full = d.wants_look(inner);
            if full || polled > 0 {
                d.finish_calls(inner, full);
            }
            let batch = d.take_wakers();
            drop(g);
            wake_all(batch);
            if !one {
                bump(&inner.stats.event_waits, 1);
            }
        }
        if one {
            if let Some((0, cq)) = armed {
                if let Some(s) = self.slots.iter().find(|s| s.driving.is_some()) {
                    bump(&s.inner.stats.event_waits, 1);
                }
                // Outside the session: a caller's poll meanwhile drives it itself (its calls go
                // out at once, not after this wait).
                cq.wait(if self.slots.len() == 1 { EVENT_WAIT } else { SHARED_WAIT });
            }
        } else if self.driving > 0 {
            self.hub.park(SHARED_WAIT);
        }
    }
}

/// One step of a session the dispatcher thread drives. `None`: it stops driving it (nothing
/// queued or in flight, a caller holds it, or the tasks woken last are to drive it: `owed`),
/// else the work done. `callers`: the callers' drives counted when it began.
fn drive_step(inner: &Arc<Inner>, callers: u64) -> Option<usize> {
    if inner.stop.load(Ordering::Acquire) || inner.redialing.load(Ordering::SeqCst) {
        // (Reconnecting: the calls queued wait for the attempt, whose end hands the session
        // back.)
        return None;
    }
    // A caller holding the session leaves it to someone when it lets go.
    let mut g = inner.try_session()?;
    if inner.redial_wanted.load(Ordering::Relaxed) {
        // A connect blocks: not on this thread, which carries other sessions.
        drop(g);
        spawn_redial(inner);
        return None;
    }
    let d = g.as_mut().expect("checked by try_session");
    d.delivered = 0;
    let work = d.step(inner, false);
    // Tasks whose calls finished (woken now, or queued since an earlier wake).
    let delivered = std::mem::take(&mut d.delivered) > 0;
    let calls = d.has_calls() || !inner.queue.is_empty();
    // Messages to post with no call in flight: no task drives for them, this thread does
    // until they are posted.
    let unowned = !calls && d.owes_sends();
    let needed = d.passive > 0 || inner.waiters.load(Ordering::SeqCst) > 0;
    let batch = d.take_wakers();
    bump_held(&inner.stats.thread_drives, 1);
    bump_held(&inner.stats.empty_steps, u64::from(work == 0));
    bump_held(&inner.stats.wakes, batch.len() as u64);
    drop(g);
    let woke = !batch.is_empty() || delivered;
    wake_all(batch);
    if !calls && !unowned {
        return None;
    }
    // A caller that found the session held drives it now, and one that drove it between two
    // steps will again (its task runs: it leaves the session to the tasks it wakes, or hands it
    // back); with no task waiting (and no stream in flight) the calls' own polls drive them.
    let contended = inner.contended.swap(false, Ordering::Relaxed)
        || inner.stats.caller_drives.load(Ordering::Relaxed) != callers;
    if contended && unowned {
        // The caller drives it now and hands back what it leaves unposted.
        return None;
    }
    if (woke || contended || !needed) && !unowned {
        // The tasks just woken drive it when polled (each poll of a call takes the session if
        // it is owed); they want us back if they leave work.
        inner.owed.store(true, Ordering::Release);
        return None;
    }
    Some(work)
}

/// Reconnects a session on a thread of its own (the TCP connect and the handshake block, and
/// the dispatcher thread carries other sessions), which then hands the session back to the
/// dispatcher thread. One at a time per session ([`Inner::redialing`]).
///
/// The session's lock is held only to begin the attempt ([`Driver::begin_redial`]) and to end
/// it ([`Driver::end_redial`]), not across the connect (up to `ClientConfig::connect_timeout`):
/// meanwhile callers' polls, [`Inner::counters`] and the dispatcher thread take the broken
/// session as before (calls queued wait for the attempt), and a channel dropped meanwhile is
/// closed at once ([`Dispatcher::close`]); the attempt then finds its channel gone and closes
/// the new session.
#[cold]
#[inline(never)]
fn spawn_redial(inner: &Arc<Inner>) {
    if inner.redialing.swap(true, Ordering::SeqCst) {
        return;
    }
    let mine = inner.clone();
    let spawned = std::thread::Builder::new().name("rpc-redial".into()).spawn(move || {
        let attempt = {
            let mut g = mine.session.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_mut() {
                Some(d)
                    if !mine.stop.load(Ordering::Acquire)
                        && mine.redial_wanted.swap(false, Ordering::SeqCst) =>
                {
                    let attempt = d.begin_redial(&mine);
                    let batch = d.take_wakers();
                    drop(g);
                    wake_all(batch);
                    attempt
                }
                _ => None,
            }
        };
        if let Some(attempt) = attempt {
            let t = &*attempt.target;
            let connected = AnyCore::connect(&t.addrs[..], &t.config, &t.endpoint);
            let mut g = mine.session.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_mut() {
                Some(d) if !mine.stop.load(Ordering::Acquire) => d.end_redial(&mine, attempt, connected),
                _ => {
                    // The channel is gone (its session closed, or closed soon by the dispatcher
                    // thread, which ends the calls queued): the new session goes too.
                    drop(g);
                    if let Ok(mut core) = connected {
                        with_any_core!(&mut core, c => c.close());
                    }
                }
            }
        }
        mine.redialing.store(false, Ordering::SeqCst);
        // The calls queued for it go out (or learn the backoff).
        mine.want_driver();
    });
    if let Err(e) = spawned {
        inner.redialing.store(false, Ordering::SeqCst);
        inner.redial_wanted.store(false, Ordering::SeqCst);
        fail_queued(inner, &Status::unavailable(format!("spawning a thread to reconnect: {e}")));
    }
}

/// A session nobody else looks at (idle: once every [`PARK`]; with calls in flight that no task
/// waits for and no caller drove: once per look, at most [`WATCH_MAX`] apart): what arrived is
/// handled, so the server's probe gets its Pong (the handshake promised it while idle:
/// [`FLAG_IDLE_PONGS`]), answers wait for their callers, and a broken session is seen. One poll
/// of the CQ, no system call on the software NIC; starting calls is left to their callers.
fn idle_look(inner: &Inner) {
    let Some(mut g) = inner.try_session() else { return };
    let d = g.as_mut().expect("checked by try_session");
    // A look weighs as a poll that slept (`ClientCore::idle_step`): the control connection is
    // read every 16 looks (800 ms), so a session the server ended by closing that alone is seen
    // broken while idle (a balanced channel's watcher told), not 4096 looks (200 s) later.
    if with_any_core!(&mut d.core, c => c.idle_step(1)) > 0 {
        // A call started meanwhile may have finished: its task is woken as after any step.
        d.finish_calls(inner, true);
    }
    if let Some(w) = &inner.watch {
        // A balanced channel stops picking a server whose session broke while idle: told once
        // per break (its watcher keeps the server down until it connects a new channel, after
        // its own backoff), not at every look.
        if !d.told_broken {
            if let Some(s) = with_any_core!(&d.core, c => c.broken()) {
                d.told_broken = true;
                let peer = with_any_core!(&d.core, c => c.peer);
                tracing::debug!(%peer, why = s.message(), "channel: idle session found broken");
                w.failed(s);
            }
        }
    }
    let batch = d.take_wakers();
    drop(g);
    wake_all(batch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A session that counts its looks and says whether it is busy.
    struct Counted {
        looks: AtomicU32,
        busy: AtomicBool,
        /// The `rounds` of its last look.
        rounds: AtomicU32,
    }

    impl IdleLook for Counted {
        fn idle_look(&self, rounds: u32) -> bool {
            self.looks.fetch_add(1, Ordering::Relaxed);
            self.rounds.store(rounds, Ordering::Relaxed);
            self.busy.load(Ordering::Relaxed)
        }
    }

    fn counted(busy: bool) -> Arc<Counted> {
        Arc::new(Counted { looks: AtomicU32::new(0), busy: AtomicBool::new(busy), rounds: AtomicU32::new(0) })
    }

    /// An idle session's looks space out (4 looks every round, 4 every 2nd, 4 every 4th, then
    /// every 8th: 16 looks in 60 rounds, the last standing for 8 rounds), a busy one is looked at
    /// every round, and once the idle one turns busy its looks come 4, 2, then 1 round apart.
    /// Sabotaged (`spacing` always 1): "an idle session's looks in 60 rounds: 60".
    #[test]
    fn an_idle_sessions_looks_space_out_and_a_busy_look_brings_them_back() {
        let (idle, busy) = (counted(false), counted(true));
        let mut looks = IdleLooks::default();
        looks.push(Arc::downgrade(&(idle.clone() as Arc<dyn IdleLook>)));
        looks.push(Arc::downgrade(&(busy.clone() as Arc<dyn IdleLook>)));
        for _ in 0..60 {
            looks.round();
        }
        let n = idle.looks.load(Ordering::Relaxed);
        assert_eq!(n, 4 + 4 + 4 + 4, "an idle session's looks in 60 rounds: {n}");
        assert_eq!(idle.rounds.load(Ordering::Relaxed), 8, "the last look stood for 8 rounds");
        assert_eq!(busy.looks.load(Ordering::Relaxed), 60, "a busy session is looked at every round");
        // Something arrives: the next due look finds it busy (within 8 rounds: 400 ms), the
        // looks after it come 4, 2, then 1 round apart.
        idle.busy.store(true, Ordering::Relaxed);
        for _ in 0..8 {
            looks.round();
        }
        let n = idle.looks.load(Ordering::Relaxed);
        assert_eq!(n, 17, "a look within 8 rounds of the session turning busy");
        for _ in 0..7 {
            looks.round();
        }
        let n = idle.looks.load(Ordering::Relaxed);
        assert_eq!(n, 20, "busy looks 4, 2 and 1 round after it");
        for _ in 0..10 {
            looks.round();
        }
        let n = idle.looks.load(Ordering::Relaxed);
        assert_eq!(n, 30, "a busy session's looks every round again");
    }

    /// A session whose client is gone is dropped at its next look, even while its looks are
    /// spaced out.
    #[test]
    fn a_gone_session_is_dropped_at_its_next_look() {
        let idle = counted(false);
        let mut looks = IdleLooks::default();
        looks.push(Arc::downgrade(&(idle.clone() as Arc<dyn IdleLook>)));
        for _ in 0..40 {
            looks.round();
        }
        drop(idle);
        for _ in 0..8 {
            looks.round();
        }
        assert!(looks.is_empty(), "the gone session is still there after 8 rounds");
    }
}
