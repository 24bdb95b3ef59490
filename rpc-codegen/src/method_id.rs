//! Method ids: FNV-1a 32 of `"/package.Service/Method"`, computed here at build time and emitted as
//! literals, checked for collisions across everything one build generates.

use std::collections::BTreeMap;

use prost_types::FileDescriptorSet;

use crate::Error;

/// The method id of a full method name `"/package.Service/Method"` (`"/Service/Method"` for a file
/// without `package`): FNV-1a 32-bit, the very function the runtime uses
/// (`rpc_core::codegen::method_id`; both take it from the `rpc-method-id` crate).
///
/// Id 0 is reserved: generation fails for a name that hashes to it.
pub use rpc_method_id::method_id;

/// The full name of a method as the wire and the method-id hash use it: `"/package.Service/Method"`,
/// or `"/Service/Method"` when the file has no package.
pub fn full_method_name(package: &str, service: &str, method: &str) -> String {
    if package.is_empty() {
        format!("/{service}/{method}")
    } else {
        format!("/{package}.{service}/{method}")
    }
}

/// Checks every method of every service in `fds` (streaming ones too, so that their ids stay free
/// for when streaming lands): no id is 0 and no two methods share an id.
///
/// # Errors
/// [`Error::ReservedMethodId`] for a name hashing to 0, [`Error::MethodIdCollision`] naming both
/// methods of the first collision found (in file order).
pub fn check_method_ids(fds: &FileDescriptorSet) -> Result<(), Error> {
    let mut seen: BTreeMap<u32, String> = BTreeMap::new();
    for file in &fds.file {
        for service in &file.service {
            for method in &service.method {
                let name = full_method_name(file.package(), service.name(), method.name());
                let id = method_id(&name);
                if id == 0 {
                    return Err(Error::ReservedMethodId { method: name, file: file.name().to_owned() });
                }
                if let Some(first) = seen.get(&id) {
                    // The same full name twice (one file compiled twice) is not a collision; protox
                    // refuses duplicate definitions before we get here anyway.
                    if *first != name {
                        return Err(Error::MethodIdCollision { id, first: first.clone(), second: name });
                    }
                    continue;
                }
                seen.insert(id, name);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fnv1a_32_of_the_full_name() {
        // Reference values of FNV-1a 32 (draft-eastlake-fnv test vectors), then the id emitted for
        // helloworld (codegen-tests' snapshot holds the literal).
        assert_eq!(method_id(""), 0x811c_9dc5);
        assert_eq!(method_id("a"), 0xe40c_292c);
        assert_eq!(method_id(&full_method_name("helloworld", "Greeter", "SayHello")), 0x88a5_acce);
        assert_eq!(method_id(&full_method_name("", "Pinger", "Ping")), 0xdd07_0402);
    }

    #[test]
    fn full_names_with_and_without_package() {
        assert_eq!(full_method_name("helloworld", "Greeter", "SayHello"), "/helloworld.Greeter/SayHello");
        assert_eq!(full_method_name("a.b.c", "S", "M"), "/a.b.c.S/M");
        assert_eq!(full_method_name("", "Greeter", "SayHello"), "/Greeter/SayHello");
    }
}
