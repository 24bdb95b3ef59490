//! Per-call request metadata (gRPC's custom metadata, tonic's `MetadataMap`): ASCII and binary
//! key-value pairs a client sends with a call and a server's handlers and interceptors read.
//!
//! Keys are 1 to 255 bytes of lowercase ASCII letters, digits, `-`, `_` and `.` (gRPC's rule for
//! header names); a key ending in `-bin` holds a binary value, any other an ASCII one (visible
//! characters and spaces, as gRPC's). A key may repeat: [`Metadata::insert`] appends,
//! [`Metadata::get`] gives the first value, [`Metadata::get_all`] every one.
//!
//! On the wire a call without metadata pays nothing: its request carries no metadata flag and no
//! bytes. With metadata, the request header's `METADATA` flag says that its body starts with the
//! encoded block ([`Metadata::encoded_len`] bytes: a 4-byte little-endian length of the rest, a
//! 2-byte count, then per entry a 1-byte key length, the key, a 4-byte value length and the
//! value) before the message. A server refuses a block over `ServerConfig::max_metadata_bytes`
//! (RESOURCE_EXHAUSTED naming it) or a malformed one (INVALID_ARGUMENT), before the handler runs.

use std::fmt;

use bytes::BufMut;
use prost::Message;

/// Why a key or a value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMetadata {
    /// The key is empty, longer than 255 bytes, or has a byte other than `a-z 0-9 - _ .`.
    #[error("metadata key {0:?}: 1 to 255 bytes of a-z, 0-9, '-', '_' and '.'")]
    Key(String),
    /// An ASCII value with a byte other than visible ASCII or space.
    #[error(
        "metadata value of {0:?}: visible ASCII and spaces only (binary values need a key ending in -bin)"
    )]
    Value(String),
    /// A binary value under a key without the `-bin` suffix, or an ASCII one under a key with it.
    #[error("metadata key {0:?}: binary values take keys ending in -bin, ASCII values keys without it")]
    Suffix(String),
    /// More than 65,535 entries.
    #[error("more than 65535 metadata entries")]
    TooMany,
}

/// A value read from [`Metadata`]: ASCII text or bytes, as its key says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataValue<'a> {
    /// The value of a key without the `-bin` suffix.
    Ascii(&'a str),
    /// The value of a key ending in `-bin`.
    Binary(&'a [u8]),
}

/// Request metadata: an ordered list of key-value pairs (see the [module docs](self)).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<(Box<str>, Box<[u8]>)>,
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in self.iter() {
            match v {
                MetadataValue::Ascii(s) => m.entry(&k, &s),
                MetadataValue::Binary(b) => m.entry(&k, &format_args!("<{} bytes>", b.len())),
            };
        }
        m.finish()
    }
}

/// A client interceptor (tonic's `Interceptor`): runs before every call of a client or channel
/// that has it ([`crate::ClientConfig::interceptor`]), on the caller's thread, with the call's
/// metadata (what its `CallOptions` or `Request` carry, else empty) to read and change, e.g. to
/// add a bearer token or a trace context. An error fails the call with that status, before
/// anything is sent. With no interceptor a call builds no metadata.
#[derive(Clone)]
pub struct ClientInterceptor(std::sync::Arc<InterceptFn>);

/// What a [`ClientInterceptor`] runs.
type InterceptFn = dyn Fn(&mut Metadata) -> Result<(), crate::Status> + Send + Sync;

impl ClientInterceptor {
    /// An interceptor running `f`.
    pub fn new(f: impl Fn(&mut Metadata) -> Result<(), crate::Status> + Send + Sync + 'static) -> Self {
        ClientInterceptor(std::sync::Arc::new(f))
    }

    /// Runs it on `metadata`.
    ///
    /// # Errors
    /// The interceptor's status.
    pub fn intercept(&self, metadata: &mut Metadata) -> Result<(), crate::Status> {
        (self.0)(metadata)
    }
}

impl fmt::Debug for ClientInterceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientInterceptor(..)")
    }
}

