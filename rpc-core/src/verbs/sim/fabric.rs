//! The process-wide fabric: which hosts and QPs exist (so that a QP's address vector and
//! `dest_qp_num` resolve to a peer, as a real network delivers to a GID/LID and QPN), and the
//! timer thread that plays the NIC's autonomous part: retrying after an RNR NAK or a lost packet.
//!
//! Everything here is control path (QP creation, first packet to a peer, MR deregistration) or
//! back-off path (RNR, retry); the data path never takes these locks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::host::{gid_host, HostCore};
use super::peer::PeerQp;
use super::qp::QpCore;
use crate::verbs::Gid;

pub(crate) struct Fabric {
    next_host: AtomicU32,
    hosts: Mutex<HashMap<u32, Weak<HostCore>>>,
    qps: Mutex<HashMap<(u32, u32), Weak<QpCore>>>,
    timers: Mutex<Vec<Arc<QpCore>>>,
    timers_cond: Condvar,
    epoch: Instant,
}

static FABRIC: LazyLock<Fabric> = LazyLock::new(|| Fabric {
    next_host: AtomicU32::new(1),
    hosts: Mutex::new(HashMap::new()),
    qps: Mutex::new(HashMap::new()),
    timers: Mutex::new(Vec::new()),
    timers_cond: Condvar::new(),
    epoch: Instant::now(),
});

static TIMER_THREAD: std::sync::Once = std::sync::Once::new();

pub(crate) fn fabric() -> &'static Fabric {
    &FABRIC
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Nanoseconds since the fabric started (monotonic).
pub(crate) fn now_ns() -> u64 {
    FABRIC.epoch.elapsed().as_nanos() as u64
}

/// Where a QP's packets go: the address vector and QPN given at RTR.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dest {
    pub(crate) dgid: Option<Gid>,
    pub(crate) dlid: u16,
    pub(crate) qpn: u32,
}

impl Fabric {
    /// Creates a new host with the next free id (and its segment).
    pub(crate) fn new_host(&self) -> crate::verbs::Result<Arc<HostCore>> {
        let id = self.next_host.fetch_add(1, Ordering::Relaxed);
        let host = Arc::new(HostCore::new(id)?);
        lock(&self.hosts).insert(id, Arc::downgrade(&host));
        super::remote::start_monitor();
        Ok(host)
    }

    /// Writes the heartbeat of every host of this process (the monitor thread).
    pub(crate) fn heartbeat(&self, now: u64) {
        let hosts: Vec<Arc<HostCore>> = lock(&self.hosts).values().filter_map(Weak::upgrade).collect();
        for h in &hosts {
            h.seg.header().heartbeat.store(now, Ordering::Relaxed);
        }
    }

    pub(crate) fn remove_host(&self, id: u32) {
        lock(&self.hosts).remove(&id);
    }

    pub(crate) fn register_qp(&self, qp: &Arc<QpCore>) {
        lock(&self.qps).insert((qp.host.id, qp.qpn), Arc::downgrade(qp));
    }

    pub(crate) fn unregister_qp(&self, host: u32, qpn: u32) {
        lock(&self.qps).remove(&(host, qpn));
    }

    /// The live QP `dest` names, as the network would deliver a packet to it: a host of this
    /// process, or (by GID) a host of another process, mapped on first contact.
    pub(crate) fn resolve(&self, dest: &Dest) -> Option<PeerQp> {
        if let Some(g) = dest.dgid {
            let (pid, host_id) = gid_host(&g);
            if g.0[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0] && pid != super::shm::my_pid() {
                return super::remote::resolve(pid, host_id, dest.qpn);
            }
        }
        self.resolve_local(dest).map(PeerQp::local)
    }

    fn resolve_local(&self, dest: &Dest) -> Option<Arc<QpCore>> {
        // Upgrade under the lock, search and drop outside it (a host's last handle may go here,
        // and its drop takes this lock).
        let hosts: Vec<Arc<HostCore>> = lock(&self.hosts).values().filter_map(Weak::upgrade).collect();
        let host_id = hosts
            .iter()
            .find(|h| match dest.dgid {
                Some(g) => h.gid == g,
                None => h.lid == dest.dlid,
            })
            .filter(|h| h.is_alive())
            .map(|h| h.id)?;
        drop(hosts);
        lock(&self.qps).get(&(host_id, dest.qpn)).and_then(Weak::upgrade)
    }

    /// Removes a host from the fabric (lookups no longer find it or its QPs), calling `each` on
    /// every one of its QPs outside the lock (fault injection: the host vanished). The QPs stay
    /// registered for quiescence until destroyed.
    pub(crate) fn detach_host_qps(&self, id: u32, each: impl Fn(&Arc<QpCore>)) {
        self.remove_host(id);
        let gone: Vec<Arc<QpCore>> =
            lock(&self.qps).iter().filter(|((h, _), _)| *h == id).filter_map(|(_, q)| q.upgrade()).collect();
        for qp in &gone {
            each(qp);
        }
    }

    /// Hands `qp` (whose send queue is waiting for an RNR or retransmission timer) to the timer
    /// thread, which retries it when its deadline passes.
    pub(crate) fn schedule(&self, qp: Arc<QpCore>) {
        TIMER_THREAD.call_once(|| {
            let spawned = std::thread::Builder::new().name("sim-nic-timers".into()).spawn(timer_loop);
            if let Err(e) = spawned {
                tracing::error!("sim: cannot start the NIC timer thread: {e}");
            }
        });
        let mut list = lock(&self.timers);
        if !list.iter().any(|q| Arc::ptr_eq(q, &qp)) {
            list.push(qp);
        }
        self.timers_cond.notify_all();
    }
}

/// Waits until no transfer of this process that started before this call is still running:
/// every transfer runs under its requester's send-queue guard, so a grace period over the
/// guards ([`super::guard::synchronize`], RCU-style: O(threads)) is one over the transfers.
/// Transfers of peer processes are waited out by the host's epoch ([`super::epoch`]).
pub(crate) fn quiesce() {
    super::guard::synchronize();
}

fn timer_loop() {
    let f = &*FABRIC;
    loop {
        // Work on a snapshot, without the list's lock: retrying a QP may schedule another one
        // (a responder error moves the peer to ERR and asks for its flush).
        let snapshot: Vec<Arc<QpCore>> = {
            let mut list = lock(&f.timers);
            while list.is_empty() {
                list = f.timers_cond.wait(list).unwrap_or_else(|e| e.into_inner());
            }
            list.clone()
        };
        let now = now_ns();
        for qp in &snapshot {
            qp.on_timer(now);
        }
        drop(snapshot);
        let mut list = lock(&f.timers);
        // `scheduled` is cleared (under the QP's guard) when a QP no longer waits, and set again
        // by whoever schedules it anew, so nothing scheduled meanwhile is forgotten.
        list.retain(|qp| qp.scheduled.load(Ordering::Acquire));
        let next = list.iter().map(|qp| qp.deadline_ns()).min().unwrap_or(u64::MAX);
        let now = now_ns();
        if next > now {
            let wait = Duration::from_nanos((next - now).min(100_000_000));
            drop(f.timers_cond.wait_timeout(list, wait).unwrap_or_else(|e| e.into_inner()));
        } else {
            // Due, but its guard was busy: let the holder finish.
            drop(list);
            std::thread::yield_now();
        }
    }
}
