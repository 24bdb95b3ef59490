//! Memory windows (type 2), provider-generic: bind to a QP, access through the window from that
//! QP's peer only, inside its range and rights, invalidation by LOCAL_INV and by a received
//! SEND_WITH_INV, and the binding checks. A device without type-2 windows skips these cases
//! with a printed reason (never on `sim`).
//!
//! What a device does where IBA leaves room, as seen on Soft-RoCE (`rxe`, Linux 6.1) and
//! accepted on devices only: see [`write_outside_the_window_inside_the_mr`].

use rpc_core::verbs::{
    inc_rkey, AccessFlags, Context, MemoryRegion, MemoryWindow, MwBind, MwType, ProtectionDomain, Provider,
    QpAttr, QpState, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

use super::{
    assert_empty, connect_qps, pair, pattern, poll_one, post_recv, post_send, Ctx, Harness, Node, Opts,
};

const SIG: SendFlags = SendFlags::SIGNALED;
/// The window: 1 KiB at offset 4096 of the server's MR.
const WIN_OFF: usize = 4096;
const WIN_LEN: usize = 1024;

type Mw<H> = <<H as Harness>::P as Provider>::MemoryWindow;

fn is_sim<H: Harness>() -> bool {
    <H::P as Provider>::NAME == "sim"
}

/// Whether the device has type-2 windows; prints why a case is skipped when not (a failure on
/// `sim`).
fn supported<H: Harness>(ctx: &Ctx<H>, case: &str) -> bool {
    let ok = ctx.attr().mw_type2;
    assert!(ok || !is_sim::<H>(), "the software NIC has type-2 memory windows");
    if !ok {
        eprintln!("skipped {case} on {}: the device has no type-2 memory windows", ctx.device_name());
    }
    ok
}

/// Options whose MR accepts windows.
fn mw_opts() -> Opts {
    let o = Opts::default();
    Opts { mr_access: o.mr_access | AccessFlags::MW_BIND, ..o }
}

fn wr(wr_id: u64, sg_list: &[Sge], op: SendOp) -> SendWr<'_> {
    SendWr { wr_id, sg_list, op, flags: SIG }
}

/// Posts a bind of `mw` to `n`'s QP over `[off, off + len)` of its MR with `access` and a new
/// rkey, and returns that rkey and the bind's completion.
fn bind<H: Harness>(
    n: &Node<H>,
    mw: &Mw<H>,
    off: usize,
    len: usize,
    access: AccessFlags,
) -> (u32, WorkCompletion) {
    let old = mw.rkey();
    let rkey = inc_rkey(old);
    assert_eq!((rkey >> 8, rkey & 0xff), (old >> 8, (old + 1) & 0xff), "ibv_inc_rkey");
    let bind = MwBind { mr: n.mr.handle(), addr: n.mr.addr() + off as u64, length: len as u64, access };
    post_send(&n.qp, &[wr(900, &[], SendOp::BindMw { mw: mw.handle(), rkey, bind })]).expect("post BindMw");
    (rkey, poll_one::<H, _>(&n.scq, "the bind's completion"))
}

/// A client `a` and a server `b` whose QPs are connected, and a window of `b` bound to `b`'s QP
/// over the server's `[WIN_OFF, +WIN_LEN)` with `access`: returns the window and its rkey.
fn bound_pair<H: Harness>(ca: &Ctx<H>, cb: &Ctx<H>, access: AccessFlags) -> (Node<H>, Node<H>, Mw<H>, u32) {
    let (a, b) = pair::<H>(ca, cb, mw_opts());
    let mw = b.pd.alloc_mw(MwType::Type2).expect("alloc_mw");
    let (rkey, wc) = bind(&b, &mw, WIN_OFF, WIN_LEN, access);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (900, WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_BIND_MW),
        "{wc:?}"
    );
    assert_eq!(mw.rkey(), rkey, "the window's rkey follows the bind");
    (a, b, mw, rkey)
}

/// An RDMA WRITE of `len` bytes from `a`'s MR at 0 to `remote_addr` under `rkey`; its status.
fn write<H: Harness>(a: &Node<H>, remote_addr: u64, rkey: u32, len: u32) -> WcStatus {
    let sge = [a.sge(0, len)];
    post_send(&a.qp, &[wr(1, &sge, SendOp::RdmaWrite { remote_addr, rkey })]).expect("post WRITE");
    poll_one::<H, _>(&a.scq, "the WRITE's completion").status
}

