//! RC queue pairs: creation, the state machine (`modify`), posting, flushing and destruction.
//! The transfer itself (what the NIC does with a send WQE) is in [`super::exec`].

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::cq::{CqCore, SqRef};
use super::fabric::{fabric, Dest};
use super::guard::SpinGuard;
use super::host::{HostCore, SimPd};
use super::ring::{Padded, Ring};
use super::srq::{pop_recv_id, post_recv_ring, RecvRing, SrqCore};
use super::{Sim, MAX_INLINE, MAX_QP_WR, MAX_SGE};
use crate::verbs::{
    QpAttr, QpCap, QpInitAttr, QpState, QueuePair, RecvWr, Result, SendFlags, SendOp, SendWr, Sge,
    VerbsError, WcOpcode, WcStatus, WorkCompletion,
};

pub(crate) const ST_RESET: u8 = 0;
pub(crate) const ST_INIT: u8 = 1;
pub(crate) const ST_RTR: u8 = 2;
pub(crate) const ST_RTS: u8 = 3;
pub(crate) const ST_ERR: u8 = 6;

fn state_of(s: u8) -> QpState {
    match s {
        ST_RESET => QpState::Reset,
        ST_INIT => QpState::Init,
        ST_RTR => QpState::Rtr,
        ST_RTS => QpState::Rts,
        _ => QpState::Err,
    }
}

/// A queued send WQE (SGEs copied at post time; inline bytes live in the QP's inline arena).
#[derive(Clone, Copy)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) flags: SendFlags,
    pub(crate) nsge: u8,
    pub(crate) sges: [Sge; MAX_SGE],
    /// Bytes of inline payload in the arena, or [`NOT_INLINE`].
    pub(crate) inline_len: u32,
}

pub(crate) const NOT_INLINE: u32 = u32::MAX;

/// Why a WQE could not be delivered yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StallKind {
    /// Receiver not ready (no receive WQE posted): retried after the responder's RNR timer.
    Rnr,
    /// Packet lost (peer unreachable, dropped, wrong PSN, peer not ready): retried after the
    /// local ACK timeout.
    Lost,
    /// Held back by injected delay ([`super::SimQp::set_delay`]); no retry budget involved.
    Delay,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Stall {
    pub(crate) kind: StallKind,
    /// When to retry, in [`super::fabric::now_ns`] time; `u64::MAX` = never (timeout 0).
    pub(crate) deadline: u64,
    /// Retries left; for RNR with `rnr_retry == 7`, unlimited.
    pub(crate) left: u8,
}

/// The requester's view of its connection: set by `modify`, used by the executor.
pub(crate) struct Link {
    pub(crate) dest: Option<Dest>,
    /// The resolved peer QP (cached at the first packet; cleared on RESET and destroy).
    pub(crate) peer: Option<super::peer::PeerQp>,
    /// Next PSN to send (24 bits).
    pub(crate) psn: u32,
    /// Path MTU in bytes.
    pub(crate) mtu: u32,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
}

/// The send queue: everything here is touched only with the QP's guard held.
///
/// Positions count WQEs since the QP's creation (a WQE's position is its sequence number):
/// `[head, tail)` are posted and not executed yet; `[retired, tail)` hold send-queue slots,
/// where `retired` (in [`super::sqslots::SqSlots`]) advances when a send completion is polled.
pub(crate) struct SqState {
    pub(crate) wqes: Box<[SendWqe]>,
    pub(crate) inline: Box<[u8]>,
    pub(crate) head: u64,
    pub(crate) tail: u64,
    /// The retired count as last read (never ahead of the real one, nor of `head`).
    pub(crate) retired_seen: u64,
    pub(crate) link: Link,
    pub(crate) stall: Option<Stall>,
}

/// What a peer's executor reads of this QP as a responder (read-mostly).
pub(crate) struct RespSide {
    pub(crate) state: AtomicU8,
    pub(crate) destroyed: AtomicBool,
    /// Fault injection: every packet from or to this QP is lost.
    pub(crate) drop_traffic: AtomicBool,
    pub(crate) min_rnr_timer: AtomicU8,
    pub(crate) access: AtomicU32,
    /// The QPN (a peer checks it: the memory of a destroyed QP may be reused).
    pub(crate) qpn: AtomicU32,
    pub(crate) pd: AtomicU32,
    /// The PD receive buffers are checked against (the SRQ's for an SRQ).
    pub(crate) recv_pd: AtomicU32,
    /// Segment offsets of the receive ring (RQ or SRQ) and of the receive CQ.
    pub(crate) recv_ring_off: AtomicU64,
    pub(crate) recv_cq_off: AtomicU64,
}

pub(crate) struct SqGuard {
    lock: SpinGuard,
    flush_pending: AtomicBool,
}

/// The part of a QP that lives in its host's segment, where peers (in this process or another)
/// reach it: responder state, expected PSN, and the send-queue guard (a peer may ask for a
/// flush). Valid when zeroed (RESET).
#[repr(C)]
pub(crate) struct QpShared {
    pub(crate) resp: Padded<RespSide>,
    /// Expected PSN of the next incoming request: written by the requester at the other end.
    pub(crate) epsn: Padded<AtomicU32>,
    /// The send-queue guard and, on the same line (local to the QP's thread), the flag by which
    /// other threads ask the guard holder to flush.
    pub(crate) guard: Padded<SqGuard>,
}

