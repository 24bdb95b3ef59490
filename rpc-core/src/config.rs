//! Configuration shared by server and client: the polling policy.

use std::time::Duration;

/// How a polling thread (server worker or blocking client call) waits when its CQ is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PollingPolicy {
    /// Spin on the CQ forever (lowest latency; one core per polling thread). Default for benchmarks.
    #[default]
    Busy,
    /// Spin `spins` empty polls, then `std::thread::yield_now()` between polls. What tests use
    /// (they share two cores).
    SpinThenYield {
        /// Empty polls before yielding (e.g. 1000).
        spins: u32,
    },
    /// Spin `spins` empty polls, then arm the CQ (`req_notify`) and block on its completion
    /// channel (`ibv_get_cq_event`; an equivalent wake-up on `sim`) for at most 1 ms at a time.
    Event {
        /// Empty polls before blocking.
        spins: u32,
    },
}

impl PollingPolicy {
    /// Parses `busy`, `yield[:SPINS]` or `event[:SPINS]` (CLI form).
    ///
    /// # Errors
    /// A message naming the accepted forms.
    pub fn parse(s: &str) -> Result<PollingPolicy, String> {
        let (name, spins) = match s.split_once(':') {
            Some((n, v)) => (n, Some(v.parse::<u32>().map_err(|e| format!("polling spins {v:?}: {e}"))?)),
            None => (s, None),
        };
        match name {
            "busy" => Ok(PollingPolicy::Busy),
            "yield" => Ok(PollingPolicy::SpinThenYield { spins: spins.unwrap_or(1000) }),
            "event" => Ok(PollingPolicy::Event { spins: spins.unwrap_or(1000) }),
            _ => Err(format!("polling policy {s:?}: expected busy, yield[:SPINS] or event[:SPINS]")),
        }
    }

    /// True when this policy creates CQs with a completion channel.
    pub(crate) fn needs_events(self) -> bool {
        matches!(self, PollingPolicy::Event { .. })
    }
}

/// Longest single block of the `Event` policy (so stop flags are seen promptly).
pub(crate) const EVENT_WAIT: Duration = Duration::from_millis(1);

/// Tracks empty polls and applies the policy.
#[derive(Debug)]
pub(crate) struct Idle {
    policy: PollingPolicy,
    empty: u32,
    /// `Event`: the CQ was armed after the last empty poll and has been polled once more
    /// since; the next empty poll blocks.
    armed: bool,
}

impl Idle {
    pub(crate) fn new(policy: PollingPolicy) -> Idle {
        Idle { policy, empty: 0, armed: false }
    }

    /// Work was found: spin again (and arm again before the next block).
    #[inline]
    pub(crate) fn reset(&mut self) {
        self.empty = 0;
        self.armed = false;
    }

    /// `Event` with no spins: the first empty poll after work arms the CQ and blocks (when the
    /// peek after the arming finds it empty). A loop whose poll drained the CQ may then arm
    /// at once instead of polling it empty first: the peek after the arming sees what came
    /// since the poll ([`Idle::pause`]).
    #[inline]
    pub(crate) fn blocks_at_first_empty(&self) -> bool {
        matches!(self.policy, PollingPolicy::Event { spins: 0 })
    }

    /// Empty polls since the last work.
    pub(crate) fn empty_polls(&self) -> u32 {
        self.empty
    }

    /// The poll found nothing: count it, then spin, yield or block per the policy (`arm` and
    /// `wait` as for [`Idle::pause`]).
    #[inline]
    pub(crate) fn idle(&mut self, arm: impl FnOnce() -> Option<bool>, wait: impl FnOnce()) {
        self.note_empty();
        self.pause(arm, wait);
    }

    /// Counts an empty poll without waiting.
    #[inline]
    pub(crate) fn note_empty(&mut self) {
        // Past u32::MAX (minutes of busy polling) the count goes back to 2^31, not stuck at the
        // maximum: periodic work keyed on `empty_polls() % N` (N a power of two up to 2^31: the
        // client's liveness check, counter publishing) keeps its period, and the count stays
        // above every spin threshold.
        self.empty = self.empty.checked_add(1).unwrap_or(1 << 31);
    }

