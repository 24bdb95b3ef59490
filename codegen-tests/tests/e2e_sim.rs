//! Every generated service served by the runtime on `sim` and called through its generated stub:
//! the server is spawned in this process with a yielding polling policy, the clients connect over
//! loopback TCP (the handshake) and call over the software NIC.

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use codegen_tests::codegen::{
    comments, common, deep, keywords, only_service, shadowing, shapes, streaming, stub_names,
};
use codegen_tests::services::Impl;
use codegen_tests::{helloworld, no_package};
use rpc_core::codegen::{CallOptions, Client, ClientConfig, Code};
use rpc_core::{PollingPolicy, Server, ServerHandle, Transport};

/// Yield after a few empty polls: the tests share two cores.
const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

/// A server on `sim` with every service of the test protos, on an ephemeral loopback port.
fn spawn_server() -> ServerHandle {
    Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(helloworld::greeter_server::GreeterServer::new(Impl))
        .add_service(keywords::match_server::MatchServer::new(Impl))
        .add_service(keywords::self_server::SelfServer::new(Impl))
        .add_service(keywords::async_server::AsyncServer::new(Impl))
        .add_service(stub_names::session_server::SessionServer::new(Impl))
        .add_service(stub_names::echo_server::EchoServer::new(Impl))
        .add_service(shadowing::reply_server::ReplyServer::new(Impl))
        .add_service(shadowing::service_server::ServiceServer::new(Impl))
        .add_service(shadowing::shadow_server::ShadowServer::new(Impl))
        .add_service(shadowing::t_server::TServer::new(Impl))
        .add_service(deep::ledger_server::LedgerServer::new(Impl))
        .add_service(deep::inner::v1::pricing_server::PricingServer::new(Impl))
        .add_service(no_package::pinger_server::PingerServer::new(Impl))
        .add_service(only_service::exchange_server::ExchangeServer::new(Impl))
        .add_service(codegen_tests::codegen::well_known::clock_server::ClockServer::new(Impl))
        .add_service(shapes::profiles_server::ProfilesServer::new(Impl))
        .add_service(shapes::health_server::HealthServer::new(Impl))
        .add_service(shapes::counter_server::CounterServer::new(Impl))
        .add_service(streaming::feed_server::FeedServer::new(Impl))
        .add_service(streaming::firehose_server::FirehoseServer::new(Impl))
        .add_service(comments::commented_server::CommentedServer::new(Impl))
        .spawn("127.0.0.1:0")
        .expect("spawn the server on sim")
}

/// The client configuration of these tests: `sim`, yielding.
fn config() -> ClientConfig {
    ClientConfig::default().transport(Transport::Sim).polling(POLLING)
}

/// Drives a future to completion in this thread; the runtime's futures progress when polled, so
/// a no-op waker and a yield between polls are all they need.
///
/// # Panics
/// When the future is still pending after 60 s (a hang guard: a test failure, not a hang).
#[track_caller]
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    let start = std::time::Instant::now();
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::yield_now();
        assert!(start.elapsed() < Duration::from_secs(60), "the future was still pending after 60 s");
    }
}

#[test]
fn greeter_blocking_with_options_and_async() {
    let server = spawn_server();
    let greeter = helloworld::greeter_client::GreeterClient::connect_with(server.local_addr(), &config())
        .expect("connect");
    let request = helloworld::HelloRequest { name: "world".into() };
    assert_eq!(greeter.say_hello(&request).expect("say_hello").message, "Hello world!");
    let options = CallOptions::deadline(Duration::from_secs(30));
    assert_eq!(greeter.say_hello_with(&request, &options).expect("say_hello_with").message, "Hello world!");
    let async_request = helloworld::HelloRequest { name: "async".into() };
    assert_eq!(
        block_on(greeter.say_hello_async(&async_request)).expect("say_hello_async").message,
        "Hello async!"
    );
    // Several async calls in flight on one session, answered to the right caller.
    let requests: Vec<_> = (0..8).map(|i| helloworld::HelloRequest { name: format!("n{i}") }).collect();
    let futures: Vec<_> = requests.iter().map(|r| greeter.say_hello_async(r)).collect();
    for (i, future) in futures.into_iter().enumerate() {
        assert_eq!(block_on(future).expect("in flight").message, format!("Hello n{i}!"));
    }
    drop(greeter);
    server.shutdown();
}

