//! The code `rpc-codegen` generates for every test proto under `proto/`, in modules that mirror
//! the proto packages (cross-package references are relative paths, so the nesting matters).
//!
//! The tests in `tests/` use it: the helloworld snapshot, the method ids against the runtime's
//! `method_id()`, the names each tricky proto produces, and RPCs end to end on `sim`.
//!
//! A stub over a blocking `Client` is neither `Clone` nor `Sync`, and the compiler says what to
//! do instead. Cloning it (here through a derive) is refused with `#[diagnostic::on_unimplemented]`'s
//! hint (`a stub over a blocking Client cannot be cloned or shared across threads or tokio tasks`,
//! `note: connect a Channel instead (XxxClient::connect_channel(addr).await) ...`):
//!
//! ```compile_fail,E0277
//! use codegen_tests::helloworld::greeter_client::GreeterClient;
//! #[derive(Clone)]
//! struct AppState {
//!     greeter: GreeterClient,
//! }
//! ```
//!
//! Sharing it between threads is refused naming `ToShareAcrossThreadsConnectAChannel` (besides
//! the client's inner `RefCell`):
//!
//! ```compile_fail,E0277
//! use codegen_tests::helloworld::greeter_client::GreeterClient;
//! fn spawn_with(greeter: std::sync::Arc<GreeterClient>) {
//!     std::thread::spawn(move || drop(greeter));
//! }
//! ```
//!
//! A package's code without the module of a package it imports fails to build, and the error
//! of the `use` line codegen ends the file with (`E0432`, unresolved import) quotes the fix:
//! `use super::mvccpb as _; // package mvccpb needs its own module: pub mod mvccpb { .. }`
//! (rustc's other errors, `cannot find mvccpb in super`, point at prost's fields):
//!
//! ```compile_fail,E0432
//! pub mod etcdserverpb {
//!     rpc_core::include_proto!("etcdserverpb");
//! }
//! # fn main() {}
//! ```
//!
//! The stub over a `Channel` is both:
//!
//! ```
//! use codegen_tests::helloworld::greeter_client::GreeterClient;
//! use rpc_core::Channel;
//! #[derive(Clone)]
//! struct AppState {
//!     greeter: GreeterClient<Channel>,
//! }
//! fn spawn_with(greeter: std::sync::Arc<GreeterClient<Channel>>) {
//!     std::thread::spawn(move || drop(greeter));
//! }
//! ```

// prost's messages carry docs only where the proto has comments.
#![allow(missing_docs)]
// Generated code never warns: every module holding generated code denies warnings (`cargo build`
// and `cargo clippy` of this crate fail on any warning in it), services of client or
// bidirectional streams only (`codegen.streaming.Watch`, `codegen.asynchronous.Pipe`) included,
// and the allow-by-default lints a careful crate turns on: `unused_qualifications` (the stubs
// spell facade items through the glob import) and `missing_debug_implementations` (adapters and
// stubs implement `Debug`).

pub mod async_services;
pub mod collide_services;
pub mod hostile_services;
pub mod services;

/// `package helloworld`.
#[deny(warnings, unused_qualifications, missing_debug_implementations)]
pub mod helloworld {
    rpc_core::include_proto!("helloworld");
}

