//! Raw verbs baselines on the same provider and QP setup as the RPCs: send_lat, send_bw,
//! write_lat (optionally copying each message out, `--copy-out`), write_bw, each run as a client and a server joined by the out-of-band channel.

pub mod qp;
pub mod send_bw;
pub mod send_lat;
pub mod write_bw;
pub mod write_lat;

use rpc_core::verbs::Provider;

use crate::cli::{Args, TestKind};
use crate::error::PerfError;
use crate::oob::{Msg, OobChannel, OOB_VERSION};
use crate::results::{LatencyMeasure, Measure, TestResult};
use crate::sink::Sink;
use qp::{RawConfig, RawQp};

/// The verbs setup both sides use, from the flags.
pub fn raw_config(args: &Args, max_size: usize) -> RawConfig {
    RawConfig {
        device: args.ib_dev.as_deref().unwrap_or("").parse().unwrap_or_default(),
        port_num: args.ib_port,
        gid_index: args.gid_index,
        tx_depth: args.tx_depth,
        rx_depth: args.rx_depth.unwrap_or(qp::DEFAULT_RX_DEPTH),
        cq_mod: args.cq_mod,
        max_size,
        poll: args.poll,
        use_srq: args.use_srq,
        inline: args.inline_size,
    }
}

fn side_name(test: TestKind, client: bool) -> &'static str {
    match (test, client) {
        (TestKind::SendLat, true) => "send_lat client",
        (TestKind::SendLat, false) => "send_lat server",
        (TestKind::WriteLat, true) => "write_lat client",
        (TestKind::WriteLat, false) => "write_lat server",
        (TestKind::SendBw, true) => "send_bw client",
        (TestKind::SendBw, false) => "send_bw server",
        (TestKind::WriteBw, true) => "write_bw client",
        (TestKind::WriteBw, false) => "write_bw server",
        (_, true) => "rpc client",
        (_, false) => "rpc server",
    }
}

/// Client side of one raw test over all sizes: sets up, connects through `ch`, runs each size
/// in lockstep with the server, and hands each result to `sink`.
///
/// # Errors
/// Setup, verbs, completion, stall and channel errors.
pub fn run_client<P: Provider>(
    args: &Args,
    test: TestKind,
    ch: &mut OobChannel,
    sink: &mut Sink,
) -> Result<(), PerfError> {
    let sizes = args.sizes();
    let max_size = *sizes.iter().max().unwrap_or(&args.size);
    let mut qp = RawQp::<P>::open(&raw_config(args, max_size), side_name(test, true))?;
    ch.send(&Msg::Setup { version: OOB_VERSION, test, max_size, concurrency: 1 })?;
    let Msg::Endpoint(remote) = ch.expect(&Msg::Endpoint(qp.wire_endpoint()), "after setup")? else {
        unreachable!("expect checks the variant")
    };
    ch.send(&Msg::Endpoint(qp.wire_endpoint()))?;
    qp.connect(&remote)?;
    ch.send(&Msg::Connected)?;
    ch.expect(&Msg::Connected, "after connecting")?;

    let depth = if matches!(test, TestKind::WriteBw | TestKind::SendBw) { args.tx_depth } else { 1 };
    let mut info = vec![
        ("Transport", P::NAME.to_string()),
        ("Device", qp.device_name()),
        ("Connection type", "RC".into()),
        ("TX depth", depth.to_string()),
        ("Max inline data", format!("{}[B]", qp.max_inline())),
        ("CQ moderation", args.cq_mod.to_string()),
        ("Poll", format!("{:?}", args.poll).to_lowercase()),
        ("Using SRQ", if args.use_srq { "ON" } else { "OFF" }.into()),
    ];
    if test == TestKind::WriteLat && args.copy_out {
        info.push(("Receiver", "copies each message out of its ring (--copy-out)".into()));
    }
    if test.is_latency() {
        info.push(("Latency", "round trip (perftest prints half)".into()));
    }
    sink.begin_test(test, sizes.len(), info);
    for (slot, &size) in sizes.iter().enumerate() {
        sink.progress().start_size(slot, size);
        qp.clear_recv_area(size);
        ch.send(&Msg::Start { size })?;
        ch.expect(&Msg::Ready, "after start")?;
        let limit = args.limit_for(size);
        let warmup = args.warmup_for(size);
        let measure = match test {
            TestKind::SendLat => {
                let rec = send_lat::client(&mut qp, size, limit, warmup, sink.progress())?;
                latency_measure(&rec)
            }
            TestKind::WriteLat => {
                let rec = write_lat::client(&mut qp, size, limit, warmup, args.copy_out, sink.progress())?;
                latency_measure(&rec)
            }
            TestKind::SendBw => {
                Measure::Bandwidth(send_bw::client(&mut qp, size, limit, warmup, sink.progress())?)
            }
            TestKind::WriteBw => {
                Measure::Bandwidth(write_bw::client(&mut qp, size, limit, warmup, sink.progress())?)
            }
            TestKind::RpcLat
            | TestKind::RpcBw
            | TestKind::ChanLat
            | TestKind::ChanBw
            | TestKind::StreamBw
            | TestKind::StreamInBw
            | TestKind::StreamBidiBw => {
                return Err(PerfError::Setup(format!("{} is not a raw verbs test", test.name())))
            }
        };
        ch.send(&Msg::Stop)?;
        ch.expect(&Msg::Stopped { served: 0 }, "after stop")?;
        let resp_bytes = if matches!(test, TestKind::WriteBw | TestKind::SendBw) { 0 } else { size };
        sink.result(TestResult {
            test,
            bytes: size,
            req_bytes: size,
            resp_bytes,
            concurrency: depth,
            measure,
        });
    }
    ch.send(&Msg::Done)?;
    sink.end_test();
    Ok(())
}

