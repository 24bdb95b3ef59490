//! Reuse of the buffers ring bodies are copied out into.
//!
//! A body above the eager threshold is copied out of the ring into a buffer of its own, which
//! the caller (or the handler) keeps as a `bytes::Bytes` while it reads decoded `bytes` fields.
//! A fresh allocation of that size per message costs more than the copy itself (the allocator
//! maps fresh pages and the kernel zeroes them on first touch), so the buffer comes back here
//! when the last `Bytes` of it is dropped, on whatever thread that is, through a bounded
//! lock-free queue, and the next message of the session reuses it. At most [`SPARE_BODIES`]
//! buffers per size class, of at most `budget` bytes together, wait: the memory a session keeps
//! idle is bounded (by its own ring's length plus two largest messages, as the runtime sizes it).
//!
//! Spare buffers are kept by size class ([`SIZE_CLASSES`]) and handed out only within the class
//! of the size asked for: the small buffers of bodies waiting to be sent (a [`GatherBody`]'s own
//! bytes, at most 64 KiB) and stream batches never take a 64 MiB buffer a large message just
//! gave back, which the next large message would then have to fault in afresh (with one class,
//! a 64 MiB rpc_bw call both ways faulted in about 112 MiB of fresh pages per call).
//!
//! [`GatherBody`]: crate::buffers::GatherBody

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

/// Most spare body buffers a session keeps per size class.
pub const SPARE_BODIES: usize = 16;

/// Upper bounds in bytes of the size classes of spare buffers (the last class takes the rest):
/// up to 64 KiB (the own bytes of bodies waiting to be sent, stream batches, small ring
/// bodies), up to 1 MiB, up to 16 MiB, larger.
pub const SIZE_CLASSES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];

/// The size class of a buffer of `len` bytes (an index into the recycler's queues).
fn class_of(len: usize) -> usize {
    SIZE_CLASSES.iter().position(|&max| len <= max).unwrap_or(SIZE_CLASSES.len())
}

/// The spare body buffers of one session.
#[derive(Debug)]
pub struct BodyRecycler {
    /// Spare buffers by the class of their capacity.
    spare: [ArrayQueue<Vec<u8>>; SIZE_CLASSES.len() + 1],
    /// Most bytes (capacities) the spare buffers may hold together.
    budget: usize,
    /// Bytes the spare buffers hold now.
    held: AtomicUsize,
}

impl BodyRecycler {
    /// A recycler keeping up to `count` (at most [`SPARE_BODIES`]) buffers per size class, of
    /// at most `budget` bytes together.
    pub fn new(count: usize, budget: usize) -> Arc<BodyRecycler> {
        let count = count.clamp(1, SPARE_BODIES);
        Arc::new(BodyRecycler {
            spare: std::array::from_fn(|_| ArrayQueue::new(count)),
            budget,
            held: AtomicUsize::new(0),
        })
    }

    /// An empty buffer with room for `len` bytes: a spare one of `len`'s size class (grown when
    /// too small), else a new allocation. `None` when that allocation fails (`len` is announced
    /// by the peer, up to `max_message_size`): the caller closes the session instead of
    /// aborting the process.
    pub fn take(&self, len: usize) -> Option<Vec<u8>> {
        self.take_for(len, len)
    }

    /// As [`BodyRecycler::take`], for a buffer that will grow to about `expected` bytes
    /// (at least `len`): a spare one comes from `expected`'s size class, but only `len` bytes
    /// are allocated when there is none (a message arriving in pieces reserves what its first
    /// piece justifies: an announced length alone allocates nothing of its size).
    pub fn take_for(&self, len: usize, expected: usize) -> Option<Vec<u8>> {
        // A spare one too small grows (its pages, touched already, are kept) instead of being
        // dropped for a fresh allocation.
        let mut v = match self.spare[class_of(expected.max(len))].pop() {
            Some(v) => {
                self.held.fetch_sub(v.capacity(), Ordering::Relaxed);
                if v.capacity() >= len {
                    return Some(v);
                }
                v
            }
            None => Vec::new(),
        };
        v.try_reserve_exact(len).ok()?;
        Some(v)
    }

    /// Encodes `msg` (`len` = its `encoded_len()`) into a buffer of [`BodyRecycler::take`], for a
    /// body that waits on the heap to be sent. `None` when no memory could be had for it.
    pub fn encode<M: prost::Message>(&self, msg: &M, len: usize) -> Option<Vec<u8>> {
        let mut v = self.take(len)?;
        msg.encode_raw(&mut v);
        Some(v)
    }

