//! `<service>_client`: the stub, generic over the session under it. Over the runtime's `Client`
//! (the default) it has per RPC a blocking call, a `_with` variant taking `CallOptions`, and an
//! `_async` call; over a `Channel` (the shareable handle) per RPC a call returning a
//! `Send + 'static` future and its `_with` variant.

use std::fmt::Write as _;

use crate::generator::{variant_name, write_comments, ServiceModel};
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
    let streams: Vec<String> = model.server_streams.iter().map(|rpc| scope.claim(&rpc.method.name)).collect();
    let streams_with: Vec<String> = model
        .server_streams
        .iter()
        .map(|rpc| scope.claim(&variant_name(&rpc.method.proto_name, "_with")))
        .collect();
    let ups: Vec<String> = model.client_streams.iter().map(|rpc| scope.claim(&rpc.method.name)).collect();
    let ups_with: Vec<String> = model
        .client_streams
        .iter()
        .map(|rpc| scope.claim(&variant_name(&rpc.method.proto_name, "_with")))
        .collect();
    let bidis: Vec<String> = model.bidi_streams.iter().map(|rpc| scope.claim(&rpc.method.name)).collect();
    let bidis_with: Vec<String> = model
        .bidi_streams
        .iter()
        .map(|rpc| scope.claim(&variant_name(&rpc.method.proto_name, "_with")))
        .collect();
    let streaming = model.facade("Streaming");
    let client_streaming = model.facade("ClientStreaming");
    let bidi_streaming = model.facade("BidiStreaming");
    let connect = scope.claim("connect");
    let connect_with = scope.claim("connect_with");
    let new = scope.claim("new");
    let client_ref = scope.claim("client");
    let into_client = scope.claim("into_client");
    let connect_channel = scope.claim("connect_channel");
    let connect_channel_with = scope.claim("connect_channel_with");
    let from_channel = scope.claim("from_channel");
    let channel_ref = scope.claim("channel");

    let _ = writeln!(
        buf,
        "/// Client side of `{}`: the stub [`{stub}`]({}_client::{stub}).",
        model.full_name, model.module_stem
    );
    let _ = writeln!(buf, "pub mod {}_client {{", model.module_stem);
    buf.push_str(crate::generator::ALLOW_USER_NAMES);
    buf.push_str("use rpc_core::codegen::*;\n");
    model.write_consts(buf);

    write_comments(&model.service.comments, buf);
    if model.service.comments.leading.is_empty() && model.service.comments.trailing.is_empty() {
        let _ = writeln!(buf, "/// Calls the RPCs of `{}`.", model.full_name);
    }
    buf.push_str(
        "///\n/// Over a `Client` (the default): one session to one server, `Send` but not `Sync`: open \
         one per\n/// thread. Blocking calls busy-poll in the calling thread; `_async` calls return a \
         future that\n/// progresses when polled (no executor needed). The lowest latency.\n///\n\
         /// Over a `Channel`: `Clone + Send + Sync`, shared by any number of tasks; calls return \
         `Send +\n/// 'static` futures woken by the channel's dispatcher threads.\n",
    );
    buf.push_str("#[derive(Clone, Debug)]\n");
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
            ::core::result::Result::Ok(Self {{ inner: Client::connect(addr)? }})
        }}
        /// Connects to the server at `addr` with `config`.
        ///
        /// # Errors
        /// As `{connect}`, plus an invalid configuration.
        pub fn {connect_with}(addr: impl ::std::net::ToSocketAddrs, config: &ClientConfig) -> ::core::result::Result<Self, Status> {{
            ::core::result::Result::Ok(Self {{ inner: Client::connect_with(addr, config)? }})
        }}
        /// Uses an open session (which other stubs may have used before).
        pub fn {new}(client: Client) -> Self {{
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
            pub fn {name}(&self, request: &{input}) -> ::core::result::Result<{output}, Status> {{
                self.inner.unary({id}, request, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Calls `{full}` with `options` (a deadline, ...) and waits for the reply.
            ///
            /// # Errors
            /// As `{name}`, plus `DEADLINE_EXCEEDED`.
            pub fn {with_name}(&self, request: &{input}, options: &CallOptions) -> ::core::result::Result<{output}, Status> {{
                self.inner.unary({id}, request, options)
            }}
            /// Calls `{full}` without waiting: the future resolves to the reply when polled.
            pub fn {async_name}(&self, request: &{input}) -> ResponseFuture<'_, {output}> {{
                self.inner.unary_async({id}, request, &<CallOptions as ::core::default::Default>::default())
            }}",
            name = blocking[i],
            with_name = with[i],
            async_name = asynchronous[i],
            full = rpc.full_name,
        );
    }
    for (i, rpc) in model.server_streams.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        write_comments(&rpc.method.comments, buf);
        let _ = writeln!(
            buf,
            "///
            /// Opens the server stream `{full}`: its messages, in order, as the returned
            /// `Streaming` yields them (taking one returns its credit to the server; dropping the
            /// stream early cancels it).
            ///
            /// # Errors
            /// As a unary call's start (a broken session, a request over the size limit).
            pub fn {name}(&self, request: &{input}) -> ::core::result::Result<{streaming}<'_, {output}>, Status> {{
                self.inner.server_stream({id}, request, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Opens the server stream `{full}` with `options` (a deadline for the whole stream, ...).
            ///
            /// # Errors
            /// As `{name}`.
            pub fn {with_name}(&self, request: &{input}, options: &CallOptions) -> ::core::result::Result<{streaming}<'_, {output}>, Status> {{
                self.inner.server_stream({id}, request, options)
            }}",
            name = streams[i],
            with_name = streams_with[i],
            full = rpc.full_name,
        );
    }
    for (i, rpc) in model.client_streams.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        write_comments(&rpc.method.comments, buf);
        let _ = writeln!(
            buf,
            "///
            /// Opens the client stream `{full}`: `send` its messages (each waits for the server's
            /// credits), then `finish` for the answer; dropping it before cancels the call.
            ///
            /// # Errors
            /// As a unary call's start (a broken session, every slot taken).
            pub fn {name}(&self) -> ::core::result::Result<{client_streaming}<'_, {input}, {output}>, Status> {{
                self.inner.client_stream({id}, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Opens the client stream `{full}` with `options` (a deadline for the whole stream, ...).
            ///
            /// # Errors
            /// As `{name}`.
            pub fn {with_name}(&self, options: &CallOptions) -> ::core::result::Result<{client_streaming}<'_, {input}, {output}>, Status> {{
                self.inner.client_stream({id}, options)
            }}",
            name = ups[i],
            with_name = ups_with[i],
            full = rpc.full_name,
        );
    }
    for (i, rpc) in model.bidi_streams.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        write_comments(&rpc.method.comments, buf);
        let _ = writeln!(
            buf,
            "///
            /// Opens the bidirectional stream `{full}`: `send` and `finish` the caller's messages,
            /// take the server's with `message`, in any interleaving; dropping it before the end
            /// cancels the call.
            ///
            /// # Errors
            /// As a unary call's start (a broken session, every slot taken).
            pub fn {name}(&self) -> ::core::result::Result<{bidi_streaming}<'_, {input}, {output}>, Status> {{
                self.inner.bidi_stream({id}, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Opens the bidirectional stream `{full}` with `options` (a deadline for the whole
            /// stream, ...).
            ///
            /// # Errors
            /// As `{name}`.
            pub fn {with_name}(&self, options: &CallOptions) -> ::core::result::Result<{bidi_streaming}<'_, {input}, {output}>, Status> {{
                self.inner.bidi_stream({id}, options)
            }}",
            name = bidis[i],
            with_name = bidis_with[i],
            full = rpc.full_name,
        );
    }
    buf.push_str("}\n");
    let _ = writeln!(
        buf,
        "impl ::core::convert::From<Client> for {stub}<Client> {{
            fn from(client: Client) -> Self {{
                Self {{ inner: client }}
            }}
        }}"
    );

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
            ::core::result::Result::Ok(Self {{ inner: Channel::connect_with(addr, config).await? }})
        }}
        /// Uses an open channel (which other stubs may share).
        pub fn {from_channel}(channel: Channel) -> Self {{
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
            pub fn {name}(&self, request: {input}) -> UnaryCall<{output}> {{
                self.inner.unary({id}, request, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Calls `{full}` with `options` (a deadline, ...).
            pub fn {with_name}(&self, request: {input}, options: &CallOptions) -> UnaryCall<{output}> {{
                self.inner.unary({id}, request, options)
            }}",
            name = blocking[i],
            with_name = with[i],
            full = rpc.full_name,
        );
    }
    let receiver = model.facade("StreamReceiver");
    let sender = model.facade("StreamSender");
    let client_call = model.facade("ClientStreamCall");
    for (i, rpc) in model.server_streams.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        let _ = writeln!(
            buf,
            "/// Opens the server stream `{full}`: `message().await` yields its messages; dropping
            /// the receiver early cancels the stream.
            pub fn {name}(&self, request: {input}) -> {receiver}<{output}> {{
                self.inner.server_stream({id}, request, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Opens the server stream `{full}` with `options` (a deadline for the whole stream, ...).
            pub fn {with_name}(&self, request: {input}, options: &CallOptions) -> {receiver}<{output}> {{
                self.inner.server_stream({id}, request, options)
            }}",
            name = streams[i],
            with_name = streams_with[i],
            full = rpc.full_name,
        );
    }
    for (i, rpc) in model.client_streams.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        let _ = writeln!(
            buf,
            "/// Opens the client stream `{full}`: `send(..).await` its messages, then
            /// `finish().await` for the answer; dropping it before cancels the call.
            pub fn {name}(&self) -> {client_call}<{input}, {output}> {{
                self.inner.client_stream({id}, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Opens the client stream `{full}` with `options` (a deadline for the whole stream, ...).
            pub fn {with_name}(&self, options: &CallOptions) -> {client_call}<{input}, {output}> {{
                self.inner.client_stream({id}, options)
            }}",
            name = ups[i],
            with_name = ups_with[i],
            full = rpc.full_name,
        );
    }
    for (i, rpc) in model.bidi_streams.iter().enumerate() {
        let (input, output, id) = (&rpc.input, &rpc.output, &rpc.id_const);
        let _ = writeln!(
            buf,
            "/// Opens the bidirectional stream `{full}`: the caller's messages go into the sender
            /// (`send(..).await`, `finish()`), the server's come from the receiver; each half may
            /// move to its own task. Dropping either before the end cancels the call.
            pub fn {name}(&self) -> ({sender}<{input}>, {receiver}<{output}>) {{
                self.inner.bidi_stream({id}, &<CallOptions as ::core::default::Default>::default())
            }}
            /// Opens the bidirectional stream `{full}` with `options` (a deadline for the whole
            /// stream, ...).
            pub fn {with_name}(&self, options: &CallOptions) -> ({sender}<{input}>, {receiver}<{output}>) {{
                self.inner.bidi_stream({id}, options)
            }}",
            name = bidis[i],
            with_name = bidis_with[i],
            full = rpc.full_name,
        );
    }
    buf.push_str("}\n");
    let _ = writeln!(
        buf,
        "impl ::core::convert::From<Channel> for {stub}<Channel> {{
            fn from(channel: Channel) -> Self {{
                Self {{ inner: channel }}
            }}
        }}"
    );
    buf.push_str("}\n");
}
