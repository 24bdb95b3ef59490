//! Producer and consumer state of a bulk ring (sans-IO: offsets and counters only).
//!
//! Each receiver owns a ring registered for REMOTE_WRITE; its peer is the only producer. The
//! producer places a body contiguously at its tail and, when the body does not fit before the
//! end, skips the rest and starts again at offset 0. The consumer frees in order; the number of
//! bytes freed so far (a wrapping `u32` counter that includes skipped bytes) travels back in every
//! header's `freed_head` and is the producer's head. Bytes in use = `tail - head`.
//!
//! The producer does not take the peer's word alone: its body is encoded into our send mirror at
//! the ring offset and posted as an RDMA WRITE from there, so bytes the peer reports freed are
//! ours to write again only once that WRITE no longer reads them. The producer also counts the
//! bytes whose WRITEs our own polled completions retired (`retired`, [`RingProducer::on_written`])
//! and reserves only what is behind both counters: a peer that reports space freed early (a lying
//! `freed_head`) cannot make us encode into a mirror range a posted WRITE of ours still reads.

use std::collections::VecDeque;

/// Why a body cannot be placed in the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingReserveError {
    /// The body is longer than the whole ring: it can never be sent (RESOURCE_EXHAUSTED).
    TooLarge {
        /// Body length in bytes.
        len: u32,
        /// Ring length in bytes.
        ring_len: u32,
    },
    /// Not enough contiguous free space now; retry after the consumer frees (a ring-full stall).
    Full,
}

/// How far into the ring bodies of at most [`ROTATE_BODY_MAX`] bytes keep going on at the tail when
/// the ring is empty (bytes): past it, and for larger bodies at once, an empty ring starts over at
/// offset 0. The producer is free to choose (the consumer accepts a body at its tail or at 0), and
/// the choice decides, on the software NIC, which CPU cache lines the WRITE stores into.
///
/// Measured with `rpc-perf --loopback --transport sim --test rpc_lat,write_lat -s N -n 2000` on
/// this project's 2-core AMD EPYC VM (1 MiB L2 per core; load 1.1-1.3), 3 alternating rounds each,
/// p50 round trip, starting over at 0 against going on through 1 MiB:
/// - 32 KiB: 13.0-14.1 us against 7.4-7.7 us; 64 KiB: 21.7-24.6 against 12.5-12.8. At 0 every
///   WRITE stores into the lines the receiving core read one round trip earlier and still holds,
///   so each store waits for that core to give its line up; 1 MiB later they have left its L2.
/// - 128 KiB: 36-47 us against 60-70; 256 KiB: 52-67 against 171-213. Bodies this large evict
///   their own lines within one round trip, and going on through the ring only adds misses.
/// - [`RingProducer`] started over at 0 for every size before (commit 540f77a: 8 MiB bodies in a
///   64 MiB ring otherwise cycled through both 64 MiB rings), and still does past
///   [`ROTATE_BODY_MAX`] (96 KiB, so that the 65,540-byte body of a 64 KiB payload goes on).
pub const ROTATE_BYTES: u32 = 1 << 20;

/// Largest body (bytes) that goes on at the tail of an empty ring (see [`ROTATE_BYTES`]).
pub const ROTATE_BODY_MAX: u32 = 96 << 10;

/// The sender's view of the peer's ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingProducer {
    len: u32,
    /// Wrapping count of bytes placed (bodies plus skipped ends).
    tail: u32,
    /// Wrapping count of bytes the consumer has freed (last `freed_head` received).
    head: u32,
    /// Wrapping count of bytes whose WRITEs our polled completions retired (the latest mark
    /// passed to [`RingProducer::on_written`]): no posted WRITE of ours reads them any more.
    retired: u32,
    /// Physical offset of the next placement.
    pos: u32,
    /// Most bodies and pieces placed and not yet freed ([`RingProducer::with_max_units`]);
    /// `u32::MAX`: not counted.
    max_units: u32,
    /// When counted: the end (the tail right after it) of each body or piece placed and not yet
    /// freed, oldest first. Its capacity is `max_units`, allocated at construction.
    ends: VecDeque<u32>,
}

impl RingProducer {
    /// State for an empty ring of `len` bytes (1 ..= 1 GiB), bodies and pieces not counted.
    pub fn new(len: u32) -> RingProducer {
        RingProducer { len, tail: 0, head: 0, retired: 0, pos: 0, max_units: u32::MAX, ends: VecDeque::new() }
    }

