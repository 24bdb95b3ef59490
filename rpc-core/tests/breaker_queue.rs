//! Adversarial probes of the client's call queue (review of "client queue: ... GatherBody"): calls
//! that wait for a slot keep their body as a `GatherBody` (large `Bytes` fields referenced) and are
//! written whole when they start (`Gathered`, `GatherBody::put_into`). Every body goes to the
//! test service's RAW method, which answers with the length and FNV-1a of the bytes it received:
//! what arrives is checked byte for byte against prost's own encoding.

mod rpc_support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{BufMut, Bytes};
use prost::Message;
use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// Server ring (so the client's staging area is twice this) and eager threshold of these probes.
const RING: u32 = 64 << 10;
const EAGER: u32 = 256;
const WINDOW: u16 = 2;

#[derive(Clone, PartialEq, prost::Message)]
struct Inner {
    #[prost(bytes = "bytes", tag = "1")]
    blob: Bytes,
    #[prost(string, tag = "2")]
    name: String,
}

/// Every kind of field a body can hold: shared `Bytes` (single, repeated, nested), `Vec<u8>`,
/// strings and scalars.
#[derive(Clone, PartialEq, prost::Message)]
struct Mixed {
    #[prost(uint64, tag = "1")]
    seq: u64,
    #[prost(bytes = "bytes", tag = "2")]
    big: Bytes,
    #[prost(bytes = "bytes", repeated, tag = "3")]
    many: Vec<Bytes>,
    #[prost(message, optional, tag = "4")]
    inner: Option<Inner>,
    #[prost(bytes = "vec", tag = "5")]
    vec: Vec<u8>,
    #[prost(string, tag = "6")]
    text: String,
    #[prost(message, repeated, tag = "7")]
    inners: Vec<Inner>,
}

/// A hand-written message whose `encoded_len` is `claim` while `encode_raw` writes `own` (with
/// `put_slice`) and then `shared` (with `put`, as prost writes a `Bytes` field).
#[derive(Clone, Debug, Default, PartialEq)]
struct Liar {
    claim: usize,
    own: Vec<u8>,
    shared: Bytes,
}

impl Liar {
    fn written(&self) -> Vec<u8> {
        let mut v = self.own.clone();
        v.extend_from_slice(&self.shared);
        v
    }
}

impl prost::Message for Liar {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.own);
        if !self.shared.is_empty() {
            buf.put(self.shared.clone());
        }
    }
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }
    fn encoded_len(&self) -> usize {
        self.claim
    }
    fn clear(&mut self) {}
}

fn blob(seq: u64, len: usize) -> Bytes {
    Bytes::from(payload(seq, len))
}

/// A `Mixed` whose encoding is exactly `len` bytes (0: the empty message; at least 2 otherwise),
/// its filler a shared `Bytes` when `len` allows one of at least 4096 bytes, else a string.
fn exact(seq: u64, len: usize) -> Mixed {
    if len == 0 {
        return Mixed::default();
    }
    // A seq varint of 0, 1 or 2 bytes (plus its tag) lets every length be hit exactly.
    for s in [0, seq % 100 + 1, 200 + seq] {
        let base = Mixed { seq: s, ..Default::default() };
        let fixed = base.encoded_len();
        for n in len.saturating_sub(fixed + 6)..=len.saturating_sub(fixed) {
            let mut m = base.clone();
            if n >= 4096 {
                m.big = blob(seq, n);
            } else {
                m.text = "t".repeat(n);
            }
            if m.encoded_len() == len {
                return m;
            }
        }
    }
    panic!("no message of {len} bytes")
}

/// A body of many shared fields of every shape: `big` `Bytes`, repeated, nested, plus a large
/// `Vec<u8>` and strings (about `scale` times 4 KiB).
fn many_fields(seq: u64, scale: usize) -> Mixed {
    Mixed {
        seq,
        big: blob(seq, 4096 * scale),
        many: (0..scale as u64)
            .map(|i| blob(seq * 100 + i, if i % 2 == 0 { 4096 } else { 4095 + i as usize * 7 }))
            .collect(),
        inner: Some(Inner { blob: blob(seq + 1, 5000), name: "inner".into() }),
        vec: payload(seq + 2, 4096 + scale),
        text: "é".repeat(300),
        inners: (0..scale as u64)
            .map(|i| Inner { blob: blob(seq * 1000 + i, 4096 + 13 * i as usize), name: format!("n{i}") })
            .collect(),
    }
}

