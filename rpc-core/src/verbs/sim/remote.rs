//! Hosts of other processes: mapping their segments on first contact, and the liveness monitor.
//!
//! A requester whose QP's destination GID names another process (`fe80::<pid>:<host id>`) maps
//! that host's segment once (control path) and executes its transfers in the mapping. The
//! monitor thread (`sim-shm-monitor`, one per process, asleep between ticks of
//! [`HEARTBEAT_NS`]) writes this process's hosts' heartbeats and checks the mapped peers: a peer
//! whose pid is gone, or whose heartbeat is older than [`HEARTBEAT_DEAD_NS`], is marked dead in
//! its own segment (requesters then see their packets lost, retry, and fail with
//! `IBV_WC_RETRY_EXC_ERR`), its file is unlinked, and the mapping is dropped once no QP uses it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use super::epoch::Reader;
use super::peer::PeerQp;
use super::shm::{monotonic_ns, pid_alive, Segment, HEARTBEAT_DEAD_NS, HEARTBEAT_NS, QP_DIR_LEN, QP_DIR_OFF};

/// A host of another process, mapped.
pub(crate) struct RemoteHost {
    /// This process's reader slot in the host's segment (released before the unmapping).
    pub(crate) reader: Reader,
    pub(crate) seg: Segment,
    pid: u32,
    host_id: u32,
}

impl RemoteHost {
    /// The offset of QP `qpn`'s shared state, from the host's QP directory.
    pub(crate) fn qp_offset(&self, qpn: u32) -> Option<usize> {
        // SAFETY: the directory lies inside the mapping (layout constants), atomics only.
        let dir =
            unsafe { std::slice::from_raw_parts(self.seg.at(QP_DIR_OFF) as *const AtomicU64, QP_DIR_LEN) };
        let off = dir[qpn as usize % QP_DIR_LEN].load(Ordering::Acquire) as usize;
        (off != 0).then_some(off)
    }

    fn alive(&self) -> bool {
        self.seg.header().alive.load(Ordering::Relaxed) != 0
    }

    /// Checks the owner; marks the host dead (and unlinks its file) if it is gone.
    fn check(&self, now: u64) {
        if !self.alive() {
            return;
        }
        let beat = self.seg.header().heartbeat.load(Ordering::Relaxed);
        let stale = now.saturating_sub(beat) > HEARTBEAT_DEAD_NS;
        if stale || !pid_alive(self.pid) {
            tracing::info!(
                pid = self.pid,
                host = self.host_id,
                stale,
                "sim: peer process gone, its host is dead"
            );
            self.seg.header().alive.store(0, Ordering::SeqCst);
            Segment::unlink_dead(self.pid, self.host_id);
        }
    }
}

/// Mapped hosts of other processes, by (pid, host id).
type Remotes = Vec<((u32, u32), Arc<RemoteHost>)>;

static REMOTES: Mutex<Remotes> = Mutex::new(Vec::new());

fn remotes() -> std::sync::MutexGuard<'static, Remotes> {
    REMOTES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Maps host `host_id` of process `pid` (the part of its segment in use) and claims a reader
/// slot there.
fn map(pid: u32, host_id: u32) -> Option<Arc<RemoteHost>> {
    let seg = Segment::open(pid, host_id)?;
    let Some(reader) = Reader::claim(&seg) else {
        tracing::warn!(pid, host_id, "sim: the peer host's reader table is full; not connecting");
        return None;
    };
    Some(Arc::new(RemoteHost { reader, seg, pid, host_id }))
}

/// `host`, or a new, larger mapping of it when its segment has grown past this one (which
/// stays mapped while views of it exist). The list keeps the largest.
fn refresh(host: Arc<RemoteHost>) -> Arc<RemoteHost> {
    if host.seg.len() as u64 >= host.seg.header().size.load(Ordering::Acquire) {
        return host;
    }
    let key = (host.pid, host.host_id);
    let mut list = remotes();
    let Some(entry) = list.iter_mut().find(|(k, _)| *k == key) else { return host };
    if entry.1.seg.len() > host.seg.len() {
        return entry.1.clone();
    }
    match map(key.0, key.1) {
        Some(bigger) => {
            tracing::debug!(pid = key.0, host = key.1, len = bigger.seg.len(), "sim: peer segment remapped");
            entry.1 = bigger.clone();
            bigger
        }
        None => host,
    }
}

/// QP `qpn` of host `host_id` of process `pid`, mapping the host on first contact (and again,
/// larger, when its segment has grown); `None` if the host or the QP does not exist (or the
/// host is dead).
pub(crate) fn resolve(pid: u32, host_id: u32, qpn: u32) -> Option<PeerQp> {
    let host = {
        let mut list = remotes();
        match list.iter().find(|(k, _)| *k == (pid, host_id)) {
            Some((_, h)) => h.clone(),
            None => {
                let h = map(pid, host_id)?;
                list.push(((pid, host_id), h.clone()));
                start_monitor();
                h
            }
        }
    };
    if !host.alive() {
        return None;
    }
    let host = refresh(host);
    // A QP created after the size was read may lie past the mapping: once more, remapped.
    PeerQp::remote(host.clone(), qpn).or_else(|| {
        let again = refresh(host.clone());
        (!Arc::ptr_eq(&again, &host)).then(|| PeerQp::remote(again, qpn)).flatten()
    })
}

static MONITOR: Once = Once::new();

/// Starts the monitor thread (once per process).
pub(crate) fn start_monitor() {
    MONITOR.call_once(|| {
        let spawned = std::thread::Builder::new().name("sim-shm-monitor".into()).spawn(monitor_loop);
        if let Err(e) = spawned {
            tracing::error!("sim: cannot start the shared-memory monitor thread: {e}");
        }
    });
}

fn monitor_loop() {
    loop {
        let now = monotonic_ns();
        super::fabric::fabric().heartbeat(now);
        let list: Vec<Arc<RemoteHost>> = remotes().iter().map(|(_, h)| h.clone()).collect();
        for h in &list {
            h.reader.beat(now);
            h.check(now);
        }
        drop(list);
        // Unmap dead peers no QP refers to any more.
        remotes().retain(|(_, h)| h.alive() || Arc::strong_count(h) > 1);
        std::thread::sleep(Duration::from_nanos(HEARTBEAT_NS));
    }
}
