//! The QP's own receive queue (a QP with an SRQ has none): posting and flushing.

use super::*;

impl QpCore {
    /// Completes every WQE of the QP's own receive queue with `IBV_WC_WR_FLUSH_ERR` (an SRQ is
    /// shared and not flushed, as in verbs).
    pub(crate) fn flush_rq(&self) {
        if let Some(rq) = &self.rq {
            while let Some(wr_id) = pop_recv_id(rq) {
                self.recv_cq.push(flush_wc(wr_id, WcOpcode::IBV_WC_RECV, self.qpn), true);
            }
        }
    }
}

impl SimQp {
    /// `ibv_post_recv`: checked by the shared rules, then pushed to the RQ ring; flushed at once
    /// when the QP is in ERR.
    ///
    /// # Safety
    /// As [`QueuePair::post_recv`]: the SGEs' memory stays valid until the WRs complete.
    #[inline]
    pub(super) unsafe fn post_recv_rq(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let c = &*self.core;
        let Some(rq) = &c.rq else {
            return Err(VerbsError::BadWorkRequest {
                call: "ibv_post_recv",
                index: 0,
                reason: "the QP receives from an SRQ: post to the SRQ".into(),
            });
        };
        rules::check_recv_state(c.qpn, state_of(c.state_raw()), rules::InErr::Flush)?;
        let r = post_recv_ring(rq, "ibv_post_recv", c.cap.max_recv_sge, wrs);
        if c.state_raw() == ST_ERR {
            c.flush_rq();
        }
        r
    }
}
