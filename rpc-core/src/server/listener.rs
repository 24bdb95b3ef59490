//! The listener thread: accepts TCP connections, runs the handshake, creates each session's QP
//! and buffers on the least-loaded worker, hands it over through the worker's control queue, and
//! watches the TCP connections as the liveness and teardown channel.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::registry::Registry;
use super::reply::DeferQueue;
use super::{ServerConfig, ServerError, ServerHandle};
use crate::buffers::{RecvPool, RingBuf, SendPool, SendQueue};
use crate::session::{Role, Session, SessionParams};
use crate::status::Status;
use crate::transport::Device;
use crate::verbs::rc::{self, Endpoint};
use crate::verbs::{Context, DeviceSelector, Provider, QueuePair};
use crate::wire::{
    read_frame, write_frame, Frame, FrameError, Handshake, Refusal, HEADER_LEN, PROTOCOL_VERSION,
};
use crate::worker::conn::{body_area, create_cq, create_qp, send_bufs_for, Conn};
use crate::worker::counters::SharedCounters;
use crate::worker::{Control, NewConn, Worker, WorkerLimits, WorkerShared};

/// Session ids are unique per process.
static NEXT_SESSION: AtomicU32 = AtomicU32::new(1);

/// Opens the device, starts the workers and the listener thread.
pub(super) fn start<P: Provider>(
    config: ServerConfig,
    registry: Arc<Registry>,
    tcp: TcpListener,
    local_addr: SocketAddr,
    selector: &DeviceSelector,
    port: u8,
    gid_index: i32,
) -> Result<ServerHandle, ServerError> {
    let dev = Arc::new(Device::<P>::open(selector, port, gid_index)?);
    let cores: Vec<Option<usize>> = if config.worker_cores.is_empty() {
        vec![None]
    } else {
        config.worker_cores.iter().map(|&c| Some(c)).collect()
    };
    let per_worker = config.max_sessions.div_ceil(cores.len()).max(1);
    let draining = Arc::new(AtomicBool::new(false));
    let stop_listener = Arc::new(AtomicBool::new(false));
    let closed = Arc::new(ArrayQueue::new(config.max_sessions.max(16)));
    let body_cap = body_area(config.eager_threshold);
    let limits = WorkerLimits {
        max_sessions: per_worker,
        polling: config.polling,
        drain_timeout: config.drain_timeout,
        body_cap,
    };
    let mut shared_all = Vec::new();
    let mut joins = Vec::new();
    let mut counters = Vec::new();
    for (index, core) in cores.into_iter().enumerate() {
        let pd = dev.ctx.alloc_pd()?;
        let sends = (per_worker as u32).saturating_mul(u32::from(send_bufs_for(config.credits_per_session)));
        let cq = create_cq::<P>(&dev.ctx, config.srq_depth, sends, config.polling.needs_events())?;
        let recv = RecvPool::<P>::new(&pd, config.srq_depth, HEADER_LEN + body_cap)?;
        let shared = Arc::new(WorkerShared {
            index,
            control: ArrayQueue::new(per_worker.max(16)),
            defer: DeferQueue::new(4096),
            counters: Arc::new(SharedCounters::default()),
            draining: draining.clone(),
            sessions: AtomicUsize::new(0),
            closed: closed.clone(),
            pd,
            cq,
            srq: recv.srq().clone(),
        });
        counters.push(shared.counters.clone());
        let worker = Worker::new(shared.clone(), registry.clone(), recv, limits);
        let j = std::thread::Builder::new()
            .name(format!("rpc-worker-{index}"))
            .spawn(move || {
                if let Some(c) = core {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                        tracing::warn!(worker = index, core = c, "pinning to core failed; running unpinned");
                    }
                }
                worker.run();
            })
            .map_err(|e| ServerError::Thread { what: "worker", source: e })?;
        joins.push(j);
        shared_all.push(shared);
    }
    tcp.set_nonblocking(true).map_err(|e| ServerError::Listen { addr: local_addr.to_string(), source: e })?;
    let stop = stop_listener.clone();
    let listener = std::thread::Builder::new()
        .name("rpc-listener".into())
        .spawn(move || {
            Listener { config, dev, workers: shared_all, closed, conns: Vec::new(), stop }.run(tcp)
        })
        .map_err(|e| ServerError::Thread { what: "listener", source: e })?;
    tracing::info!(%local_addr, transport = P::NAME, workers = joins.len(), "server listening");
    Ok(ServerHandle {
        local_addr,
        draining,
        stop_listener,
        workers: joins,
        listener: Some(listener),
        counters,
    })
}

