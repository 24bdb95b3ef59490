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

use std::sync::{Arc, Mutex};

use super::rx::{SharedRx, SHARED_DEPTH};
use crate::transport::Device;
use crate::verbs::{Context, DeviceSelector, Provider, Result};

/// A device context and its PD, shared (by `Arc`) by every session of one endpoint, and the
/// receive sides its client sessions share ([`SharedRx`], one per receive buffer size). Field
/// order is drop order: the receive sides, then the PD before the context (each MR and QP holds
/// its PD alive besides).
pub(crate) struct Nic<P: Provider> {
    rx: Mutex<Vec<Arc<SharedRx<P>>>>,
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
        Ok(Arc::new(Nic { rx: Mutex::new(Vec::new()), pd, dev }))
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

    /// The receive side a new client session's QP uses ([`SharedRx`]): the endpoint's shared one
    /// for buffers of `buf_size` bytes (opened by the first session that asks, kept while the
    /// endpoint lives) when the session's PD is the endpoint's (`pd`, from
    /// [`Nic::session_pd`]), it does not wait for completion events and its window's `depth`
    /// fits the shared SRQ's ([`SHARED_DEPTH`]); else one of its own, of `depth` WQEs. Buffers are registered in chunks of `1 << chunk_shift`; `reserve` before
    /// any claim (an idle session's control messages and reposts waiting for a batch).
    ///
    /// # Errors
    /// The verbs error of creating the SRQ or CQ, or registering the reserve.
    pub(crate) fn client_rx(
        &self,
        pd: &P::ProtectionDomain,
        buf_size: usize,
        depth: u32,
        chunk_shift: u32,
        reserve: u32,
        events: bool,
    ) -> Result<Arc<SharedRx<P>>> {
        let ctx = &self.dev.ctx;
        if events || !self.dev.ctx.attr().mw_type2 || depth > SHARED_DEPTH {
            return SharedRx::new(ctx, pd, depth, buf_size, chunk_shift, reserve, events);
        }
        let mut open = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = open.iter().find(|r| r.buf_size() == buf_size) {
            return Ok(rx.clone());
        }
        let rx = SharedRx::new(ctx, &self.pd, SHARED_DEPTH, buf_size, chunk_shift, reserve, false)?;
        open.push(rx.clone());
        Ok(rx)
    }
}
