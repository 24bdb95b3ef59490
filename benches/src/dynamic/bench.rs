//! `rpc-perf bench`: many calls of one unary method, closed loop (`-c` in flight) or open loop
//! (`--rate`), printed as the perftest-style tables of the other RPC tests plus status counts.
//!
//! The dynamic part stays out of the measurement: each distinct payload is encoded once before
//! the run and every call copies its bytes into the send buffer (what a generated message of one
//! `bytes` field costs too); replies are only measured unless `--check`. One clock read per
//! completion: in closed loop the call that replaces a finished one starts at that same instant.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor};
use rpc_core::{CallOptions, Client, Code, Status};
use serde::Serialize;

use super::args::BenchArgs;
use super::body::{EncodedRequest, ReplyBytes, ReplyLen};
use super::json::{self, Payload};
use super::schema::UnaryMethod;
use crate::cli::{Limit, PollKind};
use crate::error::PerfError;
use crate::progress::Progress;
use crate::report;
use crate::stats::{BandwidthSummary, LatencyRecorder, LatencySummary, PeakWindow};

/// Number of status codes (`Code` values 0..=16).
const CODES: usize = 17;
/// Completions between two progress-bar and peak-rate samples.
const SAMPLE_EVERY: u64 = 256;

/// What one run is asked to do.
pub struct Plan<'a> {
    /// The method.
    pub method: &'a UnaryMethod,
    /// Request bodies, sent round-robin.
    pub payloads: &'a [Payload],
    /// Calls in flight at most.
    pub concurrency: u32,
    /// Measured calls or duration.
    pub limit: Limit,
    /// Unmeasured calls first (after the probe).
    pub warmup: u64,
    /// Open loop at this many calls per second; `None` = closed loop.
    pub rate: Option<f64>,
    /// Deadline of each call.
    pub deadline: Option<Duration>,
    /// Decode every reply as `method.output`.
    pub check: bool,
    /// How the loop waits when nothing is due (open loop only).
    pub poll: PollKind,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Round trips of the calls answered OK, in ns (open loop: from the intended start).
    pub latency: LatencyRecorder,
    /// Measured calls finished (any status).
    pub calls: u64,
    /// Measured calls per status code, indexed by the code's number.
    pub by_code: [u64; CODES],
    /// One message per non-OK code seen (the first).
    pub messages: BTreeMap<Code, String>,
    /// OK replies that did not decode as the output message (`--check`; counted as INTERNAL too).
    pub undecodable: u64,
    /// Calls and payload bytes (request + reply, OK calls) per second over the run.
    pub bandwidth: BandwidthSummary,
    /// Calls started later than intended by more than 1 ms (open loop: window full or the client
    /// too slow for the rate).
    pub late_starts: u64,
    /// Open loop with `-D`: calls due before the end that were never started (the server or the
    /// client could not keep up with the rate).
    pub unsent: u64,
}

impl Outcome {
    /// Calls that ended with `code`.
    pub fn count(&self, code: Code) -> u64 {
        self.by_code[code as usize]
    }