    /// State for an empty ring of `len` bytes that holds at most `max_units` (at least 1)
    /// bodies and pieces the consumer has not freed: a reservation beyond them answers
    /// [`RingReserveError::Full`] (or `None` for a piece) until the consumer frees one, and
    /// [`RingProducer::on_freed`] counts the bodies and pieces a head frees. A server keeps its
    /// bodies in a client's ring to `session::ring_units` this way, so that the RingReturns a
    /// client may send (each must free one) stay within the receive WQEs reserved for them.
    /// Allocates the list of `max_units` ends here, nothing later.
    pub fn with_max_units(len: u32, max_units: u32) -> RingProducer {
        let max_units = max_units.clamp(1, u32::MAX - 1);
        RingProducer {
            max_units,
            ends: VecDeque::with_capacity(max_units as usize),
            ..RingProducer::new(len)
        }
    }

    /// Bodies and pieces placed and not yet freed (0 when not counted).
    pub fn units(&self) -> u32 {
        self.ends.len() as u32
    }

    /// Whether the count of unfreed bodies and pieces is at its maximum.
    #[inline]
    fn units_full(&self) -> bool {
        self.ends.len() as u32 >= self.max_units
    }

    /// Whether the last placement may be cut into one more piece ([`RingProducer::split_last`]):
    /// always when bodies are not counted, else while fewer than the most are unfreed.
    #[inline]
    pub fn may_split(&self) -> bool {
        !self.units_full()
    }

    /// The last placement goes out as pieces (each a WRITE and a SEND, each freed by the
    /// consumer on its own): `end` (a wrapping count, inside it) ends one of them. Piece ends
    /// must come in order. Returns false, changing nothing, when the count of unfreed bodies and
    /// pieces is at its maximum or `end` is not inside the last placement after the pieces
    /// recorded so far (the caller then sends the rest as one piece). Allocates nothing.
    pub fn split_last(&mut self, end: u32) -> bool {
        if self.max_units == u32::MAX {
            return true;
        }
        if self.units_full() {
            return false;
        }
        let n = self.ends.len();
        let Some(&last) = self.ends.back() else { return false };
        let start = if n >= 2 { self.ends[n - 2] } else { self.head };
        let (at, span) = (end.wrapping_sub(start), last.wrapping_sub(start));
        if at == 0 || at >= span {
            return false;
        }
        self.ends.insert(n - 1, end);
        true
    }

    /// Records the end of a placement just made (when counted).
    #[inline]
    fn placed(&mut self) {
        if self.max_units != u32::MAX {
            self.ends.push_back(self.tail);
        }
    }

    /// Ring length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false: a ring has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the peer has not freed yet (placed and not reported freed, skipped ends included).
    pub fn used(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }

    /// Bytes placed whose WRITEs are not known complete (no polled completion retired them yet).
    pub fn unretired(&self) -> u32 {
        self.tail.wrapping_sub(self.retired)
    }

    /// Bytes not free for a new placement: behind the tail back to whichever of the peer's head
    /// and our retired count is further behind.
    #[inline]
    fn busy(&self) -> u32 {
        self.used().max(self.unretired())
    }

    /// The producer's tail (wrapping count of bytes placed): the mark of the WRITE of the body
    /// placed last, to hand to [`RingProducer::on_written`] once a polled completion shows that
    /// WRITE done.
    #[inline]
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Reserves `n` contiguous bytes and returns their offset. Allocates nothing.
    ///
    /// # Errors
    /// [`RingReserveError::TooLarge`] when `n` exceeds the ring, [`RingReserveError::Full`] when
    /// the space is not free yet, or the most bodies and pieces are unfreed
    /// ([`RingProducer::with_max_units`]).
    pub fn reserve(&mut self, n: u32) -> Result<u32, RingReserveError> {
        if n > self.len {
            return Err(RingReserveError::TooLarge { len: n, ring_len: self.len });
        }
        if self.units_full() {
            return Err(RingReserveError::Full);
        }
        let used = self.busy();
        // Bodies go on at the tail while they fit before the end of the ring; an empty ring starts
        // over at 0 (skipping the rest) for a body over `ROTATE_BODY_MAX` or one that would end
        // past `ROTATE_BYTES` (see there: which cache lines the software NIC's WRITE stores into).
        let end = self.pos as u64 + n as u64;
        let rotate_end = (self.len as u64).min(ROTATE_BYTES as u64);
        let (offset, need) = if self.pos == 0
            || (end <= self.len as u64 && (used != 0 || (end <= rotate_end && n <= ROTATE_BODY_MAX)))
        {
            (self.pos, n)
        } else {
            (0, self.len - self.pos + n)
        };
        // An empty ring takes any body that fits physically, even when the skipped end plus the
        // body exceeds the length: nothing is unread.
        if used != 0 && used as u64 + need as u64 > self.len as u64 {
            return Err(RingReserveError::Full);
        }
        self.tail = self.tail.wrapping_add(need);
        self.pos = if offset + n == self.len { 0 } else { offset + n };
        self.placed();
        Ok(offset)
    }

