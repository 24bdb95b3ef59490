//! Message bodies that are already protobuf bytes: a request encoded once from JSON and sent as
//! is on every call, and replies taken as bytes (decoded later, or only measured).
//!
//! They implement `prost::Message` so that the runtime's typed `Client::unary` carries them: the
//! runtime asks a request for `encoded_len()` and `encode_raw()` (here: one copy of the stored
//! bytes into the send buffer, as a generated message of one `bytes` field costs), and decodes a
//! reply with `Message::decode` (here: `merge` takes the bytes whole instead of parsing fields).

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};

/// A request body encoded once, sent unchanged by every call. Cloning shares the bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedRequest(pub Bytes);

impl Message for EncodedRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Never decoded (requests only go out); skipping keeps the trait's contract anyway.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = Bytes::new();
    }
}

/// A reply kept as its protobuf bytes (one copy out of the receive buffer), for decoding with
/// a run-time descriptor afterwards.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyBytes(pub Vec<u8>);

impl Message for ReplyBytes {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn merge(&mut self, mut buf: impl Buf) -> Result<(), DecodeError> {
        while buf.has_remaining() {
            let chunk = buf.chunk();
            self.0.extend_from_slice(chunk);
            let n = chunk.len();
            buf.advance(n);
        }
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// A reply only measured: its length in bytes, nothing copied or parsed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyLen(pub usize);

impl Message for ReplyLen {
    fn encode_raw(&self, _buf: &mut impl BufMut) {}

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn merge(&mut self, mut buf: impl Buf) -> Result<(), DecodeError> {
        let n = buf.remaining();
        buf.advance(n);
        self.0 += n;
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        0
    }

    fn clear(&mut self) {
        self.0 = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes_go_out_unchanged() {
        let r = EncodedRequest(Bytes::from_static(b"\x0a\x02hi\x10\x07"));
        assert_eq!(r.encoded_len(), 6);
        assert_eq!(r.encode_to_vec(), b"\x0a\x02hi\x10\x07");
    }

    #[test]
    fn replies_are_taken_whole_or_measured() {
        // Bytes a field parser would reject (a zero tag): taken as they are, never parsed.
        let body: &[u8] = b"\x00\x01\x02\xff";
        assert_eq!(ReplyBytes::decode(body).unwrap().0, body);
        assert_eq!(ReplyLen::decode(body).unwrap().0, 4);
        assert_eq!(ReplyLen::decode(&[][..]).unwrap().0, 0);
    }
}
