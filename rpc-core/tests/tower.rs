//! A `Channel` method as a `tower_service::Service` (issue 30 item 2): tower's layers apply
//! unchanged, each seen to act on real calls to a server on sim (timeout, concurrency limit,
//! rate limit, retry, load shed).

mod rpc_support;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rpc_core::channel::UnaryService;
use rpc_core::codegen::*;
use rpc_core::{Channel, ChannelConfig, Code, PollingPolicy, Request};
use rpc_support::*;
use tower::{BoxError, Service as _, ServiceBuilder, ServiceExt};

const SLOW: MethodId = method_id("/test.Tower/Slow");
const HELD: MethodId = method_id("/test.Tower/Held");
const FLAKY: MethodId = method_id("/test.Tower/Flaky");
const FAST: MethodId = method_id("/test.Tower/Fast");

#[derive(Default)]
struct Seen {
    /// Handlers running now, and the most at once.
    running: AtomicUsize,
    max_running: AtomicUsize,
    /// Calls of `Flaky`.
    flaky_calls: AtomicU32,
}

struct Tower(Arc<Seen>);

impl Service for Tower {
    const NAME: &'static str = "test.Tower";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: SLOW, name: "/test.Tower/Slow" },
        MethodDesc { id: HELD, name: "/test.Tower/Held" },
        MethodDesc { id: FLAKY, name: "/test.Tower/Flaky" },
        MethodDesc { id: FAST, name: "/test.Tower/Fast" },
    ];
    fn call(&self, method: MethodId, ctx: &RequestContext, _b: Body<'_>, out: &mut ReplyWriter<'_>) {
        match method {
            // Answers after 400 ms, on a thread of its own.
            SLOW => {
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(400));
                    responder.send(Ok(EchoMsg::default()));
                });
                out.reply(reply)
            }
            // Counts itself running for 50 ms, on a thread of its own.
            HELD => {
                let seen = self.0.clone();
                let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                seen.max_running.fetch_max(now, Ordering::SeqCst);
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    seen.running.fetch_sub(1, Ordering::SeqCst);
                    responder.send(Ok(EchoMsg::default()));
                });
                out.reply(reply)
            }
            // UNAVAILABLE twice, then answers its call count.
            FLAKY => {
                let n = self.0.flaky_calls.fetch_add(1, Ordering::SeqCst) + 1;
                if n <= 2 {
                    out.error(Status::unavailable(format!("attempt {n} fails")));
                } else {
                    out.reply(Reply::from(EchoMsg { seq: u64::from(n), ..Default::default() }));
                }
            }
            _ => out.reply(Reply::from(EchoMsg::default())),
        }
    }
}

fn start() -> (rpc_core::ServerHandle, Channel, Arc<Seen>, tokio::runtime::Runtime) {
    let seen = Arc::new(Seen::default());
    let server = server().add_service(Tower(seen.clone())).spawn("127.0.0.1:0").expect("server starts");
    let config = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let channel = rt.block_on(Channel::connect_with(server.local_addr(), &config)).expect("channel");
    (server, channel, seen, rt)
}

fn req() -> Request<EchoMsg> {
    Request::new(EchoMsg::default())
}

#[test]
fn timeout_layer_fails_a_call_to_a_slow_handler() {
    let (server, channel, _seen, rt) = start();
    let svc = channel.unary_service::<EchoMsg, EchoMsg>(SLOW);
    let mut svc = ServiceBuilder::new().timeout(Duration::from_millis(20)).service(svc);
    let r = rt.block_on(async { svc.ready().await?.call(req()).await });
    let e = r.expect_err("the timeout fires before the 400 ms answer");
    assert!(e.is::<tower::timeout::error::Elapsed>(), "not tower's Elapsed: {e}");
    // Without the layer the same call answers (the service itself works).
    let plain = channel.unary_service::<EchoMsg, EchoMsg>(SLOW);
    rt.block_on(plain.oneshot(req())).expect("plain call");
    drop(channel);
    server.shutdown();
}

