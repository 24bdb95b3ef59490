//! A send queue posts the buffers of one send pool only (`SendQueue::flush`'s `bind_pool`,
//! whose tied queue returns after one compare): a queue tied to one pool refuses another, also
//! after many flushes (the fast path). A pool may serve many queues (a server worker's sessions
//! share one): each keeps the buffers it posted. A queue retiring into another pool would hand
//! a buffer back while a posted WR still reads it.

mod rpc_support;

use rpc_core::buffers::{SendPool, SendQueue};
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_support::RawPeer;

#[test]
fn a_tied_queue_and_pool_refuse_every_other_pairing_after_the_fast_path() {
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let b = RawPeer::new(1024, 8, 256, 4096, 2);
    a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let mut pool = SendPool::<Sim>::new(&a.pd, 8, 64).unwrap();
    let mut other_pool = SendPool::<Sim>::new(&a.pd, 8, 64).unwrap();
    let mut sq = SendQueue::new(64, 8);
    let mut other_sq = SendQueue::new(64, 8);
    // The tied pair flushes several times (the first ties, the rest take the fast path).
    for _ in 0..3 {
        let buf = pool.acquire().unwrap();
        sq.send(&mut pool, buf, 8, true);
        sq.flush(&a.qp, &mut pool, 1).unwrap();
    }
    // Another queue with the same pool: pools are shared, it posts (an inline SEND: its buffer
    // is free again once posted).
    let buf = pool.acquire().unwrap();
    other_sq.send(&mut pool, buf, 8, true);
    other_sq.flush(&a.qp, &mut pool, 2).unwrap();
    assert_eq!(pool.in_use(), 0, "inline SENDs hold no buffer once posted");
    // The tied queue with another pool: its send gives the buffer back, and a flush of what it
    // holds with that pool is refused.
    let buf = other_pool.acquire().unwrap();
    sq.send(&mut other_pool, buf, 8, true);
    let buf = pool.acquire().unwrap();
    sq.send(&mut pool, buf, 8, true);
    assert!(sq.flush(&a.qp, &mut other_pool, 1).is_err(), "a queue tied to another pool was accepted");
    assert_eq!(other_pool.in_use(), 0);
    // The tied pair still flushes.
    sq.flush(&a.qp, &mut pool, 1).unwrap();
    drop(b);
}
