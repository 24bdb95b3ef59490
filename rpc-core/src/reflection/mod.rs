//! gRPC's reflection service, `grpc.reflection.v1.ServerReflection` (from the standard
//! `proto/grpc/reflection/v1/reflection.proto`): what `grpcurl` and `rpc-perf call` without
//! `--proto` ask a server for, to learn its services and their types.
//!
//! # Server: one line
//!
//! ```no_run
//! # fn demo<S: rpc_core::codegen::Service>(my_service: S) -> Result<(), rpc_core::ServerError> {
//! let server = rpc_core::Server::builder()
//!     .add_reflection()
//!     .add_service(my_service)
//!     .spawn("0.0.0.0:18515")?;
//! # Ok(()) }
//! ```
//!
//! Every service added to the builder (before or after `add_reflection`) is listed, the health
//! and reflection services included when added, and described by the descriptors its generated
//! code carries: rpc-codegen emits, in each package with a service, `FILE_DESCRIPTOR_SET` (the
//! encoded `google.protobuf.FileDescriptorSet` of the package's files and everything they import,
//! without source info), and the generated server adapter hands it over as
//! [`Service::FILE_DESCRIPTOR_SET`](crate::codegen::Service::FILE_DESCRIPTOR_SET). A
//! hand-written [`Service`](crate::codegen::Service) that does not set it is listed, but its
//! symbols are unknown.
//!
//! # What it answers
//!
//! One bidirectional stream per client; each request gets one response, in order, echoing the
//! request (`original_request`) and its `host` (`valid_host`):
//! - `list_services`: the full names of the services added;
//! - `file_by_filename`, `file_containing_symbol` (a service, method, message, nested message,
//!   enum, enum value, field, oneof or extension, by full name: `helloworld.Greeter.SayHello`,
//!   `pkg.Outer.Inner`), `file_containing_extension` (extended message and field number): the
//!   file, then every file it imports, transitively, each once (as grpc's C++ server does);
//! - `all_extension_numbers_of_type`: the extension numbers the pool knows for a message (none is
//!   an empty list);
//! - an `ErrorResponse` with NOT_FOUND (5) for a name the pool does not have, INVALID_ARGUMENT (3)
//!   for a request of no kind. The stream goes on after an error.
//!
//! Only `v1` is served (grpcurl since 1.8.8 and grpc's clients ask for it first); the older
//! `v1alpha` name answers UNIMPLEMENTED.
//!
//! # Where the generated code comes from
//!
//! As for [`crate::health`]: [`v1`] is `rpc-codegen`'s output for
//! `proto/grpc/reflection/v1/reflection.proto` (its service async), checked in as
//! `src/reflection/grpc.reflection.v1.rs`; `codegen-tests`' snapshot test fails when the generator
//! would write something else (`UPDATE_SNAPSHOTS=1 cargo test -p codegen-tests --test snapshot`
//! rewrites it).

mod index;
mod service;

pub(crate) use index::DescriptorIndex;
pub(crate) use service::ReflectionService;

/// The code `rpc-codegen` generates for package `grpc.reflection.v1`: the messages, the server
/// trait and adapter ([`v1::server_reflection_server`]) and the client stub
/// ([`v1::server_reflection_client`]).
#[allow(missing_docs)] // prost's messages carry docs only where the proto has comments.
pub mod v1 {
    // Included, not a module file: rustfmt leaves it as the generator wrote it.
    include!("grpc.reflection.v1.rs");
}

pub use v1::server_reflection_client::ServerReflectionClient;
pub use v1::server_reflection_request::MessageRequest;
pub use v1::server_reflection_response::MessageResponse;
pub use v1::{ServerReflectionRequest, ServerReflectionResponse};

/// The service's full name, `grpc.reflection.v1.ServerReflection`.
pub const SERVICE_NAME: &str = v1::server_reflection_server::SERVICE_NAME;

impl ServerReflectionRequest {
    /// A request of kind `request` (no `host`).
    pub fn new(request: MessageRequest) -> ServerReflectionRequest {
        ServerReflectionRequest { host: String::new(), message_request: Some(request) }
    }
}
