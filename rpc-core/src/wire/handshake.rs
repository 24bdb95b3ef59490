//! The connection handshake, exchanged once over TCP in both directions before the QPs move to
//! RTS (as perftest and the RDMA tutorials do). Framed as `type u8, length u16 (LE), payload`.
//!
//! Handshake payload (little endian):
//!
//! | size | field |
//! |---|---|
//! | 4 | magic `b"RPCH"` |
//! | 2 | protocol version ([`PROTOCOL_VERSION`]) |
//! | 2 | flags ([`FLAG_IDLE_PONGS`] and [`FLAG_SHM`] from a client, [`FLAG_DETACHED`] from a server; other bits 0) |
//! | 4 | QPN (24 bits, non-zero) |
//! | 4 | PSN (24 bits) |
//! | 2 | LID (InfiniBand; 0 elsewhere) |
//! | 1 | MTU (verbs enum, 1..=5) |
//! | 1 | reserved, 0 |
//! | 16 | GID |
//! | 8 | ring address (where the peer RDMA WRITEs bulk bodies; 0 from a server: its ring is granted on demand, [`super::ring_lease`]) |
//! | 4 | ring length in bytes (1 ..= 1 GiB on the wire; each end refuses a peer ring below [`MIN_RING_LEN`], and a server one above its `max_peer_ring_bytes`) |
//! | 4 | ring rkey (0 from a server) |
//! | 2 | credits: requests in flight (client: asked; server: granted), 1..=4096 |
//! | 2 | reserved, 0 |
//! | 4 | eager threshold in bytes (bodies up to this go in the SEND) |
//! | 4 | max message size in bytes |
//! | 4 | session id (server → client; 0 from the client) |
//! | 2 | auth token length (0..=[`MAX_AUTH_TOKEN`]) |
//! | n | auth token |

use std::io::{Read, Write};

use super::WireError;
use crate::status::Code;
use crate::verbs::{Gid, Mtu};

