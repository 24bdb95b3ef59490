//! One connection's verbs resources and protocol state, shared by server workers and clients:
//! QP, receive ring, send mirror, staging area, send queue and the sans-IO [`Session`]. Its send
//! buffers are not its own: every method that sends takes the [`SendPool`] they come from (a
//! client's connection has one of its own, next to it; a server worker's sessions share the
//! worker's, so an idle session holds none), and [`Conn::close`] gives back what its posted WRs
//! still use once its QP is destroyed.

use crate::buffers::{GatherBody, RecvRing, SendBuf, SendPool, SendQueue, Staged};
use crate::dispatch::reply::LateBody;
use crate::endpoint::areas::SendAreas;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::session::{
    BodyRecycler, Charge, Complete, Front, LeaseMsg, Outbox, Queued, RingPiece, Session, Waiting,
};
use crate::status::Code;
use crate::verbs::rc::Endpoint;
use crate::verbs::{CompletionQueue, Context, ProtectionDomain, Provider, QpCap, QpInitAttr, Result};
use crate::wire::{EagerResponse, Handshake, Header, Kind, HEADER_LEN, PROTOCOL_VERSION};

/// Our receive ring of `len` bytes: behind a type-2 memory window bound to the connection's QP
/// where the device has them (so a peer can write only its own ring), else the plain MR with a
/// logged warning (once per process) and `fallback` counted.
pub(crate) fn create_ring<P: Provider>(
    ctx: &P::Context,
    pd: &P::ProtectionDomain,
    len: usize,
    fallback: &mut u64,
) -> Result<RecvRing<P>> {
    if ctx.attr().mw_type2 {
        return RecvRing::with_window(pd, len);
    }
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            device = ctx.device_name(),
            "the device has no type-2 memory windows: each receive ring is exposed by its MR's rkey, \
             reachable from any QP of the protection domain"
        );
    });
    *fallback += 1;
    RecvRing::new(pd, len)
}

/// Smallest piece, in bytes, a ring body is cut into so that the receiver's copy-out overlaps
/// the sender's WRITE of the next piece (below it a piece's SEND costs more than the overlap
/// gains).
pub(crate) const PIPELINE_MIN_PIECE: u32 = 64 << 10;

/// Most pieces a ring body reserved whole is cut into for pipelining.
pub(crate) const PIPELINE_PIECES: u32 = 4;

/// Smallest eager body area in bytes, so that a status message always fits in one SEND.
pub(crate) const MIN_BODY_AREA: usize = 256;

/// Bytes after the header in every send and receive buffer for an eager threshold.
pub(crate) fn body_area(eager_threshold: u32) -> usize {
    (eager_threshold as usize).max(MIN_BODY_AREA)
}

/// Send buffers a connection needs for `credits` requests in flight (one per message, plus
/// control messages and the buffers still posted until their completion is polled).
pub(crate) fn send_bufs_for(credits: u16) -> u16 {
    credits.saturating_mul(2).saturating_add(8)
}

/// Receive WQEs of the worker's SRQ a session accepting `credits` reserves (the table of what
/// they cover is on [`crate::session::srq_need`], next to the credits policy that grants them).
pub(crate) use crate::session::srq_need;

/// Most inline bytes asked for a QP (small messages are copied into the WQE: no DMA read of the
/// send buffer, and the buffer is free again as soon as it is posted).
pub(crate) const MAX_INLINE: u32 = 256;

/// SGEs a ring WRITE's gather list may have: a body's encoded parts in the send mirror around
/// up to three registered user buffers ([`crate::buffers::RegisteredPool`]).
pub(crate) const RING_WRITE_SGES: u32 = 7;

/// Creates an RC QP with its send completions on `cq` and its receives from `srq` completing on
/// `recv_cq` (a worker's QPs: one CQ for both; a client's: its own CQ for sends, the endpoint's
/// receive CQ, [`super::rx::SharedRx`]), able to post every buffer twice
/// (a WRITE and a SEND per message) up to the device's `max_qp_wr`, with up to the device's
/// `max_inline_data` bytes of inline data and [`RING_WRITE_SGES`] SGEs per WR (at most the device's `max_sge`). Size the connection's [`crate::buffers::SendQueue`] by the created QP's
/// `max_send_wr`.
pub(crate) fn create_qp<P: Provider>(
    pd: &P::ProtectionDomain,
    cq: &P::CompletionQueue,
    recv_cq: &P::CompletionQueue,
    srq: &P::SharedReceiveQueue,
    send_bufs: u16,
    attr: &crate::verbs::DeviceAttr,
) -> Result<P::QueuePair> {
    let (max_inline, max_qp_wr, max_sge) = (attr.max_inline_data, attr.max_qp_wr, attr.max_sge);
    // The most credits (4096) would ask 16 408 WQEs, above common devices' 16 384.
    let asked = u32::from(send_bufs) * 2 + 8;
    let granted = asked.min(max_qp_wr.max(1));
    if granted < asked {
        tracing::warn!(
            provider = P::NAME,
            asked,
            granted,
            "send queue (max_send_wr) cut to the device's max_qp_wr"
        );
    }
    let cap = QpCap {
        max_send_wr: granted,
        max_recv_wr: 1,
        max_send_sge: RING_WRITE_SGES.min(max_sge.max(1)),
        max_recv_sge: 1,
        max_inline_data: max_inline.min(MAX_INLINE),
    };
    pd.create_qp(&QpInitAttr { send_cq: cq, recv_cq, srq: Some(srq), cap, sq_sig_all: false })
}

/// Where a message's body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyAt {
    /// `len` bytes after the header in the send buffer.
    Eager(u32),
    /// `len` bytes at `offset` of the send mirror, to be written to the peer's ring.
    Ring { offset: u32, len: u32 },
    /// A piece of `len` bytes for `offset` of the peer's ring: in the mirror at that offset, or,
    /// when `staged`, in the staging area with its WRITE queued already.
    Piece { offset: u32, len: u32, staged: bool },
}