fn win_addr<H: Harness>(b: &Node<H>) -> u64 {
    b.mr.addr() + WIN_OFF as u64
}

pub fn mw_bind_then_write_and_read_through_it<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "mw_bind_then_write_and_read_through_it") {
        return;
    }
    let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (mut a, b, mw, rkey) = bound_pair::<H>(&ca, &cb, rw);
    assert_ne!(rkey, b.mr.rkey(), "the window has its own rkey");
    let data = pattern(5, 300);
    a.write(0, &data);
    assert_eq!(write(&a, win_addr(&b) + 100, rkey, 300), WcStatus::IBV_WC_SUCCESS);
    assert_eq!(b.read(WIN_OFF + 100, 300), data, "the WRITE landed through the window");
    // The whole window, to its last byte.
    assert_eq!(write(&a, win_addr(&b) + (WIN_LEN - 8) as u64, rkey, 8), WcStatus::IBV_WC_SUCCESS);
    // READ back into a's MR at 8192.
    let sge = [a.sge(8192, 300)];
    post_send(&a.qp, &[wr(2, &sge, SendOp::RdmaRead { remote_addr: win_addr(&b) + 100, rkey })]).unwrap();
    let r = poll_one::<H, _>(&a.scq, "the READ");
    assert_eq!((r.status, r.opcode, r.byte_len), (WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_RDMA_READ, 300));
    assert_eq!(a.read(8192, 300), data);
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
    drop(mw);
}

/// The point of type-2 windows: a peer of another connection (another QP of the same PD on the
/// server) cannot use the rkey. Its WRITE fails with `IBV_WC_REM_ACCESS_ERR` and its QP goes to
/// ERR; the server QP that received it goes to ERR too (a responder-side error, on `sim` and on
/// rxe alike); nothing is written; the window's own connection is untouched and still works.
pub fn mw_rkey_of_another_connection_is_refused<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "mw_rkey_of_another_connection_is_refused") {
        return;
    }
    let (mut a, b, _mw, rkey) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
    // A second connection to the same server PD: client node c, server QP qb2.
    let mut c = Node::<H>::new(&ca, mw_opts());
    let qb2 = b.extra_qp();
    connect_qps(&c, &c.qp, &b, &qb2);
    c.write(0, &[0xee; 64]);
    assert_eq!(write(&c, win_addr(&b), rkey, 64), WcStatus::IBV_WC_REM_ACCESS_ERR, "another QP's rkey");
    assert_eq!(c.qp.state(), QpState::Err, "the requester QP goes to ERR");
    super::wait_until::<H>("the responder QP of the refused WRITE in ERR", || qb2.state() == QpState::Err);
    assert!(b.read(WIN_OFF, WIN_LEN).iter().all(|&x| x == 0), "nothing written through the window");
    // The window's own connection is intact.
    assert_eq!(b.qp.state(), QpState::Rts);
    a.write(0, b"still mine");
    assert_eq!(write(&a, win_addr(&b), rkey, 10), WcStatus::IBV_WC_SUCCESS);
    assert_eq!(b.read(WIN_OFF, 10), b"still mine");
    // The window's server QP still answers SENDs.
    post_recv(&b.qp, &[RecvWr { wr_id: 7, sg_list: &[b.sge(0, 64)] }]).unwrap();
    post_send(&a.qp, &[wr(3, &[a.sge(0, 4)], SendOp::Send)]).unwrap();
    assert_eq!(poll_one::<H, _>(&a.scq, "send").status, WcStatus::IBV_WC_SUCCESS);
    assert_eq!(poll_one::<H, _>(&b.rcq, "recv").status, WcStatus::IBV_WC_SUCCESS);
}

