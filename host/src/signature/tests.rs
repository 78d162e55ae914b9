//! Signatures checked without a registry: payloads signed here with ring, certificates made here
//! with rcgen. The registry side (cosign's own signatures, pushed to a real registry) is in the
//! integration tests.

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, SanType,
};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair};

use super::fetch::{bundle, pre_authentication};
use super::*;

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const OTHER: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

/// A P-256 key pair: rcgen's (for certificates) and ring's (to sign with), the same key.
struct Signer {
    rcgen: KeyPair,
    ring: EcdsaKeyPair,
}

impl Signer {
    fn new() -> Self {
        let rcgen = KeyPair::generate().unwrap();
        let ring = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            &rcgen.serialize_der(),
            &SystemRandom::new(),
        )
        .unwrap();
        Self { rcgen, ring }
    }

    fn public_key(&self, source: &str) -> PublicKey {
        PublicKey::from_pem(source, self.rcgen.public_key_pem().as_bytes()).unwrap()
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.ring
            .sign(&SystemRandom::new(), message)
            .unwrap()
            .as_ref()
            .to_vec()
    }
}

/// A simple-signing payload naming `digest`, as cosign writes it.
fn payload(digest: &str) -> Vec<u8> {
    serde_json::json!({
        "critical": {
            "identity": {"docker-reference": "registry.test/plugins/site"},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": null,
    })
    .to_string()
    .into_bytes()
}

fn cosign(signer: &Signer, digest: &str) -> Found {
    let signed = payload(digest);
    Found {
        place: "sha256:layer".into(),
        signatures: vec![signer.sign(&signed)],
        signed,
        names: vec![digest.into()],
        certificate: None,
        problem: None,
        format: "cosign",
    }
}

fn trusting(keys: Vec<PublicKey>) -> Trusted {
    Trusted {
        keys,
        ..Trusted::default()
    }
}

#[test]
fn a_signature_counts_when_a_trusted_key_made_it_over_this_digest() {
    let (ours, theirs) = (Signer::new(), Signer::new());
    let trusted = trusting(vec![ours.public_key("cosign.pub")]);
    let verified = judge("site", DIGEST, &[cosign(&ours, DIGEST)], &trusted).unwrap();
    assert!(matches!(
        &verified[..],
        [Verified { signer: super::Signer::Key { source, .. }, format: "cosign" }] if source == "cosign.pub"
    ));

    let e = judge("site", DIGEST, &[cosign(&theirs, DIGEST)], &trusted).unwrap_err();
    assert!(
        e.to_string().contains("not made with any trusted key"),
        "{e}"
    );

    // A signature copied beside another artifact still names the one it signed.
    let mut moved = cosign(&ours, OTHER);
    moved.place = "sha256:copied".into();
    let e = judge("site", DIGEST, &[moved], &trusted).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("signs {OTHER}, not {DIGEST}")),
        "{e}"
    );

    // The payload changed after signing.
    let mut tampered = cosign(&ours, DIGEST);
    tampered.signed.push(b' ');
    assert!(judge("site", DIGEST, &[tampered], &trusted).is_err());

    assert!(matches!(
        judge("site", DIGEST, &[], &trusted),
        Err(Error::Unsigned { .. })
    ));
    // One good signature among bad ones is enough, and each bad one is said.
    let verified = judge(
        "site",
        DIGEST,
        &[cosign(&theirs, DIGEST), cosign(&ours, DIGEST)],
        &trusted,
    )
    .unwrap();
    assert_eq!(verified.len(), 1);
}

/// A test CA, and a certificate of it for `signer`'s key naming `subject` and `issuer`.
fn certificate(signer: &Signer, subject: &str, issuer: &str) -> (Roots, Vec<u8>) {
    let (roots, leaf, _) = issued(signer, subject, issuer, false, true);
    (roots, leaf)
}

