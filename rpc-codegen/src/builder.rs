//! The `configure()` builder: output directory, which halves to generate, options passed through
//! to prost-build, and the compile steps (protox → checks → prost-build with our services).

use std::path::{Path, PathBuf};

use prost_types::FileDescriptorSet;

use crate::check::check;
use crate::comments::escape_fds_comments;
use crate::enums::check_enum_variants;
use crate::generator::RpcServiceGenerator;
use crate::method_id::check_method_ids;
use crate::modules::{self, Rename, Tree};
use crate::unnamed::check_rust_names;
use crate::Error;

/// A prost-build option keyed by a proto path, kept so that it can be given again for the
/// stand-in names of renamed message modules (see `modules.rs`).
#[derive(Debug, Clone)]
enum PathOption {
    TypeAttribute(String, String),
    MessageAttribute(String, String),
    EnumAttribute(String, String),
    FieldAttribute(String, String),
    ExternPath(String, String),
    BtreeMap(String),
    Bytes(String),
    Boxed(String),
    DisableComments(String),
}

impl PathOption {
    fn path(&self) -> &str {
        match self {
            Self::TypeAttribute(p, _)
            | Self::MessageAttribute(p, _)
            | Self::EnumAttribute(p, _)
            | Self::FieldAttribute(p, _)
            | Self::ExternPath(p, _)
            | Self::BtreeMap(p)
            | Self::Bytes(p)
            | Self::Boxed(p)
            | Self::DisableComments(p) => p,
        }
    }

    /// Gives this option to `config` for `path` instead of its own.
    fn apply(&self, config: &mut prost_build::Config, path: &str) {
        match self {
            Self::TypeAttribute(_, a) => {
                config.type_attribute(path, a);
            }
            Self::MessageAttribute(_, a) => {
                config.message_attribute(path, a);
            }
            Self::EnumAttribute(_, a) => {
                config.enum_attribute(path, a);
            }
            Self::FieldAttribute(_, a) => {
                config.field_attribute(path, a);
            }
            Self::ExternPath(_, rust) => {
                config.extern_path(path, rust);
            }
            Self::BtreeMap(_) => {
                config.btree_map([path]);
            }
            Self::Bytes(_) => {
                config.bytes([path]);
            }
            Self::Boxed(_) => {
                config.boxed(path);
            }
            Self::DisableComments(_) => {
                config.disable_comments([path]);
            }
        }
    }
}

/// Configures code generation; made by [`configure`](crate::configure). Every option has a default
/// that suits a build script: output to `OUT_DIR`, server and client both generated,
/// `cargo:rerun-if-changed` printed for every proto file read from disk.
pub struct Builder {
    out_dir: Option<PathBuf>,
    build_server: bool,
    build_client: bool,
    async_servers: Vec<String>,
    default_stubs: bool,
    emit_rerun_if_changed: bool,
    file_descriptor_set_path: Option<PathBuf>,
    bytes_everywhere: bool,
    retain_enum_prefix: bool,
    well_known_types: bool,
    prost_replaced: bool,
    path_options: Vec<PathOption>,
    prost: prost_build::Config,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            out_dir: None,
            build_server: true,
            build_client: true,
            async_servers: Vec::new(),
            default_stubs: false,
            emit_rerun_if_changed: true,
            file_descriptor_set_path: None,
            bytes_everywhere: true,
            retain_enum_prefix: false,
            well_known_types: false,
            prost_replaced: false,
            path_options: Vec::new(),
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
            .field("async_servers", &self.async_servers)
            .field("default_stubs", &self.default_stubs)
            .field("emit_rerun_if_changed", &self.emit_rerun_if_changed)
            .field("file_descriptor_set_path", &self.file_descriptor_set_path)
            .field("bytes_everywhere", &self.bytes_everywhere)
            .field("retain_enum_prefix", &self.retain_enum_prefix)
            .field("path_options", &self.path_options)
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

