//! protox's errors → [`Error`], with the file found on disk and the line and column of the first
//! labelled span (protox carries them as miette diagnostics).

use std::path::{Path, PathBuf};

use miette::Diagnostic;

use crate::Error;

/// Converts a protox error, resolving its file name against `includes` so the path printed is one
/// the user can open.
pub fn from_protox(err: &protox::Error, includes: &[PathBuf]) -> Error {
    let reason = match err.help() {
        Some(help) => format!("{err} ({help})"),
        None => err.to_string(),
    };
    let position = err.source_code().and_then(|source| {
        let label = err.labels()?.next()?;
        let contents = source.read_span(label.inner(), 0, 0).ok()?;
        let name = contents.name().map(str::to_owned);
        Some((name, contents.line() + 1, contents.column() + 1))
    });
    match position {
        Some((name, line, column)) => {
            let name = name.or_else(|| err.file().map(str::to_owned)).unwrap_or_default();
            Error::Proto { path: on_disk(&name, includes), line, column, reason }
        }
        None => {
            // protox's Debug adds `file:line:col:` for the errors whose position is not a label
            // (descriptor checks); parse nothing, but keep its text when it is more precise.
            let debug = format!("{err:?}");
            match split_position(&debug) {
                Some((name, line, column, rest)) => {
                    Error::Proto { path: on_disk(name, includes), line, column, reason: rest.to_owned() }
                }
                None => Error::ProtoFile { file: err.file().map(str::to_owned), reason },
            }
        }
    }
}

/// `"name:line:col: reason"` → its parts, when the text has that shape.
fn split_position(text: &str) -> Option<(&str, usize, usize, &str)> {
    let (head, reason) = text.split_once(": ")?;
    let mut parts = head.rsplitn(3, ':');
    let column = parts.next()?.parse().ok()?;
    let line = parts.next()?.parse().ok()?;
    let name = parts.next()?;
    Some((name, line, column, reason))
}

/// The path of proto file `name` under the first include directory that has it; `name` itself when
/// none has (a file protox supplies, such as `google/protobuf/empty.proto`).
pub fn on_disk(name: &str, includes: &[PathBuf]) -> PathBuf {
    includes
        .iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| Path::new(name).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_position_parses_protox_debug_text() {
        assert_eq!(
            split_position("a/b.proto:3:17: unknown type"),
            Some(("a/b.proto", 3, 17, "unknown type"))
        );
        assert_eq!(split_position("file 'x' not found"), None);
    }
}
