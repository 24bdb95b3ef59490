//! Registered buffers as owned tokens, and the two unsafe calls of the runtime: posting receive
//! buffers to an SRQ and posting send work requests.
//!
//! The verbs `post_*` calls are `unsafe` because the NIC reads or writes the posted memory until
//! the completion is polled. This module owns that memory and hands it out as values whose
//! ownership says who may touch it, so the rest of the runtime is safe by construction:
//! - [`RecvPool`]: a receive buffer is posted (the NIC may write it; nobody holds a token) or
//!   completed: [`RecvPool::take`] turns its completion into a [`RecvBuf`] token, whose bytes are
//!   readable through the pool while the token lives, and which is posted again only by giving it
//!   back by value ([`RecvPool::repost`]). Reading a posted buffer, or reposting one that is being
//!   read, does not compile.
//! - [`SendPool`]: a send buffer is free (a [`SendBuf`] token; the owner writes it) or posted
//!   (the token was consumed by [`SendQueue::send`]) until a signaled completion at or after its
//!   WR retires it ([`SendPool::retire`]). Inline sends too: their buffer is reused only after a
//!   signaled completion covers its WQE, so the free buffers bound the WQEs outstanding.
//! - [`RecvRing`]: our ring, which the peer may RDMA WRITE at any time. No reference to it is
//!   ever handed out: a body is copied out once ([`RecvRing::copy_out`]) into memory we own.
//! - [`SendMirror`]: the local image of the peer's ring that bodies are encoded into before their
//!   RDMA WRITE. Only the local NIC reads it (it is never exposed to a peer).
//! - [`SendStaging`]: a local byte ring of its own (not tied to the peer's ring offsets) that
//!   bodies the peer's ring cannot take yet are encoded into once; a [`Staged`] token seals the
//!   range, its pieces are WRITTEN from there to whatever ring offsets the session grants, and the
//!   completion of its last WRITE frees it.
//! - [`SendQueue`]: the work requests of one QP collected during a loop iteration and posted with
//!   one doorbell; room in the QP's send queue is checked when a buffer is taken
//!   ([`SendQueue::has_room`]), and selective signaling retires WQEs and buffers.
//!
//! Drop order: every owner declares its QP before these pools, so the QP is destroyed (its WRs
//! discarded) before the memory is deregistered.
//!
//! Misuse does not compile. Reading a buffer after giving it back:
//! ```compile_fail,E0505
//! # use rpc_core::buffers::RecvPool;
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(pool: &mut RecvPool<Sim>, wr_id: u64) {
//!     let buf = pool.take(wr_id, 8).unwrap();
//!     let bytes = pool.bytes(&buf);
//!     pool.repost(buf); // error: `buf` is borrowed by `bytes`, and `pool` too
//!     let _ = bytes[0];
//! }
//! ```
//! Writing a send buffer after posting it:
//! ```compile_fail,E0382
//! # use rpc_core::buffers::{SendPool, SendQueue};
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(pool: &mut SendPool<Sim>, sq: &mut SendQueue) {
//!     let mut buf = pool.acquire().unwrap();
//!     sq.send(pool, buf, 8, false);
//!     pool.buf_mut(&mut buf)[0] = 1; // error: `buf` was moved into the send queue
//! }
//! ```
//! A view of the receive ring does not exist:
//! ```compile_fail,E0599
//! # use rpc_core::buffers::RecvRing;
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(ring: &RecvRing<Sim>) -> &[u8] {
//!     ring.bytes() // error: no such method; only `copy_out`
//! }
//! ```

pub mod bounded;
pub mod gather;
pub use bounded::Bounded;
pub use gather::GatherBody;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::verbs::{
    inc_rkey, AccessFlags, MemoryRegion, MemoryWindow, MwBind, MwType, ProtectionDomain, Provider, QueuePair,
    RecvWr, Result, SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, SrqInitAttr,
};

/// Most WRs posted with one doorbell.
pub const POST_BATCH: usize = 64;

/// WRs per doorbell for small batches (a smaller stack array to fill).
const SMALL_BATCH: usize = 8;

/// Identity of a pool, so that a token is only ever used with the pool it came from.
static NEXT_POOL: AtomicU32 = AtomicU32::new(1);

/// Tokens dropped without being given back (their buffer is lost to its pool until it is
/// dropped); a bug of the runtime, counted and logged.
static LEAKED: AtomicU64 = AtomicU64::new(0);

/// Buffer tokens dropped without being given back to their pool since the process started
/// (0 unless the runtime has a bug; tests assert it).
pub fn leaked_tokens() -> u64 {
    LEAKED.load(Ordering::Relaxed)
}

#[cold]
fn leaked(what: &'static str, idx: u32) {
    LEAKED.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(what, idx, "buffer token dropped without being given back");
}

/// A completed receive buffer: the NIC wrote it and will not again until it is given back with
/// [`RecvPool::repost`]. Its bytes are read through [`RecvPool::bytes`].
#[must_use = "a receive buffer is lost to the SRQ unless given back with RecvPool::repost"]
#[derive(Debug)]
pub struct RecvBuf {
    idx: u32,
    len: u32,
    pool: u32,
}

impl RecvBuf {
    /// Bytes the NIC wrote (the completion's `byte_len`).
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when the message was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        leaked("receive buffer", self.idx);
    }
}

/// Fixed-size receive buffers in one MR, posted to one SRQ.
pub struct RecvPool<P: Provider> {
    srq: P::SharedReceiveQueue,
    mr: P::MemoryRegion,
    buf_size: usize,
    count: u32,
    id: u32,
    /// Per buffer: posted (or queued to be), i.e. no token exists for it.
    posted: Vec<bool>,
    repost: Vec<u32>,
}

impl<P: Provider> RecvPool<P> {
    /// Creates an SRQ of `count` WQEs and `count` buffers of `buf_size` bytes, all posted.
    ///
    /// # Errors
    /// The verbs error of creating the SRQ, registering the MR or posting.
    pub fn new(pd: &P::ProtectionDomain, count: u32, buf_size: usize) -> Result<RecvPool<P>> {
        let srq = pd.create_srq(&SrqInitAttr { max_wr: count, max_sge: 1 })?;
        let mr = pd.reg_mr(count as usize * buf_size, AccessFlags::LOCAL_WRITE)?;
        let mut pool = RecvPool {
            srq,
            mr,
            buf_size,
            count,
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            posted: vec![true; count as usize],
            repost: Vec::with_capacity(count as usize),
        };
        pool.repost.extend(0..count);
        pool.flush()?;
        Ok(pool)
    }

    /// The SRQ the buffers are posted to (QPs are created with it).
    pub fn srq(&self) -> &P::SharedReceiveQueue {
        &self.srq
    }

    /// Bytes of one buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Number of buffers.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Takes the buffer a receive completion names (`wr_id`, `byte_len`): the NIC is done with
    /// it. `None` when `wr_id` is not a buffer of this pool that was posted (a completion seen
    /// twice) or `byte_len` exceeds a buffer; a failed completion's buffer is taken too (to give
    /// it back).
    #[inline]
    pub fn take(&mut self, wr_id: u64, byte_len: u32) -> Option<RecvBuf> {
        let idx = u32::try_from(wr_id).ok().filter(|&i| i < self.count)?;
        let posted = &mut self.posted[idx as usize];
        if !*posted {
            return None;
        }
        *posted = false;
        let len = if byte_len as usize <= self.buf_size { byte_len } else { self.buf_size as u32 + 1 };
        Some(RecvBuf { idx, len, pool: self.id })
    }

    /// The bytes the NIC wrote into `buf`: empty when `buf` is not of this pool, or when its
    /// completion reported more bytes than a buffer holds (see [`RecvPool::fits`]).
    #[inline]
    pub fn bytes<'a>(&'a self, buf: &'a RecvBuf) -> &'a [u8] {
        if buf.pool != self.id || buf.len as usize > self.buf_size {
            return &[];
        }
        let start = buf.idx as usize * self.buf_size;
        // SAFETY: `[start, start + len)` lies in `self.mr` (idx < count, len <= buf_size), which
        // lives as long as `&self`. A token exists only for a buffer whose completion was polled
        // and that is not posted: `take` cleared its `posted` flag and only `repost` (which takes
        // the token by value, so not while this borrow of it lives) queues it again. So neither
        // the NIC nor a peer (a SEND lands only in a posted buffer) writes it while the slice lives.
        unsafe {
            std::slice::from_raw_parts((self.mr.addr() as usize + start) as *const u8, buf.len as usize)
        }
    }

    /// Whether the completion's byte count fit the buffer (a longer one is a provider fault).
    pub fn fits(&self, buf: &RecvBuf) -> bool {
        buf.len as usize <= self.buf_size
    }

    /// Gives a buffer back; it is posted again by the next [`RecvPool::flush`]. A token of
    /// another pool is dropped (and counted as leaked).
    #[inline]
    pub fn repost(&mut self, buf: RecvBuf) {
        if buf.pool != self.id {
            return;
        }
        let idx = buf.idx;
        std::mem::forget(buf);
        self.posted[idx as usize] = true;
        self.repost.push(idx);
    }

    /// Buffers waiting to be posted again.
    pub fn pending_reposts(&self) -> usize {
        self.repost.len()
    }

    /// Posts every given-back buffer, [`POST_BATCH`] per doorbell. Allocates nothing.
    ///
    /// # Errors
    /// The verbs error of posting; buffers not posted stay queued.
    pub fn flush(&mut self) -> Result<()> {
        while !self.repost.is_empty() {
            if self.repost.len() <= SMALL_BATCH {
                self.post_chunk::<SMALL_BATCH>()?;
            } else {
                self.post_chunk::<POST_BATCH>()?;
            }
        }
        Ok(())
    }

    /// Posts the given-back buffers once `threshold` of them wait (batched reposting).
    ///
    /// # Errors
    /// As [`RecvPool::flush`].
    pub fn flush_batched(&mut self, threshold: usize) -> Result<()> {
        if self.repost.len() >= threshold {
            self.flush()
        } else {
            Ok(())
        }
    }

    fn post_chunk<const N: usize>(&mut self) -> Result<()> {
        let n = self.repost.len().min(N);
        let first = self.repost.len() - n;
        let mut sges = [Sge::default(); N];
        for (sge, &idx) in sges.iter_mut().zip(&self.repost[first..]) {
            *sge = self.mr.sge(idx as usize * self.buf_size, self.buf_size as u32);
        }
        let mut wrs = [RecvWr { wr_id: 0, sg_list: &[] }; N];
        for (i, wr) in wrs.iter_mut().enumerate().take(n) {
            *wr = RecvWr { wr_id: u64::from(self.repost[first + i]), sg_list: &sges[i..i + 1] };
        }
        // SAFETY: every SGE lies in `self.mr` (LOCAL_WRITE), which lives as long as this pool;
        // each buffer was given back by value (`repost`), so no token and no slice of it exists
        // (`bytes` borrows a token); the owner drops its QPs before this pool, and a dropped MR is
        // deregistered, so the NIC cannot write freed memory.
        unsafe { self.srq.post_recv(&wrs[..n]) }?;
        self.repost.truncate(first);
        Ok(())
    }
}

/// A free send buffer: the owner writes it ([`SendPool::buf_mut`]) and then posts it
/// ([`SendQueue::send`], which consumes the token) or gives it back ([`SendPool::give_back`]).
#[must_use = "a send buffer is lost to its pool unless sent or given back"]
#[derive(Debug)]
pub struct SendBuf {
    idx: u16,
    pool: u32,
}

impl Drop for SendBuf {
    fn drop(&mut self) {
        leaked("send buffer", u32::from(self.idx));
    }
}

/// Fixed-size send buffers of one connection in one MR, with their free list.
pub struct SendPool<P: Provider> {
    mr: P::MemoryRegion,
    buf_size: usize,
    id: u32,
    free: Vec<u16>,
    /// Buffers of posted WRs, in posting order, until a signaled completion retires them.
    posted: VecDeque<u16>,
    /// Buffers taken and neither posted nor given back (each will need up to 2 WQEs).
    out: usize,
}

impl<P: Provider> SendPool<P> {
    /// Registers `count` buffers of `buf_size` bytes.
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn new(pd: &P::ProtectionDomain, count: u16, buf_size: usize) -> Result<SendPool<P>> {
        let mr = pd.reg_mr(count as usize * buf_size, AccessFlags::LOCAL_WRITE)?;
        Ok(SendPool {
            mr,
            buf_size,
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            free: (0..count).rev().collect(),
            posted: VecDeque::with_capacity(count as usize),
            out: 0,
        })
    }

    /// Bytes of one buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Takes a free buffer.
    #[inline]
    pub fn acquire(&mut self) -> Option<SendBuf> {
        let idx = self.free.pop()?;
        self.out += 1;
        Some(SendBuf { idx, pool: self.id })
    }

    /// Takes a free buffer when the send queue has room for its WRs (a WRITE and a SEND) on top
    /// of those of every buffer already taken.
    #[inline]
    pub fn acquire_for(&mut self, sq: &SendQueue) -> Option<SendBuf> {
        if !sq.has_room(2 * (self.out + 1)) {
            return None;
        }
        self.acquire()
    }

    /// Free buffers.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Returns a buffer that was taken but not posted.
    #[inline]
    pub fn give_back(&mut self, buf: SendBuf) {
        if buf.pool != self.id {
            return;
        }
        let idx = buf.idx;
        std::mem::forget(buf);
        self.out -= 1;
        self.free.push(idx);
    }

    /// The bytes of a taken buffer, to write the message into. Empty for a token of another pool.
    #[inline]
    pub fn buf_mut<'a>(&'a mut self, buf: &'a mut SendBuf) -> &'a mut [u8] {
        if buf.pool != self.id {
            return &mut [];
        }
        let start = buf.idx as usize * self.buf_size;
        // SAFETY: the range lies in `self.mr`, alive as long as `&mut self`. The token exists only
        // while the buffer is neither posted nor free (`acquire` made it, `send`/`give_back`
        // consume it), so the NIC does not read it, no other token names it, and both borrows
        // (`&mut self`, `&mut buf`) make this the only view.
        unsafe { std::slice::from_raw_parts_mut((self.mr.addr() as usize + start) as *mut u8, self.buf_size) }
    }

    fn sge(&self, idx: u16, len: u32) -> Sge {
        self.mr.sge(idx as usize * self.buf_size, len)
    }

    /// A signaled completion retired `count` buffers (the oldest posted ones).
    pub fn retire(&mut self, count: usize) {
        for _ in 0..count {
            match self.posted.pop_front() {
                Some(b) => self.free.push(b),
                None => break,
            }
        }
    }

    /// Every posted buffer becomes free (the QP was destroyed or flushed).
    pub fn retire_all(&mut self) {
        while let Some(b) = self.posted.pop_front() {
            self.free.push(b);
        }
    }
}

/// Our ring, registered for the peer's RDMA WRITEs. The peer may write any byte of it at any
/// time, so it is never read in place: bodies are copied out.
///
/// With memory windows ([`RecvRing::with_window`], the default where the device has type-2
/// windows), the MR itself grants no remote access: the peer reaches the ring only through a
/// type-2 window bound to this connection's QP ([`SendQueue::bind_window`]), so a peer using the
/// rkey over another connection gets REM_ACCESS_ERR and writes nothing. Field order is drop
/// order: the window is deallocated before the MR is deregistered.
pub struct RecvRing<P: Provider> {
    mw: Option<(P::MemoryWindow, u32)>,
    mr: P::MemoryRegion,
}

impl<P: Provider> RecvRing<P> {
    /// Registers a ring of `len` bytes that any QP of the PD can reach with its rkey:
    /// `LOCAL_WRITE | REMOTE_WRITE` (the fallback where the device has no type-2 windows).
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn new(pd: &P::ProtectionDomain, len: usize) -> Result<RecvRing<P>> {
        Ok(RecvRing { mw: None, mr: pd.reg_mr(len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)? })
    }

    /// Registers a ring of `len` bytes for local access and window binding only
    /// (`LOCAL_WRITE | MW_BIND`) and allocates the type-2 window that will expose it; the rkey
    /// the peer gets ([`RecvRing::remote`]) is the window's after its bind. Post the bind with
    /// [`SendQueue::bind_window`] on the connection's QP, in RTS, before the peer may write.
    ///
    /// # Errors
    /// The verbs error of registering or of allocating the window (no type-2 windows, `max_mw`).
    pub fn with_window(pd: &P::ProtectionDomain, len: usize) -> Result<RecvRing<P>> {
        let mr = pd.reg_mr(len, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
        let mw = pd.alloc_mw(MwType::Type2)?;
        let rkey = inc_rkey(mw.rkey());
        Ok(RecvRing { mw: Some((mw, rkey)), mr })
    }

    /// Whether the peer reaches the ring through a window bound to one QP (else through the MR's
    /// rkey, from any QP of the PD).
    pub fn has_window(&self) -> bool {
        self.mw.is_some()
    }

    /// Address, length and rkey for the handshake (the window's rkey when there is one).
    pub fn remote(&self) -> (u64, u32, u32) {
        let rkey = self.mw.as_ref().map_or(self.mr.rkey(), |(_, k)| *k);
        (self.mr.addr(), self.mr.len() as u32, rkey)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// True for an empty ring (never: rings are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// Appends the `len` bytes at `offset` to `dst` (one copy; `dst` grows by exactly what is
    /// missing if needed: the caller sizes it). A peer
    /// writing the range meanwhile can only change which bytes are copied, never what happens
    /// to them afterwards: from here on they are ours. Returns false, copying nothing, when the
    /// range is outside the ring or `dst` cannot grow (no memory).
    #[inline]
    pub fn copy_out(&self, offset: u32, len: u32, dst: &mut Vec<u8>) -> bool {
        let (o, n) = (offset as usize, len as usize);
        if o.checked_add(n).is_none_or(|end| end > self.mr.len()) {
            return false;
        }
        if dst.try_reserve_exact(n).is_err() {
            return false;
        }
        let at = dst.len();
        // SAFETY: the source range lies in `self.mr` (checked above), alive for `&self`; the
        // destination is `n` bytes of `dst`'s spare capacity (reserved above), which no one else
        // can reach. The copy goes through raw pointers: no reference to ring memory is formed,
        // so a concurrent RDMA WRITE by the peer (outside this process's control) only decides
        // the copied values. After the copy those bytes are initialized, so `set_len` is valid.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.mr.addr() as usize + o) as *const u8,
                dst.as_mut_ptr().add(at),
                n,
            );
            dst.set_len(at + n);
        }
        true
    }
}

/// The local image of the peer's ring: bodies are encoded at the offset they will have in the
/// peer's ring, then RDMA WRITTEN there. Registered for local access only: no peer can write it.
pub struct SendMirror<P: Provider> {
    mr: P::MemoryRegion,
}

impl<P: Provider> SendMirror<P> {
    /// Registers a mirror of `len` bytes (the peer's ring length): `LOCAL_WRITE`.
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn new(pd: &P::ProtectionDomain, len: usize) -> Result<SendMirror<P>> {
        Ok(SendMirror { mr: pd.reg_mr(len, AccessFlags::LOCAL_WRITE)? })
    }

    /// The whole mirror, to encode bodies into at offsets the session reserved (see
    /// [`SendMirror::range_mut`] for why this view is sound).
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.mr.len() as u32;
        self.range_mut(0, len)
    }

    /// The bytes `[offset, offset + len)`, to encode a body into: a range the session reserved
    /// in the peer's ring (so no posted WRITE still reads it). Empty when out of bounds.
    #[inline]
    pub fn range_mut(&mut self, offset: u32, len: u32) -> &mut [u8] {
        let (o, n) = (offset as usize, len as usize);
        if o.checked_add(n).is_none_or(|end| end > self.mr.len()) {
            return &mut [];
        }
        // SAFETY: the range lies in `self.mr` (checked), alive for `&mut self`, which makes this
        // the only view. The mirror is never posted as a receive target nor exposed with a remote
        // key, so nothing writes it behind us; the local NIC only reads ranges of posted WRITEs,
        // and the session reserves a range again only after the peer reported it freed, which it
        // does after the SEND that followed that WRITE arrived (RC order: the WRITE was done).
        unsafe { std::slice::from_raw_parts_mut((self.mr.addr() as usize + o) as *mut u8, n) }
    }
}

/// A body encoded into the [`SendStaging`] area, sealed: no view of its bytes exists any more; its
/// range is read only by the RDMA WRITEs of its pieces ([`SendQueue::write_staged`]) and is free
/// again once the completion of the WRITE of its last piece is polled, or when it is given back
/// unsent ([`SendStaging::release`]).
#[must_use = "a staged body holds staging space until it is written or released"]
#[derive(Debug, PartialEq, Eq)]
pub struct Staged {
    seq: u32,
    offset: u32,
    len: u32,
    pool: u32,
}

impl Staged {
    /// Length of the body in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True for an empty body.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A connection's registered staging area for bodies that cannot be placed in the peer's ring
/// when they are encoded (ring full, or larger than a piece): a byte ring of its own, unrelated to
/// the peer's ring offsets. A body is encoded into it once ([`SendStaging::spare_mut`], then
/// [`SendStaging::commit`]) and its pieces are RDMA WRITTEN from it to whatever offsets the
/// peer's ring grants, so no heap copy and no allocation is needed. Space is allocated at the tail
/// and freed in allocation order once every earlier range was freed too (ranges may finish out of
/// order). Registered for local access only: no peer can write it.
pub struct SendStaging<P: Provider> {
    mr: P::MemoryRegion,
    len: u32,
    id: u32,
    /// Bytes allocated so far (ranges plus skipped ends).
    tail: u64,
    /// Bytes freed so far, in order.
    head: u64,
    /// Physical offset of the next allocation.
    pos: u32,
    /// Allocated, not yet freed ranges, oldest first: (end counter, finished).
    pending: VecDeque<(u64, bool)>,
    /// Sequence number of `pending[0]`.
    first_seq: u32,
}

impl<P: Provider> SendStaging<P> {
    /// Registers a staging area of `len` bytes (`LOCAL_WRITE`); room for `bodies` ranges at once
    /// is allocated here (more grow the list).
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn new(pd: &P::ProtectionDomain, len: u32, bodies: usize) -> Result<SendStaging<P>> {
        let len = len.max(1);
        Ok(SendStaging {
            mr: pd.reg_mr(len as usize, AccessFlags::LOCAL_WRITE)?,
            len,
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            tail: 0,
            head: 0,
            pos: 0,
            pending: VecDeque::with_capacity(bodies),
            first_seq: 0,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false: the area has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated and not yet freed (skipped ends included).
    pub fn used(&self) -> u64 {
        self.tail - self.head
    }

    /// The largest contiguous free span a body can be encoded into now: `(offset, length)`, and
    /// how many bytes before the end of the area its allocation skips.
    fn spare(&self) -> (u32, u32, u32) {
        let used = self.used();
        if used == 0 {
            return (0, self.len, 0);
        }
        let free = u64::from(self.len).saturating_sub(used) as u32;
        let till_end = self.len - self.pos;
        if till_end >= free {
            (self.pos, free, 0)
        } else if till_end >= free - till_end {
            (self.pos, till_end, 0)
        } else {
            (0, free - till_end, till_end)
        }
    }

    /// The largest contiguous free span: its offset and its bytes, to encode a body into; then
    /// [`SendStaging::commit`] the bytes written. Empty when the area is full.
    #[inline]
    pub fn spare_mut(&mut self) -> (u32, &mut [u8]) {
        let (offset, n, _) = self.spare();
        // SAFETY: `[offset, offset + n)` lies in `self.mr` (`spare` stays within `len`, the MR's
        // length), alive for `&mut self`, which makes this the only view. It is free space: no
        // allocated range overlaps it, and the local NIC reads only allocated ranges (a WRITE is
        // queued only for a `Staged` token, whose range stays allocated until the completion of
        // its last WRITE is polled). The area is never a receive target nor exposed with a remote
        // key, so nothing else writes it.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut((self.mr.addr() as usize + offset as usize) as *mut u8, n as usize)
        };
        (offset, bytes)
    }

    /// Allocates the first `len` bytes (at least 1) of the span [`SendStaging::spare_mut`]
    /// returned at `offset` (the body written there) and seals them: no view of them is given
    /// out again until they are freed. `None` when `offset` and `len` are not within the current
    /// spare span.
    pub fn commit(&mut self, offset: u32, len: u32) -> Option<Staged> {
        let (at, n, skip) = self.spare();
        if offset != at || len == 0 || len > n {
            return None;
        }
        if self.used() == 0 {
            self.pos = 0;
        }
        self.tail += u64::from(skip) + u64::from(len);
        self.pos = if offset + len == self.len { 0 } else { offset + len };
        let seq = self.first_seq.wrapping_add(self.pending.len() as u32);
        self.pending.push_back((self.tail, false));
        Some(Staged { seq, offset, len, pool: self.id })
    }

    /// Gives back a staged body that will not be sent (nothing of it is posted).
    pub fn release(&mut self, staged: Staged) {
        if staged.pool == self.id {
            self.finish(staged.seq);
        }
    }

    fn finish(&mut self, seq: u32) {
        let idx = seq.wrapping_sub(self.first_seq) as usize;
        if let Some(e) = self.pending.get_mut(idx) {
            e.1 = true;
        }
        while let Some(&(end, true)) = self.pending.front() {
            self.head = end;
            self.pending.pop_front();
            self.first_seq = self.first_seq.wrapping_add(1);
        }
    }

    /// Everything is free (the QP was destroyed or flushed: no WRITE reads the area any more).
    pub fn reset(&mut self) {
        self.pending.clear();
        self.first_seq = 0;
        self.head = self.tail;
        self.pos = 0;
    }
}

#[derive(Clone, Copy)]
struct PendingWr {
    sge: Sge,
    op: SendOp,
    /// Send buffer the WR uses (the SEND of a message), or `u16::MAX` (a WRITE).
    buf: u16,
    /// Staged range whose last WRITE this is (freed by its completion), or `u32::MAX`.
    staged: u32,
    /// Copied into the WQE at post time.
    inline: bool,
}

/// The send WRs of one QP gathered during a loop iteration, posted with one doorbell.
pub struct SendQueue {
    pending: Vec<PendingWr>,
    /// WRs posted and not yet retired by a signaled completion.
    outstanding: usize,
    /// WRs posted since the last signaled one.
    unsignaled: usize,
    /// Send buffers posted since the last signaled WR.
    unsignaled_bufs: usize,
    /// Send queue depth in WQEs.
    depth: usize,
    /// Signal at least every this many send buffers (so free buffers never run out waiting).
    signal_bufs: usize,
    /// WRs posted so far.
    posted: u64,
    /// WRs retired by polled completions so far.
    completed: u64,
    /// Staged ranges whose last WRITE is posted, in posting order: (value of `posted` once that
    /// WRITE is posted, range sequence number).
    staged: VecDeque<(u64, u32)>,
}

impl SendQueue {
    /// A queue for a QP whose send queue holds `depth` WQEs and whose pool has `bufs` send
    /// buffers.
    pub fn new(depth: usize, bufs: usize) -> SendQueue {
        SendQueue {
            pending: Vec::with_capacity(depth),
            outstanding: 0,
            unsignaled: 0,
            unsignaled_bufs: 0,
            depth,
            signal_bufs: (bufs / 4).clamp(1, 16),
            posted: 0,
            completed: 0,
            staged: VecDeque::with_capacity(bufs),
        }
    }

    /// WRs waiting for the next flush.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Room for `n` more WRs in the send queue (posted and not retired, plus pending).
    #[inline]
    pub fn has_room(&self, n: usize) -> bool {
        self.outstanding + self.pending.len() + n <= self.depth
    }

    /// WRs posted and not yet retired by a polled signaled completion.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Queues an RDMA WRITE of `mirror[offset, offset + len)` to the peer's ring at the same offset.
    pub fn write<P: Provider>(
        &mut self,
        mirror: &SendMirror<P>,
        offset: u32,
        len: u32,
        ring_addr: u64,
        rkey: u32,
    ) {
        self.pending.push(PendingWr {
            sge: mirror.mr.sge(offset as usize, len),
            op: SendOp::RdmaWrite { remote_addr: ring_addr + u64::from(offset), rkey },
            buf: u16::MAX,
            staged: u32::MAX,
            inline: false,
        });
    }

    /// Queues an RDMA WRITE of `staged[from, from + len)` to the peer's ring at `remote_addr`.
    /// Returns the token while bytes after this piece remain; the WRITE of the last piece consumes
    /// it (its range is freed by the completion covering that WRITE, see
    /// [`SendQueue::retire_staged`]). A piece outside the body, or a token of another staging
    /// area, queues nothing and gives the token back.
    pub fn write_staged<P: Provider>(
        &mut self,
        staging: &SendStaging<P>,
        staged: Staged,
        from: u32,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> Option<Staged> {
        if staged.pool != staging.id || from.checked_add(len).is_none_or(|end| end > staged.len) {
            return Some(staged);
        }
        let last = from + len == staged.len;
        self.pending.push(PendingWr {
            sge: staging.mr.sge((staged.offset + from) as usize, len),
            op: SendOp::RdmaWrite { remote_addr, rkey },
            buf: u16::MAX,
            staged: if last { staged.seq } else { u32::MAX },
            inline: false,
        });
        if last {
            None
        } else {
            Some(staged)
        }
    }

    /// Queues a SEND of the first `len` bytes of send buffer `buf` (consumed: it is the NIC's
    /// until a signaled completion retires it); with `inline`, the bytes are copied into the WQE
    /// (`len` must not exceed the QP's `max_inline_data`). A token of another pool is dropped.
    #[inline]
    pub fn send<P: Provider>(&mut self, pool: &mut SendPool<P>, buf: SendBuf, len: u32, inline: bool) {
        if buf.pool != pool.id {
            return;
        }
        let idx = buf.idx;
        std::mem::forget(buf);
        pool.out -= 1;
        let len = len.min(pool.buf_size as u32);
        self.pending.push(PendingWr {
            sge: pool.sge(idx, len),
            op: SendOp::Send,
            buf: idx,
            staged: u32::MAX,
            inline,
        });
    }

    /// Posts everything queued with one doorbell per [`POST_BATCH`] WRs. The last WR of a batch
    /// is signaled when the batch holds non-inline sends, or a quarter of the send buffers (at
    /// most 16) or half the send queue went unsignaled; its `wr_id` carries `tag`, the number of
    /// WRs and of send buffers its completion retires ([`split_send_wr_id`]). Allocates nothing.
    ///
    /// # Errors
    /// The verbs error of posting; the QP is then unusable (the caller closes the connection).
    pub fn flush<P: Provider>(&mut self, qp: &P::QueuePair, pool: &mut SendPool<P>, tag: u32) -> Result<()> {
        while !self.pending.is_empty() {
            if self.pending.len() == 1 {
                // The latency case: one message, nothing to fill but one WR.
                self.post_chunk::<P, 1>(qp, pool, tag)?;
            } else if self.pending.len() <= SMALL_BATCH {
                self.post_chunk::<P, SMALL_BATCH>(qp, pool, tag)?;
            } else {
                self.post_chunk::<P, POST_BATCH>(qp, pool, tag)?;
            }
        }
        Ok(())
    }

    fn post_chunk<P: Provider, const N: usize>(
        &mut self,
        qp: &P::QueuePair,
        pool: &mut SendPool<P>,
        tag: u32,
    ) -> Result<()> {
        let n = self.pending.len().min(N);
        let mut bufs = 0usize;
        let mut dma_bufs = false;
        let mut wrs = [SendWr { wr_id: 0, sg_list: &[], op: SendOp::Send, flags: SendFlags::EMPTY }; N];
        for (wr, p) in wrs.iter_mut().zip(&self.pending[..n]) {
            let flags = if p.inline { SendFlags::INLINE } else { SendFlags::EMPTY };
            *wr = SendWr { wr_id: 0, sg_list: std::slice::from_ref(&p.sge), op: p.op, flags };
            if p.buf != u16::MAX {
                bufs += 1;
                dma_bufs |= !p.inline;
            }
            // A staged range is free again only with the completion of its last WRITE.
            dma_bufs |= p.staged != u32::MAX;
        }
        // Selective signaling: a completion retires WQEs and send buffers. Buffers the NIC reads
        // by DMA want it soon; inline ones only before the free list runs low.
        let unsignaled = self.unsignaled + n;
        let unsignaled_bufs = self.unsignaled_bufs + bufs;
        let signal = dma_bufs || unsignaled_bufs >= self.signal_bufs || unsignaled >= (self.depth / 2).max(1);
        if signal {
            wrs[n - 1].flags |= SendFlags::SIGNALED;
            wrs[n - 1].wr_id = send_wr_id(tag, unsignaled as u16, unsignaled_bufs as u16);
        }
        // SAFETY: every SGE lies in a send buffer of `pool`, in the send mirror or in the staging
        // area, MRs owned next to `qp` by the same connection and dropped after it. A send
        // buffer's token was consumed by `send`, so nothing writes it until a signaled completion
        // at or after its WR retires it (`retire`, from that completion's count); a mirror range
        // is not reserved again until the peer reports it freed, which it does only after the
        // SEND that follows the WRITE arrived; a staged range stays allocated (no view of it is
        // handed out) until the signaled completion at or after its last WRITE is polled
        // (`retire_staged`; every batch with such a WRITE is signaled). `has_room`, checked when each buffer was taken, keeps the posted
        // WQEs within the send queue.
        unsafe { qp.post_send(&wrs[..n]) }?;
        for (i, p) in self.pending[..n].iter().enumerate() {
            if p.buf != u16::MAX {
                pool.posted.push_back(p.buf);
            }
            if p.staged != u32::MAX {
                self.staged.push_back((self.posted + i as u64 + 1, p.staged));
            }
        }
        self.posted += n as u64;
        self.outstanding += n;
        if signal {
            self.unsignaled = 0;
            self.unsignaled_bufs = 0;
        } else {
            self.unsignaled = unsignaled;
            self.unsignaled_bufs = unsignaled_bufs;
        }
        if n == self.pending.len() {
            // The usual case (one batch): no drain bookkeeping for `Copy` entries.
            self.pending.clear();
        } else {
            self.pending.drain(..n);
        }
        Ok(())
    }

    /// Binds `ring`'s window to `qp` (a signaled BIND_MW WR, one WQE of this queue, whose
    /// completion carries `tag` and retires it like any other): from that completion on, the
    /// peer of `qp`, and only it, can RDMA WRITE the ring with [`RecvRing::remote`]'s rkey.
    /// Nothing is posted for a ring without a window. Posted at once, before anything queued.
    ///
    /// # Errors
    /// The verbs error of posting (QP not in RTS, send queue full).
    pub fn bind_window<P: Provider>(
        &mut self,
        qp: &P::QueuePair,
        ring: &RecvRing<P>,
        tag: u32,
    ) -> Result<()> {
        let Some((mw, rkey)) = &ring.mw else { return Ok(()) };
        let bind = MwBind {
            mr: ring.mr.handle(),
            addr: ring.mr.addr(),
            length: ring.mr.len() as u64,
            access: AccessFlags::REMOTE_WRITE,
        };
        let wr = SendWr {
            wr_id: send_wr_id(tag, 1, 0),
            sg_list: &[],
            op: SendOp::BindMw { mw: mw.handle(), rkey: *rkey, bind },
            flags: SendFlags::SIGNALED,
        };
        // SAFETY: a bind WR has no SGEs; the window and the MR it names are owned by `ring`,
        // which the caller keeps next to `qp` (the connection's fields), and only this call binds
        // that window, once, from the thread that owns the connection.
        unsafe { qp.post_send(std::slice::from_ref(&wr)) }?;
        self.outstanding += 1;
        Ok(())
    }

    /// A signaled completion retired `wrs` WRs (from its `wr_id`, see [`split_send_wr_id`]).
    pub fn on_completion(&mut self, wrs: u16) {
        self.outstanding = self.outstanding.saturating_sub(usize::from(wrs));
        self.completed = (self.completed + u64::from(wrs)).min(self.posted);
    }

    /// Frees the staged ranges whose last WRITE a polled completion retired (call after
    /// [`SendQueue::on_completion`]).
    #[inline]
    pub fn retire_staged<P: Provider>(&mut self, staging: &mut SendStaging<P>) {
        while let Some(&(at, seq)) = self.staged.front() {
            if at > self.completed {
                break;
            }
            self.staged.pop_front();
            staging.finish(seq);
        }
    }

    /// Every posted WR is gone (the QP was destroyed or flushed). Queued sends are dropped: their
    /// buffers go back to `pool`; the caller resets the staging area ([`SendStaging::reset`]).
    pub fn reset<P: Provider>(&mut self, pool: &mut SendPool<P>) {
        for p in self.pending.drain(..) {
            if p.buf != u16::MAX {
                pool.free.push(p.buf);
            }
        }
        self.outstanding = 0;
        self.unsignaled = 0;
        self.unsignaled_bufs = 0;
        self.staged.clear();
        self.completed = self.posted;
    }
}

/// Bit set in the `wr_id` of every signaled send WR (receive WRs carry a buffer index below 2^32).
const SEND_WR_BIT: u64 = 1 << 63;

/// The `wr_id` of a signaled send WR: connection tag, WRs and send buffers it retires.
pub fn send_wr_id(tag: u32, wrs: u16, bufs: u16) -> u64 {
    SEND_WR_BIT | (u64::from(tag & 0x7fff_ffff) << 32) | (u64::from(wrs) << 16) | u64::from(bufs)
}

/// Splits a send `wr_id` into (tag, WRs, buffers); `None` for a receive `wr_id`.
pub fn split_send_wr_id(wr_id: u64) -> Option<(u32, u16, u16)> {
    (wr_id & SEND_WR_BIT != 0).then_some((
        ((wr_id >> 32) as u32) & 0x7fff_ffff,
        (wr_id >> 16) as u16,
        wr_id as u16,
    ))
}
