//! Rust type names that two proto items would share in one module: prost-build turns message,
//! enum and oneof names into UpperCamelCase, so `Stock` and `stock`, an enum `STOCK` and a message
//! `Stock` all become one type and rustc refuses the second (`E0428`). Refused before generation,
//! at the second item. A oneof `value` beside a nested message or enum `Value` is not such a case:
//! prost-build names the oneof's type `ValueOneOf`, and so does this check.

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

use crate::location::{describe, error_at, FILE_ENUM, FILE_MESSAGE, MESSAGE_ENUM, MESSAGE_NESTED};
use crate::names::{camel, sanitize, snake};
use crate::Error;

/// `DescriptorProto.oneof_decl`.
const MESSAGE_ONEOF: i32 = 8;

/// One proto item that becomes a Rust type.
struct Item<'a> {
    file: &'a FileDescriptorProto,
    path: Vec<i32>,
    name: String,
    kind: &'static str,
}

/// The types of one Rust module, by Rust name.
#[derive(Default)]
struct Scope<'a> {
    types: BTreeMap<String, Item<'a>>,
}

impl<'a> Scope<'a> {
    /// Claims `rust` for `item`, in the module `module`.
    fn claim(
        &mut self,
        module: &[String],
        rust: String,
        item: Item<'a>,
        includes: &[PathBuf],
    ) -> Result<(), Error> {
        if let Some(first) = self.types.get(&rust) {
            let reason = format!(
                "{} `{}` ({}) and {} `{}` both become the Rust type `{}`; rename one of them",
                first.kind,
                first.name,
                describe(first.file, &first.path, includes),
                item.kind,
                item.name,
                module.iter().map(String::as_str).chain([rust.as_str()]).collect::<Vec<_>>().join("::"),
            );
            return Err(error_at(item.file, &item.path, includes, reason));
        }
        self.types.insert(rust, item);
        Ok(())
    }
}

/// `package.name`, or `name` without a package.
fn qualified(package: &str, name: &str) -> String {
    if package.is_empty() {
        name.to_owned()
    } else {
        format!("{package}.{name}")
    }
}

/// Checks the type names of every module the generated code has. `skip(fq_name)` says whether an
/// item is not generated (an extern path).
///
/// # Errors
/// [`Error::Proto`] at the second of two items with one Rust type name, naming both.
pub fn check_type_names(
    fds: &FileDescriptorSet,
    includes: &[PathBuf],
    skip: &dyn Fn(&str) -> bool,
) -> Result<(), Error> {
    // Files of one package share its module.
    let mut packages: BTreeMap<Vec<String>, Scope<'_>> = BTreeMap::new();
    for file in &fds.file {
        let package = file.package();
        let module: Vec<String> =
            package.split('.').filter(|p| !p.is_empty()).map(|p| sanitize(&snake(p))).collect();
        for (i, message) in file.message_type.iter().enumerate() {
            let name = qualified(package, message.name());
            if skip(&format!(".{name}")) {
                continue;
            }
            let path = vec![FILE_MESSAGE, i as i32];
            let item = Item { file, path: path.clone(), name: name.clone(), kind: "message" };
            packages.entry(module.clone()).or_default().claim(
                &module,
                sanitize(&camel(message.name())),
                item,
                includes,
            )?;
            let inner = [module.as_slice(), &[sanitize(&snake(message.name()))]].concat();
            in_message(file, message, &path, &name, &inner, includes)?;
        }
        for (i, e) in file.enum_type.iter().enumerate() {
            let name = qualified(package, e.name());
            if skip(&format!(".{name}")) {
                continue;
            }
            let item = Item { file, path: vec![FILE_ENUM, i as i32], name, kind: "enum" };
            packages.entry(module.clone()).or_default().claim(
                &module,
                sanitize(&camel(e.name())),
                item,
                includes,
            )?;
        }
    }
    Ok(())
}

/// The types of `message`'s module (named `module`): nested messages, enums and oneofs, then the
/// same inside each nested message.
fn in_message<'a>(
    file: &'a FileDescriptorProto,
    message: &'a DescriptorProto,
    path: &[i32],
    name: &str,
    module: &[String],
    includes: &[PathBuf],
) -> Result<(), Error> {
    let mut scope = Scope::default();
    let child = |tag: i32, k: usize| [path, &[tag, k as i32]].concat();
    for (k, nested) in message.nested_type.iter().enumerate() {
        // Map entries are not generated as types.
        if nested.options.as_ref().is_some_and(|o| o.map_entry()) {
            continue;
        }
        let nested_name = format!("{name}.{}", nested.name());
        let item = Item { file, path: child(MESSAGE_NESTED, k), name: nested_name.clone(), kind: "message" };
        scope.claim(module, sanitize(&camel(nested.name())), item, includes)?;
        let inner = [module, &[sanitize(&snake(nested.name()))]].concat();
        in_message(file, nested, &child(MESSAGE_NESTED, k), &nested_name, &inner, includes)?;
    }
    for (k, e) in message.enum_type.iter().enumerate() {
        let item =
            Item { file, path: child(MESSAGE_ENUM, k), name: format!("{name}.{}", e.name()), kind: "enum" };
        scope.claim(module, sanitize(&camel(e.name())), item, includes)?;
    }
    for (k, oneof) in message.oneof_decl.iter().enumerate() {
        // A proto3 `optional` field's oneof is synthetic: prost-build makes no type of it.
        let synthetic =
            message.field.iter().filter(|f| f.oneof_index == Some(k as i32)).all(|f| f.proto3_optional());
        if synthetic {
            continue;
        }
        let item = Item {
            file,
            path: child(MESSAGE_ONEOF, k),
            name: format!("{name}.{}", oneof.name()),
            kind: "oneof",
        };
        scope.claim(module, oneof_type_name(message, oneof.name()), item, includes)?;
    }
    Ok(())
}

/// The Rust type prost-build gives the oneof `oneof` of `message`: its UpperCamelCase name, with
/// `OneOf` appended when a nested message or enum of `message` has that name too (prost-build's
/// `OneofField::type_name`: a oneof `inner` beside a `message Inner` becomes `InnerOneOf`, as in
/// googleapis' `storage_control.proto`).
///
/// prost-build compares and appends after escaping keywords, so a oneof `self` beside a
/// `message Self` is `Self_OneOf`.
fn oneof_type_name(message: &DescriptorProto, oneof: &str) -> String {
    let name = sanitize(&camel(oneof));
    let nested = message.nested_type.iter().map(DescriptorProto::name);
    let enums = message.enum_type.iter().map(|e| e.name());
    if nested.chain(enums).any(|t| sanitize(&camel(t)) == name) {
        format!("{name}OneOf")
    } else {
        name
    }
}
