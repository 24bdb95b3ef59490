//! A default server idles small: its process stays under 16 MiB resident (it was 73 MB when the
//! SRQ's 16 256 receive buffers were registered up front). Alone in its test binary, so no other
//! test's memory is counted.

mod rpc_support;

fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

#[test]
fn a_default_server_idles_under_16_mib() {
    // The default configuration (but the tests' polling policy and transport).
    let (server, _) = rpc_support::spawn(rpc_support::server());
    let rss = vm_rss_kib();
    let c = server.counters();
    assert_eq!(c.recv_buffer_bytes, 0, "{c:?}");
    assert!(rss < 16 << 10, "an idle default server's process holds {rss} KiB resident");
    server.shutdown();
}