    /// Makes the server trait of `service` async: its full proto name, `package.Service`
    /// (`Service` without a package; a leading `.` is accepted). Its methods then take an
    /// `AsyncContext` and return `impl Future<Output = Result<Reply, Status>> + Send` (write them
    /// as `async fn`), and its adapter runs them on a tokio runtime (`with_runtime`, or the
    /// caller's / a shared one with `new`). Other services keep inline synchronous handlers, the
    /// fastest path. Call once per service. Default: none.
    ///
    /// A name that matches no service of the compiled files fails the build, naming it.
    #[must_use]
    pub fn async_server(mut self, service: impl AsRef<str>) -> Self {
        self.async_servers.push(service.as_ref().trim_start_matches('.').to_owned());
        self
    }

    /// Whether every method of the generated server traits gets a default body that answers
    /// UNIMPLEMENTED, naming the RPC (tonic-build's `generate_default_stubs`), so an
    /// implementation of a large service writes only the methods it serves and compiles from the
    /// start. A stream's default ends it with that status at once. Default: false (every method
    /// must be written: the compiler lists the missing ones).
    #[must_use]
    pub fn generate_default_stubs(mut self, enable: bool) -> Self {
        self.default_stubs = enable;
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
        self.path_options.push(PathOption::TypeAttribute(path.as_ref().into(), attribute.as_ref().into()));
        self.prost.type_attribute(path, attribute);
        self
    }

    /// Adds an attribute to the messages matched by `path` (prost-build's `message_attribute`).
    #[must_use]
    pub fn message_attribute(mut self, path: impl AsRef<str>, attribute: impl AsRef<str>) -> Self {
        self.path_options.push(PathOption::MessageAttribute(path.as_ref().into(), attribute.as_ref().into()));
        self.prost.message_attribute(path, attribute);
        self
    }

    /// Adds an attribute to the enums matched by `path` (prost-build's `enum_attribute`).
    #[must_use]
    pub fn enum_attribute(mut self, path: impl AsRef<str>, attribute: impl AsRef<str>) -> Self {
        self.path_options.push(PathOption::EnumAttribute(path.as_ref().into(), attribute.as_ref().into()));
        self.prost.enum_attribute(path, attribute);
        self
    }

    /// Adds an attribute to the fields matched by `path` (prost-build's `field_attribute`, e.g.
    /// `".helloworld.HelloRequest.name"`).
    #[must_use]
    pub fn field_attribute(mut self, path: impl AsRef<str>, attribute: impl AsRef<str>) -> Self {
        self.path_options.push(PathOption::FieldAttribute(path.as_ref().into(), attribute.as_ref().into()));
        self.prost.field_attribute(path, attribute);
        self
    }

    /// Uses an existing Rust type for a proto path instead of generating it (prost-build's
    /// `extern_path`, e.g. `(".common", "::common_protos")`). Generated service code refers to the
    /// type by that path too.
    #[must_use]
    pub fn extern_path(mut self, proto_path: impl AsRef<str>, rust_path: impl AsRef<str>) -> Self {
        self.path_options.push(PathOption::ExternPath(proto_path.as_ref().into(), rust_path.as_ref().into()));
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
        let paths: Vec<String> = paths.into_iter().map(|p| p.as_ref().to_owned()).collect();
        self.path_options.extend(paths.iter().cloned().map(PathOption::BtreeMap));
        self.prost.btree_map(paths);
        self
    }

