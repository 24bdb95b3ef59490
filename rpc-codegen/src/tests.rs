//! String-level tests: the generated code of each proto under `proto/`, and the errors.

use std::path::PathBuf;

use crate::{configure, method_id, Builder, Error};

/// The repository's `proto/` directory.
fn proto_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto")
}

/// A fresh output directory for one test.
fn out_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rpc-codegen-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test output dir");
    dir
}

/// What one generation gave: the warnings, and the generated files as (name, contents).
type Generated = (Vec<String>, Vec<(String, String)>);

/// Generates `protos` (relative to `proto/`) and returns (warnings, generated files by name).
fn generate(test: &str, protos: &[&str]) -> Result<Generated, Error> {
    generate_with(configure(), test, protos)
}

/// [`generate`] with a configured builder.
fn generate_with(builder: Builder, test: &str, protos: &[&str]) -> Result<Generated, Error> {
    let dir = out_dir(test);
    let paths: Vec<PathBuf> = protos.iter().map(|p| proto_dir().join(p)).collect();
    let warnings =
        builder.out_dir(&dir).emit_rerun_if_changed(false).compile_protos_report(&paths, &[proto_dir()])?;
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("read output dir")
        .map(|e| {
            let e = e.expect("dir entry");
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(e.path()).expect("read generated file"))
        })
        .collect();
    files.sort();
    let _ = std::fs::remove_dir_all(&dir);
    Ok((warnings, files))
}

/// The one generated file called `name`.
fn file<'a>(files: &'a [(String, String)], name: &str) -> &'a str {
    files
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, code)| code.as_str())
        .unwrap_or_else(|| panic!("no {name} among {:?}", files.iter().map(|f| &f.0).collect::<Vec<_>>()))
}

/// The generated code of one proto file that has a package (the file named after the package).
fn code_of(test: &str, proto: &str, package_file: &str) -> String {
    let (_, files) = generate(test, &[proto]).expect("generation succeeds");
    file(&files, package_file).to_owned()
}

/// `code` with all whitespace and trailing commas removed, for matching generated code regardless
/// of how it was formatted.
fn squash(code: &str) -> String {
    let squashed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    squashed.replace(",)", ")").replace(",}", "}").replace(",]", "]")
}

/// Asserts that `code` contains `needle`, ignoring whitespace.
#[track_caller]
fn assert_has(code: &str, needle: &str) {
    assert!(squash(code).contains(&squash(needle)), "generated code lacks `{needle}`:\n{code}");
}

/// Asserts that `code` does not contain `needle`, ignoring whitespace.
#[track_caller]
fn assert_lacks(code: &str, needle: &str) {
    assert!(!squash(code).contains(&squash(needle)), "generated code has `{needle}`:\n{code}");
}

/// Every `pub const X: MethodId = 0x..;` after a `/// Method id of `/full/name`` line, as (name, id).
fn method_id_literals(code: &str) -> Vec<(String, u32)> {
    let lines: Vec<&str> = code.lines().map(str::trim).collect();
    let mut found = Vec::new();
    for pair in lines.windows(2) {
        let Some(rest) = pair[0].strip_prefix("/// Method id of `") else { continue };
        let full = rest.split('`').next().expect("closing backtick").to_owned();
        let literal =
            pair[1].split("= 0x").nth(1).expect("hex literal").trim_end_matches(';').replace('_', "");
        found.push((full, u32::from_str_radix(&literal, 16).expect("hex")));
    }
    found
}

