//! Tracing and metrics of calls (issue 30 item 3), opt-in per end with [`Observe`]
//! (`ClientConfig::observe`, `ServerConfig::observe`); off (the default), a call pays one
//! predictable branch per end and nothing else.
//!
//! **Tracing.** With [`Observe::tracing`], every unary call gets a `tracing` span on each end,
//! named `rpc.client` / `rpc.server`, with OpenTelemetry's RPC attributes as span fields:
//! `rpc.system` (`"rdma-rpc"`), `rpc.service`, `rpc.method`, `rpc.grpc.status_code` (the
//! numeric gRPC code), `rpc.request.size` and `rpc.response.size` (message bytes),
//! `network.peer.address` (`ip:port`), `otel.kind` (`"client"` / `"server"`), and the W3C ids
//! `trace_id`, `span_id`, `parent_span_id` (lowercase hex). The server's span is entered around
//! the handler (inline handlers, and every poll of an async handler's future).
//!
//! A client call sends the W3C `traceparent` metadata entry
//! (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`): the trace id of the thread's current
//! [`TraceContext`] (the call its thread serves, or one a user entered with
//! [`TraceContext::enter`]) or a new random one, and a new random span id (the client span's).
//! A server with tracing on reads `traceparent`, validates it strictly
//! ([`TraceContext::parse`]; a bad value is ignored, never an error), and makes the handler's
//! context the same trace with the server span's new id, so the handler's own outgoing calls
//! continue the trace (through a thread-local, as deadline propagation does; async handlers
//! too). [`TraceContext::current`] reads it.
//!
//! **Metrics.** With [`Observe::metrics`], through the `metrics` facade (whatever recorder the
//! process installed; none: nothing is recorded), per method (label `method`, the full gRPC
//! name `/pkg.Service/Method`; on the client the name a generated stub registered, else the
//! id as `0x…`):
//!
//! | name | kind | labels | unit |
//! |---|---|---|---|
//! | `rpc_client_calls_total`, `rpc_server_calls_total` | counter | method, code | calls |
//! | `rpc_client_request_bytes_total`, `rpc_server_request_bytes_total` | counter | method | bytes |
//! | `rpc_client_response_bytes_total`, `rpc_server_response_bytes_total` | counter | method | bytes |
//! | `rpc_client_in_flight`, `rpc_server_in_flight` | gauge | method | calls |
//! | `rpc_client_duration_seconds`, `rpc_server_duration_seconds` | histogram | method | seconds |
//!
//! `code` is the status code's name (`OK`, `UNAVAILABLE`...).
//!
//! A call does not call the recorder: it adds to its thread's own record of its method (a few
//! plain loads and stores, no atomic read-modify-write, no lock), and a flusher thread (one per
//! process, started by the first record, asleep in between) hands what every thread's records
//! gained to the recorder every [`METRICS_FLUSH_EVERY`] (100 ms), as Envoy's thread-local stats
//! do; [`flush_metrics`] does it at once. So a scrape sees a call at most 100 ms after it ended.
//! The duration histogram is aggregated per thread in log-linear buckets (exact below 16 ns, then
//! 16 per power of two) and each bucket reaches the recorder as its midpoint: a recorded
//! duration is within 1/32 (3.1 %) of the measured one. A thread's records outlive it (the next
//! thread to call the method takes them over): about 5 KiB per method, end and thread that
//! ever called it at once. Durations are read from the TSC (`quanta`: calibrated once per
//! process, when `Observe::metrics(true)` is first built; the OS clock where the TSC is not
//! invariant). What a call records stays off its latency where it can: a client call counts in
//! flight (and its request bytes) once its request is posted (an async call at its first
//! pending poll, while it waits; a blocking one just before it sends); a server records an
//! inline handler's call after its answer is posted, so `rpc_server_in_flight` counts the
//! calls async handlers' tasks, deferred answers and streams hold (an inline handler's call is
//! answered before the worker looks at anything else).
//!
//! Scope: every call, unary or
//! streaming, of the blocking `Client` and of the `Channel`, and on the server every call of a
//! served method: inline and async handlers, a deferred answer (its record ends when its
//! `Responder` answers, or when the call ends without it: cancelled, expired, its session
//! closed), a stream (ended by its final status), and a call refused before its handler ran
//! (draining, refused metadata, a passed deadline, the interceptor's refusal: its code, no
//! handler). A stream's response size is the bytes of the messages the client took (the
//! client end) or the server's worker took to send (the server end); a stream the client
//! drops before its end is CANCELLED.
//! On the `Channel`, `network.peer.address` is the server its first dispatcher connected to
//! (after a reconnect, the new session's); a balanced `Channel`'s spans have none (its
//! balancer picks the server after the span starts).

use std::cell::Cell;
use std::net::SocketAddr;

use crate::dispatch::service::MethodId;
use crate::metadata::Metadata;
use crate::status::Code;

/// Which observations a client or server makes (see the [module docs](self)). Default: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observe {
    bits: u8,
}

const TRACING: u8 = 1;
const METRICS: u8 = 2;

impl Observe {
    /// Nothing observed (the default).
    pub const OFF: Observe = Observe { bits: 0 };
    /// Tracing and metrics.
    pub const ALL: Observe = Observe { bits: TRACING | METRICS };

