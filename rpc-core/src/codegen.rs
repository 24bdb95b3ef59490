//! The facade that generated code calls: the only `rpc_core` import of a generated module.
//!
//! The contract is `docs/facade.md`. Generated server adapters implement [`Service`] and match on
//! [`MethodId`] constants; generated client stubs wrap a [`Client`] and call [`Client::unary`] or
//! [`Client::unary_async`] with a method-id constant, or wrap a [`Channel`] and call
//! [`Channel::unary`]. Adapters of async services run their handlers through [`spawn_async`].

pub use crate::channel::{Channel, ChannelConfig, ClientStreamCall, StreamReceiver, StreamSender, UnaryCall};
pub use crate::client::{
    register_method_names, BidiStreaming, CallOptions, Client, ClientConfig, ClientStreaming, IntoRequest,
    ResponseFuture, SharedSession, Streaming,
};
pub use crate::dispatch::reply::{CallInfo, Reply, ReplyWriter, RequestContext, Responder};
pub use crate::dispatch::service::{decode, method_id, Body, MethodDesc, MethodId, Service};
pub use crate::dispatch::source::RequestStream;
pub use crate::dispatch::stream::{StreamSink, SINK_DEPTH};
pub use crate::server::async_service::{spawn_async, spawn_async_stream, AsyncContext, AsyncRuntime};
pub use crate::status::{Code, Status};
pub use prost::Message;

/// Includes the code `rpc-codegen` generated for a protobuf package, like tonic's macro:
/// `rpc_core::include_proto!("helloworld");` expands to
/// `include!(concat!(env!("OUT_DIR"), "/helloworld.rs"));`.
#[macro_export]
macro_rules! include_proto {
    ($package:tt) => {
        include!(concat!(env!("OUT_DIR"), "/", $package, ".rs"));
    };
}
