//! Plugins in OCI registries, laid out as the CNCF TAG Runtime's Wasm OCI artifact: an image
//! manifest whose config is `application/vnd.wasm.config.v0+json` and whose one layer is the
//! component, `application/wasm`. `host push`, `host pull`, `host inspect` and
//! `--plugin oci://...` go through here.
//!
//! Everything pulled is checked against its digest before use: the manifest against the digest
//! asked for (or, for a tag, the one it resolved to), the layer against the digest the manifest
//! names. What was pulled is kept by digest ([`Store`]), so a plugin named by digest loads again
//! with the registry down.

mod client;
mod reference;
mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

pub use client::{Client, Options, tls_config};
pub use reference::{Reference, SCHEME, is_digest};
pub use store::Store;

/// The manifest's media type.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker's image manifest, which some tools still push; read like the OCI one.
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The config's media type in the Wasm OCI artifact layout.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The component's layer.
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
/// Layer media types of Wasm that other tools pushed before the layout settled (wasm-to-oci,
/// and the Wasm image format of Istio's and Envoy's plugins); pulls accept them too.
pub const OLDER_LAYER_MEDIA_TYPES: &[&str] = &[
    "application/vnd.wasm.content.layer.v1+wasm",
    "application/vnd.module.wasm.content.layer.v1+wasm",
];
/// The largest plugin pulled.
pub const MAX_PLUGIN: usize = 256 << 20;

/// What went wrong with a registry or what it holds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The reference cannot be read.
    #[error("`{reference}` is not a plugin reference: {why}")]
    Reference {
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// The registry did not answer.
    #[error("registry {registry} cannot be reached: {why}")]
    Unreachable { registry: String, why: String },
    /// The registry refused the credentials, or asked for some that are not configured.
    #[error(
        "registry {registry} refused access: {why} (credentials come from --registry-config, a Docker config JSON)"
    )]
    Unauthorized { registry: String, why: String },
    /// The registry answered something unexpected.
    #[error("registry {registry}: {why}")]
    Registry { registry: String, why: String },
    /// The manifest is not a Wasm plugin.
    #[error("{reference}: {why}")]
    NotAPlugin { reference: String, why: String },
    /// Bytes that do not hash to the digest that names them.
    #[error("{what} does not match its digest: expected {expected}, got {actual}; it is not used")]
    Digest {
        what: String,
        /// The digest that names it.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// A tag, where only digests are taken.
    #[error(
        "{reference} names a tag, and --require-digest takes only references pinned by digest: use {reference}@sha256:<digest> (`host pull` prints it)"
    )]
    TagRefused { reference: String },
    /// The credentials cannot be read.
    #[error("registry credentials{}: {why}", path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default())]
    Credentials {
        /// The Docker config JSON, if one was read.
        path: Option<PathBuf>,
        why: String,
    },
    /// The CA certificates cannot be read.
    #[error("CA certificates {}: {why}", path.display())]
    Ca { path: PathBuf, why: String },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The credentials of each registry, as `docker login` and `podman login` keep them (a Docker
/// config JSON: `auths.<registry>.auth`, or `username` and `password`).
#[derive(Clone, Default)]
pub struct Credentials {
    /// By registry host: `user:password`, base64-encoded.
    basic: BTreeMap<String, String>,
}

/// The registries only: a log of the settings never shows a password.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.basic.keys()).finish()
    }
}

impl Credentials {
    /// Reads a Docker config JSON (`~/.docker/config.json`, or a Secret of type
    /// `kubernetes.io/dockerconfigjson` mounted as a file). Credential helpers are not run.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let bad = |why: String| Error::Credentials {
            path: Some(path.to_path_buf()),
            why,
        };
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let config: Value =
            serde_json::from_slice(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let mut basic = BTreeMap::new();
        let auths = config.get("auths").and_then(Value::as_object);
        for (key, entry) in auths.into_iter().flatten() {
            let user = entry.get("username").and_then(Value::as_str);
            let password = entry.get("password").and_then(Value::as_str);
            let encoded = match (entry.get("auth").and_then(Value::as_str), user, password) {
                (Some(auth), _, _) if !auth.is_empty() => auth.to_owned(),
                (_, Some(u), Some(p)) => client::basic(u, p),
                _ => continue,
            };
            basic.insert(registry_key(key), encoded);
        }
        Ok(Self { basic })
    }

    /// The base64 `user:password` for `registry`, if there is one.
    pub(crate) fn basic(&self, registry: &str) -> Option<String> {
        self.basic.get(&registry_key(registry)).cloned()
    }
}

