//! The server: a builder with the limits and the services, workers per core, and a handle to stop.
//!
//! ```no_run
//! # use rpc_core::server::Server;
//! # fn demo<S: rpc_core::codegen::Service>(svc: S) -> Result<(), rpc_core::server::ServerError> {
//! let handle = Server::builder().worker_cores(vec![1]).add_service(svc).spawn("127.0.0.1:0")?;
//! println!("listening on {}", handle.local_addr());
//! handle.shutdown();
//! # Ok(()) }
//! ```

pub(crate) mod async_service;
mod listener;
mod nofile;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::PollingPolicy;
use crate::dispatch::registry::Registry;
use crate::dispatch::reply::CallInfo;
pub use crate::dispatch::reply::ServerInterceptor;
use crate::dispatch::service::Service;
use crate::endpoint::counters::{Counters, ServerMemory, SharedCounters};
use crate::health::{HealthReporter, HealthService};
use crate::status::Status;
use crate::transport::Transport;
use crate::verbs::VerbsError;

/// Why a server could not start.
///
/// Its `Debug` (`{:?}`) is its `Display` text plus any source the text does not already say, as
/// `anyhow` reports errors, so `fn main() -> Result<(), ServerError>` (or `Box<dyn Error>`) prints
/// `Error: listen on 127.0.0.1:50061: Address already in use (os error 98)`; `{:#?}` shows the
/// variant and its fields.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Binding or configuring the TCP listener failed.
    #[error("listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The NIC refused (device, PD, CQ, SRQ or buffer registration).
    #[error("transport: {0}")]
    Verbs(#[from] VerbsError),
    /// A configuration value is out of range; names the field.
    #[error("server config `{field}`: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// Two registered methods share an id.
    #[error("method id {id:#x} of {second} collides with {first}")]
    DuplicateMethod {
        /// The id.
        id: u32,
        /// First method registered with it.
        first: &'static str,
        /// The colliding one.
        second: &'static str,
    },
    /// The transport is not available in this build.
    #[error("{0}")]
    Transport(String),
    /// Starting a thread failed.
    #[error("spawning {what}: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl std::fmt::Debug for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !f.alternate() {
            return crate::report::write_report(self, f);
        }
        match self {
            Self::Listen { addr, source } => {
                f.debug_struct("Listen").field("addr", addr).field("source", source).finish()
            }
            Self::Verbs(e) => f.debug_tuple("Verbs").field(e).finish(),
            Self::Config { field, reason } => {
                f.debug_struct("Config").field("field", field).field("reason", reason).finish()
            }
            Self::DuplicateMethod { id, first, second } => f
                .debug_struct("DuplicateMethod")
                .field("id", id)
                .field("first", first)
                .field("second", second)
                .finish(),
            Self::Transport(e) => f.debug_tuple("Transport").field(e).finish(),
            Self::Thread { what, source } => {
                f.debug_struct("Thread").field("what", what).field("source", source).finish()
            }
        }
    }
}

