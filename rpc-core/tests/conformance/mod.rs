//! The provider-generic verbs conformance suite: a [`Harness`] names a provider and how to open
//! two of its contexts; [`conformance_suite!`] expands every case of [`cases`] into a `#[test]`
//! for it. A provider without a device skips each test with a printed reason (never on `sim`,
//! where a skip is a failure).
//!
//! Posting work requests is `unsafe` by contract (buffers must outlive their WRs); the few
//! wrappers here ([`post_send`], [`post_recv`], [`post_srq_recv`]) are the only unsafe calls, and
//! every test keeps its MRs alive (in [`Node`]) until its WRs have completed or its QP is gone.
#![allow(dead_code, unsafe_code)]

pub mod cases;
pub mod mw;
pub mod xproc;

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use rpc_core::verbs::rc::{connect, Endpoint, RcConfig};
use rpc_core::verbs::{
    AccessFlags, CompletionQueue, Context, DeviceSelector, Gid, MemoryRegion, ProtectionDomain, Provider,
    QpCap, QpInitAttr, QueuePair, RecvWr, SendWr, SharedReceiveQueue, SrqInitAttr, WorkCompletion,
};

/// A provider under test and how to reach two of its hosts.
pub trait Harness: 'static {
    /// The provider.
    type P: Provider;

    /// Hang guard for polling loops (not a timing assertion). Default 10 s; an emulated guest
    /// may want more.
    const TIMEOUT: Duration = Duration::from_secs(10);

    /// The hang guard in effect: `RPC_TEST_TIMEOUT_SECS` if set, else [`Harness::TIMEOUT`].
    fn timeout() -> Duration {
        std::env::var("RPC_TEST_TIMEOUT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(Self::TIMEOUT, Duration::from_secs)
    }

    /// Two contexts to connect to each other (two hosts on `sim`; the same device opened twice
    /// on a NIC), or the reason the provider cannot run here.
    fn open_pair() -> Result<(Ctx<Self>, Ctx<Self>), String>;

    /// The local address of port 1: GID, LID, active MTU, and the RC configuration (GID index,
    /// link layer) to connect with it. The default is the runtime's automatic choice,
    /// [`select_gid`](rpc_core::verbs::gid::select_gid) with index -1.
    fn address(ctx: &Ctx<Self>) -> Address {
        let local = rpc_core::verbs::gid::select_gid::<Self::P>(ctx, 1, -1).expect("select_gid(port 1)");
        Address { gid: local.gid, lid: local.lid, mtu: local.active_mtu, cfg: local.rc_config() }
    }
}

/// The context type of a harness' provider.
pub type Ctx<H> = <<H as Harness>::P as Provider>::Context;
type P<H> = <H as Harness>::P;

/// What a side tells the other to connect (see [`Harness::address`]).
#[derive(Clone, Copy, Debug)]
pub struct Address {
    pub gid: Gid,
    pub lid: u16,
    pub mtu: rpc_core::verbs::Mtu,
    pub cfg: RcConfig,
}

/// Opens one device twice (two contexts, as two processes would): the harness for any
/// provider. The device is `RXE_DEV` (name or index, as `scripts/softroce-test` exports it) or
/// the provider's first one.
pub struct DeviceHarness<Pr>(PhantomData<Pr>);

impl<Pr: Provider> Harness for DeviceHarness<Pr> {
    type P = Pr;
    fn open_pair() -> Result<(Pr::Context, Pr::Context), String> {
        let hint = "no RDMA device: run scripts/softroce-test";
        let devices = Pr::devices().map_err(|e| format!("{hint} ({e})"))?;
        if devices.is_empty() {
            return Err(hint.into());
        }
        let sel: DeviceSelector = std::env::var("RXE_DEV").unwrap_or_default().parse().unwrap_or_default();
        let a = Pr::open(&sel).map_err(|e| format!("{hint} ({e})"))?;
        let b = Pr::open(&sel).map_err(|e| format!("{hint} ({e})"))?;
        Ok((a, b))
    }
}

