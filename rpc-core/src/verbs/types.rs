//! Plain data of the verbs API: work requests, work completions, QP attributes, flags, GIDs.
//!
//! These types are the same for every provider; they mirror `struct ibv_send_wr`, `struct ibv_wc`,
//! `struct ibv_qp_attr` and friends from libibverbs (`infiniband/verbs.h`, rdma-core), with Rust
//! names and without raw pointers.

use std::fmt;

/// A 128-bit Global Identifier (GID), as stored in a port's GID table (network byte order).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The raw 16 bytes, network byte order.
    pub fn raw(&self) -> &[u8; 16] {
        &self.0
    }

    /// True for an all-zero GID (an empty GID table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// True for an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), what RoCEv2 uses for IPv4.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// True for a link-local IPv6 address (`fe80::/10`).
    pub fn is_link_local(&self) -> bool {
        self.0[0] == 0xfe && (self.0[1] & 0xc0) == 0x80
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Gid {
    /// Formats like `ibv_devinfo -v`: eight colon-separated groups of four hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// The kind of a GID table entry (`enum ibv_gid_type` / sysfs `gid_attrs/types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GidType {
    /// InfiniBand GID (LID-routed fabric, GRH optional).
    Ib,
    /// RoCE v1 (Ethernet, layer 2).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
}

/// One GID table entry of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's GID table (the `gid_index` / `sgid_index` of QP attributes).
    pub index: u32,
    /// The GID itself.
    pub gid: Gid,
    /// Its kind.
    pub gid_type: GidType,
}

/// Link layer of a port (`ibv_port_attr::link_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID, GRH optional.
    InfiniBand,
    /// Ethernet (RoCE): addressed by GID, GRH mandatory.
    Ethernet,
    /// The software NIC: addressed by GID (GRH used as on RoCE).
    Sim,
}

/// Path MTU of an RC QP (`enum ibv_mtu`), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// From the verbs enum value (1..=5); `None` outside that range.
    pub fn from_ibv(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// Port state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PortState {
    /// No link.
    Down,
    /// Link up, not yet configured by the subnet manager.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Active: traffic can flow.
    Active,
    /// Any other value reported by the device.
    Other(u32),
}

/// Attributes of one port (`ibv_query_port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Port number (1-based, as in verbs).
    pub port_num: u8,
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU currently active on the link; RC path MTU is the minimum of both ends' `active_mtu`.
    pub active_mtu: Mtu,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Number of GID table entries.
    pub gid_tbl_len: u32,
}

/// Device capabilities (`ibv_query_device`), used to check requested sizes before creating objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Max WQEs per QP work queue (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Max scatter/gather entries per WR (`max_sge`).
    pub max_sge: u32,
    /// Max CQEs per CQ (`max_cqe`).
    pub max_cqe: u32,
    /// Max WQEs per SRQ (`max_srq_wr`).
    pub max_srq_wr: u32,
    /// Max SGEs per SRQ WR (`max_srq_sge`).
    pub max_srq_sge: u32,
    /// Max number of QPs (`max_qp`).
    pub max_qp: u32,
    /// Max bytes of one registered memory region (`max_mr_size`).
    pub max_mr_size: u64,
    /// Max outstanding RDMA READ / atomic per QP as target (`max_qp_rd_atom`).
    pub max_qp_rd_atom: u32,
    /// Max inline data per send WR in bytes, as the device reports it (0 when unknown; the QP's
    /// `max_inline_data` after creation is authoritative).
    pub max_inline_data: u32,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Max memory windows (`max_mw`; 0 = none).
    pub max_mw: u32,
    /// Whether type-2 memory windows work ([`SendOp::BindMw`], [`SendOp::LocalInv`],
    /// [`SendOp::SendWithInv`]): `device_cap_flags` has `IBV_DEVICE_MEM_WINDOW_TYPE_2A` or
    /// `_2B`. When false, fall back to plain MRs.
    pub mw_type2: bool,
}

/// A device as listed by the provider (`ibv_get_device_list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Index in the provider's list (what `DeviceSelector::Index` refers to).
    pub index: usize,
    /// Kernel name, e.g. `mlx5_0`, `rxe0`, or `sim0` for the software NIC.
    pub name: String,
    /// Node GUID, host byte order (0 when unknown).
    pub guid: u64,
}

