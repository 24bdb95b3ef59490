//! The libibverbs provider against a real device: the FFI paths of every object, with asserted
//! data, statuses, byte counts, immediates and errors.
//!
//! Needs an RDMA device: run with `scripts/softroce-test` (Soft-RoCE in a qemu guest). Without a
//! device each test prints why it is skipped and how to run it; with `RPC_REQUIRE_RDMA=1` (set by
//! the script) a missing device is a failure.
#![cfg(feature = "ibverbs")]
// Posting work requests is `unsafe` by contract (buffers must outlive their WRs); each block says why.
#![allow(unsafe_code)]

mod ibverbs_support;

use std::time::Duration;

use ibverbs_support::{assert_empty, connect_pair, local_address, open_or_skip, poll_n};
use rpc_core::verbs::gid::select_gid;
use rpc_core::verbs::ibverbs::{IbvCompletionQueue, IbvContext, IbvProtectionDomain, IbvQueuePair, Ibverbs};
use rpc_core::verbs::{
    AccessFlags, CompletionQueue, Context, DeviceSelector, GidType, LinkLayer, MemoryRegion, PortState,
    ProtectionDomain, Provider, QpAttr, QpCap, QpInitAttr, QpState, QueuePair, RecvWr, SendFlags, SendOp,
    SendWr, SharedReceiveQueue, SrqInitAttr, VerbsError, WcOpcode, WcStatus,
};

const RW: AccessFlags = AccessFlags(1 | 2 | 4);

struct Pair {
    _ctx: IbvContext,
    pd: IbvProtectionDomain,
    cq: IbvCompletionQueue,
    a: IbvQueuePair,
    b: IbvQueuePair,
}

/// A copy of an MR's bytes (registered memory is read by copying).
fn bytes<M: MemoryRegion>(mr: &M) -> Vec<u8> {
    let mut out = vec![0; mr.len()];
    mr.read_at(0, &mut out).expect("read_at");
    out
}

fn pair(ctx: &IbvContext, cap: QpCap) -> Pair {
    let pd = ctx.alloc_pd().expect("alloc_pd");
    let cq = ctx.create_cq(1024, false).expect("create_cq");
    let init = QpInitAttr::<Ibverbs> { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false };
    let a = pd.create_qp(&init).expect("create_qp a");
    let b = pd.create_qp(&init).expect("create_qp b");
    let l = local_address(ctx);
    connect_pair(&a, &l, &b, &l);
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));
    Pair { _ctx: ctx.clone(), pd, cq, a, b }
}

