//! What one core owns on one device, used by server workers and the client alike (so neither
//! imports the other): the verbs resources of each connection ([`conn::Conn`]: QP, send buffers,
//! rings, send queue with doorbell batching, and its sans-IO session), its send mirror and
//! staging area registered on demand ([`areas::SendAreas`]), and the counters of the polling
//! thread.

pub(crate) mod areas;
pub(crate) mod conn;
pub(crate) mod counters;
pub(crate) mod nic;
pub(crate) mod rx;
