//! The balancer behind a balanced [`Channel`]: the servers the resolver found, each with its
//! own single-server [`Channel`] (connected on first pick), its state, and the policy's pick.
//!
//! A server's state moves:
//!
//! | from | to | when |
//! |---|---|---|
//! | idle | connecting | the first pick of the channel after the server appeared (every idle server starts connecting then, each on its channel's dispatcher threads) |
//! | connecting | up | its channel's sessions are open |
//! | connecting, up | down | its connect failed, or a call through it ended UNAVAILABLE (its session broke: the server died, closed, or answered "shutting down" while draining), or its idle session was found broken |
//! | down | connecting | a pick after its backoff ([`super::BalanceConfig::retry_initial`], doubling per failure in a row up to `retry_max`, ±25 % jitter): a fresh channel connects in the background, calls are not sent to it until it is up |
//! | up, connecting | not serving | its health watch ([`super::BalanceConfig::health_check`]) says NOT_SERVING (or anything but SERVING), or [`Balancer::set_serving`]`(addr, false)` |
//! | not serving | up | its health watch says SERVING, or [`Balancer::set_serving`]`(addr, true)` |
//! | not serving | down | its session broke (a call or its health watch ended UNAVAILABLE) |
//!
//! Calls go to servers that are up; when none is, to one still connecting (they wait for its
//! session, and end with its connect error if it fails); when none is either, they end
//! UNAVAILABLE at once, saying when the next server is retried. Calls in flight on a server
//! that dies end UNAVAILABLE (its channel fails them); none is re-sent elsewhere.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use super::policy::{Policy, Ring};
use super::BalanceConfig;
use crate::channel::call::Completion;
use crate::channel::{Channel, Watch};
use crate::status::{Code, Status};

const IDLE: u8 = 0;
const CONNECTING: u8 = 1;
const UP: u8 = 2;
const DOWN: u8 = 3;
const NOT_SERVING: u8 = 4;

/// No look due ([`Clock::attention`]).
const NEVER: u64 = u64::MAX;

/// A server's state as [`Balancer::servers`] reports it (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerState {
    /// Not connected yet (no call was made since it appeared).
    Idle,
    /// Its channel is connecting.
    Connecting,
    /// Connected: calls are sent to it.
    Up,
    /// Its connect failed or its session broke: not picked until its backoff has passed.
    Down,
    /// Marked not serving ([`Balancer::set_serving`]): not picked until marked serving again.
    NotServing,
}

/// One server of a balanced channel, as [`Balancer::servers`] reports it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServerStatus {
    /// Its address.
    pub addr: SocketAddr,
    /// Its state.
    pub state: ServerState,
    /// Calls (and streams) picked for it so far.
    pub picks: u64,
    /// Calls this client has in flight on it now.
    pub in_flight: usize,
    /// Connect failures and breaks in a row (0 once it is up again).
    pub failures: u32,
    /// The load the server reported on its last response to this client (its requests
    /// admitted and not yet answered, over all its clients), if any.
    pub reported_load: Option<u32>,
}

/// Time since the balancer was built, in ns, and the next time a pick must look at the
/// servers (idle ones to connect, down ones whose backoff passed).
struct Clock {
    epoch: Instant,
    /// ns since `epoch` when the next look is due; [`NEVER`] when none is.
    attention: AtomicU64,
}

impl Clock {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos().min(u128::from(NEVER - 1)) as u64
    }

    fn want(&self, at: u64) {
        self.attention.fetch_min(at, Ordering::AcqRel);
    }
}

/// A server's health, shared with the watch of its channel (no reference back to the channel).
struct Health {
    addr: SocketAddr,
    state: AtomicU8,
    /// Bumped at each connect: what an older channel reports is ignored.
    generation: AtomicU64,
    failures: AtomicU32,
    /// ns since the clock's epoch when a down server may be tried again.
    retry_at: AtomicU64,
    /// Why it went down last.
    reason: Mutex<String>,
    /// Serializes state changes (rare: connects, failures, marks).
    change: Mutex<()>,
    clock: Arc<Clock>,
    retry_initial: Duration,
    retry_max: Duration,
    /// `BalanceConfig::load_fresh` in ns.
    load_fresh: u64,
}

