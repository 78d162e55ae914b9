//! Compiled components on disk, keyed by the wasm's sha256, the wasmtime version and the
//! engine's compatibility hash, so that a second start does not compile again; and what each
//! component's `describe` returned, keyed by its sha256 and the context, so that a second start
//! does not call it again.
//!
//! A plugin given as a file is known by the sha256 of its bytes; so that a load from the cache
//! does not read and hash the whole file again, the cache also remembers, per file, the digest
//! it had and what `stat` said of it then (see [`Cache::file_digest`]).
//!
//! Every use of an entry renews its modification time; whenever the host writes an entry it
//! removes the entries nobody has used for [`MAX_AGE`] (old plugin versions, other wasmtime
//! versions), so the directory does not grow without bound.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, EngineWeak};

use crate::types::Context;

/// How long a cache entry may go unused before a host that writes to the cache removes it.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// A directory of precompiled components (`<sha256>-wasmtime<version>-<engine>.cwasm`).
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
    /// Where components are compiled: in this process (`None`), or in a process of their own.
    apart: Option<Apart>,
    /// Each engine's part of a compiled file's name (see [`Cache::path`]), computed once:
    /// wasmtime hashes every setting of the engine for it, a tenth of the service plugin's
    /// load when it was computed at each.
    /// Engines are held weakly: a cache (cloned into each runtime made from another) must not
    /// keep an engine, its instance pool and its epoch thread, alive.
    engines: Arc<Engines>,
}

/// The engines a cache has named files for, each with its hash (see [`Cache::engine_hash`]).
#[derive(Default)]
struct Engines(Mutex<Vec<(EngineWeak, u64)>>);

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Engines")
    }
}

/// Compiling in a process of its own: `host compile-component`, run from this executable with
/// the plugin on its stdin, writes the compiled file into the cache, which the caller then
/// maps. Cranelift's working memory (tens of MiB for the built-in plugins, more for an
/// interpreter) is then that process's and goes with it: compiled in the operator's own
/// process, glibc kept it, and the operator on 10,000 Services peaked 40 MiB higher on a start
/// with an empty cache (an `emptyDir`, as the chart's) than with a full one. A compiler that
/// crashes on a hostile component takes only that process down.
#[derive(Debug, Clone)]
pub(crate) struct Apart {
    /// The `host` executable (`/proc/self/exe` on Linux: the running binary, even once the
    /// file it came from was replaced).
    pub exe: PathBuf,
    /// The most memory, in bytes, the compiler process may take (its data segment: see
    /// `host compile-component --memory-cap`); none, uncapped.
    pub memory_cap: Option<u64>,
}

/// Held while a compiler process runs: one at a time per operator, so that the memory room the
/// operator keeps for compiling (the chart counts one cap) holds however many plugins a start
/// or a burst of `Plugin` resources asks for at once.
static COMPILING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The longest a compile in a process of its own may take: minutes, where the JavaScript and
/// Python plugins compile in seconds (docs/benchmarks.md).
const COMPILE_DEADLINE: Duration = Duration::from_secs(300);

/// The threads a compiler process compiles with. Its memory grows with them (the image's
/// binary compiling the 12 MB JavaScript example: 300 MiB with one, 317 with two, 336 with
/// four, 374 with eight), and left to itself it would start one per CPU of the node, so a cap
/// that holds on one node would fail on a bigger one. Two take 12.8 s where one takes 19.7.
pub(crate) const COMPILE_THREADS: usize = 2;

/// The most of a compiler process's stderr kept for a load's error.
const MAX_SAID: usize = 4096;

/// Why a compile in a process of its own gave no compiled file.
#[derive(Debug, PartialEq, Eq)]
enum ApartFailure {
    /// The component does not compile: wasmtime's reason, the load's failure.
    Invalid(String),
    /// The compiler process failed otherwise (it ran out of memory under its cap, died, or was
    /// stopped): the load fails with this, and the component is not compiled here instead.
    Compiler(String),
    /// The process could not be run: the component is compiled here instead.
    Unavailable(String),
}

/// A compiler process's failure that is not wasmtime's judgement of the component (out of
/// memory, killed, stopped): a load says it as it is, not as an invalid component.
#[derive(Debug)]
pub(crate) struct CompilerFailed(pub String);

