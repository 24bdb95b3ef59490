//! Memory regions and the per-host key table.
//!
//! A key (`lkey == rkey`, as on mlx5) is `generation << 16 | slot index` into a fixed array of
//! [`MR_SLOTS`] (65,536) slots per host (generation 1..=0x7fff, so bit 31 is clear), so a lookup
//! is one indexed load and a compare, with no lock and no hashing; a stale key (slot reused)
//! fails the generation compare. Registration and deregistration take the table's free-list lock
//! (control path only). Memory windows take slots of the same table, with keys of another shape
//! (bit 31 set; see [`super::mw`]): `max_mr` and `max_mw` are both [`MR_SLOTS`], together.
//!
//! **Key reuse distance.** Each slot counts the times it is taken (for an MR or a window) modulo
//! [`GEN_PERIOD`] (`0x7fff * 128`); an MR key's generation is that count modulo 0x7fff (plus 1),
//! a window's modulo 128. So a slot hands out an MR key again only after 32,767 more takes of
//! that slot, a window rkey (whose low 8 bits the consumer also changes at each bind) after 128.
//! And free slots are taken first in, first out (never-used slots first): a slot is taken again
//! only after every slot that was free when it was released has been taken. A key therefore
//! comes back after at least 32,767 (MR) or 128 (window) times the number of free slots
//! registrations, 4,194,304 registrations of windows with half the table free.
//!
//! Deregistration is safe against transfers in flight: every transfer of this process runs while
//! its requester holds its QP's send-queue guard and resolves keys inside that section, so after
//! invalidating the slot, deregistration takes and releases every QP's guard in the fabric
//! ([`super::fabric::quiesce`]); a transfer of a peer process is pinned in the host's reader
//! table, and deregistration waits out an epoch grace period for those
//! ([`super::epoch::synchronize`]). From then on no copy can still be using the old range or key.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::host::HostCore;
use super::shm::{seg_len, Segment, MR_TABLE_OFF};
use crate::verbs::{AccessFlags, MemoryRegion, MrHandle, Result};

/// Key slots per host, MRs and memory windows together (the sim's `max_mr`, and `max_mw`).
/// Indexes fit the 16 bits of an MR key's slot field and of a window rkey's (see
/// [`super::mw`]).
pub(crate) const MR_SLOTS: usize = 1 << 16;

/// The period of a slot's take counter: a multiple of both generation ranges (0x7fff MR
/// generations, 128 window generations), so that neither jumps when the counter wraps.
pub(crate) const GEN_PERIOD: u32 = 0x7fff * 128;

/// Alignment of MR buffers allocated by [`crate::verbs::ProtectionDomain::reg_mr`], in bytes.
pub(crate) const MR_ALIGN: usize = 4096;

#[repr(C, align(64))]
pub(crate) struct MrSlot {
    /// The valid key, or 0 when free (a window: its rkey while bound, 0 while free).
    pub(super) key: AtomicU32,
    pub(super) pd: AtomicU32,
    pub(super) access: AtomicU32,
    /// 1 for caller memory (`reg_user_mr`, or a window bound to such an MR): its address is
    /// valid in the owner's process only, so it lives in the owner's private [`UserSlot`] table,
    /// never here; peers in other processes cannot reach the region (nor such a window).
    pub(super) user: AtomicU32,
    /// Where the region's bytes are: an offset in the host segment (0 for caller memory).
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

/// Where a caller-memory region (`reg_user_mr`) is: process-private, so that a peer process
/// (which can write the shared key table) cannot turn it into a pointer this process follows.
pub(crate) struct UserSlot {
    /// The key the entry belongs to (0 = none).
    key: AtomicU32,
    /// The region's first byte in this process.
    ptr: AtomicU64,
    /// The region's virtual address as SGEs name it, and its length in bytes.
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
    /// A valid region of another process's host that lies past this process's mapping of the
    /// host's segment (the segment grew since it was mapped): map it again and retry.
    Beyond,
}

/// A view of a host's key table (in its segment), as its own process or a peer process sees it.
#[derive(Clone, Copy)]
pub(crate) struct MrView {
    slots: *const MrSlot,
    seg_base: *mut u8,
    seg_len: u64,
    /// The owner's private caller-memory table ([`MR_SLOTS`] entries), or null when seen from
    /// another process (caller-memory regions are out of reach there).
    user: *const UserSlot,
}

// SAFETY: a view of atomics in a mapping that its holder keeps alive.
unsafe impl Send for MrView {}
// SAFETY: as above.
unsafe impl Sync for MrView {}

impl MrView {
    /// The key table of the segment of another process's host, mapped at `seg`.
    pub(crate) fn of(seg: &Segment) -> MrView {
        MrView {
            slots: seg.at(MR_TABLE_OFF) as *const MrSlot,
            seg_base: seg.base(),
            seg_len: seg.len() as u64,
            user: std::ptr::null(),
        }
    }

