//! What a hostile client does to a server and to a well-behaved client of the same worker: each
//! attack of issue 27 is driven against a real server (one worker, `sim`) by a peer that speaks
//! the wire protocol by hand (`tests/rpc_support`'s `RawPeer` and `RawClient`), while a `Client`
//! measures 32 B round trips. Prints, per attack, what happened to the attacker, the good
//! client's p50 and p99 with and without the attack, and the process's RSS (the server's
//! registered memory is resident from registration on, on `sim` as on hardware).
//!
//! ```text
//! cargo run --release -p rpc-core --example attack_measure [-- CALLS [ATTACK...]]
//! ```
//!
//! CALLS: good-client calls per measurement (default 20000). ATTACK: any of `big-ring`,
//! `tiny-ring`, `ping-flood`, `ring-return-flood`, `idle-sessions`, `handshake-flood` (default: all). A benchmark, not a test: it asserts
//! nothing; the tests of each defence are the `hostile_*` test files.

#[path = "../tests/rpc_support/mod.rs"]
#[allow(unused_imports, missing_docs)]
mod rpc_support;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::wire::{read_frame, write_frame, Frame, Header, Kind, HEADER_LEN};
use rpc_core::{Client, ClientConfig, PollingPolicy};
use rpc_support::{EchoMsg, RawClient, RawPeer, ECHO};

/// The good client's and the server's polling: spin long before yielding (three threads share
/// two cores while an attacker runs).
const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 20_000 };

fn main() {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let picked: Vec<String> = args.collect();
    let all =
        ["big-ring", "tiny-ring", "ping-flood", "ring-return-flood", "idle-sessions", "handshake-flood"];
    let attacks: Vec<&str> = if picked.is_empty() {
        all.to_vec()
    } else {
        all.iter().copied().filter(|a| picked.iter().any(|p| p == a)).collect()
    };
    println!(
        "{:<17} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}  attacker",
        "attack", "p50 us", "p99 us", "base p50", "base p99", "RSS MiB", "HWM MiB"
    );
    for attack in attacks {
        run(attack, calls);
    }
}

/// One attack against a fresh server: the good client's latency without it, then with it.
fn run(attack: &str, calls: usize) {
    let (server, _stash) = rpc_support::spawn(
        rpc_support::server().polling(POLLING).max_sessions(16).peer_timeout(Some(Duration::from_secs(6))),
    );
    let addr = server.local_addr();
    let config = rpc_support::client_config().polling(POLLING);
    let base = good_client(addr, &config, calls).expect("the good client connects before any attack");
    let stop = Arc::new(AtomicBool::new(false));
    let (fate, during) = match attack {
        "big-ring" => big_ring(addr, &config, calls),
        "tiny-ring" => with_thread(&stop, tiny_ring(addr, stop.clone()), addr, &config, calls),
        "ping-flood" => with_thread(&stop, ping_flood(addr, stop.clone()), addr, &config, calls),
        "ring-return-flood" => {
            with_thread(&stop, ring_return_flood(addr, stop.clone()), addr, &config, calls)
        }
        "idle-sessions" => idle_sessions(addr, &config, calls),
        "handshake-flood" => with_thread(&stop, handshake_flood(addr, stop.clone()), addr, &config, calls),
        _ => unreachable!("attacks are filtered"),
    };
    let c = server.counters();
    let fate = format!(
        "{fate} [server: metered {}, idle_closed {}, malformed {}, registered peak {} MiB]",
        c.metered,
        c.idle_closed,
        c.malformed,
        c.registered_peak >> 20
    );
    let (rss, hwm) = memory_mib();
    let (p50, p99) = during.map_or(("-".into(), "-".into()), |d| (us(d.0), us(d.1)));
    println!(
        "{attack:<17} {p50:>9} {p99:>9} {:>9} {:>9} {rss:>10} {hwm:>10}  {fate}",
        us(base.0),
        us(base.1)
    );
    server.shutdown();
}

/// Runs the attacker thread `attacker` while the good client measures; stops it after.
fn with_thread(
    stop: &AtomicBool,
    attacker: std::thread::JoinHandle<String>,
    addr: SocketAddr,
    config: &ClientConfig,
    calls: usize,
) -> (String, Option<(f64, f64)>) {
    // Let the attack take hold first.
    std::thread::sleep(Duration::from_millis(300));
    let during = good_client(addr, config, calls);
    stop.store(true, Ordering::Release);
    let fate = attacker.join().unwrap_or_else(|_| "attacker panicked".into());
    (fate, during.ok())
}