/// `b"RPCH"` as a little-endian u32.
pub const HANDSHAKE_MAGIC: u32 = u32::from_le_bytes(*b"RPCH");
/// The protocol version this build speaks; a peer with another version is refused.
///
/// 13 (2026-12-07): a client on the server's host may connect on the software NIC to a server
/// on an RDMA NIC ([`FLAG_SHM`]).
/// 12 (2026-12-06): the server's receive ring is granted on demand ([`super::ring_lease`]):
/// its handshake gives the ring's length with address and rkey 0, the client asks with a
/// [`super::Kind::RingAsk`] before its first body above the eager threshold, and the server
/// takes an idle ring back ([`super::Kind::RingReclaim`], [`super::Kind::RingRelease`]); and a
/// server may hold no control connection for a session ([`FLAG_DETACHED`] in its reply; a
/// client of version 11 would read the closed connection as the server's death).
/// Request credits are granted on demand too: the reply's `credits` are the session's first
/// ones, raised and lowered by [`super::Kind::CreditGrant`]s the client answers with
/// [`super::Kind::CreditAck`]s (the session's `credits` policy).
/// 11 (2026-12-06): a request may keep its metadata block as the session's cached block, and
/// later requests name that block instead of carrying it ([`super::header::METADATA_STORE`],
/// [`super::header::METADATA_CACHED`]).
/// 10 (2026-12-06): a server's stream message may start with a metadata block, the stream's
/// response headers ([`super::header::METADATA`]), before its first message rather than with
/// its end.
/// 9 (2026-12-06): a response may carry response metadata, its headers and trailers
/// ([`super::header::METADATA`]; a status's details travel as a trailer).
/// 8 (2026-12-05): a request may carry a metadata block ([`super::header::METADATA`]); a
/// response's `count` is the server's load (its calls admitted and not yet answered, over all its
/// sessions; `wire/header.rs`), 0 before.
/// 7 (2026-12-05): a Close carries a status and a reason of at most 256 bytes
/// (`wire/close.rs`); a server keeps at most [`crate::session::ring_units`] ring bodies and pieces
/// unfreed in the client's ring and closes a session whose RingReturn frees no whole one, and a
/// client reports freed space once half of those are freed (a version-6 client would leave such
/// a server waiting for a Ping). 6: the idle probe (`FLAG_IDLE_PONGS`).
pub const PROTOCOL_VERSION: u16 = 13;
/// Handshake flag, client → server: this client answers Pings while it has no call on the wire
/// (a [`Channel`](crate::Channel), whose dispatcher thread looks at its idle session at least
/// every 50 ms, and a blocking [`Client`](crate::Client), whose endpoint's progress thread does
/// every 50 to 400 ms),
/// so the server may probe its idle session and close it after `peer_timeout` of silence (a
/// SIGSTOPped or hung client process, whose kernel still answers TCP keepalives).
pub const FLAG_IDLE_PONGS: u16 = 1;
/// Handshake flag, server → client (protocol 12): the server holds no control connection for
/// this session. It closes the TCP connection once this reply is written, and the client closes
/// its end once it has read it; the session lives on the RDMA path alone: its teardown is the
/// Close message, and a dead peer is found by the idle probe (`peer_timeout`) and, on the
/// server, by `ServerConfig::idle_timeout` for a client that answers no probe while idle. A
/// server sets it for the sessions it admits beyond `ServerConfig::max_control_connections`
/// (the open-file limit at scale); a client never sends it (a server refuses a handshake that
/// does).
pub const FLAG_DETACHED: u16 = 2;
/// Handshake flag, client → server (protocol 13): this hello is for the same-host path. The
/// client runs on the server's host and made its QP on the software NIC (`sim`, shared memory)
/// instead of the RDMA NIC the server's address is for (`ClientConfig::same_host_shm`), so
/// bodies skip the NIC's loopback. A server on an RDMA NIC with `ServerConfig::same_host_shm`
/// hands the session to its software-NIC workers; one without refuses FAILED_PRECONDITION
/// (naming the setting), and the client connects again on the RDMA NIC. A server on `sim`
/// admits it as any hello. Whether the client really shares the host is proven by the QP
/// connect itself: the software NIC reaches only hosts in the same `/dev/shm`.
pub const FLAG_SHM: u16 = 4;
/// Every handshake flag this build knows.
const KNOWN_FLAGS: u16 = FLAG_IDLE_PONGS | FLAG_DETACHED | FLAG_SHM;
/// Longest auth token in bytes.
pub const MAX_AUTH_TOKEN: usize = 256;
/// Longest frame payload in bytes.
pub const MAX_FRAME: usize = 1024;
/// Largest ring accepted: 1 GiB.
pub const MAX_RING_LEN: u32 = 1 << 30;
/// Smallest ring either end accepts from its peer (and may configure): 64 KiB. Every piece of a
/// ring body but its message's last holds at least 1/16 of the receiver's ring (checked on
/// receive, `session::Session::handle_header`), so a body costs at most 16 SENDs per ring length
/// (4 KiB pieces at the minimum), never one WR per byte. Checked by the server against the
/// client's handshake (refused INVALID_ARGUMENT naming `ring_len`) and by the client against the
/// server's reply; the wire format itself carries 1 ..= [`MAX_RING_LEN`].
pub const MIN_RING_LEN: u32 = 64 << 10;
/// Most credits a session may have.
pub const MAX_CREDITS: u16 = 4096;

const FIXED_LEN: usize = 4 + 2 + 2 + 4 + 4 + 2 + 1 + 1 + 16 + 8 + 4 + 4 + 2 + 2 + 4 + 4 + 4 + 2;
const TYPE_HANDSHAKE: u8 = 1;
const TYPE_REFUSAL: u8 = 2;

/// One side's connection parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// Protocol version ([`PROTOCOL_VERSION`]).
    pub version: u16,
    /// [`FLAG_IDLE_PONGS`] or 0 (a server sends 0).
    pub flags: u16,
    /// QP number (24 bits).
    pub qp_num: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// LID (InfiniBand) or 0.
    pub lid: u16,
    /// Active MTU of the port.
    pub mtu: Mtu,
    /// GID.
    pub gid: Gid,
    /// Address of this side's receive ring (the peer writes bulk bodies there).
    pub ring_addr: u64,
    /// Length of the receive ring in bytes.
    pub ring_len: u32,
    /// rkey of the receive ring.
    pub ring_rkey: u32,
    /// Credits: requests in flight (asked by the client, granted by the server).
    pub credits: u16,
    /// Eager threshold in bytes.
    pub eager_threshold: u32,
    /// Max message (body) size in bytes.
    pub max_message: u32,
    /// Session id (assigned by the server; 0 from the client).
    pub session: u32,
    /// Optional auth token (at most [`MAX_AUTH_TOKEN`] bytes).
    pub auth_token: Vec<u8>,
}

/// A refused handshake: the status the connecting side reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Status code (never OK).
    pub code: Code,
    /// Why, naming the field or limit.
    pub message: String,
}

