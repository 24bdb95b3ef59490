//! Generated stubs over a balanced channel (issue 28 item 3): the stub takes the balanced
//! `Channel` through its unchanged `from_channel`, and its calls (with or without options, a
//! request key among them) spread over the servers.

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use codegen_tests::helloworld;
use codegen_tests::services::Impl;
use rpc_core::balance::{BalanceConfig, Policy, StaticResolver};
use rpc_core::codegen::{CallOptions, ClientConfig};
use rpc_core::{Channel, ChannelConfig, PollingPolicy, Server, ServerHandle, Transport};

const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

fn spawn_server() -> ServerHandle {
    Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(helloworld::greeter_server::GreeterServer::new(Impl))
        .spawn("127.0.0.1:0")
        .expect("server starts")
}

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
fn a_generated_stub_calls_through_a_balanced_channel() {
    let servers: Vec<ServerHandle> = (0..2).map(|_| spawn_server()).collect();
    let addrs: Vec<_> = servers.iter().map(|s| s.local_addr()).collect();
    let config = BalanceConfig::default().policy(Policy::RoundRobin).channel(
        ChannelConfig::default()
            .client(
                ClientConfig::default().transport(Transport::Sim).polling(PollingPolicy::Event { spins: 0 }),
            )
            .thread_name("stub-bal"),
    );
    let channel = Channel::balanced(StaticResolver::new(addrs.clone()), &config).expect("balanced channel");
    let greeter = helloworld::greeter_client::GreeterClient::from_channel(channel.clone());
    let request = helloworld::HelloRequest { name: "world".into() };
    let first = block_on(greeter.say_hello(&request)).expect("first call");
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while channel.balancer().unwrap().servers().iter().any(|s| s.state != rpc_core::balance::ServerState::Up)
    {
        assert!(std::time::Instant::now() < until, "servers never all up");
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..20u64 {
        let opts = CallOptions::default().with_key(i);
        let reply = block_on(greeter.say_hello_with(&request, &opts)).expect("call");
        assert_eq!(reply, first, "the same request gets the same reply from either server");
    }
    let picks: Vec<u64> = channel.balancer().unwrap().servers().iter().map(|s| s.picks).collect();
    assert!(picks.iter().all(|&p| p >= 10), "round robin through the stub: {picks:?}");
    drop(greeter);
    drop(channel);
}
