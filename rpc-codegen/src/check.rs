//! Checks on the whole `FileDescriptorSet` before any code is written: Rust names that two proto
//! names would share.

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost_types::FileDescriptorSet;

use crate::method_id::full_method_name;
use crate::modules::has_nested_module;
use crate::names::{sanitize, snake};
use crate::Error;

/// What the checks found that is not an error.
#[derive(Debug, Default)]
pub struct Findings {
    /// Warnings for the build output, one line each (none are raised today: every RPC shape is
    /// generated).
    pub warnings: Vec<String>,
}

/// `package.name`, or `name` without a package.
fn qualified(package: &str, name: &str) -> String {
    if package.is_empty() {
        name.to_owned()
    } else {
        format!("{package}.{name}")
    }
}

/// Checks names and collects warnings.
///
/// # Errors
/// [`Error::NameClash`] when two RPCs of one service get the same Rust method name, two services
/// of one package the same module name, or a service module the name of a message's nested-items
/// module.
pub fn check(fds: &FileDescriptorSet, _includes: &[PathBuf]) -> Result<Findings, Error> {
    let findings = Findings::default();
    // package → Rust module name → the proto item that claimed it.
    let mut modules: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for file in &fds.file {
        let package = file.package();
        let scope = modules.entry(package).or_default();
        for message in file.message_type.iter().filter(|m| has_nested_module(m)) {
            scope
                .entry(sanitize(&snake(message.name())))
                .or_insert_with(|| format!("message {}", qualified(package, message.name())));
        }
    }
    for file in &fds.file {
        let package = file.package();
        let scope = modules.entry(package).or_default();
        for service in &file.service {
            let service_name = qualified(package, service.name());
            for suffix in ["_server", "_client"] {
                let module = format!("{}{suffix}", snake(service.name()));
                let claim = format!("service {service_name}");
                if let Some(first) = scope.get(&module) {
                    return Err(Error::NameClash { rust: module, first: first.clone(), second: claim });
                }
                scope.insert(module, claim);
            }
            let mut methods: BTreeMap<String, String> = BTreeMap::new();
            for method in &service.method {
                let full = full_method_name(package, service.name(), method.name());
                let rust = sanitize(&snake(method.name()));
                if let Some(first) = methods.get(&rust) {
                    return Err(Error::NameClash { rust, first: first.clone(), second: full });
                }
                methods.insert(rust, full);
            }
        }
    }
    Ok(findings)
}
