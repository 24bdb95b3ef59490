//! A session's send mirror and staging area (the local memory its ring bodies are RDMA WRITTEN
//! from) are registered at its first body above the eager threshold, not at connect, and given
//! back after `ServerConfig::send_area_idle` unused, never while a WRITE from them is in flight
//! (`Counters::send_area_bytes`, `send_areas_created`, `send_areas_released`).
//!
//! Sabotaged, each test failed: registering them at connect (`SendAreas::new` calling
//! `ensure`): the idle session's counters showed 3 MiB, and the next two tests failed their
//! first `send_areas_created == 0`. Never giving them back (`release_idle` returning false): "the send
//! areas given back" waits gave up. Both in-flight guards off (`Conn::release_idle_areas`
//! ignoring the retired mark, `SendQueue::reads_send_areas` false): "given back while a WRITE
//! from them was in flight", and the send queue's own test at "a WRITE is queued" (either guard
//! alone keeps the in-flight test passing: they are independent). `release_send_areas` not
//! unbinding the staging area: the next staged answer went without its WRITE ("undecodable
//! response") and "written from the third area" failed. `encode_body` encoding into an absent
//! mirror: "no buffer space for a body of 204816 bytes". `Conn::place_late` leaving the first
//! ring body waiting: a ring-full stall counted (and `hostile_freed_head` got it in pieces). A
//! failed registration leaving the answer waiting instead of answering: "no answer to call 1".

mod rpc_support;

use std::time::{Duration, Instant};

use prost::Message;
use rpc_core::codegen::*;
use rpc_core::verbs::QueuePair;
use rpc_core::wire::{Header, Kind};
use rpc_core::Client;
use rpc_support::*;

/// What a server registers for the send mirror (the client's ring, 1 MiB by default) and the
/// staging area (twice it) of one session of a default client.
const DEFAULT_AREAS: u64 = 3 << 20;

/// What a server registers for one default session at connect: nothing (its send buffers are
/// its worker's pool's, `Counters::send_pool_bytes`, not part of `registered_bytes`; its
/// receive ring is granted on demand, protocol 12).
const BASE: u64 = 0;

/// Long enough for a wait that must succeed, short enough that a sabotaged run fails quickly.
const SOON: Duration = Duration::from_secs(10);

#[test]
fn an_idle_session_registers_no_send_mirror_or_staging_area() {
    let (server, _) = spawn(server());
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    // Small calls (bodies within the eager threshold both ways) never touch them.
    for seq in 0..20 {
        echo_checked(&client, seq, 100, 4000);
    }
    let c = server.counters();
    assert_eq!((c.send_area_bytes, c.send_areas_created), (0, 0), "{c:?}");
    // The session's receive ring and send buffers: nothing else, then or ever.
    assert_eq!((c.registered_bytes, c.registered_peak), (BASE, BASE), "{c:?}");
}

