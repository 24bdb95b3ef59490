//! `rpc-perf call` and `rpc-perf bench` against an in-process server of the benchmark service on
//! `sim` (yielding polling: tests share two cores), and their error paths, each asserted by its
//! message; the dynamic method ids against rpc-codegen's on every .proto of the repository.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use rpc_core::{Code, PollingPolicy, Server, ServerHandle, Transport};
use rpc_perf::dynamic::args::{BenchArgs, CallArgs, Command as Sub};
use rpc_perf::dynamic::schema::{wire_name, Schema};
use rpc_perf::rpc::pb::bench_server::BenchServer;
use rpc_perf::rpc::BenchService;

const POLL: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

fn proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto")
}

fn bench_proto() -> String {
    proto_dir().join("bench.proto").display().to_string()
}

fn server() -> ServerHandle {
    Server::builder()
        .transport(Transport::Sim)
        .polling(POLL)
        .add_service(BenchServer::new(BenchService::default()))
        .spawn("127.0.0.1:0")
        .expect("bench server starts")
}

fn parse(argv: &[&str]) -> Sub {
    let mut full = vec!["rpc-perf"];
    full.extend_from_slice(argv);
    rpc_perf::Args::try_parse_from(full).unwrap().command.expect("a subcommand")
}

fn call_args(argv: &[&str]) -> CallArgs {
    let mut v = vec!["call", "--transport", "sim", "--poll", "yield"];
    v.extend_from_slice(argv);
    match parse(&v) {
        Sub::Call(c) => c,
        other => panic!("{other:?}"),
    }
}

fn bench_args(argv: &[&str]) -> BenchArgs {
    let mut v = vec!["bench", "--transport", "sim", "--poll", "yield", "--no-progress"];
    v.extend_from_slice(argv);
    match parse(&v) {
        Sub::Bench(b) => b,
        other => panic!("{other:?}"),
    }
}

fn call(argv: &[&str]) -> Result<String, String> {
    rpc_perf::dynamic::call::run(&call_args(argv)).map_err(|e| e.to_string())
}

