//! Breaker review (branch `breaker`): a hostile peer, a careless user and races against the data
//! path of 145152a.. (ring bodies copied out once, bodies in pieces, buffer tokens, memory
//! windows, limits). Every test here that passes is something that held. A test whose name
//! starts with `finding_` FAILS on purpose: it reproduces a defect (see its comment for the
//! cause, file:line).
//!
//! All tests run on `sim`, with the yielding polling policy and bounded loops.
#![allow(unsafe_code)]

mod rpc_support;

use std::future::Future;
use std::time::{Duration, Instant};

use rpc_core::buffers::Completions;
use rpc_core::codegen::*;
use rpc_core::verbs::{QueuePair, SendFlags, SendOp, SendWr, Sge};
use rpc_core::wire::{Header, Kind, HEADER_LEN, METADATA_CACHED, METADATA_STORE};
use rpc_core::{Client, ServerHandle};
use rpc_support::*;

fn raw_request(session: u32, slot: u16, body_len: u32) -> Header {
    Header { method: RAW, slot, body_len, total_len: body_len, session, ..Header::new(Kind::Request) }
}

fn ring_piece(session: u32, slot: u16, offset: u32, body_len: u32, total_len: u32) -> Header {
    Header { in_ring: true, ring_offset: offset, total_len, ..raw_request(session, slot, body_len) }
}

/// Waits until the server has closed `n` sessions and counted `malformed` of them as malformed.
fn wait_closed(server: &ServerHandle, n: u64, malformed: u64) {
    let give_up = Instant::now() + WAIT;
    loop {
        let c = server.counters();
        if c.sessions_closed >= n && c.malformed >= malformed {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "server closed {} sessions ({} malformed), expected {n} ({malformed})",
            c.sessions_closed,
            c.malformed
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn serves_on(server: &ServerHandle) {
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    check_reply(
        &client.unary(ECHO, &request(9, 200_000, 200_000), &CallOptions::default()).unwrap(),
        9,
        200_000,
    );
}

/// Each hostile sequence of headers closes only its own session (counted malformed), never
/// panics a worker, and the server keeps serving. Held.
#[test]
fn hostile_piece_sequences_close_only_their_session() {
    // The raw clients' 4 credits granted at the handshake (none raised on demand).
    let (server, _) = spawn(server().ring_bytes(1 << 16).initial_credits(4));
    let piece = 1u32 << 12;
    let body = vec![0x5a; piece as usize];
    type Attack = fn(&mut RawClient, u32, &[u8]);
    let attacks: Vec<(&str, Attack)> = vec![
        ("total_len changes between pieces", |c, p, b| {
            let s = c.session;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, 3 * p)));
            c.write(p, b, Some(ring_piece(s, 0, p, p, 4 * p)));
        }),
        ("two generations interleaved on one slot", |c, p, b| {
            let s = c.session;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, 3 * p)));
            c.write(p, b, Some(Header { generation: 1, ..ring_piece(s, 0, p, p, 3 * p) }));
        }),
        ("another method continues the slot", |c, p, b| {
            let s = c.session;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, 3 * p)));
            c.write(p, b, Some(Header { method: ECHO, ..ring_piece(s, 0, p, p, 3 * p) }));
        }),
        ("pieces add up past total_len", |c, p, b| {
            let s = c.session;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, p + 1)));
            c.write(p, b, Some(ring_piece(s, 0, p, p, p + 1)));
        }),
        ("a piece with body_len 0", |c, p, b| {
            let s = c.session;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, 3 * p)));
            c.write(0, &[], Some(ring_piece(s, 0, p, 0, 3 * p)));
        }),
        ("total_len = u32::MAX", |c, p, b| {
            let s = c.session;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, u32::MAX)));
        }),
        ("total_len one over max_message_size", |c, p, b| {
            let s = c.session;
            let m = c.max_message;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, m + 1)));
        }),
        ("first piece not at the ring's tail", |c, p, b| {
            let s = c.session;
            c.write(64, b, Some(ring_piece(s, 0, 64, p, 3 * p)));
        }),
        ("piece past the end of the ring", |c, p, b| {
            let s = c.session;
            let off = c.ring_len - p / 2;
            c.write(0, b, Some(ring_piece(s, 0, off, p, 3 * p)));
        }),
        ("ring body at the eager threshold", |c, _, b| {
            let s = c.session;
            let e = c.eager;
            c.write(0, &b[..e as usize], Some(ring_piece(s, 0, 0, e, e)));
        }),
        ("freed_head beyond anything the server wrote", |c, _, _| {
            let s = c.session;
            c.send_eager(Header { freed_head: 12_345, ..raw_request(s, 0, 4) }, b"abcd");
        }),
        ("freed_head u32::MAX", |c, _, _| {
            let s = c.session;
            c.send_eager(Header { freed_head: u32::MAX, ..raw_request(s, 0, 4) }, b"abcd");
        }),
        ("more requests than credits, the first still in pieces", |c, p, b| {
            let s = c.session;
            c.write(0, b, Some(ring_piece(s, 0, 0, p, 3 * p)));
            // STASH answers never: with the unfinished slot 0 these hold every credit, and one
            // more is beyond them.
            for slot in 1..=c.credits {
                c.send_eager(Header { method: STASH, ..raw_request(s, slot, 0) }, &[]);
            }
        }),
        ("a response sent to the server", |c, _, _| {
            let s = c.session;
            c.send_eager(Header::new(Kind::Response).with_session(s), &[]);
        }),
        ("another session's id", |c, _, _| {
            let s = c.session;
            c.send_eager(raw_request(s ^ 0x55, 0, 4), b"abcd");
        }),
        ("a request naming the cached metadata block before any stored one", |c, _, _| {
            let s = c.session;
            c.send_eager(Header { metadata_cache: METADATA_CACHED, ..raw_request(s, 0, 4) }, b"abcd");
        }),
        ("the metadata store flag without a block", |c, _, _| {
            let s = c.session;
            c.send_eager(Header { metadata_cache: METADATA_STORE, ..raw_request(s, 0, 4) }, b"abcd");
        }),
        ("the metadata store flag on a ring body", |c, p, b| {
            let s = c.session;
            let h = Header { metadata: true, metadata_cache: METADATA_STORE, ..ring_piece(s, 0, 0, p, p) };
            c.write(0, b, Some(h));
        }),
    ];
    let mut closed = 0;
    for (what, attack) in attacks {
        let mut c = RawClient::connect(server.local_addr());
        attack(&mut c, piece, &body);
        closed += 1;
        let give_up = Instant::now() + WAIT;
        while server.counters().sessions_closed < closed {
            assert!(Instant::now() < give_up, "`{what}`: the session was not closed");
            c.poll();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(server.counters().malformed, closed, "`{what}` counted as malformed");
    }
    serves_on(&server);
    server.shutdown();
}

trait WithSession {
    fn with_session(self, s: u32) -> Self;
}
impl WithSession for Header {
    fn with_session(self, s: u32) -> Header {
        Header { session: s, ..self }
    }
}

