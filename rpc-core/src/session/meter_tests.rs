//! The server's meter ([`super::meter`]) against a fake client that sends headers by hand, and
//! the idle timer on a fake clock.

use super::meter::{is_violation, pieces_between, MAX_PINGS};
use super::*;
use std::time::{Duration, Instant};

fn params(credits: u16, eager: u32, ring: u32) -> SessionParams {
    SessionParams {
        id: 5,
        credits,
        eager_threshold: eager,
        max_message: 1 << 20,
        peer_ring_len: ring,
        own_ring_len: ring,
        max_held: usize::from(credits),
    }
}

fn from_client(kind: Kind) -> Header {
    Header { session: 5, ..Header::new(kind) }
}

/// What the fake client's message does to the server session: `Err` with the reason when the
/// session must close.
fn deliver(s: &mut Session, h: Header) -> Result<(), String> {
    let mut buf = [0u8; crate::wire::HEADER_LEN];
    h.encode(&mut buf);
    s.receive(&buf, false, false, Instant::now).map(drop)
}

/// The server sends a message of its own (stamped: it carries the freed head).
fn server_sends(s: &mut Session, kind: Kind, in_ring: bool) {
    let mut h = Header { in_ring, ..Header::new(kind) };
    s.stamp(&mut h);
}

#[test]
fn pings_beyond_two_silences_between_server_messages_close_the_session() {
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    for _ in 0..MAX_PINGS {
        deliver(&mut s, from_client(Kind::Ping)).unwrap();
    }
    let e = deliver(&mut s, from_client(Kind::Ping)).unwrap_err();
    assert!(is_violation(&e) && e.contains("Pings"), "{e}");

    // Any message of the server (its Pong) starts a new count.
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    for _ in 0..10 {
        for _ in 0..MAX_PINGS {
            deliver(&mut s, from_client(Kind::Ping)).unwrap();
        }
        let pong = s.next_control().unwrap();
        assert_eq!(pong.kind, Kind::Pong);
        server_sends(&mut s, Kind::Pong, false);
    }
    // A client is not metered (its peer is the server it chose).
    let mut c = Session::new(Role::Client, params(4, 64, 1 << 16));
    for _ in 0..20 {
        c.handle_header(&Header { session: 5, ..Header::new(Kind::Ping) }, Instant::now).unwrap();
    }
}

#[test]
fn a_pong_needs_a_ping_of_the_server() {
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    let e = deliver(&mut s, from_client(Kind::Pong)).unwrap_err();
    assert!(is_violation(&e) && e.contains("Pong"), "{e}");

    // The server probes a client with an unanswered call: one Pong per Ping.
    let t0 = Instant::now();
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    s.set_peer_timeout(Some(Duration::from_secs(3)), t0);
    s.handle_header(&Header { method: 1, ..from_client(Kind::Request) }, || t0).unwrap();
    s.handle_timeout(t0 + Duration::from_millis(10), true);
    s.handle_timeout(t0 + Duration::from_millis(1010), true);
    assert_eq!(s.next_control().map(|h| h.kind), Some(Kind::Ping));
    server_sends(&mut s, Kind::Ping, false);
    deliver(&mut s, from_client(Kind::Pong)).unwrap();
    let e = deliver(&mut s, from_client(Kind::Pong)).unwrap_err();
    assert!(is_violation(&e), "{e}");
}

