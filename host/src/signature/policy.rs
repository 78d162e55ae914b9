//! The operator's signature policy (`--plugin-signatures FILE`): which keys and which identities
//! may sign the plugins of which repositories, and whether a signature is required there.
//!
//! ```yaml
//! rules:
//!   - repositories: ["ghcr.io/acme/plugins/*"]
//!     keys:
//!       - file: acme.pub                 # relative to this file's directory
//!     certificates:
//!       - trustedRoot: sigstore/trusted_root.json
//!         identity: https://github.com/acme/plugins/.github/workflows/release.yml@refs/heads/main
//!         issuer: https://token.actions.githubusercontent.com
//!   - repositories: ["registry.internal/experiments/**"]
//!     required: false
//! ```
//!
//! A plugin's `REGISTRY/REPOSITORY` is matched against each rule's patterns in order (`*` stands
//! for any characters but `/`, `**` for any characters); the first rule that matches decides. A
//! repository that no rule covers is refused. An identity counts only in a certificate of the
//! root given with it. Everything is read once, when the policy is.

use std::path::Path;

use serde::Deserialize;

use super::{Authority, Error, Identity, PublicKey, Roots, Trusted, Verified};
use crate::oci::{self, Reference};

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    rules: Vec<RuleDocument>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RuleDocument {
    repositories: Vec<String>,
    #[serde(default = "required_by_default")]
    required: bool,
    #[serde(default)]
    keys: Vec<KeyDocument>,
    #[serde(default)]
    certificates: Vec<CertificateDocument>,
}

fn required_by_default() -> bool {
    true
}

/// A public key: a file (PEM), or the PEM itself.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyDocument {
    file: Option<String>,
    pem: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CertificateDocument {
    /// PEM root certificates, or a Sigstore `trusted_root.json`.
    trusted_root: String,
    identity: String,
    issuer: String,
}

/// A signature policy, read and ready to use.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Where it was read from, for messages.
    pub source: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
struct Rule {
    /// `rules[N] (PATTERN, ...)`, for messages.
    name: String,
    repositories: Vec<String>,
    required: bool,
    trusted: Trusted,
}

/// What the policy says of an artifact it lets through.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// The rule that decided: `rules[N] (PATTERN, ...)`.
    pub rule: String,
    /// The signatures that count; none when the rule lets the artifact through without.
    pub signatures: Vec<Verified>,
    /// Why no signature counts, when the rule does not require one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unverified: Option<String>,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.signatures.is_empty() {
            let why = self.unverified.as_deref().unwrap_or("no signature");
            return write!(f, "not verified, not required by {}: {why}", self.rule);
        }
        let signers: Vec<String> = self
            .signatures
            .iter()
            .map(|s| format!("{} ({})", s.signer, s.format))
            .collect();
        write!(f, "signed by {}, as {} asks", signers.join(", "), self.rule)
    }
}

impl Policy {
    /// Reads the policy at `path`; files it names are read relative to its directory.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Policy {
            origin: source.clone(),
            why: format!("cannot be read: {e}"),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&source, &text, base)
    }

    /// Reads the policy `text` (YAML or JSON) from `source`, files named relative to `base`.
    pub fn parse(source: &str, text: &str, base: &Path) -> Result<Self, Error> {
        let bad = |why: String| Error::Policy {
            origin: source.to_owned(),
            why,
        };
        let document: Document = serde_saphyr::from_str(text).map_err(|e| bad(e.to_string()))?;
        if document.rules.is_empty() {
            return Err(bad(
                "rules: no rule, so every plugin from a registry would be refused; name the \
                 repositories plugins may come from"
                    .into(),
            ));
        }
        let mut rules = Vec::new();
        for (i, rule) in document.rules.into_iter().enumerate() {
            rules.push(Rule::read(i, rule, base).map_err(bad)?);
        }
        Ok(Self {
            source: source.to_owned(),
            rules,
        })
    }

    /// The rule that decides for `reference`.
    fn rule(&self, reference: &Reference) -> Result<&Rule, Error> {
        let repository = reference.repository_name();
        self.rules
            .iter()
            .find(|r| r.repositories.iter().any(|p| matches(p, &repository)))
            .ok_or_else(|| Error::NoRule {
                policy: self.source.clone(),
                repository,
            })
    }

    /// Whether the artifact `reference` (pinned) may be served: the verdict when it may, why
    /// not when it may not (a registry that cannot be asked is an error too, unless the rule
    /// does not require a signature).
    pub async fn check(
        &self,
        reference: &Reference,
        options: &oci::Options,
    ) -> Result<Verdict, Error> {
        let rule = self.rule(reference)?;
        let (signatures, unverified) = if rule.trusted.is_empty() {
            (Vec::new(), Some("the rule trusts no signer".to_owned()))
        } else {
            match super::verify(reference, options, &rule.trusted).await {
                Ok(signatures) => (signatures, None),
                Err(e) if !rule.required => (Vec::new(), Some(e.to_string())),
                Err(e) => {
                    return Err(Error::Rule {
                        rule: rule.name.clone(),
                        policy: self.source.clone(),
                        source: Box::new(e),
                    });
                }
            }
        };
        Ok(Verdict {
            rule: rule.name.clone(),
            signatures,
            unverified,
        })
    }
}