struct Listener<P: Provider> {
    config: ServerConfig,
    dev: Arc<Device<P>>,
    workers: Vec<Arc<WorkerShared<P>>>,
    closed: Arc<ArrayQueue<u32>>,
    /// Live sessions: (session id, worker index, TCP stream).
    conns: Vec<(u32, usize, TcpStream)>,
    stop: Arc<AtomicBool>,
}

impl<P: Provider> Listener<P> {
    fn run(mut self, tcp: TcpListener) {
        while !self.stop.load(Ordering::Acquire) {
            let mut busy = false;
            match tcp.accept() {
                Ok((stream, peer)) => {
                    busy = true;
                    if let Err(e) = self.setup(stream, peer) {
                        tracing::info!(%peer, error = %e, "connection refused");
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            }
            while let Some(session) = self.closed.pop() {
                self.conns.retain(|c| c.0 != session);
            }
            self.check_liveness();
            if !busy {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.conns.clear();
        tracing::info!("server stopped");
    }

    fn check_liveness(&mut self) {
        let mut byte = [0u8; 1];
        let workers = &self.workers;
        self.conns.retain(|(session, w, stream)| match stream.peek(&mut byte) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => true,
            Ok(n) if n > 0 => true,
            _ => {
                tracing::info!(session, "peer disconnected");
                push(&workers[*w].control, Control::Close(*session));
                false
            }
        });
    }

    fn refuse(stream: &mut TcpStream, status: Status) -> Status {
        let _ = write_frame(
            stream,
            &Frame::Refusal(Refusal { code: status.code(), message: status.message().to_string() }),
        );
        status
    }

    fn setup(&mut self, mut stream: TcpStream, peer: SocketAddr) -> Result<(), Status> {
        let span = tracing::info_span!("connect", %peer, transport = P::NAME);
        let _entered = span.enter();
        let io = |e: std::io::Error| Status::unavailable(format!("handshake with {peer}: {e}"));
        stream.set_nonblocking(false).map_err(io)?;
        stream.set_read_timeout(Some(self.config.handshake_timeout)).map_err(io)?;
        let _ = stream.set_nodelay(true);
        let hello = match read_frame(&mut stream) {
            Ok(Frame::Handshake(h)) => h,
            Ok(Frame::Refusal(r)) => return Err(Status::new(r.code, r.message)),
            Err(FrameError::Wire(e)) => {
                return Err(Self::refuse(
                    &mut stream,
                    Status::invalid_argument(format!("bad handshake: {e}")),
                ))
            }
            Err(e) => return Err(Status::unavailable(format!("handshake with {peer}: {e}"))),
        };
        if let Some(token) = &self.config.auth_token {
            if &hello.auth_token != token {
                return Err(Self::refuse(
                    &mut stream,
                    Status::unauthenticated("handshake field `auth_token` does not match"),
                ));
            }
        }
        let live: usize = self.workers.iter().map(|w| w.sessions.load(Ordering::Relaxed)).sum();
        if live >= self.config.max_sessions {
            return Err(Self::refuse(
                &mut stream,
                Status::resource_exhausted(format!("max_sessions {} reached", self.config.max_sessions)),
            ));
        }
        let credits = hello.credits.min(self.config.credits_per_session);
        let (wi, w) = self
            .workers
            .iter()
            .enumerate()
            .min_by_key(|(_, w)| w.sessions.load(Ordering::Relaxed))
            .expect("at least one worker");
        let on_worker = w.sessions.load(Ordering::Relaxed) as u64 + 1;
        if on_worker * (2 * u64::from(credits) + 1) > u64::from(self.config.srq_depth) {
            return Err(Self::refuse(
                &mut stream,
                Status::resource_exhausted(format!(
                    "srq_depth {} cannot hold {on_worker} sessions of {credits} credits on one worker",
                    self.config.srq_depth
                )),
            ));
        }
        let eager = hello.eager_threshold.min(self.config.eager_threshold);
        let max_message = hello.max_message.min(self.config.max_message_size);
        let w = w.clone();
        let conn = match self.create_conn(&w, &hello, credits, eager, max_message) {
            Ok(c) => c,
            Err(e) => return Err(Self::refuse(&mut stream, e)),
        };
        let local = conn.1;
        let session = conn.0.session.params().id;
        let reply = Handshake {
            version: PROTOCOL_VERSION,
            qp_num: local.qp_num,
            psn: local.psn,
            lid: local.lid,
            mtu: local.mtu,
            gid: local.gid,
            ring_addr: conn.2 .0,
            ring_len: conn.2 .1,
            ring_rkey: conn.2 .2,
            credits,
            eager_threshold: eager,
            max_message,
            session,
            auth_token: Vec::new(),
        };
        w.sessions.fetch_add(1, Ordering::Relaxed);
        push(&w.control, Control::Open(Box::new(NewConn { conn: conn.0, session, peer })));
        if let Err(e) = write_frame(&mut stream, &Frame::Handshake(reply)) {
            push(&w.control, Control::Close(session));
            return Err(io(e));
        }
        stream.set_nonblocking(true).map_err(io)?;
        tracing::info!(session, %peer, worker = wi, credits, eager, "session connected");
        self.conns.push((session, wi, stream));
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn create_conn(
        &self,
        w: &WorkerShared<P>,
        hello: &Handshake,
        credits: u16,
        eager: u32,
        max_message: u32,
    ) -> Result<(Conn<P>, Endpoint, (u64, u32, u32)), Status> {
        let verbs =
            |e: crate::verbs::VerbsError| Status::resource_exhausted(format!("creating the session: {e}"));
        let bufs = send_bufs_for(credits);
        let qp =
            create_qp::<P>(&w.pd, &w.cq, &w.srq, bufs, self.dev.ctx.attr().max_inline_data).map_err(verbs)?;
        let max_inline = qp.cap().max_inline_data;
        let body_cap = body_area(eager);
        let pool = SendPool::<P>::new(&w.pd, bufs, HEADER_LEN + body_cap).map_err(verbs)?;
        let ring = RingBuf::<P>::receive(&w.pd, self.config.ring_bytes as usize).map_err(verbs)?;
        let mirror = RingBuf::<P>::mirror(&w.pd, hello.ring_len as usize).map_err(verbs)?;
        let local = self.dev.endpoint(&qp);
        let remote =
            Endpoint { qp_num: hello.qp_num, psn: hello.psn, lid: hello.lid, gid: hello.gid, mtu: hello.mtu };
        rc::connect(&qp, &self.dev.rc, &local, &remote)
            .map_err(|e| Status::unavailable(format!("connecting the QP: {e}")))?;
        let params = SessionParams {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            credits,
            eager_threshold: eager,
            max_message,
            peer_ring_len: hello.ring_len,
            own_ring_len: self.config.ring_bytes,
            max_held: usize::from(credits),
        };
        let remote_ring = ring.remote();
        let conn = Conn {
            qp,
            pool,
            ring,
            mirror,
            sq: SendQueue::new(usize::from(bufs) * 2 + 8),
            session: Session::new(Role::Server, params),
            peer_ring: (hello.ring_addr, hello.ring_rkey),
            body_cap,
            max_inline,
        };
        Ok((conn, local, remote_ring))
    }
}

/// Pushes into a bounded control queue, yielding while it is full.
fn push<T>(q: &ArrayQueue<T>, mut v: T) {
    loop {
        match q.push(v) {
            Ok(()) => return,
            Err(back) => {
                v = back;
                std::thread::yield_now();
            }
        }
    }
}
