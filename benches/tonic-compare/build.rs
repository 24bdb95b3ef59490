//! Compiles proto/helloworld.proto twice: for tonic (tonic-prost-build fed by protox, no system
//! protoc) and for our runtime (rpc-codegen); proto/bench.proto (the streaming case) for tonic
//! only (ours comes compiled with rpc-perf). `bytes` fields are `Bytes` on both sides.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = proto_dir.join("helloworld.proto");
    let bench = proto_dir.join("bench.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    println!("cargo:rerun-if-changed={}", bench.display());
    let out = PathBuf::from(std::env::var("OUT_DIR")?);

    let tonic_out = out.join("tonic");
    std::fs::create_dir_all(&tonic_out)?;
    let fds = protox::compile([&file, &bench], [&proto_dir])?;
    tonic_prost_build::configure().bytes(".").out_dir(&tonic_out).compile_fds(fds)?;

    let ours_out = out.join("ours");
    std::fs::create_dir_all(&ours_out)?;
    rpc_codegen::configure().out_dir(&ours_out).compile_protos(&[&file], &[&proto_dir])?;
    Ok(())
}
