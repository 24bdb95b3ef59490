//! The descriptors a reflection server answers from, indexed once when the server starts: files
//! by name, symbols and extensions to the file that defines them, and the answer to each request
//! kind of `grpc.reflection.v1`. No I/O: [`DescriptorIndex::answer`] maps a request to its
//! response, so every request kind is tested without a server.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use prost::Message as _;
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};

use super::v1::server_reflection_request::MessageRequest;
use super::v1::server_reflection_response::MessageResponse;
use super::v1::{
    ErrorResponse, ExtensionNumberResponse, FileDescriptorResponse, ListServiceResponse,
    ServerReflectionRequest, ServerReflectionResponse, ServiceResponse,
};
use crate::status::Code;

/// Longest name quoted back in an error response, in characters (a peer chose it).
const NAME_QUOTED: usize = 200;

/// One file of the pool.
#[derive(Debug)]
struct File {
    /// Its `FileDescriptorProto`, encoded (what the response carries).
    encoded: Bytes,
    /// The files it imports, by name.
    dependencies: Vec<String>,
}

/// The services a server lists and the descriptors that describe them.
#[derive(Debug, Default)]
pub(crate) struct DescriptorIndex {
    /// Full names of the services served, in the order they were added (each once).
    services: Vec<String>,
    /// Files by name (`grpc/health/v1/health.proto`).
    files: HashMap<String, File>,
    /// Fully qualified name (no leading dot) of every package-level item, message, enum, enum
    /// value, field, oneof, extension, service and method → its file.
    symbols: HashMap<String, String>,
    /// Fully qualified names of the messages (extension requests name one).
    messages: BTreeSet<String>,
    /// Extended message → extension field number → the file that declares the extension.
    extensions: HashMap<String, BTreeMap<i32, String>>,
}

