//! TLS on the TCP control channel (`ServerConfig::tls`, `ClientConfig::tls`): `Client` and
//! `Channel` call over it (and reconnect over it), the auth token no longer crosses the network
//! in clear (a recording TCP proxy between the ends), and every mismatch fails the connect with a
//! clear status, within the handshake timeouts, while the server serves on: a server certificate
//! from another CA or for another name (UNAUTHENTICATED), a plaintext client to a TLS server and
//! the reverse (UNAVAILABLE), a client without the certificate a mutual-TLS server requires
//! (UNAUTHENTICATED). Certificates are generated with `rcgen`.

#[path = "rpc_support/mod.rs"]
mod rpc_support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use rpc_core::{
    CallOptions, Channel, ChannelConfig, Client, ClientConfig, ClientTls, Code, PollingPolicy, ServerHandle,
    ServerTls, Status, TlsError,
};
use rpc_support::*;

/// A test certificate authority.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Ca { issuer: CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap() }
    }

    /// The CA's certificate (PEM), to trust.
    fn pem(&self) -> Vec<u8> {
        self.issuer.pem().into_bytes()
    }

    /// A certificate for `names` signed by this CA and its key, both PEM.
    fn leaf(&self, names: &[&str]) -> (Vec<u8>, Vec<u8>) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, names[0]);
        p.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    }

    fn server_tls(&self, name: &str) -> ServerTls {
        let (cert, key) = self.leaf(&[name]);
        ServerTls::from_pem(&cert, &key).unwrap()
    }

    fn client_tls(&self, name: &str) -> ClientTls {
        ClientTls::from_pem(&self.pem(), name).unwrap()
    }
}

const TOKEN: &[u8] = b"tok-5f3a9c1e-do-not-leak";

fn tls_server(ca: &Ca) -> ServerHandle {
    spawn(server().tls(ca.server_tls("rpc.test")).auth_token(TOKEN)).0
}

fn tls_client(ca: &Ca) -> ClientConfig {
    client_config().tls(ca.client_tls("rpc.test")).auth_token(TOKEN)
}

fn call(client: &Client, seq: u64) -> Result<EchoMsg, Status> {
    client.unary(ECHO, &request(seq, 8, 8), &CallOptions::default())
}

fn connect_err(addr: SocketAddr, cfg: &ClientConfig) -> Status {
    match Client::connect_with(addr, cfg) {
        Ok(_) => panic!("the connect succeeded"),
        Err(e) => e,
    }
}

/// The server still serves a good TLS client (after a failed one).
fn serves_on(server: &ServerHandle, ca: &Ca) {
    let c = Client::connect_with(server.local_addr(), &tls_client(ca)).expect("a good client still connects");
    check_reply(&call(&c, 7).unwrap(), 7, 8);
}