/// Staging bytes for a peer ring of `peer_ring_len` bytes: as much again as the ring (bodies
/// waiting for ring space are encoded there at once instead of onto the heap), at most 64 MiB
/// more than the ring.
pub(crate) fn staging_len(peer_ring_len: u32) -> u32 {
    peer_ring_len.saturating_mul(2).min(peer_ring_len.saturating_add(64 << 20))
}

/// Copies `src` to the front of `dst` (as much as fits); returns the bytes copied.
fn put(dst: &mut [u8], src: &[u8]) -> usize {
    let n = src.len().min(dst.len());
    dst[..n].copy_from_slice(&src[..n]);
    n
}

/// What became of an answer that waited unencoded only for the send mirror
/// ([`Conn::place_late`]).
pub(crate) enum LatePlaced {
    /// Placed whole in the peer's ring and queued: its length in bytes.
    Sent(u32),
    /// The ring has no room for it whole now: it waits in the outbox (staged when its turn
    /// comes), as an answer that found the ring full does.
    Wait(Box<dyn LateBody>),
    /// It cannot be sent: this status goes as the answer (RESOURCE_EXHAUSTED naming the memory
    /// that failed to register, or INTERNAL for a message that did not encode as long as it
    /// said).
    Failed(crate::status::Status),
}

/// Where the body of an [`Outgoing`] message waits.
pub(crate) enum OutBody {
    /// On the heap (no staging room when it was encoded, larger than the staging area, or
    /// encoded on another thread): each piece is copied into the mirror at its ring offset
    /// before its WRITE, its large `bytes` fields straight from the caller's memory
    /// ([`GatherBody`]).
    Heap(GatherBody),
    /// In the staging area: pieces are written from there (no copy). `None` once the last piece
    /// is queued.
    Staged(Option<Staged>),
    /// Not encoded yet (an answer that found the staging area full): encoded straight into the
    /// staging area when it reaches the front of the outbox and the area has room
    /// ([`Conn::send_outgoing`]), then sent as `Staged`.
    Later(Box<dyn LateBody>),
    /// A `Later` body that did not encode as long as it said: this error goes as the answer.
    Failed(crate::status::Status),
}

/// A message whose body waits to be sent in pieces through the peer's ring (larger than a piece,
/// or no room when it was encoded), or whole once ring space frees.
pub(crate) struct Outgoing {
    /// Its header (kind, slot, generation, method, status, timeout).
    pub(crate) header: Header,
    /// The encoded body.
    pub(crate) body: OutBody,
    /// Its length in bytes.
    pub(crate) len: u32,
    /// Bytes of `body` already queued.
    pub(crate) sent: u32,
    /// What it holds on the heap while it waits, charged to the server's backlog count
    /// ([`Outgoing::charge`]); given back when it is dropped (sent, dropped or its session closed).
    charge: Option<Charge>,
}

impl Outgoing {
    pub(crate) fn new(header: Header, body: impl Into<GatherBody>) -> Outgoing {
        let body = body.into();
        Outgoing { header, len: body.len() as u32, body: OutBody::Heap(body), sent: 0, charge: None }
    }

    pub(crate) fn staged(header: Header, body: Staged) -> Outgoing {
        Outgoing { header, len: body.len(), body: OutBody::Staged(Some(body)), sent: 0, charge: None }
    }

    /// A message encoded when its turn comes; `body.len()` is at most the staging area's length.
    pub(crate) fn later(header: Header, body: Box<dyn LateBody>) -> Outgoing {
        Outgoing { header, len: body.len() as u32, body: OutBody::Later(body), sent: 0, charge: None }
    }

    /// Charges what this message holds on the heap while it waits (a heap body, or a message
    /// still to encode; a staged body sits in registered memory sized at the handshake and is
    /// not charged) to the session's backlog count ([`Session::charge_backlog`]).
    ///
    /// # Errors
    /// The reason to close the session with (naming the cap) when the server's count would go
    /// over its cap; nothing is charged then.
    pub(crate) fn charge(&mut self, session: &Session) -> std::result::Result<(), String> {
        let held = match &self.body {
            OutBody::Heap(_) | OutBody::Later(_) => u64::from(self.len),
            OutBody::Staged(_) | OutBody::Failed(_) => 0,
        };
        self.charge = session.charge_backlog(held)?;
        Ok(())
    }

    /// Gives a staged body's space back when the message will not be sent.
    pub(crate) fn discard<P: Provider>(self, areas: &mut SendAreas<P>) {
        if let OutBody::Staged(Some(s)) = self.body {
            areas.release_staged(s);
        }
    }
}

/// This end's handshake: its QP's address (`local`), its ring (`(addr, len, rkey)`), and the
/// limits it offers or grants (`credits`, `eager_threshold`, `max_message` in bytes), the session
/// id (0 from a client) and the client's auth token (empty from a server); no flags (a client
/// that answers probes while idle sets [`crate::wire::FLAG_IDLE_PONGS`]).
pub(crate) fn handshake(
    local: &Endpoint,
    ring: (u64, u32, u32),
    credits: u16,
    eager_threshold: u32,
    max_message: u32,
    session: u32,
    auth_token: Vec<u8>,
) -> Handshake {
    Handshake {
        version: PROTOCOL_VERSION,
        flags: 0,
        qp_num: local.qp_num,
        psn: local.psn,
        lid: local.lid,
        mtu: local.mtu,
        gid: local.gid,
        ring_addr: ring.0,
        ring_len: ring.1,
        ring_rkey: ring.2,
        credits,
        eager_threshold,
        max_message,
        session,
        auth_token,
    }
}

impl Queued for Outgoing {
    fn header(&self) -> &Header {
        &self.header
    }
    fn body_len(&self) -> usize {
        self.len as usize
    }
    fn untouched(&self) -> bool {
        self.sent == 0
    }
}

