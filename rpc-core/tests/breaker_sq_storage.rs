//! Breaking the software NIC's send-queue storage that grows on demand (WQEs stored only while
//! they wait, doubling up to `max_send_wr`): growth while the waiting WQEs wrap around the
//! ring (waits, a partial drain, waits again), inline and non-inline WRs mixed across the
//! growth, and the waiting WQEs flushed in order when the QP moves to ERR.
//!
//! Run: `cargo test -p rpc-core --test breaker_sq_storage`.
#![allow(unsafe_code)] // posting WRs is `unsafe` by contract.

#[allow(unused_macros)]
mod conformance;

use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::{
    DeviceSelector, Provider, QpAttr, QpCap, QpState, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge,
    WcStatus,
};

use conformance::{pair, poll_n, post_recv, post_send, DeviceHarness, Opts};

type H = DeviceHarness<Sim>;

const DEPTH: usize = 64;
const LEN: usize = 32;

fn opts() -> Opts {
    Opts {
        cap: QpCap {
            max_send_wr: DEPTH as u32,
            max_recv_wr: DEPTH as u32,
            max_inline_data: LEN as u32,
            ..Opts::default().cap
        },
        min_rnr_timer: 1,
        mr_len: 1 << 16,
        cqe: 1024,
        ..Opts::default()
    }
}

/// WR `i`'s bytes: inline ones from a heap buffer, the others from `a`'s MR at `i * LEN`.
fn bytes_of(i: usize) -> Vec<u8> {
    (0..LEN).map(|j| (i * 37 + j * 3 + 1) as u8).collect()
}

/// Waits (RNR), a partial drain that leaves the waiting WQEs wrapped around the 4-slot
/// storage, then more waits that grow it twice, inline (odd) and non-inline (even) SENDs mixed
/// at each growth: every SEND lands in order with its own bytes. Then WQEs wait again and the
/// QP is moved to ERR: each waiting WQE completes WR_FLUSH_ERR, in order, none lost. Holds on
/// main. Sabotaged: `SqState::grow` keeping each WQE's old slot index (`to = self.slot(seq)`)
/// instead of its slot in the new ring: "waiting for the waiting SENDs: 6 of 10 completions"
/// (wr_ids 2, 3, 6, 7, 10, 11: the wrapped WQEs were lost).
#[test]
fn growth_while_the_waiting_wqes_wrap_keeps_order_and_bytes() {
    let ca = Sim::open(&DeviceSelector::First).unwrap();
    let cb = Sim::open(&DeviceSelector::First).unwrap();
    let (mut a, b) = pair::<H>(&ca, &cb, opts());
    let bufs: Vec<Vec<u8>> = (0..DEPTH).map(bytes_of).collect();
    for (i, p) in bufs.iter().enumerate() {
        a.write(i * LEN, p);
    }
    let inline_sges: Vec<[Sge; 1]> =
        bufs.iter().map(|p| [Sge { addr: p.as_ptr() as u64, length: LEN as u32, lkey: 0 }]).collect();
    let mr_sges: Vec<[Sge; 1]> = (0..DEPTH).map(|i| [a.sge(i * LEN, LEN as u32)]).collect();
    let wr = |i: usize| {
        if i % 2 == 1 {
            SendWr {
                wr_id: i as u64,
                sg_list: &inline_sges[i],
                op: SendOp::Send,
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            }
        } else {
            SendWr { wr_id: i as u64, sg_list: &mr_sges[i], op: SendOp::Send, flags: SendFlags::SIGNALED }
        }
    };
    let rs: Vec<[Sge; 1]> = (0..DEPTH).map(|i| [b.sge(i * LEN, LEN as u32)]).collect();
    let recv = |range: std::ops::Range<usize>| {
        let rwrs: Vec<RecvWr<'_>> = range.map(|i| RecvWr { wr_id: i as u64, sg_list: &rs[i] }).collect();
        post_recv(&b.qp, &rwrs).expect("receives");
    };
    // Three wait (no receive at b): storage of 4.
    post_send(&a.qp, &[wr(0), wr(1), wr(2)]).unwrap();
    assert_eq!(a.qp.sq_storage_wqes(), 4);
    // Two receives: two SENDs go, one waits at position 2 (slot 2).
    recv(0..2);
    let first = poll_n::<H, _>(&a.scq, 2, "the first two SENDs");
    assert_eq!(
        first.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(0, WcStatus::IBV_WC_SUCCESS), (1, WcStatus::IBV_WC_SUCCESS)]
    );
    // Posts one at a time: positions 3, 4, 5 wrap to slots 3, 0, 1; the next grows to 8
    // with the waiting WQEs wrapped, then 16.
    for i in 3..12 {
        post_send(&a.qp, &[wr(i)]).unwrap();
    }
    assert_eq!(a.qp.sq_storage_wqes(), 16, "10 waiting");
    recv(2..12);
    let rest = poll_n::<H, _>(&a.scq, 10, "the waiting SENDs");
    assert_eq!(
        rest.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (2..12).map(|i| (i as u64, WcStatus::IBV_WC_SUCCESS)).collect::<Vec<_>>()
    );
    let got = poll_n::<H, _>(&b.rcq, 12, "the receives");
    assert!(got.iter().all(|w| w.status == WcStatus::IBV_WC_SUCCESS), "{got:?}");
    let at_b = b.bytes();
    for (i, p) in bufs.iter().enumerate().take(12) {
        assert_eq!(
            &at_b[i * LEN..(i + 1) * LEN],
            &p[..],
            "SEND #{i}'s bytes ({})",
            if i % 2 == 1 { "inline" } else { "from the MR" }
        );
    }

    // They wait again (past the storage held: it grows to 32 with the head at position 12),
    // and the QP fails: each completes WR_FLUSH_ERR in order.
    let again: Vec<SendWr<'_>> = (12..40).map(wr).collect();
    post_send(&a.qp, &again).unwrap();
    assert_eq!(a.qp.sq_storage_wqes(), 32);
    a.qp.modify(&QpAttr::new(QpState::Err)).unwrap();
    let flushed = poll_n::<H, _>(&a.scq, 28, "the flushed SENDs");
    assert_eq!(
        flushed.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (12..40).map(|i| (i as u64, WcStatus::IBV_WC_WR_FLUSH_ERR)).collect::<Vec<_>>()
    );
}
