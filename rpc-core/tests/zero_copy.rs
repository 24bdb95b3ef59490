//! Zero-copy sends (issue 29 item 4): a `bytes` field carried in a registered buffer
//! (`Client::alloc_registered`, `RequestContext::alloc_registered`) leaves by an RDMA WRITE
//! straight from it; ordinary `Bytes`, and buffers of another protection domain, are copied
//! once. Every body is checked byte for byte, in pieces larger than the ring and across its wrap;
//! the pools count the bytes sent with no copy, checked exactly.

mod rpc_support;

use bytes::Bytes;
use rpc_core::buffers::{Completions, RegisteredPool, SendMirror, SendPool, SendQueue};
use rpc_core::codegen::*;
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::Client;
use rpc_support::*;

/// A message whose payload is a `bytes::Bytes` field (referenced, not copied, when encoded).
#[derive(Clone, PartialEq, prost::Message)]
struct Blob {
    #[prost(uint64, tag = "1")]
    seq: u64,
    #[prost(bytes = "bytes", tag = "2")]
    data: Bytes,
    #[prost(uint64, tag = "3")]
    checksum: u64,
    /// Payload bytes the server answers with (`payload(seq ^ 0xffff, reply_len)`).
    #[prost(uint32, tag = "4")]
    reply_len: u32,
    /// The server answers from a registered buffer of its worker.
    #[prost(bool, tag = "5")]
    registered: bool,
}

const BLOB: MethodId = method_id("/zc.Blob/Echo");

/// Checks the request's payload, answers `reply_len` bytes (registered when asked).
struct BlobService;

impl Service for BlobService {
    const NAME: &'static str = "zc.Blob";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: BLOB, name: "/zc.Blob/Echo" }];

