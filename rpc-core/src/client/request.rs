//! How a request reaches a generated stub, and the hints a stub's misuse gets from the compiler.
//!
//! [`IntoRequest`] is the one calling convention of every stub method that takes a request: the
//! blocking stub over a [`Client`](crate::Client) and the stub over a
//! [`Channel`](crate::Channel) both accept the message by value (`stub.say_hello(req)`) or by
//! reference (`stub.say_hello(&req)`), so moving code from one to the other changes no call
//! site. Neither form costs anything over the other where the message is encoded at once (every
//! blocking call, and a `Channel` call whose session is free); a `Channel` call that must queue
//! keeps the message until its session encodes it, and takes it by moving a value or cloning a
//! reference (the only case where a reference costs a clone).
//!
//! [`SharedSession`] is what makes a stub `Clone`: only the `Channel` is, and a stub over a
//! blocking `Client` that is made to clone is refused with a hint toward `connect_channel`.

use std::marker::PhantomData;

/// A request message given to a generated stub: the message itself (`T`) or a reference to it
/// (`&T`).
///
/// Sealed: implemented by this crate only, so that per-call request metadata (a `Request<T>`
/// wrapping the message with its metadata, in tonic's shape) can later be accepted by the same
/// stub methods through this trait without changing them or any call site that passes a message.
/// Its functions take no `self` receiver, so that having the trait in scope (through
/// `use rpc_core::codegen::*`) adds no method to any type: call them as
/// `IntoRequest::message(&req)`.
///
/// ```
/// # #[derive(Clone, PartialEq, prost::Message)] struct Ping { #[prost(uint32, tag = "1")] n: u32 }
/// use rpc_core::client::IntoRequest;
/// fn takes(req: impl IntoRequest<Ping>) -> u32 {
///     IntoRequest::message(&req).n
/// }
/// let ping = Ping { n: 7 };
/// assert_eq!(takes(&ping), 7); // by reference
/// assert_eq!(takes(ping), 7); // by value
/// ```
pub trait IntoRequest<T>: Sized + sealed::Sealed<T> {
    /// The message, to encode at once.
    fn message(request: &Self) -> &T;

    /// The message as a value, for a call that keeps it until it can be encoded: moved when
    /// given by value, cloned when given by reference.
    fn into_message(request: Self) -> T;

    /// The options of the call: `options` as they are, or, for a [`Request`] with metadata, a
    /// copy carrying that metadata (the request's entries replace what `options` had).
    #[inline]
    fn options<'a>(
        request: &Self,
        options: &'a crate::CallOptions,
    ) -> std::borrow::Cow<'a, crate::CallOptions> {
        let _ = request;
        std::borrow::Cow::Borrowed(options)
    }
}

/// A request message with its call's metadata, in tonic's shape: what a generated stub takes
/// when the call sends metadata (`stub.say_hello(Request::new(msg))` after
/// `request.metadata_mut().insert("authorization", "Bearer ...")`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request<T> {
    message: T,
    metadata: crate::metadata::Metadata,
}

impl<T> Request<T> {
    /// `message` with no metadata yet.
    pub fn new(message: T) -> Request<T> {
        Request { message, metadata: crate::metadata::Metadata::new() }
    }

    /// The metadata sent with the call.
    pub fn metadata(&self) -> &crate::metadata::Metadata {
        &self.metadata
    }

    /// The metadata, to add entries to.
    pub fn metadata_mut(&mut self) -> &mut crate::metadata::Metadata {
        &mut self.metadata
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, to change it.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// The message, the metadata dropped.
    pub fn into_inner(self) -> T {
        self.message
    }
}

impl<T> sealed::Sealed<T> for Request<T> {}

impl<T> IntoRequest<T> for Request<T> {
    #[inline]
    fn message(request: &Self) -> &T {
        &request.message
    }

    #[inline]
    fn into_message(request: Self) -> T {
        request.message
    }

    fn options<'a>(
        request: &Self,
        options: &'a crate::CallOptions,
    ) -> std::borrow::Cow<'a, crate::CallOptions> {
        if request.metadata.is_empty() {
            return std::borrow::Cow::Borrowed(options);
        }
        std::borrow::Cow::Owned(options.clone().with_metadata(request.metadata.clone()))
    }
}