/// The metadata a call sends: `given` (from its options), run through the client's interceptor
/// when there is one (borrowed as it is otherwise: no allocation).
///
/// # Errors
/// The interceptor's status.
#[inline]
pub(crate) fn intercepted<'a>(
    given: Option<&'a Metadata>,
    interceptor: Option<&ClientInterceptor>,
) -> Result<Option<std::borrow::Cow<'a, Metadata>>, crate::Status> {
    match interceptor {
        None => Ok(given.map(std::borrow::Cow::Borrowed)),
        Some(i) => run_interceptor(given, i).map(|md| Some(std::borrow::Cow::Owned(md))),
    }
}

/// Runs `i` on a copy of `given` (empty when `None`): the metadata a call with an interceptor
/// sends.
///
/// # Errors
/// The interceptor's status.
#[cold]
pub(crate) fn run_interceptor(
    given: Option<&Metadata>,
    i: &ClientInterceptor,
) -> Result<Metadata, crate::Status> {
    let mut md = given.cloned().unwrap_or_default();
    i.intercept(&mut md)?;
    Ok(md)
}

/// Fixed bytes of the block: its length and its entry count.
const BLOCK_HEAD: usize = 4 + 2;
/// Fixed bytes per entry: the key's length and the value's.
const ENTRY_HEAD: usize = 1 + 4;

fn check_key(key: &str) -> Result<(), InvalidMetadata> {
    let ok = !key.is_empty()
        && key.len() <= 255
        && key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(InvalidMetadata::Key(key.to_owned()))
    }
}

fn is_binary_key(key: &str) -> bool {
    key.ends_with("-bin")
}

fn check_ascii(key: &str, value: &[u8]) -> Result<(), InvalidMetadata> {
    if value.iter().all(|&b| (0x20..0x7f).contains(&b)) {
        Ok(())
    } else {
        Err(InvalidMetadata::Value(key.to_owned()))
    }
}

impl Metadata {
    /// An empty map, as a constant.
    pub const EMPTY: Metadata = Metadata { entries: Vec::new() };

