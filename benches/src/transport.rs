//! Picks the provider at run time from `--transport` and runs everything monomorphized for it.

use rpc_core::verbs::sim::Sim;

use crate::cli::{Args, TransportKind};
use crate::error::PerfError;
use crate::results::RunReport;

/// The provider a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// The software NIC.
    Sim,
    /// libibverbs.
    Rdma,
}

/// Resolves `auto`: `rdma` when `-d` is given or libibverbs lists a device, else `sim`.
pub fn resolve(args: &Args) -> Resolved {
    match args.transport {
        TransportKind::Sim => Resolved::Sim,
        TransportKind::Rdma => Resolved::Rdma,
        TransportKind::Auto if args.ib_dev.is_some() => Resolved::Rdma,
        TransportKind::Auto if rdma_devices_exist() => Resolved::Rdma,
        TransportKind::Auto => Resolved::Sim,
    }
}

#[cfg(feature = "ibverbs")]
pub(crate) fn rdma_devices_exist() -> bool {
    use rpc_core::verbs::Provider as _;
    rpc_core::verbs::ibverbs::Ibverbs::devices().is_ok_and(|d| !d.is_empty())
}

#[cfg(not(feature = "ibverbs"))]
pub(crate) fn rdma_devices_exist() -> bool {
    false
}

/// Validates `args` and runs them on the resolved provider.
///
/// # Errors
/// A flag conflict, or the run's first failure.
pub fn run(args: &Args) -> Result<Option<RunReport>, PerfError> {
    args.validate().map_err(PerfError::Setup)?;
    match resolve(args) {
        Resolved::Sim => crate::run::run::<Sim>(args, Resolved::Sim),
        Resolved::Rdma => run_rdma(args),
    }
}

#[cfg(feature = "ibverbs")]
fn run_rdma(args: &Args) -> Result<Option<RunReport>, PerfError> {
    crate::run::run::<rpc_core::verbs::ibverbs::Ibverbs>(args, Resolved::Rdma)
}

#[cfg(not(feature = "ibverbs"))]
fn run_rdma(_args: &Args) -> Result<Option<RunReport>, PerfError> {
    Err(PerfError::Setup(
        "--transport rdma: this rpc-perf was built without the `ibverbs` feature (rebuild with default features)".into(),
    ))
}
