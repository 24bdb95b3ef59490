//! Rust names for proto names: keywords escaped the way prost-build escapes them (so that the
//! generated code and prost's messages agree), and a small allocator that keeps the names of one
//! scope unique.

use std::collections::BTreeSet;

use heck::{ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};

/// Makes `ident` usable as a Rust identifier, exactly as prost-build does: keywords that can be raw
/// identifiers become `r#kw`; `self`, `super`, `crate`, `Self`, `extern` and `_` get a trailing
/// underscore (they cannot be raw); a leading digit gets a leading underscore.
pub fn sanitize(ident: &str) -> String {
    match ident {
        "as" | "break" | "const" | "continue" | "else" | "enum" | "false" | "fn" | "for" | "if" | "impl"
        | "in" | "let" | "loop" | "match" | "mod" | "move" | "mut" | "pub" | "ref" | "return" | "static"
        | "struct" | "trait" | "true" | "type" | "unsafe" | "use" | "where" | "while" | "dyn"
        | "abstract" | "become" | "box" | "do" | "final" | "macro" | "override" | "priv" | "typeof"
        | "unsized" | "virtual" | "yield" | "async" | "await" | "try" | "gen" => format!("r#{ident}"),
        "_" | "super" | "self" | "Self" | "extern" | "crate" => format!("{ident}_"),
        s if s.starts_with(|c: char| c.is_ascii_digit()) => format!("_{ident}"),
        _ => ident.to_owned(),
    }
}

/// `snake_case` of a proto name, not yet sanitized (for building longer names from it).
pub fn snake(proto_name: &str) -> String {
    proto_name.to_snake_case()
}

/// `UpperCamelCase` of a proto name, not yet sanitized.
pub fn camel(proto_name: &str) -> String {
    proto_name.to_upper_camel_case()
}

/// `SCREAMING_SNAKE_CASE` of a proto name (never a keyword: all keywords have a lower-case letter).
pub fn shouty(proto_name: &str) -> String {
    let s = proto_name.to_shouty_snake_case();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{s}")
    } else {
        s
    }
}

/// The names of one scope (a module's items, an `impl`'s methods). The first claim of a name gets
/// it; a later claim of a taken name gets the name with `_` appended until it is free, so the
/// result is deterministic: it depends only on the order of claims.
#[derive(Debug, Default)]
pub struct Scope {
    taken: BTreeSet<String>,
}

impl Scope {
    /// Claims `wanted` (already sanitized), or the nearest free `wanted_`, `wanted__`, ...
    pub fn claim(&mut self, wanted: &str) -> String {
        let mut name = wanted.to_owned();
        while self.taken.contains(&name) {
            name.push('_');
        }
        self.taken.insert(name.clone());
        name
    }
}

/// Every name `rpc_core::codegen` exports that generated code refers to. A local item of one of
/// these names (a trait named after the service) would shadow the glob import, so generated code
/// spells such a name with its full path instead.
pub const FACADE_NAMES: &[&str] = &[
    "AsyncContext",
    "AsyncRuntime",
    "BidiStreaming",
    "Body",
    "CallOptions",
    "Channel",
    "ChannelConfig",
    "Client",
    "ClientConfig",
    "ClientStreamCall",
    "ClientStreaming",
    "Code",
    "IntoRequest",
    "Message",
    "MethodDesc",
    "MethodId",
    "Reply",
    "ReplyWriter",
    "StreamReceiver",
    "StreamSender",
    "StreamSink",
    "Streaming",
    "RequestContext",
    "RequestStream",
    "Responder",
    "ResponseFuture",
    "SharedSession",
    "Service",
    "Status",
    "UnaryCall",
    "decode",
    "method_id",
    "register_method_names",
    "spawn_async",
    "spawn_async_stream",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_are_escaped_like_prost() {
        assert_eq!(sanitize("type"), "r#type");
        assert_eq!(sanitize("gen"), "r#gen");
        assert_eq!(sanitize("async"), "r#async");
        assert_eq!(sanitize("match"), "r#match");
        assert_eq!(sanitize("self"), "self_");
        assert_eq!(sanitize("super"), "super_");
        assert_eq!(sanitize("crate"), "crate_");
        assert_eq!(sanitize("Self"), "Self_");
        assert_eq!(sanitize("say_hello"), "say_hello");
    }

    #[test]
    fn cases() {
        assert_eq!(snake("SayHello"), "say_hello");
        assert_eq!(camel("say_hello"), "SayHello");
        assert_eq!(shouty("SayHello"), "SAY_HELLO");
        assert_eq!(shouty("self"), "SELF");
        assert_eq!(camel("self"), "Self");
    }

    #[test]
    fn scope_appends_underscores_in_claim_order() {
        let mut scope = Scope::default();
        assert_eq!(scope.claim("connect"), "connect");
        assert_eq!(scope.claim("connect"), "connect_");
        assert_eq!(scope.claim("connect"), "connect__");
    }
}
