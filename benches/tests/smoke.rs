//! A tiny loopback run of every test on `sim` with the yielding polling policy (tests share two
//! cores), checked through the JSON and SVG it writes; and the command's error paths.

use std::process::Command;

use clap::Parser;

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("rpc-perf-smoke-{}-{name}", std::process::id()))
}

fn run(extra: &[&str]) -> serde_json::Value {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let json = tmp(&format!("{}.json", RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let mut argv = vec![
        "rpc-perf",
        "--loopback",
        "--transport",
        "sim",
        "--poll",
        "yield",
        "--warmup",
        "10",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ];
    argv.extend_from_slice(extra);
    let args = rpc_perf::Args::try_parse_from(argv).unwrap();
    let report = rpc_perf::transport::run(&args).unwrap().expect("loopback returns a report");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(v["results"].as_array().unwrap().len(), report.results.len());
    v
}

#[test]
fn every_test_runs_on_sim_loopback() {
    let plot = tmp("plot.svg");
    let v = run(&[
        "-n",
        "200",
        "-s",
        "64",
        "--test",
        "rpc_lat,rpc_bw,send_lat,write_lat,write_bw",
        "-c",
        "4",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert_eq!(v["transport"], "sim");
    assert_eq!(v["device"], "sim0");
    assert_eq!(v["config"]["poll"], "yield");
    assert_eq!(v["config"]["loopback"], true);
    assert_eq!(v["config"]["warmup"], 10);
    let res = v["results"].as_array().unwrap();
    let names: Vec<&str> = res.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["rpc_lat", "rpc_bw", "send_lat", "write_lat", "write_bw"]);
    for r in res {
        assert_eq!(r["bytes"], 64, "{r}");
        let m = r.get("latency").or_else(|| r.get("bandwidth")).unwrap();
        assert_eq!(m["iterations"], 200, "{r}");
    }
    // -c 4 applies to both RPC tests; rpc_lat at -c 4 is latency under load.
    assert_eq!(res[0]["concurrency"], 4);
    assert_eq!(res[1]["concurrency"], 4);
    let lat = &res[2]["latency"];
    assert!(lat["min_ns"].as_f64().unwrap() > 0.0);
    assert!(lat["min_ns"].as_f64() <= lat["typical_ns"].as_f64());
    assert!(lat["typical_ns"].as_f64() <= lat["p99_ns"].as_f64());
    assert!(lat["p99_ns"].as_f64() <= lat["max_ns"].as_f64());
    let bw = &res[4]["bandwidth"];
    assert_eq!(bw["bytes_per_iter"], 64);
    assert!(bw["avg_mb_per_s"].as_f64().unwrap() > 0.0);
    // rpc_bw counts request and response payload.
    assert_eq!(res[1]["bandwidth"]["bytes_per_iter"], 128);
    // rpc_lat at -c 4 is no ping-pong: it gets no overhead ratio against send_lat (the
    // one-in-flight run of `bulk_sizes_use_the_ring_and_check_lengths` checks that one).
    assert_eq!(
        v["rpc_over_send_lat_p50"].as_array().map(Vec::len),
        Some(0),
        "{}",
        v["rpc_over_send_lat_p50"]
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    let _ = std::fs::remove_file(&plot);
    // A percentile panel per latency test, each with its size's line (plotters writes a
    // text's content on a line of its own).
    for t in ["rpc_lat", "send_lat", "write_lat"] {
        assert!(svg.contains(&format!("{t} round trip by percentile")), "no percentile panel for {t}");
    }
    assert_eq!(svg.lines().filter(|l| l.trim() == "64 B").count(), 3, "a 64 B line in each panel");
}

/// The fair baselines: send_bw (SEND message rate with -t outstanding) counts every message it
/// sent; write_lat with --copy-out runs every round trip and says so in the JSON (what the copy
/// costs is a figure for the benchmark, not a test's assertion).
#[test]
fn send_bw_and_write_lat_copy_out_run_on_sim_loopback() {
    let v = run(&["-n", "300", "-s", "64", "--test", "send_bw", "-t", "16", "-Q", "8"]);
    let r = &v["results"].as_array().unwrap()[0];
    assert_eq!(r["test"], "send_bw");
    assert_eq!(r["concurrency"], 16);
    assert_eq!(r["bandwidth"]["iterations"], 300, "{r}");
    assert!(r["bandwidth"]["avg_mb_per_s"].as_f64().unwrap() > 0.0, "{r}");
    let copied = run(&["-n", "300", "-s", "64K", "--test", "write_lat", "--copy-out"]);
    assert_eq!(copied["results"][0]["latency"]["iterations"], 300);
    assert_eq!(copied["config"]["copy_out"], true);
    assert_eq!(copied["config"]["handlers"], "inline");
}

/// The shareable handle's two tests, from four tokio tasks on a two-worker runtime through two
/// dispatchers (a session each): every call answered with its length checked (a task fails the
/// run otherwise), results named, sized and counted, and the channel's shape in the JSON.
#[test]
fn channel_tests_run_on_sim_loopback() {
    let v = run(&[
        "-n",
        "400",
        "-s",
        "64",
        "--test",
        "chan_lat,chan_bw",
        "--tasks",
        "4",
        "-c",
        "8",
        "--rt-threads",
        "2",
        "--dispatchers",
        "2",
    ]);
    let res = v["results"].as_array().unwrap();
    let names: Vec<&str> = res.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["chan_lat", "chan_bw"]);
    for r in res {
        assert_eq!(r["bytes"], 64, "{r}");
        assert_eq!(r["concurrency"], 8, "{r}");
    }
    let lat = &res[0]["latency"];
    assert_eq!(lat["iterations"], 400, "{lat}");
    assert!(lat["min_ns"].as_f64().unwrap() > 0.0 && lat["min_ns"].as_f64() <= lat["p99_ns"].as_f64());
    let bw = &res[1]["bandwidth"];
    assert_eq!(bw["iterations"], 400, "{bw}");
    assert_eq!(bw["bytes_per_iter"], 128, "request + response payload");
    assert!(bw["avg_mb_per_s"].as_f64().unwrap() > 0.0);
}

/// The three streaming tests, small and ring-sized messages: every message arrives (each test
/// checks its count and lengths and fails otherwise), results named and sized.
#[test]
fn streaming_tests_run_on_sim_loopback() {
    for size in ["32", "65536"] {
        let v = run(&["-n", "300", "-s", size, "--test", "stream_bw,stream_in_bw,stream_bidi_bw"]);
        let res = v["results"].as_array().unwrap();
        let names: Vec<&str> = res.iter().map(|r| r["test"].as_str().unwrap()).collect();
        assert_eq!(names, ["stream_bw", "stream_in_bw", "stream_bidi_bw"]);
        for r in res {
            assert_eq!(r["bytes"].to_string(), size, "{r}");
            assert_eq!(r["bandwidth"]["iterations"], 300, "{r}");
            assert!(r["bandwidth"]["avg_mb_per_s"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
}

#[test]
fn bulk_sizes_use_the_ring_and_check_lengths() {
    // 64 KiB requests go by RDMA WRITE into the ring (eager threshold 4 KiB); 16-byte answers
    // by SEND. write_lat polls the last byte of a 64 KiB buffer.
    let v = run(&[
        "-n",
        "20",
        "--req-size",
        "64K",
        "--resp-size",
        "16",
        "--test",
        "rpc_lat,write_lat,send_lat",
        "-s",
        "64K",
        "--use-srq",
        "-I",
        "0",
    ]);
    let res = v["results"].as_array().unwrap();
    assert_eq!(res[0]["req_bytes"], 65536);
    assert_eq!(res[0]["resp_bytes"], 16);
    assert_eq!(res[0]["latency"]["iterations"], 20);
    assert_eq!(res[1]["bytes"], 65536);
    assert_eq!(res[1]["latency"]["iterations"], 20);
    // send_lat through an SRQ, 64 KiB SENDs (not inline).
    assert_eq!(res[2]["bytes"], 65536);
    assert_eq!(res[2]["latency"]["iterations"], 20);
    // One call in flight: rpc_lat gets its overhead ratio against send_lat of the same size.
    assert_eq!(v["rpc_over_send_lat_p50"][0]["bytes"], 65536);
    assert!(v["rpc_over_send_lat_p50"][0]["ratio"].as_f64().unwrap() > 0.0);
}

#[test]
fn missing_device_is_a_clean_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_rpc-perf"))
        .args(["--loopback", "--transport", "rdma", "-d", "no_such_dev9", "--test", "send_lat", "-n", "10"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("rpc-perf: error:"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Either no libibverbs device matches, or this build has no ibverbs provider.
    assert!(err.contains("no_such_dev9") || err.contains("no RDMA") || err.contains("ibverbs"), "{err}");
}

#[test]
fn bad_flags_exit_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_rpc-perf")).args(["--test", "bogus"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("invalid value 'bogus' for '--test"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_rpc-perf")).args(["-t", "4", "-Q", "8"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--cq-mod 8 must not exceed --tx-depth 4"), "{err}");
}

/// Issue 30's second speed figure's flags: metadata entries, an interceptor on each end (the
/// server's refuses a call without the client's entry, so a run that completes carried it) and
/// metrics on both ends, through rpc_lat (blocking) and rpc_bw (async calls).
#[test]
fn metadata_interceptors_and_metrics_flags_run_rpc_lat_and_rpc_bw() {
    let v = run(&["-n", "200", "--test", "rpc_lat,rpc_bw", "--metadata", "3", "--interceptors", "--metrics"]);
    let res = v["results"].as_array().unwrap();
    assert_eq!(res.len(), 2);
    for r in res {
        let m = r.get("latency").or_else(|| r.get("bandwidth")).unwrap();
        assert_eq!(m["iterations"], 200, "{r}");
    }
}

/// `--servers 3`: the server side is three processes of the binary, one session to each from one
/// client endpoint; rpc_lat runs on the first session, rpc_bw spreads its calls over all three
/// (each session's count of calls is printed: a first call, then a third of the rest).
#[test]
fn servers_spawns_processes_and_spreads_rpc_bw_over_them() {
    let json = tmp("servers.json");
    let out = Command::new(env!("CARGO_BIN_EXE_rpc-perf"))
        .args(["--loopback", "--transport", "sim", "--poll", "yield", "--server-poll", "yield"])
        .args(["--servers", "3", "--test", "rpc_lat,rpc_bw", "-c", "6", "-n", "300", "--warmup", "30"])
        .args(["--no-progress", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let res = v["results"].as_array().unwrap();
    let names: Vec<&str> = res.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["rpc_lat", "rpc_bw"]);
    assert_eq!(res[0]["latency"]["iterations"], 300, "{}", res[0]);
    assert_eq!(res[1]["bandwidth"]["iterations"], 300, "{}", res[1]);
    assert!(text.contains("3 processes"), "{text}");
    assert!(text.contains("1 device context(s) opened"), "{text}");
    // rpc_lat: the first session made 1 + 30 + 300 calls, the others one each.
    assert!(text.contains("client sessions: 3, calls per session min 1 max 331;"), "{text}");
    // rpc_bw: 330 calls round robin over three sessions, after each one's first call.
    assert!(text.contains("client sessions: 3, calls per session min 111 max 111;"), "{text}");
}
