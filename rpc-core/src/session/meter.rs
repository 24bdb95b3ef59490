//! The server's meter of what a client sends outside its credits, sans-IO: every message a
//! client sends takes a receive WQE of the worker's shared receive queue (SRQ), and the worker
//! reserves a fixed number of them per session (`endpoint::conn::srq_need`). Requests and stream
//! SENDs are held to the credits (`Session::check_credit`, `StreamSends`), Cancels to one per
//! credit (`Session::handle_header`); this meters the rest, each against what the protocol lets
//! a client that keeps it send between two of the server's own messages or per message the server
//! sent, so that a flood from one session closes that session before it takes its neighbours'
//! WQEs (receiver-not-ready, RNR, for them):
//!
//! | message | at most | why |
//! |---|---|---|
//! | Ping | [`MAX_PINGS`] between two messages of ours | a client pings after a third and two thirds of its `peer_timeout` of silence, and any message of ours ends the silence; two silences can overlap one of our messages |
//! | Pong | one per Ping of ours not yet answered, at most [`MAX_PONGS_OWED`] | a client sends a Pong only for a Ping (one Pong may answer several); we send at most two Pings per silence (after a third and two thirds of our `peer_timeout`), and a client that answers none of them is owed no more |
//! | RingReturn | each frees at least one whole ring body or piece of ours, and we keep at most [`super::ring_units`] of them unfreed in the client's ring | a client sends one only after it freed ring space (whole bodies, in order), stamped with the new head at once: at most one per body we placed, and those are never more than the cap |
//! | piece that is not the last of its message | [`pieces_between`] of our ring (16 for a ring of 256 bytes or more) between two messages of ours | each takes at least 1/16 of our ring (rounded down), and the client writes only into space our messages reported free: what arrives between two of them fits in one ring |
//!
//! Each check is a compare (and an add) on a message that is not a request or a response; the
//! eager path of requests pays nothing. A client over a limit gets a reason naming the rule,
//! starting with [`PREFIX`] (the session closes, counted by the worker as `Counters::metered`).

use super::MAX_PIECES_IN_RING;

/// Most Pings a client may send between two messages of the server: two per silence of its
/// own (`peer_timeout / 3` and `2 × peer_timeout / 3`), and a second silence may start before
/// the first one's Pings arrived.
pub const MAX_PINGS: u8 = 4;

/// Most Pongs a client may owe the server: the Pings of one silence of ours (after a third and two
/// thirds of our `peer_timeout`; the session closes at the end of it). Pings beyond it that are
/// left unanswered are not counted again, so a client that held its Pongs back can send at most
/// this many at once. The worker reserves [`MAX_PINGS`] + this many receive WQEs per session for
/// the probe (`endpoint::conn::srq_need`).
pub const MAX_PONGS_OWED: u8 = 2;

/// Most pieces that are not the last of their message a client may send between two messages
/// of the server, for a server ring of `ring_len` bytes: as many as fit in the ring at the
/// smallest piece a client that keeps the protocol cuts, `ring_len / 16` rounded down (at least
/// 1 byte): [`MAX_PIECES_IN_RING`] for a ring of 256 bytes or more, a few more for smaller ones.
pub fn pieces_between(ring_len: u32) -> u32 {
    ring_len / (ring_len / MAX_PIECES_IN_RING).max(1)
}

/// The reason texts of a session closed by the meter all start with this (see
/// [`is_violation`]).
pub const PREFIX: &str = "beyond the session's receive reservation: ";

/// Whether a close reason (as [`super::Session::receive`] returns it) is the meter's.
pub fn is_violation(reason: &str) -> bool {
    reason.contains(PREFIX)
}

/// The meter's rules, as reason texts.
pub(super) struct Violation;

impl Violation {
    pub(super) const PINGS: &'static str =
        "beyond the session's receive reservation: more than 4 Pings between two messages of the server";
    pub(super) const PONG: &'static str =
        "beyond the session's receive reservation: a Pong for no Ping of the server";
    pub(super) const RING_RETURN: &'static str =
        "beyond the session's receive reservation: a RingReturn that frees no whole ring body of the server";
    pub(super) const PIECES: &'static str =
        "beyond the session's receive reservation: more pieces between two \
         messages of the server than its ring holds at a sixteenth of it each";
}

/// Per-session counts (server).
#[derive(Debug)]
pub(super) struct Meter {
    /// Reset by every message the server sends ([`Meter::sent`]).
    pub(super) between: Between,
    /// Pings sent and not yet answered by a Pong.
    pub(super) pongs_owed: u8,
    /// [`pieces_between`] our ring.
    pub(super) max_pieces: u32,
}

/// What the client sent since the server's last message.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Between {
    pub(super) pings: u8,
    pub(super) pieces: u32,
}

impl Meter {
    /// The meter of a session whose own ring (the client writes into) is `own_ring_len` bytes.
    pub(super) fn new(own_ring_len: u32) -> Meter {
        Meter { between: Between::default(), pongs_owed: 0, max_pieces: pieces_between(own_ring_len) }
    }

    /// The server sends a message.
    #[inline(always)]
    pub(super) fn sent(&mut self) {
        self.between = Between::default();
    }

    /// The server sends a Ping.
    pub(super) fn pinged(&mut self) {
        self.pongs_owed = (self.pongs_owed + 1).min(MAX_PONGS_OWED);
    }

    /// A Ping arrived.
    pub(super) fn ping(&mut self) -> Result<(), &'static str> {
        self.between.pings += 1;
        if self.between.pings > MAX_PINGS {
            return Err(Violation::PINGS);
        }
        Ok(())
    }

    /// A Pong arrived.
    pub(super) fn pong(&mut self) -> Result<(), &'static str> {
        if self.pongs_owed == 0 {
            return Err(Violation::PONG);
        }
        self.pongs_owed -= 1;
        Ok(())
    }

    /// A RingReturn arrived that freed `units` whole ring bodies and pieces of ours
    /// ([`super::RingProducer::on_freed`]). We keep at most [`super::ring_units`] of them unfreed
    /// ([`super::RingProducer::with_max_units`]), so a client that keeps this rule has at most
    /// that many RingReturns on their way.
    pub(super) fn ring_return(&mut self, units: u32) -> Result<(), &'static str> {
        if units == 0 {
            return Err(Violation::RING_RETURN);
        }
        Ok(())
    }

    /// A piece that is not the last of its message arrived.
    pub(super) fn piece(&mut self) -> Result<(), &'static str> {
        self.between.pieces += 1;
        if self.between.pieces > self.max_pieces {
            return Err(Violation::PIECES);
        }
        Ok(())
    }
}
