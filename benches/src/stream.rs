//! stream_bw: server-streaming messages/s and goodput. The client opens one server stream of the
//! benchmark service (`Bench.Stream`, proto/bench.proto) per size and takes its messages as fast
//! as it can on its own thread (the per-thread `Client`); the server's producer thread sends
//! `-n` messages of `-s` payload bytes (or, with `-D`, messages until the client cancels the
//! stream after that long). Every message's length is checked, and the stream must end cleanly
//! after exactly the messages asked for. A warm-up stream of `--warmup` messages runs first.
//!
//! stream_in_bw: client-streaming, the same from the client's side: one stream (`Bench.Upload`)
//! of `-n` messages of `-s` payload bytes sent as fast as credits allow, then `finish`; the
//! server's answer must count every message and byte. stream_bidi_bw: one bidirectional stream
//! (`Bench.Exchange`), `-n` messages of `-s` bytes each way: the client sends and takes the
//! server's answers (one per message, same size) in one thread, interleaved.
//!
//! The figures count the streamed payload one way (the request is a few bytes; for
//! stream_bidi_bw the messages the client received); the RPC columns read messages/s and
//! goodput.

use std::time::Instant;

use rpc_core::{CallOptions, Status};

use crate::cli::{Args, Limit, TestKind};
use crate::error::PerfError;
use crate::oob::OobChannel;
use crate::progress::Progress;
use crate::results::Measure;
use crate::rpc;
use crate::rpc::pb::bench_client::BenchClient;
use crate::rpc::pb::{EchoRequest, StreamRequest};
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

/// What the three stream loops share: the peak-rate window, the progress bar and the time limit,
/// sampled every `SAMPLE_EVERY` messages (at least every MiB of payload).
struct Sampler<'a> {
    size: u64,
    limit: Limit,
    progress: Option<&'a Progress>,
    every: u64,
    peak: PeakWindow,
    start: Instant,
}

impl<'a> Sampler<'a> {
    /// Starts the clock.
    fn start(size: usize, limit: Limit, progress: Option<&'a Progress>) -> Self {
        Sampler {
            size: size as u64,
            limit,
            progress,
            every: ((1u64 << 20) / size.max(1) as u64).clamp(1, SAMPLE_EVERY),
            peak: PeakWindow::new(PeakWindow::DEFAULT_MIN_NS),
            start: Instant::now(),
        }
    }

    /// `done` messages have been counted; true when a `-D` run's time is up.
    fn counted(&mut self, done: u64) -> bool {
        if done % self.every != 0 {
            return false;
        }
        let e = self.start.elapsed();
        self.peak.completed(e.as_nanos() as u64, done * self.size);
        if let Some(p) = self.progress {
            p.fraction(crate::measure::fraction(self.limit, done, e));
        }
        matches!(self.limit, Limit::Duration(d) if e >= d)
    }

