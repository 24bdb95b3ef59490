//! One dispatcher thread per core for every `Channel` session placed there (issue 28 item 1): a
//! balanced channel over many servers, and several channels to different servers, run all
//! their sessions on one thread per core (counted by name in `/proc/self/task/*/comm`); a
//! session that is slow (its task waits on a call that is never answered) or broken (its
//! server killed) does not keep the others on its thread from answering calls and the
//! server's idle probes; dropping one channel leaves the others working, and the thread ends
//! with its last session. Each test names its channels' threads (`ChannelConfig::thread_name`)
//! so that tests running at once do not share one.

#[path = "rpc_support/mod.rs"]
mod rpc_support;

use std::future::Future;
use std::net::SocketAddr;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use rpc_core::balance::{BalanceConfig, Policy, StaticResolver};
use rpc_core::{CallOptions, Channel, Code, ServerHandle};
use rpc_support::*;

/// The threads named `name` once there is one (a thread takes its name once it runs: one just
/// started may not have yet).
fn running(name: &str) -> usize {
    eventually(&format!("a thread named {name}"), || threads_named(name) > 0);
    threads_named(name)
}

/// Waits (up to [`WAIT`], a hang guard) until `cond` holds, then asserts it, saying `what`.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < until, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn echo(ch: &Channel, seq: u64) -> Result<EchoMsg, rpc_core::Status> {
    block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 8, 8), &CallOptions::default()))
}

fn echo_checked(ch: &Channel, seq: u64) {
    let r = echo(ch, seq).unwrap_or_else(|e| panic!("call {seq}: {e}"));
    check_reply(&r, seq, 8);
}

fn servers(n: usize) -> Vec<ServerHandle> {
    (0..n).map(|_| spawn(server()).0).collect()
}

#[test]
fn a_balanced_channel_over_20_servers_runs_on_one_thread_per_core() {
    let s = servers(20);
    let addrs: Vec<SocketAddr> = s.iter().map(|h| h.local_addr()).collect();
    // Two sessions per server, one on each of two cores: 40 sessions.
    let names = ["bal20-0", "bal20-1"];
    assert_eq!(names.map(threads_named), [0, 0], "threads before the channel");
    let cfg = BalanceConfig::default()
        .policy(Policy::RoundRobin)
        .channel(channel_config("bal20").dispatchers(2).core_ids(vec![0, 1]));
    let ch = Channel::balanced(StaticResolver::new(addrs.clone()), &cfg).unwrap();
    // Round robin: each server gets its share once all are connected.
    eventually("every server answering", || {
        for seq in 0..40 {
            let _ = echo(&ch, seq);
        }
        s.iter().all(|h| h.counters().rpcs >= 2)
    });
    for seq in 100..200 {
        echo_checked(&ch, seq);
    }
    assert!(s.iter().all(|h| h.counters().sessions_opened == 2), "each server has two sessions");
    assert_eq!(names.map(running), [1, 1], "40 sessions on 20 servers run on one dispatcher thread per core");
    assert_eq!(threads_named("bal20"), 0, "no unpinned dispatcher thread");
    drop(ch);
    eventually("the dispatcher threads ending with their last session", || {
        names.map(threads_named) == [0, 0]
    });
}

#[test]
fn channels_to_different_servers_share_the_thread_and_it_ends_with_the_last() {
    let s = servers(3);
    assert_eq!(threads_named("shr-many"), 0);
    let chans: Vec<Channel> = s
        .iter()
        .map(|h| Channel::connect_blocking(h.local_addr(), &channel_config("shr-many")).unwrap())
        .collect();
    for (i, ch) in chans.iter().enumerate() {
        for seq in 0..20 {
            echo_checked(ch, ((i as u64) << 32) | seq);
        }
    }
    // (A worker publishes its counters when idle.)
    eventually("each server counting its channel's calls", || s.iter().all(|h| h.counters().rpcs >= 20));
    assert_eq!(running("shr-many"), 1, "three channels' sessions on one thread");
    drop(chans);
    eventually("the thread ending with its last session", || threads_named("shr-many") == 0);
}

