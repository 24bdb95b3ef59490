//! Many servers behind one [`Channel`]: a [`Resolver`] finds them, a [`Balancer`] picks one per
//! call by a [`Policy`].
//!
//! ```no_run
//! use std::time::Duration;
//! use rpc_core::balance::{BalanceConfig, DnsResolver, Policy, StaticResolver};
//! use rpc_core::{CallOptions, Channel};
//!
//! # fn main() -> Result<(), rpc_core::Status> {
//! // Three servers, round robin:
//! let addrs = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"].map(|a| a.parse().unwrap());
//! let channel = Channel::balanced(StaticResolver::new(addrs), &BalanceConfig::default())?;
//! // Every address of a DNS name, re-resolved every 10 s, power of two choices:
//! let config = BalanceConfig::default().policy(Policy::PowerOfTwoChoices);
//! let channel = Channel::balanced(DnsResolver::new("kv.internal:50051").interval(Duration::from_secs(10)), &config)?;
//! // Consistent hashing: the key of each call in its options.
//! let config = BalanceConfig::default().policy(Policy::ConsistentHash { vnodes: 160 });
//! let channel = Channel::balanced(StaticResolver::new(addrs), &config)?;
//! let opts = CallOptions::default().with_key(42); // e.g. a hash of the user id
//! // Generated stubs take it as they take any channel: `KvClient::from_channel(channel)`,
//! // and `client.get_with(req, &opts)`.
//! # Ok(()) }
//! ```
//!
//! **What a balanced channel is.** A [`Channel`] like any other (generated stubs take it through
//! their `from_channel`), whose calls go to single-server channels, one per server, each with
//! [`BalanceConfig::channel`]'s dispatchers and sessions. A server is connected at the first
//! call after it appeared (lazily: building the channel connects nothing); a call made while no
//! server is up yet waits on one that is connecting. When a server dies its calls in flight
//! end UNAVAILABLE (never re-sent, never lost silently), it is marked down, and new calls go to
//! the others; after a backoff (from [`BalanceConfig::retry_initial`], doubling to
//! [`BalanceConfig::retry_max`]) a fresh connect is tried in the background, and the server
//! takes calls again once it is up. See [`balancer`]'s module docs for the states.
//!
//! **Policies.** [`Policy::RoundRobin`]: in turn. [`Policy::PowerOfTwoChoices`]: the less loaded
//! of two servers drawn at random, the load being what each server reported on its last
//! response (or this client's calls in flight on it, or a load given with
//! [`Balancer::report_load`]). [`Policy::ConsistentHash`]: a ring of virtual
//! nodes; the key comes from [`crate::CallOptions::with_key`].
//!
//! **Load reported by servers.** Every response carries the server's load in its header's
//! `count` (protocol 8): the requests its sessions have admitted and not yet answered, over all
//! its clients. Power of two choices compares that (while fresh: a report with no newer one for
//! [`BalanceConfig::load_fresh`] falls back to this client's own calls in flight on the server),
//! which tonic's balancer lacks (it counts every endpoint's load as zero).
//!
//! **Health and drain.** A call or stream that ends UNAVAILABLE (a draining server answers new
//! calls UNAVAILABLE "shutting down"; a broken session fails its calls UNAVAILABLE) marks its
//! server down. With [`BalanceConfig::health_check`], each server's channel also holds a
//! `grpc.health.v1` Watch: NOT_SERVING (a draining server says it first, during
//! `ServerConfig::drain_grace`) stops picks of the server before any call is refused, SERVING
//! resumes them. [`Balancer::set_serving`] does the same for health learnt elsewhere.
//!
//! **Streams** are picked like unary calls (the key of their options too).

pub mod balancer;
#[cfg(feature = "etcd")]
pub mod etcd;
mod policy;
mod resolver;

use std::sync::{Arc, Weak};
use std::time::Duration;

pub use balancer::{Balancer, ServerState, ServerStatus};
pub use policy::Policy;
pub use resolver::{DnsResolver, Resolver, StaticResolver, DNS_INTERVAL};

use crate::channel::{Channel, ChannelConfig};
use crate::status::Status;

/// How long one call of the resolver thread to [`Resolver::next`] may block: also how long the
/// thread may outlive its channel. 200 ms.
pub const RESOLVE_WAIT: Duration = Duration::from_millis(200);

