//! The RC queue-pair rules of verbs, written once for every provider: which attributes each
//! `ibv_modify_qp` transition requires and allows, the attributes' ranges, in which states a QP
//! takes send and receive work requests, and what a WR may carry (SGE count, inline size, opcode
//! and flags). The software NIC and the libibverbs provider both check a call here before they
//! modify or post, so that a program refused by one is refused, with the same words, by the other.
//!
//! Sources: `man ibv_modify_qp` (the RC rows of its transition table), `man ibv_post_send`,
//! `man ibv_post_recv`, rdma-core's `infiniband/verbs.h` (the mask bits).

use super::{QpAttr, QpState, RecvWr, Result, SendFlags, SendOp, SendWr, VerbsError};

/// The bits of `ibv_qp_attr_mask`, with libibverbs' values.
pub(crate) mod mask {
    pub(crate) const STATE: u32 = 1;
    pub(crate) const ACCESS: u32 = 1 << 3;
    pub(crate) const PKEY: u32 = 1 << 4;
    pub(crate) const PORT: u32 = 1 << 5;
    pub(crate) const AV: u32 = 1 << 7;
    pub(crate) const PATH_MTU: u32 = 1 << 8;
    pub(crate) const TIMEOUT: u32 = 1 << 9;
    pub(crate) const RETRY: u32 = 1 << 10;
    pub(crate) const RNR_RETRY: u32 = 1 << 11;
    pub(crate) const RQ_PSN: u32 = 1 << 12;
    pub(crate) const MAX_RD: u32 = 1 << 13;
    pub(crate) const MIN_RNR: u32 = 1 << 15;
    pub(crate) const SQ_PSN: u32 = 1 << 16;
    pub(crate) const MAX_DEST_RD: u32 = 1 << 17;
    pub(crate) const DEST_QPN: u32 = 1 << 20;

    /// Each bit with its `QpAttr` field and its libibverbs name.
    pub(crate) const NAMES: [(u32, &str); 15] = [
        (STATE, "state (IBV_QP_STATE)"),
        (ACCESS, "access (IBV_QP_ACCESS_FLAGS)"),
        (PKEY, "pkey_index (IBV_QP_PKEY_INDEX)"),
        (PORT, "port_num (IBV_QP_PORT)"),
        (AV, "ah (IBV_QP_AV)"),
        (PATH_MTU, "path_mtu (IBV_QP_PATH_MTU)"),
        (TIMEOUT, "timeout (IBV_QP_TIMEOUT)"),
        (RETRY, "retry_cnt (IBV_QP_RETRY_CNT)"),
        (RNR_RETRY, "rnr_retry (IBV_QP_RNR_RETRY)"),
        (RQ_PSN, "rq_psn (IBV_QP_RQ_PSN)"),
        (MAX_RD, "max_rd_atomic (IBV_QP_MAX_QP_RD_ATOMIC)"),
        (MIN_RNR, "min_rnr_timer (IBV_QP_MIN_RNR_TIMER)"),
        (SQ_PSN, "sq_psn (IBV_QP_SQ_PSN)"),
        (MAX_DEST_RD, "max_dest_rd_atomic (IBV_QP_MAX_DEST_RD_ATOMIC)"),
        (DEST_QPN, "dest_qp_num (IBV_QP_DEST_QPN)"),
    ];
}

/// The names of the bits set in `m`, joined with `", "` (`"pkey_index (IBV_QP_PKEY_INDEX), ..."`).
pub(crate) fn mask_names(m: u32) -> String {
    mask::NAMES.iter().filter(|(b, _)| m & b != 0).map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
}

/// The `ibv_qp_attr_mask` of `a`: [`mask::STATE`] and the bit of every field that is `Some`.
pub(crate) fn attr_mask(a: &QpAttr) -> u32 {
    use mask::*;
    let mut m = STATE;
    for (present, bit) in [
        (a.access.is_some(), ACCESS),
        (a.pkey_index.is_some(), PKEY),
        (a.port_num.is_some(), PORT),
        (a.ah.is_some(), AV),
        (a.path_mtu.is_some(), PATH_MTU),
        (a.timeout.is_some(), TIMEOUT),
        (a.retry_cnt.is_some(), RETRY),
        (a.rnr_retry.is_some(), RNR_RETRY),
        (a.rq_psn.is_some(), RQ_PSN),
        (a.max_rd_atomic.is_some(), MAX_RD),
        (a.min_rnr_timer.is_some(), MIN_RNR),
        (a.sq_psn.is_some(), SQ_PSN),
        (a.max_dest_rd_atomic.is_some(), MAX_DEST_RD),
        (a.dest_qp_num.is_some(), DEST_QPN),
    ] {
        if present {
            m |= bit;
        }
    }
    m
}