impl Rule {
    fn read(index: usize, rule: RuleDocument, base: &Path) -> Result<Self, String> {
        let at = format!("rules[{index}]");
        if rule.repositories.is_empty() {
            return Err(format!("{at}.repositories: empty; name at least one"));
        }
        for (j, pattern) in rule.repositories.iter().enumerate() {
            repository_pattern(pattern)
                .map_err(|why| format!("{at}.repositories[{j}]: {pattern:?}: {why}"))?;
        }
        let read = |field: &str, file: &str| {
            let path = base.join(file);
            std::fs::read(&path)
                .map(|bytes| (path.display().to_string(), bytes))
                .map_err(|e| format!("{field}: cannot read {}: {e}", path.display()))
        };
        let mut trusted = Trusted::default();
        for (j, key) in rule.keys.iter().enumerate() {
            let field = format!("{at}.keys[{j}]");
            let (origin, pem) = match (&key.file, &key.pem) {
                (Some(file), None) => read(&format!("{field}.file"), file)?,
                (None, Some(pem)) => (field.clone(), pem.as_bytes().to_vec()),
                _ => return Err(format!("{field}: give one of `file` and `pem`")),
            };
            let key = PublicKey::from_pem(&origin, &pem).map_err(|e| format!("{field}: {e}"))?;
            trusted.keys.push(key);
        }
        for (j, c) in rule.certificates.iter().enumerate() {
            let field = format!("{at}.certificates[{j}]");
            for (name, value) in [("identity", &c.identity), ("issuer", &c.issuer)] {
                if value.trim().is_empty() {
                    return Err(format!("{field}.{name}: empty"));
                }
            }
            let (origin, bytes) = read(&format!("{field}.trustedRoot"), &c.trusted_root)?;
            let roots = Roots::from_bytes(&origin, &bytes).map_err(|e| format!("{field}: {e}"))?;
            trusted.authorities.push(Authority {
                roots,
                identities: vec![Identity {
                    subject: c.identity.clone(),
                    issuer: c.issuer.clone(),
                }],
            });
        }
        if rule.required && trusted.is_empty() {
            return Err(format!(
                "{at}: requires a signature and trusts no key or certificate, so nothing could \
                 satisfy it; add `keys` or `certificates`, or `required: false` to let its \
                 repositories through unsigned"
            ));
        }
        Ok(Self {
            name: format!("{at} ({})", rule.repositories.join(", ")),
            repositories: rule.repositories,
            required: rule.required,
            trusted,
        })
    }
}

/// Whether `pattern` can name repositories: `REGISTRY/REPOSITORY` with `*` and `**`, no scheme,
/// tag or digest.
fn repository_pattern(pattern: &str) -> Result<(), &'static str> {
    if pattern == "**" {
        return Ok(());
    }
    if pattern.contains("://") {
        return Err("a pattern names REGISTRY/REPOSITORY, without a scheme");
    }
    if pattern.contains('@') {
        return Err("a pattern names repositories, not digests");
    }
    let Some((registry, repository)) = pattern.split_once('/') else {
        return Err("a pattern names REGISTRY/REPOSITORY (the registry alone: REGISTRY/**)");
    };
    if registry.chars().any(|c| c.is_ascii_uppercase()) {
        return Err("registries are matched lower-case: write the registry in lower case");
    }
    if registry.ends_with('.') || registry.contains(".:") {
        return Err(
            "registries are matched without a trailing dot: write `ghcr.io`, not `ghcr.io.`",
        );
    }
    if registry.ends_with(":443") {
        return Err(
            "registries are matched without the HTTPS port: write `ghcr.io`, not `ghcr.io:443`",
        );
    }
    if repository.contains(':') {
        return Err("a pattern names repositories, not tags");
    }
    if pattern.contains("***") {
        return Err("`*` or `**`, not more");
    }
    Ok(())
}

