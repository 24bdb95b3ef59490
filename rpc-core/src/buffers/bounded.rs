//! A [`BufMut`] over a byte slice that never panics: [`Bounded`].
//!
//! A request is encoded straight into registered memory (a send buffer, the mirror of the peer's
//! ring, the staging area) sized by its `Message::encoded_len`. prost's generated code always
//! writes exactly that many bytes, but a hand-written `Message` may write more, and `&mut [u8]`'s
//! `BufMut` panics in the caller's thread when it does. `Bounded` writes what fits and records that
//! the message overran it, so the caller answers with an error instead (what was written is
//! discarded).

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut};

/// A slice being written from its start; writes past its end are dropped and flagged
/// ([`Bounded::overran`]).
#[derive(Debug)]
pub struct Bounded<'a> {
    dst: &'a mut [u8],
    /// Bytes written; `usize::MAX` once a write did not fit (one compare per write checks both).
    at: usize,
}

/// `Bounded::at` after an overrun.
const OVERRAN: usize = usize::MAX;

impl<'a> Bounded<'a> {
    /// Writes into `dst` from byte 0.
    pub fn new(dst: &'a mut [u8]) -> Bounded<'a> {
        Bounded { dst, at: 0 }
    }

    /// Bytes written (the writes that fit, in order, until the first that did not).
    pub fn written(&self) -> usize {
        self.at.min(self.dst.len())
    }

    /// Whether a write did not fit: the contents are then not the message, only a prefix.
    pub fn overran(&self) -> bool {
        self.at == OVERRAN
    }

    /// Zeroes what was not written: the rest of the slice, or all of it after an overrun.
    pub fn zero_rest(&mut self) {
        let from = if self.overran() { 0 } else { self.at };
        self.dst[from..].fill(0);
    }

    /// The next `n` bytes, counted written; `None` (and an overrun from here on) when they do not
    /// fit.
    #[inline]
    fn take(&mut self, n: usize) -> Option<&mut [u8]> {
        let end = self.at.saturating_add(n);
        match self.dst.get_mut(self.at..end) {
            Some(d) => {
                self.at = end;
                Some(d)
            }
            None => {
                self.at = OVERRAN;
                None
            }
        }
    }
}

// SAFETY: `chunk_mut` is the unwritten rest of `dst` (empty after an overrun), initialized memory
// that `&mut` lets us write; `advance_mut`'s caller promises `cnt <= chunk_mut().len()`, so `at`
// never passes `dst.len()` that way (it is `OVERRAN` only when set so). The other writes check
// bounds and never panic: a write that does not fit sets `OVERRAN`, after which none fits.
unsafe impl BufMut for Bounded<'_> {
    fn remaining_mut(&self) -> usize {
        self.dst.len().saturating_sub(self.at)
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        self.at += cnt;
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        let from = self.at.min(self.dst.len());
        UninitSlice::new(&mut self.dst[from..])
    }

    #[inline]
    fn put_slice(&mut self, src: &[u8]) {
        if let Some(d) = self.take(src.len()) {
            d.copy_from_slice(src);
        }
    }

    #[inline]
    fn put_u8(&mut self, n: u8) {
        // prost writes varints a byte at a time.
        if let Some(d) = self.take(1) {
            d[0] = n;
        }
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        while src.has_remaining() && self.at != OVERRAN {
            let c = src.chunk();
            let n = c.len();
            self.put_slice(c);
            src.advance(n);
        }
    }

    fn put_bytes(&mut self, val: u8, cnt: usize) {
        if let Some(d) = self.take(cnt) {
            d.fill(val);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn writes_that_fit_are_written_and_the_first_that_does_not_flags_an_overrun() {
        let mut buf = [0u8; 8];
        let mut w = Bounded::new(&mut buf);
        w.put_u8(1);
        w.put_slice(&[2, 3]);
        w.put(Bytes::from_static(&[4, 5, 6]));
        w.put_bytes(7, 2);
        assert_eq!((w.written(), w.overran()), (8, false));
        w.put_u8(9);
        assert!(w.overran());
        w.put_bytes(9, 0);
        assert_eq!(w.written(), 8);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 7]);
        let mut buf = [9u8; 4];
        let mut w = Bounded::new(&mut buf);
        w.put_u8(1);
        w.zero_rest();
        assert_eq!(buf, [1, 0, 0, 0], "the rest is zeroed");
        let mut w = Bounded::new(&mut buf);
        w.put_slice(&[5; 5]);
        w.zero_rest();
        assert_eq!(buf, [0; 4], "all of it after an overrun");
    }

    #[test]
    fn a_message_longer_than_the_slice_overruns_without_panicking() {
        let mut buf = [0u8; 4];
        let mut w = Bounded::new(&mut buf);
        w.put(Bytes::from(vec![1u8; 100]));
        w.put_bytes(0, 100);
        w.put_slice(&[1]);
        assert!(w.overran());
        assert!(w.written() <= 4);
    }
}
