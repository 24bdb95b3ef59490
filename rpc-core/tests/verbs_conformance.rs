//! The verbs conformance suite: the same cases (`conformance/cases.rs`) for every provider, one
//! `conformance_suite!` line each, plus the sim-only cases that need fault injection or exact
//! timer semantics (module `sim_only`, at the end).
//!
//! Run: `cargo test -p rpc-core --test verbs_conformance` (the `ibverbs` instantiation skips each
//! test with a printed reason on a machine without an RDMA device; `scripts/softroce-test` runs
//! it against Soft-RoCE).
#![allow(unsafe_code)] // Posting WRs is `unsafe` by contract; see `conformance::post_send`.

#[macro_use]
mod conformance;

conformance_suite!(sim, crate::conformance::DeviceHarness<rpc_core::verbs::sim::Sim>);
#[cfg(feature = "ibverbs")]
#[path = "ibverbs_support/conformance_harness.rs"]
mod ibverbs_harness;
#[cfg(feature = "ibverbs")]
conformance_suite!(ibverbs, crate::ibverbs_harness::IbvHarness);

/// Sim-only: fault injection, finite RNR/transport retries, host identity.
mod sim_only {
    use std::time::Duration;

    use rpc_core::verbs::sim::{Sim, SimContext, SIM_GID_INDEX};
    use rpc_core::verbs::{
        AccessFlags, CompletionQueue, Context, DeviceSelector, GidType, LinkLayer, MemoryRegion, Mtu,
        PortState, ProtectionDomain, Provider, QpState, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge,
        VerbsError, WcStatus, WorkCompletion,
    };

    use crate::conformance::{
        assert_empty, connect_qps, pair, poll_n, poll_one, post_recv, post_send, DeviceHarness, Node, Opts,
    };

    type H = DeviceHarness<Sim>;

    fn hosts() -> (SimContext, SimContext) {
        (Sim::open(&DeviceSelector::First).unwrap(), Sim::open(&DeviceSelector::First).unwrap())
    }

