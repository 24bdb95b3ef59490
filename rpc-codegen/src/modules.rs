//! Module-name collisions in the generated tree, and the rename that resolves the common one.
//!
//! prost-build puts a message's nested types, enums and oneofs into a module named after the
//! message (`snake_case`), next to the message; a package's code goes into a module named after the
//! package's last part, inside its parent package's module. So message `a.b.Foo` (with nested
//! items) and package `a.b.foo` (or `a.b.foo.v1`, which needs a module `a::b::foo` too) both want
//! `a::b::foo`: rustc refuses the second (`E0428`), or, when the two are included apart, a path
//! into one resolves into the other.
//!
//! **The rule.** Such a message's module gets a trailing underscore — `a::b::foo_` — (after
//! dropping `r#`: `r#type` → `type_`), and more underscores while that name is taken in the same
//! parent. The message's struct keeps its name. Every path that goes through the module (fields,
//! oneofs, enums, other packages' references, RPC signatures) uses the new name.
//!
//! prost-build has no option to rename a module. So while it runs, the message carries a unique
//! stand-in name in the descriptor set (every reference to it too, and the path options given to
//! the [`Builder`](crate::Builder) get a copy for the stand-in); its generated files are then
//! rewritten, stand-in tokens → the struct's name and the new module name.
//!
//! Collisions with no safe rename are errors naming both items with `file:line:col`: a service's
//! module against a package's module, two messages whose modules are one, and any rename when the
//! prost-build configuration was replaced wholesale (its path options cannot be carried over).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet};

use crate::location::{describe, error_at, FILE_MESSAGE, FILE_PACKAGE, FILE_SERVICE, MESSAGE_NESTED};
use crate::names::{camel, sanitize, snake};
use crate::Error;

/// The word inside every stand-in name; refused in the input (it would be rewritten too).
const MARKER: &str = "rpccodegenmoved";

/// What the generated tree holds, as far as the checks need it.
pub struct Tree<'a> {
    /// Proto paths given to `extern_path` (not generated), with their leading dot.
    pub extern_paths: &'a [String],
    /// Whether `google.protobuf` is generated (`compile_well_known_types`); else it is extern.
    pub well_known_types: bool,
    /// Whether `<service>_server` / `<service>_client` modules are generated.
    pub build_server: bool,
    /// See `build_server`.
    pub build_client: bool,
    /// True when the prost-build configuration was replaced by `prost_config`: its path options
    /// are unknown, so no rename is safe.
    pub prost_replaced: bool,
}

impl Tree<'_> {
    /// Whether the proto item `fq_name` (`.a.b.Foo`) is not generated: it is under an extern path.
    pub fn is_extern(&self, fq_name: &str) -> bool {
        let under = |prefix: &str| {
            fq_name == prefix || (fq_name.starts_with(prefix) && fq_name[prefix.len()..].starts_with('.'))
        };
        (!self.well_known_types && under(".google.protobuf")) || self.extern_paths.iter().any(|p| under(p))
    }
}

/// One message whose module is renamed.
#[derive(Debug, Clone)]
pub struct Rename {
    /// Its package (`""` without one).
    pub package: String,
    /// Its proto name.
    pub message: String,
    /// The proto name it carries while prost-build runs.
    pub stand_in: String,
    /// Stand-in token → final token, for the rewrite of the generated files.
    tokens: Vec<(String, String)>,
}

/// prost-build's `to_snake`.
fn module_name(name: &str) -> String {
    sanitize(&snake(name))
}

/// A package's module path (prost-build's `Module::from_protobuf_package_name`).
pub fn package_module(package: &str) -> Vec<String> {
    package.split('.').filter(|p| !p.is_empty()).map(module_name).collect()
}

/// `package.name`, or `name` without a package.
fn qualified(package: &str, name: &str) -> String {
    if package.is_empty() {
        name.to_owned()
    } else {
        format!("{package}.{name}")
    }
}

/// `a::b::name` (just `name` at the root).
fn rust_path(parent: &[String], name: &str) -> String {
    parent.iter().map(String::as_str).chain([name]).collect::<Vec<_>>().join("::")
}

