//! What an endpoint opens once on its device and shares among the sessions it carries: the
//! device context (with its port and chosen GID; on libibverbs also its async-event thread) and
//! one protection domain.
//!
//! A client that talks to many servers opens one of these per endpoint, not one per server
//! (issue 28 item 1). Sharing the PD is what lets sessions share registered memory later (a
//! shared SRQ); it is sound only where each session's ring is exposed through a type-2 memory
//! window bound to that session's QP: with a plain MR rkey, any QP of the PD could reach the
//! ring, so a hostile server could write into another server's session. On a device without
//! type-2 windows each session gets a PD of its own ([`Nic::session_pd`]) and keeps its
//! neighbours out as before.

use std::sync::Arc;

use crate::transport::Device;
use crate::verbs::{Context, DeviceSelector, Provider, Result};

/// A device context and its PD, shared (by `Arc`) by every session of one endpoint. Field order
/// is drop order: the PD before the context (each MR and QP holds its PD alive besides).
pub(crate) struct Nic<P: Provider> {
    pd: P::ProtectionDomain,
    pub(crate) dev: Device<P>,
}

impl<P: Provider> Nic<P> {
    /// Opens `selector` (port `port`, GID `gid_index`, -1 = automatic) and allocates the PD.
    ///
    /// # Errors
    /// The verbs error of `ibv_open_device`, the port or GID query, or `ibv_alloc_pd`.
    pub(crate) fn open(selector: &DeviceSelector, port: u8, gid_index: i32) -> Result<Arc<Nic<P>>> {
        let dev = Device::<P>::open(selector, port, gid_index)?;
        let pd = dev.ctx.alloc_pd()?;
        Ok(Arc::new(Nic { pd, dev }))
    }

    /// The PD a new session registers its memory and creates its QP in: the endpoint's own
    /// where rings are exposed through type-2 memory windows (bound to one QP each), else a
    /// fresh one, so that no session's ring is reachable from another session's QP.
    ///
    /// # Errors
    /// The verbs error of `ibv_alloc_pd`.
    pub(crate) fn session_pd(&self) -> Result<P::ProtectionDomain> {
        if self.dev.ctx.attr().mw_type2 {
            Ok(self.pd.clone())
        } else {
            self.dev.ctx.alloc_pd()
        }
    }
}
