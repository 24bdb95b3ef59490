//! Handshake frame decode on arbitrary bytes: never panics; what decodes round-trips.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rpc_core::wire::fuzz_handshake(data);
});
