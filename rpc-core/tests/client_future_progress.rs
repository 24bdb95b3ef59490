//! An async call's future progresses its session by its own polls ("no executor or other thread
//! needed", `Client::unary_async`), with its endpoint's progress thread kept from looking.
//!
//! Every blocking `Client`'s endpoint has a progress thread (`rpc-progress`) that polls its idle
//! sessions every 50 ms, and a future nobody drives counts as idle: a future whose polls did not
//! progress its session would still complete, its answers taken by those looks, only later (the
//! async tests of the other files pass so). Here the progress thread is parked while the
//! futures are polled: a subscriber holds it in the event of a look that found another session
//! of the endpoint broken ("client session closed"), so that only the futures' own polls can
//! take their answers.
//!
//! One test in this binary: the subscriber is process-wide.
//!
//! Run: `cargo test -p rpc-core --test client_future_progress`.

mod rpc_support;

use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

use rpc_core::codegen::*;
use rpc_core::Endpoint;
use rpc_support::*;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

/// The name of an endpoint's progress thread.
const PROGRESS: &str = "rpc-progress";
/// The event of a client session that broke (`ClientCore::break_conn`).
const CLOSED: &str = "client session closed";

/// Whether the progress thread is held, and whether it reached the gate.
#[derive(Default)]
struct Gate {
    open: bool,
    parked: bool,
}

/// Holds the thread named [`PROGRESS`] in a [`CLOSED`] event until the gate opens (at most
/// [`WAIT`]).
struct ParkProgress(Arc<(Mutex<Gate>, Condvar)>);

/// The `message` of an event.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for ParkProgress {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if std::thread::current().name() != Some(PROGRESS) {
            return;
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        if m.0 != CLOSED {
            return;
        }
        let (gate, cv) = &*self.0;
        let mut g = gate.lock().unwrap_or_else(|e| e.into_inner());
        g.parked = true;
        cv.notify_all();
        let (g, _) = cv.wait_timeout_while(g, WAIT, |g| !g.open).unwrap_or_else(|e| e.into_inner());
        drop(g);
    }
}

/// Polls `f` (a no-op waker) until it is ready; a test failure naming `what` after [`WAIT`].
fn poll_until_ready<F: std::future::Future + Unpin>(what: &str, f: &mut F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = None;
    wait_until(
        what,
        WAIT,
        || match std::pin::Pin::new(&mut *f).poll(&mut cx) {
            Poll::Ready(r) => {
                out = Some(r);
                true
            }
            Poll::Pending => false,
        },
        String::new,
    );
    out.unwrap()
}

/// Two sessions on one endpoint: one to a fake server that closes its control connection (its
/// QP stays up), which the progress thread's look finds within 16 looks and breaks, and there
/// stays parked; one to a good server, whose async calls (20, one after the other) must then be
/// answered by their futures' own polls.
/// Sabotaged (`ClientCore::poll_call` not polling the session, only taking a finished call's
/// answer): failed with "gave up after 60.0s waiting for call 0's future to complete by its own
/// polls"; without the parked progress thread (the gate open from the start), the same
/// sabotage passed (the looks took the answers: 2.9 s for the test instead of 0.9 s).
#[test]
fn an_async_calls_future_progresses_its_session_with_the_progress_thread_parked() {
    let state = Arc::new((Mutex::new(Gate::default()), Condvar::new()));
    let subscriber = tracing_subscriber::registry().with(ParkProgress(state.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let release = || {
        state.0.lock().unwrap_or_else(|e| e.into_inner()).open = true;
        state.1.notify_all();
    };

    let (server, _) = spawn(server());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let fake = std::thread::spawn(move || {
        let (first, tcp) = RawClient::accept(&listener, 77, |_| {});
        // The control connection closes; the QP stays up (no Close on the RDMA path).
        tcp.shutdown(std::net::Shutdown::Both).unwrap();
        let _ = done_rx.recv_timeout(WAIT);
        drop(first);
    });
    let ep = Endpoint::new(&transport()).unwrap();
    let good = ep.connect_with(server.local_addr(), &client_config()).unwrap();
    let broken = ep.connect_with(fake_addr, &client_config()).unwrap();
    {
        let (gate, cv) = &*state;
        let g = gate.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = cv.wait_timeout_while(g, WAIT, |g| !g.parked).unwrap_or_else(|e| e.into_inner());
        assert!(g.parked, "the progress thread never found the fake server's session broken");
    }
    // Only the futures' own polls progress `good` from here.
    for seq in 0..20u64 {
        let mut f = good.unary_async::<_, EchoMsg>(ECHO, &request(seq, 8, 8), &CallOptions::default());
        let r = poll_until_ready(&format!("call {seq}'s future to complete by its own polls"), &mut f);
        check_reply(&r.unwrap(), seq, 8);
    }
    release();
    drop(done_tx);
    fake.join().unwrap();
    drop((broken, good));
    server.shutdown();
}