/// Server configuration. Every field has a documented default ([`ServerConfig::default`]).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// NIC provider. Default [`Transport::Sim`].
    pub transport: Transport,
    /// Cores to pin one worker each to (core ids as `core_affinity` numbers them). Empty = one
    /// unpinned worker. Default empty.
    pub worker_cores: Vec<usize>,
    /// The same-host path of a server on an RDMA NIC: `Some(cores)` also starts workers on the
    /// software NIC (`sim`: shared memory), one pinned to each of `cores` (empty: one unpinned),
    /// and a client on this host that asks for it (`ClientConfig::same_host_shm`,
    /// [`crate::wire::FLAG_SHM`]) gets its session there, so its bodies are copied through
    /// shared memory instead of crossing the NIC's loopback. The handshake still arrives on the
    /// server's address; the listener hands it to the software-NIC workers, whose sessions
    /// are counted apart (`Counters::sessions_shm`) and admitted up to `max_sessions` of
    /// their own, with this configuration's other limits (a peer's sessions on both paths count
    /// against one `max_sessions_per_peer`). Give them cores of their own when the
    /// workers busy-poll ([`PollingPolicy::Busy`]): two busy-polling threads on one core halve
    /// each other. A same-host hello from an address that is not this host's is refused
    /// FAILED_PRECONDITION naming the address (a software-NIC session is reachable only from
    /// here). Default `None` (a same-host hello is refused FAILED_PRECONDITION naming this
    /// field, and the client connects again on the NIC). Ignored on `sim` (already shared
    /// memory).
    pub same_host_shm: Option<Vec<usize>>,
    /// Largest request or response body in bytes. Default 64 MiB; 1 ..= 4 GiB − 1. A body larger
    /// than the ring (or than what it has free) travels through it in pieces; one over this
    /// limit is refused before anything is sent (RESOURCE_EXHAUSTED naming the limit). A client
    /// that asks for more is granted this value (the handshake reply says so), never more.
    pub max_message_size: u32,
    /// Bytes of each session's receive ring (bulk bodies). Default 1 MiB; 64 KiB ..= 1 GiB
    /// ([`crate::wire::MIN_RING_LEN`] ..= [`crate::wire::MAX_RING_LEN`]). The ring is granted
    /// on demand (protocol 12): a session registers none at connect; its client asks for it
    /// before its first body above the eager threshold, and the server registers it then (behind
    /// a type-2 memory window bound to the session's QP where the device has them, else the
    /// MR's own rkey), whatever length the client asked for; it is taken back after
    /// [`ServerConfig::ring_idle`] without a body (`Counters::ring_bytes`, `rings_granted`,
    /// `rings_reclaimed`, `rings_refused`).
    pub ring_bytes: u32,
    /// How long a session's granted receive ring may go without a body before the server takes
    /// it back: the worker's sweep (every quarter of it, at least 2 ms, at most 1 s) sends a
    /// RingReclaim, the client answers once none of its WRITEs into the ring is in flight, and
    /// the ring is deregistered (`Counters::rings_reclaimed`); a client that does not answer
    /// within this time again loses the ring anyway (its window is deallocated: a later WRITE of
    /// its fails with a remote access error and breaks its own session;
    /// `Counters::rings_revoked`). The client's next body asks again. Default 5 s; `None` keeps
    /// a granted ring until the session closes; not zero.
    pub ring_idle: Option<Duration>,
    /// Most bytes of receive rings granted at once over all sessions and workers
    /// (`Counters::ring_bytes`). A grant that would exceed it is refused: the client's call or
    /// stream message that needed the ring fails RESOURCE_EXHAUSTED naming this cap
    /// (`Counters::rings_refused`), its session and its eager calls go on, and a later body asks
    /// again. Default `u64::MAX`: no cap of its own (the bound is then `max_sessions` ×
    /// `ring_bytes`). At least `ring_bytes`.
    pub max_ring_pool_bytes: u64,
    /// Largest client ring this server mirrors, in bytes. The server registers, per session that
    /// sends bodies above the eager threshold ([`ServerConfig::send_area_idle`]), a send mirror
    /// of the client's ring and a staging area of twice it (at most 64 MiB more), sized from the
    /// ring length the client's handshake announces: a handshake that announces
    /// more is refused with RESOURCE_EXHAUSTED naming this field, its value and the length
    /// asked, before anything is registered for it. One below 64 KiB
    /// ([`crate::wire::MIN_RING_LEN`]) is refused INVALID_ARGUMENT naming `ring_len`.
    /// Default 4 MiB; 64 KiB ..= 1 GiB.
    pub max_peer_ring_bytes: u32,
    /// Most bytes all sessions together may hold in bodies that arrive in pieces (a request or
    /// stream message larger than the ring, or than what it has free), each charged its whole
    /// length from its first piece to its last. A body that would go over it is refused alone:
    /// its call is answered RESOURCE_EXHAUSTED naming this field and its value, its pieces are
    /// dropped as they arrive, and its session stays open (a session is closed only over its
    /// own share, `max_reassembly_bytes_per_session`). Default 256 MiB; at least
    /// `max_message_size`.
    pub max_reassembly_bytes: u64,
    /// Most bytes one session alone may hold in bodies that arrive in pieces (its share of
    /// `max_reassembly_bytes`): a body that would take its session over it closes the session
    /// with a Close of RESOURCE_EXHAUSTED naming this field. Default 0: derived, a quarter of
    /// `max_reassembly_bytes` but at least `max_message_size` (64 MiB at the defaults); else
    /// `max_message_size ..= max_reassembly_bytes` bytes (checked at spawn).
    pub max_reassembly_bytes_per_session: u64,
    /// Most bytes all sessions together may hold in answers and stream messages waiting on the
    /// heap for room in their client's ring (a client that does not read its answers), each
    /// charged its length while it waits (bodies waiting in a session's registered staging area
    /// are not charged: that memory is sized at the handshake). One that would go over it closes
    /// its session with a status naming this field. Default 256 MiB; at least
    /// `max_message_size`.
    pub max_backlog_bytes: u64,
    /// Most bytes each worker registers for the buffers handlers allocate to answer with no
    /// copy ([`crate::codegen::RequestContext::alloc_registered`], [`crate::buffers::RegisteredPool`]),
    /// in slabs registered on first use. Default 256 MiB; over it an allocation fails
    /// RESOURCE_EXHAUSTED naming the bound.
    pub registered_buffer_bytes: usize,
    /// How long a body that arrives in pieces may take from its first piece to its last; after
    /// it, the session closes with a status naming this field (its memory is freed). Checked on
    /// the worker's timer tick (2 ms). Default 10 s; above 0.
    pub reassembly_timeout: Duration,
    /// Receive buffers (WQEs) of each worker's SRQ. Default 0 = sized for `max_sessions` at full
    /// credits: sessions per worker × [`ServerConfig::srq_per_session`]`(credits_per_session)`
    /// (`2 × credits_per_session + max(credits_per_session, 16) + 32`; 16 384 WQEs at the
    /// defaults), cut to the device's `max_srq_wr` when that still holds every session idle
    /// (at [`ServerConfig::initial_credits`], no ring: 37 WQEs each at 2 credits, shared beyond
    /// [`ServerConfig::srq_idle_wqes`]; checked at spawn, naming these fields). An explicit depth must hold one session at
    /// `initial_credits` with a ring; sessions are then admitted while what they reserve
    /// (`srq_per_session` of the credits they were granted, less the 15 WQEs of a ring's pieces
    /// until a ring is granted) fits, and raised while the WQEs posted beyond the reservations
    /// allow. Every buffer is
    /// `eager_threshold` + 40 bytes and the SRQ cycles through all of its posted buffers, so a
    /// smaller SRQ stays in cache (measurably lower latency).
    ///
    /// The SRQ is created this deep, but its buffers are registered and posted only as they are
    /// needed, in chunks of 64 (the last one cut at this depth): as a session is admitted, the
    /// listener registers what the worker's sessions reserve and room for the new one to reach
    /// its most credits with a ring, and the worker posts them before the session's handshake is
    /// answered; a raise or a ring grant that later finds no room has the worker register and
    /// post what it lacks, then grant it. They stay until the server stops and serve later
    /// sessions: a worker holds about the most its sessions reserved at once, never more than
    /// this depth (`Counters::recv_buffers`, `Counters::recv_buffer_bytes`). An idle server
    /// registers none.
    pub srq_depth: u32,
    /// Receive WQEs of each worker's SRQ that its idle sessions reserve one by one; beyond it
    /// they share them. Default 4,096 (16.5 MiB of receive buffers at the default
    /// `eager_threshold`); at least what one idle session reserves; `u32::MAX`: no sharing.
    ///
    /// What a session reserves of its worker's SRQ ([`ServerConfig::srq_per_session`]) has a
    /// base, what it may send while idle at its [`ServerConfig::initial_credits`] with no ring
    /// (37 WQEs at 2 credits, 113 at 32: its first requests, a RingAsk, the probe's Pings and
    /// Pongs, a Close), and an extra while it is raised above them or holds a ring. The
    /// extras are reserved one by one, always; the bases of a worker's sessions count as at
    /// most this many WQEs together. So a worker admits sessions up to `max_sessions`, not up
    /// to what their bases sum to, and its SRQ stays at most `srq_depth` WQEs however many
    /// sessions idle on it: 20,000 idle sessions on 2 workers hold 2 × 16,384 receive buffers
    /// on sim, 6.6 KiB each (`Counters::srq_bases` shows what the bases sum to).
    ///
    /// What sharing gives up, as every RPC system with one receive queue per thread does
    /// (eRPC's thousands of sessions share a receive queue of a few thousand entries): when
    /// more of a worker's idle sessions send at once than its SRQ holds beyond the extras
    /// (more than about this many messages between two polls of the worker, or while it is
    /// held in a synchronous handler), some SENDs find no receive WQE and the sender's NIC
    /// retries them after the RNR timer (every QP retries without limit, `rnr_retry` 7):
    /// a delay of those messages, and of any other session's that arrive before the worker
    /// reposts, never a loss. With `u32::MAX` every session reserves its whole base, and no
    /// SEND of a session that keeps the protocol ever waits for another's (the worker then
    /// admits at most `srq_depth` / base sessions: 442 at 2 credits on sim).
    pub srq_idle_wqes: u32,
    /// Most requests in flight granted per session (a client asks for its window). Default 32;
    /// 1 ..= 4096. Credits are granted on demand (protocol 12): a session starts at
    /// [`ServerConfig::initial_credits`] and is raised, doubling, up to the smaller of its
    /// client's window and this while it uses all it has and its worker's SRQ has room; a
    /// client's other calls wait locally.
    pub credits_per_session: u16,
    /// Request credits a session is granted at the handshake, and lowered back to after
    /// [`ServerConfig::credit_idle`] without a call. Default 32, the default
    /// `credits_per_session`: a session starts at full credits, as before protocol 12. For many
    /// idle sessions set it low (2: 37 receive WQEs reserved per idle session without a ring
    /// instead of 113 at 32; the `sessions` benchmark does). Known at 2: one breaker test of
    /// stream readers racing their cancels (`breaker_today`) stalled 16 of 220 readers, so it
    /// runs at 32; not yet explained. 1 ..= 4096, taken as `credits_per_session` when above it
    /// (and as the client's window when above that). What an idle session reserves of its
    /// worker's SRQ: [`ServerConfig::srq_per_session`] of it (52 receive WQEs at 2, 37 of them
    /// until a ring is granted). A session raised above it reserves `srq_per_session` of its
    /// credits, from the WQEs its worker has posted beyond the sessions' reservations; a raise
    /// that finds no room has the worker post what it lacked and try again, and one that still
    /// finds none (the SRQ at `srq_depth`, or the registration failed) leaves the session at its
    /// credits (`Counters::credit_raises_refused` counts each refusal).
    pub initial_credits: u16,
    /// How long a session raised above [`ServerConfig::initial_credits`] may go without a call
    /// before it is lowered back to them (the worker's sweep, every quarter of it, at least
    /// 2 ms, at most 1 s; its reservation is given back when the client acknowledges). Default
    /// 5 s; `None` keeps raised credits until the session closes; not zero.
    pub credit_idle: Option<Duration>,
    /// Sessions over all workers. Default 128. Each registers nothing at connect (its send
    /// buffers are its worker's pool's, [`ServerConfig::max_send_pool_bytes`]); while its
    /// client sends bodies above the eager threshold (see [`ServerConfig::ring_idle`]) also a
    /// receive ring (`ring_bytes`, capped over all sessions by `max_ring_pool_bytes`); while it sends bodies above the eager threshold (see
    /// [`ServerConfig::send_area_idle`]) also a send mirror of the client's ring and a send
    /// staging area of twice it (at most 64 MiB more; the client's ring is at most
    /// `max_peer_ring_bytes`): at most 3 × `max_peer_ring_bytes` more, 12 MiB at the defaults
    /// (3 MiB for a client of the default 1 MiB ring); plus
    /// spare buffers of received bodies once bodies above the eager threshold arrived, at most
    /// `ring_bytes` plus twice the largest of them; and reserves
    /// [`ServerConfig::srq_per_session`] SRQ WQEs, whose receive buffers
    /// (`eager_threshold` + 40 bytes each, 525 KB at the defaults) are registered when the
    /// session is admitted unless its worker already has them (see
    /// [`ServerConfig::srq_depth`]); idle sessions share theirs beyond
    /// [`ServerConfig::srq_idle_wqes`] (20,000 idle sessions on 2 workers on sim: 6.6 KiB each). An idle server registers nothing for sessions. Memory held across sessions for bodies in
    /// pieces and answers waiting is capped by `max_reassembly_bytes` and `max_backlog_bytes`.
    ///
    /// An idle session with the defaults (32 credits, `initial_credits` 32) costs, measured on
    /// sim with one worker (the `sessions` benchmark, `--credits 32 --initial 32`), 28.9 KiB of
    /// the server's own resident memory and 3.4 KiB pinned with 5,000 sessions, 26.5 KiB and
    /// 1.7 KiB with 10,000 ([`crate::Counters::pinned_per_session`]; the sim's send queues
    /// store only WQEs that wait, `SimStats::sq_storage_bytes`); at `initial_credits` 2,
    /// 9.4 KiB and 0.9 KiB with 20,000 (and a client window of 2).
    /// Valid range:
    /// 1 ..= 32767 per worker.
    ///
    /// A session also holds its TCP control connection, a file descriptor: a server raises
    /// its process's open-file soft limit (`RLIMIT_NOFILE`, `ulimit -n`, 1,024 by default on
    /// Linux) to the hard limit when it spawns, as Go's runtime does at start, and logs it at
    /// info; sessions beyond what that limit leaves hold no control connection
    /// ([`ServerConfig::max_control_connections`]), so the limit does not bound the sessions.
    pub max_sessions: usize,
    /// Most sessions one peer IP address may hold at once (all its ports together): a handshake
    /// beyond it is refused RESOURCE_EXHAUSTED naming this field, the address and its count,
    /// before anything is registered for it, and the peer's other sessions serve on. Default 0:
    /// no cap of its own (`max_sessions` alone applies, as clients behind one NAT share an
    /// address); else 1 ..= `max_sessions`. A session counts from its handshake until the server
    /// dropped its control connection (closed by either end).
    pub max_sessions_per_peer: usize,
    /// Most sessions that hold a TCP control connection (a file descriptor each). A session
    /// admitted beyond it holds none: the server's handshake reply says so
    /// ([`crate::wire::FLAG_DETACHED`]), both ends close the connection, and the session lives
    /// on the RDMA path alone: its teardown is the Close message; a dead or hung client is
    /// found by the idle probe ([`ServerConfig::peer_timeout`], for a client that answers it
    /// while idle: a `Channel` or a blocking `Client`) and by [`ServerConfig::idle_timeout`]
    /// (any other client), a dead
    /// server by the client's probe while it has calls in flight. What is lost: a client
    /// process that exits is seen at once through its closed connection, a detached one only by
    /// those timers. Only when neither `peer_timeout` nor `idle_timeout` is set does every
    /// session keep its connection (else a dead client's session would never be reclaimed).
    ///
    /// Default 0: the process's open-file soft limit after the raise at spawn (see
    /// [`ServerConfig::max_sessions`]) less 128 descriptors for everything else, so a server
    /// takes `max_sessions` sessions whatever `ulimit -n` says. `usize::MAX`: every session
    /// keeps its connection (the behaviour before protocol 12). Shown by
    /// `Counters::control_connections` and `Counters::sessions_detached`.
    pub max_control_connections: usize,
    /// Bodies up to this many bytes travel in the SEND; larger ones by RDMA WRITE into the ring.
    /// Default 4096 bytes. The agreed value is the smaller of server's and client's.
    pub eager_threshold: u32,
    /// How workers wait for completions. Default [`PollingPolicy::Busy`].
    pub polling: PollingPolicy,
    /// When set, clients must present this token in the handshake (compared in constant time:
    /// the comparison's duration tells nothing of the token's bytes or length). Default `None`;
    /// at most 256 bytes.
    pub auth_token: Option<Vec<u8>>,
    /// TLS on the TCP control channel (the handshake, which carries the auth token, QPNs, GIDs
    /// and rkeys): this server's certificate chain and key, optionally the roots client
    /// certificates must chain to ([`crate::ServerTls`]). Default `None`: plaintext. With it,
    /// every client must have `ClientConfig::tls`: a plaintext handshake is refused UNAVAILABLE
    /// naming this field, a client whose TLS handshake fails (it distrusts the certificate, or
    /// presents none where one is required) is dropped; either within `handshake_timeout`,
    /// without disturbing other connections. The data path (RDMA) is not encrypted.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::tls::ServerTls>,
    /// How long `shutdown` waits for in-flight RPCs. Default 5 s. A worker still inside an inline
    /// handler 5 s after it is left running (see [`ServerHandle::shutdown`]).
    pub drain_timeout: Duration,
    /// How long `shutdown` keeps serving after it reported NOT_SERVING on the health service
    /// ([`crate::health`]), before the drain proper (new calls UNAVAILABLE): the time balancers
    /// get to see the status and move their traffic away, during which calls are answered as
    /// before. Set it to at least the interval at which the clients' balancers `Check` (a
    /// `Watch` stream sees the change within a round trip); `shutdown` blocks this much longer.
    /// Default 0: the drain starts at once (`Watch` streams still get NOT_SERVING before they
    /// end, but calls that arrive meanwhile are answered UNAVAILABLE). Any duration.
    pub drain_grace: Duration,
    /// How long a client may take to send its handshake. Default 5 s.
    pub handshake_timeout: Duration,
    /// How long a client may stay silent on the RDMA path while its calls are unanswered (a
    /// deferred handler runs): after a third of it the worker sends a Ping (again after each
    /// further third; a client that polls for its calls answers with a Pong), after all of it the
    /// session closes (counted in `Counters::peers_lost`) and its memory is freed. Catches a
    /// stopped or hung client process, which its NIC still acknowledges. A session without
    /// unanswered calls is probed only when its client answers Pings while idle, as its
    /// handshake says ([`crate::wire::FLAG_IDLE_PONGS`]): a `Channel` (its dispatcher thread
    /// answers) and a blocking `Client` (its endpoint's progress thread answers, within 50 to
    /// 400 ms, while no call of its own thread holds it); such a session is not closed by
    /// [`ServerConfig::idle_timeout`] while the probe is on, and a client process that stopped
    /// or died while idle is found within this time. A session whose client does not answer
    /// while idle is reclaimed by `idle_timeout` instead. Default 6 s; `None` disables the
    /// probe.
    ///
    /// It also bounds a worker held in an inline handler: the listener gives new sessions to
    /// the other workers as soon as one's loop stands still for 100 ms, and when it stands still
    /// for `peer_timeout` (10 s with `None`), closes the control connections of its sessions,
    /// whose clients then reconnect (to a worker that runs) instead of waiting on one that does
    /// not answer their probes (`Counters::sessions_closed` counts them when the worker is back).
    ///
    /// The same time bounds the TCP control connection, idle or not: TCP keepalive (probes from
    /// half of it on) and `TCP_USER_TIMEOUT` make the connection of a client host that vanished
    /// (power, cable, partition: nothing answers, not even its kernel) fail within it, and the
    /// listener, which waits on the connections' readiness, closes the session and frees its
    /// memory. Below 2 s the TCP bound is 2 s (keepalive counts seconds); with `None` it is 10 s
    /// (a stopped process's kernel still answers keepalive, so it never trips on one).
    pub peer_timeout: Option<Duration>,
    /// How long a session may go without a call before the server closes it, as gRPC's
    /// `max_connection_idle`: a session with no call in flight (no unanswered request, open
    /// stream or message arriving in pieces; Pings and ring returns are not calls) for this
    /// long gets a Close and is freed (counted in `Counters::idle_closed`), so idle sessions
    /// cannot hold `max_sessions` for good. A clean close: a `Client` reconnects at its next
    /// call, which does not fail for it (it looks for a Close before a call when none is in
    /// flight). A session whose client answers probes while idle (a `Channel` or a `Client`,
    /// through their progress threads) is probed instead, while [`ServerConfig::peer_timeout`]
    /// is set, and closed when it stops answering within it (a live client that answers keeps
    /// its session, idle or not): every idle session of a dead or stopped client is reclaimed
    /// one way or the other, whatever its handshake asked. Checked every quarter of it (at most every second): a
    /// session closes between this and 1.25 × this after its last call.
    /// Default 60 s; `None` never closes idle sessions; not zero.
    pub idle_timeout: Option<Duration>,
    /// How long a session's send mirror and staging area may sit unused before they are given
    /// back (deregistered). A session registers them at its first answer or stream message
    /// above the eager threshold (a mirror of the client's ring and a staging area of twice it,
    /// at most 64 MiB more: 3 MiB for a client of the default 1 MiB ring), not at connect, so an
    /// idle session or one that makes only small calls holds neither; once it sent no body
    /// above the threshold for this long, no WRITE from them is in flight and no answer waits,
    /// the worker's sweep (every quarter of it, at least 2 ms, at most 1 s) gives them back,
    /// and the next such body registers them again (`Counters::send_area_bytes`,
    /// `send_areas_created`, `send_areas_released`). A registration that fails (`ulimit -l`,
    /// the device's MR limits) answers the call that needed it RESOURCE_EXHAUSTED naming what
    /// failed; the session and the others go on. Default 5 s; `None` keeps them until the
    /// session closes once registered; not zero.
    pub send_area_idle: Option<Duration>,
    /// Most bytes of send mirrors and staging areas the server's sessions may have registered
    /// at once, across every worker (`Counters::send_area_bytes`). A session's areas take its
    /// client's ring length three times over (a mirror and a staging area of twice it, at most
    /// 64 MiB more than the ring: 3 MiB for the default 1 MiB ring), charged when they are
    /// registered (at its first body above the eager threshold) and given back with them
    /// ([`ServerConfig::send_area_idle`]). A registration that would exceed it answers the call
    /// that needed it RESOURCE_EXHAUSTED naming this cap (counted in
    /// `Counters::send_area_failures`); the session and the others go on, and a later body
    /// tries again. Default `u64::MAX`: no cap of its own (the bound is then `max_sessions` ×
    /// the areas of a `max_peer_ring_bytes` ring). When set, at least the areas of one client
    /// of the largest ring allowed ([`ServerConfig::max_peer_ring_bytes`]): 3 × it, or it +
    /// 64 MiB + it when larger.
    pub max_send_area_bytes: u64,
    /// Most bytes of send buffers each worker registers. A worker's sessions share one pool of
    /// send buffers (`eager_threshold` + 40 bytes each, 4136 B by default) instead of each
    /// registering its own at connect: a session takes a buffer when it queues a message and
    /// it is free again once the message is posted (an inline SEND, up to the QP's
    /// `max_inline_data`, 256 B at most) or once the polled completion of its SEND retires it.
    /// So an idle session holds none, and the pool holds what the sends in flight use. It is
    /// registered a chunk of 64 buffers (258 KiB by default) at a time as sends need them, up
    /// to this cap, and kept (`Counters::send_pool_bytes`, `Counters::send_bufs_in_use`). A
    /// session that finds no buffer while the pool is at its cap waits: its answer stays in its
    /// outbox (charged to [`ServerConfig::max_backlog_bytes`] like an answer waiting for ring
    /// space) and goes as soon as a completion frees a buffer; no session fails for it.
    /// Default 64 MiB (16 230 buffers of 4136 B: 225 sessions at 72 messages in flight each);
    /// at least one chunk (64 × (`eager_threshold` + 40) bytes).
    pub max_send_pool_bytes: usize,
    /// The longest a call may wait for its answer, whatever deadline its client gave (or none):
    /// past it the call is answered DEADLINE_EXCEEDED naming this setting, its deferred
    /// `Responder`, `StreamSink` and `RequestStream` see `is_cancelled()` (an async handler's
    /// future is dropped), and a later answer is dropped. It bounds what a handler that never
    /// answers holds (the call's slot and the client's credit), as gRPC servers bound a
    /// connection's life with `max_connection_age`. Streams count as one call. Measured from
    /// the worker's first timer check that sees the call (one timer tick, 2 ms, after it
    /// arrived at most while the worker runs). An inline handler's
    /// [`RequestContext::is_cancelled`](crate::dispatch::reply::RequestContext::is_cancelled)
    /// turns true this long after its first look. Default 300 s (5 minutes); `None` disables
    /// the bound; `Some(0)` is refused.
    pub max_call_duration: Option<Duration>,
    /// Most bytes of a request's metadata block ([`crate::metadata`]); a request with more is
    /// answered RESOURCE_EXHAUSTED naming this field, its handler not run. Default 8192 (gRPC's
    /// default limit on a request's headers); 6 ..= `max_message_size`.
    pub max_metadata_bytes: u32,
    /// Runs on the worker before every handler, with the call's [`CallInfo`] (method, peer,
    /// deadline, request metadata): an error answers the call with that status and its handler
    /// is not run (e.g. UNAUTHENTICATED for a missing token). Default none.
    pub interceptor: Option<ServerInterceptor>,
    /// Tracing spans (continuing a client's `traceparent`) and metrics of the unary calls this
    /// server answers ([`crate::observe`]). Default [`crate::Observe::OFF`] (a call pays one
    /// branch).
    pub observe: crate::Observe,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            transport: Transport::Sim,
            worker_cores: Vec::new(),
            same_host_shm: None,
            max_message_size: 64 << 20,
            ring_bytes: 1 << 20,
            max_peer_ring_bytes: 4 << 20,
            max_reassembly_bytes: 256 << 20,
            max_reassembly_bytes_per_session: 0,
            max_backlog_bytes: 256 << 20,
            registered_buffer_bytes: crate::buffers::registered::DEFAULT_POOL_BYTES,
            reassembly_timeout: Duration::from_secs(10),
            srq_depth: 0,
            srq_idle_wqes: 4096,
            credits_per_session: 32,
            initial_credits: 32,
            credit_idle: Some(Duration::from_secs(5)),
            max_sessions: 128,
            max_sessions_per_peer: 0,
            max_control_connections: 0,
            eager_threshold: 4096,
            polling: PollingPolicy::Busy,
            auth_token: None,
            #[cfg(feature = "tls")]
            tls: None,
            drain_timeout: Duration::from_secs(5),
            drain_grace: Duration::ZERO,
            handshake_timeout: Duration::from_secs(5),
            peer_timeout: Some(Duration::from_secs(6)),
            idle_timeout: Some(Duration::from_secs(60)),
            send_area_idle: Some(Duration::from_secs(5)),
            max_send_area_bytes: u64::MAX,
            max_send_pool_bytes: 64 << 20,
            ring_idle: Some(Duration::from_secs(5)),
            max_ring_pool_bytes: u64::MAX,
            max_call_duration: Some(Duration::from_secs(300)),
            max_metadata_bytes: 8192,
            interceptor: None,
            observe: crate::Observe::OFF,
        }
    }
}