/// Posts what waits in `outbox` (the session's order and checks: [`Outbox::front`]) while send
/// buffers and ring space allow; a body larger than what the ring has free goes in pieces.
/// `on_sent(header, status, body_len)` for each message posted whole (an error answer with its
/// status and length 0), `on_late(header)` for each second answer to one call, dropped,
/// `on_failed(header, status)` for each stream whose message can never be sent (its send mirror
/// and staging area failed to register, [`Outbox::fail_stream`]; counted once, the message and
/// the stream's other waiting messages taken out and released): the driver ends that stream
/// with `status` as its producer's error would. Returns whether anything was posted. Pieces
/// are posted as they are queued, with `tag` (the connection's tag in send `wr_id`s, as for
/// [`Conn::flush`]).
pub(crate) fn send_waiting<P: Provider>(
    conn: &mut Conn<P>,
    pool: &mut SendPool<P>,
    outbox: &mut Outbox<Outgoing>,
    tag: u32,
    mut on_sent: impl FnMut(&Header, Code, u32),
    mut on_late: impl FnMut(&Header),
    mut on_failed: impl FnMut(&Header, crate::status::Status),
) -> bool {
    let mut posted = false;
    loop {
        let (status, len) = match outbox.front(&conn.session) {
            None => break,
            Some(Front::Late(m)) => {
                on_late(m.header());
                if let Waiting::Body(out) = m {
                    out.discard(&mut conn.areas);
                }
                continue;
            }
            Some(Front::Refused(out)) => {
                out.discard(&mut conn.areas);
                continue;
            }
            Some(Front::Send(Waiting::Body(out))) => {
                if let OutBody::Later(_) = out.body {
                    match conn.encode_later(out) {
                        Ok(true) => {}
                        // Waits for staging room (freed as earlier bodies' WRITEs complete).
                        Ok(false) => break,
                        // Sent as the answer instead, below.
                        Err(s) => out.body = OutBody::Failed(s),
                    }
                }
                if !conn.areas.is_live() && out.sent == 0 && conn.needs_areas(out) {
                    // The connection's first ring body since its send mirror and staging area
                    // were made or given back: they are registered now. An answer that cannot
                    // have them goes as RESOURCE_EXHAUSTED naming what failed; a stream message
                    // fails its stream with it (below). Either way the failure is counted once:
                    // the message that needed them never asks again.
                    if let Err(s) = conn.areas.ensure() {
                        if out.header.kind == Kind::Request {
                            // Unreachable: a client registers them before it places a request
                            // above the threshold (`ClientCore::start_with`) and never gives
                            // them back.
                            break;
                        }
                        if out.header.kind == Kind::StreamMsg {
                            let h = out.header;
                            let (taken, end) = outbox.fail_stream(s);
                            for m in taken {
                                m.discard(&mut conn.areas);
                            }
                            if let Some(s) = end {
                                on_failed(&h, s);
                            }
                            continue;
                        }
                        out.body = OutBody::Failed(s);
                    }
                }
                if let OutBody::Failed(s) = &out.body {
                    let Some(buf) = conn.acquire(pool) else { break };
                    (conn.queue_error(pool, buf, out.header, s), 0)
                } else {
                    let before = out.sent;
                    let done = conn.send_outgoing(pool, out, tag);
                    posted |= out.sent != before;
                    if !done {
                        break;
                    }
                    (Code::Ok, out.len)
                }
            }
            Some(Front::Send(Waiting::Error(h, s))) => {
                let Some(buf) = conn.acquire(pool) else { break };
                (conn.queue_error(pool, buf, *h, s), 0)
            }
        };
        if let Some(m) = outbox.sent(&mut conn.session) {
            on_sent(m.header(), status, len);
        }
        posted = true;
    }
    posted
}

/// A connection's resources. Field order is drop order: the receive ring's memory window goes
/// first (a QP destroyed with a window still bound to it can block for minutes on rxe), then
/// the QP, then the memory its posted WRs read.
pub(crate) struct Conn<P: Provider> {
    /// Our ring; the peer writes it only through its window (or the MR's rkey, as a fallback).
    /// `None` while no ring is granted (a server's session under protocol 12's lease: granted
    /// on demand, [`crate::session`]'s `lease`); a client's is made at connect.
    pub(crate) ring: Option<RecvRing<P>>,
    pub(crate) qp: P::QueuePair,
    /// The send mirror of the peer's ring and the staging area, registered at the first body
    /// above the eager threshold and given back when unused ([`Conn::release_idle_areas`]).
    pub(crate) areas: SendAreas<P>,
    pub(crate) sq: SendQueue,
    pub(crate) session: Session,
    /// The ring mark of the last ring WRITE a polled completion retired (the producer's tail
    /// when every body placed was WRITTEN and retired).
    pub(crate) written_mark: u32,
    /// Peer's ring address and rkey.
    pub(crate) peer_ring: (u64, u32),
    /// Eager body area of each send buffer in bytes.
    pub(crate) body_cap: usize,
    /// Messages up to this many bytes (header included) are sent inline (the QP's
    /// `max_inline_data` after creation).
    pub(crate) max_inline: u32,
    /// The session's spare body buffers ([`Session::spare_bodies`]): bodies that wait on the heap
    /// are encoded into one and give it back once queued, so a large body costs no fresh pages.
    pub(crate) spare: Arc<BodyRecycler>,
    /// The registered user buffers of a piece being queued ([`Conn::gather_piece`]); kept
    /// empty between pieces, for its capacity.
    pub(crate) refs: Vec<crate::buffers::RegisteredRef>,
}

impl<P: Provider> Conn<P> {
    /// Whether sending `out` needs the send mirror or the staging area: a body that does not go
    /// eager in one SEND ([`Conn::send_outgoing`]'s test); not an error answer.
    #[inline]
    fn needs_areas(&self, out: &Outgoing) -> bool {
        match out.body {
            OutBody::Failed(_) => false,
            OutBody::Heap(_) => {
                out.len as usize > self.body_cap || out.len > self.session.params().eager_threshold
            }
            OutBody::Staged(_) | OutBody::Later(_) => true,
        }
    }

