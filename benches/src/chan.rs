//! chan_lat and chan_bw: the benchmark service's unary calls through the shareable handle
//! (`Channel`) from `--tasks` tokio tasks, each keeping its share of `-c` calls in flight. The
//! server side is the one of rpc_lat/rpc_bw (`rpc::ServerState`), so the same run compares the
//! per-thread `Client` (rpc_*) with the shareable handle (chan_*).
//!
//! With `--rt-threads 1` (the default) the tasks run on a current-thread runtime in the client's
//! thread; with more, on a multi-thread runtime of that many workers. The channel's dispatchers
//! poll per `--poll` (`busy`: they spin while calls are in flight; `yield`: they yield).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rpc_core::{Channel, ChannelConfig, ChannelStats, Status};

use crate::cli::{Args, Limit, PollKind, TestKind};
use crate::error::PerfError;
use crate::oob::OobChannel;
use crate::results::Measure;
use crate::rpc;
use crate::rpc::pb::bench_client::BenchClient;
use crate::rpc::pb::EchoRequest;
use crate::sink::Sink;
use crate::stats::{BandwidthSummary, LatencyRecorder};
use crate::transport::Resolved;

fn rpc_err(what: &str, s: Status) -> PerfError {
    PerfError::Rpc(format!("{what}: {s}"))
}

/// What one task measured.
struct TaskResult {
    calls: u64,
    latency: Option<LatencyRecorder>,
}

/// Client side of a chan_* test over all sizes.
///
/// # Errors
/// Setup, connect, call and channel errors.
pub fn run_client(
    args: &Args,
    resolved: Resolved,
    test: TestKind,
    ch: &mut OobChannel,
    sink: &mut Sink,
) -> Result<(), PerfError> {
    let tasks = args.tasks_for(test);
    let per_task = (args.concurrency_for(test) / tasks).max(1);
    let concurrency = per_task * tasks;
    let dispatchers = args.dispatchers;
    let started = rpc::start(args, resolved, test, concurrency, ch)?;
    let addr = started.addr;
    // Each dispatcher's session carries its share of the calls.
    let window = concurrency.div_ceil(dispatchers).clamp(1, 4096) as u16;
    let client = rpc::client_config(args, resolved, rpc::polling(args.poll), window);
    let cfg = ChannelConfig::default()
        .client(client.clone())
        .dispatchers(dispatchers as usize)
        .queue_depth((4 * concurrency as usize).max(64))
        .spins(if args.poll == PollKind::Busy { u32::MAX } else { 1000 })
        .poll_spin(std::time::Duration::from_micros(args.poll_spin));
    let rt = if args.rt_threads == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.rt_threads as usize)
            .enable_all()
            .build()
    }
    .map_err(|e| PerfError::Setup(format!("building the tokio runtime: {e}")))?;
    let channel = rt
        .block_on(Channel::connect_with(addr, &cfg))
        .map_err(|s| rpc_err(&format!("connecting to {addr}"), s))?;
    let stub = BenchClient::from_channel(channel);

    let extra = vec![
        ("Runtime", format!("tokio, {} worker thread(s)", args.rt_threads)),
        ("Dispatchers", dispatchers.to_string()),
        ("Poll spin", format!("{}[usec]", args.poll_spin)),
    ];
    let timed = test == TestKind::ChanLat;
    let what = if timed {
        ("Latency", "round trip, per call (issue to reply in the task)")
    } else {
        ("BW", "request + response payload")
    };
    let info = rpc::banner_info(
        args,
        &started,
        &client,
        format!("{concurrency} ({tasks} tasks x {per_task})"),
        extra,
        true,
        what,
    );
    sink.begin_test(test, started.sizes.len(), info);
    rpc::each_size(args, test, &started, concurrency, sink, |req_size, resp_size, limit, _| {
        let req = rpc::echo_request(req_size, resp_size);
        let bytes_per_call = (req_size + resp_size) as u64;
        let before = stub.channel().stats();
        let (elapsed, results) = rt.block_on(run_tasks(
            &stub,
            &req,
            tasks,
            per_task,
            limit,
            args.warmup_for(req_size + resp_size),
            timed,
        ))?;
        let calls: u64 = results.iter().map(|r| r.calls).sum();
        print_stats(&before, &stub.channel().stats());
        Ok(if timed {
            let mut rec = LatencyRecorder::new();
            for r in results.iter().filter_map(|r| r.latency.as_ref()) {
                rec.merge(r);
            }
            crate::raw::latency_measure(&rec)
        } else {
            let ns = elapsed.as_nanos() as u64;
            Measure::Bandwidth(BandwidthSummary::new(calls, bytes_per_call, ns, calls * bytes_per_call, ns))
        })
    })?;
    drop(stub);
    drop(rt);
    rpc::finish(ch, sink)
}