impl QpShared {
    /// Moves the QP to ERR from outside its process: the RQ is flushed by the caller; the send
    /// queue by the owner at its next post or timer tick.
    pub(crate) fn request_flush(&self) {
        self.guard.flush_pending.store(true, Ordering::SeqCst);
    }
}

pub(crate) struct QpCore {
    pub(crate) host: Arc<HostCore>,
    pub(crate) qpn: u32,
    pub(crate) pd: u32,
    pub(crate) send_cq: Arc<CqCore>,
    pub(crate) recv_cq: Arc<CqCore>,
    pub(crate) srq: Option<Arc<SrqCore>>,
    pub(crate) rq: Option<RecvRing>,
    pub(crate) cap: QpCap,
    pub(crate) sig_all: bool,
    /// This QP's tag in its host's send-queue table (send CQEs carry it).
    sq_tag: u16,
    /// Slots are held until a send completion is polled ([`super::SendQueueMode::RetireOnPoll`]).
    retire_on_poll: bool,
    /// The shared part, in the host's segment at `off` (with the RQ ring after it).
    sh: *const QpShared,
    off: usize,
    bytes: usize,
    /// Own cache lines: the executor writes it on every WR, peers never read it.
    sq: Padded<UnsafeCell<SqState>>,
    /// Fault injection: each send WR waits this long (ns) at the head of the SQ; 0 = none.
    pub(crate) delay_ns: AtomicU64,
    /// Handed to the timer thread (set under the guard or before scheduling).
    pub(crate) scheduled: AtomicBool,
    /// Mirror of the stall deadline for the timer thread.
    deadline: AtomicU64,
}

// SAFETY: `sq` is only accessed with `guard` held (see `with_sq`); `sh` points to atomics in the
// segment the QP's `host` keeps mapped; everything else is immutable data or `Sync` types.
unsafe impl Sync for QpCore {}
// SAFETY: as above.
unsafe impl Send for QpCore {}

impl Drop for QpCore {
    fn drop(&mut self) {
        self.host.arena.free(&self.host.seg, self.off, self.bytes);
    }
}

impl QpCore {
    /// The shared part (responder state, PSN, guard).
    #[inline(always)]
    pub(crate) fn sh(&self) -> &QpShared {
        // SAFETY: `sh` points into the segment, which `self.host` keeps mapped, and is freed
        // only when this core drops.
        unsafe { &*self.sh }
    }

    #[inline]
    pub(crate) fn state_raw(&self) -> u8 {
        self.sh().resp.state.load(Ordering::Acquire)
    }

    /// The receive queue this QP's incoming SENDs consume.
    #[inline]
    pub(crate) fn recv_ring(&self) -> &RecvRing {
        match (&self.srq, &self.rq) {
            (Some(srq), _) => &srq.ring,
            (None, Some(rq)) => rq,
            (None, None) => unreachable!("a QP has an SRQ or an RQ"),
        }
    }

    /// The PD receive buffers are checked against (the SRQ's for an SRQ).
    #[inline]
    pub(crate) fn recv_pd(&self) -> u32 {
        self.srq.as_ref().map_or(self.pd, |s| s.pd)
    }

    /// Runs `f` on the send queue with the guard held, then releases it (performing a flush
    /// another thread asked for meanwhile).
    #[inline]
    pub(crate) fn with_sq<R>(&self, f: impl FnOnce(&mut SqState) -> R) -> R {
        self.sh().guard.lock.lock();
        // SAFETY: the guard is held, so this is the only reference to the send queue.
        let r = f(unsafe { &mut *self.sq.get() });
        self.release();
        r
    }

    /// Like [`QpCore::with_sq`] but gives up when the guard is busy.
    fn try_with_sq<R>(&self, f: impl FnOnce(&mut SqState) -> R) -> Option<R> {
        if !self.sh().guard.lock.try_lock() {
            return None;
        }
        // SAFETY: the guard is held, so this is the only reference to the send queue.
        let r = f(unsafe { &mut *self.sq.get() });
        self.release();
        Some(r)
    }

    /// Releases the guard, first performing a flush another thread asked for meanwhile (if it
    /// is visible yet; otherwise the timer thread does it, see [`QpCore::set_error`]).
    #[inline]
    fn release(&self) {
        loop {
            self.sh().guard.lock.unlock();
            if !self.sh().guard.flush_pending.load(Ordering::Acquire) || !self.sh().guard.lock.try_lock() {
                return;
            }
            // SAFETY: the guard is held again.
            self.flush_sq_locked(unsafe { &mut *self.sq.get() });
        }
    }

    /// Waits until no thread is inside this QP's send-queue section (grace period for MR
    /// deregistration).
    pub(crate) fn quiesce(&self) {
        self.with_sq(|_| ());
    }

    pub(crate) fn deadline_ns(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }

    /// Called by the timer thread: performs a requested flush and retries the stalled WQE if
    /// due. Clears `scheduled` (under the guard) once the QP no longer needs the timer thread.
    pub(crate) fn on_timer(&self, now: u64) {
        if self.sh().resp.destroyed.load(Ordering::Acquire) {
            self.scheduled.store(false, Ordering::Release);
            return;
        }
        if now < self.deadline_ns() {
            return;
        }
        let _ = self.try_with_sq(|st| {
            if self.sh().guard.flush_pending.load(Ordering::Acquire) {
                self.flush_sq_locked(st);
            }
            if !self.progress_locked(st) {
                self.scheduled.store(false, Ordering::SeqCst);
                // A flush requested meanwhile keeps the QP scheduled (pairs with `set_error`:
                // its flag store precedes its `scheduled` store).
                if self.sh().guard.flush_pending.load(Ordering::SeqCst) {
                    self.scheduled.store(true, Ordering::SeqCst);
                }
            }
        });
    }

