//! Server workers: one thread per configured core, owning a CQ, an SRQ with its receive buffers,
//! and the QPs, rings and sessions of the connections assigned to it.
//!
//! Loop: take new connections and closes from the control queue → take deferred answers → poll
//! the CQ in batches → handle receives (handlers run inline) → post each connection's sends with
//! one doorbell (selective signaling) → repost receive buffers in batches → idle per policy.
//! Other threads talk to a worker only through bounded crossbeam queues.
//!
//! A driver of its sessions: it does the IO (polls, runs handlers, posts WRs) and asks the
//! session what a received header, a completion or a timer means and what may go now: answers
//! leave in order through the session's [`Outbox`] (a second answer to one call is dropped
//! there), and a cancelled or expired call gets the answer [`Event::answer`] names.

use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::buffers::{Completion, Completions, MirrorView, RecvBuf, RecvPool, RecvRing, RecvView, SendPool};
use crate::config::{Idle, PollingPolicy, EVENT_WAIT};
use crate::dispatch::local::LocalTasks;
use crate::dispatch::registry::Registry;
use crate::dispatch::reply::{
    panic_text, CallTarget, CancelPeek, DeferQueue, Outcome, ReplyWriter, RequestContext, SendSpace,
    ServerInterceptor,
};
use crate::dispatch::service::Body;
use crate::dispatch::source::SourceShared;
use crate::dispatch::stream::{Sealed, SinkShared};
use crate::endpoint::conn::{self, BodyAt, Conn, Outgoing};
use crate::endpoint::counters::{Counters, ServerMemory, SharedCounters};
use crate::session::{Event, Outbox, Waiting};
use crate::status::{Code, Status};
use crate::verbs::{CompletionQueue, Provider, QpAttr, QpState, QueuePair, WcOpcode, WcStatus};
use crate::wire::{Header, Kind, HEADER_LEN};

mod wheel;
use wheel::TimerWheel;

/// Completions polled per `poll` call.
const POLL_BATCH: usize = 32;

/// Send buffers a worker's pool registers at a time (one MR), as its sessions' sends need them
/// (`ServerConfig::max_send_pool_bytes`): 258 KiB at the default eager threshold.
pub(crate) const SEND_CHUNK: usize = 64;
/// Busy loop iterations between looks at the control and deferred-answer queues.
const QUEUE_CHECK_EVERY: u32 = 16;
/// Receive buffers reposted per doorbell while busy.
const REPOST_BATCH: usize = 16;
/// Empty polls after which every waiting receive buffer is reposted.
const REPOST_IDLE: u32 = 64;
/// Counters are published every this many empty polls (first after half of it).
const PUBLISH_IDLE: u32 = 1024;
/// Counters are published every this many busy iterations (a poll that found work, or tasks that
/// ran): `ServerHandle::counters` lags a worker that never goes idle by at most this many
/// iterations' calls. About 150 instructions each time, so under 1 a call.
const PUBLISH_BUSY: u32 = 256;
/// The clock is read (for the sessions' timers) every this many empty polls, and every
/// `TIMER_CHECK_BUSY` busy iterations: never once per loop.
const TIMER_CHECK_IDLE: u32 = 64;
const TIMER_CHECK_BUSY: u32 = 1024;
/// Granularity of the sessions' timers (call deadlines, the idle probe).
const TIMER_TICK: Duration = Duration::from_millis(2);
/// Slots of the timer wheel: 4,096 of `TIMER_TICK`, a span of 8.2 s (the idle probe's Pings go
/// every third of `peer_timeout`, 2 s by default); a later deadline is looked at once per span.
const TIMER_SLOTS: usize = 4096;

/// How often the idle sweep looks at every session: a quarter of `idle_timeout` (at least
/// [`TIMER_TICK`], at most 1 s), so a session closes at most that much after `idle_timeout`.
fn idle_sweep_period(idle_timeout: Duration) -> Duration {
    (idle_timeout / 4).clamp(TIMER_TICK, Duration::from_secs(1))
}

/// [`NewConn::bound`]: the worker has not bound the ring's window yet.
pub(crate) const BIND_PENDING: u8 = 0;
/// [`NewConn::bound`]: the bind completed (or the ring has no window): the peer may write.
pub(crate) const BIND_DONE: u8 = 1;
/// [`NewConn::bound`]: the bind failed; the session is closed.
pub(crate) const BIND_FAILED: u8 = 2;

/// Receive buffers of a worker's SRQ registered at a time (a chunk; the last one is cut at the
/// SRQ's depth).
pub(crate) const RECV_CHUNK_SHIFT: u32 = 6;

impl<P: Provider> WorkerShared<P> {
    /// Registers the receive buffers (of `buf_size` bytes) the SRQ lacks for `target` WQEs, at
    /// most `depth`, in chunks of `1 << RECV_CHUNK_SHIFT` buffers ([`crate::session::SrqRoom::claim`]:
    /// the listener and the worker grow it, neither past the depth); the worker posts them.
    /// Counted in the server's gauges at once. Buffers are never taken back while the server
    /// runs.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED when the memory cannot be registered (nothing is kept).
    pub(crate) fn grow_srq(
        &self,
        target: u32,
        depth: u32,
        buf_size: usize,
    ) -> Result<Vec<crate::buffers::RecvChunk<P>>, Status> {
        let chunk = 1u32 << RECV_CHUNK_SHIFT;
        let claimed = self.srq_room.claim(target, depth, chunk);
        let mut chunks = Vec::new();
        let mut left = claimed;
        while left > 0 {
            let n = chunk.min(left);
            match RecvPool::<P>::register_chunk(&self.pd, n, buf_size) {
                Ok(c) => chunks.push(c),
                Err(e) => {
                    self.srq_room.unclaim(claimed);
                    return Err(Status::resource_exhausted(format!(
                        "registering {n} receive buffers of {buf_size} bytes for the SRQ: {e}"
                    )));
                }
            }
            left -= n;
        }
        let bytes: u64 = chunks.iter().map(|c| c.bytes() as u64).sum();
        self.memory.recv_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.memory.recv_buffers.fetch_add(u64::from(claimed), Ordering::Relaxed);
        Ok(chunks)
    }

    /// Takes back the receive buffers (count, bytes) of chunks that were registered and will
    /// never be posted (they are deregistered with their session, which was not admitted).
    pub(crate) fn srq_release(&self, (bufs, bytes): (u32, u64)) {
        self.srq_room.unclaim(bufs);
        self.memory.recv_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.memory.recv_buffers.fetch_sub(u64::from(bufs), Ordering::Relaxed);
    }

    /// Tells the listener to look at `closed` and at the binds of its pending handshakes.
    pub(crate) fn wake_listener(&self) {
        if let Err(e) = self.listener.wake() {
            tracing::warn!(worker = self.index, error = %e, "waking the listener failed; it looks at its next tick");
        }
    }
}

/// A connection handed from the listener to a worker.
pub(crate) struct NewConn<P: Provider> {
    pub(crate) conn: Conn<P>,
    pub(crate) session: u32,
    pub(crate) peer: SocketAddr,
    /// Set by the worker once the ring's window is bound to the QP (the listener answers the
    /// handshake only then).
    pub(crate) bound: Arc<AtomicU8>,
    /// Bytes the session registered, added to the server's gauge by the listener (the worker
    /// takes them off when the session goes).
    pub(crate) registered: u64,
    /// Receive buffers the worker's SRQ needs before this session may send (registered by the
    /// listener; the worker adds and posts them first thing).
    pub(crate) recv_chunks: Vec<crate::buffers::RecvChunk<P>>,
}

/// Messages into a worker.
pub(crate) enum Control<P: Provider> {
    /// A connected session to serve.
    Open(Box<NewConn<P>>),
    /// The peer's TCP connection closed: free the session.
    Close(u32),
}

/// What a worker shares with the listener and the server handle.
pub(crate) struct WorkerShared<P: Provider> {
    pub(crate) index: usize,
    pub(crate) control: ArrayQueue<Control<P>>,
    pub(crate) defer: Arc<DeferQueue>,
    pub(crate) counters: Arc<SharedCounters>,
    /// Set by shutdown: answer new requests UNAVAILABLE, finish the others, then stop.
    pub(crate) draining: Arc<AtomicBool>,
    pub(crate) sessions: AtomicUsize,
    /// The worker's loop count, stored at every iteration: the listener sees a worker whose beat
    /// stands still as held in a handler (`server::listener`'s watchdog).
    pub(crate) beat: AtomicU32,
    /// The SRQ's receive WQEs posted, and reserved by the live sessions ([`conn::srq_need`] of
    /// each one's credits; each session holds its share and gives it back when dropped).
    pub(crate) srq_room: Arc<crate::session::SrqRoom>,
    /// Sessions the worker closed itself (malformed header, QP error): the listener closes their TCP.
    pub(crate) closed: Arc<ArrayQueue<u32>>,
    /// Wakes the listener: a session in `closed`, or a window bind that completed or failed (the
    /// listener answers the handshake then).
    pub(crate) listener: Arc<mio::Waker>,
    /// The server's memory gauges and caps.
    pub(crate) memory: Arc<ServerMemory>,
    pub(crate) pd: P::ProtectionDomain,
    pub(crate) cq: P::CompletionQueue,
    pub(crate) srq: P::SharedReceiveQueue,
    /// Registered buffers in `pd` that handlers fill and answers carry with no copy
    /// ([`crate::codegen::RequestContext::alloc_registered`]).
    pub(crate) registered: Arc<crate::buffers::RegisteredPool>,
}

/// A request's body: in its receive buffer (eager), or copied out of the ring.
enum Received {
    Eager(RecvBuf),
    Owned(Vec<u8>),
}

/// A message waiting in a session's outbox: a body on the heap or in the staging area (sent
/// whole or in pieces), or an error status.
type Spill = Waiting<Outgoing>;

/// An answer or stream message for the outbox: its body, or the error it ends with.
fn spill(header: Header, body: Result<impl Into<crate::buffers::GatherBody>, Status>) -> Spill {
    match body {
        Ok(b) => Waiting::Body(Outgoing::new(header, b)),
        Err(s) => Waiting::Error(header, s),
    }
}

/// Charges an answer about to wait in the backlog for what it holds on the heap
/// ([`Outgoing::charge`]).
///
/// # Errors
/// The reason to close the session with, naming `ServerConfig::max_backlog_bytes`.
fn charge(session: &crate::session::Session, waiting: &mut Spill) -> Result<(), String> {
    match waiting {
        Waiting::Body(out) => out.charge(session),
        Waiting::Error(..) => Ok(()),
    }
}

/// Most bytes of one stream SEND's body on `conn`'s session: its eager body size, the size of a
/// server stream's batches.
fn batch_cap<P: Provider>(conn: &Conn<P>) -> usize {
    (conn.body_cap as u32).min(conn.session.params().eager_threshold) as usize
}

/// One session this worker serves (an entry of its session table; "slot" names call slots only).
struct Entry<P: Provider> {
    conn: Conn<P>,
    session: u32,
    peer: SocketAddr,
    dirty: bool,
    /// Answers and stream messages waiting for send buffers or ring space, in order (the
    /// session's rules: [`Outbox`]).
    backlog: Outbox<Outgoing>,
    /// Until the window bind's completion is polled: whom to tell.
    binding: Option<Arc<AtomicU8>>,
    /// Its Close is posted (idle for `idle_timeout`, or over a cap: [`Worker::close_telling`]):
    /// freed when that Close's completion is polled, or at the next idle sweep (its messages
    /// meanwhile are dropped unread).
    closing: bool,
    /// What its close counts, applied when it is freed (with `sessions_closed`, so a snapshot
    /// of the counters sees both or neither).
    counted: Option<fn(&mut Counters)>,
    /// Deferred calls not yet answered, with the flag their `Responder` reads (raised on
    /// cancel, expiry, close).
    deferred: DeferredCalls,
    /// Streams of this session with a handler on them: server messages drained from their sink
    /// as the client grants them, client messages handed to their reader and granted again
    /// back as it takes them ([`Worker::pump_streams`]).
    streams: Streams,
    /// Bytes it registered (in the server's gauge until it closes).
    registered: u64,
    /// The charge of its granted receive ring against `ServerConfig::max_ring_pool_bytes`
    /// (with the ring, `conn.ring`; given back when the ring goes).
    ring_charge: Option<crate::session::Charge>,
    /// The session's cached metadata block ([`crate::wire::METADATA_STORE`]): the last one a
    /// request stored (at most [`crate::wire::MAX_CACHED_BLOCK`] bytes), or the status it was
    /// refused with, which the requests naming it are answered with.
    kept_metadata: Option<Result<Arc<crate::metadata::Metadata>, Status>>,
    /// In [`Worker::starved`]: it waits for a send buffer.
    starved: bool,
}