    /// An empty map.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Appends an ASCII `value` under `key`.
    ///
    /// # Errors
    /// [`InvalidMetadata`] naming the key: a bad key, a key ending in `-bin`, a value with a byte
    /// other than visible ASCII or space, more than 65,535 entries.
    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), InvalidMetadata> {
        check_key(key)?;
        if is_binary_key(key) {
            return Err(InvalidMetadata::Suffix(key.to_owned()));
        }
        check_ascii(key, value.as_bytes())?;
        self.push(key, value.as_bytes())
    }

    /// Appends a binary `value` under `key`, which must end in `-bin`.
    ///
    /// # Errors
    /// As [`Metadata::insert`], and a key without the `-bin` suffix.
    pub fn insert_bin(&mut self, key: &str, value: &[u8]) -> Result<(), InvalidMetadata> {
        check_key(key)?;
        if !is_binary_key(key) {
            return Err(InvalidMetadata::Suffix(key.to_owned()));
        }
        self.push(key, value)
    }

    fn push(&mut self, key: &str, value: &[u8]) -> Result<(), InvalidMetadata> {
        if self.entries.len() >= usize::from(u16::MAX) {
            return Err(InvalidMetadata::TooMany);
        }
        self.entries.push((key.into(), value.into()));
        Ok(())
    }

    /// The first ASCII value under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        match self.iter().find(|(k, _)| *k == key)?.1 {
            MetadataValue::Ascii(s) => Some(s),
            MetadataValue::Binary(_) => None,
        }
    }

    /// The first binary value under `key` (a key ending in `-bin`).
    pub fn get_bin(&self, key: &str) -> Option<&[u8]> {
        match self.iter().find(|(k, _)| *k == key)?.1 {
            MetadataValue::Binary(b) => Some(b),
            MetadataValue::Ascii(_) => None,
        }
    }

    /// Every value under `key`, in the order inserted.
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = MetadataValue<'a>> + 'a {
        self.iter().filter(move |(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Removes every value under `key`; returns how many there were.
    pub fn remove(&mut self, key: &str) -> usize {
        let before = self.entries.len();
        self.entries.retain(|(k, _)| &**k != key);
        before - self.entries.len()
    }

    /// Every entry, in the order inserted.
    pub fn iter(&self) -> impl Iterator<Item = (&str, MetadataValue<'_>)> {
        self.entries.iter().map(|(k, v)| {
            let v = if is_binary_key(k) {
                MetadataValue::Binary(v)
            } else {
                // Checked ASCII at insert and at decode.
                MetadataValue::Ascii(std::str::from_utf8(v).unwrap_or_default())
            };
            (&**k, v)
        })
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True with no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of the encoded block (see the [module docs](self)).
    pub fn encoded_len(&self) -> usize {
        BLOCK_HEAD + self.entries.iter().map(|(k, v)| ENTRY_HEAD + k.len() + v.len()).sum::<usize>()
    }

    fn encode_into(&self, buf: &mut impl BufMut) {
        buf.put_u32_le((self.encoded_len() - 4) as u32);
        buf.put_u16_le(self.entries.len() as u16);
        for (k, v) in &self.entries {
            buf.put_u8(k.len() as u8);
            buf.put_slice(k.as_bytes());
            buf.put_u32_le(v.len() as u32);
            buf.put_slice(v);
        }
    }

    /// Splits a request body that starts with a metadata block into the block, decoded, and the
    /// message's bytes. Allocates only the entries.
    ///
    /// # Errors
    /// A block over `limit` bytes (RESOURCE_EXHAUSTED naming `ServerConfig::max_metadata_bytes`),
    /// or a malformed one (INVALID_ARGUMENT naming what is wrong).
    pub(crate) fn split(body: &[u8], limit: usize) -> Result<(Metadata, usize), crate::Status> {
        use crate::Status;
        let bad = |what: &str| Status::invalid_argument(format!("request metadata: {what}"));
        let len = body.get(..4).ok_or_else(|| bad("truncated block length"))?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let total = len.checked_add(4).ok_or_else(|| bad("block length"))?;
        if total > limit {
            return Err(Status::resource_exhausted(format!(
                "request metadata of {total} bytes is over the server's limit of {limit} \
                 (ServerConfig::max_metadata_bytes)"
            )));
        }
        let mut rest = body.get(4..total).ok_or_else(|| bad("block longer than the body"))?;
        let mut take = |n: usize| -> Result<&[u8], Status> {
            let (head, tail) = rest.split_at_checked(n).ok_or_else(|| bad("truncated entry"))?;
            rest = tail;
            Ok(head)
        };
        let count = take(2)?;
        let count = u16::from_le_bytes([count[0], count[1]]) as usize;
        let mut md = Metadata { entries: Vec::with_capacity(count.min(len / ENTRY_HEAD)) };
        for _ in 0..count {
            let klen = take(1)?[0] as usize;
            let key = std::str::from_utf8(take(klen)?).map_err(|_| bad("a key that is not ASCII"))?;
            check_key(key).map_err(|e| bad(&e.to_string()))?;
            let vlen = take(4)?;
            let vlen = u32::from_le_bytes([vlen[0], vlen[1], vlen[2], vlen[3]]) as usize;
            let value = take(vlen)?;
            if !is_binary_key(key) {
                check_ascii(key, value).map_err(|e| bad(&e.to_string()))?;
            }
            md.entries.push((key.into(), value.into()));
        }
        if !rest.is_empty() {
            return Err(bad("bytes after the last entry"));
        }
        Ok((md, total))
    }
}

/// A request message with, when metadata is given, its metadata block in front, as it travels:
/// encodes the block then the message (encode only; a server splits the block off before it
/// decodes the message). Without metadata it encodes exactly as the message.
pub(crate) struct WithMetadata<'a, M> {
    pub(crate) metadata: Option<&'a Metadata>,
    pub(crate) message: &'a M,
}

impl<'a, M> WithMetadata<'a, M> {
    #[inline]
    pub(crate) fn new(message: &'a M, metadata: Option<&'a Metadata>) -> Self {
        WithMetadata { metadata: metadata.filter(|m| !m.is_empty()), message }
    }

    /// The request flag to send with it ([`crate::wire::METADATA`] when it has a block).
    #[inline]
    pub(crate) fn flags(&self) -> u8 {
        if self.metadata.is_some() {
            crate::wire::METADATA
        } else {
            0
        }
    }
}

impl<M: fmt::Debug> fmt::Debug for WithMetadata<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithMetadata")
            .field("metadata", &self.metadata)
            .field("message", self.message)
            .finish()
    }
}

