//! The worker's plain path (issue 29): a call with no request metadata, deadline or stream, on a
//! server with no interceptor and nothing observed, runs its handler with none of the general
//! path's checks. It must take no other call: a call with metadata (sent, or the session's cached
//! block) gets its metadata split off the body and shown to the handler, and a server's
//! interceptor refuses what it refuses, with no handler run.

mod rpc_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rpc_core::codegen::*;
use rpc_core::{CallOptions, Client, Metadata};
use rpc_support::*;

/// Answers `"{x-token}|{the request's payload}"`.
const SEEN: MethodId = method_id("/test.Plain/Seen");

#[derive(Default)]
struct Plain {
    /// Handlers run.
    ran: Arc<AtomicU64>,
}

impl Service for Plain {
    const NAME: &'static str = "test.Plain";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: SEEN, name: "/test.Plain/Seen" }];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        self.ran.fetch_add(1, Ordering::Relaxed);
        if method != SEEN {
            return out.error(Status::unimplemented("no such method"));
        }
        match decode::<EchoMsg>(body) {
            Ok(req) => {
                let token = ctx.metadata().get("x-token").unwrap_or("-");
                let payload = format!("{token}|{}", String::from_utf8_lossy(&req.payload)).into_bytes();
                out.reply(Reply::from(EchoMsg { payload, ..Default::default() }))
            }
            Err(s) => out.error(s),
        }
    }
}

fn seen(client: &Client, opts: &CallOptions) -> Result<String, Status> {
    let req = EchoMsg { payload: b"ping".to_vec(), ..Default::default() };
    client.unary::<_, EchoMsg>(SEEN, &req, opts).map(|r| String::from_utf8(r.payload).unwrap())
}

/// A call with metadata, sent with it and then named as the session's cached block, or a block
/// too large to cache sent every time, is answered by the general path: its handler sees the
/// entries and a body without the block. Plain calls around them see none.
#[test]
fn calls_with_metadata_sent_or_cached_are_not_plain() {
    let server = server().add_service(Plain::default()).spawn("127.0.0.1:0").expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    let none = CallOptions::default();
    let mut md = Metadata::new();
    md.insert("x-token", "t0k3n").unwrap();
    let with = CallOptions::default().with_metadata(md);
    // A block over the 1 KiB a session caches (`wire::MAX_CACHED_BLOCK`): sent whole every time.
    let mut big = Metadata::new();
    big.insert("x-token", "big").unwrap();
    big.insert_bin("pad-bin", &[7; 2000]).unwrap();
    let big = CallOptions::default().with_metadata(big);
    assert_eq!(seen(&client, &none).unwrap(), "-|ping");
    // The first call sends the block (stored by the session), the next ones name it (cached).
    for call in 0..3 {
        assert_eq!(seen(&client, &with).unwrap(), "t0k3n|ping", "call {call} with metadata");
        assert_eq!(seen(&client, &none).unwrap(), "-|ping", "the plain call after call {call}");
        assert_eq!(seen(&client, &big).unwrap(), "big|ping", "call {call} with an uncached block");
    }
    drop(client);
    server.shutdown();
}

/// On a server with an interceptor no call is plain: the interceptor refuses a call with no
/// metadata, deadline or stream, and no handler runs.
#[test]
fn an_interceptor_sees_every_call() {
    let svc = Plain::default();
    let ran = svc.ran.clone();
    let server = server()
        .interceptor(|info| match info.metadata().get("x-token") {
            Some(_) => Ok(()),
            None => Err(Status::unauthenticated("no token")),
        })
        .add_service(svc)
        .spawn("127.0.0.1:0")
        .expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config()).expect("client");
    for call in 0..3 {
        let e = seen(&client, &CallOptions::default()).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "call {call}: {e}");
    }
    assert_eq!(ran.load(Ordering::Relaxed), 0, "a refused call ran its handler");
    drop(client);
    server.shutdown();
}