/// A stream with a handler on it: its call, the sink its handler sends into (server and
/// bidirectional streaming) and the queue it reads the client's messages from (client and
/// bidirectional streaming).
struct OpenStream {
    slot: u16,
    generation: u32,
    method: u32,
    sink: Option<Arc<SinkShared>>,
    source: Option<Arc<SourceShared>>,
    /// Messages in the sink's open batch at the last look: the batch is taken still open only
    /// when the producer added none since (it paused), else it fills first.
    seen_open: usize,
}

/// A session's deferred calls not yet answered, with the flag their `Responder` reads: raised
/// when the session goes (no deferred answer of it can be delivered any more).
#[derive(Default)]
struct DeferredCalls(Vec<(u16, u32, Arc<crate::dispatch::reply::CancelFlag>)>);

impl Drop for DeferredCalls {
    fn drop(&mut self) {
        for (_, _, flag) in &self.0 {
            flag.raise();
        }
    }
}

impl std::ops::Deref for DeferredCalls {
    type Target = Vec<(u16, u32, Arc<crate::dispatch::reply::CancelFlag>)>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for DeferredCalls {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// A session's streams with a handler on them: cancelled (both ways) when the session goes.
#[derive(Default)]
struct Streams(Vec<OpenStream>);

impl Drop for Streams {
    fn drop(&mut self) {
        for st in &self.0 {
            if let Some(source) = &st.source {
                source.cancel();
            }
            if let Some(sink) = &st.sink {
                sink.cancel();
            }
        }
    }
}

impl std::ops::Deref for Streams {
    type Target = Vec<OpenStream>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Streams {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// Splits a request's metadata block off the front of `body` into `into`, in `spare`'s buffer
/// when it has one that nothing else holds (a worker decodes blocks without allocating); on a
/// refused block, the status the call is answered with (the body is left as it was).
fn split_metadata<'a>(
    body: Body<'a>,
    limit: usize,
    into: &mut Option<Arc<crate::metadata::Metadata>>,
    spare: &mut Option<Arc<crate::metadata::Metadata>>,
) -> (Body<'a>, Option<Status>) {
    let mut md = spare.take().unwrap_or_default();
    let split = match Arc::get_mut(&mut md) {
        Some(m) => m.split_into(body.as_slice(), limit),
        None => crate::metadata::Metadata::split(body.as_slice(), limit).map(|(m, at)| {
            md = Arc::new(m);
            at
        }),
    };
    match split {
        Ok(at) => {
            *into = Some(md);
            (body.advance(at), None)
        }
        Err(s) => {
            *spare = Some(md);
            (body, Some(s))
        }
    }
}

/// What a session keeps of a request's block stored as its cached one
/// ([`crate::wire::METADATA_STORE`]): the block, or the status it was refused with (also for
/// one over [`crate::wire::MAX_CACHED_BLOCK`] bytes, which no client of this build stores).
#[cold]
fn kept_block(
    md: Option<Arc<crate::metadata::Metadata>>,
    refused: Option<Status>,
) -> Result<Arc<crate::metadata::Metadata>, Status> {
    match (md, refused) {
        (_, Some(s)) => Err(s),
        // A copy of its own size: `md` may be the worker's reused buffer, grown by a larger block
        // decoded before it (up to `max_metadata_bytes`), which a session must not keep.
        (Some(md), None) if md.encoded_len() <= crate::wire::MAX_CACHED_BLOCK => Ok(Arc::new((*md).clone())),
        (Some(md), None) => Err(Status::invalid_argument(format!(
            "request metadata: a cached block of {} bytes, over the {} a session keeps",
            md.encoded_len(),
            crate::wire::MAX_CACHED_BLOCK
        ))),
        (None, None) => Err(Status::internal("request metadata: no block to cache")),
    }
}

/// Limits a worker applies.
#[derive(Clone, Copy)]
pub(crate) struct WorkerLimits {
    pub(crate) max_sessions: usize,
    /// `ServerConfig::srq_depth`: the most receive WQEs the SRQ may hold.
    pub(crate) srq_depth: u32,
    pub(crate) polling: PollingPolicy,
    pub(crate) drain_timeout: Duration,
    /// Silence of a client with unanswered calls after which its session closes.
    pub(crate) peer_timeout: Option<Duration>,
    /// Time without a call after which a session is closed with a Close (`None`: never).
    pub(crate) idle_timeout: Option<Duration>,
    /// `ServerConfig::send_area_idle`: time a session's send mirror and staging area may sit
    /// unused before the sweep gives them back (`None`: kept).
    pub(crate) send_area_idle: Option<Duration>,
    /// `ServerConfig::ring_idle`: time a granted receive ring may go without a body before the
    /// sweep reclaims it (`None`: kept).
    pub(crate) ring_idle: Option<Duration>,
    /// `ServerConfig::credit_idle`: time a session raised above its initial credits may go
    /// without a call before it is lowered back to them.
    pub(crate) credit_idle: Option<Duration>,
    /// `ServerConfig::ring_bytes`: the length of every ring granted.
    pub(crate) ring_len: u32,
    /// The device has type-2 memory windows: a granted ring is exposed through one bound to
    /// the session's QP (else through its MR's rkey).
    pub(crate) mw_type2: bool,
    /// `ServerConfig::max_call_duration`.
    pub(crate) max_call_duration: Option<Duration>,
    pub(crate) body_cap: usize,
    /// `ServerConfig::max_metadata_bytes`.
    pub(crate) max_metadata: usize,
    /// `ServerConfig::observe`.
    pub(crate) observe: crate::Observe,
}

/// What a running inline handler's [`RequestContext::is_cancelled`] looks into: the worker's
/// batch of completions (more polled from its CQ behind those not handled yet) and the first
/// bytes of the receives among them, for a Cancel of its call or a Close of its session. The
/// worker handles them as usual once the handler returns.
struct WorkerPeek<P: Provider> {
    wcs: Rc<Completions<POLL_BATCH>>,
    shared: Arc<WorkerShared<P>>,
    view: RecvView<P>,
}

impl<P: Provider> CancelPeek for WorkerPeek<P> {
    fn cancel_arrived(&self, qp_num: u32, slot: u16, generation: u32) -> bool {
        // An error stays with the CQ: the worker's own next poll meets it.
        let _ = self.wcs.poll_more(&self.shared.cq);
        let mut found = false;
        self.wcs.untaken_recv_heads::<P, HEADER_LEN>(&self.view, |wc, head| {
            if found || wc.qp_num != qp_num {
                return;
            }
            // A Close may carry a body (only its kind is read); a Cancel is a header alone.
            found = head.first() == Some(&(Kind::Close as u8))
                || Header::decode(head)
                    .is_ok_and(|h| h.kind == Kind::Cancel && h.slot == slot && h.generation == generation);
        });
        found
    }
}

/// One worker thread's state. Made on its thread ([`Worker::new`] in the thread's closure): it
/// shares its batch of completions with its context through `Rc`s.
pub(crate) struct Worker<P: Provider> {
    shared: Arc<WorkerShared<P>>,
    registry: Arc<Registry>,
    /// The method of the last request dispatched, and what `registry` gave for it
    /// ([`Registry::lookup_cached`]).
    last_method: crate::dispatch::registry::LastMethod,
    limits: WorkerLimits,
    entries: Vec<Option<Entry<P>>>,
    /// Indexes of `entries` that hold no session (a stack: a new session takes the last).
    free_entries: Vec<u16>,
    /// The index of each live session's entry, by session id (a Close from the listener).
    by_session: crate::dispatch::registry::IdMap<u16>,
    gens: Vec<u16>,
    by_qpn: crate::dispatch::registry::IdMap<u16>,
    /// The entry the last message on a known QP came from ([`Worker::lookup_qpn`] looks there
    /// before `by_qpn`): a hint only, checked against the entry's QP number at every use.
    last_rx: u16,
    dirty: Vec<u16>,
    /// The sessions' timers, by entry index: set while the session layer watches the peer
    /// (unanswered calls: their deadlines and bound; the idle probe of a client that answers
    /// it), at the session's [`crate::session::Session::poll_timeout`]. The clock is read for
    /// timers only while one is set.
    timers: TimerWheel,
    counters: Counters,
    scratch: Vec<u8>,
    ctx: RequestContext,
    /// `ServerConfig::interceptor`.
    interceptor: Option<ServerInterceptor>,
    /// No interceptor and nothing observed (`ServerConfig::observe`): a call may take the plain
    /// path ([`Worker::dispatch`]).
    plain_server: bool,
    /// The last request's metadata once no handler holds it: the next block is decoded into
    /// its buffer.
    spare_metadata: Option<Arc<crate::metadata::Metadata>>,
    /// Calls answered in this iteration whose records (`ServerConfig::observe`'s metrics) end
    /// once their answers are posted (off the critical path): with the code and the response's
    /// bytes.
    ended: Vec<(Ended, Code, usize)>,
    /// Shared with the context's [`CancelPeek`]: a handler's `is_cancelled` polls more into it.
    wcs: Rc<Completions<POLL_BATCH>>,
    /// Async handlers' tasks polled on this thread (shared with the context, whose
    /// `spawn_async` adds to it).
    local: Rc<LocalTasks>,
    /// The sessions with open streams, each once (empty: the loop skips
    /// [`Worker::pump_streams`]), so a pump visits those only, not every session entry.
    streaming: Vec<u16>,
    /// Sessions waiting for a send buffer (the pool empty at its cap), oldest first
    /// ([`Worker::note_starved`]), and the ones being retried ([`Worker::retry_starved`]): both
    /// allocated for every session at once.
    starved: Vec<u16>,
    retrying: Vec<u16>,
    // Last: dropped after every QP.
    /// The send buffers every session of this worker sends from (`ServerConfig::max_send_pool_bytes`).
    send: SendPool<P>,
    recv: RecvPool<P>,
}

impl<P: Provider> Worker<P> {
    pub(crate) fn new(
        shared: Arc<WorkerShared<P>>,
        registry: Arc<Registry>,
        recv: RecvPool<P>,
        send: SendPool<P>,
        limits: WorkerLimits,
        interceptor: Option<ServerInterceptor>,
    ) -> Worker<P> {
        let n = limits.max_sessions;
        let mut by_qpn = crate::dispatch::registry::IdMap::default();
        by_qpn.reserve(n);
        let queue = shared.defer.clone();
        let wcs = Rc::new(Completions::new());
        let mut ctx = RequestContext::new(queue, limits.body_cap, limits.max_call_duration);
        ctx.peek = Some(Rc::new(WorkerPeek { wcs: wcs.clone(), shared: shared.clone(), view: recv.view() }));
        let local = Rc::new(LocalTasks::default());
        ctx.local = Some(local.clone());
        ctx.registered = Some(shared.registered.clone());
        Worker {
            shared,
            registry,
            last_method: Default::default(),
            limits,
            entries: (0..n).map(|_| None).collect(),
            free_entries: (0..n as u16).rev().collect(),
            by_session: crate::dispatch::registry::IdMap::with_capacity_and_hasher(n, Default::default()),
            gens: vec![0; n],
            by_qpn,
            last_rx: 0,
            dirty: Vec::with_capacity(n),
            timers: TimerWheel::new(Instant::now(), TIMER_TICK, TIMER_SLOTS, n),
            counters: Counters::default(),
            scratch: vec![0; limits.body_cap],
            ctx,
            plain_server: interceptor.is_none() && !limits.observe.any(),
            interceptor,
            spare_metadata: None,
            ended: Vec::new(),
            local,
            streaming: Vec::with_capacity(n),
            starved: Vec::with_capacity(n),
            retrying: Vec::with_capacity(n),
            wcs,
            send,
            recv,
        }
    }

    fn tag(&self, idx: u16) -> u32 {
        (u32::from(idx) << 16) | u32::from(self.gens[idx as usize])
    }

    fn entry_by_tag(&mut self, tag: u32) -> Option<(u16, &mut Entry<P>)> {
        let idx = (tag >> 16) as u16;
        if self.gens.get(idx as usize).copied() != Some(tag as u16) {
            return None;
        }
        self.entries[idx as usize].as_mut().map(|s| (idx, s))
    }

    /// Runs until shutdown has drained every session.
    pub(crate) fn run(mut self) {
        let _ = self.shared.defer.worker.set(std::thread::current().id());
        let mut idle = Idle::new(self.limits.polling);
        let mut drain_deadline: Option<Instant> = None;
        let mut iterations: u32 = 0;
        // Busy iterations since the counters were last published (`PUBLISH_BUSY`).
        let mut busy_unpublished: u32 = 0;
        // Times the loop went idle (first empty poll after work) with timers or sweeps to look
        // at: it reads the clock at every `TIMER_CHECK_IDLE`-th of them.
        let mut went_idle: u32 = 0;
        let sweep_every = self.limits.idle_timeout.map(idle_sweep_period);
        let mut next_sweep = Instant::now();
        // Send mirrors and staging areas unused for `send_area_idle` are given back by a sweep
        // of their own (same clock reads as the idle sweep: none on the data path).
        let area_every = self.limits.send_area_idle.map(idle_sweep_period);
        let mut next_area_sweep = Instant::now();
        // So are granted receive rings unwritten for `ring_idle`.
        let ring_every = self.limits.ring_idle.map(idle_sweep_period);
        let mut next_ring_sweep = Instant::now();
        // And credits raised and unused for `credit_idle`.
        let credit_every = self.limits.credit_idle.map(idle_sweep_period);
        let mut next_credit_sweep = Instant::now();
        let sweeps =
            sweep_every.is_some() || area_every.is_some() || ring_every.is_some() || credit_every.is_some();
        loop {
            // The cross-thread queues are looked at when idle and every few busy iterations, not
            // between every two polls of a busy CQ (a new QP's first message drains the control
            // queue itself, see `lookup_qpn`).
            if idle.empty_polls() > 0 || iterations % QUEUE_CHECK_EVERY == 0 {
                // Read by the listener's watchdog: a worker whose beat stands still is inside a
                // handler (a plain store on a line only this thread writes). Stored at every idle
                // iteration and every `QUEUE_CHECK_EVERY` busy ones, so a running loop moves it
                // within microseconds, and the busy path pays no store per iteration.
                self.shared.beat.store(iterations, Ordering::Relaxed);
                // Usually both are empty: look before calling (what lands meanwhile is taken at
                // the next look, or by `lookup_qpn` for a new QP's first message).
                if !self.shared.control.is_empty() {
                    self.drain_control();
                }
                // The queue and the answers put aside when it was full (review2's overflow).
                if !self.shared.defer.is_empty() {
                    self.drain_deferred();
                }
            }
            if !self.streaming.is_empty() {
                self.pump_streams();
            }
            let n = match self.wcs.poll(&self.shared.cq) {
                Ok(n) => n,
                Err(e) => {
                    let _span = tracing::error_span!("worker", index = self.shared.index).entered();
                    tracing::error!(error = %e, "CQ failed; closing every session");
                    for idx in 0..self.entries.len() as u16 {
                        self.close_entry(idx, "completion queue failed", false, true);
                    }
                    break;
                }
            };
            while let Some(c) = self.wcs.next_completion() {
                self.on_completion(c);
            }
            // A session found the send pool empty at its cap, and completions freed buffers since.
            if self.send.starved() && self.send.available() > 0 {
                self.retry_starved();
            }
            // Async handlers' tasks woken since the last look (one atomic load when none was).
            let mut ran = 0;
            if self.local.has_ready() {
                ran = self.local.run_ready();
                // Their answers leave now, not at the next look at the queues.
                if !self.shared.defer.is_empty() {
                    self.drain_deferred();
                }
            }
            // Looked at before calling: most empty polls leave nothing to post.
            if !self.dirty.is_empty() {
                self.flush_dirty();
            }
            // The records of the calls just answered, now that their answers are posted.
            if !self.ended.is_empty() {
                end_observed(&mut self.ended);
            }
            // Receive buffers go back in batches; all of them once the worker is idle for a while
            // (not at the first empty poll, where the next request may already be landing).
            let threshold = if idle.empty_polls() >= REPOST_IDLE { 1 } else { REPOST_BATCH };
            if let Err(e) = self.recv.flush_batched(threshold) {
                tracing::error!(worker = self.shared.index, error = %e, "reposting receive buffers failed");
            }
            iterations = iterations.wrapping_add(1);
            // `Event` with no spins, and the poll drained the CQ (fewer than a batch): the loop
            // goes idle now, arming the CQ straight after this work, not after one more pass
            // that would only poll it empty (the peek after the arming sees what landed since
            // the poll: `Idle::pause`). A blocking caller's every call costs one pass, not two.
            let idle_now = n < POLL_BATCH && (n > 0 || ran > 0) && idle.blocks_at_first_empty();
            // Timers: the clock is read only while a session has something timed (unanswered
            // calls, the idle probe of a client that answers it) or a sweep may be due, and then
            // rarely (every few dozen empty polls, every thousand busy iterations); the timed
            // sessions are visited once per tick. Not at every first empty poll, which a
            // ping-pong of calls reaches once per call (and a probed session is timed for good):
            // only at every `TIMER_CHECK_IDLE`-th time the loop goes idle (or every
            // `TIMER_CHECK_IDLE` empty polls of a long idle stretch, or every `TIMER_CHECK_BUSY`
            // busy iterations), which is still many times per `TIMER_TICK`.
            let check = if idle_now {
                // Goes idle as a first empty poll would (below).
                went_idle = went_idle.wrapping_add(1);
                went_idle % TIMER_CHECK_IDLE == 0
                    && (!self.timers.is_empty() || sweeps && self.shared.sessions.load(Ordering::Relaxed) > 0)
            } else if n > 0 {
                iterations % TIMER_CHECK_BUSY == 0
                    && (!self.timers.is_empty() || sweeps && self.shared.sessions.load(Ordering::Relaxed) > 0)
            } else if idle.empty_polls() % TIMER_CHECK_IDLE != 0
                || self.timers.is_empty() && !(sweeps && self.shared.sessions.load(Ordering::Relaxed) > 0)
            {
                false
            } else if idle.empty_polls() == 0 {
                went_idle = went_idle.wrapping_add(1);
                went_idle % TIMER_CHECK_IDLE == 0
            } else {
                true
            };
            if check {
                let now = Instant::now();
                if !self.timers.is_empty() {
                    self.run_timers(now);
                }
                if let Some(every) = sweep_every.filter(|_| now >= next_sweep) {
                    next_sweep = now + every;
                    self.sweep_idle(now);
                }
                if let (Some(every), Some(idle)) =
                    (area_every.filter(|_| now >= next_area_sweep), self.limits.send_area_idle)
                {
                    next_area_sweep = now + every;
                    self.sweep_areas(now, idle);
                }
                if let (Some(every), Some(idle)) =
                    (ring_every.filter(|_| now >= next_ring_sweep), self.limits.ring_idle)
                {
                    next_ring_sweep = now + every;
                    self.sweep_rings(now, idle);
                }
                if let (Some(every), Some(idle)) =
                    (credit_every.filter(|_| now >= next_credit_sweep), self.limits.credit_idle)
                {
                    next_credit_sweep = now + every;
                    self.sweep_credits(now, idle);
                }
            }
            if n > 0 || ran > 0 {
                idle.reset();
                busy_unpublished += 1;
                if busy_unpublished >= PUBLISH_BUSY {
                    busy_unpublished = 0;
                    self.publish_counters();
                    // A loop that never goes idle (an async handler's task that wakes itself at
                    // every poll) still stops once `drain_timeout` has passed.
                    if self.shared.draining.load(Ordering::Acquire)
                        && Instant::now()
                            >= *drain_deadline
                                .get_or_insert_with(|| Instant::now() + self.limits.drain_timeout)
                    {
                        break;
                    }
                }
                if !idle_now {
                    continue;
                }
            }
            if self.shared.draining.load(Ordering::Acquire) {
                let deadline =
                    *drain_deadline.get_or_insert_with(|| Instant::now() + self.limits.drain_timeout);
                if self.drained() || Instant::now() >= deadline {
                    break;
                }
            }
            if idle.empty_polls() % PUBLISH_IDLE == PUBLISH_IDLE / 2 {
                busy_unpublished = 0;
                self.publish_counters();
            }
            if self.local.has_ready() {
                // Woken since the look above (by a pump, a timer, another thread): not idle.
                continue;
            }
            let cq = &self.shared.cq;
            idle.idle(
                || cq.req_notify(false).ok().map(|()| cq.maybe_ready()),
                || {
                    let _ = cq.wait(Some(EVENT_WAIT));
                },
            );
        }
        self.close_all();
        // Their calls are answered or their sessions closed: the futures go, answering nothing.
        self.local.clear();
        self.publish_counters();
    }

    /// Makes the counters readable from other threads.
    fn publish_counters(&mut self) {
        self.counters.async_tasks = self.local.spawned();
        self.counters.send_pool_bytes = self.send.registered_bytes();
        self.counters.send_bufs_in_use = self.send.in_use() as u64;
        self.counters.send_pool_waits = self.send.waits();
        self.shared.counters.publish(&self.counters);
    }

    /// Feeds `now` to the sessions whose timer is due (unanswered calls' deadlines and bound,
    /// the idle probe), acts on what expired, and sets each one's timer again at its next
    /// deadline ([`Worker::arm`]): a session the session layer no longer watches
    /// ([`crate::session::Session::watches_peer`]: no unanswered call, and a client that does
    /// not answer probes while idle) is left without one until a call comes. The sessions whose
    /// timer is not due cost nothing.
    #[inline(never)]
    fn run_timers(&mut self, now: Instant) {
        while let Some(idx) = self.timers.next_due(now) {
            let Some(entry) = self.entries[idx as usize].as_mut() else { continue };
            let session = &mut entry.conn.session;
            let waiting = session.watches_peer();
            if waiting && session.poll_timeout(waiting).is_some_and(|t| t <= now) {
                session.handle_timeout(now, waiting);
                if session.has_control() {
                    self.mark_dirty(idx);
                }
                self.handle_events(idx);
            }
            self.arm(idx);
        }
        self.flush_dirty();
    }

    /// Sets session `idx`'s timer at its next deadline
    /// ([`crate::session::Session::poll_timeout`]), or clears it when the session layer does not
    /// watch the peer or has no deadline (or the session is gone).
    fn arm(&mut self, idx: u16) {
        let at = self.entries[idx as usize].as_ref().and_then(|e| {
            let s = &e.conn.session;
            s.watches_peer().then(|| s.poll_timeout(true)).flatten()
        });
        match at {
            Some(at) => self.timers.set(idx, at),
            None => self.timers.cancel(idx),
        }
    }

    /// Closes the sessions that have had no call for `idle_timeout` ([`crate::session::Session::handle_idle`]):
    /// a Close goes to the client (a clean close: a `Client` reconnects on its next call), and
    /// the session is freed at the next sweep (its Close has left by then). Sessions with
    /// answers still waiting or deferred calls are not idle.
    #[inline(never)]
    fn sweep_idle(&mut self, now: Instant) {
        for idx in 0..self.entries.len() as u16 {
            let tag = self.tag(idx);
            let Some(entry) = self.entries[idx as usize].as_mut() else { continue };
            if entry.closing {
                self.close_entry(idx, "idle for ServerConfig::idle_timeout", false, true);
                continue;
            }
            if !entry.backlog.is_empty() || !entry.deferred.is_empty() || entry.binding.is_some() {
                continue;
            }
            let Some(idle) = entry.conn.session.handle_idle(now) else { continue };
            tracing::debug!(
                worker = self.shared.index,
                session = entry.session,
                idle_ms = idle.as_millis() as u64,
                "closing an idle session (ServerConfig::idle_timeout)"
            );
            entry.closing = true;
            entry.counted = Some(|c| c.idle_closed += 1);
            let why = format!(
                "idle: no call for {} ms (ServerConfig::idle_timeout); a new call reconnects",
                idle.as_millis()
            );
            if !entry.conn.send_close_why(&mut self.send, tag, Code::Unavailable, &why) {
                self.close_entry(idx, "idle for ServerConfig::idle_timeout", false, true);
            }
        }
    }

    /// Gives back the send mirrors and staging areas that sat unused for `idle`
    /// (`ServerConfig::send_area_idle`): no ring body placed for that long, every WRITE from them
    /// retired by a polled completion, nothing waiting in the session's backlog
    /// ([`Conn::release_idle_areas`]). Sessions without them cost one branch each.
    #[inline(never)]
    fn sweep_areas(&mut self, now: Instant, idle: Duration) {
        for entry in self.entries.iter_mut().flatten() {
            if entry.closing || !entry.conn.areas.is_live() {
                continue;
            }
            if entry.conn.release_idle_areas(now, idle, entry.backlog.is_empty()) {
                tracing::debug!(
                    worker = self.shared.index,
                    session = entry.session,
                    bytes = entry.conn.areas.bytes(),
                    "send mirror and staging area given back (ServerConfig::send_area_idle)"
                );
            }
        }
    }

    /// A raise of session `idx` was refused for lack of posted receive WQEs: posts what it
    /// lacked and tries it again (its CreditGrant then goes with this flush).
    #[cold]
    #[inline(never)]
    fn grow_and_raise(&mut self, idx: u16) {
        let Some(entry) = self.entries[idx as usize].as_ref() else { return };
        let short = entry.conn.session.raise_short();
        let posted = self.grow_srq_room(short);
        if let Some(entry) = self.entries[idx as usize].as_mut() {
            entry.conn.session.retry_raise(posted);
        }
    }

    /// Posts receive buffers so that the SRQ holds `more` WQEs beyond what its sessions reserve
    /// (a raise or a ring grant found no room; the listener posts only what the sessions reserve
    /// and one session's growth as it admits them), up to `ServerConfig::srq_depth`. Returns
    /// whether any were posted. Registration happens here, on the worker, as for a ring grant:
    /// rare next to calls (a chunk of 64 at a time, never taken back).
    #[cold]
    #[inline(never)]
    fn grow_srq_room(&mut self, more: u32) -> bool {
        let room = &self.shared.srq_room;
        let target = room.reserved().saturating_add(more).max(room.posted().saturating_add(1));
        let buf_size = HEADER_LEN + self.limits.body_cap;
        let chunks = match self.shared.grow_srq(target, self.limits.srq_depth, buf_size) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(worker = self.shared.index, error = %e, "growing the SRQ failed");
                return false;
            }
        };
        let mut posted = false;
        for chunk in chunks {
            let bufs = chunk.bufs();
            match self.recv.add_chunk(chunk) {
                Ok(()) => {
                    self.shared.srq_room.add_posted(bufs);
                    posted = true;
                }
                Err(e) => {
                    tracing::error!(worker = self.shared.index, error = %e, "posting new receive buffers failed")
                }
            }
        }
        posted
    }

    /// Answers a session's RingAsk (protocol 12; the session checked it may ask): registers a
    /// ring of `ServerConfig::ring_bytes` (whatever length was asked) behind a type-2 window
    /// bound to the session's QP (the bind WR is posted before the grant's SEND, so it is in
    /// effect when the client can use the rkey), or the MR's rkey where the device has no
    /// windows (`Counters::window_fallbacks`), charged to `ServerConfig::max_ring_pool_bytes`
    /// first. Refused (RESOURCE_EXHAUSTED naming the cap or what failed) when over the cap or
    /// the registration fails; the session goes on either way. The answer goes with the
    /// session's next controls.
    #[cold]
    #[inline(never)]
    fn on_ring_ask(&mut self, idx: u16) {
        let tag = self.tag(idx);
        let len = self.limits.ring_len;
        let memory = self.shared.memory.clone();
        let Some(entry) = self.entries[idx as usize].as_mut() else { return };
        if !entry.conn.session.own_ring_asked() {
            return;
        }
        // The pieces its bodies may take need receive WQEs of the SRQ first (posted now when
        // the SRQ has none to spare and may grow).
        let mut reserved = entry.conn.session.reserve_ring_pieces();
        if !reserved && self.grow_srq_room(crate::session::MAX_PIECES_IN_RING) {
            let Some(e) = self.entries[idx as usize].as_mut() else { return };
            reserved = e.conn.session.reserve_ring_pieces();
        }
        let Some(entry) = self.entries[idx as usize].as_mut() else { return };
        if !reserved {
            memory.rings.failed();
            let s = Status::resource_exhausted(format!(
                "no receive ring for this session: the worker's SRQ has no room for its pieces \
                 ({} WQEs reserved of {} posted; ServerConfig::srq_depth)",
                self.shared.srq_room.reserved(),
                self.shared.srq_room.posted()
            ));
            entry.conn.session.ring_answer(Err(s));
            self.mark_dirty(idx);
            return;
        }
        let made = memory
            .rings
            .charge(u64::from(len))
            .map_err(|reason| {
                Status::resource_exhausted(format!("no receive ring for this session: {reason}"))
            })
            .and_then(|charge| {
                let verbs = |what: &str, e: crate::verbs::VerbsError| {
                    Status::resource_exhausted(format!("{what} a receive ring of {len} bytes: {e}"))
                };
                let ring = if self.limits.mw_type2 {
                    RecvRing::with_window(&self.shared.pd, len as usize)
                } else {
                    RecvRing::new(&self.shared.pd, len as usize)
                }
                .map_err(|e| verbs("registering", e))?;
                let Conn { sq, qp, .. } = &mut entry.conn;
                sq.bind_window(qp, &ring, tag).map_err(|e| verbs("binding the window of", e))?;
                Ok((ring, charge))
            });
        let answer = match made {
            Ok((ring, charge)) => {
                if !ring.has_window() {
                    self.counters.window_fallbacks += 1;
                }
                let (addr, len, rkey) = ring.remote();
                memory.rings.created(u64::from(len));
                entry.conn.ring = Some(ring);
                entry.ring_charge = charge;
                Ok(crate::wire::ring_lease::RingGrant { addr, len, rkey })
            }
            Err(s) => {
                memory.rings.failed();
                entry.conn.session.release_ring_pieces();
                tracing::debug!(worker = self.shared.index, session = entry.session, status = %s, "ring ask refused");
                Err(s)
            }
        };
        entry.conn.session.ring_answer(answer);
        self.mark_dirty(idx);
    }

    /// Drops a session's receive ring once no peer may write it: after its RingRelease
    /// (`revoked` false) or when none came in time (`revoked`: the window is deallocated with
    /// the ring, so a later WRITE of the client's fails with a remote access error and breaks
    /// its own session). Gives its bytes back to `ServerConfig::max_ring_pool_bytes`. Nothing
    /// happens unless the session says the ring may go.
    #[cold]
    #[inline(never)]
    fn drop_ring(&mut self, idx: u16, revoked: bool) {
        let Some(entry) = self.entries[idx as usize].as_mut() else { return };
        if !entry.conn.session.own_ring_droppable() {
            return;
        }
        let Some(ring) = entry.conn.ring.take() else { return };
        entry.conn.session.release_ring_pieces();
        let gauge = &self.shared.memory.rings;
        gauge.gone(ring.len() as u64, true);
        if revoked {
            gauge.revoked();
        }
        entry.ring_charge = None;
        tracing::debug!(
            worker = self.shared.index,
            session = entry.session,
            revoked,
            "receive ring taken back (ServerConfig::ring_idle)"
        );
        drop(ring);
    }

    /// Takes back the receive rings granted and not written for `idle` (`ServerConfig::ring_idle`,
    /// [`crate::session::Session::sweep_own_ring`]): a RingReclaim goes, and a ring whose
    /// RingRelease did not come within `idle` more is dropped anyway. Sessions without a ring
    /// cost one branch each.
    #[inline(never)]
    fn sweep_rings(&mut self, now: Instant, idle: Duration) {
        for idx in 0..self.entries.len() as u16 {
            let Some(entry) = self.entries[idx as usize].as_mut() else { continue };
            if entry.closing || entry.conn.ring.is_none() {
                continue;
            }
            match entry.conn.session.sweep_own_ring(now, idle) {
                crate::session::OwnSweep::Keep => {}
                crate::session::OwnSweep::Reclaim => self.mark_dirty(idx),
                crate::session::OwnSweep::Revoke => self.drop_ring(idx, true),
            }
        }
        self.flush_dirty();
    }

    /// Lowers the sessions raised above their initial credits that had no call for `idle`
    /// (`ServerConfig::credit_idle`, [`crate::session::Session::sweep_credits`]): a CreditGrant
    /// goes; the reservation is given back when its CreditAck comes.
    #[inline(never)]
    fn sweep_credits(&mut self, now: Instant, idle: Duration) {
        for idx in 0..self.entries.len() as u16 {
            let Some(entry) = self.entries[idx as usize].as_mut() else { continue };
            if !entry.closing && entry.conn.session.sweep_credits(now, idle) {
                self.mark_dirty(idx);
            }
        }
        self.flush_dirty();
    }

    /// Acts on the session's events: cancelled and expired calls are answered now (their
    /// deferred `Responder` is told), a silent peer's session closes.
    fn handle_events(&mut self, idx: u16) {
        loop {
            let Some(entry) = self.entries[idx as usize].as_mut() else { return };
            let Some(event) = entry.conn.session.poll_event() else { return };
            match event {
                Event::Cancelled { .. } => self.counters.cancels += 1,
                Event::PeerDead { silent } => {
                    self.counters.peers_lost += 1;
                    let reason = format!(
                        "no message from the client for {} ms while its calls were unanswered or \
                         it was probed while idle (ServerConfig::peer_timeout)",
                        silent.as_millis()
                    );
                    self.close_entry(idx, &reason, false, true);
                    return;
                }
                Event::ReassemblyExpired { waited } => {
                    let reason = format!(
                        "a body arriving in pieces did not finish within {} ms \
                         (ServerConfig::reassembly_timeout)",
                        waited.as_millis()
                    );
                    self.close_telling(idx, Code::ResourceExhausted, &reason, |c| {
                        c.reassembly_timeouts += 1;
                        c.malformed += 1;
                    });
                    return;
                }
                Event::Refused { .. } => self.counters.reassembly_refused += 1,
                Event::Expired { .. } | Event::Overran { .. } | Event::Unacknowledged { .. } => {}
            }
            // What the event means for its call (CANCELLED, DEADLINE_EXCEEDED) is the session's.
            let Some((header, status)) = event.answer() else { continue };
            if let Some(i) =
                entry.deferred.iter().position(|d| (d.0, d.1) == (header.slot, header.generation))
            {
                let flag = entry.deferred.swap_remove(i).2;
                // A deferred call or a stream that ends without its answer: its record ends now.
                if let Some(o) = flag.take_observed() {
                    o.finish(status.code(), 0);
                }
                flag.raise();
            }
            entry.backlog.push(Waiting::Error(header, status));
            self.try_backlog(idx);
        }
    }

    /// Moves the messages of server streams from their sinks into the backlog while the client's
    /// stream grants allow (one grant per SEND: a batch the producer framed, or one message),
    /// and answers each stream whose handler ended
    /// it once its last message is queued; returns the grants of the client's messages its
    /// reader took; forgets streams the session ended (cancelled, expired, answered, closed),
    /// waking their producers and readers.
    #[inline(never)]
    fn pump_streams(&mut self) {
        let mut k = 0;
        while k < self.streaming.len() {
            let idx = self.streaming[k];
            let Some(entry) =
                self.entries[idx as usize].as_mut().filter(|e| !e.streams.is_empty() && !e.closing)
            else {
                // Closed or closing, or its streams all ended.
                self.streaming.swap_remove(k);
                continue;
            };
            k += 1;
            let mut moved = false;
            // A stream message that would take the server over `max_backlog_bytes`.
            let mut over = None;
            let mut i = 0;
            while i < entry.streams.len() && over.is_none() {
                let st = &entry.streams[i];
                let (slot, generation) = (st.slot, st.generation);
                if entry.conn.session.live_call(slot, generation).is_none() {
                    // Answered already: by the session's events (CANCELLED, DEADLINE_EXCEEDED), or
                    // by the handler of a client stream.
                    if let Some(sink) = &st.sink {
                        sink.cancel();
                    }
                    if let Some(source) = &st.source {
                        source.cancel();
                    }
                    entry.streams.swap_remove(i);
                    continue;
                }
                if let Some(source) = &st.source {
                    let taken = source.taken.swap(0, Ordering::AcqRel);
                    for _ in 0..taken {
                        entry.conn.session.stream_consumed(slot, generation);
                    }
                    if taken > 0 && entry.conn.session.has_control() {
                        moved = true;
                    }
                }
                if st.sink.is_none() {
                    i += 1;
                    continue;
                }
                let Entry { conn, backlog, streams, .. } = &mut *entry;
                let OpenStream { sink: Some(sink), seen_open, method, .. } = &mut streams[i] else {
                    continue;
                };
                let mut took = false;
                while conn.session.stream_send_grants(slot, generation).unwrap_or(0) > 0 {
                    // Sealed batches first; the open one only when the producer paused.
                    let open_now = sink.open_count();
                    let Some(Sealed { body, count }) = sink.pop(open_now == *seen_open) else {
                        *seen_open = open_now;
                        break;
                    };
                    took = true;
                    // The stream's headers go in front of its next message that has room for
                    // them (a batch stays within one eager body), else with its end.
                    let room = if count == 0 { usize::MAX } else { conn.body_cap.saturating_sub(body.len()) };
                    let (body, metadata) = match sink.cancelled.take_headers(room) {
                        None => (body, false),
                        Some(headers) => {
                            let mut b = Vec::with_capacity(headers.encoded_len() + body.len());
                            headers.encode_into(&mut b);
                            b.extend_from_slice(&body);
                            sink.recycle(body);
                            (b, true)
                        }
                    };
                    if count == 0 {
                        if let Err(status) = conn.session.check_len(body.len()) {
                            // Never sendable: the stream ends with RESOURCE_EXHAUSTED naming the limit.
                            sink.fail(status);
                            break;
                        }
                    }
                    let _ = conn.session.stream_send(slot, generation);
                    // The producer's next batch goes into a spare body buffer of the session (this
                    // body goes back to the spare ones once copied out): nothing is allocated.
                    if let Some(b) = conn.spare.take(0) {
                        sink.recycle(b);
                    }
                    let single = Header {
                        slot,
                        generation,
                        method: *method,
                        metadata,
                        ..Header::new(Kind::StreamMsg)
                    };
                    let h = if count == 0 {
                        single
                    } else {
                        Header { stream: crate::wire::STREAM_BATCH, count, ..single }
                    };
                    // Charged while it waits on the heap, as answers are.
                    let mut waiting = spill(h, Ok(body));
                    if let Err(reason) = charge(&conn.session, &mut waiting) {
                        over = Some(reason);
                        break;
                    }
                    backlog.push(waiting);
                    moved = true;
                }
                if over.is_some() {
                    break;
                }
                if took {
                    sink.wake_if_low();
                }
                let st = &entry.streams[i];
                let Some(sink) = &st.sink else { continue };
                if let Some(end) = sink.take_end() {
                    let h = Header { slot, generation, method: st.method, ..Header::new(Kind::Response) };
                    if let Some(o) = sink.cancelled.take_observed() {
                        o.finish(end.as_ref().err().map_or(Code::Ok, Status::code), sink.sent_bytes());
                    }
                    let md = sink.cancelled.take_response().filter(|md| !md.is_empty());
                    let end = match (end, md) {
                        (Ok(()), None) => spill(h, Ok(Vec::new())),
                        (Ok(()), Some(md)) => spill(
                            Header { metadata: true, ..h },
                            Ok(crate::metadata::ResponseMetadata::encode_blocks(Some(&md), None)),
                        ),
                        (Err(s), md) => {
                            spill(h, Err::<Vec<u8>, _>(crate::dispatch::reply::with_response(s, md)))
                        }
                    };
                    entry.backlog.push(end);
                    if let Some(d) = entry.deferred.iter().position(|d| (d.0, d.1) == (slot, generation)) {
                        entry.deferred.swap_remove(d);
                    }
                    if let Some(source) = &st.source {
                        // The answer ends the stream: the client's messages still coming are dropped.
                        source.cancel();
                    }
                    entry.streams.swap_remove(i);
                    moved = true;
                    continue;
                }
                i += 1;
            }
            if let Some(reason) = over {
                self.close_over_backlog(idx, &reason);
                continue;
            }
            if moved {
                self.try_backlog(idx);
                self.mark_dirty(idx);
            }
        }
        self.flush_dirty();
    }

    /// A message of the client's stream arrived: it goes to the stream's reader (copied out of
    /// its receive buffer, which goes back at once). A message of a stream with no reader (its
    /// handler answered, took no request stream, or dropped it) is dropped and its grant
    /// returned.
    fn on_stream_msg(&mut self, idx: u16, body: Received, h: Header) {
        let Worker { entries, recv, counters, .. } = self;
        let Some(entry) = entries[idx as usize].as_mut() else {
            if let Received::Eager(b) = body {
                recv.repost(b);
            }
            return;
        };
        counters.bytes_in += u64::from(h.body_len);
        // A body that came through the ring freed its space: tell the client (a RingReturn when
        // due), else a sender of more than the ring holds waits for its idle probe.
        let freed = entry.conn.session.ring_freed();
        let open = entry.conn.session.stream_receive_window(h.slot, h.generation).is_some();
        let reader = entry
            .streams
            .iter()
            .find(|s| (s.slot, s.generation) == (h.slot, h.generation))
            .and_then(|s| s.source.as_ref());
        let bytes = match body {
            Received::Eager(b) => {
                // Into a body the reader gave back: no allocation per SEND once the stream runs.
                let bytes = recv.bytes(&b).get(HEADER_LEN..).unwrap_or(&[]);
                let v = reader.map_or_else(Vec::new, |r| r.copy_in(bytes));
                recv.repost(b);
                v
            }
            Received::Owned(v) => v,
        };
        match reader {
            Some(source) if open && !source.dropped.load(Ordering::Acquire) => {
                let count = if h.stream & crate::wire::STREAM_BATCH != 0 { h.count } else { 0 };
                if source.queue.push((bytes, count)).is_err() {
                    // The session admits at most the stream's grants, fewer than the queue holds.
                    self.close_telling(
                        idx,
                        Code::Internal,
                        "protocol violation: stream messages beyond the queue",
                        |c| c.malformed += 1,
                    );
                    return;
                }
                if source.dropped.load(Ordering::Acquire) {
                    // The reader went meanwhile: what it did not drain goes here.
                    source.drop_queued();
                }
                source.wake();
                if freed {
                    self.mark_dirty(idx);
                }
            }
            _ => {
                if open {
                    entry.conn.session.stream_consumed(h.slot, h.generation);
                }
                self.mark_dirty(idx);
            }
        }
    }

    /// The client ended its messages on a stream: its reader sees the end after the last one.
    fn on_stream_end(&mut self, idx: u16, h: Header) {
        let Some(entry) = self.entries[idx as usize].as_mut() else { return };
        if let Some(source) = entry
            .streams
            .iter()
            .find(|s| (s.slot, s.generation) == (h.slot, h.generation))
            .and_then(|s| s.source.as_ref())
        {
            source.ended.store(true, Ordering::Release);
            source.wake();
        }
    }

    fn drained(&self) -> bool {
        self.entries.iter().flatten().all(|s| s.conn.session.unanswered() == 0 && s.backlog.is_empty())
            && self.shared.defer.is_empty()
    }

    #[inline(never)]
    fn drain_control(&mut self) {
        while let Some(c) = self.shared.control.pop() {
            match c {
                Control::Open(nc) => self.open(*nc),
                Control::Close(session) => {
                    if let Some(&idx) = self.by_session.get(&session) {
                        self.close_entry(idx, "peer closed the connection", false, false);
                    }
                }
            }
        }
    }

    fn open(&mut self, mut nc: NewConn<P>) {
        // The SRQ grows with what the admitted sessions reserve (whatever becomes of this one).
        for chunk in std::mem::take(&mut nc.recv_chunks) {
            let bufs = chunk.bufs();
            match self.recv.add_chunk(chunk) {
                Ok(()) => self.shared.srq_room.add_posted(bufs),
                Err(e) => {
                    tracing::error!(worker = self.shared.index, error = %e, "posting new receive buffers failed")
                }
            }
        }
        // No scan: with thousands of sessions a scan per open (and per close) held the worker
        // for 100 ms at a time, and the listener took it for stuck.
        let Some(idx) = self.free_entries.pop().map(usize::from) else {
            tracing::warn!(
                worker = self.shared.index,
                session = nc.session,
                "no free session entry; closing"
            );
            nc.bound.store(BIND_FAILED, Ordering::Release);
            let _ = self.shared.closed.push(nc.session);
            self.shared.wake_listener();
            // Its SRQ reservation goes with its session.
            self.shared.sessions.fetch_sub(1, Ordering::Relaxed);
            self.shared.memory.registered.release(nc.registered);
            return;
        };
        self.gens[idx] = self.gens[idx].wrapping_add(1);
        self.by_qpn.insert(nc.conn.qp.qp_num(), idx as u16);
        self.by_session.insert(nc.session, idx as u16);
        // A server's session has no ring at connect (protocol 12: granted on demand).
        let ring = nc.conn.ring.is_some();
        let window = nc.conn.ring.as_ref().is_some_and(|r| r.has_window());
        self.entries[idx] = Some(Entry {
            conn: nc.conn,
            session: nc.session,
            peer: nc.peer,
            dirty: false,
            backlog: Outbox::default(),
            binding: None,
            closing: false,
            counted: None,
            deferred: DeferredCalls::default(),
            streams: Streams::default(),
            registered: nc.registered,
            ring_charge: None,
            kept_metadata: None,
            starved: false,
        });
        if let Some(s) = self.entries[idx].as_mut() {
            let now = Instant::now();
            s.conn.session.set_peer_timeout(self.limits.peer_timeout, now);
            s.conn.session.set_call_limit(self.limits.max_call_duration, now);
            s.conn.session.set_idle_timeout(self.limits.idle_timeout);
        }
        // A client that answers probes while idle is watched from the start.
        self.arm(idx as u16);
        let tag = self.tag(idx as u16);
        let Some(entry) = self.entries[idx].as_mut() else { return };
        if !window {
            if ring {
                self.counters.window_fallbacks += 1;
            }
            nc.bound.store(BIND_DONE, Ordering::Release);
            self.shared.wake_listener();
        } else if let Conn { sq, qp, ring: Some(ring), .. } = &mut entry.conn {
            match sq.bind_window(qp, ring, tag) {
                Ok(()) => entry.binding = Some(nc.bound),
                Err(e) => {
                    tracing::warn!(worker = self.shared.index, session = nc.session, error = %e, "binding the ring's window failed");
                    nc.bound.store(BIND_FAILED, Ordering::Release);
                    self.shared.wake_listener();
                    self.close_entry(idx as u16, "binding the ring's window failed", false, true);
                    return;
                }
            }
        }
        self.counters.sessions_opened += 1;
    }

    /// Closes a session: QP to ERR and destroyed, memory freed; `notify` tells the listener to
    /// close its TCP connection (the client then sees the session gone).
    fn close_entry(&mut self, idx: u16, reason: &str, malformed: bool, notify: bool) {
        let Some(entry) = self.entries.get_mut(idx as usize).and_then(Option::take) else { return };
        self.free_entries.push(idx);
        self.by_session.remove(&entry.session);
        // O(1): a mass disconnect of thousands of sessions does not hold the worker.
        self.timers.cancel(idx);
        if let Some(b) = &entry.binding {
            b.store(BIND_FAILED, Ordering::Release);
            self.shared.wake_listener();
        }
        let span = tracing::info_span!("disconnect", worker = self.shared.index, session = entry.session);
        let _entered = span.enter();
        self.by_qpn.remove(&entry.conn.qp.qp_num());
        self.gens[idx as usize] = self.gens[idx as usize].wrapping_add(1);
        let _ = entry.conn.qp.modify(&QpAttr::new(QpState::Err));
        if let Some(count) = entry.counted {
            count(&mut self.counters);
        }
        if malformed {
            self.counters.malformed += 1;
            tracing::warn!(worker = self.shared.index, session = entry.session, peer = %entry.peer, reason, "closing session");
        } else {
            tracing::debug!(worker = self.shared.index, session = entry.session, peer = %entry.peer, reason, "session closed");
        }
        if notify {
            let _ = self.shared.closed.push(entry.session);
            self.shared.wake_listener();
        }
        self.counters.sessions_closed += 1;
        // Its SRQ reservation goes with its session (dropped below).
        self.shared.sessions.fetch_sub(1, Ordering::Relaxed);
        let registered = entry.registered;
        if let Some(ring) = &entry.conn.ring {
            // Its granted ring goes with it (window first, then the QP: `Conn`'s drop order).
            self.shared.memory.rings.gone(ring.len() as u64, false);
        }
        // Its QP is destroyed first (its WRs discarded), then the send buffers its posted WRs
        // still read go back to the worker's pool; the rest of the session goes with it.
        let Entry { conn, .. } = entry;
        conn.close(&mut self.send);
        self.shared.memory.registered.release(registered);
    }

    /// Shutdown: tell every peer (Close), give the sends a moment to complete, free everything.
    fn close_all(&mut self) {
        let mut sent = false;
        for idx in 0..self.entries.len() {
            let tag = self.tag(idx as u16);
            if let Some(entry) = self.entries[idx].as_mut() {
                entry.conn.send_close_why(
                    &mut self.send,
                    tag,
                    Code::Unavailable,
                    "the server is shutting down",
                );
                sent = true;
            }
        }
        // No session, no Close to wait for.
        let until = Instant::now() + if sent { Duration::from_millis(20) } else { Duration::ZERO };
        while Instant::now() < until {
            match self.wcs.poll(&self.shared.cq) {
                Ok(0) => std::thread::yield_now(),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        self.shared.defer.closed.store(true, Ordering::Release);
        for idx in 0..self.entries.len() as u16 {
            self.close_entry(idx, "server shutdown", false, false);
        }
    }

    #[inline(never)]
    fn drain_deferred(&mut self) {
        while let Some(d) = self.shared.defer.queue.pop() {
            self.deliver_deferred(d);
        }
        for d in self.shared.defer.take_overflow() {
            self.deliver_deferred(d);
        }
    }

    fn deliver_deferred(&mut self, d: crate::dispatch::reply::Deferred) {
        let Some((idx, entry)) = self.entry_by_tag(d.conn) else { return };
        if let Some(i) = entry.deferred.iter().position(|c| (c.0, c.1) == (d.slot, d.generation)) {
            entry.deferred.swap_remove(i);
        }
        let header = Header {
            slot: d.slot,
            generation: d.generation,
            method: d.method,
            metadata: d.metadata,
            ..Header::new(Kind::Response)
        };
        let mut waiting = spill(header, d.result);
        if let Err(reason) = charge(&entry.conn.session, &mut waiting) {
            self.close_over_backlog(idx, &reason);
            return;
        }
        entry.backlog.push(waiting);
        self.try_backlog(idx);
    }

    /// Closes a session whose waiting answers would take the server over `max_backlog_bytes`.
    #[cold]
    fn close_over_backlog(&mut self, idx: u16, reason: &str) {
        self.close_telling(idx, Code::ResourceExhausted, reason, |c| {
            c.over_backlog_cap += 1;
            c.malformed += 1;
        });
    }

    /// Closes a session telling its client why: a Close carrying `code` and `reason` is posted
    /// (the session's memory held for reassembly is given back at once) and the entry is freed
    /// once that Close's completion is polled (or at the next idle sweep); what the client sends
    /// meanwhile is dropped unread. With no send buffer free, or when posting fails, it closes
    /// at once (the client then learns only that the session is gone). `count` adds what the
    /// close counts when the session is freed.
    #[cold]
    #[inline(never)]
    fn close_telling(&mut self, idx: u16, code: Code, reason: &str, count: fn(&mut Counters)) {
        let tag = self.tag(idx);
        let Some(entry) = self.entries[idx as usize].as_mut() else { return };
        if entry.closing {
            return;
        }
        tracing::warn!(worker = self.shared.index, session = entry.session, peer = %entry.peer, reason, "closing session");
        entry.closing = true;
        entry.counted = Some(count);
        if !entry.conn.send_close_why(&mut self.send, tag, code, reason) {
            self.close_entry(idx, reason, false, true);
        }
    }

    fn mark_dirty(&mut self, idx: u16) {
        if let Some(s) = self.entries[idx as usize].as_mut() {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push(idx);
            }
        }
    }

    /// Sends spilled and deferred answers of one connection, in order, while send buffers and
    /// ring space allow (a body larger than what the ring has free goes in pieces); what may go
    /// and what is dropped is the session's rule ([`Outbox::front`]).
    fn try_backlog(&mut self, idx: u16) {
        let tag = self.tag(idx);
        // A closing session's Close went last: nothing follows it.
        let Some(entry) = self.entries[idx as usize].as_mut().filter(|e| !e.closing) else { return };
        let counters = &mut self.counters;
        let session = entry.session;
        let mut late = 0;
        let streams = &entry.streams;
        let sent = conn::send_waiting(
            &mut entry.conn,
            &mut self.send,
            &mut entry.backlog,
            tag,
            |h, status, len| {
                if h.kind == Kind::Response {
                    counters.rpcs += 1;
                    counters.status(status);
                    counters.bytes_out += u64::from(len);
                }
            },
            |h| {
                // A second answer to one call (a deferred responder after the handler answered
                // or panicked, or after the call was cancelled or expired).
                tracing::debug!(session, call_slot = h.slot, "answer to a call answered already dropped");
                late += 1;
            },
            |h, status| {
                // A stream message that can never be sent (its send mirror failed to register):
                // the stream ends with that status as a message it can never send ends it
                // (`pump_streams` queues the answer, ends the call's record, wakes its producer).
                let st = streams.iter().find(|st| (st.slot, st.generation) == (h.slot, h.generation));
                if let Some(sink) = st.and_then(|st| st.sink.as_ref()) {
                    sink.fail(status);
                }
            },
        );
        self.counters.late_answers += late;
        if sent {
            self.mark_dirty(idx);
        }
        self.note_starved(idx);
    }

    /// Notes session `idx` as waiting for a send buffer when the pool was found empty at its
    /// cap and the session has something to send (answers in its backlog, control messages
    /// due): [`Worker::retry_starved`] sends it on once completions free buffers. One load
    /// and a branch while the pool is not starved.
    #[inline]
    fn note_starved(&mut self, idx: u16) {
        if !self.send.starved() {
            return;
        }
        let Some(entry) = self.entries[idx as usize].as_mut() else { return };
        if !entry.starved && (!entry.backlog.is_empty() || entry.conn.wants_send()) {
            entry.starved = true;
            self.starved.push(idx);
        }
    }

    /// Sends on what waits for send buffers now that completions freed some: the sessions
    /// [`Worker::note_starved`] noted, oldest first, until the pool is empty again (the rest
    /// wait for the next completions). Runs only after the pool was found empty at its cap
    /// (`ServerConfig::max_send_pool_bytes`), never on the data path; visits the waiting
    /// sessions only, not every session.
    #[cold]
    #[inline(never)]
    fn retry_starved(&mut self) {
        self.send.take_starved();
        std::mem::swap(&mut self.starved, &mut self.retrying);
        for k in 0..self.retrying.len() {
            let idx = self.retrying[k];
            if self.send.starved() {
                // Empty again: the rest keep their place (still noted).
                let Worker { retrying, starved, .. } = self;
                starved.extend_from_slice(&retrying[k..]);
                break;
            }
            let Some(entry) = self.entries[idx as usize].as_mut() else { continue };
            entry.starved = false;
            let backlog = !entry.backlog.is_empty();
            let due = entry.conn.wants_send();
            if backlog {
                self.try_backlog(idx);
            }
            if due {
                self.mark_dirty(idx);
            }
        }
        self.retrying.clear();
    }

    fn flush_dirty(&mut self) {
        while let Some(idx) = self.dirty.pop() {
            let tag = self.tag(idx);
            let Some(mut entry) = self.entries[idx as usize].as_mut().filter(|e| !e.closing) else {
                continue;
            };
            if entry.conn.session.raise_short() != 0 {
                self.grow_and_raise(idx);
                let Some(e) = self.entries[idx as usize].as_mut() else { continue };
                entry = e;
            }
            entry.dirty = false;
            if entry.conn.session.take_ring_return() {
                entry.conn.queue_ring_return(&mut self.send);
            }
            entry.conn.queue_controls(&mut self.send);
            if let Err(e) = entry.conn.flush(&mut self.send, tag) {
                tracing::warn!(worker = self.shared.index, session = entry.session, error = %e, "posting sends failed");
                self.close_entry(idx, "posting sends failed", false, true);
                continue;
            }
            self.note_starved(idx);
        }
    }

    fn lookup_qpn(&mut self, qpn: u32) -> Option<u16> {
        // Messages come in runs of one session (a window of calls, a lone caller's next one):
        // the entry of the last one first. A live entry whose QP has this number is the one
        // `by_qpn` names (it maps exactly the live entries' QP numbers), so the hint can only
        // save the hash lookup, never name another session.
        let last = self.last_rx;
        if self
            .entries
            .get(usize::from(last))
            .and_then(Option::as_ref)
            .is_some_and(|e| e.conn.qp.qp_num() == qpn)
        {
            return Some(last);
        }
        if let Some(&i) = self.by_qpn.get(&qpn) {
            self.last_rx = i;
            return Some(i);
        }
        // The listener queues a connection before answering the handshake, so a message on a
        // QP not known yet means the control queue has it: take it now.
        self.drain_control();
        self.by_qpn.get(&qpn).copied()
    }

    fn on_completion(&mut self, c: Completion) {
        // The fields used below, not a copy of the whole WC (the completion moves on).
        let wc = {
            let w = c.wc();
            Wc {
                wr_id: w.wr_id,
                status: w.status,
                opcode: w.opcode,
                qp_num: w.qp_num,
                invalidated: w.invalidated_rkey.is_some(),
            }
        };
        if let Some(tag) = c.send_tag() {
            let idx = (tag >> 16) as u16;
            if self.gens.get(idx as usize).copied() != Some(tag as u16) {
                return;
            }
            let Some(entry) = self.entries[idx as usize].as_mut() else { return };
            if !wc.status.is_success() {
                let reason =
                    if wc.status == WcStatus::IBV_WC_WR_FLUSH_ERR { "QP flushed" } else { "send failed" };
                tracing::debug!(status = %wc.status, "send completion error");
                self.close_entry(idx, reason, false, true);
                return;
            }
            entry.conn.on_send_completion(&mut self.send, c);
            if entry.closing && entry.conn.sq.outstanding() == 0 {
                // Its Close (posted last) has left: free it now.
                self.close_entry(idx, "closed after its Close was sent", false, true);
                return;
            }
            let backlog = !entry.backlog.is_empty();
            if wc.opcode == WcOpcode::IBV_WC_BIND_MW {
                if let Some(b) = entry.binding.take() {
                    b.store(BIND_DONE, Ordering::Release);
                    self.shared.wake_listener();
                }
            }
            if backlog {
                self.try_backlog(idx);
            }
            return;
        }
        let Some(buf) = self.recv.take(c) else {
            tracing::debug!(wr_id = wc.wr_id, "receive completion for a buffer not posted");
            return;
        };
        if !wc.status.is_success() {
            self.recv.repost(buf);
            if let Some(&idx) = self.by_qpn.get(&wc.qp_num) {
                if wc.status != WcStatus::IBV_WC_WR_FLUSH_ERR {
                    tracing::debug!(status = %wc.status, "receive completion error");
                }
                self.close_entry(idx, "receive failed", false, true);
            }
            return;
        }
        let Some(idx) = self.lookup_qpn(wc.qp_num) else {
            self.recv.repost(buf);
            tracing::debug!(qp_num = wc.qp_num, "message on an unknown QP dropped");
            return;
        };
        self.on_message(idx, buf, wc.invalidated);
        // A request left unanswered (deferred, streaming, or still arriving in pieces) arms
        // the session's timer, and may have brought a deadline sooner than the timer set (its
        // own, or the duration bound's first look); so may a message that made an unwatched
        // session watched. The session is looked at the next tick, where its timer is set at
        // its next deadline (`run_timers`; not computed here, per message).
        if let Some(entry) = self.entries[idx as usize].as_ref() {
            let session = &entry.conn.session;
            let scheduled = self.timers.scheduled(idx);
            let next = self.timers.next_tick();
            if scheduled.is_none_or(|t| t > next)
                && (session.has_open_calls() || scheduled.is_none() && session.watches_peer())
            {
                self.timers.set_tick(idx, next);
            }
        }
    }

    fn on_message(&mut self, idx: u16, buf: RecvBuf, invalidated_key: bool) {
        let tag = self.tag(idx);
        let Some(entry) = self.entries[idx as usize].as_mut() else {
            self.recv.repost(buf);
            return;
        };
        if entry.closing {
            // Closed for being idle: nothing more of it is run.
            self.recv.repost(buf);
            return;
        }
        let overlong = !self.recv.fits(&buf);
        // Decoded in place (`Session::receive_into`): the header is not copied through results.
        let mut header = Header::new(Kind::Request);
        let ring = match entry.conn.session.receive_into(
            self.recv.bytes(&buf),
            overlong,
            invalidated_key,
            Instant::now,
            &mut header,
        ) {
            Ok(ring) => ring,
            Err(mut reason) => {
                self.recv.repost(buf);
                let share = entry.conn.session.reassembly_share().unwrap_or(0);
                let (code, count): (_, fn(&mut Counters)) = if crate::session::meter::is_violation(&reason) {
                    (Code::ResourceExhausted, |c| c.metered += 1)
                } else if crate::session::is_reassembly_cap(&reason) {
                    reason = format!("{reason} of {share} bytes");
                    (Code::ResourceExhausted, |c| {
                        c.over_reassembly_cap += 1;
                        c.malformed += 1;
                    })
                } else {
                    (Code::Internal, |c| c.malformed += 1)
                };
                self.close_telling(idx, code, &reason, count);
                return;
            }
        };
        // A ring body is copied out of the ring at once (the peer could rewrite it) and its ring
        // space freed; the request is dispatched when its last piece is in.
        let body = match ring {
            None => Received::Eager(buf),
            Some(piece) => {
                self.recv.repost(buf);
                let refused = piece.dropped();
                match entry.conn.take_piece(piece) {
                    Ok(Some(c)) => {
                        header = c.header;
                        Received::Owned(c.body)
                    }
                    Ok(None) => {
                        // The freed ring space travels back on the answer, or in a RingReturn
                        // (`Session::take_ring_return`). In the middle of a message in pieces (no
                        // answer comes yet, and the client's next pieces may wait for the space)
                        // one due goes now, before the answers waiting below copy their pieces:
                        // it would otherwise leave behind every WRITE queued before the end of
                        // the batch.
                        if entry.conn.session.take_ring_return() {
                            entry.conn.queue_ring_return(&mut self.send);
                            if entry.conn.flush(&mut self.send, tag).is_err() {
                                self.close_entry(idx, "posting sends failed", false, true);
                                return;
                            }
                        }
                        if !entry.backlog.is_empty() {
                            self.try_backlog(idx);
                        }
                        if refused {
                            // A body refused over the reassembly cap: its call's answer
                            // (`Event::Refused`, from its first piece) goes now, not at the
                            // session's next timer (on a probed session a probe interval away).
                            self.handle_events(idx);
                        }
                        self.mark_dirty(idx);
                        return;
                    }
                    Err(reason) => {
                        let reason = format!("protocol violation: {reason}");
                        self.close_telling(idx, Code::Internal, &reason, |c| c.malformed += 1);
                        return;
                    }
                }
            }
        };
        if !entry.backlog.is_empty() {
            self.try_backlog(idx);
        }
        if self.entries[idx as usize].is_none() {
            if let Received::Eager(b) = body {
                self.recv.repost(b);
            }
            return;
        }
        match header.kind {
            Kind::Request => {
                self.dispatch(idx, body, &header);
                // The client's credits may all be held now: a RingReturn may be due
                // (`Session::take_ring_return`).
                if self.entries[idx as usize].as_ref().is_some_and(|e| e.conn.session.ring_freed()) {
                    self.mark_dirty(idx);
                }
            }
            Kind::StreamMsg => self.on_stream_msg(idx, body, header),
            kind => {
                if let Received::Eager(b) = body {
                    self.recv.repost(b);
                }
                match kind {
                    Kind::Close => self.close_entry(idx, "peer sent Close", false, true),
                    Kind::Cancel => {
                        self.handle_events(idx);
                        // Its CancelAck is due.
                        self.mark_dirty(idx);
                    }
                    Kind::StreamEnd => self.on_stream_end(idx, header),
                    // A Pong became due.
                    Kind::Ping => self.mark_dirty(idx),
                    Kind::RingAsk => self.on_ring_ask(idx),
                    Kind::RingRelease => self.drop_ring(idx, false),
                    // The session may raise again at once (every credit taken): its grant goes.
                    Kind::CreditAck => self.mark_dirty(idx),
                    _ => {}
                }
                // A stream end or grant is a stream SEND: a RingReturn may be due for the
                // credits such SENDs hold (`Session::take_ring_return`).
                if matches!(kind, Kind::StreamEnd | Kind::StreamGrant)
                    && self.entries[idx as usize].as_ref().is_some_and(|e| e.conn.session.ring_freed())
                {
                    self.mark_dirty(idx);
                }
            }
        }
    }

    fn dispatch(&mut self, idx: u16, received: Received, h: &Header) {
        let tag = self.tag(idx);
        let draining = self.shared.draining.load(Ordering::Relaxed);
        let Worker {
            entries,
            registry,
            last_method,
            recv,
            counters,
            scratch,
            ctx,
            interceptor,
            plain_server,
            limits,
            spare_metadata,
            ended,
            send,
            wcs,
            ..
        } = self;
        let Some(entry) = entries[idx as usize].as_mut() else {
            if let Received::Eager(b) = received {
                recv.repost(b);
            }
            return;
        };
        counters.bytes_in += u64::from(h.body_len);
        if h.metadata_cache == crate::wire::METADATA_CACHED {
            counters.metadata_cached += 1;
        }
        let Some(live) = entry.conn.session.live_call(h.slot, h.generation) else {
            // Cancelled or expired while its body was arriving: answered already, never run.
            if let Received::Eager(b) = received {
                if h.metadata_cache == crate::wire::METADATA_STORE {
                    // Its block is kept all the same: the client names it from now on.
                    let body = Body::slice(recv.bytes(&b).get(HEADER_LEN..).unwrap_or(&[]));
                    let mut md = None;
                    let (_, refused) = split_metadata(body, limits.max_metadata, &mut md, &mut None);
                    entry.kept_metadata = Some(kept_block(md, refused));
                }
                recv.repost(b);
            }
            return;
        };
        let deadline = live.deadline;
        let found = registry.lookup_cached(last_method, h.method);
        // One context per worker, refilled per request (no reference count touched per call).
        ctx.info.method = found.map_or("", |f| f.1);
        ctx.info.peer = entry.peer;
        ctx.info.deadline = deadline;
        ctx.target = CallTarget { conn: tag, slot: h.slot, generation: h.generation, method: h.method };
        ctx.qp_num = entry.conn.qp.qp_num();
        ctx.cancel_seen.set(false);
        ctx.deferred.set(false);
        ctx.first_look.set(None);
        ctx.cancel_flag.set(None);
        ctx.source.set(None);
        ctx.stream_in.set(h.stream & crate::wire::STREAM_IN != 0);
        ctx.batch_cap.set(batch_cap(&entry.conn));
        if let Some(md) = ctx.info.metadata.take() {
            // Kept for the next block when no async handler holds it.
            if Arc::strong_count(&md) == 1 {
                *spare_metadata = Some(md);
            }
        }
        // Answers leave in order: while earlier ones wait for ring space, this one waits behind them.
        let send_buf = if entry.backlog.is_empty() { entry.conn.acquire(send) } else { None };
        // The plain call: no request metadata (sent or cached), no deadline, no stream, no
        // interceptor, not observed, the server not draining, a send buffer for its answer
        // (nothing waits before it) and a served method. Its handler runs at once, with none of
        // the checks and set-up those need; every other call takes the general path. Both answer
        // through the same tail below.
        let plain = *plain_server
            && deadline.is_none()
            && !draining
            && h.stream == 0
            && !h.metadata
            && h.metadata_cache == 0;
        // The answer went out at once (`Conn::send_now`): `Some(posted)`; what waits in the backlog.
        let (direct, spilled) = 'answer: {
            let (outcome, metadata, eager_buf, send_buf, source, sink) = match (received, send_buf, found) {
                (Received::Eager(b), Some(mut sb), Some((svc, name))) if plain => {
                    let body = Body::slice(recv.bytes(&b).get(HEADER_LEN..).unwrap_or(&[]));
                    let ctx = &*ctx;
                    let mut out = reply_writer(&mut entry.conn, send, Some(&mut sb), scratch, true, ctx);
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| svc.call(h.method, ctx, body, &mut out)))
                    {
                        handler_panicked(name, &*p, &mut out);
                    }
                    // Moved out, not replaced: the writer is gone with no drop of an `Outcome` left in it.
                    let ReplyWriter { outcome, metadata, .. } = out;
                    let (source, sink) = (ctx.source.take(), ctx.stream.take());
                    if let (Outcome::Eager(n), None, None) = (&outcome, &source, &sink) {
                        // The common answer: an eager body, no stream taken.
                        let n = *n;
                        // `Eager` owns nothing: forgotten, not dropped (no call of the
                        // out-of-line drop of `Outcome` per answer).
                        std::mem::forget(outcome);
                        recv.repost(b);
                        break 'answer (
                            answer_eager(&mut entry.conn, send, wcs, counters, sb, h, metadata, n, tag),
                            None,
                        );
                    }
                    (outcome, metadata, Some(b), Some(sb), source, sink)
                }
                (received, mut send_buf, found) => {
                    let (eager_buf, owned) = match received {
                        Received::Eager(b) => (Some(b), None),
                        Received::Owned(v) => (None, Some(v)),
                    };
                    let mut body = match (&eager_buf, owned) {
                        (Some(b), _) => Body::slice(recv.bytes(b).get(HEADER_LEN..).unwrap_or(&[])),
                        (None, Some(o)) => Body::owned(entry.conn.session.body_bytes(o)),
                        (None, None) => Body::slice(&[]),
                    };
                    // Request metadata: split off the body's front (refused calls answer before any handler).
                    let mut refused = None;
                    if h.metadata {
                        (body, refused) =
                            split_metadata(body, limits.max_metadata, &mut ctx.info.metadata, spare_metadata);
                        if h.metadata_cache == crate::wire::METADATA_STORE {
                            entry.kept_metadata =
                                Some(kept_block(ctx.info.metadata.clone(), refused.clone()));
                        }
                    } else if h.metadata_cache == crate::wire::METADATA_CACHED {
                        // The session checked that a block was stored before (the flag is a violation
                        // otherwise), so the last arm is unreachable.
                        match &entry.kept_metadata {
                            Some(Ok(md)) => ctx.info.metadata = Some(md.clone()),
                            Some(Err(s)) => refused = Some(s.clone()),
                            None => refused = Some(Status::internal("no cached metadata block")),
                        }
                    }
                    let body_len = body.len();
                    let ctx = &*ctx;
                    let backlog_empty = entry.backlog.is_empty();
                    let mut out =
                        reply_writer(&mut entry.conn, send, send_buf.as_mut(), scratch, backlog_empty, ctx);
                    // The handler ran (else an observed call refused before it is recorded here).
                    let mut ran = false;
                    if draining {
                        out.error(Status::unavailable("server is shutting down"));
                    } else if let Some(s) = refused {
                        out.error(s);
                    } else if deadline.is_some_and(|d| d <= Instant::now()) {
                        out.error(Status::deadline_exceeded(
                            "the call's deadline passed before it was dispatched",
                        ));
                    } else if let Some(s) = interceptor
                        .as_ref()
                        .filter(|_| found.is_some())
                        .and_then(|i| i.intercept(&ctx.info).err())
                    {
                        out.error(s);
                    } else {
                        match found {
                            None => out.error(Status::method_not_served(h.method)),
                            Some((svc, name)) => {
                                ran = true;
                                // The calls the handler makes inherit this call's deadline.
                                let _serving = crate::context::serving(deadline);
                                let r = if limits.observe.any() {
                                    let len = body.len();
                                    observed(limits.observe, ctx, name, len, || {
                                        catch_unwind(AssertUnwindSafe(|| {
                                            svc.call(h.method, ctx, body, &mut out)
                                        }))
                                    })
                                } else {
                                    catch_unwind(AssertUnwindSafe(|| svc.call(h.method, ctx, body, &mut out)))
                                };
                                if let Err(p) = r {
                                    handler_panicked(name, &*p, &mut out);
                                }
                            }
                        }
                    }
                    // Moved out, not replaced: the writer is gone with no drop of an `Outcome` left in it.
                    let ReplyWriter { outcome, metadata, .. } = out;
                    if limits.observe.any() {
                        match (&outcome, found) {
                            (Outcome::Error(s), Some((_, name))) if !ran => {
                                observe_refused(limits.observe, ctx, name, body_len, s.code())
                            }
                            _ => observe_end(ctx, &outcome, ended),
                        }
                    }
                    (outcome, metadata, eager_buf, send_buf, ctx.source.take(), ctx.stream.take())
                }
            };
            let ctx = &*ctx;
            if !matches!(outcome, Outcome::Deferred) {
                // Answered at once (a handler that took a stream and answered anyway, or panicked):
                // the answer ends the streams, nothing is read and nothing sent. The sink's producer
                // learns it at its next send (else it would wait forever for a worker that never
                // takes its messages), and the sink goes with this call, not with the next one.
                if let Some(src) = &source {
                    src.cancel();
                }
                if let Some(sink) = &sink {
                    sink.cancel();
                }
            }
            if let Some(b) = eager_buf {
                recv.repost(b);
            }
            // Built only where the answer waits or is queued: an eager answer sent at once is
            // encoded from the call's fields (`Conn::send_response_now`).
            let header = || Header {
                slot: h.slot,
                generation: h.generation,
                method: h.method,
                metadata,
                ..Header::new(Kind::Response)
            };
            let answered = |status: Code, len: u32, counters: &mut Counters| {
                counters.bytes_out += u64::from(len);
                counters.rpcs += 1;
                counters.status(status);
            };
            let mut direct = None;
            let spilled = match (outcome, send_buf) {
                (Outcome::Deferred, b) => {
                    // Set on the context after the answer was deferred: not the deferred answer's.
                    drop(ctx.response.take());
                    if let Some(b) = b {
                        entry.conn.give_back(send, b);
                    }
                    if let Some(flag) = ctx.cancel_flag.take() {
                        entry.deferred.push((h.slot, h.generation, flag));
                    }
                    if sink.is_some() || source.is_some() {
                        entry.streams.push(OpenStream {
                            slot: h.slot,
                            generation: h.generation,
                            method: h.method,
                            sink,
                            source,
                            seen_open: 0,
                        });
                        if !self.streaming.contains(&idx) {
                            self.streaming.push(idx);
                        }
                    }
                    None
                }
                (Outcome::Eager(n), Some(b)) => {
                    direct = answer_eager(&mut entry.conn, send, wcs, counters, b, h, metadata, n, tag);
                    None
                }
                (Outcome::Ring { offset, len }, Some(b)) => {
                    entry.conn.queue(send, b, header(), BodyAt::Ring { offset, len });
                    entry.conn.session.on_answer_for(h.slot, h.generation);
                    answered(Code::Ok, len, counters);
                    None
                }
                (Outcome::Error(s), Some(b)) => {
                    let status = entry.conn.queue_error(send, b, header(), &s);
                    entry.conn.session.on_answer_for(h.slot, h.generation);
                    answered(status, 0, counters);
                    None
                }
                (Outcome::Unset, Some(mut b)) => {
                    drop(ctx.response.take());
                    let body = entry.conn.copy_eager(send, &mut b, b"handler returned no answer");
                    entry.conn.queue(send, b, Header { status: Code::Internal, ..header() }, body);
                    entry.conn.session.on_answer_for(h.slot, h.generation);
                    answered(Code::Internal, 0, counters);
                    None
                }
                (Outcome::Staged { offset, len }, b) => {
                    if let Some(b) = b {
                        entry.conn.give_back(send, b);
                    }
                    counters.ring_full_stalls += 1;
                    match entry.conn.staging_commit(offset, len) {
                        Some(staged) => Some(Waiting::Body(Outgoing::staged(header(), staged))),
                        None => Some(Waiting::Error(
                            header(),
                            Status::internal("staged answer outside the staging area"),
                        )),
                    }
                }
                (Outcome::Later(msg), Some(b)) if !entry.conn.areas.is_live() => {
                    // It waited only for the send mirror (the session's first ring body, or its
                    // first since they were given back): registered now, and placed as it would
                    // have been with them.
                    match entry.conn.place_late(send, b, header(), msg) {
                        conn::LatePlaced::Sent(len) => {
                            entry.conn.session.on_answer_for(h.slot, h.generation);
                            answered(Code::Ok, len, counters);
                            None
                        }
                        conn::LatePlaced::Wait(msg) => {
                            counters.ring_full_stalls += 1;
                            Some(Waiting::Body(Outgoing::later(header(), msg)))
                        }
                        conn::LatePlaced::Failed(s) => Some(Waiting::Error(header(), s)),
                    }
                }
                (Outcome::Later(msg), b) => {
                    if let Some(b) = b {
                        entry.conn.give_back(send, b);
                    }
                    counters.ring_full_stalls += 1;
                    Some(Waiting::Body(Outgoing::later(header(), msg)))
                }
                (Outcome::Spilled(bytes), b) => {
                    if let Some(b) = b {
                        entry.conn.give_back(send, b);
                    }
                    counters.ring_full_stalls += 1;
                    Some(spill(header(), Ok(*bytes)))
                }
                (Outcome::Gathered(body), b) => {
                    if let Some(b) = b {
                        entry.conn.give_back(send, b);
                    }
                    Some(spill(header(), Ok(*body)))
                }
                (Outcome::Eager(n), None) => Some(spill(header(), Ok(scratch[..n as usize].to_vec()))),
                (Outcome::Error(s), None) => Some(Waiting::Error(header(), s)),
                (Outcome::Unset, None) | (Outcome::Ring { .. }, None) => {
                    drop(ctx.response.take());
                    Some(Waiting::Error(header(), Status::internal("handler returned no answer")))
                }
            };
            (direct, spilled)
        };
        // Posted: `flush_dirty` has something to do for the session only when a control message
        // is due (a CreditGrant this request's credit raised, say), a raise waits for receive
        // WQEs, or something was queued since (a RingReturn is looked at by `on_message`).
        let dirty = direct != Some(true) || {
            let c = &entry.conn;
            c.session.raise_short() != 0
                || c.session.lease_pending()
                || c.session.has_control()
                || !c.sq.is_empty()
        };
        let had_backlog = !entry.backlog.is_empty();
        if let Some(mut spill) = spilled {
            if let Err(reason) = charge(&entry.conn.session, &mut spill) {
                self.close_over_backlog(idx, &reason);
                return;
            }
            entry.backlog.push(spill);
        }
        if !had_backlog && !entry.backlog.is_empty() {
            self.try_backlog(idx);
        }
        if direct == Some(false) {
            let session = self.entries[idx as usize].as_ref().map_or(0, |e| e.session);
            tracing::warn!(worker = self.shared.index, session, "posting sends failed");
            self.close_entry(idx, "posting sends failed", false, true);
        } else if dirty {
            self.mark_dirty(idx);
        }
    }
}

