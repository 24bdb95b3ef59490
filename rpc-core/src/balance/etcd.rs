//! etcd discovery (feature `etcd`): a server registers its address under a key prefix with a
//! lease that it keeps alive ([`Registration`]); clients resolve the prefix and watch it
//! ([`EtcdResolver`]). A server that dies stops its keep-alives, its lease expires after its TTL,
//! etcd deletes its key, and the watchers drop it from their sets.
//!
//! Through etcd's v3 JSON gateway (`/v3/kv/range`, `/v3/kv/put`, `/v3/lease/grant`,
//! `/v3/lease/keepalive`, `/v3/lease/revoke`, `/v3/watch`; keys and values base64) over plain
//! HTTP/1.1 on a TCP connection of its own (no TLS to etcd: run it on a trusted network or
//! loopback). Keys are `PREFIX` + the server's address; values are the address
//! (`127.0.0.1:50051`). A value that is not a socket address is skipped (logged).
//!
//! Why not a client crate: the etcd gRPC clients need `protoc` or a gRPC stack at build time,
//! and the gateway needs four JSON requests and one streamed response, which a hundred lines of
//! HTTP over `TcpStream` do with nothing but `serde_json` and `base64` (both small, both already
//! in the workspace's lock file).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use super::resolver::{normalize, Resolver};
use crate::status::Status;

/// How long a connect or a request to etcd may take before it fails: 5 s.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a blocked watch read wakes to look whether its resolver is gone: 200 ms.
const WATCH_POLL: Duration = Duration::from_millis(200);

/// Pause between two attempts to re-establish a broken watch: 500 ms.
const REWATCH: Duration = Duration::from_millis(500);

fn unavailable(what: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("etcd: {what}"))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(v: &Value) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(v.as_str()?).ok()
}

/// An int64 of the gateway's JSON (a string, or a number).
fn int(v: &Value) -> Option<i64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64())
}

/// The end of the range of every key starting with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: "\0".
    vec![0]
}

/// An etcd member's client URL, `http://host:port` or `host:port`.
fn endpoint(url: &str) -> Result<SocketAddr, Status> {
    let hostport = url.strip_prefix("http://").unwrap_or(url).trim_end_matches('/');
    hostport
        .to_socket_addrs()
        .map_err(|e| unavailable(format!("resolving {url}: {e}")))?
        .next()
        .ok_or_else(|| unavailable(format!("{url} resolves to no address")))
}

/// An HTTP/1.1 response being read: status and headers read, the body decoded as it comes
/// (chunked or not).
struct Response {
    stream: TcpStream,
    /// Bytes read and not yet decoded.
    raw: Vec<u8>,
    /// Body bytes decoded.
    body: Vec<u8>,
    chunked: bool,
    /// `Content-Length`, when not chunked.
    length: Option<usize>,
    /// The last chunk (or the whole body) arrived.
    done: bool,
    status: u16,
}

