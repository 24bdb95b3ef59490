//! This machine's single-thread memcpy bandwidth, the yardstick for bulk RPCs, two ways:
//! - hot: the same `size`-byte source and destination over and over (cache-resident up to the
//!   cache size, as an RPC's reused buffers can be);
//! - cold: `size`-byte chunks cycling through a 64 MiB source and destination (larger than the
//!   caches).
//!
//! Each runs for at least 200 ms. MB is 2^20 bytes.

use std::time::{Duration, Instant};

/// Working set of the cold measurement, each of source and destination, in bytes.
const COLD_SET: usize = 64 << 20;
/// Minimum measuring time of each.
const MIN_TIME: Duration = Duration::from_millis(200);

/// memcpy bandwidth of chunks of `size` bytes (clamped to 1..=64 MiB) cycling through
/// `working_set` bytes (at least one chunk), in MB/s.
pub fn bandwidth_mb_per_s(size: usize, working_set: usize) -> f64 {
    let size = size.clamp(1, COLD_SET);
    let chunks = (working_set / size).max(1);
    let src = vec![0x5au8; chunks * size];
    let mut dst = vec![0u8; chunks * size];
    // Touch both once so page faults are not measured.
    dst.copy_from_slice(&src);
    let start = Instant::now();
    let mut copied = 0u64;
    let mut i = 0usize;
    loop {
        for _ in 0..16 {
            let off = (i % chunks) * size;
            dst[off..off + size].copy_from_slice(&src[off..off + size]);
            std::hint::black_box(&mut dst);
            i += 1;
        }
        copied += 16 * size as u64;
        if start.elapsed() >= MIN_TIME {
            break;
        }
    }
    copied as f64 / start.elapsed().as_secs_f64() / (1u64 << 20) as f64
}

/// Hot memcpy bandwidth at `size` (same buffers each time), in MB/s.
pub fn hot_mb_per_s(size: usize) -> f64 {
    bandwidth_mb_per_s(size, size)
}

/// Cold memcpy bandwidth at `size` (64 MiB working set), in MB/s.
pub fn cold_mb_per_s(size: usize) -> f64 {
    bandwidth_mb_per_s(size, COLD_SET)
}

#[cfg(test)]
mod tests {
    #[test]
    fn measures_something_positive() {
        let hot = super::bandwidth_mb_per_s(4096, 4096);
        assert!(hot.is_finite() && hot > 0.0, "{hot}");
    }
}
