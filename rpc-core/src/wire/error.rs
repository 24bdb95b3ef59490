//! Decode errors of the wire layer.

/// Why a header or handshake could not be decoded or was refused. Always names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the field needs.
    #[error("truncated {what}: field `{field}` needs {need} bytes, {have} available")]
    Truncated {
        /// "header", "handshake", ...
        what: &'static str,
        /// The field being read.
        field: &'static str,
        /// Bytes needed up to and including the field.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A field holds a value outside its valid range.
    #[error("invalid {what} field `{field}`: {reason}")]
    BadField {
        /// "header", "handshake", ...
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Why (with the value found and what was expected).
        reason: String,
    },
}

impl WireError {
    pub(crate) fn bad(what: &'static str, field: &'static str, reason: impl Into<String>) -> WireError {
        WireError::BadField { what, field, reason: reason.into() }
    }

    /// The field the error names.
    pub fn field(&self) -> &'static str {
        match self {
            WireError::Truncated { field, .. } | WireError::BadField { field, .. } => field,
        }
    }
}
