//! An open device (`struct ibv_context`): capabilities, ports, GID table, and the factory of PDs
//! and CQs.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use rdma_sys::{
    ___ibv_query_port, ibv_alloc_pd, ibv_close_device, ibv_context, ibv_device_attr, ibv_gid,
    ibv_open_device, ibv_port_attr, ibv_query_device, ibv_query_gid,
};

use super::async_events::AsyncEvents;
use super::convert::{link_layer_from_ibv, mtu_from_ibv, port_state_from_ibv};
use super::cq::IbvCompletionQueue;
use super::device::{device_name, DeviceList};
use super::errno::{from_rc, last_os};
use super::pd::IbvProtectionDomain;
use super::td::{self, LockElision};
use super::Ibverbs;
use crate::verbs::{
    Context, DeviceAttr, DeviceSelector, Gid, GidEntry, GidType, LinkLayer, PortAttr, Result, VerbsError,
};

/// An open libibverbs device. Cheap to clone: clones share the context, which is closed when the
/// last clone and the last object created from it are gone.
#[derive(Clone)]
pub struct IbvContext {
    pub(super) inner: Arc<ContextInner>,
}

pub(super) struct ContextInner {
    /// Stopped (joined) before the device is closed.
    events: Option<AsyncEvents>,
    pub(super) ctx: NonNull<ibv_context>,
    name: String,
    /// `/sys/class/infiniband/<name>`, for the GID types.
    sysfs: PathBuf,
    pub(super) attr: DeviceAttr,
    /// The largest `max_inline_data` a QP of this device was seen to accept, learned by probing
    /// after a refusal (`u32::MAX` = not known yet).
    pub(super) max_inline: AtomicU32,
    /// Soft-RoCE (`rdma_rxe`, vendor id 0xffffff), whose completions need the fix-ups of
    /// [`super::convert::wc_from_ibv`].
    pub(super) soft_roce: bool,
    /// Whether PDs of this context get a thread domain for their QPs (probed at open).
    lock_elision: LockElision,
}

// SAFETY: libibverbs contexts may be used from any thread concurrently (the library is
// thread-safe); the only mutable Rust state is atomic, and the event thread is joined in drop.
unsafe impl Send for ContextInner {}
// SAFETY: see `Send`.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        drop(self.events.take());
        // SAFETY: every object created from this context holds an `Arc` to it, so none is
        // left; the event thread has been joined; the context is closed exactly once.
        let rc = unsafe { ibv_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.name, error = %super::errno::rc_error(rc), "ibv_close_device failed");
        }
    }
}

impl std::fmt::Debug for IbvContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvContext").field("device", &self.inner.name).finish()
    }
}

