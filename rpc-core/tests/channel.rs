//! The shareable handle (`Channel`) under tokio's multi-thread runtime: many tasks on one handle,
//! cancellation by dropping futures (timeout, select!; the server sees the CANCEL), dropping the
//! runtime mid-call, and
//! waker-driven waiting (an executor thread waiting on a slow reply uses no CPU).

#[path = "rpc_support/mod.rs"]
mod rpc_support;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use rpc_core::{CallOptions, Channel, ChannelConfig, Code, PollingPolicy};
use rpc_support::*;

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().unwrap()
}

/// Waits (up to [`WAIT`], a hang guard) until `cond` holds; false if it never did (every caller
/// asserts it, with its own message).
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + WAIT;
    while Instant::now() < until {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

#[test]
fn eight_tasks_share_one_handle_every_reply_checked() {
    let (server, _) = spawn(server());
    let rt = runtime(2);
    let addr = server.local_addr();
    rt.block_on(async move {
        let ch = Channel::connect_with(addr, &channel_config("chan-share").dispatchers(2)).await.unwrap();
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let ch = ch.clone();
            tasks.push(tokio::spawn(async move {
                // Up to 4 calls of this task in flight at once, so all 8 tasks pipeline together.
                let mut seq = t << 32;
                let end = seq + 10_000;
                let mut window = std::collections::VecDeque::new();
                while seq < end || !window.is_empty() {
                    while seq < end && window.len() < 4 {
                        let len = (seq % 64) as usize;
                        let call = ch.unary::<EchoMsg, EchoMsg>(
                            ECHO,
                            request(seq, len, len),
                            &CallOptions::default(),
                        );
                        window.push_back((seq, len, call));
                        seq += 1;
                    }
                    let (s, len, call) = window.pop_front().unwrap();
                    let r = call.await.unwrap_or_else(|e| panic!("call {s}: {e}"));
                    check_reply(&r, s, len);
                }
                10_000
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(total, 80_000);
        // Every driver publishes the count still in flight before any task can see its result,
        // so once every task has its last reply the count is 0, with no waiting.
        assert_eq!(ch.in_flight(), 0, "calls still counted in flight after every reply was taken");
        let c = ch.counters();
        assert_eq!(c.rpcs, 80_000, "the sessions' counters, summed: {c:?}");
    });
    drop(rt);
    server.shutdown();
}

/// Resolves once the server's STASH handler holds `n` calls (fails after `WAIT`).
async fn stashed(stash: &Mutex<Vec<rpc_core::codegen::Responder<EchoMsg>>>, n: usize) {
    let until = Instant::now() + WAIT;
    while stash.lock().unwrap().len() < n {
        assert!(Instant::now() < until, "the server got {} of {n} calls", stash.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn timeout_and_select_cancel_calls_and_release_their_slots() {
    let (server, stash) = spawn(server());
    let rt = runtime(2);
    let addr = server.local_addr();
    let ch = rt
        .block_on(Channel::connect_with(
            addr,
            &channel_config("chan-cancel")
                .client(client_config().window(4).polling(PollingPolicy::Event { spins: 0 })),
        ))
        .unwrap();
    rt.block_on(async {
        // STASH is never answered until the test says so: only dropping the future ends the call.
        // Each call is polled until the server has it (a call dropped before its request left is
        // forgotten without a Cancel: seen once in eight runs in the Soft-RoCE guest, where 20 ms
        // did not always get the request out), then cancelled by a timeout, a select! or `cancel`.
        for i in 0..4u64 {
            let mut call = ch.unary::<EchoMsg, EchoMsg>(STASH, request(i, 4, 0), &CallOptions::default());
            tokio::select! {
                r = &mut call => panic!("a stashed call answered: {r:?}"),
                _ = stashed(&stash, i as usize + 1) => {}
            }
            match i {
                0 | 1 => {
                    assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err(), "timed out")
                }
                2 => tokio::select! {
                    r = call => panic!("a stashed call answered: {r:?}"),
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                },
                // The explicit form.
                _ => call.cancel(),
            }
        }
    });
    assert!(eventually(|| stash.lock().unwrap().len() == 4), "the server has the four calls");
    // The dispatcher released all four, though the server still holds them.
    assert!(
        eventually(|| ch.in_flight() == 0),
        "{} calls still in flight after their futures were dropped",
        ch.in_flight()
    );
    // Each dropped future sent a CANCEL: the server received four and sees all four calls
    // cancelled. (The flags alone would also rise at a session reset, which a client whose
    // Cancels never reach the server does after `max_abandoned`'s watch: no Cancel at all.)
    assert!(
        eventually(|| {
            server.counters().cancels == 4 && stash.lock().unwrap().iter().all(|r| r.is_cancelled())
        }),
        "the server received {} Cancels and saw {} of 4 calls cancelled; server {:?}",
        server.counters().cancels,
        stash.lock().unwrap().iter().filter(|r| r.is_cancelled()).count(),
        server.counters()
    );
    // Answers given anyway are discarded, never handed to later calls.
    for (i, r) in stash.lock().unwrap().drain(..).enumerate() {
        r.send(Ok(EchoMsg { seq: 1000 + i as u64, ..Default::default() }));
    }
    rt.block_on(async {
        for seq in 10..50u64 {
            let r = ch
                .unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 8, 8), &CallOptions::default())
                .await
                .unwrap();
            check_reply(&r, seq, 8);
        }
        // A deadline ends a call by itself, DEADLINE_EXCEEDED.
        let e = ch
            .unary::<EchoMsg, EchoMsg>(
                STASH,
                request(99, 1, 0),
                &CallOptions::deadline(Duration::from_millis(30)),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    });
    // The expired call's slot comes back once the server's DEADLINE_EXCEEDED (or the Cancel's
    // acknowledgement) arrives, a moment after the client gave up on it.
    assert!(eventually(|| ch.in_flight() == 0), "{} calls still in flight", ch.in_flight());
    drop(ch);
    drop(rt);
    server.shutdown();
}

#[test]
fn dropping_the_runtime_with_calls_in_flight_neither_hangs_nor_leaks() {
    let (server, stash) = spawn(server());
    let rt = runtime(2);
    let addr = server.local_addr();
    let ch = rt.block_on(Channel::connect_with(addr, &channel_config("chan-drop"))).unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    for t in 0..8u64 {
        let ch = ch.clone();
        let started = started.clone();
        rt.spawn(async move {
            // One call that is never answered, then echoes until the runtime goes away.
            let stuck = ch.unary::<EchoMsg, EchoMsg>(STASH, request(t, 4, 0), &CallOptions::default());
            let mut seq = t << 32;
            loop {
                let r =
                    ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 16, 16), &CallOptions::default()).await;
                check_reply(&r.unwrap(), seq, 16);
                started.fetch_add(1, Ordering::Relaxed);
                seq += 1;
                if seq == u64::MAX {
                    let _ = stuck.await;
                    break;
                }
            }
        });
    }
    drop(ch);
    assert!(eventually(|| started.load(Ordering::Relaxed) >= 100), "the tasks are calling");
    let t = Instant::now();
    drop(rt);
    assert!(t.elapsed() < Duration::from_secs(5), "dropping the runtime took {:?}", t.elapsed());
    assert!(
        eventually(|| !thread_names().iter().any(|n| n.starts_with("chan-drop"))),
        "the dispatcher thread is still running: {:?}",
        thread_names()
    );
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0, "no buffer token leaked");
    drop(stash);
    server.shutdown();
}

/// Counts wake-ups.
struct CountingWaker(AtomicUsize, std::thread::Thread);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
        self.1.unpark();
    }
}

