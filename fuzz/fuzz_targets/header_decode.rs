//! Header decode on arbitrary bytes: never panics; what decodes re-encodes identically.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rpc_core::wire::fuzz_header(data);
});