impl Health {
    fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// The server of generation `gen` failed (`why`): down, retried after the backoff.
    fn down(&self, gen: u64, why: &Status) {
        let _g = self.change.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.state();
        if self.generation.load(Ordering::Acquire) != gen || !(s == UP || s == CONNECTING || s == NOT_SERVING)
        {
            return;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        let delay = backoff(self.retry_initial, self.retry_max, failures);
        let at = self.clock.now().saturating_add(delay.as_nanos() as u64);
        self.retry_at.store(at, Ordering::Release);
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = why.message().to_owned();
        self.state.store(DOWN, Ordering::Release);
        self.clock.want(at);
        tracing::warn!(server = %self.addr, why = why.message(), retry_in = ?delay, failures, "balancer: server down");
    }

    /// The connect of generation `gen` succeeded.
    fn up(&self, gen: u64) {
        let _g = self.change.lock().unwrap_or_else(|e| e.into_inner());
        if self.generation.load(Ordering::Acquire) != gen || self.state() != CONNECTING {
            return;
        }
        self.failures.store(0, Ordering::Release);
        self.state.store(UP, Ordering::Release);
        tracing::info!(server = %self.addr, "balancer: server up");
    }

    /// Marks the server serving or not (a health watch's report, or [`Balancer::set_serving`]);
    /// `gen`: the connect the report is about (`None`: whatever the server's connect is).
    /// `connected`: whether the server has a channel (one marked serving again without one is
    /// idle, connected at the next pick). True when the state changed.
    fn serving(&self, gen: Option<u64>, serving: bool, connected: bool) -> bool {
        let _g = self.change.lock().unwrap_or_else(|e| e.into_inner());
        if gen.is_some_and(|g| self.generation.load(Ordering::Acquire) != g) {
            return false;
        }
        match (serving, self.state()) {
            (false, UP | CONNECTING) => {
                self.state.store(NOT_SERVING, Ordering::Release);
                tracing::info!(server = %self.addr, "balancer: server marked not serving");
                true
            }
            (true, NOT_SERVING) => {
                if connected {
                    self.state.store(UP, Ordering::Release);
                } else {
                    self.state.store(IDLE, Ordering::Release);
                    self.clock.want(0);
                }
                tracing::info!(server = %self.addr, "balancer: server marked serving");
                true
            }
            _ => false,
        }
    }
}

/// Watches the health of one connect of a server ([`BalanceConfig::health_check`]): a
/// `grpc.health.v1` Watch on its channel, each status it reports marking the server serving
/// (SERVING) or not (anything else). Ends with the stream: a server without the health service
/// (UNIMPLEMENTED) is left as its calls find it; a broken session ends the stream UNAVAILABLE,
/// which marks the server down (its channel's watch hook), and its next connect starts a new
/// watch.
async fn watch_health(channel: Channel, service: String, health: Arc<Health>, gen: u64) {
    use crate::health::{HealthCheckRequest, HealthClient, ServingStatus};
    let client = HealthClient::from_channel(channel);
    let mut rx = client.watch(HealthCheckRequest { service: service.clone() });
    loop {
        match rx.message().await {
            Ok(Some(r)) => {
                let serving = r.status == ServingStatus::Serving as i32;
                health.serving(Some(gen), serving, true);
            }
            Ok(None) => {
                tracing::info!(server = %health.addr, service, "balancer: the server ended its health watch");
                return;
            }
            Err(s) if s.code() == Code::Unimplemented => {
                tracing::info!(server = %health.addr, service, "balancer: the server has no health service; its health is not watched");
                return;
            }
            Err(s) => {
                tracing::debug!(server = %health.addr, service, status = %s, "balancer: health watch ended");
                return;
            }
        }
    }
}

/// The delay before a server that failed `failures` times in a row is tried again:
/// `initial × 2^(failures-1)`, at most `max`, ±25 % jitter.
fn backoff(initial: Duration, max: Duration, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    let base = initial.saturating_mul(1 << exp).min(max);
    let jitter = 0.75 + fastrand::f64() * 0.5;
    base.mul_f64(jitter)
}

/// What a server's channel tells its balancer: a call ended UNAVAILABLE (its session broke).
struct Hook {
    health: Arc<Health>,
    generation: u64,
}

impl Watch for Hook {
    fn failed(&self, status: &Status) {
        if status.code() == Code::Unavailable {
            self.health.down(self.generation, status);
        }
    }
}

/// One dispatcher's connect: its completion, and its outcome once taken.
type Connect = (Arc<Completion<Result<(), Status>>>, Option<Result<(), Status>>);

/// Waits for a connect's outcome (one per dispatcher of the server's channel), woken by the
/// dispatcher threads: up when all connected, down at the first failure.
struct ConnectWatch {
    health: Arc<Health>,
    generation: u64,
    pending: Mutex<Vec<Connect>>,
}

impl ConnectWatch {
    fn look(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (c, r) in p.iter_mut() {
            if r.is_none() {
                if let Some(Some(v)) = c.try_take() {
                    *r = Some(v);
                }
            }
        }
        if let Some(Err(s)) = p.iter().find_map(|(_, r)| r.as_ref().filter(|r| r.is_err())) {
            let s = s.clone();
            drop(p);
            self.health.down(self.generation, &s);
        } else if p.iter().all(|(_, r)| r.is_some()) {
            drop(p);
            self.health.up(self.generation);
        }
    }
}

impl Wake for ConnectWatch {
    fn wake(self: Arc<Self>) {
        self.look();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.look();
    }
}

/// One server: its health and its channel (none until its first pick).
struct Server {
    health: Arc<Health>,
    channel: RwLock<Option<Channel>>,
    picks: AtomicU64,
    /// A load reported from elsewhere ([`Balancer::report_load`]); `u64::MAX`: none.
    reported: AtomicU64,
    /// The count of the server's load reports last seen, and when it last moved (ns, the
    /// balancer's clock): a report with no newer one for `BalanceConfig::load_fresh` is no
    /// longer used.
    seen_seq: AtomicU64,
    seen_at: AtomicU64,
    /// The task of the health watch of its current connect, if any.
    watch: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Server {
    /// Stops the health watch (its stream holds the server's channel).
    fn drop(&mut self) {
        if let Some(w) = self.watch.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            w.abort();
        }
    }
}

impl Server {
    fn new(addr: SocketAddr, clock: &Arc<Clock>, config: &BalanceConfig) -> Server {
        Server {
            health: Arc::new(Health {
                addr,
                state: AtomicU8::new(IDLE),
                generation: AtomicU64::new(0),
                failures: AtomicU32::new(0),
                retry_at: AtomicU64::new(0),
                reason: Mutex::new(String::new()),
                change: Mutex::new(()),
                clock: clock.clone(),
                retry_initial: config.retry_initial,
                retry_max: config.retry_max,
                load_fresh: config.load_fresh.as_nanos().min(u128::from(u64::MAX)) as u64,
            }),
            channel: RwLock::new(None),
            picks: AtomicU64::new(0),
            reported: AtomicU64::new(u64::MAX),
            seen_seq: AtomicU64::new(0),
            seen_at: AtomicU64::new(0),
            watch: Mutex::new(None),
        }
    }

