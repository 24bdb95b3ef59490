//! `--servers N`: rpc_lat and rpc_bw from one client endpoint to N server processes on sim
//! (issue 28's "many servers" speed figures).
//!
//! The client thread spawns N processes of this binary (`--serve-rpc`, each an RPC server with
//! one worker pinned to the server core of `--cores`, polling per `--server-poll`; the first per
//! `--first-server-poll`) and opens a session to each: `Client::connect` takes the thread's
//! endpoint, so the N sessions share one device context, and the banner counts the contexts the
//! client opened. rpc_lat times one call at a time on the first session while the others idle
//! (each made one call when it connected); rpc_bw keeps `-c` calls in flight, spread round robin
//! over the N sessions: every call in flight is polled in turn and a finished one is replaced at
//! once by a call to the session whose turn it is, so a slow server holds up only its own calls.
//! `--servers 1` is the same with one server process: the arm to compare with.

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use rpc_core::{PollingPolicy, Server, ServerConfig, Transport};

use crate::cli::{Args, Limit, ServerPoll, TestKind};
use crate::error::PerfError;
use crate::progress::Progress;
use crate::rpc::pb::bench_client::BenchClient;
use crate::rpc::pb::bench_server::BenchServer;
use crate::rpc::pb::{EchoReply, EchoRequest};
use crate::rpc::{BenchService, Started, ECHO_ID, MESSAGE_LIMIT, PEAK_BATCH_MAX};
use crate::sink::Sink;
use crate::stats::{BandwidthSummary, PeakWindow};
use crate::transport::Resolved;

/// The runtime's polling policy of a `--server-poll` value.
pub fn server_polling(p: ServerPoll) -> PollingPolicy {
    match p {
        ServerPoll::Busy => PollingPolicy::Busy,
        ServerPoll::Yield => PollingPolicy::SpinThenYield { spins: crate::poll::SPINS_BEFORE_YIELD },
        ServerPoll::Event => PollingPolicy::Event { spins: 0 },
    }
}

/// `--serve-rpc` (a process spawned by `--servers`): the benchmark service on sim for messages
/// up to `-s` bytes and `-c` calls in flight (at least 32 credits), its one worker on the
/// server core of `--cores` polling per `--server-poll`; prints `addr ADDR` and serves until
/// its stdin closes.
///
/// # Errors
/// [`PerfError::Setup`] when the server cannot start.
pub fn serve(args: &Args) -> Result<(), PerfError> {
    let max_size = args.size;
    let credits = args.concurrency.unwrap_or(32).max(32) as u16;
    let ring = args.ring_bytes.map_or_else(|| crate::rpc::ring_bytes_for(max_size), |r| r as u32);
    // Every thread of this process on the server core (the process inherits the client
    // thread's affinity, its core only).
    if let Some(c) = args.cores.as_ref().map(|c| c[0]) {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
            eprintln!("rpc-perf --serve-rpc: could not pin to core {c}");
        }
    }
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(server_polling(args.server_poll))
        .worker_cores(args.cores.as_ref().map(|c| c[0]).into_iter().collect())
        .ring_bytes(ring)
        .max_peer_ring_bytes(ring)
        .max_message_size(MESSAGE_LIMIT)
        .credits_per_session(credits)
        .srq_depth(args.rx_depth.unwrap_or(ServerConfig::srq_per_session(credits).max(4096)))
        .add_service(BenchServer::new(BenchService::sized(max_size)))
        .spawn("127.0.0.1:0")
        .map_err(|e| PerfError::Setup(format!("--serve-rpc: starting the RPC server: {e}")))?;
    println!("addr {}", server.local_addr());
    let _ = std::io::stdout().flush();
    for _ in std::io::stdin().lock().lines() {}
    server.shutdown();
    Ok(())
}

/// The server processes of one test; dropping it closes their stdin and waits for them.
struct ServerProcs {
    kids: Vec<Child>,
    addrs: Vec<SocketAddr>,
}

