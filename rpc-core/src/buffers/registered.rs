//! Registered memory a user fills and sends with no copy: [`RegisteredPool`] hands out
//! [`RegisteredBytesMut`] buffers, frozen into `bytes::Bytes` that a message carries in a
//! `bytes` field.
//!
//! A body above the eager threshold is sent by an RDMA WRITE into the peer's ring. Its ordinary
//! `Bytes` fields are copied once into registered memory first (the send mirror or the staging
//! area); a field whose bytes lie in a buffer of the pool registered in the protection domain of
//! the connection's QP is WRITTEN straight from there instead: the WRITE's gather list names the
//! field's bytes with the pool's lkey (see [`crate::buffers::GatherBody`] and the connection's
//! send path). The `Bytes` (and so its block of the pool) is held by the send queue until the
//! polled completion that retires that WRITE, or, when the session breaks, until the connection
//! is dropped, its QP first: memory is never given back while a posted WR may read it.
//!
//! The pool registers slabs of memory on demand (never one registration per buffer) up to a
//! bound in bytes, and keeps them registered until the pool itself is dropped (the last buffer
//! of it included). A buffer of `len` bytes takes a block of the next power of two of at least
//! [`MIN_BLOCK`] bytes; a slab holds blocks of one size, and is [`SLAB_BYTES`] long (the bound
//! when smaller) or one block, whichever is larger. Over the bound, [`RegisteredPool::alloc`] fails with
//! RESOURCE_EXHAUSTED naming it (no heap fallback: the caller chooses, for instance an ordinary
//! `Bytes`, which is sent with one copy).
//!
//! A buffer from another pool (another client's protection domain, another device) is not
//! found in this pool's slabs and is copied like an ordinary `Bytes`: no WR ever names memory by
//! a key of another protection domain.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use crate::status::Status;
use crate::verbs::{AccessFlags, MemoryRegion, ProtectionDomain, Provider};

/// Smallest block of a [`RegisteredPool`], in bytes: buffers below it take one (4 KiB, the size
/// from which a `GatherBody` references a `Bytes` field instead of copying it).
pub const MIN_BLOCK: usize = super::gather::GATHER_MIN;

/// Bytes a slab of small blocks registers at once (4 MiB); a slab of larger blocks holds one.
pub const SLAB_BYTES: usize = 4 << 20;

/// Default bound of a client's or a server worker's pool: 256 MiB registered at most.
pub const DEFAULT_POOL_BYTES: usize = 256 << 20;

/// One registered slab of equal blocks.
struct Slab {
    addr: u64,
    len: usize,
    lkey: u32,
    /// The MR, kept alive (deregistered when the pool is dropped).
    _mr: Box<dyn Any + Send + Sync>,
}

/// A block: its slab's index and its offset in the slab.
type BlockAt = (u32, u32);

type Register = dyn Fn(usize) -> crate::verbs::Result<Slab> + Send + Sync;

/// What a pool registered and sent (see [`RegisteredPool::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisteredStats {
    /// Bytes registered in slabs (never more than the bound).
    pub registered_bytes: u64,
    /// Buffers handed out and not yet given back (alive as a `RegisteredBytesMut` or in a
    /// `Bytes`, the send queue's hold included).
    pub live_buffers: u64,
    /// Body bytes RDMA WRITTEN straight from this pool's buffers (no copy).
    pub zero_copy_bytes: u64,
    /// Body bytes of this pool's buffers that were copied into the send mirror instead (a WRITE
    /// with its gather list full: the device's `max_send_sge`).
    pub copied_bytes: u64,
    /// Allocations refused (over the bound, or a slab failed to register).
    pub refused: u64,
}

