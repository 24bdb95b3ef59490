//! The message header: the first [`HEADER_LEN`] bytes of every SEND between two sessions.
//!
//! Layout (little endian, 40 bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | kind (1 request, 2 response, 3 ring-space return, 4 close, 5 cancel, 6 ping, 7 pong, 8 stream message, 9 stream end, 10 stream grant, 11 cancel acknowledgement, 12 ring ask, 13 ring grant, 14 ring reclaim, 15 ring release) |
//! | 1 | 1 | flags (bit 0: body in the receiver's ring; bit 1: the request opens a stream of client messages; bit 2: of server messages; bit 3: a stream message is a batch, see below; bit 4: a request's body starts with a metadata block, a response's with two (headers, trailers), a server's stream message's with one (the stream's headers), see [`crate::metadata`]; bit 5: a request's block is also kept as the session's cached block; bit 6: a request's metadata is the session's cached block, its body has none; see [`METADATA_STORE`]) |
//! | 2 | 1 | status code (gRPC canonical; 0 in requests) |
//! | 3 | 1 | reserved, 0 |
//! | 4 | 2 | request slot |
//! | 6 | 2 | count: stream grants, stream SENDs the sender lets the receiver send on the stream (a stream-opening request, a stream grant); on a credit grant or its acknowledgement, the session's request credits; on a batch, the number of messages in it; on a response, the server's load (see below); 0 otherwise |
//! | 8 | 4 | slot generation |
//! | 12 | 4 | method id (requests; echoed on responses) |
//! | 16 | 4 | body length in bytes: of this piece (eager: the bytes after the header) |
//! | 20 | 4 | ring offset of the body (when in the ring), else 0 |
//! | 24 | 4 | freed head: bytes of the sender's ring freed so far (wrapping counter) |
//! | 28 | 4 | requests: timeout in µs (0 = none); every other message from a server: the wrapping count of the client's stream SENDs the server has taken (`stream_taken`, see below); 0 in every other message from a client |
//! | 32 | 4 | session id assigned by the server at handshake |
//! | 36 | 4 | total body length of the message in bytes (equals the body length unless pieced) |
//!
//! **Load on responses** (protocol 8). A response's `count` is the server's load when it was
//! sent: the requests its sessions have admitted and not yet answered, over all of them, this
//! one included, at most 65,535. A client's balancer compares it between servers
//! (`crate::balance`, power of two choices); nothing else reads it.
//!
//! The body follows the header in the same SEND (eager) or was written by RDMA WRITE into the
//! receiver's ring before the SEND (RC ordering makes it visible first). A ring body larger than
//! the ring, or than what the ring has free, travels in pieces: several messages with the same
//! kind, slot, generation, method and `total_len`, each a ring body of `body_len` bytes, in order;
//! the message is complete when the pieces add up to `total_len`.
//!
//! Control messages carry no body and no call fields except: a Close may carry a status and an
//! eager reason of at most [`super::MAX_CLOSE_REASON`] bytes (`super::close`); a Cancel, its acknowledgement, a
//! stream end and a stream grant name the call by `slot` and `generation`, a stream grant carries `count`; every
//! message carries `freed_head` and `session`. The ring lease messages (protocol 12,
//! [`super::ring_lease`]) carry eager bodies of their own: a [`Kind::RingAsk`] the 4 bytes of
//! the ring it asks for, a [`Kind::RingGrant`] the 16 bytes of the ring granted (status OK) or,
//! refused, a status and a reason as a Close's; a [`Kind::RingReclaim`] and a
//! [`Kind::RingRelease`] carry none. A [`Kind::CreditGrant`] and a [`Kind::CreditAck`] (protocol
//! 12) carry the session's request credits in `count` and no body.
//!
//! **Streams.** A stream is a call whose slot stays open: a request with [`STREAM_IN`] and/or
//! [`STREAM_OUT`] opens it (its body is the request message of a server stream, empty
//! otherwise; its `count` is the stream grants for the server messages the client is ready for), stream messages
//! ([`Kind::StreamMsg`], bodies like any other, eager or ring or in pieces) carry the messages in
//! either direction, each taking one stream grant its receiver granted ([`Kind::StreamGrant`]),
//! a stream end ([`Kind::StreamEnd`]) ends the client's messages, and the response (its status)
//! ends the stream. A Cancel ends it from the client, an error status from the server. Every
//! response still returns exactly one request credit; nothing else does.
//!
//! **Stream batches.** A stream grant is one stream SEND (one receive WQE, one receive buffer at
//! the consumer), not one message: several small messages of one stream may travel in one eager
//! SEND, a [`Kind::StreamMsg`] with the [`STREAM_BATCH`] flag. Its `count` field is the number
//! of messages `n` (1 ..= [`MAX_BATCH`]); its body (eager only, never in the ring, never in
//! pieces) is `n` frames, each a 4-byte little-endian message length followed by that many bytes,
//! and nothing after the last frame:
//!
//! | offset (in the body) | size | field |
//! |---|---|---|
//! | 0 | 4 | length `l0` of message 0 in bytes |
//! | 4 | `l0` | message 0 |
//! | 4 + `l0` | 4 | length `l1` of message 1 |
//! | ... | | up to message `n - 1`, ending exactly at `body_len` |
//!
//! **Stream SENDs hold request credits.** Every stream SEND a client sends (a stream message, a
//! stream grant, a stream end) holds one of the session's request credits from when it is sent
//! until a server header counts it taken: every message from the server carries `stream_taken`,
//! the wrapping count of the client's stream SENDs the server has taken off its receive queue (a
//! message in pieces when its last piece is in). So the client's requests and stream SENDs that
//! the server has not taken are together at most its credits plus
//! [`crate::session::STREAM_RESERVED_CREDITS`] (credits only stream SENDs use, so a stream always
//! moves), and the server reserves receive WQEs per session for that (`endpoint::conn::srq_need`);
//! a client beyond it is closed. A server sends a [`Kind::RingReturn`] for the count alone
//! only when the SENDs it took unreported and its unanswered requests hold all those credits
//! (only then can the client be waiting for it) and no other message carries the count.
//!
//! [`batch_frames`] checks a received batch (count, lengths, exact tiling) before anything reads
//! it; a batch that does not check closes the session.

use super::WireError;
use crate::status::Code;

/// Bytes of an encoded header.
pub const HEADER_LEN: usize = 40;

/// Flag: the body is in the receiver's ring at `ring_offset`, not after the header.
pub const BODY_IN_RING: u8 = 1;

/// Flag of a request: it opens a stream on which the client sends messages (client streaming,
/// bidirectional).
pub const STREAM_IN: u8 = 2;

