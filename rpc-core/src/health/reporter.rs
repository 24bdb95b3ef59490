//! The statuses a server reports: one per service name, and the server's own under `""`.
//!
//! Held in a `tokio::sync::watch` channel: `Check` reads the current value, each `Watch` stream
//! is a receiver woken by every change. Setting a status takes a short lock and wakes the
//! watchers; nothing on the data path touches it.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::ServingStatus;
use crate::dispatch::service::Service;

/// Where the server is in its life, as the health service sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Statuses are what the application set.
    Running,
    /// `shutdown` began: every status is NOT_SERVING and stays so; calls still run
    /// (`ServerConfig::drain_grace`).
    Draining,
    /// The drain proper began: `Watch` streams end (OK) after their last status.
    Closed,
}

/// The statuses and the phase, as watchers see them.
#[derive(Debug)]
pub(crate) struct Statuses {
    map: HashMap<String, ServingStatus>,
    pub(crate) phase: Phase,
}

impl Statuses {
    /// What `Check` answers: the status set for `service`, `None` for a name never set.
    pub(crate) fn get(&self, service: &str) -> Option<ServingStatus> {
        self.map.get(service).copied()
    }

    /// What `Watch` streams: as `get`, SERVICE_UNKNOWN for an unknown name.
    pub(crate) fn watched(&self, service: &str) -> ServingStatus {
        self.get(service).unwrap_or(ServingStatus::ServiceUnknown)
    }
}

/// Sets what the server's `grpc.health.v1.Health` service reports, per service name and for the
/// whole server (the empty name `""`). Cheap to clone (an `Arc`); `Send + Sync`.
///
/// Get it from [`ServerBuilder::health_reporter`](crate::ServerBuilder::health_reporter) or
/// [`ServerHandle::health_reporter`](crate::ServerHandle::health_reporter). The server and each
/// service added with `add_service` start SERVING; a status set before `spawn` is kept.
/// [`ServerHandle::shutdown`](crate::ServerHandle::shutdown) turns every status NOT_SERVING and
/// ignores later changes (as grpc-go's `health.Server::Shutdown`): a draining server never
/// reports SERVING again.
///
/// ```
/// # use rpc_core::health::ServingStatus;
/// let builder = rpc_core::Server::builder().add_health_service();
/// let health = builder.health_reporter();
/// // Not ready until the cache is warm (the server's own status, the empty name):
/// health.set_service_status("", ServingStatus::NotServing);
/// // ... later, from any thread:
/// health.set_service_status("", ServingStatus::Serving);
/// assert_eq!(health.status(""), Some(ServingStatus::Serving));
/// ```
#[derive(Clone, Debug)]
pub struct HealthReporter {
    tx: Arc<watch::Sender<Statuses>>,
}

impl HealthReporter {
    /// A reporter whose server is SERVING (`""`) and has no service yet.
    pub(crate) fn new() -> HealthReporter {
        let mut map = HashMap::new();
        map.insert(String::new(), ServingStatus::Serving);
        let (tx, _) = watch::channel(Statuses { map, phase: Phase::Running });
        HealthReporter { tx: Arc::new(tx) }
    }

    /// Reports service `S` (a generated `XxxServer<_>`, by its `Service::NAME`) SERVING.
    pub fn set_serving<S: Service>(&self) {
        self.set_service_status(S::NAME, ServingStatus::Serving);
    }

    /// Reports service `S` NOT_SERVING.
    pub fn set_not_serving<S: Service>(&self) {
        self.set_service_status(S::NAME, ServingStatus::NotServing);
    }

    /// Reports `status` for `service` (a full service name such as `helloworld.Greeter`, or `""`
    /// for the whole server); `Watch` streams of it get the new status. Any name may be set,
    /// registered with the server or not. SERVICE_UNKNOWN (which only `Watch` reports) forgets
    /// the name, as [`HealthReporter::clear_service_status`]. Ignored once the server is
    /// shutting down.
    pub fn set_service_status(&self, service: &str, status: ServingStatus) {
        if status == ServingStatus::ServiceUnknown {
            return self.clear_service_status(service);
        }
        self.tx.send_if_modified(|s| {
            if s.phase != Phase::Running {
                tracing::debug!(
                    service,
                    ?status,
                    "health: status change ignored, the server is shutting down"
                );
                return false;
            }
            s.map.insert(service.to_owned(), status) != Some(status)
        });
    }

