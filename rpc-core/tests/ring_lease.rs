//! Protocol 12: a server session's receive ring is granted on demand and taken back when idle
//! (`session`'s `lease`, `ServerConfig::ring_idle`, `ServerConfig::max_ring_pool_bytes`;
//! `Counters::ring_bytes`, `rings_granted`, `rings_reclaimed`, `rings_revoked`,
//! `rings_refused`). An idle session holds no ring; the client asks before its first body above
//! the eager threshold; a refused ask fails only the calls that needed the ring; the server
//! reclaims an idle ring once the client gives it back, or revokes it when the client does not.
//! The hostile peers are raw clients (`rpc_support::RawClient`).
//!
//! Sabotaged, each test failed: the client asking at connect (`lease_peer_ring` setting a
//! RingAsk due): the idle session showed 1 MiB of ring (`registered_bytes` 4 492 096). The
//! worker not giving a dropped ring's bytes back (`AreaGauge::gone` skipped): "every ring back"
//! gave up at 100 MiB registered. A RingRelease never asked for accepted: "a release not asked
//! for" gave up (the session stayed open). The sweep never reclaiming: "the ring reclaimed" gave
//! up. The pool cap not charged: "a second ring over max_ring_pool_bytes was granted". A second
//! RingAsk while granted accepted: "the session closed" gave up (and a second ring was
//! registered). A revoke that keeps the ring registered: "the stale WRITE failed" gave up (the
//! WRITE landed). The ring dropped at the reclaim instead of the release: the crossing body got
//! no answer ("no Response for slot 0").

mod rpc_support;

use std::time::Duration;

use prost::Message;
use rpc_core::codegen::*;
use rpc_core::wire::{Header, Kind};
use rpc_core::{CallOptions, Client, Code};
use rpc_support::*;

/// What a server registers for one default session at connect: nothing (its send buffers are
/// its worker's pool's, `Counters::send_pool_bytes`, not part of `registered_bytes`; its
/// receive ring is granted on demand, protocol 12).
const BASE: u64 = 0;

/// The server's default ring.
const RING: u64 = 1 << 20;

/// Long enough for a wait that must succeed, short enough that a sabotaged run fails quickly.
const SOON: Duration = Duration::from_secs(10);

/// A client stream handler: answers the count of messages and a checksum of all their bytes.
const SUM: MethodId = method_id("/test.Lease/Sum");

struct SumSvc;

impl Service for SumSvc {
    const NAME: &'static str = "test.Lease";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: SUM, name: "/test.Lease/Sum" }];

    fn call(&self, _method: MethodId, ctx: &RequestContext, _body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let mut requests = ctx.requests::<EchoMsg>();
        let (responder, reply) = ctx.defer::<EchoMsg>();
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut acc = 0u64;
            let answer = loop {
                match requests.message() {
                    Ok(Some(m)) if m.seq == n && m.checksum == fnv64(&m.payload) => {
                        acc = acc.wrapping_mul(31).wrapping_add(m.checksum);
                        n += 1;
                    }
                    Ok(Some(m)) => break Err(Status::data_loss(format!("message {} arrived as {n}", m.seq))),
                    Ok(None) => {
                        break Ok(EchoMsg { seq: n, checksum: acc, payload: Vec::new(), reply_len: 0 })
                    }
                    Err(e) => break Err(e),
                }
            };
            responder.send(answer);
        });
        out.reply(reply);
    }
}

#[test]
fn an_idle_session_holds_no_receive_ring() {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    // Small requests (within the eager threshold), even with answers in the client's ring,
    // never ask for the server's.
    for seq in 0..20 {
        echo_checked(&client, seq, 100, 100 << 10);
    }
    let c = counters_when(&server, "the calls counted", SOON, |c| c.rpcs >= 20);
    assert_eq!((c.ring_bytes, c.rings_granted, c.rings_refused), (0, 0, 0), "{c:?}");
    // Send buffers only (the send areas of the answers above the threshold aside).
    assert_eq!(c.registered_bytes - c.send_area_bytes, BASE, "{c:?}");
}

