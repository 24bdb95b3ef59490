//! The listener waits on readiness (epoll, through mio), not on a `read()` of each control
//! connection every millisecond (what it did before issue 11): with 32 idle sessions its thread
//! sleeps between housekeeping ticks (20 ms), about 50 wake-ups a second whatever the number of
//! sessions. Counted from the thread's voluntary context switches (`/proc/self/task/*/status`),
//! a count that load can only lower. Its own binary: the only server, so the only
//! `rpc-listener` thread, of the process.

mod rpc_support;

use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// Voluntary context switches of this process's thread named `name` (none: `None`).
fn voluntary_switches(name: &str) -> Option<u64> {
    for e in std::fs::read_dir("/proc/self/task").ok()? {
        let p = e.ok()?.path();
        if std::fs::read_to_string(p.join("comm")).ok()?.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(p.join("status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:"))?;
        return line.split_whitespace().nth(1)?.parse().ok();
    }
    None
}

#[test]
fn an_idle_listener_with_32_sessions_sleeps_between_housekeeping_ticks() {
    let (server, _) = spawn(server());
    let clients: Vec<Client> =
        (0..32).map(|_| Client::connect_with(server.local_addr(), &client_config()).unwrap()).collect();
    for (i, c) in clients.iter().enumerate() {
        check_reply(&c.unary(ECHO, &request(i as u64, 8, 8), &CallOptions::default()).unwrap(), i as u64, 8);
    }
    let before = voluntary_switches("rpc-listener").expect("the listener thread");
    std::thread::sleep(Duration::from_secs(1));
    let wakes = voluntary_switches("rpc-listener").unwrap() - before;
    eprintln!("the listener woke {wakes} times in 1 s with {} idle sessions", clients.len());
    // 50 ticks a second, and a margin; a read of each connection every millisecond would be
    // about 1 000 (each a sleep of 1 ms between rounds).
    assert!(wakes < 200, "the listener woke {wakes} times in 1 s with 32 idle sessions (its tick is 20 ms)");
    assert_eq!(server.counters().sessions_closed, 0, "the sessions stayed open");
    drop(clients);
    server.shutdown();
}