/// A TCP proxy to `target` that records every byte each way (client to server, server to
/// client), for any number of connections.
struct Proxy {
    addr: SocketAddr,
    up: Arc<Mutex<Vec<u8>>>,
    down: Arc<Mutex<Vec<u8>>>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let up = Arc::new(Mutex::new(Vec::new()));
        let down = Arc::new(Mutex::new(Vec::new()));
        let (u, d) = (up.clone(), down.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(s) = TcpStream::connect(target) else { return };
                let pipe = |mut from: TcpStream, mut to: TcpStream, log: Arc<Mutex<Vec<u8>>>| {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                            log.lock().unwrap().extend_from_slice(&buf[..n]);
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                };
                pipe(c.try_clone().unwrap(), s.try_clone().unwrap(), u.clone());
                pipe(s, c, d.clone());
            }
        });
        Proxy { addr, up, down }
    }

    fn sent_up(&self) -> Vec<u8> {
        self.up.lock().unwrap().clone()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A `Client` calls over TLS through a recording proxy, and the token's bytes never appear in
/// what crossed; the same through a plaintext server shows them (the proxy sees the clear
/// handshake), so the check can see a token. Sabotaged: both ends ignoring their TLS
/// configuration (`ControlStream::accept` given `None`, `ClientCore::connect` taking the
/// plaintext branch): the token was found in the recorded bytes ("the auth token crossed in
/// clear").
#[test]
fn the_token_crosses_only_inside_tls() {
    let ca = Ca::new("test ca");
    let tls = tls_server(&ca);
    let proxy = Proxy::start(tls.local_addr());
    let client = Client::connect_with(proxy.addr, &tls_client(&ca)).unwrap();
    for seq in 0..20 {
        check_reply(&call(&client, seq).unwrap(), seq, 8);
    }
    let up = proxy.sent_up();
    assert!(!up.is_empty(), "the proxy saw the handshake");
    assert!(!contains(&up, TOKEN), "the auth token crossed in clear");
    assert_eq!(up[0], 0x16, "a TLS record (ClientHello) comes first");
    drop(client);
    tls.shutdown();

    // Control: without TLS the same token is in what crosses.
    let plain = spawn(server().auth_token(TOKEN)).0;
    let proxy = Proxy::start(plain.local_addr());
    let client = Client::connect_with(proxy.addr, &client_config().auth_token(TOKEN)).unwrap();
    check_reply(&call(&client, 1).unwrap(), 1, 8);
    assert!(contains(&proxy.sent_up(), TOKEN), "the plaintext handshake carries the token");
    assert!(!proxy.down.lock().unwrap().is_empty());
    drop(client);
    plain.shutdown();
}

/// A `Channel` connects over TLS, calls, and after its server is shut down and restarted on the
/// same address (TLS again) reconnects over TLS and calls again; a `Client` does the same.
/// Sabotaged: the client side taking the plaintext branch on every connect after the first two
/// (a `static` counter in `ClientCore::connect`): the reconnect was refused ("the reconnect was
/// not over TLS: UNAVAILABLE: ... this server requires TLS").
#[test]
fn a_channel_and_a_client_reconnect_over_tls_to_a_restarted_server() {
    let ca = Ca::new("test ca");
    let server_tls = ca.server_tls("rpc.test");
    let start = |addr: &str| {
        server().tls(server_tls.clone()).auth_token(TOKEN).add_service(TestService::default()).spawn(addr)
    };
    let first = start("127.0.0.1:0").unwrap();
    let addr = first.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let cfg = tls_client(&ca)
        .polling(PollingPolicy::Event { spins: 0 })
        .reconnect_initial_backoff(Duration::from_millis(50))
        .reconnect_max_backoff(Duration::from_millis(200));
    let chcfg =
        ChannelConfig::default().client(cfg.clone()).dispatchers(1).spins(500).thread_name("tls-chan");
    let ch = rt.block_on(Channel::connect_with(addr, &chcfg)).unwrap();
    let ch_call = |seq: u64| {
        let f = ch.unary::<_, EchoMsg>(ECHO, request(seq, 8, 8), &CallOptions::default());
        rt.block_on(async { tokio::time::timeout(WAIT, f).await.expect("the call never ended") })
    };
    let client = Client::connect_with(addr, &cfg).unwrap();
    check_reply(&ch_call(1).unwrap(), 1, 8);
    check_reply(&call(&client, 1).unwrap(), 1, 8);
    first.shutdown();
    // Both see the break (a call fails UNAVAILABLE) before the server is back.
    let mut seq = 2;
    loop {
        seq += 1;
        assert!(seq < 10_000, "the channel never saw the server go");
        match ch_call(seq) {
            Ok(r) => check_reply(&r, seq, 8),
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e}");
                break;
            }
        }
    }
    wait_until_closed(&client);

    let second = start(&addr.to_string()).expect("the same port again");
    let give_up = Instant::now() + WAIT;
    let mut last = None;
    let (mut ch_ok, mut client_ok) = (false, false);
    while !(ch_ok && client_ok) {
        assert!(Instant::now() < give_up, "never reconnected: {last:?}");
        seq += 1;
        if !ch_ok {
            match ch_call(seq) {
                Ok(r) => ch_ok = r.seq == seq,
                Err(e) => {
                    assert!(!e.message().contains("requires TLS"), "the reconnect was not over TLS: {e}");
                    last = Some(e)
                }
            }
        }
        if !client_ok {
            match call(&client, seq) {
                Ok(r) => client_ok = r.seq == seq,
                Err(e) => {
                    assert!(!e.message().contains("requires TLS"), "the reconnect was not over TLS: {e}");
                    last = Some(e)
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(e) = &last {
        assert_eq!(e.code(), Code::Unavailable, "{e}");
    }
    assert_eq!(ch.counters().sessions_opened, 2);
    assert_eq!(client.counters().sessions_opened, 2);
    drop(ch);
    drop(client);
    drop(rt);
    second.shutdown();
}

/// A server certificate from a CA the client does not trust: UNAUTHENTICATED naming the roots;
/// a session connected before goes on calling, and the server serves a new good client after
/// it. Sabotaged: `client_tls_status` mapping every TLS error to UNAVAILABLE: "left:
/// Unavailable, right: Unauthenticated"; the listener panicking on a connection that ended
/// during its handshake (`HandshakeStep::Gone` in `advance_handshake`): the new good client's
/// connect failed ("a good client still connects: ... Connection reset by peer"), while the
/// session connected before still called (its data path does not go through the listener).
#[test]
fn a_server_certificate_from_another_ca_fails_unauthenticated() {
    let (ca, other) = (Ca::new("test ca"), Ca::new("other ca"));
    let server = tls_server(&ca);
    let before = Client::connect_with(server.local_addr(), &tls_client(&ca)).unwrap();
    check_reply(&call(&before, 1).unwrap(), 1, 8);
    let e = connect_err(server.local_addr(), &tls_client(&other));
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.message().contains("roots") && e.message().contains("certificate"), "{e}");
    for seq in 2..10 {
        check_reply(&call(&before, seq).unwrap(), seq, 8);
    }
    serves_on(&server, &ca);
    server.shutdown();
}

/// A server certificate for another name: UNAUTHENTICATED naming the name expected.
/// Sabotaged: as above: "left: Unavailable, right: Unauthenticated".
#[test]
fn a_server_certificate_for_another_name_fails_unauthenticated() {
    let ca = Ca::new("test ca");
    let server = tls_server(&ca);
    let cfg = client_config().tls(ca.client_tls("elsewhere.test")).auth_token(TOKEN);
    let e = connect_err(server.local_addr(), &cfg);
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.message().contains("elsewhere.test") && e.message().contains("server name"), "{e}");
    serves_on(&server, &ca);
    server.shutdown();
}

/// A plaintext client to a TLS server is refused (in plaintext, which it reads) UNAVAILABLE
/// naming `ServerConfig::tls`. Sabotaged: `ControlStream::sniff` not checking the first byte
/// (always `Ready`): the server's TLS layer dropped the connection and the client read
/// "failed to fill whole buffer" (not naming ServerConfig::tls).
#[test]
fn a_plaintext_client_to_a_tls_server_fails_unavailable() {
    let ca = Ca::new("test ca");
    let server = tls_server(&ca);
    let e = connect_err(server.local_addr(), &client_config().auth_token(TOKEN));
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("ServerConfig::tls") && e.message().contains("ClientConfig::tls"), "{e}");
    serves_on(&server, &ca);
    server.shutdown();
}

