//! Loading plugins and calling them in a sandbox.
//!
//! One [`Runtime`] holds the wasmtime engine (pooling allocator, epoch interruption), the WASI
//! linker and the compile cache. A [`Plugin`] is one loaded component: its sha256, its
//! pre-instantiated form, and what it said about itself in `describe`. Every call runs in a fresh
//! store and instance ([`sandbox`]), so no state leaks from one resource to the next.

mod bindings;
mod builtin;
mod cache;
mod error;
mod sandbox;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use wasmtime::component::{Component, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, WasmBacktraceDetails,
};

pub use builtin::{BUILTINS, Builtin};
pub(crate) use cache::COMPILE_THREADS;
use cache::FileStamp;
pub use cache::{Cache, default_cache_dir};

pub use error::PluginError;

use crate::error::{Error, MAX_ERROR_FIELD, MAX_ERROR_MESSAGE, Result};
use crate::types::{Context, KindInfo, PluginInfo};
use crate::units::bounded;

/// The WIT package every plugin is built against, and the interface it must export.
pub const PACKAGE: &str = "wasm-operator:plugin";
/// The major version of [`PACKAGE`] this host speaks.
pub const PACKAGE_MAJOR: u64 = 1;
pub(crate) const INTERFACE: &str = "wasm-operator:plugin/reconciler";

/// How often the epoch ticks; deadlines are counted in ticks.
const TICK: Duration = Duration::from_millis(5);

/// What a plugin call may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time a call may take before it is stopped.
    pub deadline: Duration,
    /// Linear memory a call may grow to: all memories of the component together.
    pub memory_bytes: usize,
    /// Total bytes of manifests a render may return; also the largest error (field and message
    /// together) it may return.
    pub output_bytes: usize,
    /// How many manifests a render may return. The byte cap alone lets through a million empty
    /// strings, each of which the host would then parse, check and report on.
    pub max_manifests: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(1),
            memory_bytes: 64 << 20,
            output_bytes: 4 << 20,
            max_manifests: 1000,
        }
    }
}

impl Limits {
    /// How much memory one call may need, counted against the budget of calls in flight
    /// (`--render-memory`): its instance at the memory cap, and what it returns at the output
    /// cap held [`OUTPUT_COPIES`] times over (the texts copied out, their parsed form and the
    /// bodies sent to the API server).
    pub fn call_memory(&self) -> u64 {
        let output = self.output_bytes.saturating_mul(OUTPUT_COPIES);
        u64::try_from(self.memory_bytes.saturating_add(output)).unwrap_or(u64::MAX)
    }

    /// The most JSON values (numbers, strings, lists, objects and their entries) the manifests
    /// of one call may hold: what their parsed form may take of the call's share of the budget
    /// (the instance's room, free once the call has ended, and two of its output copies) at
    /// [`VALUE_BYTES`] each. Real manifests hold a value in every 10 to 20 bytes of text, far
    /// within it at any output cap; a guest that packs `[0,0,...]` into its output is refused
    /// before the host parses it.
    pub fn max_values(&self) -> usize {
        self.memory_bytes
            .saturating_add(self.output_bytes.saturating_mul(2))
            / VALUE_BYTES
    }

    /// The most bytes the host allocates for what a guest hands it in one call (wasmtime's
    /// hostcall fuel): the output cap, with room for the list and string headers of as many
    /// manifests and warnings as a render may return, and no less than what a `describe` with
    /// its schemas needs ([`MIN_HOSTCALL_FUEL`]). More is refused while it is being copied out.
    pub fn hostcall_fuel(&self) -> usize {
        let headers = self
            .max_manifests
            .saturating_add(MAX_WARNINGS)
            .saturating_mul(HEADER_BYTES);
        self.output_bytes
            .saturating_add(headers)
            .max(MIN_HOSTCALL_FUEL)
    }
}

/// How many times over the host may hold a call's output at once, for [`Limits::call_memory`].
pub const OUTPUT_COPIES: usize = 4;

/// What the host's parsed form of one JSON value may take at most, for [`Limits::max_values`]:
/// a `serde_json::Value` (32 bytes), room for its list to have grown by doubling, and for an
/// object entry its key and its share of the map's node.
const VALUE_BYTES: usize = 128;

/// Room per returned item for the host's copies of its list entry and string headers.
const HEADER_BYTES: usize = 4 * std::mem::size_of::<String>();
/// What `describe`, with its Kinds' schemas, may hand over whatever the output cap.
pub const MIN_HOSTCALL_FUEL: usize = 1 << 20;

/// What a component is, read from its bytes and its type once it compiled.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Anatomy {
    /// The sha256 of its bytes, in hex.
    pub sha256: String,
    /// Its size in bytes.
    pub size: usize,
    /// What it imports (interfaces and functions, with their versions).
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

impl Anatomy {
    /// The version of the contract it exports (`1.0.0`): the one of this host's major version
    /// when it exports several, else the first.
    pub fn contract(&self) -> Option<&str> {
        let versions = || {
            self.exports
                .iter()
                .filter_map(|e| e.strip_prefix(INTERFACE).and_then(|v| v.strip_prefix('@')))
        };
        versions()
            .find(|v| {
                v.split('.').next().and_then(|m| m.parse::<u64>().ok()) == Some(PACKAGE_MAJOR)
            })
            .or_else(|| versions().next())
    }
}

/// The steps of loading a plugin, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// The bytes compile as a WebAssembly component.
    Compile,
    /// It exports the reconciler of a version of the contract this host speaks, with its types.
    Contract,
    /// It imports nothing the sandbox does not give.
    Imports,
    /// Its exports have the contract's types (checked once its imports are linked).
    Types,
    /// Its `describe` returns a valid description.
    Describe,
}