#[test]
fn a_completion_wakes_its_task_once_and_nothing_wakes_itself() {
    let (server, _) = spawn(server());
    let ch = Channel::connect_blocking(server.local_addr(), &channel_config("chan-wake")).unwrap();
    let counter = Arc::new(CountingWaker(AtomicUsize::new(0), std::thread::current()));
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    // The server answers after 100 ms.
    let mut call =
        std::pin::pin!(ch.unary::<EchoMsg, EchoMsg>(DEFER, request(7, 0, 100), &CallOptions::default()));
    assert!(call.as_mut().poll(&mut cx).is_pending());
    assert_eq!(counter.0.load(Ordering::SeqCst), 0, "a pending poll does not wake its own task");
    let t = Instant::now();
    while counter.0.load(Ordering::SeqCst) == 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::park_timeout(Duration::from_millis(50));
    }
    assert_eq!(counter.0.load(Ordering::SeqCst), 1, "the reply woke the task once");
    match call.as_mut().poll(&mut cx) {
        Poll::Ready(r) => assert_eq!(r.unwrap().seq, 7),
        Poll::Pending => panic!("woken but not ready"),
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(counter.0.load(Ordering::SeqCst), 1, "no wake-up after the result");
    drop(ch);
    server.shutdown();
}

/// A call whose answer another poll's drive already delivered resolves at once: its poll does
/// not drive the session on (waiting for someone else's answer before handing out its own would
/// keep its task from issuing the next call; that call's poll drives).
#[test]
fn an_answer_already_delivered_is_taken_without_driving_the_session() {
    let (server, stash) = spawn(server());
    let ch = Channel::connect_blocking(
        server.local_addr(),
        &channel_config("chan-taken").poll_spin(Duration::from_millis(1)),
    )
    .unwrap();
    let waker = Arc::new(CountingWaker(AtomicUsize::new(0), std::thread::current()));
    let w = Waker::from(waker.clone());
    let mut cx = Context::from_waker(&w);
    // Never answered (nor polled: no task waits for it, so the dispatcher thread stays out of
    // the way): the session keeps a call in flight, so a driver always leaves work.
    let stuck = ch.unary::<EchoMsg, EchoMsg>(STASH, request(1, 4, 0), &CallOptions::default());
    let mut a = Box::pin(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(2, 8, 8), &CallOptions::default()));
    let mut b = Box::pin(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(3, 8, 8), &CallOptions::default()));
    let mut c = Box::pin(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(4, 8, 8), &CallOptions::default()));
    // c's polls drive the session; the server answers in order, so by the time c has its answer,
    // a's and b's were delivered too.
    let until = Instant::now() + WAIT;
    let rc = loop {
        if let Poll::Ready(r) = c.as_mut().poll(&mut cx) {
            break r;
        }
        assert!(Instant::now() < until, "c never answered");
        std::thread::park_timeout(Duration::from_millis(1));
    };
    check_reply(&rc.unwrap(), 4, 8);
    let before = ch.stats();
    for (seq, call) in [(2, &mut a), (3, &mut b)] {
        let Poll::Ready(r) = call.as_mut().poll(&mut cx) else { panic!("{seq}'s answer was not there") };
        check_reply(&r.unwrap(), seq, 8);
    }
    let after = ch.stats();
    assert_eq!(
        (after.caller_drives, after.caller_busy),
        (before.caller_drives, before.caller_busy),
        "taking a delivered answer drove the session (or tried to): {after:?}"
    );
    drop(stuck);
    drop(stash);
    server.shutdown();
}

