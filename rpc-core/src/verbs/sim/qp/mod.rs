//! RC queue pairs of the software NIC, by concern:
//! - this file: the QP's parts (shared responder side, send queue, guard), the public handle
//!   and its [`QueuePair`] implementation, destruction;
//! - [`create`]: creation against the device's caps;
//! - [`modify`]: the state machine (the rules are [`crate::verbs::rules`], shared with libibverbs);
//! - [`post`]: send posting (WR checks, the fast path, queueing);
//! - [`progress`]: executing queued WQEs, stalls, RNR and ACK-timeout retries, the timer thread;
//! - [`complete`]: send completions, errors and flushes;
//! - [`recv`]: the receive queue (posting, flushing).
//!
//! The transfer itself (what the NIC does with a send WQE) is in [`super::exec`].

mod complete;
mod create;
mod modify;
mod post;
mod progress;
mod recv;

pub(crate) use complete::flush_wc;

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::cq::{CqCore, SqRef};
use super::fabric::{fabric, Dest};
use super::guard::SpinGuard;
use super::host::{HostCore, SimPd};
use super::ring::{Padded, Ring};
use super::srq::{pop_recv_id, post_recv_ring, RecvRing, SrqCore};
use super::{exec, fabric};
use super::{Sim, MAX_INLINE, MAX_QP_WR, MAX_SGE};
use crate::verbs::rules;
use crate::verbs::sim;
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
///
/// The depth (`max_send_wr`, what a post is refused beyond) is fixed at creation, as on a NIC;
/// the storage is not: only a WQE that waits (`[head, tail)`: the fast path executes a WR from
/// the caller's list and stores nothing) needs its copy, so `wqes` and `inline` start empty and
/// double, up to the depth, the first time more WQEs wait at once than they hold
/// ([`SqState::make_room`]). An idle QP of a 256-WQE send queue then holds no WQE storage
/// instead of 256 × 200 B of WQEs and 256 × `max_inline_data` bytes of inline arena (issue 28:
/// memory per idle session); a QP keeps the storage of the most WQEs that ever waited at once.
pub(crate) struct SqState {
    /// Storage of the waiting WQEs, a ring indexed by position ([`SqState::slot`]): empty or a
    /// power of two, at most `depth`.
    pub(crate) wqes: Box<[SendWqe]>,
    /// The inline bytes of `wqes[i]` at `[i * max_inline_data, (i + 1) * max_inline_data)`.
    pub(crate) inline: Box<[u8]>,
    /// The send queue's depth in WQEs (`max_send_wr`, a power of two).
    pub(crate) depth: u64,
    pub(crate) head: u64,
    pub(crate) tail: u64,
    /// The retired count as last read (never ahead of the real one, nor of `head`).
    pub(crate) retired_seen: u64,
    pub(crate) link: Link,
    pub(crate) stall: Option<Stall>,
}

impl SqState {
    /// The storage index of the waiting WQE at position `seq` (meaningful while `wqes` is not
    /// empty, that is while a WQE waits).
    #[inline(always)]
    pub(crate) fn slot(&self, seq: u64) -> usize {
        seq as usize & self.wqes.len().wrapping_sub(1)
    }

    /// Makes room in the storage for one more waiting WQE (the caller checked the depth, so
    /// fewer than `depth` wait): doubles `wqes` and `inline` (from 4 WQEs, at most `depth`)
    /// when every slot holds a waiting WQE ([`SqState::grow`]).
    #[inline(always)]
    pub(crate) fn make_room(&mut self, max_inline: usize) {
        if (self.tail - self.head) as usize >= self.wqes.len() {
            self.grow(max_inline);
        }
    }

    /// Doubles the storage, moving the waiting WQEs to their slots in the new ring. Out of
    /// line: a QP grows its storage at most log2(depth) times in its life.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, max_inline: usize) {
        let waiting = (self.tail - self.head) as usize;
        let len = self.wqes.len();
        let new_len = (len * 2).max(4).min(self.depth as usize);
        debug_assert!(waiting < new_len, "a post beyond the depth is refused before it is queued");
        let mut wqes = vec![SendWqe::EMPTY; new_len].into_boxed_slice();
        let mut inline = vec![0u8; new_len * max_inline].into_boxed_slice();
        for seq in self.head..self.tail {
            let (from, to) = (self.slot(seq), seq as usize & (new_len - 1));
            wqes[to] = self.wqes[from];
            if self.wqes[from].inline_len != NOT_INLINE {
                let n = self.wqes[from].inline_len as usize;
                inline[to * max_inline..to * max_inline + n]
                    .copy_from_slice(&self.inline[from * max_inline..from * max_inline + n]);
            }
        }
        super::stats::count_sq_storage(
            self.storage_bytes_of(new_len, max_inline),
            self.storage_bytes(max_inline),
        );
        self.wqes = wqes;
        self.inline = inline;
    }

    /// Bytes of storage for `wqes` WQEs with `max_inline` inline bytes each.
    fn storage_bytes_of(&self, wqes: usize, max_inline: usize) -> usize {
        wqes * (std::mem::size_of::<SendWqe>() + max_inline)
    }

    /// Bytes of the storage held now.
    pub(crate) fn storage_bytes(&self, max_inline: usize) -> usize {
        self.storage_bytes_of(self.wqes.len(), max_inline)
    }
}

impl SendWqe {
    /// A placeholder for storage slots with no waiting WQE.
    pub(crate) const EMPTY: SendWqe = SendWqe {
        wr_id: 0,
        op: SendOp::Send,
        flags: SendFlags::EMPTY,
        nsge: 0,
        sges: [Sge { addr: 0, length: 0, lkey: 0 }; MAX_SGE],
        inline_len: NOT_INLINE,
    };
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
    /// RNR waits of this QP's send queue (see [`SimQp::rnr_stalls`]).
    rnr_stalls: AtomicU64,
}

// SAFETY: `sq` is only accessed with `guard` held (see `with_sq`); `sh` points to atomics in the
// segment the QP's `host` keeps mapped; everything else is immutable data or `Sync` types.
unsafe impl Sync for QpCore {}
// SAFETY: as above.
unsafe impl Send for QpCore {}

impl Drop for QpCore {
    fn drop(&mut self) {
        super::stats::count_sq_storage(
            0,
            self.sq.0.get_mut().storage_bytes(self.cap.max_inline_data as usize),
        );
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

    pub(crate) fn deadline_ns(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }

    /// The send-queue reference a CQE of WQE `seq` carries.
    #[inline(always)]
    fn sq_ref(&self, seq: u64) -> SqRef {
        SqRef { tag: self.sq_tag, seq: seq as u32 }
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

impl QueuePair for SimQp {
    fn qp_num(&self) -> u32 {
        self.core.qpn
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.core) as usize
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
        r.map_err(|e| *e)
    }

    #[inline]
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.post_recv_rq(wrs) }
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
    /// How many times a send WR of this QP met a responder with no receive WQE and waited its
    /// RNR timer (each retry counts; see [`super::SimStats::rnr_stalls`] for the whole process).
    pub fn rnr_stalls(&self) -> u64 {
        self.core.rnr_stalls.load(Ordering::Relaxed)
    }

    /// WQEs the send queue's storage holds room for now: 0 until WRs wait in the send queue (a
    /// WR executed at once is never stored), then the most that ever waited at once rounded up
    /// to a power of two (at least 4), at most [`QpCap::max_send_wr`], which stays what a post
    /// is refused beyond. Each slot is about 200 bytes plus `max_inline_data`.
    pub fn sq_storage_wqes(&self) -> usize {
        self.core.with_sq(|st| st.wqes.len())
    }

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
