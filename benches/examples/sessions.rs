//! Many sessions on one server (a benchmark, not a test; issue 28's "20,000 sessions"): starts a
//! server process and `P` client processes that connect `N` sessions in all to it, each session
//! making one 32 B echo call when it connects and one more after all are connected; then reports
//! the time to connect them all, the server's resident memory (`VmRSS`) and what it registered
//! (`Counters::registered_bytes` + `Counters::recv_buffer_bytes` + `Counters::send_pool_bytes`,
//! the workers' shared send buffers: a session registers none of its own), each per session, and
//! what the client sessions registered for their receive and send buffers (`Client::counters`:
//! a client process's sessions share one endpoint's receive buffers, counted once).
//!
//! ```text
//! cargo run --release -p rpc-perf --example sessions -- [N] [P] [--credits C] [--workers W] [--control K] [--initial I] [--peer-timeout MS|none] [--probe-core C|none] [--transport sim|rdma]
//! ```
//!
//! N defaults to 1,000 sessions, P to 4 client processes; `--credits` is the server's
//! `credits_per_session` and each client's window (default 2); `--workers` the server's workers
//! (default 1); `--control` the server's `max_control_connections` (default 0: the open-file
//! limit less 128, the server raising its soft limit to the hard one; sessions beyond it hold no
//! TCP control connection); `--initial` its `initial_credits` (default 2; the server's default is
//! 32); `--peer-timeout` its `peer_timeout` in ms (default the server's, 6 s: a Ping to each idle
//! session every 2 s, answered by the client processes' endpoints' progress threads; `none`: no
//! probe). The server admits exactly N sessions (`max_sessions`) and polls with
//! `SpinThenYield`. With every session idle, the server's and the client processes' CPU time over
//! 3 s is printed (`idle CPU`): what the idle sessions cost, the probe's Pings and the progress
//! threads' looks. Each client process connects its sessions from one thread,
//! so they share one device context (`Client::connect` takes its thread's endpoint). The
//! machine's 1-minute load is printed next to the figures. The driver process holds one more
//! session of its own and measures 32 B call latency on it (p50 of 20,000 calls) alone, then
//! with every other session connected and idle, a second after their last calls (issue 28:
//! within 10 % of one session alone; measured at once, the aftermath of the round of 20,000
//! calls doubled the p50 in two runs at 32 credits). Its thread
//! is pinned to `--probe-core` (default: the first core after the workers'; `none`: unpinned),
//! and the CPU it ran on and its context switches during the calls are printed with the figure:
//! unpinned on a 2-core machine, the scheduler sometimes puts it on the worker's core, where it
//! takes turns with the worker, one involuntary switch per call (20,012 for 20,000 calls: 40 µs
//! at load 9). On a shared machine the figure also moves from run to run with the load (0.7
//! or 1.5 µs alone, pinned or not, 200 or 5,000 sessions): read it with the load and the switch
//! counts printed next to it.
//!
//! Credits are granted on demand (protocol 12): the server here sets
//! `ServerConfig::initial_credits` to 2 (its default is 32). Idle sessions share their receive
//! WQEs beyond `ServerConfig::srq_idle_wqes` (4,096 per worker), so a worker admits sessions up
//! to `max_sessions` (before, 442 per worker on sim at 2 credits: each reserved 37 of a
//! 16,384-WQE SRQ).
//!
//! With tens of thousands of control connections on loopback, a loaded 2-core machine may drop
//! TCP keepalives at the loopback's backlog (`net.core.netdev_max_backlog`, 1,000 by default;
//! `/proc/net/softnet_stat`'s second column counts the drops), and a control connection whose
//! probes all go unanswered for its liveness time (10 s) is closed; `--control` keeps fewer.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rpc_core::{Client, ClientConfig, PollingPolicy, Server, Transport};
use rpc_perf::host::{load1, own_rss_kib, status_kib, thread_sched};
use rpc_perf::rpc::pb::bench_client::BenchClient;
use rpc_perf::rpc::pb::bench_server::BenchServer;
use rpc_perf::rpc::pb::EchoRequest;
use rpc_perf::rpc::BenchService;

