//! A simulated host: its device context, protection domains and memory-region key table.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::cq::SimCq;
use super::mr::{SimMr, MR_ALIGN, MR_SLOTS};
use super::mw::SimMw;
use super::qp::SimQp;
use super::shm::{Arena, Segment, QP_DIR_LEN, QP_DIR_OFF};
use super::srq::SimSrq;
use super::{Sim, MAX_CQE, MAX_INLINE, MAX_QP_WR, MAX_SGE, MAX_SRQ_WR};
use crate::verbs::{
    AccessFlags, Context, DeviceAttr, Gid, GidEntry, GidType, LinkLayer, Mtu, MwType, PortAttr, PortState,
    ProtectionDomain, QpInitAttr, Result, SrqInitAttr, VerbsError,
};

/// Largest MR the sim registers, in bytes (16 GiB).
pub(crate) const MAX_MR_SIZE: u64 = 1 << 34;

/// Whether devices opened from now on have type-2 memory windows (see [`set_memory_windows`]).
static MEMORY_WINDOWS: AtomicBool = AtomicBool::new(true);

/// Whether software NICs opened from now on (in this process) have type-2 memory windows:
/// `true` (the default) as rxe and mlx5 do; `false` as a device without them (`max_mw` 0, the
/// type-2 capability flag clear, `ibv_alloc_mw` failing [`VerbsError::CapExceeded`]), to test
/// what the runtime does on such a device. Devices already open keep what they had.
///
/// [`VerbsError::CapExceeded`]: crate::verbs::VerbsError::CapExceeded
pub fn set_memory_windows(on: bool) {
    MEMORY_WINDOWS.store(on, Ordering::Relaxed);
}

pub(crate) struct HostCore {
    pub(crate) id: u32,
    pub(crate) gid: Gid,
    pub(crate) lid: u16,
    pub(crate) attr: DeviceAttr,
    pub(crate) mrs: super::mr::MrTable,
    /// Send-queue occupancy of this host's QPs (process-private), advanced by CQ polls.
    pub(crate) sq_slots: super::sqslots::SqSlots,
    /// The host's shared memory; the heap allocator over it (process-private bookkeeping).
    pub(crate) arena: Arena,
    next_qpn: AtomicU32,
    next_pd: AtomicU32,
    /// Declared last: unmapped (and unlinked) after everything above.
    pub(crate) seg: Segment,
}

impl HostCore {
    /// A new host with its segment, or the OS error of creating it.
    pub(crate) fn new(id: u32) -> Result<HostCore> {
        let seg = Segment::create(id)?;
        let gid = host_gid(super::shm::my_pid(), id);
        let windows = MEMORY_WINDOWS.load(Ordering::Relaxed);
        Ok(HostCore {
            id,
            gid,
            lid: id as u16,
            attr: DeviceAttr {
                max_qp_wr: MAX_QP_WR,
                max_sge: MAX_SGE as u32,
                max_cqe: MAX_CQE,
                max_srq_wr: MAX_SRQ_WR,
                max_srq_sge: MAX_SGE as u32,
                max_qp: QP_DIR_LEN as u32,
                max_mr_size: MAX_MR_SIZE,
                max_qp_rd_atom: 16,
                max_inline_data: MAX_INLINE as u32,
                phys_port_cnt: 1,
                max_mw: if windows { MR_SLOTS as u32 } else { 0 },
                mw_type2: windows,
            },
            mrs: super::mr::MrTable::new(&seg),
            sq_slots: super::sqslots::SqSlots::new(),
            arena: Arena::new(),
            next_qpn: AtomicU32::new(0x11),
            next_pd: AtomicU32::new(1),
            seg,
        })
    }

    /// The QP directory of this host's segment: `qpn % QP_DIR_LEN` → offset of the QP's shared
    /// state (0 = none).
    pub(crate) fn qp_dir(&self) -> &[AtomicU64] {
        // SAFETY: the directory lies inside the segment (layout constants), atomics only.
        unsafe { std::slice::from_raw_parts(self.seg.at(QP_DIR_OFF) as *const AtomicU64, QP_DIR_LEN) }
    }

    /// Picks a QPN whose directory entry is free and points the entry at `off`; `None` when
    /// the directory is full. The counter goes round the directory, skipping the entries of live
    /// QPs: 1 / (1 - the fraction in use) probes on average (1.4 with 20,000 of 65,536 QPs
    /// alive); only a nearly full directory probes long, up to all [`QP_DIR_LEN`] entries when
    /// it is full (the create that fails).
    pub(crate) fn alloc_qpn(&self, off: usize) -> Option<u32> {
        let dir = self.qp_dir();
        for _ in 0..QP_DIR_LEN {
            let qpn = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            // Never 0..=0x10 (QP0 and QP1 are special in verbs, the rest kept free as on most
            // NICs); a QPN whose directory entry is taken (a live QP) is skipped, so the counter
            // wrapping after 2^24 creations never hands out a number in use.
            if qpn <= 0x10 {
                continue;
            }
            let e = &dir[qpn as usize % QP_DIR_LEN];
            if e.compare_exchange(0, off as u64, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return Some(qpn);
            }
        }
        None
    }