    fn channel(&self) -> Option<Channel> {
        self.channel.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The load the policy compares: one reported with [`Balancer::report_load`] if any, else
    /// the higher of the one the server reported on its responses, while fresh
    /// (`BalanceConfig::load_fresh`), and this client's calls in flight on the server (a lower
    /// bound of the server's count, and newer).
    fn load(&self) -> u64 {
        let r = self.reported.load(Ordering::Relaxed);
        if r != u64::MAX {
            return r;
        }
        let g = self.channel.read().unwrap_or_else(|e| e.into_inner());
        let Some(c) = g.as_ref() else { return 0 };
        let own = c.in_flight() as u64;
        if let Some((load, seq)) = c.reported_load() {
            let now = self.health.clock.now();
            if self.seen_seq.swap(seq, Ordering::Relaxed) != seq {
                self.seen_at.store(now, Ordering::Relaxed);
                return own.max(u64::from(load));
            }
            if now.saturating_sub(self.seen_at.load(Ordering::Relaxed)) < self.health.load_fresh {
                return own.max(u64::from(load));
            }
        }
        own
    }

    /// Starts a fresh channel to the server (its sessions connect on its dispatcher threads);
    /// the old one, if any, is dropped (calls still in flight on it keep it until they end).
    fn connect(&self, config: &BalanceConfig) {
        let h = &self.health;
        let gen = {
            let _g = h.change.lock().unwrap_or_else(|e| e.into_inner());
            h.state.store(CONNECTING, Ordering::Release);
            h.generation.fetch_add(1, Ordering::AcqRel) + 1
        };
        let hook: Arc<dyn Watch> = Arc::new(Hook { health: h.clone(), generation: gen });
        // On the dispatcher threads of `config.channel` (one per core), with every other
        // server's session.
        match Channel::start(h.addr, &config.channel, Some(hook)) {
            Ok((channel, pending)) => {
                let task = config.health_check.as_ref().map(|service| {
                    crate::server::async_service::shared_runtime()
                        .spawn(watch_health(channel.clone(), service.clone(), h.clone(), gen))
                        .abort_handle()
                });
                let old_watch =
                    std::mem::replace(&mut *self.watch.lock().unwrap_or_else(|e| e.into_inner()), task);
                if let Some(w) = old_watch {
                    w.abort();
                }
                let old = self.channel.write().unwrap_or_else(|e| e.into_inner()).replace(channel);
                drop(old);
                let watch = Arc::new(ConnectWatch {
                    health: h.clone(),
                    generation: gen,
                    pending: Mutex::new(Vec::with_capacity(pending.len())),
                });
                let waker = Waker::from(watch.clone());
                let mut cx = Context::from_waker(&waker);
                for c in pending {
                    let r = match c.poll(&mut cx) {
                        std::task::Poll::Ready(r) => r,
                        std::task::Poll::Pending => None,
                    };
                    watch.pending.lock().unwrap_or_else(|e| e.into_inner()).push((c, r));
                }
                watch.look();
            }
            Err(s) => h.down(gen, &s),
        }
    }

    fn status(&self) -> ServerStatus {
        let h = &self.health;
        ServerStatus {
            addr: h.addr,
            state: match h.state() {
                IDLE => ServerState::Idle,
                CONNECTING => ServerState::Connecting,
                UP => ServerState::Up,
                DOWN => ServerState::Down,
                _ => ServerState::NotServing,
            },
            picks: self.picks.load(Ordering::Relaxed),
            in_flight: self.channel().map_or(0, |c| c.in_flight()),
            failures: h.failures.load(Ordering::Relaxed),
            reported_load: self.channel().and_then(|c| c.reported_load()).map(|r| r.0),
        }
    }
}

/// The servers as the resolver last gave them, and the ring over them.
struct Snapshot {
    servers: Vec<Arc<Server>>,
    ring: Option<Ring>,
}

/// The shared state of a balanced channel ([`Channel::balanced`]; reach it with
/// [`Channel::balancer`]): the servers, their states, and the pick. See the module docs of
/// [`crate::balance`].
pub struct Balancer {
    config: BalanceConfig,
    snapshot: RwLock<Arc<Snapshot>>,
    clock: Arc<Clock>,
    /// Round robin's turn.
    next: AtomicUsize,
    /// Held by the pick that looks at the servers (others skip the look).
    look: Mutex<()>,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("policy", &self.config.policy)
            .field("servers", &self.servers())
            .finish()
    }
}

impl Balancer {
    pub(crate) fn new(config: BalanceConfig) -> Balancer {
        let clock = Arc::new(Clock { epoch: Instant::now(), attention: AtomicU64::new(NEVER) });
        Balancer {
            config,
            snapshot: RwLock::new(Arc::new(Snapshot { servers: Vec::new(), ring: None })),
            clock,
            next: AtomicUsize::new(0),
            look: Mutex::new(()),
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.config.policy
    }

    /// Every server the resolver gave last, with its state.
    pub fn servers(&self) -> Vec<ServerStatus> {
        self.snap().servers.iter().map(|s| s.status()).collect()
    }

    /// Marks the server at `addr` serving or not: a server marked not serving is not picked
    /// (calls in flight on it go on) until it is marked serving again. What the health watch
    /// of [`BalanceConfig::health_check`] does by itself; this is for health learnt elsewhere.
    /// Returns false when no server has that address.
    pub fn set_serving(&self, addr: SocketAddr, serving: bool) -> bool {
        let snap = self.snap();
        let Some(s) = snap.servers.iter().find(|s| s.health.addr == addr) else { return false };
        let connected = s.channel.read().unwrap_or_else(|e| e.into_inner()).is_some();
        s.health.serving(None, serving, connected);
        true
    }

    /// Sets the load [`Policy::PowerOfTwoChoices`] compares for the server at `addr` (any unit,
    /// the same for every server: calls queued, credits in use...), replacing this client's
    /// own count of calls in flight on it; `None` goes back to that count. Returns false when
    /// no server has that address.
    pub fn report_load(&self, addr: SocketAddr, load: Option<u32>) -> bool {
        let snap = self.snap();
        let Some(s) = snap.servers.iter().find(|s| s.health.addr == addr) else { return false };
        s.reported.store(load.map_or(u64::MAX, u64::from), Ordering::Relaxed);
        true
    }

    fn snap(&self) -> Arc<Snapshot> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The channels of the servers that have one.
    pub(crate) fn channels(&self) -> Vec<Channel> {
        self.snap().servers.iter().filter_map(|s| s.channel()).collect()
    }

    /// Takes the resolver's new set: servers still there keep their state and channel, new
    /// ones are idle (connected at the next pick), gone ones are dropped (their calls in flight
    /// go on).
    pub(crate) fn update(&self, addrs: Vec<SocketAddr>) {
        let addrs = super::resolver::normalize(addrs);
        let _g = self.look.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.snap();
        let mut added = 0;
        let servers: Vec<Arc<Server>> = addrs
            .iter()
            .map(|a| {
                old.servers.iter().find(|s| s.health.addr == *a).cloned().unwrap_or_else(|| {
                    added += 1;
                    Arc::new(Server::new(*a, &self.clock, &self.config))
                })
            })
            .collect();
        let ring = match self.config.policy {
            Policy::ConsistentHash { vnodes } => Some(Ring::new(&addrs, vnodes)),
            _ => None,
        };
        tracing::info!(
            servers = servers.len(),
            added,
            removed = old.servers.len() + added - servers.len(),
            "balancer: servers updated"
        );
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Snapshot { servers, ring });
        if added > 0 {
            self.clock.want(0);
        }
    }

