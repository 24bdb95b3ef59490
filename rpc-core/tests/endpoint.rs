//! One client endpoint carrying sessions to many servers (issue 28 item 1): a `Channel`'s
//! dispatchers share one device context per core, whatever the number of servers, and an
//! explicit `Endpoint` shares its device context among the `Client`s made from it. Servers run in
//! this process on sim, small (4 credits, 64 KiB rings, event-driven workers).
//!
//! The software NIC counts the device contexts this process opened (`SimStats::contexts_opened`,
//! process-wide): the tests of this file run one at a time (`SERIAL`) so that no other test's
//! opens land between two reads.

#[path = "rpc_support/mod.rs"]
mod rpc_support;

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use rpc_core::balance::{BalanceConfig, Policy, ServerState, StaticResolver};
use rpc_core::verbs::sim;
use rpc_core::{
    CallOptions, Channel, ChannelConfig, Client, Code, Endpoint, PollingPolicy, ServerHandle, Transport,
};
use rpc_support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn contexts() -> u64 {
    sim::stats().contexts_opened
}

/// `n` small servers: few credits, the smallest ring, workers that sleep on completion events.
fn servers(n: usize) -> Vec<ServerHandle> {
    (0..n)
        .map(|_| {
            spawn(
                server()
                    .polling(PollingPolicy::Event { spins: 0 })
                    .credits_per_session(4)
                    .ring_bytes(64 << 10)
                    .max_sessions(4),
            )
            .0
        })
        .collect()
}

fn addrs(s: &[ServerHandle]) -> Vec<SocketAddr> {
    s.iter().map(|h| h.local_addr()).collect()
}

fn small_client() -> rpc_core::ClientConfig {
    client_config().window(4).ring_bytes(64 << 10).polling(PollingPolicy::Event { spins: 0 })
}

/// Calls `c` with a request whose payload names `seq` and checks the answer carries it back.
fn echo_on(c: &Client, seq: u64) {
    let r: EchoMsg = c
        .unary(ECHO, &request(seq, 24, 24), &CallOptions::default())
        .unwrap_or_else(|e| panic!("call {seq}: {e}"));
    check_reply(&r, seq, 24);
}

#[test]
fn a_balanced_channel_over_twenty_servers_opens_one_device_context_and_every_server_answers() {
    if transport() != Transport::Sim {
        eprintln!("skipped: counts the software NIC's device contexts (sim only)");
        return;
    }
    let _g = serial();
    let s = servers(20);
    let a = addrs(&s);
    let before = contexts();
    let config = BalanceConfig::default()
        .policy(Policy::RoundRobin)
        .channel(ChannelConfig::default().client(small_client()).spins(0).thread_name("ep-bal"));
    let ch = Channel::balanced(StaticResolver::new(a.clone()), &config).unwrap();
    // The first call connects every server (lazily, each on its dispatcher); round robin picks
    // among those up, so the calls counted start once all are.
    let r =
        block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(99, 16, 16), &CallOptions::default())).unwrap();
    check_reply(&r, 99, 16);
    let up = |ch: &Channel| ch.balancer().unwrap().servers().iter().all(|x| x.state == ServerState::Up);
    wait_for(
        "every server up",
        WAIT,
        || up(&ch).then_some(()),
        || format!("{:?}", ch.balancer().unwrap().servers()),
    );
    let before_picks: Vec<u64> = {
        let st = ch.balancer().unwrap().servers();
        a.iter().map(|x| st.iter().find(|y| y.addr == *x).map_or(0, |y| y.picks)).collect()
    };
    for seq in 0..60 {
        let r = block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 16, 16), &CallOptions::default()))
            .unwrap_or_else(|e| panic!("call {seq}: {e}"));
        check_reply(&r, seq, 16);
    }
    let picks: Vec<u64> = {
        let st = ch.balancer().unwrap().servers();
        a.iter()
            .zip(&before_picks)
            .map(|(x, b)| st.iter().find(|y| y.addr == *x).map_or(0, |y| y.picks) - b)
            .collect()
    };
    // Every call was answered (checked above), three by each server.
    assert!(picks.iter().all(|&p| p == 3), "round robin over 20 servers gave {picks:?} of 60 calls");
    // 20 dispatchers, none pinned: one endpoint for all of them (or none, had an earlier test's
    // still been open).
    let opened = contexts() - before;
    assert!(opened <= 1, "20 servers' sessions opened {opened} device contexts (one endpoint: at most 1)");
}

