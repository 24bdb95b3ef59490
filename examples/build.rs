//! Compiles the example services with rpc-codegen (protox inside: no system protoc). The kv
//! service's `bytes` values are `bytes::Bytes` (rpc-codegen's default), so a value is a slice of
//! the received message, not a copy.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_codegen::compile_protos(
        &["../proto/helloworld.proto", "../proto/kv.proto", "../proto/route_guide.proto"],
        &["../proto"],
    )?;
    Ok(())
}
