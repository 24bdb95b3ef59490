//! Memory regions (`struct ibv_mr`): provider-allocated page-aligned buffers and caller memory,
//! with the locked-memory diagnostics a new user needs.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rdma_sys::{ibv_dereg_mr, ibv_mr, ibv_reg_mr};

use super::errno::rc_error;
use super::pd::IbvProtectionDomain;
use crate::verbs::{AccessFlags, MemoryRegion, MrHandle, Result, VerbsError};

/// Bytes this process has registered through this provider (what counts against
/// RLIMIT_MEMLOCK, next to whatever else the process locks).
static REGISTERED_BYTES: AtomicU64 = AtomicU64::new(0);

/// A registered memory region. Owns its buffer when created by
/// [`reg_mr`](crate::verbs::ProtectionDomain::reg_mr) (zeroed, page-aligned, unmapped on drop);
/// borrows it when created by [`reg_user_mr`](crate::verbs::ProtectionDomain::reg_user_mr).
pub struct IbvMemoryRegion {
    mr: NonNull<ibv_mr>,
    addr: *mut u8,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    /// Bytes mapped by us (0 for caller memory).
    mapped: usize,
    _pd: IbvProtectionDomain,
}

// SAFETY: the MR handle is only passed to thread-safe libibverbs calls (dereg in drop); safe
// access copies through a raw pointer (`read_at`/`write_at`), and the byte views are `unsafe`
// with the contract stated on `MemoryRegion` (as for any DMA buffer).
unsafe impl Send for IbvMemoryRegion {}
// SAFETY: see `Send`.
unsafe impl Sync for IbvMemoryRegion {}

impl Drop for IbvMemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered exactly once.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %rc_error(rc), len = self.len, "ibv_dereg_mr failed");
        }
        REGISTERED_BYTES.fetch_sub(self.len as u64, Ordering::Relaxed);
        if self.mapped != 0 {
            // SAFETY: our own mapping of `mapped` bytes at `addr`, no longer registered, unmapped
            // once; no view outlives `self`.
            unsafe { libc::munmap(self.addr.cast(), self.mapped) };
        }
    }
}

/// The page size in bytes.
fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The soft RLIMIT_MEMLOCK in bytes (`None` = unlimited).
fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: live out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(r.rlim_cur)
}

/// Explains a failed registration as a locked-memory limit problem when it is one: the kernel
/// answers ENOMEM (or EPERM / EAGAIN on some drivers) and `needed` (bytes this process would have
/// registered in all, this registration included) is above the soft limit (`None` = unlimited).
pub(super) fn memlock_diagnosis(err: &io::Error, needed: u64, limit: Option<u64>) -> Option<VerbsError> {
    let errno = err.raw_os_error()?;
    if ![libc::ENOMEM, libc::EPERM, libc::EAGAIN].contains(&errno) {
        return None;
    }
    let limit = limit?;
    (needed > limit)
        .then(|| VerbsError::MemlockLimit { needed, limit: format!("{limit} bytes ({} KiB)", limit / 1024) })
}

fn check_len(pd: &IbvProtectionDomain, len: usize) -> Result<()> {
    if len == 0 {
        return Err(VerbsError::InvalidArgument { call: "ibv_reg_mr", reason: "length 0".into() });
    }
    let max = pd.ctx().inner.attr.max_mr_size;
    if len as u64 > max {
        return Err(VerbsError::CapExceeded {
            what: "reg_mr length",
            cap: "max_mr_size",
            requested: len as u64,
            limit: max,
        });
    }
    Ok(())
}

/// Verbs requires LOCAL_WRITE with REMOTE_WRITE or REMOTE_ATOMIC (`man ibv_reg_mr`); it is added.
fn verbs_access(access: AccessFlags) -> i32 {
    let mut a = access;
    if a.contains(AccessFlags::REMOTE_WRITE) || a.contains(AccessFlags::REMOTE_ATOMIC) {
        a |= AccessFlags::LOCAL_WRITE;
    }
    (a.0 & 0x1f) as i32
}

impl IbvMemoryRegion {
    /// Registers `[addr, addr + len)`; `mapped` is what to unmap on failure or drop (0 = none).
    ///
    /// # Safety
    /// The memory must be valid for `len` bytes and stay so until the MR is dropped.
    unsafe fn register(
        pd: &IbvProtectionDomain,
        addr: *mut u8,
        len: usize,
        mapped: usize,
        access: AccessFlags,
    ) -> Result<IbvMemoryRegion> {
        let needed = REGISTERED_BYTES.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        // SAFETY: live PD; the memory is valid (caller's contract) and stays so while registered.
        let mr = unsafe { ibv_reg_mr(pd.raw(), addr.cast(), len, verbs_access(access)) };
        let Some(mr) = NonNull::new(mr) else {
            let err = io::Error::last_os_error();
            REGISTERED_BYTES.fetch_sub(len as u64, Ordering::Relaxed);
            return Err(memlock_diagnosis(&err, needed, memlock_limit())
                .unwrap_or(VerbsError::Os { call: "ibv_reg_mr", source: err }));
        };
        // SAFETY: `mr` is a live MR returned just now.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(IbvMemoryRegion { mr, addr, len, lkey, rkey, access, mapped, _pd: pd.clone() })
    }