/// The attributes an RC transition `from → to` requires and allows (besides `IBV_QP_STATE`),
/// as masks; `None` when the state machine has no such transition. The rows of
/// `man ibv_modify_qp` for the fields [`QpAttr`] has (no alternate path, no `CUR_STATE`).
pub(crate) fn transition(from: QpState, to: QpState) -> Option<(u32, u32)> {
    use mask::*;
    Some(match (from, to) {
        (_, QpState::Reset) | (_, QpState::Err) => (0, u32::MAX),
        (QpState::Reset, QpState::Init) => (PKEY | PORT | ACCESS, 0),
        (QpState::Init, QpState::Init) => (0, PKEY | PORT | ACCESS),
        (QpState::Init, QpState::Rtr) => {
            (AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR, ACCESS | PKEY)
        }
        (QpState::Rtr, QpState::Rts) => (SQ_PSN | TIMEOUT | RETRY | RNR_RETRY | MAX_RD, ACCESS | MIN_RNR),
        (QpState::Rts, QpState::Rts) => (0, ACCESS | MIN_RNR),
        _ => return None,
    })
}

/// Checks a modify of QP `qp_num`, now in `from`, to `attr`: the transition exists, its required
/// attributes are present and no other is, and every value is in its verbs range (retry counts
/// 0..=7, timer codes 0..=31, PSNs and QPNs 24 bits). Returns the attribute mask.
///
/// # Errors
/// [`VerbsError::QpTransition`] naming `call`, the states, the mask and the broken rule.
pub(crate) fn check_modify(call: &'static str, qp_num: u32, from: QpState, attr: &QpAttr) -> Result<u32> {
    let to = attr.state;
    let mask = attr_mask(attr);
    let fail = |reason: String| Err(VerbsError::QpTransition { call, qp_num, from, to, mask, reason });
    let Some((required, optional)) = transition(from, to) else {
        return fail("transition not allowed by the QP state machine".into());
    };
    let missing = required & !mask;
    if missing != 0 {
        return fail(format!("missing attribute(s): {}", mask_names(missing)));
    }
    let extra = mask & !(required | optional | mask::STATE);
    if extra != 0 {
        return fail(format!("attribute(s) not allowed in this transition: {}", mask_names(extra)));
    }
    for (name, v) in [("retry_cnt", attr.retry_cnt), ("rnr_retry", attr.rnr_retry)] {
        if let Some(v) = v.filter(|&v| v > 7) {
            return fail(format!("{name} {v} out of range 0..=7"));
        }
    }
    if attr.min_rnr_timer.is_some_and(|v| v > 31) || attr.timeout.is_some_and(|v| v > 31) {
        return fail("min_rnr_timer and timeout are 5-bit codes (0..=31)".into());
    }
    for (name, v) in [("rq_psn", attr.rq_psn), ("sq_psn", attr.sq_psn), ("dest_qp_num", attr.dest_qp_num)] {
        if let Some(v) = v.filter(|&v| v > 0x00ff_ffff) {
            return fail(format!("{name} {v:#x} exceeds 24 bits"));
        }
    }
    Ok(mask)
}

/// What a provider does with work posted to a QP in ERR. Verbs says a QP in ERR completes what
/// is posted with `IBV_WC_WR_FLUSH_ERR`; Soft-RoCE (rxe) never completes it, so the libibverbs
/// provider refuses instead, which holds on every device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InErr {
    /// Accepted, then flushed (the software NIC).
    Flush,
    /// Refused with [`VerbsError::BadQpState`] (libibverbs).
    Refuse,
}

/// Checks that a QP in `state` takes send WRs: RTS, or ERR under [`InErr::Flush`].
///
/// # Errors
/// [`VerbsError::BadQpState`] (`ibv_post_send`) in RESET, INIT, RTR, and ERR under [`InErr::Refuse`].
#[inline]
pub(crate) fn check_send_state(qp_num: u32, state: QpState, in_err: InErr) -> Result<()> {
    match state {
        QpState::Rts => Ok(()),
        QpState::Err if in_err == InErr::Flush => Ok(()),
        _ => Err(VerbsError::BadQpState { call: "ibv_post_send", qp_num, state }),
    }
}

