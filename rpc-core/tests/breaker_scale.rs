//! Adversarial tests of the scale changes: idle sessions sharing their SRQ reservations beyond
//! `ServerConfig::srq_idle_wqes` (`session::SrqRoom`), the worker's free-entry stack and
//! sessions-by-id map, and a thread's clients sharing its `Endpoint` while they move to other
//! threads, lose their server and are dropped there (the sim's grace periods under it).
//!
//! Sabotaged, each test failed (see each test's note).

#[path = "rpc_support/mod.rs"]
mod rpc_support;

#[macro_use]
#[allow(unused_macros)]
#[path = "conformance/mod.rs"]
mod conformance;

use std::net::SocketAddr;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use rpc_core::session::srq_need_ringless;
use rpc_core::{CallOptions, Client, Code, ServerConfig};
use rpc_support::*;

/// Long enough for a wait that must succeed, short enough that a sabotaged run fails quickly.
const SOON: Duration = Duration::from_secs(20);

/// The tests of this file run one at a time: they load both cores, and the last counts the
/// process's sim device contexts (`SimStats::contexts_opened`, process-wide).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sessions per client thread in the sharing test.
const PER_THREAD: usize = 40;

/// Connects `n` clients of window 2 (the connect order is the sessions' order).
fn connect_all(addr: SocketAddr, n: usize) -> Vec<Client> {
    (0..n)
        .map(|i| {
            Client::connect_with(addr, &client_config().window(2))
                .unwrap_or_else(|e| panic!("session {i} refused: {e}"))
        })
        .collect()
}

/// Every client fires its whole window of small calls at once (the worker's SRQ is far smaller
/// than what their bases sum to: some SENDs wait on RNR), `rounds` times; every answer is the
/// one asked for, on the session that asked.
fn all_at_once(clients: &[Client], tag: u64, rounds: u64) {
    for round in 0..rounds {
        let seq = |i: usize, k: u64| tag << 32 | round << 16 | (i as u64) << 4 | k;
        let calls: Vec<_> = clients
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                (0..2).map(move |k| {
                    (
                        seq(i, k),
                        c.unary_async::<_, EchoMsg>(
                            ECHO,
                            &request(seq(i, k), 64, 200),
                            &CallOptions::default(),
                        ),
                    )
                })
            })
            .collect();
        for (s, f) in calls {
            let r = block_on(f).unwrap_or_else(|e| panic!("call {s:#x} failed: {e}"));
            check_reply(&r, s, 200);
        }
    }
}

/// Drops the second half of `clients`, each with a call in flight (a raise among them, the
/// window being 2 at 1 credit) as it goes.
fn drop_half_calling(clients: &mut Vec<Client>) {
    let gone = clients.split_off(clients.len() / 2);
    let pending: Vec<_> = gone
        .iter()
        .map(|c| c.unary_async::<_, EchoMsg>(ECHO, &request(7, 64, 200), &CallOptions::default()))
        .collect();
    drop(pending);
    drop(gone);
}

