//! A device without type-2 memory windows (the software NIC told so before any device opens,
//! `sim::set_memory_windows(false)`; this binary's only test, as the switch is per process):
//! each receive ring falls back to its MR's rkey, the fallback is counted at both ends
//! (`window_fallbacks`), and calls of every size still work both ways (eager, one ring body,
//! a body of several rings in pieces), byte for byte, and the fallback is logged: one warning per
//! process naming the device. Sim only: rxe0 has memory windows.

mod rpc_support;

use std::sync::Mutex;

use rpc_core::codegen::*;
use rpc_core::verbs::sim;
use rpc_core::{Client, Transport};
use rpc_support::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The WARN events of the process, each as its fields `name=value` joined by spaces.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A subscriber that keeps the WARN events (this binary's only test installs it for the process:
/// the workers log on threads of their own).
struct Warnings;

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() == Level::WARN
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut f = Fields(String::new());
        e.record(&mut f);
        WARNINGS.lock().unwrap().push(f.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

const EAGER: u32 = 1024;
const RING: u32 = 64 * 1024;

#[test]
fn without_memory_windows_rings_fall_back_to_their_mr_counted_and_calls_of_every_size_work() {
    tracing::subscriber::set_global_default(Warnings).unwrap();
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
    // Both rings fell back (counted above); the process says so once, naming the device.
    let fallbacks: Vec<String> =
        WARNINGS.lock().unwrap().iter().filter(|w| w.contains("no type-2 memory windows")).cloned().collect();
    assert_eq!(fallbacks.len(), 1, "one warning per process: {fallbacks:?}");
    assert!(fallbacks[0].contains("device=\"sim0\""), "it names the device: {}", fallbacks[0]);
}