#[test]
fn the_first_ring_body_asks_and_bodies_go_intact_across_many_grants_and_reclaims() {
    let idle = Duration::from_millis(40);
    let (server, _) = spawn(server().ring_idle(Some(idle)).add_service(SumSvc));
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo_checked(&client, 1, 100, 100);
    assert_eq!(server.counters().rings_granted, 0);

    // The first request above the eager threshold: a grant, and the body intact.
    echo_checked(&client, 2, 300 << 10, 100);
    let c = counters_when(&server, "the first grant", SOON, |c| c.rings_granted == 1);
    assert!(c.ring_bytes == RING || c.rings_reclaimed == 1, "{c:?}");
    assert!(c.registered_peak >= BASE + RING, "{c:?}");

    for round in 0..6u64 {
        // Idle: taken back. (An idle blocking client answers the RingReclaim when its
        // endpoint's progress thread looks at it, within 50 ms, or at its next call when the
        // ring was revoked before that: its next body takes the reclaim, gives the ring back
        // and asks again, the session unharmed.)
        let before = counters_when(&server, "the ring reclaimed", SOON, |c| {
            c.rings_reclaimed == c.rings_granted && c.ring_bytes == 0
        });
        // The next body asks again: whole, in pieces larger than the ring, and on a stream.
        let seq = 10 + round * 10;
        echo_checked(&client, seq, 200 << 10, 100);
        echo_checked(&client, seq + 1, 3 << 20, 100);
        let mut s = client.client_stream::<EchoMsg, EchoMsg>(SUM, &CallOptions::default()).unwrap();
        let mut acc = 0u64;
        for i in 0..3u64 {
            let m = request(i, if i == 1 { 2 << 20 } else { 150 << 10 }, 0);
            acc = acc.wrapping_mul(31).wrapping_add(m.checksum);
            s.send(&m).unwrap();
        }
        let r = s.finish().unwrap();
        assert_eq!((r.seq, r.checksum), (3, acc), "round {round}: the stream's bytes arrived");
        let c = server.counters();
        assert!(c.rings_granted > before.rings_granted, "round {round}: asked again: {c:?}");
    }
    let c = counters_when(&server, "the last ring reclaimed", SOON, |c| c.ring_bytes == 0);
    assert_eq!((c.rings_refused, c.malformed, c.sessions_closed), (0, 0, 0), "{c:?}");
    assert!(c.rings_granted >= 7, "{c:?}");
}

/// Two clients, room for one ring: the second's ring body fails RESOURCE_EXHAUSTED naming the
/// cap, its small calls go on, and once the first's ring is reclaimed it is served.
#[test]
fn a_refused_grant_fails_only_the_calls_that_needed_it() {
    let idle = Duration::from_millis(100);
    let (server, _) = spawn(server().max_ring_pool_bytes(RING).ring_idle(Some(idle)));
    let a = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let b = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    // A's ring, kept busy (no idle time between its bodies) while B asks.
    echo_checked(&a, 1, 200 << 10, 100);
    let e = b
        .unary::<_, EchoMsg>(ECHO, &request(2, 200 << 10, 100), &CallOptions::default())
        .expect_err("a second ring over max_ring_pool_bytes was granted");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_ring_pool_bytes"), "names the cap: {e:?}");
    // B's session and its eager calls go on; so do A's ring bodies.
    echo_checked(&b, 3, 100, 100);
    echo_checked(&a, 4, 200 << 10, 100);
    let c = server.counters();
    assert_eq!((c.rings_refused, c.ring_bytes, c.malformed, c.sessions_closed), (1, RING, 0, 0), "{c:?}");
    // A goes idle: its ring is taken back, and B's next ring body is granted.
    counters_when(&server, "a's ring reclaimed", SOON, |c| c.ring_bytes == 0);
    echo_checked(&b, 5, 200 << 10, 100);
    assert_eq!(server.counters().rings_granted, 2);
}

#[test]
fn a_ring_pool_below_one_ring_and_a_zero_ring_idle_are_refused_at_spawn() {
    let e = server().max_ring_pool_bytes(RING - 1).spawn("127.0.0.1:0").err().map(|e| e.to_string());
    assert!(e.as_deref().is_some_and(|e| e.contains("max_ring_pool_bytes")), "{e:?}");
    let e = server().ring_idle(Some(Duration::ZERO)).spawn("127.0.0.1:0").err().map(|e| e.to_string());
    assert!(e.as_deref().is_some_and(|e| e.contains("ring_idle")), "{e:?}");
}

