//! write_bw: RDMA WRITE bandwidth (as ib_write_bw): up to `tx_depth` WRITEs in flight, one in
//! `cq_mod` signaled; average over the whole run, peak over the best interval of at least 1 ms.

use std::time::Instant;

use rpc_core::verbs::Provider;

use super::qp::RawQp;
use crate::cli::Limit;
use crate::error::PerfError;
use crate::progress::Progress;
use crate::stats::{BandwidthSummary, PeakWindow};

/// Client: writes `size`-byte messages until `limit`, after `warmup` unmeasured ones.
///
/// # Errors
/// Verbs, completion and stall errors.
pub fn client<P: Provider>(
    qp: &mut RawQp<P>,
    size: usize,
    limit: Limit,
    warmup: u64,
    progress: &Progress,
) -> Result<BandwidthSummary, PerfError> {
    stream(qp, true, size, limit, warmup, progress)
}

/// Posts `size`-byte WRITEs (`write`) or SENDs until `limit`, after `warmup` unmeasured ones,
/// keeping the send queue full.
///
/// # Errors
/// Verbs, completion and stall errors.
pub(crate) fn stream<P: Provider>(
    qp: &mut RawQp<P>,
    write: bool,
    size: usize,
    limit: Limit,
    warmup: u64,
    progress: &Progress,
) -> Result<BandwidthSummary, PerfError> {
    for i in 0..warmup {
        qp.post(write, size, i + 1 == warmup)?;
    }
    qp.drain_sends()?;
    let (base, _) = qp.send_counts();
    let mut peak = PeakWindow::new(PeakWindow::DEFAULT_MIN_NS);
    let start = Instant::now();
    let mut i = 0u64;
    let mut last_done = base;
    loop {
        let last = matches!(limit, Limit::Iters(n) if i + 1 == n);
        qp.post(write, size, last)?;
        i += 1;
        if qp.poll()? > 0 {
            let (_, done) = qp.send_counts();
            if done != last_done {
                last_done = done;
                peak.completed(start.elapsed().as_nanos() as u64, (done - base) * size as u64);
            }
        }
        if last {
            break;
        }
        if let Limit::Duration(d) = limit {
            if i % 64 == 0 {
                let e = start.elapsed();
                progress.fraction(crate::measure::fraction(limit, i, e));
                if e >= d {
                    // One more, signaled, so the drain has a completion to wait for.
                    qp.post(write, size, true)?;
                    i += 1;
                    break;
                }
            }
        } else if i % 4096 == 0 {
            progress.fraction(crate::measure::fraction(limit, i, start.elapsed()));
        }
    }
    qp.drain_sends()?;
    let elapsed = start.elapsed().as_nanos() as u64;
    let (pb, pns) = peak.best();
    progress.fraction(1.0);
    Ok(BandwidthSummary::new(i, size as u64, elapsed, pb, pns))
}