/// Whether prost-build gives `message` a module of nested items: when it has an enum, a nested
/// message that is not a map field's entry, or a oneof with a field that is not a proto3
/// `optional` one (prost-build's `append_message`; map entries and the synthetic oneofs of
/// `optional` fields become no Rust item). A message with only maps and `optional` fields has
/// no module, so its name collides with nothing.
pub fn has_nested_module(message: &DescriptorProto) -> bool {
    let map_entry = |m: &DescriptorProto| m.options.as_ref().is_some_and(|o| o.map_entry());
    let real_oneof =
        |k: usize| message.field.iter().any(|f| f.oneof_index == Some(k as i32) && !f.proto3_optional());
    !message.enum_type.is_empty()
        || message.nested_type.iter().any(|m| !map_entry(m))
        || (0..message.oneof_decl.len()).any(real_oneof)
}

/// `k` as lower-case letters (`a`, `b`, ..., `ba`, ...): a suffix that keeps a stand-in one word.
fn letters(mut k: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'a' + (k % 26) as u8);
        k /= 26;
        if k == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// Finds every module collision of the tree `fds` generates and plans the renames.
///
/// # Errors
/// [`Error::Proto`] (with `file:line:col`, the other item's place in the reason) for the
/// collisions that have no safe rename; see the module docs.
pub fn plan(fds: &FileDescriptorSet, includes: &[PathBuf], tree: &Tree<'_>) -> Result<Vec<Rename>, Error> {
    let generated: Vec<(usize, &FileDescriptorProto)> = fds
        .file
        .iter()
        .enumerate()
        .filter(|(_, f)| f.package().is_empty() || !tree.is_extern(&format!(".{}", f.package())))
        .collect();

    // Every package module (with the file that first needs it) and the names taken per parent.
    let mut packages: BTreeMap<Vec<String>, (usize, String)> = BTreeMap::new();
    let mut taken: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for (i, file) in &generated {
        let parts: Vec<&str> = file.package().split('.').filter(|p| !p.is_empty()).collect();
        let module = package_module(file.package());
        for len in 1..=module.len() {
            let name = parts[..len].join(".");
            packages.entry(module[..len].to_vec()).or_insert((*i, name));
            taken.entry(module[..len - 1].to_vec()).or_default().insert(module[len - 1].clone());
        }
    }
    // The place and name of the package whose module is `key`; a module that only parents deeper
    // packages is named with the one that needs it: `a.foo` (parent of `a.foo.v1`).
    let package_at = |key: &[String]| {
        packages.get(key).map(|(i, name)| {
            let file = &fds.file[*i];
            let place = describe(file, &[FILE_PACKAGE], includes);
            if file.package() == name {
                format!("package `{name}` ({place})")
            } else {
                format!("package `{name}` (parent of `{}`, {place})", file.package())
            }
        })
    };

    // Services' modules: a package module of the same name is an error.
    for (_, file) in &generated {
        let parent = package_module(file.package());
        for (k, service) in file.service.iter().enumerate() {
            let suffixes = [("_server", tree.build_server), ("_client", tree.build_client)];
            for (suffix, built) in suffixes {
                let module = format!("{}{suffix}", snake(service.name()));
                if !built {
                    continue;
                }
                let key = [parent.as_slice(), std::slice::from_ref(&module)].concat();
                if let Some(package) = package_at(&key) {
                    let reason = format!(
                        "service `{}` gets the module `{}`, which is also the module of {package}; rename \
                         the service or the package",
                        qualified(file.package(), service.name()),
                        rust_path(&parent, &module),
                    );
                    return Err(error_at(file, &[FILE_SERVICE, k as i32], includes, reason));
                }
                taken.entry(parent.clone()).or_default().insert(module);
            }
        }
    }

    // Messages' modules, in file order: against each other (an error) and against packages.
    let mut messages: BTreeMap<Vec<String>, (usize, usize)> = BTreeMap::new();
    let mut colliding: Vec<(usize, usize, Vec<String>)> = Vec::new();
    for (i, file) in &generated {
        let parent = package_module(file.package());
        for (m, message) in file.message_type.iter().enumerate() {
            let fq = format!(".{}", qualified(file.package(), message.name()));
            if !has_nested_module(message) || tree.is_extern(&fq) {
                continue;
            }
            let module = module_name(message.name());
            let key = [parent.as_slice(), std::slice::from_ref(&module)].concat();
            if let Some(&(fi, fm)) = messages.get(&key) {
                let first = &fds.file[fi];
                let reason = format!(
                    "messages `{}` ({}) and `{}` both get the module `{}` for their nested types; \
                     rename one of them",
                    qualified(first.package(), first.message_type[fm].name()),
                    describe(first, &[FILE_MESSAGE, fm as i32], includes),
                    &fq[1..],
                    rust_path(&parent, &module),
                );
                return Err(error_at(file, &[FILE_MESSAGE, m as i32], includes, reason));
            }
            nested_modules(file, message, &[FILE_MESSAGE, m as i32], &fq[1..], &key, includes)?;
            messages.insert(key.clone(), (*i, m));
            taken.entry(parent.clone()).or_default().insert(module);
            if packages.contains_key(&key) {
                colliding.push((*i, m, key));
            }
        }
    }
    if colliding.is_empty() {
        return Ok(Vec::new());
    }

    let mut input = Vec::new();
    protox::prost::Message::encode(fds, &mut input).unwrap_or_default();
    let marker_in_input = String::from_utf8_lossy(&input).to_lowercase().contains(MARKER);
    let mut renames = Vec::new();
    for (k, (i, m, key)) in colliding.into_iter().enumerate() {
        let file = &fds.file[i];
        let message = file.message_type[m].name();
        let (parent, module) = key.split_at(key.len() - 1);
        let module = &module[0];
        let mut renamed = format!("{}_", module.strip_prefix("r#").unwrap_or(module));
        let scope = taken.entry(parent.to_vec()).or_default();
        while scope.contains(&renamed) {
            renamed.push('_');
        }
        let refusal = if tree.prost_replaced {
            Some(
                "but not when the prost-build configuration was replaced with prost_config(..), whose \
                 path options it cannot carry over to the renamed module; give those options through \
                 the Builder instead, or rename the message or the package",
            )
        } else if marker_in_input {
            Some("but not in a build whose protos contain the word `rpccodegenmoved` (its stand-in names)")
        } else {
            None
        };
        if let Some(refusal) = refusal {
            let package = package_at(&key).unwrap_or_default();
            let reason = format!(
                "message `{}` has nested types, so its module would be `{}`, which is also the module of \
                 {package}; rpc-codegen renames such a message module to `{renamed}`, {refusal}",
                qualified(file.package(), message),
                rust_path(parent, module),
            );
            return Err(error_at(file, &[FILE_MESSAGE, m as i32], includes, reason));
        }
        scope.insert(renamed.clone());
        let stand_in = format!("{message}Rpccodegenmoved{}", letters(k));
        let mut tokens = vec![
            (module_name(&stand_in), renamed.clone()),
            (sanitize(&camel(&stand_in)), sanitize(&camel(message))),
        ];
        if !tokens.iter().any(|(from, _)| *from == stand_in) {
            tokens.push((stand_in.clone(), message.to_owned()));
        }
        renames.push(Rename {
            package: file.package().to_owned(),
            message: message.to_owned(),
            stand_in,
            tokens,
        });
    }
    Ok(renames)
}

