//! Response metadata and rich errors (issue 30 items 1 and 5): headers and trailers a handler
//! sets (inline, deferred through a `Responder`, async on the worker answering at once or as a
//! task) reach the blocking `Client` and the `Channel` through `CallOptions::capture_metadata`;
//! an error's trailers and details (`google.rpc.Status`, as `grpc-status-details-bin`) arrive
//! in its `Status`, also from a server stream's end and from an interceptor's refusal; a ring
//! body (above the eager threshold) carries them too; a call without them shows none; a client
//! refuses more than its `max_metadata_bytes` naming it, and its session serves on.

mod rpc_support;

use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::status::details::{BadRequest, ErrorDetails, FieldViolation, RetryInfo};
use rpc_core::{
    AsyncRuntime, CallOptions, CapturedMetadata, Channel, ChannelConfig, Client, Metadata, PollingPolicy,
    ServerHandle,
};
use rpc_support::*;

/// OK, headers `x-h: h-{seq}` and trailers `x-t-bin: [seq; 3]`; `reply_len` bytes of payload.
const OK_MD: MethodId = method_id("/test.Resp/OkMd");
/// OK without metadata.
const PLAIN: MethodId = method_id("/test.Resp/Plain");
/// INVALID_ARGUMENT with a BadRequest detail, a trailer from the status and the header set.
const FAIL_MD: MethodId = method_id("/test.Resp/FailMd");
/// As OK_MD from an async handler that answers at once (inline on the worker).
const ASYNC_NOW: MethodId = method_id("/test.Resp/AsyncNow");
/// As OK_MD from an async handler that waits first (a task: its answer goes through a
/// `Responder`).
const ASYNC_LATER: MethodId = method_id("/test.Resp/AsyncLater");
/// As OK_MD, deferred: a thread sets the trailers on the `Responder` and answers.
const DEFER_MD: MethodId = method_id("/test.Resp/DeferMd");
/// UNAVAILABLE from an async handler, with a RetryInfo detail and its header.
const ASYNC_FAIL: MethodId = method_id("/test.Resp/AsyncFail");
/// Headers of `reply_len` bytes (over a client's limit).
const HUGE_MD: MethodId = method_id("/test.Resp/HugeMd");
/// Server stream: headers set before the stream opens, one message, trailers set on the sink,
/// a clean end.
const STREAM_MD: MethodId = method_id("/test.Resp/StreamMd");
/// Server stream: one message, then ends ABORTED with a trailer.
const STREAM_FAIL: MethodId = method_id("/test.Resp/StreamFail");
/// Server stream: headers set before the stream opens, one message, then it waits for the
/// client to have seen the headers (`release`) before it sets its trailers and ends.
const STREAM_HOLD: MethodId = method_id("/test.Resp/StreamHold");
/// Server stream: a header of `reply_len` bytes, then two messages.
const STREAM_HUGE: MethodId = method_id("/test.Resp/StreamHuge");

/// The `STREAM_HOLD` calls (by seq) whose client saw the headers.
static RELEASED: (std::sync::Mutex<Vec<u64>>, std::sync::Condvar) =
    (std::sync::Mutex::new(Vec::new()), std::sync::Condvar::new());

fn release(seq: u64) {
    RELEASED.0.lock().unwrap().push(seq);
    RELEASED.1.notify_all();
}

/// Waits (at most 10 s: a client that never releases fails its own assertion first) for
/// `release(seq)`.
fn held(seq: u64) {
    let g = RELEASED.0.lock().unwrap();
    let _ = RELEASED.1.wait_timeout_while(g, Duration::from_secs(10), |r| !r.contains(&seq)).unwrap();
}

/// Reads the first message of a `STREAM_HOLD` call: its headers are captured, its trailers not
/// yet.
#[track_caller]
fn check_early_headers(c: &CapturedMetadata, seq: u64) {
    let md = c.get().expect("the stream's headers came with its first message");
    assert_eq!(md.headers().get("x-h"), Some(format!("h-{seq}").as_str()), "{md:?}");
    assert!(md.trailers().is_empty(), "no trailers before the end: {md:?}");
}

