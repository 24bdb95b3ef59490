//! Reflection over real generated code, on `sim`: services added with their generated adapters
//! plus `add_reflection()` are described from the `FILE_DESCRIPTOR_SET` codegen emitted, a nested
//! message and a method found by name, each file sent with the files it imports (another package
//! of ours, and the bundled `google/protobuf/*.proto`).

use prost::Message as _;
use prost_types::{FileDescriptorProto, FileDescriptorSet};
use rpc_core::codegen::{CallOptions, ClientConfig};
use rpc_core::reflection::{
    MessageRequest, MessageResponse, ServerReflectionClient, ServerReflectionRequest,
};
use rpc_core::{PollingPolicy, Server, Transport};

use codegen_tests::codegen::{deep, well_known};
use codegen_tests::services::Impl;

const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

/// The file names of the answer to `request`, in order.
fn ask_files(client: &ServerReflectionClient, requests: &[MessageRequest]) -> Vec<Vec<String>> {
    let mut stream = client
        .server_reflection_info_with(&CallOptions::deadline(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut out = Vec::new();
    for r in requests {
        stream.send(&ServerReflectionRequest::new(r.clone())).unwrap();
        let answer = stream.message().unwrap().expect("an answer").message_response.expect("a response");
        let MessageResponse::FileDescriptorResponse(files) = answer else { panic!("{r:?}: {answer:?}") };
        out.push(
            files
                .file_descriptor_proto
                .iter()
                .map(|b| FileDescriptorProto::decode(b.as_ref()).unwrap().name().to_owned())
                .collect(),
        );
    }
    out
}

#[test]
fn generated_services_are_described_with_their_imports() {
    // The constant itself: the package's file after its imports.
    let set = FileDescriptorSet::decode(deep::FILE_DESCRIPTOR_SET).unwrap();
    let names: Vec<&str> = set.file.iter().map(|f| f.name()).collect();
    assert_eq!(names, ["codegen/common.proto", "codegen/deep/outer.proto"]);

    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(POLLING)
        .add_reflection()
        .add_service(deep::ledger_server::LedgerServer::new(Impl))
        .add_service(well_known::clock_server::ClockServer::new(Impl))
        .spawn("127.0.0.1:0")
        .unwrap();
    let config = ClientConfig::default().transport(Transport::Sim).polling(POLLING);
    let client = ServerReflectionClient::connect_with(server.local_addr(), &config).unwrap();
    let answers = ask_files(
        &client,
        &[
            MessageRequest::FileContainingSymbol("codegen.deep.Outer.Inner".into()),
            MessageRequest::FileContainingSymbol("codegen.deep.Ledger.Annotate".into()),
            MessageRequest::FileByFilename("codegen/deep/outer.proto".into()),
            MessageRequest::FileContainingSymbol("codegen.well_known.Clock".into()),
        ],
    );
    let outer = ["codegen/deep/outer.proto", "codegen/common.proto"];
    assert_eq!(answers[0], outer, "a nested message: its file, then the file it imports");
    assert_eq!(answers[1], outer, "a method");
    assert_eq!(answers[2], outer, "by file name");
    assert_eq!(answers[3][0], "codegen/well_known.proto");
    let mut imports = answers[3][1..].to_vec();
    imports.sort();
    assert_eq!(
        imports,
        ["google/protobuf/duration.proto", "google/protobuf/empty.proto", "google/protobuf/timestamp.proto"],
        "the well-known types' files are sent too"
    );
    drop(client);
    server.shutdown();
}
