//! Posting send WRs: the shared WR checks, the send-queue depth, the fast path that executes a
//! WR at once when nothing is queued ahead, and queueing (with the inline arena).

use super::*;

impl SimQp {
    /// Hands the QP to the timer thread if it waits on a timer and is not there yet.
    #[inline]
    pub(super) fn schedule_if_waiting(&self, waiting: bool) {
        if waiting && !self.core.scheduled.swap(true, Ordering::AcqRel) {
            fabric().schedule(self.core.clone());
        }
    }

    /// Appends `wr` to the send queue (copying inline data into the arena). Guard held.
    fn enqueue(&self, st: &mut SqState, wr: &SendWr<'_>) {
        let c = &*self.core;
        st.make_room(c.cap.max_inline_data as usize);
        let idx = st.slot(st.tail);
        let mut wqe = SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            flags: wr.flags,
            nsge: 0,
            sges: [Sge::default(); MAX_SGE],
            inline_len: NOT_INLINE,
        };
        if wr.flags.contains(SendFlags::INLINE) {
            let max_inline = c.cap.max_inline_data as usize;
            let arena = &mut st.inline[idx * max_inline..(idx + 1) * max_inline];
            let mut off = 0;
            for sge in wr.sg_list {
                let n = sge.length as usize;
                // SAFETY: the caller of `post_send` guarantees that inline SGEs point to readable
                // memory during the call; `off + n <= max_inline` was checked in validation.
                unsafe { std::ptr::copy(sge.addr as *const u8, arena[off..].as_mut_ptr(), n) };
                off += n;
            }
            wqe.inline_len = off as u32;
        } else {
            wqe.nsge = wr.sg_list.len() as u8;
            wqe.sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        }
        st.wqes[idx] = wqe;
        st.tail += 1;
    }

    /// `Some(outstanding WQEs)` when the send queue has no free slot for another WR. Guard held.
    #[inline]
    fn sq_full(&self, st: &mut SqState, depth: u64) -> Option<u64> {
        let c = &*self.core;
        if !c.retire_on_poll {
            let queued = st.tail - st.head;
            return (queued >= depth).then_some(queued);
        }
        if st.tail - st.retired_seen < depth {
            return None;
        }
        // Re-read the count the CQ's poller advances only when the cached one says full. It
        // never passes `head` (a WQE completes only once executed or flushed).
        st.retired_seen = c.host.sq_slots.retired(c.qpn).max(st.retired_seen).min(st.head);
        let outstanding = st.tail - st.retired_seen;
        (outstanding >= depth).then_some(outstanding)
    }

    /// Posts `wrs` with the guard held. The error is boxed: an `Ok` is then one word, not a
    /// whole `VerbsError` copied out through every frame of the post path (about 50
    /// instructions per post on `sim`); [`SimQp::post_send`] unboxes it. Inlined into its one
    /// caller.
    #[inline(always)]
    pub(super) fn post_send_locked(
        &self,
        st: &mut SqState,
        wrs: &[SendWr<'_>],
    ) -> std::result::Result<(), Box<VerbsError>> {
        let c = &*self.core;
        // RTS, or ERR (accepted, then flushed): two compares; any other state goes to the shared
        // rule, which names it in the error.
        let state = c.state_raw();
        if state != ST_RTS && state != ST_ERR {
            rules::check_send_state(c.qpn, state_of(state), rules::InErr::Flush).map_err(Box::new)?;
        }
        let lim = rules::SendLimits { max_sge: c.cap.max_send_sge, max_inline: c.cap.max_inline_data };
        // A refused WR ends the list, but the WRs before it were posted: they still get the
        // flush or the progress below. One WR (a small RPC's SEND) is posted without the loop,
        // whose state would otherwise live on the stack across the transfer.
        let result = match wrs {
            [wr] => self.post_one(st, 0, wr, lim),
            _ => wrs.iter().enumerate().try_for_each(|(index, wr)| self.post_one(st, index, wr, lim)),
        };
        if c.state_raw() == ST_ERR {
            c.flush_sq_locked(st);
        } else if st.head != st.tail {
            c.progress_locked(st);
        }
        result
    }

    /// Posts WR number `index` of a post: checks it, then executes it at once when nothing is
    /// queued ahead, or queues it. Guard held.
    #[inline(always)]
    fn post_one(
        &self,
        st: &mut SqState,
        index: usize,
        wr: &SendWr<'_>,
        lim: rules::SendLimits,
    ) -> std::result::Result<(), Box<VerbsError>> {
        let c = &*self.core;
        rules::check_send_wr(index, wr, lim).map_err(Box::new)?;
        let depth = st.depth;
        if let Some(outstanding) = self.sq_full(st, depth) {
            return Err(sq_full_error(index, outstanding, depth));
        }
        if st.head == st.tail && c.state_raw() == ST_RTS && c.delay_ns.load(Ordering::Relaxed) == 0 {
            // Fast path: nothing queued ahead, execute at once from the caller's WR.
            let src = if wr.flags.contains(SendFlags::INLINE) {
                exec::Src::Raw(wr.sg_list)
            } else {
                exec::Src::Sges(wr.sg_list)
            };
            let view = exec::WqeView { wr_id: wr.wr_id, op: &wr.op, flags: wr.flags, src };
            // The WR takes its send-queue slot (position `seq`) whatever happens.
            let seq = st.tail;
            match c.exec(&mut st.link, &view) {
                exec::Outcome::Done(len) => {
                    c.complete_ok(&view, len, seq);
                    st.tail += 1;
                    st.head += 1;
                }
                exec::Outcome::Stall(kind) => self.post_stalled(st, wr, seq, kind),
                exec::Outcome::Fail(status) => {
                    st.tail += 1;
                    st.head += 1;
                    c.fail_locked(st, seq, wr.wr_id, &wr.op, status);
                }
            }
        } else {
            self.enqueue(st, wr);
        }
        Ok(())
    }

    /// The fast path's WR `wr` (position `seq`) stalled: it is queued, and fails if it has no
    /// retry left. Out of line: rare.
    #[cold]
    #[inline(never)]
    fn post_stalled(&self, st: &mut SqState, wr: &SendWr<'_>, seq: u64, kind: StallKind) {
        let c = &*self.core;
        self.enqueue(st, wr);
        if let Err(status) = c.note_stall(&mut st.stall, &st.link, kind) {
            st.head += 1;
            c.fail_locked(st, seq, wr.wr_id, &wr.op, status);
        }
    }
}

/// The error of a post to a full send queue. Out of line: rare, and formats.
#[cold]
#[inline(never)]
fn sq_full_error(index: usize, outstanding: u64, depth: u64) -> Box<VerbsError> {
    Box::new(VerbsError::BadWorkRequest {
        call: "ibv_post_send",
        index,
        reason: format!(
            "the work queue is full (ENOMEM: {outstanding} WQEs outstanding, max_send_wr {depth}; \
             a WQE is retired when a signaled completion at or after it is polled)"
        ),
    })
}
