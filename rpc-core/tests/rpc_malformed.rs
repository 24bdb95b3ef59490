//! A malformed header injected at the wire by a rogue client (built from the public verbs,
//! buffers and wire modules): the server closes that connection with a logged reason and keeps
//! serving every other session.

mod rpc_support;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use rpc_core::buffers::{SendPool, SendQueue};
use rpc_core::codegen::*;
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::wire::{read_frame, write_frame, Frame, Header, Kind, HEADER_LEN};
use rpc_core::Client;
use rpc_support::*;

/// Connects like a client would, then SENDs `bytes` as one message and returns the TCP stream.
fn rogue_send(addr: std::net::SocketAddr, make: impl FnOnce(u32) -> Vec<u8>) -> TcpStream {
    let peer = RawPeer::new(64, 16, 4096 + HEADER_LEN, 1 << 16, 1);
    let mut tcp = TcpStream::connect(addr).unwrap();
    // A server that never answers the handshake fails the test, not hangs it.
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    write_frame(&mut tcp, &Frame::Handshake(peer.handshake(4, 4096, 1 << 20, 0))).unwrap();
    let Frame::Handshake(reply) = read_frame(&mut tcp).unwrap() else { panic!("refused") };
    peer.connect(&RcConfig::default(), &reply);
    let mut pool = SendPool::<Sim>::new(&peer.pd, 4, 4096).unwrap();
    let mut sq = SendQueue::new(16, 4);
    let bytes = make(reply.session);
    let mut b = pool.acquire().unwrap();
    pool.buf_mut(&mut b)[..bytes.len()].copy_from_slice(&bytes);
    sq.send(&mut pool, b, bytes.len() as u32, false);
    sq.flush(&peer.qp, &mut pool, 1).unwrap();
    // Keep the verbs objects alive until the server has reacted: the caller reads the TCP stream.
    std::mem::forget((peer, pool));
    tcp
}

fn expect_closed(mut tcp: TcpStream) {
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(tcp.read(&mut b).unwrap(), 0, "the server closed the rogue connection");
}

#[test]
fn malformed_header_closes_only_that_connection() {
    let (server, _) = spawn(server());
    let good = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    check_reply(&good.unary(ECHO, &request(1, 16, 16), &CallOptions::default()).unwrap(), 1, 16);

    // 1. Bytes that are not a header at all (unknown kind).
    let tcp = rogue_send(server.local_addr(), |session| {
        let mut v = vec![0u8; HEADER_LEN];
        Header { method: ECHO, session, ..Header::new(Kind::Request) }.encode_into(&mut v).unwrap();
        v[0] = 9;
        v
    });
    expect_closed(tcp);
    check_reply(&good.unary(ECHO, &request(2, 16, 16), &CallOptions::default()).unwrap(), 2, 16);

    // 2. A well-formed header that breaks the protocol (a ring body outside the ring).
    let tcp = rogue_send(server.local_addr(), |session| {
        let mut v = vec![0u8; HEADER_LEN];
        let h = Header {
            method: ECHO,
            session,
            in_ring: true,
            ring_offset: 1 << 30,
            body_len: 1 << 20,
            ..Header::new(Kind::Request)
        };
        h.encode_into(&mut v).unwrap();
        v
    });
    expect_closed(tcp);

    // 3. A truncated header.
    expect_closed(rogue_send(server.local_addr(), |_| vec![1, 0, 0]));

    check_reply(&good.unary(ECHO, &request(3, 5000, 5000), &CallOptions::default()).unwrap(), 3, 5000);
    wait_until(
        "the server to count the 3 rogue sessions malformed",
        WAIT,
        || {
            good.progress();
            server.counters().malformed >= 3
        },
        || format!("server {:?}, good client {:?}", server.counters(), good.counters()),
    );
    assert_eq!(server.counters().malformed, 3);
    drop(good);
    server.shutdown();
}
