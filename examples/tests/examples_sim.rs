//! The examples end to end on `sim` in this process (yielding policy: tests share two cores).

use rpc_core::{ClientConfig, PollingPolicy, Server, Transport};
use rpc_examples::greeter::MyGreeter;
use rpc_examples::helloworld::greeter_client::GreeterClient;
use rpc_examples::helloworld::greeter_server::GreeterServer;
use rpc_examples::helloworld::HelloRequest;
use rpc_examples::kv::kv_client::KvClient;
use rpc_examples::kv::kv_server::KvServer;
use rpc_examples::kv::GetRequest;
use rpc_examples::kv_store::KvStore;

const POLL: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

#[test]
fn hello_round_trip_and_bad_name() {
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(POLL)
        .add_service(GreeterServer::new(MyGreeter))
        .spawn("127.0.0.1:0")
        .unwrap();
    let cfg = ClientConfig::default().transport(Transport::Sim).polling(POLL);
    let client = GreeterClient::connect_with(server.local_addr(), &cfg).unwrap();
    let r = client.say_hello(&HelloRequest { name: "rdma".into() }).unwrap();
    assert_eq!(r.message, "Hello rdma");
    let e = client.say_hello(&HelloRequest { name: "x".repeat(2000) }).unwrap_err();
    assert_eq!(e.code(), rpc_core::Code::InvalidArgument);
    assert!(e.message().contains("2000 bytes"), "{}", e.message());
    drop(client);
    server.shutdown();
}

#[test]
fn kv_workload_checks_every_answer() {
    let server = Server::builder()
        .transport(Transport::Sim)
        .polling(POLL)
        .ring_bytes(32 << 20)
        .max_peer_ring_bytes(32 << 20)
        .add_service(KvServer::new(KvStore::default()))
        .spawn("127.0.0.1:0")
        .unwrap();
    let cfg = ClientConfig::default().transport(Transport::Sim).polling(POLL).ring_bytes(32 << 20);
    let client = KvClient::connect_with(server.local_addr(), &cfg).unwrap();
    let mut log = Vec::new();
    let calls = rpc_examples::kv_workload::run(&client, &mut log).unwrap();
    assert_eq!(calls, 2 * rpc_examples::kv_workload::SIZES.len() as u64 + 2 + 3 + 2);
    let log = String::from_utf8(log).unwrap();
    assert!(log.contains("get      key-010     6291456"), "{log}");
    let e = client.get(&GetRequest { key: String::new() }).unwrap_err();
    assert_eq!(e.code(), rpc_core::Code::InvalidArgument);
    drop(client);
    server.shutdown();
}

/// `hello-auth`: a call without a token is refused UNAUTHENTICATED by the server's interceptor;
/// the client interceptor's token and a `Request`'s token pass.
#[test]
fn hello_auth_refuses_a_call_without_a_token() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hello-auth")).output().expect("run hello-auth");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("with the client interceptor's token: Hello auth"), "{text}");
    assert!(text.contains("without a token: refused: UNAUTHENTICATED"), "{text}");
    assert!(text.contains("with a Request's token: Hello auth"), "{text}");
}

/// `hello-tokio`: one channel shared by tasks of a multi-thread runtime, every reply checked by
/// the program itself (it exits non-zero on a wrong or missing reply).
#[test]
fn hello_tokio_shares_one_channel_between_tasks() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hello-tokio"))
        .args(["--tasks", "8", "--calls", "200", "--poll", "yield"])
        .output()
        .expect("run hello-tokio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("client: 1600 replies from 8 tasks over one channel, all checked"), "{stdout}");
}

/// `route-guide`: tonic's route_guide, all four RPC shapes through a blocking client and a
/// channel, every answer checked by the program itself (it exits non-zero on a wrong one).
#[test]
fn route_guide_checks_all_four_shapes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_route-guide"))
        .args(["--poll", "yield"])
        .output()
        .expect("run route-guide");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "GetFeature: 3 points, checked",
        "ListFeatures: 24 features in the rectangle, checked",
        "RecordRoute: 42 points, ",
        "RouteChat: 12 notes, 12 notes back, checked",
        "route-guide: blocking client: all four RPC shapes checked",
        "route-guide: channel from tokio tasks: all four RPC shapes checked",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
}

/// Every binary, given a bad value of a shared flag or a flag it does not have, stops before
/// doing anything with clap's error naming the flag and exit status 2.
#[test]
fn every_binary_refuses_bad_flags_with_clap_error() {
    let binaries = [
        env!("CARGO_BIN_EXE_hello"),
        env!("CARGO_BIN_EXE_hello-tokio"),
        env!("CARGO_BIN_EXE_hello-auth"),
        env!("CARGO_BIN_EXE_hello-server"),
        env!("CARGO_BIN_EXE_hello-client"),
        env!("CARGO_BIN_EXE_kv"),
        env!("CARGO_BIN_EXE_kv-server"),
        env!("CARGO_BIN_EXE_kv-client"),
        env!("CARGO_BIN_EXE_route-guide"),
        env!("CARGO_BIN_EXE_route-guide-server"),
        env!("CARGO_BIN_EXE_route-guide-client"),
    ];
    let cases: [(&[&str], &str); 4] = [
        (&["--transport", "tcp"], "invalid value 'tcp' for '--transport <TRANSPORT>'"),
        (&["-x", "256"], "invalid value '256' for '--gid-index <GID_INDEX>'"),
        (&["--ib-port", "0"], "invalid value '0' for '--ib-port <IB_PORT>'"),
        (&["--no-such-flag"], "unexpected argument '--no-such-flag'"),
    ];
    for bin in binaries {
        for (args, error) in cases {
            let out = std::process::Command::new(bin).args(args).output().expect("run the binary");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {stderr}");
            assert!(stderr.contains(error), "{bin} {args:?}: no {error:?} in {stderr:?}");
            assert!(
                out.stdout.is_empty(),
                "{bin} {args:?} printed {:?}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}