    /// `OK 99990, NOT_FOUND 10` (codes seen only, in code order).
    pub fn status_line(&self) -> String {
        let parts: Vec<String> = (0..CODES as u8)
            .filter(|&c| self.by_code[c as usize] > 0)
            .map(|c| format!("{} {}", Code::from_u8(c).unwrap_or(Code::Unknown), self.by_code[c as usize]))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// What a reply is taken as: only its length, or its bytes to decode.
trait Taken: Message + Default {
    /// Body bytes.
    fn len(&self) -> usize;
    /// Whether it decodes as `desc` (always true when not kept).
    fn decodes(&self, desc: &MessageDescriptor) -> bool;
}

impl Taken for ReplyLen {
    fn len(&self) -> usize {
        self.0
    }
    fn decodes(&self, _desc: &MessageDescriptor) -> bool {
        true
    }
}

impl Taken for ReplyBytes {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn decodes(&self, desc: &MessageDescriptor) -> bool {
        DynamicMessage::decode(desc.clone(), &self.0[..]).is_ok()
    }
}

/// One blocking call of payload 0 before anything else: checks the method is served and the
/// connection works.
///
/// # Errors
/// One-line [`PerfError`] for UNIMPLEMENTED (the server does not serve the method) and
/// UNAVAILABLE (the connection failed); other statuses are the application's and are counted.
pub fn probe(client: &Client, plan: &Plan<'_>, addr: &str) -> Result<(), PerfError> {
    let req = EncodedRequest(plan.payloads[0].bytes.clone());
    match client.unary::<EncodedRequest, ReplyBytes>(plan.method.id, &req, &opts(plan)) {
        Err(s) if matches!(s.code(), Code::Unimplemented | Code::Unavailable) => {
            Err(super::call::status_error(plan.method, addr, &s))
        }
        Ok(r) if !r.decodes(&plan.method.output) => Err(PerfError::Setup(format!(
            "{}: the reply does not decode as {} (is the server's .proto the same?)",
            plan.method.name,
            plan.method.output.full_name()
        ))),
        _ => Ok(()),
    }
}

/// The client refused to start a call because all its slots are taken (by calls abandoned at
/// their deadline whose answers have not arrived yet): a local condition, not an answer.
fn local_window_full(s: &Status) -> bool {
    s.code() == Code::ResourceExhausted && s.message().contains("ClientConfig::window")
}

fn opts(plan: &Plan<'_>) -> CallOptions {
    plan.deadline.map_or_else(CallOptions::default, CallOptions::deadline)
}

/// Runs the warm-up and the measured calls of `plan` on `client` (after [`probe`]).
///
/// # Errors
/// [`PerfError::Rpc`] when the connection is lost (every later call would fail alike).
pub fn measure(client: &Client, plan: &Plan<'_>, progress: &Progress) -> Result<Outcome, PerfError> {
    if plan.check {
        drive::<ReplyBytes>(client, plan, progress)
    } else {
        drive::<ReplyLen>(client, plan, progress)
    }
}

struct Tally {
    rec: LatencyRecorder,
    by_code: [u64; CODES],
    messages: BTreeMap<Code, String>,
    undecodable: u64,
    bytes: u64,
    calls: u64,
}

impl Tally {
    fn new() -> Self {
        Tally {
            rec: LatencyRecorder::new(),
            by_code: [0; CODES],
            messages: BTreeMap::new(),
            undecodable: 0,
            bytes: 0,
            calls: 0,
        }
    }

    /// Notes a finished call; `Err` when the connection is gone.
    #[inline]
    fn finished<R: Taken>(
        &mut self,
        client: &Client,
        plan: &Plan<'_>,
        r: Result<R, Status>,
        req_len: usize,
        ns: u64,
    ) -> Result<(), PerfError> {
        self.calls += 1;
        match r {
            Ok(reply) => {
                if reply.decodes(&plan.method.output) {
                    self.by_code[0] += 1;
                    self.bytes += (req_len + reply.len()) as u64;
                    self.rec.record(ns);
                } else {
                    self.undecodable += 1;
                    self.by_code[Code::Internal as usize] += 1;
                    self.messages.entry(Code::Internal).or_insert_with(|| {
                        format!("reply does not decode as {}", plan.method.output.full_name())
                    });
                }
            }
            Err(s) => {
                self.by_code[s.code() as usize] += 1;
                self.messages.entry(s.code()).or_insert_with(|| super::one_line(s.message()));
                if let Some(reason) = client.closed_reason() {
                    return Err(PerfError::Rpc(format!(
                        "{}: connection lost after {} calls: {}",
                        plan.method.name,
                        self.calls,
                        super::one_line(&reason.to_string())
                    )));
                }
            }
        }
        Ok(())
    }
}

fn drive<R: Taken>(client: &Client, plan: &Plan<'_>, progress: &Progress) -> Result<Outcome, PerfError> {
    let reqs: Vec<EncodedRequest> = plan.payloads.iter().map(|p| EncodedRequest(p.bytes.clone())).collect();
    let n_reqs = reqs.len();
    let id = plan.method.id;
    let opts = opts(plan);
    let window = plan.concurrency.max(1) as usize;
    let mut cx = Context::from_waker(Waker::noop());
    let mut q: VecDeque<(_, Instant, usize)> = VecDeque::with_capacity(window);

    // Warm-up: closed loop, unmeasured.
    let (mut sent, mut done, mut next) = (0u64, 0u64, 0usize);
    let mut warm = Tally::new();
    let mut waiter = crate::poll::Waiter::new(plan.poll);
    let yielding = plan.poll == PollKind::Yield;
    let t = Instant::now();
    while done < plan.warmup {
        while q.len() < window && sent < plan.warmup {
            q.push_back((client.unary_async::<EncodedRequest, R>(id, &reqs[next], &opts), t, next));
            next = (next + 1) % n_reqs;
            sent += 1;
        }
        if let Some((f, _, which)) = q.front_mut() {
            match Pin::new(f).poll(&mut cx) {
                Poll::Ready(Err(ref s)) if local_window_full(s) => {
                    let which = *which;
                    q.pop_front();
                    client.progress();
                    q.push_back((client.unary_async::<EncodedRequest, R>(id, &reqs[which], &opts), t, which));
                }
                Poll::Ready(r) => {
                    q.pop_front();
                    done += 1;
                    waiter.progress();
                    warm.finished(client, plan, r, 0, 0)?;
                }
                Poll::Pending => {
                    if yielding {
                        waiter.idle();
                    }
                }
            }
        }
    }

    let mut tally = Tally::new();
    let mut peak = PeakWindow::new(PeakWindow::DEFAULT_MIN_NS);
    let mut late_starts = 0u64;
    let interval_ns = plan.rate.map(|r| 1e9 / r);
    let start = Instant::now();
    let mut now = start;
    let (mut sent, mut done) = (0u64, 0u64);
    let mut issuing = !matches!(plan.limit, Limit::Iters(0));
    loop {
        // Start what is due: in closed loop everything the window allows, at `now` (the instant
        // of the last completion); in open loop the calls whose intended start has come.
        if let Some(iv) = interval_ns {
            now = Instant::now();
            while issuing && q.len() < window {
                let due = start + Duration::from_nanos((sent as f64 * iv) as u64);
                if due > now {
                    break;
                }
                if now.duration_since(due) > Duration::from_millis(1) {
                    late_starts += 1;
                }
                q.push_back((client.unary_async::<EncodedRequest, R>(id, &reqs[next], &opts), due, next));
                next = (next + 1) % n_reqs;
                sent += 1;
                issuing = match plan.limit {
                    Limit::Iters(n) => sent < n,
                    // Stop at -D even when behind the schedule (the calls not started are
                    // reported as unsent).
                    Limit::Duration(d) => {
                        Duration::from_nanos((sent as f64 * iv) as u64) < d && now.duration_since(start) < d
                    }
                };
            }
        } else {
            while issuing && q.len() < window {
                q.push_back((client.unary_async::<EncodedRequest, R>(id, &reqs[next], &opts), now, next));
                next = (next + 1) % n_reqs;
                sent += 1;
                if let Limit::Iters(n) = plan.limit {
                    issuing = sent < n;
                }
            }
        }
        if let (Some(_), Limit::Duration(d)) = (interval_ns, plan.limit) {
            issuing = issuing && now.duration_since(start) < d;
        }
        let Some((f, t0, which)) = q.front_mut() else {
            if !issuing {
                break;
            }
            // Open loop, nothing in flight, next call not due yet.
            waiter.idle();
            continue;
        };
        match Pin::new(f).poll(&mut cx) {
            Poll::Ready(Err(ref s)) if local_window_full(s) => {
                // Slots still held by calls abandoned at their deadline (until their late answers
                // arrive): not an answer. Let answers in and start the call again, same start time.
                let (t0, which) = (*t0, *which);
                q.pop_front();
                client.progress();
                q.push_back((client.unary_async::<EncodedRequest, R>(id, &reqs[which], &opts), t0, which));
            }
            Poll::Ready(r) => {
                now = Instant::now();
                let (t0, which) = (*t0, *which);
                q.pop_front();
                done += 1;
                let req_len = reqs[which].0.len();
                waiter.progress();
                tally.finished(client, plan, r, req_len, now.duration_since(t0).as_nanos() as u64)?;
                let elapsed = now.duration_since(start);
                if let (Limit::Duration(d), None) = (plan.limit, interval_ns) {
                    issuing = issuing && elapsed < d;
                }
                if done % SAMPLE_EVERY == 0 {
                    peak.completed(elapsed.as_nanos() as u64, tally.bytes);
                    progress.fraction(crate::measure::fraction(plan.limit, done, elapsed));
                }
            }
            Poll::Pending => {
                // Busy: poll again at once (a pause here would delay seeing the answer).
                if yielding {
                    waiter.idle();
                }
            }
        }
    }
    let elapsed = now.duration_since(start).as_nanos() as u64;
    progress.fraction(1.0);
    let (pb, pns) = peak.best();
    // Payload bytes of the OK calls spread over all calls, so that calls/s counts every call
    // and MB/s only what was answered.
    let per_call = tally.bytes.checked_div(tally.calls).unwrap_or(0);
    let bandwidth = BandwidthSummary::new(tally.calls, per_call, elapsed, pb, pns);
    let unsent = match (interval_ns, plan.limit) {
        (Some(iv), Limit::Duration(d)) => ((d.as_nanos() as f64 / iv).ceil() as u64).saturating_sub(sent),
        _ => 0,
    };
    Ok(Outcome {
        unsent,
        latency: tally.rec,
        calls: tally.calls,
        by_code: tally.by_code,
        messages: tally.messages,
        undecodable: tally.undecodable,
        bandwidth,
        late_starts,
    })
}

/// `--json` of a bench run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Always `"rpc-perf bench"`.
    pub tool: &'static str,
    /// rpc-perf's version.
    pub version: &'static str,
    /// `sim` or `rdma`.
    pub transport: &'static str,
    /// The server's address.
    pub server: String,
    /// `package.Service/Method`.
    pub method: String,
    /// Its method id.
    pub method_id: u32,
    /// Calls in flight at most.
    pub concurrency: u32,
    /// Open-loop rate in calls/s; absent for closed loop.
    pub rate_per_s: Option<f64>,
    /// Deadline of each call in ns; absent for none.
    pub deadline_ns: Option<u64>,
    /// Unmeasured calls before the run (besides the probe).
    pub warmup: u64,
    /// Encoded request sizes in bytes, in round-robin order.
    pub payload_bytes: Vec<usize>,
    /// Latency is the round trip (open loop: from the intended start of the call).
    pub latency_is_round_trip: bool,
    /// Round trips of OK calls, in ns; absent when none was OK.
    pub latency: Option<LatencySummary>,
    /// Calls per second and payload goodput.
    pub bandwidth: BandwidthSummary,
    /// Measured calls finished.
    pub calls: u64,
    /// Calls per status code name (codes seen only).
    pub status_counts: BTreeMap<String, u64>,
    /// First message per non-OK code.
    pub status_messages: BTreeMap<String, String>,
    /// Replies that did not decode (`--check`).
    pub undecodable: u64,
    /// Open loop: calls started more than 1 ms late.
    pub late_starts: u64,
    /// Open loop with `-D`: calls due before the end but never started.
    pub unsent: u64,
}

/// Runs `rpc-perf bench`: prints the banner, tables and status counts on stdout, writes
/// `--json` and `--plot`.
///
/// # Errors
/// One-line [`PerfError`]s: .proto, method, `--data` (field and type named), unreachable
/// server, UNIMPLEMENTED at the probe, a lost connection, `--json`/`--plot` files.
pub fn run(a: &BenchArgs) -> Result<BenchReport, PerfError> {
    let schema = super::schema_for(&a.proto, &a.nic, &a.host, &a.method)?;
    let method = schema.unary_method(&a.method)?;
    let payloads = json::payloads(&method.input, &a.data)?;
    let max_len = payloads.iter().map(|p| p.bytes.len()).max().unwrap_or(0);
    // A call abandoned at its deadline keeps its slot until the late answer arrives: leave room.
    let window = if a.deadline.is_some() { (2 * a.concurrency).min(4096) } else { a.concurrency };
    let (client, addr) = super::connect(&a.nic, &a.host, window, crate::rpc::ring_bytes_for(max_len.max(1)))?;
    let plan = Plan {
        method: &method,
        payloads: &payloads,
        concurrency: a.concurrency,
        limit: a.limit(),
        warmup: a.warmup,
        rate: a.rate,
        deadline: a.deadline,
        check: a.check,
        poll: a.nic.poll,
    };
    probe(&client, &plan, &addr)?;
    let transport = if matches!(super::transport(&a.nic), rpc_core::Transport::Sim) { "sim" } else { "rdma" };
    let sizes: Vec<usize> = payloads.iter().map(|p| p.bytes.len()).collect();
    let min_len = sizes.iter().copied().min().unwrap_or(0);
    let mut info = vec![
        ("Transport", transport.to_string()),
        ("Server", addr.clone()),
        ("Method", format!("{} ({:#010x})", method.name, method.id)),
        ("Concurrency", a.concurrency.to_string()),
        ("Mode", a.rate.map_or("closed loop".to_string(), |r| format!("open loop, {r} calls/s"))),
        ("Poll", format!("{:?}", a.nic.poll).to_lowercase()),
        (
            "Payloads",
            if min_len == max_len {
                format!("{} x {max_len}[B]", sizes.len())
            } else {
                format!("{} x {min_len}..{max_len}[B], round-robin", sizes.len())
            },
        ),
        ("Deadline", a.deadline.map_or("none".into(), |d| format!("{d:?}"))),
        ("Replies", if a.check { "decoded and checked".into() } else { "counted, not decoded".to_string() }),
        (
            "Latency",
            if a.rate.is_some() {
                "round trip from intended start, OK calls".into()
            } else {
                "round trip, OK calls".to_string()
            },
        ),
    ];
    if a.warmup > 0 {
        info.push(("Warmup", format!("{} calls", a.warmup)));
    }
    println!("{}", report::banner(&format!("RPC Bench ({}, unary)", method.name), &info));
    let progress = Progress::new("bench", 1, !a.no_progress);
    progress.start_size(0, max_len);
    let out = measure(&client, &plan, &progress);
    progress.finish();
    let out = out?;
    let avg_len = if sizes.is_empty() { 0 } else { sizes.iter().sum::<usize>() / sizes.len() };
    println!("{}", report::LAT_HEADER);
    let summary = out.latency.summary();
    match &summary {
        Some(s) => println!("{}", report::latency_row(avg_len, s)),
        None => println!(" (no call answered OK: no latency figures)"),
    }
    println!("{}", report::RESULT_LINE);
    println!("{}{}", report::BW_HEADER, report::RPC_BW_HEADER_EXT);
    println!("{}{}", report::bandwidth_row(avg_len, &out.bandwidth), report::rpc_bw_ext(&out.bandwidth));
    println!("{}", report::RESULT_LINE);
    println!(" status counts: {}", out.status_line());
    for (code, msg) in &out.messages {
        println!("   first {code}: {msg}");
    }
    if a.rate.is_some() {
        println!(
            " late starts (> 1 ms after the intended time): {}; due but never started: {}",
            out.late_starts, out.unsent
        );
    }
    let c = client.counters();
    println!(
        " client counters: rpcs {}, credit stalls {}, ring-full stalls {}; sim RNR waits {}",
        c.rpcs,
        c.credit_stalls,
        c.ring_full_stalls,
        rpc_core::verbs::sim::stats().rnr_stalls
    );
    let rep = BenchReport {
        tool: "rpc-perf bench",
        version: env!("CARGO_PKG_VERSION"),
        transport,
        server: addr,
        method: method.name.clone(),
        method_id: method.id,
        concurrency: a.concurrency,
        rate_per_s: a.rate,
        deadline_ns: a.deadline.map(|d| d.as_nanos() as u64),
        warmup: a.warmup,
        payload_bytes: sizes,
        latency_is_round_trip: true,
        latency: summary,
        bandwidth: out.bandwidth,
        calls: out.calls,
        status_counts: (0..CODES as u8)
            .filter(|&c| out.by_code[c as usize] > 0)
            .map(|c| (Code::from_u8(c).unwrap_or(Code::Unknown).to_string(), out.by_code[c as usize]))
            .collect(),
        status_messages: out.messages.iter().map(|(c, m)| (c.to_string(), m.clone())).collect(),
        undecodable: out.undecodable,
        late_starts: out.late_starts,
        unsent: out.unsent,
    };
    if let Some(path) = &a.json {
        let text =
            serde_json::to_string_pretty(&rep).map_err(|e| PerfError::Setup(format!("--json: {e}")))?;
        std::fs::write(path, text)
            .map_err(|source| PerfError::Io { what: format!("--json {}", path.display()), source })?;
    }
    if let Some(path) = &a.plot {
        crate::plot::draw_cdf(path, &format!("{} ({transport})", method.name), &method.name, &out.latency)
            .map_err(PerfError::Setup)?;
    }
    Ok(rep)
}
