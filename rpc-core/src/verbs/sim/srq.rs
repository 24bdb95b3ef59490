//! Receive queues: the entries a SEND or RDMA_WRITE_WITH_IMM consumes, either a QP's own RQ or a
//! shared receive queue (SRQ). Both are a [`Ring`] of fixed-size receive WQEs, posted by the
//! owner and consumed by the requester's executor (lock-free on both sides).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::host::{HostCore, SimPd};
use super::ring::{ld, st, Ring};
use super::{MAX_SGE, MAX_SRQ_WR};
use crate::verbs::{RecvWr, Result, Sge, SharedReceiveQueue, SrqInitAttr, VerbsError};

/// Words of a receive WQE in its ring: `wr_id`, the SGE count, then per SGE `addr` and
/// `length | lkey << 32`. Only the first `2 + 2 * nsge` words are written and read.
pub(crate) const RQ_WORDS: usize = 2 + 2 * MAX_SGE;

/// A receive queue ring (RQ or SRQ).
pub(crate) type RecvRing = Ring<RQ_WORDS>;

/// SGE `i` of a receive WQE's words.
#[inline(always)]
pub(crate) fn rq_sge(w: &[AtomicU64; RQ_WORDS], i: usize) -> Sge {
    let lk = ld(&w[3 + 2 * i]);
    Sge { addr: ld(&w[2 + 2 * i]), length: lk as u32, lkey: (lk >> 32) as u32 }
}

/// Pops the oldest receive WQE of `ring`, returning its `wr_id`.
#[inline]
pub(crate) fn pop_recv_id(ring: &RecvRing) -> Option<u64> {
    ring.pop_claimed(|w| ld(&w[0]))
}

/// Posts `wrs` to `ring`, in order; stops at the first WR that does not fit.
#[inline]
pub(crate) fn post_recv_ring(
    ring: &RecvRing,
    call: &'static str,
    max_sge: u32,
    wrs: &[RecvWr<'_>],
) -> Result<()> {
    for (index, wr) in wrs.iter().enumerate() {
        crate::verbs::rules::check_recv_wr(call, index, wr, max_sge.min(MAX_SGE as u32))?;
        let n = wr.sg_list.len();
        let pushed = ring.push(|w| {
            st(&w[0], wr.wr_id);
            st(&w[1], n as u64);
            for (i, sge) in wr.sg_list.iter().enumerate() {
                st(&w[2 + 2 * i], sge.addr);
                st(&w[3 + 2 * i], sge.length as u64 | (sge.lkey as u64) << 32);
            }
        });
        if !pushed {
            return Err(VerbsError::BadWorkRequest {
                call,
                index,
                reason: format!("receive queue full ({} WQEs outstanding)", ring.capacity()),
            });
        }
    }
    Ok(())
}

pub(crate) struct SrqCore {
    /// In the host's segment, at `off` (peers attach there).
    pub(crate) ring: RecvRing,
    pub(crate) max_sge: u32,
    pub(crate) pd: u32,
    pub(crate) off: usize,
    bytes: usize,
    pub(crate) _host: Arc<HostCore>,
}

impl Drop for SrqCore {
    fn drop(&mut self) {
        self._host.arena.free(&self._host.seg, self.off, self.bytes);
    }
}

/// Allocates a receive ring of `depth` WQEs (with headroom) in `host`'s segment: the ring and
/// its (offset, bytes).
pub(crate) fn alloc_recv_ring(
    host: &HostCore,
    call: &'static str,
    depth: u32,
) -> Result<(RecvRing, usize, usize)> {
    let bytes = RecvRing::bytes(depth as usize);
    let off = host.alloc(call, bytes, 128)?;
    // SAFETY: a fresh zeroed 128-aligned allocation of `bytes` in the segment, freed only by the
    // ring's owner after the ring (the owner holds the host, which keeps the segment mapped).
    let ring = unsafe { RecvRing::init(host.seg.at(off), depth as usize, true) };
    Ok((ring, off, bytes))
}

/// A shared receive queue of the software NIC. Cheap to clone.
#[derive(Clone)]
pub struct SimSrq {
    pub(crate) core: Arc<SrqCore>,
}

impl std::fmt::Debug for SimSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimSrq")
            .field("max_wr", &self.core.ring.capacity())
            .field("posted", &self.core.ring.len())
            .finish()
    }
}

impl SimSrq {
    pub(crate) fn new(pd: &SimPd, attr: &SrqInitAttr) -> Result<SimSrq> {
        if attr.max_wr == 0 || attr.max_wr > MAX_SRQ_WR {
            return Err(VerbsError::CapExceeded {
                what: "ibv_create_srq max_wr",
                cap: "max_srq_wr",
                requested: attr.max_wr as u64,
                limit: MAX_SRQ_WR as u64,
            });
        }
        if attr.max_sge > MAX_SGE as u32 {
            return Err(VerbsError::CapExceeded {
                what: "ibv_create_srq max_sge",
                cap: "max_srq_sge",
                requested: attr.max_sge as u64,
                limit: MAX_SGE as u64,
            });
        }
        let host = pd.inner.host.clone();
        let (ring, off, bytes) = alloc_recv_ring(&host, "ibv_create_srq", attr.max_wr)?;
        Ok(SimSrq {
            core: Arc::new(SrqCore {
                ring,
                max_sge: attr.max_sge.max(1),
                pd: pd.inner.id,
                off,
                bytes,
                _host: host,
            }),
        })
    }
}

impl SharedReceiveQueue for SimSrq {
    fn max_wr(&self) -> u32 {
        self.core.ring.capacity() as u32
    }

    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        post_recv_ring(&self.core.ring, "ibv_post_srq_recv", self.core.max_sge, wrs)
    }
}