/// Runs one case: opens the pair or prints why it is skipped. A skip is a failure on `sim` and
/// wherever `RPC_REQUIRE_RDMA=1` (inside the Soft-RoCE guest).
pub fn run<H: Harness>(name: &str, case: fn(Ctx<H>, Ctx<H>)) {
    let required = <P<H>>::NAME == "sim" || std::env::var("RPC_REQUIRE_RDMA").is_ok_and(|v| v == "1");
    match H::open_pair() {
        Ok((a, b)) => case(a, b),
        Err(reason) if required => panic!("{name} on {}: the provider must run here: {reason}", <P<H>>::NAME),
        Err(reason) => eprintln!("skipped {name} on {}: {reason}", <P<H>>::NAME),
    }
}

/// Expands every generic case into a `#[test]` for a harness:
/// `conformance_suite!(sim, conformance::DeviceHarness<rpc_core::verbs::sim::Sim>);`
macro_rules! conformance_suite {
    ($m:ident, $h:ty) => {
        mod $m {
            conformance_suite!(@cases $h;
                device_and_port_attributes,
                send_recv_delivers_bytes_and_metadata,
                send_with_imm_delivers_imm,
                rdma_write_lands_without_receive_completion,
                rdma_write_with_imm_consumes_receive,
                rdma_read_fetches_remote_bytes,
                zero_length_send_consumes_receive,
                sge_gather_on_send,
                sge_scatter_on_receive,
                inline_send_copies_at_post_time,
                inline_over_limit_is_rejected,
                multi_mtu_message,
                wrs_complete_in_order,
                unsignaled_wrs_produce_no_cqe,
                srq_shared_by_several_qps,
                bad_rkey_is_remote_access_error_and_flushes,
                write_without_remote_write_access_fails,
                read_without_remote_read_access_fails,
                write_out_of_bounds_fails,
                receive_too_small_is_local_length_error,
                bad_lkey_is_local_protection_error,
                post_send_before_rts_is_bad_state,
                post_recv_in_reset_is_bad_state,
                illegal_transition_is_refused,
                missing_attribute_is_refused,
                modify_to_err_flushes_receives,
                post_in_err_state_is_flushed_or_refused,
                destroy_qp_with_outstanding_wrs,
                two_threads_drive_two_qps,
                cq_overrun_is_reported,
                req_notify_and_wait,
                req_notify_needs_event_cq,
                rnr_waits_for_late_receive,
                send_queue_full_is_rejected,
                executed_unsignaled_wrs_hold_the_send_queue,
                send_queue_room_returns_when_the_signaled_completion_is_polled,
                flushed_completions_retire_send_queue_slots,
                write_then_send_is_ordered,
            );
            conformance_suite!(@mw_cases $h;
                mw_bind_then_write_and_read_through_it,
                mw_rkey_of_another_connection_is_refused,
                write_outside_the_window_inside_the_mr,
                write_past_the_mr_through_a_window_fails,
                window_rights_are_enforced,
                local_inv_kills_the_rkey_and_the_window_rebinds,
                send_with_inv_kills_the_rkey,
                bind_checks_the_mr,
                window_is_invalidated_and_rebound_from_another_qp,
                window_stays_bound_through_its_qps_error_and_reset,
            );
        }
    };
    (@mw_cases $h:ty; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run::<$h>(stringify!($case), $crate::conformance::mw::$case::<$h>)
            }
        )*
    };
    (@cases $h:ty; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run::<$h>(stringify!($case), $crate::conformance::cases::$case::<$h>)
            }
        )*
    };
}

// -------------------------------------------------------------------------------------------
// Fixtures.

