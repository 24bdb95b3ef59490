//! Balanced channels (issue 28 item 3): a `Channel` over several servers from a `Resolver`,
//! round robin, power of two choices, consistent hashing; lazy connects, failover (calls in
//! flight on a dead server end UNAVAILABLE, new calls go to the others), backoff and recovery.
//! Servers run in this process on sim; a "killed" server is a dropped `ServerHandle`.

#[path = "rpc_support/mod.rs"]
mod rpc_support;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rpc_core::balance::{BalanceConfig, Policy, ServerState, StaticResolver};
use rpc_core::{CallOptions, Channel, ChannelConfig, Code, PollingPolicy, ServerHandle};
use rpc_support::*;

fn config(policy: Policy, name: &str) -> BalanceConfig {
    BalanceConfig::default()
        .policy(policy)
        .channel(
            ChannelConfig::default()
                .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
                .spins(500)
                .thread_name(name),
        )
        .retry_initial(Duration::from_millis(50))
        .retry_max(Duration::from_millis(400))
}

fn servers(n: usize) -> Vec<ServerHandle> {
    (0..n).map(|_| spawn(server()).0).collect()
}

fn addrs(s: &[ServerHandle]) -> Vec<SocketAddr> {
    s.iter().map(|h| h.local_addr()).collect()
}

fn echo(ch: &Channel, seq: u64, opts: &CallOptions) -> Result<EchoMsg, rpc_core::Status> {
    block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 8, 8), opts))
}

/// Picks per server, in the order of `addrs`.
fn picks(ch: &Channel, addrs: &[SocketAddr]) -> Vec<u64> {
    let s = ch.balancer().unwrap().servers();
    addrs.iter().map(|a| s.iter().find(|x| x.addr == *a).map_or(0, |x| x.picks)).collect()
}

