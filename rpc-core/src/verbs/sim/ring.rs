//! A bounded, lock-free multi-producer multi-consumer ring of fixed-size entries made of
//! `W` atomic 64-bit words, laid out so that a message crosses cores with as few cache-line
//! transfers as possible.
//!
//! Used for the receive queues (RQ, SRQ: posted by the owner, consumed by the requester's
//! executor) and the completion queues (pushed by any executor, popped by the poller).
//!
//! The protocol (a variant of Vyukov's bounded queue, see crossbeam's `ArrayQueue`):
//! - a producer claims position `pos` with a CAS on `tail`, after checking that the ring has
//!   room against a *cached* copy of the consumers' `head` (re-read only when the cache says
//!   full), writes the words, then publishes with `seq = pos + 1` (release);
//! - a consumer at `head` waits for `seq == head + 1` (acquire), reads the words, and claims the
//!   entry with a CAS `head → head + 1` (release); a consumer that loses the race discards what
//!   it read (the words are atomics, so a concurrent overwrite is no data race).
//!
//! Unlike Vyukov's queue, a consumer never writes the slot and a producer never reads it: the
//! slot's line goes from producer to consumer once per entry, and the consumers' `head` line is
//! read by producers only once per lap.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Aligns (and pads) a value to 128 bytes: two cache lines, since x86 prefetches line pairs.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[repr(align(64))]
struct Slot<const W: usize> {
    /// `pos + 1` once the entry for position `pos` is published.
    seq: AtomicUsize,
    words: [AtomicU64; W],
}

#[derive(Default)]
struct Producers {
    tail: AtomicUsize,
    /// A recent value of `head` (never ahead of it).
    head_cache: AtomicUsize,
}

/// The ring's shared header, followed in memory by its slots. It may live in a host segment
/// (shared memory), so it holds only atomics and is valid when zeroed.
#[repr(C)]
struct RingHdr {
    prod: Padded<Producers>,
    head: Padded<AtomicUsize>,
    /// Slot count (a power of two) and the most entries held at once.
    meta: Padded<[AtomicUsize; 2]>,
}

/// The ring: a view of a header and slots in memory it may or may not own.
pub(crate) struct Ring<const W: usize> {
    hdr: *const RingHdr,
    slots: *const Slot<W>,
    mask: usize,
    /// Most entries held at once (`<= slots / 2` for a CQ: the spare half lets producers go a
    /// whole `limit` between two reads of `head`; all slots for a receive queue).
    limit: usize,
    /// The heap layout of memory this ring owns (rings made by `Ring::new`, for tests only).
    heap: Option<std::alloc::Layout>,
}

// SAFETY: the ring's memory is atomics only; its owner keeps it alive while views exist.
unsafe impl<const W: usize> Send for Ring<W> {}
// SAFETY: as above.
unsafe impl<const W: usize> Sync for Ring<W> {}

impl<const W: usize> Drop for Ring<W> {
    fn drop(&mut self) {
        if let Some(layout) = self.heap {
            // SAFETY: `hdr` came from `alloc_zeroed(layout)` in `Ring::new`.
            unsafe { std::alloc::dealloc(self.hdr as *mut u8, layout) };
        }
    }
}

impl<const W: usize> Ring<W> {
    fn slots_for(capacity: usize) -> usize {
        (2 * capacity.max(1)).next_power_of_two()
    }

    /// Bytes of memory (128-byte aligned) a ring of `capacity` needs.
    pub(crate) fn bytes(capacity: usize) -> usize {
        std::mem::size_of::<RingHdr>() + Self::slots_for(capacity) * std::mem::size_of::<Slot<W>>()
    }

    /// Builds a ring holding up to `capacity` entries (at least 1), in `2 * capacity` slots
    /// rounded up to a power of two, in `mem`; `headroom`: a receive queue that holds up to all
    /// its slots (verbs may grant more WQEs than asked; a producer that keeps about `capacity`
    /// entries posted then reads the consumers' `head` only once per `capacity` posts).
    ///
    /// # Safety
    /// `mem` is 128-byte aligned, valid for [`Ring::bytes`]`(capacity)` bytes, zeroed, and
    /// outlives the ring and every view of it.
    pub(crate) unsafe fn init(mem: *mut u8, capacity: usize, headroom: bool) -> Ring<W> {
        let n = Self::slots_for(capacity);
        let limit = if headroom { n } else { capacity.max(1) };
        let hdr = mem as *const RingHdr;
        // SAFETY: `mem` holds a zeroed header (valid atomics), per the contract.
        let h = unsafe { &*hdr };
        h.meta[0].store(n, Ordering::Relaxed);
        h.meta[1].store(limit, Ordering::Release);
        // SAFETY: the slots follow the header inside `mem`.
        let slots = unsafe { mem.add(std::mem::size_of::<RingHdr>()) } as *const Slot<W>;
        Ring { hdr, slots, mask: n - 1, limit, heap: None }
    }

