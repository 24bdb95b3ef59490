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
    /// when the ring is full.
    #[inline]
    pub(crate) fn push_with(&self, fill: impl FnOnce(&mut MaybeUninit<T>)) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
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
                return false;
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

    /// Removes the oldest entry, giving `read` a reference to it in place. `None` when empty.
    #[inline]
    pub(crate) fn pop_with<R>(&self, read: impl FnOnce(&T) -> R) -> Option<R> {
        let mut pos = self.head.load(Ordering::Relaxed);
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
                        // SAFETY: the CAS made this thread the only consumer of position `pos`,
                        // and `seq == pos + 1` (acquired) says its producer finished writing it.
                        let r = read(unsafe { (*slot.val.get()).assume_init_ref() });
                        slot.seq.store(pos.wrapping_add(self.mask + 1), Ordering::Release);
                        return Some(r);
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
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