/// A load that failed: at which step, why, and what the component is when it compiled.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// The step that failed.
    pub step: Step,
    /// Why, as `host` errors say it.
    pub reason: String,
    /// What the component is, once it compiled.
    pub anatomy: Option<Anatomy>,
}

/// The wasmtime engine, WASI linker and compile cache that every plugin shares. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Linker<sandbox::Sandbox>,
    limits: Limits,
    cache: Option<Cache>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("limits", &self.limits)
            .field("cache", &self.cache)
            .finish()
    }
}

impl Runtime {
    /// A runtime with the given limits, caching compiled components in `cache` (none: compile in
    /// memory every time).
    pub fn new(limits: Limits, cache: Option<Cache>) -> Result<Self> {
        let config = engine_config(Some(instance_pool(&limits)));
        let engine = Engine::new(&config).map_err(|e| Error::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        sandbox::add_to_linker(&mut linker).map_err(|e| Error::Engine(format!("{e:#}")))?;
        spawn_ticker(&engine);
        Ok(Self {
            engine,
            linker,
            limits,
            cache,
        })
    }

    /// The same runtime, compiling each component its cache does not hold in a process of
    /// its own, run from `exe` (this `host` executable): `host compile-component`. Without a
    /// cache, components are compiled here as before. `memory_cap`: the most memory, in bytes,
    /// that process may take (none: uncapped).
    #[must_use]
    pub fn compiling_apart(self, exe: PathBuf, memory_cap: Option<u64>) -> Self {
        let apart = cache::Apart { exe, memory_cap };
        Self {
            cache: self.cache.map(|c| c.compiling_apart(apart)),
            ..self
        }
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The same engine and cache, with the calls of the plugins it loads under `limits` instead,
    /// each at most this runtime's own (its instance pool is sized for those).
    pub fn with_limits(&self, limits: Limits) -> Self {
        let own = self.limits;
        Self {
            limits: Limits {
                deadline: limits.deadline.min(own.deadline),
                memory_bytes: limits.memory_bytes.min(own.memory_bytes),
                output_bytes: limits.output_bytes.min(own.output_bytes),
                max_manifests: limits.max_manifests.min(own.max_manifests),
            },
            ..self.clone()
        }
    }

    /// Loads a plugin from a file. With a compile cache, a file whose digest the cache recorded
    /// and that `stat` says is unchanged since is not read: its compiled form is found by that
    /// digest (see [`Cache::file_digest`]). Otherwise it is read and hashed, and its digest
    /// recorded for the next load.
    pub fn load_file(&self, path: &Path, ctx: &Context) -> Result<Plugin> {
        let source = path.display().to_string();
        let unreadable = |source| Error::ReadPlugin {
            path: path.to_path_buf(),
            source,
        };
        let Some(cache) = &self.cache else {
            let bytes = std::fs::read(path).map_err(unreadable)?;
            return self.load(&bytes, &source, ctx);
        };
        // The digest is recorded under the absolute path, so that a relative one given from
        // another directory does not find it. The file is opened once, and its stamp and bytes
        // come from that one handle: a symlink switched meanwhile cannot pair one file's stamp
        // with another's digest. The recording time is taken before the open, so a record is
        // settled only if the whole read came after the file's last change.
        let absolute = std::path::absolute(path).map_err(unreadable)?;
        let opened_at = std::time::SystemTime::now();
        let mut file = std::fs::File::open(&absolute).map_err(unreadable)?;
        let stamp = FileStamp::of(&file.metadata().map_err(unreadable)?);
        if let Some(stamp) = &stamp
            && let Some(sha256) = cache.file_digest(&absolute, stamp)
            && let Some(loaded) = self.load_compiled(
                &sha256,
                usize::try_from(stamp.size()).unwrap_or(usize::MAX),
                &source,
                ctx,
            )
        {
            return loaded;
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).map_err(unreadable)?;
        let sha256 = crate::units::sha256_hex(&bytes);
        if let Some(stamp) = stamp {
            // The stamp from before the read: a file changed while it was read has another
            // stamp now, so the next load reads it again.
            cache.store_file_digest_at(&absolute, stamp, &sha256, opened_at);
        }
        self.load_hashed(&bytes, sha256, &source, ctx)
    }

    /// Loads a plugin from its bytes; `source` names it in errors (a path, or `built-in service`).
    pub fn load(&self, wasm: &[u8], source: &str, ctx: &Context) -> Result<Plugin> {
        self.load_hashed(wasm, crate::units::sha256_hex(wasm), source, ctx)
    }

    /// Loads a plugin built into the host (named `built-in <name>` in errors); its sha256 was
    /// computed when the host was built.
    pub fn load_builtin(&self, builtin: &Builtin, ctx: &Context) -> Result<Plugin> {
        let source = format!("built-in {}", builtin.name);
        self.load_hashed(builtin.wasm, builtin.sha256.to_owned(), &source, ctx)
    }

    fn load_hashed(
        &self,
        wasm: &[u8],
        sha256: String,
        source: &str,
        ctx: &Context,
    ) -> Result<Plugin> {
        self.load_steps(wasm, sha256, source, ctx)
            .map(|(plugin, _)| plugin)
            .map_err(|failure| Error::Load {
                plugin: source.to_owned(),
                reason: failure.reason,
            })
    }

    /// Loads a plugin as [`Runtime::load`] does, saying which [`Step`] failed, and what the
    /// component is ([`Anatomy`]) once it compiled: what `host check` and `host inspect` report.
    pub fn load_stepwise(
        &self,
        wasm: &[u8],
        source: &str,
        ctx: &Context,
    ) -> std::result::Result<(Plugin, Anatomy), LoadFailure> {
        self.load_steps(wasm, crate::units::sha256_hex(wasm), source, ctx)
    }

    /// [`Runtime::load_stepwise`] of bytes whose sha256 (hex) is already known, checked against
    /// them by whoever gives it (a pull checks a layer against its digest): not hashed again.
    pub(crate) fn load_steps(
        &self,
        wasm: &[u8],
        sha256: String,
        source: &str,
        ctx: &Context,
    ) -> std::result::Result<(Plugin, Anatomy), LoadFailure> {
        let (component, from_cache) = match &self.cache {
            Some(cache) => cache.load_or_compile(&self.engine, wasm, &sha256),
            None => Component::new(&self.engine, wasm).map(|c| (c, false)),
        }
        .map_err(|e| LoadFailure {
            step: Step::Compile,
            reason: if e.is::<cache::CompilerFailed>() {
                e.to_string()
            } else if wasm.starts_with(b"\0asm") {
                format!("not a valid WebAssembly component: {e:#}")
            } else {
                "not a WebAssembly component (no \\0asm header)".to_owned()
            },
            anatomy: None,
        })?;
        self.link(component, from_cache, sha256, wasm.len(), source, ctx)
    }

    /// Makes the compiled component of the wasm with this `sha256` (hex) from the compile cache
    /// and drops it, saying whether the cache held it: wasmtime's share of a load (the file
    /// found and mapped, its metadata deserialized; no link, no description, no record of the
    /// use), the floor the load benchmark compares a load with.
    pub fn deserialize_cached(&self, sha256: &str) -> bool {
        self.cache
            .as_ref()
            .and_then(|cache| cache.deserialize(&self.engine, sha256))
            .is_some()
    }

    /// Loads the plugin whose bytes have this `sha256` (hex) and `size`: from the compile cache
    /// alone when it holds it (the bytes are not read, nor hashed: what names them by digest, a
    /// pull checked against it, vouches for them), else from the bytes `wasm` reads, which must
    /// be checked against `sha256` by whoever gives them.
    pub fn load_by_digest(
        &self,
        sha256: &str,
        size: usize,
        wasm: impl FnOnce() -> Result<Vec<u8>>,
        source: &str,
        ctx: &Context,
    ) -> Result<Plugin> {
        match self.load_compiled(sha256, size, source, ctx) {
            Some(loaded) => loaded,
            None => self.load_hashed(&wasm()?, sha256.to_owned(), source, ctx),
        }
    }

    /// Loads the plugin whose bytes have this `sha256` (hex) and `size` from the compile cache
    /// alone, if it holds it (`None`: it does not, or there is no cache).
    fn load_compiled(
        &self,
        sha256: &str,
        size: usize,
        source: &str,
        ctx: &Context,
    ) -> Option<Result<Plugin>> {
        let component = self.cache.as_ref()?.load_compiled(&self.engine, sha256)?;
        Some(
            self.link(component, true, sha256.to_owned(), size, source, ctx)
                .map(|(plugin, _)| plugin)
                .map_err(|failure| Error::Load {
                    plugin: source.to_owned(),
                    reason: failure.reason,
                }),
        )
    }

    /// The steps of a load after the compile: what the component is, its exports and imports
    /// checked against the contract and the sandbox, linked, and its description.
    fn link(
        &self,
        component: Component,
        from_cache: bool,
        sha256: String,
        size: usize,
        source: &str,
        ctx: &Context,
    ) -> std::result::Result<(Plugin, Anatomy), LoadFailure> {
        let ty = component.component_type();
        let anatomy = Anatomy {
            sha256: sha256.clone(),
            size,
            imports: ty
                .imports(&self.engine)
                .map(|(n, _)| n.to_owned())
                .collect(),
            exports: ty
                .exports(&self.engine)
                .map(|(n, _)| n.to_owned())
                .collect(),
        };
        let fail = |step: Step, reason: String| LoadFailure {
            step,
            reason,
            anatomy: Some(anatomy.clone()),
        };
        check_exports(&anatomy.exports).map_err(|e| fail(Step::Contract, e))?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(|e| {
            fail(
                Step::Imports,
                format!("needs imports this host does not give plugins: {e:#}"),
            )
        })?;
        let pre = bindings::Pre::new(instance_pre, &anatomy.exports).map_err(|e| {
            fail(
                Step::Types,
                format!("does not match the plugin world: {e:#}"),
            )
        })?;
        let inner = Arc::new(Inner {
            source: source.to_owned(),
            sha256,
            pre,
            engine: self.engine.clone(),
            limits: self.limits,
            from_cache,
        });
        let info = self
            .description(&inner, ctx)
            .map_err(|e| fail(Step::Describe, e))?;
        Ok((
            Plugin {
                inner,
                info: Arc::new(info),
            },
            anatomy,
        ))
    }

    /// What the plugin says about itself under `ctx`: from the cache when this component has
    /// described itself under this context before (`describe` is a pure function of the two),
    /// else by calling it, checking the answer, and caching it. The cache holds the checked
    /// description in the host's form (schemas as JSON, not as text inside JSON), so a load
    /// parses each schema once and does not check it again (docs/benchmarks.md, "Plugin
    /// load"). Whoever can write the cache can already change what the host runs (the compiled
    /// components are there too).
    fn description(&self, inner: &Inner, ctx: &Context) -> std::result::Result<PluginInfo, String> {
        if let Some(cache) = &self.cache
            && let Some(info) = cache
                .load_description::<KeptInfo>(&inner.sha256, ctx)
                .and_then(KeptInfo::into_info)
        {
            return Ok(info);
        }
        let raw = inner.describe_raw(ctx).map_err(|e| e.to_string())?;
        let info = bindings::plugin_info(raw.0, raw.1, raw.2)
            .map_err(|e| PluginError::BadDescription(e).to_string())?;
        if let Some(cache) = &self.cache {
            cache.store_description(&inner.sha256, ctx, &KeptInfo::of(&info));
        }
        Ok(info)
    }
}

/// A description as the compile cache keeps it: each distinct schema once, which the Kinds
/// name by index. A plugin's facade Kinds share one spec schema (the service plugin's seven
/// Kinds one of 14 KB): read back, it is parsed once and copied, not parsed seven times.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptInfo {
    schemas: Vec<Value>,
    /// For each Kind, in order: the index of its spec schema, and of its status schema.
    kinds: Vec<(usize, Option<usize>)>,
    /// The description, each of its schemas left null.
    info: PluginInfo,
}

impl KeptInfo {
    fn of(info: &PluginInfo) -> Self {
        let mut schemas: Vec<Value> = Vec::new();
        let mut index = |schema: &Value| match schemas.iter().position(|s| s == schema) {
            Some(i) => i,
            None => {
                schemas.push(schema.clone());
                schemas.len() - 1
            }
        };
        let kinds = info
            .kinds
            .iter()
            .map(|k| {
                (
                    index(&k.spec_schema),
                    k.status_schema.as_ref().map(&mut index),
                )
            })
            .collect();
        let mut info = info.clone();
        for k in &mut info.kinds {
            k.spec_schema = Value::Null;
            k.status_schema = k.status_schema.as_ref().map(|_| Value::Null);
        }
        Self {
            schemas,
            kinds,
            info,
        }
    }

