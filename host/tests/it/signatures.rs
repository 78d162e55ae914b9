//! Plugins signed with cosign (built from source by `scripts/cosign`, `$COSIGN`) in a real
//! registry on loopback, verified by `host verify`: a key pair, and a certificate of a test CA
//! naming an identity. Accepted when signed as trusted; refused when unsigned, signed by another
//! key or identity, or replaced after signing (by a push over the tag, or with the old signature
//! copied beside the new artifact).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, SanType, SubjectPublicKeyInfo,
};
use testenv::{Registry, RegistryOptions};

use crate::support::host_in as host;

const SUBJECT: &str = "https://ci.test/plugins/release";
const ISSUER: &str = "https://issuer.test";

fn cosign_path() -> PathBuf {
    PathBuf::from(
        std::env::var_os("COSIGN")
            .expect("COSIGN: the path of cosign, built by scripts/cosign (scripts/test sets it)"),
    )
}

/// `cosign ARGS` in `dir`, with an empty key password and nothing read from the network.
fn cosign(dir: &Path, args: &[&str]) -> Output {
    Command::new(cosign_path())
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "")
        .env("HOME", dir)
        .env("TUF_ROOT", dir.join("tuf"))
        .stdin(Stdio::null())
        .output()
        .expect("cosign runs")
}

fn cosign_ok(dir: &Path, args: &[&str]) -> String {
    crate::support::succeeded(&format!("cosign {args:?}"), cosign(dir, args))
}

/// `host verify ARGS`: its exit code, stdout and stderr.
fn verify(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["verify"];
    all.extend_from_slice(args);
    let out = host(dir, &all);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Pushes the built-in plugin `name` to `repository:tag`; the reference pinned to its digest
/// (without `oci://`).
fn push(dir: &Path, registry: &Registry, name: &str, repository: &str) -> String {
    let builtin = host::plugin::BUILTINS
        .iter()
        .find(|b| b.name == name)
        .expect("a built-in plugin");
    let file = dir.join(format!("{name}.wasm"));
    std::fs::write(&file, builtin.wasm).unwrap();
    let reference = format!("{}/{repository}", registry.addr());
    let out = host(dir, &["push", &file.display().to_string(), &reference]);
    let pinned = crate::support::succeeded("host push", out);
    pinned.trim().trim_start_matches("oci://").to_owned()
}

/// A key pair `NAME.key` (cosign's encrypted format) and `NAME.pub` in `dir`.
fn key_pair(dir: &Path, name: &str) -> PathBuf {
    let keys = dir.join(name);
    std::fs::create_dir_all(&keys).unwrap();
    cosign_ok(&keys, &["generate-key-pair"]);
    keys
}

/// Signs `reference` with the key in `keys`, as a `.sig` signature, offline; with `certificate`
/// (and its chain) when given.
fn sign(keys: &Path, reference: &str, certificate: Option<(&Path, &Path)>) {
    sign_as(keys, reference, certificate, false);
}

/// As [`sign`], as a Sigstore bundle (a referrer of the artifact) when `bundle`.
fn sign_as(keys: &Path, reference: &str, certificate: Option<(&Path, &Path)>, bundle: bool) {
    let format = format!("--new-bundle-format={bundle}");
    let mut args = vec![
        "sign",
        "--key",
        "cosign.key",
        "--tlog-upload=false",
        "--use-signing-config=false",
        &format,
        "--allow-http-registry",
        "--yes",
    ];
    let paths;
    if let Some((leaf, chain)) = certificate {
        paths = (leaf.display().to_string(), chain.display().to_string());
        args.extend(["--certificate", &paths.0, "--certificate-chain", &paths.1]);
    }
    args.push(reference);
    cosign_ok(keys, &args);
}

/// A test CA (`ca.pem`) in `dir`, and a code-signing certificate of it (`leaf.pem`) for the key
/// of `keys/cosign.pub`, naming `subject` and the OIDC issuer as Fulcio writes them.
fn certificate(dir: &Path, keys: &Path, subject: &str) -> (PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let public = std::fs::read_to_string(keys.join("cosign.pub")).unwrap();
    let spki = SubjectPublicKeyInfo::from_pem(&public).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![SanType::URI(subject.try_into().unwrap())];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    let mut value = vec![0x0c, u8::try_from(ISSUER.len()).unwrap()];
    value.extend_from_slice(ISSUER.as_bytes());
    params.custom_extensions = vec![CustomExtension::from_oid_content(
        &[1, 3, 6, 1, 4, 1, 57264, 1, 8],
        value,
    )];
    let leaf = params.signed_by(&spki, &issuer).unwrap();
    let (ca_path, leaf_path) = (dir.join("ca.pem"), dir.join("leaf.pem"));
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&leaf_path, leaf.pem()).unwrap();
    (ca_path, leaf_path)
}

