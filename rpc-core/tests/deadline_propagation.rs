//! Deadline propagation (issue 30 item 6): the calls a handler makes inherit what is left of the
//! deadline of the call it serves, from an inline handler, an async handler polled on the worker
//! or spawned on tokio, through the blocking `Client` and the `Channel`; a call's own shorter
//! timeout still wins; `without_inherited_deadline` opts out; a thread of the handler's own
//! inherits nothing unless given `CallOptions::deadline_at(ctx.deadline())`.

mod rpc_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::{AsyncRuntime, CallOptions, Channel, ChannelConfig, Client, PollingPolicy, ServerHandle};
use rpc_support::*;

/// Service B: answers `seq` = the milliseconds left of its call's deadline, `NONE` without one.
const SEEN: MethodId = method_id("/test.Back/Seen");
const NONE: u64 = u64::MAX;

struct Back;

impl Service for Back {
    const NAME: &'static str = "test.Back";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: SEEN, name: "/test.Back/Seen" }];
    fn call(&self, _method: MethodId, ctx: &RequestContext, _body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let left =
            ctx.deadline().map_or(NONE, |d| d.saturating_duration_since(Instant::now()).as_millis() as u64);
        out.reply(Reply::from(EchoMsg { seq: left, ..Default::default() }));
    }
}

/// Service A: each method calls B's `Seen` one way and answers what B saw.
const RELAY: MethodId = method_id("/test.Front/Relay");
const RELAY_SHORT: MethodId = method_id("/test.Front/RelayShort");
const RELAY_DETACHED: MethodId = method_id("/test.Front/RelayDetached");
const RELAY_WORKER: MethodId = method_id("/test.Front/RelayWorker");
const RELAY_TOKIO: MethodId = method_id("/test.Front/RelayTokio");
const RELAY_THREAD: MethodId = method_id("/test.Front/RelayThread");
const RELAY_THREAD_PASSED: MethodId = method_id("/test.Front/RelayThreadPassed");

struct Front {
    back: std::net::SocketAddr,
    /// A blocking client to B, made by the first inline relay (on the worker thread).
    client: Mutex<Option<Client>>,
    channel: Channel,
}

/// B's answer to a blocking call with `opts` on a client of the calling thread.
fn seen_blocking(client: &Client, opts: &CallOptions) -> Result<EchoMsg, Status> {
    client.unary::<EchoMsg, EchoMsg>(SEEN, &EchoMsg::default(), opts)
}