#[test]
fn ibverbs_device_port_and_gid_table() {
    let Some(ctx) = open_or_skip("ibverbs_device_port_and_gid_table") else { return };
    let devices = Ibverbs::devices().expect("devices");
    assert!(devices.iter().any(|d| d.name == ctx.device_name()), "{devices:?}");
    let by_index = Ibverbs::open(&DeviceSelector::Index(
        devices.iter().find(|d| d.name == ctx.device_name()).unwrap().index,
    ))
    .expect("open by index");
    assert_eq!(by_index.device_name(), ctx.device_name());
    let by_name = Ibverbs::open(&DeviceSelector::Name(ctx.device_name().to_string())).expect("open by name");
    assert_eq!(by_name.device_name(), ctx.device_name());

    let attr = ctx.attr();
    assert!(attr.max_qp_wr >= 16 && attr.max_sge >= 1 && attr.max_cqe >= 16, "{attr:?}");
    assert!(attr.phys_port_cnt >= 1 && attr.max_mr_size > 0, "{attr:?}");
    let port = ctx.query_port(1).expect("query_port");
    assert_eq!(port.port_num, 1);
    assert_eq!(port.state, PortState::Active, "{port:?}");
    assert!(port.gid_tbl_len > 0, "{port:?}");
    for bad in [0, attr.phys_port_cnt + 1] {
        match ctx.query_port(bad) {
            Err(VerbsError::InvalidArgument { reason, .. }) => {
                assert!(reason.contains(&format!("port {bad}")), "{reason}")
            }
            other => panic!("port {bad}: {other:?}"),
        }
    }

    let table = ctx.gid_table(1).expect("gid_table");
    assert!(!table.is_empty(), "a RoCE port has at least one GID");
    assert!(table.iter().all(|e| !e.gid.is_zero() && e.index < port.gid_tbl_len), "{table:?}");
    let auto = select_gid::<Ibverbs>(&ctx, 1, -1).expect("automatic GID");
    if port.link_layer == LinkLayer::Ethernet {
        let chosen =
            table.iter().find(|e| e.index == u32::from(auto.gid_index)).expect("chosen entry in table");
        assert_eq!(chosen.gid, auto.gid);
        if table.iter().any(|e| e.gid_type == GidType::RoceV2) {
            assert_eq!(auto.gid_type, Some(GidType::RoceV2), "RoCE v2 preferred: {table:?}");
        }
        // What rxe on a dummy netdev has: one link-local IPv6 GID.
        if ctx.device_name().starts_with("rxe") && !table.iter().any(|e| e.gid.is_ipv4_mapped()) {
            assert!(auto.gid.is_link_local(), "{auto:?}");
        }
        // The Soft-RoCE guest exports the index of its RoCE v2 GID: the automatic choice agrees.
        if let (true, Ok(want)) = (ctx.device_name().starts_with("rxe"), std::env::var("RXE_GID_IDX")) {
            assert_eq!(auto.gid_index.to_string(), want, "automatic choice vs the guest's RoCE v2 index");
        }
    }
    match select_gid::<Ibverbs>(&ctx, 1, port.gid_tbl_len as i32 + 5) {
        Err(VerbsError::InvalidArgument { reason, .. }) => {
            assert!(
                reason.contains("empty or out of range") && reason.contains(&auto.gid.to_string()),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ibverbs_send_write_read_imm_inline_and_sges() {
    let Some(ctx) = open_or_skip("ibverbs_send_write_read_imm_inline_and_sges") else { return };
    let cap = QpCap { max_inline_data: 64, ..QpCap::default() };
    let p = pair(&ctx, cap);
    assert!(p.a.cap().max_inline_data >= 64, "{:?}", p.a.cap());
    let mut src = p.pd.reg_mr(8192, RW).expect("reg_mr src");
    let dst = p.pd.reg_mr(8192, RW).expect("reg_mr dst");
    assert_eq!(src.addr() % 4096, 0, "provider buffers are page-aligned");
    assert!(bytes(&src).iter().all(|&b| b == 0), "provider buffers are zeroed");
    let fill: Vec<u8> = (0..8192).map(|i| (i * 7 % 251) as u8).collect();
    src.write_at(0, &fill).unwrap();

    // SEND with immediate, gathered from two SGEs, scattered into two SGEs.
    let gather = [src.sge(0, 100), src.sge(1000, 50)];
    let scatter = [dst.sge(0, 120), dst.sge(4096, 200)];
    // SAFETY: all SGEs lie in live MRs of this PD, untouched until the completions are polled.
    unsafe {
        p.b.post_recv(&[RecvWr { wr_id: 100, sg_list: &scatter }]).unwrap();
        p.a.post_send(&[SendWr {
            wr_id: 1,
            sg_list: &gather,
            op: SendOp::SendWithImm { imm: 0xdead_beef },
            flags: SendFlags::SIGNALED,
        }])
        .unwrap();
    }
    let wcs = poll_n(&p.cq, 2);
    let recv = wcs.iter().find(|w| w.wr_id == 100).expect("recv wc");
    let send = wcs.iter().find(|w| w.wr_id == 1).expect("send wc");
    assert_eq!(
        (send.status, send.opcode, send.qp_num),
        (WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_SEND, p.a.qp_num())
    );
    assert_eq!((recv.status, recv.opcode), (WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_RECV));
    assert_eq!((recv.byte_len, recv.imm_data, recv.qp_num), (150, Some(0xdead_beef), p.b.qp_num()));
    assert_eq!(recv.src_qp, p.a.qp_num(), "src_qp names the sending QP (filled in where rxe leaves 0)");
    let d = bytes(&dst);
    assert_eq!(&d[..100], &bytes(&src)[..100]);
    assert_eq!(&d[100..120], &bytes(&src)[1000..1020]);
    assert_eq!(&d[4096..4126], &bytes(&src)[1020..1050]);

    // INLINE SEND from an unregistered stack buffer (no lkey needed), and a zero-length SEND.
    let msg = *b"inline payload!";
    let inline = [rpc_core::verbs::Sge { addr: msg.as_ptr() as u64, length: msg.len() as u32, lkey: 0 }];
    let r1 = [dst.sge(6000, 64)];
    let r2 = [dst.sge(7000, 64)];
    // SAFETY: receive SGEs in a live MR; the inline buffer is copied at post time.
    unsafe {
        p.b.post_recv(&[RecvWr { wr_id: 101, sg_list: &r1 }, RecvWr { wr_id: 102, sg_list: &r2 }]).unwrap();
        p.a.post_send(&[
            SendWr {
                wr_id: 2,
                sg_list: &inline,
                op: SendOp::Send,
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            },
            SendWr { wr_id: 3, sg_list: &[], op: SendOp::Send, flags: SendFlags::SIGNALED },
        ])
        .unwrap();
    }
    let wcs = poll_n(&p.cq, 4);
    let r = |id| *wcs.iter().find(|w| w.wr_id == id).unwrap_or_else(|| panic!("wc {id}: {wcs:?}"));
    assert!(wcs.iter().all(|w| w.status.is_success()), "{wcs:?}");
    assert_eq!((r(101).byte_len, r(101).imm_data), (msg.len() as u32, None));
    assert_eq!(&bytes(&dst)[6000..6000 + msg.len()], &msg);
    assert_eq!(r(102).byte_len, 0);

    // RDMA WRITE, WRITE_WITH_IMM (consumes a receive), READ back.
    let rkey = dst.rkey();
    let base = dst.addr();
    let r3 = [dst.sge(7500, 16)];
    let back = [src.sge(5000, 256)];
    // SAFETY: SGEs in live MRs; remote ranges inside `dst`, registered with REMOTE_WRITE/READ.
    unsafe {
        p.b.post_recv(&[RecvWr { wr_id: 103, sg_list: &r3 }]).unwrap();
        p.a.post_send(&[
            SendWr {
                wr_id: 4,
                sg_list: &[src.sge(2000, 256)],
                op: SendOp::RdmaWrite { remote_addr: base + 2048, rkey },
                flags: SendFlags::SIGNALED,
            },
            SendWr {
                wr_id: 5,
                sg_list: &[src.sge(3000, 32)],
                op: SendOp::RdmaWriteWithImm { remote_addr: base + 3000, rkey, imm: 7 },
                flags: SendFlags::SIGNALED,
            },
            SendWr {
                wr_id: 6,
                sg_list: &back,
                op: SendOp::RdmaRead { remote_addr: base + 2048, rkey },
                flags: SendFlags::SIGNALED,
            },
        ])
        .unwrap();
    }
    let wcs = poll_n(&p.cq, 4);
    assert!(wcs.iter().all(|w| w.status.is_success()), "{wcs:?}");
    let by = |id| *wcs.iter().find(|w| w.wr_id == id).unwrap();
    assert_eq!(by(4).opcode, WcOpcode::IBV_WC_RDMA_WRITE);
    assert_eq!(by(5).opcode, WcOpcode::IBV_WC_RDMA_WRITE);
    assert_eq!((by(6).opcode, by(6).byte_len), (WcOpcode::IBV_WC_RDMA_READ, 256));
    assert_eq!(
        (by(103).opcode, by(103).imm_data, by(103).byte_len),
        (WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM, Some(7), 32)
    );
    let (s, d) = (bytes(&src), bytes(&dst));
    assert_eq!(&d[2048..2304], &s[2000..2256]);
    assert_eq!(&d[3000..3032], &s[3000..3032]);
    assert_eq!(&s[5000..5256], &s[2000..2256], "READ brought back what WRITE put there");
    assert_empty(&p.cq);
}

#[test]
fn ibverbs_post_lists_longer_than_a_chunk_keep_order() {
    let Some(ctx) = open_or_skip("ibverbs_post_lists_longer_than_a_chunk_keep_order") else { return };
    let n = 100usize;
    let cap = QpCap { max_send_wr: 128, max_recv_wr: 128, ..QpCap::default() };
    let p = pair(&ctx, cap);
    let mut src = p.pd.reg_mr(n * 8, RW).unwrap();
    let dst = p.pd.reg_mr(n * 8, RW).unwrap();
    for i in 0..n {
        src.write_at(i * 8, &(i as u64).to_le_bytes()).unwrap();
    }
    let rsges: Vec<_> = (0..n).map(|i| [dst.sge(i * 8, 8)]).collect();
    let ssges: Vec<_> = (0..n).map(|i| [src.sge(i * 8, 8)]).collect();
    let recvs: Vec<_> = (0..n).map(|i| RecvWr { wr_id: 1000 + i as u64, sg_list: &rsges[i] }).collect();
    // Every 10th signaled: selective signaling.
    let sends: Vec<_> = (0..n)
        .map(|i| SendWr {
            wr_id: i as u64,
            sg_list: &ssges[i],
            op: SendOp::Send,
            flags: if i % 10 == 9 { SendFlags::SIGNALED } else { SendFlags::EMPTY },
        })
        .collect();
    // SAFETY: SGEs in live MRs, untouched until the completions are polled.
    unsafe {
        p.b.post_recv(&recvs).unwrap();
        p.a.post_send(&sends).unwrap();
    }
    let wcs = poll_n(&p.cq, n + n / 10);
    let recv_ids: Vec<u64> =
        wcs.iter().filter(|w| w.opcode == WcOpcode::IBV_WC_RECV).map(|w| w.wr_id).collect();
    let send_ids: Vec<u64> =
        wcs.iter().filter(|w| w.opcode == WcOpcode::IBV_WC_SEND).map(|w| w.wr_id).collect();
    assert_eq!(recv_ids, (1000..1000 + n as u64).collect::<Vec<_>>(), "receives complete in order");
    assert_eq!(send_ids, (0..n as u64).filter(|i| i % 10 == 9).collect::<Vec<_>>(), "only signaled sends");
    assert_eq!(bytes(&dst), bytes(&src));
    assert_empty(&p.cq);
}

#[test]
fn ibverbs_srq_shared_by_two_qps_and_event_mode() {
    let Some(ctx) = open_or_skip("ibverbs_srq_shared_by_two_qps_and_event_mode") else { return };
    let pd = ctx.alloc_pd().unwrap();
    let scq = ctx.create_cq(64, false).unwrap();
    let rcq = ctx.create_cq(64, true).unwrap();
    assert!(rcq.capacity() >= 64);
    let srq = pd.create_srq(&SrqInitAttr { max_wr: 32, max_sge: 1 }).unwrap();
    assert!(srq.max_wr() >= 32);
    let with_srq = QpInitAttr::<Ibverbs> {
        send_cq: &scq,
        recv_cq: &rcq,
        srq: Some(&srq),
        cap: QpCap::default(),
        sq_sig_all: true,
    };
    let plain = QpInitAttr::<Ibverbs> {
        send_cq: &scq,
        recv_cq: &scq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: true,
    };
    let (r1, r2) = (pd.create_qp(&with_srq).unwrap(), pd.create_qp(&with_srq).unwrap());
    let (s1, s2) = (pd.create_qp(&plain).unwrap(), pd.create_qp(&plain).unwrap());
    let l = local_address(&ctx);
    connect_pair(&s1, &l, &r1, &l);
    connect_pair(&s2, &l, &r2, &l);
    let buf = pd.reg_mr(4096, RW).unwrap();
    let mut msg = pd.reg_mr(64, RW).unwrap();
    msg.write_at(0, b"hello").unwrap();

    // A QP on an SRQ refuses its own receives.
    // SAFETY: never posted (refused before reaching the provider).
    let e = unsafe { r1.post_recv(&[RecvWr { wr_id: 0, sg_list: &[buf.sge(0, 8)] }]) }.unwrap_err();
    assert!(matches!(e, VerbsError::BadWorkRequest { index: 0, .. }), "{e:?}");

    // Event mode: nothing pending → wait times out; then one SEND per QP wakes it.
    rcq.req_notify(false).unwrap();
    assert!(!rcq.wait(Some(Duration::from_millis(20))).unwrap(), "no event without a completion");
    let sg: Vec<_> = (0..4).map(|i| [buf.sge(i * 1024, 1024)]).collect();
    let wrs: Vec<_> = (0..4).map(|i| RecvWr { wr_id: 50 + i as u64, sg_list: &sg[i] }).collect();
    // SAFETY: SGEs in live MRs, untouched until polled.
    unsafe {
        srq.post_recv(&wrs).unwrap();
        s1.post_send(&[SendWr {
            wr_id: 1,
            sg_list: &[msg.sge(0, 5)],
            op: SendOp::Send,
            flags: SendFlags::EMPTY,
        }])
        .unwrap();
        s2.post_send(&[SendWr {
            wr_id: 2,
            sg_list: &[msg.sge(0, 3)],
            op: SendOp::Send,
            flags: SendFlags::EMPTY,
        }])
        .unwrap();
    }
    assert!(rcq.wait(Some(Duration::from_secs(60))).unwrap(), "event after a completion");
    let mut wcs = poll_n(&rcq, 1);
    if wcs.len() < 2 {
        wcs.extend(poll_n(&rcq, 2 - wcs.len()));
    }
    let mut got: Vec<(u32, u32)> = wcs.iter().map(|w| (w.qp_num, w.byte_len)).collect();
    got.sort();
    let mut want = [(r1.qp_num(), 5), (r2.qp_num(), 3)];
    want.sort();
    assert_eq!(got, want, "each QP's SEND landed in the shared SRQ: {wcs:?}");
    let mut ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, [50, 51], "the first two SRQ WQEs were consumed: {wcs:?}");
    assert_eq!(poll_n(&scq, 2).len(), 2, "sq_sig_all signals every send");

    // A CQ without a channel refuses event calls.
    assert!(matches!(scq.req_notify(false), Err(VerbsError::InvalidArgument { .. })));
    assert!(matches!(scq.wait(Some(Duration::ZERO)), Err(VerbsError::InvalidArgument { .. })));
}

#[test]
fn ibverbs_caps_transitions_and_states_are_checked() {
    let Some(ctx) = open_or_skip("ibverbs_caps_transitions_and_states_are_checked") else { return };
    let attr = ctx.attr().clone();
    let pd = ctx.alloc_pd().unwrap();
    match ctx.create_cq(attr.max_cqe + 1, false) {
        Err(VerbsError::CapExceeded { cap: "max_cqe", requested, limit, .. }) => {
            assert_eq!((requested, limit), (u64::from(attr.max_cqe) + 1, u64::from(attr.max_cqe)))
        }
        other => panic!("{:?}", other.err()),
    }
    match pd.create_srq(&SrqInitAttr { max_wr: attr.max_srq_wr + 1, max_sge: 1 }) {
        Err(e @ VerbsError::CapExceeded { cap: "max_srq_wr", .. }) => {
            assert!(e.to_string().contains(&format!("device's max_srq_wr is {}", attr.max_srq_wr)), "{e}")
        }
        other => panic!("{:?}", other.err()),
    }
    let cq = ctx.create_cq(16, false).unwrap();
    let qp_with = |cap: QpCap| {
        pd.create_qp(&QpInitAttr::<Ibverbs> { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })
    };
    for (cap, name, req, lim) in [
        (
            QpCap { max_send_wr: attr.max_qp_wr + 1, ..QpCap::default() },
            "max_qp_wr",
            attr.max_qp_wr + 1,
            attr.max_qp_wr,
        ),
        (
            QpCap { max_recv_sge: attr.max_sge + 1, ..QpCap::default() },
            "max_sge",
            attr.max_sge + 1,
            attr.max_sge,
        ),
    ] {
        match qp_with(cap) {
            Err(VerbsError::CapExceeded { cap, requested, limit, .. }) => {
                assert_eq!((cap, requested, limit), (name, u64::from(req), u64::from(lim)))
            }
            other => panic!("{name}: {:?}", other.err()),
        }
    }
    // Inline beyond what the device takes: the limit is learned and named.
    match qp_with(QpCap { max_inline_data: 1 << 20, ..QpCap::default() }) {
        Err(VerbsError::CapExceeded { cap: "max_inline_data", requested, limit, .. }) => {
            assert_eq!(requested, 1 << 20);
            assert!(limit > 0 && limit < 1 << 20, "{limit}");
            let qp =
                qp_with(QpCap { max_inline_data: limit as u32, ..QpCap::default() }).expect("at the limit");
            assert!(qp.cap().max_inline_data >= limit as u32);
        }
        other => panic!("inline: {:?}", other.err()),
    }

    let qp = qp_with(QpCap::default()).unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    let mr = pd.reg_mr(64, RW).unwrap();
    // Posting in RESET: a clear error, nothing posted.
    // SAFETY: refused before reaching the provider.
    let e = unsafe {
        qp.post_send(&[SendWr {
            wr_id: 1,
            sg_list: &[mr.sge(0, 8)],
            op: SendOp::Send,
            flags: SendFlags::SIGNALED,
        }])
    };
    assert!(matches!(e, Err(VerbsError::BadQpState { state: QpState::Reset, .. })), "{e:?}");
    // SAFETY: as above.
    let e = unsafe { qp.post_recv(&[RecvWr { wr_id: 1, sg_list: &[mr.sge(0, 8)] }]) };
    assert!(matches!(e, Err(VerbsError::BadQpState { call: "ibv_post_recv", .. })), "{e:?}");
    // A transition missing its required attributes.
    let mut init = QpAttr::new(QpState::Init);
    init.port_num = Some(1);
    match qp.modify(&init) {
        Err(VerbsError::QpTransition { to: QpState::Init, from: QpState::Reset, reason, mask, .. }) => {
            assert!(
                reason.contains("IBV_QP_PKEY_INDEX") && reason.contains("IBV_QP_ACCESS_FLAGS"),
                "{reason}"
            );
            assert_eq!(mask & 1, 1, "IBV_QP_STATE is in the mask");
        }
        other => panic!("{other:?}"),
    }
    // An illegal transition the kernel refuses: RESET → RTS.
    match qp.modify(&QpAttr::new(QpState::Rts)) {
        Err(e @ VerbsError::QpTransition { to: QpState::Rts, .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("ibv_modify_qp") && msg.contains("Rts") && msg.contains("attribute mask"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(qp.state(), QpState::Reset, "a refused transition leaves the state");
    assert!(matches!(pd.reg_mr(0, RW), Err(VerbsError::InvalidArgument { .. })));
}

#[test]
fn ibverbs_remote_access_error_moves_qp_to_err_and_flushes() {
    let Some(ctx) = open_or_skip("ibverbs_remote_access_error_moves_qp_to_err_and_flushes") else { return };
    let p = pair(&ctx, QpCap::default());
    let src = p.pd.reg_mr(4096, RW).unwrap();
    let ro = p.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
    // SAFETY: SGEs in live MRs, untouched until polled.
    unsafe {
        p.a.post_send(&[
            SendWr {
                wr_id: 1,
                sg_list: &[src.sge(0, 64)],
                op: SendOp::RdmaWrite { remote_addr: ro.addr(), rkey: ro.rkey() },
                flags: SendFlags::SIGNALED,
            },
            SendWr { wr_id: 2, sg_list: &[src.sge(0, 8)], op: SendOp::Send, flags: SendFlags::SIGNALED },
        ])
        .unwrap();
    }
    let wcs = poll_n(&p.cq, 2);
    assert_eq!(wcs[0].wr_id, 1);
    assert_eq!(wcs[0].status, WcStatus::IBV_WC_REM_ACCESS_ERR, "{wcs:?}");
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::IBV_WC_WR_FLUSH_ERR), "{wcs:?}");
    assert_eq!(p.a.state(), QpState::Err);
    assert!(bytes(&ro).iter().all(|&b| b == 0), "nothing was written");
    // Posting to a QP known to be in ERR is refused (rxe would never complete it).
    // SAFETY: refused before reaching the provider.
    let e = unsafe {
        p.a.post_send(&[SendWr {
            wr_id: 3,
            sg_list: &[src.sge(0, 8)],
            op: SendOp::Send,
            flags: SendFlags::SIGNALED,
        }])
    };
    assert!(matches!(e, Err(VerbsError::BadQpState { state: QpState::Err, .. })), "{e:?}");
    // SAFETY: as above.
    let e = unsafe { p.a.post_recv(&[RecvWr { wr_id: 4, sg_list: &[src.sge(0, 8)] }]) };
    assert!(matches!(e, Err(VerbsError::BadQpState { state: QpState::Err, .. })), "{e:?}");
}

#[test]
fn ibverbs_user_memory_two_contexts_and_drop_order() {
    let Some(c1) = open_or_skip("ibverbs_user_memory_two_contexts_and_drop_order") else { return };
    let c2 = Ibverbs::open(&ibverbs_support::selector()).expect("second context");
    let (pd1, pd2) = (c1.alloc_pd().unwrap(), c2.alloc_pd().unwrap());
    let (cq1, cq2) = (c1.create_cq(16, false).unwrap(), c2.create_cq(16, false).unwrap());
    let q1 = pd1
        .create_qp(&QpInitAttr::<Ibverbs> {
            send_cq: &cq1,
            recv_cq: &cq1,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap();
    let q2 = pd2
        .create_qp(&QpInitAttr::<Ibverbs> {
            send_cq: &cq2,
            recv_cq: &cq2,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap();
    connect_pair(&q1, &local_address(&c1), &q2, &local_address(&c2));

    let mut mine = vec![0u8; 10_000].into_boxed_slice();
    // SAFETY: `mine` outlives the MR (dropped below, after the MR) and is not moved.
    let user = unsafe { pd2.reg_user_mr(mine.as_mut_ptr(), mine.len(), RW) }.unwrap();
    assert_eq!((user.addr(), user.len()), (mine.as_ptr() as u64, 10_000));
    let mut src = pd1.reg_mr(256, RW).unwrap();
    src.write_at(0, &[0x5a; 256]).unwrap();
    // Drop the handles we no longer need: the QPs keep PDs, CQs and contexts alive.
    drop((c1, c2, pd1));
    // SAFETY: SGE in a live MR; remote range inside `user`.
    unsafe {
        q1.post_send(&[SendWr {
            wr_id: 9,
            sg_list: &[src.sge(0, 256)],
            op: SendOp::RdmaWrite { remote_addr: user.addr() + 9000, rkey: user.rkey() },
            flags: SendFlags::SIGNALED,
        }])
        .unwrap();
    }
    let wc = poll_n(&cq1, 1)[0];
    assert_eq!((wc.wr_id, wc.status, wc.qp_num), (9, WcStatus::IBV_WC_SUCCESS, q1.qp_num()));
    assert_eq!(&bytes(&user)[9000..9256], &[0x5a; 256]);
    assert!(bytes(&user)[..9000].iter().all(|&b| b == 0));
    drop(user);
    assert_eq!(mine[9100], 0x5a, "the caller's memory got the data");
    // Drop in the "wrong" order: CQs before QPs, QPs with receives outstanding.
    let mr = pd2.reg_mr(64, RW).unwrap();
    // SAFETY: SGE in a live MR; the QP is destroyed before the MR (dropped after it below).
    unsafe { q2.post_recv(&[RecvWr { wr_id: 1, sg_list: &[mr.sge(0, 64)] }]).unwrap() };
    drop((cq1, cq2, pd2));
    drop((q1, q2));
    drop(mr);
}

#[test]
fn ibverbs_cq_overrun_is_reported() {
    let Some(ctx) = open_or_skip("ibverbs_cq_overrun_is_reported") else { return };
    let pd = ctx.alloc_pd().unwrap();
    let small = ctx.create_cq(8, false).unwrap();
    let big = ctx.create_cq(64, false).unwrap();
    let n = small.capacity() as usize + 4;
    let cap = QpCap { max_send_wr: n as u32 + 1, ..QpCap::default() };
    let a = pd
        .create_qp(&QpInitAttr::<Ibverbs> {
            send_cq: &small,
            recv_cq: &big,
            srq: None,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    let b = pd
        .create_qp(&QpInitAttr::<Ibverbs> { send_cq: &big, recv_cq: &big, srq: None, cap, sq_sig_all: true })
        .unwrap();
    let l = local_address(&ctx);
    connect_pair(&a, &l, &b, &l);
    let mr = pd.reg_mr(4096, RW).unwrap();
    let sge = [mr.sge(0, 8)];
    let wrs: Vec<_> = (0..n)
        .map(|i| SendWr {
            wr_id: i as u64,
            sg_list: &sge,
            op: SendOp::RdmaWrite { remote_addr: mr.addr() + 64, rkey: mr.rkey() },
            flags: SendFlags::SIGNALED,
        })
        .collect();
    // SAFETY: SGE and remote range in a live MR that outlives the QPs.
    unsafe { a.post_send(&wrs).unwrap() };
    // Polling with an empty slice consumes nothing and reports the overrun once it is known.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let err = loop {
        match small.poll(&mut []) {
            Err(e) => break e,
            Ok(0) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no overrun reported for {n} CQEs on a CQ of {}",
                    small.capacity()
                );
                std::thread::yield_now();
            }
            Ok(k) => panic!("an empty slice got {k} completions"),
        }
    };
    match err {
        VerbsError::CqOverrun { cqe } => assert_eq!(cqe, small.capacity()),
        other => panic!("{other:?}"),
    }
    let mut wc = [rpc_core::verbs::WorkCompletion::default(); 4];
    assert!(
        matches!(small.poll(&mut wc), Err(VerbsError::CqOverrun { .. })),
        "the overrun CQ stays unusable"
    );
}
