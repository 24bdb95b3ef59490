//! Breaker attacks on the lazily registered send mirror and staging area (`lazy-rings`):
//! registration failures of messages other than unary answers, a release in the middle of a
//! body in pieces, the counters over a churn loop, and the configuration's range.

mod rpc_support;

use std::time::{Duration, Instant};

use prost::Message;
use rpc_core::codegen::*;
use rpc_core::session::RingConsumer;
use rpc_core::wire::{Header, Kind, STREAM_OUT};
use rpc_core::{Client, ServerHandle};
use rpc_support::list_stream::{ListReq, ListService, LIST};
use rpc_support::*;

/// Long enough for a wait that must succeed, short enough that a failing run ends quickly.
const SOON: Duration = Duration::from_secs(10);

/// What a server registers for one default session at connect: nothing (its send buffers are
/// its worker's pool's, `Counters::send_pool_bytes`, not part of `registered_bytes`; its
/// receive ring is granted on demand, protocol 12).
const BASE: u64 = 0;

/// A raw client that announces a 1 GiB ring (its real one is 64 KiB) to a server whose sim host
/// has 1 GiB in all: the server can never register the send mirror of that ring.
fn liar(server: &ServerHandle) -> RawClient {
    use rpc_core::wire::{read_frame, write_frame, Frame, HEADER_LEN};
    let peer = RawPeer::new(256, 16, HEADER_LEN + 4096, 1 << 16, 1);
    let mut tcp = std::net::TcpStream::connect(server.local_addr()).unwrap();
    let hello = rpc_core::wire::Handshake { ring_len: 1 << 30, ..peer.handshake(4, 4096, 1 << 20, 0) };
    write_frame(&mut tcp, &Frame::Handshake(hello)).unwrap();
    let Frame::Handshake(reply) = read_frame(&mut tcp).unwrap() else { panic!("refused") };
    peer.connect(&rpc_core::verbs::rc::RcConfig::default(), &reply);
    RawClient::over(peer, &reply, reply.session, tcp)
}

/// Polls `c` until a message for (`slot`, `generation`) of one of `kinds` is in its inbox, or
/// `within` passes (`None`).
fn message_for(
    c: &mut RawClient,
    slot: u16,
    generation: u32,
    kinds: &[Kind],
    within: Duration,
) -> Option<(Header, Vec<u8>)> {
    let give_up = Instant::now() + within;
    loop {
        if let Some(i) = c
            .inbox
            .iter()
            .position(|(h, _)| h.slot == slot && h.generation == generation && kinds.contains(&h.kind))
        {
            return c.inbox.remove(i);
        }
        if Instant::now() > give_up {
            return None;
        }
        if let Some(m) = c.poll() {
            c.inbox.push_front(m);
        }
        std::thread::yield_now();
    }
}

/// ATTACK 1. A server stream whose first message is above the eager threshold needs the send
/// mirror; its registration fails. The rule: a failed registration fails only the call that
/// needed it (RESOURCE_EXHAUSTED), counted once. A stream message is not an answer, and
/// `send_waiting` leaves it at the front of the session's backlog to "try again at the next
/// pump": the stream never ends, every answer of the session behind it waits forever, and each
/// retry is one more failed registration of the whole mirror.
#[test]
fn a_stream_message_whose_send_mirror_fails_to_register_fails_its_stream_only() {
    in_small_sim_segments("stream_registration_failure_child");
}

