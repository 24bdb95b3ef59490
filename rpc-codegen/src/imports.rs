//! Parsing with protox while collecting every missing import of the build, not only the first.
//!
//! protox stops at the first import it cannot find. To name them all at once, its file resolver
//! is wrapped: a file that is not found while resolving an import is recorded and replaced by an
//! empty stand-in, so protox goes on with the other imports and files. When something was
//! missing, every import statement that names a missing file is reported, each with its importing
//! file, line and column; the errors the stand-ins caused later (unknown types) are dropped.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use prost_types::FileDescriptorProto;
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver, IncludeFileResolver};

use crate::location::span_of;
use crate::proto_error::{from_protox, on_disk};
use crate::Error;

/// `FileDescriptorProto.dependency`, as `SourceCodeInfo` paths name it.
const FILE_DEPENDENCY: i32 = 3;

/// What the resolver saw: every file it opened, and the names it could not find.
#[derive(Default)]
struct Seen {
    /// Files opened, in order: their descriptors (with source info) for the import positions.
    opened: Vec<FileDescriptorProto>,
    /// Names of the files to compile (never stood in for: a missing input is its own error).
    inputs: BTreeSet<String>,
    /// Imports not found, in the order protox asked for them.
    missing: Vec<String>,
}

/// protox's usual resolver (the include paths, then the bundled `google/protobuf/*.proto`), with
/// the recording described in the module docs.
struct Recording {
    inner: ChainFileResolver,
    seen: Rc<RefCell<Seen>>,
}

impl FileResolver for Recording {
    fn resolve_path(&self, path: &Path) -> Option<String> {
        let name = self.inner.resolve_path(path)?;
        self.seen.borrow_mut().inputs.insert(name.clone());
        Some(name)
    }

    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.inner.open_file(name) {
            Ok(file) => {
                self.seen.borrow_mut().opened.push(file.file_descriptor_proto().clone());
                Ok(file)
            }
            Err(err) if err.is_file_not_found() && !self.seen.borrow().inputs.contains(name) => {
                self.seen.borrow_mut().missing.push(name.to_owned());
                // An empty file of that name: its importers go on resolving their other imports.
                File::from_source(name, "")
            }
            Err(err) => Err(err),
        }
    }
}

/// One `import` statement whose file is not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingImport {
    /// The importing file, as found through the include paths.
    pub path: PathBuf,
    /// Line of the `import` statement, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
    /// The imported name that no include path has.
    pub import: String,
}

impl std::fmt::Display for MissingImport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}: import '{}' not found", self.path.display(), self.line, self.column, self.import)
    }
}

/// Parses `protos` (and their imports) with source info.
///
/// # Errors
/// [`Error::MissingImports`] naming every import not found, in the order the files were read;
/// otherwise the first error protox reported, converted by [`from_protox`].
pub fn parse(protos: &[impl AsRef<Path>], includes: &[PathBuf]) -> Result<protox::Compiler, Error> {
    let mut chain = ChainFileResolver::new();
    for include in includes {
        chain.add(IncludeFileResolver::new(include.clone()));
    }
    chain.add(GoogleFileResolver::new());
    let seen = Rc::new(RefCell::new(Seen::default()));
    for proto in protos {
        // A name given as is (not a path under an include directory) is an input too.
        if let Some(name) = proto.as_ref().to_str() {
            seen.borrow_mut().inputs.insert(name.to_owned());
        }
    }
    let mut compiler =
        protox::Compiler::with_file_resolver(Recording { inner: chain, seen: Rc::clone(&seen) });
    compiler.include_imports(true).include_source_info(true);
    let mut first_error = None;
    for proto in protos {
        if let Err(err) = compiler.open_file(proto.as_ref()) {
            first_error.get_or_insert(err);
        }
    }
    let seen = seen.borrow();
    if !seen.missing.is_empty() {
        return Err(Error::MissingImports { imports: missing_imports(&seen, includes) });
    }
    match first_error {
        Some(err) => Err(from_protox(&err, includes)),
        None => Ok(compiler),
    }
}

/// Every import statement of the opened files that names a missing file, in file order.
fn missing_imports(seen: &Seen, includes: &[PathBuf]) -> Vec<MissingImport> {
    let mut found = Vec::new();
    let mut reported = BTreeSet::new();
    for file in &seen.opened {
        if !reported.insert(file.name().to_owned()) {
            continue;
        }
        for (i, import) in file.dependency.iter().enumerate() {
            if !seen.missing.contains(import) {
                continue;
            }
            let (line, column) = span_of(file, &[FILE_DEPENDENCY, i as i32]).unwrap_or((1, 1));
            found.push(MissingImport {
                path: on_disk(file.name(), includes),
                line,
                column,
                import: import.clone(),
            });
        }
    }
    found
}
