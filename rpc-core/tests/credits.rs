//! Protocol 12: request credits granted on demand (`session`'s `credits`,
//! `ServerConfig::initial_credits`, `ServerConfig::credit_idle`; `Counters::srq_reserved`,
//! `credit_raises`, `credit_lowerings`, `credit_raises_refused`). An idle session reserves the
//! receive WQEs of its initial credits only; a client that uses all its credits is raised to
//! its window from the room its worker's SRQ has; idle time lowers it again and its reservation
//! goes back once the client acknowledges; a raise that finds no room leaves the session at its
//! credits. The hostile peers are raw clients (`rpc_support::RawClient`): each loses only its
//! own session while a good client's calls go on.
//!
//! Sabotaged, each test failed (see each test's note).

mod rpc_support;

use std::time::Duration;

use rpc_core::session::srq_need_ringless;
use rpc_core::wire::{Header, Kind};
use rpc_core::{CallOptions, Client, Code, ServerHandle};
use rpc_support::*;

/// Long enough for a wait that must succeed, short enough that a sabotaged run fails quickly.
const SOON: Duration = Duration::from_secs(10);

/// Sessions connected and idle reserve `srq_need_ringless(2)` each (37 WQEs: 2 credits, no
/// ring); the SRQ holds what they reserve and one session's growth, in chunks of 64.
///
/// Sabotaged: the listener reserving the session's full credits (`srq_need(credits)`): the
/// `srq_reserved` assertion failed (512 for 4 sessions, not 148).
#[test]
fn an_idle_session_reserves_its_initial_credits_only() {
    let (server, _) = spawn(server().initial_credits(2));
    let clients: Vec<Client> =
        (0..4).map(|_| Client::connect_with(server.local_addr(), &client_config()).unwrap()).collect();
    for (i, c) in clients.iter().enumerate() {
        echo_checked(c, i as u64, 100, 100);
    }
    let c = counters_when(&server, "the calls counted", SOON, |c| c.rpcs >= 4);
    assert_eq!(c.srq_reserved, 4 * u64::from(srq_need_ringless(2)), "{c:?}");
    assert_eq!(srq_need_ringless(2), 37);
    // Posted: what the 4 sessions reserve, and room for the last one to reach 32 credits with a
    // ring (a raise beyond that has the worker post more), in chunks of 64.
    let grow = rpc_core::ServerConfig::srq_per_session(32) - srq_need_ringless(2);
    let posted = u64::from(4 * srq_need_ringless(2) + grow).next_multiple_of(64);
    assert_eq!(c.recv_buffers, posted, "{c:?}");
    assert_eq!((c.credit_raises, c.credit_raises_refused), (0, 0), "{c:?}");
    drop(clients);
    counters_when(&server, "every reservation given back", SOON, |c| c.srq_reserved == 0);
}

/// 32 calls held at the server: the session is raised, doubling, from 2 credits to the
/// client's window of 32, every call reaches the handler and succeeds; idle for
/// `credit_idle`, it is lowered back to 2 and its reservation given back once the client
/// acknowledged; later calls still succeed.
///
/// Sabotaged: `Session::credits_full` returning at once (no raise): "the 32 calls to reach
/// the server" gave up with 2 stashed. The client never sending its CreditAck
/// (`take_credit_ack` returning `None`): gave up there with 4 stashed (no raise before the
/// ack). The raise not retried at the CreditAck: 4 stashed.
#[test]
fn a_client_with_32_calls_in_flight_is_raised_to_its_window_and_lowered_when_idle() {
    let idle = Duration::from_millis(50);
    let (server, stash) = spawn(server().initial_credits(2).credit_idle(Some(idle)));
    let client = Client::connect_with(server.local_addr(), &client_config().window(32)).unwrap();
    let held: Vec<_> = (0..32u64)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &CallOptions::default()))
        .collect();
    wait_stashed("the 32 calls to reach the server", 32, &stash, &client, &server);
    let c = server.counters();
    assert_eq!(c.credit_raises, 4, "2 → 4 → 8 → 16 → 32: {c:?}");
    assert_eq!(c.srq_reserved, u64::from(srq_need_ringless(32)), "{c:?}");
    for (i, r) in stash.lock().unwrap().drain(..).enumerate() {
        r.send(Ok(EchoMsg { seq: 1000 + i as u64, ..Default::default() }));
    }
    let mut seqs: Vec<u64> =
        held.into_iter().map(|f| block_on(f).expect("a held call, answered").seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1000..1032).collect::<Vec<_>>());

    // Idle: lowered; the blocking client takes the grant when it is driven.
    wait_until(
        "the reservation given back",
        SOON,
        || {
            client.progress();
            let c = server.counters();
            c.credit_lowerings == 1 && c.srq_reserved == u64::from(srq_need_ringless(2))
        },
        || format!("server {:?}", server.counters()),
    );
    for seq in 0..10 {
        echo_checked(&client, seq, 100, 100);
    }
    let c = server.counters();
    assert_eq!((c.malformed, c.sessions_closed), (0, 0), "{c:?}");
}