impl DescriptorIndex {
    /// Indexes `sets` (encoded `FileDescriptorSet`s, as `Service::FILE_DESCRIPTOR_SET`) for the
    /// services `services` (full names; repeats are listed once). A file already seen (by name)
    /// keeps its first version; a set that does not decode is skipped (it came from this
    /// process's own generated code, so that means a hand-written `Service` got it wrong).
    pub(crate) fn new<'a>(
        services: impl IntoIterator<Item = &'a str>,
        sets: impl IntoIterator<Item = &'a [u8]>,
    ) -> DescriptorIndex {
        let mut index = DescriptorIndex::default();
        for s in services {
            if !index.services.iter().any(|known| known == s) {
                index.services.push(s.to_owned());
            }
        }
        for set in sets {
            let Ok(set) = FileDescriptorSet::decode(set) else {
                tracing::warn!("reflection: a service's FILE_DESCRIPTOR_SET does not decode; skipped");
                continue;
            };
            for file in set.file {
                let name = file.name().to_owned();
                if index.files.contains_key(&name) {
                    continue;
                }
                let package = file.package().to_owned();
                let scope =
                    |n: &str| if package.is_empty() { n.to_owned() } else { format!("{package}.{n}") };
                let mut symbols = Vec::new();
                for m in &file.message_type {
                    index_message(&scope(m.name()), m, &mut symbols, &mut index.messages);
                }
                for e in &file.enum_type {
                    index_enum(&package, e, &mut symbols);
                }
                for x in &file.extension {
                    symbols.push(scope(x.name()));
                }
                for s in &file.service {
                    let full = scope(s.name());
                    symbols.extend(s.method.iter().map(|m| format!("{full}.{}", m.name())));
                    symbols.push(full);
                }
                let mut extensions = Vec::new();
                collect_extensions(&file.extension, &file.message_type, &mut extensions);
                for (extendee, number) in extensions {
                    index
                        .extensions
                        .entry(extendee)
                        .or_default()
                        .entry(number)
                        .or_insert_with(|| name.clone());
                }
                for s in symbols {
                    index.symbols.entry(s).or_insert_with(|| name.clone());
                }
                let dependencies = file.dependency.clone();
                index.files.insert(name, File { encoded: file.encode_to_vec().into(), dependencies });
            }
        }
        index
    }

    /// The response to `request`: the files asked for (the one that answers first, then every
    /// file it imports, transitively, each once), the extension numbers, the services, or an
    /// error response (NOT_FOUND for a name the pool does not have, INVALID_ARGUMENT for a
    /// request of no known kind).
    pub(crate) fn answer(&self, request: &ServerReflectionRequest) -> ServerReflectionResponse {
        let response = match &request.message_request {
            Some(MessageRequest::FileByFilename(name)) => {
                self.files_from(name).ok_or_else(|| not_found("file", name))
            }
            Some(MessageRequest::FileContainingSymbol(symbol)) => {
                let symbol = symbol.strip_prefix('.').unwrap_or(symbol);
                self.symbols
                    .get(symbol)
                    .and_then(|file| self.files_from(file))
                    .ok_or_else(|| not_found("symbol", symbol))
            }
            Some(MessageRequest::FileContainingExtension(ext)) => {
                let extendee = ext.containing_type.strip_prefix('.').unwrap_or(&ext.containing_type);
                self.extensions
                    .get(extendee)
                    .and_then(|numbers| numbers.get(&ext.extension_number))
                    .and_then(|file| self.files_from(file))
                    .ok_or_else(|| {
                        not_found("extension", &format!("{extendee} field {}", ext.extension_number))
                    })
            }
            Some(MessageRequest::AllExtensionNumbersOfType(name)) => {
                let name = name.strip_prefix('.').unwrap_or(name);
                if self.messages.contains(name) {
                    let numbers =
                        self.extensions.get(name).map(|n| n.keys().copied().collect()).unwrap_or_default();
                    Ok(MessageResponse::AllExtensionNumbersResponse(ExtensionNumberResponse {
                        base_type_name: name.to_owned(),
                        extension_number: numbers,
                    }))
                } else {
                    Err(not_found("message type", name))
                }
            }
            Some(MessageRequest::ListServices(_)) => {
                Ok(MessageResponse::ListServicesResponse(ListServiceResponse {
                    service: self
                        .services
                        .iter()
                        .map(|name| ServiceResponse { name: name.clone() })
                        .collect(),
                }))
            }
            None => Err(ErrorResponse {
                error_code: Code::InvalidArgument as i32,
                error_message: "the request names no message_request (file_by_filename, \
                                file_containing_symbol, file_containing_extension, \
                                all_extension_numbers_of_type or list_services)"
                    .into(),
            }),
        };
        ServerReflectionResponse {
            valid_host: request.host.clone(),
            original_request: Some(request.clone()),
            message_response: Some(response.unwrap_or_else(MessageResponse::ErrorResponse)),
        }
    }

    /// `name`'s file, then the files it imports, transitively, each once; `None` when the pool
    /// has no file `name`. An import the pool lacks is left out.
    fn files_from(&self, name: &str) -> Option<MessageResponse> {
        self.files.get(name)?;
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut queue: Vec<&str> = vec![name];
        let mut out = Vec::new();
        while let Some(next) = queue.pop() {
            if !seen.insert(next) {
                continue;
            }
            let Some(file) = self.files.get(next) else { continue };
            out.push(file.encoded.clone());
            // Reversed: the pops then take the imports in declaration order.
            queue.extend(file.dependencies.iter().rev().map(String::as_str));
        }
        Some(MessageResponse::FileDescriptorResponse(FileDescriptorResponse { file_descriptor_proto: out }))
    }
}

/// The NOT_FOUND error response for a `what` named `name`.
fn not_found(what: &str, name: &str) -> ErrorResponse {
    let quoted: String = name.chars().take(NAME_QUOTED).collect();
    ErrorResponse {
        error_code: Code::NotFound as i32,
        error_message: format!("{what} not found: {quoted:?}"),
    }
}

/// Indexes message `full` (its fields, oneofs, nested messages, enums and extensions).
fn index_message(
    full: &str,
    m: &DescriptorProto,
    symbols: &mut Vec<String>,
    messages: &mut BTreeSet<String>,
) {
    messages.insert(full.to_owned());
    symbols.push(full.to_owned());
    symbols.extend(m.field.iter().map(|f| format!("{full}.{}", f.name())));
    symbols.extend(m.oneof_decl.iter().map(|o| format!("{full}.{}", o.name())));
    symbols.extend(m.extension.iter().map(|x| format!("{full}.{}", x.name())));
    for nested in &m.nested_type {
        index_message(&format!("{full}.{}", nested.name()), nested, symbols, messages);
    }
    for e in &m.enum_type {
        index_enum(full, e, symbols);
    }
}