impl ServerConfig {
    /// The bytes one session alone may hold for reassembly:
    /// [`ServerConfig::max_reassembly_bytes_per_session`], or when 0 a quarter of
    /// `max_reassembly_bytes` but at least `max_message_size` (never above
    /// `max_reassembly_bytes`).
    pub fn reassembly_share(&self) -> u64 {
        match self.max_reassembly_bytes_per_session {
            0 => (self.max_reassembly_bytes / 4)
                .max(u64::from(self.max_message_size))
                .min(self.max_reassembly_bytes),
            n => n,
        }
    }

    fn validate(&self) -> Result<(), ServerError> {
        let bad = |field, reason: String| Err(ServerError::Config { field, reason });
        if self.peer_timeout.is_some_and(|t| t.is_zero()) {
            return bad("peer_timeout", "0 (use None for no probe)".into());
        }
        if self.max_call_duration.is_some_and(|t| t.is_zero()) {
            return bad("max_call_duration", "0 (use None for no bound)".into());
        }
        if !(6..=self.max_message_size).contains(&self.max_metadata_bytes) {
            return bad(
                "max_metadata_bytes",
                format!(
                    "{} is not in 6 ..= max_message_size {}",
                    self.max_metadata_bytes, self.max_message_size
                ),
            );
        }
        if self.idle_timeout.is_some_and(|t| t.is_zero()) {
            return bad("idle_timeout", "0 (use None to keep idle sessions)".into());
        }
        if self.send_area_idle.is_some_and(|t| t.is_zero()) {
            return bad("send_area_idle", "0 (use None to keep send mirrors and staging areas)".into());
        }
        if self.credit_idle.is_some_and(|t| t.is_zero()) {
            return bad("credit_idle", "0 (use None to keep raised credits)".into());
        }
        if self.ring_idle.is_some_and(|t| t.is_zero()) {
            return bad("ring_idle", "0 (use None to keep granted rings)".into());
        }
        if self.max_ring_pool_bytes < u64::from(self.ring_bytes) {
            return bad(
                "max_ring_pool_bytes",
                format!(
                    "{} is below one session's ring (ring_bytes {})",
                    self.max_ring_pool_bytes, self.ring_bytes
                ),
            );
        }
        let one_session = u64::from(self.max_peer_ring_bytes)
            + u64::from(crate::endpoint::conn::staging_len(self.max_peer_ring_bytes));
        if self.max_send_area_bytes < one_session {
            return bad(
                "max_send_area_bytes",
                format!(
                    "{} is below the send mirror and staging area of one client of the largest ring allowed \
                     (max_peer_ring_bytes {}: {one_session} bytes)",
                    self.max_send_area_bytes, self.max_peer_ring_bytes
                ),
            );
        }
        let chunk = crate::worker::SEND_CHUNK
            * (crate::wire::HEADER_LEN + crate::endpoint::conn::body_area(self.eager_threshold));
        if self.max_send_pool_bytes < chunk {
            return bad(
                "max_send_pool_bytes",
                format!(
                    "{} is below one chunk of send buffers ({} × (eager_threshold {} + {} bytes): {chunk} bytes)",
                    self.max_send_pool_bytes,
                    crate::worker::SEND_CHUNK,
                    self.eager_threshold,
                    crate::wire::HEADER_LEN
                ),
            );
        }
        let rings = crate::wire::MIN_RING_LEN..=crate::wire::MAX_RING_LEN;
        if !rings.contains(&self.ring_bytes) {
            return bad("ring_bytes", format!("{} is not in {rings:?} (64 KiB ..= 1 GiB)", self.ring_bytes));
        }
        if !rings.contains(&self.max_peer_ring_bytes) {
            return bad(
                "max_peer_ring_bytes",
                format!("{} is not in {rings:?} (64 KiB ..= 1 GiB)", self.max_peer_ring_bytes),
            );
        }
        if self.max_reassembly_bytes < u64::from(self.max_message_size) {
            return bad(
                "max_reassembly_bytes",
                format!(
                    "{} is below max_message_size {}: such a body could never arrive in pieces",
                    self.max_reassembly_bytes, self.max_message_size
                ),
            );
        }
        let share = self.max_reassembly_bytes_per_session;
        if share != 0 && (share < u64::from(self.max_message_size) || share > self.max_reassembly_bytes) {
            return bad(
                "max_reassembly_bytes_per_session",
                format!(
                    "{share} is not in max_message_size {} ..= max_reassembly_bytes {} (0: derived)",
                    self.max_message_size, self.max_reassembly_bytes
                ),
            );
        }
        if self.max_backlog_bytes < u64::from(self.max_message_size) {
            return bad(
                "max_backlog_bytes",
                format!(
                    "{} is below max_message_size {}: such an answer could never wait for a slow reader",
                    self.max_backlog_bytes, self.max_message_size
                ),
            );
        }
        if self.reassembly_timeout.is_zero() {
            return bad("reassembly_timeout", "0".into());
        }
        if self.credits_per_session == 0 || self.credits_per_session > crate::wire::MAX_CREDITS {
            return bad("credits_per_session", format!("{} is not in 1..=4096", self.credits_per_session));
        }
        if self.initial_credits == 0 || self.initial_credits > crate::wire::MAX_CREDITS {
            return bad("initial_credits", format!("{} is not in 1..=4096", self.initial_credits));
        }
        let per_session = crate::endpoint::conn::srq_need(self.first_credits());
        if self.srq_depth != 0 && self.srq_depth < per_session {
            return bad(
                "srq_depth",
                format!(
                    "{} is below one idle session's 2 × initial_credits + max(initial_credits, 16) + 32 = {per_session} \
                     (ServerConfig::srq_per_session)",
                    self.srq_depth
                ),
            );
        }
        let idle = crate::session::srq_need_ringless(self.first_credits());
        if self.srq_idle_wqes < idle {
            return bad(
                "srq_idle_wqes",
                format!(
                    "{} is below what one idle session reserves at initial_credits {}: {idle} WQEs",
                    self.srq_idle_wqes,
                    self.first_credits()
                ),
            );
        }
        if self.max_message_size == 0 {
            return bad("max_message_size", "0 bytes".into());
        }
        if self.eager_threshold > 1 << 20 {
            return bad("eager_threshold", format!("{} bytes is above 1 MiB", self.eager_threshold));
        }
        if self.max_sessions == 0 {
            return bad("max_sessions", "0".into());
        }
        if self.max_sessions_per_peer > self.max_sessions {
            return bad(
                "max_sessions_per_peer",
                format!("{} is above max_sessions {}", self.max_sessions_per_peer, self.max_sessions),
            );
        }
        if let Some(t) = self.auth_token.as_ref().filter(|t| t.len() > crate::wire::MAX_AUTH_TOKEN) {
            // No client could present it: every handshake would be refused.
            return bad("auth_token", format!("{} bytes, at most {}", t.len(), crate::wire::MAX_AUTH_TOKEN));
        }
        // A worker numbers its sessions in 15 bits (the connection tag in a send `wr_id`).
        let per_worker = self.max_sessions.div_ceil(self.worker_cores.len().max(1));
        if per_worker > MAX_SESSIONS_PER_WORKER {
            return bad(
                "max_sessions",
                format!(
                    "{} over {} worker(s) is {per_worker} per worker, above {MAX_SESSIONS_PER_WORKER}",
                    self.max_sessions,
                    self.worker_cores.len().max(1)
                ),
            );
        }
        Ok(())
    }

