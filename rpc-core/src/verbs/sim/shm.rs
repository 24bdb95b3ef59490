//! Host segments: the shared memory that holds everything a peer touches (the MR key table, the
//! QP directory and responder state, receive and completion rings, MR buffers), so that a
//! requester in another process of the same user can execute a transfer with plain loads,
//! stores and atomics in its own mapping of the responder's segment.
//!
//! A segment is a `/dev/shm/rpc-sim.<uid>.<pid>.<host id>` file created `O_EXCL`, mode 0600,
//! sized [`seg_len`] (sparse: tmpfs allocates pages on first touch, or when an MR is registered,
//! see [`Arena::populate`], and [`Arena::free`] punches
//! them out again), mapped `MAP_SHARED | MAP_NORESERVE`: whole by its owner, and by a peer only
//! as far as [`Header::size`] says it is in use. Its name is derived from the host's GID
//! (`fe80::<pid>:<host id>`), so a peer finds it from the address exchanged at connection setup.
//! The owner unlinks it when the host is dropped or the process exits (`atexit`); a peer that
//! finds the owner's pid gone unlinks it; and every time a host opens (a sim device), its
//! process removes the stale segments of its user: of a pid that is gone, or of a pid that a
//! later process reuses (a heartbeat older than [`HEARTBEAT_DEAD_NS`] and not mapped by that
//! process). A process killed by a signal (SIGTERM, SIGKILL: no `atexit`) leaves its segments
//! behind until then; a library installs no signal handler.
//!
//! Everything here is control path: creating, mapping, allocating and freeing.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

use super::mr::{MrSlot, MR_SLOTS};
use crate::verbs::{Result, VerbsError};

/// Default virtual size of a host segment, in bytes (256 GiB; sparse, pages exist only once
/// touched). The owner maps all of it; a peer process maps only the part in use
/// ([`Header::size`]).
const DEFAULT_SEG_LEN: usize = 1 << 38;

/// Virtual size of this process's host segments in bytes: [`DEFAULT_SEG_LEN`], or
/// `RPC_SIM_SEGMENT_BYTES` when that is a power of two from 1 GiB to 256 GiB (for tools with a
/// smaller address space, such as valgrind, which cannot map 256 GiB; every process of one
/// fabric must use the same value: a segment of another size is not accepted). Read once.
pub(crate) fn seg_len() -> usize {
    static LEN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LEN.get_or_init(|| {
        std::env::var("RPC_SIM_SEGMENT_BYTES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n.is_power_of_two() && ((1 << 30)..=DEFAULT_SEG_LEN).contains(&n))
            .unwrap_or(DEFAULT_SEG_LEN)
    })
}
/// The part of a new segment peers map at first (bytes; the tables and the start of the heap).
pub(crate) const INITIAL_SIZE: usize = 16 << 20;
/// `b"RPCSIMH1"`: the first word of a host segment.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"RPCSIMH1");
/// Layout version of the segment (both sides must agree). 3: key-table slots also hold memory
/// windows (bit-31 keys, `mw`/`qpn`/`mr_key`/`seq`; see `super::mw`). 4: 65,536 key slots
/// (window rkeys with a 16-bit slot and a 7-bit generation) and 65,536 QP directory entries.
pub(crate) const VERSION: u32 = 4;
/// Where the MR key table starts.
pub(crate) const MR_TABLE_OFF: usize = 4096;
/// Where the QP directory starts (after [`MR_SLOTS`] key slots of 64 bytes: 4 MiB).
pub(crate) const QP_DIR_OFF: usize = MR_TABLE_OFF + MR_SLOTS * std::mem::size_of::<MrSlot>();
/// Entries of the QP directory (the sim's `max_qp` per host; 8 bytes each: 512 KiB). A power
/// of two, so that `qpn % QP_DIR_LEN` is a mask.
pub(crate) const QP_DIR_LEN: usize = 1 << 16;
/// Where the reader table of peer processes starts (see [`super::epoch`]).
pub(crate) const READERS_OFF: usize = QP_DIR_OFF + QP_DIR_LEN * 8;
/// Reader slots per host: how many peer processes may map a host at once.
pub(crate) const READERS_LEN: usize = 4096;
/// Where the heap starts (4.8 MiB: the tables).
pub(crate) const HEAP_OFF: usize = READERS_OFF + READERS_LEN * 64;

// A peer's first mapping ([`INITIAL_SIZE`]) covers the tables; the directory is a mask.
const _: () = assert!(HEAP_OFF <= INITIAL_SIZE && QP_DIR_LEN.is_power_of_two());

/// The segment header (first page).
#[repr(C)]
pub(crate) struct Header {
    pub(crate) magic: AtomicU64,
    pub(crate) version: AtomicU32,
    pub(crate) pid: AtomicU32,
    pub(crate) host_id: AtomicU32,
    /// 1 while the host is up; 0 once it vanished or its process died (set by a peer's monitor).
    pub(crate) alive: AtomicU32,
    /// `CLOCK_MONOTONIC` ns of the owner's last heartbeat (every [`HEARTBEAT_NS`]).
    pub(crate) heartbeat: AtomicU64,
    /// The reclamation epoch, advanced by the owner at every grace period ([`super::epoch`]).
    pub(crate) epoch: AtomicU64,
    /// Reader slots ever claimed (the owner scans `[0, readers_hw)`).
    pub(crate) readers_hw: AtomicU32,
    /// Bytes at the start of the segment that hold everything allocated so far (a power of two,
    /// at least [`INITIAL_SIZE`]; only grows, before anything is allocated past it): how much a
    /// peer process maps. A peer that meets memory past its mapping maps the segment again.
    pub(crate) size: AtomicU64,
}

/// Heartbeat period of a host's owner, in ns.
pub(crate) const HEARTBEAT_NS: u64 = 100_000_000;
/// A host whose heartbeat is older than this (ns) is dead even if a process has its pid.
pub(crate) const HEARTBEAT_DEAD_NS: u64 = 10_000_000_000;

fn os(call: &'static str) -> VerbsError {
    VerbsError::Os { call, source: std::io::Error::last_os_error() }
}

/// `CLOCK_MONOTONIC` in ns (the same clock in every process of the machine; a vDSO call).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether a process with this pid exists and has not exited (`kill(pid, 0)`, EPERM meaning
/// it exists; a zombie, killed but not yet reaped, counts as gone).
pub(crate) fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 performs only the existence and permission check.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // `/proc/<pid>/stat`: "pid (comm) S ...", the state after the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z' | 'X'))
        }
        Err(_) => true,
    }
}