/// `calls` sequential 32 B echo calls of a fresh `Client`: (p50, p99) in ns, or why it failed.
fn good_client(addr: SocketAddr, config: &ClientConfig, calls: usize) -> Result<(f64, f64), String> {
    let client = Client::connect_with(addr, config).map_err(|s| s.to_string())?;
    let req = rpc_support::request(1, 32, 32);
    let mut ns = Vec::with_capacity(calls);
    for _ in 0..calls.min(1000) {
        let _: EchoMsg = client.unary(ECHO, &req, &Default::default()).map_err(|s| s.to_string())?;
    }
    for _ in 0..calls {
        let t = Instant::now();
        let _: EchoMsg = client.unary(ECHO, &req, &Default::default()).map_err(|s| s.to_string())?;
        ns.push(t.elapsed().as_nanos() as f64);
    }
    ns.sort_by(f64::total_cmp);
    Ok((ns[ns.len() / 2], ns[ns.len() * 99 / 100]))
}

/// Two handshakes that each claim a 1 GiB receive ring (the raw peer registers 64 KiB): a server
/// that sizes its send mirror and staging from the claim registers about 2 GiB per session.
fn big_ring(addr: SocketAddr, config: &ClientConfig, calls: usize) -> (String, Option<(f64, f64)>) {
    let mut held = Vec::new();
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let peer = RawPeer::new(64, 16, HEADER_LEN + 4096, 64 << 10, 1);
        let mut hello = peer.handshake(4, 4096, 1 << 20, 0);
        hello.ring_len = 1 << 30;
        outcomes
            .push(handshake(addr, &hello).map_or_else(|e| format!("refused: {e}"), |_| "accepted".into()));
        held.push(peer);
    }
    let during = good_client(addr, config, calls).ok();
    (outcomes.join("; "), during)
}

/// Sends a handshake, returns the server's reply (or its refusal's text).
fn handshake(
    addr: SocketAddr,
    hello: &rpc_core::wire::Handshake,
) -> Result<(TcpStream, rpc_core::wire::Handshake), String> {
    let mut tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    write_frame(&mut tcp, &Frame::Handshake(hello.clone())).map_err(|e| e.to_string())?;
    match read_frame(&mut tcp).map_err(|e| e.to_string())? {
        Frame::Handshake(reply) => Ok((tcp, reply)),
        Frame::Refusal(r) => Err(format!("{:?}: {}", r.code, r.message)),
    }
}

/// A session claiming a 1-byte ring that keeps asking for 64 KiB answers and returns ring space
/// as each piece lands: a server that accepts the ring sends each answer as 65,536 one-byte
/// RDMA WRITEs from the worker the good client shares.
fn tiny_ring(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let peer = RawPeer::new(256, 64, HEADER_LEN + 4096, 64 << 10, 1);
        let mut hello = peer.handshake(4, 4096, 1 << 20, 0);
        hello.ring_len = 1;
        let (tcp, reply) = match handshake(addr, &hello) {
            Ok(r) => r,
            Err(e) => return format!("refused: {e}"),
        };
        peer.connect(&Default::default(), &reply);
        let mut raw = RawClient::over(peer, &reply, reply.session, tcp);
        let req = rpc_support::request(7, 0, 64 << 10);
        let body = prost::Message::encode_to_vec(&req);
        let (mut freed, mut pieces, mut slot) = (0u32, 0u64, 0u16);
        let mut in_flight = 0;
        while !stop.load(Ordering::Acquire) && !raw.dead {
            if in_flight < 2 {
                let h = Header {
                    slot,
                    generation: 0,
                    method: ECHO,
                    body_len: body.len() as u32,
                    total_len: body.len() as u32,
                    ..Header::new(Kind::Request)
                };
                raw.send(h, &body);
                slot = (slot + 1) % 4;
                in_flight += 1;
            }
            while let Some((h, _)) = raw.poll() {
                if h.in_ring {
                    freed = freed.wrapping_add(h.body_len);
                    pieces += 1;
                    raw.send(Header { freed_head: freed, ..Header::new(Kind::RingReturn) }, &[]);
                }
                if h.kind == Kind::Response && (!h.in_ring || h.body_len + h.ring_offset >= h.total_len) {
                    in_flight -= 1;
                }
            }
        }
        format!("connected; {pieces} ring pieces received{}", if raw.dead { ", then closed" } else { "" })
    })
}

/// A session that SENDs Pings as fast as its send buffers come back, never waiting for Pongs:
/// each takes a receive WQE of the worker's shared SRQ.
fn ping_flood(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut raw = RawClient::connect(addr);
        let mut sent = 0u64;
        let ping = Header { session: raw.session, ..Header::new(Kind::Ping) };
        while !stop.load(Ordering::Acquire) && !raw.dead {
            if try_send(&mut raw, ping) {
                sent += 1;
            }
            let _ = raw.try_poll();
        }
        format!(
            "{sent} Pings sent{}",
            if raw.dead { "; session closed by the server" } else { "; still open" }
        )
    })
}

