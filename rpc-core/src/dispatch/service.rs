//! The service contract the dispatcher calls through: method ids, the request [`Body`] a handler
//! decodes, and the [`Service`] trait generated adapters implement. It lives at the dispatch
//! layer (the worker runs handlers through it); [`crate::codegen`] re-exports it for generated
//! code, so the public paths `rpc_core::codegen::{Service, Body, MethodId, ...}` stay.

use prost::Message;

use super::reply::{ReplyWriter, RequestContext};
use crate::status::Status;

/// Identifier of a method on the wire: FNV-1a (32 bit) of its full name `"/package.Service/Method"`.
/// 0 is reserved and never a method id.
pub type MethodId = u32;

/// FNV-1a, 32 bit, of `full_name` (the method's full name `"/package.Service/Method"`).
///
/// Usable in constants; codegen computes the same value at build time (with this very function,
/// from the `rpc-method-id` crate both share) and emits the literal.
pub use rpc_method_id::method_id;

/// A method of a service, for registration with the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MethodDesc {
    /// Its id, `method_id(name)`.
    pub id: MethodId,
    /// Its full name `"/package.Service/Method"`.
    pub name: &'static str,
}

/// The protobuf encoding of a request as the runtime hands it to a server adapter: a view of
/// the receive buffer it arrived in (a body up to the eager threshold, in one SEND), or a buffer
/// of its own that the body was copied into once, out of the ring (larger bodies; the ring's
/// bytes are never read in place, since the peer could rewrite them). Decoding an owned body
/// makes `bytes` fields (`bytes::Bytes`) slices of that buffer, with no second copy.
#[derive(Clone, Debug)]
pub struct Body<'a>(BodyRepr<'a>);

#[derive(Clone, Debug)]
enum BodyRepr<'a> {
    Slice(&'a [u8]),
    Owned(bytes::Bytes),
}

impl<'a> Body<'a> {
    /// A body borrowed from a buffer nobody else writes while it lives.
    pub fn slice(bytes: &'a [u8]) -> Body<'a> {
        Body(BodyRepr::Slice(bytes))
    }

    /// A body in a buffer of its own.
    pub fn owned(bytes: bytes::Bytes) -> Body<'static> {
        Body(BodyRepr::Owned(bytes))
    }

