//! Per-connection protocol state, sans-IO: credits, call slots with generations, the producer
//! state of the peer's ring and the consumer state of our own. No verbs and no clock: inputs are
//! received headers (`handle_header`) and body sizes (`place_body`); outputs are placements and
//! header fields to send.

mod ring;
mod slots;

pub use ring::{RingConsumer, RingProducer, RingReserveError, RingToken};
pub use slots::{CallSlots, ResponseFate, SlotState};

use crate::status::Status;
use crate::wire::{Header, Kind};

/// Which end of the connection this session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sends requests, receives responses.
    Client,
    /// Receives requests, sends responses.
    Server,
}

/// Limits both ends agreed on at handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionParams {
    /// Session id assigned by the server.
    pub id: u32,
    /// Requests allowed in flight.
    pub credits: u16,
    /// Bodies up to this many bytes travel in the SEND; larger ones through the peer's ring.
    pub eager_threshold: u32,
    /// Largest body in bytes either side may send.
    pub max_message: u32,
    /// Length of the peer's ring in bytes.
    pub peer_ring_len: u32,
    /// Length of our own ring in bytes.
    pub own_ring_len: u32,
    /// Most ring bodies held unreleased at once (the slot window on a client, credits on a server).
    pub max_held: usize,
}

/// Where an outgoing body goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// After the header in the SEND.
    Eager,
    /// In the peer's ring at this offset (RDMA WRITE before the header SEND).
    Ring(u32),
}

/// Why a body cannot be sent now.
#[derive(Debug, PartialEq, Eq)]
pub enum PlaceError {
    /// Never (too large): RESOURCE_EXHAUSTED naming the limit.
    Refused(Status),
    /// Not now: the peer's ring is full until it frees (a ring-full stall).
    RingFull,
}

/// A received message the session accepted.
#[derive(Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The header.
    pub header: Header,
    /// For a body in our ring: its token, to release when the body is no longer read.
    pub ring: Option<RingToken>,
}

/// Protocol state of one connection.
#[derive(Debug)]
pub struct Session {
    role: Role,
    params: SessionParams,
    producer: RingProducer,
    consumer: RingConsumer,
    /// Server: requests received and not yet answered, as (slot, generation); at most `credits`
    /// entries (allocated once). An answer for a call not listed here is a duplicate.
    unanswered: Vec<(u16, u32)>,
    closed: bool,
}

impl Session {
    /// A fresh session.
    pub fn new(role: Role, params: SessionParams) -> Session {
        Session {
            role,
            params,
            producer: RingProducer::new(params.peer_ring_len),
            consumer: RingConsumer::new(params.own_ring_len, params.max_held.max(1)),
            unanswered: match role {
                Role::Server => Vec::with_capacity(usize::from(params.credits)),
                Role::Client => Vec::new(),
            },
            closed: false,
        }
    }

    /// The agreed parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// This end's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Server: requests received and not yet answered.
    pub fn unanswered(&self) -> u16 {
        self.unanswered.len() as u16
    }

    /// Server: whether the request `(slot, generation)` was received and not yet answered.
    pub fn is_unanswered(&self, slot: u16, generation: u32) -> bool {
        self.unanswered.contains(&(slot, generation))
    }

    /// True once a Close was received or sent.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Marks the session closed (a Close is being sent, or the connection failed).
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Chooses where a body of `len` bytes goes and reserves ring space for it.
    ///
    /// # Errors
    /// [`PlaceError::Refused`] (RESOURCE_EXHAUSTED naming `max_message` or the ring length) when it
    /// can never be sent; [`PlaceError::RingFull`] when it must wait for ring space.
    #[inline]
    pub fn place_body(&mut self, len: usize) -> Result<Placement, PlaceError> {
        if len > self.params.max_message as usize {
            return Err(PlaceError::Refused(Status::resource_exhausted(format!(
                "message of {len} bytes exceeds max_message_size of {} bytes",
                self.params.max_message
            ))));
        }
        if len <= self.params.eager_threshold as usize {
            return Ok(Placement::Eager);
        }
        match self.producer.reserve(len as u32) {
            Ok(off) => Ok(Placement::Ring(off)),
            Err(RingReserveError::Full) => Err(PlaceError::RingFull),
            Err(RingReserveError::TooLarge { len, ring_len }) => {
                Err(PlaceError::Refused(Status::resource_exhausted(format!(
                    "message of {len} bytes exceeds the peer's ring of {ring_len} bytes (ring_bytes)"
                ))))
            }
        }
    }

    /// Fills the session id and the freed head of our ring into an outgoing header.
    #[inline]
    pub fn stamp(&mut self, h: &mut Header) {
        h.session = self.params.id;
        h.freed_head = self.consumer.take_freed();
    }

    /// Server: a response is being sent for one request, the oldest unanswered (returns its
    /// credit). The runtime names the call with [`Session::on_answer_for`], which also refuses a
    /// second answer.
    pub fn on_answer(&mut self) {
        if !self.unanswered.is_empty() {
            self.unanswered.remove(0);
        }
    }

    /// Server: a response is being sent for the request `(slot, generation)` (returns its
    /// credit). Returns false, changing nothing, when that request is not waiting for an answer
    /// (a second answer to one call, e.g. a deferred one after the handler also answered or
    /// panicked): such an answer must not be sent.
    pub fn on_answer_for(&mut self, slot: u16, generation: u32) -> bool {
        match self.unanswered.iter().position(|&c| c == (slot, generation)) {
            Some(i) => {
                self.unanswered.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Bytes of our ring freed since a header last told the peer.
    pub fn unreported_ring_bytes(&self) -> u32 {
        self.consumer.unreported()
    }

    /// Releases a ring body (frees it, in order).
    pub fn release(&mut self, token: RingToken) {
        self.consumer.release(token);
    }

    /// Validates a decoded header against the session state and applies its piggy-backed freed
    /// head.
    ///
    /// # Errors
    /// A reason when the peer broke the protocol (wrong session id, wrong direction, more requests
    /// than credits, a ring body out of place, a freed head out of range): close the connection.
    #[inline]
    pub fn handle_header(&mut self, h: &Header) -> Result<Incoming, &'static str> {
        if h.session != self.params.id {
            return Err("header for another session");
        }
        match (self.role, h.kind) {
            (Role::Server, Kind::Request) => {
                if self.unanswered.len() >= usize::from(self.params.credits) {
                    return Err("request beyond the granted credits");
                }
            }
            (Role::Client, Kind::Response) | (_, Kind::CreditReturn) | (_, Kind::Close) => {}
            (Role::Server, Kind::Response) => return Err("response sent to a server"),
            (Role::Client, Kind::Request) => return Err("request sent to a client"),
        }
        if h.body_len > self.params.max_message && h.kind == Kind::Request {
            return Err("body larger than max_message_size");
        }
        self.producer.on_freed(h.freed_head).map_err(|()| "freed head outside the ring's used range")?;
        let ring = if h.in_ring {
            if h.body_len <= self.params.eager_threshold {
                return Err("ring body at or below the eager threshold");
            }
            Some(self.consumer.accept(h.ring_offset, h.body_len)?)
        } else {
            None
        };
        match h.kind {
            Kind::Request => self.unanswered.push((h.slot, h.generation)),
            Kind::Close => self.closed = true,
            _ => {}
        }
        Ok(Incoming { header: *h, ring })
    }
}

#[cfg(test)]
mod tests;
