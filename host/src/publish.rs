//! `host push`, `host pull` and `host inspect`: plugins to and from OCI registries, and what a
//! plugin is, from a file or a registry.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::oci::{self, Reference};
use crate::plugin::{Anatomy, Runtime};
use crate::types::{Context, PluginInfo};

/// Why a plugin could not be pushed, pulled or looked at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin could not be read or loaded.
    #[error(transparent)]
    Plugin(#[from] crate::Error),
    /// Its registry refused it, or could not be reached.
    #[error(transparent)]
    Registry(#[from] oci::Error),
    /// The async runtime the registry client runs on could not start.
    #[error("could not start the async runtime: {0}")]
    Start(#[source] std::io::Error),
}

/// Runs `fut` on a runtime of its own (the commands that use this have none).
pub fn block_on<T>(fut: impl std::future::Future<Output = T>) -> Result<T, Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Start)?;
    Ok(runtime.block_on(fut))
}

/// Loads `wasm` far enough to know what it is; a component that is no plugin is refused with
/// the step that failed.
fn anatomy(
    runtime: &Runtime,
    wasm: &[u8],
    source: &str,
    ctx: &Context,
) -> Result<(PluginInfo, Anatomy), Error> {
    match runtime.load_stepwise(wasm, source, ctx) {
        Ok((plugin, anatomy)) => Ok((plugin.info().clone(), anatomy)),
        Err(failure) => Err(crate::Error::Load {
            plugin: source.to_owned(),
            reason: format!(
                "{} (at the {:?} step; `host check {source}` says more)",
                failure.reason, failure.step
            ),
        }
        .into()),
    }
}

/// `host push`: the plugin in `file` to `reference`; returns the reference pinned to its digest.
pub fn push(
    runtime: &Runtime,
    ctx: &Context,
    file: &Path,
    reference: &Reference,
    options: &oci::Options,
) -> Result<Reference, Error> {
    let wasm = std::fs::read(file).map_err(|source| crate::Error::ReadPlugin {
        path: file.to_path_buf(),
        source,
    })?;
    let (_, anatomy) = anatomy(runtime, &wasm, &file.display().to_string(), ctx)?;
    let info = oci::ComponentInfo {
        imports: anatomy.imports,
        exports: anatomy.exports,
    };
    Ok(block_on(oci::push(&wasm, &info, reference, options))??)
}

/// Where a plugin to inspect comes from.
pub enum Subject {
    File(PathBuf),
    Oci(Reference),
}

impl Subject {
    /// A path when such a file exists or the text is no reference; else a reference.
    pub fn parse(text: &str) -> Result<Self, Error> {
        if text.starts_with(oci::SCHEME) {
            return Ok(Self::Oci(Reference::parse(text)?));
        }
        // As Docker reads a name: the first part is a registry only when it looks like a host
        // (a dot or a port, or localhost); anything else is a file.
        let path = PathBuf::from(text);
        let registry = text.split('/').next().unwrap_or_default();
        let looks_like_registry =
            registry.contains('.') || registry.contains(':') || registry == "localhost";
        if path.exists()
            || !text.contains('/')
            || text.ends_with(".wasm")
            || !looks_like_registry
            || registry == "."
            || registry == ".."
        {
            return Ok(Self::File(path));
        }
        Ok(Self::Oci(Reference::parse(text)?))
    }
}

/// A plugin's bytes, read from a file or pulled (checked against its digests), with the name
/// reports give it: the path, or the reference pinned to its digest.
pub struct Fetched {
    pub wasm: Vec<u8>,
    /// The path, or `oci://` and the pinned reference.
    pub source: String,
    /// For a pull: the manifest's digest and the layer's media type.
    pub pulled: Option<(String, String)>,
}

impl Subject {
    /// Reads the file, or pulls the reference (from `store` when it holds that digest).
    pub fn fetch(
        &self,
        options: &oci::Options,
        store: Option<&oci::Store>,
    ) -> Result<Fetched, Error> {
        match self {
            Self::File(path) => Ok(Fetched {
                wasm: std::fs::read(path).map_err(|source| crate::Error::ReadPlugin {
                    path: path.clone(),
                    source,
                })?,
                source: path.display().to_string(),
                pulled: None,
            }),
            Self::Oci(reference) => {
                let pulled = block_on(oci::pull(reference, options, store, false))??;
                Ok(Fetched {
                    wasm: pulled.wasm,
                    source: format!("{}{}", oci::SCHEME, pulled.reference),
                    pulled: Some((
                        pulled.reference.digest.unwrap_or_default(),
                        pulled.media_type,
                    )),
                })
            }
        }
    }
}

