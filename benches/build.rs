//! Compiles the benchmark service (proto/bench.proto) with rpc-codegen; its `bytes` payloads are
//! `bytes::Bytes` (rpc-codegen's default).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_codegen::compile_protos(&["../proto/bench.proto"], &["../proto"])?;
    Ok(())
}