impl<M: Message> Message for WithMetadata<'_, M> {
    #[inline]
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(md) = self.metadata {
            md.encode_into(buf);
        }
        self.message.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Never decoded whole (the block is split off first): skipped.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    #[inline]
    fn encoded_len(&self) -> usize {
        self.metadata.map_or(0, Metadata::encoded_len) + self.message.encoded_len()
    }

    fn clear(&mut self) {}
}

/// A response's metadata: its headers and its trailers, as a server's handler sets them
/// ([`crate::RequestContext::set_headers`], [`crate::AsyncContext::set_headers`],
/// [`crate::Responder::set_headers`], and `set_trailers` beside each) and a client reads them
/// ([`CapturedMetadata`]; an error's come in its [`crate::Status::metadata`]).
///
/// On the wire (protocol 9) a response with metadata has the header's `METADATA` flag and its body
/// starts with two blocks of the request block's encoding (see the [module docs](self)), the
/// headers then the trailers, before the message (OK) or the status message (an error); a
/// response without carries neither flag nor bytes. A unary call's headers and trailers travel
/// together in its one response; a stream's with its end. A status's details travel as the
/// trailer [`crate::status::DETAILS_KEY`]. A client refuses blocks over
/// `ClientConfig::max_metadata_bytes` together (the call fails RESOURCE_EXHAUSTED naming it) and
/// malformed ones (INTERNAL).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseMetadata {
    headers: Metadata,
    trailers: Metadata,
}

impl ResponseMetadata {
    /// The headers.
    pub fn headers(&self) -> &Metadata {
        &self.headers
    }

    /// The headers, to change.
    pub fn headers_mut(&mut self) -> &mut Metadata {
        &mut self.headers
    }

    /// The trailers.
    pub fn trailers(&self) -> &Metadata {
        &self.trailers
    }

    /// The trailers, to change.
    pub fn trailers_mut(&mut self) -> &mut Metadata {
        &mut self.trailers
    }

    /// True with no header and no trailer.
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty() && self.trailers.is_empty()
    }

    /// The two blocks as they travel, the headers then the trailers; with `status`'s metadata
    /// appended to the trailers, and its details as the trailer [`crate::status::DETAILS_KEY`]
    /// (an error's).
    pub(crate) fn encode_blocks(md: Option<&ResponseMetadata>, status: Option<&crate::Status>) -> Vec<u8> {
        static EMPTY: Metadata = Metadata::EMPTY;
        let headers = md.map_or(&EMPTY, |m| &m.headers);
        let mut trailers = md.map_or_else(Metadata::new, |m| m.trailers.clone());
        if let Some(s) = status {
            for (k, v) in s.metadata().iter() {
                // Keys and values were checked when they were inserted.
                let _ = match v {
                    MetadataValue::Ascii(a) => trailers.insert(k, a),
                    MetadataValue::Binary(b) => trailers.insert_bin(k, b),
                };
            }
            if !s.details().is_empty() {
                let _ = trailers.insert_bin(crate::status::DETAILS_KEY, s.details());
            }
        }
        let mut out = Vec::with_capacity(headers.encoded_len() + trailers.encoded_len());
        headers.encode_into(&mut out);
        trailers.encode_into(&mut out);
        out
    }

    /// Splits a response body that starts with the two blocks into them, decoded, and the offset
    /// of what follows (the message or the status message).
    ///
    /// # Errors
    /// Blocks over `limit` bytes together: RESOURCE_EXHAUSTED naming
    /// `ClientConfig::max_metadata_bytes`; malformed blocks: INTERNAL naming what is wrong.
    pub(crate) fn split(body: &[u8], limit: usize) -> Result<(ResponseMetadata, usize), crate::Status> {
        let block_len = |at: usize| -> Result<usize, crate::Status> {
            let b = body.get(at..at + 4).ok_or_else(|| {
                crate::Status::internal("malformed response metadata from the server: truncated block length")
            })?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize + 4)
        };
        let first = block_len(0)?;
        let total = first.saturating_add(block_len(first).unwrap_or(0));
        if total > limit {
            return Err(crate::Status::resource_exhausted(format!(
                "response metadata of {total} bytes is over the client's limit of {limit} \
                 (ClientConfig::max_metadata_bytes)"
            )));
        }
        let bad = |s: crate::Status| {
            crate::Status::internal(format!("malformed response metadata from the server: {}", s.message()))
        };
        let (headers, at) = Metadata::split(body, usize::MAX).map_err(bad)?;
        let (trailers, n) = Metadata::split(&body[at..], usize::MAX).map_err(bad)?;
        Ok((ResponseMetadata { headers, trailers }, at + n))
    }
}