fn state(ch: &Channel, addr: SocketAddr) -> ServerState {
    ch.balancer().unwrap().servers().iter().find(|x| x.addr == addr).unwrap().state
}

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < until, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn nothing_connects_before_the_first_call_then_round_robin_spreads_evenly() {
    let s = servers(3);
    let a = addrs(&s);
    let ch =
        Channel::balanced(StaticResolver::new(a.clone()), &config(Policy::RoundRobin, "bal-rr")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(a.iter().all(|&x| state(&ch, x) == ServerState::Idle), "connected before any call");
    assert!(s.iter().all(|h| h.counters().sessions_opened == 0), "a server saw a session before any call");
    // The first call waits on a server still connecting; then all are up.
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("every server up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    let before = picks(&ch, &a);
    for seq in 1..=300 {
        let r = echo(&ch, seq, &CallOptions::default()).unwrap();
        check_reply(&r, seq, 8);
    }
    let after = picks(&ch, &a);
    let spread: Vec<u64> = after.iter().zip(&before).map(|(x, y)| x - y).collect();
    assert!(spread.iter().all(|&n| n == 100), "round robin over 3 servers gave {spread:?} of 300 calls");
}

#[test]
fn no_server_at_all_ends_calls_unavailable_at_once() {
    let ch = Channel::balanced(StaticResolver::new([]), &config(Policy::RoundRobin, "bal-none")).unwrap();
    let e = echo(&ch, 1, &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("no server"), "{e}");
}

#[test]
fn a_dead_server_fails_its_calls_unavailable_the_others_take_new_ones_and_it_returns() {
    let mut s = servers(3);
    let a = addrs(&s);
    let ch =
        Channel::balanced(StaticResolver::new(a.clone()), &config(Policy::RoundRobin, "bal-fail")).unwrap();
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("every server up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    // One call held by each server (its handler stashes the responder).
    let mut held: Vec<_> = (0..3)
        .map(|i| ch.unary::<EchoMsg, EchoMsg>(STASH, request(i, 4, 0), &CallOptions::default()))
        .collect();
    for h in &s {
        eventually("the held calls to arrive", || h.counters().sessions_opened > 0);
    }
    // Kill server 1 (its handle dropped: its sessions close).
    let victim = a[1];
    let dead = s.remove(1);
    drop(dead);
    // Its held call ends UNAVAILABLE: not lost. The others' stay held.
    let mut failed = 0;
    for call in held.iter_mut() {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            if let std::task::Poll::Ready(r) = std::pin::Pin::new(&mut *call).poll(&mut cx) {
                let e = r.expect_err("a held call answered");
                assert_eq!(e.code(), Code::Unavailable, "the dead server's call: {e}");
                failed += 1;
                break;
            }
            if Instant::now() > until {
                break;
            }
            std::thread::yield_now();
        }
    }
    assert_eq!(failed, 1, "exactly the dead server's held call ends");
    eventually("the dead server marked down", || state(&ch, victim) != ServerState::Up);
    // Every new call succeeds, on the two others.
    let before = picks(&ch, &a);
    for seq in 1..=100 {
        echo(&ch, seq, &CallOptions::default())
            .unwrap_or_else(|e| panic!("call {seq} after the failover: {e}"));
    }
    let after = picks(&ch, &a);
    assert_eq!(after[1], before[1], "the dead server was picked");
    assert_eq!(after[0] - before[0] + after[2] - before[2], 100);
    // It comes back on the same address: after its backoff it is connected again and picked.
    let back = spawn_at(victim);
    let mut seq = 1000;
    eventually("the server back up", || {
        seq += 1;
        let _ = echo(&ch, seq, &CallOptions::default());
        state(&ch, victim) == ServerState::Up
    });
    let before = picks(&ch, &a);
    for seq in 2000..2030 {
        echo(&ch, seq, &CallOptions::default()).unwrap();
    }
    let after = picks(&ch, &a);
    assert_eq!(after[1] - before[1], 10, "the server back takes its third");
    drop(held);
    drop(back);
}

/// A server on a given address (the one a dead server had).
fn spawn_at(addr: SocketAddr) -> ServerHandle {
    let until = Instant::now() + WAIT;
    loop {
        match server().add_service(TestService::default()).spawn(addr) {
            Ok(h) => return h,
            Err(e) => {
                assert!(Instant::now() < until, "restarting the server on {addr}: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn a_server_that_does_not_answer_connects_is_skipped() {
    let s = servers(1);
    // A port nobody listens on (bound, then closed).
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let good = s[0].local_addr();
    let ch = Channel::balanced(StaticResolver::new([good, nobody]), &config(Policy::RoundRobin, "bal-bad"))
        .unwrap();
    // The first calls may wait on the bad server's connect and end with its error.
    let first = echo(&ch, 0, &CallOptions::default());
    if let Err(e) = &first {
        assert_eq!(e.code(), Code::Unavailable, "{e}");
    }
    eventually("the good server up", || {
        let _ = echo(&ch, 1, &CallOptions::default());
        state(&ch, good) == ServerState::Up
    });
    for seq in 10..60 {
        echo(&ch, seq, &CallOptions::default()).unwrap_or_else(|e| panic!("call {seq}: {e}"));
    }
    assert_ne!(state(&ch, nobody), ServerState::Up);
}

#[test]
fn power_of_two_choices_sends_calls_to_the_less_loaded_server() {
    let s = servers(2);
    let a = addrs(&s);
    let ch = Channel::balanced(StaticResolver::new(a.clone()), &config(Policy::PowerOfTwoChoices, "bal-p2c"))
        .unwrap();
    let b = ch.balancer().unwrap().clone();
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("both up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    // Four calls held on server 0 (server 1 marked not serving meanwhile): its load is 4.
    assert!(b.set_serving(a[1], false));
    let held: Vec<_> = (0..4)
        .map(|i| ch.unary::<EchoMsg, EchoMsg>(STASH, request(i, 4, 0), &CallOptions::default()))
        .collect();
    eventually("four calls in flight on server 0", || {
        b.servers().iter().find(|x| x.addr == a[0]).unwrap().in_flight == 4
    });
    assert!(b.set_serving(a[1], true));
    let before = picks(&ch, &a);
    for seq in 1..=50 {
        echo(&ch, seq, &CallOptions::default()).unwrap();
    }
    let after = picks(&ch, &a);
    assert_eq!(after[0], before[0], "a call went to the loaded server");
    assert_eq!(after[1] - before[1], 50);
    // A load reported from elsewhere replaces the count: server 1 reported busier.
    assert!(b.report_load(a[1], Some(100)));
    let before = picks(&ch, &a);
    for seq in 100..120 {
        echo(&ch, seq, &CallOptions::default()).unwrap();
    }
    let after = picks(&ch, &a);
    assert_eq!(after[1], before[1], "a call went to the server reported loaded");
    drop(held);
}

#[test]
fn consistent_hashing_keeps_each_key_on_its_server_and_moves_only_a_downed_servers_keys() {
    let s = servers(3);
    let a = addrs(&s);
    let ch = Channel::balanced(
        StaticResolver::new(a.clone()),
        &config(Policy::ConsistentHash { vnodes: 100 }, "bal-hash"),
    )
    .unwrap();
    let b = ch.balancer().unwrap().clone();
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("every server up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    // The server of each of 60 keys: 3 calls each, all to one server.
    let owner = |key: u64| {
        let before = picks(&ch, &a);
        for i in 0..3 {
            echo(&ch, key * 10 + i, &CallOptions::default().with_key(key)).unwrap();
        }
        let after = picks(&ch, &a);
        let moved: Vec<usize> = (0..3).filter(|&i| after[i] != before[i]).collect();
        assert_eq!(moved.len(), 1, "key {key} went to several servers: {before:?} -> {after:?}");
        assert_eq!(after[moved[0]] - before[moved[0]], 3);
        moved[0]
    };
    let first: Vec<usize> = (0..60).map(owner).collect();
    for s in 0..3 {
        assert!(first.contains(&s), "server {s} owns none of 60 keys: {first:?}");
    }
    // Server 2 not serving: its keys move, the others' stay.
    b.set_serving(a[2], false);
    let second: Vec<usize> = (0..60).map(owner).collect();
    for (k, (x, y)) in first.iter().zip(&second).enumerate() {
        if *x == 2 {
            assert_ne!(*y, 2, "key {k} still on the server not serving");
        } else {
            assert_eq!(x, y, "key {k} of a server still up moved");
        }
    }
    // Back: every key on its first server again.
    b.set_serving(a[2], true);
    let third: Vec<usize> = (0..60).map(owner).collect();
    assert_eq!(first, third);
}

#[test]
fn a_call_waiting_on_a_connect_that_fails_ends_unavailable_not_never() {
    // The only server: nobody listens there. The call waits on its connect, which fails.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let ch = Channel::balanced(
        StaticResolver::new([nobody]),
        &config(Policy::RoundRobin, "bal-never")
            .retry_initial(Duration::from_secs(30))
            .retry_max(Duration::from_secs(30)),
    )
    .unwrap();
    let e = echo(&ch, 1, &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    eventually("the server marked down", || state(&ch, nobody) == ServerState::Down);
    // Now down and nothing else: the next call ends at once, saying when it is retried.
    let e = echo(&ch, 2, &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("next retry"), "{e}");
}

#[test]
fn a_stream_with_no_server_to_pick_ends_unavailable() {
    let ch = Channel::balanced(StaticResolver::new([]), &config(Policy::RoundRobin, "bal-stream")).unwrap();
    let mut rx = ch.server_stream::<EchoMsg, EchoMsg>(ECHO, request(1, 4, 0), &CallOptions::default());
    let e = block_on(rx.message()).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    let (mut tx, mut rx) = ch.bidi_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::default());
    assert!(block_on(tx.send(&request(2, 4, 0))).is_err());
    assert_eq!(block_on(rx.message()).unwrap_err().code(), Code::Unavailable);
}

#[test]
fn power_of_two_choices_avoids_a_server_loaded_by_another_client() {
    let s = servers(2);
    let a = addrs(&s);
    // Another client holds 6 calls on server 0 (its handler stashes them): the server reports
    // that load on its responses to everyone.
    let other = Channel::connect_blocking(a[0], &config(Policy::RoundRobin, "bal-other").channel).unwrap();
    let held: Vec<_> = (0..6)
        .map(|i| other.unary::<EchoMsg, EchoMsg>(STASH, request(i, 4, 0), &CallOptions::default()))
        .collect();
    let mut held = held;
    for call in held.iter_mut() {
        // Polled once: sent.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = std::pin::Pin::new(call).poll(&mut cx);
    }
    eventually("the other client's six calls held", || s[0].counters().rpcs == 0 && other.in_flight() == 6);
    let cfg = config(Policy::PowerOfTwoChoices, "bal-p2c-load").load_fresh(Duration::from_secs(600));
    let ch = Channel::balanced(StaticResolver::new(a.clone()), &cfg).unwrap();
    let b = ch.balancer().unwrap().clone();
    // Calls until both servers have answered this client once (each report comes on a response).
    let mut seq = 0;
    eventually("both servers' loads reported", || {
        seq += 1;
        echo(&ch, seq, &CallOptions::default()).unwrap();
        b.servers().iter().all(|x| x.reported_load.is_some())
    });
    let loaded = b.servers().iter().find(|x| x.addr == a[0]).unwrap().reported_load.unwrap();
    assert!(loaded >= 6, "server 0 reported {loaded} with 6 calls held");
    let before = picks(&ch, &a);
    for seq in 100..150 {
        echo(&ch, seq, &CallOptions::default()).unwrap();
    }
    let after = picks(&ch, &a);
    assert_eq!(after[0], before[0], "a call went to the server another client loads");
    assert_eq!(after[1] - before[1], 50);
    drop(held);
}

/// Servers with the health service, and a balanced channel watching their health.
fn healthy_servers(n: usize, grace: Duration) -> Vec<ServerHandle> {
    (0..n)
        .map(|_| {
            server()
                .drain_grace(grace)
                .add_health_service()
                .add_service(TestService::default())
                .spawn("127.0.0.1:0")
                .expect("server starts")
        })
        .collect()
}

#[test]
fn a_health_watch_stops_picks_of_a_not_serving_server_and_resumes_them() {
    let s = healthy_servers(2, Duration::ZERO);
    let a = addrs(&s);
    let cfg = config(Policy::RoundRobin, "bal-health").health_check("");
    let ch = Channel::balanced(StaticResolver::new(a.clone()), &cfg).unwrap();
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("both servers up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    eventually("each server watched", || s.iter().all(|h| h.health_reporter().watchers() == 1));
    // Server 0 says NOT_SERVING: no call goes to it, none fails.
    s[0].health_reporter().set_service_status("", rpc_core::health::ServingStatus::NotServing);
    eventually("server 0 not serving", || state(&ch, a[0]) == ServerState::NotServing);
    let before = picks(&ch, &a);
    for seq in 1..=50 {
        echo(&ch, seq, &CallOptions::default()).unwrap();
    }
    let after = picks(&ch, &a);
    assert_eq!((after[0] - before[0], after[1] - before[1]), (0, 50), "picks while server 0 is not serving");
    // SERVING again: picked again.
    s[0].health_reporter().set_service_status("", rpc_core::health::ServingStatus::Serving);
    eventually("server 0 up again", || state(&ch, a[0]) == ServerState::Up);
    let before = picks(&ch, &a);
    for seq in 100..120 {
        echo(&ch, seq, &CallOptions::default()).unwrap();
    }
    let after = picks(&ch, &a);
    assert_eq!(after[0] - before[0], 10, "server 0 back in the round robin");
    // The balanced channel's stats are its servers' (not zeros).
    let st = ch.stats();
    assert!(st.started_by_callers + st.started_by_threads >= 71, "balanced channel stats: {st:?}");
    assert!(ch.calls_started().0 + ch.calls_started().1 >= 71);
}

#[test]
fn a_draining_server_is_not_picked_during_its_grace_and_no_call_fails() {
    let mut s = healthy_servers(2, Duration::from_millis(800));
    let a = addrs(&s);
    let cfg = config(Policy::RoundRobin, "bal-drain").health_check("");
    let ch = Channel::balanced(StaticResolver::new(a.clone()), &cfg).unwrap();
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("both servers up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    eventually("each server watched", || s.iter().all(|h| h.health_reporter().watchers() == 1));
    let draining = s.remove(0);
    let stopper = std::thread::spawn(move || draining.shutdown());
    // NOT_SERVING reaches the balancer during the grace (800 ms), before any call is refused;
    // every call meanwhile succeeds.
    let mut seq = 1;
    let mut not_serving = false;
    while !stopper.is_finished() {
        not_serving |= state(&ch, a[0]) == ServerState::NotServing;
        let r = echo(&ch, seq, &CallOptions::default());
        assert!(r.is_ok(), "call {seq} while server 0 drains: {:?}", r.err());
        seq += 1;
    }
    stopper.join().unwrap();
    assert!(not_serving, "the draining server was never seen not serving during its grace");
    for k in 0..20 {
        echo(&ch, seq + k, &CallOptions::default()).unwrap();
    }
}

#[test]
fn a_server_whose_only_call_is_its_health_watch_is_marked_down_when_it_dies() {
    // The only call on each server is its health watch (a stream): no unary call finds the
    // break, the stream's failure (or the dispatcher's look at the broken session) must.
    let mut s = healthy_servers(2, Duration::ZERO);
    let a = addrs(&s);
    let cfg = config(Policy::RoundRobin, "bal-stream").health_check("");
    let ch = Channel::balanced(StaticResolver::new(a.clone()), &cfg).unwrap();
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("both servers up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    eventually("each server watched", || s.iter().all(|h| h.health_reporter().watchers() == 1));
    drop(s.remove(1));
    eventually("the dead server marked down by its stream", || state(&ch, a[1]) == ServerState::Down);
}

/// The dispatcher's "idle session found broken" log lines that contain `what`, from every thread
/// of this test binary (a global subscriber of the dispatcher's DEBUG events, installed at the
/// first call, keeps only such lines).
fn log_lines(what: &str) -> Vec<String> {
    use std::sync::{Arc, Mutex, OnceLock};
    const MARK: &str = "idle session found broken";
    static LINES: OnceLock<Arc<Mutex<Vec<String>>>> = OnceLock::new();
    struct Keep(Arc<Mutex<Vec<String>>>);
    impl std::io::Write for Keep {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let s = String::from_utf8_lossy(b);
            if s.contains(MARK) {
                self.0.lock().unwrap().push(s.into_owned());
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = LINES.get_or_init(|| {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = lines.clone();
        let sub = tracing_subscriber::fmt()
            .with_env_filter("rpc_core::channel::dispatcher=debug")
            .with_ansi(false)
            .with_writer(move || Keep(kept.clone()))
            .finish();
        tracing::subscriber::set_global_default(sub).expect("the only global subscriber");
        lines
    });
    lines.lock().unwrap().iter().filter(|l| l.contains(what)).cloned().collect()
}

/// A server that dies while its session is idle: the dispatcher's look at the broken session
/// tells the balancer once (the server goes down), not at every look (every 50 ms) while the
/// balancer keeps the broken channel until its next connect. Fails with "told 20 times" (about)
/// when the look tells the watcher whenever it finds the session broken.
#[test]
fn an_idle_session_that_breaks_tells_the_balancer_once() {
    log_lines("");
    let mut s = servers(2);
    let a = addrs(&s);
    let ch = Channel::balanced(StaticResolver::new(a.clone()), &config(Policy::RoundRobin, "bal-idle-break"))
        .unwrap();
    echo(&ch, 0, &CallOptions::default()).unwrap();
    eventually("both servers up", || a.iter().all(|&x| state(&ch, x) == ServerState::Up));
    drop(s.remove(1));
    eventually("the dead server marked down", || state(&ch, a[1]) == ServerState::Down);
    // About 20 looks at the broken session.
    std::thread::sleep(Duration::from_secs(1));
    let told = log_lines(&format!("peer={}", a[1]));
    assert_eq!(told.len(), 1, "told {} times: {told:?}", told.len());
}
