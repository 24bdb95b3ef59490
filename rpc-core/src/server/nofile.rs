//! The open-file limit a server needs: a session holds its TCP control connection (one file
//! descriptor) for as long as it lives, idle or not, and the default soft limit of a Linux
//! process (`ulimit -n`, 1,024) is far below `ServerConfig::max_sessions` at scale. Sessions
//! beyond `ServerConfig::max_control_connections` (by default what the limit leaves, see
//! [`control_connections`]) hold none ([`crate::wire::FLAG_DETACHED`]).
//!
//! As servers do (Go's runtime since 1.19 at every start, nginx's `worker_rlimit_nofile`), a
//! server raises its process's soft `RLIMIT_NOFILE` to the hard limit when it starts, and says
//! so at info; when even the hard limit is below what `max_sessions` needs, it warns, naming the
//! figures: connections beyond it then wait in the listen backlog (the accept fails `EMFILE`,
//! logged) until a descriptor frees or their client's `connect_timeout` passes; nothing else is
//! disturbed.

/// Descriptors a server holds besides its sessions' control connections: the listening socket,
/// the poller, the workers' wake-ups, the device's files, a handshake or two in progress, and
/// the process's own (stdio, logs).
pub(crate) const NOFILE_SLACK: u64 = 64;

/// Descriptors [`control_connections`] leaves to everything but control connections: the
/// [`NOFILE_SLACK`], the handshakes in progress (at most 64, then the oldest is dropped) and
/// the replies waiting for a bind.
pub(crate) const CONTROL_SLACK: u64 = 2 * NOFILE_SLACK;

/// The default `ServerConfig::max_control_connections`: the soft open-file limit (after
/// [`raise_nofile`]) less [`CONTROL_SLACK`], at least 1; `usize::MAX` (no limit of its own)
/// when the limit could not be read or is unlimited.
pub(crate) fn control_connections(limit: Option<NofileLimit>) -> usize {
    match limit {
        Some(l) if l.soft < u64::from(u32::MAX) => l.soft.saturating_sub(CONTROL_SLACK).max(1) as usize,
        _ => usize::MAX,
    }
}

/// What [`raise_nofile`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NofileLimit {
    /// The soft limit before.
    pub(crate) was: u64,
    /// The soft limit now.
    pub(crate) soft: u64,
    /// The hard limit.
    pub(crate) hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit when it is lower (never lowers it), for a
/// server of `max_sessions` sessions; logs a raise at info and a hard limit below
/// `max_sessions` + [`NOFILE_SLACK`] as a warning. `None` when the limit cannot be read or
/// set (logged; the server starts all the same).
pub(crate) fn raise_nofile(max_sessions: usize) -> Option<NofileLimit> {
    let (was, hard) = match rlimit::Resource::NOFILE.get() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "reading the open-file limit (RLIMIT_NOFILE) failed");
            return None;
        }
    };
    let mut soft = was;
    if was < hard {
        match rlimit::Resource::NOFILE.set(hard, hard) {
            Ok(()) => {
                soft = hard;
                tracing::info!(
                    from = was,
                    to = hard,
                    "raised the open-file soft limit (RLIMIT_NOFILE) to the hard limit: each session \
                     holds a TCP control connection"
                );
            }
            Err(e) => tracing::warn!(soft = was, hard, error = %e, "raising the open-file soft limit failed"),
        }
    }
    let need = (max_sessions as u64).saturating_add(CONTROL_SLACK);
    if soft < need {
        tracing::info!(
            limit = soft,
            max_sessions,
            need,
            "the open-file limit (RLIMIT_NOFILE, `ulimit -n`) is below one control connection per \
             session: sessions beyond it hold none (ServerConfig::max_control_connections; teardown \
             and liveness on the RDMA path)"
        );
    }
    Some(NofileLimit { was, soft, hard })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default leaves the slack, never reaches 0, and is unbounded when the limit is.
    #[test]
    fn control_connections_leave_the_slack() {
        let l = |soft| Some(NofileLimit { was: soft, soft, hard: soft });
        assert_eq!(control_connections(l(20_000)), 20_000 - 128);
        assert_eq!(control_connections(l(100)), 1);
        assert_eq!(control_connections(l(u64::MAX)), usize::MAX);
        assert_eq!(control_connections(None), usize::MAX);
    }

    /// The soft limit ends at the hard one, and a second call changes nothing.
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let Some(first) = raise_nofile(128) else { return };
        assert_eq!(first.soft, first.hard, "{first:?}");
        let again = raise_nofile(128).expect("read once, read again");
        assert_eq!((again.was, again.soft, again.hard), (first.hard, first.hard, first.hard));
    }
}