/// A TLS client to a plaintext server: UNAVAILABLE saying the server does not speak TLS, with
/// the server's plaintext refusal. Sabotaged: `ControlStream::sniff` not checking the first
/// byte: the server took the ClientHello's first 262 bytes for a frame of unknown type 22 and
/// refused it INVALID_ARGUMENT ("bad handshake"), so the relayed refusal did not say the server
/// has no TLS (the client still said "does not speak TLS"); with a ClientHello under 262 bytes
/// both would wait for the other until the timeouts.
#[test]
fn a_tls_client_to_a_plaintext_server_fails_unavailable() {
    let ca = Ca::new("test ca");
    let (server, _) = spawn(server().handshake_timeout(Duration::from_secs(2)));
    let cfg = tls_client(&ca).connect_timeout(Duration::from_secs(2));
    let e = connect_err(server.local_addr(), &cfg);
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("does not speak TLS") && e.message().contains("ClientConfig::tls"), "{e}");
    // The server's own refusal, relayed: it saw a TLS record where a frame should be.
    assert!(e.message().contains("this server has no ServerConfig::tls"), "{e}");
    let c = Client::connect_with(server.local_addr(), &client_config()).unwrap();
    check_reply(&call(&c, 3).unwrap(), 3, 8);
    server.shutdown();
}