/// With `poll_spin` zero, a call's poll drives the session one step (the request posted, the CQ
/// looked at once) and returns: no spin of empty steps on the executor's thread (it made 16
/// before its first look at the clock). Sabotage: the zero check in `Inner::drive` removed
/// (fails "made 16 steps").
#[test]
fn a_poll_with_zero_poll_spin_steps_the_session_once() {
    let (server, stash) = spawn(server());
    let cfg = channel_config("chan-zero").poll_spin(Duration::ZERO).spins(0);
    let ch = Channel::connect_blocking(server.local_addr(), &cfg).unwrap();
    // Stashed by the server: its answer cannot come while we look.
    let mut call = Box::pin(ch.unary::<EchoMsg, EchoMsg>(STASH, request(1, 8, 8), &CallOptions::default()));
    let caller_steps = |s: &rpc_core::ChannelStats| s.steps - s.thread_drives;
    let before = ch.stats();
    assert!(
        call.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending(),
        "a stashed call was answered"
    );
    let after = ch.stats();
    assert_eq!(after.caller_drives - before.caller_drives, 1, "{after:?}");
    // One empty step, and one per completion that came meanwhile (the request's send); the
    // dispatcher thread's steps (at most a few: `spins(0)` waits on completion events) are
    // subtracted, give or take one read between the two counters.
    let steps = caller_steps(&after).saturating_sub(caller_steps(&before));
    assert!(steps <= 4, "a poll with poll_spin 0 made {steps} steps: {after:?}");
    drop(call);
    drop(stash);
    drop(ch);
    server.shutdown();
}