    /// A `tracing` span per call and `traceparent` propagation, on or off.
    pub fn tracing(mut self, on: bool) -> Observe {
        self.set(TRACING, on);
        self
    }

    /// Per-method metrics through the `metrics` facade, on or off (without the crate's `metrics`
    /// feature nothing is recorded).
    pub fn metrics(mut self, on: bool) -> Observe {
        self.set(METRICS, on);
        if on {
            // The clock calls are timed with: calibrated here, once per process, not by a call.
            rec::warm();
        }
        self
    }

    fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.bits |= bit;
        } else {
            self.bits &= !bit;
        }
    }

    /// Tracing is on.
    pub fn is_tracing(self) -> bool {
        self.bits & TRACING != 0
    }

    /// Metrics are on.
    pub fn is_metrics(self) -> bool {
        self.bits & METRICS != 0
    }

    /// Anything is on (the one branch a call pays).
    #[inline(always)]
    pub(crate) fn any(self) -> bool {
        self.bits != 0
    }
}

/// A W3C trace context: the trace id, the id of the current span, and the trace flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: u128,
    span_id: u64,
    flags: u8,
}

thread_local! {
    static CURRENT: Cell<Option<TraceContext>> = const { Cell::new(None) };
}

/// Restores the thread's previous trace context when dropped ([`TraceContext::enter`]).
#[must_use = "the context is the thread's only while the guard lives"]
#[derive(Debug)]
pub struct TraceGuard {
    prev: Option<TraceContext>,
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        CURRENT.set(self.prev);
    }
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex(s: &[u8]) -> Option<u128> {
    s.iter().try_fold(0u128, |acc, &b| Some(acc << 4 | u128::from(hex_digit(b)?)))
}

impl TraceContext {
    /// A new trace: random non-zero trace and span ids, flags `01` (sampled).
    pub fn new_root() -> TraceContext {
        TraceContext { trace_id: fastrand::u128(1..), span_id: fastrand::u64(1..), flags: 1 }
    }

    /// The same trace and flags with a new random span id.
    pub fn child(&self) -> TraceContext {
        TraceContext { span_id: fastrand::u64(1..), ..*self }
    }

    /// The trace id (non-zero).
    pub fn trace_id(&self) -> u128 {
        self.trace_id
    }

    /// The span id (non-zero).
    pub fn span_id(&self) -> u64 {
        self.span_id
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Reads a `traceparent` value, strictly: version `00`, exactly 55 characters, lowercase
    /// hex, non-zero trace and span ids. `None` for anything else (never an error or a panic).
    pub fn parse(value: &str) -> Option<TraceContext> {
        let b = value.as_bytes();
        if b.len() != 55 || &b[..3] != b"00-" || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = hex(&b[3..35])?;
        let span_id = u64::try_from(hex(&b[36..52])?).ok()?;
        let flags = u8::try_from(hex(&b[53..55])?).ok()?;
        (trace_id != 0 && span_id != 0).then_some(TraceContext { trace_id, span_id, flags })
    }

    /// The `traceparent` value: `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
    pub fn traceparent(&self) -> String {
        format!("00-{:032x}-{:016x}-{:02x}", self.trace_id, self.span_id, self.flags)
    }

    /// Makes this the thread's current context until the guard drops: calls made meanwhile by a
    /// client with tracing on continue this trace.
    pub fn enter(self) -> TraceGuard {
        TraceGuard { prev: CURRENT.replace(Some(self)) }
    }

    /// The thread's current context: the call it serves (a server with tracing on), or one
    /// entered with [`TraceContext::enter`].
    pub fn current() -> Option<TraceContext> {
        CURRENT.get()
    }
}

/// The metadata key of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// `rpc.service` of a full method name `/pkg.Service/Method`.
fn service_of(method: &str) -> &str {
    method.trim_start_matches('/').split('/').next().unwrap_or("")
}

/// The metrics of calls, aggregated per thread and handed to the `metrics` recorder in batches
/// (Envoy's thread-local stats, flushed periodically, are the model).
///
/// A call touches only its thread's record of its method (`rec::Local`): plain loads and stores
/// of counters that thread alone writes (no atomic read-modify-write, no lock, no call into the
/// recorder), and one bucket of a log-linear duration histogram. A flusher thread (one per
/// process, started with the first record) adds what every thread's records gained since its
/// last look to the recorder's counters, gauges and histograms every [`METRICS_FLUSH_EVERY`]
/// ([`flush_metrics`] does it at once). A histogram sample is its bucket's midpoint: buckets are
/// exact below 16 ns, then 16 per power of two, so a recorded duration is within 1/32 (3.1 %)
/// of the measured one.
#[cfg(feature = "metrics")]
mod rec {
    use std::borrow::Cow;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    /// Label `code` values: the 17 gRPC codes, then `DEFERRED`.
    const CODES: usize = 18;

    /// How often the flusher hands the threads' records to the recorder.
    const FLUSH_EVERY: Duration = super::METRICS_FLUSH_EVERY;

