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

/// This process's resident memory in KiB (`Rss` over `/proc/self/smaps`) less the pages of
/// other processes' software-NIC host segments (`/dev/shm/rpc-sim.UID.PID.HOST` of another PID)
/// it has mapped: a sim transfer copies through the peer's segment, and the shared pages it
/// touched count in the RSS of both processes though they are the peer's memory. 0 when
/// `/proc/self/smaps` cannot be read.
pub fn own_rss_kib() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let peer_marker = format!(".{}.", std::process::id());
    let mut peer = false;
    let mut kib = 0;
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if !peer {
                kib += rss.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|range| range.contains('-') && !range.contains(':'))
        {
            // A mapping's first line: `start-end perms offset dev inode [path]`.
            peer = line
                .split_whitespace()
                .nth(5)
                .is_some_and(|path| path.starts_with("/dev/shm/rpc-sim.") && !path.contains(&peer_marker));
        }
    }
    kib
}

/// The 1-minute load average as `/proc/loadavg` gives it; empty when it cannot be read.
pub fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split(' ').next().map(str::to_string))
        .unwrap_or_default()
}

/// The calling thread's scheduling as `/proc/thread-self` gives it: the CPU it last ran on
/// (`stat` field 39) and its voluntary and involuntary context switches so far; `None` when
/// they cannot be read (not Linux). A latency figure on a 2-core machine depends on whether the
/// measuring thread shared a core with the server's pinned worker: printed next to it.
pub fn thread_sched() -> Option<(u32, u64, u64)> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command's closing parenthesis, starting at field 3 (state).
    let after = stat.rsplit_once(')')?.1;
    let cpu = after.split_whitespace().nth(39 - 3)?.parse().ok()?;
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok())
    };
    Some((cpu, field("voluntary_ctxt_switches:")?, field("nonvoluntary_ctxt_switches:")?))
}

/// CPU time process `pid` has used so far, user and system together, in ns (`/proc/PID/stat`
/// fields 14 and 15, in clock ticks of `USER_HZ`: 10 ms on x86-64 and arm64, so a difference
/// over a window of seconds is good to about a percent of a core); `None` when it cannot be read
/// (not Linux, the process ended).
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis, starting at field 3 (state).
    let mut f = stat.rsplit_once(')')?.1.split_whitespace().skip(14 - 3);
    let (user, system): (u64, u64) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?);
    // USER_HZ is 100 in the kernel's ABI on these architectures, whatever its CONFIG_HZ.
    Some((user + system) * 10_000_000)
}
