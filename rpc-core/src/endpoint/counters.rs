//! Counters of a worker or client: kept in plain integers by the polling thread, published to
//! atomics now and then (no atomic read-modify-write per RPC).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::session::{Charge, HeldBytes};
use crate::status::Code;

/// A snapshot of counters.
///
/// RNR (receiver not ready) has no counter here: QPs retry RNR forever (`rnr_retry = 7`), so it
/// never ends a send, and flow control keeps it from happening. On `sim`,
/// [`crate::verbs::sim::stats`] counts every RNR wait.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// RPCs completed (server: answered; client: calls that got a response).
    pub rpcs: u64,
    /// Body bytes received.
    pub bytes_in: u64,
    /// Body bytes sent.
    pub bytes_out: u64,
    /// Times a call waited because every credit was in use.
    pub credit_stalls: u64,
    /// Bodies that waited because the peer's ring had no room (each counted once, however often
    /// it is tried again before it goes).
    pub ring_full_stalls: u64,
    /// Late responses discarded (their call had been abandoned).
    pub late_replies: u64,
    /// Connections closed because the peer sent a malformed header.
    pub malformed: u64,
    /// Sessions opened.
    pub sessions_opened: u64,
    /// Sessions closed.
    pub sessions_closed: u64,
    /// Sessions whose receive ring is exposed by its MR's rkey (reachable from any QP of the
    /// protection domain) because the device has no type-2 memory windows; 0 on devices with them.
    pub window_fallbacks: u64,
    /// Client: Cancels sent (calls abandoned on the wire). Server: Cancels received for calls
    /// not yet answered (answered CANCELLED, their handler not run if not yet dispatched).
    pub cancels: u64,
    /// Server: answers dropped because their call was answered already (a deferred
    /// `Responder::send` after the server answered CANCELLED or DEADLINE_EXCEEDED, or a second
    /// answer to one call).
    pub late_answers: u64,
    /// Sessions closed because the peer stayed silent for `peer_timeout` while calls waited
    /// for it, or (server) while a client that answers probes while idle was idle: the idle
    /// probe got no Pong.
    pub peers_lost: u64,
    /// Server: sessions closed because a body arriving in pieces would have taken what the
    /// session alone holds for reassembly over `ServerConfig::max_reassembly_bytes_per_session`.
    pub over_reassembly_cap: u64,
    /// Server: calls refused (answered RESOURCE_EXHAUSTED, their sessions kept) because their
    /// body arriving in pieces would have taken the memory held for reassembly over
    /// `ServerConfig::max_reassembly_bytes`.
    pub reassembly_refused: u64,
    /// Server: sessions closed because an answer waiting for the client's ring would have taken
    /// the memory held for such answers over `ServerConfig::max_backlog_bytes`.
    pub over_backlog_cap: u64,
    /// Server: sessions closed because a body arriving in pieces did not finish within
    /// `ServerConfig::reassembly_timeout`.
    pub reassembly_timeouts: u64,
    /// Server: bytes registered for the live sessions (receive rings, send mirrors, staging
    /// areas; their send buffers are the workers' pools', `send_pool_bytes`) now; set by
    /// `ServerHandle::counters` (0 in `worker_counters`).
    pub registered_bytes: u64,
    /// Server: most of `registered_bytes` at once since the server started.
    pub registered_peak: u64,
    /// Server: bytes registered now for the sessions' send mirrors and staging areas (part of
    /// `registered_bytes`); set by `ServerHandle::counters`. A session registers them at its
    /// first body above the eager threshold (a send mirror of the client's ring and a staging
    /// area of twice it, at most 64 MiB more: 3 MiB for a client of the default 1 MiB ring) and
    /// gives them back once it sent none for `ServerConfig::send_area_idle` and no WRITE of
    /// theirs is in flight: 0 while every session is idle or makes small calls only.
    pub send_area_bytes: u64,
    /// Server: send mirror and staging area pairs registered on demand since the server started
    /// (each counted once per registration; see `send_area_bytes`).
    pub send_areas_created: u64,
    /// Server: send mirror and staging area pairs given back because they sat unused for
    /// `ServerConfig::send_area_idle` (pairs that go with their session are not counted).
    pub send_areas_released: u64,
    /// Server: send mirror and staging area registrations that failed or were refused (the
    /// registration limit, `ulimit -l`, the device's MR limits, or
    /// `ServerConfig::max_send_area_bytes`): each failed the answer or stream that needed it
    /// with RESOURCE_EXHAUSTED naming what was being registered or the cap; the session stays
    /// open.
    pub send_area_failures: u64,
    /// Server: bytes of send buffers the workers registered (their shared pools,
    /// `ServerConfig::max_send_pool_bytes`; not part of `registered_bytes`). Grown a chunk at a
    /// time as sends need buffers and kept: 0 until the first message is sent. Client: the live
    /// session's send buffers, registered 16 at a time as its sends need them (up to
    /// `2 × window + 8`, at least 16), the first 16 at the connect: 65 KiB at the default eager threshold.
    pub send_pool_bytes: u64,
    /// Server: send buffers in use now (taken for a message, or read by a posted SEND whose
    /// completion was not polled yet); an idle session holds none.
    pub send_bufs_in_use: u64,
    /// Server: times a session found its worker's send pool empty at its cap and waited (its
    /// message went when a completion freed a buffer).
    pub send_pool_waits: u64,
    /// Server: bytes of receive rings granted now (protocol 12: granted on demand, part of
    /// `registered_bytes`); set by `ServerHandle::counters`. 0 while every session is idle or
    /// sends small bodies only.
    pub ring_bytes: u64,
    /// Server: receive rings granted since the server started.
    pub rings_granted: u64,
    /// Server: receive rings taken back from idle sessions (`ServerConfig::ring_idle`): given
    /// back by their client, or revoked (`rings_revoked`). Rings that go with their session are
    /// not counted.
    pub rings_reclaimed: u64,
    /// Server: of `rings_reclaimed`, those whose client did not give them back in time (their
    /// window deallocated regardless).
    pub rings_revoked: u64,
    /// Server: ring asks refused (`ServerConfig::max_ring_pool_bytes`, or the registration
    /// failed): each failed the client's call or stream message that needed the ring with
    /// RESOURCE_EXHAUSTED naming the cap; the session stays open.
    pub rings_refused: u64,
    /// Server: bytes registered for the workers' receive buffers (SRQ WQEs), over all workers;
    /// set by `ServerHandle::counters`. They grow, in chunks of 64 buffers, with what the
    /// sessions admitted to each worker reserve at most at once (`srq_reserved`) plus room for
    /// the newest session's growth to `ServerConfig::credits_per_session` with a ring (raises and
    /// ring grants beyond it have the worker register more), and stay until the server stops; 0
    /// for a server that never admitted a session. Client: the receive buffers of the live
    /// session's endpoint, which its sessions share (one SRQ per endpoint, `rpc_core::Endpoint`;
    /// a `Channel` counts each endpoint its sessions are on once), registered 16 at a time before
    /// the calls that need them and kept while the endpoint lives: 15 for the endpoint (an idle
    /// session's control messages and 7 that may wait for a batched repost: 16 registered at the
    /// first connect), and per session what its calls claim beyond (`4 × calls` for the most
    /// calls it had at once, doubling, plus the stream budget once it opened a stream, plus 32
    /// once it sent or received a body above the eager threshold; at most `4 × window +
    /// min(window, 256) + 32`, 192 at the default window). A session alone on its endpoint: 16
    /// idle (65 KiB at the default eager threshold), 32 making a call at a time, 64 with bodies
    /// above the threshold; 1,000 idle sessions of one endpoint: 16 between them.
    pub recv_buffer_bytes: u64,
    /// Server: receive WQEs posted to the workers' SRQs (the buffers of `recv_buffer_bytes`).
    /// Client: the live session's endpoint's (see `recv_buffer_bytes`).
    pub recv_buffers: u64,
    /// Server: bytes charged now for bodies arriving in pieces (capped by
    /// `ServerConfig::max_reassembly_bytes`); set by `ServerHandle::counters`.
    pub reassembly_bytes: u64,
    /// Server: most of `reassembly_bytes` at once since the server started.
    pub reassembly_peak: u64,
    /// Server: bytes charged now for answers waiting on the heap for their client's ring (capped
    /// by `ServerConfig::max_backlog_bytes`); set by `ServerHandle::counters`.
    pub backlog_bytes: u64,
    /// Server: most of `backlog_bytes` at once since the server started.
    pub backlog_peak: u64,
    /// Server: sessions closed because the client sent beyond its receive reservation
    /// (`session::meter`: Pings, Pongs, RingReturns or pieces over the protocol's bound; a flood).
    /// Client: sessions closed because the server sent more than the session's calls may bring
    /// at once while nobody drove it (its share of the endpoint's shared receive buffers,
    /// `endpoint::rx`).
    pub metered: u64,
    /// Server: sessions closed with a Close after `ServerConfig::idle_timeout` without a call.
    pub idle_closed: u64,
    /// Server: async handlers' futures polled on the worker (`AsyncRuntime::worker`, the
    /// default) that waited at their first poll and became tasks of the worker's executor. A
    /// future that completed at its first poll answered inline, as an inline handler does, and
    /// is not counted; nor are futures spawned on a tokio runtime (the opt-in).
    pub async_tasks: u64,
    /// Requests whose metadata named the session's cached block instead of carrying it
    /// ([`crate::wire::METADATA_CACHED`]; client: sent, server: received). A client names the
    /// block once a request that carried the same one has left, so a caller whose every call
    /// has the same metadata (an auth token) sends it once per session.
    pub metadata_cached: u64,
    /// Server: live sessions whose TCP control connection the server holds (one file descriptor
    /// each). Client: 1 while its session has one.
    pub control_connections: u64,
    /// Server: live sessions admitted beyond `ServerConfig::max_control_connections`, which hold
    /// no control connection ([`crate::wire::FLAG_DETACHED`]: no file descriptor; teardown by
    /// the Close message, liveness by the idle probe and `idle_timeout`). Client: 1 while its
    /// session is such a one.
    pub sessions_detached: u64,
    /// Server: sessions opened on the same-host path since it started (`ServerConfig::
    /// same_host_shm`: software-NIC workers next to the RDMA ones; set by
    /// `ServerHandle::counters`). Client: 1 while its session runs on it
    /// (`ClientConfig::same_host_shm` on an RDMA transport, the server on this host offering it).
    pub sessions_shm: u64,
    /// Server: receive WQEs the live sessions reserve of their workers' SRQs now, over all
    /// workers (`ServerConfig::srq_per_session` of each one's credits: of
    /// `ServerConfig::initial_credits` for an idle session; the idle sessions' bases counted as
    /// at most `ServerConfig::srq_idle_wqes` per worker); set by `ServerHandle::counters`.
    pub srq_reserved: u64,
    /// Server: what the live sessions' bases (their reservations at
    /// `ServerConfig::initial_credits` with no ring) sum to, shared or not, over all workers;
    /// above `srq_idle_wqes` per worker the idle sessions share their WQEs.
    pub srq_bases: u64,
    /// Server: sessions' credits raised (a CreditGrant above the credits they had; protocol 12)
    /// since the server started.
    pub credit_raises: u64,
    /// Server: sessions' credits lowered back to `ServerConfig::initial_credits` after
    /// `ServerConfig::credit_idle` without a call.
    pub credit_lowerings: u64,
    /// Server: raises refused because the worker's SRQ had no WQEs posted beyond the sessions'
    /// reservations (the session goes on at its credits).
    pub credit_raises_refused: u64,
    /// Calls ended with each status code, indexed by `Code as usize` (index 0 counts OK).
    pub by_code: [u64; 17],
}

