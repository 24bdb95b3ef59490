//! The NIC boundary, in verbs terms.
//!
//! One [`Provider`] trait with associated types, implemented twice:
//! - [`sim`]: the software NIC, always built. Same semantics as an RC NIC (keys, access flags,
//!   bounds, RNR, flush errors, in-order completion), several hosts in one process.
//! - `ibverbs` (cargo feature `ibverbs`, on by default): libibverbs through rdma-sys. All FFI
//!   `unsafe` of the project lives there.
//!
//! Everything above this layer is generic over `P: Provider` (static dispatch, no `dyn` per work
//! request). Objects are handles that keep their parents alive (a QP holds its PD and CQs, an MR
//! its PD, a PD its context), so dropping in any order is safe.
//!
//! Naming follows libibverbs (`man ibv_post_send`, `man ibv_modify_qp`, rdma-core's
//! `infiniband/verbs.h`).

use std::time::Duration;

mod error;
pub mod gid;
pub mod rc;
mod types;

#[cfg(feature = "ibverbs")]
pub mod ibverbs;
pub mod sim;

pub use error::{Result, VerbsError};
pub use types::*;

/// A NIC provider: the set of verbs object types and how to find a device.
pub trait Provider: Sized + Send + Sync + 'static {
    /// Short name used in logs and on the command line: `"sim"` or `"ibverbs"`.
    const NAME: &'static str;
    /// An open device (`struct ibv_context`).
    type Context: Context<Self>;
    /// A protection domain (`struct ibv_pd`).
    type ProtectionDomain: ProtectionDomain<Self>;
    /// A registered memory region (`struct ibv_mr`) owning or borrowing its buffer.
    type MemoryRegion: MemoryRegion;
    /// A completion queue (`struct ibv_cq`), optionally with a completion channel.
    type CompletionQueue: CompletionQueue;
    /// A shared receive queue (`struct ibv_srq`).
    type SharedReceiveQueue: SharedReceiveQueue;
    /// A reliable-connected queue pair (`struct ibv_qp`, `IBV_QPT_RC`).
    type QueuePair: QueuePair;

    /// Lists the provider's devices.
    ///
    /// # Errors
    /// [`VerbsError::NoKernelSupport`] when the kernel has no RDMA at all; [`VerbsError::Os`] when
    /// listing fails otherwise.
    fn devices() -> Result<Vec<DeviceInfo>>;

    /// Opens a device (`ibv_open_device`).
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`] (naming what exists and the `sim` transport) when nothing matches.
    fn open(selector: &DeviceSelector) -> Result<Self::Context>;
}

/// An open device. Cheap to clone (a shared handle).
pub trait Context<P: Provider>: Clone + Send + Sync + 'static {
    /// Kernel name of the device (`rxe0`, `mlx5_0`, `sim0`).
    fn device_name(&self) -> &str;

    /// Capabilities, queried once at open.
    fn attr(&self) -> &DeviceAttr;

    /// Attributes of a port (`ibv_query_port`); ports are numbered from 1.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a port the device does not have.
    fn query_port(&self, port_num: u8) -> Result<PortAttr>;

    /// The non-empty entries of a port's GID table with their types.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a port the device does not have.
    fn gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>>;

    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// [`VerbsError::Os`] when the device refuses.
    fn alloc_pd(&self) -> Result<P::ProtectionDomain>;

    /// Creates a CQ of at least `cqe` entries (`ibv_create_cq`). With `with_events`, the CQ gets a
    /// completion channel so that [`CompletionQueue::wait`] can block.
    ///
    /// # Errors
    /// [`VerbsError::CapExceeded`] when `cqe` exceeds `max_cqe`; [`VerbsError::Os`] otherwise.
    fn create_cq(&self, cqe: u32, with_events: bool) -> Result<P::CompletionQueue>;
}

/// Initial attributes of an RC QP (`struct ibv_qp_init_attr`).
pub struct QpInitAttr<'a, P: Provider> {
    /// CQ for send completions.
    pub send_cq: &'a P::CompletionQueue,
    /// CQ for receive completions.
    pub recv_cq: &'a P::CompletionQueue,
    /// Receive from this SRQ instead of a QP-private receive queue.
    pub srq: Option<&'a P::SharedReceiveQueue>,
    /// Queue capacities.
    pub cap: QpCap,
    /// Signal every send WR regardless of `SendFlags::SIGNALED`.
    pub sq_sig_all: bool,
}

/// A protection domain. Cheap to clone (a shared handle).
pub trait ProtectionDomain<P: Provider>: Clone + Send + Sync + 'static {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes owned by the MR and registers it.
    ///
    /// # Errors
    /// [`VerbsError::MemlockLimit`] when `ulimit -l` is too small, [`VerbsError::CapExceeded`] over
    /// `max_mr_size`, [`VerbsError::InvalidArgument`] for `len == 0`.
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<P::MemoryRegion>;

    /// Registers caller memory `[addr, addr + len)`.
    ///
    /// # Safety
    /// The memory must stay allocated, and must not be freed or moved, until the returned MR is
    /// dropped and every work request that used it has completed; peers may write it at any time
    /// when `REMOTE_WRITE` is granted.
    ///
    /// # Errors
    /// As [`ProtectionDomain::reg_mr`].
    unsafe fn reg_user_mr(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<P::MemoryRegion>;

    /// Creates a shared receive queue (`ibv_create_srq`).
    ///
    /// # Errors
    /// [`VerbsError::CapExceeded`] over `max_srq_wr` / `max_srq_sge`.
    fn create_srq(&self, attr: &SrqInitAttr) -> Result<P::SharedReceiveQueue>;

    /// Creates an RC QP in state RESET (`ibv_create_qp`).
    ///
    /// # Errors
    /// [`VerbsError::CapExceeded`] over `max_qp_wr` / `max_sge` / inline limits.
    fn create_qp(&self, attr: &QpInitAttr<'_, P>) -> Result<P::QueuePair>;
}

/// A registered memory region. Dropping it deregisters (`ibv_dereg_mr`) and frees an owned buffer.
///
/// The byte views below are how the owner reads and writes the memory. Which bytes a peer (or the
/// local NIC) may be writing at a given moment is a protocol matter: a range handed to a posted
/// work request, or granted to a peer with `REMOTE_WRITE`, must not be read or written through
/// these views until the protocol says the transfer has completed.
pub trait MemoryRegion: Send + Sync + 'static {
    /// Virtual address of the first byte (what an [`Sge`] or a peer's `remote_addr` uses).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for a zero-length region (never the case for a registered MR).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local key.
    fn lkey(&self) -> u32;
    /// Remote key (what a peer needs for RDMA WRITE/READ).
    fn rkey(&self) -> u32;
    /// Access flags it was registered with.
    fn access(&self) -> AccessFlags;
    /// The whole region as bytes.
    fn as_slice(&self) -> &[u8];
    /// The whole region as mutable bytes.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// An SGE for `[offset, offset + len)` of this region.
    ///
    /// # Panics
    /// When the range is outside the region (a programming error of the caller).
    fn sge(&self, offset: usize, len: u32) -> Sge {
        assert!(
            offset.checked_add(len as usize).is_some_and(|end| end <= self.len()),
            "SGE [{offset}, +{len}) outside MR of {} bytes",
            self.len()
        );
        Sge { addr: self.addr() + offset as u64, length: len, lkey: self.lkey() }
    }
}

/// A completion queue. Cheap to clone (a shared handle); normally polled by one thread.
pub trait CompletionQueue: Clone + Send + Sync + 'static {
    /// Capacity in CQEs (at least what was asked for).
    fn capacity(&self) -> u32;

    /// Moves up to `wc.len()` completions into `wc` (oldest first) and returns how many
    /// (`ibv_poll_cq`). Never blocks; allocates nothing.
    ///
    /// # Errors
    /// [`VerbsError::CqOverrun`] once the CQ has overflowed (completions were lost).
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize>;

    /// Arms the CQ to signal its completion channel on the next completion
    /// (`ibv_req_notify_cq`); with `solicited_only`, only for solicited receives and errors.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] when the CQ was created without events.
    fn req_notify(&self, solicited_only: bool) -> Result<()>;

    /// Blocks until the armed CQ signals or `timeout` passes (`None` = forever), then acknowledges
    /// the event (`ibv_get_cq_event` + `ibv_ack_cq_events`). Returns `true` when an event arrived.
    /// The usual loop is: `req_notify`, `poll` until empty, `wait`, repeat.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] when the CQ was created without events; [`VerbsError::Os`].
    fn wait(&self, timeout: Option<Duration>) -> Result<bool>;
}

/// A shared receive queue. Cheap to clone (a shared handle).
pub trait SharedReceiveQueue: Clone + Send + Sync + 'static {
    /// Depth in WQEs.
    fn max_wr(&self) -> u32;

    /// Posts receive WRs (`ibv_post_srq_recv`) with one doorbell.
    ///
    /// # Safety
    /// Every SGE must lie in a live MR with `LOCAL_WRITE`, and the memory must stay alive and must
    /// not be read or written by the caller until the WR's completion has been polled (or the SRQ
    /// destroyed).
    ///
    /// # Errors
    /// [`VerbsError::BadWorkRequest`] (queue full, too many SGEs); WRs before its `index` were posted.
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
}

/// An RC queue pair. Dropping it destroys the QP (`ibv_destroy_qp`); WRs outstanding then are
/// discarded without completions, as in verbs.
pub trait QueuePair: Send + Sync + 'static {
    /// QP number (24 bits).
    fn qp_num(&self) -> u32;

    /// Current state (`ibv_query_qp`), including a move to ERR made by the NIC.
    fn state(&self) -> QpState;

    /// Actual capacities after creation (may exceed what was asked).
    fn cap(&self) -> QpCap;

    /// Moves the QP to `attr.state`, setting the given attributes (`ibv_modify_qp`).
    ///
    /// # Errors
    /// [`VerbsError::QpTransition`] naming the target state and the attribute mask, for an illegal
    /// transition or a missing/invalid attribute.
    fn modify(&self, attr: &QpAttr) -> Result<()>;

    /// Posts send WRs (`ibv_post_send`) with one doorbell, in order.
    ///
    /// # Safety
    /// Except for `INLINE` WRs, every SGE must lie in a live MR of this QP's PD, and the memory must
    /// stay alive and untouched (for READ: unread) until the WR's completion has been polled —
    /// for an unsignaled WR, until a later signaled WR of this QP has completed.
    ///
    /// # Errors
    /// [`VerbsError::BadQpState`] before RTS (or in ERR on providers that refuse),
    /// [`VerbsError::BadWorkRequest`] for a full queue, too many SGEs or inline data over
    /// `max_inline_data`. WRs before the reported index were posted.
    unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;

    /// Posts receive WRs to the QP's own receive queue (`ibv_post_recv`).
    ///
    /// # Safety
    /// As [`SharedReceiveQueue::post_recv`].
    ///
    /// # Errors
    /// [`VerbsError::BadQpState`] in RESET; [`VerbsError::BadWorkRequest`] when the QP uses an SRQ
    /// or the queue is full.
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
}
