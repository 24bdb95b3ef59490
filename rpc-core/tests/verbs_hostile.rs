//! Hostile inputs and races against the software NIC: what a careless or unlucky caller can do
//! through the public verbs API. Every case asserts values (statuses, indexes, bytes); none
//! asserts a duration.
//!
//! Run: `cargo test -p rpc-core --test verbs_hostile`.
#![allow(unsafe_code)] // Posting WRs is `unsafe` by contract; see `conformance::post_send`.

#[macro_use]
#[allow(unused_macros)]
mod conformance;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpc_core::verbs::sim::{Sim, SimContext};
use rpc_core::verbs::{
    CompletionQueue, DeviceSelector, MemoryRegion, Provider, QpAttr, QpState, QueuePair, RecvWr, SendFlags,
    SendOp, SendWr, Sge, VerbsError, WcStatus, WorkCompletion,
};

use conformance::{assert_empty, pair, poll_n, poll_one, post_recv, post_send, DeviceHarness, Opts};

type H = DeviceHarness<Sim>;

const SIG: SendFlags = SendFlags::SIGNALED;

fn hosts() -> (SimContext, SimContext) {
    (Sim::open(&DeviceSelector::First).unwrap(), Sim::open(&DeviceSelector::First).unwrap())
}

fn send(wr_id: u64, sg_list: &[Sge], flags: SendFlags) -> SendWr<'_> {
    SendWr { wr_id, sg_list, op: SendOp::Send, flags }
}

