//! The names of the methods a process's generated client stubs call, so that an UNIMPLEMENTED
//! from a server that does not serve a method names it (`method pkg.Service/Method (id 0x…) is
//! not served by this server`) instead of its id alone.
//!
//! The wire carries only the method id (FNV-1a 32 of the full name); the server answers an id
//! no service of its serves with `unknown method id 0x…` (it lists nothing of what it serves).
//! A generated stub registers its service's table once per process, when the first stub of the
//! service is made ([`register_method_names`]); the client looks a name up only on that error's
//! path, so a call that succeeds costs nothing more.

use std::sync::RwLock;

use crate::dispatch::service::{MethodDesc, MethodId};
use crate::status::{Code, Status};

/// Tables registered so far (one per generated service with a stub made).
static TABLES: RwLock<Vec<&'static [MethodDesc]>> = RwLock::new(Vec::new());

/// What the server's worker answers for a method id no service of its serves (the start of
/// its message).
const UNKNOWN_METHOD: &str = "unknown method id";

/// Registers the names of a service's methods for the client's errors (generated stubs call
/// it once per process and service; a table registered twice is kept once). Names are full
/// gRPC names, `/pkg.Service/Method`.
pub fn register_method_names(table: &'static [MethodDesc]) {
    let mut tables = TABLES.write().unwrap_or_else(|e| e.into_inner());
    if !tables.iter().any(|t| std::ptr::eq(*t, table)) {
        tables.push(table);
    }
}

/// The full name registered for `id`, without its leading `/`.
fn method_name(id: MethodId) -> Option<&'static str> {
    let tables = TABLES.read().unwrap_or_else(|e| e.into_inner());
    let name = tables.iter().flat_map(|t| t.iter()).find(|d| d.id == id)?.name;
    Some(name.strip_prefix('/').unwrap_or(name))
}

/// The status of an error answer with `code` and `text` to a call of `method`: an
/// UNIMPLEMENTED for an unknown method id names the method when a stub registered it; any
/// other answer is the server's as it came.
pub(crate) fn answer_status(code: Code, text: String, method: MethodId) -> Status {
    if code == Code::Unimplemented && text.starts_with(UNKNOWN_METHOD) {
        if let Some(name) = method_name(method) {
            return Status::new(code, format!("method {name} (id {method:#x}) is not served by this server"));
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
        let s = answer_status(Code::Unimplemented, "unknown method id 0x12345678".into(), 0x1234_5678);
        assert_eq!(s.message(), "method pkg.Svc/Known (id 0x12345678) is not served by this server");
        // Not registered: the server's text.
        let s = answer_status(Code::Unimplemented, "unknown method id 0x9".into(), 0x9);
        assert_eq!(s.message(), "unknown method id 0x9");
        // A handler's own UNIMPLEMENTED, and other codes, are left alone.
        let s = answer_status(Code::Unimplemented, "not yet".into(), 0x1234_5678);
        assert_eq!(s.message(), "not yet");
        let s = answer_status(Code::Internal, "unknown method id 0x12345678".into(), 0x1234_5678);
        assert_eq!(s.message(), "unknown method id 0x12345678");
    }
}