/// Where a call puts the response metadata it receives, as gRPC Go's `grpc.Header` and
/// `grpc.Trailer` call options do: give a clone to [`crate::CallOptions::capture_metadata`], make
/// the call (blocking, through a `Channel`, or a stream), then read it here. Filled when the
/// call's response arrives (a stream's with its end), OK or not; empty (`None`) while nothing
/// came or when the response carried no metadata. Clones share one slot.
#[derive(Clone, Debug, Default)]
pub struct CapturedMetadata(std::sync::Arc<std::sync::Mutex<Option<ResponseMetadata>>>);

impl CapturedMetadata {
    /// An empty slot.
    pub fn new() -> CapturedMetadata {
        CapturedMetadata::default()
    }

    /// A copy of what the response carried (`None`: nothing received, or no metadata).
    pub fn get(&self) -> Option<ResponseMetadata> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Takes what the response carried, leaving the slot empty.
    pub fn take(&self) -> Option<ResponseMetadata> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Stores a response's metadata (a later response of a call that reuses these options
    /// replaces it).
    pub(crate) fn fill(&self, md: ResponseMetadata) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(md);
    }
}

impl PartialEq for CapturedMetadata {
    /// The same slot.
    fn eq(&self, other: &CapturedMetadata) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CapturedMetadata {}

/// A response message with its metadata blocks in front, as it travels (encode only; a client
/// splits the blocks off before it decodes the message).
pub(crate) struct WithResponseMetadata<M> {
    pub(crate) blocks: Vec<u8>,
    pub(crate) message: M,
}

impl<M: fmt::Debug> fmt::Debug for WithResponseMetadata<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithResponseMetadata")
            .field("blocks", &self.blocks.len())
            .field("message", &self.message)
            .finish()
    }
}

impl<M: Message> Message for WithResponseMetadata<M> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.blocks);
        self.message.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Never decoded whole (the blocks are split off first): skipped.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.blocks.len() + self.message.encoded_len()
    }

    fn clear(&mut self) {}
}

#[cfg(test)]
mod response_tests {
    use super::*;

    fn sample() -> (ResponseMetadata, Vec<u8>) {
        let mut md = ResponseMetadata::default();
        md.headers_mut().insert("x-h", "v").unwrap();
        md.trailers_mut().insert_bin("x-t-bin", &[0, 255]).unwrap();
        let mut s = crate::Status::with_details(crate::Code::Aborted, "m", vec![8, 1]);
        s.metadata_mut().insert("x-s", "w").unwrap();
        let mut body = ResponseMetadata::encode_blocks(Some(&md), Some(&s));
        body.extend_from_slice(b"message");
        (md, body)
    }

    #[test]
    fn blocks_round_trip_with_the_status_trailers_and_details() {
        let (md, body) = sample();
        let (back, at) = ResponseMetadata::split(&body, 8192).unwrap();
        assert_eq!(&body[at..], b"message");
        assert_eq!(back.headers(), md.headers());
        assert_eq!(back.trailers().get_bin("x-t-bin"), Some(&[0, 255][..]));
        assert_eq!(back.trailers().get("x-s"), Some("w"));
        assert_eq!(back.trailers().get_bin(crate::status::DETAILS_KEY), Some(&[8, 1][..]));
        // The limit counts both blocks.
        let e = ResponseMetadata::split(&body, at - 1).unwrap_err();
        assert_eq!(e.code(), crate::Code::ResourceExhausted);
        assert!(e.message().contains("ClientConfig::max_metadata_bytes"), "{e}");
        assert!(ResponseMetadata::split(&body, at).is_ok());
    }