/// Whether `text` matches `pattern`: `*` any characters but `/`, `**` any characters.
fn matches(pattern: &str, text: &str) -> bool {
    let cuts = || (0..=text.len()).filter(|&i| text.is_char_boundary(i));
    if let Some(rest) = pattern.strip_prefix("**") {
        return cuts().any(|i| matches(rest, &text[i..]));
    }
    if let Some(rest) = pattern.strip_prefix('*') {
        return cuts()
            .take_while(|&i| !text[..i].contains('/'))
            .any(|i| matches(rest, &text[i..]));
    }
    match (pattern.chars().next(), text.chars().next()) {
        (None, None) => true,
        (Some(p), Some(t)) if p == t => matches(&pattern[p.len_utf8()..], &text[t.len_utf8()..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEzKnRHCtJN7DfC+P1hBzeFzPSSkv9
6BxO4/OrD6MTzVzPjdSm3jmZK/Yz1O2/da7TgaQ75ySsi51BXx5VnlMq2Q==
-----END PUBLIC KEY-----
";

    fn parse(text: &str) -> Result<Policy, String> {
        Policy::parse("policy.yaml", text, Path::new(".")).map_err(|e| e.to_string())
    }

    fn reference(text: &str) -> Reference {
        Reference::parse(text).unwrap()
    }

    #[test]
    fn patterns_match_within_a_segment_or_across_them() {
        assert!(matches("ghcr.io/acme/*", "ghcr.io/acme/site"));
        assert!(!matches("ghcr.io/acme/*", "ghcr.io/acme/team/site"));
        assert!(matches("ghcr.io/acme/**", "ghcr.io/acme/team/site"));
        assert!(!matches("ghcr.io/acme/*", "ghcr.io/acmeco/site"));
        assert!(matches("ghcr.io/*/site", "ghcr.io/acme/site"));
        assert!(matches("ghcr.io/acme/site", "ghcr.io/acme/site"));
        assert!(!matches("ghcr.io/acme/site", "ghcr.io/acme/site2"));
        assert!(matches("127.0.0.1:5000/**", "127.0.0.1:5000/p/q"));
        assert!(matches("**", "anything/at/all"));
        assert!(matches("ghcr.io/acme/site-*", "ghcr.io/acme/site-v2"));
    }

    #[test]
    fn the_first_rule_that_matches_decides_and_a_repository_no_rule_covers_is_refused() {
        let policy = parse(&format!(
            "rules:\n- repositories: [ghcr.io/acme/*]\n  keys: [{{pem: {KEY:?}}}]\n\
             - repositories: ['ghcr.io/**']\n  required: false\n"
        ))
        .unwrap();
        let digest = format!("@sha256:{}", "0".repeat(64));
        let acme = policy
            .rule(&reference(&format!("ghcr.io/acme/site{digest}")))
            .unwrap();
        assert!(acme.required && acme.name.starts_with("rules[0]"));
        // Another spelling of the same registry is judged by the same rule.
        for alias in ["GHCR.IO", "ghcr.io.", "ghcr.io:443", "Ghcr.Io.:443"] {
            let rule = policy
                .rule(&reference(&format!("{alias}/acme/site{digest}")))
                .unwrap();
            assert!(rule.name.starts_with("rules[0]"), "{alias}: {}", rule.name);
        }
        let other = policy
            .rule(&reference(&format!("ghcr.io/other/site{digest}")))
            .unwrap();
        assert!(!other.required && other.name.starts_with("rules[1]"));
        let e = policy
            .rule(&reference(&format!("quay.io/acme/site{digest}")))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "no rule of the signature policy policy.yaml covers quay.io/acme/site: its plugins are not served"
        );
    }

    #[test]
    fn a_policy_that_cannot_be_used_says_which_field() {
        let e = parse("rules: []").unwrap_err();
        assert!(e.starts_with("policy.yaml: rules: no rule"), "{e}");
        let e = parse("rules:\n- repositories: [ghcr.io/acme/*]\n").unwrap_err();
        assert!(
            e.contains("rules[0]: requires a signature and trusts no key or certificate"),
            "{e}"
        );
        let e = parse("rules:\n- repositories: ['oci://ghcr.io/a/*']\n  required: false\n")
            .unwrap_err();
        assert!(
            e.contains("rules[0].repositories[0]") && e.contains("scheme"),
            "{e}"
        );
        let e =
            parse("rules:\n- repositories: ['ghcr.io/a:1.0']\n  required: false\n").unwrap_err();
        assert!(e.contains("not tags"), "{e}");
        for (pattern, says) in [
            ("GHCR.io/a/*", "lower case"),
            ("ghcr.io./a/*", "trailing dot"),
            ("ghcr.io:443/a/*", "HTTPS port"),
        ] {
            let e = parse(&format!(
                "rules:\n- repositories: ['{pattern}']\n  required: false\n"
            ))
            .unwrap_err();
            assert!(
                e.contains("rules[0].repositories[0]") && e.contains(says),
                "{e}"
            );
        }
        let e = parse("rules:\n- repositories: [ghcr.io]\n  required: false\n").unwrap_err();
        assert!(e.contains("REGISTRY/**"), "{e}");
        let e = parse(
            "rules:\n- repositories: [ghcr.io/a/*]\n  keys: [{file: /nonexistent/cosign.pub}]\n",
        )
        .unwrap_err();
        assert!(
            e.contains("rules[0].keys[0].file: cannot read /nonexistent/cosign.pub"),
            "{e}"
        );
        let e = parse("rules:\n- repositories: [ghcr.io/a/*]\n  keys: [{}]\n").unwrap_err();
        assert!(e.contains("rules[0].keys[0]: give one of"), "{e}");
        let e = parse("rules:\n- repositories: [ghcr.io/a/*]\n  key: [{}]\n").unwrap_err();
        assert!(e.contains("key"), "an unknown field is refused: {e}");
        let e = parse(
            "rules:\n- repositories: [ghcr.io/a/*]\n  certificates: [{trustedRoot: r.pem, identity: '', issuer: i}]\n",
        )
        .unwrap_err();
        assert!(
            e.contains("rules[0].certificates[0].identity: empty"),
            "{e}"
        );
    }

    #[test]
    fn key_files_are_read_relative_to_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("keys")).unwrap();
        std::fs::write(dir.path().join("keys/acme.pub"), KEY).unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(
            &path,
            "rules:\n- repositories: [ghcr.io/acme/*]\n  keys: [{file: keys/acme.pub}]\n",
        )
        .unwrap();
        let policy = Policy::from_file(&path).unwrap();
        assert_eq!(policy.rules[0].trusted.keys.len(), 1);
    }

    #[tokio::test]
    async fn a_rule_that_does_not_require_a_signature_lets_an_unverified_artifact_through() {
        let policy = parse("rules:\n- repositories: ['**']\n  required: false\n").unwrap();
        let verdict = policy
            .check(
                &reference(&format!("127.0.0.1:1/p@sha256:{}", "0".repeat(64))),
                &oci::Options::default(),
            )
            .await
            .unwrap();
        assert!(verdict.signatures.is_empty());
        assert_eq!(
            verdict.unverified.as_deref(),
            Some("the rule trusts no signer")
        );
        assert!(
            verdict
                .to_string()
                .starts_with("not verified, not required by rules[0] (**)")
        );
    }

    /// A registry that cannot be asked: a rule that requires a signature refuses (and says so
    /// as a transient error); one that does not serves, saying why nothing was verified.
    #[tokio::test]
    async fn a_check_that_cannot_be_made_refuses_only_where_a_signature_is_required() {
        // A port nothing listens on: taken, then let go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let digest = format!("@sha256:{}", "0".repeat(64));
        let text = |required: bool| {
            format!(
                "rules:\n- repositories: ['127.0.0.1:{port}/**']\n  required: {required}\n  keys: [{{pem: {KEY:?}}}]\n"
            )
        };
        let target = reference(&format!("127.0.0.1:{port}/acme/site{digest}"));
        let options = oci::Options::default();

        let required = parse(&text(true)).unwrap();
        let e = required.check(&target, &options).await.unwrap_err();
        assert!(e.is_transient() && !e.is_refusal(), "{e}");
        assert!(e.to_string().contains("rules[0]"), "{e}");

        let optional = parse(&text(false)).unwrap();
        let verdict = optional.check(&target, &options).await.unwrap();
        assert!(verdict.signatures.is_empty());
        let why = verdict.unverified.expect("why nothing was verified");
        assert!(why.contains(&format!("127.0.0.1:{port}")), "{why}");
    }
}