/// Three sessions raised at once past what the listener posted (it posts what the sessions
/// reserve and room for one session's growth: 3 × 37 + 91 = 202 WQEs, 256 buffers, while three
/// sessions at 32 credits reserve 339): the raises that find no room have the worker post what
/// they lacked and try again, so all three reach their window and all 96 calls reach the server.
///
/// Sabotaged: `Worker::grow_and_raise` not trying the raise again (`retry_raise(false)`): "the
/// 96 calls to reach the server" gave up with 64 stashed (two sessions held at 16 credits).
#[test]
fn raises_beyond_the_posted_room_have_the_worker_post_more_and_all_go_through() {
    let (server, stash) = spawn(server().initial_credits(2));
    let clients: Vec<Client> = (0..3)
        .map(|_| Client::connect_with(server.local_addr(), &client_config().window(32)).unwrap())
        .collect();
    let posted = server.counters().recv_buffers;
    assert_eq!(posted, 256, "{:?}", server.counters());
    let held: Vec<_> = (0..96u64)
        .map(|i| {
            clients[i as usize % 3].unary_async::<_, EchoMsg>(
                STASH,
                &request(i, 8, 0),
                &CallOptions::default(),
            )
        })
        .collect();
    wait_until(
        "the 96 calls to reach the server",
        SOON,
        || {
            clients.iter().for_each(|c| {
                c.progress();
            });
            stash.lock().unwrap().len() >= 96
        },
        || format!("{} stashed; server {:?}", stash.lock().unwrap().len(), server.counters()),
    );
    let c = server.counters();
    assert_eq!(c.credit_raises, 12, "2 → 4 → 8 → 16 → 32, three times: {c:?}");
    assert!(c.credit_raises_refused >= 1, "the listener's room held every raise: {c:?}");
    assert!(c.recv_buffers > posted, "{c:?}");
    assert_eq!(c.srq_reserved, 3 * u64::from(srq_need_ringless(32)), "{c:?}");
    for r in stash.lock().unwrap().drain(..) {
        r.send(Ok(EchoMsg { seq: 5, ..Default::default() }));
    }
    for f in held {
        assert_eq!(block_on(f).expect("a held call, answered").seq, 5);
    }
}