/// The caller's `Bytes` of a message (to check they are released).
fn shared_of(m: &Mixed) -> Vec<Bytes> {
    let mut v = vec![m.big.clone()];
    v.extend(m.many.iter().cloned());
    v.extend(m.inner.iter().map(|i| i.blob.clone()));
    v.extend(m.inners.iter().map(|i| i.blob.clone()));
    v.retain(|b| !b.is_empty());
    v
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

type Stash = std::sync::Arc<std::sync::Mutex<Vec<Responder<EchoMsg>>>>;

/// A server with a small ring and eager threshold, and a client of window [`WINDOW`] (`cfg`).
fn setup(cfg: rpc_core::ClientConfig) -> (rpc_core::ServerHandle, Stash, Client) {
    let (server, stash) = spawn(server().ring_bytes(RING).eager_threshold(EAGER).credits_per_session(WINDOW));
    let cfg = cfg.window(WINDOW).ring_bytes(RING).eager_threshold(EAGER);
    let client = Client::connect_with(server.local_addr(), &cfg).unwrap();
    (server, stash, client)
}

/// Holds the client's window full with STASH calls (every later call waits in the queue).
fn hold<'a>(
    client: &'a Client,
    stash: &Stash,
    server: &rpc_core::ServerHandle,
) -> Vec<rpc_core::ResponseFuture<'a, EchoMsg>> {
    let opts = CallOptions::default();
    let futs: Vec<_> = (0..u64::from(WINDOW))
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &opts))
        .collect();
    wait_stashed("the window's calls to be held", usize::from(WINDOW), stash, client, server);
    futs
}

/// Answers the held calls, freeing the window.
fn release(stash: &Stash, held: Vec<rpc_core::ResponseFuture<'_, EchoMsg>>) {
    for r in stash.lock().unwrap().drain(..) {
        r.send(Ok(EchoMsg { seq: 99, ..Default::default() }));
    }
    for f in held {
        assert_eq!(block_on(f).expect("a held call, answered").seq, 99);
    }
}

/// Checks an answer of RAW to `sent` (its encoding byte for byte).
#[track_caller]
fn check_raw(r: Result<EchoMsg, Status>, sent: &[u8], what: &str) {
    let r = r.unwrap_or_else(|e| panic!("{what}: {e:?}"));
    assert_eq!(r.seq, sent.len() as u64, "{what}: length received");
    assert_eq!(r.checksum, fnv64(sent), "{what}: bytes received");
}

/// Waiting calls of every size boundary and field shape arrive byte for byte and release their `Bytes`.
#[test]
fn waiting_calls_of_every_size_and_shape_arrive_byte_for_byte_and_release_their_bytes() {
    let (server, stash, client) = setup(client_config());
    let held = hold(&client, &stash, &server);
    let staging = 2 * RING as usize;
    let sizes = [
        0,
        2,
        100,
        EAGER as usize - 1,
        EAGER as usize,
        EAGER as usize + 1,
        4095,
        4096,
        4100,
        5000,
        10_000,
        RING as usize - 100,
        RING as usize,
        RING as usize + 1,
        staging - 1,
        staging,
        staging + 1,
        3 * RING as usize + 17,
        100_000,
    ];
    let mut msgs: Vec<Mixed> = sizes.iter().enumerate().map(|(i, &n)| exact(i as u64 + 10, n)).collect();
    for (i, scale) in [1usize, 3, 9, 20].into_iter().enumerate() {
        msgs.push(many_fields(100 + i as u64, scale));
    }
    // A shared field of exactly the referencing threshold, and one just under it.
    msgs.push(Mixed { seq: 200, big: blob(200, 4096), ..Default::default() });
    msgs.push(Mixed { seq: 201, big: blob(201, 4095), ..Default::default() });
    // The same caller `Bytes` in several waiting calls and several fields at once.
    let same = blob(300, 20_000);
    let pair = msgs.len();
    msgs.push(Mixed { seq: 300, big: same.clone(), many: vec![same.clone(); 3], ..Default::default() });
    msgs.push(Mixed { seq: 301, big: same.slice(5..), ..Default::default() });
    drop(same);

    let opts = CallOptions::default();
    let futs: Vec<_> = msgs.iter().map(|m| client.unary_async::<_, EchoMsg>(RAW, m, &opts)).collect();
    assert_eq!(client.queued_calls(), msgs.len(), "every call waits for a slot");
    let wants: Vec<(Vec<u8>, Vec<Bytes>)> = msgs.iter().map(|m| (m.encode_to_vec(), shared_of(m))).collect();
    drop(msgs);
    release(&stash, held);
    for (i, (f, (want, shared))) in futs.into_iter().zip(wants).enumerate() {
        check_raw(block_on(f), &want, &format!("waiting call {i} of {} bytes", want.len()));
        // Completed: the call holds none of the caller's memory any more. (The pair shares
        // `same`: checked once both completed, by the later.)
        if i != pair {
            for b in &shared {
                assert!(b.is_unique(), "call {i}: a shared field of {} bytes is still referenced", b.len());
            }
        }
    }
    assert_eq!(client.closed_reason(), None);
    // Some waiting bodies found the server's ring full: they went through the staging area or
    // the heap, not only the mirror.
    assert!(client.counters().ring_full_stalls > 0, "{:?}", client.counters());
    drop(client);
    server.shutdown();
}

