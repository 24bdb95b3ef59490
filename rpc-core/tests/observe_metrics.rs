//! Metrics of calls (issue 30 item 3): with `Observe::metrics` on both ends, per-method calls
//! (by code), request and response bytes, in-flight gauges and latency histograms reach the
//! `metrics` recorder; here the Prometheus exporter, scraped over plain TCP as Prometheus would.

mod rpc_support;

use std::net::TcpListener;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use rpc_core::codegen::*;
use rpc_core::{CallOptions, Channel, ChannelConfig, Client, Code, Observe, PollingPolicy};
use rpc_support::prom::{scrape, value};
use rpc_support::*;

const ECHO_M: MethodId = method_id("/test.Metered/Echo");
const FAIL_M: MethodId = method_id("/test.Metered/Fail");
static NAMES: &[MethodDesc] = &[
    MethodDesc { id: ECHO_M, name: "/test.Metered/Echo" },
    MethodDesc { id: FAIL_M, name: "/test.Metered/Fail" },
];

struct Metered;

impl Service for Metered {
    const NAME: &'static str = "test.Metered";
    const METHODS: &'static [MethodDesc] = NAMES;
    fn call(&self, method: MethodId, _ctx: &RequestContext, _b: Body<'_>, out: &mut ReplyWriter<'_>) {
        match method {
            ECHO_M => out.reply(Reply::from(EchoMsg { payload: vec![1; 100], ..Default::default() })),
            _ => out.error(Status::not_found("nothing here")),
        }
    }
}

#[test]
fn per_method_metrics_of_both_ends_are_scraped_from_the_prometheus_exporter() {
    register_method_names(NAMES);
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    PrometheusBuilder::new().with_http_listener(port).install().expect("exporter installs");
    let on = Observe::default().metrics(true);
    let server = server().observe(on).add_service(Metered).spawn("127.0.0.1:0").expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config().observe(on)).expect("client");
    let req = EchoMsg { payload: vec![2; 30], ..Default::default() };
    for _ in 0..3 {
        client.unary::<EchoMsg, EchoMsg>(ECHO_M, &req, &CallOptions::default()).expect("echo");
    }
    for _ in 0..2 {
        let e = client.unary::<EchoMsg, EchoMsg>(FAIL_M, &req, &CallOptions::default()).unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }
    // And an async call of the blocking client.
    block_on(client.unary_async::<EchoMsg, EchoMsg>(ECHO_M, &req, &CallOptions::default())).expect("echo");
    // And through a Channel: counted with the blocking client's calls (same labels).
    let config = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }).observe(on));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ch = Channel::connect_with(server.local_addr(), &config).await.expect("channel");
        ch.unary::<EchoMsg, EchoMsg>(ECHO_M, &req, &CallOptions::default()).await.expect("echo");
    });
    let echo = r#"method="/test.Metered/Echo""#;
    let fail = r#"method="/test.Metered/Fail""#;
    // A server records a call once its answer is posted: its last call's record may land a moment
    // after the client has the answer. Records reach the recorder at `flush_metrics()`.
    rpc_core::observe::flush_metrics();
    let mut text = scrape(port);
    for _ in 0..100 {
        let served = |code: &str, m: &str| value(&text, "rpc_server_calls_total", &[m, code]);
        if served(r#"code="OK""#, echo) == Some(5.0) && served(r#"code="NOT_FOUND""#, fail) == Some(2.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        rpc_core::observe::flush_metrics();
        text = scrape(port);
    }
    for side in ["client", "server"] {
        let calls = format!("rpc_{side}_calls_total");
        assert_eq!(value(&text, &calls, &[echo, r#"code="OK""#]), Some(5.0), "{side} OK calls\n{text}");
        assert_eq!(
            value(&text, &calls, &[fail, r#"code="NOT_FOUND""#]),
            Some(2.0),
            "{side} NOT_FOUND\n{text}"
        );
        // 30 bytes of payload encode to 32; 100 to 102.
        assert_eq!(
            value(&text, &format!("rpc_{side}_request_bytes_total"), &[echo]),
            Some(5.0 * 32.0),
            "{text}"
        );
        assert_eq!(
            value(&text, &format!("rpc_{side}_response_bytes_total"), &[echo]),
            Some(5.0 * 102.0),
            "{text}"
        );
        assert_eq!(value(&text, &format!("rpc_{side}_response_bytes_total"), &[fail]), Some(0.0), "{text}");
        assert_eq!(value(&text, &format!("rpc_{side}_in_flight"), &[echo]), Some(0.0), "{text}");
        assert_eq!(value(&text, &format!("rpc_{side}_duration_seconds_count"), &[echo]), Some(5.0), "{text}");
        let sum = value(&text, &format!("rpc_{side}_duration_seconds_sum"), &[echo]).expect("latency sum");
        assert!(sum > 0.0, "{side} latency sum {sum}");
    }
    drop(client);
    server.shutdown();
}
