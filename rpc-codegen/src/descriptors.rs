//! The encoded descriptors each package's generated code carries (`FILE_DESCRIPTOR_SET`), for
//! the reflection service (`rpc_core::reflection`): per package that has a service, its files and
//! every file they import, transitively, as one `google.protobuf.FileDescriptorSet` — what
//! tonic-build's `file_descriptor_set_path` writes, kept in the code instead of a file beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use prost::Message as _;
use prost_types::{FileDescriptorProto, FileDescriptorSet};

/// Bytes per line of the emitted byte string (each written `\xNN`).
const BYTES_PER_LINE: usize = 24;

/// Per package with a service (`""` for files without a package): its encoded set. Taken before
/// any rewriting of the set for code generation (renamed message modules, escaped comments), so
/// the descriptors are the `.proto` files' own. Source info (comments, positions) is left out:
/// the set stays small, and reflection clients need the types only. Files come in dependency
/// order (a file after the files it imports), as protoc writes them.
pub fn per_package(fds: &FileDescriptorSet) -> BTreeMap<String, Vec<u8>> {
    let by_name: BTreeMap<&str, &FileDescriptorProto> = fds.file.iter().map(|f| (f.name(), f)).collect();
    let mut out = BTreeMap::new();
    let packages: BTreeSet<&str> =
        fds.file.iter().filter(|f| !f.service.is_empty()).map(|f| f.package()).collect();
    for package in packages {
        let mut order: Vec<&FileDescriptorProto> = Vec::new();
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        for file in fds.file.iter().filter(|f| f.package() == package) {
            visit(file, &by_name, &mut seen, &mut order);
        }
        let set = FileDescriptorSet {
            file: order
                .into_iter()
                .map(|f| FileDescriptorProto { source_code_info: None, ..f.clone() })
                .collect(),
        };
        out.insert(package.to_owned(), set.encode_to_vec());
    }
    out
}

/// Depth first: `file`'s imports (those in the set), then `file`.
fn visit<'a>(
    file: &'a FileDescriptorProto,
    by_name: &BTreeMap<&str, &'a FileDescriptorProto>,
    seen: &mut BTreeSet<&'a str>,
    order: &mut Vec<&'a FileDescriptorProto>,
) {
    if !seen.insert(file.name()) {
        return;
    }
    for dep in &file.dependency {
        if let Some(d) = by_name.get(dep.as_str()) {
            visit(d, by_name, seen, order);
        }
    }
    order.push(file);
}

/// The package-level constant, appended to a package's generated file.
pub fn write_const(bytes: &[u8], buf: &mut String) {
    buf.push_str(
        "/// The encoded `google.protobuf.FileDescriptorSet` of this package's `.proto` files and of \
         every file\n/// they import (without source info), in dependency order. Generated servers \
         hand it to\n/// `ServerBuilder::add_reflection` (gRPC's reflection service) through \
         `Service::FILE_DESCRIPTOR_SET`.\n",
    );
    buf.push_str("pub const FILE_DESCRIPTOR_SET: &[u8] = b\"");
    for chunk in bytes.chunks(BYTES_PER_LINE) {
        buf.push_str("\\\n    ");
        for b in chunk {
            let _ = write!(buf, "\\x{b:02x}");
        }
    }
    buf.push_str("\";\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, package: &str, deps: &[&str], service: bool) -> FileDescriptorProto {
        FileDescriptorProto {
            name: Some(name.into()),
            package: Some(package.into()),
            dependency: deps.iter().map(|d| (*d).to_owned()).collect(),
            service: if service { vec![Default::default()] } else { Vec::new() },
            source_code_info: Some(Default::default()),
            ..Default::default()
        }
    }

    #[test]
    fn a_package_carries_its_imports_transitively_in_dependency_order_without_source_info() {
        let fds = FileDescriptorSet {
            file: vec![
                file("svc.proto", "a", &["mid.proto"], true),
                file("mid.proto", "b", &["base.proto"], false),
                file("base.proto", "c", &[], false),
                file("other.proto", "d", &[], false),
            ],
        };
        let sets = per_package(&fds);
        assert_eq!(sets.keys().collect::<Vec<_>>(), ["a"], "only packages with a service");
        let set = FileDescriptorSet::decode(sets["a"].as_slice()).unwrap();
        let names: Vec<&str> = set.file.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["base.proto", "mid.proto", "svc.proto"]);
        assert!(set.file.iter().all(|f| f.source_code_info.is_none()));
    }

    #[test]
    fn the_constant_is_a_byte_string_that_round_trips() {
        let bytes: Vec<u8> = (0..=255u8).collect();
        let mut buf = String::new();
        write_const(&bytes, &mut buf);
        assert!(buf.contains("pub const FILE_DESCRIPTOR_SET: &[u8] = b\"\\\n    \\x00\\x01"));
        assert!(buf.lines().all(|l| l.len() < 120), "lines stay short");
        // Undo the escapes as rustc would.
        let start = buf.find("b\"").unwrap() + 2;
        let body = &buf[start..buf.rfind('"').unwrap()];
        let body = body.replace("\\\n    ", "");
        let parsed: Vec<u8> = body.split("\\x").skip(1).map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
        assert_eq!(parsed, bytes);
    }
}
