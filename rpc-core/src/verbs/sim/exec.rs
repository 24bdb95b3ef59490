//! The data path: what the NIC does with one send WQE, executed by the requester's thread (in
//! `post_send` when nothing is queued ahead, otherwise by whoever progresses the send queue).
//!
//! Order of checks, as a real RC NIC sees them: the local gather list (lkeys: LOC_PROT_ERR;
//! size: LOC_LEN_ERR), then the network (peer reachable, in RTR/RTS, PSN as expected; otherwise
//! the packet is lost and retried after the ACK timeout), then the responder's checks (QP access
//! flags, rkey, receive WQE available, receive buffer large enough), then the copy and the
//! completions. A responder-side failure also moves the responder QP to ERR, as rxe does
//! (`do_class_ac_error` in `rxe_resp.c`).

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

use super::fabric::fabric;
use super::mr::KeyFault;
use super::peer::PeerQp;
use super::qp::{Link, QpCore, StallKind, ST_RTR, ST_RTS};
use super::ring::ld;
use super::srq::{pop_recv_id, rq_sge};
use super::MAX_SGE;
use crate::verbs::{racy, AccessFlags, SendFlags, SendOp, Sge, WcOpcode, WcStatus, WorkCompletion};

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
    /// The operation, where the WR or the queued WQE holds it (not copied).
    pub(crate) op: &'a SendOp,
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

/// A transfer named memory of another process's host past this process's mapping of it.
pub(crate) struct Remap;

type Seg = (*mut u8, usize);

/// [`copy_segs`] for a SEND: from the requester's gather list (a send buffer, which its owner
/// does not write while the WR is posted) into the responder's posted receive buffer (which its
/// owner does not read until the completion is polled), both reserved to this transfer by the
/// `post_send`/`post_recv` contracts (no peer reaches a receive buffer but by SEND). Plain copies,
/// small ones inline.
///
/// # Safety
/// Every segment must be valid for its length (reads for `src`, writes for `dst`) and no other
/// thread may access the `dst` bytes, nor write the `src` bytes, meanwhile (the verbs ownership
/// contract).
#[inline(always)]
unsafe fn send_copy_segs(src: &[Seg], dst: &[Seg]) {
    if let ([(s, sn)], [(d, dn)]) = (src, dst) {
        let n = (*sn).min(*dn);
        let (s, d) = (*s as *const u8, *d);
        let disjoint = (s as usize + n <= d as usize) || (d as usize + n <= s as usize);
        if n <= 128 && disjoint {
            // Small messages: inline word copies instead of a call into memmove (and, inlined
            // into the transfer, instead of a call at all).
            // SAFETY: both ranges are valid for `n` bytes (caller's contract) and disjoint.
            unsafe { copy_small(s, d, n) };
            return;
        }
    }
    // SAFETY: the caller's contract is the same.
    unsafe { send_copy_segs_loop(src, dst) }
}

/// [`send_copy_segs`] of anything but one small segment to one: segment by segment, through
/// memmove.
///
/// # Safety
/// As [`send_copy_segs`].
#[inline(never)]
unsafe fn send_copy_segs_loop(src: &[Seg], dst: &[Seg]) {
    // SAFETY: the caller's contract; `ptr::copy` allows overlap (a QP may send to itself within
    // one MR).
    unsafe { segs_loop(src, dst, std::ptr::copy::<u8>) }
}