/// Waiting calls whose `encoded_len` lies fail INTERNAL naming it (or are refused over
/// `max_message_size`), never panic, never send, and release what they hold.
#[test]
fn waiting_calls_whose_encoded_len_lies_end_cleanly() {
    let (server, stash, client) = setup(client_config().max_message_size(200_000));
    let held = hold(&client, &stash, &server);
    let staging = 2 * RING as usize;
    let liars = vec![
        // Claims more than written.
        Liar { claim: 10, own: vec![], shared: Bytes::new() },
        Liar { claim: 200, own: vec![7; 100], shared: Bytes::new() },
        Liar { claim: 9_000, own: vec![7; 300], shared: Bytes::new() },
        Liar { claim: 9_000, own: vec![7; 10], shared: blob(1, 5000) },
        Liar { claim: staging + 500, own: vec![7; 10], shared: blob(2, 10_000) },
        // Claims fewer than written.
        Liar { claim: 0, own: vec![8; 20], shared: Bytes::new() },
        Liar { claim: 100, own: vec![8; 300], shared: Bytes::new() },
        Liar { claim: 100, own: vec![8; 10], shared: blob(3, 8000) },
        Liar { claim: 300, own: vec![8; 10], shared: blob(4, RING as usize + 1000) },
        Liar { claim: 1000, own: vec![8; 10], shared: blob(5, staging + 1000) },
        // Past `max_message_size` though it claims to fit.
        Liar { claim: 100, own: vec![9; 10], shared: blob(6, 300_000) },
    ];
    let opts = CallOptions::default();
    let futs: Vec<_> = liars.iter().map(|m| client.unary_async::<_, EchoMsg>(RAW, m, &opts)).collect();
    release(&stash, held);
    for (i, (f, m)) in futs.into_iter().zip(&liars).enumerate() {
        let written = m.written();
        match block_on(f) {
            Ok(r) => panic!("liar {i} (claims {}, writes {}) was sent: {r:?}", m.claim, written.len()),
            Err(e) => {
                assert_eq!(e.code(), Code::Internal, "liar {i}: {e:?}");
                assert!(e.message().contains("encoded_len"), "liar {i}: {e:?}");
            }
        }
        if written.len() > 200_000 {
            continue;
        }
        if !m.shared.is_empty() {
            assert!(m.shared.is_unique(), "liar {i}: its shared field is still referenced");
        }
    }
    // The session still works, byte for byte.
    let m = many_fields(7, 5);
    check_raw(client.unary(RAW, &m, &opts), &m.encode_to_vec(), "a call after the liars");
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

/// Waiting calls dropped by their callers release their `Bytes` at once; the kept ones arrive whole.
#[test]
fn abandoned_waiting_calls_release_their_bytes_and_the_rest_arrive() {
    let (server, stash, client) = setup(client_config());
    let held = hold(&client, &stash, &server);
    let opts = CallOptions::default();
    let msgs: Vec<Mixed> = (0..8).map(|i| many_fields(i, 1 + i as usize * 2)).collect();
    let mut futs: Vec<_> =
        msgs.iter().map(|m| Some(client.unary_async::<_, EchoMsg>(RAW, m, &opts))).collect();
    let wants: Vec<_> = msgs.iter().map(|m| (m.encode_to_vec(), shared_of(m))).collect();
    drop(msgs);
    for (i, f) in futs.iter_mut().enumerate() {
        if i % 2 == 0 {
            drop(f.take());
            for b in &wants[i].1 {
                assert!(b.is_unique(), "abandoned call {i}: a shared field is still referenced");
            }
        }
    }
    assert_eq!(client.queued_calls(), 4);
    release(&stash, held);
    for (i, f) in futs.into_iter().enumerate() {
        let Some(f) = f else { continue };
        check_raw(block_on(f), &wants[i].0, &format!("kept call {i}"));
        for b in &wants[i].1 {
            assert!(b.is_unique(), "kept call {i}: a shared field is still referenced");
        }
    }
    assert_eq!(client.closed_reason(), None);
    drop(client);
    server.shutdown();
}

/// Waiting calls expiring in the queue end DEADLINE_EXCEEDED and release their `Bytes`; others arrive.
#[test]
fn waiting_calls_expiring_in_the_queue_release_their_bytes() {
    let (server, stash, client) = setup(client_config());
    let held = hold(&client, &stash, &server);
    let short = CallOptions::deadline(Duration::from_millis(30));
    let none = CallOptions::default();
    let msgs: Vec<Mixed> = (0..6).map(|i| many_fields(i, 2 + i as usize)).collect();
    let futs: Vec<_> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| client.unary_async::<_, EchoMsg>(RAW, m, if i % 2 == 0 { &short } else { &none }))
        .collect();
    let wants: Vec<_> = msgs.iter().map(|m| (m.encode_to_vec(), shared_of(m))).collect();
    drop(msgs);
    std::thread::sleep(Duration::from_millis(60));
    let mut futs: Vec<_> = futs.into_iter().map(Some).collect();
    for (i, f) in futs.iter_mut().enumerate() {
        if i % 2 == 0 {
            let Poll::Ready(r) = poll_once(f.as_mut().unwrap()) else {
                panic!("call {i} outlived its deadline")
            };
            assert_eq!(r.unwrap_err().code(), Code::DeadlineExceeded);
            drop(f.take());
            for b in &wants[i].1 {
                assert!(b.is_unique(), "expired call {i}: a shared field is still referenced");
            }
        }
    }
    release(&stash, held);
    for (i, f) in futs.into_iter().enumerate() {
        let Some(f) = f else { continue };
        check_raw(block_on(f), &wants[i].0, &format!("call {i} without a deadline"));
    }
    drop(client);
    server.shutdown();
}