    /// Spins, yields or blocks per the policy and the empty polls counted so far. `Event`, past
    /// its spins, arms the CQ before it blocks (`arm`: `req_notify`, then
    /// [`CompletionQueue::maybe_ready`](crate::verbs::CompletionQueue::maybe_ready): `None`
    /// when the arming failed, `Some(ready)` else) and blocks (`wait`: on the CQ's completion
    /// channel for at most [`EVENT_WAIT`]) only when the CQ is certainly empty after the
    /// arming; when it may hold something (a device without a cheap peek: always), it returns
    /// so that the caller polls once more, and blocks at the next empty poll. Verbs signal
    /// only completions that arrive after the arming: one that came between the empty poll and
    /// the arming raises no event, and a wait right after the arming lasted all of
    /// `EVENT_WAIT` with it in the CQ (`ibv_req_notify_cq(3)`: "poll, arm, poll again, then
    /// wait"). A failed arming counts as a block (nothing to wait on). True when
    /// it yielded or blocked: the thread gave up its core, so an empty poll may have lasted
    /// milliseconds (a loaded machine's time slice, or a whole event wait) and periodic work
    /// keyed on the count of empty polls must run more often.
    #[inline]
    pub(crate) fn pause(&mut self, arm: impl FnOnce() -> Option<bool>, wait: impl FnOnce()) -> bool {
        match self.policy {
            // Straight back to the CQ: the core is the poller's, and a PAUSE per empty poll only
            // delays seeing the next completion (up to ~140 cycles on recent x86).
            PollingPolicy::Busy => false,
            PollingPolicy::SpinThenYield { spins } => {
                if self.empty > spins {
                    std::thread::yield_now();
                    true
                } else {
                    std::hint::spin_loop();
                    false
                }
            }
            PollingPolicy::Event { spins } => {
                if self.empty > spins {
                    if !self.armed {
                        match arm() {
                            // Not armed: blocked on nothing.
                            None => return true,
                            // Armed, and something may have come before: polled once more.
                            Some(true) => {
                                self.armed = true;
                                return false;
                            }
                            // Armed with the CQ empty: whatever comes raises the event.
                            Some(false) => {}
                        }
                    }
                    self.armed = false;
                    wait();
                    true
                } else {
                    std::hint::spin_loop();
                    false
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait that lasts beyond u32::MAX empty polls (a few minutes of busy polling) still runs
    /// the work keyed on `empty_polls() % N` (the client's TCP liveness check every 4096). Before
    /// the fix the count saturated at u32::MAX, where `% 4096` is 4095 forever: a client blocked
    /// that long never noticed its server die.
    #[test]
    fn periodic_checks_survive_the_empty_poll_count_overflowing() {
        let mut idle = Idle::new(PollingPolicy::SpinThenYield { spins: 100 });
        idle.empty = u32::MAX - 5000;
        let mut checks = 0;
        for _ in 0..20_000 {
            idle.note_empty();
            if idle.empty_polls() % 4096 == 0 {
                checks += 1;
            }
            assert!(idle.empty_polls() > 100, "still past the spin phase");
        }
        assert!(checks >= 4, "{checks} liveness checks in 20000 empty polls");
    }

    /// `Event` arms the CQ before it blocks, and blocks only once the CQ is seen empty after the
    /// arming: a completion that came before the arming (it raises no event) is polled rather
    /// than waited for. With a peek that finds the CQ empty it blocks at once; with one that may
    /// see something, after one more poll. Arming and waiting in one step (as before): "waited
    /// with a completion maybe in the CQ".
    #[test]
    fn event_blocks_only_on_a_cq_seen_empty_after_arming() {
        let run = |ready_after_arm: bool, polls: usize, idle: &mut Idle| {
            let steps = std::cell::RefCell::new(Vec::new());
            for _ in 0..polls {
                idle.note_empty();
                let slept = idle.pause(
                    || {
                        steps.borrow_mut().push("arm");
                        Some(ready_after_arm)
                    },
                    || steps.borrow_mut().push("wait"),
                );
                steps.borrow_mut().push(if slept { "slept" } else { "poll" });
            }
            steps.into_inner().join(" ")
        };
        // A device without a cheap peek (maybe ready): arm, poll once more, then block.
        let mut idle = Idle::new(PollingPolicy::Event { spins: 2 });
        assert_eq!(
            run(true, 5, &mut idle),
            "poll poll arm poll wait slept arm poll",
            "waited with a completion maybe in the CQ"
        );
        // Work found: the next block arms again first.
        idle.reset();
        assert_eq!(run(true, 4, &mut idle), "poll poll arm poll wait slept");
        // A peek that sees the armed CQ empty (sim): block at once.
        let mut idle = Idle::new(PollingPolicy::Event { spins: 1 });
        assert_eq!(run(false, 3, &mut idle), "poll arm wait slept arm wait slept");
        // An arming that fails blocks on nothing, and counts as a block.
        let mut idle = Idle::new(PollingPolicy::Event { spins: 0 });
        idle.note_empty();
        assert!(idle.pause(|| None, || panic!("waited on a CQ that is not armed")));
    }

    #[test]
    fn parses_cli_forms() {
        assert_eq!(PollingPolicy::parse("busy"), Ok(PollingPolicy::Busy));
        assert_eq!(PollingPolicy::parse("yield:50"), Ok(PollingPolicy::SpinThenYield { spins: 50 }));
        assert_eq!(PollingPolicy::parse("event"), Ok(PollingPolicy::Event { spins: 1000 }));
        assert!(PollingPolicy::parse("spin").unwrap_err().contains("expected busy"));
        assert!(PollingPolicy::parse("yield:x").is_err());
    }
}