    /// The body without its first `n` bytes (`n` at most its length).
    pub(crate) fn advance(self, n: usize) -> Body<'a> {
        match self.0 {
            BodyRepr::Slice(s) => Body(BodyRepr::Slice(&s[n.min(s.len())..])),
            BodyRepr::Owned(b) => Body(BodyRepr::Owned(b.slice(n.min(b.len())..))),
        }
    }

    /// The encoded bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            BodyRepr::Slice(s) => s,
            BodyRepr::Owned(b) => b,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True for an empty body (a message with every field at its default).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> From<&'a [u8]> for Body<'a> {
    fn from(s: &'a [u8]) -> Body<'a> {
        Body::slice(s)
    }
}

/// Decodes a request body (protobuf): from the receive buffer in place, or from its owned buffer
/// with `bytes` fields sharing it.
///
/// # Errors
/// [`Code::InvalidArgument`](crate::status::Code::InvalidArgument) naming the message type and
/// the decode error.
pub fn decode<M: Message + Default>(body: Body<'_>) -> Result<M, Status> {
    let r = match body.0 {
        BodyRepr::Slice(s) => M::decode(s),
        BodyRepr::Owned(b) => M::decode(b),
    };
    r.map_err(|e| {
        Status::invalid_argument(format!(
            "cannot decode {}: {}",
            std::any::type_name::<M>(),
            decode_error_text(&e)
        ))
    })
}

/// How many (message, field) steps of a decode error's path [`decode_error_text`] shows, from
/// each end.
const PATH_ENDS: usize = 2;

/// `e` as one line of bounded length (about 200 bytes plus four names), for a status: prost's
/// root cause, then where it happened as `Message.field` steps from the outermost message in,
/// the middle of a long path elided (`... 96 more ...`; a step repeated all along is shown once
/// with its count, `Node.next x100`). prost's own text lists every step, 2.5 KB for a message
/// nested 100 deep.
///
/// For prost's recursion limit it also says how to lift it: prost refuses a message nested more
/// than 100 levels deep; the limit is a build setting, prost's `no-recursion-limit` feature
/// (rpc-core's feature of the same name turns it on).
pub(crate) fn decode_error_text(e: &prost::DecodeError) -> String {
    const PREFIX: &str = "failed to decode Protobuf message: ";
    let full = e.to_string();
    let mut rest = full.strip_prefix(PREFIX).unwrap_or(&full);
    // prost writes the path innermost first as `Message.field: ` steps, then the cause.
    let mut steps: Vec<&str> = Vec::new();
    while let Some((step, tail)) = rest.split_once(": ") {
        if step.is_empty() || step.contains(char::is_whitespace) || !step.contains('.') {
            break;
        }
        steps.push(step);
        rest = tail;
    }
    steps.reverse();
    let mut text = String::from(rest);
    if !steps.is_empty() {
        text.push_str(", at ");
        if steps.len() > 1 && steps.iter().all(|s| *s == steps[0]) {
            text.push_str(&format!("{} x{}", steps[0], steps.len()));
        } else if steps.len() <= 2 * PATH_ENDS {
            text.push_str(&steps.join(" > "));
        } else {
            let hidden = steps.len() - 2 * PATH_ENDS;
            text.push_str(&format!(
                "{} > ... {hidden} more ... > {}",
                steps[..PATH_ENDS].join(" > "),
                steps[steps.len() - PATH_ENDS..].join(" > ")
            ));
        }
    }
    if rest == "recursion limit reached" {
        text.push_str(
            " (prost refuses messages nested more than 100 levels deep; to lift the limit, build with \
             prost's `no-recursion-limit` feature, e.g. rpc-core's feature of that name)",
        );
    }
    text
}

/// What a server adapter implements; generated by `rpc-codegen` for each service.
pub trait Service: Send + Sync + 'static {
    /// `"package.Service"`.
    const NAME: &'static str;
    /// Every method of the service, for registration (ids must be unique server-wide; the runtime
    /// refuses duplicates with an error naming both).
    const METHODS: &'static [MethodDesc];
    /// The encoded `google.protobuf.FileDescriptorSet` describing the service: its package's
    /// `.proto` files and every file they import (rpc-codegen emits it as the package's
    /// `FILE_DESCRIPTOR_SET`). [`ServerBuilder::add_reflection`](crate::ServerBuilder::add_reflection)
    /// serves it to reflection clients (grpcurl, `rpc-perf call` without `--proto`). Default:
    /// empty (a hand-written service: listed by reflection, its types unknown to it).
    const FILE_DESCRIPTOR_SET: &'static [u8] = &[];
    /// Runs on the worker that received the request. `body` is the protobuf encoding of the
    /// request ([`Body`]: in its receive buffer, or copied once out of the ring); the answer goes
    /// into `out` (encoded straight into the registered send buffer: no allocation).
    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Code;

    #[test]
    fn method_id_is_fnv1a_32() {
        // Reference values of FNV-1a 32 (http://www.isthe.com/chongo/tech/comp/fnv/).
        assert_eq!(method_id(""), 0x811c_9dc5);
        assert_eq!(method_id("foobar"), 0xbf9c_f968);
        // The id rpc-codegen emits for helloworld (codegen-tests' snapshot holds the literal).
        const ID: MethodId = method_id("/helloworld.Greeter/SayHello");
        assert_eq!(ID, 0x88a5_acce);
        assert_ne!(ID, method_id("/helloworld.Greeter/SayHello2"));
    }

    #[test]
    fn decode_error_is_invalid_argument_naming_the_type() {
        #[derive(Clone, PartialEq, prost::Message)]
        struct Probe {
            #[prost(string, tag = "1")]
            name: String,
        }
        let ok: Probe = decode(Body::slice(&[0x0a, 0x02, b'h', b'i'])).unwrap();
        assert_eq!(ok.name, "hi");
        let owned: Probe = decode(Body::owned(bytes::Bytes::from_static(&[0x0a, 0x02, b'h', b'i']))).unwrap();
        assert_eq!(owned.name, "hi");
        let err = decode::<Probe>(Body::slice(&[0x0a, 0x05, b'h'])).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("Probe"), "{}", err.message());
    }

    /// A message that holds itself, `depth` levels deep.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Node {
        #[prost(message, optional, boxed, tag = "1")]
        next: Option<Box<Node>>,
        #[prost(uint32, tag = "2")]
        depth: u32,
    }

    fn nested(depth: u32) -> Vec<u8> {
        let mut node = Node { next: None, depth: 0 };
        for d in 1..depth {
            node = Node { next: Some(Box::new(node)), depth: d };
        }
        node.encode_to_vec()
    }

    /// A message nested past prost's recursion limit (100) is refused with a status of a readable
    /// length that names the limit and the setting that lifts it (prost's own text is 2.5 KB).
    #[cfg(not(feature = "no-recursion-limit"))]
    #[test]
    fn a_message_nested_past_the_recursion_limit_gets_a_short_status_naming_the_setting() {
        let body = nested(150);
        let raw = Node::decode(body.as_slice()).unwrap_err().to_string();
        assert!(raw.len() > 1000, "prost's own text lists every step: {} bytes", raw.len());
        let err = decode::<Node>(Body::slice(&body)).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let msg = err.message();
        assert!(msg.len() < 400, "{} bytes: {msg}", msg.len());
        assert!(msg.contains("recursion limit reached"), "{msg}");
        assert!(msg.contains("Node.next x"), "{msg}");
        assert!(msg.contains("no-recursion-limit"), "{msg}");
        // 100 levels decode.
        assert_eq!(decode::<Node>(Body::slice(&nested(100))).unwrap().depth, 99);
    }

    /// With the limit lifted (`--features no-recursion-limit`), 150 levels decode.
    #[cfg(feature = "no-recursion-limit")]
    #[test]
    fn without_the_recursion_limit_150_levels_decode() {
        assert_eq!(decode::<Node>(Body::slice(&nested(150))).unwrap().depth, 149);
    }

    /// A long path of different steps keeps its two ends; a short one is shown whole, outermost
    /// first.
    #[test]
    #[allow(deprecated)] // `DecodeError::new`: the simplest way to build one with a given cause
    fn decode_error_paths_are_cut_in_the_middle() {
        let mut e = prost::DecodeError::new("invalid wire type value: 7");
        for i in (0..10).rev() {
            e.push(["M0", "M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M9"][i], "f");
        }
        // Pushed innermost first, as prost does while unwinding: M9 is the innermost.
        let text = decode_error_text(&e);
        assert_eq!(text, "invalid wire type value: 7, at M0.f > M1.f > ... 6 more ... > M8.f > M9.f");
        let mut short = prost::DecodeError::new("buffer underflow");
        short.push("Inner", "name");
        short.push("Outer", "inner");
        assert_eq!(decode_error_text(&short), "buffer underflow, at Outer.inner > Inner.name");
        assert_eq!(decode_error_text(&prost::DecodeError::new("invalid varint")), "invalid varint");
    }

    /// Whether `field`'s bytes lie inside the buffer at `body` (addresses compared, never read):
    /// a slice of that buffer, not a copy.
    fn inside(field: &bytes::Bytes, body: &std::ops::Range<*const u8>) -> bool {
        let f = field.as_ptr_range();
        body.start <= f.start && f.end <= body.end
    }

    /// A ring body, copied out of the ring once into a buffer of its own (a recycled one, as the
    /// worker makes it: `Session::body_bytes`), decodes into `bytes` fields that are slices of
    /// that buffer: no second copy (DESIGN.md, memory ownership). The buffer goes back to its
    /// session's spares only when the last field sharing it is dropped. A borrowed body (an
    /// eager one, in a receive buffer the NIC gets back) decodes into copies.
    #[test]
    fn bytes_fields_of_an_owned_body_are_slices_of_it() {
        #[derive(Clone, PartialEq, prost::Message)]
        struct Blob {
            #[prost(uint64, tag = "1")]
            seq: u64,
            #[prost(bytes = "bytes", tag = "2")]
            data: bytes::Bytes,
            #[prost(bytes = "bytes", repeated, tag = "3")]
            chunks: Vec<bytes::Bytes>,
        }
        let sent = Blob {
            seq: 7,
            data: vec![0xab; 100_000].into(),
            chunks: vec![vec![1; 5000].into(), vec![2; 3].into()],
        };
        let encoded = sent.encode_to_vec();
        let home = crate::session::BodyRecycler::new(4, 1 << 20);
        let body = crate::session::RecycledBody::new(encoded.clone(), home.clone()).into_bytes();
        let range = body.as_ptr_range();
        // The body's own handle goes with it: only the decoded fields keep its buffer alive.
        let got: Blob = decode(Body::owned(body)).unwrap();
        assert_eq!(got, sent);
        assert!(inside(&got.data, &range), "the bytes field was copied out of the body");
        for c in &got.chunks {
            assert!(inside(c, &range), "a repeated bytes field was copied out of the body");
        }
        let spares = home.spare_count();
        drop(got);
        assert_eq!(home.spare_count(), spares + 1, "the buffer came back when its last field went");

        let borrowed: Blob = decode(Body::slice(&encoded)).unwrap();
        assert_eq!(borrowed, sent);
        assert!(!inside(&borrowed.data, &encoded.as_ptr_range()), "a borrowed body's bytes are copied");
    }
}
