//! The method ids codegen computed at build time equal the runtime's `method_id()` of the full
//! names, for every method of every generated service, and the descriptors agree with the
//! constants.

use std::collections::BTreeMap;

use codegen_tests::codegen::{
    comments, common, deep, keywords, only_service, shadowing, shapes, streaming, stub_names,
};
use codegen_tests::services::Impl;
use codegen_tests::{helloworld, no_package};
use rpc_core::codegen::{method_id, MethodDesc, MethodId, Service};

/// `(NAME, METHODS)` of one service adapter.
fn descriptors<S: Service>() -> (&'static str, &'static [MethodDesc]) {
    (S::NAME, S::METHODS)
}

/// Every adapter of the test protos.
fn all_services() -> Vec<(&'static str, &'static [MethodDesc])> {
    vec![
        descriptors::<helloworld::greeter_server::GreeterServer<Impl>>(),
        descriptors::<keywords::match_server::MatchServer<Impl>>(),
        descriptors::<keywords::self_server::SelfServer<Impl>>(),
        descriptors::<keywords::async_server::AsyncServer<Impl>>(),
        descriptors::<stub_names::session_server::SessionServer<Impl>>(),
        descriptors::<stub_names::echo_server::EchoServer<Impl>>(),
        descriptors::<shadowing::reply_server::ReplyServer<Impl>>(),
        descriptors::<shadowing::service_server::ServiceServer<Impl>>(),
        descriptors::<shadowing::shadow_server::ShadowServer<Impl>>(),
        descriptors::<shadowing::t_server::TServer<Impl>>(),
        descriptors::<deep::ledger_server::LedgerServer<Impl>>(),
        descriptors::<deep::inner::v1::pricing_server::PricingServer<Impl>>(),
        descriptors::<no_package::pinger_server::PingerServer<Impl>>(),
        descriptors::<only_service::exchange_server::ExchangeServer<Impl>>(),
        descriptors::<codegen_tests::codegen::well_known::clock_server::ClockServer<Impl>>(),
        descriptors::<shapes::profiles_server::ProfilesServer<Impl>>(),
        descriptors::<shapes::health_server::HealthServer<Impl>>(),
        descriptors::<shapes::counter_server::CounterServer<Impl>>(),
        descriptors::<streaming::feed_server::FeedServer<Impl>>(),
        descriptors::<streaming::firehose_server::FirehoseServer<Impl>>(),
        descriptors::<comments::commented_server::CommentedServer<Impl>>(),
    ]
}

#[test]
fn build_time_ids_equal_the_runtime_hash() {
    const SAY_HELLO: MethodId = method_id("/helloworld.Greeter/SayHello");
    assert_eq!(helloworld::greeter_server::SAY_HELLO, SAY_HELLO);
    assert_eq!(helloworld::greeter_client::SAY_HELLO, SAY_HELLO);
    assert_eq!(helloworld::greeter_server::method_names::SAY_HELLO, "/helloworld.Greeter/SayHello");
    assert_eq!(helloworld::greeter_server::SERVICE_NAME, "helloworld.Greeter");

    let mut counts = BTreeMap::new();
    for (service, descs) in all_services() {
        for desc in descs {
            assert_eq!(desc.id, method_id(desc.name), "{service}: {}", desc.name);
            assert_ne!(desc.id, 0, "{}", desc.name);
            let prefix = format!("/{service}/");
            assert!(desc.name.starts_with(&prefix), "{} is not a method of {service}", desc.name);
        }
        counts.insert(service, descs.len());
    }
    // Every RPC of the test protos, streaming ones included.
    let expected = BTreeMap::from([
        ("helloworld.Greeter", 1),
        ("codegen.keywords.match", 7),
        ("codegen.keywords.Self", 1),
        ("codegen.keywords.async", 1),
        ("codegen.stub_names.Session", 11),
        ("codegen.stub_names.Echo", 1),
        ("codegen.shadowing.Reply", 1),
        ("codegen.shadowing.Service", 1),
        ("codegen.shadowing.Shadow", 5),
        ("codegen.shadowing.T", 1),
        ("codegen.deep.Ledger", 2),
        ("codegen.deep.inner.v1.Pricing", 2),
        ("Pinger", 1),
        ("codegen.only_service.Exchange", 1),
        ("codegen.well_known.Clock", 3),
        ("codegen.shapes.Profiles", 2),
        ("codegen.shapes.Health", 1),
        ("codegen.shapes.Counter", 1),
        ("codegen.streaming.Feed", 4),
        ("codegen.streaming.Firehose", 1),
        ("codegen.comments.Commented", 1),
    ]);
    assert_eq!(counts, expected);
}

#[test]
fn ids_are_unique_across_all_services() {
    let mut seen: BTreeMap<MethodId, &str> = BTreeMap::new();
    for (_, descs) in all_services() {
        for desc in descs {
            if let Some(first) = seen.insert(desc.id, desc.name) {
                panic!("{first} and {} share id {:#x}", desc.name, desc.id);
            }
        }
    }
}

#[test]
fn names_and_constants_of_the_tricky_protos() {
    // Keywords.
    assert_eq!(keywords::match_server::SERVICE_NAME, "codegen.keywords.match");
    assert_eq!(keywords::match_server::TYPE, method_id("/codegen.keywords.match/type"));
    assert_eq!(keywords::match_server::SELF, method_id("/codegen.keywords.match/self"));
    assert_eq!(keywords::self_server::SELF, method_id("/codegen.keywords.Self/Self"));
    assert_eq!(keywords::async_server::AWAIT, method_id("/codegen.keywords.async/await"));
    // `ServiceName` took the constant; the service name moved aside.
    assert_eq!(
        stub_names::session_server::SERVICE_NAME,
        method_id("/codegen.stub_names.Session/ServiceName")
    );
    assert_eq!(stub_names::session_server::SERVICE_NAME_, "codegen.stub_names.Session");
    assert_eq!(stub_names::session_client::SERVICE_NAME_, "codegen.stub_names.Session");
    // No package: the full name has no leading dot.
    assert_eq!(no_package::pinger_server::SERVICE_NAME, "Pinger");
    assert_eq!(no_package::pinger_server::PING, method_id("/Pinger/Ping"));
    // Nested packages.
    assert_eq!(deep::inner::v1::pricing_server::SERVICE_NAME, "codegen.deep.inner.v1.Pricing");
    assert_eq!(deep::inner::v1::pricing_client::QUOTE, method_id("/codegen.deep.inner.v1.Pricing/Quote"));
    // Streaming RPCs have no constants; the unary one of the same service does.
    assert_eq!(streaming::feed_server::GET, method_id("/codegen.streaming.Feed/Get"));
    let _: common::Money = common::Money::default();
}
