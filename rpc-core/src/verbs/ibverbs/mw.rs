//! Memory windows (`struct ibv_mw`): allocation and deallocation. Binding and invalidation are
//! work requests ([`SendOp::BindMw`](crate::verbs::SendOp::BindMw), `LocalInv`, `SendWithInv`),
//! posted in [`super::post`].

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_sys::{ibv_alloc_mw, ibv_dealloc_mw, ibv_mw, ibv_mw_type};

use super::errno::{last_os, rc_error};
use super::pd::IbvProtectionDomain;
use crate::verbs::{MemoryWindow, MwHandle, MwType, Result};

/// A memory window. Holds its PD alive; dropping it deallocates it (`ibv_dealloc_mw`).
pub struct IbvMemoryWindow {
    mw: NonNull<ibv_mw>,
    mw_type: MwType,
    _pd: IbvProtectionDomain,
}

// SAFETY: libibverbs MW verbs are thread-safe; the one field Rust writes after creation
// (`ibv_mw::rkey`, see `rkey_cell`) is accessed atomically by this crate, and by libibverbs only
// inside `ibv_post_send` of a bind of this window, which `post_send`'s contract serializes.
unsafe impl Send for IbvMemoryWindow {}
// SAFETY: see `Send`.
unsafe impl Sync for IbvMemoryWindow {}

/// The `rkey` field of a live `ibv_mw`, as an atomic.
///
/// # Safety
/// `mw` must point to a live `ibv_mw`.
pub(super) unsafe fn rkey_cell<'a>(mw: *mut ibv_mw) -> &'a AtomicU32 {
    // SAFETY: the field is a properly aligned `u32` of a live object (caller); every Rust access
    // to it goes through this atomic view.
    unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*mw).rkey)) }
}

impl IbvMemoryWindow {
    pub(super) fn alloc(pd: &IbvProtectionDomain, mw_type: MwType) -> Result<IbvMemoryWindow> {
        let t = match mw_type {
            MwType::Type1 => ibv_mw_type::IBV_MW_TYPE_1,
            MwType::Type2 => ibv_mw_type::IBV_MW_TYPE_2,
        };
        // SAFETY: a live PD; the inline wrapper calls the provider's `alloc_mw` (or sets errno to
        // EOPNOTSUPP when the provider has none).
        let mw = unsafe { ibv_alloc_mw(pd.raw(), t) };
        let Some(mw) = mw.and_then(NonNull::new) else {
            return Err(last_os("ibv_alloc_mw"));
        };
        Ok(IbvMemoryWindow { mw, mw_type, _pd: pd.clone() })
    }
}

impl MemoryWindow for IbvMemoryWindow {
    fn rkey(&self) -> u32 {
        // SAFETY: our live window.
        unsafe { rkey_cell(self.mw.as_ptr()) }.load(Ordering::Acquire)
    }

    fn mw_type(&self) -> MwType {
        self.mw_type
    }

    fn handle(&self) -> MwHandle {
        MwHandle(self.mw.as_ptr() as u64)
    }
}

impl Drop for IbvMemoryWindow {
    fn drop(&mut self) {
        // SAFETY: allocated by us, deallocated exactly once; the PD outlives it (held).
        let rc = unsafe { ibv_dealloc_mw(self.mw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %rc_error(rc), "ibv_dealloc_mw failed");
        }
    }
}

impl std::fmt::Debug for IbvMemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMemoryWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("type", &self.mw_type)
            .finish()
    }
}