    /// Records a stall of the head WQE. Returns `true` while retries remain (the QP waits),
    /// `false` when they are exhausted (the caller fails the WQE with the returned status).
    pub(crate) fn note_stall(
        &self,
        stall: &mut Option<Stall>,
        link: &Link,
        kind: StallKind,
    ) -> std::result::Result<(), WcStatus> {
        let (budget, infinite, exhausted) = match kind {
            StallKind::Rnr => (link.rnr_retry, link.rnr_retry == 7, WcStatus::IBV_WC_RNR_RETRY_EXC_ERR),
            StallKind::Lost | StallKind::Delay => (link.retry_cnt, false, WcStatus::IBV_WC_RETRY_EXC_ERR),
        };
        let left = match *stall {
            Some(s) if s.kind == kind => {
                if infinite {
                    s.left
                } else {
                    s.left.saturating_sub(1)
                }
            }
            _ => budget,
        };
        if left == 0 && !infinite {
            *stall = None;
            return Err(exhausted);
        }
        let now = super::fabric::now_ns();
        let delay = match kind {
            StallKind::Rnr => {
                let code =
                    link.peer.as_ref().map_or(12, |p| p.sh().resp.min_rnr_timer.load(Ordering::Relaxed));
                rnr_delay_ns(code)
            }
            StallKind::Lost | StallKind::Delay => ack_timeout_ns(link.timeout),
        };
        let deadline = now.saturating_add(delay);
        *stall = Some(Stall { kind, deadline, left });
        self.deadline.store(deadline, Ordering::Relaxed);
        Ok(())
    }

    /// Executes queued WQEs in order until the queue is empty, a WQE stalls, or the QP fails.
    /// Returns `true` when the QP is waiting on a timer. Guard held.
    pub(crate) fn progress_locked(&self, st: &mut SqState) -> bool {
        let mask = st.wqes.len() - 1;
        let max_inline = self.cap.max_inline_data as usize;
        while st.head != st.tail {
            if self.state_raw() == ST_ERR {
                self.flush_sq_locked(st);
                return false;
            }
            if let Some(s) = st.stall {
                if super::fabric::now_ns() < s.deadline {
                    return true;
                }
            }
            let delay = self.delay_ns.load(Ordering::Relaxed);
            if delay > 0 && !st.stall.is_some_and(|s| s.kind == StallKind::Delay) {
                let deadline = super::fabric::now_ns().saturating_add(delay);
                st.stall = Some(Stall { kind: StallKind::Delay, deadline, left: 0 });
                self.deadline.store(deadline, Ordering::Relaxed);
                return true;
            }
            let idx = st.head as usize & mask;
            let wqe = st.wqes[idx];
            let src = if wqe.inline_len == NOT_INLINE {
                super::exec::Src::Sges(&wqe.sges[..wqe.nsge as usize])
            } else {
                super::exec::Src::Inline(
                    &st.inline[idx * max_inline..idx * max_inline + wqe.inline_len as usize],
                )
            };
            let view = super::exec::WqeView { wr_id: wqe.wr_id, op: wqe.op, flags: wqe.flags, src };
            let outcome = self.exec(&mut st.link, &view);
            let seq = st.head;
            let status = match outcome {
                super::exec::Outcome::Done(len) => {
                    self.complete_ok(&view, len, seq);
                    st.stall = None;
                    st.head += 1;
                    continue;
                }
                super::exec::Outcome::Stall(kind) => match self.note_stall(&mut st.stall, &st.link, kind) {
                    Ok(()) => return true,
                    Err(status) => status,
                },
                super::exec::Outcome::Fail(status) => status,
            };
            st.stall = None;
            st.head += 1;
            self.fail_locked(st, seq, wqe.wr_id, &wqe.op, status);
            return false;
        }
        st.stall = None;
        false
    }

    /// The send-queue reference a CQE of WQE `seq` carries.
    #[inline(always)]
    fn sq_ref(&self, seq: u64) -> SqRef {
        SqRef { tag: self.sq_tag, seq: seq as u32 }
    }

    /// A successful send WQE (sequence number `seq`): a CQE if signaled.
    #[inline]
    pub(crate) fn complete_ok(&self, v: &super::exec::WqeView<'_>, len: u64, seq: u64) {
        if self.sig_all || v.flags.contains(SendFlags::SIGNALED) {
            self.send_cq.push_send(
                WorkCompletion {
                    wr_id: v.wr_id,
                    status: WcStatus::IBV_WC_SUCCESS,
                    opcode: send_opcode(&v.op),
                    byte_len: len as u32,
                    imm_data: None,
                    qp_num: self.qpn,
                    src_qp: 0,
                    vendor_err: 0,
                    invalidated_rkey: None,
                },
                false,
                self.sq_ref(seq),
            );
        }
    }

    /// A failed send WQE (already removed from the queue, or never queued): its error CQE
    /// (whatever its signaling), then the QP goes to ERR and everything else is flushed.
    /// `seq` is the WQE's sequence number (its CQE retires it and everything before).
    pub(crate) fn fail_locked(&self, st: &mut SqState, seq: u64, wr_id: u64, op: &SendOp, status: WcStatus) {
        tracing::debug!(qp = self.qpn, wr_id, ?status, "sim: send WR failed, QP -> ERR");
        let wc = WorkCompletion { status, ..flush_wc(wr_id, send_opcode(op), self.qpn) };
        self.send_cq.push_send(wc, true, self.sq_ref(seq));
        self.sh().resp.state.store(ST_ERR, Ordering::SeqCst);
        self.flush_rq();
        self.flush_sq_locked(st);
    }