/// Sends a POST of `body` (JSON) to `path` and reads the response's head.
fn post(addr: SocketAddr, path: &str, body: &Value, read_timeout: Duration) -> Result<Response, Status> {
    let body = body.to_string();
    let mut stream = TcpStream::connect_timeout(&addr, ETCD_TIMEOUT)
        .map_err(|e| unavailable(format!("connecting to {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    stream.set_read_timeout(Some(read_timeout)).map_err(unavailable)?;
    stream.set_write_timeout(Some(ETCD_TIMEOUT)).map_err(unavailable)?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).map_err(|e| unavailable(format!("POST {path}: {e}")))?;
    let mut r = Response {
        stream,
        raw: Vec::new(),
        body: Vec::new(),
        chunked: false,
        length: None,
        done: false,
        status: 0,
    };
    let until = Instant::now() + ETCD_TIMEOUT;
    let head_end = loop {
        if let Some(i) = r.raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if r.raw.len() > 64 * 1024 || Instant::now() > until {
            return Err(unavailable(format!("POST {path}: no response head")));
        }
        if !r.fill(path)? {
            return Err(unavailable(format!("POST {path}: connection closed before the response")));
        }
    };
    let head = String::from_utf8_lossy(&r.raw[..head_end]).into_owned();
    r.raw.drain(..head_end + 4);
    let mut lines = head.split("\r\n");
    r.status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    for l in lines {
        let Some((k, v)) = l.split_once(':') else { continue };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            r.chunked = true;
        } else if k == "content-length" {
            r.length = v.parse().ok();
        }
    }
    r.decode();
    Ok(r)
}

impl Response {
    /// Reads more bytes; false at the end of the stream. A read timeout is not an error here
    /// (returns true with nothing read): the caller decides whether to wait on.
    fn fill(&mut self, path: &str) -> Result<bool, Status> {
        let mut buf = [0u8; 16 * 1024];
        match self.stream.read(&mut buf) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.raw.extend_from_slice(&buf[..n]);
                Ok(true)
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(unavailable(format!("POST {path}: {e}"))),
        }
    }

    /// Moves what `raw` holds of the body into `body`.
    fn decode(&mut self) {
        if !self.chunked {
            self.body.append(&mut self.raw);
            if self.length.is_some_and(|l| self.body.len() >= l) {
                self.done = true;
            }
            return;
        }
        while !self.done {
            let Some(eol) = self.raw.windows(2).position(|w| w == b"\r\n") else { return };
            let size_text = String::from_utf8_lossy(&self.raw[..eol]);
            let size_text = size_text.split(';').next().unwrap_or("").trim();
            let Ok(size) = usize::from_str_radix(size_text, 16) else {
                // Not HTTP: stop reading.
                self.done = true;
                return;
            };
            if size == 0 {
                self.done = true;
                return;
            }
            if self.raw.len() < eol + 2 + size + 2 {
                return;
            }
            self.body.extend_from_slice(&self.raw[eol + 2..eol + 2 + size]);
            self.raw.drain(..eol + 2 + size + 2);
        }
    }

    /// The whole body (the connection closes after it).
    fn read_all(mut self, path: &str) -> Result<Value, Status> {
        let until = Instant::now() + ETCD_TIMEOUT;
        while !self.done {
            if Instant::now() > until {
                return Err(unavailable(format!("POST {path}: the response did not finish")));
            }
            if !self.fill(path)? {
                break;
            }
            self.decode();
        }
        let v: Value = serde_json::from_slice(&self.body)
            .map_err(|e| unavailable(format!("POST {path}: answer is not JSON ({e})")))?;
        if self.status != 200 {
            return Err(unavailable(format!("POST {path}: HTTP {}: {v}", self.status)));
        }
        // A streamed method answers `{"result": ...}` or `{"error": ...}`.
        if let Some(e) = v.get("error") {
            return Err(unavailable(format!("POST {path}: {e}")));
        }
        Ok(v.get("result").cloned().unwrap_or(v))
    }

    /// The next JSON message of a streamed body; `None` when none is complete yet (after one
    /// read, which may time out).
    fn next_message(&mut self, path: &str) -> Result<Option<Value>, Status> {
        loop {
            let mut it = serde_json::Deserializer::from_slice(&self.body).into_iter::<Value>();
            match it.next() {
                Some(Ok(v)) => {
                    let used = it.byte_offset();
                    self.body.drain(..used);
                    return Ok(Some(v));
                }
                Some(Err(e)) if !e.is_eof() => {
                    return Err(unavailable(format!("POST {path}: bad message in the stream ({e})")))
                }
                _ => {}
            }
            if self.done {
                return Err(unavailable(format!("POST {path}: the stream ended")));
            }
            let before = self.raw.len() + self.body.len();
            if !self.fill(path)? {
                return Err(unavailable(format!("POST {path}: the stream closed")));
            }
            self.decode();
            if self.raw.len() + self.body.len() == before {
                // The read timed out: nothing new.
                return Ok(None);
            }
        }
    }
}

/// One request, its `result` (or the answer itself for a unary method).
fn call(addr: SocketAddr, path: &str, body: &Value) -> Result<Value, Status> {
    post(addr, path, body, ETCD_TIMEOUT)?.read_all(path)
}

/// A server's registration in etcd: its key under the prefix, attached to a lease that a thread
/// keeps alive (every third of the TTL). Dropping it revokes the lease (the key goes at once);
/// [`Registration::abandon`] only stops the keep-alives, as a process that dies does (the key
/// goes when the lease expires, within its TTL).
pub struct Registration {
    etcd: SocketAddr,
    key: Vec<u8>,
    lease: i64,
    stop: Arc<AtomicBool>,
    keeper: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("etcd", &self.etcd)
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("lease", &self.lease)
            .finish()
    }
}