    fn call(&self, _method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let req = match decode::<Blob>(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        if fnv64(&req.data) != req.checksum || req.data[..] != payload(req.seq, req.data.len())[..] {
            return out.error(Status::data_loss(format!("request {} arrived damaged", req.seq)));
        }
        let p = payload(req.seq ^ 0xffff, req.reply_len as usize);
        let data = if req.registered {
            match ctx.alloc_registered(p.len()) {
                Ok(mut b) => {
                    b.copy_from_slice(&p);
                    b.freeze()
                }
                Err(s) => return out.error(s),
            }
        } else {
            Bytes::from(p)
        };
        out.reply(Reply::from(Blob {
            seq: req.seq,
            checksum: fnv64(&data),
            data,
            reply_len: 0,
            registered: false,
        }));
    }
}

const RING: u32 = 64 * 1024;

fn setup(server_cfg: rpc_core::ServerBuilder) -> (rpc_core::ServerHandle, Client) {
    let server = server_cfg
        .eager_threshold(512)
        .ring_bytes(RING)
        .add_service(BlobService)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    let client = Client::connect_with(
        server.local_addr(),
        &client_config().eager_threshold(512).ring_bytes(RING).window(4),
    )
    .unwrap();
    (server, client)
}

/// The request `seq` of `len` payload bytes, in a registered buffer of `from` or in an
/// ordinary `Bytes`.
fn blob(from: Option<&Client>, seq: u64, len: usize, reply_len: usize, registered_reply: bool) -> Blob {
    let p = payload(seq, len);
    let data = match from {
        Some(c) => {
            let mut b = c.alloc_registered(len).unwrap();
            b.copy_from_slice(&p);
            b.freeze()
        }
        None => Bytes::from(p),
    };
    Blob { seq, checksum: fnv64(&data), data, reply_len: reply_len as u32, registered: registered_reply }
}

fn check(r: &Blob, seq: u64, reply_len: usize) {
    assert_eq!(r.seq, seq);
    assert_eq!(r.data.len(), reply_len, "reply {seq} length");
    assert!(r.data[..] == payload(seq ^ 0xffff, reply_len)[..], "reply {seq} intact");
}

/// Registered and ordinary payloads alternate, from 600 bytes (below the 4 KiB from which a
/// field is referenced) to 200 KB (three times the 64 KiB rings: in pieces), 3 MB in all each
/// way (the rings wrap dozens of times). Registered fields of at least 4 KiB are WRITTEN from
/// where they are: the pools' counts equal exactly their bytes, and nothing of them is copied.
#[test]
fn registered_requests_and_replies_arrive_intact_in_pieces_and_across_the_wrap_with_no_copy() {
    let (server, client) = setup(server());
    let sizes = [600usize, 5_000, 20_000, 40_000, 200_000, 4096, 70_000];
    let (mut want_client, mut want_server, mut total) = (0u64, 0u64, 0u64);
    for seq in 0..70u64 {
        let len = sizes[seq as usize % sizes.len()];
        let reply_len = sizes[(seq as usize + 3) % sizes.len()];
        let registered = seq % 3 != 2;
        let req = blob(registered.then_some(&client), seq, len, reply_len, registered);
        let r: Blob = client.unary(BLOB, &req, &CallOptions::default()).unwrap();
        check(&r, seq, reply_len);
        total += len as u64;
        if registered && len >= 4096 {
            want_client += len as u64;
        }
        if registered && reply_len >= 4096 {
            want_server += reply_len as u64;
        }
    }
    assert!(total > 40 * u64::from(RING), "the rings wrapped many times: {total} bytes");
    let c = client.registered_pool().stats();
    assert_eq!(c.zero_copy_bytes, want_client, "request bytes WRITTEN from registered buffers");
    assert_eq!(c.copied_bytes, 0);
    let s = server.registered_stats();
    assert_eq!(s.zero_copy_bytes, want_server, "reply bytes WRITTEN from registered buffers");
    assert_eq!(s.copied_bytes, 0);
    assert_eq!(c.live_buffers, 0, "every request's buffer came back");
    drop(client);
    server.shutdown();
}

/// A buffer of client A's pool (its protection domain) sent by client B is not B's to name by
/// an lkey: it is copied like ordinary bytes, in pieces, and arrives intact.
#[test]
fn a_buffer_of_another_clients_pool_is_copied_and_arrives_intact() {
    let (server, b) = setup(server());
    let a = Client::connect_with(server.local_addr(), &client_config().eager_threshold(512).ring_bytes(RING))
        .unwrap();
    // B has a live buffer of its own, so its send path looks for registered bytes.
    let own = b.alloc_registered(8192).unwrap();
    for (seq, len) in [(1u64, 10_000usize), (2, 150_000)] {
        let req = blob(Some(&a), seq, len, 100, false);
        let r: Blob = b.unary(BLOB, &req, &CallOptions::default()).unwrap();
        check(&r, seq, 100);
    }
    assert_eq!(b.registered_pool().stats().zero_copy_bytes, 0, "B names no memory of A's domain");
    assert_eq!(a.registered_pool().stats().zero_copy_bytes, 0);
    drop(own);
    drop((a, b));
    server.shutdown();
}

/// Over the pool's bound an allocation fails RESOURCE_EXHAUSTED naming it, on the client and
/// in a handler (whose call is answered with that status); a buffer given back is reused.
#[test]
fn an_exhausted_pool_refuses_allocations_naming_its_bound() {
    let server = server_with_pool(64 * 1024);
    let client = Client::connect_with(
        server.local_addr(),
        &client_config().eager_threshold(512).ring_bytes(RING).registered_buffer_bytes(8 << 20),
    )
    .unwrap();
    let held: Vec<_> = (0..8).map(|_| client.alloc_registered(1 << 20).unwrap()).collect();
    let e = client.alloc_registered(1 << 20).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("bound of 8388608 bytes"), "{}", e.message());
    drop(held);
    assert!(client.alloc_registered(1 << 20).is_ok(), "a block given back is taken again");
    assert_eq!(client.registered_pool().stats().registered_bytes, 8 << 20, "nothing registered again");
    // The server's pool holds 64 KiB: a 100 KB answer cannot be allocated.
    let e = client
        .unary::<_, Blob>(BLOB, &blob(None, 1, 100, 100_000, true), &CallOptions::default())
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("bound of 65536 bytes"), "{}", e.message());
    let r: Blob = client.unary(BLOB, &blob(None, 2, 100, 30_000, true), &CallOptions::default()).unwrap();
    check(&r, 2, 30_000);
    drop(client);
    server.shutdown();
}

