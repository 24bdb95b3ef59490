//! A client endpoint: the device context and PD that sessions to many servers share
//! ([`crate::endpoint::nic::Nic`]), on the provider its transport names, and the progress thread
//! that answers its idle `Client`s' Pings (a dispatcher thread of its own, which only looks:
//! `channel::dispatcher::watch_idle`).
//!
//! The endpoint's client sessions share one SRQ, its receive buffers and one receive CQ, with
//! receives routed by QP number ([`crate::endpoint::rx`]); each keeps its QP and a CQ for its
//! sends. What is shared here is `Send + Sync` on both providers (a device context and a PD
//! may be used from any thread), so a [`Client`] made from an endpoint may move between threads
//! and several threads' clients may share one endpoint.

use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex, Weak};

use super::{Client, ClientConfig};
use crate::endpoint::nic::Nic;
use crate::status::Status;
use crate::transport::Transport;

/// The endpoint's device context and PD, on either provider.
pub(crate) enum AnyNic {
    Sim(Arc<Nic<crate::verbs::sim::Sim>>),
    #[cfg(feature = "ibverbs")]
    Rdma(Arc<Nic<crate::verbs::ibverbs::Ibverbs>>),
}

struct Shared {
    nic: AnyNic,
    transport: Transport,
    /// Its progress thread, while it has one ([`Endpoint::watch_idle`]).
    progress: Arc<crate::channel::dispatcher::Hubs>,
}

/// The name of an endpoint's progress thread.
const PROGRESS_THREAD: &str = "rpc-progress";

