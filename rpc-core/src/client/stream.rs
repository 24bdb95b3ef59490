//! Client-streaming and bidirectional calls on a [`Client`]: the caller pushes its messages with
//! `send` (which waits for the server's stream grants: a server that stops reading stalls the
//! caller here, and memory stays bounded by those grants), ends them cleanly with `finish`, and
//! takes the answer (client streaming) or the server's messages (bidirectional). Dropping the
//! call before its end cancels it; the call's timeout is the whole stream's deadline.

use std::marker::PhantomData;
use std::time::Instant;

use prost::Message;

use super::core::{CallId, StartMode};
use super::{with_calls, AnyCalls, CallOptions, Client, StreamObs, Streaming};
use crate::codegen::MethodId;
use crate::status::Status;
use crate::wire::{STREAM_IN, STREAM_OUT};

impl Client {
    /// Opens a client stream to method `id` (a client-streaming method; generated stubs call
    /// this): send its messages with [`ClientStreaming::send`], then
    /// [`ClientStreaming::finish`] for the answer. `opts`' timeout is the deadline of the whole
    /// stream.
    ///
    /// # Errors
    /// As [`Client::server_stream`].
    pub fn client_stream<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        opts: &CallOptions,
    ) -> Result<ClientStreaming<'_, Req, Resp>, Status> {
        let ((call, epoch), observed) = self.open_observed(id, opts, STREAM_IN)?;
        Ok(ClientStreaming { client: self, call, epoch, done: false, observed, _t: PhantomData })
    }

    /// Opens a bidirectional stream to method `id`: send with [`BidiStreaming::send`], end the
    /// caller's messages with [`BidiStreaming::finish`], take the server's with
    /// [`BidiStreaming::message`] (in any interleaving). `opts`' timeout is the deadline of the
    /// whole stream.
    ///
    /// # Errors
    /// As [`Client::server_stream`].
    pub fn bidi_stream<Req: Message, Resp: Message + Default>(
        &self,
        id: MethodId,
        opts: &CallOptions,
    ) -> Result<BidiStreaming<'_, Req, Resp>, Status> {
        let ((call, epoch), observed) = self.open_observed(id, opts, STREAM_IN | STREAM_OUT)?;
        let rx = Streaming { client: self, call, epoch, done: false, observed, _t: PhantomData };
        Ok(BidiStreaming { rx, finished: false, end: None, _t: PhantomData })
    }

    /// [`Client::open_stream`], observed when `ClientConfig::observe` says so.
    #[allow(clippy::type_complexity)]
    fn open_observed(
        &self,
        id: MethodId,
        opts: &CallOptions,
        flags: u8,
    ) -> Result<((CallId, u64), Option<Box<StreamObs>>), Status> {
        if !self.observe.any() {
            return self.open_stream(id, opts, flags).map(|s| (s, None));
        }
        let (obs, traced) = self.observe_call(id, &(), opts);
        let (s, o) = StreamObs::opened(obs, self.open_stream(id, traced.as_ref().unwrap_or(opts), flags))?;
        Ok((s, Some(o)))
    }

    /// Sends the (empty) request that opens a stream with `flags`.
    fn open_stream(&self, id: MethodId, opts: &CallOptions, flags: u8) -> Result<(CallId, u64), Status> {
        let mut inner = self.inner.borrow_mut();
        inner.ensure_session()?;
        let deadline = opts.effective_timeout().map(|t| Instant::now() + t);
        let md = crate::metadata::intercepted(opts.metadata(), inner.config.interceptor.as_ref())?;
        let open = crate::metadata::WithMetadata::new(&(), md.as_deref());
        let flags = flags | open.flags();
        let started = with_calls!(&mut inner.calls, c => c.core.start_with(id, &open, deadline, StartMode::Now, flags, opts.capture()))?;
        let Some(call) = started else {
            return Err(Status::resource_exhausted(
                "every slot of the client's window (ClientConfig::window) is taken: a stream needs a free one \
                 (streams do not wait in the call queue)",
            ));
        };
        Ok((call, inner.epoch))
    }

    /// Sends `msg` on the stream `call` of session `epoch`.
    fn stream_send<M: Message>(&self, call: CallId, epoch: u64, msg: &M, wait: bool) -> Result<bool, Status> {
        let mut inner = self.inner.borrow_mut();
        if inner.epoch != epoch {
            return Err(inner.ended_status(epoch));
        }
        with_calls!(&mut inner.calls, c => c.core.stream_send(call, msg, wait))
    }

    fn stream_finish(&self, call: CallId, epoch: u64) {
        let mut inner = self.inner.borrow_mut();
        if inner.epoch == epoch {
            with_calls!(&mut inner.calls, c => c.core.stream_finish(call));
        }
    }
}