impl Counters {
    /// Counts one call ended with `code`.
    #[inline]
    pub fn status(&mut self, code: Code) {
        self.by_code[code as usize] += 1;
    }

    /// Calls ended with `code`.
    pub fn with_code(&self, code: Code) -> u64 {
        self.by_code[code as usize]
    }

    /// Server: bytes pinned per live session, in bytes: the registered memory
    /// (`registered_bytes`: rings, send areas), the SRQ's receive buffers (`recv_buffer_bytes`)
    /// and the workers' send buffers (`send_pool_bytes`) over the sessions open
    /// (`sessions_opened - sessions_closed`); `None` with no session open. The figure
    /// `ServerConfig::srq_idle_wqes`, the on-demand rings and the shared send pools keep small
    /// for idle sessions.
    pub fn pinned_per_session(&self) -> Option<u64> {
        let live = self.sessions_opened.checked_sub(self.sessions_closed).filter(|&n| n > 0)?;
        Some((self.registered_bytes + self.recv_buffer_bytes + self.send_pool_bytes) / live)
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Counters) {
        self.rpcs += other.rpcs;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
        self.credit_stalls += other.credit_stalls;
        self.ring_full_stalls += other.ring_full_stalls;
        self.late_replies += other.late_replies;
        self.malformed += other.malformed;
        self.sessions_opened += other.sessions_opened;
        self.sessions_closed += other.sessions_closed;
        self.window_fallbacks += other.window_fallbacks;
        self.cancels += other.cancels;
        self.late_answers += other.late_answers;
        self.peers_lost += other.peers_lost;
        self.over_reassembly_cap += other.over_reassembly_cap;
        self.over_backlog_cap += other.over_backlog_cap;
        self.reassembly_timeouts += other.reassembly_timeouts;
        self.registered_bytes += other.registered_bytes;
        self.registered_peak += other.registered_peak;
        self.send_area_bytes += other.send_area_bytes;
        self.send_areas_created += other.send_areas_created;
        self.send_areas_released += other.send_areas_released;
        self.send_area_failures += other.send_area_failures;
        self.send_pool_bytes += other.send_pool_bytes;
        self.send_bufs_in_use += other.send_bufs_in_use;
        self.send_pool_waits += other.send_pool_waits;
        self.ring_bytes += other.ring_bytes;
        self.rings_granted += other.rings_granted;
        self.rings_reclaimed += other.rings_reclaimed;
        self.rings_revoked += other.rings_revoked;
        self.rings_refused += other.rings_refused;
        self.recv_buffer_bytes += other.recv_buffer_bytes;
        self.recv_buffers += other.recv_buffers;
        self.reassembly_bytes += other.reassembly_bytes;
        self.reassembly_peak += other.reassembly_peak;
        self.backlog_bytes += other.backlog_bytes;
        self.backlog_peak += other.backlog_peak;
        self.metered += other.metered;
        self.idle_closed += other.idle_closed;
        self.async_tasks += other.async_tasks;
        self.metadata_cached += other.metadata_cached;
        self.control_connections += other.control_connections;
        self.sessions_detached += other.sessions_detached;
        self.sessions_shm += other.sessions_shm;
        self.reassembly_refused += other.reassembly_refused;
        self.srq_reserved += other.srq_reserved;
        self.srq_bases += other.srq_bases;
        self.credit_raises += other.credit_raises;
        self.credit_lowerings += other.credit_lowerings;
        self.credit_raises_refused += other.credit_raises_refused;
        for (a, b) in self.by_code.iter_mut().zip(other.by_code.iter()) {
            *a += b;
        }
    }
}