/// Copies `n <= 128` bytes with at most two (overlapping) loads and stores per size class, as
/// small-size memcpy does, instead of a call.
///
/// # Safety
/// `s` valid for reads and `d` for writes of `n` bytes; the ranges do not overlap.
#[inline(always)]
unsafe fn copy_small(s: *const u8, d: *mut u8, n: usize) {
    #[inline(always)]
    unsafe fn two<T: Copy>(s: *const u8, d: *mut u8, n: usize) {
        let k = std::mem::size_of::<T>();
        // SAFETY: `k <= n <= 2k` (callers' size classes), so `[0, k)` and `[n - k, n)` lie in
        // both ranges; unaligned accesses are allowed; both loads happen before the stores.
        unsafe {
            let a = (s as *const T).read_unaligned();
            let b = (s.add(n - k) as *const T).read_unaligned();
            (d as *mut T).write_unaligned(a);
            (d.add(n - k) as *mut T).write_unaligned(b);
        }
    }
    /// Copies `16 * K` bytes as `K` 16-byte lanes held in registers (an array type would be
    /// moved through the stack).
    #[inline(always)]
    unsafe fn lanes<const K: usize>(s: *const u8, d: *mut u8) {
        let mut v = [0u128; K];
        for (i, x) in v.iter_mut().enumerate() {
            // SAFETY: the callers' ranges hold `16 * K` bytes at `s` and `d`.
            *x = unsafe { (s.add(16 * i) as *const u128).read_unaligned() };
        }
        for (i, x) in v.iter().enumerate() {
            // SAFETY: as above.
            unsafe { (d.add(16 * i) as *mut u128).write_unaligned(*x) };
        }
    }
    // SAFETY: in every branch the size class satisfies `two`'s bound (`n <= 128`: the caller's),
    // in the first `64 <= n`, so `[0, 64)` and `[n - 64, n)` lie in both ranges, and in the
    // second `32 <= n`, so `[0, 32)` and `[n - 32, n)` do (disjoint, as the caller promised, so
    // the order of the loads and stores does not matter).
    unsafe {
        // Largest class first: a small RPC's SEND (header and body) is 64 to 128 bytes.
        if n >= 64 {
            // The ranges are disjoint: the head's 64 bytes, then the tail's (overlapping the
            // head's when `n < 128`), so that no more than four vectors are live at once.
            lanes::<4>(s, d);
            lanes::<4>(s.add(n - 64), d.add(n - 64));
        } else if n >= 32 {
            // Disjoint as well: the head's 32 bytes, then the tail's.
            lanes::<2>(s, d);
            lanes::<2>(s.add(n - 32), d.add(n - 32));
        } else if n >= 16 {
            two::<u128>(s, d, n)
        } else if n >= 8 {
            two::<u64>(s, d, n)
        } else if n >= 4 {
            two::<u32>(s, d, n)
        } else if n >= 2 {
            two::<u16>(s, d, n)
        } else if n == 1 {
            *d = *s
        }
    }
}

/// Copies the bytes of `src` into `dst` in order, as far as both reach, with atomic loads and
/// stores only ([`crate::verbs::racy::copy`]), for RDMA WRITE and READ: the source may be a ring
/// a peer rewrites, the destination a ring its owner copies out of, at the same time. A racing access makes the
/// copied bytes a mix, never a data race.
///
/// # Safety
/// Every segment must be valid for its length (reads for `src`, writes for `dst`); every other
/// access to them meanwhile is atomic (the verbs ownership contract keeps non-atomic views of
/// registered memory away from ranges a posted WR or a peer may access).
#[inline(always)]
unsafe fn copy_segs(src: &[Seg], dst: &[Seg]) {
    if let ([(s, sn)], [(d, dn)]) = (src, dst) {
        // The usual case: one segment to one.
        // SAFETY: both ranges are valid for `min(sn, dn)` bytes (caller's contract).
        unsafe { racy::copy(*s as *const u8, *d, (*sn).min(*dn)) };
        return;
    }
    // SAFETY: the caller's contract is the same.
    unsafe { copy_segs_loop(src, dst) }
}

/// [`copy_segs`] of anything but one segment to one: segment by segment.
///
/// # Safety
/// As [`copy_segs`].
#[inline(never)]
unsafe fn copy_segs_loop(src: &[Seg], dst: &[Seg]) {
    // SAFETY: the caller's contract; `racy::copy` allows overlap (a QP may send to itself within
    // one MR).
    unsafe { segs_loop(src, dst, racy::copy) }
}