    /// Moves the QP to ERR from any thread (holding its guard or not): flushes the RQ now, and
    /// the SQ now if the guard is free, else at the holder's release or, failing that, from the
    /// timer thread (so the hot path's unlock needs no fence).
    pub(crate) fn set_error(self: &Arc<Self>) {
        if self.sh().resp.destroyed.load(Ordering::Acquire) {
            return;
        }
        self.sh().resp.state.store(ST_ERR, Ordering::SeqCst);
        self.flush_rq();
        self.sh().guard.flush_pending.store(true, Ordering::SeqCst);
        if self.try_with_sq(|st| self.flush_sq_locked(st)).is_none() {
            self.deadline.store(0, Ordering::Relaxed);
            self.scheduled.store(true, Ordering::SeqCst);
            fabric().schedule(self.clone());
        }
    }

    /// Completes every queued send WQE with `IBV_WC_WR_FLUSH_ERR`. Guard held.
    fn flush_sq_locked(&self, st: &mut SqState) {
        self.sh().guard.flush_pending.store(false, Ordering::SeqCst);
        if self.state_raw() != ST_ERR || self.sh().resp.destroyed.load(Ordering::Acquire) {
            return;
        }
        let mask = st.wqes.len() - 1;
        while st.head != st.tail {
            let wqe = &st.wqes[st.head as usize & mask];
            let wc = flush_wc(wqe.wr_id, send_opcode(&wqe.op), self.qpn);
            self.send_cq.push_send(wc, true, self.sq_ref(st.head));
            st.head += 1;
        }
        st.stall = None;
    }

    /// Completes every WQE of the QP's own receive queue with `IBV_WC_WR_FLUSH_ERR` (an SRQ is
    /// shared and not flushed, as in verbs).
    pub(crate) fn flush_rq(&self) {
        if let Some(rq) = &self.rq {
            while let Some(wr_id) = pop_recv_id(rq) {
                self.recv_cq.push(flush_wc(wr_id, WcOpcode::IBV_WC_RECV, self.qpn), true);
            }
        }
    }
}

/// The completion of a WR flushed by a QP in ERR (`IBV_WC_WR_FLUSH_ERR`); error completions
/// start from it and set their own status.
pub(crate) fn flush_wc(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::IBV_WC_WR_FLUSH_ERR,
        opcode,
        byte_len: 0,
        imm_data: None,
        qp_num,
        src_qp: 0,
        vendor_err: 0,
        invalidated_rkey: None,
    }
}

pub(crate) fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::IBV_WC_SEND,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::IBV_WC_RDMA_WRITE,
        SendOp::RdmaRead { .. } => WcOpcode::IBV_WC_RDMA_READ,
        SendOp::BindMw { .. } => WcOpcode::IBV_WC_BIND_MW,
        SendOp::LocalInv { .. } => WcOpcode::IBV_WC_LOCAL_INV,
    }
}

/// The RNR NAK timer of `min_rnr_timer` code `code` (IBA table 45), in ns.
pub(crate) fn rnr_delay_ns(code: u8) -> u64 {
    const US_X100: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
        3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    US_X100[(code & 31) as usize] * 10_000
}

/// The local ACK timeout of code `t`: 4.096 µs × 2^t, in ns; 0 = infinite.
pub(crate) fn ack_timeout_ns(t: u8) -> u64 {
    if t == 0 {
        u64::MAX
    } else {
        4096u64 << t.min(31)
    }
}

// ---------------------------------------------------------------------------------------------
// The public handle.

/// An RC queue pair of the software NIC. Dropping it destroys the QP: queued work is discarded
/// without completions, packets to it are lost from then on.
pub struct SimQp {
    pub(crate) core: Arc<QpCore>,
}

impl std::fmt::Debug for SimQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimQp")
            .field("host", &self.core.host.id)
            .field("qp_num", &self.core.qpn)
            .field("state", &self.state())
            .finish()
    }
}

fn cap_err(what: &'static str, cap: &'static str, requested: u32, limit: u32) -> VerbsError {
    VerbsError::CapExceeded { what, cap, requested: requested as u64, limit: limit as u64 }
}

