//! The release (`scripts/release`, which scripts/test runs and names in WASM_OPERATOR_RELEASE):
//! what its directory holds and that its checksums hold; the arm64 binary run under qemu's
//! user-mode emulator, rendering what the amd64 one renders; the image index and the chart
//! pushed to a registry on loopback, and the chart installed from there with `helm install
//! oci://...` on a control plane.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};
use testenv::{ControlPlane, Registry, RegistryOptions};

use crate::chart::helm_ok;
use crate::support::cluster::kubectl_ok;
use crate::support::root;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The release directory under test.
fn release() -> PathBuf {
    std::env::var_os("WASM_OPERATOR_RELEASE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "WASM_OPERATOR_RELEASE is not set: build a release with scripts/release and set \
                 it to the directory it prints (scripts/test does both)"
            )
        })
}

fn run(what: &str, command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what} did not run: {e}"));
    crate::support::succeeded(what, out)
}

/// An ELF binary's machine (`e_machine`) and whether it asks for a program interpreter (a
/// dynamically linked one does).
fn elf(path: &Path) -> (u16, bool) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        &bytes[..6],
        b"\x7fELF\x02\x01",
        "{}: a 64-bit little-endian ELF",
        path.display()
    );
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(32) as usize, u16_at(54) as usize, u16_at(56));
    const PT_INTERP: u32 = 3;
    let interp = (0..phnum as usize).any(|i| u32_at(phoff + i * phentsize) == PT_INTERP);
    (u16_at(18), interp)
}

/// The release's image archive (an OCI layout in a tar), unpacked.
struct Archive(tempfile::TempDir);

impl Archive {
    fn unpack(release: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        run(
            "tar",
            Command::new("tar")
                .arg("-xf")
                .arg(release.join(format!("wasm-operator-{VERSION}.oci.tar")))
                .arg("-C")
                .arg(dir.path()),
        );
        Self(dir)
    }

    /// A JSON blob of the layout, by its digest.
    fn blob(&self, digest: &str) -> Value {
        let path = self
            .0
            .path()
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// The digest of the image index the archive holds (the first entry of its `index.json`).
    fn index_digest(&self) -> String {
        let top: Value =
            serde_json::from_slice(&std::fs::read(self.0.path().join("index.json")).unwrap())
                .unwrap();
        top["manifests"][0]["digest"].as_str().unwrap().to_owned()
    }
}

#[test]
fn the_release_holds_its_artifacts_each_checked_and_described() {
    let dir = release();
    let binary = |arch: &str| format!("host-{VERSION}-linux-{arch}");
    let expected: BTreeSet<String> = [
        format!("wasm-operator-{VERSION}.oci.tar"),
        format!("wasm-operator-{VERSION}.tgz"),
        binary("amd64"),
        binary("arm64"),
        format!("host-{VERSION}-linux-amd64.spdx.json"),
        format!("host-{VERSION}-linux-arm64.spdx.json"),
        format!("wasm-operator-{VERSION}-linux-amd64.spdx.json"),
        format!("wasm-operator-{VERSION}-linux-arm64.spdx.json"),
        "SHA256SUMS".to_owned(),
    ]
    .into();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(present, expected);

    // SHA256SUMS names every other file, with its digest.
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let mut named = BTreeSet::new();
    for line in sums.lines() {
        let (digest, name) = line.split_once("  ").expect("sha256sum's format");
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(host::units::hex(&Sha256::digest(&bytes)), digest, "{name}");
        named.insert(name.to_owned());
    }
    let mut others = expected.clone();
    others.remove("SHA256SUMS");
    assert_eq!(named, others);

    // Static binaries, one per architecture.
    const EM_X86_64: u16 = 62;
    const EM_AARCH64: u16 = 183;
    assert_eq!(elf(&dir.join(binary("amd64"))), (EM_X86_64, false));
    assert_eq!(elf(&dir.join(binary("arm64"))), (EM_AARCH64, false));

    // The archive holds one index of two images, linux/amd64 and linux/arm64.
    let archive = Archive::unpack(&dir);
    let blob = |digest: &str| archive.blob(digest);
    let index = blob(&archive.index_digest());
    assert_eq!(
        index["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{index}"
    );
    let mut platforms: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let manifest = blob(m["digest"].as_str().unwrap());
            let config = blob(manifest["config"]["digest"].as_str().unwrap());
            // The index's platform is the image's own.
            assert_eq!(m["platform"]["architecture"], config["architecture"]);
            assert_eq!(config["config"]["User"], "65532:65532");
            format!(
                "{}/{}",
                config["os"].as_str().unwrap(),
                config["architecture"].as_str().unwrap()
            )
        })
        .collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);

    // The SBOMs are SPDX documents that list the crates built into the binary, found in it.
    for sbom in expected.iter().filter(|n| n.ends_with(".spdx.json")) {
        let doc: Value = serde_json::from_slice(&std::fs::read(dir.join(sbom)).unwrap()).unwrap();
        assert_eq!(doc["spdxVersion"], "SPDX-2.3", "{sbom}");
        let packages = doc["packages"].as_array().expect("packages");
        for (name, version) in [
            ("wasmtime", "48."),
            ("kube-runtime", "5."),
            ("host", VERSION),
        ] {
            assert!(
                packages.iter().any(|p| p["name"] == name
                    && p["versionInfo"]
                        .as_str()
                        .is_some_and(|v| v.starts_with(version))),
                "{sbom} lists no {name} {version}"
            );
        }
        assert!(
            doc["creationInfo"]["creators"]
                .to_string()
                .contains("Tool: syft-"),
            "{sbom}: made by syft"
        );
    }

    // The chart, packaged.
    let chart = helm_ok(&[
        "show",
        "chart",
        &dir.join(format!("wasm-operator-{VERSION}.tgz"))
            .display()
            .to_string(),
    ]);
    assert!(chart.contains(&format!("version: {VERSION}")), "{chart}");
}