/// A pool of registered memory in one protection domain, shared (`Arc`) by its owner (a client,
/// a server worker) and every buffer it handed out. See the module docs.
pub struct RegisteredPool {
    register: Box<Register>,
    /// Most bytes registered in slabs.
    limit: usize,
    /// Slabs, appended under `grow`; read without a lock (`nslabs` first).
    slabs: Box<[OnceLock<Slab>]>,
    nslabs: AtomicUsize,
    /// Free blocks per size class (`MIN_BLOCK << class`): (slab, offset).
    free: Box<[Mutex<Vec<BlockAt>>]>,
    /// Bytes registered; held while a slab is added.
    grow: Mutex<usize>,
    live: AtomicU64,
    zero_copy: AtomicU64,
    copied: AtomicU64,
    refused: AtomicU64,
}

impl std::fmt::Debug for RegisteredPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredPool").field("limit", &self.limit).field("stats", &self.stats()).finish()
    }
}

impl RegisteredPool {
    /// A pool registering at most `limit` bytes (at least one [`MIN_BLOCK`]) in `pd`, on demand:
    /// nothing is registered until the first [`RegisteredPool::alloc`].
    pub fn new<P: Provider>(pd: P::ProtectionDomain, limit: usize) -> Arc<RegisteredPool> {
        let limit = limit.max(MIN_BLOCK);
        let register = move |len: usize| -> crate::verbs::Result<Slab> {
            // Local access only: only our NIC reads it (the gather list of a WRITE); no peer key.
            let mr = pd.reg_mr(len, AccessFlags::LOCAL_WRITE)?;
            Ok(Slab { addr: mr.addr(), len: mr.len(), lkey: mr.lkey(), _mr: Box::new(mr) })
        };
        let classes = (usize::BITS - (limit / MIN_BLOCK).leading_zeros()) as usize;
        let slabs = limit.div_ceil(SLAB_BYTES.min(limit)) + classes;
        Arc::new(RegisteredPool {
            register: Box::new(register),
            limit,
            slabs: (0..slabs).map(|_| OnceLock::new()).collect(),
            nslabs: AtomicUsize::new(0),
            free: (0..classes).map(|_| Mutex::new(Vec::new())).collect(),
            grow: Mutex::new(0),
            live: AtomicU64::new(0),
            zero_copy: AtomicU64::new(0),
            copied: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// Most bytes the pool registers.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A buffer of `len` bytes (its block: the next power of two of at least [`MIN_BLOCK`]
    /// bytes). Its contents are unspecified (zeros, or what an earlier buffer of the block
    /// held): fill all of it, or [`RegisteredBytesMut::truncate`] it. A block comes from the
    /// free ones of its size, else from a new slab registered now. Takes a lock of the pool
    /// (uncontended unless several threads allocate at once).
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming the pool's bound when a new slab would take the registered
    /// bytes over it (or `len` is above it), or naming the verbs error when the slab fails to
    /// register. Nothing is taken then.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<RegisteredBytesMut, Status> {
        let block = len.max(MIN_BLOCK).checked_next_power_of_two().unwrap_or(usize::MAX);
        let class = (block / MIN_BLOCK).trailing_zeros() as usize;
        let Some(free) = self.free.get(class) else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "a registered buffer of {len} bytes is larger than the pool's bound of {} bytes",
                self.limit
            )));
        };
        let found = lock(free).pop();
        let (slab, offset) = match found {
            Some(b) => b,
            None => self.grow(class, block, len)?,
        };
        self.live.fetch_add(1, Ordering::Relaxed);
        let s = self.slab(slab as usize).expect("a block names a registered slab");
        Ok(RegisteredBytesMut {
            block: Block {
                pool: self.clone(),
                slab,
                offset,
                class: class as u8,
                addr: s.addr + u64::from(offset),
                len,
            },
        })
    }

    /// Registers a slab for blocks of `block` bytes (class `class`), keeps its first block and
    /// frees the others.
    #[cold]
    fn grow(&self, class: usize, block: usize, len: usize) -> Result<(u32, u32), Status> {
        let mut registered = lock(&self.grow);
        // Another thread may have grown this class meanwhile.
        if let Some(b) = lock(&self.free[class]).pop() {
            return Ok(b);
        }
        let slab_len = block.max(SLAB_BYTES.min(self.limit));
        let n = self.nslabs.load(Ordering::Relaxed);
        if *registered + slab_len > self.limit || n >= self.slabs.len() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "registered buffer pool exhausted: a buffer of {len} bytes needs a slab of {slab_len} \
                 bytes and {} of the pool's bound of {} bytes are registered (give buffers back, or \
                 raise the bound)",
                *registered, self.limit
            )));
        }
        let slab = match (self.register)(slab_len) {
            Ok(s) => s,
            Err(e) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Status::resource_exhausted(format!(
                    "registering a slab of {slab_len} bytes for registered buffers: {e}"
                )));
            }
        };
        let blocks = slab.len / block;
        if self.slabs[n].set(slab).is_err() {
            unreachable!("slabs are added under the pool's lock, each once");
        }
        self.nslabs.store(n + 1, Ordering::Release);
        *registered += slab_len;
        let mut free = lock(&self.free[class]);
        free.extend((1..blocks).rev().map(|i| (n as u32, (i * block) as u32)));
        Ok((n as u32, 0))
    }

    fn slab(&self, i: usize) -> Option<&Slab> {
        self.slabs.get(i)?.get()
    }

    /// The lkey under which `bytes` lies whole in one of this pool's slabs; `None` for memory of
    /// another pool or none. At most one look per slab (a few per pool), no lock.
    #[inline]
    pub(crate) fn lkey_of(&self, bytes: &[u8]) -> Option<u32> {
        let (start, len) = (bytes.as_ptr() as u64, bytes.len() as u64);
        let n = self.nslabs.load(Ordering::Acquire);
        self.slabs[..n.min(self.slabs.len())]
            .iter()
            .filter_map(OnceLock::get)
            .find(|s| s.addr <= start && start + len <= s.addr + s.len as u64)
            .map(|s| s.lkey)
    }

    /// True while a buffer of the pool is alive: only then can a body carry one, and the send
    /// path looks for them.
    #[inline]
    pub(crate) fn has_live(&self) -> bool {
        self.live.load(Ordering::Relaxed) != 0
    }

    /// Counts `n` bytes WRITTEN from this pool's buffers.
    pub(crate) fn count_zero_copy(&self, n: u64) {
        self.zero_copy.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` bytes of this pool's buffers copied instead.
    pub(crate) fn count_copied(&self, n: u64) {
        self.copied.fetch_add(n, Ordering::Relaxed);
    }

    /// What the pool registered and sent so far.
    pub fn stats(&self) -> RegisteredStats {
        RegisteredStats {
            registered_bytes: *lock(&self.grow) as u64,
            live_buffers: self.live.load(Ordering::Relaxed),
            zero_copy_bytes: self.zero_copy.load(Ordering::Relaxed),
            copied_bytes: self.copied.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes of a registered buffer WRITTEN in place at offset `at` of a ring body
/// ([`crate::buffers::SendQueue::write_gather`]), with the lkey of the pool's slab they lie in:
/// made only by [`RegisteredPool::reference`], which checks that they do.
#[derive(Clone, Debug)]
pub struct RegisteredRef {
    pub(crate) at: u32,
    pub(crate) bytes: Bytes,
    pub(crate) lkey: u32,
}

impl RegisteredPool {
    /// `bytes` to be WRITTEN in place at offset `at` of a ring body: `None` unless they lie
    /// whole in one slab of this pool (a buffer of it, or a slice of one).
    pub fn reference(&self, at: u32, bytes: Bytes) -> Option<RegisteredRef> {
        let lkey = self.lkey_of(&bytes)?;
        Some(RegisteredRef { at, bytes, lkey })
    }
}

/// A block of a pool, in use: given back to the pool's free blocks when dropped.
struct Block {
    pool: Arc<RegisteredPool>,
    slab: u32,
    offset: u32,
    class: u8,
    /// Its first byte's address, and the buffer's length (at most the block's).
    addr: u64,
    len: usize,
}

impl Block {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `[addr, addr + len)` lies in a slab of `self.pool` (a block of it, `len` at most
        // the block's size), registered memory allocated and kept alive by the pool's MR, which
        // lives as long as the pool (held by `self.pool`). The block is this value's alone: it
        // left the free list when allocated and returns to it only in `Drop`. The MR grants no
        // remote access, so no peer writes it; the local NIC only reads it (the gather list of
        // a WRITE), and only after the block was frozen into `Bytes` (no `&mut` exists then).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` on the only owner of the block (a
        // `RegisteredBytesMut`, not yet frozen: no WR can name it, since only a `Bytes` reaches
        // the send path) makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        lock(&self.pool.free[usize::from(self.class)]).push((self.slab, self.offset));
        self.pool.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A registered buffer to fill, from [`RegisteredPool::alloc`] (through `Client`, `Channel` or
/// a handler's `RequestContext`). Derefs to its bytes; [`RegisteredBytesMut::freeze`] makes it a
/// `Bytes` to carry in a message's `bytes` field, sent with no copy on a connection of the same
/// protection domain (see the module docs). Dropping it (or the last `Bytes` of it) gives its
/// block back to the pool.
pub struct RegisteredBytesMut {
    block: Block,
}

impl std::fmt::Debug for RegisteredBytesMut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegisteredBytesMut({} bytes)", self.block.len)
    }
}

impl RegisteredBytesMut {
    /// Length in bytes (as allocated, or as truncated).
    pub fn len(&self) -> usize {
        self.block.len
    }

    /// True for a buffer of no bytes.
    pub fn is_empty(&self) -> bool {
        self.block.len == 0
    }

    /// Shortens the buffer to `len` bytes (no effect when it is not longer).
    pub fn truncate(&mut self, len: usize) {
        self.block.len = self.block.len.min(len);
    }

    /// The buffer as `Bytes` (no copy): its block stays taken until the last `Bytes` of it is
    /// dropped, and the send queue holds one until the WRITE that reads it is retired.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self.block)
    }
}