/// Mutual TLS: a server that requires client certificates refuses a client without one and a
/// client whose certificate is from another CA (UNAUTHENTICATED naming the client certificate),
/// and serves one with a certificate from its client roots. Sabotaged: `require_client_cert`
/// returning `self` unchanged: the client without a certificate connected ("the connect
/// succeeded").
#[test]
fn mutual_tls_requires_a_client_certificate_from_the_client_roots() {
    let (ca, client_ca, other) = (Ca::new("server ca"), Ca::new("client ca"), Ca::new("other ca"));
    let tls = ca.server_tls("rpc.test").require_client_cert(&client_ca.pem()).unwrap();
    assert!(tls.requires_client_cert());
    let (server, _) = spawn(server().tls(tls));
    let addr = server.local_addr();
    let e = connect_err(addr, &client_config().tls(ca.client_tls("rpc.test")));
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.message().contains("client's certificate"), "{e}");
    let (cert, key) = other.leaf(&["client.test"]);
    let wrong = ca.client_tls("rpc.test").with_client_cert(&cert, &key).unwrap();
    let e = connect_err(addr, &client_config().tls(wrong));
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    let (cert, key) = client_ca.leaf(&["client.test"]);
    let good = ca.client_tls("rpc.test").with_client_cert(&cert, &key).unwrap();
    let c = Client::connect_with(addr, &client_config().tls(good)).unwrap();
    check_reply(&call(&c, 5).unwrap(), 5, 8);
    server.shutdown();
}

/// Connections that never finish their TLS handshake (silent, or half a ClientHello) hold up
/// nobody: a good client connects meanwhile, and the server drops them at `handshake_timeout`.
/// A TLS client to a server that accepts and never answers fails UNAVAILABLE at
/// `connect_timeout`. Sabotaged: `ServerTlsConn::read` looping on `WouldBlock` from the socket
/// instead of returning it: the listener spun in the silent connection's read and the good
/// client's connect timed out ("no answer within").
#[test]
fn stalled_tls_handshakes_hold_up_nobody_and_end_at_the_timeouts() {
    let ca = Ca::new("test ca");
    let (server, _) =
        spawn(server().tls(ca.server_tls("rpc.test")).handshake_timeout(Duration::from_millis(500)));
    let addr = server.local_addr();
    let mut silent = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x01, 0x00, 0x01]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let c = Client::connect_with(addr, &client_config().tls(ca.client_tls("rpc.test"))).unwrap();
    check_reply(&call(&c, 9).unwrap(), 9, 8);
    // Both are closed by the server (a read ends) within the handshake timeout, not held.
    for s in [&mut silent, &mut half] {
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut b = [0u8; 64];
        loop {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(_) => {} // an alert
            }
        }
    }
    server.shutdown();

    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = client_config().tls(ca.client_tls("rpc.test")).connect_timeout(Duration::from_millis(300));
    let e = connect_err(mute.local_addr().unwrap(), &cfg);
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("connect_timeout"), "{e}");
}

/// Configuration errors name what is wrong, and never panic. Sabotaged: `ClientTls::new`
/// falling back to `localhost` for a server name that does not parse: "called
/// `Result::unwrap_err()` on an `Ok` value".
#[test]
fn bad_tls_configuration_is_refused_naming_what() {
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["rpc.test"]);
    let (_, other_key) = ca.leaf(&["rpc.test"]);
    let msg = |e: TlsError| e.to_string();
    let e = msg(ServerTls::from_pem(b"not pem", &key).unwrap_err());
    assert!(e.contains("certificate chain"), "{e}");
    let e = msg(ServerTls::from_pem(&cert, b"").unwrap_err());
    assert!(e.contains("private key"), "{e}");
    let e = msg(ServerTls::from_pem(&cert, &other_key).unwrap_err());
    assert!(e.contains("certificate and key"), "{e}");
    let e = msg(ServerTls::from_pem(&cert, &key).unwrap().require_client_cert(b"").unwrap_err());
    assert!(e.contains("client roots"), "{e}");
    let e = msg(ClientTls::from_pem(b"", "rpc.test").unwrap_err());
    assert!(e.contains("roots"), "{e}");
    let e = msg(ClientTls::from_pem(&ca.pem(), "not a name!").unwrap_err());
    assert!(e.contains("server name"), "{e}");
    let e = msg(ServerTls::from_pem_files("/nonexistent/cert.pem", "/nonexistent/key.pem").unwrap_err());
    assert!(e.contains("/nonexistent/cert.pem"), "{e}");
    // A debug print shows no key material.
    let dbg = format!("{:?}", ServerTls::from_pem(&cert, &key).unwrap());
    assert!(!dbg.contains("PRIVATE") && dbg.contains("ServerTls"), "{dbg}");
    // An IP address is a valid server name.
    ClientTls::from_pem(&ca.pem(), "127.0.0.1").unwrap();
}
