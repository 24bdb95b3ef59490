//! write_lat: RDMA WRITE ping-pong polling the last byte of the receive buffer (as ib_write_lat),
//! round trip measured at the client. With `copy_out` (`--copy-out`), each side copies every
//! message it received out of its receive area into a buffer of its own before answering, as any
//! consumer of the bytes must (an RPC hands them to a handler): the fair baseline of an RPC's
//! size-dependent cost, where plain write_lat's payload never crosses into the receiver's cache. Message k carries the tag `k % 255 + 1` in its last byte,
//! so consecutive messages always differ there and the zeroed buffer never matches.

use rpc_core::verbs::Provider;

use super::qp::RawQp;
use crate::cli::Limit;
use crate::error::PerfError;
use crate::oob::OobChannel;
use crate::poll::{Waiter, STALL_TIMEOUT};
use crate::progress::Progress;
use crate::stats::LatencyRecorder;

/// The tag of message `k` (1-based).
#[inline]
pub fn tag(k: u64) -> u8 {
    (k % 255) as u8 + 1
}

/// Client: writes `size` bytes and spins until the peer's write lands, `warmup` times then until
/// `limit`.
///
/// # Errors
/// Verbs, completion and stall errors.
pub fn client<P: Provider>(
    qp: &mut RawQp<P>,
    size: usize,
    limit: Limit,
    warmup: u64,
    copy_out: bool,
    progress: &Progress,
) -> Result<LatencyRecorder, PerfError> {
    let last = size - 1;
    let mut k = 0u64;
    let mut own = if copy_out { vec![0u8; size] } else { Vec::new() };
    crate::measure::latency(limit, warmup, progress, || {
        k += 1;
        let t = tag(k);
        qp.set_send_byte(last, t);
        qp.post(true, size, false)?;
        let mut w = Waiter::new(qp.poll_kind());
        while qp.recv_byte(last) != t {
            if w.idle() {
                // Reap send completions now and then, and notice a dead peer.
                qp.poll()?;
                if w.stalled() {
                    return Err(PerfError::Stalled { what: qp.what(), secs: STALL_TIMEOUT.as_secs() });
                }
            }
        }
        if copy_out {
            qp.copy_recv_area(&mut own);
        }
        Ok(())
    })
}

/// Server: waits for each write and writes back, until the client says `Stop`. Returns the
/// number of answers.
///
/// # Errors
/// Verbs and completion errors; the channel's errors.
pub fn serve<P: Provider>(
    qp: &mut RawQp<P>,
    size: usize,
    copy_out: bool,
    ch: &mut OobChannel,
) -> Result<u64, PerfError> {
    let last = size - 1;
    let mut k = 0u64;
    let mut own = if copy_out { vec![0u8; size] } else { Vec::new() };
    loop {
        k += 1;
        let t = tag(k);
        let mut w = Waiter::new(qp.poll_kind());
        while qp.recv_byte(last) != t {
            if w.idle() {
                qp.poll()?;
                if ch.readable()? {
                    ch.expect(&crate::oob::Msg::Stop, "while serving write_lat")?;
                    return Ok(k - 1);
                }
            }
        }
        if copy_out {
            qp.copy_recv_area(&mut own);
        }
        qp.set_send_byte(last, t);
        qp.post(true, size, false)?;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tags_never_zero_and_change_every_message() {
        for k in 1..2000u64 {
            assert_ne!(super::tag(k), 0);
            assert_ne!(super::tag(k), super::tag(k + 1));
        }
        assert_eq!(super::tag(1), 2);
        assert_eq!(super::tag(254), 255);
        assert_eq!(super::tag(255), 1);
    }
}