    /// Test hook: where the QP number counter continues.
    #[cfg(test)]
    pub(crate) fn set_next_qpn(&self, next: u32) {
        self.next_qpn.store(next, Ordering::Relaxed);
    }

    /// Clears the directory entry of `qpn`.
    pub(crate) fn free_qpn(&self, qpn: u32) {
        self.qp_dir()[qpn as usize % QP_DIR_LEN].store(0, Ordering::Release);
    }

    /// The host's liveness word (in its segment: peers read it).
    #[inline]
    pub(crate) fn alive_word(&self) -> &AtomicU32 {
        &self.seg.header().alive
    }

    #[inline]
    pub(crate) fn is_alive(&self) -> bool {
        self.alive_word().load(Ordering::Relaxed) != 0
    }

    /// Allocates `len` zeroed bytes of the segment (`align`: a power of two); returns the
    /// offset.
    pub(crate) fn alloc(&self, call: &'static str, len: usize, align: usize) -> Result<usize> {
        self.arena.alloc(&self.seg, len, align).ok_or_else(|| VerbsError::Os {
            call,
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })
    }
}

/// The GID of host `id` of process `pid`: `fe80::<pid>:<id>` (bytes 8..12 the pid, 12..16 the
/// host id, big-endian).
pub(crate) fn host_gid(pid: u32, id: u32) -> Gid {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8..12].copy_from_slice(&pid.to_be_bytes());
    gid[12..].copy_from_slice(&id.to_be_bytes());
    Gid(gid)
}

/// Entries in port 1's GID table (`gid_tbl_len`); every entry is filled.
pub(crate) const GID_TBL_LEN: u32 = 5;

/// The index of the RoCE v2 entry of the host's own GID in port 1's table: what
/// [`choose_gid`](crate::verbs::gid::choose_gid) picks on sim.
pub const SIM_GID_INDEX: u32 = 2;

/// Port 1's GID table of a host with GID `gid` and id `id`, laid out as a RoCE NIC's with
/// several addresses and types, so that the choice of
/// [`choose_gid`](crate::verbs::gid::choose_gid) is tested without hardware:
///
/// | index | GID | type | rank in `choose_gid` |
/// |---|---|---|---|
/// | 0 | the host's `fe80::<pid>:<id>` | RoCE v1 | v1 link-local |
/// | 1 | `::ffff:10.a.b.c` (IPv4-mapped, routable; a.b.c the low 24 bits of the id) | RoCE v1 | v1 routable IPv4 |
/// | 2 ([`SIM_GID_INDEX`]) | the host's `fe80::<pid>:<id>` | RoCE v2 | **v2 link-local: chosen** |
/// | 3 | `::ffff:169.254.a.b` (IPv4 link-local; a.b the low 16 bits of the id) | RoCE v2 | v2 link-local, after 2 on the tie |
/// | 4 | `2001:db8::<pid>:<id>` (documentation prefix) | IB | anything else |
///
/// A wrong choice fails visibly: taking entries in order gives 0, ignoring the type gives 1 or
/// 4, taking IPv4 link-local for a routable IPv4 address gives 3. The fabric delivers to the
/// host's own GID only (entries 0 and 2 carry it); the others are addresses no peer reaches,
/// as on a NIC whose other addresses are on another subnet.
pub(crate) fn gid_table(gid: Gid, id: u32) -> [GidEntry; GID_TBL_LEN as usize] {
    let idb = id.to_be_bytes();
    let mut v4 = [0u8; 16];
    v4[10] = 0xff;
    v4[11] = 0xff;
    let mut routable = v4;
    routable[12] = 10;
    routable[13..].copy_from_slice(&idb[1..]);
    let mut v4_link_local = v4;
    v4_link_local[12..14].copy_from_slice(&[169, 254]);
    v4_link_local[14..].copy_from_slice(&idb[2..]);
    let mut doc = gid.0;
    doc[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0]);
    [
        GidEntry { index: 0, gid, gid_type: GidType::RoceV1 },
        GidEntry { index: 1, gid: Gid(routable), gid_type: GidType::RoceV1 },
        GidEntry { index: SIM_GID_INDEX, gid, gid_type: GidType::RoceV2 },
        GidEntry { index: 3, gid: Gid(v4_link_local), gid_type: GidType::RoceV2 },
        GidEntry { index: 4, gid: Gid(doc), gid_type: GidType::Ib },
    ]
}

