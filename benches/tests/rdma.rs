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

/// `rpc-perf call` and `rpc-perf bench` through libibverbs against an in-process server of the
/// benchmark service on the same device.
#[test]
fn call_and_bench_run_on_rdma() {
    use rpc_core::{PollingPolicy, Server, Transport};
    use rpc_perf::dynamic::args::Command as Sub;

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
    let server = Server::builder()
        .transport(Transport::Rdma { device: dev.clone(), port: 1, gid_index: gid.parse().unwrap() })
        .polling(PollingPolicy::SpinThenYield { spins: 64 })
        .add_service(
            rpc_perf::rpc::pb::bench_server::BenchServer::new(rpc_perf::rpc::BenchService::default()),
        )
        .spawn("127.0.0.1:0")
        .expect("bench server on rdma");
    let addr = server.local_addr().to_string();
    // The guest of scripts/softroce-test has the test binary only: the .proto travels inside it.
    let dir = std::env::temp_dir().join(format!("rpc-perf-rdma-proto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let proto_path = dir.join("bench.proto");
    std::fs::write(&proto_path, include_str!("../../proto/bench.proto")).unwrap();
    let proto = proto_path.to_str().unwrap();
    let nic = |argv: &mut Vec<String>| {
        argv.extend(["--transport", "rdma", "-x", &gid, "--poll", "yield"].map(String::from));
        if !dev.is_empty() {
            argv.extend(["-d".to_string(), dev.clone()]);
        }
    };
    let mut argv: Vec<String> =
        ["rpc-perf", "call", &addr, "rpcperf.Bench/Echo", "--proto", proto].map(String::from).to_vec();
    argv.extend(["--data".to_string(), r#"{"respSize":3}"#.to_string()]);
    nic(&mut argv);
    let Some(Sub::Call(c)) = rpc_perf::Args::try_parse_from(&argv).unwrap().command else { panic!("call") };
    assert_eq!(rpc_perf::dynamic::call::run(&c).unwrap(), "{\n  \"payload\": \"paWl\"\n}\n");
    let mut argv: Vec<String> = [
        "rpc-perf",
        "bench",
        &addr,
        "rpcperf.Bench/Echo",
        "--proto",
        proto,
        "-n",
        "300",
        "-c",
        "8",
        "--no-progress",
    ]
    .map(String::from)
    .to_vec();
    argv.extend(["--data".to_string(), r#"{"payload":"AAAA","respSize":64}"#.to_string()]);
    argv.extend(["--warmup".to_string(), "10".to_string()]);
    nic(&mut argv);
    let Some(Sub::Bench(b)) = rpc_perf::Args::try_parse_from(&argv).unwrap().command else { panic!("bench") };
    let rep = rpc_perf::dynamic::bench::run(&b).unwrap();
    assert_eq!(rep.transport, "rdma");
    assert_eq!(rep.calls, 300);
    assert_eq!(rep.status_counts.get("OK"), Some(&300));
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