/// A registry as the key of `auths`: its host and port, without a scheme or path.
fn registry_key(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or_default().to_owned()
}

/// `sha256:` and the hex of the sha256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::units::sha256_hex(bytes))
}

/// What a component says of itself in its artifact's config.
#[derive(Debug, Clone, Default)]
pub struct ComponentInfo {
    /// Its imports (interfaces with versions).
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// The config and manifest of `wasm` as a Wasm OCI artifact. The same component gives the same
/// bytes, so the same digest: `created` is `SOURCE_DATE_EPOCH` when set, else the epoch.
pub fn artifact(wasm: &[u8], info: &ComponentInfo) -> (Vec<u8>, Vec<u8>) {
    let layer = digest(wasm);
    let created = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .to_string();
    let config = json!({
        "created": created,
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer],
        "component": { "exports": info.exports, "imports": info.imports },
    });
    let config = serde_json::to_vec(&config).unwrap_or_default();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": { "mediaType": CONFIG_MEDIA_TYPE, "digest": digest(&config), "size": config.len() },
        "layers": [{ "mediaType": LAYER_MEDIA_TYPE, "digest": layer, "size": wasm.len() }],
    });
    (config, serde_json::to_vec(&manifest).unwrap_or_default())
}

/// Pushes `wasm` to `reference` (its tag, `latest` when it names none) as a Wasm OCI artifact;
/// returns the reference pinned to the manifest's digest.
pub async fn push(
    wasm: &[u8],
    info: &ComponentInfo,
    reference: &Reference,
    options: &Options,
) -> Result<Reference, Error> {
    let (config, manifest) = artifact(wasm, info);
    push_manifest(
        reference,
        options,
        &[Bytes::copy_from_slice(wasm), Bytes::from(config)],
        manifest,
    )
    .await
}

/// Pushes `blobs` and then `manifest` (an image manifest naming them) to `reference`; returns
/// the reference pinned to the manifest's digest. [`push`] uses it with the Wasm artifact;
/// anything else (an older layout) may be pushed with it too.
pub async fn push_manifest(
    reference: &Reference,
    options: &Options,
    blobs: &[Bytes],
    manifest: Vec<u8>,
) -> Result<Reference, Error> {
    let client = Client::connect(reference, options, true).await?;
    for blob in blobs {
        upload(&client, blob.clone()).await?;
    }
    let manifest_digest = digest(&manifest);
    let target = match (&reference.tag, &reference.digest) {
        (Some(tag), _) => tag.clone(),
        (None, Some(d)) if *d != manifest_digest => {
            return Err(Error::Digest {
                what: format!("the manifest of {}", reference),
                expected: d.clone(),
                actual: manifest_digest,
            });
        }
        (None, Some(d)) => d.clone(),
        (None, None) => "latest".to_owned(),
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
    );
    let answer = client
        .send(
            Method::PUT,
            &client.path("manifests", &target),
            headers,
            Bytes::from(manifest),
            1 << 16,
        )
        .await?;
    if answer.status != StatusCode::CREATED && !answer.status.is_success() {
        return Err(client.unexpected("putting the manifest", &answer));
    }
    if let Some(said) = answer
        .headers
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        && said != manifest_digest
    {
        return Err(Error::Digest {
            what: format!("the manifest the registry stored for {reference}"),
            expected: manifest_digest,
            actual: said.to_owned(),
        });
    }
    let mut pinned = reference.pinned(&manifest_digest);
    if pinned.tag.is_none() && reference.digest.is_none() {
        pinned.tag = Some("latest".into());
    }
    Ok(pinned)
}

