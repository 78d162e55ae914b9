//! What a signature is checked against: public keys, and certificate authorities with the
//! identities they may vouch for; and the checks themselves, on ring (signatures) and
//! rustls-webpki (certificate chains), the same crates the host's TLS verifies servers with.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rustls::pki_types::{CertificateDer, SignatureVerificationAlgorithm, UnixTime};
use x509_parser::prelude::{FromDer as _, GeneralName, ParsedExtension, X509Certificate};

use super::Error;

/// Extended key usage `codeSigning` (1.3.6.1.5.5.7.3.3), which a signing certificate must have.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
/// The OIDC issuer of a Fulcio certificate: as a DER UTF8String (1.3.6.1.4.1.57264.1.8) and, in
/// older certificates, as raw bytes (1.3.6.1.4.1.57264.1.1).
const ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
const ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";

/// A public key signatures may be made with (`cosign generate-key-pair`'s `cosign.pub`, or any
/// PEM `PUBLIC KEY`: ECDSA P-256 or P-384, Ed25519, RSA).
#[derive(Debug, Clone)]
pub struct PublicKey {
    /// Where it came from (a file, a Secret), for messages.
    pub source: String,
    /// The DER SubjectPublicKeyInfo.
    spki: Vec<u8>,
}

impl PublicKey {
    /// Reads a PEM `PUBLIC KEY`.
    pub fn from_pem(source: &str, pem: &[u8]) -> Result<Self, Error> {
        let bad = |why: String| Error::Key {
            origin: source.to_owned(),
            why,
        };
        let der = pem_blocks(pem, "PUBLIC KEY")
            .map_err(bad)?
            .into_iter()
            .next()
            .ok_or_else(|| bad("holds no PEM `PUBLIC KEY` block".into()))?;
        algorithms(&der).map_err(bad)?;
        Ok(Self {
            source: source.to_owned(),
            spki: der,
        })
    }

    /// `sha256:<hex>` of the key (its DER SubjectPublicKeyInfo): how status names it.
    pub fn fingerprint(&self) -> String {
        crate::oci::digest(&self.spki)
    }

    /// Whether `signature` over `message` was made with this key.
    pub(super) fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        verify_with_spki(&self.spki, message, signature)
    }
}

/// Who a certificate must name for its signature to count: the subject (a URI or an email in
/// its subject alternative names) and the OIDC issuer that vouched for it, as `cosign verify
/// --certificate-identity --certificate-oidc-issuer` take them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Identity {
    pub subject: String,
    pub issuer: String,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (issuer {})", self.subject, self.issuer)
    }
}

/// Certificate authorities: a PEM bundle of roots, or a Sigstore `trusted_root.json`'s
/// certificate authorities (each chain's last certificate a root, the others intermediates;
/// those whose `validFor` has ended left out).
#[derive(Debug, Clone, Default)]
pub struct Roots {
    /// Where they came from, for messages.
    pub source: String,
    /// Each root, DER.
    certificates: Vec<Vec<u8>>,
    /// Intermediates the roots come with (a `trusted_root.json`'s chains), DER.
    intermediates: Vec<Vec<u8>>,
}

impl Roots {
    /// Reads a PEM bundle of `CERTIFICATE`s, or a Sigstore `trusted_root.json` (the
    /// certificates of its `certificateAuthorities`).
    pub fn from_bytes(source: &str, bytes: &[u8]) -> Result<Self, Error> {
        let bad = |why: String| Error::Roots {
            origin: source.to_owned(),
            why,
        };
        let (certificates, intermediates) =
            if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
                trusted_root_json(bytes).map_err(bad)?
            } else {
                (pem_blocks(bytes, "CERTIFICATE").map_err(bad)?, Vec::new())
            };
        if certificates.is_empty() {
            return Err(bad("holds no certificate".into()));
        }
        for der in &certificates {
            X509Certificate::from_der(der)
                .map_err(|e| bad(format!("a certificate cannot be read: {e}")))?;
        }
        Ok(Self {
            source: source.to_owned(),
            certificates,
            intermediates,
        })
    }

    /// Checks that `leaf` (DER) chains to one of these roots through `chain` (DER, the leaf's
    /// intermediates and the intermediates of a `trusted_root.json`; roots among them are
    /// skipped) for code signing, now; that `signature` over `message` was made with its key;
    /// and returns what it names.
    pub(super) fn verify(
        &self,
        leaf: &[u8],
        chain: &[Vec<u8>],
        message: &[u8],
        signature: &[u8],
    ) -> Result<Named, String> {
        let leaf_der = CertificateDer::from(leaf);
        let ee = webpki::EndEntityCert::try_from(&leaf_der)
            .map_err(|e| format!("the certificate cannot be read: {e}"))?;
        let root_ders: Vec<CertificateDer<'_>> = self
            .certificates
            .iter()
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        let anchors = root_ders
            .iter()
            .map(|c| webpki::anchor_from_trusted_cert(c).map(|a| a.to_owned()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("a root of {} cannot be used: {e}", self.source))?;
        let intermediates: Vec<CertificateDer<'_>> = chain
            .iter()
            .chain(&self.intermediates)
            .filter(|c| !self.certificates.contains(c))
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            &intermediates,
            UnixTime::now(),
            // Intermediates without an extended key usage pass, as Go's x509 (cosign's) lets
            // them; the leaf must name code signing, checked below.
            webpki::KeyUsage::required_if_present(CODE_SIGNING),
            None,
            None,
        )
        .map_err(|e| {
            format!(
                "the certificate does not chain to {} for code signing now: {e:?}",
                self.source
            )
        })?;
        let (_, cert) = X509Certificate::from_der(leaf)
            .map_err(|e| format!("the certificate cannot be read: {e}"))?;
        let code_signing = cert
            .extended_key_usage()
            .ok()
            .flatten()
            .is_some_and(|eku| eku.value.code_signing);
        if !code_signing {
            return Err("the certificate is not for code signing (extended key usage)".into());
        }
        if !verify_with_spki(cert.public_key().raw, message, signature) {
            return Err("the signature was not made with the certificate's key".into());
        }
        named(&cert)
    }
}

