//! rpc-perf on a real RDMA device (Soft-RoCE in CI's guest: `scripts/softroce-test` with
//! `SOFTROCE_TESTS=rdma`): every test in loopback through libibverbs. Functional only.
//!
//! Without a device the test prints why and passes; with `RPC_REQUIRE_RDMA=1` a missing device is
//! a failure. `RXE_DEV` and `RXE_GID_IDX` pick the device and GID index (default: the first
//! device, automatic GID).

#![cfg(feature = "ibverbs")]

use clap::Parser;
use rpc_core::verbs::ibverbs::Ibverbs;
use rpc_core::verbs::Provider;

#[test]
fn every_test_runs_on_rdma_loopback() {
    let required = std::env::var("RPC_REQUIRE_RDMA").is_ok_and(|v| v == "1");
    match Ibverbs::devices() {
        Ok(d) if !d.is_empty() => {}
        other => {
            assert!(!required, "RPC_REQUIRE_RDMA=1 but no RDMA device: {other:?}");
            eprintln!("skipped: no RDMA device here ({other:?}); run scripts/softroce-test with SOFTROCE_TESTS=rdma");
            return;
        }
    }
    let dev = std::env::var("RXE_DEV").unwrap_or_default();
    let gid = std::env::var("RXE_GID_IDX").unwrap_or_else(|_| "-1".into());
    let json = std::env::temp_dir().join(format!("rpc-perf-rdma-{}.json", std::process::id()));
    let mut argv = vec![
        "rpc-perf",
        "--loopback",
        "--transport",
        "rdma",
        "-x",
        &gid,
        "--poll",
        "yield",
        "-n",
        "200",
        "--warmup",
        "10",
        "-s",
        "64",
        "--test",
        "rpc_lat,rpc_bw,send_lat,write_lat,write_bw",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ];
    if !dev.is_empty() {
        argv.extend(["-d", dev.as_str()]);
    }
    let args = rpc_perf::Args::try_parse_from(argv).unwrap();
    let report = rpc_perf::transport::run(&args).unwrap().expect("loopback returns a report");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(report.transport, "ibverbs");
    let res = v["results"].as_array().unwrap();
    let names: Vec<&str> = res.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["rpc_lat", "rpc_bw", "send_lat", "write_lat", "write_bw"]);
    for r in res {
        let m = r.get("latency").or_else(|| r.get("bandwidth")).unwrap();
        assert_eq!(m["iterations"], 200, "{r}");
    }
}
