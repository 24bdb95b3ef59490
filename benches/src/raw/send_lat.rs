//! send_lat: SEND/RECV ping-pong (as ib_send_lat), round trip measured at the client.

use rpc_core::verbs::Provider;

use super::qp::RawQp;
use crate::cli::Limit;
use crate::error::PerfError;
use crate::oob::OobChannel;
use crate::poll::{Waiter, STALL_TIMEOUT};
use crate::progress::Progress;
use crate::stats::LatencyRecorder;

/// Client: sends `size` bytes and waits for the answer, `warmup` times then until `limit`.
///
/// # Errors
/// Verbs, completion and stall errors.
pub fn client<P: Provider>(
    qp: &mut RawQp<P>,
    size: usize,
    limit: Limit,
    warmup: u64,
    progress: &Progress,
) -> Result<LatencyRecorder, PerfError> {
    crate::measure::latency(limit, warmup, progress, || {
        qp.post(false, size, false)?;
        wait_recv(qp)
    })
}

#[inline]
fn wait_recv<P: Provider>(qp: &mut RawQp<P>) -> Result<(), PerfError> {
    let mut w = Waiter::new(qp.poll_kind());
    loop {
        qp.poll()?;
        if qp.take_recvs() > 0 {
            return Ok(());
        }
        if w.idle() && w.stalled() {
            return Err(PerfError::Stalled { what: qp.what(), secs: STALL_TIMEOUT.as_secs() });
        }
    }
}

/// Server: answers every message with `size` bytes until the client says `Stop`. Returns the
/// number of answers.
///
/// # Errors
/// Verbs and completion errors; the channel's errors.
pub fn serve<P: Provider>(qp: &mut RawQp<P>, size: usize, ch: &mut OobChannel) -> Result<u64, PerfError> {
    let mut served = 0u64;
    let mut w = Waiter::new(qp.poll_kind());
    loop {
        qp.poll()?;
        let n = qp.take_recvs();
        if n > 0 {
            w.progress();
            for _ in 0..n {
                qp.post(false, size, false)?;
            }
            served += n;
        } else if w.idle() && ch.readable()? {
            ch.expect(&crate::oob::Msg::Stop, "while serving send_lat")?;
            return Ok(served);
        }
    }
}
