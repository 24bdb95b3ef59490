//! Attacks on the receive side an endpoint's client sessions share (`endpoint::rx`, issue 28
//! item 1): hostile servers and racing users on `sim`, with the yielding polling policy of
//! `client_config()`.

mod rpc_support;

use std::sync::mpsc;
use std::time::Duration;

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