/// Checks that no two messages nested in `message` (at `path` in `file`, full name `name`, module
/// `module`) get one module, at every depth.
fn nested_modules(
    file: &FileDescriptorProto,
    message: &DescriptorProto,
    path: &[i32],
    name: &str,
    module: &[String],
    includes: &[PathBuf],
) -> Result<(), Error> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (k, nested) in message.nested_type.iter().enumerate() {
        if !has_nested_module(nested) {
            continue;
        }
        let nested_path = [path, &[MESSAGE_NESTED, k as i32]].concat();
        let nested_name = format!("{name}.{}", nested.name());
        let nested_module = module_name(nested.name());
        if let Some(&first) = seen.get(&nested_module) {
            let reason = format!(
                "messages `{name}.{}` ({}) and `{nested_name}` both get the module `{}` for their nested \
                 types; rename one of them",
                message.nested_type[first].name(),
                describe(file, &[path, &[MESSAGE_NESTED, first as i32]].concat(), includes),
                rust_path(module, &nested_module),
            );
            return Err(error_at(file, &nested_path, includes, reason));
        }
        seen.insert(nested_module.clone(), k);
        let key = [module, std::slice::from_ref(&nested_module)].concat();
        nested_modules(file, nested, &nested_path, &nested_name, &key, includes)?;
    }
    Ok(())
}

