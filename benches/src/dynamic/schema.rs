//! `.proto` files compiled at run time (protox: no `protoc`) into a descriptor pool, and the
//! methods of their services resolved by name, with the method id the generated code uses.

use std::fmt::Write as _;
use std::path::PathBuf;

use prost_reflect::{DescriptorPool, MessageDescriptor, MethodDescriptor, ServiceDescriptor};
use rpc_core::codegen::{method_id, MethodId};

use crate::error::PerfError;

/// The services and messages of some `.proto` files (their imports included).
#[derive(Clone, Debug)]
pub struct Schema {
    pool: DescriptorPool,
    /// Names (relative to an include directory) of the files the user gave, in order.
    files: Vec<String>,
}

/// A unary method, resolved.
#[derive(Clone, Debug)]
pub struct UnaryMethod {
    /// `package.Service/Method`, as the user writes it.
    pub name: String,
    /// The wire's full name, `"/package.Service/Method"` (`"/Service/Method"` without a package).
    pub full_name: String,
    /// [`method_id`] of `full_name`: the id generated stubs and servers use.
    pub id: MethodId,
    /// The request message.
    pub input: MessageDescriptor,
    /// The reply message.
    pub output: MessageDescriptor,
}

/// The wire name of `method`: `"/" + service full name + "/" + method name`, which is what
/// rpc-codegen hashes (`full_method_name(package, service, method)`): the service's full name is
/// `package.Service`, or `Service` in a file without a package.
pub fn wire_name(method: &MethodDescriptor) -> String {
    format!("/{}/{}", method.parent_service().full_name(), method.name())
}

impl Schema {
    /// Compiles `protos` with the import directories `includes`. With no `includes`, each file's
    /// own directory is one (so `--proto proto/kv.proto` alone works).
    ///
    /// # Errors
    /// [`PerfError::Setup`] with protox's `file:line:col: reason`, or naming the file not found.
    pub fn compile(protos: &[PathBuf], includes: &[PathBuf]) -> Result<Schema, PerfError> {
        if protos.is_empty() {
            return Err(PerfError::Setup("--proto FILE.proto is needed (the service's definition)".into()));
        }
        let mut dirs: Vec<PathBuf> = includes.to_vec();
        if dirs.is_empty() {
            for p in protos {
                let dir =
                    p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
                if !dirs.iter().any(|d| d == dir) {
                    dirs.push(dir.to_path_buf());
                }
            }
        }
        // A file is given by its path, or by its name under an import directory (`-I proto
        // --proto kv.proto`), as protoc and grpcurl take it.
        for p in protos {
            if !p.is_file() && !dirs.iter().any(|d| d.join(p).is_file()) {
                return Err(PerfError::Setup(format!("--proto {}: no such file", p.display())));
            }
        }
        let proto_err =
            |e: protox::Error| PerfError::Setup(format!("--proto: {}", one_line(&format!("{e:?}"))));
        let mut compiler = protox::Compiler::new(&dirs).map_err(proto_err)?;
        compiler.include_imports(true);
        compiler.open_files(protos).map_err(|e| {
            if e.is_file_not_found() || e.to_string().contains("not included") {
                let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                PerfError::Setup(format!(
                    "--proto: {e} (import directories: {}; add one with -I DIR)",
                    dirs.join(", ")
                ))
            } else {
                proto_err(e)
            }
        })?;
        let files = compiler.files().filter(|f| !f.is_import()).map(|f| f.name().to_owned()).collect();
        Ok(Schema { pool: compiler.descriptor_pool(), files })
    }

    /// A schema over `pool` (from reflection: `super::reflect`), `files` naming the files whose
    /// services [`Schema::services`] lists.
    pub fn from_pool(pool: DescriptorPool, files: Vec<String>) -> Schema {
        Schema { pool, files }
    }

    /// The descriptor pool.
    pub fn pool(&self) -> &DescriptorPool {
        &self.pool
    }

    /// The services defined in the files the user named (not in their imports).
    pub fn services(&self) -> Vec<ServiceDescriptor> {
        self.pool.services().filter(|s| self.files.iter().any(|f| f == s.parent_file().name())).collect()
    }

