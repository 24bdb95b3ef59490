//! The send-queue guard: a test-and-test-and-set flag held while a QP's send queue is posted to or
//! executed, the software counterpart of the per-QP spinlock mlx5's `ibv_post_send` takes.
//!
//! Uncontended (the QP's own thread posting and executing), it is one CAS on a cache line that
//! stays in that thread's cache. It is contended only by the fabric's timer thread during RNR or
//! retry back-off and by control-path calls (modify, destroy, MR deregistration), all short.
//!
//! Every transfer of this process runs under a guard, so a grace period (what an MR's or QP's
//! destruction waits out) is "every guard held at its start has been released". Each thread
//! counts the guards it takes and releases in a slot of its own ([`Slot`]: two counters on a
//! cache line only it writes), and [`synchronize`] waits on the threads' slots: O(threads) per
//! grace period, not O(QPs) (taking every QP's guard in turn made destroying N QPs O(N²): a
//! worker closing 10,000 sessions was held for tens of seconds).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Free when zeroed (it lives in a QP's shared state, in the host segment).
pub(crate) struct SpinGuard {
    locked: AtomicBool,
}

impl SpinGuard {
    /// Takes the guard if it is free.
    #[inline]
    pub(crate) fn try_lock(&self) -> bool {
        if self.locked.load(Ordering::Relaxed) {
            return false;
        }
        self.cas()
    }

    /// Takes the guard with a CAS, counting the section first (undone if the CAS fails).
    #[inline(always)]
    fn cas(&self) -> bool {
        // Counted before the CAS: the CAS (a locked instruction, a full barrier on x86) makes
        // the count visible before anything the holder then reads (a key a grace period
        // invalidated), as `synchronize`'s fence requires.
        enter();
        #[cfg(not(target_arch = "x86_64"))]
        std::sync::atomic::fence(Ordering::SeqCst);
        let taken = self.locked.compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed).is_ok();
        if !taken {
            exit();
        }
        taken
    }

    /// Takes the guard, spinning (then yielding) while another thread holds it. The first
    /// attempt is the CAS alone (the guard is almost always free: its QP's own thread posts);
    /// only a retry tests the flag before its CAS.
    #[inline]
    pub(crate) fn lock(&self) {
        if self.cas() {
            return;
        }
        let mut spins = 0u32;
        while !self.try_lock() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Releases the guard (a plain release store: no fence on the hot path).
    #[inline]
    pub(crate) fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
        exit();
    }
}

/// Claims a slot for this thread, or [`ORPHAN`] once its thread-locals are being destroyed.
#[cold]
fn claim() -> &'static Slot {
    match OWNER.try_with(|c| c.0) {
        Ok(slot) => {
            MINE.with(|m| m.set(Some(slot)));
            slot
        }
        Err(_) => &ORPHAN,
    }
}

/// Counts a guard taken by this thread: only the outermost of nested ones (a guard taken while
/// the thread holds another, as a responder's fault moving its peer QP to the error state
/// does), so the slot counts sections, and a section's release is its outermost guard's. The
/// fast path: two constant-initialised thread-locals with no destructor, and the slot's count.
#[inline]
fn enter() {
    let depth = DEPTH.with(|d| {
        let n = d.get();
        d.set(n + 1);
        n
    });
    if depth == 0 {
        match MINE.with(Cell::get) {
            Some(slot) => slot.enter(),
            None => count_cold(false),
        }
    }
}

/// [`enter`] (`release` false) or [`exit`] (`release` true) for a thread with no slot yet (it
/// claims one) or past its thread-locals (`ORPHAN`, shared: counted by atomic adds).
#[cold]
fn count_cold(release: bool) {
    let slot = claim();
    match (std::ptr::eq(slot, &ORPHAN), release) {
        (true, false) => {
            ORPHAN.taken.fetch_add(1, Ordering::SeqCst);
        }
        (true, true) => {
            ORPHAN.released.fetch_add(1, Ordering::Release);
        }
        (false, false) => slot.enter(),
        (false, true) => slot.exit(),
    }
}

/// Counts a guard released by this thread (the section ends with its outermost guard).
#[inline]
fn exit() {
    let depth = DEPTH.with(|d| {
        let n = d.get().saturating_sub(1);
        d.set(n);
        n
    });
    if depth == 0 {
        match MINE.with(Cell::get) {
            Some(slot) => slot.exit(),
            None => count_cold(true),
        }
    }
}

/// The slot of threads past their thread-locals' destruction (shared: counted by atomic adds).
static ORPHAN: Slot = Slot { taken: AtomicU64::new(0), released: AtomicU64::new(0) };

/// One thread's count of guards taken and released (each written only by its thread; read by
/// [`synchronize`]). Its own cache line, so counting costs its thread no sharing.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Slot {
    taken: AtomicU64,
    released: AtomicU64,
}

