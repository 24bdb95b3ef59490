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
use rpc_core::verbs::{CompletionQueue, DeviceSelector, Provider, RecvWr, SendFlags, SendOp, SendWr, Sge};

use conformance::{pair, poll_one, post_recv, post_send, DeviceHarness, Opts};

type H = DeviceHarness<Sim>;

const SIG: SendFlags = SendFlags::SIGNALED;

fn hosts() -> (SimContext, SimContext) {
    (Sim::open(&DeviceSelector::First).unwrap(), Sim::open(&DeviceSelector::First).unwrap())
}

fn send(wr_id: u64, sg_list: &[Sge], flags: SendFlags) -> SendWr<'_> {
    SendWr { wr_id, sg_list, op: SendOp::Send, flags }
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
