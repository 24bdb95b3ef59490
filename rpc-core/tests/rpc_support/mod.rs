//! A test-only service written by hand against the facade (as generated code would be), and
//! helpers shared by the `rpc_*` tests: a hand-built peer ([`RawPeer`]), a session driven by
//! hand over it ([`RawClient`], `raw_client.rs`), a service that holds its worker ([`Hold`],
//! `hold.rs`). Everything runs on `sim` with a yielding polling policy.
#![allow(dead_code)]

mod counting;
pub mod fake_server;
mod hold;
pub mod list_stream;
pub mod prom;
mod raw_client;

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use counting::{live_bytes, Counting};
#[allow(unused_imports)]
pub use hold::{Hold, HoldGate, HOLD};
#[allow(unused_imports)]
pub use raw_client::{RawClient, RnrStalls};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rpc_core::buffers::{RecvPool, RecvRing};
use rpc_core::codegen::*;
use rpc_core::verbs::gid::{select_gid, LocalAddress};
use rpc_core::verbs::rc::{self, Endpoint, RcConfig};
use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::{Context, DeviceSelector, ProtectionDomain, Provider, QpCap, QpInitAttr, QueuePair};
use rpc_core::wire::{Handshake, PROTOCOL_VERSION};
use rpc_core::{ClientConfig, PollingPolicy, Server, ServerBuilder, ServerHandle, Transport};

/// Test messages.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoMsg {
    /// Matches a reply to its request.
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// Bytes carried.
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
    /// FNV-1a 64 of `payload`.
    #[prost(uint64, tag = "3")]
    pub checksum: u64,
    /// Size of the payload the server answers with (its contents derive from `seq`).
    #[prost(uint32, tag = "4")]
    pub reply_len: u32,
}

/// A message whose field 1 has the wrong wire type for `EchoMsg`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WrongShape {
    #[prost(string, tag = "1")]
    pub text: String,
}

pub const SERVICE: &str = "test.Echo";
pub const ECHO: MethodId = method_id("/test.Echo/Echo");
pub const PANIC: MethodId = method_id("/test.Echo/Panic");
pub const DEFER: MethodId = method_id("/test.Echo/Defer");
pub const STASH: MethodId = method_id("/test.Echo/Stash");
pub const DROP_RESPONDER: MethodId = method_id("/test.Echo/DropResponder");
pub const CONTEXT: MethodId = method_id("/test.Echo/Context");
pub const RAW: MethodId = method_id("/test.Echo/Raw");
pub const UNKNOWN: MethodId = method_id("/test.Echo/NoSuchMethod");

/// FNV-1a 64 of `bytes`; 0 for no bytes (so an empty `EchoMsg` encodes to 0 bytes).
pub fn fnv64(bytes: &[u8]) -> u64 {
    if bytes.is_empty() {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Deterministic payload of `len` bytes for `seq`.
pub fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn request(seq: u64, len: usize, reply_len: usize) -> EchoMsg {
    let p = payload(seq, len);
    EchoMsg { seq, checksum: fnv64(&p), payload: p, reply_len: reply_len as u32 }
}

/// How long a test waits for something that must happen before it fails: a hang guard, not a
/// timed assertion (CI runs many test binaries at once on 2 cores, and the Soft-RoCE tier runs in a
/// qemu guest under TCG emulation), so generous.
pub const WAIT: Duration = Duration::from_secs(60);

/// Calls `poll` until it returns `Some`, and returns that; between two calls it yields (the first
/// 10 ms) then sleeps 1 ms. `poll` does the work the wait needs (progressing a client, polling a
/// CQ): it runs at least once.
///
/// # Panics
/// When `poll` still returns `None` after `timeout`: a test failure naming `what` was awaited and
/// the state `state` reports then (the counters of both ends, what was seen), never a hang.
#[track_caller]
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut poll: impl FnMut() -> Option<T>,
    state: impl FnOnce() -> String,
) -> T {
    echo_panics();
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = poll() {
            return v;
        }
        let waited = start.elapsed();
        if waited >= timeout {
            fail(&format!("gave up after {waited:.1?} waiting for {what}: {}", state()));
        }
        if waited < Duration::from_millis(10) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Panics with `message` (see [`echo_panics`]).
#[track_caller]
pub fn fail(message: &str) -> ! {
    echo_panics();
    panic!("{message}");
}

/// Makes every later panic of a test's own threads also write its message straight to stderr
/// (idempotent). libtest shows a test's captured output only once the test ends, and a test that
/// fails while a worker is wedged (the bug under test, or a sabotage) then hangs in the
/// `ServerHandle` drop of its unwinding, which waits for that worker: without this, a failed
/// assertion there would hang silently. Threads named `rpc-*` (the library's workers, where
/// handlers panic on purpose and the panic is caught) are left to the default hook alone.
/// Installed by [`server`], [`client_config`], [`wait_for`] and [`block_on`].
pub fn echo_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            if !name.starts_with("rpc-") {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "[{name}] {info}");
            }
            default(info);
        }));
    });
}

