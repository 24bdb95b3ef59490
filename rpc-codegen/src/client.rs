//! `<service>_client`: the stub, generic over the session under it. Over the runtime's `Client`
//! (the default) it has per RPC a blocking call, a `_with` variant taking `CallOptions`, and an
//! `_async` call; over a `Channel` (the shareable handle) per RPC a call returning a
//! `Send + 'static` future and its `_with` variant.

use std::fmt::Write as _;

use crate::generator::{variant_name, write_comments, RpcModel, ServiceModel};
use crate::names::Scope;

/// Appends the `<service>_client` module of `model` to `buf`.
pub fn generate(model: &ServiceModel<'_>, buf: &mut String) {
    let stub = format!("{}Client", model.type_stem);

    // Method names: the RPCs' own names win, then their variants, then the stub's own methods; a
    // taken name gets `_` appended (an RPC `Connect` leaves the constructor `connect_`).
    let mut scope = Scope::default();
    let blocking: Vec<String> = model.rpcs.iter().map(|rpc| scope.claim(&rpc.method.name)).collect();
    let with: Vec<String> =
        model.rpcs.iter().map(|rpc| scope.claim(&variant_name(&rpc.method.proto_name, "_with"))).collect();
    let asynchronous: Vec<String> =
        model.rpcs.iter().map(|rpc| scope.claim(&variant_name(&rpc.method.proto_name, "_async"))).collect();
    let streams: Vec<StreamNames> =
        StreamShape::ALL.iter().map(|shape| StreamNames::claim(&mut scope, shape.rpcs(model))).collect();
    let connect = scope.claim("connect");
    let connect_with = scope.claim("connect_with");
    let new = scope.claim("new");
    let client_ref = scope.claim("client");
    let into_client = scope.claim("into_client");
    let connect_channel = scope.claim("connect_channel");
    let connect_channel_with = scope.claim("connect_channel_with");
    let from_channel = scope.claim("from_channel");
    let channel_ref = scope.claim("channel");
    let into_request = model.client_facade("IntoRequest");

    let _ = writeln!(
        buf,
        "/// Client side of `{}`: the stub [`{stub}`]({}_client::{stub}).",
        model.full_name, model.module_stem
    );
    let _ = writeln!(buf, "pub mod {}_client {{", model.module_stem);
    buf.push_str(crate::generator::ALLOW_USER_NAMES);
    buf.push_str("use rpc_core::codegen::*;\n");
    model.write_consts(buf, &model.client_facade("MethodId"));
    write_names(model, buf);

    write_comments(&model.service.comments, buf);
    if model.service.comments.leading.is_empty() && model.service.comments.trailing.is_empty() {
        let _ = writeln!(buf, "/// Calls the RPCs of `{}`.", model.full_name);
    }
    buf.push_str(
        "///\n/// Over a `Client` (the default): one session to one server, `Send` but not `Sync`: open \
         one per\n/// thread (to share calls among tokio tasks, connect a `Channel` instead: \
         `connect_channel`).\n/// Blocking calls busy-poll in the calling thread; `_async` calls return a \
         future that\n/// progresses when polled (no executor needed). The lowest latency.\n///\n\
         /// Over a `Channel`: `Clone + Send + Sync`, shared by any number of tasks; calls return \
         `Send +\n/// 'static` futures woken by the channel's dispatcher threads.\n///\n/// Both take \
         requests by value or by reference (`stub.call(req)` or `stub.call(&req)`,\n/// \
         `IntoRequest`), so switching between them changes no call site.\n",
    );
    // Not `derive(Clone)`: only the stub over a `Channel` is `Clone` (a `Client` is one session
    // of one thread); the bound `SharedSession` makes the compiler say so when one is asked of a
    // stub over a `Client`.
    buf.push_str("#[derive(Debug)]\n");
    let _ = writeln!(buf, "pub struct {stub}<C = Client> {{");
    buf.push_str("inner: C,\n}\n");

    let _ = writeln!(buf, "impl {stub}<Client> {{");
    let _ = writeln!(
        buf,
        "/// Connects to the server at `addr` with the default client configuration.
        ///
        /// # Errors
        /// `UNAVAILABLE` when no server answers there; the connection's other failures as
        /// `Client::connect` reports them.
        pub fn {connect}(addr: impl ::std::net::ToSocketAddrs) -> ::core::result::Result<Self, Status> {{
            __rpc_register_names();
            ::core::result::Result::Ok(Self {{ inner: Client::connect(addr)? }})
        }}
        /// Connects to the server at `addr` with `config`.
        ///
        /// # Errors
        /// As `{connect}`, plus an invalid configuration.
        pub fn {connect_with}(addr: impl ::std::net::ToSocketAddrs, config: &ClientConfig) -> ::core::result::Result<Self, Status> {{
            __rpc_register_names();
            ::core::result::Result::Ok(Self {{ inner: Client::connect_with(addr, config)? }})
        }}
        /// Uses an open session (which other stubs may have used before).
        pub fn {new}(client: Client) -> Self {{
            __rpc_register_names();
            Self {{ inner: client }}
        }}
        /// The session under this stub.
        pub fn {client_ref}(&self) -> &Client {{
            &self.inner
        }}
        /// Gives the session back, for use with another stub.
        pub fn {into_client}(self) -> Client {{
            self.inner
        }}"
    );
    for (i, rpc) in model.rpcs.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        write_comments(&rpc.method.comments, buf);
        if rpc.method.comments.leading.is_empty() && rpc.method.comments.trailing.is_empty() {
            let _ = writeln!(buf, "/// Calls `{}` and waits for the reply.", rpc.full_name);
        } else {
            let _ = writeln!(buf, "///\n/// Calls `{}` and waits for the reply.", rpc.full_name);
        }
        let _ = writeln!(
            buf,
            "///
            /// # Errors
            /// The status the server answered, or the transport's (`UNAVAILABLE`, ...).
            pub fn {name}(&self, request: impl {into_request}<{input}>) -> ::core::result::Result<{output}, Status> {{
                self.inner.unary({id}, {into_request}::message(&request), &{into_request}::options(&request, &<CallOptions as ::core::default::Default>::default()))
            }}
            /// Calls `{full}` with `options` (a deadline, ...) and waits for the reply.
            ///
            /// # Errors
            /// As `{name}`, plus `DEADLINE_EXCEEDED`.
            pub fn {with_name}(&self, request: impl {into_request}<{input}>, options: &CallOptions) -> ::core::result::Result<{output}, Status> {{
                self.inner.unary({id}, {into_request}::message(&request), &{into_request}::options(&request, options))
            }}
            /// Calls `{full}` without waiting: the future resolves to the reply when polled (the
            /// request is encoded now).
            pub fn {async_name}(&self, request: impl {into_request}<{input}>) -> ResponseFuture<'_, {output}> {{
                self.inner.unary_async({id}, {into_request}::message(&request), &{into_request}::options(&request, &<CallOptions as ::core::default::Default>::default()))
            }}",
            name = blocking[i],
            with_name = with[i],
            async_name = asynchronous[i],
            full = rpc.full_name,
        );
    }
    write_stream_stubs(model, &streams, Session::Client, buf);
    buf.push_str("}\n");
    write_from(buf, &stub, "Client", "client");

    let _ = writeln!(buf, "impl {stub}<Channel> {{");
    let _ = writeln!(
        buf,
        "/// Opens a shareable channel to the server at `addr` with the default channel configuration
        /// (the sessions are opened on the channel's dispatcher threads: awaiting this does not
        /// block the executor).
        ///
        /// # Errors
        /// As `Channel::connect`.
        pub async fn {connect_channel}<A>(addr: A) -> ::core::result::Result<Self, Status>
        where
            A: ::std::net::ToSocketAddrs + ::core::clone::Clone + ::core::marker::Send + 'static,
        {{
            __rpc_register_names();
            ::core::result::Result::Ok(Self {{ inner: Channel::connect(addr).await? }})
        }}
        /// Opens a shareable channel to the server at `addr` with `config`.
        ///
        /// # Errors
        /// As `Channel::connect_with`.
        pub async fn {connect_channel_with}<A>(addr: A, config: &ChannelConfig) -> ::core::result::Result<Self, Status>
        where
            A: ::std::net::ToSocketAddrs + ::core::clone::Clone + ::core::marker::Send + 'static,
        {{
            __rpc_register_names();
            ::core::result::Result::Ok(Self {{ inner: Channel::connect_with(addr, config).await? }})
        }}
        /// Uses an open channel (which other stubs may share).
        pub fn {from_channel}(channel: Channel) -> Self {{
            __rpc_register_names();
            Self {{ inner: channel }}
        }}
        /// The channel under this stub.
        pub fn {channel_ref}(&self) -> &Channel {{
            &self.inner
        }}"
    );
    for (i, rpc) in model.rpcs.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        let _ = writeln!(
            buf,
            "/// Calls `{full}`: the future (`Send + 'static`) resolves to the reply; dropping it
            /// cancels the call.
            pub fn {name}(&self, request: impl {into_request}<{input}>) -> UnaryCall<{output}> {{
                self.inner.unary({id}, request, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Calls `{full}` with `options` (a deadline, ...).
            pub fn {with_name}(&self, request: impl {into_request}<{input}>, options: &CallOptions) -> UnaryCall<{output}> {{
                self.inner.unary({id}, request, options)
            }}",
            name = blocking[i],
            with_name = with[i],
            full = rpc.full_name,
        );
    }
    write_stream_stubs(model, &streams, Session::Channel, buf);
    buf.push_str("}\n");
    write_from(buf, &stub, "Channel", "channel");
    let _ = writeln!(
        buf,
        "impl<C: {shared}> ::core::clone::Clone for {stub}<C> {{
            /// Another handle on the same channel (its sessions are shared).
            fn clone(&self) -> Self {{
                Self {{ inner: ::core::clone::Clone::clone(&self.inner) }}
            }}
        }}",
        shared = model.client_facade("SharedSession"),
    );
    buf.push_str("}\n");
}

