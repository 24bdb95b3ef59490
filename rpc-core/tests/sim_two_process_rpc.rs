//! RPCs on `sim` between two processes: the server runs in a child process (this test binary
//! re-executed to run only the ignored `server_process` entry, with `RPC_SIM_SERVER_PROCESS=1`),
//! the client here; every SEND and ring WRITE crosses the shared-memory host segments. The
//! child prints its handshake address on stdout and serves until its stdin closes.
//!
//! Run: `cargo test -p rpc-core --test sim_two_process_rpc`.

mod rpc_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

const ENV: &str = "RPC_SIM_SERVER_PROCESS";
const EAGER: u32 = 1024;
const RING: u32 = 256 * 1024;

/// The child's entry point (run by the tests below, never on its own).
#[test]
#[ignore = "the server side of the two-process tests; they run it in a child process"]
fn server_process() {
    if std::env::var(ENV).is_ok_and(|v| v == "1") {
        let (server, _stash) = spawn(server().eager_threshold(EAGER).ring_bytes(RING));
        println!("\nSERVER {}", server.local_addr());
        // Serve until the parent closes our stdin (or kills us).
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
        server.shutdown();
    }
}

/// Set (to the server's address) for the child that runs `channel_client_process`.
const CLIENT_ENV: &str = "RPC_SIM_CHANNEL_CLIENT_OF";

/// The child's entry point for `an_idle_channel_client_process_is_probed_and_found_stopped`: a
/// `Channel` that makes one call, says READY and stays idle (no call on the wire) until its
/// stdin closes.
#[test]
#[ignore = "the client side of an_idle_channel_client_process_is_probed_and_found_stopped; run in a child process"]
fn channel_client_process() {
    let Ok(addr) = std::env::var(CLIENT_ENV) else { return };
    let cfg = rpc_core::ChannelConfig::default().client(
        client_config()
            .eager_threshold(EAGER)
            .ring_bytes(RING)
            .polling(rpc_core::PollingPolicy::Event { spins: 0 }),
    );
    let addr: std::net::SocketAddr = addr.parse().expect("the server's address");
    let ch = rpc_core::Channel::connect_blocking(addr, &cfg).expect("a channel to the parent's server");
    check_reply(
        &block_on(ch.unary::<_, EchoMsg>(ECHO, request(1, 8, 8), &CallOptions::default())).unwrap(),
        1,
        8,
    );
    println!("\nREADY");
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
    }
}

/// Set (to the server's address) for the child that runs `raw_client_process`.
const RAW_CLIENT_ENV: &str = "RPC_SIM_RAW_CLIENT_OF";
/// The piece the raw client writes: a request of three such pieces, through a 64 KiB ring.
const PIECE: u32 = 1 << 14;

