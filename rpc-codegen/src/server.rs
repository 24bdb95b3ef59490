//! `<service>_server`: the trait users implement and the adapter that implements the runtime's
//! `Service` for it, dispatching on method-id constants.

use std::fmt::Write as _;

use crate::generator::{write_comments, ServiceModel, ALLOW_USER_NAMES};

/// Appends the `<service>_server` module of `model` to `buf`; with `asynchronous`, the trait's
/// methods return `Send` futures that the adapter runs on a tokio runtime.
pub fn generate(model: &ServiceModel<'_>, buf: &mut String, asynchronous: bool) {
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
    model.write_consts(buf);

    let _ = writeln!(buf, "/// The full names of the methods, `\"/package.Service/Method\"`.");
    buf.push_str("pub mod method_names {\n");
    for rpc in &model.rpcs {
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
            "///\n/// Async handlers: each call's future runs on the adapter's tokio runtime (the worker \
             only\n/// decodes the request and queues the answer); it is dropped when the call's \
             deadline passes.\n/// Implement the methods as `async fn`.\n",
        );
    } else {
        buf.push_str(
            "///\n/// Handlers run inline on the worker thread that received the request: answer at once, \
             or\n",
        );
        buf.push_str("/// take a `Responder` from `ctx.defer()` and answer later from any thread.\n");
    }
    let _ = writeln!(buf, "pub trait {trait_name}: ::core::marker::Send + ::core::marker::Sync + 'static {{");
    for rpc in &model.rpcs {
        write_comments(&rpc.method.comments, buf);
        if rpc.method.comments.leading.is_empty() && rpc.method.comments.trailing.is_empty() {
            let _ = writeln!(buf, "/// Handles `{}`.", rpc.full_name);
        }
        if asynchronous {
            let _ = writeln!(
                buf,
                "fn {name}(&self, ctx: {async_ctx}, request: {input}) -> impl ::core::future::Future<Output = \
                 ::core::result::Result<{output}, {status}>> + ::core::marker::Send;",
                name = rpc.method.name,
                input = rpc.input,
                output = rpc.output
            );
        } else {
            let _ = writeln!(
                buf,
                "fn {name}(&self, ctx: &{ctx_ty}, request: {input}) -> {reply}<{output}>;",
                name = rpc.method.name,
                input = rpc.input,
                output = rpc.output
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
            "/// Serves `inner` on the tokio runtime of the calling thread, or else on the one the \
             runtime\n/// library builds (`AsyncRuntime::current_or_default`).
            pub fn new(inner: {param}) -> Self {{ Self::from_arc(::std::sync::Arc::new(inner)) }}
            /// Serves an implementation that other code shares (runtime as for `new`).
            pub fn from_arc(inner: ::std::sync::Arc<{param}>) -> Self {{
                Self {{ inner, runtime: {async_rt}::current_or_default() }}
            }}
            /// Serves `inner` with its handlers' futures on `runtime`.
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

    let _ = writeln!(buf, "impl<{param}: {trait_name}> {service} for {adapter}<{param}> {{");
    let _ = writeln!(buf, "const NAME: &'static str = {};", model.service_name_const);
    let _ = write!(buf, "const METHODS: &'static [{method_desc}] = &[");
    for rpc in &model.rpcs {
        let _ = write!(buf, "{method_desc} {{ id: {id}, name: method_names::{id} }},", id = rpc.id_const);
    }
    buf.push_str("];\n");
    let unknown = format!(
        "out.error({status}::unimplemented(::std::format!(\"{{}}: unknown method id {{method:#x}}\", {})))",
        model.service_name_const
    );
    if model.rpcs.is_empty() {
        let _ = writeln!(
            buf,
            "fn call(&self, method: {method_id}, _ctx: &{ctx_ty}, _body: {body_ty}<'_>, out: &mut {reply_writer}<'_>) {{"
        );
        let _ = writeln!(buf, "{unknown};");
    } else {
        let _ = writeln!(
            buf,
            "fn call(&self, method: {method_id}, ctx: &{ctx_ty}, body: {body_ty}<'_>, out: &mut {reply_writer}<'_>) {{"
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
        let _ = writeln!(buf, "_ => {unknown},");
        buf.push_str("}\n");
    }
    buf.push_str("}\n}\n}\n");
}
