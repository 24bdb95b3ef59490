//! A [`BufMut`] over a byte slice that never panics: [`Bounded`].
//!
//! A request is encoded straight into registered memory (a send buffer, the mirror of the peer's
//! ring, the staging area) sized by its `Message::encoded_len`. prost's generated code always
//! writes exactly that many bytes, but a hand-written `Message` may write more, and `&mut [u8]`'s
//! `BufMut` panics in the caller's thread when it does. `Bounded` writes what fits and records that
//! the message overran it, so the caller answers with an error instead (what was written is
//! discarded).
//!
//! Every path that encodes a message of a caller or a handler (server answers, stream sinks,
//! client requests, stream sends and batches, channel submissions) goes through
//! [`encode_exact`] (a slice of registered memory, sized by `encoded_len`) or [`encode_vec_exact`]
//! / [`check_exact`] (a growing heap buffer): a message that writes more, or fewer, bytes than its
//! `encoded_len` gave is a [`LenMismatch`], which the caller turns into an INTERNAL status for that
//! call alone ([`LenMismatch::status`]) after giving back or rewinding what it reserved for it.

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut};

use crate::status::Status;

/// A message whose `encode_raw` did not write the number of bytes its `encoded_len` gave (a
/// hand-written `prost::Message`; generated code never does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LenMismatch {
    /// The message's type name.
    pub type_name: &'static str,
    /// Its `encoded_len`, in bytes.
    pub claimed: usize,
    /// Bytes it wrote; `None` when it wrote more than `claimed` (what it wrote past them was dropped).
    pub wrote: Option<usize>,
}

impl LenMismatch {
    /// The INTERNAL status of the call whose message (`what`: "answer", "request", "stream
    /// message") this is; nothing of the message was sent.
    #[cold]
    pub fn status(&self, what: &str) -> Status {
        let wrote = match self.wrote {
            None => "more than".to_owned(),
            Some(n) => format!("{n} bytes, not"),
        };
        Status::internal(format!(
            "the {what}'s encode_raw ({}) wrote {wrote} the {} bytes its encoded_len gave; nothing of it was sent",
            self.type_name, self.claimed
        ))
    }
}

/// Encodes `msg` into `dst`, which is exactly its `encoded_len` long. Never panics.
///
/// # Errors
/// [`LenMismatch`] when `msg` writes more or fewer than `dst.len()` bytes: `dst` then holds a
/// prefix of it (or of a message that wrote too much), which must not be sent.
#[inline]
pub fn encode_exact<M: prost::Message>(msg: &M, dst: &mut [u8]) -> Result<(), LenMismatch> {
    let claimed = dst.len();
    let mut w = Bounded::new(dst);
    msg.encode_raw(&mut w);
    if w.at == claimed {
        return Ok(());
    }
    Err(mismatch::<M>(claimed, (!w.overran()).then_some(w.at)))
}

/// Appends `msg`, whose `encoded_len` is `claimed` bytes, to `v`.
///
/// # Errors
/// [`LenMismatch`] when it wrote more or fewer bytes: `v` is then truncated back to its length
/// before the call.
#[inline]
pub fn encode_vec_exact<M: prost::Message>(
    msg: &M,
    v: &mut Vec<u8>,
    claimed: usize,
) -> Result<(), LenMismatch> {
    let before = v.len();
    v.reserve(claimed);
    msg.encode_raw(v);
    let wrote = v.len() - before;
    if wrote == claimed {
        return Ok(());
    }
    v.truncate(before);
    Err(mismatch::<M>(claimed, (wrote < claimed).then_some(wrote)))
}

/// Checks that a message of type `M` encoded elsewhere (a growing buffer: a
/// [`GatherBody`](super::GatherBody)) wrote the `claimed` bytes its `encoded_len` gave.
///
/// # Errors
/// [`LenMismatch`] when `wrote != claimed`.
#[inline]
pub fn check_exact<M>(claimed: usize, wrote: usize) -> Result<(), LenMismatch> {
    if wrote == claimed {
        return Ok(());
    }
    Err(mismatch::<M>(claimed, (wrote < claimed).then_some(wrote)))
}

#[cold]
fn mismatch<M>(claimed: usize, wrote: Option<usize>) -> LenMismatch {
    LenMismatch { type_name: std::any::type_name::<M>(), claimed, wrote }
}

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

    /// A message that claims `claim` bytes and writes `write`.
    #[derive(Debug, Default, Clone, PartialEq)]
    struct Liar {
        claim: usize,
        write: usize,
    }

    impl prost::Message for Liar {
        fn encode_raw(&self, buf: &mut impl BufMut) {
            for _ in 0..self.write {
                buf.put_u8(8);
            }
        }
        fn merge_field(
            &mut self,
            _: u32,
            _: prost::encoding::WireType,
            _: &mut impl Buf,
            _: prost::encoding::DecodeContext,
        ) -> Result<(), prost::DecodeError> {
            Ok(())
        }
        fn encoded_len(&self) -> usize {
            self.claim
        }
        fn clear(&mut self) {}
    }

    #[test]
    fn exact_encoding_tells_more_and_fewer_from_exact() {
        let mut buf = [0u8; 8];
        assert_eq!(encode_exact(&Liar { claim: 8, write: 8 }, &mut buf), Ok(()));
        let e = encode_exact(&Liar { claim: 8, write: 9 }, &mut buf).unwrap_err();
        assert_eq!((e.claimed, e.wrote), (8, None));
        let e = encode_exact(&Liar { claim: 8, write: 3 }, &mut buf).unwrap_err();
        assert_eq!((e.claimed, e.wrote), (8, Some(3)));
        let s = e.status("answer");
        assert_eq!(s.code(), crate::status::Code::Internal);
        assert!(s.message().contains("encoded_len"), "{s:?}");
        let mut v = vec![1, 2];
        assert!(encode_vec_exact(&Liar { claim: 4, write: 5 }, &mut v, 4).is_err());
        assert!(encode_vec_exact(&Liar { claim: 4, write: 3 }, &mut v, 4).is_err());
        assert_eq!(v, [1, 2], "truncated back");
        assert_eq!(encode_vec_exact(&Liar { claim: 4, write: 4 }, &mut v, 4), Ok(()));
        assert_eq!(v.len(), 6);
        assert!(check_exact::<Liar>(4, 5).is_err() && check_exact::<Liar>(4, 4).is_ok());
    }

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
