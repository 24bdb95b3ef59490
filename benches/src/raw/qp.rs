//! One side of a raw verbs test: a device context, PD, CQ, an RC QP and the MR it sends from
//! and receives into, set up the way perftest does (one CQ, selective signaling every `cq_mod`
//! WRs, all receives on the same buffer since one message is in flight at a time).
//!
//! This module posts work requests, which is `unsafe` in the verbs API; it owns the MR that every
//! SGE points into, which is what makes each post sound (see the `// SAFETY:` notes).
#![allow(unsafe_code)]

use std::hash::{BuildHasher, Hasher};

use rpc_core::verbs::gid::select_gid;
use rpc_core::verbs::rc::{self, Endpoint, RcConfig};
use rpc_core::verbs::{
    AccessFlags, CompletionQueue, Context, DeviceSelector, MemoryRegion, ProtectionDomain, Provider, QpCap,
    QpInitAttr, QueuePair, RecvWr, SendFlags, SendOp, SendWr, SharedReceiveQueue, SrqInitAttr, WcOpcode,
    WorkCompletion,
};

use crate::cli::PollKind;
use crate::error::PerfError;
use crate::oob::WireEndpoint;
use crate::poll::Waiter;

/// Completions taken per `poll` call.
const POLL_BATCH: usize = 32;
/// Receive WRs kept posted unless `--rx-depth` (perftest's `-r`) says otherwise.
pub const DEFAULT_RX_DEPTH: u32 = 64;
/// Receive WRs posted per call.
const RX_POST_BATCH: usize = 64;

/// How to open and size one side.
#[derive(Clone, Debug)]
pub struct RawConfig {
    /// Which device.
    pub device: DeviceSelector,
    /// Port (1-based).
    pub port_num: u8,
    /// GID index, -1 = automatic.
    pub gid_index: i32,
    /// Send queue depth in WQEs (outstanding WRs).
    pub tx_depth: u32,
    /// Receive WQEs kept posted (cut to the device's `max_qp_wr`, or `max_srq_wr` with an SRQ).
    pub rx_depth: u32,
    /// Signal one send WR in this many (1..=tx_depth).
    pub cq_mod: u32,
    /// Largest message in bytes (sizes the buffer).
    pub max_size: usize,
    /// Polling policy while waiting.
    pub poll: PollKind,
    /// Receive through a shared receive queue (as the RPC workers do) instead of the QP's own.
    pub use_srq: bool,
    /// Inline data asked of the QP in bytes (0 = never inline, as the RPC workers); capped by the
    /// device.
    pub inline: u32,
}

/// One side of a raw test. Field order is drop order: the QP goes before the MR it uses.
pub struct RawQp<P: Provider> {
    qp: P::QueuePair,
    srq: Option<P::SharedReceiveQueue>,
    cq: P::CompletionQueue,
    mr: P::MemoryRegion,
    ctx: P::Context,
    rc: RcConfig,
    local: Endpoint,
    /// Bytes of each half of the MR: `[0, area)` is sent from, `[area, 2 area)` is received into.
    area: usize,
    max_inline: u32,
    remote_addr: u64,
    remote_rkey: u32,
    tx_depth: u32,
    cq_mod: u32,
    /// Send WRs posted so far (wr_id of the last one).
    posted: u64,
    /// Every send WR up to this wr_id has completed.
    completed: u64,
    /// Receive WRs currently posted.
    rx_posted: u32,
    /// Receive WRs kept posted (the granted `--rx-depth`).
    rx_depth: u32,
    /// Receive completions taken by `poll` and not yet claimed by `take_recvs`.
    recvs: u64,
    wcs: [WorkCompletion; POLL_BATCH],
    what: &'static str,
    poll: PollKind,
}