/// [`wait_for`] a condition: calls `done` until it is true.
///
/// # Panics
/// When `done` is still false after `timeout` (see [`wait_for`]).
#[track_caller]
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
    state: impl FnOnce() -> String,
) {
    wait_for(what, timeout, || done().then_some(()), state)
}

/// Progresses `client` until it reports its session closed (the server went away).
///
/// # Panics
/// When the client still reports its session open after [`WAIT`] (a test failure).
#[track_caller]
pub fn wait_until_closed(client: &rpc_core::Client) {
    wait_until(
        "the client to see its server go (its session closed)",
        WAIT,
        || {
            client.progress();
            client.closed_reason().is_some()
        },
        || format!("client {:?}", client.counters()),
    );
}

/// Progresses `client` until `stash` holds `n` responders (that many STASH calls reached their
/// handler, which kept them unanswered).
///
/// # Panics
/// When fewer are there after [`WAIT`], naming `what`, with both ends' counters.
#[track_caller]
pub fn wait_stashed(
    what: &str,
    n: usize,
    stash: &Mutex<Vec<Responder<EchoMsg>>>,
    client: &rpc_core::Client,
    server: &ServerHandle,
) {
    wait_until(
        what,
        WAIT,
        || {
            client.progress();
            stash.lock().unwrap().len() >= n
        },
        || {
            format!(
                "{} stashed; server {:?}, client {:?}",
                stash.lock().unwrap().len(),
                server.counters(),
                client.counters()
            )
        },
    );
}

/// Checks a reply to `request(seq, _, reply_len)`.
pub fn check_reply(r: &EchoMsg, seq: u64, reply_len: usize) {
    assert_eq!(r.seq, seq, "reply matched to its request");
    assert_eq!(r.payload.len(), reply_len);
    assert_eq!(r.checksum, fnv64(&r.payload), "reply contents intact");
    assert_eq!(r.payload, payload(seq ^ 0xffff, reply_len));
}

/// The service. `Stash` defers and keeps the responders here (never answered unless a test does).
#[derive(Default)]
pub struct TestService {
    pub stash: Arc<Mutex<Vec<Responder<EchoMsg>>>>,
}

impl TestService {
    fn echo(&self, req: EchoMsg) -> Reply<EchoMsg> {
        if fnv64(&req.payload) != req.checksum {
            return Status::data_loss(format!("request {} payload checksum mismatch", req.seq)).into();
        }
        let p = payload(req.seq ^ 0xffff, req.reply_len as usize);
        EchoMsg { seq: req.seq, checksum: fnv64(&p), payload: p, reply_len: 0 }.into()
    }
}