#[test]
fn the_arm64_binary_runs_under_qemu_and_renders_what_the_amd64_one_renders() {
    let dir = release();
    let native = dir.join(format!("host-{VERSION}-linux-amd64"));
    let arm64 = dir.join(format!("host-{VERSION}-linux-arm64"));
    let cache = tempfile::tempdir().unwrap();
    let host = |emulated: bool, args: &[&str]| {
        let mut command = if emulated {
            let mut c = Command::new("qemu-aarch64");
            c.arg(&arm64);
            c
        } else {
            Command::new(&native)
        };
        command.args(args).current_dir(root()).env(
            "WASM_OPERATOR_CACHE",
            cache.path().join(emulated.to_string()),
        );
        run(&format!("host {args:?} (arm64: {emulated})"), &mut command)
    };
    let version = host(true, &["--version"]);
    assert!(
        version.starts_with(&format!("host {VERSION}\n")),
        "{version}"
    );
    assert_eq!(version, host(false, &["--version"]));
    // Every example, rendered on each architecture: the same bytes.
    let rendered = host(true, &["render", "examples/"]);
    assert!(rendered.contains("kind: StatefulSet"), "{rendered}");
    assert_eq!(rendered, host(false, &["render", "examples/"]));
}

#[test]
fn the_release_pushes_to_a_registry_and_the_chart_installs_from_there() {
    let dir = release();
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let addr = registry.addr().to_owned();
    run(
        "scripts/release --push",
        Command::new(root().join("scripts/release"))
            .args(["--out"])
            .arg(&dir)
            .args([
                "--push",
                &format!("{addr}/hanzo"),
                "--plain-http",
                "--no-build",
            ])
            .current_dir(root()),
    );

    // The registry holds the archive's index, digest for digest, and serves each architecture
    // its own image from it.
    let pushed = format!("{addr}/hanzo/wasm-operator:{VERSION}");
    let raw = run(
        "skopeo inspect --raw",
        Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{pushed}"),
        ]),
    );
    assert_eq!(
        format!(
            "sha256:{}",
            host::units::hex(&Sha256::digest(raw.as_bytes()))
        ),
        Archive::unpack(&dir).index_digest(),
        "the pushed index is the archive's"
    );
    for arch in ["amd64", "arm64"] {
        let inspected = run(
            "skopeo inspect",
            Command::new("skopeo").args([
                "inspect",
                "--tls-verify=false",
                "--override-arch",
                arch,
                "--format",
                "{{.Architecture}} {{index .Labels \"org.opencontainers.image.version\"}}",
                &format!("docker://{pushed}"),
            ]),
        );
        assert_eq!(inspected.trim(), format!("{arch} {VERSION}"));
    }

    // The chart, installed from the registry on a control plane of its own, naming the pushed
    // image (kwok runs the pods without pulling it).
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let kubeconfig = cp.kubeconfig().display().to_string();
    let repository = format!("{addr}/hanzo/wasm-operator");
    helm_ok(&[
        "install",
        "wasm-operator",
        &format!("oci://{addr}/hanzo/charts/wasm-operator"),
        "--version",
        VERSION,
        "--plain-http",
        "--namespace",
        "wasm-operator",
        "--create-namespace",
        "--kubeconfig",
        &kubeconfig,
        "--set",
        &format!("image.repository={repository}"),
        "--wait",
        "--timeout",
        "3m",
    ]);
    let image = kubectl_ok(
        &cp,
        &[
            "get",
            "-n",
            "wasm-operator",
            "deployment/wasm-operator",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
    );
    assert_eq!(image.trim(), format!("{repository}:{VERSION}"));
    kubectl_ok(
        &cp,
        &[
            "wait",
            "-n",
            "wasm-operator",
            "--for=condition=Available",
            "deployment/wasm-operator",
            "--timeout=120s",
        ],
    );
}
