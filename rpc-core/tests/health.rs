//! The `grpc.health.v1.Health` service end to end on `sim` (yielding polling): Check and Watch per
//! service, the codes of unknown services, and the drain at shutdown (NOT_SERVING first, calls
//! still served during `drain_grace`, Watch streams ended cleanly, calls in flight finished while
//! new ones are refused UNAVAILABLE).

mod rpc_support;

use std::time::{Duration, Instant};

use rpc_core::codegen::*;
use rpc_core::health::{HealthCheckRequest, HealthCheckResponse, HealthClient, ServingStatus};
use rpc_core::{Channel, ChannelConfig, Client, PollingPolicy};
use rpc_support::*;

/// A blocking health stub on its own session.
fn health_client(server: &rpc_core::ServerHandle) -> HealthClient {
    HealthClient::connect_with(server.local_addr(), &client_config()).unwrap()
}

/// Check of `service`, its status or the call's error.
fn check(client: &HealthClient, service: &str) -> Result<ServingStatus, Status> {
    client
        .check_with(HealthCheckRequest::for_service(service), &CallOptions::deadline(WAIT))
        .map(|r| r.status())
}

/// The next status of a Watch stream; panics at its end or error.
#[track_caller]
fn next(stream: &mut rpc_core::Streaming<'_, HealthCheckResponse>) -> ServingStatus {
    match stream.message() {
        Ok(Some(r)) => r.status(),
        other => fail(&format!("a Watch stream ended or failed where a status was due: {other:?}")),
    }
}

/// Check answers the status of each service: the server (`""`), every service added (the health
/// service too) SERVING from the start; a status set through the reporter, before `spawn` or
/// while running; NOT_FOUND for a name without one (gRPC's health-checking spec), also after
/// `clear_service_status`. A server without the health service answers UNIMPLEMENTED (what
/// clients take as "no health checking here").
#[test]
fn check_answers_per_service_and_not_found_for_unknown_services() {
    let builder = server().add_health_service();
    builder.health_reporter().set_service_status("warming.Cache", ServingStatus::NotServing);
    let (handle, _) = spawn(builder);
    let client = health_client(&handle);
    assert_eq!(check(&client, ""), Ok(ServingStatus::Serving));
    assert_eq!(check(&client, SERVICE), Ok(ServingStatus::Serving), "added services start SERVING");
    assert_eq!(check(&client, rpc_core::health::SERVICE_NAME), Ok(ServingStatus::Serving));
    assert_eq!(check(&client, "warming.Cache"), Ok(ServingStatus::NotServing), "set before spawn");

    let e = check(&client, "no.Such").unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(e.message().contains("\"no.Such\""), "names the service: {e}");

    let health = handle.health_reporter();
    health.set_service_status(SERVICE, ServingStatus::NotServing);
    health.set_service_status("warming.Cache", ServingStatus::Serving);
    assert_eq!(check(&client, SERVICE), Ok(ServingStatus::NotServing));
    assert_eq!(check(&client, "warming.Cache"), Ok(ServingStatus::Serving));
    assert_eq!(check(&client, ""), Ok(ServingStatus::Serving), "one service's status is its own");
    health.clear_service_status(SERVICE);
    assert_eq!(check(&client, SERVICE).unwrap_err().code(), Code::NotFound);
    drop(client);
    handle.shutdown();

    let (plain, _) = spawn(server());
    let e = check(&health_client(&plain), "").unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "no health service added: {e}");
    plain.shutdown();
}

/// Watch sends the current status at once, then each change (and nothing for a change to the
/// same status); an unknown service streams SERVICE_UNKNOWN without ending the call, then its
/// status once one is set, SERVICE_UNKNOWN again when it is cleared.
#[test]
fn watch_streams_the_status_then_every_change_and_service_unknown() {
    let (server, _) = spawn(server().add_health_service());
    let health = server.health_reporter();
    let a = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let b = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    let (a, b) = (HealthClient::new(a), HealthClient::new(b));
    let opts = CallOptions::deadline(WAIT);
    let mut known = a.watch_with(HealthCheckRequest::for_service(SERVICE), &opts).unwrap();
    let mut unknown = b.watch_with(HealthCheckRequest::for_service("later.Svc"), &opts).unwrap();
    assert_eq!(next(&mut known), ServingStatus::Serving);
    assert_eq!(next(&mut unknown), ServingStatus::ServiceUnknown);

    health.set_service_status(SERVICE, ServingStatus::NotServing);
    assert_eq!(next(&mut known), ServingStatus::NotServing);
    // The same status again sends nothing: the next message is the change after it.
    health.set_service_status(SERVICE, ServingStatus::NotServing);
    health.set_service_status(SERVICE, ServingStatus::Serving);
    assert_eq!(next(&mut known), ServingStatus::Serving);

    health.set_service_status("later.Svc", ServingStatus::Serving);
    assert_eq!(next(&mut unknown), ServingStatus::Serving, "the unknown service's stream stayed open");
    health.clear_service_status("later.Svc");
    assert_eq!(next(&mut unknown), ServingStatus::ServiceUnknown);
    assert!(known.try_message().is_none(), "no message for another service's change");
    drop((known, unknown));
    drop((a, b));
    server.shutdown();
}