/// Flag of a request: it opens a stream on which the server sends messages (server streaming,
/// bidirectional).
pub const STREAM_OUT: u8 = 4;

/// Flag of a stream message: its eager body is a batch of `count` messages in frames (see the
/// module docs).
pub const STREAM_BATCH: u8 = 8;

/// Flag of a request: its body starts with a metadata block; of a response: with two, its
/// headers then its trailers, before the message (OK) or the status message (an error); of a
/// stream message (a server's): with one, the stream's response headers, before its message or
/// its batch's frames ([`crate::metadata`]).
pub const METADATA: u8 = 16;

/// Flag of a request with [`METADATA`] (protocol 11): the server also keeps its block as the
/// session's cached block, replacing the one it kept, for the requests with [`METADATA_CACHED`]
/// that follow it on the session. Only on an eager request (its body in the SEND, never in the
/// ring) whose block is at most [`MAX_CACHED_BLOCK`] bytes, so a server takes the blocks in the
/// order the client sent them; the server keeps a refused block's status instead (over its
/// `max_metadata_bytes`, or malformed) and answers the requests that name it with that status.
/// gRPC over HTTP/2 saves the same bytes with HPACK's dynamic table.
pub const METADATA_STORE: u8 = 32;

/// Flag of a request (protocol 11): its metadata is the session's cached block (the last one a
/// [`METADATA_STORE`] request carried before it on the session); its body has no block. Never
/// with [`METADATA`]; only on an eager request; a server that kept no block closes the session
/// (a protocol violation). A client sends it only when the block it would send equals the cached
/// one and every [`METADATA_STORE`] request it started has left (is on the wire).
pub const METADATA_CACHED: u8 = 64;

/// Most bytes of a block a server keeps as a session's cached block ([`METADATA_STORE`]), its
/// 6-byte head included: 1 KiB per session at most, allocated only when a client stores one.
pub const MAX_CACHED_BLOCK: usize = 1024;

/// The length of the metadata block at the front of `body` (its 4-byte length field and what it
/// counts), or `None` when the body is too short for it. The block's contents are checked where
/// it is read ([`crate::metadata`]).
pub fn metadata_block_len(body: &[u8]) -> Option<usize> {
    let (len, _) = body.split_first_chunk::<4>()?;
    let total = (u32::from_le_bytes(*len) as usize).checked_add(4)?;
    (total <= body.len()).then_some(total)
}

/// Checks a header's metadata cache flags ([`METADATA_STORE`], [`METADATA_CACHED`]): one of
/// them, on an eager request, the store with a block and the name without one.
#[cold]
#[inline(never)]
fn check_cache_flags(h: &Header) -> Result<(), WireError> {
    let ok = h.kind == Kind::Request
        && !h.in_ring
        && match h.metadata_cache {
            METADATA_STORE => h.metadata,
            METADATA_CACHED => !h.metadata,
            _ => false,
        };
    if ok {
        return Ok(());
    }
    Err(WireError::bad(
        "header",
        "flags",
        "the metadata cache flags outside an eager request, both at once, or the store flag without a \
         block (the cached flag with one)",
    ))
}

/// Most messages in one stream batch.
pub const MAX_BATCH: u16 = 1024;

/// Bytes of a batch frame's length prefix.
pub const FRAME_LEN: usize = 4;

/// The messages of a stream batch's body, in order: checks that `body` is exactly `count`
/// frames (1 ..= [`MAX_BATCH`]), each a 4-byte little-endian length and that many bytes.
/// Nothing is read beyond `body`; allocates nothing.
///
/// # Errors
/// [`WireError`] naming `count` (a count out of range), `frame` (a truncated or overlong
/// frame) or `body_len` (bytes after the last frame).
pub fn batch_frames(body: &[u8], count: u16) -> Result<BatchFrames<'_>, WireError> {
    if count == 0 || count > MAX_BATCH {
        return Err(WireError::bad("batch", "count", format!("{count} messages is not 1..={MAX_BATCH}")));
    }
    let mut rest = body;
    for i in 0..count {
        let Some((_, tail)) = split_frame(rest) else {
            return Err(WireError::bad(
                "batch",
                "frame",
                format!("frame {i} of {count} runs past the body's {} bytes", body.len()),
            ));
        };
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(WireError::bad(
            "batch",
            "body_len",
            format!("{} bytes after the last of {count} frames", rest.len()),
        ));
    }
    Ok(BatchFrames { rest: body })
}

/// One frame off the front of `b`: its message and what follows, or `None` when truncated.
fn split_frame(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(b.get(..FRAME_LEN)?.try_into().ok()?) as usize;
    let rest = &b[FRAME_LEN..];
    if len > rest.len() {
        return None;
    }
    Some(rest.split_at(len))
}

/// Iterator over the messages of a checked batch ([`batch_frames`]).
#[derive(Clone, Debug)]
pub struct BatchFrames<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for BatchFrames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (m, rest) = split_frame(self.rest)?;
        self.rest = rest;
        Some(m)
    }
}

/// The message of the frame at byte offset `at` of a batch body, as the byte range
/// `(start, end)` of the body (the next frame starts at `end`), or `None` when no whole frame
/// starts at `at` (past the end, or truncated). For a reader that keeps its place in a batch as
/// an offset.
pub fn frame_at(body: &[u8], at: usize) -> Option<(usize, usize)> {
    let (m, _) = split_frame(body.get(at..)?)?;
    let start = at + FRAME_LEN;
    Some((start, start + m.len()))
}

