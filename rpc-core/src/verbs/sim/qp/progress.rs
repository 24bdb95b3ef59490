//! Executing queued send WQEs in order: stalls (RNR, lost packets, injected delay), their retry
//! budgets and timers, and the timer thread's entry point.

use super::*;

impl QpCore {
    /// Called by the timer thread: performs a requested flush and retries the stalled WQE if
    /// due. Clears `scheduled` (under the guard) once the QP no longer needs the timer thread.
    pub(crate) fn on_timer(&self, now: u64) {
        if self.sh().resp.destroyed.load(Ordering::Acquire) {
            self.scheduled.store(false, Ordering::Release);
            return;
        }
        if now < self.deadline_ns() {
            return;
        }
        let _ = self.try_with_sq(|st| {
            if self.sh().guard.flush_pending.load(Ordering::Acquire) {
                self.flush_sq_locked(st);
            }
            if !self.progress_locked(st) {
                self.scheduled.store(false, Ordering::SeqCst);
                // A flush requested meanwhile keeps the QP scheduled (pairs with `set_error`:
                // its flag store precedes its `scheduled` store).
                if self.sh().guard.flush_pending.load(Ordering::SeqCst) {
                    self.scheduled.store(true, Ordering::SeqCst);
                }
            }
        });
    }

    /// Records a stall of the head WQE. Returns `true` while retries remain (the QP waits),
    /// `false` when they are exhausted (the caller fails the WQE with the returned status).
    pub(crate) fn note_stall(
        &self,
        stall: &mut Option<Stall>,
        link: &Link,
        kind: StallKind,
    ) -> std::result::Result<(), WcStatus> {
        if kind == StallKind::Rnr {
            self.rnr_stalls.fetch_add(1, Ordering::Relaxed);
            sim::stats::count_rnr_stall();
        }
        let (budget, infinite, exhausted) = match kind {
            StallKind::Rnr => (link.rnr_retry, link.rnr_retry == 7, WcStatus::IBV_WC_RNR_RETRY_EXC_ERR),
            StallKind::Lost | StallKind::Delay => (link.retry_cnt, false, WcStatus::IBV_WC_RETRY_EXC_ERR),
        };
        let left = match *stall {
            Some(s) if s.kind == kind => {
                if infinite {
                    s.left
                } else {
                    s.left.saturating_sub(1)
                }
            }
            _ => budget,
        };
        if left == 0 && !infinite {
            *stall = None;
            return Err(exhausted);
        }
        let now = fabric::now_ns();
        let delay = match kind {
            StallKind::Rnr => {
                let code =
                    link.peer.as_ref().map_or(12, |p| p.sh().resp.min_rnr_timer.load(Ordering::Relaxed));
                rnr_delay_ns(code)
            }
            StallKind::Lost | StallKind::Delay => ack_timeout_ns(link.timeout),
        };
        let deadline = now.saturating_add(delay);
        *stall = Some(Stall { kind, deadline, left });
        self.deadline.store(deadline, Ordering::Relaxed);
        Ok(())
    }

    /// Executes queued WQEs in order until the queue is empty, a WQE stalls, or the QP fails.
    /// Returns `true` when the QP is waiting on a timer. Guard held.
    pub(crate) fn progress_locked(&self, st: &mut SqState) -> bool {
        let max_inline = self.cap.max_inline_data as usize;
        while st.head != st.tail {
            if self.state_raw() == ST_ERR {
                self.flush_sq_locked(st);
                return false;
            }
            if let Some(s) = st.stall {
                if fabric::now_ns() < s.deadline {
                    return true;
                }
            }
            let delay = self.delay_ns.load(Ordering::Relaxed);
            if delay > 0 && !st.stall.is_some_and(|s| s.kind == StallKind::Delay) {
                let deadline = fabric::now_ns().saturating_add(delay);
                st.stall = Some(Stall { kind: StallKind::Delay, deadline, left: 0 });
                self.deadline.store(deadline, Ordering::Relaxed);
                return true;
            }
            let idx = st.slot(st.head);
            let wqe = st.wqes[idx];
            let src = if wqe.inline_len == NOT_INLINE {
                exec::Src::Sges(&wqe.sges[..wqe.nsge as usize])
            } else {
                exec::Src::Inline(&st.inline[idx * max_inline..idx * max_inline + wqe.inline_len as usize])
            };
            let view = exec::WqeView { wr_id: wqe.wr_id, op: &wqe.op, flags: wqe.flags, src };
            let outcome = self.exec_queued(&mut st.link, &view);
            let seq = st.head;
            let status = match outcome {
                exec::Outcome::Done(len) => {
                    self.complete_ok(&view, len, seq);
                    st.stall = None;
                    st.head += 1;
                    continue;
                }
                exec::Outcome::Stall(kind) => match self.note_stall(&mut st.stall, &st.link, kind) {
                    Ok(()) => return true,
                    Err(status) => status,
                },
                exec::Outcome::Fail(status) => status,
            };
            st.stall = None;
            st.head += 1;
            self.fail_locked(st, seq, wqe.wr_id, &wqe.op, status);
            return false;
        }
        st.stall = None;
        false
    }
}

/// The RNR NAK timer of `min_rnr_timer` code `code` (IBA table 45), in ns.
pub(crate) fn rnr_delay_ns(code: u8) -> u64 {
    const US_X100: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
        3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    US_X100[(code & 31) as usize] * 10_000
}

/// The local ACK timeout of code `t`: 4.096 µs × 2^t, in ns; 0 = infinite.
pub(crate) fn ack_timeout_ns(t: u8) -> u64 {
    if t == 0 {
        u64::MAX
    } else {
        4096u64 << t.min(31)
    }
}
