//! A [`Channel`]'s unary calls as a [`tower_service::Service`] (feature `tower`, on by default),
//! so tower's layers (timeout, concurrency limit, rate limit, retry, load shed, buffer) apply
//! unchanged, as they do to a tonic `Channel`:
//!
//! ```no_run
//! # async fn f(ch: rpc_core::Channel) {
//! use rpc_core::codegen::method_id;
//! // A service calling one method: `Request<Req>` in, `Resp` or `Status` out.
//! let svc = ch.unary_service::<u32, u32>(method_id("/pkg.Svc/Method"));
//! # let _ = svc;
//! # }
//! ```
//!
//! [`UnaryService::poll_ready`](tower_service::Service::poll_ready) is always ready: a
//! `Channel` takes a call at any time (with its dispatchers' submission queues full, the call's
//! own future waits for room, so backpressure shows as a slower future, not as `Pending` here;
//! the queue a call lands in is picked when it starts). Layers that shed or limit load
//! therefore act on the calls in flight, which is what `ConcurrencyLimit` and `LoadShed` over
//! it measure.

use std::marker::PhantomData;
use std::task::{Context, Poll};

use prost::Message;

use super::{Channel, UnaryCall};
use crate::client::{CallOptions, Request};
use crate::dispatch::service::MethodId;
use crate::status::Status;

/// One method of a [`Channel`] as a `tower_service::Service<Request<Req>>` with
/// `Response = Resp` and `Error = Status` (see the [module docs](self)). Cheap to clone (a
/// `Channel` handle, the method id and the call options).
pub struct UnaryService<Req, Resp> {
    channel: Channel,
    method: MethodId,
    options: CallOptions,
    _types: PhantomData<fn(Req) -> Resp>,
}

impl<Req, Resp> Clone for UnaryService<Req, Resp> {
    fn clone(&self) -> Self {
        UnaryService {
            channel: self.channel.clone(),
            method: self.method,
            options: self.options.clone(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp> std::fmt::Debug for UnaryService<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnaryService").field("method", &self.method).finish()
    }
}

impl<Req, Resp> UnaryService<Req, Resp> {
    /// The options every call of the service starts from (deadline, metadata...; a
    /// [`Request`]'s own metadata replaces the options' metadata, as with [`Channel::unary`]).
    /// Default: [`CallOptions::default`].
    pub fn with_options(mut self, options: CallOptions) -> Self {
        self.options = options;
        self
    }

    /// The channel the calls go through.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }
}

impl Channel {
    /// Calls of `method` as a `tower_service::Service` (see [`UnaryService`]).
    pub fn unary_service<Req, Resp>(&self, method: MethodId) -> UnaryService<Req, Resp> {
        UnaryService { channel: self.clone(), method, options: CallOptions::default(), _types: PhantomData }
    }
}

impl<Req, Resp> tower_service::Service<Request<Req>> for UnaryService<Req, Resp>
where
    Req: Message + Send + 'static,
    Resp: Message + Default + Send + 'static,
{
    type Response = Resp;
    type Error = Status;
    type Future = UnaryCall<Resp>;

    /// Always ready (see the [module docs](self)).
    #[inline]
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    /// Starts the call ([`Channel::unary`]); the future resolves to the response or the status.
    #[inline]
    fn call(&mut self, req: Request<Req>) -> UnaryCall<Resp> {
        self.channel.unary::<Req, Resp>(self.method, req, &self.options)
    }
}