impl std::fmt::Display for CompilerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CompilerFailed {}

/// What a compiler process's end means: its exit code (none: killed by a signal), its status
/// as said, what it said on stderr, and its memory cap. Exit 1 is wasmtime's verdict on the
/// component, 3 a cache it could not write (after compiling). Under a cap, every other failure
/// fails the load: compiling here instead would be compiling without the cap.
fn judge(
    code: Option<i32>,
    status: &str,
    said: &str,
    cap: Option<u64>,
) -> Result<(), ApartFailure> {
    let said = said
        .lines()
        .filter(|line| !line.starts_with("note: run with `RUST_BACKTRACE"))
        .collect::<Vec<_>>()
        .join("; ");
    let nothing = |said: &str| {
        if said.is_empty() {
            "nothing said".to_owned()
        } else {
            said.to_owned()
        }
    };
    match (code, cap) {
        (Some(0), _) => Ok(()),
        // wasmtime refused a mapping (`ENOMEM`): under a cap, the cap's doing.
        (Some(1), Some(cap)) if said.contains("(os error 12)") => {
            Err(ApartFailure::Compiler(over_cap(cap, &said)))
        }
        (Some(1), _) if !said.is_empty() => Err(ApartFailure::Invalid(said)),
        (Some(3), _) => Err(ApartFailure::Unavailable(format!(
            "it could not write the cache: {}",
            nothing(&said)
        ))),
        (_, Some(cap)) if out_of_memory(&said) => Err(ApartFailure::Compiler(over_cap(cap, &said))),
        (None, Some(cap)) => Err(ApartFailure::Compiler(format!(
            "the compiler process was killed ({status}) under its memory cap of {}: it ran out \
             of memory, or crashed ({})",
            crate::units::mib(cap),
            nothing(&said)
        ))),
        (None, None) => Err(ApartFailure::Compiler(format!(
            "the compiler process was killed ({status}): out of memory, or a compiler crash"
        ))),
        (Some(code), Some(_)) => Err(ApartFailure::Compiler(format!(
            "the compiler process exited with {code}: {}",
            nothing(&said)
        ))),
        // Anything else (a `host` without this command) is not the component's fault.
        (Some(code), None) => Err(ApartFailure::Unavailable(format!(
            "it exited with {code}: {}",
            nothing(&said)
        ))),
    }
}

/// The failure of a compile that needed more memory than `cap` bytes.
fn over_cap(cap: u64, said: &str) -> String {
    format!(
        "compiling it needs more memory than the compiler may take ({}, --compile-memory): \
         raise it (plugins built with componentize-js or componentize-py need 384Mi with the \
         operator's image, 480Mi with a glibc build: docs/install.md, \"Memory\"). The compiler \
         said: {said}",
        crate::units::mib(cap)
    )
}

/// Whether a compiler process that failed said it ran out of memory: Rust's allocator when an
/// allocation fails ("memory allocation of N bytes failed", then an abort), a buffer that could
/// not grow ("out of memory"), or a mapping the kernel refused (`ENOMEM`, as wasmtime reports
/// an `mmap` that failed).
fn out_of_memory(said: &str) -> bool {
    ["memory allocation of", "out of memory", "os error 12"]
        .iter()
        .any(|sign| said.contains(sign))
}

/// `$WASM_OPERATOR_CACHE`, else `$XDG_CACHE_HOME/wasm-operator`, else `~/.cache/wasm-operator`,
/// each with `components/` below it.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("WASM_OPERATOR_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("wasm-operator"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/wasm-operator"))
        })?;
    Some(base.join("components"))
}

