//! A message body encoded once, without copying its large shared fields: [`GatherBody`].
//!
//! A body larger than the staging area cannot be encoded into registered memory in one go (the
//! peer's ring takes it piece by piece as it frees space, and prost's encoder cannot stop in the
//! middle of a message). Encoding it into a heap buffer first would copy every byte once more
//! than the staged path does (heap, then the send mirror per piece, the WRITE, the copy-out).
//! A `GatherBody` is what the encoder writes instead: the small encoded parts (tags, lengths,
//! scalar and string fields) go into one heap buffer, and every `bytes::Bytes` field of at least
//! [`GATHER_MIN`] bytes (prost hands those to [`BufMut::put`] as the `Bytes` itself) is kept as a
//! reference-counted slice of the caller's memory, not copied. Each piece is then copied once,
//! straight from there into the send mirror at its ring offset ([`GatherBody::copy_next`]): for
//! a message whose bulk is a `bytes` field, one copy into registered memory per byte, and the
//! heap holds only the small parts. A large field that is not a `Bytes` (a `Vec<u8>` field, a
//! `Buf` of another kind) is copied once into a `Bytes` of its own, as a heap encoding would.

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes};

/// Shared fields of at least this many bytes are referenced, not copied, by a [`GatherBody`].
pub const GATHER_MIN: usize = 4096;

#[derive(Debug)]
enum Seg {
    /// Bytes `[start, end)` of the body's own buffer.
    Own { start: usize, end: usize },
    /// A shared field, referenced.
    Shared(Bytes),
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Seg::Own { start, end } => end - start,
            Seg::Shared(b) => b.len(),
        }
    }
}

/// An encoded message body as a list of segments: runs of its own heap buffer and shared
/// `Bytes` fields, in order. Written through [`BufMut`] (prost's `encode_raw`), read once, in
/// order, by [`GatherBody::copy_next`].
#[derive(Debug, Default)]
pub struct GatherBody {
    own: Vec<u8>,
    segs: Vec<Seg>,
    /// End of the own bytes already covered by a segment.
    closed: usize,
    /// Bytes in shared segments.
    shared: usize,
    /// Next segment to copy from, and the offset in it.
    seg: usize,
    at: usize,
}

impl GatherBody {
    /// An empty body writing its own bytes into `own` (cleared first; a spare buffer keeps its
    /// capacity).
    pub fn new(mut own: Vec<u8>) -> GatherBody {
        own.clear();
        GatherBody { own, ..GatherBody::default() }
    }

    /// Capacity to reserve for the own bytes of a body of `len` bytes: all of it up to 64 KiB,
    /// else 64 KiB (a body that large is mostly shared fields, or its own buffer grows).
    pub fn own_capacity_for(len: usize) -> usize {
        len.min(64 << 10)
    }

    /// Encodes `msg` into a body whose own bytes go into `own` (see [`GatherBody::new`]).
    pub fn encode<M: prost::Message>(msg: &M, own: Vec<u8>) -> GatherBody {
        let mut g = GatherBody::new(own);
        msg.encode_raw(&mut g);
        g
    }

    /// Length of the body in bytes (own and shared; copying does not change it).
    pub fn len(&self) -> usize {
        self.own.len() + self.shared
    }

    /// True for an empty body.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held in the body's own heap buffer (the rest are shared references).
    pub fn own_len(&self) -> usize {
        self.own.len()
    }

    fn close_own(&mut self) {
        if self.own.len() > self.closed {
            self.segs.push(Seg::Own { start: self.closed, end: self.own.len() });
            self.closed = self.own.len();
        }
    }

    /// Copies the next `dst.len()` bytes of the body into `dst`, continuing where the previous
    /// call stopped (the first call starts at byte 0); a shared segment is released once copied.
    /// Returns false, with `dst` partly written, when fewer bytes remain.
    pub fn copy_next(&mut self, dst: &mut [u8]) -> bool {
        self.gather_next(dst, 0, |_| None, &mut Vec::new()).is_some()
    }