impl Registration {
    /// Registers `server` under `prefix` (key `prefix` + the address, value the address) on the
    /// etcd member at `etcd` (`http://host:port` or `host:port`), with a lease of `ttl` (whole
    /// seconds, at least 1 s; etcd may raise it to its own minimum), and starts the keep-alive
    /// thread (`rpc-etcd-lease`).
    ///
    /// # Errors
    /// UNAVAILABLE when etcd cannot be reached or refuses (the request and its answer named);
    /// INVALID_ARGUMENT for a TTL under 1 s.
    pub fn new(etcd: &str, prefix: &str, server: SocketAddr, ttl: Duration) -> Result<Registration, Status> {
        if ttl < Duration::from_secs(1) {
            return Err(Status::invalid_argument(format!("etcd lease TTL {ttl:?} is under 1 s")));
        }
        let etcd = endpoint(etcd)?;
        let grant = call(etcd, "/v3/lease/grant", &json!({ "TTL": ttl.as_secs().to_string() }))?;
        let lease = grant
            .get("ID")
            .and_then(int)
            .ok_or_else(|| unavailable(format!("lease grant answered {grant}")))?;
        let key = format!("{prefix}{server}").into_bytes();
        call(
            etcd,
            "/v3/kv/put",
            &json!({ "key": b64(&key), "value": b64(server.to_string().as_bytes()), "lease": lease.to_string() }),
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let every = ttl / 3;
        let keeper = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("rpc-etcd-lease".into())
                .spawn(move || keep_alive(etcd, lease, every, &stop))
                .map_err(|e| unavailable(format!("spawning the keep-alive thread: {e}")))?
        };
        tracing::info!(%server, lease, key = %String::from_utf8_lossy(&key), "etcd: registered");
        Ok(Registration { etcd, key, lease, stop, keeper: Some(keeper) })
    }

    /// The lease's id.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Stops the keep-alives without revoking the lease, as a process that dies does: etcd
    /// deletes the key when the lease expires (within its TTL).
    pub fn abandon(mut self) {
        self.stop_keeper();
        self.lease = 0;
    }

    fn stop_keeper(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(k) = self.keeper.take() {
            k.thread().unpark();
            let _ = k.join();
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop_keeper();
        if self.lease != 0 {
            if let Err(e) = call(self.etcd, "/v3/lease/revoke", &json!({ "ID": self.lease.to_string() })) {
                tracing::warn!(lease = self.lease, error = %e, "etcd: revoking the lease failed; it expires by itself");
            }
        }
    }
}

/// The keep-alive thread: one keep-alive per `every` until stopped. A failed one is retried
/// at the next turn (logged); a lease etcd no longer knows (TTL 0 in the answer: it expired)
/// is logged as lost and the thread ends.
fn keep_alive(etcd: SocketAddr, lease: i64, every: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        std::thread::park_timeout(every);
        if stop.load(Ordering::Acquire) {
            return;
        }
        match call(etcd, "/v3/lease/keepalive", &json!({ "ID": lease.to_string() })) {
            Ok(r) if r.get("TTL").and_then(int).unwrap_or(0) <= 0 => {
                tracing::error!(lease, "etcd: the lease expired; the server is no longer registered");
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(lease, error = %e, "etcd: keep-alive failed; retried"),
        }
    }
}

/// The servers registered under a prefix, watched: a [`Resolver`] for
/// [`crate::Channel::balanced`]. A thread (`rpc-etcd-watch`) holds a watch on the prefix and
/// applies its events; when the watch breaks (etcd restarted, connection lost) it reads the
/// prefix again and watches from there, every 500 ms until it succeeds (the last set is
/// kept meanwhile). The thread ends when the resolver is dropped.
pub struct EtcdResolver {
    first: Option<Vec<SocketAddr>>,
    updates: Receiver<Vec<SocketAddr>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for EtcdResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdResolver").finish_non_exhaustive()
    }
}

impl EtcdResolver {
    /// Reads the servers under `prefix` from the etcd member at `etcd` (`http://host:port` or
    /// `host:port`) and starts watching it.
    ///
    /// # Errors
    /// UNAVAILABLE when etcd cannot be reached or refuses (the first read).
    pub fn new(etcd: &str, prefix: &str) -> Result<EtcdResolver, Status> {
        let etcd = endpoint(etcd)?;
        let prefix = prefix.as_bytes().to_vec();
        let (servers, revision) = range(etcd, &prefix)?;
        let first = set(&servers);
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let watch = Watch { etcd, prefix, servers, revision, tx, stop: stop.clone() };
        std::thread::Builder::new()
            .name("rpc-etcd-watch".into())
            .spawn(move || watch.run())
            .map_err(|e| unavailable(format!("spawning the watch thread: {e}")))?;
        Ok(EtcdResolver { first: Some(first), updates: rx, stop })
    }
}

impl Drop for EtcdResolver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Resolver for EtcdResolver {
    fn next(&mut self, wait: Duration) -> Result<Option<Vec<SocketAddr>>, Status> {
        if let Some(f) = self.first.take() {
            return Ok(Some(f));
        }
        let mut last = match self.updates.recv_timeout(wait) {
            Ok(s) => s,
            Err(RecvTimeoutError::Timeout) => return Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(unavailable("the watch thread ended"));
            }
        };
        // Only the latest set matters.
        while let Ok(s) = self.updates.try_recv() {
            last = s;
        }
        Ok(Some(last))
    }
}