    /// Sub-buckets per power of two of a duration in ns (and the exact buckets below them).
    const SUB: u64 = 16;
    const SUB_BITS: u32 = SUB.trailing_zeros();
    /// Durations of 2^40 ns (18 minutes) and over share the last bucket.
    const MAX_BITS: u32 = 40;
    /// Buckets of the duration histogram.
    const BUCKETS: usize = (SUB + (MAX_BITS as u64 - SUB_BITS as u64) * SUB) as usize;

    /// The bucket of a duration of `ns` nanoseconds.
    #[inline]
    pub(crate) fn bucket(ns: u64) -> usize {
        if ns < SUB {
            return ns as usize;
        }
        let exp = (63 - ns.leading_zeros()).min(MAX_BITS - 1);
        let sub = (ns.min((1 << MAX_BITS) - 1) >> (exp - SUB_BITS)) & (SUB - 1);
        (SUB + u64::from(exp - SUB_BITS) * SUB + sub) as usize
    }

    /// The duration a bucket stands for, in ns: its midpoint (its value below 16 ns).
    pub(crate) fn midpoint(bucket: usize) -> f64 {
        let b = bucket as u64;
        if b < SUB {
            return b as f64;
        }
        let shift = (b - SUB) / SUB; // exp - SUB_BITS
        let low = (SUB + (b - SUB) % SUB) << shift;
        low as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
    }

    /// The clock calls are timed with: the TSC where it is invariant (`quanta`; calibrated
    /// once per process, see [`warm`]), else the OS's monotonic clock.
    fn clock() -> &'static quanta::Clock {
        static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
        CLOCK.get_or_init(quanta::Clock::new)
    }

    /// When a call started: a raw reading of [`clock`].
    pub(crate) type Start = u64;

    /// Now.
    #[inline]
    pub(crate) fn now() -> Start {
        clock().raw()
    }

    /// Nanoseconds from `start` to now.
    #[inline]
    pub(crate) fn nanos_since(start: Start) -> u64 {
        let c = clock();
        c.delta_as_nanos(start, c.raw())
    }

    /// Calibrates the clock (once per process: a few milliseconds), so that no call pays it.
    pub(crate) fn warm() {
        let _ = clock();
    }

    /// A counter only its owner thread writes (a load and a store: no read-modify-write);
    /// the flusher reads it.
    #[derive(Default)]
    struct Own(AtomicU64);

    impl Own {
        #[inline]
        fn add(&self, n: u64) {
            self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
        }
        fn get(&self) -> u64 {
            self.0.load(Relaxed)
        }
    }

    /// One thread's record of one method on one end. Written by one thread at a time (a
    /// thread that ends returns its records to their method, for the next thread to take:
    /// they live as long as the process, as many per method as threads ever used it at once).
    pub(crate) struct Local {
        counts: Counts<Own>,
        /// Its method's record.
        method: &'static Method,
    }

    /// A record's counts: [`Own`]s in a thread's record, `u64`s in what the recorder has of it.
    #[derive(Default)]
    struct Counts<T> {
        /// Calls counted in flight, and those of them that ended.
        started: T,
        ended: T,
        req_bytes: T,
        resp_bytes: T,
        calls: [T; CODES],
        /// Calls per duration bucket ([`bucket`]).
        durations: Box<[T]>,
    }

    impl<T: Default> Counts<T> {
        fn new() -> Counts<T> {
            Counts { durations: (0..BUCKETS).map(|_| T::default()).collect(), ..Counts::default() }
        }
    }

