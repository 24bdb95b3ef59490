//! gRPC's health service, `grpc.health.v1.Health` (Check and Watch, from the standard
//! `proto/grpc/health/v1/health.proto`), with drain on shutdown.
//!
//! # Server: one line
//!
//! ```no_run
//! # fn demo<S: rpc_core::codegen::Service>(my_service: S) -> Result<(), rpc_core::ServerError> {
//! let server = rpc_core::Server::builder()
//!     .add_health_service()
//!     .add_service(my_service)
//!     .spawn("0.0.0.0:18515")?;
//! # Ok(()) }
//! ```
//!
//! The server (the empty name `""`) and every service added with `add_service` report SERVING;
//! the application changes that through a [`HealthReporter`]
//! ([`ServerBuilder::health_reporter`](crate::ServerBuilder::health_reporter),
//! [`ServerHandle::health_reporter`](crate::ServerHandle::health_reporter)). As gRPC's
//! `doc/health-checking.md` says, `Check` of a name without a status fails NOT_FOUND, and
//! `Watch` of one streams SERVICE_UNKNOWN (and the status once one is set) without ending.
//!
//! # Drain
//!
//! [`ServerHandle::shutdown`](crate::ServerHandle::shutdown) (or dropping the handle) first
//! reports every status NOT_SERVING (each `Watch` stream gets it) and ignores later changes; then,
//! for [`ServerConfig::drain_grace`](crate::ServerConfig::drain_grace) (default 0), calls still
//! run as before so balancers can move away; then `Watch` streams end (OK) and the drain proper
//! begins: new calls are answered UNAVAILABLE and calls in flight finish, up to
//! [`ServerConfig::drain_timeout`](crate::ServerConfig::drain_timeout).
//!
//! # Client
//!
//! The generated stub [`HealthClient`] works over a blocking [`Client`](crate::Client) or a
//! [`Channel`](crate::Channel) as every stub does:
//!
//! ```no_run
//! use rpc_core::health::{HealthCheckRequest, HealthClient, ServingStatus};
//! # async fn demo(channel: rpc_core::Channel) -> Result<(), rpc_core::Status> {
//! let health = HealthClient::from_channel(channel);
//! let now = health.check(HealthCheckRequest::server()).await?.status();
//! let mut changes = health.watch(HealthCheckRequest::for_service("helloworld.Greeter"));
//! while let Some(update) = changes.message().await? {
//!     if update.status() != ServingStatus::Serving {
//!         // stop picking this server
//!     }
//! }
//! // The stream ended: the server drains (or went away); retry with backoff.
//! # let _ = now; Ok(()) }
//! ```
//!
//! # Where the generated code comes from
//!
//! `rpc-core` has no build script (it would make every user of the library compile protox and
//! prost-build, and read a `.proto` outside the crate): [`v1`] is `rpc-codegen`'s output for
//! `proto/grpc/health/v1/health.proto`, checked in as `src/health/grpc.health.v1.rs`.
//! `codegen-tests` compiles the same proto with the current generator and its snapshot test
//! fails when the two differ; `UPDATE_SNAPSHOTS=1 cargo test -p codegen-tests --test snapshot`
//! rewrites the file after a deliberate change to the generator.

mod reporter;
mod service;

pub use reporter::HealthReporter;
pub(crate) use service::HealthService;

/// The code `rpc-codegen` generates for package `grpc.health.v1`: the messages, the server trait
/// and adapter ([`v1::health_server`]) and the client stub ([`v1::health_client`]).
#[allow(missing_docs)] // prost's messages carry docs only where the proto has comments.
pub mod v1 {
    // Included, not a module file: rustfmt leaves it as the generator wrote it.
    include!("grpc.health.v1.rs");
}

pub use v1::health_check_response::ServingStatus;
pub use v1::health_client::HealthClient;
pub use v1::{HealthCheckRequest, HealthCheckResponse};

/// The service's full name, `grpc.health.v1.Health`.
pub const SERVICE_NAME: &str = v1::health_server::SERVICE_NAME;

impl HealthCheckRequest {
    /// A request about the whole server (the empty service name).
    pub fn server() -> HealthCheckRequest {
        HealthCheckRequest { service: String::new() }
    }

    /// A request about `service` (its full name, `package.Service`).
    pub fn for_service(service: impl Into<String>) -> HealthCheckRequest {
        HealthCheckRequest { service: service.into() }
    }
}
