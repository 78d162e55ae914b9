//! The signatures of an artifact, as cosign stores them in its registry: the `sha256-<hex>.sig`
//! manifest, and Sigstore bundles among its referrers. An entry that cannot be read is kept with
//! its problem, so that it is said without hiding the others.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::Value;

use super::{Found, base64, str_at, trust::pem_blocks};
use crate::oci::{self, Client, Reference};

/// The media type of a simple-signing payload layer.
const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// What a simple-signing payload says it is.
const SIMPLE_SIGNING_TYPE: &str = "cosign container image signature";
/// The annotations cosign puts a signature, its certificate and the certificate's chain in.
const SIGNATURE: &str = "dev.cosignproject.cosign/signature";
const CERTIFICATE: &str = "dev.sigstore.cosign/certificate";
const CHAIN: &str = "dev.sigstore.cosign/chain";
/// The artifact type (and layer media type) of a Sigstore bundle, of any version.
const BUNDLE: &str = "application/vnd.dev.sigstore.bundle";
/// The payload type of an in-toto statement in a DSSE envelope.
const IN_TOTO: &str = "application/vnd.in-toto+json";
/// The predicate of the statement `cosign sign` makes: a signature, not an attestation of
/// something else (an SBOM, a scan) made with the same key.
const COSIGN_SIGN: &str = "https://sigstore.dev/cosign/sign/v1";
/// The largest signature manifest, payload or bundle read.
const MAX_SIGNATURE: usize = 1 << 20;
/// The most signatures of one artifact looked at, in each format.
const MAX_SIGNATURES: usize = 32;

const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
const INDEX_ACCEPT: &str = "application/vnd.oci.image.index.v1+json";

/// Every signature of `digest` (in `reference`'s repository) in either format.
pub(super) async fn signatures(
    reference: &Reference,
    digest: &str,
    options: &oci::Options,
) -> Result<Vec<Found>, oci::Error> {
    let client = Client::connect(reference, options, false).await?;
    let tag = digest.replacen(':', "-", 1);
    let mut found = Vec::new();
    let manifest = get_json(
        &client,
        "manifests",
        &format!("{tag}.sig"),
        MANIFEST_ACCEPT,
        &[],
    )
    .await?;
    // Collected before the awaits below: an iterator of closures over references held across
    // them makes the future unusable in a spawned task (rust-lang/rust#64552).
    let layers: Vec<Value> = manifest
        .iter()
        .flat_map(|m| m["layers"].as_array())
        .flatten()
        .filter(|l| l["mediaType"].as_str() == Some(SIMPLE_SIGNING))
        .take(MAX_SIGNATURES)
        .cloned()
        .collect();
    for layer in &layers {
        found.push(match simple_signing(&client, layer).await {
            Ok(f) => f,
            Err(e) => unreadable("cosign", layer["digest"].as_str(), &e),
        });
    }
    for descriptor in referrers(&client, digest, &tag)
        .await?
        .into_iter()
        .take(MAX_SIGNATURES)
    {
        let at = descriptor["digest"].as_str();
        match referrer(&client, at).await {
            Ok(Some(f)) => found.push(f),
            Ok(None) => {}
            Err(e) => found.push(unreadable("bundle", at, &e)),
        }
    }
    Ok(found)
}

/// An entry that could not be read.
fn unreadable(format: &'static str, place: Option<&str>, e: &oci::Error) -> Found {
    Found {
        place: shown_digest(place),
        signed: Vec::new(),
        names: Vec::new(),
        signatures: Vec::new(),
        certificate: None,
        problem: Some(format!("cannot be read: {e}")),
        format,
    }
}

/// A digest from the registry as messages show it: itself when it is one.
fn shown_digest(d: Option<&str>) -> String {
    match d {
        Some(d) if oci::is_digest(d) => d.to_owned(),
        _ => "(an entry not named by a digest)".into(),
    }
}

/// The error for something the registry names by other than a digest.
fn not_a_digest(client: &Client, what: &str) -> oci::Error {
    oci::Error::Registry {
        registry: client.reference().registry.clone(),
        why: format!("{what} is not named by a digest"),
    }
}