pub(crate) fn my_pid() -> u32 {
    std::process::id()
}

fn my_uid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

/// The file name (under /dev/shm) of host `host_id` of process `pid`.
pub(crate) fn seg_path(pid: u32, host_id: u32) -> String {
    format!("/dev/shm/rpc-sim.{}.{pid}.{host_id}", my_uid())
}

/// A mapping of a host segment (own or a peer's). Unmapped on drop; the owner's also unlinked.
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    /// The file to unlink on drop (the owner's segment).
    unlink: Option<CString>,
}

// SAFETY: the mapping is plain shared memory; all accesses to it go through atomics or through
// ranges whose ownership the verbs contract assigns.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates and maps the segment of host `host_id` of this process.
    pub(crate) fn create(host_id: u32) -> Result<Segment> {
        init_process();
        remove_stale();
        let path = CString::new(seg_path(my_pid(), host_id)).map_err(|_| VerbsError::InvalidArgument {
            call: "sim host segment",
            reason: "path with NUL".into(),
        })?;
        // SAFETY: `path` is a valid C string.
        let fd = unsafe {
            libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600)
        };
        if fd < 0 {
            return Err(os("open(/dev/shm/rpc-sim.*, O_CREAT | O_EXCL)"));
        }
        let seg = (|| {
            // SAFETY: `fd` is an open file.
            if unsafe { libc::ftruncate(fd, seg_len() as libc::off_t) } != 0 {
                return Err(os("ftruncate (sim host segment)"));
            }
            let seg = Segment::map(fd, seg_len())?;
            let h = seg.header();
            h.version.store(VERSION, Ordering::Relaxed);
            h.pid.store(my_pid(), Ordering::Relaxed);
            h.host_id.store(host_id, Ordering::Relaxed);
            h.alive.store(1, Ordering::Relaxed);
            h.heartbeat.store(monotonic_ns(), Ordering::Relaxed);
            h.size.store(INITIAL_SIZE as u64, Ordering::Relaxed);
            h.magic.store(MAGIC, Ordering::Release);
            Ok(seg)
        })();
        // SAFETY: `fd` is ours; the mapping stays valid after close.
        unsafe { libc::close(fd) };
        match seg {
            Ok(mut s) => {
                remember_own(&path);
                s.unlink = Some(path);
                Ok(s)
            }
            Err(e) => {
                // SAFETY: `path` is a valid C string.
                unsafe { libc::unlink(path.as_ptr()) };
                Err(e)
            }
        }
    }

    /// Maps the segment of host `host_id` of process `pid` (a peer): the part in use now
    /// ([`Header::size`]), not the whole reservation, so that a process can map the hosts of
    /// thousands of peers. `None` when it does not exist, belongs to another user, is not
    /// private to its user, or is not a host segment of this layout version.
    pub(crate) fn open(pid: u32, host_id: u32) -> Option<Segment> {
        let path = CString::new(seg_path(pid, host_id)).ok()?;
        // SAFETY: `path` is a valid C string.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
        if fd < 0 {
            return None;
        }
        let seg = (|| {
            // SAFETY: `st` is a valid out-pointer, `fd` an open file.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return None;
            }
            let private = st.st_uid == my_uid() && st.st_mode & 0o077 == 0;
            if !private || st.st_size as usize != seg_len() {
                tracing::warn!(pid, host_id, "sim: ignoring a host segment that is not ours or not private");
                return None;
            }
            let ours = |seg: &Segment| {
                let h = seg.header();
                h.magic.load(Ordering::Acquire) == MAGIC
                    && h.version.load(Ordering::Relaxed) == VERSION
                    && h.pid.load(Ordering::Relaxed) == pid
                    && h.host_id.load(Ordering::Relaxed) == host_id
            };
            // The tables first, to read how much is in use; then that much.
            let tables = Segment::map(fd, HEAP_OFF).ok()?;
            if !ours(&tables) {
                return None;
            }
            let size = tables.header().size.load(Ordering::Acquire) as usize;
            drop(tables);
            let len = size.clamp(HEAP_OFF, seg_len()).div_ceil(PAGE) * PAGE;
            let seg = Segment::map(fd, len).ok()?;
            ours(&seg).then_some(seg)
        })();
        // SAFETY: `fd` is ours.
        unsafe { libc::close(fd) };
        seg
    }

    fn map(fd: libc::c_int, len: usize) -> Result<Segment> {
        // SAFETY: a fresh shared mapping of an open file; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap (sim host segment)"));
        }
        Ok(Segment { base: p as *mut u8, len, unlink: None })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: the first page of the mapping is the header, all atomics (zero is valid).
        unsafe { &*(self.base as *const Header) }
    }

    /// A pointer to offset `off` (which must be inside the mapping).
    #[inline]
    pub(crate) fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.len);
        // SAFETY: `off < len` (callers' invariant), so the result is inside the mapping.
        unsafe { self.base.add(off) }
    }

    /// Unlinks the file now (the mapping stays valid): a peer found its owner dead.
    pub(crate) fn unlink_dead(pid: u32, host_id: u32) {
        if let Ok(p) = CString::new(seg_path(pid, host_id)) {
            // SAFETY: `p` is a valid C string.
            unsafe { libc::unlink(p.as_ptr()) };
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(p) = &self.unlink {
            self.header().alive.store(0, Ordering::SeqCst);
            // SAFETY: `p` is a valid C string.
            unsafe { libc::unlink(p.as_ptr()) };
            forget_own(p);
        }
        // SAFETY: `base..base+len` is a mapping this value owns; nothing refers to it any more
        // (every holder of a pointer into it holds an `Arc` to its owner).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

// ---------------------------------------------------------------------------------------------
// Process-wide: stale cleanup at the first host, unlink at exit.

static OWN: Mutex<Vec<CString>> = Mutex::new(Vec::new());
static INIT: Once = Once::new();

fn forget_own(p: &CString) {
    let mut own = OWN.lock().unwrap_or_else(|e| e.into_inner());
    own.retain(|q| q != p);
}

extern "C" fn unlink_own_at_exit() {
    let own = OWN.lock().unwrap_or_else(|e| e.into_inner());
    for p in own.iter() {
        // SAFETY: `p` is a valid C string.
        unsafe { libc::unlink(p.as_ptr()) };
    }
}

fn init_process() {
    INIT.call_once(|| {
        // SAFETY: registering a plain `extern "C"` function.
        unsafe { libc::atexit(unlink_own_at_exit) };
    });
}

/// Removes this user's host segments whose creating process is gone (never this process's, never
/// one a live process may use: see [`stale_reason`]); logs each removal at info, a removal that
/// fails (another process removed it first, permissions) at debug.
pub(crate) fn remove_stale() {
    let prefix = format!("rpc-sim.{}.", my_uid());
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    // A process holds many segments (one per host): ask after each pid once per sweep.
    let mut alive = std::collections::HashMap::new();
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else { continue };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid == my_pid() {
            continue;
        }
        let path = e.path();
        let live = *alive.entry(pid).or_insert_with(|| pid_alive(pid));
        let Some(why) = stale_reason(pid, live, &path) else { continue };
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!(file = %path.display(), pid, why, "sim: removed a stale host segment"),
            Err(err) => {
                tracing::debug!(file = %path.display(), pid, why, %err, "sim: could not remove a stale host segment")
            }
        }
    }
}

