//! The prost-build `ServiceGenerator` of this framework: per service a `<service>_server` module
//! (trait + adapter implementing `Service`) and a `<service>_client` module (stub over `Client`).
//! See `docs/facade.md` for the contract the emitted code follows.

use std::fmt::Write as _;

use prost_build::{Comments, Method, Service, ServiceGenerator};

use crate::method_id::{full_method_name, method_id};
use crate::names::{sanitize, shouty, snake, Scope, FACADE_NAMES};
use crate::{client, server};

/// The module-level allowance of lints about method names: the RPC names are the user's, and an
/// RPC may well be called `new`, `into_json` or `clone` with other signatures than clippy expects.
pub const ALLOW_USER_NAMES: &str =
    "#![allow(clippy::new_ret_no_self, clippy::wrong_self_convention, clippy::should_implement_trait)]\n";

/// Generates the server and client modules of every service prost-build hands over.
#[derive(Debug, Clone)]
pub struct RpcServiceGenerator {
    /// Emit `<service>_server`.
    pub build_server: bool,
    /// Emit `<service>_client`.
    pub build_client: bool,
    /// Services (`package.Service`) whose server trait is async.
    pub async_servers: Vec<String>,
    /// Server trait methods get default bodies answering UNIMPLEMENTED.
    pub default_stubs: bool,
    /// Per package with a service: its encoded `FileDescriptorSet` (`descriptors.rs`), written
    /// as the package's `FILE_DESCRIPTOR_SET`.
    pub descriptor_sets: std::collections::BTreeMap<String, Vec<u8>>,
}

impl ServiceGenerator for RpcServiceGenerator {
    fn generate(&mut self, service: Service, buf: &mut String) {
        let model = ServiceModel::new(&service);
        if self.build_server {
            let asynchronous = self.async_servers.contains(&model.full_name);
            server::generate(&model, buf, asynchronous, self.default_stubs);
        }
        if self.build_client {
            client::generate(&model, buf);
        }
    }

    fn finalize_package(&mut self, package: &str, buf: &mut String) {
        if let Some(bytes) = self.descriptor_sets.get(package) {
            crate::descriptors::write_const(bytes, buf);
        }
    }
}

/// A unary RPC as the emitted code names it.
pub struct RpcModel<'a> {
    /// prost-build's view: Rust method name (sanitized snake case), types, comments.
    pub method: &'a Method,
    /// `"/package.Service/Method"`.
    pub full_name: String,
    /// FNV-1a 32 of `full_name`, checked for collisions and 0 before generation.
    pub id: u32,
    /// The module-level constant holding `id` (`SAY_HELLO`).
    pub id_const: String,
    /// The request type as a path usable inside the service modules.
    pub input: String,
    /// The response type as a path usable inside the service modules.
    pub output: String,
}

/// A service as the emitted code names it, its RPCs by shape.
pub struct ServiceModel<'a> {
    /// prost-build's view of the service.
    pub service: &'a Service,
    /// `package.Service` (or `Service` without a package).
    pub full_name: String,
    /// The unary RPCs, in declaration order.
    pub rpcs: Vec<RpcModel<'a>>,
    /// The server-streaming RPCs, in declaration order.
    pub server_streams: Vec<RpcModel<'a>>,
    /// The client-streaming RPCs, in declaration order.
    pub client_streams: Vec<RpcModel<'a>>,
    /// The bidirectional streaming RPCs, in declaration order.
    pub bidi_streams: Vec<RpcModel<'a>>,
    /// The constant holding the service name (`SERVICE_NAME` unless an RPC took that name).
    pub service_name_const: String,
    /// The trait (the service's name, sanitized like prost-build does).
    pub trait_name: String,
    /// Snake-case stem of the module names (`greeter` → `greeter_server`, `greeter_client`).
    pub module_stem: String,
    /// UpperCamelCase stem of the adapter and stub names (`GreeterServer`, `GreeterClient`).
    pub type_stem: String,
}

