//! A server worker's sessions send from one pool of send buffers (`ServerConfig::max_send_pool_bytes`,
//! `SendPool::growable`) instead of registering their own at connect: an idle session holds none,
//! sessions that together want more buffers than the pool's cap wait for completions to free
//! some and all finish, and the buffers a closed session's posted WRs read come back only once
//! its QP is destroyed.
//!
//! Sabotages run (each failed the test named, then was restored):
//! - `SendQueue::post_chunk` keeping inline SENDs' buffers until a signaled completion (as before
//!   the pool was shared): `an_idle_session_holds_no_send_buffer` failed, buffers in use after
//!   the calls.
//!   The cap test hung too (each session kept its inline buffers until a later signaled
//!   completion of its own: sessions waiting on each other).
//! - `Worker::run` not calling `retry_starved`: `sessions_wanting_more_buffers_than_the_cap_all_finish`
//!   gave up after 60 s at 64 calls answered, no buffer in use (sessions whose answers waited for
//!   a buffer were never retried; with liveness probes on, a Ping rescued them seconds later,
//!   so the test turns probes off). `Worker::note_starved` noting no session: the same.
//! - `Worker::close_entry` dropping the session's `Conn` instead of `Conn::close`:
//!   `a_session_closed_with_its_answer_posted_gives_the_buffer_back_to_its_worker` failed, one
//!   buffer in use after the close (lost to the pool).
//! - `SendQueue::on_completion` retiring on a failed completion:
//!   `a_closed_queue_gives_its_buffers_back_only_when_its_qp_is_destroyed` failed (buffers free
//!   while the flushed WRs' QP still existed); `SendQueue::reclaim` not checking the QP's
//!   identity: the same test failed at the reclaim with another QP.

mod rpc_support;

use std::future::Future;

use rpc_core::buffers::{Completions, SendPool, SendQueue};
use rpc_core::codegen::*;
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::Client;
use rpc_support::*;

/// One send buffer at the default eager threshold: 4096 + the 40-byte header.
const BUF: u64 = 4096 + 40;

/// Buffers a worker's pool registers at a time.
const CHUNK: u64 = 64;

#[test]
fn an_idle_session_holds_no_send_buffer() {
    let (server, _) = spawn(server());
    let c = server.counters();
    assert_eq!((c.send_pool_bytes, c.send_bufs_in_use, c.registered_bytes), (0, 0, 0), "{c:?}");
    // Ten sessions make small calls (answers of 32 B: inline SENDs) and go idle.
    let clients: Vec<Client> =
        (0..10).map(|_| Client::connect_with(server.local_addr(), &client_config()).unwrap()).collect();
    for (i, c) in clients.iter().enumerate() {
        for k in 0..4 {
            echo_checked(c, (i * 4 + k) as u64, 32, 32);
        }
    }
    let c = counters_when(&server, "40 calls answered", WAIT, |c| c.rpcs == 40);
    // The pool registered one chunk at the first answer, shared by all ten sessions, and no
    // session holds a buffer once its answers are posted.
    assert_eq!(c.send_pool_bytes, CHUNK * BUF, "{c:?}");
    assert_eq!(c.send_bufs_in_use, 0, "idle sessions hold send buffers: {c:?}");
    assert_eq!(c.registered_bytes, 0, "a session registered memory of its own: {c:?}");
    assert_eq!(c.send_pool_waits, 0, "{c:?}");
}

#[test]
fn sessions_wanting_more_buffers_than_the_cap_all_finish() {
    // A pool of one chunk (64 buffers); answers of 1 KiB are not inline, so each holds its
    // buffer until its SEND's completion is polled: 8 sessions × 32 calls in flight want 256.
    // No liveness probes: a session waiting for a buffer is sent on by the pool's retry alone,
    // not by a Ping that happens to arrive.
    let cap = (CHUNK * BUF) as usize;
    let (server, _) = spawn(server().max_send_pool_bytes(cap).peer_timeout(None));
    let cfg = client_config().peer_timeout(None);
    let clients: Vec<Client> =
        (0..8).map(|_| Client::connect_with(server.local_addr(), &cfg).unwrap()).collect();
    let reqs: Vec<EchoMsg> = (0..32).map(|i| request(i, 32, 1024)).collect();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for round in 0..3 {
        let mut futs: Vec<_> = clients
            .iter()
            .flat_map(|c| {
                reqs.iter().enumerate().map(move |(i, r)| {
                    (i as u64, c.unary_async::<_, EchoMsg>(ECHO, r, &CallOptions::default()))
                })
            })
            .collect();
        wait_until(
            "every call of every session answered",
            WAIT,
            || {
                futs.retain_mut(|(i, f)| match std::pin::Pin::new(f).poll(&mut cx) {
                    std::task::Poll::Ready(r) => {
                        check_reply(&r.unwrap(), *i, 1024);
                        false
                    }
                    std::task::Poll::Pending => true,
                });
                futs.is_empty()
            },
            || format!("round {round}; server {:?}", server.counters()),
        );
    }
    let c = counters_when(&server, "768 calls answered", WAIT, |c| c.rpcs == 3 * 8 * 32);
    assert!(c.send_pool_waits > 0, "the pool's cap was never reached: {c:?}");
    assert_eq!(c.send_pool_bytes, CHUNK * BUF, "the pool grew past its cap: {c:?}");
    assert_eq!((c.sessions_closed, c.malformed), (0, 0), "{c:?}");
}