impl<P: Provider> RawQp<P> {
    /// Opens the device and creates everything in RESET; `what` names the test and side in errors.
    ///
    /// # Errors
    /// The verbs error of the first failing call (a missing device names what exists).
    pub fn open(cfg: &RawConfig, what: &'static str) -> Result<Self, PerfError> {
        let ctx = P::open(&cfg.device)?;
        // The runtime's own choice (logged at info), so raw and RPC tests use the same address.
        let local = select_gid::<P>(&ctx, cfg.port_num, cfg.gid_index)?;
        let pd = ctx.alloc_pd()?;
        let sq_depth = cfg.tx_depth.max(cfg.cq_mod + 1);
        let attr = ctx.attr();
        let (rx_limit, limit_name) =
            if cfg.use_srq { (attr.max_srq_wr, "max_srq_wr") } else { (attr.max_qp_wr, "max_qp_wr") };
        let rx_depth = cut(what, "receive queue (--rx-depth)", cfg.rx_depth.max(1), rx_limit, limit_name);
        let cqe = cut(
            what,
            "CQ",
            sq_depth.saturating_add(rx_depth).saturating_add(POLL_BATCH as u32),
            attr.max_cqe,
            "max_cqe",
        );
        let cq = ctx.create_cq(cqe, false)?;
        let area = cfg.max_size.max(64).next_multiple_of(64);
        let mr = pd.reg_mr(2 * area, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
        let dev_inline = ctx.attr().max_inline_data;
        let inline = if dev_inline > 0 { dev_inline.min(cfg.inline) } else { cfg.inline.min(64) };
        let cap = QpCap {
            max_send_wr: sq_depth,
            max_recv_wr: rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: inline,
        };
        let srq = if cfg.use_srq {
            Some(pd.create_srq(&SrqInitAttr { max_wr: rx_depth, max_sge: 1 })?)
        } else {
            None
        };
        let qp = pd.create_qp(&QpInitAttr::<P> {
            send_cq: &cq,
            recv_cq: &cq,
            srq: srq.as_ref(),
            cap,
            sq_sig_all: false,
        })?;
        let rc = local.rc_config();
        let local = local.endpoint(qp.qp_num(), random_psn());
        let max_inline = qp.cap().max_inline_data;
        Ok(RawQp {
            qp,
            srq,
            cq,
            mr,
            ctx,
            rc,
            local,
            area,
            max_inline,
            remote_addr: 0,
            remote_rkey: 0,
            tx_depth: sq_depth,
            cq_mod: cfg.cq_mod,
            posted: 0,
            completed: 0,
            rx_posted: 0,
            rx_depth,
            recvs: 0,
            wcs: [WorkCompletion::default(); POLL_BATCH],
            what,
            poll: cfg.poll,
        })
    }

    /// The device's name.
    pub fn device_name(&self) -> String {
        self.ctx.device_name().to_string()
    }

    /// Max inline bytes of the QP.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// This side's endpoint and receive area, for the peer.
    pub fn wire_endpoint(&self) -> WireEndpoint {
        WireEndpoint::new(&self.local, self.mr.addr() + self.area as u64, self.mr.rkey(), self.area as u64)
    }

    /// Posts the receive WRs and moves the QP to RTS against `remote`.
    ///
    /// # Errors
    /// [`PerfError::Setup`] when the peer's buffer is smaller than this side's messages; the
    /// transition's verbs error.
    pub fn connect(&mut self, remote: &WireEndpoint) -> Result<(), PerfError> {
        if (remote.len as usize) < self.area {
            return Err(PerfError::Setup(format!(
                "{}: peer buffer of {} bytes is smaller than this side's {} bytes",
                self.what, remote.len, self.area
            )));
        }
        let ep = remote.endpoint()?;
        // rc::connect goes RESET→INIT→RTR→RTS; receives are posted right after, before this
        // side reports `Connected`, so the peer's first SEND finds one.
        rc::connect(&self.qp, &self.rc, &self.local, &ep)?;
        self.remote_addr = remote.addr;
        self.remote_rkey = remote.rkey;
        self.refill_recvs()
    }

    /// Zeroes the receive area's first `size` bytes (before a size starts; no WR targets them then).
    pub fn clear_recv_area(&mut self, size: usize) {
        let area = self.area;
        self.mr.write_at(area, &vec![0; size]).expect("the receive area lies in the MR");
    }

    /// The byte at `offset` of the receive area, as the peer's RDMA WRITE left it.
    #[inline]
    pub fn recv_byte(&self, offset: usize) -> u8 {
        // The peer writes this byte by RDMA while we spin: make the compiler load it every time.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let mut b = [0u8];
        self.mr.read_at(self.area + offset, &mut b).expect("offset inside the receive area");
        std::hint::black_box(b[0])
    }

    /// Copies the receive area's first `out.len()` bytes into `out` (what a consumer of a WRITE's
    /// payload does once its last byte landed), and keeps the compiler from skipping the copy.
    #[inline]
    pub fn copy_recv_area(&self, out: &mut [u8]) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        self.mr.read_at(self.area, out).expect("the receive area lies in the MR");
        std::hint::black_box(&*out);
    }