/// The fields of a work completion the worker reads ([`Worker::on_completion`]).
struct Wc {
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    qp_num: u32,
    invalidated: bool,
}

/// The writer a handler answers into: its eager body in `send_buf`'s buffer (with none, in
/// `scratch`, and the answer waits on the heap), the send mirror and the staging span of `conn`.
/// Staging space is taken in outbox order: behind waiting answers (`backlog_empty` false) a
/// body that must wait stays unencoded (`Outcome::Later`) and is encoded when it reaches the
/// front, so it never waits for space an answer behind it holds. With no send mirror yet (or
/// given back): the view of none and an empty span; a body above the eager threshold then
/// waits unencoded and registers them (`encode_body`). The views of the mirror and the
/// staging span are built only for a body that is not eager ([`SendSpace`]).
#[inline]
fn reply_writer<'a, P: Provider>(
    conn: &'a mut Conn<P>,
    pool: &'a mut SendPool<P>,
    send_buf: Option<&'a mut crate::buffers::SendBuf>,
    scratch: &'a mut [u8],
    backlog_empty: bool,
    ctx: &'a RequestContext,
) -> ReplyWriter<'a> {
    let cap = conn.body_cap;
    let Conn { areas, session, spare, .. } = conn;
    let params = session.params();
    let eager_threshold = params.eager_threshold;
    let fit = (eager_threshold.min(params.max_message) as usize).min(cap) + 1;
    let (eager, session, eager_fit) = match send_buf {
        Some(b) => (&mut pool.buf_mut(b)[HEADER_LEN..HEADER_LEN + cap], Some(session), fit),
        None => (&mut scratch[..cap], None, 0),
    };
    ReplyWriter {
        response: &ctx.response,
        metadata: false,
        eager,
        eager_fit,
        eager_threshold,
        space: areas,
        backlog_empty,
        spare,
        // The worker's pool, which every session of the worker sends from (`SendAreas`).
        registered: ctx.registered.as_deref(),
        session,
        outcome: Outcome::Unset,
    }
}