impl SimQp {
    pub(crate) fn new(pd: &SimPd, attr: &QpInitAttr<'_, Sim>) -> Result<SimQp> {
        let c = attr.cap;
        if c.max_send_wr == 0 || c.max_send_wr > MAX_QP_WR {
            return Err(cap_err("ibv_create_qp max_send_wr", "max_qp_wr", c.max_send_wr, MAX_QP_WR));
        }
        if attr.srq.is_none() && (c.max_recv_wr == 0 || c.max_recv_wr > MAX_QP_WR) {
            return Err(cap_err("ibv_create_qp max_recv_wr", "max_qp_wr", c.max_recv_wr, MAX_QP_WR));
        }
        if c.max_send_sge > MAX_SGE as u32 {
            return Err(cap_err("ibv_create_qp max_send_sge", "max_sge", c.max_send_sge, MAX_SGE as u32));
        }
        if c.max_recv_sge > MAX_SGE as u32 {
            return Err(cap_err("ibv_create_qp max_recv_sge", "max_sge", c.max_recv_sge, MAX_SGE as u32));
        }
        if c.max_inline_data > MAX_INLINE as u32 {
            return Err(cap_err(
                "ibv_create_qp max_inline_data",
                "max_inline_data",
                c.max_inline_data,
                MAX_INLINE as u32,
            ));
        }
        let host = pd.inner.host.clone();
        let same_host = Arc::ptr_eq(attr.send_cq.core.host(), &host)
            && Arc::ptr_eq(attr.recv_cq.core.host(), &host)
            && attr.srq.is_none_or(|s| Arc::ptr_eq(&s.core._host, &host));
        if !same_host {
            return Err(VerbsError::InvalidArgument {
                call: "ibv_create_qp",
                reason: "the CQs and the SRQ must belong to the PD's device context".into(),
            });
        }
        let depth = (c.max_send_wr as usize).next_power_of_two();
        let sh_bytes = std::mem::size_of::<QpShared>();
        let rq_depth = if attr.srq.is_none() { c.max_recv_wr as usize } else { 0 };
        let bytes = sh_bytes + if rq_depth > 0 { super::srq::RecvRing::bytes(rq_depth) } else { 0 };
        let off = host.alloc("ibv_create_qp", bytes, 128)?;
        let sh_ptr = host.seg.at(off) as *const QpShared;
        // SAFETY: a fresh zeroed 128-aligned allocation of `bytes` in the segment (freed when the
        // core drops, after the ring view); the ring follows the shared part.
        let rq = (rq_depth > 0).then(|| unsafe { Ring::init(host.seg.at(off + sh_bytes), rq_depth, true) });
        let cap = QpCap {
            max_send_wr: depth as u32,
            max_recv_wr: rq.as_ref().map_or(c.max_recv_wr, |r| r.capacity() as u32),
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: c.max_recv_sge.max(1),
            max_inline_data: c.max_inline_data,
        };
        let empty = SendWqe {
            wr_id: 0,
            op: SendOp::Send,
            flags: SendFlags::EMPTY,
            nsge: 0,
            sges: [Sge::default(); MAX_SGE],
            inline_len: NOT_INLINE,
        };
        // SAFETY: as above: zeroed atomics (a valid RESET state).
        let sh = unsafe { &*sh_ptr };
        let retire_on_poll = super::sqslots::send_queue_mode() == super::SendQueueMode::RetireOnPoll;
        let Some(qpn) = host.alloc_qpn(off) else {
            host.arena.free(&host.seg, off, bytes);
            return Err(cap_err(
                "ibv_create_qp",
                "max_qp",
                super::shm::QP_DIR_LEN as u32 + 1,
                super::shm::QP_DIR_LEN as u32,
            ));
        };
        let r = &sh.resp;
        r.min_rnr_timer.store(12, Ordering::Relaxed);
        r.pd.store(pd.inner.id, Ordering::Relaxed);
        r.recv_pd.store(attr.srq.map_or(pd.inner.id, |s| s.core.pd), Ordering::Relaxed);
        let ring_off = match attr.srq {
            Some(s) => s.core.off,
            None => off + sh_bytes,
        };
        r.recv_ring_off.store(ring_off as u64, Ordering::Relaxed);
        r.recv_cq_off.store(attr.recv_cq.core.offset() as u64, Ordering::Relaxed);
        r.qpn.store(qpn, Ordering::Release);
        let sq_tag = host.sq_slots.attach(qpn);
        let core = Arc::new(QpCore {
            qpn,
            host,
            pd: pd.inner.id,
            send_cq: attr.send_cq.core.clone(),
            recv_cq: attr.recv_cq.core.clone(),
            srq: attr.srq.map(|s| s.core.clone()),
            rq,
            cap,
            sig_all: attr.sq_sig_all,
            sq_tag,
            retire_on_poll,
            sh: sh_ptr,
            off,
            bytes,
            sq: Padded(UnsafeCell::new(SqState {
                wqes: vec![empty; depth].into_boxed_slice(),
                inline: vec![0u8; depth * cap.max_inline_data as usize].into_boxed_slice(),
                head: 0,
                tail: 0,
                retired_seen: 0,
                link: Link {
                    dest: None,
                    peer: None,
                    psn: 0,
                    mtu: 4096,
                    timeout: 14,
                    retry_cnt: 7,
                    rnr_retry: 7,
                },
                stall: None,
            })),
            delay_ns: AtomicU64::new(0),
            scheduled: AtomicBool::new(false),
            deadline: AtomicU64::new(u64::MAX),
        });
        fabric().register_qp(&core);
        Ok(SimQp { core })
    }

    /// Hands the QP to the timer thread if it waits on a timer and is not there yet.
    #[inline]
    fn schedule_if_waiting(&self, waiting: bool) {
        if waiting && !self.core.scheduled.swap(true, Ordering::AcqRel) {
            fabric().schedule(self.core.clone());
        }
    }

