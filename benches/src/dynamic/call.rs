//! `rpc-perf call`: one call, the request from JSON, the reply printed as JSON.

use rpc_core::status::{NOT_IMPLEMENTED, NOT_SERVED};
use rpc_core::{CallOptions, Code, Status};

use super::args::CallArgs;
use super::body::{EncodedRequest, ReplyBytes};
use super::json;
use super::reflect;
use super::schema::{Schema, UnaryMethod};
use crate::error::PerfError;
use crate::rpc::ring_bytes_for;

/// Runs `rpc-perf call`: returns what to print on standard output (the reply as pretty JSON,
/// or the `--list` listing). Without `--proto`, the schema comes from the server's reflection
/// service ([`reflect`]).
///
/// # Errors
/// One-line [`PerfError`]s: a bad .proto, an unknown service or method, JSON that does not
/// match the request message (field and type named), an unreachable server, and a non-OK
/// answer (`kv.Kv/Get: NOT_FOUND: ...`).
pub fn run(a: &CallArgs) -> Result<String, PerfError> {
    if a.proto.protos.is_empty() {
        // From the server's reflection service, as grpcurl does.
        let Some(host) = &a.host else {
            return Err(PerfError::Setup(
                "rpc-perf call needs --proto FILE.proto, or HOST to ask its reflection service".into(),
            ));
        };
        // `rpc-perf call HOST list`, grpcurl's form, too.
        if a.list || (a.method.as_deref() == Some("list") && a.describe.is_none()) {
            return reflect::listing(&a.nic, host);
        }
        if let Some(name) = &a.describe {
            return reflect::schema(&a.nic, host, name.trim_start_matches('.'))?.describe(name);
        }
    } else {
        let schema = Schema::compile(&a.proto.protos, &a.proto.includes)?;
        if a.list {
            return Ok(schema.listing());
        }
        if let Some(name) = &a.describe {
            return schema.describe(name);
        }
    }
    let (Some(host), Some(name)) = (&a.host, &a.method) else {
        return Err(PerfError::Setup("rpc-perf call needs HOST and METHOD (or --list)".into()));
    };
    let schema = super::schema_for(&a.proto, &a.nic, host, name)?;
    let method = schema.unary_method(name)?;
    let data: Vec<String> = a.data.iter().cloned().collect();
    let mut reqs = json::payloads(&method.input, &data)?;
    if reqs.len() != 1 {
        return Err(PerfError::Setup(format!(
            "{}: {} requests given; call sends one (rpc-perf bench takes several)",
            reqs[0].origin,
            reqs.len()
        )));
    }
    let req = EncodedRequest(reqs.remove(0).bytes);
    let (client, addr) = super::connect(&a.nic, host, 1, ring_bytes_for(req.0.len().max(1)))?;
    let opts = a.deadline.map_or_else(CallOptions::default, CallOptions::deadline);
    match client.unary::<EncodedRequest, ReplyBytes>(method.id, &req, &opts) {
        Ok(reply) => json::to_json(&method.output, &reply.0)
            .map(|text| text + "\n")
            .map_err(|e| PerfError::Setup(format!("{}: {e}", method.name))),
        Err(s) => Err(status_error(&method, &addr, &s)),
    }
}

/// The one-line error for a call that ended with `s`, with a hint that follows what the status
/// says: a method nothing on the server serves (`... is not served by this server`: the wrong
/// server or .proto), and one its service leaves to the default handler (`... is not
/// implemented by this server`); a handler's own UNIMPLEMENTED speaks for itself.
pub fn status_error(method: &UnaryMethod, addr: &str, s: &Status) -> PerfError {
    let says = |phrase: &str| s.code() == Code::Unimplemented && s.message().contains(phrase);
    let hint = if says(NOT_SERVED) {
        format!(
            " (the server at {addr} does not serve {} [method id {:#010x}]: is it running this .proto's service?)",
            method.full_name, method.id
        )
    } else if says(NOT_IMPLEMENTED) {
        format!(
            " (the server at {addr} serves the service but not {}: its implementation leaves it to the \
             generated default handler)",
            method.full_name
        )
    } else {
        String::new()
    };
    PerfError::Setup(format!("{}: {}: {}{hint}", method.name, s.code(), super::one_line(s.message())))
}
