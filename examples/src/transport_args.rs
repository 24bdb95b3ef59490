//! The flags every example takes to pick its NIC, as rpc-perf's: `--transport sim|rdma`,
//! `-d/--ib-dev`, `-i/--ib-port`, `-x/--gid-index`, plus `--poll`.

use rpc_core::{PollingPolicy, Transport};

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
