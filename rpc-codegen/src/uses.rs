//! One line per imported package at the end of each generated file, so that a package module the
//! user left out is reported with the rule that fixes it.
//!
//! Generated code reaches the messages of another package by a relative path
//! (`super::mvccpb::KeyValue` from `etcdserverpb`), as prost-build writes it, so every package a
//! file refers to needs a module of its own, nested as its name is. Without one, rustc says
//! `cannot find mvccpb in super` at every use. Each generated file therefore ends with, per
//! package its messages or services refer to,
//!
//! ```text
//! #[allow(unused_imports)]
//! use super::mvccpb as _; // package `mvccpb` needs its own module: pub mod mvccpb { rpc_core::include_proto!("mvccpb"); }
//! ```
//!
//! which costs nothing when the module is there, and otherwise adds an `unresolved import` error
//! whose quoted line carries the fix. Packages that only enclose this one (`codegen.deep` for
//! `codegen.deep.inner.v1`) are not listed: the file sits inside their module. Extern and
//! well-known types (`::prost_types`) are not package modules.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use prost_types::{DescriptorProto, FileDescriptorSet};

use crate::modules::{package_module, Tree};
use crate::Error;

/// The package of every message and enum of `fds`, by full name with a leading dot.
fn packages_by_type(fds: &FileDescriptorSet) -> BTreeMap<String, String> {
    fn nested(prefix: &str, message: &DescriptorProto, package: &str, out: &mut BTreeMap<String, String>) {
        let name = format!("{prefix}.{}", message.name());
        for e in &message.enum_type {
            out.insert(format!("{name}.{}", e.name()), package.to_owned());
        }
        for m in &message.nested_type {
            nested(&name, m, package, out);
        }
        out.insert(name, package.to_owned());
    }
    let mut out = BTreeMap::new();
    for file in &fds.file {
        let package = file.package();
        let prefix = if package.is_empty() { String::new() } else { format!(".{package}") };
        for e in &file.enum_type {
            out.insert(format!("{prefix}.{}", e.name()), package.to_owned());
        }
        for m in &file.message_type {
            nested(&prefix, m, package, &mut out);
        }
    }
    out
}

/// Every type name (`.pkg.Msg`) the fields of `message` and its nested messages refer to.
fn field_types<'a>(message: &'a DescriptorProto, out: &mut Vec<&'a str>) {
    out.extend(message.field.iter().filter_map(|f| f.type_name.as_deref()));
    for m in &message.nested_type {
        field_types(m, out);
    }
}

/// Output file (`pkg.rs`) → the packages other than its own that its code refers to.
fn referenced_packages(fds: &FileDescriptorSet, tree: &Tree<'_>) -> BTreeMap<String, BTreeSet<String>> {
    let by_type = packages_by_type(fds);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &fds.file {
        let package = file.package();
        if package.is_empty() {
            // `_.rs`: included wherever the user likes; its paths are not relative to a package.
            continue;
        }
        let mut types = Vec::new();
        for m in &file.message_type {
            field_types(m, &mut types);
        }
        if tree.build_server || tree.build_client {
            for s in &file.service {
                types.extend(s.method.iter().flat_map(|m| [m.input_type(), m.output_type()]));
            }
        }
        let own = package_module(package);
        for t in types {
            if tree.is_extern(t) {
                continue;
            }
            let Some(other) = by_type.get(t) else { continue };
            let theirs = package_module(other);
            // Not this package, not one that encloses it, not the root.
            if other == package || theirs.is_empty() || own.starts_with(&theirs) {
                continue;
            }
            out.entry(format!("{}.rs", own.join("."))).or_default().insert(other.clone());
        }
    }
    out
}

/// The `use` line of package `other` in the file of package `own`, with the rule in a comment.
fn use_line(own: &str, other: &str) -> String {
    let (own, theirs) = (package_module(own), package_module(other));
    let common = own.iter().zip(&theirs).take_while(|(a, b)| a == b).count();
    let path: Vec<&str> = std::iter::repeat_n("super", own.len() - common)
        .chain(theirs[common..].iter().map(String::as_str))
        .collect();
    let file = theirs.join(".");
    let module = theirs.join("::");
    let fix = if theirs.len() == 1 {
        format!("pub mod {module} {{ rpc_core::include_proto!(\"{file}\"); }}")
    } else {
        format!("`{module}`, holding rpc_core::include_proto!(\"{file}\")")
    };
    // `self::` for a package below this one: never taken for a crate of that name.
    let prefix = if own.len() == common { "self::" } else { "" };
    format!(
        "#[allow(unused_imports)]\nuse {prefix}{} as _; // package `{other}` needs its own module: {fix}\n",
        path.join("::")
    )
}

/// The lines to append to each generated file (by file name): the `use` lines of the packages
/// it refers to. Computed before prost-build takes `fds`.
pub fn plan(fds: &FileDescriptorSet, tree: &Tree<'_>) -> Vec<(String, String)> {
    let own_by_file: BTreeMap<String, &str> = fds
        .file
        .iter()
        .map(|f| (format!("{}.rs", package_module(f.package()).join(".")), f.package()))
        .collect();
    referenced_packages(fds, tree)
        .into_iter()
        .map(|(name, others)| {
            let own = own_by_file.get(&name).copied().unwrap_or_default();
            let mut text = String::from(
                "// The packages this one refers to: each needs a module of its own, nested as its name is.\n",
            );
            for other in &others {
                let _ = write!(text, "{}", use_line(own, other));
            }
            (name, text)
        })
        .collect()
}

/// Appends the lines of [`plan`] to the generated files in `out_dir`.
///
/// # Errors
/// [`Error::Io`] when a generated file cannot be read or written.
pub fn append(plan: &[(String, String)], out_dir: &Path) -> Result<(), Error> {
    for (name, lines) in plan {
        let path = out_dir.join(name);
        let Ok(mut text) = std::fs::read_to_string(&path) else { continue };
        text.push_str(lines);
        std::fs::write(&path, text).map_err(|source| Error::Io {
            context: format!("writing the package uses of {}", path.display()),
            source,
        })?;
    }
    Ok(())
}
