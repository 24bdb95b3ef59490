//! Raw SEND/RECV ping-pong on the software NIC between two threads pinned to two cores, next to
//! a plain atomic cache-line ping-pong measured in the same run, and their ratio.
//!
//! `cargo bench -p rpc-core --bench sim_pingpong [-- --iters N --size BYTES --rounds R]`
//!
//! Each round measures both ping-pongs (atomic first, then sim) for `iters` round trips; a
//! sample is the mean round trip of a batch of 16 (so the clock read is amortised), and the
//! figures are the median and p99 of those samples in ns. The final line gives the medians over
//! all rounds and their ratio.
#![allow(unsafe_code)] // Posting WRs is `unsafe` by contract; see the SAFETY notes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use rpc_core::verbs::rc::{connect, Endpoint, RcConfig};
use rpc_core::verbs::sim::{Sim, SimCq, SimMr, SimQp};
use rpc_core::verbs::{
    AccessFlags, CompletionQueue, Context, DeviceSelector, LinkLayer, MemoryRegion, ProtectionDomain,
    Provider, QpCap, QpInitAttr, QueuePair, RecvWr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion,
};

const BATCH: usize = 16;

/// Busy-wait step: spin, and after many fruitless spins yield the core (the machine may be
/// shared; a descheduled peer would otherwise cost a whole time slice per round trip). The
/// yield is far off the common path and does not touch the medians on an idle machine.
#[inline]
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins % 4096 == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}
const RECV_DEPTH: usize = 64;

struct Args {
    /// `--profile-one-thread`: run only the one-thread loop (for a profiler).
    profile: bool,
    iters: usize,
    size: u32,
    rounds: usize,
}

