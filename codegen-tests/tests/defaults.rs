//! What a new user of generated code meets first: server traits with default handlers
//! (`generate_default_stubs`) that answer UNIMPLEMENTED naming the RPC, sync and async, for every
//! RPC shape; blocking stubs that take a request by value or by reference; a oneof named like a
//! nested type, which prost-build names `...OneOf`.

use std::time::Duration;

use codegen_tests::codegen::defaults::{
    partial_async_client::PartialAsyncClient,
    partial_async_server::{PartialAsync, PartialAsyncServer},
    partial_client::PartialClient,
    partial_server::{Partial, PartialServer},
    Item,
};
use codegen_tests::codegen::shapes::{wrapper, Wrapper};
use rpc_core::codegen::{AsyncContext, ClientConfig, Code, Message, Reply, RequestContext, Status};
use rpc_core::{PollingPolicy, Server, Transport};

const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

/// Implements one method; every other one is the generated default.
struct Sync;
impl Partial for Sync {
    fn served(&self, _ctx: &RequestContext, request: Item) -> Reply<Item> {
        Item { n: request.n + 1 }.into()
    }
}

/// The same, async.
struct Async;
impl PartialAsync for Async {
    async fn served(&self, _ctx: AsyncContext, request: Item) -> Result<Item, Status> {
        Ok(Item { n: request.n + 2 })
    }
}

/// Checks `status` is the default handler's UNIMPLEMENTED naming `rpc`.
#[track_caller]
fn unimplemented(status: Status, rpc: &str) {
    assert_eq!(status.code(), Code::Unimplemented, "{status}");
    assert_eq!(
        status.message(),
        format!("method {rpc} is not implemented by this server (its handler is the generated default)")
    );
}

#[test]
fn default_handlers_answer_unimplemented_naming_the_rpc() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_service(PartialServer::new(Sync))
        .add_service(PartialAsyncServer::with_runtime(
            Async,
            rpc_core::codegen::AsyncRuntime::from_handle(runtime.handle().clone()),
        ))
        .spawn("127.0.0.1:0")
        .expect("spawn");
    let config = ClientConfig::default().transport(Transport::Sim).polling(POLLING);
    let item = Item { n: 1 };

    {
        let sync = PartialClient::connect_with(server.local_addr(), &config).expect("connect");
        // By reference and by value: one stub, both conventions.
        assert_eq!(sync.served(item).expect("served").n, 2);
        #[allow(clippy::needless_borrows_for_generic_args)] // the reference form is the point here
        let by_reference = sync.served(&item);
        assert_eq!(by_reference.expect("served").n, 2);
        unimplemented(sync.unary(item).expect_err("default"), "/codegen.defaults.Partial/Unary");
        let mut sub = sync.subscribe(item).expect("open");
        unimplemented(
            sub.next().expect("an end").expect_err("default"),
            "/codegen.defaults.Partial/Subscribe",
        );
        let up = sync.upload().expect("open");
        unimplemented(up.finish().expect_err("default"), "/codegen.defaults.Partial/Upload");
        let mut chat = sync.chat().expect("open");
        unimplemented(chat.message().expect_err("default"), "/codegen.defaults.Partial/Chat");
    }
    {
        let asynchronous = PartialAsyncClient::connect_with(server.local_addr(), &config).expect("connect");
        assert_eq!(asynchronous.served(item).expect("served").n, 3);
        unimplemented(asynchronous.unary(item).expect_err("default"), "/codegen.defaults.PartialAsync/Unary");
        let mut sub = asynchronous.subscribe(item).expect("open");
        unimplemented(
            sub.next().expect("an end").expect_err("default"),
            "/codegen.defaults.PartialAsync/Subscribe",
        );
        let up = asynchronous.upload().expect("open");
        unimplemented(up.finish().expect_err("default"), "/codegen.defaults.PartialAsync/Upload");
        let mut chat = asynchronous.chat().expect("open");
        unimplemented(chat.message().expect_err("default"), "/codegen.defaults.PartialAsync/Chat");
    }
    server.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(5));
}

/// The adapters are `Debug` (a user's crate may deny `missing_debug_implementations`) without
/// asking it of the implementation: `Sync` and `Async` are not `Debug`.
#[test]
fn adapters_are_debug_without_a_debug_implementation() {
    assert_eq!(
        format!("{:?}", PartialServer::new(Sync)),
        r#"PartialServer { service: "codegen.defaults.Partial", .. }"#
    );
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let adapter = PartialAsyncServer::with_runtime(
        Async,
        rpc_core::codegen::AsyncRuntime::from_handle(runtime.handle().clone()),
    );
    assert_eq!(
        format!("{adapter:?}"),
        r#"PartialAsyncServer { service: "codegen.defaults.PartialAsync", .. }"#
    );
}

/// prost-build names a oneof's type `<Name>OneOf` when a nested message or enum has its name;
/// codegen accepts the shape and every generated path uses that name.
#[test]
fn a_oneof_named_like_a_nested_type_is_its_name_with_one_of() {
    let w = Wrapper {
        inner: Some(wrapper::InnerOneOf::Message(wrapper::Inner { s: "x".into() })),
        mode: Some(wrapper::ModeOneOf::Chosen(wrapper::Mode::Fast as i32)),
    };
    let back = Wrapper::decode(w.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(back, w);
}

/// Messages that prost-build gives no module of nested items (only map and `optional` fields),
/// named like a service's module (`GreeterServer`) and like a package's (`Catalog` beside
/// `codegen.plain.catalog`), build as they are, unrenamed; so does a oneof `self` beside
/// `message Self` and `message SelfOneOf` (prost-build's `Self_OneOf`).
#[test]
fn messages_without_a_module_build_beside_modules_of_their_names() {
    use codegen_tests::codegen::plain::{self, holder, Catalog, GreeterServer, Holder};
    let catalog = Catalog {
        labels: [("k".to_owned(), "v".to_owned())].into_iter().collect(),
        first: Some(plain::catalog::Entry { name: "e".into() }),
    };
    assert_eq!(Catalog::decode(catalog.encode_to_vec().as_slice()).unwrap(), catalog);
    let greeter =
        GreeterServer { counts: [("a".to_owned(), 1)].into_iter().collect(), note: Some("n".into()) };
    assert_eq!(GreeterServer::decode(greeter.encode_to_vec().as_slice()).unwrap(), greeter);
    assert_eq!(plain::greeter_server::SERVICE_NAME, "codegen.plain.Greeter");
    let holder = Holder { self_: Some(holder::Self_OneOf::Value(holder::Self_ { s: "x".into() })) };
    assert_eq!(Holder::decode(holder.encode_to_vec().as_slice()).unwrap(), holder);
    let _ = holder::SelfOneOf { s: "y".into() };
}
