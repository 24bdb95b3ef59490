//! One calling convention for both stubs: the blocking stub (over a `Client`) and the stub over a
//! `Channel` take a request by value or by reference (`IntoRequest`), for unary calls and server
//! streams alike, so switching from one to the other rewrites no call site. And `Clone` where it
//! holds: the stub over a `Channel` is `Clone + Send + Sync`, the blocking one `Send` only (its
//! `compile_fail` doctests are in the crate docs).

// Both forms are written on purpose, `Copy` messages included.
#![allow(clippy::needless_borrows_for_generic_args, clippy::clone_on_copy)]

use codegen_tests::codegen::streaming::{feed_client::FeedClient, feed_server::FeedServer, Item};
use codegen_tests::helloworld::{greeter_client::GreeterClient, greeter_server::GreeterServer, HelloRequest};
use codegen_tests::services::Impl;
use rpc_core::codegen::{CallOptions, Channel, ChannelConfig, Client, ClientConfig, IntoRequest};
use rpc_core::{PollingPolicy, Server, ServerHandle, Transport};

/// Yield after a few empty polls: the tests share two cores.
const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

fn spawn_server() -> ServerHandle {
    Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(FeedServer::new(Impl))
        .add_service(GreeterServer::new(Impl))
        .spawn("127.0.0.1:0")
        .expect("spawn the server on sim")
}

/// A window of 4 slots, so that a burst of calls on the `Channel` queues some of them (a queued
/// call keeps its request until its session encodes it: a reference is cloned then).
fn config() -> ClientConfig {
    ClientConfig { window: 4, ..ClientConfig::default() }.transport(Transport::Sim).polling(POLLING)
}

fn assert_clone_send_sync<T: Clone + Send + Sync>() {}
fn assert_send<T: Send>() {}

/// The same call written once for any request form (what a helper in user code looks like).
fn get_blocking(stub: &FeedClient<Client>, request: impl IntoRequest<Item>) -> u32 {
    stub.get(request).expect("get").n
}

#[test]
fn both_stubs_take_requests_by_value_and_by_reference() {
    assert_clone_send_sync::<FeedClient<Channel>>();
    assert_clone_send_sync::<GreeterClient<Channel>>();
    assert_send::<FeedClient<Client>>();
    assert_send::<GreeterClient<Client>>();
    let server = spawn_server();
    let addr = server.local_addr();
    let item = Item { n: 1 };

    // The blocking stub.
    let blocking = FeedClient::connect_with(addr, &config()).expect("connect");
    assert_eq!(blocking.get(&item).expect("by reference").n, 101);
    assert_eq!(blocking.get(item.clone()).expect("by value").n, 101);
    assert_eq!(blocking.get_with(&item, &CallOptions::default()).expect("_with, by reference").n, 101);
    assert_eq!(blocking.get_with(item.clone(), &CallOptions::default()).expect("_with, by value").n, 101);
    assert_eq!(get_blocking(&blocking, &Item { n: 5 }), 105);
    assert_eq!(get_blocking(&blocking, Item { n: 6 }), 106);
    let by_ref = blocking.get_async(&item);
    let by_value = blocking.get_async(item.clone());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    assert_eq!(rt.block_on(by_ref).expect("_async, by reference").n, 101);
    assert_eq!(rt.block_on(by_value).expect("_async, by value").n, 101);
    let three = Item { n: 3 };
    let streamed: Vec<u32> =
        blocking.subscribe(&three).expect("open").map(|m| m.expect("message").n).collect();
    assert_eq!(streamed, [0, 1, 2]);
    let streamed: Vec<u32> =
        blocking.subscribe(three.clone()).expect("open").map(|m| m.expect("message").n).collect();
    assert_eq!(streamed, [0, 1, 2]);

    // The stub over a `Channel`: the same call sites.
    let channel_config = ChannelConfig::default().client(config()).dispatchers(1);
    rt.block_on(async {
        let shared = FeedClient::connect_channel_with(addr, &channel_config).await.expect("channel");
        assert_eq!(shared.get(&item).await.expect("by reference").n, 101);
        assert_eq!(shared.get(item.clone()).await.expect("by value").n, 101);
        assert_eq!(
            shared.get_with(&item, &CallOptions::default()).await.expect("_with, by reference").n,
            101
        );
        assert_eq!(
            shared.get_with(item.clone(), &CallOptions::default()).await.expect("_with, by value").n,
            101
        );
        // A burst over the 4-slot window: later calls queue, keeping their request (moved, or
        // cloned from the reference) until the session encodes it.
        let greeter = GreeterClient::from_channel(shared.channel().clone());
        let names: Vec<HelloRequest> = (0..32).map(|n| HelloRequest { name: format!("n{n}") }).collect();
        let calls: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, req)| if i % 2 == 0 { greeter.say_hello(req) } else { greeter.say_hello(req.clone()) })
            .collect();
        drop(names);
        for (n, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.expect("burst call").message, format!("Hello n{n}!"), "call {n}");
        }
        for stream in [shared.subscribe(&three), shared.subscribe(three.clone())] {
            let mut stream = stream;
            let mut got = Vec::new();
            while let Some(m) = stream.message().await.expect("message") {
                got.push(m.n);
            }
            assert_eq!(got, [0, 1, 2]);
        }
    });
    drop(blocking);
    server.shutdown();
}

/// The hint field of the blocking `Client` changes none of its auto traits (`Send`, `Unpin`), only
/// what the compiler says about `Sync`.
#[test]
fn the_blocking_stub_keeps_its_auto_traits() {
    fn send_unpin<T: Send + Unpin>() {}
    send_unpin::<Client>();
    send_unpin::<FeedClient<Client>>();
}