/// Uploads one blob unless the registry has it already.
async fn upload(client: &Client, blob: Bytes) -> Result<(), Error> {
    let d = digest(&blob);
    let exists = client
        .send(
            Method::HEAD,
            &client.path("blobs", &d),
            HeaderMap::new(),
            Bytes::new(),
            0,
        )
        .await?;
    if exists.status.is_success() {
        return Ok(());
    }
    let start = client
        .send(
            Method::POST,
            &client.path("blobs", "uploads/"),
            HeaderMap::new(),
            Bytes::new(),
            1 << 16,
        )
        .await?;
    if start.status != StatusCode::ACCEPTED {
        return Err(client.unexpected("starting an upload", &start));
    }
    let location = start
        .headers
        .get(header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .ok_or_else(|| client.unexpected("an upload without a Location", &start))?;
    let url = format!(
        "{location}{}digest={}",
        if location.contains('?') { '&' } else { '?' },
        client::encode(&d)
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    let done = client
        .send(Method::PUT, &url, headers, blob, 1 << 16)
        .await?;
    if done.status != StatusCode::CREATED {
        return Err(client.unexpected(&format!("uploading {d}"), &done));
    }
    Ok(())
}

/// A plugin pulled from a registry.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The reference, pinned to the manifest's digest.
    pub reference: Reference,
    pub wasm: Vec<u8>,
    /// The sha256 of `wasm` in hex: its layer's digest, checked against the bytes by the pull
    /// (what the compile cache knows it by, so a load need not hash the bytes again).
    pub sha256: String,
    /// The layer's media type (`application/wasm`, or an older one).
    pub media_type: String,
    /// Whether it came from the store rather than the registry.
    pub cached: bool,
}

/// A plugin the store keeps whole, located by its digest and not yet read.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The reference, pinned to the manifest's digest.
    pub reference: Reference,
    /// The sha256 of its Wasm layer, in hex: what the compile cache knows it by.
    pub sha256: String,
    /// The layer's size in bytes.
    pub size: usize,
    /// The layer's media type.
    pub media_type: String,
    blob: std::path::PathBuf,
}

impl Kept {
    /// Its bytes, checked against the layer's digest.
    pub fn read(&self) -> Result<Vec<u8>, Error> {
        let wasm = std::fs::read(&self.blob).map_err(|source| Error::Io {
            path: self.blob.clone(),
            source,
        })?;
        let actual = digest(&wasm);
        if actual != format!("sha256:{}", self.sha256) {
            return Err(Error::Digest {
                what: format!("the kept layer of {}", self.reference),
                expected: format!("sha256:{}", self.sha256),
                actual,
            });
        }
        Ok(wasm)
    }
}

/// The plugin `reference` names by digest, when `store` keeps it whole: its manifest read and
/// checked, its layer located and not read (a plugin compiled before loads from the compile
/// cache without its bytes: the plugin runtime's `load_by_digest`).
pub fn kept(reference: &Reference, store: &Store) -> Option<Kept> {
    let manifest_digest = reference.digest.as_deref()?;
    let (manifest, layer, size, blob) = store.locate(manifest_digest)?;
    let (_, media_type) = wasm_layer(reference, &manifest).ok()?;
    Some(Kept {
        reference: reference.clone(),
        sha256: layer.strip_prefix("sha256:")?.to_owned(),
        size,
        media_type,
        blob,
    })
}

/// The hex of a `sha256:` digest (the whole digest when it has another algorithm, which no
/// layer this host accepts has: `digest` makes only sha256).
fn hex_of(digest: &str) -> String {
    digest.strip_prefix("sha256:").unwrap_or(digest).to_owned()
}

/// A pull's answer; in debug builds (every test), its sha256 is checked against its bytes once
/// more, so a path that vouched for the wrong one fails loudly.
fn pulled(
    reference: Reference,
    wasm: Vec<u8>,
    layer: &str,
    media_type: String,
    cached: bool,
) -> Pulled {
    let sha256 = hex_of(layer);
    debug_assert_eq!(sha256, crate::units::sha256_hex(&wasm), "a pull's sha256");
    Pulled {
        reference,
        wasm,
        sha256,
        media_type,
        cached,
    }
}

