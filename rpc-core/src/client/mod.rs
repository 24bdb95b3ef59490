//! The client: one session to a server, driven by the calling thread.
//!
//! Blocking calls busy-poll the client's own CQ in the calling thread (per its polling policy);
//! async calls return a [`ResponseFuture`] that progresses the session whenever it is polled (no
//! executor needed). `Client` is `Send` and `!Sync`: one thread drives it at a time.

mod config;
pub(crate) mod core;

use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::task::{Context, Poll};

use prost::Message;

pub use config::{CallOptions, ClientConfig};

use crate::codegen::MethodId;
use crate::endpoint::counters::Counters;
use crate::status::Status;
use crate::transport::Transport;
use core::{CallId, ClientCore};

enum AnyCore {
    Sim(Box<ClientCore<crate::verbs::sim::Sim>>),
    #[cfg(feature = "ibverbs")]
    Rdma(Box<ClientCore<crate::verbs::ibverbs::Ibverbs>>),
}

macro_rules! with_core {
    ($core:expr, $c:ident => $body:expr) => {
        match $core {
            AnyCore::Sim($c) => $body,
            #[cfg(feature = "ibverbs")]
            AnyCore::Rdma($c) => $body,
        }
    };
}

/// One session to a server (see the module docs).
///
/// `Send` (move it to another thread) but not `Sync` (one thread drives it at a time):
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<rpc_core::Client>();
/// ```
pub struct Client {
    core: RefCell<AnyCore>,
    peer: SocketAddr,
}

impl Client {
    /// Connects with [`ClientConfig::default`].
    ///
    /// # Errors
    /// UNAVAILABLE when the server cannot be reached or the transport cannot open; the server's
    /// status when it refuses the handshake (naming the field or limit).
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Client, Status> {
        Client::connect_with(addr, &ClientConfig::default())
    }

    /// Connects with `config`.
    ///
    /// # Errors
    /// As [`Client::connect`]; INVALID_ARGUMENT for a configuration value out of range.
    pub fn connect_with(addr: impl ToSocketAddrs, config: &ClientConfig) -> Result<Client, Status> {
        let core = match &config.transport {
            Transport::Sim => AnyCore::Sim(Box::new(ClientCore::connect(
                addr,
                config,
                &crate::verbs::DeviceSelector::First,
                1,
                -1,
            )?)),
            #[cfg(feature = "ibverbs")]
            Transport::Rdma { device, port, gid_index } => {
                let sel: crate::verbs::DeviceSelector = device.parse().unwrap_or_default();
                AnyCore::Rdma(Box::new(ClientCore::connect(addr, config, &sel, *port, *gid_index)?))
            }
            #[cfg(not(feature = "ibverbs"))]
            Transport::Rdma { .. } => return Err(Transport::rdma_unavailable()),
        };
        let peer = with_core!(&core, c => c.peer);
        Ok(Client { core: RefCell::new(core), peer })
    }

    /// The server's TCP address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This client's counters.
    pub fn counters(&self) -> Counters {
        with_core!(&*self.core.borrow(), c => c.counters.clone())
    }

    /// Why the session is closed, if it is.
    pub fn closed_reason(&self) -> Option<Status> {
        with_core!(&*self.core.borrow(), c => c.broken().cloned())
    }

    /// A blocking unary call: encodes `req` straight into a registered buffer, sends it, and
    /// busy-polls (per the polling policy) in this thread until the response arrives.
    ///
    /// # Errors
    /// The server's status; DEADLINE_EXCEEDED after `opts`' deadline; UNAVAILABLE when the
    /// session is gone; RESOURCE_EXHAUSTED for a body over a limit (named) or a full window.
    pub fn unary<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Resp, Status> {
        let mut core = self.core.borrow_mut();
        with_core!(&mut *core, c => {
            let call = c.start(id, req, opts.timeout(), true)?;
            c.wait(call)
        })
    }

