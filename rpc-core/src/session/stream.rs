//! Streams, sans-IO: per-stream grants in both directions, the clean end of the client's
//! messages, and the budget that bounds what one end holds (see the wire module docs for the
//! messages).
//!
//! A stream is a call whose slot stays open until its response. Each end is the *consumer* of the
//! messages its peer sends: it grants them (stream grants, one per stream SEND) and counts what it granted and
//! what it holds (received, not yet taken by its application). A stream never has more than
//! `cap` messages granted or held, and all streams of a session together never more than
//! `budget`: that is what bounds the consumer's memory (at most `budget` messages of at most
//! `max_message_size` each) and the receive WQEs its messages take, whatever the producer's speed.
//! Grants return only as the application takes messages, so a consumer that stops reading stalls
//! its producer at the grant limit. A grant is one stream SEND: one message, or a batch of small
//! ones in one eager buffer ([`crate::wire::STREAM_BATCH`]), so the bound holds in receive WQEs
//! and buffers whatever the batching. Grants come ahead, as a window: a stream is refilled once
//! half of `cap` is free (one StreamGrant per half window, never per message), so a producer
//! whose consumer keeps up never waits a round trip; and a grant never takes the last budget an open
//! stream with nothing granted needs for its first message, so one stopped consumer cannot starve
//! the other streams of the session beyond `cap` each.

use crate::wire::{Header, Kind};

/// One open stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stream {
    pub(super) slot: u16,
    pub(super) generation: u32,
    /// The peer sends messages on it (we grant them).
    pub(super) receives: bool,
    /// We send messages on it.
    pub(super) sends: bool,
    /// Messages we may still send (granted by the peer).
    pub(super) send_grants: u32,
    /// Messages we granted that have not arrived.
    pub(super) granted: u32,
    /// Messages received and not yet taken by the application.
    pub(super) held: u32,
    /// The peer's messages ended (its StreamEnd; for the client, the response).
    pub(super) peer_ended: bool,
    /// Our messages ended (client: StreamEnd queued).
    pub(super) ended: bool,
}

/// What a session knows of its streams.
#[derive(Debug)]
pub(super) struct Streams {
    /// Messages granted or held across streams, at most.
    pub(super) budget: u32,
    /// Messages granted or held per stream, at most.
    pub(super) cap: u32,
    /// Messages granted or held now.
    pub(super) used: u32,
    pub(super) list: Vec<Stream>,
}

/// Why a stream operation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// No open stream of that slot and generation (it ended, or never was).
    NoStream,
    /// This end does not send messages on the stream (its shape), or ended its messages.
    NotSending,
}

impl Streams {
    pub(super) fn new(budget: u32) -> Streams {
        let budget = budget.max(1);
        Streams { budget, cap: (budget / 2).max(1), used: 0, list: Vec::new() }
    }

    pub(super) fn find(&self, slot: u16, generation: u32) -> Option<usize> {
        self.list.iter().position(|s| (s.slot, s.generation) == (slot, generation))
    }

    /// Opens a stream; returns its index.
    pub(super) fn open(
        &mut self,
        slot: u16,
        generation: u32,
        receives: bool,
        sends: bool,
        grants: u32,
    ) -> usize {
        if let Some(i) = self.find(slot, generation) {
            return i;
        }
        self.list.push(Stream {
            slot,
            generation,
            receives,
            sends,
            send_grants: grants,
            granted: 0,
            held: 0,
            peer_ended: false,
            ended: false,
        });
        self.list.len() - 1
    }

    /// Grants due to stream `i` now (counted as granted), 0 when none are due: the stream
    /// receives, its peer has not ended, and at least half of `cap` is free for it (the window
    /// is refilled when half consumed); never the budget that other open streams with nothing granted need.
    pub(super) fn grant(&mut self, i: usize) -> u32 {
        let s = self.list[i];
        if !s.receives || s.peer_ended {
            return 0;
        }
        let usage = s.granted + s.held;
        let want = self.cap.saturating_sub(usage);
        if want < (self.cap / 2).max(1) {
            return 0;
        }
        let starving = self
            .list
            .iter()
            .enumerate()
            .filter(|&(j, o)| j != i && o.receives && !o.peer_ended && o.granted + o.held == 0)
            .count() as u32;
        let free = self.budget.saturating_sub(self.used).saturating_sub(starving);
        let g = want.min(free).min(u32::from(u16::MAX));
        self.list[i].granted += g;
        self.used += g;
        g
    }

    /// Removes stream `i`, returning its budget; returns the grants that became due for the other
    /// streams, as control headers.
    pub(super) fn close(&mut self, i: usize, out: &mut impl FnMut(Header)) {
        let s = self.list.swap_remove(i);
        self.used = self.used.saturating_sub(s.granted + s.held);
        self.regrant(out);
    }