    /// Receive WQEs of a worker's SRQ that a session of `credits` reserves:
    /// `2 × credits + max(credits, 16) + 32` (128 at 32 credits). The most a client that keeps
    /// the protocol can have sent before the worker takes any of it, every message kind counted:
    /// its requests and stream SENDs (stream messages, stream grants, stream ends: each holds a
    /// request credit until the server reports it taken) within credits plus the 8 only stream
    /// SENDs use ([`crate::session::STREAM_RESERVED_CREDITS`]), the other pieces of ring bodies
    /// (16), a Cancel per credit (a Cancel holds its call's credit until the server's CancelAck
    /// arrives, so a Cancel that crossed its call's answer is counted too), a RingReturn per
    /// ring body or piece of ours unfreed in its ring (at most `max(credits, 16)`:
    /// [`crate::session::ring_units`]), 4 Pings and 2 Pongs of the probe, a Close and a CreditAck
    /// (the table is on [`crate::session::srq_need`], the one place of this arithmetic). The sessions of a worker
    /// reserve at most its SRQ depth together, so no such session makes another's messages wait
    /// for a receive buffer (RNR), however many of them stream; a client that sends more is
    /// closed as malformed.
    pub fn srq_per_session(credits: u16) -> u32 {
        crate::endpoint::conn::srq_need(credits)
    }

