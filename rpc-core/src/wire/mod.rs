//! The wire protocol, sans-IO: the per-message header carried by every SEND, and the handshake
//! exchanged over TCP at connection setup. Encode/decode with bounds checks; no verbs, no clock,
//! no allocation on the message path.

mod close;
mod error;
mod handshake;
mod header;
pub mod ring_lease;

pub use close::{close_reason, encode_close_reason, MAX_CLOSE_REASON};
pub use error::WireError;
pub use handshake::{
    read_frame, write_frame, Frame, FrameError, Handshake, Refusal, FLAG_DETACHED, FLAG_IDLE_PONGS, FLAG_SHM,
    HANDSHAKE_MAGIC, MAX_AUTH_TOKEN, MAX_CREDITS, MAX_FRAME, MAX_RING_LEN, MIN_RING_LEN, PROTOCOL_VERSION,
};
pub(crate) use header::EagerResponse;
pub use header::{
    batch_frames, frame_at, metadata_block_len, push_frame, BatchFrames, Header, Kind, BODY_IN_RING,
    FRAME_LEN, HEADER_LEN, MAX_BATCH, MAX_CACHED_BLOCK, METADATA, METADATA_CACHED, METADATA_STORE,
    STREAM_BATCH, STREAM_IN, STREAM_OUT,
};

/// Fuzz property for header decoding (used by `fuzz/` and by the proptest suite): decoding
/// arbitrary bytes never panics, the common case's fast path decodes and refuses exactly as
/// the general path, and whatever decodes re-encodes to the same header bytes.
///
/// # Panics
/// When the property is violated (that is the point: the fuzzer reports it).
#[doc(hidden)]
pub fn fuzz_header(data: &[u8]) {
    // The common case's fast path decodes (and refuses) exactly as the general path.
    assert_eq!(Header::decode(data), Header::decode_general(data), "the fast path differs");
    // Into a header left from an earlier message (every field set, none as a call's): each
    // field is written, none kept from before.
    let mut stale = Header {
        in_ring: true,
        stream: header::STREAM_BATCH,
        metadata: true,
        metadata_cache: header::METADATA_STORE,
        count: 3,
        status: crate::status::Code::Internal,
        slot: 5,
        generation: 6,
        method: 7,
        body_len: 8,
        ring_offset: 9,
        freed_head: 10,
        timeout_us: 11,
        stream_taken: 12,
        session: 13,
        total_len: 14,
        ..Header::new(Kind::StreamMsg)
    };
    let into = Header::decode_into(data, &mut stale).map(|()| stale);
    assert_eq!(into.ok(), Header::decode_general(data).ok(), "decode_into differs");
    if let Ok(h) = Header::decode(data) {
        let mut out = [0u8; HEADER_LEN];
        h.encode(&mut out);
        assert_eq!(&out[..], &data[..HEADER_LEN], "header re-encodes differently");
        assert_eq!(Header::decode(data), Ok(h));
        if h.kind == Kind::Close {
            // A Close's reason is read as untrusted text: bounded, whatever the bytes.
            assert!(h.body_len as usize <= MAX_CLOSE_REASON, "a Close's reason over its bound decoded");
            let r = close_reason(&data[HEADER_LEN..]);
            assert!(r.chars().count() <= MAX_CLOSE_REASON && r.chars().all(|c| !c.is_control()));
        }
        // A ring lease body that the header check let through reads as what its kind says.
        let body = &data[HEADER_LEN..];
        match (h.kind, h.status) {
            (Kind::RingAsk, _) => {
                ring_lease::decode_ring_ask(body).expect("a checked ask's body decodes");
            }
            (Kind::RingGrant, crate::status::Code::Ok) => {
                let g = ring_lease::RingGrant::decode(body).expect("a checked grant's body decodes");
                assert_eq!(&g.encode()[..], body, "a grant re-encodes differently");
            }
            (Kind::RingGrant, _) => {
                assert!(body.len() <= MAX_CLOSE_REASON, "a refusal's reason over its bound")
            }
            _ => {}
        }
    }
}

/// Fuzz property for handshake frames: reading arbitrary bytes as a frame never panics, and a
/// frame that decodes re-encodes to bytes that decode to the same frame.
///
/// # Panics
/// When the property is violated.
#[doc(hidden)]
pub fn fuzz_handshake(data: &[u8]) {
    if let Ok(f) = read_frame(&mut &data[..]) {
        let again = read_frame(&mut f.encode().as_slice()).expect("re-encoded frame decodes");
        assert_eq!(again, f, "frame re-encodes differently");
    }
    if let Some((&ty, payload)) = data.split_first() {
        let _ = Frame::decode(ty, payload);
    }
}
