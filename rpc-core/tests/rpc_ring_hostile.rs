//! Ring bodies are untrusted: a raw peer (built from the public verbs, buffers and wire modules)
//! that keeps rewriting the ring range of a request after its SEND cannot change what the
//! handler sees, and a peer gone in the middle of a message in pieces ends the call UNAVAILABLE
//! on the other side, which frees everything.

mod rpc_support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use rpc_core::buffers::{Completions, SendMirror, SendPool, SendQueue};
use rpc_core::codegen::*;
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::{CompletionQueue, WorkCompletion};
use rpc_core::wire::{read_frame, write_frame, Frame, Header, Kind, HEADER_LEN};
use rpc_core::Client;
use rpc_support::*;

const TWICE: MethodId = method_id("/test.Twice/Twice");

/// Hashes its body, keeps hashing it again for 500 ms, and answers whether it ever changed.
/// (500 ms, not less: the test's thread must get to rewrite the ring several times meanwhile,
/// and CI, with this binary's other tests spinning on 2 cores, gave it only 2 turns in 100 ms.)
struct Twice;

impl Service for Twice {
    const NAME: &'static str = "test.Twice";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: TWICE, name: "/test.Twice/Twice" }];

    fn call(&self, _: MethodId, _: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let first = fnv64(body.as_slice());
        let until = Instant::now() + Duration::from_millis(500);
        let mut changed = 0u64;
        while Instant::now() < until {
            if fnv64(body.as_slice()) != first {
                changed += 1;
            }
            std::thread::yield_now();
        }
        out.reply(Reply::from(EchoMsg { seq: changed, checksum: first, ..Default::default() }));
    }
}

fn ring_request(session: u32, len: u32) -> Header {
    Header {
        method: TWICE,
        in_ring: true,
        body_len: len,
        total_len: len,
        session,
        ..Header::new(Kind::Request)
    }
}

/// Tests that run on any NIC: `sim`, and rxe0 in the Soft-RoCE tier (`scripts/softroce-test`
/// runs `rpc_ring_hostile:on_any_nic::`).
mod on_any_nic {
    use super::*;
    use rpc_core::verbs::Provider;
    use std::net::SocketAddr;

    /// A raw client on rxe0 (the Soft-RoCE tier), as [`RawClient::connect`] makes one on sim.
    #[cfg(feature = "ibverbs")]
    fn rdma_client(addr: SocketAddr) -> RawClient<rpc_core::verbs::ibverbs::Ibverbs> {
        let peer = rdma_raw_peer(256, 16, HEADER_LEN + 4096, 1 << 16, 1);
        RawClient::connect_peer(peer, addr, 4, 4096, 1 << 20)
    }

    #[test]
    fn a_peer_rewriting_the_ring_after_its_send_cannot_change_what_the_handler_sees() {
        match transport() {
            #[cfg(feature = "ibverbs")]
            rpc_core::Transport::Rdma { .. } => ring_rewrite(rdma_client),
            _ => ring_rewrite(RawClient::connect),
        }
    }

    fn ring_rewrite<P: Provider>(connect: impl Fn(SocketAddr) -> RawClient<P>)
    where
        P::QueuePair: RnrStalls,
    {
        let server = server().add_service(Twice).spawn("127.0.0.1:0").unwrap();
        let mut c = connect(server.local_addr());
        let len = 16 << 10;
        let a = vec![0xaa; len];
        c.write(0, &a, Some(ring_request(c.session, len as u32)));
        // Keep rewriting the range with other bytes while the handler looks at its body.
        // `rewrites` counts them; the byte written is its low 8 bits (a u8 count of its own
        // wrapped, and in about 1 run in 64 ended at 0..=3 after thousands of rewrites, failing
        // the check below).
        let mut rewrites = 0u64;
        let give_up = Instant::now() + WAIT;
        let reply = loop {
            rewrites += 1;
            c.write(0, &vec![rewrites as u8; len], None);
            if let Some((h, body)) = c.poll() {
                break (h, body);
            }
            assert!(Instant::now() < give_up, "no answer in {WAIT:?}: server {:?}", server.counters());
        };
        assert_eq!(reply.0.kind, Kind::Response);
        assert_eq!(reply.0.status, Code::Ok);
        let r = EchoMsg::decode(&reply.1[..]).unwrap();
        assert_eq!(r.seq, 0, "the handler's body changed {} times under it", r.seq);
        assert!(rewrites > 3, "the ring was rewritten while the handler ran ({rewrites} times)");
        // (What it saw may mix the request's bytes with a rewrite that raced the copy: the peer's
        // own doing. It cannot change afterwards.)
        server.shutdown();
    }