/// Indexes enum `e` declared in `scope` (a package or a message); its values are the enum's
/// siblings, as protobuf scopes them (`pkg.Color` and `pkg.RED`).
fn index_enum(scope: &str, e: &EnumDescriptorProto, symbols: &mut Vec<String>) {
    let join = |n: &str| if scope.is_empty() { n.to_owned() } else { format!("{scope}.{n}") };
    symbols.push(join(e.name()));
    symbols.extend(e.value.iter().map(|v| join(v.name())));
}

/// Every extension declared at the top of a file or in its messages: (extended message, number).
fn collect_extensions(
    top: &[FieldDescriptorProto],
    messages: &[DescriptorProto],
    out: &mut Vec<(String, i32)>,
) {
    for x in top {
        let extendee = x.extendee().strip_prefix('.').unwrap_or(x.extendee());
        out.push((extendee.to_owned(), x.number()));
    }
    for m in messages {
        collect_extensions(&m.extension, &m.nested_type, out);
    }
}

#[cfg(test)]
mod tests {
    use prost_types::{
        field_descriptor_proto::{Label, Type},
        EnumValueDescriptorProto, FileDescriptorProto, MethodDescriptorProto, OneofDescriptorProto,
        ServiceDescriptorProto,
    };

    use super::*;
    use crate::reflection::v1::ExtensionRequest;

    fn field(name: &str, number: i32) -> FieldDescriptorProto {
        FieldDescriptorProto {
            name: Some(name.into()),
            number: Some(number),
            label: Some(Label::Optional as i32),
            r#type: Some(Type::String as i32),
            ..Default::default()
        }
    }