    /// The description; `None` when the indices do not fit the schemas (not a file this host
    /// wrote).
    fn into_info(self) -> Option<PluginInfo> {
        let Self {
            mut schemas,
            kinds,
            mut info,
        } = self;
        if kinds.len() != info.kinds.len() {
            return None;
        }
        // How many Kinds still need each schema: the last takes it, the others copy it.
        let mut uses = vec![0usize; schemas.len()];
        for i in kinds
            .iter()
            .flat_map(|(spec, status)| [Some(*spec), *status])
            .flatten()
        {
            *uses.get_mut(i)? += 1;
        }
        let mut take = |i: usize| {
            uses[i] -= 1;
            if uses[i] == 0 {
                std::mem::take(&mut schemas[i])
            } else {
                schemas[i].clone()
            }
        };
        for (k, (spec, status)) in info.kinds.iter_mut().zip(kinds) {
            k.spec_schema = take(spec);
            k.status_schema = status.map(&mut take);
        }
        Some(info)
    }
}

/// The engine's settings, with the instance pool `pool` (none: an engine that only compiles).
/// The pool holds the instances of the calls in flight and is reserved when the engine is made
/// (gigabytes of address space); the compiler process has no use for it. The pool is not part
/// of the compiled form: a component compiled without it loads in an engine with it (tested).
fn engine_config(pool: Option<PoolingAllocationConfig>) -> Config {
    let mut config = Config::new();
    // Set, not left to `WASMTIME_BACKTRACE_DETAILS` (wasmtime's default reads it): it changes
    // the compiled form, and the compiler process runs with no environment, so an operator
    // with that variable set could use none of what that process compiles.
    config
        .epoch_interruption(true)
        .wasm_backtrace_details(WasmBacktraceDetails::Disable);
    if let Some(pool) = pool {
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// The instance pool of a runtime whose calls run under `limits`.
fn instance_pool(limits: &Limits) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::default();
    // Instances are made per call; these bound how many calls run at once.
    pool.total_component_instances(256)
        .total_core_instances(2048)
        .total_memories(512)
        .total_tables(2048)
        .max_memories_per_component(8)
        .max_tables_per_component(32)
        .max_core_instances_per_component(64)
        .max_memory_size(limits.memory_bytes)
        .linear_memory_keep_resident(4 << 20)
        .table_keep_resident(64 << 10);
    pool
}

/// What compiling a component into the cache came to (`host compile-component`).
#[derive(Debug)]
pub(crate) enum Compiled {
    /// Compiled and written.
    Written,
    /// It does not compile: wasmtime's reason, as a load reports it.
    Invalid(String),
    /// Compiled, but the cache could not be written.
    Unwritable(std::io::Error),
}

/// Compiles `wasm` into `cache` as a load that does not find it there would, with an engine
/// that only compiles (no instance pool): what `host compile-component` does. `sha256` must be
/// the digest of `wasm`.
pub(crate) fn compile_into_cache(cache: &Cache, wasm: &[u8], sha256: &str) -> Result<Compiled> {
    let engine = Engine::new(&engine_config(None)).map_err(|e| Error::Engine(format!("{e:#}")))?;
    Ok(match cache.compile_into(&engine, wasm, sha256) {
        Ok((_, Ok(()))) => Compiled::Written,
        Ok((_, Err(e))) => Compiled::Unwritable(e),
        Err(e) => Compiled::Invalid(format!("{e:#}")),
    })
}

/// Increments the engine's epoch every [`TICK`] for as long as the engine lives.
fn spawn_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(TICK);
            }
        })
        .map(drop)
        .unwrap_or_else(|e| {
            tracing::error!("cannot start the epoch thread, plugin deadlines will not fire: {e}")
        });
}

