//! `<service>_server`: the trait users implement and the adapter that implements the runtime's
//! `Service` for it, dispatching on method-id constants.

use std::fmt::Write as _;

use crate::generator::{write_comments, ServiceModel, ALLOW_USER_NAMES};

/// Appends the `<service>_server` module of `model` to `buf`; with `asynchronous`, the trait's
/// methods return `Send` futures that the adapter runs on a tokio runtime; with `default_stubs`,
/// every trait method has a default body answering UNIMPLEMENTED (tonic-build's
/// `generate_default_stubs`), so an implementation writes only the methods it serves.
pub fn generate(model: &ServiceModel<'_>, buf: &mut String, asynchronous: bool, default_stubs: bool) {
    let trait_name = &model.trait_name;
    let adapter = format!("{}Server", model.type_stem);
    // The adapter's type parameter must not be the trait's own name.
    let param = ["T", "S", "Impl"].into_iter().find(|p| p != trait_name).unwrap_or("T");
    let status = model.facade("Status");
    let reply = model.facade("Reply");
    let ctx_ty = model.facade("RequestContext");
    let service = model.facade("Service");
    let method_desc = model.facade("MethodDesc");
    let method_id = model.facade("MethodId");
    let reply_writer = model.facade("ReplyWriter");
    let body_ty = model.facade("Body");
    let decode = model.facade("decode");
    let async_ctx = model.facade("AsyncContext");
    let async_rt = model.facade("AsyncRuntime");
    let spawn_async = model.facade("spawn_async");
    let sink_ty = model.facade("StreamSink");
    let requests_ty = model.facade("RequestStream");
    let responder_ty = model.facade("Responder");
    let spawn_stream = model.facade("spawn_async_stream");

    let _ = writeln!(
        buf,
        "/// Server side of `{full}`: implement [`{trait_name}`]({m}::{trait_name}), then serve it with \
         [`{adapter}`]({m}::{adapter}).",
        full = model.full_name,
        m = format_args!("{}_server", model.module_stem),
    );
    let _ = writeln!(buf, "pub mod {}_server {{", model.module_stem);
    // RPC names are the user's: `new`, `into_x`, `clone`, ... are valid RPCs, not conventions broken.
    buf.push_str(ALLOW_USER_NAMES);
    buf.push_str("use rpc_core::codegen::*;\n");
    model.write_consts(buf, &model.facade("MethodId"));

    let _ = writeln!(buf, "/// The full names of the methods, `\"/package.Service/Method\"`.");
    buf.push_str("pub mod method_names {\n");
    for rpc in model.all() {
        let _ = writeln!(buf, "/// `{}`.", rpc.full_name);
        let _ = writeln!(buf, "pub const {}: &str = \"{}\";", rpc.id_const, rpc.full_name);
    }
    buf.push_str("}\n");

    // The trait.
    write_comments(&model.service.comments, buf);
    if model.service.comments.leading.is_empty() && model.service.comments.trailing.is_empty() {
        let _ = writeln!(buf, "/// The RPCs of `{}`.", model.full_name);
    }
    if asynchronous {
        buf.push_str(
            "///\n/// Async handlers: each call's future is polled on the worker thread that received \
             the\n/// request (or spawned on a tokio runtime: `AsyncRuntime`); it is dropped when the \
             call's\n/// deadline passes. Implement the methods as `async fn`; never block the thread \
             in them.\n",
        );
    } else {
        buf.push_str(
            "///\n/// Handlers run inline on the worker thread that received the request: answer at once, \
             or\n",
        );
        buf.push_str("/// take a `Responder` from `ctx.defer()` and answer later from any thread.\n");
    }
    let stub = DefaultStub { on: default_stubs, status: &status, reply: &reply };
    let _ = writeln!(buf, "pub trait {trait_name}: ::core::marker::Send + ::core::marker::Sync + 'static {{");
    for rpc in &model.rpcs {
        write_comments(&rpc.method.comments, buf);
        if rpc.method.comments.leading.is_empty() && rpc.method.comments.trailing.is_empty() {
            let _ = writeln!(buf, "/// Handles `{}`.", rpc.full_name);
        }
        let body = stub.body(rpc, Shape::Unary, asynchronous);
        if asynchronous {
            let _ = writeln!(
                buf,
                "fn {name}(&self, ctx: {async_ctx}, request: {input}) -> impl ::core::future::Future<Output = \
                 ::core::result::Result<{output}, {status}>> + ::core::marker::Send{body}",
                name = rpc.method.name,
                input = rpc.input,
                output = rpc.output
            );
        } else {
            let _ = writeln!(
                buf,
                "fn {name}(&self, ctx: &{ctx_ty}, request: {input}) -> {reply}<{output}>{body}",
                name = rpc.method.name,
                input = rpc.input,
                output = rpc.output
            );
        }
    }
    for rpc in &model.server_streams {
        write_rpc_doc(rpc, buf, "server streaming");
        let body = stub.body(rpc, Shape::ServerStream, asynchronous);
        let (name, input, output) = (&rpc.method.name, &rpc.input, &rpc.output);
        if asynchronous {
            let _ = writeln!(
                buf,
                "///
                /// Send the stream's messages with `sink.send_async(..).await` (it waits while the
                /// client's credits are used up); the output ends the stream (`Ok(())`: a clean
                /// end). The future is dropped at the stream's deadline or when the client cancels.
                fn {name}(&self, ctx: {async_ctx}, request: {input}, sink: {sink_ty}<{output}>) -> impl \
                 ::core::future::Future<Output = ::core::result::Result<(), {status}>> + ::core::marker::Send{body}"
            );
        } else {
            let _ = writeln!(
                buf,
                "///
                /// Send the stream's messages into `sink` (from any thread: its `send` blocks while the
                /// client's credits are used up, so send from a thread of your own, or at most
                /// `SINK_DEPTH` messages inline); drop it to end the stream OK, or `finish` it with a
                /// status. The stream's deadline is the call's.
                fn {name}(&self, ctx: &{ctx_ty}, request: {input}, sink: {sink_ty}<{output}>){body}"
            );
        }
    }
    for rpc in &model.client_streams {
        write_rpc_doc(rpc, buf, "client streaming");
        let body = stub.body(rpc, Shape::ClientStream, asynchronous);
        let (name, input, output) = (&rpc.method.name, &rpc.input, &rpc.output);
        if asynchronous {
            let _ = writeln!(
                buf,
                "///
                /// Read the client's messages with `requests.message_async().await` (`Ok(None)` at
                /// the client's clean end; each message taken returns its credit); the output is the
                /// answer. The future is dropped at the stream's deadline or when the client cancels.
                fn {name}(&self, ctx: {async_ctx}, requests: {requests_ty}<{input}>) -> impl \
                 ::core::future::Future<Output = ::core::result::Result<{output}, {status}>> + ::core::marker::Send{body}"
            );
        } else {
            let _ = writeln!(
                buf,
                "///
                /// Read the client's messages from `requests` on a thread of your own (`message()`
                /// blocks; `Ok(None)` at the client's clean end, CANCELLED when it cancelled; each
                /// message taken returns its credit, so not reading stalls the client), then answer
                /// with `responder`. The stream's deadline is the call's.
                fn {name}(&self, ctx: &{ctx_ty}, requests: {requests_ty}<{input}>, responder: {responder_ty}<{output}>){body}"
            );
        }
    }
    for rpc in &model.bidi_streams {
        write_rpc_doc(rpc, buf, "bidirectional streaming");
        let body = stub.body(rpc, Shape::Bidi, asynchronous);
        let (name, input, output) = (&rpc.method.name, &rpc.input, &rpc.output);
        if asynchronous {
            let _ = writeln!(
                buf,
                "///
                /// Read the client's messages with `requests.message_async().await`, send with
                /// `sink.send_async(..).await`; the output ends the stream (`Ok(())`: a clean end).
                /// The future is dropped at the stream's deadline or when the client cancels.
                fn {name}(&self, ctx: {async_ctx}, requests: {requests_ty}<{input}>, sink: {sink_ty}<{output}>) -> impl \
                 ::core::future::Future<Output = ::core::result::Result<(), {status}>> + ::core::marker::Send{body}"
            );
        } else {
            let _ = writeln!(
                buf,
                "///
                /// Read the client's messages from `requests` and send into `sink`, from threads of
                /// your own (both block: on the client's messages, and on its credits); drop the
                /// sink to end the stream OK, or `finish` it with a status. The stream's deadline is
                /// the call's.
                fn {name}(&self, ctx: &{ctx_ty}, requests: {requests_ty}<{input}>, sink: {sink_ty}<{output}>){body}"
            );
        }
    }
    buf.push_str("}\n");

    // The adapter.
    let _ = writeln!(
        buf,
        "/// Serves a [`{trait_name}`] implementation: pass it to the server builder's `add_service`."
    );
    let _ = writeln!(buf, "pub struct {adapter}<{param}: {trait_name}> {{");
    let _ = writeln!(buf, "inner: ::std::sync::Arc<{param}>,");
    if asynchronous {
        let _ = writeln!(buf, "runtime: {async_rt},");
    }
    buf.push_str("}\n");
    let _ = writeln!(buf, "impl<{param}: {trait_name}> {adapter}<{param}> {{");
    if asynchronous {
        let _ = writeln!(
            buf,
            "/// Serves `inner`, its handlers' futures polled on the worker that received the \
             request\n/// (`AsyncRuntime::worker`: in the context of the calling thread's tokio \
             runtime, if any).
            pub fn new(inner: {param}) -> Self {{ Self::from_arc(::std::sync::Arc::new(inner)) }}
            /// Serves an implementation that other code shares (handlers as for `new`).
            pub fn from_arc(inner: ::std::sync::Arc<{param}>) -> Self {{
                Self {{ inner, runtime: {async_rt}::worker() }}
            }}
            /// Serves `inner` with its handlers' futures where `runtime` says (e.g. spawned on a
            /// tokio runtime: `AsyncRuntime::from_handle`, for handlers that block).
            pub fn with_runtime(inner: {param}, runtime: {async_rt}) -> Self {{
                Self {{ inner: ::std::sync::Arc::new(inner), runtime }}
            }}"
        );
    } else {
        let _ = writeln!(buf, "/// Serves `inner`.");
        let _ = writeln!(
            buf,
            "pub fn new(inner: {param}) -> Self {{ Self {{ inner: ::std::sync::Arc::new(inner) }} }}"
        );
        let _ = writeln!(buf, "/// Serves an implementation that other code shares.");
        let _ =
            writeln!(buf, "pub fn from_arc(inner: ::std::sync::Arc<{param}>) -> Self {{ Self {{ inner }} }}");
    }
    buf.push_str("}\n");
    let _ = writeln!(buf, "impl<{param}: {trait_name}> ::core::clone::Clone for {adapter}<{param}> {{");
    if asynchronous {
        buf.push_str(
            "fn clone(&self) -> Self { Self { inner: ::std::sync::Arc::clone(&self.inner), runtime: \
             ::core::clone::Clone::clone(&self.runtime) } }\n",
        );
    } else {
        buf.push_str("fn clone(&self) -> Self { Self { inner: ::std::sync::Arc::clone(&self.inner) } }\n");
    }
    buf.push_str("}\n");
    // Debug without `{param}: Debug` (a user's implementation need not be): the service's name,
    // the implementation left out. A crate denying `missing_debug_implementations` builds clean.
    let _ = writeln!(
        buf,
        "impl<{param}: {trait_name}> ::core::fmt::Debug for {adapter}<{param}> {{
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{
                f.debug_struct(\"{adapter}\").field(\"service\", &{name}).finish_non_exhaustive()
            }}
        }}",
        name = model.service_name_const,
    );

    let _ = writeln!(buf, "impl<{param}: {trait_name}> {service} for {adapter}<{param}> {{");
    let _ = writeln!(buf, "const NAME: &'static str = {};", model.service_name_const);
    buf.push_str("const FILE_DESCRIPTOR_SET: &'static [u8] = super::FILE_DESCRIPTOR_SET;\n");
    let _ = write!(buf, "const METHODS: &'static [{method_desc}] = &[");
    for rpc in model.all() {
        let _ = write!(buf, "{method_desc} {{ id: {id}, name: method_names::{id} }},", id = rpc.id_const);
    }
    buf.push_str("];\n");
    // The runtime's family of UNIMPLEMENTED texts: `method id 0x… is not served by this server
    // (service pkg.Service has no such method)`.
    let unknown = format!("out.error({status}::method_not_served_by(method, {}))", model.service_name_const);
    if model.all().next().is_none() {
        let _ = writeln!(
            buf,
            "fn call(&self, method: {method_id}, _ctx: &{ctx_ty}, _body: {body_ty}<'_>, out: &mut {reply_writer}<'_>) {{"
        );
        let _ = writeln!(buf, "{unknown};");
    } else {
        // Only unary and server-stream requests come in the call's body; a service of client and
        // bidirectional streams alone reads its requests from the stream (an unused `body` would
        // warn in the user's crate).
        let body_arg =
            if model.rpcs.is_empty() && model.server_streams.is_empty() { "_body" } else { "body" };
        let _ = writeln!(
            buf,
            "fn call(&self, method: {method_id}, ctx: &{ctx_ty}, {body_arg}: {body_ty}<'_>, out: &mut {reply_writer}<'_>) {{"
        );
        buf.push_str("match method {\n");
        for rpc in model.rpcs.iter().filter(|_| asynchronous) {
            let _ = writeln!(
                buf,
                "{id} => match {decode}::<{input}>(body) {{
                    ::core::result::Result::Ok(request) => {{
                        let inner = ::std::sync::Arc::clone(&self.inner);
                        out.reply({spawn_async}(&self.runtime, ctx, move |ctx| async move {{
                            <{param} as {trait_name}>::{name}(&*inner, ctx, request).await
                        }}))
                    }}
                    ::core::result::Result::Err(status) => out.error(status),
                }},",
                id = rpc.id_const,
                input = rpc.input,
                name = rpc.method.name,
            );
        }
        for rpc in model.rpcs.iter().filter(|_| !asynchronous) {
            let _ = writeln!(
                buf,
                "{id} => match {decode}::<{input}>(body) {{
                    ::core::result::Result::Ok(request) => out.reply(<{param} as {trait_name}>::{name}(&self.inner, ctx, request)),
                    ::core::result::Result::Err(status) => out.error(status),
                }},",
                id = rpc.id_const,
                input = rpc.input,
                name = rpc.method.name,
            );
        }
        // A stream answered through a sink (server and bidirectional streams): the handler gets
        // `first` (its request, or the request stream) and the sink; the reply carries the stream.
        let stream_call = |name: &str, first: &str| {
            if asynchronous {
                format!(
                    "let inner = ::std::sync::Arc::clone(&self.inner);
                    out.reply({spawn_stream}(&self.runtime, ctx, sink, reply, move |ctx, sink| async move {{
                        <{param} as {trait_name}>::{name}(&*inner, ctx, {first}, sink).await
                    }}))"
                )
            } else {
                format!(
                    "<{param} as {trait_name}>::{name}(&self.inner, ctx, {first}, sink);\nout.reply(reply)"
                )
            }
        };
        for rpc in &model.server_streams {
            let (id, input, output) = (&rpc.id_const, &rpc.input, &rpc.output);
            let call = stream_call(&rpc.method.name, "request");
            let _ = writeln!(
                buf,
                "{id} => match {decode}::<{input}>(body) {{
                    ::core::result::Result::Ok(request) => {{
                        let (sink, reply) = ctx.stream::<{output}>();
                        {call}
                    }}
                    ::core::result::Result::Err(status) => out.error(status),
                }},"
            );
        }
        for rpc in &model.client_streams {
            let (id, input, output, name) = (&rpc.id_const, &rpc.input, &rpc.output, &rpc.method.name);
            if asynchronous {
                let _ = writeln!(
                    buf,
                    "{id} => {{
                        let requests = ctx.requests::<{input}>();
                        let inner = ::std::sync::Arc::clone(&self.inner);
                        out.reply({spawn_async}(&self.runtime, ctx, move |ctx| async move {{
                            <{param} as {trait_name}>::{name}(&*inner, ctx, requests).await
                        }}))
                    }}"
                );
            } else {
                let _ = writeln!(
                    buf,
                    "{id} => {{
                        let requests = ctx.requests::<{input}>();
                        let (responder, reply) = ctx.defer::<{output}>();
                        <{param} as {trait_name}>::{name}(&self.inner, ctx, requests, responder);
                        out.reply(reply)
                    }}"
                );
            }
        }
        for rpc in &model.bidi_streams {
            let (id, input, output) = (&rpc.id_const, &rpc.input, &rpc.output);
            let call = stream_call(&rpc.method.name, "requests");
            let _ = writeln!(
                buf,
                "{id} => {{
                    let requests = ctx.requests::<{input}>();
                    let (sink, reply) = ctx.stream::<{output}>();
                    {call}
                }}"
            );
        }
        let _ = writeln!(buf, "_ => {unknown},");
        buf.push_str("}\n");
    }
    buf.push_str("}\n}\n}\n");
}