/// A Watch stream the client drops (a cancel) or whose deadline passes ends on the server at
/// once, not at the next status change: its task is gone (`watchers` counts the open ones).
#[test]
fn a_cancelled_or_expired_watch_ends_on_the_server() {
    let (server, _) = spawn(server().add_health_service());
    let health = server.health_reporter();
    let client = health_client(&server);
    let state = || format!("{} watchers", health.watchers());
    let mut cancelled = client.watch(HealthCheckRequest::server()).unwrap();
    assert_eq!(next(&mut cancelled), ServingStatus::Serving);
    assert_eq!(health.watchers(), 1);
    drop(cancelled);
    wait_until("the dropped Watch to end on the server", WAIT, || health.watchers() == 0, state);
    let mut expiring = client
        .watch_with(HealthCheckRequest::server(), &CallOptions::deadline(Duration::from_millis(50)))
        .unwrap();
    assert_eq!(next(&mut expiring), ServingStatus::Serving);
    let e = expiring.message().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    wait_until("the expired Watch to end on the server", WAIT, || health.watchers() == 0, state);
    drop(expiring);
    drop(client);
    server.shutdown();
}

/// The balancer's path: the stub over a `Channel`, from tokio tasks: Check, and a Watch that sees
/// SERVING, NOT_SERVING when `shutdown` starts, then its clean end.
#[test]
fn a_channel_checks_and_watches_through_shutdown() {
    let (server, _) = spawn(server().add_health_service());
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let config = ChannelConfig::default()
        .client(client_config().polling(PollingPolicy::Event { spins: 0 }))
        .spins(500);
    let (health, mut watch) = rt.block_on(async {
        let ch = Channel::connect_with(addr, &config).await.unwrap();
        let health = HealthClient::from_channel(ch);
        let now = health.check(HealthCheckRequest::server()).await.map(|r| r.status());
        assert_eq!(now, Ok(ServingStatus::Serving));
        let unknown = health.check(HealthCheckRequest::for_service("no.Such")).await.unwrap_err();
        assert_eq!(unknown.code(), Code::NotFound, "{unknown}");
        let mut watch = health.watch_with(HealthCheckRequest::server(), &CallOptions::deadline(WAIT));
        let first = watch.message().await.map(|m| m.map(|r| r.status()));
        assert_eq!(first, Ok(Some(ServingStatus::Serving)));
        (health, watch)
    });
    let stopper = std::thread::spawn(move || server.shutdown());
    rt.block_on(async {
        let drained = watch.message().await.map(|m| m.map(|r| r.status()));
        assert_eq!(drained, Ok(Some(ServingStatus::NotServing)), "the drain is announced first");
        assert_eq!(watch.message().await.map(|m| m.map(|r| r.status())), Ok(None), "then a clean end");
    });
    stopper.join().unwrap();
    drop((watch, health));
}