    /// The producer's state now, to [`RingProducer::rewind`] to.
    #[inline]
    pub fn mark(&self) -> RingMark {
        RingMark { tail: self.tail, pos: self.pos }
    }

    /// Takes back the reservation that took the producer from `before` to `after` (marks taken
    /// around it), for a body that was never sent. Returns false, changing nothing, when anything
    /// was reserved since (the state is not `after`).
    pub fn rewind(&mut self, before: RingMark, after: RingMark) -> bool {
        // The reserved bytes were never sent, so the consumer cannot have freed into them, nor
        // a completion retired them.
        let reserved = after.tail.wrapping_sub(before.tail);
        if self.mark() != after || reserved > self.used() || reserved > self.unretired() {
            return false;
        }
        if reserved != 0 && self.max_units != u32::MAX {
            // The reservation was the last placement: its end is the last one listed.
            if self.ends.back() != Some(&after.tail) {
                return false;
            }
            self.ends.pop_back();
        }
        self.tail = before.tail;
        self.pos = before.pos;
        true
    }

    /// Reserves a piece of a body that travels in pieces: up to `max` contiguous bytes at the
    /// tail (skipping the end of the ring when too little is left there), but never fewer than
    /// `min(max, min_piece)` (a piece too small to be worth its SEND waits for the consumer to free
    /// more). Returns `(offset, length)`, or `None` while not enough is free. Allocates nothing.
    pub fn reserve_piece(&mut self, max: u32, min_piece: u32) -> Option<(u32, u32)> {
        let max = max.min(self.len);
        if max == 0 || self.units_full() {
            return None;
        }
        let floor = min_piece.clamp(1, max);
        let used = self.busy();
        // May exceed the length after an empty ring took a body over its skipped end.
        let free = self.len.saturating_sub(used);
        let till_end = self.len - self.pos;
        let (offset, n, skip) = if used == 0 && self.pos != 0 {
            // Nothing unread: start over at 0 with the whole ring (the skipped end is freed with
            // this piece, as `reserve` does for an empty ring).
            (0, max, till_end)
        } else if till_end >= floor {
            (self.pos, max.min(till_end).min(free), 0)
        } else {
            // Too little before the end: skip it; the piece starts at 0 in what is free after it.
            (0, max.min(free.saturating_sub(till_end)), till_end)
        };
        if n < floor {
            return None;
        }
        self.tail = self.tail.wrapping_add(skip).wrapping_add(n);
        self.pos = if offset + n == self.len { 0 } else { offset + n };
        self.placed();
        Some((offset, n))
    }

    /// Takes the consumer's `freed_head` from a received header and returns how many whole
    /// bodies and pieces it freed (0 when they are not counted: see
    /// [`RingProducer::with_max_units`]). A consumer that keeps the protocol frees whole bodies
    /// in order, so its head is always the end of one.
    ///
    /// # Errors
    /// `Err(())` when the value is not between the current head and the tail (a malformed or
    /// replayed header); the state is unchanged.
    #[allow(clippy::result_unit_err)]
    #[inline(always)]
    pub fn on_freed(&mut self, freed_head: u32) -> Result<u32, ()> {
        // Most headers report no new space (every eager call): one compare, inlined.
        if freed_head == self.head {
            return Ok(0);
        }
        self.on_freed_more(freed_head)
    }

    /// [`RingProducer::on_freed`] for a head that moved.
    #[allow(clippy::result_unit_err)]
    #[inline(never)]
    fn on_freed_more(&mut self, freed_head: u32) -> Result<u32, ()> {
        let advance = freed_head.wrapping_sub(self.head);
        if advance > self.used() {
            return Err(());
        }
        let mut units = 0;
        while let Some(&end) = self.ends.front() {
            if end.wrapping_sub(self.head) > advance {
                break;
            }
            self.ends.pop_front();
            units += 1;
        }
        self.head = freed_head;
        Ok(units)
    }

    /// Takes the mark ([`RingProducer::tail`] right after the placement) of the last WRITE a
    /// polled completion of ours retired: every byte placed up to it is no longer read by a WRITE
    /// of ours (WRITEs complete in posting order), so it may be placed again once the peer frees
    /// it too. Marks must come in posting order.
    ///
    /// # Errors
    /// `Err(())` when the mark is not between the retired count and the tail (not a mark of ours,
    /// or out of order); the state is unchanged.
    #[allow(clippy::result_unit_err)]
    #[inline]
    pub fn on_written(&mut self, mark: u32) -> Result<(), ()> {
        if mark.wrapping_sub(self.retired) > self.unretired() {
            return Err(());
        }
        self.retired = mark;
        Ok(())
    }
}

