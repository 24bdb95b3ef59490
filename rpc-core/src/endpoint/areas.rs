//! [`SendAreas`]: a connection's send mirror and staging area, registered on first need (the
//! first body above the eager threshold it sends) and given back once unused for a while.
//!
//! Both are local memory the connection RDMA WRITEs ring bodies from: a mirror of the peer's
//! ring (bodies encoded at their ring offset) and a staging area of twice it (bodies waiting for
//! ring space). A connection that makes only small calls never touches them, so they are not
//! registered at connect: an idle server session holds its receive ring, send buffers and QP
//! only (3 MiB less per session at the default 1 MiB client ring).
//!
//! They are given back ([`SendAreas::release_idle`]) when the connection's ring producer has
//! not moved for the idle time, every body placed was WRITTEN and its WRITE retired by a polled
//! completion, the staging area holds nothing and the caller's outbox is empty; the
//! [`SendQueue`] has the last word ([`SendQueue::release_send_areas`]): memory is never
//! deregistered while a WR it posted may still read it.
//!
//! A per-worker pool of mirrors and staging areas shared by sessions (eRPC's way) would bound
//! the registered memory of a worker whatever its sessions do, and save the registration
//! (tens of microseconds per MiB on hardware) at a session's first ring body after an idle
//! spell; it needs a mirror that is not tied to one peer ring's offsets (encode at the staging
//! offset and WRITE to the ring offset, as staged bodies already do) and a policy for a
//! session that finds the pool empty (wait, or fall back to the heap). Not built here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::buffers::{MirrorView, RegisteredPool, SendMirror, SendQueue, SendStaging, Staged};
use crate::endpoint::counters::AreaGauge;
use crate::status::Status;
use crate::verbs::Provider;

/// A connection's send mirror and staging area, registered when first needed.
pub(crate) struct SendAreas<P: Provider> {
    /// The mirror and the staging area while registered.
    live: Option<(SendMirror<P>, SendStaging<P>)>,
    /// Their bytes charged to the server's cap while registered (given back when dropped).
    charge: Option<crate::session::Charge>,
    /// Where they are registered.
    pd: P::ProtectionDomain,
    /// The peer's ring length in bytes (the mirror's).
    mirror_len: u32,
    /// The staging area's length in bytes ([`crate::endpoint::conn::staging_len`]).
    staging_len: u32,
    /// Staged bodies the staging area keeps room for in its list without growing it.
    bodies: usize,
    gauge: Arc<AreaGauge>,
    /// The ring producer's mark at the last look ([`SendAreas::release_idle`]), and since when
    /// it has not moved (or since the areas were registered).
    seen_mark: u32,
    since: Instant,
    /// The registered user buffers of `pd` whose bytes ring WRITEs read in place
    /// ([`crate::buffers::RegisteredPool`]); `None`: every body is copied.
    registered: Option<Arc<RegisteredPool>>,
}

impl<P: Provider> SendAreas<P> {
    /// Nothing registered yet: a mirror of `peer_ring_len` bytes and a staging area of
    /// `staging_len(peer_ring_len)` bytes with room for `bodies` staged bodies are registered in
    /// `pd` when first needed, counted in `gauge`.
    pub(crate) fn new(
        pd: P::ProtectionDomain,
        peer_ring_len: u32,
        bodies: usize,
        gauge: Arc<AreaGauge>,
    ) -> SendAreas<P> {
        SendAreas {
            live: None,
            charge: None,
            pd,
            mirror_len: peer_ring_len,
            staging_len: crate::endpoint::conn::staging_len(peer_ring_len),
            bodies,
            gauge,
            seen_mark: 0,
            since: Instant::now(),
            registered: None,
        }
    }

    /// Sends bytes of `pool`'s buffers (registered in this connection's `pd`) with no copy.
    pub(crate) fn with_registered(mut self, pool: Arc<RegisteredPool>) -> SendAreas<P> {
        self.registered = Some(pool);
        self
    }

    /// The protection domain the areas (and the registered buffers) are registered in.
    pub(crate) fn pd(&self) -> &P::ProtectionDomain {
        &self.pd
    }

    /// The pool of registered user buffers ring WRITEs may read in place.
    #[inline]
    pub(crate) fn registered(&self) -> Option<&Arc<RegisteredPool>> {
        self.registered.as_ref()
    }

    /// Bytes the mirror and the staging area register together.
    pub(crate) fn bytes(&self) -> u64 {
        u64::from(self.mirror_len) + u64::from(self.staging_len)
    }

    /// Whether they are registered now.
    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// The staging area's length in bytes, registered or not: a body up to this long can wait
    /// there.
    #[inline]
    pub(crate) fn staging_len(&self) -> u32 {
        self.staging_len
    }

