//! Enum values whose Rust variants would be the same. prost-build names a variant by the value's
//! UpperCamelCase name with the enum's own name dropped from its front (`KIND_FOO` of `Kind` →
//! `Foo`), and panics when two values of one enum get the same variant (`KIND_FOO` and `FOO`).
//! The same rule is applied here first, so the user gets the place of the second value instead.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

use crate::location::{error_at, ENUM_VALUE, FILE_ENUM, FILE_MESSAGE, MESSAGE_ENUM, MESSAGE_NESTED};
use crate::names::{camel, sanitize};
use crate::Error;

/// prost-build's `to_upper_camel`.
fn upper_camel(name: &str) -> String {
    sanitize(&camel(name))
}

/// prost-build's `strip_enum_prefix`: `name` without `prefix` when what follows starts a new
/// word (an upper-case letter), sanitized.
fn strip_enum_prefix(prefix: &str, name: &str) -> String {
    let stripped = name.strip_prefix(prefix).unwrap_or(name);
    let stripped = if stripped.chars().next().is_some_and(char::is_uppercase) { stripped } else { name };
    sanitize(stripped)
}

/// Checks every enum of `fds` (nested ones too). `strip_prefix` is prost-build's default
/// (`retain_enum_prefix` turns it off). `skip(fq_name)` says whether an enum is not generated
/// (an extern path).
///
/// # Errors
/// [`Error::Proto`] at the second of two values that become one variant, naming the enum and
/// both values.
pub fn check_enum_variants(
    fds: &FileDescriptorSet,
    includes: &[PathBuf],
    strip_prefix: bool,
    skip: &dyn Fn(&str) -> bool,
) -> Result<(), Error> {
    for file in &fds.file {
        let scope = if file.package().is_empty() { String::new() } else { format!(".{}", file.package()) };
        let mut enums: Vec<(String, &EnumDescriptorProto, Vec<i32>)> = Vec::new();
        for (i, e) in file.enum_type.iter().enumerate() {
            enums.push((format!("{scope}.{}", e.name()), e, vec![FILE_ENUM, i as i32]));
        }
        for (i, message) in file.message_type.iter().enumerate() {
            collect(
                message,
                &format!("{scope}.{}", message.name()),
                vec![FILE_MESSAGE, i as i32],
                &mut enums,
            );
        }
        for (fq_name, e, path) in enums {
            if skip(&fq_name) {
                continue;
            }
            if let Some((k, reason)) = overlap(&fq_name[1..], e, strip_prefix) {
                let path = [path.as_slice(), &[ENUM_VALUE, k as i32]].concat();
                return Err(error_at(file, &path, includes, reason));
            }
        }
    }
    Ok(())
}

/// The enums of `message` and its nested messages, with their full names and paths.
fn collect<'a>(
    message: &'a DescriptorProto,
    fq_name: &str,
    path: Vec<i32>,
    out: &mut Vec<(String, &'a EnumDescriptorProto, Vec<i32>)>,
) {
    for (k, e) in message.enum_type.iter().enumerate() {
        out.push((
            format!("{fq_name}.{}", e.name()),
            e,
            [path.as_slice(), &[MESSAGE_ENUM, k as i32]].concat(),
        ));
    }
    for (k, nested) in message.nested_type.iter().enumerate() {
        let nested_path = [path.as_slice(), &[MESSAGE_NESTED, k as i32]].concat();
        collect(nested, &format!("{fq_name}.{}", nested.name()), nested_path, out);
    }
}

/// The index of the first value whose variant an earlier value already has, with the reason.
/// Values that repeat an earlier number (`allow_alias`) are skipped, as prost-build skips them.
fn overlap(name: &str, e: &EnumDescriptorProto, strip_prefix: bool) -> Option<(usize, String)> {
    let enum_name = upper_camel(e.name());
    let mut numbers = BTreeSet::new();
    let mut variants: BTreeMap<String, &str> = BTreeMap::new();
    for (k, value) in e.value.iter().enumerate() {
        if !numbers.insert(value.number()) {
            continue;
        }
        let mut variant = upper_camel(value.name());
        if strip_prefix {
            variant = strip_enum_prefix(&enum_name, &variant);
        }
        if let Some(first) = variants.get(&variant) {
            let how = if strip_prefix {
                " (prost-build drops the enum's name from the front of its values' names)"
            } else {
                ""
            };
            return Some((
                k,
                format!(
                    "enum `{name}`: values `{first}` and `{}` both become the Rust variant `{variant}`{how}; \
                     rename one of them",
                    value.name()
                ),
            ));
        }
        variants.insert(variant, value.name());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_stripping_is_prost_builds() {
        assert_eq!(strip_enum_prefix("Kind", "KindFoo"), "Foo");
        assert_eq!(strip_enum_prefix("Kind", "Kindness"), "Kindness");
        assert_eq!(strip_enum_prefix("Kind", "Kind"), "Kind");
        assert_eq!(strip_enum_prefix("Kind", "KindSelf"), "Self_");
        assert_eq!(strip_enum_prefix("Kind", "Kind2"), "Kind2");
    }
}
