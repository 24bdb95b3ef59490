//! The per-context thread that reads asynchronous events (`ibv_get_async_event`).
//!
//! It blocks in poll(2) on the context's async fd and an eventfd used to stop it, so it costs
//! nothing while the device is quiet. `IBV_EVENT_CQ_ERR` marks the CQ as overrun (its
//! `cq_context` points at the CQ's flag, see `cq.rs`); a QP error event marks the QP's cached
//! state ERR (its `qp_context` points at it, see `qp.rs`); errors are logged.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::thread::JoinHandle;

use rdma_sys::{ibv_ack_async_event, ibv_async_event, ibv_context, ibv_cq, ibv_get_async_event, ibv_qp};

use super::convert::qp_state_code;
use super::errno::last_os;
use crate::verbs::{QpState, Result};

/// `struct ibv_async_event` read with a plain integer event type: the kernel may report event
/// types newer than rdma-sys' Rust enum knows, and an unknown value in a Rust enum is UB.
#[repr(C)]
struct RawAsyncEvent {
    /// The union `element` (cq, qp, srq, wq pointer or port number).
    element: *mut c_void,
    /// `enum ibv_event_type`.
    event_type: u32,
}

const _: () = assert!(std::mem::size_of::<RawAsyncEvent>() == std::mem::size_of::<ibv_async_event>());

/// A context pointer that may move to the event thread.
struct SendContext(*mut ibv_context);
// SAFETY: libibverbs calls on a context are thread-safe; the thread stops (joined in
// `AsyncEvents::drop`) before the owner closes the context.
unsafe impl Send for SendContext {}

/// The running event thread of one context. Dropping it stops and joins the thread; the owner
/// must drop it before `ibv_close_device`.
pub(super) struct AsyncEvents {
    stop_fd: i32,
    thread: Option<JoinHandle<()>>,
}

impl AsyncEvents {
    /// Starts the thread for `ctx` (device `name`, for logs and the thread name).
    ///
    /// # Safety
    /// `ctx` must be an open context that stays open until the returned value is dropped.
    pub(super) unsafe fn start(ctx: *mut ibv_context, name: &str) -> Result<AsyncEvents> {
        // SAFETY: plain syscall; the fd is owned by the returned value and closed in drop.
        let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop_fd < 0 {
            return Err(last_os("eventfd"));
        }
        // SAFETY: `ctx` is open (caller's contract); `async_fd` is a field libibverbs set at open.
        let async_fd = unsafe { (*ctx).async_fd };
        set_nonblocking(async_fd)?;
        let sc = SendContext(ctx);
        let dev = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("ibv-async-{name}"))
            .spawn(move || {
                let sc = sc;
                run(sc.0, async_fd, stop_fd, &dev)
            })
            .map_err(|e| crate::verbs::VerbsError::Os { call: "spawn async event thread", source: e });
        match thread {
            Ok(t) => Ok(AsyncEvents { stop_fd, thread: Some(t) }),
            Err(e) => {
                // SAFETY: our fd, not shared with anyone (the thread did not start).
                unsafe { libc::close(stop_fd) };
                Err(e)
            }
        }
    }
}

impl Drop for AsyncEvents {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.stop_fd, (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: our fd; the thread that polled it has exited.
        unsafe { libc::close(self.stop_fd) };
    }
}

/// Sets O_NONBLOCK on `fd`.
pub(super) fn set_nonblocking(fd: i32) -> Result<()> {
    // SAFETY: fcntl on an fd we were given; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(last_os("fcntl(O_NONBLOCK)"));
    }
    Ok(())
}

