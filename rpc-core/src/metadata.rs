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
//!
//! A block repeated from call to call (an auth token, a tenant) crosses the wire once per
//! session (protocol 11, as HPACK's dynamic table saves HTTP/2's headers): a server keeps the
//! last block an eager request stored as its session's cached block (at most
//! [`crate::wire::MAX_CACHED_BLOCK`] bytes), and a later eager request with the same block
//! names it with a header flag instead of carrying it. The client decides, per call, in the
//! session ([`crate::session::Session::metadata_cache_flag`]); handlers and interceptors see the
//! same metadata either way. `Counters::metadata_cached` counts the calls that named it.

use std::fmt;

use bytes::BufMut;
use prost::Message;

use crate::buffers::text::ascii_str;

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
///
/// Held as it travels: the entries' encoding (the block without its 6-byte head) in one buffer,
/// so a copy is one allocation, encoding it is one copy, and a server decodes a block by
/// checking it and copying its bytes (into a reused buffer: none allocated per call).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Per entry: the key's length (1 byte), the key, the value's length (4 bytes,
    /// little-endian), the value. Always well-formed (checked at insert and at decode).
    bytes: Vec<u8>,
    /// Entries in `bytes`.
    count: u16,
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
) -> Result<Option<Intercepted<'a>>, crate::Status> {
    match interceptor {
        None => Ok(given.map(Intercepted::Given)),
        Some(i) => intercept_reusing(given, i).map(|md| Some(Intercepted::Owned(md))),
    }
}

/// The metadata a call sends ([`intercepted`]): the options' own, or the interceptor's copy,
/// whose buffer goes back to the thread's spare when dropped (the next call's copy reuses it:
/// no allocation per call).
pub(crate) enum Intercepted<'a> {
    /// The options' metadata (no interceptor).
    Given(&'a Metadata),
    /// The copy the interceptor ran on.
    Owned(Metadata),
}

impl std::ops::Deref for Intercepted<'_> {
    type Target = Metadata;
    #[inline]
    fn deref(&self) -> &Metadata {
        match self {
            Intercepted::Given(m) => m,
            Intercepted::Owned(m) => m,
        }
    }
}

impl Drop for Intercepted<'_> {
    fn drop(&mut self) {
        if let Intercepted::Owned(m) = self {
            let bytes = std::mem::take(&mut m.bytes);
            // A buffer an interceptor grew past a few KiB is not kept.
            if bytes.capacity() <= SPARE_MAX {
                SPARE.set(bytes);
            }
        }
    }
}

/// Most bytes of capacity the thread's spare buffer keeps.
const SPARE_MAX: usize = 4096;
/// Capacity added to a copy for the interceptor's entries (no reallocation when it adds a few).
const HEADROOM: usize = 64;

thread_local! {
    /// The buffer of the thread's last interceptor copy ([`Intercepted`]).
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// [`run_interceptor`] on a copy made in the thread's spare buffer.
fn intercept_reusing(given: Option<&Metadata>, i: &ClientInterceptor) -> Result<Metadata, crate::Status> {
    let mut bytes = SPARE.take();
    bytes.clear();
    let mut md = match given {
        Some(g) => {
            bytes.reserve(g.bytes.len() + HEADROOM);
            bytes.extend_from_slice(&g.bytes);
            Metadata { bytes, count: g.count }
        }
        None => Metadata { bytes, count: 0 },
    };
    i.intercept(&mut md)?;
    Ok(md)
}

/// Runs `i` on a copy of `given` (empty when `None`): the metadata a call with an interceptor
/// sends.
///
/// # Errors
/// The interceptor's status.
pub(crate) fn run_interceptor(
    given: Option<&Metadata>,
    i: &ClientInterceptor,
) -> Result<Metadata, crate::Status> {
    let mut md = match given {
        Some(g) => {
            let mut bytes = Vec::with_capacity(g.bytes.len() + HEADROOM);
            bytes.extend_from_slice(&g.bytes);
            Metadata { bytes, count: g.count }
        }
        None => Metadata::new(),
    };
    i.intercept(&mut md)?;
    Ok(md)
}

/// Fixed bytes of the block: its length and its entry count.
pub(crate) const BLOCK_HEAD: usize = 4 + 2;
/// Fixed bytes per entry: the key's length and the value's.
const ENTRY_HEAD: usize = 1 + 4;

/// The bytes a key may hold: `a-z 0-9 - _ .` (1), and the others (0).
static KEY_BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_' || c == b'.' {
            t[b] = 1;
        }
        b += 1;
    }
    t
};

