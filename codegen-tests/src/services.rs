//! One implementation of every generated service trait, with answers a test can predict: each
//! reply is computed from the request, so a test asserts that the request arrived intact and the
//! right handler answered.

use rpc_core::codegen::{
    Code, Reply, RequestContext, RequestStream, Responder, Status, StreamSink, SINK_DEPTH,
};

use crate::codegen::{common, deep, keywords, only_service, shadowing, shapes, stub_names, well_known};
use crate::{codegen, helloworld, no_package};

/// Implements every service of the test protos.
#[derive(Debug, Default, Clone, Copy)]
pub struct Impl;

impl helloworld::greeter_server::Greeter for Impl {
    fn say_hello(
        &self,
        _ctx: &RequestContext,
        request: helloworld::HelloRequest,
    ) -> Reply<helloworld::HelloReply> {
        helloworld::HelloReply { message: format!("Hello {}!", request.name) }.into()
    }
}

/// `self` with every field tagged by the RPC that answered.
fn tag_self(rpc: &str, request: keywords::Self_) -> keywords::Self_ {
    keywords::Self_ { self_: format!("{rpc}:{}", request.self_), ..request }
}

impl keywords::match_server::Match for Impl {
    fn self_(&self, _ctx: &RequestContext, request: keywords::Self_) -> Reply<keywords::Self_> {
        tag_self("self", request).into()
    }
    fn super_(&self, _ctx: &RequestContext, request: keywords::Self_) -> Reply<keywords::Self_> {
        tag_self("super", request).into()
    }
    fn crate_(&self, _ctx: &RequestContext, request: keywords::Crate) -> Reply<keywords::Crate> {
        keywords::Crate { r#type: request.r#type + 1 }.into()
    }
    fn r#type(&self, _ctx: &RequestContext, request: keywords::Type) -> Reply<keywords::Type> {
        keywords::Type { r#match: request.r#match * 2 }.into()
    }
    fn r#gen(&self, _ctx: &RequestContext, request: keywords::Gen) -> Reply<keywords::Gen> {
        keywords::Gen { r#async: !request.r#async }.into()
    }
    fn r#async(&self, _ctx: &RequestContext, request: keywords::Gen) -> Reply<keywords::Gen> {
        request.into()
    }
    fn r#match(&self, _ctx: &RequestContext, request: keywords::Type) -> Reply<keywords::Type> {
        keywords::Type { r#match: -request.r#match }.into()
    }
}

impl keywords::self_server::Self_ for Impl {
    fn self_(&self, _ctx: &RequestContext, request: keywords::Self_) -> Reply<keywords::Self_> {
        tag_self("Self", request).into()
    }
}

impl keywords::async_server::Async for Impl {
    fn r#await(&self, _ctx: &RequestContext, request: keywords::Gen) -> Reply<keywords::Gen> {
        keywords::Gen { r#async: !request.r#async }.into()
    }
}

/// `Resp` naming the RPC that answered and echoing the request's tag.
fn resp(rpc: &str, request: &stub_names::Req) -> Reply<stub_names::Resp> {
    stub_names::Resp { tag: format!("{rpc}:{}", request.tag) }.into()
}

impl stub_names::session_server::Session for Impl {
    fn connect(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("Connect", &request)
    }
    fn connect_with(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("ConnectWith", &request)
    }
    fn new(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("New", &request)
    }
    fn close(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("Close", &request)
    }
    fn clone(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("Clone", &request)
    }
    fn client(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("Client", &request)
    }
    fn into_client(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("IntoClient", &request)
    }
    fn ping(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("Ping", &request)
    }
    fn ping_with(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("PingWith", &request)
    }
    fn ping_async(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("PingAsync", &request)
    }
    fn service_name(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("ServiceName", &request)
    }
}

impl stub_names::echo_server::Echo for Impl {
    fn echo(&self, _ctx: &RequestContext, request: stub_names::Req) -> Reply<stub_names::Resp> {
        resp("Echo", &request)
    }
}

