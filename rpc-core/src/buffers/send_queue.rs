//! [`SendQueue`]: the send WRs of one QP gathered during a loop iteration and posted with one
//! doorbell, and the bookkeeping that gives their memory back when a polled completion proves the
//! NIC is done with it.

use std::collections::VecDeque;

use super::completion::{Completion, SEND_WR_BIT, SIGNALED_BIT};
use super::{next_id, RecvRing, SendBuf, SendMirror, SendPool, SendStaging, Staged, POST_BATCH, SMALL_BATCH};
use crate::verbs::{
    AccessFlags, MemoryRegion, MemoryWindow, MwBind, Provider, QueuePair, Result, SendFlags, SendOp, SendWr,
    Sge, VerbsError,
};

#[derive(Clone, Copy)]
struct PendingWr {
    sge: Sge,
    op: SendOp,
    /// Send buffer the WR uses (the SEND of a message), or `u32::MAX` (a WRITE).
    buf: u32,
    /// Staged range whose last WRITE this is (freed by its completion), or `u32::MAX`.
    staged: u32,
    /// Copied into the WQE at post time.
    inline: bool,
    /// A WRITE with a gather list: its SGEs are `gather[sges.0 .. sges.0 + sges.1]` (and `sge`
    /// is unused); `(0, 0)` for a WR of the one `sge`.
    sges: (u32, u32),
}

/// The send WRs of one QP gathered during a loop iteration, posted with one doorbell.
///
/// A queue posts to one QP, the first it is flushed to, and takes its send buffers from one
/// [`SendPool`], the first it posts from (a flush to another QP or from another pool is refused;
/// many queues may share a pool: a server worker's sessions do). Every WR it posts carries in
/// its `wr_id` the queue's identity (and the caller's `tag`, see [`Completion::send_tag`]); a
/// signaled WR is remembered with the WRs and send buffers its completion retires, and the queue
/// keeps the buffers its posted WRs read, in posting order (the pool keeps only its free list).
/// So only a polled completion of this queue's own signaled WR on its own QP
/// ([`SendQueue::on_completion`]) gives buffers and staged ranges back, in posting order, or the
/// destruction of its QP ([`SendQueue::reclaim`]).
pub struct SendQueue {
    pending: Vec<PendingWr>,
    /// WRs posted and not yet retired by a signaled completion.
    outstanding: usize,
    /// WRs posted since the last signaled one.
    unsignaled: usize,
    /// Send queue depth in WQEs.
    depth: usize,
    /// Send buffers taken for this queue ([`SendPool::acquire_for`]) and neither queued nor
    /// given back (each will need up to 2 WQEs).
    pub(super) taken: usize,
    /// Send buffers of posted WRs the NIC reads by DMA (not inline), in posting order, until a
    /// signaled completion retires them (at most one per WQE: allocated for `depth`).
    bufs: VecDeque<u32>,
    /// WRs posted so far.
    posted: u64,
    /// WRs retired by polled completions so far.
    completed: u64,
    /// Staged ranges whose last WRITE is posted, in posting order: (value of `posted` once that
    /// WRITE is posted, range sequence number).
    staged: VecDeque<(u64, u32)>,
    /// Signaled WRs posted and not completed, oldest first: (value of `posted` once it is
    /// posted, send buffers its completion retires).
    signals: VecDeque<(u64, u16)>,
    /// Ring WRITEs queued or posted and not yet reported retired, in posting order: (value of
    /// `posted` once that WRITE is posted, the caller's ring mark). At most the send queue's
    /// depth while the caller takes the marks after each completion (`take_ring_mark`).
    ring_marks: VecDeque<(u64, u32)>,
    /// This queue's identity in its WRs' `wr_id`s (0: none yet, taken at the first post).
    id: u32,
    /// The QP it posts to: (its [`QueuePair::identity`], its number), from the first post.
    qp: Option<(usize, u32)>,
    /// The pool it posts buffers of (0: none yet).
    pool: u32,
    /// The staging area its staged WRITEs read (0: none yet).
    staging: u32,
    /// SGEs of the pending WRs with a gather list ([`SendQueue::write_gather`]); emptied when
    /// nothing is pending.
    gather: Vec<Sge>,
    /// Registered user buffers read by posted (or pending) WRITEs, in posting order: (value of
    /// `posted` once that WRITE is posted, the bytes). Dropped once a polled completion retires
    /// that WRITE ([`SendQueue::retire_held`]), or with the queue (the QP destroyed first).
    held: VecDeque<(u64, bytes::Bytes)>,
}

