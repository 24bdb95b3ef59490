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
//! (perftest's `-d -i -x -s -a -n -D -t -r -Q -I` mean what they mean there).
//!
//! More runs:
//!
//! ```text
//! rpc-perf --loopback --test rpc_bw -c 32 -D 5            # RPCs/s with 32 calls in flight
//! rpc-perf --loopback --test rpc_bw -s 1M -D 5            # 1 MiB each way, vs memcpy
//! rpc-perf --loopback --test chan_bw --tasks 8 -c 32      # the shareable handle from 8 tokio tasks
//! rpc-perf --loopback --test stream_bw -s 64K              # server-streaming messages/s, goodput
//! rpc-perf --loopback --test stream_in_bw,stream_bidi_bw   # client and bidirectional streaming
//! rpc-perf --loopback -a --test rpc_lat,send_lat --plot sweep.svg --json sweep.json
//! rpc-perf --transport rdma -d mlx5_0 -x 3                # server on host A
//! rpc-perf --transport rdma -d mlx5_0 -x 3 hostA          # client on host B
//! rpc-perf --loopback --test send_lat --use-srq -r 512     # 512 receive WQEs posted (perftest's -r)
//! ```
//!
//! The footprint of a default server (idle RSS, median and p99 start and stop times):
//!
//! ```text
//! cargo run --release -p rpc-perf --example footprint -- 50
//! ```
//!
//! Any service of ours, from its .proto, with requests as JSON ([`dynamic`]):
//!
//! ```text
//! rpc-perf call  HOST:PORT kv.Kv/Get --proto proto/kv.proto --data '{"key":"a"}'
//! rpc-perf bench HOST:PORT kv.Kv/Get --proto proto/kv.proto --data '{"key":"a"}' -c 32 -D 5
//! rpc-perf --persist        # serve clients until killed; the bench service stays up on -p + 1
//! ```
//!
//! What the figures mean:
//! - Latency is always the **round trip** (perftest's send_lat/write_lat print half of it), in
//!   µs, from one timestamp per iteration (perftest's `tposted[i+1] - tposted[i]`), after
//!   `--warmup` unmeasured iterations. Percentiles come from an HDR histogram (3 significant
//!   digits); `t_typical` is the median.
//! - Bandwidth is perftest's: MB = 2^20 bytes, BW average over the whole run, BW peak over the
//!   best interval of at least 1 ms. For rpc_bw it counts request + response payload, and the
//!   RPC columns give calls per second and that goodput in Gbit/s; for stream_bw it counts the
//!   streamed payload (one way) and the columns give messages per second.
//! - memcpy (after an rpc_bw of 64 KiB or more per call): single-thread copies of the call's
//!   size, hot (same buffers) and cold (64 MiB working set); the average goodput is given as a
//!   fraction of each.
//! - The raw tests use the same provider as the RPCs and an RC QP set up like perftest's;
//!   `--use-srq -I 0` makes their receive side and inlining match the RPC workers' (SRQ, no
//!   inline).

pub mod chan;
pub mod cli;
pub mod clock;
pub mod dynamic;
pub mod error;
pub mod host;
pub mod measure;
pub mod memcpy;
pub mod multi;
pub mod oob;
pub mod plot;
pub mod poll;
pub mod progress;
pub mod raw;
pub mod report;
pub mod results;
pub mod rpc;
pub mod rpc_async;
pub mod run;
pub mod sink;
pub mod stats;
pub mod stream;
pub mod transport;

pub use cli::Args;
pub use error::PerfError;
