//! The TCP control channel's liveness, shared by the server's listener and the client's connect:
//! TCP keepalive and `TCP_USER_TIMEOUT` derived from the peer timeout (`ServerConfig` and
//! `ClientConfig::peer_timeout`, the same detection time as the RDMA idle probe), so that a peer
//! host that vanishes silently (power loss, a cut link, a partition) turns its control
//! connection into a read error within that time, on an idle session as on a busy one. A stopped
//! or hung process is not caught here (its kernel still answers): that is the RDMA probe's job.
//!
//! With a detection time `T` (see [`Liveness::for_peer_timeout`]): keepalive probes every
//! `i = max(1 s, T/10)` after `T/2` of silence, and `TCP_USER_TIMEOUT = T − i`. On Linux the
//! user timeout also decides when keepalive gives up (at the first probe once `T − i` passed
//! since the peer was last heard), and the same bound fails a connection whose sent data stays
//! unacknowledged. The peer's death is seen by the kernel at most `T` after it was last heard
//! of, and by our next read at once.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};

use crate::status::Status;

/// The detection time when the peer timeout is `None` (the RDMA probe is off; keepalive, which
/// a stopped process's kernel still answers, stays on): 10 s.
pub(crate) const DEFAULT_LIVENESS_TIMEOUT: Duration = Duration::from_secs(10);

/// Shortest detection time: 2 s (keepalive counts whole seconds); shorter peer timeouts get it.
pub(crate) const MIN_LIVENESS_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest detection time: 65 534 s (`TCP_KEEPIDLE` is at most 32 767 s); longer ones get it.
pub(crate) const MAX_LIVENESS_TIMEOUT: Duration = Duration::from_secs(65_534);

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
    /// The options for a peer timeout: detection within `peer_timeout` (clamped to
    /// [`MIN_LIVENESS_TIMEOUT`]`..=`[`MAX_LIVENESS_TIMEOUT`]), or [`DEFAULT_LIVENESS_TIMEOUT`]
    /// for `None`.
    pub(crate) fn for_peer_timeout(peer_timeout: Option<Duration>) -> Liveness {
        let timeout = peer_timeout
            .unwrap_or(DEFAULT_LIVENESS_TIMEOUT)
            .clamp(MIN_LIVENESS_TIMEOUT, MAX_LIVENESS_TIMEOUT);
        let secs = |d: Duration| Duration::from_secs(d.as_secs().max(1));
        let interval = secs(timeout / 10);
        let idle = secs(timeout / 2);
        let user_timeout = timeout - interval;
        // Enough probes to reach the user timeout (the kernel stops at whichever comes first).
        let probes = (user_timeout.saturating_sub(idle).as_secs() / interval.as_secs()) as u32 + 1;
        Liveness { idle, interval, probes, user_timeout }
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

/// The first byte of a TLS record carrying a handshake message (a ClientHello): what a TLS
/// client sends first. A plaintext handshake frame starts with its type, 1 or 2.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// An accepted control connection during the server's handshake: its TCP stream and, when the
/// server has `ServerConfig::tls`, the TLS session over it (the frames are read and written
/// through it). Derefs to the TCP stream (socket options, the poll registration). Plaintext
/// costs one peek of the first byte, to tell a client of the other kind.
pub(crate) struct ControlStream {
    tcp: TcpStream,
    #[cfg(feature = "tls")]
    tls: Option<Box<crate::tls::ServerTlsConn>>,
    /// The first byte was looked at ([`ControlStream::sniff`]).
    sniffed: bool,
}

/// What the first byte of an accepted connection says.
pub(crate) enum Sniff {
    /// Nothing arrived yet.
    Wait,
    /// The client speaks what this server does (or the connection ended: the read says so).
    Ready,
    /// The client speaks the other kind (TLS to a plaintext server or the reverse): refuse it,
    /// in plaintext, with this status.
    Mismatch(Status),
}

impl ControlStream {
    /// Wraps an accepted connection; over TLS when `tls` is given.
    ///
    /// # Errors
    /// When rustls cannot start a session with the configuration.
    #[cfg(feature = "tls")]
    pub(crate) fn accept(tcp: TcpStream, tls: Option<&crate::tls::ServerTls>) -> io::Result<ControlStream> {
        let tls = match tls {
            Some(t) => Some(Box::new(crate::tls::ServerTlsConn::new(t)?)),
            None => None,
        };
        Ok(ControlStream { tcp, tls, sniffed: false })
    }

    /// Wraps an accepted plaintext connection.
    #[cfg(not(feature = "tls"))]
    pub(crate) fn accept(tcp: TcpStream) -> io::Result<ControlStream> {
        Ok(ControlStream { tcp, sniffed: false })
    }

    fn has_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Looks at the first byte (without consuming it, without blocking) once: a TLS
    /// ClientHello to a plaintext server, or a plaintext frame to a TLS server, is a mismatch
    /// (the TLS state is dropped so that the refusal goes in plaintext).
    pub(crate) fn sniff(&mut self) -> Sniff {
        if self.sniffed {
            return Sniff::Ready;
        }
        let mut first = [0u8; 1];
        match self.tcp.peek(&mut first) {
            Ok(1) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                return Sniff::Wait
            }
            // Closed or failed: the read reports it.
            _ => return Sniff::Ready,
        }
        self.sniffed = true;
        let tls_client = first[0] == TLS_HANDSHAKE_RECORD;
        if self.has_tls() != tls_client {
            // Consume what arrived, so that closing after the refusal sends a FIN, not a reset
            // that could overtake the refusal.
            let mut junk = [0u8; 4096];
            for _ in 0..4 {
                if !matches!((&self.tcp).read(&mut junk), Ok(n) if n > 0) {
                    break;
                }
            }
        }
        match (self.has_tls(), tls_client) {
            (true, false) => {
                #[cfg(feature = "tls")]
                {
                    self.tls = None;
                }
                Sniff::Mismatch(Status::unavailable(
                    "this server requires TLS on the control channel (ServerConfig::tls) and the \
                     client sent a plaintext handshake: set ClientConfig::tls",
                ))
            }
            (false, true) => Sniff::Mismatch(Status::unavailable(
                "the client speaks TLS on the control channel and this server has no \
                 ServerConfig::tls: unset ClientConfig::tls or set ServerConfig::tls",
            )),
            _ => Sniff::Ready,
        }
    }

    /// Reads handshake bytes (decrypted over TLS) without blocking; 0 once the peer closed.
    ///
    /// # Errors
    /// `WouldBlock` until bytes arrive; the socket's error; `InvalidData` naming a failed TLS
    /// handshake.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        #[cfg(feature = "tls")]
        if let Some(t) = self.tls.as_mut() {
            return t.read(&mut self.tcp, buf);
        }
        (&self.tcp).read(buf)
    }

    /// The TCP stream, for the liveness watch once the reply went (the TLS state is dropped:
    /// nothing more is said on the control channel).
    pub(crate) fn into_tcp(self) -> TcpStream {
        self.tcp
    }
}