    /// The credits a session starts at: `initial_credits`, at most `credits_per_session`.
    pub fn first_credits(&self) -> u16 {
        self.initial_credits.min(self.credits_per_session)
    }

    /// The SRQ depth each worker gets: `srq_depth`, or when 0 what `max_sessions` (spread over
    /// the workers) need at full credits (at spawn, cut to the device's `max_srq_wr` when
    /// that still holds them all idle, at `initial_credits`).
    pub fn effective_srq_depth(&self) -> u64 {
        if self.srq_depth != 0 {
            return u64::from(self.srq_depth);
        }
        let per_worker = self.max_sessions.div_ceil(self.worker_cores.len().max(1)) as u64;
        per_worker * u64::from(crate::endpoint::conn::srq_need(self.credits_per_session))
    }
}

/// Most sessions one worker serves (its session index and generation share a 31-bit tag).
const MAX_SESSIONS_PER_WORKER: usize = 0x7fff;

/// Entry point: `Server::builder()`.
pub struct Server;

impl Server {
    /// A builder with [`ServerConfig::default`] and no services.
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            config: ServerConfig::default(),
            registry: Registry::default(),
            health: HealthReporter::new(),
            health_added: false,
            reflection: false,
            described: Vec::new(),
        }
    }
}

/// Collects configuration and services; `serve` or `spawn` starts the server.
pub struct ServerBuilder {
    config: ServerConfig,
    registry: Registry,
    /// What the health service reports (kept whether it is served or not: `shutdown` drives it).
    health: HealthReporter,
    /// `add_health_service` was called.
    health_added: bool,
    /// `add_reflection` was called: the reflection service is added at `spawn`, over every
    /// service added by then.
    reflection: bool,
    /// Per service added: its name and `Service::FILE_DESCRIPTOR_SET`, for reflection.
    described: Vec<(&'static str, &'static [u8])>,
}

