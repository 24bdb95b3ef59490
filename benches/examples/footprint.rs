//! Footprint of a default server (a benchmark, not a test): starts and stops
//! `Server::builder().spawn("127.0.0.1:0")` (the default configuration, no service) N times and
//! reports the median and p99 of the start time (`spawn` until it returns) and of the stop time
//! (`ServerHandle::shutdown` until it returns), the resident memory of the process while one
//! server idles (`VmRSS` of `/proc/self/status`, read 50 ms after the start, before and after
//! one client session) and its peak (`VmHWM`), and what the server registered
//! (`Counters::recv_buffer_bytes`, `Counters::registered_bytes`, of which
//! `Counters::send_area_bytes` for send mirrors and staging areas, `Counters::ring_bytes` for
//! receive rings), and `Counters::send_pool_bytes` (the worker's send buffers, shared by its
//! sessions and registered as sends need them: an idle session holds none). The idle session's
//! line sums what the server pins for it: its session memory (nothing at connect; a receive
//! ring only once its client sends bodies above the eager threshold, `ServerConfig::ring_idle`,
//! and a send mirror and staging area only once it sends such bodies,
//! `ServerConfig::send_area_idle`) and the SRQ receive buffers of its reservation
//! (`Counters::srq_reserved`: its `ServerConfig::initial_credits`, credits being granted on
//! demand; the worker's buffers also hold room for raises).
//!
//! ```text
//! cargo run --release -p rpc-perf --example footprint -- [N] [--transport sim|rdma]
//! ```
//!
//! N defaults to 20. The machine's 1-minute load average is printed next to the figures:
//! wall-clock figures on a shared machine are noisy, so compare medians of runs at a similar load.
//! The RSS of the first idle server is taken before any start and stop loop (nothing freed by an
//! earlier server is counted).

use std::time::{Duration, Instant};

use rpc_core::{Client, ClientConfig, PollingPolicy, Server, ServerHandle, Transport};
use rpc_perf::host::{load1, status_kib};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn spawn(transport: &Transport) -> ServerHandle {
    Server::builder().transport(transport.clone()).spawn("127.0.0.1:0").expect("server start")
}

fn main() {
    let mut n = 20usize;
    let mut transport = Transport::Sim;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--transport" => {
                transport = Transport::parse(&args.next().unwrap_or_default()).expect("--transport")
            }
            s => n = s.parse().expect("N: a number of starts and stops"),
        }
    }
    let rss0 = status_kib("VmRSS:");
    let server = spawn(&transport);
    std::thread::sleep(Duration::from_millis(50));
    let idle = status_kib("VmRSS:");
    let c = server.counters();
    println!(
        "idle default server: VmRSS {:.1} MiB (process before the start: {:.1} MiB), receive buffers \
         registered {} KiB, session memory registered {} KiB",
        idle as f64 / 1024.0,
        rss0 as f64 / 1024.0,
        c.recv_buffer_bytes >> 10,
        c.registered_bytes >> 10
    );
    // One session, to show what an admitted session adds.
    let cfg = ClientConfig {
        transport: transport.clone(),
        polling: PollingPolicy::SpinThenYield { spins: 1000 },
        ..ClientConfig::default()
    };
    let before = server.counters();
    match Client::connect_with(server.local_addr(), &cfg) {
        Ok(client) => {
            std::thread::sleep(Duration::from_millis(50));
            let c = server.counters();
            println!(
                "with one client session: VmRSS {:.1} MiB (client included), receive buffers registered \
                 {} KiB, session memory registered {} KiB (receive rings {} KiB, send mirrors and staging \
                 areas {} KiB), the worker's send buffers {} KiB (shared by its sessions, {} in use)",
                status_kib("VmRSS:") as f64 / 1024.0,
                c.recv_buffer_bytes >> 10,
                c.registered_bytes >> 10,
                c.ring_bytes >> 10,
                c.send_area_bytes >> 10,
                c.send_pool_bytes >> 10,
                c.send_bufs_in_use
            );
            let session = c.registered_bytes - before.registered_bytes;
            // What the session reserves of its worker's SRQ (its initial credits, no ring); the
            // buffers registered also hold the worker's room for raises (credits on demand).
            let buf = c.recv_buffer_bytes / c.recv_buffers.max(1);
            let srq = (c.srq_reserved - before.srq_reserved) * buf;
            println!(
                "per idle session: {:.2} MiB pinned ({} KiB session memory + {} KiB SRQ receive buffers: \
                 {} WQEs reserved of {} posted)",
                (session + srq) as f64 / (1 << 20) as f64,
                session >> 10,
                srq >> 10,
                c.srq_reserved - before.srq_reserved,
                c.recv_buffers
            );
            drop(client);
        }
        Err(e) => println!("client connect failed: {e}"),
    }
    server.shutdown();
    let (mut starts, mut stops) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        let s = spawn(&transport);
        starts.push(t.elapsed());
        let t = Instant::now();
        s.shutdown();
        stops.push(t.elapsed());
    }
    starts.sort();
    stops.sort();
    println!(
        "{n} starts and stops of a default server ({}): start median {} p99 {}, stop median {} p99 {}; \
         VmHWM {:.1} MiB; load1 {}",
        match transport {
            Transport::Sim => "sim",
            _ => "rdma",
        },
        ms(pct(&starts, 0.5)),
        ms(pct(&starts, 0.99)),
        ms(pct(&stops, 0.5)),
        ms(pct(&stops, 0.99)),
        status_kib("VmHWM:") as f64 / 1024.0,
        load1()
    );
}