impl Slot {
    #[inline]
    fn enter(&self) {
        self.taken.store(self.taken.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    #[inline]
    fn exit(&self) {
        self.released.store(self.released.load(Ordering::Relaxed) + 1, Ordering::Release);
    }
}

/// The slots of the threads that took a guard (a thread's goes back to `FREE` when it exits).
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());
/// Slots of exited threads, for the next threads (no guard held: their counts are equal).
static FREE: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// This thread's slot, claimed at its first guard.
struct Claimed(&'static Slot);

impl Claimed {
    fn new() -> Claimed {
        let free = FREE.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let slot = free.unwrap_or_else(|| {
            let slot: &'static Slot = Box::leak(Box::default());
            SLOTS.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
            slot
        });
        Claimed(slot)
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        // Guards this thread takes from here on (other thread-locals' destructors) count in
        // `ORPHAN`; the slot goes to the next thread.
        let _ = MINE.try_with(|m| m.set(None));
        // A thread that exits inside a section (a panic while it held a guard) runs no transfer
        // any more: its section is over, or every later grace period would wait for it.
        let _ = DEPTH.try_with(|d| d.set(0));
        self.0.released.store(self.0.taken.load(Ordering::Relaxed), Ordering::Release);
        FREE.lock().unwrap_or_else(|e| e.into_inner()).push(self.0);
    }
}

thread_local! {
    static MINE: Cell<Option<&'static Slot>> = const { Cell::new(None) };
    /// Guards this thread holds now (nested ones counted once in its slot).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static OWNER: Claimed = Claimed::new();
}

/// Waits until every guard of this process that another thread held when this was called has
/// been released (a grace period: a transfer that started before it has ended; one that starts
/// after it sees what the caller invalidated before it). The caller's own guards are not
/// waited for (it holds none while it destroys).
pub(crate) fn synchronize() {
    std::sync::atomic::fence(Ordering::SeqCst);
    let mut slots: Vec<&'static Slot> = SLOTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    slots.push(&ORPHAN);
    let me = MINE.try_with(Cell::get).ok().flatten();
    for slot in slots {
        if me.is_some_and(|m| std::ptr::eq(m, slot)) {
            continue;
        }
        let taken = slot.taken.load(Ordering::SeqCst);
        // A thread's slot counts its sections (outermost guards), one at a time, so once its
        // releases reach what it had taken, the section held at the start is over. `ORPHAN` is
        // counted by several threads at once: another's later guards may bring the releases
        // up to that count while one held at the start is still held (a transfer of a
        // thread-local destructor outliving the grace period). It is waited on until it is
        // seen with nothing held: every release up to what is taken at that moment (read
        // after them).
        let orphan = std::ptr::eq(slot, &ORPHAN);
        let past = |released: u64| {
            if orphan {
                released >= slot.taken.load(Ordering::SeqCst)
            } else {
                released >= taken
            }
        };
        let mut spins = 0u32;
        while !past(slot.released.load(Ordering::Acquire)) {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    /// A free guard that outlives the test's threads.
    fn leaked() -> &'static SpinGuard {
        Box::leak(Box::new(SpinGuard { locked: AtomicBool::new(false) }))
    }

    /// A thread running one grace period, and whether it has ended.
    fn grace_period() -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        let waiter = std::thread::spawn(move || {
            synchronize();
            flag.store(true, Ordering::SeqCst);
        });
        (ended, waiter)
    }

    /// A grace period waits for a guard another thread held when it began, and ends once that
    /// guard is released. Sabotaged: `synchronize` returning at once: failed ("the grace period
    /// ended while a guard it must wait for was held").
    #[test]
    fn a_grace_period_waits_for_the_guards_held_when_it_began() {
        let guard = leaked();
        let (held_tx, held) = mpsc::channel();
        let (release_tx, release) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            guard.lock();
            held_tx.send(()).unwrap();
            release.recv().unwrap();
            guard.unlock();
        });
        held.recv().unwrap();
        let (ended, waiter) = grace_period();
        // Whatever the timing, a correct grace period cannot end here; a broken one has had
        // time to.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !ended.load(Ordering::SeqCst),
            "the grace period ended while a guard it must wait for was held"
        );
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        waiter.join().unwrap();
        assert!(ended.load(Ordering::SeqCst));
        // A thread's own guards are not waited for, nor free ones.
        guard.lock();
        synchronize();
        guard.unlock();
    }

    /// A guard taken and released inside another (a responder's fault moves its peer QP to the
    /// error state under the requester's guard) does not end the section: a grace period that
    /// began inside it waits for the outer guard. Sabotaged: every guard counted in the slot,
    /// nested or not: failed ("a nested guard's release ended the grace period").
    #[test]
    fn a_nested_guard_does_not_end_its_threads_section() {
        let (outer, inner) = (leaked(), leaked());
        let (held_tx, held) = mpsc::channel();
        let (nest_tx, nest) = mpsc::channel::<()>();
        let (nested_tx, nested) = mpsc::channel();
        let (release_tx, release) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            outer.lock();
            held_tx.send(()).unwrap();
            nest.recv().unwrap();
            inner.lock();
            inner.unlock();
            nested_tx.send(()).unwrap();
            release.recv().unwrap();
            outer.unlock();
        });
        held.recv().unwrap();
        let (ended, waiter) = grace_period();
        std::thread::sleep(Duration::from_millis(50));
        nest_tx.send(()).unwrap();
        nested.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!ended.load(Ordering::SeqCst), "a nested guard's release ended the grace period");
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        waiter.join().unwrap();
        assert!(ended.load(Ordering::SeqCst));
    }
}