#[test]
fn helloworld_has_the_facade_shape() {
    let code = code_of("hello", "helloworld.proto", "helloworld.rs");
    // Messages from prost-build, services from us, in the package's file.
    assert_has(&code, "pub struct HelloRequest");
    assert_has(&code, "pub mod greeter_server { #![allow(clippy::new_ret_no_self, clippy::wrong_self_convention, clippy::should_implement_trait)] use rpc_core::codegen::*;");
    assert_has(&code, r#"pub const SERVICE_NAME: &str = "helloworld.Greeter";"#);
    let id = method_id("/helloworld.Greeter/SayHello");
    assert_has(&code, &format!("pub const SAY_HELLO: MethodId = 0x{:04x}_{:04x};", id >> 16, id & 0xffff));
    assert_has(&code, r#"pub const SAY_HELLO: &str = "/helloworld.Greeter/SayHello";"#);
    assert_has(&code, "pub trait Greeter: ::core::marker::Send + ::core::marker::Sync + 'static {");
    assert_has(&code, "fn say_hello(&self, ctx: &RequestContext, request: super::HelloRequest) -> Reply<super::HelloReply>;");
    assert_has(&code, "pub struct GreeterServer<T: Greeter> { inner: ::std::sync::Arc<T>, }");
    assert_has(&code, "impl<T: Greeter> Service for GreeterServer<T> {");
    assert_has(&code, "const NAME: &'static str = SERVICE_NAME;");
    assert_has(&code, "const METHODS: &'static [MethodDesc] = &[MethodDesc { id: SAY_HELLO, name: method_names::SAY_HELLO }];");
    assert_has(&code, "match method { SAY_HELLO => {");
    assert_has(&code, "match decode::<super::HelloRequest>(body) {");
    assert_has(&code, "::core::result::Result::Ok(request) => {");
    assert_has(&code, "out.reply(<T as Greeter>::say_hello(&self.inner, ctx, request))");
    assert_has(&code, "::core::result::Result::Err(status) => out.error(status)");
    assert_has(&code, "_ => out.error(Status::method_not_served_by(method, SERVICE_NAME))");
    // Debug without `T: Debug` (a user's crate may deny `missing_debug_implementations`).
    assert_has(&code, "impl<T: Greeter> ::core::fmt::Debug for GreeterServer<T> {");
    assert_has(
        &code,
        r#"f.debug_struct("GreeterServer").field("service", &SERVICE_NAME).finish_non_exhaustive()"#,
    );
    // The client module.
    assert_has(&code, "pub mod greeter_client {");
    assert_has(&code, "pub struct GreeterClient<C = Client> { inner: C, }");
    assert_has(&code, "impl GreeterClient<Client> {");
    assert_has(
        &code,
        "pub fn connect(addr: impl ::std::net::ToSocketAddrs) -> ::core::result::Result<Self, Status>",
    );
    assert_has(&code, "pub fn connect_with(addr: impl ::std::net::ToSocketAddrs, config: &ClientConfig)");
    assert_has(&code, "pub fn say_hello(&self, request: impl IntoRequest<super::HelloRequest>) -> ::core::result::Result<super::HelloReply, Status> { self.inner.unary(SAY_HELLO, IntoRequest::message(&request), &IntoRequest::options(&request, &<CallOptions as ::core::default::Default>::default())) }");
    assert_has(&code, "pub fn say_hello_with(&self, request: impl IntoRequest<super::HelloRequest>, options: &CallOptions) -> ::core::result::Result<super::HelloReply, Status> { self.inner.unary(SAY_HELLO, IntoRequest::message(&request), &IntoRequest::options(&request, options)) }");
    assert_has(&code, "pub fn say_hello_async(&self, request: impl IntoRequest<super::HelloRequest>) -> ResponseFuture<'_, super::HelloReply> { self.inner.unary_async(SAY_HELLO, IntoRequest::message(&request), &IntoRequest::options(&request, &<CallOptions as ::core::default::Default>::default())) }");
    assert_has(&code, "impl ::core::convert::From<Client> for GreeterClient<Client>");
    // The same stub over the shareable handle.
    assert_has(&code, "impl GreeterClient<Channel> {");
    // Both stubs take the request the same way (`IntoRequest`: by value or by reference).
    assert_has(&code, "pub fn say_hello(&self, request: impl IntoRequest<super::HelloRequest>) -> UnaryCall<super::HelloReply> { self.inner.unary(SAY_HELLO, request, &<CallOptions as ::core::default::Default>::default()) }");
    assert_has(&code, "pub fn say_hello_with(&self, request: impl IntoRequest<super::HelloRequest>, options: &CallOptions) -> UnaryCall<super::HelloReply> { self.inner.unary(SAY_HELLO, request, options) }");
    assert_has(&code, "impl ::core::convert::From<Channel> for GreeterClient<Channel>");
    // `Clone` only over a session that is shared (the `Channel`), with the compiler's hint otherwise.
    assert_has(&code, "impl<C: SharedSession> ::core::clone::Clone for GreeterClient<C>");
    assert!(!code.contains("derive(Debug, Clone"), "the stub derives no Clone: {code}");
    // Proto comments became docs of the trait, its method and the stub.
    assert_has(&code, "/// Says hello.");
    assert_has(&code, "/// Answers a greeting with a greeting that names the sender.");
    // Nothing but the facade and `super::` is imported.
    let imports: Vec<&str> = code.lines().map(str::trim).filter(|l| l.starts_with("use ")).collect();
    assert_eq!(imports, ["use rpc_core::codegen::*;", "use rpc_core::codegen::*;"]);
    // ... and the client module spells no facade item with its full path (`unused_qualifications`).
    let client = &code[code.find("pub mod greeter_client").expect("client module")..];
    assert_eq!(client.matches("rpc_core::codegen::").count(), 1, "{client}");
    assert_has(client, "static __RPC_METHOD_NAMES: &[MethodDesc] = &[MethodDesc { id: SAY_HELLO,");
    assert_has(client, "ONCE.call_once(|| register_method_names(__RPC_METHOD_NAMES));");
}

#[test]
fn method_id_literals_equal_the_hash_of_their_names() {
    let (_, files) = generate(
        "ids",
        &[
            "helloworld.proto",
            "codegen/keywords.proto",
            "codegen/stub_names.proto",
            "codegen/no_package.proto",
        ],
    )
    .expect("generation succeeds");
    let mut checked = 0;
    for (_, code) in &files {
        for (full, id) in method_id_literals(code) {
            assert_eq!(id, method_id(&full), "{full}");
            assert_ne!(id, 0, "{full}");
            checked += 1;
        }
    }
    // helloworld 1 + keywords 9 + stub_names 12, each in the server and the client module, +
    // no_package 1 twice.
    assert_eq!(checked, 2 * (1 + 9 + 12 + 1));
}

#[test]
fn keywords_are_escaped_everywhere() {
    let code = code_of("keywords", "codegen/keywords.proto", "codegen.keywords.rs");
    // Service `match`: module, trait and adapter.
    assert_has(&code, "pub mod match_server {");
    assert_has(&code, "pub trait Match:");
    assert_has(&code, "pub struct MatchServer<T: Match>");
    for (method, input) in [
        ("self_", "super::Self_"),
        ("super_", "super::Self_"),
        ("crate_", "super::Crate"),
        ("r#type", "super::Type"),
        ("r#gen", "super::Gen"),
        ("r#async", "super::Gen"),
        ("r#match", "super::Type"),
    ] {
        assert_has(
            &code,
            &format!("fn {method}(&self, ctx: &RequestContext, request: {input}) -> Reply<{input}>;"),
        );
        assert_has(&code, &format!("out.reply(<T as Match>::{method}(&self.inner, ctx, request))"));
        assert_has(&code, &format!("pub fn {method}(&self, request: impl IntoRequest<{input}>)"));
    }
    for konst in ["SELF", "SUPER", "CRATE", "TYPE", "GEN", "ASYNC", "MATCH"] {
        assert_has(&code, &format!("pub const {konst}: MethodId = 0x"));
    }
    // Variants are built from the plain name, then escaped.
    assert_has(
        &code,
        "pub fn type_with(&self, request: impl IntoRequest<super::Type>, options: &CallOptions)",
    );
    assert_has(&code, "pub fn self_async(&self, request: impl IntoRequest<super::Self_>)");
    assert_has(&code, "pub fn gen_with(");
    // Service `Self`: the trait is `Self_` (not a raw identifier), the adapter `SelfServer`.
    assert_has(&code, "pub mod self_server {");
    assert_has(&code, "pub trait Self_:");
    assert_has(&code, "impl<T: Self_> Service for SelfServer<T>");
    assert_has(&code, "pub struct SelfClient");
    // Service `async` with rpc `await`.
    assert_has(&code, "pub mod async_server {");
    assert_has(&code, "fn r#await(&self, ctx: &RequestContext, request: super::Gen) -> Reply<super::Gen>;");
    assert_has(&code, "pub const AWAIT: MethodId");
}

#[test]
fn rpcs_named_like_stub_methods_win_their_names() {
    let code = code_of("stub_names", "codegen/stub_names.proto", "codegen.stub_names.rs");
    // The RPCs keep their own names...
    for rpc in
        ["connect", "connect_with", "new", "close", "clone", "client", "into_client", "ping", "ping_with"]
    {
        assert_has(
            &code,
            &format!(
                "pub fn {rpc}(&self, request: impl IntoRequest<super::Req>) -> ::core::result::Result<super::Resp, Status>"
            ),
        );
    }
    // ...the variants that collide move aside...
    assert_has(
        &code,
        "pub fn connect_with_(&self, request: impl IntoRequest<super::Req>, options: &CallOptions)",
    );
    assert_has(
        &code,
        "pub fn ping_with_(&self, request: impl IntoRequest<super::Req>, options: &CallOptions)",
    );
    assert_has(
        &code,
        "pub fn ping_async_(&self, request: impl IntoRequest<super::Req>) -> ResponseFuture<'_, super::Resp>",
    );
    assert_has(
        &code,
        "pub fn ping_with_with(&self, request: impl IntoRequest<super::Req>, options: &CallOptions)",
    );
    // ...and so do the stub's own methods.
    assert_has(&code, "pub fn connect_(addr: impl ::std::net::ToSocketAddrs)");
    assert_has(&code, "pub fn connect_with__(addr: impl ::std::net::ToSocketAddrs, config: &ClientConfig)");
    assert_has(&code, "pub fn new_(client: Client) -> Self");
    assert_has(&code, "pub fn client_(&self) -> &Client");
    assert_has(&code, "pub fn into_client_(self) -> Client");
    // `ServiceName` takes the constant `SERVICE_NAME`; the service's name moves to `SERVICE_NAME_`.
    assert_has(&code, "pub const SERVICE_NAME: MethodId = 0x");
    assert_has(&code, r#"pub const SERVICE_NAME_: &str = "codegen.stub_names.Session";"#);
    assert_has(&code, "const NAME: &'static str = SERVICE_NAME_;");
    // A service named like its RPC.
    assert_has(&code, "pub trait Echo:");
    assert_has(&code, "fn echo(&self, ctx: &RequestContext, request: super::Req) -> Reply<super::Resp>;");
    assert_has(&code, "pub const ECHO: MethodId");
    assert_has(&code, "pub fn echo(&self, request: impl IntoRequest<super::Req>)");
}

#[test]
fn user_types_named_like_std_and_facade_items() {
    let code = code_of("shadowing", "codegen/shadowing.proto", "codegen.shadowing.rs");
    // Messages are always reached through `super::`; std items through full paths.
    assert_has(&code, "fn get(&self, ctx: &RequestContext, request: super::Result) -> rpc_core::codegen::Reply<super::Option>;");
    // The trait `Reply` shadows the facade's `Reply` in its module: the facade's is spelled out.
    assert_has(&code, "pub trait Reply: ::core::marker::Send");
    // The trait `Service` likewise.
    assert_has(&code, "impl<T: Service> rpc_core::codegen::Service for ServiceServer<T>");
    assert_has(
        &code,
        "fn call(&self, ctx: &RequestContext, request: super::Status) -> Reply<super::Stream>;",
    );
    assert_has(&code, "fn pass(&self, ctx: &RequestContext, request: super::Send) -> Reply<super::Sync>;");
    assert_has(&code, "-> ::core::result::Result<super::String, Status>");
    assert_has(&code, "fn unbox(&self, ctx: &RequestContext, request: super::Box) -> Reply<super::Box>;");
    // The traits `IntoRequest` and `SharedSession` live in the server modules: the client modules
    // spell the facade's items bare (a full path would trip `unused_qualifications`).
    assert_has(&code, "impl<C: SharedSession> ::core::clone::Clone for SharedSessionClient<C>");
    assert_has(
        &code,
        "pub fn get(&self, request: impl IntoRequest<super::Result>) -> UnaryCall<super::Result>",
    );
    for client in code.split("pub mod ").filter(|m| m.contains("_client {")) {
        assert_eq!(client.matches("rpc_core::codegen::").count(), 1, "a qualified facade item:\n{client}");
    }
    // A service named `T`: the adapter's type parameter steps aside.
    assert_has(&code, "pub struct TServer<S: T>");
    assert_has(&code, "out.reply(<S as T>::get(&self.inner, ctx, request))");
    // Every `Result` the service code names is core's.
    let services = &code[code.find("pub mod reply_server").expect("service modules")..];
    for (at, _) in services.match_indices("Result<") {
        assert!(services[..at].ends_with("::core::result::"), "a bare Result at {at}:\n{services}");
    }
}

#[test]
fn nested_packages_and_imports_resolve_relative_paths() {
    let (_, files) = generate("deep", &["codegen/deep/inner/v1.proto"]).expect("generation succeeds");
    let v1 = file(&files, "codegen.deep.inner.v1.rs");
    // From codegen.deep.inner.v1.pricing_server up to codegen, then down to common / deep.
    assert_has(v1, "fn quote(&self, ctx: &RequestContext, request: super::super::super::super::common::Money) -> Reply<super::Quote>;");
    assert_has(
        v1,
        "fn total(&self, ctx: &RequestContext, request: super::Quote) -> Reply<super::super::super::Outer>;",
    );
    assert_has(v1, r#"pub const SERVICE_NAME: &str = "codegen.deep.inner.v1.Pricing";"#);
    // The imported files are generated too (each into its package's file).
    let deep = file(&files, "codegen.deep.rs");
    assert_has(
        deep,
        "fn sum(&self, ctx: &RequestContext, request: super::super::common::Page) -> Reply<super::Outer>;",
    );
    assert_has(file(&files, "codegen.common.rs"), "pub struct Money");
}

#[test]
fn a_file_without_package() {
    let (_, files) = generate("no_package", &["codegen/no_package.proto"]).expect("generation succeeds");
    let code = file(&files, "_.rs");
    assert_has(code, r#"pub const SERVICE_NAME: &str = "Pinger";"#);
    assert_has(code, r#"pub const PING: &str = "/Pinger/Ping";"#);
    let id = method_id("/Pinger/Ping");
    assert_has(code, &format!("pub const PING: MethodId = 0x{:04x}_{:04x};", id >> 16, id & 0xffff));
    assert_has(code, "fn ping(&self, ctx: &RequestContext, request: super::Ping) -> Reply<super::Ping>;");
}

#[test]
fn a_file_holding_only_a_service() {
    let (_, files) = generate("only_service", &["codegen/only_service.proto"]).expect("generation succeeds");
    let code = file(&files, "codegen.only_service.rs");
    assert_lacks(code, "::prost::Message");
    assert_has(code, "pub trait Exchange");
    assert_has(code, "fn convert(&self, ctx: &RequestContext, request: super::super::common::Money) -> Reply<super::super::common::Money>;");
}

#[test]
fn well_known_types_in_signatures() {
    let code = code_of("well_known", "codegen/well_known.proto", "codegen.well_known.rs");
    assert_has(&code, "fn now(&self, ctx: &RequestContext, request: ()) -> Reply<::prost_types::Timestamp>;");
    assert_has(
        &code,
        "fn reset(&self, ctx: &RequestContext, request: ::prost_types::Timestamp) -> Reply<()>;",
    );
    assert_has(
        &code,
        "fn renew(&self, ctx: &RequestContext, request: ::prost_types::Duration) -> Reply<super::Lease>;",
    );
    assert_has(&code, "match decode::<()>(body)");
    assert_has(
        &code,
        "pub fn now(&self, request: impl IntoRequest<()>) -> ::core::result::Result<::prost_types::Timestamp, Status>",
    );
    // google.protobuf itself is not generated (prost_types has it).
    let (_, files) =
        generate("well_known_files", &["codegen/well_known.proto"]).expect("generation succeeds");
    assert_eq!(files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(), ["codegen.well_known.rs"]);
}

#[test]
fn shapes_optional_empty_and_several_services() {
    let code = code_of("shapes", "codegen/shapes.proto", "codegen.shapes.rs");
    assert_has(&code, "pub nickname: ::core::option::Option<::prost::alloc::string::String>,");
    assert_has(&code, "pub struct Empty {}");
    for (module, name) in [("profiles", "Profiles"), ("health", "Health"), ("counter", "Counter")] {
        assert_has(&code, &format!("pub mod {module}_server {{"));
        assert_has(&code, &format!("pub mod {module}_client {{"));
        assert_has(&code, &format!("pub trait {name}:"));
    }
    assert_has(&code, "fn check(&self, ctx: &RequestContext, request: super::Empty) -> Reply<super::Empty>;");
}

#[test]
fn all_four_shapes_are_generated_without_warnings() {
    let (warnings, files) = generate("streaming", &["codegen/streaming.proto"]).expect("generation succeeds");
    assert!(warnings.is_empty(), "{warnings:#?}");
    let code = file(&files, "codegen.streaming.rs");
    assert_has(code, "fn get(&self, ctx: &RequestContext, request: super::Item) -> Reply<super::Item>;");
    // Server streams: a trait method taking the sink, the adapter opening the stream, a stub
    // returning the messages.
    assert_has(
        code,
        "fn subscribe(&self, ctx: &RequestContext, request: super::Item, sink: StreamSink<super::Item>);",
    );
    assert_has(
        code,
        "fn drink(&self, ctx: &RequestContext, request: super::Item, sink: StreamSink<super::Item>);",
    );
    assert_has(code, "let (sink, reply) = ctx.stream::<super::Item>();");
    assert_has(code, "-> ::core::result::Result<Streaming<'_, super::Item>, Status>");
    assert_has(code, "self.inner.server_stream(DRINK, IntoRequest::message(&request), &IntoRequest::options(&request, options))");
    assert_has(code, "MethodDesc { id: DRINK, name: method_names::DRINK }");
    // Client streams: the reader and a responder; a stub returning the sender.
    assert_has(
        code,
        "fn upload(&self, ctx: &RequestContext, requests: RequestStream<super::Item>, responder: Responder<super::Item>);",
    );
    assert_has(code, "let requests = ctx.requests::<super::Item>();");
    assert_has(code, "ClientStreaming<'_, super::Item, super::Item>,");
    assert_has(code, "pub fn upload(&self) -> ClientStreamCall<super::Item, super::Item> {");
    assert_has(code, "MethodDesc { id: UPLOAD, name: method_names::UPLOAD }");
    // Bidirectional: both.
    assert_has(
        code,
        "fn chat(&self, ctx: &RequestContext, requests: RequestStream<super::Item>, sink: StreamSink<super::Item>);",
    );
    assert_has(code, "BidiStreaming<'_, super::Item, super::Item>,");
    assert_has(code, ".bidi_stream(CHAT, options)");
}

#[test]
fn comments_have_no_rust_code_blocks() {
    let code = code_of("comments", "codegen/comments.proto", "codegen.comments.rs");
    let mut in_block = false;
    let mut blocks = 0;
    for line in code.lines().map(str::trim).filter_map(|l| l.strip_prefix("///")) {
        let fence = line.trim_start();
        if fence.starts_with("```") || fence.starts_with("~~~") {
            if !in_block {
                assert!(fence.ends_with("text"), "a code block opens without `text`: {line:?}\n{code}");
                blocks += 1;
            }
            in_block = !in_block;
        }
    }
    assert!(!in_block, "a code block is left open:\n{code}");
    // Message (2), two fields, service (indented, twice: trait and stub), RPC (trait and stub), enum.
    assert_eq!(blocks, 2 + 2 + 2 + 2 + 1, "{code}");
    assert_has(&code, r"/// and a list\<string> and \<b>bold\</b> text");
    assert_has(&code, "`Vec<u8>` in code");
    assert_has(&code, r"/// A trailing comment with \<T>.");
    // Links to proto names are plain text (rustdoc would look for Rust items of those names);
    // links to URLs stay links.
    assert_has(
        &code,
        "/// Documented (`codegen.comments.Documented`) message, `Level`, `Level` (`codegen.comments.Level`),",
    );
    assert_has(
        &code,
        "/// the service (`Commented`) and Run (`codegen.comments.Commented.Run`); real links stay links:",
    );
    assert_has(&code, "/// [the docs](<https://example.com/docs>) and [a section](#linked).");
    assert_has(&code, "/// See Documented.field (`codegen.comments.Documented.field`).");
}

#[test]
fn server_or_client_can_be_left_out() {
    let (_, files) = generate_with(configure().build_client(false), "no_client", &["helloworld.proto"])
        .expect("generation succeeds");
    let code = file(&files, "helloworld.rs");
    assert_has(code, "pub mod greeter_server");
    assert_lacks(code, "greeter_client");
    let (_, files) = generate_with(configure().build_server(false), "no_server", &["helloworld.proto"])
        .expect("generation succeeds");
    let code = file(&files, "helloworld.rs");
    assert_has(code, "pub mod greeter_client");
    assert_lacks(code, "greeter_server");
    assert_has(code, "pub const SAY_HELLO: MethodId");
}

#[test]
fn prost_options_pass_through() {
    let builder = configure()
        .type_attribute(".codegen.deep.Outer", "#[doc(alias = \"cash\")]")
        .field_attribute(".codegen.deep.Outer.Inner.note", "#[doc(alias = \"memo\")]")
        .extern_path(".codegen.common", "::other_crate::common")
        .include_file("_includes.rs");
    let (_, files) = generate_with(builder, "prost_options", &["codegen/deep/inner/v1.proto"])
        .expect("generation succeeds");
    let deep = file(&files, "codegen.deep.rs");
    assert_has(deep, "#[doc(alias = \"cash\")] #[derive(");
    assert_has(deep, "#[prost(string, tag = \"1\")] #[doc(alias = \"memo\")] pub note:");
    // An extern type is used as is, by the messages and by the service code.
    assert_has(deep, "pub total: ::core::option::Option<::other_crate::common::Money>");
    let v1 = file(&files, "codegen.deep.inner.v1.rs");
    assert_has(v1, "fn quote(&self, ctx: &RequestContext, request: ::other_crate::common::Money) -> Reply<super::Quote>;");
    assert!(files.iter().all(|f| f.0 != "codegen.common.rs"), "extern package generated anyway");
    assert_has(file(&files, "_includes.rs"), "pub mod v1 {");
}

#[test]
fn a_syntax_error_names_file_line_column_and_reason() {
    let err = generate("syntax_error", &["codegen/errors/syntax_error.proto"]).expect_err("must fail");
    let Error::Proto { path, line, column, reason } = &err else { panic!("wrong error: {err}") };
    assert!(path.ends_with("proto/codegen/errors/syntax_error.proto"), "{}", path.display());
    assert_eq!((*line, *column), (7, 1));
    assert_eq!(reason, "expected ';' or '[', but found '}'");
    // Debug (what `fn main() -> Result<..>` prints in cargo's output) is the same readable text.
    let text = format!("{err:?}");
    assert_eq!(text, format!("{err}"));
    assert!(
        text.ends_with("proto/codegen/errors/syntax_error.proto:7:1: expected ';' or '[', but found '}'"),
        "{text}"
    );
}

#[test]
fn a_missing_import_names_the_import_line() {
    let err = generate("missing_import", &["codegen/errors/missing_import.proto"]).expect_err("must fail");
    let text = err.to_string();
    assert!(
        text.ends_with(
            "proto/codegen/errors/missing_import.proto:5:1: import 'codegen/does_not_exist.proto' not found"
        ),
        "{text}"
    );
}

#[test]
fn an_unknown_type_names_its_place() {
    let err = generate("unknown_type", &["codegen/errors/unknown_type.proto"]).expect_err("must fail");
    let Error::Proto { path, line, column, reason } = &err else { panic!("wrong error: {err}") };
    assert!(path.ends_with("proto/codegen/errors/unknown_type.proto"), "{}", path.display());
    assert_eq!((*line, *column), (6, 3), "{err}");
    assert!(reason.contains("Missing"), "{reason}");
}

#[test]
fn a_file_outside_the_include_paths_is_refused() {
    let err = configure()
        .out_dir(out_dir("not_included"))
        .emit_rerun_if_changed(false)
        .compile_protos(&["/nonexistent/x.proto"], &[proto_dir()])
        .expect_err("must fail");
    assert!(matches!(err, Error::ProtoFile { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/x.proto"), "{err}");
}

#[test]
fn a_method_id_collision_names_both_methods() {
    let err = generate("collision", &["codegen/errors/collision.proto"]).expect_err("must fail");
    let Error::MethodIdCollision { id, first, second } = &err else { panic!("wrong error: {err}") };
    assert_eq!(*id, 0x94b7_7cc4);
    assert_eq!(first, "/codegen.errors.Collide/LcyVTwhV");
    assert_eq!(second, "/codegen.errors.Collide/LPGSDzwF");
    assert_eq!(method_id(first), method_id(second));
    let text = err.to_string();
    assert!(
        text.contains(first.as_str()) && text.contains(second.as_str()) && text.contains("0x94b77cc4"),
        "{text}"
    );
}

#[test]
fn a_method_id_of_zero_is_refused() {
    let err = generate("zero_id", &["codegen/errors/zero_id.proto"]).expect_err("must fail");
    let Error::ReservedMethodId { method, .. } = &err else { panic!("wrong error: {err}") };
    assert_eq!(method, "/codegen.errors.Zero/M24046987f");
    assert_eq!(method_id(method), 0);
}

#[test]
fn rpcs_differing_only_in_case_are_refused() {
    let err = generate("name_clash", &["codegen/errors/name_clash.proto"]).expect_err("must fail");
    let Error::NameClash { rust, first, second } = &err else { panic!("wrong error: {err}") };
    assert_eq!(rust, "say_hello");
    assert_eq!(first, "/codegen.errors.Clash/SayHello");
    assert_eq!(second, "/codegen.errors.Clash/say_hello");
}

#[test]
fn nothing_is_written_when_a_check_fails() {
    let dir = out_dir("nothing_written");
    let result = configure()
        .out_dir(&dir)
        .emit_rerun_if_changed(false)
        .compile_protos(&[proto_dir().join("codegen/errors/collision.proto")], &[proto_dir()]);
    assert!(result.is_err());
    assert_eq!(std::fs::read_dir(&dir).expect("read dir").count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_service_module_named_like_a_message_module_is_refused() {
    let err = generate("module_clash", &["codegen/errors/module_clash.proto"]).expect_err("must fail");
    let Error::NameClash { rust, first, second } = &err else { panic!("wrong error: {err}") };
    assert_eq!(rust, "greeter_server");
    assert_eq!(first, "message codegen.errors.GreeterServer");
    assert_eq!(second, "service codegen.errors.Greeter");
}

#[test]
fn compile_fds_generates_what_compile_protos_does() {
    let (_, from_protos) = generate("fds_protos", &["helloworld.proto"]).expect("generation succeeds");
    let fds = protox::compile([proto_dir().join("helloworld.proto")], [proto_dir()]).expect("parse");
    let dir = out_dir("fds");
    configure().out_dir(&dir).compile_fds(fds).expect("generation succeeds");
    let from_fds = std::fs::read_to_string(dir.join("helloworld.rs")).expect("generated file");
    assert_eq!(from_fds, file(&from_protos, "helloworld.rs"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_file_descriptor_set_is_written_on_request() {
    use prost::Message as _;
    let dir = out_dir("fds_path");
    let path = dir.join("descriptors.bin");
    configure()
        .out_dir(&dir)
        .emit_rerun_if_changed(false)
        .file_descriptor_set_path(&path)
        .compile_protos(&[proto_dir().join("codegen/well_known.proto")], &[proto_dir()])
        .expect("generation succeeds");
    let bytes = std::fs::read(&path).expect("descriptor set written");
    let fds = prost_types::FileDescriptorSet::decode(bytes.as_slice()).expect("a valid descriptor set");
    let names: Vec<&str> = fds.file.iter().map(|f| f.name()).collect();
    assert!(names.contains(&"codegen/well_known.proto"), "{names:?}");
    assert!(names.contains(&"google/protobuf/timestamp.proto"), "imports included: {names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `contents` as `name` into a fresh include directory and generates it.
fn generate_text(test: &str, name: &str, contents: &str) -> Result<Generated, Error> {
    generate_texts(test, &[(name, contents)])
}

/// Writes `files` (name, contents) into a fresh include directory and generates the first.
fn generate_texts(test: &str, files: &[(&str, &str)]) -> Result<Generated, Error> {
    generate_texts_with(configure(), test, files)
}

/// [`generate_texts`] with a configured builder.
fn generate_texts_with(builder: Builder, test: &str, files: &[(&str, &str)]) -> Result<Generated, Error> {
    let include = out_dir(&format!("{test}-proto"));
    for (name, contents) in files {
        std::fs::write(include.join(name), contents).expect("write proto");
    }
    let dir = out_dir(test);
    let result = builder
        .out_dir(&dir)
        .emit_rerun_if_changed(false)
        .compile_protos_report(&[include.join(files[0].0)], std::slice::from_ref(&include));
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("read output dir")
        .map(|e| {
            let e = e.expect("dir entry");
            (e.file_name().to_string_lossy().into_owned(), std::fs::read_to_string(e.path()).expect("read"))
        })
        .collect();
    files.sort();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&include);
    result.map(|warnings| (warnings, files))
}

#[test]
fn names_made_of_underscores_are_refused_at_their_place() {
    // Protobuf accepts these identifiers; none has a Rust form (it would be empty), and
    // prost-build used to panic inside the build script on the unparsable output.
    let cases = [
        ("service _ {\n  rpc Go(M) returns (M);\n}\n", "service `u._`", (4, 1)),
        ("service S {\n  rpc __(M) returns (M);\n}\n", "RPC `u.S.__`", (5, 3)),
        ("message N {\n  int32 _ = 1;\n}\n", "field `u.N._`", (5, 3)),
        ("message N {\n  message _ {}\n}\n", "message `u.N._`", (5, 3)),
        ("enum E {\n  E_ZERO = 0;\n  _ = 1;\n}\n", "enum value `u.E._`", (6, 3)),
        ("message N {\n  oneof __ {\n    int32 a = 1;\n  }\n}\n", "oneof `u.N.__`", (5, 3)),
    ];
    let package = "syntax = \"proto3\";\npackage p._.q;\nmessage M {}\n";
    let err = generate_text("underscore_package", "p.proto", package).expect_err("package p._.q");
    assert_eq!(
        err.to_string().rsplit_once("p.proto:").map(|(_, rest)| rest.to_owned()).as_deref(),
        Some("2:1: package `p._.q` has no letter or digit, so it has no Rust name; rename it"),
        "{err}"
    );
    for (i, (body, what, (line, column))) in cases.into_iter().enumerate() {
        let text = format!("syntax = \"proto3\";\npackage u;\nmessage M {{}}\n{body}");
        let err = generate_text(&format!("underscores{i}"), "u.proto", &text).expect_err(body);
        let Error::Proto { path, line: l, column: c, reason } = &err else {
            panic!("{body}: wrong error {err}")
        };
        assert!(path.ends_with("u.proto"), "{}", path.display());
        assert_eq!(
            reason,
            &format!("{what} has no letter or digit, so it has no Rust name; rename it"),
            "{body}"
        );
        assert_eq!((*l, *c), (line, column), "{body}: {err}");
    }
}

#[test]
fn a_carriage_return_inside_a_comment_does_not_break_the_generated_file() {
    // A lone CR (an old Mac line ending, or pasted text) inside `//` comments of a service, an
    // RPC and a message: prost-build used to panic on the unparsable doc comment.
    let text = "syntax = \"proto3\";\npackage cr;\n// Leading\rcomment with unicode \u{e9}\u{2014}\u{1f600} and */.\n\
                message M {\n  string a = 1; // trailing\rfield comment\n}\n// The\rservice.\nservice S {\n  \
                // The\rRPC.\n  rpc Go(M) returns (M);\n}\n";
    let (_, files) = generate_text("carriage_return", "cr.proto", text).expect("generation succeeds");
    let code = file(&files, "cr.rs");
    assert!(!code.contains('\r'), "{code:?}");
    assert_has(code, "/// Leading comment with unicode \u{e9}\u{2014}\u{1f600} and */.");
    assert_has(code, "/// The service.");
    assert_has(code, "/// The RPC.");
    assert_has(code, "fn go(&self, ctx: &RequestContext, request: super::M) -> Reply<super::M>;");
}

#[test]
fn an_import_cycle_is_refused_naming_the_cycle() {
    let one = "syntax = \"proto3\";\npackage c;\nimport \"two.proto\";\nmessage A {}\n";
    let two = "syntax = \"proto3\";\npackage c;\nimport \"one.proto\";\nmessage B {}\n";
    let err = generate_texts("cycle", &[("one.proto", one), ("two.proto", two)]).expect_err("a cycle");
    assert!(matches!(err, Error::ProtoFile { .. }), "{err:?}");
    assert_eq!(err.to_string(), "one.proto: import cycle detected: one.proto -> two.proto -> one.proto");
}

#[test]
fn empty_files_do_not_fail() {
    // prost-build writes no `<package>.rs` for them (an `include_proto!` of one fails to compile).
    for (i, text) in ["", "syntax = \"proto3\";\n", "syntax = \"proto3\";\npackage e;\n// only a comment\n"]
        .into_iter()
        .enumerate()
    {
        let (warnings, _) = generate_text(&format!("empty{i}"), "e.proto", text).expect(text);
        assert!(warnings.is_empty(), "{warnings:?}");
    }
}

#[test]
fn an_attribute_that_does_not_parse_is_an_error_not_a_panic() {
    let builder = configure().type_attribute(".helloworld.HelloRequest", "#[derive(");
    let err = generate_with(builder, "bad_attribute", &["helloworld.proto"]).expect_err("must fail");
    let Error::Generate { reason } = &err else { panic!("wrong error: {err}") };
    assert!(!reason.is_empty());
    assert!(err.to_string().starts_with("generating Rust code failed: "), "{err}");
}

/// The protos of the module-collision set, by their deepest files (the others are imported).
const COLLIDE: &[&str] =
    &["codegen/collide/shop/v1.proto", "codegen/collide/type/v2.proto", "codegen/collide/deep/er/node.proto"];

/// Asserts the renamed modules of the collision set in `files`.
#[track_caller]
fn assert_collide_renamed(files: &[(String, String)]) {
    let top = file(files, "codegen.collide.rs");
    // The message keeps its name; its module moves aside; the package's module keeps its name.
    assert_has(top, "pub struct Shop {");
    assert_has(top, "/// Nested message and enum types in `Shop`. pub mod shop_ {");
    assert_has(top, "pub items: ::prost::alloc::vec::Vec<shop_::Item>");
    assert_has(top, r#"#[prost(enumeration = "shop_::Kind", tag = "2")] pub kind: i32"#);
    assert_has(
        top,
        r#"#[prost(oneof = "shop_::Owner", tags = "3, 4")] pub owner: ::core::option::Option<shop_::Owner>"#,
    );
    assert_has(top, "pub listed: ::core::option::Option<shop::Item>");
    // `r#type` becomes `type_` (a raw identifier's name plus the underscore).
    assert_has(top, "pub struct Type { #[prost(message, optional, tag = \"1\")] pub tag: ::core::option::Option<type_::Tag>, }");
    assert_has(top, "pub mod type_ {");
    // RPC signatures go through the renamed modules too.
    assert_has(
        top,
        "fn stock(&self, ctx: &RequestContext, request: super::shop_::Item) -> Reply<super::Shop>;",
    );
    assert_has(
        top,
        "fn label(&self, ctx: &RequestContext, request: super::type_::Tag) -> Reply<super::Type>;",
    );
    assert_has(
        top,
        "fn list(&self, ctx: &RequestContext, request: super::shop::Item) -> Reply<super::shop_::Item>;",
    );
    assert_has(
        top,
        "pub fn stock(&self, request: impl IntoRequest<super::shop_::Item>) -> ::core::result::Result<super::Shop, Status>",
    );
    // From the packages below, into the renamed module and into their own parent package.
    let v1 = file(files, "codegen.collide.shop.v1.rs");
    assert_has(v1, "pub nested: ::core::option::Option<super::super::shop_::Item>");
    assert_has(v1, "pub listed: ::core::option::Option<super::Item>");
    assert_has(v1, r#"#[prost(enumeration = "super::super::shop_::Kind", tag = "3")]"#);
    assert_has(v1, r#"#[prost(enumeration = "super::Kind", tag = "4")]"#);
    assert_has(v1, "fn place(&self, ctx: &RequestContext, request: super::super::super::shop_::Item) -> Reply<super::Order>;");
    let v2 = file(files, "codegen.collide.r#type.v2.rs");
    assert_has(v2, "pub nested: ::core::option::Option<super::super::type_::Tag>");
    // Three parents deep.
    let er = file(files, "codegen.collide.deep.er.rs");
    assert_has(er, "pub leaf: ::core::option::Option<node_::Leaf>");
    assert_has(er, "pub mod node_ {");
    assert_has(
        er,
        "fn grow(&self, ctx: &RequestContext, request: super::node_::Leaf) -> Reply<super::Node>;",
    );
    let node = file(files, "codegen.collide.deep.er.node.rs");
    assert_has(node, "pub nested: ::core::option::Option<super::node_::Leaf>");
    assert_has(
        node,
        "fn fork(&self, ctx: &RequestContext, request: super::super::node_::Leaf) -> Reply<super::Leaf>;",
    );
    for (name, code) in files {
        assert!(
            !code.to_lowercase().contains("rpccodegenmoved"),
            "a stand-in name is left in {name}:\n{code}"
        );
        if name != "_includes.rs" {
            // Only the include file has the package modules.
            assert_lacks(code, "pub mod shop {");
            assert_lacks(code, "pub mod node {");
        }
    }
}

#[test]
fn message_modules_named_like_packages_get_a_trailing_underscore() {
    let (warnings, files) = generate("collide", COLLIDE).expect("generation succeeds");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_collide_renamed(&files);
}

#[test]
fn the_rename_is_the_same_with_an_include_file() {
    let (_, files) = generate_with(configure().include_file("_includes.rs"), "collide_include", COLLIDE)
        .expect("generation succeeds");
    assert_collide_renamed(&files);
    let includes = file(&files, "_includes.rs");
    // The package modules, as prost-build nests them; the message modules live in the files.
    assert_has(
        includes,
        r#"pub mod collide { include!("codegen.collide.rs"); pub mod deep { pub mod er { include!("codegen.collide.deep.er.rs"); pub mod node { include!("codegen.collide.deep.er.node.rs"); } } }"#,
    );
    assert_has(
        includes,
        r#"pub mod shop { include!("codegen.collide.shop.rs"); pub mod v1 { include!("codegen.collide.shop.v1.rs"); } }"#,
    );
}

#[test]
fn a_message_module_at_the_root_is_renamed_too() {
    let root = "syntax = \"proto3\";\nimport \"foo.proto\";\nmessage Foo {\n  message Inner {}\n  Inner inner = 1;\n  foo.Inner other = 2;\n}\n";
    let foo = "syntax = \"proto3\";\npackage foo;\nimport \"root.proto\";\nmessage Inner {\n  .Foo.Inner nested = 1;\n}\n";
    let foo = foo.replace("import \"root.proto\";\n", "");
    let foo = foo.replace(".Foo.Inner nested = 1;", "string s = 1;");
    let (_, files) = generate_texts("collide_root", &[("root.proto", root), ("foo.proto", &foo)])
        .expect("generation succeeds");
    let code = file(&files, "_.rs");
    assert_has(code, "pub mod foo_ {");
    assert_has(code, "pub inner: ::core::option::Option<foo_::Inner>");
    assert_has(code, "pub other: ::core::option::Option<foo::Inner>");
}

#[test]
fn path_options_reach_a_renamed_message() {
    let builder = configure()
        .type_attribute(".codegen.collide.Shop", "#[doc(alias = \"store\")]")
        .type_attribute("Shop.Item", "#[doc(alias = \"article\")]")
        .field_attribute(".codegen.collide.Shop.Item.name", "#[doc(alias = \"title\")]")
        .bytes_everywhere(false)
        .bytes([".codegen.collide.Shop.logo"]);
    let (_, files) = generate_with(builder, "collide_options", COLLIDE).expect("generation succeeds");
    let top = file(&files, "codegen.collide.rs");
    assert_has(
        top,
        "#[doc(alias = \"store\")] #[derive(Clone, PartialEq, ::prost::Message)] pub struct Shop {",
    );
    assert_has(top, "#[doc(alias = \"article\")] #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)] pub struct Item {");
    assert_has(top, "#[prost(string, tag = \"1\")] #[doc(alias = \"title\")] pub name:");
    assert_has(top, "pub logo: ::prost::bytes::Bytes");
}

#[test]
fn no_rename_with_a_replaced_prost_configuration() {
    let err =
        generate_with(configure().prost_config(prost_build::Config::new()), "collide_prost_config", COLLIDE)
            .expect_err("must fail");
    let text = err.to_string();
    assert!(text.ends_with("proto/codegen/collide/collide.proto:11:1: message `codegen.collide.Shop` has nested types, so its module would be `codegen::collide::shop`, which is also the module of package `codegen.collide.shop` (PKG:5:1); rpc-codegen renames such a message module to `shop_`, but not when the prost-build configuration was replaced with prost_config(..), whose path options it cannot carry over to the renamed module; give those options through the Builder instead, or rename the message or the package".replace("PKG", &proto_dir().join("codegen/collide/shop.proto").display().to_string()).as_str()), "{text}");
}

#[test]
fn a_service_module_named_like_a_package_module_is_refused() {
    let err = generate("service_package", &["codegen/errors/service_package.proto"]).expect_err("must fail");
    let Error::Proto { path, line, column, reason } = &err else { panic!("wrong error: {err}") };
    assert!(path.ends_with("proto/codegen/errors/service_package.proto"), "{}", path.display());
    assert_eq!((*line, *column), (11, 1));
    let package = proto_dir().join("codegen/errors/svc/greeter_server.proto");
    assert_eq!(
        reason,
        &format!(
            "service `codegen.errors.svc.Greeter` gets the module `codegen::errors::svc::greeter_server`, which \
             is also the module of package `codegen.errors.svc.greeter_server` ({}:3:1); rename the service or \
             the package",
            package.display()
        )
    );
}

#[test]
fn two_messages_with_one_module_are_refused() {
    let err = generate("message_modules", &["codegen/errors/message_modules.proto"]).expect_err("must fail");
    let Error::Proto { path, line, column, reason } = &err else { panic!("wrong error: {err}") };
    assert!(path.ends_with("proto/codegen/errors/message_modules.proto"), "{}", path.display());
    assert_eq!((*line, *column), (10, 1));
    assert_eq!(
        reason,
        &format!(
            "messages `codegen.errors.twice.Stock` ({}:6:1) and `codegen.errors.twice.stock` both get the \
             module `codegen::errors::twice::stock` for their nested types; rename one of them",
            proto_dir().join("codegen/errors/message_modules.proto").display()
        )
    );
}

#[test]
fn two_nested_messages_with_one_module_are_refused() {
    let err = generate("nested_modules", &["codegen/errors/nested_modules.proto"]).expect_err("must fail");
    let Error::Proto { path, line, column, reason } = &err else { panic!("wrong error: {err}") };
    assert!(path.ends_with("proto/codegen/errors/nested_modules.proto"), "{}", path.display());
    assert_eq!((*line, *column), (12, 5));
    assert_eq!(
        reason,
        &format!(
            "messages `codegen.errors.nested.Outer.Mid.Part` ({}:9:5) and `codegen.errors.nested.Outer.Mid.part` \
             both get the module `codegen::errors::nested::outer::mid::part` for their nested types; rename one \
             of them",
            proto_dir().join("codegen/errors/nested_modules.proto").display()
        )
    );
}

#[test]
fn enum_values_with_one_variant_are_refused_at_the_second_value() {
    for builder in [configure(), configure().include_file("_includes.rs")] {
        let err = generate_with(builder, "enum_overlap", &["codegen/errors/enum_overlap.proto"])
            .expect_err("must fail");
        let Error::Proto { path, line, column, reason } = &err else { panic!("wrong error: {err}") };
        assert!(path.ends_with("proto/codegen/errors/enum_overlap.proto"), "{}", path.display());
        assert_eq!((*line, *column), (12, 7));
        assert_eq!(
            reason,
            "enum `codegen.errors.enums.deep.Outer.Inner.Kind`: values `KIND_FOO` and `FOO` both become the Rust \
             variant `Foo` (prost-build drops the enum's name from the front of its values' names); rename one \
             of them"
        );
    }
    // Kept prefixes: `KindFoo` and `Foo` differ.
    generate_with(configure().retain_enum_prefix(), "enum_retained", &["codegen/errors/enum_overlap.proto"])
        .expect("generation succeeds");
    // Values that differ only in case and underscores overlap either way; an alias does not count.
    for builder in [configure(), configure().retain_enum_prefix()] {
        let retained = format!("{builder:?}").contains("retain_enum_prefix: true");
        let err = generate_with(builder, "enum_top", &["codegen/errors/enum_overlap_top.proto"])
            .expect_err("must fail");
        let Error::Proto { line, column, reason, .. } = &err else { panic!("wrong error: {err}") };
        assert_eq!((*line, *column), (12, 3));
        let (variant, how) = if retained {
            ("ColorDarkRed", "")
        } else {
            ("DarkRed", " (prost-build drops the enum's name from the front of its values' names)")
        };
        assert_eq!(
            reason,
            &format!(
                "enum `codegen.errors.enums.Color`: values `COLOR_DARK_RED` and `ColorDarkRed` both become the \
                 Rust variant `{variant}`{how}; rename one of them"
            )
        );
    }
}

#[test]
fn every_missing_import_is_named_with_its_importing_line() {
    for builder in [configure(), configure().include_file("_includes.rs")] {
        let err = generate_with(builder, "missing_imports", &["codegen/errors/missing_imports.proto"])
            .expect_err("must fail");
        let Error::MissingImports { imports } = &err else { panic!("wrong error: {err}") };
        assert_eq!(imports.len(), 3, "{err}");
        let a = proto_dir().join("codegen/errors/missing_imports.proto");
        let b = proto_dir().join("codegen/errors/missing_imports_b.proto");
        assert_eq!(
            err.to_string(),
            format!(
                "{a}:6:1: import 'codegen/nowhere/first.proto' not found\n\
             {a}:8:1: import 'codegen/nowhere/second.proto' not found\n\
             {b}:6:1: import 'codegen/nowhere/third.proto' not found",
                a = a.display(),
                b = b.display()
            )
        );
    }
}

#[test]
fn bytes_fields_are_bytes_unless_turned_off() {
    let code = code_of("bytes_default", "codegen/shadowing.proto", "codegen.shadowing.rs");
    assert_has(&code, "pub chunks: ::prost::alloc::vec::Vec<::prost::bytes::Bytes>");
    let (_, files) =
        generate_with(configure().bytes_everywhere(false), "bytes_off", &["codegen/shadowing.proto"])
            .expect("generation succeeds");
    assert_has(
        file(&files, "codegen.shadowing.rs"),
        "pub chunks: ::prost::alloc::vec::Vec<::prost::alloc::vec::Vec<u8>>",
    );
}

/// A message `Self` (module `self_`, as prost-build escapes it) beside package `k.self` (module
/// `self_` too), and a package that only parents another (`k.only.v1` needs `k::only`).
const KEYWORD_COLLISION: &[(&str, &str)] = &[
    (
        "k.proto",
        "syntax = \"proto3\";\npackage k;\nimport \"self.proto\";\nimport \"v1.proto\";\n\
         message Self {\n  message In {}\n  In in = 1;\n}\nmessage Only {\n  oneof o {\n    int32 a = 1;\n  }\n}\n\
         service S {\n  rpc Go(Self.In) returns (k.self.M);\n}\n",
    ),
    ("self.proto", "syntax = \"proto3\";\npackage k.self;\nmessage M {}\n"),
    ("v1.proto", "syntax = \"proto3\";\npackage k.only.v1;\nmessage V {}\n"),
];

#[test]
fn keyword_and_parent_only_collisions_are_renamed() {
    let (_, files) = generate_texts("collide_keyword", KEYWORD_COLLISION).expect("generation succeeds");
    let code = file(&files, "k.rs");
    // `self_` is taken by the package: the message module gets one more underscore.
    assert_has(code, "pub struct Self_ { #[prost(message, optional, tag = \"1\")] pub r#in: ::core::option::Option<self__::In> }");
    assert_has(code, "pub mod self__ {");
    assert_has(code, "pub mod only_ {");
    assert_has(
        code,
        "fn go(&self, ctx: &RequestContext, request: super::self__::In) -> Reply<super::self_::M>;",
    );
}

#[test]
fn a_refused_rename_names_the_package_that_only_parents_another() {
    let files = [
        ("k.proto", "syntax = \"proto3\";\npackage k;\nimport \"v1.proto\";\nmessage Only {\n  oneof o {\n    int32 a = 1;\n  }\n}\n"),
        ("v1.proto", "syntax = \"proto3\";\npackage k.only.v1;\nmessage V {}\n"),
    ];
    let builder = configure().prost_config(prost_build::Config::new());
    let err = generate_texts_with(builder, "collide_parent_refused", &files).expect_err("must fail");
    let text = err.to_string();
    let (dir, rest) = text.rsplit_once("k.proto:").expect("the message's file");
    assert_eq!(
        rest,
        format!(
            "4:1: message `k.Only` has nested types, so its module would be `k::only`, which is also the module \
             of package `k.only` (parent of `k.only.v1`, {dir}v1.proto:2:1); rpc-codegen renames such a message \
             module to `only_`, but not when the prost-build configuration was replaced with prost_config(..), \
             whose path options it cannot carry over to the renamed module; give those options through the \
             Builder instead, or rename the message or the package"
        )
    );
}

#[test]
fn a_rename_is_refused_when_the_input_has_the_stand_in_word() {
    let files = [
        ("m.proto", "syntax = \"proto3\";\npackage m;\nimport \"n.proto\";\n// Rpccodegenmoved\nmessage N {\n  message I {}\n}\n"),
        ("n.proto", "syntax = \"proto3\";\npackage m.n;\nmessage X {}\n"),
    ];
    let err = generate_texts("collide_marker", &files).expect_err("must fail");
    let Error::Proto { line, column, reason, .. } = &err else { panic!("wrong error: {err}") };
    assert_eq!((*line, *column), (5, 1));
    assert!(
        reason.ends_with(
            "rpc-codegen renames such a message module to `n_`, but not in a build whose protos contain the \
             word `rpccodegenmoved` (its stand-in names)"
        ),
        "{reason}"
    );
}

#[test]
fn two_items_with_one_rust_type_are_refused() {
    let err = generate("type_names", &["codegen/errors/type_names.proto"]).expect_err("must fail");
    let Error::Proto { path, line, column, reason } = &err else { panic!("wrong error: {err}") };
    assert!(path.ends_with("proto/codegen/errors/type_names.proto"), "{}", path.display());
    assert_eq!((*line, *column), (16, 5));
    assert_eq!(
        reason,
        &format!(
            "message `codegen.errors.types.Outer.Holder.ValueOneOf` ({}:13:5) and oneof \
             `codegen.errors.types.Outer.Holder.value` both become the Rust type \
             `codegen::errors::types::outer::holder::ValueOneOf`; rename one of them",
            proto_dir().join("codegen/errors/type_names.proto").display()
        )
    );
    let err = generate("type_names_top", &["codegen/errors/type_names_top.proto"]).expect_err("must fail");
    let Error::Proto { line, column, reason, .. } = &err else { panic!("wrong error: {err}") };
    assert_eq!((*line, *column), (8, 1));
    assert_eq!(
        reason,
        &format!(
            "message `codegen.errors.types.Stock` ({}:6:1) and enum `codegen.errors.types.STOCK` both become \
             the Rust type `codegen::errors::types::Stock`; rename one of them",
            proto_dir().join("codegen/errors/type_names_top.proto").display()
        )
    );
}

#[test]
fn async_server_makes_only_the_named_services_traits_async() {
    let builder = configure().async_server("codegen.asynchronous.Lookup");
    let (_, files) = generate_with(builder, "async-one", &["codegen/asynchronous.proto"]).expect("generates");
    // Compared with whitespace squashed (the output is pretty-printed).
    let code = file(&files, "codegen.asynchronous.rs").split_whitespace().collect::<Vec<_>>().join(" ");
    let lookup =
        &code[code.find("pub mod lookup_server").unwrap()..code.find("pub mod lookup_client").unwrap()];
    assert!(
        lookup.contains(
            "fn get( &self, ctx: AsyncContext, request: super::Ask, ) -> impl ::core::future::Future"
        ),
        "{lookup}"
    );
    assert!(lookup.contains("spawn_async( &self.runtime, ctx,"), "{lookup}");
    assert!(lookup.contains("pub fn with_runtime(inner: T, runtime: AsyncRuntime)"), "{lookup}");
    // The other service of the file keeps inline handlers; its trait shadows the facade's
    // `AsyncContext`, so nothing there may name it bare.
    let other = &code[code.find("pub mod async_context_server").unwrap()
        ..code.find("pub mod async_context_client").unwrap()];
    assert!(
        other.contains("ctx: &RequestContext, request: super::Ask, ) -> Reply<super::Answer>;"),
        "{other}"
    );
    assert!(!other.contains("spawn_async"), "{other}");
    // Both stubs have the channel form.
    assert!(code.contains("impl LookupClient<Channel> {"), "{code}");
    assert!(
        code.contains(
            "pub fn get( &self, request: impl IntoRequest<super::Ask>, ) -> UnaryCall<super::Answer>"
        ),
        "{code}"
    );
    assert!(
        code.contains(
            "pub fn get( &self, request: impl IntoRequest<super::Ask>, ) -> ::core::result::Result<super::Answer, Status>"
        ),
        "{code}"
    );
}

#[test]
fn an_async_server_name_that_matches_no_service_fails_naming_it() {
    let builder = configure().async_server("codegen.asynchronous.Nope");
    let e = generate_with(builder, "async-none", &["codegen/asynchronous.proto"]).unwrap_err().to_string();
    assert!(e.contains("async_server(\"codegen.asynchronous.Nope\")"), "{e}");
    // The package alone is not a service.
    let builder = configure().async_server("codegen.asynchronous");
    assert!(generate_with(builder, "async-pkg", &["codegen/asynchronous.proto"]).is_err());
}

/// A message with only map and proto3 `optional` fields gets no module from prost-build, so
/// naming it like a service's module (`GreeterServer`) or like a package's (`Catalog` beside
/// package `codegen.plain.catalog`) collides with nothing: no refusal (not even with a replaced
/// prost-build configuration, where any real collision is refused) and no rename.
#[test]
fn messages_without_a_module_collide_with_nothing() {
    const PLAIN: &[&str] = &["codegen/plain.proto", "codegen/plain/catalog.proto"];
    for (test, builder) in
        [("plain", configure()), ("plain_prost_config", configure().prost_config(prost_build::Config::new()))]
    {
        let (warnings, files) = generate_with(builder, test, PLAIN).expect("generation succeeds");
        assert!(warnings.is_empty(), "{warnings:#?}");
        let code = file(&files, "codegen.plain.rs");
        assert_has(code, "pub struct GreeterServer {");
        assert_has(code, "pub struct Catalog {");
        assert_has(code, "pub mod greeter_server {");
        assert!(!code.contains("pub mod catalog"), "no module for Catalog: {code}");
        assert!(!code.contains("catalog_"), "nothing renamed: {code}");
        assert!(!code.contains("greeter_server_"), "nothing renamed: {code}");
        // prost-build appends `OneOf` to the escaped name: `Self_OneOf`, beside `SelfOneOf`.
        assert_has(code, "pub enum Self_OneOf {");
        assert_has(code, "pub struct SelfOneOf {");
    }
}

/// Each generated file ends with a `use` line per package it refers to, quoting the module the
/// user must write (rustc's unresolved-import error shows that line): relative paths as
/// prost-build's, `self::` for a package below, none for an enclosing package, none for
/// well-known types (`::prost_types`) or extern paths.
#[test]
fn every_referenced_package_gets_a_use_line_naming_its_module() {
    let (_, files) = generate("uses", &["codegen/deep/inner/v1.proto"]).expect("generation succeeds");
    let inner = file(&files, "codegen.deep.inner.v1.rs");
    assert_has(
        inner,
        "#[allow(unused_imports)] use super::super::super::common as _; // package `codegen.common` needs its own \
         module: `codegen::common`, holding rpc_core::include_proto!(\"codegen.common\")",
    );
    // `codegen.deep` encloses `codegen.deep.inner.v1`: the file sits inside its module.
    assert!(!inner.contains("package `codegen.deep`"), "{inner}");
    let deep = file(&files, "codegen.deep.rs");
    assert_has(deep, "use super::common as _;");
    assert!(!file(&files, "codegen.common.rs").contains("needs its own module"), "refers to no package");

    let (_, files) = generate("uses_etcd", &["codegen/etcdlike/rpc.proto"]).expect("generation succeeds");
    assert_has(
        file(&files, "etcdserverpb.rs"),
        "use super::mvccpb as _; // package `mvccpb` needs its own module: pub mod mvccpb { \
         rpc_core::include_proto!(\"mvccpb\"); }",
    );

    let (_, files) = generate("uses_child", &["codegen/plain.proto"]).expect("generation succeeds");
    assert_has(file(&files, "codegen.plain.rs"), "use self::catalog as _;");

    let (_, files) = generate("uses_wkt", &["codegen/well_known.proto"]).expect("generation succeeds");
    assert!(!file(&files, "codegen.well_known.rs").contains("needs its own module"), "prost_types is extern");
    let builder = configure().extern_path(".mvccpb", "::etcd_types::mvccpb");
    let (_, files) =
        generate_with(builder, "uses_extern", &["codegen/etcdlike/rpc.proto"]).expect("generation");
    assert!(!file(&files, "etcdserverpb.rs").contains("needs its own module"), "extern");
}