    /// Resolves `name`: `package.Service/Method` (also accepted: a leading `/`, or
    /// `package.Service.Method`).
    ///
    /// # Errors
    /// [`PerfError::Setup`] naming the unknown service (and the known ones), the unknown method
    /// (and the service's methods), or a streaming method (`call` and `bench` take unary methods only).
    pub fn unary_method(&self, name: &str) -> Result<UnaryMethod, PerfError> {
        let (svc_name, m_name) = split_method(name)?;
        let Some(svc) = self.pool.get_service_by_name(svc_name) else {
            let known: Vec<String> = self.pool.services().map(|s| s.full_name().to_owned()).collect();
            return Err(PerfError::Setup(format!(
                "unknown service `{svc_name}` in {} (services: {})",
                self.files.join(", "),
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )));
        };
        let Some(m) = svc.methods().find(|m| m.name() == m_name) else {
            let known: Vec<String> = svc.methods().map(|m| m.name().to_owned()).collect();
            return Err(PerfError::Setup(format!(
                "unknown method `{m_name}` of service {} (methods: {})",
                svc.full_name(),
                known.join(", ")
            )));
        };
        if m.is_client_streaming() || m.is_server_streaming() {
            return Err(PerfError::Setup(format!(
                "{}/{} is a streaming method: rpc-perf call and bench take unary methods only (streams are called through generated stubs)",
                svc.full_name(),
                m.name()
            )));
        }
        let full_name = wire_name(&m);
        Ok(UnaryMethod {
            name: format!("{}/{}", svc.full_name(), m.name()),
            id: method_id(&full_name),
            full_name,
            input: m.input(),
            output: m.output(),
        })
    }

    /// The message named `name` (its full name, `package.Message`).
    ///
    /// # Errors
    /// [`PerfError::Setup`] naming the unknown message.
    pub fn message(&self, name: &str) -> Result<MessageDescriptor, PerfError> {
        let n = name.trim_start_matches('.');
        self.pool.get_message_by_name(n).ok_or_else(|| {
            PerfError::Setup(format!(
                "unknown message `{n}` in {} (give its full name, package.Message)",
                self.files.join(", ")
            ))
        })
    }

    /// `--describe NAME`: a message's fields (`  type json_name = number;`, oneof members
    /// marked) or a service's methods, in .proto-like text.
    ///
    /// # Errors
    /// [`PerfError::Setup`] naming the unknown message or service.
    pub fn describe(&self, name: &str) -> Result<String, PerfError> {
        let n = name.trim_start_matches('.');
        let mut out = String::new();
        if let Some(svc) = self.pool.get_service_by_name(n) {
            let _ = writeln!(out, "service {} {{", svc.full_name());
            for m in svc.methods() {
                let _ = writeln!(
                    out,
                    "  rpc {}({}) returns ({});",
                    m.name(),
                    m.input().full_name(),
                    m.output().full_name()
                );
            }
            out.push_str("}\n");
            return Ok(out);
        }
        let Some(msg) = self.pool.get_message_by_name(n) else {
            return Err(PerfError::Setup(format!(
                "unknown message or service `{n}` in {} (give its full name, package.Name)",
                self.files.join(", ")
            )));
        };
        let _ = writeln!(out, "message {} {{", msg.full_name());
        for f in msg.fields() {
            let oneof = f.containing_oneof().map(|o| format!("  // oneof {}", o.name())).unwrap_or_default();
            let _ =
                writeln!(out, "  {} {} = {};{oneof}", super::json::type_name(&f), f.json_name(), f.number());
        }
        out.push_str("}\n");
        Ok(out)
    }

    /// `--list`: every service of the named files with its methods, one per line:
    /// `package.Service/Method(Request) returns (Reply)`, streaming ones marked.
    pub fn listing(&self) -> String {
        let mut out = String::new();
        for s in self.services() {
            write_service(&mut out, &s);
        }
        if out.is_empty() {
            out.push_str("(no services)\n");
        }
        out
    }