/// Checks that the component exports `reconciler` from a compatible version of the package.
fn check_exports(names: &[String]) -> std::result::Result<(), String> {
    let ours: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with(INTERFACE))
        .collect();
    if ours.is_empty() {
        return Err(format!(
            "does not export `{INTERFACE}` (it exports: {}); build it against wit/ ({PACKAGE}@{PACKAGE_MAJOR}.x)",
            if names.is_empty() {
                "nothing".to_owned()
            } else {
                names.join(", ")
            }
        ));
    }
    for name in &ours {
        let version = name
            .strip_prefix(INTERFACE)
            .and_then(|v| v.strip_prefix('@'))
            .unwrap_or("");
        let major = version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u64>().ok());
        if major == Some(PACKAGE_MAJOR) {
            return Ok(());
        }
    }
    Err(format!(
        "was built against {} but this host speaks {PACKAGE}@{PACKAGE_MAJOR}.x; rebuild it against this host's wit/",
        ours.iter()
            .map(|n| n.replace("/reconciler", ""))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// What `describe` returned, with what `status-schemas` returned (none before 1.1) and what
/// `references` returned (none before 1.2).
type RawDescription = (
    bindings::wasm_operator::plugin::types::PluginInfo,
    Vec<bindings::wasm_operator::plugin::types::StatusSchema>,
    Vec<bindings::wasm_operator::plugin::types::Reference>,
);

struct Inner {
    source: String,
    sha256: String,
    pre: bindings::Pre,
    engine: Engine,
    limits: Limits,
    from_cache: bool,
}

impl Inner {
    fn describe_raw(&self, ctx: &Context) -> std::result::Result<RawDescription, PluginError> {
        let wit_ctx = bindings::context(ctx);
        sandbox::call(&self.pre, &self.engine, self.limits, |p, store| {
            let info = p.reconciler.call_describe(&mut *store, &wit_ctx)?;
            let status = match &p.reporting {
                Some(r) => r.call_status_schemas(&mut *store, &wit_ctx)?,
                None => Vec::new(),
            };
            let references = match &p.admission {
                Some(a) => a.call_references(&mut *store, &wit_ctx)?,
                None => Vec::new(),
            };
            Ok((info, status, references))
        })
    }

    fn describe(&self, ctx: &Context) -> std::result::Result<PluginInfo, PluginError> {
        let (info, status, references) = self.describe_raw(ctx)?;
        bindings::plugin_info(info, status, references).map_err(PluginError::BadDescription)
    }
}

/// A loaded plugin. Cheap to clone; calls from several threads run in separate instances.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<Inner>,
    /// Shared by every clone: it holds each Kind's schemas, a megabyte or more for a plugin
    /// whose Kinds embed Kubernetes types.
    info: Arc<PluginInfo>,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.info.name)
            .field("source", &self.inner.source)
            .field("sha256", &self.inner.sha256)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// What the plugin said about itself when it was loaded.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The plugin's name (from `describe`).
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Where the plugin was loaded from.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// The limits its calls run under.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Whether the compiled component came from the on-disk cache (no compilation at load).
    pub fn from_cache(&self) -> bool {
        self.inner.from_cache
    }

    /// The sha256 of the component's bytes.
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }

    /// The Kind `kind` of group `group`, if the plugin serves it.
    pub fn kind(&self, group: &str, kind: &str) -> Option<&KindInfo> {
        self.info
            .kinds
            .iter()
            .find(|k| k.group == group && k.kind == kind)
    }

    /// Calls the plugin's `describe` in a fresh instance (the host does this at load, unless the
    /// compile cache holds this component's description under the same context).
    pub fn describe(&self, ctx: &Context) -> std::result::Result<PluginInfo, PluginError> {
        self.inner.describe(ctx)
    }

    /// Whether the plugin exports `reporting` (contract 1.1): it returns warnings with its
    /// manifests, and may compute status fields.
    pub fn reports(&self) -> bool {
        self.inner.pre.reports()
    }

    /// Whether the plugin exports `admission` (contract 1.2): it declares the references its
    /// Kinds' specs make (none at all before 1.2).
    pub fn admits(&self) -> bool {
        self.inner.pre.admits()
    }

    /// Renders `resource` in a fresh instance; each manifest is parsed as a JSON object. Any
    /// warnings are dropped: [`Plugin::render_reported`] keeps them.
    pub fn render(
        &self,
        resource: &crate::types::Resource,
        ctx: &Context,
    ) -> std::result::Result<Vec<Value>, PluginError> {
        parse_manifests(self.render_text(resource, ctx)?, self.inner.limits)
    }

    /// Renders `resource` in a fresh instance: the manifests parsed, and the plugin's warnings
    /// (none from a 1.0 plugin).
    pub fn render_reported(
        &self,
        resource: &crate::types::Resource,
        ctx: &Context,
    ) -> std::result::Result<(Vec<Value>, Vec<crate::types::Warning>), PluginError> {
        let (texts, warnings) = self.render_raw(resource, ctx)?;
        Ok((parse_manifests(texts, self.inner.limits)?, warnings))
    }

    /// Renders `resource` in a fresh instance and returns the manifests as the plugin wrote them
    /// (JSON texts, within the output cap), before the host parses them.
    pub fn render_text(
        &self,
        resource: &crate::types::Resource,
        ctx: &Context,
    ) -> std::result::Result<Vec<String>, PluginError> {
        Ok(self.render_raw(resource, ctx)?.0)
    }

    /// The manifests' texts and the warnings, through `reporting.render` when the plugin
    /// exports it, else `reconciler.render`.
    fn render_raw(
        &self,
        resource: &crate::types::Resource,
        ctx: &Context,
    ) -> std::result::Result<(Vec<String>, Vec<crate::types::Warning>), PluginError> {
        let wit_ctx = bindings::context(ctx);
        let wit_resource = bindings::resource(resource);
        let limits = self.inner.limits;
        let out = sandbox::call(&self.inner.pre, &self.inner.engine, limits, |p, store| {
            p.render(store, &wit_resource, &wit_ctx)
        })?;
        capped_reported(out, limits)
    }

    /// The status fields the plugin computes for `resource` from its `children` as observed, in
    /// a fresh instance: `None` when the plugin computes none (a 1.0 plugin, or a Kind without
    /// a status schema). Fields its Kind's schema does not declare are refused.
    pub fn status(
        &self,
        resource: &crate::types::Resource,
        children: &[crate::types::ObservedChild],
        ctx: &Context,
    ) -> std::result::Result<Option<serde_json::Map<String, Value>>, PluginError> {
        let (group, _) = crate::gvk::split_api_version(&resource.api_version);
        let Some(schema) = self
            .kind(group, &resource.kind)
            .and_then(|k| k.status_schema.as_ref())
        else {
            return Ok(None);
        };
        if !self.reports() {
            return Ok(None);
        }
        let wit_ctx = bindings::context(ctx);
        let wit_resource = bindings::resource(resource);
        let wit_children: Vec<_> = children.iter().map(bindings::observed_child).collect();
        let limits = self.inner.limits;
        let out = sandbox::call(
            &self.inner.pre,
            &self.inner.engine,
            limits,
            |p, store| match &p.reporting {
                Some(r) => r.call_status(store, &wit_resource, &wit_children, &wit_ctx),
                None => Ok(Ok("{}".to_owned())),
            },
        )?;
        let text = capped(out.map(|t| vec![t]), limits)?
            .pop()
            .unwrap_or_default();
        let fields = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(fields)) => fields,
            Ok(_) => return Err(PluginError::BadStatus("not a JSON object".into())),
            Err(e) => return Err(PluginError::BadStatus(e.to_string())),
        };
        let declared = schema.get("properties").and_then(Value::as_object);
        if let Some(field) = fields
            .keys()
            .find(|k| !declared.is_some_and(|d| d.contains_key(k.as_str())))
        {
            return Err(PluginError::BadStatus(format!(
                "`{field}` is not among the status fields {} declares",
                resource.kind
            )));
        }
        // Each value as its schema says, as the API server will check it: one it refused would
        // hold back the whole status, the host's conditions with it.
        // (Its `$ref`s were inlined when the plugin described itself.)
        let fields = Value::Object(fields);
        crate::schema::check(
            schema,
            &fields,
            "status",
            crate::schema::UnknownFields::Refuse,
        )
        .map_err(|e| PluginError::BadStatus(e.to_string()))?;
        match fields {
            Value::Object(fields) => Ok(Some(fields)),
            _ => Ok(None),
        }
    }

    /// One instance kept for several renders, for measuring what isolation costs. A session
    /// shares memory between calls, so the host never uses one for resources: each render of
    /// [`Plugin::render`] gets a fresh instance.
    pub fn session(&self) -> std::result::Result<Session, PluginError> {
        let limits = self.inner.limits;
        let (mut store, stderr) = sandbox::store(&self.inner.engine, limits);
        let instance = self.inner.pre.instantiate(&mut store);
        let bindings = sandbox::check(instance, &store, &stderr, limits)?;
        Ok(Session {
            store,
            bindings,
            stderr,
            limits,
        })
    }
}