#[test]
#[ignore = "the child of a_stream_message_whose_send_mirror_fails_to_register_fails_its_stream_only"]
fn stream_registration_failure_child() {
    assert_eq!(std::env::var("RPC_SIM_SEGMENT_BYTES").as_deref(), Ok("1073741824"), "run by its parent");
    let (server, _) = spawn(server().max_peer_ring_bytes(1 << 30).add_service(ListService));
    let mut c = liar(&server);

    // Slot 0: a server stream of one 8000-byte message (above the 4 KiB eager threshold), four
    // stream grants.
    let body = ListReq { count: 1, size: 8000, ..ListReq::default() }.encode_to_vec();
    c.send(
        Header {
            method: LIST,
            slot: 0,
            generation: 1,
            stream: STREAM_OUT,
            count: 4,
            body_len: body.len() as u32,
            total_len: body.len() as u32,
            ..Header::new(Kind::Request)
        },
        &body,
    );
    // Slot 1: a small echo on the same session, after it.
    std::thread::sleep(Duration::from_millis(100));
    let body = request(2, 16, 100).encode_to_vec();
    c.send(
        Header {
            method: ECHO,
            slot: 1,
            generation: 1,
            body_len: body.len() as u32,
            total_len: body.len() as u32,
            ..Header::new(Kind::Request)
        },
        &body,
    );

    // (Both well before the server's peer timeout, 6 s: this raw client answers no probes.)
    let echo = message_for(&mut c, 1, 1, &[Kind::Response], Duration::from_secs(3));
    let stream_end = message_for(&mut c, 0, 1, &[Kind::Response], Duration::from_millis(500));
    let s = server.counters();
    assert_eq!(s.sessions_closed, 0, "{s:?}");
    let stream_end = stream_end.map(|(h, b)| (h.status, String::from_utf8_lossy(&b).into_owned()));
    assert!(
        echo.as_ref().is_some_and(|(h, _)| h.status == rpc_core::Code::Ok)
            && stream_end.as_ref().is_some_and(
                |(code, text)| *code == rpc_core::Code::ResourceExhausted && text.contains("send mirror")
            )
            && s.send_area_failures == 1,
        "the small echo behind the stream answered: {:?}; the stream ended: {stream_end:?} \
         (want RESOURCE_EXHAUSTED naming the send mirror); failed registrations {} (want 1); \
         server {s:?}",
        echo.map(|(h, _)| h),
        s.send_area_failures
    );
    assert!(!c.dead);
}

