//! An idle blocking `Client` answers the server's idle probe (issue 28 item 1): its handshake
//! says it answers Pings while idle (`wire::FLAG_IDLE_PONGS`), and its endpoint's progress
//! thread does, looking at the session every 50 ms while no call holds it. So the server keeps
//! a live idle client's session past `peer_timeout`, may hold no control connection for it
//! (`FLAG_DETACHED`), and reclaims the session of a client process that died while idle by the
//! probe alone.
//!
//! Run: `cargo test -p rpc-core --test client_idle_probe`.

mod rpc_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// The endpoints' progress threads are counted by name: the tests of this file run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The name of an endpoint's progress thread.
const PROGRESS: &str = "rpc-progress";

/// An idle blocking `Client`, idle four times the server's `peer_timeout` (and its
/// `idle_timeout`), keeps its session: the progress thread answered every Ping, and the next
/// call goes out on the same session, with no reconnect.
#[test]
fn an_idle_blocking_client_keeps_its_session_past_the_servers_peer_timeout() {
    let _serial = serial();
    let timeout = Duration::from_millis(400);
    let (server, _) = spawn(server().peer_timeout(Some(timeout)).idle_timeout(Some(timeout)));
    let c = Client::connect_with(server.local_addr(), &client_config()).expect("connects");
    check_reply(&c.unary(ECHO, &request(1, 10, 10), &CallOptions::default()).unwrap(), 1, 10);
    std::thread::sleep(timeout * 4);
    check_reply(&c.unary(ECHO, &request(2, 10, 10), &CallOptions::default()).unwrap(), 2, 10);
    let counters = format!("client {:?}\nserver {:?}", c.counters(), server.counters());
    assert_eq!(c.reconnect_attempts(), 0, "the idle session was kept: {counters}");
    assert_eq!(c.counters().sessions_opened, 1, "{counters}");
    let s = server.counters();
    assert_eq!((s.peers_lost, s.idle_closed, s.sessions_closed), (0, 0, 0), "{counters}");
    drop(c);
    server.shutdown();
}

/// Set (to the server's address) for the child that runs `idle_client_process`.
const CLIENT_ENV: &str = "RPC_IDLE_BLOCKING_CLIENT_OF";

/// The child's entry point for `a_killed_idle_client_process_is_reclaimed_by_the_probe`: a
/// blocking `Client` that makes one call, says `READY <sessions_detached>` and stays idle (no
/// call, its thread blocked on stdin) until it is killed.
#[test]
#[ignore = "the client side of a_killed_idle_client_process_is_reclaimed_by_the_probe; run in a child process"]
fn idle_client_process() {
    let Ok(addr) = std::env::var(CLIENT_ENV) else { return };
    let addr: std::net::SocketAddr = addr.parse().expect("the server's address");
    let c = Client::connect_with(addr, &client_config()).expect("a client of the parent's server");
    check_reply(&c.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    println!("\nREADY {}", c.counters().sessions_detached);
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
    }
}

/// Runs `idle_client_process` in a child process against `server`; returns the child and what
/// it said after READY (its `sessions_detached`), once it said it.
fn idle_client_child(
    server: &rpc_core::ServerHandle,
) -> (Child, String, BufReader<std::process::ChildStdout>) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--ignored", "--exact", "idle_client_process", "--nocapture", "--test-threads=1"])
        .env(CLIENT_ENV, server.local_addr().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning the client process");
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("idle_client_process: no stdout");
    };
    let mut out = BufReader::new(stdout);
    loop {
        let mut line = String::new();
        match out.read_line(&mut line) {
            Ok(0) | Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("idle_client_process exited before saying READY: {status:?}");
            }
            Ok(_) => {
                if let Some(rest) = line.trim().strip_prefix("READY ") {
                    return (child, rest.to_owned(), out);
                }
            }
        }
    }
}

/// A blocking client process idle on a detached session (no control connection: the server
/// holds one, for this process's client, and `idle_timeout` is off, so only the client's
/// promise to answer Pings while idle lets it detach the child's): alive, its progress thread
/// keeps the session through three `peer_timeout`s; killed (SIGKILL, while idle), nothing
/// tells the server but the probe, which reclaims the session (`peers_lost`), and the server
/// serves on.
#[test]
fn a_killed_idle_client_process_is_reclaimed_by_the_probe() {
    let _serial = serial();
    let peer_timeout = Duration::from_secs(1);
    let (server, _stash) =
        spawn(server().max_control_connections(1).idle_timeout(None).peer_timeout(Some(peer_timeout)));
    let held = Client::connect_with(server.local_addr(), &client_config()).expect("the held client");
    check_reply(&held.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    let (mut child, detached, _out) = idle_client_child(&server);
    let counters = || format!("server {:?}", server.counters());
    assert_eq!(detached, "1", "the idle client's session holds no control connection: {}", counters());
    assert_eq!(server.counters().sessions_detached, 1, "{}", counters());
    std::thread::sleep(peer_timeout * 3);
    assert_eq!(server.counters().peers_lost, 0, "the live idle client answered the probe: {}", counters());
    child.kill().expect("kill");
    child.wait().expect("wait");
    wait_until(
        "the probe to reclaim the killed client's session",
        WAIT,
        || server.counters().peers_lost == 1,
        counters,
    );
    let c = counters_when(&server, "the reclaimed session gone", WAIT, |c| c.sessions_detached == 0);
    assert_eq!((c.peers_lost, c.sessions_closed), (1, 1), "{c:?}");
    check_reply(&held.unary(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap(), 2, 8);
    drop(held);
    server.shutdown();
}

/// A thread's clients, to any number of servers, share its endpoint's one progress thread: the
/// first client starts it, it sleeps between its looks, and it ends once the last client is
/// gone; a client of another thread (another endpoint) has its own.
#[test]
fn a_threads_clients_share_one_progress_thread_which_ends_with_the_last() {
    let _serial = serial();
    wait_until(
        "no progress thread left",
        WAIT,
        || threads_named(PROGRESS) == 0,
        || format!("{:?}", thread_names()),
    );
    let servers: Vec<_> = (0..2).map(|_| spawn(server()).0).collect();
    let mine: Vec<Client> = (0..3)
        .map(|i| Client::connect_with(servers[i % 2].local_addr(), &client_config()).expect("connects"))
        .collect();
    // A thread names itself once it runs: waited for, then counted.
    let started = |n: usize| {
        wait_until(
            "the progress thread to run",
            WAIT,
            || threads_named(PROGRESS) >= n,
            || format!("{:?}", thread_names()),
        )
    };
    started(1);
    assert_eq!(
        threads_named(PROGRESS),
        1,
        "one progress thread for the thread's endpoint: {:?}",
        thread_names()
    );
    let addr = servers[0].local_addr();
    let other = std::thread::spawn(move || Client::connect_with(addr, &client_config()).expect("connects"))
        .join()
        .expect("the other thread");
    started(2);
    assert_eq!(threads_named(PROGRESS), 2, "another thread's endpoint has its own: {:?}", thread_names());
    for (i, c) in mine.iter().enumerate() {
        echo_checked(c, i as u64, 8, 8);
    }
    echo_checked(&other, 9, 8, 8);
    drop(mine);
    drop(other);
    wait_until(
        "the progress threads to end with their last clients",
        WAIT,
        || threads_named(PROGRESS) == 0,
        || format!("{:?}", thread_names()),
    );
    for s in servers {
        s.shutdown();
    }
}