fn args() -> Args {
    let mut a = Args { profile: false, iters: 200_000, size: 32, rounds: 3 };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let v = argv.get(i + 1).and_then(|s| s.parse::<usize>().ok());
        match (argv[i].as_str(), v) {
            ("--iters" | "-n", Some(v)) => a.iters = v.max(BATCH),
            ("--size" | "-s", Some(v)) => a.size = v.clamp(1, 1 << 20) as u32,
            ("--rounds", Some(v)) => a.rounds = v.max(1),
            ("--profile-one-thread" | "--profile-two-threads", _) => {
                a.profile = true;
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

/// The cores this process may use, read once before any thread is pinned (a pinned thread's
/// children inherit its one-core mask, and `get_core_ids` reports the calling thread's mask).
static CORES: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();

fn cores() -> &'static [core_affinity::CoreId] {
    CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

fn pin(core: usize) {
    let ids = cores();
    if let Some(id) = ids.get(core % ids.len().max(1)) {
        assert!(core_affinity::set_for_current(*id), "cannot pin a thread to core {}", id.id);
    }
}

/// Median and p99 of `samples` (ns per round trip).
fn stats(samples: &mut [f64]) -> (f64, f64) {
    (quantile(samples, 0.5), quantile(samples, 0.99))
}

/// The `q` quantile of `samples` (sorts them).
fn quantile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

#[repr(align(128))]
struct Line(AtomicU64);

/// Two threads bounce one cache line: the pinger writes odd values, the ponger even ones.
fn atomic_pingpong(iters: usize) -> Vec<f64> {
    let line = Arc::new(Line(AtomicU64::new(0)));
    let start = Arc::new(Barrier::new(2));
    let ponger = {
        let (line, start) = (line.clone(), start.clone());
        std::thread::spawn(move || {
            pin(1);
            start.wait();
            for i in 0..iters as u64 {
                let mut spins = 0;
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    backoff(&mut spins);
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    pin(0);
    start.wait();
    let mut samples = Vec::with_capacity(iters / BATCH);
    let mut i = 0u64;
    while (i as usize) + BATCH <= iters {
        let t = Instant::now();
        for _ in 0..BATCH {
            line.0.store(2 * i + 1, Ordering::Release);
            let mut spins = 0;
            while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                backoff(&mut spins);
            }
            i += 1;
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    // Let the ponger finish its remaining iterations.
    while (i as usize) < iters {
        line.0.store(2 * i + 1, Ordering::Release);
        let mut spins = 0;
        while line.0.load(Ordering::Acquire) != 2 * i + 2 {
            backoff(&mut spins);
        }
        i += 1;
    }
    ponger.join().expect("ponger");
    samples
}

/// One side of the SEND/RECV ping-pong: a QP with its own send and receive CQs and one MR
/// (send buffer at 0, receive slots after it).
struct Side {
    qp: SimQp,
    scq: SimCq,
    rcq: SimCq,
    mr: SimMr,
    size: u32,
    sent: u64,
}

impl Side {
    /// Receive slot `i % RECV_DEPTH`: contiguous buffers (the message size rounded up to a
    /// power of two, at least a cache line) after the send buffer, as a worker lays out its
    /// receive ring.
    fn recv_slot(&self, i: usize) -> rpc_core::verbs::Sge {
        self.mr.sge(slot_bytes(self.size) * (1 + i % RECV_DEPTH), self.size)
    }

    fn post_recv(&self, wr_id: u64) {
        let sge = [self.recv_slot(wr_id as usize)];
        // SAFETY: the slot lies in `self.mr`, which outlives the QP's work (the MR is dropped
        // after the QP, fields in order); the bench never touches a posted slot.
        unsafe { self.qp.post_recv(&[RecvWr { wr_id, sg_list: &sge }]) }.expect("post_recv");
    }

    fn send(&mut self) {
        // Signal one SEND in 32 and reap it, as perftest does, so the SQ never fills on NICs
        // that free slots on completion.
        let signaled = self.sent % 32 == 31;
        let flags = if signaled { SendFlags::SIGNALED } else { SendFlags::EMPTY };
        let sge = [self.mr.sge(0, self.size)];
        // SAFETY: as in `post_recv`; the send buffer is never written while posted.
        unsafe { self.qp.post_send(&[SendWr { wr_id: self.sent, sg_list: &sge, op: SendOp::Send, flags }]) }
            .expect("post_send");
        self.sent += 1;
        if signaled {
            let mut wc = [WorkCompletion::default(); 1];
            let mut spins = 0;
            while self.scq.poll(&mut wc).expect("poll send CQ") == 0 {
                backoff(&mut spins);
            }
            assert_eq!(wc[0].status, WcStatus::IBV_WC_SUCCESS);
        }
    }

    /// Busy-polls the receive CQ for one message; returns the slot's `wr_id` to repost.
    fn poll_recv(&self) -> u64 {
        let mut wc = [WorkCompletion::default(); 1];
        let mut spins = 0;
        while self.rcq.poll(&mut wc).expect("poll recv CQ") == 0 {
            backoff(&mut spins);
        }
        debug_assert_eq!(wc[0].byte_len, self.size);
        if wc[0].status != WcStatus::IBV_WC_SUCCESS {
            panic!("receive failed: {:?}", wc[0]);
        }
        wc[0].wr_id
    }

    /// Reposts the receive slot of a completed receive (the ring stays `RECV_DEPTH` deep).
    fn repost(&self, wr_id: u64) {
        self.post_recv(wr_id + RECV_DEPTH as u64);
    }
}

fn slot_bytes(size: u32) -> usize {
    (size as usize).next_power_of_two().max(64)
}

fn side(size: u32) -> (Side, Endpoint, RcConfig) {
    let ctx = Sim::open(&DeviceSelector::First).expect("open sim");
    let pd = ctx.alloc_pd().expect("pd");
    let scq = ctx.create_cq(256, false).expect("cq");
    let rcq = ctx.create_cq(256, false).expect("cq");
    let mr = pd.reg_mr(slot_bytes(size) * (1 + RECV_DEPTH), AccessFlags::LOCAL_WRITE).expect("mr");
    let cap = QpCap { max_send_wr: 128, max_recv_wr: RECV_DEPTH as u32, ..QpCap::default() };
    let qp = pd
        .create_qp(&QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: None, cap, sq_sig_all: false })
        .expect("qp");
    let port = ctx.query_port(1).expect("port");
    let gid = ctx.gid_table(1).expect("gid")[0].gid;
    let ep = Endpoint { qp_num: qp.qp_num(), psn: qp.qp_num() * 3, lid: port.lid, gid, mtu: port.active_mtu };
    let cfg = RcConfig { link_layer: LinkLayer::Sim, ..RcConfig::default() };
    (Side { qp, scq, rcq, mr, size, sent: 0 }, ep, cfg)
}

fn sim_pingpong(iters: usize, size: u32) -> Vec<f64> {
    let (mut a, ea, cfg) = side(size);
    let (mut b, eb, _) = side(size);
    connect(&a.qp, &cfg, &ea, &eb).expect("connect a");
    connect(&b.qp, &cfg, &eb, &ea).expect("connect b");
    for i in 0..RECV_DEPTH as u64 {
        a.post_recv(i);
        b.post_recv(i);
    }
    let start = Arc::new(Barrier::new(2));
    let ponger = {
        let start = start.clone();
        std::thread::spawn(move || {
            pin(1);
            start.wait();
            // Answer first, repost after (as a worker does: responses out, receives back in).
            for _ in 0..iters {
                let wr = b.poll_recv();
                b.send();
                b.repost(wr);
            }
            b
        })
    };
    pin(0);
    start.wait();
    // Ping, then repost the previous pong's slot while the ping is in flight, then wait.
    let mut samples = Vec::with_capacity(iters / BATCH);
    let mut done = 0;
    let mut last: Option<u64> = None;
    let mut round_trip = |a: &mut Side| {
        a.send();
        if let Some(wr) = last.take() {
            a.repost(wr);
        }
        last = Some(a.poll_recv());
    };
    while done + BATCH <= iters {
        let t = Instant::now();
        for _ in 0..BATCH {
            round_trip(&mut a);
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
        done += BATCH;
    }
    while done < iters {
        round_trip(&mut a);
        done += 1;
    }
    let b = ponger.join().expect("ponger");
    drop(b);
    samples
}

/// Both sides driven by one thread in turn: the software cost of a round trip (two SENDs, two
/// receive completions, two reposts) without any cache-line transfer between cores.
fn sim_one_thread(iters: usize, size: u32) -> Vec<f64> {
    let (mut a, ea, cfg) = side(size);
    let (mut b, eb, _) = side(size);
    connect(&a.qp, &cfg, &ea, &eb).expect("connect a");
    connect(&b.qp, &cfg, &eb, &ea).expect("connect b");
    for i in 0..RECV_DEPTH as u64 {
        a.post_recv(i);
        b.post_recv(i);
    }
    pin(0);
    let mut samples = Vec::with_capacity(iters / BATCH);
    for _ in 0..iters / BATCH {
        let t = Instant::now();
        for _ in 0..BATCH {
            a.send();
            let wr = b.poll_recv();
            b.send();
            b.repost(wr);
            let wr = a.poll_recv();
            a.repost(wr);
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    samples
}

fn main() {
    let a = args();
    if std::env::args().any(|a| a == "--profile-two-threads") {
        let (m, _) = stats(&mut sim_pingpong(a.iters, a.size));
        println!("two threads: median {m:.1} ns per round trip");
        return;
    }
    if a.profile {
        let (m, _) = stats(&mut sim_one_thread(a.iters, a.size));
        println!("one thread: median {m:.1} ns per round trip");
        return;
    }
    let cores = cores().len();
    assert!(cores >= 2, "the ping-pong needs two cores, this process may use {cores}");
    println!(
        "sim_pingpong: {} round trips x {} rounds, {} B SEND/RECV, threads pinned to cores 0 and 1 ({} cores)",
        a.iters, a.rounds, a.size, cores
    );
    println!(
        "figures: round trip in ns, per-sample mean of {BATCH} round trips; median / p99 of the samples"
    );
    // Warm-up (page faults, CPU frequency).
    atomic_pingpong(a.iters / 10);
    sim_pingpong(a.iters / 10, a.size);
    let (mut atomic_med, mut sim_med) = (Vec::new(), Vec::new());
    let (mut atomic_p5, mut sim_p5) = (Vec::new(), Vec::new());
    for round in 1..=a.rounds {
        let mut at = atomic_pingpong(a.iters);
        let mut si = sim_pingpong(a.iters, a.size);
        let (am, ap) = stats(&mut at);
        let (sm, sp) = stats(&mut si);
        let (a5, s5) = (quantile(&mut at, 0.05), quantile(&mut si, 0.05));
        atomic_p5.push(a5);
        sim_p5.push(s5);
        let (om, _) = stats(&mut sim_one_thread(a.iters, a.size));
        println!("round {round}: sim, both sides on one thread (software cost, no core-to-core traffic): median {om:.1} ns");
        println!(
            "round {round}: atomic cache line  median {am:7.1} ns  p99 {ap:7.1} ns | sim SEND/RECV  median {sm:7.1} ns  p99 {sp:7.1} ns | ratio {:.2}",
            sm / am
        );
        println!(
            "round {round}: p5 (batches where both threads ran undisturbed; robust to a loaded machine): atomic {a5:.1} ns, sim {s5:.1} ns, ratio {:.2}",
            s5 / a5
        );
        atomic_med.push(am);
        sim_med.push(sm);
    }
    let (am, _) = stats(&mut atomic_med);
    let (sm, _) = stats(&mut sim_med);
    println!(
        "median over rounds: atomic {am:.1} ns, sim {sm:.1} ns, ratio sim/atomic = {:.2} (goal <= 3)",
        sm / am
    );
}
