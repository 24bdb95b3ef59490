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

/// Posts `wrs` to `ring`, in order; stops at the first WR that breaks a rule or does not fit
/// (the WRs before it are posted). The WRs that pass the checks are claimed with one CAS on the
/// ring's tail (as many as fit), not one per WR.
#[inline]
pub(crate) fn post_recv_ring(
    ring: &RecvRing,
    call: &'static str,
    max_sge: u32,
    wrs: &[RecvWr<'_>],
) -> Result<()> {
    let max_sge = max_sge.min(MAX_SGE as u32);
    if let [wr] = wrs {
        // One WR (a receive buffer given back): no batch set-up.
        crate::verbs::rules::check_recv_wr(call, 0, wr, max_sge)?;
        let Some(pos) = ring.claim() else {
            return Err(recv_full(call, 0, ring));
        };
        ring.publish(pos, |w| fill_recv_wqe(w, wr));
        return Ok(());
    }
    // The WRs up to the first bad one, and that one's error.
    let mut bad = None;
    let mut good = wrs.len();
    for (index, wr) in wrs.iter().enumerate() {
        if let Err(e) = crate::verbs::rules::check_recv_wr(call, index, wr, max_sge) {
            bad = Some(e);
            good = index;
            break;
        }
    }
    let mut done = 0;
    while done < good {
        let (pos, n) = ring.claim_n(good - done);
        if n == 0 {
            return Err(recv_full(call, done, ring));
        }
        for (i, wr) in wrs[done..done + n].iter().enumerate() {
            ring.publish(pos.wrapping_add(i), |w| fill_recv_wqe(w, wr));
        }
        done += n;
    }
    bad.map_or(Ok(()), Err)
}

/// Writes receive WR `wr` (at most `MAX_SGE` SGEs: checked) into a ring entry's words.
#[inline(always)]
fn fill_recv_wqe(w: &[AtomicU64; RQ_WORDS], wr: &RecvWr<'_>) {
    st(&w[0], wr.wr_id);
    st(&w[1], wr.sg_list.len() as u64);
    for (j, sge) in wr.sg_list.iter().enumerate() {
        st(&w[2 + 2 * j], sge.addr);
        st(&w[3 + 2 * j], sge.length as u64 | (sge.lkey as u64) << 32);
    }
}

/// The error of a post to a full receive queue (WR number `index`). Out of line: rare, and
/// formats.
#[cold]
#[inline(never)]
fn recv_full(call: &'static str, index: usize, ring: &RecvRing) -> VerbsError {
    VerbsError::BadWorkRequest {
        call,
        index,
        reason: format!("receive queue full ({} WQEs outstanding)", ring.capacity()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(wr_id: u64, sg_list: &[Sge]) -> RecvWr<'_> {
        RecvWr { wr_id, sg_list }
    }

    /// The posted WQEs' `wr_id`s and first SGE addresses, oldest first (taking them).
    fn drain(ring: &RecvRing) -> Vec<(u64, u64)> {
        std::iter::from_fn(|| ring.pop_claimed(|w| (ld(&w[0]), rq_sge(w, 0).addr))).collect()
    }

    /// A list of receive WRs is posted in order up to the first WR that breaks a rule (named by
    /// its index) or does not fit (the full queue named at its index); the WRs before it are
    /// posted, none after it. Sabotaged (the batch claiming every WR of the list, the bad one's
    /// followers included): failed ("the WRs before the bad one, and none after it").
    #[test]
    fn a_list_is_posted_up_to_the_first_bad_or_unfitting_wr() {
        let ring = RecvRing::new(4);
        let one = [Sge { addr: 0x1000, length: 64, lkey: 7 }];
        let two = [Sge { addr: 0x2000, length: 64, lkey: 7 }, Sge { addr: 0x3000, length: 64, lkey: 7 }];
        // max_sge 1: the WR with two SGEs (index 2) breaks the rule.
        let list = [wr(1, &one), wr(2, &one), wr(3, &two), wr(4, &one)];
        match post_recv_ring(&ring, "ibv_post_srq_recv", 1, &list) {
            Err(VerbsError::BadWorkRequest { index: 2, reason, .. }) => {
                assert!(reason.contains("2 SGEs"), "{reason}")
            }
            other => panic!("expected WR 2 refused, got {other:?}"),
        }
        assert_eq!(drain(&ring), [(1, 0x1000), (2, 0x1000)], "the WRs before the bad one, and none after it");
        // Room for 4: a list of 6 posts the first 4 and names WR 4 as the one that did not fit.
        let list: Vec<RecvWr<'_>> = (10..16).map(|i| wr(i, &one)).collect();
        match post_recv_ring(&ring, "ibv_post_recv", 1, &list) {
            Err(VerbsError::BadWorkRequest { index: 4, reason, .. }) => {
                assert!(reason.contains("receive queue full"), "{reason}")
            }
            other => panic!("expected WR 4 not to fit, got {other:?}"),
        }
        assert_eq!(drain(&ring).iter().map(|w| w.0).collect::<Vec<_>>(), [10, 11, 12, 13]);
        // One WR, and a list that fits whole, with two SGEs allowed.
        post_recv_ring(&ring, "ibv_post_recv", 2, &[wr(20, &two)]).unwrap();
        post_recv_ring(&ring, "ibv_post_recv", 2, &[wr(21, &one), wr(22, &two)]).unwrap();
        assert_eq!(drain(&ring), [(20, 0x2000), (21, 0x1000), (22, 0x2000)]);
    }
}