/// A request in pieces that never finishes holds one credit (and one assembly), nothing more:
/// the other credits keep working, and the ring does not fill (each piece is freed at once).
/// Held.
#[test]
fn an_unfinished_request_in_pieces_holds_one_credit_and_no_ring_space() {
    let (server, _) = spawn(server().ring_bytes(1 << 16));
    let mut c = RawClient::connect(server.local_addr());
    let p = 1u32 << 12;
    let s = c.session;
    // Slot 0: first piece of a message 100 pieces long; then 40 more pieces (far more than the
    // ring holds) interleaved with eager requests on the other slots, never the last piece.
    c.write(0, &vec![1; p as usize], Some(ring_piece(s, 0, 0, p, 100 * p)));
    let mut off = p;
    let mut answered = 0;
    for i in 0..40u32 {
        if off + p > c.ring_len {
            off = 0;
        }
        c.write(off, &vec![i as u8; p as usize], Some(ring_piece(s, 0, off, p, 100 * p)));
        off += p;
        let slot = 1 + (i % 3) as u16;
        c.send_eager(Header { generation: i, ..raw_request(s, slot, 4) }, b"wxyz");
        let (h, _) = c.response(Duration::from_secs(10)).expect("an eager request beside the unfinished one");
        assert_eq!((h.slot, h.status), (slot, Code::Ok));
        answered += 1;
    }
    assert_eq!(answered, 40);
    assert_eq!(server.counters().malformed, 0);
    drop(c);
    wait_closed(&server, 1, 0);
    serves_on(&server);
    server.shutdown();
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// Up to 20 000 RingReturns (each freeing nothing) from one peer: the server's meter
/// (`session::meter`, issue 27) closes its session at the first one (it was kept up and
/// answering before), another client is served meanwhile. Held.
#[test]
fn a_ring_return_flood_closes_only_its_own_session() {
    let (server, _) = spawn(server());
    let mut c = RawClient::connect(server.local_addr());
    let s = c.session;
    let other = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    for i in 0..20_000u32 {
        if c.dead || server.counters().metered > 0 {
            break;
        }
        // Its QP learns late that the server's end is gone (its SENDs retry): no waiting for
        // send buffers here.
        let Some(mut b) = c.pool.acquire_for(&mut c.sq) else {
            let _ = c.sq.flush(&c.peer.qp, &mut c.pool, 1);
            c.poll();
            continue;
        };
        Header { session: s, ..Header::new(Kind::RingReturn) }.encode_into(c.pool.buf_mut(&mut b)).unwrap();
        c.sq.send(&mut c.pool, b, HEADER_LEN as u32, false);
        if i % 8 == 7 {
            let _ = c.sq.flush(&c.peer.qp, &mut c.pool, 1);
            c.poll();
        }
        if i % 2000 == 0 {
            check_reply(
                &other.unary(ECHO, &request(u64::from(i), 10, 10), &CallOptions::default()).unwrap(),
                u64::from(i),
                10,
            );
        }
    }
    let _ = c.sq.flush(&c.peer.qp, &mut c.pool, 1);
    wait_until(
        "the flooder's session to be closed by the meter",
        WAIT,
        || server.counters().metered == 1,
        || format!("{:?}", server.counters()),
    );
    check_reply(&other.unary(ECHO, &request(1, 10, 10), &CallOptions::default()).unwrap(), 1, 10);
    assert_eq!(server.counters().malformed, 0);
    assert_eq!(server.counters().sessions_closed, 1);
    drop(c);
    server.shutdown();
}

/// A response streamed in pieces to a call whose deadline passed mid-stream: the client
/// discards it when complete, the slot is reused only afterwards, and every later call on the
/// same client gets its own, intact answer. Swept over deadlines to hit every phase. Held.
#[test]
fn responses_in_pieces_to_abandoned_calls_never_reach_the_next_call() {
    let (server, _) = spawn(server().ring_bytes(1 << 16));
    let client =
        Client::connect_with(server.local_addr(), &client_config().ring_bytes(1 << 16).window(2)).unwrap();
    let mut expired = 0;
    for i in 0..30u64 {
        let d = Duration::from_micros(200 + 300 * i);
        match client.unary::<_, EchoMsg>(ECHO, &request(i, 50_000, 400_000), &CallOptions::deadline(d)) {
            Ok(r) => check_reply(&r, i, 400_000),
            Err(e) => {
                assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
                expired += 1;
            }
        }
        let r =
            client.unary::<_, EchoMsg>(ECHO, &request(1000 + i, 10, 3000), &CallOptions::default()).unwrap();
        check_reply(&r, 1000 + i, 3000);
    }
    assert!(expired > 0, "no deadline expired: the sweep did not test abandonment");
    assert_eq!(client.counters().malformed, 0);
    assert!(client.closed_reason().is_none());
    drop(client);
    server.shutdown();
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// A client dropped while its request is still going out in pieces (future polled a few
/// times, then the future and the client dropped): the server closes that session, frees
/// everything and serves on. Held.
#[test]
fn a_client_dropped_mid_stream_is_cleaned_up() {
    let (server, _) = spawn(server().ring_bytes(1 << 16));
    for round in 0..3u64 {
        let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
        {
            let fut =
                client.unary_async::<_, EchoMsg>(ECHO, &request(round, 2 << 20, 10), &CallOptions::default());
            let mut fut = std::pin::pin!(fut);
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            for _ in 0..(5 + round * 20) {
                assert!(fut.as_mut().poll(&mut cx).is_pending());
            }
        }
        drop(client);
    }
    wait_closed(&server, 3, 0);
    serves_on(&server);
    server.shutdown();
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// Rings below 64 KiB are refused at build time on both ends, naming `ring_bytes` (before, rings
/// of 1, 3, 31 and 100 bytes were accepted and carried bodies in 1-byte pieces: a WR per byte).
/// The smallest rings (64 KiB, and an odd 64 KiB + 3) with eager threshold 0 carry bodies of
/// any size both ways, larger ones in pieces of at least 1/16 of the ring. Held.
#[test]
fn tiny_rings_are_refused_and_the_smallest_with_eager_threshold_zero_carry_bodies() {
    for ring in [1u32, 100, (64 << 10) - 1] {
        let err = rpc_core::Server::builder().ring_bytes(ring).spawn("127.0.0.1:0").err().unwrap();
        assert!(err.to_string().contains("ring_bytes"), "{err}");
        let (server, _) = spawn(server());
        let err = Client::connect_with(server.local_addr(), &client_config().ring_bytes(ring)).err().unwrap();
        assert!(err.code() == Code::InvalidArgument && err.message().contains("ring_bytes"), "{err}");
        server.shutdown();
    }
    for ring in [64u32 << 10, (64 << 10) + 3] {
        let (server, _) = spawn(server().ring_bytes(ring).eager_threshold(0));
        let cfg = client_config().ring_bytes(ring).eager_threshold(0);
        let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
        let started = Instant::now();
        for (i, (req, rep)) in
            [(0usize, 0usize), (1, 1), (700, 1500), (200_000, 150_000)].into_iter().enumerate()
        {
            let r = client
                .unary::<_, EchoMsg>(
                    ECHO,
                    &request(i as u64, req, rep),
                    &CallOptions::deadline(Duration::from_secs(60)),
                )
                .unwrap_or_else(|e| panic!("ring {ring}: {e}"));
            check_reply(&r, i as u64, rep);
        }
        assert!(started.elapsed() < Duration::from_secs(60), "ring {ring}: {:?}", started.elapsed());
        drop(client);
        server.shutdown();
    }
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// Eight sessions on one worker, each with two calls of 300 KB bodies in flight through a
/// 64 KiB ring, from two threads. Held.
#[test]
fn many_sessions_with_big_bodies_in_pieces() {
    let (server, _) = spawn(server().ring_bytes(1 << 16));
    let addr = server.local_addr();
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            std::thread::spawn(move || {
                let cfg = client_config().ring_bytes(1 << 16);
                let clients: Vec<Client> =
                    (0..4).map(|_| Client::connect_with(addr, &cfg).unwrap()).collect();
                for round in 0..3u64 {
                    let futs: Vec<_> = clients
                        .iter()
                        .enumerate()
                        .flat_map(|(k, c)| {
                            (0..2u64).map(move |j| {
                                let seq = t * 1000 + round * 100 + k as u64 * 10 + j;
                                (
                                    seq,
                                    c.unary_async::<_, EchoMsg>(
                                        ECHO,
                                        &request(seq, 300_000, 300_000),
                                        &CallOptions::deadline(Duration::from_secs(60)),
                                    ),
                                )
                            })
                        })
                        .collect();
                    for (seq, f) in futs {
                        check_reply(&block_on(f).unwrap(), seq, 300_000);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(server.counters().malformed, 0);
    server.shutdown();
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// A peer that SENDs with invalidate naming the rkey of its own session's ring window (which it
/// learned at handshake): a protocol violation (only the ring's owner may end its window), so the
/// server closes the session as malformed instead of answering and serving on with its ring
/// window dead. (Found by this test: the worker once ignored `WorkCompletion::invalidated_rkey`
/// and handled the receive as a plain SEND.)
#[test]
fn send_with_inv_of_our_ring_window_closes_the_session() {
    let (server, _) = spawn(server());
    let mut c = RawClient::connect(server.local_addr());
    let s = c.session;
    let mut msg = vec![0u8; HEADER_LEN + 4];
    raw_request(s, 0, 4).encode_into(&mut msg).unwrap();
    msg[HEADER_LEN..].copy_from_slice(b"abcd");
    let sge = [Sge { addr: msg.as_ptr() as u64, length: msg.len() as u32, lkey: 0 }];
    let wr = SendWr {
        wr_id: 0xdead,
        sg_list: &sge,
        op: SendOp::SendWithInv { invalidate_rkey: c.ring.1 },
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
    };
    // SAFETY: an inline SEND: the data is copied at post time from `msg`, alive here.
    unsafe { c.peer.qp.post_send(&[wr]) }.unwrap();
    let give_up = Instant::now() + WAIT;
    let mut answered = false;
    while Instant::now() < give_up && server.counters().sessions_closed == 0 {
        let wcs = Completions::<8>::new();
        wcs.poll(&c.peer.cq).unwrap();
        for wc in wcs {
            if wc.wc().wr_id != 0xdead && wc.send_tag().is_none() {
                if let Some(buf) = c.peer.recv.take(wc) {
                    answered = true;
                    c.peer.recv.repost(buf);
                }
            }
        }
        c.peer.recv.flush().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("answered after invalidating the window: {answered}");
    assert_eq!(
        server.counters().sessions_closed,
        1,
        "a peer invalidated its session's ring window: the session must close (answered: {answered})"
    );
    server.shutdown();
}

/// How many pieces (not the last of their message) one ring holds at once, for every ring
/// length 1..=1024 and consumers that free the oldest piece on a stall and/or at random.
/// `srq_need` (endpoint/conn.rs) reserves `MAX_PIECES_IN_RING` = 16 SRQ WQEs per session
/// for them, on the claim (session/mod.rs:22-24) that every such piece takes at least 1/16 of
/// the ring. HELD: that claim is loose (the floor is `(len / 4) / 4` rounded down,
/// session/mod.rs:212-214, e.g. 1 byte for a 31-byte ring) but pieces stay within 16 because
/// a piece is only small at the end of the ring. A count above 16 would mean SENDs beyond the
/// SRQ WQEs reserved, i.e. flow control leaning on RNR.
#[test]
fn small_rings_never_hold_more_pieces_than_srq_need_reserves() {
    use rpc_core::session::{RingConsumer, RingProducer, MAX_PIECES_IN_RING};
    use std::collections::VecDeque;
    let mut worst = Vec::new();
    for (len, policy) in (1u32..=1024).flat_map(|l| (0u64..6).map(move |k| (l, k))) {
        let max = (len / 4).max(1);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (u64::from(len) << 8) ^ policy;
        let mut p = RingProducer::new(len);
        let mut c = RingConsumer::new(len, 64);
        let mut held = VecDeque::new();
        let mut most = 0usize;
        for _ in 0..2000 {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            // Policy 0: free only on a stall; 1..=5: also free the oldest at random (10..50%).
            if policy > 0 && !held.is_empty() && (rng >> 33) % 10 < policy * 2 - 1 {
                let t = held.pop_front().unwrap();
                c.release(t);
                p.on_freed(c.take_freed()).unwrap();
                continue;
            }
            match p.reserve_piece(max, max / 4) {
                Some((off, n)) => {
                    // Its WRITE completes at once: only the consumer holds ring space here.
                    p.on_written(p.tail()).unwrap();
                    held.push_back(c.accept(off, n).unwrap());
                    most = most.max(held.len());
                }
                None => {
                    let t = held.pop_front().expect("an empty ring takes a piece");
                    c.release(t);
                    p.on_freed(c.take_freed()).unwrap();
                }
            }
        }
        if most > MAX_PIECES_IN_RING as usize {
            worst.push((len, policy, most));
        }
    }
    assert!(
        worst.is_empty(),
        "{} ring lengths hold more than {MAX_PIECES_IN_RING} pieces at once, e.g. {:?}",
        worst.len(),
        &worst[..worst.len().min(12)]
    );
}

/// A fake server: handshakes (with `tweak` applied to its reply), waits for the first request,
/// then lets `answer` send what it likes through `RawClient`-like parts. Returns the thread.
fn fake_server(
    tweak: fn(&mut rpc_core::wire::Handshake),
    answer: fn(&mut RawClient, Header),
) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut c, tcp) = RawClient::accept(&listener, 77, tweak);
        let Some((req, _)) = c.response(Duration::from_secs(10)) else { return };
        answer(&mut c, req);
        // Stay up (the TCP channel open) for a while so the client judges the messages only.
        std::thread::sleep(Duration::from_millis(1500));
        drop(tcp);
    });
    (addr, t)
}

fn response_to(req: Header) -> Header {
    Header {
        slot: req.slot,
        generation: req.generation,
        method: req.method,
        session: 77,
        ..Header::new(Kind::Response)
    }
}

/// A fake server answering in ways the client must refuse: the client closes the session
/// (malformed, UNAVAILABLE for the call), never panics and leaks nothing. Held.
#[test]
fn a_hostile_server_answering_wrongly_is_refused_by_the_client() {
    type Answer = fn(&mut RawClient, Header);
    let cases: Vec<(&str, Answer)> = vec![
        ("response piece with total_len over the client's max_message_size", |c, req| {
            let m = c.max_message;
            c.write(
                0,
                &[1; 8192],
                Some(Header { in_ring: true, body_len: 8192, total_len: m + 1, ..response_to(req) }),
            );
        }),
        ("response piece with total_len u32::MAX", |c, req| {
            c.write(
                0,
                &[1; 8192],
                Some(Header { in_ring: true, body_len: 8192, total_len: u32::MAX, ..response_to(req) }),
            );
        }),
        ("pieces whose total_len changes", |c, req| {
            // Pieces of 1/16 of the client's 1 MiB ring (smaller ones are refused for that).
            const P: u32 = 64 << 10;
            c.write(
                0,
                &[1; P as usize],
                Some(Header { in_ring: true, body_len: P, total_len: 3 * P, ..response_to(req) }),
            );
            c.write(
                P,
                &[1; P as usize],
                Some(Header {
                    in_ring: true,
                    ring_offset: P,
                    body_len: P,
                    total_len: 4 * P,
                    ..response_to(req)
                }),
            );
        }),
        ("response to a slot outside the window", |c, req| {
            c.send_eager(Header { slot: 999, ..response_to(req) }, &[]);
        }),
        ("response with a stale generation", |c, req| {
            c.send_eager(Header { generation: req.generation.wrapping_add(5), ..response_to(req) }, &[]);
        }),
        ("two responses to one call", |c, req| {
            c.send_eager(response_to(req), &[]);
            c.send_eager(response_to(req), &[]);
        }),
        ("a request sent to the client", |c, req| {
            c.send_eager(Header { method: ECHO, ..raw_request(77, req.slot, 0) }, &[]);
        }),
        ("ring body past the end of the client's ring", |c, req| {
            let off = c.ring_len - 100;
            c.write(
                0,
                &[1; 8192],
                Some(Header {
                    in_ring: true,
                    ring_offset: off,
                    body_len: 8192,
                    total_len: 8192,
                    ..response_to(req)
                }),
            );
        }),
        ("freed_head out of range", |c, req| {
            c.send_eager(Header { freed_head: 0x8000_0000, ..response_to(req) }, &[]);
        }),
    ];
    for (what, answer) in cases {
        let (addr, fake) = fake_server(|_| {}, answer);
        let client = Client::connect_with(addr, &client_config()).unwrap();
        let first = client.unary::<_, EchoMsg>(
            ECHO,
            &request(1, 10, 10),
            &CallOptions::deadline(Duration::from_secs(20)),
        );
        // "two responses": the first is a valid (empty) answer; the second must close.
        let second = client.unary::<_, EchoMsg>(
            ECHO,
            &request(2, 10, 10),
            &CallOptions::deadline(Duration::from_secs(5)),
        );
        assert!(first.is_err() || second.is_err(), "`{what}`: accepted");
        let give_up = Instant::now() + WAIT;
        while client.counters().malformed == 0 && Instant::now() < give_up {
            client.progress();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(client.counters().malformed, 1, "`{what}`: the client counted it malformed");
        assert!(client.closed_reason().is_some(), "`{what}`: the session is closed");
        drop(client);
        fake.join().unwrap();
    }
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// A server whose handshake advertises a 1 GiB ring (the protocol's maximum): the client refuses
/// it at the handshake, naming its cap, instead of registering a send mirror that large for the
/// connection. (Found by this test: a hostile or misconfigured server once made every client pin
/// 1 GiB of registered memory per connection.)
#[test]
fn a_server_advertising_a_1_gib_ring_is_refused_at_the_handshake() {
    let (addr, fake) = fake_server(
        |h| h.ring_len = rpc_core::wire::MAX_RING_LEN,
        |c, req| {
            c.send_eager(response_to(req), &[]);
        },
    );
    let started = Instant::now();
    let r = Client::connect_with(addr, &client_config());
    eprintln!("connect with a 1 GiB peer ring: {:?} in {:?}", r.as_ref().map(|_| ()), started.elapsed());
    let refused = match &r {
        Err(e) => e.message().contains("ring_len"),
        Ok(c) => {
            let _ = c.unary::<_, EchoMsg>(
                ECHO,
                &request(1, 10, 10),
                &CallOptions::deadline(Duration::from_secs(5)),
            );
            false
        }
    };
    drop(r);
    fake.join().unwrap();
    assert!(refused, "the client accepted (and registered a mirror for) a 1 GiB peer ring");
}

/// A careless handler that defers and never answers (STASH keeps the responder), called with a
/// deadline, on a window of 2: after both deadlines a new call is served, because the abandoned
/// slots come back (the server answers each expired call DEADLINE_EXCEEDED itself, or CANCELLED on
/// the client's Cancel, and acknowledges the Cancel). This alone cannot tell the server's timer
/// from the client's Cancel; `server_answers_an_expired_deferred_call_deadline_exceeded_itself`
/// (a raw client that sends no Cancel) isolates the timer. (Found by this test: no timer once
/// answered an expired deferred call, so the window was lost for good.)
#[test]
fn finding_expired_deferred_calls_never_answered_exhaust_the_client_window() {
    let (server, stash) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    for i in 0..2 {
        let e = client
            .unary::<_, EchoMsg>(STASH, &request(i, 1, 1), &CallOptions::deadline(Duration::from_millis(50)))
            .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    }
    // The server answers DEADLINE_EXCEEDED itself at both deadlines, which frees the slots: a
    // call succeeds soon after (without those answers the slots stay taken and every call fails
    // until `WAIT`, a hang guard; 2 s here was a timed assertion on a loaded machine).
    let give_up = Instant::now() + WAIT;
    let mut last = None;
    while Instant::now() < give_up {
        match client.unary::<_, EchoMsg>(
            ECHO,
            &request(7, 10, 10),
            &CallOptions::deadline(Duration::from_secs(1)),
        ) {
            Ok(r) => {
                check_reply(&r, 7, 10);
                last = None;
                break;
            }
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stashed = stash.lock().unwrap().len();
    stash.lock().unwrap().clear();
    drop(client);
    server.shutdown();
    assert!(last.is_none(), "a healthy connection refuses every call: {last:?} ({stashed} stashed calls)");
}

/// A deferred call that is never answered and not cancelled (a raw client: it sends no
/// Cancel), with a 50 ms timeout: the server answers DEADLINE_EXCEEDED itself at the deadline,
/// the responder sees `is_cancelled`, and its late answer is dropped and counted. Without the
/// worker's timers no answer ever came.
#[test]
fn server_answers_an_expired_deferred_call_deadline_exceeded_itself() {
    let (server, stash) = spawn(server());
    let mut c = RawClient::connect(server.local_addr());
    let s = c.session;
    c.send_eager(Header { method: STASH, generation: 3, timeout_us: 50_000, ..raw_request(s, 1, 0) }, &[]);
    let (h, body) = c.response(Duration::from_secs(5)).expect("the server answered the expired call");
    assert_eq!((h.kind, h.slot, h.generation), (Kind::Response, 1, 3));
    assert_eq!(h.status, Code::DeadlineExceeded, "{}", String::from_utf8_lossy(&body));
    assert_eq!(stash.lock().unwrap().len(), 1, "the handler ran (deferred) before the deadline");
    let r = stash.lock().unwrap().pop().unwrap();
    assert!(r.is_cancelled(), "the responder knows");
    r.send(Ok(EchoMsg::default()));
    let give_up = Instant::now() + WAIT;
    while server.counters().late_answers < 1 {
        assert!(Instant::now() < give_up, "the late answer was not counted");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(c.response(Duration::from_millis(100)).is_none(), "the late answer was not sent");
    assert_eq!(server.counters().with_code(Code::DeadlineExceeded), 1);
    // The credit came back: a full window of calls is served.
    for slot in 0..c.credits {
        c.send_eager(Header { generation: 4, ..raw_request(s, slot, 4) }, b"abcd");
    }
    for _ in 0..c.credits {
        let (h, _) = c.response(Duration::from_secs(5)).expect("answered");
        assert_eq!(h.status, Code::Ok);
    }
    server.shutdown();
}

/// A request whose deadline passes before its handler can run (its body still arriving in
/// pieces when the 1 ms timeout ends) is answered DEADLINE_EXCEEDED and its handler never runs;
/// a Cancel for an unanswered deferred call is answered CANCELLED at once and its responder
/// told; a Cancel for a call answered already changes nothing but is acknowledged, as every
/// Cancel is.
#[test]
fn cancel_and_expiry_before_dispatch_answer_without_the_handler() {
    let (server, stash) = spawn(server());
    let mut c = RawClient::connect(server.local_addr());
    let s = c.session;
    c.send_eager(Header { method: STASH, generation: 1, ..raw_request(s, 0, 0) }, &[]);
    let give_up = Instant::now() + WAIT;
    while stash.lock().unwrap().is_empty() {
        assert!(Instant::now() < give_up, "the handler did not run");
        c.poll();
        std::thread::yield_now();
    }
    c.send_eager(Header { slot: 0, generation: 1, session: s, ..Header::new(Kind::Cancel) }, &[]);
    let (h, _) = c.response(Duration::from_secs(5)).expect("the cancelled call was answered");
    assert_eq!((h.slot, h.generation, h.status), (0, 1, Code::Cancelled));
    assert!(stash.lock().unwrap()[0].is_cancelled());
    // Cancelling it again, or a call never sent: nothing but the acknowledgements.
    c.send_eager(Header { slot: 0, generation: 1, session: s, ..Header::new(Kind::Cancel) }, &[]);
    c.send_eager(Header { slot: 2, generation: 9, session: s, ..Header::new(Kind::Cancel) }, &[]);
    assert!(c.response(Duration::from_millis(100)).is_none());
    assert_eq!(c.acks, [(0, 1), (0, 1), (2, 9)], "every Cancel is acknowledged, in order");
    // A STASH request in two ring pieces with a 1 ms deadline, the second piece sent late.
    // Pieces of 1/16 of the server's ring (the smallest a piece that is not the last may be).
    let (p, total) = (c.ring_len / 16, 2 * (c.ring_len / 16));
    let first = Header { method: STASH, generation: 2, timeout_us: 1_000, ..ring_piece(s, 1, 0, p, total) };
    let zeros = vec![0u8; p as usize];
    c.write(0, &zeros, Some(first));
    let (h, _) = c.response(Duration::from_secs(5)).expect("the expired call was answered");
    assert_eq!((h.slot, h.generation, h.status), (1, 2, Code::DeadlineExceeded));
    c.write(p, &zeros, Some(Header { ring_offset: p, ..first }));
    // Served in order after it: an echo; by then the pieced request was complete and dropped.
    c.send_eager(Header { generation: 3, ..raw_request(s, 2, 4) }, b"abcd");
    let (h, _) = c.response(Duration::from_secs(5)).expect("answered");
    assert_eq!((h.slot, h.status), (2, Code::Ok));
    assert_eq!(stash.lock().unwrap().len(), 1, "the expired request's handler never ran");
    assert_eq!(server.counters().malformed, 0);
    stash.lock().unwrap().clear();
    server.shutdown();
}

/// A client that stops polling (a raw client here, as a SIGSTOPped process would) while its
/// deferred call is unanswered: the worker's idle probe gets no Pong, and after
/// `peer_timeout` the session is closed (counted in `peers_lost`), its responder told. A
/// client that answers the Pings keeps its session past three of them (a round in which this
/// thread itself stalled longer than a probe interval is repeated: it proves nothing).
#[test]
fn server_closes_a_silent_client_with_unanswered_calls_after_peer_timeout() {
    let (server, stash) = spawn(server().peer_timeout(Some(Duration::from_millis(600))));
    let mut quiet = RawClient::connect(server.local_addr());
    let s = quiet.session;
    quiet.send_eager(Header { method: STASH, generation: 1, ..raw_request(s, 0, 0) }, &[]);
    let give_up = Instant::now() + WAIT;
    while server.counters().peers_lost < 1 {
        assert!(Instant::now() < give_up, "the silent client's session was never closed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.counters().sessions_closed, 1);
    assert!(stash.lock().unwrap().iter().all(Responder::is_cancelled), "its responder was told");
    stash.lock().unwrap().clear();
    // A client that answers Pings (as a polling Client does) keeps its session through three
    // of them. Only this thread's own stalls could make its Pong late (a loaded machine): a
    // round in which it went more than a third of `peer_timeout` between two polls proves
    // nothing and is repeated with a fresh session; in a round without such a stall the session
    // must survive. (The rule itself is timed on a fake clock in the session's tests.)
    let margin = Duration::from_millis(600 / 3);
    let mut stalled = Vec::new();
    for _round in 0..5 {
        let lost_before = server.counters().peers_lost;
        let mut live = RawClient::connect(server.local_addr());
        let s = live.session;
        live.send_eager(Header { method: STASH, generation: 1, ..raw_request(s, 0, 0) }, &[]);
        let give_up = Instant::now() + Duration::from_secs(20);
        let (mut pings, mut last, mut worst) = (0, Instant::now(), Duration::ZERO);
        let closed = loop {
            let gap = last.elapsed();
            last = Instant::now();
            worst = worst.max(gap);
            if server.counters().peers_lost > lost_before {
                break true;
            }
            if pings >= 3 {
                break false;
            }
            assert!(Instant::now() < give_up, "{pings} pings in 20 s with a 600 ms peer_timeout");
            let wcs = Completions::<8>::new();
            wcs.poll(&live.peer.cq).unwrap();
            for c in wcs {
                if c.send_tag().is_some() {
                    live.sq.on_completion(c, &mut live.pool);
                } else if let Some(buf) = live.peer.recv.take(c) {
                    let h = Header::decode(live.peer.recv.bytes(&buf)).unwrap();
                    live.peer.recv.repost(buf);
                    if h.kind == Kind::Ping {
                        pings += 1;
                        live.send_eager(Header::new(Kind::Pong).with_session(s), &[]);
                    }
                }
            }
            live.peer.recv.flush().unwrap();
            std::thread::sleep(Duration::from_millis(5));
        };
        if closed {
            assert!(
                worst > margin,
                "the server closed a client that answered each Ping within {worst:?} (peer_timeout 600 ms)"
            );
            stalled.push(worst);
            stash.lock().unwrap().clear();
            continue;
        }
        stash.lock().unwrap().pop().unwrap().send(Ok(EchoMsg::default()));
        let (h, _) = live.response(Duration::from_secs(5)).expect("its answer");
        assert_eq!(h.status, Code::Ok);
        assert_eq!(server.counters().peers_lost, lost_before, "the answering client was not closed");
        server.shutdown();
        return;
    }
    panic!("every round stalled this thread beyond {margin:?} between polls: {stalled:?}");
}

/// max_sessions 2: a third client is refused with a clear status, the two work, and 20 cycles
/// of connect/drop never leak a session slot or SRQ reservation (srq_reserved / sessions
/// counted back on every close path). Held.
#[test]
fn session_limit_refuses_cleanly_and_never_leaks_across_cycles() {
    let (server, _) = spawn(server().max_sessions(2));
    let a = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let b = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let third = Client::connect_with(server.local_addr(), &client_config());
    match &third {
        Err(e) => eprintln!("third refused: {e}"),
        Ok(c) => {
            let r = c.unary::<_, EchoMsg>(
                ECHO,
                &request(3, 10, 10),
                &CallOptions::deadline(Duration::from_secs(5)),
            );
            panic!("a third session over max_sessions 2 was accepted (call: {r:?})");
        }
    }
    drop(third);
    for c in [&a, &b] {
        check_reply(&c.unary(ECHO, &request(1, 10, 10), &CallOptions::default()).unwrap(), 1, 10);
    }
    drop(b);
    for i in 0..20u64 {
        let give_up = Instant::now() + WAIT;
        let c = loop {
            match Client::connect_with(server.local_addr(), &client_config()) {
                Ok(c) => break c,
                Err(e) => {
                    assert!(Instant::now() < give_up, "cycle {i}: the freed session never came back: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        check_reply(&c.unary(ECHO, &request(i, 20_000, 20_000), &CallOptions::default()).unwrap(), i, 20_000);
    }
    check_reply(&a.unary(ECHO, &request(99, 10, 10), &CallOptions::default()).unwrap(), 99, 10);
    drop(a);
    server.shutdown();
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// Pieces of three messages on three slots interleaved (A B C A C B A ...), finishing in an
/// order different from their start (the assemblies are swap_removed as they complete): each
/// handler sees exactly its own bytes. Held.
#[test]
fn interleaved_messages_on_different_slots_are_reassembled_apart() {
    let (server, _) = spawn(server().ring_bytes(1 << 16));
    let mut c = RawClient::connect(server.local_addr());
    let s = c.session;
    let p = 1u32 << 12;
    // Slot k's message has pieces[k] pieces, byte value = slot * 16 + piece index.
    let pieces = [5u32, 2, 3];
    let order = [0u16, 1, 2, 0, 2, 1, 0, 2, 0, 0];
    let mut next = [0u32; 3];
    let mut off = 0u32;
    let mut bodies: [Vec<u8>; 3] = Default::default();
    for &k in &order {
        let i = next[k as usize];
        let bytes = vec![(k as u8) * 16 + i as u8; p as usize];
        bodies[k as usize].extend_from_slice(&bytes);
        if off + p > c.ring_len {
            off = 0;
        }
        let total = pieces[k as usize] * p;
        c.write(off, &bytes, Some(ring_piece(s, k, off, p, total)));
        off += p;
        next[k as usize] += 1;
    }
    assert_eq!(next, pieces);
    let mut seen = 0;
    let give_up = Instant::now() + WAIT;
    while seen < 3 {
        assert!(Instant::now() < give_up, "{seen} of 3 answered");
        if let Some((h, body)) = c.poll() {
            assert_eq!(h.status, Code::Ok);
            let r = EchoMsg::decode(&body[..]).unwrap();
            let want = &bodies[h.slot as usize];
            assert_eq!((r.seq, r.checksum), (want.len() as u64, fnv64(want)), "slot {}", h.slot);
            seen += 1;
        }
        std::thread::yield_now();
    }
    assert_eq!(server.counters().malformed, 0);
    server.shutdown();
}

/// A client that asks for large answers and never frees its ring (every header it sends
/// carries freed_head 0): the server's answers stall in its backlog for that session only;
/// another client is served meanwhile; when the stalling client goes, everything is freed.
/// Held.
#[test]
fn a_client_that_never_frees_its_ring_stalls_only_itself() {
    let (server, _) = spawn(server());
    let mut c = RawClient::connect(server.local_addr());
    let s = c.session;
    for slot in 0..c.credits {
        let body = request(u64::from(slot), 10, 300_000).encode_to_vec();
        c.send_eager(Header { method: ECHO, ..raw_request(s, slot, body.len() as u32) }, &body);
    }
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        c.poll();
        std::thread::yield_now();
    }
    let other = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    for i in 0..5 {
        check_reply(
            &other.unary(ECHO, &request(i, 100_000, 100_000), &CallOptions::default()).unwrap(),
            i,
            100_000,
        );
    }
    drop(c);
    wait_closed(&server, 1, 0);
    check_reply(&other.unary(ECHO, &request(9, 10, 10), &CallOptions::default()).unwrap(), 9, 10);
    drop(other);
    server.shutdown();
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}

/// A server of one session of `credits` (granted at the handshake), a 64 KiB ring and an SRQ
/// sized for it, with the echo service and [`Hold`]: the flag turns true when a call holds the
/// worker; dropping the gate lets it go.
fn held_server(credits: u16) -> (ServerHandle, std::sync::Arc<std::sync::atomic::AtomicBool>, HoldGate) {
    let (hold, gate) = Hold::new();
    let server = server()
        .max_sessions(1)
        .credits_per_session(credits)
        .initial_credits(credits)
        .ring_bytes(1 << 16)
        .add_service(TestService::default())
        .add_service(hold)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    (server, gate.entered_flag(), gate)
}

/// Waits until every SEND of `c` completed (landed in a receive WQE) while the worker is still
/// held, then lets it go; returns how many of them waited for a receive WQE (RNR).
///
/// # Panics
/// When SENDs are still outstanding after [`WAIT`] and none waited for a receive WQE (else the
/// caller's count of 0 stalls would pass on SENDs that never landed).
fn stalls_while_held(c: &mut RawClient, guard: HoldGate) -> u64 {
    // A SEND that waits for a receive WQE while the worker is held stays outstanding until it is
    // released: a stall decides the outcome (the caller fails on it) as well as all landing.
    wait_until(
        "every SEND to land in a receive WQE (or one to wait for one) while the worker is held",
        WAIT,
        || {
            c.poll();
            c.sq.outstanding() == 0 || c.peer.qp.rnr_stalls() > 0
        },
        String::new,
    );
    let stalls = c.peer.qp.rnr_stalls();
    drop(guard);
    stalls
}

/// A client at its SRQ reservation (`ServerConfig::srq_per_session`: 2 × credits + max(credits, 16) + 32) while its
/// worker takes nothing (held in a handler): every request its credits allow, 15 more pieces of a
/// ring body, a Cancel per call, a RingReturn per call, the 8 stream SENDs beyond its credits
/// (stream ends), two Pings, two Pongs and a Close all find
/// a receive WQE, on an SRQ sized by default for one such session: its SENDs never wait for one
/// (RNR). With the old reservation (2 × credits + 17 = 81 WQEs) such messages ran the SRQ dry
/// and its SENDs waited.
#[test]
fn a_session_at_its_srq_reservation_never_waits_for_a_receive_wqe() {
    use std::sync::atomic::Ordering;
    const CREDITS: u16 = 32;
    let (server, entered, guard) = held_server(CREDITS);
    let reserved = rpc_core::ServerConfig::srq_per_session(CREDITS);
    let mut c = RawClient::connect_with(server.local_addr(), CREDITS, 4096, 1 << 20);
    assert_eq!(c.credits, CREDITS);
    let s = c.session;
    let mut sent = 0u32;
    // Slot 0 holds the worker.
    c.send_eager(Header { method: HOLD, session: s, ..raw_request(s, 0, 0) }, &[]);
    sent += 1;
    let give_up = Instant::now() + WAIT;
    while !entered.load(Ordering::Acquire) {
        assert!(Instant::now() < give_up, "the held call never reached its handler");
        c.poll();
        std::thread::yield_now();
    }
    // Slot 1: a ring body of 16 pieces of 1/16 of the ring each (15 more than its request).
    let piece = c.ring_len / 16;
    let body = vec![0x33u8; piece as usize];
    for k in 0..16 {
        c.write(k * piece, &body, Some(ring_piece(s, 1, k * piece, piece, 16 * piece)));
    }
    sent += 16;
    for slot in 2..CREDITS {
        c.send_eager(raw_request(s, slot, 0), &[]);
        sent += 1;
    }
    for slot in 0..CREDITS {
        c.send_eager(Header { slot, session: s, ..Header::new(Kind::Cancel) }, &[]);
        c.send_eager(Header { session: s, ..Header::new(Kind::RingReturn) }, &[]);
        sent += 2;
    }
    // The stream SENDs only the 8 credits beyond `credits` allow (stream ends of a unary call
    // change nothing, but take their WQEs).
    for _ in 0..rpc_core::session::STREAM_RESERVED_CREDITS {
        c.send_eager(Header { slot: 0, session: s, ..Header::new(Kind::StreamEnd) }, &[]);
        sent += 1;
    }
    for kind in [Kind::Ping, Kind::Ping, Kind::Pong, Kind::Pong, Kind::Close] {
        c.send_eager(Header { session: s, ..Header::new(kind) }, &[]);
        sent += 1;
    }
    let stalls = stalls_while_held(&mut c, guard);
    assert_eq!(stalls, 0, "{sent} messages of a session reserving {reserved} WQEs waited for a receive WQE");
    assert!(sent <= reserved, "{sent} messages sent, {reserved} reserved");
    wait_closed(&server, 1, 0);
    drop(c);
    server.shutdown();
}

/// A hostile-but-legal client whose Cancels cross their calls' answers, at its SRQ reservation
/// while its worker takes nothing: the credits, Cancels and ring space it uses are decided by a
/// client [`rpc_core::session::Session`] of its own (the protocol's rule, not this test's), and
/// it sends everything that session allows as early as the wire allows. It starts `CREDITS / 2`
/// calls, gives each up and holds their Cancels back (in the network, as it were) until each
/// call's answer has arrived; then a call holds the worker, the held-back Cancels go, every
/// call its credits still allow goes (one a ring body of 16 pieces), every call on the wire is
/// cancelled, and a RingReturn per credit, two Pings, two Pongs and a Close follow. The rule
/// that a Cancel holds its call's credit until the server's CancelAck arrives keeps all of it
/// within `ServerConfig::srq_per_session`: no SEND waits for a receive WQE (RNR). Under the
/// old rule (the credit returned with the answer) the crossed Cancels' credits carry 16 more
/// requests and 16 more Cancels: 132 messages for 127 WQEs, and SENDs wait.
#[test]
fn crossed_cancels_keep_a_session_within_its_srq_reservation() {
    use rpc_core::session::Session;
    use std::sync::atomic::Ordering;
    const CREDITS: u16 = 32;
    const CROSSED: u16 = CREDITS / 2;
    let (server, entered, guard) = held_server(CREDITS);
    let reserved = rpc_core::ServerConfig::srq_per_session(CREDITS);
    let mut c = RawClient::connect_with(server.local_addr(), CREDITS, 4096, 1 << 20);
    assert_eq!(c.credits, CREDITS);
    let mut sess = c.client_session();
    let now = Instant::now;
    let mut sent = 0u32;
    let send = |c: &mut RawClient, sess: &mut Session, mut h: Header, sent: &mut u32| {
        sess.stamp(&mut h);
        c.send_eager(h, &[]);
        *sent += 1;
    };
    // The answers its session is told about (its Cancels' acknowledgements cannot come: the
    // worker is held from phase 2 on).
    let take_answers = |c: &mut RawClient, sess: &mut Session, n: usize| {
        let give_up = Instant::now() + WAIT;
        let mut got = 0;
        while got < n {
            assert!(Instant::now() < give_up, "{got} of {n} answers arrived");
            match c.poll() {
                Some((h, _)) => {
                    sess.handle_header(&h, now).expect("a legal answer");
                    assert_eq!(h.kind, Kind::Response);
                    sess.on_response(h.slot, h.generation).expect("an answer to a call on the wire");
                    got += 1;
                }
                None => std::thread::yield_now(),
            }
        }
    };
    // Phase 1: calls whose Cancels will cross their answers.
    let mut delayed = Vec::new();
    let mut calls = Vec::new();
    for _ in 0..CROSSED {
        calls.push(sess.start_call(RAW, None, 0).expect("a free slot"));
        let h = sess.next_request(now).expect("a free credit");
        send(&mut c, &mut sess, h, &mut sent);
    }
    for (slot, generation) in calls.drain(..) {
        sess.abandon_call(slot, generation, false, now);
    }
    while let Some(h) = sess.next_control() {
        delayed.push(h);
    }
    assert_eq!(delayed.len(), usize::from(CROSSED));
    take_answers(&mut c, &mut sess, usize::from(CROSSED));
    // The worker took those requests: what counts is what reaches it from here on.
    sent = 0;
    // Phase 2: a call holds the worker.
    let hold_call = sess.start_call(HOLD, None, 0).expect("a free slot");
    let h = sess.next_request(now).expect("a credit for the held call");
    send(&mut c, &mut sess, h, &mut sent);
    calls.push(hold_call);
    let give_up = Instant::now() + WAIT;
    while !entered.load(Ordering::Acquire) {
        assert!(Instant::now() < give_up, "the held call never reached its handler");
        c.poll();
        std::thread::yield_now();
    }
    // Phase 3: the crossed Cancels arrive, then everything the session still allows.
    for h in delayed {
        send(&mut c, &mut sess, h, &mut sent);
    }
    let mut first = true;
    while let Some(call) = sess.start_call(RAW, None, 0) {
        let Some(h) = sess.next_request(now) else {
            sess.abandon_call(call.0, call.1, false, now);
            break;
        };
        calls.push(call);
        if std::mem::take(&mut first) {
            // A ring body in 16 pieces of 1/16 of the ring each (15 messages more).
            let piece = c.ring_len / 16;
            let body = vec![0x5au8; piece as usize];
            for _ in 0..16 {
                let (offset, len) = sess.next_piece(piece).expect("ring space for a piece");
                let mut p =
                    Header { in_ring: true, ring_offset: offset, body_len: len, total_len: 16 * piece, ..h };
                sess.stamp(&mut p);
                c.write(offset, &body[..len as usize], Some(p));
                sent += 1;
            }
        } else {
            send(&mut c, &mut sess, h, &mut sent);
        }
    }
    for (slot, generation) in calls.drain(..) {
        sess.abandon_call(slot, generation, false, now);
    }
    while let Some(h) = sess.next_control() {
        send(&mut c, &mut sess, h, &mut sent);
    }
    for _ in 0..CREDITS {
        send(&mut c, &mut sess, Header::new(Kind::RingReturn), &mut sent);
    }
    for kind in [Kind::Ping, Kind::Ping, Kind::Pong, Kind::Pong, Kind::Close] {
        send(&mut c, &mut sess, Header::new(kind), &mut sent);
    }
    let stalls = stalls_while_held(&mut c, guard);
    assert_eq!(stalls, 0, "{sent} messages of a session reserving {reserved} WQEs waited for a receive WQE");
    assert!(sent <= reserved, "{sent} messages sent, {reserved} reserved");
    assert_eq!(sent, 3 * u32::from(CREDITS) + 20 - u32::from(CROSSED), "every kind at what the rule allows");
    // The server found all of it legal.
    wait_closed(&server, 1, 0);
    drop(c);
    server.shutdown();
}

/// `max_sessions_per_peer` 2 (issue 28 item 2): a third session from one address is refused
/// RESOURCE_EXHAUSTED naming the cap and the address, while another address (`::1` beside
/// `127.0.0.1`, on a dual-stack listener) still connects and the first two serve on; a session
/// that closes gives its place back. A cap above `max_sessions` is refused at spawn.
#[test]
fn a_peer_over_its_session_cap_is_refused_and_others_are_not() {
    let e = server().max_sessions(4).max_sessions_per_peer(5).spawn("127.0.0.1:0").err().expect("refused");
    assert!(e.to_string().contains("max_sessions_per_peer"), "{e}");
    let capped = || server().max_sessions(8).max_sessions_per_peer(2).add_service(TestService::default());
    let (server, dual) = match capped().spawn("[::]:0") {
        Ok(s) => (s, true),
        Err(e) => {
            eprintln!("no IPv6 here ({e}): one address only");
            (capped().spawn("127.0.0.1:0").expect("server"), false)
        }
    };
    let port = server.local_addr().port();
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let a = Client::connect_with(v4, &client_config()).unwrap();
    let b = Client::connect_with(v4, &client_config()).unwrap();
    let e = Client::connect_with(v4, &client_config()).expect_err("a third session from 127.0.0.1");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("max_sessions_per_peer 2 reached: 2 sessions from"), "{e}");
    if dual {
        let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
        let other = Client::connect_with(v6, &client_config()).expect("a session from ::1");
        check_reply(&other.unary(ECHO, &request(2, 10, 10), &CallOptions::default()).unwrap(), 2, 10);
    }
    for c in [&a, &b] {
        check_reply(&c.unary(ECHO, &request(1, 10, 10), &CallOptions::default()).unwrap(), 1, 10);
    }
    drop(a);
    let give_up = Instant::now() + WAIT;
    let c = loop {
        match Client::connect_with(v4, &client_config()) {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < give_up, "the closed session's place never came back: {e}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    check_reply(&c.unary(ECHO, &request(3, 10, 10), &CallOptions::default()).unwrap(), 3, 10);
    drop((b, c));
    server.shutdown();
}

/// A block stored as the session's cached one that the server refuses (malformed: its entry
/// count says more entries than it holds) answers its call INVALID_ARGUMENT, and so does every
/// later request that names it; the session serves on, and a good store replaces it.
#[test]
fn a_refused_stored_block_refuses_the_calls_that_name_it_and_the_session_serves_on() {
    let (server, _) = spawn(server());
    let mut c = RawClient::connect(server.local_addr());
    let s = c.session;
    // The block: its length (of what follows), a count of 5 entries, then one entry "k" = "v".
    let mut bad = Vec::new();
    bad.extend_from_slice(&(2 + 1 + 1 + 4 + 1u32).to_le_bytes());
    bad.extend_from_slice(&5u16.to_le_bytes());
    bad.extend_from_slice(&[1, b'k', 1, 0, 0, 0, b'v']);
    let store = |slot: u16, block: &[u8]| {
        let mut body = block.to_vec();
        body.extend_from_slice(b"abcd");
        let h = Header {
            metadata: true,
            metadata_cache: METADATA_STORE,
            ..raw_request(s, slot, body.len() as u32)
        };
        (h, body)
    };
    let named = |slot: u16| Header { metadata_cache: METADATA_CACHED, ..raw_request(s, slot, 4) };
    let (h, body) = store(0, &bad);
    c.send_eager(h, &body);
    let (r, _) = c.response(Duration::from_secs(10)).expect("an answer to the store");
    assert_eq!((r.slot, r.status), (0, Code::InvalidArgument));
    for slot in 1..3 {
        c.send_eager(named(slot), b"abcd");
        let (r, _) = c.response(Duration::from_secs(10)).expect("an answer naming the refused block");
        assert_eq!((r.slot, r.status), (slot, Code::InvalidArgument));
    }
    // A well-formed block replaces it.
    let mut good = Vec::new();
    good.extend_from_slice(&(2 + 1 + 1 + 4 + 1u32).to_le_bytes());
    good.extend_from_slice(&1u16.to_le_bytes());
    good.extend_from_slice(&[1, b'k', 1, 0, 0, 0, b'v']);
    let (h, body) = store(3, &good);
    c.send_eager(h, &body);
    let (r, _) = c.response(Duration::from_secs(10)).expect("an answer to the good store");
    assert_eq!((r.slot, r.status), (3, Code::Ok));
    c.send_eager(named(0), b"abcd");
    let (r, _) = c.response(Duration::from_secs(10)).expect("an answer naming the good block");
    assert_eq!((r.slot, r.status), (0, Code::Ok));
    assert_eq!(server.counters().malformed, 0);
    drop(c);
    server.shutdown();
}
