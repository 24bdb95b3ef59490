//! The three ways to run: server (`rpc-perf`), client (`rpc-perf HOST`) and both in one process
//! on two pinned cores (`rpc-perf --loopback`). Generic over the provider; `transport` picks it.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};

use rpc_core::verbs::Provider;

use crate::cli::{Args, TestKind};
use crate::error::PerfError;
use crate::oob::{Msg, OobChannel, OobError, OOB_VERSION};
use crate::report;
use crate::results::{MemcpyFigure, RunReport};
use crate::rpc;
use crate::sink::Sink;
use crate::transport::Resolved;

/// Runs what `args` asks on provider `P`. Returns the report on the client side (and in
/// loopback), `None` on the server side.
///
/// # Errors
/// The first failure, named.
pub fn run<P: Provider>(args: &Args, resolved: Resolved) -> Result<Option<RunReport>, PerfError> {
    if args.loopback {
        loopback::<P>(args, resolved).map(Some)
    } else if let Some(host) = &args.host {
        client::<P>(args, resolved, host).map(Some)
    } else {
        server::<P>(args, resolved).map(|()| None)
    }
}

/// Client mode: connects to `host` (port `-p`) and runs the tests.
///
/// # Errors
/// Connection and test failures.
pub fn client<P: Provider>(args: &Args, resolved: Resolved, host: &str) -> Result<RunReport, PerfError> {
    let target =
        if host.contains(':') && !host.starts_with('[') && host.parse::<std::net::Ipv6Addr>().is_err() {
            host.to_string()
        } else {
            format!("{host}:{}", args.port)
        };
    let addrs: Vec<_> = target
        .to_socket_addrs()
        .map_err(|source| PerfError::Io { what: format!("resolving {target}"), source })?
        .collect();
    let stream = TcpStream::connect(&addrs[..]).map_err(|source| PerfError::Io {
        what: format!("connecting to the rpc-perf server at {target}"),
        source,
    })?;
    client_session::<P>(args, resolved, OobChannel::new(stream)?)
}

/// Server mode: waits for one client on `-p` and serves its tests.
///
/// # Errors
/// Listen, accept and test failures.
pub fn server<P: Provider>(args: &Args, resolved: Resolved) -> Result<(), PerfError> {
    let addr = format!("0.0.0.0:{}", args.port);
    let l = TcpListener::bind(&addr).map_err(|source| listen_error(&addr, source))?;
    println!("{}", report::RESULT_LINE);
    println!(" rpc-perf server ({}) waiting for a client on TCP port {}", P::NAME, args.port);
    let rpc_bind = format!("0.0.0.0:{}", args.port.wrapping_add(1));
    let core = args.cores.as_ref().map(|c| c[0]);
    let mut rpc = rpc::ServerState::new(resolved, core, rpc_bind);
    if args.persist {
        let port = rpc.ensure(args, "--persist", crate::cli::DEFAULT_SIZE, 32)?;
        println!(" benchmark service rpcperf.Bench (proto/bench.proto) on TCP port {port}, until killed");
    }
    println!("{}", report::RESULT_LINE);
    loop {
        let (stream, peer) =
            l.accept().map_err(|source| PerfError::Io { what: format!("accepting on {addr}"), source })?;
        println!(" client {peer} connected");
        let res = server_session::<P>(args, OobChannel::new(stream)?, &mut rpc);
        if !args.persist {
            return res;
        }
        match res {
            Ok(()) => println!(" client {peer} done"),
            Err(e) => println!(" client {peer} failed: {e}"),
        }
    }
}

/// A failure to listen on `addr`; a port in use gets the hint to pick another with `-p`.
pub fn listen_error(addr: &str, source: std::io::Error) -> PerfError {
    if source.kind() == std::io::ErrorKind::AddrInUse {
        return PerfError::Setup(format!("listening on {addr}: {source}{PORT_IN_USE}"));
    }
    PerfError::Io { what: format!("listening on {addr}"), source }
}

/// The hint after a listen error for a port in use (the server's `-p`, or its RPC server's `-p` + 1).
pub const PORT_IN_USE: &str =
    " (is another rpc-perf server running? pick another port with -p/--port, the same on the client; \
     the RPC server takes the next one)";

/// Loopback: the server on one core, the client on another, joined over TCP on 127.0.0.1.
///
/// # Errors
/// Either side's failure (the client's first).
pub fn loopback<P: Provider>(args: &Args, resolved: Resolved) -> Result<RunReport, PerfError> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|source| PerfError::Io { what: "listening on 127.0.0.1".into(), source })?;
    let addr = l.local_addr().map_err(|source| PerfError::Io { what: "local_addr".into(), source })?;
    let (server_core, client_core) = pick_cores(args);
    // The cores picked, for what runs after this thread is pinned (`--servers`' processes).
    let mut filled = args.clone();
    if let (None, Some(s), Some(c)) = (&args.cores, server_core, client_core) {
        filled.cores = Some(vec![s.id, c.id]);
    }
    let args = &filled;
    let sargs = args.clone();
    let server = std::thread::Builder::new()
        .name("rpc-perf-server".into())
        .spawn(move || -> Result<(), PerfError> {
            if let Some(c) = server_core {
                core_affinity::set_for_current(c);
            }
            let (stream, _) = l
                .accept()
                .map_err(|source| PerfError::Io { what: "accepting on loopback".into(), source })?;
            let mut rpc = rpc::ServerState::new(resolved, server_core.map(|c| c.id), "127.0.0.1:0".into());
            server_session::<P>(&sargs, OobChannel::new(stream)?, &mut rpc)
        })
        .map_err(|source| PerfError::Io { what: "spawning the server thread".into(), source })?;
    if let Some(c) = client_core {
        core_affinity::set_for_current(c);
    }
    let core =
        |c: Option<core_affinity::CoreId>| c.map_or("unpinned".to_string(), |c| format!("core {}", c.id));
    println!(
        " rpc-perf --loopback on {}: server (and its RPC worker) on {}, client on {}",
        P::NAME,
        core(server_core),
        core(client_core)
    );
    let stream = TcpStream::connect(addr)
        .map_err(|source| PerfError::Io { what: format!("connecting to {addr}"), source })?;
    let res = client_session::<P>(args, resolved, OobChannel::new(stream)?);
    let srv = server.join().unwrap_or_else(|_| Err(PerfError::Setup("the server thread panicked".into())));
    let report = res?;
    srv?;
    Ok(report)
}

