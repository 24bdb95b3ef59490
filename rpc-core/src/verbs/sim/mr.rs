//! Memory regions and the per-host key table.
//!
//! A key (`lkey == rkey`, as on mlx5) is `generation << 16 | slot index` into a fixed array of
//! [`MR_SLOTS`] slots per host, so a lookup is one indexed load and a compare, with no lock and no
//! hashing; a stale key (slot reused) fails the generation compare. Registration and
//! deregistration take the table's free-list lock (control path only).
//!
//! Deregistration is safe against transfers in flight by quiescence: every transfer runs while
//! its requester holds its QP's send-queue guard and resolves keys inside that section, so after
//! invalidating the slot, deregistration takes and releases every QP's guard in the fabric; from
//! then on no copy can still be using the old range (see [`super::fabric::quiesce`]).

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::host::HostCore;
use crate::verbs::{AccessFlags, MemoryRegion};

/// MR slots per host (the sim's `max_mr`).
pub(crate) const MR_SLOTS: usize = 4096;

/// Alignment of MR buffers allocated by [`crate::verbs::ProtectionDomain::reg_mr`], in bytes.
pub(crate) const MR_ALIGN: usize = 4096;

#[repr(align(64))]
#[derive(Default)]
struct MrSlot {
    /// The valid key, or 0 when free.
    key: AtomicU32,
    pd: AtomicU32,
    access: AtomicU32,
    /// Where the region's bytes are in this process (today equal to `addr`).
    base: AtomicUsize,
    /// The region's virtual address as peers and SGEs name it.
    addr: AtomicU64,
    len: AtomicU64,
}

/// Why a key lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyFault {
    /// No such key, another PD, or the range is outside the region.
    Key,
    /// The region lacks the access the operation needs.
    Access,
}

pub(crate) struct MrTable {
    slots: Box<[MrSlot]>,
    /// Free slot indexes and, per slot, the generation the next key gets.
    free: Mutex<(Vec<u16>, Vec<u16>)>,
}

impl MrTable {
    pub(crate) fn new() -> MrTable {
        let slots = (0..MR_SLOTS).map(|_| MrSlot::default()).collect();
        let free = (0..MR_SLOTS as u16).rev().collect();
        MrTable { slots, free: Mutex::new((free, vec![1; MR_SLOTS])) }
    }

    /// Fills a free slot and returns its key; `None` when all [`MR_SLOTS`] are in use.
    fn insert(&self, pd: u32, access: AccessFlags, base: *mut u8, len: usize) -> Option<u32> {
        let mut guard = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let (free, gens) = &mut *guard;
        let idx = free.pop()?;
        let gen = gens[idx as usize];
        gens[idx as usize] = if gen == u16::MAX { 1 } else { gen + 1 };
        let key = (gen as u32) << 16 | idx as u32;
        let s = &self.slots[idx as usize];
        s.pd.store(pd, Ordering::Relaxed);
        s.access.store(access.0, Ordering::Relaxed);
        s.base.store(base as usize, Ordering::Relaxed);
        s.addr.store(base as u64, Ordering::Relaxed);
        s.len.store(len as u64, Ordering::Relaxed);
        s.key.store(key, Ordering::Release);
        Some(key)
    }

    /// Invalidates `key` (new lookups fail at once). The caller must quiesce before reusing the
    /// memory, then call [`MrTable::release`].
    fn invalidate(&self, key: u32) {
        self.slots[(key & 0xffff) as usize].key.store(0, Ordering::SeqCst);
    }

    fn release(&self, key: u32) {
        let mut guard = self.free.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.push((key & 0xffff) as u16);
    }

    /// Resolves `[addr, addr + len)` under `key` for protection domain `pd` needing `need`, to a
    /// pointer in this process. Zero-length ranges need a valid key too (as on hardware).
    #[inline]
    pub(crate) fn resolve(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u32,
        need: AccessFlags,
    ) -> Result<*mut u8, KeyFault> {
        let Some(s) = self.slots.get((key & 0xffff) as usize) else {
            return Err(KeyFault::Key);
        };
        if key == 0 || s.key.load(Ordering::Acquire) != key || s.pd.load(Ordering::Relaxed) != pd {
            return Err(KeyFault::Key);
        }
        let start = s.addr.load(Ordering::Relaxed);
        let mr_len = s.len.load(Ordering::Relaxed);
        let ok = addr >= start && addr.checked_add(len as u64).is_some_and(|end| end <= start + mr_len);
        if !ok {
            return Err(KeyFault::Key);
        }
        if !AccessFlags(s.access.load(Ordering::Relaxed)).contains(need) {
            return Err(KeyFault::Access);
        }
        Ok((s.base.load(Ordering::Relaxed) + (addr - start) as usize) as *mut u8)
    }
}

/// A registered memory region of the software NIC. Dropping it deregisters the key (after every
/// transfer that may use it has finished) and frees an owned buffer.
pub struct SimMr {
    host: Arc<HostCore>,
    key: u32,
    ptr: *mut u8,
    len: usize,
    access: AccessFlags,
    /// The layout of an owned buffer; `None` for caller memory.
    owned: Option<Layout>,
}

// SAFETY: the MR is a handle to memory it owns (or that the caller promised stays valid until it
// is dropped); `as_slice`/`as_mut_slice` follow normal borrow rules on the handle, and what peers
// do concurrently is the protocol contract stated on `MemoryRegion`.
unsafe impl Send for SimMr {}
// SAFETY: as above; `&SimMr` gives read-only views.
unsafe impl Sync for SimMr {}

impl SimMr {
    /// Registers `[ptr, ptr + len)`; `owned` tells whether the MR frees it on drop.
    pub(crate) fn register(
        host: Arc<HostCore>,
        pd: u32,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
        owned: Option<Layout>,
    ) -> Option<SimMr> {
        let key = host.mrs.insert(pd, access, ptr, len)?;
        Some(SimMr { host, key, ptr, len, access, owned })
    }
}

impl MemoryRegion for SimMr {
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is valid for the MR's lifetime (owned allocation, or the
        // caller's promise in `reg_user_mr`); concurrent NIC writes are excluded by the protocol
        // contract documented on `MemoryRegion`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` excludes other views through this handle.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for SimMr {
    fn drop(&mut self) {
        self.host.mrs.invalidate(self.key);
        super::fabric::quiesce();
        self.host.mrs.release(self.key);
        if let Some(layout) = self.owned {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` in `reg_mr`, and after quiescence no
            // transfer can still be copying to or from it.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

impl std::fmt::Debug for SimMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMr")
            .field("addr", &format_args!("{:#x}", self.ptr as u64))
            .field("len", &self.len)
            .field("key", &format_args!("{:#x}", self.key))
            .field("access", &self.access)
            .finish()
    }
}