struct Opts {
    sessions: usize,
    procs: usize,
    credits: u16,
    workers: usize,
    /// `ServerConfig::max_control_connections` (0: the server's default).
    control: usize,
    /// `ServerConfig::initial_credits`.
    initial: u16,
    /// The core the latency probe's thread is pinned to (`None`: unpinned).
    probe_core: Option<usize>,
    /// `ServerConfig::peer_timeout` (`None`: no idle probe).
    peer_timeout: Option<Duration>,
    transport: Transport,
}

fn usage(what: &str) -> ! {
    eprintln!("sessions: {what}\nusage: sessions [N] [P] [--credits C] [--workers W] [--control K] [--initial I] [--peer-timeout MS|none] [--probe-core C|none] [--transport sim|rdma]");
    std::process::exit(2)
}

fn parse(mut args: impl Iterator<Item = String>) -> Opts {
    let mut o = Opts {
        sessions: 1000,
        procs: 4,
        credits: 2,
        workers: 1,
        control: 0,
        initial: 2,
        probe_core: None,
        peer_timeout: rpc_core::ServerConfig::default().peer_timeout,
        transport: Transport::Sim,
    };
    let mut probe_core_set = false;
    let mut plain = 0;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--transport" => {
                o.transport = Transport::parse(&args.next().unwrap_or_default())
                    .unwrap_or_else(|e| usage(&format!("--transport: {e}")))
            }
            "--credits" => {
                o.credits = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|c| (1..=4096).contains(c))
                    .unwrap_or_else(|| usage("--credits takes 1..=4096"))
            }
            "--initial" => {
                o.initial = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|c| (1..=4096).contains(c))
                    .unwrap_or_else(|| usage("--initial takes 1..=4096"))
            }
            "--probe-core" => {
                probe_core_set = true;
                o.probe_core = match args.next().as_deref() {
                    Some("none") => None,
                    v => Some(
                        v.and_then(|v| v.parse().ok())
                            .unwrap_or_else(|| usage("--probe-core takes a core number or none")),
                    ),
                }
            }
            "--peer-timeout" => {
                o.peer_timeout = match args.next().as_deref() {
                    Some("none") => None,
                    v => Some(Duration::from_millis(
                        v.and_then(|v| v.parse().ok())
                            .filter(|&ms| ms > 0)
                            .unwrap_or_else(|| usage("--peer-timeout takes milliseconds (above 0) or none")),
                    )),
                }
            }
            "--control" => {
                o.control = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage("--control takes a number of connections"))
            }
            "--workers" => {
                o.workers = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|w| (1..=64).contains(w))
                    .unwrap_or_else(|| usage("--workers takes 1..=64"))
            }
            s => {
                let v: usize = s.parse().unwrap_or_else(|_| usage(&format!("unknown argument {s:?}")));
                match plain {
                    0 => o.sessions = v.max(1),
                    1 => o.procs = v.max(1),
                    _ => usage("at most two numbers: N sessions, P processes"),
                }
                plain += 1;
            }
        }
    }
    if !probe_core_set {
        // The first core after the workers' (they are pinned to 0..W), if the machine has one.
        let ids = core_affinity::get_core_ids().unwrap_or_default();
        o.probe_core = ids.iter().map(|c| c.id).find(|&id| id >= o.workers);
    }
    o
}

/// How long the processes' CPU time is taken over with every session idle.
const IDLE_WINDOW: Duration = Duration::from_secs(3);

fn transport_arg(t: &Transport) -> &'static str {
    match t {
        Transport::Sim => "sim",
        _ => "rdma",
    }
}