fn run(ctx: *mut ibv_context, async_fd: i32, stop_fd: i32, dev: &str) {
    loop {
        let mut fds = [
            libc::pollfd { fd: async_fd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop_fd, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `fds` is a live array of 2 pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!(device = dev, error = %e, "async event thread: poll failed, stopping");
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            tracing::warn!(device = dev, "async event fd closed, stopping");
            return;
        }
        loop {
            let mut ev = RawAsyncEvent { element: std::ptr::null_mut(), event_type: 0 };
            // SAFETY: `ctx` is open until this thread is joined; `ev` has the layout of
            // `struct ibv_async_event` (checked above) and lives across the call.
            let rc = unsafe { ibv_get_async_event(ctx, (&mut ev as *mut RawAsyncEvent).cast()) };
            if rc != 0 {
                break; // EAGAIN: drained
            }
            handle(&ev, dev);
            // SAFETY: acknowledges the event we just got, exactly once; the element it names is
            // not touched afterwards (destroy calls wait for this ack).
            unsafe { ibv_ack_async_event((&mut ev as *mut RawAsyncEvent).cast()) };
        }
    }
}

fn handle(ev: &RawAsyncEvent, dev: &str) {
    const CQ_ERR: u32 = 0;
    const QP_FATAL: u32 = 1;
    const QP_REQ_ERR: u32 = 2;
    const QP_ACCESS_ERR: u32 = 3;
    const DEVICE_FATAL: u32 = 8;
    const PORT_ACTIVE: u32 = 9;
    const PORT_ERR: u32 = 10;
    const SRQ_ERR: u32 = 14;
    const SRQ_LIMIT_REACHED: u32 = 15;
    const QP_LAST_WQE_REACHED: u32 = 16;
    const GID_CHANGE: u32 = 18;
    match ev.event_type {
        CQ_ERR => {
            let cq = ev.element.cast::<ibv_cq>();
            // SAFETY: for CQ events the element is the CQ, alive until we ack the event (its
            // destroy waits for that); every CQ of this context was created by `cq.rs` with
            // `cq_context` pointing at its overrun flag, which lives as long as the CQ.
            let flag = unsafe { (*cq).cq_context }.cast::<AtomicBool>();
            if !flag.is_null() {
                // SAFETY: see above: a live AtomicBool owned by the CQ's inner state.
                unsafe { (*flag).store(true, Ordering::Release) };
            }
            tracing::error!(
                device = dev,
                "IBV_EVENT_CQ_ERR: completion queue overrun, completions were lost"
            );
        }
        QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR | QP_LAST_WQE_REACHED => {
            let qp = ev.element.cast::<ibv_qp>();
            // SAFETY: for QP events the element is the QP, alive until we ack the event.
            let (qp_num, state) = unsafe { ((*qp).qp_num, (*qp).qp_context.cast::<AtomicU8>()) };
            if ev.event_type == QP_LAST_WQE_REACHED {
                tracing::debug!(device = dev, qp_num, "IBV_EVENT_QP_LAST_WQE_REACHED");
            } else {
                if !state.is_null() {
                    // SAFETY: QPs of this context are created by `qp.rs` with `qp_context` pointing
                    // at their boxed state cache, which lives as long as the QP (whose destroy
                    // waits for this event's ack).
                    unsafe { (*state).store(qp_state_code(QpState::Err), Ordering::Release) };
                }
                tracing::warn!(
                    device = dev,
                    qp_num,
                    event = ev.event_type,
                    "QP error event: the QP moved to ERR"
                );
            }
        }
        SRQ_ERR => tracing::error!(device = dev, "IBV_EVENT_SRQ_ERR"),
        SRQ_LIMIT_REACHED => tracing::debug!(device = dev, "IBV_EVENT_SRQ_LIMIT_REACHED"),
        DEVICE_FATAL => tracing::error!(device = dev, "IBV_EVENT_DEVICE_FATAL: the device is unusable"),
        PORT_ACTIVE => tracing::info!(device = dev, port = ev.element as usize as u32, "port active"),
        PORT_ERR => tracing::warn!(device = dev, port = ev.element as usize as u32, "port error (link down)"),
        GID_CHANGE => tracing::info!(device = dev, port = ev.element as usize as u32, "GID table changed"),
        other => tracing::debug!(device = dev, event = other, "async event"),
    }
}
