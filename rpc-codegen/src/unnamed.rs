//! Proto names that give no Rust identifier. Protobuf accepts identifiers made of underscores only
//! (`_`, `__`); prost-build and this generator build Rust names from their words (`to_snake_case`,
//! `to_upper_camel_case`), which drop underscores, so such a name becomes the empty string and the
//! generated file does not parse (prost-build then panics inside the build script). The same holds
//! for a package part (`package a._;`), which names a module. They are refused before anything is
//! generated, with the place of the name.

use std::path::PathBuf;

use prost_types::source_code_info::Location;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};

use crate::proto_error::on_disk;
use crate::Error;

// Field numbers of `google/protobuf/descriptor.proto`, as `SourceCodeInfo` paths use them.
const FILE_PACKAGE: i32 = 2;
const FILE_MESSAGE: i32 = 4;
const FILE_ENUM: i32 = 5;
const FILE_SERVICE: i32 = 6;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED: i32 = 3;
const MESSAGE_ENUM: i32 = 4;
const MESSAGE_ONEOF: i32 = 8;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

/// True when `name` has a letter or a digit, i.e. some Rust identifier can be made from it.
fn has_rust_name(name: &str) -> bool {
    name.chars().any(|c| c.is_ascii_alphanumeric())
}

/// A name without a Rust form, with its kind and its `SourceCodeInfo` path.
struct Unnamed {
    kind: &'static str,
    name: String,
    path: Vec<i32>,
}

/// Checks every name prost-build or this generator turns into a Rust identifier: package parts,
/// messages (nested too), fields, oneofs, enums, enum values, services and methods.
///
/// # Errors
/// [`Error::Proto`] at the first such name (file, line and column when the set has source info),
/// else [`Error::ProtoFile`] naming the file.
pub fn check_rust_names(fds: &FileDescriptorSet, includes: &[PathBuf]) -> Result<(), Error> {
    for file in &fds.file {
        let package = file.package();
        let unnamed_package = package.split('.').any(|part| !has_rust_name(part));
        let bad = if !package.is_empty() && unnamed_package {
            // A package's parts name the modules its code is reached through (`super::part::M`).
            Some(Unnamed { kind: "package", name: package.to_owned(), path: vec![FILE_PACKAGE] })
        } else {
            first_unnamed(file).map(|b| Unnamed {
                name: if package.is_empty() { b.name } else { format!("{package}.{}", b.name) },
                ..b
            })
        };
        if let Some(bad) = bad {
            let reason = format!(
                "{} `{}` has no letter or digit, so it has no Rust name; rename it",
                bad.kind, bad.name
            );
            let location = file
                .source_code_info
                .as_ref()
                .and_then(|info| info.location.iter().find(|l: &&Location| l.path == bad.path));
            return Err(match location.filter(|l| l.span.len() >= 2) {
                Some(l) => Error::Proto {
                    path: on_disk(file.name(), includes),
                    line: l.span[0] as usize + 1,
                    column: l.span[1] as usize + 1,
                    reason,
                },
                None => Error::ProtoFile { file: Some(file.name().to_owned()), reason },
            });
        }
    }
    Ok(())
}

fn first_unnamed(file: &FileDescriptorProto) -> Option<Unnamed> {
    for (i, message) in file.message_type.iter().enumerate() {
        if let Some(bad) = in_message(message, vec![FILE_MESSAGE, i as i32], "") {
            return Some(bad);
        }
    }
    for (i, e) in file.enum_type.iter().enumerate() {
        if let Some(bad) = in_enum(e, vec![FILE_ENUM, i as i32], "") {
            return Some(bad);
        }
    }
    for (i, service) in file.service.iter().enumerate() {
        let path = vec![FILE_SERVICE, i as i32];
        if !has_rust_name(service.name()) {
            return Some(Unnamed { kind: "service", name: service.name().to_owned(), path });
        }
        for (k, method) in service.method.iter().enumerate() {
            if !has_rust_name(method.name()) {
                return Some(Unnamed {
                    kind: "RPC",
                    name: format!("{}.{}", service.name(), method.name()),
                    path: [path.as_slice(), &[SERVICE_METHOD, k as i32]].concat(),
                });
            }
        }
    }
    None
}

/// `prefix` is the enclosing messages' names with a trailing dot.
fn in_message(message: &DescriptorProto, path: Vec<i32>, prefix: &str) -> Option<Unnamed> {
    let name = format!("{prefix}{}", message.name());
    if !has_rust_name(message.name()) {
        return Some(Unnamed { kind: "message", name, path });
    }
    let child = |tag: i32, k: usize| [path.as_slice(), &[tag, k as i32]].concat();
    for (k, field) in message.field.iter().enumerate() {
        if !has_rust_name(field.name()) {
            let name = format!("{name}.{}", field.name());
            return Some(Unnamed { kind: "field", name, path: child(MESSAGE_FIELD, k) });
        }
    }
    for (k, oneof) in message.oneof_decl.iter().enumerate() {
        if !has_rust_name(oneof.name()) {
            let name = format!("{name}.{}", oneof.name());
            return Some(Unnamed { kind: "oneof", name, path: child(MESSAGE_ONEOF, k) });
        }
    }
    let inner = format!("{name}.");
    for (k, nested) in message.nested_type.iter().enumerate() {
        if let Some(bad) = in_message(nested, child(MESSAGE_NESTED, k), &inner) {
            return Some(bad);
        }
    }
    for (k, e) in message.enum_type.iter().enumerate() {
        if let Some(bad) = in_enum(e, child(MESSAGE_ENUM, k), &inner) {
            return Some(bad);
        }
    }
    None
}

fn in_enum(e: &EnumDescriptorProto, path: Vec<i32>, prefix: &str) -> Option<Unnamed> {
    let name = format!("{prefix}{}", e.name());
    if !has_rust_name(e.name()) {
        return Some(Unnamed { kind: "enum", name, path });
    }
    for (k, value) in e.value.iter().enumerate() {
        if !has_rust_name(value.name()) {
            let path = [path.as_slice(), &[ENUM_VALUE, k as i32]].concat();
            return Some(Unnamed { kind: "enum value", name: format!("{name}.{}", value.name()), path });
        }
    }
    None
}
