//! Unary calls on `sim`: sizes around every boundary (0 and 1 byte, eager threshold −1/0/+1,
//! 64 KiB, ring size −1, exactly the ring size, ring size +1 and several rings in pieces, one byte
//! over `max_message_size` refused), in both directions.

mod rpc_support;

use prost::Message;
use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

const EAGER: u32 = 1024;
const RING: u32 = 256 * 1024;

/// Protobuf overhead of an `EchoMsg` around a payload of `len` bytes (seq, checksum, tag, length).
fn overhead(seq: u64, len: usize, reply_len: usize) -> usize {
    request(seq, len, reply_len).encoded_len() - len
}

/// Payload size whose encoded request is exactly `body` bytes.
fn payload_for(seq: u64, body: usize, reply_len: usize) -> usize {
    let mut p = body.saturating_sub(overhead(seq, 0, reply_len));
    while request(seq, p, reply_len).encoded_len() > body && p > 0 {
        p -= 1;
    }
    while request(seq, p + 1, reply_len).encoded_len() <= body {
        p += 1;
    }
    p
}

fn setup() -> (rpc_core::ServerHandle, Client) {
    let (server, _) = spawn(server().eager_threshold(EAGER).ring_bytes(RING));
    let client =
        Client::connect_with(server.local_addr(), &client_config().eager_threshold(EAGER).ring_bytes(RING))
            .unwrap();
    (server, client)
}

#[test]
fn unary_echo_round_trip() {
    let (server, client) = setup();
    let r: EchoMsg = client.unary(ECHO, &request(7, 32, 32), &CallOptions::default()).unwrap();
    check_reply(&r, 7, 32);
    // The software NIC and rxe have type-2 memory windows: the client's ring is behind one.
    assert_eq!(client.counters().window_fallbacks, 0);
    let ctx: EchoMsg = client
        .unary(CONTEXT, &request(8, 0, 0), &CallOptions::deadline(std::time::Duration::from_secs(30)))
        .unwrap();
    assert_eq!(String::from_utf8(ctx.payload).unwrap(), "/test.Echo/Context|127.0.0.1|true");
    drop(client);
    // Counters are published by the idle worker; wait for the session's close to show.
    wait_until(
        "the server to publish the dropped client's session closed",
        WAIT,
        || server.counters().sessions_closed >= 1,
        || format!("server {:?}", server.counters()),
    );
    let c = server.counters();
    assert_eq!((c.sessions_opened, c.sessions_closed), (1, 1));
    assert_eq!(c.rpcs, 2);
    assert_eq!(c.with_code(Code::Ok), 2);
    server.shutdown();
}

#[test]
fn bodies_at_every_size_boundary_both_directions() {
    let (server, client) = setup();
    let e = EAGER as usize;
    let r = RING as usize;
    let mut seq = 0u64;
    // Empty and 1-byte bodies (an empty EchoMsg encodes to 0 bytes).
    let empty: EchoMsg = client.unary(ECHO, &EchoMsg::default(), &CallOptions::default()).unwrap();
    assert_eq!(empty, EchoMsg::default());
    assert_eq!(client.counters().bytes_in, 0, "an empty request got an empty response");
    // Protobuf has no valid 1-byte message: put exactly 1 raw byte on the wire instead.
    let one: EchoMsg = client.unary(RAW, &RawBytes(vec![0xa5]), &CallOptions::default()).unwrap();
    assert_eq!((one.seq, one.payload), (1, vec![0xa5]));
    for body in [2usize, e - 1, e, e + 1, 64 * 1024, r - 1, r] {
        seq += 1;
        // A request body of exactly `body` bytes.
        let raw = payload(seq, body);
        let rep: EchoMsg = client.unary(RAW, &RawBytes(raw.clone()), &CallOptions::default()).unwrap();
        assert_eq!((rep.seq, rep.checksum), (body as u64, fnv64(&raw)), "request of {body} bytes intact");
        // A protobuf request around `body` bytes with a small reply.
        if body >= 32 {
            let p = payload_for(seq, body, 8);
            let req = request(seq, p, 8);
            assert!(req.encoded_len() <= body && req.encoded_len() + 3 >= body, "request sized {body}");
            check_reply(&client.unary(ECHO, &req, &CallOptions::default()).unwrap(), seq, 8);
        }
        // A reply around `body` bytes (its encoding stays within the client's ring).
        seq += 1;
        let reply_len = body.saturating_sub(24);
        let rep: EchoMsg = client.unary(ECHO, &request(seq, 8, reply_len), &CallOptions::default()).unwrap();
        check_reply(&rep, seq, reply_len);
    }
    let c = client.counters();
    assert!(c.bytes_out > 2 * RING as u64, "ring-sized requests went out: {c:?}");
    drop(client);
    server.shutdown();
}

