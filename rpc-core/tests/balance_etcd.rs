//! etcd discovery against a real etcd (issue 28 item 3): three servers register under a prefix
//! with a lease, a balanced channel resolves the prefix and watches it; one server is killed
//! (its `ServerHandle` dropped and its lease keeper stopped without revoking, as a dead process
//! leaves it), its key goes when the lease expires and traffic moves to the other two; it comes
//! back and takes traffic again.
//!
//! The test starts its own etcd (Debian's `etcd-server`: `/usr/bin/etcd`, or `RPC_ETCD_BIN`) on
//! loopback ports with a temporary data directory. Without the binary it is skipped with a
//! message, unless `RPC_REQUIRE_ETCD=1` (what `.ci/run` sets, after installing it): then it fails.

#[path = "rpc_support/mod.rs"]
mod rpc_support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rpc_core::balance::etcd::{EtcdResolver, Registration};
use rpc_core::balance::{BalanceConfig, Policy, ServerState};
use rpc_core::{CallOptions, Channel, ChannelConfig, Code, PollingPolicy, ServerHandle};
use rpc_support::*;

const PREFIX: &str = "/rpc-test/echo/";
const TTL: Duration = Duration::from_secs(2);

struct Etcd {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn etcd_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("RPC_ETCD_BIN") {
        return Some(PathBuf::from(p));
    }
    ["/usr/bin/etcd", "/usr/local/bin/etcd"].iter().map(PathBuf::from).find(|p| p.exists())
}

/// Starts etcd on loopback, or `None` (skip) when it is not installed.
fn start_etcd() -> Option<Etcd> {
    let Some(bin) = etcd_binary() else {
        assert!(
            std::env::var("RPC_REQUIRE_ETCD").as_deref() != Ok("1"),
            "RPC_REQUIRE_ETCD=1 but no etcd binary (apt-get install etcd-server, or set RPC_ETCD_BIN)"
        );
        eprintln!("SKIPPED: no etcd binary (apt-get install etcd-server, or set RPC_ETCD_BIN)");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("rpc-etcd-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (client, peer) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let child = Command::new(&bin)
        .args(["--name", "rpc-test", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("rpc-test={peer_url}")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let etcd = Etcd { child, dir, url };
    // Ready when a read of the prefix answers.
    let until = Instant::now() + WAIT;
    while let Err(e) = EtcdResolver::new(&etcd.url, PREFIX) {
        assert!(
            Instant::now() < until,
            "etcd did not come up at {}: {e} (log: {})",
            etcd.url,
            etcd.dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(etcd)
}

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

fn eventually(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

fn echo(ch: &Channel, seq: u64) -> Result<EchoMsg, rpc_core::Status> {
    block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 8, 8), &CallOptions::default()))
}

fn picks(ch: &Channel, a: SocketAddr) -> Option<u64> {
    ch.balancer().unwrap().servers().iter().find(|s| s.addr == a).map(|s| s.picks)
}

#[test]
fn three_servers_register_one_dies_traffic_moves_to_the_two_others_and_returns() {
    let Some(etcd) = start_etcd() else { return };
    let mut servers: Vec<ServerHandle> = (0..3).map(|_| spawn(server()).0).collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.local_addr()).collect();
    let mut regs: Vec<Option<Registration>> =
        addrs.iter().map(|a| Some(Registration::new(&etcd.url, PREFIX, *a, TTL).unwrap())).collect();
    let config = BalanceConfig::default()
        .policy(Policy::RoundRobin)
        .channel(
            ChannelConfig::default()
                .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
                .spins(500)
                .thread_name("bal-etcd"),
        )
        .retry_initial(Duration::from_millis(50))
        .retry_max(Duration::from_millis(400));
    let ch = Channel::balanced(EtcdResolver::new(&etcd.url, PREFIX).unwrap(), &config).unwrap();
    let b = ch.balancer().unwrap().clone();
    let mut known: Vec<SocketAddr> = b.servers().iter().map(|s| s.addr).collect();
    known.sort();
    let mut want = addrs.clone();
    want.sort();
    assert_eq!(known, want, "the resolver's first set");
    // The first call connects them all (it waits on one still connecting).
    echo(&ch, 0).unwrap();
    eventually("every server up", || b.servers().iter().all(|s| s.state == ServerState::Up));
    for seq in 0..30 {
        echo(&ch, seq).unwrap();
    }
    assert!(addrs.iter().all(|a| picks(&ch, *a).unwrap() > 0), "{:?}", b.servers());

    // Kill server 1: its handle dropped, its lease keeper stopped without revoking.
    let victim = addrs[1];
    drop(servers.remove(1));
    regs[1].take().unwrap().abandon();
    let mut seq = 100;
    let mut failed = 0;
    let gone = eventually("the dead server's key to expire from the resolver's set", || {
        seq += 1;
        if let Err(e) = echo(&ch, seq) {
            assert_eq!(e.code(), Code::Unavailable, "a call during the failover: {e}");
            failed += 1;
        }
        picks(&ch, victim).is_none()
    });
    eprintln!("the dead server left the set after {gone:?} (lease TTL {TTL:?}); {failed} calls ended UNAVAILABLE meanwhile");
    for seq in 1000..1060 {
        echo(&ch, seq).unwrap_or_else(|e| panic!("call {seq} after the failover: {e}"));
    }
    let others: Vec<u64> = [addrs[0], addrs[2]].iter().map(|a| picks(&ch, *a).unwrap()).collect();
    assert!(others.iter().all(|&p| p >= 30), "the two others share the calls: {others:?}");

    // It comes back: registered again on the same address, it is picked again.
    let back = spawn_at(victim);
    let reg = Registration::new(&etcd.url, PREFIX, victim, TTL).unwrap();
    eventually("the server back in the set and up", || {
        b.servers().iter().any(|s| s.addr == victim && s.state == ServerState::Up) || {
            let _ = echo(&ch, 5000);
            false
        }
    });
    let before = picks(&ch, victim).unwrap();
    for seq in 2000..2030 {
        echo(&ch, seq).unwrap();
    }
    assert_eq!(picks(&ch, victim).unwrap() - before, 10, "{:?}", b.servers());
    drop(reg);
    drop(regs);
    drop(back);
}
