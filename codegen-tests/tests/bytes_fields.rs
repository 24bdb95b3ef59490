//! Generated messages' `bytes` fields are `bytes::Bytes` (rpc-codegen's default), and decoding a
//! request body the runtime owns (a ring body, copied out of the ring once) makes them slices of
//! that body's buffer, never a second copy (DESIGN.md, memory ownership): what a server adapter
//! does with `rpc_core::codegen::decode`.

use codegen_tests::codegen::shadowing::Stream;
use prost::bytes::Bytes;
use prost::Message;
use rpc_core::codegen::{decode, Body};

#[test]
fn a_generated_bytes_field_decoded_from_an_owned_body_is_a_slice_of_it() {
    let sent = Stream { chunks: vec![Bytes::from(vec![7u8; 70_000]), Bytes::from_static(b"tail")] };
    let body = Bytes::from(sent.encode_to_vec());
    // Addresses only, compared and never read through.
    let range = body.as_ptr_range();
    let got: Stream = decode(Body::owned(body)).unwrap();
    assert_eq!(got, sent);
    for (i, chunk) in got.chunks.iter().enumerate() {
        let c = chunk.as_ptr_range();
        assert!(
            range.start <= c.start && c.end <= range.end,
            "chunk {i} ({} bytes) was copied out of the body",
            chunk.len()
        );
    }
}