/// A client that answers none of the server's Pings is owed no more than `MAX_PONGS_OWED` Pongs:
/// held back and sent at once, one more than that closes its session, so its Pings and Pongs
/// never take more receive WQEs than the worker reserves for the probe (`srq_need`). Sabotaged:
/// `pinged` counting every Ping (saturating at 255): the third Pong was accepted.
#[test]
fn pongs_held_back_are_bounded_by_the_probe_reservation() {
    let t0 = Instant::now();
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    s.set_peer_timeout(Some(Duration::from_secs(3)), t0);
    s.handle_header(&Header { method: 1, ..from_client(Kind::Request) }, || t0).unwrap();
    s.handle_timeout(t0 + Duration::from_millis(10), true);
    // Two silences' Pings, the client answering none (a Request ends the first silence).
    let mut at = t0 + Duration::from_millis(10);
    for round in 0..2u16 {
        for _ in 0..2 {
            at += Duration::from_millis(1001);
            s.handle_timeout(at, true);
            assert_eq!(s.next_control().map(|h| h.kind), Some(Kind::Ping));
            server_sends(&mut s, Kind::Ping, false);
        }
        if round == 0 {
            s.handle_header(&Header { method: 1, slot: 1, ..from_client(Kind::Request) }, || at).unwrap();
            at += Duration::from_millis(10);
            s.handle_timeout(at, true);
        }
    }
    for _ in 0..super::meter::MAX_PONGS_OWED {
        deliver(&mut s, from_client(Kind::Pong)).unwrap();
    }
    let e = deliver(&mut s, from_client(Kind::Pong)).unwrap_err();
    assert!(is_violation(&e) && e.contains("Pong"), "{e}");
}

#[test]
fn ring_returns_must_free_the_servers_ring_bodies() {
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    // Nothing of the server's in the client's ring: nothing to return.
    let e = deliver(&mut s, from_client(Kind::RingReturn)).unwrap_err();
    assert!(is_violation(&e) && e.contains("RingReturn"), "{e}");

    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    s.handle_header(&Header { method: 1, ..from_client(Kind::Request) }, Instant::now).unwrap();
    let [a, b] = [1000, 2000].map(|len| match s.place_body(len).unwrap() {
        Placement::Ring(off) => off,
        p => panic!("{p:?}"),
    });
    assert_eq!((a, b), (0, 1000));
    server_sends(&mut s, Kind::StreamMsg, true);
    server_sends(&mut s, Kind::Response, true);
    // The client frees the first body: one return; the same head again frees nothing.
    deliver(&mut s, Header { freed_head: 1000, ..from_client(Kind::RingReturn) }).unwrap();
    let e = deliver(&mut s, Header { freed_head: 1000, ..from_client(Kind::RingReturn) }).unwrap_err();
    assert!(is_violation(&e), "{e}");

    // A return must free a whole body: moving the head by a byte at a time (a RingReturn per
    // byte: thousands of them for one body) is refused at the first.
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    assert_eq!(s.place_body(3000).unwrap(), Placement::Ring(0));
    server_sends(&mut s, Kind::Response, true);
    let e = deliver(&mut s, Header { freed_head: 1, ..from_client(Kind::RingReturn) }).unwrap_err();
    assert!(is_violation(&e) && e.contains("whole ring body"), "{e}");
    // The same head on a request's header is no RingReturn: not metered.
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    assert_eq!(s.place_body(3000).unwrap(), Placement::Ring(0));
    s.handle_header(&Header { method: 1, freed_head: 1, ..from_client(Kind::Request) }, Instant::now)
        .unwrap();
    deliver(&mut s, Header { freed_head: 3000, ..from_client(Kind::RingReturn) }).unwrap();
}

