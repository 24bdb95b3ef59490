//! The receive side an endpoint's client sessions share (issue 28 item 1, `endpoint::rx`): one
//! SRQ and its receive buffers, one receive CQ, receives routed to their sessions by QP number.
//!
//! All on `sim`, with the yielding polling policy of `client_config()`.

mod rpc_support;

use std::time::{Duration, Instant};

use rpc_core::wire::{Header, Kind};
use rpc_core::{CallOptions, Client, Code, Endpoint, Transport};
use rpc_support::*;

/// 50 sessions of one endpoint to one server share its receive buffers: idle, the endpoint's 16
/// (its reserve) between them; after one call each, the reserve and 4 per session (15 + 200 =
/// 215, registered 16 at a time: 224), where 50 sessions of their own register 32 each (1,600).
/// Sabotaged (`Nic::client_rx` giving every session a receive side of its own): failed with
/// "after one call each: Some(32) (shared: 224)".
#[test]
fn the_sessions_of_an_endpoint_share_its_receive_buffers() {
    if transport() != Transport::Sim {
        eprintln!("skipped: sim only (the shared SRQ needs type-2 memory windows)");
        return;
    }
    let (server, _) = spawn(server());
    let ep = Endpoint::new(&Transport::Sim).unwrap();
    let clients: Vec<Client> =
        (0..50).map(|_| ep.connect_with(server.local_addr(), &client_config()).unwrap()).collect();
    let idle: Vec<u64> = clients.iter().map(|c| c.counters().recv_buffers).collect();
    assert!(
        idle.iter().all(|&n| n == 16),
        "50 idle sessions of one endpoint registered {:?} receive buffers each (shared: 16 in all)",
        idle.iter().max()
    );
    for (i, c) in clients.iter().enumerate() {
        echo_checked(c, i as u64, 32, 32);
    }
    let after: Vec<u64> = clients.iter().map(|c| c.counters().recv_buffers).collect();
    assert!(after.iter().all(|&n| n == 224), "after one call each: {:?} (shared: 224)", after.iter().max());
    // Every session still answers, in any order.
    for (i, c) in clients.iter().enumerate().rev() {
        echo_checked(c, 100 + i as u64, 32, 32);
    }
}

/// Two threads drive two sessions of one endpoint at once: whichever polls the shared receive
/// CQ takes the other's answers too and leaves them in its inbox, so every answer reaches the
/// call it answers (each carries its request's sequence number and bytes: `check_reply`).
/// Sabotaged (`route` keeping every receive for the polling session): failed with "call 0:
/// UNAVAILABLE: connection closed: protocol violation: header for another session".
#[test]
fn answers_reach_their_sessions_when_another_thread_polls_the_shared_cq() {
    let (server, _) = spawn(server());
    let ep = Endpoint::new(&transport()).unwrap();
    let addr = server.local_addr();
    let run = |ep: Endpoint, base: u64, len: usize| {
        std::thread::spawn(move || {
            let c = ep.connect_with(addr, &client_config()).unwrap();
            for seq in base..base + 2000 {
                let r = c
                    .unary::<EchoMsg, EchoMsg>(ECHO, &request(seq, len, len), &CallOptions::default())
                    .unwrap_or_else(|e| panic!("call {seq}: {e}"));
                check_reply(&r, seq, len);
            }
            c.counters()
        })
    };
    let a = run(ep.clone(), 0, 40);
    let b = run(ep.clone(), 1_000_000, 56);
    let (ca, cb) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!((ca.rpcs, cb.rpcs, ca.malformed + cb.malformed), (2000, 2000, 0));
}

