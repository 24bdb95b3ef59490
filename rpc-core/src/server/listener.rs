//! The listener thread: accepts TCP connections, runs the handshake, creates each session's QP
//! and buffers on the least-loaded worker, hands it over through the worker's control queue, and
//! watches the TCP connections as the liveness and teardown channel.
//!
//! It sleeps in `epoll_wait` (through `mio`) until the listening socket or a connection is
//! readable, a handshake's deadline passes, the server stops (a [`mio::Waker`]) or
//! [`HOUSEKEEPING`] elapses (to close the TCP of sessions a worker closed). Each connection has
//! TCP keepalive and `TCP_USER_TIMEOUT` set from `ServerConfig::peer_timeout`, so a client
//! host that vanishes silently makes its connection readable with an error within that time.
//!
//! It never waits for a worker: what it hands over goes through the worker's bounded control
//! queue without blocking (a new session whose worker's queue is full is refused UNAVAILABLE; a
//! close waits in the listener, in a list bounded by the worker's sessions, and is handed over
//! at a later turn), and the window bind is awaited without blocking (above). It also watches
//! the workers ([`Watchdog`]): a worker whose loop stands still for [`STALL`] is held in an
//! inline handler, and new sessions go to the other workers; one that stands still for
//! `peer_timeout` has the control connections of its sessions closed, so their clients reconnect
//! to a worker that runs instead of waiting on one that answers nothing (the worker frees the
//! sessions when it comes back).

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::{ServerConfig, ServerError, ServerHandle};
use crate::buffers::{RecvPool, SendPool, SendQueue};
use crate::control::{ControlStream, Liveness, Sniff};
use crate::dispatch::registry::Registry;
use crate::dispatch::reply::DeferQueue;
use crate::endpoint::areas::SendAreas;
use crate::endpoint::conn::{body_area, create_cq, create_qp, handshake, send_bufs_for, srq_need, Conn};
use crate::endpoint::counters::{ServerMemory, SharedCounters};
use crate::session::srq_need_ringless;
use crate::session::{Role, Session, SessionParams};
use crate::status::Status;
use crate::transport::Device;
use crate::verbs::rc::{self, Endpoint};
use crate::verbs::{Context, DeviceSelector, Provider, QueuePair};
use crate::wire::{
    read_frame, write_frame, Frame, FrameError, Handshake, Refusal, FLAG_DETACHED, FLAG_IDLE_PONGS, FLAG_SHM,
    HEADER_LEN, MAX_AUTH_TOKEN, MAX_FRAME, MIN_RING_LEN,
};
use crate::worker::{Control, NewConn, Worker, WorkerLimits, WorkerShared};
use crate::worker::{BIND_DONE, BIND_PENDING};

/// Session ids are unique per process.
static NEXT_SESSION: AtomicU32 = AtomicU32::new(1);