/// The bundle the referrer manifest `digest` holds, if it holds one.
async fn referrer(client: &Client, digest: Option<&str>) -> Result<Option<Found>, oci::Error> {
    let Some(digest) = digest.filter(|d| oci::is_digest(d)) else {
        return Err(not_a_digest(client, "a referrer"));
    };
    let Some(manifest) = get_json(client, "manifests", digest, MANIFEST_ACCEPT, &[]).await? else {
        return Ok(None);
    };
    let Some(layer) = manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| {
            l["mediaType"]
                .as_str()
                .is_some_and(|m| m.starts_with(BUNDLE))
        })
    else {
        return Ok(None);
    };
    let bytes = blob(client, layer).await?;
    Ok(Some(bundle(digest.to_owned(), &bytes)))
}

/// The referrers of `digest` that are Sigstore bundles: from the registry's referrers API, else
/// (a registry without it answers 404, 400 or 405) from the `sha256-<hex>` index of the
/// referrers tag schema. Any other failure is the registry's, and said so.
async fn referrers(client: &Client, digest: &str, tag: &str) -> Result<Vec<Value>, oci::Error> {
    let absent = [StatusCode::BAD_REQUEST, StatusCode::METHOD_NOT_ALLOWED];
    let api = get_json(client, "referrers", digest, INDEX_ACCEPT, &absent)
        .await?
        .filter(|index| index["manifests"].is_array());
    let index = match api {
        Some(index) => index,
        None => match get_json(client, "manifests", tag, INDEX_ACCEPT, &[]).await? {
            Some(index) => index,
            None => return Ok(Vec::new()),
        },
    };
    Ok(index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["artifactType"]
                .as_str()
                .is_some_and(|t| t.starts_with(BUNDLE))
        })
        .cloned()
        .collect())
}

/// A simple-signing layer of a `.sig` manifest: its payload, signature and certificate.
async fn simple_signing(client: &Client, layer: &Value) -> Result<Found, oci::Error> {
    let payload = blob(client, layer).await?;
    let mut found = Found {
        place: shown_digest(layer["digest"].as_str()),
        signed: payload.to_vec(),
        names: Vec::new(),
        signatures: Vec::new(),
        certificate: None,
        problem: None,
        format: "cosign",
    };
    let annotations = &layer["annotations"];
    match annotations[SIGNATURE]
        .as_str()
        .map(|s| base64("its signature", s))
    {
        Some(Ok(signature)) => found.signatures.push(signature),
        Some(Err(e)) => found.problem = Some(e),
        None => found.problem = Some(format!("has no {SIGNATURE} annotation")),
    }
    if let Some(pem) = annotations[CERTIFICATE].as_str()
        && let Ok(mut leaf) = pem_blocks(pem.as_bytes(), "CERTIFICATE")
        && !leaf.is_empty()
    {
        let chain = annotations[CHAIN]
            .as_str()
            .and_then(|c| pem_blocks(c.as_bytes(), "CERTIFICATE").ok())
            .unwrap_or_default();
        found.certificate = Some((leaf.remove(0), chain));
    }
    let statement: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
    if str_at(&statement, "/critical/type") == Some(SIMPLE_SIGNING_TYPE) {
        found.names.extend(
            str_at(&statement, "/critical/image/docker-manifest-digest").map(str::to_owned),
        );
    }
    Ok(found)
}