    /// `base.proto` (package `base`, message `Base` with extension range, enum `Color`) and
    /// `svc.proto` (package `app`, imports base.proto; message `Outer.Inner`, a oneof, service
    /// `Svc.Get`, an extension of `base.Base` at 100 and one nested in `Outer` at 101).
    fn sets() -> Vec<u8> {
        let base = FileDescriptorProto {
            name: Some("base.proto".into()),
            package: Some("base".into()),
            message_type: vec![DescriptorProto {
                name: Some("Base".into()),
                field: vec![field("id", 1)],
                ..Default::default()
            }],
            enum_type: vec![EnumDescriptorProto {
                name: Some("Color".into()),
                value: vec![EnumValueDescriptorProto {
                    name: Some("RED".into()),
                    number: Some(0),
                    options: None,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let ext = |name: &str, number| FieldDescriptorProto {
            extendee: Some(".base.Base".into()),
            ..field(name, number)
        };
        let svc = FileDescriptorProto {
            name: Some("svc.proto".into()),
            package: Some("app".into()),
            dependency: vec!["base.proto".into()],
            message_type: vec![DescriptorProto {
                name: Some("Outer".into()),
                nested_type: vec![DescriptorProto { name: Some("Inner".into()), ..Default::default() }],
                oneof_decl: vec![OneofDescriptorProto { name: Some("choice".into()), options: None }],
                extension: vec![ext("nested_ext", 101)],
                ..Default::default()
            }],
            extension: vec![ext("top_ext", 100)],
            service: vec![ServiceDescriptorProto {
                name: Some("Svc".into()),
                method: vec![MethodDescriptorProto {
                    name: Some("Get".into()),
                    input_type: Some(".app.Outer".into()),
                    output_type: Some(".base.Base".into()),
                    ..Default::default()
                }],
                options: None,
            }],
            ..Default::default()
        };
        FileDescriptorSet { file: vec![base, svc] }.encode_to_vec()
    }

    fn index() -> DescriptorIndex {
        let set = sets();
        DescriptorIndex::new(
            ["app.Svc", "grpc.health.v1.Health", "app.Svc"],
            [set.as_slice(), b"\xff garbage"],
        )
    }

    fn ask(index: &DescriptorIndex, request: MessageRequest) -> MessageResponse {
        let request = ServerReflectionRequest { host: "h".into(), message_request: Some(request) };
        let response = index.answer(&request);
        assert_eq!(response.valid_host, "h");
        assert_eq!(response.original_request.as_ref(), Some(&request));
        response.message_response.unwrap()
    }

    fn file_names(response: MessageResponse) -> Vec<String> {
        let MessageResponse::FileDescriptorResponse(files) = response else { panic!("{response:?}") };
        files
            .file_descriptor_proto
            .iter()
            .map(|b| FileDescriptorProto::decode(b.as_ref()).unwrap().name().to_owned())
            .collect()
    }

    fn error_code(response: MessageResponse) -> i32 {
        let MessageResponse::ErrorResponse(e) = response else { panic!("{response:?}") };
        e.error_code
    }

    #[test]
    fn services_are_listed_once_each_in_order() {
        let MessageResponse::ListServicesResponse(list) =
            ask(&index(), MessageRequest::ListServices(String::new()))
        else {
            panic!()
        };
        let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["app.Svc", "grpc.health.v1.Health"]);
    }

    #[test]
    fn every_kind_of_symbol_finds_its_file_with_the_imports() {
        let index = index();
        for symbol in [
            "app.Svc",
            "app.Svc.Get",
            "app.Outer",
            ".app.Outer.Inner",
            "app.Outer.choice",
            "app.top_ext",
            "app.Outer.nested_ext",
        ] {
            assert_eq!(
                file_names(ask(&index, MessageRequest::FileContainingSymbol(symbol.into()))),
                ["svc.proto", "base.proto"],
                "{symbol}"
            );
        }
        for symbol in ["base.Base", "base.Base.id", "base.Color", "base.RED"] {
            assert_eq!(
                file_names(ask(&index, MessageRequest::FileContainingSymbol(symbol.into()))),
                ["base.proto"]
            );
        }
        for unknown in ["app", "app.Missing", "Outer", "app.Svc.Put", ""] {
            assert_eq!(
                error_code(ask(&index, MessageRequest::FileContainingSymbol(unknown.into()))),
                Code::NotFound as i32,
                "{unknown}"
            );
        }
    }

    #[test]
    fn files_by_name_and_unknown_names() {
        let index = index();
        assert_eq!(
            file_names(ask(&index, MessageRequest::FileByFilename("svc.proto".into()))),
            ["svc.proto", "base.proto"]
        );
        assert_eq!(
            file_names(ask(&index, MessageRequest::FileByFilename("base.proto".into()))),
            ["base.proto"]
        );
        let long = "x".repeat(10_000);
        let MessageResponse::ErrorResponse(e) = ask(&index, MessageRequest::FileByFilename(long)) else {
            panic!()
        };
        assert_eq!(e.error_code, Code::NotFound as i32);
        assert!(e.error_message.len() < 300, "a peer's name is quoted short: {}", e.error_message);
    }

    #[test]
    fn extensions_by_number_and_all_numbers_of_a_type() {
        let index = index();
        let ext = |t: &str, n| {
            MessageRequest::FileContainingExtension(ExtensionRequest {
                containing_type: t.into(),
                extension_number: n,
            })
        };
        assert_eq!(file_names(ask(&index, ext("base.Base", 100))), ["svc.proto", "base.proto"]);
        assert_eq!(file_names(ask(&index, ext("base.Base", 101))), ["svc.proto", "base.proto"]);
        assert_eq!(error_code(ask(&index, ext("base.Base", 7))), Code::NotFound as i32);
        assert_eq!(error_code(ask(&index, ext("base.Nope", 100))), Code::NotFound as i32);
        let MessageResponse::AllExtensionNumbersResponse(n) =
            ask(&index, MessageRequest::AllExtensionNumbersOfType("base.Base".into()))
        else {
            panic!()
        };
        assert_eq!((n.base_type_name.as_str(), n.extension_number), ("base.Base", vec![100, 101]));
        let MessageResponse::AllExtensionNumbersResponse(n) =
            ask(&index, MessageRequest::AllExtensionNumbersOfType("app.Outer.Inner".into()))
        else {
            panic!()
        };
        assert!(n.extension_number.is_empty(), "a known message without extensions: no numbers");
        assert_eq!(
            error_code(ask(&index, MessageRequest::AllExtensionNumbersOfType("base.Color".into()))),
            Code::NotFound as i32
        );
    }

    #[test]
    fn a_request_of_no_kind_is_an_invalid_argument_response() {
        let response =
            index().answer(&ServerReflectionRequest { host: String::new(), message_request: None });
        assert_eq!(error_code(response.message_response.unwrap()), Code::InvalidArgument as i32);
    }
}