/// 1 to 255 bytes of `a-z 0-9 - _ .` (so ASCII, so UTF-8).
#[inline]
fn key_ok(key: &[u8]) -> bool {
    // No early exit: a table load and an AND per byte.
    !key.is_empty() && key.len() <= 255 && key.iter().fold(1u8, |ok, &b| ok & KEY_BYTES[usize::from(b)]) == 1
}

/// Visible ASCII and spaces only (`0x20..=0x7e`).
#[inline]
fn ascii_ok(value: &[u8]) -> bool {
    // Eight bytes per step, no early exit (values are a few words long: a byte loop costs more).
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    /// The high bit of each byte of `x` outside `0x20..=0x7e`: set high bits (0x80 and over),
    /// bytes below 0x20 (a borrow into the high bit of a byte whose own high bit is clear), and
    /// 0x7f (a zero byte of `x ^ 0x7f..`). Exact as a whole (any byte outside: non-zero); see
    /// "Determine if a word has a byte less than n" in Sean Eron Anderson's Bit Twiddling Hacks.
    #[inline(always)]
    fn outside(x: u64) -> u64 {
        let below = x.wrapping_sub(ONES * 0x20) & !x;
        let y = x ^ (ONES * 0x7f);
        let del = y.wrapping_sub(ONES) & !y;
        (x | below | del) & HIGH
    }
    let mut bad = 0;
    let mut words = value.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        bad |= outside(u64::from_le_bytes(b));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        // Padded with spaces (allowed).
        let mut b = [0x20u8; 8];
        b[..rest.len()].copy_from_slice(rest);
        bad |= outside(u64::from_le_bytes(b));
    }
    bad == 0
}

fn check_key(key: &str) -> Result<(), InvalidMetadata> {
    if key_ok(key.as_bytes()) {
        Ok(())
    } else {
        Err(InvalidMetadata::Key(key.to_owned()))
    }
}

/// Two keys are equal: keys of 8 to 16 bytes (most) as two overlapping 8-byte words each,
/// without a call to `memcmp`.
#[inline]
fn key_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if (8..=16).contains(&n) {
        let word =
            |s: &[u8], at: usize| s.get(at..at + 8).and_then(|w| w.try_into().ok()).map(u64::from_ne_bytes);
        return word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8);
    }
    a == b
}

#[inline]
fn is_binary_key(key: &[u8]) -> bool {
    key.ends_with(b"-bin")
}

fn check_ascii(key: &str, value: &[u8]) -> Result<(), InvalidMetadata> {
    if ascii_ok(value) {
        Ok(())
    } else {
        Err(InvalidMetadata::Value(key.to_owned()))
    }
}

/// The entries of a well-formed entry encoding, in order (raw key and value bytes). Stops at
/// the first malformed entry (none in a [`Metadata`]: its bytes are checked when they go in).
#[derive(Clone)]
struct Raw<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Raw<'a> {
    type Item = (&'a [u8], &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let (&klen, r) = self.rest.split_first()?;
        let (key, r) = r.split_at_checked(usize::from(klen))?;
        let (vlen, r) = r.split_first_chunk::<4>()?;
        let (value, r) = r.split_at_checked(u32::from_le_bytes(*vlen) as usize)?;
        self.rest = r;
        Some((key, value))
    }
}

