//! Build-time code generation for `rpc-core` services: `.proto` files in, prost messages plus a
//! server trait and a client stub per service out — the way `tonic-build` serves gRPC users, with
//! no system `protoc` (files are parsed by [protox](https://docs.rs/protox)).
//!
//! # Add a service in three steps
//!
//! **1. Describe it** in a `.proto` file, e.g. `proto/helloworld.proto`:
//!
//! ```text
//! syntax = "proto3";
//! package helloworld;
//!
//! service Greeter {
//!   rpc SayHello(HelloRequest) returns (HelloReply);
//! }
//! message HelloRequest { string name = 1; }
//! message HelloReply { string message = 1; }
//! ```
//!
//! **2. Generate the code** at build time. `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! rpc-core = { path = "../rpc-core" }
//! prost = "0.14"
//!
//! [build-dependencies]
//! rpc-codegen = { path = "../rpc-codegen" }
//! ```
//!
//! `build.rs`:
//!
//! ```no_run
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     rpc_codegen::compile_protos(&["proto/helloworld.proto"], &["proto"])?;
//!     Ok(())
//! }
//! ```
//!
//! and include it where the package's module should be:
//!
//! ```ignore
//! pub mod helloworld {
//!     rpc_core::include_proto!("helloworld");
//! }
//! ```
//!
//! (Packages that refer to each other need modules nested like the package names —
//! `codegen.deep.inner.v1` in `codegen::deep::inner::v1` — since prost's paths between packages
//! are relative; a file without `package` is `include_proto!("_")`.)
//!
//! **3. Implement and call it.** The server implements the trait; the client calls the stub:
//!
//! ```ignore
//! use helloworld::greeter_server::{Greeter, GreeterServer};
//! use helloworld::{greeter_client::GreeterClient, HelloReply, HelloRequest};
//! use rpc_core::codegen::{Reply, RequestContext};
//!
//! struct MyGreeter;
//! impl Greeter for MyGreeter {
//!     fn say_hello(&self, _ctx: &RequestContext, req: HelloRequest) -> Reply<HelloReply> {
//!         HelloReply { message: format!("Hello {}!", req.name) }.into()
//!     }
//! }
//!
//! // server
//! rpc_core::Server::builder().add_service(GreeterServer::new(MyGreeter)).serve("0.0.0.0:18515")?;
//! // client (another process or thread)
//! let client = GreeterClient::connect("server:18515")?;
//! let reply = client.say_hello(&HelloRequest { name: "world".into() })?;
//! ```
//!
//! A syntax error or a missing import fails the build with `file:line:column: reason` in cargo's
//! output. Every missing import of the build is named at once, one line each, with its importing
//! file and line:
//!
//! ```text
//! proto/a.proto:6:1: import 'nowhere/first.proto' not found
//! proto/a.proto:8:1: import 'nowhere/second.proto' not found
//! ```
//!
//! # What is generated, per service `Greeter` of package `helloworld`
//!
//! In `$OUT_DIR/helloworld.rs` (`_.rs` for a file without `package`), next to prost's messages:
//! - `greeter_server`: the constant `SERVICE_NAME` (`"helloworld.Greeter"`), one method-id
//!   constant per RPC (`SAY_HELLO`), `method_names::SAY_HELLO` (`"/helloworld.Greeter/SayHello"`),
//!   the trait `Greeter` (one method per RPC, returning `Reply<Resp>`; handlers run inline on the
//!   worker, or defer and answer from any thread) and the adapter `GreeterServer<T>` implementing
//!   the runtime's `Service`.
//! - `greeter_client`: the same constants and the stub `GreeterClient` (`connect`, `connect_with`,
//!   `new`, `client`, `into_client`, `From<Client>`), with per RPC `say_hello` (blocking),
//!   `say_hello_with(.., &CallOptions)` and `say_hello_async` (a future); over a `Channel`
//!   (`connect_channel`, `from_channel`), `say_hello` and `say_hello_with` returning `Send +
//!   'static` futures. Both take the request by value or by reference
//!   (`impl IntoRequest<HelloRequest>`: `stub.say_hello(req)` or `stub.say_hello(&req)`), so
//!   moving code from one stub to the other changes no call site. Only the stub over a `Channel`
//!   is `Clone` (`impl<C: SharedSession> Clone`): asking it of a blocking stub gets the compiler's
//!   hint toward `connect_channel`.
//!
//! - `FILE_DESCRIPTOR_SET` (in a package with a service): the encoded
//!   `google.protobuf.FileDescriptorSet` of the package's `.proto` files and every file they
//!   import, transitively (no source info; dependency order), as tonic-build's
//!   `file_descriptor_set_path` writes it. The server adapter hands it to the runtime as
//!   `Service::FILE_DESCRIPTOR_SET`, so `ServerBuilder::add_reflection()` describes every service
//!   added without registration by hand.
//!
//! **Default handlers.** [`Builder::generate_default_stubs(true)`](Builder::generate_default_stubs)
//! gives every server trait method a default body answering UNIMPLEMENTED with the RPC's name
//! (tonic-build's option of the same name), so a large service compiles before all its methods
//! are written. Generated code never warns, under `-D warnings` too (services of client or
//! bidirectional streams only included; `codegen-tests` denies warnings in every module that
//! includes generated code).
//!
//! **Imported packages need their modules.** Generated code refers to the messages of an imported
//! package by a relative path (`super::mvccpb::KeyValue` from `etcdserverpb`), as prost-build does:
//! include each package's file in a module of its own, nested as the package names are. etcd's
//! `rpc.proto` (package `etcdserverpb`) imports `kv.proto` (package `mvccpb`), so:
//!
//! ```text
//! pub mod mvccpb { rpc_core::include_proto!("mvccpb"); }
//! pub mod etcdserverpb { rpc_core::include_proto!("etcdserverpb"); }
//! ```
//!
//! An include file ([`Builder::include_file`]) writes the nesting for you. Every generated file
//! ends with one line per package it refers to, so that a module left out is reported with the
//! fix (rustc quotes the line of an unresolved import):
//!
//! ```text
//! error[E0432]: unresolved import `super::mvccpb`
//!     |
//! 309 | use super::mvccpb as _; // package `mvccpb` needs its own module: pub mod mvccpb { rpc_core::include_proto!("mvccpb"); }
//!     |     ^^^^^^^^^^^^^^^^^^ no `mvccpb` in the root
//! ```
//!
//! (followed by `cannot find mvccpb in super` at each use).
//!
//! Generated code imports only `rpc_core::codegen::*` (and `super::` for the messages); the
//! contract is `docs/facade.md`.
//!
//! **Method ids** are FNV-1a 32 of `"/package.Service/Method"`, computed here and emitted as
//! literals: stable across builds and independent of declaration order. Two methods with the same
//! id, or an id of 0 (reserved), fail the build naming the methods.
//!
//! **Names.** Rust keywords are escaped as prost-build escapes them (`r#type`, `self_`, `Self_`).
//! When a generated name is taken — an RPC called `connect`, or one whose `_with` variant is another
//! RPC's name — the later claim gets a trailing `_` (the RPCs' own names win, then their variants,
//! then the stub's own methods: with an RPC `Connect`, the constructor is `connect_`).
//! Proto names that differ only in case (`SayHello`, `say_hello`) are refused with an error, and so
//! are names made of underscores only (`_`, `__`: protobuf allows them, but they have no Rust form).
//!
//! **`bytes` fields are `bytes::Bytes`** by default (prost-build's `.bytes(["."])`): decoding
//! slices the received buffer instead of copying every field into a `Vec<u8>`, and a field is
//! cheap to clone. The generated code names the type `::prost::bytes::Bytes` (prost re-exports the
//! `bytes` crate), so no extra dependency is needed to build; values are made with
//! `Bytes::from(vec)`, `Bytes::from_static(b"..")` or `Bytes::copy_from_slice(..)`.
//! [`Builder::bytes_everywhere(false)`](Builder::bytes_everywhere) gives prost-build's `Vec<u8>`
//! back (then [`Builder::bytes`] picks fields one by one).
//!
//! **Message modules named like packages.** prost-build puts a message's nested types, enums and
//! oneofs in a module named after the message (`snake_case`), next to it; a package's code lives in
//! a module named after its last part, inside its parent package's module. When both names meet in
//! one parent — message `shop.Catalog` with nested types and package `shop.catalog` (or only
//! `shop.catalog.v1`, which needs a module `shop::catalog` all the same), in any parent, at the root
//! too — **the message's module gets a trailing underscore: `shop::catalog_`** (a raw identifier
//! loses its `r#` first: `r#type` → `type_`; if that name is taken as well, more underscores). The
//! struct keeps its name (`shop::Catalog`), the package keeps `shop::catalog`, and every generated
//! path through the message's module — fields, oneofs, enums, references from other packages, RPC
//! signatures — uses the new name, with or without an include file. Path options given to the
//! [`Builder`] (`type_attribute(".shop.Catalog.Item", ..)`, `bytes`, `extern_path`, ...) keep
//! applying to the renamed message. Collisions with no safe rename fail with `file:line:col` naming
//! both items: a service module (`greeter_server`) that is also a package's module, two messages
//! whose modules are one (`Stock` and `stock`), and any collision when the prost-build
//! configuration was replaced with [`Builder::prost_config`] (its path options cannot be carried
//! over).
//!
//! **Shapes prost-build refuses** are checked before it runs and reported at their place, never as
//! a panic: enum values whose Rust variants would be one once the enum's name is dropped from their
//! front,
//!
//! ```text
//! proto/kinds.proto:12:7: enum `pkg.Outer.Kind`: values `KIND_FOO` and `FOO` both become the Rust
//! variant `Foo` (prost-build drops the enum's name from the front of its values' names); rename one of them
//! ```
//!
//! (one line in cargo's output). Two items that would be one Rust type in one module — `Stock`
//! and `stock`, an enum `STOCK` beside a message `Stock` — are refused the same way, naming both
//! (rustc would refuse the second, `E0428`). A message with only map and proto3 `optional`
//! fields gets no module from prost-build, so its name collides with no module (a message
//! `GreeterServer` beside service `Greeter`, a message `Catalog` beside package `shop.catalog`).
//! A oneof named like a nested message or enum of its
//! message (`oneof inner` beside `message Inner`, as in googleapis' `storage_control.proto`) is
//! not such a case: prost-build names the oneof's type `InnerOneOf`, and the check knows it (it
//! refuses the shape only when a nested `InnerOneOf` exists too).
//! Anything prost-build still panics on (an attribute passed through
//! the builder that is not valid Rust) is an [`Error::Generate`], without the panic banner.
//!
//! **Comments** become rustdoc. Code blocks in them become `text` blocks, so they neither run as
//! doctests nor break `cargo doc`; `<tag>`-looking text is escaped. Links whose destination is not a URL —
//! googleapis' `[Shelf][google.example.v1.Shelf]`, `[Shelf][]`, `[text](Item)` — would be
//! intra-doc links to Rust items that do not exist under those names: they become plain text with
//! the destination as code (``Shelf (`google.example.v1.Shelf`)``), so `cargo doc` stays quiet.
//!
//! **Streaming RPCs** of every shape are generated. Server streaming: the handler gets a
//! `StreamSink`, the stub returns `Streaming`. Client streaming: the handler gets a
//! `RequestStream` and a `Responder`, the stub returns `ClientStreaming` (`send`, `finish`).
//! Bidirectional: a `RequestStream` and a `StreamSink`; the stub returns `BidiStreaming`. With
//! `async_server`, streaming handlers are async (`message_async`, `send_async`; the future's
//! output ends the stream).

mod builder;
mod check;
mod client;
mod comments;
mod descriptors;
mod enums;
mod error;
mod generator;
mod imports;
mod location;
mod method_id;
mod modules;
mod names;
mod proto_error;
mod server;
mod types;
mod unnamed;
mod uses;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use builder::Builder;
pub use error::Error;
pub use imports::MissingImport;
pub use method_id::{full_method_name, method_id};

/// Generates messages, server traits and client stubs for `protos` into `OUT_DIR`, with the
/// default configuration. `includes` are the directories imports are resolved against (the
/// bundled `google/protobuf/*.proto` files are always available).
///
/// # Errors
/// See [`Builder::compile_protos`].
pub fn compile_protos(protos: &[impl AsRef<Path>], includes: &[impl AsRef<Path>]) -> Result<(), Error> {
    configure().compile_protos(protos, includes)
}

/// A [`Builder`] with the defaults, to change before compiling.
pub fn configure() -> Builder {
    Builder::default()
}