impl IbvContext {
    /// Opens the device `selector` names (`ibv_open_device`), queries its capabilities and starts
    /// its async event thread.
    ///
    /// # Errors
    /// [`VerbsError::NoKernelSupport`] without RDMA in the kernel, [`VerbsError::NoDevice`] when
    /// nothing matches (listing what exists), [`VerbsError::Os`] when opening or querying fails.
    pub fn open(selector: &DeviceSelector) -> Result<IbvContext> {
        let list = DeviceList::get()?;
        let (index, dev) = list.select(selector)?;
        let name = device_name(dev);
        // SAFETY: `dev` is a live entry of `list`; `ibdev_path` is a NUL-terminated array in it.
        let sysfs = unsafe { CStr::from_ptr((*dev).ibdev_path.as_ptr()) }.to_string_lossy().into_owned();
        // SAFETY: `dev` is live; the returned context outlives the list (man ibv_open_device).
        let ctx = NonNull::new(unsafe { ibv_open_device(dev) }).ok_or_else(|| last_os("ibv_open_device"))?;
        let close = |e: VerbsError| {
            // SAFETY: opened above, not shared yet, closed once on this error path.
            unsafe { ibv_close_device(ctx.as_ptr()) };
            e
        };
        // SAFETY: `ibv_device_attr` is plain C data; all-zero is a valid value.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open and `a` a live out-parameter of the right type.
        let rc = unsafe { ibv_query_device(ctx.as_ptr(), &mut a) };
        if rc != 0 {
            return Err(close(from_rc("ibv_query_device", rc)));
        }
        let nonneg = |v: i32| u32::try_from(v).unwrap_or(0);
        let soft_roce = a.vendor_id == 0x00ff_ffff;
        let attr = DeviceAttr {
            max_qp_wr: nonneg(a.max_qp_wr),
            max_sge: nonneg(a.max_sge),
            max_cqe: nonneg(a.max_cqe),
            max_srq_wr: nonneg(a.max_srq_wr),
            max_srq_sge: nonneg(a.max_srq_sge),
            max_qp: nonneg(a.max_qp),
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: nonneg(a.max_qp_rd_atom),
            max_inline_data: 0,
            phys_port_cnt: a.phys_port_cnt,
            max_mw: nonneg(a.max_mw),
            mw_type2: a.device_cap_flags
                & (rdma_sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
                    | rdma_sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0)
                != 0,
        };
        // SAFETY: `ctx` is open; the probe frees what it allocates.
        let lock_elision = unsafe { td::probe(ctx.as_ptr(), &name) };
        // SAFETY: `ctx` stays open until `ContextInner::drop`, which drops the events first.
        let events = unsafe { AsyncEvents::start(ctx.as_ptr(), &name) }.map_err(close)?;
        tracing::debug!(device = %name, index, ?attr, "opened RDMA device");
        if lock_elision.thread_domain {
            tracing::info!(
                device = %name,
                thread_domain = true,
                "lock elision: QPs on a thread domain per PD (provider QP locks elided; posts take one lock of ours per TD)"
            );
        } else {
            tracing::info!(
                device = %name,
                thread_domain = false,
                "lock elision: none (the device offers no thread domain); QPs on the plain PD with the provider's locks"
            );
        }
        Ok(IbvContext {
            inner: Arc::new(ContextInner {
                events: Some(events),
                ctx,
                name,
                sysfs: PathBuf::from(sysfs),
                attr,
                max_inline: AtomicU32::new(u32::MAX),
                soft_roce,
                lock_elision,
            }),
        })
    }

    /// What this context got for lock elision: whether the device offers thread domains, so that
    /// each PD's QPs are created on a parent domain with a TD (see the `td` module of this
    /// provider). Probed once at open and logged there (one `info` line per opened context).
    pub fn lock_elision(&self) -> LockElision {
        self.inner.lock_elision
    }

    /// Creates a CQ with `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (`ibv_create_cq_ex`), which lets the
    /// provider elide the CQ's lock, with room for at least `cqe` completions and a completion
    /// channel when `with_events`. Where the device has no `ibv_create_cq_ex` or refuses the flag
    /// (`EOPNOTSUPP`, `ENOSYS`, `EINVAL`), it falls back to a plain `ibv_create_cq` CQ, with its
    /// lock; [`IbvCompletionQueue::is_single_threaded`] tells which one was made.
    ///
    /// The runtime does not use it: its CQs are touched by more than one thread (the listener
    /// creates and destroys QPs on a worker's CQ; a `Channel`'s callers poll a CQ its dispatcher
    /// waits on).
    ///
    /// # Safety
    /// The caller guarantees that at most one thread at a time polls the CQ, arms it
    /// (`req_notify`), waits on it, and creates, modifies to RESET or destroys a QP that uses it
    /// (those clean the CQ), for as long as the CQ and its clones live: the provider no longer
    /// serializes them.
    ///
    /// # Errors
    /// As [`Context::create_cq`]: [`VerbsError::CapExceeded`] over `max_cqe`,
    /// [`VerbsError::InvalidArgument`] for 0, [`VerbsError::Os`] naming the call that failed.
    pub unsafe fn create_cq_single_threaded(
        &self,
        cqe: u32,
        with_events: bool,
    ) -> Result<IbvCompletionQueue> {
        IbvCompletionQueue::create_single_threaded(self, cqe, with_events)
    }

    pub(super) fn raw(&self) -> *mut ibv_context {
        self.inner.ctx.as_ptr()
    }