/// An SRQ that holds 3 idle sessions one by one (`srq_depth` 3 bases of 1 credit) and shares
/// one base's WQEs among the idle ones (`srq_idle_wqes` the least valid): 80 sessions from two
/// threads are admitted, their bases sum to 26 × the SRQ, and every one fires its window at
/// once, three rounds, while raises (1 → 2 credits) take what the extras may; then half of them
/// are dropped with calls in flight (some mid-raise) while the others call on, and once all are
/// gone nothing stays reserved: `srq_reserved` and `srq_bases` are 0. No session is closed by
/// the server, no call fails.
///
/// Sabotaged: `Credits::drop` not giving the base back (`room.leave` skipped): "every
/// reservation given back" gave up (sessions_closed 80, srq_bases 2800). `counted` summing the
/// bases without the share: "session 1 refused: ... srq_depth 105 cannot hold another session
/// of 1 credits (35 receive WQEs) on a worker whose sessions reserve 105".
#[test]
fn sessions_past_strict_capacity_all_call_at_once_and_give_every_reservation_back() {
    let _g = serial();
    let base = srq_need_ringless(1);
    let depth = 3 * base;
    let (server, _) = spawn(
        server()
            .initial_credits(1)
            .credits_per_session(2)
            .srq_depth(depth)
            .srq_idle_wqes(base)
            .max_sessions(128)
            .credit_idle(Some(Duration::from_millis(20))),
    );
    let addr = server.local_addr();
    let (go_tx, go) = mpsc::channel::<()>();
    let (half_tx, half) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let other = s.spawn(move || {
            let mut mine = connect_all(addr, PER_THREAD);
            go.recv().unwrap();
            all_at_once(&mine, 2, 3);
            drop_half_calling(&mut mine);
            half_tx.send(()).unwrap();
            all_at_once(&mine, 3, 2);
            mine
        });
        let mut mine = connect_all(addr, PER_THREAD);
        let all = 2 * PER_THREAD as u64;
        let c = counters_when(&server, "every session admitted", SOON, |c| c.sessions_opened == all);
        assert_eq!(c.srq_bases, all * u64::from(base), "every base counted: {c:?}");
        assert!(c.srq_reserved <= u64::from(depth), "the reservations within the SRQ: {c:?}");
        go_tx.send(()).unwrap();
        all_at_once(&mine, 1, 3);
        half.recv().unwrap();
        drop_half_calling(&mut mine);
        all_at_once(&mine, 4, 2);
        let theirs = other.join().expect("the other thread's calls all succeeded");
        for c in mine.iter().chain(&theirs) {
            assert!(c.closed_reason().is_none(), "a kept session closed: {:?}", c.closed_reason());
        }
        let c = server.counters();
        assert_eq!((c.malformed, c.idle_closed, c.peers_lost), (0, 0, 0), "{c:?}");
        drop(theirs);
        drop(mine);
    });
    let c = counters_when(&server, "every reservation given back", SOON, |c| {
        c.sessions_closed == 2 * PER_THREAD as u64 && c.srq_reserved == 0 && c.srq_bases == 0
    });
    assert_eq!(c.malformed, 0, "{c:?}");
}

/// `srq_idle_wqes` below one idle session's base is refused at spawn, naming the field; at
/// `u32::MAX` (no sharing) an SRQ of 3 bases admits 3 sessions and refuses the 4th cleanly
/// (RESOURCE_EXHAUSTED naming `srq_depth`) while the 3 serve, and once one goes a new one fits.
///
/// Sabotaged: the `srq_idle_wqes` check in `ServerConfig::validate` removed: failed ("a share
/// below one base"). `SrqRoom::sharing` capping the share at 64 (so `u32::MAX` shares): "a 4th
/// session admitted past 3 strict bases".
#[test]
fn srq_idle_wqes_is_validated_and_u32_max_admits_strictly() {
    let _g = serial();
    let base = srq_need_ringless(1);
    let err = server()
        .initial_credits(1)
        .srq_idle_wqes(base - 1)
        .add_service(TestService::default())
        .spawn("127.0.0.1:0")
        .err()
        .expect("a share below one base");
    let text = err.to_string();
    assert!(text.contains("srq_idle_wqes") && text.contains(&base.to_string()), "{text}");
    // The least valid share spawns.
    let ok = server().initial_credits(1).srq_idle_wqes(base).add_service(TestService::default());
    ok.spawn("127.0.0.1:0").expect("a share of one base").shutdown();

    let (server, _) =
        spawn(server().initial_credits(1).credits_per_session(2).srq_depth(3 * base).srq_idle_wqes(u32::MAX));
    let mut clients = connect_all(server.local_addr(), 3);
    let refused = Client::connect_with(server.local_addr(), &client_config().window(2))
        .err()
        .unwrap_or_else(|| panic!("a 4th session admitted past 3 strict bases: {:?}", server.counters()));
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
    assert!(refused.message().contains("srq_depth"), "{refused}");
    all_at_once(&clients, 5, 2);
    drop(clients.remove(0));
    counters_when(&server, "a session closed", SOON, |c| {
        c.sessions_closed == 1 && c.srq_bases == 2 * u64::from(base)
    });
    clients.push(Client::connect_with(server.local_addr(), &client_config().window(2)).expect("room again"));
    all_at_once(&clients, 6, 2);
    assert_eq!(ServerConfig::default().srq_idle_wqes, 4096);
}