fn headers(seq: u64) -> Metadata {
    let mut md = Metadata::new();
    md.insert("x-h", &format!("h-{seq}")).unwrap();
    md
}

fn trailers(seq: u64) -> Metadata {
    let mut md = Metadata::new();
    md.insert_bin("x-t-bin", &[seq as u8; 3]).unwrap();
    md
}

fn bad_request() -> ErrorDetails {
    ErrorDetails {
        bad_request: Some(BadRequest {
            field_violations: vec![FieldViolation { field: "name".into(), description: "empty".into() }],
        }),
        ..Default::default()
    }
}

fn answer(req: &EchoMsg) -> EchoMsg {
    EchoMsg { seq: req.seq, payload: vec![9; req.reply_len as usize], ..Default::default() }
}

struct Resp;

impl Service for Resp {
    const NAME: &'static str = "test.Resp";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: OK_MD, name: "/test.Resp/OkMd" },
        MethodDesc { id: PLAIN, name: "/test.Resp/Plain" },
        MethodDesc { id: FAIL_MD, name: "/test.Resp/FailMd" },
        MethodDesc { id: ASYNC_NOW, name: "/test.Resp/AsyncNow" },
        MethodDesc { id: ASYNC_LATER, name: "/test.Resp/AsyncLater" },
        MethodDesc { id: DEFER_MD, name: "/test.Resp/DeferMd" },
        MethodDesc { id: ASYNC_FAIL, name: "/test.Resp/AsyncFail" },
        MethodDesc { id: HUGE_MD, name: "/test.Resp/HugeMd" },
        MethodDesc { id: STREAM_FAIL, name: "/test.Resp/StreamFail" },
        MethodDesc { id: STREAM_MD, name: "/test.Resp/StreamMd" },
        MethodDesc { id: STREAM_HOLD, name: "/test.Resp/StreamHold" },
        MethodDesc { id: STREAM_HUGE, name: "/test.Resp/StreamHuge" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let req = EchoMsg::decode(body.as_slice()).unwrap_or_default();
        match method {
            OK_MD => {
                ctx.set_headers(headers(req.seq));
                ctx.set_trailers(trailers(req.seq));
                out.reply(Reply::from(answer(&req)));
            }
            PLAIN => out.reply(Reply::from(answer(&req))),
            FAIL_MD => {
                ctx.set_headers(headers(req.seq));
                let mut s = Status::with_error_details(Code::InvalidArgument, "bad name", bad_request());
                s.metadata_mut().insert("x-reason", "name is empty").unwrap();
                out.reply(Reply::<EchoMsg>::from(Err(s)));
            }
            ASYNC_NOW => out.reply(spawn_async(&AsyncRuntime::worker(), ctx, move |actx| async move {
                actx.set_headers(headers(req.seq));
                actx.set_trailers(trailers(req.seq));
                Ok(answer(&req))
            })),
            ASYNC_LATER => out.reply(spawn_async(&AsyncRuntime::worker(), ctx, move |actx| async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                actx.set_headers(headers(req.seq));
                actx.set_trailers(trailers(req.seq));
                Ok(answer(&req))
            })),
            DEFER_MD => {
                // Headers set before the deferral go with the deferred answer.
                ctx.set_headers(headers(req.seq));
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    responder.set_trailers(trailers(req.seq));
                    responder.send(Ok(answer(&req)));
                });
                out.reply(reply);
            }
            ASYNC_FAIL => out.reply(spawn_async(&AsyncRuntime::worker(), ctx, move |actx| async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                actx.set_headers(headers(req.seq));
                let retry = ErrorDetails {
                    retry_info: Some(RetryInfo {
                        retry_delay: Some(rpc_core::status::details::Duration { seconds: 2, nanos: 0 }),
                    }),
                    ..Default::default()
                };
                Err::<EchoMsg, _>(Status::with_error_details(Code::Unavailable, "busy", retry))
            })),
            HUGE_MD => {
                let mut md = Metadata::new();
                md.insert_bin("huge-bin", &vec![1; req.reply_len as usize]).unwrap();
                ctx.set_headers(md);
                out.reply(Reply::from(answer(&EchoMsg::default())));
            }
            STREAM_MD => {
                ctx.set_headers(headers(req.seq));
                let (sink, reply) = ctx.stream::<EchoMsg>();
                let _ = sink.send(&answer(&req));
                sink.set_trailers(trailers(req.seq));
                drop(sink);
                out.reply(reply);
            }
            STREAM_HOLD => {
                ctx.set_headers(headers(req.seq));
                let (sink, reply) = ctx.stream::<EchoMsg>();
                let (m, seq) = (answer(&req), req.seq);
                std::thread::spawn(move || {
                    let _ = sink.send(&m);
                    held(seq);
                    sink.set_trailers(trailers(seq));
                });
                out.reply(reply);
            }
            STREAM_HUGE => {
                let mut md = Metadata::new();
                md.insert_bin("huge-bin", &vec![1; req.reply_len as usize]).unwrap();
                ctx.set_headers(md);
                let (sink, reply) = ctx.stream::<EchoMsg>();
                let _ = sink.send(&EchoMsg { seq: 1, ..Default::default() });
                let _ = sink.send(&EchoMsg { seq: 2, ..Default::default() });
                out.reply(reply);
            }
            STREAM_FAIL => {
                let (sink, reply) = ctx.stream::<EchoMsg>();
                let _ = sink.send(&answer(&req));
                let mut s = Status::aborted("stream gave up");
                s.metadata_mut().insert("x-why", "tired").unwrap();
                sink.finish(Err(s));
                out.reply(reply);
            }
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn start() -> ServerHandle {
    server().add_service(Resp).spawn("127.0.0.1:0").expect("server")
}