    /// A view of a ring built by [`Ring::init`] at `mem` (a peer's, in its segment); `None` if
    /// its header does not fit in `avail` bytes.
    ///
    /// # Safety
    /// `mem` is valid for `avail` bytes and outlives the view.
    pub(crate) unsafe fn attach(mem: *mut u8, avail: usize) -> Option<Ring<W>> {
        if avail < std::mem::size_of::<RingHdr>() || (mem as usize) % 128 != 0 {
            return None;
        }
        // SAFETY: the header fits (checked) and is atomics only.
        let h = unsafe { &*(mem as *const RingHdr) };
        let n = h.meta[0].load(Ordering::Acquire);
        let limit = h.meta[1].load(Ordering::Acquire);
        let fits = n.is_power_of_two()
            && limit >= 1
            && limit <= n
            && n.checked_mul(std::mem::size_of::<Slot<W>>())
                .is_some_and(|b| b + std::mem::size_of::<RingHdr>() <= avail);
        if !fits {
            return None;
        }
        // SAFETY: inside `mem` (checked above).
        let slots = unsafe { mem.add(std::mem::size_of::<RingHdr>()) } as *const Slot<W>;
        Some(Ring { hdr: mem as *const RingHdr, slots, mask: n - 1, limit, heap: None })
    }

    /// A non-owning view of this ring (valid while the ring's memory is).
    pub(crate) fn view(&self) -> Ring<W> {
        Ring { hdr: self.hdr, slots: self.slots, mask: self.mask, limit: self.limit, heap: None }
    }

    /// A heap-allocated ring holding up to `capacity` entries (see [`Ring::init`]).
    #[cfg(test)]
    pub(crate) fn new(capacity: usize) -> Ring<W> {
        let layout = std::alloc::Layout::from_size_align(Self::bytes(capacity), 128).expect("ring layout");
        // SAFETY: non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!mem.is_null(), "ring allocation");
        // SAFETY: fresh, zeroed, aligned, sized by `bytes`; freed in `drop` after the ring.
        let mut r = unsafe { Ring::init(mem, capacity, false) };
        r.heap = Some(layout);
        r
    }

    #[inline(always)]
    fn h(&self) -> &RingHdr {
        // SAFETY: `hdr` is valid while the ring is (constructors' contracts).
        unsafe { &*self.hdr }
    }

    #[inline(always)]
    fn slot(&self, pos: usize) -> &Slot<W> {
        // SAFETY: `pos & mask` is below the slot count; the slots are valid with the ring.
        unsafe { &*self.slots.add(pos & self.mask) }
    }

    /// Number of entries it holds when full.
    pub(crate) fn capacity(&self) -> usize {
        self.limit
    }