/// One worker of 3 entries, churned: each round the oldest session goes and a new one takes
/// its entry (popped from the free stack, a new generation), then a 4th is refused cleanly
/// while the 3 are live; every call's answer is its own (a wrong tag or generation would
/// misroute or drop one). 30 rounds.
///
/// Sabotaged: `close_entry` not pushing the entry back on the free stack: "gave up after 20.0s
/// waiting for a new session of round 0 to be admitted and served". (Not removing the session
/// from `by_session`: passed; a stale id is reached only by a listener Close that comes after
/// the worker closed the session and its entry was reused, which no public client can time.)
#[test]
fn a_full_worker_churned_refuses_one_more_and_routes_every_answer_to_its_session() {
    let _g = serial();
    let (server, _) = spawn(server().max_sessions(3).initial_credits(1).credits_per_session(2));
    let mut clients = connect_all(server.local_addr(), 3);
    for round in 0..30u64 {
        let over = Client::connect_with(server.local_addr(), &client_config().window(2));
        match over {
            Err(e) => assert_eq!(e.code(), Code::ResourceExhausted, "round {round}: {e}"),
            Ok(c) => panic!("round {round}: a 4th session admitted to a full server: {:?}", c.counters()),
        }
        all_at_once(&clients, 100 + round, 1);
        drop(clients.remove(0));
        let closed = round + 1;
        counters_when(&server, "the oldest session closed", SOON, |c| c.sessions_closed >= closed);
        let fresh = wait_for(
            &format!("a new session of round {round} to be admitted and served"),
            SOON,
            || {
                let c = Client::connect_with(server.local_addr(), &client_config().window(2)).ok()?;
                let r: EchoMsg = c.unary(ECHO, &request(round, 8, 8), &CallOptions::default()).ok()?;
                check_reply(&r, round, 8);
                Some(c)
            },
            || format!("server {:?}", server.counters()),
        );
        clients.push(fresh);
    }
    all_at_once(&clients, 999, 2);
    let c = counters_when(&server, "33 sessions counted", SOON, |c| c.sessions_opened >= 33);
    assert_eq!((c.sessions_opened, c.sessions_closed, c.malformed), (33, 30, 0), "{c:?}");
}