/// Under tokio, each call spends the task's cooperative budget: a task whose answers are all
/// there (so none of its polls returns `Pending`) still yields now and then, and the runtime's
/// other tasks run (on one executor thread, they would wait until it is done).
#[test]
fn a_task_whose_answers_are_all_there_yields_to_the_other_tasks() {
    let (server, _) = spawn(server());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let addr = server.local_addr();
    let other_ran = rt.block_on(async move {
        let ch = Channel::connect_with(addr, &channel_config("chan-coop")).await.unwrap();
        let mut calls: Vec<_> = (0..400u64)
            .map(|s| (s, ch.unary::<EchoMsg, EchoMsg>(ECHO, request(s, 8, 8), &CallOptions::default())))
            .collect();
        // The last call's answer comes last: once it is there, every other answer was delivered.
        let (s, last) = calls.pop().unwrap();
        check_reply(&last.await.unwrap(), s, 8);
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        // Runs only when this task yields (one executor thread).
        tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        for (s, call) in calls {
            check_reply(&call.await.unwrap(), s, 8);
        }
        ran.load(Ordering::SeqCst)
    });
    drop(rt);
    server.shutdown();
    assert!(other_ran, "399 answers taken without the other task running once");
}

#[test]
fn calls_from_one_task_are_started_by_its_own_polls_not_the_dispatcher_thread() {
    let (server, _) = spawn(server());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ch = rt.block_on(Channel::connect_with(server.local_addr(), &channel_config("chan-comb"))).unwrap();
    rt.block_on(async {
        for seq in 0..1000u64 {
            let r = ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 16, 16), &CallOptions::default()).await;
            check_reply(&r.unwrap(), seq, 16);
        }
    });
    // Each call finds the session free when it is made and starts on this thread. (A reply later than poll_spin is waited for by the dispatcher thread, which then
    // leaves the session to the task it woke: the next call is started by that task's poll.)
    // At most 1 % by the dispatcher thread: when it waited for a reply and woke the task, the
    // task's next call can be queued before the dispatcher let go of the session, and then the
    // dispatcher starts it (seen once in 1000 in the Soft-RoCE guest, whose emulated CPU stretches
    // that window; 0 on sim). Before callers drove their own calls, all 1000 went through it.
    let (callers, thread) = ch.calls_started();
    assert_eq!(callers + thread, 1000, "calls started by callers' polls, by the dispatcher thread");
    assert!(
        thread <= 10,
        "{thread} of 1000 calls started by the dispatcher thread, {callers} by callers' polls"
    );
    drop(ch);
    server.shutdown();
}

/// A call made while its session is free (nothing queued, a slot free) starts at once, in the
/// caller's thread, before its first poll: no queue between the caller and the session, and the
/// request is encoded there and then. One whose request is over the session's size limit ends at
/// once with RESOURCE_EXHAUSTED; one made while the window is full waits in the queue.
#[test]
fn a_call_made_on_a_free_session_starts_before_its_first_poll() {
    let (server, stash) = spawn(server());
    let cfg = channel_config("chan-now")
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }).window(2).max_message_size(4096));
    let ch = Channel::connect_blocking(server.local_addr(), &cfg).unwrap();
    let opts = CallOptions::default();
    let first = ch.unary::<EchoMsg, EchoMsg>(ECHO, request(1, 16, 16), &opts);
    assert_eq!(ch.calls_started(), (1, 0), "a call on a free session is started before its first poll");
    assert_eq!(ch.in_flight(), 1);
    check_reply(&block_on(first).unwrap(), 1, 16);
    let big = ch.unary::<EchoMsg, EchoMsg>(ECHO, request(2, 8192, 0), &opts);
    let e = block_on(big).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    // Two stashed calls fill the window: the third waits in the queue until a slot is free.
    let held: Vec<_> = (3..5).map(|s| ch.unary::<EchoMsg, EchoMsg>(STASH, request(s, 8, 8), &opts)).collect();
    assert_eq!(ch.calls_started(), (3, 0));
    let queued = ch.unary::<EchoMsg, EchoMsg>(ECHO, request(5, 8, 8), &opts);
    assert_eq!(ch.calls_started(), (3, 0), "a call made while the window is full is queued");
    let mut held = held.into_iter();
    let mut one = Box::pin(held.next().unwrap());
    // The server holds both: answer the first, then the queued call goes out.
    let until = Instant::now() + WAIT;
    while stash.lock().unwrap().len() < 2 {
        assert!(Instant::now() < until, "the stashed calls never reached the server");
        let _ = one.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = stash.lock().unwrap().remove(0);
    r.send(Ok(EchoMsg { seq: 3, ..EchoMsg::default() }));
    assert_eq!(block_on(one).unwrap().seq, 3);
    check_reply(&block_on(queued).unwrap(), 5, 8);
    assert_eq!(ch.calls_started().0 + ch.calls_started().1, 4);
    drop(held);
    drop(stash);
    drop(ch);
    server.shutdown();
}