/// A Sigstore bundle: a DSSE envelope of an in-toto statement of cosign's signing predicate,
/// signed with a key (its hint) or a certificate. What cannot be used says why.
pub(super) fn bundle(place: String, bytes: &[u8]) -> Found {
    let mut found = Found {
        place,
        signed: Vec::new(),
        names: Vec::new(),
        signatures: Vec::new(),
        certificate: None,
        problem: None,
        format: "bundle",
    };
    let Ok(bundle) = serde_json::from_slice::<Value>(bytes) else {
        found.problem = Some("is not JSON".into());
        return found;
    };
    let material = &bundle["verificationMaterial"];
    let certificates: Vec<Vec<u8>> = match str_at(material, "/certificate/rawBytes") {
        Some(raw) => base64("the certificate", raw).into_iter().collect(),
        None => material["x509CertificateChain"]["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["rawBytes"].as_str())
            .filter_map(|raw| base64("a certificate", raw).ok())
            .collect(),
    };
    let mut certificates = certificates.into_iter();
    if let Some(leaf) = certificates.next() {
        found.certificate = Some((leaf, certificates.collect()));
    }
    let envelope = &bundle["dsseEnvelope"];
    let (Some(payload), Some(payload_type)) = (
        str_at(envelope, "/payload"),
        str_at(envelope, "/payloadType"),
    ) else {
        found.problem = Some("holds no DSSE envelope (a message signature is not read)".into());
        return found;
    };
    let payload = match base64("its payload", payload) {
        Ok(p) => p,
        Err(e) => {
            found.problem = Some(e);
            return found;
        }
    };
    found.signed = pre_authentication(payload_type, &payload);
    found.signatures = envelope["signatures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["sig"].as_str())
        .filter_map(|s| base64("a signature", s).ok())
        .collect();
    let statement: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
    if payload_type != IN_TOTO {
        found.problem = Some(format!(
            "its payload is not an in-toto statement ({IN_TOTO})"
        ));
    } else if statement["predicateType"].as_str() != Some(COSIGN_SIGN) {
        found.problem = Some(format!(
            "is an attestation, not a signature (its predicate is not {COSIGN_SIGN})"
        ));
    } else {
        found.names = statement["subject"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| str_at(s, "/digest/sha256"))
            .map(|hex| format!("sha256:{hex}"))
            .collect();
    }
    found
}

/// DSSE's pre-authentication encoding of a payload: what its signature signs.
pub(super) fn pre_authentication(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut pae = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    pae.extend_from_slice(payload);
    pae
}

/// The manifest (or referrers list) `name` of the repository's `part`, as JSON; `None` when the
/// registry has none (404, or one of `absent`).
async fn get_json(
    client: &Client,
    part: &str,
    name: &str,
    accept: &'static str,
    absent: &[StatusCode],
) -> Result<Option<Value>, oci::Error> {
    let mut headers = HeaderMap::new();
    headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
    let answer = client
        .send(
            Method::GET,
            &client.path(part, name),
            headers,
            Bytes::new(),
            MAX_SIGNATURE,
        )
        .await?;
    if answer.status == StatusCode::NOT_FOUND || absent.contains(&answer.status) {
        return Ok(None);
    }
    if !answer.status.is_success() {
        return Err(client.unexpected(&format!("getting {part} {name}"), &answer));
    }
    if part == "manifests" && oci::is_digest(name) && oci::digest(&answer.body) != name {
        return Err(oci::Error::Digest {
            what: format!("the signature manifest {name}"),
            expected: name.to_owned(),
            actual: oci::digest(&answer.body),
        });
    }
    Ok(serde_json::from_slice(&answer.body).ok())
}

/// The blob a layer names, checked against its digest.
async fn blob(client: &Client, layer: &Value) -> Result<Bytes, oci::Error> {
    let digest = layer["digest"].as_str().unwrap_or_default();
    if !oci::is_digest(digest) {
        return Err(not_a_digest(client, "a signature layer"));
    }
    let answer = client
        .send(
            Method::GET,
            &client.path("blobs", digest),
            HeaderMap::new(),
            Bytes::new(),
            MAX_SIGNATURE,
        )
        .await?;
    if !answer.status.is_success() {
        return Err(client.unexpected(&format!("getting the signature layer {digest}"), &answer));
    }
    let actual = oci::digest(&answer.body);
    if actual != digest {
        return Err(oci::Error::Digest {
            what: format!("the signature layer {digest}"),
            expected: digest.to_owned(),
            actual,
        });
    }
    Ok(answer.body)
}