    /// Each session's ring is reachable only through a memory window bound to that session's
    /// QP: a peer using another session's ring address and rkey gets REM_ACCESS_ERR and writes
    /// nothing; the other session is intact.
    #[test]
    fn a_peer_writing_with_another_sessions_ring_rkey_gets_rem_access_err() {
        match transport() {
            #[cfg(feature = "ibverbs")]
            rpc_core::Transport::Rdma { .. } => another_sessions_rkey(rdma_client),
            _ => another_sessions_rkey(RawClient::connect),
        }
    }

    fn another_sessions_rkey<P: Provider>(connect: impl Fn(SocketAddr) -> RawClient<P>)
    where
        P::QueuePair: RnrStalls,
    {
        let server = server().add_service(Twice).spawn("127.0.0.1:0").unwrap();
        let mut a = connect(server.local_addr());
        let mut b = connect(server.local_addr());
        assert_eq!(server.counters().window_fallbacks, 0, "the NIC has type-2 windows (sim, rxe0)");
        let len = 8 << 10;
        // B aims at A's ring.
        b.ring = a.ring;
        b.write(0, &vec![0xbb; len], None);
        // A failed WRITE completes even unsignaled; a successful one (the bug) would not.
        let give_up = Instant::now() + WAIT;
        let status = loop {
            assert!(Instant::now() < give_up, "the WRITE with another session's rkey did not fail");
            let mut wcs = [WorkCompletion::default(); 4];
            let n = b.peer.cq.poll(&mut wcs).unwrap();
            if let Some(wc) = wcs[..n].first() {
                break wc.status;
            }
            b.sq.flush(&b.peer.qp, &mut b.pool, 1).unwrap();
            std::thread::yield_now();
        };
        assert_eq!(status, rpc_core::verbs::WcStatus::IBV_WC_REM_ACCESS_ERR);
        // A's session works, and its ring holds A's bytes only.
        let mine = vec![0xaa; len];
        a.write(0, &mine, Some(ring_request(a.session, len as u32)));
        let reply = wait_for("A's answer", WAIT, || a.poll(), || format!("server {:?}", server.counters()));
        assert_eq!((reply.0.kind, reply.0.status), (Kind::Response, Code::Ok));
        let r = EchoMsg::decode(&reply.1[..]).unwrap();
        assert_eq!(r.checksum, fnv64(&mine), "A's request arrived as A wrote it");
        server.shutdown();
    }

    /// A fake server that answers the first request with the first piece of a response three
    /// pieces long, then is gone: on sim its host vanishes; on rxe0 its QP and TCP connection
    /// are destroyed, as the kernel does for a killed process. The call ends UNAVAILABLE and
    /// nothing leaks.
    #[test]
    fn a_server_gone_mid_message_ends_the_call_unavailable_and_frees_it() {
        match transport() {
            #[cfg(feature = "ibverbs")]
            rpc_core::Transport::Rdma { .. } => {
                server_gone_mid_message(|| rdma_raw_peer(256, 64, HEADER_LEN + 4096, 1 << 16, 7), |_| {})
            }
            _ => server_gone_mid_message(
                || RawPeer::new(256, 64, HEADER_LEN + 4096, 1 << 16, 7),
                |p: &RawPeer<Sim>| p.ctx.vanish(),
            ),
        }
    }

