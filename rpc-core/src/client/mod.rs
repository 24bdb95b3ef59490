//! The client: one session to a server, driven by the calling thread.
//!
//! Blocking calls busy-poll the client's own CQ in the calling thread (per its polling policy);
//! async calls return a [`ResponseFuture`] that progresses the session whenever it is polled (no
//! executor needed). `Client` is `Send` and `!Sync`: one thread drives it at a time. While no
//! call holds it, its endpoint's progress thread looks at the session every 50 ms, spacing out to
//! 400 ms while the looks find it idle (one poll of its CQ), so the server's idle probe gets its
//! Pongs (`Held`).
//!
//! A call that finds every slot taken waits for one (`queue`: in order, encoded once, bounded
//! by `ClientConfig::max_queued_calls`); a broken session is reconnected by a later call, with
//! exponential backoff and jitter (`backoff`). Nothing is retried silently.

pub(crate) mod backoff;
mod config;
pub(crate) mod core;
pub(crate) mod endpoint;
pub(crate) mod names;
mod queue;
mod request;
mod stream;

use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll};
use std::time::Instant;

use prost::Message;

pub use config::{CallOptions, ClientConfig};
pub use endpoint::Endpoint;
pub use names::register_method_names;
pub use request::{IntoRequest, Request, SharedSession, ToShareAcrossThreadsConnectAChannel};
pub use stream::{BidiStreaming, ClientStreaming};

use crate::buffers::GatherBody;
use crate::dispatch::service::MethodId;
use crate::endpoint::counters::Counters;
use crate::metadata::{Metadata, WithMetadata};
use crate::status::Status;
use backoff::{Backoff, BackoffParams};
use core::{CallId, ClientCore};
use queue::{Calls, Ticket};

enum AnyCalls {
    Sim(Box<Calls<crate::verbs::sim::Sim>>),
    #[cfg(feature = "ibverbs")]
    Rdma(Box<Calls<crate::verbs::ibverbs::Ibverbs>>),
}

macro_rules! with_calls {
    ($calls:expr, $c:ident => $body:expr) => {
        match $calls {
            AnyCalls::Sim($c) => $body,
            #[cfg(feature = "ibverbs")]
            AnyCalls::Rdma($c) => $body,
        }
    };
}

pub(crate) use with_calls;

/// Why sessions of earlier epochs ended, kept for their calls polled after a reconnect.
const ENDED_KEPT: usize = 8;

/// One session to a server (see the module docs), reconnected when it breaks.
///
/// **Backpressure.** `ClientConfig::window` calls run at once; a call started while every slot
/// is taken waits in a FIFO queue (encoded once) and is sent as slots and ring space free.
/// Starting an async call never blocks. At most `ClientConfig::max_queued_calls` calls wait;
/// beyond, RESOURCE_EXHAUSTED naming that field. A waiting call whose deadline passes ends
/// DEADLINE_EXCEEDED without being sent.
///
/// **Reconnect.** When the session breaks (the server closed it, its process died, a send
/// failed), every call in flight or waiting ends UNAVAILABLE; none is ever re-sent. A later call
/// reconnects to the same address: the first call after a break tries at once, and after each
/// failed attempt the next waits an exponentially growing, jittered delay
/// (`ClientConfig::reconnect_*`). A call made before that delay ran out ends UNAVAILABLE at
/// once, naming the time left, without a connect attempt. The attempt itself (TCP connect and
/// handshake, at most `ClientConfig::connect_timeout`) runs in the blocking call that makes it;
/// for an async call it runs on a thread of its own, started by the future's first poll, and
/// the future's polls return `Pending` until it ends: neither starting nor polling an async call
/// blocks. A blocking call made while such an attempt runs waits for that attempt.
///
/// **Idle.** The session answers the server's idle probe ([`crate::ServerConfig::peer_timeout`])
/// while the client is idle, as a `Channel`'s does: its handshake says so
/// ([`crate::wire::FLAG_IDLE_PONGS`]), and its [`Endpoint`]'s progress thread (`rpc-progress`,
/// one per endpoint, started by its first client, ended within 50 ms of its last) looks at the
/// session every 50 ms while no call holds the client (400 ms apart once its looks keep finding
/// nothing, closer again after ones that found something): one poll of its CQs, which answers Pings,
/// keeps answers for their futures and sees a broken session (a control connection the server
/// closed, within 800 ms: the next call then reconnects); it never starts calls nor
/// reconnects, and never holds the client while a call of its own thread does (a call takes the
/// client's lock, uncontended but for such a look, which it waits for). So an idle client keeps
/// its session however long it is idle (the server does not close it for `idle_timeout` while
/// the probe is on), the server may hold no TCP control connection for it
/// ([`crate::ServerConfig::max_control_connections`]), and the session of a client process that
/// died or stopped while idle is reclaimed by the server's probe within `peer_timeout`.
///
/// `Send` (move it to another thread) but not `Sync` (one thread drives it at a time); sharing
/// it is refused with an error naming [`ToShareAcrossThreadsConnectAChannel`] (to share calls
/// among threads or tokio tasks, connect a [`Channel`](crate::Channel)):
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<rpc_core::Client>();
/// ```
pub struct Client {
    /// First, so that the compiler names it first when a client is shared.
    _not_sync: request::NotSyncHint,
    /// Shared with its endpoint's progress thread, which looks at the session while no call
    /// holds it (see [`Held`]).
    inner: Arc<Held>,
    /// `ClientConfig::observe` (read without borrowing `inner`: one branch per call).
    observe: crate::Observe,
}