impl ServerProcs {
    /// Starts `n` server processes for messages up to `max_size` bytes and `concurrency` calls
    /// in flight, one after another (each has printed its address when the next starts).
    /// `cores`: the server core, and the client's (passed on as `--cores`).
    fn spawn(
        args: &Args,
        n: usize,
        max_size: usize,
        concurrency: u32,
        cores: Option<(usize, usize)>,
    ) -> Result<ServerProcs, PerfError> {
        let exe = std::env::current_exe()
            .map_err(|source| PerfError::Io { what: "--servers: current_exe".into(), source })?;
        let mut procs = ServerProcs { kids: Vec::with_capacity(n), addrs: Vec::with_capacity(n) };
        for i in 0..n {
            let poll =
                if i == 0 { args.first_server_poll.unwrap_or(args.server_poll) } else { args.server_poll };
            let mut cmd = Command::new(&exe);
            cmd.args(["--serve-rpc", "--transport", "sim", "--server-poll", poll.name()]).args([
                "-s",
                &max_size.to_string(),
                "-c",
                &concurrency.to_string(),
            ]);
            if let Some((s, c)) = cores {
                cmd.args(["--cores", &format!("{s},{c}")]);
            }
            if let Some(r) = args.ring_bytes {
                cmd.args(["--ring-bytes", &r.to_string()]);
            }
            if let Some(r) = args.rx_depth {
                cmd.args(["-r", &r.to_string()]);
            }
            let mut kid = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().map_err(|source| {
                PerfError::Io { what: format!("--servers: spawning server {i}"), source }
            })?;
            let line = kid.stdout.take().and_then(|o| BufReader::new(o).lines().next()).and_then(Result::ok);
            procs.kids.push(kid);
            match line.as_deref().and_then(|l| l.strip_prefix("addr ")).and_then(|a| a.parse().ok()) {
                Some(addr) => procs.addrs.push(addr),
                None => return Err(PerfError::Setup(format!("--servers: server process {i} said {line:?}"))),
            }
        }
        Ok(procs)
    }
}

