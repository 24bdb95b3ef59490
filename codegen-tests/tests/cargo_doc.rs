//! The generated code of every test proto documents without a warning: `cargo doc` on this crate
//! with `RUSTDOCFLAGS=-D warnings` (proto comments with code blocks, HTML-looking text and links
//! to proto names, googleapis style, are in `proto/codegen/comments.proto`).
//!
//! It runs cargo in a target directory of its own under cargo's test scratch space (shared with
//! `cargo_output.rs`, so rpc-codegen's dependencies are built there once), offline.

use std::path::Path;
use std::process::Command;

#[test]
fn generated_code_documents_without_warnings() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(repo)
        .args(["doc", "--offline", "--no-deps", "-p", "codegen-tests", "--target-dir"])
        .arg(Path::new(env!("CARGO_TARGET_TMPDIR")).join("proto-user-target"))
        .env("RUSTDOCFLAGS", "-D warnings")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo doc");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo doc failed:\n{stderr}");
    assert!(!stderr.lines().any(|l| l.starts_with("warning: unresolved link")), "{stderr}");
}