impl shadowing::reply_server::Reply for Impl {
    fn get(&self, _ctx: &RequestContext, request: shadowing::Result) -> Reply<shadowing::Option> {
        shadowing::Option { value: (!request.value.is_empty()).then_some(request.value) }.into()
    }
}

impl shadowing::service_server::Service for Impl {
    fn call(&self, _ctx: &RequestContext, request: shadowing::Status) -> Reply<shadowing::Stream> {
        shadowing::Stream { chunks: vec![prost::bytes::Bytes::copy_from_slice(&request.code.to_le_bytes())] }
            .into()
    }
}

impl shadowing::shadow_server::Shadow for Impl {
    fn check(&self, _ctx: &RequestContext, request: shadowing::Status) -> Reply<shadowing::Stream> {
        if request.code < 0 {
            // A handler's error status travels back to the caller as is.
            return Status::invalid_argument(format!("negative code {}", request.code)).into();
        }
        shadowing::Stream { chunks: vec![vec![request.code as u8; 3].into()] }.into()
    }
    fn wrap(&self, _ctx: &RequestContext, request: shadowing::Vec) -> Reply<shadowing::String> {
        shadowing::String { s: request.items.join(",") }.into()
    }
    fn pass(&self, _ctx: &RequestContext, _request: shadowing::Send) -> Reply<shadowing::Sync> {
        shadowing::Sync {}.into()
    }
    fn answer(&self, _ctx: &RequestContext, _request: shadowing::Client) -> Reply<shadowing::Send> {
        shadowing::Send {}.into()
    }
    fn unbox(&self, _ctx: &RequestContext, request: shadowing::Box) -> Reply<shadowing::Box> {
        match request.inner {
            Some(inner) => (*inner).into(),
            None => Status::invalid_argument("nothing to unbox").into(),
        }
    }
}

impl shadowing::t_server::T for Impl {
    fn get(&self, _ctx: &RequestContext, request: shadowing::Result) -> Reply<shadowing::Result> {
        shadowing::Result { value: request.value.to_uppercase() }.into()
    }
}

impl deep::ledger_server::Ledger for Impl {
    fn sum(&self, _ctx: &RequestContext, request: common::Page) -> Reply<deep::Outer> {
        deep::Outer {
            total: Some(common::Money {
                currency: "EUR".into(),
                units: i64::from(request.offset + request.limit),
            }),
            inner: Some(deep::outer::Inner { note: format!("{}+{}", request.offset, request.limit) }),
        }
        .into()
    }
    fn annotate(&self, _ctx: &RequestContext, request: deep::outer::Inner) -> Reply<deep::outer::Inner> {
        deep::outer::Inner { note: format!("[{}]", request.note) }.into()
    }
}

impl deep::inner::v1::pricing_server::Pricing for Impl {
    fn quote(&self, _ctx: &RequestContext, request: common::Money) -> Reply<deep::inner::v1::Quote> {
        deep::inner::v1::Quote {
            detail: Some(deep::outer::Inner { note: format!("quoted in {}", request.currency) }),
            price: Some(request),
        }
        .into()
    }
    fn total(&self, _ctx: &RequestContext, request: deep::inner::v1::Quote) -> Reply<deep::Outer> {
        deep::Outer { total: request.price, inner: request.detail }.into()
    }
}

impl no_package::pinger_server::Pinger for Impl {
    fn ping(&self, _ctx: &RequestContext, request: no_package::Ping) -> Reply<no_package::Ping> {
        no_package::Ping { seq: request.seq + 1 }.into()
    }
}

impl only_service::exchange_server::Exchange for Impl {
    fn convert(&self, _ctx: &RequestContext, request: common::Money) -> Reply<common::Money> {
        common::Money { currency: "USD".into(), units: request.units * 2 }.into()
    }
}

impl well_known::clock_server::Clock for Impl {
    fn now(&self, _ctx: &RequestContext, _request: ()) -> Reply<prost_types::Timestamp> {
        prost_types::Timestamp { seconds: 1_700_000_000, nanos: 42 }.into()
    }
    fn reset(&self, _ctx: &RequestContext, request: prost_types::Timestamp) -> Reply<()> {
        if request.seconds < 0 {
            return Status::invalid_argument("before the epoch").into();
        }
        ().into()
    }
    fn renew(&self, _ctx: &RequestContext, request: prost_types::Duration) -> Reply<well_known::Lease> {
        well_known::Lease {
            until: Some(prost_types::Timestamp {
                seconds: 1_700_000_000 + request.seconds,
                nanos: request.nanos,
            }),
            length: Some(request),
        }
        .into()
    }
}