    fn server_gone_mid_message<P: Provider>(
        make_peer: impl FnOnce() -> RawPeer<P> + Send + 'static,
        vanish: impl FnOnce(&RawPeer<P>) + Send + 'static,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = std::thread::spawn(move || {
            let (mut tcp, _) = listener.accept().unwrap();
            let Frame::Handshake(hello) = read_frame(&mut tcp).unwrap() else { panic!("no handshake") };
            let mut peer = make_peer();
            peer.connect(&RcConfig { timeout: 8, retry_cnt: 1, ..RcConfig::default() }, &hello);
            write_frame(&mut tcp, &Frame::Handshake(peer.handshake(8, 4096, hello.max_message, 77))).unwrap();
            let mut pool = SendPool::<P>::new(&peer.pd, 4, HEADER_LEN + 64).unwrap();
            let mut mirror = SendMirror::<P>::new(&peer.pd, hello.ring_len as usize).unwrap();
            let mut sq = SendQueue::new(16, 4);
            let mut wcs = Completions::<4>::new();
            let req = wait_for(
                "the fake server to receive the request",
                WAIT,
                || {
                    wcs.poll(&peer.cq).unwrap();
                    let c = wcs.find(|c| c.send_tag().is_none())?;
                    let buf = peer.recv.take(c).unwrap();
                    let h = Header::decode(peer.recv.bytes(&buf)).unwrap();
                    peer.recv.repost(buf);
                    Some(h)
                },
                String::new,
            );
            let piece = hello.ring_len / 4;
            assert!(mirror.write_at(0, &vec![0x11; piece as usize]));
            sq.write(&mirror, 0, piece, hello.ring_addr, hello.ring_rkey, piece);
            let h = Header {
                slot: req.slot,
                generation: req.generation,
                method: req.method,
                in_ring: true,
                body_len: piece,
                total_len: 3 * piece,
                session: 77,
                ..Header::new(Kind::Response)
            };
            let mut b = pool.acquire().unwrap();
            h.encode_into(pool.buf_mut(&mut b)).unwrap();
            sq.send(&mut pool, b, HEADER_LEN as u32, false);
            sq.flush(&peer.qp, &mut pool, 1).unwrap();
            wait_until(
                "the response piece's completion",
                WAIT,
                || wcs.poll(&peer.cq).unwrap() > 0,
                String::new,
            );
            vanish(&peer);
            drop(tcp);
            std::thread::sleep(Duration::from_millis(200));
            drop((sq, mirror, pool, peer));
        });
        let client = Client::connect_with(addr, &client_config()).unwrap();
        let started = Instant::now();
        let err = client
            .unary::<_, EchoMsg>(ECHO, &request(1, 8, 8), &CallOptions::deadline(Duration::from_secs(30)))
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "noticed in {:?}", started.elapsed());
        assert!(client.closed_reason().is_some());
        fake.join().unwrap();
        drop(client);
        assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
    }

    /// A client gone after the first piece of a request three pieces long: the server closes its
    /// session (dropping the partial message) and keeps serving others. On sim its host vanishes
    /// (no completion, no answer ever again); on rxe0 its QP and TCP connection are destroyed,
    /// as the kernel does for a killed process.
    #[test]
    fn a_client_gone_mid_message_is_closed_by_the_server_which_serves_on() {
        match transport() {
            #[cfg(feature = "ibverbs")]
            rpc_core::Transport::Rdma { .. } => client_gone_mid_message(rdma_client, drop),
            _ => client_gone_mid_message(RawClient::connect, |c: RawClient| c.peer.ctx.vanish()),
        }
    }

    fn client_gone_mid_message<P: Provider>(
        connect: impl Fn(SocketAddr) -> RawClient<P>,
        vanish: impl FnOnce(RawClient<P>),
    ) where
        P::QueuePair: RnrStalls,
    {
        let (server, _) = spawn(rpc_support::server().ring_bytes(1 << 16));
        let mut c = connect(server.local_addr());
        let piece = 1u32 << 14;
        let h = Header { method: ECHO, total_len: 3 * piece, ..ring_request(c.session, piece) };
        c.write(0, &vec![0x22; piece as usize], Some(h));
        // The first piece must have landed before the client vanishes (else nothing is
        // mid-message).
        wait_until(
            "the request's first piece to complete",
            WAIT,
            || {
                c.poll();
                c.sq.outstanding() == 0
            },
            || format!("server {:?}", server.counters()),
        );
        vanish(c);
        wait_until(
            "the server to close the vanished client's session",
            WAIT,
            || server.counters().sessions_closed >= 1,
            || format!("server {:?}", server.counters()),
        );
        assert_eq!(server.counters().sessions_closed, 1, "the vanished client's session was closed");
        let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
        check_reply(
            &client.unary(ECHO, &request(5, 100_000, 100_000), &CallOptions::default()).unwrap(),
            5,
            100_000,
        );
        drop(client);
        server.shutdown();
        assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
    }
}
