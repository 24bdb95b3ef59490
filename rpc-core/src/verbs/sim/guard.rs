//! The send-queue guard: a test-and-test-and-set flag held while a QP's send queue is posted to or
//! executed, the software counterpart of the per-QP spinlock mlx5's `ibv_post_send` takes.
//!
//! Uncontended (the QP's own thread posting and executing), it is one CAS on a cache line that
//! stays in that thread's cache. It is contended only by the fabric's timer thread during RNR or
//! retry back-off and by control-path calls (modify, destroy, MR deregistration), all short.

use std::sync::atomic::{AtomicBool, Ordering};

/// Free when zeroed (it lives in a QP's shared state, in the host segment).
pub(crate) struct SpinGuard {
    locked: AtomicBool,
}

impl SpinGuard {
    /// Takes the guard if it is free.
    #[inline]
    pub(crate) fn try_lock(&self) -> bool {
        !self.locked.load(Ordering::Relaxed)
            && self.locked.compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    /// Takes the guard, spinning (then yielding) while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) {
        let mut spins = 0u32;
        while !self.try_lock() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Releases the guard (a plain release store: no fence on the hot path).
    #[inline]
    pub(crate) fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}
