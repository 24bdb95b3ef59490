//! Reconnect (issue 11, part 5): a `Client` whose session broke ends its calls UNAVAILABLE
//! (never re-sending them) and reconnects on a later call, with exponential backoff: calls made
//! before the next attempt is due fail at once, naming when it is, without connecting.
//!
//! The server runs in a child process (this test binary re-executed to run only the ignored
//! `server_process` entry, as `sim_two_process_rpc` does) so that it can be killed with SIGKILL
//! and restarted on the same address.

mod rpc_support;

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

const ENV: &str = "RPC_RECONNECT_SERVER_ADDR";

/// The child's entry point (run by the tests below, never on its own): serves on the address in
/// `RPC_RECONNECT_SERVER_ADDR`, prints it, and answers each `count` line on stdin with
/// `COUNT <answered rpcs> <stashed calls>`, until stdin closes (or it is killed).
#[test]
#[ignore = "the server side of the reconnect tests; they run it in a child process"]
fn server_process() {
    let Ok(addr) = std::env::var(ENV) else { return };
    let (server, stash) = spawn_at(server(), &addr);
    println!("\nSERVER {}", server.local_addr());
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        if line.trim() == "count" {
            println!("COUNT {} {}", server.counters().rpcs, stash.lock().unwrap().len());
        }
        line.clear();
    }
    stash.lock().unwrap().clear();
    server.shutdown();
}

fn spawn_at(
    builder: rpc_core::ServerBuilder,
    addr: &str,
) -> (rpc_core::ServerHandle, std::sync::Arc<std::sync::Mutex<Vec<Responder<EchoMsg>>>>) {
    let svc = TestService::default();
    let stash = svc.stash.clone();
    (builder.add_service(svc).spawn(addr).expect("server starts"), stash)
}

struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl ServerProcess {
    fn start(addr: &str) -> ServerProcess {
        let exe = std::env::current_exe().expect("current_exe");
        let mut child = Command::new(exe)
            .args(["--ignored", "--exact", "server_process", "--nocapture", "--test-threads=1"])
            .env(ENV, addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the server process");
        let stdin = child.stdin.take().expect("stdin");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let addr = loop {
            let line = read_line(&mut out);
            if let Some(a) = line.trim().strip_prefix("SERVER ") {
                break a.parse().expect("server address");
            }
        };
        ServerProcess { child, addr, stdin, out }
    }

    /// (answered RPCs, stashed calls) of the child's server.
    fn count(&mut self) -> (u64, usize) {
        writeln!(self.stdin, "count").expect("writing to the server process");
        loop {
            let line = read_line(&mut self.out);
            if let Some(rest) = line.trim().strip_prefix("COUNT ") {
                let mut f = rest.split(' ');
                return (f.next().unwrap().parse().unwrap(), f.next().unwrap().parse().unwrap());
            }
        }
    }

    /// [`ServerProcess::count`] once the server has published at least `rpcs` answered RPCs
    /// (counters are published now and then), and a little later.
    fn count_settled(&mut self, rpcs: u64) -> (u64, usize) {
        wait_until(
            &format!("the server process to publish {rpcs} answered RPCs"),
            WAIT,
            || self.count().0 >= rpcs,
            String::new,
        );
        std::thread::sleep(Duration::from_millis(100));
        self.count()
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait");
    }
}

fn read_line(out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    assert!(out.read_line(&mut line).expect("reading the server's stdout") > 0, "server exited");
    line
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn killed_server_ends_the_call_unavailable_then_the_same_client_reconnects_to_its_restart() {
    const BACKOFF: Duration = Duration::from_millis(300);
    let mut first = ServerProcess::start("127.0.0.1:0");
    let addr = first.addr;
    let cfg =
        client_config().reconnect_initial_backoff(BACKOFF).reconnect_multiplier(2.0).reconnect_jitter(0.0);
    let client = Client::connect_with(addr, &cfg).unwrap();
    check_reply(&client.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);

    // Mid-call: the server holds the request, then its process is killed.
    let mut call = client.unary_async::<_, EchoMsg>(STASH, &request(2, 8, 0), &CallOptions::default());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // And one more, left unpolled until after the reconnect.
    let mut stale = client.unary_async::<_, EchoMsg>(STASH, &request(3, 8, 0), &CallOptions::default());
    let seen = std::cell::Cell::new((0, 0));
    wait_until(
        "the server process to hold both STASH calls",
        WAIT,
        || {
            assert!(std::pin::Pin::new(&mut call).poll(&mut cx).is_pending());
            assert!(std::pin::Pin::new(&mut stale).poll(&mut cx).is_pending());
            seen.set(first.count());
            seen.get().1 >= 2
        },
        || format!("(answered, stashed) {:?}; client {:?}", seen.get(), client.counters()),
    );
    first.kill();
    let killed = Instant::now();
    let err = block_on(call).unwrap_err();
    let noticed = killed.elapsed();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    // Noticed by the control connection's end (the kernel closes a killed process's sockets),
    // not by the peer timeout (`ClientConfig::peer_timeout`: "no message from the server for
    // ..."), whatever the machine's load: what ended the call, not how long it took.
    assert!(
        err.message().contains("the server closed the connection")
            || err.message().contains("the control connection failed"),
        "the call did not end by the control connection's end: {err}"
    );
    eprintln!("the call in flight ended UNAVAILABLE {noticed:?} after the kill: {err}");
    assert_eq!(client.reconnect_attempts(), 0, "nothing reconnects until a later call");

    // The next call tries at once, finds nobody, and sets the backoff.
    let err = client.unary::<_, EchoMsg>(ECHO, &request(3, 8, 8), &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("reconnect attempt 1 failed"), "{err}");
    assert_eq!(client.reconnect_attempts(), 1);
    // Calls during the backoff fail at once, naming the time left, without connecting.
    for i in 0..50u64 {
        let err = if i % 2 == 0 {
            client.unary::<_, EchoMsg>(ECHO, &request(i, 8, 8), &CallOptions::default()).unwrap_err()
        } else {
            block_on(client.unary_async::<_, EchoMsg>(ECHO, &request(i, 8, 8), &CallOptions::default()))
                .unwrap_err()
        };
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        let ms = next_attempt_ms(&err);
        assert!(ms <= BACKOFF.as_millis() as u64, "{err}");
    }
    assert_eq!(client.reconnect_attempts(), 1, "no connect attempt during the backoff");

    // The server comes back on the same address; the same client value reconnects.
    let mut second = ServerProcess::start(&addr.to_string());
    assert_eq!(second.addr, addr);
    let give_up = Instant::now() + WAIT;
    let r = loop {
        match client.unary::<_, EchoMsg>(ECHO, &request(10, 8, 8), &CallOptions::default()) {
            Ok(r) => break r,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e}");
                assert!(Instant::now() < give_up, "never reconnected: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    check_reply(&r, 10, 8);
    // A call of the broken session, polled only now, ends UNAVAILABLE: it cannot be mistaken
    // for a call of the new session in the same slot.
    let busy = client.unary_async::<_, EchoMsg>(ECHO, &request(40, 8, 8), &CallOptions::default());
    let give_up = Instant::now() + WAIT;
    let err = loop {
        if let std::task::Poll::Ready(r) = std::pin::Pin::new(&mut stale).poll(&mut cx) {
            break r.unwrap_err();
        }
        assert!(Instant::now() < give_up, "a call of the broken session never ended");
    };
    drop(stale);
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("ended"), "{err}");
    check_reply(&block_on(busy).unwrap(), 40, 8);
    // Attempts were spaced by the backoff (300 ms, then 600 ms, ...), not one per call.
    assert!(client.reconnect_attempts() <= 4, "{} attempts", client.reconnect_attempts());
    assert!(client.closed_reason().is_none());
    assert_eq!(client.counters().sessions_opened, 2);
    for i in 11..20u64 {
        check_reply(&client.unary(ECHO, &request(i, 100, 100), &CallOptions::default()).unwrap(), i, 100);
    }
    // A new client connects to the restart too.
    let other = Client::connect_with(addr, &client_config()).unwrap();
    check_reply(&other.unary(ECHO, &request(30, 8, 8), &CallOptions::default()).unwrap(), 30, 8);
    // Nothing was re-sent: the restarted server answered exactly the 12 calls made to it and
    // holds no stashed call (those in flight at the kill).
    assert_eq!(second.count_settled(12), (12, 0));
    drop(other);
    drop(client);
}

#[test]
fn calls_waiting_for_a_slot_when_the_session_breaks_end_unavailable_never_sent() {
    let mut s = ServerProcess::start("127.0.0.1:0");
    let client = Client::connect_with(s.addr, &client_config().window(2)).unwrap();
    let held: Vec<_> = (0..2)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &CallOptions::default()))
        .collect();
    let waiting: Vec<_> = (2..6)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 8, 8), &CallOptions::default()))
        .collect();
    assert_eq!(client.queued_calls(), 4);
    wait_until(
        "the server process to hold both STASH calls",
        WAIT,
        || {
            client.progress();
            s.count().1 >= 2
        },
        || format!("client {:?}", client.counters()),
    );
    s.kill();
    for f in held.into_iter().chain(waiting) {
        let err = block_on(f).unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    }
    assert_eq!(client.queued_calls(), 0);
}

