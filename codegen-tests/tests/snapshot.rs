//! The generated code of a few protos, compared with reviewed snapshots in `tests/snapshots/`:
//! helloworld (the plain shape) and `codegen.collide` (renamed message modules, `Bytes` fields);
//! and the health and reflection services' code that `rpc-core` keeps checked in (it has no
//! build script).
//! After a deliberate change to the generator, rewrite them with
//! `UPDATE_SNAPSHOTS=1 cargo test -p codegen-tests --test snapshot` and review the diff before
//! committing it.

use std::path::Path;

/// Compares `generated` with `tests/snapshots/<name>` (or rewrites the snapshot on request).
fn check(name: &str, generated: &str) {
    check_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(name), generated);
}

/// Compares `generated` with the file at `path` (or rewrites it on request).
fn check_file(path: &Path, generated: &str) {
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        std::fs::write(path, generated).expect("write the snapshot");
        eprintln!("rewrote {}; review the diff", path.display());
    }
    let reviewed = std::fs::read_to_string(path).expect("read the snapshot");
    if reviewed != generated {
        let first_difference = reviewed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| reviewed.lines().count().min(generated.lines().count()));
        panic!(
            "the generated code differs from {} from line {}; if the change is intended, rerun with \
             UPDATE_SNAPSHOTS=1 and review the diff.\n--- generated ---\n{generated}",
            path.display(),
            first_difference + 1
        );
    }
}

#[test]
fn helloworld_matches_the_reviewed_snapshot() {
    check("helloworld.rs", include_str!(concat!(env!("OUT_DIR"), "/helloworld.rs")));
}

#[test]
fn renamed_message_modules_match_the_reviewed_snapshot() {
    check("codegen.collide.rs", include_str!(concat!(env!("OUT_DIR"), "/codegen.collide.rs")));
}

/// `rpc-core/src/health/grpc.health.v1.rs` is this generator's output for
/// `proto/grpc/health/v1/health.proto`, kept in the library (which has no build script): it must
/// not drift from what the generator makes today.
#[test]
fn rpc_core_health_code_matches_the_generator() {
    let checked_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rpc-core/src/health/grpc.health.v1.rs");
    check_file(&checked_in, include_str!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs")));
}

/// `rpc-core/src/reflection/grpc.reflection.v1.rs` is this generator's output for
/// `proto/grpc/reflection/v1/reflection.proto` (its service async), kept in the library.
#[test]
fn rpc_core_reflection_code_matches_the_generator() {
    let checked_in =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../rpc-core/src/reflection/grpc.reflection.v1.rs");
    check_file(&checked_in, include_str!(concat!(env!("OUT_DIR"), "/grpc.reflection.v1.rs")));
}