/// The `wr_id` of a send WR of queue `id`, flushed with `tag`.
#[inline]
fn send_wr_id(tag: u32, id: u32, signaled: bool) -> u64 {
    let low = if signaled { id | SIGNALED_BIT } else { id };
    SEND_WR_BIT | (u64::from(tag & 0x7fff_ffff) << 32) | u64::from(low)
}

impl SendQueue {
    /// A queue for a QP whose send queue holds `depth` WQEs, sending up to `bufs` messages at
    /// once (room for their staged ranges). Allocates its bookkeeping for `depth` WRs now.
    pub fn new(depth: usize, bufs: usize) -> SendQueue {
        SendQueue {
            pending: Vec::with_capacity(depth),
            outstanding: 0,
            unsignaled: 0,
            depth,
            taken: 0,
            bufs: VecDeque::with_capacity(depth),
            posted: 0,
            completed: 0,
            staged: VecDeque::with_capacity(bufs),
            signals: VecDeque::with_capacity(depth),
            ring_marks: VecDeque::with_capacity(depth),
            id: 0,
            qp: None,
            pool: 0,
            staging: 0,
            gather: Vec::new(),
            held: VecDeque::new(),
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

    /// Ties the queue to `qp` (at its first post) or checks that `qp` is that QP.
    #[inline(always)]
    fn bind_qp<Q: QueuePair>(&mut self, qp: &Q) -> Result<()> {
        match self.qp {
            Some((identity, _)) if identity == qp.identity() => Ok(()),
            Some((_, qpn)) => Err(VerbsError::InvalidArgument {
                call: "SendQueue::flush",
                reason: format!("this queue posts to QP {qpn:#x}, not to QP {:#x}", qp.qp_num()),
            }),
            None => {
                if self.id == 0 {
                    self.id = next_id()?;
                }
                self.qp = Some((qp.identity(), qp.qp_num()));
                Ok(())
            }
        }
    }

    /// Ties the queue to `pool` (at the first post) or checks that it is that pool.
    #[inline(always)]
    fn bind_pool<P: Provider>(&mut self, pool: &SendPool<P>) -> Result<()> {
        if self.pool == pool.id {
            return Ok(());
        }
        if self.pool == 0 {
            self.pool = pool.id;
            return Ok(());
        }
        Err(VerbsError::InvalidArgument {
            call: "SendQueue::flush",
            reason: "a send queue posts buffers of one send pool only".into(),
        })
    }

    /// Gives back a buffer taken for this queue ([`SendPool::acquire_for`]) and not queued.
    #[inline]
    pub fn give_back<P: Provider>(&mut self, pool: &mut SendPool<P>, buf: SendBuf) {
        if buf.pool == pool.id {
            self.taken = self.taken.saturating_sub(1);
        }
        pool.give_back(buf);
    }

    /// Send buffers that posted WRs of this queue read and no polled completion retired yet.
    pub fn posted_bufs(&self) -> usize {
        self.bufs.len()
    }

    /// Queues an RDMA WRITE of `mirror[offset, offset + len)` to the peer's ring at the same
    /// offset. `mark` is the ring producer's mark for it (its tail right after this body,
    /// [`crate::session::Session::ring_write_mark`]), reported by
    /// [`SendQueue::take_ring_mark`] once a polled completion retires this WRITE.
    pub fn write<P: Provider>(
        &mut self,
        mirror: &SendMirror<P>,
        offset: u32,
        len: u32,
        ring_addr: u64,
        rkey: u32,
        mark: u32,
    ) {
        self.pending.push(PendingWr {
            sge: mirror.mr.sge(offset as usize, len),
            op: SendOp::RdmaWrite { remote_addr: ring_addr + u64::from(offset), rkey },
            buf: u32::MAX,
            staged: u32::MAX,
            inline: false,
            sges: (0, 0),
        });
        self.push_mark(mark);
    }

    /// Queues one RDMA WRITE of `len` bytes to the peer's ring at `offset` whose gather list
    /// reads `mirror[offset, offset + len)` except the ranges of `refs` (registered user
    /// buffers, [`RegisteredPool::reference`](super::RegisteredPool::reference)), taken out of
    /// `refs`: their bytes go to the ring from where they are. The `Bytes` are held until a
    /// polled completion retires this WRITE ([`SendQueue::retire_held`]) or the queue is
    /// dropped (its QP first). The WR has `2 × refs + 1` SGEs at most: keep within the QP's
    /// `max_send_sge` (the post fails otherwise). `mark` as for [`SendQueue::write`]. Returns
    /// the bytes WRITTEN from `refs`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`], nothing queued and `refs` untouched, when the refs are
    /// not in order, overlap, or reach past `len`, or the range is outside the mirror.
    pub fn write_gather<P: Provider>(
        &mut self,
        mirror: &SendMirror<P>,
        offset: u32,
        len: u32,
        refs: &mut Vec<super::RegisteredRef>,
        remote: (u64, u32),
        mark: u32,
    ) -> Result<u64> {
        let mut end = 0u64;
        let fits = refs.iter().all(|r| {
            let ok = u64::from(r.at) >= end;
            end = u64::from(r.at) + r.bytes.len() as u64;
            ok
        });
        if !fits || end > u64::from(len) || offset as usize + len as usize > mirror.len() {
            return Err(VerbsError::InvalidArgument {
                call: "SendQueue::write_gather",
                reason: format!(
                    "registered refs out of order or past the body's {len} bytes, or a body at \
                     {offset} past the mirror's {} bytes",
                    mirror.len()
                ),
            });
        }
        let (ring_addr, rkey) = remote;
        let at = self.gather.len() as u32;
        let wr = self.posted + self.pending.len() as u64 + 1;
        let mut from = 0u32;
        let mut zero_copy = 0u64;
        for super::RegisteredRef { at: o, bytes: b, lkey } in refs.drain(..) {
            if o > from {
                self.gather.push(mirror.mr.sge((offset + from) as usize, o - from));
            }
            self.gather.push(Sge { addr: b.as_ptr() as u64, length: b.len() as u32, lkey });
            from = o + b.len() as u32;
            zero_copy += b.len() as u64;
            self.held.push_back((wr, b));
        }
        if len > from {
            self.gather.push(mirror.mr.sge((offset + from) as usize, len - from));
        }
        self.pending.push(PendingWr {
            sge: Sge { addr: 0, length: 0, lkey: 0 },
            op: SendOp::RdmaWrite { remote_addr: ring_addr + u64::from(offset), rkey },
            buf: u32::MAX,
            staged: u32::MAX,
            inline: false,
            sges: (at, self.gather.len() as u32 - at),
        });
        self.push_mark(mark);
        Ok(zero_copy)
    }

    /// Drops the registered user buffers whose WRITEs polled completions retired (call after
    /// [`SendQueue::on_completion`]).
    #[inline]
    pub fn retire_held(&mut self) {
        while self.held.front().is_some_and(|h| h.0 <= self.completed) {
            self.held.pop_front();
        }
    }

    /// Remembers `mark` for the WRITE just queued (the last pending WR): it will be posted as WR
    /// number `posted + pending.len()`, since pending WRs are posted in order.
    #[inline]
    fn push_mark(&mut self, mark: u32) {
        self.ring_marks.push_back((self.posted + self.pending.len() as u64, mark));
    }

    /// The mark of the latest ring WRITE that polled completions retired since the last call
    /// (call after [`SendQueue::on_completion`]), `None` when none did. WRITEs retire in posting
    /// order, so every byte placed up to that mark is no longer read by a WRITE of this queue:
    /// hand it to [`crate::session::Session::on_ring_written`]. Allocates nothing.
    #[inline]
    pub fn take_ring_mark(&mut self) -> Option<u32> {
        let mut last = None;
        while let Some(&(at, mark)) = self.ring_marks.front() {
            if at > self.completed {
                break;
            }
            self.ring_marks.pop_front();
            last = Some(mark);
        }
        last
    }

    /// Queues an RDMA WRITE of `staged[from, from + len)` to the peer's ring at `remote`
    /// (address, rkey), with its ring `mark` (as for [`SendQueue::write`]: every ring WRITE
    /// carries one, so the producer's retired count reaches every placement). Returns the token
    /// while bytes after this piece remain; the WRITE of the last piece consumes it (its range is
    /// freed by the completion covering that WRITE, see [`SendQueue::retire_staged`]). A piece
    /// outside the body, a token of another staging area, or a staging area other than the one
    /// this queue wrote from first, queues nothing and gives the token back.
    pub fn write_staged<P: Provider>(
        &mut self,
        staging: &SendStaging<P>,
        staged: Staged,
        from: u32,
        len: u32,
        remote: (u64, u32),
        mark: u32,
    ) -> Option<Staged> {
        let (remote_addr, rkey) = remote;
        if staged.pool != staging.id
            || (self.staging != 0 && self.staging != staging.id)
            || from.checked_add(len).is_none_or(|end| end > staged.len)
        {
            return Some(staged);
        }
        self.staging = staging.id;
        let last = from + len == staged.len;
        self.pending.push(PendingWr {
            sge: staging.mr.sge((staged.offset + from) as usize, len),
            op: SendOp::RdmaWrite { remote_addr, rkey },
            buf: u32::MAX,
            staged: if last { staged.seq } else { u32::MAX },
            inline: false,
            sges: (0, 0),
        });
        self.push_mark(mark);
        if last {
            None
        } else {
            Some(staged)
        }
    }

    /// Queues a SEND of the first `len` bytes of send buffer `buf` (consumed: it is the NIC's
    /// until a signaled completion retires it); with `inline`, the bytes are copied into the WQE
    /// (`len` must not exceed the QP's `max_inline_data`). A token of another pool is dropped;
    /// one of a pool other than the one this queue sends from is given back to it, unsent.
    #[inline]
    pub fn send<P: Provider>(&mut self, pool: &mut SendPool<P>, buf: SendBuf, len: u32, inline: bool) {
        if buf.pool != pool.id {
            return;
        }
        if self.pool != pool.id {
            if self.pool != 0 {
                return self.give_back(pool, buf);
            }
            self.pool = pool.id;
        }
        let idx = buf.idx;
        std::mem::forget(buf);
        self.taken = self.taken.saturating_sub(1);
        let len = len.min(pool.buf_size as u32);
        self.pending.push(PendingWr {
            sge: pool.sge(idx, len),
            op: SendOp::Send,
            buf: idx,
            staged: u32::MAX,
            inline,
            sges: (0, 0),
        });
    }

    /// Posts everything queued with one doorbell per [`POST_BATCH`] WRs. The last WR of a batch
    /// is signaled when the batch holds non-inline sends or ring WRITEs, or half the send queue
    /// went unsignaled; every WR's `wr_id` carries `tag` (31 bits, [`Completion::send_tag`]).
    /// The buffers of inline SENDs are free again once the post returns (the NIC copied their
    /// bytes into the WQEs); the others stay with this queue until the batch's signaled
    /// completion retires them, so no buffer waits on a later post of this queue (with a pool
    /// shared by many queues, a queue that goes quiet must not hold buffers its neighbours
    /// wait for). Allocates nothing.
    ///
    /// Why every batch with a ring WRITE is signaled: the ring producer reuses a range of the peer's
    /// ring (and so of our send mirror) only once a polled completion retired the WRITE that reads
    /// it ([`SendQueue::take_ring_mark`]), and an unsignaled WR is retired only by a later signaled
    /// one. Left unsignaled, a WRITE followed by no other traffic would hold its range forever and
    /// a producer waiting for it would stall. The alternative, signaling only when the producer is
    /// blocked on retirement, needs a way back from the session to a queue that may have nothing
    /// left to post; a CQE per batch that carries a ring body (a body above the eager threshold,
    /// kilobytes to megabytes) costs little next to its WRITE. Batches of eager SENDs only are
    /// signaled as before.
    ///
    /// # Errors
    /// The verbs error of posting; the QP is then unusable (the caller closes the connection).
    /// [`VerbsError::InvalidArgument`] (nothing posted) for a QP other than the one this queue
    /// posted to first, or a pool other than the one it posted from first (or one another queue
    /// posts from).
    pub fn flush<P: Provider>(&mut self, qp: &P::QueuePair, pool: &mut SendPool<P>, tag: u32) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.bind_qp(qp)?;
        self.bind_pool(pool)?;
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

    /// Posts the SEND of the first `len` bytes of send buffer `buf` at once, with a doorbell of
    /// its own: [`SendQueue::send`] then [`SendQueue::flush`] with their checks made once (the
    /// latency case, a client's call that goes now). With anything queued already (or a
    /// buffer, pool or QP `flush` would refuse) it is queued behind that and everything is
    /// flushed: the order holds either way.
    ///
    /// # Errors
    /// As [`SendQueue::flush`]'s; after a verbs error the SEND stays queued (as a flush leaves
    /// what it could not post), so [`SendQueue::discard_pending`] gives its buffer back.
    #[inline]
    pub fn send_now<P: Provider>(
        &mut self,
        qp: &P::QueuePair,
        pool: &mut SendPool<P>,
        buf: SendBuf,
        len: u32,
        inline: bool,
        tag: u32,
    ) -> Result<()> {
        let bound = matches!(self.qp, Some((identity, _)) if identity == qp.identity());
        if !self.pending.is_empty() || buf.pool != pool.id || self.pool != pool.id || !bound {
            self.send(pool, buf, len, inline);
            return self.flush(qp, pool, tag);
        }
        let idx = buf.idx;
        std::mem::forget(buf);
        self.taken = self.taken.saturating_sub(1);
        let sge = pool.sge(idx, len.min(pool.buf_size as u32));
        // `post_chunk`'s one WR, built here rather than through `pending`: the same signaling
        // (a buffer the NIC reads by DMA, or half the send queue unsignaled) and bookkeeping.
        let (signal, unsignaled) = self.signal_for(1, !inline);
        let mut flags = if inline { SendFlags::INLINE } else { SendFlags::EMPTY };
        if signal {
            flags |= SendFlags::SIGNALED;
        }
        let wr = SendWr {
            wr_id: send_wr_id(tag, self.id, signal),
            sg_list: std::slice::from_ref(&sge),
            op: SendOp::Send,
            flags,
        };
        // SAFETY: as in `post_chunk` (whose one-WR case this is): the SGE lies in send buffer
        // `idx` of `pool` (dropped after every QP its queues post to), whose token was consumed
        // above, so nothing writes the buffer until it is free again: right after this call
        // returns when inline (its bytes are in the WQE), else when a polled signaled completion
        // of this queue's own WR on its one QP (`bind_qp`, checked above) retires it
        // (`self.bufs`, `on_completion`) or `reclaim` destroys the QP first. `has_room`, checked
        // when the buffer was taken, keeps the posted WQEs within the send queue.
        if let Err(e) = unsafe { qp.post_send(std::slice::from_ref(&wr)) } {
            // Left queued, as a flush leaves what it could not post (`discard_pending` gives
            // its buffer back).
            self.pending.push(PendingWr {
                sge,
                op: SendOp::Send,
                buf: idx,
                staged: u32::MAX,
                inline,
                sges: (0, 0),
            });
            return Err(e);
        }
        if inline {
            // Copied into the WQE by the post: the NIC does not read the buffer.
            pool.free_posted(idx);
        } else {
            self.bufs.push_back(idx);
        }
        self.note_posted(1, signal, u16::from(!inline), unsignaled);
        Ok(())
    }

    /// Selective signaling of a batch of `n` WRs about to be posted: signaled when the NIC reads
    /// some of its memory by DMA (`dma`: nothing else gives a send buffer, a mirror range or a
    /// staged range back), or when half the send queue would be unsignaled. Returns whether to
    /// signal the batch's last WR and the unsignaled count if not.
    #[inline(always)]
    fn signal_for(&self, n: usize, dma: bool) -> (bool, usize) {
        let unsignaled = self.unsignaled + n;
        (dma || unsignaled >= (self.depth / 2).max(1), unsignaled)
    }

    /// Counts a posted batch of `n` WRs ([`SendQueue::signal_for`]'s `signal` and
    /// `unsignaled`): a signaled one retires, with its completion, everything up to it and
    /// `dma_bufs` send buffers.
    #[inline(always)]
    fn note_posted(&mut self, n: usize, signal: bool, dma_bufs: u16, unsignaled: usize) {
        self.posted += n as u64;
        self.outstanding += n;
        if signal {
            self.signals.push_back((self.posted, dma_bufs));
            self.unsignaled = 0;
        } else {
            self.unsignaled = unsignaled;
        }
    }

    /// Posts the first `N` (at most) queued WRs with one doorbell. Inlined into `flush`
    /// (`send_now` posts its one WR itself, without a round trip through `pending`): with two
    /// callers of `post_chunk::<1>` the compiler kept one out of line, a call that cost a
    /// worker's flush about 70 instructions per message.
    #[inline(always)]
    fn post_chunk<P: Provider, const N: usize>(
        &mut self,
        qp: &P::QueuePair,
        pool: &mut SendPool<P>,
        tag: u32,
    ) -> Result<()> {
        let n = self.pending.len().min(N);
        // Send buffers the NIC reads by DMA (non-inline SENDs).
        let mut bufs = 0usize;
        let mut dma_bufs = false;
        let wr_id = send_wr_id(tag, self.id, false);
        let mut wrs = [SendWr { wr_id, sg_list: &[], op: SendOp::Send, flags: SendFlags::EMPTY }; N];
        for (wr, p) in wrs.iter_mut().zip(&self.pending[..n]) {
            let flags = if p.inline { SendFlags::INLINE } else { SendFlags::EMPTY };
            let sg_list = if p.sges.1 == 0 {
                std::slice::from_ref(&p.sge)
            } else {
                let (at, k) = (p.sges.0 as usize, p.sges.1 as usize);
                self.gather.get(at..at + k).unwrap_or(&[])
            };
            *wr = SendWr { wr_id, sg_list, op: p.op, flags };
            if p.buf != u32::MAX {
                if !p.inline {
                    bufs += 1;
                    dma_bufs = true;
                }
            } else {
                // A ring WRITE (every WR without a send buffer is one): its mirror range is
                // reserved again, and its staged range freed, only with a completion at or after
                // it, so the batch is signaled (see `flush`).
                dma_bufs = true;
            }
        }
        // Selective signaling: a completion retires WQEs and send buffers. Buffers the NIC reads
        // by DMA want it in this batch (nothing else gives them back); inline SENDs hold no
        // buffer once posted, only WQEs.
        let (signal, unsignaled) = self.signal_for(n, dma_bufs);
        if signal {
            wrs[n - 1].flags |= SendFlags::SIGNALED;
            wrs[n - 1].wr_id = send_wr_id(tag, self.id, true);
        }
        // SAFETY: every SGE lies in a send buffer of `pool` (which the caller drops after every QP
        // its queues post to: a connection's own pool is its field after its QP, a worker's is
        // its field after every session's), in the send mirror or in the staging
        // area, MRs owned next to `qp` by the same connection and dropped after it, or in a
        // registered user buffer (`write_gather`) whose `Bytes` this queue holds (`held`) until
        // a polled completion at or after its WRITE retires it (`retire_held`), or until the
        // queue is dropped, after the QP (the connection's field order). A send
        // buffer's token was consumed by `send`, so nothing writes it until it is free again:
        // an inline SEND's right after this call returns (its bytes are in the WQE; the NIC
        // never reads the buffer after the post), a DMA one's when a signaled completion at or
        // after its WR retires it (`self.bufs`, freed only by `on_completion`, which takes a
        // polled `Completion` of this queue's own signaled WR (its identity in the `wr_id`, which
        // no other queue uses, see `RESERVED_WR_IDS`) on this queue's one QP (`bind_qp`), and
        // retires exactly what that WR covers (`signals`), to the one pool this queue posts
        // (`bind_pool`)), or by `reclaim`, which destroys the QP first. A mirror range is not reserved again until the peer reports it freed
        // and a polled completion at or after its WRITE retired it (`take_ring_mark`, the
        // producer's retired count, `RingProducer::on_written`), whatever the peer reports; the
        // mirror hands out no view of other ranges (`MirrorView`), and copies into it
        // (`write_at`) are atomic. A staged range stays allocated (no view of it is handed out)
        // until the signaled completion at or after its last WRITE is polled (`retire_staged`;
        // every batch with a WRITE is signaled). `has_room`, checked when each buffer was taken, keeps the
        // posted WQEs within the send queue.
        unsafe { qp.post_send(&wrs[..n]) }?;
        for (i, p) in self.pending[..n].iter().enumerate() {
            if p.buf != u32::MAX {
                if p.inline {
                    // Copied into the WQE by the post: the NIC does not read the buffer.
                    pool.free_posted(p.buf);
                } else {
                    self.bufs.push_back(p.buf);
                }
            }
            if p.staged != u32::MAX {
                self.staged.push_back((self.posted + i as u64 + 1, p.staged));
            }
        }
        self.note_posted(n, signal, bufs as u16, unsignaled);
        if n == self.pending.len() {
            // The usual case (one batch): no drain bookkeeping for `Copy` entries.
            self.pending.clear();
            self.gather.clear();
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
    /// The verbs error of posting (QP not in RTS, send queue full); [`VerbsError::InvalidArgument`]
    /// for a QP other than the one this queue posts to.
    pub fn bind_window<P: Provider>(
        &mut self,
        qp: &P::QueuePair,
        ring: &RecvRing<P>,
        tag: u32,
    ) -> Result<()> {
        let Some((mw, rkey)) = &ring.mw else { return Ok(()) };
        self.bind_qp(qp)?;
        let bind = MwBind {
            mr: ring.mr.handle(),
            addr: ring.mr.addr(),
            length: ring.mr.len() as u64,
            access: AccessFlags::REMOTE_WRITE,
        };
        let wr = SendWr {
            wr_id: send_wr_id(tag, self.id, true),
            sg_list: &[],
            op: SendOp::BindMw { mw: mw.handle(), rkey: *rkey, bind },
            flags: SendFlags::SIGNALED,
        };
        // SAFETY: a bind WR has no SGEs; the window and the MR it names are owned by `ring`,
        // which the caller keeps next to `qp` (the connection's fields), and only this call binds
        // that window, once, from the thread that owns the connection. The window grants
        // REMOTE_WRITE only: the ring is read only by copies (`RecvRing::copy_out`).
        unsafe { qp.post_send(std::slice::from_ref(&wr)) }?;
        // Queued ring WRITEs now post one WR later.
        for m in self.ring_marks.iter_mut().filter(|m| m.0 > self.posted) {
            m.0 += 1;
        }
        for h in self.held.iter_mut().filter(|h| h.0 > self.posted) {
            h.0 += 1;
        }
        // Signaled: its completion retires it and whatever unsignaled WRs went before it.
        self.posted += 1;
        self.outstanding += 1;
        // Unsignaled WRs hold no send buffer (a batch with one is signaled).
        self.signals.push_back((self.posted, 0));
        self.unsignaled = 0;
        Ok(())
    }

    /// Gives back what a polled completion of this queue's signaled WR retires: that WR, every
    /// WR before it, their send buffers (to `pool`, the pool this queue posts from) and, through
    /// [`SendQueue::retire_staged`], their staged ranges. Returns false, retiring nothing, for a
    /// failed completion (the QP is in ERR: its WRs complete flushed, and their memory is given
    /// back when the connection is dropped, QP first), one of another queue or QP, an unsignaled
    /// WR's (QPs with `sq_sig_all`), or when `pool` is not this queue's.
    #[inline]
    pub fn on_completion<P: Provider>(&mut self, c: Completion, pool: &mut SendPool<P>) -> bool {
        let wc = c.wc();
        if !wc.status.is_success()
            || wc.wr_id & SEND_WR_BIT == 0
            || self.id == 0
            || wc.wr_id as u32 != (self.id | SIGNALED_BIT)
            || self.qp.map(|(_, qpn)| qpn) != Some(wc.qp_num)
        {
            return false;
        }
        let Some(&(at, bufs)) = self.signals.front() else { return false };
        if bufs > 0 && pool.id != self.pool {
            return false;
        }
        self.signals.pop_front();
        self.completed = at;
        self.outstanding = (self.posted - at) as usize;
        for _ in 0..bufs {
            match self.bufs.pop_front() {
                Some(b) => pool.free_posted(b),
                None => break,
            }
        }
        true
    }

    /// Frees the staged ranges whose last WRITE a polled completion retired (call after
    /// [`SendQueue::on_completion`]); nothing for a staging area this queue does not write from.
    #[inline]
    pub fn retire_staged<P: Provider>(&mut self, staging: &mut SendStaging<P>) {
        if staging.id != self.staging {
            return;
        }
        while let Some(&(at, seq)) = self.staged.front() {
            if at > self.completed {
                break;
            }
            self.staged.pop_front();
            staging.finish(seq);
        }
    }

    /// Whether a WR of this queue may still read a send mirror or a staging area: a ring WRITE
    /// queued, or posted and not yet reported retired by [`SendQueue::take_ring_mark`] (every
    /// WRITE, from a mirror or a staging area, carries a ring mark), or a staged range whose
    /// last WRITE no polled completion retired yet. A QP in ERR retires nothing (its
    /// completions fail), so this stays true until the connection is dropped, QP first.
    #[inline]
    pub fn reads_send_areas(&self) -> bool {
        !self.ring_marks.is_empty() || !self.staged.is_empty()
    }

    /// Gives back (deregisters, by dropping them) a send mirror and a staging area this queue
    /// WRITEs from, once no WR of it may read them any more ([`SendQueue::reads_send_areas`]
    /// false) and the staging area holds no body ([`SendStaging::used`] 0: no [`Staged`] token
    /// of it is alive); the queue may then write from another staging area. Otherwise hands
    /// both back unchanged.
    ///
    /// # Errors
    /// The mirror and the staging area, unchanged, while a WR may still read them or a body
    /// waits in the staging area.
    #[allow(clippy::result_large_err)]
    pub fn release_send_areas<P: Provider>(
        &mut self,
        mirror: SendMirror<P>,
        staging: SendStaging<P>,
    ) -> std::result::Result<(), (SendMirror<P>, SendStaging<P>)> {
        if self.reads_send_areas() || staging.used() != 0 {
            return Err((mirror, staging));
        }
        if self.staging == staging.id {
            self.staging = 0;
        }
        // No WR of this queue names their keys any more (checked above): dropping them
        // deregisters memory no posted WR reads.
        drop(mirror);
        drop(staging);
        Ok(())
    }

    /// Drops the WRs queued and not posted yet (the connection is closing): their send buffers
    /// go back to `pool` (the NIC never saw them). A staged range whose last WRITE was queued
    /// stays allocated. Posted WRs keep their memory until their completions are polled, or until
    /// everything is dropped (the QP first).
    pub fn discard_pending<P: Provider>(&mut self, pool: &mut SendPool<P>) {
        while self.ring_marks.back().is_some_and(|m| m.0 > self.posted) {
            self.ring_marks.pop_back();
        }
        // Never posted: the NIC never saw them.
        while self.held.back().is_some_and(|h| h.0 > self.posted) {
            self.held.pop_back();
        }
        self.gather.clear();
        for p in self.pending.drain(..) {
            // Every queued send's buffer is of `self.pool` (checked by `send`).
            if p.buf != u32::MAX && pool.id == self.pool {
                pool.free_posted(p.buf);
            }
        }
    }

    /// Destroys `qp` (by dropping it: its WRs are discarded and the NIC reads none of their
    /// memory any more), then gives every send buffer of this queue back to `pool`: those of
    /// posted WRs no completion retired (a closed session's, whose QP went to ERR) and those
    /// queued and not posted. For a connection that goes while sharing its pool with others (a
    /// server worker's session); its other memory goes with it after the QP as usual. Returns
    /// the buffers given back. A QP other than the one this queue posted to is destroyed all
    /// the same and nothing is given back (those buffers stay lost to the pool: never freed
    /// early).
    pub fn reclaim<P: Provider>(&mut self, qp: P::QueuePair, pool: &mut SendPool<P>) -> usize {
        let ours = self.qp.is_none_or(|(identity, _)| identity == qp.identity());
        drop(qp);
        if !ours || (self.pool != 0 && self.pool != pool.id) {
            return 0;
        }
        let n = self.bufs.len();
        for b in self.bufs.drain(..) {
            pool.free_posted(b);
        }
        self.signals.clear();
        self.outstanding = 0;
        self.discard_pending(pool);
        n
    }
}
