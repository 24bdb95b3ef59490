//! Server streams end to end on sim: messages of any size byte for byte, backpressure (a client
//! that stops taking messages stalls the server's producer at the credit limit), cancellation
//! from either end, the deadline of the whole stream, a clean end distinct from an error, and a
//! server that goes away mid-stream.

mod rpc_support;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::{CallOptions, Client, ServerHandle};
use rpc_support::*;

const LIST: MethodId = method_id("/test.Stream/List");

/// What the client asks for.
#[derive(Clone, PartialEq, prost::Message)]
struct ListReq {
    /// Messages to send (u64::MAX: until cancelled).
    #[prost(uint64, tag = "1")]
    count: u64,
    /// Payload bytes per message.
    #[prost(uint32, tag = "2")]
    size: u32,
    /// End with ABORTED instead of OK.
    #[prost(bool, tag = "3")]
    fail: bool,
}

/// What the producer saw.
#[derive(Default)]
struct Probe {
    /// Messages `send` accepted.
    sent: AtomicU64,
    /// `send` failed: the stream was cancelled.
    cancelled: AtomicBool,
    /// The producer thread ended.
    done: AtomicBool,
}

struct StreamService {
    probe: Arc<Probe>,
}

impl Service for StreamService {
    const NAME: &'static str = "test.Stream";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: LIST, name: "/test.Stream/List" }];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        if method != LIST {
            return out.error(Status::unimplemented("no such method"));
        }
        let req: ListReq = match decode(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        let (sink, reply) = ctx.stream::<EchoMsg>();
        let probe = self.probe.clone();
        std::thread::spawn(move || {
            let mut seq = 0;
            while seq < req.count {
                let p = payload(seq, req.size as usize);
                if sink.send(&EchoMsg { seq, checksum: 0, payload: p, reply_len: 0 }).is_err() {
                    probe.cancelled.store(true, Ordering::Release);
                    break;
                }
                probe.sent.fetch_add(1, Ordering::AcqRel);
                seq += 1;
            }
            if req.fail {
                sink.finish(Err(Status::new(Code::Aborted, "the producer gave up")));
            }
            probe.done.store(true, Ordering::Release);
        });
        out.reply(reply);
    }
}

fn start() -> (ServerHandle, Arc<Probe>, Client) {
    let probe = Arc::new(Probe::default());
    let h = server().add_service(StreamService { probe: probe.clone() }).spawn("127.0.0.1:0").unwrap();
    let c = Client::connect_with(h.local_addr(), &client_config()).unwrap();
    (h, probe, c)
}

/// [`wait_until`] `f`, reporting the producer's probe and the counters of both ends.
#[track_caller]
fn until(what: &str, h: &ServerHandle, probe: &Probe, c: &Client, f: impl FnMut() -> bool) {
    let state = || {
        format!(
            "producer sent {}, cancelled {}, done {}; server {:?}, client {:?}",
            probe.sent.load(Ordering::Acquire),
            probe.cancelled.load(Ordering::Acquire),
            probe.done.load(Ordering::Acquire),
            h.counters(),
            c.counters()
        )
    };
    wait_until(what, WAIT, f, state);
}

fn read_all(c: &Client, count: u64, size: u32) {
    let mut s = c
        .server_stream::<_, EchoMsg>(LIST, &ListReq { count, size, fail: false }, &CallOptions::default())
        .unwrap();
    for seq in 0..count {
        let m = s.message().unwrap().unwrap_or_else(|| panic!("stream ended at {seq} of {count}"));
        assert_eq!(m.seq, seq);
        assert!(m.payload == payload(seq, size as usize), "message {seq} differs");
    }
    assert_eq!(s.message().unwrap(), None, "a clean end after the last message");
    assert_eq!(s.message().unwrap(), None);
}

#[test]
fn many_64_kib_messages_arrive_byte_for_byte() {
    let (_h, _probe, c) = start();
    read_all(&c, 256, 64 << 10);
    read_all(&c, 2000, 32);
}

#[test]
fn messages_larger_than_the_ring_arrive_byte_for_byte() {
    let (_h, _probe, c) = start();
    // 3 MiB each, three times the server's ring to us: each goes in pieces.
    read_all(&c, 3, 3 << 20);
}