/// Starting an async call on a broken session never blocks, and neither does polling it, even
/// when the reconnect attempt will take its whole `connect_timeout` (a listener that accepts
/// and never answers the handshake stands where the server was): the call waits, encoded; its
/// first poll starts the attempt on a thread of its own and returns `Pending` (the attempt
/// cannot have ended: only `connect_timeout` ends it); the future ends UNAVAILABLE when the
/// attempt does. Before, the first poll ran the attempt itself and returned its failure after
/// 1.5 s (and before that, `unary_async` did).
#[test]
fn neither_starting_nor_polling_an_async_call_waits_for_the_reconnect() {
    let (server, _stash) = spawn(server());
    let addr = server.local_addr();
    let client =
        Client::connect_with(addr, &client_config().connect_timeout(Duration::from_millis(1500))).unwrap();
    check_reply(&client.unary(ECHO, &request(1, 8, 8), &CallOptions::default()).unwrap(), 1, 8);
    server.shutdown();
    wait_until_closed(&client);
    // Accepts TCP connections and never answers a handshake.
    let mute = std::net::TcpListener::bind(addr).expect("the server's address is free again");
    let mut fut =
        Box::pin(client.unary_async::<_, EchoMsg>(ECHO, &request(2, 8, 8), &CallOptions::default()));
    assert_eq!(client.reconnect_attempts(), 0, "no attempt before the future is polled");
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    assert!(fut.as_mut().poll(&mut cx).is_pending(), "the first poll returns while the attempt runs");
    assert_eq!(client.reconnect_attempts(), 1, "the first poll started the attempt");
    assert!(fut.as_mut().poll(&mut cx).is_pending(), "so does the next");
    let err = block_on(fut).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("connect_timeout"), "{err}");
    assert_eq!(client.reconnect_attempts(), 1);
    drop(mute);
    // A server where it was: an async call reconnects on its thread and is answered.
    let again =
        rpc_support::server().add_service(TestService::default()).spawn(addr).expect("the address is free");
    let give_up = Instant::now() + WAIT;
    let reply = loop {
        match block_on(client.unary_async::<_, EchoMsg>(ECHO, &request(3, 8, 8), &CallOptions::default())) {
            Ok(r) => break r,
            // The backoff's delay after the failed attempt.
            Err(e) if e.code() == Code::Unavailable && Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("{e}"),
        }
    };
    check_reply(&reply, 3, 8);
    assert_eq!(client.reconnect_attempts(), 2, "one more attempt, which succeeded");
    again.shutdown();
}