/// Twelve idle sessions (12 × 37 = 444 WQEs reserved, 576 buffers: room for one session's
/// growth) each send a 64 KiB body at once: each ring grant reserves its 15 pieces WQEs, and
/// those that find no room have the worker post more first, so every ring is granted and every
/// call succeeds.
///
/// Sabotaged: `Worker::on_ring_ask` not growing the SRQ: calls failed RESOURCE_EXHAUSTED ("no
/// receive ring for this session: the worker's SRQ has no room for its pieces").
#[test]
fn ring_grants_beyond_the_posted_room_have_the_worker_post_more() {
    let (server, _) = spawn(server().initial_credits(2).ring_bytes(256 << 10));
    let clients: Vec<Client> = (0..12)
        .map(|_| Client::connect_with(server.local_addr(), &client_config().ring_bytes(256 << 10)).unwrap())
        .collect();
    assert_eq!(server.counters().recv_buffers, 576, "{:?}", server.counters());
    let calls: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.unary_async::<_, EchoMsg>(ECHO, &request(i as u64, 64 << 10, 16), &CallOptions::default())
        })
        .collect();
    for (i, f) in calls.into_iter().enumerate() {
        check_reply(&block_on(f).unwrap_or_else(|e| panic!("call {i}: {e}")), i as u64, 16);
    }
    let c = server.counters();
    assert_eq!((c.rings_granted, c.rings_refused), (12, 0), "{c:?}");
    assert!(c.recv_buffers > 576, "{c:?}");
}

/// An SRQ of 52 WQEs (the least that holds one session at 2 credits with a ring): the session
/// is raised to 4 and 8 (37, 41, 49 WQEs without a ring) and the raise to 16 (65) refused; its
/// 16 calls all succeed at 8 credits.
///
/// Sabotaged: the raise's room check against `u32::MAX` instead of the WQEs posted: "the
/// refused raise" gave up.
#[test]
fn a_raise_refused_for_lack_of_srq_room_leaves_the_session_at_its_credits() {
    assert_eq!([4, 8, 16].map(srq_need_ringless), [41, 49, 65]);
    let (server, stash) = spawn(server().initial_credits(2).srq_depth(52));
    let client = Client::connect_with(server.local_addr(), &client_config().window(16)).unwrap();
    let held: Vec<_> = (0..16u64)
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &CallOptions::default()))
        .collect();
    // The client takes each grant and acknowledges it when driven.
    wait_until(
        "the refused raise",
        SOON,
        || {
            client.progress();
            server.counters().credit_raises_refused >= 1
        },
        || format!("server {:?}", server.counters()),
    );
    let c = server.counters();
    assert_eq!(c.credit_raises, 2, "{c:?}");
    assert_eq!(c.srq_reserved, u64::from(srq_need_ringless(8)), "{c:?}");
    wait_stashed("8 calls at the server", 8, &stash, &client, &server);
    assert_eq!(stash.lock().unwrap().len(), 8, "8 credits: 8 calls at the server");
    // Answer as they come: the 8 queued at the client go as credits return.
    let answered = std::cell::Cell::new(0);
    wait_until(
        "every call at the server",
        SOON,
        || {
            client.progress();
            for r in stash.lock().unwrap().drain(..) {
                r.send(Ok(EchoMsg { seq: 7, ..Default::default() }));
                answered.set(answered.get() + 1);
            }
            answered.get() == 16
        },
        || format!("{} answered; server {:?}", answered.get(), server.counters()),
    );
    for f in held {
        assert_eq!(block_on(f).expect("a call at 8 credits").seq, 7);
    }
    assert_eq!(server.counters().malformed, 0);
}

/// Takes the Close the server sent `c`: INTERNAL, its reason a protocol violation naming `why`.
#[track_caller]
fn closed_for(c: &mut RawClient, why: &str) {
    let give_up = std::time::Instant::now() + WAIT;
    let (h, body) = loop {
        if let Some(i) = c.inbox.iter().position(|(h, _)| h.kind == Kind::Close) {
            break c.inbox.remove(i).unwrap();
        }
        assert!(std::time::Instant::now() < give_up, "no Close: got {:?}", c.inbox);
        if let Some(m) = c.poll() {
            c.inbox.push_front(m);
        }
        std::thread::yield_now();
    };
    let reason = rpc_core::wire::close_reason(&body[..h.body_len as usize]);
    assert_eq!(h.status, Code::Internal, "{reason}");
    assert!(reason.contains("protocol violation") && reason.contains(why), "`{why}` not in: {reason}");
}

/// Waits until `n` sessions were closed as malformed.
#[track_caller]
fn malformed(server: &ServerHandle, n: u64) {
    counters_when(server, "the session closed as malformed", SOON, |c| c.malformed == n);
}