/// A test CA and a certificate for `signer`'s key naming `subject` and `issuer`: issued by the
/// CA, or by an intermediate of it with no extended key usage (then returned too); for code
/// signing or not.
fn issued(
    signer: &Signer,
    subject: &str,
    issuer: &str,
    intermediate: bool,
    code_signing: bool,
) -> (Roots, Vec<u8>, Vec<Vec<u8>>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let mut ca_issuer = Issuer::new(ca_params, ca_key);
    let mut chain = Vec::new();
    if intermediate {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "intermediate");
        let cert = params.signed_by(&key, &ca_issuer).unwrap();
        chain.push(cert.der().to_vec());
        ca_issuer = Issuer::new(params, key);
    }
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![
        SanType::Rfc822Name("someone@ci.test".try_into().unwrap()),
        SanType::URI(subject.try_into().unwrap()),
    ];
    if code_signing {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    }
    // The OIDC issuer as Fulcio writes it: a DER UTF8String.
    let mut value = vec![0x0c, u8::try_from(issuer.len()).unwrap()];
    value.extend_from_slice(issuer.as_bytes());
    params.custom_extensions = vec![CustomExtension::from_oid_content(
        &[1, 3, 6, 1, 4, 1, 57264, 1, 8],
        value,
    )];
    let leaf = params.signed_by(&signer.rcgen, &ca_issuer).unwrap();
    let roots = Roots::from_bytes("ca.pem", ca.pem().as_bytes()).unwrap();
    (roots, leaf.der().to_vec(), chain)
}

#[test]
fn an_intermediate_without_extended_key_usage_passes_and_a_leaf_not_for_code_signing_does_not() {
    let signer = Signer::new();
    let identity = Identity {
        subject: "https://ci.test/release".into(),
        issuer: "https://issuer.test".into(),
    };
    let trusted = |roots: Roots| Trusted {
        authorities: vec![Authority {
            roots,
            identities: vec![identity.clone()],
        }],
        ..Trusted::default()
    };
    let (roots, leaf, chain) = issued(&signer, &identity.subject, &identity.issuer, true, true);
    let mut found = cosign(&signer, DIGEST);
    found.certificate = Some((leaf, chain));
    judge("site", DIGEST, &[found], &trusted(roots)).expect("through an intermediate");

    let (roots, leaf, _) = issued(&signer, &identity.subject, &identity.issuer, false, false);
    let mut found = cosign(&signer, DIGEST);
    found.certificate = Some((leaf, Vec::new()));
    let e = judge("site", DIGEST, &[found], &trusted(roots)).unwrap_err();
    assert!(e.to_string().contains("code signing"), "{e}");
}

#[test]
fn a_certificate_counts_when_it_chains_to_a_trusted_root_and_names_a_trusted_identity() {
    let signer = Signer::new();
    let identity = Identity {
        subject: "https://ci.test/release".into(),
        issuer: "https://issuer.test".into(),
    };
    let (roots, leaf) = certificate(&signer, &identity.subject, &identity.issuer);
    let mut found = cosign(&signer, DIGEST);
    found.certificate = Some((leaf, Vec::new()));
    let trusting_identities = |identities: Vec<Identity>| Trusted {
        authorities: vec![Authority {
            roots: roots.clone(),
            identities,
        }],
        ..Trusted::default()
    };
    let trusted = trusting_identities(vec![identity.clone()]);
    let verified = judge("site", DIGEST, std::slice::from_ref(&found), &trusted).unwrap();
    assert_eq!(
        verified[0].signer,
        super::Signer::Certificate(identity.clone())
    );

    // Another identity of the same root.
    let other = trusting_identities(vec![Identity {
        subject: "https://ci.test/release".into(),
        issuer: "https://elsewhere.test".into(),
    }]);
    let e = judge("site", DIGEST, std::slice::from_ref(&found), &other).unwrap_err();
    assert!(e.to_string().contains("not a trusted identity"), "{e}");
    // Any subject the certificate names counts (it names an email first, then the URI).
    let by_email = trusting_identities(vec![Identity {
        subject: "someone@ci.test".into(),
        issuer: "https://issuer.test".into(),
    }]);
    judge("site", DIGEST, std::slice::from_ref(&found), &by_email).expect("any SAN");

    // The same identity from a root not trusted.
    let (stranger, _) = certificate(&signer, "https://ci.test/release", "https://issuer.test");
    let (_, foreign_leaf) = certificate(&signer, "https://ci.test/release", "https://issuer.test");
    let mut foreign = found.clone();
    foreign.certificate = Some((foreign_leaf, Vec::new()));
    let e = judge("site", DIGEST, &[foreign], &trusted).unwrap_err();
    assert!(e.to_string().contains("does not chain"), "{e}");

    // An identity is trusted from its own authority only: a second authority, trusted for
    // another identity, cannot vouch for this one.
    let mut vouched = found.clone();
    let (stranger_roots, stranger_leaf) = certificate(&signer, &identity.subject, &identity.issuer);
    vouched.certificate = Some((stranger_leaf, Vec::new()));
    let mut two = trusted.clone();
    two.authorities.push(Authority {
        roots: stranger_roots,
        identities: vec![Identity {
            subject: "https://ci.test/other".into(),
            issuer: identity.issuer.clone(),
        }],
    });
    judge("site", DIGEST, std::slice::from_ref(&found), &two).expect("its own authority");
    let e = judge("site", DIGEST, &[vouched], &two).unwrap_err();
    assert!(e.to_string().contains("not a trusted identity"), "{e}");
    drop(stranger);

    // A certificate whose key did not make the signature.
    let mut forged = found.clone();
    forged.signatures = vec![Signer::new().sign(&forged.signed)];
    let e = judge("site", DIGEST, &[forged], &trusted).unwrap_err();
    assert!(
        e.to_string()
            .contains("not made with the certificate's key"),
        "{e}"
    );
}