    /// Appends `wr` to the send queue (copying inline data into the arena). Guard held.
    fn enqueue(&self, st: &mut SqState, wr: &SendWr<'_>) {
        let c = &*self.core;
        let mask = st.wqes.len() - 1;
        let idx = st.tail as usize & mask;
        let mut wqe = SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            flags: wr.flags,
            nsge: 0,
            sges: [Sge::default(); MAX_SGE],
            inline_len: NOT_INLINE,
        };
        if wr.flags.contains(SendFlags::INLINE) {
            let max_inline = c.cap.max_inline_data as usize;
            let arena = &mut st.inline[idx * max_inline..(idx + 1) * max_inline];
            let mut off = 0;
            for sge in wr.sg_list {
                let n = sge.length as usize;
                // SAFETY: the caller of `post_send` guarantees that inline SGEs point to readable
                // memory during the call; `off + n <= max_inline` was checked in validation.
                unsafe { std::ptr::copy(sge.addr as *const u8, arena[off..].as_mut_ptr(), n) };
                off += n;
            }
            wqe.inline_len = off as u32;
        } else {
            wqe.nsge = wr.sg_list.len() as u8;
            wqe.sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        }
        st.wqes[idx] = wqe;
        st.tail += 1;
    }

    /// Checks a send WR against the QP's capacities.
    fn validate(&self, index: usize, wr: &SendWr<'_>) -> Result<()> {
        let cap = &self.core.cap;
        let bad = |reason: String| Err(VerbsError::BadWorkRequest { call: "ibv_post_send", index, reason });
        if matches!(wr.op, SendOp::BindMw { .. } | SendOp::LocalInv { .. }) && !wr.sg_list.is_empty() {
            return bad("BIND_MW and LOCAL_INV take no SGEs".into());
        }
        if wr.flags.contains(SendFlags::INLINE) {
            if matches!(wr.op, SendOp::RdmaRead { .. }) {
                return bad("INLINE is not valid for RDMA READ".into());
            }
            let total: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
            if total > cap.max_inline_data as u64 {
                return bad(format!(
                    "{total} bytes inline, the QP's max_inline_data is {}",
                    cap.max_inline_data
                ));
            }
            if wr.sg_list.len() > MAX_SGE {
                return bad(format!("{} SGEs, the QP allows {}", wr.sg_list.len(), MAX_SGE));
            }
        } else if wr.sg_list.len() > cap.max_send_sge as usize {
            return bad(format!("{} SGEs, the QP's max_send_sge is {}", wr.sg_list.len(), cap.max_send_sge));
        }
        Ok(())
    }

    /// `Some(outstanding WQEs)` when the send queue has no free slot for another WR. Guard held.
    #[inline]
    fn sq_full(&self, st: &mut SqState, depth: u64) -> Option<u64> {
        let c = &*self.core;
        if !c.retire_on_poll {
            let queued = st.tail - st.head;
            return (queued >= depth).then_some(queued);
        }
        if st.tail - st.retired_seen < depth {
            return None;
        }
        // Re-read the count the CQ's poller advances only when the cached one says full. It
        // never passes `head` (a WQE completes only once executed or flushed).
        st.retired_seen = c.host.sq_slots.retired(c.qpn).max(st.retired_seen).min(st.head);
        let outstanding = st.tail - st.retired_seen;
        (outstanding >= depth).then_some(outstanding)
    }

    fn post_send_locked(&self, st: &mut SqState, wrs: &[SendWr<'_>]) -> Result<()> {
        let c = &*self.core;
        let state = c.state_raw();
        if state != ST_RTS && state != ST_ERR {
            return Err(VerbsError::BadQpState {
                call: "ibv_post_send",
                qp_num: c.qpn,
                state: state_of(state),
            });
        }
        let depth = st.wqes.len() as u64;
        // A refused WR ends the list, but the WRs before it were posted: they still get the
        // flush or the progress below.
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.validate(index, wr) {
                result = Err(e);
                break;
            }
            if let Some(outstanding) = self.sq_full(st, depth) {
                result = Err(VerbsError::BadWorkRequest {
                    call: "ibv_post_send",
                    index,
                    reason: format!(
                        "the work queue is full (ENOMEM: {outstanding} WQEs outstanding, max_send_wr {depth}; \
                         a WQE is retired when a signaled completion at or after it is polled)"
                    ),
                });
                break;
            }
            if st.head == st.tail && c.state_raw() == ST_RTS && c.delay_ns.load(Ordering::Relaxed) == 0 {
                // Fast path: nothing queued ahead, execute at once from the caller's WR.
                let src = if wr.flags.contains(SendFlags::INLINE) {
                    super::exec::Src::Raw(wr.sg_list)
                } else {
                    super::exec::Src::Sges(wr.sg_list)
                };
                let view = super::exec::WqeView { wr_id: wr.wr_id, op: wr.op, flags: wr.flags, src };
                // The WR takes its send-queue slot (position `seq`) whatever happens.
                let seq = st.tail;
                match c.exec(&mut st.link, &view) {
                    super::exec::Outcome::Done(len) => {
                        c.complete_ok(&view, len, seq);
                        st.tail += 1;
                        st.head += 1;
                    }
                    super::exec::Outcome::Stall(kind) => {
                        self.enqueue(st, wr);
                        if let Err(status) = c.note_stall(&mut st.stall, &st.link, kind) {
                            st.head += 1;
                            c.fail_locked(st, seq, wr.wr_id, &wr.op, status);
                        }
                    }
                    super::exec::Outcome::Fail(status) => {
                        st.tail += 1;
                        st.head += 1;
                        c.fail_locked(st, seq, wr.wr_id, &wr.op, status);
                    }
                }
            } else {
                self.enqueue(st, wr);
            }
        }
        if c.state_raw() == ST_ERR {
            c.flush_sq_locked(st);
        } else if st.head != st.tail {
            c.progress_locked(st);
        }
        result
    }

    fn modify_locked(&self, st: &mut SqState, attr: &QpAttr) -> Result<()> {
        let c = &*self.core;
        let from = state_of(c.state_raw());
        let to = attr.state;
        let mask = attr_mask(attr);
        let fail = |reason: String| {
            Err(VerbsError::QpTransition { call: "ibv_modify_qp", qp_num: c.qpn, from, to, mask, reason })
        };
        let (required, optional) = match (from, to) {
            (_, QpState::Reset) | (_, QpState::Err) => (0, u32::MAX),
            (QpState::Reset, QpState::Init) => (M_PKEY | M_PORT | M_ACCESS, 0),
            (QpState::Init, QpState::Init) => (0, M_PKEY | M_PORT | M_ACCESS),
            (QpState::Init, QpState::Rtr) => {
                (M_AV | M_PATH_MTU | M_DEST_QPN | M_RQ_PSN | M_MAX_DEST_RD | M_MIN_RNR, M_ACCESS | M_PKEY)
            }
            (QpState::Rtr, QpState::Rts) => {
                (M_SQ_PSN | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_MAX_RD, M_ACCESS | M_MIN_RNR)
            }
            (QpState::Rts, QpState::Rts) => (0, M_ACCESS | M_MIN_RNR),
            _ => return fail("transition not allowed by the QP state machine".into()),
        };
        let missing = required & !mask;
        if missing != 0 {
            return fail(format!("missing attribute(s): {}", mask_names(missing)));
        }
        let extra = mask & !(required | optional | M_STATE);
        if extra != 0 {
            return fail(format!("attribute(s) not allowed in this transition: {}", mask_names(extra)));
        }
        if let Some(p) = attr.port_num {
            if p != 1 {
                return fail(format!("port_num {p}: sim0 has port 1 only"));
            }
        }
        if let Some(ah) = &attr.ah {
            if ah.port_num != 1 {
                return fail(format!("ah.port_num {}: sim0 has port 1 only", ah.port_num));
            }
            if let Some(g) = &ah.grh {
                if g.sgid_index != 0 {
                    return fail(format!(
                        "ah.grh.sgid_index {}: the GID table has index 0 only",
                        g.sgid_index
                    ));
                }
            }
        }
        for (name, v) in [("retry_cnt", attr.retry_cnt), ("rnr_retry", attr.rnr_retry)] {
            if v.is_some_and(|v| v > 7) {
                return fail(format!("{name} {} out of range 0..=7", v.unwrap_or(0)));
            }
        }
        if attr.min_rnr_timer.is_some_and(|v| v > 31) || attr.timeout.is_some_and(|v| v > 31) {
            return fail("min_rnr_timer and timeout are 5-bit codes (0..=31)".into());
        }
        for (name, v) in [("rq_psn", attr.rq_psn), ("sq_psn", attr.sq_psn), ("dest_qp_num", attr.dest_qp_num)]
        {
            if v.is_some_and(|v| v > 0x00ff_ffff) {
                return fail(format!("{name} {:#x} exceeds 24 bits", v.unwrap_or(0)));
            }
        }

        match to {
            QpState::Reset => {
                // Everything posted is discarded, and its send-queue slots with it.
                st.head = st.tail;
                st.retired_seen = st.tail;
                c.host.sq_slots.reset(c.qpn, st.tail);
                st.stall = None;
                st.link.peer = None;
                st.link.dest = None;
                if let Some(rq) = &c.rq {
                    while pop_recv_id(rq).is_some() {}
                }
                c.sh().guard.flush_pending.store(false, Ordering::SeqCst);
                c.sh().resp.state.store(ST_RESET, Ordering::SeqCst);
                return Ok(());
            }
            QpState::Err => {
                c.sh().resp.state.store(ST_ERR, Ordering::SeqCst);
                c.flush_rq();
                c.flush_sq_locked(st);
                return Ok(());
            }
            _ => {}
        }
        if let Some(a) = attr.access {
            c.sh().resp.access.store(a.0, Ordering::Release);
        }
        if let Some(t) = attr.min_rnr_timer {
            c.sh().resp.min_rnr_timer.store(t, Ordering::Release);
        }
        if let (Some(ah), Some(qpn)) = (attr.ah, attr.dest_qp_num) {
            st.link.dest = Some(Dest { dgid: ah.grh.map(|g| g.dgid), dlid: ah.dlid, qpn });
            st.link.peer = None;
        }
        if let Some(m) = attr.path_mtu {
            st.link.mtu = m.bytes();
        }
        if let Some(p) = attr.rq_psn {
            c.sh().epsn.store(p, Ordering::Release);
        }
        if let Some(p) = attr.sq_psn {
            st.link.psn = p;
        }
        if let Some(t) = attr.timeout {
            st.link.timeout = t;
        }
        if let Some(r) = attr.retry_cnt {
            st.link.retry_cnt = r;
        }
        if let Some(r) = attr.rnr_retry {
            st.link.rnr_retry = r;
        }
        let raw = match to {
            QpState::Init => ST_INIT,
            QpState::Rtr => ST_RTR,
            _ => ST_RTS,
        };
        c.sh().resp.state.store(raw, Ordering::SeqCst);
        Ok(())
    }
}

