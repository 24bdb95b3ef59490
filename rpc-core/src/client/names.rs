//! The names of the methods a process's generated client stubs call, so that an UNIMPLEMENTED
//! from a server that does not serve a method names it (`method /pkg.Service/Method (id 0x…) is
//! not served by this server`) instead of its id alone.
//!
//! The wire carries only the method id (FNV-1a 32 of the full name); the server answers an id
//! no service of its serves with `method id 0x… is not served by this server`
//! ([`Status::method_not_served`]; it lists nothing of what it serves). A generated stub
//! registers its service's table once per process, when the first stub of the service is made
//! ([`register_method_names`]); the client looks a name up only on that error's path, so a call
//! that succeeds costs nothing more.

use std::sync::RwLock;

use crate::dispatch::service::{MethodDesc, MethodId};
use crate::status::{Code, Status};

/// Tables registered so far (one per generated service with a stub made).
static TABLES: RwLock<Vec<&'static [MethodDesc]>> = RwLock::new(Vec::new());

/// Registers the names of a service's methods for the client's errors (generated stubs call
/// it once per process and service; a table registered twice is kept once). Names are full
/// gRPC names, `/pkg.Service/Method`.
pub fn register_method_names(table: &'static [MethodDesc]) {
    let mut tables = TABLES.write().unwrap_or_else(|e| e.into_inner());
    if !tables.iter().any(|t| std::ptr::eq(*t, table)) {
        tables.push(table);
    }
}

/// The full name registered for `id` (`/pkg.Service/Method`).
pub(crate) fn method_name(id: MethodId) -> Option<&'static str> {
    let tables = TABLES.read().unwrap_or_else(|e| e.into_inner());
    Some(tables.iter().flat_map(|t| t.iter()).find(|d| d.id == id)?.name)
}

/// The status of an error answer with `code` and `text` to a call of `method`: an
/// UNIMPLEMENTED that names this call's method by its id alone (`method id 0x… is not served
/// ...`, [`Status::method_not_served`] and [`Status::method_not_served_by`]) names it by its
/// full name when a stub registered it; any other answer is the server's as it came.
pub(crate) fn answer_status(code: Code, text: String, method: MethodId) -> Status {
    if code == Code::Unimplemented {
        let by_id = format!("method id {method:#010x} ");
        if let (Some(rest), Some(name)) = (text.strip_prefix(&by_id), method_name(method)) {
            return Status::new(code, format!("method {name} (id {method:#010x}) {rest}"));
        }
    }
    Status::new(code, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    static TABLE: &[MethodDesc] = &[MethodDesc { id: 0x1234_5678, name: "/pkg.Svc/Known" }];

    #[test]
    fn an_unknown_method_answer_names_a_registered_method_and_nothing_else_changes() {
        register_method_names(TABLE);
        register_method_names(TABLE);
        let served = |id| Status::method_not_served(id).message().to_owned();
        let s = answer_status(Code::Unimplemented, served(0x1234_5678), 0x1234_5678);
        assert_eq!(s.code(), Code::Unimplemented);
        assert_eq!(s.message(), "method /pkg.Svc/Known (id 0x12345678) is not served by this server");
        // The adapter's answer keeps its service part.
        let by = Status::method_not_served_by(0x1234_5678, "pkg.Svc").message().to_owned();
        let s = answer_status(Code::Unimplemented, by, 0x1234_5678);
        assert_eq!(
            s.message(),
            "method /pkg.Svc/Known (id 0x12345678) is not served by this server (service pkg.Svc has no \
             such method)"
        );
        // Not registered: the server's text.
        let s = answer_status(Code::Unimplemented, served(0x9), 0x9);
        assert_eq!(s.message(), "method id 0x00000009 is not served by this server");
        // Another id than this call's, a handler's own UNIMPLEMENTED, and other codes, are left alone.
        let s = answer_status(Code::Unimplemented, served(0x9), 0x1234_5678);
        assert_eq!(s.message(), "method id 0x00000009 is not served by this server");
        let s = answer_status(Code::Unimplemented, "not yet".into(), 0x1234_5678);
        assert_eq!(s.message(), "not yet");
        let s = answer_status(Code::Internal, served(0x1234_5678), 0x1234_5678);
        assert_eq!(s.message(), "method id 0x12345678 is not served by this server");
    }
}
