//! The send queue is never overrun: a send buffer is taken only while the QP's send queue has
//! room for its WRs, and WQEs (inline ones too) are retired only by a polled signaled
//! completion, as hardware (and the software NIC, by default) retires them. Without the room
//! check, posting more WRs than `max_send_wr` before polling fails the post (on a NIC: the
//! session would close).

mod rpc_support;

use rpc_core::buffers::{Completions, SendPool, SendQueue};
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::QueuePair;
use rpc_support::{RawPeer, WAIT};

/// Polls `qp`'s CQ once and retires what each send completion covers, as the client and the
/// worker do: its send buffers, its WQEs, and (with `staging`) the staged ranges whose last WRITE
/// it covers. Returns the completions polled (every one must succeed).
fn retire_polled<P: rpc_core::verbs::Provider>(
    peer: &RawPeer<P>,
    wcs: &mut Completions<64>,
    pool: &mut SendPool<P>,
    sq: &mut SendQueue,
    mut staging: Option<&mut rpc_core::buffers::SendStaging<P>>,
) -> usize {
    let n = wcs.poll(&peer.cq).unwrap();
    for c in &mut *wcs {
        assert!(c.wc().status.is_success(), "{c:?}");
        assert!(c.send_tag().is_some(), "a send completion: {c:?}");
        assert!(sq.on_completion(c, pool), "a completion of this queue");
        if let Some(staging) = staging.as_deref_mut() {
            sq.retire_staged(staging);
        }
    }
    n
}

/// Tests that run on any NIC: `sim`, and rxe0 in the Soft-RoCE tier (`scripts/softroce-test`
/// runs `buffers_send_queue:on_any_nic::`; two QPs of the device connected to each other).
mod on_any_nic {
    use super::*;
    use rpc_core::verbs::Provider;

    #[test]
    fn more_messages_than_the_send_queue_holds_wait_for_room_instead_of_overrunning_it() {
        match rpc_support::transport() {
            #[cfg(feature = "ibverbs")]
            rpc_core::Transport::Rdma { .. } => {
                let a = rpc_support::rdma_raw_peer(1024, 8, 256, 4096, 1);
                let b = rpc_support::rdma_raw_peer(1024, 1024, 256, 4096, 2);
                overrun(a, b)
            }
            _ => overrun(RawPeer::new(1024, 8, 256, 4096, 1), RawPeer::new(1024, 1024, 256, 4096, 2)),
        }
    }

