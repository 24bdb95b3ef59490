//! A package's code included without the module of a package it imports: rustc's first error is
//! the `use` line codegen ends the file with, quoting the fix (etcd's case: `etcdserverpb`
//! imports `mvccpb`). Runs rustc on a two-line crate that includes the generated
//! `etcdserverpb.rs` (without the `prost` and `rpc_core` crates: only name resolution matters
//! here, and it reports every unresolved path).

use std::path::Path;
use std::process::Command;

/// rustc's human-readable errors for a crate made of `source`, written into a scratch directory.
fn rustc_errors(name: &str, source: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("package-modules").join(name);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let file = dir.join("lib.rs");
    std::fs::write(&file, source).expect("write the crate");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc)
        .args(["--edition", "2021", "--crate-type", "lib", "--emit", "metadata", "--color", "never", "-o"])
        .arg(dir.join("out.rmeta"))
        .arg(&file)
        .output()
        .expect("run rustc");
    assert!(!output.status.success(), "the crate has no prost nor rpc_core: it cannot build");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn include(package: &str) -> String {
    format!(
        "pub mod {package} {{\n    include!({:?});\n}}\n",
        Path::new(env!("OUT_DIR")).join(format!("{package}.rs")).display().to_string()
    )
}

#[test]
fn a_missing_package_module_is_reported_with_the_fix() {
    let errors = rustc_errors("missing", &include("etcdserverpb"));
    assert!(errors.contains("error[E0432]: unresolved import `super::mvccpb`"), "{errors}");
    assert!(
        errors.contains(
            "use super::mvccpb as _; // package `mvccpb` needs its own module: pub mod mvccpb { \
             rpc_core::include_proto!(\"mvccpb\"); }"
        ),
        "the quoted line carries the fix: {errors}"
    );
    // With the module there (empty here), that error is gone.
    let errors = rustc_errors("present", &format!("{}pub mod mvccpb {{}}\n", include("etcdserverpb")));
    assert!(!errors.contains("unresolved import `super::mvccpb`"), "{errors}");
}
