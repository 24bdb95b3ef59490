//! Cross-process conformance on `sim`: the test process drives one side, a child process (this
//! test binary re-executed to run only the ignored `xproc::agent` test, with `RPC_XPROC_AGENT=1`)
//! drives the other, so the two QPs live in two processes and every transfer crosses the
//! shared-memory segments. The child obeys one-line commands on its stdin and answers on stdout
//! with lines starting `XPROC ` (libtest's own output is skipped).
//!
//! Commands (numbers decimal, GIDs hex): `node <mr_len> <rnr_retry> <min_rnr_timer> <timeout>
//! <retry_cnt>` → `addr <qpn> <gid> <mr_addr> <rkey>`; `connect <remote_qpn> <remote_gid>
//! <local_psn> <remote_psn>`; `recv <wr_id> <off> <len>`; `fill <off> <len> <seed>`;
//! `read <off> <len>` → `bytes <hex>`; `send <wr_id> <op> <off> <len> <remote_addr> <rkey> <imm>`
//! (op: send, send_imm, write, write_imm, read, send_inv (invalidates `rkey`); always signaled); `poll <rcq|scq> <n>` →
//! `wc` lines `<wr_id> <status> <opcode> <byte_len> <imm|-> <qp_num> <src_qp>`; `idle <rcq|scq>`
//! → the number of completions found in a few yielding polls; `state` → the QP state; `exit`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use rpc_core::verbs::rc::{connect, Endpoint};
use rpc_core::verbs::sim::{Sim, SimContext};
use rpc_core::verbs::{
    CompletionQueue, DeviceSelector, Gid, MemoryRegion, Mtu, Provider, QueuePair, RecvWr, SendFlags, SendOp,
    SendWr, WorkCompletion,
};

use super::{pattern, poll_n, post_recv, post_send, DeviceHarness, Node, Opts};

type H = DeviceHarness<Sim>;

/// The environment variable that makes the `agent` test serve commands.
pub const AGENT_ENV: &str = "RPC_XPROC_AGENT";

pub fn gid_hex(g: &Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn parse_gid(s: &str) -> Gid {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("gid hex");
    }
    Gid(g)
}

/// One completion as the agent reports it (statuses and opcodes by their verbs names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: String,
    pub opcode: String,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub qp_num: u32,
    pub src_qp: u32,
}

impl Wc {
    pub fn of(w: &WorkCompletion) -> Wc {
        Wc {
            wr_id: w.wr_id,
            status: format!("{:?}", w.status),
            opcode: format!("{:?}", w.opcode),
            byte_len: w.byte_len,
            imm: w.imm_data,
            qp_num: w.qp_num,
            src_qp: w.src_qp,
        }
    }

    fn line(&self) -> String {
        let imm = self.imm.map_or("-".to_string(), |i| i.to_string());
        format!(
            "{} {} {} {} {imm} {} {}",
            self.wr_id, self.status, self.opcode, self.byte_len, self.qp_num, self.src_qp
        )
    }

    fn parse(s: &str) -> Wc {
        let f: Vec<&str> = s.split_whitespace().collect();
        Wc {
            wr_id: f[0].parse().unwrap(),
            status: f[1].into(),
            opcode: f[2].into(),
            byte_len: f[3].parse().unwrap(),
            imm: (f[4] != "-").then(|| f[4].parse().unwrap()),
            qp_num: f[5].parse().unwrap(),
            src_qp: f[6].parse().unwrap(),
        }
    }
}

/// The child side, as the parent sees it.
pub struct Agent {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub qpn: u32,
    pub gid: Gid,
    pub mr_addr: u64,
    pub rkey: u32,
}