thread_local! {
    /// A call kept by a thread until its end (see the test below).
    static KEPT: std::cell::RefCell<Vec<rpc_core::UnaryCall<EchoMsg>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A call dropped while its thread's locals are torn down (a future kept in a thread local) is
/// cancelled like any other, without touching the channel's own thread locals, which may be gone
/// by then (that would abort the process).
#[test]
fn a_call_dropped_at_its_threads_teardown_is_cancelled_cleanly() {
    let (server, stash) = spawn(server());
    let ch = Channel::connect_blocking(server.local_addr(), &channel_config("chan-tls")).unwrap();
    let c = ch.clone();
    std::thread::spawn(move || {
        // Registered first, so torn down after the locals the calls below use.
        KEPT.with(|_| {});
        let opts = CallOptions::default();
        // One finished (its state kept for reuse), one in flight (its drop cancels it).
        let done = c.unary::<EchoMsg, EchoMsg>(ECHO, request(1, 8, 8), &opts);
        check_reply(&block_on(done).unwrap(), 1, 8);
        let finished = c.unary::<EchoMsg, EchoMsg>(ECHO, request(2, 8, 8), &opts);
        let mut finished = Box::pin(finished);
        let until = Instant::now() + WAIT;
        while finished.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending() {
            assert!(Instant::now() < until, "no answer");
        }
        KEPT.with(|k| k.borrow_mut().push(c.unary::<EchoMsg, EchoMsg>(STASH, request(3, 8, 8), &opts)));
        let last = c.unary::<EchoMsg, EchoMsg>(ECHO, request(4, 8, 8), &opts);
        KEPT.with(|k| k.borrow_mut().push(last));
    })
    .join()
    .expect("the thread ended cleanly");
    assert!(eventually(|| ch.in_flight() == 0), "{} calls still in flight", ch.in_flight());
    drop(stash);
    drop(ch);
    server.shutdown();
}

#[test]
fn a_dispatcher_waiting_for_a_completion_event_leaves_the_session_to_callers() {
    let (server, _) = spawn(server());
    // A caller's poll tries the session once (one step); the dispatcher thread sleeps on
    // completion events (1 ms at a time) while a slow call waits.
    let cfg = channel_config("chan-evwait").poll_spin(Duration::ZERO);
    let ch = Channel::connect_blocking(server.local_addr(), &cfg).unwrap();
    let counter = Arc::new(CountingWaker(AtomicUsize::new(0), std::thread::current()));
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    // The server would answer after 10 min (the call is dropped first): its task waits all
    // through the loop, so the dispatcher thread drives for it. (With 2 s, the Soft-RoCE guest at
    // host load 10 once took longer over the ten rounds: the answer came, no task waited, the
    // dispatcher stopped its event waits and the next round's wait for them failed.)
    let mut slow =
        Box::pin(ch.unary::<EchoMsg, EchoMsg>(DEFER, request(1, 0, 600_000), &CallOptions::default()));
    assert!(slow.as_mut().poll(&mut cx).is_pending());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (mut callers, mut thread) = (0, 0);
    for seq in 0..10u64 {
        // The dispatcher thread is (back) in its event waits: a caller's calls made it let go.
        let waits = ch.stats().event_waits;
        assert!(eventually(|| ch.stats().event_waits >= waits + 2), "no event waits: {:?}", ch.stats());
        let before = ch.calls_started();
        let r =
            rt.block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(seq, 16, 16), &CallOptions::default()));
        check_reply(&r.unwrap(), seq, 16);
        let after = ch.calls_started();
        callers += after.0 - before.0;
        thread += after.1 - before.1;
    }
    eprintln!(
        "while the dispatcher waits on events: {callers} calls started by callers' polls, {thread} by it"
    );
    // Were the session held through each event wait, each call's poll would find it held and
    // leave the call to the dispatcher thread. (The poll can still meet the dispatcher in its
    // short step between two waits: rarely.)
    assert_eq!(callers + thread, 10);
    assert!(thread <= 2, "{thread} of 10 calls started by the dispatcher thread while it waits on events");
    drop(slow);
    drop(ch);
    server.shutdown();
}

