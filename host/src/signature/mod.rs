//! Signatures of plugins, verified before a plugin runs: who built the bytes a digest names.
//!
//! Two formats, both as cosign stores them beside the artifact in its registry:
//!
//! - the **cosign signature**: an image manifest tagged `sha256-<hex>.sig` whose layers are
//!   "simple signing" payloads naming the artifact's digest, each with its signature (and, when
//!   signed with a certificate, the certificate and its chain) in annotations;
//! - the **Sigstore bundle** (cosign 3's default): a referrer of the artifact (found through the
//!   registry's referrers API, or the `sha256-<hex>` tag of the referrers tag schema) whose one
//!   layer is a bundle: a DSSE envelope of an in-toto statement of cosign's signing predicate
//!   (`https://sigstore.dev/cosign/sign/v1`; an attestation of anything else is no signature)
//!   naming the artifact's digest, with the public key's hint or the certificate. Bundles of a
//!   message signature are not read (cosign signs images with DSSE).
//!
//! A signature counts when it names this very digest and was made with a trusted public key, or
//! with a certificate that chains to a trusted root for code signing and names a trusted
//! identity (subject and OIDC issuer, as `cosign verify --certificate-identity
//! --certificate-oidc-issuer`). Nothing is fetched but from the artifact's registry: no
//! transparency log, no Fulcio, no TUF; a certificate is checked against the time of the check
//! (a Fulcio certificate, valid for ten minutes, needs a transparency log's timestamp to be
//! checked later, which the host does not consult: see docs/security.md).

mod fetch;
mod policy;
mod trust;

pub use policy::{Policy, Verdict};
pub use trust::{Identity, PublicKey, Roots};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value;

use crate::oci::{self, Reference};

/// Why signatures could not be checked, or did not satisfy what is trusted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The registry could not be asked.
    #[error(transparent)]
    Registry(#[from] oci::Error),
    /// The artifact is not named by digest: what a signature signs is a digest.
    #[error("{reference} is not named by digest: signatures are checked against a digest")]
    NotPinned { reference: String },
    /// No signature was found.
    #[error("{reference} is not signed (no cosign signature or Sigstore bundle in its registry)")]
    Unsigned { reference: String },
    /// Signatures were found; none was made by what is trusted.
    #[error("{reference} has no signature of a trusted signer: {}", .reasons.join("; "))]
    Untrusted {
        reference: String,
        /// Why each signature found does not count.
        reasons: Vec<String>,
    },
    /// A public key cannot be used.
    #[error("key {origin}: {why}")]
    Key { origin: String, why: String },
    /// Certificate authorities cannot be used.
    #[error("trusted roots {origin}: {why}")]
    Roots { origin: String, why: String },
    /// The signature policy cannot be used.
    #[error("{origin}: {why}")]
    Policy { origin: String, why: String },
    /// No rule of the signature policy names the artifact's repository.
    #[error(
        "no rule of the signature policy {policy} covers {repository}: its plugins are not served"
    )]
    NoRule { policy: String, repository: String },
    /// A rule of the signature policy refused the artifact.
    #[error("{source} ({rule} of the signature policy {policy})")]
    Rule {
        rule: String,
        policy: String,
        source: Box<Error>,
    },
    /// The registry took longer than the whole check may.
    #[error("the signatures of {reference} could not be read within {limit:?}")]
    Deadline {
        reference: String,
        limit: std::time::Duration,
    },
}

impl Error {
    /// Whether asking again may help: the registry could not be asked, or not in time.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Registry(oci::Error::Unreachable { .. } | oci::Error::Registry { .. })
            | Self::Deadline { .. } => true,
            Self::Rule { source, .. } => source.is_transient(),
            _ => false,
        }
    }

    /// Whether the signatures were read and the answer is no: unsigned, not by what is
    /// trusted, or from a repository the policy does not cover.
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::Unsigned { .. } | Self::Untrusted { .. } | Self::NoRule { .. } => true,
            Self::Rule { source, .. } => source.is_refusal(),
            _ => false,
        }
    }
}

