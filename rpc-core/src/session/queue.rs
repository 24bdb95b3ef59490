//! The client's calls waiting for a slot, sans-IO: backpressure instead of refusal.
//!
//! A session has `window` call slots ([`super::CallSlots`]). A call that finds none free, or
//! (when it must not block) whose body cannot be placed yet for want of a send buffer or ring
//! room, does not fail: the driver encodes it once and it waits here, in a FIFO queue. The rules,
//! which the blocking client and its futures drive (inputs: calls that could not start, `now`,
//! whether a slot is free, the session breaking, callers giving up; outputs: the next call to
//! start, calls ended with their status):
//!
//! - **Order.** Waiting calls go on the wire in the order they were started. While any call
//!   waits, a new call waits behind it even if a slot is free ([`CallQueue::must_wait`]).
//! - **Progress.** Whoever progresses the session asks [`CallQueue::next`] for the calls to
//!   start as slots and ring space free (a slot frees when its caller takes the answer, or drops
//!   the call and its answer and Cancel acknowledgement arrived).
//! - **Bound.** At most `max` calls wait; one more is refused with RESOURCE_EXHAUSTED naming
//!   `ClientConfig::max_queued_calls` ([`CallQueue::push`]). Queueing never waits.
//! - **Deadline.** A waiting call whose deadline passes ends DEADLINE_EXCEEDED and is never sent.
//! - **Abandon.** A waiting call whose caller gives up is removed and never sent.
//! - **Break.** When the session breaks, waiting calls end UNAVAILABLE; they were never sent, and
//!   nothing re-sends them ([`CallQueue::fail_all`]).
//! - **Blocking callers.** A blocking call waiting for a slot can only get one freed by an
//!   abandoned call's late answer (no other caller runs while it blocks): when no slot is free and
//!   none will free itself, it ends RESOURCE_EXHAUSTED at once instead of waiting forever
//!   ([`CallQueue::refuse_blocking`]).
//!
//! Every waiting call has a sequence number; what became of it while its caller was not looking
//! (started in a slot, or ended) is kept until the caller asks ([`CallQueue::poll`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::status::{Code, Status};

/// A call waiting for a slot: what it goes out with. `B` is the driver's encoded body.
#[derive(Debug)]
pub struct QueuedCall<B> {
    /// Method id.
    pub method: u32,
    /// The encoded request.
    pub body: B,
    /// When its caller stops waiting.
    pub deadline: Option<Instant>,
    /// Its request flags ([`crate::wire::METADATA`] when the body starts with a metadata block).
    pub flags: u8,
}

/// What [`CallQueue::next`] tells the driver to do.
#[derive(Debug)]
pub enum Next<B> {
    /// Start this call now (a slot is free), then report [`CallQueue::started`]; when it cannot
    /// start after all (no send buffer or ring room yet), give it back with
    /// [`CallQueue::retry_first`] and stop asking until the session progressed.
    Start(u64, QueuedCall<B>),
    /// This call ended without being sent (its status, DEADLINE_EXCEEDED, waits for its caller):
    /// count it, and release its body.
    Ended(Code, B),
}

/// Where a waiting call is ([`CallQueue::poll`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Queued {
    /// Still waiting.
    Waiting,
    /// In the slot `(slot, generation)`: poll it there from now on.
    Started(u16, u32),
    /// Ended with this status, never sent (counted when it ended).
    Ended(Status),
    /// Ended now, by this poll: its deadline passed (DEADLINE_EXCEEDED, never sent): count it.
    Expired(Status),
}

/// What [`CallQueue::abandon`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Dropped<B> {
    /// It was waiting: removed, never sent; its body to release.
    Waiting(B),
    /// It had been started in this slot `(slot, generation)`: abandon it there.
    Started(u16, u32),
    /// It had ended already, or was never known.
    Nothing,
}

/// What became of a waiting call while its caller was not looking.
#[derive(Debug)]
enum Resolved {
    Started(u16, u32),
    Ended(Status),
}

/// The calls waiting for a slot (see the module docs).
#[derive(Debug)]
pub struct CallQueue<B> {
    waiting: BTreeMap<u64, QueuedCall<B>>,
    resolved: HashMap<u64, Resolved>,
    next_seq: u64,
    max: usize,
}

fn expired() -> Status {
    Status::deadline_exceeded("deadline passed while the call waited for a slot (it was never sent)")
}

impl<B> CallQueue<B> {
    /// A queue of at most `max` waiting calls (`ClientConfig::max_queued_calls`).
    pub fn new(max: usize) -> CallQueue<B> {
        CallQueue { waiting: BTreeMap::new(), resolved: HashMap::new(), next_seq: 0, max }
    }