/// ATTACK 2. A body larger than the client's ring goes in pieces from the heap through the
/// mirror; the client stops freeing its ring after the first pieces, so the body stalls half
/// sent for many times `send_area_idle`. The mirror must stay (a release mid-body would leave
/// `send_outgoing` waiting forever for a mirror only a body's first piece registers, or WRITE
/// from deregistered memory), and the body must arrive intact once the client frees its ring.
#[test]
fn a_body_in_pieces_stalled_mid_way_keeps_its_send_areas_and_arrives_intact() {
    let idle = Duration::from_millis(20);
    let (server, _) = spawn(server().send_area_idle(Some(idle)));
    let mut c = RawClient::connect(server.local_addr());
    let areas = 3 * (64 << 10);
    let mut ring = RingConsumer::new(1 << 16, 64);
    let mut last_freed = 0;
    let reply_len = 200 << 10;
    let body = request(9, 16, reply_len).encode_to_vec();
    c.send(
        Header {
            method: ECHO,
            generation: 1,
            body_len: body.len() as u32,
            total_len: body.len() as u32,
            ..Header::new(Kind::Request)
        },
        &body,
    );
    // The pieces that fit the 64 KiB ring arrive; nothing is freed.
    let mut got = Vec::new();
    let mut tokens = Vec::new();
    let mut total = 0;
    let give_up = Instant::now() + SOON;
    while got.len() < (48 << 10) {
        assert!(Instant::now() < give_up, "no pieces: {:?} {:?}", c.inbox, server.counters());
        let Some((h, _)) = c.poll() else {
            std::thread::yield_now();
            continue;
        };
        assert!(h.kind == Kind::Response && h.in_ring && h.status == rpc_core::Code::Ok, "{h:?}");
        total = h.total_len;
        assert!(c.peer.ring.copy_out(h.ring_offset, h.body_len, &mut got));
        tokens.push(ring.accept(h.ring_offset, h.body_len).unwrap());
    }
    assert!((got.len() as u32) < total, "stalled half way: {} of {total}", got.len());
    // Many times `send_area_idle` with the body half sent.
    let until = Instant::now() + 10 * idle;
    while Instant::now() < until {
        let s = server.counters();
        assert_eq!(
            (s.send_area_bytes, s.send_areas_released),
            (areas, 0),
            "given back with a body half sent: {s:?}"
        );
        let _ = c.poll().map(|m| c.inbox.push_back(m));
        std::thread::sleep(Duration::from_millis(2));
    }
    // Free everything and keep freeing: the rest arrives.
    let give_up = Instant::now() + SOON;
    loop {
        for t in tokens.drain(..) {
            ring.release(t);
        }
        let freed_head = ring.take_freed();
        if freed_head != last_freed {
            last_freed = freed_head;
            c.send(Header { freed_head, ..Header::new(Kind::RingReturn) }, &[]);
        }
        while let Some((h, _)) = c.inbox.pop_front().or_else(|| c.poll()) {
            assert!(h.kind == Kind::Response && h.in_ring, "{h:?}");
            assert!(c.peer.ring.copy_out(h.ring_offset, h.body_len, &mut got));
            tokens.push(ring.accept(h.ring_offset, h.body_len).unwrap());
        }
        if got.len() >= total as usize {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the rest never came: {} of {total}; {:?}",
            got.len(),
            server.counters()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = EchoMsg::decode(&got[..]).unwrap();
    check_reply(&r, 9, reply_len);
    assert!(!c.dead);
}

/// ATTACK 3. Churn: a client alternates a ring body and an idle spell, so the server registers
/// and gives back its areas again and again. The counters must add up exactly at every step
/// (created = released + live, bytes = live × size, registered back to the session's base).
#[test]
fn churn_keeps_the_counters_exact() {
    let idle = Duration::from_millis(30);
    let (server, _) = spawn(server().send_area_idle(Some(idle)));
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let areas = 3u64 << 20;
    for round in 1..=5u64 {
        echo_checked(&client, round, 100, 100 << 10);
        let s = counters_when(&server, "given back", SOON, |s| {
            s.send_areas_released == round && s.send_area_bytes == 0
        });
        assert_eq!(
            (s.send_areas_created, s.send_area_failures, s.registered_bytes),
            (round, 0, BASE),
            "round {round}: {s:?}"
        );
        assert!(s.registered_peak <= BASE + areas, "{s:?}");
    }
    // Live at the end: closing the session gives them back without counting a release.
    echo_checked(&client, 9, 100, 100 << 10);
    let s = server.counters();
    assert_eq!((s.send_areas_created, s.send_area_bytes), (6, areas), "{s:?}");
    drop(client);
    let s = counters_when(&server, "the session's memory given back", SOON, |s| s.registered_bytes == 0);
    assert_eq!((s.send_areas_created, s.send_areas_released, s.send_area_bytes), (6, 5, 0), "{s:?}");
}

/// ATTACK 4. `send_area_idle` of zero is refused naming the field; a huge one is taken (and
/// keeps the areas).
#[test]
fn send_area_idle_zero_is_refused_and_a_huge_one_keeps_them() {
    let e = server().send_area_idle(Some(Duration::ZERO)).add_service(ListService).spawn("127.0.0.1:0");
    let text = match e {
        Ok(_) => panic!("send_area_idle 0 was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(text.contains("send_area_idle"), "names the field: {text}");

    let (server, _) = spawn(server().send_area_idle(Some(Duration::MAX)));
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo_checked(&client, 1, 100, 100 << 10);
    std::thread::sleep(Duration::from_millis(300));
    let s = server.counters();
    assert_eq!((s.send_areas_created, s.send_areas_released, s.send_area_bytes), (1, 0, 3 << 20), "{s:?}");
}

/// ATTACK 5 (the client side: clients share `Conn` and `send_waiting`). A fake server announces
/// a 1 GiB ring, so the client can never register its send mirror; the client streams a
/// message above the eager threshold. The rule: the call that needed the mirror fails
/// RESOURCE_EXHAUSTED. `send_waiting` leaves a stream message whose registration failed at the
/// front of the outbox to "try again at the next pump": `send` says Ok, the message never
/// leaves, and every pump tries the 1 GiB registration again.
#[test]
fn a_client_stream_message_whose_send_mirror_fails_to_register_fails_its_send() {
    in_small_sim_segments("client_stream_registration_failure_child");
}

#[test]
#[ignore = "the child of a_client_stream_message_whose_send_mirror_fails_to_register_fails_its_send"]
fn client_stream_registration_failure_child() {
    assert_eq!(std::env::var("RPC_SIM_SEGMENT_BYTES").as_deref(), Ok("1073741824"), "run by its parent");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // The fake server: grants the stream 8 messages, then reports what reached it.
    let server = std::thread::spawn(move || {
        let (mut s, tcp) = RawClient::accept(&listener, 77, |h| h.ring_len = 1 << 30);
        let Some((open, _)) = s.response(SOON) else { return Vec::new() };
        s.send_eager(
            Header {
                slot: open.slot,
                generation: open.generation,
                count: 8,
                session: 77,
                ..Header::new(Kind::StreamGrant)
            },
            &[],
        );
        let mut seen = vec![open.kind];
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            if let Some((h, _)) = s.poll() {
                seen.push(h.kind);
            }
            std::thread::yield_now();
        }
        drop(tcp);
        seen
    });
    let cfg = rpc_core::ClientConfig { max_peer_ring_bytes: 1 << 30, ..client_config() };
    let client = Client::connect_with(addr, &cfg).unwrap();
    // A unary request above the threshold fails as it must.
    let unary = client.unary::<_, EchoMsg>(
        ECHO,
        &request(1, 8000, 0),
        &CallOptions::deadline(Duration::from_millis(500)),
    );
    let unary = unary.map(|_| ()).map_err(|s| (s.code(), s.message().to_owned()));
    let mut stream = client
        .client_stream::<EchoMsg, EchoMsg>(ECHO, &CallOptions::deadline(Duration::from_secs(2)))
        .unwrap();
    let sent = stream.send(&request(2, 8000, 0)).map_err(|s| (s.code(), s.message().to_owned()));
    let seen = server.join().unwrap();
    assert!(
        matches!(&unary, Err((rpc_core::Code::ResourceExhausted, m)) if m.contains("send mirror")),
        "unary: {unary:?}"
    );
    assert!(
        matches!(&sent, Err((rpc_core::Code::ResourceExhausted, m)) if m.contains("send mirror")),
        "the stream message needing the 1 GiB mirror: send gave {sent:?} (want RESOURCE_EXHAUSTED \
         naming the send mirror); the fake server saw {seen:?}; client {:?}",
        client.counters()
    );
}

/// ATTACK 6. Staged bodies across a release and re-creation: two answers of 40 KiB to a raw
/// client with a 64 KiB ring, so the second finds the ring short and is staged and WRITTEN in
/// pieces from the staging area; then the areas go idle and are given back; the next round
/// stages into a new staging area. The send queue remembers the staging area it writes from
/// and must take the new one (a queue still tied to the old one queues no WRITE: the client
/// would read stale bytes), and every answer must arrive intact.
#[test]
fn staged_answers_after_a_release_are_written_from_the_new_staging_area_intact() {
    let idle = Duration::from_millis(20);
    // The raw client's 4 credits granted at the handshake (none raised on demand).
    let (server, _) = spawn(server().send_area_idle(Some(idle)).initial_credits(4));
    let mut c = RawClient::connect(server.local_addr());
    let mut ring = RingConsumer::new(1 << 16, 64);
    let mut last_freed = 0;
    let reply_len = 40 << 10;
    for round in 0..3u32 {
        let generation = round + 1;
        for slot in 0..2u16 {
            let seq = u64::from(round * 2 + u32::from(slot));
            let body = request(seq, 16, reply_len).encode_to_vec();
            c.send(
                Header {
                    method: ECHO,
                    slot,
                    generation,
                    freed_head: last_freed,
                    body_len: body.len() as u32,
                    total_len: body.len() as u32,
                    ..Header::new(Kind::Request)
                },
                &body,
            );
        }
        let mut got = [Vec::new(), Vec::new()];
        let mut total = [u32::MAX, u32::MAX];
        let give_up = Instant::now() + SOON;
        while (0..2).any(|s| got[s].len() as u32 != total[s]) {
            assert!(
                Instant::now() < give_up,
                "round {round}: answers incomplete: {:?} of {total:?}; {:?}",
                got.iter().map(Vec::len).collect::<Vec<_>>(),
                server.counters()
            );
            let Some((h, _)) = c.poll() else {
                std::thread::yield_now();
                continue;
            };
            assert!(
                h.kind == Kind::Response
                    && h.in_ring
                    && h.status == rpc_core::Code::Ok
                    && h.generation == generation,
                "round {round}: {h:?}"
            );
            let s = usize::from(h.slot);
            total[s] = h.total_len;
            assert!(c.peer.ring.copy_out(h.ring_offset, h.body_len, &mut got[s]));
            let t = ring.accept(h.ring_offset, h.body_len).unwrap();
            ring.release(t);
            let freed_head = ring.take_freed();
            if freed_head != last_freed {
                last_freed = freed_head;
                c.send(Header { freed_head, ..Header::new(Kind::RingReturn) }, &[]);
            }
        }
        for (slot, bytes) in got.iter().enumerate() {
            let seq = u64::from(round * 2) + slot as u64;
            let r = EchoMsg::decode(&bytes[..])
                .unwrap_or_else(|e| panic!("round {round}, slot {slot}: answer does not decode: {e}"));
            check_reply(&r, seq, reply_len);
        }
        // The worker publishes its own counters (`ring_full_stalls`) when it next goes idle,
        // after the gauges: wait for both.
        counters_when(&server, "the send areas given back, an answer staged each round", SOON, |s| {
            s.send_areas_released == u64::from(round) + 1
                && s.send_area_bytes == 0
                && s.ring_full_stalls > u64::from(round)
        });
    }
    assert!(!c.dead);
}

/// ATTACK 7. A server stream of large messages whose producer pauses longer than
/// `send_area_idle` between them: the areas are given back between messages and registered
/// again for the next, from the stream's backlog (`send_waiting`), whole and in pieces (a
/// message larger than the client's ring). Every message must arrive intact and in order, and
/// the counters must show each re-registration.
#[test]
fn a_stream_of_large_messages_spanning_releases_arrives_intact() {
    let idle = Duration::from_millis(20);
    let (server, _) = spawn(server().send_area_idle(Some(idle)).add_service(ListService));
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    // The producer's pause starts when its message is queued, not delivered: a 3 MiB message
    // in pieces takes a while on a loaded machine, so its pause is longer.
    for (size, count, pause_ms) in [(200u32 << 10, 4u64, 150), (3 << 20, 2, 500)] {
        // The areas of the round before are given back first: each message registers anew.
        let before = counters_when(&server, "the areas given back", SOON, |c| c.send_area_bytes == 0)
            .send_areas_created;
        let mut s = client
            .server_stream::<_, EchoMsg>(
                LIST,
                &ListReq { count, size, pause_ms, step: 0 },
                &CallOptions::deadline(Duration::from_secs(20)),
            )
            .unwrap();
        for seq in 0..count {
            let m = s
                .message()
                .unwrap_or_else(|e| panic!("message {seq} of {size} bytes: {e:?}; {:?}", server.counters()))
                .unwrap_or_else(|| panic!("the stream ended at {seq}"));
            assert_eq!(m.seq, seq);
            assert!(m.payload == payload(seq, size as usize), "message {seq} of {size} bytes differs");
        }
        assert_eq!(s.message().unwrap(), None);
        let c = server.counters();
        assert!(
            c.send_areas_created >= before + 2 && c.send_areas_released >= 1,
            "registered again between messages: {c:?}"
        );
        assert_eq!(c.send_area_failures, 0, "{c:?}");
    }
}

/// ATTACK 8. Churn bound: a client that keeps asking for ring bodies with gaps shorter than
/// `send_area_idle` (but longer than the sweep's period, a quarter of it) must not make the
/// server register again and again (registration is the expensive part: pinning and mapping
/// megabytes): one registration for the whole run.
#[test]
fn ring_bodies_closer_than_send_area_idle_register_once() {
    let idle = Duration::from_millis(400);
    let (server, _) = spawn(server().send_area_idle(Some(idle)));
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let until = Instant::now() + Duration::from_millis(2000);
    let mut seq = 0;
    while Instant::now() < until {
        seq += 1;
        echo_checked(&client, seq, 100, 64 << 10);
        // Two sweeps (every 100 ms) see the areas unused, well within `idle`.
        std::thread::sleep(Duration::from_millis(220));
    }
    let c = server.counters();
    assert!(seq >= 5, "{seq} calls");
    assert_eq!((c.send_areas_created, c.send_areas_released), (1, 0), "{seq} calls: {c:?}");
}