/// Why the segment at `path`, named for process `pid` (not this one; `alive`: [`pid_alive`] of
/// it), is stale, or `None` when a live process may still use it:
/// - `pid` is gone (or a zombie): stale;
/// - `pid` is alive: stale only when the segment is a complete host segment of `pid` whose
///   heartbeat is older than [`HEARTBEAT_DEAD_NS`] (its owner writes it every
///   [`HEARTBEAT_NS`]) and `/proc/<pid>/maps` is readable and does not map it (an owner maps
///   its segment for the segment's whole life): the pid was reused by a later process. A
///   segment being created (no magic yet), of another layout, or whose mapping cannot be read
///   (another user's process, permissions) is kept.
fn stale_reason(pid: u32, alive: bool, path: &std::path::Path) -> Option<&'static str> {
    if !alive {
        return Some("its process is gone");
    }
    let (magic, owner, heartbeat) = read_header(path)?;
    if magic != MAGIC || owner != pid {
        return None;
    }
    if monotonic_ns().saturating_sub(heartbeat) < HEARTBEAT_DEAD_NS {
        return None;
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mapped = path.to_str().is_none_or(|p| maps.lines().any(|l| l.contains(p)));
    (!mapped).then_some("its pid belongs to a later process (no heartbeat, not mapped)")
}