/// A thread's clients share its endpoint; two of them move to another thread, call there
/// while the first thread calls on the others, and are dropped there (their QPs and MRs
/// destroyed while the other thread's transfers run); one server dies while the clients of the
/// other keep serving; once every client of the thread is gone, a new connect works (a new
/// endpoint). No call of a live server fails.
///
/// Sabotaged: `Endpoint::per_thread` leaking a strong reference to the endpoint it opens (so
/// it never closes): "the endpoint closed with its last client and a new one opened" failed
/// (no context opened: 1, not 2).
#[test]
fn a_threads_clients_moved_dropped_elsewhere_and_a_dead_server_leave_the_others_serving() {
    if transport() != rpc_core::Transport::Sim {
        eprintln!("skipped: counts the software NIC's device contexts (sim only)");
        return;
    }
    let _g = serial();
    let (a, _) = spawn(server());
    let (b, _) = spawn(server());
    let cfg = client_config().window(4).peer_timeout(Some(Duration::from_millis(500)));
    let before = rpc_core::verbs::sim::stats().contexts_opened;
    let mut to_a: Vec<Client> = (0..3).map(|_| Client::connect_with(a.local_addr(), &cfg).unwrap()).collect();
    let to_b: Vec<Client> = (0..3).map(|_| Client::connect_with(b.local_addr(), &cfg).unwrap()).collect();
    let moved: Vec<Client> = to_a.drain(..2).collect();
    let (done_tx, done) = mpsc::channel::<()>();
    let elsewhere = std::thread::spawn(move || {
        for round in 0..20 {
            for (i, c) in moved.iter().enumerate() {
                echo_checked(c, round * 10 + i as u64, 3000, 3000);
            }
        }
        // Dropped here, while the first thread's clients call.
        drop(moved);
        done_tx.send(()).unwrap();
    });
    let mut seq = 0u64;
    let call_all = |clients: &[Client], seq: &mut u64| {
        for c in clients {
            echo_checked(c, *seq, 3000, 3000);
            *seq += 1;
        }
    };
    while done.try_recv().is_err() {
        call_all(&to_a, &mut seq);
        call_all(&to_b, &mut seq);
    }
    elsewhere.join().expect("the moved clients' calls succeeded");
    // Server a dies; b's clients keep serving on the same endpoint.
    drop(a);
    for c in &to_a {
        wait_until_closed(c);
    }
    for _ in 0..20 {
        call_all(&to_b, &mut seq);
    }
    drop(to_a);
    drop(to_b);
    let opened = rpc_core::verbs::sim::stats().contexts_opened - before;
    assert_eq!(opened, 1, "the thread's 6 clients (and their reconnects) on one endpoint");
    let again = Client::connect_with(b.local_addr(), &cfg).expect("a connect after all are gone");
    echo_checked(&again, 1, 3000, 3000);
    let now = rpc_core::verbs::sim::stats().contexts_opened - before;
    assert_eq!(now, opened + 1, "the endpoint closed with its last client and a new one opened");
}

/// A deferred answer of a session that is gone must not reach the session that took its
/// worker entry (the free stack hands the same entry to the next session at once): session A's
/// call is held at the server, A goes, B takes A's entry and makes the same call (same slot,
/// same call generation), then A's answer is sent before B's: B gets its own answer only.
///
/// Sabotaged: `Worker::open` and `Worker::close_entry` not bumping the entry's generation: B
/// got A's answer ("B's call answered with seq 111"). (Either bump alone keeps the test
/// passing: each makes the tag new.)
#[test]
fn a_gone_sessions_late_answer_never_reaches_the_session_in_its_entry() {
    let _g = serial();
    let (server, stash) = spawn(server().max_sessions(2).initial_credits(1).credits_per_session(2));
    let keep = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    echo_checked(&keep, 0, 8, 8);
    let a = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    let held = a.unary_async::<_, EchoMsg>(STASH, &request(1, 8, 0), &CallOptions::default());
    wait_stashed("A's call held at the server", 1, &stash, &a, &server);
    drop(held);
    drop(a);
    counters_when(&server, "A closed", SOON, |c| c.sessions_closed == 1);
    let b = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    let mine = b.unary_async::<_, EchoMsg>(STASH, &request(2, 8, 0), &CallOptions::default());
    wait_stashed("B's call held at the server", 2, &stash, &b, &server);
    let mut held = std::mem::take(&mut *stash.lock().unwrap());
    let theirs = held.remove(0);
    theirs.send(Ok(EchoMsg { seq: 111, ..Default::default() }));
    // A's answer is handled by the worker before B's is sent (a call of the other session in
    // between, on the same worker).
    echo_checked(&keep, 3, 8, 8);
    held.remove(0).send(Ok(EchoMsg { seq: 222, ..Default::default() }));
    let r = block_on(mine).expect("B's call answered");
    assert_eq!(r.seq, 222, "B's call answered with seq {}", r.seq);
    echo_checked(&b, 4, 8, 8);
}

type SimHarness = conformance::DeviceHarness<rpc_core::verbs::sim::Sim>;

