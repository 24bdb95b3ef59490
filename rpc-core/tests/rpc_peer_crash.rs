//! A server that crashes (no Close message): a fake server built from the public verbs, buffers
//! and wire modules accepts a session, takes a request, then vanishes. Every call in flight ends
//! UNAVAILABLE — through the QP (its sends fail) or through the TCP liveness channel.

mod rpc_support;

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::wire::{read_frame, write_frame, Frame};
use rpc_core::Client;
use rpc_support::fake_server::accept;
use rpc_support::*;

#[test]
fn server_host_vanishes_sends_fail_and_every_call_ends_unavailable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let mut s = accept(&listener);
        let h = s.take_request();
        assert_eq!(h.method, ECHO);
        s.peer.ctx.vanish(); // the machine is gone; its TCP connection lingers (as until a TCP timeout)
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let client = Client::connect_with(addr, &client_config()).unwrap();
    let first = client.unary_async::<_, EchoMsg>(ECHO, &request(1, 8, 8), &CallOptions::default());
    // Make sure the first request went out and was taken before the host vanished.
    wait_until(
        "the first request to go out",
        WAIT,
        || {
            client.progress();
            client.counters().bytes_out > 0
        },
        || format!("client {:?}", client.counters()),
    );
    std::thread::sleep(Duration::from_millis(50));
    // The next call's SEND is retried and fails: the session breaks, both calls end UNAVAILABLE.
    // Whichever comes first ends the session: the SEND's retries running out at the QP, or the
    // TCP connection closing.
    let err = client.unary::<_, EchoMsg>(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert_eq!(block_on(first).unwrap_err().code(), Code::Unavailable);
    assert!(client.closed_reason().is_some());
    drop(client);
    fake.join().unwrap();
}

/// A server process that crashes while a blocking call waits for its answer: the kernel closes
/// its control connection, and the call ends UNAVAILABLE by that (its message says so), not by
/// the later idle probe (the QP's Ping failing, or the silence: `peer_timeout`).
/// Sabotaged (`ClientCore::check_liveness` never reading the control connection): passed
/// before the message was checked (the call ended by the probe a few seconds later); now
/// fails with "the call did not end by the control connection's end: UNAVAILABLE: send failed
/// (IBV_WC_RETRY_EXC_ERR): the server is gone" (2 runs of 2).
#[test]
fn server_process_gone_tcp_closes_and_the_blocked_call_ends_unavailable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let mut s = accept(&listener);
        let h = s.take_request();
        assert_eq!(h.method, ECHO);
        // Crash: everything dropped at once, no Close message, no answer.
        drop(s);
    });
    let client = Client::connect_with(addr, &client_config()).unwrap();
    let err = client.unary::<_, EchoMsg>(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    // What ended the call, not how long it took.
    assert!(
        err.message().contains("the server closed the connection")
            || err.message().contains("the control connection failed"),
        "the call did not end by the control connection's end: {err}"
    );
    fake.join().unwrap();
    let err = client.unary::<_, EchoMsg>(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
}

#[test]
fn client_vanishing_without_close_frees_its_server_session() {
    let (server, _) = spawn(server());
    let keep = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    // A client whose TCP connection closes without a Close message (a crashed process).
    let gone = TcpStream::connect(server.local_addr()).unwrap();
    let peer = RawPeer::new(64, 8, 4096, 1 << 16, 1);
    let mut tcp = gone;
    write_frame(&mut tcp, &Frame::Handshake(peer.handshake(2, 1024, 1 << 20, 0))).unwrap();
    let Frame::Handshake(_) = read_frame(&mut tcp).unwrap() else { panic!("refused") };
    wait_until(
        "the server to publish the raw client's session opened",
        WAIT,
        || {
            keep.progress();
            server.counters().sessions_opened >= 2
        },
        || format!("server {:?}", server.counters()),
    );
    drop(tcp);
    wait_until(
        "the server to close the session whose TCP connection closed",
        WAIT,
        || {
            keep.progress();
            server.counters().sessions_closed >= 1
        },
        || format!("server {:?}", server.counters()),
    );
    assert_eq!(server.counters().sessions_closed, 1);
    check_reply(&keep.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    drop(peer);
    drop(keep);
    server.shutdown();
}
