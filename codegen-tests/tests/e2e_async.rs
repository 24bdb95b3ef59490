//! Generated async server traits and the channel stubs, end to end on `sim`: async handlers
//! polled on the worker (the default) and spawned on a runtime the test gives (the opt-in), each
//! test run once per mode; deadlines and client cancels (a
//! dropped future, `select!`, no deadline) that drop the handler's future, panics, and the same service called through the per-thread `Client` stub and through
//! a `Channel` shared by many tasks.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use codegen_tests::async_services::AsyncImpl;
use codegen_tests::codegen::asynchronous::{
    async_context_client, async_context_server, lookup_client, lookup_server, Ask,
};
use codegen_tests::helloworld::{greeter_client::GreeterClient, greeter_server::GreeterServer, HelloRequest};
use codegen_tests::services::Impl;
use rpc_core::codegen::{AsyncRuntime, CallOptions, Channel, ChannelConfig, ClientConfig, Code};
use rpc_core::{PollingPolicy, Server, ServerHandle, Transport};

const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

fn config() -> ClientConfig {
    ClientConfig::default().transport(Transport::Sim).polling(POLLING)
}

fn channel_config() -> ChannelConfig {
    ChannelConfig::default().client(config().polling(PollingPolicy::Event { spins: 0 })).spins(500)
}

fn user_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("user-rt")
        .enable_all()
        .build()
        .unwrap()
}

/// Where the services under test run their handlers' futures.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// On the worker that received the request (the default), in `rt`'s context.
    Worker,
    /// Spawned on `rt` (the opt-in).
    Tokio,
}

/// The runtime setting of `mode` for a service made outside `rt`.
fn runtime(mode: Mode, rt: &tokio::runtime::Runtime) -> AsyncRuntime {
    match mode {
        Mode::Worker => {
            // Made inside the runtime: its context is the one handlers see.
            let _entered = rt.enter();
            AsyncRuntime::worker()
        }
        Mode::Tokio => AsyncRuntime::from_handle(rt.handle().clone()),
    }
}

/// The name the threads that poll handlers' futures start with in `mode`.
fn thread_of(mode: Mode) -> &'static str {
    match mode {
        Mode::Worker => "rpc-worker",
        Mode::Tokio => "user-rt",
    }
}

fn spawn_server(svc: AsyncImpl, rt: &tokio::runtime::Runtime, mode: Mode) -> ServerHandle {
    Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(lookup_server::LookupServer::with_runtime(svc.clone(), runtime(mode, rt)))
        // Made outside any runtime with the defaults: polled on the worker, in the context of the
        // runtime the library builds (its timers work).
        .add_service(async_context_server::AsyncContextServer::new(svc))
        .add_service(GreeterServer::new(Impl))
        .spawn("127.0.0.1:0")
        .expect("spawn the server on sim")
}

/// A server of `Pipe` (async streaming handlers of every shape) on `rt`.
fn spawn_pipe_server(svc: AsyncImpl, rt: &tokio::runtime::Runtime, mode: Mode) -> ServerHandle {
    use codegen_tests::codegen::asynchronous::pipe_server::PipeServer;
    Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(PipeServer::with_runtime(svc, runtime(mode, rt)))
        .spawn("127.0.0.1:0")
        .expect("spawn the server on sim")
}

fn ask(key: &str, delay_ms: u32) -> Ask {
    Ask { key: key.into(), delay_ms, panic: false }
}

fn async_handlers_answer_through_the_blocking_stub_on_their_runtime(mode: Mode) {
    let svc = AsyncImpl::default();
    let rt = user_runtime();
    let server = spawn_server(svc.clone(), &rt, mode);
    let client = lookup_client::LookupClient::connect_with(server.local_addr(), &config()).unwrap();
    for i in 0..50 {
        let a = client.get(ask(&format!("k{i}"), (i % 3) as u32)).unwrap();
        assert_eq!(a.value, format!("value of k{i}"));
        assert_eq!(a.method, "/codegen.asynchronous.Lookup/Get");
        assert!(!a.had_deadline);
        assert!(a.thread.starts_with(thread_of(mode)), "{mode:?}: ran on {:?}", a.thread);
    }
    let a = client.slow_with(ask("d", 0), &CallOptions::deadline(Duration::from_secs(5))).unwrap();
    assert!(a.had_deadline, "the deadline reaches the handler");
    // The other service runs on the worker, its timer on the runtime the library builds.
    let other = async_context_client::AsyncContextClient::new(client.into_client());
    let a = other.call(ask("x", 1)).unwrap();
    assert_eq!(a.method, "/codegen.asynchronous.AsyncContext/Call");
    assert!(a.thread.starts_with("rpc-worker"), "ran on {:?}", a.thread);
    assert_eq!(svc.seen.finished.load(Ordering::SeqCst), 52);
    // On the worker, a future that completes at its first poll (no sleep: 17 `get`s and the
    // `slow` one) answers inline, and only those that waited became tasks: 33 `get`s and the
    // other service's call (on the worker in both modes). Spawned on tokio, none are tasks.
    let tasks = if mode == Mode::Worker { 34 } else { 1 };
    eventually(
        "the counters to show the tasks",
        || server.counters().async_tasks == tasks,
        || format!("{mode:?}: {:?}", server.counters()),
    );
    server.shutdown();
}