/// A frame of the setup exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Connection parameters.
    Handshake(Handshake),
    /// The other side refused.
    Refusal(Refusal),
}

fn take<'a>(buf: &mut &'a [u8], n: usize, field: &'static str, total: usize) -> Result<&'a [u8], WireError> {
    if buf.len() < n {
        return Err(WireError::Truncated {
            what: "handshake",
            field,
            need: total - buf.len() + n,
            have: total,
        });
    }
    let (a, b) = buf.split_at(n);
    *buf = b;
    Ok(a)
}

impl Handshake {
    /// Encodes the payload (without the frame header).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&HANDSHAKE_MAGIC.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.qp_num.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.push(self.mtu as u8);
        out.push(0);
        out.extend_from_slice(self.gid.raw());
        out.extend_from_slice(&self.ring_addr.to_le_bytes());
        out.extend_from_slice(&self.ring_len.to_le_bytes());
        out.extend_from_slice(&self.ring_rkey.to_le_bytes());
        out.extend_from_slice(&self.credits.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.eager_threshold.to_le_bytes());
        out.extend_from_slice(&self.max_message.to_le_bytes());
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&(self.auth_token.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.auth_token);
    }

    /// Decodes and validates a payload.
    ///
    /// # Errors
    /// [`WireError`] naming the first bad field (magic, version, qp_num, psn, mtu, ring_len,
    /// credits, auth_token, ...).
    pub fn decode(payload: &[u8]) -> Result<Handshake, WireError> {
        let total = payload.len();
        let mut b = payload;
        let u16f = |b: &mut &[u8], f| take(b, 2, f, total).map(|s| u16::from_le_bytes([s[0], s[1]]));
        let magic = take(&mut b, 4, "magic", total)?;
        if magic != HANDSHAKE_MAGIC.to_le_bytes() {
            return Err(WireError::bad("handshake", "magic", format!("{magic:02x?} is not \"RPCH\"")));
        }
        let version = u16f(&mut b, "version")?;
        if version != PROTOCOL_VERSION {
            return Err(WireError::bad(
                "handshake",
                "version",
                format!("peer speaks protocol {version}, this build speaks {PROTOCOL_VERSION}"),
            ));
        }
        let flags = u16f(&mut b, "flags")?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(WireError::bad(
                "handshake",
                "flags",
                format!("{flags:#06x} has bits this build does not know (it knows {KNOWN_FLAGS:#06x})"),
            ));
        }
        let u32f =
            |b: &mut &[u8], f| take(b, 4, f, total).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
        let qp_num = u32f(&mut b, "qp_num")?;
        if qp_num == 0 || qp_num > 0xff_ffff {
            return Err(WireError::bad(
                "handshake",
                "qp_num",
                format!("{qp_num:#x} is not a 24-bit non-zero QPN"),
            ));
        }
        let psn = u32f(&mut b, "psn")?;
        if psn > 0xff_ffff {
            return Err(WireError::bad("handshake", "psn", format!("{psn:#x} is not a 24-bit PSN")));
        }
        let lid = u16f(&mut b, "lid")?;
        let m = take(&mut b, 2, "mtu", total)?;
        let mtu = Mtu::from_ibv(u32::from(m[0])).ok_or_else(|| {
            WireError::bad("handshake", "mtu", format!("{} is not 1..=5 (256..4096 bytes)", m[0]))
        })?;
        if m[1] != 0 {
            return Err(WireError::bad("handshake", "reserved", "must be 0"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(take(&mut b, 16, "gid", total)?);
        let a = take(&mut b, 8, "ring_addr", total)?;
        let ring_addr = u64::from_le_bytes(a.try_into().unwrap_or([0; 8]));
        let ring_len = u32f(&mut b, "ring_len")?;
        if ring_len == 0 || ring_len > MAX_RING_LEN {
            return Err(WireError::bad(
                "handshake",
                "ring_len",
                format!("{ring_len} bytes is not in 1..={MAX_RING_LEN}"),
            ));
        }
        let ring_rkey = u32f(&mut b, "ring_rkey")?;
        let credits = u16f(&mut b, "credits")?;
        if credits == 0 || credits > MAX_CREDITS {
            return Err(WireError::bad(
                "handshake",
                "credits",
                format!("{credits} is not in 1..={MAX_CREDITS}"),
            ));
        }
        if u16f(&mut b, "reserved")? != 0 {
            return Err(WireError::bad("handshake", "reserved", "must be 0"));
        }
        let eager_threshold = u32f(&mut b, "eager_threshold")?;
        if eager_threshold > MAX_RING_LEN {
            return Err(WireError::bad(
                "handshake",
                "eager_threshold",
                format!("{eager_threshold} bytes is too large"),
            ));
        }
        let max_message = u32f(&mut b, "max_message")?;
        if max_message == 0 {
            return Err(WireError::bad("handshake", "max_message", "0 bytes"));
        }
        let session = u32f(&mut b, "session")?;
        let tlen = usize::from(u16f(&mut b, "auth_token")?);
        if tlen > MAX_AUTH_TOKEN {
            return Err(WireError::bad(
                "handshake",
                "auth_token",
                format!("{tlen} bytes, at most {MAX_AUTH_TOKEN}"),
            ));
        }
        let auth_token = take(&mut b, tlen, "auth_token", total)?.to_vec();
        if !b.is_empty() {
            return Err(WireError::bad("handshake", "length", format!("{} trailing bytes", b.len())));
        }
        Ok(Handshake {
            version,
            flags,
            qp_num,
            psn,
            lid,
            mtu,
            gid: Gid(gid),
            ring_addr,
            ring_len,
            ring_rkey,
            credits,
            eager_threshold,
            max_message,
            session,
            auth_token,
        })
    }
}

impl Frame {
    /// Encodes the whole frame (type, length, payload).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![0u8; 3];
        match self {
            Frame::Handshake(h) => {
                v[0] = TYPE_HANDSHAKE;
                h.encode(&mut v);
            }
            Frame::Refusal(r) => {
                v[0] = TYPE_REFUSAL;
                v.push(r.code as u8);
                let msg = r.message.as_bytes();
                let n = msg.len().min(MAX_FRAME - 3);
                v.extend_from_slice(&(n as u16).to_le_bytes());
                v.extend_from_slice(&msg[..n]);
            }
        }
        let len = (v.len() - 3) as u16;
        v[1..3].copy_from_slice(&len.to_le_bytes());
        v
    }

    /// Decodes a frame of `type` with `payload`.
    ///
    /// # Errors
    /// [`WireError`] naming the bad field.
    pub fn decode(ty: u8, payload: &[u8]) -> Result<Frame, WireError> {
        match ty {
            TYPE_HANDSHAKE => Handshake::decode(payload).map(Frame::Handshake),
            TYPE_REFUSAL => {
                let total = payload.len();
                let mut b = payload;
                let c = take(&mut b, 1, "code", total)?[0];
                let code = Code::from_u8(c)
                    .filter(|c| *c != Code::Ok)
                    .ok_or_else(|| WireError::bad("refusal", "code", format!("{c} is not an error code")))?;
                let l = take(&mut b, 2, "message", total)?;
                let n = usize::from(u16::from_le_bytes([l[0], l[1]]));
                let msg = take(&mut b, n, "message", total)?;
                if !b.is_empty() {
                    return Err(WireError::bad("refusal", "length", format!("{} trailing bytes", b.len())));
                }
                Ok(Frame::Refusal(Refusal { code, message: String::from_utf8_lossy(msg).into_owned() }))
            }
            t => Err(WireError::bad("frame", "type", format!("{t} is not 1 (handshake) or 2 (refusal)"))),
        }
    }
}