impl<T> sealed::Sealed<T> for T {}
impl<T: Clone> sealed::Sealed<T> for &T {}

impl<T> IntoRequest<T> for T {
    #[inline]
    fn message(request: &Self) -> &T {
        request
    }

    #[inline]
    fn into_message(request: Self) -> T {
        request
    }
}

impl<T: Clone> IntoRequest<T> for &T {
    #[inline]
    fn message(request: &Self) -> &T {
        request
    }

    #[inline]
    fn into_message(request: Self) -> T {
        request.clone()
    }
}

mod sealed {
    /// Keeps [`IntoRequest`](super::IntoRequest) implemented by this crate only.
    pub trait Sealed<T> {}
}

/// A session a generated stub can be cloned over, and so shared by any number of threads and
/// tokio tasks: the [`Channel`](crate::Channel). A [`Client`](crate::Client) is one session
/// driven by one thread at a time; a stub over it is neither `Clone` nor `Sync`, and asking for
/// either names the way out:
///
/// ```compile_fail,E0277
/// fn needs_shared<C: rpc_core::client::SharedSession>() {}
/// needs_shared::<rpc_core::Client>();
/// // error[E0277]: a stub over a blocking `Client` cannot be cloned or shared across threads or
/// //   tokio tasks
/// //  = note: connect a `Channel` instead (`XxxClient::connect_channel(addr).await`): its stub
/// //    is `Clone + Send + Sync` and its calls' futures are `Send + 'static`
/// ```
///
/// (A generated stub is `Clone` where its session is `SharedSession`: `#[derive(Clone)]` on a
/// struct holding a blocking stub gets that error.)
///
/// Sharing a blocking stub between threads (`Arc`, `&`) is refused with an error that names
/// [`ToShareAcrossThreadsConnectAChannel`]:
///
/// ```compile_fail,E0277
/// fn spawn_with(client: std::sync::Arc<rpc_core::Client>) {
///     std::thread::spawn(move || drop(client));
///     // error[E0277]: `dyn ToShareAcrossThreadsConnectAChannel + Send + Unpin` cannot be
///     //   shared between threads safely
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "a stub over a blocking `{Self}` cannot be cloned or shared across threads or tokio tasks",
    label = "a `{Self}` is one session driven by one thread at a time",
    note = "connect a `Channel` instead (`XxxClient::connect_channel(addr).await`): its stub is `Clone + Send + \
            Sync` and its calls' futures are `Send + 'static`",
    note = "or open one blocking client per thread (`XxxClient::connect(addr)` in each)"
)]
pub trait SharedSession: Clone + Send + Sync + sealed_session::Sealed {}

impl SharedSession for crate::Channel {}
impl sealed_session::Sealed for crate::Channel {}

mod sealed_session {
    /// Keeps [`SharedSession`](super::SharedSession) implemented by this crate only.
    pub trait Sealed {}
}

/// Named by the compiler when a blocking [`Client`](crate::Client) (or a stub over it) is shared
/// between threads or tokio tasks: `dyn ToShareAcrossThreadsConnectAChannel + Send + Unpin
/// cannot be shared between threads safely`. A `Client` is one session driven by one thread at
/// a time (`Send`, not `Sync`); to share calls among threads or tasks, connect a
/// [`Channel`](crate::Channel) (`XxxClient::connect_channel(addr).await`, `Clone + Send + Sync`),
/// or open one `Client` per thread. Never implemented: it exists for its name.
pub trait ToShareAcrossThreadsConnectAChannel {}

/// A zero-sized field of [`Client`](crate::Client) that is not `Sync`, so that the compiler's
/// complaint about sharing a client names [`ToShareAcrossThreadsConnectAChannel`] besides the
/// client's inner `RefCell`. `Send` and `Unpin`, so that it changes none of the client's other
/// auto traits (neither `UnwindSafe` nor `RefUnwindSafe` already).
pub(crate) type NotSyncHint = PhantomData<dyn ToShareAcrossThreadsConnectAChannel + Send + Unpin>;
