//! The shareable client handle: [`Channel`], in tonic's `Channel` shape.
//!
//! `Clone + Send + Sync`; its calls are futures that are `Send + 'static`, so any task of a
//! multi-thread runtime (tokio or another) may call through one handle at once, with calls from
//! all of them pipelined on the same sessions. Kernel bypass stays: behind the handle, each
//! dispatcher ([`ChannelConfig::dispatchers`]) has a session to the server (its QP, CQ, SRQ and
//! rings, as a [`crate::Client`] does), carried by the process's dispatcher thread of its core
//! (one per core of [`ChannelConfig::core_ids`], one for the unpinned sessions), which drives
//! every session of every channel placed there. A call made while its
//! dispatcher's session is free starts there and then: its request is encoded straight into the
//! session's registered memory (one encoding, no heap copy) in the caller's thread; otherwise it
//! goes to the dispatcher through a bounded lock-free queue. Whoever holds the dispatcher's
//! session drives it: the poll of a call, when the session is free, takes the queued calls,
//! encodes each request the same way, rings one doorbell for all calls started since, polls
//! the CQ and hands finished calls to their tasks ("combining": the call goes out and its answer
//! comes back on the caller's own thread, no hop between threads); otherwise the dispatcher
//! thread does. A completion wakes exactly the task that waits for it (nothing wakes itself). A
//! poll drives for at most [`ChannelConfig::poll_spin`] without a completion (a reply that is not
//! imminent is left to the dispatcher thread, which busy-polls while it has work and falls back
//! to completion events when idle: see [`ChannelConfig::client`]).
//!
//! Dropping a call's future cancels the call: its slot is released and its late answer
//! discarded. Neither [`Channel::connect`] nor dropping blocks an executor thread: sessions are
//! opened on threads of their own, and the last handle's drop only flags them to close (their
//! dispatcher thread closes them).
//!
//! For the lowest latency from one thread, [`crate::Client`] drives its session in the calling
//! thread (no hop between threads).

pub(crate) mod call;
pub(crate) mod dispatcher;
pub(crate) mod stream;
#[cfg(feature = "tower")]
pub mod tower;

use std::future::Future;
use std::net::ToSocketAddrs;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use prost::Message;

use crate::client::{CallOptions, ClientConfig, IntoRequest};
use crate::config::PollingPolicy;
use crate::dispatch::service::MethodId;
use crate::metadata::{Metadata, WithMetadata};
use crate::status::Status;
use call::{Completion, Job, Queued, UnaryJob};
use dispatcher::Inner;
pub use stream::{ClientStreamCall, StreamReceiver, StreamSender, STREAM_QUEUE};
#[cfg(feature = "tower")]
pub use tower::UnaryService;

/// The connection outcomes a connecting channel waits for, one per dispatcher.
type Pending = Vec<Arc<Completion<Result<(), Status>>>>;

/// Configuration of a [`Channel`]. Every field has a documented default.
#[derive(Clone, Debug)]
pub struct ChannelConfig {
    /// Each dispatcher's session: transport, window (calls in flight per session), rings,
    /// limits, and the polling policy of the dispatcher when it has calls in flight and nothing
    /// to do (after [`ChannelConfig::spins`] empty loops): [`PollingPolicy::Event`] arms the CQ
    /// and sleeps on its completion channel without holding the session (at most 1 ms at a
    /// time; a call made meanwhile is driven by its own poll), `SpinThenYield` yields, `Busy`
    /// spins. Default
    /// `ClientConfig::default()` with `polling = Event { spins: 0 }`.
    pub client: ClientConfig,
    /// Dispatchers, each with its own session to the server and its own queue; calls are
    /// spread round robin. Each session runs on the dispatcher thread of its core (see
    /// [`ChannelConfig::core_ids`]), which it shares with every other channel's sessions
    /// there: several dispatchers on one core share its thread. Default 1; 1 ..= 64.
    pub dispatchers: usize,
    /// Cores of the dispatchers (dispatcher `i` on `core_ids[i % len]`, ids as
    /// `core_affinity` numbers them): its session runs on the process's dispatcher thread
    /// pinned to that core, one per core; empty = on the one unpinned dispatcher thread.
    /// Default empty.
    pub core_ids: Vec<usize>,
    /// Calls that may wait in each dispatcher's queue (beyond the session's window); a caller
    /// that finds it full waits (its future stays pending) until there is room. Default 1024;
    /// 1 ..= 1 048 576.
    pub queue_depth: usize,
    /// Empty loops a dispatcher spins before it waits per the polling policy (or, with nothing
    /// in flight, parks until a call comes). Default 20 000 (tens of µs).
    pub spins: u32,
    /// Name of the dispatcher threads (`NAME` unpinned, `NAME-K` pinned to core K). Channels
    /// of the same name share them: every session of every such channel on a core runs on
    /// that core's one thread (a thread starts with the first session placed there and ends
    /// with the last). A channel of another name gets threads of its own. Default
    /// `rpc-dispatch`.
    pub thread_name: String,
    /// How long the poll of a call may drive the session (post, poll the CQ, complete calls) while
    /// no completion comes, waiting for its reply before it returns `Pending` and leaves the
    /// session to the dispatcher thread. The clock restarts at each completion, so a poll keeps
    /// driving while replies flow; a reply that is not imminent (a slow handler) costs the
    /// executor thread this much once. `Duration::ZERO`: one step per poll. Default 20 µs;
    /// at most 1 ms.
    pub poll_spin: Duration,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            client: ClientConfig::default().polling(PollingPolicy::Event { spins: 0 }),
            dispatchers: 1,
            core_ids: Vec::new(),
            queue_depth: 1024,
            spins: 20_000,
            thread_name: "rpc-dispatch".into(),
            poll_spin: Duration::from_micros(20),
        }
    }
}

