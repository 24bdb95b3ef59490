//! The worker's session timers: a hashed timing wheel with intrusive lists (Varghese and
//! Lauck, "Hashed and Hierarchical Timing Wheels", SOSP 1987, scheme 6; eRPC keeps its
//! retransmission timers in one the same way).
//!
//! A worker carries thousands of sessions, each with at most one pending timer: the earliest of
//! its calls' deadlines, its calls' duration bound and the idle probe
//! ([`crate::session::Session::poll_timeout`]). Visiting every watched session at every tick
//! costs the worker in proportion to the sessions it holds (20,000 idle, probed sessions: about
//! 8 % of a core, in 160 µs stalls every 2 ms); the wheel visits only the sessions whose timer is
//! due. Each session is in at most one slot (a doubly-linked list through [`Node`]s indexed by the
//! worker's entry index), so moving, cancelling and firing are O(1) and nothing stale is left
//! behind when a session closes.
//!
//! Time is counted in ticks of `tick` since the wheel's creation. A timer set for time `at`
//! fires at the first tick at or after it (never early), at the next tick at the soonest; one set
//! further ahead than the wheel's span (`slots` ticks) fires at the span's end, where the worker
//! looks at the session again and sets its timer anew (a 300 s call bound on a wheel of 8 s is
//! looked at 37 times).

use std::time::{Duration, Instant};

/// No node (list end); also the tick of a node on no list.
const NIL: u32 = u32::MAX;
const UNSET: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    prev: u32,
    next: u32,
    /// The tick it fires at; [`UNSET`] when on no list.
    tick: u64,
}

const FREE: Node = Node { prev: NIL, next: NIL, tick: UNSET };

/// Timers of up to `nodes` sessions (by their entry index), in `slots` slots of `tick` each.
pub(crate) struct TimerWheel {
    epoch: Instant,
    tick_ns: u64,
    /// First node of each slot's list.
    heads: Box<[u32]>,
    /// The nodes taken off the slot of the tick being fired, not yet handed out
    /// ([`TimerWheel::next_due`]).
    firing: u32,
    nodes: Box<[Node]>,
    /// Every tick up to this one has been fired: timers are set for later ticks only.
    done: u64,
    /// Nodes on a list (the slots' and `firing`).
    len: usize,
}

impl TimerWheel {
    /// A wheel of `slots` slots (a power of two) of `tick` (at least 1 µs) for `nodes` sessions.
    pub(crate) fn new(now: Instant, tick: Duration, slots: usize, nodes: usize) -> TimerWheel {
        debug_assert!(slots.is_power_of_two());
        TimerWheel {
            epoch: now,
            tick_ns: (tick.as_nanos() as u64).max(1_000),
            heads: vec![NIL; slots].into_boxed_slice(),
            firing: NIL,
            nodes: vec![FREE; nodes].into_boxed_slice(),
            done: 0,
            len: 0,
        }
    }

    /// Whether no timer is set.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tick `at` falls in, rounded up (the first tick at or after it).
    fn tick_at(&self, at: Instant) -> u64 {
        let ns = at.saturating_duration_since(self.epoch).as_nanos() as u64;
        ns.div_ceil(self.tick_ns)
    }

    /// The tick `now` has reached, rounded down.
    fn tick_now(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64 / self.tick_ns
    }

    /// The soonest tick a timer can be set for: the next one to fire.
    #[inline]
    pub(crate) fn next_tick(&self) -> u64 {
        self.done + 1
    }

    /// The tick session `i`'s timer fires at, if one is set.
    #[inline]
    pub(crate) fn scheduled(&self, i: u16) -> Option<u64> {
        self.nodes.get(usize::from(i)).map(|n| n.tick).filter(|&t| t != UNSET)
    }

    /// Sets session `i`'s timer for `at` (replacing the one set): it fires at the first tick at
    /// or after `at`, at the next tick at the soonest, at the end of the wheel's span at the
    /// latest.
    pub(crate) fn set(&mut self, i: u16, at: Instant) {
        let tick = self.tick_at(at);
        self.set_tick(i, tick);
    }

    /// [`TimerWheel::set`] with the tick given.
    pub(crate) fn set_tick(&mut self, i: u16, tick: u64) {
        let span = self.heads.len() as u64;
        let tick = tick.clamp(self.done + 1, self.done + span);
        let Some(node) = self.nodes.get(usize::from(i)) else { return };
        if node.tick == tick {
            return;
        }
        self.cancel(i);
        let slot = (tick & (span - 1)) as usize;
        let head = self.heads[slot];
        self.nodes[usize::from(i)] = Node { prev: NIL, next: head, tick };
        if head != NIL {
            self.nodes[head as usize].prev = u32::from(i);
        }
        self.heads[slot] = u32::from(i);
        self.len += 1;
    }