impl Service for TestService {
    const NAME: &'static str = SERVICE;
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: ECHO, name: "/test.Echo/Echo" },
        MethodDesc { id: PANIC, name: "/test.Echo/Panic" },
        MethodDesc { id: DEFER, name: "/test.Echo/Defer" },
        MethodDesc { id: STASH, name: "/test.Echo/Stash" },
        MethodDesc { id: DROP_RESPONDER, name: "/test.Echo/DropResponder" },
        MethodDesc { id: CONTEXT, name: "/test.Echo/Context" },
        MethodDesc { id: RAW, name: "/test.Echo/Raw" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        if method == RAW {
            // Any bytes: answers with their length and checksum (the payload back only when short).
            let body = body.as_slice();
            let payload = if body.len() <= 16 { body.to_vec() } else { Vec::new() };
            let m = EchoMsg { seq: body.len() as u64, checksum: fnv64(body), payload, reply_len: 0 };
            return out.reply(Reply::from(m));
        }
        let req = match decode::<EchoMsg>(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        match method {
            ECHO => out.reply(self.echo(req)),
            PANIC => panic!("test handler panics on purpose (seq {})", req.seq),
            DEFER => {
                // Answer from another thread after `reply_len` ms.
                let (responder, reply) = ctx.defer::<EchoMsg>();
                let wait = Duration::from_millis(u64::from(req.reply_len));
                std::thread::spawn(move || {
                    std::thread::sleep(wait);
                    responder.send(Ok(EchoMsg { seq: req.seq, ..Default::default() }));
                });
                out.reply(reply);
            }
            STASH => {
                let (responder, reply) = ctx.defer::<EchoMsg>();
                self.stash.lock().unwrap().push(responder);
                out.reply(reply);
            }
            DROP_RESPONDER => {
                let (responder, reply) = ctx.defer::<EchoMsg>();
                drop(responder);
                out.reply(reply);
            }
            CONTEXT => {
                let text = format!("{}|{}|{}", ctx.method(), ctx.peer().ip(), ctx.deadline().is_some());
                out.reply(Reply::from(EchoMsg {
                    seq: req.seq,
                    payload: text.into_bytes(),
                    ..Default::default()
                }));
            }
            _ => out.error(Status::method_not_served_by(method, SERVICE)),
        }
    }
}

/// What the tests use: spin a little, then yield (tests share two cores).
pub const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 200 };

/// The transport under test: `sim`, or the RDMA NIC when `RPC_TEST_TRANSPORT=rdma` or
/// `RPC_REQUIRE_RDMA=1` (what `scripts/softroce-test` sets in its guest). Device from
/// `RPC_TEST_DEVICE` or `RXE_DEV`, GID index from `RPC_TEST_GID_INDEX` or `RXE_GID_IDX`
/// (default: automatic).
pub fn transport() -> Transport {
    let env = |a: &str, b: &str| std::env::var(a).or_else(|_| std::env::var(b)).ok();
    let rdma = std::env::var("RPC_TEST_TRANSPORT").as_deref() == Ok("rdma")
        || std::env::var("RPC_REQUIRE_RDMA").as_deref() == Ok("1");
    if !rdma {
        return Transport::Sim;
    }
    Transport::Rdma {
        device: env("RPC_TEST_DEVICE", "RXE_DEV").unwrap_or_default(),
        port: 1,
        gid_index: env("RPC_TEST_GID_INDEX", "RXE_GID_IDX").and_then(|v| v.parse().ok()).unwrap_or(-1),
    }
}

/// Timeouts on `rdma`: the Soft-RoCE tier runs in a qemu guest under TCG emulation, where a
/// worker copying a multi-MiB body can be descheduled for seconds; the hardware-sized defaults
/// (`peer_timeout` 6 s, connect 5 s, a body in pieces 10 s: a 64 MiB request took longer than that
/// in the guest on a loaded host) would declare a live peer dead there. `None` on sim.
fn emulated_guest_timeout() -> Option<Duration> {
    matches!(transport(), Transport::Rdma { .. }).then_some(Duration::from_secs(60))
}

/// A server builder with the test polling policy, the transport under test and one worker.
pub fn server() -> ServerBuilder {
    echo_panics();
    let b = Server::builder().transport(transport()).polling(POLLING).drain_timeout(Duration::from_secs(2));
    match emulated_guest_timeout() {
        Some(t) => b.peer_timeout(Some(t)).handshake_timeout(t).reassembly_timeout(t),
        None => b,
    }
}

/// Starts `builder` with a fresh `TestService` on an ephemeral port.
pub fn spawn(builder: ServerBuilder) -> (ServerHandle, Arc<Mutex<Vec<Responder<EchoMsg>>>>) {
    let svc = TestService::default();
    let stash = svc.stash.clone();
    let h = builder.add_service(svc).spawn("127.0.0.1:0").expect("server starts");
    (h, stash)
}

