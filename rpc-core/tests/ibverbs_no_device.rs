//! Opening the libibverbs provider where there is no RDMA gives a clear error, never a crash.
//!
//! Runs everywhere: on a machine without RDMA in its kernel (ENOSYS), with RDMA but no device,
//! and with a device (the Soft-RoCE guest of `scripts/softroce-test`, where a missing name and an
//! out-of-range index are asked for instead). Each branch asserts the message a user sees.
#![cfg(feature = "ibverbs")]

mod ibverbs_support;

use rpc_core::verbs::ibverbs::Ibverbs;
use rpc_core::verbs::{DeviceSelector, Provider, VerbsError};

fn assert_names_sim(msg: &str) {
    assert!(msg.contains("use the software NIC (transport `sim`)"), "message does not point at sim: {msg}");
}

#[test]
fn ibverbs_open_without_rdma_gives_a_clear_error() {
    match Ibverbs::devices() {
        Err(e) => {
            assert!(!ibverbs_support::rdma_required(), "RPC_REQUIRE_RDMA=1 but listing devices failed: {e}");
            assert!(matches!(e, VerbsError::NoKernelSupport), "{e:?}");
            let err = Ibverbs::open(&DeviceSelector::First).expect_err("open must fail without RDMA");
            let msg = err.to_string();
            assert!(matches!(err, VerbsError::NoKernelSupport), "{err:?}");
            assert!(msg.starts_with("no RDMA support in this kernel (ibv_get_device_list: ENOSYS)"), "{msg}");
            assert_names_sim(&msg);
            eprintln!("as expected on this machine: {msg}");
        }
        Ok(list) if list.is_empty() => {
            assert!(!ibverbs_support::rdma_required(), "RPC_REQUIRE_RDMA=1 but no RDMA device is listed");
            let err = Ibverbs::open(&DeviceSelector::First).expect_err("open must fail without a device");
            let msg = err.to_string();
            assert!(matches!(err, VerbsError::NoDevice { ref found, .. } if found.is_empty()), "{err:?}");
            assert!(msg.starts_with("no RDMA device at all; found: []"), "{msg}");
            assert_names_sim(&msg);
            eprintln!("as expected on this machine: {msg}");
        }
        Ok(list) => {
            // A device exists: ask for ones that do not.
            let names: Vec<String> = list.iter().map(|d| d.name.clone()).collect();
            assert_eq!(list.iter().map(|d| d.index).collect::<Vec<_>>(), (0..list.len()).collect::<Vec<_>>());
            let err =
                Ibverbs::open(&DeviceSelector::Name("no-such-rdma-dev".into())).expect_err("unknown name");
            let msg = err.to_string();
            assert!(msg.starts_with("no RDMA device named \"no-such-rdma-dev\"; found: ["), "{msg}");
            assert!(msg.contains(&names.join(", ")), "{msg} should list {names:?}");
            assert_names_sim(&msg);
            match Ibverbs::open(&DeviceSelector::Index(list.len())) {
                Err(VerbsError::NoDevice { wanted, found }) => {
                    assert_eq!(wanted, format!("at index {} (there are {})", list.len(), list.len()));
                    assert_eq!(found, names);
                }
                other => panic!("expected NoDevice for an index past the list, got {other:?}"),
            }
        }
    }
}