    /// Registers the send mirror and the staging area unless they are: call before encoding a
    /// body above the eager threshold into them.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming what failed to register (see [`SendAreas::ensure`]).
    #[inline]
    pub(crate) fn ensure_areas(&mut self) -> std::result::Result<(), crate::status::Status> {
        if self.areas.is_live() {
            return Ok(());
        }
        self.areas.ensure()
    }

    /// The mirror's bytes `[offset, offset + len)` (a range the session reserved in the peer's
    /// ring), empty when out of bounds or when no mirror is registered ([`Conn::ensure_areas`]
    /// first).
    pub(crate) fn mirror_range_mut(&mut self, offset: u32, len: u32) -> &mut [u8] {
        match self.areas.mirror_mut() {
            Some(m) => m.range_mut(offset, len),
            None => &mut [],
        }
    }

    /// The staging area's largest free span (offset and bytes), empty when none is registered
    /// ([`Conn::ensure_areas`] first); then [`Conn::staging_commit`].
    pub(crate) fn staging_spare_mut(&mut self) -> (u32, &mut [u8]) {
        match self.areas.staging_mut() {
            Some(s) => s.spare_mut(),
            None => (0, &mut []),
        }
    }

    /// Seals the first `len` bytes of the span [`Conn::staging_spare_mut`] gave at `offset`.
    pub(crate) fn staging_commit(&mut self, offset: u32, len: u32) -> Option<Staged> {
        self.areas.staging_mut().and_then(|s| s.commit(offset, len))
    }

    /// Gives back the send mirror and the staging area (see [`SendAreas::release_idle`]) when no
    /// ring body was placed for `idle` up to `now`, every body placed was WRITTEN and its WRITE
    /// retired, nothing waits in the caller's outbox (`outbox_empty`) and no posted WR reads
    /// them. Returns whether they were given back. Called by the idle sweep, never per message.
    pub(crate) fn release_idle_areas(&mut self, now: Instant, idle: Duration, outbox_empty: bool) -> bool {
        let mark = self.session.ring_write_mark();
        let quiet = outbox_empty && mark == self.written_mark;
        self.areas.release_idle(&mut self.sq, mark, now, idle, quiet)
    }

    /// An answer above the eager threshold that found no send mirror (the session's first ring
    /// body since it connected, or since its mirror and staging area were given back): registers
    /// them, then places it as [`crate::dispatch::reply::encode_body`] would have with a mirror:
    /// whole in the peer's ring when it has room (encoded into the mirror, queued with send
    /// buffer `buf` as one ring body, pipelined as usual), so the wire sees what it did when the
    /// mirror was registered at connect. `buf` is given back unless it is `Sent`.
    #[cold]
    #[inline(never)]
    pub(crate) fn place_late(
        &mut self,
        pool: &mut SendPool<P>,
        buf: SendBuf,
        header: Header,
        msg: Box<dyn LateBody>,
    ) -> LatePlaced {
        if let Err(s) = self.ensure_areas() {
            self.give_back(pool, buf);
            return LatePlaced::Failed(s);
        }
        let len = msg.len();
        let off = match self.session.place_body(len) {
            Ok(crate::session::Placement::Ring(off)) => off,
            Ok(_) => {
                self.give_back(pool, buf);
                return LatePlaced::Wait(msg);
            }
            Err(crate::session::PlaceError::Refused(s)) => {
                self.give_back(pool, buf);
                return LatePlaced::Failed(s);
            }
        };
        if let Err(e) = msg.encode_into(self.mirror_range_mut(off, len as u32)) {
            // Placed just now, nothing since: the range is free again.
            self.session.unplace_body();
            self.give_back(pool, buf);
            return LatePlaced::Failed(e.status("answer"));
        }
        self.queue(pool, buf, header, BodyAt::Ring { offset: off, len: len as u32 });
        LatePlaced::Sent(len as u32)
    }

    /// Takes a send buffer when one is free and the send queue has room for its WRs.
    #[inline]
    pub(crate) fn acquire(&mut self, pool: &mut SendPool<P>) -> Option<SendBuf> {
        pool.acquire_for(&mut self.sq)
    }

    /// Whether the session has a control message due (a lease message, a Pong, a Ping, a
    /// Cancel, a RingReturn) that waits for a send buffer.
    pub(crate) fn wants_send(&self) -> bool {
        self.session.lease_pending() || self.session.has_control() || self.session.ring_return_due()
    }

    /// Gives back a send buffer taken with [`Conn::acquire`] and not queued.
    #[inline]
    pub(crate) fn give_back(&mut self, pool: &mut SendPool<P>, buf: SendBuf) {
        self.sq.give_back(pool, buf);
    }

    /// Queues a message whose body is already in send buffer `buf` or in the mirror: stamps the
    /// session id and freed head, writes the header, queues the WRITE (ring body) and the SEND.
    /// A ring body's `total_len` is the header's when set (a piece), else the body's length.
    /// A ring body of at least two [`Conn::pipeline_piece`]s goes as up to
    /// [`PIPELINE_PIECES`] pieces of its reserved range (each a WRITE and a SEND), as far as
    /// send buffers allow: the peer copies a piece out while the next one is written.
    #[inline]
    pub(crate) fn queue(&mut self, pool: &mut SendPool<P>, buf: SendBuf, h: Header, body: BodyAt) {
        if let BodyAt::Ring { offset, len } = body {
            if len >= 2 * self.pipeline_piece() {
                return self.queue_pipelined(pool, buf, h, offset, len);
            }
        }
        self.queue_one(pool, buf, h, body, 0);
    }