/// A [`RingProducer`]'s state before a reservation ([`RingProducer::mark`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingMark {
    tail: u32,
    pos: u32,
}

/// A body the consumer has accepted, to be released (in any order) when it is no longer read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingToken {
    seq: u32,
}

/// The receiver's view of its own ring.
#[derive(Debug)]
pub struct RingConsumer {
    len: u32,
    /// Physical offset where the next body is expected (unless the producer skipped to 0).
    expect: u32,
    /// Wrapping count of bytes accepted (freed once released).
    accepted: u32,
    /// Wrapping count of bytes freed in order.
    freed: u32,
    /// Last `freed` sent to the producer.
    reported: u32,
    /// Bodies freed since `reported` was taken.
    unreported_units: u32,
    /// Accepted, not yet freed bodies, oldest first: (end counter, released).
    pending: VecDeque<(u32, bool)>,
    /// Sequence number of `pending[0]`.
    first_seq: u32,
}

impl RingConsumer {
    /// State for an empty ring of `len` bytes, with room for `max_pending` unfreed bodies
    /// allocated here. Bodies released out of order stay listed until the ones before them are
    /// released, so the list may grow past `max_pending` (bounded by the ring: every body takes at
    /// least one byte of it); that growth is the only allocation, and only then.
    pub fn new(len: u32, max_pending: usize) -> RingConsumer {
        RingConsumer {
            len,
            expect: 0,
            accepted: 0,
            freed: 0,
            reported: 0,
            unreported_units: 0,
            pending: VecDeque::with_capacity(max_pending),
            first_seq: 0,
        }
    }