    #[inline(always)]
    pub(super) fn slot(&self, idx: usize) -> Option<&MrSlot> {
        // SAFETY: the table holds `MR_SLOTS` slots inside the mapping (layout constant).
        (idx < MR_SLOTS).then(|| unsafe { &*self.slots.add(idx) })
    }

    /// Resolves `[addr, addr + len)` under `key` for protection domain `pd` needing `need`, to a
    /// pointer in this process. Zero-length ranges need a valid key too (as on hardware).
    #[inline(always)]
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
        // `SeqCst` (a plain load on x86): ordered after a peer's pin, see `super::epoch`.
        if key == 0
            || key & MW_KEY_BIT != 0
            || s.key.load(Ordering::SeqCst) != key
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
        if s.user.load(Ordering::Relaxed) != 0 {
            return self.locate_user(key, addr, len);
        }
        self.locate(s, addr - start, mr_len)
    }

    /// `[addr, addr + len)` of the caller-memory MR with key `mr_key`, as only the owner's
    /// private table says where its bytes are (and how many there are): a shared slot rewritten
    /// by a peer process cannot redirect it. Out of reach (`Key`) in a view of another process.
    #[inline]
    pub(super) fn locate_user(&self, mr_key: u32, addr: u64, len: u32) -> Result<*mut u8, KeyFault> {
        let idx = (mr_key & 0xffff) as usize;
        if self.user.is_null() || idx >= MR_SLOTS || mr_key == 0 {
            return Err(KeyFault::Key);
        }
        // SAFETY: a non-null `user` is the owner's table of `MR_SLOTS` entries, kept alive with
        // the view's host; `idx < MR_SLOTS` (checked).
        let u = unsafe { &*self.user.add(idx) };
        let (u_addr, u_len) = (u.addr.load(Ordering::Relaxed), u.len.load(Ordering::Relaxed));
        let inside = addr >= u_addr
            && addr
                .checked_add(len as u64)
                .is_some_and(|end| u_addr.checked_add(u_len).is_some_and(|e| end <= e));
        if u.key.load(Ordering::Acquire) != mr_key || !inside {
            return Err(KeyFault::Key);
        }
        Ok((u.ptr.load(Ordering::Relaxed) + (addr - u_addr)) as usize as *mut u8)
    }

    /// The pointer to byte `off` of a segment-memory region (or window) of `len` bytes described
    /// by slot `s`, checked against the mapping: `Beyond` when it lies past this process's
    /// mapping of another process's segment (remap and retry).
    #[inline(always)]
    pub(super) fn locate(&self, s: &MrSlot, off: u64, len: u64) -> Result<*mut u8, KeyFault> {
        let base = s.base.load(Ordering::Relaxed);
        if off > len {
            return Err(KeyFault::Key);
        }
        match base.checked_add(len) {
            Some(end) if end <= self.seg_len => {}
            Some(end) if end <= seg_len() as u64 => return Err(KeyFault::Beyond),
            _ => return Err(KeyFault::Key),
        }
        // SAFETY: `base + off <= base + len <= seg_len`: inside the mapping.
        Ok(unsafe { self.seg_base.add((base + off) as usize) })
    }

