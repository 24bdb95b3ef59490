//! Admission and memory caps against a hostile peer (issue 27, items 1 and 6): a peer that
//! speaks the wire protocol by hand ([`RawPeer`] for handshakes, [`RawClient`] for sessions)
//! asks for more than the server grants, cuts bodies into tiny pieces, starts bodies it never
//! finishes, or never reads its answers, while a well-behaved [`Client`] keeps calling. Each
//! test checks that the attacker is refused (naming the limit) or loses its session (the
//! server's counters name the cap), that every call of the good client succeeds, and that the
//! server's memory gauges stay under its caps.
//!
//! All tests run on `sim`, with the yielding polling policy and bounded waits.

mod rpc_support;

use std::sync::mpsc;

use rpc_core::codegen::*;
use rpc_core::wire::{Frame, Header, Kind};
use rpc_core::{Client, Counters, ServerHandle};
use rpc_support::*;

/// Waits until the server's counters satisfy `done`.
#[track_caller]
fn wait_counters(server: &ServerHandle, what: &str, done: impl Fn(&Counters) -> bool) -> Counters {
    wait_for(
        what,
        WAIT,
        || Some(server.counters()).filter(|c| done(c)),
        || format!("{:?}", server.counters()),
    )
}

/// The first piece (`piece` bytes at offset 0 of the server's ring) of a RAW request of `total`
/// bytes on `slot`, with its bytes written.
fn first_piece(c: &mut RawClient, slot: u16, piece: u32, total: u32) {
    let h = piece_header(c.session, slot, 0, piece, total);
    c.write(0, &vec![7u8; piece as usize], Some(h));
}

/// Polls `c` until a message of `kind` for `slot` arrives; takes it with its eager body.
#[track_caller]
fn take(c: &mut RawClient, kind: Kind, slot: u16) -> (Header, Vec<u8>) {
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        if let Some(i) = c.inbox.iter().position(|(h, _)| h.kind == kind && h.slot == slot) {
            return c.inbox.remove(i).unwrap();
        }
        assert!(std::time::Instant::now() < give_up, "no {kind:?} for slot {slot}: got {:?}", c.inbox);
        if let Some(m) = c.poll() {
            c.inbox.push_front(m);
        }
        std::thread::yield_now();
    }
}

fn piece_header(session: u32, slot: u16, offset: u32, body_len: u32, total_len: u32) -> Header {
    Header {
        method: RAW,
        slot,
        generation: 1,
        in_ring: true,
        ring_offset: offset,
        body_len,
        total_len,
        session,
        ..Header::new(Kind::Request)
    }
}

/// A client that announces a 1 GiB ring (the protocol's maximum) asks the server to register a
/// 1 GiB send mirror and a 1 GiB + 64 MiB staging area for it; one announcing 1 byte would get
/// every answer in 1-byte pieces. Both are refused at the handshake, before anything is
/// registered, naming the limit, what was asked and (for the large one) the field to change;
/// the good client's calls all succeed and the server's registered memory never rises above
/// what the good client's session holds.
///
/// Sabotage: `check_asked`'s cap test removed (`if false && hello.ring_len > cap`): the 1 GiB
/// handshakes were admitted (the test failed on "refused"); its 64 KiB minimum removed: the
/// 1-byte ring was admitted.
#[test]
fn a_client_ring_beyond_the_servers_limits_is_refused_before_anything_is_registered() {
    let (server, _) = spawn(server());
    let good = GoodClient::start(server.local_addr(), None);
    let before = wait_counters(&server, "the good session registered", |c| c.registered_bytes > 0);
    for _ in 0..16 {
        let f = raw_handshake(server.local_addr(), |h| h.ring_len = rpc_core::wire::MAX_RING_LEN);
        let Frame::Refusal(r) = f else { panic!("a 1 GiB client ring was admitted: {f:?}") };
        assert_eq!(r.code, Code::ResourceExhausted, "{}", r.message);
        for part in ["ring_len", "ServerConfig::max_peer_ring_bytes", "4194304", "1073741824"] {
            assert!(r.message.contains(part), "`{part}` not in: {}", r.message);
        }
    }
    for tiny in [1u32, (64 << 10) - 1] {
        let f = raw_handshake(server.local_addr(), |h| h.ring_len = tiny);
        let Frame::Refusal(r) = f else { panic!("a {tiny}-byte client ring was admitted: {f:?}") };
        assert_eq!(r.code, Code::InvalidArgument, "{}", r.message);
        assert!(r.message.contains("ring_len") && r.message.contains("65536"), "{}", r.message);
    }
    good.finish();
    let after = server.counters();
    // The good session registers its send mirror (1 MiB) and staging area (2 MiB) at its first
    // answer above the eager threshold, not at connect (`ServerConfig::send_area_idle`): maybe
    // before the first look already (its calls start as soon as it connects, and without a ring
    // to bind, protocol 12, it connects sooner).
    let areas = if after.send_areas_created > 0 { 3 << 20 } else { 0 };
    assert_eq!(
        after.registered_peak,
        before.registered_bytes - before.send_area_bytes + areas,
        "something was registered for a refused peer: {after:?}"
    );
    // Mirror 1 MiB and staging 2 MiB of the good session only (no ring: its requests are small;
    // send buffers are the worker's pool's, not counted here).
    assert!(after.registered_peak < 4 << 20, "{after:?}");
    server.shutdown();
}

