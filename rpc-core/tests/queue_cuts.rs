//! A CQ or send queue the configuration asks beyond the device's limit is cut to it, and the cut
//! is logged at warn with both numbers (asked and granted). On sim: `max_cqe` 65 536,
//! `max_qp_wr` 16 384.

mod rpc_support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use rpc_core::codegen::*;
use rpc_core::Client;
use rpc_support::*;

/// Everything logged at warn and above by any thread of this test binary.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self, needle: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines().filter(|l| l.contains(needle)).map(str::to_string).collect()
    }
}

#[test]
fn cuts_to_the_device_limits_are_logged_with_both_numbers() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    // 8 sessions of 4096 credits: 8 x 8200 send completions + an SRQ of 16 384 = 81 984 CQEs
    // asked, 65 536 granted; each session's send queue asks 2 x 8200 + 8 = 16 408 WQEs, 16 384
    // granted.
    let (big, _) = spawn(server().max_sessions(8).credits_per_session(4096).srq_depth(16384));
    let cq = log.lines("CQ size cut");
    assert_eq!(cq.len(), 1, "{cq:?}");
    assert!(
        cq[0].contains("WARN") && cq[0].contains("asked=81984") && cq[0].contains("granted=65536"),
        "{cq:?}"
    );
    let client = Client::connect_with(big.local_addr(), &client_config().window(4096)).unwrap();
    let r: EchoMsg = client.unary(ECHO, &request(1, 32, 32), &CallOptions::default()).unwrap();
    check_reply(&r, 1, 32);
    // The server's QP (and the client's, which asks the same).
    let sq = log.lines("send queue (max_send_wr) cut");
    assert!(!sq.is_empty(), "no send queue cut logged");
    assert!(
        sq.iter().all(|l| l.contains("WARN") && l.contains("asked=16408") && l.contains("granted=16384")),
        "{sq:?}"
    );
    // A default server asks within the limits: nothing more is logged.
    let before = log.lines("cut").len();
    let (small, _) = spawn(server());
    drop(small);
    assert_eq!(log.lines("cut").len(), before);
}
