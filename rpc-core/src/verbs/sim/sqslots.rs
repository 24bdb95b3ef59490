//! Send-queue occupancy: how a polled send completion returns send-queue slots to its QP.
//!
//! On a NIC, a send WQE (signaled or not) keeps its slot until a signaled completion at or after
//! it has been *polled* from the CQ: mlx5's `ibv_poll_cq` moves the send queue's tail to the WQE a
//! send CQE names, and `ibv_post_send` fails with ENOMEM once `max_send_wr` WQEs are outstanding.
//! The sim does the same. Every send WQE gets a sequence number (its position in the QP's post
//! order); every send CQE the QP pushes (success, error or flush) carries its QP's *tag* and the
//! low 32 bits of that number; [`SimCq`](super::SimCq)'s `poll` hands them to
//! [`SqSlots::retire`], which advances the QP's retired count to just past that WQE. The QP
//! refuses a post while `posted - retired` has reached its depth.
//!
//! The table is private to the process (the CQ and its QPs are of one host, so the poller is in
//! the QP's process): nothing a peer writes into shared memory is trusted here beyond a bounded
//! count. A tag (a per-host creation counter, never 0) tells a QP from an earlier one with the
//! same number, so completions of a destroyed QP still in the CQ retire nothing of a new one.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::shm::QP_DIR_LEN;

/// How a QP's send-queue slots become free again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendQueueMode {
    /// As hardware: a WQE keeps its slot until a signaled completion at or after it (or an error
    /// or flush completion) has been polled from the send CQ. The default.
    #[default]
    RetireOnPoll,
    /// The sim's former behaviour: a slot is free as soon as its WR has executed (a program
    /// that never signals, or polls late, never sees the send queue full).
    RetireOnExecute,
}

/// 0: not chosen yet (read `RPC_SIM_SQ_RETIRE` on first use); 1: on poll; 2: on execute.
static MODE: AtomicU32 = AtomicU32::new(0);

/// Sets how send-queue slots of QPs created from now on are retired (process-wide).
///
/// The default is [`SendQueueMode::RetireOnPoll`], or what the environment variable
/// `RPC_SIM_SQ_RETIRE` says when it is read first: `poll` or `execute`.
pub fn set_send_queue_mode(mode: SendQueueMode) {
    let v = match mode {
        SendQueueMode::RetireOnPoll => 1,
        SendQueueMode::RetireOnExecute => 2,
    };
    MODE.store(v, Ordering::Relaxed);
}

/// The mode QPs created now get (see [`set_send_queue_mode`]).
pub fn send_queue_mode() -> SendQueueMode {
    let mut v = MODE.load(Ordering::Relaxed);
    if v == 0 {
        v = match std::env::var("RPC_SIM_SQ_RETIRE").as_deref() {
            Ok("execute") | Ok("exec") => 2,
            Ok("poll") | Err(_) => 1,
            Ok(other) => {
                tracing::warn!(value = other, "sim: RPC_SIM_SQ_RETIRE is `poll` or `execute`; using `poll`");
                1
            }
        };
        // A concurrent `set_send_queue_mode` wins.
        v = match MODE.compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => v,
            Err(set) => set,
        };
    }
    if v == 2 {
        SendQueueMode::RetireOnExecute
    } else {
        SendQueueMode::RetireOnPoll
    }
}

/// A boxed slice of `n` zeroed `T` from the allocator (which hands out fresh zero pages for a
/// large one, instead of writing every byte).
///
/// # Safety
/// All-zero bytes must be a valid `T` (atomics, integers).
pub(crate) unsafe fn zeroed_slice<T>(n: usize) -> Box<[T]> {
    let layout = std::alloc::Layout::array::<T>(n).expect("a table of a fixed, small size");
    if layout.size() == 0 {
        return Box::new([]);
    }
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `p` is a fresh allocation of `layout` (= `[T; n]`, which a `Box<[T]>` frees with
    // the same layout), zeroed, which the caller promises is a valid `[T; n]`.
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) }
}

/// One QP's slot: who owns it and how many of its WQEs are retired.
#[repr(align(64))]
struct Slot {
    /// `qpn | tag << 32` of the QP using the slot (0 = none).
    owner: AtomicU64,
    /// WQEs retired (a count since the QP's creation: the next WQE to retire).
    retired: AtomicU64,
}

