//! This machine's single-thread memcpy bandwidth, the yardstick for bulk RPCs: copies of
//! `size`-byte chunks cycling through a 64 MiB source and destination (larger than the caches),
//! for at least 200 ms.

use std::time::{Duration, Instant};

/// Working set of each of the source and destination, in bytes.
const WORKING_SET: usize = 64 << 20;
/// Minimum measuring time.
const MIN_TIME: Duration = Duration::from_millis(200);

/// memcpy bandwidth in MB/s (2^20 bytes/s) for chunks of `size` bytes (1..=64 MiB).
pub fn bandwidth_mb_per_s(size: usize) -> f64 {
    let size = size.clamp(1, WORKING_SET);
    let chunks = WORKING_SET / size;
    let src = vec![0x5au8; chunks * size];
    let mut dst = vec![0u8; chunks * size];
    // Touch both once so page faults are not measured.
    dst.copy_from_slice(&src);
    let start = Instant::now();
    let mut copied = 0u64;
    let mut i = 0usize;
    while start.elapsed() < MIN_TIME || copied < 4 * WORKING_SET as u64 {
        let off = (i % chunks) * size;
        dst[off..off + size].copy_from_slice(&src[off..off + size]);
        std::hint::black_box(&mut dst);
        copied += size as u64;
        i += 1;
    }
    copied as f64 / start.elapsed().as_secs_f64() / (1u64 << 20) as f64
}
