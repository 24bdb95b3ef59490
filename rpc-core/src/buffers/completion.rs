//! Polled completions as proofs: a [`Completion`] exists only for a CQE that a CQ returned from
//! a poll through [`Completions`], once, and is consumed by what it gives back
//! ([`super::RecvPool::take`], [`super::SendQueue::on_completion`]). A [`WorkCompletion`] is plain
//! data that anyone can build; a `Completion` is not.

use crate::verbs::{CompletionQueue, Result, WorkCompletion};

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
/// [`Iterator`]). Holds `N` [`WorkCompletion`]s inline; allocates nothing.
pub struct Completions<const N: usize> {
    wcs: [WorkCompletion; N],
    len: usize,
    next: usize,
}

impl<const N: usize> Default for Completions<N> {
    fn default() -> Self {
        Completions { wcs: [WorkCompletion::default(); N], len: 0, next: 0 }
    }
}

impl<const N: usize> std::fmt::Debug for Completions<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.peek()).finish()
    }
}

impl<const N: usize> Completions<N> {
    /// An empty batch.
    pub fn new() -> Completions<N> {
        Completions::default()
    }

    /// Polls up to `N` completions from `cq` (`ibv_poll_cq`) and returns how many; those of the
    /// previous poll not taken yet are dropped (whatever they would have given back stays lost to
    /// its pool). Never blocks. Inlined: an empty poll (as many as the others while a caller
    /// waits) costs no call of its own.
    ///
    /// # Errors
    /// The CQ's error (overrun); the batch is then empty.
    #[inline(always)]
    pub fn poll<C: CompletionQueue>(&mut self, cq: &C) -> Result<usize> {
        self.len = 0;
        self.next = 0;
        let n = cq.poll(&mut self.wcs)?;
        self.len = n;
        Ok(n)
    }

    /// The completions polled and not taken yet, to look at (copies prove nothing).
    pub fn peek(&self) -> &[WorkCompletion] {
        &self.wcs[self.next..self.len]
    }
}

impl<const N: usize> Iterator for Completions<N> {
    type Item = Completion;

    /// The next completion of the last poll, each once.
    #[inline(always)]
    fn next(&mut self) -> Option<Completion> {
        if self.next >= self.len {
            return None;
        }
        let wc = self.wcs[self.next];
        self.next += 1;
        Some(Completion { wc })
    }
}