impl<P: Provider> SendSpace for crate::endpoint::areas::SendAreas<P> {
    fn views(&mut self, spare: bool) -> (MirrorView<'_>, u32, &mut [u8], u32) {
        let total = self.staging_len();
        let (mirror, offset, bytes) = crate::endpoint::areas::SendAreas::views(self, spare);
        (mirror, offset, bytes, total)
    }
}

/// Answers call `h` with the eager body of `n` bytes its handler wrote into `b`: posted at once
/// when it is the last completion of the poll batch (`Some(posted)`), else queued to go as one
/// list with the batch's last answer (`None`). The session and the counters note the answer.
#[allow(clippy::too_many_arguments)]
#[inline]
fn answer_eager<P: Provider>(
    conn: &mut Conn<P>,
    send: &mut SendPool<P>,
    wcs: &Completions<POLL_BATCH>,
    counters: &mut Counters,
    b: crate::buffers::SendBuf,
    h: &Header,
    metadata: bool,
    n: u32,
    tag: u32,
) -> Option<bool> {
    let direct = if wcs.pending() == 0 {
        // The last completion of the poll batch: no other answer of this batch can join this
        // one's doorbell any more, so it is posted now (behind what the session queued before
        // it, in one list), not queued for `flush_dirty`. Answers to a batch of requests are
        // queued and go as one list with the last one's.
        Some(conn.send_response_now(send, b, (h.slot, h.generation, h.method, metadata), n, tag).is_ok())
    } else {
        let header = Header {
            slot: h.slot,
            generation: h.generation,
            method: h.method,
            metadata,
            ..Header::new(Kind::Response)
        };
        conn.queue(send, b, header, BodyAt::Eager(n));
        None
    };
    conn.session.on_answer_for(h.slot, h.generation);
    counters.bytes_out += u64::from(n);
    counters.rpcs += 1;
    counters.status(Code::Ok);
    direct
}