impl Agent {
    /// Starts the child and creates its node.
    pub fn spawn(opts: Opts) -> Agent {
        let exe = std::env::current_exe().expect("current_exe");
        let mut child = Command::new(exe)
            .args(["--ignored", "--exact", "xproc::agent", "--nocapture", "--test-threads=1"])
            .env(AGENT_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the agent process");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut a = Agent { child, stdin, stdout, qpn: 0, gid: Gid::default(), mr_addr: 0, rkey: 0 };
        let r = a.cmd(&format!(
            "node {} {} {} {} {}",
            opts.mr_len, opts.rnr_retry, opts.min_rnr_timer, opts.timeout, opts.retry_cnt
        ));
        let f: Vec<&str> = r[0].split_whitespace().collect();
        assert_eq!(f[0], "addr", "{r:?}");
        a.qpn = f[1].parse().unwrap();
        a.gid = parse_gid(f[2]);
        a.mr_addr = f[3].parse().unwrap();
        a.rkey = f[4].parse().unwrap();
        a
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a command; returns the answer lines (up to the `end` line).
    pub fn cmd(&mut self, c: &str) -> Vec<String> {
        writeln!(self.stdin, "{c}").and_then(|_| self.stdin.flush()).expect("writing to the agent");
        let mut out = Vec::new();
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("reading from the agent");
            assert!(n > 0, "the agent exited while answering {c:?} (see its panic above)");
            // libtest's "test xproc::agent ... " may precede the first answer on its line.
            let Some(at) = line.find("XPROC ") else { continue };
            let rest = line[at + 6..].trim_end();
            if rest == "end" {
                return out;
            }
            out.push(rest.to_string());
        }
    }

    /// Connects the agent's QP to `node`'s QP (the caller connects its own side).
    pub fn connect_to(&mut self, node: &Node<H>, local_psn: u32, remote_psn: u32) {
        let r = self.cmd(&format!(
            "connect {} {} {local_psn} {remote_psn}",
            node.qp.qp_num(),
            gid_hex(&node.addr.gid)
        ));
        assert_eq!(r, ["ok"]);
    }

    pub fn poll(&mut self, cq: &str, n: usize) -> Vec<Wc> {
        self.cmd(&format!("poll {cq} {n}")).iter().map(|l| Wc::parse(l)).collect()
    }

    pub fn read(&mut self, off: usize, len: usize) -> Vec<u8> {
        let r = self.cmd(&format!("read {off} {len}"));
        let hex = r[0].strip_prefix("bytes ").unwrap_or("");
        (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect()
    }

    /// Kills the child (SIGKILL) and reaps it.
    pub fn kill(mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("wait");
    }

    /// Asks the child to exit normally and reaps it.
    pub fn exit(mut self) {
        assert_eq!(self.cmd("exit"), ["ok"]);
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "agent exit status {status}");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects a local node to the agent's QP, both sides (PSNs 0x100 from here, 0x200 from there).
pub fn connect_pair(node: &Node<H>, agent: &mut Agent) {
    let ea = node.endpoint(&node.qp, 0x100);
    let eb = Endpoint { qp_num: agent.qpn, psn: 0x200, lid: 0, gid: agent.gid, mtu: Mtu::Mtu4096 };
    agent.connect_to(node, 0x200, 0x100);
    connect(&node.qp, &node.addr.cfg, &ea, &eb).expect("connect to the agent");
}

/// The agent's command loop (runs in the child).
pub fn serve() {
    let ctx: SimContext = Sim::open(&DeviceSelector::First).expect("open sim");
    let mut node: Option<Node<H>> = None;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.expect("stdin");
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { f[i].parse().unwrap_or_else(|_| panic!("bad number in {line:?}")) };
        let mut say = |s: String| writeln!(out, "XPROC {s}").expect("stdout");
        match f.first().copied() {
            Some("node") => {
                let opts = Opts {
                    mr_len: num(1) as usize,
                    rnr_retry: num(2) as u8,
                    min_rnr_timer: num(3) as u8,
                    timeout: num(4) as u8,
                    retry_cnt: num(5) as u8,
                    ..Opts::default()
                };
                let n = Node::<H>::new(&ctx, opts);
                say(format!(
                    "addr {} {} {} {}",
                    n.qp.qp_num(),
                    gid_hex(&n.addr.gid),
                    n.mr.addr(),
                    n.mr.rkey()
                ));
                node = Some(n);
            }
            Some(cmd) => {
                let n = node.as_mut().expect("node first");
                match cmd {
                    "connect" => {
                        let local = n.endpoint(&n.qp, num(3) as u32);
                        let remote = Endpoint {
                            qp_num: num(1) as u32,
                            psn: num(4) as u32,
                            lid: 0,
                            gid: parse_gid(f[2]),
                            mtu: Mtu::Mtu4096,
                        };
                        connect(&n.qp, &n.addr.cfg, &local, &remote).expect("connect");
                        say("ok".into());
                    }
                    "recv" => {
                        let sge = [n.sge(num(2) as usize, num(3) as u32)];
                        post_recv(&n.qp, &[RecvWr { wr_id: num(1), sg_list: &sge }]).expect("post_recv");
                        say("ok".into());
                    }
                    "fill" => {
                        let (off, len) = (num(1) as usize, num(2) as usize);
                        n.write(off, &pattern(num(3) as u8, len));
                        say("ok".into());
                    }
                    "read" => {
                        let (off, len) = (num(1) as usize, num(2) as usize);
                        say(format!(
                            "bytes {}",
                            n.bytes()[off..off + len].iter().map(|b| format!("{b:02x}")).collect::<String>()
                        ));
                    }
                    "send" => {
                        let (remote_addr, rkey, imm) = (num(5), num(6) as u32, num(7) as u32);
                        let op = match f[2] {
                            "send" => SendOp::Send,
                            "send_imm" => SendOp::SendWithImm { imm },
                            "write" => SendOp::RdmaWrite { remote_addr, rkey },
                            "write_imm" => SendOp::RdmaWriteWithImm { remote_addr, rkey, imm },
                            "read" => SendOp::RdmaRead { remote_addr, rkey },
                            "send_inv" => SendOp::SendWithInv { invalidate_rkey: rkey },
                            other => panic!("unknown op {other}"),
                        };
                        let sge = [n.sge(num(3) as usize, num(4) as u32)];
                        let wr = SendWr { wr_id: num(1), sg_list: &sge, op, flags: SendFlags::SIGNALED };
                        post_send(&n.qp, &[wr]).expect("post_send");
                        say("ok".into());
                    }
                    "poll" => {
                        let cq = if f[1] == "rcq" { &n.rcq } else { &n.scq };
                        for w in poll_n::<H, _>(cq, num(2) as usize, "the parent's traffic") {
                            say(Wc::of(&w).line());
                        }
                    }
                    "idle" => {
                        let cq = if f[1] == "rcq" { &n.rcq } else { &n.scq };
                        let mut buf = [WorkCompletion::default(); 4];
                        let mut got = 0;
                        for _ in 0..50 {
                            got += cq.poll(&mut buf).expect("poll");
                            std::thread::yield_now();
                        }
                        say(got.to_string());
                    }
                    "state" => say(format!("{:?}", n.qp.state())),
                    "exit" => {
                        drop(node.take());
                        say("ok".into());
                        say("end".into());
                        drop(ctx);
                        std::process::exit(0);
                    }
                    other => panic!("unknown command {other}"),
                }
            }
            None => continue,
        }
        say("end".into());
    }
    drop(node);
}

/// Files in /dev/shm of this user's sim hosts of process `pid`.
pub fn segments_of(pid: u32) -> Vec<String> {
    // SAFETY: no preconditions.
    let uid = unsafe { libc::geteuid() };
    let prefix = format!("rpc-sim.{uid}.{pid}.");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether this process is the agent.
pub fn is_agent() -> bool {
    std::env::var(AGENT_ENV).is_ok_and(|v| v == "1")
}