/// Gives each renamed message its stand-in name in `fds`, in its declaration and in every
/// reference to it or to an item inside it.
pub fn apply(fds: &mut FileDescriptorSet, renames: &[Rename]) {
    for rename in renames {
        let from = format!(".{}", qualified(&rename.package, &rename.message));
        let to = format!(".{}", qualified(&rename.package, &rename.stand_in));
        let retarget = |name: &mut Option<String>| {
            if let Some(n) = name.as_mut() {
                if *n == from || (n.starts_with(&from) && n[from.len()..].starts_with('.')) {
                    n.replace_range(..from.len(), &to);
                }
            }
        };
        for file in &mut fds.file {
            if file.package() == rename.package {
                for message in &mut file.message_type {
                    if message.name() == rename.message {
                        message.name = Some(rename.stand_in.clone());
                    }
                }
            }
            for message in &mut file.message_type {
                retarget_message(message, &retarget);
            }
            for field in &mut file.extension {
                retarget_field(field, &retarget);
            }
            for service in &mut file.service {
                for method in &mut service.method {
                    retarget(&mut method.input_type);
                    retarget(&mut method.output_type);
                }
            }
        }
    }
}

fn retarget_field(field: &mut FieldDescriptorProto, retarget: &dyn Fn(&mut Option<String>)) {
    retarget(&mut field.type_name);
    retarget(&mut field.extendee);
}

fn retarget_message(message: &mut DescriptorProto, retarget: &dyn Fn(&mut Option<String>)) {
    for field in message.field.iter_mut().chain(message.extension.iter_mut()) {
        retarget_field(field, retarget);
    }
    for nested in &mut message.nested_type {
        retarget_message(nested, retarget);
    }
}

/// The copies of a path option's proto path (`.a.b.Foo.note`, `Foo`) that reach the stand-ins:
/// each dot-separated part equal to a renamed message's name, replaced by its stand-in.
pub fn option_paths(path: &str, renames: &[Rename]) -> Vec<String> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Vec::new();
    for rename in renames {
        for (i, part) in parts.iter().enumerate() {
            if *part == rename.message {
                let mut copy: Vec<&str> = parts.clone();
                copy[i] = &rename.stand_in;
                out.push(copy.join("."));
            }
        }
    }
    out
}

/// `text` with every stand-in token (a whole identifier, or a whole dotted part of a string)
/// replaced by its final form.
pub fn restore(text: &str, renames: &[Rename]) -> String {
    let mut out = text.to_owned();
    for (from, to) in renames.iter().flat_map(|r| r.tokens.iter()) {
        out = replace_word(&out, from, to);
    }
    out
}

fn replace_word(text: &str, from: &str, to: &str) -> String {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + from.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(is_ident) || after.is_some_and(is_ident) {
            out.push_str(from);
        } else {
            out.push_str(to);
        }
        rest = &rest[at + from.len()..];
    }
    out.push_str(rest);
    out
}

/// The names of the files prost-build writes for `fds` (`a.b.rs`, `_.rs` without a package).
pub fn output_files(fds: &FileDescriptorSet) -> BTreeSet<String> {
    fds.file
        .iter()
        .map(|f| {
            let module = package_module(f.package());
            if module.is_empty() {
                "_.rs".to_owned()
            } else {
                format!("{}.rs", module.join("."))
            }
        })
        .collect()
}

/// Rewrites the generated files `names` in `out_dir` that hold stand-ins.
///
/// # Errors
/// [`Error::Io`] when a file cannot be read or written; [`Error::Generate`] if a stand-in is left
/// (a bug).
pub fn rewrite_outputs(names: &BTreeSet<String>, out_dir: &Path, renames: &[Rename]) -> Result<(), Error> {
    for name in names {
        let path = out_dir.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        if !text.to_lowercase().contains(MARKER) {
            continue;
        }
        let restored = restore(&text, renames);
        if restored.to_lowercase().contains(MARKER) {
            return Err(Error::Generate {
                reason: format!("a renamed module's stand-in name is left in {name}"),
            });
        }
        std::fs::write(&path, restored).map_err(|source| Error::Io {
            context: format!("rewriting the renamed modules in {}", path.display()),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_replaced_whole() {
        assert_eq!(
            replace_word("super::foo_x::A, foo_xy, \"foo_x::B\"", "foo_x", "foo_"),
            "super::foo_::A, foo_xy, \"foo_::B\""
        );
        assert_eq!(letters(0), "a");
        assert_eq!(letters(27), "bb");
    }
}