/// The doc line of a streaming RPC's trait method: its comments, or a default naming the shape.
fn write_rpc_doc(rpc: &crate::generator::RpcModel<'_>, buf: &mut String, shape: &str) {
    write_comments(&rpc.method.comments, buf);
    if rpc.method.comments.leading.is_empty() && rpc.method.comments.trailing.is_empty() {
        let _ = writeln!(buf, "/// Handles `{}` ({shape}).", rpc.full_name);
    } else {
        let _ = writeln!(buf, "///\n/// {}{}.", shape[..1].to_uppercase(), &shape[1..]);
    }
}

/// The four shapes of an RPC, for the default body of its trait method.
#[derive(Clone, Copy)]
enum Shape {
    Unary,
    ServerStream,
    ClientStream,
    Bidi,
}

/// The default bodies of the trait's methods ([`generate`]'s `default_stubs`).
struct DefaultStub<'s> {
    /// Whether methods get a default body (else they end in `;`).
    on: bool,
    /// The facade's `Status` path.
    status: &'s str,
    /// The facade's `Reply` path.
    reply: &'s str,
}

impl DefaultStub<'_> {
    /// `;` (no default), or a body that answers UNIMPLEMENTED naming the RPC; every argument is
    /// used, so the default never warns.
    fn body(&self, rpc: &crate::generator::RpcModel<'_>, shape: Shape, asynchronous: bool) -> String {
        if !self.on {
            return ";".to_owned();
        }
        // `method /pkg.Service/Method is not implemented by this server (...)`.
        let status = format!("{}::method_not_implemented(\"{}\")", self.status, rpc.full_name);
        let err = format!("::core::result::Result::Err({status})");
        // A sync stream's sink is used by its answer; everything else is consumed here.
        let args = match (shape, asynchronous) {
            (Shape::Unary, _) | (Shape::ServerStream, false) => "ctx, request",
            (Shape::ClientStream, _) | (Shape::Bidi, false) => "ctx, requests",
            (Shape::ServerStream, true) => "ctx, request, sink",
            (Shape::Bidi, true) => "ctx, requests, sink",
        };
        if asynchronous {
            return format!(" {{ async move {{ let _ = ({args}); {err} }} }}");
        }
        let end = match shape {
            Shape::Unary => format!("{}::from({status})", self.reply),
            Shape::ServerStream | Shape::Bidi => format!("sink.finish({err})"),
            Shape::ClientStream => format!("responder.send({err})"),
        };
        format!(" {{ let _ = ({args}); {end} }}")
    }
}