/// Answers a call whose handler (of `name`) panicked with `panic`: INTERNAL naming the method
/// and the panic's text (unless the handler answered before it panicked).
#[cold]
#[inline(never)]
fn handler_panicked(name: &'static str, panic: &(dyn std::any::Any + Send), out: &mut ReplyWriter<'_>) {
    let what = panic_text(panic);
    tracing::warn!(method = name, panic = %what, "handler panicked");
    out.error(Status::internal(format!("handler of {name} panicked: {what}")));
}

/// Runs `call` (the handler) observed (`ServerConfig::observe`): its span entered and its trace
/// context the thread's meanwhile; the call's record goes into `ctx` (an async handler takes
/// it, else [`observe_end`] ends it).
#[cold]
#[inline(never)]
fn observed<R>(
    o: crate::Observe,
    ctx: &RequestContext,
    name: &'static str,
    len: usize,
    call: impl FnOnce() -> R,
) -> R {
    if !o.is_tracing() {
        // Metrics only: the clock read, the rest once the answer is posted.
        ctx.started.set(Some(crate::observe::ServerStart::now(name, len)));
        return call();
    }
    let obs = crate::observe::Observed::server(o, name, ctx.metadata(), len, &ctx.info.peer);
    let _entered = obs.enter();
    ctx.observed.set(Some(obs));
    call()
}