    /// Sets the byte at `offset` of the send area (the tag a write_lat peer polls for).
    ///
    /// Called only when no posted WR is still reading that byte: in a ping-pong, after the peer
    /// answered the previous message.
    #[inline]
    pub fn set_send_byte(&mut self, offset: usize, v: u8) {
        self.mr.write_at(offset, &[v]).expect("offset inside the send area");
    }

    /// Tops the receive queue up to its depth, in one post.
    fn refill_recvs(&mut self) -> Result<(), PerfError> {
        let sge = [self.mr.sge(self.area, self.area as u32)];
        let mut wrs = [RecvWr { wr_id: 0, sg_list: &sge }; RX_POST_BATCH];
        for (i, wr) in wrs.iter_mut().enumerate() {
            wr.wr_id = i as u64;
        }
        while self.rx_posted < self.rx_depth {
            let n = ((self.rx_depth - self.rx_posted) as usize).min(RX_POST_BATCH);
            // SAFETY: the SGE lies in `self.mr` (LOCAL_WRITE), which outlives the QP (dropped
            // after it, field order). All receives share the receive area; the caller never reads
            // it while a receive could land except through `recv_byte`, which is the RDMA WRITE
            // tests' protocol.
            unsafe {
                match &self.srq {
                    Some(srq) => srq.post_recv(&wrs[..n])?,
                    None => self.qp.post_recv(&wrs[..n])?,
                }
            };
            self.rx_posted += n as u32;
        }
        Ok(())
    }

    /// Posts one send WR of `len` bytes from the send area: a SEND, or an RDMA WRITE into the
    /// peer's receive area. Waits for send-queue room first; inline when it fits; signaled every
    /// `cq_mod` WRs and when `signal` is set.
    ///
    /// # Errors
    /// The post's verbs error; a completion error seen while waiting; a stall.
    #[inline]
    pub fn post(&mut self, write: bool, len: usize, signal: bool) -> Result<(), PerfError> {
        let mut w = Waiter::new(self.poll);
        while self.posted - self.completed >= self.tx_depth as u64 {
            if self.poll()? == 0 && w.idle() && w.stalled() {
                return Err(PerfError::Stalled {
                    what: self.what,
                    secs: crate::poll::STALL_TIMEOUT.as_secs(),
                });
            }
        }
        let seq = self.posted + 1;
        let mut flags = SendFlags::EMPTY;
        if signal || seq % self.cq_mod as u64 == 0 {
            flags |= SendFlags::SIGNALED;
        }
        if len as u32 <= self.max_inline {
            flags |= SendFlags::INLINE;
        }
        let op = if write {
            SendOp::RdmaWrite { remote_addr: self.remote_addr, rkey: self.remote_rkey }
        } else {
            SendOp::Send
        };
        let sge = [self.mr.sge(0, len as u32)];
        let wr = SendWr { wr_id: seq, sg_list: &sge, op, flags };
        // SAFETY: the SGE lies in `self.mr`, which outlives the QP. The send area is written only
        // through `set_send_byte`, which the tests call after the peer has answered the previous
        // message (so that WR's data has been read); inline WRs are copied during the call.
        unsafe { self.qp.post_send(&[wr])? };
        self.posted = seq;
        Ok(())
    }

    /// Polls the CQ once (up to 32 completions). Returns how many completions it took; receive
    /// completions are counted for [`RawQp::take_recvs`] and their WRs reposted in batches.
    ///
    /// # Errors
    /// [`PerfError::Completion`] for an error completion; the CQ's verbs error.
    #[inline]
    pub fn poll(&mut self) -> Result<usize, PerfError> {
        let n = self.cq.poll(&mut self.wcs)?;
        for wc in &self.wcs[..n] {
            if !wc.status.is_success() {
                return Err(PerfError::Completion {
                    what: self.what,
                    status: wc.status,
                    wr_id: wc.wr_id,
                    opcode: wc.opcode,
                    vendor_err: wc.vendor_err,
                });
            }
            match wc.opcode {
                WcOpcode::IBV_WC_RECV | WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM => {
                    self.recvs += 1;
                    self.rx_posted -= 1;
                }
                _ => self.completed = self.completed.max(wc.wr_id),
            }
        }
        if self.rx_posted <= self.rx_depth / 2 {
            self.refill_recvs()?;
        }
        Ok(n)
    }

