//! A bounded, lock-free multi-producer multi-consumer ring (Dmitry Vyukov's bounded MPMC queue,
//! the algorithm behind crossbeam's `ArrayQueue`), with in-place access to the slots so that a
//! work queue entry is written and read where it lies, without moving whole fixed-size arrays.
//!
//! Used for the receive queues (RQ, SRQ: posted by the owner, consumed by the requester's
//! executor) and the completion queues (pushed by any executor, popped by the poller).
//! Capacity is a power of two; nothing allocates after construction.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

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
struct Slot<T> {
    /// Position stamp: `pos` when free for the producer of `pos`, `pos + 1` when full for the
    /// consumer of `pos`.
    seq: AtomicUsize,
    val: UnsafeCell<MaybeUninit<T>>,
}

/// The ring. `T: Copy` so that dropping a ring with entries in it leaks nothing.
pub(crate) struct Ring<T: Copy> {
    head: Padded<AtomicUsize>,
    tail: Padded<AtomicUsize>,
    slots: Box<[Slot<T>]>,
    mask: usize,
}

// SAFETY: slots are handed to exactly one producer or consumer at a time by the `seq` protocol
// (a successful CAS on `tail`/`head` for the slot's position), so sharing the ring between
// threads only moves `T` values between them, which `T: Send` allows.
unsafe impl<T: Copy + Send> Sync for Ring<T> {}
// SAFETY: as above; the ring owns plain `T: Send` values.
unsafe impl<T: Copy + Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// A ring of `capacity.next_power_of_two()` slots (at least 1).
    pub(crate) fn new(capacity: usize) -> Ring<T> {
        let cap = capacity.max(1).next_power_of_two();
        let slots = (0..cap)
            .map(|i| Slot { seq: AtomicUsize::new(i), val: UnsafeCell::new(MaybeUninit::uninit()) })
            .collect();
        Ring { head: Padded(AtomicUsize::new(0)), tail: Padded(AtomicUsize::new(0)), slots, mask: cap - 1 }
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Entries currently in the ring (a snapshot; exact when no one else is operating).
    pub(crate) fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Appends the value `fill` writes into the slot. Returns `false` (and does not call `fill`)
    /// when the ring is full: `capacity()` entries pushed and not yet claimed by a consumer.
    ///
    /// A slot whose entry a consumer has claimed but not yet released (another thread inside
    /// [`Ring::pop_raw`]) is not "full": the push waits for that consumer, which is running a
    /// short, non-blocking section, as crossbeam's `ArrayQueue` does. Otherwise an SRQ shared by
    /// several requester threads could refuse a post with fewer than `max_wr` WQEs outstanding.
    #[inline]
    pub(crate) fn push_with(&self, fill: impl FnOnce(&mut MaybeUninit<T>)) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            let slot = &self.slots[pos & self.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            let dif = seq.wrapping_sub(pos) as isize;
            if dif == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the CAS made this thread the only producer of position `pos`,
                        // and `seq == pos` says its consumer of the previous lap is done with it.
                        fill(unsafe { &mut *slot.val.get() });
                        slot.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                // The slot still holds the entry of the previous lap. Full only if no consumer
                // has claimed that entry (the head has not moved past it).
                let head = self.head.load(Ordering::Acquire);
                if pos.wrapping_sub(head) as isize >= self.capacity() as isize {
                    return false;
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                pos = self.tail.load(Ordering::Relaxed);
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Appends `v`; `false` when full.
    #[inline]
    pub(crate) fn push(&self, v: T) -> bool {
        self.push_with(|slot| {
            slot.write(v);
        })
    }

    /// Removes the oldest entry, giving `read` a raw pointer to it in place (for entries whose
    /// producer initialised only part of the value). `None` when empty: no entry pushed and not
    /// yet claimed by a consumer.
    ///
    /// An entry a producer has claimed but not yet finished writing (another thread inside
    /// [`Ring::push_with`]) is waited for, as crossbeam's `ArrayQueue` does: otherwise a receive
    /// queue posted to from two threads could look empty to a SEND (an RNR) while a later WQE was
    /// already posted, and entries would not be taken oldest first.
    #[inline]
    pub(crate) fn pop_raw<R>(&self, read: impl FnOnce(*const T) -> R) -> Option<R> {
        let mut pos = self.head.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            let slot = &self.slots[pos & self.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            let dif = seq.wrapping_sub(pos.wrapping_add(1)) as isize;
            if dif == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // The CAS made this thread the only consumer of position `pos`, and
                        // `seq == pos + 1` (acquired) says its producer finished writing it.
                        let r = read(slot.val.get() as *const T);
                        slot.seq.store(pos.wrapping_add(self.mask + 1), Ordering::Release);
                        return Some(r);
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                // The slot is not written for this lap yet. Empty only if no producer has
                // claimed this position (the tail has not moved past it).
                let tail = self.tail.load(Ordering::Acquire);
                if tail == pos {
                    return None;
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                pos = self.head.load(Ordering::Relaxed);
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Removes the oldest entry (which its producer fully initialised), giving `read` a
    /// reference to it in place. `None` when empty.
    #[inline]
    pub(crate) fn pop_with<R>(&self, read: impl FnOnce(&T) -> R) -> Option<R> {
        // SAFETY: entries popped through this method were written whole (`push`), so the
        // pointer is to an initialised `T`, exclusively ours until `pop_raw` returns.
        self.pop_raw(|p| read(unsafe { &*p }))
    }

    /// Removes the oldest entry. `None` when empty.
    #[inline]
    pub(crate) fn pop(&self) -> Option<T> {
        self.pop_with(|v| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_and_full() {
        let r = Ring::<u64>::new(3);
        assert_eq!(r.capacity(), 4);
        for i in 0..4 {
            assert!(r.push(i));
        }
        assert!(!r.push(99), "a full ring refuses");
        assert_eq!(r.len(), 4);
        for i in 0..4 {
            assert_eq!(r.pop(), Some(i));
        }
        assert_eq!(r.pop(), None);
        for lap in 0..10u64 {
            assert!(r.push(lap));
            assert_eq!(r.pop(), Some(lap));
        }
    }

    #[test]
    fn a_push_waits_for_a_consumer_still_reading_the_slot_instead_of_failing() {
        use std::sync::atomic::AtomicBool;
        let r = Arc::new(Ring::<u64>::new(2));
        assert!(r.push(1) && r.push(2));
        let attempting = Arc::new(AtomicBool::new(false));
        let mut pusher = None;
        let first = r.pop_raw(|p| {
            // This consumer holds slot 0. Another one takes entry 2 and is done with slot 1:
            // one entry is in flight, none is stored, so a push must not report "full".
            assert_eq!(r.pop(), Some(2));
            let (r2, a2) = (r.clone(), attempting.clone());
            pusher = Some(std::thread::spawn(move || {
                a2.store(true, Ordering::Release);
                r2.push(3)
            }));
            while !attempting.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            // Give the pusher the chance to reach the held slot (no timing is asserted).
            std::thread::sleep(std::time::Duration::from_millis(20));
            // SAFETY: the slot was written by `push(1)`.
            unsafe { *p }
        });
        assert_eq!(first, Some(1));
        assert!(pusher.unwrap().join().unwrap(), "the push succeeds once the slot is released");
        assert_eq!(r.pop(), Some(3));
        assert_eq!(r.pop(), None);
        // A really full ring still refuses at once.
        assert!(r.push(4) && r.push(5));
        assert!(!r.push(6));
    }

    #[test]
    fn a_pop_waits_for_a_producer_still_writing_the_oldest_entry_instead_of_failing() {
        use std::sync::atomic::AtomicBool;
        let r = Arc::new(Ring::<u64>::new(4));
        let popping = Arc::new(AtomicBool::new(false));
        let mut other = None;
        let pushed = r.push_with(|slot| {
            // This producer holds position 0. Another thread pushes 2 (position 1, complete),
            // then pops: the ring is not empty, and its oldest entry is the one being written.
            let (r2, p2) = (r.clone(), popping.clone());
            other = Some(std::thread::spawn(move || {
                assert!(r2.push(2));
                p2.store(true, Ordering::Release);
                r2.pop()
            }));
            while !popping.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            // Give the other thread the chance to reach the slot (no timing is asserted).
            std::thread::sleep(std::time::Duration::from_millis(20));
            slot.write(1);
        });
        assert!(pushed);
        assert_eq!(other.unwrap().join().unwrap(), Some(1), "the oldest entry, once written");
        assert_eq!(r.pop(), Some(2));
        assert_eq!(r.pop(), None, "a really empty ring answers at once");
    }

    #[test]
    fn two_producers_one_consumer_lose_nothing() {
        let r = Arc::new(Ring::<u64>::new(64));
        let producers: Vec<_> = (0..2u64)
            .map(|p| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        while !r.push(p << 32 | i) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; 2];
        let mut got = 0;
        while got < 20_000 {
            match r.pop() {
                Some(v) => {
                    let p = (v >> 32) as usize;
                    assert_eq!(v & 0xffff_ffff, next[p], "per-producer order kept");
                    next[p] += 1;
                    got += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(next, [10_000, 10_000]);
    }
}