    /// Smallest piece a ring body is cut into for pipelining, in bytes: [`PIPELINE_MIN_PIECE`],
    /// and never less than 1/[`crate::session::MAX_PIECES_IN_RING`] of the peer's ring (what
    /// the peer's receive WQEs are reserved for, see [`srq_need`]).
    #[inline]
    pub(crate) fn pipeline_piece(&self) -> u32 {
        (self.session.params().peer_ring_len / crate::session::MAX_PIECES_IN_RING).max(PIPELINE_MIN_PIECE)
    }

    /// Queues a ring body reserved whole at `offset` as consecutive pieces of that range.
    #[cold]
    fn queue_pipelined(
        &mut self,
        pool: &mut SendPool<P>,
        mut buf: SendBuf,
        h: Header,
        offset: u32,
        len: u32,
    ) {
        let piece = self.pipeline_piece().max(len.div_ceil(PIPELINE_PIECES));
        let h = Header { total_len: len, ..h };
        let mut done = 0;
        loop {
            let rest = len - done;
            // The last piece takes the rest, and so does this one when no other send buffer is
            // free or the peer's ring holds as many of our bodies and pieces as the session
            // allows (`session::ring_units`: each piece is freed, and may be reported, alone).
            let next =
                if rest > piece && self.session.may_split_ring_body() { self.acquire(pool) } else { None };
            let n = if next.is_some() { piece } else { rest };
            let behind = len - done - n;
            if next.is_some() {
                let split = self.session.split_ring_body(behind);
                debug_assert!(split, "may_split_ring_body said yes");
            }
            self.queue_one(
                pool,
                buf,
                h,
                BodyAt::Piece { offset: offset + done, len: n, staged: false },
                behind,
            );
            done += n;
            match next {
                Some(b) => buf = b,
                None => return,
            }
        }
    }

    /// Queues one message; a ring body's WRITE carries the session's ring mark less `behind`,
    /// the bytes of the last placement after its end (the later pieces of a pipelined body).
    #[inline]
    fn queue_one(
        &mut self,
        pool: &mut SendPool<P>,
        mut buf: SendBuf,
        mut h: Header,
        body: BodyAt,
        behind: u32,
    ) {
        let eager = match body {
            BodyAt::Eager(len) => {
                eager_header(&mut h, len);
                len
            }
            BodyAt::Ring { offset, len } | BodyAt::Piece { offset, len, staged: false } => {
                h.in_ring = true;
                h.body_len = len;
                h.total_len = h.total_len.max(len);
                h.ring_offset = offset;
                let mark = self.session.ring_write_mark().wrapping_sub(behind);
                // A ring body is encoded into the mirror first: it is registered.
                if let Some(m) = self.areas.mirror() {
                    self.sq.write(m, offset, len, self.peer_ring.0, self.peer_ring.1, mark);
                }
                0
            }
            BodyAt::Piece { offset, len, staged: true } => {
                // Its WRITE from the staging area is queued already.
                h.in_ring = true;
                h.body_len = len;
                h.total_len = h.total_len.max(len);
                h.ring_offset = offset;
                0
            }
        };
        self.seal(pool, &mut buf, &mut h);
        let len = HEADER_LEN as u32 + eager;
        self.sq.send(pool, buf, len, len <= self.max_inline);
    }

    /// Stamps `h` (session id, freed head) and writes it at the start of `buf`.
    #[inline(always)]
    fn seal(&mut self, pool: &mut SendPool<P>, buf: &mut SendBuf, h: &mut Header) {
        self.session.stamp(h);
        if let Some(dst) = pool.buf_mut(buf).get_mut(..HEADER_LEN) {
            if let Ok(dst) = <&mut [u8; HEADER_LEN]>::try_from(dst) {
                h.encode(dst);
            }
        }
    }

    /// Sends a message whose `len` body bytes are in send buffer `buf` now: [`Conn::queue`] with
    /// [`BodyAt::Eager`] then [`Conn::flush`], with no round trip through the send queue when
    /// nothing waits in it ([`SendQueue::send_now`]); behind what does otherwise.
    ///
    /// # Errors
    /// As [`Conn::flush`]'s (close the connection).
    #[inline]
    pub(crate) fn send_now(
        &mut self,
        pool: &mut SendPool<P>,
        mut buf: SendBuf,
        mut h: Header,
        len: u32,
        tag: u32,
    ) -> Result<()> {
        eager_header(&mut h, len);
        self.seal(pool, &mut buf, &mut h);
        let len = HEADER_LEN as u32 + len;
        self.session.on_flushed();
        self.sq.send_now(&self.qp, pool, buf, len, len <= self.max_inline, tag)
    }

    /// [`Conn::send_now`] of an eager response with status OK to call (`slot`, `generation`) of
    /// `method`, its `len` body bytes in `buf` (`metadata`: they start with response metadata):
    /// its header is written into the buffer from the call's fields and the session's stamp
    /// ([`Header::encode_eager_response`]), with no [`Header`] built; the bytes are those of
    /// `send_now` with that header.
    ///
    /// # Errors
    /// As [`Conn::flush`]'s (close the connection).
    #[inline]
    pub(crate) fn send_response_now(
        &mut self,
        pool: &mut SendPool<P>,
        mut buf: SendBuf,
        call: (u16, u32, u32, bool),
        len: u32,
        tag: u32,
    ) -> Result<()> {
        let (slot, generation, method, metadata) = call;
        let r = EagerResponse {
            slot,
            generation,
            method,
            metadata,
            body_len: len,
            ..self.session.stamp_response()
        };
        if let Some(dst) = pool.buf_mut(&mut buf).first_chunk_mut::<HEADER_LEN>() {
            Header::encode_eager_response(&r, dst);
        }
        let len = HEADER_LEN as u32 + len;
        self.session.on_flushed();
        self.sq.send_now(&self.qp, pool, buf, len, len <= self.max_inline, tag)
    }

