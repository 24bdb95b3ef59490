//! A device without type-2 memory windows (the software NIC told so before any device opens,
//! `sim::set_memory_windows(false)`; this binary's only test, as the switch is per process):
//! each receive ring falls back to its MR's rkey, the fallback is counted at both ends
//! (`window_fallbacks`), and calls of every size still work both ways (eager, one ring body,
//! a body of several rings in pieces), byte for byte. Sim only: rxe0 has memory windows.

mod rpc_support;

use rpc_core::codegen::*;
use rpc_core::verbs::sim;
use rpc_core::{Client, Transport};
use rpc_support::*;

const EAGER: u32 = 1024;
const RING: u32 = 64 * 1024;

#[test]
fn without_memory_windows_rings_fall_back_to_their_mr_counted_and_calls_of_every_size_work() {
    sim::set_memory_windows(false);
    let (server, _) = spawn(server().transport(Transport::Sim).eager_threshold(EAGER).ring_bytes(RING));
    let cfg = client_config().transport(Transport::Sim).eager_threshold(EAGER).ring_bytes(RING);
    let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
    assert_eq!(client.counters().window_fallbacks, 1, "the client's ring is its MR");
    // Eager, one ring body, and 3 rings + 7 bytes in pieces; each size as request and as reply.
    let sizes = [32, EAGER as usize + 1, RING as usize - 64, 3 * RING as usize + 7];
    let mut seq = 0;
    for &req in &sizes {
        for &resp in &sizes {
            seq += 1;
            let r: EchoMsg = client.unary(ECHO, &request(seq, req, resp), &CallOptions::default()).unwrap();
            check_reply(&r, seq, resp);
        }
    }
    wait_until(
        "the server to publish its ring's fallback",
        WAIT,
        || server.counters().window_fallbacks >= 1,
        || format!("server {:?}", server.counters()),
    );
    let c = server.counters();
    assert_eq!((c.malformed, c.sessions_closed), (0, 0), "{c:?}");
}