    /// Forgets `service`: `Check` answers NOT_FOUND for it and `Watch` streams SERVICE_UNKNOWN.
    /// Ignored once the server is shutting down.
    pub fn clear_service_status(&self, service: &str) {
        self.tx.send_if_modified(|s| s.phase == Phase::Running && s.map.remove(service).is_some());
    }

    /// The status reported for `service` (`""`: the server), `None` when it has none.
    pub fn status(&self, service: &str) -> Option<ServingStatus> {
        self.tx.borrow().get(service)
    }

    /// `Watch` streams open now (each ends when its client cancels it, its session or deadline
    /// ends it, or the server drains).
    pub fn watchers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// True once the server's shutdown began (every status NOT_SERVING).
    pub fn is_draining(&self) -> bool {
        self.tx.borrow().phase != Phase::Running
    }

    /// `add_service`: a service starts SERVING unless a status was set for it before.
    pub(crate) fn register(&self, service: &str) {
        self.tx.send_if_modified(|s| {
            if s.phase != Phase::Running || s.map.contains_key(service) {
                return false;
            }
            s.map.insert(service.to_owned(), ServingStatus::Serving);
            true
        });
    }

    /// `shutdown` begins: every status NOT_SERVING, later changes ignored; watchers told.
    /// False when it had begun before.
    pub(crate) fn begin_drain(&self) -> bool {
        let mut first = false;
        self.tx.send_modify(|s| {
            first = s.phase == Phase::Running;
            if first {
                s.phase = Phase::Draining;
                s.map.values_mut().for_each(|v| *v = ServingStatus::NotServing);
            }
        });
        first
    }

    /// The drain proper begins: `Watch` streams end once they sent the last status.
    pub(crate) fn close(&self) {
        self.tx.send_if_modified(|s| {
            let was = s.phase;
            s.phase = Phase::Closed;
            was != Phase::Closed
        });
    }

    /// A receiver woken by every change (a `Watch` stream's).
    pub(crate) fn subscribe(&self) -> watch::Receiver<Statuses> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_start_serving_unless_set_before_and_shutdown_freezes_not_serving() {
        let r = HealthReporter::new();
        assert_eq!(r.status(""), Some(ServingStatus::Serving));
        r.set_service_status("a.A", ServingStatus::NotServing);
        r.register("a.A");
        r.register("b.B");
        assert_eq!(r.status("a.A"), Some(ServingStatus::NotServing), "a status set before add_service stays");
        assert_eq!(r.status("b.B"), Some(ServingStatus::Serving));
        assert_eq!(r.status("c.C"), None);
        r.set_service_status("b.B", ServingStatus::ServiceUnknown);
        assert_eq!(r.status("b.B"), None, "SERVICE_UNKNOWN forgets the name");
        assert!(!r.is_draining());
        let mut rx = r.subscribe();
        rx.borrow_and_update();
        assert!(r.begin_drain());
        assert!(!r.begin_drain(), "once");
        assert!(rx.has_changed().unwrap(), "watchers are told");
        assert!(r.is_draining());
        assert_eq!(r.status(""), Some(ServingStatus::NotServing));
        assert_eq!(r.status("a.A"), Some(ServingStatus::NotServing));
        r.set_service_status("", ServingStatus::Serving);
        r.register("d.D");
        r.clear_service_status("a.A");
        assert_eq!(r.status(""), Some(ServingStatus::NotServing), "a draining server never serves again");
        assert_eq!(r.status("d.D"), None);
        assert_eq!(r.status("a.A"), Some(ServingStatus::NotServing));
        r.close();
        assert_eq!(rx.borrow().phase, Phase::Closed);
    }
}
