//! Request metadata and interceptors (issue 30 items 1 and 2): ASCII and binary entries from the
//! blocking `Client` and the `Channel` (unary, a `Request` wrapping the message, server and client
//! streams) reach sync and async handlers; a call without metadata shows none; a server
//! interceptor refuses a call without a token (UNAUTHENTICATED, handler not run) and a client
//! interceptor adds it; a block over `max_metadata_bytes` is refused naming it and the session
//! serves on.

mod rpc_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rpc_core::codegen::*;
use rpc_core::{
    AsyncRuntime, CallOptions, Channel, ChannelConfig, Client, Metadata, PollingPolicy, Request, ServerHandle,
};
use rpc_support::*;

/// Answers what the request's metadata held: `payload` = `"{x-token}|{bytes of blob-bin}|{entries}"`.
const WHO: MethodId = method_id("/test.Meta/Who");
/// As WHO, from an async handler polled on the worker.
const WHO_ASYNC: MethodId = method_id("/test.Meta/WhoAsync");
/// Server stream: one message, WHO's answer.
const WHO_STREAM: MethodId = method_id("/test.Meta/WhoStream");
/// Client stream: reads every message, then answers WHO's answer.
const WHO_UPLOAD: MethodId = method_id("/test.Meta/WhoUpload");

fn who(md: &Metadata) -> EchoMsg {
    let token = md.get("x-token").unwrap_or("-");
    let blob = md.get_bin("blob-bin").map_or(0, <[u8]>::len);
    EchoMsg { payload: format!("{token}|{blob}|{}", md.len()).into_bytes(), ..Default::default() }
}

#[derive(Default)]
struct Meta {
    /// Handlers run (a refused call never runs one).
    ran: Arc<AtomicU64>,
}

impl Service for Meta {
    const NAME: &'static str = "test.Meta";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: WHO, name: "/test.Meta/Who" },
        MethodDesc { id: WHO_ASYNC, name: "/test.Meta/WhoAsync" },
        MethodDesc { id: WHO_STREAM, name: "/test.Meta/WhoStream" },
        MethodDesc { id: WHO_UPLOAD, name: "/test.Meta/WhoUpload" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, _body: Body<'_>, out: &mut ReplyWriter<'_>) {
        self.ran.fetch_add(1, Ordering::Relaxed);
        match method {
            WHO => out.reply(Reply::from(who(ctx.metadata()))),
            WHO_ASYNC => out.reply(spawn_async(&AsyncRuntime::worker(), ctx, |actx| async move {
                Ok(who(actx.metadata()))
            })),
            WHO_STREAM => {
                let (sink, reply) = ctx.stream::<EchoMsg>();
                let _ = sink.send(&who(ctx.metadata()));
                drop(sink);
                out.reply(reply);
            }
            WHO_UPLOAD => {
                let requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                let answer = who(ctx.metadata());
                std::thread::spawn(move || {
                    for m in requests {
                        if let Err(s) = m {
                            return responder.send(Err(s));
                        }
                    }
                    responder.send(Ok(answer));
                });
                out.reply(reply);
            }
            _ => out.error(Status::unimplemented("no such method")),
        }
    }
}

fn text(m: EchoMsg) -> String {
    String::from_utf8(m.payload).unwrap()
}

fn metadata() -> Metadata {
    let mut md = Metadata::new();
    md.insert("x-token", "t0k3n").unwrap();
    md.insert_bin("blob-bin", &[0, 1, 2, 255]).unwrap();
    md
}