/// What a signing certificate names: every URI and email subject alternative name, and its OIDC
/// issuer (the DER UTF8String of extension .1.8, with nothing after it; else, only when .1.8 is
/// absent, the raw bytes of .1.1).
pub(super) struct Named {
    pub subjects: Vec<String>,
    pub issuer: String,
}

impl Named {
    /// The identity of `trusted` this names, if any: its issuer, and any of its subjects.
    pub(super) fn matching<'a>(&self, trusted: &'a [Identity]) -> Option<&'a Identity> {
        trusted
            .iter()
            .find(|i| i.issuer == self.issuer && self.subjects.contains(&i.subject))
    }
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (issuer {})", self.subjects.join(", "), self.issuer)
    }
}

/// What the certificate `der` names, unverified (for `host inspect`).
pub(super) fn names_of(der: &[u8]) -> Result<Named, String> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("the certificate cannot be read: {e}"))?;
    named(&cert)
}

fn named(cert: &X509Certificate<'_>) -> Result<Named, String> {
    let mut subjects = Vec::new();
    let (mut v2, mut v1) = (None, None);
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                subjects.extend(san.general_names.iter().filter_map(|n| match n {
                    GeneralName::URI(u) => Some((*u).to_owned()),
                    GeneralName::RFC822Name(e) => Some((*e).to_owned()),
                    _ => None,
                }));
            }
            _ if ext.oid.to_id_string() == ISSUER_V2 => v2 = Some(ext.value),
            _ if ext.oid.to_id_string() == ISSUER_V1 => v1 = Some(ext.value),
            _ => {}
        }
    }
    let issuer = match (v2, v1) {
        (Some(value), _) => match tlv(value) {
            Some((12, text, [])) => std::str::from_utf8(text).ok().map(str::to_owned),
            _ => {
                return Err(format!(
                    "the certificate's OIDC issuer (extension {ISSUER_V2}) is not a UTF8String"
                ));
            }
        },
        (None, Some(raw)) => std::str::from_utf8(raw).ok().map(str::to_owned),
        (None, None) => None,
    };
    if subjects.is_empty() {
        return Err("the certificate names no URI or email subject".into());
    }
    let Some(issuer) = issuer else {
        return Err(format!(
            "the certificate names no OIDC issuer (extension {ISSUER_V2} or {ISSUER_V1})"
        ));
    };
    Ok(Named { subjects, issuer })
}

/// The parts of a DER SubjectPublicKeyInfo: its AlgorithmIdentifier's contents (what webpki's
/// algorithms name themselves by) and the key (its BIT STRING without the unused-bits byte).
fn spki_parts(spki: &[u8]) -> Option<(&[u8], &[u8])> {
    let (0x30, body, _) = tlv(spki)? else {
        return None;
    };
    let (0x30, algorithm, rest) = tlv(body)? else {
        return None;
    };
    let (0x03, bits, _) = tlv(rest)? else {
        return None;
    };
    let (0, key) = bits.split_first()? else {
        return None;
    };
    Some((algorithm, key))
}

/// One DER tag-length-value: the tag, the contents and what follows.
fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&len, rest) = rest.split_first()?;
    let (len, rest) = if len < 0x80 {
        (usize::from(len), rest)
    } else {
        let n = usize::from(len & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (bytes, rest) = (rest.get(..n)?, rest.get(n..)?);
        (
            bytes
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b)),
            rest,
        )
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

