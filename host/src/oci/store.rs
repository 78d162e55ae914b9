//! Pulled plugins kept by digest: `manifests/sha256/<hex>` and `blobs/sha256/<hex>`. Whatever
//! is read back is checked against its digest again, so a damaged entry is pulled anew rather
//! than used.

use std::path::{Path, PathBuf};

use super::{Error, digest};

/// Where pulled plugins are kept.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// A store in `root` (created on first use).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn path(&self, kind: &str, d: &str) -> PathBuf {
        self.root
            .join(kind)
            .join("sha256")
            .join(d.strip_prefix("sha256:").unwrap_or(d))
    }

    /// The manifest with digest `manifest_digest` and its Wasm layer, if both are here whole.
    pub fn get(&self, manifest_digest: &str) -> Option<(Vec<u8>, Vec<u8>)> {
        let manifest = std::fs::read(self.path("manifests", manifest_digest)).ok()?;
        if digest(&manifest) != manifest_digest {
            return None;
        }
        let ((layer, size), _) = super::wasm_layer(&manifest_digest, &manifest).ok()?;
        let wasm = std::fs::read(self.path("blobs", &layer)).ok()?;
        (wasm.len() == size && digest(&wasm) == layer).then_some((manifest, wasm))
    }

    /// The manifest with digest `manifest_digest` (read and checked: it is small) and where its
    /// Wasm layer is kept, with the layer's digest and size, when a file of that size is there.
    /// The layer is not read: whoever reads it checks it ([`super::Kept::read`]).
    pub fn locate(&self, manifest_digest: &str) -> Option<(Vec<u8>, String, usize, PathBuf)> {
        let manifest = std::fs::read(self.path("manifests", manifest_digest)).ok()?;
        if digest(&manifest) != manifest_digest {
            return None;
        }
        let ((layer, size), _) = super::wasm_layer(&manifest_digest, &manifest).ok()?;
        let blob = self.path("blobs", &layer);
        let on_disk = std::fs::metadata(&blob).ok()?.len();
        (usize::try_from(on_disk).ok() == Some(size)).then_some((manifest, layer, size, blob))
    }

    /// Keeps a manifest and its Wasm layer (both already checked against their digests: the
    /// layer is kept under the digest its manifest gives, not hashed again).
    pub fn put(&self, manifest_digest: &str, manifest: &[u8], wasm: &[u8]) -> Result<(), Error> {
        let ((layer, _), _) = super::wasm_layer(&manifest_digest, manifest)?;
        write(&self.path("blobs", &layer), wasm)?;
        // The manifest last: it is what says the entry is whole.
        write(&self.path("manifests", manifest_digest), manifest)
    }
}

/// Writes `bytes` to `path` through a temporary file, so that a reader never sees half of it.
fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_kept_is_checked_when_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let (_, manifest) = super::super::artifact(b"\0asm", &Default::default());
        let d = digest(&manifest);
        assert!(store.get(&d).is_none());
        store.put(&d, &manifest, b"\0asm").unwrap();
        assert_eq!(store.get(&d).unwrap().1, b"\0asm");
        // Located without reading the layer; read, it is checked.
        let reference = super::super::Reference::parse(&format!("registry.example/p@{d}")).unwrap();
        let kept = super::super::kept(&reference, &store).unwrap();
        assert_eq!(format!("sha256:{}", kept.sha256), digest(b"\0asm"));
        assert_eq!(kept.read().unwrap(), b"\0asm");
        // A damaged layer is not used.
        std::fs::write(store.path("blobs", &digest(b"\0asm")), b"\0asX").unwrap();
        assert!(store.get(&d).is_none());
        let e = kept.read().unwrap_err();
        assert!(e.to_string().contains("kept layer"), "{e}");
        // One of another size is not even located.
        std::fs::write(store.path("blobs", &digest(b"\0asm")), b"\0asm!").unwrap();
        assert!(super::super::kept(&reference, &store).is_none());
    }
}
