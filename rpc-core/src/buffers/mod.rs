//! Registered buffers and the two unsafe calls of the runtime: posting receive buffers to an
//! SRQ and posting send work requests.
//!
//! The verbs `post_*` calls are `unsafe` because the NIC reads or writes the posted memory until
//! the completion is polled. This module owns that memory and hands it out under a discipline
//! that makes the rest of the runtime safe:
//! - [`RecvPool`]: a receive buffer is either posted (only the NIC touches it) or completed and
//!   held by the worker (only read) until it is given back with [`RecvPool::repost`].
//! - [`SendPool`]: a send buffer is either free (the worker writes it) or posted (untouched) until
//!   a signaled completion at or after its WR retires it ([`SendPool::retire`]).
//! - [`SendQueue`]: the work requests of one QP collected during a loop iteration and posted with
//!   one doorbell; the last WR of each batch is signaled (selective signaling).
//!
//! Drop order: every owner declares its QP before these pools, so the QP is destroyed (its WRs
//! discarded) before the memory is deregistered.

use std::collections::VecDeque;

use crate::verbs::{
    AccessFlags, MemoryRegion, ProtectionDomain, Provider, QueuePair, RecvWr, Result, SendFlags, SendOp,
    SendWr, Sge, SharedReceiveQueue, SrqInitAttr,
};

/// Most WRs posted with one doorbell.
pub const POST_BATCH: usize = 64;

/// Fixed-size receive buffers in one MR, posted to one SRQ.
pub struct RecvPool<P: Provider> {
    srq: P::SharedReceiveQueue,
    mr: P::MemoryRegion,
    buf_size: usize,
    count: u32,
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
        let mut pool = RecvPool { srq, mr, buf_size, count, repost: Vec::with_capacity(count as usize) };
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

    /// The first `len` bytes of completed buffer `idx` (its receive completion was polled and it
    /// was not reposted yet, so the NIC does not write it). `None` when out of range.
    #[inline]
    pub fn received(&self, idx: u32, len: usize) -> Option<&[u8]> {
        if idx >= self.count || len > self.buf_size {
            return None;
        }
        let start = idx as usize * self.buf_size;
        // SAFETY: the existing discipline (to be replaced by owned tokens, issue 10): a buffer
        // whose receive completion was polled is not posted again until `repost`, so no WR
        // writes it while the caller holds this view, and no peer has remote access to the pool.
        unsafe { self.mr.as_slice() }.get(start..start + len)
    }

    /// Gives a completed buffer back; it is posted again by the next [`RecvPool::flush`].
    #[inline]
    pub fn repost(&mut self, idx: u32) {
        if idx < self.count && self.repost.len() < self.count as usize {
            self.repost.push(idx);
        }
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
        // SAFETY: every SGE lies in `self.mr` (LOCAL_WRITE), which lives as long as this pool,
        // and each buffer was given back by the worker, which reads a buffer only between its
        // completion and `repost`; the owner drops its QPs before this pool, and a dropped MR
        // is deregistered, so the NIC cannot write freed memory.
        unsafe { self.srq.post_recv(&wrs[..n]) }?;
        self.repost.truncate(first);
        Ok(())
    }
}

/// WRs per doorbell for small batches (a smaller stack array to fill).
const SMALL_BATCH: usize = 8;

/// Fixed-size send buffers of one connection in one MR, with their free list.
pub struct SendPool<P: Provider> {
    mr: P::MemoryRegion,
    buf_size: usize,
    free: Vec<u16>,
    /// Buffers of posted WRs, in posting order, until a signaled completion retires them.
    posted: VecDeque<u16>,
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
            free: (0..count).rev().collect(),
            posted: VecDeque::with_capacity(count as usize),
        })
    }

    /// Bytes of one buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Takes a free buffer.
    pub fn acquire(&mut self) -> Option<u16> {
        self.free.pop()
    }

    /// Free buffers.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Returns a buffer that was acquired but never posted.
    pub fn give_back(&mut self, idx: u16) {
        self.free.push(idx);
    }

    /// The bytes of a free (acquired, not posted) buffer.
    #[inline]
    pub fn buf_mut(&mut self, idx: u16) -> &mut [u8] {
        let start = idx as usize * self.buf_size;
        // SAFETY: the existing discipline (to be replaced by owned tokens, issue 10): an acquired,
        // unposted buffer is not touched by any WR, and the pool has no remote access. The whole
        // region is viewed, but only this buffer's range is handed out.
        let whole = unsafe { self.mr.as_mut_slice() };
        &mut whole[start..start + self.buf_size]
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

/// A registered region for bulk bodies: the receive ring (REMOTE_WRITE) or the send mirror.
pub struct RingBuf<P: Provider> {
    mr: P::MemoryRegion,
}

impl<P: Provider> RingBuf<P> {
    /// The receive ring a peer writes into: `LOCAL_WRITE | REMOTE_WRITE`.
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn receive(pd: &P::ProtectionDomain, len: usize) -> Result<RingBuf<P>> {
        Ok(RingBuf { mr: pd.reg_mr(len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)? })
    }

    /// The send mirror bodies are encoded into before their RDMA WRITE: local access only.
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn mirror(pd: &P::ProtectionDomain, len: usize) -> Result<RingBuf<P>> {
        Ok(RingBuf { mr: pd.reg_mr(len, AccessFlags::LOCAL_WRITE)? })
    }

    /// Address, length and rkey for the handshake.
    pub fn remote(&self) -> (u64, u32, u32) {
        (self.mr.addr(), self.mr.len() as u32, self.mr.rkey())
    }

    /// The bytes (the session's ring accounting says which ones are settled).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: NOT sound against a peer's concurrent RDMA WRITE (issue 10, being rewritten):
        // the existing discipline is that the session's ring accounting hands out only settled
        // ranges, which a well-behaved peer no longer writes.
        unsafe { self.mr.as_slice() }
    }

    /// The bytes, mutable (the mirror: only ranges the producer reserved).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the existing discipline (issue 10, being rewritten): the mirror has no remote
        // access, and the producer writes only ranges it reserved, which no posted WRITE reads.
        unsafe { self.mr.as_mut_slice() }
    }
}