/// Waiting calls on a session that breaks (server gone) end UNAVAILABLE and release their `Bytes`.
#[test]
fn waiting_calls_on_a_broken_session_end_unavailable_and_release_their_bytes() {
    let (server, stash, client) = setup(client_config());
    let held = hold(&client, &stash, &server);
    let opts = CallOptions::default();
    let msgs: Vec<Mixed> = (0..5).map(|i| many_fields(i, 1 + 4 * i as usize)).collect();
    let futs: Vec<_> = msgs.iter().map(|m| client.unary_async::<_, EchoMsg>(RAW, m, &opts)).collect();
    let shared: Vec<Vec<Bytes>> = msgs.iter().map(shared_of).collect();
    drop(msgs);
    server.shutdown();
    for f in held {
        // Answered by the draining server or failed by the break: either, without a panic.
        let _ = block_on(f);
    }
    for (i, f) in futs.into_iter().enumerate() {
        let e = block_on(f).expect_err("a call waiting on a broken session");
        assert_eq!(e.code(), Code::Unavailable, "call {i}: {e:?}");
        for b in &shared[i] {
            assert!(b.is_unique(), "call {i} on a broken session: a shared field is still referenced");
        }
    }
    assert!(client.closed_reason().is_some());
}

/// A started (not waiting) call whose `encode_raw` writes more than its `encoded_len` gave, into
/// the send buffer, the server's ring or the staging area, fails INTERNAL naming the
/// cause, takes nothing with it, and the session serves on. (Before, `&mut [u8]`'s `BufMut`
/// panicked in the caller's thread and the send buffer taken for the call leaked.)
#[test]
fn a_started_call_writing_more_than_its_encoded_len_fails_internal() {
    let (server, _stash, client) = setup(client_config());
    let opts = CallOptions::default();
    let liars = [
        Liar { claim: 100, own: vec![8; 300], shared: Bytes::new() },
        Liar { claim: 100, own: vec![8; 10], shared: blob(3, 8000) },
        Liar { claim: 1000, own: vec![8; 10], shared: blob(5, 2 * RING as usize + 1000) },
        Liar { claim: 4 * RING as usize, own: vec![8; 10], shared: blob(6, 5 * RING as usize) },
    ];
    for round in 0..3 {
        for (i, m) in liars.iter().enumerate() {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                client.unary::<_, EchoMsg>(RAW, m, &opts)
            }));
            let Ok(r) = r else {
                panic!("liar {i} (claims {}, writes {}) panicked the client", m.claim, m.written().len())
            };
            match r {
                Err(e) if e.code() == Code::Internal => {
                    assert!(e.message().contains("encoded_len"), "round {round}, liar {i}: {e:?}")
                }
                // A body larger than the staging area is encoded onto the heap, which grows: its
                // length is checked all the same.
                r => panic!("round {round}, liar {i}: {r:?}"),
            }
        }
        let m = Liar { claim: 10, own: vec![1; 10], shared: Bytes::new() };
        let r = client.unary::<_, EchoMsg>(RAW, &m, &opts).expect("an honest call after the liars");
        assert_eq!(r.seq, 10);
    }
    assert!(client.closed_reason().is_none(), "{:?}", client.closed_reason());
    drop(client);
    server.shutdown();
}