const M_STATE: u32 = 1;
const M_ACCESS: u32 = 1 << 3;
const M_PKEY: u32 = 1 << 4;
const M_PORT: u32 = 1 << 5;
const M_AV: u32 = 1 << 7;
const M_PATH_MTU: u32 = 1 << 8;
const M_TIMEOUT: u32 = 1 << 9;
const M_RETRY: u32 = 1 << 10;
const M_RNR_RETRY: u32 = 1 << 11;
const M_RQ_PSN: u32 = 1 << 12;
const M_MAX_RD: u32 = 1 << 13;
const M_MIN_RNR: u32 = 1 << 15;
const M_SQ_PSN: u32 = 1 << 16;
const M_MAX_DEST_RD: u32 = 1 << 17;
const M_DEST_QPN: u32 = 1 << 20;

const MASK_NAMES: [(u32, &str); 15] = [
    (M_STATE, "IBV_QP_STATE"),
    (M_ACCESS, "IBV_QP_ACCESS_FLAGS"),
    (M_PKEY, "IBV_QP_PKEY_INDEX"),
    (M_PORT, "IBV_QP_PORT"),
    (M_AV, "IBV_QP_AV"),
    (M_PATH_MTU, "IBV_QP_PATH_MTU"),
    (M_TIMEOUT, "IBV_QP_TIMEOUT"),
    (M_RETRY, "IBV_QP_RETRY_CNT"),
    (M_RNR_RETRY, "IBV_QP_RNR_RETRY"),
    (M_RQ_PSN, "IBV_QP_RQ_PSN"),
    (M_MAX_RD, "IBV_QP_MAX_QP_RD_ATOMIC"),
    (M_MIN_RNR, "IBV_QP_MIN_RNR_TIMER"),
    (M_SQ_PSN, "IBV_QP_SQ_PSN"),
    (M_MAX_DEST_RD, "IBV_QP_MAX_DEST_RD_ATOMIC"),
    (M_DEST_QPN, "IBV_QP_DEST_QPN"),
];