impl<'a> ServiceModel<'a> {
    fn new(service: &'a Service) -> Self {
        let full_name = if service.package.is_empty() {
            service.proto_name.clone()
        } else {
            format!("{}.{}", service.package, service.proto_name)
        };
        let mut consts = Scope::default();
        let mut model = |method: &'a Method| {
            let full_name = full_method_name(&service.package, &service.proto_name, &method.proto_name);
            RpcModel {
                method,
                id: method_id(&full_name),
                full_name,
                id_const: consts.claim(&shouty(&method.proto_name)),
                input: local_type(&method.input_type),
                output: local_type(&method.output_type),
            }
        };
        let mut rpcs = Vec::new();
        let mut server_streams = Vec::new();
        let mut client_streams = Vec::new();
        let mut bidi_streams = Vec::new();
        for method in &service.methods {
            match (method.client_streaming, method.server_streaming) {
                (false, false) => rpcs.push(model(method)),
                (false, true) => server_streams.push(model(method)),
                (true, false) => client_streams.push(model(method)),
                (true, true) => bidi_streams.push(model(method)),
            }
        }
        let service_name_const = consts.claim("SERVICE_NAME");
        ServiceModel {
            service,
            full_name,
            rpcs,
            server_streams,
            client_streams,
            bidi_streams,
            service_name_const,
            trait_name: service.name.clone(),
            module_stem: snake(&service.proto_name),
            type_stem: crate::names::camel(&service.proto_name),
        }
    }

    /// How the `<service>_server` module spells facade item `name`: bare (through the glob import),
    /// or with its full path when the service's trait has that name and shadows the import.
    pub fn facade(&self, name: &str) -> String {
        debug_assert!(FACADE_NAMES.contains(&name), "{name} is not a facade name");
        if self.trait_name == name {
            format!("rpc_core::codegen::{name}")
        } else {
            name.to_owned()
        }
    }

    /// How the `<service>_client` module spells facade item `name`: always bare. Nothing there
    /// shadows the glob import (its items are the stub `<Stem>Client`, SHOUTY constants and
    /// `__rpc_*` names; the trait lives in the server module), and a full path where the bare name
    /// resolves to the same item trips a user's `unused_qualifications`.
    pub fn client_facade(&self, name: &str) -> String {
        debug_assert!(FACADE_NAMES.contains(&name), "{name} is not a facade name");
        debug_assert!(name != format!("{}Client", self.type_stem), "the stub {name} shadows the facade");
        name.to_owned()
    }

    /// Every RPC: unary, server-streaming, client-streaming, bidirectional (each in declaration
    /// order).
    pub fn all(&self) -> impl Iterator<Item = &RpcModel<'a>> + '_ {
        self.rpcs.iter().chain(&self.server_streams).chain(&self.client_streams).chain(&self.bidi_streams)
    }

    /// Emits the constants both modules have: the service name and one method id per RPC, typed
    /// `method_id` (the facade's `MethodId` as the module spells it).
    pub fn write_consts(&self, buf: &mut String, method_id: &str) {
        let _ = writeln!(buf, "/// The full name of the service, `{}`.", self.full_name);
        let _ = writeln!(buf, "pub const {}: &str = \"{}\";", self.service_name_const, self.full_name);
        for rpc in self.all() {
            let _ = writeln!(buf, "/// Method id of `{}` (FNV-1a 32 of the full name).", rpc.full_name);
            let _ = writeln!(
                buf,
                "pub const {}: {method_id} = 0x{:04x}_{:04x};",
                rpc.id_const,
                rpc.id >> 16,
                rpc.id & 0xffff
            );
        }
    }
}

/// A type path as prost-build resolved it (relative to the package's module) → the same type seen
/// from a service module nested one level deeper. `google.protobuf.Empty` is `()` (prost-build's
/// mapping; prost implements `Message` for it).
fn local_type(path: &str) -> String {
    if path == "()" || path.starts_with("::") || path.starts_with("crate::") {
        path.to_owned()
    } else {
        format!("super::{path}")
    }
}

/// Writes `comments` (leading and trailing, already escaped for rustdoc) as `///` lines.
pub fn write_comments(comments: &Comments, buf: &mut String) {
    let comments = Comments { leading_detached: Vec::new(), ..comments.clone() };
    comments.append_with_indent(0, buf);
}

/// `snake(proto_name) + suffix`, sanitized: the name of a generated variant of an RPC's method
/// (`say_hello_with`, `type_async`).
pub fn variant_name(proto_name: &str, suffix: &str) -> String {
    sanitize(&format!("{}{suffix}", snake(proto_name)))
}
