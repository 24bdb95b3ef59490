//! Breaker review of the open-file limit (issue 28 item 2): `ServerConfig::max_sessions` says
//! that when descriptors run out, "connections beyond it wait in the listen backlog (the accept
//! fails `EMFILE`, logged) until a descriptor frees or their client's `connect_timeout`
//! passes". Own test binary: it lowers its process's hard open-file limit (for good).

mod rpc_support;

use std::time::Duration;

use rpc_core::{CallOptions, Client};
use rpc_support::*;

/// A connection whose accept failed `EMFILE` is accepted once a descriptor frees, with no other
/// connection arriving meanwhile. The listener's socket is watched edge-triggered (mio), so no
/// new event comes for a connection left in the backlog: the listener retries the accept every
/// turn while the last one failed.
#[test]
fn a_connection_refused_a_descriptor_is_accepted_once_one_frees() {
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()) as u64;
    let limit = open_now + 128;
    let (_, hard) = rlimit::Resource::NOFILE.get().expect("RLIMIT_NOFILE");
    if hard < limit {
        eprintln!("skipped: the hard open-file limit is {hard}");
        return;
    }
    rlimit::Resource::NOFILE.set(limit, limit).expect("lowering the open-file limit");
    let (server, _) = spawn(server());
    let addr = server.local_addr();
    let a = Client::connect_with(addr, &client_config()).expect("a first session");
    check_reply(&a.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    // Every descriptor taken, then one given back: the client's socket takes it, the server's
    // accept finds none.
    let mut fill = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fill.push(f);
    }
    drop(fill.pop());
    let client = std::thread::spawn(move || {
        let config = client_config().connect_timeout(Duration::from_secs(4));
        Client::connect_with(addr, &config)
    });
    std::thread::sleep(Duration::from_millis(500));
    // Descriptors free now: the server could accept it.
    fill.truncate(fill.len().saturating_sub(16));
    let b = client.join().unwrap().expect("the connection is accepted once descriptors free");
    check_reply(&b.unary(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap(), 2, 8);
    drop(fill);
    drop((a, b));
    server.shutdown();
}
