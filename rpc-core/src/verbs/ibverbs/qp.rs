//! Reliable-connected queue pairs (`struct ibv_qp`, `IBV_QPT_RC`): creation checked against the
//! device's caps, state transitions, posting.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use rdma_sys::{
    ibv_create_qp, ibv_destroy_qp, ibv_gid, ibv_global_route, ibv_modify_qp, ibv_pd, ibv_post_recv,
    ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_cap, ibv_qp_init_attr, ibv_qp_type,
    ibv_query_qp,
};

use super::convert::{mtu_to_ibv, qp_state_code, qp_state_from_code, qp_state_from_ibv, qp_state_to_ibv};
use super::cq::IbvCompletionQueue;
use super::errno::{last_os, rc_error};
use super::pd::IbvProtectionDomain;
use super::post::{post_recv_chain, post_send_chain};
use super::srq::IbvSharedReceiveQueue;
use super::td::{posting, ParentDomain};
use super::Ibverbs;
use crate::verbs::rules::{self, InErr, SendLimits};
use crate::verbs::{QpAttr, QpCap, QpInitAttr, QpState, QueuePair, RecvWr, Result, SendWr, VerbsError};

/// An RC queue pair. Holds its PD, CQs and SRQ alive; dropping it destroys the QP.
///
/// Posting checks the state this handle last saw (set by `modify`, refreshed by `state()`), an
/// atomic load with no system call: sends are refused before RTS, receives in RESET, and both in
/// ERR with [`VerbsError::BadQpState`]. Real NICs flush WRs posted in ERR, but Soft-RoCE (rxe)
/// never completes them, so refusing is the one behaviour that holds everywhere. A QP the NIC moved
/// to ERR by itself flushes what was posted before, as in verbs.
///
/// Where the device offers thread domains the QP is created on its PD's parent domain, and each
/// post holds that thread domain's post lock, which stands in for the provider locks the TD
/// elides (see the `td` module of this provider).
pub struct IbvQueuePair {
    qp: NonNull<ibv_qp>,
    qp_num: u32,
    cap: QpCap,
    uses_srq: bool,
    /// The state of the last successful `modify` or `state()` query (a `qp_state_code`); set to
    /// ERR by the context's async event thread on a QP error event (`qp_context` points here,
    /// boxed so that the address is stable while the QP exists).
    state: Box<AtomicU8>,
    /// The parent domain (with its TD) the QP was created on; `None`: the plain PD. Posts hold
    /// its TD's post lock. Released after the QP is destroyed (fields drop after `drop`).
    domain: Option<Arc<ParentDomain>>,
    _srq: Option<IbvSharedReceiveQueue>,
    _send_cq: IbvCompletionQueue,
    recv_cq: IbvCompletionQueue,
    _pd: IbvProtectionDomain,
}

// SAFETY: libibverbs QP verbs (post, modify, query, destroy) are thread-safe; the Rust state is
// immutable or atomic. On a parent domain with a TD the provider no longer serializes posts;
// `post_send` and `post_recv` hold the TD's post lock for the whole `ibv_post_*` chain instead.
unsafe impl Send for IbvQueuePair {}
// SAFETY: see `Send`.
unsafe impl Sync for IbvQueuePair {}

impl Drop for IbvQueuePair {
    fn drop(&mut self) {
        if let Ok(mut peers) = self.recv_cq.inner.peers.write() {
            peers.remove(&self.qp_num);
        }
        // SAFETY: created by us, destroyed once; its PD, CQs and SRQ are still alive (fields).
        let rc = unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            tracing::warn!(qp_num = self.qp_num, error = %rc_error(rc), "ibv_destroy_qp failed");
        }
    }
}

fn cap_check(what: &'static str, cap: &'static str, requested: u32, limit: u32) -> Result<()> {
    if requested > limit {
        return Err(VerbsError::CapExceeded { what, cap, requested: requested.into(), limit: limit.into() });
    }
    Ok(())
}

/// The `ibv_pd` QPs of `pd` are created on: its parent domain where it has one, else itself.
fn qp_pd(pd: &IbvProtectionDomain) -> *mut ibv_pd {
    pd.qp_domain().map_or_else(|| pd.raw(), |d| d.raw())
}