    /// An async unary call: the request is encoded and queued now; the returned future completes
    /// with the response. Polling it progresses the session (no executor or other thread needed);
    /// dropping it abandons the call (its late answer is discarded).
    pub fn unary_async<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> ResponseFuture<'_, Resp> {
        let r = with_core!(&mut *self.core.borrow_mut(), c => c.start(id, req, opts.timeout(), false));
        let state = match r {
            Ok(call) => State::Waiting(call),
            Err(s) => State::Failed(Some(s)),
        };
        ResponseFuture { client: self, state, _t: PhantomData }
    }

    /// Opens a server stream: sends `req` to method `id` (a server-streaming method; generated
    /// stubs call this) and returns its [`Streaming`] messages. `opts`' timeout is the deadline of
    /// the whole stream (both ends end it DEADLINE_EXCEEDED when it passes).
    ///
    /// # Errors
    /// As [`Client::unary`] for the request (the window full, a request over
    /// `max_message_size`, a broken session).
    pub fn server_stream<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        req: &Req,
        opts: &CallOptions,
    ) -> Result<Streaming<'_, Resp>, Status> {
        let call = with_core!(&mut *self.core.borrow_mut(), c => {
            c.start_with(id, req, opts.timeout(), true, crate::wire::STREAM_OUT)
        })?;
        Ok(Streaming { client: self, call, done: false, _t: PhantomData })
    }

    /// Polls the CQ once and handles what arrived (responses are stored for their futures).
    /// Returns how many completions were handled.
    pub fn progress(&self) -> usize {
        with_core!(&mut *self.core.borrow_mut(), c => c.progress())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        with_core!(self.core.get_mut(), c => c.close());
    }
}

enum State {
    Waiting(CallId),
    Failed(Option<Status>),
    Done,
}

/// The future of an async unary call ([`Client::unary_async`]).
pub struct ResponseFuture<'a, T> {
    client: &'a Client,
    state: State,
    _t: PhantomData<fn() -> T>,
}

impl<T> ResponseFuture<'_, T> {
    /// True once the future has produced its output.
    pub fn is_terminated(&self) -> bool {
        matches!(self.state, State::Done)
    }
}

impl<T: Message + Default> Future for ResponseFuture<'_, T> {
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            State::Failed(s) => {
                let s = s.take().unwrap_or_else(|| Status::internal("future polled after completion"));
                this.state = State::Done;
                Poll::Ready(Err(s))
            }
            State::Done => Poll::Ready(Err(Status::internal("future polled after completion"))),
            State::Waiting(call) => {
                let call = *call;
                let Ok(mut core) = this.client.core.try_borrow_mut() else {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                };
                match with_core!(&mut *core, c => c.poll_call::<T>(call)) {
                    Some(r) => {
                        this.state = State::Done;
                        Poll::Ready(r)
                    }
                    None => {
                        // Busy-polling future: ask to be polled again.
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                }
            }
        }
    }
}

impl<T> Drop for ResponseFuture<'_, T> {
    fn drop(&mut self) {
        if let State::Waiting(call) = self.state {
            if let Ok(mut core) = self.client.core.try_borrow_mut() {
                with_core!(&mut *core, c => c.abandon(call));
            }
        }
    }
}

/// The messages of a server stream, in order, taken by the calling thread
/// ([`Client::server_stream`]). Each message taken returns its credit to the server, so a caller
/// that stops taking them stalls the server's producer once the stream's credits (half the
/// session's, 16 messages by default) are held here. Dropping it before its end cancels the
/// stream (the server's sink sees it cancelled).
pub struct Streaming<'a, T> {
    client: &'a Client,
    call: CallId,
    done: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T: Message + Default> Streaming<'_, T> {
    /// Blocks (busy-polling per the client's policy) for the next message: `Ok(Some(m))`, or
    /// `Ok(None)` at the stream's clean end (the server finished it with OK).
    ///
    /// # Errors
    /// The stream's final status when not OK: the server's error, DEADLINE_EXCEEDED once the
    /// call's timeout (the whole stream's deadline) passed, UNAVAILABLE when the session broke
    /// (the server died mid-stream), CANCELLED. After the end (either way) every call returns
    /// `Ok(None)`.
    pub fn message(&mut self) -> Result<Option<T>, Status> {
        if self.done {
            return Ok(None);
        }
        let r = with_core!(&mut *self.client.core.borrow_mut(), c => c.wait_stream(self.call));
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        r
    }

    /// Polls once without blocking: `None` while no message and no end is there, else what
    /// [`Streaming::message`] would return.
    pub fn try_message(&mut self) -> Option<Result<Option<T>, Status>> {
        if self.done {
            return Some(Ok(None));
        }
        let r = with_core!(&mut *self.client.core.borrow_mut(), c => c.poll_stream(self.call))?;
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        Some(r)
    }
}

impl<T: Message + Default> Iterator for Streaming<'_, T> {
    type Item = Result<T, Status>;

    fn next(&mut self) -> Option<Result<T, Status>> {
        self.message().transpose()
    }
}

impl<T> Drop for Streaming<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            with_core!(&mut *self.client.core.borrow_mut(), c => c.abandon_stream(self.call));
        }
    }
}

#[cfg(test)]
mod tests {
    fn sendable<T: Send>() {}

    #[test]
    fn client_and_responder_are_send() {
        sendable::<super::Client>();
        sendable::<crate::codegen::Responder<()>>();
    }
}