/// A client that announces the ring the server caps (4 MiB) is admitted, and granted no more
/// credits, eager threshold or message size than the server's configuration: the reply says
/// what was granted.
#[test]
fn what_a_client_asks_beyond_the_configuration_is_granted_within_it() {
    // Credits granted at the handshake: `initial_credits`, at most `credits_per_session`.
    let (server, _) = spawn(
        server().credits_per_session(8).initial_credits(4096).eager_threshold(1024).max_message_size(2 << 20),
    );
    let f = raw_handshake(server.local_addr(), |h| {
        h.ring_len = 4 << 20;
        h.credits = rpc_core::wire::MAX_CREDITS;
        h.eager_threshold = 1 << 20;
        h.max_message = u32::MAX;
    });
    let Frame::Handshake(reply) = f else { panic!("refused: {f:?}") };
    assert_eq!((reply.credits, reply.eager_threshold, reply.max_message), (8, 1024, 2 << 20));
    server.shutdown();
}

/// A peer that cuts a body into pieces smaller than 1/16 of the server's ring (not its last)
/// loses its session (counted malformed); the good client is untouched.
///
/// Sabotage: the session's `SMALL_PIECE` check removed: the session stayed open (the test
/// failed waiting for `malformed`, the piece was accepted).
#[test]
fn pieces_below_a_sixteenth_of_the_ring_close_the_session() {
    let (server, _) = spawn(server());
    let good = GoodClient::start(server.local_addr(), None);
    let mut c = RawClient::connect(server.local_addr());
    // Above the eager threshold (a ring body), below 1/16 of the 1 MiB ring, not the last piece.
    first_piece(&mut c, 0, 4097, 200_000);
    let after = wait_counters(&server, "the tiny-pieces session closed", |c| c.malformed >= 1);
    assert_eq!((after.malformed, after.sessions_closed), (1, 1), "{after:?}");
    good.finish();
    assert_eq!(server.counters().malformed, 1);
    server.shutdown();
}

/// A body that starts arriving in pieces and never finishes is charged while it waits, then
/// dropped with its session after `reassembly_timeout`; its charge comes back; the good
/// client is untouched.
///
/// Sabotage: `handle_timeout`'s reassembly check removed: the session stayed open and the
/// body stayed charged (the test failed waiting for `reassembly_timeouts`).
#[test]
fn a_body_in_pieces_that_never_finishes_is_dropped_after_the_reassembly_timeout() {
    let (server, _) = spawn(server().reassembly_timeout(std::time::Duration::from_millis(300)));
    let good = GoodClient::start(server.local_addr(), None);
    let mut c = RawClient::connect(server.local_addr());
    first_piece(&mut c, 0, 64 << 10, 512 << 10);
    wait_counters(&server, "the body in pieces charged", |c| c.reassembly_bytes == 512 << 10);
    let after =
        wait_counters(&server, "the unfinished body's session closed", |c| c.reassembly_timeouts == 1);
    assert_eq!(after.sessions_closed, 1, "{after:?}");
    assert_eq!(after.reassembly_bytes, 0, "{after:?}");
    assert_eq!(after.reassembly_peak, 512 << 10, "{after:?}");
    good.finish();
    server.shutdown();
}

