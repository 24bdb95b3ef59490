//! An async handler's context after its call: `AsyncContext::is_cancelled` turns true once the
//! call is answered, so work the handler left running (a spawned task or thread holding a clone
//! of the context) learns that the call is over, as a Go handler's context is done when its RPC
//! returns. Both ways of running async handlers: polled on the worker (the answer ready at the
//! first poll, and after a wait) and spawned on tokio.

mod rpc_support;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::{AsyncContext, AsyncRuntime, CallOptions, Client};
use rpc_support::*;

/// Answers at once (the future is ready at its first poll).
const READY: MethodId = method_id("/test.Ctx/Ready");
/// Answers after a wait (the future becomes a task first).
const WAITS: MethodId = method_id("/test.Ctx/Waits");

/// Each handler hands a clone of its context to a thread that reports, within 10 s, whether the
/// context turned cancelled after the answer.
struct Ctx {
    runtime: AsyncRuntime,
    seen: Arc<Mutex<mpsc::Sender<bool>>>,
}

fn watch(actx: &AsyncContext, seen: &Arc<Mutex<mpsc::Sender<bool>>>) {
    let (actx, seen) = (actx.clone(), seen.lock().unwrap().clone());
    assert!(!actx.is_cancelled(), "cancelled before the handler answered");
    std::thread::spawn(move || {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !actx.is_cancelled() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = seen.send(actx.is_cancelled());
    });
}

impl Service for Ctx {
    const NAME: &'static str = "test.Ctx";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: READY, name: "/test.Ctx/Ready" },
        MethodDesc { id: WAITS, name: "/test.Ctx/Waits" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, _body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let seen = self.seen.clone();
        match method {
            READY => out.reply(spawn_async(&self.runtime, ctx, move |actx| async move {
                watch(&actx, &seen);
                Ok(EchoMsg::default())
            })),
            WAITS => out.reply(spawn_async(&self.runtime, ctx, move |actx| async move {
                watch(&actx, &seen);
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(EchoMsg::default())
            })),
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn check(runtime: AsyncRuntime, what: &str) {
    let (tx, rx) = mpsc::channel();
    let svc = Ctx { runtime, seen: Arc::new(Mutex::new(tx)) };
    let server = server().add_service(svc).spawn("127.0.0.1:0").expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    for method in [READY, WAITS] {
        let _: EchoMsg = client.unary(method, &EchoMsg::default(), &CallOptions::default()).unwrap();
        let over = rx.recv_timeout(Duration::from_secs(20)).expect("the watching thread reports");
        assert!(over, "{what}, method {method:#x}: the context never saw the answered call as over");
    }
    drop(client);
    server.shutdown();
}

#[test]
fn the_context_of_an_answered_call_reads_cancelled_on_the_worker() {
    check(AsyncRuntime::worker(), "on the worker");
}

#[test]
fn the_context_of_an_answered_call_reads_cancelled_on_tokio() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    check(AsyncRuntime::from_handle(rt.handle().clone()), "spawned on tokio");
}
