//! The data path: what the NIC does with one send WQE, executed by the requester's thread (in
//! `post_send` when nothing is queued ahead, otherwise by whoever progresses the send queue).
//!
//! Order of checks, as a real RC NIC sees them: the local gather list (lkeys: LOC_PROT_ERR;
//! size: LOC_LEN_ERR), then the network (peer reachable, in RTR/RTS, PSN as expected; otherwise
//! the packet is lost and retried after the ACK timeout), then the responder's checks (QP access
//! flags, rkey, receive WQE available, receive buffer large enough), then the copy and the
//! completions. A responder-side failure also moves the responder QP to ERR, as rxe does
//! (`do_class_ac_error` in `rxe_resp.c`).

use std::sync::atomic::Ordering;

use super::fabric::fabric;
use super::qp::{Link, QpCore, StallKind, ST_RTR, ST_RTS};
use super::srq::take_recv;
use super::MAX_SGE;
use crate::verbs::{AccessFlags, SendFlags, SendOp, Sge, WcOpcode, WcStatus, WorkCompletion};

/// Largest message, in bytes (2^31, the IB limit).
const MAX_MSG: u64 = 1 << 31;

/// Where a WQE's payload is.
pub(crate) enum Src<'a> {
    /// Gather list in registered memory (lkeys checked).
    Sges(&'a [Sge]),
    /// Inline bytes already copied into the QP.
    Inline(&'a [u8]),
    /// Inline WR executed at post time: the caller's raw buffers, valid during `post_send`.
    Raw(&'a [Sge]),
}

/// A send WQE as the executor sees it.
pub(crate) struct WqeView<'a> {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) flags: SendFlags,
    pub(crate) src: Src<'a>,
}

/// The result of one attempt.
pub(crate) enum Outcome {
    /// Delivered; the message length in bytes.
    Done(u64),
    /// Not delivered, nothing changed; retry later.
    Stall(StallKind),
    /// Failed with this requester status (responder side already handled).
    Fail(WcStatus),
}

type Seg = (*mut u8, usize);

/// Copies the bytes of `src` into `dst` in order, as far as both reach.
///
/// # Safety
/// Every segment must be valid for its length (reads for `src`, writes for `dst`) and no other
/// thread may access the `dst` bytes meanwhile (the verbs ownership contract).
#[inline]
unsafe fn copy_segs(src: &[Seg], dst: &[Seg]) {
    let (mut si, mut so, mut di, mut doff) = (0, 0, 0, 0);
    while si < src.len() && di < dst.len() {
        let n = (src[si].1 - so).min(dst[di].1 - doff);
        // SAFETY: both ranges are inside valid segments (caller's contract); `copy` allows
        // overlap (a QP may send to itself within one MR).
        unsafe { std::ptr::copy(src[si].0.add(so), dst[di].0.add(doff), n) };
        so += n;
        doff += n;
        if so == src[si].1 {
            si += 1;
            so = 0;
        }
        if doff == dst[di].1 {
            di += 1;
            doff = 0;
        }
    }
}

impl QpCore {
    /// One attempt at executing `v`.
    #[inline]
    pub(crate) fn exec(&self, link: &mut Link, v: &WqeView<'_>) -> Outcome {
        let is_read = matches!(v.op, SendOp::RdmaRead { .. });
        let need = if is_read { AccessFlags::LOCAL_WRITE } else { AccessFlags::EMPTY };
        let mut segs: [Seg; MAX_SGE] = [(std::ptr::null_mut(), 0); MAX_SGE];
        let mut n = 0;
        let mut len = 0u64;
        match v.src {
            Src::Sges(sges) => {
                for s in sges {
                    if s.length == 0 {
                        continue;
                    }
                    match self.host.mrs.resolve(s.lkey, self.pd, s.addr, s.length, need) {
                        Ok(p) => {
                            segs[n] = (p, s.length as usize);
                            n += 1;
                            len += s.length as u64;
                        }
                        Err(_) => return Outcome::Fail(WcStatus::IBV_WC_LOC_PROT_ERR),
                    }
                }
            }
            Src::Inline(bytes) => {
                if !bytes.is_empty() {
                    segs[0] = (bytes.as_ptr() as *mut u8, bytes.len());
                    n = 1;
                    len = bytes.len() as u64;
                }
            }
            Src::Raw(sges) => {
                for s in sges.iter().filter(|s| s.length > 0) {
                    segs[n] = (s.addr as *mut u8, s.length as usize);
                    n += 1;
                    len += s.length as u64;
                }
            }
        }
        let segs = &segs[..n];
        if len > MAX_MSG {
            return Outcome::Fail(WcStatus::IBV_WC_LOC_LEN_ERR);
        }

        // The network.
        if self.drop_traffic.load(Ordering::Relaxed) || !self.host.is_alive() {
            return Outcome::Stall(StallKind::Lost);
        }
        if link.peer.is_none() {
            let Some(dest) = link.dest else {
                return Outcome::Stall(StallKind::Lost);
            };
            match fabric().resolve(&dest) {
                Some(p) => link.peer = Some(p),
                None => return Outcome::Stall(StallKind::Lost),
            }
        }
        let Some(peer) = link.peer.as_deref() else {
            return Outcome::Stall(StallKind::Lost);
        };
        if peer.destroyed.load(Ordering::Relaxed)
            || !peer.host.is_alive()
            || peer.drop_traffic.load(Ordering::Relaxed)
        {
            return Outcome::Stall(StallKind::Lost);
        }
        let pst = peer.state_raw();
        if (pst != ST_RTR && pst != ST_RTS) || peer.epsn.load(Ordering::Relaxed) != link.psn {
            return Outcome::Stall(StallKind::Lost);
        }
        let npkts = len.div_ceil(link.mtu as u64).max(1) as u32;
        let next_psn = link.psn.wrapping_add(npkts) & 0x00ff_ffff;
        let solicited = v.flags.contains(SendFlags::SOLICITED);

        // The responder.
        match v.op {
            SendOp::Send | SendOp::SendWithImm { .. } => {
                let Some(r) = take_recv(peer.recv_ring()) else {
                    return Outcome::Stall(StallKind::Rnr);
                };
                let pd = peer.recv_pd();
                let mut dst: [Seg; MAX_SGE] = [(std::ptr::null_mut(), 0); MAX_SGE];
                let mut dn = 0;
                let mut room = 0u64;
                for s in &r.sges[..r.nsge] {
                    if s.length == 0 {
                        continue;
                    }
                    match peer.host.mrs.resolve(s.lkey, pd, s.addr, s.length, AccessFlags::LOCAL_WRITE) {
                        Ok(p) => {
                            dst[dn] = (p, s.length as usize);
                            dn += 1;
                            room += s.length as u64;
                        }
                        Err(_) => {
                            self.responder_fault(peer, Some(r.wr_id), WcStatus::IBV_WC_LOC_PROT_ERR);
                            return Outcome::Fail(WcStatus::IBV_WC_REM_OP_ERR);
                        }
                    }
                }
                if room < len {
                    self.responder_fault(peer, Some(r.wr_id), WcStatus::IBV_WC_LOC_LEN_ERR);
                    return Outcome::Fail(WcStatus::IBV_WC_REM_INV_REQ_ERR);
                }
                // SAFETY: `segs` were resolved against live MRs (or are inline bytes / the
                // caller's inline buffers valid during the post), `dst` against the responder's
                // live MRs with LOCAL_WRITE; MRs cannot be deregistered while we hold our guard
                // (quiescence), and the receive buffer belongs to the NIC until its CQE is polled.
                unsafe { copy_segs(segs, &dst[..dn]) };
                peer.epsn.store(next_psn, Ordering::Relaxed);
                link.psn = next_psn;
                let imm = match v.op {
                    SendOp::SendWithImm { imm } => Some(imm),
                    _ => None,
                };
                peer.recv_cq.push(
                    WorkCompletion {
                        wr_id: r.wr_id,
                        status: WcStatus::IBV_WC_SUCCESS,
                        opcode: WcOpcode::IBV_WC_RECV,
                        byte_len: len as u32,
                        imm_data: imm,
                        qp_num: peer.qpn,
                        src_qp: self.qpn,
                        vendor_err: 0,
                    },
                    solicited,
                );
                Outcome::Done(len)
            }
            SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaWriteWithImm { remote_addr, rkey, .. } => {
                let qp_access = AccessFlags(peer.resp.access.load(Ordering::Relaxed));
                if !qp_access.contains(AccessFlags::REMOTE_WRITE) {
                    self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_QP_OP_ERR);
                    return Outcome::Fail(WcStatus::IBV_WC_REM_INV_REQ_ERR);
                }
                let target = if len == 0 {
                    std::ptr::null_mut()
                } else {
                    match peer.host.mrs.resolve(
                        rkey,
                        peer.pd,
                        remote_addr,
                        len as u32,
                        AccessFlags::REMOTE_WRITE,
                    ) {
                        Ok(p) => p,
                        Err(_) => {
                            self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_PROT_ERR);
                            return Outcome::Fail(WcStatus::IBV_WC_REM_ACCESS_ERR);
                        }
                    }
                };
                let recv = match v.op {
                    SendOp::RdmaWriteWithImm { imm, .. } => match take_recv(peer.recv_ring()) {
                        Some(r) => Some((r.wr_id, imm)),
                        None => return Outcome::Stall(StallKind::Rnr),
                    },
                    _ => None,
                };
                if len > 0 {
                    // SAFETY: as for SEND; `target..target+len` was bounds- and access-checked
                    // against the responder's MR under its rkey.
                    unsafe { copy_segs(segs, &[(target, len as usize)]) };
                }
                peer.epsn.store(next_psn, Ordering::Relaxed);
                link.psn = next_psn;
                if let Some((wr_id, imm)) = recv {
                    peer.recv_cq.push(
                        WorkCompletion {
                            wr_id,
                            status: WcStatus::IBV_WC_SUCCESS,
                            opcode: WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM,
                            byte_len: len as u32,
                            imm_data: Some(imm),
                            qp_num: peer.qpn,
                            src_qp: self.qpn,
                            vendor_err: 0,
                        },
                        solicited,
                    );
                }
                Outcome::Done(len)
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                let qp_access = AccessFlags(peer.resp.access.load(Ordering::Relaxed));
                if !qp_access.contains(AccessFlags::REMOTE_READ) {
                    self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_QP_OP_ERR);
                    return Outcome::Fail(WcStatus::IBV_WC_REM_INV_REQ_ERR);
                }
                if len > 0 {
                    let source = match peer.host.mrs.resolve(
                        rkey,
                        peer.pd,
                        remote_addr,
                        len as u32,
                        AccessFlags::REMOTE_READ,
                    ) {
                        Ok(p) => p,
                        Err(_) => {
                            self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_PROT_ERR);
                            return Outcome::Fail(WcStatus::IBV_WC_REM_ACCESS_ERR);
                        }
                    };
                    // SAFETY: the source range was checked against the responder's MR (REMOTE_READ),
                    // the local scatter list against our MRs with LOCAL_WRITE; see SEND.
                    unsafe { copy_segs(&[(source, len as usize)], segs) };
                }
                peer.epsn.store(next_psn, Ordering::Relaxed);
                link.psn = next_psn;
                Outcome::Done(len)
            }
        }
    }

    /// The responder detected an error: its receive WQE (if one was consumed) completes with
    /// `status` and the responder QP goes to ERR (class A/C responder errors).
    fn responder_fault(&self, peer: &QpCore, recv_wr_id: Option<u64>, status: WcStatus) {
        tracing::debug!(qp = peer.qpn, ?status, "sim: responder error, QP -> ERR");
        if let Some(wr_id) = recv_wr_id {
            peer.recv_cq.push(
                WorkCompletion {
                    wr_id,
                    status,
                    opcode: WcOpcode::IBV_WC_RECV,
                    byte_len: 0,
                    imm_data: None,
                    qp_num: peer.qpn,
                    src_qp: self.qpn,
                    vendor_err: 0,
                },
                true,
            );
        }
        peer.set_error();
    }
}