    /// The private entry of caller-memory MR `mr_key` (its address and length), `None` when
    /// there is none (not caller memory, deregistered, or a view of another process).
    pub(super) fn user_range(&self, mr_key: u32) -> Option<(u64, u64)> {
        let idx = (mr_key & 0xffff) as usize;
        if self.user.is_null() || idx >= MR_SLOTS || mr_key == 0 {
            return None;
        }
        // SAFETY: as in `locate_user`.
        let u = unsafe { &*self.user.add(idx) };
        let range = (u.addr.load(Ordering::Relaxed), u.len.load(Ordering::Relaxed));
        (u.key.load(Ordering::Acquire) == mr_key).then_some(range)
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
    /// Caller-memory regions by slot (process-private; `view.user` points here).
    user: Box<[UserSlot]>,
    /// Free slot indexes and, per slot, the take counter its next key's generation comes from.
    free: Mutex<FreeSlots>,
    /// Which windows are bound to which MR and QP (see [`super::mw`]).
    pub(super) binds: Mutex<super::mw::Binds>,
}

/// The free slots of a key table, first in, first out (process-private).
struct FreeSlots {
    /// Slots released, oldest first (capacity [`MR_SLOTS`]: never grows).
    released: VecDeque<u16>,
    /// Slots `fresh..MR_SLOTS` were never used (taken before any released one).
    fresh: usize,
    /// Per slot: how many times it was taken, modulo [`GEN_PERIOD`].
    takes: Box<[u32]>,
}

impl MrTable {
    /// The key table of an own segment (all slots free).
    pub(crate) fn new(seg: &Segment) -> MrTable {
        // Nothing here is written before use: zeroed allocations (pages untouched until used),
        // and a queue that only fills as slots are released.
        // SAFETY: `UserSlot` is atomics only, for which all-zero bytes are a valid value.
        let user = unsafe { super::sqslots::zeroed_slice::<UserSlot>(MR_SLOTS) };
        let view = MrView { user: user.as_ptr(), ..MrView::of(seg) };
        let free = FreeSlots {
            released: VecDeque::with_capacity(MR_SLOTS),
            fresh: 0,
            takes: vec![0; MR_SLOTS].into_boxed_slice(),
        };
        MrTable { view, user, free: Mutex::new(free), binds: Mutex::new(super::mw::Binds::new()) }
    }

    /// Fills a free slot and returns its key; `None` when all [`MR_SLOTS`] are in use. `base`
    /// is a segment offset, or for caller memory (`user`) a pointer, which goes to the private
    /// table only.
    fn insert(
        &self,
        pd: u32,
        access: AccessFlags,
        base: u64,
        user: bool,
        addr: u64,
        len: usize,
    ) -> Option<u32> {
        let (idx, takes) = self.take_slot()?;
        // Generations 1..=0x7fff: bit 31 stays clear (window keys have it set).
        let key = (takes % 0x7fff + 1) << 16 | idx as u32;
        let s = self.view.slot(idx as usize)?;
        let u = &self.user[idx as usize];
        u.key.store(0, Ordering::Relaxed);
        if user {
            u.ptr.store(base, Ordering::Relaxed);
            u.addr.store(addr, Ordering::Relaxed);
            u.len.store(len as u64, Ordering::Relaxed);
            u.key.store(key, Ordering::Release);
        }
        s.mw.store(0, Ordering::Relaxed);
        s.qpn.store(0, Ordering::Relaxed);
        s.mr_key.store(0, Ordering::Relaxed);
        s.pd.store(pd, Ordering::Relaxed);
        s.access.store(access.0, Ordering::Relaxed);
        s.user.store(user as u32, Ordering::Relaxed);
        s.base.store(if user { 0 } else { base }, Ordering::Relaxed);
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
        if let Some(u) = self.user.get((key & 0xffff) as usize) {
            u.key.store(0, Ordering::SeqCst);
        }
    }