/// Polls `call` once (its task then waits: the dispatcher thread drives its session for it).
fn poll_once<F: Future + Unpin>(call: &mut F) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    std::pin::Pin::new(call).poll(&mut cx).is_ready()
}

/// Wakes a parked test thread.
struct Unpark(std::thread::Thread, std::sync::atomic::AtomicBool);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.unpark();
    }
}

/// An echo call whose task polls it once and then sleeps until woken (up to [`WAIT`], a hang
/// guard): a call that only the dispatcher thread can finish.
fn echo_woken(ch: &Channel, seq: u64) {
    let mut call = ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 8, 8), &CallOptions::default());
    let unpark = std::sync::Arc::new(Unpark(std::thread::current(), Default::default()));
    let waker = Waker::from(unpark.clone());
    let mut cx = Context::from_waker(&waker);
    let until = Instant::now() + WAIT;
    loop {
        if let std::task::Poll::Ready(r) = std::pin::Pin::new(&mut call).poll(&mut cx) {
            let r = r.unwrap_or_else(|e| panic!("call {seq}: {e}"));
            check_reply(&r, seq, 8);
            return;
        }
        while !unpark.1.swap(false, std::sync::atomic::Ordering::SeqCst) {
            assert!(Instant::now() < until, "call {seq}: its task was never woken");
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_slow_and_a_broken_session_do_not_stop_the_others_on_the_thread() {
    // Servers that close a session whose client misses their probes for 600 ms.
    let peer_timeout = Duration::from_millis(600);
    let probing: Vec<ServerHandle> =
        (0..3).map(|_| spawn(server().peer_timeout(Some(peer_timeout))).0).collect();
    let (slow_server, stash) = spawn(server());
    let (doomed, _) = spawn(server());
    let cfg = channel_config("shr-iso");
    let idle: Vec<Channel> =
        probing.iter().map(|h| Channel::connect_blocking(h.local_addr(), &cfg).unwrap()).collect();
    let slow = Channel::connect_blocking(slow_server.local_addr(), &cfg).unwrap();
    let broken = Channel::connect_blocking(doomed.local_addr(), &cfg).unwrap();
    for (i, ch) in idle.iter().chain([&slow, &broken]).enumerate() {
        echo_checked(ch, i as u64);
    }
    assert_eq!(running("shr-iso"), 1, "five channels on one thread");
    // The slow session: a call the server holds, its task waiting, so the thread drives that
    // session all along; the broken one: its server killed.
    let mut held = slow.unary::<EchoMsg, EchoMsg>(STASH, request(7, 4, 0), &CallOptions::default());
    assert!(!poll_once(&mut held), "a held call answered");
    eventually("the held call at the server", || stash.lock().unwrap().len() == 1);
    drop(doomed);
    let e = echo(&broken, 99).expect_err("a call to a killed server answered");
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    // Idle through four of the probing servers' timeouts: every probe is answered by the
    // thread (busy with the slow session) and no session is closed.
    std::thread::sleep(peer_timeout * 4);
    for (i, h) in probing.iter().enumerate() {
        assert_eq!(h.counters().peers_lost, 0, "server {i} lost an idle channel's session");
    }
    for (i, ch) in idle.iter().enumerate() {
        for seq in 0..10 {
            echo_checked(ch, ((i as u64) << 32) | (1000 + seq));
        }
    }
    // Dropping one channel (the broken one) leaves the others working, the thread too (a call
    // whose task sleeps is finished by it).
    drop(broken);
    for (i, ch) in idle.iter().enumerate() {
        echo_checked(ch, ((i as u64) << 32) | 2000);
        echo_woken(ch, ((i as u64) << 32) | 2001);
    }
    assert!(!poll_once(&mut held), "the held call answered before its responder did");
    stash.lock().unwrap().pop().unwrap().send(Ok(EchoMsg { seq: 7, ..Default::default() }));
    eventually("the held call answered", || poll_once(&mut held));
    echo_checked(&slow, 3000);
    assert_eq!(threads_named("shr-iso"), 1);
}