/// Appends the table of the service's method names and the function that registers it once per
/// process (every constructor of the stub calls it), so that an UNIMPLEMENTED from a server
/// that does not serve a method names it (`rpc_core::codegen::register_method_names`).
fn write_names(model: &ServiceModel<'_>, buf: &mut String) {
    // Through the glob import, as the rest of the module: a full path here trips the user's
    // `unused_qualifications`.
    let method_desc = model.client_facade("MethodDesc");
    let register = model.client_facade("register_method_names");
    let _ = write!(
        buf,
        "/// The names of the service's methods, for the client's errors.\n\
         static __RPC_METHOD_NAMES: &[{method_desc}] = &["
    );
    for rpc in model.all() {
        let _ = write!(buf, "{method_desc} {{ id: {}, name: {:?} }},", rpc.id_const, rpc.full_name);
    }
    let _ = write!(
        buf,
        "];\n\
         /// Registers `__RPC_METHOD_NAMES` (once per process).\n\
         fn __rpc_register_names() {{\n\
         static ONCE: ::std::sync::Once = ::std::sync::Once::new();\n\
         ONCE.call_once(|| {register}(__RPC_METHOD_NAMES));\n\
         }}\n"
    );
}

/// Appends `impl From<session> for stub<session>` (`session` the facade type, `var` its
/// parameter's name).
fn write_from(buf: &mut String, stub: &str, session: &str, var: &str) {
    let _ = writeln!(
        buf,
        "impl ::core::convert::From<{session}> for {stub}<{session}> {{
            fn from({var}: {session}) -> Self {{
                __rpc_register_names();
                Self {{ inner: {var} }}
            }}
        }}"
    );
}

