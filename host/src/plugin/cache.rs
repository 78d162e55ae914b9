//! Compiled components on disk, keyed by the wasm's sha256, the wasmtime version and the
//! engine's compatibility hash, so that a second start does not compile again; and what each
//! component's `describe` returned, keyed by its sha256 and the context, so that a second start
//! does not call it again.
//!
//! Every use of an entry renews its modification time; whenever the host writes an entry it
//! removes the entries nobody has used for [`MAX_AGE`] (old plugin versions, other wasmtime
//! versions), so the directory does not grow without bound.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::types::Context;

/// How long a cache entry may go unused before a host that writes to the cache removes it.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// A directory of precompiled components (`<sha256>-wasmtime<version>-<engine>.cwasm`).
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
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
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the compiled form of the component with this sha256 lives for `engine`.
    pub fn path(&self, engine: &Engine, sha256: &str) -> PathBuf {
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let version = env!("WASMTIME_VERSION");
        self.dir.join(format!(
            "{sha256}-wasmtime{version}-{:016x}.cwasm",
            h.finish()
        ))
    }

    /// The compiled component of the wasm with this sha256, when this cache holds it: nothing
    /// but the compiled file is read.
    pub(crate) fn load_compiled(&self, engine: &Engine, sha256: &str) -> Option<Component> {
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
            Ok(c) => {
                touch(&path);
                Some(c)
            }
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
        let path = self.path(engine, sha256);
        let compiled = engine.precompile_component(wasm)?;
        if let Err(e) = self.write_entry(&path, &compiled) {
            tracing::warn!(path = %path.display(), "cannot cache the compiled component: {e}");
        }
        // SAFETY: `compiled` was produced just above by `precompile_component` on this engine.
        #[allow(
            unsafe_code,
            reason = "loading our own precompiled component, see SAFETY"
        )]
        let component = unsafe { Component::deserialize(engine, &compiled) };
        component.map(|c| (c, false))
    }
}

impl Cache {
    /// Where the description of the component with this sha256 under `ctx` lives. The host's
    /// version is in the name because the file holds the host's form of the WIT record, and
    /// `with-references` because it holds the status schemas (contract 1.1) and the references
    /// (contract 1.2) too.
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
            "{sha256}-host{}-{ctx_hash}-with-references.describe.json",
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
            let ours = [".cwasm", ".describe.json", ".tmp"];
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

/// Marks a cache entry as used now (its modification time; its contents are not touched).
fn touch(path: &Path) {
    let renewed = std::fs::File::options()
        .append(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = renewed {
        tracing::debug!(path = %path.display(), "cannot mark a cache entry as used: {e}");
    }
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
