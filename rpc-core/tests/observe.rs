//! Tracing of calls (issue 30 item 3): a span per call on both ends with OpenTelemetry's RPC
//! attributes, and the W3C `traceparent` carried in metadata so that one trace crosses a client,
//! a server A and the server B that A's handler calls (inline and async handlers); a bad
//! `traceparent` is ignored.

mod rpc_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rpc_core::codegen::*;
use rpc_core::{
    AsyncRuntime, Channel, ChannelConfig, Client, Metadata, Observe, PollingPolicy, Request, ServerHandle,
    TraceContext,
};
use rpc_support::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

// ---- a layer that keeps every span's name and fields -------------------------------------------

#[derive(Clone, Debug, Default)]
struct SpanRec {
    name: &'static str,
    fields: HashMap<String, String>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

#[derive(Default)]
struct Capture {
    open: Mutex<HashMap<u64, SpanRec>>,
    closed: Mutex<Vec<SpanRec>>,
}

struct CaptureLayer(Arc<Capture>);

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S>
    for CaptureLayer
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut rec = SpanRec { name: attrs.metadata().name(), fields: HashMap::new() };
        attrs.record(&mut Fields(&mut rec.fields));
        self.0.open.lock().unwrap().insert(id.into_u64(), rec);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        if let Some(rec) = self.0.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut rec.fields));
        }
    }
    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        if let Some(rec) = self.0.open.lock().unwrap().remove(&id.into_u64()) {
            self.0.closed.lock().unwrap().push(rec);
        }
    }
}

fn capture() -> &'static Arc<Capture> {
    static CAP: OnceLock<Arc<Capture>> = OnceLock::new();
    CAP.get_or_init(|| {
        let cap = Arc::new(Capture::default());
        let subscriber = tracing_subscriber::registry().with(CaptureLayer(cap.clone()));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        cap
    })
}

/// Closed spans named `name` whose `trace_id` is `trace`.
fn spans(name: &str, trace: u128) -> Vec<SpanRec> {
    let want = format!("{trace:032x}");
    let closed = capture().closed.lock().unwrap();
    closed.iter().filter(|s| s.name == name && s.fields.get("trace_id") == Some(&want)).cloned().collect()
}

// ---- two services ------------------------------------------------------------------------------

const SEEN: MethodId = method_id("/test.Back/Seen");
const RELAY: MethodId = method_id("/test.Front/Relay");
const RELAY_ASYNC: MethodId = method_id("/test.Front/RelayAsync");
static BACK_NAMES: &[MethodDesc] = &[MethodDesc { id: SEEN, name: "/test.Back/Seen" }];
static FRONT_NAMES: &[MethodDesc] = &[
    MethodDesc { id: RELAY, name: "/test.Front/Relay" },
    MethodDesc { id: RELAY_ASYNC, name: "/test.Front/RelayAsync" },
];

/// What a handler saw: its thread's trace context.
type Seen = Arc<Mutex<Vec<Option<TraceContext>>>>;

struct Back(Seen);

impl Service for Back {
    const NAME: &'static str = "test.Back";
    const METHODS: &'static [MethodDesc] = BACK_NAMES;
    fn call(&self, _m: MethodId, _ctx: &RequestContext, _b: Body<'_>, out: &mut ReplyWriter<'_>) {
        self.0.lock().unwrap().push(TraceContext::current());
        out.reply(Reply::from(EchoMsg { payload: vec![7; 10], ..Default::default() }));
    }
}

struct Front {
    back: std::net::SocketAddr,
    client: Mutex<Option<Client>>,
    channel: Channel,
    seen: Seen,
}

fn traced() -> Observe {
    Observe::default().tracing(true)
}

