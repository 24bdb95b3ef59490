//! Breaking the server's cap on ring bodies and pieces unfreed in a client's ring
//! (`session::ring_units` = max(credits, 16)) as a user: legitimate traffic must neither stall
//! until a Ping (a third of `peer_timeout`) nor be closed by the meter. Every session here has a
//! `peer_timeout` of 600 s on both ends, so a RingReturn that only a Ping would bring takes
//! 200 s; every call has a deadline of [`DEADLINE`], far below that and far above what the
//! traffic needs, so such a stall fails the call with DEADLINE_EXCEEDED instead of passing
//! slowly. The meter's closes show as `malformed` and `sessions_closed` on the server.
//!
//! All on `sim` with the yielding polling policy.

mod rpc_support;

use std::time::Duration;

use rpc_core::codegen::*;
use rpc_core::{CallOptions, Client, ServerHandle};
use rpc_support::*;

const SHAPED: MethodId = method_id("/test.Units/Shaped");
/// Unary: answers `size` payload bytes after `every` ms (from another thread).
const LATE: MethodId = method_id("/test.Units/Late");

/// The deadline of every call or stream here: far above what it needs on sim, far below the
/// 200 s a stall until a Ping takes.
const DEADLINE: Duration = Duration::from_secs(90);

/// No Ping before 200 s of silence.
const PEER_TIMEOUT: Duration = Duration::from_secs(600);

/// What the client asks the server stream for.
#[derive(Clone, PartialEq, prost::Message)]
struct Shape {
    /// Messages to send.
    #[prost(uint64, tag = "1")]
    count: u64,
    /// Payload bytes of most messages.
    #[prost(uint32, tag = "2")]
    size: u32,
    /// Every `every`-th message (0: none) has `big` payload bytes instead.
    #[prost(uint32, tag = "3")]
    every: u32,
    #[prost(uint32, tag = "4")]
    big: u32,
}

fn size_of(s: &Shape, seq: u64) -> usize {
    if s.every != 0 && seq % u64::from(s.every) == u64::from(s.every) - 1 {
        s.big as usize
    } else {
        s.size as usize
    }
}

struct Units;

impl Service for Units {
    const NAME: &'static str = "test.Units";
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: SHAPED, name: "/test.Units/Shaped" },
        MethodDesc { id: LATE, name: "/test.Units/Late" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        let s: Shape = match decode(body) {
            Ok(r) => r,
            Err(e) => return out.error(e),
        };
        if method == LATE {
            let (responder, reply) = ctx.defer::<EchoMsg>();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(u64::from(s.every)));
                let p = payload(s.count, s.size as usize);
                responder.send(Ok(EchoMsg { seq: s.count, checksum: 0, payload: p, reply_len: 0 }));
            });
            return out.reply(reply);
        }
        if method != SHAPED {
            return out.error(Status::unimplemented("no such method"));
        }
        let (sink, reply) = ctx.stream::<EchoMsg>();
        std::thread::spawn(move || {
            for seq in 0..s.count {
                let p = payload(seq, size_of(&s, seq));
                if sink.send(&EchoMsg { seq, checksum: 0, payload: p, reply_len: 0 }).is_err() {
                    break;
                }
            }
        });
        out.reply(reply);
    }
}

/// A server of `credits` per session and a client of that window, both with [`PEER_TIMEOUT`].
fn start(credits: u16) -> (ServerHandle, Client) {
    let h = server()
        .credits_per_session(credits)
        .peer_timeout(Some(PEER_TIMEOUT))
        .add_service(Units)
        .add_service(TestService::default())
        .spawn("127.0.0.1:0")
        .unwrap();
    let c = Client::connect_with(
        h.local_addr(),
        &client_config().window(credits).peer_timeout(Some(PEER_TIMEOUT)),
    )
    .unwrap();
    (h, c)
}

/// The server closed no session and counted nothing malformed, once its workers published the
/// counts of at least `rpcs` calls (workers publish when idle).
#[track_caller]
fn clean(h: &ServerHandle, c: &Client, what: &str, rpcs: u64) {
    wait_until(what, WAIT, || h.counters().rpcs >= rpcs, || format!("{:?}", h.counters()));
    let s = h.counters();
    assert_eq!(
        (s.malformed, s.metered, s.sessions_closed),
        (0, 0, 0),
        "{what}: server {s:?}, client {:?}",
        c.counters()
    );
}

