//! Shared receive queues (`struct ibv_srq`).

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    ibv_create_srq, ibv_destroy_srq, ibv_post_srq_recv, ibv_srq, ibv_srq_attr, ibv_srq_init_attr,
};

use super::errno::{last_os, rc_error};
use super::pd::IbvProtectionDomain;
use super::post::post_recv_chain;
use crate::verbs::{RecvWr, Result, SharedReceiveQueue, SrqInitAttr, VerbsError};

/// A shared receive queue. Cheap to clone (clones share the SRQ).
#[derive(Clone)]
pub struct IbvSharedReceiveQueue {
    pub(super) inner: Arc<SrqInner>,
}

pub(super) struct SrqInner {
    pub(super) srq: NonNull<ibv_srq>,
    max_wr: u32,
    max_sge: u32,
    _pd: IbvProtectionDomain,
}

// SAFETY: libibverbs SRQ verbs (post, destroy) are thread-safe; the Rust state is immutable.
unsafe impl Send for SrqInner {}
// SAFETY: see `Send`.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using this SRQ hold an `Arc` to it, so none is left; destroyed once.
        let rc = unsafe { ibv_destroy_srq(self.srq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %rc_error(rc), "ibv_destroy_srq failed");
        }
    }
}

impl IbvSharedReceiveQueue {
    pub(super) fn create(pd: &IbvProtectionDomain, attr: &SrqInitAttr) -> Result<IbvSharedReceiveQueue> {
        let dev = &pd.ctx().inner.attr;
        if attr.max_wr > dev.max_srq_wr {
            return Err(VerbsError::CapExceeded {
                what: "create_srq max_wr",
                cap: "max_srq_wr",
                requested: attr.max_wr.into(),
                limit: dev.max_srq_wr.into(),
            });
        }
        if attr.max_sge > dev.max_srq_sge {
            return Err(VerbsError::CapExceeded {
                what: "create_srq max_sge",
                cap: "max_srq_sge",
                requested: attr.max_sge.into(),
                limit: dev.max_srq_sge.into(),
            });
        }
        if attr.max_wr == 0 || attr.max_sge == 0 {
            return Err(VerbsError::InvalidArgument {
                call: "ibv_create_srq",
                reason: format!("max_wr ({}) and max_sge ({}) must be at least 1", attr.max_wr, attr.max_sge),
            });
        }
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr { max_wr: attr.max_wr, max_sge: attr.max_sge, srq_limit: 0 },
        };
        // SAFETY: live PD; `init` is a live in/out parameter; the SRQ is destroyed in drop.
        let srq = NonNull::new(unsafe { ibv_create_srq(pd.raw(), &mut init) })
            .ok_or_else(|| last_os("ibv_create_srq"))?;
        Ok(IbvSharedReceiveQueue {
            inner: Arc::new(SrqInner {
                srq,
                // The provider writes back the actual sizes (at least what was asked).
                max_wr: init.attr.max_wr.max(attr.max_wr),
                max_sge: init.attr.max_sge.max(attr.max_sge),
                _pd: pd.clone(),
            }),
        })
    }
}

impl SharedReceiveQueue for IbvSharedReceiveQueue {
    fn max_wr(&self) -> u32 {
        self.inner.max_wr
    }

    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let srq = self.inner.srq.as_ptr();
        let post = |wr, bad| {
            // SAFETY: live SRQ (while `self` is), a valid chain on `post_recv_chain`'s stack, live
            // out-parameter.
            unsafe { ibv_post_srq_recv(srq, wr, bad) }
        };
        // SAFETY: `post` posts to this live SRQ; the memory contract is the caller's.
        unsafe { post_recv_chain("ibv_post_srq_recv", wrs, self.inner.max_sge, post) }
    }
}

impl std::fmt::Debug for IbvSharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvSharedReceiveQueue")
            .field("max_wr", &self.inner.max_wr)
            .field("max_sge", &self.inner.max_sge)
            .finish()
    }
}