/// The child's entry point for `a_client_process_killed_mid_message_is_closed_and_the_server_serves_on`:
/// a raw client that sends the first piece of a request three pieces long (its body through the
/// server's ring, its header saying `total_len` = 3 pieces), says PIECE once that piece's WRITE and
/// SEND completed, and waits to be killed.
#[test]
#[ignore = "the client side of a_client_process_killed_mid_message_is_closed_and_the_server_serves_on; run in a child process"]
fn raw_client_process() {
    let Ok(addr) = std::env::var(RAW_CLIENT_ENV) else { return };
    let mut c = RawClient::connect(addr.parse().expect("the server's address"));
    let h = rpc_core::wire::Header {
        method: ECHO,
        in_ring: true,
        body_len: PIECE,
        total_len: 3 * PIECE,
        session: c.session,
        ..rpc_core::wire::Header::new(rpc_core::wire::Kind::Request)
    };
    c.write(0, &vec![0x22; PIECE as usize], Some(h));
    wait_until(
        "the first piece's WRITE and SEND to complete",
        WAIT,
        || {
            c.poll();
            c.sq.outstanding() == 0
        },
        String::new,
    );
    println!("\nPIECE");
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Runs this binary's ignored client entry `entry` in a child process, told the server's
/// address in `env`, and waits for its stdout line `word`. Returns the child (its stdin piped:
/// closing it ends a client that reads it) and its stdout (kept open for libtest's report).
fn client_child(
    entry: &str,
    env: &str,
    server: &rpc_core::ServerHandle,
    word: &str,
) -> (Child, BufReader<std::process::ChildStdout>) {
    let (child, (), out) = child_process(entry, env, server, |l| (l == word).then_some(()));
    (child, out)
}

struct ServerProcess {
    child: Child,
    addr: std::net::SocketAddr,
    /// Kept open: the child writes libtest's report to it when it exits.
    _out: BufReader<std::process::ChildStdout>,
}

impl ServerProcess {
    fn start() -> ServerProcess {
        let exe = std::env::current_exe().expect("current_exe");
        let mut child = Command::new(exe)
            .args(["--ignored", "--exact", "server_process", "--nocapture", "--test-threads=1"])
            .env(ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the server process");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let addr = loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).expect("reading the server's stdout") > 0, "server exited");
            if let Some(a) = line.trim().strip_prefix("SERVER ") {
                break a.parse().expect("server address");
            }
        };
        ServerProcess { child, addr, _out: out }
    }

    fn segments(&self) -> usize {
        // `rpc-sim.<uid>.<pid>.<host id>`
        let pid = self.child.id().to_string();
        let ours = |name: &str| {
            let f: Vec<&str> = name.split('.').collect();
            f.len() == 4 && f[0] == "rpc-sim" && f[2] == pid
        };
        std::fs::read_dir("/dev/shm")
            .map(|d| d.flatten().filter(|e| ours(&e.file_name().to_string_lossy())).count())
            .unwrap_or(0)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client_for(s: &ServerProcess) -> Client {
    Client::connect_with(s.addr, &client_config().eager_threshold(EAGER).ring_bytes(RING).window(16))
        .expect("connect to the server process")
}

#[test]
fn unary_calls_of_every_size_class_between_two_processes() {
    let s = ServerProcess::start();
    assert!(s.segments() >= 1, "the server process has its host segment");
    let client = client_for(&s);
    let sizes = [(0, 0), (32, 32), (EAGER as usize - 64, 100), (5000, 3), (100_000, 200_000), (200_000, 10)];
    for (seq, (len, reply)) in sizes.into_iter().enumerate() {
        let r: EchoMsg = client
            .unary(ECHO, &request(seq as u64, len, reply), &CallOptions::default())
            .unwrap_or_else(|e| panic!("call {seq} ({len} B request, {reply} B reply): {e}"));
        check_reply(&r, seq as u64, reply);
    }
    // A window of async calls at once.
    let futs: Vec<_> = (100..116u64)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 64, 64), &CallOptions::default()))
        .collect();
    for (i, f) in (100..116u64).zip(futs) {
        check_reply(&block_on(f).unwrap(), i, 64);
    }
    drop(client);
    let mut s = s;
    drop(s.child.stdin.take());
    let status = s.child.wait().expect("wait");
    assert!(status.success(), "server exit status {status}");
    assert_eq!(s.segments(), 0, "a normal exit leaves nothing in /dev/shm");
}

#[test]
fn killed_server_process_fails_calls_in_flight_unavailable_and_its_segment_goes() {
    let s = ServerProcess::start();
    let client = client_for(&s);
    check_reply(&client.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    // Calls the handler keeps without answering, then the server process dies.
    let futs: Vec<_> = (0..4u64)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 64, 0), &CallOptions::default()))
        .collect();
    for _ in 0..1000 {
        client.progress();
        std::thread::yield_now();
    }
    let mut s = s;
    s.child.kill().expect("kill");
    s.child.wait().expect("wait");
    // A blocking call notices the dead peer (TCP liveness) and breaks the connection, which
    // fails the calls in flight. (Polling only the futures would not: the runtime's future
    // path checks liveness on idle steps it does not take; reported to the runtime owner.)
    let err = client.unary::<_, EchoMsg>(ECHO, &request(2, 4, 4), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    for f in futs {
        let err = block_on(f).unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    }
    // This process mapped the dead server's segment; its monitor removes the file.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s.segments() > 0 {
        assert!(std::time::Instant::now() < deadline, "the killed server's segment is still in /dev/shm");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A server process ended by SIGTERM (no `atexit`, and the library installs no signal handler)
/// with no peer mapping its segment leaves the segment in /dev/shm; the next sim device this
/// process opens removes it. A live server process's segment stays.
#[test]
fn a_sigtermed_server_process_segment_is_reaped_when_a_device_opens() {
    use rpc_core::verbs::sim::Sim;
    use rpc_core::verbs::{DeviceSelector, Provider};
    // Not only this process's first device: every one opened.
    let first = Sim::open(&DeviceSelector::First).expect("a sim device");
    let live = ServerProcess::start();
    let mut s = ServerProcess::start();
    assert!(s.segments() >= 1, "the server process has its host segment");
    let pid = s.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().is_ok_and(|st| st.success()), "kill -TERM");
    s.child.wait().expect("wait");
    assert!(s.segments() >= 1, "SIGTERM left the segment behind");
    let second = Sim::open(&DeviceSelector::First).expect("a sim device");
    assert_eq!(s.segments(), 0, "opening a sim device removed the dead process's segment");
    assert!(live.segments() >= 1, "a live process's segment stays");
    drop((first, second));
}