/// Opens the device, starts the workers and the listener thread.
pub(super) fn start<P: Provider>(
    config: ServerConfig,
    registry: Arc<Registry>,
    tcp: TcpListener,
    selector: &DeviceSelector,
    port: u8,
    gid_index: i32,
    shm: ShmRole,
) -> Result<ServerHandle, ServerError> {
    let local_addr =
        tcp.local_addr().map_err(|e| ServerError::Listen { addr: "the bound socket".into(), source: e })?;
    let dev = Arc::new(Device::<P>::open(selector, port, gid_index)?);
    let mut config = config;
    let drain_timeout = config.drain_timeout;
    let mut depth = config.effective_srq_depth();
    let max_srq_wr = dev.ctx.attr().max_srq_wr;
    let per_worker_sessions = config.max_sessions.div_ceil(config.worker_cores.len().max(1)) as u64;
    // The sessions' idle reservations are shared beyond `srq_idle_wqes` (`session::SrqRoom`).
    let idle_depth = (per_worker_sessions * u64::from(srq_need_ringless(config.first_credits())))
        .min(u64::from(config.srq_idle_wqes));
    if config.srq_depth == 0 && depth > u64::from(max_srq_wr) && idle_depth <= u64::from(max_srq_wr) {
        // Every session fits idle (credits are granted on demand): raises share what is left.
        depth = u64::from(max_srq_wr);
    }
    if depth > u64::from(max_srq_wr) {
        let why = if config.srq_depth == 0 {
            format!(
                "sizing for max_sessions {} over {} worker(s) at initial_credits {} needs {idle_depth} \
                 receive WQEs per worker (the idle sessions' shared at most srq_idle_wqes), above \
                 the device's max_srq_wr {max_srq_wr}: lower max_sessions, initial_credits or \
                 srq_idle_wqes, add worker_cores, or set srq_depth (sessions are then admitted \
                 while it has room)",
                config.max_sessions,
                config.worker_cores.len().max(1),
                config.first_credits()
            )
        } else {
            format!("{depth} is above the device's max_srq_wr {max_srq_wr}")
        };
        return Err(ServerError::Config { field: "srq_depth", reason: why });
    }
    config.srq_depth = depth as u32;
    let cores: Vec<Option<usize>> = if config.worker_cores.is_empty() {
        vec![None]
    } else {
        config.worker_cores.iter().map(|&c| Some(c)).collect()
    };
    let per_worker = config.max_sessions.div_ceil(cores.len()).max(1);
    let liveness = Liveness::for_peer_timeout(config.peer_timeout);
    let poll = Poll::new().map_err(|e| ServerError::Thread { what: "listener poll", source: e })?;
    let waker = Arc::new(
        Waker::new(poll.registry(), WAKE)
            .map_err(|e| ServerError::Thread { what: "listener waker", source: e })?,
    );
    let draining = Arc::new(AtomicBool::new(false));
    let stop_listener = Arc::new(ListenerStop { stop: AtomicBool::new(false), waker: waker.clone() });
    let (shm_in, shm_out) = match shm {
        ShmRole::None => (None, None),
        ShmRole::Receives(h) => {
            let _ = h.waker.set(waker.clone());
            (Some(h), None)
        }
        ShmRole::Forwards(h) => (None, Some(h)),
    };
    let closed = Arc::new(ArrayQueue::new(config.max_sessions.max(16)));
    let body_cap = body_area(config.eager_threshold);
    let memory = Arc::new(ServerMemory::new(
        config.max_reassembly_bytes,
        config.max_backlog_bytes,
        config.max_send_area_bytes,
        config.max_ring_pool_bytes,
    ));
    let limits = WorkerLimits {
        max_sessions: per_worker,
        srq_depth: config.srq_depth,
        polling: config.polling,
        drain_timeout: config.drain_timeout,
        peer_timeout: config.peer_timeout,
        idle_timeout: config.idle_timeout,
        send_area_idle: config.send_area_idle,
        ring_idle: config.ring_idle,
        credit_idle: config.credit_idle,
        ring_len: config.ring_bytes,
        mw_type2: dev.ctx.attr().mw_type2,
        max_call_duration: config.max_call_duration,
        body_cap,
        max_metadata: config.max_metadata_bytes as usize,
        observe: config.observe,
    };
    // Each worker says here when its loop ended (shutdown waits on it, not on a timer).
    let (exit_tx, exited) = std::sync::mpsc::channel::<usize>();
    let mut shared_all = Vec::new();
    let mut registered_all = Vec::new();
    let mut joins = Vec::new();
    let mut counters = Vec::new();
    for (index, core) in cores.into_iter().enumerate() {
        let pd = dev.ctx.alloc_pd()?;
        let sends = (per_worker as u32).saturating_mul(u32::from(send_bufs_for(config.credits_per_session)));
        let cq = create_cq::<P>(&dev.ctx, config.srq_depth, sends, config.polling.needs_events())?;
        // The SRQ is created for the worst case; its buffers are registered and posted as
        // sessions are admitted (`Listener::grow_recv`).
        let recv = RecvPool::<P>::with_capacity(
            &pd,
            config.srq_depth,
            HEADER_LEN + body_cap,
            crate::worker::RECV_CHUNK_SHIFT,
        )?;
        // The send buffers of all the worker's sessions: none until a session sends.
        let send = SendPool::<P>::growable(
            &pd,
            HEADER_LEN + body_cap,
            crate::worker::SEND_CHUNK.trailing_zeros(),
            config.max_send_pool_bytes,
        )?;
        let registered = crate::buffers::RegisteredPool::new::<P>(pd.clone(), config.registered_buffer_bytes);
        registered_all.push(registered.clone());
        let shared = Arc::new(WorkerShared {
            registered,
            index,
            control: ArrayQueue::new(per_worker.max(16)),
            defer: DeferQueue::new(4096),
            counters: Arc::new(SharedCounters::default()),
            draining: draining.clone(),
            sessions: AtomicUsize::new(0),
            beat: AtomicU32::new(0),
            srq_room: crate::session::SrqRoom::sharing(config.srq_idle_wqes),
            closed: closed.clone(),
            listener: waker.clone(),
            memory: memory.clone(),
            pd,
            cq,
            srq: recv.srq().clone(),
        });
        counters.push(shared.counters.clone());
        let (worker_shared, worker_registry) = (shared.clone(), registry.clone());
        let interceptor = config.interceptor.clone();
        let exit = super::ExitSignal { index, tx: exit_tx.clone() };
        let j = std::thread::Builder::new()
            .name(format!("rpc-worker-{index}"))
            .spawn(move || {
                // Dropped last, also when the worker panics.
                let _exit = exit;
                if let Some(c) = core {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                        tracing::warn!(worker = index, core = c, "pinning to core failed; running unpinned");
                    }
                }
                Worker::new(worker_shared, worker_registry, recv, send, limits, interceptor).run();
            })
            .map_err(|e| ServerError::Thread { what: "worker", source: e })?;
        joins.push(j);
        shared_all.push(shared);
    }
    tcp.set_nonblocking(true).map_err(|e| ServerError::Listen { addr: local_addr.to_string(), source: e })?;
    let held: Arc<Vec<AtomicBool>> =
        Arc::new((0..shared_all.len()).map(|_| AtomicBool::new(false)).collect());
    let held_seen = held.clone();
    let _ = memory.srq_rooms.set(shared_all.iter().map(|w| w.srq_room.clone()).collect());
    let workers = shared_all.len();
    let stop = stop_listener.clone();
    let shutting_down = draining.clone();
    let listener_memory = memory.clone();
    let listener = std::thread::Builder::new()
        .name("rpc-listener".into())
        .spawn(move || {
            Listener {
                config,
                dev,
                watch: (0..shared_all.len()).map(|_| Watchdog::new()).collect(),
                held: held_seen,
                closes: (0..shared_all.len()).map(|_| std::collections::VecDeque::new()).collect(),
                workers: shared_all,
                closed,
                poll,
                liveness,
                next_token: FIRST_CONN,
                conns: HashMap::new(),
                tokens: HashMap::new(),
                detached: HashMap::new(),
                peers: HashMap::new(),
                accept_failed: false,
                handshakes: HashMap::new(),
                binding: HashMap::new(),
                stop,
                draining: shutting_down,
                memory: listener_memory,
                recv_posting: vec![None; workers],
                shm_in,
                shm_out,
            }
            .run(tcp)
        })
        .map_err(|e| ServerError::Thread { what: "listener", source: e })?;
    tracing::info!(%local_addr, transport = P::NAME, workers = joins.len(), "server listening");
    Ok(ServerHandle {
        local_addr,
        draining,
        stop_listener,
        workers: joins,
        exited,
        listener: Some(listener),
        counters,
        registered: registered_all,
        memory,
        drain_timeout,
        held,
        // Set by `ServerBuilder::spawn`.
        health: crate::health::HealthReporter::new(),
        drain_grace: Duration::ZERO,
        shm: None,
    })
}

/// A listener's part in the same-host path ([`ServerConfig::same_host_shm`]; only an RDMA
/// server has one).
#[cfg_attr(not(feature = "ibverbs"), allow(dead_code))]
pub(super) enum ShmRole {
    /// None: a same-host hello is refused on an RDMA NIC, admitted as any on `sim`.
    None,
    /// The software-NIC listener of the same-host workers: takes the handshakes handed to it.
    Receives(Arc<ShmHandoff>),
    /// The RDMA listener: hands same-host handshakes to the software-NIC listener.
    Forwards(Arc<ShmHandoff>),
}

/// A handshake handed over: its connection, peer and frame, and the ticket of the peer's address
/// at the RDMA listener, which the session holds there: a peer's sessions on both paths count
/// against one `max_sessions_per_peer`.
type Handed = (ControlStream, SocketAddr, Result<Frame, FrameError>, PeerTicket);

/// Same-host handshakes on their way from a server's RDMA listener to its software-NIC
/// listener: the connection (its hello read, its TLS done), the peer, and the hello. At most
/// [`MAX_PENDING_HANDSHAKES`] wait; beyond, a hello is refused UNAVAILABLE.
#[derive(Default)]
pub(super) struct ShmHandoff {
    queue: std::sync::Mutex<Vec<Handed>>,
    /// The software-NIC listener's waker (set when it starts).
    waker: std::sync::OnceLock<Arc<Waker>>,
}

impl ShmHandoff {
    /// Queues a handshake for the software-NIC listener and wakes it; gives the connection back
    /// when the queue is full or that listener is gone.
    fn hand(
        &self,
        stream: ControlStream,
        peer: SocketAddr,
        frame: Result<Frame, FrameError>,
        ticket: PeerTicket,
    ) -> Result<(), ControlStream> {
        let Some(waker) = self.waker.get() else { return Err(stream) };
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= MAX_PENDING_HANDSHAKES {
                return Err(stream);
            }
            q.push((stream, peer, frame, ticket));
        }
        if let Err(e) = waker.wake() {
            // Taken at the listener's next turn (at most HOUSEKEEPING away) all the same.
            tracing::debug!(error = %e, "waking the same-host listener failed");
        }
        Ok(())
    }

    fn take(&self) -> Vec<Handed> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Where a same-host hello ([`FLAG_SHM`]) from `peer` at an RDMA listener goes: to the