    /// Queues `s` as the error answer `header` names, in send buffer `buf`: its message as the
    /// body, after its metadata and details (the response's trailers, with the `METADATA` flag,
    /// [`crate::ResponseMetadata`]) when it has any. Trailers and message over the eager area
    /// go without the trailers, the message saying so. Returns the code sent (UNKNOWN for a
    /// status that says OK).
    pub(crate) fn queue_error(
        &mut self,
        pool: &mut SendPool<P>,
        mut buf: SendBuf,
        header: Header,
        s: &crate::status::Status,
    ) -> Code {
        let status = if s.code() == Code::Ok { Code::Unknown } else { s.code() };
        let (body, metadata) = if s.has_extra() {
            self.copy_status(pool, &mut buf, s)
        } else {
            (self.copy_eager(pool, &mut buf, s.message().as_bytes()), false)
        };
        self.queue(pool, buf, Header { status, metadata, ..header }, body);
        status
    }

    /// The body of an error answer with metadata (see [`Conn::queue_error`]), and whether its
    /// trailers went with it.
    #[cold]
    fn copy_status(
        &mut self,
        pool: &mut SendPool<P>,
        buf: &mut SendBuf,
        s: &crate::status::Status,
    ) -> (BodyAt, bool) {
        let mut bytes = crate::metadata::ResponseMetadata::encode_blocks(None, Some(s));
        if bytes.len() + s.message().len() <= self.body_cap {
            bytes.extend_from_slice(s.message().as_bytes());
            return (self.copy_eager(pool, buf, &bytes), true);
        }
        let text = format!(
            "{} (its trailers and details, {} bytes, were dropped: with the message they pass the \
             {}-byte eager body)",
            s.message(),
            bytes.len(),
            self.body_cap
        );
        (self.copy_eager(pool, buf, text.as_bytes()), false)
    }

    /// Copies `bytes` (a status message, or a short body encoded elsewhere) into send buffer
    /// `buf` after the header, truncated to the eager area.
    pub(crate) fn copy_eager(&mut self, pool: &mut SendPool<P>, buf: &mut SendBuf, bytes: &[u8]) -> BodyAt {
        let n = bytes.len().min(self.body_cap);
        if let Some(dst) = pool.buf_mut(buf).get_mut(HEADER_LEN..HEADER_LEN + n) {
            dst.copy_from_slice(&bytes[..n]);
        }
        BodyAt::Eager(n as u32)
    }

    /// Encodes a [`OutBody::Later`] body into the staging area when it has room: `Ok(true)` once
    /// it is `Staged`, `Ok(false)` while the area lacks room (it comes: only bodies ahead of this
    /// one in the outbox, or WRITEs posted already, hold staging space). Registers the staging
    /// area (and the mirror) first when they are not.
    ///
    /// # Errors
    /// INTERNAL when the message does not encode as long as it said, RESOURCE_EXHAUSTED when
    /// the staging area cannot be registered (sent as the answer instead).
    fn encode_later(&mut self, out: &mut Outgoing) -> std::result::Result<bool, crate::status::Status> {
        let OutBody::Later(msg) = &out.body else { return Ok(true) };
        let len = msg.len();
        self.ensure_areas()?;
        let (at, span) = self.staging_spare_mut();
        let Some(dst) = span.get_mut(..len) else { return Ok(false) };
        // A `Message` that does not encode to its `encoded_len()` fails that answer (nothing
        // committed), not the worker.
        let staged = match msg.encode_into(dst) {
            Ok(()) => self.staging_commit(at, len as u32),
            Err(e) => return Err(e.status("answer")),
        };
        match staged {
            Some(s) => {
                out.len = s.len();
                out.body = OutBody::Staged(Some(s));
                Ok(true)
            }
            // Unreachable: `spare_mut` gave the span.
            None => Err(crate::status::Status::internal(format!(
                "a staged answer of {len} bytes lies outside the staging area"
            ))),
        }
    }

    /// Queues what ring space, send buffers and send-queue room allow of a heap body: whole
    /// (eager, or one ring body when it fits now) or piece after piece. Returns true once all of
    /// it is queued; false while it must wait (call again after completions or freed ring space).
    pub(crate) fn send_outgoing(&mut self, pool: &mut SendPool<P>, out: &mut Outgoing, tag: u32) -> bool {
        let total = out.len;
        if let OutBody::Heap(body) = &mut out.body {
            if out.sent == 0
                && total as usize <= self.body_cap
                && total <= self.session.params().eager_threshold
            {
                let Some(mut buf) = self.acquire(pool) else { return false };
                let n = total as usize;
                if let Some(dst) = pool.buf_mut(&mut buf).get_mut(HEADER_LEN..HEADER_LEN + n) {
                    body.copy_next(dst);
                }
                self.queue(pool, buf, out.header, BodyAt::Eager(total));
                out.sent = total;
                self.recycle_heap(out);
                return true;
            }
        }
        while out.sent < total {
            if !self.areas.is_live() {
                // Unreachable: `send_waiting` registers them before a ring body's first piece,
                // and they are not given back while a message waits. Waits rather than sends a
                // piece with no WRITE.
                return false;
            }
            let Some(buf) = self.acquire(pool) else { return false };
            let remaining = total - out.sent;
            let Some((offset, len)) = self.session.next_piece(remaining) else {
                self.give_back(pool, buf);
                return false;
            };
            let from = out.sent;
            match &mut out.body {
                OutBody::Heap(body) => {
                    // Pieces go in order: the body's next `len` bytes (the mirror is registered:
                    // `send_waiting` made sure before the first piece, and it is not given back
                    // while a message waits). Bytes of registered user buffers are WRITTEN
                    // from where they are (`Conn::gather_piece`): the WRITE is queued then.
                    if self.gather_piece(body, offset, len) {
                        let h = Header { total_len: total, ..out.header };
                        self.queue(pool, buf, h, BodyAt::Piece { offset, len, staged: true });
                        out.sent += len;
                        let _ = self.flush(pool, tag);
                        continue;
                    }
                }
                OutBody::Staged(staged) => {
                    // Written straight from the staging area to the granted ring offset.
                    // (A staged body keeps its staging area registered: `SendStaging::used`.)
                    if let (Some(area), Some(s)) = (self.areas.staging(), staged.take()) {
                        let remote = (self.peer_ring.0 + u64::from(offset), self.peer_ring.1);
                        let mark = self.session.ring_write_mark();
                        *staged = self.sq.write_staged(area, s, from, len, remote, mark);
                    }
                }
                // Encoded before the first piece, or failed (`send_waiting`): never here.
                OutBody::Later(_) | OutBody::Failed(_) => {
                    self.give_back(pool, buf);
                    return false;
                }
            }
            let h = Header { total_len: total, ..out.header };
            self.queue(
                pool,
                buf,
                h,
                BodyAt::Piece { offset, len, staged: matches!(out.body, OutBody::Staged(_)) },
            );
            out.sent += len;
            // Each piece is posted as soon as it is queued (one doorbell per piece of up to a
            // quarter of the peer's ring, not one per batch): the peer copies it out and returns
            // its space while the next piece is copied into the mirror, instead of seeing
            // nothing until every piece the ring had room for is copied. A failed post leaves
            // the WRs queued: the driver's own flush reports it and closes the session.
            let _ = self.flush(pool, tag);
        }
        self.recycle_heap(out);
        true
    }