    /// Connects idle servers and down ones whose backoff passed (at most one pick at a time
    /// looks; the others go on).
    #[cold]
    #[inline(never)]
    fn look(&self) {
        let now = self.clock.now();
        if now < self.clock.attention.load(Ordering::Acquire) {
            return;
        }
        let Ok(_g) = self.look.try_lock() else { return };
        // A failure from here on lowers it again; one before is seen by the scan.
        self.clock.attention.store(NEVER, Ordering::Release);
        let snap = self.snap();
        for s in &snap.servers {
            match s.health.state() {
                IDLE => s.connect(&self.config),
                DOWN => {
                    let at = s.health.retry_at.load(Ordering::Acquire);
                    if at <= now {
                        s.connect(&self.config);
                    } else {
                        self.clock.want(at);
                    }
                }
                _ => {}
            }
        }
    }

    /// The channel of the server for the next call (see the module docs).
    ///
    /// # Errors
    /// UNAVAILABLE when no server is up or connecting (saying how many are known and when the
    /// next one is retried).
    pub(crate) fn pick(&self, key: Option<u64>) -> Result<Channel, Status> {
        if self.clock.attention.load(Ordering::Relaxed) != NEVER {
            self.look();
        }
        let snap = self.snapshot.read().unwrap_or_else(|e| e.into_inner());
        let servers = &snap.servers;
        let n = servers.len();
        let is = |i: usize, state: u8| servers[i].health.state() == state;
        let scan = |state: u8| {
            let start = self.next.fetch_add(1, Ordering::Relaxed);
            (0..n).map(|j| (start + j) % n).find(|&i| is(i, state))
        };
        let chosen = match (self.config.policy, key, &snap.ring) {
            _ if n == 0 => None,
            (Policy::PowerOfTwoChoices, _, _) if n > 1 => {
                let a = fastrand::usize(..n);
                let b = (a + 1 + fastrand::usize(..n - 1)) % n;
                match (is(a, UP), is(b, UP)) {
                    (true, true) => Some(if servers[b].load() < servers[a].load() { b } else { a }),
                    (true, false) => Some(a),
                    (false, true) => Some(b),
                    (false, false) => scan(UP),
                }
            }
            (Policy::ConsistentHash { .. }, Some(k), Some(ring)) => ring.walk(k).find(|&i| is(i, UP)),
            _ => scan(UP),
        };
        // Nothing up: a server still connecting takes the call (it waits for the session).
        let chosen = chosen.or_else(|| if n == 0 { None } else { scan(CONNECTING) });
        if let Some(i) = chosen {
            if let Some(c) = servers[i].channel() {
                servers[i].picks.fetch_add(1, Ordering::Relaxed);
                return Ok(c);
            }
        }
        Err(self.none_up(servers))
    }

    #[cold]
    fn none_up(&self, servers: &[Arc<Server>]) -> Status {
        if servers.is_empty() {
            return Status::unavailable("balanced channel: the resolver found no server");
        }
        let now = self.clock.now();
        let next = servers
            .iter()
            .filter(|s| s.health.state() == DOWN)
            .map(|s| s.health.retry_at.load(Ordering::Relaxed).saturating_sub(now))
            .min();
        let why = servers
            .iter()
            .find(|s| s.health.state() == DOWN)
            .map(|s| s.health.reason.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default();
        Status::unavailable(format!(
            "balanced channel: none of {} servers is up (last failure: {why}); next retry in {:?}",
            servers.len(),
            next.map(Duration::from_nanos)
        ))
    }
}