    fn check_port(&self, call: &'static str, port_num: u8) -> Result<()> {
        if port_num == 0 || port_num > self.inner.attr.phys_port_cnt {
            return Err(VerbsError::InvalidArgument {
                call,
                reason: format!(
                    "{} has ports 1..={}, not port {port_num}",
                    self.inner.name, self.inner.attr.phys_port_cnt
                ),
            });
        }
        Ok(())
    }

    fn raw_port(&self, port_num: u8) -> Result<ibv_port_attr> {
        self.check_port("ibv_query_port", port_num)?;
        // SAFETY: `ibv_port_attr` is plain C data; all-zero is a valid value.
        let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: open context, existing port, live out-parameter of the current layout.
        let rc = unsafe { ___ibv_query_port(self.raw(), port_num, &mut p) };
        if rc != 0 {
            return Err(from_rc("ibv_query_port", rc));
        }
        Ok(p)
    }
}

/// The type of GID `index` of `port` from sysfs (`gid_attrs/types/<index>`: `IB/RoCE v1` or
/// `RoCE v2`). Kernels without the attribute have v1 / IB GIDs only.
fn gid_type(sysfs: &Path, port: u8, index: u32, link_layer: LinkLayer) -> GidType {
    let path = sysfs.join(format!("ports/{port}/gid_attrs/types/{index}"));
    let text = std::fs::read_to_string(path).unwrap_or_default();
    parse_gid_type(&text, link_layer)
}

fn parse_gid_type(text: &str, link_layer: LinkLayer) -> GidType {
    if text.trim().eq_ignore_ascii_case("RoCE v2") {
        GidType::RoceV2
    } else if link_layer == LinkLayer::InfiniBand {
        GidType::Ib
    } else {
        GidType::RoceV1
    }
}

impl Context<Ibverbs> for IbvContext {
    fn device_name(&self) -> &str {
        &self.inner.name
    }

    fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        let p = self.raw_port(port_num)?;
        Ok(PortAttr {
            port_num,
            state: port_state_from_ibv(p.state),
            max_mtu: mtu_from_ibv(p.max_mtu),
            active_mtu: mtu_from_ibv(p.active_mtu),
            lid: p.lid,
            link_layer: link_layer_from_ibv(p.link_layer),
            gid_tbl_len: u32::try_from(p.gid_tbl_len).unwrap_or(0),
        })
    }

    fn gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>> {
        let p = self.raw_port(port_num)?;
        let link_layer = link_layer_from_ibv(p.link_layer);
        let mut out = Vec::new();
        for index in 0..p.gid_tbl_len.max(0) {
            let mut gid = ibv_gid { raw: [0; 16] };
            // SAFETY: open context, existing port, index below gid_tbl_len, live out-parameter.
            let rc = unsafe { ibv_query_gid(self.raw(), port_num, index, &mut gid) };
            if rc != 0 {
                continue; // an empty or unreadable entry (newer kernels answer ENODATA)
            }
            // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
            let gid = Gid(unsafe { gid.raw });
            if gid.is_zero() {
                continue;
            }
            let index = index as u32;
            out.push(GidEntry {
                index,
                gid,
                gid_type: gid_type(&self.inner.sysfs, port_num, index, link_layer),
            });
        }
        Ok(out)
    }

    fn alloc_pd(&self) -> Result<IbvProtectionDomain> {
        // SAFETY: open context; the PD is owned by the returned handle and freed in its drop.
        let pd = NonNull::new(unsafe { ibv_alloc_pd(self.raw()) }).ok_or_else(|| last_os("ibv_alloc_pd"))?;
        Ok(IbvProtectionDomain::new(self.clone(), pd))
    }

    fn create_cq(&self, cqe: u32, with_events: bool) -> Result<IbvCompletionQueue> {
        IbvCompletionQueue::create(self, cqe, with_events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_types_from_sysfs_text() {
        assert_eq!(parse_gid_type("RoCE v2\n", LinkLayer::Ethernet), GidType::RoceV2);
        assert_eq!(parse_gid_type("IB/RoCE v1\n", LinkLayer::Ethernet), GidType::RoceV1);
        assert_eq!(parse_gid_type("IB/RoCE v1\n", LinkLayer::InfiniBand), GidType::Ib);
        assert_eq!(parse_gid_type("", LinkLayer::Ethernet), GidType::RoceV1);
    }
}