/// A client's state behind a lock: its thread's calls take it ([`Held::borrow_mut`], one
/// uncontended lock and unlock per call), and its endpoint's progress thread only tries it, every
/// 50 to 400 ms, to answer the server's Pings while the client is idle ([`IdleLook`]): it never holds
/// a session a caller is using, and a caller waits at most for one poll of the CQ.
///
/// [`IdleLook`]: crate::channel::dispatcher::IdleLook
struct Held(Mutex<Inner>);

impl Held {
    /// The state, for a call of the client's own thread (waiting for the end of a progress
    /// look that holds it). A panic while it was held (in an interceptor) leaves it usable, as
    /// the `RefCell` before it did.
    #[inline]
    fn borrow_mut(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// As [`Held::borrow_mut`] (for reading).
    #[inline]
    fn borrow(&self) -> MutexGuard<'_, Inner> {
        self.borrow_mut()
    }

    /// The state when nobody holds it (a future's poll, which must not block).
    fn try_borrow_mut(&self) -> Result<MutexGuard<'_, Inner>, ()> {
        match self.0.try_lock() {
            Ok(g) => Ok(g),
            Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) => Err(()),
        }
    }

    /// As [`Held::try_borrow_mut`] (for reading).
    fn try_borrow(&self) -> Result<MutexGuard<'_, Inner>, ()> {
        self.try_borrow_mut()
    }
}

impl crate::channel::dispatcher::IdleLook for Held {
    /// The progress thread's look: one poll of the session's CQ when no call holds the client
    /// (what arrived is handled: a Ping gets its Pong, answers wait for their futures, a
    /// broken session is seen, the control connection is read every 16 looks:
    /// `ClientCore::idle_step`). It never reconnects nor starts calls.
    fn idle_look(&self, rounds: u32) -> bool {
        let Ok(mut inner) = self.try_borrow_mut() else { return true };
        with_calls!(&mut inner.calls, c => c.core.idle_step(rounds) > 0)
    }
}

impl std::fmt::Debug for Client {
    /// The server's address and the transport (a generated stub over a `Client` derives its
    /// `Debug` from this one).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Client");
        match self.inner.try_borrow() {
            Ok(inner) => d.field("peer", &inner.peer).field("transport", &inner.config.transport),
            // From inside a call of this very client (a `Debug` of it in a callback), or during
            // a look of its endpoint's progress thread.
            Err(()) => d.field("peer", &format_args!("<in use>")),
        };
        d.finish_non_exhaustive()
    }
}

struct Inner {
    calls: AnyCalls,
    /// Counts sessions: a call belongs to the session of its epoch.
    epoch: u64,
    peer: SocketAddr,
    /// Where the session reconnects (resolved once, at [`Client::connect_with`]).
    addrs: Vec<SocketAddr>,
    config: ClientConfig,
    /// The device context and PD its sessions live on (its own, or one shared with other
    /// clients: [`Endpoint::connect`]).
    endpoint: Endpoint,
    backoff: Backoff,
    /// Counters of the sessions before this one.
    retired: Counters,
    /// Reconnect attempts made (successful or not).
    reconnect_attempts: u64,
    ended: VecDeque<(u64, Status)>,
    /// An attempt running on its own thread for an async call, and why the session broke.
    attempt: Option<(std::sync::mpsc::Receiver<Result<AnyCalls, Status>>, Status)>,
}

/// The handshake flags of a client's sessions: it answers Pings while idle
/// ([`crate::wire::FLAG_IDLE_PONGS`]; its endpoint's progress thread does, [`Held`]), so the
/// server's idle probe watches it, and the server may hold no control connection for it.
const IDLE_PONGS: u16 = crate::wire::FLAG_IDLE_PONGS;

/// Opens a session on `endpoint` to the first of `addrs` that answers.
fn open(addrs: &[SocketAddr], config: &ClientConfig, endpoint: &Endpoint) -> Result<AnyCalls, Status> {
    let q = config.max_queued_calls;
    #[cfg(feature = "ibverbs")]
    if let Some(core) = same_host(addrs, config, endpoint, IDLE_PONGS) {
        return Ok(AnyCalls::Sim(Box::new(Calls::new(core, q))));
    }
    Ok(match endpoint.nic() {
        endpoint::AnyNic::Sim(nic) => {
            AnyCalls::Sim(Box::new(Calls::new(ClientCore::connect(addrs, config, nic, IDLE_PONGS)?, q)))
        }
        #[cfg(feature = "ibverbs")]
        endpoint::AnyNic::Rdma(nic) => {
            AnyCalls::Rdma(Box::new(Calls::new(ClientCore::connect(addrs, config, nic, IDLE_PONGS)?, q)))
        }
    })
}

