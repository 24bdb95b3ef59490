//! Memory windows (type 2): allocation, bind, invalidation, and their keys in the host's key
//! table, where a requester in this process or another one checks them.
//!
//! A window takes a slot of the MR key table ([`super::mr`]). Its rkey is
//! `1 << 31 | generation << 24 | slot << 8 | key`: bit 31 tells it from an MR key, the slot index
//! (16 bits, [`MR_SLOTS`]) and a 7-bit generation name the window (they never change while it
//! lives; [`MwHandle`] is `rkey >> 8`), and the low 8 bits are the consumer's key, chosen at each
//! bind. The generation is the slot's take count modulo 128, and free slots are reused first in,
//! first out: see the reuse distance in [`super::mr`]. The slot holds the window's current rkey (`mw`), and while it is bound (IBA state
//! "valid") the same rkey in `key`, with the range (`base`/`addr`/`len`, inside the MR it was
//! bound to, `mr_key`), the rights (`access`) and the QP (`qpn`); `key` is 0 while it is free.
//!
//! What the software NIC checks, as IBA 10.6.7 and Soft-RoCE (`rxe_mw.c`) do:
//! - **Bind** (a WR on a QP; `IBV_WC_MW_BIND_ERR` and the QP to ERR when a check fails): the
//!   window exists and is free (o10-37.2.30), is of the QP's PD (C10-72), the new rkey keeps the
//!   window's upper 24 bits, the length is not 0 (o10-37.2.40); the MR exists in the QP's PD,
//!   was registered with `MW_BIND` (C10-73), grants local write when the window grants remote
//!   write or atomics (C10-74), and holds the range (C10-75).
//! - **Access** (RDMA WRITE/READ at a responder QP): the rkey is the window's current one and the
//!   window is bound, to *this* QP (type 2), of its PD, the range lies inside the window and the
//!   rights include the access; otherwise `IBV_WC_REM_ACCESS_ERR` at the requester and nothing is
//!   copied (and the responder QP goes to ERR, as for a bad MR rkey).
//! - **Invalidate** (`LOCAL_INV` on a QP of the window's PD, or a `SEND_WITH_INV` received on the
//!   QP the window is bound to): the rkey must be the window's current one; the window is free
//!   from then on, so the rkey is dead. Invalidating a window that is already free succeeds (as on
//!   rxe). A bad rkey: `IBV_WC_LOC_QP_OP_ERR` for `LOCAL_INV`; for `SEND_WITH_INV`, a responder
//!   error (the receive completes with `IBV_WC_REM_INV_REQ_ERR`, both QPs go to ERR).
//! - **QPs**: a window stays bound to its QP when the QP goes to ERR (the QP accepts no request
//!   then; after RESET and a new connection, it is usable again), as rxe keeps its QP reference.
//!   A destroyed QP's windows stay bound to nothing: valid but unreachable until invalidated or
//!   deallocated (rxe keeps the dead QP referenced; here the QP number is cleared so that a later
//!   QP reusing the number does not inherit them).
//! - **Finding them**: the owner process keeps, per MR slot and per QP directory entry, a list of
//!   the windows it bound there ([`Binds`], private, under a lock taken by binds, deallocations,
//!   deregistrations and QP destructions, never by a transfer), so that deregistering an MR or
//!   destroying a QP visits its windows only, not the [`MR_SLOTS`] slots. An entry may outlive
//!   its binding (a peer's `SEND_WITH_INV` unbinds the slot, not the list): each is checked again
//!   under the slot's lock.
//! - **MRs**: deregistering an MR invalidates the windows bound to it (a device refuses the
//!   deregistration instead), before the MR's grace periods (quiescence for this process, an
//!   epoch grace period for peer processes, see [`super::epoch`]), so no transfer through such a
//!   window is still copying when the memory is freed.
//! - **Caller memory** (an MR from `reg_user_mr`): the window's shared slot holds no pointer
//!   (base 0, `user` set, as the MR's own slot); the owner's lookups go through the MR's entry
//!   in the process-private table (`mr_key`, range checked against it), and a requester in
//!   another process (no such table) gets a remote access error, as for the MR's own rkey.
//! - **Mappings**: a window over segment memory past a peer process's mapping of the segment
//!   reports `Beyond`, so the peer maps the segment again and retries (as for an MR rkey).
//!
//! Updates of a window's slot (bind, invalidation, teardown) hold its sequence lock (`seq` odd),
//! and a requester's lookup reads the slot between two loads of `seq`: a lookup racing an update
//! fails rather than mixing the old range with the new one.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::exec::Outcome;
use super::host::HostCore;
use super::mr::{KeyFault, MrSlot, MrTable, MrView, MR_SLOTS, MW_KEY_BIT};
use super::qp::QpCore;
use super::shm::QP_DIR_LEN;
use crate::verbs::{AccessFlags, MemoryWindow, MwBind, MwHandle, MwType, SendOp, WcStatus};

