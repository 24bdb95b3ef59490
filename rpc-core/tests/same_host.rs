//! The same-host path (issue 28 item 4): a client on the server's host takes the software NIC
//! (shared memory) instead of the RDMA NIC's loopback when both ask for it
//! (`ClientConfig::same_host_shm`, `ServerConfig::same_host_shm`), and connects on the NIC when
//! the server does not offer it. These run on the RDMA transport (`scripts/softroce-test` sets
//! `RPC_REQUIRE_RDMA=1` in its guest, against `rxe0`); on `sim` there is no NIC loopback to skip,
//! and each test says so and returns.

mod rpc_support;

use rpc_core::{Client, ServerHandle, Transport};
use rpc_support::*;

/// The RDMA transport under test, or `None` (after saying why) on `sim`.
fn on_rdma(test: &str) -> Option<Transport> {
    match transport() {
        t @ Transport::Rdma { .. } => Some(t),
        _ => {
            eprintln!("{test}: skipped: the same-host path replaces an RDMA NIC's loopback (run with RPC_TEST_TRANSPORT=rdma)");
            None
        }
    }
}

/// Small and bulk calls (eager, and through the ring by RDMA WRITE) on `client`, each checked.
fn calls(client: &Client) {
    for (seq, len) in [(1, 32), (2, 64 << 10), (3, 3 << 20)] {
        echo_checked(client, seq, len, len);
    }
}

/// The calls the server's RDMA workers served (its same-host workers are not in
/// `worker_counters`).
fn served_on_nic(server: &ServerHandle) -> u64 {
    server.worker_counters().iter().map(|c| c.rpcs).sum()
}

#[test]
fn a_client_on_the_servers_host_gets_its_session_on_shared_memory() {
    let Some(_) = on_rdma("a_client_on_the_servers_host_gets_its_session_on_shared_memory") else { return };
    let (server, _) = spawn(server().same_host_shm(Some(Vec::new())));
    let client = Client::connect_with(server.local_addr(), &client_config().same_host_shm(true)).unwrap();
    calls(&client);
    assert_eq!(client.counters().sessions_shm, 1, "the client's session is on the same-host path");
    let c = counters_when(&server, "the same-host workers to publish the calls", WAIT, |c| c.rpcs >= 3);
    assert_eq!(c.sessions_shm, 1, "the server counts one same-host session: {c:?}");
    assert_eq!(served_on_nic(&server), 0, "the RDMA workers served none of the calls");
}

#[test]
fn a_server_without_the_path_serves_the_client_on_the_nic() {
    let Some(_) = on_rdma("a_server_without_the_path_serves_the_client_on_the_nic") else { return };
    let (server, _) = spawn(server());
    // The same-host hello is refused (FAILED_PRECONDITION naming the setting) and the client
    // connects again on the NIC.
    let client = Client::connect_with(server.local_addr(), &client_config().same_host_shm(true)).unwrap();
    calls(&client);
    assert_eq!(client.counters().sessions_shm, 0);
    let c = counters_when(&server, "the RDMA worker to publish the calls", WAIT, |c| c.rpcs >= 3);
    assert_eq!((c.sessions_shm, c.sessions_opened), (0, 1), "{c:?}");
}

#[test]
fn a_client_that_does_not_ask_stays_on_the_nic() {
    let Some(_) = on_rdma("a_client_that_does_not_ask_stays_on_the_nic") else { return };
    let (server, _) = spawn(server().same_host_shm(Some(Vec::new())));
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    calls(&client);
    assert_eq!(client.counters().sessions_shm, 0);
    let c =
        counters_when(&server, "the RDMA worker to publish the calls", WAIT, |_| served_on_nic(&server) >= 3);
    assert_eq!(c.sessions_shm, 0, "{c:?}");
}

#[test]
fn shared_memory_and_nic_sessions_of_one_server_live_side_by_side_and_it_shuts_down() {
    let Some(_) = on_rdma("shared_memory_and_nic_sessions_of_one_server_live_side_by_side_and_it_shuts_down")
    else {
        return;
    };
    let (server, _) = spawn(server().same_host_shm(Some(Vec::new())));
    let shm = Client::connect_with(server.local_addr(), &client_config().same_host_shm(true)).unwrap();
    let nic = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    for round in 0..3 {
        echo_checked(&shm, round, 1000, 70_000);
        echo_checked(&nic, round, 70_000, 1000);
    }
    assert_eq!((shm.counters().sessions_shm, nic.counters().sessions_shm), (1, 0));
    // Both sets of workers drain and stop: the client on each path sees its session end.
    server.shutdown();
    for c in [&shm, &nic] {
        assert!(c.unary::<_, EchoMsg>(ECHO, &request(9, 8, 8), &Default::default()).is_err());
    }
}

#[test]
fn a_channel_takes_the_same_host_path_too() {
    let Some(_) = on_rdma("a_channel_takes_the_same_host_path_too") else { return };
    let (server, _) = spawn(server().same_host_shm(Some(Vec::new())));
    let config = rpc_core::ChannelConfig::default()
        .client(client_config().same_host_shm(true).polling(rpc_core::PollingPolicy::Event { spins: 0 }))
        .thread_name("shm-chan");
    let ch = rpc_core::Channel::connect_blocking(server.local_addr(), &config).unwrap();
    for (seq, len) in [(1u64, 32usize), (2, 64 << 10)] {
        let r: EchoMsg = block_on(ch.unary(ECHO, request(seq, len, len), &Default::default())).unwrap();
        check_reply(&r, seq, len);
    }
    assert_eq!(ch.counters().sessions_shm, 1, "the channel's session is on the same-host path");
    let c = counters_when(&server, "the same-host workers to publish the calls", WAIT, |c| c.rpcs >= 2);
    assert_eq!((c.sessions_shm, served_on_nic(&server)), (1, 0), "{c:?}");
}

#[test]
fn a_peers_sessions_on_both_paths_count_against_one_max_sessions_per_peer() {
    let Some(_) = on_rdma("a_peers_sessions_on_both_paths_count_against_one_max_sessions_per_peer") else {
        return;
    };
    let (server, _) = spawn(server().same_host_shm(Some(Vec::new())).max_sessions_per_peer(1));
    // One on the NIC, then one asking for the same-host path: refused there (the cap), then on
    // the NIC (the same cap).
    let nic = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    calls(&nic);
    let e = Client::connect_with(server.local_addr(), &client_config().same_host_shm(true))
        .expect_err("a second session of the peer admitted on the same-host path");
    assert_eq!(e.code(), rpc_core::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("max_sessions_per_peer"), "{e}");
    drop(nic);
    // The other way round: the same-host session holds the peer's one session.
    // (A connect that raced the close may land on the NIC after its same-host try was refused:
    // dropped, and tried again.)
    let shm = wait_for(
        "the NIC session's close to free the peer's cap",
        WAIT,
        || {
            Client::connect_with(server.local_addr(), &client_config().same_host_shm(true))
                .ok()
                .filter(|c| c.counters().sessions_shm == 1)
        },
        || format!("{:?}", server.counters()),
    );
    calls(&shm);
    let e = Client::connect_with(server.local_addr(), &client_config())
        .expect_err("a NIC session admitted beside the peer's same-host one");
    assert_eq!(e.code(), rpc_core::Code::ResourceExhausted, "{e}");
}