/// The session of [`ClientConfig::same_host_shm`], when it applies (asked, on an RDMA
/// `endpoint`, the server's address this host's) and the server takes it: on this thread's
/// software-NIC endpoint, its hello flagged [`crate::wire::FLAG_SHM`] and `flags`. `None`
/// (logged at info when it was tried) means: connect on the NIC.
#[cfg(feature = "ibverbs")]
pub(crate) fn same_host(
    addrs: &[SocketAddr],
    config: &ClientConfig,
    endpoint: &Endpoint,
    flags: u16,
) -> Option<ClientCore<crate::verbs::sim::Sim>> {
    if !config.same_host_shm || !matches!(endpoint.nic(), endpoint::AnyNic::Rdma(_)) || !is_local(addrs) {
        return None;
    }
    let core = Endpoint::per_thread(&crate::Transport::Sim).and_then(|sim| match sim.nic() {
        endpoint::AnyNic::Sim(nic) => ClientCore::connect(addrs, config, nic, flags | crate::wire::FLAG_SHM),
        endpoint::AnyNic::Rdma(_) => Err(Status::internal("the sim endpoint opened on another provider")),
    });
    core.map_err(|s| tracing::info!(status = %s, "no same-host path (ClientConfig::same_host_shm): connecting on the NIC"))
        .ok()
}

/// Whether the server's (first) address is this host's: loopback, or one a socket can bind
/// here (the kernel binds only local addresses).
#[cfg(feature = "ibverbs")]
fn is_local(addrs: &[SocketAddr]) -> bool {
    addrs.first().is_some_and(|a| crate::transport::is_local_ip(a.ip()))
}

impl Inner {
    /// The session, reconnected if it broke and the backoff allows an attempt now.
    ///
    /// # Errors
    /// UNAVAILABLE naming why the session broke and when the next attempt may be made (or why
    /// this attempt failed).
    #[inline]
    fn ensure_session(&mut self) -> Result<(), Status> {
        if with_calls!(&mut self.calls, c => c.core.broken_now().is_none()) {
            return Ok(());
        }
        self.reconnect()
    }

    #[cold]
    #[inline(never)]
    fn reconnect(&mut self) -> Result<(), Status> {
        if let Some((rx, reason)) = self.attempt.take() {
            // An async call's attempt runs: its result is this call's too.
            let r = rx.recv().unwrap_or_else(|_| Err(Status::internal("the reconnect thread ended")));
            return self.attempted(r, reason);
        }
        let Some(reason) = self.reconnect_due()? else { return Ok(()) };
        self.reconnect_attempts += 1;
        let r = open(&self.addrs, &self.config, &self.endpoint);
        self.attempted(r, reason)
    }

    /// For an async call: `Ready` as [`Inner::ensure_session`] would return, without blocking:
    /// the attempt (TCP connect and handshake) runs on a thread of its own, and until it ends
    /// this is `Pending`.
    #[cold]
    fn poll_session(&mut self) -> Poll<Result<(), Status>> {
        if let Some((rx, _)) = &self.attempt {
            let r = match rx.try_recv() {
                Ok(r) => r,
                Err(std::sync::mpsc::TryRecvError::Empty) => return Poll::Pending,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    Err(Status::internal("the reconnect thread ended"))
                }
            };
            let (_, reason) = self.attempt.take().expect("an attempt runs");
            return Poll::Ready(self.attempted(r, reason));
        }
        let reason = match self.reconnect_due() {
            Ok(None) => return Poll::Ready(Ok(())),
            Ok(Some(reason)) => reason,
            Err(s) => return Poll::Ready(Err(s)),
        };
        self.reconnect_attempts += 1;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (addrs, config, endpoint) = (self.addrs.clone(), self.config.clone(), self.endpoint.clone());
        let spawned = std::thread::Builder::new().name("rpc-reconnect".into()).spawn(move || {
            let _ = tx.send(open(&addrs, &config, &endpoint));
        });
        if let Err(e) = spawned {
            let r = Err(Status::unavailable(format!("starting the reconnect thread: {e}")));
            return Poll::Ready(self.attempted(r, reason));
        }
        self.attempt = Some((rx, reason));
        Poll::Pending
    }

    /// Applies the result of a reconnect attempt made because the session broke for `reason`.
    fn attempted(&mut self, r: Result<AnyCalls, Status>, reason: Status) -> Result<(), Status> {
        match r {
            Ok(calls) => {
                let old = std::mem::replace(&mut self.calls, calls);
                self.retired.add(&with_calls!(&old, c => c.core.counters.clone()));
                drop(old);
                if self.ended.len() == ENDED_KEPT {
                    self.ended.pop_front();
                }
                self.ended.push_back((self.epoch, reason));
                self.epoch += 1;
                self.peer = with_calls!(&self.calls, c => c.core.peer);
                self.backoff.on_success();
                tracing::info!(peer = %self.peer, epoch = self.epoch, "client reconnected");
                Ok(())
            }
            Err(e) => Err(self.backoff.failed(self.peer, &reason, &e, Instant::now())),
        }
    }

    /// Without connecting: `None` while the session is up; why it broke when a reconnect
    /// attempt may be made now.
    ///
    /// # Errors
    /// UNAVAILABLE naming why the session broke and when the backoff allows the next attempt.
    #[cold]
    fn reconnect_due(&self) -> Result<Option<Status>, Status> {
        let Some(reason) = with_calls!(&self.calls, c => c.core.broken().cloned()) else { return Ok(None) };
        self.backoff.due(self.peer, &reason, Instant::now())?;
        Ok(Some(reason))
    }

    /// What a call of an earlier session gets when polled after the reconnect.
    fn ended_status(&self, epoch: u64) -> Status {
        let ended = self.ended.iter().find(|(e, _)| *e == epoch);
        let why = ended.map_or("broke", |(_, s)| s.message());
        // The code the session ended with (a server's Close names it, e.g. RESOURCE_EXHAUSTED).
        let code = ended.map_or(crate::status::Code::Unavailable, |(_, s)| s.code());
        Status::new(code, format!("the session this call was sent on ended: {why}"))
    }
}