/// A plugin instance reused across renders; see [`Plugin::session`].
pub struct Session {
    store: wasmtime::Store<sandbox::Sandbox>,
    bindings: bindings::Instance,
    stderr: wasmtime_wasi::p2::pipe::MemoryOutputPipe,
    limits: Limits,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Renders on the session's instance; each manifest is parsed as a JSON object.
    pub fn render(
        &mut self,
        resource: &crate::types::Resource,
        ctx: &Context,
    ) -> std::result::Result<Vec<Value>, PluginError> {
        let limits = self.limits;
        parse_manifests(self.render_text(resource, ctx)?, limits)
    }

    /// Renders on the session's instance and returns the manifests as JSON texts.
    pub fn render_text(
        &mut self,
        resource: &crate::types::Resource,
        ctx: &Context,
    ) -> std::result::Result<Vec<String>, PluginError> {
        sandbox::arm_deadline(&mut self.store, self.limits);
        let (resource, ctx) = (bindings::resource(resource), bindings::context(ctx));
        let out = self.bindings.render(&mut self.store, &resource, &ctx);
        let out = sandbox::check(out, &self.store, &self.stderr, self.limits)?;
        Ok(capped_reported(out, self.limits)?.0)
    }
}

/// What `render` returned, as the manifests' texts within the output and count caps, or the
/// plugin's error within the output cap (and cut to a length a status condition can hold).
fn capped(
    out: std::result::Result<Vec<String>, bindings::wasm_operator::plugin::types::RenderError>,
    limits: Limits,
) -> std::result::Result<Vec<String>, PluginError> {
    let manifests = out.map_err(|e| {
        let bytes = e.field.len().saturating_add(e.message.len());
        if bytes > limits.output_bytes {
            return PluginError::ErrorTooLarge {
                bytes,
                limit: limits.output_bytes,
            };
        }
        PluginError::Render {
            field: bounded(e.field, MAX_ERROR_FIELD),
            message: bounded(e.message, MAX_ERROR_MESSAGE),
        }
    })?;
    if manifests.len() > limits.max_manifests {
        return Err(PluginError::TooManyManifests {
            count: manifests.len(),
            limit: limits.max_manifests,
        });
    }
    let total: usize = manifests.iter().map(String::len).sum();
    if total > limits.output_bytes {
        return Err(PluginError::OutputTooLarge {
            bytes: total,
            limit: limits.output_bytes,
        });
    }
    Ok(manifests)
}