fn a_deadline_drops_the_handlers_future_and_a_panic_answers_internal(mode: Mode) {
    let svc = AsyncImpl::default();
    let rt = user_runtime();
    let server = spawn_server(svc.clone(), &rt, mode);
    let client = lookup_client::LookupClient::connect_with(server.local_addr(), &config()).unwrap();
    // A server may also answer DEADLINE_EXCEEDED before the handler's future is first polled
    // (the deadline passed while the request waited for the runtime, on a loaded machine); that
    // round says nothing about dropping a running future, so it is repeated with a longer
    // deadline.
    for deadline_ms in [100, 1_000, 5_000] {
        let t = Instant::now();
        let e = client
            .slow_with(ask("late", 60_000), &CallOptions::deadline(Duration::from_millis(deadline_ms)))
            .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
        assert!(t.elapsed() < Duration::from_secs(30));
        if svc.seen.started.load(Ordering::SeqCst) == 1 {
            break;
        }
    }
    assert_eq!(svc.seen.started.load(Ordering::SeqCst), 1, "the handler never began");
    // The server dropped the handler's future at the deadline instead of letting it sleep on.
    let until = Instant::now() + Duration::from_secs(60);
    while svc.seen.dropped.load(Ordering::SeqCst) == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(svc.seen.dropped.load(Ordering::SeqCst), 1, "the handler's future was dropped");
    assert_eq!(svc.seen.finished.load(Ordering::SeqCst), 0);

    let e = client.get(&Ask { key: "boom".into(), delay_ms: 0, panic: true }).unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e}");
    assert!(e.message().contains("panicked"), "{e}");
    // The service still answers.
    assert_eq!(client.get(ask("after", 0)).unwrap().value, "value of after");
    server.shutdown();
}

/// Waits (up to a minute, a hang guard) until `cond` holds, then asserts it, naming `what` and
/// what `state` says then.
#[track_caller]
fn eventually(what: &str, mut cond: impl FnMut() -> bool, state: impl Fn() -> String) {
    let until = Instant::now() + Duration::from_secs(60);
    while !cond() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(cond(), "gave up waiting for {what}: {}", state());
}

/// A client that gives up on a call with no deadline (drops its future) sends a CANCEL; the
/// server counts it and drops the running async handler's future, which never finishes: once
/// through the blocking stub's future, once through a channel stub's future left by `select!`.
/// Each handler has begun (its future was polled) before its call is given up.
fn a_client_cancel_drops_the_running_handlers_future(mode: Mode) {
    use std::future::Future;
    let svc = AsyncImpl::default();
    let rt = user_runtime();
    let server = spawn_server(svc.clone(), &rt, mode);
    let started = || svc.seen.started.load(Ordering::SeqCst);
    let dropped = || svc.seen.dropped.load(Ordering::SeqCst);
    let state = || format!("handlers {:?}; server {:?}", svc.seen, server.counters());

    let client = lookup_client::LookupClient::connect_with(server.local_addr(), &config()).unwrap();
    let mut call = Box::pin(client.slow_async(ask("dropped", 60_000)));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // Polling the future drives the session: the request goes out and the handler begins.
    eventually(
        "the first handler to begin",
        || {
            assert!(call.as_mut().poll(&mut cx).is_pending(), "a 60 s handler answered");
            started() == 1
        },
        state,
    );
    drop(call);
    eventually(
        "the server to drop the first handler's future",
        || {
            client.client().progress();
            dropped() == 1
        },
        state,
    );
    eventually("the server to count the first Cancel", || server.counters().cancels == 1, state);
    // The session serves on (the slot came back with the server's answer to the Cancel).
    assert_eq!(client.get(ask("after", 0)).unwrap().value, "value of after");

    let addr = server.local_addr();
    // The channel stays open until the end: its session's close would drop the handler's
    // future too, with no Cancel.
    let channel = rt.block_on(async {
        let lookup =
            lookup_client::LookupClient::connect_channel_with(addr, &channel_config()).await.unwrap();
        let call = lookup.slow(ask("selected", 60_000));
        tokio::select! {
            r = call => panic!("a 60 s handler answered: {r:?}"),
            _ = async {
                // The first handler and the "after" one began already.
                while started() < 3 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            } => {}
        }
        lookup
    });
    eventually("the server to drop the second handler's future", || dropped() == 2, state);
    eventually("the server to count the second Cancel", || server.counters().cancels == 2, state);
    assert_eq!(svc.seen.finished.load(Ordering::SeqCst), 1, "only the 'after' call finished");
    let c = server.counters();
    assert_eq!(
        (c.sessions_closed, c.with_code(Code::DeadlineExceeded)),
        (0, 0),
        "no close, no deadline: {c:?}"
    );
    drop(channel);
    server.shutdown();
}