/// Which device to open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceSelector {
    /// The first device the provider lists.
    #[default]
    First,
    /// By kernel name (e.g. `mlx5_0`, `rxe0`).
    Name(String),
    /// By position in the provider's list (0-based).
    Index(usize),
}

impl std::str::FromStr for DeviceSelector {
    type Err = std::convert::Infallible;
    /// A number selects by index, anything else by name, empty selects the first device.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(if s.is_empty() {
            DeviceSelector::First
        } else if let Ok(i) = s.parse() {
            DeviceSelector::Index(i)
        } else {
            DeviceSelector::Name(s.to_string())
        })
    }
}

macro_rules! bitflags_u32 {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $v:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);
        impl $name {
            /// No flag set.
            pub const EMPTY: $name = $name(0);
            $($(#[$fm])* pub const $flag: $name = $name($v);)*
            /// True when every flag of `other` is set in `self`.
            pub const fn contains(self, other: $name) -> bool { self.0 & other.0 == other.0 }
            /// The union of both sets.
            pub const fn union(self, other: $name) -> $name { $name(self.0 | other.0) }
        }
        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name { $name(self.0 | rhs.0) }
        }
        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) { self.0 |= rhs.0 }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                write!(f, "{}(", stringify!($name))?;
                $(if self.contains($name::$flag) && $v != 0 {
                    if !first { f.write_str(" | ")?; }
                    first = false;
                    f.write_str(stringify!($flag))?;
                })*
                let _ = first;
                f.write_str(")")
            }
        }
    };
}

bitflags_u32! {
    /// Memory-region and QP access flags (`enum ibv_access_flags`; same bit values).
    AccessFlags {
        /// The local HCA may write (needed for receive buffers and READ targets).
        LOCAL_WRITE = 1;
        /// Peers may RDMA WRITE into it.
        REMOTE_WRITE = 2;
        /// Peers may RDMA READ from it.
        REMOTE_READ = 4;
        /// Peers may perform atomics on it.
        REMOTE_ATOMIC = 8;
        /// Memory windows may be bound to it (`IBV_ACCESS_MW_BIND`). Needed on an MR before a
        /// [`SendOp::BindMw`] can bind a window to any of its range.
        MW_BIND = 16;
    }
}

bitflags_u32! {
    /// Send WR flags (`enum ibv_send_flags`; same bit values).
    SendFlags {
        /// Wait for earlier RDMA READ/atomics of this QP before starting.
        FENCE = 1;
        /// Generate a completion (CQE) for this WR. Unsignaled WRs produce no CQE on success.
        SIGNALED = 2;
        /// Set the solicited-event bit at the receiver.
        SOLICITED = 4;
        /// Copy the payload into the WQE at post time: the buffers may be reused as soon as
        /// `post_send` returns and need no lkey. Limited to the QP's `max_inline_data` bytes.
        INLINE = 8;
    }
}

/// One scatter/gather element (`struct ibv_sge`): a range of a registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address of the first byte (in the address space of the MR's owner).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR holding the range (ignored for inline sends).
    pub lkey: u32,
}

/// An opaque reference to a live memory region, for use inside a work request
/// ([`MwBind::mr`]); from [`MemoryRegion`](crate::verbs::MemoryRegion)`::handle`. It names the
/// MR only while the MR lives (posting it afterwards breaks `post_send`'s safety contract).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MrHandle(pub(crate) u64);

/// An opaque reference to a live memory window, for use inside a work request
/// ([`SendOp::BindMw`]); from [`MemoryWindow`](crate::verbs::MemoryWindow)`::handle`. It names
/// the window only while the window lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MwHandle(pub(crate) u64);

/// The kind of a memory window (`enum ibv_mw_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MwType {
    /// Type 1: bound by a verb (`ibv_bind_mw`), not to a QP. Not offered by this API beyond
    /// allocation; the software NIC refuses it.
    Type1,
    /// Type 2: bound by a [`SendOp::BindMw`] work request to the QP it is posted on; only
    /// requests arriving on that QP may use its rkey.
    Type2,
}