/// same-host workers' listener (`out`), or refused FAILED_PRECONDITION when the server does not
/// offer the path (`out` is `None`: naming the setting) or `peer` is not on this host (naming
/// the address: a software-NIC session is reachable only from here, and a remote peer's hello
/// would make the server connect a sim QP to whatever QP of this host the hello names). The
/// client then connects on the NIC.
fn same_host_target(out: Option<&Arc<ShmHandoff>>, peer: SocketAddr) -> Result<&Arc<ShmHandoff>, Status> {
    let Some(out) = out else {
        return Err(Status::failed_precondition(
            "handshake field `flags`: FLAG_SHM (the same-host path), which this server does not \
             offer (ServerConfig::same_host_shm is None): connect on the NIC",
        ));
    };
    if !crate::transport::is_local_ip(peer.ip()) {
        return Err(Status::failed_precondition(format!(
            "handshake field `flags`: FLAG_SHM (the same-host path) from {}, which is not an \
             address of this host: connect on the NIC",
            peer.ip()
        )));
    }
    Ok(out)
}

/// Tells the listener thread to stop, and wakes it.
pub(super) struct ListenerStop {
    stop: AtomicBool,
    waker: Arc<Waker>,
}

impl ListenerStop {
    /// Sets the flag and wakes the listener out of its wait.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self.waker.wake() {
            tracing::warn!(error = %e, "waking the listener failed; it stops at its next housekeeping tick");
        }
    }
}

/// The listening socket's token.
const LISTEN: Token = Token(0);
/// The token of the listener's waker ([`ListenerStop`], and the workers: a session they closed,
/// a window bind that completed).
const WAKE: Token = Token(1);
/// The first connection token (each accepted connection gets the next one).
const FIRST_CONN: usize = 2;
/// Longest wait without an event (the workers wake the listener for what they close and bind;
/// this tick is the fallback when a wake fails).
const HOUSEKEEPING: Duration = Duration::from_millis(20);

/// A live session's control connection.
struct Watched {
    session: u32,
    worker: usize,
    stream: TcpStream,
    /// Counts the session among its peer's ([`Listener::peers`]) while it lives.
    _peer: PeerTicket,
    /// Admitted beyond `max_control_connections`: its reply carried [`FLAG_DETACHED`], and the
    /// connection is closed as soon as the session is live ([`Listener::keep`]).
    detached: bool,
}

/// A live session that holds no control connection ([`FLAG_DETACHED`]).
struct Detached {
    worker: usize,
    _peer: PeerTicket,
}

/// One live session of a peer address: the count of a peer's sessions is its tickets'
/// (`ServerConfig::max_sessions_per_peer`).
type PeerTicket = Arc<()>;

struct Listener<P: Provider> {
    config: ServerConfig,
    dev: Arc<Device<P>>,
    workers: Vec<Arc<WorkerShared<P>>>,
    /// Per worker: whether its loop runs.
    watch: Vec<Watchdog>,
    /// Per worker: held (its loop stood still for [`STALL`]), for `ServerHandle::held_workers`.
    held: Arc<Vec<AtomicBool>>,
    /// Per worker: sessions to close that its full control queue did not take yet (each session
    /// at most once: bounded by its sessions).
    closes: Vec<std::collections::VecDeque<u32>>,
    closed: Arc<ArrayQueue<u32>>,
    poll: Poll,
    liveness: Liveness,
    next_token: usize,
    /// Live sessions by the token of their TCP connection.
    conns: HashMap<Token, Watched>,
    /// The token of each live session's connection in `conns`, by session id.
    tokens: HashMap<u32, Token>,
    /// Live sessions that hold no control connection, by session id.
    detached: HashMap<u32, Detached>,
    /// Per peer IP address: the ticket its live sessions hold (a count of `strong_count - 1`;
    /// entries with none are swept as sessions close).
    peers: HashMap<std::net::IpAddr, PeerTicket>,
    /// The last accept failed (out of descriptors, say): retried every turn.
    accept_failed: bool,
    /// Accepted connections whose handshake frame is still arriving (read without blocking, so
    /// a slow or silent peer holds up nobody).
    handshakes: HashMap<Token, PendingHandshake>,
    /// Sessions handed to their worker whose handshake reply waits for the worker to bind the
    /// ring's window (it wakes the listener when the bind completes or fails).
    binding: HashMap<Token, PendingBind>,
    stop: Arc<ListenerStop>,
    /// Set by shutdown: no new sessions (a worker may already have stopped).
    draining: Arc<AtomicBool>,
    /// The server's memory gauges and caps (sessions are charged against them).
    memory: Arc<ServerMemory>,
    /// Per worker: the `bound` flag of the last session that brought it new receive buffers;
    /// until the worker took that session (the flag leaves `BIND_PENDING`), the buffers may not
    /// be posted yet, so the replies of sessions admitted meanwhile wait too.
    recv_posting: Vec<Option<Arc<AtomicU8>>>,
    /// The same-host handshakes handed to this (software-NIC) listener
    /// ([`ServerConfig::same_host_shm`]).
    shm_in: Option<Arc<ShmHandoff>>,
    /// Where this (RDMA) listener hands same-host handshakes.
    shm_out: Option<Arc<ShmHandoff>>,
}