/// The server's counters once it has published `rpcs` calls (it publishes in batches).
fn server_counters(h: &ServerHandle, rpcs: u64) -> rpc_core::Counters {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let c = h.counters();
        if c.rpcs >= rpcs || Instant::now() > until {
            return c;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn method_ids_are_the_ones_codegen_emits() {
    // Every compilable .proto of the repository (the errors/ ones are meant not to compile).
    let dir = proto_dir();
    let mut files = vec![dir.join("bench.proto"), dir.join("helloworld.proto"), dir.join("kv.proto")];
    for sub in ["codegen", "codegen/deep", "codegen/deep/inner"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "proto") {
                files.push(e.path());
            }
        }
    }
    let mut checked = 0;
    for f in &files {
        let schema = Schema::compile(std::slice::from_ref(f), std::slice::from_ref(&dir)).unwrap();
        for svc in schema.services() {
            for m in svc.methods() {
                let pkg = svc.parent_file().package_name().to_owned();
                let codegen =
                    rpc_codegen::method_id(&rpc_codegen::full_method_name(&pkg, svc.name(), m.name()));
                assert_eq!(rpc_core::codegen::method_id(&wire_name(&m)), codegen, "{}", wire_name(&m));
                if !m.is_client_streaming() && !m.is_server_streaming() {
                    let name = format!("{}/{}", svc.full_name(), m.name());
                    assert_eq!(schema.unary_method(&name).unwrap().id, codegen, "{name}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "only {checked} methods found");
    // And the literal rpc-codegen emitted for the benchmark service.
    let s = Schema::compile(&[dir.join("bench.proto")], &[]).unwrap();
    assert_eq!(s.unary_method("rpcperf.Bench/Echo").unwrap().id, rpc_perf::rpc::pb::bench_server::ECHO);
    // A file without a package: "/Service/Method".
    let s = Schema::compile(&[dir.join("codegen/no_package.proto")], std::slice::from_ref(&dir)).unwrap();
    assert_eq!(s.unary_method("Pinger/Ping").unwrap().full_name, "/Pinger/Ping");
}

#[test]
fn call_prints_the_reply_as_json() {
    let h = server();
    let addr = h.local_addr().to_string();
    let proto = bench_proto();
    let out = call(&[
        &addr,
        "rpcperf.Bench/Echo",
        "--proto",
        &proto,
        "--data",
        r#"{"payload":"AAE=","respSize":5}"#,
    ])
    .unwrap();
    // Five bytes of 0xa5, base64.
    assert_eq!(out, "{\n  \"payload\": \"paWlpaU=\"\n}\n");
    // The empty reply is `{}`; the deadline flag is accepted.
    let out = call(&[&addr, "rpcperf.Bench/Echo", "--proto", &proto, "--deadline", "5s"]).unwrap();
    assert_eq!(out, "{}\n");
    // The server's own error, shown with its code.
    let e = call(&[&addr, "rpcperf.Bench/Echo", "--proto", &proto, "--data", r#"{"respSize":70000000}"#])
        .unwrap_err();
    assert_eq!(e, "rpcperf.Bench/Echo: INVALID_ARGUMENT: resp_size 70000000 is over the 67108864-byte limit");
    h.shutdown();
}

/// `rpc-perf call` checks a server's health with the standard `grpc/health/v1/health.proto`
/// (its own directory as the import directory): SERVING as JSON, NOT_FOUND for an unknown
/// service; the method id it computes is the one the server's health service answers to.
#[test]
fn call_checks_health_with_the_standard_proto() {
    let h = Server::builder()
        .transport(Transport::Sim)
        .polling(POLL)
        .add_health_service()
        .add_service(BenchServer::new(BenchService::default()))
        .spawn("127.0.0.1:0")
        .expect("bench server starts");
    let addr = h.local_addr().to_string();
    let health = proto_dir().join("grpc/health/v1/health.proto").display().to_string();
    let schema = Schema::compile(&[PathBuf::from(&health)], &[]).unwrap();
    let check = schema.unary_method("grpc.health.v1.Health/Check").unwrap();
    assert_eq!(check.id, rpc_core::health::v1::health_server::CHECK);
    let out = call(&[&addr, "grpc.health.v1.Health/Check", "--proto", &health]).unwrap();
    assert_eq!(out, "{\n  \"status\": \"SERVING\"\n}\n");
    let out = call(&[
        &addr,
        "grpc.health.v1.Health/Check",
        "--proto",
        &health,
        "--data",
        r#"{"service":"rpcperf.Bench"}"#,
    ])
    .unwrap();
    assert_eq!(out, "{\n  \"status\": \"SERVING\"\n}\n");
    let e = call(&[
        &addr,
        "grpc.health.v1.Health/Check",
        "--proto",
        &health,
        "--data",
        r#"{"service":"no.Such"}"#,
    ])
    .unwrap_err();
    assert_eq!(e, r#"grpc.health.v1.Health/Check: NOT_FOUND: unknown service "no.Such""#);
    h.shutdown();
}

#[test]
fn a_method_the_server_does_not_serve_is_unimplemented() {
    let h = server();
    let addr = h.local_addr().to_string();
    let kv = proto_dir().join("kv.proto").display().to_string();
    let e = call(&[&addr, "kv.Kv/Get", "--proto", &kv, "--data", r#"{"key":"a"}"#]).unwrap_err();
    assert!(e.starts_with("kv.Kv/Get: UNIMPLEMENTED: "), "{e}");
    assert!(e.contains("method id 0x"), "{e}");
    assert!(e.contains(&format!("the server at {addr} does not serve /kv.Kv/Get")), "{e}");
    assert!(!e.contains("generated default"), "{e}");
    // bench stops at its probe with the same error.
    let e = rpc_perf::dynamic::bench::run(&bench_args(&[&addr, "kv.Kv/Get", "--proto", &kv, "-n", "10"]))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("kv.Kv/Get: UNIMPLEMENTED: "), "{e}");
    h.shutdown();
}

/// A `kv.Kv` whose `Get` is left to the generated default handler (the very status it answers)
/// and whose `Put` answers a handler's own UNIMPLEMENTED.
struct PartialKv;
impl rpc_core::codegen::Service for PartialKv {
    const NAME: &'static str = "kv.Kv";
    const METHODS: &'static [rpc_core::codegen::MethodDesc] = &[
        rpc_core::codegen::MethodDesc { id: rpc_core::codegen::method_id("/kv.Kv/Get"), name: "/kv.Kv/Get" },
        rpc_core::codegen::MethodDesc { id: rpc_core::codegen::method_id("/kv.Kv/Put"), name: "/kv.Kv/Put" },
    ];
    fn call(
        &self,
        method: rpc_core::codegen::MethodId,
        _ctx: &rpc_core::codegen::RequestContext,
        _body: rpc_core::codegen::Body<'_>,
        out: &mut rpc_core::codegen::ReplyWriter<'_>,
    ) {
        if method == rpc_core::codegen::method_id("/kv.Kv/Get") {
            out.error(rpc_core::Status::method_not_implemented("/kv.Kv/Get"));
        } else {
            out.error(rpc_core::Status::unimplemented("not yet"));
        }
    }
}

#[test]
fn the_unimplemented_hint_follows_what_the_status_says() {
    let h = Server::builder()
        .transport(Transport::Sim)
        .polling(POLL)
        .add_service(PartialKv)
        .spawn("127.0.0.1:0")
        .expect("server starts");
    let addr = h.local_addr().to_string();
    let kv = proto_dir().join("kv.proto").display().to_string();
    // Served, but left to the default handler: no "does not serve".
    let e = call(&[&addr, "kv.Kv/Get", "--proto", &kv, "--data", r#"{"key":"a"}"#]).unwrap_err();
    assert_eq!(
        e,
        format!(
            "kv.Kv/Get: UNIMPLEMENTED: method /kv.Kv/Get is not implemented by this server (its handler is \
             the generated default) (the server at {addr} serves the service but not /kv.Kv/Get: its \
             implementation leaves it to the generated default handler)"
        )
    );
    // A handler's own UNIMPLEMENTED: no hint at all.
    let e = call(&[&addr, "kv.Kv/Put", "--proto", &kv, "--data", r#"{"key":"a"}"#]).unwrap_err();
    assert_eq!(e, "kv.Kv/Put: UNIMPLEMENTED: not yet");
    h.shutdown();
}

#[test]
fn unknown_methods_services_messages_and_bad_json_are_named() {
    let proto = bench_proto();
    // None of these needs a server: they fail before connecting.
    let e = call(&["127.0.0.1:1", "rpcperf.Bench/Nope", "--proto", &proto]).unwrap_err();
    assert_eq!(e, "unknown method `Nope` of service rpcperf.Bench (methods: Echo, Stream, Upload, Exchange)");
    let e = call(&["127.0.0.1:1", "rpcperf.Bnch/Echo", "--proto", &proto]).unwrap_err();
    assert_eq!(e, "unknown service `rpcperf.Bnch` in bench.proto (services: rpcperf.Bench)");
    let e = call(&["--proto", &proto, "--describe", "rpcperf.Nope"]).unwrap_err();
    assert_eq!(
        e,
        "unknown message or service `rpcperf.Nope` in bench.proto (give its full name, package.Name)"
    );
    let e =
        call(&["127.0.0.1:1", "rpcperf.Bench/Echo", "--proto", &proto, "--data", r#"{"respSize":"big"}"#])
            .unwrap_err();
    assert!(e.starts_with("--data: field `respSize` (uint32): "), "{e}");
    assert!(e.ends_with(", got a string"), "{e}");
    let e = call(&["127.0.0.1:1", "rpcperf.Bench/Echo", "--proto", &proto, "--data", r#"{"size":1}"#])
        .unwrap_err();
    assert_eq!(e, "--data: unknown field `size`: message rpcperf.EchoRequest has fields payload, respSize");
    let e = call(&["127.0.0.1:1", "rpcperf.Bench/Echo", "--proto", "/nonexistent.proto"]).unwrap_err();
    assert_eq!(e, "--proto /nonexistent.proto: no such file");
    let streaming = proto_dir().join("codegen/streaming.proto").display().to_string();
    let e = call(&["127.0.0.1:1", "codegen.streaming.Feed/Subscribe", "--proto", &streaming]).unwrap_err();
    assert!(e.contains("is a streaming method"), "{e}");
    let out = call(&["--proto", &proto, "--list"]).unwrap();
    assert_eq!(
        out,
        "rpcperf.Bench\n  rpcperf.Bench/Echo(rpcperf.EchoRequest) returns (rpcperf.EchoReply)\n  \
         rpcperf.Bench/Stream(rpcperf.StreamRequest) returns (stream rpcperf.EchoReply)  [streaming: not callable by rpc-perf]\n  \
         rpcperf.Bench/Upload(stream rpcperf.EchoRequest) returns (rpcperf.StreamRequest)  [streaming: not callable by rpc-perf]\n  \
         rpcperf.Bench/Exchange(stream rpcperf.EchoRequest) returns (stream rpcperf.EchoReply)  [streaming: not callable by rpc-perf]\n"
    );
}

#[test]
fn a_server_port_in_use_says_to_pick_another_with_p() {
    // The port held by a listener of this test; rpc-perf's server listens on 0.0.0.0:PORT.
    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_rpc-perf"))
        .args(["--transport", "sim", "--poll", "yield", "-p", &port])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with(&format!("rpc-perf: error: listening on 0.0.0.0:{port}: ")), "{err}");
    assert!(err.contains("pick another port with -p/--port"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // The RPC server's port (-p + 1) taken: the same hint.
    let e = rpc_perf::run::listen_error("0.0.0.0:1", std::io::ErrorKind::AddrInUse.into()).to_string();
    assert!(e.ends_with(rpc_perf::run::PORT_IN_USE), "{e}");
    // Another listen error gets no such hint.
    let e = rpc_perf::run::listen_error("0.0.0.0:1", std::io::ErrorKind::PermissionDenied.into()).to_string();
    assert!(!e.contains("-p"), "{e}");
}

#[test]
fn an_unreachable_host_is_one_line_and_a_nonzero_exit() {
    let proto = bench_proto();
    let e = call(&["127.0.0.1:1", "rpcperf.Bench/Echo", "--proto", &proto]).unwrap_err();
    assert!(e.starts_with("cannot reach 127.0.0.1:1: UNAVAILABLE: "), "{e}");
    // The address once: the runtime's text names it too.
    assert_eq!(e.matches("127.0.0.1:1").count(), 1, "{e}");
    assert_eq!(e, "cannot reach 127.0.0.1:1: UNAVAILABLE: connect: Connection refused (os error 111)");
    // The binary: one line on stderr, exit 1, nothing on stdout, no panic.
    for sub in ["call", "bench"] {
        let out = Command::new(env!("CARGO_BIN_EXE_rpc-perf"))
            .args([sub, "127.0.0.1:1", "rpcperf.Bench/Echo", "--proto", &proto, "--transport", "sim"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{sub}: {err}");
        assert!(err.starts_with("rpc-perf: error: cannot reach 127.0.0.1:1: UNAVAILABLE: "), "{sub}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{sub}: {err}");
        assert!(!err.contains("panicked"), "{sub}: {err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_rpc-perf"))
        .args(["call", "h", "rpcperf.Bench/Echo", "--proto", &proto, "--data", "{nope"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("rpc-perf: error: --data: invalid JSON: key must be a string at line 1 column 2"),
        "{err}"
    );
}

#[test]
fn bench_counts_exactly_n_calls_and_the_statuses_the_server_answered() {
    let h = server();
    let addr = h.local_addr().to_string();
    let proto = bench_proto();
    let json = std::env::temp_dir().join(format!("rpc-perf-dyn-{}.json", std::process::id()));
    // Round-robin: an answerable request, then one the server refuses (INVALID_ARGUMENT).
    let rep = rpc_perf::dynamic::bench::run(&bench_args(&[
        &addr,
        "rpcperf.Bench/Echo",
        "--proto",
        &proto,
        "--data",
        r#"{"payload":"AAECAw==","respSize":16}"#,
        "--data",
        r#"{"respSize":70000000}"#,
        "-n",
        "101",
        "-c",
        "4",
        "--warmup",
        "6",
        "--check",
        "--json",
        json.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(rep.calls, 101);
    assert_eq!(rep.status_counts.get("OK"), Some(&51));
    assert_eq!(rep.status_counts.get("INVALID_ARGUMENT"), Some(&50));
    assert_eq!(rep.status_counts.len(), 2);
    assert_eq!(rep.undecodable, 0);
    assert_eq!(rep.latency.unwrap().iterations, 51);
    assert_eq!(rep.payload_bytes, vec![8, 5]);
    // The server saw the measured calls plus the probe (payload 0) and 6 warm-up calls (3 of each).
    let c = server_counters(&h, 108);
    assert_eq!(c.rpcs, 108);
    assert_eq!(c.with_code(Code::Ok), 51 + 1 + 3);
    assert_eq!(c.with_code(Code::InvalidArgument), 50 + 3);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(v["status_counts"]["INVALID_ARGUMENT"], 50);
    assert_eq!(
        v["status_messages"]["INVALID_ARGUMENT"],
        "resp_size 70000000 is over the 67108864-byte limit"
    );
    assert_eq!(v["calls"], 101);
    assert_eq!(v["method"], "rpcperf.Bench/Echo");
    h.shutdown();
}

#[test]
fn open_loop_bench_sends_exactly_n_at_the_rate() {
    let h = server();
    let addr = h.local_addr().to_string();
    let proto = bench_proto();
    let plot = std::env::temp_dir().join(format!("rpc-perf-dyn-{}.svg", std::process::id()));
    let rep = rpc_perf::dynamic::bench::run(&bench_args(&[
        &addr,
        "rpcperf.Bench/Echo",
        "--proto",
        &proto,
        "--data",
        r#"{"respSize":32}"#,
        "-n",
        "300",
        "-c",
        "8",
        "--warmup",
        "0",
        "--rate",
        "3000",
        "--plot",
        plot.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(rep.calls, 300);
    assert_eq!(rep.status_counts.get("OK"), Some(&300));
    // 300 calls at 3000/s take at least the 99.7 ms the schedule spans.
    assert!(rep.bandwidth.elapsed_ns >= 99_000_000, "{:?}", rep.bandwidth);
    let svg = std::fs::read_to_string(&plot).unwrap();
    let _ = std::fs::remove_file(&plot);
    assert!(svg.contains("rpcperf.Bench/Echo"));
    let c = server_counters(&h, 301);
    assert_eq!(c.rpcs, 301);
    h.shutdown();
}

/// `kv.Kv/Get` answered after `DELAY` (the handler sleeps on the worker): for deadlines.
struct SlowKv;

const DELAY: Duration = Duration::from_millis(30);

impl rpc_core::codegen::Service for SlowKv {
    const NAME: &'static str = "kv.Kv";
    const METHODS: &'static [rpc_core::codegen::MethodDesc] = &[rpc_core::codegen::MethodDesc {
        id: rpc_core::codegen::method_id("/kv.Kv/Get"),
        name: "/kv.Kv/Get",
    }];
    fn call(
        &self,
        _method: rpc_core::codegen::MethodId,
        _ctx: &rpc_core::codegen::RequestContext,
        _body: rpc_core::codegen::Body<'_>,
        out: &mut rpc_core::codegen::ReplyWriter<'_>,
    ) {
        std::thread::sleep(DELAY);
        // GetReply { value: "hi" }.
        let reply = rpc_perf::dynamic::body::EncodedRequest(bytes::Bytes::from_static(b"\x0a\x02hi"));
        out.reply(rpc_core::codegen::Reply::from(reply));
    }
}

#[test]
fn deadlines_end_calls_with_deadline_exceeded() {
    let h = Server::builder()
        .transport(Transport::Sim)
        .polling(POLL)
        .add_service(SlowKv)
        .spawn("127.0.0.1:0")
        .unwrap();
    let addr = h.local_addr().to_string();
    let kv = proto_dir().join("kv.proto").display().to_string();
    let get = [addr.as_str(), "kv.Kv/Get", "--proto", &kv, "--data", r#"{"key":"k"}"#];
    assert_eq!(call(&get).unwrap(), "{\n  \"value\": \"aGk=\"\n}\n");
    let mut late = get.to_vec();
    late.extend(["--deadline", "5ms"]);
    let e = call(&late).unwrap_err();
    assert!(e.starts_with("kv.Kv/Get: DEADLINE_EXCEEDED: "), "{e}");
    // bench: every measured call misses its deadline and is counted as such, none fails otherwise.
    let mut b = late.clone();
    b.extend(["-n", "12", "-c", "2", "--warmup", "0"]);
    let rep = rpc_perf::dynamic::bench::run(&bench_args(&b)).unwrap();
    assert_eq!(rep.calls, 12);
    assert_eq!(rep.status_counts.get("DEADLINE_EXCEEDED"), Some(&12), "{:?}", rep.status_counts);
    assert!(rep.latency.is_none());
    h.shutdown();
}

#[test]
fn open_loop_for_a_duration_accounts_for_every_scheduled_call() {
    let h = server();
    let addr = h.local_addr().to_string();
    let proto = bench_proto();
    let rep = rpc_perf::dynamic::bench::run(&bench_args(&[
        &addr,
        "rpcperf.Bench/Echo",
        "--proto",
        &proto,
        "-D",
        "1",
        "--rate",
        "2000",
        "-c",
        "4",
        "--warmup",
        "0",
    ]))
    .unwrap();
    // 1 s at 2000 calls/s: 2000 calls scheduled, each either finished or reported unsent.
    assert_eq!(rep.calls + rep.unsent, 2000, "{} finished, {} unsent", rep.calls, rep.unsent);
    assert!(rep.calls > 0);
    assert_eq!(rep.status_counts.get("OK"), Some(&rep.calls));
    assert!(rep.bandwidth.elapsed_ns >= 990_000_000, "{:?}", rep.bandwidth);
    assert!(rep.bandwidth.elapsed_ns < 5_000_000_000, "{:?}", rep.bandwidth);
    h.shutdown();
}
