//! The server side of `grpc.reflection.v1.ServerReflection`: one bidirectional stream per
//! client, each request answered from the [`DescriptorIndex`] in order, on the worker (the
//! answers are lookups in memory; nothing blocks).

use std::future::Future;
use std::sync::Arc;

use super::index::DescriptorIndex;
use super::v1::server_reflection_server::ServerReflection;
use super::v1::{ServerReflectionRequest, ServerReflectionResponse};
use crate::dispatch::source::RequestStream;
use crate::dispatch::stream::StreamSink;
use crate::server::async_service::AsyncContext;
use crate::status::Status;

/// Implements the generated `ServerReflection` trait over an index built when the server starts.
pub(crate) struct ReflectionService {
    index: Arc<DescriptorIndex>,
}

impl ReflectionService {
    /// Answers from `index`.
    pub(crate) fn new(index: DescriptorIndex) -> ReflectionService {
        ReflectionService { index: Arc::new(index) }
    }
}

impl ServerReflection for ReflectionService {
    fn server_reflection_info(
        &self,
        _ctx: AsyncContext,
        mut requests: RequestStream<ServerReflectionRequest>,
        sink: StreamSink<ServerReflectionResponse>,
    ) -> impl Future<Output = Result<(), Status>> + Send {
        let index = Arc::clone(&self.index);
        async move {
            // Until the client's clean end (then OK), or its cancel, the deadline or the session's
            // end (then the stream's status, which no one reads any more).
            while let Some(request) = requests.message_async().await? {
                sink.send_async(&index.answer(&request)).await?;
            }
            Ok(())
        }
    }
}