/// A client-streaming call on a [`Client`] ([`Client::client_stream`]): the caller's messages,
/// then the server's one answer. Dropping it before [`ClientStreaming::finish`] returns cancels
/// the call (the server's reader sees it cancelled, not ended).
pub struct ClientStreaming<'a, Req, Resp> {
    client: &'a Client,
    call: CallId,
    epoch: u64,
    done: bool,
    /// The call's span and metrics (`ClientConfig::observe`), until its answer.
    observed: Option<Box<StreamObs>>,
    _t: PhantomData<fn(Req) -> Resp>,
}

impl<Req: Message, Resp: Message + Default> ClientStreaming<'_, Req, Resp> {
    /// Sends one message, after the ones sent before. Blocks (progressing the session per the
    /// client's polling policy) while the server's stream grants are used up: a server that
    /// stops reading stalls the caller here.
    ///
    /// # Errors
    /// FAILED_PRECONDITION when the server answered already ([`ClientStreaming::finish`] gives
    /// its answer); DEADLINE_EXCEEDED at the stream's deadline (the call is cancelled);
    /// RESOURCE_EXHAUSTED for a message over `max_message_size`, or for one above the eager
    /// threshold when the connection's send mirror or staging area cannot be registered (naming
    /// which; nothing of it is sent, the stream goes on); UNAVAILABLE when the session
    /// broke.
    pub fn send(&mut self, msg: &Req) -> Result<(), Status> {
        self.send_inner(msg, true).map(|_| ())
    }

    /// Sends one message if a stream grant is free now: `Ok(false)` (nothing sent) otherwise.
    ///
    /// # Errors
    /// As [`ClientStreaming::send`].
    pub fn try_send(&mut self, msg: &Req) -> Result<bool, Status> {
        self.send_inner(msg, false)
    }

    fn send_inner(&mut self, msg: &Req, wait: bool) -> Result<bool, Status> {
        if self.done {
            return Err(Status::failed_precondition("the stream is over"));
        }
        let r = self.client.stream_send(self.call, self.epoch, msg, wait);
        if r.as_ref().is_err_and(|s| s.code() == crate::status::Code::DeadlineExceeded) {
            self.done = true;
            StreamObs::ended(self.observed.take(), crate::status::Code::DeadlineExceeded);
        }
        r
    }

    /// Ends the caller's messages cleanly (a StreamEnd after the last one, distinct from a
    /// cancel) and waits for the server's answer.
    ///
    /// # Errors
    /// The server's status; DEADLINE_EXCEEDED at the stream's deadline; UNAVAILABLE when the
    /// session broke.
    pub fn finish(mut self) -> Result<Resp, Status> {
        let observed = self.observed.take();
        let r = self.finish_plain();
        StreamObs::answered(observed, &r);
        r
    }

    fn finish_plain(&mut self) -> Result<Resp, Status> {
        if self.done {
            return Err(Status::deadline_exceeded("the stream's deadline passed before its end"));
        }
        self.done = true;
        let mut inner = self.client.inner.borrow_mut();
        if inner.epoch != self.epoch {
            return Err(inner.ended_status(self.epoch));
        }
        with_calls!(&mut inner.calls, c => {
            c.core.stream_finish(self.call);
            c.core.wait::<Resp>(self.call)
        })
    }
}