/// Records a call of a served method refused before its handler ran (draining, refused
/// metadata, a passed deadline, the interceptor's refusal) with `code`.
#[cold]
#[inline(never)]
fn observe_refused(o: crate::Observe, ctx: &RequestContext, name: &'static str, len: usize, code: Code) {
    crate::observe::Observed::server(o, name, ctx.metadata(), len, &ctx.info.peer).finish(code, 0);
}

/// Ends the record of a call whose handler returned with `outcome` (unless an async handler
/// took it): a traced call's at once (its span closes before its answer leaves), else into
/// `ended`, recorded once the answer is posted ([`end_observed`]).
#[cold]
#[inline(never)]
fn observe_end(ctx: &RequestContext, outcome: &Outcome, ended: &mut Vec<(Ended, Code, usize)>) {
    if !matches!(outcome, Outcome::Deferred) {
        if let Some(s) = ctx.started.take() {
            let (code, len) = outcome_size(outcome);
            ended.push((Ended::Started(s), code, len));
            return;
        }
    }
    let Some(obs) = ctx.take_observed() else { return };
    if matches!(outcome, Outcome::Deferred) {
        // Its answer (a `Responder`'s, a stream's end) or the worker, when the call ends
        // without one, ends the record.
        match ctx.cancel_flag.take() {
            Some(flag) => {
                let mut obs = obs;
                obs.in_flight();
                flag.set_observed(obs);
                ctx.cancel_flag.set(Some(flag));
            }
            None => obs.finish_deferred(),
        }
        return;
    }
    let (code, len) = outcome_size(outcome);
    if obs.traced() {
        obs.finish(code, len);
    } else {
        ended.push((Ended::Observed(obs), code, len));
    }
}