impl ChannelConfig {
    /// See [`ChannelConfig::client`].
    pub fn client(mut self, v: ClientConfig) -> Self {
        self.client = v;
        self
    }
    /// See [`ChannelConfig::dispatchers`].
    pub fn dispatchers(mut self, v: usize) -> Self {
        self.dispatchers = v;
        self
    }
    /// See [`ChannelConfig::core_ids`].
    pub fn core_ids(mut self, v: Vec<usize>) -> Self {
        self.core_ids = v;
        self
    }
    /// See [`ChannelConfig::queue_depth`].
    pub fn queue_depth(mut self, v: usize) -> Self {
        self.queue_depth = v;
        self
    }
    /// See [`ChannelConfig::spins`].
    pub fn spins(mut self, v: u32) -> Self {
        self.spins = v;
        self
    }
    /// See [`ChannelConfig::thread_name`].
    pub fn thread_name(mut self, v: impl Into<String>) -> Self {
        self.thread_name = v.into();
        self
    }
    /// See [`ChannelConfig::poll_spin`].
    pub fn poll_spin(mut self, v: Duration) -> Self {
        self.poll_spin = v;
        self
    }

    pub(crate) fn check(&self) -> Result<(), Status> {
        if !(1..=64).contains(&self.dispatchers) {
            return Err(Status::invalid_argument(format!(
                "ChannelConfig::dispatchers {} is not in 1..=64",
                self.dispatchers
            )));
        }
        if !(1..=1 << 20).contains(&self.queue_depth) {
            return Err(Status::invalid_argument(format!(
                "ChannelConfig::queue_depth {} is not in 1..=1048576",
                self.queue_depth
            )));
        }
        if self.poll_spin > Duration::from_millis(1) {
            return Err(Status::invalid_argument(format!(
                "ChannelConfig::poll_spin {:?} is over 1 ms",
                self.poll_spin
            )));
        }
        Ok(())
    }
}

/// Told when a call through a channel ends UNAVAILABLE (or its dispatcher finds its session
/// broken while idle): how a balanced channel ([`crate::balance`]) learns that one of its
/// per-server channels lost its server. Called on the error path only.
pub(crate) trait Watch: Send + Sync {
    /// A call ended with `status` (any code; the watcher picks what it cares about).
    fn failed(&self, status: &Status);
}

/// What the handles share; its drop (the last handle and the last call gone) stops the
/// dispatchers.
pub(crate) struct Shared {
    dispatchers: Vec<Arc<Inner>>,
    next: AtomicUsize,
    /// `ClientConfig::interceptor` of the channel's sessions.
    interceptor: Option<crate::metadata::ClientInterceptor>,
    /// A balanced channel: its calls go to the per-server channels its balancer picks
    /// (`dispatchers` is empty then).
    balance: Option<Arc<crate::balance::Balancer>>,
    /// A balanced channel's per-server channel: told of its failed calls.
    watch: Option<Arc<dyn Watch>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for d in &self.dispatchers {
            d.close();
        }
    }
}

/// A shareable handle to a server (see the module docs). Cheap to clone.
///
/// ```
/// fn shareable<T: Clone + Send + Sync + 'static>() {}
/// shareable::<rpc_core::Channel>();
/// ```
#[derive(Clone)]
pub struct Channel {
    shared: Arc<Shared>,
    /// `ClientConfig::observe` (the shared one; off in the plain handle an observed call makes).
    observe: crate::Observe,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").field("dispatchers", &self.shared.dispatchers.len()).finish()
    }
}

impl Channel {
    /// Connects with [`ChannelConfig::default`]: opens one session per dispatcher, each on a
    /// short-lived thread of its own (resolving `addr`, TCP connect and handshake happen there,
    /// so awaiting this does not block the executor thread), then hands it to its dispatcher
    /// thread.
    ///
    /// # Errors
    /// As [`crate::Client::connect`].
    ///
    /// # Cancel safety
    /// Cancel-safe in the sense that nothing is lost: dropping the future before it completes
    /// (another `tokio::select!` branch won) stops the dispatchers it started and closes their
    /// sessions; a later connect starts afresh.
    pub async fn connect<A>(addr: A) -> Result<Channel, Status>
    where
        A: ToSocketAddrs + Clone + Send + 'static,
    {
        Channel::connect_with(addr, &ChannelConfig::default()).await
    }

