//! What the machine says about this process and its load, for the figures the examples print
//! (`footprint`, `sessions`): wall-clock figures on a shared machine are noisy, so each goes out
//! with the load it was taken at.

/// A `kB` field of `/proc/self/status` (`"VmRSS:"`, `"VmHWM:"`), in KiB; 0 when it cannot be
/// read (not Linux).
pub fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The 1-minute load average as `/proc/loadavg` gives it; empty when it cannot be read.
pub fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split(' ').next().map(str::to_string))
        .unwrap_or_default()
}