    /// Grants what is due to every stream (after budget returned).
    pub(super) fn regrant(&mut self, out: &mut impl FnMut(Header)) {
        for j in 0..self.list.len() {
            let g = self.grant(j);
            if g > 0 {
                out(grant_header(&self.list[j], g));
            }
        }
    }
}

/// The StreamGrant header granting `g` messages of `s`.
pub(super) fn grant_header(s: &Stream, g: u32) -> Header {
    Header {
        slot: s.slot,
        generation: s.generation,
        count: g.min(u32::from(u16::MAX)) as u16,
        ..Header::new(Kind::StreamGrant)
    }
}

/// Credits beyond the session's `credits` that only a client's stream SENDs use, so that a stream
/// moves while every request credit is taken (by calls, or by the stream calls themselves).
/// Part of every session's SRQ reservation ([`super::srq_need`]), so it stays small: at the
/// default 128 sessions of 32 credits the reservations of one worker fill sim's 16 384 WQEs.
pub const STREAM_RESERVED_CREDITS: u16 = 8;

/// The request credits a client's stream SENDs (stream messages, stream grants, stream ends)
/// hold (see the wire module docs): the client counts what it sent and what the server's
/// `stream_taken` gave back; the server counts what it took and what its headers reported.
/// Requests and stream SENDs the server has not taken stay at most
/// `credits + STREAM_RESERVED_CREDITS`, what the server's SRQ reserves for them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StreamSends {
    /// Client: stream SENDs sent and not yet counted taken by the server.
    pub(super) unreturned: u32,
    /// Client: the latest `stream_taken` seen.
    pub(super) seen: u32,
    /// Server: stream SENDs taken (wrapping).
    pub(super) taken: u32,
    /// Server: `taken` as the last stamped header carried it.
    pub(super) reported: u32,
    /// Server: the client's credits may all be held (see [`StreamSends::full`]) since a
    /// RingReturn was last considered.
    pub(super) due: bool,
}

impl StreamSends {
    /// Client: whether a stream SEND may go now, with `in_flight` requests holding credits, `queued`
    /// calls waiting for one and `credits` request credits (`pool`: `credits` of the session plus
    /// [`STREAM_RESERVED_CREDITS`]): stream SENDs never take a credit a waiting call could use.
    pub(super) fn may_send(&self, in_flight: u16, queued: usize, credits: u16, pool: u32) -> bool {
        let waiting = (queued.min(usize::from(credits.saturating_sub(in_flight)))) as u32;
        u32::from(in_flight) + self.unreturned + waiting < pool
    }

    /// Client: applies the server's `stream_taken`. A count behind the latest seen (a header
    /// stamped before it) changes nothing.
    ///
    /// # Errors
    /// When it returns more than was sent.
    pub(super) fn on_taken(&mut self, stream_taken: u32) -> Result<(), &'static str> {
        let delta = stream_taken.wrapping_sub(self.seen);
        if delta == 0 || delta > i32::MAX as u32 {
            return Ok(());
        }
        if delta > self.unreturned {
            return Err("stream SENDs counted taken beyond those sent");
        }
        self.unreturned -= delta;
        self.seen = stream_taken;
        Ok(())
    }

    /// Server: stream SENDs taken and not yet reported to the client.
    pub(super) fn unreported(&self) -> u32 {
        self.taken.wrapping_sub(self.reported)
    }

    /// Server: the client's stream SEND arrived, with `unanswered` requests holding credits.
    ///
    /// # Errors
    /// When the client sent it beyond `pool` (a client keeping the rule holds a credit for each
    /// SEND not yet reported, and for each unanswered request).
    pub(super) fn take(&mut self, unanswered: usize, pool: u32) -> Result<(), &'static str> {
        let unreported = self.unreported();
        if unanswered as u64 + u64::from(unreported) + 1 > u64::from(pool) {
            return Err("stream SENDs beyond the session's credits");
        }
        self.taken = self.taken.wrapping_add(1);
        self.note(unanswered, pool);
        Ok(())
    }

    /// Server: whether every credit of the client may be held, by `unanswered` requests and the
    /// stream SENDs taken and unreported: only then can the client be waiting for the count
    /// (a client that waits has sent requests and stream SENDs up to `pool`, and what the server
    /// took of them and did not answer is all it holds), so only then is a RingReturn of its own
    /// worth it.
    pub(super) fn full(&self, unanswered: usize, pool: u32) -> bool {
        let unreported = self.unreported();
        unreported > 0 && unanswered as u64 + u64::from(unreported) >= u64::from(pool)
    }

    /// Server: sets `due` when [`StreamSends::full`] (after a request or a stream SEND arrived).
    pub(super) fn note(&mut self, unanswered: usize, pool: u32) {
        if self.full(unanswered, pool) {
            self.due = true;
        }
    }
}