impl Client {
    /// Connects with [`ClientConfig::default`].
    ///
    /// # Errors
    /// UNAVAILABLE when the server cannot be reached or the transport cannot open; the server's
    /// status when it refuses the handshake (naming the field or limit).
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Client, Status> {
        Client::connect_with(addr, &ClientConfig::default())
    }

    /// Connects with `config`. `addr` is resolved once; reconnects go to the same addresses.
    /// The session is made on this thread's [`Endpoint`] of `config.transport` (one device
    /// context and PD for every client the thread connects, to any servers, opened by the first
    /// and closed with the last; [`Endpoint::connect_with`] picks another).
    ///
    /// # Errors
    /// As [`Client::connect`]; INVALID_ARGUMENT for a configuration value out of range (naming
    /// the field).
    pub fn connect_with(addr: impl ToSocketAddrs, config: &ClientConfig) -> Result<Client, Status> {
        // Checked before a device is opened for it.
        BackoffParams::from_config(config)?;
        Client::connect_on(Endpoint::per_thread(&config.transport)?, addr, config)
    }

    /// [`Client::connect_with`] on `endpoint` (whose transport is `config.transport`).
    pub(crate) fn connect_on(
        endpoint: Endpoint,
        addr: impl ToSocketAddrs,
        config: &ClientConfig,
    ) -> Result<Client, Status> {
        let params = BackoffParams::from_config(config)?;
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Status::unavailable(format!("resolving the server address: {e}")))?
            .collect();
        let calls = open(&addrs, config, &endpoint)?;
        let peer = with_calls!(&calls, c => c.core.peer);
        let progress = endpoint.clone();
        let client = Client {
            _not_sync: PhantomData,
            observe: config.observe,
            inner: Arc::new(Held(Mutex::new(Inner {
                calls,
                epoch: 0,
                peer,
                addrs,
                config: config.clone(),
                endpoint,
                backoff: Backoff::new(params, fastrand::Rng::new()),
                retired: Counters::default(),
                reconnect_attempts: 0,
                ended: VecDeque::new(),
                attempt: None,
            }))),
        };
        // Its handshake promised Pongs while idle: the endpoint's progress thread answers them
        // (without it, the client is dropped: its session closes).
        let weak = Arc::downgrade(&client.inner);
        let look: std::sync::Weak<dyn crate::channel::dispatcher::IdleLook> = weak;
        progress.watch_idle(look)?;
        Ok(client)
    }

    /// The server's TCP address (of the current session).
    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.borrow().peer
    }

    /// This client's counters, summed over its sessions (reconnects included).
    pub fn counters(&self) -> Counters {
        let inner = self.inner.borrow();
        let mut c = inner.retired.clone();
        c.add(&with_calls!(&inner.calls, q => q.core.counters_now()));
        c
    }

    /// A registered buffer of `len` bytes to fill and carry (frozen,
    /// [`RegisteredBytesMut::freeze`](crate::buffers::RegisteredBytesMut::freeze)) in a `bytes`
    /// field of a request: a request body above the eager threshold sends its bytes by an RDMA
    /// WRITE straight from it, with no copy. It comes from the pool of the current session's
    /// protection domain (at most `ClientConfig::registered_buffer_bytes` registered; see
    /// [`crate::buffers::registered`]); after a reconnect, buffers of the old session's pool
    /// are copied once like ordinary `Bytes`.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming the pool's bound when it is reached (or a slab fails to
    /// register); nothing is taken.
    pub fn alloc_registered(&self, len: usize) -> Result<crate::buffers::RegisteredBytesMut, Status> {
        self.registered_pool().alloc(len)
    }

    /// The current session's pool of registered buffers ([`Client::alloc_registered`]), with
    /// its counts ([`crate::buffers::RegisteredPool::stats`]).
    pub fn registered_pool(&self) -> std::sync::Arc<crate::buffers::RegisteredPool> {
        with_calls!(&self.inner.borrow().calls, c => c.core.registered_pool())
    }

    /// Why the current session is closed, if it is (until a call reconnects it).
    pub fn closed_reason(&self) -> Option<Status> {
        with_calls!(&self.inner.borrow().calls, c => c.core.broken().cloned())
    }

    /// Reconnect attempts made since [`Client::connect_with`] (successful or not).
    pub fn reconnect_attempts(&self) -> u64 {
        self.inner.borrow().reconnect_attempts
    }

    /// Calls waiting for a slot (see [`ClientConfig::max_queued_calls`]).
    pub fn queued_calls(&self) -> usize {
        with_calls!(&self.inner.borrow().calls, c => c.queued())
    }

    /// A blocking unary call: encodes `req` straight into a registered buffer, sends it, and
    /// busy-polls (per the polling policy) in this thread until the response arrives. When every
    /// slot is taken it waits (progressing the session) for one, in FIFO order with other
    /// waiting calls, until its deadline.
    ///
    /// # Errors
    /// The server's status; DEADLINE_EXCEEDED after `opts`' deadline (never sent when it passed
    /// while the call waited for a slot); UNAVAILABLE when the session is gone (reconnecting:
    /// see [`Client`]); RESOURCE_EXHAUSTED for a body over a limit (named), when
    /// `max_queued_calls` calls already wait, or when every slot is held by calls only their
    /// own futures can finish (waiting would never end).
    pub fn unary<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Resp, Status> {
        if self.observe.any() {
            if !self.observe.is_tracing() {
                return self.unary_timed(id, req, opts);
            }
            return self.unary_observed(id, req, opts);
        }
        self.unary_plain(id, req, opts)
    }

    /// [`Client::unary`] with metrics on and tracing off: the call timed on this thread.
    #[inline(never)]
    fn unary_timed<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Resp, Status> {
        let timed = crate::observe::Timed::client(id, req.encoded_len());
        let r = self.unary_plain(id, req, opts);
        timed.finish_with(&r, |m: &Resp| m.encoded_len());
        r
    }

    /// [`Client::unary`] unobserved: one copy for both of its paths (so that the session's
    /// `start` and `wait` inline into it).
    #[inline(never)]
    fn unary_plain<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Resp, Status> {
        let deadline = opts.effective_timeout().map(|t| Instant::now() + t);
        let mut inner = self.inner.borrow_mut();
        let md = crate::metadata::intercepted(opts.metadata(), inner.config.interceptor.as_ref())?;
        let req = WithMetadata::new(req, md.as_deref());
        inner.ensure_session()?;
        with_calls!(&mut inner.calls, c => {
            let t = c.start(id, &req, deadline, true, req.flags(), opts.capture())?;
            c.wait(t)
        })
    }

    /// [`Client::unary`] with `ClientConfig::observe` on: a span and metrics around the call,
    /// `traceparent` in its metadata ([`crate::observe`]).
    #[cold]
    #[inline(never)]
    fn unary_observed<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Resp, Status> {
        let (mut obs, traced) = self.observe_call(id, req, opts);
        let opts = traced.as_ref().unwrap_or(opts);
        obs.sent();
        let r = {
            let _entered = obs.enter();
            self.unary_plain(id, req, opts)
        };
        obs.finish_with(&r, |m: &Resp| m.encoded_len());
        r
    }

    /// An async unary call: the request is encoded now, into its slot or (every slot taken, or
    /// no ring room yet) into the queue of waiting calls; this never waits. The returned future
    /// completes with the response. Polling it progresses the session (no executor or other
    /// thread needed); dropping it abandons the call (a waiting call is never sent; a late
    /// answer is discarded).
    ///
    /// Errors (in the future's output) are [`Client::unary`]'s, except that it never fails for
    /// slots held by other futures.
    pub fn unary_async<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> ResponseFuture<'_, Resp> {
        if self.observe.any() {
            return self.unary_async_observed(id, req, opts);
        }
        self.unary_async_rest(id, req, opts)
    }

    /// [`Client::unary_async`] with `ClientConfig::observe` on (as [`Client::unary`]'s).
    #[cold]
    #[inline(never)]
    fn unary_async_observed<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> ResponseFuture<'_, Resp> {
        let (obs, traced) = self.observe_call(id, req, opts);
        let opts = traced.as_ref().unwrap_or(opts);
        let mut fut = {
            let _entered = obs.enter();
            self.unary_async_rest(id, req, opts)
        };
        let size: fn(&Resp) -> usize = |m| m.encoded_len();
        fut.observed = Some(Box::new((obs, size)));
        fut
    }
}

