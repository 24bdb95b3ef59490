//! Breaker review of protocol 11 (the metadata block cache): what a session's cached block costs
//! the server's heap. `wire::MAX_CACHED_BLOCK` promises at most 1 KiB per session. Own test
//! binary: a counting global allocator sees every allocation of the process (the in-process
//! server's included), so nothing else may run here.
mod rpc_support;

use std::time::Duration;

use rpc_core::{CallOptions, Client, Metadata};
use rpc_support::*;

/// Counts the process's live heap bytes (`live_bytes`).
#[global_allocator]
static A: Counting = Counting;

/// Sessions per arm.
const N: usize = 16;

fn small(i: usize) -> CallOptions {
    let mut md = Metadata::new();
    md.insert("x-token", &format!("t{i}")).unwrap();
    CallOptions::default().with_metadata(md)
}

fn big() -> CallOptions {
    // Under the default `max_metadata_bytes` (8 KiB), over `MAX_CACHED_BLOCK`: never stored.
    let mut md = Metadata::new();
    md.insert_bin("blob-bin", &[7; 7900]).unwrap();
    CallOptions::default().with_metadata(md)
}

/// `N` sessions, each making a call with a body of about 8 KiB (the bytes in a large metadata
/// block when `big_block`, else in the message) then one with a small block (stored as the
/// session's cached one); the client keeps them open. The heap bytes they added.
fn arm(server: &rpc_core::ServerHandle, keep: &mut Vec<Client>, big_block: bool) -> isize {
    std::thread::sleep(Duration::from_millis(300));
    let before = live_bytes();
    for i in 0..N {
        let c = Client::connect_with(server.local_addr(), &client_config()).unwrap();
        let first: EchoMsg = if big_block {
            c.unary(ECHO, &request(i as u64, 8, 8), &big()).unwrap()
        } else {
            c.unary(ECHO, &request(i as u64, 7919 + 8, 8), &CallOptions::default()).unwrap()
        };
        check_reply(&first, i as u64, 8);
        let r: EchoMsg = c.unary(ECHO, &request(i as u64, 8, 8), &small(i)).unwrap();
        check_reply(&r, i as u64, 8);
        keep.push(c);
    }
    std::thread::sleep(Duration::from_millis(300));
    live_bytes() - before
}

/// A session whose small block is stored right after a call with a large block (any session's,
/// on the same worker) keeps a block of its own size: the worker decodes a stored block into its
/// reused spare `Metadata`, whose buffer a large block before it grew (up to
/// `max_metadata_bytes`), so keeping that very buffer would let a client make each session hold
/// `max_metadata_bytes` of cached block, not `MAX_CACHED_BLOCK` (1 KiB). Compared with the same
/// bytes sent in the message instead (the same ring traffic, the same buffers kept per session).
#[test]
fn a_cached_block_holds_at_most_its_own_size() {
    let (server, _) = spawn(server().max_sessions(64));
    let mut keep = Vec::new();
    // Warm-up: the first sessions allocate what stays (pools, maps).
    let _ = arm(&server, &mut keep, false);
    let big_message = arm(&server, &mut keep, false);
    let big_block = arm(&server, &mut keep, true);
    eprintln!(
        "{N} sessions: a large message then a store grew the heap by {big_message} B, a large block then a \
         store by {big_block} B"
    );
    let extra = big_block - big_message;
    assert!(
        // Twice the cap per session: room for what the worker keeps once (its spare block).
        extra < (N * 2 * rpc_core::wire::MAX_CACHED_BLOCK) as isize,
        "a large block before the store cost {extra} B more over {N} sessions ({} B per session): each cached \
         block holds a large previous block's buffer",
        extra / N as isize
    );
    drop(keep);
    server.shutdown();
}
