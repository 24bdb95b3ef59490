//! The responder as a requester's executor sees it: views of the peer QP's shared state, its
//! receive ring, receive CQ and key table, in the peer host's segment. The same type, and the
//! same data path, whether the peer is a host of this process or of another one.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::cq::CqView;
use super::mr::MrView;
use super::qp::{QpCore, QpShared, ST_ERR};
use super::remote::RemoteHost;
use super::srq::{pop_recv_id, RecvRing};
use crate::verbs::WcOpcode;

pub(crate) struct PeerQp {
    sh: *const QpShared,
    pub(crate) qpn: u32,
    pub(crate) pd: u32,
    pub(crate) recv_pd: u32,
    pub(crate) ring: RecvRing,
    pub(crate) cq: CqView,
    pub(crate) mrs: MrView,
    alive: *const AtomicU32,
    /// The peer QP's own RQ (flushed on error), rather than an SRQ.
    has_rq: bool,
    /// An in-process peer: its core (kept alive; an error takes the full local path).
    local: Option<Arc<QpCore>>,
    /// A peer in another process: the mapping of its host segment (kept mapped).
    _remote: Option<Arc<RemoteHost>>,
}

// SAFETY: views of atomics in mappings that the `local` / `_remote` handles keep alive.
unsafe impl Send for PeerQp {}
// SAFETY: as above.
unsafe impl Sync for PeerQp {}

impl PeerQp {
    /// A peer QP of this process.
    pub(crate) fn local(core: Arc<QpCore>) -> PeerQp {
        PeerQp {
            sh: core.sh() as *const QpShared,
            qpn: core.qpn,
            pd: core.pd,
            recv_pd: core.recv_pd(),
            ring: core.recv_ring().view(),
            cq: core.recv_cq.view(),
            mrs: core.host.mrs.view,
            alive: core.host.alive_word() as *const AtomicU32,
            has_rq: core.rq.is_some(),
            local: Some(core),
            _remote: None,
        }
    }

    /// QP `qpn` of a host of another process; `None` if it does not exist there or its state
    /// does not fit in the mapping.
    pub(crate) fn remote(host: Arc<RemoteHost>, qpn: u32) -> Option<PeerQp> {
        let seg = &host.seg;
        let off = host.qp_offset(qpn)?;
        let sh_bytes = std::mem::size_of::<QpShared>();
        if off < super::shm::HEAP_OFF || off % 128 != 0 || off + sh_bytes > seg.len() {
            return None;
        }
        // SAFETY: inside the mapping (checked), 128-aligned, atomics only.
        let sh = unsafe { &*(seg.at(off) as *const QpShared) };
        let r = &sh.resp;
        if r.qpn.load(Ordering::Acquire) != qpn || r.destroyed.load(Ordering::Acquire) {
            return None;
        }
        let ring_off = r.recv_ring_off.load(Ordering::Relaxed) as usize;
        let cq_off = r.recv_cq_off.load(Ordering::Relaxed) as usize;
        if ring_off >= seg.len() || cq_off >= seg.len() {
            return None;
        }
        // SAFETY: both offsets are inside the mapping; `attach` checks the extents against the
        // rest of it. The mapping lives as long as `host`, which the view holds.
        let ring = unsafe { RecvRing::attach(seg.at(ring_off), seg.len() - ring_off)? };
        // SAFETY: as above.
        let cq = unsafe { CqView::attach(seg.at(cq_off), seg.len() - cq_off)? };
        Some(PeerQp {
            sh,
            qpn,
            pd: r.pd.load(Ordering::Relaxed),
            recv_pd: r.recv_pd.load(Ordering::Relaxed),
            ring,
            cq,
            mrs: MrView::of(seg),
            alive: &seg.header().alive as *const AtomicU32,
            has_rq: ring_off == off + sh_bytes,
            local: None,
            _remote: Some(host),
        })
    }

    /// For a peer in another process: announces a transfer into its host until the guard drops
    /// (the host's owner waits for it before reusing memory, see [`super::epoch`]). In this
    /// process the requester's QP guard plays that part.
    #[inline(always)]
    pub(crate) fn pin(&self) -> Option<super::epoch::Pin<'_>> {
        self._remote.as_ref().map(|h| h.reader.pin())
    }

    #[inline(always)]
    pub(crate) fn sh(&self) -> &QpShared {
        // SAFETY: kept mapped by `local` / `_remote`.
        unsafe { &*self.sh }
    }

    /// Whether packets reach it: the QP exists (not destroyed, its memory not reused), its host
    /// is up, and no fault injection drops its traffic.
    #[inline]
    pub(crate) fn reachable(&self) -> bool {
        let r = &self.sh().resp;
        // SAFETY: `alive` points into a mapping kept alive by `self`.
        let alive = unsafe { &*self.alive }.load(Ordering::Relaxed) != 0;
        // `SeqCst` (a plain load on x86): ordered after a pin, see `super::epoch`.
        alive
            && !r.destroyed.load(Ordering::SeqCst)
            && !r.drop_traffic.load(Ordering::Relaxed)
            && r.qpn.load(Ordering::Relaxed) == self.qpn
    }

    #[inline]
    pub(crate) fn state_raw(&self) -> u8 {
        self.sh().resp.state.load(Ordering::Acquire)
    }

    /// The responder detected an error: the QP goes to ERR and its RQ is flushed. For a peer in
    /// another process, its send queue is flushed by its owner (at its next post or timer tick).
    pub(crate) fn set_error(&self) {
        if let Some(core) = &self.local {
            core.set_error();
            return;
        }
        if !self.reachable() {
            return;
        }
        let sh = self.sh();
        sh.resp.state.store(ST_ERR, Ordering::SeqCst);
        if self.has_rq {
            while let Some(wr_id) = pop_recv_id(&self.ring) {
                self.cq.push(super::qp::flush_wc(wr_id, WcOpcode::IBV_WC_RECV, self.qpn), true);
            }
        }
        sh.request_flush();
    }
}