/// A client config with the test polling policy.
pub fn client_config() -> ClientConfig {
    echo_panics();
    let c = ClientConfig::default().polling(POLLING).transport(transport());
    match emulated_guest_timeout() {
        // The client's own timeout for an answer in pieces too: `rpc_bulk`'s window of bodies
        // beyond the ring failed once in the guest at load 5-6 ("an answer arriving in pieces
        // did not finish within 12006 ms"), passing alone.
        Some(t) => c.peer_timeout(Some(t)).connect_timeout(t).reassembly_timeout(t),
        None => c,
    }
}

/// Drives a future to completion by polling it in a loop (no executor: polling progresses the
/// session).
///
/// # Panics
/// When the future is still pending after [`WAIT`] (a call with no deadline whose answer never
/// comes: a test failure, not a hang).
#[track_caller]
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    echo_panics();
    let start = std::time::Instant::now();
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        // Each poll progresses the session: yield only (a sleep would slow a call in many pieces).
        std::thread::yield_now();
        let waited = start.elapsed();
        if waited >= WAIT {
            fail(&format!("gave up after {waited:.1?} waiting for a future to be ready (block_on)"));
        }
    }
}

/// A request body of arbitrary bytes (not protobuf): what generated code never sends, used to
/// put exactly N bytes on the wire.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawBytes(pub Vec<u8>);

impl prost::Message for RawBytes {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Send-only: fields are skipped when decoding.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

/// A peer built by hand from the public verbs and buffers modules (a rogue client or a fake
/// server): one device context (`sim` by default; [`RawPeer::open`] takes any provider's), PD,
/// CQ, a `RecvPool` whose SRQ the RC QP uses, and a receive `RecvRing`. Fields drop in
/// declaration order (QP first, context last).
pub struct RawPeer<P: Provider = Sim> {
    pub qp: P::QueuePair,
    pub recv: RecvPool<P>,
    pub ring: RecvRing<P>,
    pub cq: P::CompletionQueue,
    pub pd: P::ProtectionDomain,
    pub ctx: P::Context,
    /// This side's connection parameters (port 1 and its GID).
    pub local: Endpoint,
    /// Port 1's address: GID index and link layer, for the QP's path.
    pub addr: LocalAddress,
}

impl RawPeer<Sim> {
    /// A CQ of `cq_depth` WCs, `recv_count` receive buffers of `recv_size` bytes, a receive ring
    /// of `ring_len` bytes, and `psn` as the first PSN this side sends; on a new `sim` device
    /// (GID index 0).
    pub fn new(cq_depth: u32, recv_count: u32, recv_size: usize, ring_len: usize, psn: u32) -> RawPeer {
        RawPeer::open(
            Sim::open(&DeviceSelector::First).unwrap(),
            0,
            cq_depth,
            recv_count,
            recv_size,
            ring_len,
            psn,
        )
    }
}

/// [`RawPeer::new`] on the RDMA device the tests use ([`transport`]'s device and GID index;
/// `RPC_REQUIRE_RDMA=1` in the Soft-RoCE tier).
///
/// # Panics
/// When the transport under test is not `rdma` or the device does not open (a test failure).
#[cfg(feature = "ibverbs")]
pub fn rdma_raw_peer(
    cq_depth: u32,
    recv_count: u32,
    recv_size: usize,
    ring_len: usize,
    psn: u32,
) -> RawPeer<rpc_core::verbs::ibverbs::Ibverbs> {
    let Transport::Rdma { device, gid_index, .. } = transport() else {
        panic!("the transport under test is sim")
    };
    let sel = if device.is_empty() { DeviceSelector::First } else { DeviceSelector::Name(device) };
    let ctx = <rpc_core::verbs::ibverbs::Ibverbs as Provider>::open(&sel).unwrap();
    RawPeer::open(ctx, gid_index, cq_depth, recv_count, recv_size, ring_len, psn)
}

impl<P: Provider> RawPeer<P> {
    /// [`RawPeer::new`] on an open device `ctx`, port 1, GID index `gid_index` (-1: chosen as
    /// the runtime chooses, RoCEv2 first).
    pub fn open(
        ctx: P::Context,
        gid_index: i32,
        cq_depth: u32,
        recv_count: u32,
        recv_size: usize,
        ring_len: usize,
        psn: u32,
    ) -> RawPeer<P> {
        let addr = select_gid::<P>(&ctx, 1, gid_index).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(cq_depth, false).unwrap();
        let recv = RecvPool::<P>::new(&pd, recv_count, recv_size).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                srq: Some(recv.srq()),
                cap: QpCap::default(),
                sq_sig_all: false,
            })
            .unwrap();
        let ring = RecvRing::<P>::new(&pd, ring_len).unwrap();
        let local = addr.endpoint(qp.qp_num(), psn);
        RawPeer { qp, recv, ring, cq, pd, ctx, local, addr }
    }

    /// This side's handshake (no auth token) with the given window and session.
    pub fn handshake(&self, credits: u16, eager_threshold: u32, max_message: u32, session: u32) -> Handshake {
        let (ring_addr, ring_len, ring_rkey) = self.ring.remote();
        Handshake {
            version: PROTOCOL_VERSION,
            flags: 0,
            qp_num: self.local.qp_num,
            psn: self.local.psn,
            lid: self.local.lid,
            mtu: self.local.mtu,
            gid: self.local.gid,
            ring_addr,
            ring_len,
            ring_rkey,
            credits,
            eager_threshold,
            max_message,
            session,
            auth_token: Vec::new(),
        }
    }

    /// Connects the QP to the peer that sent `remote`, with `cfg`'s timers and retries (its port,
    /// GID index and link layer are this peer's).
    pub fn connect(&self, cfg: &RcConfig, remote: &Handshake) {
        let a = &self.addr;
        let cfg =
            &RcConfig { port_num: a.port_num, gid_index: a.gid_index, link_layer: a.link_layer, ..*cfg };
        let remote = Endpoint {
            qp_num: remote.qp_num,
            psn: remote.psn,
            lid: remote.lid,
            gid: remote.gid,
            mtu: remote.mtu,
        };
        rc::connect(&self.qp, cfg, &self.local, &remote).unwrap();
    }
}

