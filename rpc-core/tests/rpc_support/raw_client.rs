//! [`RawClient`]: a session driven by hand, speaking the wire protocol over a [`RawPeer`], for
//! tests that act as a hostile client (or, through [`RawClient::over`], a fake server): it sends
//! whatever headers, bodies and ring WRITEs a test builds, and shows every message it receives.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rpc_core::buffers::{Completions, SendBuf, SendMirror, SendPool, SendQueue};
use rpc_core::verbs::rc::RcConfig;
use rpc_core::verbs::sim::Sim;
use rpc_core::verbs::{Provider, QueuePair as _, WcStatus};
use rpc_core::wire::{read_frame, write_frame, Frame, Handshake, Header, Kind, HEADER_LEN};

use super::RawPeer;

/// SENDs of a QP that waited for a receive WQE of the other side (RNR): counted by the software
/// NIC; a hardware NIC retries RNR without telling, so 0 there.
pub trait RnrStalls {
    /// RNR waits so far.
    fn rnr_stalls(&self) -> u64;
}

impl RnrStalls for rpc_core::verbs::sim::SimQp {
    fn rnr_stalls(&self) -> u64 {
        rpc_core::verbs::sim::SimQp::rnr_stalls(self)
    }
}

#[cfg(feature = "ibverbs")]
impl RnrStalls for rpc_core::verbs::ibverbs::IbvQueuePair {
    fn rnr_stalls(&self) -> u64 {
        0
    }
}

/// Send buffers of a raw client (each holds a header and an eager body of up to 4 KiB).
const SEND_BUFS: u16 = 16;

/// A connected raw session: a [`RawPeer`] (QP, CQ, receive buffers, ring), a send pool, a
/// mirror of the other side's ring and a send queue. Fields are public for tests that post by
/// hand; they drop in declaration order (the send side first, the peer's QP before its PD).
pub struct RawClient<P: Provider = Sim> {
    /// The send queue: batches WRs, counts what is outstanding.
    pub sq: SendQueue,
    /// Local source of the ring WRITEs, as long as the other side's ring.
    pub mirror: SendMirror<P>,
    /// `SEND_BUFS` send buffers of `HEADER_LEN + 4096` bytes.
    pub pool: SendPool<P>,
    /// The verbs resources (CQ of 256, 16 receive buffers of `HEADER_LEN + 4096` bytes, a
    /// 64 KiB receive ring).
    pub peer: RawPeer<P>,
    /// The other side's ring: address and rkey.
    pub ring: (u64, u32),
    /// The other side's ring, in bytes.
    pub ring_len: u32,
    /// The session id the other side assigned (headers carry it).
    pub session: u32,
    /// The smaller of the two sides' message limits, in bytes.
    pub max_message: u32,
    /// The other side's eager threshold, in bytes.
    pub eager: u32,
    /// The credits the other side granted (requests in flight).
    pub credits: u16,
    /// Messages received and not yet taken, with their eager bodies, in arrival order; ring
    /// returns, idle probes, Cancel acknowledgements and credit grants (`RingReturn`, `Ping`,
    /// `Pong`, `CancelAck`, `CreditGrant`) are left out.
    pub inbox: VecDeque<(Header, Vec<u8>)>,
    /// CancelAcks received: `(slot, generation)`, in arrival order (the server acknowledges
    /// every Cancel).
    pub acks: Vec<(u16, u32)>,
    /// CreditGrants received (protocol 12): the credits each granted, in arrival order. A raw
    /// client acknowledges none unless its test sends the CreditAck.
    pub grants: Vec<u16>,
    /// Whether receive buffers are reposted (default true). False plays a peer that stops
    /// reading: each buffer is kept away once its message arrived, so the receive WQEs run out.
    pub reading: bool,
    /// A completion failed (the other side closed the session, the QP is in ERR): WRs posted
    /// from here only flush.
    pub dead: bool,
    _tcp: TcpStream,
}