fn req(seq: u64, reply_len: u32) -> EchoMsg {
    EchoMsg { seq, reply_len, ..Default::default() }
}

/// The headers and trailers of an OK_MD-shaped answer to call `seq`.
#[track_caller]
fn check_captured(c: &CapturedMetadata, seq: u64) {
    let md = c.take().expect("the response's metadata was captured");
    assert_eq!(md.headers().get("x-h"), Some(format!("h-{seq}").as_str()), "{md:?}");
    assert_eq!(md.headers().len(), 1, "{md:?}");
    assert_eq!(md.trailers().get_bin("x-t-bin"), Some(&[seq as u8; 3][..]), "{md:?}");
    assert_eq!(md.trailers().len(), 1, "{md:?}");
}

#[track_caller]
fn check_bad_request(e: &Status) {
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert_eq!(e.message(), "bad name");
    assert_eq!(e.error_details().unwrap(), bad_request(), "{e:#?}");
    assert_eq!(e.metadata().get("x-reason"), Some("name is empty"), "{e:#?}");
    assert_eq!(e.metadata().get("x-h"), Some("h-7"), "the header set before the error: {e:#?}");
    // The details trailer is read into the details, not kept as metadata.
    assert_eq!(e.metadata().get_bin(rpc_core::status::DETAILS_KEY), None, "{e:#?}");
}