    /// As [`GatherBody::copy_next`], but the body's next `dst.len()` bytes that lie in a shared
    /// segment registered under an lkey (`lkey_of`, the connection's [`super::RegisteredPool`])
    /// are not copied: they are pushed to `refs` (at their offset in `dst`, with their lkey), at
    /// most `max_refs` of them (the rest is copied), and `dst` is left as it was there. Returns
    /// the bytes of registered segments copied because `refs` was full (0 while it was not),
    /// or `None` when fewer bytes remain (`dst` partly written).
    pub(crate) fn gather_next(
        &mut self,
        dst: &mut [u8],
        max_refs: usize,
        lkey_of: impl Fn(&[u8]) -> Option<u32>,
        refs: &mut Vec<super::registered::RegisteredRef>,
    ) -> Option<u64> {
        self.close_own();
        let mut done = 0;
        let mut copied = 0u64;
        while done < dst.len() {
            let seg = self.segs.get_mut(self.seg)?;
            let n = (seg.len() - self.at).min(dst.len() - done);
            let src: &[u8] = match seg {
                Seg::Own { start, end } => &self.own[*start..*end],
                Seg::Shared(b) => match lkey_of(&b[self.at..self.at + n]) {
                    Some(lkey) if refs.len() < max_refs => {
                        let bytes = b.slice(self.at..self.at + n);
                        refs.push(super::registered::RegisteredRef { at: done as u32, bytes, lkey });
                        &[]
                    }
                    Some(_) => {
                        copied += n as u64;
                        b
                    }
                    None => b,
                },
            };
            if !src.is_empty() {
                dst[done..done + n].copy_from_slice(&src[self.at..self.at + n]);
            }
            done += n;
            self.at += n;
            if self.at == seg.len() {
                if let Seg::Shared(b) = seg {
                    *b = Bytes::new();
                }
                self.seg += 1;
                self.at = 0;
            }
        }
        Some(copied)
    }

    /// Writes the whole body into `dst`, in order, leaving `self` as it was (for a body encoded
    /// once and written later, whole, wherever room appears). A shared segment goes to `dst` as
    /// the `Bytes` it is ([`BufMut::put`]): into registered memory that is its one copy, and a
    /// `GatherBody` destination references it again instead of copying. Call it on a body that
    /// [`GatherBody::copy_next`] has not started on (copied shared segments are released).
    ///
    /// # Panics
    /// When `dst` has fewer than [`GatherBody::len`] bytes of room (as [`BufMut::put_slice`]).
    pub fn put_into(&self, dst: &mut impl BufMut) {
        for seg in &self.segs {
            match seg {
                Seg::Own { start, end } => dst.put_slice(&self.own[*start..*end]),
                Seg::Shared(b) => dst.put(b.clone()),
            }
        }
        dst.put_slice(&self.own[self.closed..]);
    }

    /// The body's own heap buffer, to reuse for a later body.
    pub fn into_own(self) -> Vec<u8> {
        self.own
    }
}

impl From<Vec<u8>> for GatherBody {
    /// A body that is all its own bytes (encoded elsewhere).
    fn from(own: Vec<u8>) -> GatherBody {
        GatherBody { own, ..GatherBody::default() }
    }
}