impl Client {
    /// Starts the observation of a call (its span and metrics) and, for a traced call, the
    /// options that carry its `traceparent` (only a traced call sends more metadata than it was
    /// given).
    fn observe_call<Req: Message>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> (crate::observe::Observed, Option<CallOptions>) {
        let o = self.observe;
        let mut md =
            if o.is_tracing() { opts.metadata().cloned().unwrap_or_default() } else { Metadata::new() };
        let obs =
            crate::observe::Observed::client(o, id, &mut md, req.encoded_len(), || Some(self.peer_addr()));
        let traced = obs.traced().then(|| opts.clone().with_metadata(md));
        (obs, traced)
    }
}

impl Client {
    /// The rest of [`Client::unary_async`] (unobserved).
    #[inline(always)]
    fn unary_async_rest<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> ResponseFuture<'_, Resp> {
        let deadline = opts.effective_timeout().map(|t| Instant::now() + t);
        let md = match self.intercepted(opts) {
            Ok(md) => md,
            Err(s) => {
                return ResponseFuture {
                    client: self,
                    state: State::Failed(Some(s)),
                    _t: PhantomData,
                    observed: None,
                }
            }
        };
        let req = &WithMetadata::new(req, md.as_deref());
        let flags = req.flags();
        let mut inner = self.inner.borrow_mut();
        let due = if with_calls!(&mut inner.calls, c => c.core.broken_now().is_none()) {
            Ok(None)
        } else {
            inner.reconnect_due()
        };
        let state = match due {
            Ok(None) => {
                match with_calls!(&mut inner.calls, c => c.start(id, req, deadline, false, flags, opts.capture()))
                {
                    Ok(ticket) => State::Waiting { epoch: inner.epoch, ticket },
                    Err(s) => State::Failed(Some(s)),
                }
            }
            // The session broke and an attempt is due: the call waits, encoded, and its first
            // poll starts the attempt on a thread (neither starting nor polling blocks).
            Ok(Some(_)) => {
                let body = GatherBody::encode(req, Vec::new());
                match crate::buffers::bounded::check_exact::<Req>(req.encoded_len(), body.len()) {
                    Ok(()) => State::Reconnect {
                        method: id,
                        body,
                        deadline,
                        flags,
                        capture: opts.capture().cloned(),
                    },
                    Err(e) => State::Failed(Some(e.status("request"))),
                }
            }
            Err(s) => State::Failed(Some(s)),
        };
        ResponseFuture { client: self, state, _t: PhantomData, observed: None }
    }

    /// Opens a server stream: sends `req` to method `id` (a server-streaming method; generated
    /// stubs call this) and returns its [`Streaming`] messages. `opts`' timeout is the deadline of
    /// the whole stream (both ends end it DEADLINE_EXCEEDED when it passes).
    ///
    /// # Errors
    /// As [`Client::unary`] for the request (a request over `max_message_size`, a broken
    /// session that cannot reconnect); RESOURCE_EXHAUSTED when every slot of the window is taken
    /// (a stream does not wait in the call queue).
    pub fn server_stream<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Streaming<'_, Resp>, Status> {
        if !self.observe.any() {
            return self.server_stream_plain(id, req, opts);
        }
        let (obs, traced) = self.observe_call(id, req, opts);
        let (mut s, o) =
            StreamObs::opened(obs, self.server_stream_plain(id, req, traced.as_ref().unwrap_or(opts)))?;
        s.observed = Some(o);
        Ok(s)
    }

    fn server_stream_plain<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Streaming<'_, Resp>, Status> {
        let md = self.intercepted(opts)?;
        let req = WithMetadata::new(req, md.as_deref());
        let mut inner = self.inner.borrow_mut();
        inner.ensure_session()?;
        let deadline = opts.effective_timeout().map(|t| Instant::now() + t);
        let started = with_calls!(&mut inner.calls, c => {
            c.core.start_with(
                id,
                &req,
                deadline,
                core::StartMode::Now,
                crate::wire::STREAM_OUT | req.flags(),
                opts.capture(),
            )
        })?;
        let Some(call) = started else {
            return Err(Status::resource_exhausted(
                "every slot of the client's window (ClientConfig::window) is taken: a stream needs a free one \
                 (streams do not wait in the call queue)",
            ));
        };
        Ok(Streaming { client: self, call, epoch: inner.epoch, done: false, observed: None, _t: PhantomData })
    }

    /// The metadata a call with `opts` sends (the interceptor run on it, if any).
    fn intercepted<'a>(
        &self,
        opts: &'a CallOptions,
    ) -> Result<Option<crate::metadata::Intercepted<'a>>, Status> {
        let inner = self.inner.borrow();
        crate::metadata::intercepted(opts.metadata(), inner.config.interceptor.as_ref())
    }

    /// Polls the CQ once and handles what arrived (responses are stored for their futures;
    /// waiting calls move into freed slots). Returns how many completions were handled. It
    /// never reconnects.
    pub fn progress(&self) -> usize {
        with_calls!(&mut self.inner.borrow_mut().calls, c => c.progress())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        with_calls!(&mut self.inner.borrow_mut().calls, c => c.core.close());
    }
}