/// Reads a whole server stream of `shape`, checking each message.
#[track_caller]
fn read_stream(h: &ServerHandle, c: &Client, shape: Shape, what: &str) {
    let mut s = c.server_stream::<_, EchoMsg>(SHAPED, &shape, &CallOptions::deadline(DEADLINE)).unwrap();
    for seq in 0..shape.count {
        let m = match s.message() {
            Ok(Some(m)) => m,
            other => panic!(
                "{what}: message {seq} of {}: {other:?}; server {:?}, client {:?}",
                shape.count,
                h.counters(),
                c.counters()
            ),
        };
        assert_eq!(m.seq, seq, "{what}");
        assert!(m.payload == payload(seq, size_of(&shape, seq)), "{what}: message {seq} differs");
    }
    assert_eq!(s.message().unwrap(), None, "{what}: a clean end");
    let done = c.counters().rpcs;
    clean(h, c, what, done);
}

/// Many ring messages just over the eager threshold (4,096 bytes), at credits below, at and
/// above the 16 units, and the same interleaved with answers in pieces and pipelined bodies.
#[test]
fn server_streams_of_small_ring_messages_never_wait_for_a_ping() {
    for credits in [1u16, 2, 4, 16, 32] {
        let (h, c) = start(credits);
        let what = format!("credits {credits}, small");
        read_stream(&h, &c, Shape { count: 3000, size: 4100, every: 0, big: 0 }, &what);
        // Pipelined (at least 2 × 64 KiB of the 1 MiB ring) every 5th.
        let what = format!("credits {credits}, pipelined every 5th");
        read_stream(&h, &c, Shape { count: 400, size: 4100, every: 5, big: 200 << 10 }, &what);
        // Larger than the ring (in pieces) every 13th.
        let what = format!("credits {credits}, pieces every 13th");
        read_stream(&h, &c, Shape { count: 200, size: 4100, every: 13, big: (3 << 20) / 2 }, &what);
        drop(c);
        h.shutdown();
    }
}

/// Unary calls in flight at once, their answers a mix of small ring bodies, pipelined bodies and
/// bodies in pieces, at low and high credits.
#[test]
fn unary_answers_of_every_shape_in_flight_at_once_never_wait_for_a_ping() {
    for credits in [1u16, 2, 4, 32] {
        let (h, c) = start(credits);
        let sizes = [4100usize, 5000, 200 << 10, 4100, 600 << 10, 4100, 3 << 20, 4100, 130 << 10];
        for round in 0..20u64 {
            let futs: Vec<_> = (0..32u64)
                .map(|i| {
                    let seq = round * 100 + i;
                    let reply = sizes[(seq as usize) % sizes.len()];
                    (
                        seq,
                        reply,
                        c.unary_async::<_, EchoMsg>(
                            ECHO,
                            &request(seq, 16, reply),
                            &CallOptions::deadline(DEADLINE),
                        ),
                    )
                })
                .collect();
            for (seq, reply, f) in futs {
                match block_on(f) {
                    Ok(r) => check_reply(&r, seq, reply),
                    Err(e) => panic!(
                        "credits {credits}: call {seq} ({reply} B): {e:?}; server {:?}, client {:?}",
                        h.counters(),
                        c.counters()
                    ),
                }
            }
        }
        clean(&h, &c, &format!("credits {credits}, unary"), 20 * 32);
        drop(c);
        h.shutdown();
    }
}