#[test]
fn a_closed_queue_gives_its_buffers_back_only_when_its_qp_is_destroyed() {
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let b = RawPeer::new(1024, 8, 256, 4096, 2);
    let other = RawPeer::new(64, 8, 256, 4096, 3);
    a.connect(&RcConfig::default(), &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    // Chunks of 4 buffers of 64 bytes, at most 8.
    let mut pool = SendPool::<Sim>::growable(&a.pd, 64, 2, 8 * 64).unwrap();
    assert_eq!((pool.registered_bytes(), pool.capacity()), (0, 8));
    let mut sq = SendQueue::new(64, 8);
    // b takes nothing: a's SENDs (read by DMA, not inline) stay posted.
    b.qp.set_drop_traffic(true);
    for _ in 0..3 {
        let mut buf = pool.acquire_for(&mut sq).unwrap();
        pool.buf_mut(&mut buf)[..8].copy_from_slice(b"sendpool");
        sq.send(&mut pool, buf, 64, false);
    }
    sq.flush(&a.qp, &mut pool, 1).unwrap();
    assert_eq!((pool.in_use(), sq.posted_bufs(), pool.registered_bytes()), (3, 3, 4 * 64));
    // The session is closed: its QP goes to ERR and its WRs complete flushed. A failed
    // completion proves nothing: the buffers stay with the queue.
    a.qp.force_error();
    let mut wcs = Completions::<64>::new();
    let mut seen = 0;
    wait_until(
        "the flushed signaled SEND's completion",
        WAIT,
        || {
            wcs.poll(&a.cq).unwrap();
            for c in &mut wcs {
                assert!(!c.wc().status.is_success(), "{c:?}");
                seen += 1;
                assert!(!sq.on_completion(c, &mut pool), "a flushed completion retired buffers");
            }
            seen >= 1
        },
        || "no completion".to_string(),
    );
    assert_eq!((pool.in_use(), sq.posted_bufs()), (3, 3), "buffers freed while their QP exists");
    // Another QP destroyed proves nothing about this queue's WRs.
    let RawPeer { qp: other_qp, .. } = other;
    assert_eq!(sq.reclaim(other_qp, &mut pool), 0, "buffers freed for another QP's destruction");
    assert_eq!(pool.in_use(), 3);
    // Its own QP destroyed: every buffer is back, and the pool hands them out again (no growth).
    let RawPeer { qp, recv, ring, cq, pd, ctx, .. } = a;
    assert_eq!(sq.reclaim(qp, &mut pool), 3);
    assert_eq!((pool.in_use(), sq.posted_bufs(), pool.available()), (0, 0, 4));
    let bufs: Vec<_> = (0..4).map(|_| pool.acquire().unwrap()).collect();
    assert_eq!(pool.registered_bytes(), 4 * 64, "the reclaimed buffers were not reused");
    for b in bufs {
        pool.give_back(b);
    }
    drop(pool);
    drop((recv, ring, cq, pd, ctx, b));
}

#[test]
fn a_session_closed_with_its_answer_posted_gives_the_buffer_back_to_its_worker() {
    use prost::Message;
    let (server, stash) = spawn(server());
    let mut c = RawClient::connect(server.local_addr());
    // A call the handler defers: its answer is sent when the test says.
    c.request(STASH, 0, 1, &request(1, 16, 0).encode_to_vec());
    wait_until(
        "the call stashed",
        WAIT,
        || !stash.lock().unwrap().is_empty(),
        || format!("{:?}", server.counters()),
    );
    // The client's QP takes nothing from now on: the answer (1 KiB, read by DMA) stays posted,
    // its buffer in use, until the session closes (the SEND's retries run out, or the client
    // goes): its QP is destroyed and the buffer goes back to the worker's pool, not lost to it.
    c.peer.qp.set_drop_traffic(true);
    let responder = stash.lock().unwrap().pop().unwrap();
    responder.send(Ok(EchoMsg { seq: 1, payload: vec![7; 1024], ..Default::default() }));
    counters_when(&server, "the answer posted", WAIT, |c| c.rpcs == 1);
    drop(c);
    let c = counters_when(&server, "the session closed", WAIT, |c| c.sessions_closed == 1);
    assert_eq!(c.send_bufs_in_use, 0, "the closed session's buffer was not given back: {c:?}");
    assert_eq!(c.send_pool_bytes, CHUNK * BUF, "{c:?}");
}
