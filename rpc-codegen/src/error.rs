//! What can go wrong while generating code. Every variant's message is meant to be read in cargo's
//! output when a build script fails: `Debug` prints the same text as `Display`, so
//! `fn main() -> Result<(), Box<dyn std::error::Error>>` in a `build.rs` shows it as is.

use std::fmt;
use std::path::PathBuf;

/// An error from [`compile_protos`](crate::compile_protos) or
/// [`Builder::compile_protos`](crate::Builder::compile_protos).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `.proto` file is invalid at a known place: a syntax error, an unknown type, a duplicate
    /// name, a shape prost-build would refuse, a module collision with no safe rename. `line`
    /// and `column` count from 1.
    #[error("{}:{line}:{column}: {reason}", path.display())]
    Proto {
        /// The file, as found through the include paths (or its import name when not on disk).
        path: PathBuf,
        /// Line, from 1.
        line: usize,
        /// Column, from 1 (bytes).
        column: usize,
        /// What is wrong, as protox says it (plus its hint, if it has one).
        reason: String,
    },
    /// Imports that are not found, every one of the build (not only the first): one line each,
    /// `file:line:col: import 'name' not found`, in the order the files were read.
    #[error("{}", imports.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    MissingImports {
        /// The import statements, with their importing files.
        imports: Vec<crate::MissingImport>,
    },
    /// A `.proto` file could not be used and the problem has no position: a file to compile that
    /// does not exist or is outside every include path, an import cycle, an unreadable file.
    #[error("{}{reason}", file.as_ref().map(|f| format!("{f}: ")).unwrap_or_default())]
    ProtoFile {
        /// The proto file name concerned, when known.
        file: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// Two methods hash to the same method id.
    #[error(
        "method id collision: {first} and {second} both hash to {id:#010x} (FNV-1a 32 of the full \
         name); rename one of them"
    )]
    MethodIdCollision {
        /// The shared id.
        id: u32,
        /// The first method, `"/package.Service/Method"`.
        first: String,
        /// The second method.
        second: String,
    },
    /// A method's name hashes to 0, which is reserved (never a method id).
    #[error("{file}: the method id of {method} is 0, which is reserved; rename the method")]
    ReservedMethodId {
        /// The method, `"/package.Service/Method"`.
        method: String,
        /// The proto file that declares it.
        file: String,
    },
    /// Two proto names that differ only in case or underscores map to the same Rust item.
    #[error("{first} and {second} both become the Rust name `{rust}`; rename one of them")]
    NameClash {
        /// The Rust name both would get.
        rust: String,
        /// The first proto name (fully qualified).
        first: String,
        /// The second proto name.
        second: String,
    },
    /// prost-build could not assemble the generated code (it panicked; its message is kept): an
    /// attribute passed through [`Builder`](crate::Builder) that is not valid Rust, or an input
    /// the checks before generation do not catch yet.
    #[error(
        "generating Rust code failed: {reason} (check the attributes given to type_attribute, \
         field_attribute and the like; if none is involved, the .proto input has a shape \
         rpc-codegen does not handle yet)"
    )]
    Generate {
        /// prost-build's panic message.
        reason: String,
    },
    /// No output directory: `OUT_DIR` is unset (not in a build script) and none was configured.
    #[error(
        "no output directory: OUT_DIR is not set (compile_protos is meant for build.rs); set one with \
         configure().out_dir(..)"
    )]
    NoOutDir,
    /// Reading or writing a file failed, or prost-build refused its input (its errors are I/O
    /// errors).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
