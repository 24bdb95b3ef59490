//! Thread domains (`struct ibv_td`) and parent domains: lock elision for QPs where the device
//! offers it, the plain path where it does not.
//!
//! # What a thread domain buys
//! A QP created on a parent domain that carries a TD (`ibv_alloc_td` + `ibv_alloc_parent_domain`)
//! tells the provider that its user serializes access itself: mlx5 then drops the spinlocks of
//! the QP's send and receive queues and gives the TD a dedicated doorbell register (UAR) that its
//! QPs ring without a lock. Devices without TDs (Soft-RoCE among them: rxe's `alloc_td` is the
//! library's stub that answers `EOPNOTSUPP`) keep the plain path: QPs on the plain PD, the
//! provider's locks in place. The verbs are reached through the context's `verbs_context`
//! entries ([`super::vctx`]), not rdma-sys' wrappers, which never find them.
//!
//! # What we promise in exchange: [`PostLock`]
//! Our QPs are not always posted by one thread: a `Channel`'s callers and its dispatcher take
//! turns posting on one QP under their own lock, and the server's listener posts (and creates and
//! destroys QPs) next to the worker that owns them. So the elided provider locks are replaced by
//! one of ours: every post (`ibv_post_send`, `ibv_post_recv`) on a TD-backed QP holds the TD's
//! [`PostLock`]. It is per TD, not per QP, because the TD's doorbell register is shared by all QPs
//! of that TD. A PD has its own TD, and the runtime gives each worker or connection its own PD,
//! so the lock is normally taken by one thread only: uncontended it costs one atomic swap and one
//! store, in place of the provider's lock and unlock per queue. That is a reasoned
//! cost, not a measured one: there is no NIC with thread domains here to time it on.
//!
//! MRs, MWs and SRQs stay on the plain PD (the parent domain shares its protection, so QPs on it
//! use them as their own); only QPs are created on the parent domain. The SRQ keeps its provider
//! lock: receives are reposted from more than one thread.
//!
//! # Ownership
//! A QP holds its [`ParentDomain`], which holds its [`ThreadDomain`] and the plain PD, which
//! holds the context: destruction runs QP → parent domain → TD → PD → context by construction,
//! whatever order the handles are dropped in.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdma_sys::{ibv_alloc_pd, ibv_context, ibv_dealloc_pd, ibv_pd, ibv_td, ibv_td_init_attr};

use super::context::IbvContext;
use super::errno::rc_error;
use super::pd::PdInner;
use super::vctx;

/// What an opened context got for lock elision: see
/// [`IbvContext::lock_elision`](super::IbvContext::lock_elision).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockElision {
    /// The device offers thread domains: each PD gets a TD and a parent domain, its QPs are
    /// created on the parent domain (provider QP locks elided, posts serialized by a lock of
    /// ours per TD). `false`: QPs are created on the plain PD, with the provider's locks.
    pub thread_domain: bool,
}

impl LockElision {
    /// Neither thread domains nor anything else: the plain path.
    pub const PLAIN: LockElision = LockElision { thread_domain: false };
}

/// What an allocation call (`ibv_alloc_td`, `ibv_alloc_parent_domain`) answered.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Offer {
    /// It allocated the object.
    Offered,
    /// The provider does not have the verb (`EOPNOTSUPP`, `ENOSYS`, or NULL without an errno):
    /// the plain path, quietly.
    NotOffered,
    /// The provider has the verb but it failed (`ENOMEM`: out of doorbell registers, ...): the
    /// plain path too, with a warning.
    Failed(i32),
}

/// The decision behind the fallback: `allocated` is whether the call returned an object, `errno`
/// the error it set otherwise (0 when it set none).
pub(super) fn offer_from(allocated: bool, errno: i32) -> Offer {
    if allocated {
        return Offer::Offered;
    }
    match errno {
        // EOPNOTSUPP is libibverbs' answer for a provider without the verb (and equals ENOTSUP on
        // Linux); ENOSYS is what some older providers set.
        0 | libc::EOPNOTSUPP | libc::ENOSYS => Offer::NotOffered,
        e => Offer::Failed(e),
    }
}