/// A session that makes 2,000 calls whose 5,000-byte answers land in its ring (each freed by
/// the head the next request carries, never by a RingReturn), keeps the last answer unfreed, and
/// then SENDs RingReturns that move the freed head one byte at a time, as fast as its send
/// buffers come back: each frees ring space, none a whole body, and each takes a receive WQE of
/// the worker's shared SRQ.
fn ring_return_flood(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut raw = RawClient::connect(addr);
        let mut ring = rpc_core::session::RingConsumer::new(1 << 16, 64);
        let calls = 2000u32;
        for seq in 1..=calls {
            if let Err(e) = raw.ring_echo(&mut ring, seq, 5000, seq < calls) {
                return e;
            }
        }
        let head = ring.take_freed();
        let mut sent = 0u32;
        while !stop.load(Ordering::Acquire) && !raw.dead && sent < 4999 {
            let h = Header {
                session: raw.session,
                freed_head: head.wrapping_add(sent + 1),
                ..Header::new(Kind::RingReturn)
            };
            if try_send(&mut raw, h) {
                sent += 1;
            }
            let _ = raw.try_poll();
        }
        while !stop.load(Ordering::Acquire) && !raw.dead {
            let _ = raw.try_poll();
            std::thread::yield_now();
        }
        format!(
            "{calls} ring answers, then {sent} byte-sized RingReturns sent{}",
            if raw.dead { "; session closed by the server" } else { "; still open" }
        )
    })
}

/// SENDs `h` alone when a send buffer is free (never waits: a flood whose SENDs meet RNR keeps
/// trying).
fn try_send(raw: &mut RawClient, h: Header) -> bool {
    let Some(mut b) = raw.pool.acquire_for(&mut raw.sq) else { return false };
    if h.encode_into(raw.pool.buf_mut(&mut b)).is_err() {
        raw.pool.give_back(b);
        return false;
    }
    raw.sq.send(&mut raw.pool, b, HEADER_LEN as u32, false);
    raw.sq.flush(&raw.peer.qp, &mut raw.pool, 1).is_ok()
}

/// `max_sessions` (16) raw sessions that complete the handshake and then say nothing: how long
/// until a new client can connect (at most 90 s tried: the default `idle_timeout` is 60 s), then
/// its latency.
fn idle_sessions(addr: SocketAddr, config: &ClientConfig, calls: usize) -> (String, Option<(f64, f64)>) {
    let idle: Vec<RawClient> = (0..16).map(|_| RawClient::connect(addr)).collect();
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(90) {
        match Client::connect_with(addr, config) {
            Ok(_) => {
                let waited = start.elapsed();
                let during = good_client(addr, config, calls).ok();
                drop(idle);
                return (format!("16 idle sessions; a new client connected after {waited:.1?}"), during);
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(idle);
    (format!("16 idle sessions; no new client for 90 s ({last})"), None)
}

/// Connections to the control port, a 1 ms sleep after every second one (the rate is printed), in
/// turn: closed at once, sent 64
/// garbage bytes, left half-open after the first 4 bytes of a handshake frame (up to 1,000 held
/// at once, the oldest closed), and a whole handshake of another protocol version (refused).
fn handshake_flood(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<String> {
    use std::io::Write;
    std::thread::spawn(move || {
        let peer = RawPeer::new(64, 16, HEADER_LEN + 4096, 64 << 10, 1);
        let mut stale = peer.handshake(4, 4096, 1 << 20, 0);
        stale.version = stale.version.wrapping_add(1);
        let (mut connects, mut failed, mut refused) = (0u64, 0u64, 0u64);
        let mut half_open = std::collections::VecDeque::new();
        let mut i = 0u64;
        let start = Instant::now();
        while !stop.load(Ordering::Acquire) {
            i += 1;
            let Ok(mut tcp) = TcpStream::connect(addr) else {
                failed += 1;
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            connects += 1;
            match i % 4 {
                0 => drop(tcp),
                1 => drop(tcp.write_all(&[0xa5; 64])),
                2 => {
                    let _ = tcp.write_all(&rpc_core::wire::HANDSHAKE_MAGIC.to_le_bytes());
                    half_open.push_back(tcp);
                    if half_open.len() > 1000 {
                        half_open.pop_front();
                    }
                }
                _ => {
                    let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
                    if write_frame(&mut tcp, &Frame::Handshake(stale.clone())).is_ok()
                        && matches!(read_frame(&mut tcp), Ok(Frame::Refusal(_)))
                    {
                        refused += 1;
                    }
                }
            }
            if i % 2 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        format!(
            "{connects} connects, {:.0}/s ({refused} handshakes of another version refused, {} half-open held at \
             the end, {failed} connects failed)",
            connects as f64 / start.elapsed().as_secs_f64(),
            half_open.len()
        )
    })
}

/// Resident and peak resident memory of this process, in MiB.
fn memory_mib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn us(ns: f64) -> String {
    format!("{:.2}", ns / 1000.0)
}
