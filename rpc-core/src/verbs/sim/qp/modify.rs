//! The QP state machine (`ibv_modify_qp`): the shared rules, the software NIC's own port and GID
//! checks, and what each transition does to the queues.

use super::*;

impl SimQp {
    /// `ibv_modify_qp`. Guard held.
    pub(super) fn modify_locked(&self, st: &mut SqState, attr: &QpAttr) -> Result<()> {
        let c = &*self.core;
        let from = state_of(c.state_raw());
        let mask = rules::check_modify("ibv_modify_qp", c.qpn, from, attr)?;
        let fail = |reason: String| {
            Err(VerbsError::QpTransition {
                call: "ibv_modify_qp",
                qp_num: c.qpn,
                from,
                to: attr.state,
                mask,
                reason,
            })
        };
        if let Some(p) = attr.port_num {
            if p != 1 {
                return fail(format!("port_num {p}: sim0 has port 1 only"));
            }
        }
        if let Some(ah) = &attr.ah {
            if ah.port_num != 1 {
                return fail(format!("ah.port_num {}: sim0 has port 1 only", ah.port_num));
            }
            if let Some(g) = &ah.grh {
                if u32::from(g.sgid_index) >= super::super::host::GID_TBL_LEN {
                    return fail(format!(
                        "ah.grh.sgid_index {}: the GID table has indexes 0..{}",
                        g.sgid_index,
                        super::super::host::GID_TBL_LEN
                    ));
                }
            }
        }

        let to = attr.state;
        match to {
            QpState::Reset => {
                // Everything posted is discarded, and its send-queue slots with it.
                st.head = st.tail;
                st.retired_seen = st.tail;
                c.host.sq_slots.reset(c.qpn, st.tail);
                st.stall = None;
                st.link.peer = None;
                st.link.dest = None;
                if let Some(rq) = &c.rq {
                    while pop_recv_id(rq).is_some() {}
                }
                c.sh().guard.flush_pending.store(false, Ordering::SeqCst);
                c.sh().resp.state.store(ST_RESET, Ordering::SeqCst);
                return Ok(());
            }
            QpState::Err => {
                c.sh().resp.state.store(ST_ERR, Ordering::SeqCst);
                c.flush_rq();
                c.flush_sq_locked(st);
                return Ok(());
            }
            _ => {}
        }
        if let Some(a) = attr.access {
            c.sh().resp.access.store(a.0, Ordering::Release);
        }
        if let Some(t) = attr.min_rnr_timer {
            c.sh().resp.min_rnr_timer.store(t, Ordering::Release);
        }
        if let (Some(ah), Some(qpn)) = (attr.ah, attr.dest_qp_num) {
            st.link.dest = Some(Dest { dgid: ah.grh.map(|g| g.dgid), dlid: ah.dlid, qpn });
            st.link.peer = None;
        }
        if let Some(m) = attr.path_mtu {
            st.link.mtu = m.bytes();
        }
        if let Some(p) = attr.rq_psn {
            c.sh().epsn.store(p, Ordering::Release);
        }
        if let Some(p) = attr.sq_psn {
            st.link.psn = p;
        }
        if let Some(t) = attr.timeout {
            st.link.timeout = t;
        }
        if let Some(r) = attr.retry_cnt {
            st.link.retry_cnt = r;
        }
        if let Some(r) = attr.rnr_retry {
            st.link.rnr_retry = r;
        }
        let raw = match to {
            QpState::Init => ST_INIT,
            QpState::Rtr => ST_RTR,
            _ => ST_RTS,
        };
        c.sh().resp.state.store(raw, Ordering::SeqCst);
        Ok(())
    }
}