    /// Registers the mirror and the staging area unless they are.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming what failed to register and why (`ulimit -l`, the device's MR
    /// limits), or the server's `ServerConfig::max_send_area_bytes` they would exceed; nothing
    /// is kept then, and the next call tries again.
    #[cold]
    #[inline(never)]
    pub(crate) fn ensure(&mut self) -> Result<(), Status> {
        if self.live.is_some() {
            return Ok(());
        }
        let charge = match self.gauge.charge(self.bytes()) {
            Ok(c) => c,
            Err(reason) => {
                self.gauge.failed();
                let s = Status::resource_exhausted(format!(
                    "no send mirror and staging area for a body above the eager threshold: {reason}"
                ));
                tracing::warn!(status = %s, "no send mirror and staging area for a ring body");
                return Err(s);
            }
        };
        let fail = |what: &str, len: u32, e: crate::verbs::VerbsError| {
            Status::resource_exhausted(format!(
                "registering this connection's {what} ({len} bytes) for a body above the eager \
                 threshold failed: {e}"
            ))
        };
        let made = SendMirror::<P>::new(&self.pd, self.mirror_len as usize)
            .map_err(|e| fail("send mirror", self.mirror_len, e))
            .and_then(|m| {
                SendStaging::<P>::new(&self.pd, self.staging_len, self.bodies)
                    .map(|s| (m, s))
                    .map_err(|e| fail("send staging area", self.staging_len, e))
            });
        match made {
            Ok(pair) => {
                self.live = Some(pair);
                self.charge = charge;
                self.since = Instant::now();
                self.gauge.created(self.bytes());
                Ok(())
            }
            Err(s) => {
                self.gauge.failed();
                tracing::warn!(status = %s, "no send mirror and staging area for a ring body");
                Err(s)
            }
        }
    }

    /// The mirror, when registered.
    #[inline]
    pub(crate) fn mirror(&self) -> Option<&SendMirror<P>> {
        self.live.as_ref().map(|l| &l.0)
    }

    /// The mirror, when registered.
    #[inline]
    pub(crate) fn mirror_mut(&mut self) -> Option<&mut SendMirror<P>> {
        self.live.as_mut().map(|l| &mut l.0)
    }

    /// The staging area, when registered.
    #[inline]
    pub(crate) fn staging(&self) -> Option<&SendStaging<P>> {
        self.live.as_ref().map(|l| &l.1)
    }

    /// The staging area, when registered.
    #[inline]
    pub(crate) fn staging_mut(&mut self) -> Option<&mut SendStaging<P>> {
        self.live.as_mut().map(|l| &mut l.1)
    }

    /// What a reply writer encodes into: a view of the mirror, and the staging area's free span
    /// (`spare`) or an empty one; the view of no mirror and an empty span while none is
    /// registered (a body above the eager threshold then waits unencoded and registers them,
    /// [`crate::dispatch::reply::encode_body`]).
    #[inline]
    pub(crate) fn views(&mut self, spare: bool) -> (MirrorView<'_>, u32, &mut [u8]) {
        match &mut self.live {
            Some((m, s)) => {
                let (at, bytes) = if spare { s.spare_mut() } else { (0, &mut [][..]) };
                (m.view(), at, bytes)
            }
            None => (MirrorView::empty(), 0, &mut [][..]),
        }
    }

    /// Gives back a staged body that will not be sent.
    pub(crate) fn release_staged(&mut self, staged: Staged) {
        if let Some(s) = self.staging_mut() {
            s.release(staged);
        }
    }

    /// Looks at the areas at `now` (from the idle sweep): the ring producer's `mark` moved since
    /// the last look means a ring body was placed (they are in use). Gives them back (true) when
    /// they are registered, the mark has not moved for `idle`, `quiet` (the caller: nothing
    /// waits in its outbox, every placed body was WRITTEN and retired) and `sq` proves no WR
    /// reads them ([`SendQueue::release_send_areas`]).
    pub(crate) fn release_idle(
        &mut self,
        sq: &mut SendQueue,
        mark: u32,
        now: Instant,
        idle: Duration,
        quiet: bool,
    ) -> bool {
        if mark != self.seen_mark {
            self.seen_mark = mark;
            self.since = now;
            return false;
        }
        if !quiet || now.saturating_duration_since(self.since) < idle {
            return false;
        }
        let Some((mirror, staging)) = self.live.take() else { return false };
        match sq.release_send_areas(mirror, staging) {
            Ok(()) => {
                self.charge = None;
                self.gauge.gone(self.bytes(), true);
                true
            }
            Err(pair) => {
                self.live = Some(pair);
                false
            }
        }
    }
}

impl<P: Provider> Drop for SendAreas<P> {
    fn drop(&mut self) {
        if self.live.is_some() {
            self.gauge.gone(self.bytes(), false);
        }
    }
}
