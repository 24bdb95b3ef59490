//! send_bw: SEND/RECV message rate and bandwidth (as ib_send_bw): up to `tx_depth` SENDs in
//! flight, one in `cq_mod` signaled, the receiver reposting its receive WQEs in batches; average
//! over the whole run, peak over the best interval of at least 1 ms. The baseline of an RPC
//! server's message rate: what the same QPs move when nothing but the verbs runs.

use rpc_core::verbs::Provider;

use super::qp::RawQp;
use crate::cli::Limit;
use crate::error::PerfError;
use crate::oob::OobChannel;
use crate::poll::Waiter;
use crate::progress::Progress;
use crate::stats::BandwidthSummary;

/// Client: sends `size`-byte messages until `limit`, after `warmup` unmeasured ones (the same
/// loop as write_bw, with SENDs).
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
    super::write_bw::stream(qp, false, size, limit, warmup, progress)
}

/// Server: takes every message (its receive WQEs reposted in batches as they complete) until the
/// client says `Stop`. Returns the number of messages received.
///
/// # Errors
/// Verbs and completion errors; the channel's errors.
pub fn serve<P: Provider>(qp: &mut RawQp<P>, ch: &mut OobChannel) -> Result<u64, PerfError> {
    let mut received = 0u64;
    let mut w = Waiter::new(qp.poll_kind());
    loop {
        qp.poll()?;
        let n = qp.take_recvs();
        if n > 0 {
            w.progress();
            received += n;
        } else if w.idle() && ch.readable()? {
            ch.expect(&crate::oob::Msg::Stop, "while serving send_bw")?;
            return Ok(received);
        }
    }
}
