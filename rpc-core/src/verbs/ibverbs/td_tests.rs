//! Thread domains, parent domains, the post lock and single-threaded CQs.
//!
//! The first tests run on any host (no NIC): the fallback decision, the post lock, the post path's
//! use of it and the destruction order, with fake handles in place of libibverbs'. The last ones
//! need an RDMA device: they skip with a printed reason without one (and fail instead with
//! `RPC_REQUIRE_RDMA=1`); `scripts/softroce-test` runs them against Soft-RoCE, which has no thread
//! domains, so there they check the fallback path (run this library's unit tests with the filter
//! `verbs::ibverbs`: `SOFTROCE_TESTS="rpc_core:verbs::ibverbs::td"`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;

// ----------------------------------------------------------------------------- fallback decision

#[test]
fn not_offered_errnos_take_the_plain_path_quietly() {
    // What libibverbs' stub answers for a provider without the verb (rxe), what older providers
    // answer, and a NULL without an errno.
    for e in [libc::EOPNOTSUPP, libc::ENOTSUP, libc::ENOSYS, 0] {
        assert_eq!(offer_from(false, e), Offer::NotOffered, "errno {e}");
    }
}

#[test]
fn other_failures_are_reported_but_still_fall_back() {
    for e in [libc::ENOMEM, libc::EINVAL, libc::EPERM] {
        assert_eq!(offer_from(false, e), Offer::Failed(e), "errno {e}");
    }
}

#[test]
fn an_allocated_td_is_offered_whatever_errno_says() {
    // errno is stale after a success: it must not matter.
    for e in [0, libc::EOPNOTSUPP, libc::ENOMEM] {
        assert_eq!(offer_from(true, e), Offer::Offered, "errno {e}");
    }
}

// ----------------------------------------------------------------------------- the post lock

#[test]
fn post_lock_excludes_while_held_and_frees_on_drop() {
    let lock = PostLock::new();
    let guard = lock.lock();
    assert!(lock.try_lock().is_none(), "a held lock cannot be taken again");
    drop(guard);
    let again = lock.try_lock().expect("free after the guard is dropped");
    assert!(lock.try_lock().is_none(), "try_lock takes it too");
    drop(again);
    drop(lock.lock());
    assert!(lock.try_lock().is_some(), "lock() after drop leaves it free");
}

