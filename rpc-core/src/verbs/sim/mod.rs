//! The software NIC: an RC NIC with the semantics of verbs, between hosts of one process or of
//! several processes of one machine (through shared memory), so that everything above the verbs
//! layer runs, and fails, the way it does on hardware.
//!
//! # Model
//!
//! - [`Sim::devices`] lists one device, `sim0`. Every [`Sim::open`] creates a new, independent
//!   **host**: its own GID (`fe80::<pid>:<host id>`: bytes 8..12 the process id, 12..16 the host
//!   id; RoCE v1 at index 0 and RoCE v2 at index [`SIM_GID_INDEX`] of port 1's GID table, which
//!   has five entries of several addresses and types, as a RoCE NIC's, so that
//!   [`choose_gid`](crate::verbs::gid::choose_gid) is tested on sim; the fabric delivers to the
//!   host's own GID only), LID (= host id, meaningful inside the process only),
//!   key space and QP numbers; port 1 is `Active`, link layer [`LinkLayer::Sim`], MTU 4096.
//!   Hosts find each other by GID (or LID without a GRH, in-process only) and QPN: the first
//!   packet of a QP resolves the `ah`/`dest_qp_num` given at RTR, as the network would deliver
//!   it — to a host of this process through the process-wide fabric, or to a host of another
//!   process by mapping its **host segment** (below).
//! - **Host segments.** Everything a peer touches lives in a shared-memory segment per host
//!   (`/dev/shm/rpc-sim.<uid>.<pid>.<host id>`, created `O_EXCL` with mode 0600, sparse, mapped
//!   `MAP_SHARED`): the MR key table, every MR buffer allocated by `reg_mr`, the QP directory and
//!   each QP's responder state (state, access, expected PSN, send-queue guard), the RQ/SRQ rings
//!   and the CQs (ring, overrun flag, event word). The same data structures and the same code
//!   serve a peer in this process and a peer in another: an rkey and an address resolve through
//!   the responder's key table to the responder's segment as mapped by the requester, with
//!   bounds and access checked. The data path makes no system call either way (a CQ's event
//!   path wakes a waiter with a futex). Memory from `reg_user_mr` is not in the segment, and
//!   neither is its address: the pointer lives in a table private to the owner's process (the
//!   shared key table marks the key as caller memory and holds no pointer), so a peer process
//!   that corrupts the segment cannot make the owner follow a pointer of its choosing; peers in
//!   other processes get a remote access error for such a region.
//! - **Peer processes.** A requester maps a peer host's segment on first contact (found by the
//!   GID's pid and host id; only a file of the same user with mode 0600 and the expected header
//!   is accepted): only the part in use (the segment header's `size`, a power of two from
//!   16 MiB, grown by the owner before it allocates past it), not the 256 GiB reservation, so
//!   that a server process can map the segments of thousands of client processes (the whole
//!   reservation each held 47 bits of address space to about 500). A transfer that meets
//!   memory past its mapping (a region or receive buffer registered since) maps the segment
//!   again, larger, and retries before anything changed; the old mapping stays until no view
//!   uses it. At most 4096 peer processes map one host at once (its reader table, see below). A monitor thread per process (`sim-shm-monitor`, asleep between 100 ms ticks)
//!   writes its hosts' heartbeats into their segments and checks mapped peers: when a peer's pid
//!   is gone (or its heartbeat is older than 10 s) its host is marked dead in the segment, its
//!   file unlinked, and the mapping dropped once unused; packets to it are then lost, so WRs to
//!   it fail with `IBV_WC_RETRY_EXC_ERR` and the requester QP goes to ERR (flushing the rest),
//!   as after a crashed machine. The owner unlinks its segments when a host is dropped and at
//!   process exit (`atexit`); a process killed outright leaves its files to the peers' monitors
//!   or, failing those, to the next process that opens a host (segments of dead pids of the
//!   same user are removed then).
//! - **Trust model**: the processes sharing hosts are processes of one machine and one user,
//!   which trust each other as threads of one program do: a peer can read and write every MR of
//!   a host it connects to (keys and bounds are checked as a NIC checks them, to catch bugs, not
//!   attacks) and can corrupt the segments it maps. Other users cannot open the segments (0600,
//!   owner and mode verified before mapping). Use `rdma` or TCP between users or machines.
//! - **The requester's thread is the NIC.** A send WR executes in `post_send` when nothing is
//!   queued ahead of it: the payload is copied straight from the requester's MR (or inline bytes)
//!   into the responder's posted receive buffer or target MR, and the completions are pushed
//!   into lock-free bounded CQ rings. WRs that must wait (RNR back-off, retransmission) stay
//!   queued in order and are retried by the fabric's timer thread (`sim-nic-timers`, idle unless
//!   some QP is backing off), which plays the NIC's autonomous part.
//! - Completions become visible only through [`CompletionQueue::poll`] (never returned by
//!   `post_*`). The hot path (post, execute, poll) takes no blocking lock, allocates nothing and
//!   makes no system call: a CAS on the QP's send-queue guard (uncontended; the counterpart of
//!   the spinlock in mlx5's `ibv_post_send`), key lookups in a fixed array
//!   (`slot | generation << 16`), lock-free ring operations on the responder's receive queue and
//!   CQ, laid out so that a message moves as few cache lines between cores as possible.
//! - **Capacities**: a CQ holds exactly the `cqe` asked for; a QP's send queue is rounded up to
//!   a power of two; receive queues (RQ, SRQ) are granted twice the depth asked, rounded up to a
//!   power of two (verbs may grant more than asked; the spare depth lets the poster see the
//!   consumer's progress once per lap instead of at every post). [`QueuePair::cap`] and
//!   [`SharedReceiveQueue::max_wr`] report what was granted.
//!
//! # Semantics (as on an RC NIC)
//!
//! - **Keys, access, bounds** are checked on every access. Local gather/scatter: unknown lkey,
//!   other PD or out of bounds → `IBV_WC_LOC_PROT_ERR`. RDMA WRITE/READ: rkey not valid for the
//!   responder QP's PD, out of bounds or without `REMOTE_WRITE`/`REMOTE_READ` on the MR →
//!   `IBV_WC_REM_ACCESS_ERR` at the requester; the responder QP lacking the access flag →
//!   `IBV_WC_REM_INV_REQ_ERR`. Zero-length RDMA operations check no rkey (IBA 9.4.4/9.4.5).
//! - **Errors** complete the failing WR with its status (signaled or not), move the requester QP
//!   to ERR, and complete every other outstanding send WR and every RQ WR of that QP with
//!   `IBV_WC_WR_FLUSH_ERR` (signaled or not). A responder-side error also moves the responder QP
//!   to ERR (rxe's `do_class_ac_error`; mlx5 does the same).
//! - **Receive too small**: the receive WQE completes with `IBV_WC_LOC_LEN_ERR` at the responder
//!   (as `man ibv_poll_cq` describes it) and the responder QP goes to ERR; the SEND completes
//!   with `IBV_WC_REM_INV_REQ_ERR` at the requester (the "invalid request" NAK). Nothing is
//!   written into the too-small buffer. Soft-RoCE differs: rxe of Linux 6.1 (the CI guest)
//!   reports `IBV_WC_LOC_QP_OP_ERR` / `IBV_WC_REM_OP_ERR` (its "malformed WQE" path), and the
//!   conformance suite accepts those on devices only. A receive WQE with a bad lkey:
//!   `IBV_WC_LOC_PROT_ERR` at the responder (rxe says `IBV_WC_LOC_QP_OP_ERR`),
//!   `IBV_WC_REM_OP_ERR` at the requester.
//! - **Memory windows** (type 2): bound to a QP by a BIND_MW work request, usable only by
//!   requests arriving on that QP, within the bound range and rights; LOCAL_INV and a received
//!   SEND_WITH_INV invalidate them. The checks, and what QP errors, QP destruction and MR
//!   deregistration do to bound windows, are listed in `sim/mw.rs`; window keys live in the key
//!   table of the host segment, so a requester in another process checks them too. A window
//!   over caller memory (`reg_user_mr`) is reachable in the owner's process only, as its MR is.
//! - **Receive WQEs**: SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM consume one, from the QP's SRQ
//!   or RQ, in order; the receive completion carries `byte_len`, `imm_data`, `qp_num` (the
//!   receiving QP, which tells SRQ users which QP it was) and `src_qp`.
//! - **RNR**: no receive WQE posted → the WR waits the *responder's* `min_rnr_timer` (IBA table:
//!   code 1 = 10 µs … 12 = 0.64 ms … 0 = 655 ms) and retries, `rnr_retry` times (7 = forever),
//!   then fails with `IBV_WC_RNR_RETRY_EXC_ERR`. Later WRs of the QP wait behind it.
//! - **Lost packets** (peer QP destroyed, not in RTR/RTS, host vanished, PSN mismatch, injected
//!   drop): retried after the local ACK timeout (4.096 µs × 2^`timeout`; 0 = wait forever),
//!   `retry_cnt` times, then `IBV_WC_RETRY_EXC_ERR`.
//! - **PSNs**: each message uses `max(1, ceil(len / path_mtu))` PSNs; the responder accepts only
//!   its expected PSN (`rq_psn` at RTR), so mismatched PSNs fail like on hardware.
//! - **Order**: WRs of one QP execute and complete in order; unsignaled successful WRs produce no
//!   CQE. **CQ overflow** loses the completion and makes every later `poll` fail with
//!   [`VerbsError::CqOverrun`] (the CQ is unusable, as after `IBV_EVENT_CQ_ERR`).
//! - **States**: `post_send` before RTS → [`VerbsError::BadQpState`]; `post_recv` in RESET →
//!   `BadQpState`; posting in ERR is accepted and flushed, as on mlx5 and rxe. `modify` checks
//!   the transition and the attribute mask as `ibv_modify_qp` documents (missing or extra
//!   attributes are named in the error).
//! - **Destroy** (drop) with WRs outstanding discards them without completions; peers' packets
//!   to it are lost from then on. Dropping a QP or an MR waits until no transfer can still be
//!   using it (a peer's SEND into the QP's receive buffers included), so the memory is the
//!   caller's again when the drop returns: in this process by quiescence (every transfer runs
//!   under its requester's QP guard), for peer processes by an epoch grace period (each pins
//!   its transfers in a reader slot of the responder's segment; the owner advances the
//!   segment's epoch and waits for the pins older than it, skipping dead peers). Segment memory
//!   freed this way is reusable at once.
//! - **Events**: a CQ created with events supports `req_notify`/`wait` (a condition variable on
//!   the event path only; a CQ without events never touches it).
//! - **Inline** sends copy the payload at post time (up to `max_inline_data`, at most 256 bytes).
//! - **Send-queue slots**: a send WQE (BIND_MW and LOCAL_INV included), signaled or not, holds its slot until a signaled
//!   completion at or after it (or an error or flush completion, which every WR gets) has been
//!   *polled* from the send CQ, as mlx5's `ibv_poll_cq` retires WQEs; generating the CQE is not
//!   enough. With `max_send_wr` WQEs outstanding, `post_send` fails with
//!   [`VerbsError::BadWorkRequest`] "the work queue is full (ENOMEM ...)", the error the
//!   `ibverbs` provider gives for ENOMEM; WRs before it in the list were posted. A move to RESET
//!   frees every slot. [`set_send_queue_mode`] (or `RPC_SIM_SQ_RETIRE=execute`) restores the
//!   sim's former leniency (a slot is free once its WR has executed) for code not ready yet.
//!
//! # Departures from hardware
//!
//! - **Send-queue memory**: a NIC's send queue is a ring of `max_send_wr` WQEs allocated at
//!   creation; the sim's depth is the same (what a post is refused beyond), but it stores only
//!   the WQEs that wait to execute (a WR executed at once at post is never stored), in storage
//!   that starts empty and doubles, up to the depth, when more wait at once than it holds (the
//!   QP keeps it until destroyed). An idle QP of a 256-WQE send queue holds none of the 51 KiB
//!   of WQEs and 64 KiB of inline arena a full ring would take. [`SimStats::sq_storage_bytes`]
//!   and [`SimQp::sq_storage_wqes`] show it.
//!
//! - Delivery is synchronous with the requester's execution: a successful SEND's data and
//!   receive CQE are in place before `post_send` returns (still visible only through `poll`), and
//!   a send completion does not wait for an ACK.
//! - RDMA READ is performed at once by the requester (no `max_rd_atomic` limit on outstanding
//!   READs, which cannot be outstanding here); atomics, type-1 memory windows, UD/UC, SQD are
//!   absent. A LOCAL_INV completes once the rkey is invalid; a transfer of the peer that had
//!   resolved the rkey just before may still be copying (a SEND_WITH_INV from the peer has no
//!   such window: the peer's transfers run in order).
//! - Receive completions for a QP forced to ERR can race with a transfer already executing, so
//!   one successful receive CQE may follow its flush CQEs.
//! - Ports have no P_Key table; `pkey_index` is accepted and ignored.
//! - Across processes: a responder in another process whose QP goes to ERR through a peer's
//!   transfer (a responder-side error) has its RQ flushed at once, and its send queue flushed
//!   at its next post or timer tick.
//!
//! # Fault injection
//!
//! [`SimQp::set_drop_traffic`], [`SimQp::set_delay`], [`SimQp::force_error`] and
//! [`SimContext::vanish`] (see their docs): for tests of the retry, error, slow-path and
//! peer-death paths.