/// The latency measure of a recorder (which is never empty after a run).
pub fn latency_measure(rec: &crate::stats::LatencyRecorder) -> Measure {
    Measure::Latency(LatencyMeasure {
        summary: rec.summary().unwrap_or(crate::stats::LatencySummary {
            iterations: 0,
            min_ns: 0.0,
            max_ns: 0.0,
            typical_ns: 0.0,
            avg_ns: 0.0,
            stdev_ns: 0.0,
            p99_ns: 0.0,
            p99_9_ns: 0.0,
            p99_99_ns: 0.0,
        }),
        cdf: rec.cdf(),
    })
}

/// Server side of one raw test, after the client's `Setup`: sets up, connects, and serves each
/// size until the client's `Done`.
///
/// # Errors
/// Setup, verbs, completion and channel errors.
pub fn serve<P: Provider>(
    args: &Args,
    test: TestKind,
    max_size: usize,
    ch: &mut OobChannel,
) -> Result<(), PerfError> {
    if !(1..=crate::cli::MAX_SIZE).contains(&max_size) {
        return Err(PerfError::Setup(format!(
            "client asked for {max_size}-byte messages; limit is 1..={} (64M)",
            crate::cli::MAX_SIZE
        )));
    }
    let mut qp = RawQp::<P>::open(&raw_config(args, max_size), side_name(test, false))?;
    ch.send(&Msg::Endpoint(qp.wire_endpoint()))?;
    let Msg::Endpoint(remote) = ch.expect(&Msg::Endpoint(qp.wire_endpoint()), "after our endpoint")? else {
        unreachable!("expect checks the variant")
    };
    qp.connect(&remote)?;
    ch.send(&Msg::Connected)?;
    ch.expect(&Msg::Connected, "after connecting")?;
    loop {
        match ch.recv("waiting for the next size")? {
            Msg::Start { size } if (1..=max_size).contains(&size) => {
                qp.clear_recv_area(size);
                ch.send(&Msg::Ready)?;
                let served = match test {
                    TestKind::SendLat => send_lat::serve(&mut qp, size, ch)?,
                    TestKind::WriteLat => write_lat::serve(&mut qp, size, args.copy_out, ch)?,
                    TestKind::SendBw => send_bw::serve(&mut qp, ch)?,
                    _ => {
                        // write_bw: the NIC does the work; wait for the client to finish.
                        ch.expect(&Msg::Stop, "while serving write_bw")?;
                        0
                    }
                };
                ch.send(&Msg::Stopped { served })?;
            }
            Msg::Start { size } => {
                return Err(PerfError::Setup(format!(
                    "client asked for {size} bytes, over the {max_size} it set up"
                )))
            }
            Msg::Done => return Ok(()),
            other => return Err(PerfError::Setup(format!("unexpected {other:?} during {}", test.name()))),
        }
    }
}