impl Service for Front {
    const NAME: &'static str = "test.Front";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: RELAY, name: "/test.Front/Relay" },
        MethodDesc { id: RELAY_SHORT, name: "/test.Front/RelayShort" },
        MethodDesc { id: RELAY_DETACHED, name: "/test.Front/RelayDetached" },
        MethodDesc { id: RELAY_WORKER, name: "/test.Front/RelayWorker" },
        MethodDesc { id: RELAY_TOKIO, name: "/test.Front/RelayTokio" },
        MethodDesc { id: RELAY_THREAD, name: "/test.Front/RelayThread" },
        MethodDesc { id: RELAY_THREAD_PASSED, name: "/test.Front/RelayThreadPassed" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, _body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let blocking = |opts: CallOptions| {
            let mut client = self.client.lock().unwrap();
            if client.is_none() {
                *client = Some(Client::connect_with(self.back, &client_config()).expect("connect to B"));
            }
            seen_blocking(client.as_ref().unwrap(), &opts)
        };
        let through_channel = |rt: AsyncRuntime| {
            let ch = self.channel.clone();
            spawn_async(&rt, ctx, move |_| async move {
                ch.unary::<EchoMsg, EchoMsg>(SEEN, EchoMsg::default(), &CallOptions::default()).await
            })
        };
        let on_thread = |passed: bool| {
            let (responder, reply) = ctx.defer::<EchoMsg>();
            let opts = if passed { CallOptions::deadline_at(ctx.deadline()) } else { CallOptions::default() };
            let back = self.back;
            std::thread::spawn(move || {
                let client = Client::connect_with(back, &client_config()).expect("connect to B");
                responder.send(seen_blocking(&client, &opts));
            });
            reply
        };
        match method {
            RELAY => out.reply(Reply::from(blocking(CallOptions::default()))),
            RELAY_SHORT => out.reply(Reply::from(blocking(CallOptions::deadline(Duration::from_secs(2))))),
            RELAY_DETACHED => {
                out.reply(Reply::from(blocking(CallOptions::default().without_inherited_deadline())))
            }
            RELAY_WORKER => out.reply(through_channel(AsyncRuntime::worker())),
            RELAY_TOKIO => out.reply(through_channel(AsyncRuntime::current_or_default())),
            RELAY_THREAD => out.reply(on_thread(false)),
            RELAY_THREAD_PASSED => out.reply(on_thread(true)),
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn start() -> (ServerHandle, ServerHandle, Client) {
    let back = server().add_service(Back).spawn("127.0.0.1:0").expect("B starts");
    let channel_config = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let channel =
        rt.block_on(Channel::connect_with(back.local_addr(), &channel_config)).expect("channel to B");
    let front = Front { back: back.local_addr(), client: Mutex::new(None), channel };
    let front = server().add_service(front).spawn("127.0.0.1:0").expect("A starts");
    let client = Client::connect_with(front.local_addr(), &client_config()).expect("connect to A");
    (back, front, client)
}

/// What B saw of a call A made in `method`, for a call to A with `opts`.
#[track_caller]
fn seen(client: &Client, method: MethodId, opts: &CallOptions) -> u64 {
    client.unary::<EchoMsg, EchoMsg>(method, &EchoMsg::default(), opts).expect("relay").seq
}

#[test]
fn calls_made_by_handlers_inherit_the_deadline_of_the_call_they_serve() {
    let (back, front, client) = start();
    let ten = CallOptions::deadline(Duration::from_secs(10));
    for (method, what) in [
        (RELAY, "inline handler, blocking client"),
        (RELAY_WORKER, "async handler on the worker, Channel"),
        (RELAY_TOKIO, "async handler on tokio, Channel"),
        (RELAY_THREAD_PASSED, "a thread of the handler's, deadline passed on"),
    ] {
        let left = seen(&client, method, &ten);
        assert!(left > 0 && left <= 10_000, "{what}: B saw {left} ms left, not at most A's 10 s");
        // A call to A without a deadline gives B none.
        assert_eq!(seen(&client, method, &CallOptions::default()), NONE, "{what}: without a deadline");
    }
    // The handler's own timeout, shorter than the inherited deadline, wins; longer, it loses.
    let left = seen(&client, RELAY_SHORT, &ten);
    assert!(left > 0 && left <= 2_000, "own 2 s under an inherited 10 s: B saw {left} ms");
    let left = seen(&client, RELAY_SHORT, &CallOptions::deadline(Duration::from_secs(1)));
    assert!(left <= 1_000, "own 2 s under an inherited 1 s: B saw {left} ms");
    // Opting out, and a thread that was given nothing, inherit nothing.
    assert_eq!(seen(&client, RELAY_DETACHED, &ten), NONE, "without_inherited_deadline");
    assert_eq!(seen(&client, RELAY_THREAD, &ten), NONE, "a thread of the handler's own");
    drop(client);
    front.shutdown();
    back.shutdown();
}

/// A handler whose call's deadline has passed makes calls that fail DEADLINE_EXCEEDED at once,
/// not calls that run on without a deadline.
#[test]
fn a_call_made_after_the_inherited_deadline_passed_fails_deadline_exceeded() {
    const LATE: MethodId = method_id("/test.Late/Late");
    struct Late {
        back: std::net::SocketAddr,
        got: Arc<Mutex<Option<Status>>>,
    }
    impl Service for Late {
        const NAME: &'static str = "test.Late";
        const METHODS: &'static [MethodDesc] = &[MethodDesc { id: LATE, name: "/test.Late/Late" }];
        fn call(&self, _m: MethodId, ctx: &RequestContext, _b: Body<'_>, out: &mut ReplyWriter<'_>) {
            let client = Client::connect_with(self.back, &client_config()).expect("connect to B");
            let deadline = ctx.deadline().expect("a deadline");
            std::thread::sleep(
                deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(20),
            );
            let r = seen_blocking(&client, &CallOptions::default());
            *self.got.lock().unwrap() = r.err();
            out.reply(Reply::from(EchoMsg::default()));
        }
    }
    let back = server().add_service(Back).spawn("127.0.0.1:0").expect("B starts");
    let got = Arc::new(Mutex::new(None));
    let front = server()
        .add_service(Late { back: back.local_addr(), got: got.clone() })
        .spawn("127.0.0.1:0")
        .expect("A starts");
    let client = Client::connect_with(front.local_addr(), &client_config()).expect("connect to A");
    let e = client
        .unary::<EchoMsg, EchoMsg>(
            LATE,
            &EchoMsg::default(),
            &CallOptions::deadline(Duration::from_millis(300)),
        )
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    wait_until(
        "A's handler to finish",
        Duration::from_secs(30),
        || got.lock().unwrap().is_some(),
        String::new,
    );
    let inner = got.lock().unwrap().clone().unwrap();
    assert_eq!(inner.code(), Code::DeadlineExceeded, "the inner call: {inner}");
    drop(client);
    front.shutdown();
    back.shutdown();
}
