//! Registered buffers as owned tokens, and the two unsafe calls of the runtime: posting receive
//! buffers to an SRQ and posting send work requests.
//!
//! The verbs `post_*` calls are `unsafe` because the NIC reads or writes the posted memory until
//! the completion is polled. This module owns that memory and hands it out as values whose
//! ownership says who may touch it, so the rest of the runtime is safe by construction:
//! - [`RecvPool`]: a receive buffer is posted (the NIC may write it; nobody holds a token) or
//!   completed: [`RecvPool::take`] turns its polled [`Completion`] into a [`RecvBuf`] token, whose
//!   bytes are readable through the pool while the token lives, and which is posted again only by
//!   giving it back by value ([`RecvPool::repost`]). Reading a posted buffer, or reposting one that
//!   is being read, does not compile.
//! - [`SendPool`]: a send buffer is free (on the pool's free list, or a [`SendBuf`] token: the
//!   owner writes it) or posted (the token was consumed by [`SendQueue::send`]). An inline
//!   SEND's buffer is free again once the post returned (the WQE holds a copy of its bytes); a
//!   DMA SEND's stays with the [`SendQueue`] that posted it until a polled completion of a
//!   signaled WR at or after it retires it ([`SendQueue::on_completion`]; every batch with one
//!   is signaled) or its QP is destroyed ([`SendQueue::reclaim`]). The pool keeps only the free
//!   list, so many queues can share one (a server worker's sessions: [`SendPool::growable`]);
//!   the queue's own WQE count bounds its WRs outstanding ([`SendQueue::has_room`]).
//! - [`RecvRing`]: our ring, which the peer may RDMA WRITE at any time. No reference to it is
//!   ever handed out: a body is copied out once ([`RecvRing::copy_out`], atomic loads) into
//!   memory we own.
//! - [`SendMirror`]: the local image of the peer's ring that bodies are encoded into before their
//!   RDMA WRITE. Only the local NIC reads it (it is never exposed to a peer). No view of all of it
//!   exists: the runtime encodes into one range its session reserved at a time, and the public
//!   way in is a copy ([`SendMirror::write_at`]).
//! - [`SendStaging`]: a local byte ring of its own (not tied to the peer's ring offsets) that
//!   bodies the peer's ring cannot take yet are encoded into once; a [`Staged`] token seals the
//!   range, its pieces are WRITTEN from there to whatever ring offsets the session grants, and the
//!   polled completion of its last WRITE frees it.
//! - [`SendQueue`]: the work requests of one QP collected during a loop iteration and posted with
//!   one doorbell; room in the QP's send queue is checked when a buffer is taken
//!   ([`SendQueue::has_room`]), and selective signaling retires WQEs and buffers.
//!
//! **Completions are the proof.** Memory a posted WR uses comes back only with a [`Completion`]:
//! only [`Completions::poll`] makes one, from a CQ, at most once per CQE; it is neither `Clone`
//! nor `Copy`, and [`RecvPool::take`] or [`SendQueue::on_completion`] consumes it. A receive WR's
//! `wr_id` names its pool (so another pool's completion takes nothing), and a send WR's names
//! its queue, which posts to one QP from one pool and remembers what each signaled WR retires (so
//! a completion of another queue or QP retires nothing). `wr_id`s from 2^32 up are this module's
//! ([`RESERVED_WR_IDS`]). A [`crate::verbs::WorkCompletion`] is plain data and proves nothing.
//!
//! Drop order: every owner declares its QP before these pools, so the QP is destroyed (its WRs
//! discarded) before the memory is deregistered. That is also the only way posted memory comes
//! back without completions: moving a QP to ERR proves nothing until its flushed WRs are polled.
//!
//! Misuse does not compile. Reading a buffer after giving it back:
//! ```compile_fail,E0505
//! # use rpc_core::buffers::{Completion, RecvPool};
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(pool: &mut RecvPool<Sim>, c: Completion) {
//!     let buf = pool.take(c).unwrap();
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
//! Taking a receive buffer that is still posted (its `wr_id` guessed, or read from another
//! completion): [`RecvPool::take`] wants a [`Completion`], which only a poll makes:
//! ```compile_fail,E0451
//! # use rpc_core::buffers::{Completion, RecvBuf, RecvPool};
//! # use rpc_core::verbs::{sim::Sim, WorkCompletion};
//! fn misuse(pool: &mut RecvPool<Sim>, wc: WorkCompletion) -> Option<RecvBuf> {
//!     pool.take(Completion { wc }) // error: `Completion`'s field is private
//! }
//! ```
//! Taking it twice with one completion:
//! ```compile_fail,E0382
//! # use rpc_core::buffers::{Completions, RecvPool};
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(pool: &mut RecvPool<Sim>, wcs: &mut Completions<8>) {
//!     let c = wcs.next().unwrap();
//!     let a = pool.take(c);
//!     let b = pool.take(c); // error: `c` was consumed by the first `take`
//! }
//! ```
//! Freeing send buffers without a completion ([`SendPool`]'s `free_posted` is private, and
//! `retire_all` is gone):
//! ```compile_fail,E0624
//! # use rpc_core::buffers::SendPool;
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(pool: &mut SendPool<Sim>) {
//!     pool.free_posted(4); // error: private method
//! }
//! ```
//! ```compile_fail,E0599
//! # use rpc_core::buffers::SendPool;
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(pool: &mut SendPool<Sim>) {
//!     pool.retire_all(); // error: no such method
//! }
//! ```
//! Retiring WRs by a count instead of a completion:
//! ```compile_fail,E0308
//! # use rpc_core::buffers::{SendPool, SendQueue};
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(sq: &mut SendQueue, pool: &mut SendPool<Sim>) {
//!     sq.on_completion(4, pool); // error: expected `Completion`, found integer
//! }
//! ```
//! Declaring every posted WR gone while the QP may still run them (`SendQueue::reset` and
//! `SendStaging::reset` are gone; [`SendQueue::discard_pending`] gives back only WRs never
//! posted):
//! ```compile_fail,E0599
//! # use rpc_core::buffers::{SendPool, SendQueue};
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(sq: &mut SendQueue, pool: &mut SendPool<Sim>) {
//!     sq.reset(pool); // error: no such method
//! }
//! ```
//! ```compile_fail,E0599
//! # use rpc_core::buffers::SendStaging;
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(staging: &mut SendStaging<Sim>) {
//!     staging.reset(); // error: no such method
//! }
//! ```
//! A view of the whole send mirror, or of a range WRITEs may still read:
//! ```compile_fail,E0599
//! # use rpc_core::buffers::SendMirror;
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(mirror: &mut SendMirror<Sim>) -> &mut [u8] {
//!     mirror.as_mut_slice() // error: no such method
//! }
//! ```
//! ```compile_fail,E0624
//! # use rpc_core::buffers::SendMirror;
//! # use rpc_core::verbs::sim::Sim;
//! fn misuse(mirror: &mut SendMirror<Sim>) -> &mut [u8] {
//!     mirror.range_mut(0, 64) // error: private method (the runtime's, for reserved ranges)
//! }
//! ```
//! The safe way into the mirror is a copy:
//! ```
//! # use rpc_core::buffers::SendMirror;
//! # use rpc_core::verbs::{sim::Sim, Context, ProtectionDomain, Provider};
//! let ctx = Sim::open(&Default::default()).unwrap();
//! let pd = ctx.alloc_pd().unwrap();
//! let mut mirror = SendMirror::<Sim>::new(&pd, 4096).unwrap();
//! assert!(mirror.write_at(100, b"body"));
//! assert!(!mirror.write_at(4094, b"body"), "out of bounds: nothing copied");
//! ```

pub mod bounded;
mod completion;
pub mod gather;
mod mirror;
pub mod registered;
pub(crate) mod text;
pub use bounded::Bounded;
use completion::SIGNALED_BIT;
pub use completion::{Completion, Completions, RESERVED_WR_IDS};
pub use gather::GatherBody;
pub(crate) use mirror::MirrorView;
pub use mirror::SendMirror;
pub use registered::{RegisteredBytesMut, RegisteredPool, RegisteredRef, RegisteredStats};

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::verbs::{
    inc_rkey, racy, AccessFlags, MemoryRegion, MemoryWindow, MwType, ProtectionDomain, Provider, RecvWr,
    Result, Sge, SharedReceiveQueue, SrqInitAttr, VerbsError, WorkCompletion,
};

/// Most WRs posted with one doorbell.
pub const POST_BATCH: usize = 64;

/// WRs per doorbell for small batches (a smaller stack array to fill).
const SMALL_BATCH: usize = 8;

/// WRs per doorbell for middle-sized batches: a server worker reposts its receive buffers 16 at
/// a time, which would otherwise fill (zero) a [`POST_BATCH`] array of SGEs and WRs, 2.5 KiB, for
/// each doorbell.
const MID_BATCH: usize = 16;

/// Identity of a pool, so that a token is only ever used with the pool it came from (and a
/// receive completion names the pool it belongs to), and of a send queue (in its WRs' `wr_id`s).
static NEXT_POOL: AtomicU32 = AtomicU32::new(1);

/// A fresh identity in `1..2^31`, never handed out twice in this process.
///
/// # Errors
/// [`VerbsError::CapExceeded`] once 2^31 - 1 pools and queues were made.
fn next_id() -> Result<u32> {
    NEXT_POOL
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| (id < SIGNALED_BIT).then_some(id + 1))
        .map_err(|_| VerbsError::CapExceeded {
            what: "buffers: pools and send queues made by this process",
            cap: "2^31 - 1 identities",
            requested: 1 << 31,
            limit: (1 << 31) - 1,
        })
}

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

/// Fixed-size receive buffers posted to one SRQ, registered in chunks (one MR each) that are
/// added as they are needed ([`RecvPool::add_chunk`]): a server's SRQ is created for its
/// worst case, but only the buffers its admitted sessions can use are registered and posted.
/// Buffer `i` is byte `(i % chunk_bufs) × buf_size` of chunk `i / chunk_bufs`.
pub struct RecvPool<P: Provider> {
    srq: P::SharedReceiveQueue,
    /// The chunks added so far, in order (index = buffer index >> `shift`); the same MRs are
    /// in `shared`, for the pool's [`RecvView`]s (which keep them registered as long as they
    /// live).
    mrs: Vec<Arc<P::MemoryRegion>>,
    shared: Arc<[OnceLock<Arc<P::MemoryRegion>>]>,
    buf_size: usize,
    /// Buffers of a full chunk: `1 << shift`.
    shift: u32,
    /// `(1 << shift) - 1`: a buffer's index within its chunk (kept, not computed per buffer).
    mask: u32,
    /// Capacity in buffers (the SRQ's depth).
    count: u32,
    /// Buffers registered so far (in `mrs`).
    added: u32,
    id: u32,
    /// Per buffer (the whole capacity, so that nothing grows on the hot path): posted (or queued
    /// to be), i.e. no token exists for it. False for buffers not added yet.
    posted: Vec<bool>,
    repost: Vec<u32>,
}

/// Registered memory for up to one chunk of a [`RecvPool`]'s buffers, made by
/// [`RecvPool::register_chunk`] (on any thread: a listener registers it, the worker that owns
/// the pool adds it) and posted by [`RecvPool::add_chunk`].
pub struct RecvChunk<P: Provider> {
    mr: P::MemoryRegion,
    bufs: u32,
}

impl<P: Provider> RecvChunk<P> {
    /// Buffers in the chunk.
    pub fn bufs(&self) -> u32 {
        self.bufs
    }

    /// Bytes registered for it.
    pub fn bytes(&self) -> usize {
        self.mr.len()
    }
}

impl<P: Provider> RecvPool<P> {
    /// Creates an SRQ of `count` WQEs and `count` buffers of `buf_size` bytes, all registered
    /// (one MR) and posted.
    ///
    /// # Errors
    /// The verbs error of creating the SRQ, registering the MR or posting.
    pub fn new(pd: &P::ProtectionDomain, count: u32, buf_size: usize) -> Result<RecvPool<P>> {
        let shift = count.max(1).next_power_of_two().trailing_zeros();
        let mut pool = RecvPool::with_capacity(pd, count, buf_size, shift)?;
        pool.add_chunk(RecvPool::register_chunk(pd, count, buf_size)?)?;
        Ok(pool)
    }

    /// Creates an SRQ of `count` WQEs with no buffer yet: chunks of up to `1 << chunk_shift`
    /// buffers of `buf_size` bytes are added later ([`RecvPool::register_chunk`],
    /// [`RecvPool::add_chunk`]), up to `count` buffers. What is reserved now, besides the SRQ,
    /// is 5 bytes of bookkeeping per buffer.
    ///
    /// # Errors
    /// The verbs error of creating the SRQ; `chunk_shift` above 31.
    pub fn with_capacity(
        pd: &P::ProtectionDomain,
        count: u32,
        buf_size: usize,
        chunk_shift: u32,
    ) -> Result<RecvPool<P>> {
        if chunk_shift > 31 {
            return Err(crate::verbs::VerbsError::InvalidArgument {
                call: "RecvPool::with_capacity",
                reason: format!("chunk_shift {chunk_shift} is above 31"),
            });
        }
        let srq = pd.create_srq(&SrqInitAttr { max_wr: count, max_sge: 1 })?;
        let chunks = (count as usize).div_ceil(1 << chunk_shift);
        Ok(RecvPool {
            srq,
            mrs: Vec::with_capacity(chunks),
            shared: (0..chunks).map(|_| OnceLock::new()).collect(),
            buf_size,
            shift: chunk_shift,
            mask: ((1u64 << chunk_shift) - 1) as u32,
            count,
            added: 0,
            id: next_id()?,
            posted: vec![false; count as usize],
            repost: Vec::with_capacity(count as usize),
        })
    }

    /// Registers memory for `bufs` buffers of `buf_size` bytes (at most one chunk of the pool
    /// they are added to), on any thread.
    ///
    /// # Errors
    /// The verbs error of registering the MR.
    pub fn register_chunk(pd: &P::ProtectionDomain, bufs: u32, buf_size: usize) -> Result<RecvChunk<P>> {
        let mr = pd.reg_mr(bufs.max(1) as usize * buf_size, AccessFlags::LOCAL_WRITE)?;
        Ok(RecvChunk { mr, bufs })
    }

    /// Buffers one chunk of this pool holds at most (`1 << chunk_shift`).
    pub fn chunk_bufs(&self) -> u32 {
        1 << self.shift
    }

    /// Buffers registered and posted (or given to the application) so far.
    pub fn added(&self) -> u32 {
        self.added
    }

    /// Adds a chunk's buffers to the pool and posts them: they take the next buffer indices,
    /// from the next chunk boundary. A chunk of more buffers than a chunk holds, than the pool
    /// has room for, or of buffers smaller than the pool's, is refused.
    ///
    /// # Errors
    /// `InvalidArgument` for a chunk that does not fit; the verbs error of posting (buffers not
    /// posted stay queued).
    pub fn add_chunk(&mut self, chunk: RecvChunk<P>) -> Result<()> {
        let first = (self.mrs.len() as u64) << self.shift;
        let fits = chunk.bufs <= 1 << self.shift
            && first + u64::from(chunk.bufs) <= u64::from(self.count)
            && chunk.mr.len() >= chunk.bufs as usize * self.buf_size;
        if !fits {
            return Err(crate::verbs::VerbsError::InvalidArgument {
                call: "RecvPool::add_chunk",
                reason: format!(
                    "a chunk of {} buffers ({} bytes) at buffer {first} does not fit a pool of {} \
                     buffers of {} bytes in chunks of {}",
                    chunk.bufs,
                    chunk.mr.len(),
                    self.count,
                    self.buf_size,
                    1u32 << self.shift
                ),
            });
        }
        let mr = Arc::new(chunk.mr);
        let _ = self.shared[self.mrs.len()].set(mr.clone());
        self.mrs.push(mr);
        let first = first as u32;
        for idx in first..first + chunk.bufs {
            self.posted[idx as usize] = true;
            self.repost.push(idx);
        }
        self.added = first + chunk.bufs;
        self.flush()
    }

    /// The start of buffer `idx` (which lies in an added chunk).
    #[inline(always)]
    fn buf_offset(&self, idx: u32) -> (&Arc<P::MemoryRegion>, usize) {
        (&self.mrs[(idx >> self.shift) as usize], (idx & self.mask) as usize * self.buf_size)
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

    /// Takes the buffer a polled receive completion names (its `wr_id` carries this pool's
    /// identity and the buffer's index): the NIC is done with it. `None` (the completion is
    /// dropped) when it is not the completion of a posted buffer of this pool (a send completion,
    /// another pool's). A failed completion's buffer is taken too (to give it back); a `byte_len`
    /// above the buffer size gives a token whose [`RecvPool::bytes`] are empty.
    #[inline]
    pub fn take(&mut self, c: Completion) -> Option<RecvBuf> {
        let (wr_id, byte_len) = (c.wc().wr_id, c.wc().byte_len);
        if wr_id >> 32 != u64::from(self.id) {
            return None;
        }
        let idx = Some(wr_id as u32).filter(|&i| i < self.count)?;
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
        let (mr, start) = self.buf_offset(buf.idx);
        // SAFETY: `[start, start + len)` lies in `mr`, the chunk of buffer `idx` (a token exists
        // only for an added buffer: `take` checks its `posted` flag, false for buffers not added;
        // its chunk holds `1 << shift` buffers at most and len <= buf_size), which lives as long
        // as `&self`. A token exists only for a buffer whose completion was polled
        // (`take` consumes a `Completion`, which only `Completions::poll` makes, once per CQE,
        // and whose `wr_id` names this pool: our WRs are the only ones with this pool's identity
        // in their `wr_id`, see `RESERVED_WR_IDS`) and that is not posted: `take` cleared its
        // `posted` flag and only `repost` (which takes the token by value, so not while this
        // borrow of it lives) queues it again. So neither the NIC nor a peer (a SEND lands only in
        // a posted buffer) writes it while the slice lives.
        unsafe { std::slice::from_raw_parts((mr.addr() as usize + start) as *const u8, buf.len as usize) }
    }

    /// A handle that reads the first bytes of this pool's buffers whose receive completions were
    /// polled and not taken yet ([`Completions::untaken_recv_heads`]): a worker's handler looks
    /// for a Cancel in what arrived while it runs. It keeps the pool's chunks registered while
    /// it lives, and sees the chunks added later.
    pub fn view(&self) -> RecvView<P> {
        RecvView {
            chunks: self.shared.clone(),
            buf_size: self.buf_size,
            shift: self.shift,
            count: self.count,
            id: self.id,
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
            } else if self.repost.len() <= MID_BATCH {
                self.post_chunk::<MID_BATCH>()?;
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
            let (mr, off) = self.buf_offset(idx);
            *sge = mr.sge(off, self.buf_size as u32);
        }
        let mut wrs = [RecvWr { wr_id: 0, sg_list: &[] }; N];
        for (i, wr) in wrs.iter_mut().enumerate().take(n) {
            let wr_id = (u64::from(self.id) << 32) | u64::from(self.repost[first + i]);
            *wr = RecvWr { wr_id, sg_list: &sges[i..i + 1] };
        }
        // SAFETY: every SGE lies in its buffer's chunk MR (LOCAL_WRITE), which lives as long as
        // this pool (only added buffers are ever queued, see `add_chunk` and `repost`);
        // each buffer was given back by value (`repost`), so no token and no slice of it exists
        // (`bytes` borrows a token); the owner drops its QPs before this pool, and a dropped MR is
        // deregistered, so the NIC cannot write freed memory.
        unsafe { self.srq.post_recv(&wrs[..n]) }?;
        self.repost.truncate(first);
        Ok(())
    }
}

/// What [`RecvPool::view`] gives: the geometry and identity of a pool's buffers, to read the first
/// bytes of receives polled and not taken yet through [`Completions::untaken_recv_heads`] (the
/// only way in: it holds the proof that the buffer is not posted).
pub struct RecvView<P: Provider> {
    chunks: Arc<[OnceLock<Arc<P::MemoryRegion>>]>,
    buf_size: usize,
    shift: u32,
    count: u32,
    id: u32,
}

impl<P: Provider> RecvView<P> {
    /// The bytes the NIC wrote into `buf`, read without the pool (its owner may be another
    /// thread, posting and taking other buffers meanwhile): as [`RecvPool::bytes`], empty when
    /// `buf` is not of this pool or its completion reported more bytes than a buffer holds.
    #[inline]
    pub fn bytes<'a>(&'a self, buf: &'a RecvBuf) -> &'a [u8] {
        if buf.pool != self.id || buf.len as usize > self.buf_size || buf.idx >= self.count {
            return &[];
        }
        let Some(mr) = self.chunks.get((buf.idx >> self.shift) as usize).and_then(OnceLock::get) else {
            return &[];
        };
        let off = (buf.idx & ((1u32 << self.shift) - 1)) as usize * self.buf_size;
        // SAFETY: `[off, off + len)` lies in `mr`, the chunk of buffer `idx` (a chunk holds at
        // most `1 << shift` buffers, len <= buf_size), which the `Arc` in `chunks` keeps
        // registered and mapped as long as `&self`. A token exists only for a buffer whose
        // completion was polled and taken (`RecvPool::take`, which consumes the `Completion`
        // made once per CQE, and clears the buffer's `posted` flag) and that is not posted:
        // only `RecvPool::repost` queues it again, and it takes the token by value, so not
        // while this borrow of it lives. So neither the NIC nor a peer (a SEND lands only in
        // a posted buffer) writes it while the slice lives, whichever thread owns the pool.
        unsafe { std::slice::from_raw_parts((mr.addr() as usize + off) as *const u8, buf.len as usize) }
    }

    /// Whether `buf`'s completion byte count fit the buffer ([`RecvPool::fits`]).
    #[inline]
    pub fn fits(&self, buf: &RecvBuf) -> bool {
        buf.len as usize <= self.buf_size
    }

    /// Bytes of one buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Copies the first `min(head.len(), byte_len)` bytes of the buffer `wc` names into `head`
    /// and returns how many: `None` when `wc` is not a receive completion of this pool or reports
    /// more bytes than a buffer holds. The caller (`Completions::untaken_recv_heads`) passes only
    /// a completion polled and not taken yet.
    pub(super) fn copy_head(&self, wc: &WorkCompletion, head: &mut [u8]) -> Option<usize> {
        if wc.wr_id & completion::SEND_WR_BIT != 0 || wc.wr_id >> 32 != u64::from(self.id) {
            return None;
        }
        let idx = Some(wc.wr_id as u32).filter(|&i| i < self.count)? as usize;
        if wc.byte_len as usize > self.buf_size {
            return None;
        }
        let n = head.len().min(wc.byte_len as usize);
        let mr = self.chunks.get(idx >> self.shift)?.get()?;
        let off = (idx & ((1usize << self.shift) - 1)) * self.buf_size;
        // SAFETY: `[off, off + n)` lies in `mr`, the chunk of buffer `idx` (a chunk holds at most
        // `1 << shift` buffers, n <= buf_size; a completion names only a buffer that was posted,
        // so added), which the `Arc` keeps registered and mapped. The completion names a receive WR of this pool
        // (its identity is in the `wr_id`, which only this pool's posts carry) that completed
        // and whose `Completion` was never handed out (the caller reads only entries not taken
        // of its batch, and each CQE lands in one batch once): the buffer is not posted again
        // (that needs the token `take` makes of that `Completion`), so neither the NIC nor a peer
        // writes it during this copy, and the completion's poll ordered the NIC's write before it.
        let src = unsafe { std::slice::from_raw_parts((mr.addr() as usize + off) as *const u8, n) };
        head[..n].copy_from_slice(src);
        Some(n)
    }
}

/// A free send buffer: the owner writes it ([`SendPool::buf_mut`]) and then posts it
/// ([`SendQueue::send`], which consumes the token) or gives it back ([`SendQueue::give_back`],
/// or [`SendPool::give_back`] for one taken with [`SendPool::acquire`]).
#[must_use = "a send buffer is lost to its pool unless sent or given back"]
#[derive(Debug)]
pub struct SendBuf {
    idx: u32,
    pool: u32,
}

impl Drop for SendBuf {
    fn drop(&mut self) {
        leaked("send buffer", self.idx);
    }
}

/// Fixed-size send buffers registered in chunks (one MR each), with their free list. A client's
/// connection has one of its own ([`SendPool::new`]: one chunk, all of it registered at
/// connect); a server worker has one that all its sessions send from ([`SendPool::growable`]:
/// empty at first, grown a chunk at a time as sends need buffers, up to a cap), so an idle
/// session holds no send buffer.
///
/// The pool keeps only the free list: which buffers a posted WR uses, and when a polled
/// completion gives them back, is the [`SendQueue`] that posted them. A buffer whose SEND was
/// inline is free again once the post returned (the NIC copied its bytes into the WQE); one the
/// NIC reads by DMA is free again only when the polled completion of the signaled WR at or after
/// it retires it ([`SendQueue::on_completion`]), or when its QP is destroyed
/// ([`SendQueue::reclaim`]). Buffer `i` is byte `(i & mask) × buf_size` of chunk `i >> shift`.
pub struct SendPool<P: Provider> {
    /// The chunks added so far (index = buffer index >> `shift`).
    chunks: Vec<P::MemoryRegion>,
    /// The PD new chunks are registered in (`None`: the pool does not grow).
    pd: Option<P::ProtectionDomain>,
    buf_size: usize,
    /// Buffers of a full chunk: `1 << shift`.
    shift: u32,
    /// `(1 << shift) - 1`.
    mask: u32,
    /// Buffers registered so far.
    added: u32,
    /// Most buffers the pool may register.
    max: u32,
    id: u32,
    free: Vec<u32>,
    /// An acquire found no free buffer and could not grow since the last
    /// [`SendPool::take_starved`]: some queue waits for a buffer.
    starved: bool,
    /// Acquires that found no buffer free and the pool at its cap (or unable to grow).
    waits: u64,
    /// Registering a chunk failed (the device's or `ulimit -l`'s limits): counted, the pool
    /// stays as it is and its users wait for buffers already registered.
    grow_failures: u64,
}

impl<P: Provider> SendPool<P> {
    /// Registers `count` buffers of `buf_size` bytes (one MR); the pool does not grow.
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn new(pd: &P::ProtectionDomain, count: u16, buf_size: usize) -> Result<SendPool<P>> {
        let count = u32::from(count);
        let shift = count.max(1).next_power_of_two().trailing_zeros();
        let mut pool = SendPool::empty(None, buf_size, shift, count)?;
        if count > 0 {
            pool.add_chunk(pd, count)?;
        }
        Ok(pool)
    }

    /// A pool with no buffer yet that registers `1 << chunk_shift` buffers of `buf_size` bytes
    /// at a time in `pd` whenever an acquire finds none free, up to `max_bytes` (at least one
    /// chunk; `chunk_shift` at most 16).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for `buf_size` 0 or `chunk_shift` above 16;
    /// [`VerbsError::CapExceeded`] once the process made 2^31 - 1 pools and queues.
    pub fn growable(
        pd: &P::ProtectionDomain,
        buf_size: usize,
        chunk_shift: u32,
        max_bytes: usize,
    ) -> Result<SendPool<P>> {
        if buf_size == 0 || chunk_shift > 16 {
            return Err(VerbsError::InvalidArgument {
                call: "SendPool::growable",
                reason: format!("buf_size {buf_size} (at least 1), chunk_shift {chunk_shift} (at most 16)"),
            });
        }
        let chunk = 1u32 << chunk_shift;
        let max = (max_bytes / buf_size).clamp(chunk as usize, u32::MAX as usize >> 1) as u32;
        SendPool::empty(Some(pd.clone()), buf_size, chunk_shift, max)
    }

    fn empty(pd: Option<P::ProtectionDomain>, buf_size: usize, shift: u32, max: u32) -> Result<SendPool<P>> {
        Ok(SendPool {
            chunks: Vec::new(),
            pd,
            buf_size,
            shift,
            mask: (1u32 << shift) - 1,
            added: 0,
            max,
            id: next_id()?,
            free: Vec::new(),
            starved: false,
            waits: 0,
            grow_failures: 0,
        })
    }

    /// Registers `bufs` more buffers (at most a chunk) as one MR and frees them.
    fn add_chunk(&mut self, pd: &P::ProtectionDomain, bufs: u32) -> Result<()> {
        let mr = pd.reg_mr(bufs as usize * self.buf_size, AccessFlags::LOCAL_WRITE)?;
        let first = self.added;
        // Only here (a chunk is registered anyway): the free list's room for every buffer.
        self.free.reserve(bufs as usize);
        self.chunks.push(mr);
        self.added += bufs;
        self.free.extend((first..first + bufs).rev());
        Ok(())
    }

    /// Grows by a chunk when the cap allows; false when it does not or registering failed.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) -> bool {
        let Some(pd) = self.pd.clone() else { return false };
        let bufs = (self.mask + 1).min(self.max.saturating_sub(self.added));
        if bufs == 0 {
            return false;
        }
        match self.add_chunk(&pd, bufs) {
            Ok(()) => true,
            Err(e) => {
                self.grow_failures += 1;
                tracing::warn!(error = %e, bytes = bufs as usize * self.buf_size, "registering send buffers failed");
                false
            }
        }
    }

    /// Bytes of one buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Takes a free buffer, growing the pool by a chunk when none is free and the cap allows.
    /// Not counted against any send queue: give it back with [`SendPool::give_back`] or post it
    /// (a [`SendQueue`] takes its buffers with [`SendPool::acquire_for`]).
    #[inline]
    pub fn acquire(&mut self) -> Option<SendBuf> {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                if !self.grow() {
                    self.starved = true;
                    self.waits += 1;
                    return None;
                }
                self.free.pop()?
            }
        };
        Some(SendBuf { idx, pool: self.id })
    }

    /// Takes a free buffer for `sq` when its send queue has room for the buffer's WRs (a WRITE
    /// and a SEND) on top of those of every buffer it holds already (taken, not yet queued).
    /// A buffer taken here and not sent goes back through [`SendQueue::give_back`], which frees
    /// that room too ([`SendPool::give_back`] alone would keep it reserved for good).
    #[inline]
    pub fn acquire_for(&mut self, sq: &mut SendQueue) -> Option<SendBuf> {
        if !sq.has_room(2 * (sq.taken + 1)) {
            return None;
        }
        let buf = self.acquire()?;
        sq.taken += 1;
        Some(buf)
    }

    /// Free buffers (registered and free; more may be registered up to the cap).
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers taken or used by posted WRs (registered and not free).
    pub fn in_use(&self) -> usize {
        self.added as usize - self.free.len()
    }

    /// Bytes registered for the pool's buffers.
    pub fn registered_bytes(&self) -> u64 {
        u64::from(self.added) * self.buf_size as u64
    }

    /// Most buffers the pool registers.
    pub fn capacity(&self) -> usize {
        self.max as usize
    }

    /// Acquires that found no buffer free and could not grow (the cap, or a failed
    /// registration).
    pub fn waits(&self) -> u64 {
        self.waits
    }

    /// Times registering a chunk failed.
    pub fn grow_failures(&self) -> u64 {
        self.grow_failures
    }

    /// Whether an acquire found no buffer (none free, the cap reached) since the last
    /// [`SendPool::take_starved`]: the owner retries its waiting senders once buffers are free
    /// again.
    #[inline]
    pub fn starved(&self) -> bool {
        self.starved
    }

    /// [`SendPool::starved`], cleared.
    pub fn take_starved(&mut self) -> bool {
        std::mem::take(&mut self.starved)
    }

    /// Returns a buffer that was taken ([`SendPool::acquire`]) but not posted (a token of
    /// another pool is dropped, and counted as leaked). One taken for a send queue
    /// ([`SendPool::acquire_for`]) goes back through [`SendQueue::give_back`].
    #[inline]
    pub fn give_back(&mut self, buf: SendBuf) {
        if buf.pool != self.id {
            return;
        }
        let idx = buf.idx;
        std::mem::forget(buf);
        self.free.push(idx);
    }

    /// The bytes of a taken buffer, to write the message into. Empty for a token of another pool.
    #[inline(always)]
    pub fn buf_mut<'a>(&'a mut self, buf: &'a mut SendBuf) -> &'a mut [u8] {
        if buf.pool != self.id {
            return &mut [];
        }
        let Some(mr) = self.chunks.get((buf.idx >> self.shift) as usize) else { return &mut [] };
        let start = (buf.idx & self.mask) as usize * self.buf_size;
        // SAFETY: the range lies in `mr` (a chunk holds `mask + 1` buffers at most, and `idx`
        // names one that was registered: only `add_chunk` puts indices on the free list), alive
        // as long as `&mut self` (chunks are only added). The token exists only while the buffer
        // is neither posted nor free (`acquire` made it, `send`/`give_back` consume it), so the
        // NIC does not read it, no other token names it, and both borrows (`&mut self`, `&mut
        // buf`) make this the only view.
        unsafe { std::slice::from_raw_parts_mut((mr.addr() as usize + start) as *mut u8, self.buf_size) }
    }

    #[inline]
    fn sge(&self, idx: u32, len: u32) -> Sge {
        match self.chunks.get((idx >> self.shift) as usize) {
            Some(mr) => mr.sge((idx & self.mask) as usize * self.buf_size, len),
            None => Sge { addr: 0, length: 0, lkey: 0 },
        }
    }

    /// Buffers posted by `sq` (or queued) are free again: only [`SendQueue`] calls this, for
    /// buffers a polled completion retired, inline SENDs once posted, WRs never posted, or
    /// buffers of a destroyed QP.
    #[inline]
    fn free_posted(&mut self, idx: u32) {
        self.free.push(idx);
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
        // can reach. No reference to ring memory is formed and the ring is read with atomic
        // loads only (`racy::load`), so a concurrent RDMA WRITE by the peer (the software NIC's
        // thread, or a device) only decides the copied values: no data race. After the copy
        // those bytes are initialized, so `set_len` is valid.
        unsafe {
            racy::load(self.mr.as_ptr().add(o), dst.as_mut_ptr().add(at), n);
            dst.set_len(at + n);
        }
        true
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
            id: next_id()?,
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
}

mod send_queue;
pub use send_queue::SendQueue;
