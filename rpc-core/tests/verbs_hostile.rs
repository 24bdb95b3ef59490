//! Hostile inputs and races against the software NIC: what a careless or unlucky caller can do
//! through the public verbs API. Every case asserts values (statuses, indexes, bytes); none
//! asserts a duration.
//!
//! Run: `cargo test -p rpc-core --test verbs_hostile`.
#![allow(unsafe_code)] // Posting WRs is `unsafe` by contract; see `conformance::post_send`.

#[macro_use]
#[allow(unused_macros)]
mod conformance;

use std::time::Duration;

use rpc_core::verbs::sim::{Sim, SimContext};
use rpc_core::verbs::{
    CompletionQueue, DeviceSelector, Provider, QpAttr, QpState, QueuePair, RecvWr, SendFlags, SendOp, SendWr,
    Sge, VerbsError, WcStatus, WorkCompletion,
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
    a.bytes_mut()[..16].copy_from_slice(b"0123456789abcdef");
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
