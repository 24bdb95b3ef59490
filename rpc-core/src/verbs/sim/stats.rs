//! Counters of the software NIC for this process, as a NIC's port counters are (rxe's
//! `hw_counters`): what the NIC did that the verbs calls do not report. Tests read them to check
//! what the layers above must or must not cause.

use std::sync::atomic::{AtomicU64, Ordering};

static RNR_STALLS: AtomicU64 = AtomicU64::new(0);
static CQ_EVENTS: AtomicU64 = AtomicU64::new(0);
static CONTEXTS_OPENED: AtomicU64 = AtomicU64::new(0);
static SQ_STORAGE_BYTES: AtomicU64 = AtomicU64::new(0);

/// A snapshot of the counters of every sim host in this process, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimStats {
    /// Receiver-not-ready NAKs: a SEND (or WRITE with immediate) found no receive WQE at the
    /// responder and waited its RNR timer before a retry. Counted at every such wait, with or
    /// without retries left (with `rnr_retry = 7` the sender waits forever and no completion
    /// reports it).
    pub rnr_stalls: u64,
    /// Completion events delivered: a `CompletionQueue::wait` that returned because an armed
    /// CQ got a completion (not because it timed out).
    pub cq_events: u64,
    /// Device contexts opened (`Provider::open`, each a new sim host with its shared-memory
    /// segment): what an endpoint opens once for all the sessions it carries.
    pub contexts_opened: u64,
    /// Bytes the send queues of this process's live QPs hold now for WQEs that wait (copies of
    /// the WQEs and their inline arenas; a gauge). A QP holds none until WRs wait in its send
    /// queue (the fast path executes a WR at once) and then the storage of the most that ever
    /// waited at once, a power of two up to its `max_send_wr` (see [`super::SimQp::sq_storage_wqes`]):
    /// the memory of an idle QP does not grow with its send queue's depth.
    pub sq_storage_bytes: u64,
}

/// The counters now.
pub fn stats() -> SimStats {
    SimStats {
        rnr_stalls: RNR_STALLS.load(Ordering::Relaxed),
        cq_events: CQ_EVENTS.load(Ordering::Relaxed),
        contexts_opened: CONTEXTS_OPENED.load(Ordering::Relaxed),
        sq_storage_bytes: SQ_STORAGE_BYTES.load(Ordering::Relaxed),
    }
}

/// Counts one device context opened.
pub(crate) fn count_context_opened() {
    CONTEXTS_OPENED.fetch_add(1, Ordering::Relaxed);
}

/// Counts one RNR wait.
#[inline]
pub(crate) fn count_rnr_stall() {
    RNR_STALLS.fetch_add(1, Ordering::Relaxed);
}

/// Counts one completion event delivered to a waiter.
#[inline]
pub(crate) fn count_cq_event() {
    CQ_EVENTS.fetch_add(1, Ordering::Relaxed);
}

/// Counts send-queue storage taken (`taken` bytes) and given back (`freed` bytes).
pub(crate) fn count_sq_storage(taken: usize, freed: usize) {
    SQ_STORAGE_BYTES.fetch_add(taken as u64, Ordering::Relaxed);
    SQ_STORAGE_BYTES.fetch_sub(freed as u64, Ordering::Relaxed);
}