/// Creates a raw RC QP on `pd` (the PD or its parent domain); NULL means failure (errno set).
fn raw_create(
    pd: *mut ibv_pd,
    send_cq: &IbvCompletionQueue,
    recv_cq: &IbvCompletionQueue,
    srq: Option<&IbvSharedReceiveQueue>,
    cap: ibv_qp_cap,
    sq_sig_all: bool,
    qp_context: *mut std::os::raw::c_void,
) -> (*mut ibv_qp, ibv_qp_cap) {
    let mut init = ibv_qp_init_attr {
        qp_context,
        send_cq: send_cq.inner.cq.as_ptr(),
        recv_cq: recv_cq.inner.cq.as_ptr(),
        srq: srq.map_or(std::ptr::null_mut(), |s| s.inner.srq.as_ptr()),
        cap,
        qp_type: ibv_qp_type::IBV_QPT_RC,
        sq_sig_all: i32::from(sq_sig_all),
    };
    // SAFETY: live PD or parent domain, CQs and SRQ (borrowed for the call; the QP object keeps
    // them alive after); `init` is a live in/out parameter.
    let qp = unsafe { ibv_create_qp(pd, &mut init) };
    (qp, init.cap)
}

/// After a refused creation: the largest `max_inline_data` below `requested` that the device
/// accepts, found by creating small QPs (about log2(requested) creations), or `None` when a small
/// QP with `requested` itself is accepted (the refusal had another cause).
fn probe_max_inline(pd: *mut ibv_pd, cq: &IbvCompletionQueue, requested: u32) -> Option<u32> {
    let accepts = |inline: u32| {
        let cap = ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: inline,
        };
        let (qp, _) = raw_create(pd, cq, cq, None, cap, false, std::ptr::null_mut());
        if qp.is_null() {
            return false;
        }
        // SAFETY: the probe QP was just created and is destroyed once.
        unsafe { ibv_destroy_qp(qp) };
        true
    };
    if accepts(requested) {
        return None;
    }
    let (mut lo, mut hi) = (0u32, requested); // lo accepted (0 always is), hi refused
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if accepts(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

impl std::fmt::Debug for IbvQueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvQueuePair")
            .field("qp_num", &self.qp_num)
            .field("state", &self.cached_state())
            .field("cap", &self.cap)
            .field("srq", &self.uses_srq)
            .field("thread_domain", &self.domain.is_some())
            .finish()
    }
}

/// The QP's capacities as the provider has them (`ibv_query_qp` with `IBV_QP_CAP`).
fn query_cap(qp: NonNull<ibv_qp>) -> Option<ibv_qp_cap> {
    // SAFETY: plain C data; all-zero is valid for both.
    let (mut attr, mut init): (ibv_qp_attr, ibv_qp_init_attr) = unsafe { std::mem::zeroed() };
    // SAFETY: live QP; live out-parameters.
    let rc =
        unsafe { ibv_query_qp(qp.as_ptr(), &mut attr, ibv_qp_attr_mask::IBV_QP_CAP.0 as i32, &mut init) };
    (rc == 0).then_some(attr.cap)
}

