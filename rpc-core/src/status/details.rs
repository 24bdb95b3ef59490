//! Rich error details, as `google.rpc.Status` carries them (what `tonic-types` offers).
//!
//! Hand-written prost messages with the field numbers of `google/rpc/status.proto` and
//! `google/rpc/error_details.proto`; `Any` and `Duration` are `prost_types`'. [`ErrorDetails`]
//! gathers the common detail types and converts to and from the encoded `google.rpc.Status`
//! (the bytes gRPC sends as the trailer `grpc-status-details-bin`).

pub use prost::DecodeError;
use prost::Message;
pub use prost_types::{Any, Duration};

/// Type URL prefix of every detail (`type.googleapis.com/`).
pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// `google.rpc.Status`: code, message and details (field numbers 1, 2, 3).
#[derive(Clone, PartialEq, Message)]
pub struct RpcStatus {
    /// The status code (a `google.rpc.Code` value).
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The developer-facing message.
    #[prost(string, tag = "2")]
    pub message: String,
    /// The details, each an `Any`.
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

/// `google.rpc.BadRequest.FieldViolation` (field 1, description 2).
#[derive(Clone, PartialEq, Message)]
pub struct FieldViolation {
    /// Path to the offending field (`a.b[2].c`).
    #[prost(string, tag = "1")]
    pub field: String,
    /// Why the value is bad.
    #[prost(string, tag = "2")]
    pub description: String,
}

/// `google.rpc.BadRequest` (field_violations 1).
#[derive(Clone, PartialEq, Message)]
pub struct BadRequest {
    /// Every violated field.
    #[prost(message, repeated, tag = "1")]
    pub field_violations: Vec<FieldViolation>,
}

/// `google.rpc.RetryInfo` (retry_delay 1).
#[derive(Clone, PartialEq, Message)]
pub struct RetryInfo {
    /// How long the client should wait before retrying.
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<Duration>,
}

/// `google.rpc.ErrorInfo` (reason 1, domain 2, metadata 3).
#[derive(Clone, PartialEq, Message)]
pub struct ErrorInfo {
    /// UPPER_SNAKE_CASE reason of the error.
    #[prost(string, tag = "1")]
    pub reason: String,
    /// The logical grouping the reason belongs to (a service name).
    #[prost(string, tag = "2")]
    pub domain: String,
    /// Further structured details.
    #[prost(btree_map = "string, string", tag = "3")]
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// A message with a `google.rpc` type URL.
pub trait IntoAny: Message + Default {
    /// The type's full name (`google.rpc.BadRequest`).
    const TYPE_NAME: &'static str;
    /// Packs the message into an `Any` with `type.googleapis.com/` + [`Self::TYPE_NAME`].
    fn to_any(&self) -> Any {
        Any { type_url: format!("{TYPE_URL_PREFIX}{}", Self::TYPE_NAME), value: self.encode_to_vec() }
    }
    /// Unpacks `any` if its type URL names this type; `Ok(None)` if it names another.
    fn from_any(any: &Any) -> Result<Option<Self>, DecodeError> {
        match any.type_url.strip_prefix(TYPE_URL_PREFIX) {
            Some(name) if name == Self::TYPE_NAME => Self::decode(any.value.as_slice()).map(Some),
            _ => Ok(None),
        }
    }
}

impl IntoAny for BadRequest {
    const TYPE_NAME: &'static str = "google.rpc.BadRequest";
}
impl IntoAny for RetryInfo {
    const TYPE_NAME: &'static str = "google.rpc.RetryInfo";
}
impl IntoAny for ErrorInfo {
    const TYPE_NAME: &'static str = "google.rpc.ErrorInfo";
}

/// The common detail types of an error, each at most once (as `tonic_types::ErrorDetails`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErrorDetails {
    /// `google.rpc.BadRequest`.
    pub bad_request: Option<BadRequest>,
    /// `google.rpc.RetryInfo`.
    pub retry_info: Option<RetryInfo>,
    /// `google.rpc.ErrorInfo`.
    pub error_info: Option<ErrorInfo>,
    /// Details of other types, kept as they came.
    pub other: Vec<Any>,
}

impl ErrorDetails {
    /// The details as `Any`s, in the order bad_request, retry_info, error_info, other.
    pub fn to_any(&self) -> Vec<Any> {
        let mut out = Vec::new();
        out.extend(self.bad_request.as_ref().map(IntoAny::to_any));
        out.extend(self.retry_info.as_ref().map(IntoAny::to_any));
        out.extend(self.error_info.as_ref().map(IntoAny::to_any));
        out.extend(self.other.iter().cloned());
        out
    }