    impl std::fmt::Debug for Local {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Local").field("method", &self.method.name).finish_non_exhaustive()
        }
    }

    impl Local {
        /// A call starts: in flight, with a request of `bytes` bytes.
        #[inline]
        pub(crate) fn start(&self, bytes: usize) {
            self.counts.started.add(1);
            self.counts.req_bytes.add(bytes as u64);
        }

        /// A request of `bytes` bytes, of a call not counted in flight.
        #[inline]
        pub(crate) fn request(&self, bytes: usize) {
            self.counts.req_bytes.add(bytes as u64);
        }

        /// A call ended with `code` (a gRPC code, or -1 for DEFERRED) after `ns` nanoseconds,
        /// with a response of `resp` bytes (`started`: counted by [`Local::start`]).
        #[inline]
        pub(crate) fn finish(&self, code: i32, started: bool, resp: usize, ns: u64) {
            let c = &self.counts;
            if started {
                c.ended.add(1);
            }
            c.calls[usize::try_from(code).unwrap_or(CODES - 1).min(CODES - 1)].add(1);
            c.resp_bytes.add(resp as u64);
            c.durations[bucket(ns)].add(1);
        }
    }

    /// What the recorder has of one of a method's [`Local`]s.
    struct Seen {
        local: &'static Local,
        counts: Counts<u64>,
    }

    /// A method on one end: its recorder handles and its threads' records.
    pub(crate) struct Method {
        /// Its key in [`METHODS`] and the threads' caches.
        key: u64,
        client: bool,
        name: Cow<'static, str>,
        in_flight: metrics::Gauge,
        req_bytes: metrics::Counter,
        resp_bytes: metrics::Counter,
        duration: metrics::Histogram,
        calls: [OnceLock<metrics::Counter>; CODES],
        locals: Mutex<Locals>,
    }

    #[derive(Default)]
    struct Locals {
        all: Vec<Seen>,
        /// Records no thread holds.
        free: Vec<&'static Local>,
    }

    impl Method {
        fn new(key: u64, client: bool, name: Cow<'static, str>) -> Method {
            let m = name.clone();
            let (g, q, r, d) = if client {
                (
                    metrics::gauge!("rpc_client_in_flight", "method" => m.clone()),
                    metrics::counter!("rpc_client_request_bytes_total", "method" => m.clone()),
                    metrics::counter!("rpc_client_response_bytes_total", "method" => m.clone()),
                    metrics::histogram!("rpc_client_duration_seconds", "method" => m),
                )
            } else {
                (
                    metrics::gauge!("rpc_server_in_flight", "method" => m.clone()),
                    metrics::counter!("rpc_server_request_bytes_total", "method" => m.clone()),
                    metrics::counter!("rpc_server_response_bytes_total", "method" => m.clone()),
                    metrics::histogram!("rpc_server_duration_seconds", "method" => m),
                )
            };
            Method {
                key,
                client,
                name,
                in_flight: g,
                req_bytes: q,
                resp_bytes: r,
                duration: d,
                calls: std::array::from_fn(|_| OnceLock::new()),
                locals: Mutex::new(Locals::default()),
            }
        }

        fn locals(&self) -> std::sync::MutexGuard<'_, Locals> {
            self.locals.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// A record for the calling thread: a free one, else a new one.
        fn take_local(&'static self) -> &'static Local {
            let mut l = self.locals();
            if let Some(local) = l.free.pop() {
                return local;
            }
            let local: &'static Local = Box::leak(Box::new(Local { counts: Counts::new(), method: self }));
            l.all.push(Seen { local, counts: Counts::new() });
            local
        }

        /// Hands what the records gained since the last flush to the recorder; returns the
        /// calls in flight.
        fn flush(&self) -> u64 {
            let mut l = self.locals();
            // A call may start on one thread and end on another: a record's ends may outnumber
            // its starts, the sum over all of them may not.
            let mut in_flight = 0u64;
            for s in &mut l.all {
                let delta = |seen: &mut u64, own: &Own| {
                    let now = own.get();
                    let d = now.wrapping_sub(*seen);
                    *seen = now;
                    d
                };
                let (own, seen) = (&s.local.counts, &mut s.counts);
                seen.started = own.started.get();
                seen.ended = own.ended.get();
                in_flight = in_flight.wrapping_add(seen.started.wrapping_sub(seen.ended));
                let d = delta(&mut seen.req_bytes, &own.req_bytes);
                if d > 0 {
                    self.req_bytes.increment(d);
                }
                let d = delta(&mut seen.resp_bytes, &own.resp_bytes);
                if d > 0 {
                    self.resp_bytes.increment(d);
                }
                for (code, (seen, own)) in seen.calls.iter_mut().zip(&own.calls).enumerate() {
                    let d = delta(seen, own);
                    if d > 0 {
                        self.calls[code].get_or_init(|| self.calls_counter(code)).increment(d);
                    }
                }
                for (b, (seen, own)) in seen.durations.iter_mut().zip(own.durations.iter()).enumerate() {
                    let d = delta(seen, own);
                    if d > 0 {
                        self.duration.record_many(midpoint(b) * 1e-9, d as usize);
                    }
                }
            }
            let in_flight = (in_flight as i64).max(0) as u64;
            self.in_flight.set(in_flight as f64);
            in_flight
        }

        /// The counter of calls that ended with code number `code`.
        fn calls_counter(&self, code: usize) -> metrics::Counter {
            let name = match u8::try_from(code).ok().and_then(crate::status::Code::from_u8) {
                Some(c) => c.as_str(),
                None => "DEFERRED",
            };
            let m = self.name.clone();
            if self.client {
                metrics::counter!("rpc_client_calls_total", "method" => m, "code" => name)
            } else {
                metrics::counter!("rpc_server_calls_total", "method" => m, "code" => name)
            }
        }
    }

    /// Hashes the cache's keys with one multiply (SipHash would cost more than the records).
    #[derive(Default)]
    struct KeyHasher(u64);

    impl std::hash::Hasher for KeyHasher {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.write_u64(u64::from(b));
            }
        }
        fn write_u64(&mut self, i: u64) {
            self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    type Map<V> = HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

    /// Every method's record, by key (see [`local`]), and the flusher's list of them.
    static METHODS: Mutex<Option<Map<&'static Method>>> = Mutex::new(None);
    static ALL: Mutex<Vec<&'static Method>> = Mutex::new(Vec::new());

    /// A thread's records, by key; given back to their methods when the thread ends.
    #[derive(Default)]
    struct Cache {
        /// The last one looked up (a thread usually calls one method after another).
        last: Cell<Option<(u64, &'static Local)>>,
        map: RefCell<Map<&'static Local>>,
    }

    impl Drop for Cache {
        fn drop(&mut self) {
            for (_, local) in self.map.get_mut().drain() {
                local.method.locals().free.push(local);
            }
        }
    }

    thread_local! {
        static CACHE: Cache = Cache::default();
    }

    /// The calling thread's record of method `key` on the client (`client`) or server end;
    /// `name` gives the method's label the first time.
    #[inline]
    pub(crate) fn local(client: bool, key: u64, name: impl FnOnce() -> Cow<'static, str>) -> &'static Local {
        let key = key ^ (u64::from(client) << 63);
        match cached(key) {
            Ok(Some(l)) => l,
            Ok(None) => register(client, key, name, true),
            // The thread is ending (a record made by a thread-local's destructor): a record of
            // its own, never given back.
            Err(_) => register(client, key, name, false),
        }
    }

    /// The calling thread's record of `key` if it has one (`Err`: the thread is ending).
    #[inline]
    fn cached(key: u64) -> Result<Option<&'static Local>, std::thread::AccessError> {
        CACHE.try_with(|c| match c.last.get() {
            Some((k, l)) if k == key => Some(l),
            _ => {
                let l = c.map.borrow().get(&key).copied();
                if let Some(l) = l {
                    c.last.set(Some((key, l)));
                }
                l
            }
        })
    }

    impl Local {
        /// The calling thread's record of this record's method (a call that ends on another
        /// thread than the one it started on records its end there: each record has one
        /// writer).
        #[inline]
        pub(crate) fn mine(&'static self) -> &'static Local {
            let m = self.method;
            match cached(m.key) {
                Ok(Some(l)) => l,
                Ok(None) => register(m.client, m.key, || m.name.clone(), true),
                Err(_) => register(m.client, m.key, || m.name.clone(), false),
            }
        }
    }

    /// [`local()`] on the thread's first call of the method.
    #[cold]
    #[inline(never)]
    fn register(
        client: bool,
        key: u64,
        name: impl FnOnce() -> Cow<'static, str>,
        cache: bool,
    ) -> &'static Local {
        let method = *METHODS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Map::default)
            .entry(key)
            .or_insert_with(|| {
                let name = name();
                let mut all = ALL.lock().unwrap_or_else(|e| e.into_inner());
                // One record per label: a second key of the same method (a server's name
                // string at another address) shares it, so their in-flight gauge is one sum.
                if let Some(m) = all.iter().find(|m| m.client == client && m.name == name) {
                    return m;
                }
                let m: &'static Method = Box::leak(Box::new(Method::new(key, client, name)));
                if all.is_empty() {
                    start_flusher();
                }
                all.push(m);
                m
            });
        let local = method.take_local();
        if cache {
            let _ = CACHE.try_with(|c| {
                c.map.borrow_mut().insert(key, local);
                c.last.set(Some((key, local)));
            });
        }
        local
    }

    /// The flusher thread: [`flush`] every [`FLUSH_EVERY`].
    fn start_flusher() {
        let spawned = std::thread::Builder::new().name("rpc-metrics".into()).spawn(|| loop {
            std::thread::sleep(FLUSH_EVERY);
            flush();
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no metrics flusher thread: records reach the recorder at flush_metrics() only");
        }
    }

    /// Hands every thread's records to the recorder now.
    pub(crate) fn flush() {
        let methods: Vec<&'static Method> = ALL.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for m in methods {
            m.flush();
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_duration_lands_in_a_bucket_whose_midpoint_is_within_a_32nd() {
            assert_eq!(bucket(0), 0);
            assert_eq!(bucket(15), 15);
            assert_eq!(bucket(16), 16);
            let mut last = 0;
            for ns in 0..100_000u64 {
                let b = bucket(ns);
                assert!(b >= last, "{ns} ns: bucket {b} below {last}");
                last = b;
            }
            for ns in (0..100_000u64).chain((0..MAX_BITS).map(|s| (1u64 << s) * 3 / 2)).chain([u64::MAX]) {
                let b = bucket(ns);
                assert!(b < BUCKETS, "{ns} ns: bucket {b}");
                if ns < 1 << MAX_BITS {
                    let mid = midpoint(b);
                    assert!(
                        (mid - ns as f64).abs() <= ns as f64 / 32.0,
                        "{ns} ns: bucket {b}, midpoint {mid}"
                    );
                }
            }
            assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        }

        /// The record of `key` (a client method) that thread `name` used.
        fn on_thread(key: u64, f: impl FnOnce(&'static Local) + Send + 'static) -> usize {
            std::thread::spawn(move || {
                let l = local(true, key, || "/test.Rec/M".into());
                f(l);
                l as *const Local as usize
            })
            .join()
            .unwrap()
        }

        #[test]
        fn a_call_that_ends_on_another_thread_leaves_nothing_in_flight_and_records_outlive_threads() {
            let key = 0x5eed_0001;
            // Starts on one thread, ends on another: each thread writes its own record.
            let (tx, rx) = std::sync::mpsc::channel();
            let first = on_thread(key, move |l| {
                l.start(10);
                tx.send(l).unwrap();
            });
            let method = rx.recv().unwrap().method;
            assert_eq!(method.flush(), 1, "one call in flight");
            let second = on_thread(key, move |l| {
                let started = METHODS.lock().unwrap().as_ref().unwrap()[&(key ^ 1 << 63)];
                assert!(std::ptr::eq(started, l.method));
                l.finish(0, true, 5, 1_000);
            });
            // The first thread ended before the second began: its record went back to the
            // method, and the second thread took it (a call's end on another thread than its
            // start is still counted once).
            assert_eq!(first, second, "a thread's record is reused by the next thread");
            assert_eq!(method.flush(), 0, "the call ended on another thread");
            let l = method.locals();
            assert_eq!(l.all.len(), 1);
            assert_eq!(l.free.len(), 1);
            let c = &l.all[0].counts;
            assert_eq!((c.started, c.ended, c.req_bytes, c.resp_bytes, c.calls[0]), (1, 1, 10, 5, 1));
            assert_eq!(c.durations[bucket(1_000)], 1);
            drop(l);
            // Two threads at once: two records.
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let (started, is_started) = std::sync::mpsc::channel::<()>();
            let a = std::thread::spawn(move || {
                let l = local(true, key, || "/test.Rec/M".into());
                l.start(1);
                started.send(()).unwrap();
                wait.recv().unwrap();
                l.finish(0, true, 0, 1);
            });
            is_started.recv().unwrap();
            on_thread(key, |l| l.start(1));
            assert_eq!(method.flush(), 2);
            go.send(()).unwrap();
            a.join().unwrap();
            assert_eq!(method.flush(), 1, "one call never ended");
            assert_eq!(method.locals().all.len(), 2);
        }

        #[test]
        fn two_keys_of_one_label_share_one_method_record() {
            let a = local(false, 0x5eed_0002, || "/test.Rec/Same".into());
            let b = local(false, 0x5eed_0003, || "/test.Rec/Same".into());
            assert!(std::ptr::eq(a.method, b.method), "one in-flight gauge per label");
            let c = local(true, 0x5eed_0004, || "/test.Rec/Same".into());
            assert!(!std::ptr::eq(a.method, c.method), "the client end is another series");
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod rec {
    use std::borrow::Cow;

    #[derive(Debug)]
    pub(crate) struct Local;

    /// No clock without metrics: a start is nothing (a type of its own, not `()`, so passing
    /// one is not a unit argument).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Start;

    pub(crate) fn now() -> Start {
        Start
    }

    pub(crate) fn nanos_since(_: Start) -> u64 {
        0
    }

    pub(crate) fn warm() {}

    pub(crate) fn flush() {}

    pub(crate) fn local(_: bool, _: u64, _: impl FnOnce() -> Cow<'static, str>) -> &'static Local {
        &Local
    }

    impl Local {
        pub(crate) fn mine(&'static self) -> &'static Local {
            self
        }
        pub(crate) fn start(&self, _: usize) {}
        pub(crate) fn request(&self, _: usize) {}
        pub(crate) fn finish(&self, _: i32, _: bool, _: usize, _: u64) {}
    }
}

/// The label of client method `id`: the name a generated stub registered, else the id in hex.
fn method_label(id: MethodId) -> std::borrow::Cow<'static, str> {
    match crate::client::names::method_name(id) {
        Some(n) => n.into(),
        None => format!("{id:#010x}").into(),
    }
}

/// One observed call, on either end: its span and trace context (tracing on), its method's
/// metrics and its start (metrics on).
#[derive(Debug)]
pub(crate) struct Observed {
    /// Tracing's part (`None`: tracing off).
    traced: Option<Box<Traced>>,
    /// The call's metrics (`None`: metrics off).
    metered: Option<Metered>,
    /// The request's message bytes.
    req_bytes: usize,
    /// Recorded its end (else its drop records CANCELLED: a dropped future).
    finished: bool,
}

/// The metrics of an observed call.
#[derive(Debug)]
struct Metered {
    /// When the call started.
    start: rec::Start,
    /// The thread's record of its method.
    local: &'static rec::Local,
    /// Counted in flight ([`Observed::sent`], [`Observed::in_flight`]).
    counted: bool,
}

/// The tracing of an observed call.
#[derive(Debug)]
struct Traced {
    span: tracing::Span,
    /// The thread's trace context while the handler runs (server).
    trace: Option<TraceContext>,
}

impl Drop for Observed {
    fn drop(&mut self) {
        if !self.finished {
            self.finish_code(Code::Cancelled as i32, 0);
        }
    }
}

impl Observed {
    /// A client call of `id` starting: with tracing, its `traceparent` goes into `md`.
    #[inline]
    pub(crate) fn client(
        o: Observe,
        id: MethodId,
        md: &mut Metadata,
        req_bytes: usize,
        peer: impl FnOnce() -> Option<SocketAddr>,
    ) -> Observed {
        let traced = if o.is_tracing() { Some(Self::client_span(id, md, req_bytes, peer())) } else { None };
        // The clock and the thread's record are read here: the rest waits for the request to be
        // on its way.
        let metered = o.is_metrics().then(|| Metered {
            start: rec::now(),
            local: rec::local(true, u64::from(id), || method_label(id)),
            counted: false,
        });
        Observed { traced, metered, req_bytes, finished: false }
    }

    /// [`Observed::client`]'s span and trace context (its `traceparent` into `md`).
    #[cold]
    #[inline(never)]
    fn client_span(
        id: MethodId,
        md: &mut Metadata,
        req_bytes: usize,
        peer: Option<SocketAddr>,
    ) -> Box<Traced> {
        let name = method_label(id);
        let parent = TraceContext::current();
        let tc = parent.map_or_else(TraceContext::new_root, |p| p.child());
        md.remove(TRACEPARENT);
        // Lowercase hex and dashes: always a valid ASCII value.
        let _ = md.insert(TRACEPARENT, &tc.traceparent());
        let span = tracing::info_span!(
            "rpc.client",
            otel.kind = "client",
            rpc.system = "rdma-rpc",
            rpc.service = service_of(&name),
            rpc.method = &*name,
            rpc.grpc.status_code = tracing::field::Empty,
            rpc.request.size = req_bytes,
            rpc.response.size = tracing::field::Empty,
            network.peer.address = peer.map(tracing::field::display),
            trace_id = %format_args!("{:032x}", tc.trace_id),
            span_id = %format_args!("{:016x}", tc.span_id),
            parent_span_id = parent.map(|p| tracing::field::display(format!("{:016x}", p.span_id))),
        );
        Box::new(Traced { span, trace: None })
    }

    /// A server call of `method` (full name) starting, with the request's metadata: with
    /// tracing, its context continues the client's `traceparent` when valid.
    #[inline]
    pub(crate) fn server(
        o: Observe,
        method: &'static str,
        md: &Metadata,
        req_bytes: usize,
        peer: &SocketAddr,
    ) -> Observed {
        let traced = if o.is_tracing() { Some(Self::server_span(method, md, req_bytes, peer)) } else { None };
        // Only the clock is read here: an inline handler's call is recorded whole once its
        // answer is posted; an async handler's counts in flight once its task takes it
        // ([`Observed::in_flight`]).
        let metered = o.is_metrics().then(|| Metered {
            start: rec::now(),
            // Keyed by the name's address: one static string per served method.
            local: rec::local(false, method.as_ptr() as u64, || std::borrow::Cow::Borrowed(method)),
            counted: false,
        });
        Observed { traced, metered, req_bytes, finished: false }
    }

    /// [`Observed::server`]'s span and trace context.
    #[cold]
    #[inline(never)]
    fn server_span(method: &'static str, md: &Metadata, req_bytes: usize, peer: &SocketAddr) -> Box<Traced> {
        let parent = md.get(TRACEPARENT).and_then(TraceContext::parse);
        let tc = parent.map_or_else(TraceContext::new_root, |p| p.child());
        let span = tracing::info_span!(
            "rpc.server",
            otel.kind = "server",
            rpc.system = "rdma-rpc",
            rpc.service = service_of(method),
            rpc.method = method,
            rpc.grpc.status_code = tracing::field::Empty,
            rpc.request.size = req_bytes,
            rpc.response.size = tracing::field::Empty,
            network.peer.address = %peer,
            trace_id = %format_args!("{:032x}", tc.trace_id),
            span_id = %format_args!("{:016x}", tc.span_id),
            parent_span_id = parent.map(|p| tracing::field::display(format!("{:016x}", p.span_id))),
        );
        Box::new(Traced { span, trace: Some(tc) })
    }

    /// A client call's request is on its way (or about to be): it counts as in flight and its
    /// request bytes are counted. Called where the caller waits anyway (an async call's first
    /// pending poll: after its request is posted). Idempotent.
    #[inline]
    pub(crate) fn sent(&mut self) {
        self.in_flight();
    }

    /// The call counts as in flight from now until it ends (a server call an async handler's
    /// task takes; a client call once sent), its request bytes counted. Idempotent.
    #[inline]
    pub(crate) fn in_flight(&mut self) {
        if let Some(m) = &mut self.metered {
            if !m.counted {
                m.counted = true;
                m.local.mine().start(self.req_bytes);
            }
        }
    }

    /// Enters the span (a handle of it: the `Observed` may move meanwhile) and makes the
    /// call's trace context the thread's, until dropped.
    /// Nothing with tracing off.
    #[inline]
    pub(crate) fn enter(&self) -> Option<(tracing::span::EnteredSpan, Option<TraceGuard>)> {
        let t = self.traced.as_deref()?;
        Some(Self::enter_traced(t))
    }

    /// [`Observed::enter`] with tracing on.
    #[cold]
    #[inline(never)]
    fn enter_traced(t: &Traced) -> (tracing::span::EnteredSpan, Option<TraceGuard>) {
        (t.span.clone().entered(), t.trace.map(TraceContext::enter))
    }

    /// Tracing is on: the call's metadata carries a `traceparent` (client end).
    #[inline]
    pub(crate) fn traced(&self) -> bool {
        self.traced.is_some()
    }

    /// The call ended with `code` and a response of `resp_bytes` (0 for an error).
    #[inline]
    pub(crate) fn finish(mut self, code: Code, resp_bytes: usize) {
        self.finish_code(code as i32, resp_bytes);
    }

    /// The call ended with `result`, whose message is `resp_bytes` long when it is one.
    pub(crate) fn finish_with<T>(
        self,
        result: &Result<T, crate::Status>,
        resp_bytes: impl FnOnce(&T) -> usize,
    ) {
        match result {
            Ok(v) => self.finish(Code::Ok, resp_bytes(v)),
            Err(s) => self.finish(s.code(), 0),
        }
    }

    /// The handler deferred its answer (see the module docs).
    pub(crate) fn finish_deferred(mut self) {
        self.finish_code(-1, 0);
    }

    /// The call ended with `code` (-1: DEFERRED).
    fn finish_code(&mut self, code: i32, resp_bytes: usize) {
        self.finished = true;
        if let Some(t) = self.traced.as_deref().filter(|_| code >= 0) {
            t.span.record("rpc.grpc.status_code", code);
            t.span.record("rpc.response.size", resp_bytes);
        }
        if let Some(m) = self.metered.take() {
            let ns = rec::nanos_since(m.start);
            let local = m.local.mine();
            if !m.counted {
                // Never counted in flight (an inline handler's call, ended after its answer
                // left): its in-flight count would go up and down at once, so it stays.
                local.request(self.req_bytes);
            }
            local.finish(code, m.counted, resp_bytes, ns);
        }
    }
}

/// A client call timed start to end on one thread, with metrics on and tracing off (a
/// blocking call): what an [`Observed`] records of it, with nothing to move between threads
/// (its record is the calling thread's at both ends). Counted in flight from
/// [`Timed::client`]; dropped unfinished (a panic unwinding through the call), it records
/// CANCELLED.
#[derive(Debug)]
pub(crate) struct Timed {
    local: &'static rec::Local,
    start: rec::Start,
}

impl Timed {
    /// A call of `id` with a request of `req_bytes` message bytes is about to be sent.
    #[inline]
    pub(crate) fn client(id: MethodId, req_bytes: usize) -> Timed {
        let local = rec::local(true, u64::from(id), || method_label(id));
        local.start(req_bytes);
        Timed { local, start: rec::now() }
    }

    /// The call ended with `result`, whose message is `resp_bytes` long when it is one.
    #[inline]
    pub(crate) fn finish_with<T>(
        self,
        result: &Result<T, crate::Status>,
        resp_bytes: impl FnOnce(&T) -> usize,
    ) {
        let (code, resp) = match result {
            Ok(v) => (Code::Ok, resp_bytes(v)),
            Err(s) => (s.code(), 0),
        };
        let t = std::mem::ManuallyDrop::new(self);
        t.local.finish(code as i32, true, resp, rec::nanos_since(t.start));
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.local.finish(Code::Cancelled as i32, true, 0, rec::nanos_since(self.start));
    }
}

/// A server call's start with metrics on and tracing off: the clock read and what its record
/// needs, with no [`Observed`] made unless something takes the call off the worker (an async
/// handler's task, a deferred answer: [`ServerStart::observed`]); else the worker records the
/// call whole once its answer is posted ([`ServerStart::finish`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ServerStart {
    start: rec::Start,
    method: &'static str,
    req_bytes: usize,
}

impl ServerStart {
    /// A call of `method` (full name) with a request of `req_bytes` message bytes starts.
    #[inline]
    pub(crate) fn now(method: &'static str, req_bytes: usize) -> ServerStart {
        ServerStart { start: rec::now(), method, req_bytes }
    }

    /// The calling thread's record of its method (keyed by the name's address, as
    /// [`Observed::server`]'s).
    #[inline]
    fn local(&self) -> &'static rec::Local {
        let method = self.method;
        rec::local(false, method.as_ptr() as u64, || std::borrow::Cow::Borrowed(method))
    }

    /// The call as an [`Observed`] (what [`Observed::server`] would have made at its start).
    pub(crate) fn observed(self) -> Observed {
        let metered = Metered { start: self.start, local: self.local(), counted: false };
        Observed { traced: None, metered: Some(metered), req_bytes: self.req_bytes, finished: false }
    }

    /// The call ended with `code` and a response of `resp_bytes` (its answer posted; never
    /// counted in flight).
    #[inline]
    pub(crate) fn finish(self, code: Code, resp_bytes: usize) {
        let local = self.local();
        local.request(self.req_bytes);
        local.finish(code as i32, false, resp_bytes, rec::nanos_since(self.start));
    }
}

/// Hands every thread's metrics records to the `metrics` recorder now (see the
/// [module docs](self)): what calls recorded reaches the recorder within
/// [`METRICS_FLUSH_EVERY`] anyway; call this before reading the recorder when it must hold
/// everything recorded so far (a test, a last scrape before exit). A no-op without the
/// `metrics` feature or before any call was recorded.
pub fn flush_metrics() {
    rec::flush();
}

/// Histogram bucket bounds for `rpc_*_duration_seconds`, in seconds: 1, 2.5 and 5 per decade
/// from 1 µs to 10 s (22 bounds). For a recorder that takes bucket bounds, such as the
/// Prometheus exporter's `PrometheusBuilder::set_buckets` (whose default, a summary, costs
/// more per sample and cannot be aggregated across processes).
pub const DURATION_BUCKETS: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How often the records calls make reach the `metrics` recorder (100 ms; see
/// [`flush_metrics`]).
pub const METRICS_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parses_strictly_and_round_trips() {
        let tc = TraceContext::new_root();
        assert_ne!(tc.trace_id(), 0);
        let s = tc.traceparent();
        assert_eq!(s.len(), 55);
        assert_eq!(TraceContext::parse(&s), Some(tc));
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = TraceContext::parse(good).unwrap();
        assert_eq!(p.trace_id(), 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(p.span_id(), 0x00f067aa0ba902b7);
        assert_eq!(p.flags(), 1);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
        assert_eq!(TraceContext::current(), None);
        {
            let _g = p.enter();
            assert_eq!(TraceContext::current(), Some(p));
        }
        assert_eq!(TraceContext::current(), None);
    }
}