impl IbvQueuePair {
    pub(super) fn create(pd: &IbvProtectionDomain, attr: &QpInitAttr<'_, Ibverbs>) -> Result<IbvQueuePair> {
        let ctx = pd.ctx();
        let dev = &ctx.inner.attr;
        let c = attr.cap;
        let with_srq = attr.srq.is_some();
        cap_check("create_qp max_send_wr", "max_qp_wr", c.max_send_wr, dev.max_qp_wr)?;
        cap_check("create_qp max_send_sge", "max_sge", c.max_send_sge, dev.max_sge)?;
        if !with_srq {
            cap_check("create_qp max_recv_wr", "max_qp_wr", c.max_recv_wr, dev.max_qp_wr)?;
            cap_check("create_qp max_recv_sge", "max_sge", c.max_recv_sge, dev.max_sge)?;
        }
        let known_inline = ctx.inner.max_inline.load(Ordering::Relaxed);
        if known_inline != u32::MAX {
            cap_check("create_qp max_inline_data", "max_inline_data", c.max_inline_data, known_inline)?;
        }
        let cap = ibv_qp_cap {
            max_send_wr: c.max_send_wr,
            max_recv_wr: if with_srq { 0 } else { c.max_recv_wr },
            max_send_sge: c.max_send_sge,
            max_recv_sge: if with_srq { 0 } else { c.max_recv_sge },
            max_inline_data: c.max_inline_data,
        };
        let state = Box::new(AtomicU8::new(qp_state_code(QpState::Reset)));
        let qp_context = (&*state as *const AtomicU8).cast_mut().cast();
        let on = qp_pd(pd);
        let (qp, actual) =
            raw_create(on, attr.send_cq, attr.recv_cq, attr.srq, cap, attr.sq_sig_all, qp_context);
        let Some(qp) = NonNull::new(qp) else {
            let err = last_os("ibv_create_qp");
            if let VerbsError::Os { source, .. } = &err {
                if source.raw_os_error() == Some(libc::EINVAL) && c.max_inline_data > 0 {
                    if let Some(limit) = probe_max_inline(on, attr.send_cq, c.max_inline_data) {
                        ctx.inner.max_inline.store(limit, Ordering::Relaxed);
                        cap_check("create_qp max_inline_data", "max_inline_data", c.max_inline_data, limit)?;
                    }
                }
            }
            return Err(err);
        };
        // SAFETY: `qp` is live; `qp_num` is set at creation.
        let qp_num = unsafe { (*qp.as_ptr()).qp_num };
        // Some providers (rxe) round the queues up without saying so in the create answer;
        // `ibv_query_qp` reports the real depths.
        let actual = query_cap(qp).map_or(actual, |q| ibv_qp_cap {
            max_send_wr: q.max_send_wr.max(actual.max_send_wr),
            max_recv_wr: q.max_recv_wr.max(actual.max_recv_wr),
            max_send_sge: q.max_send_sge.max(actual.max_send_sge),
            max_recv_sge: q.max_recv_sge.max(actual.max_recv_sge),
            max_inline_data: q.max_inline_data.max(actual.max_inline_data),
        });
        let cap = QpCap {
            max_send_wr: actual.max_send_wr.max(c.max_send_wr),
            max_recv_wr: if with_srq { 0 } else { actual.max_recv_wr.max(c.max_recv_wr) },
            max_send_sge: actual.max_send_sge.max(c.max_send_sge),
            max_recv_sge: if with_srq { 0 } else { actual.max_recv_sge.max(c.max_recv_sge) },
            max_inline_data: actual.max_inline_data.max(c.max_inline_data),
        };
        let domain = pd.qp_domain().cloned();
        tracing::debug!(qp_num, ?cap, srq = with_srq, thread_domain = domain.is_some(), "created RC QP");
        Ok(IbvQueuePair {
            qp,
            qp_num,
            cap,
            uses_srq: with_srq,
            state,
            domain,
            _srq: attr.srq.cloned(),
            _send_cq: attr.send_cq.clone(),
            recv_cq: attr.recv_cq.clone(),
            _pd: pd.clone(),
        })
    }

    fn cached_state(&self) -> QpState {
        qp_state_from_code(self.state.load(Ordering::Acquire))
    }
}