impl Cache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            apart: None,
            engines: Arc::default(),
        }
    }

    /// The same cache, compiling in a process of its own (see [`Apart`]).
    pub(crate) fn compiling_apart(self, apart: Apart) -> Self {
        Self {
            apart: Some(apart),
            ..self
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the compiled form of the component with this sha256 lives for `engine`.
    pub fn path(&self, engine: &Engine, sha256: &str) -> PathBuf {
        let version = env!("WASMTIME_VERSION");
        self.dir.join(format!(
            "{sha256}-wasmtime{version}-{:016x}.cwasm",
            self.engine_hash(engine)
        ))
    }

    /// What tells `engine`'s compiled files from those of an engine with other settings.
    fn engine_hash(&self, engine: &Engine) -> u64 {
        let mut engines = self.engines.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, hash)) = engines
            .iter()
            .find(|(e, _)| e.upgrade().is_some_and(|e| Engine::same(&e, engine)))
        {
            return *hash;
        }
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let hash = h.finish();
        engines.retain(|(e, _)| e.upgrade().is_some());
        engines.push((engine.weak(), hash));
        hash
    }

    /// The compiled component of the wasm with this sha256, when this cache holds it: nothing
    /// but the compiled file is read. Its use is recorded (the file's time, which eviction
    /// reads).
    pub(crate) fn load_compiled(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let (component, path) = self.deserialize(engine, sha256)?;
        touch(&path);
        Some(component)
    }

    /// The compiled component of the wasm with this sha256 and its file, when this cache holds
    /// it: wasmtime's part of a load, and no more.
    pub(crate) fn deserialize(
        &self,
        engine: &Engine,
        sha256: &str,
    ) -> Option<(Component, PathBuf)> {
        let path = self.path(engine, sha256);
        if !path.is_file() {
            return None;
        }
        // SAFETY: the file is one this host wrote with `Engine::precompile_component` for the
        // same wasm (its sha256 is in the name) and an engine with the same compatibility
        // hash and wasmtime version (also in the name); wasmtime checks the header, version
        // and engine settings again while deserializing. The file is mapped, not copied: the
        // host only ever replaces cache files by renaming a whole new file over them (see
        // `write_atomically`), which leaves a mapped file's contents as they were. The cache
        // directory belongs to the operator and is never visible to plugins; whoever can
        // write it can already change what the host runs.
        #[allow(
            unsafe_code,
            reason = "loading our own precompiled component, see SAFETY"
        )]
        let loaded = unsafe { Component::deserialize_file(engine, &path) };
        match loaded {
            Ok(c) => Some((c, path)),
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring unusable cached component: {e:#}");
                None
            }
        }
    }

    /// Loads the compiled component, compiling and storing it first when it is not cached; the
    /// flag says whether it came from the cache. A cache that cannot be written is logged and
    /// skipped; it never fails a load.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        wasm: &[u8],
        sha256: &str,
    ) -> wasmtime::Result<(Component, bool)> {
        if let Some(component) = self.load_compiled(engine, sha256) {
            return Ok((component, true));
        }
        if let Some(apart) = &self.apart {
            match self.compile_apart(apart, wasm, sha256) {
                Ok(()) => match self.load_compiled(engine, sha256) {
                    Some(component) => return Ok((component, false)),
                    None => tracing::warn!(
                        sha256,
                        "compiled in a process of its own, but the cache holds no usable file for this engine: compiling here"
                    ),
                },
                Err(ApartFailure::Invalid(reason)) => return Err(wasmtime::Error::msg(reason)),
                Err(ApartFailure::Compiler(reason)) => {
                    return Err(wasmtime::Error::new(CompilerFailed(reason)));
                }
                Err(ApartFailure::Unavailable(reason)) => tracing::warn!(
                    sha256,
                    "cannot compile in a process of its own ({reason}): compiling here"
                ),
            }
        }
        let (compiled, written) = self.compile_into(engine, wasm, sha256)?;
        if let Err(e) = written {
            let path = self.path(engine, sha256);
            tracing::warn!(path = %path.display(), "cannot cache the compiled component: {e}");
        }
        // SAFETY: `compiled` was produced just above by `precompile_component` on this engine
        // (in `compile_into`).
        #[allow(
            unsafe_code,
            reason = "loading our own precompiled component, see SAFETY"
        )]
        let component = unsafe { Component::deserialize(engine, &compiled) };
        component.map(|c| (c, false))
    }
}

impl Cache {
    /// Compiles `wasm` (whose sha256 is `sha256`) and writes it into the cache: the compiled
    /// bytes, and whether they could be written (the caller says what a failed write means).
    pub(crate) fn compile_into(
        &self,
        engine: &Engine,
        wasm: &[u8],
        sha256: &str,
    ) -> wasmtime::Result<(Vec<u8>, std::io::Result<()>)> {
        let compiled = engine.precompile_component(wasm)?;
        let written = self.write_entry(&self.path(engine, sha256), &compiled);
        Ok((compiled, written))
    }

