//! Compiles every proto under `proto/` that must build (all but `proto/codegen/errors/`), the way a
//! user's build script does.

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
        ],
        &["../proto"],
    )?;
    Ok(())
}