/// What a [`SendOp::BindMw`] binds a window to (`struct ibv_mw_bind_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBind {
    /// The MR whose range the window exposes; it must have been registered with
    /// [`AccessFlags::MW_BIND`].
    pub mr: MrHandle,
    /// First byte of the window (a virtual address inside the MR).
    pub addr: u64,
    /// Length of the window in bytes (more than 0; `addr + length` inside the MR).
    pub length: u64,
    /// Remote rights of the window: a subset of `REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC`.
    /// `REMOTE_WRITE` and `REMOTE_ATOMIC` need `LOCAL_WRITE` on the MR (IBA C10-74).
    pub access: AccessFlags,
}

/// `ibv_inc_rkey`: `rkey` with its low 8 bits (the consumer's key of a type-2 window)
/// incremented, wrapping; the upper 24 bits (which name the window) unchanged. The usual new
/// rkey of a [`SendOp::BindMw`].
pub const fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// The operation of a send WR, with its operation-specific fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes one receive WQE at the peer.
    Send,
    /// SEND with 32-bit immediate data delivered in the receiver's work completion.
    SendWithImm {
        /// Immediate data (host byte order here; providers convert).
        imm: u32,
    },
    /// RDMA WRITE into the peer's memory; no receive WQE consumed, no CQE at the peer.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key of the target MR (needs `REMOTE_WRITE`).
        rkey: u32,
    },
    /// RDMA WRITE followed by immediate data: consumes a receive WQE at the peer.
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key of the target MR (needs `REMOTE_WRITE`).
        rkey: u32,
        /// Immediate data (host byte order).
        imm: u32,
    },
    /// RDMA READ from the peer's memory into the local SGEs.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key of the source MR (needs `REMOTE_READ`).
        rkey: u32,
    },
    /// SEND that also invalidates `invalidate_rkey` at the receiver (`IBV_WR_SEND_WITH_INV`):
    /// a type-2 window of the receiving QP's PD, bound to the receiving QP. The receiver's
    /// completion carries [`WorkCompletion::invalidated_rkey`]; by then the rkey is dead.
    SendWithInv {
        /// The receiver's rkey to invalidate.
        invalidate_rkey: u32,
    },
    /// Binds a type-2 memory window to this QP (`IBV_WR_BIND_MW`): from its completion on, the
    /// peer of this QP, and only it, may access `bind`'s range with `rkey` and `bind.access`.
    /// The window must be free (just allocated, or invalidated since its last bind). No SGEs;
    /// completes with opcode [`WcOpcode::IBV_WC_BIND_MW`], or `IBV_WC_MW_BIND_ERR` (QP to ERR)
    /// when a check fails. The window's own [`rkey`](crate::verbs::MemoryWindow::rkey) follows.
    BindMw {
        /// The window.
        mw: MwHandle,
        /// Its new rkey: the window's rkey with new low 8 bits (see [`inc_rkey`]).
        rkey: u32,
        /// What it exposes.
        bind: MwBind,
    },
    /// Invalidates `rkey` locally (`IBV_WR_LOCAL_INV`): a type-2 window of this QP's PD. From its
    /// completion (opcode [`WcOpcode::IBV_WC_LOCAL_INV`]) on, requests with `rkey` fail and the
    /// window may be bound again. An rkey that names no window: `IBV_WC_LOC_QP_OP_ERR`, QP to ERR.
    LocalInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
}

/// A send-queue work request (`struct ibv_send_wr` without the `next` pointer: post a slice).
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the work completion.
    pub wr_id: u64,
    /// Gather list (for READ: scatter list). May be empty (zero-length message).
    pub sg_list: &'a [Sge],
    /// Operation.
    pub op: SendOp,
    /// Flags (`SIGNALED`, `INLINE`, ...).
    pub flags: SendFlags,
}

/// A receive work request (`struct ibv_recv_wr` without `next`).
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the work completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: &'a [Sge],
}

