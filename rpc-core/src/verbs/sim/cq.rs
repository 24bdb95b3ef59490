//! Completion queues: a lock-free ring of work completions, pushed by whichever thread executes a
//! transfer and popped by the poller, plus the optional event path (`req_notify` / `wait`).
//!
//! The CQ (ring and shared state) lives in its host's segment, so a requester in another process
//! pushes completions into it directly. The event path is the only place with a system call (a
//! futex wake on the shared `pending` word), and a CQ created without events never takes it: a
//! push on such a CQ is a CAS, a copy and a release store.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::host::HostCore;
use super::ring::{ld, st, Ring};
use super::shm::{deadline_after, futex_wait_for, futex_wait_until, futex_wake, relative};
use crate::verbs::{CompletionQueue, Result, VerbsError, WcOpcode, WcStatus, WorkCompletion};

/// Words of a CQE in the ring (see [`encode`]).
pub(crate) const CQE_WORDS: usize = 5;

const OPCODES: [WcOpcode; 9] = [
    WcOpcode::IBV_WC_SEND,
    WcOpcode::IBV_WC_RDMA_WRITE,
    WcOpcode::IBV_WC_RDMA_READ,
    WcOpcode::IBV_WC_COMP_SWAP,
    WcOpcode::IBV_WC_FETCH_ADD,
    WcOpcode::IBV_WC_BIND_MW,
    WcOpcode::IBV_WC_RECV,
    WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM,
    WcOpcode::IBV_WC_LOCAL_INV,
];

/// Which send WQE a send completion covers, for the send queue's accounting
/// ([`super::sqslots`]): the QP's tag (never 0) and the WQE's sequence number (low 32 bits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SqRef {
    /// 0 for a receive completion (covers no send WQE).
    pub(crate) tag: u16,
    pub(crate) seq: u32,
}

/// `wr_id`; `status | opcode << 32 | has_imm << 40 | has_inv << 41 | sq.tag << 48`;
/// `byte_len | (imm or invalidated rkey) << 32`; `qp_num | src_qp << 32`;
/// `vendor_err | sq.seq << 32`. A completion has an immediate or an invalidated rkey, never
/// both (SEND_WITH_INV carries no immediate), so they share the upper half of word 2.
#[inline(always)]
fn encode(w: &[AtomicU64; CQE_WORDS], wc: &WorkCompletion, sq: SqRef) {
    // Fieldless enum: its discriminant is the index into `OPCODES` (checked by a test).
    let op = wc.opcode as u64;
    st(&w[0], wc.wr_id);
    let inv = wc.invalidated_rkey.is_some() as u64;
    st(
        &w[1],
        wc.status as u32 as u64
            | op << 32
            | (wc.imm_data.is_some() as u64) << 40
            | inv << 41
            | (sq.tag as u64) << 48,
    );
    let word = wc.imm_data.or(wc.invalidated_rkey).unwrap_or(0);
    st(&w[2], wc.byte_len as u64 | (word as u64) << 32);
    st(&w[3], wc.qp_num as u64 | (wc.src_qp as u64) << 32);
    st(&w[4], wc.vendor_err as u64 | (sq.seq as u64) << 32);
}

#[inline(always)]
fn decode(w: &[AtomicU64; CQE_WORDS]) -> (WorkCompletion, SqRef) {
    let (w1, w2, w3, w4) = (ld(&w[1]), ld(&w[2]), ld(&w[3]), ld(&w[4]));
    let sq = SqRef { tag: (w1 >> 48) as u16, seq: (w4 >> 32) as u32 };
    let wc = WorkCompletion {
        wr_id: ld(&w[0]),
        status: WcStatus::from_u32(w1 as u32),
        opcode: OPCODES.get(((w1 >> 32) & 15) as usize).copied().unwrap_or(WcOpcode::IBV_WC_SEND),
        byte_len: w2 as u32,
        imm_data: ((w1 >> 40) & 1 == 1).then_some((w2 >> 32) as u32),
        qp_num: w3 as u32,
        src_qp: (w3 >> 32) as u32,
        vendor_err: w4 as u32,
        invalidated_rkey: ((w1 >> 41) & 1 == 1).then_some((w2 >> 32) as u32),
    };
    (wc, sq)
}

