//! Send completions: success CQEs, the error CQE that moves a QP to ERR, and flushes.

use super::*;

impl QpCore {
    /// A successful send WQE (sequence number `seq`): a CQE if signaled. The test is inlined
    /// (most sends of a selectively signaled queue are not); the CQE is pushed out of line.
    #[inline(always)]
    pub(crate) fn complete_ok(&self, v: &exec::WqeView<'_>, len: u64, seq: u64) {
        if self.sig_all || v.flags.contains(SendFlags::SIGNALED) {
            self.complete_signaled(v, len, seq);
        }
    }

    /// [`QpCore::complete_ok`] of a signaled WQE: its success CQE.
    #[inline(never)]
    fn complete_signaled(&self, v: &exec::WqeView<'_>, len: u64, seq: u64) {
        self.send_cq.push_send(
            WorkCompletion {
                wr_id: v.wr_id,
                status: WcStatus::IBV_WC_SUCCESS,
                opcode: send_opcode(v.op),
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
    pub(super) fn flush_sq_locked(&self, st: &mut SqState) {
        self.sh().guard.flush_pending.store(false, Ordering::SeqCst);
        if self.state_raw() != ST_ERR || self.sh().resp.destroyed.load(Ordering::Acquire) {
            return;
        }
        while st.head != st.tail {
            let wqe = &st.wqes[st.slot(st.head)];
            let wc = flush_wc(wqe.wr_id, send_opcode(&wqe.op), self.qpn);
            self.send_cq.push_send(wc, true, self.sq_ref(st.head));
            st.head += 1;
        }
        st.stall = None;
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