    /// Connects with `config` (see [`Channel::connect`]).
    ///
    /// # Errors
    /// As [`crate::Client::connect_with`]; INVALID_ARGUMENT for a configuration value out of
    /// range (named).
    ///
    /// # Cancel safety
    /// As [`Channel::connect`]: dropping the future stops what it started.
    pub async fn connect_with<A>(addr: A, config: &ChannelConfig) -> Result<Channel, Status>
    where
        A: ToSocketAddrs + Clone + Send + 'static,
    {
        let (channel, pending) = Channel::start(addr, config, None)?;
        for c in pending {
            WaitCompletion(&c).await?;
        }
        Ok(channel)
    }

    /// [`Channel::connect_with`] for a thread that is not an executor's: blocks until the
    /// sessions are open.
    ///
    /// # Errors
    /// As [`Channel::connect_with`].
    pub fn connect_blocking<A>(addr: A, config: &ChannelConfig) -> Result<Channel, Status>
    where
        A: ToSocketAddrs + Clone + Send + 'static,
    {
        let (channel, pending) = Channel::start(addr, config, None)?;
        for c in pending {
            block_on(&c)?;
        }
        Ok(channel)
    }

    /// Starts the dispatchers (each connects on its own thread); the outcomes come in the
    /// returned completions. `watch` is told of failed calls (a balanced channel's per-server
    /// channel).
    pub(crate) fn start<A>(
        addr: A,
        config: &ChannelConfig,
        watch: Option<Arc<dyn Watch>>,
    ) -> Result<(Channel, Pending), Status>
    where
        A: ToSocketAddrs + Clone + Send + 'static,
    {
        config.check()?;
        let mut dispatchers = Vec::with_capacity(config.dispatchers);
        let mut pending = Vec::with_capacity(config.dispatchers);
        for i in 0..config.dispatchers {
            let connected = Arc::new(Completion::new());
            let setup = dispatcher::Setup {
                addr: addr.clone(),
                client: config.client.clone(),
                queue_depth: config.queue_depth,
                core_id: (!config.core_ids.is_empty()).then(|| config.core_ids[i % config.core_ids.len()]),
                name: config.thread_name.clone(),
                spins: config.spins,
                poll_spin: config.poll_spin,
                watch: watch.clone(),
            };
            match dispatcher::spawn(setup, connected.clone()) {
                Ok(d) => {
                    dispatchers.push(d);
                    pending.push(connected);
                }
                Err(s) => {
                    // Stops the dispatchers spawned so far.
                    drop(Shared {
                        dispatchers,
                        next: AtomicUsize::new(0),
                        interceptor: None,
                        balance: None,
                        watch: None,
                    });
                    return Err(s);
                }
            }
        }
        let interceptor = config.client.interceptor.clone();
        let observe = config.client.observe;
        let shared = Shared { dispatchers, next: AtomicUsize::new(0), interceptor, balance: None, watch };
        Ok((Channel { shared: Arc::new(shared), observe }, pending))
    }

    /// A channel whose calls go to the per-server channels `balancer` picks.
    pub(crate) fn over(balancer: Arc<crate::balance::Balancer>) -> Channel {
        let shared = Shared {
            dispatchers: Vec::new(),
            next: AtomicUsize::new(0),
            interceptor: None,
            balance: Some(balancer),
            watch: None,
        };
        Channel { shared: Arc::new(shared), observe: crate::Observe::OFF }
    }

    /// The balancer of a balanced channel ([`Channel::balanced`]); `None` for a channel to one
    /// server.
    pub fn balancer(&self) -> Option<&Arc<crate::balance::Balancer>> {
        self.shared.balance.as_ref()
    }