    /// Copies the next `len` bytes of `body` into the mirror at `offset` (a range the session
    /// reserved in the peer's ring), except bytes of registered user buffers of this
    /// connection's protection domain ([`crate::buffers::RegisteredPool`]) when there are
    /// some: then queues the piece's WRITE with a gather list (mirror ranges and the user's
    /// bytes by their lkey, at most the QP's `max_send_sge` SGEs; registered bytes beyond that
    /// are copied) and returns true. False: the piece is in the mirror, its WRITE not queued.
    #[inline]
    fn gather_piece(&mut self, body: &mut GatherBody, offset: u32, len: u32) -> bool {
        let pool = match self.areas.registered() {
            Some(p) if p.has_live() && body.len() > body.own_len() => p.clone(),
            _ => {
                if let Some(m) = self.areas.mirror_mut() {
                    body.copy_next(m.range_mut(offset, len));
                }
                return false;
            }
        };
        let max_refs = (crate::verbs::QueuePair::cap(&self.qp).max_send_sge.saturating_sub(1) / 2) as usize;
        let mut refs = std::mem::take(&mut self.refs);
        let Some(m) = self.areas.mirror_mut() else { return false };
        let copied = body.gather_next(m.range_mut(offset, len), max_refs, |b| pool.lkey_of(b), &mut refs);
        if copied.unwrap_or(0) > 0 {
            pool.count_copied(copied.unwrap_or(0));
        }
        if refs.is_empty() {
            self.refs = refs;
            return false;
        }
        let Some(m) = self.areas.mirror() else { return false };
        let mark = self.session.ring_write_mark();
        // The refs are in order and inside the piece (`gather_next`): never refused.
        if let Ok(n) = self.sq.write_gather(m, offset, len, &mut refs, self.peer_ring, mark) {
            pool.count_zero_copy(n);
        }
        self.refs = refs;
        true
    }

    /// A heap body fully queued (each piece copied into the mirror): its buffer goes back to the
    /// spare ones.
    fn recycle_heap(&mut self, out: &mut Outgoing) {
        if let OutBody::Heap(body) = &mut out.body {
            self.spare.give_back(std::mem::take(body).into_own());
        }
    }

