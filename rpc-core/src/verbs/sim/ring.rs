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

/// The ring.
pub(crate) struct Ring<const W: usize> {
    prod: Padded<Producers>,
    head: Padded<AtomicUsize>,
    slots: Box<[Slot<W>]>,
    mask: usize,
    /// Most entries held at once (`<= slots.len() / 2`: the spare half lets producers go a
    /// whole `limit` between two reads of `head`).
    limit: usize,
}

impl<const W: usize> Ring<W> {
    /// A ring holding up to `capacity` entries (at least 1), in `2 * capacity` slots rounded up
    /// to a power of two.
    pub(crate) fn new(capacity: usize) -> Ring<W> {
        let limit = capacity.max(1);
        let n = (2 * limit).next_power_of_two();
        let slots = (0..n)
            .map(|_| Slot { seq: AtomicUsize::new(0), words: std::array::from_fn(|_| AtomicU64::new(0)) })
            .collect();
        Ring { prod: Padded::default(), head: Padded::default(), slots, mask: n - 1, limit }
    }

    /// A ring holding up to `2 * capacity` entries rounded up to a power of two: a receive queue
    /// (verbs may grant more WQEs than asked). A producer that keeps about `capacity` entries
    /// posted then reads the consumers' `head` only once per `capacity` posts, not at every post.
    pub(crate) fn with_headroom(capacity: usize) -> Ring<W> {
        let mut r = Ring::new(capacity);
        r.limit = r.slots.len();
        r
    }

    /// Number of entries it holds when full.
    pub(crate) fn capacity(&self) -> usize {
        self.limit
    }

    /// Entries currently in the ring (a snapshot; exact when no one else is operating).
    pub(crate) fn len(&self) -> usize {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.prod.tail.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Claims the next position for writing; `None` when the ring is full. The claimed position
    /// must then be [`Ring::publish`]ed (consumers wait for it in order).
    #[inline]
    pub(crate) fn claim(&self) -> Option<usize> {
        let cap = self.capacity();
        let mut pos = self.prod.tail.load(Ordering::Relaxed);
        loop {
            let cached = self.prod.head_cache.load(Ordering::Acquire);
            let used = pos.wrapping_sub(cached) as isize;
            if used < 0 {
                // `pos` is stale (others advanced the tail and consumers the head since).
                pos = self.prod.tail.load(Ordering::Relaxed);
                continue;
            }
            if used as usize >= cap {
                let head = self.head.load(Ordering::Acquire);
                self.prod.head_cache.fetch_max(head, Ordering::AcqRel);
                let used = pos.wrapping_sub(head) as isize;
                if used < 0 {
                    pos = self.prod.tail.load(Ordering::Relaxed);
                    continue;
                }
                if used as usize >= cap {
                    return None;
                }
            }
            match self.prod.tail.compare_exchange_weak(
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

    /// Writes the entry at a claimed position with `fill` (relaxed stores into the words) and
    /// publishes it.
    #[inline]
    pub(crate) fn publish(&self, pos: usize, fill: impl FnOnce(&[AtomicU64; W])) {
        let slot = &self.slots[pos & self.mask];
        fill(&slot.words);
        slot.seq.store(pos.wrapping_add(1), Ordering::Release);
    }

    /// Claims, fills and publishes one entry; `false` (and `fill` not called) when full.
    #[inline]
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
            let pos = self.head.load(Ordering::Relaxed);
            let p = &self.slots[pos & self.mask] as *const Slot<W> as *const i8;
            // SAFETY: a prefetch never faults and has no architectural effect; `p` points into
            // the live slot array anyway.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
        }
    }

    /// Takes the oldest entry, giving `read` its words (relaxed loads) in place. `read` may run
    /// more than once when consumers race; only the result of the winning run is returned.
    /// `None` when empty.
    #[inline]
    pub(crate) fn pop<R>(&self, mut read: impl FnMut(&[AtomicU64; W]) -> R) -> Option<R> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & self.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            if seq != pos.wrapping_add(1) {
                if (seq.wrapping_sub(pos.wrapping_add(1)) as isize) < 0 {
                    return None;
                }
                // The slot is already a lap ahead: another consumer took `pos`.
                pos = self.head.load(Ordering::Relaxed);
                continue;
            }
            let r = read(&slot.words);
            match self.head.compare_exchange_weak(
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
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let mut idle = 0u32;
                    while idle < 200_000 {
                        match r.pop(|w| (ld(&w[0]), ld(&w[1]))) {
                            Some(v) => {
                                got.push(v);
                                idle = 0;
                            }
                            None => {
                                idle += 1;
                                std::thread::yield_now();
                            }
                        }
                    }
                    got
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let mut all: Vec<Vec<(u64, u64)>> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        for got in &all {
            for p in 0..2 {
                let mine: Vec<u64> = got.iter().filter(|v| v.0 == p).map(|v| v.1).collect();
                assert!(mine.windows(2).all(|w| w[0] < w[1]), "each consumer sees a producer's order");
            }
        }
        let mut merged: Vec<(u64, u64)> = all.drain(..).flatten().collect();
        merged.sort();
        let expected: Vec<(u64, u64)> = (0..2).flat_map(|p| (0..20_000).map(move |i| (p, i))).collect();
        assert_eq!(merged, expected, "every entry delivered exactly once");
    }
}