    /// A call that ended before it started (a balanced channel with no server to pick).
    pub(crate) fn failed_call<Resp: Send + 'static>(&self, status: Status) -> UnaryCall<Resp> {
        let job = UnaryJob::<(), Resp>::new_or_spare();
        job.done.complete(Err(status));
        UnaryCall::new(job, None, self.shared.clone(), usize::MAX)
    }

    /// A unary call: the future resolves to the response. The request is encoded into the
    /// dispatcher's registered memory at once when its session is free (nothing queued, a slot
    /// and room free), or else queued to the dispatcher, and then encoded by whoever drives its
    /// session next (this call's poll, another call's, or the dispatcher thread); it is sent
    /// with the next step of whoever drives. Dropping the future cancels the call (its slot is
    /// released; a late answer is discarded).
    ///
    /// `req` is the message or a reference to it ([`IntoRequest`]); a queued call keeps the
    /// message (a reference is cloned then, and only then).
    ///
    /// The future is `Send + 'static` and resolves with the server's status, DEADLINE_EXCEEDED
    /// after `opts`' deadline, UNAVAILABLE when the session is gone (or the channel was dropped
    /// while the call was queued), RESOURCE_EXHAUSTED for a body over a limit (named).
    pub fn unary<Req, Resp>(
        &self,
        id: MethodId,
        req: impl IntoRequest<Req>,
        opts: &CallOptions,
    ) -> UnaryCall<Resp>
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        if let Some(b) = &self.shared.balance {
            return self.unary_balanced(b, id, req, opts);
        }
        if self.observe.any() {
            return self.unary_observed(id, req, opts);
        }
        self.unary_plain(id, req, opts)
    }

    /// [`Channel::unary`] with `ClientConfig::observe` on: a span and metrics around the call,
    /// `traceparent` in its metadata ([`crate::observe`]).
    #[cold]
    #[inline(never)]
    fn unary_observed<Req, Resp>(
        &self,
        id: MethodId,
        req: impl IntoRequest<Req>,
        opts: &CallOptions,
    ) -> UnaryCall<Resp>
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let opts = IntoRequest::options(&req, opts);
        let (obs, traced) = self.observe_call(id, IntoRequest::message(&req).encoded_len(), &opts);
        let opts = traced.map_or(opts, std::borrow::Cow::Owned);
        // The plain call through a handle with observation off (one copy of the hot path).
        let plain = Channel { shared: self.shared.clone(), observe: crate::Observe::OFF };
        let mut call = {
            let _entered = obs.enter();
            plain.unary(id, IntoRequest::into_message(req), &opts)
        };
        let size: fn(&Resp) -> usize = |m| m.encoded_len();
        let mut obs = obs;
        obs.sent();
        call.observed = Some(Box::new((obs, size)));
        call
    }

    /// Starts the observation of a call or stream of `id` with a request of `req_bytes`, and,
    /// for a traced one, the options that carry its `traceparent` (only a traced call sends
    /// more metadata than it was given).
    #[cold]
    pub(crate) fn observe_call(
        &self,
        id: MethodId,
        req_bytes: usize,
        opts: &CallOptions,
    ) -> (crate::observe::Observed, Option<CallOptions>) {
        let traced = self.observe.is_tracing();
        let mut md = if traced { opts.metadata().cloned().unwrap_or_default() } else { Metadata::new() };
        let peer = || self.shared.dispatchers.first().and_then(|d| d.peer());
        let obs = crate::observe::Observed::client(self.observe, id, &mut md, req_bytes, peer);
        (obs, traced.then(|| opts.clone().with_metadata(md)))
    }

    /// [`Channel::unary`] on a channel to one server (its only caller: inlined there).
    #[inline(always)]
    fn unary_plain<Req, Resp>(
        &self,
        id: MethodId,
        req: impl IntoRequest<Req>,
        opts: &CallOptions,
    ) -> UnaryCall<Resp>
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let n = self.shared.dispatchers.len();
        let dispatcher = if n == 1 { 0 } else { self.shared.next.fetch_add(1, Ordering::Relaxed) % n };
        let d = &*self.shared.dispatchers[dispatcher];
        // A `Request`'s metadata goes with the call.
        let opts = &*IntoRequest::options(&req, opts);
        let timeout = opts.effective_timeout();
        let make = |failed: Option<Status>| {
            let job = UnaryJob::<Req, Resp>::new_or_spare();
            if let Some(s) = failed {
                job.done.complete(Err(s));
            }
            job
        };
        // The caller's metadata is borrowed (its `Arc` cloned only for a queued call, which keeps
        // it); an interceptor's is made per call.
        let intercepted;
        let metadata = match &self.shared.interceptor {
            None => opts.metadata_arc(),
            Some(_) => match self.metadata(opts) {
                Ok(m) => {
                    intercepted = m;
                    intercepted.as_ref()
                }
                Err(s) => return UnaryCall::new(make(Some(s)), None, self.shared.clone(), dispatcher),
            },
        };
        // With the session free, the call starts here (no queue, nothing kept of the request).
        let first = WithMetadata::new(IntoRequest::message(&req), metadata.map(|m| &**m));
        if let Some(job) = d.start_now(id, &first, first.flags(), timeout, opts.capture(), make) {
            return UnaryCall::new(job, None, self.shared.clone(), dispatcher);
        }
        let mut job = UnaryJob::<Req, Resp>::new_or_spare();
        // The deadline counts from now, not from when a dispatcher takes the call from the queue.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let capture = opts.capture().cloned();
        let metadata = metadata.cloned();
        let q = Queued { method: id, deadline, req: IntoRequest::into_message(req), metadata, capture };
        match Arc::get_mut(&mut job) {
            Some(j) => *j.request.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(q),
            None => *job.request.lock().unwrap_or_else(|e| e.into_inner()) = Some(q),
        }
        let submit: Arc<dyn Job> = job.clone();
        let mut call = UnaryCall::new(job, Some(submit), self.shared.clone(), dispatcher);
        call.try_queue();
        call
    }

    /// The metadata a call with `opts` sends (the interceptor run on it, if any): shared, since
    /// a queued call keeps it.
    pub(crate) fn metadata(&self, opts: &CallOptions) -> Result<Option<Arc<Metadata>>, Status> {
        match &self.shared.interceptor {
            None => Ok(opts.metadata_arc().cloned()),
            Some(i) => {
                let md = crate::metadata::run_interceptor(opts.metadata(), i)?;
                Ok((!md.is_empty()).then(|| Arc::new(md)))
            }
        }
    }

    /// [`Channel::unary`] of a balanced channel: on the channel of the server the balancer picks
    /// (out of line: the single-server path stays as small as it was).
    #[cold]
    #[inline(never)]
    fn unary_balanced<Req, Resp>(
        &self,
        b: &crate::balance::Balancer,
        id: MethodId,
        req: impl IntoRequest<Req>,
        opts: &CallOptions,
    ) -> UnaryCall<Resp>
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        match b.pick(opts.key()) {
            Ok(server) => server.unary(id, req, opts),
            Err(s) => self.failed_call(s),
        }
    }

    /// The load the server last reported on a response (its requests admitted and not yet
    /// answered, the highest over the dispatchers' sessions), and a count that moves with each
    /// report; `None` before any.
    pub(crate) fn reported_load(&self) -> Option<(u32, u64)> {
        let mut out: Option<(u32, u64)> = None;
        for d in &self.shared.dispatchers {
            let l = d.load.load(Ordering::Relaxed);
            if l != u32::MAX {
                let seq = d.load_seq.load(Ordering::Relaxed);
                out = Some(out.map_or((l, seq), |(m, s)| (m.max(l), s + seq)));
            }
        }
        out
    }

    /// Calls started and not yet finished or dropped, over all dispatchers (as the dispatchers
    /// last published it; calls still in a queue are not counted).
    pub fn in_flight(&self) -> usize {
        if let Some(b) = &self.shared.balance {
            return b.channels().iter().map(Channel::in_flight).sum();
        }
        self.shared.dispatchers.iter().map(|d| d.in_flight.load(Ordering::Acquire)).sum()
    }

    /// Calls started so far (request encoded into the session's registered memory and posted)
    /// by the polls of calls on the callers' threads, and by the dispatcher threads, over all
    /// dispatchers. With the session free, a call's own poll starts it (no hop between threads);
    /// a dispatcher thread starts the calls queued while it drives a wait no caller stayed for.
    pub fn calls_started(&self) -> (u64, u64) {
        if let Some(b) = &self.shared.balance {
            return b
                .channels()
                .iter()
                .map(Channel::calls_started)
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        }
        self.shared.dispatchers.iter().map(|d| d.started()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// How the channel's sessions were driven so far, summed over the dispatchers (see
    /// [`ChannelStats`]): for finding where a workload's time goes (drives per call, handoffs
    /// to the dispatcher threads, their wake-ups and unparks), not for a hot path.
    /// A balanced channel's are the sum over its per-server channels.
    pub fn stats(&self) -> ChannelStats {
        let mut t = ChannelStats::default();
        if let Some(b) = &self.shared.balance {
            for ch in b.channels() {
                t.add(&ch.stats());
            }
        }
        for d in &self.shared.dispatchers {
            let s = &d.stats;
            let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
            let (by_callers, by_threads) = d.started();
            t.started_by_callers += by_callers;
            t.started_by_threads += by_threads;
            t.caller_drives += l(&s.caller_drives);
            t.caller_busy += l(&s.caller_busy);
            t.thread_drives += l(&s.thread_drives);
            t.thread_runs += l(&s.thread_runs);
            t.handoffs += l(&s.handoffs);
            t.unparks += l(&s.unparks);
            t.wakes += l(&s.wakes);
            t.steps += l(&s.steps) + l(&s.thread_drives);
            t.empty_steps += l(&s.empty_steps);
            t.event_waits += l(&s.event_waits);
            t.in_flight_at_start += l(&s.in_flight_at_start);
        }
        t
    }

    /// Reconnect attempts the channel's dispatchers made (successful or not), summed. A
    /// dispatcher whose session broke (the server closed it, restarted, or stopped answering)
    /// reconnects when a call is made after the break, as [`crate::Client`] does: at once for the
    /// first attempt, then no sooner than `ClientConfig::reconnect_*`'s backoff allows; a call
    /// made meanwhile ends UNAVAILABLE naming why the session broke and when the next attempt
    /// may be made. Calls in flight when it broke end UNAVAILABLE; nothing is retried.
    pub fn reconnect_attempts(&self) -> u64 {
        if let Some(b) = &self.shared.balance {
            return b.channels().iter().map(Channel::reconnect_attempts).sum();
        }
        self.shared.dispatchers.iter().map(|d| d.reconnect_attempts.load(Ordering::Relaxed)).sum()
    }

    /// The counters of the channel's sessions (reconnects included), summed (RPCs, bytes,
    /// stalls, cancels, status codes...). Waits for a session another thread is driving (one
    /// step, or a caller's drive of at most about `poll_spin` without a completion); not for a
    /// reconnect's TCP connect and handshake, which run without the session (while one runs,
    /// the broken session's counters are counted): for monitoring, not for a hot path.
    pub fn counters(&self) -> crate::Counters {
        let mut c = crate::Counters::default();
        for d in &self.shared.dispatchers {
            c.add(&d.counters());
        }
        if let Some(b) = &self.shared.balance {
            for ch in b.channels() {
                c.add(&ch.counters());
            }
        }
        // Sessions on one endpoint share its receive buffers: each reported them all.
        let (bufs, bytes) = self.recv_sides();
        (c.recv_buffers, c.recv_buffer_bytes) = (bufs, bytes);
        c
    }

    /// The receive buffers (count, bytes) registered on the endpoints the channel's sessions
    /// are on, each endpoint's receive side counted once.
    fn recv_sides(&self) -> (u64, u64) {
        let mut sides = Vec::new();
        self.collect_recv_sides(&mut sides);
        sides.sort_unstable_by_key(|s| s.0);
        sides.dedup_by_key(|s| s.0);
        sides.iter().fold((0, 0), |(n, b), &(_, bufs, bytes)| (n + bufs, b + bytes))
    }

    fn collect_recv_sides(&self, sides: &mut Vec<(usize, u64, u64)>) {
        sides.extend(self.shared.dispatchers.iter().filter_map(|d| d.recv_side()));
        if let Some(b) = &self.shared.balance {
            for ch in b.channels() {
                ch.collect_recv_sides(sides);
            }
        }
    }
}

/// How a [`Channel`]'s sessions were driven ([`Channel::stats`]); every field counts since the
/// channel was connected, summed over its dispatchers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Calls started (request encoded into registered memory and posted) by callers' polls.
    pub started_by_callers: u64,
    /// Calls started by the dispatcher threads.
    pub started_by_threads: u64,
    /// Times a caller's poll took a session and drove it.
    pub caller_drives: u64,
    /// Times a caller's poll found the session held by another thread.
    pub caller_busy: u64,
    /// Steps (one CQ poll each) the dispatcher threads made.
    pub thread_drives: u64,
    /// Times a dispatcher thread came out of its park to drive.
    pub thread_runs: u64,
    /// Times a caller left work to a dispatcher thread (its `wanted` flag set).
    pub handoffs: u64,
    /// Unparks of a sleeping dispatcher thread (one system call each).
    pub unparks: u64,
    /// Task wakers woken by a driver (each a task the executor polls again).
    pub wakes: u64,
    /// Steps of all drivers: one pass of take queued calls, post, poll the CQ, finish calls.
    pub steps: u64,
    /// Steps that found nothing to do.
    pub empty_steps: u64,
    /// Completion-event waits of the dispatcher threads (`PollingPolicy::Event`).
    pub event_waits: u64,
    /// Sum over the calls started of the calls in flight on their session just after each was
    /// started (itself included): divided by the calls started, how full the pipeline was kept
    /// (at most the session's window).
    pub in_flight_at_start: u64,
}

