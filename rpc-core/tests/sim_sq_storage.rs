//! The software NIC's send queue holds storage only for WQEs that wait (issue 28: memory per
//! idle session). A QP of a 256-WQE send queue (what a 32-credit session asks) holds none when
//! created, none after hundreds of WRs that executed at once, and, once WRs wait (no receive
//! WQE at the peer: RNR), the storage of the most that waited at once, doubling up to the
//! depth; the depth stays what a post is refused beyond, and the waiting WRs (inline bytes
//! included) execute in order with their own data after the storage grew under them.
//! `SimStats::sq_storage_bytes` shows the storage held and gives it back with the QP.
//!
//! Alone in its test binary: it reads the process-wide gauge.
//!
//! Run: `cargo test -p rpc-core --test sim_sq_storage`.
#![allow(unsafe_code)] // posting WRs is `unsafe` by contract.

#[allow(unused_macros)]
mod conformance;

use rpc_core::verbs::sim::{self, Sim};
use rpc_core::verbs::{
    DeviceSelector, MemoryRegion, Provider, QpCap, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge,
    VerbsError, WcStatus,
};

use conformance::{pair, poll_n, post_recv, post_send, DeviceHarness, Opts};

type H = DeviceHarness<Sim>;

const DEPTH: usize = 256;
const MAX_INLINE: usize = 64;

#[test]
fn a_send_queue_stores_only_the_wqes_that_wait_and_keeps_its_depth() {
    let ca = Sim::open(&DeviceSelector::First).unwrap();
    let cb = Sim::open(&DeviceSelector::First).unwrap();
    let base = sim::stats().sq_storage_bytes;
    let opts = Opts {
        cap: QpCap {
            max_send_wr: DEPTH as u32,
            max_recv_wr: DEPTH as u32,
            max_inline_data: MAX_INLINE as u32,
            ..Opts::default().cap
        },
        // The shortest RNR timer: a waiting SEND retries soon once a receive is posted.
        min_rnr_timer: 1,
        mr_len: 1 << 16,
        cqe: 1024,
        ..Opts::default()
    };
    let (mut a, b) = pair::<H>(&ca, &cb, opts);
    assert_eq!(a.qp.cap().max_send_wr as usize, DEPTH);
    assert_eq!(a.qp.sq_storage_wqes(), 0, "a new QP stores no WQE");
    assert_eq!(sim::stats().sq_storage_bytes, base, "nor does its peer");

    // Hundreds of WRITEs, each executed at once (the fast path): nothing is stored.
    a.write(0, &[7u8; 64]);
    let s = [a.sge(0, 64)];
    for round in 0..3u64 {
        let wrs: Vec<SendWr<'_>> = (0..100u64)
            .map(|i| SendWr {
                wr_id: round * 100 + i,
                sg_list: &s,
                op: SendOp::RdmaWrite { remote_addr: b.mr.addr() + 32768, rkey: b.mr.rkey() },
                flags: SendFlags::SIGNALED,
            })
            .collect();
        post_send(&a.qp, &wrs).expect("100 WRITEs");
        let wcs = poll_n::<H, _>(&a.scq, 100, "the WRITEs");
        assert!(wcs.iter().all(|w| w.status == WcStatus::IBV_WC_SUCCESS), "{wcs:?}");
    }
    assert_eq!(a.qp.sq_storage_wqes(), 0, "WRs executed at once are never stored");
    assert_eq!(sim::stats().sq_storage_bytes, base);

    // No receive WQE at b: the first SEND waits (RNR, rnr_retry 7: forever), the rest queue.
    // Inline SENDs: their bytes live in the storage's arena, and must survive its growth.
    let payload = |i: usize| -> Vec<u8> { (0..MAX_INLINE).map(|j| (i * 31 + j) as u8).collect() };
    let bufs: Vec<Vec<u8>> = (0..DEPTH).map(payload).collect();
    let sges: Vec<[Sge; 1]> =
        bufs.iter().map(|p| [Sge { addr: p.as_ptr() as u64, length: p.len() as u32, lkey: 0 }]).collect();
    let inline_send = |i: usize| SendWr {
        wr_id: 1000 + i as u64,
        sg_list: &sges[i],
        op: SendOp::Send,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
    };
    post_send(&a.qp, &[inline_send(0), inline_send(1), inline_send(2)]).expect("3 SENDs");
    assert_eq!(a.qp.sq_storage_wqes(), 4, "3 waiting WQEs: the first storage, 4 slots");
    let four = sim::stats().sq_storage_bytes - base;
    assert!(four > 0, "the gauge shows the storage");
    let more: Vec<SendWr<'_>> = (3..6).map(inline_send).collect();
    post_send(&a.qp, &more).expect("3 more SENDs");
    assert_eq!(a.qp.sq_storage_wqes(), 8, "6 waiting: doubled");
    assert_eq!(sim::stats().sq_storage_bytes - base, 2 * four, "the gauge follows");

    // Up to the depth: the storage reaches it, and one WR more is refused (ENOMEM) as before.
    let rest: Vec<SendWr<'_>> = (6..DEPTH).map(inline_send).collect();
    post_send(&a.qp, &rest).expect("the send queue holds its depth");
    assert_eq!(a.qp.sq_storage_wqes(), DEPTH);
    let extra = [a.sge(0, 8)];
    match post_send(
        &a.qp,
        &[SendWr { wr_id: 9, sg_list: &extra, op: SendOp::Send, flags: SendFlags::SIGNALED }],
    ) {
        Err(VerbsError::BadWorkRequest { reason, .. }) => {
            assert!(reason.contains("work queue is full"), "{reason}")
        }
        other => panic!("a post beyond max_send_wr {DEPTH} must be refused, got {other:?}"),
    }

    // Receives at b: every waiting SEND executes, in order, with its own bytes.
    let rs: Vec<[Sge; 1]> = (0..DEPTH).map(|i| [b.sge(i * MAX_INLINE, MAX_INLINE as u32)]).collect();
    let rwrs: Vec<RecvWr<'_>> = (0..DEPTH).map(|i| RecvWr { wr_id: i as u64, sg_list: &rs[i] }).collect();
    post_recv(&b.qp, &rwrs).expect("receives");
    let sent = poll_n::<H, _>(&a.scq, DEPTH, "the waiting SENDs");
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..DEPTH).map(|i| (1000 + i as u64, WcStatus::IBV_WC_SUCCESS)).collect::<Vec<_>>()
    );
    let got = poll_n::<H, _>(&b.rcq, DEPTH, "the receives");
    assert!(got.iter().all(|w| w.status == WcStatus::IBV_WC_SUCCESS), "{got:?}");
    let bytes = b.bytes();
    for (i, p) in bufs.iter().enumerate() {
        assert_eq!(&bytes[i * MAX_INLINE..(i + 1) * MAX_INLINE], &p[..], "SEND #{i}'s inline bytes");
    }
    assert_eq!(a.qp.sq_storage_wqes(), DEPTH, "a QP keeps the storage of the most that waited");

    drop(a);
    drop(b);
    assert_eq!(sim::stats().sq_storage_bytes, base, "a destroyed QP gives its storage back");
}