/// WRITEs that end past the window, or start before it, inside the MR. IBA and `sim`:
/// `IBV_WC_REM_ACCESS_ERR`, nothing written. rxe on Linux 6.1 checks the range against the MR
/// the window is bound to, not against the window (`check_rkey` in `rxe_resp.c` calls
/// `mr_check_range` on `mw->mr`): such WRITEs succeed there and write the bytes (seen on rxe0 in
/// the CI guest, both cases). Accepted on devices only, exactly so (success and the bytes
/// written, or the refusal and nothing written), with a printed note.
pub fn write_outside_the_window_inside_the_mr<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "write_outside_the_window_inside_the_mr") {
        return;
    }
    for (what, off) in
        [("past the window's end", WIN_OFF + WIN_LEN - 8), ("before the window's start", WIN_OFF - 8)]
    {
        let (mut a, b, _mw, rkey) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
        a.write(0, &[0x77; 16]);
        let status = write(&a, b.mr.addr() + off as u64, rkey, 16);
        if !is_sim::<H>() && status == WcStatus::IBV_WC_SUCCESS {
            eprintln!("device quirk on {}: a WRITE {what} (inside the MR) succeeded", ca.device_name());
            assert_eq!(b.read(off, 16), [0x77; 16], "the quirk: the WRITE {what} landed whole");
            continue;
        }
        assert_eq!(status, WcStatus::IBV_WC_REM_ACCESS_ERR, "a WRITE {what}");
        assert!(b.read(off, 16).iter().all(|&x| x == 0), "nothing written {what}");
        assert_eq!(a.qp.state(), QpState::Err);
    }
}

/// A window over the MR's last KiB: a WRITE past the MR's end is refused everywhere.
pub fn write_past_the_mr_through_a_window_fails<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "write_past_the_mr_through_a_window_fails") {
        return;
    }
    let (mut a, b) = pair::<H>(&ca, &cb, mw_opts());
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let tail = b.mr.len() - WIN_LEN;
    let (rkey, wc) = bind(&b, &mw, tail, WIN_LEN, AccessFlags::REMOTE_WRITE);
    assert_eq!(wc.status, WcStatus::IBV_WC_SUCCESS, "{wc:?}");
    a.write(0, &[0x55; 16]);
    let end = b.mr.addr() + b.mr.len() as u64;
    assert_eq!(write(&a, end - 8, rkey, 16), WcStatus::IBV_WC_REM_ACCESS_ERR, "past the MR's end");
    assert!(b.read(b.mr.len() - 8, 8).iter().all(|&x| x == 0), "nothing written");
}

/// A window bound with REMOTE_READ only refuses a WRITE (and one with REMOTE_WRITE only, a READ).
pub fn window_rights_are_enforced<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "window_rights_are_enforced") {
        return;
    }
    let (mut a, b, _mw, rkey) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_READ);
    a.write(0, &[1; 8]);
    assert_eq!(
        write(&a, win_addr(&b), rkey, 8),
        WcStatus::IBV_WC_REM_ACCESS_ERR,
        "WRITE on a read-only window"
    );
    assert!(b.read(WIN_OFF, 8).iter().all(|&x| x == 0));
    assert_eq!(a.qp.state(), QpState::Err);

    let (a, b, _mw, rkey) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
    let sge = [a.sge(0, 8)];
    post_send(&a.qp, &[wr(2, &sge, SendOp::RdmaRead { remote_addr: win_addr(&b), rkey })]).unwrap();
    assert_eq!(
        poll_one::<H, _>(&a.scq, "READ on a write-only window").status,
        WcStatus::IBV_WC_REM_ACCESS_ERR
    );
}

/// LOCAL_INV on the server kills the rkey; the window can be bound again with a new key, and the
/// old key stays dead.
pub fn local_inv_kills_the_rkey_and_the_window_rebinds<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "local_inv_kills_the_rkey_and_the_window_rebinds") {
        return;
    }
    let (mut a, b, mw, k1) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
    a.write(0, b"first");
    assert_eq!(write(&a, win_addr(&b), k1, 5), WcStatus::IBV_WC_SUCCESS);
    post_send(&b.qp, &[wr(901, &[], SendOp::LocalInv { rkey: k1 })]).unwrap();
    let inv = poll_one::<H, _>(&b.scq, "LOCAL_INV");
    assert_eq!(
        (inv.wr_id, inv.status, inv.opcode),
        (901, WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_LOCAL_INV),
        "{inv:?}"
    );
    // Bound again (it is free now), with the next key.
    let (k2, wc) = bind(&b, &mw, WIN_OFF, WIN_LEN, AccessFlags::REMOTE_WRITE);
    assert_eq!(wc.status, WcStatus::IBV_WC_SUCCESS, "{wc:?}");
    assert_ne!(k1, k2);
    a.write(0, b"second");
    assert_eq!(write(&a, win_addr(&b), k2, 6), WcStatus::IBV_WC_SUCCESS);
    assert_eq!(b.read(WIN_OFF, 6), b"second");
    // The old key is dead: refused, nothing written.
    a.write(0, b"XXXXXX");
    assert_eq!(write(&a, win_addr(&b), k1, 6), WcStatus::IBV_WC_REM_ACCESS_ERR, "the invalidated rkey");
    assert_eq!(b.read(WIN_OFF, 6), b"second");
}