/// Counters other than `by_code` (and the server-wide gauges, which `ServerMemory` holds).
const FIELDS: usize = 24;

/// The published copy, readable from any thread.
pub(crate) struct SharedCounters {
    fields: [AtomicU64; FIELDS + 17],
}

impl Default for SharedCounters {
    fn default() -> Self {
        SharedCounters { fields: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl SharedCounters {
    pub(crate) fn publish(&self, c: &Counters) {
        let vals = [
            c.rpcs,
            c.bytes_in,
            c.bytes_out,
            c.credit_stalls,
            c.ring_full_stalls,
            c.late_replies,
            c.malformed,
            c.sessions_opened,
            c.sessions_closed,
            c.window_fallbacks,
            c.cancels,
            c.late_answers,
            c.peers_lost,
            c.over_reassembly_cap,
            c.over_backlog_cap,
            c.reassembly_timeouts,
            c.metered,
            c.idle_closed,
            c.reassembly_refused,
            c.async_tasks,
            c.metadata_cached,
            c.send_pool_bytes,
            c.send_bufs_in_use,
            c.send_pool_waits,
        ];
        for (f, v) in self.fields.iter().zip(vals.iter().chain(c.by_code.iter())) {
            f.store(*v, Ordering::Release);
        }
    }

    pub(crate) fn snapshot(&self) -> Counters {
        let g = |i: usize| self.fields[i].load(Ordering::Acquire);
        let mut by_code = [0u64; 17];
        for (i, b) in by_code.iter_mut().enumerate() {
            *b = g(FIELDS + i);
        }
        Counters {
            rpcs: g(0),
            bytes_in: g(1),
            bytes_out: g(2),
            credit_stalls: g(3),
            ring_full_stalls: g(4),
            late_replies: g(5),
            malformed: g(6),
            sessions_opened: g(7),
            sessions_closed: g(8),
            window_fallbacks: g(9),
            cancels: g(10),
            late_answers: g(11),
            peers_lost: g(12),
            over_reassembly_cap: g(13),
            over_backlog_cap: g(14),
            reassembly_timeouts: g(15),
            metered: g(16),
            idle_closed: g(17),
            reassembly_refused: g(18),
            async_tasks: g(19),
            metadata_cached: g(20),
            send_pool_bytes: g(21),
            send_bufs_in_use: g(22),
            send_pool_waits: g(23),
            by_code,
            ..Counters::default()
        }
    }
}

/// A server's memory gauges, shared by its listener and workers: registered bytes of the live
/// sessions, and the capped counts of bytes held for reassembly and for answers waiting
/// (the sessions charge them: [`crate::session::Session::set_reassembly`],
/// [`crate::session::Session::charge_backlog`]).
pub(crate) struct ServerMemory {
    pub(crate) registered: Arc<HeldBytes>,
    /// The sessions' send mirrors and staging areas (also counted in `registered`).
    pub(crate) areas: Arc<AreaGauge>,
    /// The sessions' receive rings, granted on demand (also counted in `registered`).
    pub(crate) rings: Arc<AreaGauge>,
    pub(crate) reassembly: Arc<HeldBytes>,
    pub(crate) backlog: Arc<HeldBytes>,
    /// Receive buffers registered for the workers' SRQs: bytes and buffers.
    pub(crate) recv_bytes: std::sync::atomic::AtomicU64,
    pub(crate) recv_buffers: std::sync::atomic::AtomicU64,
    /// Requests admitted and not yet answered over every session: the load responses report
    /// (`Session::set_load`).
    pub(crate) load: Arc<std::sync::atomic::AtomicU32>,
    /// Sessions holding a control connection, and sessions holding none (the listener's).
    pub(crate) control_connections: AtomicU64,
    pub(crate) sessions_detached: AtomicU64,
    /// The workers' SRQs (set once the workers exist).
    pub(crate) srq_rooms: std::sync::OnceLock<Vec<Arc<crate::session::SrqRoom>>>,
}

impl ServerMemory {
    pub(crate) fn new(
        max_reassembly: u64,
        max_backlog: u64,
        max_send_areas: u64,
        max_rings: u64,
    ) -> ServerMemory {
        let registered = HeldBytes::new(u64::MAX, "registered memory");
        ServerMemory {
            areas: AreaGauge::capped(
                registered.clone(),
                HeldBytes::new(max_send_areas, "ServerConfig::max_send_area_bytes"),
                "a send mirror and staging area",
            ),
            rings: AreaGauge::capped(
                registered.clone(),
                HeldBytes::new(max_rings, "ServerConfig::max_ring_pool_bytes"),
                "a receive ring",
            ),
            registered,
            reassembly: HeldBytes::new(max_reassembly, "ServerConfig::max_reassembly_bytes"),
            backlog: HeldBytes::new(max_backlog, "ServerConfig::max_backlog_bytes"),
            recv_bytes: std::sync::atomic::AtomicU64::new(0),
            recv_buffers: std::sync::atomic::AtomicU64::new(0),
            load: Arc::new(std::sync::atomic::AtomicU32::new(0)),
            control_connections: AtomicU64::new(0),
            sessions_detached: AtomicU64::new(0),
            srq_rooms: std::sync::OnceLock::new(),
        }
    }

    /// Writes the gauges into `c`.
    pub(crate) fn fill(&self, c: &mut Counters) {
        c.registered_bytes = self.registered.used();
        c.registered_peak = self.registered.peak();
        self.areas.fill(c);
        c.ring_bytes = self.rings.bytes();
        c.rings_granted = self.rings.created.load(Ordering::Relaxed);
        c.rings_reclaimed = self.rings.released.load(Ordering::Relaxed);
        c.rings_refused = self.rings.failed.load(Ordering::Relaxed);
        c.rings_revoked = self.rings.revoked.load(Ordering::Relaxed);
        c.reassembly_bytes = self.reassembly.used();
        c.reassembly_peak = self.reassembly.peak();
        c.backlog_bytes = self.backlog.used();
        c.backlog_peak = self.backlog.peak();
        c.recv_buffer_bytes = self.recv_bytes.load(std::sync::atomic::Ordering::Relaxed);
        c.recv_buffers = self.recv_buffers.load(std::sync::atomic::Ordering::Relaxed);
        c.control_connections = self.control_connections.load(Ordering::Relaxed);
        c.sessions_detached = self.sessions_detached.load(Ordering::Relaxed);
        for room in self.srq_rooms.get().into_iter().flatten() {
            c.srq_reserved += u64::from(room.reserved());
            c.srq_bases += u64::from(room.bases());
            let (raised, lowered, refused) = room.grants();
            c.credit_raises += raised;
            c.credit_lowerings += lowered;
            c.credit_raises_refused += refused;
        }
    }
}

/// Send mirrors and staging areas registered on demand ([`crate::endpoint::areas::SendAreas`]):
/// bytes registered now and how many were made, given back and refused. Updated only when one
/// is registered or given back (rare next to calls), so atomics cost nothing on the data path.
#[derive(Default)]
pub(crate) struct AreaGauge {
    /// A gauge of all registered bytes that these bytes are added to as well (the server's).
    registered: Option<Arc<HeldBytes>>,
    /// The cap on these bytes (the server's `ServerConfig::max_send_area_bytes`), charged
    /// before a registration; none on a client.
    cap: Option<Arc<HeldBytes>>,
    /// What is charged, for the cap's reason ("a send mirror and staging area").
    what: &'static str,
    bytes: AtomicU64,
    /// Of `released`, those taken back without their holder's consent (a revoked ring).
    revoked: AtomicU64,
    created: AtomicU64,
    released: AtomicU64,
    failed: AtomicU64,
}

impl AreaGauge {
    /// A gauge whose bytes are also added to `registered` (when given).
    pub(crate) fn new(registered: Option<Arc<HeldBytes>>) -> Arc<AreaGauge> {
        Arc::new(AreaGauge { registered, ..AreaGauge::default() })
    }

    /// A gauge whose bytes are also added to `registered`, and whose registrations are charged
    /// to `cap` first ([`AreaGauge::charge`]).
    pub(crate) fn capped(
        registered: Arc<HeldBytes>,
        cap: Arc<HeldBytes>,
        what: &'static str,
    ) -> Arc<AreaGauge> {
        Arc::new(AreaGauge { registered: Some(registered), cap: Some(cap), what, ..AreaGauge::default() })
    }

    /// Of the bytes [`AreaGauge::gone`] just gave back, taken without their holder's consent.
    pub(crate) fn revoked(&self) {
        self.revoked.fetch_add(1, Ordering::Relaxed);
    }

    /// Charges `bytes` about to be registered to the cap (nothing without one); the charge is
    /// given back when dropped.
    ///
    /// # Errors
    /// The reason, naming the cap's field and value, when the bytes would take the count over
    /// it; nothing is charged then.
    pub(crate) fn charge(&self, bytes: u64) -> Result<Option<Charge>, String> {
        match &self.cap {
            Some(cap) => cap.charge(bytes, self.what).map(Some),
            None => Ok(None),
        }
    }

    /// `bytes` were registered.
    pub(crate) fn created(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.created.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = &self.registered {
            r.add(bytes);
        }
    }

    /// `bytes` were deregistered; `idle`: given back for sitting unused (else with their
    /// session).
    pub(crate) fn gone(&self, bytes: u64, idle: bool) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        if idle {
            self.released.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(r) = &self.registered {
            r.release(bytes);
        }
    }

    /// A registration failed.
    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes registered now.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Writes the gauge into `c`'s `send_area*` fields.
    pub(crate) fn fill(&self, c: &mut Counters) {
        c.send_area_bytes = self.bytes();
        c.send_areas_created = self.created.load(Ordering::Relaxed);
        c.send_areas_released = self.released.load(Ordering::Relaxed);
        c.send_area_failures = self.failed.load(Ordering::Relaxed);
    }
}