    fn release(&self, key: u32) {
        self.release_slot((key & 0xffff) as u16);
    }

    /// Takes a free slot (a never-used one, else the one released longest ago): its index and
    /// how many times it was taken before (modulo [`GEN_PERIOD`]), which its key's generation
    /// comes from. `None` when all [`MR_SLOTS`] are in use. O(1).
    pub(super) fn take_slot(&self) -> Option<(u16, u32)> {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let idx = if f.fresh < MR_SLOTS {
            f.fresh += 1;
            (f.fresh - 1) as u16
        } else {
            f.released.pop_front()?
        };
        let takes = f.takes[idx as usize];
        f.takes[idx as usize] = (takes + 1) % GEN_PERIOD;
        Some((idx, takes))
    }

    /// Returns slot `idx` to the free list (the back of the queue).
    pub(super) fn release_slot(&self, idx: u16) {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        f.released.push_back(idx);
    }

    /// See [`MrView::resolve`].
    #[inline(always)]
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
        // QP's guard): look again, and wait out this process's transfers through what that finds.
        self.host.mrs.invalidate_windows_of_mr(self.key);
        super::fabric::quiesce();
        if self.host.mrs.invalidate_windows_of_mr(self.key) > 0 {
            super::fabric::quiesce();
        }
        // Transfers of peer processes (which reach the MR through its key or a window) are
        // pinned: an epoch grace period after the last invalidation (key and windows) waits
        // them out. Then no transfer can still be using the key, the windows or the memory.
        super::epoch::synchronize(&self.host.seg);
        self.host.mrs.release(self.key);
        if let Some((off, bytes)) = self.owned {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::{MrSlot, MR_TABLE_OFF};
    use crate::verbs::sim::Sim;
    use crate::verbs::Context;
    use crate::verbs::{AccessFlags, DeviceSelector, MemoryRegion, ProtectionDomain, Provider};

    #[test]
    fn a_corrupted_shared_slot_cannot_redirect_a_caller_memory_region() {
        let ctx = Sim::open(&DeviceSelector::First).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let mut mem = vec![0u8; 4096];
        let access = AccessFlags::LOCAL_WRITE;
        // SAFETY: `mem` outlives the MR (dropped first, below).
        let mr = unsafe { pd.reg_user_mr(mem.as_mut_ptr(), mem.len(), access) }.unwrap();
        let host = &ctx.host;
        let idx = (mr.lkey() & 0xffff) as usize;
        // SAFETY: slot `idx` of the key table in the host's segment (layout constants).
        let slot = unsafe { &*(host.seg.at(MR_TABLE_OFF + idx * 64) as *const MrSlot) };
        assert_eq!(slot.base.load(Ordering::Relaxed), 0, "no caller-memory pointer in shared memory");
        let pd_id = pd.inner.id;
        let at = |off: u64, len: u32| host.mrs.resolve(mr.lkey(), pd_id, mr.addr() + off, len, access);
        assert_eq!(at(100, 8).unwrap(), mem[100..].as_mut_ptr());
        // A peer process rewrites the shared slot: another base, a larger length.
        let mut elsewhere = vec![0u8; 1 << 20];
        slot.base.store(elsewhere.as_mut_ptr() as u64, Ordering::Relaxed);
        slot.len.store(1 << 20, Ordering::Relaxed);
        assert_eq!(
            at(100, 8).unwrap(),
            mem[100..].as_mut_ptr(),
            "the private table says where the bytes are"
        );
        assert!(at(4000, 200).is_err(), "and how many there are");
        drop(mr);
        drop(mem);
    }
}