    /// Runs `host compile-component` on `wasm` (see [`Apart`]).
    fn compile_apart(&self, apart: &Apart, wasm: &[u8], sha256: &str) -> Result<(), ApartFailure> {
        use std::io::{Read, Write};
        use std::process::{Command, Stdio};
        let unavailable = |e: std::io::Error| ApartFailure::Unavailable(e.to_string());
        let _one = COMPILING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Nothing of the operator's environment (its tokens, a `RUST_BACKTRACE` that would put a
        // backtrace in a Plugin's status): the compiler reads none.
        let mut command = Command::new(&apart.exe);
        command
            .arg("compile-component")
            .arg("--log-format=text")
            .arg(format!("--cache-dir={}", self.dir.display()))
            .arg(format!("--sha256={sha256}"));
        if let Some(cap) = apart.memory_cap {
            command.arg(format!("--memory-cap={cap}"));
        }
        let mut child = command
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(unavailable)?;
        // Should memory run short in the pod, the compiler is the process to kill, not the
        // operator (raising one's own score needs no privilege; where /proc is not there,
        // nothing is done).
        let _ = std::fs::write(format!("/proc/{}/oom_score_adj", child.id()), "1000");
        let (stdin, stderr) = (child.stdin.take(), child.stderr.take());
        let (waited, said) = std::thread::scope(|scope| {
            // Written and read on threads of their own, so that a compiler that stops reading
            // and fills its stderr cannot hold both ends; stdin is dropped once written, so
            // that it sees the end.
            scope.spawn(move || {
                if let Some(mut stdin) = stdin {
                    // A compiler that stopped reading says why on its stderr.
                    let _ = stdin.write_all(wasm);
                }
            });
            let reader = scope.spawn(move || {
                let mut said = Vec::new();
                if let Some(stderr) = stderr {
                    let _ = stderr.take(MAX_SAID as u64).read_to_end(&mut said);
                }
                String::from_utf8_lossy(&said).trim().to_owned()
            });
            let deadline = std::time::Instant::now() + COMPILE_DEADLINE;
            let waited = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Ok(Some(status)),
                    Ok(None) if std::time::Instant::now() >= deadline => {
                        let _ = child.kill();
                        break child.wait().map(|_| None);
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => break Err(e),
                }
            };
            (waited, reader.join().unwrap_or_default())
        });
        let Some(status) = waited.map_err(unavailable)? else {
            return Err(ApartFailure::Compiler(format!(
                "the compiler process did not finish within {} s: stopped",
                COMPILE_DEADLINE.as_secs()
            )));
        };
        judge(status.code(), &status.to_string(), &said, apart.memory_cap)
    }

    /// Where the description of the component with this sha256 under `ctx` lives. The host's
    /// version is in the name because the file holds the host's form of the description, as
    /// this host checked it, each distinct schema once (`shared`: earlier hosts kept the WIT
    /// record, with each schema as text, and checked it at every load, then the checked
    /// description with each Kind's schemas in full).
    fn description_path(&self, sha256: &str, ctx: &Context) -> PathBuf {
        let mut h = Sha256::new();
        h.update(ctx.api_group.as_bytes());
        h.update([0]);
        h.update(ctx.cluster_domain.as_bytes());
        let ctx_hash: String = h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.dir.join(format!(
            "{sha256}-host{}-{ctx_hash}-shared.describe.json",
            env!("CARGO_PKG_VERSION")
        ))
    }

    /// The cached description of a component under `ctx`, if there is a readable one.
    pub(crate) fn load_description<T: DeserializeOwned>(
        &self,
        sha256: &str,
        ctx: &Context,
    ) -> Option<T> {
        let path = self.description_path(sha256, ctx);
        let bytes = std::fs::read(&path).ok()?;
        let description = serde_json::from_slice(&bytes)
            .inspect_err(|e| {
                tracing::warn!(path = %path.display(), "ignoring an unreadable cached description: {e}");
            })
            .ok()?;
        touch(&path);
        Some(description)
    }

    /// Writes one entry (see [`write_atomically`]), then removes the entries not used for
    /// [`MAX_AGE`].
    fn write_entry(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        write_atomically(path, bytes)?;
        self.evict_unused();
        Ok(())
    }

    /// Removes the entries not used for [`MAX_AGE`]. Failures are skipped: another host may be
    /// doing the same.
    fn evict_unused(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let ours = [".cwasm", ".describe.json", ".file.json", ".tmp"];
            if !ours.iter().any(|suffix| name.ends_with(suffix)) {
                continue;
            }
            let unused = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > MAX_AGE);
            if unused && std::fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), "removed a compile cache entry unused for 30 days");
            }
        }
    }

    /// Caches the description of a component under `ctx`; a failure is logged and skipped.
    pub(crate) fn store_description<T: Serialize>(&self, sha256: &str, ctx: &Context, info: &T) {
        let path = self.description_path(sha256, ctx);
        let written = serde_json::to_vec(info)
            .map_err(std::io::Error::other)
            .and_then(|json| self.write_entry(&path, &json));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), "cannot cache the plugin's description: {e}");
        }
    }
}

