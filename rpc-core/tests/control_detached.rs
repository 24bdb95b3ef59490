//! Sessions beyond `ServerConfig::max_control_connections` hold no TCP control connection
//! (issue 28 item 2: the control channel holds no file descriptor per session beyond what the
//! open-file limit allows; protocol 12, `wire::FLAG_DETACHED`). The server's reply says so, both
//! ends close the connection, and the session lives on the RDMA path: calls, the client's Close
//! when it is dropped, the server's Close when it shuts down.
//!
//! The connections are counted in the kernel's table (`/proc/net/tcp`), not only in our
//! counters: a descriptor kept open by either end stays ESTABLISHED (or CLOSE_WAIT) there.

mod rpc_support;

use rpc_core::codegen::*;
use rpc_core::wire::{Frame, FLAG_DETACHED};
use rpc_core::{Client, ServerHandle};
use rpc_support::*;

/// TCP connections of the server at `port` in the kernel's table whose descriptor is still
/// open: (server ends, client ends), each ESTABLISHED or CLOSE_WAIT (the other end closed, this
/// one not yet).
fn connections(port: u16) -> (usize, usize) {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port_of = |field: &str| field.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    let (mut server, mut client) = (0, 0);
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let (local, remote, state) = (port_of(f[1]), port_of(f[2]), f[3]);
        let open = state == "01" || state == "08";
        if local == Some(port) && open {
            server += 1;
        }
        if remote == Some(port) && open {
            client += 1;
        }
    }
    (server, client)
}

fn connect(server: &ServerHandle) -> Client {
    Client::connect_with(server.local_addr(), &client_config()).expect("connects")
}

/// Five sessions, room for two connections: the last three are detached (their clients say so
/// too), the kernel holds two connections, every session serves, and dropped clients' sessions
/// are torn down by their Close alone.
#[test]
fn sessions_beyond_max_control_connections_hold_none_and_serve() {
    let (server, _) = spawn(server().max_control_connections(2));
    let port = server.local_addr().port();
    let clients: Vec<Client> = (0..5).map(|_| connect(&server)).collect();
    for (i, c) in clients.iter().enumerate() {
        echo_checked(c, i as u64, 32, 5000);
    }
    let detached: Vec<u64> = clients.iter().map(|c| c.counters().sessions_detached).collect();
    assert_eq!(detached, [0, 0, 1, 1, 1], "the sessions admitted after two connections are detached");
    let held: Vec<u64> = clients.iter().map(|c| c.counters().control_connections).collect();
    assert_eq!(held, [1, 1, 0, 0, 0]);
    counters_when(&server, "2 connections, 3 detached", WAIT, |c| {
        c.control_connections == 2 && c.sessions_detached == 3
    });
    wait_until(
        "the kernel holds two connections of the server",
        WAIT,
        || connections(port) == (2, 2),
        || format!("(server ends, client ends) = {:?}", connections(port)),
    );
    for round in 1..10u64 {
        for (i, c) in clients.iter().enumerate() {
            echo_checked(c, round * 10 + i as u64, 100, 20_000);
        }
    }
    let closed = server.counters().sessions_closed;
    let mut clients = clients;
    clients.truncate(2);
    let c = counters_when(&server, "the detached sessions closed by their clients' Close", WAIT, |c| {
        c.sessions_detached == 0 && c.sessions_closed == closed + 3
    });
    assert_eq!(c.control_connections, 2);
    echo_checked(&clients[1], 99, 32, 32);
}

/// A server that shuts down ends its detached client's calls (its Close reaches the client on
/// the RDMA path) rather than leaving them waiting for a connection that is not there.
#[test]
fn a_detached_client_learns_that_its_server_shut_down() {
    let (server, _) = spawn(server().max_control_connections(1));
    let held = connect(&server);
    let detached = connect(&server);
    assert_eq!(detached.counters().sessions_detached, 1);
    echo_checked(&detached, 1, 32, 32);
    server.shutdown();
    let e = detached
        .unary::<_, EchoMsg>(ECHO, &request(2, 32, 32), &CallOptions::deadline(WAIT))
        .expect_err("the server is gone");
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    drop(held);
}

/// Without `peer_timeout` and `idle_timeout` a dead client would never be found without its
/// connection: every session keeps one, whatever the limit.
#[test]
fn without_timers_every_session_keeps_its_connection() {
    let (server, _) = spawn(server().max_control_connections(1).peer_timeout(None).idle_timeout(None));
    let clients: Vec<Client> = (0..3).map(|_| connect(&server)).collect();
    for (i, c) in clients.iter().enumerate() {
        echo_checked(c, i as u64, 32, 32);
        assert_eq!(c.counters().sessions_detached, 0, "client {i}");
    }
    counters_when(&server, "3 connections", WAIT, |c| c.control_connections == 3);
    assert_eq!(server.counters().sessions_detached, 0);
}

/// FLAG_DETACHED is the server's answer: a client that sends it is refused, naming the field.
#[test]
fn a_client_asking_to_be_detached_is_refused() {
    let (server, _) = spawn(server());
    match raw_handshake(server.local_addr(), |h| h.flags |= FLAG_DETACHED) {
        Frame::Refusal(r) => {
            assert_eq!(r.code, Code::InvalidArgument, "{}", r.message);
            assert!(r.message.contains("flags"), "{}", r.message);
        }
        other => panic!("admitted: {other:?}"),
    }
    echo_checked(&connect(&server), 1, 32, 32);
}