fn channel(server: &ServerHandle, rt: &tokio::runtime::Runtime, client: rpc_core::ClientConfig) -> Channel {
    let cfg = ChannelConfig::default().client(client.polling(PollingPolicy::Event { spins: 0 })).spins(500);
    rt.block_on(Channel::connect_with(server.local_addr(), &cfg)).expect("channel")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn metadata_reaches_sync_and_async_handlers_from_the_client_and_the_channel() {
    let server = server().add_service(Meta::default()).spawn("127.0.0.1:0").expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    let with = CallOptions::default().with_metadata(metadata());
    let none = CallOptions::default();
    for method in [WHO, WHO_ASYNC] {
        let r: EchoMsg = client.unary(method, &EchoMsg::default(), &with).unwrap();
        assert_eq!(text(r), "t0k3n|4|2", "method {method:#x}");
        // No metadata: none seen (and none left over from the call before on this worker).
        let r: EchoMsg = client.unary(method, &EchoMsg::default(), &none).unwrap();
        assert_eq!(text(r), "-|0|0", "method {method:#x}");
        let r: EchoMsg = block_on(client.unary_async(method, &EchoMsg::default(), &with)).unwrap();
        assert_eq!(text(r), "t0k3n|4|2", "async call, method {method:#x}");
    }
    // A server stream's and a client stream's opening request.
    let mut s = client.server_stream::<_, EchoMsg>(WHO_STREAM, &EchoMsg::default(), &with).unwrap();
    assert_eq!(text(s.message().unwrap().unwrap()), "t0k3n|4|2");
    drop(s);
    let mut up = client.client_stream::<EchoMsg, EchoMsg>(WHO_UPLOAD, &with).unwrap();
    up.send(&EchoMsg::default()).unwrap();
    assert_eq!(text(up.finish().unwrap()), "t0k3n|4|2");

    // The Channel: CallOptions, and a `Request` wrapping the message (as generated stubs take).
    let rt = rt();
    let ch = channel(&server, &rt, client_config());
    rt.block_on(async {
        for method in [WHO, WHO_ASYNC] {
            let r = ch.unary::<EchoMsg, EchoMsg>(method, EchoMsg::default(), &with).await.unwrap();
            assert_eq!(text(r), "t0k3n|4|2");
            let mut req = Request::new(EchoMsg::default());
            req.metadata_mut().insert("x-token", "from-request").unwrap();
            let r = ch.unary::<EchoMsg, EchoMsg>(method, req, &none).await.unwrap();
            assert_eq!(text(r), "from-request|0|1");
            let r = ch.unary::<EchoMsg, EchoMsg>(method, EchoMsg::default(), &none).await.unwrap();
            assert_eq!(text(r), "-|0|0");
        }
        let mut rx =
            ch.server_stream::<EchoMsg, EchoMsg>(WHO_STREAM, Request::new(EchoMsg::default()), &with);
        assert_eq!(text(rx.message().await.unwrap().unwrap()), "t0k3n|4|2");
    });
    drop(ch);
    drop(client);
    server.shutdown();
}

#[test]
fn interceptors_refuse_a_call_without_a_token_and_add_one() {
    let svc = Meta::default();
    let ran = svc.ran.clone();
    let server = server()
        .interceptor(|info| match info.metadata().get("authorization") {
            Some("Bearer secret") => Ok(()),
            Some(_) => Err(Status::unauthenticated("wrong token")),
            None => Err(Status::unauthenticated(format!("{}: no token", info.method()))),
        })
        .add_service(svc)
        .spawn("127.0.0.1:0")
        .expect("server");
    let plain = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    let e = plain.unary::<_, EchoMsg>(WHO, &EchoMsg::default(), &CallOptions::default()).unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.message().contains("/test.Meta/Who: no token"), "{e}");
    assert_eq!(ran.load(Ordering::Relaxed), 0, "a refused call runs no handler");
    // The session serves on; the token in the call's metadata passes.
    let mut md = Metadata::new();
    md.insert("authorization", "Bearer secret").unwrap();
    let ok = CallOptions::default().with_metadata(md);
    assert_eq!(text(plain.unary(WHO, &EchoMsg::default(), &ok).unwrap()), "-|0|1");

    // A client interceptor adds the token to every call, and may refuse a call itself.
    let cfg = client_config().interceptor(|md| {
        if md.get("x-token") == Some("forbidden") {
            return Err(Status::permission_denied("refused by the client's interceptor"));
        }
        md.insert("authorization", "Bearer secret").map_err(|e| Status::internal(e.to_string()))
    });
    let authed = Client::connect_with(server.local_addr(), &cfg).expect("client");
    assert_eq!(text(authed.unary(WHO, &EchoMsg::default(), &CallOptions::default()).unwrap()), "-|0|1");
    let mut bad = Metadata::new();
    bad.insert("x-token", "forbidden").unwrap();
    let e = authed
        .unary::<_, EchoMsg>(WHO, &EchoMsg::default(), &CallOptions::default().with_metadata(bad.clone()))
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    let rt = rt();
    let ch = channel(&server, &rt, cfg);
    rt.block_on(async {
        let r = ch.unary::<EchoMsg, EchoMsg>(WHO_ASYNC, EchoMsg::default(), &CallOptions::default()).await;
        assert_eq!(text(r.unwrap()), "-|0|1");
        let mut rx = ch.server_stream::<EchoMsg, EchoMsg>(
            WHO_STREAM,
            EchoMsg::default(),
            &CallOptions::default().with_metadata(bad),
        );
        assert_eq!(rx.message().await.unwrap_err().code(), Code::PermissionDenied);
    });
    drop(ch);
    drop((plain, authed));
    server.shutdown();
}