/// Errors of the framed exchange over a stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The stream failed or closed.
    #[error("handshake I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something invalid.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// Writes one frame to `w`.
///
/// # Errors
/// The stream's I/O error.
pub fn write_frame(w: &mut impl Write, frame: &Frame) -> std::io::Result<()> {
    w.write_all(&frame.encode())?;
    w.flush()
}

/// Reads one frame from `r` (blocking).
///
/// # Errors
/// [`FrameError::Io`] when the stream fails or closes; [`FrameError::Wire`] for a bad frame.
pub fn read_frame(r: &mut impl Read) -> Result<Frame, FrameError> {
    let mut head = [0u8; 3];
    r.read_exact(&mut head)?;
    let len = usize::from(u16::from_le_bytes([head[1], head[2]]));
    if len > MAX_FRAME {
        return Err(WireError::bad("frame", "length", format!("{len} bytes, at most {MAX_FRAME}")).into());
    }
    let mut payload = [0u8; MAX_FRAME];
    r.read_exact(&mut payload[..len])?;
    Ok(Frame::decode(head[0], &payload[..len])?)
}

const _: () = assert!(FIXED_LEN + MAX_AUTH_TOKEN <= MAX_FRAME);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Handshake {
        Handshake {
            version: PROTOCOL_VERSION,
            flags: FLAG_IDLE_PONGS,
            qp_num: 0x12,
            psn: 0xabcdef,
            lid: 0,
            mtu: Mtu::Mtu4096,
            gid: Gid([7; 16]),
            ring_addr: 0x7f00_0000_1000,
            ring_len: 1 << 20,
            ring_rkey: 0x55,
            credits: 32,
            eager_threshold: 4096,
            max_message: 16 << 20,
            session: 3,
            auth_token: b"secret".to_vec(),
        }
    }

    #[test]
    fn handshake_round_trips_through_a_stream() {
        let f = Frame::Handshake(sample());
        let mut buf = Vec::new();
        write_frame(&mut buf, &f).unwrap();
        assert_eq!(buf.len(), 3 + FIXED_LEN + 6);
        assert_eq!(read_frame(&mut buf.as_slice()).unwrap(), f);
        let r = Frame::Refusal(Refusal {
            code: Code::ResourceExhausted,
            message: "max_sessions 2 reached".into(),
        });
        let mut buf = Vec::new();
        write_frame(&mut buf, &r).unwrap();
        assert_eq!(read_frame(&mut buf.as_slice()).unwrap(), r);
    }

    fn field_of(h: &Handshake, patch: impl Fn(&mut Vec<u8>)) -> &'static str {
        let mut v = Vec::new();
        h.encode(&mut v);
        patch(&mut v);
        Handshake::decode(&v).unwrap_err().field()
    }

    #[test]
    fn bad_handshakes_name_the_field() {
        let h = sample();
        assert_eq!(field_of(&h, |v| v[0] = b'X'), "magic");
        assert_eq!(field_of(&h, |v| v[4] = PROTOCOL_VERSION as u8 + 1), "version");
        assert_eq!(field_of(&Handshake { flags: 8, ..h.clone() }, |_| ()), "flags");
        assert_eq!(field_of(&h, |v| v[7] = 0x80), "flags");
        assert_eq!(field_of(&Handshake { qp_num: 0, ..h.clone() }, |_| ()), "qp_num");
        assert_eq!(field_of(&Handshake { qp_num: 1 << 24, ..h.clone() }, |_| ()), "qp_num");
        assert_eq!(field_of(&Handshake { psn: 1 << 24, ..h.clone() }, |_| ()), "psn");
        assert_eq!(field_of(&h, |v| v[18] = 9), "mtu");
        assert_eq!(field_of(&Handshake { ring_len: 0, ..h.clone() }, |_| ()), "ring_len");
        assert_eq!(field_of(&Handshake { ring_len: MAX_RING_LEN + 1, ..h.clone() }, |_| ()), "ring_len");
        assert_eq!(field_of(&Handshake { credits: 0, ..h.clone() }, |_| ()), "credits");
        assert_eq!(field_of(&Handshake { max_message: 0, ..h.clone() }, |_| ()), "max_message");
        assert_eq!(field_of(&Handshake { auth_token: vec![1; 300], ..h.clone() }, |_| ()), "auth_token");
        assert_eq!(field_of(&h, |v| v.truncate(10)), "qp_num");
        assert_eq!(field_of(&h, |v| v.push(0)), "length");
        let e = Handshake::decode(&[]).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
    }

    proptest! {
        #[test]
        fn handshakes_round_trip(
            qp in 1u32..=0xff_ffff, psn in 0u32..=0xff_ffff, lid: u16, m in 1u32..=5, gid: [u8; 16],
            addr: u64, len in 1u32..=MAX_RING_LEN, rkey: u32, credits in 1u16..=MAX_CREDITS,
            eager in 0u32..=MAX_RING_LEN, maxm in 1u32.., session: u32,
            token in proptest::collection::vec(any::<u8>(), 0..=MAX_AUTH_TOKEN), flags in 0u16..=KNOWN_FLAGS,
        ) {
            let h = Handshake {
                version: PROTOCOL_VERSION, flags, qp_num: qp, psn, lid, mtu: Mtu::from_ibv(m).unwrap(), gid: Gid(gid),
                ring_addr: addr, ring_len: len, ring_rkey: rkey, credits, eager_threshold: eager,
                max_message: maxm, session, auth_token: token,
            };
            let f = Frame::Handshake(h);
            prop_assert_eq!(read_frame(&mut f.encode().as_slice()).unwrap(), f);
        }

        /// The fuzz target's property, also run in the normal suite.
        #[test]
        fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            crate::wire::fuzz_handshake(&bytes);
        }
    }
}
