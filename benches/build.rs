//! Compiles the benchmark service (proto/bench.proto) with rpc-codegen; its `bytes` payloads are
//! `bytes::Bytes` (rpc-codegen's default). A second pass generates its async server trait alone
//! (`rpc-perf --handlers async|tokio`), into `OUT_DIR/async/`, reusing the first pass's messages.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_codegen::compile_protos(&["../proto/bench.proto"], &["../proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("async");
    std::fs::create_dir_all(&out)?;
    rpc_codegen::configure()
        .out_dir(&out)
        .build_client(false)
        .async_server("rpcperf.Bench")
        .extern_path(".rpcperf", "crate::rpc::pb")
        .compile_protos(&["../proto/bench.proto"], &["../proto"])?;
    Ok(())
}