#[test]
fn a_client_that_stops_taking_messages_stalls_the_producer_at_the_grant_limit() {
    let (_h, probe, c) = start();
    let mut s = c
        .server_stream::<_, EchoMsg>(
            LIST,
            &ListReq { count: 10_000, size: 32, fail: false },
            &CallOptions::default(),
        )
        .unwrap();
    assert_eq!(s.message().unwrap().unwrap().seq, 0);
    // The client keeps polling its CQ (messages arrive and are held) but takes none.
    let mut last = u64::MAX;
    let mut stable_since = Instant::now();
    let give_up = Instant::now() + WAIT;
    loop {
        c.progress();
        let now = probe.sent.load(Ordering::Acquire);
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if stable_since.elapsed() > Duration::from_millis(300) {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the producer never stalled: it sent {now}; client {:?}",
            c.counters()
        );
        std::thread::yield_now();
    }
    // Sent = taken (1) + held or granted at the client (the stream's grants, 16 SENDs, each one
    // message or a batch of as many as fit an eager buffer of 4096 bytes: at least 34 bytes
    // each, plus a frame's length) + waiting in the sink (SINK_DEPTH); the producer blocks in
    // `send` for the next.
    let per_send = (4096 / (rpc_core::wire::FRAME_LEN as u64 + 34)).min(u64::from(rpc_core::wire::MAX_BATCH));
    let bound = 1 + 16 * per_send + SINK_DEPTH as u64;
    assert!(last <= bound, "the producer sent {last} messages, above the credit limit {bound}");
    assert!(last >= 16, "the producer sent only {last}: credits were not granted");
    assert!(!probe.done.load(Ordering::Acquire));
    // Taking messages lets it go on, to the end.
    for seq in 1..10_000 {
        assert_eq!(s.message().unwrap().unwrap().seq, seq);
    }
    assert_eq!(s.message().unwrap(), None);
}

#[test]
fn the_client_cancels_by_dropping_its_stream_and_the_producer_sees_it() {
    let (h, probe, c) = start();
    let mut s = c
        .server_stream::<_, EchoMsg>(
            LIST,
            &ListReq { count: u64::MAX, size: 100, fail: false },
            &CallOptions::default(),
        )
        .unwrap();
    for seq in 0..5 {
        assert_eq!(s.message().unwrap().unwrap().seq, seq);
    }
    drop(s);
    until("the producer's send to fail", &h, &probe, &c, || {
        c.progress();
        probe.cancelled.load(Ordering::Acquire)
    });
    // The slot and the credits came back: the same client streams again.
    read_all(&c, 100, 10);
}

#[test]
fn the_server_ends_a_stream_with_an_error_distinct_from_a_clean_end() {
    let (_h, _probe, c) = start();
    let mut s = c
        .server_stream::<_, EchoMsg>(
            LIST,
            &ListReq { count: 5, size: 8, fail: true },
            &CallOptions::default(),
        )
        .unwrap();
    for seq in 0..5 {
        assert_eq!(s.message().unwrap().unwrap().seq, seq, "messages before the error arrive");
    }
    let e = s.message().unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    assert_eq!(e.message(), "the producer gave up");
    assert_eq!(s.message().unwrap(), None);
    read_all(&c, 5, 8);
}