fn channel_stubs_from_many_tasks_on_sync_and_async_services(mode: Mode) {
    let svc = AsyncImpl::default();
    let rt = user_runtime();
    let server = spawn_server(svc.clone(), &rt, mode);
    let addr = server.local_addr();
    rt.block_on(async move {
        let greeter = GreeterClient::connect_channel_with(addr, &channel_config()).await.unwrap();
        // Another stub over the same channel.
        let lookup = lookup_client::LookupClient::from_channel(greeter.channel().clone());
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (greeter, lookup) = (greeter.clone(), lookup.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..200 {
                    let name = format!("t{t}-{i}");
                    let r = greeter.say_hello(HelloRequest { name: name.clone() }).await.unwrap();
                    assert_eq!(r.message, format!("Hello {name}!"));
                    let a = lookup.get(ask(&name, 0)).await.unwrap();
                    assert_eq!(a.value, format!("value of {name}"));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // A deadline through the channel stub, and a future dropped by a timeout.
        let e = lookup
            .slow_with(ask("late", 60_000), &CallOptions::deadline(Duration::from_millis(50)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded);
        assert!(tokio::time::timeout(Duration::from_millis(20), lookup.slow(ask("late", 300)))
            .await
            .is_err());
        let ch: Channel = lookup.channel().clone();
        let until = Instant::now() + Duration::from_secs(60);
        while ch.in_flight() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(ch.in_flight(), 0, "the timed-out call was released");
    });
    // The call past its deadline and the one whose future the timeout dropped (its CANCEL reached
    // the server): both handler futures were dropped on the server, neither finished.
    let until = Instant::now() + Duration::from_secs(60);
    while svc.seen.dropped.load(Ordering::SeqCst) < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(svc.seen.dropped.load(Ordering::SeqCst), 2, "both handler futures were dropped");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(svc.seen.finished.load(Ordering::SeqCst), 8 * 200, "the cancelled 300 ms call did not finish");
    server.shutdown();
}

fn async_streaming_handlers_of_every_shape_through_the_blocking_stub(mode: Mode) {
    use codegen_tests::codegen::asynchronous::pipe_client;
    let svc = AsyncImpl::default();
    let rt = user_runtime();
    let server = spawn_pipe_server(svc.clone(), &rt, mode);
    let client = pipe_client::PipeClient::connect_with(server.local_addr(), &config()).unwrap();
    // Server streaming: more messages than the sink and the credits hold, then the clean end.
    let got: Vec<String> = client.watch(ask("w", 100)).unwrap().map(|m| m.unwrap().value).collect();
    assert_eq!(got.len(), 100);
    assert_eq!(got[99], "w 99");
    // The future's error ends the stream with it, after its messages.
    let mut s = client.watch(&Ask { key: "e".into(), delay_ms: 3, panic: true }).unwrap();
    for i in 0..3 {
        assert_eq!(s.message().unwrap().unwrap().value, format!("e {i}"));
    }
    assert_eq!(s.message().unwrap_err().code(), Code::Aborted);
    drop(s);
    // Client streaming.
    let mut up = client.join().unwrap();
    for i in 0..40 {
        up.send(&ask(&format!("k{i}"), 0)).unwrap();
    }
    let joined = up.finish().unwrap().value;
    assert_eq!(joined.split(',').count(), 40);
    assert!(joined.starts_with("k0,k1,") && joined.ends_with(",k39"));
    // Bidirectional, and a cancel that drops the handler's future.
    let mut chat = client.shout().unwrap();
    for i in 0..30 {
        chat.send(&ask(&format!("a{i}"), 0)).unwrap();
        assert_eq!(chat.message().unwrap().unwrap().value, format!("A{i}"));
    }
    chat.finish();
    assert_eq!(chat.message().unwrap(), None);
    assert_eq!(svc.seen.finished.load(Ordering::SeqCst), 1);
    let mut chat = client.shout().unwrap();
    chat.send(&ask("b", 0)).unwrap();
    assert_eq!(chat.message().unwrap().unwrap().value, "B");
    drop(chat);
    let give_up = Instant::now() + Duration::from_secs(60);
    while svc.seen.dropped.load(Ordering::SeqCst) == 0 {
        client.client().progress();
        assert!(Instant::now() < give_up, "the cancelled stream's future was never dropped");
        std::thread::sleep(Duration::from_millis(1));
    }
    server.shutdown();
}

fn channel_stubs_of_every_streaming_shape_from_tasks(mode: Mode) {
    use codegen_tests::codegen::asynchronous::pipe_client;
    let svc = AsyncImpl::default();
    let rt = user_runtime();
    let server = spawn_pipe_server(svc.clone(), &rt, mode);
    let addr = server.local_addr();
    rt.block_on(async move {
        let client = pipe_client::PipeClient::connect_channel_with(addr, &channel_config()).await.unwrap();
        let mut tasks = Vec::new();
        for t in 0..4 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut rx = client.watch(ask(&format!("t{t}"), 50));
                for i in 0..50 {
                    assert_eq!(rx.message().await.unwrap().unwrap().value, format!("t{t} {i}"));
                }
                assert_eq!(rx.message().await.unwrap(), None);
                let mut up = client.join();
                for i in 0..20 {
                    up.send(&ask(&format!("{t}.{i}"), 0)).await.unwrap();
                }
                assert_eq!(up.finish().await.unwrap().value.split(',').count(), 20);
                let (mut tx, mut rx) = client.shout();
                let sender = tokio::spawn(async move {
                    for i in 0..20 {
                        tx.send(&ask(&format!("x{t}{i}"), 0)).await.unwrap();
                    }
                    tx.finish();
                });
                for i in 0..20 {
                    assert_eq!(rx.message().await.unwrap().unwrap().value, format!("X{t}{i}"));
                }
                assert_eq!(rx.message().await.unwrap(), None);
                sender.await.unwrap();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    server.shutdown();
}

#[test]
fn async_handlers_answer_through_the_blocking_stub_on_their_runtime_on_the_worker() {
    async_handlers_answer_through_the_blocking_stub_on_their_runtime(Mode::Worker);
}

#[test]
fn async_handlers_answer_through_the_blocking_stub_on_their_runtime_on_tokio() {
    async_handlers_answer_through_the_blocking_stub_on_their_runtime(Mode::Tokio);
}

#[test]
fn a_deadline_drops_the_handlers_future_and_a_panic_answers_internal_on_the_worker() {
    a_deadline_drops_the_handlers_future_and_a_panic_answers_internal(Mode::Worker);
}

#[test]
fn a_deadline_drops_the_handlers_future_and_a_panic_answers_internal_on_tokio() {
    a_deadline_drops_the_handlers_future_and_a_panic_answers_internal(Mode::Tokio);
}

#[test]
fn a_client_cancel_drops_the_running_handlers_future_on_the_worker() {
    a_client_cancel_drops_the_running_handlers_future(Mode::Worker);
}

#[test]
fn a_client_cancel_drops_the_running_handlers_future_on_tokio() {
    a_client_cancel_drops_the_running_handlers_future(Mode::Tokio);
}

#[test]
fn channel_stubs_from_many_tasks_on_sync_and_async_services_on_the_worker() {
    channel_stubs_from_many_tasks_on_sync_and_async_services(Mode::Worker);
}

#[test]
fn channel_stubs_from_many_tasks_on_sync_and_async_services_on_tokio() {
    channel_stubs_from_many_tasks_on_sync_and_async_services(Mode::Tokio);
}

#[test]
fn async_streaming_handlers_of_every_shape_through_the_blocking_stub_on_the_worker() {
    async_streaming_handlers_of_every_shape_through_the_blocking_stub(Mode::Worker);
}

#[test]
fn async_streaming_handlers_of_every_shape_through_the_blocking_stub_on_tokio() {
    async_streaming_handlers_of_every_shape_through_the_blocking_stub(Mode::Tokio);
}

#[test]
fn channel_stubs_of_every_streaming_shape_from_tasks_on_the_worker() {
    channel_stubs_of_every_streaming_shape_from_tasks(Mode::Worker);
}

#[test]
fn channel_stubs_of_every_streaming_shape_from_tasks_on_tokio() {
    channel_stubs_of_every_streaming_shape_from_tasks(Mode::Tokio);
}
