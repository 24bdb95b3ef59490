//! [`Hold`]: a service whose one method keeps the worker that runs it (inline) busy until the
//! test releases it, for tests of what a server does while a worker takes nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use rpc_core::codegen::*;

use super::EchoMsg;

/// The method of [`Hold`]: any request (its body is not read); answers an empty [`EchoMsg`] once
/// released.
pub const HOLD: MethodId = method_id("/test.Hold/Hold");

/// What [`Hold`] and its [`HoldGate`] share.
#[derive(Default)]
struct State {
    entered: Arc<AtomicBool>,
    released: Mutex<bool>,
    wake: Condvar,
}

/// The service `test.Hold`; every call of [`HOLD`] holds its worker until the gate is released
/// (at most [`WAIT`](super::WAIT), then it answers and says so on stderr).
pub struct Hold(Arc<State>);

/// The test's side of a [`Hold`]: sees a call enter, releases every held call (now and later)
/// when dropped, also when an assertion fails (else a held worker would block shutdown).
pub struct HoldGate(Arc<State>);

impl Hold {
    /// The service, to add to a server, and its gate.
    pub fn new() -> (Hold, HoldGate) {
        let state = Arc::new(State::default());
        (Hold(state.clone()), HoldGate(state))
    }
}

impl HoldGate {
    /// Whether a call has reached the handler (its worker is held from then on).
    pub fn entered(&self) -> bool {
        self.0.entered.load(Ordering::Acquire)
    }

    /// The flag behind [`entered`](Self::entered), for code that watches it apart from the gate.
    pub fn entered_flag(&self) -> Arc<AtomicBool> {
        self.0.entered.clone()
    }
}

impl Drop for HoldGate {
    fn drop(&mut self) {
        *self.0.released.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.wake.notify_all();
    }
}

impl Service for Hold {
    const NAME: &'static str = "test.Hold";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: HOLD, name: "/test.Hold/Hold" }];

    fn call(&self, _: MethodId, _: &RequestContext, _: Body<'_>, out: &mut ReplyWriter<'_>) {
        self.0.entered.store(true, Ordering::Release);
        // Bounded by WAIT: a test that fails while the gate lives (declared before its server,
        // the gate is dropped after it) would otherwise hang in the server's shutdown, which
        // joins this worker.
        let until = Instant::now() + super::WAIT;
        let mut released = self.0.released.lock().unwrap_or_else(|e| e.into_inner());
        while !*released {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                eprintln!("test.Hold: not released within {:?}; answering to let the worker go", super::WAIT);
                break;
            }
            released = self.0.wake.wait_timeout(released, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        out.reply(Reply::from(EchoMsg::default()));
    }
}
