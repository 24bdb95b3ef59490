//! Adversarial probes of the runtime (review): handlers that misuse deferral, hostile TCP peers,
//! admission limits and shutdown races. Everything on `sim` (or the transport under test) with a
//! yielding polling policy and one worker unless a probe needs two.

mod rpc_support;

use rpc_core::codegen::*;
use rpc_core::{Client, ServerHandle};
use rpc_support::*;

const HOSTILE: &str = "test.Hostile";
const DEFER_THEN_PANIC: MethodId = method_id("/test.Hostile/DeferThenPanic");
const DEFER_THEN_REPLY: MethodId = method_id("/test.Hostile/DeferThenReply");
const PING: MethodId = method_id("/test.Hostile/Ping");

/// Handlers that answer a call twice: they defer and then panic or answer directly too.
struct Hostile;

impl Service for Hostile {
    const NAME: &'static str = HOSTILE;
    const METHODS: &'static [MethodDesc] = &[
        MethodDesc { id: DEFER_THEN_PANIC, name: "/test.Hostile/DeferThenPanic" },
        MethodDesc { id: DEFER_THEN_REPLY, name: "/test.Hostile/DeferThenReply" },
        MethodDesc { id: PING, name: "/test.Hostile/Ping" },
    ];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: &[u8], out: &mut ReplyWriter<'_>) {
        let req = match decode::<EchoMsg>(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        match method {
            DEFER_THEN_PANIC => {
                let (_responder, _marker) = ctx.defer::<EchoMsg>();
                // The responder is dropped while unwinding: it answers too.
                panic!("handler panics after deferring (seq {})", req.seq);
            }
            DEFER_THEN_REPLY => {
                let (responder, _marker) = ctx.defer::<EchoMsg>();
                responder.send(Ok(EchoMsg { seq: req.seq + 1000, ..Default::default() }));
                out.reply(Reply::from(EchoMsg { seq: req.seq, ..Default::default() }));
            }
            _ => out.reply(Reply::from(EchoMsg { seq: req.seq, ..Default::default() })),
        }
    }
}

fn spawn_hostile() -> ServerHandle {
    server().add_service(Hostile).spawn("127.0.0.1:0").expect("server starts")
}

fn ping(client: &Client, seq: u64) -> Result<EchoMsg, Status> {
    client.unary::<_, EchoMsg>(PING, &EchoMsg { seq, ..Default::default() }, &CallOptions::default())
}

/// A call answered twice (a handler that defers and then panics; one that defers, sends through
/// the responder and also answers directly) gets one answer, and the session survives: before
/// the fix the second answer reached the client as a response for a call no longer on the wire,
/// and the client closed the session (every later call UNAVAILABLE).
#[test]
fn a_call_answered_twice_gets_one_answer_and_the_session_survives() {
    let server = spawn_hostile();
    let client = Client::connect_with(server.local_addr(), &client_config()).unwrap();

    let err = client
        .unary::<_, EchoMsg>(
            DEFER_THEN_PANIC,
            &EchoMsg { seq: 1, ..Default::default() },
            &CallOptions::default(),
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert!(err.message().contains("panicked"), "{err}");
    for seq in 0..20 {
        assert_eq!(ping(&client, seq).map(|r| r.seq), Ok(seq), "call {seq} after the double answer");
    }

    let r = client
        .unary::<_, EchoMsg>(
            DEFER_THEN_REPLY,
            &EchoMsg { seq: 7, ..Default::default() },
            &CallOptions::default(),
        )
        .unwrap();
    assert_eq!(r.seq, 7, "the first answer wins");
    for seq in 0..20 {
        assert_eq!(ping(&client, seq).map(|r| r.seq), Ok(seq), "call {seq} after the double answer");
    }
    assert_eq!(client.closed_reason(), None);
    assert_eq!(client.counters().malformed, 0);
    drop(client);
    server.shutdown();
}
