//! Posting work requests: slices of [`SendWr`] / [`RecvWr`] become `ibv_send_wr` / `ibv_recv_wr`
//! chains built in fixed-size stack arrays, one doorbell (`ibv_post_*` call) per chunk. Nothing is
//! allocated on this path.

use std::mem::MaybeUninit;
use std::ptr;

use std::sync::atomic::Ordering;

use rdma_sys::{
    bind_mw_t, bind_mw_tso_union_t, ibv_mr, ibv_mw, ibv_mw_bind_info, ibv_recv_wr, ibv_send_wr, ibv_sge,
    ibv_wr_opcode, imm_data_invalidated_rkey_union_t, qp_type_t, rdma_t, tso_t, wr_t, xrc_t,
};

use super::errno::rc_error;
use crate::verbs::rules::{self, SendLimits};
use crate::verbs::{RecvWr, Result, SendOp, SendWr, VerbsError};

/// Work requests chained per doorbell; longer slices are posted in several chunks.
pub const POST_CHUNK_WRS: usize = 32;
/// Scatter/gather entries per chunk (a WR never spans two chunks).
pub const POST_CHUNK_SGES: usize = 256;
/// Work completions fetched per `ibv_poll_cq` call.
pub const POLL_CHUNK_WCS: usize = 32;

fn bad_wr(call: &'static str, index: usize, reason: String) -> VerbsError {
    VerbsError::BadWorkRequest { call, index, reason }
}

/// Explains a non-zero return of `ibv_post_*`.
fn post_error(call: &'static str, index: usize, rc: i32) -> VerbsError {
    let err = rc_error(rc);
    let hint = match err.raw_os_error() {
        Some(libc::ENOMEM) => "the work queue is full",
        Some(libc::EINVAL) => "invalid work request or QP state",
        _ => "rejected by the provider",
    };
    bad_wr(call, index, format!("{hint} ({err})"))
}

/// Index of `bad` within a chain starting at `base`, or 0 when it does not point into it.
fn chain_index<T>(base: *const T, bad: *const T, n: usize) -> usize {
    let off = (bad as usize).wrapping_sub(base as usize) / std::mem::size_of::<T>();
    if bad.is_null() || off >= n {
        0
    } else {
        off
    }
}

fn ibv_opcode(op: &SendOp) -> (ibv_wr_opcode::Type, u32, u64, u32) {
    match *op {
        SendOp::Send => (ibv_wr_opcode::IBV_WR_SEND, 0, 0, 0),
        SendOp::SendWithImm { imm } => (ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, imm.to_be(), 0, 0),
        SendOp::RdmaWrite { remote_addr, rkey } => (ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0, remote_addr, rkey),
        SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => {
            (ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, imm.to_be(), remote_addr, rkey)
        }
        SendOp::RdmaRead { remote_addr, rkey } => (ibv_wr_opcode::IBV_WR_RDMA_READ, 0, remote_addr, rkey),
        // The union word carries the rkey to invalidate (host order, not an immediate).
        SendOp::SendWithInv { invalidate_rkey } => {
            (ibv_wr_opcode::IBV_WR_SEND_WITH_INV, invalidate_rkey, 0, 0)
        }
        SendOp::LocalInv { rkey } => (ibv_wr_opcode::IBV_WR_LOCAL_INV, rkey, 0, 0),
        SendOp::BindMw { .. } => (ibv_wr_opcode::IBV_WR_BIND_MW, 0, 0, 0),
    }
}

/// The `bind_mw` / `tso` union of a send WR: the bind of a [`SendOp::BindMw`] (its handles are
/// the `ibv_mw` and `ibv_mr` pointers), zeroes otherwise.
fn bind_union(op: &SendOp) -> bind_mw_tso_union_t {
    match *op {
        SendOp::BindMw { mw, rkey, bind } => bind_mw_tso_union_t {
            bind_mw: bind_mw_t {
                mw: mw.0 as usize as *mut ibv_mw,
                rkey,
                bind_info: ibv_mw_bind_info {
                    mr: bind.mr.0 as usize as *mut ibv_mr,
                    addr: bind.addr,
                    length: bind.length,
                    mw_access_flags: bind.access.0,
                },
            },
        },
        _ => bind_mw_tso_union_t { tso: tso_t { hdr: ptr::null_mut(), hdr_sz: 0, mss: 0 } },
    }
}

