//! Completion queues: a lock-free ring of work completions, pushed by whichever thread executes a
//! transfer and popped by the poller, plus the optional event path (`req_notify` / `wait`).
//!
//! The event path is the only place with a lock and a condition variable, and a CQ created
//! without events never touches it: a push on such a CQ is a CAS, a copy and a release store.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::host::HostCore;
use super::ring::{ld, st, Ring};
use crate::verbs::{CompletionQueue, Result, VerbsError, WcOpcode, WcStatus, WorkCompletion};

/// Words of a CQE in the ring (see [`encode`]).
pub(crate) const CQE_WORDS: usize = 5;

const OPCODES: [WcOpcode; 8] = [
    WcOpcode::IBV_WC_SEND,
    WcOpcode::IBV_WC_RDMA_WRITE,
    WcOpcode::IBV_WC_RDMA_READ,
    WcOpcode::IBV_WC_COMP_SWAP,
    WcOpcode::IBV_WC_FETCH_ADD,
    WcOpcode::IBV_WC_BIND_MW,
    WcOpcode::IBV_WC_RECV,
    WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM,
];

/// `wr_id`; `status | opcode << 32 | has_imm << 40`; `byte_len | imm << 32`;
/// `qp_num | src_qp << 32`; `vendor_err`.
#[inline(always)]
fn encode(w: &[AtomicU64; CQE_WORDS], wc: &WorkCompletion) {
    // Fieldless enum: its discriminant is the index into `OPCODES` (checked by a test).
    let op = wc.opcode as u64;
    st(&w[0], wc.wr_id);
    st(&w[1], wc.status as u32 as u64 | op << 32 | (wc.imm_data.is_some() as u64) << 40);
    st(&w[2], wc.byte_len as u64 | (wc.imm_data.unwrap_or(0) as u64) << 32);
    st(&w[3], wc.qp_num as u64 | (wc.src_qp as u64) << 32);
    st(&w[4], wc.vendor_err as u64);
}

#[inline(always)]
fn decode(w: &[AtomicU64; CQE_WORDS]) -> WorkCompletion {
    let (w1, w2, w3) = (ld(&w[1]), ld(&w[2]), ld(&w[3]));
    WorkCompletion {
        wr_id: ld(&w[0]),
        status: WcStatus::from_u32(w1 as u32),
        opcode: OPCODES[((w1 >> 32) & 7) as usize],
        byte_len: w2 as u32,
        imm_data: ((w1 >> 40) & 1 == 1).then_some((w2 >> 32) as u32),
        qp_num: w3 as u32,
        src_qp: (w3 >> 32) as u32,
        vendor_err: ld(&w[4]) as u32,
    }
}

#[cfg(test)]
#[test]
fn opcode_discriminants_index_the_table() {
    for (i, op) in OPCODES.iter().enumerate() {
        assert_eq!(*op as usize, i);
    }
}

const ARMED_NONE: u8 = 0;
const ARMED_ANY: u8 = 1;
const ARMED_SOLICITED: u8 = 2;

struct CqEvents {
    armed: AtomicU8,
    /// Events delivered and not yet consumed by `wait`.
    pending: Mutex<u64>,
    cond: Condvar,
}

pub(crate) struct CqCore {
    ring: Ring<CQE_WORDS>,
    cqe: u32,
    overrun: AtomicBool,
    events: Option<CqEvents>,
    /// The CQ belongs to a host (it keeps the host's key table alive while QPs use it).
    _host: Arc<HostCore>,
}

impl CqCore {
    pub(crate) fn host(&self) -> &Arc<HostCore> {
        &self._host
    }

    /// Queues a completion; `solicited` (a receive of a SOLICITED send) wakes a
    /// `solicited_only` waiter, as any error does. On overflow the completion is lost and the CQ
    /// is marked overrun: every later `poll` reports [`VerbsError::CqOverrun`].
    #[inline]
    pub(crate) fn push(&self, wc: WorkCompletion, solicited: bool) {
        let slot = self.claim();
        self.publish(slot, wc, solicited);
    }

    /// Reserves the CQ's next entry (before the data transfer it will report, so that no locked
    /// instruction follows the payload stores); `None` when the CQ is full.
    #[inline]
    pub(crate) fn claim(&self) -> Option<usize> {
        self.ring.claim()
    }

    /// Publishes a completion into an entry from [`CqCore::claim`] (or records the overrun).
    #[inline]
    pub(crate) fn publish(&self, slot: Option<usize>, wc: WorkCompletion, solicited: bool) {
        match slot {
            Some(pos) => self.ring.publish(pos, |w| encode(w, &wc)),
            None => {
                self.overrun.store(true, Ordering::Release);
                tracing::warn!(cqe = self.cqe, "sim: completion queue overrun, a completion was lost");
            }
        }
        if let Some(ev) = &self.events {
            // Pairs with the fence in `req_notify`: either the armer's next poll sees this CQE or
            // this load sees the armed flag.
            fence(Ordering::SeqCst);
            let armed = ev.armed.load(Ordering::Relaxed);
            let wakes =
                armed == ARMED_ANY || (armed == ARMED_SOLICITED && (solicited || !wc.status.is_success()));
            if wakes && ev.armed.swap(ARMED_NONE, Ordering::AcqRel) != ARMED_NONE {
                let mut pending = ev.pending.lock().unwrap_or_else(|e| e.into_inner());
                *pending += 1;
                ev.cond.notify_all();
            }
        }
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
            .field("cqe", &self.core.cqe)
            .field("events", &self.core.events.is_some())
            .finish()
    }
}

impl SimCq {
    pub(crate) fn new(host: Arc<HostCore>, cqe: u32, with_events: bool) -> SimCq {
        let ring = Ring::new(cqe as usize);
        let cqe = ring.capacity() as u32;
        let events = with_events.then(|| CqEvents {
            armed: AtomicU8::new(ARMED_NONE),
            pending: Mutex::new(0),
            cond: Condvar::new(),
        });
        SimCq { core: Arc::new(CqCore { ring, cqe, overrun: AtomicBool::new(false), events, _host: host }) }
    }

    fn events(&self, call: &'static str) -> Result<&CqEvents> {
        self.core.events.as_ref().ok_or_else(|| VerbsError::InvalidArgument {
            call,
            reason: "the CQ was created without events (create_cq(.., with_events: false))".into(),
        })
    }
}

impl CompletionQueue for SimCq {
    fn capacity(&self) -> u32 {
        self.core.cqe
    }

    #[inline]
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let core = &*self.core;
        if core.overrun.load(Ordering::Acquire) {
            return Err(VerbsError::CqOverrun { cqe: core.cqe });
        }
        let mut n = 0;
        while n < wc.len() {
            match core.ring.pop(decode) {
                Some(w) => {
                    wc[n] = w;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let ev = self.events("ibv_req_notify_cq")?;
        ev.armed.store(if solicited_only { ARMED_SOLICITED } else { ARMED_ANY }, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Ok(())
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let ev = self.events("ibv_get_cq_event")?;
        if self.core.overrun.load(Ordering::Acquire) {
            // An overrun CQ raises no more completion events (as after IBV_EVENT_CQ_ERR).
            return Err(VerbsError::CqOverrun { cqe: self.core.cqe });
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut pending = ev.pending.lock().unwrap_or_else(|e| e.into_inner());
        while *pending == 0 {
            match deadline {
                None => pending = ev.cond.wait(pending).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(false);
                    }
                    pending = ev.cond.wait_timeout(pending, d - now).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
        *pending -= 1;
        Ok(true)
    }
}
