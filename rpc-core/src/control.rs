//! The TCP control channel's liveness, shared by the server's listener and the client's connect:
//! TCP keepalive and `TCP_USER_TIMEOUT` derived from one detection time, so that a peer host that
//! vanishes silently (power loss, a cut link, a partition) turns its control connection into a
//! read error within that time, on an idle connection as on one with unacknowledged data.
//!
//! With a detection time `T` (see [`Liveness::new`]): keepalive probes every `i = max(1 s, T/10)`
//! after `T/2` of silence, and `TCP_USER_TIMEOUT = T − i`. On Linux the user timeout also decides
//! when keepalive gives up (at the first probe once `T − i` passed since the peer was last heard),
//! and the same bound fails a connection whose sent data stays unacknowledged. The peer's death is
//! seen by the kernel at most `T` after it was last heard of, and by our next read at once.

use std::io;
use std::net::TcpStream;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};

use crate::status::Status;

/// The default detection time of a silent control connection: 10 s.
pub(crate) const DEFAULT_LIVENESS_TIMEOUT: Duration = Duration::from_secs(10);

/// Shortest detection time accepted: 2 s (keepalive counts whole seconds).
pub(crate) const MIN_LIVENESS_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest detection time accepted: 1 h.
pub(crate) const MAX_LIVENESS_TIMEOUT: Duration = Duration::from_secs(3600);

/// The socket options that detect a dead peer within a detection time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Liveness {
    /// Silence before the first keepalive probe (whole seconds, at least 1).
    pub(crate) idle: Duration,
    /// Between keepalive probes (whole seconds, at least 1).
    pub(crate) interval: Duration,
    /// Probes sent before the kernel gives up when no user timeout applies.
    pub(crate) probes: u32,
    /// `TCP_USER_TIMEOUT`: how long sent data (or probes) may stay unacknowledged.
    pub(crate) user_timeout: Duration,
}

impl Liveness {
    /// The options for detection time `timeout`.
    ///
    /// # Errors
    /// A message naming the valid range when `timeout` is outside
    /// [`MIN_LIVENESS_TIMEOUT`]`..=`[`MAX_LIVENESS_TIMEOUT`].
    pub(crate) fn new(timeout: Duration) -> Result<Liveness, String> {
        if !(MIN_LIVENESS_TIMEOUT..=MAX_LIVENESS_TIMEOUT).contains(&timeout) {
            return Err(format!("{timeout:?} is not in {MIN_LIVENESS_TIMEOUT:?}..={MAX_LIVENESS_TIMEOUT:?}"));
        }
        let secs = |d: Duration| Duration::from_secs(d.as_secs().max(1));
        let interval = secs(timeout / 10);
        let idle = secs(timeout / 2);
        let user_timeout = timeout - interval;
        // Enough probes to reach the user timeout (the kernel stops at whichever comes first).
        let probes = (user_timeout.saturating_sub(idle).as_secs() / interval.as_secs()) as u32 + 1;
        Ok(Liveness { idle, interval, probes, user_timeout })
    }

    /// [`Liveness::new`] for a client's `ClientConfig::liveness_timeout`.
    ///
    /// # Errors
    /// INVALID_ARGUMENT naming the field and the valid range.
    pub(crate) fn for_client(timeout: Duration) -> Result<Liveness, Status> {
        Liveness::new(timeout)
            .map_err(|why| Status::invalid_argument(format!("ClientConfig::liveness_timeout {why}")))
    }

    /// Sets `SO_KEEPALIVE`, `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT` and `TCP_USER_TIMEOUT`
    /// on `stream`.
    ///
    /// # Errors
    /// The OS error of the `setsockopt` that failed.
    pub(crate) fn apply(&self, stream: &TcpStream) -> io::Result<()> {
        let sock = SockRef::from(stream);
        let ka =
            TcpKeepalive::new().with_time(self.idle).with_interval(self.interval).with_retries(self.probes);
        sock.set_tcp_keepalive(&ka)?;
        sock.set_tcp_user_timeout(Some(self.user_timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_detect_within_the_timeout() {
        for t in [2, 3, 5, 10, 30, 600, 3600] {
            let l = Liveness::new(Duration::from_secs(t)).unwrap();
            // The kernel gives up at the first probe at or after the user timeout since the peer
            // was last heard: probes are sent at idle + k × interval.
            let ut = l.user_timeout.as_secs();
            let (idle, i) = (l.idle.as_secs(), l.interval.as_secs());
            let first_at_or_after = if ut <= idle { idle } else { idle + (ut - idle).div_ceil(i) * i };
            assert!(first_at_or_after <= t, "T {t}: {l:?} gives up at {first_at_or_after} s");
            assert!(idle + u64::from(l.probes) * i >= ut, "T {t}: {l:?} runs out of probes early");
            assert!(l.user_timeout < Duration::from_secs(t) && l.user_timeout > Duration::ZERO);
        }
        let d = Liveness::new(DEFAULT_LIVENESS_TIMEOUT).unwrap();
        assert_eq!(
            (d.idle, d.interval, d.user_timeout),
            (Duration::from_secs(5), Duration::from_secs(1), Duration::from_secs(9))
        );
        assert!(Liveness::new(Duration::from_secs(1)).unwrap_err().contains("not in 2s..=3600s"));
        assert!(Liveness::new(Duration::from_secs(3601)).is_err());
    }

    #[test]
    fn options_reach_the_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let live = Liveness::new(Duration::from_secs(4)).unwrap();
        live.apply(&s).unwrap();
        let r = SockRef::from(&s);
        assert!(r.keepalive().unwrap());
        assert_eq!(r.tcp_keepalive_time().unwrap(), live.idle);
        assert_eq!(r.tcp_keepalive_interval().unwrap(), live.interval);
        assert_eq!(r.tcp_keepalive_retries().unwrap(), live.probes);
        assert_eq!(r.tcp_user_timeout().unwrap(), Some(live.user_timeout));
    }
}