impl std::ops::Deref for ControlStream {
    type Target = TcpStream;

    fn deref(&self) -> &TcpStream {
        &self.tcp
    }
}

impl Write for ControlStream {
    /// Writes all of `buf` (encrypted over TLS), blocking within the socket's write timeout.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        #[cfg(feature = "tls")]
        if let Some(t) = self.tls.as_mut() {
            t.write_all(&mut self.tcp, buf)?;
            return Ok(buf.len());
        }
        (&self.tcp).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&self.tcp).flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_detect_within_the_timeout() {
        for t in [2, 3, 5, 6, 10, 30, 600, 3600, 65_534] {
            let l = Liveness::for_peer_timeout(Some(Duration::from_secs(t)));
            // The kernel gives up at the first probe at or after the user timeout since the peer
            // was last heard: probes are sent at idle + k × interval.
            let ut = l.user_timeout.as_secs();
            let (idle, i) = (l.idle.as_secs(), l.interval.as_secs());
            let first_at_or_after = if ut <= idle { idle } else { idle + (ut - idle).div_ceil(i) * i };
            assert!(first_at_or_after <= t, "T {t}: {l:?} gives up at {first_at_or_after} s");
            assert!(idle + u64::from(l.probes) * i >= ut, "T {t}: {l:?} runs out of probes early");
            assert!(l.user_timeout < Duration::from_secs(t) && l.user_timeout > Duration::ZERO);
        }
        let d = Liveness::for_peer_timeout(None);
        assert_eq!(
            (d.idle, d.interval, d.user_timeout),
            (Duration::from_secs(5), Duration::from_secs(1), Duration::from_secs(9))
        );
        let short = Liveness::for_peer_timeout(Some(Duration::from_millis(300)));
        assert_eq!(short, Liveness::for_peer_timeout(Some(MIN_LIVENESS_TIMEOUT)), "clamped to 2 s");
        let long = Liveness::for_peer_timeout(Some(Duration::from_secs(1 << 20)));
        assert!(long.idle <= Duration::from_secs(32_767), "{long:?}");
    }

    #[test]
    fn options_reach_the_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let live = Liveness::for_peer_timeout(Some(Duration::from_secs(4)));
        live.apply(&s).unwrap();
        let r = SockRef::from(&s);
        assert!(r.keepalive().unwrap());
        assert_eq!(r.tcp_keepalive_time().unwrap(), live.idle);
        assert_eq!(r.tcp_keepalive_interval().unwrap(), live.interval);
        assert_eq!(r.tcp_keepalive_retries().unwrap(), live.probes);
        assert_eq!(r.tcp_user_timeout().unwrap(), Some(live.user_timeout));
    }
}
