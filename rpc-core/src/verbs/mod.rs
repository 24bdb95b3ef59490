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
pub(crate) mod racy;
pub mod rc;
pub(crate) mod rules;
mod types;

#[cfg(feature = "ibverbs")]
pub mod ibverbs;
pub mod sim;

pub use error::{Result, VerbsError};
pub use types::*;

/// Checks that `[offset, offset + n)` lies in a region of `len` bytes, naming `call`.
fn check_range(call: &'static str, offset: usize, n: usize, len: usize) -> Result<()> {
    if offset.checked_add(n).is_some_and(|end| end <= len) {
        Ok(())
    } else {
        Err(VerbsError::InvalidArgument {
            call,
            reason: format!("range [{offset}, +{n}) outside the MR of {len} bytes"),
        })
    }
}

/// [`MemoryRegion::read_at`] for a region of `len` bytes at `base`.
///
/// # Safety
/// `base` must be valid for reads of `len` bytes (the MR's memory, alive).
#[inline]
unsafe fn mr_read_at(base: *const u8, len: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
    check_range("MemoryRegion::read_at", offset, dst.len(), len)?;
    // SAFETY: `[offset, offset + dst.len())` is inside the `len` valid bytes at `base` (checked
    // above); `dst` is a distinct, exclusively borrowed buffer (registered memory is never
    // handed out as a Rust reference by a safe function, so it cannot overlap). The region is
    // read with atomic loads only: a concurrent DMA or peer write (the software NIC's thread)
    // may make the copied bytes a mix, which the contract allows, and is no data race.
    unsafe { racy::load(base.add(offset), dst.as_mut_ptr(), dst.len()) };
    Ok(())
}

/// [`MemoryRegion::write_at`] for a region of `len` bytes at `base`.
///
/// # Safety
/// `base` must be valid for writes of `len` bytes (the MR's memory, alive).
#[inline]
unsafe fn mr_write_at(base: *mut u8, len: usize, offset: usize, src: &[u8]) -> Result<()> {
    check_range("MemoryRegion::write_at", offset, src.len(), len)?;
    // SAFETY: as in `mr_read_at`, the other way round: the region is written with atomic stores
    // only, so a transfer reading it meanwhile sees a mix and no data race.
    unsafe { racy::store(src.as_ptr(), base.add(offset), src.len()) };
    Ok(())
}

mod sealed {
    /// Only this crate's providers implement [`super::Provider`]: the buffers module's `unsafe`
    /// code relies on what they report (an MR's address and length, a CQ's completions).
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// A NIC provider: the set of verbs object types and how to find a device. Sealed: implemented
/// by [`sim::Sim`] and `ibverbs::Ibverbs` only.
pub trait Provider: Sealed + Sized + Send + Sync + 'static {
    /// Short name used in logs and on the command line: `"sim"` or `"ibverbs"`.
    const NAME: &'static str;
    /// An open device (`struct ibv_context`).
    type Context: Context<Self>;
    /// A protection domain (`struct ibv_pd`).
    type ProtectionDomain: ProtectionDomain<Self>;
    /// A registered memory region (`struct ibv_mr`) owning or borrowing its buffer.
    type MemoryRegion: MemoryRegion;
    /// A memory window (`struct ibv_mw`).
    type MemoryWindow: MemoryWindow;
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

    /// Allocates a memory window (`ibv_alloc_mw`), unbound. A type-2 window is bound to a QP of
    /// this PD by posting [`SendOp::BindMw`] on it, and invalidated by [`SendOp::LocalInv`] or a
    /// peer's [`SendOp::SendWithInv`]. Dropping it deallocates it (`ibv_dealloc_mw`); it holds
    /// the PD alive. Drop (or invalidate) the windows bound to an MR before the MR: a device
    /// refuses to deregister an MR with bound windows (the software NIC invalidates them).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a type the provider does not support (check
    /// [`DeviceAttr::mw_type2`]); [`VerbsError::CapExceeded`] over `max_mw`;
    /// [`VerbsError::Os`] naming `ibv_alloc_mw` otherwise.
    fn alloc_mw(&self, mw_type: MwType) -> Result<P::MemoryWindow>;

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
/// Registered memory is shared with the NIC and, with `REMOTE_WRITE`/`REMOTE_READ`, with peers,
/// outside the borrow checker's sight. So the safe surface is address, length, keys, and copies:
/// [`MemoryRegion::read_at`] copies bytes out and [`MemoryRegion::write_at`] copies bytes in,
/// and no reference into the region ever escapes them. Byte views ([`MemoryRegion::as_slice`],
/// [`MemoryRegion::as_mut_slice`]) are `unsafe`, because a peer's RDMA WRITE into the range a
/// `&[u8]` covers is a data race that no safe code could rule out:
///
/// ```compile_fail,E0133
/// use rpc_core::verbs::{sim::Sim, AccessFlags, Context, MemoryRegion, ProtectionDomain, Provider};
/// let ctx = Sim::open(&Default::default()).unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
/// let first = mr.as_slice()[0]; // error[E0133]: call to unsafe function
/// ```
///
/// ```compile_fail,E0133
/// use rpc_core::verbs::{sim::Sim, AccessFlags, Context, MemoryRegion, ProtectionDomain, Provider};
/// let ctx = Sim::open(&Default::default()).unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let mut mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
/// mr.as_mut_slice()[0] = 1; // error[E0133]: call to unsafe function
/// ```
///
/// The safe way, copying:
///
/// ```
/// use rpc_core::verbs::{sim::Sim, AccessFlags, Context, MemoryRegion, ProtectionDomain, Provider};
/// let ctx = Sim::open(&Default::default()).unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let mut mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
/// mr.write_at(100, b"hello").unwrap();
/// let mut out = [0u8; 5];
/// mr.read_at(100, &mut out).unwrap();
/// assert_eq!(&out, b"hello");
/// assert!(mr.read_at(4095, &mut out).is_err(), "out of bounds");
/// ```
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
    /// The MR as a work request names it ([`MwBind::mr`]).
    fn handle(&self) -> MrHandle;
    /// The first byte of the region, as a pointer in this process (`addr()` as a pointer). Safe to
    /// obtain; dereferencing it is the caller's `unsafe` business, under the contract of
    /// [`MemoryRegion::as_slice`]. Valid for `len()` bytes while the MR lives.
    fn as_ptr(&self) -> *mut u8;