/// The CPUs thread `name` of this process may run on (`Cpus_allowed_list` of its status, e.g.
/// "1" or "0-1"); `None` when no thread has that name.
fn allowed_cpus(name: &str) -> Option<String> {
    for e in std::fs::read_dir("/proc/self/task").ok()? {
        // (A thread that ended meanwhile, such as one that connected a session, is skipped.)
        let Ok(e) = e else { continue };
        let p = e.path();
        let Ok(comm) = std::fs::read_to_string(p.join("comm")) else { continue };
        if comm.trim() == name {
            let status = std::fs::read_to_string(p.join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:"))?;
            return Some(line["Cpus_allowed_list:".len()..].trim().to_owned());
        }
    }
    None
}

/// `ChannelConfig::core_ids` puts dispatcher `i`'s session on the thread of core
/// `core_ids[i % len]` (what the kernel lets each dispatcher thread run on is that core alone),
/// and an unpinned channel's dispatcher thread keeps every CPU of the process; calls go through
/// the pinned dispatchers.
#[test]
fn dispatchers_run_pinned_to_the_configured_cores() {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    if cores.len() < 2 {
        eprintln!("skipped dispatchers_run_pinned_to_the_configured_cores: fewer than 2 cores");
        return;
    }
    let (a, b) = (cores[0].id, cores[1].id);
    let (server, _) = spawn(server());
    let pinned = channel_config("rpc-pin").dispatchers(3).core_ids(vec![b, a]);
    let ch = Channel::connect_blocking(server.local_addr(), &pinned).unwrap();
    let free = Channel::connect_blocking(server.local_addr(), &channel_config("rpc-free")).unwrap();
    // (A thread takes its name once it runs: a dispatcher thread just started may not have.)
    let cpus = |name: &str| {
        assert!(eventually(|| allowed_cpus(name).is_some()), "no thread {name}: {:?}", thread_names());
        allowed_cpus(name).unwrap()
    };
    // One dispatcher thread per core, `NAME-K` on core K (dispatcher 2 wraps around to
    // core_ids[0]: its session is on the thread of core b, with dispatcher 0's).
    assert_eq!(cpus(&format!("rpc-pin-{b}")), b.to_string());
    assert_eq!(cpus(&format!("rpc-pin-{a}")), a.to_string());
    let named = |name: String| thread_names().iter().filter(|n| **n == name).count();
    assert_eq!(
        [named(format!("rpc-pin-{b}")), named(format!("rpc-pin-{a}"))],
        [1, 1],
        "three sessions on two cores: two threads: {:?}",
        thread_names()
    );
    let all = std::fs::read_to_string("/proc/self/status").unwrap();
    let all = all.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap()
        ["Cpus_allowed_list:".len()..]
        .trim();
    assert_eq!(cpus("rpc-free"), all, "an unpinned dispatcher keeps the process's CPUs");
    let rt = runtime(2);
    rt.block_on(async {
        for i in 0..30u64 {
            let r: EchoMsg = ch.unary(ECHO, request(i, 16, 16), &CallOptions::default()).await.unwrap();
            check_reply(&r, i, 16);
        }
    });
    drop((ch, free));
}

/// CPU time of the calling thread in µs (the scheduler's run time, `/proc/thread-self/schedstat`,
/// in ns: finer than getrusage's ticks and needing no FFI).
fn thread_cpu_us() -> u64 {
    schedstat_us(std::path::Path::new("/proc/thread-self")).expect("schedstat readable")
}

fn schedstat_us(task: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(task.join("schedstat")).ok()?;
    Some(s.split_whitespace().next()?.parse::<u64>().ok()? / 1000)
}

/// CPU time of thread `name` of this process, in µs.
fn named_thread_cpu_us(name: &str) -> Option<u64> {
    for e in std::fs::read_dir("/proc/self/task").ok()? {
        let p = e.ok()?.path();
        if std::fs::read_to_string(p.join("comm")).ok()?.trim() == name {
            return schedstat_us(&p);
        }
    }
    None
}

#[test]
fn an_executor_thread_waiting_on_a_slow_reply_uses_no_cpu() {
    let (server, _) = spawn(server());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ch = rt.block_on(Channel::connect_with(server.local_addr(), &channel_config("chan-idle"))).unwrap();
    let dispatcher_before = named_thread_cpu_us("chan-idle-0");
    let (cpu0, t0) = (thread_cpu_us(), Instant::now());
    // The server answers from a thread of its own after 1 s (a deferred reply).
    let r = rt.block_on(ch.unary::<EchoMsg, EchoMsg>(DEFER, request(3, 0, 1000), &CallOptions::default()));
    let (cpu, wall) = (thread_cpu_us() - cpu0, t0.elapsed());
    assert_eq!(r.unwrap().seq, 3);
    let dispatcher = named_thread_cpu_us("chan-idle-0").zip(dispatcher_before).map(|(a, b)| a - b);
    eprintln!(
        "waiting {wall:?} on a deferred reply: executor thread {cpu} µs CPU ({:.3} % of a core), dispatcher {dispatcher:?} µs",
        cpu as f64 / wall.as_micros() as f64 * 100.0
    );
    assert!(wall >= Duration::from_millis(1000));
    // The bound is the goal on sim. In the Soft-RoCE guest (a CPU emulated by qemu's TCG, tens of
    // times slower, where each post and CQ arm is a system call into rxe) the same wait measured
    // 24-29 ms of the executor thread's CPU (2.2-2.7 %): printed above, not asserted.
    if matches!(transport(), rpc_core::Transport::Sim) {
        assert!(
            (cpu as u128) * 100 < wall.as_micros(),
            "the executor thread used {cpu} µs of CPU in {wall:?} (1 % is the bound)"
        );
    }
    drop(ch);
    server.shutdown();
}

#[test]
fn connect_errors_are_statuses() {
    let rt = runtime(1);
    // A port nothing listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let e = rt.block_on(Channel::connect_with(addr, &channel_config("chan-err"))).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    let e = rt.block_on(Channel::connect_with(addr, &channel_config("chan-err").dispatchers(0))).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("dispatchers"), "{e}");
}

/// A call dropped while its request still leaves in pieces (the server's ring is full and its
/// worker reads nothing yet) owes the server the rest of the request and then its Cancel, with
/// no other call in flight to drive the session: the dispatcher drives for them. Before, the
/// dispatcher stopped once no call was in flight, so the pieces and the Cancel waited for the
/// next call (the stash stayed empty: "the server got 0 calls"; the intermittent rxe0 failure of
/// `rpc_stream_in::a_channel_sender_stalls_...` had the same shape).
#[test]
fn a_call_dropped_while_its_request_leaves_in_pieces_still_reaches_the_server_as_a_cancel() {
    let (hold, gate) = Hold::new();
    let svc = TestService::default();
    let stash = svc.stash.clone();
    let server = server()
        .ring_bytes(256 << 10)
        .ring_idle(None)
        .add_service(svc)
        .add_service(hold)
        .spawn("127.0.0.1:0")
        .unwrap();
    let addr = server.local_addr();
    let rt = runtime(1);
    let ch = rt.block_on(Channel::connect_with(addr, &channel_config("chan-pieces"))).unwrap();
    // The server's ring is granted on demand (protocol 12): a first ring body gets it while the
    // worker still answers (kept: `ring_idle(None)`), so the request below leaves in pieces.
    rt.block_on(async {
        let r = ch
            .unary::<EchoMsg, EchoMsg>(ECHO, request(0, 100 << 10, 8), &CallOptions::default())
            .await
            .unwrap();
        check_reply(&r, 0, 8);
    });
    // A blocking client holds the server's one worker: nothing the channel sends is read (and no
    // ring space comes back) until the gate opens.
    let holder = std::thread::spawn(move || {
        let c = rpc_core::Client::connect_with(addr, &client_config()).unwrap();
        c.unary::<_, EchoMsg>(HOLD, &request(0, 0, 0), &CallOptions::default()).map(|_| ())
    });
    if !eventually(|| gate.entered() || holder.is_finished()) || !gate.entered() {
        // Say why (seen once in six runs in the Soft-RoCE guest, where the unwinding then hung).
        let why = if holder.is_finished() {
            format!("the holder's call ended: {:?}", holder.join())
        } else {
            "the holder's HOLD call is still waiting (connect or call)".to_owned()
        };
        let counters = server.counters();
        // Release a HOLD that arrives now, before the server's drop joins its worker.
        drop(gate);
        panic!("the worker is not held: {why}; server {counters:?}");
    }
    let big = 2 << 20;
    rt.block_on(async {
        let call = ch.unary::<EchoMsg, EchoMsg>(STASH, request(1, big, 0), &CallOptions::default());
        assert!(tokio::time::timeout(Duration::from_millis(100), call).await.is_err(), "answered");
    });
    // Released by the next step of a driver (at once on sim; in the Soft-RoCE guest at host load
    // 10 the dispatcher thread had not stepped yet once in ten runs).
    assert!(eventually(|| ch.in_flight() == 0), "a dropped call is still in flight: {}", ch.in_flight());
    assert!(stash.lock().unwrap().is_empty(), "the whole request arrived while the worker was held");
    drop(gate);
    holder.join().unwrap().unwrap();
    let cancelled = eventually(|| stash.lock().unwrap().first().is_some_and(|r| r.is_cancelled()));
    let got = stash.lock().unwrap().len();
    assert!(cancelled, "the server got {got} calls, none cancelled ({:?})", server.counters());
    assert!(eventually(|| server.counters().cancels == 1), "{:?}", server.counters());
    // The slot came back: the channel goes on.
    rt.block_on(async {
        let r = ch.unary::<EchoMsg, EchoMsg>(ECHO, request(2, 8, 8), &CallOptions::default()).await.unwrap();
        check_reply(&r, 2, 8);
    });
    stash.lock().unwrap().clear();
    drop(ch);
    drop(rt);
    server.shutdown();
}

/// A `Channel` whose server goes away and comes back on the same address reconnects, as a
/// `Client` does: the first call after the break tries at once and fails (nobody listens),
/// calls during the backoff fail at once naming when the next attempt may be made (no connect
/// per call), and once the server is back a call reconnects and is answered; the channel's
/// counters span both sessions. Sabotaged: the dispatcher thread not redialing
/// (`Driver::begin_redial` not called): the first call after the break waited forever ("the
/// call never ended", after the hang guard).
#[test]
fn a_channel_reconnects_to_a_restarted_server_with_backoff() {
    const BACKOFF: Duration = Duration::from_millis(300);
    let (first, _) = spawn(server());
    let addr = first.local_addr();
    let rt = runtime(1);
    let client = client_config()
        .polling(PollingPolicy::Event { spins: 0 })
        .reconnect_initial_backoff(BACKOFF)
        .reconnect_multiplier(2.0)
        .reconnect_jitter(0.0);
    let config = ChannelConfig::default().client(client).dispatchers(1).spins(500).thread_name("chan-redial");
    let ch = rt.block_on(Channel::connect_with(addr, &config)).unwrap();
    // A hang guard: a call that never ends fails the test.
    let call = |seq: u64| {
        let f = ch.unary::<_, EchoMsg>(ECHO, request(seq, 8, 8), &CallOptions::default());
        rt.block_on(async { tokio::time::timeout(WAIT, f).await.expect("the call never ended") })
    };
    check_reply(&call(1).unwrap(), 1, 8);
    first.shutdown();

    // The break is seen (the server's Close), then the first call after it tries at once.
    let mut seq = 2;
    let err = loop {
        assert!(seq < 10_000, "the channel never saw the server go");
        seq += 1;
        match call(seq) {
            Ok(r) => check_reply(&r, seq, 8),
            Err(e) if e.message().contains("reconnect attempt 1 failed") => break e,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert_eq!(ch.reconnect_attempts(), 1);
    // During the backoff: at once, naming the time left, without connecting.
    for i in 0..20 {
        let e = call(100 + i).unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e}");
        let ms = next_attempt_ms(&e);
        assert!(ms <= BACKOFF.as_millis() as u64, "{e}");
    }
    assert_eq!(ch.reconnect_attempts(), 1, "no connect attempt during the backoff");

    // The server comes back on the same address: a call reconnects and is answered.
    let svc = TestService::default();
    let second = server().add_service(svc).spawn(addr.to_string()).expect("the same port again");
    let give_up = Instant::now() + WAIT;
    let r = loop {
        match call(200) {
            Ok(r) => break r,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e}");
                assert!(
                    Instant::now() < give_up,
                    "never reconnected ({} attempts): {e}",
                    ch.reconnect_attempts()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    check_reply(&r, 200, 8);
    for i in 0..10 {
        check_reply(&call(300 + i).unwrap(), 300 + i, 8);
    }
    // Attempts were spaced by the backoff (300 ms, then 600 ms, ...), not one per call.
    let attempts = ch.reconnect_attempts();
    assert!((2..=6).contains(&attempts), "{attempts} attempts");
    assert_eq!(ch.counters().sessions_opened, 2);
    drop(ch);
    second.shutdown();
}
