//! The out-of-band TCP channel between the rpc-perf client and server, as perftest's: the client
//! says which test and sizes to run, both sides exchange their QP endpoint and buffer, and each
//! size is started and stopped in lockstep. Messages are JSON lines; nothing here is on the
//! measured path.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use rpc_core::verbs::rc::Endpoint;
use rpc_core::verbs::{Gid, Mtu};
use serde::{Deserialize, Serialize};

use crate::cli::TestKind;

/// Version of this exchange; both sides must agree.
pub const OOB_VERSION: u32 = 1;

/// Longest line accepted from the peer, in bytes.
const MAX_LINE: u64 = 64 << 10;

/// Errors of the out-of-band channel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OobError {
    /// A socket call failed.
    #[error("out-of-band TCP {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed the connection.
    #[error("out-of-band TCP: the peer closed the connection {when}")]
    Closed {
        /// While waiting for what.
        when: &'static str,
    },
    /// The peer sent something this side cannot accept.
    #[error("out-of-band protocol: {0}")]
    Protocol(String),
    /// The peer reported an error.
    #[error("the peer failed: {0}")]
    Peer(String),
}

/// A QP endpoint and the buffer the peer may write, as sent over the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireEndpoint {
    /// QP number (24 bits).
    pub qp_num: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// LID (0 on RoCE and sim).
    pub lid: u16,
    /// GID, 16 bytes, network order.
    pub gid: [u8; 16],
    /// Active MTU in bytes (256..=4096).
    pub mtu: u32,
    /// Address of the buffer the peer may RDMA WRITE.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u64,
}

impl WireEndpoint {
    /// Builds the wire form of `ep` with the writable buffer `[addr, addr + len)` under `rkey`.
    pub fn new(ep: &Endpoint, addr: u64, rkey: u32, len: u64) -> Self {
        WireEndpoint {
            qp_num: ep.qp_num,
            psn: ep.psn,
            lid: ep.lid,
            gid: ep.gid.0,
            mtu: ep.mtu.bytes(),
            addr,
            rkey,
            len,
        }
    }

    /// The verbs endpoint.
    ///
    /// # Errors
    /// [`OobError::Protocol`] naming the field for a QPN or PSN over 24 bits or an MTU that is not
    /// a power of two in 256..=4096.
    pub fn endpoint(&self) -> Result<Endpoint, OobError> {
        if self.qp_num >= 1 << 24 {
            return Err(OobError::Protocol(format!("peer qp_num {:#x} exceeds 24 bits", self.qp_num)));
        }
        if self.psn >= 1 << 24 {
            return Err(OobError::Protocol(format!("peer psn {:#x} exceeds 24 bits", self.psn)));
        }
        let mtu = (1..=5)
            .filter_map(Mtu::from_ibv)
            .find(|m| m.bytes() == self.mtu)
            .ok_or_else(|| OobError::Protocol(format!("peer mtu {} is not one of 256..=4096", self.mtu)))?;
        Ok(Endpoint { qp_num: self.qp_num, psn: self.psn, lid: self.lid, gid: Gid(self.gid), mtu })
    }
}

/// One message of the exchange.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Msg {
    /// Client → server: run `test` with buffers for messages up to `max_size` bytes.
    Setup {
        /// [`OOB_VERSION`].
        version: u32,
        /// The test.
        test: TestKind,
        /// Largest message of the run, in bytes.
        max_size: usize,
        /// Calls in flight (RPC tests; 1 for raw tests).
        #[serde(default)]
        concurrency: u32,
    },
    /// Server → client: the RPC server of the benchmark service listens on this TCP port of the
    /// server's address.
    RpcServer {
        /// TCP port.
        port: u16,
    },
    /// Both ways: this side's QP and writable buffer.
    Endpoint(WireEndpoint),
    /// Both ways: the QP is in RTS.
    Connected,
    /// Client → server: start serving messages of `size` bytes.
    Start {
        /// Message size in bytes.
        size: usize,
    },
    /// Server → client: serving.
    Ready,
    /// Client → server: the size is done.
    Stop,
    /// Server → client: stopped after answering `served` messages.
    Stopped {
        /// Messages answered at this size.
        served: u64,
    },
    /// Client → server: the test is over (tear down the QP).
    Done,
    /// Either way: this side failed.
    Error {
        /// What failed.
        message: String,
    },
}

/// A connected out-of-band channel.
pub struct OobChannel {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: String,
}

impl OobChannel {
    /// Wraps a connected stream (sets TCP_NODELAY).
    ///
    /// # Errors
    /// [`OobError::Io`] when the stream cannot be cloned or configured.
    pub fn new(stream: TcpStream) -> Result<Self, OobError> {
        stream.set_nodelay(true).map_err(|source| OobError::Io { what: "set_nodelay", source })?;
        let writer = stream.try_clone().map_err(|source| OobError::Io { what: "clone", source })?;
        Ok(OobChannel { reader: BufReader::new(stream), writer, line: String::new() })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.writer.peer_addr().ok()
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`OobError::Io`] when the write fails.
    pub fn send(&mut self, msg: &Msg) -> Result<(), OobError> {
        let mut text = serde_json::to_string(msg).map_err(|e| OobError::Protocol(format!("encode: {e}")))?;
        text.push('\n');
        self.writer.write_all(text.as_bytes()).map_err(|source| OobError::Io { what: "write", source })
    }