/// The (pid, host id) a sim GID names.
pub(crate) fn gid_host(gid: &Gid) -> (u32, u32) {
    let g = gid.0;
    (u32::from_be_bytes([g[8], g[9], g[10], g[11]]), u32::from_be_bytes([g[12], g[13], g[14], g[15]]))
}

impl Drop for HostCore {
    fn drop(&mut self) {
        super::fabric::fabric().remove_host(self.id);
    }
}

/// An open software-NIC device: one simulated host with its own GID (`fe80::<pid>:<host id>`), LID
/// (the host id) and key space. Cheap to clone.
#[derive(Clone)]
pub struct SimContext {
    pub(crate) host: Arc<HostCore>,
}

impl SimContext {
    /// This host's id in the process-wide fabric (also its LID and the low bits of its GID).
    pub fn host_id(&self) -> u32 {
        self.host.id
    }

    /// This host's GID: entries 0 (RoCE v1) and [`SIM_GID_INDEX`] (RoCE v2) of port 1's GID
    /// table, the address the fabric delivers to.
    pub fn gid(&self) -> Gid {
        self.host.gid
    }
}

impl std::fmt::Debug for SimContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimContext").field("host", &self.host.id).field("gid", &self.host.gid).finish()
    }
}

fn check_port(call: &'static str, port_num: u8) -> Result<()> {
    if port_num == 1 {
        Ok(())
    } else {
        Err(VerbsError::InvalidArgument { call, reason: format!("port {port_num}: sim0 has port 1 only") })
    }
}

impl Context<Sim> for SimContext {
    fn device_name(&self) -> &str {
        "sim0"
    }

    fn attr(&self) -> &DeviceAttr {
        &self.host.attr
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        check_port("ibv_query_port", port_num)?;
        Ok(PortAttr {
            port_num,
            state: if self.host.is_alive() { PortState::Active } else { PortState::Down },
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            lid: self.host.lid,
            link_layer: LinkLayer::Sim,
            gid_tbl_len: GID_TBL_LEN,
        })
    }

    fn gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>> {
        check_port("ibv_query_gid", port_num)?;
        Ok(gid_table(self.host.gid, self.host.id).to_vec())
    }

    fn alloc_pd(&self) -> Result<SimPd> {
        let id = self.host.next_pd.fetch_add(1, Ordering::Relaxed);
        Ok(SimPd { inner: Arc::new(PdInner { host: self.host.clone(), id }) })
    }

    fn create_cq(&self, cqe: u32, with_events: bool) -> Result<SimCq> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(VerbsError::CapExceeded {
                what: "ibv_create_cq cqe",
                cap: "max_cqe",
                requested: cqe as u64,
                limit: MAX_CQE as u64,
            });
        }
        SimCq::new(self.host.clone(), cqe, with_events)
    }
}

pub(crate) struct PdInner {
    pub(crate) host: Arc<HostCore>,
    pub(crate) id: u32,
}

/// A protection domain of the software NIC. Cheap to clone.
#[derive(Clone)]
pub struct SimPd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for SimPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimPd").field("host", &self.inner.host.id).field("pd", &self.inner.id).finish()
    }
}

impl SimPd {
    fn check_len(&self, len: usize) -> Result<()> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument {
                call: "ibv_reg_mr",
                reason: "length 0: a memory region needs at least one byte".into(),
            });
        }
        if len as u64 > MAX_MR_SIZE {
            return Err(VerbsError::CapExceeded {
                what: "ibv_reg_mr length",
                cap: "max_mr_size",
                requested: len as u64,
                limit: MAX_MR_SIZE,
            });
        }
        Ok(())
    }

    fn full() -> VerbsError {
        VerbsError::CapExceeded {
            what: "ibv_reg_mr",
            cap: "max_mr",
            requested: MR_SLOTS as u64 + 1,
            limit: MR_SLOTS as u64,
        }
    }
}

impl ProtectionDomain<Sim> for SimPd {
    /// The buffer is allocated (zeroed, 4096-byte aligned) in the host's shared segment, where
    /// peers in other processes reach it under its rkey.
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<SimMr> {
        self.check_len(len)?;
        let host = &self.inner.host;
        let off = host.alloc("ibv_reg_mr (allocating the buffer)", len, MR_ALIGN)?;
        // Registered memory is resident, as pinning makes it on hardware.
        host.arena.populate(&host.seg, off, len);
        let ptr = host.seg.at(off);
        match SimMr::register(host.clone(), self.inner.id, ptr, len, access, Some((off, len))) {
            Some(mr) => Ok(mr),
            None => {
                host.arena.free(&host.seg, off, len);
                Err(Self::full())
            }
        }
    }

