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
//! output.
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
//!   `say_hello_with(.., &CallOptions)` and `say_hello_async` (a future).
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
//! **Comments** become rustdoc. Code blocks in them become `text` blocks, so they neither run as
//! doctests nor break `cargo doc`; `<tag>`-looking text is escaped.
//!
//! **Streaming RPCs** are not supported yet: a file with them builds, and each one is left out of
//! the trait and the stub with a `cargo:warning` naming it.

mod builder;
mod check;
mod client;
mod comments;
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
mod unnamed;

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
