//! Completion queues (`struct ibv_cq`) with an optional completion channel for event mode; on
//! request single-threaded ones (`ibv_create_cq_ex` with `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_cq_ex_to_cq, ibv_cq_init_attr_ex, ibv_cq_init_attr_mask,
    ibv_create_comp_channel, ibv_create_cq, ibv_create_cq_attr_flags, ibv_create_cq_wc_flags,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq, ibv_wc,
};

use super::async_events::set_nonblocking;
use super::context::IbvContext;
use super::convert::wc_from_ibv;
use super::errno::{from_rc, last_os, rc_error};
use super::post::POLL_CHUNK_WCS;
use crate::verbs::{CompletionQueue, Result, VerbsError, WcOpcode, WorkCompletion};

/// A completion queue. Cheap to clone (clones share the CQ); normally polled by one thread.
#[derive(Clone)]
pub struct IbvCompletionQueue {
    pub(super) inner: Arc<CqInner>,
}

pub(super) struct CqInner {
    pub(super) cq: NonNull<ibv_cq>,
    channel: Option<NonNull<ibv_comp_channel>>,
    cqe: u32,
    /// Set by the context's async event thread on `IBV_EVENT_CQ_ERR`; the CQ's `cq_context`
    /// points here, so it must live as long as the CQ (boxed, dropped after `ibv_destroy_cq`).
    overrun: Box<AtomicBool>,
    /// Remote QP number of each connected RC QP that receives on this CQ (local `qp_num` →
    /// `dest_qp_num`, kept by `qp.rs`). Some devices (rxe) leave `src_qp` 0 in RC receive
    /// completions — verbs defines it for UD only — while the verbs API promises it; the table
    /// fills it in. Read only for such completions, once per `poll` call, so NICs that report
    /// `src_qp` never touch the lock.
    pub(super) peers: RwLock<HashMap<u32, u32>>,
    /// The device is Soft-RoCE (see [`wc_from_ibv`]).
    soft_roce: bool,
    /// Created with `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (the provider may elide its lock).
    single_threaded: bool,
    /// Keeps the device open while the CQ exists.
    _ctx: IbvContext,
}

// SAFETY: libibverbs CQ verbs (poll, notify, get/ack events, destroy) are thread-safe; the Rust
// state is immutable or atomic.
unsafe impl Send for CqInner {}
// SAFETY: see `Send`.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an `Arc` to it, so none is left; every event we got
        // was acknowledged in `wait`, so destroy does not block; destroyed exactly once.
        let rc = unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %rc_error(rc), "ibv_destroy_cq failed");
        }
        if let Some(ch) = self.channel {
            // SAFETY: the only CQ on this channel is destroyed; destroyed exactly once.
            let rc = unsafe { ibv_destroy_comp_channel(ch.as_ptr()) };
            if rc != 0 {
                tracing::warn!(error = %rc_error(rc), "ibv_destroy_comp_channel failed");
            }
        }
    }
}

/// The `ibv_cq_init_attr_ex` of a single-threaded CQ: `cqe` entries, `cq_context` and `channel`
/// as for `ibv_create_cq`, comp vector 0, the standard completion fields, and the flag.
fn single_threaded_attr(
    cqe: u32,
    cq_context: *mut std::os::raw::c_void,
    channel: *mut ibv_comp_channel,
) -> ibv_cq_init_attr_ex {
    use ibv_create_cq_wc_flags as w;
    let wc_flags = w::IBV_WC_EX_WITH_BYTE_LEN
        | w::IBV_WC_EX_WITH_IMM
        | w::IBV_WC_EX_WITH_QP_NUM
        | w::IBV_WC_EX_WITH_SRC_QP
        | w::IBV_WC_EX_WITH_SLID
        | w::IBV_WC_EX_WITH_SL
        | w::IBV_WC_EX_WITH_DLID_PATH_BITS;
    ibv_cq_init_attr_ex {
        cqe,
        cq_context,
        channel,
        comp_vector: 0,
        wc_flags: u64::from(wc_flags.0),
        comp_mask: ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_FLAGS.0,
        flags: ibv_create_cq_attr_flags::IBV_CREATE_CQ_ATTR_SINGLE_THREADED.0,
        parent_domain: std::ptr::null_mut(),
    }
}