    fn overrun<P: Provider>(a: RawPeer<P>, mut b: RawPeer<P>) {
        a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
        b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
        let depth = a.qp.cap().max_send_wr as usize;
        let bufs = 2 * depth as u16;
        let mut pool = SendPool::<P>::new(&a.pd, bufs, 64).unwrap();
        let mut sq = SendQueue::new(depth, usize::from(bufs));
        let mut wcs = Completions::<64>::new();
        let (mut sent, mut received, mut waits) = (0usize, 0usize, 0usize);
        let total = 3 * depth;
        let give_up = std::time::Instant::now() + WAIT;
        while received < total {
            assert!(
                std::time::Instant::now() < give_up,
                "{received} of {total} messages received in {WAIT:?} ({sent} sent, {} outstanding)",
                sq.outstanding()
            );
            // Take and post as many as the send queue has room for, without polling in between.
            while sent < total {
                let Some(mut buf) = pool.acquire_for(&mut sq) else {
                    waits += 1;
                    break;
                };
                pool.buf_mut(&mut buf)[..8].copy_from_slice(&(sent as u64).to_le_bytes());
                sq.send(&mut pool, buf, 8, true);
                sq.flush(&a.qp, &mut pool, 1).expect("posting never overruns the send queue");
                sent += 1;
            }
            retire_polled(&a, &mut wcs, &mut pool, &mut sq, None);
            wcs.poll(&b.cq).unwrap();
            for c in &mut wcs {
                let buf = b.recv.take(c).expect("a posted receive buffer");
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
}

/// Bodies encoded once into the staging area are written in pieces to offsets of the peer's ring
/// that have nothing to do with their staging offsets; a staged range is handed out again only
/// after the completion of its last WRITE is polled, and what arrives is what was encoded.
#[test]
fn staged_bodies_go_out_in_pieces_and_their_space_frees_only_with_the_last_writes_completion() {
    use rpc_core::buffers::SendStaging;
    const RING: usize = 4096;
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let mut b = RawPeer::new(1024, 64, 256, RING, 2);
    let hb = b.handshake(4, 64, 1 << 20, 1);
    a.connect(&RcConfig::default(), &hb);
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let depth = a.qp.cap().max_send_wr as usize;
    let mut pool = SendPool::<Sim>::new(&a.pd, 16, 64).unwrap();
    let mut sq = SendQueue::new(depth, 16);
    let mut staging = SendStaging::<Sim>::new(&a.pd, 3000, 4).unwrap();
    let mut wcs = Completions::<64>::new();

    // Two bodies of 1200 bytes: both fit, a third does not fit contiguously.
    let mut bodies = Vec::new();
    for k in 0..2u8 {
        let (at, spare) = staging.spare_mut();
        assert!(spare.len() >= 1200, "room for body {k}: {}", spare.len());
        for (i, x) in spare[..1200].iter_mut().enumerate() {
            *x = k.wrapping_mul(31).wrapping_add(i as u8);
        }
        bodies.push(staging.commit(at, 1200).expect("the span just handed out"));
    }
    assert!(staging.spare_mut().1.len() < 1200);
    assert!(staging.commit(0, 1).is_none(), "not the spare span");

    // Body 0 in three pieces at ring offsets 3000, 100 and 2000 (any offsets the ring grants).
    let first = bodies.remove(0);
    let pieces = [(0u32, 500u32, 3000u64), (500, 400, 100), (900, 300, 2000)];
    let mut token = Some(first);
    for (i, &(from, len, ring_off)) in pieces.iter().enumerate() {
        let t = token.take().unwrap();
        token = sq.write_staged(&staging, t, from, len, (hb.ring_addr + ring_off, hb.ring_rkey), from + len);
        assert_eq!(token.is_none(), i == pieces.len() - 1, "only the last piece consumes the token");
    }
    let buf = pool.acquire_for(&mut sq).unwrap();
    sq.send(&mut pool, buf, 8, true);
    let used = staging.used();
    sq.flush(&a.qp, &mut pool, 1).unwrap();
    assert_eq!(staging.used(), used, "nothing frees at posting");

    // Body 1 is given back unsent: its space frees only behind body 0 (in order).
    staging.release(bodies.remove(0));
    assert_eq!(staging.used(), used);

    let mut done = false;
    for _ in 0..1000 {
        done = retire_polled(&a, &mut wcs, &mut pool, &mut sq, Some(&mut staging)) > 0;
        if done {
            break;
        }
    }
    assert!(done, "a batch with a staged WRITE is signaled");
    assert_eq!(staging.used(), 0, "both ranges free once the last WRITE completed");
    let (at, spare) = staging.spare_mut();
    assert_eq!((at, spare.len()), (0, 3000), "an empty area starts over at 0");

    let n = wcs.poll(&b.cq).unwrap();
    assert_eq!(n, 1);
    let r = b.recv.take(wcs.next().unwrap()).unwrap();
    b.recv.repost(r);
    let mut got = Vec::new();
    for &(from, len, ring_off) in &pieces {
        got.clear();
        assert!(b.ring.copy_out(ring_off as u32, len, &mut got));
        let want: Vec<u8> = (from..from + len).map(|i| i as u8).collect();
        assert_eq!(got, want, "piece at ring offset {ring_off}");
    }
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

proptest::proptest! {
    /// Random encodes and out-of-order releases: the spare span handed out never overlaps a live
    /// staged range, and everything is free once every range is released.
    #[test]
    fn staging_never_hands_out_live_bytes(
        len in 1u32..400,
        ops in proptest::collection::vec((1u32..450, proptest::bool::ANY, 0u8..255), 1..200),
    ) {
        use rpc_core::buffers::SendStaging;
        let peer = RawPeer::new(16, 1, 64, 64, 1);
        let mut staging = SendStaging::<Sim>::new(&peer.pd, len, 4).unwrap();
        let mut owner: Vec<Option<usize>> = vec![None; len as usize];
        let mut live = Vec::new();
        for (i, (n, release, pick)) in ops.into_iter().enumerate() {
            if release && !live.is_empty() {
                let (s, at, n): (rpc_core::buffers::Staged, u32, u32) = live.swap_remove(pick as usize % live.len());
                for b in &mut owner[at as usize..(at + n) as usize] {
                    *b = None;
                }
                staging.release(s);
                continue;
            }
            let (at, spare) = staging.spare_mut();
            let room = spare.len() as u32;
            proptest::prop_assert!(!live.is_empty() || room == len, "an empty area offers all of it");
            for o in &owner[at as usize..(at + room) as usize] {
                proptest::prop_assert_eq!(*o, None, "spare span over a live range");
            }
            if n <= room {
                let s = staging.commit(at, n).unwrap();
                for b in &mut owner[at as usize..(at + n) as usize] {
                    *b = Some(i);
                }
                live.push((s, at, n));
            } else {
                proptest::prop_assert!(staging.commit(at, n).is_none());
            }
        }
        for (s, ..) in live.drain(..) {
            staging.release(s);
        }
        proptest::prop_assert_eq!(staging.used(), 0);
    }
}

/// A completion gives back only what it proves done: a receive completion takes a buffer of the
/// pool its WR came from and of no other pool; a send completion (unsignaled and flushed ones
/// included) takes no receive buffer, and retires nothing of another queue.
#[test]
fn a_completion_gives_back_only_what_its_own_work_request_used() {
    use rpc_core::buffers::RecvPool;
    let mut a = RawPeer::new(1024, 8, 256, 4096, 1);
    let mut b = RawPeer::new(1024, 8, 256, 4096, 2);
    a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    // A second pool on b's PD, posted to an SRQ of its own: the same buffer indices.
    let mut other = RecvPool::<Sim>::new(&b.pd, 8, 256).unwrap();
    let mut pool = SendPool::<Sim>::new(&a.pd, 8, 64).unwrap();
    let mut sq = SendQueue::new(64, 8);
    let mut pool2 = SendPool::<Sim>::new(&b.pd, 8, 64).unwrap();
    let mut sq2 = SendQueue::new(64, 8);
    // b's queue posts one signaled SEND of its own, so it has something a stray completion
    // could retire.
    let buf = pool2.acquire().unwrap();
    sq2.send(&mut pool2, buf, 8, false);
    sq2.flush(&b.qp, &mut pool2, 9).unwrap();
    assert_eq!((pool2.in_use(), sq2.posted_bufs()), (1, 1));

    let mut wcs = Completions::<64>::new();
    for round in 0..2 {
        let buf = pool.acquire_for(&mut sq).unwrap();
        sq.send(&mut pool, buf, 8, false);
        sq.flush(&a.qp, &mut pool, 1).unwrap();
        let c = wait_for_one(&b, &mut wcs, |c| c.send_tag().is_none());
        if round == 0 {
            assert!(other.take(c).is_none(), "a completion of b's pool takes no buffer of another pool");
        } else {
            let t = b.recv.take(c).expect("the pool the WR came from takes it");
            b.recv.repost(t);
        }
        let c = wait_for_one(&a, &mut wcs, |c| c.send_tag() == Some(1));
        assert!(!sq2.on_completion(c, &mut pool2), "another queue's completion retires nothing");
        assert_eq!((pool2.in_use(), sq2.posted_bufs()), (1, 1), "b's SEND buffer stays posted");
    }
    // Flushed WRs, unsignaled ones too, complete with their queue's tag: none of them is taken
    // for a receive buffer (an unsignaled WR's `wr_id` was 0, which named receive buffer 0).
    for _ in 0..3 {
        let buf = pool.acquire().unwrap();
        sq.send(&mut pool, buf, 8, true);
    }
    b.qp.set_drop_traffic(true);
    sq.flush(&a.qp, &mut pool, 1).unwrap();
    a.qp.force_error();
    let mut flushed = 0;
    let give_up = std::time::Instant::now() + WAIT;
    while flushed < 3 {
        assert!(std::time::Instant::now() < give_up, "{flushed} flushed completions in {WAIT:?}");
        wcs.poll(&a.cq).unwrap();
        for c in &mut wcs {
            assert_eq!(c.send_tag(), Some(1), "{c:?}");
            assert!(a.recv.take(c).is_none(), "a send completion takes no receive buffer");
            flushed += 1;
        }
    }
    drop(other);
    // Buffers still posted (b's pool2, a's pool) are dropped with their owners: no token leaked.
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// Polls `peer`'s CQ until a completion `pick` accepts arrives; others are dropped.
fn wait_for_one(
    peer: &RawPeer<Sim>,
    wcs: &mut Completions<64>,
    pick: impl Fn(&rpc_core::buffers::Completion) -> bool,
) -> rpc_core::buffers::Completion {
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        assert!(std::time::Instant::now() < give_up, "no completion in {WAIT:?}");
        wcs.poll(&peer.cq).unwrap();
        if let Some(c) = wcs.find(|c| pick(c)) {
            return c;
        }
        std::thread::yield_now();
    }
}

/// Ring marks come back in posting order, each only once a polled completion covers its WRITE,
/// and every flush with a ring WRITE is signaled, so that completion comes even with no other
/// traffic (here two inline SENDs, which alone go unsignaled); a WRITE queued and discarded
/// unposted leaves no mark behind. Sabotaged: without the signal for a batch with a WRITE, no
/// completion came ("a flush with a ring WRITE is signaled"); with `take_ring_mark` not checking
/// `completed`, the first mark came back before any completion was polled; with
/// `discard_pending` keeping the marks, the discarded mark came back with the next SEND's
/// completion.
#[test]
fn ring_marks_retire_in_posting_order_with_their_writes_completions() {
    use rpc_core::buffers::SendMirror;
    const RING: usize = 4096;
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let mut b = RawPeer::new(1024, 64, 256, RING, 2);
    let hb = b.handshake(4, 64, 1 << 20, 1);
    a.connect(&RcConfig::default(), &hb);
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let depth = a.qp.cap().max_send_wr as usize;
    let mut pool = SendPool::<Sim>::new(&a.pd, 16, 64).unwrap();
    let mut sq = SendQueue::new(depth, 16);
    let mut mirror = SendMirror::<Sim>::new(&a.pd, RING).unwrap();
    // One completion at a time, to see each one's retirement.
    let mut wcs = Completions::<1>::new();
    let mut poll_one = |pool: &mut SendPool<Sim>, sq: &mut SendQueue| {
        let give_up = std::time::Instant::now() + WAIT;
        loop {
            if wcs.poll(&a.cq).unwrap() == 1 {
                let c = wcs.next().unwrap();
                assert!(c.wc().status.is_success(), "{c:?}");
                assert!(sq.on_completion(c, pool));
                return;
            }
            assert!(std::time::Instant::now() < give_up, "a flush with a ring WRITE is signaled");
            std::thread::yield_now();
        }
    };
    for (offset, len, mark) in [(0u32, 10u32, 10u32), (10, 20, 30)] {
        assert!(mirror.write_at(offset, &vec![0x5a; len as usize]));
        sq.write(&mirror, offset, len, hb.ring_addr, hb.ring_rkey, mark);
        let buf = pool.acquire_for(&mut sq).unwrap();
        sq.send(&mut pool, buf, 8, true);
        sq.flush(&a.qp, &mut pool, 1).unwrap();
    }
    assert_eq!(sq.take_ring_mark(), None, "nothing retired before a completion is polled");
    poll_one(&mut pool, &mut sq);
    assert_eq!(sq.take_ring_mark(), Some(10), "the first WRITE's completion retires it alone");
    assert_eq!(sq.take_ring_mark(), None);
    poll_one(&mut pool, &mut sq);
    assert_eq!(sq.take_ring_mark(), Some(30));

    // A WRITE queued and dropped unposted (a closing connection) leaves no mark: the next
    // signaled SEND (not inline: signaled) retires none.
    sq.write(&mirror, 30, 10, hb.ring_addr, hb.ring_rkey, 40);
    sq.discard_pending(&mut pool);
    let buf = pool.acquire_for(&mut sq).unwrap();
    sq.send(&mut pool, buf, 8, false);
    sq.flush(&a.qp, &mut pool, 1).unwrap();
    poll_one(&mut pool, &mut sq);
    assert_eq!(sq.take_ring_mark(), None, "the discarded WRITE's mark is gone");
    // The peer's receives, to leave nothing behind.
    let give_up = std::time::Instant::now() + WAIT;
    let mut got = 0;
    let mut rwcs = Completions::<64>::new();
    while got < 3 {
        assert!(std::time::Instant::now() < give_up);
        rwcs.poll(&b.cq).unwrap();
        for c in &mut rwcs {
            let r = b.recv.take(c).unwrap();
            b.recv.repost(r);
            got += 1;
        }
    }
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// A batch looked into while its owner is between two of its completions (what a worker's
/// handler does through `RequestContext::is_cancelled`): `poll_more` appends behind the
/// completions not taken yet, so they are handed out in CQ order, and `untaken_recv_heads` reads
/// the first bytes of the receives not taken yet, never of one taken. Sabotaged: `poll_more`
/// polling over the untaken completions instead of behind them: the untaken one was lost and
/// the wait for 3 gave up ("0 of 3 completions"); `untaken_recv_heads` starting at the batch's
/// first entry instead of the first not taken: "heads of the receives not taken" failed ([0, 1]
/// seen, the taken buffer's included); without the re-check after each callback: "a buffer
/// taken by the callback is not read" failed ([4, 5, 6, 7]: buffer 5 read after its repost).
#[test]
fn a_batch_polls_more_behind_what_is_not_taken_and_shows_only_untaken_receive_heads() {
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let mut b = RawPeer::new(1024, 16, 256, 4096, 2);
    a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let depth = a.qp.cap().max_send_wr as usize;
    let mut pool = SendPool::<Sim>::new(&a.pd, 16, 64).unwrap();
    let mut sq = SendQueue::new(depth, 16);
    let view = b.recv.view();
    let send = |pool: &mut SendPool<Sim>, sq: &mut SendQueue, k: u8| {
        let mut buf = pool.acquire().unwrap();
        pool.buf_mut(&mut buf)[..4].copy_from_slice(&[k, 0xaa, 0xbb, 0xcc]);
        sq.send(pool, buf, 4, true);
        sq.flush(&a.qp, pool, 1).unwrap();
    };
    let heads = |wcs: &Completions<4>| {
        let mut seen = Vec::new();
        wcs.untaken_recv_heads::<Sim, 2>(&view, |_, head| {
            assert_eq!(head.len(), 2, "the first K bytes");
            assert_eq!(head[1], 0xaa);
            seen.push(head[0]);
        });
        seen
    };
    let wcs = Completions::<4>::new();
    let wait = |wcs: &Completions<4>, n: usize, more: bool| {
        let give_up = std::time::Instant::now() + WAIT;
        while wcs.pending() < n {
            assert!(std::time::Instant::now() < give_up, "{} of {n} completions in {WAIT:?}", wcs.pending());
            if more {
                wcs.poll_more(&b.cq).unwrap()
            } else {
                wcs.poll(&b.cq).unwrap()
            };
            std::thread::yield_now();
        }
    };
    for k in 0..2 {
        send(&mut pool, &mut sq, k);
    }
    wait(&wcs, 2, false);
    assert_eq!(heads(&wcs), [0, 1]);
    // Take the first: only the second stays visible.
    let first = b.recv.take(wcs.next_completion().unwrap()).unwrap();
    assert_eq!(heads(&wcs), [1], "heads of the receives not taken");
    // Two more arrive while the second waits: polled behind it.
    for k in 2..4 {
        send(&mut pool, &mut sq, k);
    }
    wait(&wcs, 3, true);
    assert_eq!(heads(&wcs), [1, 2, 3]);
    let mut order = vec![b.recv.bytes(&first)[0]];
    b.recv.repost(first);
    while let Some(c) = wcs.next_completion() {
        let buf = b.recv.take(c).unwrap();
        order.push(b.recv.bytes(&buf)[0]);
        b.recv.repost(buf);
    }
    assert_eq!(order, [0, 1, 2, 3], "4 messages in order");
    assert!(heads(&wcs).is_empty());
    // A full batch of untaken completions polls nothing more.
    for k in 4..9 {
        send(&mut pool, &mut sq, k);
    }
    wait(&wcs, 4, false);
    assert_eq!(wcs.poll_more(&b.cq).unwrap(), 0, "no room");
    assert_eq!(heads(&wcs), [4, 5, 6, 7]);
    // The callback may take completions (and repost their buffers): those are not read after.
    let mut seen = Vec::new();
    wcs.untaken_recv_heads::<Sim, 2>(&view, |_, head| {
        if seen.is_empty() {
            for _ in 0..2 {
                let buf = b.recv.take(wcs.next_completion().unwrap()).unwrap();
                b.recv.repost(buf);
            }
        }
        seen.push(head[0]);
    });
    assert_eq!(seen, [4, 6, 7], "a buffer taken by the callback is not read");
}

/// `send_now` posts a SEND at once when nothing is queued (nothing left pending, its WQE
/// outstanding), and goes behind what is queued otherwise: the peer receives the messages in
/// the order they were given. Sabotaged: with `send_now` posting at once even behind a queued
/// SEND (its `pending` check dropped), the queued SEND stayed behind ("the queued SEND went
/// with it").
#[test]
fn a_send_now_posts_at_once_and_never_overtakes_a_queued_send() {
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let mut b = RawPeer::new(1024, 8, 256, 4096, 2);
    a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let mut pool = SendPool::<Sim>::new(&a.pd, 8, 64).unwrap();
    let mut sq = SendQueue::new(64, 8);
    let msg = |pool: &mut SendPool<Sim>, sq: &mut SendQueue, v: u64| {
        let mut buf = pool.acquire_for(sq).unwrap();
        pool.buf_mut(&mut buf)[..8].copy_from_slice(&v.to_le_bytes());
        buf
    };
    let first = msg(&mut pool, &mut sq, 0);
    sq.send_now(&a.qp, &mut pool, first, 8, true, 1).unwrap();
    assert!(sq.is_empty(), "nothing queued: posted at once");
    assert_eq!(sq.outstanding(), 1);
    let queued = msg(&mut pool, &mut sq, 1);
    sq.send(&mut pool, queued, 8, true);
    let now = msg(&mut pool, &mut sq, 2);
    sq.send_now(&a.qp, &mut pool, now, 8, true, 1).unwrap();
    assert!(sq.is_empty(), "the queued SEND went with it");
    assert_eq!(sq.outstanding(), 3);
    let mut wcs = Completions::<64>::new();
    let mut got = Vec::new();
    let give_up = std::time::Instant::now() + WAIT;
    while got.len() < 3 {
        assert!(std::time::Instant::now() < give_up, "received {got:?} in {WAIT:?}");
        wcs.poll(&b.cq).unwrap();
        for c in &mut wcs {
            let buf = b.recv.take(c).expect("a posted receive buffer");
            got.push(u64::from_le_bytes(b.recv.bytes(&buf)[..8].try_into().unwrap()));
            b.recv.repost(buf);
        }
        std::thread::yield_now();
    }
    assert_eq!(got, [0, 1, 2], "in the order given");
    b.recv.flush().unwrap();
}

/// `send_now`'s own post (one WR, no round trip through the queue) signals and keeps buffers
/// as a flush does: a SEND the NIC reads by DMA is signaled, and its buffer stays taken until
/// the polled completion retires it; an inline SEND's buffer is free once posted, and only
/// every `depth / 2`-th inline SEND is signaled, its completion retiring the unsignaled ones
/// before it.
///
/// Sabotaged: the DMA SEND left unsignaled when under `depth / 2` (`signal` without
/// `!inline`): "no completion for the DMA SEND". An inline SEND's buffer kept in `bufs` as a
/// DMA one's: "an inline SEND's buffer is free once posted".
#[test]
fn a_send_now_signals_and_keeps_buffers_as_a_flush() {
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let mut b = RawPeer::new(1024, 8, 256, 4096, 2);
    a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let mut pool = SendPool::<Sim>::new(&a.pd, 8, 64).unwrap();
    let free = pool.available();
    let mut sq = SendQueue::new(8, 8);
    let mut wcs = Completions::<64>::new();
    let retired = |wcs: &mut Completions<64>, pool: &mut SendPool<Sim>, sq: &mut SendQueue| {
        let give_up = std::time::Instant::now() + WAIT;
        loop {
            if retire_polled(&a, wcs, pool, sq, None) > 0 {
                return true;
            }
            if std::time::Instant::now() >= give_up {
                return false;
            }
            std::thread::yield_now();
        }
    };
    // Inline: free at once; the 4th (depth 8 / 2) signaled, retiring all 4. (The first binds
    // the queue to its QP and pool through a flush; the others are posted by `send_now`.)
    for k in 1..=4 {
        let buf = pool.acquire_for(&mut sq).unwrap();
        sq.send_now(&a.qp, &mut pool, buf, 8, true, 1).unwrap();
        assert_eq!(pool.available(), free, "an inline SEND's buffer is free once posted");
        assert_eq!((sq.outstanding(), sq.posted_bufs()), (k, 0));
        if k < 4 {
            assert_eq!(retire_polled(&a, &mut wcs, &mut pool, &mut sq, None), 0, "SEND {k} unsignaled");
        }
    }
    assert!(retired(&mut wcs, &mut pool, &mut sq), "no completion for the 4th inline SEND");
    assert_eq!(sq.outstanding(), 0, "the signaled SEND retired the 3 before it");
    // DMA: signaled at once, its buffer the queue's until the completion.
    let buf = pool.acquire_for(&mut sq).unwrap();
    sq.send_now(&a.qp, &mut pool, buf, 8, false, 1).unwrap();
    assert_eq!((sq.outstanding(), sq.posted_bufs(), pool.available()), (1, 1, free - 1));
    assert!(retired(&mut wcs, &mut pool, &mut sq), "no completion for the DMA SEND");
    assert_eq!((sq.outstanding(), sq.posted_bufs(), pool.available()), (0, 0, free));
    // The peer got all 5.
    let mut got = 0;
    let give_up = std::time::Instant::now() + WAIT;
    while got < 5 {
        assert!(std::time::Instant::now() < give_up, "received {got} in {WAIT:?}");
        wcs.poll(&b.cq).unwrap();
        for c in &mut wcs {
            let buf = b.recv.take(c).expect("a posted receive buffer");
            got += 1;
            b.recv.repost(buf);
        }
        std::thread::yield_now();
    }
    b.recv.flush().unwrap();
}
