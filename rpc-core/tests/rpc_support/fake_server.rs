//! [`FakeServer`]: a server built by hand from the public verbs, buffers and wire modules, that
//! accepts one session and then does only what a test makes it do (take a request, vanish).

use std::net::{TcpListener, TcpStream};

use rpc_core::buffers::Completions;
use rpc_core::verbs::rc::RcConfig;
use rpc_core::wire::{read_frame, write_frame, Frame, Header, Kind, HEADER_LEN};

use super::{wait_for, RawPeer, WAIT};

/// One accepted session of a fake server.
pub struct FakeServer {
    /// The liveness channel: open while the fake server lives.
    _tcp: TcpStream,
    pub peer: RawPeer,
}

/// Accepts one client and answers its handshake like a server would (a 64 KiB ring, at most 8
/// credits and a 4 KiB eager threshold), with short retries so that the client's sends to a
/// vanished host fail quickly.
pub fn accept(listener: &TcpListener) -> FakeServer {
    let (mut tcp, _) = listener.accept().unwrap();
    let Frame::Handshake(hello) = read_frame(&mut tcp).unwrap() else { panic!("no handshake") };
    let peer = RawPeer::new(256, 64, HEADER_LEN + 4096, 1 << 16, 7);
    let cfg = RcConfig { timeout: 8, retry_cnt: 1, ..RcConfig::default() };
    peer.connect(&cfg, &hello);
    let reply = peer.handshake(hello.credits.min(8), hello.eager_threshold.min(4096), hello.max_message, 77);
    write_frame(&mut tcp, &Frame::Handshake(reply)).unwrap();
    FakeServer { _tcp: tcp, peer }
}

impl FakeServer {
    /// Waits for one request and returns its header.
    ///
    /// # Panics
    /// When none arrives within [`WAIT`].
    pub fn take_request(&mut self) -> Header {
        let mut wcs = Completions::<4>::new();
        let peer = &mut self.peer;
        wait_for(
            "the fake server to receive a request",
            WAIT,
            || {
                wcs.poll(&peer.cq).unwrap();
                for c in &mut wcs {
                    if let Some(buf) = peer.recv.take(c) {
                        let h = Header::decode(peer.recv.bytes(&buf)).unwrap();
                        peer.recv.repost(buf);
                        assert_eq!(h.kind, Kind::Request);
                        return Some(h);
                    }
                }
                None
            },
            String::new,
        )
    }
}