/// `(magic, pid, heartbeat)` of the segment file at `path` (plain reads; `None` when shorter
/// than the header or unreadable).
fn read_header(path: &std::path::Path) -> Option<(u64, u32, u64)> {
    use std::io::Read as _;
    use std::mem::offset_of;
    let mut head = [0u8; std::mem::size_of::<Header>()];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    let word = |at: usize| u64::from_ne_bytes(head[at..at + 8].try_into().unwrap_or_default());
    let half = |at: usize| u32::from_ne_bytes(head[at..at + 4].try_into().unwrap_or_default());
    Some((
        word(offset_of!(Header, magic)),
        half(offset_of!(Header, pid)),
        word(offset_of!(Header, heartbeat)),
    ))
}

pub(crate) fn remember_own(path: &CString) {
    OWN.lock().unwrap_or_else(|e| e.into_inner()).push(path.clone());
}

// ---------------------------------------------------------------------------------------------
// The heap allocator of an own segment (process-private bookkeeping).

/// First-fit allocator over the segment's heap. A freed range is reusable once no peer process
/// can still be inside a transfer that found it (an epoch grace period, [`super::epoch`]), and
/// its pages are returned to the system at once (`MADV_REMOVE`: they read as zeros again).
pub(crate) struct Arena {
    inner: Mutex<ArenaInner>,
}

struct ArenaInner {
    /// Free ranges by offset (coalesced): start → length.
    free: BTreeMap<usize, usize>,
    /// The same ranges by length: `(length, start)`, so an allocation finds a range in
    /// O(log n) however fragmented the segment (a first-fit walk over `free` made a host with
    /// thousands of QPs and MRs slow to make more: O(n) per allocation).
    by_len: BTreeSet<(usize, usize)>,
}

/// Allocation granularity and alignment (bytes): two cache lines.
const GRAIN: usize = 128;
const PAGE: usize = 4096;

impl Arena {
    pub(crate) fn new() -> Arena {
        let mut inner = ArenaInner { free: BTreeMap::new(), by_len: BTreeSet::new() };
        inner.add(HEAP_OFF, seg_len() - HEAP_OFF);
        Arena { inner: Mutex::new(inner) }
    }

