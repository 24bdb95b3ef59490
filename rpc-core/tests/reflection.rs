//! The `grpc.reflection.v1.ServerReflection` service end to end on `sim` (yielding polling): a
//! server with `add_reflection` lists its services, answers files by symbol (a method, a nested
//! enum), by name and by extension, NOT_FOUND error responses for unknown names without ending
//! the stream, several requests on one stream in order; a server without it answers
//! UNIMPLEMENTED. (Nested messages and files with imports, through real generated code:
//! `codegen-tests/tests/e2e_reflection.rs`.)

mod rpc_support;

use prost::Message as _;
use prost_types::FileDescriptorProto;
use rpc_core::codegen::*;
use rpc_core::reflection::v1::ExtensionRequest;
use rpc_core::reflection::{
    MessageRequest, MessageResponse, ServerReflectionClient, ServerReflectionRequest,
};
use rpc_support::*;

/// A blocking reflection stub on its own session.
fn reflection_client(server: &rpc_core::ServerHandle) -> ServerReflectionClient {
    ServerReflectionClient::connect_with(server.local_addr(), &client_config()).unwrap()
}

/// Sends `request` on `stream` and takes its answer.
#[track_caller]
fn ask(
    stream: &mut BidiStreaming<'_, ServerReflectionRequest, rpc_core::reflection::ServerReflectionResponse>,
    request: MessageRequest,
) -> MessageResponse {
    let request = ServerReflectionRequest { host: "here".into(), message_request: Some(request) };
    stream.send(&request).unwrap();
    let response = match stream.message() {
        Ok(Some(r)) => r,
        other => fail(&format!("the reflection stream ended or failed where an answer was due: {other:?}")),
    };
    assert_eq!(response.original_request.as_ref(), Some(&request), "the request is echoed");
    assert_eq!(response.valid_host, "here");
    response.message_response.unwrap_or_else(|| fail("an answer without a message_response"))
}

/// The names of the files of a file descriptor response, in order.
#[track_caller]
fn files(response: MessageResponse) -> Vec<String> {
    let MessageResponse::FileDescriptorResponse(r) = response else {
        fail(&format!("not files: {response:?}"))
    };
    r.file_descriptor_proto
        .iter()
        .map(|b| FileDescriptorProto::decode(b.as_ref()).unwrap().name().to_owned())
        .collect()
}

/// The code and message of an error response.
#[track_caller]
fn error(response: MessageResponse) -> (i32, String) {
    let MessageResponse::ErrorResponse(e) = response else { fail(&format!("not an error: {response:?}")) };
    (e.error_code, e.error_message)
}

const HEALTH_FILE: &str = "grpc/health/v1/health.proto";
const REFLECTION_FILE: &str = "grpc/reflection/v1/reflection.proto";

/// One stream, many requests, each answered in order: the services added (the hand-written test
/// service, which carries no descriptors, health, and reflection itself), files by a method's
/// and a nested enum's name, by file name, an unknown symbol and file (NOT_FOUND, the stream
/// goes on), extension requests (the pool has none: NOT_FOUND, an empty list), then a clean end.
#[test]
fn one_stream_answers_every_request_kind_in_order() {
    let (server, _) = spawn(server().add_reflection().add_health_service());
    let client = reflection_client(&server);
    let mut stream = client.server_reflection_info_with(&CallOptions::deadline(WAIT)).unwrap();

    let MessageResponse::ListServicesResponse(list) =
        ask(&mut stream, MessageRequest::ListServices(String::new()))
    else {
        fail("list_services gets a list")
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(names, [rpc_core::health::SERVICE_NAME, rpc_core::reflection::SERVICE_NAME, SERVICE]);

    let by_symbol = |stream: &mut _, s: &str| ask(stream, MessageRequest::FileContainingSymbol(s.into()));
    assert_eq!(files(by_symbol(&mut stream, "grpc.health.v1.Health.Check")), [HEALTH_FILE], "a method");
    assert_eq!(files(by_symbol(&mut stream, "grpc.health.v1.Health")), [HEALTH_FILE], "a service");
    assert_eq!(
        files(by_symbol(&mut stream, "grpc.health.v1.HealthCheckResponse.ServingStatus")),
        [HEALTH_FILE],
        "a nested enum"
    );
    assert_eq!(
        files(by_symbol(&mut stream, "grpc.reflection.v1.ServerReflectionRequest")),
        [REFLECTION_FILE],
        "reflection describes itself"
    );

    let (code, message) = error(by_symbol(&mut stream, "no.such.Symbol"));
    assert_eq!(code, Code::NotFound as i32);
    assert!(message.contains("no.such.Symbol"), "names the symbol: {message}");
    // The test service is listed but has no descriptors.
    assert_eq!(error(by_symbol(&mut stream, SERVICE)).0, Code::NotFound as i32);

    let file = ask(&mut stream, MessageRequest::FileByFilename(HEALTH_FILE.into()));
    let MessageResponse::FileDescriptorResponse(r) = &file else { fail("files") };
    let health = FileDescriptorProto::decode(r.file_descriptor_proto[0].as_ref()).unwrap();
    assert_eq!(health.package(), "grpc.health.v1");
    assert_eq!(health.service[0].method.len(), 2, "Check and Watch");
    assert_eq!(
        error(ask(&mut stream, MessageRequest::FileByFilename("nope.proto".into()))).0,
        Code::NotFound as i32
    );

    let ext = ExtensionRequest {
        containing_type: "grpc.health.v1.HealthCheckRequest".into(),
        extension_number: 100,
    };
    assert_eq!(
        error(ask(&mut stream, MessageRequest::FileContainingExtension(ext))).0,
        Code::NotFound as i32
    );
    let MessageResponse::AllExtensionNumbersResponse(n) = ask(
        &mut stream,
        MessageRequest::AllExtensionNumbersOfType("grpc.health.v1.HealthCheckRequest".into()),
    ) else {
        fail("a known message gets its (empty) list of extension numbers")
    };
    assert!(n.extension_number.is_empty());
    assert_eq!(n.base_type_name, "grpc.health.v1.HealthCheckRequest");

    // Still answering after the errors; then the client's end is answered with the clean end.
    assert_eq!(files(by_symbol(&mut stream, "grpc.health.v1.Health.Watch")), [HEALTH_FILE]);
    stream.finish();
    assert!(matches!(stream.message(), Ok(None)), "the stream ends OK after the client's end");
    drop(stream);
    drop(client);
    server.shutdown();
}

/// A server without `add_reflection` answers the method UNIMPLEMENTED (what `rpc-perf` turns
/// into "pass --proto").
#[test]
fn a_server_without_reflection_answers_unimplemented() {
    let (server, _) = spawn(server());
    let client = reflection_client(&server);
    let mut stream = client.server_reflection_info_with(&CallOptions::deadline(WAIT)).unwrap();
    let request = ServerReflectionRequest::new(MessageRequest::ListServices(String::new()));
    // The send may already see the answer, or the first read does.
    let status = match stream.send(&request) {
        Err(s) => s,
        Ok(()) => stream.message().expect_err("no reflection service: the stream fails"),
    };
    assert_eq!(status.code(), Code::Unimplemented, "{status}");
    drop(stream);
    drop(client);
    server.shutdown();
}
