//! Compiles every proto under `proto/` that must build (all but `proto/codegen/errors/`), the way a
//! user's build script does (the module-collision set a second time through an include file);
//! then the hostile inputs: `codegen-tests/proto/` and two protos
//! written here (control characters in comments, a service with many methods).

use std::fmt::Write as _;
use std::path::PathBuf;

/// Methods of `hostile.many.Many`.
const MANY: usize = 300;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_codegen::compile_protos(
        &[
            "../proto/helloworld.proto",
            "../proto/codegen/keywords.proto",
            "../proto/codegen/stub_names.proto",
            "../proto/codegen/shadowing.proto",
            "../proto/codegen/common.proto",
            "../proto/codegen/deep/outer.proto",
            "../proto/codegen/deep/inner/v1.proto",
            "../proto/codegen/no_package.proto",
            "../proto/codegen/only_service.proto",
            "../proto/codegen/well_known.proto",
            "../proto/codegen/shapes.proto",
            "../proto/codegen/streaming.proto",
            "../proto/codegen/comments.proto",
            "../proto/codegen/collide/shop/v1.proto",
            "../proto/codegen/collide/type/v2.proto",
            "../proto/codegen/collide/deep/er/node.proto",
            "../proto/codegen/plain.proto",
            "../proto/codegen/plain/catalog.proto",
            "../proto/codegen/etcdlike/kv.proto",
            "../proto/codegen/etcdlike/rpc.proto",
            // rpc-core's health service keeps this proto's generated code checked in
            // (`rpc-core/src/health/grpc.health.v1.rs`); `tests/snapshot.rs` holds it to this output.
            "../proto/grpc/health/v1/health.proto",
        ],
        &["../proto"],
    )?;

    // rpc-core's reflection service keeps this proto's generated code checked in
    // (`rpc-core/src/reflection/grpc.reflection.v1.rs`, its one bidirectional method async);
    // `tests/snapshot.rs` holds it to this output.
    rpc_codegen::configure()
        .async_server("grpc.reflection.v1.ServerReflection")
        .compile_protos(&["../proto/grpc/reflection/v1/reflection.proto"], &["../proto"])?;

    // Async server traits, for two services (one named like the facade's `AsyncContext`).
    rpc_codegen::configure()
        .async_server("codegen.asynchronous.Lookup")
        .async_server(".codegen.asynchronous.AsyncContext")
        .async_server("codegen.asynchronous.Pipe")
        .compile_protos(&["../proto/codegen/asynchronous.proto"], &["../proto"])?;

    // Default handlers: trait methods that answer UNIMPLEMENTED unless implemented.
    rpc_codegen::configure()
        .generate_default_stubs(true)
        .async_server("codegen.defaults.PartialAsync")
        .compile_protos(&["../proto/codegen/defaults.proto"], &["../proto"])?;

    // The module-collision set once more, reached through prost-build's include file (which
    // nests the package modules itself) instead of hand-written modules.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    rpc_codegen::configure()
        .out_dir(out_dir.join("with-include-file"))
        .include_file("collide.rs")
        .compile_protos(
            &[
                "../proto/codegen/collide/shop/v1.proto",
                "../proto/codegen/collide/type/v2.proto",
                "../proto/codegen/collide/deep/er/node.proto",
            ],
            &["../proto"],
        )?;

    // Written from here so that no editor or checkout normalizes the control characters.
    let generated = out_dir.join("hostile-protos");
    std::fs::create_dir_all(&generated)?;
    std::fs::write(
        generated.join("control_chars.proto"),
        "syntax = \"proto3\";\npackage hostile.control;\n\
         // A lone carriage return\rinside a message comment, and text direction overrides:\n\
         // user\u{202E}txt.exe, \u{2066}isolate\u{2069}.\n\
         message Text {\n  string s = 1; // trailing\rcomment \u{202B}embedded\u{202C}\n}\n\
         // The service\u{202E}.\nservice Control {\n  // The RPC\rcomment \u{2067}x\u{2069}.\n  \
         rpc Say(Text) returns (Text);\n}\n",
    )?;
    let mut many = String::from(
        "syntax = \"proto3\";\npackage hostile.many;\nmessage M {\n  uint32 n = 1;\n}\nservice Many {\n",
    );
    // Its implementation (`src/hostile_services.rs` includes it): method `i` answers `n * 1000 + i`.
    let mut imp = String::from(
        "#[allow(clippy::identity_op)]\nimpl crate::hostile::many::many_server::Many for HostileImpl {\n",
    );
    for i in 0..MANY {
        writeln!(many, "  rpc Method{i}(M) returns (M);")?;
        writeln!(
            imp,
            "fn method{i}(&self, _ctx: &RequestContext, request: many::M) -> Reply<many::M> {{ \
             many::M {{ n: request.n * 1000 + {i}u32 }}.into() }}"
        )?;
    }
    many.push_str("}\n");
    imp.push_str("}\n");
    std::fs::write(generated.join("many.proto"), many)?;
    std::fs::write(generated.join("many_impl.rs"), imp)?;

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto");
    rpc_codegen::configure()
        // The generated protos are rewritten on every run: watching them would rerun this script
        // on every build.
        .emit_rerun_if_changed(false)
        .compile_protos(
            &[
                PathBuf::from("proto/hostile.proto"),
                PathBuf::from("proto/hostile_b.proto"),
                generated.join("control_chars.proto"),
                generated.join("many.proto"),
            ],
            &[PathBuf::from("proto"), generated],
        )?;
    Ok(())
}
