//! Memory regions and the per-host key table.
//!
//! A key (`lkey == rkey`, as on mlx5) is `generation << 16 | slot index` into a fixed array of
//! [`MR_SLOTS`] slots per host (generation 1..=0x7fff, so bit 31 is clear), so a lookup is one
//! indexed load and a compare, with no lock and no hashing; a stale key (slot reused) fails the
//! generation compare. Registration and deregistration take the table's free-list lock (control
//! path only). Memory windows take slots of the same table, with keys of another shape (bit 31
//! set; see [`super::mw`]).
//!
//! Deregistration is safe against transfers in flight by quiescence: every transfer runs while
//! its requester holds its QP's send-queue guard and resolves keys inside that section, so after
//! invalidating the slot, deregistration takes and releases every QP's guard in the fabric; from
//! then on no copy can still be using the old range (see [`super::fabric::quiesce`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::host::HostCore;
use super::shm::{Segment, MR_TABLE_OFF};
use crate::verbs::{AccessFlags, MemoryRegion, MrHandle, Result};

/// MR slots per host (the sim's `max_mr`).
pub(crate) const MR_SLOTS: usize = 4096;

/// Alignment of MR buffers allocated by [`crate::verbs::ProtectionDomain::reg_mr`], in bytes.
pub(crate) const MR_ALIGN: usize = 4096;

#[repr(C, align(64))]
pub(crate) struct MrSlot {
    /// The valid key, or 0 when free (a window: its rkey while bound, 0 while free).
    pub(super) key: AtomicU32,
    pub(super) pd: AtomicU32,
    pub(super) access: AtomicU32,
    /// 1 for caller memory (`reg_user_mr`): `base` is a pointer valid in the owner's process
    /// only, so peers in other processes cannot reach it.
    pub(super) user: AtomicU32,
    /// Where the region's bytes are: an offset in the host segment, or a pointer (`user`).
    pub(super) base: AtomicU64,
    /// The region's virtual address as peers and SGEs name it.
    pub(super) addr: AtomicU64,
    pub(super) len: AtomicU64,
    /// A memory window's current rkey (bound or not); 0 for an MR or a free slot.
    pub(super) mw: AtomicU32,
    /// A bound type-2 window: the QP number it is bound to (0 = none).
    pub(super) qpn: AtomicU32,
    /// A bound window: the key of the MR it exposes.
    pub(super) mr_key: AtomicU32,
    /// A window's sequence lock: odd while a bind or an invalidation rewrites the slot.
    pub(super) seq: AtomicU32,
}

/// Why a key lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyFault {
    /// No such key, another PD, or the range is outside the region.
    Key,
    /// The region lacks the access the operation needs.
    Access,
}

/// A view of a host's key table (in its segment), as its own process or a peer process sees it.
#[derive(Clone, Copy)]
pub(crate) struct MrView {
    slots: *const MrSlot,
    seg_base: *mut u8,
    seg_len: u64,
    /// Seen from another process (caller-memory regions are out of reach).
    remote: bool,
}

// SAFETY: a view of atomics in a mapping that its holder keeps alive.
unsafe impl Send for MrView {}
// SAFETY: as above.
unsafe impl Sync for MrView {}

impl MrView {
    /// The key table of the segment mapped at `seg`.
    pub(crate) fn of(seg: &Segment, remote: bool) -> MrView {
        MrView {
            slots: seg.at(MR_TABLE_OFF) as *const MrSlot,
            seg_base: seg.base(),
            seg_len: seg.len() as u64,
            remote,
        }
    }

    #[inline(always)]
    pub(super) fn slot(&self, idx: usize) -> Option<&MrSlot> {
        // SAFETY: the table holds `MR_SLOTS` slots inside the mapping (layout constant).
        (idx < MR_SLOTS).then(|| unsafe { &*self.slots.add(idx) })
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
        let Some(s) = self.slot((key & 0xffff) as usize) else {
            return Err(KeyFault::Key);
        };
        if key == 0
            || key & MW_KEY_BIT != 0
            || s.key.load(Ordering::Acquire) != key
            || s.pd.load(Ordering::Relaxed) != pd
        {
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
        self.locate(s, addr - start, mr_len)
    }

    /// The pointer to byte `off` of a region of `len` bytes described by slot `s` (segment
    /// offset or caller pointer), checked against the mapping.
    #[inline]
    pub(super) fn locate(&self, s: &MrSlot, off: u64, len: u64) -> Result<*mut u8, KeyFault> {
        let base = s.base.load(Ordering::Relaxed);
        let at = base + off;
        if s.user.load(Ordering::Relaxed) != 0 {
            if self.remote {
                return Err(KeyFault::Key);
            }
            return Ok(at as usize as *mut u8);
        }
        if base.checked_add(len).is_none_or(|end| end > self.seg_len) || off > len {
            return Err(KeyFault::Key);
        }
        // SAFETY: `at <= base + len <= seg_len`: inside the mapping.
        Ok(unsafe { self.seg_base.add(at as usize) })
    }

    /// Resolves a remote key as the responder QP `qpn` (of PD `pd`) sees it: an MR's rkey, or a
    /// memory window's, which must also be bound to `qpn` (see [`MrView::resolve`]).
    #[inline]
    pub(crate) fn resolve_rkey(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        addr: u64,
        len: u32,
        need: AccessFlags,
    ) -> Result<*mut u8, KeyFault> {
        if key & MW_KEY_BIT != 0 {
            self.resolve_mw(key, pd, qpn, addr, len, need)
        } else {
            self.resolve(key, pd, addr, len, need)
        }
    }
}

/// Bit 31 marks the key of a memory window (MR keys have it clear).
pub(crate) const MW_KEY_BIT: u32 = 1 << 31;

pub(crate) struct MrTable {
    pub(crate) view: MrView,
    /// Free slot indexes and, per slot, the generation the next key gets.
    free: Mutex<(Vec<u16>, Vec<u16>)>,
}

impl MrTable {
    /// The key table of an own segment (all slots free).
    pub(crate) fn new(seg: &Segment) -> MrTable {
        let free = (0..MR_SLOTS as u16).rev().collect();
        MrTable { view: MrView::of(seg, false), free: Mutex::new((free, vec![1; MR_SLOTS])) }
    }