#[cfg(test)]
#[test]
fn opcode_discriminants_index_the_table() {
    for (i, op) in OPCODES.iter().enumerate() {
        assert_eq!(*op as usize, i);
    }
}

/// Both branches' spare bits at once: the send queue's tag and sequence number next to an
/// immediate or an invalidated rkey (sharing word 2's upper half), all opcodes, all-ones values.
#[cfg(test)]
#[test]
fn cqe_fields_round_trip_with_the_send_queue_reference() {
    let words: [AtomicU64; CQE_WORDS] = Default::default();
    for (i, &opcode) in OPCODES.iter().enumerate() {
        for (imm_data, invalidated_rkey) in [(None, None), (Some(u32::MAX), None), (None, Some(0x8012_3456))]
        {
            let wc = WorkCompletion {
                wr_id: u64::MAX - i as u64,
                status: WcStatus::IBV_WC_REM_ACCESS_ERR,
                opcode,
                byte_len: u32::MAX,
                imm_data,
                qp_num: 0x00ff_ffff,
                src_qp: 0x00ab_cdef,
                vendor_err: u32::MAX,
                invalidated_rkey,
            };
            let sq = SqRef { tag: u16::MAX - i as u16, seq: u32::MAX - 7 };
            encode(&words, &wc, sq);
            assert_eq!(decode(&words), (wc, sq));
        }
    }
}

const ARMED_NONE: u32 = 0;
const ARMED_ANY: u32 = 1;
const ARMED_SOLICITED: u32 = 2;

/// The CQ state producers touch besides the ring, in the host segment next to it.
#[repr(C)]
pub(crate) struct CqShared {
    /// Set when a completion was lost.
    overrun: AtomicU32,
    /// 1 if the CQ was created with events.
    events: AtomicU32,
    /// The exact capacity (entries).
    cqe: AtomicU32,
    armed: AtomicU32,
    /// Events delivered and not yet consumed by `wait` (a futex word).
    pending: AtomicU32,
}

/// Bytes before the ring in a CQ's allocation.
const CQ_HDR: usize = 128;

/// A CQ as a producer sees it (its own process or a peer's): the ring and the shared state.
pub(crate) struct CqView {
    ring: Ring<CQE_WORDS>,
    sh: *const CqShared,
}

// SAFETY: a view of atomics in a mapping kept alive by its holder.
unsafe impl Send for CqView {}
// SAFETY: as above.
unsafe impl Sync for CqView {}

impl CqView {
    /// Attaches to the CQ whose allocation starts at `mem` (`avail` bytes to the mapping's end).
    ///
    /// # Safety
    /// `mem` is valid for `avail` bytes and outlives the view.
    pub(crate) unsafe fn attach(mem: *mut u8, avail: usize) -> Option<CqView> {
        if avail < CQ_HDR {
            return None;
        }
        // SAFETY: the ring follows the header inside `avail` (checked by `attach`).
        let ring = unsafe { Ring::attach(mem.add(CQ_HDR), avail - CQ_HDR)? };
        Some(CqView { ring, sh: mem as *const CqShared })
    }

    /// A second view of the same CQ.
    pub(crate) fn view(&self) -> CqView {
        CqView { ring: self.ring.view(), sh: self.sh }
    }

    #[inline(always)]
    fn sh(&self) -> &CqShared {
        // SAFETY: valid while the view is (constructors' contracts).
        unsafe { &*self.sh }
    }

    /// Queues a completion; `solicited` (a receive of a SOLICITED send) wakes a
    /// `solicited_only` waiter, as any error does. On overflow the completion is lost and the CQ
    /// is marked overrun: every later `poll` reports [`VerbsError::CqOverrun`].
    #[inline]
    pub(crate) fn push(&self, wc: WorkCompletion, solicited: bool) {
        let slot = self.claim();
        self.publish(slot, wc, solicited);
    }

