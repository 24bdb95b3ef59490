//! The benchmark service with async handlers (`--handlers async`, `--handlers tokio`): the same
//! answers as [`crate::rpc::BenchService`], through the generated async server trait, so the
//! cost of async handlers is measured against inline ones on the same tests.
//!
//! `echo` never waits (its future completes at its first poll), as most small handlers; the
//! streaming methods wait for the client's messages and credits with `message_async` and
//! `send_async` instead of threads of their own.

use bytes::Bytes;
use rpc_core::codegen::{AsyncContext, RequestStream, Status, StreamSink};
use rpc_core::AsyncRuntime;

use crate::cli::MAX_SIZE;
use crate::rpc::pb::{EchoReply, EchoRequest, StreamRequest};

/// The generated async server of `package rpcperf` (its messages are [`crate::rpc::pb`]'s).
#[allow(missing_docs)]
pub mod apb {
    include!(concat!(env!("OUT_DIR"), "/async/rpcperf.rs"));
}

pub use apb::bench_server::BenchServer as AsyncBenchServer;

/// The benchmark service's async handlers (answers sliced from the static payload).
#[derive(Clone)]
pub struct AsyncBenchService {
    payload: Bytes,
}

impl Default for AsyncBenchService {
    fn default() -> Self {
        AsyncBenchService { payload: Bytes::from_static(crate::rpc::static_payload()) }
    }
}

impl AsyncBenchService {
    /// The adapter that serves it: handlers polled on the worker (`tokio` false, the runtime's
    /// default) or spawned on the runtime this library shares (`tokio` true, the opt-in).
    pub fn server(self, tokio: bool) -> AsyncBenchServer<AsyncBenchService> {
        if tokio {
            AsyncBenchServer::with_runtime(self, AsyncRuntime::current_or_default())
        } else {
            AsyncBenchServer::new(self)
        }
    }

    fn slice(&self, n: usize) -> Result<Bytes, Status> {
        if n > self.payload.len() {
            return Err(Status::invalid_argument(format!("size {n} is over the {MAX_SIZE}-byte limit")));
        }
        Ok(self.payload.slice(..n))
    }
}

impl apb::bench_server::Bench for AsyncBenchService {
    async fn echo(&self, _ctx: AsyncContext, req: EchoRequest) -> Result<EchoReply, Status> {
        Ok(EchoReply { payload: self.slice(req.resp_size as usize)? })
    }

    async fn stream(
        &self,
        _ctx: AsyncContext,
        req: StreamRequest,
        sink: StreamSink<EchoReply>,
    ) -> Result<(), Status> {
        let payload = self.slice(req.size as usize)?;
        for _ in 0..req.count {
            sink.send_async(&EchoReply { payload: payload.clone() }).await?;
        }
        Ok(())
    }

    async fn upload(
        &self,
        _ctx: AsyncContext,
        mut requests: RequestStream<EchoRequest>,
    ) -> Result<StreamRequest, Status> {
        let (mut count, mut bytes) = (0u64, 0u32);
        while let Some(m) = requests.message_async().await? {
            count += 1;
            bytes = bytes.wrapping_add(m.payload.len() as u32);
        }
        Ok(StreamRequest { count, size: bytes })
    }

    async fn exchange(
        &self,
        _ctx: AsyncContext,
        mut requests: RequestStream<EchoRequest>,
        sink: StreamSink<EchoReply>,
    ) -> Result<(), Status> {
        while let Some(m) = requests.message_async().await? {
            let n = (m.resp_size as usize).min(self.payload.len());
            sink.send_async(&EchoReply { payload: self.payload.slice(..n) }).await?;
        }
        Ok(())
    }
}