/// A client endpoint: one device context, one protection domain, and one SRQ with its receive
/// buffers and receive CQ (per eager threshold), opened once and shared by every session made
/// from it, whichever servers they go to. A process that talks to many
/// servers opens one device context per endpoint instead of one per server (on libibverbs also
/// one async-event thread). `Clone` (a handle to the same endpoint), `Send + Sync`; the device
/// context closes when the endpoint and every session made from it are gone.
///
/// **Progress.** An endpoint's [`Client`]s are looked at while idle by its progress thread
/// (`rpc-progress`, started by the endpoint's first client, ended within 50 ms of its last):
/// every 50 ms (every 400 ms for a client whose looks keep finding it idle, after about 1.4 s
/// of that) it tries each client's lock and, when no call holds it, polls the session's
/// CQs once, which answers the server's idle probe (the clients' handshakes promise it:
/// [`crate::wire::FLAG_IDLE_PONGS`]). A look's poll of the shared receive CQ routes the other
/// sessions' messages to their inboxes and takes its own session's, so every idle session's
/// Pings are taken off the CQ within one round of looks and answered at its own next look (at
/// most 400 ms later), on the endpoint's spare buffers meanwhile (a probe reaching all of them at
/// once closes none as a flood). About every 800 ms it
/// also reads the client's control connection, so a session its server ended by closing that
/// alone is seen broken while idle and the next call reconnects. It sleeps between looks and
/// never spins; calls are driven by their own threads, not by it.
///
/// ```no_run
/// # fn main() -> Result<(), rpc_core::Status> {
/// let endpoint = rpc_core::Endpoint::new(&rpc_core::Transport::Sim)?;
/// let a = endpoint.connect("10.0.0.1:50051")?;
/// let b = endpoint.connect("10.0.0.2:50051")?; // the same device context as `a`
/// # Ok(()) }
/// ```
///
/// [`Client::connect`] takes its thread's endpoint (opened by the thread's first connect, closed
/// with the last session on it), so a thread's clients to any number of servers share one
/// device context; a [`crate::Channel`]'s
/// dispatchers share a process-wide endpoint per core they are pinned to
/// ([`crate::ChannelConfig::core_ids`]; one for the unpinned ones).
#[derive(Clone)]
pub struct Endpoint {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("transport", &self.shared.transport).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Opens the device `transport` names (sim: a new software-NIC host; rdma: the device,
    /// port and GID index given, the GID chosen as the server chooses it) and allocates its PD.
    ///
    /// # Errors
    /// UNAVAILABLE when the device cannot be opened (naming the verbs call), or when
    /// `transport` is `rdma` and this build has no libibverbs provider.
    pub fn new(transport: &Transport) -> Result<Endpoint, Status> {
        let unavailable =
            |e: crate::verbs::VerbsError| Status::unavailable(format!("opening the endpoint: {e}"));
        let nic = match transport {
            Transport::Sim => {
                AnyNic::Sim(Nic::open(&crate::verbs::DeviceSelector::First, 1, -1).map_err(unavailable)?)
            }
            #[cfg(feature = "ibverbs")]
            Transport::Rdma { device, port, gid_index } => {
                let sel: crate::verbs::DeviceSelector = device.parse().unwrap_or_default();
                AnyNic::Rdma(Nic::open(&sel, *port, *gid_index).map_err(unavailable)?)
            }
            #[cfg(not(feature = "ibverbs"))]
            Transport::Rdma { .. } => return Err(Transport::rdma_unavailable()),
        };
        let progress = Arc::new(std::sync::Mutex::new(Vec::new()));
        Ok(Endpoint { shared: Arc::new(Shared { nic, transport: transport.clone(), progress }) })
    }

    /// The transport this endpoint was opened on.
    pub fn transport(&self) -> &Transport {
        &self.shared.transport
    }

    /// Connects a [`Client`] to `addr` on this endpoint, with [`ClientConfig::default`] on this
    /// endpoint's transport.
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Client, Status> {
        let config = ClientConfig { transport: self.shared.transport.clone(), ..ClientConfig::default() };
        self.connect_with(addr, &config)
    }

    /// Connects a [`Client`] to `addr` on this endpoint with `config` (its reconnects stay on
    /// this endpoint).
    ///
    /// # Errors
    /// INVALID_ARGUMENT when `config.transport` is not this endpoint's; otherwise as
    /// [`Client::connect_with`].
    pub fn connect_with(&self, addr: impl ToSocketAddrs, config: &ClientConfig) -> Result<Client, Status> {
        self.check(config)?;
        Client::connect_on(self.clone(), addr, config)
    }

    /// Refuses a configuration for another transport than this endpoint's.
    pub(crate) fn check(&self, config: &ClientConfig) -> Result<(), Status> {
        if config.transport != self.shared.transport {
            return Err(Status::invalid_argument(format!(
                "ClientConfig::transport {:?} is not the endpoint's {:?}",
                config.transport, self.shared.transport
            )));
        }
        Ok(())
    }

    pub(crate) fn nic(&self) -> &AnyNic {
        &self.shared.nic
    }

    /// Hands `look` (a [`Client`]'s session) to this endpoint's progress thread, starting it
    /// when it is not running: every 50 to 400 ms the thread tries the session's lock and, when no
    /// caller holds it, polls its CQ once (answering the server's Pings); it forgets the session
    /// once `look` is gone, and ends when it has none.
    ///
    /// # Errors
    /// UNAVAILABLE when the thread cannot be spawned.
    pub(crate) fn watch_idle(
        &self,
        look: Weak<dyn crate::channel::dispatcher::IdleLook>,
    ) -> Result<(), Status> {
        crate::channel::dispatcher::watch_idle(&self.shared.progress, PROGRESS_THREAD, look)
    }

    /// This thread's endpoint of `transport`, opened by the first [`Client::connect_with`] of
    /// the thread that asks; it closes when the last session and handle on it are gone (the
    /// thread keeps only a weak reference), and the next connect opens another.
    ///
    /// # Errors
    /// As [`Endpoint::new`].
    pub(crate) fn per_thread(transport: &Transport) -> Result<Endpoint, Status> {
        thread_local! {
            static MINE: std::cell::RefCell<Vec<(Transport, Weak<Shared>)>> =
                const { std::cell::RefCell::new(Vec::new()) };
        }
        MINE.with(|mine| {
            let mut mine = mine.borrow_mut();
            mine.retain(|(_, w)| w.strong_count() > 0);
            if let Some(shared) = mine.iter().find(|(t, _)| t == transport).and_then(|(_, w)| w.upgrade()) {
                return Ok(Endpoint { shared });
            }
            let e = Endpoint::new(transport)?;
            mine.push((transport.clone(), Arc::downgrade(&e.shared)));
            Ok(e)
        })
    }

    /// The process-wide endpoint of `transport` for dispatchers pinned to `core` (`None`: the
    /// unpinned ones), opened by the first that asks; it closes when the last session and
    /// handle on it are gone.
    ///
    /// # Errors
    /// As [`Endpoint::new`].
    pub(crate) fn per_core(transport: &Transport, core: Option<usize>) -> Result<Endpoint, Status> {
        type Entry = (Transport, Option<usize>, Weak<Shared>);
        static OPEN: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, _, w)| w.strong_count() > 0);
        let found =
            open.iter().find(|(t, c, _)| t == transport && *c == core).and_then(|(_, _, w)| w.upgrade());
        if let Some(shared) = found {
            return Ok(Endpoint { shared });
        }
        // Opened under the lock: two dispatchers of one core starting at once open one.
        let e = Endpoint::new(transport)?;
        open.push((transport.clone(), core, Arc::downgrade(&e.shared)));
        Ok(e)
    }
}