/// The server keeps at most `ring_units(credits)` bodies and pieces unfreed in the client's
/// ring (a body beyond waits, as for space), so the RingReturns a client may send, one per body
/// freed at most, stay within the `srq_need` reservation. Sabotaged: `RingProducer::new` (not
/// counted) for the server: the 17th body was placed (`Ring(1600)`), and each of 17 RingReturns
/// was accepted although 16 WQEs are reserved for them.
#[test]
fn the_server_keeps_at_most_ring_units_bodies_unfreed_so_ring_returns_stay_within_the_reservation() {
    let credits = 4;
    let units = ring_units(credits);
    assert_eq!(units, MAX_PIECES_IN_RING);
    assert_eq!(ring_units(32), 32);
    let mut s = Session::new(Role::Server, params(credits, 64, 1 << 16));
    for k in 0..units {
        assert_eq!(s.place_body(100).unwrap(), Placement::Ring(100 * k), "body {k}");
        s.on_ring_written(s.ring_write_mark());
        server_sends(&mut s, Kind::StreamMsg, true);
    }
    // Plenty of bytes free, but no more bodies: the next one waits (in pieces, none granted).
    assert_eq!(s.place_body(100).unwrap(), Placement::Pieces);
    assert_eq!(s.next_piece(100), None);
    // One RingReturn per body freed, each accepted; the one after frees nothing.
    for k in 1..=units {
        deliver(&mut s, Header { freed_head: 100 * k, ..from_client(Kind::RingReturn) }).unwrap();
    }
    let e = deliver(&mut s, Header { freed_head: 100 * units, ..from_client(Kind::RingReturn) }).unwrap_err();
    assert!(is_violation(&e), "{e}");
    // Once freed, bodies go again.
    let mut s = Session::new(Role::Server, params(credits, 64, 1 << 16));
    for _ in 0..units {
        assert!(matches!(s.place_body(100).unwrap(), Placement::Ring(_)));
    }
    deliver(&mut s, Header { freed_head: 200, ..from_client(Kind::RingReturn) }).unwrap();
    assert!(matches!(s.place_body(100).unwrap(), Placement::Ring(_)));
    assert!(s.next_piece(100).is_some());
    assert_eq!(s.place_body(100).unwrap(), Placement::Pieces);
    // A body placed and taken back (never sent) gives its count back too.
    let mut s = Session::new(Role::Server, params(credits, 64, 1 << 16));
    for _ in 0..units - 1 {
        assert!(matches!(s.place_body(100).unwrap(), Placement::Ring(_)));
    }
    let before = s.producer.mark();
    assert!(matches!(s.place_body(100).unwrap(), Placement::Ring(_)));
    assert!(s.producer.rewind(before, s.producer.mark()));
    assert!(matches!(s.place_body(100).unwrap(), Placement::Ring(_)), "the rewound body's count came back");
}

/// A client with a body arriving in pieces reports freed space once half of the bodies the server
/// may keep unfreed are freed, however few bytes they hold: the server may be waiting for the
/// count, not for bytes. Sabotaged (`units_return_due` false): no RingReturn after 8 small
/// bodies, and the server would wait for a Ping.
#[test]
fn a_client_reports_freed_space_at_half_the_servers_unfreed_bodies() {
    let credits = 4;
    let mut c = Session::new(Role::Client, params(credits, 64, 1 << 16));
    c.assemblies.push(Assembly {
        header: Header::new(Kind::Response),
        body: Vec::new(),
        _charge: None,
        since: None,
        refused: false,
        dropped: 0,
    });
    let half = ring_units(credits) / 2;
    for k in 0..half {
        let t = c.consumer.accept(100 * k, 100).unwrap();
        c.consumer.release(t);
        // 100-byte bodies: far below a quarter of the 64 KiB ring.
        assert_eq!(c.ring_return_due(), k + 1 == half, "after {} bodies", k + 1);
    }
    c.consumer.take_freed();
    assert!(!c.ring_return_due(), "reported");
    // The server's own consumer is not counted this way (the client keeps no such cap).
    let mut s = Session::new(Role::Server, params(credits, 64, 1 << 16));
    s.assemblies.push(Assembly {
        header: Header::new(Kind::Request),
        body: Vec::new(),
        _charge: None,
        since: None,
        refused: false,
        dropped: 0,
    });
    for k in 0..2 * half {
        let t = s.consumer.accept(100 * k, 100).unwrap();
        s.consumer.release(t);
    }
    assert!(!s.ring_return_due());
}

/// Non-last pieces of one message, each `len` bytes, copied out and freed at once.
fn pieces(s: &mut Session, n: u32, len: u32, at: &mut u32) -> Result<(), String> {
    for _ in 0..n {
        let h = Header {
            method: 1,
            in_ring: true,
            ring_offset: *at,
            body_len: len,
            total_len: 1 << 20,
            ..from_client(Kind::Request)
        };
        let mut buf = [0u8; crate::wire::HEADER_LEN];
        h.encode(&mut buf);
        let piece = s.receive(&buf, false, false, Instant::now)?.ring.unwrap();
        s.piece_buffer(&piece).extend(std::iter::repeat_n(0u8, len as usize));
        assert_eq!(s.piece_done(piece), Ok(None));
        *at = (*at + len) % (1 << 16);
    }
    Ok(())
}