/// The channel's driving statistics of one size (warm-up included), per call, on stderr.
fn print_stats(a: &ChannelStats, b: &ChannelStats) {
    let calls = (b.started_by_callers + b.started_by_threads)
        .saturating_sub(a.started_by_callers + a.started_by_threads)
        .max(1) as f64;
    let per = |x: u64, y: u64| x.saturating_sub(y) as f64 / calls;
    eprintln!(
        " channel per call: started by callers {:.3}, by threads {:.3}; caller drives {:.3} \
         (session busy {:.3}); dispatcher steps {:.3}, runs {:.4}, handoffs {:.4}, unparks {:.4}, \
         event waits {:.4}; task wakes {:.3}; steps {:.2} ({:.2} empty); in flight at start {:.2}",
        per(b.started_by_callers, a.started_by_callers),
        per(b.started_by_threads, a.started_by_threads),
        per(b.caller_drives, a.caller_drives),
        per(b.caller_busy, a.caller_busy),
        per(b.thread_drives, a.thread_drives),
        per(b.thread_runs, a.thread_runs),
        per(b.handoffs, a.handoffs),
        per(b.unparks, a.unparks),
        per(b.event_waits, a.event_waits),
        per(b.wakes, a.wakes),
        per(b.steps, a.steps),
        per(b.empty_steps, a.empty_steps),
        per(b.in_flight_at_start, a.in_flight_at_start),
    );
}

/// Runs `tasks` tasks, each with `per_task` calls in flight, `warmup` calls in all first
/// (unmeasured), then until `limit` (calls over all tasks, or time). Returns the measured time
/// and each task's figures.
async fn run_tasks(
    stub: &BenchClient<Channel>,
    req: &EchoRequest,
    tasks: u32,
    per_task: u32,
    limit: Limit,
    warmup: u64,
    timed: bool,
) -> Result<(std::time::Duration, Vec<TaskResult>), PerfError> {
    // Warm-up: every task's pipeline, unmeasured.
    let warm_each = warmup.div_ceil(u64::from(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|_| tokio::spawn(task(stub.clone(), req.clone(), per_task, Budget::Calls(warm_each), false)))
        .collect();
    for h in handles {
        h.await.map_err(|e| PerfError::Rpc(format!("a task failed: {e}")))??;
    }
    let budget = match limit {
        Limit::Iters(n) => Budget::Shared(Arc::new(AtomicU64::new(n))),
        Limit::Duration(d) => Budget::Until(Instant::now() + d, Arc::new(AtomicBool::new(false)), 0),
    };
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| tokio::spawn(task(stub.clone(), req.clone(), per_task, budget.clone(), timed)))
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.map_err(|e| PerfError::Rpc(format!("a task failed: {e}")))??);
    }
    Ok((start.elapsed(), out))
}

/// Calls a task starts between two looks at the clock in a timed run (`-D`): a run lasts at most
/// this many calls per task beyond its time, all of them counted and timed.
const CLOCK_EVERY: u32 = 64;

/// How many calls a task may still start.
#[derive(Clone)]
enum Budget {
    /// This many, for this task alone.
    Calls(u64),
    /// From a counter all tasks draw on.
    Shared(Arc<AtomicU64>),
    /// Until this instant (the flag caches that it passed; the clock is read every
    /// [`CLOCK_EVERY`] calls of a task, counted here, as `rpc_bw`'s loop reads it every batch:
    /// a clock read per call cost chan_bw about 2 % of its client thread).
    Until(Instant, Arc<AtomicBool>, u32),
}

impl Budget {
    fn take(&mut self) -> bool {
        match self {
            Budget::Calls(n) => {
                let ok = *n > 0;
                *n = n.saturating_sub(1);
                ok
            }
            Budget::Shared(n) => {
                n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1)).is_ok()
            }
            Budget::Until(t, passed, since) => {
                if passed.load(Ordering::Relaxed) {
                    return false;
                }
                *since += 1;
                if *since < CLOCK_EVERY {
                    return true;
                }
                *since = 0;
                let ok = Instant::now() < *t;
                if !ok {
                    passed.store(true, Ordering::Relaxed);
                }
                ok
            }
        }
    }
}

/// One task: keeps `window` calls in flight while the budget lasts, awaiting the oldest.
async fn task(
    stub: BenchClient<Channel>,
    req: EchoRequest,
    window: u32,
    mut budget: Budget,
    timed: bool,
) -> Result<TaskResult, PerfError> {
    let want = req.resp_size as usize;
    let mut q = VecDeque::with_capacity(window as usize);
    let mut rec = timed.then(LatencyRecorder::new);
    let mut calls = 0;
    let mut issuing = true;
    loop {
        while issuing && q.len() < window as usize {
            if !budget.take() {
                issuing = false;
                break;
            }
            let t0 = timed.then(crate::clock::now);
            // By reference, as rpc_bw passes it: encoded straight into registered memory, cloned
            // only when the call has to wait in the dispatcher's queue.
            q.push_back((stub.echo(&req), t0));
        }
        let Some((call, t0)) = q.pop_front() else { break };
        let r = call.await.map_err(|s| rpc_err("Bench.Echo", s))?;
        if let (Some(rec), Some(t0)) = (rec.as_mut(), t0) {
            rec.record(crate::clock::now().nanos_since(t0));
        }
        if r.payload.len() != want {
            return Err(PerfError::Rpc(format!(
                "Bench.Echo answered {} bytes, expected {want}",
                r.payload.len()
            )));
        }
        calls += 1;
    }
    Ok(TaskResult { calls, latency: rec })
}