/// Each end enforces the stream's deadline on its own (either alone used to pass this test: the
/// server's DEADLINE_EXCEEDED ended the client's stream too, and the client's Cancel ended the
/// producer's).
///
/// The server's end: the client takes one message, then only progresses its session and never
/// asks the stream for more, so its own deadline is never looked at and it sends no Cancel: the
/// server's timer alone ends the endless stream, and the producer sees it.
///
/// The client's end: once the stream flows, a second client's [`HOLD`] keeps the server's one
/// worker busy, so the server neither sends nor looks at its timers: the client ends the stream
/// at the deadline itself, with its own status. Once the worker is let go the producer sees the
/// end too (the client's Cancel, or the server's expiry).
#[test]
fn the_deadline_ends_the_whole_stream_at_both_ends() {
    let endless = ListReq { count: u64::MAX, size: 16, fail: false };
    {
        let (h, probe, c) = start();
        let opts = CallOptions::deadline(Duration::from_millis(300));
        let mut s = c.server_stream::<_, EchoMsg>(LIST, &endless, &opts).unwrap();
        assert_eq!(s.message().unwrap().unwrap().seq, 0);
        until("the server's timer to end the stream the client does not read", &h, &probe, &c, || {
            c.progress();
            probe.cancelled.load(Ordering::Acquire)
        });
        // What arrived before the end, then the server's DEADLINE_EXCEEDED.
        let e = wait_for(
            "the stream the server ended to end at the client",
            WAIT,
            || match s.message() {
                Ok(Some(_)) => None,
                Ok(None) => panic!("an endless stream ended cleanly"),
                Err(e) => Some(e),
            },
            || format!("client {:?}", c.counters()),
        );
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    }
    // The hold must begin before the deadline passes, or the server may end the stream first:
    // on a machine too loaded for that, the round is repeated with a longer deadline.
    for deadline in [Duration::from_millis(300), Duration::from_secs(2), Duration::from_secs(10)] {
        let probe = Arc::new(Probe::default());
        let (hold, gate) = Hold::new();
        let h = server()
            .add_service(StreamService { probe: probe.clone() })
            .add_service(hold)
            .spawn("127.0.0.1:0")
            .unwrap();
        // No idle probe: it would find the held server silent and end the stream UNAVAILABLE.
        let c = Client::connect_with(h.local_addr(), &client_config().peer_timeout(None)).unwrap();
        let holder = Client::connect_with(h.local_addr(), &client_config()).unwrap();
        let t0 = Instant::now();
        let mut s = c.server_stream::<_, EchoMsg>(LIST, &endless, &CallOptions::deadline(deadline)).unwrap();
        assert_eq!(s.message().unwrap().unwrap().seq, 0);
        let mut held =
            Box::pin(holder.unary_async::<_, EchoMsg>(HOLD, &EchoMsg::default(), &CallOptions::default()));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        wait_until(
            "the worker to be held",
            WAIT,
            || {
                let _ = held.as_mut().poll(&mut cx);
                gate.entered()
            },
            || format!("server {:?}", h.counters()),
        );
        if t0.elapsed() >= deadline {
            eprintln!("the worker was held only after the {deadline:?} deadline: again, with a longer one");
            drop(gate);
            continue;
        }
        let mut n = 1u64;
        let e = wait_for(
            "the client to end the stream at its deadline while the server is held",
            WAIT,
            || match s.message() {
                Ok(Some(m)) => {
                    assert_eq!(m.seq, n);
                    n += 1;
                    None
                }
                Ok(None) => panic!("an endless stream ended cleanly"),
                Err(e) => Some(e),
            },
            || format!("producer sent {}; client {:?}", probe.sent.load(Ordering::Acquire), c.counters()),
        );
        assert_eq!(
            (e.code(), e.message()),
            (Code::DeadlineExceeded, "the stream's deadline passed before its end"),
            "the client's own status"
        );
        assert!(t0.elapsed() >= deadline, "ended after {:?}, before the {deadline:?} deadline", t0.elapsed());
        drop(gate);
        until("the producer to see the stream end", &h, &probe, &c, || {
            c.progress();
            let _ = held.as_mut().poll(&mut cx);
            probe.cancelled.load(Ordering::Acquire)
        });
        return;
    }
    panic!("the worker was never held before the stream's deadline (10 s)");
}

#[test]
fn a_server_that_goes_away_mid_stream_ends_it_unavailable() {
    let (h, _probe, c) = start();
    let mut s = c
        .server_stream::<_, EchoMsg>(
            LIST,
            &ListReq { count: u64::MAX, size: 16, fail: false },
            &CallOptions::default(),
        )
        .unwrap();
    assert_eq!(s.message().unwrap().unwrap().seq, 0);
    let stopper = std::thread::spawn(move || h.shutdown());
    // Bounded: a shutdown that never ends the stream would stream forever.
    let e = wait_for(
        "the server's shutdown to end the endless stream",
        WAIT,
        || match s.message() {
            Ok(Some(_)) => None,
            Ok(None) => panic!("a stream cut off ended cleanly"),
            Err(e) => Some(e),
        },
        || format!("client {:?}", c.counters()),
    );
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    stopper.join().unwrap();
}

/// Stream messages waiting on the server's heap for a client that does not read (its 64 KiB
/// ring stays full: the blocking client is not driven) are charged against
/// `max_backlog_bytes` as answers are: past it (1 MiB here) the session closes with a Close of
/// RESOURCE_EXHAUSTED naming the cap, and the stream ends with that status at the client.
///
/// Sabotage: the charge in `Worker::pump_streams` skipped: the session stayed open with the
/// messages waiting uncharged (the test failed waiting for `over_backlog_cap`).
#[test]
fn stream_messages_waiting_for_a_slow_reader_are_charged_to_max_backlog_bytes() {
    let probe = Arc::new(Probe::default());
    let h = server()
        .max_message_size(1 << 20)
        .max_backlog_bytes(1 << 20)
        .add_service(StreamService { probe: probe.clone() })
        .spawn("127.0.0.1:0")
        .unwrap();
    let c = Client::connect_with(h.local_addr(), &client_config().ring_bytes(64 << 10)).unwrap();
    let req = ListReq { count: 16, size: 300_000, fail: false };
    let mut s = c.server_stream::<_, EchoMsg>(LIST, &req, &CallOptions::default()).unwrap();
    // The client is not driven: nothing it holds in its ring is freed.
    until("the session closed over max_backlog_bytes", &h, &probe, &c, || h.counters().over_backlog_cap == 1);
    let e = loop {
        match s.message() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a clean end"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("ServerConfig::max_backlog_bytes"), "{e}");
    assert!(h.counters().backlog_peak <= 1 << 20, "{:?}", h.counters());
}