/// Checks that a QP in `state` takes receive WRs: any state but RESET (receives may be posted
/// from INIT on), and not ERR under [`InErr::Refuse`].
///
/// # Errors
/// [`VerbsError::BadQpState`] (`ibv_post_recv`).
#[inline]
pub(crate) fn check_recv_state(qp_num: u32, state: QpState, in_err: InErr) -> Result<()> {
    match state {
        QpState::Reset => Err(VerbsError::BadQpState { call: "ibv_post_recv", qp_num, state }),
        QpState::Err if in_err == InErr::Refuse => {
            Err(VerbsError::BadQpState { call: "ibv_post_recv", qp_num, state })
        }
        _ => Ok(()),
    }
}

/// The limits a send WR is checked against: the QP's capacities, bounded by the provider's own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendLimits {
    /// SGEs per WR: the QP's `max_send_sge` (or less, when the provider's post path holds fewer).
    pub(crate) max_sge: u32,
    /// Bytes of inline payload per WR: the QP's `max_inline_data`.
    pub(crate) max_inline: u32,
}

/// Checks send WR number `index` of a post against `lim`: at most `max_sge` SGEs; no SGE for
/// BIND_MW and LOCAL_INV; INLINE only on SEND and WRITE opcodes, with at most `max_inline` bytes.
///
/// # Errors
/// [`VerbsError::BadWorkRequest`] (`ibv_post_send`, `index`) saying which rule.
#[inline]
pub(crate) fn check_send_wr(index: usize, wr: &SendWr<'_>, lim: SendLimits) -> Result<()> {
    // The rules in a few compares, inlined into the post path; a WR that breaks one goes to the
    // out-of-line check that names it.
    let n = wr.sg_list.len();
    let memory_op = matches!(wr.op, SendOp::BindMw { .. } | SendOp::LocalInv { .. });
    let bad_inline = wr.flags.contains(SendFlags::INLINE)
        && (memory_op
            || matches!(wr.op, SendOp::RdmaRead { .. })
            || inline_bytes(wr.sg_list) > u64::from(lim.max_inline));
    if n > lim.max_sge as usize || (memory_op && n != 0) || bad_inline {
        return check_send_wr_rules(index, wr, lim);
    }
    Ok(())
}

/// The bytes of an inline WR's SGEs: the usual single SGE read directly, without the set-up of
/// a summing loop.
#[inline(always)]
fn inline_bytes(sg_list: &[crate::verbs::Sge]) -> u64 {
    match sg_list {
        [one] => u64::from(one.length),
        all => all.iter().map(|s| u64::from(s.length)).sum(),
    }
}

/// [`check_send_wr`]'s every rule, with the reason of the first one broken.
#[cold]
#[inline(never)]
fn check_send_wr_rules(index: usize, wr: &SendWr<'_>, lim: SendLimits) -> Result<()> {
    let bad = |reason: String| Err(VerbsError::BadWorkRequest { call: "ibv_post_send", index, reason });
    let n = wr.sg_list.len();
    if n > lim.max_sge as usize {
        return bad(format!("{n} SGEs, but the QP's max_send_sge is {}", lim.max_sge));
    }
    let memory_op = matches!(wr.op, SendOp::BindMw { .. } | SendOp::LocalInv { .. });
    if memory_op && n != 0 {
        return bad("BIND_MW and LOCAL_INV take no SGEs".into());
    }
    if wr.flags.contains(SendFlags::INLINE) {
        if memory_op || matches!(wr.op, SendOp::RdmaRead { .. }) {
            return bad("RDMA READ, BIND_MW and LOCAL_INV cannot be INLINE".into());
        }
        let bytes: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if bytes > u64::from(lim.max_inline) {
            return bad(format!("{bytes} bytes inline, but the QP's max_inline_data is {}", lim.max_inline));
        }
    }
    Ok(())
}