    /// Allocates `len` zeroed bytes (page-aligned, a private anonymous mapping) and registers them.
    pub(super) fn alloc(
        pd: &IbvProtectionDomain,
        len: usize,
        access: AccessFlags,
    ) -> Result<IbvMemoryRegion> {
        check_len(pd, len)?;
        let page = page_size();
        let mapped = len.checked_next_multiple_of(page).ok_or_else(|| VerbsError::InvalidArgument {
            call: "ibv_reg_mr",
            reason: format!("length {len} too large"),
        })?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(VerbsError::Os { call: "mmap (MR buffer)", source: io::Error::last_os_error() });
        }
        // SAFETY: the mapping is valid for `mapped >= len` bytes and owned by the MR (unmapped in
        // its drop, or below on failure).
        match unsafe { Self::register(pd, p.cast(), len, mapped, access) } {
            Ok(mr) => Ok(mr),
            Err(e) => {
                // SAFETY: our mapping, never registered, unmapped once.
                unsafe { libc::munmap(p, mapped) };
                Err(e)
            }
        }
    }

    /// Registers caller memory.
    ///
    /// # Safety
    /// As [`crate::verbs::ProtectionDomain::reg_user_mr`].
    pub(super) unsafe fn register_user(
        pd: &IbvProtectionDomain,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<IbvMemoryRegion> {
        check_len(pd, len)?;
        if addr.is_null() {
            return Err(VerbsError::InvalidArgument { call: "ibv_reg_mr", reason: "NULL address".into() });
        }
        // SAFETY: forwarded caller contract.
        unsafe { Self::register(pd, addr, len, 0, access) }
    }
}

impl MemoryRegion for IbvMemoryRegion {
    fn addr(&self) -> u64 {
        self.addr as u64
    }

    fn len(&self) -> usize {
        self.len
    }

    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn access(&self) -> AccessFlags {
        self.access
    }

    fn handle(&self) -> MrHandle {
        MrHandle(self.mr.as_ptr() as u64)
    }

    #[inline]
    fn as_ptr(&self) -> *mut u8 {
        self.addr
    }
    #[inline]
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `self.addr` is valid for `len` bytes while the MR lives (owned allocation, or
        // the caller's promise in `reg_user_mr`).
        unsafe { crate::verbs::mr_read_at(self.addr, self.len, offset, dst) }
    }
    #[inline]
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: as in `read_at`.
        unsafe { crate::verbs::mr_write_at(self.addr, self.len, offset, src) }
    }
    unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `self.addr..+len` is valid for the MR's lifetime (owned allocation, or the
        // caller's promise in `reg_user_mr`); the caller guarantees that no WR and no peer
        // writes it while the slice lives (this method's contract).
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }
    unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` excludes other views through this handle and
        // the caller guarantees that no WR and no peer accesses the region meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }
}

impl std::fmt::Debug for IbvMemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr as u64))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .field("owned", &(self.mapped != 0))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_diagnosis_names_needed_and_limit() {
        let enomem = io::Error::from_raw_os_error(libc::ENOMEM);
        let e = memlock_diagnosis(&enomem, 1 << 20, Some(64 * 1024)).expect("a memlock error");
        let msg = e.to_string();
        assert!(matches!(e, VerbsError::MemlockLimit { needed: 1048576, .. }), "{msg}");
        assert!(msg.contains("1048576 bytes"), "{msg}");
        assert!(msg.contains("65536 bytes (64 KiB)"), "{msg}");
        assert!(msg.contains("ulimit -l"), "{msg}");
        assert!(msg.contains("limits.conf"), "{msg}");
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        assert!(memlock_diagnosis(&eperm, 10_000, Some(4096)).is_some());
    }

    #[test]
    fn memlock_diagnosis_leaves_other_failures_alone() {
        let enomem = io::Error::from_raw_os_error(libc::ENOMEM);
        assert!(memlock_diagnosis(&enomem, 4096, None).is_none(), "unlimited");
        assert!(memlock_diagnosis(&enomem, 4096, Some(8192)).is_none(), "under the limit");
        let einval = io::Error::from_raw_os_error(libc::EINVAL);
        assert!(memlock_diagnosis(&einval, 1 << 30, Some(4096)).is_none(), "not a memlock errno");
    }

    #[test]
    fn remote_write_implies_local_write() {
        assert_eq!(verbs_access(AccessFlags::REMOTE_WRITE), 3);
        assert_eq!(verbs_access(AccessFlags::REMOTE_READ), 4);
        assert_eq!(verbs_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ), 5);
        assert_eq!(verbs_access(AccessFlags::MW_BIND | AccessFlags::REMOTE_READ), 0x14, "MW_BIND is kept");
    }
}