/// The errno the last failed call left (0 when none).
fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The lock that stands in for the provider locks a thread domain elides: every post on a QP of
/// the TD holds it (see the module documentation).
///
/// An `AtomicBool`: [`lock`](Self::lock) is one `swap(true, Acquire)` when nobody holds it, the
/// guard's drop one `store(false, Release)`, so the provider's work under it (writing WQEs, the
/// doorbell record, the doorbell register) happens-before the next holder's. Contended (two
/// threads posting on QPs of one TD at once, which the runtime avoids but does not forbid), it
/// spins briefly and then yields: a post holds it for well under a microsecond, and the test
/// machines have fewer cores than threads.
#[derive(Debug, Default)]
pub(super) struct PostLock {
    locked: AtomicBool,
}

/// Holds a [`PostLock`]; releases it when dropped.
#[derive(Debug)]
#[must_use = "the lock is released when the guard is dropped"]
pub(super) struct PostGuard<'a> {
    lock: &'a PostLock,
}

impl PostLock {
    /// Spins before the first `yield_now` when the lock is contended.
    const SPINS: u32 = 64;

    pub(super) const fn new() -> PostLock {
        PostLock { locked: AtomicBool::new(false) }
    }

    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub(super) fn lock(&self) -> PostGuard<'_> {
        if self.locked.swap(true, Ordering::Acquire) {
            self.lock_contended();
        }
        PostGuard { lock: self }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            // Wait on a plain load (no cache-line ping-pong), then try again.
            while self.locked.load(Ordering::Relaxed) {
                if spins < Self::SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if !self.locked.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }

    /// Takes the lock if nobody holds it.
    #[cfg(test)]
    pub(super) fn try_lock(&self) -> Option<PostGuard<'_>> {
        (!self.locked.swap(true, Ordering::Acquire)).then_some(PostGuard { lock: self })
    }
}

impl Drop for PostGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// Runs `post` (one `ibv_post_*` chain on a QP) holding the post lock of the QP's TD, if the QP
/// has one. The QP's post paths go through here.
#[inline]
pub(super) fn posting<D: Domains, R>(domain: Option<&ParentDomain<D>>, post: impl FnOnce() -> R) -> R {
    let _guard = domain.map(|d| d.td.post_lock.lock());
    post()
}

/// A verbs object freed by one call; the handle types of [`Domains`].
pub(super) trait Dealloc: Send + Sync {
    /// The C call that frees it, for the warning when it fails.
    const CALL: &'static str;
    /// Frees the object; 0 or an errno (as `ibv_dealloc_*` answer).
    fn dealloc(&mut self) -> i32;
}

/// The types thread and parent domains are made of: libibverbs' in the library ([`Ibv`]), fakes
/// that record their destruction in the tests (the ownership is the same code).
pub(super) trait Domains {
    /// A thread domain handle.
    type Td: Dealloc;
    /// A parent domain handle.
    type Parent: Dealloc;
    /// What keeps the device open while a TD exists.
    type Context: Send + Sync;
    /// What keeps the plain PD allocated while a parent domain on it exists.
    type Pd: Send + Sync;
}

/// libibverbs' thread and parent domains.
#[derive(Debug)]
pub(super) enum Ibv {}

impl Domains for Ibv {
    type Td = RawTd;
    type Parent = RawParent;
    type Context = IbvContext;
    type Pd = Arc<PdInner>;
}

/// An `ibv_td` we allocated.
#[derive(Debug)]
pub(super) struct RawTd(NonNull<ibv_td>);

// SAFETY: the handle is only passed to `ibv_dealloc_td` (once, in drop) and used to allocate a
// parent domain; libibverbs lets both run on any thread.
unsafe impl Send for RawTd {}
// SAFETY: see `Send`; `&RawTd` gives no access to the pointer outside this module.
unsafe impl Sync for RawTd {}