/// Hostile raw clients, each closed alone while a good client's calls go on: requests beyond
/// the credits granted (the raise to 4 not acknowledged, a fifth request), a CreditAck for no
/// grant, a CreditGrant sent by a client.
///
/// Sabotaged: `check_credit` against the ceiling (`params.credits`) instead of the accepted
/// credits: "no Close" for the fifth request. `on_credit_header` accepting an acknowledgement
/// with no grant: "no Close" for the CreditAck.
#[test]
fn hostile_credit_messages_lose_only_their_own_session() {
    let (server, stash) = spawn(server().initial_credits(2));
    let good = GoodClient::start(server.local_addr(), None);

    // Beyond the credits: two held requests raise the session to 4 (not acknowledged: the
    // server accepts 4), and a fifth request is one too many.
    let mut c = RawClient::connect_with(server.local_addr(), 8, 4096, 1 << 20);
    assert_eq!(c.credits, 2, "the handshake grants initial_credits");
    let req = |slot: u16| Header { method: STASH, slot, generation: 1, ..Header::new(Kind::Request) };
    c.send(req(0), &[]);
    c.send(req(1), &[]);
    let give_up = std::time::Instant::now() + SOON;
    while c.grants != [4] {
        assert!(std::time::Instant::now() < give_up, "no raise to 4: {:?}", c.grants);
        c.poll();
        std::thread::yield_now();
    }
    for slot in 2..5 {
        c.send(req(slot), &[]);
    }
    closed_for(&mut c, "request beyond the granted credits");
    malformed(&server, 1);
    stash.lock().unwrap().clear();

    // A CreditAck with no grant.
    let mut c = RawClient::connect_with(server.local_addr(), 8, 4096, 1 << 20);
    c.send(Header { count: 2, ..Header::new(Kind::CreditAck) }, &[]);
    closed_for(&mut c, "credit acknowledgement for no grant");
    malformed(&server, 2);

    // A CreditGrant sent by a client.
    let mut c = RawClient::connect_with(server.local_addr(), 8, 4096, 1 << 20);
    c.send(Header { count: 4, ..Header::new(Kind::CreditGrant) }, &[]);
    closed_for(&mut c, "credit grant sent to a server");
    malformed(&server, 3);

    good.finish();
    let c = server.counters();
    assert_eq!(c.malformed, 3, "{c:?}");
}

/// A lone request that takes the last credit: its answer is posted at once (the worker's
/// direct send, no pass through `flush_dirty`), and the CreditGrant the request made due still
/// follows it, with nothing more from the client.
///
/// The grant must come within 2 s: a grant left waiting goes with the next flush of the
/// session, the idle probe's Ping about 5 s later.
///
/// Sabotaged: the worker never marking a session dirty after a direct send (the grant waits
/// for the session's next flush): "no raise to 2 within 2 s of the lone answer" with grants
/// `[]`.
#[test]
fn a_grant_made_due_by_a_lone_request_follows_its_direct_answer() {
    let (server, _) = spawn(server().initial_credits(1));
    let mut c = RawClient::connect_with(server.local_addr(), 8, 4096, 1 << 20);
    assert_eq!(c.credits, 1, "the handshake grants initial_credits");
    c.request(ECHO, 0, 1, &prost::Message::encode_to_vec(&request(7, 8, 8)));
    let (h, _) = c.response(SOON).expect("the echo's answer");
    assert_eq!((h.kind, h.status, h.slot, h.generation), (Kind::Response, Code::Ok, 0, 1), "{h:?}");
    let give_up = std::time::Instant::now() + Duration::from_secs(2);
    while c.grants != [2] {
        assert!(
            std::time::Instant::now() < give_up,
            "no raise to 2 within 2 s of the lone answer: {:?}",
            c.grants
        );
        c.poll();
        std::thread::yield_now();
    }
    assert_eq!(server.counters().malformed, 0);
}
