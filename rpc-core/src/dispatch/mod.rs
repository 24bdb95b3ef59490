//! What a server worker dispatches requests through, below the worker so that it never imports
//! the server: the method table ([`registry::Registry`]), the context handed to handlers, the
//! reply writer they answer into and the [`reply::Responder`] of deferred calls.

pub(crate) mod registry;
pub(crate) mod reply;
pub(crate) mod source;
pub(crate) mod stream;