impl RawClient {
    /// Connects to the server at `addr` asking 4 credits, a 4 KiB eager threshold and 1 MiB
    /// messages.
    ///
    /// # Panics
    /// When the server does not answer the handshake with its own (a test failure).
    pub fn connect(addr: SocketAddr) -> RawClient {
        RawClient::connect_with(addr, 4, 4096, 1 << 20)
    }

    /// Connects to the server at `addr` asking `credits`, an `eager` threshold and
    /// `max_message` (bytes) in its handshake (session 0: the server assigns one).
    ///
    /// # Panics
    /// As [`connect`](Self::connect).
    pub fn connect_with(addr: SocketAddr, credits: u16, eager: u32, max_message: u32) -> RawClient {
        RawClient::connect_peer(
            RawPeer::new(256, 16, HEADER_LEN + 4096, 1 << 16, 1),
            addr,
            credits,
            eager,
            max_message,
        )
    }
    /// Plays a fake server: accepts one client on `listener`, answers its handshake as session
    /// `session` (with `tweak` applied to the reply), connects the QP, and returns the raw
    /// session with a clone of the TCP control channel (the caller decides when it closes).
    ///
    /// # Panics
    /// When the client sends no handshake (a test failure).
    pub fn accept(
        listener: &std::net::TcpListener,
        session: u32,
        tweak: impl FnOnce(&mut Handshake),
    ) -> (RawClient, TcpStream) {
        let (mut tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(super::WAIT)).unwrap();
        let Frame::Handshake(hello) = read_frame(&mut tcp).unwrap() else { panic!("no handshake") };
        tcp.set_read_timeout(None).unwrap();
        let peer = RawPeer::new(256, 64, HEADER_LEN + 4096, 1 << 16, 7);
        peer.connect(&RcConfig { timeout: 8, retry_cnt: 1, ..RcConfig::default() }, &hello);
        let mut mine = peer.handshake(hello.credits, hello.eager_threshold, hello.max_message, session);
        tweak(&mut mine);
        write_frame(&mut tcp, &Frame::Handshake(mine)).unwrap();
        let c = RawClient::over(peer, &hello, session, tcp.try_clone().unwrap());
        (c, tcp)
    }
}

