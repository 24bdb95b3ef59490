//! The libibverbs provider (rdma-sys): real RDMA NICs, RoCE and InfiniBand, and Soft-RoCE (`rxe`).
//!
//! Built with the cargo feature `ibverbs` (on by default), which needs rdma-core's development
//! packages (`libibverbs-dev`, `librdmacm-dev`) and `libclang-dev` for rdma-sys' bindgen. Without
//! them, build with `--no-default-features`: the library then has the software NIC (`sim`) only.
//!
//! All FFI `unsafe` of the project lives in this module; every block says why it is sound.
//!
//! # Ownership
//! Each object holds its parent through an `Arc`: a QP holds its PD, its CQs and its SRQ; an MR,
//! a memory window and an SRQ hold their PD, a PD its context; a CQ holds its context and its completion channel. Drop
//! destroys the verbs object first, then releases the parents, so any drop order is safe. With a
//! thread domain, a QP also holds its parent domain, which holds its TD and the plain PD:
//! QP → parent domain → TD → PD.
//!
//! # Threads
//! libibverbs is thread-safe: every verb may be called from any thread, on any object, at the
//! same time (rdma-core `libibverbs/man/ibv_*` and providers lock internally where needed). That
//! is what the `Send`/`Sync` impls here rest on. The one exception is ours to keep: posts on QPs
//! of a thread domain, which the provider no longer locks, take our post lock (below). Each open context runs one background thread
//! that reads the device's asynchronous events (`ibv_get_async_event`): it marks a CQ as overrun
//! on `IBV_EVENT_CQ_ERR` and logs QP, SRQ, port and device errors with `tracing`.
//!
//! # Lock elision
//! Where the device offers thread domains (mlx5 does; Soft-RoCE does not), each PD gets a TD and
//! a parent domain, and its QPs are created on the parent domain, so the provider elides its QP
//! locks; posts then hold one cheap lock of ours per TD, because our QPs are sometimes posted by
//! more than one thread. Elsewhere, the plain path. [`IbvContext::lock_elision`] says which (and
//! each opened context logs it at `info`). Single-threaded CQs exist
//! ([`IbvContext::create_cq_single_threaded`], `unsafe`), unused by the runtime, whose CQs are
//! touched by more than one thread.
//!
//! # Devices and addresses
//! [`Ibverbs::open`](crate::verbs::Provider::open) takes a device by name (`mlx5_0`, `rxe0`) or
//! index; without RDMA in the kernel it fails with
//! [`NoKernelSupport`](crate::verbs::VerbsError::NoKernelSupport), without a matching device
//! with [`NoDevice`](crate::verbs::VerbsError::NoDevice) (both name the `sim` transport). The
//! local GID is chosen by [`select_gid`](crate::verbs::gid::select_gid) (index `-1` = automatic).
//!
//! # Testing
//! Tests that need a device skip with a printed reason without one, and fail instead when
//! `RPC_REQUIRE_RDMA=1`. `scripts/softroce-test` runs them, and the `ibverbs` instantiation of
//! the verbs conformance suite, against Soft-RoCE (`rdma_rxe`) in one qemu guest boot.
//!
//! # Hot path
//! `post_send`, `post_recv` and `poll` allocate nothing: work requests are chained in fixed-size
//! stack arrays ([`POST_CHUNK_WRS`] WRs per doorbell, longer slices are posted in chunks), and
//! completions are polled into a stack array of [`POLL_CHUNK_WCS`] `ibv_wc` and converted.

mod async_events;
mod context;
mod convert;
mod cq;
mod device;
mod errno;
mod mr;
mod mw;
mod pd;
mod post;
mod qp;
mod srq;
mod td;
mod vctx;

pub use context::IbvContext;
pub use cq::IbvCompletionQueue;
pub use mr::IbvMemoryRegion;
pub use mw::IbvMemoryWindow;
pub use pd::IbvProtectionDomain;
pub use post::{POLL_CHUNK_WCS, POST_CHUNK_SGES, POST_CHUNK_WRS};
pub use qp::IbvQueuePair;
pub use srq::IbvSharedReceiveQueue;
pub use td::LockElision;

use super::{DeviceInfo, DeviceSelector, Provider, Result};

/// The libibverbs provider. See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ibverbs;

impl crate::verbs::Sealed for Ibverbs {}

impl Provider for Ibverbs {
    const NAME: &'static str = "ibverbs";
    type Context = IbvContext;
    type ProtectionDomain = IbvProtectionDomain;
    type MemoryRegion = IbvMemoryRegion;
    type MemoryWindow = IbvMemoryWindow;
    type CompletionQueue = IbvCompletionQueue;
    type SharedReceiveQueue = IbvSharedReceiveQueue;
    type QueuePair = IbvQueuePair;

    fn devices() -> Result<Vec<DeviceInfo>> {
        device::DeviceList::get().map(|list| list.infos())
    }

    fn open(selector: &DeviceSelector) -> Result<IbvContext> {
        IbvContext::open(selector)
    }
}