impl Service for Front {
    const NAME: &'static str = "test.Front";
    const METHODS: &'static [MethodDesc] = FRONT_NAMES;
    fn call(&self, method: MethodId, ctx: &RequestContext, _b: Body<'_>, out: &mut ReplyWriter<'_>) {
        self.seen.lock().unwrap().push(TraceContext::current());
        match method {
            RELAY => {
                let mut client = self.client.lock().unwrap();
                if client.is_none() {
                    let config = client_config().observe(traced());
                    *client = Some(Client::connect_with(self.back, &config).expect("connect to B"));
                }
                let r = client.as_ref().unwrap().unary::<EchoMsg, EchoMsg>(
                    SEEN,
                    &EchoMsg::default(),
                    &Default::default(),
                );
                out.reply(Reply::from(r))
            }
            _ => {
                let ch = self.channel.clone();
                let seen = self.seen.clone();
                out.reply(spawn_async(&AsyncRuntime::worker(), ctx, move |_| async move {
                    // A later poll (not the first, inline in the worker's dispatch) is inside
                    // the call's context too.
                    let mut once = false;
                    std::future::poll_fn(|cx| {
                        if std::mem::replace(&mut once, true) {
                            std::task::Poll::Ready(())
                        } else {
                            cx.waker().wake_by_ref();
                            std::task::Poll::Pending
                        }
                    })
                    .await;
                    seen.lock().unwrap().push(TraceContext::current());
                    ch.unary::<EchoMsg, EchoMsg>(SEEN, EchoMsg::default(), &Default::default()).await
                }))
            }
        }
    }
}

struct Setup {
    back: ServerHandle,
    front: ServerHandle,
    back_seen: Seen,
    front_seen: Seen,
}

fn start() -> Setup {
    capture();
    register_method_names(BACK_NAMES);
    register_method_names(FRONT_NAMES);
    let back_seen = Seen::default();
    let front_seen = Seen::default();
    let back =
        server().observe(traced()).add_service(Back(back_seen.clone())).spawn("127.0.0.1:0").expect("B");
    let channel_config = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }).observe(traced()))
        .spins(500);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let channel =
        rt.block_on(Channel::connect_with(back.local_addr(), &channel_config)).expect("channel to B");
    let front =
        Front { back: back.local_addr(), client: Mutex::new(None), channel, seen: front_seen.clone() };
    let front = server().observe(traced()).add_service(front).spawn("127.0.0.1:0").expect("A");
    Setup { back, front, back_seen, front_seen }
}

fn take(seen: &Seen) -> Vec<Option<TraceContext>> {
    std::mem::take(&mut *seen.lock().unwrap())
}