/// Completion status (`enum ibv_wc_status`; same numeric values, verbs names).
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcStatus {
    #[default]
    IBV_WC_SUCCESS = 0,
    IBV_WC_LOC_LEN_ERR = 1,
    IBV_WC_LOC_QP_OP_ERR = 2,
    IBV_WC_LOC_EEC_OP_ERR = 3,
    IBV_WC_LOC_PROT_ERR = 4,
    IBV_WC_WR_FLUSH_ERR = 5,
    IBV_WC_MW_BIND_ERR = 6,
    IBV_WC_BAD_RESP_ERR = 7,
    IBV_WC_LOC_ACCESS_ERR = 8,
    IBV_WC_REM_INV_REQ_ERR = 9,
    IBV_WC_REM_ACCESS_ERR = 10,
    IBV_WC_REM_OP_ERR = 11,
    IBV_WC_RETRY_EXC_ERR = 12,
    IBV_WC_RNR_RETRY_EXC_ERR = 13,
    IBV_WC_LOC_RDD_VIOL_ERR = 14,
    IBV_WC_REM_INV_RD_REQ_ERR = 15,
    IBV_WC_REM_ABORT_ERR = 16,
    IBV_WC_INV_EECN_ERR = 17,
    IBV_WC_INV_EEC_STATE_ERR = 18,
    IBV_WC_FATAL_ERR = 19,
    IBV_WC_RESP_TIMEOUT_ERR = 20,
    IBV_WC_GENERAL_ERR = 21,
}

impl WcStatus {
    /// From the numeric `ibv_wc_status`; unknown values map to `IBV_WC_GENERAL_ERR`.
    pub fn from_u32(v: u32) -> WcStatus {
        use WcStatus::*;
        const ALL: [WcStatus; 22] = [
            IBV_WC_SUCCESS,
            IBV_WC_LOC_LEN_ERR,
            IBV_WC_LOC_QP_OP_ERR,
            IBV_WC_LOC_EEC_OP_ERR,
            IBV_WC_LOC_PROT_ERR,
            IBV_WC_WR_FLUSH_ERR,
            IBV_WC_MW_BIND_ERR,
            IBV_WC_BAD_RESP_ERR,
            IBV_WC_LOC_ACCESS_ERR,
            IBV_WC_REM_INV_REQ_ERR,
            IBV_WC_REM_ACCESS_ERR,
            IBV_WC_REM_OP_ERR,
            IBV_WC_RETRY_EXC_ERR,
            IBV_WC_RNR_RETRY_EXC_ERR,
            IBV_WC_LOC_RDD_VIOL_ERR,
            IBV_WC_REM_INV_RD_REQ_ERR,
            IBV_WC_REM_ABORT_ERR,
            IBV_WC_INV_EECN_ERR,
            IBV_WC_INV_EEC_STATE_ERR,
            IBV_WC_FATAL_ERR,
            IBV_WC_RESP_TIMEOUT_ERR,
            IBV_WC_GENERAL_ERR,
        ];
        ALL.get(v as usize).copied().unwrap_or(IBV_WC_GENERAL_ERR)
    }

    /// True for `IBV_WC_SUCCESS`.
    pub fn is_success(self) -> bool {
        self == WcStatus::IBV_WC_SUCCESS
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Completion opcode (`enum ibv_wc_opcode`).
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    #[default]
    IBV_WC_SEND,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RDMA_READ,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_BIND_MW,
    /// A receive completed by a SEND, SEND_WITH_IMM or SEND_WITH_INV.
    IBV_WC_RECV,
    /// A receive completed by an RDMA_WRITE_WITH_IMM.
    IBV_WC_RECV_RDMA_WITH_IMM,
    /// A [`SendOp::LocalInv`] completed.
    IBV_WC_LOCAL_INV,
}

/// A work completion (`struct ibv_wc`), the subset every provider fills.
///
/// For error completions other than the first one of a QP, only `wr_id`, `status` and `qp_num`
/// are meaningful (as in verbs, where `opcode` and `byte_len` are undefined on flush errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed work request.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred (RDMA READ), in bytes.
    pub byte_len: u32,
    /// Immediate data of a SEND_WITH_IMM / RDMA_WRITE_WITH_IMM (host byte order), if any.
    pub imm_data: Option<u32>,
    /// Number of the local QP the WR belonged to (receive completions on an SRQ tell which QP).
    pub qp_num: u32,
    /// Remote QP number (receive completions; 0 otherwise).
    pub src_qp: u32,
    /// Vendor-specific error syndrome (0 when not provided).
    pub vendor_err: u32,
    /// The rkey a SEND_WITH_INV invalidated at this receiver: `Some` exactly when verbs sets
    /// `IBV_WC_WITH_INV` in `wc_flags` (receive completions only).
    pub invalidated_rkey: Option<u32>,
}

