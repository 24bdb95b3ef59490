//! Places in proto files: a `SourceCodeInfo` path → line and column, and errors that name them.

use std::path::PathBuf;

use prost_types::FileDescriptorProto;

use crate::proto_error::on_disk;
use crate::Error;

// Field numbers of `google/protobuf/descriptor.proto`, as `SourceCodeInfo` paths use them.
/// `FileDescriptorProto.package`.
pub const FILE_PACKAGE: i32 = 2;
/// `FileDescriptorProto.message_type`.
pub const FILE_MESSAGE: i32 = 4;
/// `FileDescriptorProto.enum_type`.
pub const FILE_ENUM: i32 = 5;
/// `FileDescriptorProto.service`.
pub const FILE_SERVICE: i32 = 6;
/// `DescriptorProto.nested_type`.
pub const MESSAGE_NESTED: i32 = 3;
/// `DescriptorProto.enum_type`.
pub const MESSAGE_ENUM: i32 = 4;
/// `EnumDescriptorProto.value`.
pub const ENUM_VALUE: i32 = 2;

/// Line and column (from 1) of the item at `path` in `file`, when the file has source info.
pub fn span_of(file: &FileDescriptorProto, path: &[i32]) -> Option<(usize, usize)> {
    let location = file.source_code_info.as_ref()?.location.iter().find(|l| l.path == path)?;
    (location.span.len() >= 2).then(|| (location.span[0] as usize + 1, location.span[1] as usize + 1))
}

/// `file:line:col` of the item at `path` (just `file` without source info), for naming a second
/// place inside an error's reason.
pub fn describe(file: &FileDescriptorProto, path: &[i32], includes: &[PathBuf]) -> String {
    let on_disk = on_disk(file.name(), includes);
    match span_of(file, path) {
        Some((line, column)) => format!("{}:{line}:{column}", on_disk.display()),
        None => on_disk.display().to_string(),
    }
}

/// An error at the item at `path` of `file`: [`Error::Proto`] with its line and column, or
/// [`Error::ProtoFile`] naming the file when the set has no source info.
pub fn error_at(file: &FileDescriptorProto, path: &[i32], includes: &[PathBuf], reason: String) -> Error {
    match span_of(file, path) {
        Some((line, column)) => Error::Proto { path: on_disk(file.name(), includes), line, column, reason },
        None => Error::ProtoFile { file: Some(file.name().to_owned()), reason },
    }
}