#[test]
fn headers_trailers_and_details_reach_the_blocking_client() {
    let server = start();
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    let c = CapturedMetadata::new();
    let opts = CallOptions::default().capture_metadata(&c);
    // Inline, async answering at once, async as a task, deferred; eager and ring bodies.
    for (i, method) in [OK_MD, ASYNC_NOW, ASYNC_LATER, DEFER_MD].into_iter().enumerate() {
        for reply_len in [16u32, 64 << 10] {
            let seq = i as u64 + 1;
            let r: EchoMsg = client.unary(method, &req(seq, reply_len), &opts).unwrap();
            assert_eq!((r.seq, r.payload.len()), (seq, reply_len as usize), "method {method:#x}");
            check_captured(&c, seq);
            let r: EchoMsg = block_on(client.unary_async(method, &req(seq, reply_len), &opts)).unwrap();
            assert_eq!(r.payload.len(), reply_len as usize);
            check_captured(&c, seq);
        }
    }
    // No metadata: nothing captured.
    let r: EchoMsg = client.unary(PLAIN, &req(3, 8), &opts).unwrap();
    assert_eq!(r.seq, 3);
    assert_eq!(c.get(), None);
    // An error: trailers and details in the status, with and without a capture.
    for opts in [&opts, &CallOptions::default()] {
        let e = client.unary::<_, EchoMsg>(FAIL_MD, &req(7, 0), opts).unwrap_err();
        check_bad_request(&e);
    }
    // An error's headers travel with its trailers (gRPC's trailers-only response).
    let md = c.take().unwrap();
    assert!(md.headers().is_empty(), "{md:?}");
    assert_eq!(md.trailers().get("x-h"), Some("h-7"), "{md:?}");
    let e = client.unary::<_, EchoMsg>(ASYNC_FAIL, &req(7, 0), &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    let retry = e.error_details().unwrap().retry_info.expect("a RetryInfo detail");
    assert_eq!(retry.retry_delay.unwrap().seconds, 2);
    assert_eq!(e.metadata().get("x-h"), Some("h-7"), "{e:#?}");
    // A plain error carries none.
    let e = client.unary::<_, EchoMsg>(UNKNOWN, &req(1, 0), &CallOptions::default()).unwrap_err();
    assert!(e.metadata().is_empty() && e.details().is_empty(), "{e:#?}");
    // A server stream's end.
    let mut s = client.server_stream::<_, EchoMsg>(STREAM_FAIL, &req(4, 8), &CallOptions::default()).unwrap();
    assert_eq!(s.message().unwrap().unwrap().seq, 4);
    let e = s.message().unwrap_err();
    assert_eq!(e.code(), Code::Aborted, "{e}");
    assert_eq!(e.metadata().get("x-why"), Some("tired"), "{e:#?}");
    drop(s);
    // A server stream's clean end carries its headers and trailers.
    let mut s = client.server_stream::<_, EchoMsg>(STREAM_MD, &req(6, 8), &opts).unwrap();
    assert_eq!(s.message().unwrap().unwrap().seq, 6);
    assert_eq!(s.message().unwrap(), None);
    check_captured(&c, 6);
    drop(s);
    // A server stream's headers come with its first message, its trailers with its end.
    let mut s = client.server_stream::<_, EchoMsg>(STREAM_HOLD, &req(9, 8), &opts).unwrap();
    assert_eq!(s.message().unwrap().unwrap().seq, 9);
    check_early_headers(&c, 9);
    release(9);
    assert_eq!(s.message().unwrap(), None);
    check_captured(&c, 9);
    drop(s);
    drop(client);
    server.shutdown();
}

#[test]
fn headers_trailers_and_details_reach_the_channel() {
    let server = start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cfg = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500);
    let ch = rt.block_on(Channel::connect_with(server.local_addr(), &cfg)).expect("channel");
    rt.block_on(async {
        let c = CapturedMetadata::new();
        let opts = CallOptions::default().capture_metadata(&c);
        for (i, method) in [OK_MD, ASYNC_NOW, ASYNC_LATER, DEFER_MD].into_iter().enumerate() {
            let seq = i as u64 + 1;
            let r = ch.unary::<EchoMsg, EchoMsg>(method, req(seq, 64 << 10), &opts).await.unwrap();
            assert_eq!(r.payload.len(), 64 << 10);
            check_captured(&c, seq);
            // Many at once: calls that queue keep their capture.
            let caps: Vec<CapturedMetadata> = (0..64).map(|_| CapturedMetadata::new()).collect();
            let calls: Vec<_> = caps
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let o = CallOptions::default().capture_metadata(c);
                    ch.unary::<EchoMsg, EchoMsg>(method, req(k as u64, 8), &o)
                })
                .collect();
            for (k, call) in calls.into_iter().enumerate() {
                assert_eq!(call.await.unwrap().seq, k as u64);
                check_captured(&caps[k], k as u64);
            }
        }
        let e = ch.unary::<EchoMsg, EchoMsg>(FAIL_MD, req(7, 0), &opts).await.unwrap_err();
        check_bad_request(&e);
        let mut rx = ch.server_stream::<EchoMsg, EchoMsg>(STREAM_FAIL, req(4, 8), &CallOptions::default());
        assert_eq!(rx.message().await.unwrap().unwrap().seq, 4);
        let e = rx.message().await.unwrap_err();
        assert_eq!(e.metadata().get("x-why"), Some("tired"), "{e:#?}");
        let mut rx = ch.server_stream::<EchoMsg, EchoMsg>(STREAM_MD, req(6, 8), &opts);
        assert_eq!(rx.message().await.unwrap().unwrap().seq, 6);
        assert_eq!(rx.message().await.unwrap(), None);
        check_captured(&c, 6);
        let mut rx = ch.server_stream::<EchoMsg, EchoMsg>(STREAM_HOLD, req(10, 8), &opts);
        assert_eq!(rx.message().await.unwrap().unwrap().seq, 10);
        check_early_headers(&c, 10);
        release(10);
        assert_eq!(rx.message().await.unwrap(), None);
        check_captured(&c, 10);
    });
    drop(ch);
    server.shutdown();
}