/// Two threads post through one lock, started together: no two critical sections overlap and no
/// update is lost. Each section yields in the middle, so that without the lock the other thread
/// gets in (on one core as on two).
#[test]
fn post_lock_serializes_threads() {
    const THREADS: usize = 2;
    const ROUNDS: usize = 2_000;
    let lock = PostLock::new();
    let start = std::sync::Barrier::new(THREADS);
    let inside = AtomicBool::new(false);
    let overlaps = AtomicUsize::new(0);
    // Read, yield, write back: a lost update shows when two sections interleave.
    let counter = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                start.wait();
                for _ in 0..ROUNDS {
                    let _g = lock.lock();
                    if inside.swap(true, Ordering::Relaxed) {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    let v = counter.load(Ordering::Relaxed);
                    std::thread::yield_now();
                    counter.store(v + 1, Ordering::Relaxed);
                    inside.store(false, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(overlaps.load(Ordering::Relaxed), 0, "critical sections overlapped");
    assert_eq!(counter.load(Ordering::Relaxed), THREADS * ROUNDS, "updates were lost");
}

// ----------------------------------------------------------------------------- fakes

/// Records destructions, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<&'static str>>>);

impl Log {
    fn push(&self, what: &'static str) {
        self.0.lock().unwrap().push(what);
    }
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

struct FakeHandle {
    what: &'static str,
    log: Log,
    freed: bool,
}

impl Dealloc for FakeHandle {
    const CALL: &'static str = "fake_dealloc";
    fn dealloc(&mut self) -> i32 {
        assert!(!self.freed, "{} freed twice", self.what);
        self.freed = true;
        self.log.push(self.what);
        0
    }
}

/// Stands for the device context: logged when the last holder lets go.
struct FakeContext(Log);

impl Drop for FakeContext {
    fn drop(&mut self) {
        self.0.push("context");
    }
}

/// Stands for `PdInner`: holds the context, freed ("PD") when the last holder lets go.
struct FakePd {
    log: Log,
    _ctx: Arc<FakeContext>,
}

impl Drop for FakePd {
    fn drop(&mut self) {
        self.log.push("PD");
    }
}

enum Fake {}

impl Domains for Fake {
    type Td = FakeHandle;
    type Parent = FakeHandle;
    type Context = Arc<FakeContext>;
    type Pd = Arc<FakePd>;
}

/// Stands for `IbvQueuePair`: destroys itself in `drop`, then lets its fields (the parent domain)
/// go, as the real one does.
struct FakeQp {
    log: Log,
    _domain: Arc<ParentDomain<Fake>>,
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        self.log.push("QP");
    }
}

/// A context, a PD, a TD and a parent domain on them, and a QP on the parent domain: each a
/// handle the test drops when it likes.
struct FakeStack {
    ctx: Arc<FakeContext>,
    pd: Arc<FakePd>,
    td: Arc<ThreadDomain<Fake>>,
    parent: Arc<ParentDomain<Fake>>,
    qp: FakeQp,
}

/// A [`FakeStack`], built the way `alloc_qp_domain` and `IbvQueuePair::create` build theirs.
fn fake_stack(log: &Log) -> FakeStack {
    let ctx = Arc::new(FakeContext(log.clone()));
    let pd = Arc::new(FakePd { log: log.clone(), _ctx: ctx.clone() });
    let td = Arc::new(ThreadDomain::<Fake>::new(
        FakeHandle { what: "TD", log: log.clone(), freed: false },
        ctx.clone(),
    ));
    let parent = Arc::new(ParentDomain::<Fake>::new(
        FakeHandle { what: "parent domain", log: log.clone(), freed: false },
        td.clone(),
        pd.clone(),
    ));
    let qp = FakeQp { log: log.clone(), _domain: parent.clone() };
    FakeStack { ctx, pd, td, parent, qp }
}

const ORDER: [&str; 5] = ["QP", "parent domain", "TD", "PD", "context"];

#[test]
fn destruction_order_holds_when_handles_go_first() {
    let log = Log::default();
    let FakeStack { ctx, pd, td, parent, qp } = fake_stack(&log);
    // The worst order for the handles: context, PD and TD first, the QP last.
    drop(ctx);
    drop(pd);
    drop(td);
    drop(parent);
    assert_eq!(log.take(), Vec::<&str>::new(), "the QP keeps everything alive");
    drop(qp);
    assert_eq!(log.take(), ORDER);
}

#[test]
fn destruction_order_holds_when_the_qp_goes_first() {
    let log = Log::default();
    let FakeStack { ctx, pd, td, parent, qp } = fake_stack(&log);
    drop(qp);
    assert_eq!(log.take(), ["QP"]);
    drop(parent);
    assert_eq!(log.take(), ["parent domain"], "the TD and PD have handles left");
    drop(pd);
    assert_eq!(log.take(), ["PD"], "nothing else holds the PD");
    drop(ctx);
    assert_eq!(log.take(), Vec::<&str>::new(), "the TD holds the context");
    drop(td);
    assert_eq!(log.take(), ["TD", "context"]);
}

// ----------------------------------------------------------------------------- the post path

#[test]
fn posts_on_a_thread_domain_hold_its_lock() {
    let log = Log::default();
    let FakeStack { pd, td, parent, .. } = fake_stack(&log);
    let held = posting(Some(&*parent), || td.post_lock.try_lock().is_none());
    assert!(held, "the post ran without the TD's post lock");
    assert!(td.post_lock.try_lock().is_some(), "the lock is released after the post");
    // Two parent domains on one TD share its lock (the TD's doorbell is shared).
    let other = ParentDomain::<Fake>::new(
        FakeHandle { what: "parent domain", log: log.clone(), freed: false },
        td.clone(),
        pd.clone(),
    );
    let guard = td.post_lock.lock();
    let (started, posted) = (AtomicBool::new(false), AtomicBool::new(false));
    let waited = std::thread::scope(|s| {
        let poster = s.spawn(|| {
            started.store(true, Ordering::Release);
            posting(Some(&other), || posted.store(true, Ordering::Release));
        });
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        // Give the poster time to (wrongly) get through; a lock that works keeps it out.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let kept_out = !posted.load(Ordering::Acquire);
        drop(guard);
        poster.join().unwrap();
        kept_out && posted.load(Ordering::Acquire)
    });
    assert!(waited, "a post on another parent domain of the same TD did not wait for the lock");
}

#[test]
fn posts_on_the_plain_pd_take_no_lock() {
    assert_eq!(posting::<Fake, _>(None, || 7), 7);
}

// ----------------------------------------------------------------------------- on a device

mod device {
    use std::time::{Duration, Instant};

    use super::super::super::{IbvCompletionQueue, IbvContext, IbvQueuePair, Ibverbs};
    use crate::verbs::gid::select_gid;
    use crate::verbs::rc::connect;
    use crate::verbs::{
        AccessFlags, CompletionQueue, Context, DeviceSelector, MemoryRegion, ProtectionDomain, Provider,
        QpCap, QpInitAttr, QpState, QueuePair, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WorkCompletion,
    };

    fn open_or_skip(test: &str) -> Option<IbvContext> {
        let selector: DeviceSelector =
            std::env::var("RXE_DEV").unwrap_or_default().parse().unwrap_or_default();
        match Ibverbs::open(&selector) {
            Ok(ctx) => Some(ctx),
            Err(e) if std::env::var("RPC_REQUIRE_RDMA").is_ok_and(|v| v == "1") => {
                panic!("RPC_REQUIRE_RDMA=1 but no usable RDMA device: {e}")
            }
            Err(e) => {
                eprintln!(
                    "skipped {test}: {e}\n  this test needs an RDMA device; run it against Soft-RoCE with \
                     `SOFTROCE_TESTS=\"rpc_core:verbs::ibverbs::td\" scripts/softroce-test`, or on a NIC \
                     with RPC_REQUIRE_RDMA=1"
                );
                None
            }
        }
    }

    fn poll_n(cq: &IbvCompletionQueue, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut buf = [WorkCompletion::default(); 8];
        // A hang guard for the slow emulated guest, not a timing assertion.
        let deadline = Instant::now() + Duration::from_secs(60);
        while out.len() < n {
            let got = cq.poll(&mut buf).expect("poll");
            out.extend_from_slice(&buf[..got]);
            if got == 0 {
                assert!(Instant::now() < deadline, "{} of {n} completions: {out:?}", out.len());
                std::thread::yield_now();
            }
        }
        out
    }

    /// The context reports what PDs get; Soft-RoCE has no thread domain, so there QPs are on the
    /// plain PD and traffic takes the plain path.
    #[test]
    fn lock_elision_matches_what_pds_get_and_qps_carry_traffic() {
        let Some(ctx) = open_or_skip("lock_elision_matches_what_pds_get_and_qps_carry_traffic") else {
            return;
        };
        let le = ctx.lock_elision();
        if ctx.inner.soft_roce {
            assert!(!le.thread_domain, "rxe has no thread domains: {le:?}");
        }
        let pd = ctx.alloc_pd().expect("alloc_pd");
        assert_eq!(pd.has_thread_domain(), le.thread_domain, "{pd:?} vs {le:?}");
        assert_eq!(pd.qp_domain().is_some(), le.thread_domain);

        // SAFETY: this test's thread is the only one to poll, arm or wait on the CQ, and to create,
        // modify or destroy the QPs on it.
        let cq = unsafe { ctx.create_cq_single_threaded(64, false) }.expect("single-threaded CQ");
        let init = QpInitAttr::<Ibverbs> {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        };
        let a: IbvQueuePair = pd.create_qp(&init).expect("create_qp a");
        let b: IbvQueuePair = pd.create_qp(&init).expect("create_qp b");
        assert_eq!(format!("{a:?}").contains("thread_domain: true"), le.thread_domain, "{a:?}");
        let local = select_gid::<Ibverbs>(
            &ctx,
            1,
            std::env::var("RXE_GID_IDX").ok().and_then(|s| s.parse().ok()).unwrap_or(-1),
        )
        .expect("select_gid");
        let ea = local.endpoint(a.qp_num(), 0x100);
        let eb = local.endpoint(b.qp_num(), 0x200);
        connect(&a, &local.rc_config(), &ea, &eb).expect("connect a");
        connect(&b, &local.rc_config(), &eb, &ea).expect("connect b");
        assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));

        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mut src = pd.reg_mr(4096, rw).expect("reg_mr");
        let dst = pd.reg_mr(4096, rw).expect("reg_mr");
        src.write_at(0, b"through the post path").unwrap();
        for round in 0..4u64 {
            // SAFETY: SGEs in live MRs of this PD, untouched until their completions are polled.
            unsafe {
                b.post_recv(&[RecvWr { wr_id: 100 + round, sg_list: &[dst.sge(0, 64)] }]).unwrap();
                a.post_send(&[SendWr {
                    wr_id: round,
                    sg_list: &[src.sge(0, 21)],
                    op: SendOp::Send,
                    flags: SendFlags::SIGNALED,
                }])
                .unwrap();
            }
            let wcs = poll_n(&cq, 2);
            assert!(wcs.iter().all(|w| w.status.is_success()), "{wcs:?}");
            let recv = wcs.iter().find(|w| w.wr_id == 100 + round).expect("recv");
            assert_eq!((recv.opcode, recv.byte_len), (WcOpcode::IBV_WC_RECV, 21));
        }
        let mut got = [0u8; 21];
        dst.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"through the post path");
        eprintln!(
            "{}: lock elision {le:?}; single-threaded CQ accepted: {}",
            ctx.device_name(),
            cq.is_single_threaded()
        );
        if ctx.inner.soft_roce {
            // rxe has `ibv_create_cq_ex` and takes the flag (it keeps its own lock regardless), so
            // Soft-RoCE runs the extended-CQ path, not the fallback.
            assert!(cq.is_single_threaded(), "{cq:?}");
        }
        // The QPs go first (they hold the parent domain, if any), then the PD's handle, the CQ.
        drop((a, b));
    }

    /// A single-threaded CQ (or its plain fallback) behaves as a CQ: capacity, empty poll, events.
    #[test]
    fn single_threaded_cq_or_its_fallback_works() {
        let Some(ctx) = open_or_skip("single_threaded_cq_or_its_fallback_works") else { return };
        // SAFETY: only this thread touches the CQ.
        let (cq, log) = captured(|| unsafe { ctx.create_cq_single_threaded(16, true) });
        let cq = cq.expect("single-threaded CQ with events");
        eprintln!("{}: {cq:?}\n{log}", ctx.device_name());
        if ctx.inner.soft_roce {
            assert!(cq.is_single_threaded(), "rxe has ibv_create_cq_ex and takes the flag:\n{log}");
        }
        assert!(cq.capacity() >= 16, "{cq:?}");
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut wc).expect("poll"), 0);
        cq.req_notify(false).expect("req_notify");
        assert!(!cq.wait(Some(Duration::from_millis(1))).expect("wait"), "no completion, no event");
        // Over the device's cap: the same checked error as `create_cq`.
        let max = ctx.attr().max_cqe;
        // SAFETY: as above (it is not created).
        let over = unsafe { ctx.create_cq_single_threaded(max.saturating_add(1), false) };
        assert!(over.is_err() || max == u32::MAX, "{over:?}");
    }

    /// Captures what `tracing` logs while `f` runs on this thread.
    fn captured<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || out.clone())
            .finish();
        let t = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
        (t, text)
    }

    /// Opening a context logs one `info` line saying what it got; a PD of a device without thread
    /// domains says at `debug` that its QPs use the plain PD.
    #[test]
    fn opening_logs_the_lock_elision_once() {
        let Some(probe) = open_or_skip("opening_logs_the_lock_elision_once") else { return };
        let selector = DeviceSelector::Name(probe.device_name().to_string());
        let (ctx, log) = captured(|| Ibverbs::open(&selector).expect("open"));
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("lock elision")).collect();
        assert_eq!(lines.len(), 1, "one line per opened context:\n{log}");
        eprintln!("{}", lines[0]);
        assert!(lines[0].contains("INFO"), "{}", lines[0]);
        let td = ctx.lock_elision().thread_domain;
        assert!(lines[0].contains(&format!("thread_domain={td}")), "{}", lines[0]);
        let (pd, log) = captured(|| ctx.alloc_pd().expect("alloc_pd"));
        if td {
            assert!(pd.has_thread_domain() || log.contains("WARN"), "{log}");
        } else {
            assert!(!pd.has_thread_domain());
            assert!(
                log.contains("DEBUG") && log.contains("plain PD"),
                "the fallback says so at debug:\n{log}"
            );
        }
    }
}