enum State {
    /// Started on a broken session: polls reconnect (the attempt on its own thread), then start
    /// the call.
    Reconnect {
        method: MethodId,
        body: GatherBody,
        deadline: Option<Instant>,
        flags: u8,
        capture: Option<crate::metadata::CapturedMetadata>,
    },
    Waiting {
        epoch: u64,
        ticket: Ticket,
    },
    Failed(Option<Status>),
    Done,
}

/// The future of an async unary call ([`Client::unary_async`]).
///
/// # Cancel safety
/// Polled by reference (`&mut fut` in a `tokio::select!` loop), it is cancel-safe: a round that
/// another branch wins leaves the call going, and a later poll returns its answer. Dropping the
/// future itself cancels the call (see [`ResponseFuture::cancel`]): its answer is discarded.
pub struct ResponseFuture<'a, T> {
    client: &'a Client,
    state: State,
    _t: PhantomData<fn() -> T>,
    /// The call's span and metrics, and how to size its response (`ClientConfig::observe`).
    #[allow(clippy::type_complexity)]
    observed: Option<Box<(crate::observe::Observed, fn(&T) -> usize)>>,
}

impl<T> ResponseFuture<'_, T> {
    /// True once the future has produced its output.
    pub fn is_terminated(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Cancels the call; the same as dropping the future, said explicitly. A call on the wire
    /// gets a Cancel, posted before this returns: the server drops the request if it has not
    /// been dispatched, raises [`Responder::is_cancelled`](crate::codegen::Responder::is_cancelled)
    /// for a deferred call, drops an async handler's future, and gives the credit back; the
    /// slot is reused once the server's answer or acknowledgement arrived
    /// (`ClientConfig::max_abandoned` bounds the calls cancelled and not yet acknowledged). A
    /// call still waiting for a slot, or for its reconnect, is forgotten (nothing was sent). A
    /// call that already ended is left as it is.
    pub fn cancel(self) {
        drop(self);
    }
}