    /// Copies a ring body (or piece) out of our ring into the session's buffer for its message and
    /// frees its ring space; returns the message once complete.
    ///
    /// # Errors
    /// A reason when the piece lies outside the ring or does not add up (close the connection).
    #[inline]
    pub(crate) fn take_piece(&mut self, piece: RingPiece) -> Result<Option<Complete>, &'static str> {
        // A piece of a refused body is not copied: the session counts it and frees its space.
        if !piece.dropped() {
            let Some(ring) = &self.ring else { return Err("ring body with no ring granted") };
            if !ring.copy_out(piece.offset, piece.len, self.session.piece_buffer(&piece)) {
                return Err("ring body outside the ring, or no memory to copy it out");
            }
        }
        self.session.piece_done(piece)
    }

    /// Queues the control messages the session wants sent (Pong, Ping, Cancel) while send
    /// buffers last; what finds none stays due in the session for the next flush.
    #[inline]
    pub(crate) fn queue_controls(&mut self, pool: &mut SendPool<P>) {
        if self.session.lease_pending() {
            self.queue_lease_control(pool);
        }
        while self.session.has_control() {
            let Some(buf) = self.acquire(pool) else { return };
            let Some(h) = self.session.next_control() else {
                self.give_back(pool, buf);
                return;
            };
            self.queue(pool, buf, h, BodyAt::Eager(0));
        }
    }

    /// Queues the lease message the session wants sent ([`Session::next_lease_control`]: a
    /// RingAsk, a RingRelease, which forgets the peer's ring's address and rkey with it, the
    /// answer to an ask, a RingReclaim) when a send buffer is free; else it stays due.
    #[cold]
    #[inline(never)]
    fn queue_lease_control(&mut self, pool: &mut SendPool<P>) {
        let Some(mut buf) = self.acquire(pool) else { return };
        let Some(msg) = self.session.next_lease_control() else {
            self.give_back(pool, buf);
            return;
        };
        let room = self.body_cap.min(crate::wire::MAX_CLOSE_REASON);
        let Some(dst) = pool.buf_mut(&mut buf).get_mut(HEADER_LEN..HEADER_LEN + room) else {
            // Unreachable: every body area holds at least `MIN_BODY_AREA` (256) bytes.
            self.give_back(pool, buf);
            return;
        };
        let n = match &msg {
            LeaseMsg::Ask(bytes) => put(dst, &crate::wire::ring_lease::encode_ring_ask(*bytes)),
            LeaseMsg::Grant(g) => put(dst, &g.encode()),
            LeaseMsg::Refuse(s) => crate::wire::encode_close_reason(s.message(), dst),
            LeaseMsg::Release => {
                // Nothing is WRITTEN there any more (a new grant gives its own).
                self.peer_ring = (0, 0);
                self.written_mark = 0;
                0
            }
            LeaseMsg::Reclaim => 0,
        };
        self.queue(pool, buf, msg.header(), BodyAt::Eager(n as u32));
    }

    /// The granted ring's address and rkey (protocol 12): the ring bodies placed from now on are
    /// WRITTEN there.
    pub(crate) fn set_peer_ring(&mut self, addr: u64, rkey: u32) {
        self.peer_ring = (addr, rkey);
        self.written_mark = 0;
    }

    /// Returns freed ring space to the peer in a RingReturn when bytes are unreported
    /// (messages are stamped with the freed head when queued, so bytes freed after the last one
    /// was queued ride on none of them). Best effort: with no send buffer free, the next message
    /// carries them.
    pub(crate) fn queue_ring_return(&mut self, pool: &mut SendPool<P>) {
        if self.session.ring_return_due() {
            if let Some(buf) = self.acquire(pool) {
                self.queue(pool, buf, Header::new(Kind::RingReturn), BodyAt::Eager(0));
            }
        }
    }

    /// The Close handshake's one message: marks the session closed, queues a Close and posts it
    /// with what was queued (best effort: with no send buffer free, nothing is sent and the peer
    /// learns from the control channel). Returns whether a Close was posted.
    pub(crate) fn send_close(&mut self, pool: &mut SendPool<P>, tag: u32) -> bool {
        self.send_close_why(pool, tag, crate::status::Code::Ok, "")
    }

    /// [`Conn::send_close`] saying why: the Close carries `code` and `reason` (cut to
    /// [`crate::wire::MAX_CLOSE_REASON`] bytes and to the eager area, control characters as
    /// spaces; see `wire::close`). The session's memory held for reassembly is given back now.
    pub(crate) fn send_close_why(
        &mut self,
        pool: &mut SendPool<P>,
        tag: u32,
        code: crate::status::Code,
        reason: &str,
    ) -> bool {
        self.session.close();
        let Some(mut buf) = self.acquire(pool) else { return false };
        let room = self.body_cap.min(crate::wire::MAX_CLOSE_REASON);
        let n = match pool.buf_mut(&mut buf).get_mut(HEADER_LEN..HEADER_LEN + room) {
            Some(dst) => crate::wire::encode_close_reason(reason, dst),
            None => 0,
        };
        let mut h = Header { status: code, ..Header::new(Kind::Close) };
        h.body_len = n as u32;
        h.total_len = n as u32;
        self.session.stamp(&mut h);
        if let Some(dst) = pool.buf_mut(&mut buf).get_mut(..HEADER_LEN) {
            if let Ok(dst) = <&mut [u8; HEADER_LEN]>::try_from(dst) {
                h.encode(dst);
            }
        }
        // Never inline: a SEND whose buffer the NIC reads is signaled (`SendQueue`'s selective
        // signaling), so the Close's completion comes and the worker frees the session with it.
        self.sq.send(pool, buf, HEADER_LEN as u32 + n as u32, false);
        self.flush(pool, tag).is_ok()
    }

    /// Gives back what a polled completion of this connection's signaled send WR retires (send
    /// buffers, staged ranges) and tells the session which ring WRITEs no longer read the send
    /// mirror ([`Session::on_ring_written`]). Ignored for a completion of another queue or a
    /// failed one (see [`SendQueue::on_completion`]).
    #[inline]
    pub(crate) fn on_send_completion(&mut self, pool: &mut SendPool<P>, c: crate::buffers::Completion) {
        self.sq.on_completion(c, pool);
        self.sq.retire_held();
        if let Some(staging) = self.areas.staging_mut() {
            self.sq.retire_staged(staging);
        }
        if let Some(mark) = self.sq.take_ring_mark() {
            self.session.on_ring_written(mark);
            self.written_mark = mark;
        }
    }

    /// Frees the connection for good, giving the send buffers its WRs still use back to `pool`
    /// (a pool it shares with others: a server worker's): the receive ring's window goes first,
    /// then the QP is destroyed, and only then are its buffers free
    /// ([`SendQueue::reclaim`]); its send mirror and staging area go last.
    pub(crate) fn close(self, pool: &mut SendPool<P>) {
        let Conn { ring, qp, mut sq, areas, .. } = self;
        drop(ring);
        sq.reclaim(qp, pool);
        drop(areas);
    }

    /// Posts what was queued (one doorbell per batch). `tag` identifies the connection in the
    /// signaled WR's `wr_id`.
    pub(crate) fn flush(&mut self, pool: &mut SendPool<P>, tag: u32) -> Result<()> {
        if self.sq.is_empty() {
            return Ok(());
        }
        // What was queued leaves now (answers among it: the credits' signal starts over).
        self.session.on_flushed();
        self.sq.flush(&self.qp, pool, tag)
    }
}

/// The header fields of a message whose `len` body bytes follow it in its SEND.
#[inline(always)]
fn eager_header(h: &mut Header, len: u32) {
    h.in_ring = false;
    h.body_len = len;
    h.total_len = len;
    h.ring_offset = 0;
}

/// A CQ sized for `recv` receive WQEs and `sends` signaled send completions.
pub(crate) fn create_cq<P: Provider>(
    ctx: &P::Context,
    recv: u32,
    sends: u32,
    events: bool,
) -> Result<P::CompletionQueue> {
    let want = recv.saturating_add(sends).max(64);
    let cqe = want.min(ctx.attr().max_cqe.max(64));
    if cqe < want {
        tracing::warn!(
            provider = P::NAME,
            asked = want,
            granted = cqe,
            "CQ size cut to the device's max_cqe: a burst of completions beyond it overflows the CQ"
        );
    }
    let cq = ctx.create_cq(cqe, events)?;
    debug_assert!(cq.capacity() >= cqe);
    Ok(cq)
}