#[test]
fn a_bundle_signs_the_dsse_encoding_of_a_statement_naming_the_digest() {
    let signer = Signer::new();
    let statement = serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "registry.test/plugins/site", "digest": {"sha256": DIGEST.trim_start_matches("sha256:")}}],
        "predicateType": "https://sigstore.dev/cosign/sign/v1",
        "predicate": {},
    })
    .to_string();
    let pae = pre_authentication("application/vnd.in-toto+json", statement.as_bytes());
    let b64 = |b: &[u8]| BASE64.encode(b);
    let json = serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": "x"}},
        "dsseEnvelope": {
            "payload": b64(statement.as_bytes()),
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [{"sig": b64(&signer.sign(&pae)), "keyid": ""}],
        },
    });
    let found = bundle("sha256:bundle".into(), json.to_string().as_bytes());
    assert_eq!(found.names, [DIGEST]);
    let trusted = trusting(vec![signer.public_key("cosign.pub")]);
    let verified = judge("site", DIGEST, std::slice::from_ref(&found), &trusted).unwrap();
    assert_eq!(verified[0].format, "bundle");
    assert!(judge("site", OTHER, &[found], &trusted).is_err());
    // A bundle that cannot be used says why.
    let unreadable = bundle("sha256:x".into(), b"{}");
    let e = judge("site", DIGEST, &[unreadable], &trusted).unwrap_err();
    assert!(e.to_string().contains("holds no DSSE envelope"), "{e}");
    // An attestation made with the same key (an SBOM, a scan) is no signature.
    let attestation = statement_bundle(&signer, "https://spdx.dev/Document", &[OTHER, DIGEST]);
    let e = judge("site", DIGEST, &[attestation], &trusted).unwrap_err();
    assert!(
        e.to_string().contains("is an attestation, not a signature"),
        "{e}"
    );
    // A statement of several subjects signs each of them.
    let several = statement_bundle(
        &signer,
        "https://sigstore.dev/cosign/sign/v1",
        &[OTHER, DIGEST],
    );
    judge("site", DIGEST, &[several], &trusted).expect("its second subject");
}

/// A bundle of an in-toto statement of `predicate` about `digests`, signed by `signer`.
fn statement_bundle(signer: &Signer, predicate: &str, digests: &[&str]) -> Found {
    let subjects: Vec<serde_json::Value> = digests
        .iter()
        .map(|d| serde_json::json!({"name": "x", "digest": {"sha256": d.trim_start_matches("sha256:")}}))
        .collect();
    let statement = serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": subjects,
        "predicateType": predicate,
        "predicate": {},
    })
    .to_string();
    let pae = pre_authentication("application/vnd.in-toto+json", statement.as_bytes());
    let json = serde_json::json!({
        "verificationMaterial": {"publicKey": {"hint": "x"}},
        "dsseEnvelope": {
            "payload": BASE64.encode(statement.as_bytes()),
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [{"sig": BASE64.encode(signer.sign(&pae))}],
        },
    });
    bundle("sha256:statement".into(), json.to_string().as_bytes())
}

#[test]
fn the_pre_authentication_encoding_is_dsses() {
    assert_eq!(
        pre_authentication("http://example.com/HelloWorld", b"hello world"),
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    );
}

#[test]
fn keys_and_roots_that_cannot_be_used_are_named() {
    let e = PublicKey::from_pem("k.pub", b"not a key").unwrap_err();
    assert!(e.to_string().starts_with("key k.pub: holds no PEM"), "{e}");
    let e = Roots::from_bytes("roots.json", br#"{"certificateAuthorities": []}"#).unwrap_err();
    assert!(e.to_string().contains("holds no certificate"), "{e}");
}