/// The per-host table, indexed like the QP directory (`qpn % QP_DIR_LEN`, unique among live QPs).
pub(crate) struct SqSlots {
    slots: Box<[Slot]>,
    next_tag: AtomicU32,
}

impl SqSlots {
    pub(crate) fn new() -> SqSlots {
        // 1 MiB per host: zeroed by the allocator (pages untouched until a QP uses its slot).
        // SAFETY: `Slot` is two atomics, for which all-zero bytes are a valid value.
        let slots = unsafe { zeroed_slice::<Slot>(QP_DIR_LEN) };
        SqSlots { slots, next_tag: AtomicU32::new(0) }
    }

    /// Claims the slot of a new QP `qpn` (whose directory entry it holds); returns its tag.
    pub(crate) fn attach(&self, qpn: u32) -> u16 {
        let tag = (self.next_tag.fetch_add(1, Ordering::Relaxed) % 0xffff + 1) as u16;
        let s = &self.slots[qpn as usize % QP_DIR_LEN];
        s.retired.store(0, Ordering::Relaxed);
        s.owner.store(qpn as u64 | (tag as u64) << 32, Ordering::Release);
        tag
    }

    /// Releases the slot of a destroyed QP.
    pub(crate) fn detach(&self, qpn: u32) {
        self.slots[qpn as usize % QP_DIR_LEN].owner.store(0, Ordering::Release);
    }

    /// WQEs of QP `qpn` retired so far.
    #[inline]
    pub(crate) fn retired(&self, qpn: u32) -> u64 {
        self.slots[qpn as usize % QP_DIR_LEN].retired.load(Ordering::Acquire)
    }

    /// Sets the retired count (the QP's owner, guard held: a move to RESET discards everything).
    pub(crate) fn reset(&self, qpn: u32, retired: u64) {
        self.slots[qpn as usize % QP_DIR_LEN].retired.fetch_max(retired, Ordering::AcqRel);
    }

    /// A send completion of QP `qpn` (tag `tag`) for the WQE whose sequence number ends in
    /// `seq` was polled: every WQE up to it is retired. Completions of another QP (an earlier
    /// one with this number) or older than what is retired change nothing.
    #[inline]
    pub(crate) fn retire(&self, qpn: u32, tag: u16, seq: u32) {
        let Some(s) = self.slots.get(qpn as usize % QP_DIR_LEN) else { return };
        if s.owner.load(Ordering::Acquire) != qpn as u64 | (tag as u64) << 32 {
            return;
        }
        let r = s.retired.load(Ordering::Relaxed);
        // How far past the retired count the WQE is (a QP has at most 2^14 WQEs outstanding:
        // anything "ahead" by 2^31 or more is an old completion, behind it).
        let ahead = seq.wrapping_sub(r as u32);
        if ahead < 1 << 31 {
            // A plain store, no locked instruction: a CQ is normally polled by one thread; two
            // racing pollers can at worst store a smaller count last, which makes the queue look
            // fuller until the next send completion (the poster never moves its view back).
            s.retired.store(r + ahead as u64 + 1, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retire_advances_past_the_polled_wqe_and_ignores_old_or_foreign_completions() {
        let t = SqSlots::new();
        let tag = t.attach(0x11);
        assert_eq!(t.retired(0x11), 0);
        t.retire(0x11, tag, 4);
        assert_eq!(t.retired(0x11), 5, "WQEs 0..=4 retired");
        t.retire(0x11, tag, 2);
        assert_eq!(t.retired(0x11), 5, "an older completion retires nothing");
        t.retire(0x11, tag.wrapping_add(1).max(1), 9);
        assert_eq!(t.retired(0x11), 5, "another QP's tag retires nothing");
        t.retire(0x11 + QP_DIR_LEN as u32, tag, 9);
        assert_eq!(t.retired(0x11), 5, "another QP number in the same slot retires nothing");
        // Across the 32-bit wrap of the sequence numbers.
        t.reset(0x11, u32::MAX as u64 - 1);
        t.retire(0x11, tag, 3);
        assert_eq!(t.retired(0x11), (1u64 << 32) + 4);
        t.detach(0x11);
        let tag2 = t.attach(0x11);
        assert_ne!(tag, tag2);
        t.retire(0x11, tag, 7);
        assert_eq!(t.retired(0x11), 0, "completions of the destroyed QP retire nothing of the new one");
    }
}