#[test]
fn a_ring_body_registers_them_idle_time_gives_them_back_and_the_next_body_registers_them_again() {
    let idle = Duration::from_millis(250);
    // The receive ring the request above the threshold gets goes back as soon.
    let (server, _) = spawn(server().send_area_idle(Some(idle)).ring_idle(Some(idle)));
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo_checked(&client, 1, 100, 100);
    assert_eq!(server.counters().send_areas_created, 0);

    // The first answer above the eager threshold: registered, and the answer's bytes intact,
    // placed whole in the client's ring as with a mirror registered at connect (not left
    // waiting as if the ring were full).
    echo_checked(&client, 2, 100, 200 << 10);
    let c = counters_when(&server, "the worker's counters published", SOON, |c| c.rpcs >= 2);
    assert_eq!((c.send_areas_created, c.ring_full_stalls), (1, 0), "{c:?}");
    // (They may be given back already on a slow machine: the peak shows them.)
    assert_eq!(c.registered_peak, BASE + DEFAULT_AREAS, "{c:?}");
    // Written from the mirror (placed whole in the ring) and in pieces (larger than the
    // staging area: from the heap through the mirror): all intact.
    echo_checked(&client, 3, 100, 100 << 10);
    echo_checked(&client, 4, 100, 3 << 20);
    // A request above the threshold: the client registers its own on demand.
    echo_checked(&client, 5, 300 << 10, 100);

    // Unused for `idle`: given back, the registered gauge back to the session's base. (On a
    // loaded machine they may have gone between two calls above already, and come back.)
    let c = counters_when(&server, "the send areas and the ring given back", SOON, |c| {
        c.send_areas_released >= 1 && c.send_area_bytes == 0 && c.ring_bytes == 0
    });
    assert_eq!(c.registered_bytes, BASE, "{c:?}");
    let created = c.send_areas_created;

    // Small calls leave them unregistered.
    for seq in 10..20 {
        echo_checked(&client, seq, 100, 100);
    }
    let c = server.counters();
    assert_eq!((c.send_area_bytes, c.send_areas_created), (0, created), "{c:?}");

    // The next ring body registers them again and is served intact, whole and in pieces.
    echo_checked(&client, 30, 100, 200 << 10);
    echo_checked(&client, 31, 100, 3 << 20);
    let c = server.counters();
    assert!(c.send_areas_created > created, "registered again: {c:?}");
    assert_eq!(c.send_area_failures, 0, "{c:?}");
}