impl shapes::profiles_server::Profiles for Impl {
    fn put(&self, _ctx: &RequestContext, request: shapes::Profile) -> Reply<shapes::Empty> {
        if request.nickname.is_none() {
            return Status::invalid_argument("a nickname is required").into();
        }
        shapes::Empty {}.into()
    }
    fn get(&self, _ctx: &RequestContext, _request: shapes::Nothing) -> Reply<shapes::Profile> {
        shapes::Profile {
            nickname: Some("bob".into()),
            age: None,
            name: "Robert".into(),
            kind: shapes::profile::Kind::Robot as i32,
            contact: Some(shapes::profile::Contact::Phone(5551234)),
            scores: [("chess".to_owned(), 1800)].into_iter().collect(),
            addresses: vec![shapes::profile::Address { city: "Lyon".into() }],
        }
        .into()
    }
}

impl shapes::health_server::Health for Impl {
    fn check(&self, _ctx: &RequestContext, request: shapes::Empty) -> Reply<shapes::Empty> {
        request.into()
    }
}

impl shapes::counter_server::Counter for Impl {
    fn increment(&self, _ctx: &RequestContext, _request: shapes::Nothing) -> Reply<shapes::Profile> {
        shapes::Profile { age: Some(1), ..Default::default() }.into()
    }
}

impl codegen::streaming::feed_server::Feed for Impl {
    fn get(
        &self,
        _ctx: &RequestContext,
        request: codegen::streaming::Item,
    ) -> Reply<codegen::streaming::Item> {
        codegen::streaming::Item { n: request.n + 100 }.into()
    }

    fn subscribe(
        &self,
        _ctx: &RequestContext,
        request: codegen::streaming::Item,
        sink: StreamSink<codegen::streaming::Item>,
    ) {
        // A few messages inline (at most SINK_DEPTH fit before the worker drains them).
        for n in 0..request.n.min(SINK_DEPTH as u32) {
            if sink.send(&codegen::streaming::Item { n }).is_err() {
                return;
            }
        }
    }

    fn upload(
        &self,
        _ctx: &RequestContext,
        requests: RequestStream<codegen::streaming::Item>,
        responder: Responder<codegen::streaming::Item>,
    ) {
        // The sum of the client's numbers.
        std::thread::spawn(move || {
            let sum: Result<u32, Status> = requests.map(|m| m.map(|m| m.n)).sum();
            responder.send(sum.map(|n| codegen::streaming::Item { n }));
        });
    }

    fn chat(
        &self,
        _ctx: &RequestContext,
        requests: RequestStream<codegen::streaming::Item>,
        sink: StreamSink<codegen::streaming::Item>,
    ) {
        // Each number back, doubled.
        std::thread::spawn(move || {
            for m in requests {
                let Ok(m) = m else { return };
                if sink.send(&codegen::streaming::Item { n: m.n * 2 }).is_err() {
                    return;
                }
            }
        });
    }
}

impl codegen::streaming::firehose_server::Firehose for Impl {
    fn drink(
        &self,
        _ctx: &RequestContext,
        request: codegen::streaming::Item,
        sink: StreamSink<codegen::streaming::Item>,
    ) {
        std::thread::spawn(move || {
            for n in 0..request.n {
                if sink.send(&codegen::streaming::Item { n }).is_err() {
                    return;
                }
            }
            sink.finish(Err(Status::new(Code::ResourceExhausted, "dry")));
        });
    }
}

impl codegen::comments::commented_server::Commented for Impl {
    fn run(
        &self,
        _ctx: &RequestContext,
        request: codegen::comments::Documented,
    ) -> Reply<codegen::comments::Documented> {
        codegen::comments::Documented { field: request.other, other: request.field }.into()
    }
}
