//! One session, either role, driven as the runtime drives it while a hostile peer's headers come
//! from the fuzzer: no panic, credits and slots never overrun, memory bounded by the session's
//! parameters (`rpc_core::session::fuzz`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rpc_core::session::fuzz::fuzz_session(data);
});