    /// Allocates `len` bytes aligned to `align` (a power of two, at least 128) in `seg`;
    /// returns the offset, or `None` when the segment is exhausted. The bytes are zero.
    pub(crate) fn alloc(&self, seg: &Segment, len: usize, align: usize) -> Option<usize> {
        let align = align.max(GRAIN);
        let len = len.max(1).checked_add(GRAIN - 1)? & !(GRAIN - 1);
        let a = {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let fits = |&&(l, s): &&(usize, usize)| ((s + align - 1) & !(align - 1)) + len <= s + l;
            // Best fit: the shortest ranges at least `len` long (one whose start is not aligned
            // may not fit: a few are tried), else the shortest that fits whatever its alignment.
            let (flen, start) = match g.by_len.range((len, 0)..).take(16).find(fits) {
                Some(&r) => r,
                None => *g.by_len.range((len.checked_add(align - GRAIN)?, 0)..).next()?,
            };
            g.remove(start, flen);
            let a = (start + align - 1) & !(align - 1);
            if a > start {
                g.add(start, a - start);
            }
            if a + len < start + flen {
                g.add(a + len, start + flen - (a + len));
            }
            // Published before the offset is handed out (so before anything a peer can learn
            // of is placed there).
            let end = (a + len).next_power_of_two().clamp(INITIAL_SIZE, seg_len());
            seg.header().size.fetch_max(end as u64, Ordering::AcqRel);
            a
        };
        let end = a + len;
        let (fp, ep) = (a.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        // SAFETY: `[a, end)` is inside the mapping and now ours alone. Whole pages are dropped
        // (MADV_REMOVE: they read as zeros, and untouched ones cost nothing); partial pages are
        // cleared.
        unsafe {
            if len > (1 << 20) && ep > fp {
                std::ptr::write_bytes(seg.at(a), 0, fp - a);
                libc::madvise(seg.at(fp) as *mut libc::c_void, ep - fp, libc::MADV_REMOVE);
                std::ptr::write_bytes(seg.at(ep), 0, end - ep);
            } else {
                std::ptr::write_bytes(seg.at(a), 0, len);
            }
        }
        Some(a)
    }

    /// Makes the pages of `[off, off + len)` of `seg` (an allocation of this arena) resident now,
    /// as `ibv_reg_mr` pins a buffer's pages: a transfer into registered memory then never takes
    /// a first-touch page fault (on tmpfs, allocating and clearing a page: microseconds on a VM,
    /// where a real NIC writes into pinned pages). One `MADV_POPULATE_WRITE` (Linux 5.14); on an
    /// older kernel, a write of zero per page (the bytes are zero already). The bytes stay zero.
    pub(crate) fn populate(&self, seg: &Segment, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        let (fp, ep) = (off / PAGE * PAGE, (off + len).div_ceil(PAGE) * PAGE);
        // SAFETY: `[fp, ep)` covers whole pages of an allocation of ours inside the mapping (its
        // partial pages belong to neighbouring allocations only through their own zeroed
        // bytes, which populating leaves as they are); populating changes no byte.
        let r = unsafe { libc::madvise(seg.at(fp) as *mut libc::c_void, ep - fp, libc::MADV_POPULATE_WRITE) };
        if r != 0 {
            for p in (off..off + len).step_by(PAGE) {
                // SAFETY: `p` lies in the allocation, which is ours and zero (fresh from `alloc`);
                // a volatile write of zero faults the page in and changes nothing.
                unsafe { std::ptr::write_volatile(seg.at(p), 0) };
            }
        }
    }

    /// Frees `[off, off + len)` of `seg` (as allocated), which nothing may reach any more (key
    /// invalidated, QP marked destroyed): its whole pages go back to the system now; the range
    /// is reusable when this returns, after a grace period for the peer processes
    /// ([`super::epoch::synchronize`]; at once unless a peer is inside a transfer).
    pub(crate) fn free(&self, seg: &Segment, off: usize, len: usize) {
        let len = len.max(1).div_ceil(GRAIN) * GRAIN;
        let end = off + len;
        let (fp, ep) = (off.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if ep > fp && len > (1 << 16) {
            // SAFETY: whole pages inside the freed range; a late peer write there only
            // re-creates a page, which the next `alloc` clears.
            unsafe { libc::madvise(seg.at(fp) as *mut libc::c_void, ep - fp, libc::MADV_REMOVE) };
        }
        super::epoch::synchronize(seg);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.insert_free(off, len);
    }
}

impl ArenaInner {
    fn add(&mut self, start: usize, len: usize) {
        self.free.insert(start, len);
        self.by_len.insert((len, start));
    }

    fn remove(&mut self, start: usize, len: usize) {
        self.free.remove(&start);
        self.by_len.remove(&(len, start));
    }

    fn insert_free(&mut self, mut off: usize, mut len: usize) {
        if let Some((&s, &l)) = self.free.range(..off).next_back() {
            if s + l == off {
                self.remove(s, l);
                off = s;
                len += l;
            }
        }
        if let Some(&l) = self.free.get(&(off + len)) {
            self.remove(off + len, l);
            len += l;
        }
        self.add(off, len);
    }
}

// ---------------------------------------------------------------------------------------------
// Futex wake-ups on shared words (the CQ event path only).

/// `CLOCK_MONOTONIC` (the clock of [`std::time::Instant`]) plus `timeout`: the absolute deadline
/// [`futex_wait_until`] takes; `None` when it does not fit a `timespec` (wait forever).
pub(crate) fn deadline_after(timeout: std::time::Duration) -> Option<libc::timespec> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let secs = libc::time_t::try_from(timeout.as_secs()).ok()?;
    let mut nsec = now.tv_nsec + timeout.subsec_nanos() as libc::c_long;
    let mut sec = now.tv_sec.checked_add(secs)?;
    if nsec >= 1_000_000_000 {
        nsec -= 1_000_000_000;
        sec = sec.checked_add(1)?;
    }
    Some(libc::timespec { tv_sec: sec, tv_nsec: nsec })
}

/// Waits while `*word == expected`, until the absolute `CLOCK_MONOTONIC` time `deadline`
/// (`None`: no limit), with one system call and no clock read. Returns `true` when the deadline
/// passed (`ETIMEDOUT`); spurious returns are possible, callers re-check.
pub(crate) fn futex_wait_until(word: &AtomicU32, expected: u32, deadline: Option<&libc::timespec>) -> bool {
    let tsp = deadline.map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid aligned u32 for the call's duration, `tsp` null or a valid
    // timespec; FUTEX_WAIT_BITSET (not PRIVATE) takes an absolute CLOCK_MONOTONIC time and works
    // across processes sharing the mapping; FUTEX_WAKE wakes it (any bitset).
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET,
            expected,
            tsp,
            std::ptr::null::<u32>(),
            libc::FUTEX_BITSET_MATCH_ANY,
        )
    };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

/// `timeout` as the relative `timespec` [`futex_wait_for`] takes, with no clock read; `None`
/// when it does not fit a `timespec` (wait forever).
pub(crate) fn relative(timeout: std::time::Duration) -> Option<libc::timespec> {
    let secs = libc::time_t::try_from(timeout.as_secs()).ok()?;
    Some(libc::timespec { tv_sec: secs, tv_nsec: timeout.subsec_nanos() as libc::c_long })
}