#[test]
fn pieces_beyond_a_ring_between_server_messages_close_the_session() {
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    let mut at = 0;
    assert_eq!(pieces_between(1 << 16), MAX_PIECES_IN_RING);
    // Pieces of the smallest legal size (1/16 of the ring), one more than a ring holds.
    pieces(&mut s, MAX_PIECES_IN_RING, 4096, &mut at).unwrap();
    let e = pieces(&mut s, 1, 4096, &mut at).unwrap_err();
    assert!(is_violation(&e) && e.contains("pieces"), "{e}");

    // A client that keeps the protocol (pieces of at least 1/16 of the ring) waits for the
    // freed head (a server message) after at most a ring's worth: never closed.
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    let mut at = 0;
    for _ in 0..10 {
        pieces(&mut s, MAX_PIECES_IN_RING, 4096, &mut at).unwrap();
        server_sends(&mut s, Kind::RingReturn, false);
    }
}

#[test]
fn the_piece_bound_is_what_a_ring_holds_at_its_smallest_piece() {
    assert_eq!(pieces_between(1 << 20), 16);
    assert_eq!(pieces_between(256), 16);
    assert_eq!(pieces_between(100), 16, "pieces of at least 6 bytes");
    assert_eq!(pieces_between(20), 20, "pieces of at least 1 byte");
    assert_eq!(pieces_between(1), 1);
}

#[test]
fn an_idle_session_closes_after_the_idle_timeout_on_the_fake_clock() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    assert_eq!(s.handle_idle(at(0)), None);
    assert_eq!(s.handle_idle(at(10_000)), None, "no idle timeout: never");

    s.set_idle_timeout(Some(Duration::from_millis(100)));
    assert_eq!(s.handle_idle(at(0)), None);
    assert_eq!(s.handle_idle(at(99)), None);
    assert_eq!(s.handle_idle(at(100)), Some(Duration::from_millis(100)));

    // A call in flight is not idle, however long it runs; its answer restarts the count.
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    s.set_idle_timeout(Some(Duration::from_millis(100)));
    s.handle_header(&Header { method: 1, slot: 1, generation: 1, ..from_client(Kind::Request) }, || at(0))
        .unwrap();
    assert_eq!(s.handle_idle(at(0)), None);
    assert_eq!(s.handle_idle(at(500)), None);
    assert!(s.on_answer_for(1, 1));
    assert_eq!(s.handle_idle(at(510)), None, "answered since the last look");
    assert_eq!(s.handle_idle(at(520)), None);
    assert_eq!(s.handle_idle(at(619)), None);
    assert_eq!(s.handle_idle(at(620)), Some(Duration::from_millis(100)));

    // A client that answers probes while idle is probed instead, never closed for being idle;
    // with the probe off, it is closed for being idle as any other (else nothing would reclaim it).
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    s.set_idle_timeout(Some(Duration::from_millis(100)));
    s.probe_while_idle();
    assert_eq!(s.handle_idle(at(0)), None);
    assert_eq!(s.handle_idle(at(100)), Some(Duration::from_millis(100)), "no probe: closed when idle");
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    s.set_idle_timeout(Some(Duration::from_millis(100)));
    s.set_peer_timeout(Some(Duration::from_secs(6)), at(0));
    s.probe_while_idle();
    assert_eq!(s.handle_idle(at(0)), None);
    assert_eq!(s.handle_idle(at(10_000)), None);

    // Pings are no calls: a client that only probes is idle.
    let mut s = Session::new(Role::Server, params(4, 64, 1 << 16));
    s.set_idle_timeout(Some(Duration::from_millis(100)));
    assert_eq!(s.handle_idle(at(0)), None);
    deliver(&mut s, from_client(Kind::Ping)).unwrap();
    assert_eq!(s.handle_idle(at(100)), Some(Duration::from_millis(100)));
}