/// Shutdown with a `drain_grace`: every status turns NOT_SERVING at once (Check and Watch see it,
/// later changes are ignored) while calls are still served; the Watch stream then ends OK;
/// then new calls get UNAVAILABLE while a call in flight since before the shutdown finishes
/// OK, and `shutdown` returns.
///
/// The only time the test reads is a lower bound, which `drain_grace` (a sleep) guarantees: a call
/// made after NOT_SERVING is answered OK, or UNAVAILABLE no sooner than `drain_grace` after
/// `shutdown` began (a machine that stalled that long).
#[test]
fn shutdown_reports_not_serving_serves_during_the_grace_then_drains_in_flight_calls() {
    const GRACE: Duration = Duration::from_secs(2);
    let (server, stash) = spawn(server().add_health_service().drain_grace(GRACE).drain_timeout(WAIT));
    let addr = server.local_addr();
    let health = server.health_reporter();
    let watcher = health_client(&server);
    let mut watch = watcher.watch_with(HealthCheckRequest::server(), &CallOptions::deadline(WAIT)).unwrap();
    assert_eq!(next(&mut watch), ServingStatus::Serving);

    // A call in flight across the whole shutdown.
    let caller = Client::connect_with(addr, &client_config()).unwrap();
    let held = caller.unary_async::<_, EchoMsg>(STASH, &request(1, 8, 8), &CallOptions::deadline(WAIT));
    wait_stashed("the held call to reach its handler", 1, &stash, &caller, &server);

    let began = Instant::now();
    let stopper = std::thread::spawn(move || server.shutdown());
    assert_eq!(next(&mut watch), ServingStatus::NotServing, "Watch sees the drain begin");
    assert!(health.is_draining());
    health.set_service_status("", ServingStatus::Serving);
    assert_eq!(check(&watcher, ""), Ok(ServingStatus::NotServing), "a draining server never serves again");
    assert_eq!(check(&watcher, SERVICE), Ok(ServingStatus::NotServing), "every service is NOT_SERVING");

    // During the grace, calls are served as before.
    match caller.unary::<_, EchoMsg>(ECHO, &request(2, 8, 8), &CallOptions::deadline(WAIT)) {
        Ok(r) => check_reply(&r, 2, 8),
        Err(e) => {
            assert_eq!(e.code(), Code::Unavailable, "{e}");
            let waited = began.elapsed();
            assert!(
                waited >= GRACE,
                "refused {waited:?} after shutdown began, within the {GRACE:?} grace: {e}"
            );
        }
    }
    // The grace over, the Watch stream ends cleanly (after NOT_SERVING, sent once).
    assert_eq!(watch.message(), Ok(None), "the Watch stream ends OK at the drain");
    assert!(began.elapsed() >= GRACE, "the stream ended within the grace");

    // The drain proper: new calls refused, the one in flight still finishes OK.
    let e = wait_for(
        "a new call to be refused once the drain began",
        WAIT,
        || caller.unary::<_, EchoMsg>(ECHO, &request(3, 8, 8), &CallOptions::deadline(WAIT)).err(),
        || "every call succeeded".into(),
    );
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(!stopper.is_finished(), "shutdown waits for the call in flight");
    stash.lock().unwrap().drain(..).for_each(|r| r.send(Ok(EchoMsg { seq: 1, ..Default::default() })));
    assert_eq!(block_on(held).map(|r| r.seq), Ok(1), "the call in flight finished OK");
    stopper.join().unwrap();
    drop(watch);
    drop((watcher, caller));
}

/// Without a grace (the default) the order holds all the same: a Watch stream sees NOT_SERVING,
/// then its clean end, before the session closes; and a Watch of an unknown service, which stays
/// open while the server runs, ends OK too. `shutdown` runs on the watching thread, so the
/// clients take nothing until it returned: the last status, the stream's end and the server's
/// Close all wait in their completion queues together, and the reader still gets the status
/// before the end (the client used to drop a stream's unread messages at the Close even when
/// the stream's end had arrived before it). Watch streams do not hold up the drain: `shutdown`
/// returns long before `drain_timeout`.
#[test]
fn without_grace_watch_streams_still_see_not_serving_then_end() {
    let (server, _) = spawn(server().add_health_service().drain_timeout(2 * WAIT));
    let (a, b) = (health_client(&server), health_client(&server));
    let opts = CallOptions::deadline(WAIT);
    let mut known = a.watch_with(HealthCheckRequest::for_service(SERVICE), &opts).unwrap();
    let mut unknown = b.watch_with(HealthCheckRequest::for_service("no.Such"), &opts).unwrap();
    assert_eq!(next(&mut known), ServingStatus::Serving);
    assert_eq!(next(&mut unknown), ServingStatus::ServiceUnknown);
    let began = Instant::now();
    server.shutdown();
    assert!(began.elapsed() < WAIT, "shutdown waited {:?} for the Watch streams", began.elapsed());
    assert_eq!(next(&mut known), ServingStatus::NotServing);
    assert_eq!(known.message(), Ok(None));
    assert_eq!(unknown.message(), Ok(None), "SERVICE_UNKNOWN does not change at a drain; the stream ends");
}
