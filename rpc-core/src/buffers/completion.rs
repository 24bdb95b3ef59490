//! Polled completions as proofs: a [`Completion`] exists only for a CQE that a CQ returned from
//! a poll through [`Completions`], once, and is consumed by what it gives back
//! ([`super::RecvPool::take`], [`super::SendQueue::on_completion`]). A [`WorkCompletion`] is plain
//! data that anyone can build; a `Completion` is not.

use std::cell::{Cell, UnsafeCell};

use super::RecvView;
use crate::verbs::{CompletionQueue, Provider, Result, WorkCompletion};

/// Bit set in the `wr_id` of every send WR a [`super::SendQueue`] posts (a receive WR of a
/// [`super::RecvPool`] carries the pool's identity below it, bits 32..=62, and a buffer index in
/// bits 0..=31).
pub(super) const SEND_WR_BIT: u64 = 1 << 63;

/// Bit of a send `wr_id` set on signaled WRs only (the low 32 bits: this bit and the queue's
/// 31-bit identity).
pub(super) const SIGNALED_BIT: u32 = 1 << 31;

/// Work request ids at or above this value are the buffers module's. A WR posted directly with
/// `post_send`/`post_recv` whose completion may be polled through [`Completions`] must use a
/// `wr_id` below it (part of those calls' `# Safety` contract).
pub const RESERVED_WR_IDS: u64 = 1 << 32;

/// A work completion polled from a CQ by [`Completions`]: proof that the work request it names is
/// finished (the NIC no longer reads or writes its memory). Only [`Completions`] makes one, at most
/// once per CQE; it is neither `Clone` nor `Copy`, so it gives memory back at most once:
/// [`super::RecvPool::take`] and [`super::SendQueue::on_completion`] consume it. Its fields are read
/// through [`Completion::wc`].
#[derive(Debug)]
pub struct Completion {
    wc: WorkCompletion,
}

impl Completion {
    /// The completion's fields (a copy of them can be kept; it proves nothing).
    #[inline]
    pub fn wc(&self) -> &WorkCompletion {
        &self.wc
    }

    /// For a WR posted by a [`super::SendQueue`] (signaled or not, BIND_MW included): the `tag`
    /// given to its [`super::SendQueue::flush`] (31 bits). `None` for a receive completion or a
    /// WR posted directly.
    #[inline]
    pub fn send_tag(&self) -> Option<u32> {
        (self.wc.wr_id & SEND_WR_BIT != 0).then_some(((self.wc.wr_id >> 32) as u32) & 0x7fff_ffff)
    }

    /// True for the completion of a receive WR of a [`super::RecvPool`] (whichever pool).
    #[inline]
    pub fn is_recv(&self) -> bool {
        self.wc.wr_id & SEND_WR_BIT == 0 && self.wc.wr_id >= RESERVED_WR_IDS
    }
}

/// A batch of completions polled from a CQ, handed out one by one as [`Completion`]s (an
/// [`Iterator`], or [`Completions::next_completion`] through a shared reference). Holds `N`
/// [`WorkCompletion`]s inline; allocates nothing.
///
/// Every method takes `&self` (the batch is `!Sync`: one thread), so a batch shared by its owner
/// (an `Rc`) can be looked into while its owner is busy with one of its completions: a handler
/// running on a worker's thread polls the CQ for more ([`Completions::poll_more`], appended
/// behind those not taken yet, so they are handed out in CQ order) and reads the first bytes of
/// the receives not taken yet ([`Completions::untaken_recv_heads`]) to see whether its caller
/// sent a Cancel.
pub struct Completions<const N: usize> {
    wcs: UnsafeCell<[WorkCompletion; N]>,
    len: Cell<usize>,
    next: Cell<usize>,
}

impl<const N: usize> Default for Completions<N> {
    fn default() -> Self {
        Completions {
            wcs: UnsafeCell::new([WorkCompletion::default(); N]),
            len: Cell::new(0),
            next: Cell::new(0),
        }
    }
}

impl<const N: usize> std::fmt::Debug for Completions<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries((self.next.get()..self.len.get()).map(|i| self.get(i))).finish()
    }
}

impl<const N: usize> Completions<N> {
    /// An empty batch.
    pub fn new() -> Completions<N> {
        Completions::default()
    }