/// An MR deregistered while a peer's thread RDMA WRITEs 1 MiB into it in a loop, its range
/// registered again at once (the host's arena hands the freed range to the next registration)
/// and overwritten: once the deregistration returned (its grace period: `guard::synchronize`
/// waited out every transfer under way), no byte of the stream lands in the new MR. Each round's
/// writer is a new thread (its guard slot is one an exited writer gave back); 8 rounds.
///
/// Sabotaged: `guard::synchronize` returning at once: failed ("round 0: 398912 bytes of the
/// old MR's stream landed in the new one").
#[test]
fn no_write_lands_in_a_range_registered_again_after_its_mr_was_deregistered() {
    use conformance::{pair, poll_one, post_send, Opts};
    use rpc_core::verbs::sim::Sim;
    use rpc_core::verbs::{
        AccessFlags, DeviceSelector, MemoryRegion, ProtectionDomain, Provider, SendFlags, SendOp, SendWr,
        WcStatus,
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const LEN: usize = 1 << 20;
    let _g = serial();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut reused = 0;
    for round in 0..8 {
        let (ca, cb) =
            (Sim::open(&DeviceSelector::First).unwrap(), Sim::open(&DeviceSelector::First).unwrap());
        let opts = Opts { mr_len: LEN, cqe: 64, timeout: 1, retry_cnt: 1, ..Opts::default() };
        let (mut a, b) = pair::<SimHarness>(&ca, &cb, opts);
        a.write(0, &vec![0x5a; LEN]);
        let target = b.pd.reg_mr(LEN, access).unwrap();
        let (addr, rkey) = (target.addr(), target.rkey());
        let wrote = Arc::new(AtomicBool::new(false));
        let w2 = wrote.clone();
        let writer = std::thread::spawn(move || {
            let s = [a.sge(0, LEN as u32)];
            loop {
                let op = SendOp::RdmaWrite { remote_addr: addr, rkey };
                let wr = SendWr { wr_id: 1, sg_list: &s, op, flags: SendFlags::SIGNALED };
                if post_send(&a.qp, &[wr]).is_err() {
                    return a;
                }
                if poll_one::<SimHarness, _>(&a.scq, "write").status != WcStatus::IBV_WC_SUCCESS {
                    return a;
                }
                w2.store(true, Ordering::Release);
            }
        });
        conformance::wait_until::<SimHarness>("a first write", || {
            wrote.load(Ordering::Acquire) || writer.is_finished()
        });
        drop(target);
        let mut again = b.pd.reg_mr(LEN, access).unwrap();
        reused += usize::from(again.addr() == addr);
        again.write_at(0, &vec![0xab; LEN]).unwrap();
        let _a = writer.join().expect("the writer stops at its first failed write");
        let mut now = vec![0; LEN];
        again.read_at(0, &mut now).unwrap();
        let stray = now.iter().filter(|&&x| x != 0xab).count();
        assert_eq!(stray, 0, "round {round}: {stray} bytes of the old MR's stream landed in the new one");
    }
    assert!(reused > 0, "the arena never handed the freed range out again: the test proves nothing");
}

/// What a thread's thread-local destructor does once the thread's guard slot is gone: `Drop`
/// runs there (see [`orphans_transfer_while_the_target_is_deregistered`]).
struct AtExit(Option<Box<dyn FnOnce() + Send>>);

impl Drop for AtExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

thread_local! {
    static AT_EXIT: std::cell::RefCell<AtExit> = const { std::cell::RefCell::new(AtExit(None)) };
}

/// Runs `last` on a new thread from a thread-local destructor that runs after the sim's guard
/// slot of the thread was given back (the thread-local is registered first, then the thread
/// takes a guard with `first`: destructors run in the reverse order), so its guards count in the
/// shared `ORPHAN` slot.
fn in_orphan_destructor(
    first: impl FnOnce() + Send + 'static,
    last: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        AT_EXIT.with(|a| a.borrow_mut().0 = Some(Box::new(last)));
        first();
    })
}