/// The delay in ms an UNAVAILABLE of a call made during a reconnect backoff names ("... next
/// reconnect attempt in N ms"); panics naming the status when it names none.
pub fn next_attempt_ms(e: &Status) -> u64 {
    e.message()
        .split("next reconnect attempt in ")
        .nth(1)
        .and_then(|r| r.strip_suffix(" ms"))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no retry time in: {e}"))
}

/// Runs the ignored test `entry` of this test binary in a child process whose sim hosts have
/// 1 GiB of memory in all (`RPC_SIM_SEGMENT_BYTES`), so that a large registration fails there;
/// on another transport it prints why it skips and returns.
///
/// # Panics
/// When the child fails, or does not run exactly that one test.
pub fn in_small_sim_segments(entry: &str) {
    if !matches!(transport(), Transport::Sim) {
        eprintln!(
            "skipped: a sim host's memory limit (RPC_SIM_SEGMENT_BYTES) is what fails the registration"
        );
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--ignored", "--exact", entry, "--nocapture", "--test-threads=1"])
        .env("RPC_SIM_SEGMENT_BYTES", (1u64 << 30).to_string())
        .output()
        .expect("the child test runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "child {entry}:\n{text}");
}

/// Sends a hand-made handshake (a fresh raw peer's, `tweak`ed) and returns the server's answer
/// (the TCP connection closes when this returns: an admitted session is closed with it).
pub fn raw_handshake(
    addr: std::net::SocketAddr,
    tweak: impl FnOnce(&mut Handshake),
) -> rpc_core::wire::Frame {
    let peer = RawPeer::new(16, 4, rpc_core::wire::HEADER_LEN + 4096, 1 << 16, 1);
    let mut hello = peer.handshake(4, 4096, 1 << 20, 0);
    tweak(&mut hello);
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    rpc_core::wire::write_frame(&mut tcp, &rpc_core::wire::Frame::Handshake(hello)).unwrap();
    rpc_core::wire::read_frame(&mut tcp).expect("the server answers the handshake")
}

/// A well-behaved client on its own thread: small requests, answers of 20 000 bytes (through its
/// ring), one after the other until stopped, then five more (the server still serves after the
/// attack). Every call must succeed.
pub struct GoodClient {
    stop: Arc<AtomicBool>,
    join: JoinHandle<u64>,
}

impl GoodClient {
    /// Connects (with `token` when given) and starts calling; returns once connected.
    pub fn start(addr: SocketAddr, token: Option<&[u8]>) -> GoodClient {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, connected) = mpsc::channel();
        let flag = stop.clone();
        let cfg = match token {
            Some(t) => client_config().auth_token(t.to_vec()),
            None => client_config(),
        };
        let join = std::thread::spawn(move || {
            let client = Client::connect_with(addr, &cfg).expect("the good client connects");
            ready.send(()).unwrap();
            let mut calls = 0u64;
            let mut after_stop = 0;
            while after_stop < 5 {
                if flag.load(Ordering::Acquire) {
                    after_stop += 1;
                }
                let r = client
                    .unary::<_, EchoMsg>(ECHO, &request(calls, 100, 20_000), &CallOptions::default())
                    .unwrap_or_else(|e| panic!("the good client's call {calls} failed: {e}"));
                check_reply(&r, calls, 20_000);
                calls += 1;
                std::thread::yield_now();
            }
            calls
        });
        connected.recv_timeout(WAIT).expect("the good client connected");
        GoodClient { stop, join }
    }

    /// Stops it; every call succeeded (the thread panics otherwise). Returns how many it made.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        let calls = self.join.join().expect("every call of the good client succeeded");
        assert!(calls >= 5, "{calls} calls");
        calls
    }
}