/// Options of a [`Node`] and its QP.
#[derive(Clone, Copy, Debug)]
pub struct Opts {
    /// CQ depth (send and receive CQ each).
    pub cqe: u32,
    /// CQs with a completion channel.
    pub events: bool,
    /// QP capacities.
    pub cap: QpCap,
    /// Bytes of the node's MR.
    pub mr_len: usize,
    /// Access of the node's MR.
    pub mr_access: AccessFlags,
    /// Receive through an SRQ of this depth (0 = QP's own RQ).
    pub srq_depth: u32,
    /// RC parameters applied on top of the harness' configuration.
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    /// Remote access granted on the QP.
    pub qp_access: AccessFlags,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            cqe: 256,
            events: false,
            cap: QpCap {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            mr_len: 1 << 16,
            mr_access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            srq_depth: 0,
            rnr_retry: 7,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            qp_access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        }
    }
}

/// One side: a context with a PD, send and receive CQs, one MR, maybe an SRQ, and a QP. Fields
/// drop in order: the QP first, the context last.
pub struct Node<H: Harness> {
    pub qp: <P<H> as Provider>::QueuePair,
    pub srq: Option<<P<H> as Provider>::SharedReceiveQueue>,
    pub scq: <P<H> as Provider>::CompletionQueue,
    pub rcq: <P<H> as Provider>::CompletionQueue,
    pub mr: <P<H> as Provider>::MemoryRegion,
    pub pd: <P<H> as Provider>::ProtectionDomain,
    pub ctx: Ctx<H>,
    pub addr: Address,
    pub opts: Opts,
}

impl<H: Harness> Node<H> {
    /// A node on `ctx` with its QP in RESET.
    pub fn new(ctx: &Ctx<H>, opts: Opts) -> Node<H> {
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let scq = ctx.create_cq(opts.cqe, opts.events).expect("create_cq (send)");
        let rcq = ctx.create_cq(opts.cqe, opts.events).expect("create_cq (recv)");
        let mr = pd.reg_mr(opts.mr_len, opts.mr_access).expect("reg_mr");
        let srq = (opts.srq_depth > 0).then(|| {
            pd.create_srq(&SrqInitAttr { max_wr: opts.srq_depth, max_sge: opts.cap.max_recv_sge })
                .expect("create_srq")
        });
        let mut addr = H::address(ctx);
        addr.cfg.rnr_retry = opts.rnr_retry;
        addr.cfg.min_rnr_timer = opts.min_rnr_timer;
        addr.cfg.timeout = opts.timeout;
        addr.cfg.retry_cnt = opts.retry_cnt;
        addr.cfg.access = opts.qp_access;
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &scq,
                recv_cq: &rcq,
                srq: srq.as_ref(),
                cap: opts.cap,
                sq_sig_all: false,
            })
            .expect("create_qp");
        Node { qp, srq, scq, rcq, mr, pd, ctx: ctx.clone(), addr, opts }
    }

    /// Another QP on this node's PD and CQs (and SRQ), in RESET.
    pub fn extra_qp(&self) -> <P<H> as Provider>::QueuePair {
        self.pd
            .create_qp(&QpInitAttr {
                send_cq: &self.scq,
                recv_cq: &self.rcq,
                srq: self.srq.as_ref(),
                cap: self.opts.cap,
                sq_sig_all: false,
            })
            .expect("create_qp")
    }

    /// The endpoint of `qp` on this node, with send PSN `psn`.
    pub fn endpoint(&self, qp: &<P<H> as Provider>::QueuePair, psn: u32) -> Endpoint {
        Endpoint { qp_num: qp.qp_num(), psn, lid: self.addr.lid, gid: self.addr.gid, mtu: self.addr.mtu }
    }

    /// An SGE of this node's MR.
    pub fn sge(&self, offset: usize, len: u32) -> rpc_core::verbs::Sge {
        self.mr.sge(offset, len)
    }

    /// A copy of the MR's bytes (registered memory is read by copying, `MemoryRegion::read_at`).
    pub fn bytes(&self) -> Vec<u8> {
        self.read(0, self.mr.len())
    }

    /// A copy of `len` bytes of the MR at `offset`.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.mr.read_at(offset, &mut out).expect("read_at inside the MR");
        out
    }

    /// Copies `data` into the MR at `offset` (`MemoryRegion::write_at`).
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.mr.write_at(offset, data).expect("write_at inside the MR");
    }
}

