//! Attacks on the receive side an endpoint's client sessions share (`endpoint::rx`, issue 28
//! item 1): hostile servers and racing users on `sim`, with the yielding polling policy of
//! `client_config()`.

mod rpc_support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rpc_core::wire::{Header, Kind};
use rpc_core::{CallOptions, Client, Endpoint, Transport};
use rpc_support::*;

/// A hostile server with 4 sessions on an endpoint, none of them driven, sends each 15 Pings:
/// under each session's inbox cap (16), so none is closed for it, yet 60 messages where the
/// endpoint registers 32 receive buffers (its reserve and a neighbour's claim for one call). The
/// neighbour, a session to a good server on the same endpoint, must keep getting its answers: the
/// undriven sessions together may hold no more than their claims and a spare the endpoint keeps
/// for control messages.
/// Unfixed: "a neighbour's call 0: DEADLINE_EXCEEDED" (every receive buffer of the endpoint sat in
/// the inboxes of sessions nobody drives, the neighbour's answer stalled on RNR).
#[test]
fn undriven_sessions_under_their_caps_do_not_pin_a_neighbours_buffers() {
    if transport() != Transport::Sim {
        eprintln!("skipped: sim only (a fake server on the software NIC)");
        return;
    }
    const SESSIONS: u32 = 4;
    let (good, _) = spawn(server());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bad_addr = listener.local_addr().unwrap();
    let ep = Endpoint::new(&Transport::Sim).unwrap();
    let (flooded, flooded_rx) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let flooder = std::thread::spawn(move || {
        let mut held: Vec<_> = (0..SESSIONS).map(|i| RawClient::accept(&listener, 80 + i, |_| {})).collect();
        for (c, _) in &mut held {
            for _ in 0..15 {
                c.send(Header::new(Kind::Ping), &[]);
                let _ = c.try_poll();
            }
        }
        flooded.send(()).unwrap();
        let _ = stop_rx.recv();
        drop(held);
    });
    let victims: Vec<Client> =
        (0..SESSIONS).map(|_| ep.connect_with(bad_addr, &client_config()).unwrap()).collect();
    let neighbour = ep.connect_with(good.local_addr(), &client_config()).unwrap();
    flooded_rx.recv().unwrap();
    let opts = CallOptions::deadline(Duration::from_secs(3));
    let mut failed = None;
    for seq in 0..50 {
        match neighbour.unary::<EchoMsg, EchoMsg>(ECHO, &request(seq, 32, 32), &opts) {
            Ok(r) => check_reply(&r, seq, 32),
            Err(e) => {
                failed = Some(format!("a neighbour's call {seq}: {} {}", e.code(), e.message()));
                break;
            }
        }
    }
    let _ = stop.send(());
    flooder.join().unwrap();
    drop(victims);
    if let Some(f) = failed {
        panic!("{f}");
    }
}

/// A neighbour's first call registers its buffers (32 on the endpoint, one of them waiting for a
/// batched repost), then a hostile server floods one undriven session with 32 Pings: 31 land, the
/// last waits on RNR. The neighbour's next poll routes 16 to the flooded session's inbox (its
/// cap) and gives the other 15 back to the SRQ: with the one waiting, 16, all the SRQ has. They
/// must be posted by that poll, not left for a next one, which only a receive completion (needing
/// a posted buffer) would bring.
/// Unfixed: "a neighbour's call 1: DEADLINE_EXCEEDED" (the buffers `route` gave back waited,
/// unposted, for a poll that never came; the answer stalled on RNR).
#[test]
fn buffers_given_back_by_routing_are_posted_at_once() {
    if transport() != Transport::Sim {
        eprintln!("skipped: sim only (a fake server on the software NIC)");
        return;
    }
    let (good, _) = spawn(server());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bad_addr = listener.local_addr().unwrap();
    let ep = Endpoint::new(&Transport::Sim).unwrap();
    let (go, go_rx) = mpsc::channel::<()>();
    let (flooded, flooded_rx) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let flooder = std::thread::spawn(move || {
        let (mut c, tcp) = RawClient::accept(&listener, 90, |_| {});
        go_rx.recv().unwrap();
        for _ in 0..32 {
            c.send(Header::new(Kind::Ping), &[]);
            let _ = c.try_poll();
        }
        // Every posted buffer of the endpoint is taken once a SEND waits on RNR (sim delivers
        // at once while a buffer is posted).
        let give_up = Instant::now() + Duration::from_secs(10);
        while c.peer.qp.rnr_stalls() == 0 {
            assert!(Instant::now() < give_up, "the flood never waited on RNR");
            std::thread::yield_now();
        }
        flooded.send(()).unwrap();
        let _ = stop_rx.recv();
        drop((c, tcp));
    });
    let victim = ep.connect_with(bad_addr, &client_config()).unwrap();
    let neighbour = ep.connect_with(good.local_addr(), &client_config()).unwrap();
    echo_checked(&neighbour, 0, 32, 32);
    go.send(()).unwrap();
    flooded_rx.recv().unwrap();
    let opts = CallOptions::deadline(Duration::from_secs(3));
    let mut failed = None;
    for seq in 1..20 {
        match neighbour.unary::<EchoMsg, EchoMsg>(ECHO, &request(seq, 32, 32), &opts) {
            Ok(r) => check_reply(&r, seq, 32),
            Err(e) => {
                failed = Some(format!("a neighbour's call {seq}: {} {}", e.code(), e.message()));
                break;
            }
        }
    }
    let _ = stop.send(());
    flooder.join().unwrap();
    if let Some(f) = failed {
        panic!("{f}");
    }
    // The flooded session, driven again, closes for the flood.
    victim.progress();
    assert_eq!(victim.counters().metered, 1, "{:?}", victim.counters());
}