    /// The summary of `done` messages, timed from `start` to now.
    fn summary(&self, done: u64) -> BandwidthSummary {
        let elapsed = self.start.elapsed().as_nanos() as u64;
        let (pb, pns) = self.peak.best();
        BandwidthSummary::new(done, self.size, elapsed, pb, pns)
    }
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
    let producer = match test {
        TestKind::StreamInBw => "the client thread, ClientStreaming::send per message",
        TestKind::StreamBidiBw => "the client thread sends, a server thread answers each (StreamSink::send)",
        _ => "a server thread, StreamSink::send per message",
    };
    let mut extra = vec![("Producer", producer.to_string())];
    if !args.all {
        extra.push(("Message size", format!("{}[B]", args.rpc_sizes(args.size).1)));
    }
    let what = match test {
        TestKind::StreamInBw => ("BW", "streamed payload (client to server)"),
        TestKind::StreamBidiBw => ("BW", "streamed payload received by the client (as much went out)"),
        _ => ("BW", "streamed payload (server to client)"),
    };
    let info = rpc::banner_info(args, &started, &cfg, "1 stream".into(), extra, false, what);
    sink.begin_test(test, started.sizes.len(), info);
    rpc::each_size(args, test, &started, 1, sink, |_, size, limit, progress| {
        // Warm-up: a stream of its own, unmeasured.
        let run = |limit, progress| match test {
            TestKind::StreamInBw => upload(&client, size, limit, progress),
            TestKind::StreamBidiBw => exchange(&client, size, limit, progress),
            _ => take(&client, size, limit, progress),
        };
        let warmup = args.warmup_for(size);
        if warmup > 0 {
            run(Limit::Iters(warmup), None)?;
        }
        Ok(Measure::Bandwidth(run(limit, Some(progress))?))
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
    let mut sampler = Sampler::start(size, limit, progress);
    let mut stream =
        client.stream_with(req, &CallOptions::default()).map_err(|s| rpc_err("Bench.Stream", s))?;
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
        if sampler.counted(got) {
            break;
        }
    }
    let summary = sampler.summary(got);
    if count != UNBOUNDED && got != count {
        return Err(PerfError::Rpc(format!("Bench.Stream ended cleanly after {got} of {count} messages")));
    }
    drop(stream);
    Ok(summary)
}

/// Sends one client stream of `size`-byte messages until `limit`, then finishes it and checks
/// the server's count of messages and bytes.
fn upload(
    client: &BenchClient,
    size: usize,
    limit: Limit,
    progress: Option<&Progress>,
) -> Result<BandwidthSummary, PerfError> {
    let msg = EchoRequest { payload: bytes::Bytes::from(vec![0x5a; size]), resp_size: 0 };
    let mut sampler = Sampler::start(size, limit, progress);
    let mut up = client.upload_with(&CallOptions::default()).map_err(|s| rpc_err("Bench.Upload", s))?;
    let mut sent = 0u64;
    loop {
        if let Limit::Iters(n) = limit {
            if sent == n {
                break;
            }
        }
        up.send(&msg).map_err(|s| rpc_err("Bench.Upload", s))?;
        sent += 1;
        if sampler.counted(sent) {
            break;
        }
    }
    let r = up.finish().map_err(|s| rpc_err("Bench.Upload", s))?;
    let summary = sampler.summary(sent);
    let bytes = (sent * size as u64) as u32;
    if r.count != sent || r.size != bytes {
        return Err(PerfError::Rpc(format!(
            "Bench.Upload counted {} messages ({} bytes mod 2^32) of {sent} ({bytes})",
            r.count, r.size
        )));
    }
    Ok(summary)
}

/// One bidirectional stream: sends `size`-byte messages until `limit` and takes the server's
/// answers (one each, `size` bytes) in between, then finishes and takes the rest; checks every
/// answer's length and that one came per message.
fn exchange(
    client: &BenchClient,
    size: usize,
    limit: Limit,
    progress: Option<&Progress>,
) -> Result<BandwidthSummary, PerfError> {
    let msg = EchoRequest { payload: bytes::Bytes::from(vec![0x5a; size]), resp_size: size as u32 };
    let mut sampler = Sampler::start(size, limit, progress);
    let mut s = client.exchange_with(&CallOptions::default()).map_err(|s| rpc_err("Bench.Exchange", s))?;
    let (mut sent, mut got) = (0u64, 0u64);
    let check = |m: crate::rpc::pb::EchoReply, got: u64| {
        if m.payload.len() == size {
            Ok(())
        } else {
            Err(PerfError::Rpc(format!(
                "Bench.Exchange answer {got} has {} bytes, expected {size}",
                m.payload.len()
            )))
        }
    };
    let mut sending = true;
    while sending {
        // Take what arrived, then send while credits allow (a one-thread caller must not block
        // in send while the server waits for it to read).
        while let Some(m) = s.try_message() {
            let Some(m) = m.map_err(|e| rpc_err("Bench.Exchange", e))? else {
                return Err(PerfError::Rpc(format!("Bench.Exchange ended after {got} of {sent} answers")));
            };
            check(m, got)?;
            got += 1;
            if sampler.counted(got) {
                sending = false;
            }
        }
        if matches!(limit, Limit::Iters(n) if sent == n) {
            sending = false;
        }
        while sending && s.try_send(&msg).map_err(|e| rpc_err("Bench.Exchange", e))? {
            sent += 1;
            if matches!(limit, Limit::Iters(n) if sent == n) {
                sending = false;
            }
        }
    }
    s.finish();
    while got < sent {
        let Some(m) = s.message().map_err(|e| rpc_err("Bench.Exchange", e))? else { break };
        check(m, got)?;
        got += 1;
    }
    if s.message().map_err(|e| rpc_err("Bench.Exchange", e))?.is_some() || got != sent {
        return Err(PerfError::Rpc(format!("Bench.Exchange: {got} answers to {sent} messages")));
    }
    Ok(sampler.summary(got))
}
