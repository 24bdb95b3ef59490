//! Method ids: FNV-1a 32 of `"/package.Service/Method"`, computed here at build time and emitted as
//! literals, checked for collisions across everything one build generates.

use std::collections::BTreeMap;

use prost_types::FileDescriptorSet;

use crate::Error;

/// FNV-1a 32-bit offset basis.
const FNV_OFFSET: u32 = 0x811c_9dc5;
/// FNV-1a 32-bit prime.
const FNV_PRIME: u32 = 0x0100_0193;

/// The method id of a full method name `"/package.Service/Method"` (`"/Service/Method"` for a file
/// without `package`): FNV-1a 32-bit, the same function as `rpc_core::codegen::method_id`.
///
/// Id 0 is reserved: generation fails for a name that hashes to it.
pub fn method_id(full_name: &str) -> u32 {
    full_name.bytes().fold(FNV_OFFSET, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(FNV_PRIME))
}

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
    fn fnv1a_reference_vectors() {
        // Reference values of FNV-1a 32 (draft-eastlake-fnv test vectors).
        assert_eq!(method_id(""), 0x811c_9dc5);
        assert_eq!(method_id("a"), 0xe40c_292c);
        assert_eq!(method_id("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn full_names_with_and_without_package() {
        assert_eq!(full_method_name("helloworld", "Greeter", "SayHello"), "/helloworld.Greeter/SayHello");
        assert_eq!(full_method_name("a.b.c", "S", "M"), "/a.b.c.S/M");
        assert_eq!(full_method_name("", "Greeter", "SayHello"), "/Greeter/SayHello");
    }
}