impl<P: Provider> RawClient<P>
where
    P::QueuePair: RnrStalls,
{
    /// [`connect_with`](RawClient::connect_with) over `peer`, a raw peer on any device.
    ///
    /// # Panics
    /// As [`connect`](RawClient::connect).
    pub fn connect_peer(
        peer: RawPeer<P>,
        addr: SocketAddr,
        credits: u16,
        eager: u32,
        max_message: u32,
    ) -> RawClient<P> {
        let mut c = RawClient::connect_bare(peer, addr, credits, eager, max_message);
        if let Err(refused) = c.ask_ring() {
            panic!("the server refused a ring: {refused:?}");
        }
        c
    }

    /// [`connect_peer`](RawClient::connect_peer) without asking for the server's ring (protocol
    /// 12): [`ring`](Self::ring) is the handshake's, address and rkey 0, until
    /// [`ask_ring`](Self::ask_ring).
    ///
    /// # Panics
    /// As [`connect`](RawClient::connect).
    pub fn connect_bare(
        peer: RawPeer<P>,
        addr: SocketAddr,
        credits: u16,
        eager: u32,
        max_message: u32,
    ) -> RawClient<P> {
        let mut tcp = TcpStream::connect(addr).unwrap();
        // A server that never answers fails the test after `WAIT`, not hangs it.
        tcp.set_read_timeout(Some(super::WAIT)).unwrap();
        write_frame(&mut tcp, &Frame::Handshake(peer.handshake(credits, eager, max_message, 0))).unwrap();
        let Frame::Handshake(reply) = read_frame(&mut tcp).unwrap() else { panic!("refused") };
        tcp.set_read_timeout(None).unwrap();
        peer.connect(&RcConfig::default(), &reply);
        let session = reply.session;
        let mut c = RawClient::over(peer, &reply, session, tcp);
        c.max_message = c.max_message.min(max_message);
        c
    }

    /// Asks the server for its ring (a RingAsk for [`ring_len`](Self::ring_len) bytes) and
    /// waits for the answer: granted, [`ring`](Self::ring) is the ring's address and rkey.
    ///
    /// # Errors
    /// The refusing RingGrant's header and reason.
    ///
    /// # Panics
    /// When no answer comes within `WAIT` (a test failure).
    pub fn ask_ring(&mut self) -> Result<(), (Header, String)> {
        let len = self.ring_len;
        self.ask_ring_of(len);
        self.take_grant()
    }

    /// Sends a RingAsk for `bytes` (no wait).
    pub fn ask_ring_of(&mut self, bytes: u32) {
        let ask = rpc_core::wire::ring_lease::encode_ring_ask(bytes);
        self.send(Header { body_len: 4, total_len: 4, ..Header::new(Kind::RingAsk) }, &ask);
    }

    /// Waits for a RingGrant and takes it: granted, [`ring`](Self::ring) is the ring's address
    /// and rkey (and its length must be [`ring_len`](Self::ring_len)).
    ///
    /// # Errors
    /// The refusing RingGrant's header and reason.
    ///
    /// # Panics
    /// When no RingGrant comes within `WAIT`.
    pub fn take_grant(&mut self) -> Result<(), (Header, String)> {
        let give_up = Instant::now() + super::WAIT;
        loop {
            if let Some(i) = self.inbox.iter().position(|(h, _)| h.kind == Kind::RingGrant) {
                let (h, body) = self.inbox.remove(i).unwrap();
                if h.status != rpc_core::Code::Ok {
                    return Err((h, rpc_core::wire::close_reason(&body)));
                }
                let g = rpc_core::wire::ring_lease::RingGrant::decode(&body).unwrap();
                assert_eq!(g.len, self.ring_len, "a grant of the handshake's length");
                self.ring = (g.addr, g.rkey);
                return Ok(());
            }
            assert!(Instant::now() < give_up, "no RingGrant: got {:?}", self.inbox);
            let _ = self.receive();
            std::thread::yield_now();
        }
    }

    /// A client-side [`Session`](rpc_core::session::Session) with this raw session's id, the
    /// credits, limits and ring the server granted, a 64 KiB own ring and `CREDITS` answers
    /// held: the protocol's own rules, to build and account for what a test sends by hand.
    pub fn client_session(&self) -> rpc_core::session::Session {
        use rpc_core::session::{Role, Session, SessionParams};
        Session::new(
            Role::Client,
            SessionParams {
                id: self.session,
                credits: self.credits,
                eager_threshold: self.eager,
                max_message: self.max_message,
                peer_ring_len: self.ring_len,
                own_ring_len: 1 << 16,
                max_held: usize::from(self.credits),
            },
        )
    }

    /// A raw session over `peer`, whose QP is already connected to the side that sent
    /// `remote` (its ring, limits and credits are taken from there), with `session` in the
    /// headers it sends; `tcp` is the control channel, kept open while this lives.
    pub fn over(peer: RawPeer<P>, remote: &Handshake, session: u32, tcp: TcpStream) -> RawClient<P> {
        let pool = SendPool::<P>::new(&peer.pd, SEND_BUFS, HEADER_LEN + 4096).unwrap();
        let mirror = SendMirror::<P>::new(&peer.pd, remote.ring_len as usize).unwrap();
        RawClient {
            sq: SendQueue::new(64, 16),
            mirror,
            pool,
            ring: (remote.ring_addr, remote.ring_rkey),
            ring_len: remote.ring_len,
            session,
            max_message: remote.max_message,
            eager: remote.eager_threshold,
            credits: remote.credits,
            inbox: VecDeque::new(),
            acks: Vec::new(),
            grants: Vec::new(),
            reading: true,
            dead: false,
            peer,
            _tcp: tcp,
        }
    }

    /// A free send buffer, polling while none is (send completions bring them back).
    ///
    /// # Panics
    /// When the QP is or becomes [`dead`](Self::dead) meanwhile, and as
    /// [`try_buf`](Self::try_buf).
    pub fn buf(&mut self) -> SendBuf {
        self.try_buf()
            .unwrap_or_else(|| panic!("no send buffer: the QP is dead ({:?})", self.peer.qp.state()))
    }

    /// A free send buffer, polling while none is (send completions bring them back); `None` once
    /// the QP is [`dead`](Self::dead): a failed completion retires nothing
    /// ([`SendQueue::on_completion`]), so no buffer would ever come back.
    ///
    /// # Panics
    /// When none comes back within `WAIT`, or none is free while a SEND of this side waited for a
    /// receive WQE of the other (RNR: it holds every buffer behind it).
    pub fn try_buf(&mut self) -> Option<SendBuf> {
        let give_up = Instant::now() + super::WAIT;
        loop {
            if self.dead {
                return None;
            }
            if let Some(b) = self.pool.acquire_for(&mut self.sq) {
                return Some(b);
            }
            assert!(
                Instant::now() < give_up,
                "no send buffer came back (QP {:?}, {} WRs outstanding)",
                self.peer.qp.state(),
                self.sq.outstanding()
            );
            assert_eq!(
                self.peer.qp.rnr_stalls(),
                0,
                "out of send buffers: SENDs wait for a receive WQE (RNR)"
            );
            self.poll();
            std::thread::yield_now();
        }
    }

    /// WRITEs `bytes` at `offset` of the other side's ring (none when empty), then, with
    /// `header`, SENDs it; one doorbell. Nothing is posted once the QP is [`dead`](Self::dead):
    /// its WRs would only flush, and their send buffers would never come back.
    pub fn write(&mut self, offset: u32, bytes: &[u8], header: Option<Header>) {
        if self.dead {
            return;
        }
        if !bytes.is_empty() {
            assert!(self.mirror.write_at(offset, bytes), "a range of the mirror");
            // No ring producer here (the raw peer places where it is told): the mark is unused.
            let mark = offset + bytes.len() as u32;
            self.sq.write(&self.mirror, offset, bytes.len() as u32, self.ring.0, self.ring.1, mark);
        }
        if let Some(h) = header {
            let Some(mut b) = self.try_buf() else { return };
            h.encode_into(self.pool.buf_mut(&mut b)).unwrap();
            self.sq.send(&mut self.pool, b, HEADER_LEN as u32, false);
        }
        self.sq.flush(&self.peer.qp, &mut self.pool, 1).unwrap();
    }

    /// SENDs `h` as given (its `session`, `body_len` and `total_len` too), followed by `body`
    /// (an eager message of up to 4 KiB). Nothing on a [`dead`](Self::dead) QP, as
    /// [`write`](Self::write).
    pub fn send_eager(&mut self, h: Header, body: &[u8]) {
        let Some(mut b) = self.try_buf() else { return };
        let dst = self.pool.buf_mut(&mut b);
        h.encode_into(dst).unwrap();
        dst[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
        self.sq.send(&mut self.pool, b, (HEADER_LEN + body.len()) as u32, false);
        self.sq.flush(&self.peer.qp, &mut self.pool, 1).unwrap();
    }

    /// [`send_eager`](Self::send_eager) with this session's id in `h`.
    pub fn send(&mut self, h: Header, body: &[u8]) {
        let session = self.session;
        self.send_eager(Header { session, ..h }, body);
    }

    /// [`send`](Self::send)s an eager request for `method` on call `slot` of `generation`
    /// with `body` (its lengths in the header).
    pub fn request(&mut self, method: u32, slot: u16, generation: u32, body: &[u8]) {
        let len = body.len() as u32;
        let h =
            Header { method, slot, generation, body_len: len, total_len: len, ..Header::new(Kind::Request) };
        self.send(h, body);
    }

    /// Polls the CQ once: send completions give their buffers back, received messages go to
    /// [`inbox`](Self::inbox). Returns the oldest message of the inbox, taking it.
    ///
    /// # Errors
    /// The status of the first completion of this poll that failed (then [`dead`](Self::dead)
    /// is set); the others were handled all the same, and the inbox keeps its messages.
    pub fn try_poll(&mut self) -> Result<Option<(Header, Vec<u8>)>, WcStatus> {
        self.receive()?;
        Ok(self.inbox.pop_front())
    }

    /// Polls the CQ once into the inbox; the first failed completion's status, if any.
    fn receive(&mut self) -> Result<(), WcStatus> {
        let wcs = Completions::<16>::new();
        wcs.poll(&self.peer.cq).unwrap();
        let mut failed = None;
        for c in wcs {
            let wc = *c.wc();
            if c.send_tag().is_some() {
                self.sq.on_completion(c, &mut self.pool);
            } else if let Some(buf) = self.peer.recv.take(c) {
                if wc.status.is_success() {
                    let bytes = self.peer.recv.bytes(&buf);
                    let h = Header::decode(bytes).unwrap();
                    if h.kind == Kind::CancelAck {
                        self.acks.push((h.slot, h.generation));
                    } else if h.kind == Kind::CreditGrant {
                        self.grants.push(h.count);
                    } else if !matches!(h.kind, Kind::RingReturn | Kind::Ping | Kind::Pong) {
                        self.inbox.push_back((h, bytes[HEADER_LEN..].to_vec()));
                    }
                }
                if self.reading {
                    self.peer.recv.repost(buf);
                } else {
                    // Kept away: dropping a token counts it as leaked.
                    std::mem::forget(buf);
                }
            }
            if !wc.status.is_success() {
                self.dead = true;
                failed.get_or_insert(wc.status);
            }
        }
        if self.reading {
            self.peer.recv.flush().unwrap();
        }
        failed.map_or(Ok(()), Err)
    }

    /// [`try_poll`](Self::try_poll), a failed completion read as no message.
    pub fn poll(&mut self) -> Option<(Header, Vec<u8>)> {
        self.try_poll().unwrap_or(None)
    }

    /// Polls for up to `d` until a message arrives; takes it.
    pub fn response(&mut self, d: Duration) -> Option<(Header, Vec<u8>)> {
        let give_up = Instant::now() + d;
        while Instant::now() < give_up {
            if let Some(r) = self.poll() {
                return Some(r);
            }
            std::thread::yield_now();
        }
        None
    }

    /// One ECHO call (slot 0, generation `seq`) whose answer of `reply_len` payload bytes must
    /// land in our ring: the request carries the freed head of `ring` (our model of our own
    /// ring; no RingReturn is sent), and the answer is accepted there and, when `release`, freed.
    ///
    /// # Errors
    /// The answer's header when it did not come back OK, in our ring, for this call.
    pub fn ring_echo(
        &mut self,
        ring: &mut rpc_core::session::RingConsumer,
        seq: u32,
        reply_len: usize,
        release: bool,
    ) -> Result<(), String> {
        use prost::Message;
        let body = super::request(u64::from(seq), 16, reply_len).encode_to_vec();
        let freed_head = ring.take_freed();
        self.send(
            Header {
                method: super::ECHO,
                generation: seq,
                freed_head,
                body_len: body.len() as u32,
                total_len: body.len() as u32,
                ..Header::new(Kind::Request)
            },
            &body,
        );
        let h = self.wait_for(Kind::Response, 0);
        if !(h.in_ring && h.generation == seq && h.status == rpc_core::Code::Ok) {
            return Err(format!("answer {seq}: {h:?}"));
        }
        let t = ring.accept(h.ring_offset, h.body_len).map_err(|e| format!("answer {seq}: {e}"))?;
        if release {
            ring.release(t);
        }
        Ok(())
    }

    /// Polls until a message of `kind` for `slot` is in the inbox, and takes its header (the
    /// messages before it stay).
    ///
    /// # Panics
    /// When none arrives within `WAIT`, listing what did.
    pub fn wait_for(&mut self, kind: Kind, slot: u16) -> Header {
        let give_up = Instant::now() + super::WAIT;
        loop {
            if let Some(i) = self.inbox.iter().position(|(h, _)| h.kind == kind && h.slot == slot) {
                return self.inbox.remove(i).unwrap().0;
            }
            assert!(Instant::now() < give_up, "no {kind:?} for slot {slot}: got {:?}", self.inbox);
            let _ = self.receive();
            std::thread::yield_now();
        }
    }
}
