//! The client's connection, generic over the provider: its own QP, send CQ, rings and session,
//! on its endpoint's SRQ and receive CQ (shared with the endpoint's other sessions, receives
//! routed by QP number: [`crate::endpoint::rx`]), driven by the calling thread (no other thread,
//! no cross-thread hop).
//!
//! A driver: it polls the CQs, encodes bodies into registered memory, posts WRs, and keeps what
//! the calls carry (bodies waiting for a credit, answers until their caller takes them) in
//! arrays indexed by slot. What may be sent now, in which order, what waits, and what a
//! response, a completion or a timer means is the session's ([`Session`]: `session/calls.rs`,
//! `session/outbox.rs`, `session/lifecycle.rs`).

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use prost::Message;

use std::collections::VecDeque;

use super::config::ClientConfig;
use crate::buffers::bounded::{check_exact, encode_exact, LenMismatch};
use crate::buffers::{Completion, Completions, GatherBody, RecvBuf, SendBuf, SendPool, SendQueue, Staged};
use crate::config::{Idle, EVENT_WAIT};
use crate::endpoint::conn::{
    body_area, create_cq, create_qp, create_ring, handshake, send_bufs_for, send_waiting, BodyAt, Conn,
    Outgoing,
};
use crate::endpoint::counters::Counters;
use crate::endpoint::nic::Nic;
use crate::endpoint::rx::{Received, SessionRx, REPOST_BATCH};
use crate::session::{
    tick::Tick, Abandoned, Event, Outbox, Placement, ResponseFate, Role, Session, SessionParams, Waiting,
};
use crate::status::{Code, Status};
use crate::verbs::rc::{self, Endpoint};
use crate::verbs::{CompletionQueue, Context, Provider, QpAttr, QpState, QueuePair};
use crate::wire::{
    read_frame, write_frame, Frame, FrameError, Handshake, Header, Kind, HEADER_LEN, MAX_CREDITS,
};
use std::sync::Arc;

const POLL_BATCH: usize = 32;
/// Polls of a blocking wait that kept its core between two looks at its call's deadline (a
/// clock read): a few microseconds of busy polling.
const DEADLINE_SPINS: u32 = 64;
/// Tag of the client's only connection in send `wr_id`s.
const TAG: u32 = 1;

/// What a response leaves in its slot until the caller takes it.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The body is in this receive buffer, after the header.
    Eager(RecvBuf),
    /// The body came through the ring and was copied out into this buffer.
    Owned(Vec<u8>),
    Err(Status),
    /// Stream messages batched in one receive buffer ([`crate::wire::STREAM_BATCH`], checked by
    /// the session): `left` of them from body offset `at` on. The buffer (the stream's credit)
    /// goes back with the last.
    Batch {
        buf: RecvBuf,
        at: u32,
        left: u16,
    },
}

/// Stream messages waiting in one send buffer for a stream grant: `len` body bytes of `count`
/// frames after the header.
struct OpenBatch {
    slot: u16,
    generation: u32,
    buf: SendBuf,
    len: u32,
    count: u16,
}

/// A request's body while its call waits for a credit.
enum PendingBody {
    /// In a send buffer, after the header (`len` bytes), or in the mirror at a ring offset
    /// reserved just before (then the call is sent at once).
    Placed(SendBuf, BodyAt),
    /// In the staging area: sent through the ring whole or in pieces as space frees.
    Staged(Staged),
    /// On the heap (larger than the staging area, or an `encoded_len` that lied), its large
    /// `bytes` fields referenced: sent through the ring whole or in pieces as space frees.
    /// Boxed: a gather body is 80 bytes, and a body is moved into and out of its slot per call.
    Heap(Box<GatherBody>),
}

/// How [`ClientCore::start_with`] may wait and when it posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartMode {
    /// Waits for a send buffer or ring room, posts at once (a blocking call).
    Now,
    /// Waits for a send buffer or ring room, posts with the next flush (a batch of calls).
    Batched,
    /// Never waits (`Ok(None)` instead), posts with the next flush (an async call).
    NoWait,
    /// Never waits (`Ok(None)` instead), posts at once (a `Channel` call started with nothing
    /// else in flight: no batch to share a doorbell with).
    NoWaitNow,
}

/// A call in progress: slot, generation, deadline.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallId {
    pub(crate) slot: u16,
    pub(crate) generation: u32,
    pub(crate) deadline: Option<Instant>,
}

/// One client connection. Field order is drop order: the QP (in `conn`) goes before the SRQ and
/// receive buffers.
pub(crate) struct ClientCore<P: Provider> {
    conn: Conn<P>,
    /// The connection's own send buffers (after `conn`: dropped after its QP).
    pool: SendPool<P>,
    /// Its part of the endpoint's receive side (after `conn`: detached after its QP is gone):
    /// the SRQ's buffers and the receive CQ, shared with the endpoint's other sessions.
    recv: SessionRx<P>,
    /// The CQ of the connection's sends (receives complete on the endpoint's receive CQ).
    cq: P::CompletionQueue,
    /// Per slot: the answer of a finished call until its caller takes it (the slots' states
    /// are the session's: [`Session::calls`]).
    answers: Vec<Option<Answer>>,
    /// Per slot: the body of a call waiting for a credit.
    pending: Vec<Option<PendingBody>>,
    /// Per slot: where the call of that generation puts its response's metadata
    /// (`CallOptions::capture_metadata`); a stale entry is replaced by the next capture.
    captures: Vec<Option<(u32, crate::metadata::CapturedMetadata)>>,
    /// `ClientConfig::max_metadata_bytes`.
    max_metadata: usize,
    /// Per slot: stream messages received and not yet taken by the caller (at most the stream's
    /// credits; empty for unary calls, allocated only when a stream uses the slot).
    stream_msgs: Vec<VecDeque<Answer>>,
    /// Requests on the wire whose bodies are still being sent through the ring, and stream
    /// messages that could not go straight into a send buffer, in order.
    outbox: Outbox<Outgoing>,
    /// Streams whose caller ended its messages: the StreamEnd goes once the request is on the
    /// wire and none of the stream's messages waits in the outbox (it must not overtake them).
    stream_ends: Vec<(u16, u32)>,
    /// Streams cancelled while a message of theirs was leaving in pieces: the Cancel follows
    /// its last piece (the session's [`Session::request_left`]).
    stream_cancels: Vec<(u16, u32)>,
    /// Messages of one caller's stream that found no stream grant, framed into one send
    /// buffer ([`crate::wire::STREAM_BATCH`]): they leave as one SEND with the next credit.
    stream_batch: Option<OpenBatch>,
    /// The control connection; `None` once the server said it holds none for this session
    /// ([`crate::wire::FLAG_DETACHED`]: liveness by the idle probe alone).
    tcp: Option<TcpStream>,
    broken: Option<Status>,
    idle: Idle,
    /// When the timers and the TCP channel are checked ([`crate::session::tick`]).
    tick: Tick,
    /// Send completions polled from `cq`.
    wcs: Completions<POLL_BATCH>,
    pub(crate) counters: Counters,
    /// The last [`StartMode::NoWait`] start gave up on a body that found the server's ring full,
    /// its stall counted (`ring_full_stalls`): the call queue starts that same call again (its
    /// head; see `super::queue`), and the retries are not counted as stalls again.
    unplaced_stall: bool,
    /// Calls at once that the receive buffers registered so far cover ([`recv_need`]).
    recv_calls: u16,
    /// The receive buffers registered so far cover the session's stream budget too.
    recv_streams: bool,
    /// The receive buffers registered so far cover the messages of ring bodies too (set at the
    /// first body above the eager threshold either way).
    recv_bulk: bool,
    pub(crate) peer: SocketAddr,
    /// The endpoint's device context and PD, shared with its other sessions.
    _nic: Arc<Nic<P>>,
}

/// Receive buffers a client session registers beyond [`recv_need`]: those that may wait for a
/// batched repost.
const REPOST_SLACK: u32 = REPOST_BATCH as u32 - 1;
/// Receive buffers of a client endpoint's SRQ are registered in chunks of `1 << RECV_CHUNK_SHIFT`.
const RECV_CHUNK_SHIFT: u32 = 4;
/// Receive buffers an endpoint registers before any session claims: what an idle session needs
/// ([`recv_need`] of no call, 8, and [`REPOST_SLACK`]), once per endpoint (its sessions' control
/// messages share it). A session claims what its calls need beyond it ([`ClientCore::cover_recv`]),
/// so a lone session registers what a session of its own would.
const RECV_RESERVE: u32 = 8 + REPOST_SLACK;
/// Send buffers of a client session are registered in chunks of `1 << SEND_CHUNK_SHIFT`.
const SEND_CHUNK_SHIFT: u32 = 4;

/// Receive WQEs a client session posts while it has up to `calls` calls at once (of a window of
/// `window`): `4 × calls + 8`; with `streams` the session's stream budget
/// (`min(window, MAX_STREAM_BUDGET)`); with `bulk`, `2 × MAX_PIECES_IN_RING` (32). That is 3 per
/// call for its answer and credit messages, one per call for the CancelAck of its Cancel (which
/// holds its credit until then), 8 for the probe and the other control messages; the stream
/// messages held or granted; and once the session sent or received a body above the eager
/// threshold, the messages of ring bodies: the pieces of an answer in our ring (each holds at
/// least 1/16 of it) and the RingReturns of our pieces in the server's (as many), which a
/// large answer can bring at once. 200 at the default window of 32 with both (the depth of a
/// session's own SRQ); 12 for one call at a time. A server may still send a burst beyond it:
/// those SENDs wait for a repost on RNR retry (`rnr_retry` 7: a delay, nothing lost).
///
/// On the endpoint's shared SRQ, the 8 control messages and `REPOST_SLACK` (7: reposts go 8 at a
/// time, [`REPOST_BATCH`]) are the endpoint's reserve, registered once ([`RECV_RESERVE`]); a
/// session claims the rest ([`ClientCore::cover_recv`]). Alone on its endpoint, a session holds
/// 16 buffers idle; making a call at a time, 32; with bodies above the eager threshold, 64.
fn recv_need(calls: u16, streams: bool, bulk: bool, window: u16) -> u32 {
    let stream_budget = if streams { u32::from(window).min(crate::session::MAX_STREAM_BUDGET) } else { 0 };
    let ring_messages = if bulk { 2 * crate::session::MAX_PIECES_IN_RING } else { 0 };
    4 * u32::from(calls) + 8 + stream_budget + ring_messages
}

fn unavailable(what: impl std::fmt::Display) -> Status {
    Status::unavailable(what.to_string())
}

impl<P: Provider> Drop for ClientCore<P> {
    /// Gives the receive buffers the session holds (answers and stream messages not taken) back
    /// to the endpoint's pool, which its other sessions go on using; and takes what its QP
    /// received and nobody polled yet, after moving the QP to ERR (no more receive WQEs taken):
    /// a provider that removes a destroyed QP's completions from the CQ (rdma-core's mlx5 does)
    /// would otherwise leave their buffers neither posted nor owned, lost to the endpoint. A few
    /// polls, best effort: a completion the NIC has not written yet by then is lost that way.
    fn drop(&mut self) {
        let _ = self.conn.qp.modify(&QpAttr::new(QpState::Err));
        for _ in 0..4 {
            if self.recv.poll().unwrap_or(0) == 0 {
                break;
            }
            while let Some(r) = self.recv.next() {
                self.recv.repost(r.buf);
            }
        }
        for i in 0..self.answers.len() {
            if let Some(a) = self.answers[i].take() {
                self.release(a);
            }
        }
        for i in 0..self.stream_msgs.len() {
            while let Some(a) = self.stream_msgs[i].pop_front() {
                self.release(a);
            }
        }
    }
}