/// The server process: serves until its stdin closes; prints `addr ADDR` once listening and,
/// on a `report` line, `report RSS_KIB REGISTERED RECV_BUFFERS SESSIONS DETACHED SEND_POOL
/// OWN_RSS_KIB SQ_STORAGE` (the last `SimStats::sq_storage_bytes`: 0 on rdma).
fn serve(o: &Opts) {
    let rss0 = status_kib("VmRSS:");
    let server = Server::builder()
        .transport(o.transport.clone())
        .polling(PollingPolicy::SpinThenYield { spins: 1000 })
        .worker_cores((0..o.workers).collect())
        // The sessions, and the driver's latency probe.
        .max_sessions(o.sessions + 1)
        .credits_per_session(o.credits)
        // Idle sessions hold few credits (raised while they call): 37 receive WQEs each at 2.
        .initial_credits(o.initial)
        // Sessions idle between the two rounds of calls are kept (an hour); the timer also lets
        // sessions beyond the open-file limit hold no control connection.
        .idle_timeout(Some(Duration::from_secs(3600)))
        // The idle probe (`--peer-timeout`, the server's default unless `none`): the clients,
        // idle on their stdin between the two rounds, answer its Pings through their endpoints'
        // progress threads.
        .peer_timeout(o.peer_timeout)
        .max_control_connections(o.control)
        .add_service(BenchServer::new(BenchService::default()))
        .spawn("127.0.0.1:0")
        .unwrap_or_else(|e| usage(&format!("server start: {e}")));
    println!("addr {} rss0 {rss0}", server.local_addr());
    let _ = std::io::stdout().flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim() == "report" {
            let c = server.counters();
            println!(
                "report {} {} {} {} {} {} {} {}",
                status_kib("VmRSS:"),
                c.registered_bytes,
                c.recv_buffer_bytes,
                c.sessions_opened - c.sessions_closed,
                c.sessions_detached,
                c.send_pool_bytes,
                own_rss_kib(),
                rpc_core::verbs::sim::stats().sq_storage_bytes
            );
            let _ = std::io::stdout().flush();
        }
    }
    server.shutdown();
}

fn call(c: &BenchClient, i: usize) -> Result<(), String> {
    let r = c
        .echo(EchoRequest { payload: vec![i as u8; 32].into(), resp_size: 32 })
        .map_err(|e| format!("session {i}: {e}"))?;
    if r.payload.len() == 32 {
        Ok(())
    } else {
        Err(format!("session {i}: a {}-byte answer", r.payload.len()))
    }
}

/// A client process: connects `n` sessions to `addr` (one call each), prints `connected SECS
/// BUFFER_BYTES OWN_RSS_KIB` (what its sessions registered for receive and send buffers, from
/// `Client::counters`, and its resident memory less the pages of peers' sim segments), waits for
/// a `go` line, makes one more call on every session, prints `done`, then holds its
/// sessions until stdin closes.
/// The clients' configuration: window `--credits`, the smallest ring, no probe of the server.
fn client_config(o: &Opts) -> ClientConfig {
    ClientConfig {
        transport: o.transport.clone(),
        polling: PollingPolicy::SpinThenYield { spins: 100 },
        window: o.credits,
        ring_bytes: rpc_core::wire::MIN_RING_LEN,
        peer_timeout: None,
        ..ClientConfig::default()
    }
}

