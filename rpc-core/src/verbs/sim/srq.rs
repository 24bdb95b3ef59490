//! Receive queues: the entries a SEND or RDMA_WRITE_WITH_IMM consumes, either a QP's own RQ or a
//! shared receive queue (SRQ). Both are a [`Ring`] of fixed-size receive WQEs, posted by the
//! owner and consumed by the requester's executor (lock-free on both sides).

use std::sync::Arc;

use super::host::{HostCore, SimPd};
use super::ring::Ring;
use super::{MAX_SGE, MAX_SRQ_WR};
use crate::verbs::{RecvWr, Result, Sge, SharedReceiveQueue, SrqInitAttr, VerbsError};

/// A posted receive WQE (SGEs copied at post time, as the NIC copies the WQE). Only the first
/// `nsge` SGEs are written and read.
#[derive(Clone, Copy)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) nsge: u32,
    pub(crate) sges: [Sge; MAX_SGE],
}

/// Pops the oldest receive WQE of `ring` and gives `f` its `wr_id` and SGEs, in place.
#[inline]
pub(crate) fn pop_recv<R>(ring: &Ring<RecvWqe>, f: impl FnOnce(u64, &[Sge]) -> R) -> Option<R> {
    ring.pop_raw(|p| {
        // SAFETY: `post_recv_ring` wrote `wr_id`, `nsge` (<= MAX_SGE) and the first `nsge` SGEs
        // of this slot before publishing it; we read exactly those, through raw pointers.
        unsafe {
            let wr_id = std::ptr::addr_of!((*p).wr_id).read();
            let n = (std::ptr::addr_of!((*p).nsge).read() as usize).min(MAX_SGE);
            let sges = std::slice::from_raw_parts(std::ptr::addr_of!((*p).sges) as *const Sge, n);
            f(wr_id, sges)
        }
    })
}

/// Pops the oldest receive WQE of `ring`, returning its `wr_id`.
#[inline]
pub(crate) fn pop_recv_id(ring: &Ring<RecvWqe>) -> Option<u64> {
    pop_recv(ring, |wr_id, _| wr_id)
}

/// Posts `wrs` to `ring`, in order; stops at the first WR that does not fit.
#[inline]
pub(crate) fn post_recv_ring(
    ring: &Ring<RecvWqe>,
    call: &'static str,
    max_sge: u32,
    wrs: &[RecvWr<'_>],
) -> Result<()> {
    for (index, wr) in wrs.iter().enumerate() {
        let n = wr.sg_list.len();
        if n > max_sge as usize || n > MAX_SGE {
            return Err(VerbsError::BadWorkRequest {
                call,
                index,
                reason: format!("{n} SGEs, the queue allows {max_sge}"),
            });
        }
        let pushed = ring.push_with(|slot| {
            let p = slot.as_mut_ptr();
            // SAFETY: `p` is this thread's exclusive slot; we write the header and the first `n`
            // (<= MAX_SGE) SGEs, which is all a reader (`pop_recv`) reads.
            unsafe {
                std::ptr::addr_of_mut!((*p).wr_id).write(wr.wr_id);
                std::ptr::addr_of_mut!((*p).nsge).write(n as u32);
                let sges = std::ptr::addr_of_mut!((*p).sges) as *mut Sge;
                std::ptr::copy_nonoverlapping(wr.sg_list.as_ptr(), sges, n);
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
    pub(crate) ring: Ring<RecvWqe>,
    pub(crate) max_sge: u32,
    pub(crate) pd: u32,
    pub(crate) _host: Arc<HostCore>,
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
        Ok(SimSrq {
            core: Arc::new(SrqCore {
                ring: Ring::new(attr.max_wr as usize),
                max_sge: attr.max_sge.max(1),
                pd: pd.inner.id,
                _host: pd.inner.host.clone(),
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