    /// Clears session `i`'s timer, if one is set (a closed session: its entry index may be taken
    /// by the next session).
    pub(crate) fn cancel(&mut self, i: u16) {
        let Some(&node) = self.nodes.get(usize::from(i)) else { return };
        if node.tick == UNSET {
            return;
        }
        if node.prev != NIL {
            self.nodes[node.prev as usize].next = node.next;
        } else if self.firing == u32::from(i) {
            // Taken off its slot for firing, not handed out yet.
            self.firing = node.next;
        } else {
            self.heads[(node.tick & (self.heads.len() as u64 - 1)) as usize] = node.next;
        }
        if node.next != NIL {
            self.nodes[node.next as usize].prev = node.prev;
        }
        self.nodes[usize::from(i)] = FREE;
        self.len -= 1;
    }

    /// The next session whose timer is due at `now` (its timer cleared), or `None` when no more
    /// are. Ticks are fired in order; a timer set while they are (for the next tick at the
    /// soonest) does not fire in the same pass. After a gap longer than the span, each slot is
    /// fired once: every timer in it is due.
    pub(crate) fn next_due(&mut self, now: Instant) -> Option<u16> {
        let now_tick = self.tick_now(now);
        loop {
            if self.firing != NIL {
                let i = self.firing as u16;
                self.cancel(i);
                return Some(i);
            }
            if self.done >= now_tick || self.len == 0 {
                // Nothing set: the next timer set counts from now.
                self.done = self.done.max(now_tick);
                return None;
            }
            let span = self.heads.len() as u64;
            // Past the whole span since the last look: every slot's timers are due.
            self.done = self.done.max(now_tick.saturating_sub(span));
            let t = self.done + 1;
            let slot = (t & (span - 1)) as usize;
            self.firing = std::mem::replace(&mut self.heads[slot], NIL);
            self.done = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(2);

    fn due(w: &mut TimerWheel, now: Instant) -> Vec<u16> {
        let mut v = Vec::new();
        while let Some(i) = w.next_due(now) {
            v.push(i);
            assert!(v.len() <= w.nodes.len(), "more timers fired than there are sessions: {v:?}");
        }
        v.sort_unstable();
        v
    }

    #[test]
    fn a_timer_fires_at_its_tick_never_before() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, TICK, 8, 4);
        w.set(1, t0 + Duration::from_millis(5));
        w.set(2, t0 + Duration::from_millis(6));
        assert!(due(&mut w, t0 + Duration::from_millis(4)).is_empty(), "fired before 5 ms");
        // 5 ms rounds up to tick 3 (6 ms).
        assert!(due(&mut w, t0 + Duration::from_millis(5)).is_empty(), "fired inside its tick");
        assert_eq!(due(&mut w, t0 + Duration::from_millis(6)), vec![1, 2]);
        assert!(w.is_empty());
        assert_eq!(w.scheduled(1), None);
    }

