//! What calls waiting for a slot cost the client's heap. Own test binary: a counting global
//! allocator sees every allocation of the process, so nothing else may run here.
//!
//! A call that finds no free slot waits in the client's call queue, encoded. Its large `bytes`
//! fields (`bytes::Bytes`) are referenced there, not copied: they are copied once, into registered
//! memory, when the call gets its slot. (Before, the queue encoded every waiting body onto the
//! heap, so each of its bytes was copied twice before its WRITE, and each body over 64 KiB was a
//! fresh allocation of its whole length.)
mod rpc_support;

use bytes::Bytes;
use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// Counts the process's live heap bytes (`live_bytes`).
#[global_allocator]
static A: Counting = Counting;

/// `EchoMsg`'s wire shape with its payload a shared `Bytes` (as codegen makes `bytes` fields).
#[derive(Clone, PartialEq, prost::Message)]
struct SharedEcho {
    #[prost(uint64, tag = "1")]
    seq: u64,
    #[prost(bytes = "bytes", tag = "2")]
    payload: Bytes,
    #[prost(uint64, tag = "3")]
    checksum: u64,
}

#[test]
fn waiting_calls_reference_their_large_bytes_fields_and_send_them_byte_for_byte() {
    const WINDOW: u16 = 2;
    const WAITING: u64 = 16;
    const LEN: usize = 1 << 20;
    let (server, stash) = spawn(server().credits_per_session(WINDOW));
    let client = Client::connect_with(server.local_addr(), &client_config().window(WINDOW)).unwrap();
    let opts = CallOptions::default();
    // The window's calls are held at the server, so every later call waits for a slot.
    let held: Vec<_> = (0..u64::from(WINDOW))
        .map(|i| client.unary_async::<_, EchoMsg>(STASH, &request(i, 8, 0), &opts))
        .collect();
    wait_stashed("the window's calls to reach the server", usize::from(WINDOW), &stash, &client, &server);

    let payload = Bytes::from(payload(7, LEN));
    let sum = fnv64(&payload);
    let before = live_bytes();
    let waiting: Vec<_> = (0..WAITING)
        .map(|seq| {
            let req = SharedEcho { seq, payload: payload.clone(), checksum: sum };
            client.unary_async::<_, EchoMsg>(ECHO, &req, &opts)
        })
        .collect();
    let grew = live_bytes() - before;
    // The tags, lengths and scalars of each body, and the queue's bookkeeping: a few KiB in all,
    // against 16 MiB when each waiting body was a heap copy of its payload.
    assert!(grew < (LEN / 2) as isize, "{WAITING} waiting calls of {LEN} bytes took {grew} bytes of heap");

    for r in stash.lock().unwrap().drain(..) {
        r.send(Ok(EchoMsg { seq: 99, ..Default::default() }));
    }
    for f in held {
        assert_eq!(block_on(f).expect("a held call, answered").seq, 99);
    }
    // The echo checks each payload against its checksum (DATA_LOSS on a mismatch): every
    // waiting body arrived byte for byte.
    for (seq, f) in waiting.into_iter().enumerate() {
        let r = block_on(f).expect("a waiting call, sent once a slot freed, its payload intact");
        assert_eq!(r.seq, seq as u64);
    }
    assert_eq!(rpc_core::buffers::leaked_tokens(), 0);
}