/// Walks `src` and `dst` segment by segment, handing each run both have room for to `copy`
/// (source, destination, bytes).
///
/// # Safety
/// Every segment of `src` is valid for reads and of `dst` for writes of its length; `copy` must
/// be sound for any two such ranges, which may overlap.
#[inline(always)]
unsafe fn segs_loop(src: &[Seg], dst: &[Seg], copy: unsafe fn(*const u8, *mut u8, usize)) {
    let (mut si, mut so, mut di, mut doff) = (0, 0, 0, 0);
    while si < src.len() && di < dst.len() {
        let n = (src[si].1 - so).min(dst[di].1 - doff);
        // SAFETY: both ranges are inside valid segments (caller's contract), which `copy` takes
        // whether they overlap or not (caller's contract).
        unsafe { copy(src[si].0.add(so), dst[di].0.add(doff), n) };
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
    /// One attempt at executing `v`. Inlined into the post fast path (a small RPC's SEND runs
    /// there: the view's fields stay in registers and the outcome is not returned through
    /// memory); the queued path calls [`QpCore::exec_queued`].
    #[inline(always)]
    pub(crate) fn exec(&self, link: &mut Link, v: &WqeView<'_>) -> Outcome {
        if let Some(done) = self.exec_mw(v.op) {
            return done; // bind / local invalidate: no packet, no peer (see `super::mw`)
        }
        match self.exec_mapped(link, v) {
            Ok(o) => o,
            Err(Remap) => self.exec_remapped(link, v),
        }
    }

    /// [`QpCore::exec`] out of line, for WQEs executed from the send queue (after a stall, or
    /// behind one).
    #[inline(never)]
    pub(crate) fn exec_queued(&self, link: &mut Link, v: &WqeView<'_>) -> Outcome {
        self.exec(link, v)
    }

    /// The responder's segment (another process's) grew past this process's mapping of it:
    /// resolves the peer again, which maps the segment afresh at its current size, and retries
    /// once. Nothing was changed by the first attempt. Out of line: rare.
    #[cold]
    #[inline(never)]
    fn exec_remapped(&self, link: &mut Link, v: &WqeView<'_>) -> Outcome {
        link.peer = None;
        self.exec_mapped(link, v).unwrap_or(Outcome::Stall(StallKind::Lost))
    }

    /// [`QpCore::exec`] with the responder's segment as mapped now; `Err(Remap)` (before any
    /// effect) when something it names lies past the mapping.
    #[inline(always)]
    fn exec_mapped(&self, link: &mut Link, v: &WqeView<'_>) -> Result<Outcome, Remap> {
        let is_read = matches!(*v.op, SendOp::RdmaRead { .. });
        let need = if is_read { AccessFlags::LOCAL_WRITE } else { AccessFlags::EMPTY };
        let mut segs: [MaybeUninit<Seg>; MAX_SGE] = [MaybeUninit::uninit(); MAX_SGE];
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
                            segs[n].write((p, s.length as usize));
                            n += 1;
                            len += s.length as u64;
                        }
                        Err(_) => return Ok(Outcome::Fail(WcStatus::IBV_WC_LOC_PROT_ERR)),
                    }
                }
                // Only a gather list can exceed the largest message: inline payloads are at
                // most `max_inline_data` (checked at post time, at most `MAX_INLINE`).
                if len > MAX_MSG {
                    return Ok(Outcome::Fail(WcStatus::IBV_WC_LOC_LEN_ERR));
                }
            }
            Src::Inline(bytes) => {
                if !bytes.is_empty() {
                    segs[0].write((bytes.as_ptr() as *mut u8, bytes.len()));
                    n = 1;
                    len = bytes.len() as u64;
                }
            }
            // The usual inline SEND: one buffer, without a loop's set-up.
            Src::Raw([s]) => {
                if s.length > 0 {
                    segs[0].write((s.addr as *mut u8, s.length as usize));
                    n = 1;
                    len = s.length as u64;
                }
            }
            Src::Raw(sges) => {
                // At most `MAX_SGE` (checked at post time: `max_send_sge` is capped by it).
                for s in sges.iter().take(MAX_SGE) {
                    if s.length > 0 {
                        segs[n].write((s.addr as *mut u8, s.length as usize));
                        n += 1;
                        len += s.length as u64;
                    }
                }
            }
        }
        // SAFETY: the first `n` entries of `segs` were written above.
        let segs = unsafe { std::slice::from_raw_parts(segs.as_ptr() as *const Seg, n) };

        // The network.
        if self.sh().resp.drop_traffic.load(Ordering::Relaxed) || !self.host.is_alive() {
            return Ok(Outcome::Stall(StallKind::Lost));
        }
        if link.peer.is_none() {
            let Some(dest) = link.dest else {
                return Ok(Outcome::Stall(StallKind::Lost));
            };
            match fabric().resolve(&dest) {
                Some(p) => link.peer = Some(p),
                None => return Ok(Outcome::Stall(StallKind::Lost)),
            }
        }
        let Some(peer) = link.peer.as_ref() else {
            return Ok(Outcome::Stall(StallKind::Lost));
        };
        // From here to the end of the transfer, a responder host of another process waits for
        // us before reusing anything we may find (keys, QP state, rings, MR memory).
        let _pin = peer.pin();
        if !peer.reachable() {
            return Ok(Outcome::Stall(StallKind::Lost));
        }
        let pst = peer.state_raw();
        if (pst != ST_RTR && pst != ST_RTS) || peer.sh().epsn.load(Ordering::Relaxed) != link.psn {
            return Ok(Outcome::Stall(StallKind::Lost));
        }
        // Path MTUs are powers of two: a shift, not a division.
        let shift = link.mtu.trailing_zeros();
        let npkts = ((len + link.mtu as u64 - 1) >> shift).max(1) as u32;
        let next_psn = link.psn.wrapping_add(npkts) & 0x00ff_ffff;
        let solicited = v.flags.contains(SendFlags::SOLICITED);

        // The responder.
        match *v.op {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                let pd = peer.recv_pd;
                let mut dst: [MaybeUninit<Seg>; MAX_SGE] = [MaybeUninit::uninit(); MAX_SGE];
                let mut dn;
                // The oldest receive WQE, checked in place and then taken; one naming memory past
                // our mapping is left in place (`Remap`). Another executor may take it between
                // the check and `take` (an SRQ has many requesters): look again then.
                let (recv_wr_id, room) = loop {
                    let Some((pos, w)) = peer.ring.peek_claimed() else {
                        return Ok(Outcome::Stall(StallKind::Rnr));
                    };
                    let wr_id = ld(&w[0]);
                    let nsge = (ld(&w[1]) as usize).min(MAX_SGE);
                    dn = 0;
                    let (mut room, mut bad_key) = (0u64, false);
                    for i in 0..nsge {
                        let s = rq_sge(w, i);
                        if s.length == 0 {
                            continue;
                        }
                        match peer.mrs.resolve(s.lkey, pd, s.addr, s.length, AccessFlags::LOCAL_WRITE) {
                            Ok(p) => {
                                dst[dn].write((p, s.length as usize));
                                dn += 1;
                                room += s.length as u64;
                            }
                            Err(KeyFault::Beyond) => return Err(Remap),
                            Err(_) => {
                                bad_key = true;
                                break;
                            }
                        }
                    }
                    if peer.ring.take(pos) {
                        break (wr_id, (!bad_key).then_some(room));
                    }
                };
                let Some(room) = room else {
                    self.responder_fault(peer, Some(recv_wr_id), WcStatus::IBV_WC_LOC_PROT_ERR);
                    return Ok(Outcome::Fail(WcStatus::IBV_WC_REM_OP_ERR));
                };
                if room < len {
                    self.responder_fault(peer, Some(recv_wr_id), WcStatus::IBV_WC_LOC_LEN_ERR);
                    return Ok(Outcome::Fail(WcStatus::IBV_WC_REM_INV_REQ_ERR));
                }
                let invalidated = match *v.op {
                    SendOp::SendWithInv { invalidate_rkey } => {
                        // Before the receive CQE: once it is polled, the rkey is dead.
                        if !peer.mrs.remote_invalidate(invalidate_rkey, peer.pd, peer.qpn) {
                            self.responder_fault(peer, Some(recv_wr_id), WcStatus::IBV_WC_REM_INV_REQ_ERR);
                            return Ok(Outcome::Fail(WcStatus::IBV_WC_REM_INV_REQ_ERR));
                        }
                        Some(invalidate_rkey)
                    }
                    _ => None,
                };
                // SAFETY: the first `dn` entries of `dst` were written above.
                let dst = unsafe { std::slice::from_raw_parts(dst.as_ptr() as *const Seg, dn) };
                let cqe = peer.cq.claim();
                // SAFETY: `segs` were resolved against live MRs (or are inline bytes / the
                // caller's inline buffers valid during the post), `dst` against the responder's
                // live MRs with LOCAL_WRITE; MRs cannot be deregistered while we hold our guard
                // (quiescence), and the receive buffer belongs to the NIC until its CQE is polled.
                unsafe { send_copy_segs(segs, dst) };
                peer.sh().epsn.store(next_psn, Ordering::Relaxed);
                link.psn = next_psn;
                let imm = match *v.op {
                    SendOp::SendWithImm { imm } => Some(imm),
                    _ => None,
                };
                peer.cq.publish(
                    cqe,
                    WorkCompletion {
                        wr_id: recv_wr_id,
                        status: WcStatus::IBV_WC_SUCCESS,
                        opcode: WcOpcode::IBV_WC_RECV,
                        byte_len: len as u32,
                        imm_data: imm,
                        qp_num: peer.qpn,
                        src_qp: self.qpn,
                        vendor_err: 0,
                        invalidated_rkey: invalidated,
                    },
                    solicited,
                );
                peer.ring.prefetch_next();
                Ok(Outcome::Done(len))
            }
            SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaWriteWithImm { remote_addr, rkey, .. } => {
                let qp_access = AccessFlags(peer.sh().resp.access.load(Ordering::Relaxed));
                if !qp_access.contains(AccessFlags::REMOTE_WRITE) {
                    self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_QP_OP_ERR);
                    return Ok(Outcome::Fail(WcStatus::IBV_WC_REM_INV_REQ_ERR));
                }
                let target = if len == 0 {
                    std::ptr::null_mut()
                } else {
                    match peer.mrs.resolve_rkey(
                        rkey,
                        peer.pd,
                        peer.qpn,
                        remote_addr,
                        len as u32,
                        AccessFlags::REMOTE_WRITE,
                    ) {
                        Ok(p) => p,
                        Err(KeyFault::Beyond) => return Err(Remap),
                        Err(_) => {
                            self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_PROT_ERR);
                            return Ok(Outcome::Fail(WcStatus::IBV_WC_REM_ACCESS_ERR));
                        }
                    }
                };
                let recv = match *v.op {
                    SendOp::RdmaWriteWithImm { imm, .. } => match pop_recv_id(&peer.ring) {
                        Some(wr_id) => Some((wr_id, imm, peer.cq.claim())),
                        None => return Ok(Outcome::Stall(StallKind::Rnr)),
                    },
                    _ => None,
                };
                if len > 0 {
                    // SAFETY: as for SEND; `target..target+len` was bounds- and access-checked
                    // against the responder's MR under its rkey.
                    unsafe { copy_segs(segs, &[(target, len as usize)]) };
                }
                peer.sh().epsn.store(next_psn, Ordering::Relaxed);
                link.psn = next_psn;
                if let Some((wr_id, imm, cqe)) = recv {
                    peer.cq.publish(
                        cqe,
                        WorkCompletion {
                            wr_id,
                            status: WcStatus::IBV_WC_SUCCESS,
                            opcode: WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM,
                            byte_len: len as u32,
                            imm_data: Some(imm),
                            qp_num: peer.qpn,
                            src_qp: self.qpn,
                            vendor_err: 0,
                            invalidated_rkey: None,
                        },
                        solicited,
                    );
                }
                Ok(Outcome::Done(len))
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                let qp_access = AccessFlags(peer.sh().resp.access.load(Ordering::Relaxed));
                if !qp_access.contains(AccessFlags::REMOTE_READ) {
                    self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_QP_OP_ERR);
                    return Ok(Outcome::Fail(WcStatus::IBV_WC_REM_INV_REQ_ERR));
                }
                if len > 0 {
                    let source = match peer.mrs.resolve_rkey(
                        rkey,
                        peer.pd,
                        peer.qpn,
                        remote_addr,
                        len as u32,
                        AccessFlags::REMOTE_READ,
                    ) {
                        Ok(p) => p,
                        Err(KeyFault::Beyond) => return Err(Remap),
                        Err(_) => {
                            self.responder_fault(peer, None, WcStatus::IBV_WC_LOC_PROT_ERR);
                            return Ok(Outcome::Fail(WcStatus::IBV_WC_REM_ACCESS_ERR));
                        }
                    };
                    // SAFETY: the source range was checked against the responder's MR (REMOTE_READ),
                    // the local scatter list against our MRs with LOCAL_WRITE; see SEND.
                    unsafe { copy_segs(&[(source, len as usize)], segs) };
                }
                peer.sh().epsn.store(next_psn, Ordering::Relaxed);
                link.psn = next_psn;
                Ok(Outcome::Done(len))
            }
            // Executed by `exec_mw` above.
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => {
                Ok(Outcome::Fail(WcStatus::IBV_WC_LOC_QP_OP_ERR))
            }
        }
    }

    /// The responder detected an error: its receive WQE (if one was consumed) completes with
    /// `status` and the responder QP goes to ERR (class A/C responder errors).
    fn responder_fault(&self, peer: &PeerQp, recv_wr_id: Option<u64>, status: WcStatus) {
        tracing::debug!(qp = peer.qpn, ?status, "sim: responder error, QP -> ERR");
        if let Some(wr_id) = recv_wr_id {
            peer.cq.push(
                WorkCompletion {
                    status,
                    src_qp: self.qpn,
                    ..super::qp::flush_wc(wr_id, WcOpcode::IBV_WC_RECV, peer.qpn)
                },
                true,
            );
        }
        peer.set_error();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_segs_small_and_split_sizes() {
        for n in 0..=200usize {
            let src: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0xaau8; n + 8];
            // SAFETY: both buffers are live and at least `n` bytes long, and disjoint.
            unsafe { copy_segs(&[(src.as_ptr() as *mut u8, n)], &[(dst.as_mut_ptr(), n)]) };
            assert_eq!(&dst[..n], &src[..], "{n} bytes");
            assert!(dst[n..].iter().all(|&b| b == 0xaa), "nothing past {n} bytes");
            let mut dst2 = vec![0xaau8; n + 8];
            // SAFETY: as above.
            unsafe { send_copy_segs(&[(src.as_ptr() as *mut u8, n)], &[(dst2.as_mut_ptr(), n)]) };
            assert_eq!(dst2, dst, "a SEND's copy is the same, {n} bytes");
            // Scattered into three pieces.
            let mut out = vec![0u8; n + 2];
            let (a, rest) = out.split_at_mut(n / 3);
            let (b, c) = rest.split_at_mut(n / 3 + 1);
            let segs = [(a.as_mut_ptr(), a.len()), (b.as_mut_ptr(), b.len()), (c.as_mut_ptr(), c.len())];
            // SAFETY: as above; the destination pieces are disjoint and cover `n + 2` bytes.
            unsafe { copy_segs(&[(src.as_ptr() as *mut u8, n)], &segs) };
            assert_eq!(&out[..n], &src[..], "{n} bytes scattered");
        }
    }
}