/// Key → server address, of the keys under the prefix.
type Servers = BTreeMap<Vec<u8>, SocketAddr>;

fn set(servers: &Servers) -> Vec<SocketAddr> {
    normalize(servers.values().copied().collect())
}

/// The address in a key's value, or `None` (logged) when it is not one.
fn parse_value(key: &[u8], value: &[u8]) -> Option<SocketAddr> {
    let text = String::from_utf8_lossy(value);
    match text.trim().parse() {
        Ok(a) => Some(a),
        Err(_) => {
            tracing::warn!(key = %String::from_utf8_lossy(key), value = %text, "etcd: a value under the prefix is not a socket address; skipped");
            None
        }
    }
}

/// Every key under `prefix`, and the store's revision of that read.
fn range(etcd: SocketAddr, prefix: &[u8]) -> Result<(Servers, i64), Status> {
    let r =
        call(etcd, "/v3/kv/range", &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }))?;
    let revision = r.get("header").and_then(|h| h.get("revision")).and_then(int).unwrap_or(0);
    let mut servers = Servers::new();
    for kv in r.get("kvs").and_then(Value::as_array).into_iter().flatten() {
        let (Some(k), Some(v)) = (kv.get("key").and_then(unb64), kv.get("value").and_then(unb64)) else {
            continue;
        };
        if let Some(a) = parse_value(&k, &v) {
            servers.insert(k, a);
        }
    }
    Ok((servers, revision))
}

/// The watch thread's state.
struct Watch {
    etcd: SocketAddr,
    prefix: Vec<u8>,
    servers: Servers,
    /// The revision the set reflects: the watch starts after it.
    revision: i64,
    tx: Sender<Vec<SocketAddr>>,
    stop: Arc<AtomicBool>,
}

impl Watch {
    fn run(mut self) {
        while !self.stop.load(Ordering::Acquire) {
            if let Err(e) = self.watch() {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                tracing::warn!(error = %e, "etcd: the watch broke; reading the prefix again");
                std::thread::sleep(REWATCH);
                match range(self.etcd, &self.prefix) {
                    Ok((servers, revision)) => {
                        let changed = set(&servers) != set(&self.servers);
                        self.servers = servers;
                        self.revision = revision;
                        if changed && self.tx.send(set(&self.servers)).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "etcd: reading the prefix failed; retried"),
                }
            }
        }
    }

    /// Holds one watch until it breaks (an error) or the resolver is gone (`Ok`).
    fn watch(&mut self) -> Result<(), Status> {
        const PATH: &str = "/v3/watch";
        let req = json!({ "create_request": {
            "key": b64(&self.prefix),
            "range_end": b64(&prefix_end(&self.prefix)),
            "start_revision": (self.revision + 1).to_string(),
        }});
        let mut r = post(self.etcd, PATH, &req, WATCH_POLL)?;
        if r.status != 200 {
            return Err(unavailable(format!("POST {PATH}: HTTP {}", r.status)));
        }
        while !self.stop.load(Ordering::Acquire) {
            let Some(msg) = r.next_message(PATH)? else { continue };
            if let Some(e) = msg.get("error") {
                return Err(unavailable(format!("POST {PATH}: {e}")));
            }
            let Some(res) = msg.get("result") else { continue };
            if res.get("canceled").and_then(Value::as_bool) == Some(true) {
                return Err(unavailable(format!("the watch was cancelled: {res}")));
            }
            let mut changed = false;
            for ev in res.get("events").and_then(Value::as_array).into_iter().flatten() {
                let Some(kv) = ev.get("kv") else { continue };
                let Some(k) = kv.get("key").and_then(unb64) else { continue };
                if let Some(rev) = kv.get("mod_revision").and_then(int) {
                    self.revision = self.revision.max(rev);
                }
                let before = self.servers.get(&k).copied();
                if ev.get("type").and_then(Value::as_str) == Some("DELETE") {
                    self.servers.remove(&k);
                } else if let Some(a) = kv.get("value").and_then(unb64).and_then(|v| parse_value(&k, &v)) {
                    self.servers.insert(k.clone(), a);
                }
                changed |= before != self.servers.get(&k).copied();
            }
            if let Some(rev) = res.get("header").and_then(|h| h.get("revision")).and_then(int) {
                self.revision = self.revision.max(rev);
            }
            if changed {
                tracing::info!(servers = self.servers.len(), "etcd: the set of servers changed");
                if self.tx.send(set(&self.servers)).is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"/svc/"), b"/svc0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn ints_come_as_strings_or_numbers() {
        assert_eq!(int(&json!("7")), Some(7));
        assert_eq!(int(&json!(7)), Some(7));
        assert_eq!(int(&json!("x")), None);
    }
}
