//! RPC status: gRPC's canonical codes with a message, as in tonic's `Status`.
//!
//! Every failed call ends in a [`Status`]; `Code::Ok` never appears in an `Err`.

use std::fmt;

pub mod details;

/// gRPC canonical status codes (`google.rpc.Code`), same numeric values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The call was cancelled (e.g. a deferred answer was dropped unsent).
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The client sent something the server cannot accept (e.g. an undecodable body).
    InvalidArgument = 3,
    /// The deadline passed before the call completed.
    DeadlineExceeded = 4,
    /// A requested entity was not found.
    NotFound = 5,
    /// The entity a client tried to create already exists.
    AlreadyExists = 6,
    /// The caller may not do this.
    PermissionDenied = 7,
    /// A limit was hit (message larger than the ring, window full, ...); the message names it.
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted (concurrency conflict).
    Aborted = 10,
    /// Out of the valid range.
    OutOfRange = 11,
    /// The method is not implemented by the server.
    Unimplemented = 12,
    /// An invariant broke (e.g. a handler panicked).
    Internal = 13,
    /// The peer or the connection is gone; retrying on a new connection may succeed.
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// Missing or invalid authentication.
    Unauthenticated = 16,
}

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// From the numeric value (0..=16); `None` otherwise.
    pub fn from_u8(v: u8) -> Option<Code> {
        Code::ALL.get(v as usize).copied()
    }

    /// From an `i32` as gRPC carries it; values outside 0..=16 map to [`Code::Unknown`].
    pub fn from_i32(v: i32) -> Code {
        u8::try_from(v).ok().and_then(Code::from_u8).unwrap_or(Code::Unknown)
    }

    /// The canonical upper-case name, e.g. `"UNAVAILABLE"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The phrase of every UNIMPLEMENTED for a method nothing on the server serves
/// ([`Status::method_not_served`]); tools tell the two cases apart by it.
pub const NOT_SERVED: &str = "is not served by this server";

/// The phrase of every UNIMPLEMENTED for a method a served service leaves to its default handler
/// ([`Status::method_not_implemented`]).
pub const NOT_IMPLEMENTED: &str = "is not implemented by this server";

/// The outcome of a failed RPC: a [`Code`], a human-readable message and, as in tonic's
/// `Status`, optional details bytes (an encoded `google.rpc.Status`, see [`details`]) and
/// metadata (on the server: trailers sent with the error; on the client: the error response's
/// headers and trailers).
///
/// On the wire a status with details or metadata travels as the error response's trailers (the
/// details as the binary trailer [`DETAILS_KEY`], as gRPC sends them), within the receiving
/// client's `ClientConfig::max_metadata_bytes`; a plain status carries no block.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Status {
    code: Code,
    message: String,
    /// Details and metadata; `None` for a plain status, so that one costs a null pointer.
    extra: Option<Box<Extra>>,
}

/// What a [`Status`] carries besides its code and message.
#[derive(Clone, Default, PartialEq, Eq)]
struct Extra {
    details: Vec<u8>,
    metadata: crate::metadata::Metadata,
}

/// The trailer that carries a status's details on the wire: gRPC's `grpc-status-details-bin`
/// (an encoded `google.rpc.Status`).
pub const DETAILS_KEY: &str = "grpc-status-details-bin";

impl fmt::Debug for Status {
    /// `{:?}`: the `Display` text (`UNAVAILABLE: connect: ...`), so that `fn main() -> Result<(),
    /// Status>` (or `Box<dyn Error>`) and `unwrap()` read well, as `anyhow` reports errors;
    /// `{:#?}`: the fields.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f
                .debug_struct("Status")
                .field("code", &self.code)
                .field("message", &self.message)
                .field("details", &self.details().len())
                .field("metadata", self.metadata())
                .finish();
        }
        crate::report::write_report(self, f)
    }
}