/// Two threads past their guard slots (transfers from thread-local destructors, counted in the
/// shared `ORPHAN` slot): one RDMA WRITEs 32 MiB into an MR over the test's own memory, the
/// other posts small WRITEs in a loop; the MR is deregistered while the big WRITE copies, and
/// the memory (the caller's again once the deregistration returned) overwritten. The
/// deregistration's grace period must wait for the big WRITE: no byte of it lands after. 4
/// rounds.
///
/// Found a bug: `guard::synchronize` waited for `ORPHAN`'s releases to reach what it had taken
/// at the start, but the churning thread's later guards brought them there while the big WRITE
/// still ran: failed on main ("[(0, 21417984), (1, 2543328), (2, 10027008), (3, 9412592)]"
/// bytes landed after the deregistration; passed with the churn off). Fixed: `ORPHAN` is waited
/// on until it is seen with nothing held. Sabotaged: `synchronize` not waiting on `ORPHAN` at
/// all: failed every round (about 20 MiB each).
#[test]
#[allow(unsafe_code)] // `reg_user_mr` over the test's buffer, which outlives the MR.
fn orphans_transfer_while_the_target_mr_is_deregistered() {
    use conformance::{pair, poll_one, post_send, Opts};
    use rpc_core::verbs::sim::Sim;
    use rpc_core::verbs::{
        AccessFlags, DeviceSelector, MemoryRegion, ProtectionDomain, Provider, SendFlags, SendOp, SendWr,
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const BIG: usize = 32 << 20;
    let _g = serial();
    let open = || Sim::open(&DeviceSelector::First).unwrap();
    let mut strays = Vec::new();
    let mut mine = vec![0u8; BIG];
    for round in 0..4 {
        // The small writer's pair.
        let (c, d) = pair::<SimHarness>(&open(), &open(), Opts { mr_len: 4096, ..Opts::default() });
        let (small_addr, small_rkey) = (d.mr.addr(), d.mr.rkey());
        let small = move |c: &conformance::Node<SimHarness>| {
            let s = [c.sge(0, 64)];
            let op = SendOp::RdmaWrite { remote_addr: small_addr, rkey: small_rkey };
            post_send(&c.qp, &[SendWr { wr_id: 2, sg_list: &s, op, flags: SendFlags::SIGNALED }]).unwrap();
            poll_one::<SimHarness, _>(&c.scq, "a small write");
        };
        let stop = Arc::new(AtomicBool::new(false));
        let churning = Arc::new(AtomicBool::new(false));
        let c = Arc::new(c);
        let churner = {
            let (c1, c2, stop, churning) = (c.clone(), c.clone(), stop.clone(), churning.clone());
            in_orphan_destructor(
                move || small(&c1),
                move || {
                    while !stop.load(Ordering::Acquire) {
                        small(&c2);
                        churning.store(true, Ordering::Release);
                    }
                },
            )
        };
        conformance::wait_until::<SimHarness>("the churn", || churning.load(Ordering::Acquire));

        let (mut a, b) = pair::<SimHarness>(&open(), &open(), Opts { mr_len: BIG, ..Opts::default() });
        a.write(0, &vec![0x5a; BIG]);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // SAFETY: `mine` outlives the MR (dropped below, before `mine` is read or dropped).
        let target = unsafe { b.pd.reg_user_mr(mine.as_mut_ptr(), BIG, access) }.unwrap();
        let (addr, rkey) = (target.addr(), target.rkey());
        let started = Arc::new(AtomicBool::new(false));
        let a = Arc::new(a);
        let big = {
            let (a1, a2, started) = (a.clone(), a.clone(), started.clone());
            let write = move |a: &conformance::Node<SimHarness>, len: usize| {
                let s = [a.sge(0, len as u32)];
                let op = SendOp::RdmaWrite { remote_addr: addr, rkey };
                post_send(&a.qp, &[SendWr { wr_id: 1, sg_list: &s, op, flags: SendFlags::SIGNALED }])
                    .unwrap();
                poll_one::<SimHarness, _>(&a.scq, "a write");
            };
            in_orphan_destructor(
                move || write(&a1, 64),
                move || {
                    started.store(true, Ordering::Release);
                    write(&a2, BIG);
                },
            )
        };
        // Not `wait_until` (it sleeps): the deregistration must come while the copy runs.
        while !started.load(Ordering::Acquire) && !big.is_finished() {
            std::thread::yield_now();
        }
        drop(target);
        mine.fill(0xab);
        big.join().expect("the big writer");
        stop.store(true, Ordering::Release);
        churner.join().expect("the churner");
        strays.push((round, mine.iter().filter(|&&x| x != 0xab).count()));
    }
    assert!(
        strays.iter().all(|s| s.1 == 0),
        "(round, bytes of the WRITE that landed after the deregistration): {strays:?}"
    );
}

/// A worker held in a handler while 128 idle sessions, sharing an SRQ of 105 WQEs (3 bases of 1
/// credit; `srq_idle_wqes` one base), each send a call: more SENDs than receive WQEs, so some
/// wait on RNR (`SimStats::rnr_stalls` grows, to 16 waits per session) until the worker is let
/// go and reposts; then
/// every call is answered, on its session, none closed, and the reservations all come back.
///
/// Sabotaged: `RcConfig::default().rnr_retry` 6 instead of 7 (retry forever): failed ("call
/// 0x68 failed: UNAVAILABLE: send failed (IBV_WC_RNR_RETRY_EXC_ERR): the server is gone").
#[test]
fn a_held_worker_with_more_sends_than_its_shared_srq_delays_them_and_loses_none() {
    let _g = serial();
    let (hold, gate) = Hold::new();
    let base = srq_need_ringless(1);
    const N: usize = 128;
    let (server, _) = spawn(
        server()
            .initial_credits(1)
            .credits_per_session(2)
            .srq_depth(3 * base)
            .srq_idle_wqes(base)
            .max_sessions(N + 1)
            .add_service(hold),
    );
    let clients = connect_all(server.local_addr(), N);
    let holder = Client::connect_with(server.local_addr(), &client_config().window(2)).unwrap();
    let held = holder.unary_async::<_, EchoMsg>(HOLD, &request(0, 8, 0), &CallOptions::default());
    wait_until(
        "the worker held",
        SOON,
        || {
            holder.progress();
            gate.entered()
        },
        || format!("{:?}", server.counters()),
    );
    let rnr = rpc_core::verbs::sim::stats().rnr_stalls;
    let calls: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as u64,
                c.unary_async::<_, EchoMsg>(ECHO, &request(i as u64, 64, 200), &CallOptions::default()),
            )
        })
        .collect();
    if transport() == rpc_core::Transport::Sim {
        // Progressing the clients posts their SENDs. Held until the stalls are many times the
        // SENDs that may stall (each client's call and a few controls): some SEND has waited
        // more times than any finite `rnr_retry` (at most 6) allows.
        wait_until(
            "SENDs waiting on RNR, many times each",
            SOON,
            || {
                clients.iter().for_each(|c| {
                    c.progress();
                });
                // (A session broken meanwhile ends the wait: its call fails below.)
                rpc_core::verbs::sim::stats().rnr_stalls > rnr + 16 * N as u64
                    || clients.iter().any(|c| c.closed_reason().is_some())
            },
            || format!("{:?}", server.counters()),
        );
    }
    drop(gate);
    for (s, f) in calls {
        let r = block_on(f).unwrap_or_else(|e| panic!("call {s:#x} failed: {e}"));
        check_reply(&r, s, 200);
    }
    block_on(held).expect("the held call answered");
    for c in &clients {
        assert!(c.closed_reason().is_none(), "{:?}", c.closed_reason());
    }
    drop(clients);
    drop(holder);
    let c = counters_when(&server, "every reservation given back", SOON, |c| {
        c.sessions_closed == N as u64 + 1 && c.srq_reserved == 0 && c.srq_bases == 0
    });
    assert_eq!(c.malformed, 0, "{c:?}");
}
