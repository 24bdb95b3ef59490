//! The schema from the server itself, when no `--proto` is given (as grpcurl does): the files that
//! define a service, fetched over gRPC's reflection service (`grpc.reflection.v1`, which a server
//! of this framework serves after `ServerBuilder::add_reflection()`), with every file they
//! import, built into the same descriptor pool `--proto` gives.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use prost::Message as _;
use prost_reflect::DescriptorPool;
use prost_types::FileDescriptorProto;
use rpc_core::codegen::CallOptions;
use rpc_core::reflection::v1::server_reflection_client::ServerReflectionClient;
use rpc_core::reflection::{
    MessageRequest, MessageResponse, ServerReflectionRequest, ServerReflectionResponse,
};
use rpc_core::{BidiStreaming, Code, Status};

use super::args::NicArgs;
use super::schema::Schema;
use crate::error::PerfError;

/// How long one exchange with the reflection service may take (connection set up before).
const DEADLINE: Duration = Duration::from_secs(10);

/// Most files fetched for one symbol (imports included): a guard against a server that keeps
/// naming new imports.
const MAX_FILES: usize = 1000;

/// A reflection stream on its own session to `host`.
struct Reflection {
    client: ServerReflectionClient,
    addr: String,
}

type Stream<'a> = BidiStreaming<'a, ServerReflectionRequest, ServerReflectionResponse>;

impl Reflection {
    fn connect(nic: &NicArgs, host: &str) -> Result<Reflection, PerfError> {
        let (client, addr) = super::connect(nic, host, 1, crate::rpc::ring_bytes_for(1))?;
        Ok(Reflection { client: ServerReflectionClient::new(client), addr })
    }

    fn stream(&self) -> Result<Stream<'_>, PerfError> {
        self.client.server_reflection_info_with(&CallOptions::deadline(DEADLINE)).map_err(|s| self.failed(&s))
    }

    /// Sends `request` and takes its answer: the response, or the error response's code and text.
    fn ask(&self, stream: &mut Stream<'_>, request: MessageRequest) -> Result<Answer, PerfError> {
        stream.send(&ServerReflectionRequest::new(request)).map_err(|s| self.failed(&s))?;
        match stream.message() {
            Ok(Some(r)) => match r.message_response {
                Some(MessageResponse::ErrorResponse(e)) => Ok(Answer::Error(e.error_code, e.error_message)),
                Some(other) => Ok(Answer::Ok(other)),
                None => {
                    Err(PerfError::Setup(format!("{}: a reflection answer without a response", self.addr)))
                }
            },
            Ok(None) => Err(PerfError::Setup(format!("{}: the reflection stream ended early", self.addr))),
            Err(s) => Err(self.failed(&s)),
        }
    }

    /// The error for a reflection stream that failed with `s`: UNIMPLEMENTED means the server
    /// does not serve reflection (then `--proto` is needed).
    fn failed(&self, s: &Status) -> PerfError {
        if s.code() == Code::Unimplemented {
            PerfError::Setup(format!(
                "the server at {} does not serve reflection (grpc.reflection.v1.ServerReflection; a server \
                 adds it with ServerBuilder::add_reflection()): pass the service's definition with \
                 --proto FILE.proto",
                self.addr
            ))
        } else {
            PerfError::Setup(format!(
                "{}: reflection failed: {}: {}",
                self.addr,
                s.code(),
                super::one_line(s.message())
            ))
        }
    }

    /// The services the server lists.
    fn services(&self, stream: &mut Stream<'_>) -> Result<Vec<String>, PerfError> {
        match self.ask(stream, MessageRequest::ListServices(String::new()))? {
            Answer::Ok(MessageResponse::ListServicesResponse(l)) => {
                Ok(l.service.into_iter().map(|s| s.name).collect())
            }
            Answer::Ok(other) => {
                Err(PerfError::Setup(format!("{}: list_services answered {other:?}", self.addr)))
            }
            Answer::Error(code, text) => Err(PerfError::Setup(format!(
                "{}: list_services: {}: {text}",
                self.addr,
                Code::from_i32(code)
            ))),
        }
    }

    /// The file defining `symbol` and every file it imports, into `files`; the defining file's
    /// name, or `None` when the server does not know the symbol.
    fn fetch(
        &self,
        stream: &mut Stream<'_>,
        symbol: &str,
        files: &mut BTreeMap<String, FileDescriptorProto>,
    ) -> Result<Option<String>, PerfError> {
        let first = match self.ask(stream, MessageRequest::FileContainingSymbol(symbol.to_owned()))? {
            Answer::Error(code, _) if Code::from_i32(code) == Code::NotFound => return Ok(None),
            Answer::Error(code, text) => {
                return Err(PerfError::Setup(format!(
                    "{}: {symbol}: {}: {text}",
                    self.addr,
                    Code::from_i32(code)
                )))
            }
            Answer::Ok(r) => self.take_files(r, files)?,
        };
        let Some(first) = first else {
            return Err(PerfError::Setup(format!("{}: {symbol}: the server sent no file", self.addr)));
        };
        // Imports the server did not send with it (grpc's servers send them; others may not).
        loop {
            let missing: BTreeSet<String> = files
                .values()
                .flat_map(|f| f.dependency.iter())
                .filter(|d| !files.contains_key(*d))
                .cloned()
                .collect();
            let Some(name) = missing.into_iter().next() else { break };
            if files.len() >= MAX_FILES {
                return Err(PerfError::Setup(format!(
                    "{}: more than {MAX_FILES} files for {symbol}",
                    self.addr
                )));
            }
            match self.ask(stream, MessageRequest::FileByFilename(name.clone()))? {
                Answer::Ok(r) => {
                    self.take_files(r, files)?;
                    if !files.contains_key(&name) {
                        return Err(PerfError::Setup(format!(
                            "{}: asked for {name}, got other files",
                            self.addr
                        )));
                    }
                }
                Answer::Error(code, text) => {
                    return Err(PerfError::Setup(format!(
                        "{}: {name} (imported by the files of {symbol}): {}: {text}",
                        self.addr,
                        Code::from_i32(code)
                    )))
                }
            }
        }
        Ok(Some(first))
    }

    /// The files of a file descriptor response into `files`; the first one's name.
    fn take_files(
        &self,
        response: MessageResponse,
        files: &mut BTreeMap<String, FileDescriptorProto>,
    ) -> Result<Option<String>, PerfError> {
        let MessageResponse::FileDescriptorResponse(r) = response else {
            return Err(PerfError::Setup(format!("{}: expected files, got {response:?}", self.addr)));
        };
        let mut first = None;
        for bytes in &r.file_descriptor_proto {
            let file = FileDescriptorProto::decode(bytes.as_ref()).map_err(|e| {
                PerfError::Setup(format!(
                    "{}: a file descriptor from reflection does not decode: {e}",
                    self.addr
                ))
            })?;
            let name = file.name().to_owned();
            first.get_or_insert_with(|| name.clone());
            files.entry(name).or_insert(file);
        }
        Ok(first)
    }
}

