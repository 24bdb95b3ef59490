//! OS error helpers: turning C return codes into [`VerbsError`] values that name the call.

use std::io;

use crate::verbs::VerbsError;

/// The error of a call that returned NULL or -1 and set `errno`.
pub(super) fn last_os(call: &'static str) -> VerbsError {
    VerbsError::Os { call, source: io::Error::last_os_error() }
}

/// The error of a call that returns an errno value directly (`ibv_modify_qp`, `ibv_post_send`,
/// ...). Some providers return `-1` and set `errno` instead; both are handled.
pub(super) fn from_rc(call: &'static str, rc: i32) -> VerbsError {
    VerbsError::Os { call, source: rc_error(rc) }
}

/// The [`io::Error`] behind a non-zero return code (see [`from_rc`]).
pub(super) fn rc_error(rc: i32) -> io::Error {
    if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else if rc == -1 {
        io::Error::last_os_error()
    } else {
        io::Error::from_raw_os_error(-rc)
    }
}