#[test]
fn metadata_over_the_limit_is_refused_naming_it_and_the_session_serves_on() {
    let svc = Meta::default();
    let ran = svc.ran.clone();
    let server = server().max_metadata_bytes(256).add_service(svc).spawn("127.0.0.1:0").expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    let mut big = Metadata::new();
    big.insert_bin("blob-bin", &[7; 300]).unwrap();
    let big = CallOptions::default().with_metadata(big);
    // The second time, the block is the session's cached one (protocol 11): refused alike.
    for _ in 0..2 {
        let e = client.unary::<_, EchoMsg>(WHO, &EchoMsg::default(), &big).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
        assert!(e.message().contains("max_metadata_bytes"), "{e}");
    }
    assert_eq!(client.counters().metadata_cached, 1);
    assert_eq!(ran.load(Ordering::Relaxed), 0);
    let mut small = Metadata::new();
    small.insert_bin("blob-bin", &[7; 200]).unwrap();
    let r = client.unary(WHO, &EchoMsg::default(), &CallOptions::default().with_metadata(small)).unwrap();
    assert_eq!(text(r), "-|200|1");
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

fn token(t: &str) -> CallOptions {
    let mut md = Metadata::new();
    md.insert("x-token", t).unwrap();
    CallOptions::default().with_metadata(md)
}

/// Protocol 11: a block a session's server keeps is named, not sent, by the calls after the one
/// that stored it (`Counters::metadata_cached` on both ends counts them, and must agree), and
/// every call's handler sees its own metadata whatever came before it: a new block, none, a
/// body too large to carry a stored block, sync and async handlers, a stream's opening request.
#[test]
fn a_repeated_block_is_sent_once_and_every_call_sees_its_own() {
    let server = server().add_service(Meta::default()).spawn("127.0.0.1:0").expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    let large = EchoMsg { payload: vec![1; 10_000], ..Default::default() };
    let small = EchoMsg::default();
    // (method, token, request, names the kept block)
    let calls: [(MethodId, Option<&str>, &EchoMsg, bool); 11] = [
        (WHO, Some("a"), &small, false),
        (WHO, Some("a"), &small, true),
        (WHO_ASYNC, Some("a"), &small, true),
        (WHO, Some("b"), &small, false),
        (WHO_ASYNC, Some("b"), &small, true),
        (WHO, None, &small, false),
        (WHO, Some("b"), &small, true),
        // Above the eager threshold: its block travels in full, and is not kept.
        (WHO, Some("a"), &large, false),
        (WHO, Some("b"), &small, true),
        (WHO, Some("a"), &small, false),
        (WHO_ASYNC, Some("a"), &small, true),
    ];
    let mut named = 0;
    for (i, (method, t, req, cached)) in calls.into_iter().enumerate() {
        let opts = t.map_or_else(CallOptions::default, token);
        let r: EchoMsg = client.unary(method, req, &opts).unwrap();
        let want = t.map_or_else(|| "-|0|0".to_string(), |t| format!("{t}|0|1"));
        assert_eq!(text(r), want, "call {i}");
        named += u64::from(cached);
        assert_eq!(client.counters().metadata_cached, named, "call {i}: named the kept block or not");
    }
    let mut s = client.server_stream::<_, EchoMsg>(WHO_STREAM, &small, &token("a")).unwrap();
    assert_eq!(text(s.message().unwrap().unwrap()), "a|0|1");
    drop(s);
    assert_eq!(client.counters().metadata_cached, named + 1, "a stream's opening request names it too");
    // A worker publishes its counters on its timer tick.
    wait_until(
        "the server's count",
        WAIT,
        || server.counters().metadata_cached > named,
        || format!("{:?}", server.counters()),
    );
    assert_eq!(server.counters().metadata_cached, named + 1, "the server took as many");
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

/// Many calls at once through a `Channel` (32 started, 4 on the wire: the server grants 4
/// credits, so the others wait in the session's queue; the rest wait in the Channel's), with
/// three tokens in turn and every third call given up early (its future dropped, sent or not):
/// each answered call saw its own token. A store given up before it left must not leave the
/// calls behind it naming a block the server never got.
#[test]
fn concurrent_calls_with_changing_blocks_each_see_their_own() {
    let server =
        server().credits_per_session(4).add_service(Meta::default()).spawn("127.0.0.1:0").expect("server");
    let rt = rt();
    let ch = channel(&server, &rt, client_config().window(32));
    let answered = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..3000u32 {
            let ch = ch.clone();
            // Runs of the same token, so blocks are stored, named and replaced while others wait.
            let t = format!("t{}", (i / 7) % 3);
            set.spawn(async move {
                let call = ch.unary::<EchoMsg, EchoMsg>(WHO, EchoMsg::default(), &token(&t));
                let r = if i % 3 == 2 {
                    match tokio::time::timeout(std::time::Duration::from_micros(1), call).await {
                        Ok(r) => r,
                        Err(_) => return 0,
                    }
                } else {
                    call.await
                };
                assert_eq!(text(r.unwrap()), format!("{t}|0|1"), "call {i}");
                1
            });
        }
        let mut answered = 0;
        while let Some(r) = set.join_next().await {
            answered += r.expect("a call's task");
        }
        answered
    });
    assert!(answered >= 2000, "{answered} calls answered");
    let sent = ch.counters().metadata_cached;
    assert!(sent > 0, "no call named the kept block");
    wait_until(
        "the server's count",
        WAIT,
        || server.counters().metadata_cached == sent,
        || {
            format!(
                "the client sent {sent} named blocks, the server took {}",
                server.counters().metadata_cached
            )
        },
    );
    drop(ch);
    server.shutdown();
}