/// Three peers each start a 512 KiB body in pieces against a server whose cap on memory held for
/// reassembly is 1 MiB: the first two are charged (the cap is reached); the third's call is
/// refused (answered RESOURCE_EXHAUSTED naming `max_reassembly_bytes` and its value, counted in
/// `reassembly_refused`) before anything is allocated for it, and its session stays open: the
/// rest of its pieces are dropped and a small call on it is answered. The first two are
/// untouched: one finishes its body and gets its answer. The good client is untouched and the
/// count never exceeds the cap.
///
/// Sabotage: the charge in `handle_any_header` skipped (`Some(r) if false && first && !last`):
/// nothing was counted and the third call was dispatched (the test failed waiting for the
/// charge).
#[test]
fn bodies_in_pieces_over_max_reassembly_bytes_refuse_only_the_call_that_went_over() {
    let (server, _) = spawn(server().max_message_size(512 << 10).max_reassembly_bytes(1 << 20));
    let good = GoodClient::start(server.local_addr(), None);
    let piece = 64 << 10;
    let total = 512 << 10;
    let mut a = RawClient::connect(server.local_addr());
    let mut b = RawClient::connect(server.local_addr());
    first_piece(&mut a, 0, piece, total);
    first_piece(&mut b, 0, piece, total);
    wait_counters(&server, "two bodies charged", |c| c.reassembly_bytes == 1 << 20);
    let mut third = RawClient::connect(server.local_addr());
    first_piece(&mut third, 0, piece, total);
    let (h, body) = take(&mut third, Kind::Response, 0);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(h.status, Code::ResourceExhausted, "{text}");
    for part in ["ServerConfig::max_reassembly_bytes", "1048576", "524288"] {
        assert!(text.contains(part), "`{part}` not in: {text}");
    }
    let after = wait_counters(&server, "the third call refused", |c| c.reassembly_refused == 1);
    assert_eq!((after.sessions_closed, after.malformed, after.over_reassembly_cap), (0, 0, 0), "{after:?}");
    assert_eq!(after.reassembly_peak, 1 << 20, "the count went over its cap: {after:?}");
    // The third session is open: the rest of its pieces are dropped, a small call is answered.
    let mut offset = piece;
    while offset < total {
        let h = piece_header(third.session, 0, offset, piece, total);
        third.write(offset, &vec![7u8; piece as usize], Some(h));
        offset += piece;
    }
    let body = prost::Message::encode_to_vec(&request(1, 10, 10));
    let h = Header {
        method: ECHO,
        slot: 1,
        generation: 1,
        body_len: body.len() as u32,
        total_len: body.len() as u32,
        ..Header::new(Kind::Request)
    };
    third.send(h, &body);
    assert_eq!(third.wait_for(Kind::Response, 1).status, Code::Ok);
    // The first session is untouched: the rest of its body arrives and is answered.
    let mut offset = piece;
    while offset < total {
        let h = piece_header(a.session, 0, offset, piece, total);
        a.write(offset, &vec![7u8; piece as usize], Some(h));
        offset += piece;
    }
    let h = a.wait_for(Kind::Response, 0);
    assert_eq!(h.status, Code::Ok);
    wait_counters(&server, "the finished body's charge given back", |c| c.reassembly_bytes == 512 << 10);
    good.finish();
    let end = server.counters();
    assert_eq!((end.malformed, end.over_reassembly_cap), (0, 0), "{end:?}");
    drop((a, b, third));
    server.shutdown();
}

