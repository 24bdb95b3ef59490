//! Creating a QP: the requested capacities against the device's, its shared part in the host's
//! segment, its QPN and send-queue tag.

use super::*;

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
        let bytes = sh_bytes + if rq_depth > 0 { sim::srq::RecvRing::bytes(rq_depth) } else { 0 };
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
        // SAFETY: as above: zeroed atomics (a valid RESET state).
        let sh = unsafe { &*sh_ptr };
        let retire_on_poll = sim::sqslots::send_queue_mode() == sim::SendQueueMode::RetireOnPoll;
        let Some(qpn) = host.alloc_qpn(off) else {
            host.arena.free(&host.seg, off, bytes);
            return Err(cap_err(
                "ibv_create_qp",
                "max_qp",
                sim::shm::QP_DIR_LEN as u32 + 1,
                sim::shm::QP_DIR_LEN as u32,
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
                // Storage for waiting WQEs comes when a WQE first waits (`SqState::make_room`).
                wqes: Box::new([]),
                inline: Box::new([]),
                depth: depth as u64,
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
            rnr_stalls: AtomicU64::new(0),
        });
        fabric().register_qp(&core);
        Ok(SimQp { core })
    }
}