/// A call that would store a new block, given up while it waits for a credit (never sent): the
/// server still keeps the block before it, so the next call with the new block stores it again
/// rather than naming a block the server never got.
#[test]
fn a_store_given_up_before_it_left_is_stored_again() {
    let server =
        server().credits_per_session(1).add_service(Meta::default()).spawn("127.0.0.1:0").expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config().window(4)).expect("client");
    let req = EchoMsg::default();
    // Holds the only credit.
    let first = client.unary_async::<_, EchoMsg>(WHO, &req, &token("a"));
    // Waits for it, and is given up unsent.
    let gone = client.unary_async::<_, EchoMsg>(WHO, &req, &token("b"));
    drop(gone);
    let again = client.unary_async::<_, EchoMsg>(WHO, &req, &token("b"));
    let named = client.unary_async::<_, EchoMsg>(WHO, &req, &token("a"));
    assert_eq!(text(block_on(first).unwrap()), "a|0|1");
    assert_eq!(text(block_on(again).unwrap()), "b|0|1");
    assert_eq!(text(block_on(named).unwrap()), "a|0|1");
    // The block kept now is b's (`named` went in full: a store waited to leave).
    assert_eq!(client.counters().metadata_cached, 0);
    assert_eq!(text(client.unary(WHO, &req, &token("a")).unwrap()), "a|0|1");
    assert_eq!(text(client.unary(WHO, &req, &token("a")).unwrap()), "a|0|1");
    assert_eq!(client.counters().metadata_cached, 1, "only the last call named a kept block");
    drop(client);
    server.shutdown();
}
