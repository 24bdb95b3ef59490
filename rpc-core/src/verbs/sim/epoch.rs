//! Grace periods for peers in other processes: epoch-based reclamation of a host segment's
//! memory (MR buffers and keys, QP, CQ and receive-queue state) across processes.
//!
//! In this process, a transfer runs under its requester QP's guard, so taking every guard once
//! is a grace period ([`super::fabric::quiesce`]). A requester in *another* process cannot be
//! waited for that way; it announces itself instead, as an RCU or crossbeam-epoch reader does:
//!
//! - Every host segment has a table of [`READERS_LEN`] reader slots. A process that maps a peer
//!   host claims one slot there (its pid in `owner`) for as long as it keeps the mapping, and its
//!   monitor thread refreshes the slot's `beat` every tick.
//! - Around each transfer into that host (from before it checks the responder QP or resolves a
//!   key until after the copy and the completions), the requester **pins**: it reads the host's
//!   epoch `e` and swaps `e << 1 | 1` into its slot's `state` (a full barrier), and unpins with a
//!   release store of 0. A pin is held only inside one non-blocking transfer.
//! - The owner reclaims (deregisters an MR, destroys a QP, frees segment memory) in three steps:
//!   make the object unreachable (invalidate the key, set `destroyed`), advance the epoch to `E`
//!   ([`synchronize`]), then wait until no slot is pinned at an epoch below `E`. A reader pinned
//!   at `E` or later read the epoch after the advance, hence after the invalidation (release /
//!   acquire through the epoch word), and cannot find the object; a reader pinned earlier is
//!   waited for; an unpinned one will find it gone. Then the memory is freed and reusable at
//!   once: no fixed quarantine.
//! - A dead reader does not block: while waiting, a slot pinned at an old epoch whose owner
//!   process is gone (`kill(pid, 0)`, zombies count as gone) or whose beat is older than
//!   [`HEARTBEAT_DEAD_NS`] (a recycled pid, a hung process) is cleared and no longer waited for.
//!
//! The reader's key lookup is a `SeqCst` load (a plain load on x86), so "the owner's scan did
//! not see the pin" also orders the lookup after the invalidation (both in the `SeqCst` order).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::shm::{monotonic_ns, my_pid, pid_alive, Segment, HEARTBEAT_DEAD_NS, READERS_LEN, READERS_OFF};

/// A requester process's slot in a host segment (64 bytes; zero = free).
#[repr(C, align(64))]
pub(crate) struct ReaderSlot {
    /// The pid of the process holding the slot (0 = free).
    owner: AtomicU64,
    /// `epoch << 1 | 1` while a transfer is in progress, 0 otherwise.
    state: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the holder's last heartbeat.
    beat: AtomicU64,
}

fn slots(seg: &Segment) -> &[ReaderSlot] {
    debug_assert!(READERS_OFF + READERS_LEN * 64 <= seg.len());
    // SAFETY: the reader table lies inside every mapping of a host segment (layout constants;
    // `Segment::open` refuses a file too short for it), 64-aligned, atomics only (zero = free).
    unsafe { std::slice::from_raw_parts(seg.at(READERS_OFF) as *const ReaderSlot, READERS_LEN) }
}

/// This process's claim on a peer host's reader table (held by the mapping of that host).
pub(crate) struct Reader {
    slot: *const ReaderSlot,
    epoch: *const AtomicU64,
}

// SAFETY: pointers to atomics in a mapping that the holder (the peer host's mapping) keeps alive.
unsafe impl Send for Reader {}
// SAFETY: as above.
unsafe impl Sync for Reader {}

impl Reader {
    /// Claims a free slot (or one whose holder is dead) in `seg`'s reader table; `None` when all
    /// [`READERS_LEN`] are held by live processes.
    ///
    /// The returned value points into `seg`, which must outlive it.
    pub(crate) fn claim(seg: &Segment) -> Option<Reader> {
        let h = seg.header();
        let me = my_pid() as u64;
        let now = monotonic_ns();
        let table = slots(seg);
        let hw = (h.readers_hw.load(Ordering::Acquire) as usize).min(READERS_LEN);
        // First a never-used or released slot, then one of a dead holder.
        let take = |i: usize, seen: u64| {
            let s = &table[i];
            if s.owner.compare_exchange(seen, me, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                return false;
            }
            s.beat.store(now, Ordering::Relaxed);
            // A dead holder's pin, if it left one, is void now.
            s.state.store(0, Ordering::Release);
            h.readers_hw.fetch_max(i as u32 + 1, Ordering::AcqRel);
            true
        };
        let found = (0..READERS_LEN)
            .find(|&i| table[i].owner.load(Ordering::Relaxed) == 0 && take(i, 0))
            .or_else(|| {
                (0..hw).find(|&i| {
                    let o = table[i].owner.load(Ordering::Relaxed);
                    o != me && holder_dead(&table[i], o, now) && take(i, o)
                })
            })?;
        Some(Reader { slot: &table[found], epoch: &h.epoch })
    }

    fn slot(&self) -> &ReaderSlot {
        // SAFETY: points into the mapping the holder keeps alive (see `claim`).
        unsafe { &*self.slot }
    }

