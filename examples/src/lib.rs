//! The examples' shared parts: generated code, what the binaries share (`cli`: flags, server
//! and client configurations, how they serve and fail), the Greeter and the key-value store,
//! and the key-value client workload that checks what it reads back.
//!
//! Binaries: `hello-server`, `hello-client`, `hello` (both in one process on `sim`),
//! `kv-server`, `kv-client`, `kv` (both in one process on `sim`), `route-guide-server`,
//! `route-guide-client`, `route-guide` (tonic's route_guide, all four RPC shapes, checked).

pub mod cli;
pub mod greeter;
pub mod kv_store;
pub mod kv_workload;
pub mod route_guide;

/// `package helloworld` (proto/helloworld.proto).
#[allow(missing_docs)]
pub mod helloworld {
    rpc_core::include_proto!("helloworld");
}

/// `package kv` (proto/kv.proto).
#[allow(missing_docs)]
pub mod kv {
    rpc_core::include_proto!("kv");
}

/// `package routeguide` (proto/route_guide.proto, tonic's route_guide example).
#[allow(missing_docs)]
pub mod routeguide {
    rpc_core::include_proto!("routeguide");
}