    /// The listing of the services `names` (a server's, from reflection), in that order: each
    /// with its methods as [`Schema::listing`] writes them, or its name alone when the pool does
    /// not describe it.
    pub fn listing_of(&self, names: &[String]) -> String {
        let mut out = String::new();
        for name in names {
            match self.pool.get_service_by_name(name) {
                Some(s) => write_service(&mut out, &s),
                None => {
                    let _ = writeln!(out, "{name}  [not described by the server's reflection]");
                }
            }
        }
        if out.is_empty() {
            out.push_str("(no services)\n");
        }
        out
    }
}

/// `package.Service/Method` (also: a leading `/`, or `package.Service.Method`) → the service's
/// full name and the method's name.
///
/// # Errors
/// [`PerfError::Setup`] showing the form, for a name with neither `/` nor `.`.
pub fn split_method(name: &str) -> Result<(&str, &str), PerfError> {
    let trimmed = name.trim_start_matches('/');
    match trimmed.rsplit_once('/') {
        Some(pair) => Ok(pair),
        None => trimmed
            .rsplit_once('.')
            .ok_or_else(|| PerfError::Setup(format!("method `{name}`: write it as package.Service/Method"))),
    }
}

/// One service of a listing: its name, then one line per method.
fn write_service(out: &mut String, s: &ServiceDescriptor) {
    let _ = writeln!(out, "{}", s.full_name());
    for m in s.methods() {
        let stream = |yes: bool| if yes { "stream " } else { "" };
        let _ = writeln!(
            out,
            "  {}/{}({}{}) returns ({}{}){}",
            s.full_name(),
            m.name(),
            stream(m.is_client_streaming()),
            m.input().full_name(),
            stream(m.is_server_streaming()),
            m.output().full_name(),
            if m.is_client_streaming() || m.is_server_streaming() {
                "  [streaming: not callable by rpc-perf]"
            } else {
                ""
            }
        );
    }
}

/// The first line of a possibly multi-line message, trimmed.
fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(p: &str) -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../proto")).join(p)
    }

    #[test]
    fn resolves_methods_with_the_generated_ids() {
        let s = Schema::compile(&[proto("bench.proto")], &[]).unwrap();
        let m = s.unary_method("rpcperf.Bench/Echo").unwrap();
        assert_eq!(m.full_name, "/rpcperf.Bench/Echo");
        assert_eq!(m.id, crate::rpc::pb::bench_server::ECHO);
        assert_eq!(m.input.full_name(), "rpcperf.EchoRequest");
        assert_eq!(m.output.full_name(), "rpcperf.EchoReply");
        for alias in ["/rpcperf.Bench/Echo", "rpcperf.Bench.Echo"] {
            assert_eq!(s.unary_method(alias).unwrap().id, m.id, "{alias}");
        }
    }

    #[test]
    fn lists_services_and_methods() {
        // By name under an import directory, too.
        let by_name = Schema::compile(&[PathBuf::from("kv.proto")], &[proto("")]).unwrap();
        assert_eq!(by_name.unary_method("kv.Kv/Get").unwrap().id, rpc_core::codegen::method_id("/kv.Kv/Get"));
        let s = Schema::compile(&[proto("kv.proto")], &[]).unwrap();
        let l = s.listing();
        assert!(l.starts_with("kv.Kv\n"), "{l}");
        assert!(l.contains("  kv.Kv/Put(kv.PutRequest) returns (kv.PutReply)\n"), "{l}");
        assert!(l.contains("  kv.Kv/Scan(kv.ScanRequest) returns (kv.ScanReply)\n"), "{l}");
        assert_eq!(
            s.describe("kv.Entry").unwrap(),
            "message kv.Entry {\n  string key = 1;\n  uint64 len = 2;\n  bytes (base64) value = 3;\n}\n"
        );
        assert!(s.describe("kv.Kv").unwrap().contains("  rpc Get(kv.GetRequest) returns (kv.GetReply);\n"));
        let e = s.describe("kv.Nope").unwrap_err().to_string();
        assert!(e.starts_with("unknown message or service `kv.Nope` in kv.proto"), "{e}");
        let s = Schema::compile(&[proto("codegen/streaming.proto")], &[proto("")]).unwrap();
        assert!(s.listing().contains("[streaming: not callable by rpc-perf]"), "{}", s.listing());
    }
}