#[test]
fn plugins_signed_with_a_trusted_key_verify_and_others_are_refused() {
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let ours = key_pair(dir, "ours");
    let theirs = key_pair(dir, "theirs");
    let our_key = ours.join("cosign.pub").display().to_string();
    let their_key = theirs.join("cosign.pub").display().to_string();

    let signed = push(dir, &registry, "kvcluster", "plugins/kv:1.0");
    sign(&ours, &signed, None);
    let (code, stdout, stderr) = verify(dir, &["--key", &our_key, &format!("oci://{signed}")]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("verified") && stdout.contains("(cosign)"),
        "{stdout}"
    );

    let (code, _, stderr) = verify(dir, &["--key", &their_key, &format!("oci://{signed}")]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("no signature of a trusted signer"),
        "{stderr}"
    );

    // A report in JSON also when the answer is no.
    let (code, stdout, _) = verify(
        dir,
        &[
            "--key",
            &their_key,
            "-o",
            "json",
            &format!("oci://{signed}"),
        ],
    );
    assert_eq!(code, Some(1));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["verified"], false, "{report}");

    let unsigned = push(dir, &registry, "datastore", "plugins/datastore:1.0");
    let (code, _, stderr) = verify(dir, &["--key", &our_key, &format!("oci://{unsigned}")]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is not signed"), "{stderr}");

    // Replaced after signing: another artifact pushed over the tag that was signed.
    let tag = format!("{}/plugins/kv:1.0", registry.addr());
    let replaced = push(dir, &registry, "service", "plugins/kv:1.0");
    assert_ne!(replaced, signed);
    let (code, _, stderr) = verify(dir, &["--key", &our_key, &format!("oci://{tag}")]);
    assert_eq!(
        code,
        Some(1),
        "the tag now names an unsigned artifact: {stderr}"
    );
    assert!(stderr.contains("is not signed"), "{stderr}");

    // ... and with the first artifact's signature copied beside it.
    let downloaded = cosign_ok(
        dir,
        &["download", "signature", "--allow-http-registry", &signed],
    );
    let sig: serde_json::Value = serde_json::from_str(downloaded.lines().next().unwrap()).unwrap();
    std::fs::write(
        dir.join("payload.json"),
        base64_decode(sig["Payload"].as_str().unwrap()),
    )
    .unwrap();
    std::fs::write(
        dir.join("signature.b64"),
        sig["Base64Signature"].as_str().unwrap(),
    )
    .unwrap();
    cosign_ok(
        dir,
        &[
            "attach",
            "signature",
            "--payload",
            "payload.json",
            "--signature",
            "signature.b64",
            "--allow-http-registry",
            &replaced,
        ],
    );
    let (code, _, stderr) = verify(dir, &["--key", &our_key, &format!("oci://{replaced}")]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("signs sha256:"),
        "names what it signed: {stderr}"
    );

    // No registry there: the check could not run.
    let (code, _, stderr) = verify(
        dir,
        &[
            "--key",
            &our_key,
            "oci://127.0.0.1:1/plugins/kv@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    // Nothing trusted: refused before anything is fetched.
    let (code, _, stderr) = verify(dir, &[&format!("oci://{signed}")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("nothing is trusted"), "{stderr}");
}

#[test]
fn plugins_signed_with_a_certificate_verify_against_the_root_and_the_identity() {
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let keys = key_pair(dir, "ci");
    let (ca, leaf) = certificate(dir, &keys, SUBJECT);
    let signed = push(dir, &registry, "kvcluster", "plugins/kv:2.0");
    sign(&keys, &signed, Some((&leaf, &ca)));
    let ca = ca.display().to_string();
    let with = |subject: &str, issuer: &str| {
        verify(
            dir,
            &[
                "--trusted-root",
                &ca,
                "--certificate-identity",
                subject,
                "--certificate-oidc-issuer",
                issuer,
                &format!("oci://{signed}"),
            ],
        )
    };
    let (code, stdout, stderr) = with(SUBJECT, ISSUER);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("certificate of {SUBJECT} (issuer {ISSUER})")),
        "{stdout}"
    );

    let (code, _, stderr) = with("https://ci.test/someone-else", ISSUER);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("not a trusted identity"), "{stderr}");
    let (code, _, stderr) = with(SUBJECT, "https://elsewhere.test");
    assert_eq!(code, Some(1), "{stderr}");

    // The same identity, from a CA that is not trusted.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (other_ca, _) = certificate(&other, &keys, SUBJECT);
    let (code, _, stderr) = verify(
        dir,
        &[
            "--trusted-root",
            &other_ca.display().to_string(),
            "--certificate-identity",
            SUBJECT,
            "--certificate-oidc-issuer",
            ISSUER,
            &format!("oci://{signed}"),
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("does not chain"), "{stderr}");
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
}

/// A signature policy (`policy.yaml` in `dir`) trusting `key` for the repositories under
/// `plugins/` of `registry`.
fn policy(dir: &Path, registry: &Registry, key: &Path) -> PathBuf {
    let path = dir.join("policy.yaml");
    std::fs::write(
        &path,
        format!(
            "rules:\n- repositories: ['{}/plugins/*']\n  keys:\n  - file: {}\n",
            registry.addr(),
            key.display()
        ),
    )
    .unwrap();
    path
}

/// `host render --plugin oci://... --plugin-signatures`: a plugin from a registry is loaded
/// only when the policy lets it through.
#[test]
fn a_plugin_given_by_reference_is_loaded_only_when_signed_as_the_policy_asks() {
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let ours = key_pair(dir, "ours");
    let policy = policy(dir, &registry, &ours.join("cosign.pub"));
    let signed = push(dir, &registry, "kvcluster", "plugins/kv:1.0");
    sign(&ours, &signed, None);
    let unsigned = push(dir, &registry, "kvcluster", "elsewhere/kv:1.0");
    let example = crate::support::root().join("examples/kvcluster.yaml");
    let render = |reference: &str| {
        host(
            dir,
            &[
                "render",
                "--no-builtins",
                "--plugin",
                &format!("oci://{reference}"),
                "--plugin-signatures",
                &policy.display().to_string(),
                &example.display().to_string(),
            ],
        )
    };
    let out = render(&signed);
    let stdout = crate::support::succeeded("host render of the signed plugin", out);
    assert!(stdout.contains("kind: StatefulSet"), "{stdout}");

    let out = render(&unsigned);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no rule of the signature policy")
            && stderr.contains("elsewhere/kv: its plugins are not served"),
        "{stderr}"
    );
    // Covered by the rule, and not signed.
    let tag = push(dir, &registry, "kvcluster", "plugins/kv-next:1.0");
    let out = render(&tag);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not signed") && stderr.contains("rules[0]"),
        "{stderr}"
    );

    // `host inspect` shows the signatures stored beside a plugin, and what the policy says.
    let inspect = |reference: &str, json: bool| {
        let policy = policy.display().to_string();
        let reference = format!("oci://{reference}");
        let mut args = vec!["inspect", "--plugin-signatures", &policy, &reference];
        if json {
            args.extend(["-o", "json"]);
        }
        crate::support::succeeded("host inspect", host(dir, &args))
    };
    let text = inspect(&signed, false);
    assert!(
        text.lines().any(|l| l.starts_with("signature")
            && l.contains("cosign sha256:")
            && l.ends_with("made with a key")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("policy") && l.contains("allowed: signed by key")),
        "{text}"
    );
    let report: serde_json::Value = serde_json::from_str(&inspect(&signed, true)).unwrap();
    assert_eq!(report["signatures"][0]["namesThisDigest"], true, "{report}");
    assert_eq!(report["policy"]["allowed"], true, "{report}");
    let text = inspect(&tag, false);
    assert!(
        text.lines()
            .any(|l| l.starts_with("signature") && l.ends_with("none")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("policy")
            && l.contains("refused:")
            && l.contains("is not signed")),
        "{text}"
    );
}