/// The slot index in a window rkey.
#[inline(always)]
fn mw_slot(rkey: u32) -> usize {
    ((rkey >> 8) & 0xffff) as usize
}

/// The rkey a new window in slot `idx` gets: its generation from the slot's take count.
fn mw_first_rkey(idx: u16, takes: u32) -> u32 {
    MW_KEY_BIT | (takes & 0x7f) << 24 | (idx as u32) << 8
}

/// Doubly linked lists of window slots, one per head, in process-private arrays (`0` is none,
/// other values are a slot index plus 1). Each window is in at most one list.
struct Lists {
    heads: Box<[u32]>,
    next: Box<[u32]>,
    prev: Box<[u32]>,
    /// The head (plus 1) of the list each window is in.
    head_of: Box<[u32]>,
}

impl Lists {
    /// `heads` empty lists over [`MR_SLOTS`] windows (zeroed: pages untouched until used).
    fn new(heads: usize) -> Lists {
        let zeros = |n: usize| vec![0u32; n].into_boxed_slice();
        Lists { heads: zeros(heads), next: zeros(MR_SLOTS), prev: zeros(MR_SLOTS), head_of: zeros(MR_SLOTS) }
    }

    /// Puts window `w` in list `h` (out of the one it was in). O(1).
    fn link(&mut self, w: usize, h: usize) {
        self.unlink(w);
        let first = self.heads[h];
        if first != 0 {
            self.prev[first as usize - 1] = w as u32 + 1;
        }
        (self.next[w], self.prev[w], self.head_of[w]) = (first, 0, h as u32 + 1);
        self.heads[h] = w as u32 + 1;
    }

    /// Takes window `w` out of its list, if any. O(1).
    fn unlink(&mut self, w: usize) {
        let h = self.head_of[w];
        if h == 0 {
            return;
        }
        let (p, n) = (self.prev[w], self.next[w]);
        if p == 0 {
            self.heads[h as usize - 1] = n;
        } else {
            self.next[p as usize - 1] = n;
        }
        if n != 0 {
            self.prev[n as usize - 1] = p;
        }
        (self.next[w], self.prev[w], self.head_of[w]) = (0, 0, 0);
    }

    /// Takes the first window out of list `h`.
    fn pop(&mut self, h: usize) -> Option<usize> {
        let w = (self.heads[h] as usize).checked_sub(1)?;
        self.unlink(w);
        Some(w)
    }
}

/// The windows this process bound, by the MR slot they expose and by the QP directory entry of
/// the QP they are bound to (see the module docs).
pub(crate) struct Binds {
    by_mr: Lists,
    by_qp: Lists,
}

impl Binds {
    pub(crate) fn new() -> Binds {
        Binds { by_mr: Lists::new(MR_SLOTS), by_qp: Lists::new(QP_DIR_LEN) }
    }

    fn forget(&mut self, w: usize) {
        self.by_mr.unlink(w);
        self.by_qp.unlink(w);
    }
}

/// How long (ns) a window slot's lock may stay taken before a waiter takes it over (1 s).
const SEQ_TAKEOVER_NS: u64 = 1_000_000_000;

/// Holds a window slot's sequence lock while it lives (the slot is being rewritten).
struct SeqGuard<'a>(&'a MrSlot);