/// Waits while `*word == expected`, for at most the relative `timeout` (`None`: no limit), with
/// one system call and no clock read (the kernel measures it on `CLOCK_MONOTONIC`). Returns
/// `true` when the timeout passed (`ETIMEDOUT`); spurious returns are possible, callers re-check
/// (and wait on for the rest with [`futex_wait_until`], as a second relative wait would restart
/// the timeout).
pub(crate) fn futex_wait_for(word: &AtomicU32, expected: u32, timeout: Option<&libc::timespec>) -> bool {
    let tsp = timeout.map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid aligned u32 for the call's duration, `tsp` null or a valid
    // timespec; FUTEX_WAIT (not PRIVATE) takes a relative timeout and works across processes
    // sharing the mapping; FUTEX_WAKE wakes it.
    let r = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, tsp) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

/// Wakes every waiter on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait_until`.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_seg() -> Segment {
        static NEXT: AtomicU32 = AtomicU32::new(0xf000_0000);
        Segment::create(NEXT.fetch_add(1, Ordering::Relaxed)).expect("segment")
    }

    #[test]
    fn arena_aligns_zeroes_and_coalesces() {
        let seg = host_seg();
        let arena = Arena::new();
        let a = arena.alloc(&seg, 100, 128).unwrap();
        let b = arena.alloc(&seg, 5000, 4096).unwrap();
        assert_eq!((a % 128, b % 4096), (0, 0));
        assert!(a >= HEAP_OFF && b >= a + 128, "{a} {b}");
        // SAFETY: both ranges are ours, inside the mapping.
        unsafe {
            std::ptr::write_bytes(seg.at(a), 0xab, 100);
            std::ptr::write_bytes(seg.at(b), 0xcd, 5000);
        }
        arena.free(&seg, a, 100);
        arena.free(&seg, b, 5000);
        // Freed (no peer inside a transfer: at once) and coalesced: the first fit is `a` again,
        // zeroed.
        let c = arena.alloc(&seg, 6000, 128).unwrap();
        assert_eq!(c, a);
        // SAFETY: ours, inside the mapping.
        let bytes = unsafe { std::slice::from_raw_parts(seg.at(c), 6000) };
        assert!(bytes.iter().all(|&x| x == 0), "reallocated memory reads as zeros");
    }

    /// Thousands of allocations of mixed sizes and alignments, freed in a scrambled order, then
    /// everything again: the ranges handed out never overlap and stay aligned, the two indexes
    /// of the free ranges (by offset, by length) always agree, and once all is freed the arena is
    /// one range again. Sabotaged: `insert_free` coalescing without updating `by_len`: failed
    /// ("the length index disagrees").
    #[test]
    fn a_fragmented_arena_keeps_its_free_indexes_in_step_and_never_overlaps() {
        let seg = host_seg();
        let arena = Arena::new();
        let check = |arena: &Arena| {
            let g = arena.inner.lock().unwrap();
            let by_len: BTreeSet<(usize, usize)> = g.free.iter().map(|(&s, &l)| (l, s)).collect();
            assert!(by_len == g.by_len, "the length index disagrees with the offset index");
            let mut end = 0;
            for (&s, &l) in &g.free {
                assert!(s > end || end == 0, "free ranges touch or overlap at {s}: not coalesced");
                end = s + l;
            }
        };
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _round in 0..2 {
            let mut live: Vec<(usize, usize)> = Vec::new();
            for i in 0..3000 {
                let len = 1 + (next() % 9000) as usize;
                let align = [128, 256, 4096][(next() % 3) as usize];
                let a = arena.alloc(&seg, len, align).unwrap();
                assert_eq!(a % align, 0);
                live.push((a, len));
                if i % 3 == 2 {
                    let (off, l) = live.swap_remove((next() as usize) % live.len());
                    arena.free(&seg, off, l);
                }
            }
            let mut sorted = live.clone();
            sorted.sort();
            for w in sorted.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "allocations overlap: {w:?}");
            }
            check(&arena);
            while !live.is_empty() {
                let (off, l) = live.swap_remove((next() as usize) % live.len());
                arena.free(&seg, off, l);
            }
            check(&arena);
            assert_eq!(arena.inner.lock().unwrap().free.len(), 1, "all freed: one range again");
        }
    }

    #[test]
    fn a_freed_range_is_reused_after_the_pinned_peer_transfer_ends() {
        let seg = std::sync::Arc::new(host_seg());
        let arena = std::sync::Arc::new(Arena::new());
        let d = arena.alloc(&seg, 256, 128).unwrap();
        // A peer process (simulated: a reader slot of this live process) is inside a transfer.
        let reader = super::super::epoch::Reader::claim(&seg).unwrap();
        let pin = reader.pin();
        let t = {
            let (seg, arena) = (seg.clone(), arena.clone());
            std::thread::spawn(move || {
                arena.free(&seg, d, 256);
                arena.alloc(&seg, 256, 128).unwrap()
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!t.is_finished(), "the free waits for the transfer that may still use the range");
        drop(pin);
        assert_eq!(t.join().unwrap(), d, "then the range is reused at once, no quarantine");
    }

    #[test]
    fn segments_are_private_named_by_pid_and_host_and_unlinked_on_drop() {
        let seg = host_seg();
        let id = seg.header().host_id.load(Ordering::Relaxed);
        let path = seg_path(my_pid(), id);
        let meta = std::fs::metadata(&path).expect("the segment file exists");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), seg_len() as u64);
        assert!(Segment::create(id).is_err(), "O_EXCL: a second create of the same name fails");
        // Another mapping of the same file sees the same bytes (what a peer process does).
        let peer = Segment::open(my_pid(), id).expect("open by pid and host id");
        // SAFETY: inside both mappings, past the header.
        unsafe { *seg.at(HEAP_OFF) = 42 };
        // SAFETY: as above.
        assert_eq!(unsafe { *peer.at(HEAP_OFF) }, 42);
        assert!(Segment::open(my_pid(), id + 1).is_none(), "no such host");
        drop(peer);
        drop(seg);
        assert!(std::fs::metadata(&path).is_err(), "unlinked when the owner drops it");
    }

    #[test]
    fn thousands_of_peer_mappings_fit_in_the_address_space() {
        // A server process maps the segment of every client host it talks to. Mapping the
        // whole 256 GiB reservation each time, 47 bits of address space held about 500; peers
        // map the part in use, so thousands fit (here: one segment mapped 2000 times, as 2000
        // client processes' segments would be).
        let seg = host_seg();
        let id = seg.header().host_id.load(Ordering::Relaxed);
        const PEERS: usize = 2000;
        let peers: Vec<Segment> = (0..PEERS)
            .map(|i| Segment::open(my_pid(), id).unwrap_or_else(|| panic!("peer mapping #{i} failed")))
            .collect();
        assert!(peers.iter().all(|p| p.len() == INITIAL_SIZE), "{}", peers[0].len());
        // The owner's allocations grow the part in use; a mapping made afterwards covers them.
        let arena = Arena::new();
        let big = arena.alloc(&seg, 40 << 20, 4096).unwrap();
        let size = seg.header().size.load(Ordering::Relaxed) as usize;
        assert!(size >= big + (40 << 20) && size.is_power_of_two(), "{size}");
        let later = Segment::open(my_pid(), id).unwrap();
        assert_eq!(later.len(), size);
        assert_eq!(peers[0].len(), INITIAL_SIZE, "an existing mapping is not moved");
    }

    #[test]
    fn a_segment_readable_by_others_is_refused() {
        let seg = host_seg();
        let id = seg.header().host_id.load(Ordering::Relaxed);
        let path = seg_path(my_pid(), id);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Segment::open(my_pid(), id).is_none());
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        // Not reaped yet: a zombie once it exits.
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z")) {
            std::thread::yield_now();
        }
        assert!(!pid_alive(pid), "a zombie counts as gone");
        child.wait().unwrap();
        assert!(!pid_alive(pid));
        assert!(pid_alive(my_pid()));
    }

    /// A segment file named for `pid` with a complete header whose heartbeat is `age_ns` old.
    fn fake_segment(pid: u32, host_id: u32, age_ns: u64) -> String {
        use std::mem::offset_of;
        let mut head = vec![0u8; std::mem::size_of::<Header>()];
        let mut put = |at: usize, bytes: &[u8]| head[at..at + bytes.len()].copy_from_slice(bytes);
        put(offset_of!(Header, magic), &MAGIC.to_ne_bytes());
        put(offset_of!(Header, version), &VERSION.to_ne_bytes());
        put(offset_of!(Header, pid), &pid.to_ne_bytes());
        put(offset_of!(Header, host_id), &host_id.to_ne_bytes());
        put(offset_of!(Header, heartbeat), &monotonic_ns().saturating_sub(age_ns).to_ne_bytes());
        let path = seg_path(pid, host_id);
        std::fs::write(&path, head).unwrap();
        path
    }

    /// A reused pid: a live process (a child of this test) holds the pid a segment is named for.
    /// Its segment stays while its heartbeat is fresh or while that process maps it; with an
    /// old heartbeat and no mapping, it was an earlier holder's and is removed.
    #[test]
    fn a_segment_of_a_reused_pid_is_removed_only_when_no_heartbeat_and_not_mapped() {
        let mut child = std::process::Command::new("sleep").arg("60").spawn().expect("spawn sleep");
        let pid = child.id();
        let fresh = fake_segment(pid, 0xdddd_0001, 0);
        let old = fake_segment(pid, 0xdddd_0002, 2 * HEARTBEAT_DEAD_NS);
        // Not a host segment (being created, or something else): kept whatever its age.
        let partial = seg_path(pid, 0xdddd_0003);
        std::fs::write(&partial, b"x").unwrap();
        assert_eq!(stale_reason(pid, true, std::path::Path::new(&fresh)), None);
        assert_eq!(stale_reason(pid, true, std::path::Path::new(&partial)), None);
        assert!(stale_reason(pid, true, std::path::Path::new(&old)).is_some());
        remove_stale();
        assert!(std::fs::metadata(&fresh).is_ok(), "a fresh heartbeat: the live pid's segment stays");
        assert!(std::fs::metadata(&partial).is_ok(), "no header: stays");
        assert!(std::fs::metadata(&old).is_err(), "an old heartbeat, not mapped: removed");
        // This process's own segments are never touched, whatever their heartbeat.
        let own = fake_segment(my_pid(), 0xdddd_0004, 2 * HEARTBEAT_DEAD_NS);
        remove_stale();
        assert!(std::fs::metadata(&own).is_ok());
        // An old heartbeat of a segment the live process maps: kept (a stopped owner).
        let mapped = fake_segment(my_pid(), 0xdddd_0005, 2 * HEARTBEAT_DEAD_NS);
        let file = std::fs::File::open(&mapped).unwrap();
        // SAFETY: a read-only shared mapping of a file this test owns; unmapped below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(maps.contains(&mapped), "{maps}");
        // Seen as another pid's: the mapping check alone keeps it.
        let alive_and_mapping = std::path::Path::new(&mapped);
        assert_eq!(stale_reason(my_pid(), true, alive_and_mapping), None);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(at, 4096) };
        for p in [&fresh, &partial, &own, &mapped] {
            std::fs::remove_file(p).unwrap();
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn stale_segments_of_dead_processes_are_removed() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let dead = child.id();
        child.wait().unwrap();
        let stale = seg_path(dead, 7);
        let live = seg_path(my_pid(), 0xeeee_eeee);
        std::fs::write(&stale, b"x").unwrap();
        std::fs::write(&live, b"x").unwrap();
        remove_stale();
        assert!(std::fs::metadata(&stale).is_err(), "the dead pid's segment is gone");
        assert!(std::fs::metadata(&live).is_ok(), "a live process's segment stays");
        std::fs::remove_file(&live).unwrap();
    }

    /// The absolute deadline holds: a wait with nobody waking it lasts its timeout (not less,
    /// not forever), a wake-up ends it early and is no timeout, a changed word returns at once,
    /// and a timeout past the clock's range is no deadline (forever).
    #[test]
    fn futex_waits_until_an_absolute_deadline() {
        use std::time::{Duration, Instant};
        let word = std::sync::Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let deadline = deadline_after(Duration::from_millis(40)).expect("a near deadline fits");
        let mut timed_out = false;
        // A spurious return (a signal) re-waits until the same deadline.
        while !timed_out {
            timed_out = futex_wait_until(&word, 0, Some(&deadline));
        }
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(40), "returned early: {waited:?}");
        assert!(waited < Duration::from_secs(5), "waited far past the deadline: {waited:?}");

        assert!(!futex_wait_until(&word, 1, None), "a word that is not `expected` returns at once");
        assert!(deadline_after(Duration::MAX).is_none(), "Duration::MAX waits forever");

        let (w2, start) = (word.clone(), Instant::now());
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.store(1, Ordering::Release);
            futex_wake(&w2);
        });
        let deadline = deadline_after(Duration::from_secs(10)).unwrap();
        while word.load(Ordering::Acquire) == 0 {
            assert!(!futex_wait_until(&word, 0, Some(&deadline)), "woken, not timed out");
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the wake-up ended the wait");
        waker.join().unwrap();
    }

    /// The relative timeout holds: a wait with nobody waking it lasts its timeout (not less, not
    /// forever; a spurious return counts as no timeout and is re-checked), a wake-up ends it
    /// early and is no timeout, a changed word returns at once, a timeout past the range of a
    /// `timespec` is none (forever).
    #[test]
    fn futex_waits_for_a_relative_timeout() {
        use std::time::{Duration, Instant};
        let word = std::sync::Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let timeout = relative(Duration::from_millis(40)).expect("a short timeout fits");
        while !futex_wait_for(&word, 0, Some(&timeout)) {
            assert!(start.elapsed() < Duration::from_secs(5), "never timed out");
        }
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(40), "returned early: {waited:?}");
        assert!(waited < Duration::from_secs(5), "waited far past the timeout: {waited:?}");

        assert!(!futex_wait_for(&word, 1, None), "a word that is not `expected` returns at once");
        assert!(relative(Duration::MAX).is_none(), "Duration::MAX waits forever");

        let (w2, start) = (word.clone(), Instant::now());
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.store(1, Ordering::Release);
            futex_wake(&w2);
        });
        let timeout = relative(Duration::from_secs(10)).unwrap();
        while word.load(Ordering::Acquire) == 0 {
            assert!(!futex_wait_for(&word, 0, Some(&timeout)), "woken, not timed out");
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the wake-up ended the wait");
        waker.join().unwrap();
    }
}
