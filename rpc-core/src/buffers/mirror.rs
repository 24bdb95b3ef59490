//! [`SendMirror`]: the local image of the peer's ring that bodies are encoded into before their
//! RDMA WRITE, and [`MirrorView`], the only way to a byte view of it: one reserved range at a time.

use std::marker::PhantomData;

use crate::verbs::{racy, AccessFlags, MemoryRegion, ProtectionDomain, Provider, Result};

/// The local image of the peer's ring: bodies are encoded at the offset they will have in the
/// peer's ring, then RDMA WRITTEN there. Registered for local access only: no peer can write it.
///
/// The local NIC reads the ranges of posted WRITEs while the owner encodes the next bodies into
/// other ranges, so no view of the whole mirror exists. The public way in is a copy
/// ([`SendMirror::write_at`], atomic stores); the runtime encodes in place into one range at a
/// time, a range its session reserved in the peer's ring (a crate-private `MirrorView`).
pub struct SendMirror<P: Provider> {
    pub(super) mr: P::MemoryRegion,
}

impl<P: Provider> SendMirror<P> {
    /// Registers a mirror of `len` bytes (the peer's ring length): `LOCAL_WRITE`.
    ///
    /// # Errors
    /// The verbs error of registering.
    pub fn new(pd: &P::ProtectionDomain, len: usize) -> Result<SendMirror<P>> {
        Ok(SendMirror { mr: pd.reg_mr(len, AccessFlags::LOCAL_WRITE)? })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// True for an empty mirror (never: it has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// Copies `src` to `[offset, offset + src.len())`, with atomic stores: a posted WRITE that
    /// still reads the range sends a mix of old and new bytes (the caller's protocol error, not
    /// undefined behaviour). Returns false, copying nothing, when the range is outside the mirror.
    pub fn write_at(&mut self, offset: u32, src: &[u8]) -> bool {
        let o = offset as usize;
        if o.checked_add(src.len()).is_none_or(|end| end > self.mr.len()) {
            return false;
        }
        // SAFETY: the destination lies in `self.mr` (checked), alive for `&mut self`; `src` is a
        // Rust slice, which cannot overlap registered memory (no safe function hands one out
        // over the mirror that outlives `&mut self`). Every other access to the mirror meanwhile
        // is the local NIC's atomic read of a posted WRITE's range.
        unsafe { racy::store(src.as_ptr(), self.mr.as_ptr().add(o), src.len()) };
        true
    }

    /// A view through which the runtime encodes bodies into ranges its session reserved, one
    /// range at a time; it holds `&mut self`, so nothing else touches the mirror meanwhile.
    #[inline]
    pub(crate) fn view(&mut self) -> MirrorView<'_> {
        MirrorView { ptr: self.mr.as_ptr(), len: self.mr.len(), _mirror: PhantomData }
    }

    /// The bytes `[offset, offset + len)`, to encode a body into: a range the session reserved
    /// in the peer's ring. Empty when out of bounds. See [`MirrorView::range_mut`].
    #[inline]
    pub(crate) fn range_mut(&mut self, offset: u32, len: u32) -> &mut [u8] {
        let (o, n) = (offset as usize, len as usize);
        if o.checked_add(n).is_none_or(|end| end > self.mr.len()) {
            return &mut [];
        }
        // SAFETY: as in `MirrorView::range_mut`: the range lies in `self.mr` (checked), alive
        // and exclusively borrowed for the returned lifetime, and is one the session reserved.
        unsafe { std::slice::from_raw_parts_mut(self.mr.as_ptr().add(o), n) }
    }
}

/// The send mirror, exclusively borrowed, as the runtime encodes into it: no reference to the
/// whole of it is ever formed, only to the one range a body is encoded into
/// ([`MirrorView::range_mut`]), so a posted WRITE reading another range is never aliased by a
/// `&mut [u8]`.
pub struct MirrorView<'a> {
    ptr: *mut u8,
    len: usize,
    _mirror: PhantomData<&'a mut [u8]>,
}

impl MirrorView<'static> {
    /// A view of no mirror (none is registered yet): every range of it is out of bounds.
    #[inline]
    pub(crate) fn empty() -> MirrorView<'static> {
        MirrorView { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0, _mirror: PhantomData }
    }
}

impl MirrorView<'_> {
    /// True for the view of no mirror ([`MirrorView::empty`]).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes `[offset, offset + len)`, to encode a body into; `None` when out of bounds.
    /// Crate-private: `offset` and `len` must be a range the session reserved in the peer's ring
    /// (`Placement::Ring`, `Session::next_piece`), which no posted WRITE reads any more (the
    /// session's ring producer reserves only ranges whose WRITEs a polled completion retired).
    #[inline]
    pub(crate) fn range_mut(&mut self, offset: u32, len: u32) -> Option<&mut [u8]> {
        let (o, n) = (offset as usize, len as usize);
        if o.checked_add(n).is_none_or(|end| end > self.len) {
            return None;
        }
        // SAFETY: the range lies in the mirror's MR (checked), alive and exclusively borrowed for
        // `'a` (the view holds `&mut SendMirror`), and `&mut self` makes this the only view of
        // it. The mirror is never posted as a receive target nor exposed with a remote key, so
        // nothing writes it behind us; the local NIC only reads ranges of posted WRITEs, and the
        // session reserves a range again only once a polled completion of ours retired the WRITE
        // that read it (`SendQueue::take_ring_mark`, `Session::on_ring_written`: the producer
        // reuses bytes both freed by the peer and retired), so a peer reporting space freed
        // early cannot bring a reservation over a WRITE still in flight. The view of no mirror
        // (`MirrorView::empty`, length 0) passes only an empty range: a zero-length slice at a
        // dangling, aligned, non-null pointer.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(o), n) })
    }
}