/// The most warnings one render may return.
pub const MAX_WARNINGS: usize = 20;

/// As [`capped`], for a render with warnings: the warnings count toward the output cap, at
/// most [`MAX_WARNINGS`] are kept, each cut to what a condition can hold.
fn capped_reported(
    out: bindings::Rendered,
    limits: Limits,
) -> std::result::Result<(Vec<String>, Vec<crate::types::Warning>), PluginError> {
    let (manifests, warnings) = match out {
        Ok((m, w)) => (Ok(m), w),
        Err(e) => (Err(e), Vec::new()),
    };
    let warning_bytes: usize = warnings
        .iter()
        .map(|w| w.field.len().saturating_add(w.message.len()))
        .sum();
    let manifests = capped(manifests, limits)?;
    let total = manifests
        .iter()
        .map(String::len)
        .sum::<usize>()
        .saturating_add(warning_bytes);
    if total > limits.output_bytes {
        return Err(PluginError::OutputTooLarge {
            bytes: total,
            limit: limits.output_bytes,
        });
    }
    let warnings = warnings
        .into_iter()
        .take(MAX_WARNINGS)
        .map(|w| crate::types::Warning {
            field: bounded(w.field, MAX_ERROR_FIELD),
            message: bounded(w.message, MAX_ERROR_MESSAGE),
        })
        .collect();
    Ok((manifests, warnings))
}