/// p50 in µs of `LAT_CALLS` 32 B echo calls on `c`, one at a time (after 1,000 to warm up), and
/// where the calling thread ran meanwhile: the CPU it ended on and its context switches
/// (voluntary, involuntary) during the calls (see `thread_sched`).
fn p50_us(c: &BenchClient) -> (f64, String) {
    const LAT_CALLS: usize = 20_000;
    for i in 0..1000 {
        call(c, i).unwrap_or_else(|e| usage(&e));
    }
    let before = thread_sched();
    let mut ns: Vec<u64> = (0..LAT_CALLS)
        .map(|i| {
            let t = Instant::now();
            call(c, i).unwrap_or_else(|e| usage(&e));
            t.elapsed().as_nanos() as u64
        })
        .collect();
    let sched = match (before, thread_sched()) {
        (Some((_, v0, n0)), Some((cpu, v1, n1))) => {
            format!("on cpu {cpu}, {} voluntary and {} involuntary switches", v1 - v0, n1 - n0)
        }
        _ => "scheduling unknown".into(),
    };
    ns.sort_unstable();
    (ns[ns.len() / 2] as f64 / 1000.0, sched)
}

fn clients(o: &Opts, addr: &str, n: usize) {
    let cfg = client_config(o);
    let t = Instant::now();
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let c = Client::connect_with(addr, &cfg).unwrap_or_else(|e| usage(&format!("session {i}: {e}")));
        let c = BenchClient::new(c);
        call(&c, i).unwrap_or_else(|e| usage(&e));
        all.push(c);
    }
    let secs = t.elapsed().as_secs_f64();
    // The sessions of this thread share its endpoint's receive buffers (each reports them all):
    // counted once; send buffers are each session's.
    let counters: Vec<_> = all.iter().map(|c| c.client().counters()).collect();
    let buffers = counters.iter().map(|k| k.recv_buffer_bytes).max().unwrap_or(0)
        + counters.iter().map(|k| k.send_pool_bytes).sum::<u64>();
    println!("connected {secs:.3} {buffers} {}", own_rss_kib());
    let _ = std::io::stdout().flush();
    let mut lines = std::io::stdin().lock().lines();
    if matches!(lines.next(), Some(Ok(l)) if l.trim() == "go") {
        for (i, c) in all.iter().enumerate() {
            call(c, i).unwrap_or_else(|e| usage(&e));
        }
        println!("done");
        let _ = std::io::stdout().flush();
    }
    for _ in lines {}
}