impl Dealloc for RawTd {
    const CALL: &'static str = "ibv_dealloc_td";
    fn dealloc(&mut self) -> i32 {
        // SAFETY: allocated by `ibv_alloc_td`, freed once (the owner's drop); every parent domain
        // on it holds an `Arc` to its `ThreadDomain`, so none is left.
        unsafe { vctx::dealloc_td(self.0.as_ptr()) }
    }
}

/// An `ibv_pd` that is a parent domain we allocated.
#[derive(Debug)]
pub(super) struct RawParent(NonNull<ibv_pd>);

// SAFETY: the handle is passed to `ibv_create_qp`/`ibv_dealloc_pd` only, which libibverbs lets
// run on any thread.
unsafe impl Send for RawParent {}
// SAFETY: see `Send`.
unsafe impl Sync for RawParent {}

impl Dealloc for RawParent {
    const CALL: &'static str = "ibv_dealloc_pd(parent domain)";
    fn dealloc(&mut self) -> i32 {
        // SAFETY: allocated by `ibv_alloc_parent_domain`, freed once (the owner's drop); every QP
        // on it holds an `Arc` to its `ParentDomain`, so none is left.
        unsafe { ibv_dealloc_pd(self.0.as_ptr()) }
    }
}

/// A thread domain and the lock its QPs post under. Holds the context open.
pub(super) struct ThreadDomain<D: Domains = Ibv> {
    td: D::Td,
    /// Serializes posts on every QP of this TD (see the module documentation).
    pub(super) post_lock: PostLock,
    _ctx: D::Context,
}

impl<D: Domains> ThreadDomain<D> {
    pub(super) fn new(td: D::Td, ctx: D::Context) -> ThreadDomain<D> {
        ThreadDomain { td, post_lock: PostLock::new(), _ctx: ctx }
    }
}

impl<D: Domains> Drop for ThreadDomain<D> {
    fn drop(&mut self) {
        let rc = self.td.dealloc();
        if rc != 0 {
            tracing::warn!(error = %rc_error(rc), call = D::Td::CALL, "freeing a thread domain failed");
        }
    }
}

/// A parent domain: the plain PD's protection with a TD's threading. QPs are created on it and
/// hold it (`Arc`); it holds its TD and the plain PD.
pub(super) struct ParentDomain<D: Domains = Ibv> {
    parent: D::Parent,
    pub(super) td: Arc<ThreadDomain<D>>,
    _pd: D::Pd,
}

impl<D: Domains> ParentDomain<D> {
    pub(super) fn new(parent: D::Parent, td: Arc<ThreadDomain<D>>, pd: D::Pd) -> ParentDomain<D> {
        ParentDomain { parent, td, _pd: pd }
    }
}

impl ParentDomain<Ibv> {
    /// The `ibv_pd` to create QPs on.
    pub(super) fn raw(&self) -> *mut ibv_pd {
        self.parent.0.as_ptr()
    }
}

impl<D: Domains> Drop for ParentDomain<D> {
    fn drop(&mut self) {
        let rc = self.parent.dealloc();
        if rc != 0 {
            tracing::warn!(error = %rc_error(rc), call = D::Parent::CALL, "freeing a parent domain failed");
        }
    }
}

/// Allocates a TD (`ibv_alloc_td`) on `ctx`.
fn alloc_td(ctx: *mut ibv_context) -> (Option<NonNull<ibv_td>>, Offer) {
    let mut attr = ibv_td_init_attr { comp_mask: 0 };
    // Clear errno so that a NULL answer without one reads as "not offered".
    // SAFETY: `__errno_location` is this thread's errno.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: `ctx` is an open context (callers); `attr` is a live parameter.
    let td = NonNull::new(unsafe { vctx::alloc_td(ctx, &mut attr) });
    let offer = offer_from(td.is_some(), errno());
    (td, offer)
}

