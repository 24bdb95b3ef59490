//! What a user sees in cargo's output: a build script calling `rpc_codegen::compile_protos` on a
//! bad proto fails with `file:line:column: reason`, and streaming RPCs show as cargo warnings.
//!
//! This runs cargo on a small crate (`tests/fixtures/proto-user`) with its own target directory
//! under cargo's test scratch space (the first run compiles rpc-codegen's dependencies there once;
//! later runs reuse them). It works offline: every dependency is the workspace's own.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_owned()
}

/// Writes the fixture crate with `protos` (name, contents) into a scratch directory of its own.
fn fixture(name: &str, protos: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("proto-user").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).expect("create fixture dir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proto-user");
    let manifest = std::fs::read_to_string(source.join("Cargo.toml.in")).expect("fixture manifest");
    let codegen = repo().join("rpc-codegen");
    std::fs::write(dir.join("Cargo.toml"), manifest.replace("@RPC_CODEGEN@", &codegen.display().to_string()))
        .expect("write manifest");
    std::fs::copy(source.join("build.rs"), dir.join("build.rs")).expect("copy build.rs");
    std::fs::copy(source.join("src/lib.rs"), dir.join("src/lib.rs")).expect("copy lib.rs");
    // The workspace's lock file pins the same versions the workspace was built with.
    std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy Cargo.lock");
    for (file, contents) in protos {
        let path = dir.join("proto").join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("create proto dir");
        std::fs::write(path, contents).expect("write proto");
    }
    dir
}

/// Runs `cargo build` on the fixture with `PROTO_FILE=proto`; returns (success, stderr).
fn cargo_build(dir: &Path, proto: &str) -> (bool, String) {
    cargo_build_with(dir, proto, None)
}

/// [`cargo_build`], with `PROTO_ATTRIBUTE=attribute` (a type attribute for every message) if given.
fn cargo_build_with(dir: &Path, proto: &str, attribute: Option<&str>) -> (bool, String) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    match attribute {
        Some(attribute) => command.env("PROTO_ATTRIBUTE", attribute),
        None => command.env_remove("PROTO_ATTRIBUTE"),
    };
    let output = command
        .current_dir(dir)
        .args(["build", "--offline", "--target-dir"])
        .arg(Path::new(env!("CARGO_TARGET_TMPDIR")).join("proto-user-target"))
        .env("PROTO_FILE", proto)
        // The outer cargo's settings must not leak into the inner build.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn bad_protos_fail_the_build_with_a_readable_position() {
    let dir = fixture(
        "bad",
        &[
            ("syntax.proto", "syntax = \"proto3\";\n\npackage user;\n\nmessage A {\n  string name = 1\n}\n"),
            ("import.proto", "syntax = \"proto3\";\n\nimport \"nowhere/missing.proto\";\n"),
            (
                "imports.proto",
                "syntax = \"proto3\";\n\nimport \"nowhere/one.proto\";\nimport \"nowhere/two.proto\";\n",
            ),
            (
                "enum.proto",
                "syntax = \"proto3\";\npackage user;\nenum Kind {\n  KIND_UNSPECIFIED = 0;\n  KIND_A = 1;\n  A = 2;\n}\n",
            ),
            ("import_free.proto", "syntax = \"proto3\";\npackage user;\nmessage M {}\n"),
        ],
    );

    let (ok, stderr) = cargo_build(&dir, "proto/syntax.proto");
    assert!(!ok, "the build must fail:\n{stderr}");
    assert!(
        stderr.contains("Error: proto/syntax.proto:7:1: expected ';' or '[', but found '}'"),
        "cargo's output lacks the position and reason:\n{stderr}"
    );

    let (ok, stderr) = cargo_build(&dir, "proto/import.proto");
    assert!(!ok, "the build must fail:\n{stderr}");
    assert!(
        stderr.contains("Error: proto/import.proto:3:1: import 'nowhere/missing.proto' not found"),
        "cargo's output lacks the position and reason:\n{stderr}"
    );

    // Every missing import at once, one line each.
    let (ok, stderr) = cargo_build(&dir, "proto/imports.proto");
    assert!(!ok, "the build must fail:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().map(str::trim).collect();
    let first = lines
        .iter()
        .position(|l| *l == "Error: proto/imports.proto:3:1: import 'nowhere/one.proto' not found")
        .unwrap_or_else(|| panic!("cargo's output lacks the first missing import:\n{stderr}"));
    assert_eq!(
        lines.get(first + 1),
        Some(&"proto/imports.proto:4:1: import 'nowhere/two.proto' not found"),
        "cargo's output lacks the second missing import on the next line:\n{stderr}"
    );

    // A shape prost-build would panic on is reported at its place, with no panic banner.
    let (ok, stderr) = cargo_build(&dir, "proto/enum.proto");
    assert!(!ok, "the build must fail:\n{stderr}");
    assert!(
        stderr.contains(
            "Error: proto/enum.proto:6:3: enum `user.Kind`: values `KIND_A` and `A` both become the Rust \
             variant `A` (prost-build drops the enum's name from the front of its values' names); rename \
             one of them"
        ),
        "cargo's output lacks the position and reason:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "a panic banner reached the user:\n{stderr}");

    // What prost-build still panics on (an attribute that is not one) is an error without a banner.
    let (ok, stderr) = cargo_build_with(&dir, "proto/import_free.proto", Some("#[derive("));
    assert!(!ok, "the build must fail:\n{stderr}");
    assert!(stderr.contains("Error: generating Rust code failed: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "a panic banner reached the user:\n{stderr}");
}

#[test]
fn streaming_rpcs_build_without_warnings() {
    let proto =
        "syntax = \"proto3\";\npackage user;\nmessage M {}\nservice S {\n  rpc Unary(M) returns (M);\n  \
                 rpc Watch(M) returns (stream M);\n  rpc Push(stream M) returns (M);\n  \
                 rpc Chat(stream M) returns (stream M);\n}\n";
    let dir = fixture("streaming", &[("streaming.proto", proto)]);
    let (ok, stderr) = cargo_build(&dir, "proto/streaming.proto");
    assert!(ok, "the build must succeed:\n{stderr}");
    for rpc in ["/user.S/Unary", "/user.S/Watch", "/user.S/Push", "/user.S/Chat"] {
        assert!(!stderr.contains(rpc), "every shape is generated, none warned about:\n{stderr}");
    }
    // The build script asked cargo to rerun it when the proto changes.
    let build = Path::new(env!("CARGO_TARGET_TMPDIR")).join("proto-user-target/debug/build");
    let outputs: Vec<String> = std::fs::read_dir(&build)
        .expect("build dir")
        .filter_map(|e| std::fs::read_to_string(e.expect("entry").path().join("output")).ok())
        .collect();
    assert!(
        outputs.iter().any(|o| o.lines().any(|l| l == "cargo:rerun-if-changed=proto/streaming.proto")),
        "no rerun-if-changed for the proto in {outputs:#?}"
    );
}