#[test]
fn keyword_services_on_one_session() {
    let server = spawn_server();
    let client = Client::connect_with(server.local_addr(), &config()).expect("connect");
    let m = keywords::match_client::MatchClient::new(client);
    let me = keywords::Self_ { self_: "me".into(), r#type: "t".into(), ..Default::default() };
    let reply = m.self_(&me).expect("self");
    assert_eq!((reply.self_.as_str(), reply.r#type.as_str()), ("self:me", "t"));
    assert_eq!(m.super_(&me).expect("super").self_, "super:me");
    assert_eq!(m.crate_(keywords::Crate { r#type: 1 }).expect("crate").r#type, 2);
    assert_eq!(m.r#type(keywords::Type { r#match: 21 }).expect("type").r#match, 42);
    assert_eq!(
        m.type_with(keywords::Type { r#match: 2 }, &CallOptions::default()).expect("type_with").r#match,
        4
    );
    assert!(m.r#gen(keywords::Gen { r#async: false }).expect("gen").r#async);
    assert!(m.r#async(keywords::Gen { r#async: true }).expect("async").r#async);
    assert_eq!(m.r#match(keywords::Type { r#match: 5 }).expect("match").r#match, -5);
    assert_eq!(block_on(m.match_async(keywords::Type { r#match: 7 })).expect("match_async").r#match, -7);

    // The same session, handed from stub to stub.
    let s = keywords::self_client::SelfClient::from(m.into_client());
    assert_eq!(s.self_(&me).expect("Self").self_, "Self:me");
    let a = keywords::async_client::AsyncClient::new(s.into_client());
    assert!(a.r#await(keywords::Gen { r#async: false }).expect("await").r#async);
    drop(a);
    server.shutdown();
}

/// One blocking call of the `Session` stub.
type SessionCall = fn(
    &stub_names::session_client::SessionClient,
    &stub_names::Req,
) -> Result<stub_names::Resp, rpc_core::codegen::Status>;

#[test]
fn rpcs_named_like_stub_methods() {
    let server = spawn_server();
    // `connect` is the RPC; the constructor moved to `connect_`.
    let s = stub_names::session_client::SessionClient::connect_with__(server.local_addr(), &config())
        .expect("connect");
    let req = stub_names::Req { tag: "x".into() };
    let calls: [(&str, SessionCall); 11] = [
        ("Connect", |s, r| s.connect(r)),
        ("ConnectWith", |s, r| s.connect_with(r)),
        ("New", |s, r| s.new(r)),
        ("Close", |s, r| s.close(r)),
        ("Clone", |s, r| s.clone(r)),
        ("Client", |s, r| s.client(r)),
        ("IntoClient", |s, r| s.into_client(r)),
        ("Ping", |s, r| s.ping(r)),
        ("PingWith", |s, r| s.ping_with(r)),
        ("PingAsync", |s, r| s.ping_async(r)),
        ("ServiceName", |s, r| s.service_name(r)),
    ];
    for (rpc, call) in calls {
        let resp = call(&s, &req).unwrap_or_else(|e| panic!("{rpc}: {e:?}"));
        assert_eq!(resp.tag, format!("{rpc}:x"));
    }
    // The variants that moved aside call the right RPC.
    assert_eq!(
        s.connect_with_(&req, &CallOptions::default()).expect("Connect with options").tag,
        "Connect:x"
    );
    assert_eq!(s.ping_with_(&req, &CallOptions::default()).expect("Ping with options").tag, "Ping:x");
    assert_eq!(block_on(s.ping_async_(&req)).expect("Ping async").tag, "Ping:x");
    assert_eq!(block_on(s.ping_async_async(&req)).expect("PingAsync async").tag, "PingAsync:x");
    // A service named like its RPC, over the same session.
    let echo = stub_names::echo_client::EchoClient::new(s.into_client_());
    assert_eq!(echo.echo(&req).expect("echo").tag, "Echo:x");
    drop(echo);
    server.shutdown();
}

#[test]
fn user_types_named_like_std_and_facade_items() {
    let server = spawn_server();
    let addr = server.local_addr();
    let reply = shadowing::reply_client::ReplyClient::connect_with(addr, &config()).expect("connect");
    let got = reply.get(&shadowing::Result { value: "v".into() }).expect("get");
    assert_eq!(got.value.as_deref(), Some("v"));
    assert_eq!(reply.get(shadowing::Result::default()).expect("get empty").value, None);

    let service = shadowing::service_client::ServiceClient::new(reply.into_client());
    let stream = service.call(shadowing::Status { code: 258 }).expect("call");
    assert_eq!(stream.chunks, vec![258i32.to_le_bytes().to_vec()]);

    let shadow = shadowing::shadow_client::ShadowClient::new(service.into_client());
    assert_eq!(shadow.check(shadowing::Status { code: 7 }).expect("check").chunks, vec![vec![7u8; 3]]);
    // A handler's error status reaches the caller with its code and message.
    let err = shadow.check(shadowing::Status { code: -1 }).expect_err("negative code");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "negative code -1");
    let items = shadowing::Vec { items: vec!["a".into(), "b".into()] };
    assert_eq!(shadow.wrap(&items).expect("wrap").s, "a,b");
    assert_eq!(shadow.pass(shadowing::Send {}).expect("pass"), shadowing::Sync {});
    assert_eq!(shadow.answer(shadowing::Client {}).expect("answer"), shadowing::Send {});
    let boxed = shadowing::Box { inner: Some(Box::new(shadowing::Box { inner: None })) };
    assert_eq!(shadow.unbox(&boxed).expect("unbox"), shadowing::Box { inner: None });
    let t = shadowing::t_client::TClient::new(shadow.into_client());
    assert_eq!(t.get(&shadowing::Result { value: "up".into() }).expect("T.get").value, "UP");
    drop(t);
    server.shutdown();
}

#[test]
fn packages_imports_and_well_known_types() {
    let server = spawn_server();
    let addr = server.local_addr();
    let ledger = deep::ledger_client::LedgerClient::connect_with(addr, &config()).expect("connect");
    let outer = ledger.sum(common::Page { offset: 3, limit: 4 }).expect("sum");
    assert_eq!(outer.total.as_ref().map(|m| m.units), Some(7));
    assert_eq!(outer.inner.as_ref().map(|i| i.note.as_str()), Some("3+4"));
    let note = deep::outer::Inner { note: "n".into() };
    assert_eq!(ledger.annotate(&note).expect("annotate").note, "[n]");

    let pricing = deep::inner::v1::pricing_client::PricingClient::new(ledger.into_client());
    let money = common::Money { currency: "CHF".into(), units: 5 };
    let quote = pricing.quote(&money).expect("quote");
    assert_eq!(quote.price.as_ref(), Some(&money));
    assert_eq!(quote.detail.as_ref().map(|d| d.note.as_str()), Some("quoted in CHF"));
    let total = pricing.total(&quote).expect("total");
    assert_eq!((total.total, total.inner), (quote.price.clone(), quote.detail.clone()));

    let exchange = only_service::exchange_client::ExchangeClient::new(pricing.into_client());
    assert_eq!(
        exchange.convert(&money).expect("convert"),
        common::Money { currency: "USD".into(), units: 10 }
    );

    let pinger = no_package::pinger_client::PingerClient::new(exchange.into_client());
    assert_eq!(pinger.ping(no_package::Ping { seq: 41 }).expect("ping").seq, 42);

    let clock = codegen_tests::codegen::well_known::clock_client::ClockClient::new(pinger.into_client());
    assert_eq!(clock.now(()).expect("now"), prost_types::Timestamp { seconds: 1_700_000_000, nanos: 42 });
    clock.reset(prost_types::Timestamp { seconds: 1, nanos: 0 }).expect("reset");
    let err = clock.reset(prost_types::Timestamp { seconds: -1, nanos: 0 }).expect_err("before the epoch");
    assert_eq!(err.code(), Code::InvalidArgument);
    let lease = clock.renew(prost_types::Duration { seconds: 60, nanos: 5 }).expect("renew");
    assert_eq!(lease.until, Some(prost_types::Timestamp { seconds: 1_700_000_060, nanos: 5 }));
    assert_eq!(lease.length, Some(prost_types::Duration { seconds: 60, nanos: 5 }));
    drop(clock);
    server.shutdown();
}

#[test]
fn shapes_streaming_leftovers_and_comments() {
    let server = spawn_server();
    let addr = server.local_addr();
    let profiles = shapes::profiles_client::ProfilesClient::connect_with(addr, &config()).expect("connect");
    let got = profiles.get(shapes::Nothing {}).expect("get");
    assert_eq!(got.nickname.as_deref(), Some("bob"));
    assert_eq!(got.age, None);
    assert_eq!(got.kind(), shapes::profile::Kind::Robot);
    assert_eq!(got.contact, Some(shapes::profile::Contact::Phone(5551234)));
    assert_eq!(got.scores.get("chess"), Some(&1800));
    assert_eq!(got.addresses[0].city, "Lyon");
    assert_eq!(profiles.put(&got).expect("put"), shapes::Empty {});
    let err = profiles.put(shapes::Profile::default()).expect_err("no nickname");
    assert_eq!(err.code(), Code::InvalidArgument);

    let health = shapes::health_client::HealthClient::new(profiles.into_client());
    assert_eq!(health.check(shapes::Empty {}).expect("check"), shapes::Empty {});
    let counter = shapes::counter_client::CounterClient::new(health.into_client());
    assert_eq!(counter.increment(shapes::Nothing {}).expect("increment").age, Some(1));

    let feed = streaming::feed_client::FeedClient::new(counter.into_client());
    assert_eq!(feed.get(streaming::Item { n: 1 }).expect("get").n, 101);

    let commented = comments::commented_client::CommentedClient::new(feed.into_client());
    let doc = comments::Documented { field: "f".into(), other: "o".into() };
    let swapped = commented.run(&doc).expect("run");
    assert_eq!((swapped.field.as_str(), swapped.other.as_str()), ("o", "f"));

    // Server streams: messages in order, then the clean end (inline sends) or the handler's status.
    let feed = streaming::feed_client::FeedClient::new(commented.into_client());
    let got: Vec<u32> =
        feed.subscribe(streaming::Item { n: 5 }).expect("subscribe").map(|m| m.unwrap().n).collect();
    assert_eq!(got, [0, 1, 2, 3, 4]);
    let firehose = streaming::firehose_client::FirehoseClient::new(feed.into_client());
    let mut drink = firehose.drink(streaming::Item { n: 1000 }).expect("drink");
    for n in 0..1000 {
        assert_eq!(drink.message().expect("a message").expect("not the end").n, n);
    }
    assert_eq!(drink.message().expect_err("the handler's status").code(), Code::ResourceExhausted);
    drop(drink);

    // A client stream: the server's answer after the clean end.
    let feed = streaming::feed_client::FeedClient::new(firehose.into_client());
    let mut up = feed.upload().expect("upload");
    for n in 1..=100 {
        up.send(&streaming::Item { n }).expect("send");
    }
    assert_eq!(up.finish().expect("the sum").n, 5050);
    // A bidirectional stream: each message back, doubled, then the clean end.
    let mut chat = feed.chat().expect("chat");
    for n in 0..50 {
        chat.send(&streaming::Item { n }).expect("send");
        assert_eq!(chat.message().expect("an answer").expect("not the end").n, n * 2);
    }
    chat.finish();
    assert_eq!(chat.message().expect("the clean end"), None);
    drop(chat);
    let client = feed.into_client();
    drop(client);
    server.shutdown();
}

/// A greeter that answers from another thread, naming the method its context reports.
struct DeferringGreeter;

impl helloworld::greeter_server::Greeter for DeferringGreeter {
    fn say_hello(
        &self,
        ctx: &rpc_core::codegen::RequestContext,
        request: helloworld::HelloRequest,
    ) -> rpc_core::codegen::Reply<helloworld::HelloReply> {
        let (responder, reply) = ctx.defer::<helloworld::HelloReply>();
        let method = ctx.method().to_owned();
        std::thread::spawn(move || {
            responder
                .send(Ok(helloworld::HelloReply { message: format!("{method} later {}", request.name) }));
        });
        reply
    }
}

#[test]
fn a_generated_adapter_passes_deferred_answers_and_the_context() {
    let greeter = std::sync::Arc::new(DeferringGreeter);
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(helloworld::greeter_server::GreeterServer::from_arc(greeter))
        .spawn("127.0.0.1:0")
        .expect("spawn the server on sim");
    let client = helloworld::greeter_client::GreeterClient::connect_with(server.local_addr(), &config())
        .expect("connect");
    let reply = client.say_hello(&helloworld::HelloRequest { name: "x".into() }).expect("deferred answer");
    assert_eq!(reply.message, "/helloworld.Greeter/SayHello later x");
    drop(client);
    server.shutdown();
}

/// A server without the service: the stub's UNIMPLEMENTED names the method (the stub knows its
/// name; the wire carries only the id), on a `Client` and on a `Channel`.
#[test]
fn a_method_the_server_does_not_serve_is_named_in_unimplemented() {
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(no_package::pinger_server::PingerServer::new(Impl))
        .spawn("127.0.0.1:0")
        .expect("spawn the server on sim");
    let id = helloworld::greeter_client::SAY_HELLO;
    let expected =
        format!("method /helloworld.Greeter/SayHello (id {id:#010x}) is not served by this server");
    let request = helloworld::HelloRequest { name: "x".into() };

    let greeter = helloworld::greeter_client::GreeterClient::connect_with(server.local_addr(), &config())
        .expect("connect");
    let e = greeter.say_hello(&request).expect_err("no Greeter on this server");
    assert_eq!(e.code(), Code::Unimplemented, "{e}");
    assert_eq!(e.message(), expected);
    // The stub over a `Client` is `Debug` (an application's state may derive it).
    let debug = format!("{greeter:?}");
    assert_eq!(
        debug,
        format!("GreeterClient {{ inner: Client {{ peer: {}, transport: Sim, .. }} }}", server.local_addr())
    );
    drop(greeter);

    let channel_config = rpc_core::ChannelConfig::default().client(config()).thread_name("names");
    let channel = rpc_core::Channel::connect_blocking(server.local_addr(), &channel_config).expect("connect");
    let greeter = helloworld::greeter_client::GreeterClient::from_channel(channel);
    let e = block_on(greeter.say_hello(request)).expect_err("no Greeter on this server");
    assert_eq!(e.code(), Code::Unimplemented, "{e}");
    assert_eq!(e.message(), expected);
    drop(greeter);
    server.shutdown();
}