/// A server that floods a session nobody drives (here with Pings, which the protocol allows at
/// most two of per silence) loses that session when it is next driven (`Counters::metered`):
/// the messages beyond what its calls may bring (its inbox's cap) go back to the shared SRQ at
/// once, so the endpoint's other session, to a good server, keeps getting its answers meanwhile.
/// The victim is idle, so its endpoint's progress thread looks at it every 50 ms: a look during
/// the flood closes it then (the flood's next SENDs fail, and the flood stops).
/// Sabotaged (no cap on the inbox, `route` always queueing): failed ("a neighbour's call during
/// the flood: DEADLINE_EXCEEDED": the flood held every receive buffer of the endpoint); since
/// the progress thread looks at the victim: failed on `(c.metered, c.sessions_closed)` being
/// (0, 0) (its looks took and answered the flood, which never overran the session).
#[test]
fn a_server_flooding_an_undriven_session_loses_it_and_not_its_neighbours_buffers() {
    if transport() != Transport::Sim {
        eprintln!("skipped: sim only (a fake server on the software NIC)");
        return;
    }
    let (good, listener, bad_addr, ep) = good_and_hostile();
    let flooder = std::thread::spawn(move || {
        let (mut c, tcp) = RawClient::accept(&listener, 77, |_| {});
        // 400 Pings: more than the endpoint registers (its reserve and the neighbour's claim).
        'flood: for _ in 0..400 {
            // Paced to its send buffers: its SENDs wait on RNR while the SRQ is empty (before
            // the neighbour's polls give the flood's buffers back), and `send` fails when it
            // runs out of buffers after an RNR wait.
            let give_up = Instant::now() + Duration::from_secs(10);
            while c.sq.outstanding() >= 8 && !c.dead {
                assert!(Instant::now() < give_up, "the flood's SENDs never completed");
                let _ = c.try_poll();
                std::thread::yield_now();
            }
            if c.dead {
                // A SEND failed: the victim closed its session (a progress look).
                break 'flood;
            }
            c.send(Header::new(Kind::Ping), &[]);
            let _ = c.try_poll();
        }
        std::thread::sleep(Duration::from_millis(500));
        drop(tcp);
    });
    let victim = ep.connect_with(bad_addr, &client_config()).unwrap();
    let neighbour = ep.connect_with(good.local_addr(), &client_config()).unwrap();
    let opts = CallOptions::deadline(Duration::from_secs(5));
    let give_up = Instant::now() + Duration::from_secs(20);
    let mut seq = 0;
    while !flooder.is_finished() && Instant::now() < give_up {
        let r = neighbour.unary::<EchoMsg, EchoMsg>(ECHO, &request(seq, 32, 32), &opts);
        match r {
            Ok(r) => check_reply(&r, seq, 32),
            Err(e) => panic!("a neighbour's call during the flood: {} {}", e.code(), e.message()),
        }
        seq += 1;
    }
    flooder.join().expect("the flood ended (its SENDs found receive buffers)");
    assert!(seq > 0, "no call made during the flood");
    // The victim, driven again, closes its session for the flood.
    victim.progress();
    let c = victim.counters();
    assert_eq!((c.metered, c.sessions_closed), (1, 1), "{c:?}");
    let e = victim.unary::<EchoMsg, EchoMsg>(ECHO, &request(1, 32, 32), &opts).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
}

/// A server's idle probe reaching many idle sessions of one endpoint at once (their Pings come
/// in one batch, after every session connected: one look routes them to the others' inboxes,
/// where they wait until those sessions are looked at) closes none of them: beyond the endpoint's spare of
/// 8, it registers more buffers for undriven sessions' control messages (up to 8 each), instead
/// of counting their Pings as a flood. Sabotaged (`grow_spare` returning false): failed with
/// "idle sessions closed as flooded by one Ping each: 11".
#[test]
fn one_ping_to_each_of_many_idle_sessions_closes_none() {
    if transport() != Transport::Sim {
        eprintln!("skipped: sim only (fake servers on the software NIC)");
        return;
    }
    const SESSIONS: usize = 20;
    let ep = Endpoint::new(&Transport::Sim).unwrap();
    let (pinged_tx, pinged_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_rx = std::sync::Arc::new(std::sync::Mutex::new(done_rx));
    // The Pings go once every session is connected, together: they come in one batch.
    let all_connected = std::sync::Arc::new(std::sync::Barrier::new(SESSIONS + 1));
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..SESSIONS {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (pinged, done, go) = (pinged_tx.clone(), done_rx.clone(), all_connected.clone());
        servers.push(std::thread::spawn(move || {
            let (mut c, tcp) = RawClient::accept(&listener, 77, |_| {});
            go.wait();
            c.send(Header::new(Kind::Ping), &[]);
            pinged.send(()).unwrap();
            // Keeps the session (and its control connection) until the test is done.
            let _ = done.lock().unwrap().recv_timeout(Duration::from_secs(30));
            drop(tcp);
        }));
        clients.push(ep.connect_with(addr, &client_config()).unwrap());
    }
    all_connected.wait();
    for _ in 0..SESSIONS {
        pinged_rx.recv_timeout(Duration::from_secs(10)).expect("every fake server sent its Ping");
    }
    // One session driven (half a second): its polls route the others' Pings to their inboxes.
    for _ in 0..500 {
        clients[0].progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    // Then every session takes what waits for it.
    for c in &clients {
        c.progress();
    }
    let closed: u64 = clients.iter().map(|c| c.counters().metered).sum();
    assert_eq!(closed, 0, "idle sessions closed as flooded by one Ping each: {closed}");
    drop(done_tx);
    for s in servers {
        s.join().unwrap();
    }
}
