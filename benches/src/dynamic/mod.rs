//! `rpc-perf call` and `rpc-perf bench`: any unary method of any service of ours, from its
//! `.proto` compiled at run time or, without `--proto`, from the server's reflection service
//! ([`reflect`]), with requests written as JSON (grpcurl and ghz for this framework).
//!
//! ```text
//! rpc-perf call  127.0.0.1:50052 kv.Kv/Put --proto proto/kv.proto --data '{"key":"a","value":"aGk="}'
//! rpc-perf bench 127.0.0.1:50052 kv.Kv/Get --proto proto/kv.proto --data '{"key":"a"}' -c 32 -n 100000
//! rpc-perf call  127.0.0.1:50052 kv.Kv/Get --data '{"key":"a"}'    # the schema by reflection
//! rpc-perf call  127.0.0.1:50052 list                              # the server's services
//! ```
//!
//! The method id is `rpc_core::codegen::method_id` of `"/package.Service/Method"`, the function
//! whose value rpc-codegen emits as a literal into generated code (a test checks both agree on
//! every .proto of the repository). Requests are encoded from JSON once per distinct payload
//! and sent as bytes; replies are taken as bytes and decoded only by `call` and `bench --check`.

pub mod args;
pub mod bench;
pub mod body;
pub mod call;
pub mod json;
pub mod reflect;
pub mod schema;

use rpc_core::{Client, ClientConfig, Transport};

use crate::cli::TransportKind;
use crate::error::PerfError;
use args::NicArgs;

/// `HOST` or `HOST:PORT` (IPv6 in brackets with a port) → `host:port`, with `default_port` when
/// none is given.
pub fn target(host: &str, default_port: u16) -> String {
    let has_port = if let Some(rest) = host.strip_prefix('[') {
        rest.contains("]:")
    } else {
        host.contains(':') && host.parse::<std::net::Ipv6Addr>().is_err()
    };
    if has_port {
        host.to_string()
    } else if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]:{default_port}")
    } else {
        format!("{host}:{default_port}")
    }
}

/// The runtime transport `nic` asks for (`auto`: rdma when `-d` is given or a device exists).
pub fn transport(nic: &NicArgs) -> Transport {
    let rdma = match nic.transport {
        TransportKind::Sim => false,
        TransportKind::Rdma => true,
        TransportKind::Auto => nic.ib_dev.is_some() || crate::transport::rdma_devices_exist(),
    };
    if rdma {
        Transport::Rdma {
            device: nic.ib_dev.clone().unwrap_or_default(),
            port: nic.ib_port,
            gid_index: nic.gid_index,
        }
    } else {
        Transport::Sim
    }
}

/// Connects to `host` with `window` calls in flight and a receive ring of `ring_bytes`.
///
/// # Errors
/// [`PerfError::Setup`]: `cannot reach HOST:PORT: <status>` (no server, refused handshake,
/// transport unavailable).
pub fn connect(
    nic: &NicArgs,
    host: &str,
    window: u32,
    ring_bytes: u32,
) -> Result<(Client, String), PerfError> {
    let addr = target(host, nic.port);
    let cfg = ClientConfig::default()
        .transport(transport(nic))
        .polling(crate::rpc::polling(nic.poll))
        .window(window.clamp(1, 4096) as u16)
        .ring_bytes(ring_bytes);
    let client = Client::connect_with(addr.as_str(), &cfg).map_err(|s| {
        // The runtime's text names the address it tried (`connect: 127.0.0.1:50099: Connection
        // refused`); said once, after `cannot reach`.
        let text = one_line(&s.to_string()).replacen(&format!("{addr}: "), "", 1);
        let hint = if text.contains("handshake") {
            " (is an RPC server of this framework listening there, on the same --transport? \
             `rpc-perf --persist` serves rpcperf.Bench on its -p port + 1)"
        } else {
            ""
        };
        PerfError::Setup(format!("cannot reach {addr}: {text}{hint}"))
    })?;
    Ok((client, addr))
}

/// The schema of `method`'s service: compiled from `--proto` files when given, else fetched
/// from the reflection service of the server at `host` (as grpcurl does).
///
/// # Errors
/// As [`schema::Schema::compile`] and [`reflect::schema`] (a server without reflection: the
/// text says to pass `--proto`).
pub fn schema_for(
    proto: &args::ProtoArgs,
    nic: &NicArgs,
    host: &str,
    method: &str,
) -> Result<schema::Schema, PerfError> {
    if proto.protos.is_empty() {
        let (service, _) = schema::split_method(method)?;
        reflect::schema(nic, host, service)
    } else {
        schema::Schema::compile(&proto.protos, &proto.includes)
    }
}

/// `s` on one line (inner line breaks become spaces).
pub fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_get_the_default_port() {
        assert_eq!(target("10.0.0.1", 18515), "10.0.0.1:18515");
        assert_eq!(target("10.0.0.1:50052", 18515), "10.0.0.1:50052");
        assert_eq!(target("server", 7), "server:7");
        assert_eq!(target("::1", 7), "[::1]:7");
        assert_eq!(target("[::1]:9", 7), "[::1]:9");
        assert_eq!(target("[::1]", 7), "[::1]:7");
    }
}