/// A raw client's request of `len` bytes written whole at offset 0 of the granted ring.
fn ring_request(c: &mut RawClient, seq: u32, len: usize) {
    let body = request(u64::from(seq), len, 16).encode_to_vec();
    let h = Header {
        method: ECHO,
        generation: seq,
        in_ring: true,
        body_len: body.len() as u32,
        total_len: body.len() as u32,
        session: c.session,
        ..Header::new(Kind::Request)
    };
    c.write(0, &body, Some(h));
}

/// HOSTILE. A raw client asks for a 1 GiB ring: it gets the server's `ring_bytes`, no more;
/// asking again while it holds one closes its session (a protocol violation), and the ring's
/// bytes go back to the pool.
#[test]
fn a_huge_ask_is_capped_and_asking_again_closes_the_session_and_frees_the_ring() {
    let (server, _) = spawn(server());
    let mut c = RawClient::connect_bare(
        RawPeer::new(256, 16, 40 + 4096, 1 << 16, 1),
        server.local_addr(),
        4,
        4096,
        1 << 20,
    );
    c.ask_ring_of(1 << 30);
    c.take_grant().unwrap();
    let g = counters_when(&server, "the grant counted", SOON, |c| c.rings_granted == 1);
    assert_eq!(g.ring_bytes, RING, "the server's ring_bytes, whatever was asked: {g:?}");
    // The granted ring works.
    ring_request(&mut c, 1, 50 << 10);
    let h = c.wait_for(Kind::Response, 0);
    assert_eq!(h.status, Code::Ok, "{h:?}");
    c.ask_ring_of(1 << 20);
    let c2 = counters_when(&server, "the session closed", SOON, |c| c.sessions_closed == 1);
    assert_eq!((c2.ring_bytes, c2.malformed), (0, 1), "the ring back in the pool: {c2:?}");
}

/// HOSTILE. Asks, gives back, asks again, a hundred times (answering every reclaim at once):
/// every ring goes back to the pool, and the session serves on.
#[test]
fn ask_and_release_cycles_leak_no_ring() {
    let idle = Duration::from_millis(5);
    let (server, _) = spawn(server().ring_idle(Some(idle)));
    let mut c = RawClient::connect_bare(
        RawPeer::new(256, 16, 40 + 4096, 1 << 16, 1),
        server.local_addr(),
        4,
        4096,
        1 << 20,
    );
    for round in 0..100u32 {
        c.ask_ring().unwrap();
        // The reclaim comes once the ring sat idle; the release answers it. (On a loaded
        // machine the ring may be revoked first: the late release is taken quietly.)
        let r = c.wait_for(Kind::RingReclaim, 0);
        assert_eq!(r.kind, Kind::RingReclaim, "round {round}");
        c.send(Header::new(Kind::RingRelease), &[]);
    }
    let s =
        counters_when(&server, "every ring back", SOON, |c| c.rings_reclaimed == 100 && c.ring_bytes == 0);
    assert_eq!((s.rings_granted, s.malformed, s.sessions_closed), (100, 0, 0), "{s:?}");
    // The session serves on.
    let body = request(1, 16, 16).encode_to_vec();
    let n = body.len() as u32;
    c.send(
        Header { method: ECHO, generation: 1, body_len: n, total_len: n, ..Header::new(Kind::Request) },
        &body,
    );
    assert_eq!(c.wait_for(Kind::Response, 0).status, Code::Ok);
}