impl ChannelStats {
    /// Adds `o`'s counts to these.
    fn add(&mut self, o: &ChannelStats) {
        self.started_by_callers += o.started_by_callers;
        self.started_by_threads += o.started_by_threads;
        self.caller_drives += o.caller_drives;
        self.caller_busy += o.caller_busy;
        self.thread_drives += o.thread_drives;
        self.thread_runs += o.thread_runs;
        self.handoffs += o.handoffs;
        self.unparks += o.unparks;
        self.wakes += o.wakes;
        self.steps += o.steps;
        self.empty_steps += o.empty_steps;
        self.event_waits += o.event_waits;
        self.in_flight_at_start += o.in_flight_at_start;
    }
}

/// The result side of a call, whatever its request type.
trait Outcome<Resp>: Send + Sync {
    fn done(&self) -> &Completion<Result<Resp, Status>>;
    /// The call is over: its state is kept for reuse if nobody else holds it.
    fn give_back(self: Arc<Self>);
}

impl<Req: Send + 'static, Resp: Send + 'static> Outcome<Resp> for UnaryJob<Req, Resp> {
    fn done(&self) -> &Completion<Result<Resp, Status>> {
        &self.done
    }
    fn give_back(self: Arc<Self>) {
        UnaryJob::recycle(self);
    }
}