#[test]
fn an_interceptors_refusal_carries_its_details() {
    let server = server()
        .interceptor(|_| {
            let mut s = Status::with_error_details(Code::Unauthenticated, "no token", bad_request());
            s.metadata_mut().insert("www-authenticate", "Bearer").unwrap();
            Err(s)
        })
        .add_service(Resp)
        .spawn("127.0.0.1:0")
        .expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    let e = client.unary::<_, EchoMsg>(PLAIN, &req(1, 0), &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert_eq!(e.metadata().get("www-authenticate"), Some("Bearer"), "{e:#?}");
    assert_eq!(e.error_details().unwrap(), bad_request());
    drop(client);
    server.shutdown();
}

#[test]
fn response_metadata_over_the_clients_limit_fails_the_call_naming_it_and_the_session_serves_on() {
    let server = start();
    let client =
        Client::connect_with(server.local_addr(), &client_config().max_metadata_bytes(1024)).expect("client");
    let e = client.unary::<_, EchoMsg>(HUGE_MD, &req(1, 2000), &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("ClientConfig::max_metadata_bytes"), "{e}");
    // Under the limit it passes; the session serves on.
    let c = CapturedMetadata::new();
    let opts = CallOptions::default().capture_metadata(&c);
    client.unary::<_, EchoMsg>(HUGE_MD, &req(1, 900), &opts).unwrap();
    assert_eq!(c.take().unwrap().headers().get_bin("huge-bin").map(<[u8]>::len), Some(900));
    assert_eq!(client.unary::<_, EchoMsg>(OK_MD, &req(5, 8), &opts).unwrap().seq, 5);
    check_captured(&c, 5);
    assert_eq!(client.closed_reason(), None);
    // A stream's headers over the limit: its first SEND gives the error in place of its
    // messages; the session serves on.
    let mut s =
        client.server_stream::<_, EchoMsg>(STREAM_HUGE, &req(1, 2000), &CallOptions::default()).unwrap();
    let e = loop {
        match s.message() {
            Ok(Some(m)) => assert_eq!(m.seq, 2, "the first message came with the headers"),
            Ok(None) => panic!("the stream ended without the limit's error"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("ClientConfig::max_metadata_bytes"), "{e}");
    drop(s);
    let mut s = client.server_stream::<_, EchoMsg>(STREAM_HUGE, &req(1, 900), &opts).unwrap();
    assert_eq!(s.message().unwrap().map(|m| m.seq), Some(1));
    assert_eq!(c.get().unwrap().headers().get_bin("huge-bin").map(<[u8]>::len), Some(900));
    assert_eq!(s.message().unwrap().map(|m| m.seq), Some(2));
    assert_eq!(s.message().unwrap(), None);
    drop(s);
    assert_eq!(client.unary::<_, EchoMsg>(OK_MD, &req(5, 8), &opts).unwrap().seq, 5);
    assert_eq!(client.closed_reason(), None);
    // A limit below two empty blocks is refused at connect, naming the field.
    let e = Client::connect_with(server.local_addr(), &client_config().max_metadata_bytes(11)).unwrap_err();
    assert!(e.message().contains("max_metadata_bytes"), "{e}");
    drop(client);
    server.shutdown();
}