/// QP state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: nothing can be posted.
    Reset,
    /// Receives may be posted; nothing is processed.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send (and receive).
    Rts,
    /// Send queue drain (not used by this project).
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: every outstanding and newly posted WR completes with `IBV_WC_WR_FLUSH_ERR`.
    Err,
}

/// Capacities of a QP's work queues (`struct ibv_qp_cap`), in WQEs / SGEs / bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth in WQEs.
    pub max_send_wr: u32,
    /// Receive queue depth in WQEs (ignored when the QP uses an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR (ignored with an SRQ).
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    /// 256 send WQEs, 256 receive WQEs, 4 SGEs each way, 64 bytes inline.
    fn default() -> Self {
        QpCap { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 }
    }
}

/// Global route header fields of an address vector (`struct ibv_global_route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of the local (source) GID in the port's GID table.
    pub sgid_index: u8,
    /// Flow label (0 = none).
    pub flow_label: u32,
    /// Hop limit (1 is enough on one subnet; 64 for routed RoCEv2).
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// Address vector of the remote end (`struct ibv_ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Local port number (1-based).
    pub port_num: u8,
    /// Global route; mandatory on RoCE and on the software NIC.
    pub grh: Option<GlobalRoute>,
}

/// A QP state transition with the attributes it sets (`ibv_modify_qp`). Fields left `None` are
/// not in the attribute mask.
///
/// What verbs requires for an RC QP (`man ibv_modify_qp`):
/// - RESET → INIT: `port_num`, `pkey_index`, `access`.
/// - INIT → RTR: `ah`, `path_mtu`, `dest_qp_num`, `rq_psn`, `max_dest_rd_atomic`, `min_rnr_timer`.
/// - RTR → RTS: `sq_psn`, `timeout`, `retry_cnt`, `rnr_retry`, `max_rd_atomic`.
/// - any → ERR or RESET: nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: QpState,
    /// Port (1-based).
    pub port_num: Option<u8>,
    /// P_Key index.
    pub pkey_index: Option<u16>,
    /// Remote access allowed to this QP.
    pub access: Option<AccessFlags>,
    /// Path MTU: the minimum of both ports' active MTU.
    pub path_mtu: Option<Mtu>,
    /// Remote QP number.
    pub dest_qp_num: Option<u32>,
    /// Expected PSN of the first incoming packet (24 bits).
    pub rq_psn: Option<u32>,
    /// PSN of the first outgoing packet (24 bits).
    pub sq_psn: Option<u32>,
    /// Remote address.
    pub ah: Option<AhAttr>,
    /// Max RDMA READ / atomic this QP accepts in flight as target.
    pub max_dest_rd_atomic: Option<u8>,
    /// Max RDMA READ / atomic this QP issues in flight as initiator.
    pub max_rd_atomic: Option<u8>,
    /// RNR NAK timer code (0..=31; 12 = 0.64 ms, verbs table).
    pub min_rnr_timer: Option<u8>,
    /// Local ACK timeout code: 4.096 µs × 2^timeout (0 = infinite; 14 ≈ 67 ms).
    pub timeout: Option<u8>,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR` (0..=7).
    pub retry_cnt: Option<u8>,
    /// RNR retries before `IBV_WC_RNR_RETRY_EXC_ERR` (0..=7; 7 = retry forever).
    pub rnr_retry: Option<u8>,
}

impl QpAttr {
    /// A transition to `state` that sets nothing else.
    pub fn new(state: QpState) -> QpAttr {
        QpAttr {
            state,
            port_num: None,
            pkey_index: None,
            access: None,
            path_mtu: None,
            dest_qp_num: None,
            rq_psn: None,
            sq_psn: None,
            ah: None,
            max_dest_rd_atomic: None,
            max_rd_atomic: None,
            min_rnr_timer: None,
            timeout: None,
            retry_cnt: None,
            rnr_retry: None,
        }
    }
}

/// Initial attributes of an SRQ (`struct ibv_srq_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqInitAttr {
    /// Depth in WQEs.
    pub max_wr: u32,
    /// SGEs per receive WR.
    pub max_sge: u32,
}
