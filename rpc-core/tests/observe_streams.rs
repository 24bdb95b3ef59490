//! Metrics of the calls `observe_metrics.rs` leaves out (issue 30 item 3): streams on both ends
//! (blocking `Client` and `Channel`; the end's code, the messages' bytes), a stream the client
//! drops (CANCELLED), a deferred answer (its code and its duration up to the answer, not up to
//! the handler's return) and a call an interceptor refuses (counted with its code, no handler).
//! Scraped from the Prometheus exporter as `observe_metrics.rs` does.

mod rpc_support;

use std::net::TcpListener;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use rpc_core::codegen::*;
use rpc_core::{CallOptions, Channel, ChannelConfig, Client, Code, Observe, PollingPolicy};
use rpc_support::prom::{scrape, value};
use rpc_support::*;

/// Server stream: 3 messages of 100 bytes of payload (102 encoded), then OK.
const DOWN: MethodId = method_id("/test.Streams/Down");
/// Client stream: reads every message, answers 100 bytes of payload.
const UP: MethodId = method_id("/test.Streams/Up");
/// Unary, deferred: a thread answers after 50 ms.
const SLOW: MethodId = method_id("/test.Streams/Slow");
/// Refused by the server's interceptor (UNAUTHENTICATED).
const SECRET: MethodId = method_id("/test.Streams/Secret");
/// Server stream that sends until the client cancels it.
const ENDLESS: MethodId = method_id("/test.Streams/Endless");
/// Server stream that ends ABORTED after one message.
const BROKEN: MethodId = method_id("/test.Streams/Broken");
static NAMES: &[MethodDesc] = &[
    MethodDesc { id: DOWN, name: "/test.Streams/Down" },
    MethodDesc { id: UP, name: "/test.Streams/Up" },
    MethodDesc { id: SLOW, name: "/test.Streams/Slow" },
    MethodDesc { id: SECRET, name: "/test.Streams/Secret" },
    MethodDesc { id: BROKEN, name: "/test.Streams/Broken" },
    MethodDesc { id: ENDLESS, name: "/test.Streams/Endless" },
];

fn msg() -> EchoMsg {
    EchoMsg { payload: vec![1; 100], ..Default::default() }
}

struct Streams;

impl Service for Streams {
    const NAME: &'static str = "test.Streams";
    const METHODS: &'static [MethodDesc] = NAMES;
    fn call(&self, method: MethodId, ctx: &RequestContext, _b: Body<'_>, out: &mut ReplyWriter<'_>) {
        match method {
            DOWN | BROKEN | ENDLESS => {
                let (sink, reply) = ctx.stream::<EchoMsg>();
                std::thread::spawn(move || {
                    if method == BROKEN {
                        let _ = sink.send(&msg());
                        return sink.finish(Err(Status::aborted("broken")));
                    }
                    if method == ENDLESS {
                        while sink.send(&msg()).is_ok() {}
                        return;
                    }
                    for _ in 0..3 {
                        if sink.send(&msg()).is_err() {
                            return;
                        }
                    }
                });
                out.reply(reply);
            }
            UP => {
                let requests = ctx.requests::<EchoMsg>();
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    let n = requests.take_while(Result::is_ok).count();
                    assert_eq!(n, 2);
                    responder.send(Ok(msg()));
                });
                out.reply(reply);
            }
            SLOW => {
                let (responder, reply) = ctx.defer::<EchoMsg>();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    responder.send(Err(Status::unavailable("slow")));
                });
                out.reply(reply);
            }
            _ => out.error(Status::not_found("nothing here")),
        }
    }
}

