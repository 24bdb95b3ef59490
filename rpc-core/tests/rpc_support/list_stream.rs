//! [`ListService`]: a server stream for the tests that need one beside the echo service (the
//! breakers of the client's buffers, of the send areas and of the shared receive side).

use std::time::Duration;

use rpc_core::codegen::*;

use super::{fnv64, payload, EchoMsg};

/// The stream's method.
pub const LIST: MethodId = method_id("/test.List/List");

/// What [`ListService`] streams back.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListReq {
    /// Messages.
    #[prost(uint64, tag = "1")]
    pub count: u64,
    /// Payload bytes of message `seq`: `size + (seq % 7) × step`.
    #[prost(uint32, tag = "2")]
    pub size: u32,
    /// Milliseconds the producer pauses before each message after the first.
    #[prost(uint32, tag = "3")]
    pub pause_ms: u32,
    /// See `size`.
    #[prost(uint32, tag = "4")]
    pub step: u32,
}

/// A server stream of [`ListReq::count`] [`EchoMsg`]s (sequence numbers from 0, checksummed
/// payloads), sent from a thread of its own as fast as the stream's grants allow.
pub struct ListService;

impl Service for ListService {
    const NAME: &'static str = "test.List";
    const METHODS: &'static [MethodDesc] = &[MethodDesc { id: LIST, name: "/test.List/List" }];

    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        if method != LIST {
            return out.error(Status::unimplemented("no such method"));
        }
        let req: ListReq = match decode(body) {
            Ok(r) => r,
            Err(s) => return out.error(s),
        };
        let (sink, reply) = ctx.stream::<EchoMsg>();
        std::thread::spawn(move || {
            for seq in 0..req.count {
                if seq > 0 && req.pause_ms > 0 {
                    std::thread::sleep(Duration::from_millis(u64::from(req.pause_ms)));
                }
                let p = payload(seq, req.size as usize + (seq % 7) as usize * req.step as usize);
                if sink.send(&EchoMsg { seq, checksum: fnv64(&p), payload: p, reply_len: 0 }).is_err() {
                    break;
                }
            }
        });
        out.reply(reply);
    }
}
