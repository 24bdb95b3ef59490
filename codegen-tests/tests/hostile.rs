//! The hostile protos (`codegen-tests/proto/`, and those `build.rs` writes) compiled, served on
//! `sim` and called through their stubs: deep nesting, the same names in two packages, a service
//! without methods, control characters in comments, a service with 300 methods.

use std::collections::BTreeSet;

use codegen_tests::hostile::{a, b, control, many};
use codegen_tests::hostile_services::HostileImpl;
use rpc_core::codegen::{method_id, ClientConfig, Service};
use rpc_core::{PollingPolicy, Server, Transport};

/// Yield after a few empty polls: the tests share two cores.
const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

#[test]
fn descriptors_of_the_hostile_services() {
    assert_eq!(<a::nothing_server::NothingServer<HostileImpl> as Service>::NAME, "hostile.a.Nothing");
    assert!(<a::nothing_server::NothingServer<HostileImpl> as Service>::METHODS.is_empty());
    assert_eq!(a::mirror_server::SERVICE_NAME, "hostile.a.Mirror");
    assert_eq!(b::mirror_server::SERVICE_NAME, "hostile.b.Mirror");
    assert_ne!(a::mirror_server::DEEP, b::mirror_server::DEEP);
    assert_eq!(a::mirror_client::DEEP, method_id("/hostile.a.Mirror/Deep"));
    assert_eq!(b::mirror_client::DEEP, method_id("/hostile.b.Mirror/Deep"));
    let methods = <many::many_server::ManyServer<HostileImpl> as Service>::METHODS;
    assert_eq!(methods.len(), 300);
    let ids: BTreeSet<u32> = methods.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 300, "no two of the 300 methods share an id");
    for (i, m) in methods.iter().enumerate() {
        assert_eq!(m.name, format!("/hostile.many.Many/Method{i}"));
        assert_eq!(m.id, method_id(m.name));
    }
}

#[test]
fn hostile_services_answer_on_sim() {
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(a::mirror_server::MirrorServer::new(HostileImpl))
        .add_service(b::mirror_server::MirrorServer::new(HostileImpl))
        .add_service(a::nothing_server::NothingServer::new(HostileImpl))
        .add_service(control::control_server::ControlServer::new(HostileImpl))
        .add_service(many::many_server::ManyServer::new(HostileImpl))
        .spawn("127.0.0.1:0")
        .expect("spawn the server on sim");
    let config = ClientConfig::default().transport(Transport::Sim).polling(POLLING);

    let ma = a::mirror_client::MirrorClient::connect_with(server.local_addr(), &config).expect("connect");
    let deep = a::l1::l2::l3::L4 { v: "xyz".into() };
    assert_eq!(ma.deep(&deep).expect("a.Deep").v, "a:xyz");
    assert_eq!(ma.reflect(&a::MirrorServer { s: "abc".into() }).expect("a.Reflect").s, "cba");

    let mb = b::mirror_client::MirrorClient::new(ma.into_client());
    assert_eq!(mb.deep(&deep).expect("b.Deep").n, 3);
    assert_eq!(mb.back(b::L1 { n: 7 }).expect("b.Back").s, "b:7");

    let c = control::control_client::ControlClient::new(mb.into_client());
    assert_eq!(c.say(&control::Text { s: "hi".into() }).expect("Say").s, "said hi");

    let m = many::many_client::ManyClient::new(c.into_client());
    assert_eq!(m.method0(many::M { n: 1 }).expect("Method0").n, 1000);
    assert_eq!(m.method150(many::M { n: 2 }).expect("Method150").n, 2150);
    assert_eq!(m.method299(many::M { n: 3 }).expect("Method299").n, 3299);
}
