//! Compiles the benchmark service (proto/bench.proto) with rpc-codegen.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_codegen::configure().bytes(["."]).compile_protos(&["../proto/bench.proto"], &["../proto"])?;
    Ok(())
}
