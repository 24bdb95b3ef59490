//! `rpc-perf call` and `rpc-perf bench` without `--proto`: the schema from the server's reflection
//! service (grpcurl's way), against in-process servers on `sim` (yielding polling), one with
//! `add_reflection()` and one without (the error says to pass `--proto`).

use clap::Parser;
use rpc_core::{PollingPolicy, Server, ServerHandle, Transport};
use rpc_perf::dynamic::args::{BenchArgs, CallArgs, Command as Sub};
use rpc_perf::rpc::pb::bench_server::BenchServer;
use rpc_perf::rpc::BenchService;

const POLL: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

/// The benchmark service, with reflection (and health) or without.
fn server(reflection: bool) -> ServerHandle {
    let b = Server::builder()
        .transport(Transport::Sim)
        .polling(POLL)
        .add_service(BenchServer::new(BenchService::default()));
    let b = if reflection { b.add_reflection().add_health_service() } else { b };
    b.spawn("127.0.0.1:0").expect("bench server starts")
}

fn parse(argv: &[&str]) -> Sub {
    let mut full = vec!["rpc-perf"];
    full.extend_from_slice(argv);
    rpc_perf::Args::try_parse_from(full).unwrap().command.expect("a subcommand")
}

fn call(argv: &[&str]) -> Result<String, String> {
    let mut v = vec!["call", "--transport", "sim", "--poll", "yield"];
    v.extend_from_slice(argv);
    let Sub::Call(a): Sub = parse(&v) else { panic!("call") };
    let a: CallArgs = a;
    rpc_perf::dynamic::call::run(&a).map_err(|e| e.to_string())
}

fn bench(argv: &[&str]) -> Result<rpc_perf::dynamic::bench::BenchReport, String> {
    let mut v = vec!["bench", "--transport", "sim", "--poll", "yield", "--no-progress"];
    v.extend_from_slice(argv);
    let Sub::Bench(a): Sub = parse(&v) else { panic!("bench") };
    let a: BenchArgs = a;
    rpc_perf::dynamic::bench::run(&a).map_err(|e| e.to_string())
}

/// `call` without `--proto` fetches the service's files by reflection and calls as with
/// `--proto`; `--list` (and grpcurl's `list`) lists the server's services with their methods;
/// `--describe` a message; an unknown service is named with the services the server has.
#[test]
fn call_without_proto_uses_the_servers_reflection() {
    let h = server(true);
    let addr = h.local_addr().to_string();
    let out = call(&[&addr, "rpcperf.Bench/Echo", "--data", r#"{"payload":"AAE=","respSize":5}"#]).unwrap();
    assert_eq!(out, "{\n  \"payload\": \"paWlpaU=\"\n}\n");

    let list = call(&[&addr, "--list"]).unwrap();
    assert_eq!(call(&[&addr, "list"]).unwrap(), list, "grpcurl's `list` form");
    for line in [
        "rpcperf.Bench\n",
        "  rpcperf.Bench/Echo(rpcperf.EchoRequest) returns (rpcperf.EchoReply)\n",
        "grpc.health.v1.Health\n",
        "  grpc.health.v1.Health/Check(grpc.health.v1.HealthCheckRequest) returns (grpc.health.v1.HealthCheckResponse)\n",
        "grpc.reflection.v1.ServerReflection\n",
    ] {
        assert!(list.contains(line), "{line:?} in the listing:\n{list}");
    }

    let described = call(&[&addr, "--describe", "rpcperf.EchoRequest"]).unwrap();
    assert!(described.contains("payload"), "{described}");

    let e = call(&[&addr, "no.Such/Method"]).unwrap_err();
    assert!(e.contains("does not know `no.Such`") && e.contains("rpcperf.Bench"), "{e}");
    h.shutdown();
}

/// `bench` without `--proto` resolves the method by reflection and runs.
#[test]
fn bench_without_proto_uses_the_servers_reflection() {
    let h = server(true);
    let addr = h.local_addr().to_string();
    let rep = bench(&[
        &addr,
        "rpcperf.Bench/Echo",
        "--data",
        r#"{"respSize":8}"#,
        "-n",
        "20",
        "--warmup",
        "2",
        "--check",
    ])
    .unwrap();
    assert_eq!(rep.calls, 20);
    assert_eq!(rep.status_counts.get("OK"), Some(&20));
    assert_eq!(rep.undecodable, 0);
    h.shutdown();
}

/// A server without reflection: `call` and `bench` without `--proto` say to pass it.
#[test]
fn a_server_without_reflection_gets_the_hint_to_pass_proto() {
    let h = server(false);
    let addr = h.local_addr().to_string();
    for e in [
        call(&[&addr, "rpcperf.Bench/Echo"]).unwrap_err(),
        call(&[&addr, "--list"]).unwrap_err(),
        bench(&[&addr, "rpcperf.Bench/Echo", "-n", "5"]).map(drop).unwrap_err(),
    ] {
        assert!(e.contains("does not serve reflection") && e.contains("--proto FILE.proto"), "{e}");
    }
    h.shutdown();
}