    /// [`CqView::push`] of a send completion covering the send WQE `sq`.
    #[inline]
    pub(crate) fn push_send(&self, wc: WorkCompletion, solicited: bool, sq: SqRef) {
        let slot = self.claim();
        self.publish_send(slot, wc, solicited, sq);
    }

    /// Reserves the CQ's next entry (before the data transfer it will report, so that no locked
    /// instruction follows the payload stores); `None` when the CQ is full.
    #[inline]
    pub(crate) fn claim(&self) -> Option<usize> {
        self.ring.claim()
    }

    /// Publishes a completion into an entry from [`CqView::claim`] (or records the overrun).
    #[inline]
    pub(crate) fn publish(&self, slot: Option<usize>, wc: WorkCompletion, solicited: bool) {
        self.publish_send(slot, wc, solicited, SqRef::default());
    }

    /// [`CqView::publish`] of a completion covering the send WQE `sq` (none for a receive).
    #[inline(always)]
    fn publish_send(&self, slot: Option<usize>, wc: WorkCompletion, solicited: bool, sq: SqRef) {
        let sh = self.sh();
        match slot {
            Some(pos) => self.ring.publish(pos, |w| encode(w, &wc, sq)),
            None => {
                sh.overrun.store(1, Ordering::Release);
                tracing::warn!(
                    cqe = sh.cqe.load(Ordering::Relaxed),
                    "sim: completion queue overrun, a completion was lost"
                );
            }
        }
        if sh.events.load(Ordering::Relaxed) != 0 {
            // Pairs with the fence in `req_notify`: either the armer's next poll sees this CQE or
            // this load sees the armed flag.
            fence(Ordering::SeqCst);
            let armed = sh.armed.load(Ordering::Relaxed);
            let wakes =
                armed == ARMED_ANY || (armed == ARMED_SOLICITED && (solicited || !wc.status.is_success()));
            if wakes && sh.armed.swap(ARMED_NONE, Ordering::AcqRel) != ARMED_NONE {
                sh.pending.fetch_add(1, Ordering::AcqRel);
                futex_wake(&sh.pending);
            }
        }
    }
}

pub(crate) struct CqCore {
    view: CqView,
    /// Offset and bytes of the CQ's allocation in its host's segment.
    off: usize,
    bytes: usize,
    /// The CQ belongs to a host (its segment holds the CQ).
    _host: Arc<HostCore>,
}

impl std::ops::Deref for CqCore {
    type Target = CqView;
    fn deref(&self) -> &CqView {
        &self.view
    }
}

impl Drop for CqCore {
    fn drop(&mut self) {
        self._host.arena.free(&self._host.seg, self.off, self.bytes);
    }
}

impl CqCore {
    pub(crate) fn host(&self) -> &Arc<HostCore> {
        &self._host
    }

    /// Offset of the CQ in its host's segment (peers attach there).
    pub(crate) fn offset(&self) -> usize {
        self.off
    }
}

/// A completion queue of the software NIC. Cheap to clone.
#[derive(Clone)]
pub struct SimCq {
    pub(crate) core: Arc<CqCore>,
}

impl std::fmt::Debug for SimCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCq")
            .field("cqe", &self.capacity())
            .field("events", &(self.core.sh().events.load(Ordering::Relaxed) != 0))
            .finish()
    }
}

impl SimCq {
    pub(crate) fn new(host: Arc<HostCore>, cqe: u32, with_events: bool) -> Result<SimCq> {
        let bytes = CQ_HDR + Ring::<CQE_WORDS>::bytes(cqe as usize);
        let off = host.alloc("ibv_create_cq", bytes, 128)?;
        let mem = host.seg.at(off);
        // SAFETY: a fresh zeroed allocation of `bytes` (128-aligned) in the segment, which the
        // CQ's `Arc<HostCore>` keeps mapped; freed only when the CQ is dropped.
        let ring = unsafe { Ring::init(mem.add(CQ_HDR), cqe as usize, false) };
        let view = CqView { ring, sh: mem as *const CqShared };
        let sh = view.sh();
        sh.cqe.store(view.ring.capacity() as u32, Ordering::Relaxed);
        sh.events.store(with_events as u32, Ordering::Release);
        Ok(SimCq { core: Arc::new(CqCore { view, off, bytes, _host: host }) })
    }