/// A SEND_WITH_INV from the client invalidates the server's window: the receive completion says
/// so (`IBV_WC_WITH_INV` + the rkey), and from then on the rkey is dead.
pub fn send_with_inv_kills_the_rkey<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "send_with_inv_kills_the_rkey") {
        return;
    }
    let (mut a, b, _mw, rkey) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
    a.write(0, b"body");
    assert_eq!(write(&a, win_addr(&b), rkey, 4), WcStatus::IBV_WC_SUCCESS);
    post_recv(&b.qp, &[RecvWr { wr_id: 50, sg_list: &[b.sge(0, 64)] }]).unwrap();
    a.write(64, b"done");
    let sge = [a.sge(64, 4)];
    post_send(&a.qp, &[wr(4, &sge, SendOp::SendWithInv { invalidate_rkey: rkey })]).unwrap();
    let s = poll_one::<H, _>(&a.scq, "SEND_WITH_INV");
    assert_eq!((s.status, s.opcode), (WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_SEND), "{s:?}");
    let r = poll_one::<H, _>(&b.rcq, "the receive of the SEND_WITH_INV");
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.invalidated_rkey, r.imm_data),
        (50, WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_RECV, 4, Some(rkey), None),
        "{r:?}"
    );
    assert_eq!(b.read(0, 4), b"done");
    // Dead: the peer's next WRITE is refused and writes nothing.
    a.write(0, b"late");
    assert_eq!(write(&a, win_addr(&b), rkey, 4), WcStatus::IBV_WC_REM_ACCESS_ERR, "after SEND_WITH_INV");
    assert_eq!(b.read(WIN_OFF, 4), b"body");
    // An ordinary SEND reports no invalidation.
    let (a, b) = pair::<H>(&ca, &cb, Opts::default());
    post_recv(&b.qp, &[RecvWr { wr_id: 51, sg_list: &[b.sge(0, 64)] }]).unwrap();
    post_send(&a.qp, &[wr(5, &[a.sge(0, 4)], SendOp::Send)]).unwrap();
    poll_one::<H, _>(&a.scq, "send");
    assert_eq!(poll_one::<H, _>(&b.rcq, "recv").invalidated_rkey, None);
}

/// Binding needs the MR registered with MW_BIND (C10-73), and LOCAL_WRITE on it for a writable
/// window (C10-74): otherwise `IBV_WC_MW_BIND_ERR` and the QP goes to ERR. A bound window cannot
/// be bound again before it is invalidated (o10-37.2.30).
pub fn bind_checks_the_mr<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "bind_checks_the_mr") {
        return;
    }
    // No MW_BIND on the MR.
    let (_a, b) = pair::<H>(&ca, &cb, Opts::default());
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (_, wc) = bind(&b, &mw, WIN_OFF, WIN_LEN, AccessFlags::REMOTE_WRITE);
    assert_eq!(
        (wc.wr_id, wc.status),
        (900, WcStatus::IBV_WC_MW_BIND_ERR),
        "bind on an MR without MW_BIND: {wc:?}"
    );
    super::wait_until::<H>("the QP of the failed bind in ERR", || b.qp.state() == QpState::Err);
    drop(mw);

    // MW_BIND but no local write: a REMOTE_READ window binds, a REMOTE_WRITE one does not.
    let ro = Opts { mr_access: AccessFlags::REMOTE_READ | AccessFlags::MW_BIND, ..Opts::default() };
    let (_a, b) = pair::<H>(&ca, &cb, ro);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (k, wc) = bind(&b, &mw, WIN_OFF, WIN_LEN, AccessFlags::REMOTE_READ);
    assert_eq!(wc.status, WcStatus::IBV_WC_SUCCESS, "a read-only window on a read-only MR: {wc:?}");
    post_send(&b.qp, &[wr(901, &[], SendOp::LocalInv { rkey: k })]).unwrap();
    assert_eq!(poll_one::<H, _>(&b.scq, "LOCAL_INV").status, WcStatus::IBV_WC_SUCCESS);
    let (_, wc) = bind(&b, &mw, WIN_OFF, WIN_LEN, AccessFlags::REMOTE_WRITE);
    assert_eq!(
        wc.status,
        WcStatus::IBV_WC_MW_BIND_ERR,
        "a writable window on an MR without LOCAL_WRITE: {wc:?}"
    );

    // Bound twice without an invalidation between.
    let (_a, b, mw, _k) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
    let (_, wc) = bind(&b, &mw, WIN_OFF, WIN_LEN, AccessFlags::REMOTE_WRITE);
    assert_eq!(wc.status, WcStatus::IBV_WC_MW_BIND_ERR, "a bound window bound again: {wc:?}");
    assert_empty(&b.scq, "after the failed bind");
}

