//! The send queue is never overrun: a send buffer is taken only while the QP's send queue has
//! room for its WRs, and WQEs (inline ones too) are retired only by a polled signaled
//! completion, as hardware (and the software NIC, by default) retires them. Without the room
//! check, posting more WRs than `max_send_wr` before polling fails the post (on a NIC: the
//! session would close).

mod rpc_support;

use rpc_core::buffers::{split_send_wr_id, SendPool, SendQueue};
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::{CompletionQueue, QueuePair, WorkCompletion};
use rpc_support::RawPeer;

#[test]
fn more_messages_than_the_send_queue_holds_wait_for_room_instead_of_overrunning_it() {
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let mut b = RawPeer::new(1024, 1024, 256, 4096, 2);
    a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let depth = a.qp.cap().max_send_wr as usize;
    let bufs = 2 * depth as u16;
    let mut pool = SendPool::<Sim>::new(&a.pd, bufs, 64).unwrap();
    let mut sq = SendQueue::new(depth, usize::from(bufs));
    let mut wcs = [WorkCompletion::default(); 64];
    let (mut sent, mut received, mut waits) = (0usize, 0usize, 0usize);
    let total = 3 * depth;
    while received < total {
        // Take and post as many as the send queue has room for, without polling in between.
        while sent < total {
            let Some(mut buf) = pool.acquire_for(&sq) else {
                waits += 1;
                break;
            };
            pool.buf_mut(&mut buf)[..8].copy_from_slice(&(sent as u64).to_le_bytes());
            sq.send(&mut pool, buf, 8, true);
            sq.flush(&a.qp, &mut pool, 1).expect("posting never overruns the send queue");
            sent += 1;
        }
        let n = a.cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            assert!(wc.status.is_success(), "{wc:?}");
            let (_, wrs, retired) = split_send_wr_id(wc.wr_id).expect("a send completion");
            pool.retire(usize::from(retired));
            sq.on_completion(wrs);
        }
        let n = b.cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            let buf = b.recv.take(wc.wr_id, wc.byte_len).expect("a posted receive buffer");
            assert_eq!(b.recv.bytes(&buf), &(received as u64).to_le_bytes(), "in order");
            b.recv.repost(buf);
            received += 1;
        }
        b.recv.flush().unwrap();
        assert!(sq.outstanding() <= depth);
    }
    assert!(waits > 0, "the send queue filled up at least once ({depth} WQEs, {bufs} buffers)");
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}