/// An entry read from a [`Metadata`]'s checked bytes as the public types.
#[inline]
fn typed<'a>((k, v): (&'a [u8], &'a [u8])) -> (&'a str, MetadataValue<'a>) {
    // Checked at insert and at decode: keys and ASCII values are ASCII.
    let key = ascii_str(k).unwrap_or_default();
    let value = if is_binary_key(k) {
        MetadataValue::Binary(v)
    } else {
        MetadataValue::Ascii(ascii_str(v).unwrap_or_default())
    };
    (key, value)
}

impl Metadata {
    /// An empty map, as a constant.
    pub const EMPTY: Metadata = Metadata { bytes: Vec::new(), count: 0 };

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
        if is_binary_key(key.as_bytes()) {
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
        if !is_binary_key(key.as_bytes()) {
            return Err(InvalidMetadata::Suffix(key.to_owned()));
        }
        self.push(key, value)
    }

    fn push(&mut self, key: &str, value: &[u8]) -> Result<(), InvalidMetadata> {
        if self.count == u16::MAX {
            return Err(InvalidMetadata::TooMany);
        }
        // A value's length travels in 4 bytes (and a block in one message).
        let vlen = u32::try_from(value.len()).map_err(|_| InvalidMetadata::Value(key.to_owned()))?;
        self.bytes.reserve(ENTRY_HEAD + key.len() + value.len());
        self.bytes.push(key.len() as u8);
        self.bytes.extend_from_slice(key.as_bytes());
        self.bytes.extend_from_slice(&vlen.to_le_bytes());
        self.bytes.extend_from_slice(value);
        self.count += 1;
        Ok(())
    }