mod cq;
mod epoch;
mod exec;
mod fabric;
mod fault;
mod guard;
mod host;
mod mr;
mod mw;
mod peer;
mod qp;
mod remote;
mod ring;
mod shm;
mod sqslots;
mod srq;
mod stats;

pub use cq::SimCq;
pub use host::{set_memory_windows, SimContext, SimPd, SIM_GID_INDEX};
pub use mr::SimMr;
pub use mw::SimMw;
pub use qp::SimQp;
pub use sqslots::{send_queue_mode, set_send_queue_mode, SendQueueMode};
pub use srq::SimSrq;
pub use stats::{stats, SimStats};

#[allow(unused_imports)] // Linked from the docs above.
use crate::verbs::{CompletionQueue, LinkLayer, QueuePair, SharedReceiveQueue};
use crate::verbs::{DeviceInfo, DeviceSelector, Provider, Result, VerbsError};

/// Max SGEs per WR (send and receive), the sim's `max_sge` / `max_srq_sge`.
pub const MAX_SGE: usize = 8;
/// Max inline payload per send WR, in bytes (`max_inline_data`).
pub const MAX_INLINE: usize = 256;
/// Max WQEs per QP work queue (`max_qp_wr`).
pub const MAX_QP_WR: u32 = 16384;
/// Max WQEs per SRQ (`max_srq_wr`).
pub const MAX_SRQ_WR: u32 = 16384;
/// Max CQEs per CQ (`max_cqe`).
pub const MAX_CQE: u32 = 65536;