#[test]
fn clients_of_one_endpoint_share_its_device_context_and_keep_their_answers_apart() {
    if transport() != Transport::Sim {
        eprintln!("skipped: counts the software NIC's device contexts (sim only)");
        return;
    }
    let _g = serial();
    let s = servers(2);
    let before = contexts();
    let ep = Endpoint::new(&Transport::Sim).unwrap();
    let a = ep.connect_with(s[0].local_addr(), &small_client()).unwrap();
    let b = ep.connect_with(s[1].local_addr(), &small_client()).unwrap();
    assert_eq!(contexts() - before, 1, "two clients of one endpoint opened more than its device context");
    // Interleaved, distinct payloads: each answer carries its own request's sequence number
    // and bytes (`check_reply`), so an answer delivered to the other session fails.
    for seq in 0..200u64 {
        echo_on(if seq % 2 == 0 { &a } else { &b }, seq);
    }
    // Both in flight at once, answered in either order.
    for seq in (1000..1100u64).step_by(2) {
        let fa = a.unary_async::<EchoMsg, EchoMsg>(ECHO, &request(seq, 40, 40), &CallOptions::default());
        let fb = b.unary_async::<EchoMsg, EchoMsg>(ECHO, &request(seq + 1, 56, 56), &CallOptions::default());
        let rb = block_on(fb).unwrap();
        let ra = block_on(fa).unwrap();
        check_reply(&ra, seq, 40);
        check_reply(&rb, seq + 1, 56);
    }
}

/// `Client::connect` takes its thread's endpoint: a thread's clients to several servers open one
/// device context, another thread's its own, and once every client of a thread is gone the next
/// connect opens a new one. Sabotaged: `Client::connect_with` on `Endpoint::new` (its own
/// context per client, as before): failed ("three clients of one thread opened 3 device
/// contexts").
#[test]
fn the_clients_of_one_thread_share_its_endpoint_and_another_thread_opens_its_own() {
    if transport() != Transport::Sim {
        eprintln!("skipped: counts the software NIC's device contexts (sim only)");
        return;
    }
    let _g = serial();
    let s = servers(3);
    let cfg = small_client();
    let before = contexts();
    let mine: Vec<Client> = s.iter().map(|h| Client::connect_with(h.local_addr(), &cfg).unwrap()).collect();
    let opened = contexts() - before;
    assert_eq!(opened, 1, "three clients of one thread opened {opened} device contexts");
    for (i, c) in mine.iter().enumerate() {
        echo_on(c, i as u64);
    }
    let addr = s[0].local_addr();
    let theirs = std::thread::spawn(move || {
        let a = Client::connect_with(addr, &small_client()).unwrap();
        let b = Client::connect_with(addr, &small_client()).unwrap();
        echo_on(&a, 10);
        echo_on(&b, 11);
    });
    theirs.join().unwrap();
    assert_eq!(contexts() - before, 2, "another thread's clients open one device context of their own");
    drop(mine);
    let again = Client::connect_with(s[1].local_addr(), &cfg).unwrap();
    echo_on(&again, 20);
    assert_eq!(contexts() - before, 3, "after its clients are gone the thread opens a new endpoint");
}

#[test]
fn a_server_killed_leaves_the_other_sessions_of_the_endpoint_serving() {
    let _g = serial();
    let mut s = servers(3);
    let ep = Endpoint::new(&transport()).unwrap();
    let cfg = small_client().peer_timeout(Some(Duration::from_millis(500)));
    let clients: Vec<Client> = s.iter().map(|h| ep.connect_with(h.local_addr(), &cfg).unwrap()).collect();
    for (i, c) in clients.iter().enumerate() {
        echo_on(c, i as u64);
    }
    // The middle server goes away: its session breaks.
    drop(s.remove(1));
    let err =
        clients[1].unary::<EchoMsg, EchoMsg>(ECHO, &request(7, 8, 8), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    // The others serve on, over the same endpoint.
    for seq in 100..300u64 {
        echo_on(&clients[if seq % 2 == 0 { 0 } else { 2 }], seq);
    }
}

#[test]
fn an_endpoint_refuses_a_configuration_for_another_transport() {
    let ep = Endpoint::new(&Transport::Sim).unwrap();
    let rdma = Transport::Rdma { device: String::new(), port: 1, gid_index: -1 };
    let e = ep.connect_with("127.0.0.1:1", &client_config().transport(rdma)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("ClientConfig::transport"), "{e}");
}