impl<P: Provider> Listener<P> {
    fn run(mut self, tcp: TcpListener) {
        if let Err(e) =
            self.poll.registry().register(&mut SourceFd(&tcp.as_raw_fd()), LISTEN, Interest::READABLE)
        {
            tracing::error!(error = %e, "registering the listening socket failed: no connection will be accepted");
        }
        let mut events = Events::with_capacity(256);
        while !self.stop.stop.load(Ordering::Acquire) {
            let wait = self
                .next_deadline()
                .map_or(HOUSEKEEPING, |d| d.saturating_duration_since(Instant::now()).min(HOUSEKEEPING));
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != ErrorKind::Interrupted {
                    tracing::warn!(error = %e, "listener poll failed");
                    std::thread::sleep(HOUSEKEEPING);
                }
                continue;
            }
            if self.accept_failed {
                self.accept_all(&tcp);
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTEN => self.accept_all(&tcp),
                    WAKE => {}
                    t if self.handshakes.contains_key(&t) => self.advance_handshake(t),
                    t => self.check_conn(t),
                }
            }
            self.take_handoffs();
            self.expire_handshakes();
            self.finish_binds();
            self.watch_workers();
            self.hand_over_closes();
            while let Some(session) = self.closed.pop() {
                if self.detached.remove(&session).is_none() {
                    if let Some(c) = self.tokens.remove(&session).and_then(|t| self.conns.remove(&t)) {
                        self.forget(&c.stream);
                    }
                }
            }
            self.memory.control_connections.store(self.conns.len() as u64, Ordering::Relaxed);
            self.memory.sessions_detached.store(self.detached.len() as u64, Ordering::Relaxed);
        }
        self.conns.clear();
        self.tokens.clear();
        self.detached.clear();
        self.handshakes.clear();
        self.binding.clear();
        tracing::info!("server stopped");
    }

    /// The earliest handshake deadline (of a frame still arriving, or of a bind).
    fn next_deadline(&self) -> Option<Instant> {
        let frames = self.handshakes.values().map(|h| h.since);
        frames.chain(self.binding.values().map(|b| b.since)).min().map(|t| t + self.config.handshake_timeout)
    }

    /// Answers the handshakes whose window bind completed (the session is live from then on),
    /// and refuses those whose bind failed or did not complete within `handshake_timeout`.
    fn finish_binds(&mut self) {
        if self.binding.is_empty() {
            return;
        }
        let limit = self.config.handshake_timeout;
        let done: Vec<Token> = self
            .binding
            .iter()
            .filter(|(_, b)| b.bound.load(Ordering::Acquire) != BIND_PENDING || b.since.elapsed() >= limit)
            .map(|(t, _)| *t)
            .collect();
        for t in done {
            let Some(mut b) = self.binding.remove(&t) else { continue };
            let refusal = match b.bound.load(Ordering::Acquire) {
                BIND_DONE => match answer(&mut b.stream, &b.reply) {
                    Ok(()) => None,
                    Err(e) => Some(Status::unavailable(format!("handshake with {}: {e}", b.peer))),
                },
                BIND_PENDING => Some(Self::refuse(
                    &mut b.stream,
                    Status::unavailable(format!(
                        "the worker did not bind the receive ring's memory window within {} ms \
                         (ServerConfig::handshake_timeout)",
                        limit.as_millis()
                    )),
                )),
                _ => Some(Self::refuse(
                    &mut b.stream,
                    Status::unavailable("binding the receive ring's memory window to the QP failed"),
                )),
            };
            match refusal {
                None => {
                    tracing::info!(session = b.session, peer = %b.peer, worker = b.worker, "session connected");
                    let stream = b.stream.into_tcp();
                    let detached = b.reply.flags & FLAG_DETACHED != 0;
                    let w = Watched {
                        session: b.session,
                        worker: b.worker,
                        stream,
                        _peer: b.peer_ticket,
                        detached,
                    };
                    self.keep(t, w);
                }
                Some(e) => {
                    self.close_on(b.worker, b.session);
                    self.forget(&b.stream);
                    tracing::info!(peer = %b.peer, error = %e, "connection refused");
                }
            }
        }
    }

    /// Keeps a session that just went live: watches its control connection, or, when it was
    /// admitted detached, closes the connection (the reply was written; the client closes its
    /// end once it read it) and keeps the session's place among its peer's.
    fn keep(&mut self, token: Token, w: Watched) {
        if w.detached {
            self.forget(&w.stream);
            let _ = w.stream.shutdown(std::net::Shutdown::Write);
            self.detached.insert(w.session, Detached { worker: w.worker, _peer: w._peer });
            return;
        }
        self.tokens.insert(w.session, token);
        self.conns.insert(token, w);
        // What arrived meanwhile (or the peer's close) sent no new edge.
        self.check_conn(token);
    }

    /// Whether the next session admitted holds no control connection: the live ones (and
    /// those waiting for a bind) reached `max_control_connections`, and a dead client would
    /// still be found without it (`peer_timeout` for a client that answers Pings while idle,
    /// `idle_timeout` for any).
    fn detach_next(&self, hello: &Handshake) -> bool {
        let held = self.conns.len() + self.binding.len();
        let found_dead = self.config.idle_timeout.is_some()
            || (self.config.peer_timeout.is_some() && hello.flags & FLAG_IDLE_PONGS != 0);
        held >= self.config.max_control_connections && found_dead
    }

    /// Stops watching `stream` (before it is dropped or handed on).
    fn forget(&self, stream: &TcpStream) {
        let _ = self.poll.registry().deregister(&mut SourceFd(&stream.as_raw_fd()));
    }

    /// Accepts every pending connection.
    fn accept_all(&mut self, tcp: &TcpListener) {
        loop {
            match tcp.accept() {
                Ok((stream, peer)) => {
                    if std::mem::take(&mut self.accept_failed) {
                        tracing::info!("accepting connections again");
                    }
                    self.admit(stream, peer);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.accept_failed = false;
                    return;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE, ENOBUFS...: the connection stays in the backlog. The socket is
                    // watched edge-triggered, so no new event may come for it: every turn of
                    // the loop (at least every HOUSEKEEPING) tries again while this is set.
                    if !std::mem::replace(&mut self.accept_failed, true) {
                        tracing::warn!(error = %e, "accept failed: retrying every turn until it succeeds");
                    }
                    return;
                }
            }
        }
    }

    /// Starts reading the handshake of an accepted connection (without blocking).
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        if let Err(e) = stream.set_nonblocking(true).and_then(|()| self.liveness.apply(&stream)) {
            tracing::info!(%peer, error = %e, "connection dropped");
            return;
        }
        let _ = stream.set_nodelay(true);
        #[cfg(feature = "tls")]
        let stream = ControlStream::accept(stream, self.config.tls.as_ref());
        #[cfg(not(feature = "tls"))]
        let stream = ControlStream::accept(stream);
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(%peer, error = %e, "connection dropped: TLS");
                return;
            }
        };
        if self.handshakes.len() >= MAX_PENDING_HANDSHAKES {
            if let Some(t) = self.handshakes.iter().min_by_key(|(_, h)| h.since).map(|(t, _)| *t) {
                if let Some(oldest) = self.handshakes.remove(&t) {
                    self.forget(&oldest.stream);
                    tracing::info!(peer = %oldest.peer, "too many handshakes in progress: the oldest dropped");
                }
            }
        }
        let token = match self.watch(&stream) {
            Ok(t) => t,
            Err(e) => {
                tracing::info!(%peer, error = %e, "connection dropped: cannot watch it");
                return;
            }
        };
        self.handshakes
            .insert(token, PendingHandshake { stream, peer, since: Instant::now(), buf: Vec::new() });
        // Bytes may have arrived before the registration (no edge would report them).
        self.advance_handshake(token);
    }

    /// Reads what arrived of a pending handshake; sets up the session when its frame is complete,
    /// drops the connection when it closed.
    fn advance_handshake(&mut self, token: Token) {
        let Some(hs) = self.handshakes.get_mut(&token) else { return };
        match hs.step() {
            HandshakeStep::Wait => {}
            HandshakeStep::Mismatch(status) => {
                if let Some(mut hs) = self.handshakes.remove(&token) {
                    self.forget(&hs.stream);
                    let e = Self::refuse(&mut hs.stream, status);
                    tracing::info!(peer = %hs.peer, error = %e, "connection refused");
                }
            }
            HandshakeStep::Gone(why) => {
                if let Some(hs) = self.handshakes.remove(&token) {
                    self.forget(&hs.stream);
                    tracing::info!(peer = %hs.peer, error = %why, "connection closed during the handshake");
                }
            }
            HandshakeStep::Frame(frame) => {
                let Some(hs) = self.handshakes.remove(&token) else { return };
                let same_host = matches!(&frame, Ok(Frame::Handshake(h)) if h.flags & FLAG_SHM != 0);
                if same_host && P::NAME != crate::verbs::sim::Sim::NAME {
                    return self.hand_to_shm(hs.stream, hs.peer, frame);
                }
                self.finish_handshake(token, hs.stream, hs.peer, frame, None);
            }
        }
    }

    /// Sets up the session of a complete handshake frame read on `token`'s connection (`handed`:
    /// the peer's ticket at the RDMA listener that handed it over, see [`Handed`]).
    fn finish_handshake(
        &mut self,
        token: Token,
        stream: ControlStream,
        peer: SocketAddr,
        frame: Result<Frame, FrameError>,
        handed: Option<PeerTicket>,
    ) {
        match self.setup(stream, peer, frame, handed) {
            Ok(Setup::Live(watched)) => self.keep(token, watched),
            Ok(Setup::Binding(b)) => {
                self.binding.insert(token, b);
                // The worker may have bound it already (its wake came before the entry).
                self.finish_binds();
            }
            Err((stream, e)) => {
                self.forget(&stream);
                tracing::info!(%peer, error = %e, "connection refused");
            }
        }
    }

    /// A same-host hello ([`FLAG_SHM`]: the client's QP is on the software NIC) at this RDMA
    /// listener: handed to the same-host workers' listener, or refused when there are none
    /// (FAILED_PRECONDITION naming the setting: the client connects again on the NIC) or too
    /// many wait for it (UNAVAILABLE).
    fn hand_to_shm(&mut self, stream: ControlStream, peer: SocketAddr, frame: Result<Frame, FrameError>) {
        self.forget(&stream);
        let out = match same_host_target(self.shm_out.as_ref(), peer) {
            Ok(out) => out,
            Err(status) => {
                let mut stream = stream;
                let e = Self::refuse(&mut stream, status);
                tracing::info!(%peer, error = %e, "same-host connection refused");
                return;
            }
        };
        let ticket = self.peers.entry(peer.ip()).or_default().clone();
        if let Err(mut stream) = out.hand(stream, peer, frame, ticket) {
            let e = Self::refuse(
                &mut stream,
                Status::unavailable("the same-host path has too many handshakes waiting: try again"),
            );
            tracing::info!(%peer, error = %e, "same-host connection refused");
        }
    }

    /// Takes the same-host handshakes the RDMA listener handed over: each connection is watched
    /// here from now on and its session set up on this listener's (software-NIC) workers.
    fn take_handoffs(&mut self) {
        let Some(h) = self.shm_in.clone() else { return };
        for (stream, peer, frame, ticket) in h.take() {
            match self.watch(&stream) {
                Ok(token) => self.finish_handshake(token, stream, peer, frame, Some(ticket)),
                Err(e) => tracing::info!(%peer, error = %e, "same-host connection dropped: cannot watch it"),
            }
        }
    }

    /// Watches `stream` for reads under a new token.
    fn watch(&mut self, stream: &TcpStream) -> std::io::Result<Token> {
        let token = Token(self.next_token);
        self.next_token = self.next_token.checked_add(1).unwrap_or(FIRST_CONN);
        self.poll.registry().register(&mut SourceFd(&stream.as_raw_fd()), token, Interest::READABLE)?;
        Ok(token)
    }

    /// Drops the handshakes that ran out of `handshake_timeout`.
    fn expire_handshakes(&mut self) {
        let limit = self.config.handshake_timeout;
        let late: Vec<Token> =
            self.handshakes.iter().filter(|(_, h)| h.since.elapsed() >= limit).map(|(t, _)| *t).collect();
        for t in late {
            if let Some(hs) = self.handshakes.remove(&t) {
                self.forget(&hs.stream);
                tracing::info!(peer = %hs.peer, "connection refused: no handshake within handshake_timeout");
            }
        }
    }

    /// A live session's connection is readable: drains it (nothing is defined after the
    /// handshake, so stray bytes are dropped) and closes the session when the connection closed
    /// or failed (a keepalive or user timeout reads as `ETIMEDOUT`).
    fn check_conn(&mut self, token: Token) {
        let Some(c) = self.conns.get(&token) else { return };
        let mut junk = [0u8; 64];
        let why = loop {
            match (&c.stream).read(&mut junk) {
                Ok(0) => break "closed by the peer".to_string(),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => break e.to_string(),
            }
        };
        if let Some(c) = self.conns.remove(&token) {
            self.tokens.remove(&c.session);
            self.forget(&c.stream);
            tracing::info!(session = c.session, reason = %why, "peer disconnected");
            self.close_on(c.worker, c.session);
        }
    }

    /// Tells worker `wi` to close `session`: through its control queue, or, while that is full,
    /// at a later turn ([`Listener::hand_over_closes`]); never waits.
    fn close_on(&mut self, wi: usize, session: u32) {
        let pending = &mut self.closes[wi];
        if !pending.is_empty() {
            pending.push_back(session);
            return;
        }
        if let Err(Control::Close(s)) = self.workers[wi].control.push(Control::Close(session)) {
            pending.push_back(s);
        }
    }

    /// Hands the closes the control queues had no room for to their workers, oldest first, as
    /// far as the queues take them.
    fn hand_over_closes(&mut self) {
        for (wi, pending) in self.closes.iter_mut().enumerate() {
            while let Some(&session) = pending.front() {
                if self.workers[wi].control.push(Control::Close(session)).is_err() {
                    break;
                }
                pending.pop_front();
            }
        }
    }

    /// Looks at every worker's beat: warns once when one stands still for [`STALL`] (held in
    /// an inline handler), and when it stands still for `peer_timeout` closes the control
    /// connections of its sessions (their clients reconnect; the worker frees the sessions
    /// when it comes back).
    fn watch_workers(&mut self) {
        // A shutting-down worker closes every session in one pass (a Close to each, then its
        // QP and memory): its beat stands still for that while, which is not a handler's doing.
        if self.draining.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let evict_after = self.config.peer_timeout.unwrap_or(crate::control::DEFAULT_LIVENESS_TIMEOUT);
        for wi in 0..self.workers.len() {
            let beat = self.workers[wi].beat.load(Ordering::Relaxed);
            let w = &mut self.watch[wi];
            if w.see(beat, now) {
                self.held[wi].store(false, Ordering::Release);
                continue;
            }
            let still = now.saturating_duration_since(w.since);
            if still >= STALL && !w.warned {
                w.warned = true;
                self.held[wi].store(true, Ordering::Release);
                tracing::warn!(
                    worker = wi,
                    still_ms = still.as_millis() as u64,
                    "worker held (an inline handler blocks it): new sessions go to the other workers; \
                     move blocking work to a deferred handler"
                );
            }
            if still >= evict_after && !w.evicted {
                w.evicted = true;
                let gone: Vec<Token> =
                    self.conns.iter().filter(|(_, c)| c.worker == wi).map(|(t, _)| *t).collect();
                tracing::warn!(
                    worker = wi,
                    sessions = gone.len(),
                    "worker held for peer_timeout: closing its sessions' control connections"
                );
                for t in gone {
                    if let Some(c) = self.conns.remove(&t) {
                        self.tokens.remove(&c.session);
                        self.forget(&c.stream);
                        self.close_on(wi, c.session);
                    }
                }
                // Their clients learn it from the probe or the Close when the worker is back.
                let gone: Vec<u32> =
                    self.detached.iter().filter(|(_, d)| d.worker == wi).map(|(s, _)| *s).collect();
                for session in gone {
                    self.detached.remove(&session);
                    self.close_on(wi, session);
                }
            }
        }
    }

    fn refuse(stream: &mut ControlStream, status: Status) -> Status {
        let _ = write_frame(
            stream,
            &Frame::Refusal(Refusal { code: status.code(), message: status.message().to_string() }),
        );
        status
    }

    /// Answers a complete handshake frame: the watched connection of the new session (or the
    /// session waiting for its window bind before the reply), or the stream (to be dropped) and
    /// why it was refused.
    fn setup(
        &mut self,
        mut stream: ControlStream,
        peer: SocketAddr,
        frame: Result<Frame, FrameError>,
        handed: Option<PeerTicket>,
    ) -> Result<Setup, (ControlStream, Status)> {
        let result = self.setup_inner(&mut stream, peer, frame, handed.as_ref());
        if result.is_ok() && self.peers.len() > 2 * (self.conns.len() + self.detached.len()) + 64 {
            self.peers.retain(|_, t| Arc::strong_count(t) > 1);
        }
        let mut ticket =
            || handed.clone().unwrap_or_else(|| self.peers.entry(peer.ip()).or_default().clone());
        match result {
            Ok((session, worker, None, detached)) => {
                let _peer = ticket();
                Ok(Setup::Live(Watched { session, worker, stream: stream.into_tcp(), _peer, detached }))
            }
            Ok((session, worker, Some((reply, bound)), _)) => Ok(Setup::Binding(PendingBind {
                stream,
                peer,
                session,
                worker,
                reply,
                bound,
                since: Instant::now(),
                peer_ticket: ticket(),
            })),
            Err(e) => Err((stream, e)),
        }
    }

    /// The session id and worker of an admitted session, when its ring has a window the reply
    /// to send once the worker bound it (sent here otherwise), and whether it is admitted
    /// detached ([`FLAG_DETACHED`], also in the reply).
    #[allow(clippy::type_complexity)]
    fn setup_inner(
        &mut self,
        stream: &mut ControlStream,
        peer: SocketAddr,
        frame: Result<Frame, FrameError>,
        handed: Option<&PeerTicket>,
    ) -> Result<(u32, usize, Option<(Handshake, Arc<AtomicU8>)>, bool), Status> {
        let span = tracing::info_span!("connect", %peer, transport = P::NAME);
        let _entered = span.enter();
        let io = |e: std::io::Error| Status::unavailable(format!("handshake with {peer}: {e}"));
        stream.set_nonblocking(false).map_err(io)?;
        stream.set_write_timeout(Some(self.config.handshake_timeout)).map_err(io)?;
        let hello = match frame {
            Ok(Frame::Handshake(h)) => h,
            Ok(Frame::Refusal(r)) => return Err(Status::new(r.code, r.message)),
            Err(FrameError::Wire(e)) => {
                return Err(Self::refuse(stream, Status::invalid_argument(format!("bad handshake: {e}"))))
            }
            Err(e) => return Err(Status::unavailable(format!("handshake with {peer}: {e}"))),
        };
        if self.draining.load(Ordering::Acquire) {
            return Err(Self::refuse(stream, Status::unavailable("server is shutting down")));
        }
        if hello.flags & FLAG_DETACHED != 0 {
            return Err(Self::refuse(
                stream,
                Status::invalid_argument(
                    "handshake field `flags`: FLAG_DETACHED (0x0002) is the server's to set, not the client's",
                ),
            ));
        }
        if let Some(token) = &self.config.auth_token {
            if !token_matches(token, &hello.auth_token) {
                return Err(Self::refuse(
                    stream,
                    Status::unauthenticated("handshake field `auth_token` does not match"),
                ));
            }
        }
        // What the client asks is checked against the caps before anything is registered for it.
        if let Err(e) = self.check_asked(&hello) {
            return Err(Self::refuse(stream, e));
        }
        let live: usize = self.workers.iter().map(|w| w.sessions.load(Ordering::Relaxed)).sum();
        if live >= self.config.max_sessions {
            return Err(Self::refuse(
                stream,
                Status::resource_exhausted(format!("max_sessions {} reached", self.config.max_sessions)),
            ));
        }
        let cap = self.config.max_sessions_per_peer;
        // The peer's live sessions: the holders of its ticket but the map (and, for a handed
        // hello, the hello's own).
        let of_peer = match handed {
            Some(t) => Arc::strong_count(t).saturating_sub(2),
            None => self.peers.get(&peer.ip()).map_or(0, |t| Arc::strong_count(t) - 1),
        };
        if cap > 0 && of_peer >= cap {
            return Err(Self::refuse(
                stream,
                Status::resource_exhausted(format!(
                    "max_sessions_per_peer {cap} reached: {of_peer} sessions from {}",
                    peer.ip()
                )),
            ));
        }
        // The session's most credits (its client's window, at most `credits_per_session`); it
        // starts at `initial_credits` and is raised on demand (`session::credits`).
        let credits = hello.credits.min(self.config.credits_per_session);
        let initial = self.config.first_credits().min(credits);
        // The least loaded worker that runs (one held in a handler takes nothing); when none
        // runs, the least loaded (its bind is awaited without blocking, within
        // `handshake_timeout`).
        let (wi, w) = self
            .workers
            .iter()
            .enumerate()
            .min_by_key(|(i, w)| (self.watch[*i].stalled(), w.sessions.load(Ordering::Relaxed)))
            .expect("at least one worker");
        // The sessions of a worker hold different credits: what they reserve is summed.
        // No receive ring at connect (granted on demand): its pieces row is reserved with it.
        let need = srq_need_ringless(initial);
        if let Err(reserved) = w.srq_room.admit(need, self.config.srq_depth) {
            return Err(Self::refuse(
                stream,
                Status::resource_exhausted(format!(
                    "srq_depth {} cannot hold another session of {initial} credits ({need} receive \
                         WQEs) on a worker whose sessions reserve {reserved}",
                    self.config.srq_depth
                )),
            ));
        }
        let eager = hello.eager_threshold.min(self.config.eager_threshold);
        let max_message = hello.max_message.min(self.config.max_message_size);
        let w = w.clone();
        // The SRQ holds, up to its depth, what the worker's sessions reserve, and room for this
        // one to reach its most credits with a ring; a raise or ring grant that later finds no
        // room has the worker post more (`Worker::grow_srq_room`).
        let target = w.srq_room.reserved().saturating_add(srq_need(credits) - need);
        let buf_size = HEADER_LEN + body_area(self.config.eager_threshold);
        let recv_chunks = match w.grow_srq(target, self.config.srq_depth, buf_size) {
            Ok(c) => c,
            Err(e) => {
                w.srq_room.leave(need);
                return Err(Self::refuse(stream, e));
            }
        };
        let recv_added: (u32, u64) =
            recv_chunks.iter().fold((0, 0), |(n, b), c| (n + c.bufs(), b + c.bytes() as u64));
        let mut conn = match self.create_conn(&w, &hello, credits, eager, max_message) {
            Ok(c) => c,
            Err(e) => {
                w.srq_room.leave(need);
                w.srq_release(recv_added);
                return Err(Self::refuse(stream, e));
            }
        };
        // The session holds its reservation from here (given back when it is dropped).
        conn.0.session.grant_on_demand(w.srq_room.clone(), initial);
        // The ring is granted on demand (protocol 12) and counted then.
        // Nothing registered for it yet: its send buffers are its worker's (`SendPool::growable`).
        let registered = 0;
        self.memory.registered.add(registered);
        if hello.flags & FLAG_IDLE_PONGS != 0 {
            conn.0.session.probe_while_idle();
        }
        let local = conn.1;
        let session = conn.0.session.params().id;
        let mut reply = handshake(&local, conn.2, initial, eager, max_message, session, Vec::new());
        let detached = self.detach_next(&hello);
        if detached {
            reply.flags |= FLAG_DETACHED;
        }
        w.sessions.fetch_add(1, Ordering::Relaxed);
        let bound = Arc::new(AtomicU8::new(BIND_PENDING));
        // No ring yet (granted on demand): nothing to bind before the reply.
        let window = conn.0.ring.as_ref().is_some_and(|r| r.has_window());
        let open = Control::Open(Box::new(NewConn {
            conn: conn.0,
            session,
            peer,
            bound: bound.clone(),
            registered,
            recv_chunks,
        }));
        if w.control.push(open).is_err() {
            w.srq_release(recv_added);
            // The worker has not taken its queue for a while (held in a handler): never wait.
            // The session is dropped here (its memory deregistered with it).
            w.sessions.fetch_sub(1, Ordering::Relaxed);
            self.memory.registered.release(registered);
            return Err(Self::refuse(
                stream,
                Status::unavailable(format!("worker {wi} is busy: its control queue is full; try again")),
            ));
        }
        // The peer may write our ring as soon as it has the reply: the worker binds the ring's
        // window to the QP first, and wakes the listener when the bind completed (the reply goes
        // then, from `finish_binds`; the listener serves other connections meanwhile).
        // Nor before the worker posted the receive buffers this session needs (sent with it, or
        // with an earlier session the worker may not have taken yet).
        let posting =
            self.recv_posting[wi].as_ref().is_some_and(|b| b.load(Ordering::Acquire) == BIND_PENDING);
        if recv_added.0 > 0 {
            self.recv_posting[wi] = Some(bound.clone());
        }
        if window || posting || recv_added.0 > 0 {
            return Ok((session, wi, Some((reply, bound)), detached));
        }
        if let Err(e) = answer(stream, &reply) {
            self.close_on(wi, session);
            return Err(io(e));
        }
        tracing::info!(session, %peer, worker = wi, credits, eager, detached, "session connected");
        Ok((session, wi, None, detached))
    }

    /// Checks what a client's handshake asks for against this server's limits, before anything
    /// is registered for it. The client's ring is mirrored here (a send mirror of its length and
    /// a staging area of twice it, registered at the session's first ring body): one above `max_peer_ring_bytes` is refused
    /// RESOURCE_EXHAUSTED naming the limit, one below [`MIN_RING_LEN`] INVALID_ARGUMENT. Credits,
    /// eager threshold and message size are granted within the configuration instead (the reply
    /// carries what was granted).
    ///
    /// # Errors
    /// The refusal's status.
    fn check_asked(&self, hello: &Handshake) -> Result<(), Status> {
        let cap = self.config.max_peer_ring_bytes;
        if hello.ring_len > cap {
            return Err(Status::resource_exhausted(format!(
                "handshake field `ring_len`: the client's ring of {} bytes is above this server's \
                 ServerConfig::max_peer_ring_bytes of {cap} bytes (the server mirrors the client's \
                 ring and stages twice it): lower ClientConfig::ring_bytes to at most {cap}",
                hello.ring_len
            )));
        }
        if hello.ring_len < MIN_RING_LEN {
            return Err(Status::invalid_argument(format!(
                "handshake field `ring_len`: {} bytes is below the smallest ring, {MIN_RING_LEN} bytes \
                 (wire::MIN_RING_LEN)",
                hello.ring_len
            )));
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn create_conn(
        &self,
        w: &WorkerShared<P>,
        hello: &Handshake,
        credits: u16,
        eager: u32,
        max_message: u32,
    ) -> Result<(Conn<P>, Endpoint, (u64, u32, u32)), Status> {
        let verbs =
            |e: crate::verbs::VerbsError| Status::resource_exhausted(format!("creating the session: {e}"));
        let bufs = send_bufs_for(credits);
        let attr = self.dev.ctx.attr();
        let qp = create_qp::<P>(&w.pd, &w.cq, &w.cq, &w.srq, bufs, attr).map_err(verbs)?;
        let max_inline = qp.cap().max_inline_data;
        let sq_depth = qp.cap().max_send_wr as usize;
        let body_cap = body_area(eager);
        // No send buffer of its own: it sends from its worker's pool (`Worker::send`).
        // No receive ring at connect: the client asks for one before its first body above the
        // eager threshold (protocol 12; the worker grants it, `Worker::on_ring_ask`).
        // The send mirror of the client's ring and the staging area are registered at the
        // session's first answer above the eager threshold, and given back when unused for
        // `ServerConfig::send_area_idle` (`Conn::release_idle_areas`).
        let areas = SendAreas::<P>::new(
            w.pd.clone(),
            hello.ring_len,
            usize::from(credits),
            self.memory.areas.clone(),
        )
        .with_registered(w.registered.clone());
        let local = self.dev.endpoint(&qp);
        let remote =
            Endpoint { qp_num: hello.qp_num, psn: hello.psn, lid: hello.lid, gid: hello.gid, mtu: hello.mtu };
        rc::connect(&qp, &self.dev.rc, &local, &remote)
            .map_err(|e| Status::unavailable(format!("connecting the QP: {e}")))?;
        let params = SessionParams {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            credits,
            eager_threshold: eager,
            max_message,
            peer_ring_len: hello.ring_len,
            own_ring_len: self.config.ring_bytes,
            max_held: usize::from(credits),
        };
        // The handshake gives the length a grant will have, with no address or rkey.
        let remote_ring = (0, self.config.ring_bytes, 0);
        let mut session = Session::new(Role::Server, params);
        session.lease_own_ring();
        session.set_reassembly(
            self.memory.reassembly.clone(),
            self.config.reassembly_share(),
            self.config.reassembly_timeout,
        );
        session.set_backlog(self.memory.backlog.clone());
        session.set_load(self.memory.load.clone());
        let spare = session.spare_bodies().clone();
        let conn = Conn {
            refs: Vec::new(),
            spare,
            qp,
            ring: None,
            areas,
            written_mark: 0,
            sq: SendQueue::new(sq_depth, usize::from(bufs)),
            session,
            peer_ring: (hello.ring_addr, hello.ring_rkey),
            body_cap,
            max_inline,
        };
        Ok((conn, local, remote_ring))
    }
}

/// Whether `presented` is `token`, in time that depends on neither's bytes nor lengths: both are
/// compared as [`MAX_AUTH_TOKEN`]-byte blocks (zero-padded), lengths included, with `subtle`'s
/// constant-time equality (no early exit, no branch on the data).
fn token_matches(token: &[u8], presented: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let pad = |t: &[u8]| {
        let mut block = [0u8; MAX_AUTH_TOKEN];
        let n = t.len().min(MAX_AUTH_TOKEN);
        block[..n].copy_from_slice(&t[..n]);
        block
    };
    // Both are at most MAX_AUTH_TOKEN bytes (the config is validated, the handshake decoded).
    let lens = (token.len() as u64).ct_eq(&(presented.len() as u64));
    let bytes = pad(token)[..].ct_eq(&pad(presented)[..]);
    (lens & bytes).into()
}

/// Most handshakes in progress at once; a new connection beyond it drops the oldest.
const MAX_PENDING_HANDSHAKES: usize = 64;

/// An accepted connection whose handshake frame is still arriving.
/// Sends the handshake reply on a blocking `stream` (with its write timeout), then makes it
/// nonblocking for the watch.
fn answer(stream: &mut ControlStream, reply: &Handshake) -> std::io::Result<()> {
    write_frame(stream, &Frame::Handshake(reply.clone()))?;
    stream.set_nonblocking(true)
}

/// What a complete handshake frame became.
enum Setup {
    /// The session is live; its connection is watched.
    Live(Watched),
    /// The session waits for its worker to bind the ring's window.
    Binding(PendingBind),
}

/// A session whose handshake reply waits for its window bind.
struct PendingBind {
    stream: ControlStream,
    peer: SocketAddr,
    session: u32,
    worker: usize,
    reply: Handshake,
    /// Set by the worker ([`BIND_DONE`] or [`crate::worker::BIND_FAILED`]).
    bound: Arc<AtomicU8>,
    since: Instant,
    peer_ticket: PeerTicket,
}

struct PendingHandshake {
    stream: ControlStream,
    peer: SocketAddr,
    since: Instant,
    /// The frame's bytes so far (at most 3 + [`MAX_FRAME`]).
    buf: Vec<u8>,
}

enum HandshakeStep {
    /// More bytes are needed.
    Wait,
    /// The connection closed or failed.
    Gone(String),
    /// The client speaks TLS to a plaintext server or the reverse: refused (in plaintext).
    Mismatch(Status),
    /// The whole frame arrived (or its header is invalid).
    Frame(Result<Frame, FrameError>),
}

impl PendingHandshake {
    /// Reads what is available, up to the end of the frame (never past it).
    fn step(&mut self) -> HandshakeStep {
        match self.stream.sniff() {
            Sniff::Wait => return HandshakeStep::Wait,
            Sniff::Mismatch(status) => return HandshakeStep::Mismatch(status),
            Sniff::Ready => {}
        }
        let mut chunk = [0u8; 256];
        loop {
            let want = match self.buf.get(1..3) {
                Some(l) => 3 + usize::from(u16::from_le_bytes([l[0], l[1]])),
                None => 3,
            };
            if self.buf.len() >= want || (self.buf.len() >= 3 && want - 3 > MAX_FRAME) {
                return HandshakeStep::Frame(read_frame(&mut self.buf.as_slice()));
            }
            let n = (want - self.buf.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..n]) {
                Ok(0) => return HandshakeStep::Gone("closed by the peer".into()),
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return HandshakeStep::Wait,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return HandshakeStep::Gone(e.to_string()),
            }
        }
    }
}

