//! The conformance suite's harness for the libibverbs provider (included by
//! `tests/verbs_conformance.rs` with `#[path]`).
//!
//! Opens the device twice (two contexts, connected through the device's own GID: loopback on
//! one port). Environment, as set by `scripts/softroce-test` inside its guest:
//! - `RXE_DEV`: device name or index (default: the first device);
//! - `RXE_GID_IDX`: GID index (default: automatic choice, `rpc_core::verbs::gid`);
//! - `RPC_REQUIRE_RDMA=1`: a missing device fails every test instead of skipping it.

use std::time::Duration;

use rpc_core::verbs::gid::select_gid;
use rpc_core::verbs::ibverbs::{IbvContext, Ibverbs};
use rpc_core::verbs::{DeviceSelector, Provider};

use crate::conformance::{Address, Harness};

/// The ibverbs harness. See the module documentation.
pub struct IbvHarness;

impl Harness for IbvHarness {
    type P = Ibverbs;

    /// The emulated guest is slow; this is a hang guard, not a timing assertion.
    const TIMEOUT: Duration = Duration::from_secs(60);

    fn open_pair() -> Result<(IbvContext, IbvContext), String> {
        let selector: DeviceSelector =
            std::env::var("RXE_DEV").unwrap_or_default().parse().unwrap_or_default();
        let open = || Ibverbs::open(&selector);
        match open().and_then(|a| open().map(|b| (a, b))) {
            Ok(pair) => Ok(pair),
            Err(e) if std::env::var("RPC_REQUIRE_RDMA").is_ok_and(|v| v == "1") => {
                panic!("RPC_REQUIRE_RDMA=1 but the RDMA device cannot be opened: {e}")
            }
            Err(e) => Err(format!(
                "{e}; run the suite against Soft-RoCE with `scripts/softroce-test`, or on a NIC with \
                 RPC_REQUIRE_RDMA=1 cargo test --test verbs_conformance ibverbs"
            )),
        }
    }

    fn address(ctx: &IbvContext) -> Address {
        let gid_index = std::env::var("RXE_GID_IDX").ok().and_then(|s| s.parse().ok()).unwrap_or(-1);
        let local = select_gid::<Ibverbs>(ctx, 1, gid_index).expect("select_gid(port 1)");
        Address { gid: local.gid, lid: local.lid, mtu: local.active_mtu, cfg: local.rc_config() }
    }
}