/// Configuration of a balanced channel ([`Channel::balanced`]).
#[derive(Clone, Debug)]
pub struct BalanceConfig {
    /// Each server's channel (dispatchers, sessions, queue...). Default
    /// `ChannelConfig::default()`. Every server's sessions run on the same dispatcher threads,
    /// one per core of its `core_ids` (see `ChannelConfig::thread_name`).
    pub channel: ChannelConfig,
    /// How a server is picked. Default [`Policy::RoundRobin`].
    pub policy: Policy,
    /// Backoff before a server that went down is tried again, after its first failure in a
    /// row; doubles with each further failure (±25 % jitter). Default 100 ms.
    pub retry_initial: Duration,
    /// The longest backoff. Default 10 s.
    pub retry_max: Duration,
    /// How long the load a server reported on its last response stands for it with no newer
    /// report ([`Policy::PowerOfTwoChoices`] then counts this client's calls in flight on it
    /// alone): a server that reported a high load and was left alone since is compared on that
    /// count again after it. Default 1 s.
    pub load_fresh: Duration,
    /// The service whose health each server is asked for: `Some(name)` opens a
    /// `grpc.health.v1` Watch for `name` (`""`: the whole server) on each server's channel
    /// when it connects; SERVING lets the balancer pick the server, any other status (a
    /// draining server's NOT_SERVING) stops picks of it until SERVING again. A server without
    /// the health service (UNIMPLEMENTED) is picked as if unwatched. The watch holds one stream
    /// (one call slot) per server. Default `None` (no watch).
    pub health_check: Option<String>,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            channel: ChannelConfig::default(),
            policy: Policy::RoundRobin,
            retry_initial: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            load_fresh: Duration::from_secs(1),
            health_check: None,
        }
    }
}

impl BalanceConfig {
    /// See [`BalanceConfig::channel`].
    pub fn channel(mut self, v: ChannelConfig) -> Self {
        self.channel = v;
        self
    }
    /// See [`BalanceConfig::policy`].
    pub fn policy(mut self, v: Policy) -> Self {
        self.policy = v;
        self
    }
    /// See [`BalanceConfig::retry_initial`].
    pub fn retry_initial(mut self, v: Duration) -> Self {
        self.retry_initial = v;
        self
    }
    /// See [`BalanceConfig::retry_max`].
    pub fn retry_max(mut self, v: Duration) -> Self {
        self.retry_max = v;
        self
    }
    /// See [`BalanceConfig::load_fresh`].
    pub fn load_fresh(mut self, v: Duration) -> Self {
        self.load_fresh = v;
        self
    }
    /// See [`BalanceConfig::health_check`]: watches the health of `service` (`""`: the whole
    /// server).
    pub fn health_check(mut self, service: impl Into<String>) -> Self {
        self.health_check = Some(service.into());
        self
    }
}

impl Channel {
    /// A channel over the servers `resolver` finds, each call to the server `config.policy`
    /// picks (see [`crate::balance`]). Connects nothing: each server is connected at the
    /// first call after it appeared. Calls [`Resolver::next`] once here for the initial set
    /// (a DNS lookup blocks this thread), then, unless the resolver is static, from a thread
    /// of its own (`rpc-resolve`) that ends with the channel.
    ///
    /// # Errors
    /// The resolver's first error; INVALID_ARGUMENT for a configuration value out of range
    /// (named); UNAVAILABLE when the resolver thread cannot be spawned.
    pub fn balanced(mut resolver: impl Resolver, config: &BalanceConfig) -> Result<Channel, Status> {
        config.channel.check()?;
        if config.retry_initial.is_zero() || config.retry_max < config.retry_initial {
            return Err(Status::invalid_argument(format!(
                "BalanceConfig::retry_initial {:?} must be over 0 and at most retry_max {:?}",
                config.retry_initial, config.retry_max
            )));
        }
        let first = resolver.next(Duration::ZERO)?.unwrap_or_default();
        let balancer = Arc::new(Balancer::new(config.clone()));
        balancer.update(first);
        if !resolver.is_static() {
            let weak = Arc::downgrade(&balancer);
            std::thread::Builder::new()
                .name("rpc-resolve".into())
                .spawn(move || resolve(resolver, weak))
                .map_err(|e| Status::unavailable(format!("spawning the resolver thread: {e}")))?;
        }
        Ok(Channel::over(balancer))
    }
}

/// The resolver thread: hands each new set to the balancer until the channel is gone.
fn resolve(mut resolver: impl Resolver, balancer: Weak<Balancer>) {
    while balancer.strong_count() > 0 {
        match resolver.next(RESOLVE_WAIT) {
            Ok(Some(set)) => match balancer.upgrade() {
                Some(b) => b.update(set),
                None => return,
            },
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "resolver failed; the last set of servers is kept");
                std::thread::sleep(RESOLVE_WAIT);
            }
        }
    }
}