/// `host inspect`: what the plugin is, as JSON (the text report is made from it).
pub fn inspect(
    runtime: &Runtime,
    ctx: &Context,
    subject: &Subject,
    options: &oci::Options,
    store: Option<&oci::Store>,
) -> Result<Value, Error> {
    let Fetched {
        wasm,
        source,
        pulled,
    } = subject.fetch(options, store)?;
    let mut report = json!({ "source": source });
    if let Some((manifest, media_type)) = pulled {
        report["manifest"] = manifest.into();
        report["mediaType"] = media_type.into();
    }
    let (info, anatomy) = anatomy(runtime, &wasm, &source, ctx)?;
    let kinds: Vec<Value> = info
        .kinds
        .iter()
        .map(|k| json!({ "kind": k.kind, "group": k.group, "versions": k.versions, "plural": k.plural }))
        .collect();
    let children: Vec<Value> = info
        .children
        .iter()
        .map(|c| json!({ "group": c.group, "version": c.version, "kind": c.kind }))
        .collect();
    let extra = json!({
        "plugin": info.name,
        "version": info.version,
        "sha256": format!("sha256:{}", anatomy.sha256),
        "size": anatomy.size,
        "contract": anatomy.contract().map(|v| format!("{}@{v}", crate::plugin::INTERFACE)),
        "kinds": kinds,
        "children": children,
        "imports": anatomy.imports,
        "exports": anatomy.exports,
    });
    if let (Some(r), Some(e)) = (report.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    Ok(report)
}

/// The report of [`inspect`] for a person.
pub fn text(report: &Value) -> String {
    let s = |k: &str| report[k].as_str().unwrap_or_default().to_owned();
    let list = |k: &str| -> Vec<String> {
        report[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<10} {v}\n"));
    line("source", s("source"));
    if report.get("manifest").is_some() {
        line("manifest", s("manifest"));
        line("layer", s("mediaType"));
    }
    line("sha256", s("sha256"));
    line("size", format!("{} bytes", report["size"]));
    line("plugin", format!("{} {}", s("plugin"), s("version")));
    line("contract", s("contract"));
    for k in report["kinds"].as_array().into_iter().flatten() {
        let versions: Vec<&str> = k["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        line(
            "kind",
            format!(
                "{} ({}, {})",
                k["kind"].as_str().unwrap_or_default(),
                k["group"].as_str().unwrap_or_default(),
                versions.join(", ")
            ),
        );
    }
    for c in report["children"].as_array().into_iter().flatten() {
        let group = c["group"].as_str().unwrap_or_default();
        let gv = crate::gvk::api_version(group, c["version"].as_str().unwrap_or_default());
        line(
            "child",
            format!("{} ({gv})", c["kind"].as_str().unwrap_or_default()),
        );
    }
    for i in list("imports") {
        line("import", i);
    }
    for e in list("exports") {
        line("export", e);
    }
    match &report.get("signatures") {
        Some(Value::Array(seen)) if seen.is_empty() => line("signature", "none".into()),
        Some(Value::Array(seen)) => {
            for s in seen {
                let text = serde_json::from_value::<crate::signature::Seen>(s.clone())
                    .map(|s| s.to_string())
                    .unwrap_or_else(|_| s.to_string());
                line("signature", text);
            }
        }
        Some(other) => line(
            "signature",
            format!(
                "cannot be read: {}",
                other["error"].as_str().unwrap_or_default()
            ),
        ),
        None => {}
    }
    if let Some(policy) = report.get("policy") {
        let allowed = if policy["allowed"] == true {
            "allowed"
        } else {
            "refused"
        };
        line(
            "policy",
            format!(
                "{allowed}: {}",
                policy["verdict"].as_str().unwrap_or_default()
            ),
        );
    }
    out
}