/// A peer that asks for large answers and never frees its ring (a slow reader) makes them wait
/// on the server's heap; past `max_backlog_bytes` (1 MiB here) its session closes (counted in
/// `over_backlog_cap`) and what it held comes back; the good client is untouched.
///
/// Sabotage: `Outgoing::charge` charged nothing (`held = 0`): the session stayed open with
/// 1.2 MB of answers waiting (the test failed waiting for `over_backlog_cap`).
#[test]
fn answers_waiting_on_a_slow_reader_over_max_backlog_bytes_close_only_that_session() {
    let (server, _) = spawn(server().max_message_size(1 << 20).max_backlog_bytes(1 << 20));
    let good = GoodClient::start(server.local_addr(), None);
    let mut slow = RawClient::connect(server.local_addr());
    // Four answers of 400 KB into a 64 KiB ring whose space the peer never returns.
    for slot in 0..4u16 {
        let body = prost::Message::encode_to_vec(&request(u64::from(slot), 0, 400_000));
        let h = Header {
            method: ECHO,
            slot,
            generation: 1,
            body_len: body.len() as u32,
            total_len: body.len() as u32,
            ..Header::new(Kind::Request)
        };
        slow.send(h, &body);
    }
    let after = wait_counters(&server, "the slow reader's session closed", |c| c.over_backlog_cap == 1);
    assert_eq!(after.sessions_closed, 1, "{after:?}");
    assert!(after.backlog_peak > 0 && after.backlog_peak <= 1 << 20, "{after:?}");
    wait_counters(&server, "the waiting answers' charge given back", |c| c.backlog_bytes == 0);
    good.finish();
    server.shutdown();
}

/// With an auth token set, a handshake with no token, a prefix of it, the token with a zero
/// byte appended, or the token with its last byte changed is refused UNAUTHENTICATED; the
/// token itself is admitted; the good client (with the token) is untouched. The comparison is
/// constant-time over a fixed 256-byte block with the lengths compared too (a padded compare
/// without the length check admits the token with a zero byte appended).
///
/// Sabotage: the length comparison dropped from `token_matches` (`(bytes).into()`): the token
/// with a zero byte appended was admitted.
#[test]
fn only_the_exact_auth_token_is_admitted() {
    let token = b"s3cret-token".to_vec();
    let (server, _) = spawn(server().auth_token(token.clone()));
    let good = GoodClient::start(server.local_addr(), Some(&token));
    let mut zero = token.clone();
    zero.push(0);
    let mut last = token.clone();
    *last.last_mut().unwrap() ^= 1;
    for wrong in [Vec::new(), token[..6].to_vec(), zero, last] {
        let f = raw_handshake(server.local_addr(), |h| h.auth_token = wrong.clone());
        let Frame::Refusal(r) = f else { panic!("token {wrong:?} was admitted") };
        assert_eq!(r.code, Code::Unauthenticated, "{}", r.message);
    }
    let f = raw_handshake(server.local_addr(), |h| h.auth_token = token.clone());
    assert!(matches!(f, Frame::Handshake(_)), "the token was refused: {f:?}");
    good.finish();
    server.shutdown();
}

/// A server whose ring is above the client's `max_peer_ring_bytes` fails the connect with
/// RESOURCE_EXHAUSTED naming both settings (which one to change), not INTERNAL.
#[test]
fn a_server_ring_above_the_clients_cap_names_both_settings() {
    let (server, _) = spawn(server().ring_bytes(2 << 20));
    let cfg = client_config().max_peer_ring_bytes(1 << 20);
    let e = Client::connect_with(server.local_addr(), &cfg).expect_err("refused");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    for part in ["ClientConfig::max_peer_ring_bytes", "ServerConfig::ring_bytes", "2097152", "1048576"] {
        assert!(e.message().contains(part), "`{part}` not in: {e}");
    }
    server.shutdown();
}