    /// Copies `[offset, offset + dst.len())` of the region into `dst`.
    ///
    /// No reference to registered memory escapes: the bytes are copied through a raw pointer. If
    /// a transfer (a posted WR, or a peer granted `REMOTE_WRITE`) writes the range concurrently,
    /// the copied bytes may be any mix of old and new ones: treat them as untrusted until the
    /// protocol says the range is settled. Nothing worse happens to this process.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] when the range is not inside the region (nothing copied).
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()>;

    /// Copies `src` into `[offset, offset + src.len())` of the region.
    ///
    /// The caller must not write a range that a posted WR is still reading (or that a peer is
    /// reading with RDMA READ): the NIC would send a mix of old and new bytes. That is a protocol
    /// error, not undefined behaviour of this process.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] when the range is not inside the region (nothing copied).
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()>;

    /// The whole region as bytes.
    ///
    /// # Safety
    /// For as long as the returned slice lives, nothing may write the region but through it:
    /// no posted work request may write any of it (receives, RDMA READ targets), and no peer may
    /// write it (the MR, or a memory window on it, granted `REMOTE_WRITE`, and its rkey known to
    /// a peer that could still use it).
    unsafe fn as_slice(&self) -> &[u8];

    /// The whole region as mutable bytes.
    ///
    /// # Safety
    /// For as long as the returned slice lives, nothing may access the region but through it: no
    /// posted work request may read or write any of it (gathers of sends and WRITEs, receives,
    /// READ targets), and no peer may read or write it (`REMOTE_WRITE` or `REMOTE_READ` granted
    /// on the MR or on a window of it, with the rkey usable by a peer).
    unsafe fn as_mut_slice(&mut self) -> &mut [u8];
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

/// A memory window (`struct ibv_mw`): a range of an MR with its own rkey and rights, bound and
/// invalidated by work requests ([`SendOp::BindMw`], [`SendOp::LocalInv`],
/// [`SendOp::SendWithInv`]). Dropping it deallocates it (`ibv_dealloc_mw`).
///
/// Tear down in this order: windows (or their invalidation), then the QPs they were bound to,
/// then the MRs. Soft-RoCE (`rxe`, Linux 6.1) blocks in `ibv_destroy_qp` while a bound window
/// still references the QP, until its pool timeout (about 100 s seen); devices refuse to
/// deregister an MR with bound windows.
pub trait MemoryWindow: Send + Sync + 'static {
    /// The window's current rkey: the one from allocation, then the `rkey` of the last
    /// [`SendOp::BindMw`] for it (on `ibverbs` recorded when `post_send` accepts the bind, as
    /// the device reports nothing else; on `sim` when the bind executes, which is at once unless
    /// WRs are queued ahead of it). The upper 24 bits never change; [`inc_rkey`] gives the next.
    fn rkey(&self) -> u32;
    /// Its type.
    fn mw_type(&self) -> MwType;
    /// The window as a work request names it ([`SendOp::BindMw`]).
    fn handle(&self) -> MwHandle;
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

    /// A hint for a look that is usually empty: `false` only when [`CompletionQueue::poll`] would
    /// certainly return `Ok(0)` now; `true` when it may return completions or an error. The
    /// default (`true`) leaves the answer to `poll` (a device without a cheaper peek than
    /// `ibv_poll_cq`). Never blocks; allocates nothing.
    #[inline(always)]
    fn maybe_ready(&self) -> bool {
        true
    }

    /// Arms the CQ to signal its completion channel on the next completion
    /// (`ibv_req_notify_cq`); with `solicited_only`, only for solicited receives and errors.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] when the CQ was created without events.
    fn req_notify(&self, solicited_only: bool) -> Result<()>;

    /// Blocks until the armed CQ signals or `timeout` passes (`None`, or a timeout too large for
    /// the clock such as `Duration::MAX` = forever), then acknowledges
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
    /// destroyed). A WR whose completion may be polled through `buffers::Completions` must have a
    /// `wr_id` below 2^32 (`buffers::RESERVED_WR_IDS`): the ones above name the buffers module's
    /// own WRs, and its completions give their memory back.
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

    /// This QP's identity, different from that of every other QP alive in this process (the
    /// address of its provider object). QPs of two devices may have the same [`QueuePair::qp_num`];
    /// two handles name the same QP exactly when their identities are equal.
    fn identity(&self) -> usize;

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
    /// for an unsignaled WR, until a later signaled WR of this QP has completed. A
    /// [`SendOp::BindMw`] must name a live window and a live MR of this QP's PD (their handles),
    /// both alive until its completion, and no other bind of the same window may be posted
    /// concurrently from another thread. Binding a window with `REMOTE_WRITE` is granting the
    /// peer write access: the range falls under the contract of [`MemoryRegion::as_slice`]. A WR
    /// whose completion may be polled through `buffers::Completions` must have a `wr_id` below
    /// 2^32 (`buffers::RESERVED_WR_IDS`), as for [`SharedReceiveQueue::post_recv`].
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