    /// Calls waiting.
    #[inline]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// True when no call waits.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Whether a new call must wait behind others (any call waits), even with a slot free.
    #[inline]
    pub fn must_wait(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Whether `call` may wait, before the driver encodes it: `Ok` while fewer than `max` wait.
    /// At the bound, calls whose deadline passed by `now` (read only then) but whose callers did
    /// not look yet end first (DEADLINE_EXCEEDED, kept for their callers; each body to
    /// `release`, which counts them): they wait no more, so they do not hold the places.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming `ClientConfig::max_queued_calls`, with the `in_flight` calls
    /// and those waiting.
    pub fn admit(
        &mut self,
        in_flight: u16,
        now: impl FnOnce() -> Instant,
        release: impl FnMut(B),
    ) -> Result<(), Status> {
        if self.waiting.len() < self.max {
            return Ok(());
        }
        self.end_expired(now(), release);
        if self.waiting.len() < self.max {
            return Ok(());
        }
        Err(Status::resource_exhausted(format!(
            "{in_flight} calls in flight and {} waiting for a slot: ClientConfig::max_queued_calls ({}) is exceeded",
            self.waiting.len(),
            self.max
        )))
    }

    /// Ends every waiting call whose deadline passed by `now` (the bound's cold path: it allocates).
    #[cold]
    fn end_expired(&mut self, now: Instant, mut release: impl FnMut(B)) {
        let due: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| now >= d))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in due {
            if let Some(call) = self.waiting.remove(&seq) {
                self.resolved.insert(seq, Resolved::Ended(expired()));
                release(call.body);
            }
        }
    }

    /// Queues a call admitted by [`CallQueue::admit`] behind those waiting; returns its
    /// sequence number.
    pub fn push(&mut self, call: QueuedCall<B>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.waiting.insert(seq, call);
        seq
    }

    /// The next thing to do at `now` (read only when the oldest waiting call has a deadline)
    /// with a slot free or not: end the oldest waiting calls whose deadline passed, then start
    /// the oldest one when `slot_free`. `None`: nothing (ask again when a slot frees).
    pub fn next(&mut self, now: impl FnOnce() -> Instant, slot_free: bool) -> Option<Next<B>> {
        let e = self.waiting.first_entry()?;
        if e.get().deadline.is_some_and(|d| now() >= d) {
            let (seq, call) = e.remove_entry();
            self.resolved.insert(seq, Resolved::Ended(expired()));
            return Some(Next::Ended(Code::DeadlineExceeded, call.body));
        }
        if !slot_free {
            return None;
        }
        let (seq, call) = e.remove_entry();
        Some(Next::Start(seq, call))
    }

    /// A call [`CallQueue::next`] handed out could not start yet: it is first again.
    pub fn retry_first(&mut self, seq: u64, call: QueuedCall<B>) {
        self.waiting.insert(seq, call);
    }

    /// What starting call `seq` gave: its slot `(slot, generation)`, or the status it ended
    /// with, kept for its caller.
    pub fn started(&mut self, seq: u64, r: Result<(u16, u32), Status>) {
        let r = match r {
            Ok((slot, generation)) => Resolved::Started(slot, generation),
            Err(s) => Resolved::Ended(s),
        };
        self.resolved.insert(seq, r);
    }

    /// The session broke (`why`): every waiting call ends UNAVAILABLE, never sent; `release`
    /// gets each body. Returns how many ended.
    pub fn fail_all(&mut self, why: &Status, mut release: impl FnMut(B)) -> usize {
        let s =
            Status::unavailable(format!("{} (the call waited for a slot and was never sent)", why.message()));
        let n = self.waiting.len();
        for (seq, call) in std::mem::take(&mut self.waiting) {
            self.resolved.insert(seq, Resolved::Ended(s.clone()));
            release(call.body);
        }
        n
    }

    /// Where call `seq` is at `now`: a waiting call whose `deadline` passed ends here
    /// (DEADLINE_EXCEEDED; its body to `release`). A started or ended call is reported once.
    pub fn poll(&mut self, seq: u64, now: impl FnOnce() -> Instant, release: impl FnOnce(B)) -> Queued {
        match self.resolved.remove(&seq) {
            Some(Resolved::Started(slot, generation)) => return Queued::Started(slot, generation),
            Some(Resolved::Ended(s)) => return Queued::Ended(s),
            None => {}
        }
        let Some(call) = self.waiting.get(&seq) else {
            return Queued::Ended(Status::internal("the call is not known to this session"));
        };
        if call.deadline.is_some_and(|d| now() >= d) {
            if let Some(call) = self.waiting.remove(&seq) {
                release(call.body);
            }
            return Queued::Expired(expired());
        }
        Queued::Waiting
    }

    /// A blocking caller waits for call `seq`: when no slot is free and none will free itself
    /// (`self_freeing`: abandoned calls whose answers will release their slots), nothing can
    /// start it while the caller blocks: it is removed (its body to `release`) and this is its
    /// RESOURCE_EXHAUSTED, naming the `window`.
    pub fn refuse_blocking(
        &mut self,
        seq: u64,
        slot_free: bool,
        self_freeing: usize,
        window: u16,
        release: impl FnOnce(B),
    ) -> Option<Status> {
        if slot_free || self_freeing > 0 {
            return None;
        }
        let call = self.waiting.remove(&seq)?;
        release(call.body);
        Some(Status::resource_exhausted(format!(
            "all {window} slots (ClientConfig::window) are held by calls that only their own futures can \
             finish, and a blocking call cannot wait for them: poll or drop those futures first"
        )))
    }

    /// The caller of call `seq` gave up (see [`Dropped`]).
    pub fn abandon(&mut self, seq: u64) -> Dropped<B> {
        if let Some(call) = self.waiting.remove(&seq) {
            return Dropped::Waiting(call.body);
        }
        match self.resolved.remove(&seq) {
            Some(Resolved::Started(slot, generation)) => Dropped::Started(slot, generation),
            Some(Resolved::Ended(_)) | None => Dropped::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    struct Clock(Instant);

    impl Clock {
        fn at(&self, ms: u64) -> Instant {
            self.0 + Duration::from_millis(ms)
        }
    }

    fn call(method: u32, deadline: Option<Instant>) -> QueuedCall<u32> {
        QueuedCall { method, body: method, deadline, flags: 0 }
    }

    /// Calls start in the order they waited, one per free slot; one that cannot start yet is
    /// first again; a new call waits behind them; the bound refuses the one too many, naming it.
    #[test]
    fn calls_start_in_order_as_slots_free_within_the_bound() {
        let clock = Clock(Instant::now());
        let mut q = CallQueue::new(2);
        assert!(!q.must_wait());
        q.admit(4, || clock.at(0), |_| {}).unwrap();
        let a = q.push(call(1, None));
        q.admit(4, || clock.at(0), |_| {}).unwrap();
        let b = q.push(call(2, None));
        assert!(q.must_wait(), "behind them, even with a slot free");
        let e = q.admit(4, || clock.at(0), |_| {}).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert!(
            e.message().contains("max_queued_calls (2)") && e.message().contains("4 calls in flight"),
            "{e}"
        );
        assert!(q.next(|| clock.at(0), false).is_none(), "no slot: nothing starts");
        let Some(Next::Start(seq, c)) = q.next(|| clock.at(0), true) else { panic!("a start") };
        assert_eq!((seq, c.method), (a, 1));
        q.retry_first(seq, c);
        let Some(Next::Start(seq, c)) = q.next(|| clock.at(0), true) else { panic!("a start") };
        assert_eq!((seq, c.method), (a, 1), "still first");
        q.started(seq, Ok((3, 7)));
        assert_eq!(q.poll(b, || clock.at(0), |_| panic!("not released")), Queued::Waiting);
        assert_eq!(q.poll(a, || clock.at(0), |_| {}), Queued::Started(3, 7));
        let Some(Next::Start(seq, _)) = q.next(|| clock.at(0), true) else { panic!("a start") };
        q.started(seq, Err(Status::unavailable("gone")));
        assert_eq!(q.poll(b, || clock.at(0), |_| {}).code(), Some(Code::Unavailable));
        assert!(q.is_empty() && !q.must_wait());
    }

    /// Calls without a deadline start without a clock read (the driver asks at every poll
    /// while calls wait).
    #[test]
    fn calls_without_deadlines_start_without_reading_the_clock() {
        let mut q = CallQueue::new(2);
        let a = q.push(call(1, None));
        let unread = || -> Instant { panic!("the clock was read for calls without a deadline") };
        assert!(q.next(unread, false).is_none());
        let Some(Next::Start(seq, _)) = q.next(unread, true) else { panic!("a starts") };
        assert_eq!(seq, a);
    }

    impl Queued {
        fn code(&self) -> Option<Code> {
            match self {
                Queued::Ended(s) | Queued::Expired(s) => Some(s.code()),
                _ => None,
            }
        }
    }

    /// On the fake clock: a waiting call whose deadline passed ends DEADLINE_EXCEEDED, never
    /// started (found by the driver's pump or by its caller's poll, once), and the calls behind
    /// it go on.
    #[test]
    fn a_waiting_call_past_its_deadline_ends_and_is_never_sent() {
        let clock = Clock(Instant::now());
        let mut q = CallQueue::new(8);
        let a = q.push(call(1, Some(clock.at(10))));
        let b = q.push(call(2, Some(clock.at(20))));
        let c = q.push(call(3, None));
        assert!(q.next(|| clock.at(9), false).is_none());
        let Some(Next::Ended(code, body)) = q.next(|| clock.at(10), false) else { panic!("a ends") };
        assert_eq!((code, body), (Code::DeadlineExceeded, 1));
        assert!(q.next(|| clock.at(10), false).is_none(), "b has 10 ms left");
        assert_eq!(
            q.poll(a, || clock.at(10), |_| panic!("released already")).code(),
            Some(Code::DeadlineExceeded)
        );
        let mut released = None;
        let r = q.poll(b, || clock.at(25), |body| released = Some(body));
        assert!(matches!(r, Queued::Expired(_)), "ended by this poll: {r:?}");
        assert_eq!(released, Some(2));
        let Some(Next::Start(seq, _)) = q.next(|| clock.at(1000), true) else { panic!("c starts") };
        assert_eq!(seq, c);
    }

    /// Abandoned while waiting: removed and never sent; once started: abandoned in its slot.
    /// The session breaking ends every waiting call UNAVAILABLE, never sent. A blocking caller
    /// with no slot free and none freeing itself is refused at once.
    #[test]
    fn abandon_break_and_the_blocking_caller() {
        let clock = Clock(Instant::now());
        let mut q = CallQueue::new(8);
        let a = q.push(call(1, None));
        let b = q.push(call(2, None));
        assert_eq!(q.abandon(b), Dropped::Waiting(2));
        assert_eq!(q.abandon(b), Dropped::Nothing);
        let Some(Next::Start(seq, _)) = q.next(|| clock.at(0), true) else { panic!() };
        q.started(seq, Ok((0, 1)));
        assert_eq!(q.abandon(a), Dropped::Started(0, 1));
        let c = q.push(call(3, None));
        let d = q.push(call(4, None));
        assert_eq!(q.refuse_blocking(c, true, 0, 4, |_| panic!()), None, "a slot is free");
        assert_eq!(q.refuse_blocking(c, false, 1, 4, |_| panic!()), None, "an abandoned call frees one");
        let mut released = Vec::new();
        let s = q.refuse_blocking(c, false, 0, 4, |x| released.push(x)).expect("refused");
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("all 4 slots"), "{s}");
        assert_eq!(
            q.fail_all(&Status::unavailable("the server closed the session"), |x| released.push(x)),
            1
        );
        assert_eq!(released, [3, 4]);
        let Queued::Ended(s) = q.poll(d, || clock.at(0), |_| panic!()) else { panic!() };
        assert_eq!(s.code(), Code::Unavailable);
        assert!(
            s.message().contains("the server closed the session") && s.message().contains("never sent"),
            "{s}"
        );
        assert!(q.next(|| clock.at(0), true).is_none());
    }

    /// At the bound, waiting calls whose deadline passed unpolled (behind one without a
    /// deadline, which `next` does not look past) end and free their places; their callers get
    /// DEADLINE_EXCEEDED; a bound of live calls still refuses.
    #[test]
    fn expired_calls_nobody_polled_do_not_hold_places_at_the_bound() {
        let clock = Clock(Instant::now());
        let mut q = CallQueue::new(2);
        let a = q.push(call(1, None));
        let b = q.push(call(2, Some(clock.at(10))));
        let mut released = Vec::new();
        q.admit(0, || clock.at(5), |body| released.push(body)).unwrap_err();
        assert!(released.is_empty(), "not expired yet");
        assert!(q.next(|| clock.at(20), false).is_none(), "the first has no deadline");
        q.admit(0, || clock.at(20), |body| released.push(body)).unwrap();
        assert_eq!(released, [2]);
        assert_eq!(q.len(), 1);
        let Queued::Ended(s) = q.poll(b, || clock.at(20), |_| panic!("released already")) else {
            panic!("ended")
        };
        assert_eq!(s.code(), Code::DeadlineExceeded);
        q.push(call(3, None));
        q.admit(0, || clock.at(30), |_| panic!("nothing expired")).unwrap_err();
        assert_eq!(q.poll(a, || clock.at(30), |_| {}), Queued::Waiting);
    }
}