    /// A copy of entry `i` (< `N`).
    #[inline(always)]
    fn get(&self, i: usize) -> WorkCompletion {
        // SAFETY: no reference into `wcs` outlives a method of this type (each returns copies),
        // the type is `!Sync` (one thread), and no method calls out while it holds one (the CQ
        // poll below is the sealed provider's, which never calls back), so this shared read
        // overlaps no write.
        unsafe { (*self.wcs.get())[i] }
    }

    /// Polls into entries `from..N` and returns how many landed.
    #[inline(always)]
    fn poll_into<C: CompletionQueue>(&self, cq: &C, from: usize) -> Result<usize> {
        // SAFETY: as in `get`: this exclusive reference lives for the provider's poll only, which
        // writes the WCs and calls nothing of ours (`Provider` is sealed).
        let wcs = unsafe { &mut *self.wcs.get() };
        cq.poll(&mut wcs[from..])
    }

    /// Polls up to `N` completions from `cq` (`ibv_poll_cq`) and returns how many; those of the
    /// previous poll not taken yet are dropped (whatever they would have given back stays lost to
    /// its pool). Never blocks. Inlined: an empty poll (as many as the others while a caller
    /// waits) costs no call of its own.
    ///
    /// # Errors
    /// The CQ's error (overrun); the batch is then empty.
    #[inline(always)]
    pub fn poll<C: CompletionQueue>(&self, cq: &C) -> Result<usize> {
        self.len.set(0);
        self.next.set(0);
        let n = self.poll_into(cq, 0)?;
        self.len.set(n);
        Ok(n)
    }

    /// Polls more completions from `cq` behind those not taken yet (moved to the front first), up
    /// to `N` in the batch, and returns how many landed (0 when the batch is full of completions
    /// not taken). They are handed out after those already here, so in the CQ's order. Never
    /// blocks.
    ///
    /// # Errors
    /// The CQ's error (overrun); the completions already here stay.
    pub fn poll_more<C: CompletionQueue>(&self, cq: &C) -> Result<usize> {
        let (next, len) = (self.next.get(), self.len.get());
        if next > 0 {
            // SAFETY: as in `get`; the reference lives for this move only.
            let wcs = unsafe { &mut *self.wcs.get() };
            wcs.copy_within(next..len, 0);
            self.next.set(0);
            self.len.set(len - next);
        }
        let len = self.len.get();
        if len == N {
            return Ok(0);
        }
        let n = self.poll_into(cq, len)?;
        self.len.set(len + n);
        Ok(n)
    }

    /// Completions polled and not taken yet.
    pub fn pending(&self) -> usize {
        self.len.get() - self.next.get()
    }

    /// The next completion of the last poll (and of [`Completions::poll_more`] since), each once.
    #[inline(always)]
    pub fn next_completion(&self) -> Option<Completion> {
        let i = self.next.get();
        if i >= self.len.get() {
            return None;
        }
        self.next.set(i + 1);
        Some(Completion { wc: self.get(i) })
    }

    /// Calls `f` with each successful receive completion of `pool` not taken yet and a copy of
    /// the first `min(K, byte_len)` bytes the NIC wrote into its buffer (a header, say), in CQ
    /// order. Takes nothing: the completions stay in the batch for their owner.
    ///
    /// The buffer of a receive completion that was polled and not taken is not posted (only
    /// [`super::RecvPool::repost`] posts it again, with the token that taking its completion
    /// gives), so nothing writes it while it is read here; the bytes are copied before `f` runs,
    /// so `f` may do anything, this batch included.
    pub fn untaken_recv_heads<P: Provider, const K: usize>(
        &self,
        pool: &RecvView<P>,
        mut f: impl FnMut(&WorkCompletion, &[u8]),
    ) {
        let mut i = self.next.get();
        loop {
            // `f` may have taken completions (and reposted their buffers), polled or compacted
            // the batch: only entries from the first not taken on are read.
            i = i.max(self.next.get());
            if i >= self.len.get() {
                break;
            }
            let wc = self.get(i);
            i += 1;
            if !wc.status.is_success() {
                continue;
            }
            let mut head = [0u8; K];
            let Some(n) = pool.copy_head(&wc, &mut head) else { continue };
            f(&wc, &head[..n]);
        }
    }
}

impl<const N: usize> Iterator for Completions<N> {
    type Item = Completion;

    /// The next completion of the last poll, each once.
    #[inline(always)]
    fn next(&mut self) -> Option<Completion> {
        self.next_completion()
    }
}
