//! A server raises its process's open-file soft limit to the hard one (issue 28 item 2): each
//! session holds a TCP control connection, and the default soft limit (1,024) is far below
//! `max_sessions` at scale. This test binary lowers its own soft limit first (it runs alone in
//! its process), so sessions beyond it would fail to connect without the raise.

mod rpc_support;

use rpc_core::{CallOptions, Client};
use rpc_support::*;

/// The soft limit this test starts from: below what its sessions need (two sockets each in
/// this process, the client's and the server's, plus the server's own).
const LOW: u64 = 128;

#[test]
fn a_server_raises_the_open_file_limit_for_its_sessions() {
    let (_, hard) = rlimit::Resource::NOFILE.get().expect("RLIMIT_NOFILE");
    if hard < 4 * LOW {
        eprintln!("skipped: the hard open-file limit is {hard}, too low to tell a raise from none");
        return;
    }
    rlimit::Resource::NOFILE.set(LOW, hard).expect("lowering the soft limit");
    let (server, _) = spawn(server().max_sessions(200).credits_per_session(4));
    let (soft, _) = rlimit::Resource::NOFILE.get().unwrap();
    assert_eq!(soft, hard, "the server raised the soft limit to the hard one");
    // More sessions than the old soft limit has descriptors for, each making a call.
    let clients: Vec<Client> = (0..LOW)
        .map(|i| {
            let c = Client::connect_with(server.local_addr(), &client_config())
                .unwrap_or_else(|e| panic!("session {i}: {e}"));
            let r: EchoMsg = c.unary(ECHO, &request(i, 8, 8), &CallOptions::default()).unwrap();
            check_reply(&r, i, 8);
            c
        })
        .collect();
    // A worker publishes its counters on its timer tick.
    let n = clients.len() as u64;
    wait_until(
        "every session counted",
        WAIT,
        || server.counters().sessions_opened == n,
        || format!("{:?}", server.counters()),
    );
    drop(clients);
    server.shutdown();
}