fn main() {
    // Warnings and errors of the runtime (a session refused or closed) on stderr; RUST_LOG for more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let mut args = std::env::args().skip(1).peekable();
    match args.peek().map(String::as_str) {
        Some("--serve") => {
            args.next();
            return serve(&parse(args));
        }
        Some("--clients") => {
            args.next();
            let addr = args.next().unwrap_or_else(|| usage("--clients ADDR N"));
            let n: usize =
                args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage("--clients ADDR N"));
            return clients(&parse(args), &addr, n);
        }
        _ => {}
    }
    let o = parse(args);
    let exe = std::env::current_exe().expect("current_exe");
    let common = [
        "--credits".to_string(),
        o.credits.to_string(),
        "--workers".into(),
        o.workers.to_string(),
        "--control".into(),
        o.control.to_string(),
        "--initial".into(),
        o.initial.to_string(),
        "--transport".into(),
        transport_arg(&o.transport).into(),
        "--peer-timeout".into(),
        o.peer_timeout.map_or("none".into(), |t| t.as_millis().to_string()),
    ];
    let mut server = Command::new(&exe)
        .arg("--serve")
        .arg(o.sessions.to_string())
        .args(&common)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("server process");
    let mut server_out = BufReader::new(server.stdout.take().expect("stdout")).lines();
    let mut server_in = server.stdin.take().expect("stdin");
    let first = server_out.next().and_then(Result::ok).unwrap_or_default();
    let mut f = first.split_whitespace();
    let (Some("addr"), Some(addr)) = (f.next(), f.next()) else { usage(&format!("server said {first:?}")) };
    let addr = addr.to_string();
    let report = |server_in: &mut std::process::ChildStdin,
                  server_out: &mut std::io::Lines<BufReader<std::process::ChildStdout>>| {
        writeln!(server_in, "report").expect("server stdin");
        let l = server_out.next().and_then(Result::ok).unwrap_or_default();
        let v: Vec<u64> = l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
        if v.len() != 8 {
            usage(&format!("server report {l:?}"));
        }
        (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
    };
    std::thread::sleep(Duration::from_millis(100));
    let idle = report(&mut server_in, &mut server_out);
    // One session of this process: 32 B call latency with it alone, and again once every other
    // session is connected (and has called twice).
    // On a thread of its own, pinned to a core no worker is pinned to (`--probe-core`): a probe
    // that the scheduler puts on the worker's core takes turns with it (a context switch per
    // call). The client processes spawned below do not inherit the pinning.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (lat_tx, lat_rx) = std::sync::mpsc::channel();
    let probe_addr = addr.clone();
    let probe_cfg = client_config(&o);
    let probe_core = o.probe_core;
    let prober = std::thread::spawn(move || {
        if let Some(id) = probe_core {
            let ids = core_affinity::get_core_ids().unwrap_or_default();
            match ids.into_iter().find(|c| c.id == id) {
                Some(c) => {
                    core_affinity::set_for_current(c);
                }
                None => usage(&format!("--probe-core {id}: no such core")),
            }
        }
        let probe = Client::connect_with(probe_addr.as_str(), &probe_cfg)
            .unwrap_or_else(|e| usage(&format!("probe: {e}")));
        let probe = BenchClient::new(probe);
        let _ = lat_tx.send(p50_us(&probe));
        if go_rx.recv().is_ok() {
            let _ = lat_tx.send(p50_us(&probe));
        }
    });
    let alone = lat_rx.recv().unwrap_or_else(|_| usage("the probe thread failed"));
    let t = Instant::now();
    let mut kids = Vec::new();
    for p in 0..o.procs {
        let n = o.sessions / o.procs + usize::from(p < o.sessions % o.procs);
        let mut k = Command::new(&exe)
            .arg("--clients")
            .arg(&addr)
            .arg(n.to_string())
            .args(&common)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("client process");
        let out = BufReader::new(k.stdout.take().expect("stdout")).lines();
        kids.push((k, out));
    }
    let (mut slowest, mut client_buffers, mut client_rss) = (0f64, 0u64, 0u64);
    for (_, out) in kids.iter_mut() {
        let l = out.next().and_then(Result::ok).unwrap_or_default();
        let v: Vec<&str> = l.strip_prefix("connected ").unwrap_or_default().split_whitespace().collect();
        match (
            v.first().and_then(|s| s.parse::<f64>().ok()),
            v.get(1).and_then(|s| s.parse::<u64>().ok()),
            v.get(2).and_then(|s| s.parse::<u64>().ok()),
        ) {
            (Some(s), Some(b), Some(r)) => {
                slowest = slowest.max(s);
                client_buffers += b;
                client_rss += r;
            }
            _ => usage(&format!("a client process said {l:?}")),
        }
    }
    let connect = t.elapsed();
    let full = report(&mut server_in, &mut server_out);
    let t = Instant::now();
    for (k, _) in kids.iter_mut() {
        writeln!(k.stdin.as_mut().expect("stdin"), "go").expect("client stdin");
    }
    for (_, out) in kids.iter_mut() {
        let l = out.next().and_then(Result::ok).unwrap_or_default();
        if l != "done" {
            usage(&format!("a client process said {l:?}"));
        }
    }
    let second = t.elapsed();
    // The probe measures with the sessions idle (issue 28: "with 20,000 idle sessions"), not in
    // the aftermath of the round that just ended.
    std::thread::sleep(Duration::from_secs(1));
    // What the idle sessions cost the CPU (the server's probe and the clients' progress threads
    // answering it): the processes' CPU time over a window of IDLE_WINDOW, all sessions idle.
    let pids: Vec<u32> = kids.iter().map(|(k, _)| k.id()).collect();
    let cpu = |pid| rpc_perf::host::process_cpu_ns(pid).unwrap_or(0);
    let (s0, c0): (u64, u64) = (cpu(server.id()), pids.iter().map(|&p| cpu(p)).sum());
    let w = Instant::now();
    std::thread::sleep(IDLE_WINDOW);
    let (s1, c1): (u64, u64) = (cpu(server.id()), pids.iter().map(|&p| cpu(p)).sum());
    let span = w.elapsed().as_nanos() as f64 / 100.0;
    let (idle_server, idle_clients) =
        (s1.saturating_sub(s0) as f64 / span, c1.saturating_sub(c0) as f64 / span);
    let _ = go_tx.send(());
    let crowded = lat_rx.recv().unwrap_or_else(|_| usage("the probe thread failed"));
    let _ = prober.join();
    let n = o.sessions as f64;
    println!(
        "{} sessions ({} without a control connection) from {} processes ({}, credits {}, {} workers): all connected \
         in {:.2} s (slowest process {:.2} s); one more call on every session in {:.2} s",
        full.3 - 1,
        full.4,
        o.procs,
        transport_arg(&o.transport),
        o.credits,
        o.workers,
        connect.as_secs_f64(),
        slowest,
        second.as_secs_f64()
    );
    println!(
        "idle CPU, every session idle for {:.0} s (the server's probe {}; the clients' progress threads): server \
         process {:.1} % of a core (its worker spins and yields: an upper bound), the {} client processes {:.1} % \
         together; load1 {}",
        IDLE_WINDOW.as_secs_f64(),
        o.peer_timeout.map_or("off".into(), |t| format!("every {} ms", t.as_millis() / 3)),
        idle_server,
        o.procs,
        idle_clients,
        load1()
    );
    println!(
        "server per session: VmRSS {:.1} KiB ({:.1} KiB of its own: less the pages of the clients' sim segments it \
         touched), pinned {:.1} KiB (session memory {:.1} KiB + SRQ receive buffers {:.1} KiB \
         + the workers' send buffers {:.1} KiB, {} KiB in all); sim send-queue storage {:.0} B \
         (SimStats::sq_storage_bytes); server VmRSS idle {:.1} MiB, with all sessions {:.1} MiB; load1 {}",
        (full.0 - idle.0) as f64 / n,
        (full.6 - idle.6) as f64 / n,
        ((full.1 + full.2 + full.5) - (idle.1 + idle.2 + idle.5)) as f64 / 1024.0 / n,
        (full.1 - idle.1) as f64 / 1024.0 / n,
        (full.2 - idle.2) as f64 / 1024.0 / n,
        (full.5 - idle.5) as f64 / 1024.0 / n,
        full.5 >> 10,
        (full.7 as f64 - idle.7 as f64) / n,
        idle.0 as f64 / 1024.0,
        full.0 as f64 / 1024.0,
        load1()
    );
    println!(
        "client per session: receive and send buffers {:.1} KiB (Client::counters after one call: each \
         process's endpoint's recv_buffer_bytes, shared by its sessions, and every session's \
         send_pool_bytes), the client processes' own RSS {:.1} KiB (their sim segments included: \
         rings, buffers, CQs, QPs)",
        client_buffers as f64 / 1024.0 / n,
        client_rss as f64 / n
    );
    let ((alone, alone_sched), (crowded, crowded_sched)) = (alone, crowded);
    println!(
        "32 B call p50 on one more session: {alone:.2} us alone, {crowded:.2} us with the {} others connected ({:.2}x); load1 {}",
        o.sessions,
        crowded / alone,
        load1()
    );
    println!(
        "  the probe's thread ({}; the server's workers on cores 0..{}): alone {alone_sched}; crowded {crowded_sched}",
        o.probe_core.map_or("unpinned".to_string(), |c| format!("pinned to core {c}")),
        o.workers
    );
    drop(server_in);
    for (mut k, _) in kids {
        drop(k.stdin.take());
        let _ = k.wait();
    }
    let _ = server.wait();
}