/// Whether a refused `ibv_create_cq_ex` (its errno) means "not supported here" (no such verb, or
/// the flag refused), so that a plain `ibv_create_cq` is the answer, rather than a real failure.
fn cq_ex_not_offered(errno: i32) -> bool {
    matches!(errno, 0 | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
}

/// How a CQ is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CqKind {
    /// `ibv_create_cq`.
    Plain,
    /// `ibv_create_cq_ex` with `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`, plain where refused.
    SingleThreaded,
}

impl IbvCompletionQueue {
    pub(super) fn create(ctx: &IbvContext, cqe: u32, with_events: bool) -> Result<IbvCompletionQueue> {
        Self::create_kind(ctx, cqe, with_events, CqKind::Plain)
    }

    /// See [`IbvContext::create_cq_single_threaded`], whose contract the caller keeps.
    pub(super) fn create_single_threaded(
        ctx: &IbvContext,
        cqe: u32,
        with_events: bool,
    ) -> Result<IbvCompletionQueue> {
        Self::create_kind(ctx, cqe, with_events, CqKind::SingleThreaded)
    }

    /// Whether this CQ was created single-threaded (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`
    /// accepted), which only [`IbvContext::create_cq_single_threaded`] asks for.
    pub fn is_single_threaded(&self) -> bool {
        self.inner.single_threaded
    }

    /// Creates the CQ with `ibv_create_cq_ex` and the single-threaded flag; `Ok(None)` when the
    /// device does not offer that (see [`cq_ex_not_offered`]).
    fn raw_create_single_threaded(
        ctx: &IbvContext,
        cqe: u32,
        cq_context: *mut std::os::raw::c_void,
        channel: *mut ibv_comp_channel,
    ) -> Result<Option<NonNull<ibv_cq>>> {
        let mut attr = single_threaded_attr(cqe, cq_context, channel);
        // Clear errno so that a NULL answer without one reads as "not offered".
        // SAFETY: `__errno_location` is this thread's errno.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: open context; `attr` is a live parameter whose `cq_context` and `channel` are
        // what `create_kind` passes to `ibv_create_cq` (see there).
        let cq = NonNull::new(unsafe { super::vctx::create_cq_ex(ctx.raw(), &mut attr) });
        match cq {
            // SAFETY: `ibv_cq_ex` starts with the `ibv_cq` fields (verbs.h `ibv_cq_ex_to_cq`);
            // the CQ is destroyed with `ibv_destroy_cq`, as verbs allows for extended CQs.
            Some(cq) => Ok(NonNull::new(unsafe { ibv_cq_ex_to_cq(cq.as_ptr()) })),
            None => {
                let err = std::io::Error::last_os_error();
                if cq_ex_not_offered(err.raw_os_error().unwrap_or(0)) {
                    tracing::debug!(
                        error = %err,
                        "ibv_create_cq_ex with IBV_CREATE_CQ_ATTR_SINGLE_THREADED refused: a plain CQ instead"
                    );
                    Ok(None)
                } else {
                    Err(VerbsError::Os { call: "ibv_create_cq_ex", source: err })
                }
            }
        }
    }