/// What a stub is over; its two `impl` blocks open the same streams with different types and docs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Session {
    /// The runtime's `Client`: blocking opens returning `Result<facade, Status>`, with `# Errors`.
    Client,
    /// The shareable `Channel`: opens returning the facade's `Send + 'static` halves.
    Channel,
}

/// The streaming shapes of an RPC, in the order the stubs list them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StreamShape {
    /// One request, a stream of replies (`server_stream`).
    Server,
    /// A stream of requests, one reply (`client_stream`).
    Client,
    /// A stream each way (`bidi_stream`).
    Bidi,
}

impl StreamShape {
    const ALL: [Self; 3] = [Self::Server, Self::Client, Self::Bidi];

    /// The RPCs of `model` with this shape, in declaration order.
    fn rpcs<'m, 'a>(self, model: &'m ServiceModel<'a>) -> &'m [RpcModel<'a>] {
        match self {
            Self::Server => &model.server_streams,
            Self::Client => &model.client_streams,
            Self::Bidi => &model.bidi_streams,
        }
    }

    /// The session's method that opens a stream of this shape.
    fn open(self) -> &'static str {
        match self {
            Self::Server => "server_stream",
            Self::Client => "client_stream",
            Self::Bidi => "bidi_stream",
        }
    }

    /// How the docs name the stream.
    fn noun(self) -> &'static str {
        match self {
            Self::Server => "server stream",
            Self::Client => "client stream",
            Self::Bidi => "bidirectional stream",
        }
    }

    /// The doc text after `"Opens the <noun> <full name>: "`, lines joined by `\n/// `.
    fn about(self, session: Session) -> &'static str {
        match (session, self) {
            (Session::Client, Self::Server) => {
                "its messages, in order, as the returned\n/// `Streaming` yields them (taking one returns \
                 its credit to the server; dropping the\n/// stream early cancels it)."
            }
            (Session::Client, Self::Client) => {
                "`send` its messages (each waits for the server's\n/// credits), then `finish` for the \
                 answer; dropping it before cancels the call."
            }
            (Session::Client, Self::Bidi) => {
                "`send` and `finish` the caller's messages,\n/// take the server's with `message`, in any \
                 interleaving; dropping it before the end\n/// cancels the call."
            }
            (Session::Channel, Self::Server) => {
                "`message().await` yields its messages; dropping\n/// the receiver early cancels the stream."
            }
            (Session::Channel, Self::Client) => {
                "`send(..).await` its messages, then\n/// `finish().await` for the answer; dropping it \
                 before cancels the call."
            }
            (Session::Channel, Self::Bidi) => {
                "the caller's messages go into the sender\n/// (`send(..).await`, `finish()`), the server's \
                 come from the receiver; each half may\n/// move to its own task. Dropping the sender \
                 ends the caller's messages (as\n/// `finish()`); dropping the receiver before the end \
                 cancels the call."
            }
        }
    }

    /// The doc text after "with `options` " of the `_with` variant.
    fn with_options(self) -> &'static str {
        match self {
            Self::Server | Self::Client => "(a deadline for the whole stream, ...).",
            Self::Bidi => "(a deadline for the whole\n/// stream, ...).",
        }
    }

    /// What a blocking open can fail with, besides the transport.
    fn start_errors(self) -> &'static str {
        match self {
            Self::Server => "a broken session, a request over the size limit",
            Self::Client | Self::Bidi => "a broken session, every slot taken",
        }
    }

    /// The type an open over `session` returns for `rpc` (inside the `Result` over a `Client`).
    fn returns(self, session: Session, model: &ServiceModel<'_>, rpc: &RpcModel<'_>) -> String {
        let (input, output) = (&rpc.input, &rpc.output);
        match (session, self) {
            (Session::Client, Self::Server) => format!("{}<'_, {output}>", model.client_facade("Streaming")),
            (Session::Client, Self::Client) => {
                format!("{}<'_, {input}, {output}>", model.client_facade("ClientStreaming"))
            }
            (Session::Client, Self::Bidi) => {
                format!("{}<'_, {input}, {output}>", model.client_facade("BidiStreaming"))
            }
            (Session::Channel, Self::Server) => {
                format!("{}<{output}>", model.client_facade("StreamReceiver"))
            }
            (Session::Channel, Self::Client) => {
                format!("{}<{input}, {output}>", model.client_facade("ClientStreamCall"))
            }
            (Session::Channel, Self::Bidi) => format!(
                "({}<{input}>, {}<{output}>)",
                model.client_facade("StreamSender"),
                model.client_facade("StreamReceiver")
            ),
        }
    }
}