impl<Req, Resp> Drop for ClientStreaming<'_, Req, Resp> {
    fn drop(&mut self) {
        if !self.done {
            let mut inner = self.client.inner.borrow_mut();
            if inner.epoch == self.epoch {
                with_calls!(&mut inner.calls, c => c.core.abandon_stream(self.call));
            }
        }
    }
}

/// A bidirectional call on a [`Client`] ([`Client::bidi_stream`]): the caller's messages and
/// the server's, in any interleaving, in one thread. Dropping it before the server's end
/// cancels the call.
///
/// One thread drives both directions: a caller that only sends while the server only answers
/// (and never reads) stalls once both sides' stream grants are used up, so interleave
/// [`BidiStreaming::try_message`] or [`BidiStreaming::message`] with the sends when the server
/// answers as it reads.
pub struct BidiStreaming<'a, Req, Resp> {
    rx: Streaming<'a, Resp>,
    finished: bool,
    /// The stream's end a send saw first (its deadline): the reading half reports it once.
    end: Option<Status>,
    _t: PhantomData<fn(Req)>,
}

impl<Req: Message, Resp: Message + Default> BidiStreaming<'_, Req, Resp> {
    /// Sends one message, after the ones sent before; blocks while the server's stream grants
    /// are used up (as [`ClientStreaming::send`]). The server's messages that arrive meanwhile
    /// wait for [`BidiStreaming::message`].
    ///
    /// # Errors
    /// As [`ClientStreaming::send`]; FAILED_PRECONDITION after [`BidiStreaming::finish`].
    pub fn send(&mut self, msg: &Req) -> Result<(), Status> {
        self.send_inner(msg, true).map(|_| ())
    }

    /// Sends one message if a stream grant is free now: `Ok(false)` (nothing sent) otherwise.
    ///
    /// # Errors
    /// As [`BidiStreaming::send`].
    pub fn try_send(&mut self, msg: &Req) -> Result<bool, Status> {
        self.send_inner(msg, false)
    }

    fn send_inner(&mut self, msg: &Req, wait: bool) -> Result<bool, Status> {
        if self.rx.done {
            return Err(Status::failed_precondition("the stream is over"));
        }
        let r = self.rx.client.stream_send(self.rx.call, self.rx.epoch, msg, wait);
        if let Err(s) = &r {
            if s.code() == crate::status::Code::DeadlineExceeded {
                self.rx.done = true;
                self.end = Some(s.clone());
                StreamObs::ended(self.rx.observed.take(), crate::status::Code::DeadlineExceeded);
            }
        }
        r
    }

    /// Ends the caller's messages cleanly (a StreamEnd after the last one, distinct from a
    /// cancel); the server's messages still come. A second call does nothing.
    pub fn finish(&mut self) {
        if !std::mem::replace(&mut self.finished, true) && !self.rx.done {
            self.rx.client.stream_finish(self.rx.call, self.rx.epoch);
        }
    }

    /// Blocks for the server's next message: `Ok(Some(m))`, or `Ok(None)` at the stream's clean
    /// end (the server finished it with OK).
    ///
    /// # Errors
    /// As [`Streaming::message`]; DEADLINE_EXCEEDED (once) when a send saw the stream's deadline
    /// first: the reading half never takes a deadline for a clean end.
    pub fn message(&mut self) -> Result<Option<Resp>, Status> {
        if let Some(e) = self.end.take() {
            return Err(e);
        }
        self.rx.message()
    }

    /// Polls once without blocking: `None` while no message and no end is there.
    pub fn try_message(&mut self) -> Option<Result<Option<Resp>, Status>> {
        if let Some(e) = self.end.take() {
            return Some(Err(e));
        }
        self.rx.try_message()
    }
}