/// The server's counters once `ok` holds for them (they are published by the workers as they
/// go), waiting up to `within`.
///
/// # Panics
/// When `ok` still fails after `within`, naming `what` and showing the last counters.
#[track_caller]
pub fn counters_when(
    server: &ServerHandle,
    what: &str,
    within: Duration,
    ok: impl Fn(&rpc_core::Counters) -> bool,
) -> rpc_core::Counters {
    wait_until(what, within, || ok(&server.counters()), || format!("{:?}", server.counters()));
    server.counters()
}

/// One ECHO call on `c` with a request of `len` payload bytes asking `reply_len` back; the
/// answer is checked ([`check_reply`]).
///
/// # Panics
/// When the call fails or the answer is not the one asked for.
#[track_caller]
pub fn echo_checked(c: &rpc_core::Client, seq: u64, len: usize, reply_len: usize) {
    let r: EchoMsg = c.unary(ECHO, &request(seq, len, reply_len), &rpc_core::CallOptions::default()).unwrap();
    check_reply(&r, seq, reply_len);
}

/// Echo calls `seqs` (32 B each way, `deadline` each) on `c`, checking each reply: `None` if all
/// were answered, else the first failure as "a neighbour's call SEQ: CODE MESSAGE" (the calls of
/// a session beside one a hostile peer attacks, which must keep getting their answers).
pub fn neighbour_calls(
    c: &rpc_core::Client,
    seqs: std::ops::Range<u64>,
    deadline: std::time::Duration,
) -> Option<String> {
    let opts = rpc_core::CallOptions::deadline(deadline);
    for seq in seqs {
        match c.unary::<EchoMsg, EchoMsg>(ECHO, &request(seq, 32, 32), &opts) {
            Ok(r) => check_reply(&r, seq, 32),
            Err(e) => return Some(format!("a neighbour's call {seq}: {} {}", e.code(), e.message())),
        }
    }
    None
}

/// A good server, a listener for a hostile fake server (the test's thread accepts on it), and a
/// client endpoint on `sim` for sessions to both: `(good server, listener, its address, endpoint)`.
pub fn good_and_hostile() -> (ServerHandle, std::net::TcpListener, std::net::SocketAddr, rpc_core::Endpoint) {
    let (good, _) = spawn(server());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bad_addr = listener.local_addr().unwrap();
    let ep = rpc_core::Endpoint::new(&rpc_core::Transport::Sim).unwrap();
    (good, listener, bad_addr, ep)
}

/// Names (`comm`) of this process's threads (a thread that ends meanwhile is skipped).
pub fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim_end().to_owned())
        .collect()
}

/// Threads of this process named `name` (their `comm`).
pub fn threads_named(name: &str) -> usize {
    thread_names().iter().filter(|n| *n == name).count()
}