/// Attackers fill the server's shared reassembly cap (1 MiB) with bodies in pieces that never
/// finish. A good client's body in pieces (400 KB) is refused alone: its call ends
/// RESOURCE_EXHAUSTED naming `max_reassembly_bytes` and its value, and its session stays usable
/// (its next small call succeeds, on the same session). Once the attackers' reassembly timeout
/// closes them (each told why by a Close naming `reassembly_timeout`), the same body goes
/// through.
///
/// The refusal is answered when the body's first piece comes, not at the session's next timer:
/// the server probes the client's idle session (a blocking `Client` answers Pings while idle)
/// with a `peer_timeout` of 10 minutes, so that timer is 200 s away, past the call's deadline.
///
/// Sabotage: see the report (refusal turned back into a session close; the Close's reason
/// left empty). The worker's `handle_events` after a refused piece removed: failed with "the
/// refusal answered at once: DEADLINE_EXCEEDED" (before the fix, with the default `peer_timeout`
/// of 6 s, the refusal came 2 s late, after the attackers' timeout, and the counter read at
/// the end was 0 in 3 runs of 4).
#[test]
fn attackers_filling_the_reassembly_cap_refuse_a_good_body_but_not_its_session() {
    let (server, _) = spawn(
        server()
            .max_message_size(512 << 10)
            .max_reassembly_bytes(1 << 20)
            .reassembly_timeout(std::time::Duration::from_millis(500))
            .peer_timeout(Some(std::time::Duration::from_secs(600))),
    );
    let good = GoodClient::start(server.local_addr(), None);
    let mut attackers: Vec<RawClient> = (0..2).map(|_| RawClient::connect(server.local_addr())).collect();
    for a in &mut attackers {
        first_piece(a, 0, 64 << 10, 512 << 10);
    }
    wait_counters(&server, "the attackers' bodies charged", |c| c.reassembly_bytes == 1 << 20);
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let big = request(1, 400_000, 10);
    let e = client.unary::<_, EchoMsg>(ECHO, &big, &CallOptions::deadline(WAIT)).expect_err("refused");
    assert_eq!(e.code(), Code::ResourceExhausted, "the refusal answered at once: {e}");
    for part in ["ServerConfig::max_reassembly_bytes", "1048576"] {
        assert!(e.message().contains(part), "`{part}` not in: {e}");
    }
    // The session stays: the next small call succeeds on it, with no reconnect.
    let r: EchoMsg = client.unary(ECHO, &request(2, 10, 10), &CallOptions::default()).unwrap();
    check_reply(&r, 2, 10);
    assert_eq!((client.reconnect_attempts(), client.closed_reason()), (0, None));
    // The attackers' bodies time out: their sessions close with a Close that says why.
    let after = wait_counters(&server, "the attackers timed out", |c| c.reassembly_timeouts == 2);
    assert_eq!(after.reassembly_bytes, 0, "{after:?}");
    for a in &mut attackers {
        let (h, body) = take(a, Kind::Close, 0);
        let text = String::from_utf8_lossy(&body);
        assert_eq!(h.status, Code::ResourceExhausted, "{text}");
        assert!(text.contains("ServerConfig::reassembly_timeout"), "{text}");
    }
    let r: EchoMsg = client.unary(ECHO, &big, &CallOptions::default()).expect("the body goes through");
    check_reply(&r, 1, 10);
    assert_eq!(client.reconnect_attempts(), 0);
    good.finish();
    // Counted at the refusal; published by its worker as it goes.
    wait_counters(&server, "the refusal counted", |c| c.reassembly_refused == 1);
    drop(attackers);
    server.shutdown();
}

