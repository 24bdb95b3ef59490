//! Fault injection (sim only): what goes wrong on a real network, on demand, for tests.
//!
//! - [`SimQp::set_drop_traffic`]: every packet from or to the QP is lost. Its pending send WRs
//!   are retried after the local ACK timeout (`timeout` code at RTS: 4.096 µs × 2^timeout) and
//!   fail with `IBV_WC_RETRY_EXC_ERR` after `retry_cnt` retries; the QP then goes to ERR and the
//!   rest of its WRs are flushed. Turning it off before then lets the retry succeed.
//! - [`SimQp::set_delay`]: every send WR of the QP waits the given time at the head of its send
//!   queue before it executes (in order, one at a time): a slow link or a congested peer.
//! - [`SimQp::force_error`]: moves the QP to ERR as a fatal local error would; outstanding WRs
//!   complete with `IBV_WC_WR_FLUSH_ERR`.
//! - [`SimContext::vanish`]: the whole host disappears from the fabric (a crashed machine or a
//!   pulled cable): peers' sends to it are lost and fail with `IBV_WC_RETRY_EXC_ERR`, its own
//!   QPs go to ERR, its port reports `Down`. It cannot come back.

use std::sync::atomic::Ordering;

use super::fabric::fabric;
use super::host::SimContext;
use super::qp::SimQp;

impl SimQp {
    /// Drops (`true`) or stops dropping (`false`) every packet sent by or addressed to this QP.
    pub fn set_drop_traffic(&self, drop: bool) {
        self.core().sh().resp.drop_traffic.store(drop, Ordering::SeqCst);
    }

    /// Holds each send WR of this QP for `delay` before it executes (`None` or zero: no delay).
    /// WRs stay in order; with a delay, completions arrive from the fabric's timer thread.
    pub fn set_delay(&self, delay: Option<std::time::Duration>) {
        let ns = delay.map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64);
        self.core().delay_ns.store(ns, Ordering::SeqCst);
    }

    /// Moves the QP to ERR now, flushing its outstanding WRs (`IBV_WC_WR_FLUSH_ERR`).
    pub fn force_error(&self) {
        self.core().set_error();
    }
}

impl SimContext {
    /// Makes this host vanish from the fabric: packets to it are lost from now on (peers get
    /// `IBV_WC_RETRY_EXC_ERR`), and its QPs go to ERR. Irreversible.
    pub fn vanish(&self) {
        self.host.alive_word().store(0, Ordering::SeqCst);
        fabric().detach_host_qps(self.host.id, |qp| qp.set_error());
    }
}