    /// Entries currently in the ring (a snapshot; exact when no one else is operating).
    pub(crate) fn len(&self) -> usize {
        let head = self.h().head.load(Ordering::Acquire);
        let tail = self.h().prod.tail.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Claims the next position for writing; `None` when the ring is full. The claimed position
    /// must then be [`Ring::publish`]ed (consumers wait for it in order).
    #[inline(always)]
    pub(crate) fn claim(&self) -> Option<usize> {
        let cap = self.capacity();
        let mut pos = self.h().prod.tail.load(Ordering::Relaxed);
        loop {
            let cached = self.h().prod.head_cache.load(Ordering::Acquire);
            let used = pos.wrapping_sub(cached) as isize;
            if used < 0 {
                // `pos` is stale (others advanced the tail and consumers the head since).
                pos = self.h().prod.tail.load(Ordering::Relaxed);
                continue;
            }
            if used as usize >= cap {
                let head = self.h().head.load(Ordering::Acquire);
                self.h().prod.head_cache.fetch_max(head, Ordering::AcqRel);
                let used = pos.wrapping_sub(head) as isize;
                if used < 0 {
                    pos = self.h().prod.tail.load(Ordering::Relaxed);
                    continue;
                }
                if used as usize >= cap {
                    return None;
                }
            }
            match self.h().prod.tail.compare_exchange_weak(
                pos,
                pos.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(pos),
                Err(now) => pos = now,
            }
        }
    }

    /// Claims up to `want` (at least 1) consecutive positions for writing with one CAS on the
    /// tail: the first position and how many were claimed (0 when the ring is full; fewer than
    /// `want` when it has room for fewer). Each claimed position must then be
    /// [`Ring::publish`]ed, in order (consumers wait for them in order). A producer that posts a
    /// list of entries pays one locked instruction for the list instead of one per entry
    /// ([`Ring::claim`] is the same for one entry, kept apart for the fewest instructions).
    #[inline(always)]
    pub(crate) fn claim_n(&self, want: usize) -> (usize, usize) {
        let cap = self.capacity();
        let mut pos = self.h().prod.tail.load(Ordering::Relaxed);
        loop {
            let cached = self.h().prod.head_cache.load(Ordering::Acquire);
            let mut used = pos.wrapping_sub(cached) as isize;
            if used < 0 {
                // `pos` is stale (others advanced the tail and consumers the head since).
                pos = self.h().prod.tail.load(Ordering::Relaxed);
                continue;
            }
            if used as usize + want > cap {
                // The cached head says there is no room for all: read the real one.
                let head = self.h().head.load(Ordering::Acquire);
                self.h().prod.head_cache.fetch_max(head, Ordering::AcqRel);
                used = pos.wrapping_sub(head) as isize;
                if used < 0 {
                    pos = self.h().prod.tail.load(Ordering::Relaxed);
                    continue;
                }
                if used as usize >= cap {
                    return (pos, 0);
                }
            }
            let n = want.min(cap - used as usize);
            match self.h().prod.tail.compare_exchange_weak(
                pos,
                pos.wrapping_add(n),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (pos, n),
                Err(now) => pos = now,
            }
        }
    }

    /// Writes the entry at a claimed position with `fill` (relaxed stores into the words) and
    /// publishes it.
    #[inline]
    pub(crate) fn publish(&self, pos: usize, fill: impl FnOnce(&[AtomicU64; W])) {
        let slot = self.slot(pos);
        fill(&slot.words);
        slot.seq.store(pos.wrapping_add(1), Ordering::Release);
    }

    /// Claims, fills and publishes one entry; `false` (and `fill` not called) when full.
    #[cfg(test)]
    pub(crate) fn push(&self, fill: impl FnOnce(&[AtomicU64; W])) -> bool {
        match self.claim() {
            Some(pos) => {
                self.publish(pos, fill);
                true
            }
            None => false,
        }
    }

    /// Hints the CPU to fetch the entry the next `pop` will read (no effect on semantics): a
    /// consumer calls it after a pop, while it waits anyway, so that the next pop hits its cache.
    #[inline]
    pub(crate) fn prefetch_next(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            let pos = self.h().head.load(Ordering::Relaxed);
            let p = self.slot(pos) as *const Slot<W> as *const i8;
            // SAFETY: a prefetch never faults and has no architectural effect; `p` points into
            // the live slot array anyway.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
        }
    }

    /// True when the oldest entry is not published for this lap (what makes [`Ring::pop`]
    /// return `None`): a snapshot for a consumer that looks before it pops. `false` when an
    /// entry is there, or when other consumers moved the head meanwhile (a pop then tells).
    #[inline(always)]
    pub(crate) fn looks_empty(&self) -> bool {
        let pos = self.h().head.load(Ordering::Relaxed);
        let seq = self.slot(pos).seq.load(Ordering::Acquire);
        (seq.wrapping_sub(pos.wrapping_add(1)) as isize) < 0
    }

    /// Takes the oldest entry, giving `read` its words (relaxed loads) in place. `read` may run
    /// more than once when consumers race; only the result of the winning run is returned.
    /// `None` when the oldest entry is not published (none claimed, or its producer is still
    /// writing it: a CQ poll does not wait for a payload copy).
    #[inline]
    pub(crate) fn pop<R>(&self, mut read: impl FnMut(&[AtomicU64; W]) -> R) -> Option<R> {
        self.pop_inner(false, |w| (read(w), true))
    }