/// The future of a [`Channel::unary`] call: `Send + 'static`; dropping it cancels the call.
///
/// # Cancel safety
/// Polled by reference (`&mut call` in a `tokio::select!` loop), it is cancel-safe: a round
/// that another branch wins leaves the call going, and a later poll returns its answer (none
/// is lost). Dropping the future itself (passing `call` by value to a `select!` that another
/// branch wins, or a `tokio::time::timeout` that expires) cancels the call: a Cancel goes to
/// the server and the answer, if it comes, is discarded.
#[must_use = "a call does nothing useful unless awaited, and dropping it cancels the call"]
pub struct UnaryCall<Resp> {
    /// The call's state (`None` once dropped: given back for reuse).
    done: Option<Arc<dyn Outcome<Resp>>>,
    /// The call until a dispatcher's queue took it (it was full).
    submit: Option<Arc<dyn Job>>,
    shared: Arc<Shared>,
    dispatcher: usize,
    /// The result was handed out.
    taken: bool,
    /// Counted in the dispatcher's `waiters`: the last poll returned `Pending` with the waker
    /// registered.
    waiting: bool,
    /// The completion may hold this task's waker (a poll returned `Pending` after registering
    /// it): the next poll that drives forgets it first.
    registered: bool,
    /// The call's span and metrics, and how to size its response (`ClientConfig::observe`).
    #[allow(clippy::type_complexity)]
    observed: Option<Box<(crate::observe::Observed, fn(&Resp) -> usize)>>,
}