    /// Fills a free slot and returns its key; `None` when all [`MR_SLOTS`] are in use. `base`
    /// is a segment offset, or a pointer for caller memory (`user`).
    fn insert(
        &self,
        pd: u32,
        access: AccessFlags,
        base: u64,
        user: bool,
        addr: u64,
        len: usize,
    ) -> Option<u32> {
        let (idx, gen) = self.take_slot()?;
        // Generations 1..=0x7fff: bit 31 stays clear (window keys have it set).
        let key = ((gen % 0x7fff) as u32 + 1) << 16 | idx as u32;
        let s = self.view.slot(idx as usize)?;
        s.mw.store(0, Ordering::Relaxed);
        s.qpn.store(0, Ordering::Relaxed);
        s.pd.store(pd, Ordering::Relaxed);
        s.access.store(access.0, Ordering::Relaxed);
        s.user.store(user as u32, Ordering::Relaxed);
        s.base.store(base, Ordering::Relaxed);
        s.addr.store(addr, Ordering::Relaxed);
        s.len.store(len as u64, Ordering::Relaxed);
        s.key.store(key, Ordering::Release);
        Some(key)
    }

    /// Invalidates `key` (new lookups fail at once). The caller must quiesce before reusing the
    /// memory, then call [`MrTable::release`].
    fn invalidate(&self, key: u32) {
        if let Some(s) = self.view.slot((key & 0xffff) as usize) {
            s.key.store(0, Ordering::SeqCst);
        }
    }

    fn release(&self, key: u32) {
        self.release_slot((key & 0xffff) as u16);
    }

    /// Takes a free slot: its index and a generation for its next key (`None` when all
    /// [`MR_SLOTS`] are in use).
    pub(super) fn take_slot(&self) -> Option<(u16, u16)> {
        let mut guard = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let (free, gens) = &mut *guard;
        let idx = free.pop()?;
        let gen = gens[idx as usize];
        gens[idx as usize] = gen.wrapping_add(1);
        Some((idx, gen))
    }

    /// Returns slot `idx` to the free list.
    pub(super) fn release_slot(&self, idx: u16) {
        let mut guard = self.free.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.push(idx);
    }

    /// See [`MrView::resolve`].
    #[inline]
    pub(crate) fn resolve(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u32,
        need: AccessFlags,
    ) -> Result<*mut u8, KeyFault> {
        self.view.resolve(key, pd, addr, len, need)
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
    /// The segment range of an owned buffer (offset, bytes); `None` for caller memory.
    owned: Option<(usize, usize)>,
}

// SAFETY: the MR is a handle to memory it owns (or that the caller promised stays valid until it
// is dropped); safe access copies through a raw pointer (`read_at`/`write_at`), and the byte
// views are `unsafe` with the contract stated on `MemoryRegion`.
unsafe impl Send for SimMr {}
// SAFETY: as above; `&SimMr` gives read-only views.
unsafe impl Sync for SimMr {}

impl SimMr {
    /// Registers `[ptr, ptr + len)`: the segment range `owned` (offset, bytes), which the MR
    /// frees on drop, or caller memory (`None`).
    pub(crate) fn register(
        host: Arc<HostCore>,
        pd: u32,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
        owned: Option<(usize, usize)>,
    ) -> Option<SimMr> {
        let (base, user) = match owned {
            Some((off, _)) => (off as u64, false),
            None => (ptr as u64, true),
        };
        let key = host.mrs.insert(pd, access, base, user, ptr as u64, len)?;
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
    fn handle(&self) -> MrHandle {
        MrHandle(self.key as u64)
    }
    #[inline]
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    #[inline]
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `self.ptr` is valid for `len` bytes while the MR lives (owned allocation, or
        // the caller's promise in `reg_user_mr`).
        unsafe { crate::verbs::mr_read_at(self.ptr, self.len, offset, dst) }
    }
    #[inline]
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: as in `read_at`.
        unsafe { crate::verbs::mr_write_at(self.ptr, self.len, offset, src) }
    }
    unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `self.ptr..+len` is valid for the MR's lifetime (owned allocation, or the
        // caller's promise in `reg_user_mr`); the caller guarantees that no WR and no peer
        // writes it while the slice lives (this method's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` excludes other views through this handle and
        // the caller guarantees that no WR and no peer accesses the region meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for SimMr {
    fn drop(&mut self) {
        self.host.mrs.invalidate(self.key);
        // Windows bound to this MR die with it (a device would refuse the deregistration). A
        // bind racing the invalidation has finished after the quiescence (it runs under its
        // QP's guard): look again, and wait out transfers through what that finds.
        self.host.mrs.invalidate_windows_of_mr(self.key);
        super::fabric::quiesce();
        if self.host.mrs.invalidate_windows_of_mr(self.key) > 0 {
            super::fabric::quiesce();
        }
        self.host.mrs.release(self.key);
        if let Some((off, bytes)) = self.owned {
            // After quiescence no transfer of this process can still be copying to or from it;
            // peers in other processes have the arena's quarantine.
            self.host.arena.free(&self.host.seg, off, bytes);
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
