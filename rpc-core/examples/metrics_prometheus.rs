//! Serves a small service with per-method metrics on, exported in Prometheus' text format on an
//! HTTP port (issue 30 item 3), and calls it from a client with metrics on too.
//!
//! ```text
//! cargo run -p rpc-core --example metrics_prometheus -- [METRICS_ADDR] [CALLS]
//! curl http://127.0.0.1:9464/metrics    # rpc_server_calls_total{method=...,code="OK"} ...
//! ```
//!
//! METRICS_ADDR defaults to `127.0.0.1:9464`, CALLS (made once at start) to 1000. The process
//! then serves until killed (`RPC_EXAMPLE_EXIT=1`: exits after the calls, for CI). The RPC
//! server listens on an ephemeral port on `sim` (printed).

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use rpc_core::codegen::*;
use rpc_core::{CallOptions, Client, ClientConfig, Observe, PollingPolicy, Server};

/// The example's message.
#[derive(Clone, PartialEq, prost::Message)]
struct Text {
    #[prost(string, tag = "1")]
    text: String,
}

const SAY: MethodId = method_id("/example.Echo/Say");
const REFUSE: MethodId = method_id("/example.Echo/Refuse");
static NAMES: &[MethodDesc] = &[
    MethodDesc { id: SAY, name: "/example.Echo/Say" },
    MethodDesc { id: REFUSE, name: "/example.Echo/Refuse" },
];

struct Echo;

impl Service for Echo {
    const NAME: &'static str = "example.Echo";
    const METHODS: &'static [MethodDesc] = NAMES;
    fn call(&self, method: MethodId, _ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        match (method, decode::<Text>(body)) {
            (SAY, Ok(t)) => out.reply(Reply::from(t)),
            (SAY, Err(s)) => out.error(s),
            _ => out.error(Status::permission_denied("refused, to show a code other than OK")),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let metrics_addr: std::net::SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:9464").parse()?;
    let calls: u32 = args.next().as_deref().unwrap_or("1000").parse()?;
    PrometheusBuilder::new()
        .with_http_listener(metrics_addr)
        .set_buckets(rpc_core::observe::DURATION_BUCKETS)?
        .install()?;
    let on = Observe::default().metrics(true);
    let polling = PollingPolicy::SpinThenYield { spins: 100 };
    let server = Server::builder().observe(on).polling(polling).add_service(Echo).spawn("127.0.0.1:0")?;
    println!("rpc server on {} (sim); metrics on http://{metrics_addr}/metrics", server.local_addr());
    register_method_names(NAMES);
    let client =
        Client::connect_with(server.local_addr(), &ClientConfig::default().polling(polling).observe(on))?;
    let msg = Text { text: "hello".into() };
    for i in 0..calls {
        let _ =
            client.unary::<Text, Text>(if i % 10 == 9 { REFUSE } else { SAY }, &msg, &CallOptions::default());
    }
    println!("made {calls} calls");
    if std::env::var("RPC_EXAMPLE_EXIT").as_deref() == Ok("1") {
        server.shutdown();
        return Ok(());
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
