//! Errors of the verbs layer.

use super::types::QpState;

/// An error from a verbs call. Names the call (as in libibverbs, e.g. `ibv_modify_qp`) and what it
/// was doing, and carries the OS error where the provider returned one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// No device matched (or none exists). `found` lists what the provider has.
    #[error("no RDMA device {wanted}; found: [{}]; without an RDMA NIC use the software NIC (transport `sim`)", found.join(", "))]
    NoDevice {
        /// What was asked for (name, index, or "at all").
        wanted: String,
        /// Names of the devices the provider lists.
        found: Vec<String>,
    },
    /// The running kernel has no RDMA support at all (`ibv_get_device_list` gave ENOSYS).
    #[error("no RDMA support in this kernel (ibv_get_device_list: ENOSYS); use the software NIC (transport `sim`)")]
    NoKernelSupport,
    /// A requested size exceeds a device capability.
    #[error("{what}: requested {requested} but the device's {cap} is {limit}")]
    CapExceeded {
        /// What was being created (e.g. "create_qp max_send_wr").
        what: &'static str,
        /// Name of the capability (e.g. `max_qp_wr`).
        cap: &'static str,
        /// Requested value.
        requested: u64,
        /// Device limit.
        limit: u64,
    },
    /// Registering memory failed because the locked-memory limit is too small.
    #[error("ibv_reg_mr failed: registering this memory needs {needed} bytes locked, but the locked-memory limit (ulimit -l) is {limit}; raise it (e.g. `ulimit -l unlimited`, or memlock in /etc/security/limits.conf)")]
    MemlockLimit {
        /// Bytes of locked memory the process needs with this registration (all its MRs).
        needed: u64,
        /// The current RLIMIT_MEMLOCK, human-readable ("unlimited" or "N bytes").
        limit: String,
    },
    /// A QP transition failed.
    #[error("{call}: QP {qp_num} {from:?} -> {to:?} failed (attribute mask {mask:#x}): {reason}")]
    QpTransition {
        /// The C call (`ibv_modify_qp`) or check that failed.
        call: &'static str,
        /// The QP number.
        qp_num: u32,
        /// State before.
        from: QpState,
        /// Target state.
        to: QpState,
        /// The verbs attribute mask (`enum ibv_qp_attr_mask` bits) that was used.
        mask: u32,
        /// Why (OS error text or the missing/invalid attribute).
        reason: String,
    },
    /// Posting to a QP in a state that does not accept the WR.
    #[error("{call}: QP {qp_num} is in state {state:?}, which does not accept this work request")]
    BadQpState {
        /// `ibv_post_send` or `ibv_post_recv`.
        call: &'static str,
        /// QP number.
        qp_num: u32,
        /// Its current state.
        state: QpState,
    },
    /// A work request was rejected at post time (too many SGEs, queue full, inline too long, ...).
    /// WRs before `index` were posted; `index` and later were not.
    #[error("{call}: work request #{index} rejected: {reason}")]
    BadWorkRequest {
        /// `ibv_post_send`, `ibv_post_recv` or `ibv_post_srq_recv`.
        call: &'static str,
        /// Index of the first WR not posted.
        index: usize,
        /// Why.
        reason: String,
    },
    /// The CQ overflowed: completions were lost and the CQ is unusable (as `IBV_EVENT_CQ_ERR`).
    #[error("completion queue overrun: more than {cqe} CQEs outstanding")]
    CqOverrun {
        /// The CQ's capacity in CQEs.
        cqe: u32,
    },
    /// An invalid argument (bad GID index, bad port, out-of-range value), named.
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The call.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// Any other failed C call, with its OS error.
    #[error("{call} failed: {source}")]
    Os {
        /// The C call, e.g. `ibv_create_cq`.
        call: &'static str,
        /// The OS error (errno).
        #[source]
        source: std::io::Error,
    },
}

/// Result of a verbs call.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;
