//! The `configure()` builder: output directory, which halves to generate, options passed through
//! to prost-build, and the compile steps (protox → checks → prost-build with our services).

use std::path::{Path, PathBuf};

use prost_types::FileDescriptorSet;

use crate::check::check;
use crate::comments::escape_fds_comments;
use crate::generator::RpcServiceGenerator;
use crate::method_id::check_method_ids;
use crate::proto_error::from_protox;
use crate::Error;

/// Configures code generation; made by [`configure`](crate::configure). Every option has a default
/// that suits a build script: output to `OUT_DIR`, server and client both generated,
/// `cargo:rerun-if-changed` printed for every proto file read from disk.
pub struct Builder {
    out_dir: Option<PathBuf>,
    build_server: bool,
    build_client: bool,
    emit_rerun_if_changed: bool,
    file_descriptor_set_path: Option<PathBuf>,
    prost: prost_build::Config,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            out_dir: None,
            build_server: true,
            build_client: true,
            emit_rerun_if_changed: true,
            file_descriptor_set_path: None,
            prost: prost_build::Config::new(),
        }
    }
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("out_dir", &self.out_dir)
            .field("build_server", &self.build_server)
            .field("build_client", &self.build_client)
            .field("emit_rerun_if_changed", &self.emit_rerun_if_changed)
            .field("file_descriptor_set_path", &self.file_descriptor_set_path)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Where the generated `<package>.rs` files go (`_.rs` for files without a package). Default:
    /// the build script's `OUT_DIR`.
    #[must_use]
    pub fn out_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.out_dir = Some(dir.as_ref().to_owned());
        self
    }

    /// Whether to generate the `<service>_server` modules. Default: true.
    #[must_use]
    pub fn build_server(mut self, enable: bool) -> Self {
        self.build_server = enable;
        self
    }

    /// Whether to generate the `<service>_client` modules. Default: true.
    #[must_use]
    pub fn build_client(mut self, enable: bool) -> Self {
        self.build_client = enable;
        self
    }

    /// Whether to print `cargo:rerun-if-changed=<file>` for every proto file read from disk (the
    /// inputs and their imports), so cargo reruns the build script when one changes. Default: true.
    #[must_use]
    pub fn emit_rerun_if_changed(mut self, enable: bool) -> Self {
        self.emit_rerun_if_changed = enable;
        self
    }

    /// Also writes the encoded `FileDescriptorSet` (with imports and source info) to `path`.
    /// Default: not written.
    #[must_use]
    pub fn file_descriptor_set_path(mut self, path: impl AsRef<Path>) -> Self {
        self.file_descriptor_set_path = Some(path.as_ref().to_owned());
        self
    }

    /// Adds an attribute to the messages and enums matched by `path` (prost-build's
    /// `type_attribute`; `"."` matches all, `".helloworld.HelloRequest"` one).
    #[must_use]
    pub fn type_attribute(mut self, path: impl AsRef<str>, attribute: impl AsRef<str>) -> Self {
        self.prost.type_attribute(path, attribute);
        self
    }

    /// Adds an attribute to the messages matched by `path` (prost-build's `message_attribute`).
    #[must_use]
    pub fn message_attribute(mut self, path: impl AsRef<str>, attribute: impl AsRef<str>) -> Self {
        self.prost.message_attribute(path, attribute);
        self
    }

    /// Adds an attribute to the enums matched by `path` (prost-build's `enum_attribute`).
    #[must_use]
    pub fn enum_attribute(mut self, path: impl AsRef<str>, attribute: impl AsRef<str>) -> Self {
        self.prost.enum_attribute(path, attribute);
        self
    }

    /// Adds an attribute to the fields matched by `path` (prost-build's `field_attribute`, e.g.
    /// `".helloworld.HelloRequest.name"`).
    #[must_use]
    pub fn field_attribute(mut self, path: impl AsRef<str>, attribute: impl AsRef<str>) -> Self {
        self.prost.field_attribute(path, attribute);
        self
    }

    /// Uses an existing Rust type for a proto path instead of generating it (prost-build's
    /// `extern_path`, e.g. `(".common", "::common_protos")`). Generated service code refers to the
    /// type by that path too.
    #[must_use]
    pub fn extern_path(mut self, proto_path: impl AsRef<str>, rust_path: impl AsRef<str>) -> Self {
        self.prost.extern_path(proto_path.as_ref(), rust_path.as_ref());
        self
    }

    /// Generates `BTreeMap` instead of `HashMap` for the map fields matched by `paths`.
    #[must_use]
    pub fn btree_map<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.prost.btree_map(paths);
        self
    }

    /// Generates `bytes::Bytes` instead of `Vec<u8>` for the bytes fields matched by `paths` (the
    /// crate then needs a `bytes` dependency).
    #[must_use]
    pub fn bytes<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.prost.bytes(paths);
        self
    }

    /// Boxes the message fields matched by `path`.
    #[must_use]
    pub fn boxed(mut self, path: impl AsRef<str>) -> Self {
        self.prost.boxed(path);
        self
    }

    /// Leaves out the comments of the items matched by `paths`.
    #[must_use]
    pub fn disable_comments<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.prost.disable_comments(paths);
        self
    }

    /// Generates the `google.protobuf` types instead of using `prost_types` (default: use them).
    #[must_use]
    pub fn compile_well_known_types(mut self) -> Self {
        self.prost.compile_well_known_types();
        self
    }

    /// Also writes `file`: one Rust file that includes every generated package in nested modules
    /// matching the package names (prost-build's `include_file`).
    #[must_use]
    pub fn include_file(mut self, file: impl AsRef<Path>) -> Self {
        self.prost.include_file(file.as_ref());
        self
    }

    /// Replaces the prost-build configuration wholesale, for options not mirrored here. Its service
    /// generator and output directory are overridden by this builder's.
    #[must_use]
    pub fn prost_config(mut self, config: prost_build::Config) -> Self {
        self.prost = config;
        self
    }

    /// Parses `protos` (found through `includes`, then protox's bundled `google/protobuf/*.proto`)
    /// and generates the code. No system `protoc` is used.
    ///
    /// # Errors
    /// - [`Error::Proto`]: a syntax error, unknown type or missing import, with file, line, column
    ///   and reason;
    /// - [`Error::ProtoFile`]: a file not found or outside every include path, an import cycle;
    /// - [`Error::MethodIdCollision`], [`Error::ReservedMethodId`], [`Error::NameClash`];
    /// - [`Error::NoOutDir`], [`Error::Io`].
    pub fn compile_protos(
        self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<(), Error> {
        self.compile_protos_report(protos, includes).map(drop)
    }

    /// Generates the code for an already parsed set of files (e.g. from another tool), which must
    /// include the imported files and, for comments to become docs, source info.
    ///
    /// # Errors
    /// As [`compile_protos`](Self::compile_protos), but for the parse errors.
    pub fn compile_fds(self, fds: FileDescriptorSet) -> Result<(), Error> {
        self.generate(fds, &[]).map(drop)
    }

    /// [`compile_protos`](Self::compile_protos), returning the warnings it printed.
    pub(crate) fn compile_protos_report(
        self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<Vec<String>, Error> {
        let includes: Vec<PathBuf> = includes.iter().map(|p| p.as_ref().to_owned()).collect();
        let mut compiler = protox::Compiler::new(&includes).map_err(|e| from_protox(&e, &includes))?;
        compiler.include_imports(true).include_source_info(true);
        for proto in protos {
            compiler.open_file(proto.as_ref()).map_err(|e| from_protox(&e, &includes))?;
        }
        if self.emit_rerun_if_changed {
            for file in compiler.files() {
                if let Some(path) = file.path() {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
        }
        if let Some(path) = &self.file_descriptor_set_path {
            std::fs::write(path, compiler.encode_file_descriptor_set()).map_err(|source| Error::Io {
                context: format!("writing the file descriptor set to {}", path.display()),
                source,
            })?;
        }
        self.generate(compiler.file_descriptor_set(), &includes)
    }

    /// Checks, then runs prost-build with our service generator; prints and returns the warnings.
    /// `includes` resolve proto file names to paths on disk for the messages.
    fn generate(mut self, mut fds: FileDescriptorSet, includes: &[PathBuf]) -> Result<Vec<String>, Error> {
        check_method_ids(&fds)?;
        let findings = check(&fds, includes)?;
        escape_fds_comments(&mut fds);
        let out_dir = match self.out_dir.take() {
            Some(dir) => dir,
            None => std::env::var_os("OUT_DIR").map(PathBuf::from).ok_or(Error::NoOutDir)?,
        };
        std::fs::create_dir_all(&out_dir).map_err(|source| Error::Io {
            context: format!("creating the output directory {}", out_dir.display()),
            source,
        })?;
        self.prost.out_dir(&out_dir);
        self.prost.service_generator(Box::new(RpcServiceGenerator {
            build_server: self.build_server,
            build_client: self.build_client,
        }));
        self.prost.compile_fds(fds).map_err(|source| Error::Io {
            context: format!("prost-build generating into {}", out_dir.display()),
            source,
        })?;
        for warning in &findings.warnings {
            println!("cargo:warning={warning}");
        }
        Ok(findings.warnings)
    }
}