/// `package codegen.*`.
#[deny(warnings, unused_qualifications, missing_debug_implementations)]
pub mod codegen {
    /// Services with async server traits.
    pub mod asynchronous {
        rpc_core::include_proto!("codegen.asynchronous");
    }
    /// Rust keywords as names everywhere.
    pub mod keywords {
        rpc_core::include_proto!("codegen.keywords");
    }
    /// RPC names equal to the stub's methods; a service named like its RPC.
    pub mod stub_names {
        rpc_core::include_proto!("codegen.stub_names");
    }
    /// User types named like std and facade items.
    pub mod shadowing {
        rpc_core::include_proto!("codegen.shadowing");
    }
    /// Types imported by other files and packages.
    pub mod common {
        rpc_core::include_proto!("codegen.common");
    }
    /// A dotted package with a nested package below it.
    pub mod deep {
        rpc_core::include_proto!("codegen.deep");
        /// `codegen.deep.inner`.
        pub mod inner {
            /// `codegen.deep.inner.v1`: imports from `codegen.common` and `codegen.deep`.
            pub mod v1 {
                rpc_core::include_proto!("codegen.deep.inner.v1");
            }
        }
    }
    /// A file holding only a service.
    pub mod only_service {
        rpc_core::include_proto!("codegen.only_service");
    }
    /// Well-known types in signatures.
    pub mod well_known {
        rpc_core::include_proto!("codegen.well_known");
    }
    /// proto3 optional, empty messages, enums, oneofs, maps, several services in one file.
    pub mod shapes {
        rpc_core::include_proto!("codegen.shapes");
    }
    /// Streaming RPCs (left out) next to unary ones.
    pub mod streaming {
        rpc_core::include_proto!("codegen.streaming");
    }
    /// Server traits with default handlers (`generate_default_stubs`), sync and async.
    pub mod defaults {
        rpc_core::include_proto!("codegen.defaults");
    }
    /// Messages without a module of nested items, named like a service module and a package
    /// module (nothing renamed); a oneof `self` beside `message Self`.
    // prost-build's own name for that oneof, `Self_OneOf`, is not UpperCamelCase.
    #[allow(non_camel_case_types)]
    pub mod plain {
        rpc_core::include_proto!("codegen.plain");
        /// `codegen.plain.catalog`: the module message `Catalog` would have taken if it had one.
        pub mod catalog {
            rpc_core::include_proto!("codegen.plain.catalog");
        }
    }
    /// Comments that must not become doctests or break rustdoc.
    pub mod comments {
        rpc_core::include_proto!("codegen.comments");
    }
    /// Message modules named like the package modules next to them: the messages' modules are
    /// renamed `shop_`, `type_` and `node_`; the packages keep `shop`, `r#type` and `node`.
    pub mod collide {
        rpc_core::include_proto!("codegen.collide");
        /// `codegen.collide.shop`: the module message `Shop` would have taken.
        pub mod shop {
            rpc_core::include_proto!("codegen.collide.shop");
            /// `codegen.collide.shop.v1`.
            pub mod v1 {
                rpc_core::include_proto!("codegen.collide.shop.v1");
            }
        }
        /// Only a parent of `codegen.collide.type.v2`, but a module `r#type` all the same.
        pub mod r#type {
            /// `codegen.collide.type.v2` (prost-build names its file after the module path).
            pub mod v2 {
                rpc_core::include_proto!("codegen.collide.r#type.v2");
            }
        }
        /// Three parents deep.
        pub mod deep {
            /// `codegen.collide.deep.er`: message `Node`, module `node_`.
            pub mod er {
                rpc_core::include_proto!("codegen.collide.deep.er");
                /// `codegen.collide.deep.er.node`.
                pub mod node {
                    rpc_core::include_proto!("codegen.collide.deep.er.node");
                }
            }
        }
    }
}

/// The module-collision protos again, nested by prost-build's include file.
#[deny(warnings, unused_qualifications, missing_debug_implementations)]
pub mod with_include_file {
    include!(concat!(env!("OUT_DIR"), "/with-include-file/collide.rs"));
}

/// `package mvccpb` (etcd's `kv.proto` shape), imported by `etcdserverpb`.
#[deny(warnings, unused_qualifications, missing_debug_implementations)]
pub mod mvccpb {
    rpc_core::include_proto!("mvccpb");
}

/// `package etcdserverpb` (etcd's `rpc.proto` shape): refers to `super::mvccpb`.
#[deny(warnings, unused_qualifications, missing_debug_implementations)]
pub mod etcdserverpb {
    rpc_core::include_proto!("etcdserverpb");
}

/// A file without `package` (prost-build names its output `_.rs`).
#[deny(warnings, unused_qualifications, missing_debug_implementations)]
pub mod no_package {
    rpc_core::include_proto!("_");
}

/// Hostile but valid protos (`codegen-tests/proto/`, and two written by the build script).
#[deny(warnings, unused_qualifications, missing_debug_implementations)]
pub mod hostile {
    /// `package hostile.a`: deep nesting, a service without methods, names shared with `b`.
    pub mod a {
        rpc_core::include_proto!("hostile.a");
    }
    /// `package hostile.b`: the same service and message names as `a`.
    pub mod b {
        rpc_core::include_proto!("hostile.b");
    }
    /// Carriage returns and text-direction code points in comments.
    pub mod control {
        rpc_core::include_proto!("hostile.control");
    }
    /// A service with 300 methods.
    pub mod many {
        rpc_core::include_proto!("hostile.many");
    }
}