fn server_with_pool(bytes: usize) -> rpc_core::ServerHandle {
    server()
        .eager_threshold(512)
        .ring_bytes(RING)
        .registered_buffer_bytes(bytes)
        .add_service(BlobService)
        .spawn("127.0.0.1:0")
        .expect("server starts")
}

/// Two raw QPs, `a` WRITEs to `b`'s ring from a send mirror and a registered buffer of `a`'s
/// protection domain.
struct Pair {
    a: RawPeer,
    b: RawPeer,
    pool: std::sync::Arc<RegisteredPool>,
    mirror: SendMirror<Sim>,
    sends: SendPool<Sim>,
    sq: SendQueue,
}

fn pair() -> Pair {
    let a = RawPeer::new(64, 8, 256, 4096, 1);
    let b = RawPeer::new(64, 8, 256, 256 * 1024, 2);
    // A long ACK timeout: traffic dropped for a while is retried, not given up.
    let rc = RcConfig { timeout: 20, retry_cnt: 7, ..RcConfig::default() };
    a.connect(&rc, &b.handshake(4, 64, 1 << 20, 1));
    b.connect(&rc, &a.handshake(4, 64, 1 << 20, 1));
    let pool = RegisteredPool::new::<Sim>(a.pd.clone(), 8 << 20);
    let mirror = SendMirror::<Sim>::new(&a.pd, 256 * 1024).unwrap();
    let sends = SendPool::<Sim>::new(&a.pd, 4, 256).unwrap();
    Pair { a, b, pool, mirror, sends, sq: SendQueue::new(64, 4) }
}

impl Pair {
    /// Queues and posts one WRITE of 100 + 64 Ki + 100 bytes to `b`'s ring at 0: the mirror's
    /// head and tail around a registered buffer of 64 KiB (dropped here: only the queue holds
    /// it). Returns the bytes `b`'s ring must hold.
    fn post(&mut self) -> Vec<u8> {
        let user = payload(7, 64 * 1024);
        let mut buf = self.pool.alloc(user.len()).unwrap();
        buf.copy_from_slice(&user);
        let frozen = buf.freeze();
        assert!(self.mirror.write_at(0, &[0x11; 100]));
        assert!(self.mirror.write_at(100 + 65_536, &[0x22; 100]));
        let mut refs = vec![self.pool.reference(100, frozen).expect("the pool's own buffer")];
        let (addr, _, rkey) = self.b.ring.remote();
        let n = self.sq.write_gather(&self.mirror, 0, 65_736, &mut refs, (addr, rkey), 1).unwrap();
        assert_eq!(n, 65_536);
        self.sq.flush(&self.a.qp, &mut self.sends, 1).unwrap();
        [vec![0x11; 100], user, vec![0x22; 100]].concat()
    }
}

/// The next completion of `peer`'s CQ (a hang guard of [`WAIT`]).
fn next_completion(peer: &RawPeer, wcs: &mut Completions<8>, what: &str) -> rpc_core::buffers::Completion {
    wait_for(
        what,
        WAIT,
        || {
            wcs.poll(&peer.cq).unwrap();
            wcs.next()
        },
        String::new,
    )
}

