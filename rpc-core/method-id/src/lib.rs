//! The method id of rpc-core's wire: FNV-1a, 32 bit, of a method's full name
//! `"/package.Service/Method"` (`"/Service/Method"` for a file without `package`).
//!
//! One implementation for both sides: `rpc-codegen` computes ids at build time and emits them as
//! literals, the runtime (`rpc_core::codegen::method_id`) computes them for names it is given, and
//! a server matches a request's id against the literals. This crate has no dependencies, so the
//! build-time generator does not pull in the runtime, nor the runtime the generator.
#![no_std]

/// FNV-1a 32-bit offset basis.
const FNV_OFFSET: u32 = 0x811c_9dc5;
/// FNV-1a 32-bit prime.
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a, 32 bit, of `full_name` (the method's full name `"/package.Service/Method"`).
///
/// Usable in constants. Id 0 is reserved on the wire: `rpc-codegen` refuses a name that hashes to
/// it, and the runtime never dispatches it.
pub const fn method_id(full_name: &str) -> u32 {
    let bytes = full_name.as_bytes();
    let mut hash = FNV_OFFSET;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u32;
        hash = hash.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::method_id;

    #[test]
    fn fnv1a_32_reference_vectors() {
        // FNV-1a 32 test vectors (draft-eastlake-fnv, http://www.isthe.com/chongo/tech/comp/fnv/).
        assert_eq!(method_id(""), 0x811c_9dc5);
        assert_eq!(method_id("a"), 0xe40c_292c);
        assert_eq!(method_id("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn ids_of_published_methods_never_change() {
        // Emitted into generated code and sent on the wire: a different value breaks every peer
        // built before (codegen-tests' snapshot holds the first one as a literal too).
        assert_eq!(method_id("/helloworld.Greeter/SayHello"), 0x88a5_acce);
        assert_eq!(method_id("/kv.Kv/Get"), 0xd3ed_4c7d);
        assert_eq!(method_id("/routeguide.RouteGuide/RouteChat"), 0xee1a_0e8a);
        // No package: no dot before the service.
        const PING: u32 = method_id("/Pinger/Ping");
        assert_eq!(PING, 0xdd07_0402);
    }
}