    /// Announces a transfer into the host until the returned guard drops.
    #[inline]
    pub(crate) fn pin(&self) -> Pin<'_> {
        // SAFETY: as in `slot`.
        let e = unsafe { &*self.epoch }.load(Ordering::SeqCst);
        // A swap, not a store: the pin must be visible before the transfer's loads (a full
        // barrier; `xchg` on x86).
        self.slot().state.swap(e << 1 | 1, Ordering::SeqCst);
        Pin { slot: self.slot() }
    }

    /// The monitor's heartbeat: the slot's holder is alive.
    pub(crate) fn beat(&self, now: u64) {
        self.slot().beat.store(now, Ordering::Relaxed);
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let s = self.slot();
        s.state.store(0, Ordering::Release);
        s.owner.store(0, Ordering::Release);
    }
}

/// A pinned transfer (see [`Reader::pin`]); unpins on drop.
pub(crate) struct Pin<'a> {
    slot: &'a ReaderSlot,
}

impl Drop for Pin<'_> {
    #[inline]
    fn drop(&mut self) {
        self.slot.state.store(0, Ordering::Release);
    }
}

/// Whether the holder `owner` of `s` is gone: its process does not exist, or its beat is older
/// than [`HEARTBEAT_DEAD_NS`].
fn holder_dead(s: &ReaderSlot, owner: u64, now: u64) -> bool {
    now.saturating_sub(s.beat.load(Ordering::Relaxed)) > HEARTBEAT_DEAD_NS || !pid_alive(owner as u32)
}

/// A grace period for the peers of the host whose own segment is `seg`: advances its epoch and
/// waits until no reader in another process is still inside a transfer that started before,
/// clearing the slots of dead readers. Call it after making the object unreachable and before
/// reusing its memory or key. Returns at once when no peer is inside a transfer.
pub(crate) fn synchronize(seg: &Segment) {
    let h = seg.header();
    let target = h.epoch.fetch_add(1, Ordering::SeqCst) + 1;
    let table = slots(seg);
    let hw = (h.readers_hw.load(Ordering::SeqCst) as usize).min(READERS_LEN);
    let start = Instant::now();
    let mut warned = false;
    for s in &table[..hw] {
        let mut spins = 0u32;
        loop {
            let st = s.state.load(Ordering::SeqCst);
            if st & 1 == 0 || st >> 1 >= target {
                break;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            // Still in a transfer that started before: wait, checking now and then that its
            // process is still there.
            if spins % 256 == 0 {
                let owner = s.owner.load(Ordering::Acquire);
                if owner == 0 || holder_dead(s, owner, monotonic_ns()) {
                    tracing::info!(pid = owner, "sim: a dead peer held a pin; its reader slot is cleared");
                    // Only if still that stale pin (the slot may have been reclaimed meanwhile).
                    let _ = s.state.compare_exchange(st, 0, Ordering::AcqRel, Ordering::Relaxed);
                    let _ = s.owner.compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Relaxed);
                    continue;
                }
            }
            if !warned && start.elapsed() > Duration::from_secs(1) {
                warned = true;
                tracing::warn!(
                    pid = s.owner.load(Ordering::Relaxed),
                    "sim: freeing memory waits for a peer process stuck inside a transfer"
                );
            }
            if spins < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn seg() -> Segment {
        static NEXT: AtomicU32 = AtomicU32::new(0xe000_0000);
        Segment::create(NEXT.fetch_add(1, Ordering::Relaxed)).expect("segment")
    }

    /// A pid that no process has (a reaped child's).
    pub(crate) fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn synchronize_waits_for_a_transfer_pinned_before_and_not_for_later_ones() {
        let seg = Arc::new(seg());
        let reader = Reader::claim(&seg).expect("a free slot");
        assert_eq!(seg.header().readers_hw.load(Ordering::Relaxed), 1);
        // Nobody pinned: no wait.
        synchronize(&seg);
        let pin = reader.pin();
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (seg, done) = (seg.clone(), done.clone());
            std::thread::spawn(move || {
                synchronize(&seg);
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "the grace period waits for the pinned transfer");
        drop(pin);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        // A transfer pinned after the epoch advanced is at the new epoch: what it looks up was
        // invalidated before, so the owner need not wait for it.
        let e = seg.header().epoch.load(Ordering::SeqCst);
        let late = reader.pin();
        assert_eq!(slots(&seg)[0].state.load(Ordering::SeqCst), e << 1 | 1);
        drop(late);
        drop(reader);
        assert_eq!(slots(&seg)[0].owner.load(Ordering::SeqCst), 0, "released with the mapping");
    }

    #[test]
    fn a_dead_reader_pinned_forever_does_not_block_freeing() {
        let seg = seg();
        let table = slots(&seg);
        // A reader process died inside a transfer: its slot stays pinned at epoch 0.
        table[0].owner.store(dead_pid() as u64, Ordering::SeqCst);
        table[0].beat.store(monotonic_ns(), Ordering::SeqCst);
        table[0].state.store(1, Ordering::SeqCst);
        seg.header().readers_hw.store(1, Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        synchronize(&seg);
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(table[0].owner.load(Ordering::SeqCst), 0, "the dead reader's slot is free again");
        // And a new reader may take it.
        let r = Reader::claim(&seg).unwrap();
        assert_eq!(r.slot as usize, &table[0] as *const ReaderSlot as usize);
    }

    #[test]
    fn slots_of_dead_readers_are_reclaimed_when_the_table_is_full() {
        let seg = seg();
        let table = slots(&seg);
        let dead = dead_pid() as u64;
        for s in table {
            s.owner.store(dead, Ordering::Relaxed);
            s.beat.store(monotonic_ns(), Ordering::Relaxed);
        }
        seg.header().readers_hw.store(READERS_LEN as u32, Ordering::SeqCst);
        assert!(Reader::claim(&seg).is_some(), "a dead holder's slot is taken over");
    }
}