    unsafe fn reg_user_mr(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<SimMr> {
        self.check_len(len)?;
        if addr.is_null() {
            return Err(VerbsError::InvalidArgument { call: "ibv_reg_mr", reason: "null address".into() });
        }
        SimMr::register(self.inner.host.clone(), self.inner.id, addr, len, access, None)
            .ok_or_else(Self::full)
    }

    /// Type 2 only; windows share the key table with MRs (65,536 slots in all).
    fn alloc_mw(&self, mw_type: MwType) -> Result<SimMw> {
        SimMw::alloc(self, mw_type)
    }

    fn create_srq(&self, attr: &SrqInitAttr) -> Result<SimSrq> {
        SimSrq::new(self, attr)
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, Sim>) -> Result<SimQp> {
        SimQp::new(self, attr)
    }
}

#[cfg(test)]
mod tests {
    use crate::verbs::sim::Sim;
    use crate::verbs::{Context, DeviceSelector, ProtectionDomain, Provider, QpCap, QpInitAttr, QueuePair};

    /// A registered buffer is resident at once, as pinned memory is on hardware: the first
    /// transfer into each of its pages (an SRQ's receive buffers are used once per cycle through
    /// them) must not pay a page fault. Above 1 MiB the arena clears by punching pages out, so
    /// without populating none of them would be resident.
    #[test]
    fn registered_memory_is_resident_at_once() {
        use crate::verbs::{AccessFlags, MemoryRegion};
        let ctx = Sim::open(&DeviceSelector::First).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let len = 8 << 20;
        let mr = pd.reg_mr(len, AccessFlags::LOCAL_WRITE).unwrap();
        let pages = len / 4096;
        let mut vec = vec![0u8; pages];
        // SAFETY: `mr.addr()` is page-aligned (MR_ALIGN) and `len` bytes of it are mapped;
        // mincore only reports residency into `vec`, one byte per page.
        let r = unsafe { libc::mincore(mr.addr() as usize as *mut libc::c_void, len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
        assert_eq!(resident, pages, "{resident} of {pages} pages of a fresh MR are resident");
    }

    #[test]
    fn qp_numbers_wrap_around_the_ones_in_use_and_the_reserved_ones() {
        let ctx = Sim::open(&DeviceSelector::First).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, false).unwrap();
        let cap = QpCap { max_send_wr: 1, max_recv_wr: 1, ..QpCap::default() };
        let qp = || {
            pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })
                .unwrap()
        };
        let first = qp();
        assert_eq!(first.qp_num(), 0x11);
        // 2^24 creations later the counter is back at 0: 0..=0x10 are reserved, 0x11 is taken.
        ctx.host.set_next_qpn(1 << 24);
        let wrapped = qp();
        assert_eq!(wrapped.qp_num(), 0x12);
        // Once the first QP is gone its number is free again.
        drop(first);
        ctx.host.set_next_qpn((1 << 24) + 0x11);
        assert_eq!(qp().qp_num(), 0x11);
    }

    /// A server with 20,000 sessions: 20,000 QPs on one host, each in its own directory entry,
    /// by which a peer process finds it (the peer path: the host's segment mapped again); once
    /// destroyed, none is found and the directory is empty. (0.4 s unoptimized since a QP's
    /// destroy waits on the process's threads, not its QPs: `guard::synchronize`; 100 s before.)
    #[test]
    fn twenty_thousand_qps_on_one_host_are_each_found_by_a_peer() {
        use std::sync::atomic::Ordering;
        const QPS: usize = 20_000;
        let ctx = Sim::open(&DeviceSelector::First).unwrap();
        assert_eq!(ctx.attr().max_qp, 65_536);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, false).unwrap();
        let cap = QpCap { max_send_wr: 1, max_recv_wr: 1, ..QpCap::default() };
        let attr = QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false };
        let start = std::time::Instant::now();
        let qps: Vec<_> =
            (0..QPS).map(|i| pd.create_qp(&attr).unwrap_or_else(|e| panic!("QP #{i}: {e}"))).collect();
        // Figures, not checks: what creating and destroying them costs.
        eprintln!("{QPS} QPs created in {:?}", start.elapsed());
        let (pid, host) = (super::super::shm::my_pid(), ctx.host.id);
        for qp in &qps {
            let peer = super::super::remote::resolve(pid, host, qp.qp_num());
            assert_eq!(peer.map(|p| p.qpn), Some(qp.qp_num()), "a peer finds every QP");
        }
        let nums: Vec<u32> = qps.iter().map(|q| q.qp_num()).collect();
        let start = std::time::Instant::now();
        drop(qps);
        eprintln!("{QPS} QPs destroyed in {:?}", start.elapsed());
        for n in nums {
            assert!(super::super::remote::resolve(pid, host, n).is_none(), "QP {n:#x} is gone");
        }
        assert!(ctx.host.qp_dir().iter().all(|e| e.load(Ordering::Relaxed) == 0));
    }
}