/// A server process stopped with SIGSTOP (alive to the kernel: its TCP connection stays open
/// and would answer keepalives) while a call waits: the idle probe gets no Pong, and the call
/// ends UNAVAILABLE within the client's `peer_timeout` (1.5 s here), not at its 20 s deadline.
/// Without the probe the call waited for its deadline (DEADLINE_EXCEEDED).
#[test]
fn stopped_server_process_is_detected_by_the_idle_probe() {
    let s = ServerProcess::start();
    let peer_timeout = std::time::Duration::from_millis(1500);
    let client = Client::connect_with(
        s.addr,
        &client_config().eager_threshold(EAGER).ring_bytes(RING).window(4).peer_timeout(Some(peer_timeout)),
    )
    .expect("connect to the server process");
    check_reply(&client.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    let pid = s.child.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().is_ok_and(|st| st.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let started = std::time::Instant::now();
    let err = client
        .unary::<_, EchoMsg>(
            STASH,
            &request(2, 8, 0),
            &CallOptions::deadline(std::time::Duration::from_secs(20)),
        )
        .unwrap_err();
    let took = started.elapsed();
    signal("-CONT");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("peer_timeout"), "{err}");
    assert!(took < peer_timeout * 4, "detected after {took:?} (peer_timeout {peer_timeout:?})");
    assert!(took >= peer_timeout, "declared dead after {took:?}, before peer_timeout");
    assert_eq!(client.counters().peers_lost, 1);
}

/// The server probes the idle session of a client that answers probes while idle (a
/// `Channel`, whose handshake says so): alive, its dispatcher thread answers every Ping and the
/// session outlives three peer timeouts; stopped with SIGSTOP (its kernel keeps the TCP
/// connection and would answer keepalives), it is found within the server's `peer_timeout` and
/// its session closed, with no call in flight. An idle blocking `Client` in this process answers
/// too (its endpoint's progress thread does): its session stays and serves.
#[test]
fn an_idle_channel_client_process_is_probed_and_found_stopped() {
    let peer_timeout = std::time::Duration::from_secs(2);
    let (server, _stash) =
        spawn(server().eager_threshold(EAGER).ring_bytes(RING).peer_timeout(Some(peer_timeout)));
    let blocking =
        Client::connect_with(server.local_addr(), &client_config().eager_threshold(EAGER).ring_bytes(RING))
            .expect("a blocking client");
    check_reply(&blocking.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    let (mut child, _out) = client_child("channel_client_process", CLIENT_ENV, &server, "READY");
    let counters = || format!("server {:?}", server.counters());
    wait_until("both sessions published", WAIT, || server.counters().sessions_opened == 2, counters);
    std::thread::sleep(peer_timeout * 3);
    assert_eq!(
        (server.counters().peers_lost, server.counters().sessions_closed),
        (0, 0),
        "an idle Channel and an idle blocking Client answer the server's probes"
    );
    let pid = child.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().is_ok_and(|st| st.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let stopped = std::time::Instant::now();
    wait_until("the stopped client's session to close", WAIT, || server.counters().peers_lost == 1, counters);
    let took = stopped.elapsed();
    signal("-CONT");
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "the stopped idle Channel client was found {took:?} after SIGSTOP (peer_timeout {peer_timeout:?})"
    );
    assert!(took < peer_timeout * 4, "found after {took:?} (peer_timeout {peer_timeout:?})");
    check_reply(&blocking.unary(ECHO, &request(2, 8, 8), &CallOptions::default()).unwrap(), 2, 8);
    assert_eq!(server.counters().peers_lost, 1, "{}", counters());
}

/// A client process killed (SIGKILL) in the middle of a message, one piece of three in the
/// server's ring: the server sees its connection go, closes the session and drops the partial
/// message, and serves the next client, ring bodies included; nothing of the dead session's
/// buffers is left in use once the server shut down.
#[test]
fn a_client_process_killed_mid_message_is_closed_and_the_server_serves_on() {
    let (server, _stash) = spawn(server().ring_bytes(1 << 16));
    let (mut child, _out) = client_child("raw_client_process", RAW_CLIENT_ENV, &server, "PIECE");
    let counters = || format!("server {:?}", server.counters());
    wait_until(
        "the raw client's session published",
        WAIT,
        || server.counters().sessions_opened == 1,
        counters,
    );
    child.kill().expect("kill");
    child.wait().expect("wait");
    wait_until(
        "the server to close the killed client's session",
        WAIT,
        || server.counters().sessions_closed == 1,
        counters,
    );
    assert_eq!(server.counters().rpcs, 0, "the partial request was never dispatched: {}", counters());
    let client =
        Client::connect_with(server.local_addr(), &client_config()).expect("a client after the killed one");
    check_reply(
        &client.unary(ECHO, &request(5, 100_000, 100_000), &CallOptions::default()).unwrap(),
        5,
        100_000,
    );
    drop(client);
    server.shutdown();
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}