    /// Receives one message (blocking). A peer's [`Msg::Error`] becomes [`OobError::Peer`].
    ///
    /// # Errors
    /// [`OobError::Closed`] at end of stream, [`OobError::Protocol`] for a line that is not a
    /// message or longer than 64 KiB, [`OobError::Io`].
    pub fn recv(&mut self, when: &'static str) -> Result<Msg, OobError> {
        self.line.clear();
        let n = (&mut self.reader)
            .take(MAX_LINE)
            .read_line(&mut self.line)
            .map_err(|source| OobError::Io { what: "read", source })?;
        if n == 0 {
            return Err(OobError::Closed { when });
        }
        if !self.line.ends_with('\n') {
            return Err(OobError::Protocol(format!("message longer than {MAX_LINE} bytes or cut short")));
        }
        let msg: Msg = serde_json::from_str(self.line.trim_end())
            .map_err(|e| OobError::Protocol(format!("bad message {:?}: {e}", self.line.trim_end())))?;
        match msg {
            Msg::Error { message } => Err(OobError::Peer(message)),
            m => Ok(m),
        }
    }

    /// Receives a message and checks it is the one expected (compared by variant).
    ///
    /// # Errors
    /// As [`OobChannel::recv`], and [`OobError::Protocol`] naming both for another message.
    pub fn expect(&mut self, want: &Msg, when: &'static str) -> Result<Msg, OobError> {
        let got = self.recv(when)?;
        if std::mem::discriminant(&got) != std::mem::discriminant(want) {
            return Err(OobError::Protocol(format!("expected {want:?} {when}, got {got:?}")));
        }
        Ok(got)
    }

    /// True when a message (or end of stream) is waiting, without blocking. Costs a few system
    /// calls: call it only when idle.
    ///
    /// # Errors
    /// [`OobError::Io`] when the socket cannot be switched or peeked.
    pub fn readable(&mut self) -> Result<bool, OobError> {
        if !self.reader.buffer().is_empty() {
            return Ok(true);
        }
        let s = self.reader.get_ref();
        s.set_nonblocking(true).map_err(|source| OobError::Io { what: "set_nonblocking", source })?;
        let mut b = [0u8; 1];
        let r = s.peek(&mut b);
        s.set_nonblocking(false).map_err(|source| OobError::Io { what: "set_nonblocking", source })?;
        match r {
            Ok(_) => Ok(true), // data, or 0 = end of stream (recv reports it)
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(source) => Err(OobError::Io { what: "peek", source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (OobChannel, OobChannel) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (OobChannel::new(c).unwrap(), OobChannel::new(s).unwrap())
    }

    #[test]
    fn messages_round_trip() {
        let (mut a, mut b) = pair();
        let ep = WireEndpoint {
            qp_num: 7,
            psn: 0x123,
            lid: 0,
            gid: [1; 16],
            mtu: 4096,
            addr: 0x1000,
            rkey: 9,
            len: 64,
        };
        a.send(&Msg::Setup { version: OOB_VERSION, test: TestKind::SendLat, max_size: 32, concurrency: 1 })
            .unwrap();
        a.send(&Msg::Endpoint(ep)).unwrap();
        assert_eq!(
            b.recv("setup").unwrap(),
            Msg::Setup { version: OOB_VERSION, test: TestKind::SendLat, max_size: 32, concurrency: 1 }
        );
        assert!(b.readable().unwrap());
        assert_eq!(b.expect(&Msg::Endpoint(ep), "ep").unwrap(), Msg::Endpoint(ep));
        assert!(!b.readable().unwrap());
        let e = ep.endpoint().unwrap();
        assert_eq!(e.mtu, Mtu::Mtu4096);
        assert_eq!(e.gid, Gid([1; 16]));
    }

    #[test]
    fn bad_input_is_named() {
        let (mut a, mut b) = pair();
        a.writer.write_all(b"{\"msg\":\"nonsense\"}\n").unwrap();
        let e = b.recv("x").unwrap_err().to_string();
        assert!(e.contains("bad message"), "{e}");
        a.send(&Msg::Error { message: "no device".into() }).unwrap();
        assert_eq!(b.recv("x").unwrap_err().to_string(), "the peer failed: no device");
        a.send(&Msg::Ready).unwrap();
        let e = b.expect(&Msg::Stop, "stopping").unwrap_err().to_string();
        assert!(e.contains("expected Stop stopping, got Ready"), "{e}");
        drop(a);
        assert!(matches!(b.recv("end"), Err(OobError::Closed { .. })));
        let bad = WireEndpoint {
            qp_num: 1 << 24,
            psn: 0,
            lid: 0,
            gid: [0; 16],
            mtu: 1024,
            addr: 0,
            rkey: 0,
            len: 0,
        };
        assert!(bad.endpoint().unwrap_err().to_string().contains("qp_num"));
        let bad = WireEndpoint { qp_num: 1, mtu: 1000, ..bad };
        assert!(bad.endpoint().unwrap_err().to_string().contains("mtu 1000"));
    }
}