impl<Resp> UnaryCall<Resp> {
    /// Cancels the call; the same as dropping it, said explicitly. A call on the wire gets a
    /// Cancel (posted by this thread when the session is free, else by the driver's next step):
    /// the server drops the request if it has not been dispatched, raises
    /// [`Responder::is_cancelled`](crate::codegen::Responder::is_cancelled) for a deferred call,
    /// drops an async handler's future, and gives the credit back; the slot is reused once the
    /// server's answer or acknowledgement arrived. A call not yet sent is forgotten; a call that
    /// already ended is left as it is.
    pub fn cancel(self) {
        drop(self);
    }

    fn new(
        done: Arc<dyn Outcome<Resp>>,
        submit: Option<Arc<dyn Job>>,
        shared: Arc<Shared>,
        dispatcher: usize,
    ) -> UnaryCall<Resp> {
        UnaryCall {
            done: Some(done),
            submit,
            shared,
            dispatcher,
            taken: false,
            waiting: false,
            registered: false,
            observed: None,
        }
    }

    /// Counts the call among the dispatcher's waiters (before it hands anything to the
    /// dispatcher thread, which drives only while some task waits).
    fn wait(&mut self) {
        wait(&mut self.waiting, &self.shared.dispatchers[self.dispatcher]);
    }

    /// Takes the call out of the waiters (it is polled, or dropped).
    fn unwait(&mut self) {
        if self.waiting {
            unwait(&mut self.waiting, &self.shared.dispatchers[self.dispatcher]);
        }
    }

    /// Queues the call if it is not yet; false while the queue is full.
    fn try_queue(&mut self) -> bool {
        let Some(job) = self.submit.take() else { return true };
        match self.shared.dispatchers[self.dispatcher].submit(job) {
            Ok(()) => true,
            Err(job) => {
                self.submit = Some(job);
                false
            }
        }
    }
}

impl<Resp> Future for UnaryCall<Resp> {
    type Output = Result<Resp, Status>;