/// An upper bound on the JSON values in `text`, counted without parsing it: one for the whole,
/// and one for each `[`, `{`, `,` and `:` outside strings.
fn values_in(text: &str) -> usize {
    let (mut values, mut in_string, mut escaped) = (1_usize, false, false);
    for b in text.bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b'[' | b'{' | b',' | b':') {
            values += 1;
        }
    }
    values
}

/// Parses each manifest text as a JSON object, once their values are known to fit what their
/// parsed form may take ([`Limits::max_values`]).
fn parse_manifests(
    manifests: Vec<String>,
    limits: Limits,
) -> std::result::Result<Vec<Value>, PluginError> {
    let values = manifests
        .iter()
        .map(|m| values_in(m))
        .fold(0_usize, usize::saturating_add);
    if values > limits.max_values() {
        return Err(PluginError::TooManyValues {
            values,
            limit: limits.max_values(),
        });
    }
    manifests
        .iter()
        .enumerate()
        .map(|(i, m)| match serde_json::from_str::<Value>(m) {
            Ok(v @ Value::Object(_)) => Ok(v),
            Ok(_) => Err(PluginError::BadManifest {
                index: i,
                reason: "not a JSON object".into(),
            }),
            Err(e) => Err(PluginError::BadManifest {
                index: i,
                reason: e.to_string(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindings::wasm_operator::plugin::types::RenderError as WitRenderError;

    #[test]
    fn a_number_in_a_manifest_is_read_as_the_f64_its_text_names() {
        // serde_json's default parser reads these one unit in the last place off;
        // `float_roundtrip` (the workspace's Cargo.toml) reads what `str::parse` reads.
        let text = r#"{"v":117.63331139400017,"w":0.9215686321258545}"#;
        let parsed = parse_manifests(vec![text.to_owned()], Limits::default()).unwrap();
        for key in ["v", "w"] {
            let written = &text[text.find(&format!("\"{key}\":")).unwrap() + 4..];
            let written = &written[..written.find([',', '}']).unwrap()];
            assert_eq!(
                parsed[0][key].as_f64(),
                written.parse::<f64>().ok(),
                "{key}"
            );
        }
        assert_eq!(serde_json::to_string(&parsed[0]).unwrap(), text);
    }

    #[test]
    fn a_cached_description_is_the_description_checked() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(Limits::default(), Some(Cache::new(dir.path()))).unwrap();
        let described = Runtime::new(Limits::default(), None).unwrap();
        for ctx in [
            Context::default(),
            Context {
                api_group: "lux.cloud".into(),
                ..Context::default()
            },
        ] {
            for b in BUILTINS {
                let fresh = described.load_builtin(&b, &ctx).unwrap();
                runtime.load_builtin(&b, &ctx).unwrap();
                let cached = runtime.load_builtin(&b, &ctx).unwrap();
                assert!(cached.from_cache(), "{}", b.name);
                assert_eq!(cached.info(), fresh.info(), "{}", b.name);
            }
        }
    }

    #[test]
    fn a_kept_description_holds_each_schema_once_and_gives_back_the_same() {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let ctx = Context::default();
        for b in BUILTINS {
            let info = runtime.load_builtin(&b, &ctx).unwrap().info().clone();
            let kept = KeptInfo::of(&info);
            let distinct: Vec<&Value> = info
                .kinds
                .iter()
                .flat_map(|k| [Some(&k.spec_schema), k.status_schema.as_ref()])
                .flatten()
                .fold(Vec::new(), |mut seen, s| {
                    if !seen.contains(&s) {
                        seen.push(s);
                    }
                    seen
                });
            assert_eq!(kept.schemas.len(), distinct.len(), "{}", b.name);
            let json = serde_json::to_vec(&kept).unwrap();
            let back: KeptInfo = serde_json::from_slice(&json).unwrap();
            assert_eq!(back.into_info().as_ref(), Some(&info), "{}", b.name);
        }
        // The service plugin's seven Kinds share one spec schema.
        let service = runtime.load_builtin(&BUILTINS[0], &ctx).unwrap();
        assert!(service.info().kinds.len() > 1);
        assert_eq!(KeptInfo::of(service.info()).schemas.len(), 1);
        // Indices that do not fit are not a description.
        let mut wrong = KeptInfo::of(service.info());
        wrong.kinds[0].0 = 7;
        assert!(wrong.into_info().is_none());
        let mut short = KeptInfo::of(service.info());
        short.kinds.pop();
        assert!(short.into_info().is_none());
    }

    #[test]
    fn a_load_from_the_cache_takes_the_kept_description_when_it_fits() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(Limits::default(), Some(Cache::new(dir.path()))).unwrap();
        let ctx = Context::default();
        let b = BUILTINS.iter().find(|b| b.name == "kvcluster").unwrap();
        let info = runtime.load_builtin(b, &ctx).unwrap().info().clone();
        // What the cache keeps is what a load gives, not what describe() would say.
        let mut marked = info.clone();
        marked.version = "from-the-cache".into();
        let cache = Cache::new(dir.path());
        cache.store_description(b.sha256, &ctx, &KeptInfo::of(&marked));
        let loaded = runtime.load_builtin(b, &ctx).unwrap();
        assert_eq!(loaded.info().version, "from-the-cache");
        // A kept description whose indices do not fit is not used: describe() answers again.
        let mut wrong = KeptInfo::of(&marked);
        assert!(wrong.kinds[0].1.is_some(), "kvcluster has a status schema");
        wrong.kinds[0].1 = Some(9);
        cache.store_description(b.sha256, &ctx, &wrong);
        assert_eq!(runtime.load_builtin(b, &ctx).unwrap().info(), &info);
    }

    #[test]
    fn a_plugin_known_by_digest_loads_from_the_compile_cache_without_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(Limits::default(), Some(Cache::new(dir.path()))).unwrap();
        let ctx = Context::default();
        let b = BUILTINS.iter().find(|b| b.name == "kvcluster").unwrap();
        // Not compiled yet: the bytes are read.
        let mut read = 0;
        let first = runtime
            .load_by_digest(
                b.sha256,
                b.wasm.len(),
                || {
                    read += 1;
                    Ok(b.wasm.to_vec())
                },
                "kvcluster",
                &ctx,
            )
            .unwrap();
        assert_eq!((read, first.from_cache()), (1, false));
        // Compiled: they are not.
        let second = runtime
            .load_by_digest(
                b.sha256,
                b.wasm.len(),
                || panic!("read though compiled"),
                "kvcluster",
                &ctx,
            )
            .unwrap();
        assert!(second.from_cache());
        assert_eq!(second.sha256(), b.sha256);
        // A reader's error is the load's.
        let e = runtime
            .load_by_digest(
                &"0".repeat(64),
                1,
                || {
                    Err(Error::Load {
                        plugin: "p".into(),
                        reason: "damaged".into(),
                    })
                },
                "p",
                &ctx,
            )
            .unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
    }

    fn limits(output_bytes: usize, max_manifests: usize) -> Limits {
        Limits {
            output_bytes,
            max_manifests,
            ..Limits::default()
        }
    }

    fn error(field: &str, message: &str) -> std::result::Result<Vec<String>, WitRenderError> {
        Err(WitRenderError {
            field: field.to_owned(),
            message: message.to_owned(),
        })
    }

    #[test]
    fn an_error_over_the_output_cap_is_refused_by_its_size() {
        let e = capped(error("spec.x", &"m".repeat(100)), limits(100, 10)).unwrap_err();
        assert_eq!(
            e,
            PluginError::ErrorTooLarge {
                bytes: 106,
                limit: 100
            }
        );
    }

    #[test]
    fn an_error_within_the_output_cap_is_kept_and_cut_to_the_message_limits() {
        let e = capped(error("spec.x", "short"), Limits::default()).unwrap_err();
        assert_eq!(e.to_string(), "spec.x: short");
        let field = "f".repeat(MAX_ERROR_FIELD + 1);
        let message = "m".repeat(MAX_ERROR_MESSAGE + 10);
        let e = capped(error(&field, &message), Limits::default()).unwrap_err();
        assert_eq!(
            e,
            PluginError::Render {
                field: "f".repeat(MAX_ERROR_FIELD) + "… (1 more bytes)",
                message: "m".repeat(MAX_ERROR_MESSAGE) + "… (10 more bytes)",
            }
        );
    }

    #[test]
    fn more_manifests_than_the_cap_are_refused_even_when_empty() {
        let e = capped(Ok(vec![String::new(); 11]), limits(100, 10)).unwrap_err();
        assert_eq!(
            e,
            PluginError::TooManyManifests {
                count: 11,
                limit: 10
            }
        );
        assert_eq!(
            capped(Ok(vec![String::new(); 10]), limits(100, 10)).unwrap(),
            vec![String::new(); 10]
        );
    }

    #[test]
    fn manifests_over_the_byte_cap_are_refused() {
        let e = capped(Ok(vec!["x".repeat(60), "y".repeat(41)]), limits(100, 10)).unwrap_err();
        assert_eq!(
            e,
            PluginError::OutputTooLarge {
                bytes: 101,
                limit: 100
            }
        );
    }

    #[test]
    fn values_are_counted_outside_strings_only() {
        assert_eq!(values_in("0"), 1);
        assert_eq!(values_in("[0,0,0]"), 4);
        assert_eq!(values_in(r#"{"a":1,"b":[2]}"#), 6);
        assert_eq!(
            values_in(r#"{"a":"[,:{\"x\"]"}"#),
            3,
            "brackets in a string"
        );
        assert_eq!(
            values_in(r#"["\\",0]"#),
            3,
            "an escaped backslash ends no string"
        );
    }

    #[test]
    fn manifests_denser_than_the_host_parses_are_refused_before_parsing() {
        let limits = Limits::default();
        // A real manifest holds a value in every 10 to 20 bytes: the whole output cap of them
        // parses.
        let real = format!(
            r#"{{"kind":"ConfigMap","data":{{{}"end":"x"}}}}"#,
            r#""key-000000":"a value, of a few words","#.repeat(limits.output_bytes / 48)
        );
        assert!(real.len() <= limits.output_bytes);
        assert_eq!(parse_manifests(vec![real], limits).unwrap().len(), 1);
        // The same bytes of `[0,0,...]` would take 16 times its text once parsed.
        let dense = format!(r#"{{"x":[{}0]}}"#, "0,".repeat(limits.output_bytes / 2 - 8));
        assert!(dense.len() <= limits.output_bytes);
        let e = parse_manifests(vec![dense], limits).unwrap_err();
        assert!(
            matches!(e, PluginError::TooManyValues { values, limit }
                if limit == limits.max_values() && values > limit),
            "{e:?}"
        );
        assert_eq!(e.reason(), "PluginMisbehaved");
    }
}