/// The verification algorithms a key's algorithm may sign with.
fn algorithms(spki: &[u8]) -> Result<Vec<&'static dyn SignatureVerificationAlgorithm>, String> {
    let (algorithm, _) = spki_parts(spki).ok_or("not a DER SubjectPublicKeyInfo")?;
    let found: Vec<&'static dyn SignatureVerificationAlgorithm> = webpki::ALL_VERIFICATION_ALGS
        .iter()
        .copied()
        .filter(|alg| {
            let id = alg.public_key_alg_id();
            let id: &[u8] = id.as_ref();
            id == algorithm
        })
        .collect();
    if found.is_empty() {
        return Err("its algorithm is not one of ECDSA P-256 or P-384, Ed25519 or RSA".into());
    }
    Ok(found)
}

/// Whether `signature` over `message` was made with the key of `spki` (DER), by any algorithm
/// that key's type signs with.
fn verify_with_spki(spki: &[u8], message: &[u8], signature: &[u8]) -> bool {
    let (Ok(algs), Some((_, key))) = (algorithms(spki), spki_parts(spki)) else {
        return false;
    };
    algs.iter()
        .any(|alg| alg.verify_signature(key, message, signature).is_ok())
}

/// The DER of each PEM block labelled `label` in `pem`.
pub(super) fn pem_blocks(pem: &[u8], label: &str) -> Result<Vec<Vec<u8>>, String> {
    let text = std::str::from_utf8(pem).map_err(|_| "is not PEM text".to_owned())?;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&begin) {
        let after = &rest[start + begin.len()..];
        let stop = after
            .find(&end)
            .ok_or_else(|| format!("a `{begin}` block has no end"))?;
        let body: String = after[..stop]
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        blocks.push(
            BASE64
                .decode(body)
                .map_err(|e| format!("a `{label}` block is not base64: {e}"))?,
        );
        rest = &after[stop + end.len()..];
    }
    Ok(blocks)
}

/// The roots and intermediates of the certificate authorities of a Sigstore
/// `trusted_root.json`: each chain's last certificate is its root, the others intermediates. A
/// certificate authority whose `validFor` has ended is left out.
type Chains = (Vec<Vec<u8>>, Vec<Vec<u8>>);

fn trusted_root_json(bytes: &[u8]) -> Result<Chains, String> {
    let root: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("is not JSON: {e}"))?;
    let (mut roots, mut intermediates) = (Vec::new(), Vec::new());
    let now = UnixTime::now().as_secs();
    for ca in root["certificateAuthorities"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(end) = ca["validFor"]["end"].as_str() {
            let ended = parse_rfc3339(end).is_some_and(|end| end <= now);
            if ended {
                continue;
            }
        }
        let mut chain = Vec::new();
        for c in ca["certChain"]["certificates"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let raw = c["rawBytes"]
                .as_str()
                .ok_or("a certificate of certificateAuthorities has no rawBytes")?;
            chain.push(
                BASE64
                    .decode(raw)
                    .map_err(|e| format!("a certificate's rawBytes is not base64: {e}"))?,
            );
        }
        if let Some(last) = chain.pop() {
            roots.push(last);
            intermediates.extend(chain);
        }
    }
    Ok((roots, intermediates))
}

/// Seconds since the epoch of an RFC 3339 time (`2022-04-13T20:06:15.000Z`), UTC only.
fn parse_rfc3339(text: &str) -> Option<u64> {
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time = time.trim_end_matches('Z');
    let time = time.split('.').next()?;
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + min * 60 + sec).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_values_are_read_whatever_their_length_form() {
        assert_eq!(
            tlv(&[0x30, 2, 1, 2, 9]),
            Some((0x30, &[1u8, 2][..], &[9u8][..]))
        );
        assert_eq!(
            tlv(&[0x04, 0x81, 3, 7, 8, 9]),
            Some((0x04, &[7u8, 8, 9][..], &[][..]))
        );
        assert_eq!(tlv(&[0x30, 5, 1]), None, "shorter than it says");
        assert_eq!(tlv(&[0x30, 0x80]), None, "indefinite length is not DER");
    }

    #[test]
    fn rfc3339_times_are_read_as_seconds_since_the_epoch() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2022-04-13T20:06:15.000Z"),
            Some(1_649_880_375)
        );
        assert_eq!(parse_rfc3339("2000-03-01T00:00:01Z"), Some(951_868_801));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn pem_blocks_are_read_in_order_and_a_broken_one_is_named() {
        let pem = "x\n-----BEGIN PUBLIC KEY-----\nAQI=\n-----END PUBLIC KEY-----\n-----BEGIN CERTIFICATE-----\nAw==\n-----END CERTIFICATE-----\n-----BEGIN PUBLIC KEY-----\nBA==\n-----END PUBLIC KEY-----\n";
        assert_eq!(
            pem_blocks(pem.as_bytes(), "PUBLIC KEY").unwrap(),
            [vec![1u8, 2], vec![4]]
        );
        assert!(
            pem_blocks(b"-----BEGIN PUBLIC KEY-----\nAQI=\n", "PUBLIC KEY")
                .unwrap_err()
                .contains("no end")
        );
    }
}