fn pick_cores(args: &Args) -> (Option<core_affinity::CoreId>, Option<core_affinity::CoreId>) {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let find = |want: usize| ids.iter().copied().find(|c| c.id == want);
    match &args.cores {
        Some(c) => (find(c[0]), find(c[1])),
        None if ids.len() >= 2 => (Some(ids[0]), Some(ids[1])),
        None => (None, None),
    }
}

/// The client's side of a session: every test in order, then the ratios, JSON and plot.
///
/// # Errors
/// The first failing test.
pub fn client_session<P: Provider>(
    args: &Args,
    resolved: Resolved,
    mut ch: OobChannel,
) -> Result<RunReport, PerfError> {
    let mut sink = Sink::new(P::NAME, !args.no_progress);
    for &test in &args.tests {
        if test.is_channel() {
            crate::chan::run_client(args, resolved, test, &mut ch, &mut sink)?;
        } else if test.is_stream() {
            crate::stream::run_client(args, resolved, test, &mut ch, &mut sink)?;
        } else if test.is_rpc() {
            rpc::run_client(args, resolved, test, &mut ch, &mut sink)?;
        } else {
            crate::raw::run_client::<P>(args, test, &mut ch, &mut sink)?;
        }
    }
    let mut report = sink.report;
    report.config = crate::results::RunConfig::from_args(args);
    finish(args, &mut report)?;
    Ok(report)
}

/// The server's side: serves tests until the client disconnects.
///
/// # Errors
/// A failing test (also reported to the client).
pub fn server_session<P: Provider>(
    args: &Args,
    mut ch: OobChannel,
    rpc: &mut rpc::ServerState,
) -> Result<(), PerfError> {
    loop {
        let msg = match ch.recv("waiting for the next test") {
            Ok(m) => m,
            Err(OobError::Closed { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let res = match msg {
            Msg::Setup { version, .. } if version != OOB_VERSION => Err(PerfError::Setup(format!(
                "client speaks out-of-band version {version}, this server {OOB_VERSION}: use the same rpc-perf on both sides"
            ))),
            Msg::Setup { test, max_size, concurrency, .. } if test.is_rpc() => {
                rpc.serve(args, test, max_size, concurrency, &mut ch)
            }
            Msg::Setup { test, max_size, .. } => crate::raw::serve::<P>(args, test, max_size, &mut ch),
            other => Err(PerfError::Setup(format!("expected a test setup, got {other:?}"))),
        };
        if let Err(e) = res {
            let _ = ch.send(&Msg::Error { message: e.to_string() });
            return Err(e);
        }
    }
}

/// After the tests: overhead ratios, memcpy yardstick for rpc_bw, JSON and plot.
fn finish(args: &Args, report: &mut RunReport) -> Result<(), PerfError> {
    report.compute_ratios();
    for r in &report.rpc_over_send_lat_p50 {
        let rpc = report
            .results
            .iter()
            .find(|x| x.test == TestKind::RpcLat && x.bytes == r.bytes && x.concurrency == 1);
        let raw = report.results.iter().find(|x| x.test == TestKind::SendLat && x.bytes == r.bytes);
        if let (Some(a), Some(b)) = (rpc.and_then(|x| x.latency()), raw.and_then(|x| x.latency())) {
            println!("{}", report::ratio_line("RPC overhead", r.bytes, a.typical_ns, b.typical_ns));
        }
    }
    let bw: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.test == TestKind::RpcBw)
        .filter_map(|r| Some((r.req_bytes.max(r.resp_bytes), r.bandwidth()?.goodput_bytes_per_s())))
        .filter(|(sz, _)| *sz >= 64 << 10)
        .collect();
    for (size, goodput) in bw {
        let (hot, cold) = (crate::memcpy::hot_mb_per_s(size), crate::memcpy::cold_mb_per_s(size));
        let mb = goodput / (1u64 << 20) as f64;
        let (of_hot, of_cold) = (mb / hot, mb / cold);
        println!(
            " memcpy of {size} B: {hot:.0} MB/sec hot (same buffers), {cold:.0} MB/sec cold (64 MiB set); \
             rpc_bw average goodput {mb:.0} MB/sec = {:.0}% of hot, {:.0}% of cold",
            of_hot * 100.0,
            of_cold * 100.0
        );
        report.memcpy.push(MemcpyFigure {
            bytes: size,
            hot_mb_per_s: hot,
            cold_mb_per_s: cold,
            rpc_fraction_of_hot: of_hot,
            rpc_fraction_of_cold: of_cold,
        });
    }
    if let Some(path) = &args.json {
        let text = report.to_json().map_err(|e| PerfError::Setup(format!("--json: {e}")))?;
        std::fs::write(path, text)
            .map_err(|source| PerfError::Io { what: format!("--json {}", path.display()), source })?;
    }
    if let Some(path) = &args.plot {
        crate::plot::draw(report, path).map_err(PerfError::Setup)?;
    }
    Ok(())
}