/// Appends one frame (length prefix and `msg`) to a batch body.
pub fn push_frame(body: &mut Vec<u8>, msg: &[u8]) {
    body.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    body.extend_from_slice(msg);
}

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A call: method id, slot/generation, body.
    Request = 1,
    /// The answer to a call: status, slot/generation echoed, body (message on error). Returns one
    /// request credit. Every request gets exactly one response (a cancelled call gets one with
    /// CANCELLED, or its real answer when that was already on its way).
    Response = 2,
    /// No call: only carries the freed head of the sender's ring back (ring space, sent when there
    /// is no other traffic).
    RingReturn = 3,
    /// The sender closes the session; nothing follows. It may say why: a status in the
    /// header's `status` (0: none given) and a reason of at most
    /// [`super::MAX_CLOSE_REASON`] bytes as its eager body (see [`super::close_reason`]).
    Close = 4,
    /// Client to server: the caller gave up on the call `(slot, generation)`. The server answers
    /// it CANCELLED unless its answer was already queued, and acknowledges every Cancel with a
    /// [`Kind::CancelAck`]. The call's request credit stays taken until both its response and
    /// that acknowledgement arrived, so a Cancel never lets the client have more than `credits`
    /// requests and Cancels unacknowledged at the server (`crate::endpoint` sizes the SRQ on
    /// it).
    Cancel = 5,
    /// Liveness probe: the receiver answers [`Kind::Pong`].
    Ping = 6,
    /// The answer to a [`Kind::Ping`].
    Pong = 7,
    /// One message of the stream `(slot, generation)`, in either direction: a body like a
    /// request's (eager, ring, or in pieces). Takes one stream grant of its direction.
    StreamMsg = 8,
    /// Client to server: the client's messages of the stream `(slot, generation)` end (a clean
    /// end, not a cancel). No body.
    StreamEnd = 9,
    /// `count` more messages the receiver may send on the stream `(slot, generation)`: sent by
    /// the consumer as its application takes messages. No body.
    StreamGrant = 10,
    /// Server to client: the server took the Cancel of `(slot, generation)` (sent for every
    /// Cancel, whether the call was answered before it arrived or not). No body.
    CancelAck = 11,
    /// Client to server (protocol 12): the client has a body for the server's ring and holds no
    /// grant of it; its 4-byte eager body is the ring length it asks for
    /// ([`super::ring_lease`]). At most one unanswered, and none while a ring is granted.
    RingAsk = 12,
    /// Server to client: the answer to a [`Kind::RingAsk`]. Status OK: its 16-byte eager body
    /// is the ring granted (address, length, rkey; [`super::ring_lease`]), which the client
    /// WRITEs as it did the handshake's ring before protocol 12. Any other status: refused (the
    /// pool or a cap is exhausted), its eager body the reason as a Close's (at most
    /// [`super::MAX_CLOSE_REASON`] bytes); the client may ask again later.
    RingGrant = 13,
    /// Server to client: give the granted ring back. No body. The client answers
    /// [`Kind::RingRelease`] once none of its WRITEs into the ring is unretired, and forgets the
    /// ring.
    RingReclaim = 14,
    /// Client to server: the answer to a [`Kind::RingReclaim`]: the client writes the ring no
    /// more (RC ordering: every WRITE it posted before this SEND has landed). No body.
    RingRelease = 15,
    /// Server to client (protocol 12): the session's request credits are `count` (1 ..= the
    /// client's window) from now on: raised while the client uses all it has, lowered after it
    /// was idle ([`crate::session`]). No body. The client takes it at once (a lowering stops new
    /// starts; calls in flight go on) and answers [`Kind::CreditAck`] once its calls in flight
    /// fit the new count. At most one is unacknowledged.
    CreditGrant = 16,
    /// Client to server (protocol 12): the answer to a [`Kind::CreditGrant`]; `count` repeats
    /// the credits granted. Every request sent after it keeps within them (RC ordering: the
    /// server accepts up to the larger of the old and new credits until it arrives). No body.
    CreditAck = 17,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Request,
            2 => Kind::Response,
            3 => Kind::RingReturn,
            4 => Kind::Close,
            5 => Kind::Cancel,
            6 => Kind::Ping,
            7 => Kind::Pong,
            8 => Kind::StreamMsg,
            9 => Kind::StreamEnd,
            10 => Kind::StreamGrant,
            11 => Kind::CancelAck,
            12 => Kind::RingAsk,
            13 => Kind::RingGrant,
            14 => Kind::RingReclaim,
            15 => Kind::RingRelease,
            16 => Kind::CreditGrant,
            17 => Kind::CreditAck,
            _ => return None,
        })
    }
}

/// A decoded message header. Plain data; see the module docs for the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the message is.
    pub kind: Kind,
    /// True when the body is in the receiver's ring (`ring_offset`), false when it follows the header.
    pub in_ring: bool,
    /// Request flags [`STREAM_IN`] | [`STREAM_OUT`]: the request opens a stream (0: unary); on a
    /// stream message, [`STREAM_BATCH`]: its body is a batch of `count` messages.
    pub stream: u8,
    /// A request whose body starts with a metadata block, a response whose body starts with two
    /// ([`METADATA`]).
    pub metadata: bool,
    /// A request's use of the session's cached block: 0, [`METADATA_STORE`] (with `metadata`: keep
    /// this block) or [`METADATA_CACHED`] (without: the cached block is this request's).
    pub metadata_cache: u8,
    /// A count whose unit the kind gives: on a stream-opening request, the stream grants the client
    /// gives the server (server SENDs it is ready for); on a [`Kind::StreamGrant`], more grants (at
    /// least 1); on a batch ([`STREAM_BATCH`]), the messages in it; on a response, the server's
    /// load (requests admitted and not yet answered, see the module docs); 0 otherwise. A stream grant lets
    /// its receiver send one stream SEND (a message or a batch); it is not a request credit.
    pub count: u16,
    /// Status of a response ([`Code::Ok`] otherwise).
    pub status: Code,
    /// Call slot at the client (requests, responses, cancels).
    pub slot: u16,
    /// Generation of the slot: a late response to an earlier use of the slot carries an older one.
    pub generation: u32,
    /// Method id (requests and responses; 0 otherwise).
    pub method: u32,
    /// Body length in bytes of this message (of this piece when the body travels in pieces).
    pub body_len: u32,
    /// Offset of the body in the receiver's ring (0 when not in the ring).
    pub ring_offset: u32,
    /// Wrapping count of bytes the sender has freed in its own ring (the peer's producer head).
    pub freed_head: u32,
    /// Remaining time of the call in µs (requests; 0 = no deadline).
    pub timeout_us: u32,
    /// Server to client (every kind but a request, which never goes that way): the wrapping count
    /// of the client's stream SENDs the server has taken (see the module docs); 0 from a client.
    /// Encoded at the offset of `timeout_us`, which only requests carry.
    pub stream_taken: u32,
    /// Session id the server assigned at handshake.
    pub session: u32,
    /// Total body length in bytes of the message this piece belongs to; equals `body_len` for a
    /// message in one piece (every eager body). Bounded by the session's `max_message_size`.
    pub total_len: u32,
}

/// The fields of an eager response with status OK ([`Header::encode_eager_response`]): the
/// call's (`slot`, `generation`, `method`, `metadata`: its body starts with response metadata),
/// the body's length in bytes, and what the server's session stamps on it
/// (`crate::session::Session::stamp_response`: `session`, `freed_head`, `stream_taken`, the
/// load in `count`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EagerResponse {
    pub(crate) slot: u16,
    pub(crate) generation: u32,
    pub(crate) method: u32,
    pub(crate) metadata: bool,
    pub(crate) body_len: u32,
    pub(crate) session: u32,
    pub(crate) freed_head: u32,
    pub(crate) stream_taken: u32,
    pub(crate) count: u16,
}

