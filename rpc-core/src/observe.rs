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
//! Durations are read from the TSC
//! clock the Prometheus exporter uses too (`quanta`; calibrated once per process, when
//! `Observe::metrics(true)` is first built). What a call records stays off its latency where it
//! can: a client call counts in flight (and its request bytes) once its request is posted (an
//! async call at its first pending poll, while it waits; a blocking one just before it sends);
//! a server records an inline handler's call after its answer is posted, in one go, so
//! `rpc_server_in_flight` counts the calls async handlers' tasks, deferred answers and streams
//! hold (an inline handler's call
//! is answered before the worker looks at anything else), and a server's last record may land a
//! moment after its client has the answer.
//!
//! Scope: every call, unary or
//! streaming, of the blocking `Client` and of the `Channel`, and on the server every call of a
//! served method: inline and async handlers, a deferred answer (its record ends when its
//! `Responder` answers, or when the call ends without it: cancelled, expired, its session
//! closed), a stream (ended by its final status), and a call refused before its handler ran
//! (draining, refused metadata, a passed deadline, the interceptor's refusal: its code, no
//! handler). A stream's response size is the bytes of the messages the client took (the
//! client end) or 0 (the server end); a stream the client drops before its end is CANCELLED.
//! On the `Channel`, spans have no `network.peer.address` (a channel may reach several
//! servers).

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

/// The metrics of one method on one end, registered once per process and method and kept for
/// the process's life (one small record per method and end: no reference count touched per
/// call), found through a per-thread cache (a call then touches its handles: no key built, no
/// registry lookup, no lock).
#[cfg(feature = "metrics")]
mod rec {
    use std::borrow::Cow;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    /// Label `code` values: the 17 gRPC codes, then `DEFERRED`.
    const CODES: usize = 18;

    /// When a call started: the TSC clock the recorder's histograms use too (cheaper to read
    /// than the system clock; calibrated once per process, see [`warm`]).
    pub(crate) type Start = quanta::Instant;

    /// Now.
    #[inline]
    pub(crate) fn now() -> Start {
        quanta::Instant::now()
    }

    /// Seconds from `start` to now.
    #[inline]
    pub(crate) fn secs_since(start: Start) -> f64 {
        quanta::Instant::now().saturating_duration_since(start).as_secs_f64()
    }

    /// Calibrates the clock (once per process: a few milliseconds), so that no call pays it.
    pub(crate) fn warm() {
        let _ = quanta::Instant::now();
    }

    #[derive(Debug)]
    pub(crate) struct Handles {
        client: bool,
        method: Cow<'static, str>,
        in_flight: metrics::Gauge,
        req_bytes: metrics::Counter,
        resp_bytes: metrics::Counter,
        duration: metrics::Histogram,
        calls: [OnceLock<metrics::Counter>; CODES],
    }

    /// Hashes the cache's small keys with one multiply (SipHash would cost more than the
    /// metrics themselves).
    #[derive(Default)]
    pub(crate) struct KeyHasher(u64);