/// A client that never reads its answers (a blocking `Client` whose four async calls ask for
/// 400 KB answers each, not polled, with a 64 KiB ring) makes them wait on the server's heap
/// past `max_backlog_bytes` (1 MiB): the server closes its session with a Close of
/// RESOURCE_EXHAUSTED naming the cap, and the client's calls in flight end with that status,
/// not a bare UNAVAILABLE; `closed_reason` says it too. The next call reconnects as before.
#[test]
fn a_client_closed_over_a_cap_sees_the_status_naming_it() {
    // Its 4 calls on the wire at once (granted at the handshake, not raised on demand).
    let (server, _) = spawn(server().max_message_size(1 << 20).max_backlog_bytes(1 << 20).initial_credits(4));
    let client = Client::connect_with(server.local_addr(), &client_config().ring_bytes(64 << 10)).unwrap();
    let calls: Vec<_> = (0..4u64)
        .map(|i| client.unary_async::<_, EchoMsg>(ECHO, &request(i, 0, 400_000), &CallOptions::default()))
        .collect();
    // Each future sends its request when made; none is polled until the server gave up.
    client.progress();
    wait_counters(&server, "the slow reader's session closed", |c| c.over_backlog_cap == 1);
    let mut failed = 0;
    for call in calls {
        if let Err(e) = block_on(call) {
            assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            assert!(e.message().contains("ServerConfig::max_backlog_bytes"), "{e}");
            failed += 1;
        }
    }
    assert!(failed >= 1, "no call saw the close");
    let why = client.closed_reason().expect("closed");
    assert_eq!(why.code(), Code::ResourceExhausted, "{why}");
    assert!(
        why.message().contains("the server closed the session") && why.message().contains("1048576"),
        "{why}"
    );
    // A reconnecting client still reconnects on its next call.
    let r: EchoMsg = client.unary(ECHO, &request(9, 10, 10), &CallOptions::default()).unwrap();
    check_reply(&r, 9, 10);
    assert_eq!(client.reconnect_attempts(), 1);
    server.shutdown();
}

/// A hostile server (a fake one, speaking the wire by hand) answers a client's first call with
/// 256 KiB in 16 KiB pieces, over the client's `max_reassembly_bytes` (128 KiB): the client
/// keeps nothing of it and the call ends RESOURCE_EXHAUSTED naming the setting, its session
/// open. It answers the second call with the first piece of 100 KiB and nothing more: after the
/// client's `reassembly_timeout` (300 ms) the call ends RESOURCE_EXHAUSTED naming that setting.
#[test]
fn a_hostile_server_sending_endless_pieces_hits_the_clients_cap_and_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let fake = std::thread::spawn(move || {
        let (mut c, _tcp) = RawClient::accept(&listener, 77, |_| {});
        let piece = 16u32 << 10;
        let mut at = 0u32;
        let mut send_piece = |c: &mut RawClient, req: &Header, total: u32| {
            let h = Header {
                kind: Kind::Response,
                slot: req.slot,
                generation: req.generation,
                method: req.method,
                in_ring: true,
                ring_offset: at,
                body_len: piece,
                total_len: total,
                session: 77,
                ..Header::new(Kind::Response)
            };
            c.write(at, &vec![9u8; piece as usize], Some(h));
            at = (at + piece) % c.ring_len;
        };
        let first = take_request(&mut c);
        for _ in 0..16 {
            send_piece(&mut c, &first, 256 << 10);
        }
        let second = take_request(&mut c);
        send_piece(&mut c, &second, 100 << 10);
        // The TCP channel stays open (a closed one would end the call UNAVAILABLE first).
        let _ = done_rx.recv_timeout(WAIT);
    });
    let cfg = client_config()
        .ring_bytes(64 << 10)
        .max_reassembly_bytes(128 << 10)
        .reassembly_timeout(std::time::Duration::from_millis(300));
    let client = Client::connect_with(addr, &cfg).unwrap();
    let e =
        client.unary::<_, EchoMsg>(ECHO, &request(1, 10, 0), &CallOptions::default()).expect_err("refused");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("ClientConfig::max_reassembly_bytes (131072 bytes)"), "{e}");
    assert_eq!(client.closed_reason(), None, "the session stays open");
    let e =
        client.unary::<_, EchoMsg>(ECHO, &request(2, 10, 0), &CallOptions::default()).expect_err("timed out");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("ClientConfig::reassembly_timeout"), "{e}");
    done_tx.send(()).unwrap();
    fake.join().unwrap();
}

/// The next request a fake server receives (polls for up to `WAIT`).
fn take_request(c: &mut RawClient) -> Header {
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        if let Some((h, _)) = c.poll().filter(|(h, _)| h.kind == Kind::Request) {
            return h;
        }
        assert!(std::time::Instant::now() < give_up, "no request");
        std::thread::yield_now();
    }
}