/// Pulls the plugin `reference` names, checked against its digests; from `store` when it holds
/// that digest (no network), and kept there after a pull. A tag is resolved to a digest by the
/// registry first, or refused when `require_digest`.
pub async fn pull(
    reference: &Reference,
    options: &Options,
    store: Option<&Store>,
    require_digest: bool,
) -> Result<Pulled, Error> {
    if reference.digest.is_none() && require_digest {
        return Err(Error::TagRefused {
            reference: reference.to_string(),
        });
    }
    if let (Some(d), Some(store)) = (&reference.digest, store)
        && let Some((manifest, wasm)) = store.get(d)
    {
        let ((layer, _), media_type) = wasm_layer(reference, &manifest)?;
        return Ok(pulled(reference.clone(), wasm, &layer, media_type, true));
    }
    let client = Client::connect(reference, options, false).await?;
    let manifest = get_manifest(
        &client,
        "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.index.v1+json;q=0.5",
    )
    .await?
    .to_vec();
    let manifest_digest = digest(&manifest);
    if let Some(expected) = &reference.digest
        && *expected != manifest_digest
    {
        return Err(Error::Digest {
            what: format!("the manifest of {reference}"),
            expected: expected.clone(),
            actual: manifest_digest,
        });
    }
    let (layer, media_type) = wasm_layer(reference, &manifest)?;
    let size = layer.1;
    if size > MAX_PLUGIN {
        return Err(Error::NotAPlugin {
            reference: reference.to_string(),
            why: format!("its layer is {size} bytes, over the {MAX_PLUGIN} a plugin may have"),
        });
    }
    let blob = client
        .send(
            Method::GET,
            &client.path("blobs", &layer.0),
            HeaderMap::new(),
            Bytes::new(),
            size,
        )
        .await?;
    if !blob.status.is_success() {
        return Err(client.unexpected(&format!("getting the layer {}", layer.0), &blob));
    }
    let actual = digest(&blob.body);
    if actual != layer.0 || blob.body.len() != size {
        return Err(Error::Digest {
            what: format!("the layer of {reference} ({} bytes)", blob.body.len()),
            expected: layer.0,
            actual,
        });
    }
    let pinned = reference.pinned(&manifest_digest);
    // A store that cannot be written (a full or read-only disk) costs a pull next time, no more.
    if let Some(store) = store
        && let Err(e) = store.put(&manifest_digest, &manifest, &blob.body)
    {
        tracing::warn!(reference = %pinned, "pulled plugin not kept: {e}");
    }
    Ok(pulled(
        pinned,
        blob.body.to_vec(),
        &layer.0,
        media_type,
        false,
    ))
}

/// `reference` pinned to the digest of the manifest it names now: itself when it names a digest,
/// else the registry's answer for its tag (the manifest fetched and hashed, not taken on the
/// registry's word).
pub async fn resolve(reference: &Reference, options: &Options) -> Result<Reference, Error> {
    if reference.digest.is_some() {
        return Ok(reference.clone());
    }
    let client = Client::connect(reference, options, false).await?;
    // Every kind of manifest a tag may name: a registry that is not offered the kind a tag
    // names may answer with another (a platform's manifest for an index), of another digest.
    let manifest = get_manifest(
        &client,
        "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json",
    )
    .await?;
    Ok(reference.pinned(&digest(&manifest)))
}

/// The manifest the client's reference names (its tag or digest), as the registry sends it for
/// `accept`; a reference the registry does not hold is no plugin.
async fn get_manifest(client: &Client, accept: &'static str) -> Result<Bytes, Error> {
    let reference = client.reference();
    let mut headers = HeaderMap::new();
    headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
    let answer = client
        .send(
            Method::GET,
            &client.path("manifests", reference.target()),
            headers,
            Bytes::new(),
            client::MAX_MANIFEST,
        )
        .await?;
    if answer.status == StatusCode::NOT_FOUND {
        return Err(Error::NotAPlugin {
            reference: reference.to_string(),
            why: format!("no such manifest in {}", reference.registry),
        });
    }
    if !answer.status.is_success() {
        return Err(client.unexpected(&format!("getting {reference}"), &answer));
    }
    Ok(answer.body)
}

