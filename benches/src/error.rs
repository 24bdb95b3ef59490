//! Errors of rpc-perf: each names what failed, so that `main` can print it and exit non-zero.

use rpc_core::verbs::{VerbsError, WcOpcode, WcStatus};

use crate::oob::OobError;

/// Anything that stops a benchmark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PerfError {
    /// A verbs call failed (the text names the call, e.g. a missing device).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The out-of-band TCP channel failed.
    #[error(transparent)]
    Oob(#[from] OobError),
    /// A work request completed with an error.
    #[error(
        "{what}: work completion {status} (wr_id {wr_id}, opcode {opcode:?}, vendor_err {vendor_err:#x})"
    )]
    Completion {
        /// The test and side.
        what: &'static str,
        /// Its status.
        status: WcStatus,
        /// Its wr_id.
        wr_id: u64,
        /// Its opcode (undefined for flush errors).
        opcode: WcOpcode,
        /// Vendor syndrome.
        vendor_err: u32,
    },
    /// Nothing arrived for too long.
    #[error("{what}: no completion for {secs} s (peer gone or QP stuck)")]
    Stalled {
        /// What was awaited.
        what: &'static str,
        /// Seconds waited.
        secs: u64,
    },
    /// A setup or configuration problem, explained.
    #[error("{0}")]
    Setup(String),
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (with the address or path).
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An RPC failed.
    #[error("RPC failed: {0}")]
    Rpc(String),
}