#[test]
fn one_trace_crosses_client_a_and_b_with_new_span_ids_and_spans_carry_the_rpc_attributes() {
    let s = start();
    let client = Client::connect_with(s.front.local_addr(), &client_config().observe(traced())).expect("A");
    for method in [RELAY, RELAY_ASYNC] {
        let root = TraceContext::new_root();
        {
            let _g = root.enter();
            client
                .unary::<EchoMsg, EchoMsg>(
                    method,
                    &EchoMsg { seq: 1, ..Default::default() },
                    &Default::default(),
                )
                .expect("relay");
        }
        let a = take(&s.front_seen);
        let b = take(&s.back_seen);
        let a0 = a[0].expect("A's handler has a trace context");
        let b0 = b.first().copied().flatten().expect("B's handler has a trace context");
        assert_eq!(a0.trace_id(), root.trace_id(), "A continues the client's trace");
        assert_eq!(b0.trace_id(), root.trace_id(), "B continues A's trace");
        let ids = [root.span_id(), a0.span_id(), b0.span_id()];
        assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2], "span ids {ids:x?}");
        if method == RELAY_ASYNC {
            assert_eq!(a.get(1).copied().flatten(), Some(a0), "the async handler's poll sees A's context");
        }
        // Spans: client→A, A's server span, A→B client span, B's server span, all of one trace.
        let servers = spans("rpc.server", root.trace_id());
        let clients = spans("rpc.client", root.trace_id());
        assert_eq!(servers.len(), 2, "{servers:#?}");
        assert_eq!(clients.len(), 2, "{clients:#?}");
        let front = servers.iter().find(|s| s.fields["rpc.service"] == "test.Front").expect("A's span");
        let back = servers.iter().find(|s| s.fields["rpc.service"] == "test.Back").expect("B's span");
        assert_eq!(back.fields["rpc.method"], "/test.Back/Seen");
        assert_eq!(front.fields["rpc.system"], "rdma-rpc");
        assert_eq!(front.fields["otel.kind"], "server");
        assert_eq!(front.fields["rpc.grpc.status_code"], "0", "{method:#x} {servers:#?}");
        assert_eq!(front.fields["span_id"], format!("{:016x}", a0.span_id()));
        assert_eq!(back.fields["span_id"], format!("{:016x}", b0.span_id()));
        assert_eq!(back.fields["rpc.response.size"], "12", "B answers 12 bytes");
        assert!(front.fields["network.peer.address"].starts_with("127.0.0.1:"), "{front:?}");
        assert_eq!(front.fields["rpc.request.size"], "2");
        let to_a =
            clients.iter().find(|c| c.fields["rpc.service"] == "test.Front").expect("client span to A");
        assert_eq!(to_a.fields["parent_span_id"], format!("{:016x}", root.span_id()));
        assert_eq!(front.fields["parent_span_id"], to_a.fields["span_id"], "A's parent is the client span");
        let to_b = clients.iter().find(|c| c.fields["rpc.service"] == "test.Back").expect("client span to B");
        assert_eq!(to_b.fields["parent_span_id"], front.fields["span_id"], "A→B's parent is A's span");
        assert_eq!(back.fields["parent_span_id"], to_b.fields["span_id"]);
        assert_eq!(to_b.fields["rpc.method"], "/test.Back/Seen");
        assert_eq!(to_b.fields["rpc.grpc.status_code"], "0");
        // The peer of the blocking client's span and of the Channel's.
        assert_eq!(to_a.fields["network.peer.address"], s.front.local_addr().to_string(), "{to_a:?}");
        assert_eq!(to_b.fields["network.peer.address"], s.back.local_addr().to_string(), "{to_b:?}");
    }
    drop(client);
    s.front.shutdown();
    s.back.shutdown();
}

#[test]
fn a_bad_traceparent_is_ignored_and_a_call_without_one_starts_a_trace() {
    let s = start();
    // A client without tracing, sending what it likes as `traceparent`.
    let client = Client::connect_with(s.front.local_addr(), &client_config()).expect("A");
    let upper = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01";
    for bad in
        ["", "00-xyz", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "garbage garbage", upper]
    {
        let mut req = Request::new(EchoMsg::default());
        let mut md = Metadata::new();
        md.insert("traceparent", bad).unwrap();
        *req.metadata_mut() = md;
        let r = client.unary::<EchoMsg, EchoMsg>(
            RELAY,
            req.get_ref(),
            &rpc_core::CallOptions::default().with_metadata(req.metadata().clone()),
        );
        r.expect("a bad traceparent is no error");
        let a = take(&s.front_seen)[0].expect("a new trace");
        let b = take(&s.back_seen)[0].expect("B continues it");
        assert_eq!(a.trace_id(), b.trace_id(), "{bad:?}");
        // Not continued: a new random trace.
        assert!(a.trace_id() != 0 && a.trace_id() != 0x4bf92f3577b34da6a3ce929d0e0e4736, "{bad:?}: {a:?}");
        assert_ne!(a.span_id(), b.span_id());
    }
    // A good one from a client without tracing is continued.
    let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut md = Metadata::new();
    md.insert("traceparent", good).unwrap();
    client
        .unary::<EchoMsg, EchoMsg>(
            RELAY,
            &EchoMsg::default(),
            &rpc_core::CallOptions::default().with_metadata(md),
        )
        .expect("call");
    let a = take(&s.front_seen)[0].unwrap();
    assert_eq!(a.trace_id(), 0x4bf92f3577b34da6a3ce929d0e0e4736);
    assert_ne!(a.span_id(), 0x00f067aa0ba902b7);
    assert_eq!(take(&s.back_seen)[0].unwrap().trace_id(), 0x4bf92f3577b34da6a3ce929d0e0e4736);
    drop(client);
    s.front.shutdown();
    s.back.shutdown();
}
