//! Compiles the example services with rpc-codegen (protox inside: no system protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_codegen::configure()
        .bytes([".kv"])
        .compile_protos(&["../proto/helloworld.proto", "../proto/kv.proto"], &["../proto"])?;
    Ok(())
}