impl Deref for RegisteredBytesMut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.block.as_slice()
    }
}

impl DerefMut for RegisteredBytesMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.block.as_mut_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::sim::Sim;
    use crate::verbs::Context;

    fn pool(limit: usize) -> Arc<RegisteredPool> {
        let ctx = Sim::open(&Default::default()).unwrap();
        RegisteredPool::new::<Sim>(ctx.alloc_pd().unwrap(), limit)
    }

    #[test]
    fn buffers_share_slabs_and_come_back_when_the_last_bytes_is_dropped() {
        let p = pool(16 << 20);
        let mut a = p.alloc(100).unwrap();
        a.fill(7);
        let b = p.alloc(5000).unwrap();
        assert_eq!(p.stats().registered_bytes, 2 * SLAB_BYTES as u64, "one slab per block size");
        let frozen = a.freeze();
        assert_eq!(&frozen[..], &[7u8; 100][..]);
        assert!(p.lkey_of(&frozen[10..20]).is_some());
        assert!(p.lkey_of(&[0u8; 8]).is_none(), "heap memory is not the pool's");
        let part = frozen.slice(1..3);
        drop(frozen);
        assert_eq!(p.stats().live_buffers, 2, "a slice keeps the block");
        drop(part);
        drop(b);
        assert_eq!(p.stats().live_buffers, 0);
        let _again = p.alloc(100).unwrap();
        assert_eq!(p.stats().registered_bytes, 2 * SLAB_BYTES as u64, "reused, not registered again");
    }

    #[test]
    fn over_the_bound_the_allocation_fails_naming_it() {
        let p = pool(8 << 20);
        let a = p.alloc(4 << 20).unwrap();
        let b = p.alloc(3 << 20).unwrap();
        let e = p.alloc(1 << 20).unwrap_err();
        assert_eq!(e.code(), crate::Code::ResourceExhausted);
        assert!(e.message().contains("bound of 8388608 bytes"), "{}", e.message());
        let e = p.alloc(9 << 20).unwrap_err();
        assert!(e.message().contains("larger than the pool's bound"), "{}", e.message());
        assert_eq!(p.stats().refused, 2);
        drop(a);
        let _c = p.alloc(4 << 20).unwrap();
        drop(b);
    }
}
