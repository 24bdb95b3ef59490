//! rpc_lat and rpc_bw over the benchmark service (filled in when the runtime lands).

use std::marker::PhantomData;

use rpc_core::verbs::Provider;

use crate::cli::{Args, TestKind};
use crate::error::PerfError;
use crate::oob::OobChannel;
use crate::sink::Sink;

/// Server-side state of the RPC tests.
pub struct ServerState<P: Provider> {
    _p: PhantomData<P>,
}

impl<P: Provider> Default for ServerState<P> {
    fn default() -> Self {
        ServerState { _p: PhantomData }
    }
}

impl<P: Provider> ServerState<P> {
    /// Serves an RPC test.
    ///
    /// # Errors
    /// Always, until the runtime lands.
    pub fn serve(
        &mut self,
        _args: &Args,
        test: TestKind,
        _max: usize,
        _ch: &mut OobChannel,
    ) -> Result<(), PerfError> {
        Err(PerfError::Setup(format!("{}: the RPC runtime is not in this build yet", test.name())))
    }
}

/// Client side of an RPC test.
///
/// # Errors
/// Always, until the runtime lands.
pub fn run_client<P: Provider>(
    _args: &Args,
    test: TestKind,
    _ch: &mut OobChannel,
    _sink: &mut Sink,
) -> Result<(), PerfError> {
    Err(PerfError::Setup(format!("{}: the RPC runtime is not in this build yet", test.name())))
}