/// After `ibv_post_send` accepted `wrs`: each bound window's `ibv_mw::rkey` becomes its new rkey
/// (what the next bind of it names, and [`MemoryWindow::rkey`](crate::verbs::MemoryWindow::rkey)
/// reads), as a consumer of type-2 windows must do.
///
/// # Safety
/// Every `BindMw` handle in `wrs` names a live window (`post_send`'s contract).
unsafe fn note_binds(wrs: &[SendWr<'_>]) {
    for wr in wrs {
        if let SendOp::BindMw { mw, rkey, .. } = wr.op {
            // SAFETY: a live window (caller).
            unsafe { super::mw::rkey_cell(mw.0 as usize as *mut ibv_mw) }.store(rkey, Ordering::Release);
        }
    }
}

/// Posts `wrs` in chunks through `post` (`ibv_post_send` on one QP).
///
/// # Safety
/// `post` must post to a live QP; the SGE memory contract of
/// [`QueuePair::post_send`](crate::verbs::QueuePair::post_send) holds.
pub(super) unsafe fn post_send_chain(
    wrs: &[SendWr<'_>],
    lim: SendLimits,
    mut post: impl FnMut(*mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32,
) -> Result<()> {
    let mut chain: [MaybeUninit<ibv_send_wr>; POST_CHUNK_WRS] =
        [const { MaybeUninit::uninit() }; POST_CHUNK_WRS];
    let mut sges: [MaybeUninit<ibv_sge>; POST_CHUNK_SGES] =
        [const { MaybeUninit::uninit() }; POST_CHUNK_SGES];
    // A WR never spans two chunks: no more SGEs than one chunk holds.
    let lim = SendLimits { max_sge: lim.max_sge.min(POST_CHUNK_SGES as u32), ..lim };
    let mut start = 0;
    while start < wrs.len() {
        let mut n = 0;
        let mut s = 0;
        let mut invalid = None;
        while n < POST_CHUNK_WRS && start + n < wrs.len() {
            let wr = &wrs[start + n];
            if let Err(e) = rules::check_send_wr(start + n, wr, lim) {
                invalid = Some(e);
                break;
            }
            let k = wr.sg_list.len();
            if s + k > POST_CHUNK_SGES {
                break; // the next chunk takes it
            }
            for (dst, src) in sges[s..s + k].iter_mut().zip(wr.sg_list) {
                dst.write(ibv_sge { addr: src.addr, length: src.length, lkey: src.lkey });
            }
            let sg_list = if k == 0 { ptr::null_mut() } else { sges[s].as_mut_ptr() };
            let (opcode, imm_be, remote_addr, rkey) = ibv_opcode(&wr.op);
            chain[n].write(ibv_send_wr {
                wr_id: wr.wr_id,
                next: ptr::null_mut(),
                sg_list,
                num_sge: k as i32,
                opcode,
                send_flags: wr.flags.0 & 0xf,
                imm_data_invalidated_rkey_union: imm_data_invalidated_rkey_union_t { imm_data: imm_be },
                wr: wr_t { rdma: rdma_t { remote_addr, rkey } },
                qp_type: qp_type_t { xrc: xrc_t { remote_srqn: 0 } },
                bind_mw_tso_union: bind_union(&wr.op),
            });
            s += k;
            n += 1;
        }
        if n > 0 {
            let base = chain[0].as_mut_ptr();
            for i in 0..n - 1 {
                let next = chain[i + 1].as_mut_ptr();
                // SAFETY: entries 0..n were initialised above; only the `next` link is set.
                unsafe { (*chain[i].as_mut_ptr()).next = next };
            }
            let mut bad: *mut ibv_send_wr = ptr::null_mut();
            // The chain and its SGEs live on this stack frame for the duration of the call.
            let rc = post(base, &mut bad);
            let posted = if rc != 0 { chain_index(base, bad, n) } else { n };
            // SAFETY: the windows of posted binds are live (caller's contract).
            unsafe { note_binds(&wrs[start..start + posted]) };
            if rc != 0 {
                return Err(post_error("ibv_post_send", start + posted, rc));
            }
        }
        start += n;
        if let Some(e) = invalid {
            return Err(e);
        }
    }
    Ok(())
}

/// Posts receive WRs in chunks through `post` (`ibv_post_recv` or `ibv_post_srq_recv`).
///
/// # Safety
/// `post` must post to a live QP or SRQ; the SGE memory contract of
/// [`SharedReceiveQueue::post_recv`](crate::verbs::SharedReceiveQueue::post_recv) holds.
pub(super) unsafe fn post_recv_chain(
    call: &'static str,
    wrs: &[RecvWr<'_>],
    max_sge: u32,
    mut post: impl FnMut(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> Result<()> {
    let mut chain: [MaybeUninit<ibv_recv_wr>; POST_CHUNK_WRS] =
        [const { MaybeUninit::uninit() }; POST_CHUNK_WRS];
    let mut sges: [MaybeUninit<ibv_sge>; POST_CHUNK_SGES] =
        [const { MaybeUninit::uninit() }; POST_CHUNK_SGES];
    let mut start = 0;
    while start < wrs.len() {
        let mut n = 0;
        let mut s = 0;
        let mut invalid = None;
        while n < POST_CHUNK_WRS && start + n < wrs.len() {
            let wr = &wrs[start + n];
            if let Err(e) = rules::check_recv_wr(call, start + n, wr, max_sge.min(POST_CHUNK_SGES as u32)) {
                invalid = Some(e);
                break;
            }
            let k = wr.sg_list.len();
            if s + k > POST_CHUNK_SGES {
                break;
            }
            for (dst, src) in sges[s..s + k].iter_mut().zip(wr.sg_list) {
                dst.write(ibv_sge { addr: src.addr, length: src.length, lkey: src.lkey });
            }
            let sg_list = if k == 0 { ptr::null_mut() } else { sges[s].as_mut_ptr() };
            chain[n].write(ibv_recv_wr {
                wr_id: wr.wr_id,
                next: ptr::null_mut(),
                sg_list,
                num_sge: k as i32,
            });
            s += k;
            n += 1;
        }
        if n > 0 {
            let base = chain[0].as_mut_ptr();
            for i in 0..n - 1 {
                let next = chain[i + 1].as_mut_ptr();
                // SAFETY: entries 0..n were initialised above; only the `next` link is set.
                unsafe { (*chain[i].as_mut_ptr()).next = next };
            }
            let mut bad: *mut ibv_recv_wr = ptr::null_mut();
            let rc = post(base, &mut bad);
            if rc != 0 {
                return Err(post_error(call, start + chain_index(base, bad, n), rc));
            }
        }
        start += n;
        if let Some(e) = invalid {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{SendFlags, Sge};

    const LIM: SendLimits = SendLimits { max_sge: 4, max_inline: 64 };

    /// Walks a posted chain and records (wr_id, opcode, num_sge, sge lengths, flags, imm).
    #[allow(clippy::type_complexity)]
    fn walk(head: *mut ibv_send_wr) -> Vec<(u64, u32, Vec<u32>, u32, u32)> {
        let mut out = Vec::new();
        let mut p = head;
        while !p.is_null() {
            // SAFETY: the chain built by `post_send_chain` is alive during the `post` callback.
            let w = unsafe { &*p };
            let lens = (0..w.num_sge as usize)
                // SAFETY: `sg_list` has `num_sge` initialised entries.
                .map(|i| unsafe { (*w.sg_list.add(i)).length })
                .collect();
            // SAFETY: reading the imm variant of a union written with it.
            out.push((
                w.wr_id,
                w.opcode,
                lens,
                w.send_flags,
                u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data }),
            ));
            p = w.next;
        }
        out
    }

    #[test]
    fn long_slices_post_in_chunks_with_one_call_each() {
        let sge = [Sge { addr: 0x1000, length: 8, lkey: 7 }];
        let wrs: Vec<SendWr<'_>> = (0..70)
            .map(|i| SendWr {
                wr_id: i,
                sg_list: &sge,
                op: SendOp::SendWithImm { imm: i as u32 },
                flags: SendFlags::SIGNALED,
            })
            .collect();
        let mut calls = Vec::new();
        // SAFETY: the callback only reads the chain.
        let r = unsafe {
            post_send_chain(&wrs, LIM, |head, _| {
                calls.push(walk(head));
                0
            })
        };
        r.unwrap();
        assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), vec![32, 32, 6]);
        let all: Vec<_> = calls.concat();
        for (i, (wr_id, opcode, lens, flags, imm)) in all.iter().enumerate() {
            assert_eq!(*wr_id, i as u64);
            assert_eq!(*opcode, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM);
            assert_eq!(lens, &vec![8]);
            assert_eq!(*flags, SendFlags::SIGNALED.0);
            assert_eq!(*imm, i as u32);
        }
    }

    #[test]
    fn invalid_wr_posts_the_ones_before_and_reports_its_index() {
        let one = [Sge { addr: 0x1000, length: 8, lkey: 7 }];
        let five = [one[0]; 5];
        let big = [Sge { addr: 0x1000, length: 65, lkey: 7 }];
        let ok = SendWr { wr_id: 1, sg_list: &one, op: SendOp::Send, flags: SendFlags::EMPTY };
        for (bad, what) in [
            (
                SendWr { wr_id: 2, sg_list: &five, op: SendOp::Send, flags: SendFlags::EMPTY },
                "max_send_sge is 4",
            ),
            (
                SendWr { wr_id: 2, sg_list: &big, op: SendOp::Send, flags: SendFlags::INLINE },
                "max_inline_data is 64",
            ),
            (
                SendWr {
                    wr_id: 2,
                    sg_list: &one,
                    op: SendOp::RdmaRead { remote_addr: 0, rkey: 1 },
                    flags: SendFlags::INLINE,
                },
                "cannot be INLINE",
            ),
        ] {
            let mut posted = Vec::new();
            // SAFETY: the callback only reads the chain.
            let r = unsafe {
                post_send_chain(&[ok, ok, bad, ok], LIM, |head, _| {
                    posted.push(walk(head).len());
                    0
                })
            };
            match r {
                Err(VerbsError::BadWorkRequest { index: 2, reason, .. }) => {
                    assert!(reason.contains(what), "{reason}")
                }
                other => panic!("expected BadWorkRequest #2, got {other:?}"),
            }
            assert_eq!(posted, vec![2], "the two valid WRs before were posted in one doorbell");
        }
    }

    #[test]
    fn provider_refusal_reports_the_bad_wr_index() {
        let one = [Sge { addr: 0x1000, length: 8, lkey: 7 }];
        let wrs = [RecvWr { wr_id: 0, sg_list: &one }; 40];
        let mut calls = 0;
        // SAFETY: the callback only reads the chain.
        let r = unsafe {
            post_recv_chain("ibv_post_recv", &wrs, 1, |head, bad| {
                calls += 1;
                if calls == 2 {
                    // Refuse from the 3rd WR of the second chunk on (it has 8 entries).
                    *bad = head.wrapping_add(3);
                    return libc::ENOMEM;
                }
                0
            })
        };
        match r {
            Err(VerbsError::BadWorkRequest { index, reason, .. }) => {
                assert_eq!(index, 32 + 3);
                assert!(reason.contains("work queue is full"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn zero_sge_wr_has_null_list() {
        let wrs = [SendWr { wr_id: 5, sg_list: &[], op: SendOp::Send, flags: SendFlags::SIGNALED }];
        let mut seen = None;
        // SAFETY: the callback only reads the chain.
        unsafe {
            post_send_chain(&wrs, LIM, |head, _| {
                seen = Some(((*head).num_sge, (*head).sg_list.is_null()));
                0
            })
        }
        .unwrap();
        assert_eq!(seen, Some((0, true)));
    }
}