    /// Checks a body announced by a header at `offset`, `n` bytes, and accepts it.
    ///
    /// # Errors
    /// A reason when it is not where the producer must have put it (out of bounds, overlapping
    /// unread data, or out of order): the peer is misbehaving and the connection must close.
    pub fn accept(&mut self, offset: u32, n: u32) -> Result<RingToken, &'static str> {
        if offset as u64 + n as u64 > self.len as u64 {
            return Err("ring body outside the ring");
        }
        let skipped = if offset == self.expect {
            0
        } else if offset == 0 {
            self.len - self.expect
        } else {
            return Err("ring body not at the producer's tail");
        };
        let end = self.accepted.wrapping_add(skipped).wrapping_add(n);
        let in_use = end.wrapping_sub(self.freed) as u64;
        let was_empty = self.accepted == self.freed;
        if in_use > self.len as u64 && !was_empty {
            return Err("ring body overlaps unread data");
        }
        self.accepted = end;
        self.expect = if offset + n == self.len { 0 } else { offset + n };
        let seq = self.first_seq.wrapping_add(self.pending.len() as u32);
        self.pending.push_back((end, false));
        Ok(RingToken { seq })
    }

    /// Releases a body; frees, in order, every leading released body.
    pub fn release(&mut self, token: RingToken) {
        let idx = token.seq.wrapping_sub(self.first_seq) as usize;
        if let Some(e) = self.pending.get_mut(idx) {
            e.1 = true;
        }
        while let Some(&(end, true)) = self.pending.front() {
            self.freed = end;
            self.pending.pop_front();
            self.first_seq = self.first_seq.wrapping_add(1);
            self.unreported_units += 1;
        }
    }

    /// The freed counter to put in the next header (marks it reported).
    pub fn take_freed(&mut self) -> u32 {
        self.reported = self.freed;
        self.unreported_units = 0;
        self.freed
    }

    /// Bytes freed since the last header carried the counter.
    pub fn unreported(&self) -> u32 {
        self.freed.wrapping_sub(self.reported)
    }

    /// Wrapping count of bytes accepted so far (skipped ends included): it moves with every
    /// body or piece accepted (the lease's idle check, `session::lease`).
    pub fn accepted(&self) -> u32 {
        self.accepted
    }

    /// Whether a body or piece accepted is not freed yet.
    pub fn holds(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Bodies (and pieces) freed since the last header carried the counter.
    pub fn unreported_units(&self) -> u32 {
        self.unreported_units
    }

    /// Ring length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false: a ring has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer frees up to `head`, every WRITE placed so far having completed (a polled
    /// completion retired it).
    fn freed(p: &mut RingProducer, head: u32) {
        p.on_written(p.tail()).unwrap();
        p.on_freed(head).unwrap();
    }

    /// A reservation taken back leaves the producer as it was (also one that skipped the end of
    /// the ring); one with another after it is not taken back. Sabotaged: `rewind` without the
    /// `after` check: the second case rewound both reservations.
    /// A body sent as pipelined pieces counts a unit per piece, each freed on its own; the cut
    /// stops at the most units. Sabotaged (`split_last` not recording the end): freeing the
    /// first piece freed no unit.
    #[test]
    fn pieces_of_a_split_body_count_and_free_one_unit_each() {
        let mut p = RingProducer::with_max_units(1000, 3);
        assert_eq!(p.reserve(300), Ok(0));
        assert!(p.may_split());
        assert!(p.split_last(100));
        assert!(!p.split_last(100), "not after the last piece recorded");
        assert!(!p.split_last(300), "not at the end of the body");
        assert!(p.split_last(200));
        assert_eq!(p.units(), 3);
        assert!(!p.may_split() && !p.split_last(250), "at the most units");
        assert_eq!(p.reserve(10), Err(RingReserveError::Full));
        assert_eq!(p.on_freed(100), Ok(1));
        assert_eq!(p.on_freed(150), Ok(0), "inside a piece");
        assert_eq!(p.on_freed(300), Ok(2));
        assert_eq!(p.units(), 0);
        // Not counted: any cut is fine, nothing is recorded.
        let mut q = RingProducer::new(1000);
        assert_eq!(q.reserve(300), Ok(0));
        assert!(q.split_last(100) && q.split_last(100));
        assert_eq!((q.units(), q.on_freed(300)), (0, Ok(0)));
    }

    #[test]
    fn rewind_takes_back_only_the_last_reservation() {
        let mut p = RingProducer::new(1000);
        assert_eq!(p.reserve(700), Ok(0));
        freed(&mut p, 700);
        let before = p.clone();
        let (m0, off) = (p.mark(), p.reserve(600));
        // Empty ring, 300 bytes left at the end: the body starts over at 0, skipping them.
        assert_eq!(off, Ok(0));
        assert!(p.rewind(m0, p.mark()));
        assert_eq!(p, before);
        let m0 = p.mark();
        p.reserve(100).unwrap();
        let m1 = p.mark();
        p.reserve(100).unwrap();
        let after = p.clone();
        assert!(!p.rewind(m0, m1), "another reservation came after it");
        assert_eq!(p, after);
    }
    use proptest::prelude::*;

    #[test]
    fn wraps_by_skipping_to_start() {
        let mut p = RingProducer::new(100);
        let mut c = RingConsumer::new(100, 8);
        assert_eq!(p.reserve(60), Ok(0));
        let t1 = c.accept(0, 60).unwrap();
        assert_eq!(p.reserve(50), Err(RingReserveError::Full));
        c.release(t1);
        freed(&mut p, c.take_freed());
        // 40 left before the end, 50 does not fit: skip 40, place at 0.
        assert_eq!(p.reserve(50), Ok(0));
        assert_eq!(p.used(), 90);
        let t2 = c.accept(0, 50).unwrap();
        c.release(t2);
        assert_eq!(c.take_freed(), 150);
        freed(&mut p, 150);
        assert_eq!(p.used(), 0);
    }

    #[test]
    fn small_bodies_go_on_through_the_first_mebibyte_and_large_ones_start_over_at_0() {
        let len = 4 * ROTATE_BYTES;
        let mut p = RingProducer::new(len);
        let mut c = RingConsumer::new(len, 4);
        // One body in flight at a time, as from a unary caller: the ring is empty at each reserve.
        fn one(p: &mut RingProducer, c: &mut RingConsumer, n: u32) -> u32 {
            let off = p.reserve(n).unwrap();
            let t = c.accept(off, n).unwrap();
            c.release(t);
            freed(p, c.take_freed());
            off
        }
        let small = ROTATE_BODY_MAX;
        let offsets: Vec<u32> = (0..ROTATE_BYTES / small + 1).map(|_| one(&mut p, &mut c, small)).collect();
        let expected: Vec<u32> = (0..ROTATE_BYTES / small).map(|i| i * small).chain([0]).collect();
        assert_eq!(offsets, expected, "on at the tail up to ROTATE_BYTES, then over at 0");
        assert_eq!(one(&mut p, &mut c, 100), small, "a small body after a wrap goes on at the tail");
        assert_eq!(one(&mut p, &mut c, small + 1), 0, "a body over ROTATE_BODY_MAX starts over at 0");
        assert_eq!(one(&mut p, &mut c, small + 1), 0);
        // A ring smaller than ROTATE_BYTES: on at the tail to its end, then over at 0.
        let mut p = RingProducer::new(3 * 1000);
        let mut c = RingConsumer::new(3 * 1000, 4);
        let offsets: Vec<u32> = (0..4).map(|_| one(&mut p, &mut c, 1000)).collect();
        assert_eq!(offsets, [0, 1000, 2000, 0]);
    }

    #[test]
    fn whole_ring_fits_when_empty_and_one_more_byte_never() {
        let mut p = RingProducer::new(64);
        let mut c = RingConsumer::new(64, 4);
        assert_eq!(p.reserve(65), Err(RingReserveError::TooLarge { len: 65, ring_len: 64 }));
        assert_eq!(p.reserve(10), Ok(0));
        let t = c.accept(0, 10).unwrap();
        assert_eq!(p.reserve(64), Err(RingReserveError::Full));
        c.release(t);
        freed(&mut p, c.take_freed());
        assert_eq!(p.reserve(64), Ok(0));
        let t = c.accept(0, 64).unwrap();
        c.release(t);
        freed(&mut p, c.take_freed());
        assert_eq!(p.used(), 0);
        assert_eq!(p.reserve(64), Ok(0));
    }

    #[test]
    fn consumer_refuses_bodies_off_the_tail() {
        let mut c = RingConsumer::new(100, 4);
        assert!(c.accept(90, 20).is_err());
        c.accept(0, 30).unwrap();
        assert!(c.accept(40, 10).is_err());
        assert!(c.accept(0, 80).is_err(), "overlaps the unread 30 bytes");
        let mut p = RingProducer::new(100);
        assert!(p.on_freed(1).is_err());
    }

    #[test]
    fn many_bodies_released_behind_a_held_one() {
        let mut c = RingConsumer::new(1000, 2);
        let first = c.accept(0, 10).unwrap();
        let mut off = 10;
        for _ in 0..50 {
            let t = c.accept(off, 10).unwrap();
            c.release(t);
            off += 10;
        }
        assert_eq!(c.unreported(), 0, "nothing frees before the first body");
        c.release(first);
        assert_eq!(c.unreported(), 510);
    }

    #[test]
    fn out_of_order_release_frees_in_order() {
        let mut c = RingConsumer::new(100, 4);
        let a = c.accept(0, 10).unwrap();
        let b = c.accept(10, 10).unwrap();
        c.release(b);
        assert_eq!(c.unreported(), 0);
        c.release(a);
        assert_eq!(c.unreported(), 20);
    }

    #[test]
    fn pieces_fill_the_free_space_and_wait_below_the_floor() {
        let mut p = RingProducer::new(100);
        let mut c = RingConsumer::new(100, 8);
        assert_eq!(p.reserve_piece(40, 10), Some((0, 40)));
        let a = c.accept(0, 40).unwrap();
        assert_eq!(p.reserve_piece(40, 10), Some((40, 40)));
        let b = c.accept(40, 40).unwrap();
        // 20 left, all before the end: a piece of 20 (above the floor of 10).
        assert_eq!(p.reserve_piece(40, 10), Some((80, 20)));
        let d = c.accept(80, 20).unwrap();
        assert_eq!(p.reserve_piece(40, 10), None, "ring full");
        c.release(a);
        freed(&mut p, c.take_freed());
        assert_eq!(p.reserve_piece(40, 10), Some((0, 40)));
        c.accept(0, 40).unwrap();
        c.release(b);
        c.release(d);
        freed(&mut p, c.take_freed());
        // 5 free before the end is below the floor: skip them, take 40 from 40.
        assert_eq!(p.reserve_piece(40, 10), Some((40, 40)));
        assert_eq!(c.accept(40, 40), Ok(RingToken { seq: 4 }));
    }

    /// Our WRITEs in flight, in posting order, as the send queue sees them: each with its mark
    /// (the producer's tail after its placement) and its range, over a byte map of the mirror
    /// ranges a posted WRITE still reads.
    struct Writes {
        posted: VecDeque<(u32, u32, u32)>,
        read: Vec<bool>,
    }

    impl Writes {
        fn new(len: u32) -> Writes {
            Writes { posted: VecDeque::new(), read: vec![false; len as usize] }
        }

        /// A placement at `off`, `n` bytes, is encoded into the mirror and its WRITE posted:
        /// it must not touch a range a WRITE still reads.
        fn post(&mut self, p: &RingProducer, off: u32, n: u32) -> Result<(), TestCaseError> {
            for b in &mut self.read[off as usize..(off + n) as usize] {
                prop_assert!(!*b, "encoded into a mirror range a posted WRITE still reads");
                *b = true;
            }
            self.posted.push_back((p.tail(), off, n));
            Ok(())
        }

        /// A polled completion retires the `k` oldest WRITEs (at least one, if any).
        fn complete(&mut self, p: &mut RingProducer, k: usize) {
            let mut last = None;
            for _ in 0..k.min(self.posted.len()) {
                let (mark, off, n) = self.posted.pop_front().unwrap();
                self.read[off as usize..(off + n) as usize].fill(false);
                last = Some(mark);
            }
            if let Some(mark) = last {
                p.on_written(mark).unwrap();
            }
        }
    }

    /// A peer that reports space freed early (its `freed_head` ahead of what it read) does not
    /// make the producer hand out bytes a posted WRITE still reads: the space frees only with
    /// the completion. Sabotaged: `reserve` taking `used()` instead of `busy()`: `reserve(50)`
    /// went to offset 0, over the WRITE in flight.
    #[test]
    fn a_lying_freed_head_frees_nothing_still_written() {
        let mut p = RingProducer::new(100);
        assert_eq!(p.reserve(60), Ok(0));
        let written = p.tail();
        // The peer claims all 60 bytes freed before our WRITE of them completed.
        p.on_freed(60).unwrap();
        assert_eq!((p.used(), p.unretired()), (0, 60));
        assert_eq!(p.reserve(50), Err(RingReserveError::Full), "0..50 is still read by the WRITE");
        assert_eq!(p.reserve_piece(50, 50), None);
        assert_eq!(p.reserve(40), Ok(60), "the end of the ring is not read by any WRITE");
        p.on_written(written).unwrap();
        assert_eq!(p.reserve(50), Ok(0), "retired and freed: reused");
        // A freed head beyond what was placed stays refused.
        assert!(p.on_freed(p.tail().wrapping_add(1)).is_err());
    }

    /// Marks retire in posting order: one behind the retired count or past the tail is refused
    /// and changes nothing. Sabotaged: `on_written` without its range check: the stale mark was
    /// taken (moving the retired count back over bytes already retired).
    #[test]
    fn retirement_goes_in_posting_order() {
        let mut p = RingProducer::new(100);
        p.reserve(10).unwrap();
        let m1 = p.tail();
        p.reserve(20).unwrap();
        let m2 = p.tail();
        p.on_written(m2).unwrap();
        assert_eq!(p.on_written(m1), Err(()), "behind the retired count");
        assert_eq!(p.on_written(m2.wrapping_add(1)), Err(()), "past the tail");
        assert_eq!(p.unretired(), 0);
        p.on_freed(m2).unwrap();
        assert_eq!(p.reserve(100), Ok(0), "an empty ring takes the whole ring");
    }

    /// The counters wrap through `u32::MAX`: the same rules hold across the wrap. Sabotaged:
    /// `busy()` as `tail - min(head, retired)` (not wrapping-aware): after the wrap the
    /// counters compared the wrong way and the in-flight range was handed out again.
    #[test]
    fn counters_wrap() {
        let start = u32::MAX - 30;
        let mut p = RingProducer { tail: start, head: start, retired: start, ..RingProducer::new(100) };
        let mut w = Writes::new(100);
        assert_eq!(p.reserve(60), Ok(0));
        w.post(&p, 0, 60).unwrap();
        assert!(p.tail() < start, "the tail wrapped");
        p.on_freed(p.tail()).unwrap();
        assert_eq!(p.reserve(50), Err(RingReserveError::Full));
        assert_eq!(p.reserve(40), Ok(60));
        w.post(&p, 60, 40).unwrap();
        w.complete(&mut p, 1);
        assert_eq!(p.unretired(), 40);
        let off = p.reserve(50).unwrap();
        w.post(&p, off, 50).unwrap();
        w.complete(&mut p, 2);
        p.on_freed(p.tail()).unwrap();
        assert_eq!((p.used(), p.unretired()), (0, 0));
    }

    proptest! {
        /// Pieces and whole bodies mixed, WRITEs completing late and in posting order: the
        /// producer never places over unread bytes nor over bytes a WRITE still reads, the
        /// consumer accepts every placement, and an empty ring takes a piece.
        #[test]
        fn pieces_and_bodies_agree(
            len in 1u32..300,
            ops in proptest::collection::vec((1u32..320, 0u8..4, any::<u8>()), 1..200),
        ) {
            let mut p = RingProducer::new(len);
            let mut c = RingConsumer::new(len, 16);
            let mut w = Writes::new(len);
            let mut owner: Vec<Option<usize>> = vec![None; len as usize];
            let mut held: Vec<(RingToken, u32, u32, usize)> = Vec::new();
            for (i, (n, what, pick)) in ops.into_iter().enumerate() {
                if what == 3 {
                    w.complete(&mut p, usize::from(pick % 4) + 1);
                    continue;
                }
                if what == 0 && !held.is_empty() {
                    let (t, off, n, id) = held.swap_remove(pick as usize % held.len());
                    for b in &mut owner[off as usize..(off + n) as usize] {
                        prop_assert_eq!(*b, Some(id));
                        *b = None;
                    }
                    c.release(t);
                    p.on_freed(c.take_freed()).unwrap();
                    continue;
                }
                if held.len() == 16 { continue; }
                let placed = if what == 1 {
                    p.reserve_piece(n, n / 3)
                } else {
                    p.reserve(n).ok().map(|off| (off, n))
                };
                if let Some((off, n)) = placed {
                    prop_assert!(n >= 1 && off + n <= len);
                    for b in &mut owner[off as usize..(off + n) as usize] {
                        prop_assert_eq!(*b, None, "overwrote unread data");
                        *b = Some(i);
                    }
                    w.post(&p, off, n)?;
                    held.push((c.accept(off, n).unwrap(), off, n, i));
                } else {
                    prop_assert!(
                        !held.is_empty() || !w.posted.is_empty() || (what != 1 && n > len),
                        "an empty ring takes a piece"
                    );
                }
            }
        }

        /// Random sequences of sends, out-of-order releases and late completions: the producer
        /// never places a body over unread bytes nor over bytes a WRITE still reads (checked
        /// against byte maps), the consumer accepts every body the producer placed, and the
        /// counters agree when everything is freed and retired.
        #[test]
        fn producer_and_consumer_agree(
            len in 1u32..300,
            ops in proptest::collection::vec((1u32..320, 0u8..3, any::<u8>()), 1..200),
        ) {
            let mut p = RingProducer::new(len);
            let mut c = RingConsumer::new(len, 16);
            let mut w = Writes::new(len);
            let mut owner: Vec<Option<usize>> = vec![None; len as usize];
            let mut held: Vec<(RingToken, u32, u32, usize)> = Vec::new();
            for (i, (n, what, pick)) in ops.into_iter().enumerate() {
                if what == 2 {
                    w.complete(&mut p, usize::from(pick % 4) + 1);
                    continue;
                }
                if what == 1 && !held.is_empty() {
                    let k = pick as usize % held.len();
                    let (t, off, n, id) = held.swap_remove(k);
                    for b in &mut owner[off as usize..(off + n) as usize] {
                        prop_assert_eq!(*b, Some(id));
                        *b = None;
                    }
                    c.release(t);
                    p.on_freed(c.take_freed()).unwrap();
                    continue;
                }
                if held.len() == 16 { continue; }
                match p.reserve(n) {
                    Ok(off) => {
                        for b in &mut owner[off as usize..(off + n) as usize] {
                            prop_assert_eq!(*b, None, "overwrote unread data");
                            *b = Some(i);
                        }
                        w.post(&p, off, n)?;
                        let t = c.accept(off, n).unwrap();
                        held.push((t, off, n, i));
                    }
                    Err(RingReserveError::TooLarge { .. }) => prop_assert!(n > len),
                    Err(RingReserveError::Full) => prop_assert!(!held.is_empty() || !w.posted.is_empty()),
                }
            }
            for (t, ..) in held.drain(..) { c.release(t); }
            p.on_freed(c.take_freed()).unwrap();
            let k = w.posted.len();
            w.complete(&mut p, k);
            prop_assert_eq!((p.used(), p.unretired()), (0, 0));
        }

        /// A peer that lies about its freed head (reports everything placed as freed, at any
        /// time): whatever it says, no placement touches a mirror range a posted WRITE still
        /// reads, and once every WRITE completed and the peer freed all, the whole ring is free
        /// again (no stall on retirement).
        #[test]
        fn a_lying_peer_never_gets_bytes_still_written(
            len in 1u32..300,
            ops in proptest::collection::vec((1u32..320, 0u8..4, any::<u8>()), 1..200),
        ) {
            let mut p = RingProducer::new(len);
            let mut w = Writes::new(len);
            for (n, what, pick) in ops {
                match what {
                    0 => {
                        p.on_freed(p.tail().wrapping_sub(u32::from(pick) % (p.used() + 1))).unwrap();
                    }
                    1 => w.complete(&mut p, usize::from(pick % 4) + 1),
                    2 => {
                        if let Some((off, n)) = p.reserve_piece(n, n / 3) {
                            w.post(&p, off, n)?;
                        }
                    }
                    _ => {
                        if let Ok(off) = p.reserve(n) {
                            w.post(&p, off, n)?;
                        }
                    }
                }
            }
            let k = w.posted.len();
            w.complete(&mut p, k);
            p.on_freed(p.tail()).unwrap();
            prop_assert_eq!(p.reserve(len).map(|_| ()), Ok(()));
        }
    }
}