/// A peer whose own bodies in pieces would hold more than its session's share of the
/// reassembly cap (derived: a quarter of 4 MiB, at least `max_message_size` 512 KiB: 1 MiB)
/// loses its session, told why: a Close of RESOURCE_EXHAUSTED naming
/// `max_reassembly_bytes_per_session` and its value (counted in `over_reassembly_cap`); the
/// good client is untouched.
#[test]
fn a_session_over_its_share_of_the_reassembly_cap_is_closed_and_told_why() {
    // No idle sweep: the session is freed when its Close has left, not by the sweep.
    let (server, _) =
        spawn(server().max_message_size(512 << 10).max_reassembly_bytes(4 << 20).idle_timeout(None));
    let good = GoodClient::start(server.local_addr(), None);
    let mut c = RawClient::connect(server.local_addr());
    let piece = 64 << 10;
    for slot in 0..3u16 {
        let offset = u32::from(slot) * piece;
        let h = piece_header(c.session, slot, offset, piece, 512 << 10);
        c.write(offset, &vec![7u8; piece as usize], Some(h));
    }
    let (h, body) = take(&mut c, Kind::Close, 0);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(h.status, Code::ResourceExhausted, "{text}");
    for part in ["ServerConfig::max_reassembly_bytes_per_session", "1048576"] {
        assert!(text.contains(part), "`{part}` not in: {text}");
    }
    let after = wait_counters(&server, "the session closed", |c| c.over_reassembly_cap == 1);
    // Freed once its Close left (not by the idle probe, nor the call limit).
    assert_eq!((after.sessions_closed, after.reassembly_refused, after.peers_lost), (1, 0, 0), "{after:?}");
    wait_counters(&server, "its charges given back", |c| c.reassembly_bytes == 0);
    good.finish();
    server.shutdown();
}

/// A (fake) server closes a `Channel`'s session with a Close of RESOURCE_EXHAUSTED whose reason
/// is hostile (256 bytes: control characters, an escape sequence, invalid UTF-8): the call in
/// flight ends with that status, the reason read as untrusted text (no control characters,
/// invalid bytes replaced, bounded). The next call tries to reconnect (the fake server is gone:
/// UNAVAILABLE) and its error still names the reason, read the same way.
#[test]
fn a_channel_ends_its_calls_with_the_status_of_the_servers_close_read_as_untrusted() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let fake = std::thread::spawn(move || {
        let (mut c, _tcp) = RawClient::accept(&listener, 77, |_| {});
        // No second session: a reconnect is refused at once.
        drop(listener);
        let _ = take_request(&mut c);
        let mut reason = b"over max_foo (42 bytes)\n\x1b[2J\xff\xfe".to_vec();
        reason.resize(rpc_core::wire::MAX_CLOSE_REASON, b'x');
        let n = reason.len() as u32;
        let h =
            Header { status: Code::ResourceExhausted, body_len: n, total_len: n, ..Header::new(Kind::Close) };
        c.send(h, &reason);
        let _ = done_rx.recv_timeout(WAIT);
    });
    let cfg = rpc_core::ChannelConfig::default()
        .client(client_config().polling(rpc_core::PollingPolicy::Event { spins: 0 }))
        .spins(500);
    let ch = rpc_core::Channel::connect_blocking(addr, &cfg).unwrap();
    for call in 0..2 {
        let e = block_on(ch.unary::<EchoMsg, EchoMsg>(ECHO, request(call, 10, 10), &CallOptions::default()))
            .expect_err("the session was closed");
        let code = if call == 0 { Code::ResourceExhausted } else { Code::Unavailable };
        assert_eq!(e.code(), code, "call {call}: {e}");
        let m = e.message();
        assert!(m.contains("the server closed the session: over max_foo (42 bytes)"), "call {call}: {m}");
        assert!(m.chars().all(|c| !c.is_control()), "call {call}: control characters in {m:?}");
        assert!(
            m.contains('\u{fffd}') && m.len() < 2 * rpc_core::wire::MAX_CLOSE_REASON,
            "call {call}: {m:?}"
        );
    }
    done_tx.send(()).unwrap();
    fake.join().unwrap();
}
