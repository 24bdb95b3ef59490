//! Client configuration and per-call options.

use std::time::{Duration, Instant};

use crate::config::PollingPolicy;
use crate::transport::Transport;

/// Configuration of a [`super::Client`]. Every field has a documented default.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// NIC provider. Default [`Transport::Sim`].
    pub transport: Transport,
    /// On an RDMA transport, take the same-host path to a server on this host: when the
    /// server's address is one of this host's (loopback, or an address of a local interface),
    /// the session is made on the software NIC (shared memory, this thread's `sim` endpoint)
    /// instead of through the NIC's loopback, and the server hands it to its software-NIC
    /// workers (`ServerConfig::same_host_shm`, [`crate::wire::FLAG_SHM`]). When the server
    /// offers no such path (or refuses it, or the software NIC cannot open), the client
    /// connects on the NIC as without this setting (one more TCP connect, logged at info; again
    /// at each reconnect). `Counters::sessions_shm` is 1 while the session runs on it. Default
    /// false. Ignored on `sim` (already shared memory).
    pub same_host_shm: bool,
    /// Calls outstanding at once (slots), also the credits asked of the server (which may grant
    /// fewer: the rest wait locally). Default 32; 1 ..= 4096.
    pub window: u16,
    /// Bytes of this client's receive ring (bulk responses). Default 1 MiB; 64 KiB ..= 1 GiB
    /// ([`crate::wire::MIN_RING_LEN`] ..= [`crate::wire::MAX_RING_LEN`]). A server refuses a
    /// ring above its `ServerConfig::max_peer_ring_bytes` (4 MiB by default) with
    /// RESOURCE_EXHAUSTED naming that limit: it mirrors this ring (and stages twice it).
    pub ring_bytes: u32,
    /// Bodies up to this many bytes travel in the SEND. Default 4096 bytes (the smaller of the
    /// client's and the server's value is used).
    pub eager_threshold: u32,
    /// Largest request or response body in bytes. Default 64 MiB; 1 ..= 4 GiB − 1. Larger bodies
    /// than the rings travel in pieces; a request over the limit (the smaller of client's and
    /// server's) is refused before anything is sent.
    pub max_message_size: u32,
    /// Largest ring a server may announce, in bytes: the client registers a send mirror (and a
    /// staging area of twice it) of that size, so a larger one fails the connect with
    /// RESOURCE_EXHAUSTED naming this field and the server's `ServerConfig::ring_bytes`.
    /// Default 64 MiB; 64 KiB ..= 1 GiB. A server ring below 64 KiB
    /// ([`crate::wire::MIN_RING_LEN`]) is refused as a bad handshake naming `ring_len`.
    pub max_peer_ring_bytes: u32,
    /// Most bytes the client registers for the buffers it hands out to send with no copy
    /// ([`crate::Client::alloc_registered`], [`crate::buffers::RegisteredPool`]), in slabs
    /// registered on first use. Default 256 MiB; over it an allocation fails
    /// RESOURCE_EXHAUSTED naming the bound.
    pub registered_buffer_bytes: usize,
    /// How a waiting call polls. Default [`PollingPolicy::Busy`].
    pub polling: PollingPolicy,
    /// TCP connect and handshake timeout. Default 5 s.
    pub connect_timeout: Duration,
    /// Token for servers that require one.
    pub auth_token: Option<Vec<u8>>,
    /// TLS on the TCP control channel (the handshake, which carries the auth token, QPNs, GIDs
    /// and rkeys): the roots the server's certificate must chain to and the name it must be
    /// valid for ([`crate::ClientTls`]). Default `None`: plaintext. The server must have
    /// `ServerConfig::tls` too: a TLS client to a plaintext server fails the connect
    /// UNAVAILABLE naming this field, a server certificate that is not trusted or not valid for
    /// the name UNAUTHENTICATED. The data path (RDMA) is not encrypted; calls cost the same.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::tls::ClientTls>,
    /// Calls that may wait for a slot when all `window` slots are taken (tonic's `buffer`).
    /// Such a call is encoded once (onto the heap) and waits in FIFO order, sent as slots and
    /// ring space free; beyond this many waiting, a new call fails at once with
    /// RESOURCE_EXHAUSTED naming `ClientConfig::max_queued_calls`. Default 1024; 0 refuses every
    /// call that finds the window full.
    pub max_queued_calls: usize,
    /// Delay before the second attempt to reconnect a broken session (the first is made by the
    /// first call after the break). Default 100 ms; above 0, at most `reconnect_max_backoff`.
    pub reconnect_initial_backoff: Duration,
    /// Longest delay between reconnect attempts (after jitter). Default 10 s.
    pub reconnect_max_backoff: Duration,
    /// Factor by which the delay grows after each failed attempt. Default 1.6 (gRPC's); 1.0 ..= 100.
    pub reconnect_multiplier: f64,
    /// Each delay is scaled by a uniform random factor in `[1 − jitter, 1 + jitter]` (so clients
    /// that broke together do not retry together). Default 0.2 (gRPC's); 0.0 ..= 1.0.
    pub reconnect_jitter: f64,
    /// How long the server may stay silent on the RDMA path while calls wait for it: after a
    /// third of it a Ping goes out (again after each further third; a running server answers
    /// with a Pong), after all of it the session closes and its calls end UNAVAILABLE. Catches
    /// a stopped or hung server process, which its NIC still acknowledges. Checked while a call
    /// polls: every 4096 empty polls, or every 16 that yield or block. Default 6 s; `None`
    /// disables the probe.
    ///
    /// The same time bounds the TCP control connection: TCP keepalive (probes from half of it
    /// on) and `TCP_USER_TIMEOUT` make the connection to a server host that vanished (nothing
    /// answers, not even its kernel) fail within it, and a waiting call then ends UNAVAILABLE.
    /// Below 2 s the TCP bound is 2 s (keepalive counts seconds); with `None` it is 10 s.
    pub peer_timeout: Option<Duration>,
    /// Calls abandoned on the wire (future dropped, deadline passed) whose acknowledgement from
    /// the server has not arrived at which the session starts watching for one: if none arrives
    /// within `peer_timeout` (5 s with `None`), it resets (calls UNAVAILABLE, logged) instead of
    /// starving the window. Nothing waits for it (dropping a future never blocks); the watch is
    /// checked as the session is progressed. Default 32; 1 ..= 65535, at most the window in
    /// effect and at most the credits the server granted (only calls on the wire are abandoned
    /// on it, holding a credit each: a higher cap would never be reached).
    pub max_abandoned: u16,
    /// Most bytes this client's session may hold in answers and stream messages that arrive in
    /// pieces from the server (each charged its whole announced length from its first piece to
    /// its last), so a hostile server cannot make it hold more. An answer that would go over it
    /// is refused alone: its pieces are dropped as they arrive and its call ends
    /// RESOURCE_EXHAUSTED naming this field once its last piece is in; the session stays open.
    /// Default 256 MiB; above 0 (an answer in pieces larger than it always fails, so keep it
    /// at least the largest answer expected).
    pub max_reassembly_bytes: u64,
    /// How long an answer arriving in pieces may take from its first piece to its last; after
    /// it the session is reset and its calls end RESOURCE_EXHAUSTED naming this field (the
    /// server holds this end's memory without finishing). Checked as the session is progressed
    /// while calls wait. Default 10 s; above 0.
    pub reassembly_timeout: Duration,
    /// Runs before every call, with the call's request metadata to read and change (add a token,
    /// a trace context); its error fails the call. Default none (a call without metadata then
    /// builds none and sends none).
    pub interceptor: Option<crate::metadata::ClientInterceptor>,
    /// Tracing spans, `traceparent` propagation and metrics of this end's unary calls
    /// ([`crate::observe`]). Default [`crate::Observe::OFF`] (a call pays one branch).
    pub observe: crate::Observe,
    /// Most bytes of a response's metadata (its headers and trailers blocks together,
    /// [`crate::ResponseMetadata`]); a response with more fails its call RESOURCE_EXHAUSTED
    /// naming this field (the session stays open). Default 8192 (the server's default for
    /// requests); at least 12 (two empty blocks).
    pub max_metadata_bytes: u32,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            transport: Transport::Sim,
            same_host_shm: false,
            window: 32,
            ring_bytes: 1 << 20,
            eager_threshold: 4096,
            max_message_size: 64 << 20,
            max_peer_ring_bytes: 64 << 20,
            registered_buffer_bytes: crate::buffers::registered::DEFAULT_POOL_BYTES,
            polling: PollingPolicy::Busy,
            connect_timeout: Duration::from_secs(5),
            auth_token: None,
            #[cfg(feature = "tls")]
            tls: None,
            max_queued_calls: 1024,
            reconnect_initial_backoff: Duration::from_millis(100),
            reconnect_max_backoff: Duration::from_secs(10),
            reconnect_multiplier: 1.6,
            reconnect_jitter: 0.2,
            peer_timeout: Some(Duration::from_secs(6)),
            max_abandoned: 32,
            max_reassembly_bytes: 256 << 20,
            reassembly_timeout: Duration::from_secs(10),
            interceptor: None,
            observe: crate::Observe::OFF,
            max_metadata_bytes: 8192,
        }
    }
}

