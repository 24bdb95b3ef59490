//! Where the servers are: a [`Resolver`] yields the set of server addresses and its changes.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::status::Status;

/// A source of server addresses for a balanced channel ([`crate::Channel::balanced`]).
///
/// The channel calls [`Resolver::next`] first on the thread that builds it (the initial set),
/// then, unless [`Resolver::is_static`], from a thread of its own (`rpc-resolve`) in a loop
/// until the channel is dropped.
pub trait Resolver: Send + 'static {
    /// The full set of servers when it changed since the last call (the first call returns the
    /// initial set, possibly empty), or `None` when it did not change within `wait`. May block
    /// up to about `wait` (the resolver thread looks whether the channel is still there between
    /// two calls, so a resolver that blocks much longer delays the thread's exit, not the
    /// channel's).
    ///
    /// # Errors
    /// Any status: on the first call the channel is not built ([`crate::Channel::balanced`]
    /// returns it); later, the error is logged and the last set is kept.
    fn next(&mut self, wait: Duration) -> Result<Option<Vec<SocketAddr>>, Status>;

    /// True when the set never changes after the first call: no resolver thread is started.
    /// Default false.
    fn is_static(&self) -> bool {
        false
    }
}

/// A fixed list of servers.
#[derive(Clone, Debug)]
pub struct StaticResolver {
    addrs: Option<Vec<SocketAddr>>,
}

impl StaticResolver {
    /// The servers at `addrs` (duplicates are kept once).
    pub fn new(addrs: impl IntoIterator<Item = SocketAddr>) -> StaticResolver {
        StaticResolver { addrs: Some(normalize(addrs.into_iter().collect())) }
    }
}

impl Resolver for StaticResolver {
    fn next(&mut self, wait: Duration) -> Result<Option<Vec<SocketAddr>>, Status> {
        match self.addrs.take() {
            Some(a) => Ok(Some(a)),
            None => {
                std::thread::sleep(wait);
                Ok(None)
            }
        }
    }

    fn is_static(&self) -> bool {
        true
    }
}

/// A DNS name (`host:port`) whose addresses are the servers, resolved again every
/// [`DnsResolver::interval`] with the system resolver (`ToSocketAddrs`, so `/etc/hosts` and
/// literal addresses work too). A failed re-resolution keeps the last set (logged at warn):
/// a DNS outage does not empty the channel.
#[derive(Clone, Debug)]
pub struct DnsResolver {
    name: String,
    interval: Duration,
    last: Option<Vec<SocketAddr>>,
    due: Option<Instant>,
}

/// Default re-resolution interval of a [`DnsResolver`]: 30 s.
pub const DNS_INTERVAL: Duration = Duration::from_secs(30);

impl DnsResolver {
    /// Resolves `name` (`host:port`) every [`DNS_INTERVAL`].
    pub fn new(name: impl Into<String>) -> DnsResolver {
        DnsResolver { name: name.into(), interval: DNS_INTERVAL, last: None, due: None }
    }

    /// Re-resolves every `interval` instead (at least 10 ms; less is raised to it).
    pub fn interval(mut self, interval: Duration) -> DnsResolver {
        self.interval = interval.max(Duration::from_millis(10));
        self
    }

    fn resolve(&self) -> Result<Vec<SocketAddr>, Status> {
        let addrs = self
            .name
            .to_socket_addrs()
            .map_err(|e| Status::unavailable(format!("resolving {}: {e}", self.name)))?;
        Ok(normalize(addrs.collect()))
    }
}

impl Resolver for DnsResolver {
    fn next(&mut self, wait: Duration) -> Result<Option<Vec<SocketAddr>>, Status> {
        let Some(due) = self.due else {
            let set = self.resolve()?;
            self.last = Some(set.clone());
            self.due = Some(Instant::now() + self.interval);
            return Ok(Some(set));
        };
        let now = Instant::now();
        if now < due {
            std::thread::sleep(wait.min(due - now));
            if Instant::now() < due {
                return Ok(None);
            }
        }
        self.due = Some(Instant::now() + self.interval);
        match self.resolve() {
            Ok(set) if self.last.as_ref() != Some(&set) => {
                tracing::info!(name = %self.name, servers = set.len(), "DNS: the set of servers changed");
                self.last = Some(set.clone());
                Ok(Some(set))
            }
            Ok(_) => Ok(None),
            Err(e) => {
                tracing::warn!(name = %self.name, error = %e, "DNS: re-resolving failed; the last set is kept");
                Ok(None)
            }
        }
    }
}

/// Sorted, each address once.
pub(crate) fn normalize(mut v: Vec<SocketAddr>) -> Vec<SocketAddr> {
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_yields_once_then_nothing() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let mut r = StaticResolver::new([b, a, b]);
        assert_eq!(r.next(Duration::ZERO).unwrap(), Some(vec![a, b]));
        assert_eq!(r.next(Duration::ZERO).unwrap(), None);
        assert!(r.is_static());
    }

    #[test]
    fn dns_resolves_a_literal_then_reports_no_change() {
        let mut r = DnsResolver::new("127.0.0.1:7000").interval(Duration::from_millis(10));
        let a: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(r.next(Duration::ZERO).unwrap(), Some(vec![a]));
        // Past the interval: resolved again, same set, so no change.
        assert_eq!(r.next(Duration::from_millis(30)).unwrap(), None);
        assert!(!r.is_static());
    }

    #[test]
    fn dns_first_failure_is_an_error() {
        let mut r = DnsResolver::new("no-such-host.invalid:1");
        assert!(r.next(Duration::ZERO).is_err());
    }
}