// SAFETY: every method forwards to `Vec<u8>`'s `BufMut` implementation on `self.own`, whose
// contract (`chunk_mut` spans writable spare capacity, `advance_mut` by at most its length marks
// those bytes initialized) therefore holds for `GatherBody` too. `put` and `put_slice` only append
// through safe calls.
unsafe impl BufMut for GatherBody {
    fn remaining_mut(&self) -> usize {
        self.own.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller upholds `advance_mut`'s contract for the chunk `chunk_mut` returned,
        // which is `self.own`'s.
        unsafe { self.own.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.own.chunk_mut()
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        let n = src.remaining();
        if n >= GATHER_MIN {
            self.close_own();
            // A `Bytes` hands over a slice of itself (no copy); other buffers copy once.
            self.segs.push(Seg::Shared(src.copy_to_bytes(n)));
            self.shared += n;
            return;
        }
        while src.has_remaining() {
            let c = src.chunk();
            let k = c.len();
            self.own.extend_from_slice(c);
            src.advance(k);
        }
    }

    fn put_slice(&mut self, src: &[u8]) {
        self.own.extend_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Msg {
        #[prost(uint32, tag = "1")]
        n: u32,
        #[prost(bytes = "bytes", tag = "2")]
        big: Bytes,
        #[prost(string, tag = "3")]
        name: String,
        #[prost(bytes = "vec", tag = "4")]
        vec: Vec<u8>,
        #[prost(bytes = "bytes", tag = "5")]
        small: Bytes,
    }

    fn sample(big: usize) -> Msg {
        Msg {
            n: 7,
            big: Bytes::from((0..big).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>()),
            name: "x".repeat(300),
            vec: vec![9u8; 5000],
            small: Bytes::from_static(b"tiny"),
        }
    }

    #[test]
    fn pieces_of_any_size_give_the_encoding_byte_for_byte() {
        let m = sample(100_000);
        let want = prost::Message::encode_to_vec(&m);
        for piece in [1usize, 7, 4096, 65_536, want.len()] {
            let mut g = GatherBody::encode(&m, Vec::new());
            assert_eq!(g.len(), want.len());
            let mut got = Vec::new();
            while got.len() < want.len() {
                let mut dst = vec![0u8; piece.min(want.len() - got.len())];
                assert!(g.copy_next(&mut dst));
                got.extend_from_slice(&dst);
            }
            assert_eq!(got, want, "piece {piece}");
            assert!(!g.copy_next(&mut [0u8; 1]), "nothing is left");
            assert!(g.copy_next(&mut []), "an empty copy always succeeds");
        }
    }

    #[test]
    fn a_large_bytes_field_is_referenced_not_copied() {
        let m = sample(1 << 20);
        let g = GatherBody::encode(&m, Vec::new());
        // Own: tags, lengths, the string, the Vec<u8> field (copied into a Bytes of its own,
        // counted as shared) and the small field.
        assert!(g.own_len() < 1000, "own bytes {}", g.own_len());
        assert_eq!(g.len(), prost::Message::encoded_len(&m));
        let Some(Seg::Shared(b)) = g.segs.iter().find(|s| s.len() == 1 << 20) else {
            panic!("no shared segment for the big field: {:?}", g.segs.len())
        };
        assert_eq!(b.as_ptr(), m.big.as_ptr(), "the field's own memory, not a copy");
    }

    #[test]
    fn put_into_writes_the_encoding_and_a_gather_destination_references_the_large_field_again() {
        let m = sample(100_000);
        let want = prost::Message::encode_to_vec(&m);
        let g = GatherBody::encode(&m, Vec::new());
        let mut flat = vec![0u8; want.len()];
        g.put_into(&mut &mut flat[..]);
        assert_eq!(flat, want);
        // Twice: writing leaves the body as it was.
        let mut again = Vec::new();
        g.put_into(&mut again);
        assert_eq!(again, want);
        let mut g2 = GatherBody::new(Vec::new());
        g.put_into(&mut g2);
        assert_eq!(g2.len(), want.len());
        let Some(Seg::Shared(b)) = g2.segs.iter().find(|s| s.len() == 100_000) else {
            panic!("the big field was copied into the second body's own bytes")
        };
        assert_eq!(b.as_ptr(), m.big.as_ptr());
        let mut got = vec![0u8; want.len()];
        assert!(g2.copy_next(&mut got));
        assert_eq!(got, want);
    }

    #[test]
    fn a_vec_body_is_all_its_own() {
        let mut g = GatherBody::from(vec![1u8, 2, 3]);
        assert_eq!((g.len(), g.own_len()), (3, 3));
        let mut d = [0u8; 3];
        assert!(g.copy_next(&mut d));
        assert_eq!(d, [1, 2, 3]);
        assert_eq!(g.into_own(), vec![1, 2, 3]);
    }
}