    fn send(wr_id: u64, sg_list: &[Sge], flags: SendFlags) -> SendWr<'_> {
        SendWr { wr_id, sg_list, op: SendOp::Send, flags }
    }

    const SIG: SendFlags = SendFlags::SIGNALED;

    fn statuses(w: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
        w.iter().map(|w| (w.wr_id, w.status)).collect()
    }

    #[test]
    fn every_open_is_a_new_host_with_its_own_address() {
        let (a, b) = hosts();
        assert_ne!(a.host_id(), b.host_id());
        for ctx in [&a, &b] {
            assert_eq!(ctx.device_name(), "sim0");
            let port = ctx.query_port(1).unwrap();
            assert_eq!(
                (port.state, port.link_layer, port.active_mtu, port.lid),
                (PortState::Active, LinkLayer::Sim, Mtu::Mtu4096, ctx.host_id() as u16)
            );
            let table = ctx.gid_table(1).unwrap();
            assert_eq!(table.len() as u32, port.gid_tbl_len);
            let mut expected = [0u8; 16];
            expected[0] = 0xfe;
            expected[1] = 0x80;
            expected[8..12].copy_from_slice(&std::process::id().to_be_bytes());
            expected[12..].copy_from_slice(&ctx.host_id().to_be_bytes());
            assert_eq!(ctx.gid().0, expected);
            assert!(ctx.gid().is_link_local());
            // The host's own GID is entry 0 (RoCE v1) and entry SIM_GID_INDEX (RoCE v2).
            let own: Vec<_> =
                table.iter().filter(|e| e.gid == ctx.gid()).map(|e| (e.index, e.gid_type)).collect();
            assert_eq!(own, [(0, GidType::RoceV1), (SIM_GID_INDEX, GidType::RoceV2)]);
        }
        assert_eq!(Sim::devices().unwrap().iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["sim0"]);
    }

    /// The software NIC's GID table has several addresses and types, as a RoCE NIC's, and the
    /// one automatic choice (`select_gid` with -1, what the runtime and rpc-perf call) picks the
    /// host's RoCE v2 address from it; an explicit index is taken as is.
    #[test]
    fn the_automatic_gid_choice_on_sim_is_the_hosts_roce_v2_entry() {
        use rpc_core::verbs::gid::select_gid;
        let (a, b) = hosts();
        for ctx in [&a, &b] {
            let table = ctx.gid_table(1).unwrap();
            let types: std::collections::HashSet<_> = table.iter().map(|e| e.gid_type).collect();
            assert_eq!(types.len(), 3, "RoCE v1, RoCE v2 and IB entries: {table:?}");
            assert!(
                table.iter().any(|e| e.gid_type == GidType::RoceV2 && e.gid.is_ipv4_mapped()),
                "{table:?}"
            );
            assert!(
                table.iter().any(|e| e.gid_type == GidType::RoceV1 && e.gid.is_ipv4_mapped()),
                "{table:?}"
            );
            let local = select_gid::<Sim>(ctx, 1, -1).unwrap();
            assert_eq!(
                (u32::from(local.gid_index), local.gid, local.gid_type, local.rc_config().gid_index),
                (SIM_GID_INDEX, ctx.gid(), Some(GidType::RoceV2), SIM_GID_INDEX as u8),
                "{table:?}"
            );
            let explicit = select_gid::<Sim>(ctx, 1, 1).unwrap();
            assert_eq!((explicit.gid_index, explicit.gid_type), (1, Some(GidType::RoceV1)));
            assert!(explicit.gid.is_ipv4_mapped());
        }
        // The conformance suite's sim cases connect their QPs with this choice (the harness's
        // address), so their traffic goes through it.
        let addr = <H as crate::conformance::Harness>::address(&a);
        assert_eq!((u32::from(addr.cfg.gid_index), addr.gid), (SIM_GID_INDEX, a.gid()));
    }

    #[test]
    fn opening_an_unknown_device_names_what_exists() {
        for sel in [DeviceSelector::Name("mlx5_0".into()), DeviceSelector::Index(1)] {
            match Sim::open(&sel) {
                Err(e @ VerbsError::NoDevice { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("sim0") && text.contains("sim"), "{text}");
                }
                other => panic!("{sel:?}: expected NoDevice, got {other:?}"),
            }
        }
        assert!(Sim::open(&DeviceSelector::Name("sim0".into())).is_ok());
        assert!(Sim::open(&DeviceSelector::Index(0)).is_ok());
    }

    #[test]
    fn rnr_retries_exhausted_fail_and_flush() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts { rnr_retry: 2, min_rnr_timer: 1, ..Opts::default() });
        let s = [a.sge(0, 8)];
        post_send(&a.qp, &[send(1, &s, SIG), send(2, &s, SendFlags::EMPTY), send(3, &s, SIG)]).unwrap();
        let w = poll_n::<H, _>(&a.scq, 3, "RNR failure and flushes");
        assert_eq!(
            statuses(&w),
            [
                (1, WcStatus::IBV_WC_RNR_RETRY_EXC_ERR),
                (2, WcStatus::IBV_WC_WR_FLUSH_ERR),
                (3, WcStatus::IBV_WC_WR_FLUSH_ERR)
            ]
        );
        assert_eq!(a.qp.state(), QpState::Err);
        assert_eq!(b.qp.state(), QpState::Rts, "an RNR is no error at the responder");
    }

    /// With `rnr_retry = 7` an RNR is never an error, so only the NIC can tell it happened:
    /// every wait counts on the QP and in the process-wide [`rpc_core::verbs::sim::stats`], and a
    /// send that found its receive posted counts none.
    #[test]
    fn rnr_waits_are_counted_by_the_nic() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts { rnr_retry: 7, min_rnr_timer: 1, ..Opts::default() });
        post_recv(&b.qp, &[RecvWr { wr_id: 1, sg_list: &[b.sge(0, 64)] }]).unwrap();
        post_send(&a.qp, &[send(1, &[a.sge(0, 8)], SIG)]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "send with a receive posted").status, WcStatus::IBV_WC_SUCCESS);
        assert_eq!(a.qp.rnr_stalls(), 0, "a receive was posted");
        let before = rpc_core::verbs::sim::stats().rnr_stalls;
        post_send(&a.qp, &[send(2, &[a.sge(0, 8)], SIG)]).unwrap();
        // No receive at b: the send waits (0.01 ms RNR timer) and retries, forever.
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while a.qp.rnr_stalls() < 3 {
            assert!(std::time::Instant::now() < give_up, "{} RNR waits counted in 10 s", a.qp.rnr_stalls());
            assert_eq!(
                a.scq.poll(&mut [WorkCompletion::default()]).unwrap(),
                0,
                "no completion while it waits"
            );
            std::thread::yield_now();
        }
        assert!(rpc_core::verbs::sim::stats().rnr_stalls >= before + 3, "the process-wide count follows");
        assert_eq!(b.qp.rnr_stalls(), 0, "the responder's own sends met no RNR");
        post_recv(&b.qp, &[RecvWr { wr_id: 2, sg_list: &[b.sge(0, 64)] }]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "send after the RNR waits").status, WcStatus::IBV_WC_SUCCESS);
    }

    #[test]
    fn rnr_retry_zero_fails_at_the_first_rnr() {
        let (ca, cb) = hosts();
        let (a, _b) = pair::<H>(&ca, &cb, Opts { rnr_retry: 0, ..Opts::default() });
        post_send(&a.qp, &[send(1, &[a.sge(0, 8)], SendFlags::EMPTY)]).unwrap();
        let w = poll_one::<H, _>(&a.scq, "RNR failure");
        assert_eq!(
            (w.wr_id, w.status),
            (1, WcStatus::IBV_WC_RNR_RETRY_EXC_ERR),
            "errors complete unsignaled WRs"
        );
    }

    #[test]
    fn dropped_traffic_exhausts_retries() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts { timeout: 1, retry_cnt: 3, ..Opts::default() });
        post_recv(&b.qp, &[RecvWr { wr_id: 1, sg_list: &[b.sge(0, 64)] }]).unwrap();
        a.qp.set_drop_traffic(true);
        let s = [a.sge(0, 8)];
        post_send(&a.qp, &[send(1, &s, SIG), send(2, &s, SIG)]).unwrap();
        let w = poll_n::<H, _>(&a.scq, 2, "retry exhaustion");
        assert_eq!(statuses(&w), [(1, WcStatus::IBV_WC_RETRY_EXC_ERR), (2, WcStatus::IBV_WC_WR_FLUSH_ERR)]);
        assert_eq!(a.qp.state(), QpState::Err);
        assert_empty(&b.rcq, "nothing was delivered");
    }

    #[test]
    fn dropped_traffic_recovers_when_lifted_before_the_retries_run_out() {
        let (ca, cb) = hosts();
        // ACK timeout code 16 (4.096 µs × 2^16 ≈ 268 ms) × 7 retries: the budget stays far above
        // what a loaded 2-core machine can stall this thread between dropping and lifting.
        let (a, b) = pair::<H>(&ca, &cb, Opts { timeout: 16, retry_cnt: 7, ..Opts::default() });
        post_recv(&b.qp, &[RecvWr { wr_id: 1, sg_list: &[b.sge(0, 64)] }]).unwrap();
        b.qp.set_drop_traffic(true);
        post_send(&a.qp, &[send(1, &[a.sge(0, 8)], SIG)]).unwrap();
        assert_empty(&a.scq, "nothing while packets are dropped");
        b.qp.set_drop_traffic(false);
        let w = poll_one::<H, _>(&a.scq, "the retransmission");
        assert_eq!((w.wr_id, w.status), (1, WcStatus::IBV_WC_SUCCESS));
        assert_eq!(poll_one::<H, _>(&b.rcq, "recv").wr_id, 1);
    }

    #[test]
    fn delayed_wrs_arrive_later_and_in_order() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts::default());
        for i in 0..3 {
            post_recv(&b.qp, &[RecvWr { wr_id: 10 + i, sg_list: &[b.sge(i as usize * 64, 64)] }]).unwrap();
        }
        let delay = Duration::from_millis(50);
        a.qp.set_delay(Some(delay));
        let s = [a.sge(0, 8)];
        let posted = std::time::Instant::now();
        post_send(&a.qp, &[send(1, &s, SIG), send(2, &s, SIG), send(3, &s, SIG)]).unwrap();
        let mut buf = [WorkCompletion::default(); 4];
        let early = b.rcq.poll(&mut buf).unwrap();
        // Only a poll made before the delay ran out can say (a loaded machine may deschedule this
        // thread for longer than the delay between the post and the poll).
        if posted.elapsed() < delay {
            assert_eq!(early, 0, "nothing delivered at post time");
        }
        let w = poll_n::<H, _>(&a.scq, 3, "delayed sends");
        assert_eq!(
            statuses(&w),
            [(1, WcStatus::IBV_WC_SUCCESS), (2, WcStatus::IBV_WC_SUCCESS), (3, WcStatus::IBV_WC_SUCCESS)]
        );
        let mut r: Vec<u64> = buf[..early].iter().map(|w| w.wr_id).collect();
        if early < 3 {
            r.extend(poll_n::<H, _>(&b.rcq, 3 - early, "delayed receives").iter().map(|w| w.wr_id));
        }
        assert_eq!(r, [10, 11, 12]);
        a.qp.set_delay(None);
    }

    #[test]
    fn force_error_flushes_outstanding_work() {
        let (ca, cb) = hosts();
        let (a, _b) = pair::<H>(&ca, &cb, Opts { min_rnr_timer: 1, ..Opts::default() });
        post_recv(&a.qp, &[RecvWr { wr_id: 50, sg_list: &[a.sge(1024, 64)] }]).unwrap();
        let s = [a.sge(0, 8)];
        // No receive at b: these wait (RNR forever).
        post_send(&a.qp, &[send(1, &s, SIG), send(2, &s, SendFlags::EMPTY)]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        a.qp.force_error();
        assert_eq!(a.qp.state(), QpState::Err);
        let w = poll_n::<H, _>(&a.scq, 2, "flushed sends");
        assert_eq!(statuses(&w), [(1, WcStatus::IBV_WC_WR_FLUSH_ERR), (2, WcStatus::IBV_WC_WR_FLUSH_ERR)]);
        let r = poll_one::<H, _>(&a.rcq, "flushed receive");
        assert_eq!((r.wr_id, r.status), (50, WcStatus::IBV_WC_WR_FLUSH_ERR));
    }

    #[test]
    fn a_vanished_peer_fails_sends_with_retry_exceeded() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts { timeout: 1, retry_cnt: 2, ..Opts::default() });
        post_recv(&b.qp, &[RecvWr { wr_id: 1, sg_list: &[b.sge(0, 64)] }]).unwrap();
        cb.vanish();
        assert_eq!(cb.query_port(1).unwrap().state, PortState::Down);
        post_send(&a.qp, &[send(7, &[a.sge(0, 8)], SIG)]).unwrap();
        let w = poll_one::<H, _>(&a.scq, "send to a vanished host");
        assert_eq!((w.wr_id, w.status), (7, WcStatus::IBV_WC_RETRY_EXC_ERR));
        assert_eq!(b.qp.state(), QpState::Err, "the vanished host's QPs are in ERR");
    }

    #[test]
    fn a_destroyed_peer_qp_fails_sends_with_retry_exceeded() {
        let (ca, cb) = hosts();
        let (a, mut b) = pair::<H>(&ca, &cb, Opts { timeout: 1, retry_cnt: 1, ..Opts::default() });
        let spare = b.extra_qp();
        drop(std::mem::replace(&mut b.qp, spare));
        post_send(&a.qp, &[send(7, &[a.sge(0, 8)], SIG)]).unwrap();
        let w = poll_one::<H, _>(&a.scq, "send to a destroyed QP");
        assert_eq!((w.wr_id, w.status), (7, WcStatus::IBV_WC_RETRY_EXC_ERR));
    }

    #[test]
    fn mismatched_psns_never_deliver() {
        let (ca, cb) = hosts();
        let opts = Opts { timeout: 1, retry_cnt: 2, ..Opts::default() };
        let a = Node::<H>::new(&ca, opts);
        let b = Node::<H>::new(&cb, opts);
        let ea = a.endpoint(&a.qp, 100);
        let eb = b.endpoint(&b.qp, 200);
        let wrong = rpc_core::verbs::rc::Endpoint { psn: 999, ..ea };
        rpc_core::verbs::rc::connect(&a.qp, &a.addr.cfg, &ea, &eb).unwrap();
        rpc_core::verbs::rc::connect(&b.qp, &b.addr.cfg, &eb, &wrong).unwrap();
        post_recv(&b.qp, &[RecvWr { wr_id: 1, sg_list: &[b.sge(0, 64)] }]).unwrap();
        post_send(&a.qp, &[send(1, &[a.sge(0, 8)], SIG)]).unwrap();
        let w = poll_one::<H, _>(&a.scq, "send with a PSN the responder does not expect");
        assert_eq!(w.status, WcStatus::IBV_WC_RETRY_EXC_ERR);
        assert_empty(&b.rcq, "nothing delivered");
    }

    #[test]
    fn responder_qp_goes_to_err_on_a_remote_access_error() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts::default());
        post_recv(&b.qp, &[RecvWr { wr_id: 5, sg_list: &[b.sge(0, 64)] }]).unwrap();
        let op = SendOp::RdmaWrite { remote_addr: b.mr.addr(), rkey: 0x1234_0fff };
        post_send(&a.qp, &[SendWr { wr_id: 1, sg_list: &[a.sge(0, 8)], op, flags: SIG }]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "write").status, WcStatus::IBV_WC_REM_ACCESS_ERR);
        assert_eq!(b.qp.state(), QpState::Err);
        let r = poll_one::<H, _>(&b.rcq, "responder's receive flushed");
        assert_eq!((r.wr_id, r.status), (5, WcStatus::IBV_WC_WR_FLUSH_ERR));
    }

    #[test]
    fn a_deregistered_mr_key_is_refused() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts::default());
        let old = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
        let (addr, rkey) = (old.addr(), old.rkey());
        drop(old);
        let _reuse = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
        let op = SendOp::RdmaWrite { remote_addr: addr, rkey };
        post_send(&a.qp, &[SendWr { wr_id: 1, sg_list: &[a.sge(0, 8)], op, flags: SIG }]).unwrap();
        assert_eq!(
            poll_one::<H, _>(&a.scq, "write with a stale rkey").status,
            WcStatus::IBV_WC_REM_ACCESS_ERR
        );
    }

    #[test]
    fn an_rkey_of_another_pd_is_refused() {
        let (ca, cb) = hosts();
        let (a, _b) = pair::<H>(&ca, &cb, Opts::default());
        let other_pd = cb.alloc_pd().unwrap();
        let foreign = other_pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
        let op = SendOp::RdmaWrite { remote_addr: foreign.addr(), rkey: foreign.rkey() };
        post_send(&a.qp, &[SendWr { wr_id: 1, sg_list: &[a.sge(0, 8)], op, flags: SIG }]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "write into another PD").status, WcStatus::IBV_WC_REM_ACCESS_ERR);
        let mut head = [0xffu8; 8];
        foreign.read_at(0, &mut head).unwrap();
        assert_eq!(head, [0; 8]);
    }

    #[test]
    fn receive_cq_overrun_is_reported_to_the_receiver() {
        let (ca, cb) = hosts();
        let a = Node::<H>::new(&ca, Opts::default());
        let b = Node::<H>::new(&cb, Opts { cqe: 4, ..Opts::default() });
        connect_qps(&a, &a.qp, &b, &b.qp);
        let cap = b.rcq.capacity() as usize;
        let rs: Vec<[Sge; 1]> = (0..cap + 2).map(|i| [b.sge(i * 16, 16)]).collect();
        let rwrs: Vec<RecvWr<'_>> =
            rs.iter().enumerate().map(|(i, s)| RecvWr { wr_id: i as u64, sg_list: s }).collect();
        post_recv(&b.qp, &rwrs).unwrap();
        let s = [a.sge(0, 8)];
        let wrs: Vec<SendWr<'_>> = (0..cap as u64 + 2).map(|i| send(i, &s, SendFlags::EMPTY)).collect();
        post_send(&a.qp, &wrs).unwrap();
        let mut buf = [WorkCompletion::default(); 16];
        match b.rcq.poll(&mut buf) {
            Err(VerbsError::CqOverrun { cqe }) => assert_eq!(cqe as usize, cap),
            other => panic!("expected CqOverrun, got {other:?}"),
        }
    }

    #[test]
    fn solicited_only_notification_ignores_unsolicited_receives() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts { events: true, ..Opts::default() });
        for i in 0..2 {
            post_recv(&b.qp, &[RecvWr { wr_id: i, sg_list: &[b.sge(i as usize * 64, 64)] }]).unwrap();
        }
        b.rcq.req_notify(true).unwrap();
        let s = [a.sge(0, 8)];
        post_send(&a.qp, &[send(1, &s, SendFlags::EMPTY)]).unwrap();
        assert!(
            !b.rcq.wait(Some(Duration::from_millis(20))).unwrap(),
            "an unsolicited receive does not wake"
        );
        post_send(&a.qp, &[send(2, &s, SendFlags::SOLICITED)]).unwrap();
        assert!(b.rcq.wait(Some(Duration::from_secs(10))).unwrap(), "a solicited receive wakes");
        assert_eq!(poll_n::<H, _>(&b.rcq, 2, "both receives").len(), 2);
    }

    #[test]
    fn write_with_imm_waits_for_a_receive() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts { rnr_retry: 1, min_rnr_timer: 1, ..Opts::default() });
        let op = SendOp::RdmaWriteWithImm { remote_addr: b.mr.addr(), rkey: b.mr.rkey(), imm: 3 };
        post_send(&a.qp, &[SendWr { wr_id: 1, sg_list: &[a.sge(0, 8)], op, flags: SIG }]).unwrap();
        assert_eq!(
            poll_one::<H, _>(&a.scq, "write-imm without receive").status,
            WcStatus::IBV_WC_RNR_RETRY_EXC_ERR
        );
    }

    #[test]
    fn receive_too_small_is_exactly_local_length_error_at_the_receiver() {
        let (ca, cb) = hosts();
        let (a, b) = pair::<H>(&ca, &cb, Opts::default());
        post_recv(&b.qp, &[RecvWr { wr_id: 3, sg_list: &[b.sge(0, 8)] }]).unwrap();
        post_send(&a.qp, &[send(1, &[a.sge(0, 9)], SIG)]).unwrap();
        let r = poll_one::<H, _>(&b.rcq, "receive");
        assert_eq!((r.wr_id, r.status, r.qp_num), (3, WcStatus::IBV_WC_LOC_LEN_ERR, b.qp.qp_num()));
        assert_eq!(poll_one::<H, _>(&a.scq, "send").status, WcStatus::IBV_WC_REM_INV_REQ_ERR);
        assert_eq!((a.qp.state(), b.qp.state()), (QpState::Err, QpState::Err));
        assert!(b.bytes()[..8].iter().all(|&x| x == 0), "nothing written into a too-small buffer");
    }

    #[test]
    fn modify_names_the_missing_attribute() {
        let (ca, _cb) = hosts();
        let a = Node::<H>::new(&ca, Opts::default());
        let mut init = rpc_core::verbs::QpAttr::new(QpState::Init);
        init.port_num = Some(1);
        init.access = Some(AccessFlags::LOCAL_WRITE);
        let err = a.qp.modify(&init).unwrap_err().to_string();
        assert!(err.contains("IBV_QP_PKEY_INDEX") && err.contains("Init"), "{err}");
    }
}

