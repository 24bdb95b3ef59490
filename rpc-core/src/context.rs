//! The deadline of the call a thread is serving, which the calls it makes inherit (deadline
//! propagation, as gRPC's contexts do in Go and Java).
//!
//! Set by the worker around an inline handler, and around every poll of an async handler's
//! future (on the worker or on a tokio runtime); read by [`crate::CallOptions`] when a call
//! starts. A handler's work on threads of its own carries the deadline explicitly
//! (`CallOptions::deadline_at(ctx.deadline())`).

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static SERVING: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Restores the thread's previous deadline when dropped.
pub(crate) struct Serving {
    prev: Option<Instant>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        SERVING.set(self.prev);
    }
}

/// Marks the thread as serving a call with `deadline` until the guard drops; `None` when the
/// call has no deadline (nothing to set: the common case touches no thread-local).
#[inline]
pub(crate) fn serving(deadline: Option<Instant>) -> Option<Serving> {
    deadline.map(|d| Serving { prev: SERVING.replace(Some(d)) })
}

/// The deadline of the call the thread is serving, if it has one.
#[inline]
pub(crate) fn inherited() -> Option<Instant> {
    SERVING.get()
}