macro_rules! setter {
    ($($(#[$m:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$m])*
            pub fn $name(mut self, v: $ty) -> Self {
                self.config.$name = v;
                self
            }
        )*
    };
}

impl ServerBuilder {
    /// Runs `f` before every handler (see [`ServerConfig::interceptor`]).
    pub fn interceptor(
        mut self,
        f: impl Fn(&CallInfo) -> Result<(), Status> + Send + Sync + 'static,
    ) -> Self {
        self.config.interceptor = Some(ServerInterceptor::new(f));
        self
    }

    setter! {
        /// See [`ServerConfig::observe`].
        observe: crate::Observe;
        /// See [`ServerConfig::max_metadata_bytes`].
        max_metadata_bytes: u32;
        /// See [`ServerConfig::transport`].
        transport: Transport;
        /// See [`ServerConfig::worker_cores`].
        worker_cores: Vec<usize>;
        /// See [`ServerConfig::same_host_shm`].
        same_host_shm: Option<Vec<usize>>;
        /// See [`ServerConfig::max_message_size`].
        max_message_size: u32;
        /// See [`ServerConfig::ring_bytes`].
        ring_bytes: u32;
        /// See [`ServerConfig::max_peer_ring_bytes`].
        max_peer_ring_bytes: u32;
        /// See [`ServerConfig::max_reassembly_bytes`].
        max_reassembly_bytes: u64;
        /// See [`ServerConfig::max_reassembly_bytes_per_session`].
        max_reassembly_bytes_per_session: u64;
        /// See [`ServerConfig::max_backlog_bytes`].
        max_backlog_bytes: u64;
        /// See [`ServerConfig::registered_buffer_bytes`].
        registered_buffer_bytes: usize;
        /// See [`ServerConfig::reassembly_timeout`].
        reassembly_timeout: Duration;
        /// See [`ServerConfig::srq_depth`].
        srq_depth: u32;
        /// See [`ServerConfig::srq_idle_wqes`].
        srq_idle_wqes: u32;
        /// See [`ServerConfig::credits_per_session`].
        credits_per_session: u16;
        /// See [`ServerConfig::initial_credits`].
        initial_credits: u16;
        /// See [`ServerConfig::credit_idle`].
        credit_idle: Option<Duration>;
        /// See [`ServerConfig::max_sessions`].
        max_sessions: usize;
        /// See [`ServerConfig::max_sessions_per_peer`].
        max_sessions_per_peer: usize;
        /// See [`ServerConfig::max_control_connections`].
        max_control_connections: usize;
        /// See [`ServerConfig::eager_threshold`].
        eager_threshold: u32;
        /// See [`ServerConfig::polling`].
        polling: PollingPolicy;
        /// See [`ServerConfig::drain_timeout`].
        drain_timeout: Duration;
        /// See [`ServerConfig::drain_grace`].
        drain_grace: Duration;
        /// See [`ServerConfig::peer_timeout`].
        peer_timeout: Option<Duration>;
        /// See [`ServerConfig::handshake_timeout`].
        handshake_timeout: Duration;
        /// See [`ServerConfig::idle_timeout`].
        idle_timeout: Option<Duration>;
        /// See [`ServerConfig::send_area_idle`].
        send_area_idle: Option<Duration>;
        /// See [`ServerConfig::max_send_area_bytes`].
        max_send_area_bytes: u64;
        /// See [`ServerConfig::max_send_pool_bytes`].
        max_send_pool_bytes: usize;
        /// See [`ServerConfig::ring_idle`].
        ring_idle: Option<Duration>;
        /// See [`ServerConfig::max_ring_pool_bytes`].
        max_ring_pool_bytes: u64;
        /// See [`ServerConfig::max_call_duration`].
        max_call_duration: Option<Duration>;
    }

    /// Requires clients to present `token` (at most 256 bytes).
    pub fn auth_token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.config.auth_token = Some(token.into());
        self
    }

    /// Runs the control channel over TLS (see [`ServerConfig::tls`]).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::ServerTls) -> Self {
        self.config.tls = Some(tls);
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Registers a service (generated `XxxServer::new(impl)`). The health service reports it
    /// SERVING (under `S::NAME`) unless a status was set for that name before.
    pub fn add_service<S: Service>(mut self, svc: S) -> Self {
        self.health.register(S::NAME);
        self.described.push((S::NAME, S::FILE_DESCRIPTOR_SET));
        self.registry.add(svc);
        self
    }

    /// Serves `grpc.health.v1.Health` ([`crate::health`]): Check and Watch of the statuses the
    /// [`ServerBuilder::health_reporter`] sets, every service added reported SERVING, all of them
    /// NOT_SERVING once `shutdown` begins. `Watch` streams run as tasks on
    /// [`AsyncRuntime::current_or_default`](crate::AsyncRuntime::current_or_default) (the
    /// calling thread's tokio runtime, else a shared one the library builds); adding it twice
    /// adds it once.
    pub fn add_health_service(mut self) -> Self {
        if self.health_added {
            return self;
        }
        self.health_added = true;
        let runtime = crate::server::async_service::AsyncRuntime::current_or_default();
        let svc = HealthService::new(self.health.clone(), runtime);
        self.add_service(crate::health::v1::health_server::HealthServer::new(svc))
    }

    /// Serves `grpc.reflection.v1.ServerReflection` ([`crate::reflection`]), which lists every
    /// service added to this builder (before or after this call; reflection itself included) and
    /// describes them from the descriptors their generated code carries
    /// ([`Service::FILE_DESCRIPTOR_SET`]), so grpcurl and `rpc-perf call` work without the
    /// `.proto` files. Its streams are polled on the workers (in-memory lookups, a few hundred
    /// bytes to a few KB per answer). Adding it twice adds it once.
    pub fn add_reflection(mut self) -> Self {
        self.reflection = true;
        self
    }

    /// The handle that sets what the health service reports (the same one
    /// [`ServerHandle::health_reporter`] gives once the server runs).
    pub fn health_reporter(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Starts the workers and the listener and returns at once.
    ///
    /// # Errors
    /// [`ServerError`] for a bad configuration (naming the field), a duplicate method id, a
    /// transport that cannot open, or a listen address that cannot be bound.
    pub fn spawn(mut self, addr: impl ToSocketAddrs) -> Result<ServerHandle, ServerError> {
        if std::mem::take(&mut self.reflection) {
            use crate::reflection::v1::server_reflection_server::{ServerReflectionServer, SERVICE_NAME};
            let names = self.described.iter().map(|(name, _)| *name).chain([SERVICE_NAME]);
            let sets = self
                .described
                .iter()
                .map(|(_, set)| *set)
                .chain([crate::reflection::v1::FILE_DESCRIPTOR_SET]);
            let index = crate::reflection::DescriptorIndex::new(names, sets);
            self = self
                .add_service(ServerReflectionServer::new(crate::reflection::ReflectionService::new(index)));
        }
        let (health, drain_grace) = (self.health.clone(), self.config.drain_grace);
        let mut handle = self.spawn_workers(addr)?;
        handle.health = health;
        handle.drain_grace = drain_grace;
        Ok(handle)
    }

    fn spawn_workers(mut self, addr: impl ToSocketAddrs) -> Result<ServerHandle, ServerError> {
        self.config.validate()?;
        let nofile = nofile::raise_nofile(self.config.max_sessions);
        if self.config.max_control_connections == 0 {
            self.config.max_control_connections = nofile::control_connections(nofile);
        }
        if let Some(&(id, first, second)) = self.registry.duplicates.first() {
            return Err(ServerError::DuplicateMethod { id, first, second });
        }
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ServerError::Listen { addr: "<unresolved>".into(), source: e })?
            .collect();
        let tcp = TcpListener::bind(&addrs[..])
            .map_err(|e| ServerError::Listen { addr: format!("{addrs:?}"), source: e })?;
        match &self.config.transport {
            Transport::Sim => listener::start::<crate::verbs::sim::Sim>(
                self.config,
                Arc::new(self.registry),
                tcp,
                &crate::verbs::DeviceSelector::First,
                1,
                -1,
                listener::ShmRole::None,
            ),
            #[cfg(feature = "ibverbs")]
            Transport::Rdma { device, port, gid_index } => {
                let sel: crate::verbs::DeviceSelector = device.parse().unwrap_or_default();
                let (port, gid) = (*port, *gid_index);
                let registry = Arc::new(self.registry);
                let (shm, role) = match &self.config.same_host_shm {
                    Some(cores) => {
                        let (handle, handoff) = Self::spawn_shm(&self.config, cores, &registry)?;
                        (Some(Box::new(handle)), listener::ShmRole::Forwards(handoff))
                    }
                    None => (None, listener::ShmRole::None),
                };
                let mut handle = listener::start::<crate::verbs::ibverbs::Ibverbs>(
                    self.config,
                    registry,
                    tcp,
                    &sel,
                    port,
                    gid,
                    role,
                )?;
                handle.shm = shm;
                Ok(handle)
            }
            #[cfg(not(feature = "ibverbs"))]
            Transport::Rdma { .. } => {
                Err(ServerError::Transport(Transport::rdma_unavailable().message().to_string()))
            }
        }
    }

    /// The same-host path's workers ([`ServerConfig::same_host_shm`]): a server on the software
    /// NIC with this one's services and limits, pinned to `cores`, whose listener takes the
    /// handshakes the RDMA listener hands it (and those sent to its own loopback port).
    #[cfg(feature = "ibverbs")]
    fn spawn_shm(
        config: &ServerConfig,
        cores: &[usize],
        registry: &Arc<Registry>,
    ) -> Result<(ServerHandle, Arc<listener::ShmHandoff>), ServerError> {
        let config = ServerConfig {
            transport: Transport::Sim,
            worker_cores: cores.to_vec(),
            same_host_shm: None,
            ..config.clone()
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let tcp =
            TcpListener::bind(addr).map_err(|e| ServerError::Listen { addr: addr.to_string(), source: e })?;
        let handoff = Arc::new(listener::ShmHandoff::default());
        let handle = listener::start::<crate::verbs::sim::Sim>(
            config,
            registry.clone(),
            tcp,
            &crate::verbs::DeviceSelector::First,
            1,
            -1,
            listener::ShmRole::Receives(handoff.clone()),
        )?;
        Ok((handle, handoff))
    }

    /// Starts the server and blocks the calling thread while it runs.
    ///
    /// # Errors
    /// As [`ServerBuilder::spawn`].
    pub fn serve(self, addr: impl ToSocketAddrs) -> Result<(), ServerError> {
        let mut handle = self.spawn(addr)?;
        if let Some(l) = handle.listener.take() {
            let _ = l.join();
        }
        handle.shutdown_inner();
        Ok(())
    }
}

/// A running server. Dropping it shuts the server down as [`ServerHandle::shutdown`] does.
pub struct ServerHandle {
    local_addr: SocketAddr,
    draining: Arc<AtomicBool>,
    stop_listener: Arc<listener::ListenerStop>,
    workers: Vec<JoinHandle<()>>,
    /// A worker's index arrives here when its thread is about to end ([`ExitSignal`]).
    exited: std::sync::mpsc::Receiver<usize>,
    listener: Option<JoinHandle<()>>,
    counters: Vec<Arc<SharedCounters>>,
    /// Each worker's pool of registered buffers.
    registered: Vec<Arc<crate::buffers::RegisteredPool>>,
    memory: Arc<ServerMemory>,
    drain_timeout: Duration,
    /// Per worker: the listener saw its loop stand still (held in an inline handler).
    held: Arc<Vec<AtomicBool>>,
    /// What the health service reports; `shutdown` turns it NOT_SERVING first.
    pub(crate) health: HealthReporter,
    /// [`ServerConfig::drain_grace`].
    pub(crate) drain_grace: Duration,
    /// The same-host path's workers ([`ServerConfig::same_host_shm`]).
    pub(crate) shm: Option<Box<ServerHandle>>,
}

/// Sent by a worker thread as its last act (dropped at the end of its closure, or while
/// unwinding): `shutdown` waits on these instead of polling the threads.
pub(crate) struct ExitSignal {
    pub(crate) index: usize,
    pub(crate) tx: std::sync::mpsc::Sender<usize>,
}

impl Drop for ExitSignal {
    fn drop(&mut self) {
        let _ = self.tx.send(self.index);
    }
}

/// How long `shutdown` waits for a worker after `drain_timeout` (closing its sessions: Close
/// messages, QPs destroyed, memory freed) before it leaves the worker running.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

impl ServerHandle {
    /// The TCP address clients connect to (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Counters summed over all workers (published every few thousand loop iterations and when
    /// idle), with the server's memory gauges (registered, reassembly and backlog bytes, now
    /// and at their peak), which are current.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for w in &self.counters {
            c.add(&w.snapshot());
        }
        self.memory.fill(&mut c);
        if let Some(shm) = &self.shm {
            let on_shm = shm.counters();
            c.add(&on_shm);
            c.sessions_shm = on_shm.sessions_opened;
        }
        c
    }

    /// The workers (indices in worker order) whose loop the listener last saw stand still for
    /// 100 ms or more: held in an inline handler. New sessions go to the other workers while
    /// there are some; see [`ServerConfig::peer_timeout`] for what happens to the held ones'
    /// sessions.
    pub fn held_workers(&self) -> Vec<usize> {
        self.held.iter().enumerate().filter(|(_, h)| h.load(Ordering::Acquire)).map(|(i, _)| i).collect()
    }

    /// The workers' pools of registered buffers ([`crate::codegen::RequestContext::alloc_registered`]),
    /// their counts summed: bytes registered, buffers alive, bytes sent from them with no copy.
    pub fn registered_stats(&self) -> crate::buffers::RegisteredStats {
        let mut sum = crate::buffers::RegisteredStats::default();
        for s in self.registered.iter().map(|p| p.stats()) {
            sum.registered_bytes += s.registered_bytes;
            sum.live_buffers += s.live_buffers;
            sum.zero_copy_bytes += s.zero_copy_bytes;
            sum.copied_bytes += s.copied_bytes;
            sum.refused += s.refused;
        }
        sum
    }

    /// Each worker's counters, in worker order (index `i` is the worker pinned to
    /// `worker_cores[i]`); [`ServerHandle::counters`] is their sum.
    pub fn worker_counters(&self) -> Vec<Counters> {
        self.counters.iter().map(|w| w.snapshot()).collect()
    }

    /// What the health service reports ([`crate::health`]): set a service's status while the
    /// server runs.
    pub fn health_reporter(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Stops the server. First the health service reports every status NOT_SERVING (`Watch`
    /// streams get it; later changes are ignored) and calls still run for
    /// [`ServerConfig::drain_grace`] (default 0), so balancers move away; then `Watch` streams
    /// end OK, new requests are answered UNAVAILABLE, in-flight RPCs (deferred ones
    /// included) are finished up to `drain_timeout`, peers get a Close, then QPs are destroyed,
    /// memory freed and TCP connections closed. Blocks until done (each worker thread signals its
    /// end, and the listener is woken: no timer is waited on, and a server without sessions
    /// stops in about the time its threads take to end), at most `drain_grace` +
    /// `drain_timeout` + 5 s:
    /// a worker still inside an inline handler by then (one that never returns) is left running,
    /// with an error logged; it closes its sessions and frees their memory if the handler ever
    /// returns.
    pub fn shutdown(mut self) {
        self.shutdown_inner();
    }

    fn shutdown_inner(&mut self) {
        // Balancers first: NOT_SERVING while calls still run (once: `serve` and a later drop
        // both come here).
        if self.health.begin_drain() && !self.drain_grace.is_zero() {
            std::thread::sleep(self.drain_grace);
        }
        // Watch streams end (after NOT_SERVING); the drain below waits for them as for any call.
        self.health.close();
        self.draining.store(true, Ordering::Release);
        if let Some(shm) = &self.shm {
            // Both sets of workers drain at once (the same-host ones are shut down below).
            shm.draining.store(true, Ordering::Release);
        }
        let until = Instant::now() + self.drain_timeout + SHUTDOWN_GRACE;
        // Woken by each worker's exit signal (a handler that never returns cannot hang the
        // caller past `until`).
        let mut ended = vec![false; self.workers.len()];
        while ended.iter().any(|e| !e) {
            let left = until.saturating_duration_since(Instant::now());
            match self.exited.recv_timeout(left) {
                Ok(i) => {
                    if let Some(e) = ended.get_mut(i) {
                        *e = true;
                    }
                }
                Err(_) => break,
            }
        }
        for (i, w) in self.workers.drain(..).enumerate() {
            if ended[i] || w.is_finished() {
                // Its signal is the last thing the thread does: this join is immediate.
                let _ = w.join();
            } else {
                tracing::error!(
                    worker = i,
                    waited_ms = (self.drain_timeout + SHUTDOWN_GRACE).as_millis() as u64,
                    "shutdown: the worker is still inside a handler after drain_timeout + 5 s; left \
                     running (its sessions and their memory stay until the handler returns)"
                );
            }
        }
        self.stop_listener.stop();
        if let Some(l) = self.listener.take() {
            let _ = l.join();
        }
        if let Some(mut shm) = self.shm.take() {
            shm.shutdown_inner();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown_inner();
    }
}