/// What signatures are checked against: keys, and certificate authorities each with the
/// identities it may vouch for.
#[derive(Debug, Clone, Default)]
pub struct Trusted {
    pub keys: Vec<PublicKey>,
    pub authorities: Vec<Authority>,
}

/// Certificate authorities and the identities whose certificates of theirs count: an identity
/// vouched for by another authority does not.
#[derive(Debug, Clone)]
pub struct Authority {
    pub roots: Roots,
    pub identities: Vec<Identity>,
}

impl Trusted {
    /// Whether nothing is trusted (every signature would be refused).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.authorities.iter().all(|a| a.identities.is_empty())
    }
}

/// Who made a signature that counts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Signer {
    /// A trusted public key: where it came from and its fingerprint.
    Key { source: String, fingerprint: String },
    /// A certificate of a trusted root naming a trusted identity.
    Certificate(Identity),
}

impl std::fmt::Display for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Key {
                source,
                fingerprint,
            } => write!(f, "key {source} ({fingerprint})"),
            Self::Certificate(identity) => write!(f, "certificate of {identity}"),
        }
    }
}

/// A signature that counts: who made it and in which format.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    pub signer: Signer,
    /// `cosign` (a `.sig` signature) or `bundle` (a Sigstore bundle).
    pub format: &'static str,
}

/// A signature as found in the registry, before it is checked.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Where it was found (the manifest's digest), for messages.
    pub place: String,
    /// What was signed (the simple-signing payload, or DSSE's pre-authentication encoding).
    pub signed: Vec<u8>,
    /// The digests the signed statement names.
    pub names: Vec<String>,
    /// The signatures over `signed` (DSSE may hold several).
    pub signatures: Vec<Vec<u8>>,
    /// Why it could not be read, when it could not (one bad entry does not hide the others).
    pub problem: Option<String>,
    /// The signing certificate (DER) and its chain (DER), when signed with one.
    pub certificate: Option<(Vec<u8>, Vec<Vec<u8>>)>,
    pub format: &'static str,
}

/// The signatures of `reference` (named by digest) that `trusted` accepts; an error says why
/// there are none.
pub async fn verify(
    reference: &Reference,
    options: &oci::Options,
    trusted: &Trusted,
) -> Result<Vec<Verified>, Error> {
    let (digest, found) = find(reference, options).await?;
    judge(&reference.to_string(), &digest, &found, trusted)
}

/// The digest `reference` names, and the signatures stored for it in its registry.
pub(crate) async fn find(
    reference: &Reference,
    options: &oci::Options,
) -> Result<(String, Vec<Found>), Error> {
    let Some(digest) = reference.digest.clone() else {
        return Err(Error::NotPinned {
            reference: reference.to_string(),
        });
    };
    // However a registry answers (slowly, through redirects, with many entries), the whole
    // check ends.
    let limit = options.timeout.saturating_mul(4);
    let found = tokio::time::timeout(limit, fetch::signatures(reference, &digest, options))
        .await
        .map_err(|_| Error::Deadline {
            reference: reference.to_string(),
            limit,
        })??;
    Ok((digest, found))
}

/// A signature as the registry holds it, before anything is trusted (`host inspect`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Seen {
    /// `cosign` or `bundle`.
    pub format: String,
    /// The digest of the manifest that holds it.
    pub place: String,
    /// Whether what it signs names the artifact's digest (else it is another artifact's).
    pub names_this_digest: bool,
    /// For a certificate: who it names (not verified: no root is trusted here); none for a key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// Why it cannot be read, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.format, self.place)?;
        if let Some(problem) = &self.problem {
            return write!(f, ": {problem}");
        }
        if !self.names_this_digest {
            write!(f, ", of another digest")?;
        }
        match &self.certificate {
            Some(named) => write!(f, ", certificate naming {named} (not verified)"),
            None => write!(f, ", made with a key"),
        }
    }
}