/// Allocates a parent domain on `pd` with `td` (`ibv_alloc_parent_domain`).
fn alloc_parent(ctx: *mut ibv_context, pd: *mut ibv_pd, td: *mut ibv_td) -> (Option<NonNull<ibv_pd>>, Offer) {
    // SAFETY: plain C data (pointers, a mask, optional callbacks); all-zero is valid: no custom
    // allocator, no `pd_context`.
    let mut attr: rdma_sys::ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
    attr.pd = pd;
    attr.td = td;
    // SAFETY: as in `alloc_td`.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: open context; `pd` and `td` are live objects of it (callers); `attr` is live.
    let parent = NonNull::new(unsafe { vctx::alloc_parent_domain(ctx, &mut attr) });
    let offer = offer_from(parent.is_some(), errno());
    (parent, offer)
}

/// Whether the device behind `ctx` offers thread domains, found by allocating a PD, a TD and a
/// parent domain on them, and freeing them again (at open, before anything else exists).
///
/// # Safety
/// `ctx` must be an open context.
pub(super) unsafe fn probe(ctx: *mut ibv_context, device: &str) -> LockElision {
    let (td, offer) = alloc_td(ctx);
    let Some(td) = td else {
        if let Offer::Failed(e) = offer {
            tracing::warn!(device, error = %io::Error::from_raw_os_error(e), "ibv_alloc_td failed; QPs use the plain PD");
        }
        return LockElision::PLAIN;
    };
    // SAFETY: open context (caller).
    let pd = unsafe { ibv_alloc_pd(ctx) };
    let mut got = false;
    if !pd.is_null() {
        let (parent, offer) = alloc_parent(ctx, pd, td.as_ptr());
        if let Some(parent) = parent {
            got = true;
            // SAFETY: allocated just above, nothing on it, freed once.
            unsafe { ibv_dealloc_pd(parent.as_ptr()) };
        } else if let Offer::Failed(e) = offer {
            tracing::warn!(device, error = %io::Error::from_raw_os_error(e), "ibv_alloc_parent_domain failed; QPs use the plain PD");
        }
        // SAFETY: allocated above; its parent domain is freed; freed once.
        unsafe { ibv_dealloc_pd(pd) };
    }
    // SAFETY: allocated above; its parent domain is freed; freed once.
    unsafe { vctx::dealloc_td(td.as_ptr()) };
    LockElision { thread_domain: got }
}

/// The parent domain a new PD's QPs are created on: a fresh TD and a parent domain on `pd` with
/// it, when the context offers thread domains; `None` (QPs on the plain PD) when it does not or
/// when the allocation fails, with a `debug!` or `warn!` line saying why.
pub(super) fn alloc_qp_domain(ctx: &IbvContext, pd: &Arc<PdInner>) -> Option<Arc<ParentDomain>> {
    let device = crate::verbs::Context::device_name(ctx);
    if !ctx.lock_elision().thread_domain {
        tracing::debug!(
            device,
            "no thread domain on this device: QPs use the plain PD, with the provider's locks"
        );
        return None;
    }
    let fallback = |call: &str, offer: Offer| {
        match offer {
            Offer::Failed(e) => tracing::warn!(
                device,
                call,
                error = %io::Error::from_raw_os_error(e),
                "allocating a thread domain failed: QPs use the plain PD, with the provider's locks"
            ),
            _ => tracing::debug!(device, call, "thread domain not offered: QPs use the plain PD"),
        }
        None
    };
    let (td, offer) = alloc_td(ctx.raw());
    let Some(td) = td else { return fallback("ibv_alloc_td", offer) };
    let td: Arc<ThreadDomain> = Arc::new(ThreadDomain::new(RawTd(td), ctx.clone()));
    let (parent, offer) = alloc_parent(ctx.raw(), pd.pd.as_ptr(), td.td.0.as_ptr());
    // On failure `td` is dropped here, which frees it.
    let Some(parent) = parent else { return fallback("ibv_alloc_parent_domain", offer) };
    tracing::debug!(device, "PD with a thread domain: QPs on its parent domain");
    Some(Arc::new(ParentDomain::new(RawParent(parent), td, pd.clone())))
}

#[cfg(test)]
#[path = "td_tests.rs"]
mod tests;