/// Checks receive WR number `index` of a post to a queue that takes `max_sge` SGEs per WR.
///
/// # Errors
/// [`VerbsError::BadWorkRequest`] naming `call` (`ibv_post_recv` or `ibv_post_srq_recv`).
#[inline]
pub(crate) fn check_recv_wr(call: &'static str, index: usize, wr: &RecvWr<'_>, max_sge: u32) -> Result<()> {
    let n = wr.sg_list.len();
    if n > max_sge as usize {
        return Err(VerbsError::BadWorkRequest {
            call,
            index,
            reason: format!("{n} SGEs, but the queue's max_sge is {max_sge}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{AccessFlags, Sge};

    fn init_attr() -> QpAttr {
        let mut a = QpAttr::new(QpState::Init);
        a.port_num = Some(1);
        a.pkey_index = Some(0);
        a.access = Some(AccessFlags::LOCAL_WRITE);
        a
    }

    #[test]
    fn transitions_follow_the_man_page() {
        assert_eq!(
            check_modify("m", 1, QpState::Reset, &init_attr()).unwrap(),
            mask::STATE | mask::PKEY | mask::PORT | mask::ACCESS
        );
        let mut a = init_attr();
        a.pkey_index = None;
        let e = check_modify("m", 1, QpState::Reset, &a).unwrap_err().to_string();
        assert!(e.contains("missing attribute(s): pkey_index (IBV_QP_PKEY_INDEX)"), "{e}");
        a.pkey_index = Some(0);
        a.sq_psn = Some(0);
        let e = check_modify("m", 1, QpState::Reset, &a).unwrap_err().to_string();
        assert!(e.contains("not allowed in this transition: sq_psn"), "{e}");
        let e = check_modify("m", 1, QpState::Init, &QpAttr::new(QpState::Rts)).unwrap_err().to_string();
        assert!(e.contains("not allowed by the QP state machine"), "{e}");
        assert!(check_modify("m", 1, QpState::Rts, &QpAttr::new(QpState::Err)).is_ok());
        assert!(check_modify("m", 1, QpState::Err, &QpAttr::new(QpState::Reset)).is_ok());
        let mut rts = QpAttr::new(QpState::Rts);
        rts.min_rnr_timer = Some(32);
        assert!(check_modify("m", 1, QpState::Rts, &rts).is_err(), "5-bit codes");
        let mut err = QpAttr::new(QpState::Err);
        err.sq_psn = Some(1 << 24);
        assert!(check_modify("m", 1, QpState::Rts, &err).is_err(), "24-bit PSNs");
        err.sq_psn = None;
        err.rnr_retry = Some(8);
        assert!(check_modify("m", 1, QpState::Rts, &err).is_err(), "3-bit retry counts");
    }

    #[test]
    fn posting_states() {
        for (s, send, recv) in [
            (QpState::Reset, false, false),
            (QpState::Init, false, true),
            (QpState::Rtr, false, true),
            (QpState::Rts, true, true),
        ] {
            for e in [InErr::Flush, InErr::Refuse] {
                assert_eq!(check_send_state(1, s, e).is_ok(), send, "{s:?}");
                assert_eq!(check_recv_state(1, s, e).is_ok(), recv, "{s:?}");
            }
        }
        assert!(check_send_state(1, QpState::Err, InErr::Flush).is_ok());
        assert!(check_recv_state(1, QpState::Err, InErr::Flush).is_ok());
        assert!(check_send_state(1, QpState::Err, InErr::Refuse).is_err());
        assert!(check_recv_state(1, QpState::Err, InErr::Refuse).is_err());
    }

    #[test]
    fn send_wr_checks() {
        let lim = SendLimits { max_sge: 2, max_inline: 8 };
        let sge = |length| Sge { addr: 0, length, lkey: 0 };
        let wr = |op, flags, sg_list| SendWr { wr_id: 0, op, flags, sg_list };
        let three = [sge(1), sge(1), sge(1)];
        let reason = |r: Result<()>| match r {
            Err(VerbsError::BadWorkRequest { index: 4, reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(reason(check_send_wr(4, &wr(SendOp::Send, SendFlags::EMPTY, &three), lim)).contains("3 SGEs"));
        assert!(check_send_wr(4, &wr(SendOp::Send, SendFlags::INLINE, &three[..2]), lim).is_ok());
        let big = [sge(9)];
        assert!(reason(check_send_wr(4, &wr(SendOp::Send, SendFlags::INLINE, &big), lim))
            .contains("9 bytes inline"));
        assert!(check_send_wr(4, &wr(SendOp::Send, SendFlags::EMPTY, &big), lim).is_ok());
        let read = SendOp::RdmaRead { remote_addr: 0, rkey: 0 };
        assert!(reason(check_send_wr(4, &wr(read, SendFlags::INLINE, &[]), lim)).contains("cannot be INLINE"));
        let inv = SendOp::LocalInv { rkey: 0 };
        assert!(reason(check_send_wr(4, &wr(inv, SendFlags::EMPTY, &big), lim)).contains("take no SGEs"));
        assert!(check_send_wr(4, &wr(inv, SendFlags::EMPTY, &[]), lim).is_ok());
    }
}