/// The Wasm layer of a manifest (its digest and size) and its media type.
fn wasm_layer(
    reference: &dyn std::fmt::Display,
    manifest: &[u8],
) -> Result<((String, usize), String), Error> {
    let not = |why: String| Error::NotAPlugin {
        reference: reference.to_string(),
        why,
    };
    let m: Value = serde_json::from_slice(manifest)
        .map_err(|e| not(format!("its manifest is not JSON: {e}")))?;
    let media_type = m["mediaType"].as_str().unwrap_or(MANIFEST_MEDIA_TYPE);
    if m.get("manifests").is_some() {
        return Err(not(
            "it is an image index (several platforms), not a Wasm artifact: name the Wasm manifest itself by its digest".into(),
        ));
    }
    if media_type != MANIFEST_MEDIA_TYPE && media_type != DOCKER_MANIFEST_MEDIA_TYPE {
        return Err(not(format!(
            "its manifest is {media_type}, not an image manifest"
        )));
    }
    let layers = m["layers"].as_array().cloned().unwrap_or_default();
    let wasm: Vec<&Value> = layers
        .iter()
        .filter(|l| {
            l["mediaType"]
                .as_str()
                .is_some_and(|t| t == LAYER_MEDIA_TYPE || OLDER_LAYER_MEDIA_TYPES.contains(&t))
        })
        .collect();
    let [layer] = wasm.as_slice() else {
        let types: Vec<&str> = layers
            .iter()
            .filter_map(|l| l["mediaType"].as_str())
            .collect();
        return Err(not(format!(
            "expected one {LAYER_MEDIA_TYPE} layer, found {} Wasm layers among {types:?}: is it a container image?",
            wasm.len()
        )));
    };
    let d = layer["digest"].as_str().unwrap_or_default();
    if !is_digest(d) {
        return Err(not(format!(
            "its layer's digest `{d}` is not a sha256 digest"
        )));
    }
    let size = layer["size"]
        .as_u64()
        .and_then(|s| usize::try_from(s).ok())
        .ok_or_else(|| not("its layer has no size".into()))?;
    Ok((
        (d.to_owned(), size),
        layer["mediaType"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// A registry's answer body as an error shows it: one line, at most 200 characters.
fn shown(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body).replace(['\n', '\r'], " ");
    crate::units::bounded(text.trim().to_owned(), 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_component_makes_the_same_artifact() {
        let info = ComponentInfo {
            imports: vec![],
            exports: vec!["wasm-operator:plugin/plugin@1.0.0".into()],
        };
        let (c1, m1) = artifact(b"\0asm", &info);
        let (c2, m2) = artifact(b"\0asm", &info);
        assert_eq!((digest(&c1), digest(&m1)), (digest(&c2), digest(&m2)));
        let m: Value = serde_json::from_slice(&m1).unwrap();
        assert_eq!(m["config"]["mediaType"], CONFIG_MEDIA_TYPE);
        assert_eq!(m["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
        assert_eq!(m["layers"][0]["digest"], digest(b"\0asm"));
        let r = Reference::parse("localhost:5000/a:1").unwrap();
        assert_eq!(wasm_layer(&r, &m1).unwrap().0, (digest(b"\0asm"), 4));
    }

    #[tokio::test]
    async fn a_plugin_pulled_from_the_store_carries_its_checked_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let wasm = b"\0asm\x0d\0\x01\0".to_vec();
        let (_, manifest) = artifact(&wasm, &ComponentInfo::default());
        let manifest_digest = digest(&manifest);
        store.put(&manifest_digest, &manifest, &wasm).unwrap();
        // No registry at this address: the store answers, or the pull fails.
        let r = Reference::parse(&format!("127.0.0.1:9/p@{manifest_digest}")).unwrap();
        let pulled = pull(&r, &Options::default(), Some(&store), true)
            .await
            .unwrap();
        assert!(pulled.cached);
        assert_eq!(pulled.sha256, crate::units::sha256_hex(&wasm));
        // A layer changed on disk is not taken (nor its sha256 vouched for): the pull goes to
        // the registry, which is not there.
        let layer = dir
            .path()
            .join("blobs/sha256")
            .join(crate::units::sha256_hex(&wasm));
        std::fs::write(&layer, b"\0asm\x0d\0\x01\x01").unwrap();
        assert!(
            pull(&r, &Options::default(), Some(&store), true)
                .await
                .is_err()
        );
    }

    #[test]
    fn a_manifest_that_is_not_a_plugin_is_named_as_such() {
        let r = Reference::parse("localhost:5000/a:1").unwrap();
        let image = json!({ "schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
            "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(b"x"), "size": 1 }] });
        let e = wasm_layer(&r, &serde_json::to_vec(&image).unwrap()).unwrap_err();
        assert!(e.to_string().contains("container image"), "{e}");
        let index = json!({ "schemaVersion": 2, "manifests": [] });
        let e = wasm_layer(&r, &serde_json::to_vec(&index).unwrap()).unwrap_err();
        assert!(e.to_string().contains("image index"), "{e}");
        let older = json!({ "schemaVersion": 2,
            "layers": [{ "mediaType": OLDER_LAYER_MEDIA_TYPES[0], "digest": digest(b"x"), "size": 1 }] });
        assert!(wasm_layer(&r, &serde_json::to_vec(&older).unwrap()).is_ok());
    }

    #[test]
    fn docker_config_credentials_by_registry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"auths":{"https://127.0.0.1:5000/v2/":{"auth":"dTpw"},"ghcr.io":{"username":"v","password":"q"}}}"#,
        )
        .unwrap();
        let c = Credentials::from_file(&path).unwrap();
        assert_eq!(c.basic("127.0.0.1:5000").as_deref(), Some("dTpw"));
        assert_eq!(c.basic("ghcr.io").as_deref(), Some("djpx"));
        assert_eq!(c.basic("docker.io"), None);
        std::fs::write(&path, "{").unwrap();
        let e = Credentials::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("not JSON"), "{e}");
    }
}