impl<T: Message + Default> Future for ResponseFuture<'_, T> {
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let p = this.poll_plain(cx);
        if let Some(o) = this.observed.as_mut() {
            match &p {
                Poll::Ready(r) => {
                    if let Some(o) = this.observed.take() {
                        let (o, size) = *o;
                        o.finish_with(r, size);
                    }
                }
                // Its request is posted: the call's start is recorded while it waits.
                Poll::Pending => o.0.sent(),
            }
        }
        p
    }
}

impl<T: Message + Default> ResponseFuture<'_, T> {
    /// [`Future::poll`] of the call itself.
    fn poll_plain(&mut self, cx: &mut Context<'_>) -> Poll<Result<T, Status>> {
        let this = self;
        if let State::Reconnect { method, body, deadline, flags, capture } = &this.state {
            let Ok(mut inner) = this.client.inner.try_borrow_mut() else {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            };
            let r = if deadline.is_some_and(|d| Instant::now() >= d) {
                // The attempt goes on for the calls after this one.
                Poll::Ready(Err(Status::deadline_exceeded(
                    "deadline passed while the session reconnected (the call was never sent)",
                )))
            } else {
                inner.poll_session()
            };
            let r = match r {
                Poll::Pending => {
                    // Busy-polling future, as below: ask to be polled again.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(r) => r,
            };
            let r = r.and_then(|()| {
                with_calls!(&mut inner.calls, c => c.start(*method, &WithMetadata::new(&queue::Gathered(body), None), *deadline, false, *flags, capture.as_ref()))
            });
            this.state = match r {
                Ok(ticket) => State::Waiting { epoch: inner.epoch, ticket },
                Err(s) => State::Failed(Some(s)),
            };
        }
        match &mut this.state {
            State::Failed(s) => {
                let s = s.take().unwrap_or_else(|| Status::internal("future polled after completion"));
                this.state = State::Done;
                Poll::Ready(Err(s))
            }
            State::Done | State::Reconnect { .. } => {
                Poll::Ready(Err(Status::internal("future polled after completion")))
            }
            State::Waiting { epoch, ticket } => {
                let Ok(mut inner) = this.client.inner.try_borrow_mut() else {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                };
                let r = if *epoch == inner.epoch {
                    with_calls!(&mut inner.calls, c => c.poll_call::<T>(ticket))
                } else {
                    Some(Err(inner.ended_status(*epoch)))
                };
                match r {
                    Some(r) => {
                        this.state = State::Done;
                        Poll::Ready(r)
                    }
                    None => {
                        // Busy-polling future: ask to be polled again.
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                }
            }
        }
    }
}

impl<T> Drop for ResponseFuture<'_, T> {
    fn drop(&mut self) {
        if let State::Waiting { epoch, ticket } = self.state {
            if let Ok(mut inner) = self.client.inner.try_borrow_mut() {
                if inner.epoch == epoch {
                    with_calls!(&mut inner.calls, c => c.abandon(ticket));
                }
            }
        }
    }
}

/// The messages of a server stream, in order, taken by the calling thread
/// ([`Client::server_stream`]). Each message taken returns its credit to the server, so a caller
/// that stops taking them stalls the server's producer once the stream's grants (half the
/// session's, 16 messages by default) are held here. Dropping it before its end cancels the
/// stream (the server's sink sees it cancelled).
pub struct Streaming<'a, T> {
    client: &'a Client,
    call: CallId,
    /// The session the stream was opened on (a reconnect ends it UNAVAILABLE).
    epoch: u64,
    done: bool,
    /// The stream's span and metrics (`ClientConfig::observe`), until its end.
    observed: Option<Box<StreamObs>>,
    _t: PhantomData<fn() -> T>,
}