    impl std::hash::Hasher for KeyHasher {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.write_u64(u64::from(b));
            }
        }
        fn write_u8(&mut self, i: u8) {
            self.write_u64(u64::from(i));
        }
        fn write_u64(&mut self, i: u64) {
            self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    type Map = HashMap<(bool, u64), &'static Handles, std::hash::BuildHasherDefault<KeyHasher>>;

    /// Every method's handles, per end (taken on a thread's first call of a method).
    static ALL: Mutex<Option<Map>> = Mutex::new(None);

    thread_local! {
        /// The thread's copy of the entries of `ALL` it used.
        static CACHE: RefCell<Map> = RefCell::new(Map::default());
    }

    /// The handles of the method `key` on the client (`client`) or server end; `name` gives its
    /// label the first time.
    #[inline]
    pub(crate) fn handles(
        client: bool,
        key: u64,
        name: impl FnOnce() -> Cow<'static, str>,
    ) -> &'static Handles {
        let found = CACHE.with(|c| c.borrow().get(&(client, key)).copied());
        match found {
            Some(h) => h,
            None => register(client, key, name),
        }
    }

    /// [`handles`] on the thread's first call of the method.
    #[cold]
    #[inline(never)]
    fn register(client: bool, key: u64, name: impl FnOnce() -> Cow<'static, str>) -> &'static Handles {
        let h = *ALL
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Map::default)
            .entry((client, key))
            .or_insert_with(|| Box::leak(Box::new(Handles::new(client, name()))));
        CACHE.with(|c| c.borrow_mut().insert((client, key), h));
        h
    }

    impl Handles {
        fn new(client: bool, method: Cow<'static, str>) -> Handles {
            let m = method.clone();
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
            Handles {
                client,
                method,
                in_flight: g,
                req_bytes: q,
                resp_bytes: r,
                duration: d,
                calls: std::array::from_fn(|_| OnceLock::new()),
            }
        }

        /// A call starts: in flight.
        pub(crate) fn start(&self) {
            self.in_flight.increment(1.0);
        }

        /// A call's request of `bytes` bytes.
        pub(crate) fn request(&self, bytes: usize) {
            self.req_bytes.increment(bytes as u64);
        }

        /// A call ended (`started`: counted in flight by [`Handles::start`]). `code`: a gRPC
        /// code, or -1 for DEFERRED.
        pub(crate) fn finish(&self, code: i32, name: &'static str, started: bool, resp: usize, secs: f64) {
            if started {
                self.in_flight.decrement(1.0);
            }
            let i = usize::try_from(code).unwrap_or(CODES - 1).min(CODES - 1);
            self.calls[i]
                .get_or_init(|| {
                    let m = self.method.clone();
                    if self.client {
                        metrics::counter!("rpc_client_calls_total", "method" => m, "code" => name)
                    } else {
                        metrics::counter!("rpc_server_calls_total", "method" => m, "code" => name)
                    }
                })
                .increment(1);
            self.resp_bytes.increment(resp as u64);
            self.duration.record(secs);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod rec {
    use std::borrow::Cow;

    #[derive(Debug)]
    pub(crate) struct Handles;

    pub(crate) type Start = ();

    pub(crate) fn now() -> Start {}

    pub(crate) fn secs_since(_: Start) -> f64 {
        0.0
    }

    pub(crate) fn warm() {}

    pub(crate) fn handles(_: bool, _: u64, _: impl FnOnce() -> Cow<'static, str>) -> &'static Handles {
        &Handles
    }

    impl Handles {
        pub(crate) fn start(&self) {}
        pub(crate) fn request(&self, _: usize) {}
        pub(crate) fn finish(&self, _: i32, _: &'static str, _: bool, _: usize, _: f64) {}
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
    /// Its method's handles, once it counts as in flight ([`Observed::sent`],
    /// [`Observed::in_flight`]).
    handles: Option<&'static rec::Handles>,
    /// Its method.
    method: Method,
}

/// The method of a metered call: its id on the client end, its full name on the server's.
#[derive(Debug, Clone, Copy)]
enum Method {
    Client(MethodId),
    Server(&'static str),
}

impl Method {
    /// Its handles.
    fn handles(self) -> &'static rec::Handles {
        match self {
            Method::Client(id) => {
                rec::handles(true, u64::from(id), || match crate::client::names::method_name(id) {
                    Some(n) => n.into(),
                    None => format!("{id:#010x}").into(),
                })
            }
            // Keyed by the name's address: one static string per served method.
            Method::Server(name) => {
                rec::handles(false, name.as_ptr() as u64, || std::borrow::Cow::Borrowed(name))
            }
        }
    }
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
            self.finish_named(Code::Cancelled as i32, Code::Cancelled.as_str(), 0);
        }
    }
}

impl Observed {
    /// A client call of `id` starting: with tracing, its `traceparent` goes into `md`.
    #[cold]
    pub(crate) fn client(
        o: Observe,
        id: MethodId,
        md: &mut Metadata,
        req_bytes: usize,
        peer: Option<SocketAddr>,
    ) -> Observed {
        let name = || -> std::borrow::Cow<'static, str> {
            match crate::client::names::method_name(id) {
                Some(n) => n.into(),
                None => format!("{id:#010x}").into(),
            }
        };
        let traced = o.is_tracing().then(|| {
            let name = name();
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
        });
        // Only the clock is read here: the rest waits for the request to be on its way.
        let metered =
            o.is_metrics().then(|| Metered { start: rec::now(), handles: None, method: Method::Client(id) });
        Observed { traced, metered, req_bytes, finished: false }
    }

    /// A server call of `method` (full name) starting, with the request's metadata: with
    /// tracing, its context continues the client's `traceparent` when valid.
    #[cold]
    pub(crate) fn server(
        o: Observe,
        method: &'static str,
        md: &Metadata,
        req_bytes: usize,
        peer: SocketAddr,
    ) -> Observed {
        let traced = o.is_tracing().then(|| {
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
        });
        // Only the clock is read here: an inline handler's call is recorded whole once its
        // answer is posted; an async handler's counts in flight once its task takes it
        // ([`Observed::in_flight`]).
        let metered = o.is_metrics().then(|| Metered {
            start: rec::now(),
            handles: None,
            method: Method::Server(method),
        });
        Observed { traced, metered, req_bytes, finished: false }
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
            if m.handles.is_none() {
                Self::count_in_flight(m, self.req_bytes);
            }
        }
    }

    /// [`Observed::in_flight`]'s first time.
    #[cold]
    #[inline(never)]
    fn count_in_flight(m: &mut Metered, req_bytes: usize) {
        let h = m.method.handles();
        h.start();
        h.request(req_bytes);
        m.handles = Some(h);
    }

    /// Enters the span (a handle of it: the `Observed` may move meanwhile) and makes the
    /// call's trace context the thread's, until dropped.
    /// Nothing with tracing off.
    pub(crate) fn enter(&self) -> Option<(tracing::span::EnteredSpan, Option<TraceGuard>)> {
        let t = self.traced.as_deref()?;
        Some((t.span.clone().entered(), t.trace.map(TraceContext::enter)))
    }

    /// Tracing is on: the call's metadata carries a `traceparent` (client end).
    pub(crate) fn traced(&self) -> bool {
        self.traced.is_some()
    }

    /// The call ended with `code` and a response of `resp_bytes` (0 for an error).
    pub(crate) fn finish(mut self, code: Code, resp_bytes: usize) {
        self.finish_named(code as i32, code.as_str(), resp_bytes);
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
        self.finish_named(-1, "DEFERRED", 0);
    }

    fn finish_named(&mut self, code: i32, name: &'static str, resp_bytes: usize) {
        self.finished = true;
        if let Some(t) = self.traced.as_deref().filter(|_| code >= 0) {
            t.span.record("rpc.grpc.status_code", code);
            t.span.record("rpc.response.size", resp_bytes);
        }
        if let Some(m) = self.metered.take() {
            let secs = rec::secs_since(m.start);
            match m.handles {
                Some(h) => h.finish(code, name, true, resp_bytes, secs),
                // Never counted in flight (an inline handler's call, ended after its answer
                // left): its in-flight count would go up and down at once, so it stays.
                None => {
                    let h = m.method.handles();
                    h.request(self.req_bytes);
                    h.finish(code, name, false, resp_bytes, secs);
                }
            }
        }
    }
}

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