    #[test]
    fn a_hostile_servers_blocks_are_an_error_never_a_panic() {
        let (_, body) = sample();
        for n in 0..body.len() {
            if let Err(e) = ResponseMetadata::split(&body[..n], 8192) {
                assert!(matches!(e.code(), crate::Code::Internal | crate::Code::ResourceExhausted), "{e}");
            }
        }
        for i in 0..body.len() {
            for b in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut c = body.clone();
                c[i] = b;
                if let Ok((_, at)) = ResponseMetadata::split(&c, 8192) {
                    assert!(at <= c.len());
                }
            }
        }
        // Lengths near u32::MAX in either block: refused over the limit, nothing read past the body.
        let mut c = body.clone();
        c[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(ResponseMetadata::split(&c, 8192).unwrap_err().code(), crate::Code::ResourceExhausted);
        let (_, at) = Metadata::split(&body, 8192).unwrap();
        let mut c = body.clone();
        c[at..at + 4].copy_from_slice(&(u32::MAX - 3).to_le_bytes());
        assert_eq!(ResponseMetadata::split(&c, usize::MAX).unwrap_err().code(), crate::Code::Internal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_values_and_the_block_round_trip() {
        let mut md = Metadata::new();
        md.insert("authorization", "Bearer abc").unwrap();
        md.insert("x-trace", "1").unwrap();
        md.insert("x-trace", "2").unwrap();
        md.insert_bin("blob-bin", &[0, 255, 10]).unwrap();
        assert!(matches!(md.insert("Upper", "x"), Err(InvalidMetadata::Key(_))));
        assert!(matches!(md.insert("", "x"), Err(InvalidMetadata::Key(_))));
        assert!(matches!(md.insert("k", "tab\t"), Err(InvalidMetadata::Value(_))));
        assert!(matches!(md.insert("k-bin", "x"), Err(InvalidMetadata::Suffix(_))));
        assert!(matches!(md.insert_bin("k", b"x"), Err(InvalidMetadata::Suffix(_))));
        assert_eq!(md.get("authorization"), Some("Bearer abc"));
        assert_eq!(md.get_all("x-trace").count(), 2);
        assert_eq!(md.get_bin("blob-bin"), Some(&[0, 255, 10][..]));
        let msg = 42u32;
        let body = WithMetadata::new(&msg, Some(&md)).encode_to_vec();
        assert_eq!(body.len(), md.encoded_len() + msg.encoded_len());
        let (back, at) = Metadata::split(&body, 8192).unwrap();
        assert_eq!(back, md);
        assert_eq!(u32::decode(&body[at..]).unwrap(), 42);
        assert_eq!(md.remove("x-trace"), 2);
        assert_eq!(md.len(), 2);
    }

    #[test]
    fn a_hostile_block_is_refused_not_trusted() {
        let mut md = Metadata::new();
        md.insert("k", "v").unwrap();
        let body = WithMetadata::new(&7u32, Some(&md)).encode_to_vec();
        // Over the limit.
        assert_eq!(Metadata::split(&body, 8).unwrap_err().code(), crate::Code::ResourceExhausted);
        // Every truncation, and every single-byte corruption, is an error or a valid block: never
        // a panic or a read past the body.
        for n in 0..body.len() {
            let _ = Metadata::split(&body[..n], 8192);
        }
        for i in 0..md.encoded_len() {
            for b in [0u8, 1, 0x7f, 0xff] {
                let mut c = body.clone();
                c[i] = b;
                let _ = Metadata::split(&c, 8192);
            }
        }
        // A count claiming more entries than there are bytes.
        let mut c = body.clone();
        c[4] = 0xff;
        c[5] = 0xff;
        assert_eq!(Metadata::split(&c, 8192).unwrap_err().code(), crate::Code::InvalidArgument);
    }
}