/// The software NIC provider (`NAME = "sim"`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sim;

impl crate::verbs::Sealed for Sim {}

impl Provider for Sim {
    const NAME: &'static str = "sim";
    type Context = SimContext;
    type ProtectionDomain = SimPd;
    type MemoryRegion = SimMr;
    type MemoryWindow = SimMw;
    type CompletionQueue = SimCq;
    type SharedReceiveQueue = SimSrq;
    type QueuePair = SimQp;

    /// One device, `sim0`.
    fn devices() -> Result<Vec<DeviceInfo>> {
        Ok(vec![DeviceInfo { index: 0, name: "sim0".into(), guid: 0 }])
    }

    /// Creates a new host on the fabric (every call: a new GID, LID and key space) with its
    /// shared-memory segment in /dev/shm.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`] for a selector other than `sim0` / index 0 / first;
    /// [`VerbsError::Os`] when the host segment cannot be created or mapped (e.g. /dev/shm
    /// missing or not writable).
    fn open(selector: &DeviceSelector) -> Result<SimContext> {
        let ok = match selector {
            DeviceSelector::First => true,
            DeviceSelector::Name(n) => n == "sim0",
            DeviceSelector::Index(i) => *i == 0,
        };
        if !ok {
            return Err(VerbsError::NoDevice { wanted: format!("{selector:?}"), found: vec!["sim0".into()] });
        }
        let host = fabric::fabric().new_host()?;
        stats::count_context_opened();
        Ok(SimContext { host })
    }
}