/// One reflection answer: a response, or an error response (code, text).
enum Answer {
    Ok(MessageResponse),
    Error(i32, String),
}

/// The schema of the service `service` (full name) of the server at `host`, from reflection.
///
/// # Errors
/// [`PerfError::Setup`]: the server is unreachable; it does not serve reflection (the text says
/// to pass `--proto`); it does not know `service` (the text lists the services it serves); its
/// files do not form a valid pool.
pub fn schema(nic: &NicArgs, host: &str, service: &str) -> Result<Schema, PerfError> {
    let reflection = Reflection::connect(nic, host)?;
    let mut stream = reflection.stream()?;
    let mut files = BTreeMap::new();
    let Some(file) = reflection.fetch(&mut stream, service, &mut files)? else {
        let services = reflection.services(&mut stream)?;
        return Err(PerfError::Setup(format!(
            "the server at {} does not know `{service}` (reflection; services: {})",
            reflection.addr,
            if services.is_empty() { "none".to_owned() } else { services.join(", ") }
        )));
    };
    Ok(Schema::from_pool(pool(files, &reflection.addr)?, vec![file]))
}

/// `rpc-perf call HOST --list` without `--proto`: every service the server lists, with its
/// methods when reflection describes it.
///
/// # Errors
/// As [`schema`].
pub fn listing(nic: &NicArgs, host: &str) -> Result<String, PerfError> {
    let reflection = Reflection::connect(nic, host)?;
    let mut stream = reflection.stream()?;
    let services = reflection.services(&mut stream)?;
    let mut files = BTreeMap::new();
    for s in &services {
        // A service reflection does not describe is listed by its name alone.
        reflection.fetch(&mut stream, s, &mut files)?;
    }
    let schema = Schema::from_pool(pool(files, &reflection.addr)?, Vec::new());
    Ok(schema.listing_of(&services))
}

/// `files` (each with its imports among them) as a descriptor pool.
fn pool(files: BTreeMap<String, FileDescriptorProto>, addr: &str) -> Result<DescriptorPool, PerfError> {
    let mut pool = DescriptorPool::new();
    pool.add_file_descriptor_protos(files.into_values()).map_err(|e| {
        PerfError::Setup(format!(
            "{addr}: the files from reflection do not form a valid schema: {}",
            super::one_line(&e.to_string())
        ))
    })?;
    Ok(pool)
}