    /// Keeps `v` for a later message when there is room in its size class and within the byte
    /// budget.
    pub fn give_back(&self, mut v: Vec<u8>) {
        let cap = v.capacity();
        if cap == 0 {
            return;
        }
        // Reserve its bytes in the budget first; undo when over it or when the queue is full.
        let before = self.held.fetch_add(cap, Ordering::Relaxed);
        if before + cap > self.budget {
            self.held.fetch_sub(cap, Ordering::Relaxed);
            return;
        }
        v.clear();
        if self.spare[class_of(cap)].push(v).is_err() {
            self.held.fetch_sub(cap, Ordering::Relaxed);
        }
    }

    /// Spare buffers held now, over all classes.
    pub fn spare_count(&self) -> usize {
        self.spare.iter().map(ArrayQueue::len).sum()
    }
}

/// A complete body as the owner of a `bytes::Bytes`: its buffer returns to the recycler when the
/// last `Bytes` sharing it is dropped.
pub struct RecycledBody {
    body: Vec<u8>,
    home: Arc<BodyRecycler>,
}

impl RecycledBody {
    /// Wraps `body` so that it returns to `home`.
    pub fn new(body: Vec<u8>, home: Arc<BodyRecycler>) -> RecycledBody {
        RecycledBody { body, home }
    }

    /// The body as `Bytes` (decoded `bytes` fields become slices of it).
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for RecycledBody {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl Drop for RecycledBody {
    fn drop(&mut self) {
        self.home.give_back(std::mem::take(&mut self.body));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_bytes_is_dropped() {
        let r = BodyRecycler::new(4, 1 << 20);
        let mut v = r.take(1000).unwrap();
        v.extend_from_slice(&[7u8; 1000]);
        let ptr = v.as_ptr();
        let b = RecycledBody::new(v, r.clone()).into_bytes();
        let field = b.slice(10..20);
        drop(b);
        assert_eq!(&field[..], &[7u8; 10]);
        assert_eq!(r.spare_count(), 0, "a slice still shares the buffer");
        drop(field);
        let again = r.take(500).unwrap();
        assert_eq!(again.as_ptr(), ptr, "the buffer is reused");
        assert!(again.is_empty());
    }

    #[test]
    fn bounded_in_count_and_bytes() {
        let r = BodyRecycler::new(3, 4096);
        r.give_back(Vec::with_capacity(8192));
        assert_eq!(r.spare_count(), 0, "over the budget");
        for _ in 0..5 {
            r.give_back(Vec::with_capacity(100));
        }
        assert_eq!(r.spare_count(), 3);
        assert!(r.take(200).unwrap().capacity() >= 200, "a spare too small is not handed out");
        assert_eq!(r.held.load(Ordering::Relaxed), 200);
        r.give_back(Vec::with_capacity(3896));
        assert_eq!(r.spare_count(), 3, "exactly the budget");
        r.give_back(Vec::with_capacity(1));
        assert_eq!(r.spare_count(), 3, "over the budget by one byte");
        let empty = BodyRecycler::new(1, 0);
        assert!(empty.take(usize::MAX / 2).is_none(), "a failed allocation is reported");
    }

    /// A small buffer asked for never takes a large spare one (which the next large message
    /// would then fault in afresh), and a message expected to be large gets the large spare one
    /// although it asks for its first piece's bytes only.
    #[test]
    fn small_takes_leave_large_buffers_to_large_messages() {
        let r = BodyRecycler::new(4, 80 << 20);
        let big = Vec::<u8>::with_capacity(64 << 20);
        let big_ptr = big.as_ptr();
        r.give_back(big);
        let small = r.take(64 << 10).unwrap();
        assert_ne!(small.as_ptr(), big_ptr, "a 64 KiB take took the 64 MiB buffer");
        assert!(small.capacity() < 1 << 20);
        let zero = r.take(0).unwrap();
        assert_ne!(zero.as_ptr(), big_ptr, "an empty take took the 64 MiB buffer");
        let mid = r.take_for(512 << 10, 2 << 20).unwrap();
        assert_ne!(mid.as_ptr(), big_ptr, "a 2 MiB message took the 64 MiB buffer");
        let large = r.take_for(512 << 10, (64 << 20) + 10).unwrap();
        assert_eq!(large.as_ptr(), big_ptr, "the large message reuses the large buffer");
        assert_eq!(r.held.load(Ordering::Relaxed), 0);
        // Without a spare one, only the bytes asked for are allocated.
        let fresh = r.take_for(512 << 10, 64 << 20).unwrap();
        assert!(fresh.capacity() < 1 << 20, "{}", fresh.capacity());
    }
}