/// How long a worker's loop may stand still before the listener counts it held (in an inline
/// handler): new sessions go to the other workers from then on.
pub(crate) const STALL: Duration = Duration::from_millis(100);

/// The listener's view of one worker's loop: its beat (`WorkerShared::beat`) and since when it
/// stands still.
struct Watchdog {
    beat: u32,
    since: Instant,
    warned: bool,
    evicted: bool,
}

impl Watchdog {
    fn new() -> Watchdog {
        Watchdog { beat: 0, since: Instant::now(), warned: false, evicted: false }
    }

    /// Notes the worker's beat at `now`; true when it moved (the worker runs).
    fn see(&mut self, beat: u32, now: Instant) -> bool {
        if beat != self.beat {
            if self.warned {
                tracing::info!("worker runs again");
            }
            *self = Watchdog { beat, since: now, warned: false, evicted: false };
            return true;
        }
        false
    }

    /// Whether the worker stood still for [`STALL`] at the last look.
    fn stalled(&self) -> bool {
        self.warned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A same-host hello is taken only when the server offers the path and the peer's address
    /// is this host's (loopback or bound here); a remote address (TEST-NET-1, never local) is
    /// refused FAILED_PRECONDITION naming it.
    #[test]
    fn a_same_host_hello_from_a_remote_address_is_refused() {
        let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:4000".parse().unwrap();
        let remote: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let out = Arc::new(ShmHandoff::default());
        assert!(same_host_target(Some(&out), local).is_ok());
        assert!(same_host_target(Some(&out), mapped).is_ok(), "a dual-stack socket's loopback peer");
        let s = same_host_target(Some(&out), remote).err().expect("a remote same-host hello admitted");
        assert_eq!(s.code(), crate::status::Code::FailedPrecondition, "{s}");
        assert!(s.message().contains("192.0.2.1"), "{s}");
        let s = same_host_target(None, local).err().expect("a same-host hello admitted with no path");
        assert!(s.message().contains("same_host_shm is None"), "{s}");
    }
}