impl ServerProcs {
    /// Context switches (voluntary + involuntary, every thread) of all the server processes so
    /// far, from `/proc/PID/task/*/status`; 0 where unreadable.
    fn switches(&self) -> u64 {
        self.kids
            .iter()
            .filter_map(|k| std::fs::read_dir(format!("/proc/{}/task", k.id())).ok())
            .flat_map(|d| d.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok()))
            .map(|st| {
                st.lines()
                    .filter(|l| {
                        l.starts_with("voluntary_ctxt_switches")
                            || l.starts_with("nonvoluntary_ctxt_switches")
                    })
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    }
}

impl Drop for ServerProcs {
    fn drop(&mut self) {
        for k in &mut self.kids {
            drop(k.stdin.take());
        }
        for k in &mut self.kids {
            let _ = k.wait();
        }
    }
}

/// Client side of rpc_lat or rpc_bw with `--servers N`.
///
/// # Errors
/// Spawn, connect and call errors; a transport other than sim.
pub fn run_client(args: &Args, resolved: Resolved, test: TestKind, sink: &mut Sink) -> Result<(), PerfError> {
    if resolved != Resolved::Sim {
        return Err(PerfError::Setup("--servers runs on sim only (--transport sim)".into()));
    }
    let n = args.servers.unwrap_or(1) as usize;
    // rpc_lat: one call at a time on the first session.
    let concurrency = if test == TestKind::RpcLat { 1 } else { args.concurrency_for(test) };
    let sizes = args.sizes();
    let max_size = sizes.iter().map(|&s| args.rpc_sizes(s)).map(|(a, b)| a.max(b)).max().unwrap_or(args.size);
    let t = Instant::now();
    // The loopback's cores (`run::loopback` fills in `--cores` when it picks them).
    let cores = args.cores.as_ref().map(|c| (c[0], c[1]));
    let procs = ServerProcs::spawn(args, n, max_size, concurrency, cores)?;
    let spawned = t.elapsed();
    let cfg = crate::rpc::client_config(args, resolved, crate::rpc::polling(args.poll), concurrency as u16);
    let before = rpc_core::verbs::sim::stats().contexts_opened;
    let t = Instant::now();
    let hello = crate::rpc::echo_request(32, 32);
    let mut clients = Vec::with_capacity(n);
    for addr in &procs.addrs {
        let c = BenchClient::connect_with(*addr, &cfg)
            .map_err(|s| crate::rpc::rpc_err(&format!("connecting to {addr}"), s))?;
        c.echo(hello.clone()).map_err(|s| crate::rpc::rpc_err("a first Bench.Echo", s))?;
        clients.push(c);
    }
    let connected = t.elapsed();
    let contexts = rpc_core::verbs::sim::stats().contexts_opened - before;
    let first = args.first_server_poll.unwrap_or(args.server_poll);
    let core = cores.map_or_else(|| "unpinned".to_string(), |(s, _)| format!("core {s}"));
    let extra = vec![
        (
            "Servers",
            format!(
                "{n} processes (started in {:.2} s), one worker each on {core}; {n} sessions connected in {:.3} s",
                spawned.as_secs_f64(),
                connected.as_secs_f64()
            ),
        ),
        ("Server poll", format!("{} (the first: {})", args.server_poll.name(), first.name())),
        ("Client endpoint", format!("one thread, {contexts} device context(s) opened")),
        ("Load (1 min)", crate::host::load1()),
    ];
    let started = Started { sizes, addr: procs.addrs[0], resolved };
    let what = if test == TestKind::RpcLat {
        ("Latency", "round trip, per call, on the first session; the others idle")
    } else {
        ("BW", "request + response payload, calls round robin over the sessions")
    };
    let info = crate::rpc::banner_info(args, &started, &cfg, concurrency.to_string(), extra, true, what);
    sink.begin_test(test, started.sizes.len(), info);
    let opts = crate::rpc::call_options(args);
    let (switched, calls) =
        (procs.switches(), clients.iter().map(|c| c.client().counters().rpcs).sum::<u64>());
    crate::rpc::each_size(
        args,
        test,
        &started,
        concurrency,
        sink,
        |req_size, resp_size, limit, progress| {
            let req = crate::rpc::echo_request(req_size, resp_size);
            let warmup = args.warmup_for(req_size + resp_size);
            Ok(if test == TestKind::RpcLat {
                let rec = crate::rpc::blocking_latency(&clients[0], &req, &opts, limit, warmup, progress)?;
                crate::raw::latency_measure(&rec)
            } else {
                let w = concurrency as usize;
                spread(&clients, &req, &opts, w, Limit::Iters(warmup), None)?;
                crate::results::Measure::Bandwidth(spread(&clients, &req, &opts, w, limit, Some(progress))?)
            })
        },
    )?;
    let rpcs: Vec<u64> = clients.iter().map(|c| c.client().counters().rpcs).collect();
    let (switched, calls) = (procs.switches() - switched, rpcs.iter().sum::<u64>() - calls);
    drop(clients);
    drop(procs);
    sink.end_test();
    println!(
        " client sessions: {n}, calls per session min {} max {}; server processes' context switches {switched} \
         ({:.3} per call); load {} (at end)",
        rpcs.iter().min().unwrap_or(&0),
        rpcs.iter().max().unwrap_or(&0),
        switched as f64 / calls.max(1) as f64,
        crate::host::load1()
    );
    Ok(())
}

/// Keeps `window` calls of `req` in flight, round robin over `clients`, until `limit`; every
/// call in flight is polled in turn and one that finished is replaced at once by a call to the
/// next session in the round.
fn spread(
    clients: &[BenchClient],
    req: &EchoRequest,
    opts: &rpc_core::CallOptions,
    window: usize,
    limit: Limit,
    progress: Option<&Progress>,
) -> Result<BandwidthSummary, PerfError> {
    let want = req.resp_size as usize;
    let bytes_per_call = (req.payload.len() + want) as u64;
    let peak_batch = ((1u64 << 20) / bytes_per_call.max(1)).clamp(1, PEAK_BATCH_MAX);
    let mut peak = PeakWindow::new(PeakWindow::DEFAULT_MIN_NS);
    let mut cx = Context::from_waker(Waker::noop());
    let mut next = 0usize;
    let mut call = || {
        let c = &clients[next];
        next = (next + 1) % clients.len();
        c.client().unary_async::<EchoRequest, EchoReply>(ECHO_ID, req, opts)
    };
    let first = match limit {
        Limit::Iters(n) => window.min(n as usize),
        Limit::Duration(_) => window,
    };
    let start = Instant::now();
    let mut slots: Vec<_> = (0..first).map(|_| Some(call())).collect();
    let (mut sent, mut done, mut in_flight) = (first as u64, 0u64, first);
    let mut issuing = !matches!(limit, Limit::Iters(n) if sent >= n);
    while in_flight > 0 {
        for slot in slots.iter_mut() {
            let Some(f) = slot else { continue };
            let Poll::Ready(r) = Pin::new(f).poll(&mut cx) else { continue };
            crate::rpc::check_len(r.map_err(|s| crate::rpc::rpc_err("Bench.Echo", s))?.payload.len(), want)?;
            done += 1;
            if done % peak_batch == 0 {
                let e = start.elapsed();
                peak.completed(e.as_nanos() as u64, done * bytes_per_call);
                if let Some(p) = progress {
                    p.fraction(crate::measure::fraction(limit, done, e));
                }
                if let Limit::Duration(d) = limit {
                    issuing = issuing && e < d;
                }
            }
            if issuing {
                *slot = Some(call());
                sent += 1;
                if let Limit::Iters(n) = limit {
                    issuing = sent < n;
                }
            } else {
                *slot = None;
                in_flight -= 1;
            }
        }
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    if let Some(p) = progress {
        p.fraction(1.0);
    }
    let (pb, pns) = peak.best();
    Ok(BandwidthSummary::new(done, bytes_per_call, elapsed, pb, pns))
}
