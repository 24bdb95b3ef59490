//! Shared by the tests that need a real RDMA device (`ibverbs_*.rs`): opening the device from the
//! environment, the skip-or-fail rule, and connecting RC QPs through the device's own GID.
//!
//! Environment (set by `scripts/softroce-test` inside its guest):
//! - `RXE_DEV`: device name or index (default: the first device);
//! - `RXE_GID_IDX`: GID index (default: automatic choice, `rpc_core::verbs::gid`);
//! - `RPC_REQUIRE_RDMA=1`: a missing device fails the test instead of skipping it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rpc_core::verbs::gid::{select_gid, LocalAddress};
use rpc_core::verbs::ibverbs::{IbvCompletionQueue, IbvContext, IbvQueuePair, Ibverbs};
use rpc_core::verbs::rc::{connect, RcConfig};
use rpc_core::verbs::{AccessFlags, CompletionQueue, DeviceSelector, Provider, QueuePair, WorkCompletion};

/// True when the environment demands a device (inside the Soft-RoCE guest).
pub fn rdma_required() -> bool {
    std::env::var("RPC_REQUIRE_RDMA").is_ok_and(|v| v == "1")
}

/// The device the environment selects.
pub fn selector() -> DeviceSelector {
    std::env::var("RXE_DEV").unwrap_or_default().parse().unwrap_or_default()
}

/// The GID index the environment selects (-1 = automatic).
pub fn gid_index() -> i32 {
    std::env::var("RXE_GID_IDX").ok().and_then(|s| s.parse().ok()).unwrap_or(-1)
}

/// Opens the selected device, or explains the skip and returns `None` — unless
/// `RPC_REQUIRE_RDMA=1`, where a missing device fails the test.
pub fn open_or_skip(test: &str) -> Option<IbvContext> {
    match Ibverbs::open(&selector()) {
        Ok(ctx) => Some(ctx),
        Err(e) if rdma_required() => panic!("RPC_REQUIRE_RDMA=1 but no usable RDMA device: {e}"),
        Err(e) => {
            eprintln!(
                "skipped {test}: {e}\n  this test needs an RDMA device; run it against Soft-RoCE with \
                 `scripts/softroce-test` (boots a qemu guest with rdma_rxe), or on a NIC with RPC_REQUIRE_RDMA=1"
            );
            None
        }
    }
}

/// The local address of port 1 (GID from the environment or chosen automatically).
pub fn local_address(ctx: &IbvContext) -> LocalAddress {
    select_gid::<Ibverbs>(ctx, 1, gid_index()).expect("select_gid")
}

/// Connects `a` and `b` (RC, RESET → RTS) through their ports' addresses, granting the peer
/// RDMA READ too (the smoke test reads back; `RcConfig`'s default grants WRITE only).
pub fn connect_pair(a: &IbvQueuePair, la: &LocalAddress, b: &IbvQueuePair, lb: &LocalAddress) {
    let ea = la.endpoint(a.qp_num(), 0x10 + a.qp_num());
    let eb = lb.endpoint(b.qp_num(), 0x20 + b.qp_num());
    let read = |cfg: RcConfig| RcConfig { access: cfg.access | AccessFlags::REMOTE_READ, ..cfg };
    connect(a, &read(la.rc_config()), &ea, &eb).expect("connect a");
    connect(b, &read(lb.rc_config()), &eb, &ea).expect("connect b");
}

/// Polls `cq` until `n` completions arrived (yielding between empty polls). Panics after 60 s —
/// a hang guard for the slow emulated guest, not a timing assertion.
pub fn poll_n(cq: &IbvCompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let got = cq.poll(&mut buf[..want]).expect("poll");
        out.extend_from_slice(&buf[..got]);
        if got == 0 {
            assert!(Instant::now() < deadline, "timed out: {} of {n} completions: {out:?}", out.len());
            std::thread::yield_now();
        }
    }
    out
}

/// Polls `cq` a few times and asserts that nothing more arrives.
pub fn assert_empty(cq: &IbvCompletionQueue) {
    let mut buf = [WorkCompletion::default(); 4];
    for _ in 0..100 {
        assert_eq!(cq.poll(&mut buf).expect("poll"), 0, "unexpected completion: {:?}", buf[0]);
        std::thread::yield_now();
    }
}