    fn create_kind(
        ctx: &IbvContext,
        cqe: u32,
        with_events: bool,
        kind: CqKind,
    ) -> Result<IbvCompletionQueue> {
        let max = ctx.inner.attr.max_cqe;
        if cqe > max {
            return Err(VerbsError::CapExceeded {
                what: "create_cq cqe",
                cap: "max_cqe",
                requested: cqe.into(),
                limit: max.into(),
            });
        }
        if cqe == 0 {
            return Err(VerbsError::InvalidArgument {
                call: "ibv_create_cq",
                reason: "cqe must be at least 1".into(),
            });
        }
        let channel = if with_events {
            // SAFETY: open context; the channel is owned by the CQ and destroyed after it.
            let ch = NonNull::new(unsafe { ibv_create_comp_channel(ctx.raw()) })
                .ok_or_else(|| last_os("ibv_create_comp_channel"))?;
            // SAFETY: `ch` is a live channel; `fd` is its event file descriptor.
            if let Err(e) = set_nonblocking(unsafe { (*ch.as_ptr()).fd }) {
                // SAFETY: created above, unused, destroyed once.
                unsafe { ibv_destroy_comp_channel(ch.as_ptr()) };
                return Err(e);
            }
            Some(ch)
        } else {
            None
        };
        let overrun = Box::new(AtomicBool::new(false));
        let cq_context = (&*overrun as *const AtomicBool).cast_mut().cast();
        let raw_channel = channel.map_or(std::ptr::null_mut(), NonNull::as_ptr);
        let single = match kind {
            CqKind::Plain => Ok(None),
            CqKind::SingleThreaded => Self::raw_create_single_threaded(ctx, cqe, cq_context, raw_channel),
        };
        let single_threaded = matches!(single, Ok(Some(_)));
        let cq = match single {
            Ok(Some(cq)) => Ok(cq),
            Ok(None) => {
                // SAFETY: open context; `cq_context` points at the boxed flag, which outlives the
                // CQ (see `CqInner`); `channel` is NULL or a live channel of this context.
                let cq = unsafe { ibv_create_cq(ctx.raw(), cqe as i32, cq_context, raw_channel, 0) };
                NonNull::new(cq).ok_or_else(|| last_os("ibv_create_cq"))
            }
            Err(e) => Err(e),
        };
        let cq = match cq {
            Ok(cq) => cq,
            Err(err) => {
                if let Some(ch) = channel {
                    // SAFETY: created above, no CQ on it, destroyed once.
                    unsafe { ibv_destroy_comp_channel(ch.as_ptr()) };
                }
                return Err(err);
            }
        };
        // SAFETY: `cq` is live; `cqe` is the actual capacity the provider set.
        let actual = u32::try_from(unsafe { (*cq.as_ptr()).cqe }).unwrap_or(cqe);
        Ok(IbvCompletionQueue {
            inner: Arc::new(CqInner {
                cq,
                channel,
                cqe: actual,
                overrun,
                peers: RwLock::default(),
                soft_roce: ctx.inner.soft_roce,
                single_threaded,
                _ctx: ctx.clone(),
            }),
        })
    }

    /// Fills `src_qp` of successful receive completions the device left at 0 (see `peers`).
    #[inline]
    fn fill_src_qp(&self, wc: &mut [WorkCompletion]) {
        let missing = |w: &WorkCompletion| {
            w.src_qp == 0
                && w.status.is_success()
                && matches!(w.opcode, WcOpcode::IBV_WC_RECV | WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM)
        };
        if !wc.iter().any(missing) {
            return;
        }
        let Ok(peers) = self.inner.peers.read() else { return };
        for w in wc.iter_mut().filter(|w| missing(w)) {
            if let Some(&dest) = peers.get(&w.qp_num) {
                w.src_qp = dest;
            }
        }
    }

    fn overrun_error(&self) -> VerbsError {
        VerbsError::CqOverrun { cqe: self.inner.cqe }
    }

    fn channel(&self, call: &'static str) -> Result<NonNull<ibv_comp_channel>> {
        self.inner.channel.ok_or_else(|| VerbsError::InvalidArgument {
            call,
            reason: "the CQ was created without events (create_cq(.., with_events: false))".into(),
        })
    }

    /// Takes one pending event from the channel, if any, and acknowledges it.
    fn take_event(&self, ch: NonNull<ibv_comp_channel>) -> Result<bool> {
        let mut ev_cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ev_ctx: *mut std::os::raw::c_void = std::ptr::null_mut();
        // SAFETY: live channel (nonblocking fd); live out-parameters.
        let rc = unsafe { ibv_get_cq_event(ch.as_ptr(), &mut ev_cq, &mut ev_ctx) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::WouldBlock {
                Ok(false)
            } else {
                Err(VerbsError::Os { call: "ibv_get_cq_event", source: e })
            };
        }
        // SAFETY: the channel serves this CQ only, so `ev_cq` is our live CQ; one event is acked.
        unsafe { ibv_ack_cq_events(ev_cq, 1) };
        Ok(true)
    }
}

impl CompletionQueue for IbvCompletionQueue {
    fn capacity(&self) -> u32 {
        self.inner.cqe
    }