fn mask_names(m: u32) -> String {
    MASK_NAMES.iter().filter(|(b, _)| m & b != 0).map(|(_, n)| *n).collect::<Vec<_>>().join(" | ")
}

/// The `ibv_qp_attr_mask` of `attr` (same bits as libibverbs).
fn attr_mask(a: &QpAttr) -> u32 {
    let mut m = M_STATE;
    let mut set = |present: bool, bit: u32| {
        if present {
            m |= bit
        }
    };
    set(a.access.is_some(), M_ACCESS);
    set(a.pkey_index.is_some(), M_PKEY);
    set(a.port_num.is_some(), M_PORT);
    set(a.ah.is_some(), M_AV);
    set(a.path_mtu.is_some(), M_PATH_MTU);
    set(a.timeout.is_some(), M_TIMEOUT);
    set(a.retry_cnt.is_some(), M_RETRY);
    set(a.rnr_retry.is_some(), M_RNR_RETRY);
    set(a.rq_psn.is_some(), M_RQ_PSN);
    set(a.max_rd_atomic.is_some(), M_MAX_RD);
    set(a.min_rnr_timer.is_some(), M_MIN_RNR);
    set(a.sq_psn.is_some(), M_SQ_PSN);
    set(a.max_dest_rd_atomic.is_some(), M_MAX_DEST_RD);
    set(a.dest_qp_num.is_some(), M_DEST_QPN);
    m
}

impl QueuePair for SimQp {
    fn qp_num(&self) -> u32 {
        self.core.qpn
    }

    fn state(&self) -> QpState {
        state_of(self.core.state_raw())
    }

    fn cap(&self) -> QpCap {
        self.core.cap
    }

    fn modify(&self, attr: &QpAttr) -> Result<()> {
        self.core.with_sq(|st| self.modify_locked(st, attr))
    }

    #[inline]
    unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let (r, waiting) = self.core.with_sq(|st| {
            let r = self.post_send_locked(st, wrs);
            (r, st.stall.is_some())
        });
        self.schedule_if_waiting(waiting);
        r
    }

    #[inline]
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let c = &*self.core;
        let Some(rq) = &c.rq else {
            return Err(VerbsError::BadWorkRequest {
                call: "ibv_post_recv",
                index: 0,
                reason: "the QP receives from an SRQ: post to the SRQ".into(),
            });
        };
        let state = c.state_raw();
        if state == ST_RESET {
            return Err(VerbsError::BadQpState {
                call: "ibv_post_recv",
                qp_num: c.qpn,
                state: QpState::Reset,
            });
        }
        let r = post_recv_ring(rq, "ibv_post_recv", c.cap.max_recv_sge, wrs);
        if c.state_raw() == ST_ERR {
            c.flush_rq();
        }
        r
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        let c = &*self.core;
        c.sh().resp.destroyed.store(true, Ordering::SeqCst);
        // A peer's transfer into this QP's receive buffers runs under the *peer's* guard: wait
        // for every transfer that may have seen the QP alive (a grace period, as for MR
        // deregistration), so that no byte lands in a receive buffer, and no CQE of this QP
        // appears, once the drop has returned and the buffers are the caller's again. Later
        // transfers see `destroyed` and lose their packets.
        super::fabric::quiesce();
        // The same for peers in other processes (their transfers are pinned, see `epoch`).
        super::epoch::synchronize(&c.host.seg);
        c.with_sq(|st| {
            st.head = st.tail;
            st.stall = None;
            st.link.peer = None;
        });
        if let Some(rq) = &c.rq {
            while pop_recv_id(rq).is_some() {}
        }
        fabric().unregister_qp(c.host.id, c.qpn);
        // Before the number can be reused: a later QP of that number inherits no window.
        c.host.mrs.detach_windows_of_qp(c.qpn); // see `super::mw`
        c.host.sq_slots.detach(c.qpn);
        c.host.free_qpn(c.qpn);
    }
}

impl SimQp {
    /// Access to the core for the fault-injection API.
    pub(crate) fn core(&self) -> &Arc<QpCore> {
        &self.core
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<SimQp>();
    is::<QpCore>();
}