macro_rules! ctor {
    ($($(#[$m:meta])* $name:ident => $code:ident;)*) => {
        $(
            $(#[$m])*
            pub fn $name(message: impl Into<String>) -> Status {
                Status::new(Code::$code, message)
            }
        )*
    };
}

impl Status {
    /// A status with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status { code, message: message.into(), extra: None }
    }

    ctor! {
        /// [`Code::Ok`] (only for completeness; successful calls return `Ok`).
        ok => Ok;
        /// [`Code::Cancelled`].
        cancelled => Cancelled;
        /// [`Code::Unknown`].
        unknown => Unknown;
        /// [`Code::InvalidArgument`].
        invalid_argument => InvalidArgument;
        /// [`Code::DeadlineExceeded`].
        deadline_exceeded => DeadlineExceeded;
        /// [`Code::NotFound`].
        not_found => NotFound;
        /// [`Code::AlreadyExists`].
        already_exists => AlreadyExists;
        /// [`Code::PermissionDenied`].
        permission_denied => PermissionDenied;
        /// [`Code::ResourceExhausted`].
        resource_exhausted => ResourceExhausted;
        /// [`Code::FailedPrecondition`].
        failed_precondition => FailedPrecondition;
        /// [`Code::Aborted`].
        aborted => Aborted;
        /// [`Code::OutOfRange`].
        out_of_range => OutOfRange;
        /// [`Code::Unimplemented`].
        unimplemented => Unimplemented;
        /// [`Code::Internal`].
        internal => Internal;
        /// [`Code::Unavailable`].
        unavailable => Unavailable;
        /// [`Code::DataLoss`].
        data_loss => DataLoss;
        /// [`Code::Unauthenticated`].
        unauthenticated => Unauthenticated;
    }

    /// [`Code::Unimplemented`] for a method id no service of this server serves (what the worker
    /// answers): `method id 0x88a5acce is not served by this server`. The server names only the
    /// id (it lists nothing of what it serves); a client whose generated stub knows the method
    /// puts its name in: `method /pkg.Service/Method (id 0x88a5acce) is not served by this server`.
    ///
    /// One family with [`Status::method_not_served_by`] and [`Status::method_not_implemented`]:
    /// `method ... is not served` (nothing serves it: the wrong server, or a service not added),
    /// `method ... is not implemented` (the service is served, the method left to its default).
    pub fn method_not_served(method: u32) -> Status {
        Status::unimplemented(format!("method id {method:#010x} {NOT_SERVED}"))
    }

    /// [`Code::Unimplemented`] for a method id a service's adapter does not know (what a generated
    /// adapter answers for an id outside its table):
    /// `method id 0x12345678 is not served by this server (service pkg.Service has no such method)`.
    pub fn method_not_served_by(method: u32, service: &str) -> Status {
        Status::unimplemented(format!(
            "method id {method:#010x} {NOT_SERVED} (service {service} has no such method)"
        ))
    }

    /// [`Code::Unimplemented`] for a method that a served service declares but its implementation
    /// leaves to the generated default handler (`generate_default_stubs`); `full_name` is
    /// `/pkg.Service/Method`:
    /// `method /pkg.Service/Method is not implemented by this server (its handler is the generated default)`.
    pub fn method_not_implemented(full_name: &str) -> Status {
        Status::unimplemented(format!(
            "method {full_name} {NOT_IMPLEMENTED} (its handler is the generated default)"
        ))
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A status with `code`, `message` and opaque `details` bytes (an encoded `google.rpc.Status`,
    /// as tonic's `Status::with_details`).
    pub fn with_details(code: Code, message: impl Into<String>, details: impl Into<Vec<u8>>) -> Status {
        let details: Vec<u8> = details.into();
        let extra = (!details.is_empty())
            .then(|| Box::new(Extra { details, metadata: crate::metadata::Metadata::new() }));
        Status { code, message: message.into(), extra }
    }

    /// The details bytes (an encoded `google.rpc.Status`); empty if none were set.
    pub fn details(&self) -> &[u8] {
        self.extra.as_ref().map_or(&[], |e| &e.details)
    }

    /// The status's metadata: on the server, the trailers its error response carries; on the
    /// client, the headers and trailers the error response came with (headers first; the
    /// details trailer [`DETAILS_KEY`] is read into [`Status::details`], not kept here).
    pub fn metadata(&self) -> &crate::metadata::Metadata {
        static EMPTY: crate::metadata::Metadata = crate::metadata::Metadata::EMPTY;
        self.extra.as_ref().map_or(&EMPTY, |e| &e.metadata)
    }

    /// The metadata, to add trailers to (a handler's error: they travel with it).
    pub fn metadata_mut(&mut self) -> &mut crate::metadata::Metadata {
        &mut self.extra.get_or_insert_with(Box::default).metadata
    }

    /// True when the status carries details or metadata (its error response carries a block).
    pub(crate) fn has_extra(&self) -> bool {
        self.extra.as_ref().is_some_and(|e| !e.details.is_empty() || !e.metadata.is_empty())
    }

    /// Sets the details bytes (the client, from the response's [`DETAILS_KEY`] trailer).
    pub(crate) fn set_details(&mut self, details: Vec<u8>) {
        self.extra.get_or_insert_with(Box::default).details = details;
    }

    /// A status whose details are `details` encoded as a `google.rpc.Status` with this code and
    /// message (as `tonic_types::StatusExt::with_error_details`).
    pub fn with_error_details(
        code: Code,
        message: impl Into<String>,
        details: details::ErrorDetails,
    ) -> Status {
        let message = message.into();
        let bytes = details.encode_status(code as i32, &message);
        Status::with_details(code, message, bytes)
    }

    /// The common detail types carried in [`Status::details`]; empty details give an empty
    /// [`details::ErrorDetails`].
    ///
    /// # Errors
    /// The details bytes are not a `google.rpc.Status`, or a known detail does not decode.
    pub fn error_details(&self) -> Result<details::ErrorDetails, details::DecodeError> {
        details::ErrorDetails::decode_status(self.details())
    }
}

impl From<crate::verbs::VerbsError> for Status {
    /// A verbs failure seen by an RPC: the connection is not usable, so [`Code::Unavailable`].
    fn from(e: crate::verbs::VerbsError) -> Status {
        Status::unavailable(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_numbers_and_names() {
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(Code::from_u8(i as u8), Some(*c));
            assert_eq!(Code::from_i32(i as i32), *c);
        }
        assert_eq!(Code::from_u8(17), None);
        assert_eq!(Code::from_i32(-1), Code::Unknown);
        assert_eq!(Code::ResourceExhausted.to_string(), "RESOURCE_EXHAUSTED");
    }

    #[test]
    fn status_displays_code_and_message() {
        let s = Status::unavailable("peer gone");
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.message(), "peer gone");
        assert_eq!(s.to_string(), "UNAVAILABLE: peer gone");
        assert_eq!(Status::new(Code::Internal, "x"), Status::internal("x"));
    }

    #[test]
    fn unimplemented_texts_are_one_family() {
        let s = Status::method_not_served(0x88a5_acce);
        assert_eq!(s.code(), Code::Unimplemented);
        assert_eq!(s.message(), "method id 0x88a5acce is not served by this server");
        let s = Status::method_not_served(0x9);
        assert_eq!(s.message(), "method id 0x00000009 is not served by this server");
        let s = Status::method_not_served_by(0x1234_5678, "pkg.Svc");
        assert_eq!(s.code(), Code::Unimplemented);
        assert_eq!(
            s.message(),
            "method id 0x12345678 is not served by this server (service pkg.Svc has no such method)"
        );
        let s = Status::method_not_implemented("/pkg.Svc/M");
        assert_eq!(s.code(), Code::Unimplemented);
        assert_eq!(
            s.message(),
            "method /pkg.Svc/M is not implemented by this server (its handler is the generated default)"
        );
    }
}
