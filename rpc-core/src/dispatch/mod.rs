//! What a server worker dispatches requests through, below the worker so that it never imports
//! the server: the method table ([`registry::Registry`]), the context handed to handlers, the
//! reply writer they answer into, the [`reply::Responder`] of deferred calls, and the service
//! contract itself ([`service::Service`], [`service::Body`], method ids), which generated code
//! reaches through the `codegen` facade's re-exports.

pub(crate) mod local;
pub(crate) mod registry;
pub(crate) mod reply;
pub(crate) mod service;
pub(crate) mod source;
pub(crate) mod stream;