    fn raw(&self) -> Raw<'_> {
        Raw { rest: &self.bytes }
    }

    /// The first value under `key`, raw.
    #[inline]
    fn first(&self, key: &str) -> Option<&[u8]> {
        let key = key.as_bytes();
        self.raw().find(|(k, _)| key_eq(k, key)).map(|(_, v)| v)
    }

    /// The first ASCII value under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        if is_binary_key(key.as_bytes()) {
            return None;
        }
        // Checked ASCII at insert and at decode.
        self.first(key).map(|v| ascii_str(v).unwrap_or_default())
    }

    /// The first binary value under `key` (a key ending in `-bin`).
    pub fn get_bin(&self, key: &str) -> Option<&[u8]> {
        if !is_binary_key(key.as_bytes()) {
            return None;
        }
        self.first(key)
    }

    /// Every value under `key`, in the order inserted.
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = MetadataValue<'a>> + 'a {
        self.raw().filter(move |(k, _)| *k == key.as_bytes()).map(|e| typed(e).1)
    }

    /// Removes every value under `key`; returns how many there were.
    pub fn remove(&mut self, key: &str) -> usize {
        let found = self.raw().filter(|(k, _)| *k == key.as_bytes()).count();
        if found == 0 {
            return 0;
        }
        let mut kept = Vec::with_capacity(self.bytes.len());
        let mut count = 0;
        for (k, v) in self.raw().filter(|(k, _)| *k != key.as_bytes()) {
            kept.push(k.len() as u8);
            kept.extend_from_slice(k);
            kept.extend_from_slice(&(v.len() as u32).to_le_bytes());
            kept.extend_from_slice(v);
            count += 1;
        }
        self.bytes = kept;
        self.count = count;
        found
    }

    /// Every entry, in the order inserted.
    pub fn iter(&self) -> impl Iterator<Item = (&str, MetadataValue<'_>)> {
        self.raw().map(typed)
    }

    /// Entries.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// True with no entry.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of the encoded block (see the [module docs](self)).
    pub fn encoded_len(&self) -> usize {
        BLOCK_HEAD + self.bytes.len()
    }

    /// The entries as they travel: the block without its 6-byte head (what a session's cached
    /// block is compared by, [`crate::wire::METADATA_CACHED`]).
    #[inline]
    pub(crate) fn entries(&self) -> &[u8] {
        &self.bytes
    }

    /// Encodes the block (see the [module docs](self); [`Metadata::encoded_len`] bytes) into
    /// `buf`.
    #[inline]
    pub(crate) fn encode_into(&self, buf: &mut impl BufMut) {
        buf.put_u32_le((self.encoded_len() - 4) as u32);
        buf.put_u16_le(self.count);
        buf.put_slice(&self.bytes);
    }

    /// Splits a request body that starts with a metadata block into the block, decoded, and the
    /// message's bytes (where it starts in `body`). Allocates one buffer.
    ///
    /// # Errors
    /// A block over `limit` bytes (RESOURCE_EXHAUSTED naming `ServerConfig::max_metadata_bytes`),
    /// or a malformed one (INVALID_ARGUMENT naming what is wrong).
    pub(crate) fn split(body: &[u8], limit: usize) -> Result<(Metadata, usize), crate::Status> {
        let mut md = Metadata::new();
        let at = md.split_into(body, limit)?;
        Ok((md, at))
    }

    /// [`Metadata::split`] into `self`, reusing its buffer (no allocation once it is large
    /// enough); returns where the message starts in `body`. A block equal to the one `self`
    /// holds (a client sending the same entries call after call) is taken as it is: those
    /// bytes were checked when they went in. On an error `self` is empty.
    ///
    /// # Errors
    /// As [`Metadata::split`].
    pub(crate) fn split_into(&mut self, body: &[u8], limit: usize) -> Result<usize, crate::Status> {
        let (count, entries, total) = match Self::block(body, limit) {
            Ok(b) => b,
            Err(e) => {
                self.bytes.clear();
                self.count = 0;
                return Err(e);
            }
        };
        if count == self.count && entries == self.bytes.as_slice() {
            return Ok(total);
        }
        self.bytes.clear();
        self.count = 0;
        Self::check_entries(count, entries)?;
        self.bytes.extend_from_slice(entries);
        self.count = count;
        Ok(total)
    }

    /// The block at the front of `body`, its frame checked (not its entries): its entry count,
    /// its entries' bytes, and its length with the head.
    fn block(body: &[u8], limit: usize) -> Result<(u16, &[u8], usize), crate::Status> {
        use crate::Status;
        let Some((len, _)) = body.split_first_chunk::<4>() else {
            return Err(bad_block("truncated block length"));
        };
        let len = u32::from_le_bytes(*len) as usize;
        let total = len.checked_add(4).ok_or_else(|| bad_block("block length"))?;
        if total > limit {
            return Err(Status::resource_exhausted(format!(
                "request metadata of {total} bytes is over the server's limit of {limit} \
                 (ServerConfig::max_metadata_bytes)"
            )));
        }
        let block = body.get(4..total).ok_or_else(|| bad_block("block longer than the body"))?;
        let Some((count, entries)) = block.split_first_chunk::<2>() else {
            return Err(bad_block("truncated entry"));
        };
        Ok((u16::from_le_bytes(*count), entries, total))
    }

    /// Checks that `entries` are exactly `count` well-formed entries.
    fn check_entries(count: u16, entries: &[u8]) -> Result<(), crate::Status> {
        let mut rest = entries;
        for _ in 0..count {
            let truncated = || bad_block("truncated entry");
            let (&klen, r) = rest.split_first().ok_or_else(truncated)?;
            let (key, r) = r.split_at_checked(usize::from(klen)).ok_or_else(truncated)?;
            if !key_ok(key) {
                let key = String::from_utf8_lossy(key);
                return Err(bad_block(&InvalidMetadata::Key(key.into_owned()).to_string()));
            }
            let (vlen, r) = r.split_first_chunk::<4>().ok_or_else(truncated)?;
            let vlen = u32::from_le_bytes(*vlen) as usize;
            let (value, r) = r.split_at_checked(vlen).ok_or_else(truncated)?;
            if !is_binary_key(key) && !ascii_ok(value) {
                let key = String::from_utf8_lossy(key);
                return Err(bad_block(&InvalidMetadata::Value(key.into_owned()).to_string()));
            }
            rest = r;
        }
        if !rest.is_empty() {
            return Err(bad_block("bytes after the last entry"));
        }
        Ok(())
    }
}