    #[test]
    fn a_moved_timer_fires_once_at_its_new_tick_and_a_cancelled_one_never() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, TICK, 8, 4);
        w.set(0, t0 + Duration::from_millis(10));
        w.set(1, t0 + Duration::from_millis(10));
        w.set(2, t0 + Duration::from_millis(10));
        w.set(0, t0 + Duration::from_millis(2)); // earlier
        w.set(2, t0 + Duration::from_millis(12)); // later
        w.cancel(1);
        assert_eq!(due(&mut w, t0 + Duration::from_millis(2)), vec![0]);
        assert!(due(&mut w, t0 + Duration::from_millis(10)).is_empty(), "a moved or cancelled timer fired");
        assert_eq!(due(&mut w, t0 + Duration::from_millis(12)), vec![2]);
        assert!(w.is_empty());
    }

    #[test]
    fn a_timer_beyond_the_span_fires_at_its_end_and_one_in_the_past_at_the_next_tick() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, TICK, 8, 4);
        // 8 slots of 2 ms: 16 ms of span.
        w.set(3, t0 + Duration::from_secs(300));
        assert_eq!(w.scheduled(3), Some(8));
        assert_eq!(due(&mut w, t0 + Duration::from_millis(16)), vec![3]);
        w.set(1, t0);
        assert_eq!(w.scheduled(1), Some(9), "a past time is the next tick");
        assert_eq!(due(&mut w, t0 + Duration::from_millis(18)), vec![1]);
    }

    #[test]
    fn after_a_gap_longer_than_the_span_every_timer_fires_once() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, TICK, 8, 16);
        for i in 0..8u16 {
            w.set(i, t0 + Duration::from_millis(2 * (u64::from(i) + 1)));
        }
        assert_eq!(due(&mut w, t0 + Duration::from_secs(1)), (0..8).collect::<Vec<_>>());
        assert!(w.is_empty());
        // Set after the gap: counts from where the wheel is now.
        w.set(9, t0 + Duration::from_millis(1002));
        assert!(due(&mut w, t0 + Duration::from_millis(1001)).is_empty());
        assert_eq!(due(&mut w, t0 + Duration::from_millis(1002)), vec![9]);
    }

    #[test]
    fn a_timer_set_while_firing_waits_for_the_next_tick() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, TICK, 8, 4);
        w.set(0, t0 + TICK);
        w.set(1, t0 + TICK);
        let now = t0 + TICK;
        let first = w.next_due(now).unwrap();
        // The handler of the first sets its own timer again for "now", and cancels the other.
        w.set(first, now);
        w.cancel(1 - first);
        assert_eq!(
            w.next_due(now),
            None,
            "a timer set for now fired in the same pass, or a cancelled one did"
        );
        assert_eq!(w.scheduled(first), Some(2));
        assert_eq!(due(&mut w, t0 + 2 * TICK), vec![first]);
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Set timer `i` for `at` µs after the start.
        Set(u16, u64),
        Cancel(u16),
        /// Fire what is due `by` µs further on.
        Advance(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            // Up to 3 spans of 8 slots of 2 ms ahead of the start, and far beyond.
            4 => (0..16u16, prop_oneof![0..50_000u64, 0..10_000_000u64]).prop_map(|(i, at)| Op::Set(i, at)),
            1 => (0..16u16).prop_map(Op::Cancel),
            3 => prop_oneof![0..5_000u64, 0..40_000u64].prop_map(Op::Advance),
        ]
    }

    proptest::proptest! {
        /// Against a model (a map from timer to tick: the first at or after `at`, clamped to the
        /// next tick and the span's end; all due at `now` fire): any sequence of sets, cancels
        /// and advances (gaps longer than the span included) fires the same timers at the same
        /// looks, and `scheduled` agrees throughout.
        #[test]
        fn the_wheel_fires_what_a_model_of_its_timers_says(ops in proptest::collection::vec(op(), 1..200)) {
            let t0 = Instant::now();
            let tick_ns = TICK.as_nanos() as u64;
            let span = 8u64;
            let mut w = TimerWheel::new(t0, TICK, span as usize, 16);
            let mut model: std::collections::BTreeMap<u16, u64> = Default::default();
            let (mut done, mut now_us) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Set(i, at) => {
                        w.set(i, t0 + Duration::from_micros(at));
                        let tick = (at * 1_000).div_ceil(tick_ns).clamp(done + 1, done + span);
                        model.insert(i, tick);
                    }
                    Op::Cancel(i) => {
                        w.cancel(i);
                        model.remove(&i);
                    }
                    Op::Advance(by) => {
                        now_us += by;
                        let fired = due(&mut w, t0 + Duration::from_micros(now_us));
                        let now_tick = now_us * 1_000 / tick_ns;
                        let expected: Vec<u16> =
                            model.iter().filter(|&(_, &t)| t <= now_tick).map(|(&i, _)| i).collect();
                        model.retain(|_, t| *t > now_tick);
                        done = done.max(now_tick);
                        proptest::prop_assert_eq!(fired, expected, "at {} us", now_us);
                    }
                }
                for i in 0..16u16 {
                    proptest::prop_assert_eq!(w.scheduled(i), model.get(&i).copied(), "timer {}", i);
                }
                proptest::prop_assert_eq!(w.is_empty(), model.is_empty());
            }
        }
    }

    #[test]
    fn many_timers_on_one_slot_keep_their_lists_whole() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, TICK, 4, 64);
        for i in 0..64u16 {
            // 4 slots: 16 nodes per slot, at ticks 1..=4.
            w.set_tick(i, u64::from(i % 4) + 1);
        }
        for i in (0..64u16).step_by(3) {
            w.cancel(i);
        }
        let left: Vec<u16> = (0..64u16).filter(|i| i % 3 != 0).collect();
        assert_eq!(due(&mut w, t0 + 4 * TICK), left);
        assert!(w.is_empty());
    }
}