/// The signatures stored beside `reference` (named by digest), as they are, nothing verified.
pub async fn seen(reference: &Reference, options: &oci::Options) -> Result<Vec<Seen>, Error> {
    let (digest, found) = find(reference, options).await?;
    Ok(found
        .into_iter()
        .map(|f| Seen {
            format: f.format.to_owned(),
            names_this_digest: f.names.contains(&digest),
            certificate: f.certificate.as_ref().map(|(leaf, _)| {
                trust::names_of(leaf).map_or_else(|why| why, |named| named.to_string())
            }),
            problem: f.problem,
            place: f.place,
        })
        .collect())
}

/// Which of the signatures `found` for `digest` count under `trusted`.
pub(crate) fn judge(
    reference: &str,
    digest: &str,
    found: &[Found],
    trusted: &Trusted,
) -> Result<Vec<Verified>, Error> {
    if found.is_empty() {
        return Err(Error::Unsigned {
            reference: reference.to_owned(),
        });
    }
    let mut verified = Vec::new();
    let mut reasons = Vec::new();
    for f in found {
        match check(digest, f, trusted) {
            Ok(signer) => {
                let v = Verified {
                    signer,
                    format: f.format,
                };
                if !verified.contains(&v) {
                    verified.push(v);
                }
            }
            Err(why) => reasons.push(format!("{} {}: {why}", f.format, f.place)),
        }
    }
    if verified.is_empty() {
        return Err(Error::Untrusted {
            reference: reference.to_owned(),
            reasons,
        });
    }
    Ok(verified)
}

/// Who made `f`, if it signs `digest` and was made by what is trusted.
fn check(digest: &str, f: &Found, trusted: &Trusted) -> Result<Signer, String> {
    if let Some(problem) = &f.problem {
        return Err(problem.clone());
    }
    if !f.names.iter().any(|n| n == digest) {
        return Err(match f.names.first() {
            Some(named) if oci::is_digest(named) => format!("signs {named}, not {digest}"),
            Some(_) => "names something that is not a digest".into(),
            None => "names no digest".into(),
        });
    }
    let by_key = |k: &&PublicKey| f.signatures.iter().any(|s| k.verifies(&f.signed, s));
    match &f.certificate {
        None => trusted
            .keys
            .iter()
            .find(by_key)
            .map(|k| Signer::Key {
                source: k.source.clone(),
                fingerprint: k.fingerprint(),
            })
            .ok_or_else(|| {
                if trusted.keys.is_empty() {
                    "made with a key, and no key is trusted".to_owned()
                } else {
                    "not made with any trusted key".to_owned()
                }
            }),
        Some((leaf, chain)) => {
            // A certificate's key may also be trusted as a key (cosign signs with a key and
            // attaches a certificate for it).
            if let Some(k) = trusted.keys.iter().find(by_key) {
                return Ok(Signer::Key {
                    source: k.source.clone(),
                    fingerprint: k.fingerprint(),
                });
            }
            if trusted.authorities.is_empty() {
                return Err(
                    "made with a certificate, and no certificate authority is trusted".into(),
                );
            }
            let mut why = Vec::new();
            for authority in &trusted.authorities {
                for signature in &f.signatures {
                    match authority.roots.verify(leaf, chain, &f.signed, signature) {
                        Ok(named) => match named.matching(&authority.identities) {
                            Some(identity) => return Ok(Signer::Certificate(identity.clone())),
                            None => why.push(format!(
                                "the certificate names {named}, not a trusted identity"
                            )),
                        },
                        Err(e) => why.push(e),
                    }
                }
            }
            why.dedup();
            Err(why.join("; "))
        }
    }
}

/// Decodes standard base64, naming `what` when it is not.
fn base64(what: &str, text: &str) -> Result<Vec<u8>, String> {
    BASE64
        .decode(text.trim())
        .map_err(|e| format!("{what} is not base64: {e}"))
}

/// The string at `pointer` in `v`.
fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

#[cfg(test)]
mod tests;