impl<P: Provider> ClientCore<P> {
    /// Connects over TCP, exchanges the handshake (with `flags`: [`crate::wire::FLAG_IDLE_PONGS`]
    /// from a driver that answers Pings while idle, else 0) and brings the QP to RTS. The
    /// session's QP and memory live on `nic`, the endpoint's device context and PD
    /// ([`Nic::session_pd`]), shared with the endpoint's other sessions.
    pub(crate) fn connect(
        addr: impl ToSocketAddrs,
        cfg: &ClientConfig,
        nic: &Arc<Nic<P>>,
        flags: u16,
    ) -> Result<ClientCore<P>, Status> {
        if cfg.window == 0 || cfg.window > MAX_CREDITS {
            return Err(Status::invalid_argument(format!(
                "ClientConfig::window {} is not in 1..=4096",
                cfg.window
            )));
        }
        if cfg.max_abandoned == 0 {
            return Err(Status::invalid_argument("ClientConfig::max_abandoned 0 is not in 1..=65535"));
        }
        if cfg.peer_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Status::invalid_argument("ClientConfig::peer_timeout of 0 (use None for no probe)"));
        }
        if cfg.max_reassembly_bytes == 0 {
            return Err(Status::invalid_argument("ClientConfig::max_reassembly_bytes of 0 bytes"));
        }
        if cfg.max_metadata_bytes < 12 {
            return Err(Status::invalid_argument(format!(
                "ClientConfig::max_metadata_bytes {} is below 12 (two empty blocks)",
                cfg.max_metadata_bytes
            )));
        }
        if cfg.reassembly_timeout.is_zero() {
            return Err(Status::invalid_argument("ClientConfig::reassembly_timeout of 0"));
        }
        if cfg.ring_bytes < crate::wire::MIN_RING_LEN || cfg.ring_bytes > crate::wire::MAX_RING_LEN {
            return Err(Status::invalid_argument(format!(
                "ClientConfig::ring_bytes {} is not in 64 KiB ..= 1 GiB (wire::MIN_RING_LEN ..= MAX_RING_LEN)",
                cfg.ring_bytes
            )));
        }
        if cfg.max_peer_ring_bytes < crate::wire::MIN_RING_LEN
            || cfg.max_peer_ring_bytes > crate::wire::MAX_RING_LEN
        {
            return Err(Status::invalid_argument(format!(
                "ClientConfig::max_peer_ring_bytes {} is not in 64 KiB ..= 1 GiB (wire::MIN_RING_LEN ..= MAX_RING_LEN)",
                cfg.max_peer_ring_bytes
            )));
        }
        if let Some(t) = cfg.auth_token.as_ref().filter(|t| t.len() > crate::wire::MAX_AUTH_TOKEN) {
            // It would not fit the handshake frame (beyond 64 KiB its length field even wraps).
            return Err(Status::invalid_argument(format!(
                "ClientConfig::auth_token is {} bytes, at most {}",
                t.len(),
                crate::wire::MAX_AUTH_TOKEN
            )));
        }
        let span = tracing::info_span!("connect", transport = P::NAME);
        let _entered = span.enter();
        let dev = &nic.dev;
        let window = cfg.window;
        let bufs = send_bufs_for(window);
        // Receives go to the endpoint's SRQ and receive CQ, shared with its other sessions
        // (`endpoint::rx`; one of the session's own, of the whole window's `recv_need`, for a
        // session that waits for events or whose PD is its own). Its buffers are registered as
        // the sessions' calls need them (`ClientCore::cover_recv`): the endpoint's reserve of 16
        // covers its idle sessions.
        let events = cfg.polling.needs_events();
        let recv_depth = recv_need(window, true, true, window).min(dev.ctx.attr().max_srq_wr);
        let pd = nic.session_pd().map_err(unavailable)?;
        // Nothing waits for a send completion's event: answers wake an event wait (the receive CQ).
        let cq = create_cq::<P>(&dev.ctx, 0, u32::from(bufs) * 2 + 8, false).map_err(unavailable)?;
        let recv_buf = HEADER_LEN + body_area(cfg.eager_threshold);
        let rx = nic
            .client_rx(&pd, recv_buf, recv_depth, RECV_CHUNK_SHIFT, RECV_RESERVE, events)
            .map_err(unavailable)?;
        let attr = dev.ctx.attr();
        let qp = create_qp::<P>(&pd, &cq, rx.cq(), rx.srq(), bufs, attr).map_err(unavailable)?;
        let recv = rx.attach(qp.qp_num());
        let mut window_fallbacks = 0;
        let ring = create_ring::<P>(&dev.ctx, &pd, cfg.ring_bytes as usize, &mut window_fallbacks)
            .map_err(unavailable)?;
        let local = dev.endpoint(&qp);

        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| unavailable(format!("resolving the server address: {e}")))?
            .collect();
        let mut last = None;
        let mut tcp = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, cfg.connect_timeout) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(format!("{a}: {e}")),
            }
        }
        let Some(mut tcp) = tcp else {
            return Err(unavailable(format!("connect: {}", last.unwrap_or_else(|| "no address".into()))));
        };
        let peer = tcp.peer_addr().map_err(unavailable)?;
        let _ = tcp.set_nodelay(true);
        crate::control::Liveness::for_peer_timeout(cfg.peer_timeout).apply(&tcp).map_err(unavailable)?;
        tcp.set_read_timeout(Some(cfg.connect_timeout)).map_err(unavailable)?;
        let hello = Handshake {
            flags,
            ..handshake(
                &local,
                ring.remote(),
                window,
                cfg.eager_threshold,
                cfg.max_message_size,
                0,
                cfg.auth_token.clone().unwrap_or_default(),
            )
        };
        let hello = Frame::Handshake(hello);
        #[cfg(feature = "tls")]
        let got = match &cfg.tls {
            Some(tls) => {
                tcp.set_write_timeout(Some(cfg.connect_timeout)).map_err(unavailable)?;
                crate::tls::client_exchange(tls, &mut tcp, &hello, peer)?
            }
            None => {
                write_frame(&mut tcp, &hello).map_err(|e| unavailable(format!("handshake: {e}")))?;
                read_frame(&mut tcp)
            }
        };
        #[cfg(not(feature = "tls"))]
        let got = {
            write_frame(&mut tcp, &hello).map_err(|e| unavailable(format!("handshake: {e}")))?;
            read_frame(&mut tcp)
        };
        let reply = match got {
            Ok(Frame::Handshake(h)) => h,
            Ok(Frame::Refusal(r)) => {
                return Err(Status::new(r.code, format!("server refused: {}", r.message)))
            }
            Err(FrameError::Wire(e)) => {
                return Err(Status::internal(format!("bad handshake from {peer}: {e}")))
            }
            // The read timeout is `connect_timeout`: it expires as WouldBlock (or TimedOut).
            Err(FrameError::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(unavailable(format!(
                    "handshake with {peer}: no answer within {} ms (ClientConfig::connect_timeout)",
                    cfg.connect_timeout.as_millis()
                )))
            }
            Err(e) => return Err(unavailable(format!("handshake with {peer}: {e}"))),
        };
        let refuse = |field: &str, why: String| {
            Err(Status::internal(format!("handshake field `{field}` from {peer}: {why}")))
        };
        if reply.credits > window {
            return refuse("credits", format!("{} granted, {window} asked", reply.credits));
        }
        if reply.eager_threshold > cfg.eager_threshold {
            return refuse(
                "eager_threshold",
                format!("{} above ours {}", reply.eager_threshold, cfg.eager_threshold),
            );
        }
        if reply.session == 0 {
            return refuse("session", "0 is not a session id".into());
        }
        if reply.flags & !crate::wire::FLAG_DETACHED != 0 {
            return refuse("flags", format!("{:#06x}: a server sets only FLAG_DETACHED", reply.flags));
        }
        let detached = reply.flags & crate::wire::FLAG_DETACHED != 0;
        if reply.ring_len > cfg.max_peer_ring_bytes {
            // The client registers a mirror (and staging) of the server's ring length: a
            // configuration mismatch of the two ends, which one of them must change.
            return Err(Status::resource_exhausted(format!(
                "the server {peer} announces a ring (handshake field `ring_len`) of {} bytes (its \
                 ServerConfig::ring_bytes), above \
                 this client's ClientConfig::max_peer_ring_bytes of {} bytes (the most it mirrors): \
                 raise ClientConfig::max_peer_ring_bytes to at least {} or lower the server's \
                 ServerConfig::ring_bytes",
                reply.ring_len, cfg.max_peer_ring_bytes, reply.ring_len
            )));
        }
        if reply.ring_len < crate::wire::MIN_RING_LEN {
            return refuse(
                "ring_len",
                format!(
                    "{} bytes below the smallest ring, {} bytes",
                    reply.ring_len,
                    crate::wire::MIN_RING_LEN
                ),
            );
        }
        let body_cap = body_area(reply.eager_threshold);
        // Registered a chunk at a time as sends need buffers, up to `bufs`: an idle session, or
        // one that makes a call at a time, registers one chunk (16 buffers), the first now (a
        // pool that cannot register its first chunk fails the connect, not a call).
        let send_buf = HEADER_LEN + body_cap;
        let mut pool = SendPool::<P>::growable(&pd, send_buf, SEND_CHUNK_SHIFT, usize::from(bufs) * send_buf)
            .map_err(unavailable)?;
        match pool.acquire() {
            Some(b) => pool.give_back(b),
            None => return Err(unavailable("registering the session's first send buffers failed")),
        }
        // The send mirror and staging area are registered at the first request above the eager
        // threshold (`Conn::ensure_areas`).
        let areas = crate::endpoint::areas::SendAreas::new(
            pd.clone(),
            reply.ring_len,
            usize::from(window),
            crate::endpoint::counters::AreaGauge::new(None),
        )
        .with_registered(crate::buffers::RegisteredPool::new::<P>(pd.clone(), cfg.registered_buffer_bytes));
        let remote =
            Endpoint { qp_num: reply.qp_num, psn: reply.psn, lid: reply.lid, gid: reply.gid, mtu: reply.mtu };
        rc::connect(&qp, &dev.rc, &local, &remote)
            .map_err(|e| unavailable(format!("connecting the QP: {e}")))?;
        let qp_inline = qp.cap().max_inline_data;
        let sq_depth = qp.cap().max_send_wr as usize;
        let mut sq = SendQueue::new(sq_depth, usize::from(bufs));
        // The server may write our ring once it has our first request: bind the ring's window to
        // the QP and wait for the bind's completion before any call.
        if ring.has_window() {
            sq.bind_window(&qp, &ring, TAG)
                .map_err(|e| unavailable(format!("binding the ring's window: {e}")))?;
            let give_up = Instant::now() + cfg.connect_timeout;
            let mut wcs = Completions::<4>::new();
            'bind: loop {
                wcs.poll(&cq).map_err(unavailable)?;
                for c in &mut wcs {
                    let status = c.wc().status;
                    if !status.is_success() {
                        return Err(unavailable(format!("binding the ring's window: {status}")));
                    }
                    if c.send_tag().is_some() {
                        sq.on_completion(c, &mut pool);
                        break 'bind;
                    }
                }
                if Instant::now() >= give_up {
                    return Err(unavailable("binding the ring's window: no completion"));
                }
                std::thread::yield_now();
            }
        }
        // A detached session's server closed its end after the reply: so does this one.
        let tcp = if detached {
            None
        } else {
            tcp.set_nonblocking(true).map_err(unavailable)?;
            Some(tcp)
        };
        // The session may be raised to the window (protocol 12: credits granted on demand); it
        // starts at what the reply granted.
        let params = SessionParams {
            id: reply.session,
            credits: window,
            eager_threshold: reply.eager_threshold,
            max_message: reply.max_message.min(cfg.max_message_size),
            peer_ring_len: reply.ring_len,
            own_ring_len: cfg.ring_bytes,
            max_held: usize::from(window),
        };
        tracing::info!(%peer, session = reply.session, credits = reply.credits, detached, transport = P::NAME, "client connected");
        let mut session = Session::new(Role::Client, params);
        session.set_granted(reply.credits);
        Ok(ClientCore {
            conn: Conn {
                refs: Vec::new(),
                spare: session.spare_bodies().clone(),
                qp,
                ring: Some(ring),
                areas,
                written_mark: 0,
                sq,
                session: {
                    let mut s = session;
                    s.lease_peer_ring();
                    s.set_peer_timeout(cfg.peer_timeout, Instant::now());
                    // A hostile server cannot make this end hold more for answers in pieces.
                    s.set_reassembly(
                        crate::session::HeldBytes::new(
                            cfg.max_reassembly_bytes,
                            "ClientConfig::max_reassembly_bytes",
                        ),
                        u64::MAX,
                        cfg.reassembly_timeout,
                    );
                    s.set_abandon_cap(
                        cfg.max_abandoned,
                        cfg.peer_timeout.unwrap_or(crate::session::DEFAULT_ACK_TIMEOUT),
                    );
                    s
                },
                // Protocol 12: no ring until the server grants one (`on_ring_grant`).
                peer_ring: (0, 0),
                body_cap,
                max_inline: qp_inline,
            },
            pool,
            recv,
            cq,
            answers: (0..window).map(|_| None).collect(),
            pending: (0..window).map(|_| None).collect(),
            stream_msgs: (0..window).map(|_| VecDeque::new()).collect(),
            captures: (0..window).map(|_| None).collect(),
            max_metadata: cfg.max_metadata_bytes as usize,
            outbox: Outbox::default(),
            stream_ends: Vec::new(),
            stream_cancels: Vec::new(),
            stream_batch: None,
            tcp,
            broken: None,
            idle: Idle::new(cfg.polling),
            tick: Tick::new(),
            wcs: Completions::new(),
            counters: Counters {
                sessions_opened: 1,
                window_fallbacks,
                control_connections: u64::from(!detached),
                sessions_detached: u64::from(detached),
                sessions_shm: u64::from(flags & crate::wire::FLAG_SHM != 0),
                ..Counters::default()
            },
            unplaced_stall: false,
            // The reserve covers no call: the first call claims buffers for one (`cover_recv`).
            recv_calls: 0,
            recv_streams: false,
            recv_bulk: false,
            peer,
            _nic: nic.clone(),
        })
    }

    /// The pool of registered buffers of this session's protection domain.
    pub(crate) fn registered_pool(&self) -> std::sync::Arc<crate::buffers::RegisteredPool> {
        match self.conn.areas.registered() {
            Some(p) => p.clone(),
            // Unreachable: `connect` gives every client connection its pool.
            None => crate::buffers::RegisteredPool::new::<P>(self.conn.areas.pd().clone(), 0),
        }
    }

    /// Encodes a request into a free slot and queues it (sending it when a credit is free).
    /// `Ok(None)` when no slot is free (the caller queues the call: `super::queue`), and, with
    /// [`StartMode::NoWait`], when the body cannot be placed without waiting (no send buffer, or
    /// neither ring nor staging room); nothing is taken then. Otherwise it waits for those
    /// (progressing the session, until `deadline`). With [`StartMode::Now`] the call is posted
    /// at once; otherwise with the next progress or [`ClientCore::flush`] (so calls started back
    /// to back share one doorbell). A body above the eager threshold is encoded straight into
    /// the mirror of the server's ring when the call goes out now and the ring has room;
    /// otherwise into the staging area (onto the heap when the body is larger than the staging
    /// area), and sent through the ring (in pieces when larger than a piece) as space frees.
    ///
    /// `stream`: the request's flags: 0 for a unary call, [`crate::wire::STREAM_OUT`] (and
    /// [`crate::wire::STREAM_IN`]) for a call that opens a stream, whose messages the caller
    /// takes with [`ClientCore::poll_stream`]; with [`crate::wire::METADATA`] when `req` starts
    /// with a metadata block ([`crate::metadata::WithMetadata`]). `capture`: where the call puts
    /// its response's metadata (`CallOptions::capture_metadata`).
    pub(crate) fn start_with<M: Message>(
        &mut self,
        method: u32,
        req: &crate::metadata::WithMetadata<'_, M>,
        deadline: Option<Instant>,
        mode: StartMode,
        stream: u8,
        capture: Option<&crate::metadata::CapturedMetadata>,
    ) -> Result<Option<CallId>, Status> {
        if let Some(s) = &self.broken {
            return Err(s.clone());
        }
        // A unary call whose deadline passed before it could start (one it inherited from the
        // call its thread serves, or a Channel call that waited in its queue) fails here, never
        // sent: the server would answer DEADLINE_EXCEEDED, or run its handler with a microsecond
        // left. (A stream still opens, and ends DEADLINE_EXCEEDED at once.)
        if stream & (crate::wire::STREAM_IN | crate::wire::STREAM_OUT) == 0
            && deadline.is_some_and(|d| d <= Instant::now())
        {
            self.counters.status(Code::DeadlineExceeded);
            return Err(Status::deadline_exceeded("the call's deadline passed before it was sent"));
        }
        if !self.conn.session.calls().has_free() {
            return Ok(None);
        }
        // Receive buffers for this call's answers (one compare when they are registered).
        let streams = stream & (crate::wire::STREAM_IN | crate::wire::STREAM_OUT) != 0;
        if self.conn.session.calls().used() >= self.recv_calls || (streams && !self.recv_streams) {
            self.cover_recv(streams, false).inspect_err(|s| self.counters.status(s.code()))?;
        }
        let flush_now = matches!(mode, StartMode::Now | StartMode::NoWaitNow);
        let blocking = matches!(mode, StartMode::Now | StartMode::Batched);
        // The session's cached metadata block (protocol 11): a block the server keeps is named,
        // not sent; an eager request with another one replaces it (`Session::metadata_cache_flag`).
        let message_len = req.message.encoded_len();
        let mut req = crate::metadata::WithMetadata { metadata: req.metadata, message: req.message };
        let mut flags = stream;
        if let Some(md) = req.metadata {
            match self.conn.session.metadata_cache_flag(md.entries(), message_len) {
                0 => {}
                crate::wire::METADATA_CACHED => {
                    req.metadata = None;
                    flags = (flags & !crate::wire::METADATA) | crate::wire::METADATA_CACHED;
                }
                store => flags |= store,
            }
        }
        let req = &req;
        let len = message_len + req.metadata.map_or(0, crate::metadata::Metadata::encoded_len);
        // Refused before anything is sent or taken.
        if let Err(s) = self.conn.session.check_len(len) {
            self.counters.status(s.code());
            return Err(s);
        }
        let eager = len <= self.conn.session.params().eager_threshold as usize;
        if !eager {
            if !self.recv_bulk {
                self.cover_recv(false, true).inspect_err(|s| self.counters.status(s.code()))?;
            }
            // The send mirror and staging area, registered at the first such body.
            if let Err(s) = self.conn.ensure_areas() {
                self.counters.status(s.code());
                return Err(s);
            }
            // The server's ring, granted on demand (protocol 12): asked for when this body finds
            // none (it waits in the outbox as for a full ring; a refusal fails it). A blocking
            // client idle for a while may have a RingReclaim waiting (the server revokes the
            // ring when it is not answered in time, and a WRITE into it would break the
            // session): what arrived is taken first.
            if self.conn.session.peer_ring_ready() {
                self.progress();
            }
        }
        // A retry of the body whose stall was counted already does not count it again.
        let mut stalled = std::mem::take(&mut self.unplaced_stall);
        // The common call: eager, a credit free with no call queued before it, a send buffer
        // free. Encoded straight into the send buffer and queued for the wire now: no body
        // parked in `pending`, no round trip through the session's queue.
        if eager && self.conn.session.call_goes_now() {
            if let Some(mut buf) = self.conn.acquire(&mut self.pool) {
                let dst = &mut self.pool.buf_mut(&mut buf)[HEADER_LEN..HEADER_LEN + len];
                if let Err(e) = encode_exact(req, dst) {
                    self.conn.give_back(&mut self.pool, buf);
                    return Err(self.mismatch(e, "request"));
                }
                let block = req.metadata.map(crate::metadata::Metadata::entries);
                // `None` (nothing taken) only if `call_goes_now` and the slots disagree: the
                // general path below places the call then.
                match self.conn.session.start_call_now(method, deadline, flags, block, Instant::now) {
                    None => self.conn.give_back(&mut self.pool, buf),
                    Some(h) => {
                        let (slot, generation) = (h.slot, h.generation);
                        if let Some(c) = capture {
                            self.capture(CallId { slot, generation, deadline }, c);
                        }
                        if h.metadata_cache == crate::wire::METADATA_CACHED {
                            self.counters.metadata_cached += 1;
                        }
                        self.counters.bytes_out += len as u64;
                        if flush_now {
                            // Posted at once (nothing queued before it goes after it: what
                            // `pump` queues, and the controls and reposts `flush` looks at).
                            if let Err(e) = self.conn.send_now(&mut self.pool, buf, h, len as u32, TAG) {
                                self.break_conn(unavailable(format!("posting sends: {e}")));
                            }
                            self.pump();
                            self.flush();
                        } else {
                            self.conn.queue(&mut self.pool, buf, h, BodyAt::Eager(len as u32));
                            self.pump();
                        }
                        return Ok(Some(CallId { slot, generation, deadline }));
                    }
                }
            }
        }
        // While registered buffers of this session's pool are alive, a request may carry one:
        // its body waits as a gather list (its registered bytes WRITTEN in place, the rest
        // copied once into the mirror, `Conn::gather_piece`) rather than being encoded whole.
        let gather = !eager && self.conn.areas.registered().is_some_and(|p| p.has_live());
        let body = loop {
            if !gather {
                if let Some(placed) = self.place(req, len, eager, &mut stalled, deadline, blocking)? {
                    break placed;
                }
            }
            // Neither the server's ring nor the staging area has room: wait for either (bodies in
            // the staging area need only ring space to leave, so room comes), unless the body
            // could never fit the staging area.
            if gather || len > self.conn.areas.staging_len() as usize {
                let Some(own) = self.conn.spare.take(GatherBody::own_capacity_for(len)) else {
                    return Err(Status::resource_exhausted(format!(
                        "no memory for a request of {len} bytes"
                    )));
                };
                let body = GatherBody::encode(req, own);
                if let Err(e) = check_exact::<crate::metadata::WithMetadata<'_, M>>(len, body.len()) {
                    return Err(self.mismatch(e, "request"));
                }
                break PendingBody::Heap(Box::new(body));
            }
            if !blocking {
                self.unplaced_stall = stalled;
                return Ok(None);
            }
            self.wait_step(deadline)?;
        };
        self.counters.bytes_out += len as u64;
        let (slot, generation) =
            self.conn.session.start_call(method, deadline, flags).expect("a free slot was checked");
        if flags & crate::wire::METADATA_STORE != 0 {
            if let Some(md) = req.metadata {
                self.conn.session.store_block(slot, generation, md.entries());
            }
        }
        self.pending[slot as usize] = Some(body);
        if let Some(c) = capture {
            self.capture(CallId { slot, generation, deadline }, c);
        }
        self.pump();
        if flush_now {
            self.flush();
        }
        Ok(Some(CallId { slot, generation, deadline }))
    }

    /// Claims receive buffers on the endpoint's receive side so that they cover one more call
    /// than the session has now when its calls reached what they cover ([`recv_need`]; doubling
    /// the calls covered, up to the window), with `streams` the stream budget, and with `bulk`
    /// the messages of ring bodies: before the call goes out, so that its answer finds a WQE
    /// posted. What the endpoint's sessions claim together is registered and posted
    /// ([`SessionRx::claim`]). A claim grows a few times in a session's life (at most
    /// `log2(window) + 2` steps), never on the path of a call whose buffers are there; it ends
    /// with the session.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming the verbs error when the buffers cannot be registered or posted
    /// (the registration limit, `ulimit -l`): the call fails before anything is taken (its
    /// caller counts the status), and the session keeps the buffers it has.
    #[cold]
    #[inline(never)]
    fn cover_recv(&mut self, streams: bool, bulk: bool) -> Result<(), Status> {
        let window = self.conn.session.calls().window();
        let used = self.conn.session.calls().used();
        let calls = if used >= self.recv_calls {
            (used + 1).max(self.recv_calls.saturating_mul(2)).min(window)
        } else {
            self.recv_calls
        };
        let (streams, bulk) = (streams || self.recv_streams, bulk || self.recv_bulk);
        let need = recv_need(calls, streams, bulk, window);
        // The claim is also what may wait in the session's inbox while its driver is away (and
        // the endpoint's spare for control messages, shared: `endpoint::rx`).
        let claim = (need + REPOST_SLACK).saturating_sub(RECV_RESERVE);
        if let Err(e) = self.recv.claim(claim) {
            return Err(Status::resource_exhausted(format!(
                "registering receive buffers for {calls} calls at once ({claim} buffers of {} bytes \
                 claimed beyond the endpoint's {RECV_RESERVE}, {} registered): {e}",
                self.recv.buf_size(),
                self.recv.registered()
            )));
        }
        self.recv_calls = calls;
        self.recv_streams = streams;
        self.recv_bulk = bulk;
        Ok(())
    }

    /// [`ClientCore::cover_recv`] for ring bodies, at the first piece of an answer in our ring
    /// (the session's requests were all eager: nothing covered them before). A failure is
    /// logged and not tried again: the pieces wait for reposts on RNR retry instead.
    #[cold]
    #[inline(never)]
    fn cover_recv_bulk(&mut self) {
        if let Err(s) = self.cover_recv(false, true) {
            tracing::warn!(
                peer = %self.peer,
                error = %s.message(),
                "answers in pieces wait for receive buffers (RNR retry)"
            );
            self.recv_bulk = true;
        }
    }

    /// Encodes a request body where it can go now: the eager area, the server's ring (through
    /// the mirror), or the staging area. `None` when it is above the eager threshold and neither
    /// the ring nor the staging area has room.
    ///
    /// # Errors
    /// As [`ClientCore::start_with`]'s; INTERNAL ([`ClientCore::mismatch`]) when the message does not
    /// encode to its `encoded_len`: nothing is taken (the send buffer is given back, the ring
    /// range reserved for it taken back, the staging area not committed).
    fn place<M: Message>(
        &mut self,
        req: &M,
        len: usize,
        eager: bool,
        stalled: &mut bool,
        deadline: Option<Instant>,
        blocking: bool,
    ) -> Result<Option<PendingBody>, Status> {
        let now = self.conn.session.call_goes_now();
        Ok(if eager || now {
            let mut buf = loop {
                if let Some(b) = self.conn.acquire(&mut self.pool) {
                    break b;
                }
                if !blocking {
                    return Ok(None);
                }
                self.wait_step(deadline)?;
            };
            match self.conn.session.place_body(len) {
                Ok(Placement::Eager) => {
                    let dst = &mut self.pool.buf_mut(&mut buf)[HEADER_LEN..HEADER_LEN + len];
                    if let Err(e) = encode_exact(req, dst) {
                        self.conn.give_back(&mut self.pool, buf);
                        return Err(self.mismatch(e, "request"));
                    }
                    Some(PendingBody::Placed(buf, BodyAt::Eager(len as u32)))
                }
                Ok(Placement::Ring(off)) => {
                    if let Err(e) = encode_exact(req, self.conn.mirror_range_mut(off, len as u32)) {
                        // Reserved just now, nothing placed since: the range is free again.
                        self.conn.session.unplace_body();
                        self.conn.give_back(&mut self.pool, buf);
                        return Err(self.mismatch(e, "request"));
                    }
                    Some(PendingBody::Placed(buf, BodyAt::Ring { offset: off, len: len as u32 }))
                }
                Ok(Placement::Pieces) | Err(_) => {
                    self.conn.give_back(&mut self.pool, buf);
                    if !std::mem::replace(stalled, true) {
                        self.counters.ring_full_stalls += 1;
                    }
                    self.stage(req, len)?
                }
            }
        } else {
            self.stage(req, len)?
        })
    }

    /// Encodes a body above the eager threshold that cannot go into the peer's ring now into the
    /// staging area (one copy, no allocation); `None` when it has no room for it.
    ///
    /// # Errors
    /// INTERNAL ([`ClientCore::mismatch`]) when the message does not encode to `len` bytes
    /// (nothing is committed).
    fn stage<M: Message>(&mut self, req: &M, len: usize) -> Result<Option<PendingBody>, Status> {
        let (at, spare) = self.conn.staging_spare_mut();
        let Some(dst) = spare.get_mut(..len) else { return Ok(None) };
        if let Err(e) = encode_exact(req, dst) {
            return Err(self.mismatch(e, "request"));
        }
        Ok(Some(match self.conn.staging_commit(at, len as u32) {
            Some(s) => PendingBody::Staged(s),
            // Not a span of the staging area (unreachable: `spare_mut` gave it).
            None => PendingBody::Heap(Box::new(req.encode_to_vec().into())),
        }))
    }

    /// The error of a message (`what`: "request", "stream message") whose `Message::encode_raw`
    /// wrote more or fewer bytes than its `encoded_len` gave (a hand-written `Message`; generated
    /// code never does), counted: INTERNAL, as gRPC implementations answer an encoding failure
    /// (tonic's `Status::internal`), since the fault is in the program, not in the request's
    /// values. Nothing of the message was sent; the session is untouched.
    #[cold]
    fn mismatch(&mut self, e: LenMismatch, what: &str) -> Status {
        self.counters.status(Code::Internal);
        e.status(what)
    }

    /// Sends queued calls while credits allow, then what ring space allows of bodies on the heap.
    /// Inlined check first: after most completions nothing waits (a few compares, not a call).
    #[inline(always)]
    fn pump(&mut self) {
        if self.conn.session.calls().queued() > 0
            || !self.outbox.is_empty()
            || self.stream_batch.is_some()
            || !self.stream_ends.is_empty()
            || !self.stream_cancels.is_empty()
        {
            self.pump_slow();
        }
    }

    #[inline(never)]
    fn pump_slow(&mut self) {
        while let Some(h) = self.conn.session.next_request(Instant::now) {
            let Some(body) = self.pending[h.slot as usize].take() else { continue };
            if h.metadata_cache == crate::wire::METADATA_CACHED {
                self.counters.metadata_cached += 1;
            }
            match body {
                PendingBody::Placed(buf, body) => self.conn.queue(&mut self.pool, buf, h, body),
                PendingBody::Staged(body) => self.outbox.push(Waiting::Body(Outgoing::staged(h, body))),
                PendingBody::Heap(body) => self.outbox.push(Waiting::Body(Outgoing::new(h, *body))),
            }
        }
        if self.conn.session.calls().credit_stalled() {
            self.counters.credit_stalls += 1;
        }
        // Requests leave in order; one abandoned while it was leaving gets its Cancel after its
        // last piece (the session's rule: `Outbox::sent`).
        if !self.outbox.is_empty() {
            let mut failed = Vec::new();
            send_waiting(
                &mut self.conn,
                &mut self.pool,
                &mut self.outbox,
                TAG,
                |_, _, _| {},
                |_| {},
                |h, s| {
                    failed.push((h.slot, h.generation, s));
                },
            );
            for (slot, generation, s) in failed {
                // Unreachable: a stream message above the threshold registers them before it
                // is queued (`ClientCore::stream_send`, which fails the send) and a client never
                // gives them back. Were one queued without them, its stream is cancelled rather
                // than left waiting for memory that will not come.
                tracing::warn!(call_slot = slot, status = %s, "a stream message that cannot be sent cancels its stream");
                self.abandon_stream(CallId { slot, generation, deadline: None });
            }
        }
        if self.stream_batch.is_some() {
            self.send_batch();
        }
        if !self.stream_ends.is_empty() || !self.stream_cancels.is_empty() {
            self.send_stream_controls();
        }
    }

    /// Sends the open batch of stream messages when its stream has a credit (it takes one).
    fn send_batch(&mut self) {
        let Some(b) = &self.stream_batch else { return };
        match self.conn.session.stream_send(b.slot, b.generation) {
            Ok(false) => return,
            Ok(true) => {}
            // Over (answered) or ended: its messages go nowhere.
            Err(_) => {
                if let Some(b) = self.stream_batch.take() {
                    self.conn.give_back(&mut self.pool, b.buf);
                }
                return;
            }
        }
        if let Some(b) = self.stream_batch.take() {
            self.queue_batch(b);
        }
    }

    /// Queues an open batch as one SEND (its stream's credit taken already).
    fn queue_batch(&mut self, b: OpenBatch) {
        let h = Header {
            slot: b.slot,
            generation: b.generation,
            stream: crate::wire::STREAM_BATCH,
            count: b.count,
            ..Header::new(Kind::StreamMsg)
        };
        self.conn.queue(&mut self.pool, b.buf, h, BodyAt::Eager(b.len));
    }

    /// Frames `msg` (`len` bytes encoded) into the open batch of stream `id`, opening one when
    /// none is: false when it does not fit (an eager buffer), another stream's batch is open,
    /// the outbox holds messages (they go first), or no send buffer is free.
    ///
    /// # Errors
    /// [`LenMismatch`] when `msg` does not encode to `len` bytes (the batch is as it was).
    fn batch_append<M: Message>(&mut self, id: CallId, msg: &M, len: usize) -> Result<bool, LenMismatch> {
        self.batch_append_with(id, len, |body| encode_exact(msg, body))
    }

    /// [`ClientCore::batch_append`] of a message `write` puts into the `len` bytes it is given.
    ///
    /// # Errors
    /// `write`'s, after which the batch is as it was (the frame is not counted).
    fn batch_append_with(
        &mut self,
        id: CallId,
        len: usize,
        write: impl FnOnce(&mut [u8]) -> Result<(), LenMismatch>,
    ) -> Result<bool, LenMismatch> {
        use crate::wire::{FRAME_LEN, MAX_BATCH};
        let cap = (self.conn.session.params().eager_threshold as usize).min(self.conn.body_cap);
        if self.stream_batch.is_none() {
            if !self.outbox.is_empty() || FRAME_LEN + len > cap {
                return Ok(false);
            }
            let Some(buf) = self.conn.acquire(&mut self.pool) else { return Ok(false) };
            self.stream_batch =
                Some(OpenBatch { slot: id.slot, generation: id.generation, buf, len: 0, count: 0 });
        }
        let Some(b) = self.stream_batch.as_mut() else { return Ok(false) };
        if (b.slot, b.generation) != (id.slot, id.generation)
            || b.len as usize + FRAME_LEN + len > cap
            || b.count == MAX_BATCH
        {
            return Ok(false);
        }
        let at = HEADER_LEN + b.len as usize;
        let dst = &mut self.pool.buf_mut(&mut b.buf)[at..at + FRAME_LEN + len];
        dst[..FRAME_LEN].copy_from_slice(&(len as u32).to_le_bytes());
        // Counted only once written whole: a message that did not encode leaves nothing, and a
        // batch opened for it goes back (an empty batch is never sent).
        if let Err(e) = write(&mut dst[FRAME_LEN..]) {
            if b.count == 0 {
                if let Some(b) = self.stream_batch.take() {
                    self.conn.give_back(&mut self.pool, b.buf);
                }
            }
            return Err(e);
        }
        b.len += (FRAME_LEN + len) as u32;
        b.count += 1;
        Ok(true)
    }

    /// True while the open batch holds messages of the stream `(slot, generation)`.
    fn batch_holds(&self, slot: u16, generation: u32) -> bool {
        self.stream_batch.as_ref().is_some_and(|b| (b.slot, b.generation) == (slot, generation))
    }

    /// Sends the StreamEnd of each stream whose caller ended it, and the Cancel of each stream
    /// cancelled while its messages were leaving, once nothing of the stream waits.
    #[cold]
    fn send_stream_controls(&mut self) {
        let mut i = 0;
        while i < self.stream_ends.len() {
            let (slot, generation) = self.stream_ends[i];
            if self.pending[slot as usize].is_some()
                || self.outbox.holds(slot, generation)
                || self.batch_holds(slot, generation)
            {
                i += 1;
                continue;
            }
            // Refused when the stream ended meanwhile (answered): nothing to end then.
            let _ = self.conn.session.stream_end(slot, generation);
            self.stream_ends.swap_remove(i);
        }
        let mut i = 0;
        while i < self.stream_cancels.len() {
            let (slot, generation) = self.stream_cancels[i];
            if self.outbox.holds(slot, generation) {
                i += 1;
                continue;
            }
            self.conn.session.request_left(slot, generation);
            self.stream_cancels.swap_remove(i);
        }
    }

    /// Posts queued sends and due receive reposts. Inlined check first: an empty poll with
    /// nothing queued (the common case while waiting) costs a few compares, not a call.
    #[inline(always)]
    pub(crate) fn flush(&mut self) {
        if self.conn.session.ring_freed()
            || !self.conn.sq.is_empty()
            || self.conn.session.has_control()
            || self.conn.session.lease_pending()
            || self.recv.pending_reposts() >= REPOST_BATCH
        {
            self.flush_slow();
        }
    }

    #[inline(never)]
    fn flush_slow(&mut self) {
        // Messages are stamped with the freed head when queued: bytes still unreported are
        // carried by none of the pending ones (they were queued before the release); whether
        // they are worth a message of their own is the session's rule.
        if self.conn.session.take_ring_return() {
            self.conn.queue_ring_return(&mut self.pool);
        }
        self.conn.queue_controls(&mut self.pool);
        if let Err(e) = self.conn.flush(&mut self.pool, TAG) {
            self.break_conn(unavailable(format!("posting sends: {e}")));
        }
        if let Err(e) = self.recv.flush_batched(REPOST_BATCH) {
            self.break_conn(unavailable(format!("posting receives: {e}")));
        }
    }

    /// The connection is gone: every call ends with `status`, the QP goes to ERR.
    fn break_conn(&mut self, status: Status) {
        if self.broken.is_some() {
            return;
        }
        let _span = tracing::info_span!("disconnect", peer = %self.peer).entered();
        tracing::info!(%status, "client session closed");
        // Each failed call is counted when its caller takes the answer.
        self.conn.session.fail_calls();
        // A stream whose end arrived before the Close keeps the messages its reader has not
        // taken: they came before that end, and the reader takes them, then the end. (A server
        // that ended a stream and closed the session at once, as a draining one does, lost the
        // stream's last messages while the stream still ended OK.) The other streams' messages
        // go with their calls.
        for (q, answer) in self.stream_msgs.iter_mut().zip(&self.answers) {
            if answer.is_some() {
                continue;
            }
            for a in std::mem::take(q) {
                if let Answer::Eager(b) | Answer::Batch { buf: b, .. } = a {
                    self.recv.repost(b);
                }
            }
        }
        for (i, a) in self.answers.iter_mut().enumerate() {
            if a.is_none() && self.conn.session.calls().state(i as u16) == crate::session::SlotState::Done {
                *a = Some(Answer::Err(status.clone()));
            }
        }
        for i in 0..self.pending.len() {
            if let Some(p) = self.pending[i].take() {
                self.drop_pending(p);
            }
        }
        self.outbox.drain().for_each(drop);
        if let Some(b) = self.stream_batch.take() {
            self.conn.give_back(&mut self.pool, b.buf);
        }
        let _ = self.conn.qp.modify(&QpAttr::new(QpState::Err));
        // WRs not posted give their buffers back; posted ones keep theirs until the connection
        // is dropped (QP first): moving the QP to ERR does not prove the NIC is done with them.
        self.conn.sq.discard_pending(&mut self.pool);
        self.counters.sessions_closed += 1;
        self.counters.control_connections = 0;
        self.counters.sessions_detached = 0;
        self.counters.sessions_shm = 0;
        self.tcp = None;
        self.broken = Some(status);
    }

    /// Gives back what a call that never went on the wire holds.
    fn drop_pending(&mut self, p: PendingBody) {
        match p {
            PendingBody::Placed(buf, _) => self.conn.give_back(&mut self.pool, buf),
            PendingBody::Staged(s) => self.conn.areas.release_staged(s),
            PendingBody::Heap(_) => {}
        }
    }

    /// Polls the send CQ (when a peek sees something) and the endpoint's receive side once, and
    /// handles what completed. Returns how many completions there were. Inlined up to the polls:
    /// an empty one (as many as the others while a call waits) costs no call of its own.
    #[inline(always)]
    pub(crate) fn progress(&mut self) -> usize {
        self.progress_with(false)
    }

    /// [`ClientCore::progress`]; `idle`: for an idle look, whose poll of the endpoint's
    /// receive side leaves the CQ to its drivers while they poll it ([`SessionRx::poll_idle`]).
    #[inline(always)]
    fn progress_with(&mut self, idle: bool) -> usize {
        if self.broken.is_some() {
            return 0;
        }
        let sends = if self.cq.maybe_ready() {
            match self.wcs.poll(&self.cq) {
                Ok(n) => n,
                Err(e) => {
                    self.break_conn(unavailable(format!("completion queue: {e}")));
                    return 0;
                }
            }
        } else {
            0
        };
        let recvs = match if idle { self.recv.poll_idle() } else { self.recv.poll() } {
            Ok(n) => n,
            Err(e) => {
                self.break_conn(unavailable(format!("receive completion queue: {e}")));
                return 0;
            }
        };
        if sends + recvs == 0 {
            // Messages beyond its share that arrived while nobody drove it were given back: it
            // closes now, whether or not others wait in its inbox.
            if self.recv.overran() > 0 {
                self.overran();
            }
            self.flush();
            return 0;
        }
        self.completed(sends + recvs)
    }

    /// Handles the `n` completions [`ClientCore::progress`] polled (at least 1): the sends', then
    /// the messages, in arrival order.
    #[inline(never)]
    fn completed(&mut self, n: usize) -> usize {
        while let Some(c) = self.wcs.next() {
            self.on_completion(c);
        }
        while let Some(r) = self.recv.next() {
            self.on_receive(r);
        }
        if self.recv.overran() > 0 {
            self.overran();
        }
        // While an answer arrives in pieces, ring space this batch freed goes back to the
        // server (a RingReturn when due) before this end copies its own pieces: the server's
        // next pieces wait for it, and it would otherwise leave behind every WRITE `pump`
        // queues. (Otherwise the next request carries the freed head: no extra message.)
        if self.conn.session.assemblies() > 0 {
            self.flush();
        }
        self.pump();
        self.flush();
        n
    }

    /// A send completion (the send CQ holds nothing else).
    fn on_completion(&mut self, c: Completion) {
        let status = c.wc().status;
        if c.send_tag().is_some() {
            if !status.is_success() {
                self.break_conn(unavailable(format!("send failed ({status}): the server is gone")));
                return;
            }
            self.conn.on_send_completion(&mut self.pool, c);
        }
    }

    /// The server sent more messages to this session than its calls may bring at once
    /// ([`recv_need`]) while its driver was away: they went back to the endpoint's SRQ unread
    /// (so that its other sessions' answers find buffers), and the session closes.
    #[cold]
    #[inline(never)]
    fn overran(&mut self) {
        if self.broken.is_none() {
            self.counters.metered += 1;
            let reason = format!(
                "the server sent {} messages beyond what the session's calls may bring at once \
                 while it was not driven (its share of the endpoint's receive buffers)",
                self.recv.overran()
            );
            tracing::warn!(peer = %self.peer, %reason, "closing the session");
            self.break_conn(unavailable(format!("connection closed: {reason}")));
        }
    }

    /// A message (a receive completion taken for this session).
    fn on_receive(&mut self, r: Received) {
        let Received { status, invalidated, buf } = r;
        if !status.is_success() {
            self.recv.repost(buf);
            self.break_conn(unavailable(format!("receive failed ({status})")));
            return;
        }
        let msg = self.recv.bytes(&buf);
        let overlong = !self.recv.fits(&buf);
        // Decoded in place (no header copied through a `Result`).
        let mut h = Header::new(Kind::Response);
        let ring = match self.conn.session.receive_into(msg, overlong, invalidated, Instant::now, &mut h) {
            Ok(ring) => ring,
            Err(reason) => {
                self.recv.repost(buf);
                self.malformed(reason);
                return;
            }
        };
        // A ring body is copied out at once (the server could rewrite the ring) and its space
        // freed; the response is complete with its last piece (whose header it takes).
        let body = match ring {
            None => Answer::Eager(buf),
            Some(piece) => {
                self.recv.repost(buf);
                if !self.recv_bulk {
                    self.cover_recv_bulk();
                }
                match self.conn.take_piece(piece) {
                    // Refused over ClientConfig::max_reassembly_bytes: the call ends so.
                    Ok(Some(crate::session::Complete { header, refused: Some(s), .. })) => {
                        h = header;
                        Answer::Err(s)
                    }
                    Ok(Some(c)) => {
                        h = c.header;
                        Answer::Owned(c.body)
                    }
                    Ok(None) => return,
                    Err(reason) => {
                        self.malformed(format!("protocol violation: {reason}"));
                        return;
                    }
                }
            }
        };
        match h.kind {
            Kind::Response => {
                self.counters.bytes_in += u64::from(h.body_len);
                let answer = if h.metadata {
                    // The message or the status after the blocks (responses with metadata only).
                    self.split_metadata(&h, body)
                } else if h.status == Code::Ok || matches!(body, Answer::Err(_)) {
                    body
                } else {
                    let text = match &body {
                        Answer::Eager(b) => {
                            String::from_utf8_lossy(self.recv.bytes(b).get(HEADER_LEN..).unwrap_or(&[]))
                                .into_owned()
                        }
                        Answer::Owned(v) => String::from_utf8_lossy(v).into_owned(),
                        Answer::Err(_) | Answer::Batch { .. } => String::new(),
                    };
                    self.release(body);
                    // An unknown method's UNIMPLEMENTED names the method (on this error's path only).
                    Answer::Err(super::names::answer_status(h.status, text, h.method))
                };
                match self.conn.session.on_response(h.slot, h.generation) {
                    Ok(ResponseFate::Stored) => {
                        // The slot's answer was taken before it was reused: nothing to drop.
                        if let Some(stale) = self.answers[h.slot as usize].replace(answer) {
                            self.release(stale);
                        }
                    }
                    Ok(ResponseFate::Discard(())) => {
                        self.counters.late_replies += 1;
                        self.release(answer);
                    }
                    Err(reason) => {
                        self.release(answer);
                        self.malformed(format!("protocol violation: {reason}"));
                    }
                }
            }
            Kind::Close => {
                let status = self.close_status(h.status, &body);
                self.release(body);
                self.break_conn(status);
            }
            Kind::RingGrant => self.on_ring_grant(&h, body),
            // The session releases the ring with the next flush, once none of our WRITEs into
            // it is in flight; the ask and release a server never sends (the session refused
            // them).
            Kind::RingReclaim | Kind::RingAsk | Kind::RingRelease => self.release(body),
            // The session took the new credits (queued calls start with the next send; a
            // lowering stops new starts) and sends the CreditAck once the calls in flight fit;
            // an acknowledgement a server never sends (the session refused it).
            Kind::CreditGrant | Kind::CreditAck => self.release(body),
            // A Ping made a Pong due (sent with the next flush); a CancelAck may have freed an
            // abandoned call's slot and credit (the session's); the rest only carried the freed
            // head (the session refused a Request or a Cancel).
            Kind::RingReturn | Kind::Ping | Kind::Pong | Kind::CancelAck | Kind::Request | Kind::Cancel => {
                self.release(body)
            }
            // The session checked it belongs to an open stream of this slot, within its credits.
            Kind::StreamMsg => {
                self.counters.bytes_in += u64::from(h.body_len);
                if self.conn.session.calls().state(h.slot) == crate::session::SlotState::InFlight {
                    let body = if h.metadata {
                        self.stream_headers(&h, body)
                    } else {
                        match body {
                            Answer::Eager(buf) if h.stream & crate::wire::STREAM_BATCH != 0 => {
                                Answer::Batch { buf, at: 0, left: h.count }
                            }
                            other => other,
                        }
                    };
                    self.stream_msgs[h.slot as usize].push_back(body);
                } else {
                    // Abandoned: dropped, its credit returned so the server reaches the Cancel.
                    self.release(body);
                    self.conn.session.stream_consumed(h.slot, h.generation);
                }
            }
            // Credits changed the session's state; a stream end is refused by the session.
            Kind::StreamEnd | Kind::StreamGrant => self.release(body),
        }
    }

    /// Splits a response's metadata blocks off its body ([`crate::ResponseMetadata`]): into the
    /// call's capture, if it has one, and, for an error, into its status (with the details
    /// trailer as the status's details). The rest is the message, copied out (responses with
    /// metadata only), or the status. Blocks over `ClientConfig::max_metadata_bytes` or
    /// malformed ones fail the call (RESOURCE_EXHAUSTED, INTERNAL).
    #[cold]
    fn split_metadata(&mut self, h: &Header, body: Answer) -> Answer {
        let Some(bytes) = self.body_of(&body) else { return body };
        let split = crate::metadata::ResponseMetadata::split(bytes, self.max_metadata);
        let answer = match split {
            Err(s) => Answer::Err(s),
            Ok((md, at)) => {
                let rest = &bytes[at..];
                let answer = if h.status == Code::Ok {
                    Answer::Owned(rest.to_vec())
                } else {
                    let text = String::from_utf8_lossy(rest).into_owned();
                    let mut s = super::names::answer_status(h.status, text, h.method);
                    for (k, v) in md.headers().iter().chain(md.trailers().iter()) {
                        // Checked by the split.
                        let _ = match v {
                            crate::MetadataValue::Ascii(a) => s.metadata_mut().insert(k, a),
                            crate::MetadataValue::Binary(b) if k == crate::status::DETAILS_KEY => {
                                s.set_details(b.to_vec());
                                Ok(())
                            }
                            crate::MetadataValue::Binary(b) => s.metadata_mut().insert_bin(k, b),
                        };
                    }
                    Answer::Err(s)
                };
                if let Some((g, c)) = &self.captures[h.slot as usize] {
                    if *g == h.generation {
                        c.fill(md);
                    }
                }
                answer
            }
        };
        self.release(body);
        answer
    }

    /// A server stream message that starts with the stream's response headers
    /// ([`crate::wire::METADATA`]): the headers go into the call's capture, if it has one; the
    /// rest is the message (copied out when it came in an eager buffer) or the batch, read from
    /// past the block. Headers over `ClientConfig::max_metadata_bytes` or malformed ones give
    /// the stream an error in place of the SEND's messages (RESOURCE_EXHAUSTED, INTERNAL).
    #[cold]
    fn stream_headers(&mut self, h: &Header, body: Answer) -> Answer {
        let Some(bytes) = self.body_of(&body) else { return body };
        let (md, at) = match crate::metadata::Metadata::split(bytes, self.max_metadata) {
            Ok(split) => split,
            Err(s) => {
                let s = if s.code() == Code::ResourceExhausted {
                    Status::resource_exhausted(format!(
                        "the stream's response headers are over the client's limit of {} bytes \
                         (ClientConfig::max_metadata_bytes)",
                        self.max_metadata
                    ))
                } else {
                    Status::internal(format!("the stream's response headers: {}", s.message()))
                };
                self.release(body);
                return Answer::Err(s);
            }
        };
        if let Some((g, c)) = &self.captures[h.slot as usize] {
            if *g == h.generation {
                c.fill_headers(md);
            }
        }
        match body {
            // The session checked the frames past the block.
            Answer::Eager(buf) if h.stream & crate::wire::STREAM_BATCH != 0 => {
                Answer::Batch { buf, at: at as u32, left: h.count }
            }
            Answer::Eager(buf) => {
                let message = self.recv.bytes(&buf).get(HEADER_LEN + at..).unwrap_or(&[]).to_vec();
                self.recv.repost(buf);
                Answer::Owned(message)
            }
            Answer::Owned(mut v) => {
                v.drain(..at);
                Answer::Owned(v)
            }
            other => other,
        }
    }

    /// The body bytes of a received message, whole (an eager buffer's past the header, or the
    /// bytes copied out of the ring); `None` for an error or a batch being read.
    fn body_of<'a>(&'a self, body: &'a Answer) -> Option<&'a [u8]> {
        match body {
            Answer::Eager(b) => Some(self.recv.bytes(b).get(HEADER_LEN..).unwrap_or(&[])),
            Answer::Owned(v) => Some(v.as_slice()),
            Answer::Err(_) | Answer::Batch { .. } => None,
        }
    }

    /// The call `id` puts its response's metadata into `into` ([`crate::CallOptions::capture_metadata`]).
    #[cold]
    pub(crate) fn capture(&mut self, id: CallId, into: &crate::metadata::CapturedMetadata) {
        if let Some(c) = self.captures.get_mut(id.slot as usize) {
            into.begin();
            *c = Some((id.generation, into.clone()));
        }
    }

    /// The server's answer to our RingAsk (protocol 12; the session checked we asked): the
    /// ring granted, which the bodies waiting for it now go into, or the refusal, which fails
    /// the next body that looks for the ring (`Session::ask_peer_ring`). A grant that does not
    /// decode, or of another length than the handshake's, breaks the connection.
    #[cold]
    #[inline(never)]
    fn on_ring_grant(&mut self, h: &Header, body: Answer) {
        if h.status != Code::Ok {
            let reason = match &body {
                Answer::Eager(b) => {
                    crate::wire::close_reason(self.recv.bytes(b).get(HEADER_LEN..).unwrap_or(&[]))
                }
                _ => String::new(),
            };
            self.release(body);
            let status = Status::new(h.status, format!("the server refused a receive ring: {reason}"));
            self.conn.session.ring_refused();
            self.fail_ring_bodies(&status);
            return;
        }
        let grant = match &body {
            Answer::Eager(b) => crate::wire::ring_lease::RingGrant::decode(
                self.recv.bytes(b).get(HEADER_LEN..).unwrap_or(&[]),
            )
            .map_err(|e| e.to_string()),
            _ => Err("a ring grant's body is eager".to_owned()),
        };
        self.release(body);
        match grant.and_then(|g| self.conn.session.ring_granted(g.len).map(|()| g).map_err(str::to_owned)) {
            Ok(g) => {
                self.conn.set_peer_ring(g.addr, g.rkey);
                self.pump();
            }
            Err(reason) => self.malformed(format!("protocol violation: {reason}")),
        }
    }

    /// The server refused its ring: the calls whose requests wait for it (untouched, in the
    /// outbox) end with `status` as if the server had answered them so (their credits return;
    /// the server never saw them), and a stream message waiting at the front fails its stream.
    /// Bodies still waiting for a credit ask again when they go.
    #[cold]
    fn fail_ring_bodies(&mut self, status: &Status) {
        for out in self.outbox.take_unsent_requests() {
            let (slot, generation) = (out.header.slot, out.header.generation);
            out.discard(&mut self.conn.areas);
            self.counters.status(status.code());
            if let Ok(ResponseFate::Stored) = self.conn.session.on_response(slot, generation) {
                if let Some(stale) = self.answers[slot as usize].replace(Answer::Err(status.clone())) {
                    self.release(stale);
                }
            }
        }
        let front = self.outbox.front_header().filter(|h| h.kind == Kind::StreamMsg);
        if let Some(h) = front {
            let (taken, end) = self.outbox.fail_stream(status.clone());
            for m in taken {
                m.discard(&mut self.conn.areas);
            }
            if end.is_some() {
                self.counters.status(status.code());
                self.abandon_stream(CallId { slot: h.slot, generation: h.generation, deadline: None });
            }
        }
    }

    /// What the calls of a session the server closed end with: the Close's status (UNAVAILABLE
    /// when it gave none) and its reason, read as untrusted text (bounded, lossy UTF-8, no
    /// control characters: `wire::close_reason`).
    #[cold]
    fn close_status(&self, code: Code, body: &Answer) -> Status {
        let code = if code == Code::Ok { Code::Unavailable } else { code };
        let reason = match body {
            Answer::Eager(b) => {
                crate::wire::close_reason(self.recv.bytes(b).get(HEADER_LEN..).unwrap_or(&[]))
            }
            _ => String::new(),
        };
        if reason.is_empty() {
            Status::new(code, "the server closed the session")
        } else {
            Status::new(code, format!("the server closed the session: {reason}"))
        }
    }

    fn malformed(&mut self, reason: String) {
        tracing::warn!(peer = %self.peer, %reason, "closing the session");
        self.counters.malformed += 1;
        self.break_conn(unavailable(format!("connection closed: {reason}")));
    }

    /// Decodes a finished call's answer and releases its buffers.
    fn finish<R: Message + Default>(&mut self, a: Answer) -> Result<R, Status> {
        let r = self.decode(a);
        self.counters.rpcs += 1;
        self.counters.status(r.as_ref().err().map_or(Code::Ok, Status::code));
        r
    }

    /// Decodes an answer or a stream message and releases its buffers.
    fn decode<R: Message + Default>(&mut self, a: Answer) -> Result<R, Status> {
        let undecodable = |e: prost::DecodeError| {
            Status::internal(format!(
                "undecodable response {}: {}",
                std::any::type_name::<R>(),
                crate::dispatch::service::decode_error_text(&e)
            ))
        };
        let r = match a {
            Answer::Err(s) => Err(s),
            // `bytes` fields become slices of this buffer: no second copy.
            Answer::Owned(body) => R::decode(self.conn.session.body_bytes(body)).map_err(undecodable),
            Answer::Eager(buf) => {
                let r =
                    R::decode(self.recv.bytes(&buf).get(HEADER_LEN..).unwrap_or(&[])).map_err(undecodable);
                self.recv.repost(buf);
                r
            }
            // Batches are taken message by message (`next_stream_msg`).
            Answer::Batch { buf, .. } => {
                self.recv.repost(buf);
                Err(Status::internal("a stream batch taken as one message"))
            }
        };
        r
    }

    /// Gives an answer's receive buffer back (an owned body is simply dropped).
    fn release(&mut self, a: Answer) {
        if let Answer::Eager(b) | Answer::Batch { buf: b, .. } = a {
            self.recv.repost(b);
        }
    }

    /// The stream `id`'s next received message, decoded; its credit returns with the last
    /// message of its SEND (a batch's buffer stays until its last message is taken).
    fn next_stream_msg<R: Message + Default>(&mut self, id: CallId) -> Option<Result<R, Status>> {
        let q = &mut self.stream_msgs[id.slot as usize];
        match q.pop_front()? {
            Answer::Batch { buf, at, left } => {
                let body = self.recv.bytes(&buf).get(HEADER_LEN..).unwrap_or(&[]);
                // The session checked the frames: a missing one only ends the batch early.
                let frame = crate::wire::frame_at(body, at as usize);
                let r = frame.map(|(s, e)| {
                    R::decode(&body[s..e]).map_err(|e| {
                        Status::internal(format!(
                            "undecodable response {}: {}",
                            std::any::type_name::<R>(),
                            crate::dispatch::service::decode_error_text(&e)
                        ))
                    })
                });
                match frame {
                    Some((_, end)) if left > 1 => {
                        q.push_front(Answer::Batch { buf, at: end as u32, left: left - 1 })
                    }
                    _ => {
                        self.recv.repost(buf);
                        self.conn.session.stream_consumed(id.slot, id.generation);
                    }
                }
                r.or_else(|| self.next_stream_msg(id))
            }
            a => {
                self.conn.session.stream_consumed(id.slot, id.generation);
                Some(self.decode::<R>(a))
            }
        }
    }

    /// One step of waiting: progress; when idle, check the deadline, the TCP liveness channel, and
    /// spin/yield/block per the polling policy.
    pub(crate) fn wait_step(&mut self, deadline: Option<Instant>) -> Result<(), Status> {
        if let Some(s) = &self.broken {
            return Err(s.clone());
        }
        if self.progress() > 0 {
            self.idle.reset();
            return Ok(());
        }
        self.note_empty();
        if let Some(d) = deadline {
            if Instant::now() >= d {
                return Err(Status::deadline_exceeded("deadline passed before the call could be sent"));
            }
        }
        self.pause();
        Ok(())
    }

    /// An empty poll: counted; the timers and the TCP channel are checked when the session's
    /// rule says so ([`Tick`]: by time, the clock read once per 4096 such polls).
    #[inline]
    fn note_empty(&mut self) {
        self.idle.note_empty();
        if self.tick.spun(Instant::now) {
            self.check_liveness();
        }
    }

    /// Spins, yields or blocks per the polling policy after an empty poll. A yield or an event
    /// wait can last milliseconds, so it weighs more in the same rule ([`Tick::slept`]: the
    /// clock is read once per 16 of them; once per 256 event waits that a completion ended,
    /// [`Tick::woken`]).
    /// True when it yielded or blocked ([`Idle::pause`]).
    fn pause(&mut self) -> bool {
        // Answers complete on the receive CQ (an event-waiting session's own: `endpoint::rx`).
        let cq = self.recv.cq();
        let mut woken = false;
        let slept = self.idle.pause(
            || cq.req_notify(false).ok().map(|()| cq.maybe_ready()),
            || woken = cq.wait(Some(EVENT_WAIT)).unwrap_or(false),
        );
        if slept {
            // A wait ended by a completion event weighs less ([`Tick::woken`]).
            let due = if woken { self.tick.woken(Instant::now) } else { self.tick.slept(Instant::now) };
            if due {
                self.check_liveness();
            }
        }
        slept
    }

    #[cold]
    #[inline(never)]
    fn check_liveness(&mut self) {
        self.check_timers();
        if self.broken.is_some() {
            return;
        }
        // Read, not peek: nothing is defined after the handshake, so stray bytes are consumed and
        // dropped; a peek would see them forever and never notice the connection closing.
        let Some(tcp) = &self.tcp else { return };
        let mut b = [0u8; 64];
        match (&*tcp).read(&mut b) {
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
            Ok(n) if n > 0 => {}
            end => {
                // Let what already arrived (a Close, responses) be handled first.
                while self.progress() > 0 {}
                let why = match end {
                    Ok(_) => "the server closed the connection".to_string(),
                    // ETIMEDOUT here is TCP keepalive or TCP_USER_TIMEOUT giving up on the host.
                    Err(e) => format!("the control connection failed: {e} (ClientConfig::peer_timeout)"),
                };
                self.break_conn(unavailable(why));
            }
        }
    }

    /// The session's timers (the idle probe): a Ping when the server has been silent for a third
    /// of `peer_timeout` while calls wait for it, the session closed after all of it.
    fn check_timers(&mut self) {
        let waiting = self.conn.session.calls().in_flight() > 0;
        self.conn.session.handle_timeout(Instant::now(), waiting);
        while let Some(e) = self.conn.session.poll_event() {
            let status = match e {
                Event::PeerDead { silent } => {
                    self.counters.peers_lost += 1;
                    unavailable(format!(
                        "no message from the server for {} ms while calls waited (ClientConfig::peer_timeout)",
                        silent.as_millis()
                    ))
                }
                Event::Unacknowledged { abandoned, waited } => unavailable(format!(
                    "{abandoned} abandoned calls and no acknowledgement from the server for {} ms \
                     (ClientConfig::max_abandoned)",
                    waited.as_millis()
                )),
                // The server holds this end's memory with an answer it does not finish.
                Event::ReassemblyExpired { waited } => Status::resource_exhausted(format!(
                    "an answer arriving in pieces did not finish within {} ms \
                     (ClientConfig::reassembly_timeout)",
                    waited.as_millis()
                )),
                // Server events: never reported to a client.
                Event::Cancelled { .. }
                | Event::Expired { .. }
                | Event::Refused { .. }
                | Event::Overran { .. } => continue,
            };
            tracing::warn!(peer = %self.peer, %status, "resetting the session");
            self.break_conn(status);
            return;
        }
        self.flush();
    }

    /// Polls a call once: its result when finished (or failed), `None` while it runs.
    pub(crate) fn poll_call<R: Message + Default>(&mut self, id: CallId) -> Option<Result<R, Status>> {
        match self.poll_answer(id, 0) {
            Ok(Some(a)) => Some(self.finish(a)),
            Ok(None) => None,
            Err(s) => Some(Err(s)),
        }
    }

    /// [`ClientCore::poll_call`] up to the answer, not decoded (not generic over the response
    /// type: one copy of the waiting loop for every method). `Err` when the deadline passed,
    /// which is looked at (a clock read) when `spins`, the polls since the caller last gave up
    /// its core, is a multiple of [`DEADLINE_SPINS`] (0 every time: always).
    #[inline(always)]
    fn poll_answer(&mut self, id: CallId, spins: u32) -> Result<Option<Answer>, Status> {
        if let Some(a) = self.take_answer(id) {
            return Ok(Some(a));
        }
        if self.progress() > 0 {
            self.idle.reset();
            if let Some(a) = self.take_answer(id) {
                return Ok(Some(a));
            }
        } else {
            self.note_empty();
        }
        if spins % DEADLINE_SPINS == 0 {
            self.check_deadline(id)?;
        }
        Ok(None)
    }

    /// DEADLINE_EXCEEDED (the call abandoned, counted) when `id`'s deadline passed (a clock
    /// read for a call with one).
    #[inline(always)]
    fn check_deadline(&mut self, id: CallId) -> Result<(), Status> {
        if let Some(d) = id.deadline {
            if Instant::now() >= d {
                self.abandon(id);
                self.counters.status(Code::DeadlineExceeded);
                return Err(Status::deadline_exceeded("deadline passed before the response arrived"));
            }
        }
        Ok(())
    }

    /// Polls a stream once: its next message (`Some(Ok(Some(m)))`), its end (`Some(Ok(None))`
    /// after an OK status, `Some(Err(status))` otherwise: the server's error, CANCELLED,
    /// DEADLINE_EXCEEDED at the stream's deadline, UNAVAILABLE when the session broke), or
    /// `None` while nothing is there. Taking a message returns its credit to the server.
    pub(crate) fn poll_stream<R: Message + Default>(
        &mut self,
        id: CallId,
    ) -> Option<Result<Option<R>, Status>> {
        // The deadline first, also while messages keep coming: a server that streams on past
        // it (its own timer should have ended the stream) does not keep the stream alive. One
        // clock read per message, for streams with a deadline only.
        if let Some(d) = id.deadline {
            if Instant::now() >= d {
                self.abandon_stream(id);
                self.counters.status(Code::DeadlineExceeded);
                return Some(Err(Status::deadline_exceeded("the stream's deadline passed before its end")));
            }
        }
        for round in 0..2 {
            if let Some(r) = self.next_stream_msg::<R>(id) {
                self.flush();
                return Some(r.map(Some));
            }
            if let Some(a) = self.take_answer(id) {
                self.conn.session.stream_close(id.slot, id.generation);
                return Some(self.finish::<()>(a).map(|()| None));
            }
            if round == 0 {
                if self.progress() > 0 {
                    self.idle.reset();
                } else {
                    self.note_empty();
                    break;
                }
            }
        }
        None
    }

    /// Blocks (busy-polling per policy) until the stream's next message or its end.
    pub(crate) fn wait_stream<R: Message + Default>(&mut self, id: CallId) -> Result<Option<R>, Status> {
        loop {
            if let Some(r) = self.poll_stream(id) {
                return r;
            }
            if self.idle.empty_polls() > 0 {
                self.pause();
            }
        }
    }

    /// The caller gave up on a stream: messages not taken are dropped (their credits return, so
    /// the server is not blocked until it sees the Cancel) and the call is abandoned.
    pub(crate) fn abandon_stream(&mut self, id: CallId) {
        if self.conn.session.calls().state(id.slot) != crate::session::SlotState::Free {
            while let Some(a) = self.stream_msgs[id.slot as usize].pop_front() {
                self.release(a);
                self.conn.session.stream_consumed(id.slot, id.generation);
            }
        }
        let key = (id.slot, id.generation);
        self.stream_ends.retain(|&e| e != key);
        if self.batch_holds(id.slot, id.generation) {
            if let Some(b) = self.stream_batch.take() {
                self.conn.give_back(&mut self.pool, b.buf);
            }
        }
        for o in self.outbox.take_unsent(id.slot, id.generation, Kind::StreamMsg) {
            o.discard(&mut self.conn.areas);
        }
        if self.outbox.holds_kind(id.slot, id.generation, Kind::StreamMsg)
            && !self.outbox.holds_kind(id.slot, id.generation, Kind::Request)
        {
            // A message of the stream is leaving in pieces: the Cancel follows its last one.
            self.stream_cancels.push(key);
        }
        self.abandon(id);
    }

    /// Sends one message of the caller's stream `id` (client or bidirectional streaming), after
    /// the messages sent before it. Waits (progressing the session, per the polling policy) for
    /// a stream grant of the server when `wait`, else returns `Ok(false)` without one. Small
    /// bodies are encoded straight into a send buffer; others go through the outbox, whole or
    /// in pieces through the server's ring, so the stream's order holds.
    ///
    /// # Errors
    /// FAILED_PRECONDITION when the server already answered the stream (its answer is the
    /// call's result) or the caller ended its messages; DEADLINE_EXCEEDED at the stream's
    /// deadline (the stream is cancelled); RESOURCE_EXHAUSTED for a message over
    /// `max_message_size`, or for a message above the eager threshold when the connection's send
    /// mirror or staging area cannot be registered (naming which; nothing of it is sent, the
    /// stream goes on); UNAVAILABLE when the session broke. A message that waited for the
    /// server's ring when the server refused it fails its stream instead (its call ends
    /// RESOURCE_EXHAUSTED naming the cap).
    pub(crate) fn stream_send<M: Message>(
        &mut self,
        id: CallId,
        msg: &M,
        wait: bool,
    ) -> Result<bool, Status> {
        let len = msg.encoded_len();
        self.check_len(len)?;
        self.check_areas(len)?;
        let (slot, generation) = (id.slot, id.generation);
        if self.stream_ends.contains(&(slot, generation)) {
            // Finished, its StreamEnd still waiting for the messages before it.
            return Err(Status::failed_precondition("the stream's messages were ended (finish)"));
        }
        let mut looked = false;
        loop {
            if let Some(s) = &self.broken {
                return Err(s.clone());
            }
            match self.conn.session.stream_send(slot, generation) {
                Ok(true) if self.batch_holds(slot, generation) => {
                    // The batch before this message goes first, with this credit.
                    let Some(b) = self.stream_batch.take() else { continue };
                    self.queue_batch(b);
                    self.flush();
                    continue;
                }
                Ok(true) => break,
                // No credit: coalesced with the messages before it, to leave with the next.
                Ok(false) => match self.batch_append(id, msg, len) {
                    Ok(true) => {
                        self.counters.bytes_out += len as u64;
                        return Ok(true);
                    }
                    Ok(false) => {}
                    Err(e) => return Err(self.mismatch(e, "stream message")),
                },
                Err(crate::session::StreamError::NotSending) => {
                    return Err(Status::failed_precondition("the stream's messages were ended (finish)"));
                }
                // Not open yet (the request waits for a credit), or over (answered).
                Err(crate::session::StreamError::NoStream) => {
                    if self.pending[slot as usize].is_none() {
                        return Err(Status::failed_precondition(
                            "the server ended the stream before its messages did; the call's result is its answer",
                        ));
                    }
                }
            }
            if !wait {
                // One look at what arrived (a grant may have), then no waiting.
                if std::mem::replace(&mut looked, true) {
                    return Ok(false);
                }
                if self.progress() > 0 {
                    self.idle.reset();
                } else {
                    self.note_empty();
                }
                continue;
            }
            if self.progress() > 0 {
                self.idle.reset();
                continue;
            }
            self.note_empty();
            if id.deadline.is_some_and(|d| Instant::now() >= d) {
                self.abandon_stream(id);
                self.counters.status(Code::DeadlineExceeded);
                return Err(Status::deadline_exceeded("the stream's deadline passed before its end"));
            }
            self.pause();
        }
        let h = Header { slot, generation, method: 0, ..Header::new(Kind::StreamMsg) };
        let eager = len <= self.conn.session.params().eager_threshold as usize && len <= self.conn.body_cap;
        if eager && self.outbox.is_empty() {
            if let Some(mut buf) = self.conn.acquire(&mut self.pool) {
                let dst = &mut self.pool.buf_mut(&mut buf)[HEADER_LEN..HEADER_LEN + len];
                if let Err(e) = encode_exact(msg, dst) {
                    // Not sent: its buffer and the stream credit it took go back.
                    self.conn.give_back(&mut self.pool, buf);
                    self.conn.session.stream_unsend(slot, generation);
                    return Err(self.mismatch(e, "stream message"));
                }
                self.counters.bytes_out += len as u64;
                self.conn.queue(&mut self.pool, buf, h, BodyAt::Eager(len as u32));
                self.flush();
                return Ok(true);
            }
        }
        let Some(own) = self.conn.spare.take(GatherBody::own_capacity_for(len)) else {
            self.conn.session.stream_unsend(slot, generation);
            return Err(Status::resource_exhausted(format!("no memory for a stream message of {len} bytes")));
        };
        let body = GatherBody::encode(msg, own);
        if let Err(e) = check_exact::<M>(len, body.len()) {
            self.conn.spare.give_back(body.into_own());
            self.conn.session.stream_unsend(slot, generation);
            return Err(self.mismatch(e, "stream message"));
        }
        self.counters.bytes_out += len as u64;
        self.outbox.push(Waiting::Body(Outgoing::new(h, body)));
        self.pump();
        self.flush();
        Ok(true)
    }

    /// [`ClientCore::stream_send`] of a message encoded already (by a task of a channel), never
    /// waiting and not progressing the session: `Ok(None)` gives `bytes` back when no stream
    /// credit is free now.
    ///
    /// # Errors
    /// As [`ClientCore::stream_send`].
    pub(crate) fn stream_send_encoded(
        &mut self,
        id: CallId,
        bytes: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Status> {
        if let Some(s) = &self.broken {
            return Err(s.clone());
        }
        self.check_len(bytes.len())?;
        self.check_areas(bytes.len())?;
        let (slot, generation) = (id.slot, id.generation);
        loop {
            match self.conn.session.stream_send(slot, generation) {
                Ok(true) if self.batch_holds(slot, generation) => {
                    // The batch before this message goes first, with this credit (the driver
                    // rings the doorbell).
                    if let Some(b) = self.stream_batch.take() {
                        self.queue_batch(b);
                    }
                }
                Ok(true) => break,
                // No credit: framed into the stream's open batch (as `stream_send` does), which
                // leaves as one SEND with the next credit; back to the caller when it is full.
                Ok(false) => {
                    let len = bytes.len();
                    let copied = self.batch_append_with(id, len, |dst| {
                        dst.copy_from_slice(&bytes);
                        Ok(())
                    });
                    if copied == Ok(true) {
                        self.counters.bytes_out += len as u64;
                        self.conn.spare.give_back(bytes);
                        return Ok(None);
                    }
                    return Ok(Some(bytes));
                }
                Err(crate::session::StreamError::NotSending) => {
                    return Err(Status::failed_precondition("the stream's messages were ended (finish)"));
                }
                Err(crate::session::StreamError::NoStream) => {
                    if self.pending[slot as usize].is_some() {
                        return Ok(Some(bytes));
                    }
                    return Err(Status::failed_precondition(
                        "the server ended the stream before its messages did; the call's result is its answer",
                    ));
                }
            }
        }
        let h = Header { slot, generation, method: 0, ..Header::new(Kind::StreamMsg) };
        self.counters.bytes_out += bytes.len() as u64;
        let eager = bytes.len() <= self.conn.session.params().eager_threshold as usize
            && bytes.len() <= self.conn.body_cap;
        if eager && self.outbox.is_empty() {
            if let Some(mut buf) = self.conn.acquire(&mut self.pool) {
                let body = self.conn.copy_eager(&mut self.pool, &mut buf, &bytes);
                self.conn.queue(&mut self.pool, buf, h, body);
                self.conn.spare.give_back(bytes);
                return Ok(None);
            }
        }
        self.outbox.push(Waiting::Body(Outgoing::new(h, bytes)));
        self.pump();
        Ok(None)
    }

    /// A stream's next message or its end, without progressing the session (a dispatcher
    /// progresses once per loop for all its calls): as [`ClientCore::poll_stream`], `None`
    /// while nothing is there. The deadline is the caller's to check.
    pub(crate) fn take_stream<R: Message + Default>(
        &mut self,
        id: CallId,
    ) -> Option<Result<Option<R>, Status>> {
        if let Some(r) = self.next_stream_msg::<R>(id) {
            return Some(r.map(Some));
        }
        let a = self.take_answer(id)?;
        self.conn.session.stream_close(id.slot, id.generation);
        Some(self.finish::<()>(a).map(|()| None))
    }

    /// The caller ended its messages on the stream `id` cleanly (not a cancel): the StreamEnd
    /// follows its last message. Nothing happens for a stream that is over already.
    pub(crate) fn stream_finish(&mut self, id: CallId) {
        if self.broken.is_some() {
            return;
        }
        let key = (id.slot, id.generation);
        if !self.stream_ends.contains(&key) {
            self.stream_ends.push(key);
        }
        self.pump();
        self.flush();
    }

    /// A finished call's result, without progressing the session (a dispatcher progresses once
    /// per loop for all its calls); `None` while it runs.
    pub(crate) fn take_done<R: Message + Default>(&mut self, id: CallId) -> Option<Result<R, Status>> {
        let a = self.take_answer(id)?;
        Some(self.finish(a))
    }

    /// The load the server reported on its last response (see `wire::header`); `None` before
    /// the first.
    #[inline]
    pub(crate) fn peer_load(&self) -> Option<u32> {
        self.conn.session.peer_load()
    }

    /// True when call `id` has its answer (or its failure) to take with
    /// [`ClientCore::take_done`]; a compare, no progress.
    #[inline]
    pub(crate) fn is_answered(&self, id: CallId) -> bool {
        self.conn.session.calls().state(id.slot) == crate::session::SlotState::Done
    }

    /// True while the session holds messages that only leave when it is driven again: queued
    /// sends (a request, a stream message or a piece waiting for a send buffer, send-queue
    /// room, ring space or a credit), controls (a Cancel, a StreamEnd, a credit grant) not yet
    /// posted. A driver that lets the session go with this true must leave it to someone who
    /// drives it: a Cancel that found no send buffer would otherwise wait for the next call.
    #[inline]
    pub(crate) fn owes_sends(&self) -> bool {
        self.broken.is_none()
            && (!self.outbox.is_empty()
                || !self.conn.sq.is_empty()
                || self.conn.session.has_control()
                || self.conn.session.lease_pending()
                || self.stream_batch.is_some()
                || !self.stream_ends.is_empty()
                || !self.stream_cancels.is_empty())
    }

    /// True when a call can start now (a slot is free).
    pub(crate) fn has_free_slot(&self) -> bool {
        self.broken.is_some() || self.conn.session.calls().has_free()
    }

    /// One progress step of a dispatcher: polls the CQ once; an empty poll counts toward the TCP
    /// liveness check. Returns the completions handled.
    pub(crate) fn dispatch_step(&mut self) -> usize {
        let n = self.progress();
        if n > 0 {
            self.idle.reset();
        } else if self.broken.is_none() {
            self.note_empty();
        }
        n
    }

    /// The look of a thread that parks between its looks (a blocking client's endpoint's
    /// progress thread, every 50 to 400 ms while no call holds the client; a `Channel`'s dispatcher
    /// thread at a session it does not drive): as
    /// [`ClientCore::dispatch_step`], but an empty look weighs as a poll that slept
    /// ([`Tick::slept`]), so the control connection is read every 16 empty looks (800 ms) and a
    /// session that the server ended by closing it alone (no Close on the RDMA path) is seen
    /// broken while idle: the next call reconnects instead of failing UNAVAILABLE on it. An
    /// empty look that stands for `rounds` rounds of looks (the progress thread spaces out the
    /// looks of an idle client: `channel::dispatcher::IdleLooks`) weighs as that many, so the
    /// read stays about 800 ms apart. Returns the completions handled.
    pub(crate) fn idle_step(&mut self, rounds: u32) -> usize {
        let n = self.progress_with(true);
        if n > 0 {
            self.idle.reset();
        } else if self.broken.is_none() && self.tick.slept_for(rounds, Instant::now) {
            self.check_liveness();
        }
        n
    }

    /// Arms the CQ for a completion-event wait that the caller does outside the session (a
    /// dispatcher waits without holding it): handles what completed before arming (completions
    /// that arrived before the CQ was armed raise no event) and returns their count (wait only
    /// when it is 0) with a handle to the CQ to wait on ([`CompletionQueue::wait`]). `None` when
    /// the session is broken or its CQ has no events.
    pub(crate) fn arm_cq(&mut self) -> Option<(usize, P::CompletionQueue)> {
        // Answers complete on the receive CQ (an event-waiting session's own: `endpoint::rx`).
        if self.broken.is_some() || self.recv.cq().req_notify(false).is_err() {
            return None;
        }
        let n = self.dispatch_step();
        Some((n, self.recv.cq().clone()))
    }

    /// Blocks (busy-polling per policy) until the call finishes.
    pub(crate) fn wait<R: Message + Default>(&mut self, id: CallId) -> Result<R, Status> {
        let a = self.wait_answer(id)?;
        self.finish(a)
    }

    /// [`ClientCore::wait`] up to the answer, not decoded.
    #[inline(never)]
    fn wait_answer(&mut self, id: CallId) -> Result<Answer, Status> {
        // The deadline is looked at on the first poll, after every pause that gave up the core
        // (it may have lasted a time slice or an event wait), and every DEADLINE_SPINS polls
        // in between: a busy wait reads no clock per poll.
        let mut spins = 0u32;
        if let Some(a) = self.take_answer(id) {
            return Ok(a);
        }
        // A thread that blocks at its first empty poll (`Event { spins: 0 }`) arms the CQ at
        // once: its request has just left, so a poll now would find nothing (a poll, the
        // peeks of both CQs and the flush's checks, about 80 instructions per call). The
        // arming's peek sees whatever came meanwhile (then it polls at once, `Idle::pause`),
        // as the worker's loop does after a poll that drained its CQ.
        if self.idle.blocks_at_first_empty() && self.broken.is_none() {
            self.note_empty();
            self.check_deadline(id)?;
            self.pause();
        }
        // [`ClientCore::poll_answer`], its answer looked for only where one can have come: after
        // a poll that found completions, or once the session broke (the liveness check of an
        // empty poll or a pause may break it, failing every call).
        loop {
            if self.progress() > 0 {
                self.idle.reset();
                if let Some(a) = self.take_answer(id) {
                    return Ok(a);
                }
            } else {
                self.note_empty();
                if self.broken.is_some() {
                    if let Some(a) = self.take_answer(id) {
                        return Ok(a);
                    }
                }
            }
            if spins % DEADLINE_SPINS == 0 {
                self.check_deadline(id)?;
            }
            let slept = self.idle.empty_polls() > 0 && self.pause();
            spins = if slept { 0 } else { spins.wrapping_add(1) };
        }
    }

    /// The caller gave up on a call (future dropped, deadline passed, explicit cancel). A call
    /// not yet sent is dropped and its slot is free at once; one on the wire gets a Cancel and
    /// keeps its slot until the server's answer to it (CANCELLED, or the answer that was already
    /// on its way) arrives, since until then the server may still write into our ring for it.
    /// Never waits: when [`ClientConfig::max_abandoned`](super::ClientConfig::max_abandoned)
    /// calls wait for that acknowledgement, the session watches for one, and resets (a logged
    /// reason, [`Event::Unacknowledged`]) if none arrives within `peer_timeout` (5 s without
    /// one).
    pub(crate) fn abandon(&mut self, id: CallId) {
        let leaving = self.outbox.holds(id.slot, id.generation);
        match self.conn.session.abandon_call(id.slot, id.generation, leaving, Instant::now) {
            Abandoned::Nothing => return,
            Abandoned::Answered(()) => {
                if let Some(a) = self.answers[id.slot as usize].take() {
                    self.release(a);
                }
            }
            Abandoned::Unsent => {
                if let Some(p) = self.pending[id.slot as usize].take() {
                    self.drop_pending(p);
                }
            }
            Abandoned::OnWire => self.counters.cancels += 1,
        }
        self.flush();
    }

    /// The answer of a finished call, its slot freed; `None` while it runs.
    #[inline]
    fn take_answer(&mut self, id: CallId) -> Option<Answer> {
        if !self.conn.session.take_done(id.slot, id.generation) {
            return None;
        }
        self.answers[id.slot as usize].take()
    }

    /// Sends a Close (best effort) before the connection is dropped.
    pub(crate) fn close(&mut self) {
        if self.broken.is_some() {
            return;
        }
        if self.conn.send_close(&mut self.pool, TAG) {
            // Give the SEND a moment to leave before the QP is destroyed.
            let until = Instant::now() + Duration::from_millis(5);
            while Instant::now() < until {
                match self.wcs.poll(&self.cq) {
                    Ok(n) if n > 0 && self.wcs.any(|c| c.send_tag().is_some()) => break,
                    Ok(_) => std::thread::yield_now(),
                    Err(_) => break,
                }
            }
        }
        // A stream that ended (deadline, answer) leaves its open batch until the next flush.
        if let Some(b) = self.stream_batch.take() {
            self.conn.give_back(&mut self.pool, b.buf);
        }
        self.broken = Some(unavailable("client closed"));
    }

    /// Whether the connection is broken, and why.
    pub(crate) fn broken(&self) -> Option<&Status> {
        self.broken.as_ref()
    }

    /// [`ClientCore::broken`], after a look for a Close the server sent while no call was in
    /// flight (a server closes sessions idle for its `ServerConfig::idle_timeout`): with no call
    /// in flight, one poll of the CQ (what it finds is handled as [`ClientCore::progress`]
    /// would), so the next call reconnects first instead of failing on the closed session.
    ///
    /// The CQ is peeked first ([`CompletionQueue::maybe_ready`]): a call after an answer finds
    /// it empty, and the peek (two loads on `sim`) is inlined into every call's start, where the
    /// out-of-line poll cost ~50 instructions per call; the poll and what it finds are out of
    /// line ([`ClientCore::look`]).
    #[inline(always)]
    pub(crate) fn broken_now(&mut self) -> Option<&Status> {
        if self.broken.is_none()
            && self.conn.session.calls().in_flight() == 0
            && (self.recv.maybe_ready() || self.cq.maybe_ready())
        {
            self.look();
        }
        self.broken.as_ref()
    }

    /// [`ClientCore::broken_now`]'s poll, after a peek saw something: completions (a Close, a
    /// late answer) are handled as [`ClientCore::progress`] would; a failed CQ breaks the session.
    #[cold]
    #[inline(never)]
    fn look(&mut self) {
        let sends = match self.wcs.poll(&self.cq) {
            Ok(n) => n,
            Err(e) => return self.break_conn(unavailable(format!("completion queue: {e}"))),
        };
        match self.recv.poll() {
            Ok(n) if n + sends > 0 => {
                self.completed(n + sends);
            }
            Ok(_) => {}
            Err(e) => self.break_conn(unavailable(format!("receive completion queue: {e}"))),
        }
    }

    // ---- Hooks of the call queue (`super::queue`), which owns calls waiting for a slot. ----

    /// Number of call slots.
    pub(crate) fn window(&self) -> u16 {
        self.conn.session.calls().window()
    }

    /// The endpoint receive side this session is on (an identity, shared with the endpoint's
    /// other sessions), with its `recv_buffers` and `recv_buffer_bytes`: a sum over sessions
    /// counts each receive side once.
    pub(crate) fn recv_side(&self) -> (usize, u64, u64) {
        let n = u64::from(self.recv.registered());
        (self.recv.side_id(), n, n * self.recv.buf_size() as u64)
    }

    /// The session's counters, with what it registers now for its receive and send buffers
    /// (`recv_buffers`, `recv_buffer_bytes`, `send_pool_bytes`: gauges, not kept in
    /// `self.counters`, so that a retired session's counters add none).
    pub(crate) fn counters_now(&self) -> Counters {
        let mut c = self.counters.clone();
        c.recv_buffers = u64::from(self.recv.registered());
        c.recv_buffer_bytes = u64::from(self.recv.registered()) * self.recv.buf_size() as u64;
        c.send_pool_bytes = self.pool.registered_bytes();
        c
    }

    /// Requests on the wire.
    pub(crate) fn in_flight(&self) -> u16 {
        self.conn.session.calls().in_flight()
    }

    /// Slots that free without their caller: abandoned calls whose answer (or acknowledgement)
    /// is still to arrive. A blocking call that needs a slot can only get one of these (every
    /// other slot is freed by its own caller, who cannot run while this thread blocks).
    pub(crate) fn self_freeing_slots(&self) -> usize {
        let calls = self.conn.session.calls();
        (0..calls.window()).filter(|&i| calls.state(i) == crate::session::SlotState::Abandoned).count()
    }

    /// [`ClientCore::mismatch`] of a request encoded elsewhere (a waiting call's body).
    #[cold]
    pub(crate) fn encode_mismatch(&mut self, e: LenMismatch) -> Status {
        self.mismatch(e, "request")
    }

    /// Registers the send mirror and the staging area (counted) unless they are, for a stream
    /// message of `len` bytes that does not go eager (above the eager threshold or the send
    /// buffer's body area): checked before it takes a stream grant or is queued, as a request's
    /// is before it starts ([`ClientCore::start_with`]).
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming what failed to register (counted).
    fn check_areas(&mut self, len: usize) -> Result<(), Status> {
        if len <= self.conn.session.params().eager_threshold as usize && len <= self.conn.body_cap {
            return Ok(());
        }
        // A RingReclaim waiting is taken first (as in `start_with`).
        if self.conn.session.peer_ring_ready() {
            self.progress();
        }
        let r = self.conn.ensure_areas();
        if let Err(s) = &r {
            self.counters.status(s.code());
        }
        r
    }

    /// Refuses a body of `len` bytes over the agreed `max_message_size` (RESOURCE_EXHAUSTED
    /// naming it), before anything is encoded or queued.
    pub(crate) fn check_len(&mut self, len: usize) -> Result<(), Status> {
        let r = self.conn.session.check_len(len);
        if let Err(s) = &r {
            self.counters.status(s.code());
        }
        r
    }

    /// Progresses the session once without pausing: handles what completed and, on an empty
    /// poll, counts it (checking the TCP liveness channel now and then). For a caller whose call
    /// has no slot yet. Returns how many completions were handled.
    pub(crate) fn poll_step(&mut self) -> usize {
        let n = self.progress();
        if n > 0 {
            self.idle.reset();
        } else if self.broken.is_none() {
            self.note_empty();
        }
        n
    }
}