/// Largest message of the sessions of [`pieces_setup`].
const MAX: u32 = 4 * RING + 4096;

fn pieces_setup() -> (rpc_core::ServerHandle, Client) {
    let (server, _) = spawn(server().eager_threshold(EAGER).ring_bytes(RING).max_message_size(MAX));
    let cfg = client_config().eager_threshold(EAGER).ring_bytes(RING).max_message_size(MAX);
    let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
    (server, client)
}

#[test]
fn bodies_larger_than_the_ring_travel_in_pieces_both_ways_many_in_flight() {
    let (server, client) = pieces_setup();
    let r = RING as usize;
    let sizes = [r - 1, r, r + 1, 3 * r + 7, 0, 2 * r, r / 2 + 3];
    // Requests: several of every size in flight at once, each checked byte for byte (the server
    // answers with the checksum of exactly the bytes it got).
    let raws: Vec<Vec<u8>> =
        sizes.iter().cycle().take(3 * sizes.len()).enumerate().map(|(i, &n)| payload(i as u64, n)).collect();
    let calls: Vec<_> = raws
        .iter()
        .map(|raw| client.unary_async::<_, EchoMsg>(RAW, &RawBytes(raw.clone()), &CallOptions::default()))
        .collect();
    for (raw, call) in raws.iter().zip(calls) {
        let rep = block_on(call).unwrap();
        assert_eq!(
            (rep.seq, rep.checksum),
            (raw.len() as u64, fnv64(raw)),
            "request of {} bytes intact",
            raw.len()
        );
    }
    // Responses of the same sizes, in flight together and taken in reverse order.
    let calls: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (
                i as u64,
                n,
                client.unary_async::<_, EchoMsg>(ECHO, &request(i as u64, 8, n), &CallOptions::default()),
            )
        })
        .collect();
    for (seq, n, call) in calls.into_iter().rev() {
        check_reply(&block_on(call).unwrap(), seq, n);
    }
    // The largest message the limit allows, both ways at once.
    let p = payload_for(99, MAX as usize, MAX as usize - 64);
    let rep: EchoMsg =
        client.unary(ECHO, &request(99, p, MAX as usize - 64), &CallOptions::default()).unwrap();
    check_reply(&rep, 99, MAX as usize - 64);
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
    drop(client);
    server.shutdown();
}

#[test]
fn one_byte_over_max_message_size_is_refused_before_sending() {
    let (server, client) = pieces_setup();
    let req = RawBytes(vec![7; MAX as usize + 1]);
    let before = client.counters().bytes_out;
    let err = client.unary::<_, EchoMsg>(RAW, &req, &CallOptions::default()).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(
        err.message(),
        format!("message of {} bytes exceeds max_message_size of {MAX} bytes", MAX + 1)
    );
    assert_eq!(client.counters().bytes_out, before, "nothing was sent");
    // Exactly the limit goes.
    let raw = payload(1, MAX as usize);
    let rep: EchoMsg = client.unary(RAW, &RawBytes(raw.clone()), &CallOptions::default()).unwrap();
    assert_eq!((rep.seq, rep.checksum), (MAX as u64, fnv64(&raw)));
    // A response over the limit is refused by the server the same way.
    let err = client
        .unary::<_, EchoMsg>(ECHO, &request(2, 4, MAX as usize + 1), &CallOptions::default())
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains(&format!("exceeds max_message_size of {MAX} bytes")), "{}", err.message());
    // The session still works.
    let r: EchoMsg = client.unary(ECHO, &request(3, 100, 100), &CallOptions::default()).unwrap();
    check_reply(&r, 3, 100);
    drop(client);
    server.shutdown();
}

#[test]
fn eager_threshold_zero_sends_every_nonempty_body_through_the_ring() {
    let (server, _) = spawn(server().eager_threshold(0).ring_bytes(64 << 10));
    let client =
        Client::connect_with(server.local_addr(), &client_config().eager_threshold(0).ring_bytes(64 << 10))
            .unwrap();
    for seq in 0..200u64 {
        let len = (seq as usize * 37) % 1500;
        let r: EchoMsg = client.unary(ECHO, &request(seq, len, len / 2), &CallOptions::default()).unwrap();
        check_reply(&r, seq, len / 2);
    }
    drop(client);
    server.shutdown();
}