    /// Like [`Ring::pop`], but an oldest entry a producer has claimed and not yet published is
    /// waited for (its producer is inside a short, non-blocking write); `None` only when no entry
    /// is claimed. For receive queues: posted to from several threads (an SRQ is shared), a
    /// queue must not look empty to a SEND (an RNR) while a later WQE's post has returned.
    #[inline]
    pub(crate) fn pop_claimed<R>(&self, mut read: impl FnMut(&[AtomicU64; W]) -> R) -> Option<R> {
        self.pop_inner(true, |w| (read(w), true))
    }

    /// The oldest entry as [`Ring::pop_claimed`] finds it (waiting for one a producer has
    /// claimed), without taking it: its position and words, to read with relaxed loads in
    /// place. [`Ring::take`] then takes it; until then another consumer may take it first, and a
    /// producer rewrite its words, so what was read counts only once `take` succeeds. `None`
    /// when no entry is claimed. For the executor of a SEND, which checks a receive WQE before
    /// consuming it, in its own code rather than through a closure.
    #[inline(always)]
    pub(crate) fn peek_claimed(&self) -> Option<(usize, &[AtomicU64; W])> {
        let mut pos = self.h().head.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            let slot = self.slot(pos);
            let seq = slot.seq.load(Ordering::Acquire);
            if seq == pos.wrapping_add(1) {
                return Some((pos, &slot.words));
            }
            if (seq.wrapping_sub(pos.wrapping_add(1)) as isize) < 0 {
                // Not published for this lap. Empty unless a producer has claimed `pos`.
                if self.h().prod.tail.load(Ordering::Acquire) == pos {
                    return None;
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            // Unpublished yet, or already a lap ahead (another consumer took `pos`): look again.
            pos = self.h().head.load(Ordering::Relaxed);
        }
    }

    /// Takes the entry at `pos`, which [`Ring::peek_claimed`] returned; `false` when another
    /// consumer took it first (peek again and discard what was read).
    #[inline(always)]
    pub(crate) fn take(&self, pos: usize) -> bool {
        // Release: a producer that sees the new head (its `head_cache` refresh, acquire) reuses
        // the slot only after our reads of it. Acquire: pairs with a competing consumer's take.
        self.h().head.compare_exchange(pos, pos.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    #[inline(always)]
    fn pop_inner<R>(
        &self,
        wait_claimed: bool,
        mut read: impl FnMut(&[AtomicU64; W]) -> (R, bool),
    ) -> Option<R> {
        let mut pos = self.h().head.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            let slot = self.slot(pos);
            let seq = slot.seq.load(Ordering::Acquire);
            if seq != pos.wrapping_add(1) {
                if (seq.wrapping_sub(pos.wrapping_add(1)) as isize) < 0 {
                    // Not published for this lap. Empty unless a producer has claimed `pos`.
                    if !wait_claimed || self.h().prod.tail.load(Ordering::Acquire) == pos {
                        return None;
                    }
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                    pos = self.h().head.load(Ordering::Relaxed);
                    continue;
                }
                // The slot is already a lap ahead: another consumer took `pos`.
                pos = self.h().head.load(Ordering::Relaxed);
                continue;
            }
            let (r, take) = read(&slot.words);
            if !take {
                return Some(r);
            }
            match self.h().head.compare_exchange_weak(
                pos,
                pos.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(r),
                Err(now) => pos = now,
            }
        }
    }
}

/// Relaxed load of a word (the ring's ordering comes from `seq` and `head`).
#[inline(always)]
pub(crate) fn ld(w: &AtomicU64) -> u64 {
    w.load(Ordering::Relaxed)
}

/// Relaxed store of a word.
#[inline(always)]
pub(crate) fn st(w: &AtomicU64, v: u64) {
    w.store(v, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn push1(r: &Ring<1>, v: u64) -> bool {
        r.push(|w| st(&w[0], v))
    }

    fn pop1(r: &Ring<1>) -> Option<u64> {
        r.pop(|w| ld(&w[0]))
    }

    #[test]
    fn looks_empty_agrees_with_pop_over_laps() {
        let r = Ring::<1>::new(2);
        for lap in 0..5u64 {
            assert!(r.looks_empty(), "lap {lap}: nothing published");
            // A claimed, unpublished entry is not there for a CQ poll either.
            let pos = r.claim().unwrap();
            assert!(r.looks_empty(), "lap {lap}: claimed only");
            r.publish(pos, |w| st(&w[0], lap));
            assert!(!r.looks_empty(), "lap {lap}: one published");
            assert!(push1(&r, lap + 100));
            assert_eq!(pop1(&r), Some(lap));
            assert!(!r.looks_empty(), "lap {lap}: one left");
            assert_eq!(pop1(&r), Some(lap + 100));
            assert!(r.looks_empty(), "lap {lap}: drained");
            assert_eq!(pop1(&r), None);
        }
    }

    #[test]
    fn fifo_and_full() {
        let r = Ring::<1>::new(3);
        assert_eq!(r.capacity(), 3);
        for i in 0..3 {
            assert!(push1(&r, i));
        }
        assert!(!push1(&r, 99), "a full ring refuses");
        assert_eq!(r.len(), 3);
        for i in 0..3 {
            assert_eq!(pop1(&r), Some(i));
        }
        assert_eq!(pop1(&r), None);
        for lap in 0..10u64 {
            assert!(push1(&r, lap));
            assert_eq!(pop1(&r), Some(lap));
        }
    }

    #[test]
    fn pop_claimed_waits_for_the_oldest_entry_a_producer_is_writing() {
        use std::sync::atomic::AtomicBool;
        let r = Arc::new(Ring::<1>::new(4));
        // This thread claims position 0 and is slow to write it.
        let pos = r.claim().unwrap();
        let popping = Arc::new(AtomicBool::new(false));
        let (r2, p2) = (r.clone(), popping.clone());
        // Another producer posts 2 (position 1, published), then a consumer comes.
        let other = std::thread::spawn(move || {
            assert!(push1(&r2, 2));
            assert_eq!(pop1(&r2), None, "a plain pop does not wait for an unpublished entry");
            p2.store(true, Ordering::Release);
            r2.pop_claimed(|w| ld(&w[0]))
        });
        while !popping.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        // Give the consumer the chance to reach the slot (no timing is asserted).
        std::thread::sleep(std::time::Duration::from_millis(20));
        r.publish(pos, |w| st(&w[0], 1));
        assert_eq!(other.join().unwrap(), Some(1), "the oldest entry, once published");
        assert_eq!(r.pop_claimed(|w| ld(&w[0])), Some(2));
        assert_eq!(r.pop_claimed(|w| ld(&w[0])), None, "nothing claimed: empty at once");
    }

    /// `peek_claimed` shows the oldest entry without taking it; `take` fails once another
    /// consumer took that entry, and the next peek shows the one after; a claimed entry is
    /// waited for, an empty ring is `None`.
    #[test]
    fn peek_then_take_loses_to_a_competing_consumer() {
        let r = Arc::new(Ring::<1>::new(4));
        assert!(r.peek_claimed().is_none(), "empty");
        assert!(push1(&r, 1) && push1(&r, 2));
        let (pos, w) = r.peek_claimed().unwrap();
        assert_eq!(ld(&w[0]), 1);
        assert_eq!(r.peek_claimed().map(|(p, _)| p), Some(pos), "a peek takes nothing");
        assert_eq!(r.pop_claimed(|w| ld(&w[0])), Some(1), "another consumer takes it");
        assert!(!r.take(pos), "taken already");
        let (pos2, w) = r.peek_claimed().unwrap();
        assert_eq!((pos2, ld(&w[0])), (pos + 1, 2));
        assert!(r.take(pos2));
        assert!(r.peek_claimed().is_none(), "drained");
        // A producer has claimed the oldest position and not yet written it: the peek waits.
        let pos3 = r.claim().unwrap();
        let r2 = r.clone();
        let peeker = std::thread::spawn(move || {
            let (p, w) = r2.peek_claimed().expect("the claimed entry, once published");
            (p, ld(&w[0]), r2.take(p))
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        r.publish(pos3, |w| st(&w[0], 3));
        assert_eq!(peeker.join().unwrap(), (pos3, 3, true));
    }

    /// `claim_n` claims as many positions as fit with one CAS (all, some, none); consumers take
    /// the claimed entries in order once published. Sabotaged (`claim_n` claiming `want`
    /// whatever the room): failed ("room for one more only").
    #[test]
    fn batched_claims_take_what_fits_in_order() {
        let r = Ring::<1>::new(4);
        let (pos, n) = r.claim_n(3);
        assert_eq!(n, 3, "room for all three");
        for i in 0..3 {
            r.publish(pos + i, |w| st(&w[0], 10 + i as u64));
        }
        let (pos2, n2) = r.claim_n(5);
        assert_eq!((pos2, n2), (pos + 3, 1), "room for one more only");
        assert_eq!(r.claim_n(1).1, 0, "full");
        assert_eq!(r.claim(), None, "full for a single claim too");
        for i in 0..3 {
            assert_eq!(pop1(&r), Some(10 + i));
        }
        assert_eq!(pop1(&r), None, "the oldest entry is claimed, not published");
        r.publish(pos2, |w| st(&w[0], 13));
        assert_eq!(pop1(&r), Some(13));
        assert_eq!(pop1(&r), None, "drained");
        // Over several laps, two at a time.
        for lap in 0..10u64 {
            let (p, n) = r.claim_n(2);
            assert_eq!(n, 2);
            r.publish(p, |w| st(&w[0], lap));
            r.publish(p + 1, |w| st(&w[0], lap + 100));
            assert_eq!((pop1(&r), pop1(&r), pop1(&r)), (Some(lap), Some(lap + 100), None));
        }
    }

    /// Two producers posting batches (`claim_n`, as a receive post of several WRs does) and two
    /// consumers taking entries as a SEND's executor does (`pop_claimed`): every entry is taken
    /// exactly once, and each consumer sees each producer's entries in order. Sabotaged
    /// (`claim_n` advancing the tail by one whatever it claimed): hung (the producers never
    /// finished; killed after 300 s), as did the test above fail.
    #[test]
    fn batched_producers_lose_nothing() {
        let r = Arc::new(Ring::<2>::new(16));
        const N: u64 = 20_000;
        let producers: Vec<_> = (0..2u64)
            .map(|p| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let mut i = 0;
                    while i < N {
                        let (pos, n) = r.claim_n(3.min((N - i) as usize));
                        for k in 0..n {
                            r.publish(pos.wrapping_add(k), |w| {
                                st(&w[0], p);
                                st(&w[1], i + k as u64);
                            });
                        }
                        i += n as u64;
                        if n == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        consume_two(&r, producers, N, |r| r.pop_claimed(|w| (ld(&w[0]), ld(&w[1]))));
    }

    #[test]
    fn two_producers_two_consumers_lose_nothing() {
        let r = Arc::new(Ring::<2>::new(16));
        let producers: Vec<_> = (0..2u64)
            .map(|p| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        while !r.push(|w| {
                            st(&w[0], p);
                            st(&w[1], i);
                        }) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        consume_two(&r, producers, 20_000, |r| r.pop(|w| (ld(&w[0]), ld(&w[1]))));
    }

    /// Runs two consumers popping `r` with `pop` until the `producers` (two, numbered 0 and 1 in
    /// each entry's first word, the second word counting 0..n) are done and the ring is empty,
    /// then checks that each consumer saw each producer's entries in order and that together
    /// they took every entry exactly once.
    fn consume_two(
        r: &Arc<Ring<2>>,
        producers: Vec<std::thread::JoinHandle<()>>,
        n: u64,
        pop: fn(&Ring<2>) -> Option<(u64, u64)>,
    ) {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (r, done) = (r.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    loop {
                        // Read before the pop: once set, an empty pop means nothing more comes.
                        let finished = done.load(std::sync::atomic::Ordering::Acquire);
                        match pop(&r) {
                            Some(v) => got.push(v),
                            None if finished => return got,
                            None => std::thread::yield_now(),
                        }
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        let all: Vec<Vec<(u64, u64)>> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        for got in &all {
            for p in 0..2 {
                let mine: Vec<u64> = got.iter().filter(|v| v.0 == p).map(|v| v.1).collect();
                assert!(mine.windows(2).all(|w| w[0] < w[1]), "each consumer sees a producer's order");
            }
        }
        let mut merged: Vec<(u64, u64)> = all.into_iter().flatten().collect();
        merged.sort();
        let expected: Vec<(u64, u64)> = (0..2).flat_map(|p| (0..n).map(move |i| (p, i))).collect();
        assert_eq!(merged, expected, "every entry delivered exactly once");
    }
}
