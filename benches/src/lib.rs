//! rpc-perf: perftest-style latency and bandwidth of RPCs and of raw verbs on the same transport.
//!
//! Quick start (software NIC, one process, two pinned cores):
//!
//! ```text
//! cargo run --release -p rpc-perf -- --loopback
//! ```
//!
//! prints the round-trip latency of a 32-byte unary RPC next to a raw SEND/RECV ping-pong on the
//! same provider and QP setup, and their ratio. `rpc-perf --help` lists the tests and flags
//! (perftest's `-d -i -x -s -a -n -D` mean what they mean there).

pub mod cli;
pub mod error;
pub mod measure;
pub mod memcpy;
pub mod oob;
pub mod plot;
pub mod poll;
pub mod progress;
pub mod raw;
pub mod report;
pub mod results;
pub mod rpc;
pub mod run;
pub mod sink;
pub mod stats;
pub mod transport;

pub use cli::Args;
pub use error::PerfError;