macro_rules! setter {
    ($($(#[$m:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$m])*
            pub fn $name(mut self, v: $ty) -> Self {
                self.$name = v;
                self
            }
        )*
    };
}

impl ClientConfig {
    setter! {
        /// See [`ClientConfig::transport`].
        transport: Transport;
        /// See [`ClientConfig::same_host_shm`].
        same_host_shm: bool;
        /// See [`ClientConfig::window`].
        window: u16;
        /// See [`ClientConfig::ring_bytes`].
        ring_bytes: u32;
        /// See [`ClientConfig::eager_threshold`].
        eager_threshold: u32;
        /// See [`ClientConfig::max_message_size`].
        max_message_size: u32;
        /// See [`ClientConfig::max_peer_ring_bytes`].
        max_peer_ring_bytes: u32;
        /// See [`ClientConfig::registered_buffer_bytes`].
        registered_buffer_bytes: usize;
        /// See [`ClientConfig::polling`].
        polling: PollingPolicy;
        /// See [`ClientConfig::connect_timeout`].
        connect_timeout: Duration;
        /// See [`ClientConfig::max_queued_calls`].
        max_queued_calls: usize;
        /// See [`ClientConfig::reconnect_initial_backoff`].
        reconnect_initial_backoff: Duration;
        /// See [`ClientConfig::reconnect_max_backoff`].
        reconnect_max_backoff: Duration;
        /// See [`ClientConfig::reconnect_multiplier`].
        reconnect_multiplier: f64;
        /// See [`ClientConfig::reconnect_jitter`].
        reconnect_jitter: f64;
        /// See [`ClientConfig::peer_timeout`].
        peer_timeout: Option<Duration>;
        /// See [`ClientConfig::max_abandoned`].
        max_abandoned: u16;
        /// See [`ClientConfig::max_reassembly_bytes`].
        max_reassembly_bytes: u64;
        /// See [`ClientConfig::reassembly_timeout`].
        reassembly_timeout: Duration;
        /// See [`ClientConfig::max_metadata_bytes`].
        max_metadata_bytes: u32;
    }

    /// Sets the auth token (at most 256 bytes).
    pub fn auth_token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    /// Runs `f` before every call with its request metadata (see [`ClientConfig::interceptor`]).
    pub fn interceptor(
        mut self,
        f: impl Fn(&mut crate::metadata::Metadata) -> Result<(), crate::Status> + Send + Sync + 'static,
    ) -> Self {
        self.interceptor = Some(crate::metadata::ClientInterceptor::new(f));
        self
    }

    /// Sets [`ClientConfig::observe`].
    pub fn observe(mut self, observe: crate::Observe) -> Self {
        self.observe = observe;
        self
    }

    /// Runs the control channel over TLS (see [`ClientConfig::tls`]).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// Options of one call. `CallOptions::default()` has no deadline of its own and no balancing key.
///
/// **Deadline propagation.** A call made while its thread serves a call with a deadline (in an
/// inline handler, or in an async handler's future, on the worker or on a tokio runtime)
/// inherits what is left of that deadline: its deadline is the earlier of its own and the
/// inherited one, so a chain of services gives up together, as gRPC's contexts do in Go and
/// Java. [`CallOptions::without_inherited_deadline`] opts out. Threads a handler starts inherit
/// nothing: pass the deadline on with [`CallOptions::deadline_at`]. Cancellation follows an async
/// handler's calls by itself: its future, dropped when its call is cancelled, drops the futures of
/// the calls it made, which cancels them on the wire.
///
/// **Metadata.** [`CallOptions::with_metadata`] sends request metadata with the call (a generated
/// stub also takes it from a [`Request`](crate::Request) wrapping the message, in tonic's shape).
/// [`CallOptions::capture_metadata`] receives the response's headers and trailers (an error's
/// also come in its [`Status::metadata`](crate::Status::metadata)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallOptions {
    timeout: Option<Duration>,
    at: Option<Instant>,
    detached: bool,
    metadata: Option<std::sync::Arc<crate::metadata::Metadata>>,
    key: Option<u64>,
    capture: Option<crate::metadata::CapturedMetadata>,
}

impl CallOptions {
    /// Options with a deadline `timeout` from the start of the call; after it the call ends with
    /// DEADLINE_EXCEEDED (the server sees the remaining time in its `RequestContext::deadline`).
    pub fn deadline(timeout: Duration) -> CallOptions {
        CallOptions { timeout: Some(timeout), ..CallOptions::default() }
    }

    /// These options with the call's request key: a balanced channel with
    /// [`Policy::ConsistentHash`](crate::balance::Policy::ConsistentHash) sends every call with
    /// the same key to the same server while that server is up (hash the user id, the shard
    /// key, ... into a `u64` yourself). Ignored by the other policies and by a channel to one
    /// server; with no key, that policy picks round robin.
    pub fn with_key(mut self, key: u64) -> CallOptions {
        self.key = Some(key);
        self
    }

    /// The request key, if any (see [`CallOptions::with_key`]).
    pub fn key(&self) -> Option<u64> {
        self.key
    }

    /// Options with the deadline `at` (`None`: none of its own), e.g. a handler's
    /// `ctx.deadline()` passed on to calls made from a thread of its own.
    pub fn deadline_at(at: Option<Instant>) -> CallOptions {
        CallOptions { at, ..CallOptions::default() }
    }

    /// The call does not inherit the deadline of the call its thread serves.
    pub fn without_inherited_deadline(mut self) -> CallOptions {
        self.detached = true;
        self
    }

    /// Sends `metadata` with the call (replacing any given before). An empty map sends nothing.
    pub fn with_metadata(mut self, metadata: crate::metadata::Metadata) -> CallOptions {
        self.metadata = (!metadata.is_empty()).then(|| std::sync::Arc::new(metadata));
        self
    }

    /// The request metadata the call sends, if any.
    pub fn metadata(&self) -> Option<&crate::metadata::Metadata> {
        self.metadata.as_deref()
    }

    /// The call puts the response's headers and trailers into `into` when its response arrives
    /// (a stream's with its end), as gRPC Go's `grpc.Header`/`grpc.Trailer` options: read them
    /// there after the call. A response without metadata leaves it as it was.
    pub fn capture_metadata(mut self, into: &crate::metadata::CapturedMetadata) -> CallOptions {
        self.capture = Some(into.clone());
        self
    }

    /// Where the call puts its response's metadata, if anywhere.
    pub(crate) fn capture(&self) -> Option<&crate::metadata::CapturedMetadata> {
        self.capture.as_ref()
    }

    /// The metadata, shared (a call that waits keeps it).
    pub(crate) fn metadata_arc(&self) -> Option<&std::sync::Arc<crate::metadata::Metadata>> {
        self.metadata.as_ref()
    }

    /// The timeout given with [`CallOptions::deadline`], if any (the inherited deadline and
    /// [`CallOptions::deadline_at`] not included).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The time the call may take from now: the earliest of its timeout, its deadline and the
    /// deadline it inherits (zero when one has passed).
    #[inline]
    pub(crate) fn effective_timeout(&self) -> Option<Duration> {
        let inherited = if self.detached { None } else { crate::context::inherited() };
        let at = match (self.at, inherited) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match at {
            None => self.timeout,
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                Some(self.timeout.map_or(left, |t| t.min(left)))
            }
        }
    }
}