impl EagerResponse {
    /// The [`Header`] these fields name (what [`Header::encode_eager_response`] encodes).
    #[cfg(test)]
    pub(crate) fn header(&self) -> Header {
        Header {
            slot: self.slot,
            generation: self.generation,
            method: self.method,
            metadata: self.metadata,
            body_len: self.body_len,
            total_len: self.body_len,
            session: self.session,
            freed_head: self.freed_head,
            stream_taken: self.stream_taken,
            count: self.count,
            ..Header::new(Kind::Response)
        }
    }
}

impl Header {
    /// A header of `kind` with every other field zero / OK.
    pub const fn new(kind: Kind) -> Header {
        Header {
            kind,
            in_ring: false,
            stream: 0,
            metadata: false,
            metadata_cache: 0,
            count: 0,
            status: Code::Ok,
            slot: 0,
            generation: 0,
            method: 0,
            body_len: 0,
            ring_offset: 0,
            freed_head: 0,
            timeout_us: 0,
            stream_taken: 0,
            session: 0,
            total_len: 0,
        }
    }

    /// Writes the header into `out`. Never fails; allocates nothing.
    #[inline]
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out[0] = self.kind as u8;
        out[1] = u8::from(self.in_ring)
            | self.stream
            | if self.metadata { METADATA } else { 0 }
            | self.metadata_cache;
        out[2] = self.status as u8;
        out[3] = 0;
        out[4..6].copy_from_slice(&self.slot.to_le_bytes());
        out[6..8].copy_from_slice(&self.count.to_le_bytes());
        out[8..12].copy_from_slice(&self.generation.to_le_bytes());
        out[12..16].copy_from_slice(&self.method.to_le_bytes());
        out[16..20].copy_from_slice(&self.body_len.to_le_bytes());
        out[20..24].copy_from_slice(&self.ring_offset.to_le_bytes());
        out[24..28].copy_from_slice(&self.freed_head.to_le_bytes());
        let at_28 = if self.kind == Kind::Request { self.timeout_us } else { self.stream_taken };
        out[28..32].copy_from_slice(&at_28.to_le_bytes());
        out[32..36].copy_from_slice(&self.session.to_le_bytes());
        out[36..40].copy_from_slice(&self.total_len.to_le_bytes());
    }

    /// Writes the header of an eager response with status OK (`r`'s fields; every other field
    /// zero, `total_len` = `body_len`) into `out`: the bytes [`Header::encode`] writes for that
    /// header, with no [`Header`] value built and moved through the send path (the worker's
    /// answers, about 30 instructions each).
    #[inline(always)]
    pub(crate) fn encode_eager_response(r: &EagerResponse, out: &mut [u8; HEADER_LEN]) {
        out[0] = Kind::Response as u8;
        out[1] = if r.metadata { METADATA } else { 0 };
        out[2] = Code::Ok as u8;
        out[3] = 0;
        out[4..6].copy_from_slice(&r.slot.to_le_bytes());
        out[6..8].copy_from_slice(&r.count.to_le_bytes());
        out[8..12].copy_from_slice(&r.generation.to_le_bytes());
        out[12..16].copy_from_slice(&r.method.to_le_bytes());
        out[16..20].copy_from_slice(&r.body_len.to_le_bytes());
        out[20..24].copy_from_slice(&0u32.to_le_bytes());
        out[24..28].copy_from_slice(&r.freed_head.to_le_bytes());
        out[28..32].copy_from_slice(&r.stream_taken.to_le_bytes());
        out[32..36].copy_from_slice(&r.session.to_le_bytes());
        out[36..40].copy_from_slice(&r.body_len.to_le_bytes());
    }

    /// Writes the header at the start of `out`.
    ///
    /// # Errors
    /// [`WireError::Truncated`] when `out` is shorter than [`HEADER_LEN`].
    pub fn encode_into(&self, out: &mut [u8]) -> Result<(), WireError> {
        let have = out.len();
        let dst: &mut [u8; HEADER_LEN] = out
            .get_mut(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated { what: "header", field: "session", need: HEADER_LEN, have })?;
        self.encode(dst);
        Ok(())
    }

    /// Decodes and validates the header of a received message of `msg.len()` bytes (header plus
    /// eager body). Checks every field that can be checked without session state: kind, flags,
    /// status, reserved byte, that an eager body is exactly the bytes received, and that control
    /// messages carry no body. Ring bounds are checked by the session.
    ///
    /// # Errors
    /// [`WireError`] naming the first bad field.
    #[inline(always)]
    pub fn decode(msg: &[u8]) -> Result<Header, WireError> {
        let mut h = Header::new(Kind::Request);
        Header::decode_into(msg, &mut h)?;
        Ok(h)
    }

    /// [`Header::decode`] into `out`, with no header returned by value (a receive path's header
    /// stays in one place, the caller's, instead of being copied through each layer's result).
    /// `out` is left unspecified (some fields written) when it fails.
    ///
    /// # Errors
    /// As [`Header::decode`]'s.
    #[inline(always)]
    pub fn decode_into(msg: &[u8], out: &mut Header) -> Result<(), WireError> {
        if Header::decode_fast(msg, out) {
            return Ok(());
        }
        *out = Header::decode_general(msg)?;
        Ok(())
    }

    /// The common case of [`Header::decode_into`]: an eager unary request or response with no
    /// flag set (a call's message on the data path), with this subset of `decode_general`'s
    /// checks, which are every check such a header is subject to. Writes `out` and returns true
    /// for such a header; returns false, `out` untouched, for anything else, valid or not (the
    /// general path takes it). `fuzz_header` and `the_fast_path_decodes_as_the_general_path`
    /// check that both decode every message alike.
    #[inline(always)]
    fn decode_fast(msg: &[u8], out: &mut Header) -> bool {
        let Some((b, body)) = msg.split_first_chunk::<HEADER_LEN>() else { return false };
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let (body_len, total_len) = (u32_at(16), u32_at(36));
        if b[1] != 0
            || b[3] != 0
            || u32_at(20) != 0
            || body_len as usize != body.len()
            || total_len != body_len
        {
            return false;
        }
        let count = u16::from_le_bytes([b[6], b[7]]);
        let method = u32_at(12);
        let (kind, status) = match b[0] {
            // A request: a method, no status, no count (no stream to grant).
            1 if b[2] == 0 && count == 0 && method != 0 => (Kind::Request, Code::Ok),
            // A response: any status code; its count is the server's load.
            2 => match Code::from_u8(b[2]) {
                Some(st) => (Kind::Response, st),
                None => return false,
            },
            _ => return false,
        };
        let at_28 = u32_at(28);
        let request = kind == Kind::Request;
        *out = Header {
            kind,
            in_ring: false,
            stream: 0,
            metadata: false,
            metadata_cache: 0,
            count,
            status,
            slot: u16::from_le_bytes([b[4], b[5]]),
            generation: u32_at(8),
            method,
            body_len,
            ring_offset: 0,
            freed_head: u32_at(24),
            timeout_us: if request { at_28 } else { 0 },
            stream_taken: if request { 0 } else { at_28 },
            session: u32_at(32),
            total_len,
        };
        true
    }

    /// [`Header::decode`] of any message: every check, in the order that names the first bad
    /// field.
    ///
    /// # Errors
    /// As [`Header::decode`]'s.
    #[inline(never)]
    pub(crate) fn decode_general(msg: &[u8]) -> Result<Header, WireError> {
        let have = msg.len();
        let b: &[u8; HEADER_LEN] = msg
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated { what: "header", field: "session", need: HEADER_LEN, have })?;
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let kind = Kind::from_u8(b[0])
            .ok_or_else(|| WireError::bad("header", "kind", format!("{} is not 1..=15", b[0])))?;
        if b[1]
            & !(BODY_IN_RING
                | STREAM_IN
                | STREAM_OUT
                | STREAM_BATCH
                | METADATA
                | METADATA_STORE
                | METADATA_CACHED)
            != 0
        {
            return Err(WireError::bad("header", "flags", format!("unknown bits {:#04x}", b[1])));
        }
        let in_ring = b[1] & BODY_IN_RING != 0;
        let status = Code::from_u8(b[2])
            .ok_or_else(|| WireError::bad("header", "status", format!("{} is not a status code", b[2])))?;
        if b[3] != 0 {
            return Err(WireError::bad("header", "reserved", "byte 3 must be 0"));
        }
        let h = Header {
            kind,
            in_ring,
            stream: b[1] & (STREAM_IN | STREAM_OUT | STREAM_BATCH),
            metadata: b[1] & METADATA != 0,
            metadata_cache: b[1] & (METADATA_STORE | METADATA_CACHED),
            count: u16_at(6),
            status,
            slot: u16_at(4),
            generation: u32_at(8),
            method: u32_at(12),
            body_len: u32_at(16),
            ring_offset: u32_at(20),
            freed_head: u32_at(24),
            timeout_us: if kind == Kind::Request { u32_at(28) } else { 0 },
            stream_taken: if kind == Kind::Request { 0 } else { u32_at(28) },
            session: u32_at(32),
            total_len: u32_at(36),
        };
        if h.metadata && !matches!(kind, Kind::Request | Kind::Response | Kind::StreamMsg) {
            return Err(WireError::bad(
                "header",
                "flags",
                "the metadata flag outside a request, a response or a stream message",
            ));
        }
        if h.metadata_cache != 0 {
            check_cache_flags(&h)?;
        }
        if h.stream & STREAM_BATCH != 0 {
            if kind != Kind::StreamMsg || h.stream != STREAM_BATCH {
                return Err(WireError::bad("header", "flags", "the batch flag outside a stream message"));
            }
            if h.in_ring || h.count == 0 || h.count > MAX_BATCH {
                return Err(WireError::bad(
                    "header",
                    "count",
                    format!("a batch of {} messages (1..={MAX_BATCH}, eager only)", h.count),
                ));
            }
        }
        let eager = (have - HEADER_LEN) as u64;
        if !h.in_ring && u64::from(h.body_len) != eager {
            return Err(WireError::bad(
                "header",
                "body_len",
                format!("{} but {eager} bytes follow the header", h.body_len),
            ));
        }
        if h.in_ring && eager != 0 {
            return Err(WireError::bad(
                "header",
                "flags",
                format!("body in ring but {eager} bytes follow the header"),
            ));
        }
        if !h.in_ring && h.ring_offset != 0 {
            return Err(WireError::bad("header", "ring_offset", "non-zero without a ring body"));
        }
        if h.total_len < h.body_len {
            return Err(WireError::bad(
                "header",
                "total_len",
                format!("{} below the piece's body_len {}", h.total_len, h.body_len),
            ));
        }
        if h.total_len != h.body_len && (!h.in_ring || h.body_len == 0) {
            return Err(WireError::bad(
                "header",
                "total_len",
                format!("{} but only a non-empty ring body travels in pieces", h.total_len),
            ));
        }
        match kind {
            Kind::Request => {
                if h.method == 0 {
                    return Err(WireError::bad("header", "method", "0 is reserved"));
                }
                if status != Code::Ok {
                    return Err(WireError::bad("header", "status", "a request carries no status"));
                }
                if h.count != 0 && h.stream & STREAM_OUT == 0 {
                    return Err(WireError::bad(
                        "header",
                        "count",
                        "only a stream of server messages is granted stream grants",
                    ));
                }
            }
            Kind::StreamMsg if h.stream == STREAM_BATCH => {
                if status != Code::Ok {
                    return Err(WireError::bad("header", "kind", "stream message with call fields set"));
                }
            }
            Kind::Response | Kind::StreamMsg => {
                // A response's count is the server's load.
                if h.stream != 0 || (h.count != 0 && kind != Kind::Response) {
                    return Err(WireError::bad(
                        "header",
                        "flags",
                        "stream flags or a count outside a request",
                    ));
                }
                if kind == Kind::StreamMsg && status != Code::Ok {
                    return Err(WireError::bad("header", "kind", "stream message with call fields set"));
                }
            }
            Kind::RingReturn
            | Kind::Close
            | Kind::Cancel
            | Kind::CancelAck
            | Kind::Ping
            | Kind::Pong
            | Kind::StreamEnd
            | Kind::StreamGrant
            | Kind::RingAsk
            | Kind::RingGrant
            | Kind::RingReclaim
            | Kind::RingRelease
            | Kind::CreditGrant
            | Kind::CreditAck => {
                if h.stream != 0 {
                    return Err(WireError::bad("header", "flags", "stream flags outside a request"));
                }
                let counts = matches!(kind, Kind::StreamGrant | Kind::CreditGrant | Kind::CreditAck);
                if counts != (h.count != 0) {
                    return Err(WireError::bad(
                        "header",
                        "count",
                        "a stream grant or a credit grant or acknowledgement, and only those, carries a count",
                    ));
                }
                if kind == Kind::Close {
                    // A Close may say why: a status and an eager reason (`super::close`).
                    if h.in_ring || h.body_len as usize > super::MAX_CLOSE_REASON {
                        return Err(WireError::bad(
                            "header",
                            "body_len",
                            format!(
                                "a Close's reason is eager and at most {} bytes",
                                super::MAX_CLOSE_REASON
                            ),
                        ));
                    }
                } else if matches!(kind, Kind::RingAsk | Kind::RingGrant) {
                    super::ring_lease::check_body(kind, status, h.in_ring, h.body_len)?;
                } else if h.body_len != 0 || h.in_ring || h.total_len != 0 {
                    return Err(WireError::bad("header", "body_len", "a control message carries no body"));
                }
                if (status != Code::Ok && !matches!(kind, Kind::Close | Kind::RingGrant)) || h.method != 0 {
                    return Err(WireError::bad("header", "kind", "control message with call fields set"));
                }
                let names_call =
                    matches!(kind, Kind::Cancel | Kind::CancelAck | Kind::StreamEnd | Kind::StreamGrant);
                if !names_call && (h.slot != 0 || h.generation != 0) {
                    return Err(WireError::bad(
                        "header",
                        "slot",
                        "only a Cancel or a stream control names a call",
                    ));
                }
            }
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode_msg(h: &Header) -> Vec<u8> {
        let mut v = vec![0u8; HEADER_LEN + if h.in_ring { 0 } else { h.body_len as usize }];
        h.encode_into(&mut v).unwrap();
        v
    }

    fn request() -> Header {
        Header { method: 7, slot: 3, generation: 9, body_len: 5, total_len: 5, ..Header::new(Kind::Request) }
    }

    #[test]
    fn a_response_carries_the_server_load_in_count_and_a_stream_message_does_not() {
        let h = Header { slot: 3, generation: 9, count: 4242, ..Header::new(Kind::Response) };
        let mut b = [0u8; HEADER_LEN];
        h.encode(&mut b);
        assert_eq!(Header::decode(&b).unwrap().count, 4242);
        let m = Header { slot: 3, generation: 9, count: 1, ..Header::new(Kind::StreamMsg) };
        m.encode(&mut b);
        assert!(Header::decode(&b).is_err(), "a stream message with a count decoded");
    }

    #[test]
    fn request_round_trips() {
        let h = Header { timeout_us: 1000, session: 42, freed_head: u32::MAX, ..request() };
        assert_eq!(Header::decode(&encode_msg(&h)).unwrap(), h);
    }

    /// A Close may say why (a status and an eager reason of at most `MAX_CLOSE_REASON` bytes);
    /// a longer reason, or one in the ring, is refused naming `body_len`.
    #[test]
    fn a_close_carries_a_status_and_a_bounded_reason() {
        let max = crate::wire::MAX_CLOSE_REASON as u32;
        let h = Header {
            status: Code::ResourceExhausted,
            body_len: max,
            total_len: max,
            ..Header::new(Kind::Close)
        };
        assert_eq!(Header::decode(&encode_msg(&h)).unwrap(), h);
        let long = Header { body_len: max + 1, total_len: max + 1, ..h };
        assert_eq!(Header::decode(&encode_msg(&long)).unwrap_err().field(), "body_len");
        let ring = Header { in_ring: true, body_len: 10, total_len: 10, ..h };
        assert_eq!(Header::decode(&encode_msg(&ring)).unwrap_err().field(), "body_len");
        // Other controls still carry no status.
        let ping = Header { status: Code::Internal, ..Header::new(Kind::Ping) };
        assert_eq!(Header::decode(&encode_msg(&ping)).unwrap_err().field(), "kind");
    }

    #[test]
    fn bad_fields_are_named() {
        let mut m = encode_msg(&request());
        m[0] = 18;
        assert_eq!(Header::decode(&m).unwrap_err().field(), "kind");
        let mut m = encode_msg(&request());
        m[1] = 8;
        assert_eq!(Header::decode(&m).unwrap_err().field(), "flags");
        let mut m = encode_msg(&request());
        m[2] = 17;
        assert_eq!(Header::decode(&m).unwrap_err().field(), "status");
        let mut m = encode_msg(&request());
        m[3] = 1;
        assert_eq!(Header::decode(&m).unwrap_err().field(), "reserved");
        let m = encode_msg(&request());
        assert_eq!(Header::decode(&m[..m.len() - 1]).unwrap_err().field(), "body_len");
        assert!(matches!(
            Header::decode(&m[..10]),
            Err(WireError::Truncated { need: HEADER_LEN, have: 10, .. })
        ));
        let m = encode_msg(&Header { method: 0, ..request() });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "method");
        // (A response's count is the server's load since protocol 8; a stream message's is not.)
        let mut m = encode_msg(&Header::new(Kind::StreamMsg));
        m[7] = 1;
        assert_eq!(Header::decode(&m).unwrap_err().field(), "flags");
        let mut m = encode_msg(&request());
        m[6] = 1;
        assert_eq!(Header::decode(&m).unwrap_err().field(), "count", "a count on a unary request");
        let m = encode_msg(&Header { slot: 1, generation: 2, ..Header::new(Kind::StreamGrant) });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "count", "a grant of 0 messages");
        let m = encode_msg(&Header { count: 3, ..Header::new(Kind::StreamEnd) });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "count");
        let m = encode_msg(&Header { stream: STREAM_IN, ..Header::new(Kind::StreamMsg) });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "flags");
        let m = encode_msg(&Header { status: Code::Internal, ..Header::new(Kind::StreamMsg) });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "kind");
        let m = encode_msg(&Header { slot: 2, ..Header::new(Kind::Ping) });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "slot");
        let m = encode_msg(&Header { method: 2, ..Header::new(Kind::Cancel) });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "kind");
        // Offset 28 is a request's timeout and every other message's stream count.
        let r = Header { stream_taken: 5, ..Header::new(Kind::RingReturn) };
        assert_eq!(Header::decode(&encode_msg(&r)).unwrap(), r);
        let t = Header { timeout_us: 5, ..Header::new(Kind::StreamEnd) };
        assert_eq!(Header::decode(&encode_msg(&t)).unwrap().timeout_us, 0, "a timeout only on a request");
        let c = Header { slot: 3, generation: 9, session: 4, freed_head: 7, ..Header::new(Kind::Cancel) };
        assert_eq!(Header::decode(&encode_msg(&c)).unwrap(), c);
        let mut m = encode_msg(&Header::new(Kind::RingReturn));
        m.push(0);
        m[16] = 1;
        m[36] = 1;
        assert_eq!(Header::decode(&m).unwrap_err().field(), "body_len");
    }

    fn batch(msgs: &[&[u8]]) -> Vec<u8> {
        let mut b = Vec::new();
        for m in msgs {
            push_frame(&mut b, m);
        }
        b
    }

    #[test]
    fn batches_round_trip_and_hostile_batches_are_refused() {
        let msgs: [&[u8]; 3] = [b"abc", b"", b"0123456789"];
        let body = batch(&msgs);
        let got: Vec<&[u8]> = batch_frames(&body, 3).unwrap().collect();
        assert_eq!(got, msgs);
        let (s, e) = frame_at(&body, 0).unwrap();
        assert_eq!(&body[s..e], b"abc");
        let (s2, e2) = frame_at(&body, e).unwrap();
        assert_eq!((s2, e2), (e + FRAME_LEN, e + FRAME_LEN));
        assert_eq!(frame_at(&body, body.len()), None);
        // Fewer frames than the count, more, a count out of range, a length past the end.
        assert_eq!(batch_frames(&body, 4).unwrap_err().field(), "frame");
        assert_eq!(batch_frames(&body, 2).unwrap_err().field(), "body_len");
        assert_eq!(batch_frames(&body, 0).unwrap_err().field(), "count");
        assert_eq!(batch_frames(&body, MAX_BATCH + 1).unwrap_err().field(), "count");
        let mut long = body.clone();
        long[0] = 200;
        assert_eq!(batch_frames(&long, 3).unwrap_err().field(), "frame");
        let mut huge = body.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(batch_frames(&huge, 3).unwrap_err().field(), "frame");
        assert_eq!(batch_frames(&body[..2], 1).unwrap_err().field(), "frame");
        // The header: a batch is a stream message, eager, of 1..=MAX_BATCH messages.
        let h = Header {
            slot: 3,
            generation: 9,
            stream: STREAM_BATCH,
            count: 3,
            body_len: body.len() as u32,
            total_len: body.len() as u32,
            ..Header::new(Kind::StreamMsg)
        };
        assert_eq!(Header::decode(&encode_msg(&h)).unwrap(), h);
        let m = encode_msg(&Header { count: 0, ..h });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "count");
        let m = encode_msg(&Header { count: MAX_BATCH + 1, ..h });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "count");
        let m = encode_msg(&Header { stream: STREAM_BATCH, ..request() });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "flags");
        // The metadata flag belongs to requests, responses and stream messages only.
        let m = encode_msg(&Header { metadata: true, ..request() });
        assert!(Header::decode(&m).unwrap().metadata);
        let m = encode_msg(&Header { metadata: true, ..Header::new(Kind::Response) });
        assert!(Header::decode(&m).unwrap().metadata);
        let m = encode_msg(&Header { metadata: true, ..Header::new(Kind::StreamMsg) });
        assert!(Header::decode(&m).unwrap().metadata);
        let m = encode_msg(&Header { metadata: true, ..Header::new(Kind::StreamEnd) });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "flags");
        // The cache flags (protocol 11): a store with a block, a name without one, on an eager
        // request only, never both.
        let store = Header { metadata: true, metadata_cache: METADATA_STORE, ..request() };
        assert_eq!(Header::decode(&encode_msg(&store)).unwrap().metadata_cache, METADATA_STORE);
        let named = Header { metadata_cache: METADATA_CACHED, ..request() };
        assert_eq!(Header::decode(&encode_msg(&named)).unwrap().metadata_cache, METADATA_CACHED);
        for bad in [
            Header { metadata: false, ..store },
            Header { metadata: true, ..named },
            Header { metadata_cache: METADATA_STORE | METADATA_CACHED, ..store },
            Header { kind: Kind::Response, ..store },
            Header { kind: Kind::StreamMsg, ..named },
            Header { in_ring: true, body_len: 64, total_len: 64, ..named },
        ] {
            assert_eq!(Header::decode(&encode_msg(&bad)).unwrap_err().field(), "flags", "{bad:?}");
        }
        let m = encode_msg(&Header { stream: STREAM_BATCH | STREAM_IN, ..h });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "flags");
        let m = encode_msg(&Header { in_ring: true, body_len: 5000, total_len: 5000, ..h });
        assert_eq!(Header::decode(&m).unwrap_err().field(), "count");
    }

    proptest! {
        /// An eager response encoded in place has the bytes of its `Header` encoded (and decodes
        /// back to it): the worker's answers are the headers they were before.
        #[test]
        fn eager_response_encodes_as_its_header(
            slot in any::<u16>(), generation in any::<u32>(), method in any::<u32>(),
            metadata in any::<bool>(), body_len in 0u32..4096, session in any::<u32>(),
            freed_head in any::<u32>(), stream_taken in any::<u32>(), count in any::<u16>(),
        ) {
            let r = EagerResponse {
                slot, generation, method, metadata, body_len, session, freed_head, stream_taken, count,
            };
            let mut fast = [0xa5u8; HEADER_LEN];
            Header::encode_eager_response(&r, &mut fast);
            let mut general = [0x5au8; HEADER_LEN];
            r.header().encode(&mut general);
            prop_assert_eq!(fast, general);
        }
    }

    proptest! {
        #[test]
        fn batch_decoding_never_panics(body in proptest::collection::vec(any::<u8>(), 0..64), count in any::<u16>()) {
            if let Ok(frames) = batch_frames(&body, count) {
                prop_assert_eq!(frames.count(), usize::from(count));
            }
        }

        #[test]
        fn batches_encode_and_decode_to_the_same_messages(
            msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..20)
        ) {
            let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
            let body = batch(&refs);
            let got: Vec<&[u8]> = batch_frames(&body, msgs.len() as u16).unwrap().collect();
            prop_assert_eq!(got, refs);
        }
    }

    #[test]
    fn stream_headers_round_trip() {
        let open = Header { stream: STREAM_IN | STREAM_OUT, count: 16, ..request() };
        assert_eq!(Header::decode(&encode_msg(&open)).unwrap(), open);
        let msg =
            Header { slot: 3, generation: 9, body_len: 5, total_len: 5, ..Header::new(Kind::StreamMsg) };
        assert_eq!(Header::decode(&encode_msg(&msg)).unwrap(), msg);
        let credit = Header { slot: 3, generation: 9, count: 4, ..Header::new(Kind::StreamGrant) };
        assert_eq!(Header::decode(&encode_msg(&credit)).unwrap(), credit);
        let end = Header { slot: 3, generation: 9, ..Header::new(Kind::StreamEnd) };
        assert_eq!(Header::decode(&encode_msg(&end)).unwrap(), end);
    }

    #[test]
    fn ring_body_must_not_follow_header() {
        let h = Header { in_ring: true, ring_offset: 64, body_len: 100_000, total_len: 100_000, ..request() };
        let mut m = encode_msg(&h);
        assert_eq!(Header::decode(&m).unwrap(), h);
        m.push(1);
        assert_eq!(Header::decode(&m).unwrap_err().field(), "flags");
    }

    #[test]
    fn pieces_are_ring_bodies_within_their_total() {
        let piece = Header { in_ring: true, body_len: 4096, total_len: 1 << 20, ..request() };
        assert_eq!(Header::decode(&encode_msg(&piece)).unwrap(), piece);
        let short = Header { total_len: 4095, ..piece };
        assert_eq!(Header::decode(&encode_msg(&short)).unwrap_err().field(), "total_len");
        let eager = Header { total_len: 6, ..request() };
        assert_eq!(Header::decode(&encode_msg(&eager)).unwrap_err().field(), "total_len");
        let empty = Header { body_len: 0, ..piece };
        assert_eq!(Header::decode(&encode_msg(&empty)).unwrap_err().field(), "total_len");
    }

    fn arb_header() -> impl Strategy<Value = Header> {
        (
            prop_oneof![
                Just(Kind::Request),
                Just(Kind::Response),
                Just(Kind::RingReturn),
                Just(Kind::Close),
                Just(Kind::Cancel),
                Just(Kind::Ping),
                Just(Kind::Pong),
                Just(Kind::StreamMsg),
                Just(Kind::StreamEnd),
                Just(Kind::StreamGrant),
                Just(Kind::CancelAck)
            ],
            any::<bool>(),
            0u8..=16,
            any::<(u16, u32, u32, u32, u32, u32, u32, u32)>(),
            any::<u32>(),
        )
            .prop_map(
                |(kind, in_ring, st, (slot, generation, method, len, off, freed, t, session), extra)| {
                    let body = matches!(kind, Kind::Request | Kind::Response | Kind::StreamMsg);
                    let names = body
                        || matches!(
                            kind,
                            Kind::Cancel | Kind::CancelAck | Kind::StreamEnd | Kind::StreamGrant
                        );
                    let in_ring = in_ring && body;
                    let stream =
                        if kind == Kind::Request { (extra >> 8) as u8 & (STREAM_IN | STREAM_OUT) } else { 0 };
                    let count = match kind {
                        Kind::StreamGrant => (extra >> 16) as u16 | 1,
                        Kind::Request if stream & STREAM_OUT != 0 => (extra >> 16) as u16,
                        Kind::Response => (extra >> 16) as u16,
                        _ => 0,
                    };
                    let metadata = matches!(kind, Kind::Request | Kind::Response | Kind::StreamMsg)
                        && extra & (1 << 24) != 0;
                    let metadata_cache = match (kind == Kind::Request && !in_ring, metadata) {
                        (true, true) if extra & (1 << 25) != 0 => METADATA_STORE,
                        (true, false) if extra & (1 << 25) != 0 => METADATA_CACHED,
                        _ => 0,
                    };
                    Header {
                        kind,
                        in_ring,
                        stream,
                        metadata,
                        metadata_cache,
                        count,
                        status: if matches!(kind, Kind::Response | Kind::Close) {
                            Code::from_u8(st).unwrap()
                        } else {
                            Code::Ok
                        },
                        slot: if names { slot } else { 0 },
                        generation: if names { generation } else { 0 },
                        method: if kind == Kind::Request {
                            method.max(1)
                        } else if body {
                            method
                        } else {
                            0
                        },
                        body_len: if kind == Kind::Close {
                            len % (crate::wire::MAX_CLOSE_REASON as u32 + 1)
                        } else if !body {
                            0
                        } else if in_ring {
                            len
                        } else {
                            len % 2048
                        },
                        total_len: if kind == Kind::Close {
                            len % (crate::wire::MAX_CLOSE_REASON as u32 + 1)
                        } else if !body {
                            0
                        } else if in_ring && len > 0 {
                            len.saturating_add(extra % 4)
                        } else if in_ring {
                            len
                        } else {
                            len % 2048
                        },
                        ring_offset: if in_ring { off } else { 0 },
                        freed_head: freed,
                        timeout_us: if kind == Kind::Request { t } else { 0 },
                        stream_taken: if kind == Kind::Request { 0 } else { t },
                        session,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn valid_headers_round_trip(h in arb_header()) {
            prop_assert_eq!(Header::decode(&encode_msg(&h)).unwrap(), h);
        }

        /// The fuzz target's property, also run in the normal suite: arbitrary bytes never panic,
        /// and whatever decodes re-encodes to the same bytes.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            crate::wire::fuzz_header(&bytes);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Flagless eager requests and responses (the fast path's case), and the same with one
        /// byte changed, one aligned word zeroed, or the body a byte short or long:
        /// `Header::decode` decodes and refuses them exactly as `Header::decode_general`
        /// (checked by `fuzz_header`), which random bytes almost never reach.
        ///
        /// Fails with "the fast path differs" when the fast path drops its `method != 0` check
        /// (a request of method 0 decoded), or its `count == 0` check.
        #[test]
        fn the_fast_path_decodes_as_the_general_path(
            h in arb_call_header(),
            at in 0..=HEADER_LEN + 1,
            v in any::<u8>(),
        ) {
            let mut m = encode_msg(&h);
            prop_assert_eq!(Header::decode(&m), Ok(h));
            match at {
                HEADER_LEN => m.push(v),
                n if n > HEADER_LEN => { m.pop(); }
                _ if v % 4 == 0 => m[at & !3..(at & !3) + 4].fill(0),
                _ => m[at] = v,
            }
            crate::wire::fuzz_header(&m);
        }
    }

    /// Valid flagless eager requests and responses, the fast path's case (`arb_header`'s
    /// values, moved there).
    fn arb_call_header() -> impl Strategy<Value = Header> {
        (arb_header(), any::<bool>()).prop_map(|(h, response)| {
            let len = h.body_len % 2048;
            Header {
                kind: if response { Kind::Response } else { Kind::Request },
                in_ring: false,
                stream: 0,
                metadata: false,
                metadata_cache: 0,
                count: if response { h.count } else { 0 },
                status: if response { h.status } else { Code::Ok },
                method: if response { h.method } else { h.method.max(1) },
                body_len: len,
                total_len: len,
                ring_offset: 0,
                timeout_us: if response { 0 } else { h.timeout_us | h.stream_taken },
                stream_taken: if response { h.timeout_us | h.stream_taken } else { 0 },
                ..h
            }
        })
    }
}