/// Another QP of the window's PD can invalidate it with LOCAL_INV and bind it to itself; then only
/// that QP's peer gets in. On `sim` the window's first QP is destroyed first: the window outlives
/// it, bound to no QP (rxe keeps a reference to the dead QP instead). Not on devices: rxe (Linux
/// 6.1) blocks in `ibv_destroy_qp` while a window holds the QP, for its pool timeout (about 100 s
/// in the CI guest) — invalidate or drop a QP's windows before the QP.
pub fn window_is_invalidated_and_rebound_from_another_qp<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "window_is_invalidated_and_rebound_from_another_qp") {
        return;
    }
    let (_a, mut b, mw, k1) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
    let mut c = Node::<H>::new(&ca, mw_opts());
    let q2 = b.extra_qp();
    connect_qps(&c, &c.qp, &b, &q2);
    if is_sim::<H>() {
        let spare = b.extra_qp();
        drop(std::mem::replace(&mut b.qp, spare)); // the window's QP is gone
    }
    post_send(&q2, &[wr(902, &[], SendOp::LocalInv { rkey: k1 })]).unwrap();
    let inv = poll_one::<H, _>(&b.scq, "LOCAL_INV from another QP");
    assert_eq!(
        (inv.wr_id, inv.status, inv.opcode),
        (902, WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_LOCAL_INV),
        "{inv:?}"
    );
    let k2 = inc_rkey(mw.rkey());
    let bind = MwBind {
        mr: b.mr.handle(),
        addr: win_addr(&b),
        length: WIN_LEN as u64,
        access: AccessFlags::REMOTE_WRITE,
    };
    post_send(&q2, &[wr(903, &[], SendOp::BindMw { mw: mw.handle(), rkey: k2, bind })]).unwrap();
    let wc = poll_one::<H, _>(&b.scq, "the bind on the other QP");
    assert_eq!((wc.wr_id, wc.status), (903, WcStatus::IBV_WC_SUCCESS), "{wc:?}");
    c.write(0, b"new owner");
    assert_eq!(write(&c, win_addr(&b), k2, 9), WcStatus::IBV_WC_SUCCESS);
    assert_eq!(b.read(WIN_OFF, 9), b"new owner");
    assert_eq!(write(&c, win_addr(&b), k1, 9), WcStatus::IBV_WC_REM_ACCESS_ERR, "the old rkey");
}

/// A window stays bound to its QP through the QP's ERR and RESET (IBA does not unbind it; rxe
/// keeps its QP reference): once the QP is connected again, the same rkey works again.
pub fn window_stays_bound_through_its_qps_error_and_reset<H: Harness>(ca: Ctx<H>, cb: Ctx<H>) {
    if !supported::<H>(&ca, "window_stays_bound_through_its_qps_error_and_reset") {
        return;
    }
    let (mut a, b, _mw, rkey) = bound_pair::<H>(&ca, &cb, AccessFlags::REMOTE_WRITE);
    for q in [&a.qp, &b.qp] {
        q.modify(&QpAttr::new(QpState::Err)).expect("to ERR");
        q.modify(&QpAttr::new(QpState::Reset)).expect("to RESET");
    }
    connect_qps(&a, &a.qp, &b, &b.qp);
    a.write(0, b"again!!!");
    assert_eq!(write(&a, win_addr(&b), rkey, 8), WcStatus::IBV_WC_SUCCESS, "bound to the same QP");
    assert_eq!(b.read(WIN_OFF, 8), b"again!!!");
}