/// HOSTILE. A client that never answers the reclaim loses the ring anyway (revoked: its window
/// gone); its later WRITE fails with a remote access error and breaks its own session only: a
/// neighbour's ring bodies go on. And a client that writes after it gave the ring back breaks
/// its own session the same way.
#[test]
fn writes_after_a_revoke_or_a_release_break_only_the_writers_session() {
    // Long enough for the crossing body below to land before the revoke on a loaded machine.
    let idle = Duration::from_millis(300);
    let (server, _) = spawn(server().ring_idle(Some(idle)));
    let neighbour = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    for (release, name) in [(true, "released"), (false, "revoked")] {
        let mut c = RawClient::connect(server.local_addr());
        let base = server.counters();
        ring_request(&mut c, 1, 20 << 10);
        assert_eq!(c.wait_for(Kind::Response, 0).status, Code::Ok);
        c.wait_for(Kind::RingReclaim, 0);
        if release {
            // A body that crossed the reclaim (written before the client saw it) is still
            // taken: the ring stays until the release.
            ring_request(&mut c, 3, 20 << 10);
            assert_eq!(c.wait_for(Kind::Response, 0).status, Code::Ok, "a body written before the release");
            assert_eq!(server.counters().rings_reclaimed, base.rings_reclaimed, "dropped before the release");
            c.send(Header::new(Kind::RingRelease), &[]);
            counters_when(&server, "the release taken", SOON, |s| s.rings_reclaimed > base.rings_reclaimed);
        } else {
            // Never answered: revoked after `idle` more.
            let s =
                counters_when(&server, "the ring revoked", SOON, |s| s.rings_revoked > base.rings_revoked);
            assert_eq!(s.ring_bytes, 0, "{s:?}");
        }
        // The stale rkey: the WRITE fails at the NIC.
        ring_request(&mut c, 2, 20 << 10);
        let failed = wait_for(
            "the stale WRITE failed",
            SOON,
            || c.try_poll().err(),
            || format!("{name}: {:?}", server.counters()),
        );
        assert_eq!(failed, rpc_core::verbs::WcStatus::IBV_WC_REM_ACCESS_ERR, "{name}");
        // Its session is broken at its end; its control channel goes with it.
        drop(c);
        counters_when(&server, "the writer's session closed", SOON, |s| {
            s.sessions_closed > base.sessions_closed
        });
        // The neighbour's ring bodies (its own ring) go on.
        echo_checked(&neighbour, 3, 100, 200 << 10);
    }
}

/// HOSTILE. A client that sends what only a server may (a RingGrant, a RingReclaim), or a
/// RingRelease never asked for, or a ring body with no ring granted, loses its session.
#[test]
fn lease_messages_out_of_turn_close_the_session() {
    let (server, _) = spawn(server());
    let grant = rpc_core::wire::ring_lease::RingGrant { addr: 4096, len: 1 << 16, rkey: 7 }.encode();
    type Act = Box<dyn Fn(&mut RawClient)>;
    let cases: [(&str, Act); 4] = [
        (
            "a grant sent to the server",
            Box::new(move |c: &mut RawClient| {
                c.send(Header { body_len: 16, total_len: 16, ..Header::new(Kind::RingGrant) }, &grant)
            }),
        ),
        (
            "a reclaim sent to the server",
            Box::new(|c: &mut RawClient| c.send(Header::new(Kind::RingReclaim), &[])),
        ),
        (
            "a release not asked for",
            Box::new(|c: &mut RawClient| c.send(Header::new(Kind::RingRelease), &[])),
        ),
        (
            "a ring body with no ring",
            Box::new(|c: &mut RawClient| {
                // The header alone (a WRITE with rkey 0 would fail at the NIC first).
                let h = Header {
                    method: ECHO,
                    in_ring: true,
                    body_len: 20 << 10,
                    total_len: 20 << 10,
                    session: c.session,
                    ..Header::new(Kind::Request)
                };
                c.write(0, &[], Some(h));
            }),
        ),
    ];
    for (i, (name, act)) in cases.iter().enumerate() {
        let mut c = RawClient::connect_bare(
            RawPeer::new(256, 16, 40 + 4096, 1 << 16, 1),
            server.local_addr(),
            4,
            4096,
            1 << 20,
        );
        act(&mut c);
        let s = counters_when(&server, name, SOON, |s| s.sessions_closed == i as u64 + 1);
        assert_eq!(s.malformed, i as u64 + 1, "{name}: {s:?}");
        assert_eq!(s.rings_granted, 0, "{s:?}");
    }
}