#[test]
fn concurrency_limit_bounds_the_handlers_running_at_once() {
    let (server, channel, seen, rt) = start();
    const LIMIT: usize = 2;
    let svc = ServiceBuilder::new()
        .concurrency_limit(LIMIT)
        .service(channel.unary_service::<EchoMsg, EchoMsg>(HELD));
    rt.block_on(async {
        let calls: Vec<_> = (0..12).map(|_| svc.clone().oneshot(req())).collect();
        for r in futures_join(calls).await {
            r.expect("call");
        }
    });
    let max = seen.max_running.load(Ordering::SeqCst);
    assert!((1..=LIMIT).contains(&max), "{max} handlers ran at once under a limit of {LIMIT}");
    drop(channel);
    server.shutdown();
}

/// Awaits every future, concurrently (on the current task).
async fn futures_join<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => all = false,
                }
            }
        }
        if all {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn rate_limit_holds_the_call_past_the_rate() {
    let (server, channel, _seen, rt) = start();
    // Two calls per minute: the third is not ready within the test.
    rt.block_on(async {
        let mut svc = ServiceBuilder::new()
            .rate_limit(2, Duration::from_secs(60))
            .service(channel.unary_service::<EchoMsg, EchoMsg>(FAST));
        for _ in 0..2 {
            svc.ready().await.expect("ready").call(req()).await.expect("call");
        }
        let mut cx = Context::from_waker(Waker::noop());
        assert!(svc.poll_ready(&mut cx).is_pending(), "a third call within the minute is ready");
    });
    drop(channel);
    server.shutdown();
}

/// Retries UNAVAILABLE, at most 4 attempts in all.
#[derive(Clone)]
struct RetryUnavailable(u32);

impl tower::retry::Policy<Request<EchoMsg>, EchoMsg, Status> for RetryUnavailable {
    type Future = std::future::Ready<()>;
    fn retry(
        &mut self,
        _req: &mut Request<EchoMsg>,
        result: &mut Result<EchoMsg, Status>,
    ) -> Option<Self::Future> {
        match result {
            Err(s) if s.code() == Code::Unavailable && self.0 > 1 => {
                self.0 -= 1;
                Some(std::future::ready(()))
            }
            _ => None,
        }
    }
    fn clone_request(&mut self, req: &Request<EchoMsg>) -> Option<Request<EchoMsg>> {
        Some(req.clone())
    }
}

#[test]
fn retry_layer_retries_unavailable_until_it_succeeds() {
    let (server, channel, seen, rt) = start();
    let svc: UnaryService<EchoMsg, EchoMsg> = channel.unary_service(FLAKY);
    let svc = ServiceBuilder::new().retry(RetryUnavailable(4)).service(svc);
    let r = rt.block_on(svc.oneshot(req())).expect("succeeds after two UNAVAILABLE");
    assert_eq!(r.seq, 3, "answered by the third attempt");
    assert_eq!(seen.flaky_calls.load(Ordering::SeqCst), 3);
    drop(channel);
    server.shutdown();
}

#[test]
fn load_shed_refuses_a_call_past_the_concurrency_limit() {
    let (server, channel, _seen, rt) = start();
    let svc = ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(1)
        .service(channel.unary_service::<EchoMsg, EchoMsg>(SLOW));
    rt.block_on(async {
        let mut first = svc.clone();
        let first = first.ready().await.expect("ready").call(req());
        let second = tokio::time::timeout(Duration::from_secs(5), svc.clone().oneshot(req())).await;
        let e: BoxError = second.expect("shed at once, not queued").expect_err("shed");
        assert!(e.is::<tower::load_shed::error::Overloaded>(), "not Overloaded: {e}");
        first.await.expect("the first call answers");
    });
    drop(channel);
    server.shutdown();
}