    /// Drives the session while the reply is imminent (see [`ChannelConfig::poll_spin`]), then
    /// registers the waker. When it finished other tasks' calls, it returns at once: they drive
    /// next (and issue their next calls). A result already there is handed out at once.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Under tokio, a call spends one unit of the task's cooperative budget: a task whose
        // answers are always there (its own polls drive the session) yields after the budget,
        // so the runtime's other tasks get to issue their calls (outside tokio: no limit).
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let this = self.get_mut();
        this.unwait();
        if this.submit.is_some() {
            this.shared.dispatchers[this.dispatcher].wait_for_space(cx.waker());
            // Room may have come between the failed push and the registration.
            if !this.try_queue() {
                // A driver takes calls out (and wakes us) only if there is one.
                this.wait();
                this.shared.dispatchers[this.dispatcher].drive_or_hand_off(Duration::ZERO, &|| false);
                return Poll::Pending;
            }
        }
        // Disjoint borrows of the fields (no clone of the shared handles per poll).
        let Some(done) = this.done.as_deref().map(|o| o.done()) else { return ready(None) };
        if let Some(r) = done.try_take() {
            coop.made_progress();
            this.taken = true;
            report(&this.shared, &mut this.observed, &r);
            return ready(r);
        }
        // (A call that ended before it started has no dispatcher, and its result is there.)
        let Some(d) = this.shared.dispatchers.get(this.dispatcher).map(|d| &**d) else { return ready(None) };
        let waiting = &mut this.waiting;
        // From here until the waker is registered again, we poll for ourselves: a completion
        // meanwhile must not wake this task (nothing wakes itself).
        if std::mem::take(&mut this.registered) {
            done.unregister();
        }
        let is_done = || done.is_done();
        // Read only when another thread holds the session (no clock read per poll otherwise).
        let mut started: Option<Instant> = None;
        let mut hand_off = false;
        let mut held = 0u32;
        loop {
            if let Some(drove) = d.drive(d.poll_spin, true, &is_done) {
                hand_off = drove.unattended;
                break;
            }
            // Another thread drives the session: our answer may be imminent all the same.
            if is_done() {
                break;
            }
            if started.get_or_insert_with(Instant::now).elapsed() >= d.poll_spin {
                // Whoever drives leaves it to someone when it lets go; in case it looked at the
                // queue (or the waiters) before our call was in it, the dispatcher thread is told.
                hand_off = true;
                break;
            }
            held += 1;
            if held % 64 == 0 {
                // The holder may share our core (2 cores, the server's worker on the other).
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if !is_done() {
            // Counted before the dispatcher thread is told, so that it finds us waiting.
            wait(waiting, d);
            if hand_off {
                d.want_driver();
            }
        }
        match done.poll(cx) {
            Poll::Ready(r) => {
                unwait(waiting, d);
                coop.made_progress();
                this.taken = true;
                report(&this.shared, &mut this.observed, &r);
                ready(r)
            }
            Poll::Pending => {
                wait(waiting, d);
                this.registered = true;
                Poll::Pending
            }
        }
    }
}

/// Tells a per-server channel's watcher (a balanced channel's) that a call failed: one compare
/// on the success path.
#[inline(always)]
#[allow(clippy::type_complexity)]
fn report<Resp>(
    shared: &Shared,
    observed: &mut Option<Box<(crate::observe::Observed, fn(&Resp) -> usize)>>,
    r: &Option<Result<Resp, Status>>,
) {
    if observed.is_some() {
        finish_observed(observed, r);
    }
    if let Some(Err(s)) = r {
        if let Some(w) = &shared.watch {
            w.failed(s);
        }
    }
}

/// Ends an observed call's record (`ClientConfig::observe`) with its result.
#[cold]
#[inline(never)]
#[allow(clippy::type_complexity)]
fn finish_observed<Resp>(
    observed: &mut Option<Box<(crate::observe::Observed, fn(&Resp) -> usize)>>,
    r: &Option<Result<Resp, Status>>,
) {
    if let (Some(o), Some(r)) = (observed.take(), r) {
        let (o, size) = *o;
        o.finish_with(r, size);
    }
}

/// Counts a call among its dispatcher's waiters (see [`UnaryCall::wait`]).
fn wait(waiting: &mut bool, d: &Inner) {
    if !*waiting {
        *waiting = true;
        d.waiters.fetch_add(1, Ordering::SeqCst);
    }
}

/// Takes a call out of its dispatcher's waiters (see [`UnaryCall::unwait`]).
fn unwait(waiting: &mut bool, d: &Inner) {
    if *waiting {
        *waiting = false;
        d.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Hands out a result, without driving the session: a task that goes on polls its next call,
/// which drives it (waiting here for someone else's answer would hold this task's next call
/// back); should none come, the dispatcher thread's watch takes the session over.
fn ready<Resp>(r: Option<Result<Resp, Status>>) -> Poll<Result<Resp, Status>> {
    match r {
        Some(r) => Poll::Ready(r),
        None => Poll::Ready(Err(Status::internal("call polled after completion"))),
    }
}

impl<Resp> Drop for UnaryCall<Resp> {
    fn drop(&mut self) {
        self.unwait();
        let Some(done) = self.done.take() else { return };
        let Some(d) = self.shared.dispatchers.get(self.dispatcher).map(|d| &**d) else {
            // Ended before it started: nothing to cancel.
            done.give_back();
            return;
        };
        if done.done().cancel() {
            d.changes.fetch_add(1, Ordering::AcqRel);
            // The Cancel goes out (and the slot comes back) with the next step of a driver.
            d.drive_or_hand_off(Duration::ZERO, &|| true);
        } else if !self.taken && d.is_owed() {
            // Woken and dropped unpolled: the session was left to us.
            d.drive_or_hand_off(d.poll_spin, &|| false);
        }
        self.submit = None;
        done.give_back();
    }
}

impl<Resp> std::fmt::Debug for UnaryCall<Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnaryCall")
            .field("done", &self.done.as_ref().is_some_and(|o| o.done().is_done()))
            .finish()
    }
}

/// Awaits a completion (a connecting dispatcher's outcome).
struct WaitCompletion<'a, T>(&'a Completion<T>);

impl<T> Future for WaitCompletion<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.0.poll(cx) {
            Poll::Ready(Some(v)) => Poll::Ready(v),
            // Taken already: cannot happen for the one waiter of a connect.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// Wakes a blocked thread.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Blocks the calling thread until `c` has its result.
fn block_on<T>(c: &Completion<T>) -> T {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(Some(v)) = c.poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}