/// How long after a file's last change (its modification or status change time, whichever is
/// later) a digest must have been recorded to be trusted: a file changed again within the same
/// timestamp tick as the recording would otherwise look unchanged (the "racy" case git's index
/// handles the same way). Two seconds covers the coarsest timestamps (FAT's).
const SETTLED: Duration = Duration::from_secs(2);

/// What `stat` says of a file: any write, rename over it or change of its times changes one of
/// these (a status change time cannot be set by its owner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    /// Nanoseconds since the epoch.
    modified: i128,
    /// Nanoseconds since the epoch.
    changed: i128,
}

impl FileStamp {
    /// The stamp of a file, where the platform says enough of it (Unix); elsewhere none, and
    /// files are hashed at every load.
    #[cfg(unix)]
    pub(crate) fn of(meta: &std::fs::Metadata) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            modified: ns(meta.mtime(), meta.mtime_nsec()),
            changed: ns(meta.ctime(), meta.ctime_nsec()),
        })
    }

    #[cfg(not(unix))]
    pub(crate) fn of(_meta: &std::fs::Metadata) -> Option<Self> {
        None
    }

    /// The file's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Whether a digest recorded at `recorded` (nanoseconds since the epoch) can be trusted for
    /// a file with this stamp: it was recorded [`SETTLED`] after the file's last change.
    fn settled_before(&self, recorded: i128) -> bool {
        let settled = i128::try_from(SETTLED.as_nanos()).unwrap_or(i128::MAX);
        self.modified.max(self.changed).saturating_add(settled) <= recorded
    }
}

/// The digest a file had, with its path and stamp then, and when it was recorded.
#[derive(Serialize, Deserialize)]
struct FileDigest {
    path: PathBuf,
    stamp: FileStamp,
    /// Nanoseconds since the epoch.
    recorded: i128,
    sha256: String,
}

fn nanos_since_epoch(t: SystemTime) -> i128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
}

impl Cache {
    /// Where what is known of the file at `path` (absolute) lives.
    fn file_digest_path(&self, path: &Path) -> PathBuf {
        let h = Sha256::digest(path.as_os_str().as_encoded_bytes());
        self.dir
            .join(format!("{}.file.json", crate::units::hex(&h[..16])))
    }

    /// The sha256 (hex) the file at `path` had when this cache last recorded it, if `stamp`
    /// (what `stat` says of it now) is the one recorded with it and the recording came
    /// [`SETTLED`] after the file's last change. Nothing of the file itself is read.
    pub(crate) fn file_digest(&self, path: &Path, stamp: &FileStamp) -> Option<String> {
        let entry = self.file_digest_path(path);
        let bytes = std::fs::read(&entry).ok()?;
        let known: FileDigest = serde_json::from_slice(&bytes).ok()?;
        let trusted = known.path == path
            && known.stamp == *stamp
            && stamp.settled_before(known.recorded)
            && crate::oci::is_digest(&format!("sha256:{}", known.sha256));
        trusted.then(|| {
            touch(&entry);
            known.sha256
        })
    }