/// An observed stream on the client ([`crate::observe`]): its record, and the bytes of the
/// server's messages taken so far. Dropped before the end, it records CANCELLED.
pub(crate) struct StreamObs {
    obs: Option<crate::observe::Observed>,
    bytes: usize,
}

impl Drop for StreamObs {
    fn drop(&mut self) {
        if let Some(o) = self.obs.take() {
            o.finish(crate::Code::Cancelled, self.bytes);
        }
    }
}

impl StreamObs {
    /// The record of a stream opened with no error to report at once (a `Channel`'s).
    pub(crate) fn new(mut obs: crate::observe::Observed) -> Box<StreamObs> {
        // Opened: in flight until its end.
        obs.sent();
        Box::new(StreamObs { obs: Some(obs), bytes: 0 })
    }

    /// The record of a stream whose opening gave `r` (an error ends it with its code).
    #[cold]
    pub(crate) fn opened<T>(
        obs: crate::observe::Observed,
        r: Result<T, Status>,
    ) -> Result<(T, Box<StreamObs>), Status> {
        match r {
            Ok(t) => Ok((t, StreamObs::new(obs))),
            Err(e) => {
                obs.finish(e.code(), 0);
                Err(e)
            }
        }
    }

    /// Records what a receive on an observed stream gave: a message (its bytes), or the end.
    #[cold]
    pub(crate) fn received<T: Message>(slot: &mut Option<Box<StreamObs>>, r: &Result<Option<T>, Status>) {
        match r {
            Ok(Some(m)) => {
                if let Some(o) = slot {
                    o.bytes += m.encoded_len();
                }
            }
            Ok(None) => StreamObs::ended(slot.take(), crate::Code::Ok),
            Err(s) => StreamObs::ended(slot.take(), s.code()),
        }
    }

    /// Records the stream's end with `code` (its messages' bytes as the response size).
    pub(crate) fn ended(slot: Option<Box<StreamObs>>, code: crate::Code) {
        if let Some(mut o) = slot {
            if let Some(obs) = o.obs.take() {
                obs.finish(code, o.bytes);
            }
        }
    }

    /// Records a client stream's answer.
    pub(crate) fn answered<T: Message>(slot: Option<Box<StreamObs>>, r: &Result<T, Status>) {
        if let Some(obs) = slot.and_then(|mut o| o.obs.take()) {
            obs.finish_with(r, Message::encoded_len);
        }
    }
}

impl<T: Message + Default> Streaming<'_, T> {
    /// Blocks (busy-polling per the client's policy) for the next message: `Ok(Some(m))`, or
    /// `Ok(None)` at the stream's clean end (the server finished it with OK).
    ///
    /// # Errors
    /// The stream's final status when not OK: the server's error, DEADLINE_EXCEEDED once the
    /// call's timeout (the whole stream's deadline) passed, UNAVAILABLE when the session broke
    /// (the server died mid-stream), CANCELLED. After the end (either way) every call returns
    /// `Ok(None)`.
    pub fn message(&mut self) -> Result<Option<T>, Status> {
        if self.done {
            return Ok(None);
        }
        let r = {
            let mut inner = self.client.inner.borrow_mut();
            if inner.epoch != self.epoch {
                Err(inner.ended_status(self.epoch))
            } else {
                with_calls!(&mut inner.calls, c => c.core.wait_stream(self.call))
            }
        };
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        if self.observed.is_some() {
            StreamObs::received(&mut self.observed, &r);
        }
        r
    }

    /// Polls once without blocking: `None` while no message and no end is there, else what
    /// [`Streaming::message`] would return.
    pub fn try_message(&mut self) -> Option<Result<Option<T>, Status>> {
        if self.done {
            return Some(Ok(None));
        }
        let r = {
            let mut inner = self.client.inner.borrow_mut();
            if inner.epoch != self.epoch {
                Err(inner.ended_status(self.epoch))
            } else {
                with_calls!(&mut inner.calls, c => c.core.poll_stream(self.call))?
            }
        };
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        if self.observed.is_some() {
            StreamObs::received(&mut self.observed, &r);
        }
        Some(r)
    }
}

impl<T: Message + Default> Iterator for Streaming<'_, T> {
    type Item = Result<T, Status>;

    fn next(&mut self) -> Option<Result<T, Status>> {
        self.message().transpose()
    }
}

impl<T> Drop for Streaming<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            let mut inner = self.client.inner.borrow_mut();
            if inner.epoch == self.epoch {
                with_calls!(&mut inner.calls, c => c.core.abandon_stream(self.call));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    fn sendable<T: Send>() {}

    #[test]
    fn client_and_responder_are_send() {
        sendable::<super::Client>();
        sendable::<crate::codegen::Responder<()>>();
    }
}