/// A call whose answer is posted, to record ([`end_observed`]).
pub(crate) enum Ended {
    Observed(crate::observe::Observed),
    /// Metrics only ([`crate::observe::ServerStart`]).
    Started(crate::observe::ServerStart),
}

/// The code and response bytes an answered call records (`Deferred`: none yet).
#[inline]
fn outcome_size(outcome: &Outcome) -> (Code, usize) {
    match outcome {
        Outcome::Eager(n) => (Code::Ok, *n as usize),
        Outcome::Ring { len, .. } | Outcome::Staged { len, .. } => (Code::Ok, *len as usize),
        Outcome::Spilled(b) | Outcome::Gathered(b) => (Code::Ok, b.len()),
        Outcome::Later(b) => (Code::Ok, b.len()),
        Outcome::Error(s) => (s.code(), 0),
        Outcome::Deferred => (Code::Ok, 0),
        Outcome::Unset => (Code::Unknown, 0),
    }
}

/// Records the calls of `ended` (their answers are posted).
#[cold]
#[inline(never)]
fn end_observed(ended: &mut Vec<(Ended, Code, usize)>) {
    for (e, code, len) in ended.drain(..) {
        match e {
            Ended::Observed(obs) => obs.finish(code, len),
            Ended::Started(s) => s.finish(code, len),
        }
    }
}