    /// Records that the file at `path` (absolute), with `stamp` as `stat` said before its bytes
    /// were read, has this sha256; `now` is when the read began. A failure is logged and
    /// skipped. A record that is not [`SETTLED`] is written all the same (a later load records
    /// again), but not trusted.
    pub(crate) fn store_file_digest_at(
        &self,
        path: &Path,
        stamp: FileStamp,
        sha256: &str,
        now: SystemTime,
    ) {
        let entry = self.file_digest_path(path);
        let record = FileDigest {
            path: path.to_path_buf(),
            stamp,
            recorded: nanos_since_epoch(now),
            sha256: sha256.to_owned(),
        };
        let written = serde_json::to_vec(&record)
            .map_err(std::io::Error::other)
            .and_then(|json| self.write_entry(&entry, &json));
        if let Err(e) = written {
            tracing::warn!(path = %entry.display(), "cannot cache a plugin file's digest: {e}");
        }
    }
}

/// Marks a cache entry as used now (its modification time; its contents are not touched).
fn touch(path: &Path) {
    if let Err(e) = set_modified(path, SystemTime::now()) {
        tracing::debug!(path = %path.display(), "cannot mark a cache entry as used: {e}");
    }
}

/// Sets the modification time of the file at `path`, leaving its contents as they are.
fn set_modified(path: &Path, time: SystemTime) -> std::io::Result<()> {
    std::fs::File::options()
        .append(true)
        .open(path)
        .and_then(|f| f.set_modified(time))
}