/// INVALID_ARGUMENT for a malformed block, saying `what` is wrong.
#[cold]
fn bad_block(what: &str) -> crate::Status {
    crate::Status::invalid_argument(format!("request metadata: {what}"))
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
/// ([`crate::dispatch::reply::RequestContext::set_headers`], [`crate::AsyncContext::set_headers`],
/// [`crate::dispatch::reply::Responder::set_headers`], and `set_trailers` beside each) and a client reads them
/// ([`CapturedMetadata`]; an error's come in its [`crate::Status::metadata`]).
///
/// On the wire (protocol 10) a response with metadata has the header's `METADATA` flag and its
/// body starts with two blocks of the request block's encoding (see the [module docs](self)),
/// the headers then the trailers, before the message (OK) or the status message (an error); a
/// response without carries neither flag nor bytes. A unary call's headers and trailers travel
/// together in its one response. A server stream's headers, set before its first message,
/// travel in front of that message (one block under the same flag; if that message is a batch
/// too full for them, in front of the next one with room, or with the end), as gRPC sends
/// headers before messages; its trailers (and headers set later) with its end. A status's details travel as the
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
/// call's response arrives, OK or not; a server stream's headers come with its first message
/// when the handler set them before it (readable then, the trailers still empty), its trailers
/// with its end. Empty (`None`) while nothing came or when the response carried no metadata.
/// Clones share one slot.
#[derive(Clone, Debug, Default)]
pub struct CapturedMetadata(std::sync::Arc<std::sync::Mutex<Captured>>);

/// A [`CapturedMetadata`]'s slot.
#[derive(Debug, Default)]
struct Captured {
    md: Option<ResponseMetadata>,
    /// `md` holds a stream's headers that came before its end.
    early: bool,
}

impl CapturedMetadata {
    /// An empty slot.
    pub fn new() -> CapturedMetadata {
        CapturedMetadata::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Captured> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of what the response carried (`None`: nothing received, or no metadata).
    pub fn get(&self) -> Option<ResponseMetadata> {
        self.lock().md.clone()
    }

    /// Takes what the response carried, leaving the slot empty.
    pub fn take(&self) -> Option<ResponseMetadata> {
        let mut c = self.lock();
        c.early = false;
        c.md.take()
    }

    /// Stores a response's metadata (a later response of a call that reuses these options
    /// replaces it); headers that came early with the stream's first message stay when the
    /// end brings none.
    pub(crate) fn fill(&self, mut md: ResponseMetadata) {
        let mut c = self.lock();
        if std::mem::take(&mut c.early) && md.headers.is_empty() {
            if let Some(early) = c.md.take() {
                md.headers = early.headers;
            }
        }
        c.md = Some(md);
    }

    /// A call starts filling the slot: headers an earlier stream left early are not this call's.
    pub(crate) fn begin(&self) {
        self.lock().early = false;
    }

    /// Stores a stream's headers, come with its first message (its trailers follow with its end).
    pub(crate) fn fill_headers(&self, headers: Metadata) {
        let mut c = self.lock();
        c.md = Some(ResponseMetadata { headers, trailers: Metadata::new() });
        c.early = true;
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
    fn key_eq_agrees_with_slice_equality() {
        // Every length to 20 (the word path is 8..=16), a difference at every position.
        for n in 0..=20usize {
            let a: Vec<u8> = (0..n as u8).map(|i| b'a' + i).collect();
            assert!(key_eq(&a, &a.clone()), "len {n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] = b'-';
                assert!(!key_eq(&a, &b), "len {n}, differing at {at}");
            }
            assert!(!key_eq(&a, &a[..n.saturating_sub(1)]) || n == 0, "len {n} against a prefix");
        }
    }

    #[test]
    fn get_finds_the_first_entry_of_its_key_among_keys_of_every_length() {
        let mut md = Metadata::new();
        let keys: Vec<String> = (1..=20).map(|n| "k".repeat(n)).collect();
        for (i, k) in keys.iter().enumerate() {
            md.insert(k, &format!("value {i} of a length that varies {}", "x".repeat(i))).unwrap();
        }
        md.insert(&keys[4], "second").unwrap();
        for (i, k) in keys.iter().enumerate() {
            let want = format!("value {i} of a length that varies {}", "x".repeat(i));
            assert_eq!(md.get(k), Some(want.as_str()), "{k}");
        }
        // Same length, different bytes; and absent lengths.
        assert_eq!(md.get("kkkkj"), None);
        assert_eq!(md.get(&"k".repeat(21)), None);
        assert_eq!(md.get_all(&keys[4]).count(), 2);
    }

    #[test]
    fn the_word_at_a_time_value_check_agrees_with_a_byte_loop() {
        let naive = |v: &[u8]| v.iter().all(|&b| (0x20..=0x7e).contains(&b));
        // Every byte value at every position of values of 0 to 17 bytes, in a valid filler.
        for len in 0..=17usize {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    assert_eq!(ascii_ok(&v), naive(&v), "byte {b:#04x} at {at} of {len}");
                    // And next to the edges of the range (borrows between neighbours).
                    for n in [0x00, 0x1f, 0x20, 0x7e, 0x7f, 0x80, 0xff] {
                        if at + 1 < len {
                            v[at + 1] = n;
                            assert_eq!(ascii_ok(&v), naive(&v), "{v:x?}");
                            v[at + 1] = b'a';
                        }
                    }
                }
            }
        }
        assert!(ascii_ok(b""));
    }

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
        // Decoding into a buffer that holds a block (a worker's reused one) gives what a fresh
        // decode gives: the same block is taken as it is, any other is checked.
        let mut two = Metadata::new();
        two.insert("k", "v").unwrap();
        two.insert_bin("b-bin", &[0xff, 0]).unwrap();
        let body2 = WithMetadata::new(&7u32, Some(&two)).encode_to_vec();
        for held in [&md, &two] {
            for base in [&body, &body2] {
                for i in 0..base.len() {
                    for b in [0u8, 1, b'K', 0x7f, 0xff] {
                        let mut c = base.clone();
                        c[i] = b;
                        let mut reused = held.clone();
                        let fresh = Metadata::split(&c, 8192);
                        let again = reused.split_into(&c, 8192);
                        match (fresh, again) {
                            (Ok((m, at)), Ok(at2)) => assert_eq!((m, at), (reused, at2), "byte {i} = {b}"),
                            (Err(e), Err(e2)) => {
                                assert_eq!(e.code(), e2.code());
                                assert!(reused.is_empty());
                            }
                            (f, a) => panic!("byte {i} = {b}: fresh {f:?}, reused {a:?}"),
                        }
                    }
                }
                for n in 0..base.len() {
                    let mut reused = held.clone();
                    assert_eq!(
                        reused.split_into(&base[..n], 8192).is_ok(),
                        Metadata::split(&base[..n], 8192).is_ok()
                    );
                }
            }
        }
        // A count claiming more entries than there are bytes.
        let mut c = body.clone();
        c[4] = 0xff;
        c[5] = 0xff;
        assert_eq!(Metadata::split(&c, 8192).unwrap_err().code(), crate::Code::InvalidArgument);
    }
}