/// The registered buffer of a posted WRITE is not given back while the WRITE is in flight (the
/// peer's traffic is dropped: the WRITE is retried, not completed): only the polled completion
/// that retires it releases it. Then the peer's ring holds the mirror's bytes around the
/// buffer's, byte for byte.
#[test]
fn a_registered_buffer_is_released_only_by_the_completion_of_its_write() {
    let mut p = pair();
    p.b.qp.set_drop_traffic(true);
    let want = p.post();
    let mut wcs = Completions::<8>::new();
    for _ in 0..50 {
        assert_eq!(wcs.poll(&p.a.cq).unwrap(), 0, "nothing completes while the traffic is dropped");
        p.sq.retire_held();
        assert_eq!(p.pool.stats().live_buffers, 1, "the WRITE in flight still holds its buffer");
        std::thread::yield_now();
    }
    p.b.qp.set_drop_traffic(false);
    let c = next_completion(&p.a, &mut wcs, "the WRITE's completion");
    assert!(c.wc().status.is_success(), "{c:?}");
    assert_eq!(p.pool.stats().live_buffers, 1, "a completion not yet handed to the queue releases nothing");
    assert!(p.sq.on_completion(c, &mut p.sends));
    p.sq.retire_held();
    assert_eq!(p.pool.stats().live_buffers, 0, "retired: the buffer is back in the pool");
    let mut got = Vec::new();
    assert!(p.b.ring.copy_out(0, want.len() as u32, &mut got));
    assert!(got == want, "the ring holds the gathered bytes");
}

/// A QP broken (ERR) with a WRITE in flight flushes it; its buffer is given back once the QP
/// can no longer read it: when the connection's QP and queue are dropped (a flushed completion
/// proves nothing of the WRs before it and retires nothing).
#[test]
fn a_broken_connection_with_a_write_in_flight_releases_its_buffer_when_dropped() {
    let mut p = pair();
    p.b.qp.set_drop_traffic(true);
    p.post();
    p.a.qp.force_error();
    let mut wcs = Completions::<8>::new();
    let c = next_completion(&p.a, &mut wcs, "the flushed completion");
    assert!(!c.wc().status.is_success(), "flushed: {c:?}");
    assert!(!p.sq.on_completion(c, &mut p.sends), "a failed completion retires nothing");
    p.sq.retire_held();
    assert_eq!(p.pool.stats().live_buffers, 1, "still held: the QP is not destroyed yet");
    let Pair { a, b, pool, mirror, sends, sq } = p;
    // The connection's order: QP first, then what its WRs read.
    drop(a);
    drop(sq);
    drop((mirror, sends, b));
    assert_eq!(pool.stats().live_buffers, 0, "given back with the connection");
}

/// A session broken with a registered body waiting (the server's host vanished): under protocol
/// 12 the body waits for the server's ring (its RingAsk SEND fails, so nothing is WRITTEN); the
/// call ends UNAVAILABLE, and once the client lets the broken session go, the buffer the waiting
/// body held is back in the pool. (WRITEs in flight when a connection breaks are covered at the
/// send queue: `a_broken_connection_with_a_write_in_flight_releases_its_buffer_when_dropped`.)
#[test]
fn a_session_broken_with_a_registered_body_waiting_gives_its_buffer_back() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (vanished_tx, vanished) = std::sync::mpsc::channel();
    let fake = std::thread::spawn(move || {
        let s = rpc_support::fake_server::accept(&listener);
        s.peer.ctx.vanish();
        vanished_tx.send(()).unwrap();
        // Its TCP connection lingers until the client has seen the QP fail.
        std::thread::sleep(std::time::Duration::from_secs(3));
        drop(s);
    });
    let client = Client::connect_with(addr, &client_config()).unwrap();
    vanished.recv().unwrap();
    let pool = client.registered_pool();
    // 200 KB for the 64 KiB ring the server never grants.
    let req = blob(Some(&client), 1, 200_000, 10, false);
    let call = client.unary_async::<_, Blob>(BLOB, &req, &CallOptions::default());
    drop(req);
    assert_eq!(pool.stats().live_buffers, 1, "the call holds the buffer");
    assert_eq!(block_on(call).unwrap_err().code(), Code::Unavailable);
    assert_eq!(pool.stats().zero_copy_bytes, 0, "no ring was granted: nothing was WRITTEN");
    drop(client);
    assert_eq!(pool.stats().live_buffers, 0, "given back with the broken session");
    fake.join().unwrap();
}
