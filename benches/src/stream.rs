//! stream_bw: server-streaming messages/s and goodput. The client opens one server stream of the
//! benchmark service (`Bench.Stream`, proto/bench.proto) per size and takes its messages as fast
//! as it can on its own thread (the per-thread `Client`); the server's producer thread sends
//! `-n` messages of `-s` payload bytes (or, with `-D`, messages until the client cancels the
//! stream after that long). Every message's length is checked, and the stream must end cleanly
//! after exactly the messages asked for. A warm-up stream of `--warmup` messages runs first.
//!
//! The figures count the streamed payload one way (the request is a few bytes); the RPC columns
//! read messages/s and goodput.

use std::time::Instant;

use rpc_core::{CallOptions, Status};

use crate::cli::{Args, Limit, TestKind};
use crate::error::PerfError;
use crate::oob::OobChannel;
use crate::progress::Progress;
use crate::results::Measure;
use crate::rpc;
use crate::rpc::pb::bench_client::BenchClient;
use crate::rpc::pb::StreamRequest;
use crate::sink::Sink;
use crate::stats::{BandwidthSummary, PeakWindow};
use crate::transport::Resolved;

/// Messages between two samples of the peak-rate window and of the progress bar.
const SAMPLE_EVERY: u64 = 256;

/// Messages asked for when the run is timed (`-D`): the stream is cancelled at the time.
const UNBOUNDED: u64 = u64::MAX / 2;

fn rpc_err(what: &str, s: Status) -> PerfError {
    PerfError::Rpc(format!("{what}: {s}"))
}

/// Client side of stream_bw over all sizes (the message size is `-s`, or `--resp-size`).
///
/// # Errors
/// Setup, connect and stream errors; a message of the wrong length; a stream that ends early.
pub fn run_client(
    args: &Args,
    resolved: Resolved,
    test: TestKind,
    ch: &mut OobChannel,
    sink: &mut Sink,
) -> Result<(), PerfError> {
    let started = rpc::start(args, resolved, test, 1, ch)?;
    let addr = started.addr;
    let cfg = rpc::client_config(args, resolved, rpc::polling(args.poll), 1);
    let client =
        BenchClient::connect_with(addr, &cfg).map_err(|s| rpc_err(&format!("connecting to {addr}"), s))?;
    let mut extra = vec![("Producer", "a server thread, StreamSink::send per message".to_string())];
    if !args.all {
        extra.push(("Message size", format!("{}[B]", args.rpc_sizes(args.size).1)));
    }
    let what = ("BW", "streamed payload (server to client)");
    let info = rpc::banner_info(args, &started, &cfg, "1 stream".into(), extra, false, what);
    sink.begin_test(test, started.sizes.len(), info);
    rpc::each_size(args, test, &started, 1, sink, |_, size, limit, progress| {
        // Warm-up: a stream of its own, unmeasured.
        if args.warmup > 0 {
            take(&client, size, Limit::Iters(args.warmup), None)?;
        }
        Ok(Measure::Bandwidth(take(&client, size, limit, Some(progress))?))
    })?;
    let c = client.client().counters();
    drop(client);
    rpc::finish(ch, sink)?;
    println!(
        " client counters: rpcs {}, credit stalls {}; sim RNR waits {}",
        c.rpcs,
        c.credit_stalls,
        rpc_core::verbs::sim::stats().rnr_stalls
    );
    Ok(())
}

/// Opens one stream of `size`-byte messages and takes them until `limit`: all `n` of
/// `Limit::Iters(n)` and the clean end after them, or as many as come in the time of
/// `Limit::Duration` (then the stream is dropped, which cancels it).
fn take(
    client: &BenchClient,
    size: usize,
    limit: Limit,
    progress: Option<&Progress>,
) -> Result<BandwidthSummary, PerfError> {
    let count = match limit {
        Limit::Iters(n) => n,
        Limit::Duration(_) => UNBOUNDED,
    };
    let req = StreamRequest { count, size: size as u32 };
    let peak_every = ((1u64 << 20) / size.max(1) as u64).clamp(1, SAMPLE_EVERY);
    let mut peak = PeakWindow::new(PeakWindow::DEFAULT_MIN_NS);
    let start = Instant::now();
    let mut stream =
        client.stream_with(&req, &CallOptions::default()).map_err(|s| rpc_err("Bench.Stream", s))?;
    let mut got = 0u64;
    loop {
        let Some(m) = stream.message().map_err(|s| rpc_err("Bench.Stream", s))? else {
            break;
        };
        if m.payload.len() != size {
            return Err(PerfError::Rpc(format!(
                "Bench.Stream message {got} has {} bytes, expected {size}",
                m.payload.len()
            )));
        }
        got += 1;
        if got % peak_every == 0 {
            let e = start.elapsed();
            peak.completed(e.as_nanos() as u64, got * size as u64);
            if let Some(p) = progress {
                p.fraction(crate::measure::fraction(limit, got, e));
            }
            if matches!(limit, Limit::Duration(d) if e >= d) {
                break;
            }
        }
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    if count != UNBOUNDED && got != count {
        return Err(PerfError::Rpc(format!("Bench.Stream ended cleanly after {got} of {count} messages")));
    }
    drop(stream);
    let (pb, pns) = peak.best();
    Ok(BandwidthSummary::new(got, size as u64, elapsed, pb, pns))
}