/// Sim across processes: the same operations with the peer QP in a child process (see
/// `conformance/xproc.rs`); transfers cross the shared-memory host segments.
mod xproc {
    use rpc_core::verbs::sim::{Sim, SimContext};
    use rpc_core::verbs::{
        AccessFlags, CompletionQueue, DeviceSelector, MemoryRegion, ProtectionDomain, Provider, QpState,
        QueuePair, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
    };

    use crate::conformance::xproc::{connect_pair, is_agent, segments_of, serve, Agent, Wc};
    use crate::conformance::{
        pattern, poll_n, poll_one, post_recv, post_send, wait_until, DeviceHarness, Node, Opts,
    };

    type H = DeviceHarness<Sim>;

    /// The child's entry point (run by the cross-process cases, never on its own).
    #[test]
    #[ignore = "the peer side of the cross-process cases; they run it in a child process"]
    fn agent() {
        if is_agent() {
            serve();
        }
    }

    fn setup(opts: Opts) -> (SimContext, Node<H>, Agent) {
        let ctx = Sim::open(&DeviceSelector::First).unwrap();
        let node = Node::<H>::new(&ctx, opts);
        let mut agent = Agent::spawn(opts);
        connect_pair(&node, &mut agent);
        (ctx, node, agent)
    }

    fn wr(wr_id: u64, sg: &[rpc_core::verbs::Sge], op: SendOp) -> SendWr<'_> {
        SendWr { wr_id, sg_list: sg, op, flags: SendFlags::SIGNALED }
    }

    fn name<T: std::fmt::Debug>(v: T) -> String {
        format!("{v:?}")
    }

    #[test]
    fn send_recv_across_processes() {
        let (_c, mut a, mut b) = setup(Opts::default());
        assert_ne!(b.pid(), std::process::id());
        assert_eq!(b.cmd("recv 77 512 1024"), ["ok"]);
        let data = pattern(3, 700);
        a.write(0, &data);
        post_send(&a.qp, &[wr(1, &[a.sge(0, 700)], SendOp::Send)]).unwrap();
        let w = poll_one::<H, _>(&a.scq, "send completion");
        assert_eq!((w.wr_id, w.status, w.opcode), (1, WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_SEND));
        let r = b.poll("rcq", 1);
        let expect = Wc {
            wr_id: 77,
            status: name(WcStatus::IBV_WC_SUCCESS),
            opcode: name(WcOpcode::IBV_WC_RECV),
            byte_len: 700,
            imm: None,
            qp_num: b.qpn,
            src_qp: a.qp.qp_num(),
        };
        assert_eq!(r, [expect]);
        assert_eq!(b.read(512, 700), data);
        b.exit();
    }

    /// A type-2 window of this process, bound to the QP of one child's connection: that child
    /// writes through it; another child, connected to another QP of the same PD, gets
    /// `IBV_WC_REM_ACCESS_ERR` with the same rkey and writes nothing (the key check runs in the
    /// child, on this process's key table in shared memory); the first child's SEND_WITH_INV
    /// then kills the rkey, for it too.
    #[test]
    fn memory_window_keys_are_checked_across_processes() {
        use rpc_core::verbs::rc::{connect, Endpoint};
        use rpc_core::verbs::{
            inc_rkey, AccessFlags, MemoryRegion, MemoryWindow, Mtu, MwBind, MwType, ProtectionDomain,
        };

        let opts = Opts { mr_access: Opts::default().mr_access | AccessFlags::MW_BIND, ..Opts::default() };
        let (_c, b, mut one) = setup(opts);
        let mut two = Agent::spawn(Opts::default());
        let q2 = b.extra_qp();
        let r = two.cmd(&format!(
            "connect {} {} 768 1024",
            q2.qp_num(),
            crate::conformance::xproc::gid_hex(&b.addr.gid)
        ));
        assert_eq!(r, ["ok"]);
        let eb = Endpoint { qp_num: two.qpn, psn: 768, lid: 0, gid: two.gid, mtu: Mtu::Mtu4096 };
        connect(&q2, &b.addr.cfg, &b.endpoint(&q2, 1024), &eb).expect("connect to the second agent");

        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        let win = b.mr.addr() + 4096;
        let bind = MwBind { mr: b.mr.handle(), addr: win, length: 1024, access: AccessFlags::REMOTE_WRITE };
        post_send(&b.qp, &[wr(9, &[], SendOp::BindMw { mw: mw.handle(), rkey, bind })]).unwrap();
        assert_eq!(poll_one::<H, _>(&b.scq, "bind").status, WcStatus::IBV_WC_SUCCESS);

        assert_eq!(one.cmd("fill 0 64 3"), ["ok"]);
        assert_eq!(one.cmd(&format!("send 1 write 0 64 {win} {rkey} 0")), ["ok"]);
        assert_eq!(one.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        assert_eq!(b.read(4096, 64), pattern(3, 64), "written through the window from the child");

        assert_eq!(two.cmd("fill 0 64 9"), ["ok"]);
        assert_eq!(two.cmd(&format!("send 2 write 0 64 {win} {rkey} 0")), ["ok"]);
        assert_eq!(
            two.poll("scq", 1)[0].status,
            name(WcStatus::IBV_WC_REM_ACCESS_ERR),
            "another QP's window"
        );
        assert_eq!(b.read(4096, 64), pattern(3, 64), "nothing written by the other connection");
        wait_until::<H>("the refused WRITE's responder QP in ERR", || q2.state() == QpState::Err);
        assert_eq!(b.qp.state(), QpState::Rts, "the window's own QP is untouched");

        post_recv(&b.qp, &[RecvWr { wr_id: 70, sg_list: &[b.sge(0, 64)] }]).unwrap();
        assert_eq!(one.cmd(&format!("send 3 send_inv 0 4 0 {rkey} 0")), ["ok"]);
        let r = poll_one::<H, _>(&b.rcq, "the SEND_WITH_INV");
        assert_eq!(
            (r.wr_id, r.status, r.invalidated_rkey),
            (70, WcStatus::IBV_WC_SUCCESS, Some(rkey)),
            "{r:?}"
        );
        assert_eq!(one.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        assert_eq!(one.cmd(&format!("send 4 write 0 64 {win} {rkey} 0")), ["ok"]);
        assert_eq!(
            one.poll("scq", 1)[0].status,
            name(WcStatus::IBV_WC_REM_ACCESS_ERR),
            "the invalidated rkey"
        );
        drop(mw);
        one.exit();
        two.exit();
    }

    /// A window over an MR of caller memory (`reg_user_mr`) is out of reach of another process,
    /// exactly as the MR itself is (its pointer is in this process's private table only): the
    /// child's WRITE through it is a remote access error and writes nothing.
    #[test]
    fn a_window_over_caller_memory_is_out_of_reach_of_another_process() {
        use rpc_core::verbs::{inc_rkey, MemoryWindow, MwBind, MwType};

        let (_c, a, mut b) = setup(Opts::default());
        let mut mem = vec![0u8; 8192];
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        // SAFETY: `mem` outlives the MR (dropped before it, below).
        let user = unsafe { a.pd.reg_user_mr(mem.as_mut_ptr(), mem.len(), access) }.unwrap();
        let mw = a.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        let win = user.addr() + 1024;
        let bind = MwBind { mr: user.handle(), addr: win, length: 1024, access: AccessFlags::REMOTE_WRITE };
        post_send(&a.qp, &[wr(9, &[], SendOp::BindMw { mw: mw.handle(), rkey, bind })]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "bind").status, WcStatus::IBV_WC_SUCCESS);
        assert_eq!(b.cmd("fill 0 64 3"), ["ok"]);
        assert_eq!(b.cmd(&format!("send 1 write 0 64 {win} {rkey} 0")), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_REM_ACCESS_ERR));
        drop(mw);
        drop(user);
        assert!(mem.iter().all(|&x| x == 0), "nothing written by the other process");
        b.exit();
    }

    /// A window over memory past the child's mapping of our segment (an MR registered after
    /// the child mapped it): the child maps the segment again and the transfer lands, as for
    /// the MR's own rkey; it is neither refused nor read from the stale mapping. Then the MR is
    /// deregistered while the child maps us: its window dies for the child too.
    #[test]
    fn a_window_past_the_peers_mapping_is_remapped() {
        use rpc_core::verbs::{inc_rkey, MemoryWindow, MwBind, MwType};

        let (_c, a, mut b) = setup(Opts::default());
        assert_eq!(b.cmd("fill 0 64 5"), ["ok"]);
        assert_eq!(b.cmd(&format!("send 1 write 0 64 {} {} 0", a.mr.addr(), a.mr.rkey())), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        let mib = 1usize << 20;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let big = a.pd.reg_mr(64 * mib, access).unwrap();
        let mw = a.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        let win = big.addr() + (64 * mib - 4096) as u64;
        let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let bind = MwBind { mr: big.handle(), addr: win, length: 4096, access: rights };
        post_send(&a.qp, &[wr(9, &[], SendOp::BindMw { mw: mw.handle(), rkey, bind })]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "bind").status, WcStatus::IBV_WC_SUCCESS);
        assert_eq!(b.cmd(&format!("send 2 write 0 64 {} {rkey} 0", win + 4032)), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        let mut got = vec![0u8; 64];
        big.read_at(64 * mib - 64, &mut got).unwrap();
        assert_eq!(got, pattern(5, 64), "written through the window past the first mapping");
        assert_eq!(b.cmd(&format!("send 3 read 1000 64 {} {rkey} 0", win + 4032)), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        assert_eq!(b.read(1000, 64), pattern(5, 64));
        drop(big);
        assert_eq!(b.cmd(&format!("send 4 write 0 64 {win} {rkey} 0")), ["ok"]);
        assert_eq!(
            b.poll("scq", 1)[0].status,
            name(WcStatus::IBV_WC_REM_ACCESS_ERR),
            "the window died with its MR"
        );
        drop(mw);
        b.exit();
    }

    #[test]
    fn send_with_imm_both_directions() {
        let (_c, mut a, mut b) = setup(Opts::default());
        assert_eq!(b.cmd("recv 5 0 64"), ["ok"]);
        a.write(0, &pattern(9, 16));
        post_send(&a.qp, &[wr(2, &[a.sge(0, 16)], SendOp::SendWithImm { imm: 0xdead_beef })]).unwrap();
        let r = b.poll("rcq", 1);
        assert_eq!((r[0].wr_id, r[0].imm, r[0].byte_len), (5, Some(0xdead_beef), 16));
        // The child sends back: it maps this process's segment.
        post_recv(&a.qp, &[RecvWr { wr_id: 9, sg_list: &[a.sge(4096, 256)] }]).unwrap();
        assert_eq!(b.cmd("fill 100 200 42"), ["ok"]);
        assert_eq!(b.cmd("send 3 send_imm 100 200 0 0 4242"), ["ok"]);
        let w = poll_one::<H, _>(&a.rcq, "the child's send");
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.qp_num, w.src_qp),
            (9, WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_RECV, 200, Some(4242), a.qp.qp_num(), b.qpn)
        );
        assert_eq!(&a.bytes()[4096..4296], &pattern(42, 200)[..]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        b.exit();
    }

    #[test]
    fn rdma_write_and_write_with_imm_across_processes() {
        let (_c, mut a, mut b) = setup(Opts::default());
        let data = pattern(17, 5000);
        a.write(0, &data);
        post_send(
            &a.qp,
            &[wr(1, &[a.sge(0, 5000)], SendOp::RdmaWrite { remote_addr: b.mr_addr + 1000, rkey: b.rkey })],
        )
        .unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "write").status, WcStatus::IBV_WC_SUCCESS);
        assert_eq!(b.read(1000, 5000), data);
        assert_eq!(b.cmd("idle rcq"), ["0"], "a WRITE consumes no receive");
        assert_eq!(b.cmd("recv 8 0 16"), ["ok"]);
        let remote_addr = b.mr_addr + 20_000;
        post_send(
            &a.qp,
            &[wr(2, &[a.sge(0, 100)], SendOp::RdmaWriteWithImm { remote_addr, rkey: b.rkey, imm: 7 })],
        )
        .unwrap();
        let r = b.poll("rcq", 1);
        assert_eq!(
            (r[0].wr_id, r[0].opcode.as_str(), r[0].byte_len, r[0].imm),
            (8, name(WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM).as_str(), 100, Some(7))
        );
        assert_eq!(b.read(20_000, 100), &data[..100]);
        b.exit();
    }

    #[test]
    fn rdma_read_across_processes() {
        let (_c, a, mut b) = setup(Opts::default());
        assert_eq!(b.cmd("fill 300 3000 77"), ["ok"]);
        post_send(
            &a.qp,
            &[wr(4, &[a.sge(8192, 3000)], SendOp::RdmaRead { remote_addr: b.mr_addr + 300, rkey: b.rkey })],
        )
        .unwrap();
        let w = poll_one::<H, _>(&a.scq, "read");
        assert_eq!(
            (w.status, w.opcode, w.byte_len),
            (WcStatus::IBV_WC_SUCCESS, WcOpcode::IBV_WC_RDMA_READ, 3000)
        );
        assert_eq!(&a.bytes()[8192..11192], &pattern(77, 3000)[..]);
        b.exit();
    }

    #[test]
    fn rnr_waits_for_the_other_process_then_delivers() {
        let (_c, a, mut b) = setup(Opts { min_rnr_timer: 1, ..Opts::default() });
        post_send(&a.qp, &[wr(1, &[a.sge(0, 32)], SendOp::Send)]).unwrap();
        assert_eq!(b.cmd("idle rcq"), ["0"]);
        assert_eq!(b.cmd("recv 1 0 64"), ["ok"]);
        assert_eq!(b.poll("rcq", 1)[0].byte_len, 32);
        assert_eq!(poll_one::<H, _>(&a.scq, "send after RNR").status, WcStatus::IBV_WC_SUCCESS);
        b.exit();
    }

    #[test]
    fn rnr_retries_exhausted_across_processes() {
        let opts = Opts { rnr_retry: 1, min_rnr_timer: 1, ..Opts::default() };
        let (_c, a, b) = setup(opts);
        post_send(&a.qp, &[wr(1, &[a.sge(0, 8)], SendOp::Send), wr(2, &[a.sge(0, 8)], SendOp::Send)])
            .unwrap();
        let w = poll_n::<H, _>(&a.scq, 2, "RNR failure and flush");
        assert_eq!(
            w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::IBV_WC_RNR_RETRY_EXC_ERR), (2, WcStatus::IBV_WC_WR_FLUSH_ERR)]
        );
        assert_eq!(a.qp.state(), QpState::Err);
        b.exit();
    }

    #[test]
    fn remote_access_error_moves_both_sides_to_err() {
        let (_c, a, mut b) = setup(Opts::default());
        assert_eq!(b.cmd("recv 31 0 64"), ["ok"]);
        let s = [a.sge(0, 64)];
        let bad = wr(1, &s, SendOp::RdmaWrite { remote_addr: b.mr_addr, rkey: b.rkey ^ 0x5_0000 });
        post_send(&a.qp, &[bad, wr(2, &[a.sge(0, 8)], SendOp::Send)]).unwrap();
        let w = poll_n::<H, _>(&a.scq, 2, "remote access error and flush");
        assert_eq!(
            w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::IBV_WC_REM_ACCESS_ERR), (2, WcStatus::IBV_WC_WR_FLUSH_ERR)]
        );
        assert_eq!(a.qp.state(), QpState::Err);
        assert_eq!(b.cmd("state"), [name(QpState::Err)], "the responder QP (other process) goes to ERR");
        let r = b.poll("rcq", 1);
        assert_eq!((r[0].wr_id, r[0].status.as_str()), (31, name(WcStatus::IBV_WC_WR_FLUSH_ERR).as_str()));
        b.exit();
    }

    #[test]
    fn write_out_of_the_peers_bounds_is_remote_access_error() {
        let (_c, a, b) = setup(Opts::default());
        let remote_addr = b.mr_addr + (1 << 16) - 10;
        post_send(&a.qp, &[wr(1, &[a.sge(0, 64)], SendOp::RdmaWrite { remote_addr, rkey: b.rkey })]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "out of bounds").status, WcStatus::IBV_WC_REM_ACCESS_ERR);
        b.exit();
    }

    #[test]
    fn killed_peer_fails_sends_with_retry_exceeded_and_leaves_no_segment() {
        let opts = Opts { timeout: 8, retry_cnt: 2, ..Opts::default() };
        let (_c, a, mut b) = setup(opts);
        let pid = b.pid();
        assert_eq!(b.cmd("recv 1 0 64"), ["ok"]);
        post_send(&a.qp, &[wr(1, &[a.sge(0, 8)], SendOp::Send)]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "send to the live peer").status, WcStatus::IBV_WC_SUCCESS);
        assert_eq!(segments_of(pid).len(), 1, "the child's host segment exists while it runs");
        b.kill();
        // The monitor notices the pid is gone: the host is dead, its segment unlinked.
        wait_until::<H>("the dead child's segment to be removed", || segments_of(pid).is_empty());
        post_send(&a.qp, &[wr(2, &[a.sge(0, 8)], SendOp::Send), wr(3, &[a.sge(0, 8)], SendOp::Send)])
            .unwrap();
        let w = poll_n::<H, _>(&a.scq, 2, "sends to a dead peer");
        assert_eq!(
            w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(2, WcStatus::IBV_WC_RETRY_EXC_ERR), (3, WcStatus::IBV_WC_WR_FLUSH_ERR)]
        );
        assert_eq!(a.qp.state(), QpState::Err);
    }

    #[test]
    fn normal_exit_leaves_no_segment() {
        let (_c, _a, b) = setup(Opts::default());
        let pid = b.pid();
        assert_eq!(segments_of(pid).len(), 1);
        b.exit();
        assert_eq!(segments_of(pid), Vec::<String>::new());
        assert!(!segments_of(std::process::id()).is_empty(), "ours stays while our host lives");
    }

    #[test]
    fn memory_deregistered_while_a_peer_process_maps_the_host_is_reusable_at_once() {
        let (_c, a, mut b) = setup(Opts::default());
        // The child writes into our MR: it has mapped our segment and holds a reader slot there.
        assert_eq!(b.cmd("fill 0 64 5"), ["ok"]);
        let w = format!("send 1 write 0 64 {} {} 0", a.mr.addr(), a.mr.rkey());
        assert_eq!(b.cmd(&w), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        assert_eq!(&a.bytes()[..64], &pattern(5, 64)[..]);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let first = a.pd.reg_mr(1 << 20, access).unwrap();
        let (addr, rkey) = (first.addr(), first.rkey());
        drop(first);
        // No transfer of the peer is in progress: the grace period is over at once and the
        // range is free again (a fixed quarantine kept it out of reuse for a second).
        let second = a.pd.reg_mr(1 << 20, access).unwrap();
        assert_eq!(second.addr(), addr, "the freed range is reused at once");
        // The old key stays dead for the peer; the new one works.
        let w = format!("send 2 write 0 64 {addr} {rkey} 0");
        assert_eq!(b.cmd(&w), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_REM_ACCESS_ERR));
        drop(second);
        // A killed peer's slot does not hold deregistration up either.
        b.kill();
        let t0 = std::time::Instant::now();
        drop(a);
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_peer_process_follows_the_segment_as_it_grows() {
        let (_c, a, mut b) = setup(Opts::default());
        // The child maps our segment (the part in use, a few MiB) at its first transfer.
        assert_eq!(b.cmd("fill 0 64 5"), ["ok"]);
        assert_eq!(b.cmd(&format!("send 1 write 0 64 {} {} 0", a.mr.addr(), a.mr.rkey())), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mib = 1usize << 20;
        // A SEND into a receive buffer past the child's mapping: it maps us again, larger.
        let big = a.pd.reg_mr(64 * mib, access).unwrap();
        post_recv(&a.qp, &[RecvWr { wr_id: 7, sg_list: &[big.sge(64 * mib - 4096, 256)] }]).unwrap();
        assert_eq!(b.cmd("send 2 send 0 64 0 0 0"), ["ok"]);
        let r = poll_one::<H, _>(&a.rcq, "the child's send into the grown segment");
        assert_eq!((r.wr_id, r.status, r.byte_len), (7, WcStatus::IBV_WC_SUCCESS, 64));
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        // Read back by the child (RDMA READ from the grown part) into its MR at 1000.
        let rd = format!("send 3 read 1000 64 {} {} 0", big.addr() + (64 * mib - 4096) as u64, big.rkey());
        assert_eq!(b.cmd(&rd), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        assert_eq!(b.read(1000, 64), pattern(5, 64));
        // Grown again: an RDMA WRITE to the last bytes of a second large region, read back.
        let bigger = a.pd.reg_mr(128 * mib, access).unwrap();
        let end = bigger.addr() + (128 * mib - 64) as u64;
        assert_eq!(b.cmd(&format!("send 4 write 0 64 {end} {} 0", bigger.rkey())), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        assert_eq!(b.cmd(&format!("send 5 read 2000 64 {end} {} 0", bigger.rkey())), ["ok"]);
        assert_eq!(b.poll("scq", 1)[0].status, name(WcStatus::IBV_WC_SUCCESS));
        assert_eq!(b.read(2000, 64), pattern(5, 64));
        b.exit();
    }

    #[test]
    fn completion_event_wakes_a_waiter_from_the_other_process() {
        let opts = Opts { events: true, ..Opts::default() };
        let (_c, a, mut b) = setup(opts);
        post_recv(&a.qp, &[RecvWr { wr_id: 4, sg_list: &[a.sge(0, 64)] }]).unwrap();
        a.rcq.req_notify(false).unwrap();
        let waiter = std::thread::scope(|s| {
            let h = s.spawn(|| a.rcq.wait(Some(std::time::Duration::from_secs(10))));
            assert_eq!(b.cmd("send 1 send 0 16 0 0 0"), ["ok"]);
            h.join().unwrap()
        });
        assert!(waiter.unwrap(), "the child's completion woke the waiter (not the hang guard)");
        let w = poll_one::<H, _>(&a.rcq, "the child's send");
        assert_eq!((w.wr_id, w.status, w.byte_len), (4, WcStatus::IBV_WC_SUCCESS, 16));
        b.exit();
    }
}

/// Sim-only memory-window cases: refusals with exact statuses, what MR deregistration does to a
/// window, a wrong SEND_WITH_INV (see `rpc_core::verbs::sim`, `sim/mw.rs`).
mod sim_mw {
    use rpc_core::verbs::sim::Sim;
    use rpc_core::verbs::{
        inc_rkey, AccessFlags, Context, DeviceSelector, MemoryRegion, MemoryWindow, MwBind, MwType,
        ProtectionDomain, Provider, QpState, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge, VerbsError,
        WcOpcode, WcStatus,
    };

    use crate::conformance::{connect_qps, pair, poll_one, post_recv, post_send, DeviceHarness, Node, Opts};

    type H = DeviceHarness<Sim>;

    fn opts() -> Opts {
        Opts { mr_access: Opts::default().mr_access | AccessFlags::MW_BIND, ..Opts::default() }
    }

    fn wr(wr_id: u64, sg_list: &[Sge], op: SendOp) -> SendWr<'_> {
        SendWr { wr_id, sg_list, op, flags: SendFlags::SIGNALED }
    }

    fn nodes() -> (Node<H>, Node<H>) {
        let ca = Sim::open(&DeviceSelector::First).unwrap();
        let cb = Sim::open(&DeviceSelector::First).unwrap();
        pair::<H>(&ca, &cb, opts())
    }

    fn rw() -> AccessFlags {
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
    }

    /// Posts a bind on `n`'s QP and returns its completion status.
    fn bind_status<M: MemoryRegion>(
        n: &Node<H>,
        mw: &rpc_core::verbs::sim::SimMw,
        rkey: u32,
        mr: &M,
        off: u64,
        len: u64,
    ) -> WcStatus {
        let bind = MwBind { mr: mr.handle(), addr: mr.addr() + off, length: len, access: rw() };
        post_send(&n.qp, &[wr(9, &[], SendOp::BindMw { mw: mw.handle(), rkey, bind })]).unwrap();
        let w = poll_one::<H, _>(&n.scq, "bind");
        assert!(w.status.is_success() || n.qp.state() == QpState::Err, "a failed bind moves the QP to ERR");
        w.status
    }

    fn write(a: &Node<H>, remote_addr: u64, rkey: u32) -> WcStatus {
        post_send(&a.qp, &[wr(1, &[a.sge(0, 8)], SendOp::RdmaWrite { remote_addr, rkey })]).unwrap();
        poll_one::<H, _>(&a.scq, "write").status
    }

    #[test]
    fn capabilities_and_types() {
        let (_a, b) = nodes();
        let attr = b.ctx.attr();
        assert!(attr.mw_type2);
        assert_eq!(attr.max_mw, 65_536);
        assert!(matches!(b.pd.alloc_mw(MwType::Type1), Err(VerbsError::InvalidArgument { .. })));
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        assert_eq!(mw.mw_type(), MwType::Type2);
        assert_ne!(mw.rkey() & (1 << 31), 0, "window keys are told from MR keys by bit 31");
        // BIND_MW and LOCAL_INV take no SGEs.
        let bind = MwBind { mr: b.mr.handle(), addr: b.mr.addr(), length: 64, access: rw() };
        let op = SendOp::BindMw { mw: mw.handle(), rkey: inc_rkey(mw.rkey()), bind };
        let e = post_send(&b.qp, &[wr(1, &[b.sge(0, 8)], op)]).unwrap_err();
        assert!(matches!(e, VerbsError::BadWorkRequest { index: 0, .. }), "{e}");
    }

    #[test]
    fn bind_refusals_are_mw_bind_errors() {
        // A window of another PD than the QP's (C10-72).
        let (_a, b) = nodes();
        let other = b.ctx.alloc_pd().unwrap();
        let mw = other.alloc_mw(MwType::Type2).unwrap();
        assert_eq!(bind_status(&b, &mw, inc_rkey(mw.rkey()), &b.mr, 0, 64), WcStatus::IBV_WC_MW_BIND_ERR);
        // A new rkey that does not keep the window's upper 24 bits.
        let (_a, b) = nodes();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        assert_eq!(bind_status(&b, &mw, mw.rkey() ^ (1 << 20), &b.mr, 0, 64), WcStatus::IBV_WC_MW_BIND_ERR);
        // Zero length (o10-37.2.40), and a range leaving the MR (C10-75).
        let (_a, b) = nodes();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        assert_eq!(bind_status(&b, &mw, inc_rkey(mw.rkey()), &b.mr, 0, 0), WcStatus::IBV_WC_MW_BIND_ERR);
        let (_a, b) = nodes();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let len = b.mr.len() as u64;
        assert_eq!(bind_status(&b, &mw, inc_rkey(mw.rkey()), &b.mr, 8, len), WcStatus::IBV_WC_MW_BIND_ERR);
    }

    #[test]
    fn local_inv_of_what_is_not_a_window_is_a_local_qp_error() {
        for what in ["an MR's rkey", "a deallocated window's rkey"] {
            let (_a, b) = nodes();
            let rkey = if what.contains("MR") {
                b.mr.rkey()
            } else {
                let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
                mw.rkey()
            };
            post_send(&b.qp, &[wr(3, &[], SendOp::LocalInv { rkey })]).unwrap();
            let w = poll_one::<H, _>(&b.scq, what);
            assert_eq!(
                (w.status, w.opcode),
                (WcStatus::IBV_WC_LOC_QP_OP_ERR, WcOpcode::IBV_WC_LOCAL_INV),
                "{what}"
            );
            assert_eq!(b.qp.state(), QpState::Err);
        }
    }

    #[test]
    fn windows_die_with_their_mr() {
        let (mut a, b) = nodes();
        let m2 = b.pd.reg_mr(8192, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).unwrap();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        assert_eq!(bind_status(&b, &mw, rkey, &m2, 0, 4096), WcStatus::IBV_WC_SUCCESS);
        a.write(0, b"m2 bytes");
        assert_eq!(write(&a, m2.addr(), rkey), WcStatus::IBV_WC_SUCCESS);
        let mut got = [0u8; 8];
        m2.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"m2 bytes");
        let addr = m2.addr();
        drop(m2);
        assert_eq!(write(&a, addr, rkey), WcStatus::IBV_WC_REM_ACCESS_ERR, "the window died with its MR");
        assert_eq!(mw.rkey(), rkey, "the window itself lives on");
    }

    /// BIND_MW and LOCAL_INV are WQEs like any other: executed unsignaled, they keep their
    /// send-queue slots until a signaled completion at or after them is polled (and a failed one
    /// retires its slot and everything before it with its error completion).
    #[test]
    fn window_wrs_hold_send_queue_slots_until_a_covering_completion_is_polled() {
        let ca = Sim::open(&DeviceSelector::First).unwrap();
        let cb = Sim::open(&DeviceSelector::First).unwrap();
        let o = Opts { cap: rpc_core::verbs::QpCap { max_send_wr: 8, ..opts().cap }, ..opts() };
        let (_a, b) = pair::<H>(&ca, &cb, o);
        let depth = b.qp.cap().max_send_wr as u64;
        assert_eq!(depth % 2, 0, "binds and invalidations alternate; the last WR is a LOCAL_INV");
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let bind = |rkey: u32| {
            let bind = MwBind { mr: b.mr.handle(), addr: b.mr.addr(), length: 64, access: rw() };
            SendOp::BindMw { mw: mw.handle(), rkey, bind }
        };
        let unsig = |wr_id: u64, op: SendOp| SendWr { wr_id, sg_list: &[], op, flags: SendFlags::EMPTY };
        // depth - 1 unsignaled window WRs (bind, invalidate, bind, ...), then a signaled one.
        let mut rkey = mw.rkey();
        let mut ops = Vec::new();
        for i in 0..depth {
            let op = if i % 2 == 0 {
                rkey = inc_rkey(rkey);
                bind(rkey)
            } else {
                SendOp::LocalInv { rkey }
            };
            ops.push(op);
        }
        for (i, op) in ops.iter().enumerate().take(depth as usize - 1) {
            post_send(&b.qp, &[unsig(i as u64, *op)]).expect("fits");
        }
        crate::conformance::assert_empty(&b.scq, "unsignaled window WRs");
        let last = SendWr { flags: SendFlags::SIGNALED, ..unsig(depth - 1, ops[depth as usize - 1]) };
        post_send(&b.qp, &[last]).expect("the last slot");
        // Another bind (the last WR was a LOCAL_INV: the window is free).
        let one_more = unsig(50, bind(inc_rkey(rkey)));
        match post_send(&b.qp, &[one_more]) {
            Err(VerbsError::BadWorkRequest { index: 0, reason, .. }) => {
                assert!(reason.contains("work queue is full"), "{reason}")
            }
            other => panic!("expected a full send queue, got {other:?}"),
        }
        let w = poll_one::<H, _>(&b.scq, "the signaled window WR");
        assert_eq!((w.wr_id, w.status), (depth - 1, WcStatus::IBV_WC_SUCCESS));
        assert_eq!(w.opcode, WcOpcode::IBV_WC_LOCAL_INV);
        // Polled: every slot is free again.
        post_send(&b.qp, &[one_more]).expect("room after the poll");
        assert_eq!(b.qp.state(), QpState::Rts);
    }

    /// A window over an MR registered from caller memory (`reg_user_mr`, whose pointer lives in
    /// the owner's private table, not in the shared key table): WRITE and READ through it land
    /// in the caller's bytes, within the window only, and it dies with its MR.
    #[test]
    fn a_window_over_caller_memory_reaches_the_callers_bytes() {
        let (mut a, b) = nodes();
        let mut mem = vec![0u8; 8192];
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        // SAFETY: `mem` outlives the MR (dropped before it, below).
        let user = unsafe { b.pd.reg_user_mr(mem.as_mut_ptr(), mem.len(), access) }.unwrap();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        assert_eq!(bind_status(&b, &mw, rkey, &user, 1024, 256), WcStatus::IBV_WC_SUCCESS);
        let win = user.addr() + 1024;
        a.write(0, b"callers!");
        assert_eq!(write(&a, win + 8, rkey), WcStatus::IBV_WC_SUCCESS);
        let mut got = [0u8; 8];
        user.read_at(1032, &mut got).unwrap();
        assert_eq!(&got, b"callers!", "written into the caller's memory through the window");
        user.read_at(1024 + 200, &mut got).unwrap();
        assert_eq!(got, [0; 8]);
        // READ back into `a` at 512.
        let rd = SendOp::RdmaRead { remote_addr: win + 8, rkey };
        post_send(&a.qp, &[wr(2, &[a.sge(512, 8)], rd)]).unwrap();
        assert_eq!(poll_one::<H, _>(&a.scq, "read").status, WcStatus::IBV_WC_SUCCESS);
        assert_eq!(a.read(512, 8), b"callers!");
        drop(user);
        assert_eq!(write(&a, win, rkey), WcStatus::IBV_WC_REM_ACCESS_ERR, "the window died with its MR");
        assert_eq!(&mem[1032..1040], b"callers!");
        assert_eq!(mem[1024..1032], [0; 8], "nothing written after the deregistration");
        drop(mw);
    }

    /// Past the window's end (still inside the caller-memory MR): a remote access error.
    #[test]
    fn a_window_over_caller_memory_stops_at_its_end() {
        let (mut a, b) = nodes();
        let mut mem = vec![0u8; 8192];
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        // SAFETY: `mem` outlives the MR (dropped before it, below).
        let user = unsafe { b.pd.reg_user_mr(mem.as_mut_ptr(), mem.len(), access) }.unwrap();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        assert_eq!(bind_status(&b, &mw, rkey, &user, 1024, 256), WcStatus::IBV_WC_SUCCESS);
        a.write(0, b"overflow");
        assert_eq!(write(&a, user.addr() + 1024 + 252, rkey), WcStatus::IBV_WC_REM_ACCESS_ERR);
        drop(mw);
        drop(user);
        assert!(mem.iter().all(|&x| x == 0), "nothing written");
    }

    #[test]
    fn send_with_inv_of_a_window_of_another_qp_is_a_responder_error() {
        let ca = Sim::open(&DeviceSelector::First).unwrap();
        let cb = Sim::open(&DeviceSelector::First).unwrap();
        let (_a, b) = pair::<H>(&ca, &cb, opts());
        let c = Node::<H>::new(&ca, opts());
        let q2 = b.extra_qp();
        connect_qps(&c, &c.qp, &b, &q2);
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        assert_eq!(bind_status(&b, &mw, rkey, &b.mr, 0, 64), WcStatus::IBV_WC_SUCCESS);
        // c is connected to q2; the window is bound to b.qp.
        post_recv(&q2, &[RecvWr { wr_id: 5, sg_list: &[b.sge(1024, 64)] }]).unwrap();
        post_send(&c.qp, &[wr(6, &[c.sge(0, 4)], SendOp::SendWithInv { invalidate_rkey: rkey })]).unwrap();
        assert_eq!(poll_one::<H, _>(&c.scq, "SEND_WITH_INV").status, WcStatus::IBV_WC_REM_INV_REQ_ERR);
        let r = poll_one::<H, _>(&b.rcq, "its receive");
        assert_eq!((r.wr_id, r.status, r.invalidated_rkey), (5, WcStatus::IBV_WC_REM_INV_REQ_ERR, None));
        assert_eq!((c.qp.state(), q2.state(), b.qp.state()), (QpState::Err, QpState::Err, QpState::Rts));
        assert_eq!(mw.rkey(), rkey, "the window was not invalidated");
    }
}