fn statuses(w: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// `wait` with a timeout too large to add to `Instant::now()` means "forever", not a panic.
#[test]
fn cq_wait_with_a_huge_timeout_returns_the_pending_event() {
    let (ca, cb) = hosts();
    let (a, b) = pair::<H>(&ca, &cb, Opts { events: true, ..Opts::default() });
    post_recv(&b.qp, &[RecvWr { wr_id: 1, sg_list: &[b.sge(0, 64)] }]).unwrap();
    b.rcq.req_notify(false).unwrap();
    post_send(&a.qp, &[send(1, &[a.sge(0, 8)], SIG)]).unwrap();
    let woke = b.rcq.wait(Some(Duration::MAX)).expect("wait with Duration::MAX");
    assert!(woke, "the receive's event was pending");
    assert_eq!(poll_one::<H, _>(&b.rcq, "the receive").wr_id, 1);
}

/// A post list with a bad WR in the middle, on a QP in ERR: the WRs before it were posted
/// (the error says so), so each of them completes with a flush error like any WR posted in ERR.
#[test]
fn bad_wr_mid_list_in_err_still_flushes_the_ones_posted_before_it() {
    let (ca, cb) = hosts();
    let (a, _b) = pair::<H>(&ca, &cb, Opts::default());
    a.qp.modify(&QpAttr::new(QpState::Err)).unwrap();
    let s = [a.sge(0, 8)];
    let too_many: Vec<Sge> = (0..a.qp.cap().max_send_sge as usize + 1).map(|i| a.sge(i * 8, 8)).collect();
    let wrs = [send(1, &s, SIG), send(2, &s, SendFlags::EMPTY), send(3, &too_many, SIG), send(4, &s, SIG)];
    match post_send(&a.qp, &wrs) {
        Err(VerbsError::BadWorkRequest { index, .. }) => assert_eq!(index, 2),
        other => panic!("expected BadWorkRequest at #2, got {other:?}"),
    }
    let w = poll_n::<H, _>(&a.scq, 2, "flushes of the two WRs posted before the bad one");
    assert_eq!(statuses(&w), [(1, WcStatus::IBV_WC_WR_FLUSH_ERR), (2, WcStatus::IBV_WC_WR_FLUSH_ERR)]);
    assert_empty(&a.scq, "nothing for the bad WR or the one after it");
}

/// The same in RTS: the WRs before the bad one execute, the bad one and later ones do not.
#[test]
fn bad_wr_mid_list_in_rts_posts_the_ones_before_it() {
    let (ca, cb) = hosts();
    let (mut a, b) = pair::<H>(&ca, &cb, Opts::default());
    for i in 0..4u64 {
        post_recv(&b.qp, &[RecvWr { wr_id: 10 + i, sg_list: &[b.sge(i as usize * 64, 64)] }]).unwrap();
    }
    a.write(0, b"0123456789abcdef");
    let s0 = [a.sge(0, 8)];
    let s1 = [a.sge(8, 8)];
    let big = vec![0u8; 1024];
    let inline_over = [Sge { addr: big.as_ptr() as u64, length: 1024, lkey: 0 }];
    let wrs = [send(1, &s0, SIG), send(2, &s1, SIG), send(3, &inline_over, SIG | SendFlags::INLINE)];
    match post_send(&a.qp, &wrs) {
        Err(VerbsError::BadWorkRequest { index, .. }) => assert_eq!(index, 2),
        other => panic!("expected BadWorkRequest at #2, got {other:?}"),
    }
    let w = poll_n::<H, _>(&a.scq, 2, "the two good sends");
    assert_eq!(statuses(&w), [(1, WcStatus::IBV_WC_SUCCESS), (2, WcStatus::IBV_WC_SUCCESS)]);
    let r = poll_n::<H, _>(&b.rcq, 2, "the two receives");
    assert_eq!(r.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(), [(10, 8), (11, 8)]);
    assert_eq!(&b.bytes()[..8], b"01234567");
    assert_eq!(&b.bytes()[64..72], b"89abcdef");
    assert_empty(&a.scq, "nothing for the refused WR");
    assert_eq!(a.qp.state(), QpState::Rts, "a refused post does not break the QP");
}

/// The same for receives: the ones before the bad WR are posted and used, in order.
#[test]
fn bad_recv_wr_mid_list_posts_the_ones_before_it() {
    let (ca, cb) = hosts();
    let (a, b) = pair::<H>(&ca, &cb, Opts::default());
    let one = [b.sge(0, 64)];
    let two = [b.sge(64, 64)];
    let too_many: Vec<Sge> = (0..b.qp.cap().max_recv_sge as usize + 1).map(|i| b.sge(i * 8, 8)).collect();
    let wrs = [
        RecvWr { wr_id: 1, sg_list: &one },
        RecvWr { wr_id: 2, sg_list: &two },
        RecvWr { wr_id: 3, sg_list: &too_many },
    ];
    match post_recv(&b.qp, &wrs) {
        Err(VerbsError::BadWorkRequest { index, .. }) => assert_eq!(index, 2),
        other => panic!("expected BadWorkRequest at #2, got {other:?}"),
    }
    let s = [a.sge(0, 8)];
    post_send(&a.qp, &[send(1, &s, SIG), send(2, &s, SIG)]).unwrap();
    let r = poll_n::<H, _>(&b.rcq, 2, "two receives");
    assert_eq!(statuses(&r), [(1, WcStatus::IBV_WC_SUCCESS), (2, WcStatus::IBV_WC_SUCCESS)]);
}

/// Two threads, each with its own QP on its own host, SEND to two QPs of a third host that
/// share one SRQ and one receive CQ, while the receiving thread polls and reposts. Every
/// message arrives once, intact, and each sender's messages arrive in its order.
#[test]
fn two_senders_into_one_srq_and_cq_lose_nothing() {
    use rpc_core::verbs::{ProtectionDomain, QpInitAttr, SharedReceiveQueue};
    const N: u64 = 3000;
    const SLOTS: usize = 64;
    let ca1 = Sim::open(&DeviceSelector::First).unwrap();
    let ca2 = Sim::open(&DeviceSelector::First).unwrap();
    let cb = Sim::open(&DeviceSelector::First).unwrap();
    let b = conformance::Node::<H>::new(&cb, Opts { srq_depth: SLOTS as u32, cqe: 4096, ..Opts::default() });
    let srq = b.srq.clone().unwrap();
    let slots: Vec<[Sge; 1]> = (0..SLOTS).map(|i| [b.sge(i * 64, 64)]).collect();
    let wrs: Vec<RecvWr<'_>> = (0..SLOTS).map(|i| RecvWr { wr_id: i as u64, sg_list: &slots[i] }).collect();
    // SAFETY: the slots lie in b's MR, alive until the end of the test.
    unsafe { srq.post_recv(&wrs) }.unwrap();
    let senders: Vec<_> = [(ca1, 1u64), (ca2, 2u64)]
        .into_iter()
        .map(|(ca, tag)| {
            let a = conformance::Node::<H>::new(&ca, Opts::default());
            let qb =
                b.pd.create_qp(&QpInitAttr {
                    send_cq: &b.scq,
                    recv_cq: &b.rcq,
                    srq: Some(&srq),
                    cap: b.opts.cap,
                    sq_sig_all: false,
                })
                .unwrap();
            conformance::connect_qps(&a, &a.qp, &b, &qb);
            (a, qb, tag)
        })
        .collect();
    let mut qbs = Vec::new();
    let threads: Vec<_> = senders
        .into_iter()
        .map(|(a, qb, tag)| {
            qbs.push(qb);
            std::thread::spawn(move || {
                for seq in 0..N {
                    let msg = (tag << 56 | seq).to_le_bytes();
                    let sge = [Sge { addr: msg.as_ptr() as u64, length: 8, lkey: 0 }];
                    post_send(&a.qp, &[send(seq, &sge, SIG | SendFlags::INLINE)]).unwrap();
                    let w = poll_one::<H, _>(&a.scq, "send");
                    assert_eq!((w.wr_id, w.status), (seq, WcStatus::IBV_WC_SUCCESS));
                }
                a
            })
        })
        .collect();
    let mut next = [0u64; 3];
    let mut buf = [WorkCompletion::default(); 16];
    let mut got = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while got < 2 * N {
        let n = b.rcq.poll(&mut buf).unwrap();
        for w in &buf[..n] {
            assert_eq!((w.status, w.byte_len), (WcStatus::IBV_WC_SUCCESS, 8), "{w:?}");
            let off = w.wr_id as usize * 64;
            let v = u64::from_le_bytes(b.read(off, 8).try_into().unwrap());
            let (tag, seq) = ((v >> 56) as usize, v & ((1 << 56) - 1));
            assert!(tag == 1 || tag == 2, "garbage {v:#x}");
            assert_eq!(seq, next[tag], "sender {tag} in order");
            assert!(qbs.iter().any(|q| q.qp_num() == w.qp_num));
            next[tag] += 1;
            got += 1;
            let sl = [b.sge(off, 64)];
            // SAFETY: as above.
            unsafe { srq.post_recv(&[RecvWr { wr_id: w.wr_id, sg_list: &sl }]) }.unwrap();
        }
        if n == 0 {
            assert!(std::time::Instant::now() < deadline, "hang guard: {next:?}");
            std::thread::yield_now();
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(next, [0, N, N]);
}

/// A peer RDMA WRITEs in a loop while the target MR is deregistered: every write before
/// completes, the first one after fails with a remote access error (and the QP goes to ERR),
/// and nothing crashes.
#[test]
fn deregistering_the_target_mr_during_a_write_stream() {
    use rpc_core::verbs::{AccessFlags, ProtectionDomain};
    let (ca, cb) = hosts();
    let (a, b) = pair::<H>(&ca, &cb, Opts::default());
    let target = b.pd.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
    let (addr, rkey) = (target.addr(), target.rkey());
    let started = Arc::new(AtomicBool::new(false));
    let s2 = started.clone();
    let writer = std::thread::spawn(move || {
        let mut ok = 0u64;
        loop {
            let op = SendOp::RdmaWrite { remote_addr: addr, rkey };
            post_send(&a.qp, &[SendWr { wr_id: ok, sg_list: &[a.sge(0, 1 << 16)], op, flags: SIG }]).unwrap();
            let w = poll_one::<H, _>(&a.scq, "write");
            if w.status != WcStatus::IBV_WC_SUCCESS {
                return (ok, w.status, a);
            }
            ok += 1;
            if ok == 20 {
                s2.store(true, Ordering::Release);
            }
        }
    });
    // Bounded, and not on a writer that ended (a write failed before 20, or its poll timed out:
    // `join` reports why) and would never set the flag.
    conformance::wait_until::<H>("20 writes to complete", || {
        started.load(Ordering::Acquire) || writer.is_finished()
    });
    drop(target);
    let (ok, status, a) = writer.join().unwrap();
    assert!(ok >= 20);
    assert_eq!(status, WcStatus::IBV_WC_REM_ACCESS_ERR);
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err, "the responder QP goes to ERR too");
}

/// A QP connected to itself: a SEND loops back; a bad rkey faults the QP as requester and
/// responder at once without deadlocking on its own send-queue guard.
#[test]
fn a_qp_connected_to_itself() {
    let (ca, _cb) = hosts();
    let mut a = conformance::Node::<H>::new(&ca, Opts::default());
    let ea = a.endpoint(&a.qp, 0x42);
    rpc_core::verbs::rc::connect(&a.qp, &a.addr.cfg, &ea, &ea).unwrap();
    a.write(0, b"echo");
    post_recv(&a.qp, &[RecvWr { wr_id: 7, sg_list: &[a.sge(100, 16)] }]).unwrap();
    post_send(&a.qp, &[send(1, &[a.sge(0, 4)], SIG)]).unwrap();
    assert_eq!(poll_one::<H, _>(&a.rcq, "loopback receive").byte_len, 4);
    assert_eq!(&a.bytes()[100..104], b"echo");
    post_recv(&a.qp, &[RecvWr { wr_id: 8, sg_list: &[a.sge(200, 16)] }]).unwrap();
    let op = SendOp::RdmaWrite { remote_addr: a.mr.addr(), rkey: a.mr.rkey() ^ 0x10000 };
    post_send(&a.qp, &[SendWr { wr_id: 2, sg_list: &[a.sge(0, 4)], op, flags: SIG }]).unwrap();
    let w = poll_n::<H, _>(&a.scq, 2, "send ok, write failed");
    assert_eq!(statuses(&w), [(1, WcStatus::IBV_WC_SUCCESS), (2, WcStatus::IBV_WC_REM_ACCESS_ERR)]);
    let r = poll_one::<H, _>(&a.rcq, "the receive flushed");
    assert_eq!((r.wr_id, r.status), (8, WcStatus::IBV_WC_WR_FLUSH_ERR));
    assert_eq!(a.qp.state(), QpState::Err);
}

/// The responder's host vanishes while the requester streams SENDs: the stream ends with a
/// retry-exceeded error and flushes, never a hang or a panic.
#[test]
fn a_peer_vanishing_mid_stream() {
    let (ca, cb) = hosts();
    let (a, b) = pair::<H>(&ca, &cb, Opts { timeout: 1, retry_cnt: 2, cqe: 4096, ..Opts::default() });
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let receiver = std::thread::spawn(move || {
        let mut n = 0u64;
        let mut buf = [WorkCompletion::default(); 16];
        while !stop2.load(Ordering::Acquire) {
            let _ = post_recv(&b.qp, &[RecvWr { wr_id: n, sg_list: &[b.sge(0, 64)] }]);
            n += 1;
            let _ = b.rcq.poll(&mut buf);
            std::thread::yield_now();
        }
        b
    });
    let s = [a.sge(0, 8)];
    let mut last = WcStatus::IBV_WC_SUCCESS;
    for i in 0..100_000u64 {
        if i == 50 {
            cb.vanish();
        }
        if post_send(&a.qp, &[send(i, &s, SIG)]).is_err() {
            break;
        }
        last = poll_one::<H, _>(&a.scq, "send").status;
        if last != WcStatus::IBV_WC_SUCCESS {
            break;
        }
    }
    stop.store(true, Ordering::Release);
    let b = receiver.join().unwrap();
    assert_eq!(last, WcStatus::IBV_WC_RETRY_EXC_ERR);
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
}

/// Handles dropped in a hostile order (context, PD and CQ handles before the QP that uses
/// them): the QP keeps working, since it holds its parents.
#[test]
fn parents_dropped_before_the_qp() {
    let (ca, cb) = hosts();
    let (a, b) = pair::<H>(&ca, &cb, Opts::default());
    let conformance::Node { qp, scq, mr, pd, ctx, .. } = a;
    drop((pd, ctx, ca));
    post_recv(&b.qp, &[RecvWr { wr_id: 1, sg_list: &[b.sge(0, 64)] }]).unwrap();
    post_send(&qp, &[send(1, &[mr.sge(0, 8)], SIG)]).unwrap();
    let scq2 = scq.clone();
    drop(scq);
    assert_eq!(poll_one::<H, _>(&scq2, "send").status, WcStatus::IBV_WC_SUCCESS);
    assert_eq!(poll_one::<H, _>(&b.rcq, "recv").status, WcStatus::IBV_WC_SUCCESS);
    drop(qp);
    drop(mr);
}

/// Bad attribute values in a transition get a named error, never a panic or a silent clamp.
#[test]
fn modify_with_out_of_range_values() {
    use rpc_core::verbs::{AhAttr, GlobalRoute, Mtu};
    let (ca, cb) = hosts();
    let a = conformance::Node::<H>::new(&ca, Opts::default());
    let mut init = QpAttr::new(QpState::Init);
    init.port_num = Some(2);
    init.pkey_index = Some(0);
    init.access = Some(rpc_core::verbs::AccessFlags::LOCAL_WRITE);
    assert!(matches!(a.qp.modify(&init), Err(VerbsError::QpTransition { .. })));
    init.port_num = Some(1);
    a.qp.modify(&init).unwrap();
    let rtr = |f: &dyn Fn(&mut QpAttr)| {
        let mut r = QpAttr::new(QpState::Rtr);
        r.path_mtu = Some(Mtu::Mtu1024);
        r.dest_qp_num = Some(0x11);
        r.rq_psn = Some(0);
        r.max_dest_rd_atomic = Some(1);
        r.min_rnr_timer = Some(12);
        r.ah = Some(AhAttr {
            dlid: 0,
            sl: 0,
            port_num: 1,
            grh: Some(GlobalRoute {
                dgid: cb.gid(),
                sgid_index: 0,
                flow_label: 0,
                hop_limit: 64,
                traffic_class: 0,
            }),
        });
        f(&mut r);
        r
    };
    let bad: [&dyn Fn(&mut QpAttr); 5] = [
        &|r| r.dest_qp_num = Some(1 << 24),
        &|r| r.rq_psn = Some(u32::MAX),
        &|r| r.min_rnr_timer = Some(32),
        &|r| r.ah.as_mut().unwrap().grh.as_mut().unwrap().sgid_index = 5,
        &|r| r.ah.as_mut().unwrap().port_num = 0,
    ];
    for f in bad {
        let attr = rtr(f);
        match a.qp.modify(&attr) {
            Err(e @ VerbsError::QpTransition { .. }) => assert!(e.to_string().contains("Rtr"), "{e}"),
            other => panic!("{attr:?}: expected QpTransition, got {other:?}"),
        }
        assert_eq!(a.qp.state(), QpState::Init, "a refused transition changes nothing");
    }
    a.qp.modify(&rtr(&|_| ())).unwrap();
    assert_eq!(a.qp.state(), QpState::Rtr);
}

/// `select_gid` with an index the sim does not have, or a port it does not have.
#[test]
fn select_gid_with_a_wrong_index_or_port() {
    use rpc_core::verbs::gid::select_gid;
    let (ca, _cb) = hosts();
    for idx in [5, 255, 256, i32::MAX] {
        match select_gid::<Sim>(&ca, 1, idx) {
            Err(e @ VerbsError::InvalidArgument { .. }) => {
                assert!(e.to_string().contains(&format!("GID index {idx}")), "{e}")
            }
            other => panic!("index {idx}: expected InvalidArgument, got {other:?}"),
        }
    }
    for port in [0, 2, 255] {
        assert!(matches!(select_gid::<Sim>(&ca, port, -1), Err(VerbsError::InvalidArgument { .. })));
    }
    assert_eq!(select_gid::<Sim>(&ca, 1, i32::MIN).unwrap().gid, ca.gid());
}

/// An inline WR whose gather list has an empty entry with a null address (an `Sge::default()`),
/// queued behind a waiting WR: the empty entry contributes nothing (no null-pointer copy).
#[test]
fn queued_inline_send_with_an_empty_null_sge() {
    let (ca, cb) = hosts();
    let (a, b) = pair::<H>(&ca, &cb, Opts { min_rnr_timer: 1, ..Opts::default() });
    let payload = *b"inline!!";
    let sges = [Sge::default(), Sge { addr: payload.as_ptr() as u64, length: 8, lkey: 0 }, Sge::default()];
    let s = [a.sge(0, 8)];
    // No receive at b yet: #1 waits (RNR), #2 is queued behind it and copied at post time.
    post_send(&a.qp, &[send(1, &s, SIG), send(2, &sges, SIG | SendFlags::INLINE)]).unwrap();
    for i in 0..2u64 {
        post_recv(&b.qp, &[RecvWr { wr_id: i, sg_list: &[b.sge(i as usize * 64, 64)] }]).unwrap();
    }
    let w = poll_n::<H, _>(&a.scq, 2, "both sends");
    assert_eq!(statuses(&w), [(1, WcStatus::IBV_WC_SUCCESS), (2, WcStatus::IBV_WC_SUCCESS)]);
    let r = poll_n::<H, _>(&b.rcq, 2, "both receives");
    assert_eq!(r[1].byte_len, 8);
    assert_eq!(&b.bytes()[64..72], b"inline!!");
}

/// A receive buffer belongs to the caller again once its QP is destroyed (`QueuePair` docs:
/// outstanding WRs are discarded). A peer streaming SENDs into it at that moment must not be
/// writing it after the drop returns: the caller overwrites the buffer right after the drop and
/// finds its own bytes there once the peer has stopped.
#[test]
fn no_write_lands_in_a_receive_buffer_after_its_qp_is_dropped() {
    const LEN: usize = 1 << 20;
    for round in 0..8 {
        let (ca, cb) = hosts();
        let opts = Opts { mr_len: LEN, cqe: 4096, timeout: 1, retry_cnt: 1, ..Opts::default() };
        let (mut a, mut b) = pair::<H>(&ca, &cb, opts);
        a.write(0, &vec![0x5a; LEN]);
        // Every receive WQE scatters into the same buffer: the whole MR.
        let whole = [b.sge(0, LEN as u32)];
        let wrs: Vec<RecvWr<'_>> = (0..64).map(|i| RecvWr { wr_id: i, sg_list: &whole }).collect();
        post_recv(&b.qp, &wrs).unwrap();
        let streaming = Arc::new(AtomicBool::new(true));
        let s2 = streaming.clone();
        let sender = std::thread::spawn(move || {
            let s = [a.sge(0, LEN as u32)];
            let mut i = 0u64;
            while s2.load(Ordering::Acquire) {
                if post_send(&a.qp, &[send(i, &s, SIG)]).is_err() {
                    break;
                }
                if poll_one::<H, _>(&a.scq, "send").status != WcStatus::IBV_WC_SUCCESS {
                    break;
                }
                i += 1;
            }
            a
        });
        // Wait until the stream runs, then destroy the receiving QP in the middle of it.
        poll_one::<H, _>(&b.rcq, "a first receive");
        let spare = b.extra_qp();
        drop(std::mem::replace(&mut b.qp, spare));
        b.write(0, &vec![0xab; LEN]);
        streaming.store(false, Ordering::Release);
        let _a = sender.join().unwrap();
        let stray = b.bytes().iter().filter(|&&x| x != 0xab).count();
        assert_eq!(stray, 0, "round {round}: {stray} bytes written after the QP was dropped");
    }
}

/// Connecting to a QP number nobody has, or to a GID no host has: the connection itself
/// succeeds (as on a NIC: nothing is sent at RTR), and the first SEND fails with retry exceeded.
#[test]
fn connecting_to_a_qp_or_host_that_does_not_exist() {
    use rpc_core::verbs::rc::{connect, Endpoint};
    use rpc_core::verbs::Gid;
    let (ca, cb) = hosts();
    let opts = Opts { timeout: 1, retry_cnt: 1, ..Opts::default() };
    for (what, gid, qp_num) in [
        ("no such QP", cb.gid(), 0x00ab_cdef),
        ("no such host", Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xfe]), 0x11),
    ] {
        let a = conformance::Node::<H>::new(&ca, opts);
        let local = a.endpoint(&a.qp, 1);
        let remote = Endpoint { qp_num, psn: 2, lid: 0, gid, mtu: local.mtu };
        connect(&a.qp, &a.addr.cfg, &local, &remote).expect(what);
        post_send(&a.qp, &[send(1, &[a.sge(0, 8)], SIG), send(2, &[a.sge(0, 8)], SIG)]).unwrap();
        let w = poll_n::<H, _>(&a.scq, 2, what);
        assert_eq!(
            statuses(&w),
            [(1, WcStatus::IBV_WC_RETRY_EXC_ERR), (2, WcStatus::IBV_WC_WR_FLUSH_ERR)],
            "{what}"
        );
        assert_eq!(a.qp.state(), QpState::Err, "{what}");
    }
}
