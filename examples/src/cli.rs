//! What the example binaries share: the flags that pick the NIC, as rpc-perf's
//! (`--transport sim|rdma`, `-d/--ib-dev`, `-i/--ib-port`, `-x/--gid-index`, plus `--poll`),
//! parsed by clap (a bad flag or value gets clap's error and exit status 2), the server and
//! client configurations made from them, and how a binary serves and fails.

use std::fmt::Display;

use rpc_core::{ClientConfig, PollingPolicy, Server, ServerBuilder, ServerHandle, Transport};

/// Transport selection.
#[derive(clap::Args, Debug, Clone)]
pub struct TransportArgs {
    /// NIC provider: `sim` (software NIC, in-process hosts) or `rdma` (libibverbs).
    #[arg(long, value_enum, default_value_t = TransportKind::Sim)]
    pub transport: TransportKind,
    /// RDMA device by name (mlx5_0, rxe0) or index; default the first.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// Port of the device (1-based).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    pub ib_port: u8,
    /// GID index; -1 picks one (RoCEv2 with an IPv4 address first).
    #[arg(short = 'x', long = "gid-index", default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1..=255))]
    pub gid_index: i32,
    /// How waiting threads poll: `busy`, `yield[:SPINS]` or `event[:SPINS]`.
    #[arg(long, default_value = "yield", value_parser = PollingPolicy::parse)]
    pub poll: PollingPolicy,
}

/// `--transport` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The software NIC.
    Sim,
    /// libibverbs.
    Rdma,
}

impl TransportArgs {
    /// A server builder on this transport with this polling policy (other settings default).
    pub fn server(&self) -> ServerBuilder {
        Server::builder().transport(self.transport()).polling(self.poll)
    }

    /// A client configuration on this transport with this polling policy (other settings
    /// default).
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::default().transport(self.transport()).polling(self.poll)
    }

    /// The runtime's transport.
    pub fn transport(&self) -> Transport {
        match self.transport {
            TransportKind::Sim => Transport::Sim,
            TransportKind::Rdma => Transport::Rdma {
                device: self.ib_dev.clone().unwrap_or_default(),
                port: self.ib_port,
                gid_index: self.gid_index,
            },
        }
    }
}

/// On `Err`, ends the program as [`fail`] does; on `Ok`, returns.
pub fn exit_on_error(program: &str, result: Result<(), String>) {
    if let Err(e) = result {
        fail(program, e);
    }
}

/// Ends the program: `<program>: error: <error>` on stderr, exit status 1.
pub fn fail(program: &str, error: impl Display) -> ! {
    eprintln!("{program}: error: {error}");
    std::process::exit(1)
}

/// Serves until the process is killed: prints `<program>: <service> listening on <addr>` once
/// `server` started, or ends the program as [`fail`] does when it did not.
pub fn serve_until_killed(program: &str, service: &str, server: Result<ServerHandle, impl Display>) -> ! {
    match server {
        Ok(handle) => {
            println!("{program}: {service} listening on {}", handle.local_addr());
            loop {
                std::thread::park();
            }
        }
        Err(e) => fail(program, e),
    }
}

/// The tokio runtime of the examples that call through a `Channel`: multi-thread, 2 workers,
/// timers and I/O enabled.
///
/// # Errors
/// The runtime's build error, as text.
pub fn tokio_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}