/// Connects `qa` of `a` with `qb` of `b` (both RESET → RTS).
pub fn connect_qps<H: Harness>(
    a: &Node<H>,
    qa: &<P<H> as Provider>::QueuePair,
    b: &Node<H>,
    qb: &<P<H> as Provider>::QueuePair,
) {
    let ea = a.endpoint(qa, 0x100 + (qa.qp_num() & 0xffff));
    let eb = b.endpoint(qb, 0x200 + (qb.qp_num() & 0xffff));
    connect(qa, &a.addr.cfg, &ea, &eb).expect("connect a -> b");
    connect(qb, &b.addr.cfg, &eb, &ea).expect("connect b -> a");
}

/// Two connected nodes with the same options.
pub fn pair<H: Harness>(ca: &Ctx<H>, cb: &Ctx<H>, opts: Opts) -> (Node<H>, Node<H>) {
    let a = Node::<H>::new(ca, opts);
    let b = Node::<H>::new(cb, opts);
    connect_qps(&a, &a.qp, &b, &b.qp);
    (a, b)
}

/// Posts send WRs.
pub fn post_send<Q: QueuePair>(qp: &Q, wrs: &[SendWr<'_>]) -> rpc_core::verbs::Result<()> {
    // SAFETY: every test's SGEs lie in MRs owned by its `Node`s (or are inline), which live until
    // the test has polled the WRs' completions or destroyed the QP.
    unsafe { qp.post_send(wrs) }
}

/// Posts receive WRs to a QP's RQ.
pub fn post_recv<Q: QueuePair>(qp: &Q, wrs: &[RecvWr<'_>]) -> rpc_core::verbs::Result<()> {
    // SAFETY: as in `post_send`; the tests do not touch a posted receive buffer before its
    // completion.
    unsafe { qp.post_recv(wrs) }
}

/// Posts receive WRs to an SRQ.
pub fn post_srq_recv<S: SharedReceiveQueue>(srq: &S, wrs: &[RecvWr<'_>]) -> rpc_core::verbs::Result<()> {
    // SAFETY: as in `post_recv`.
    unsafe { srq.post_recv(wrs) }
}

/// Polls until `n` completions arrived, yielding between empty polls; panics after
/// `H::timeout()` (a hang guard) naming what it was waiting for.
pub fn poll_n<H: Harness, C: CompletionQueue>(cq: &C, n: usize, what: &str) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + H::timeout();
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let got = cq.poll(&mut buf[..want]).unwrap_or_else(|e| panic!("poll while waiting for {what}: {e}"));
        out.extend_from_slice(&buf[..got]);
        if got == 0 {
            assert!(
                Instant::now() < deadline,
                "timed out after {:?} waiting for {what}: {} of {n} completions: {out:?}",
                H::timeout(),
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// Polls one completion.
pub fn poll_one<H: Harness, C: CompletionQueue>(cq: &C, what: &str) -> WorkCompletion {
    poll_n::<H, C>(cq, 1, what)[0]
}

/// Polls a few times (yielding) and asserts that no completion is there.
pub fn assert_empty<C: CompletionQueue>(cq: &C, what: &str) {
    let mut buf = [WorkCompletion::default(); 4];
    for _ in 0..50 {
        let got = cq.poll(&mut buf).expect("poll");
        assert_eq!(got, 0, "{what}: unexpected completions {:?}", &buf[..got]);
        std::thread::yield_now();
    }
}

/// Waits (yielding) until `cond` holds; panics after `H::timeout()` naming `what`.
pub fn wait_until<H: Harness>(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + H::timeout();
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {:?} waiting for {what}", H::timeout());
        std::thread::yield_now();
    }
}

/// A deterministic test pattern of `len` bytes starting from `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i * 7 + i / 251) as u8)).collect()
}