#[derive(Clone, Copy)]
struct PendingWr {
    sge: Sge,
    op: SendOp,
    /// Send buffer the WR uses (the SEND of a message), or `u16::MAX` (a WRITE from the mirror).
    buf: u16,
    /// Copied into the WQE at post time: the buffer is free again right after posting.
    inline: bool,
}

/// The send WRs of one QP gathered during a loop iteration, posted with one doorbell.
pub struct SendQueue {
    pending: Vec<PendingWr>,
    /// WRs posted and not yet retired by a signaled completion.
    outstanding: usize,
    /// WRs posted since the last signaled one.
    unsignaled: usize,
    /// Send queue depth in WQEs.
    depth: usize,
}

impl SendQueue {
    /// A queue for a QP whose send queue holds `depth` WQEs.
    pub fn new(depth: usize) -> SendQueue {
        SendQueue { pending: Vec::with_capacity(depth), outstanding: 0, unsignaled: 0, depth }
    }

    /// WRs waiting for the next flush.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Room for `n` more WRs in the send queue (posted plus pending).
    pub fn has_room(&self, n: usize) -> bool {
        self.outstanding + self.pending.len() + n <= self.depth
    }

    /// Queues an RDMA WRITE of `mirror[offset, offset + len)` to the peer's ring at the same offset.
    pub fn write<P: Provider>(
        &mut self,
        mirror: &RingBuf<P>,
        offset: u32,
        len: u32,
        ring_addr: u64,
        rkey: u32,
    ) {
        self.pending.push(PendingWr {
            sge: mirror.mr.sge(offset as usize, len),
            op: SendOp::RdmaWrite { remote_addr: ring_addr + u64::from(offset), rkey },
            buf: u16::MAX,
            inline: false,
        });
    }

    /// Queues a SEND of the first `len` bytes of send buffer `buf`; with `inline`, the bytes are
    /// copied into the WQE (`len` must not exceed the QP's `max_inline_data`).
    #[inline]
    pub fn send<P: Provider>(&mut self, pool: &SendPool<P>, buf: u16, len: u32, inline: bool) {
        self.pending.push(PendingWr { sge: pool.sge(buf, len), op: SendOp::Send, buf, inline });
    }

    /// Posts everything queued with one doorbell per [`POST_BATCH`] WRs. The last WR of a batch
    /// is signaled when the batch holds non-inline sends or half the send queue went unsignaled;
    /// its `wr_id` carries `tag`, the number of WRs and of send buffers its completion retires
    /// ([`split_send_wr_id`]). Allocates nothing.
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
        let mut bufs = 0u16;
        let mut wrs = [SendWr { wr_id: 0, sg_list: &[], op: SendOp::Send, flags: SendFlags::EMPTY }; N];
        for (wr, p) in wrs.iter_mut().zip(&self.pending[..n]) {
            let flags = if p.inline { SendFlags::INLINE } else { SendFlags::EMPTY };
            *wr = SendWr { wr_id: 0, sg_list: std::slice::from_ref(&p.sge), op: p.op, flags };
            if p.buf != u16::MAX && !p.inline {
                bufs += 1;
            }
        }
        // Selective signaling: a completion is needed to retire send buffers (non-inline WRs)
        // and, at least every half queue, to retire WQEs; inline-only batches go unsignaled.
        let unsignaled = self.unsignaled + n;
        let signal = bufs > 0 || unsignaled >= self.depth / 2;
        if signal {
            wrs[n - 1].flags |= SendFlags::SIGNALED;
            wrs[n - 1].wr_id = send_wr_id(tag, unsignaled as u16, bufs);
        }
        // SAFETY: every SGE lies in a send buffer of `pool` or in the send mirror, MRs owned
        // next to `qp` by the same connection and dropped after it; an inline WR's bytes are
        // copied into the WQE by `post_send`, so its buffer is free again on return; any other
        // send buffer is not written again until a signaled completion at or after its WR
        // retires it, and a mirror range is not reserved again until the peer reports it freed,
        // which it does only after the SEND that follows the WRITE arrived.
        unsafe { qp.post_send(&wrs[..n]) }?;
        for p in &self.pending[..n] {
            if p.inline {
                pool.free.push(p.buf);
            } else if p.buf != u16::MAX {
                pool.posted.push_back(p.buf);
            }
        }
        self.outstanding += n;
        self.unsignaled = if signal { 0 } else { unsignaled };
        if n == self.pending.len() {
            // The usual case (one batch): no drain bookkeeping for `Copy` entries.
            self.pending.clear();
        } else {
            self.pending.drain(..n);
        }
        Ok(())
    }

    /// A signaled completion retired `wrs` WRs (from its `wr_id`, see [`split_send_wr_id`]).
    pub fn on_completion(&mut self, wrs: u16) {
        self.outstanding = self.outstanding.saturating_sub(usize::from(wrs));
    }

    /// Every posted WR is gone (the QP was destroyed or flushed).
    pub fn reset(&mut self) {
        self.outstanding = 0;
        self.unsignaled = 0;
        self.pending.clear();
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
