//! Receive queues: the entries a SEND or RDMA_WRITE_WITH_IMM consumes, either a QP's own RQ or a
//! shared receive queue (SRQ). Both are a [`Ring`] of fixed-size receive WQEs, posted by the
//! owner and consumed by the requester's executor (lock-free on both sides).

use std::sync::Arc;

use super::host::{HostCore, SimPd};
use super::ring::Ring;
use super::{MAX_SGE, MAX_SRQ_WR};
use crate::verbs::{RecvWr, Result, Sge, SharedReceiveQueue, SrqInitAttr, VerbsError};

/// A posted receive WQE (SGEs copied at post time, as the NIC copies the WQE).
#[derive(Clone, Copy)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) nsge: u32,
    pub(crate) sges: [Sge; MAX_SGE],
}

/// A receive WQE taken off a queue by an executor (only the used SGEs copied).
pub(crate) struct TakenRecv {
    pub(crate) wr_id: u64,
    pub(crate) nsge: usize,
    pub(crate) sges: [Sge; MAX_SGE],
}

/// Pops the oldest receive WQE of `ring`.
#[inline]
pub(crate) fn take_recv(ring: &Ring<RecvWqe>) -> Option<TakenRecv> {
    ring.pop_with(|w| {
        let nsge = (w.nsge as usize).min(MAX_SGE);
        let mut sges = [Sge::default(); MAX_SGE];
        sges[..nsge].copy_from_slice(&w.sges[..nsge]);
        TakenRecv { wr_id: w.wr_id, nsge, sges }
    })
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
        if wr.sg_list.len() > max_sge as usize {
            return Err(VerbsError::BadWorkRequest {
                call,
                index,
                reason: format!("{} SGEs, the queue allows {max_sge}", wr.sg_list.len()),
            });
        }
        let mut wqe =
            RecvWqe { wr_id: wr.wr_id, nsge: wr.sg_list.len() as u32, sges: [Sge::default(); MAX_SGE] };
        wqe.sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        let pushed = ring.push(wqe);
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
