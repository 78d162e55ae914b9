//! The signatures of an artifact, as cosign stores them in its registry: the `sha256-<hex>.sig`
//! manifest, and Sigstore bundles among its referrers.

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
/// The largest signature manifest, payload or bundle read.
const MAX_SIGNATURE: usize = 1 << 20;
/// The most signatures of one artifact looked at.
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
    if let Some(manifest) =
        get_json(&client, "manifests", &format!("{tag}.sig"), MANIFEST_ACCEPT).await?
    {
        for layer in manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .take(MAX_SIGNATURES)
        {
            if layer["mediaType"].as_str() != Some(SIMPLE_SIGNING) {
                continue;
            }
            found.push(simple_signing(&client, layer).await?);
        }
    }
    for descriptor in referrers(&client, digest, &tag)
        .await?
        .into_iter()
        .take(MAX_SIGNATURES)
    {
        let Some(manifest_digest) = descriptor["digest"].as_str() else {
            continue;
        };
        let Some(manifest) =
            get_json(&client, "manifests", manifest_digest, MANIFEST_ACCEPT).await?
        else {
            continue;
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
            continue;
        };
        let place = manifest_digest.to_owned();
        let bytes = blob(&client, layer).await?;
        found.push(bundle(place, &bytes));
    }
    Ok(found)
}

/// The referrers of `digest` that are Sigstore bundles: from the registry's referrers API, else
/// from the `sha256-<hex>` index of the referrers tag schema.
async fn referrers(client: &Client, digest: &str, tag: &str) -> Result<Vec<Value>, oci::Error> {
    let index = match get_json(client, "referrers", digest, INDEX_ACCEPT).await {
        Ok(Some(index)) if index["manifests"].is_array() => Some(index),
        // No referrers API (404, or a registry that answers otherwise): the tag schema.
        Ok(_) | Err(oci::Error::Registry { .. }) => None,
        Err(e) => return Err(e),
    };
    let index = match index {
        Some(index) => index,
        None => match get_json(client, "manifests", tag, INDEX_ACCEPT).await? {
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
    let place = layer["digest"].as_str().unwrap_or_default().to_owned();
    let payload = blob(client, layer).await?;
    let mut found = Found {
        place,
        signed: payload.to_vec(),
        names: None,
        signature: Vec::new(),
        certificate: None,
        format: "cosign",
    };
    let annotations = &layer["annotations"];
    if let Some(signature) = annotations[SIGNATURE].as_str() {
        found.signature = base64("the signature", signature).unwrap_or_default();
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
        found.names =
            str_at(&statement, "/critical/image/docker-manifest-digest").map(str::to_owned);
    }
    Ok(found)
}

/// A Sigstore bundle: a DSSE envelope of an in-toto statement, signed with a key (its hint) or a
/// certificate. What cannot be read is kept with no digest named, and refused as such.
pub(super) fn bundle(place: String, bytes: &[u8]) -> Found {
    let mut found = Found {
        place,
        signed: Vec::new(),
        names: None,
        signature: Vec::new(),
        certificate: None,
        format: "bundle",
    };
    let Ok(bundle) = serde_json::from_slice::<Value>(bytes) else {
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
    let (Some(payload), Some(payload_type), Some(signature)) = (
        str_at(envelope, "/payload"),
        str_at(envelope, "/payloadType"),
        str_at(envelope, "/signatures/0/sig"),
    ) else {
        return found;
    };
    let (Ok(payload), Ok(signature)) = (
        base64("the payload", payload),
        base64("the signature", signature),
    ) else {
        return found;
    };
    found.signed = pre_authentication(payload_type, &payload);
    found.signature = signature;
    if payload_type == IN_TOTO
        && let Ok(statement) = serde_json::from_slice::<Value>(&payload)
    {
        found.names = statement["subject"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| str_at(s, "/digest/sha256"))
            .map(|hex| format!("sha256:{hex}"))
            .next();
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
/// registry has none.
async fn get_json(
    client: &Client,
    part: &str,
    name: &str,
    accept: &'static str,
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
    if answer.status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !answer.status.is_success() {
        return Err(client.unexpected(&format!("getting {part} {name}"), &answer));
    }
    if name.starts_with("sha256:") && part == "manifests" && oci::digest(&answer.body) != name {
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
