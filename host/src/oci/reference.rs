//! Where a plugin lives in a registry: `[oci://]registry[:port]/repository[:tag][@sha256:hex]`.

use std::fmt;

use super::Error;

/// A reference to a manifest in an OCI registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The registry's host, with its port when it has one (`ghcr.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// The repository inside it (`hanzoai/plugins/site`).
    pub repository: String,
    /// The tag, when the reference names one.
    pub tag: Option<String>,
    /// The manifest's digest (`sha256:` and 64 hex digits), when the reference names one.
    pub digest: Option<String>,
}

/// The prefix that tells a reference from a file in `--plugin`.
pub const SCHEME: &str = "oci://";

impl Reference {
    /// Reads `text`, with or without `oci://`. The first path segment is always the registry.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let invalid = |why: &str| Error::Reference {
            reference: text.to_owned(),
            why: why.to_owned(),
        };
        let rest = text.strip_prefix(SCHEME).unwrap_or(text);
        let (rest, digest) = match rest.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (rest, None),
        };
        if let Some(d) = digest
            && !is_digest(d)
        {
            return Err(invalid(
                "the digest must be sha256: followed by 64 lower-case hex digits",
            ));
        }
        let Some((registry, path)) = rest.split_once('/') else {
            return Err(invalid(
                "expected REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST], such as ghcr.io/org/plugin:1.0",
            ));
        };
        if registry.is_empty()
            || !registry
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c))
        {
            return Err(invalid(
                "the registry must be a host name or address, with an optional port",
            ));
        }
        // A tag follows the last ':' after the last '/'.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
            _ => (path, None),
        };
        if repository.is_empty()
            || !repository.split('/').all(|c| {
                !c.is_empty()
                    && c.chars().all(|ch| {
                        ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch)
                    })
                    && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
                    && c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
            })
        {
            return Err(invalid(
                "the repository must be lower-case path components of letters, digits, '.', '_' and '-'",
            ));
        }
        if let Some(tag) = tag
            && (tag.is_empty()
                || tag.len() > 128
                || !tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                || !tag
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
        {
            return Err(invalid(
                "a tag is up to 128 letters, digits, '.', '_' and '-', not starting with '.' or '-'",
            ));
        }
        Ok(Self {
            registry: canonical_registry(registry),
            repository: repository.to_owned(),
            tag: tag.map(str::to_owned),
            digest: digest.map(str::to_owned),
        })
    }

    /// The tag or digest to ask the registry for: the digest when there is one (it cannot move),
    /// else the tag, else `latest`.
    pub fn target(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// The same repository, pinned to `digest`.
    pub fn pinned(&self, digest: &str) -> Self {
        Self {
            digest: Some(digest.to_owned()),
            ..self.clone()
        }
    }

    /// `registry/repository`, the registry without the port HTTPS implies (`ghcr.io:443` is
    /// `ghcr.io`): what the signature policy's patterns are matched against, so that no way of
    /// writing a registry escapes the rule written for it.
    pub fn repository_name(&self) -> String {
        let registry = self
            .registry
            .strip_suffix(":443")
            .filter(|_| !self.is_loopback())
            .unwrap_or(&self.registry);
        format!("{registry}/{}", self.repository)
    }

    /// Whether the registry is on this machine (`localhost`, `127.0.0.0/8`, `[::1]`): the only
    /// ones spoken to over plain HTTP without being asked.
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => self.registry.split(':').next().unwrap_or_default(),
        };
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `registry` as one spelling: host names are case-insensitive and `ghcr.io.` is `ghcr.io`, so
/// both are written lower-case and without the trailing dot.
fn canonical_registry(registry: &str) -> String {
    let registry = registry.to_ascii_lowercase();
    if registry.starts_with('[') {
        return registry;
    }
    match registry.split_once(':') {
        Some((host, port)) => format!("{}:{port}", host.trim_end_matches('.')),
        None => registry.trim_end_matches('.').to_owned(),
    }
}

/// Whether `d` is a sha256 digest as registries write it.
pub fn is_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_as_registries_write_them() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("oci://127.0.0.1:5000/org/site:1.0@{digest}")).unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "org/site");
        assert_eq!(r.tag.as_deref(), Some("1.0"));
        assert_eq!(r.target(), digest);
        assert!(r.is_loopback());
        assert_eq!(
            r.to_string(),
            format!("127.0.0.1:5000/org/site:1.0@{digest}")
        );

        let r = Reference::parse("ghcr.io/hanzoai/plugins/site").unwrap();
        assert_eq!((r.tag.as_deref(), r.target()), (None, "latest"));
        assert!(!r.is_loopback());
        assert!(
            Reference::parse("localhost:5000/a:b")
                .unwrap()
                .is_loopback()
        );
        assert!(Reference::parse("[::1]:5000/a:b").unwrap().is_loopback());
    }

    #[test]
    fn a_registry_has_one_spelling() {
        for text in [
            "GHCR.io/acme/site:1",
            "ghcr.io./acme/site:1",
            "Ghcr.IO.:443/acme/site:1",
        ] {
            let r = Reference::parse(text).unwrap();
            assert!(r.registry.starts_with("ghcr.io"), "{text}: {}", r.registry);
            assert_eq!(r.repository_name(), "ghcr.io/acme/site", "{text}");
        }
        // A loopback registry's port is where it listens, whatever the scheme.
        let r = Reference::parse("localhost:443/a").unwrap();
        assert_eq!(r.repository_name(), "localhost:443/a");
        assert_eq!(
            Reference::parse("[::1]:5000/a").unwrap().registry,
            "[::1]:5000"
        );
    }

    #[test]
    fn a_bad_reference_says_what_is_wrong() {
        for (text, says) in [
            ("site.wasm", "REGISTRY/REPOSITORY"),
            ("ghcr.io/Org/site:1", "lower-case"),
            ("ghcr.io/org/site@sha256:abc", "64 lower-case hex"),
            ("ghcr.io/org/site:-x", "a tag"),
            ("ghcr.io/org//site", "lower-case path"),
        ] {
            let e = Reference::parse(text).unwrap_err().to_string();
            assert!(e.contains(text) && e.contains(says), "{text}: {e}");
        }
    }
}