impl<'a> SeqGuard<'a> {
    /// Takes the lock. Holders keep it for a few stores; a holder in a peer process that was
    /// killed inside that section would keep it forever, so after [`SEQ_TAKEOVER_NS`] of
    /// waiting (yielding) the lock is taken over, with a warning.
    fn lock(s: &'a MrSlot) -> SeqGuard<'a> {
        let mut spins = 0u32;
        let mut since = None;
        loop {
            let v = s.seq.load(Ordering::Relaxed);
            if v & 1 == 0
                && s.seq
                    // `SeqCst`: an invalidation before an epoch grace period is in the `SeqCst`
                    // order before it, so a peer pinned after the owner's scan sees it (see
                    // `super::epoch` and `MrView::resolve_mw`).
                    .compare_exchange_weak(v, v.wrapping_add(1), Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                // Writes to the slot below must not become visible before the odd sequence.
                fence(Ordering::Release);
                return SeqGuard(s);
            }
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
                continue;
            }
            let start = *since.get_or_insert_with(super::shm::monotonic_ns);
            if super::shm::monotonic_ns().saturating_sub(start) > SEQ_TAKEOVER_NS {
                tracing::warn!(
                    "sim: a memory window's slot stayed locked for 1 s (holder died?); taking it over"
                );
                fence(Ordering::Acquire);
                return SeqGuard(s); // still odd: the release makes it even
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for SeqGuard<'_> {
    fn drop(&mut self) {
        self.0.seq.fetch_add(1, Ordering::Release);
    }
}

impl MrView {
    /// Resolves `[addr, addr + len)` under window rkey `key` for responder QP `qpn` of PD `pd`
    /// needing `need` (see the module docs).
    #[inline]
    pub(super) fn resolve_mw(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        addr: u64,
        len: u32,
        need: AccessFlags,
    ) -> Result<*mut u8, KeyFault> {
        let Some(s) = self.slot(mw_slot(key)) else {
            return Err(KeyFault::Key);
        };
        // `SeqCst` (a plain load on x86): ordered after a peer's pin, as the MR key lookup is
        // (see `super::epoch`): an invalidation that a grace period waited for is seen.
        let seq = s.seq.load(Ordering::SeqCst);
        if seq & 1 != 0 || s.key.load(Ordering::Relaxed) != key {
            return Err(KeyFault::Key);
        }
        if s.pd.load(Ordering::Relaxed) != pd || s.qpn.load(Ordering::Relaxed) != qpn || qpn == 0 {
            return Err(KeyFault::Key);
        }
        let start = s.addr.load(Ordering::Relaxed);
        let win_len = s.len.load(Ordering::Relaxed);
        let inside = addr >= start
            && addr
                .checked_add(len as u64)
                .is_some_and(|end| start.checked_add(win_len).is_some_and(|w| end <= w));
        if !inside {
            return Err(KeyFault::Key);
        }
        let access = AccessFlags(s.access.load(Ordering::Relaxed));
        // Caller memory: only the owner's private table of the MR says where the bytes are (out
        // of reach from another process, as for the MR itself); segment memory: checked against
        // this mapping (`Beyond`: remap and retry).
        let p = if s.user.load(Ordering::Relaxed) != 0 {
            self.locate_user(s.mr_key.load(Ordering::Relaxed), addr, len)
        } else {
            self.locate(s, addr - start, win_len)
        };
        // The slot was read whole: no update ran meanwhile.
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) != seq {
            return Err(KeyFault::Key);
        }
        if !access.contains(need) {
            return Err(KeyFault::Access);
        }
        p
    }

    /// Invalidates window rkey `key` as a SEND_WITH_INV received on QP `qpn` of PD `pd` does:
    /// `false` when `key` is not the current rkey of a window of that PD bound to that QP.
    pub(crate) fn remote_invalidate(&self, key: u32, pd: u32, qpn: u32) -> bool {
        if key & MW_KEY_BIT == 0 {
            return false;
        }
        let Some(s) = self.slot(mw_slot(key)) else {
            return false;
        };
        let _g = SeqGuard::lock(s);
        if s.mw.load(Ordering::Relaxed) != key
            || s.key.load(Ordering::Relaxed) != key
            || s.pd.load(Ordering::Relaxed) != pd
            || s.qpn.load(Ordering::Relaxed) != qpn
        {
            return false;
        }
        unbind(s);
        true
    }
}

/// Makes a window slot free (its rkey dead). Sequence lock held.
fn unbind(s: &MrSlot) {
    s.key.store(0, Ordering::Relaxed);
    s.qpn.store(0, Ordering::Relaxed);
    s.mr_key.store(0, Ordering::Relaxed);
    s.access.store(0, Ordering::Relaxed);
    s.len.store(0, Ordering::Relaxed);
}

impl MrTable {
    /// A new free window of PD `pd`; its rkey, or `None` when the table is full.
    fn alloc_mw(&self, pd: u32) -> Option<u32> {
        let (idx, takes) = self.take_slot()?;
        let rkey = mw_first_rkey(idx, takes);
        let s = self.view.slot(idx as usize)?;
        let _g = SeqGuard::lock(s);
        unbind(s);
        s.pd.store(pd, Ordering::Relaxed);
        s.user.store(0, Ordering::Relaxed);
        s.base.store(0, Ordering::Relaxed);
        s.addr.store(0, Ordering::Relaxed);
        s.mw.store(rkey, Ordering::Release);
        Some(rkey)
    }

    /// Deallocates the window named by `rkey`'s upper bits.
    fn dealloc_mw(&self, rkey: u32) {
        if let Some(s) = self.view.slot(mw_slot(rkey)) {
            {
                let _g = SeqGuard::lock(s);
                unbind(s);
                s.mw.store(0, Ordering::Relaxed);
            }
            self.binds().forget(mw_slot(rkey));
            self.release_slot(mw_slot(rkey) as u16);
        }
    }

    /// The window's current rkey (0 once deallocated).
    fn mw_rkey(&self, handle: MwHandle) -> u32 {
        let h = handle.0 as u32;
        self.view.slot(mw_slot(h << 8)).map_or(0, |s| {
            let k = s.mw.load(Ordering::Acquire);
            if k >> 8 == h {
                k
            } else {
                0
            }
        })
    }

    fn binds(&self) -> std::sync::MutexGuard<'_, Binds> {
        self.binds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Invalidates every window bound to the MR with key `mr_key` (the MR is deregistered);
    /// returns how many were bound. Visits the windows this process bound to the MR's slot
    /// (its list, emptied), not the table.
    pub(crate) fn invalidate_windows_of_mr(&self, mr_key: u32) -> usize {
        let pick = |s: &MrSlot| {
            s.mw.load(Ordering::Relaxed) != 0
                && s.mr_key.load(Ordering::Relaxed) == mr_key
                && s.key.load(Ordering::Relaxed) != 0
        };
        let mut binds = self.binds();
        let mut n = 0;
        while let Some(w) = binds.by_mr.pop((mr_key & 0xffff) as usize) {
            let Some(s) = self.view.slot(w) else { continue };
            if pick(s) {
                let _g = SeqGuard::lock(s);
                if pick(s) {
                    unbind(s);
                    n += 1;
                }
            }
        }
        n
    }

    /// Unbinds every window bound to QP `qpn` of this host from it (the QP is destroyed): they
    /// stay valid but no QP answers for them. Visits the windows bound to the QP (its list,
    /// emptied), not the table.
    pub(crate) fn detach_windows_of_qp(&self, qpn: u32) {
        let pick = |s: &MrSlot| s.mw.load(Ordering::Relaxed) != 0 && s.qpn.load(Ordering::Relaxed) == qpn;
        let mut binds = self.binds();
        while let Some(w) = binds.by_qp.pop(qpn as usize % QP_DIR_LEN) {
            let Some(s) = self.view.slot(w) else { continue };
            if pick(s) {
                let _g = SeqGuard::lock(s);
                if pick(s) {
                    s.qpn.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

impl QpCore {
    /// Executes a memory-window WR (bind or local invalidate); `None` for any other operation.
    /// These are local: no packet, no PSN. The test is inlined into the executor; the work is
    /// out of line.
    #[inline(always)]
    pub(crate) fn exec_mw(&self, op: &SendOp) -> Option<Outcome> {
        match op {
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => Some(self.exec_mw_op(op)),
            _ => None,
        }
    }

    /// [`QpCore::exec_mw`] of a BIND_MW or LOCAL_INV.
    #[inline(never)]
    fn exec_mw_op(&self, op: &SendOp) -> Outcome {
        match *op {
            SendOp::BindMw { mw, rkey, bind } => match self.bind_mw(mw, rkey, &bind) {
                Ok(()) => Outcome::Done(0),
                Err(why) => {
                    tracing::debug!(qp = self.qpn, rkey, why, "sim: bind of a memory window failed");
                    Outcome::Fail(WcStatus::IBV_WC_MW_BIND_ERR)
                }
            },
            SendOp::LocalInv { rkey } => {
                if self.local_invalidate(rkey) {
                    Outcome::Done(0)
                } else {
                    tracing::debug!(qp = self.qpn, rkey, "sim: LOCAL_INV of an rkey that names no window");
                    Outcome::Fail(WcStatus::IBV_WC_LOC_QP_OP_ERR)
                }
            }
            // Not a memory-window operation (`exec_mw` sends none here).
            _ => Outcome::Fail(WcStatus::IBV_WC_LOC_QP_OP_ERR),
        }
    }

    /// Binds window `mw` (see the module docs), then lists it under its MR and this QP: after
    /// the slot's lock is released (a deregistration holds the lists' lock while it takes slot
    /// locks), still under this QP's send-queue guard, which a deregistration waits for before
    /// it looks again.
    fn bind_mw(&self, mw: MwHandle, rkey: u32, b: &MwBind) -> Result<(), &'static str> {
        self.bind_mw_slot(mw, rkey, b)?;
        let mut binds = self.host.mrs.binds();
        binds.by_mr.link(mw_slot(rkey), (b.mr.0 as u32 & 0xffff) as usize);
        binds.by_qp.link(mw_slot(rkey), self.qpn as usize % QP_DIR_LEN);
        Ok(())
    }

    /// [`QpCore::bind_mw`]'s checks and the slot's update, under the slot's lock.
    fn bind_mw_slot(&self, mw: MwHandle, rkey: u32, b: &MwBind) -> Result<(), &'static str> {
        let table = &self.host.mrs.view;
        let h = mw.0 as u32;
        if rkey >> 8 != h || rkey & MW_KEY_BIT == 0 {
            return Err("the new rkey does not keep the window's upper 24 bits");
        }
        let s = table.slot(mw_slot(rkey)).ok_or("no such window")?;
        let mr_key = b.mr.0 as u32;
        if mr_key & MW_KEY_BIT != 0 {
            return Err("not an MR handle");
        }
        let m = table.slot((mr_key & 0xffff) as usize).ok_or("no such MR")?;
        let _g = SeqGuard::lock(s);
        if s.mw.load(Ordering::Relaxed) >> 8 != h {
            return Err("no such window (deallocated)");
        }
        if s.key.load(Ordering::Relaxed) != 0 {
            return Err("the window is bound: invalidate it first (o10-37.2.30)");
        }
        if s.pd.load(Ordering::Relaxed) != self.pd {
            return Err("the window is of another PD than the QP (C10-72)");
        }
        if b.length == 0 {
            return Err("zero length (o10-37.2.40)");
        }
        // The MR: read under its key, which deregistration clears first (and then waits for
        // this QP's guard, which we hold).
        if mr_key == 0 || m.key.load(Ordering::Acquire) != mr_key || m.pd.load(Ordering::Relaxed) != self.pd {
            return Err("no such MR in the QP's PD");
        }
        let mr_access = AccessFlags(m.access.load(Ordering::Relaxed));
        if !mr_access.contains(AccessFlags::MW_BIND) {
            return Err("the MR was not registered with MW_BIND (C10-73)");
        }
        // REMOTE_WRITE / REMOTE_ATOMIC on an MR imply LOCAL_WRITE (the ibverbs provider adds it).
        let local_write = mr_access.0
            & (AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0)
            != 0;
        let writable = b.access.0 & (AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0) != 0;
        if writable && !local_write {
            return Err("a writable window needs LOCAL_WRITE on the MR (C10-74)");
        }
        let (mr_addr, mr_len) = (m.addr.load(Ordering::Relaxed), m.len.load(Ordering::Relaxed));
        let inside = b.addr >= mr_addr
            && b.addr.checked_add(b.length).is_some_and(|end| end <= mr_addr.saturating_add(mr_len));
        if !inside {
            return Err("the range is not inside the MR (C10-75)");
        }
        let user = m.user.load(Ordering::Relaxed) != 0;
        if user {
            // Caller memory: the shared slot holds no pointer (base 0); accesses go through the
            // MR's private entry, which must hold the range too.
            let Some((u_addr, u_len)) = table.user_range(mr_key) else {
                return Err("no such MR in the QP's PD");
            };
            let inside =
                b.addr >= u_addr && b.addr.checked_add(b.length).is_some_and(|end| end <= u_addr + u_len);
            if !inside {
                return Err("the range is not inside the MR (C10-75)");
            }
        }
        let base = if user { 0 } else { m.base.load(Ordering::Relaxed).wrapping_add(b.addr - mr_addr) };
        let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        s.base.store(base, Ordering::Relaxed);
        s.user.store(user as u32, Ordering::Relaxed);
        s.addr.store(b.addr, Ordering::Relaxed);
        s.len.store(b.length, Ordering::Relaxed);
        s.access.store(b.access.0 & rights.0, Ordering::Relaxed);
        s.mr_key.store(mr_key, Ordering::Relaxed);
        s.qpn.store(self.qpn, Ordering::Relaxed);
        s.mw.store(rkey, Ordering::Relaxed);
        s.key.store(rkey, Ordering::Relaxed);
        Ok(())
    }

    /// LOCAL_INV: `false` when `rkey` is not the current rkey of a window of this QP's PD.
    fn local_invalidate(&self, rkey: u32) -> bool {
        if rkey & MW_KEY_BIT == 0 {
            return false;
        }
        let Some(s) = self.host.mrs.view.slot(mw_slot(rkey)) else {
            return false;
        };
        let _g = SeqGuard::lock(s);
        if s.mw.load(Ordering::Relaxed) != rkey || s.pd.load(Ordering::Relaxed) != self.pd {
            return false;
        }
        unbind(s);
        true
    }
}

/// A memory window of the software NIC (type 2). Dropping it deallocates it.
pub struct SimMw {
    host: Arc<HostCore>,
    /// The PD it belongs to (kept alive).
    _pd: super::host::SimPd,
    /// The rkey from allocation (its upper 24 bits name the window).
    first: u32,
}

impl SimMw {
    pub(crate) fn alloc(pd: &super::host::SimPd, mw_type: MwType) -> crate::verbs::Result<SimMw> {
        if mw_type != MwType::Type2 {
            return Err(crate::verbs::VerbsError::InvalidArgument {
                call: "ibv_alloc_mw",
                reason: format!("{mw_type:?}: the software NIC has type-2 memory windows only"),
            });
        }
        let host = pd.inner.host.clone();
        if !host.attr.mw_type2 {
            return Err(crate::verbs::VerbsError::CapExceeded {
                what: "ibv_alloc_mw",
                cap: "max_mw (this software NIC has no memory windows: sim::set_memory_windows)",
                requested: 1,
                limit: 0,
            });
        }
        let first = host.mrs.alloc_mw(pd.inner.id).ok_or(crate::verbs::VerbsError::CapExceeded {
            what: "ibv_alloc_mw",
            cap: "max_mw (shared with max_mr)",
            requested: MR_SLOTS as u64 + 1,
            limit: MR_SLOTS as u64,
        })?;
        Ok(SimMw { host, _pd: pd.clone(), first })
    }
}

impl MemoryWindow for SimMw {
    fn rkey(&self) -> u32 {
        self.host.mrs.mw_rkey(self.handle())
    }
    fn mw_type(&self) -> MwType {
        MwType::Type2
    }
    fn handle(&self) -> MwHandle {
        MwHandle((self.first >> 8) as u64)
    }
}

impl Drop for SimMw {
    fn drop(&mut self) {
        self.host.mrs.dealloc_mw(self.first);
    }
}

impl std::fmt::Debug for SimMw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMw").field("rkey", &format_args!("{:#x}", self.rkey())).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::mw_slot;
    use crate::verbs::sim::epoch::Reader;
    use crate::verbs::sim::mr::{KeyFault, MrView};
    use crate::verbs::sim::Sim;
    use crate::verbs::{
        inc_rkey, AccessFlags, Context, DeviceSelector, MemoryRegion, MemoryWindow, MwBind, MwType,
        ProtectionDomain, Provider, QpCap, QpInitAttr, QueuePair,
    };

    /// A window over caller memory: the shared slot holds no pointer (base 0), the owner's view
    /// reaches the caller's bytes through the MR's private entry, a view of another process
    /// (no private table) is refused, and a shared slot rewritten by a peer (base, range) does
    /// not move what the owner follows past the MR.
    #[test]
    fn a_window_over_caller_memory_keeps_its_pointer_private() {
        let ctx = Sim::open(&DeviceSelector::First).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, false).unwrap();
        let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, ..QpCap::default() };
        let qp = pd
            .create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })
            .unwrap();
        let mut mem = vec![0u8; 8192];
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        // SAFETY: `mem` outlives the MR (dropped first, below).
        let mr = unsafe { pd.reg_user_mr(mem.as_mut_ptr(), mem.len(), access) }.unwrap();
        let mw = pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        let win = mr.addr() + 1024;
        let bind = MwBind { mr: mr.handle(), addr: win, length: 512, access: AccessFlags::REMOTE_WRITE };
        qp.core().bind_mw(mw.handle(), rkey, &bind).unwrap();
        let host = &ctx.host;
        let (pd_id, qpn, w) = (pd.inner.id, qp.qp_num(), AccessFlags::REMOTE_WRITE);
        let s = host.mrs.view.slot(mw_slot(rkey)).unwrap();
        assert_eq!(s.base.load(Ordering::Relaxed), 0, "no caller-memory pointer in shared memory");
        let own = host.mrs.view;
        assert_eq!(own.resolve_rkey(rkey, pd_id, qpn, win + 8, 8, w).unwrap(), mem[1032..].as_mut_ptr());
        let peer = MrView::of(&host.seg);
        assert_eq!(peer.resolve_rkey(rkey, pd_id, qpn, win + 8, 8, w), Err(KeyFault::Key), "another process");
        // A peer process rewrites the window's shared slot: a planted base and a range past the MR.
        let mut elsewhere = vec![0u8; 1 << 20];
        s.base.store(elsewhere.as_mut_ptr() as u64, Ordering::Relaxed);
        s.len.store(1 << 20, Ordering::Relaxed);
        assert_eq!(own.resolve_rkey(rkey, pd_id, qpn, win + 8, 8, w).unwrap(), mem[1032..].as_mut_ptr());
        assert!(own.resolve_rkey(rkey, pd_id, qpn, win + 8000, 8, w).is_err(), "not past the caller's MR");
        drop(mw);
        drop(mr);
        drop(mem);
    }

    /// Deregistering an MR kills its windows and then waits out an epoch grace period: a peer
    /// process pinned inside a transfer (which may have resolved the window) holds the drop up,
    /// and lookups through the window fail from the start of the drop on.
    #[test]
    fn deregistration_waits_for_a_peer_pinned_on_a_window_of_the_mr() {
        let ctx = Sim::open(&DeviceSelector::First).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, false).unwrap();
        let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, ..QpCap::default() };
        let qp = pd
            .create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })
            .unwrap();
        let mr = pd.reg_mr(8192, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).unwrap();
        let mw = pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey());
        let win = mr.addr() + 4096;
        let bind = MwBind { mr: mr.handle(), addr: win, length: 4096, access: AccessFlags::REMOTE_WRITE };
        qp.core().bind_mw(mw.handle(), rkey, &bind).unwrap();
        let host = ctx.host.clone();
        let (pd_id, qpn, w) = (pd.inner.id, qp.qp_num(), AccessFlags::REMOTE_WRITE);
        // The key table as a peer process maps it, and that peer's reader slot.
        let peer = MrView::of(&host.seg);
        let reader = Reader::claim(&host.seg).expect("a reader slot");
        let pin = reader.pin();
        assert!(
            peer.resolve_rkey(rkey, pd_id, qpn, win, 64, w).is_ok(),
            "resolved inside the pinned transfer"
        );
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let done = done.clone();
            std::thread::spawn(move || {
                drop(mr);
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "the deregistration waits for the pinned peer");
        assert!(peer.resolve_rkey(rkey, pd_id, qpn, win, 64, w).is_err(), "the window is already dead");
        drop(pin);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert_eq!(mw.rkey(), rkey, "the window itself lives on, unbound");
        drop(reader);
    }
}