/// The stub's method names for the RPCs of one stream shape: the plain open and its `_with`
/// variant, per RPC in declaration order.
struct StreamNames {
    plain: Vec<String>,
    with: Vec<String>,
}

impl StreamNames {
    /// Claims the names in `scope`: every RPC's own name first, then the `_with` variants.
    fn claim(scope: &mut Scope, rpcs: &[RpcModel<'_>]) -> Self {
        let plain = rpcs.iter().map(|rpc| scope.claim(&rpc.method.name)).collect();
        let with =
            rpcs.iter().map(|rpc| scope.claim(&variant_name(&rpc.method.proto_name, "_with"))).collect();
        Self { plain, with }
    }
}

/// Appends, for every streaming RPC of `model` (server, client, then bidirectional streams), the
/// stub's two opens over `session`: with the default `CallOptions` and with given ones. `names`
/// holds the names claimed per shape, in [`StreamShape::ALL`] order.
fn write_stream_stubs(model: &ServiceModel<'_>, names: &[StreamNames], session: Session, buf: &mut String) {
    for (shape, names) in StreamShape::ALL.into_iter().zip(names) {
        for (i, rpc) in shape.rpcs(model).iter().enumerate() {
            let (id, full) = (&rpc.id_const, &rpc.full_name);
            let (name, with_name) = (&names.plain[i], &names.with[i]);
            let (noun, open, about, with_options) =
                (shape.noun(), shape.open(), shape.about(session), shape.with_options());
            // Only a server stream takes its request when it opens, by value or by reference on both
            // sessions: a `Client` encodes it at once, a `Channel` takes the `IntoRequest` itself.
            let into_request = model.client_facade("IntoRequest");
            let (param, arg) = match (shape, session) {
                (StreamShape::Server, Session::Client) => (
                    format!(", request: impl {into_request}<{}>", rpc.input),
                    format!(", {into_request}::message(&request)"),
                ),
                (StreamShape::Server, Session::Channel) => {
                    (format!(", request: impl {into_request}<{}>", rpc.input), ", request".to_owned())
                }
                _ => (String::new(), String::new()),
            };
            let returns = shape.returns(session, model, rpc);
            let plain_defaults = "&<CallOptions as ::core::default::Default>::default()";
            // A blocking server stream takes a `Request`'s metadata from its request.
            let (defaults, options) = if matches!((shape, session), (StreamShape::Server, Session::Client)) {
                (
                    format!("&{into_request}::options(&request, {plain_defaults})"),
                    format!("&{into_request}::options(&request, options)"),
                )
            } else {
                (plain_defaults.to_owned(), "options".to_owned())
            };
            match session {
                Session::Client => {
                    write_comments(&rpc.method.comments, buf);
                    let _ = writeln!(
                        buf,
                        "///
                        /// Opens the {noun} `{full}`: {about}
                        ///
                        /// # Errors
                        /// As a unary call's start ({errors}).
                        pub fn {name}(&self{param}) -> ::core::result::Result<{returns}, Status> {{
                            self.inner.{open}({id}{arg}, {defaults})
                        }}
                        /// Opens the {noun} `{full}` with `options` {with_options}
                        ///
                        /// # Errors
                        /// As `{name}`.
                        pub fn {with_name}(&self{param}, options: &CallOptions) -> ::core::result::Result<{returns}, Status> {{
                            self.inner.{open}({id}{arg}, {options})
                        }}",
                        errors = shape.start_errors(),
                    );
                }
                Session::Channel => {
                    let _ = writeln!(
                        buf,
                        "/// Opens the {noun} `{full}`: {about}
                        pub fn {name}(&self{param}) -> {returns} {{
                            self.inner.{open}({id}{arg}, {defaults})
                        }}
                        /// Opens the {noun} `{full}` with `options` {with_options}
                        pub fn {with_name}(&self{param}, options: &CallOptions) -> {returns} {{
                            self.inner.{open}({id}{arg}, options)
                        }}"
                    );
                }
            }
        }
    }
}