/// A `Channel` configuration for tests, its dispatcher threads named `name`: they spin a
/// little, then sleep on completion events (tests share two cores).
pub fn channel_config(name: &str) -> rpc_core::ChannelConfig {
    rpc_core::ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500)
        .thread_name(name)
}

/// Runs this test binary's ignored entry `entry` in a child process, told the server's address
/// in `env`, and reads its stdout until `ready` accepts a line (trimmed): returns the child (its
/// stdin piped: closing it ends a child that reads it), what `ready` returned, and its stdout
/// (kept open for libtest's report). A child that exits first fails the test, killed and reaped.
pub fn child_process<T>(
    entry: &str,
    env: &str,
    server: &rpc_core::ServerHandle,
    ready: impl Fn(&str) -> Option<T>,
) -> (std::process::Child, T, std::io::BufReader<std::process::ChildStdout>) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--ignored", "--exact", entry, "--nocapture", "--test-threads=1"])
        .env(env, server.local_addr().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning the client process");
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{entry}: no stdout");
    };
    let mut out = std::io::BufReader::new(stdout);
    loop {
        let mut line = String::new();
        match out.read_line(&mut line) {
            Ok(0) | Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("{entry} exited before it was ready: {status:?}");
            }
            Ok(_) => {
                if let Some(v) = ready(line.trim()) {
                    return (child, v, out);
                }
            }
        }
    }
}

/// A `Client` that nobody drives and that its endpoint's progress thread cannot look at either,
/// until released: a thread's call on it stops in the call's interceptor, which runs with the
/// client's lock held, so the progress thread's look (which only tries that lock) passes it
/// by. Messages for its session then wait in its inbox for as long as the test says, as they
/// did for any undriven session before endpoints had a progress thread: a test of what an
/// undriven session may hold needs this (a look takes its messages within 50 ms, which hides
/// a session holding more than it may). Released by [`Unlooked::release`] (or when dropped):
/// the interceptor fails the call (CANCELLED), never sent, so nothing polls the session on the
/// way out. The call waits at most [`WAIT`]. This relies on `Client::unary` running the
/// interceptor with the client's lock held (a `Client` is not `Sync`: no other thread can check
/// it); the tests that use it fail under their sabotages only while it does.
pub struct Unlooked {
    release: Option<mpsc::Sender<()>>,
    call: Option<JoinHandle<rpc_core::Client>>,
}

impl Unlooked {
    /// Connects to `addr` on `ep` (with `client_config()`) and holds the client in a call's
    /// interceptor; returns once the call is there.
    ///
    /// # Panics
    /// When the connect fails or the call never reaches its interceptor (within [`WAIT`]).
    pub fn connect(ep: &rpc_core::Endpoint, addr: SocketAddr) -> Unlooked {
        let (entered_tx, entered_rx) = mpsc::channel::<()>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let gate = Mutex::new((Some(entered_tx), release_rx));
        let cfg = client_config().interceptor(move |_| {
            let mut g = gate.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entered) = g.0.take() {
                let _ = entered.send(());
            }
            let _ = g.1.recv_timeout(WAIT);
            Err(rpc_core::Status::cancelled("released (rpc_support::Unlooked)"))
        });
        let client = ep.connect_with(addr, &cfg).expect("connecting the unlooked client");
        let call = std::thread::spawn(move || {
            let r =
                client.unary::<EchoMsg, EchoMsg>(ECHO, &request(0, 8, 8), &rpc_core::CallOptions::default());
            assert!(r.is_err(), "the unlooked client's call went out");
            client
        });
        entered_rx.recv_timeout(WAIT).expect("the unlooked client's call reached its interceptor");
        Unlooked { release: Some(release_tx), call: Some(call) }
    }

    /// Ends the call that holds the client (it fails in the interceptor, never sent) and
    /// returns the client, neither driven nor looked at since [`Unlooked::connect`].
    pub fn release(mut self) -> rpc_core::Client {
        self.release.take();
        self.call.take().unwrap().join().expect("the unlooked client's call")
    }
}

impl Drop for Unlooked {
    fn drop(&mut self) {
        self.release.take();
        if let Some(call) = self.call.take() {
            let _ = call.join();
        }
    }
}