    /// Sorts `details` into the known types; unknown type URLs go to `other`.
    ///
    /// # Errors
    /// A detail whose type URL names a known type but whose bytes do not decode as it.
    pub fn from_any(details: &[Any]) -> Result<ErrorDetails, DecodeError> {
        let mut out = ErrorDetails::default();
        for any in details {
            if let Some(m) = BadRequest::from_any(any)? {
                out.bad_request = Some(m);
            } else if let Some(m) = RetryInfo::from_any(any)? {
                out.retry_info = Some(m);
            } else if let Some(m) = ErrorInfo::from_any(any)? {
                out.error_info = Some(m);
            } else {
                out.other.push(any.clone());
            }
        }
        Ok(out)
    }

    /// Encodes a `google.rpc.Status` with `code`, `message` and these details: the bytes of
    /// `grpc-status-details-bin`.
    pub fn encode_status(&self, code: i32, message: &str) -> Vec<u8> {
        RpcStatus { code, message: message.to_owned(), details: self.to_any() }.encode_to_vec()
    }

    /// Decodes the bytes of `grpc-status-details-bin` (a `google.rpc.Status`) into its details.
    ///
    /// # Errors
    /// Bytes that are not a `google.rpc.Status`, or a known detail that does not decode.
    pub fn decode_status(bytes: &[u8]) -> Result<ErrorDetails, DecodeError> {
        let status = RpcStatus::decode(bytes)?;
        ErrorDetails::from_any(&status.details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_type_urls() {
        let d = ErrorDetails {
            bad_request: Some(BadRequest {
                field_violations: vec![FieldViolation { field: "name".into(), description: "empty".into() }],
            }),
            retry_info: Some(RetryInfo { retry_delay: Some(Duration { seconds: 2, nanos: 5 }) }),
            error_info: Some(ErrorInfo {
                reason: "QUOTA".into(),
                domain: "x.example".into(),
                metadata: [("k".to_owned(), "v".to_owned())].into(),
            }),
            other: vec![Any { type_url: "type.googleapis.com/foo.Bar".into(), value: vec![1, 2] }],
        };
        let anys = d.to_any();
        assert_eq!(anys[0].type_url, "type.googleapis.com/google.rpc.BadRequest");
        assert_eq!(anys[1].type_url, "type.googleapis.com/google.rpc.RetryInfo");
        assert_eq!(anys[2].type_url, "type.googleapis.com/google.rpc.ErrorInfo");
        let bytes = d.encode_status(3, "bad");
        assert_eq!(ErrorDetails::decode_status(&bytes).unwrap(), d);
    }

    #[test]
    fn field_numbers_match_error_details_proto() {
        // FieldViolation{field:"a", description:"b"}: tags 1 and 2, wire type 2 (0x0a, 0x12).
        let v = FieldViolation { field: "a".into(), description: "b".into() }.encode_to_vec();
        assert_eq!(v, [0x0a, 1, b'a', 0x12, 1, b'b']);
        // ErrorInfo{reason:"r", domain:"d"}: tags 1 and 2.
        let e = ErrorInfo { reason: "r".into(), domain: "d".into(), ..Default::default() }.encode_to_vec();
        assert_eq!(e, [0x0a, 1, b'r', 0x12, 1, b'd']);
        // RetryInfo{retry_delay:{seconds:1}}: tag 1 holding Duration tag 1 varint.
        let r = RetryInfo { retry_delay: Some(Duration { seconds: 1, nanos: 0 }) }.encode_to_vec();
        assert_eq!(r, [0x0a, 2, 0x08, 1]);
    }

    #[test]
    fn malformed_known_detail_is_an_error_not_a_panic() {
        let any = Any { type_url: "type.googleapis.com/google.rpc.BadRequest".into(), value: vec![0x0a, 9] };
        assert!(ErrorDetails::from_any(&[any]).is_err());
        assert!(ErrorDetails::decode_status(&[0xff, 0xff]).is_err());
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;
    use crate::status::{Code, Status};

    #[test]
    fn status_with_error_details_round_trips() {
        let d = ErrorDetails {
            retry_info: Some(RetryInfo { retry_delay: Some(Duration { seconds: 1, nanos: 0 }) }),
            ..Default::default()
        };
        let s = Status::with_error_details(Code::Unavailable, "busy", d.clone());
        assert!(!s.details().is_empty());
        assert_eq!(s.error_details().unwrap(), d);
        assert!(Status::unavailable("x").details().is_empty());
        assert_eq!(Status::unavailable("x").error_details().unwrap(), ErrorDetails::default());
    }
}