/// The `ibv_qp_attr` and mask of a [`QpAttr`].
fn to_ibv_attr(a: &QpAttr) -> (ibv_qp_attr, u32) {
    use ibv_qp_attr_mask as m;
    // SAFETY: `ibv_qp_attr` is plain C data; all-zero is a valid value.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    let mut mask = m::IBV_QP_STATE;
    attr.qp_state = qp_state_to_ibv(a.state);
    if let Some(v) = a.port_num {
        attr.port_num = v;
        mask |= m::IBV_QP_PORT;
    }
    if let Some(v) = a.pkey_index {
        attr.pkey_index = v;
        mask |= m::IBV_QP_PKEY_INDEX;
    }
    if let Some(v) = a.access {
        attr.qp_access_flags = v.0 & 0xf;
        mask |= m::IBV_QP_ACCESS_FLAGS;
    }
    if let Some(v) = a.path_mtu {
        attr.path_mtu = mtu_to_ibv(v);
        mask |= m::IBV_QP_PATH_MTU;
    }
    if let Some(v) = a.dest_qp_num {
        attr.dest_qp_num = v;
        mask |= m::IBV_QP_DEST_QPN;
    }
    if let Some(v) = a.rq_psn {
        attr.rq_psn = v & 0x00ff_ffff;
        mask |= m::IBV_QP_RQ_PSN;
    }
    if let Some(v) = a.sq_psn {
        attr.sq_psn = v & 0x00ff_ffff;
        mask |= m::IBV_QP_SQ_PSN;
    }
    if let Some(ah) = a.ah {
        attr.ah_attr.dlid = ah.dlid;
        attr.ah_attr.sl = ah.sl;
        attr.ah_attr.port_num = ah.port_num;
        if let Some(g) = ah.grh {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh = ibv_global_route {
                dgid: ibv_gid { raw: g.dgid.0 },
                flow_label: g.flow_label,
                sgid_index: g.sgid_index,
                hop_limit: g.hop_limit,
                traffic_class: g.traffic_class,
            };
        }
        mask |= m::IBV_QP_AV;
    }
    if let Some(v) = a.max_dest_rd_atomic {
        attr.max_dest_rd_atomic = v;
        mask |= m::IBV_QP_MAX_DEST_RD_ATOMIC;
    }
    if let Some(v) = a.max_rd_atomic {
        attr.max_rd_atomic = v;
        mask |= m::IBV_QP_MAX_QP_RD_ATOMIC;
    }
    if let Some(v) = a.min_rnr_timer {
        attr.min_rnr_timer = v;
        mask |= m::IBV_QP_MIN_RNR_TIMER;
    }
    if let Some(v) = a.timeout {
        attr.timeout = v;
        mask |= m::IBV_QP_TIMEOUT;
    }
    if let Some(v) = a.retry_cnt {
        attr.retry_cnt = v;
        mask |= m::IBV_QP_RETRY_CNT;
    }
    if let Some(v) = a.rnr_retry {
        attr.rnr_retry = v;
        mask |= m::IBV_QP_RNR_RETRY;
    }
    (attr, mask.0)
}

impl QueuePair for IbvQueuePair {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn identity(&self) -> usize {
        self.qp.as_ptr() as usize
    }

    fn state(&self) -> QpState {
        // SAFETY: plain C data; all-zero is valid for both.
        let (mut attr, mut init): (ibv_qp_attr, ibv_qp_init_attr) = unsafe { std::mem::zeroed() };
        // SAFETY: live QP; live out-parameters.
        let rc = unsafe {
            ibv_query_qp(self.qp.as_ptr(), &mut attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &mut init)
        };
        if rc != 0 {
            tracing::warn!(qp_num = self.qp_num, error = %rc_error(rc), "ibv_query_qp failed; reporting the last known state");
            return self.cached_state();
        }
        let s = qp_state_from_ibv(attr.qp_state);
        self.state.store(qp_state_code(s), Ordering::Release);
        s
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn modify(&self, a: &QpAttr) -> Result<()> {
        let from = self.cached_state();
        rules::check_modify("ibv_modify_qp", self.qp_num, from, a)?;
        let (mut attr, mask) = to_ibv_attr(a);
        // SAFETY: live QP; `attr` is a live, fully initialised parameter matching `mask`.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut attr, mask as i32) };
        if rc != 0 {
            let err = rc_error(rc);
            let from = self.state();
            return Err(VerbsError::QpTransition {
                call: "ibv_modify_qp",
                qp_num: self.qp_num,
                from,
                to: a.state,
                mask,
                reason: format!("{err} (mask: {})", rules::mask_names(mask)),
            });
        }
        self.state.store(qp_state_code(a.state), Ordering::Release);
        if let (Some(dest), Ok(mut peers)) = (a.dest_qp_num, self.recv_cq.inner.peers.write()) {
            peers.insert(self.qp_num, dest);
        }
        tracing::trace!(qp_num = self.qp_num, ?from, to = ?a.state, "QP transition");
        Ok(())
    }

    #[inline]
    unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        rules::check_send_state(self.qp_num, self.cached_state(), InErr::Refuse)?;
        let lim = SendLimits { max_sge: self.cap.max_send_sge, max_inline: self.cap.max_inline_data };
        let qp = self.qp.as_ptr();
        let post = |wr, bad| {
            // SAFETY: live QP (while `self` is), a valid chain on `post_send_chain`'s stack, live
            // out-parameter.
            unsafe { ibv_post_send(qp, wr, bad) }
        };
        // SAFETY: `post` posts to this live QP; the memory contract is the caller's. On a TD the
        // whole chain is posted under the TD's post lock (`posting`), so no two threads run the
        // provider's lock-elided post path of this TD's QPs at once.
        posting(self.domain.as_deref(), || unsafe { post_send_chain(wrs, lim, post) })
    }

