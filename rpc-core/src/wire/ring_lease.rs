//! The ring lease messages (protocol 12): a session's receive ring is granted on demand and
//! taken back when idle, instead of being exposed at the handshake.
//!
//! Before protocol 12 the server registered a ring per session at connect and gave its address,
//! length and rkey in the handshake. Now the server's handshake gives the length a grant will
//! have (`ring_len`) with address and rkey 0: no ring yet. The client, holding a body above the
//! eager threshold and no grant, sends a [`super::Kind::RingAsk`]; the server
//! answers a [`super::Kind::RingGrant`] (the ring, or a refusal), reclaims an
//! idle ring with a [`super::Kind::RingReclaim`], and the client answers
//! that with a [`super::Kind::RingRelease`]. The policy (who may send what
//! when) lives in the session layer (`crate::session`); this module only encodes and checks the
//! bodies.
//!
//! Bodies (eager, little endian):
//!
//! | message | bytes | fields |
//! |---|---|---|
//! | RingAsk | 4 | ring length asked for in bytes (a request: the server grants at most its own cap) |
//! | RingGrant, status OK | 16 | ring address (8), length in bytes (4), rkey (4) |
//! | RingGrant, any other status | 0 ..= [`MAX_CLOSE_REASON`] | the refusal's reason, as a Close's ([`super::close_reason`]) |

use super::{Kind, WireError, MAX_CLOSE_REASON};
use crate::status::Code;

/// Bytes of a RingAsk's body.
pub const RING_ASK_LEN: usize = 4;

/// Bytes of a granting RingGrant's body.
pub const RING_GRANT_LEN: usize = 16;

/// A ring granted to the peer: where it may RDMA WRITE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGrant {
    /// Address of the ring's first byte, as the peer's WRITEs name it.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The rkey of the window (or MR) that exposes it.
    pub rkey: u32,
}

impl RingGrant {
    /// The body of a granting RingGrant.
    pub fn encode(&self) -> [u8; RING_GRANT_LEN] {
        let mut out = [0u8; RING_GRANT_LEN];
        out[..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.rkey.to_le_bytes());
        out
    }

    /// Reads a granting RingGrant's body. Never panics.
    ///
    /// # Errors
    /// [`WireError`] naming `body_len` when `body` is not [`RING_GRANT_LEN`] bytes.
    pub fn decode(body: &[u8]) -> Result<RingGrant, WireError> {
        let b: &[u8; RING_GRANT_LEN] = body.try_into().map_err(|_| {
            WireError::bad("ring grant", "body_len", format!("{} bytes, not {RING_GRANT_LEN}", body.len()))
        })?;
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[..8]);
        Ok(RingGrant { addr: u64::from_le_bytes(addr), len: u32_at(8), rkey: u32_at(12) })
    }
}

/// The body of a RingAsk for `bytes`.
pub fn encode_ring_ask(bytes: u32) -> [u8; RING_ASK_LEN] {
    bytes.to_le_bytes()
}

/// The ring length a RingAsk's body asks for. Never panics.
///
/// # Errors
/// [`WireError`] naming `body_len` when `body` is not [`RING_ASK_LEN`] bytes.
pub fn decode_ring_ask(body: &[u8]) -> Result<u32, WireError> {
    let b: [u8; RING_ASK_LEN] = body.try_into().map_err(|_| {
        WireError::bad("ring ask", "body_len", format!("{} bytes, not {RING_ASK_LEN}", body.len()))
    })?;
    Ok(u32::from_le_bytes(b))
}

/// The header check of a RingAsk's or RingGrant's body (`Header::decode`): eager, and as long
/// as the table in the module docs says.
pub(super) fn check_body(kind: Kind, status: Code, in_ring: bool, body_len: u32) -> Result<(), WireError> {
    let ok = !in_ring
        && match (kind, status) {
            (Kind::RingAsk, Code::Ok) => body_len as usize == RING_ASK_LEN,
            (Kind::RingGrant, Code::Ok) => body_len as usize == RING_GRANT_LEN,
            (Kind::RingGrant, _) => body_len as usize <= MAX_CLOSE_REASON,
            _ => false,
        };
    if ok {
        return Ok(());
    }
    Err(WireError::bad(
        "header",
        "body_len",
        format!(
            "a ring ask carries {RING_ASK_LEN} bytes and a status OK, a ring grant {RING_GRANT_LEN} bytes \
             (OK) or a reason of at most {MAX_CLOSE_REASON} bytes (refused), eager: {body_len} bytes{}",
            if in_ring { " in the ring" } else { "" }
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, HEADER_LEN};

    fn msg(h: &Header, body: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN];
        h.encode((&mut out[..]).try_into().unwrap());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn grants_and_asks_round_trip_and_bad_lengths_name_the_field() {
        let g = RingGrant { addr: 0x1234_5678_9abc_def0, len: 1 << 20, rkey: 0xdead_beef };
        assert_eq!(RingGrant::decode(&g.encode()), Ok(g));
        assert_eq!(RingGrant::decode(&g.encode()[..15]).unwrap_err().field(), "body_len");
        assert_eq!(decode_ring_ask(&encode_ring_ask(4096)), Ok(4096));
        assert_eq!(decode_ring_ask(&[1, 2, 3]).unwrap_err().field(), "body_len");
    }

    #[test]
    fn headers_check_the_lease_bodies() {
        let ask = Header { body_len: 4, total_len: 4, ..Header::new(Kind::RingAsk) };
        assert!(Header::decode(&msg(&ask, &encode_ring_ask(1 << 20))).is_ok());
        let short = Header { body_len: 3, total_len: 3, ..ask };
        assert_eq!(Header::decode(&msg(&short, &[0; 3])).unwrap_err().field(), "body_len");
        let refused_ask = Header { status: Code::ResourceExhausted, ..ask };
        assert!(Header::decode(&msg(&refused_ask, &[0; 4])).is_err(), "an ask carries no status");
        let grant = Header { body_len: 16, total_len: 16, ..Header::new(Kind::RingGrant) };
        let g = RingGrant { addr: 4096, len: 65536, rkey: 7 };
        assert!(Header::decode(&msg(&grant, &g.encode())).is_ok());
        let refused = Header { status: Code::ResourceExhausted, body_len: 5, total_len: 5, ..grant };
        assert!(Header::decode(&msg(&refused, b"over!")).is_ok());
        let in_ring = Header { in_ring: true, ring_offset: 0, ..grant };
        assert!(Header::decode(&msg(&in_ring, &[])).is_err(), "a grant is eager");
        for kind in [Kind::RingReclaim, Kind::RingRelease] {
            assert!(Header::decode(&msg(&Header::new(kind), &[])).is_ok());
            let body = Header { body_len: 1, total_len: 1, ..Header::new(kind) };
            assert_eq!(Header::decode(&msg(&body, &[0])).unwrap_err().field(), "body_len");
        }
    }
}
