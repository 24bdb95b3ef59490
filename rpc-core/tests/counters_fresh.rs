//! `ServerHandle::counters` follows a worker that never goes idle: a worker publishes its
//! counters every `PUBLISH_BUSY` (256) busy iterations, not only when it goes idle.

mod rpc_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpc_core::Client;
use rpc_support::*;

/// A client calls back to back (the worker finds a request at nearly every poll, so it seldom
/// sees the idle stretch at which it also publishes) while the test samples the server's count of
/// calls answered: it never lags the calls the client has seen answered by more than the
/// publication period (256 busy iterations, each answering at most a couple of this client's
/// messages). Fails on the code before (a busy worker published only when its iteration number
/// was a multiple of 4,096, one busy iteration in 4,096 on average): "the server's counters lag
/// 2216 calls behind", and under load (few calls a second) `credits::hostile_credit_messages_...`
/// gave up waiting 10 s for its `malformed` count.
#[test]
fn counters_follow_a_worker_that_never_goes_idle() {
    let (server, _) = spawn(server());
    let addr = server.local_addr();
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let caller = {
        let (done, stop) = (done.clone(), stop.clone());
        std::thread::spawn(move || {
            let c = Client::connect_with(addr, &client_config()).unwrap();
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                echo_checked(&c, seq, 32, 32);
                seq += 1;
                done.store(seq, Ordering::Release);
            }
        })
    };
    wait_until("3,000 calls answered", WAIT, || done.load(Ordering::Acquire) >= 3_000, String::new);
    let mut worst = 0;
    for _ in 0..50 {
        let seen = done.load(Ordering::Acquire);
        let published = server.counters().rpcs;
        worst = worst.max(seen.saturating_sub(published));
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    caller.join().unwrap();
    assert!(worst <= 300, "the server's counters lag {worst} calls behind");
}