    #[inline]
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        if self.inner.overrun.load(Ordering::Acquire) {
            return Err(self.overrun_error());
        }
        let mut buf: [MaybeUninit<ibv_wc>; POLL_CHUNK_WCS] =
            [const { MaybeUninit::uninit() }; POLL_CHUNK_WCS];
        let mut total = 0;
        while total < wc.len() {
            let want = (wc.len() - total).min(POLL_CHUNK_WCS);
            // SAFETY: live CQ; `buf` has room for `want` entries, which the provider writes.
            let n = unsafe { ibv_poll_cq(self.inner.cq.as_ptr(), want as i32, buf.as_mut_ptr().cast()) };
            if n < 0 {
                return Err(from_rc("ibv_poll_cq", n));
            }
            let n = n as usize;
            for (out, raw) in wc[total..total + n].iter_mut().zip(&buf[..n]) {
                // SAFETY: `ibv_poll_cq` initialised the first `n` entries.
                *out = wc_from_ibv(unsafe { raw.assume_init_ref() }, self.inner.soft_roce);
            }
            total += n;
            if n < want {
                break;
            }
        }
        self.fill_src_qp(&mut wc[..total]);
        Ok(total)
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.channel("ibv_req_notify_cq")?;
        // SAFETY: live CQ with a completion channel.
        let rc = unsafe { ibv_req_notify_cq(self.inner.cq.as_ptr(), i32::from(solicited_only)) };
        if rc != 0 {
            return Err(from_rc("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let ch = self.channel("ibv_get_cq_event")?;
        // SAFETY: live channel; `fd` is its event descriptor.
        let fd = unsafe { (*ch.as_ptr()).fd };
        // A timeout too large to add to the clock (`Duration::MAX`) waits forever.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if self.inner.overrun.load(Ordering::Acquire) {
                return Err(self.overrun_error());
            }
            if self.take_event(ch)? {
                return Ok(true);
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    // Round up so that a sub-millisecond timeout still waits.
                    i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
                }
            };
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(VerbsError::Os { call: "poll(completion channel)", source: e });
                }
            }
        }
    }
}

impl std::fmt::Debug for IbvCompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvCompletionQueue")
            .field("cqe", &self.inner.cqe)
            .field("events", &self.inner.channel.is_some())
            .field("single_threaded", &self.inner.single_threaded)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes of a single-threaded CQ carry the flag, and the mask bit that makes the
    /// provider read it.
    #[test]
    fn single_threaded_attr_asks_for_the_flag() {
        let mut flag = AtomicBool::new(false);
        let ctx = (&mut flag as *mut AtomicBool).cast();
        let a = single_threaded_attr(64, ctx, std::ptr::null_mut());
        assert_eq!(a.cqe, 64);
        assert_eq!(a.cq_context, ctx);
        assert!(a.channel.is_null());
        assert_eq!(
            a.flags & ibv_create_cq_attr_flags::IBV_CREATE_CQ_ATTR_SINGLE_THREADED.0,
            ibv_create_cq_attr_flags::IBV_CREATE_CQ_ATTR_SINGLE_THREADED.0,
            "the single-threaded flag"
        );
        assert_ne!(
            a.comp_mask & ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_FLAGS.0,
            0,
            "without IBV_CQ_INIT_ATTR_MASK_FLAGS the provider ignores `flags`"
        );
        assert_eq!(
            a.flags & ibv_create_cq_attr_flags::IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN.0,
            0,
            "overruns stay errors"
        );
        assert!(a.parent_domain.is_null());
        assert_eq!(a.wc_flags & u64::from(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM.0), 4);
    }

    /// Refusals that mean "not here" fall back to `ibv_create_cq`; real failures do not.
    #[test]
    fn cq_ex_fallback_decision() {
        for e in [0, libc::EOPNOTSUPP, libc::ENOTSUP, libc::ENOSYS, libc::EINVAL] {
            assert!(cq_ex_not_offered(e), "errno {e} falls back");
        }
        for e in [libc::ENOMEM, libc::EPERM, libc::EFAULT] {
            assert!(!cq_ex_not_offered(e), "errno {e} is an error");
        }
    }
}