    #[inline]
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.uses_srq {
            return Err(VerbsError::BadWorkRequest {
                call: "ibv_post_recv",
                index: 0,
                reason: format!("QP {} receives from an SRQ; post receives to the SRQ", self.qp_num),
            });
        }
        rules::check_recv_state(self.qp_num, self.cached_state(), InErr::Refuse)?;
        let qp = self.qp.as_ptr();
        let post = |wr, bad| {
            // SAFETY: live QP (while `self` is), a valid chain on `post_recv_chain`'s stack, live
            // out-parameter.
            unsafe { ibv_post_recv(qp, wr, bad) }
        };
        // SAFETY: `post` posts to this live QP; the memory contract is the caller's. Under the
        // TD's post lock where there is one, as in `post_send`.
        posting(self.domain.as_deref(), || unsafe {
            post_recv_chain("ibv_post_recv", wrs, self.cap.max_recv_sge, post)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{AccessFlags, AhAttr, Gid, GlobalRoute, Mtu};

    #[test]
    fn rtr_attr_sets_grh_and_mask() {
        let mut a = QpAttr::new(QpState::Rtr);
        a.path_mtu = Some(Mtu::Mtu1024);
        a.dest_qp_num = Some(17);
        a.rq_psn = Some(0x1ff_ffff);
        a.ah = Some(AhAttr {
            dlid: 0,
            sl: 0,
            port_num: 1,
            grh: Some(GlobalRoute {
                dgid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
                sgid_index: 1,
                flow_label: 0,
                hop_limit: 64,
                traffic_class: 0,
            }),
        });
        let (attr, mask) = to_ibv_attr(&a);
        assert_eq!(mask, rules::attr_mask(&a), "the shared rules see the mask libibverbs gets");
        assert_eq!(
            rules::mask_names(mask),
            "state (IBV_QP_STATE), ah (IBV_QP_AV), path_mtu (IBV_QP_PATH_MTU), rq_psn (IBV_QP_RQ_PSN), \
             dest_qp_num (IBV_QP_DEST_QPN)"
        );
        assert_eq!(attr.ah_attr.is_global, 1);
        assert_eq!(attr.ah_attr.grh.sgid_index, 1);
        // SAFETY: written as `raw` above.
        assert_eq!(unsafe { attr.ah_attr.grh.dgid.raw }[0], 0xfe);
        assert_eq!(attr.rq_psn, 0xff_ffff, "PSNs are 24 bits");
        assert_eq!(attr.dest_qp_num, 17);
    }

    /// The shared rules' mask bits are libibverbs' (`ibv_qp_attr_mask`), bit for bit.
    #[test]
    fn rules_mask_bits_are_libibverbs_bits() {
        use ibv_qp_attr_mask as m;
        use rules::mask;
        for (ours, theirs) in [
            (mask::STATE, m::IBV_QP_STATE),
            (mask::ACCESS, m::IBV_QP_ACCESS_FLAGS),
            (mask::PKEY, m::IBV_QP_PKEY_INDEX),
            (mask::PORT, m::IBV_QP_PORT),
            (mask::AV, m::IBV_QP_AV),
            (mask::PATH_MTU, m::IBV_QP_PATH_MTU),
            (mask::TIMEOUT, m::IBV_QP_TIMEOUT),
            (mask::RETRY, m::IBV_QP_RETRY_CNT),
            (mask::RNR_RETRY, m::IBV_QP_RNR_RETRY),
            (mask::RQ_PSN, m::IBV_QP_RQ_PSN),
            (mask::MAX_RD, m::IBV_QP_MAX_QP_RD_ATOMIC),
            (mask::MIN_RNR, m::IBV_QP_MIN_RNR_TIMER),
            (mask::SQ_PSN, m::IBV_QP_SQ_PSN),
            (mask::MAX_DEST_RD, m::IBV_QP_MAX_DEST_RD_ATOMIC),
            (mask::DEST_QPN, m::IBV_QP_DEST_QPN),
        ] {
            assert_eq!(ours, theirs.0, "{}", rules::mask_names(ours));
        }
        let mut a = QpAttr::new(QpState::Init);
        a.access = Some(AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE);
        let (attr, mask) = to_ibv_attr(&a);
        assert_eq!(attr.qp_access_flags, 3);
        assert_eq!(mask, rules::attr_mask(&a));
    }
}