    /// Generates `bytes::Bytes` instead of `Vec<u8>` for the bytes fields matched by `paths`, when
    /// [`bytes_everywhere`](Self::bytes_everywhere) is turned off (it is on by default, and then
    /// every `bytes` field is a `Bytes` already).
    #[must_use]
    pub fn bytes<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let paths: Vec<String> = paths.into_iter().map(|p| p.as_ref().to_owned()).collect();
        self.path_options.extend(paths.iter().cloned().map(PathOption::Bytes));
        self.prost.bytes(paths);
        self
    }

    /// Whether every proto `bytes` field (singular, repeated, map values) becomes
    /// `::prost::bytes::Bytes` (prost-build's `.bytes(["."])`): decoding then slices one buffer
    /// instead of copying each field into a `Vec<u8>`, and a field is cheap to clone. The type
    /// comes through `prost` (which re-exports the `bytes` crate), so the crate needs no `bytes`
    /// dependency to build; to construct values, `bytes::Bytes::from(vec)` or
    /// `Bytes::from_static(b"..")` (a `bytes` dependency, or `prost::bytes::Bytes`).
    ///
    /// Default: true. With false, `bytes` fields are `Vec<u8>` (prost-build's default), except
    /// those given to [`bytes`](Self::bytes).
    #[must_use]
    pub fn bytes_everywhere(mut self, enable: bool) -> Self {
        self.bytes_everywhere = enable;
        self
    }

    /// Keeps the enum's name at the front of its values' Rust variants (prost-build's
    /// `retain_enum_prefix`): `Kind::KindFoo` instead of `Kind::Foo`. Default: the prefix is
    /// dropped.
    #[must_use]
    pub fn retain_enum_prefix(mut self) -> Self {
        self.retain_enum_prefix = true;
        self.prost.retain_enum_prefix();
        self
    }

    /// Boxes the message fields matched by `path`.
    #[must_use]
    pub fn boxed(mut self, path: impl AsRef<str>) -> Self {
        self.path_options.push(PathOption::Boxed(path.as_ref().into()));
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
        let paths: Vec<String> = paths.into_iter().map(|p| p.as_ref().to_owned()).collect();
        self.path_options.extend(paths.iter().cloned().map(PathOption::DisableComments));
        self.prost.disable_comments(paths);
        self
    }

    /// Generates the `google.protobuf` types instead of using `prost_types` (default: use them).
    #[must_use]
    pub fn compile_well_known_types(mut self) -> Self {
        self.well_known_types = true;
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
    /// generator and output directory are overridden by this builder's, and `bytes` fields become
    /// `Bytes` unless [`bytes_everywhere(false)`](Self::bytes_everywhere). The options set
    /// through this builder before are dropped with the old configuration.
    ///
    /// rpc-codegen cannot see the path options of such a configuration, so it cannot carry them
    /// over to a message module it renames (see the crate docs): a build that needs a rename then
    /// fails with an error naming the message and the package. Call `prost_config` first and give
    /// the path options through this builder's methods, and the rename works. It also assumes that
    /// enum prefixes are stripped (call [`retain_enum_prefix`](Self::retain_enum_prefix) here
    /// when the configuration retains them).
    #[must_use]
    pub fn prost_config(mut self, config: prost_build::Config) -> Self {
        self.prost = config;
        self.prost_replaced = true;
        self.path_options.clear();
        self
    }

    /// Parses `protos` (found through `includes`, then protox's bundled `google/protobuf/*.proto`)
    /// and generates the code. No system `protoc` is used.
    ///
    /// # Errors
    /// - [`Error::Proto`], with file, line, column and reason: a syntax error or unknown type; a
    ///   name made of underscores only (it has no Rust form); two values of one enum that become
    ///   one Rust variant; two items that become one Rust type; a module collision with no safe rename (a service module that is a
    ///   package's module, two messages with one module, any collision after
    ///   [`prost_config`](Self::prost_config)), naming the other item's place in the reason;
    /// - [`Error::MissingImports`]: every import of the build that is not found;
    /// - [`Error::ProtoFile`]: a file not found or outside every include path, an import cycle;
    /// - [`Error::MethodIdCollision`], [`Error::ReservedMethodId`], [`Error::NameClash`];
    /// - [`Error::Generate`]: prost-build could not assemble the code (an attribute given to
    ///   [`type_attribute`](Self::type_attribute) and friends that does not parse, ...);
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
        let compiler = crate::imports::parse(protos, &includes)?;
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

    /// Gives every path option that names a renamed message again, for its stand-in name.
    fn give_options_to_stand_ins(&mut self, renames: &[Rename]) {
        for option in &self.path_options {
            for path in modules::option_paths(option.path(), renames) {
                option.apply(&mut self.prost, &path);
            }
        }
    }

    /// Checks, then runs prost-build with our service generator; prints and returns the warnings.
    /// `includes` resolve proto file names to paths on disk for the messages.
    fn generate(mut self, mut fds: FileDescriptorSet, includes: &[PathBuf]) -> Result<Vec<String>, Error> {
        check_rust_names(&fds, includes)?;
        check_method_ids(&fds)?;
        check_async_servers(&fds, &self.async_servers)?;
        let findings = check(&fds, includes)?;
        let extern_paths: Vec<String> = self
            .path_options
            .iter()
            .filter_map(|o| match o {
                PathOption::ExternPath(proto, _) => Some(proto.clone()),
                _ => None,
            })
            .collect();
        let tree = Tree {
            extern_paths: &extern_paths,
            well_known_types: self.well_known_types,
            build_server: self.build_server,
            build_client: self.build_client,
            prost_replaced: self.prost_replaced,
        };
        check_enum_variants(&fds, includes, !self.retain_enum_prefix, &|fq| tree.is_extern(fq))?;
        let renames = modules::plan(&fds, includes, &tree)?;
        // After the modules: two messages with one module have one struct name too, and the
        // module error says more.
        crate::types::check_type_names(&fds, includes, &|fq| tree.is_extern(fq))?;
        // The `.proto` files' own descriptors, before the rewriting for prost-build below.
        let descriptor_sets = crate::descriptors::per_package(&fds);
        escape_fds_comments(&mut fds);
        modules::apply(&mut fds, &renames);
        self.give_options_to_stand_ins(&renames);
        if self.bytes_everywhere {
            self.prost.bytes(["."]);
        }
        let outputs = modules::output_files(&fds);
        let uses = crate::uses::plan(&fds, &tree);
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
            async_servers: self.async_servers.clone(),
            default_stubs: self.default_stubs,
            descriptor_sets,
        }));
        // prost-build panics when the code it assembles does not parse (an attribute given to
        // `type_attribute` that is not one, or an input the checks above do not know yet): the
        // build script gets an error naming the cause instead of a panic.
        let prost = &mut self.prost;
        let generated = catch_quietly(|| prost.compile_fds(fds))
            .map_err(|panic| Error::Generate { reason: panic_text(panic.as_ref()) })?;
        generated.map_err(|source| Error::Io {
            context: format!("prost-build generating into {}", out_dir.display()),
            source,
        })?;
        if !renames.is_empty() {
            modules::rewrite_outputs(&outputs, &out_dir, &renames)?;
        }
        crate::uses::append(&uses, &out_dir)?;
        for warning in &findings.warnings {
            println!("cargo:warning={warning}");
        }
        Ok(findings.warnings)
    }
}

thread_local! {
    /// Set while prost-build runs on this thread: its panics are caught and reported as errors,
    /// so the panic hook must not print them.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, catching a panic without the hook's `thread '..' panicked at` banner (other threads'
/// panics still reach the hook that was installed before).
fn catch_quietly<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    result
}

/// The message of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Every service named by `async_server` exists among the compiled files.
fn check_async_servers(fds: &FileDescriptorSet, names: &[String]) -> Result<(), Error> {
    for name in names {
        let found = fds.file.iter().any(|f| {
            f.service.iter().any(|s| {
                let pkg = f.package();
                let full = if pkg.is_empty() { s.name().to_owned() } else { format!("{pkg}.{}", s.name()) };
                full == *name
            })
        });
        if !found {
            return Err(Error::ProtoFile {
                file: None,
                reason: format!(
                    "async_server(\"{name}\"): no service of that full name (`package.Service`) in the compiled files"
                ),
            });
        }
    }
    Ok(())
}