/// The client's answer is WRITTEN from the mirror while the client's QP drops every packet: the
/// WRITE stays in flight (the server's NIC retries it) for many times `send_area_idle`, and the
/// mirror and staging area must stay registered until its completion is polled.
#[test]
fn they_are_never_given_back_while_a_write_from_them_is_in_flight() {
    let idle = Duration::from_millis(20);
    let (server, stash) = spawn(server().send_area_idle(Some(idle)));
    let mut c = RawClient::connect(server.local_addr());
    // The RawClient's ring is 64 KiB: a mirror of 64 KiB and a staging area of 128 KiB.
    let areas = 3 * (64 << 10);

    let body = request(1, 16, 0).encode_to_vec();
    c.send(
        Header {
            method: STASH,
            generation: 1,
            body_len: body.len() as u32,
            total_len: body.len() as u32,
            ..Header::new(Kind::Request)
        },
        &body,
    );
    wait_until(
        "the STASH call to reach its handler",
        SOON,
        || stash.lock().unwrap().len() == 1,
        || format!("{:?}", server.counters()),
    );
    assert_eq!(server.counters().send_areas_created, 0);

    // Its answer (8000 bytes of payload: above the 4 KiB eager threshold, within a piece of the
    // client's ring) leaves while the client's QP drops everything.
    c.peer.qp.set_drop_traffic(true);
    let p = payload(7, 8000);
    let answer = EchoMsg { seq: 7, checksum: fnv64(&p), payload: p, reply_len: 0 };
    let len = answer.encoded_len() as u32;
    stash.lock().unwrap().pop().unwrap().send(Ok(answer));
    counters_when(&server, "the answer's send areas registered", SOON, |c| c.send_areas_created == 1);
    // 5 × `send_area_idle`, well within the server's retries (7 × 67 ms): the sweeps meanwhile
    // (every 5 ms) find them unused for longer than `idle`, with the WRITE in flight.
    let until = Instant::now() + 5 * idle;
    while Instant::now() < until {
        let s = server.counters();
        assert_eq!(
            (s.send_area_bytes, s.send_areas_released),
            (areas, 0),
            "given back while a WRITE from them was in flight: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    c.peer.qp.set_drop_traffic(false);

    // The retried WRITE and SEND arrive: the answer is in our ring, intact.
    let h = c.wait_for(Kind::Response, 0);
    assert!(h.in_ring && h.generation == 1 && h.status == rpc_core::Code::Ok, "{h:?}");
    assert_eq!(h.body_len, len);
    let mut got = Vec::new();
    assert!(c.peer.ring.copy_out(h.ring_offset, h.body_len, &mut got));
    let r = EchoMsg::decode(&got[..]).unwrap();
    assert_eq!((r.seq, r.payload.len()), (7, 8000));
    assert_eq!(r.payload, payload(7, 8000));
    assert!(!c.dead, "the server's WRITE failed");

    // Once its completion is polled and `idle` passes, they go.
    let s = counters_when(&server, "the send areas given back", SOON, |s| s.send_areas_released == 1);
    assert_eq!(s.send_area_bytes, 0, "{s:?}");
}

/// The send queue's own check, below the connection's: a send mirror and a staging area are
/// handed back unreleased while a WRITE from them is queued, posted, or retired by a polled
/// completion whose ring mark was not taken yet, and while a staged body holds staging space;
/// released, the queue writes from a new staging area.
#[test]
fn the_send_queue_releases_send_areas_only_once_no_write_reads_them() {
    use rpc_core::buffers::{Completions, SendMirror, SendPool, SendQueue, SendStaging};
    use rpc_core::verbs::rc::RcConfig;
    use rpc_core::verbs::sim::Sim;
    use rpc_core::verbs::QueuePair;
    const RING: usize = 4096;
    let a = RawPeer::new(1024, 8, 256, 4096, 1);
    let b = RawPeer::new(1024, 64, 256, RING, 2);
    let hb = b.handshake(4, 64, 1 << 20, 1);
    a.connect(&RcConfig::default(), &hb);
    b.connect(&RcConfig::default(), &a.handshake(4, 64, 1 << 20, 1));
    let mut pool = SendPool::<Sim>::new(&a.pd, 16, 64).unwrap();
    let mut sq = SendQueue::new(a.qp.cap().max_send_wr as usize, 16);
    let mut wcs = Completions::<1>::new();
    let mut poll_one = |pool: &mut SendPool<Sim>, sq: &mut SendQueue| {
        let give_up = Instant::now() + SOON;
        loop {
            if wcs.poll(&a.cq).unwrap() == 1 {
                let c = wcs.next().unwrap();
                assert!(c.wc().status.is_success(), "{c:?}");
                assert!(sq.on_completion(c, pool));
                return;
            }
            assert!(Instant::now() < give_up, "no completion of the WRITE");
            std::thread::yield_now();
        }
    };
    let areas =
        || (SendMirror::<Sim>::new(&a.pd, RING).unwrap(), SendStaging::<Sim>::new(&a.pd, 3000, 4).unwrap());

    // A WRITE from the mirror: queued, then posted, then completed but its mark not taken.
    let (mut mirror, staging) = areas();
    assert!(mirror.write_at(0, &[7; 100]));
    sq.write(&mirror, 0, 100, hb.ring_addr, hb.ring_rkey, 100);
    let (mirror, staging) = sq.release_send_areas(mirror, staging).expect_err("a WRITE is queued");
    sq.flush(&a.qp, &mut pool, 1).unwrap();
    let (mirror, staging) = sq.release_send_areas(mirror, staging).expect_err("a WRITE is posted");
    poll_one(&mut pool, &mut sq);
    let (mirror, staging) = sq.release_send_areas(mirror, staging).expect_err("its mark is not taken");
    assert_eq!(sq.take_ring_mark(), Some(100));
    assert!(sq.release_send_areas(mirror, staging).is_ok(), "no WRITE reads them any more");

    // A staged body: held unsent, then written; released once its last WRITE is retired.
    let (mirror, mut staging) = areas();
    let (at, spare) = staging.spare_mut();
    spare[..200].fill(9);
    let body = staging.commit(at, 200).unwrap();
    let (mirror, staging) = sq.release_send_areas(mirror, staging).expect_err("a body is staged");
    let remote = (hb.ring_addr + 200, hb.ring_rkey);
    assert!(sq.write_staged(&staging, body, 0, 200, remote, 300).is_none(), "written from the new area");
    sq.flush(&a.qp, &mut pool, 1).unwrap();
    let (mirror, staging) = sq.release_send_areas(mirror, staging).expect_err("its WRITE is posted");
    poll_one(&mut pool, &mut sq);
    assert_eq!(sq.take_ring_mark(), Some(300));
    let (mirror, mut staging) = sq.release_send_areas(mirror, staging).expect_err("its range is not retired");
    sq.retire_staged(&mut staging);
    assert_eq!(staging.used(), 0);
    assert!(sq.release_send_areas(mirror, staging).is_ok());

    // The queue writes from a third staging area.
    let (_mirror, mut staging) = areas();
    let (at, _) = staging.spare_mut();
    let body = staging.commit(at, 50).unwrap();
    assert!(sq.write_staged(&staging, body, 0, 50, remote, 350).is_none(), "written from the third area");
    sq.discard_pending(&mut pool);
}

/// A server whose registration fails (its sim host has 1 GiB of memory for everything, and a
/// client announces a ring of 1 GiB: the send mirror of it cannot be registered) answers the
/// call that needed the mirror RESOURCE_EXHAUSTED naming it; that session serves its small
/// calls on and another session's large answers are served.
#[test]
fn a_failed_registration_fails_the_call_that_needed_it_and_nothing_else() {
    in_small_sim_segments("failed_registration_child");
}

#[test]
#[ignore = "the child of a_failed_registration_fails_the_call_that_needed_it_and_nothing_else"]
fn failed_registration_child() {
    use rpc_core::wire::{read_frame, write_frame, Frame, HEADER_LEN};
    assert_eq!(std::env::var("RPC_SIM_SEGMENT_BYTES").as_deref(), Ok("1073741824"), "run by its parent");
    let (server, stash) = spawn(server().max_peer_ring_bytes(1 << 30));
    // A client that announces a 1 GiB ring (its real one is 64 KiB): the server would mirror it.
    let peer = RawPeer::new(256, 16, HEADER_LEN + 4096, 1 << 16, 1);
    let mut tcp = std::net::TcpStream::connect(server.local_addr()).unwrap();
    let hello = rpc_core::wire::Handshake { ring_len: 1 << 30, ..peer.handshake(4, 4096, 1 << 20, 0) };
    write_frame(&mut tcp, &Frame::Handshake(hello)).unwrap();
    let Frame::Handshake(reply) = read_frame(&mut tcp).unwrap() else { panic!("refused") };
    peer.connect(&rpc_core::verbs::rc::RcConfig::default(), &reply);
    let mut c = RawClient::over(peer, &reply, reply.session, tcp);

    let call =
        |c: &mut RawClient, method: MethodId, generation: u32, reply_len: usize| -> (Header, Vec<u8>) {
            let body = request(u64::from(generation), 16, reply_len).encode_to_vec();
            let h = Header {
                method,
                generation,
                body_len: body.len() as u32,
                total_len: body.len() as u32,
                ..Header::new(Kind::Request)
            };
            c.send(h, &body);
            let give_up = Instant::now() + SOON;
            loop {
                if let Some(i) =
                    c.inbox.iter().position(|(h, _)| h.kind == Kind::Response && h.generation == generation)
                {
                    return c.inbox.remove(i).unwrap();
                }
                assert!(
                    Instant::now() < give_up,
                    "no answer to call {generation}: {:?}; server {:?}; client QP {:?}",
                    c.inbox,
                    server.counters(),
                    c.peer.qp.state()
                );
                // (`poll` hands out the oldest message of the inbox: kept for the look above.)
                if let Some(m) = c.poll() {
                    c.inbox.push_front(m);
                }
                std::thread::yield_now();
            }
        };
    // An answer above the eager threshold: its send mirror (1 GiB) cannot be registered.
    let (h, body) = call(&mut c, ECHO, 1, 8000);
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(h.status, rpc_core::Code::ResourceExhausted, "{h:?} {text}");
    assert!(text.contains("send mirror") && text.contains("1073741824 bytes"), "names what failed: {text}");
    // The session serves on.
    let (h, body) = call(&mut c, ECHO, 2, 100);
    assert_eq!(h.status, rpc_core::Code::Ok, "{h:?}");
    check_reply(&EchoMsg::decode(&body[..]).unwrap(), 2, 100);
    // A deferred answer (encoded on the heap, sent from the session's outbox) fails alike.
    let answer = std::thread::spawn({
        let stash = stash.clone();
        move || {
            let give_up = Instant::now() + SOON;
            while stash.lock().unwrap().is_empty() {
                assert!(Instant::now() < give_up, "the STASH call never reached its handler");
                std::thread::yield_now();
            }
            let p = payload(4, 8000);
            let m = EchoMsg { seq: 4, checksum: fnv64(&p), payload: p, reply_len: 0 };
            stash.lock().unwrap().pop().unwrap().send(Ok(m));
        }
    });
    let (h, body) = call(&mut c, STASH, 4, 0);
    answer.join().unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(h.status, rpc_core::Code::ResourceExhausted, "{h:?} {text}");
    assert!(text.contains("send mirror"), "names what failed: {text}");
    // Another session's ring bodies are served.
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo_checked(&client, 3, 100, 200 << 10);
    let s = server.counters();
    assert_eq!(
        (s.send_area_failures, s.send_areas_created, s.send_area_bytes),
        (2, 1, DEFAULT_AREAS),
        "{s:?}"
    );
    assert!(!c.dead);
}

/// `ServerConfig::max_send_area_bytes` bounds the areas of all sessions together: with room for
/// one session's, a second session's first ring body is answered RESOURCE_EXHAUSTED naming the
/// cap while the first holds them (its small calls go on), and served once they are given back.
/// A cap below one session's areas is refused at spawn, naming the field.
#[test]
fn the_server_wide_cap_on_send_areas_fails_the_call_over_it_and_nothing_else() {
    let e = server().max_peer_ring_bytes(1 << 20).max_send_area_bytes(DEFAULT_AREAS - 1).spawn("127.0.0.1:0");
    let text = e.err().map(|e| e.to_string()).expect("a cap below one session's areas was accepted");
    assert!(text.contains("max_send_area_bytes"), "names the field: {text}");

    let idle = Duration::from_millis(300);
    let (server, _) = spawn(
        server().max_peer_ring_bytes(1 << 20).max_send_area_bytes(DEFAULT_AREAS).send_area_idle(Some(idle)),
    );
    let a = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let b = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    echo_checked(&a, 1, 100, 200 << 10);
    // Held by `a` until `idle` passes with no ring body of its: `b`'s first one is over the cap
    // (unless `a`'s were given back already on a very slow machine: then it is served).
    let over = b.unary::<_, EchoMsg>(ECHO, &request(2, 100, 200 << 10), &CallOptions::default());
    match over {
        Err(s) => {
            assert_eq!(s.code(), rpc_core::Code::ResourceExhausted, "{s}");
            assert!(s.message().contains("max_send_area_bytes"), "names the cap: {s}");
            let c = server.counters();
            assert_eq!((c.send_area_failures, c.send_area_bytes), (1, DEFAULT_AREAS), "{c:?}");
            // The session goes on.
            echo_checked(&b, 3, 100, 100);
        }
        Ok(r) => {
            check_reply(&r, 2, 200 << 10);
            assert!(server.counters().send_areas_released >= 1, "served only after a release");
        }
    }
    let before = counters_when(&server, "a's areas given back", SOON, |c| c.send_area_bytes == 0);
    echo_checked(&b, 4, 100, 200 << 10);
    let c = server.counters();
    assert!(c.send_areas_created > before.send_areas_created, "b registered them: {c:?}");
    assert_eq!(c.send_area_failures, before.send_area_failures, "{c:?}");
}