    /// Claims the receive completions seen so far.
    #[inline]
    pub fn take_recvs(&mut self) -> u64 {
        std::mem::take(&mut self.recvs)
    }

    /// Waits until every posted send WR has completed (posting a signaled zero-effect is not
    /// needed: the last WR of a run is posted signaled by the caller).
    ///
    /// # Errors
    /// As [`RawQp::poll`]; a stall.
    pub fn drain_sends(&mut self) -> Result<(), PerfError> {
        let mut w = Waiter::new(self.poll);
        while self.completed < self.posted {
            if self.poll()? == 0 && w.idle() && w.stalled() {
                return Err(PerfError::Stalled {
                    what: self.what,
                    secs: crate::poll::STALL_TIMEOUT.as_secs(),
                });
            }
        }
        Ok(())
    }

    /// Send WRs posted and known complete: (posted, completed).
    pub fn send_counts(&self) -> (u64, u64) {
        (self.posted, self.completed)
    }

    /// The polling policy.
    pub fn poll_kind(&self) -> PollKind {
        self.poll
    }

    /// Error context.
    pub fn what(&self) -> &'static str {
        self.what
    }
}

/// A 24-bit starting PSN, different per QP and run.
fn random_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() as u32) & 0x00ff_ffff
}

/// `asked` cut to the device's `limit` (named `limit_name`), with a warning giving both numbers
/// when it is cut.
fn cut(what: &str, queue: &str, asked: u32, limit: u32, limit_name: &str) -> u32 {
    let limit = limit.max(1);
    if asked > limit {
        tracing::warn!(
            side = what,
            queue,
            asked,
            granted = limit,
            limit = limit_name,
            "queue size cut to the device's limit"
        );
    }
    asked.min(limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_core::verbs::sim::{Sim, SIM_GID_INDEX};

    /// The raw tests take the runtime's GID choice: on sim's table (several entries and types)
    /// the host's RoCE v2 entry, advertised to the peer as the endpoint's GID.
    #[test]
    fn raw_qp_uses_the_runtimes_gid_choice() {
        let cfg = RawConfig {
            device: DeviceSelector::First,
            port_num: 1,
            gid_index: -1,
            tx_depth: 16,
            rx_depth: DEFAULT_RX_DEPTH,
            cq_mod: 1,
            max_size: 64,
            poll: PollKind::Yield,
            use_srq: false,
            inline: 0,
        };
        let q = RawQp::<Sim>::open(&cfg, "test").unwrap();
        assert_eq!(u32::from(q.rc.gid_index), SIM_GID_INDEX);
        assert_eq!(q.local.gid, q.ctx.gid());
        let explicit = RawQp::<Sim>::open(&RawConfig { gid_index: 1, ..cfg }, "test").unwrap();
        assert_eq!(explicit.rc.gid_index, 1);
    }

    /// `-r` sets the receive WQEs posted; one above the device's limit (sim: `max_qp_wr` and
    /// `max_srq_wr` 16 384) is cut to it (with a warning) rather than failing the test.
    #[test]
    fn rx_depth_is_posted_and_cut_to_the_device_limit() {
        let cfg = RawConfig {
            device: DeviceSelector::First,
            port_num: 1,
            gid_index: -1,
            tx_depth: 16,
            rx_depth: 200,
            cq_mod: 1,
            max_size: 64,
            poll: PollKind::Yield,
            use_srq: false,
            inline: 0,
        };
        // Connected to itself: receives are posted from INIT on.
        let open = |cfg: &RawConfig| {
            let q = RawQp::<Sim>::open(cfg, "test").unwrap();
            rc::connect(&q.qp, &q.rc, &q.local, &q.local).unwrap();
            q
        };
        let mut q = open(&cfg);
        q.refill_recvs().unwrap();
        assert_eq!((q.rx_depth, q.rx_posted), (200, 200));
        for use_srq in [false, true] {
            let mut big = open(&RawConfig { rx_depth: 1 << 20, use_srq, ..cfg.clone() });
            big.refill_recvs().unwrap();
            assert_eq!((big.rx_depth, big.rx_posted), (16384, 16384), "use_srq {use_srq}");
        }
    }
}