    fn events(&self, call: &'static str) -> Result<&CqShared> {
        let sh = self.core.sh();
        if sh.events.load(Ordering::Relaxed) == 0 {
            return Err(VerbsError::InvalidArgument {
                call,
                reason: "the CQ was created without events (create_cq(.., with_events: false))".into(),
            });
        }
        Ok(sh)
    }

    fn overrun(&self) -> bool {
        self.core.sh().overrun.load(Ordering::Acquire) != 0
    }
}

impl CompletionQueue for SimCq {
    fn capacity(&self) -> u32 {
        self.core.ring.capacity() as u32
    }

    // Inlined into the callers' poll loops (the client's wait, the worker's run): out of line it
    // cost a call with its register saves per poll, about 4 polls per RPC on the two sides.
    #[inline(always)]
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let core = &*self.core;
        if self.overrun() {
            return Err(VerbsError::CqOverrun { cqe: self.capacity() });
        }
        let mut n = 0;
        while n < wc.len() {
            match core.ring.pop(decode) {
                Some((w, sq)) => {
                    if sq.tag != 0 {
                        // A send completion: its WQE and every one before it leave the QP's
                        // send queue now that the completion is polled (as on hardware).
                        core._host.sq_slots.retire(w.qp_num, sq.tag, sq.seq);
                    }
                    wc[n] = w;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    // The oldest CQE's sequence word and the overrun flag: two loads, where a poll also resets
    // its output and runs the pop loop.
    #[inline(always)]
    fn maybe_ready(&self) -> bool {
        self.overrun() || !self.core.ring.looks_empty()
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let ev = self.events("ibv_req_notify_cq")?;
        // Relaxed, then the fence (not a `SeqCst` store, an `xchg` on x86, and the fence): the
        // pairing with `publish_send` is fence against fence. That side publishes the CQE
        // (`seq`, release), fences, loads `armed`; this side stores `armed`, fences, and the
        // caller's next poll loads `seq`. Whichever fence comes first in the single total
        // order of `SeqCst` fences, the load after the other one sees the store before the
        // first: the producer sees the arming or the armer's poll sees the CQE (C++20
        // [atomics.order], fence-to-fence), with relaxed stores and loads on both sides.
        ev.armed.store(if solicited_only { ARMED_SOLICITED } else { ARMED_ANY }, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Blocks on a futex in the CQ's shared state (so a requester in another process wakes it).
    fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let ev = self.events("ibv_get_cq_event")?;
        if self.overrun() {
            // An overrun CQ raises no more completion events (as after IBV_EVENT_CQ_ERR).
            return Err(VerbsError::CqOverrun { cqe: self.capacity() });
        }
        // The first wait is relative (the kernel times it: no clock read per wait, about 30
        // instructions a blocking call saves). A wake-up that finds no event (spurious, or
        // another waiter took it) reads the clock once and waits on until an absolute deadline
        // `timeout` from then: the whole wait lasts at most twice `timeout` in that case. A
        // timeout too large for a `timespec` (`Duration::MAX`) waits forever.
        let mut first = true;
        let mut deadline = None;
        let mut timed_out = false;
        loop {
            let p = ev.pending.load(Ordering::Acquire);
            if p > 0 {
                if ev.pending.compare_exchange(p, p - 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    super::stats::count_cq_event();
                    return Ok(true);
                }
                continue;
            }
            if timed_out || timeout == Some(Duration::ZERO) {
                return Ok(false);
            }
            if first {
                first = false;
                timed_out = futex_wait_for(&ev.pending, 0, timeout.and_then(relative).as_ref());
                continue;
            }
            let d = *deadline.get_or_insert_with(|| timeout.and_then(deadline_after));
            timed_out = futex_wait_until(&ev.pending, 0, d.as_ref());
        }
    }
}
