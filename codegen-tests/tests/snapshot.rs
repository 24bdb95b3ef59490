//! The generated code of helloworld, compared with the reviewed snapshot
//! `tests/snapshots/helloworld.rs`. After a deliberate change to the generator, rewrite the
//! snapshot with `UPDATE_SNAPSHOTS=1 cargo test -p codegen-tests --test snapshot` and review the
//! diff before committing it.

use std::path::Path;

/// What the build script generated for `package helloworld`.
const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/helloworld.rs"));

#[test]
fn helloworld_matches_the_reviewed_snapshot() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/helloworld.rs");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        std::fs::write(&path, GENERATED).expect("write the snapshot");
        eprintln!("rewrote {}; review the diff", path.display());
    }
    let reviewed = std::fs::read_to_string(&path).expect("read the snapshot");
    if reviewed != GENERATED {
        let first_difference = reviewed
            .lines()
            .zip(GENERATED.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| reviewed.lines().count().min(GENERATED.lines().count()));
        panic!(
            "the generated helloworld code differs from {} from line {}; if the change is intended, \
             rerun with UPDATE_SNAPSHOTS=1 and review the diff.\n--- generated ---\n{GENERATED}",
            path.display(),
            first_difference + 1
        );
    }
}