/// Writes through a temporary file unique to this call, then renames, so that readers see
/// either no file or a whole one.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let unique = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{}-{unique}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::plugin::{BUILTINS, Limits, Runtime};

    fn stamp(path: &Path) -> FileStamp {
        FileStamp::of(&std::fs::metadata(path).unwrap()).expect("a Unix stamp")
    }

    /// How a compiler process's end is read, with and without a memory cap: under one, nothing
    /// but a cache it could not write sends the compile back into the operator (uncapped).
    #[test]
    fn a_compiler_that_fails_under_a_cap_fails_the_load_and_says_why() {
        use ApartFailure::{Compiler, Invalid, Unavailable};
        let cap = Some(64 << 20);
        let kind = |r: Result<(), ApartFailure>| match r {
            Ok(()) => "ok",
            Err(Invalid(_)) => "invalid",
            Err(Compiler(_)) => "compiler",
            Err(Unavailable(_)) => "unavailable",
        };
        let oom = "memory allocation of 4194304 bytes failed\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace";
        let abort = "signal: 6 (SIGABRT) (core dumped)";
        for (code, said, cap, expected) in [
            (Some(0), "", cap, "ok"),
            (Some(1), "invalid input WebAssembly code", cap, "invalid"),
            (Some(1), "invalid input WebAssembly code", None, "invalid"),
            // A name in the component that reads like running out of memory is its own.
            (
                Some(1),
                "export `out of memory` is not valid",
                cap,
                "invalid",
            ),
            (
                Some(1),
                "failed to mmap: Cannot allocate memory (os error 12)",
                cap,
                "compiler",
            ),
            (Some(3), "cannot write", cap, "unavailable"),
            (None, oom, cap, "compiler"),
            (None, "", cap, "compiler"),
            (None, "", None, "compiler"),
            (
                Some(2),
                "error: cannot read the component on stdin: out of memory",
                cap,
                "compiler",
            ),
            (
                Some(101),
                "panicked: Resource temporarily unavailable (os error 11)",
                cap,
                "compiler",
            ),
            (Some(2), "unrecognized subcommand", None, "unavailable"),
            (Some(1), "", None, "unavailable"),
        ] {
            assert_eq!(
                kind(judge(code, abort, said, cap)),
                expected,
                "{code:?} {said:?} {cap:?}"
            );
        }
        let Err(Compiler(said)) = judge(None, abort, oom, cap) else {
            panic!("not the compiler's failure")
        };
        assert_eq!(
            said,
            "compiling it needs more memory than the compiler may take (64Mi, --compile-memory): \
             raise it (plugins built with componentize-js or componentize-py need 384Mi with the \
             operator's image, 480Mi with a glibc build: docs/install.md, \"Memory\"). The \
             compiler said: memory allocation of 4194304 bytes failed"
        );
    }

    #[test]
    fn a_files_digest_is_trusted_only_once_settled_and_for_the_same_file_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("cache"));
        let file = dir.path().join("p.wasm");
        std::fs::write(&file, b"one").unwrap();
        let digest = "a".repeat(64);

        // Recorded in the same tick as the file's last change: not trusted.
        cache.store_file_digest_at(&file, stamp(&file), &digest, SystemTime::now());
        assert_eq!(cache.file_digest(&file, &stamp(&file)), None);

        // Recorded once settled: trusted, for this path and stamp only.
        let later = SystemTime::now() + SETTLED;
        cache.store_file_digest_at(&file, stamp(&file), &digest, later);
        assert_eq!(
            cache.file_digest(&file, &stamp(&file)),
            Some(digest.clone())
        );
        let other = dir.path().join("q.wasm");
        std::fs::write(&other, b"one").unwrap();
        assert_eq!(cache.file_digest(&other, &stamp(&file)), None);

        // Recorded long after: only the stamp can refuse it now. Bytes of another size, or a
        // file of the same size renamed over it with the same modification time, change it.
        let far = SystemTime::now() + Duration::from_secs(3600);
        cache.store_file_digest_at(&file, stamp(&file), &digest, far);
        assert_eq!(
            cache.file_digest(&file, &stamp(&file)),
            Some(digest.clone())
        );
        let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::fs::write(&other, b"two").unwrap();
        set_modified(&other, modified).unwrap();
        std::fs::rename(&other, &file).unwrap();
        assert_eq!(cache.file_digest(&file, &stamp(&file)), None);
        cache.store_file_digest_at(&file, stamp(&file), &digest, far);
        std::fs::write(&file, b"three").unwrap();
        let after = stamp(&file);
        assert_eq!(cache.file_digest(&file, &after), None);

        // An entry that is not a digest is not trusted.
        cache.store_file_digest_at(&file, after.clone(), "../x", far);
        assert_eq!(cache.file_digest(&file, &after), None);
    }

    #[test]
    fn a_plugin_file_loads_by_its_recorded_digest_and_again_from_its_bytes_once_changed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("cache"));
        let runtime = Runtime::new(Limits::default(), Some(cache.clone())).unwrap();
        let ctx = Context::default();
        let builtin = |name: &str| BUILTINS.iter().find(|b| b.name == name).unwrap();
        let (kvcluster, service) = (builtin("kvcluster"), builtin("service"));
        let file = dir.path().join("p.wasm");
        std::fs::write(&file, kvcluster.wasm).unwrap();
        let absolute = std::path::absolute(&file).unwrap();

        // The first load reads and hashes the file and records its digest.
        let first = runtime.load_file(&file, &ctx).unwrap();
        assert_eq!(first.sha256(), kvcluster.sha256);
        assert!(!first.from_cache());
        let recorded: FileDigest =
            serde_json::from_slice(&std::fs::read(cache.file_digest_path(&absolute)).unwrap())
                .unwrap();
        assert_eq!(recorded.sha256, kvcluster.sha256);

        // Once the record is settled, the file is not read: shown by a record that names
        // another compiled component, which is what loads.
        runtime.load_file(&file, &ctx).unwrap();
        let elsewhere = dir.path().join("service.wasm");
        std::fs::write(&elsewhere, service.wasm).unwrap();
        runtime.load_file(&elsewhere, &ctx).unwrap();
        let later = SystemTime::now() + SETTLED;
        cache.store_file_digest_at(&absolute, stamp(&file), service.sha256, later);
        let by_digest = runtime.load_file(&file, &ctx).unwrap();
        assert_eq!(by_digest.sha256(), service.sha256);
        assert!(by_digest.from_cache());

        // The file changed (replaced by the same bytes, a new file renamed over it): it is
        // read again, whatever was recorded for its old stamp.
        let far = SystemTime::now() + Duration::from_secs(3600);
        cache.store_file_digest_at(&absolute, stamp(&file), service.sha256, far);
        let replacement = dir.path().join("p.wasm.new");
        std::fs::write(&replacement, kvcluster.wasm).unwrap();
        std::fs::rename(&replacement, &file).unwrap();
        assert_eq!(
            runtime.load_file(&file, &ctx).unwrap().sha256(),
            kvcluster.sha256
        );
    }
}