#[test]
fn streams_deferred_answers_and_refused_calls_are_observed_on_both_ends() {
    register_method_names(NAMES);
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    PrometheusBuilder::new().with_http_listener(port).install().expect("exporter installs");
    let on = Observe::default().metrics(true);
    let server = server()
        .observe(on)
        .interceptor(|info| {
            if info.method() == "/test.Streams/Secret" {
                Err(Status::unauthenticated("no token"))
            } else {
                Ok(())
            }
        })
        .add_service(Streams)
        .spawn("127.0.0.1:0")
        .expect("server");
    let client = Client::connect_with(server.local_addr(), &client_config().observe(on)).expect("client");
    let none = CallOptions::default();
    // A server stream read to its end, one dropped after its first message, one that fails.
    let s = client.server_stream::<EchoMsg, EchoMsg>(DOWN, &EchoMsg::default(), &none).unwrap();
    assert_eq!(s.map(Result::unwrap).count(), 3);
    let mut s = client.server_stream::<EchoMsg, EchoMsg>(ENDLESS, &EchoMsg::default(), &none).unwrap();
    s.message().unwrap().unwrap();
    drop(s);
    let mut s = client.server_stream::<EchoMsg, EchoMsg>(BROKEN, &EchoMsg::default(), &none).unwrap();
    s.message().unwrap().unwrap();
    assert_eq!(s.message().unwrap_err().code(), Code::Aborted);
    drop(s);
    // A client stream.
    let mut up = client.client_stream::<EchoMsg, EchoMsg>(UP, &none).unwrap();
    up.send(&msg()).unwrap();
    up.send(&msg()).unwrap();
    assert_eq!(up.finish().unwrap(), msg());
    // A deferred answer, and a refused call.
    assert_eq!(client.unary::<_, EchoMsg>(SLOW, &msg(), &none).unwrap_err().code(), Code::Unavailable);
    assert_eq!(client.unary::<_, EchoMsg>(SECRET, &msg(), &none).unwrap_err().code(), Code::Unauthenticated);
    // Through a Channel: a server stream and a client stream.
    let config = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }).observe(on));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ch = Channel::connect_with(server.local_addr(), &config).await.expect("channel");
        let mut rx = ch.server_stream::<EchoMsg, EchoMsg>(DOWN, EchoMsg::default(), &none);
        let mut n = 0;
        while rx.message().await.unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 3);
        let mut up = ch.client_stream::<EchoMsg, EchoMsg>(UP, &none);
        up.send(&msg()).await.unwrap();
        up.send(&msg()).await.unwrap();
        assert_eq!(up.finish().await.unwrap(), msg());
    });
    drop(client);
    // The server records a stream when its end leaves: shutting down lets every end leave.
    server.shutdown();
    // Every thread's records reach the recorder now, not at the flusher's next round.
    rpc_core::observe::flush_metrics();
    let text = scrape(port);
    let m = |name: &str| format!("method=\"/test.Streams/{name}\"");
    let (down, up, slow, secret, broken) = (m("Down"), m("Up"), m("Slow"), m("Secret"), m("Broken"));
    let endless = m("Endless");
    let calls = |side: &str, method: &str, code: &str| {
        value(&text, &format!("rpc_{side}_calls_total"), &[method, &format!("code=\"{code}\"")])
    };
    // The client: two streams read to the end (Client, Channel), one dropped.
    assert_eq!(calls("client", &down, "OK"), Some(2.0), "{text}");
    assert_eq!(calls("client", &endless, "CANCELLED"), Some(1.0), "{text}");
    assert_eq!(calls("client", &broken, "ABORTED"), Some(1.0), "{text}");
    assert_eq!(calls("client", &up, "OK"), Some(2.0), "{text}");
    // Response bytes: 3 messages of 102 bytes per stream read to its end, and the one taken
    // from the dropped stream.
    assert_eq!(value(&text, "rpc_client_response_bytes_total", &[&down]), Some(6.0 * 102.0), "{text}");
    assert_eq!(value(&text, "rpc_client_response_bytes_total", &[&endless]), Some(102.0), "{text}");
    assert_eq!(value(&text, "rpc_client_in_flight", &[&down]), Some(0.0), "{text}");
    // The server counts what it sent: the same 6 messages of 102 bytes.
    assert_eq!(value(&text, "rpc_server_response_bytes_total", &[&down]), Some(6.0 * 102.0), "{text}");
    // The server: the same streams, the deferred answers with their codes.
    assert_eq!(calls("server", &down, "OK"), Some(2.0), "{text}");
    assert_eq!(calls("server", &endless, "CANCELLED"), Some(1.0), "{text}");
    assert_eq!(calls("server", &broken, "ABORTED"), Some(1.0), "{text}");
    assert_eq!(calls("server", &up, "OK"), Some(2.0), "{text}");
    assert_eq!(calls("server", &slow, "UNAVAILABLE"), Some(1.0), "{text}");
    assert_eq!(calls("server", &secret, "UNAUTHENTICATED"), Some(1.0), "{text}");
    assert_eq!(calls("client", &secret, "UNAUTHENTICATED"), Some(1.0), "{text}");
    assert!(!text.contains("DEFERRED"), "no call is left DEFERRED:\n{text}");
    // A deferred call's duration runs to its answer (50 ms after the handler returned), less the
    // histogram's bucket precision (a 32nd).
    let slow_sum = value(&text, "rpc_server_duration_seconds_sum", &[&slow]).expect("slow's latency");
    assert!(
        slow_sum >= 0.05 * (1.0 - 1.0 / 32.0),
        "the deferred call's duration is {slow_sum} s, its answer came after 50 ms"
    );
    for side in ["client", "server"] {
        for method in [&down, &up, &slow, &endless] {
            assert_eq!(
                value(&text, &format!("rpc_{side}_in_flight"), &[method]),
                Some(0.0),
                "{side} {method}\n{text}"
            );
        }
    }
}
