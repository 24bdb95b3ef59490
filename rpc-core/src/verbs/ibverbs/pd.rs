//! Protection domains (`struct ibv_pd`): the factory of MRs, SRQs and QPs. QPs go on the PD's
//! parent domain when the device offers thread domains (see [`super::td`]).

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_dealloc_pd, ibv_pd};

use super::context::IbvContext;
use super::errno::rc_error;
use super::mr::IbvMemoryRegion;
use super::mw::IbvMemoryWindow;
use super::qp::IbvQueuePair;
use super::srq::IbvSharedReceiveQueue;
use super::td::ParentDomain;
use super::Ibverbs;
use crate::verbs::{AccessFlags, MwType, ProtectionDomain, QpInitAttr, Result, SrqInitAttr};

/// A protection domain. Cheap to clone (clones share the PD).
///
/// Where the device offers thread domains it also carries a TD and a parent domain on this PD
/// with it: QPs are created on the parent domain (the provider elides their locks; posts take a
/// lock of ours per TD), MRs, MWs and SRQs on the plain PD (see the `td` module of this provider).
#[derive(Clone)]
pub struct IbvProtectionDomain {
    pub(super) inner: Arc<PdInner>,
    /// The parent domain QPs are created on; `None`: the plain PD (no TD on this device).
    /// Holds `inner` itself, so it is freed first when the last handle and QP are gone.
    qp_domain: Option<Arc<ParentDomain>>,
}

pub(super) struct PdInner {
    pub(super) pd: NonNull<ibv_pd>,
    pub(super) ctx: IbvContext,
}

// SAFETY: libibverbs PD verbs are thread-safe; the Rust state is immutable.
unsafe impl Send for PdInner {}
// SAFETY: see `Send`.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: MRs, SRQs, QPs and the parent domain of this PD hold an `Arc` to it, so none is
        // left; freed once.
        let rc = unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %rc_error(rc), "ibv_dealloc_pd failed");
        }
    }
}

impl IbvProtectionDomain {
    /// Wraps a PD just allocated on `ctx`, with a TD and parent domain for its QPs where the
    /// device offers them.
    pub(super) fn new(ctx: IbvContext, pd: NonNull<ibv_pd>) -> IbvProtectionDomain {
        let inner = Arc::new(PdInner { pd, ctx });
        let qp_domain = super::td::alloc_qp_domain(&inner.ctx, &inner);
        IbvProtectionDomain { inner, qp_domain }
    }

    /// The parent domain QPs of this PD are created on (`None`: the plain PD).
    pub(super) fn qp_domain(&self) -> Option<&Arc<ParentDomain>> {
        self.qp_domain.as_ref()
    }

    /// Whether QPs of this PD are created on a parent domain with a thread domain.
    pub fn has_thread_domain(&self) -> bool {
        self.qp_domain.is_some()
    }

    pub(super) fn raw(&self) -> *mut ibv_pd {
        self.inner.pd.as_ptr()
    }

    pub(super) fn ctx(&self) -> &IbvContext {
        &self.inner.ctx
    }
}

impl ProtectionDomain<Ibverbs> for IbvProtectionDomain {
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<IbvMemoryRegion> {
        IbvMemoryRegion::alloc(self, len, access)
    }

    unsafe fn reg_user_mr(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<IbvMemoryRegion> {
        // SAFETY: forwarded caller contract (memory alive and unmoved while registered).
        unsafe { IbvMemoryRegion::register_user(self, addr, len, access) }
    }

    fn alloc_mw(&self, mw_type: MwType) -> Result<IbvMemoryWindow> {
        IbvMemoryWindow::alloc(self, mw_type)
    }

    fn create_srq(&self, attr: &SrqInitAttr) -> Result<IbvSharedReceiveQueue> {
        IbvSharedReceiveQueue::create(self, attr)
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, Ibverbs>) -> Result<IbvQueuePair> {
        IbvQueuePair::create(self, attr)
    }
}

impl std::fmt::Debug for IbvProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvProtectionDomain")
            .field("device", &self.inner.ctx)
            .field("thread_domain", &self.qp_domain.is_some())
            .finish()
    }
}