/// On the control plane: a Plugin whose image is signed by a trusted key is served, and its
/// status says who signed it; a new version signed by another key, an unsigned one and one
/// from a repository no rule covers change nothing (the signed version keeps serving) and the
/// status says why each was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_resource_is_served_only_when_signed_as_the_operators_policy_asks() {
    use crate::plugins::{install_plugin_crd, plugin, plugin_status, ready, settings_for};
    use crate::support::cluster::{Operator, apply_cluster, eventually, wait_for};

    let cp = testenv::ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let ours = key_pair(dir, "ours");
    let theirs = key_pair(dir, "theirs");
    let push_file = |file: &str, repository: &str| {
        let reference = format!("{}/{repository}", registry.addr());
        let out = host(dir, &["push", file, &reference]);
        crate::support::succeeded("host push", out)
            .trim()
            .trim_start_matches("oci://")
            .to_owned()
    };
    let v1 = push_file(test_guests::HOSTILE, "plugins/hostile:1");
    sign(&ours, &v1, None);
    let v2 = push_file(test_guests::HOSTILE_NEXT, "plugins/hostile:2");
    sign(&theirs, &v2, None);
    let unsigned = push_file(test_guests::HOSTILE_NEXT, "plugins/hostile-next:2");
    let uncovered = push_file(test_guests::HOSTILE_NEXT, "elsewhere/hostile:2");
    let policy =
        host::signature::Policy::from_file(&policy(dir, &registry, &ours.join("cosign.pub")))
            .unwrap();

    install_plugin_crd(&cp);
    let runtime = host::plugin::Runtime::new(
        host::plugin::Limits::default(),
        Some(crate::support::cache()),
    )
    .unwrap();
    let store = tempfile::tempdir().unwrap();
    let mut settings = settings_for(&runtime, store.path());
    if let Some(live) = settings.plugin_resources.as_mut() {
        live.signatures = Some(std::sync::Arc::new(policy));
    }
    let operator = Operator::run(
        cp.client().await.unwrap(),
        host::registry::Registry::load(&runtime, Default::default(), false, &[]).unwrap(),
        settings,
    );

    apply_cluster(&cp, &plugin("hostile", &format!("oci://{v1}")));
    wait_for(&cp, "Ready", "plugins.wasm-operator.dev/hostile");
    let status = plugin_status(&cp, "hostile");
    let signed_by = status["signature"]["signedBy"][0]
        .as_str()
        .unwrap_or_default();
    assert!(
        signed_by.starts_with(&format!("key {}", ours.join("cosign.pub").display()))
            && signed_by.ends_with("(cosign)"),
        "{status}"
    );
    assert!(
        status["signature"]["rule"]
            .as_str()
            .is_some_and(|r| r.starts_with("rules[0]")),
        "{status}"
    );
    let digest = |reference: &str| reference.rsplit_once('@').unwrap().1.to_owned();

    for (image, reason, says) in [
        (
            &v2,
            "UntrustedSignature",
            "no signature of a trusted signer",
        ),
        (&unsigned, "Unsigned", "is not signed"),
        (
            &uncovered,
            "NoSignatureRule",
            "no rule of the signature policy",
        ),
    ] {
        apply_cluster(&cp, &plugin("hostile", &format!("oci://{image}")));
        eventually(
            &format!("the Plugin refused: {reason}"),
            Duration::from_secs(60),
            || ready(&plugin_status(&cp, "hostile")).1 == reason,
        )
        .await;
        let status = plugin_status(&cp, "hostile");
        let (ready, _, message) = ready(&status);
        assert_eq!(ready, "False", "{status}");
        assert!(
            message.contains(says) && message.contains("still serving"),
            "{message}"
        );
        // The signed version keeps serving, and the status still says who signed it.
        assert_eq!(status["digest"], digest(&v1), "{status}");
        assert!(status["signature"]["signedBy"].is_array(), "{status}");
    }
    operator.stop().await;
}