/// A client waits for one answer while the answers of its other calls came first and wait for
/// their futures (a join in call order), with the producer's tail past the middle of the ring:
/// the awaited 500 KiB answer fits in the free part of the ring but not contiguously, so it goes
/// in pieces while the server has `credits - 1` bodies placed. Were those held in the ring until
/// their futures took them, the cap would leave the pieces one unit behind a head that cannot
/// move; the `Client` copies every ring body out at once, so they are freed, and the answer
/// comes (this guards that).
#[test]
fn an_answer_in_pieces_behind_held_answers_of_a_full_window_completes() {
    for credits in [16u16, 32] {
        let (h, c) = start(credits);
        // Move the producer's tail to about 600 KiB of the 1 MiB ring (small bodies go on at
        // the tail of an empty ring): the held answers then end past 600 KiB.
        for seq in 0..150u64 {
            let r: EchoMsg =
                c.unary(ECHO, &request(seq, 16, 4100), &CallOptions::deadline(DEADLINE)).unwrap();
            check_reply(&r, seq, 4100);
        }
        let late = Shape { count: 1_000_000, size: 500 << 10, every: 300, big: 0 };
        let awaited =
            c.unary_async::<_, EchoMsg>(LATE, &late, &CallOptions::deadline(Duration::from_secs(30)));
        let others: Vec<_> = (1..u64::from(credits))
            .map(|seq| {
                (
                    seq,
                    c.unary_async::<_, EchoMsg>(
                        ECHO,
                        &request(seq, 16, 4100),
                        &CallOptions::deadline(DEADLINE),
                    ),
                )
            })
            .collect();
        match block_on(awaited) {
            Ok(r) => assert!(
                r.seq == 1_000_000 && r.payload == payload(1_000_000, 500 << 10),
                "credits {credits}: the awaited answer differs"
            ),
            Err(e) => panic!(
                "credits {credits}: the awaited call: {e:?}; server {:?}, client {:?}",
                h.counters(),
                c.counters()
            ),
        }
        for (seq, f) in others {
            check_reply(&block_on(f).unwrap(), seq, 4100);
        }
        clean(&h, &c, &format!("credits {credits}, held answers"), 150 + u64::from(credits));
        drop(c);
        h.shutdown();
    }
}

/// The same mix through the tokio `Channel` (one dispatcher sleeping on completion events), 4
/// tasks each keeping its share of the credits in flight, at credits 1 and 32.
#[test]
fn channel_calls_of_every_shape_never_wait_for_a_ping() {
    use rpc_core::{Channel, ChannelConfig, PollingPolicy};
    for credits in [1u16, 32] {
        let h = server()
            .credits_per_session(credits)
            .peer_timeout(Some(PEER_TIMEOUT))
            .add_service(TestService::default())
            .spawn("127.0.0.1:0")
            .unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let client = client_config()
            .window(credits)
            .peer_timeout(Some(PEER_TIMEOUT))
            .polling(PollingPolicy::Event { spins: 0 });
        let config =
            ChannelConfig::default().client(client).dispatchers(1).spins(500).thread_name("units-chan");
        let addr = h.local_addr();
        let stats = rt.block_on(async move {
            let ch = Channel::connect_with(addr, &config).await.unwrap();
            let sizes = [4100usize, 200 << 10, 4100, 3 << 20, 5000, 130 << 10];
            let tasks: Vec<_> = (0..4u64)
                .map(|t| {
                    let ch = ch.clone();
                    tokio::spawn(async move {
                        let per = (u64::from(credits) / 4).max(1);
                        for round in 0..30u64 {
                            let calls: Vec<_> = (0..per)
                                .map(|i| {
                                    let seq = t * 1_000_000 + round * 100 + i;
                                    let reply = sizes[(seq as usize + round as usize) % sizes.len()];
                                    let call = ch.unary::<EchoMsg, EchoMsg>(
                                        ECHO,
                                        request(seq, 16, reply),
                                        &CallOptions::deadline(DEADLINE),
                                    );
                                    (seq, reply, call)
                                })
                                .collect();
                            for (seq, reply, call) in calls {
                                match call.await {
                                    Ok(r) => check_reply(&r, seq, reply),
                                    Err(e) => panic!("credits {credits}: call {seq} ({reply} B): {e:?}"),
                                }
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            ch.counters()
        });
        let want = 4 * 30 * (u64::from(credits) / 4).max(1);
        assert_eq!(stats.rpcs, want, "credits {credits}: {stats:?}");
        wait_until(
            "published counters",
            WAIT,
            || h.counters().rpcs >= want,
            || format!("{:?}", h.counters()),
        );
        let s = h.counters();
        // The channel is gone (its clean close may be counted): none was malformed nor metered.
        assert_eq!((s.malformed, s.metered), (0, 0), "credits {credits}: server {s:?}");
        drop(rt);
        h.shutdown();
    }
}
