//! A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kwok, built from source by `scripts/control-plane` and started here on free
//! loopback ports in a temporary directory.
//!
//! ```ignore
//! let cp = testenv::ControlPlane::shared();          // one per test binary, started once
//! let _logs = cp.logs_on_failure();                  // prints every component's log on panic
//! let client = cp.client().await?;                   // admin (system:masters)
//! let ns = cp.namespace(&client, "judge").await?;    // a namespace of the test's own
//! ```
//!
//! Everything it starts runs in a process group of its own, watched by a shell loop that ends
//! it when the test binary exits, so nothing outlives a test run, even one that panics or is
//! killed. Binaries come from `$KUBE_BIN_DIR`, else from running `scripts/control-plane` (a no-op
//! when its cache is warm).

mod registry;

pub use registry::{Registry, RegistryOptions, registry_binary};

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// What went wrong starting or using the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The binaries could not be found or built.
    #[error("control plane binaries: {0}")]
    Binaries(String),
    /// A file could not be written or a process started.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Certificates could not be made.
    #[error("certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    /// A component did not become ready.
    #[error("{0}\n{1}")]
    NotReady(String, String),
    /// A kube client could not be built or a call failed.
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    /// The kubeconfig could not be loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
}

/// The result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// How many PersistentVolumes are made for claims to bind to (there is no provisioner).
const VOLUMES: usize = 40;

/// A running process of the control plane.
struct Process {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Child,
}

/// A running control plane. Dropping it stops every process.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    bin: PathBuf,
    server: String,
    kubeconfig: PathBuf,
    processes: Mutex<Vec<Process>>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .field("dir", &self.dir.path())
            .finish()
    }
}

/// The shards a replica says it holds, read from its `/metrics` text
/// (`wasm_operator_shards_held{shard="i"} 1`).
pub fn shards_held(metrics: &str) -> Vec<u32> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("wasm_operator_shards_held{shard=\"")?;
            let (index, value) = rest.split_once("\"} ")?;
            (value.trim() == "1").then(|| index.parse().ok()).flatten()
        })
        .collect()
}

/// A free port on loopback, outside the range outgoing connections draw from.
pub fn free_port() -> Result<u16> {
    // A port the kernel hands out for bind(0) lies in the ephemeral range, which outgoing
    // connections draw from too: between our check and the component's bind, a client's
    // connection may take it ("address already in use", seen in CI). Ports below that range
    // are never taken that way; pick one of them that is free, at random.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let low = ephemeral_low().unwrap_or(32768).clamp(20001, 65535);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32);
    for _ in 0..200 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SplitMix64 of the seed and a counter: spread, and different in every process.
        let mut x = seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        let port = 20000 + (x % u64::from(low - 20000)) as u16;
        // Never the same port twice in one process: the first may not be bound yet.
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !given.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            given.push(port);
            return Ok(port);
        }
    }
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port())
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The directory with the control-plane binaries: `$KUBE_BIN_DIR`, else what
/// `scripts/control-plane` prints (it builds them the first time).
pub fn binaries() -> Result<PathBuf> {
    built("KUBE_BIN_DIR", "scripts/control-plane")
}

/// The `helm` binary: `$HELM`, else what `scripts/helm` prints (it builds Helm v4 from the Go
/// module proxy the first time, and caches it).
pub fn helm() -> Result<PathBuf> {
    built("HELM", "scripts/helm")
}

/// The `helm-docs` binary: `$HELM_DOCS`, else what `scripts/helm-docs` prints (it builds it from
/// the Go module proxy the first time, and caches it).
pub fn helm_docs() -> Result<PathBuf> {
    built("HELM_DOCS", "scripts/helm-docs")
}

/// The `promtool` binary: `$PROMTOOL`, else what `scripts/promtool` prints (it builds it from the
/// Go module proxy the first time, and caches it).
pub fn promtool() -> Result<PathBuf> {
    built("PROMTOOL", "scripts/promtool")
}

/// The JavaScript example plugin (`examples/plugins/static-site`), built with componentize-js:
/// `$STATIC_SITE_WASM`, else what `scripts/js-plugin` prints (it builds it the first time, and
/// caches it).
pub fn static_site_plugin() -> Result<PathBuf> {
    built("STATIC_SITE_WASM", "scripts/js-plugin")
}

/// The Python example plugin (`examples/plugins/redirect`), built with componentize-py:
/// `$REDIRECT_WASM`, else what `scripts/py-plugin` prints (it builds it the first time, and
/// caches it).
pub fn redirect_plugin() -> Result<PathBuf> {
    built("REDIRECT_WASM", "scripts/py-plugin")
}

/// The path in `$variable`, else the last line `script` (a builder that caches what it builds)
/// prints.
fn built(variable: &str, script: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(variable) {
        return Ok(PathBuf::from(path));
    }
    let script = repo_root().join(script);
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(io(format!("running {}", script.display())))?;
    if !out.status.success() {
        return Err(Error::Binaries(format!(
            "{} failed ({})",
            script.display(),
            out.status
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(PathBuf::from(
        text.lines().last().unwrap_or_default().trim(),
    ))
}

struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    admin_cert: String,
    admin_key: String,
    sa_key: String,
    sa_pub: String,
}

fn pki() -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "testenv-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate()?;
    let mut server = CertificateParams::new(vec![
        "localhost".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default".to_owned(),
        "kubernetes.default.svc".to_owned(),
        "kubernetes.default.svc.cluster.local".to_owned(),
    ])?;
    server
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    server
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1))));
    server
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &issuer)?;

    let admin_key = KeyPair::generate()?;
    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin.distinguished_name.push(DnType::CommonName, "admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &issuer)?;

    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca: ca.pem(),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
        admin_cert: admin_cert.pem(),
        admin_key: admin_key.serialize_pem(),
        sa_key: sa.serialize_pem(),
        sa_pub: sa.public_key_pem(),
    })
}

/// Our own kwok stages: nodes become Ready; scheduled pods become Running and Ready; pods being
/// deleted go away.
const KWOK_STAGES: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-node-ready
spec:
  resourceRef: { apiGroup: v1, kind: Node }
  selector:
    matchExpressions:
      - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
        operator: NotIn
        values: ["True"]
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
        - type: Ready
          status: "True"
          reason: KubeletReady
          message: kwok simulates this node
          lastHeartbeatTime: {{ $now | Quote }}
          lastTransitionTime: {{ $now | Quote }}
      addresses:
        - type: InternalIP
          address: {{ NodeIP | Quote }}
      allocatable: { cpu: "1000", memory: 4Ti, pods: "10000" }
      capacity: { cpu: "1000", memory: 4Ti, pods: "10000" }
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: fake
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-pod-ready
spec:
  resourceRef: { apiGroup: v1, kind: Pod }
  selector:
    matchExpressions:
      - key: .metadata.deletionTimestamp
        operator: DoesNotExist
      - key: .status.phase
        operator: In
        values: [Pending]
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      startTime: {{ $now | Quote }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      conditions:
        - { type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }} }
        - { type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }} }
        - { type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }} }
        - { type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }} }
      containerStatuses:
      {{ range .spec.containers }}
        - name: {{ .name | Quote }}
          image: {{ .image | Quote }}
          ready: true
          started: true
          restartCount: 0
          state: { running: { startedAt: {{ $now | Quote }} } }
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-pod-delete
spec:
  resourceRef: { apiGroup: v1, kind: Pod }
  selector:
    matchExpressions:
      - key: .metadata.deletionTimestamp
        operator: Exists
  next:
    delete: true
"#;

impl ControlPlane {
    /// The control plane shared by every test of this binary, started on first use. Tests that
    /// share it work in namespaces of their own ([`ControlPlane::namespace`]).
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<ControlPlane> = OnceLock::new();
        SHARED.get_or_init(|| match Self::start() {
            Ok(cp) => cp,
            Err(e) => panic!("the control plane did not start: {e}"),
        })
    }

    /// Starts a control plane of its own (seconds when the binaries are built).
    pub fn start() -> Result<Self> {
        let bin = binaries()?;
        for b in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
            "kwok",
        ] {
            if !bin.join(b).exists() {
                return Err(Error::Binaries(format!(
                    "{} is missing; run scripts/control-plane",
                    bin.join(b).display()
                )));
            }
        }
        remove_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix("testenv-")
            .tempdir()
            .map_err(io("making a temporary directory"))?;
        let d = dir.path().to_path_buf();
        std::fs::write(d.join("owner.pid"), std::process::id().to_string())
            .map_err(io("writing owner.pid"))?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let p = d.join(name);
            std::fs::write(&p, text).map_err(io(format!("writing {}", p.display())))?;
            Ok(p)
        };
        let pki = pki()?;
        let ca = write("ca.crt", &pki.ca)?;
        let server_cert = write("apiserver.crt", &pki.server_cert)?;
        let server_key = write("apiserver.key", &pki.server_key)?;
        let sa_key = write("sa.key", &pki.sa_key)?;
        let sa_pub = write("sa.pub", &pki.sa_pub)?;
        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = write(
            "admin.kubeconfig",
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: testenv\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\n\
                 users:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n\
                 contexts:\n- name: testenv\n  context:\n    cluster: testenv\n    user: admin\n    namespace: default\ncurrent-context: testenv\n",
                BASE64.encode(&pki.ca),
                BASE64.encode(&pki.admin_cert),
                BASE64.encode(&pki.admin_key),
            ),
        )?;
        let stages = write("kwok.yaml", KWOK_STAGES)?;
        let cp = Self {
            dir,
            bin,
            server,
            kubeconfig: kubeconfig.clone(),
            processes: Mutex::new(Vec::new()),
        };
        let p = |path: &Path| path.display().to_string();

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        cp.spawn(
            "etcd",
            &[
                "--name=testenv".into(),
                format!("--data-dir={}", p(&d.join("etcd"))),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=testenv={peer_url}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        )?;
        // Every write, as the API server saw it: who (user and user agent), what, when.
        let audit_policy = write(
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: None\n  verbs: [get, list, watch]\n- level: Metadata\n",
        )?;
        cp.spawn("kube-apiserver", &[
            format!("--audit-policy-file={}", p(&audit_policy)),
            format!("--audit-log-path={}", p(&d.join("audit.log"))),
            "--audit-log-format=json".into(),
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", p(&d.join("apiserver-certs"))),
            format!("--tls-cert-file={}", p(&server_cert)),
            format!("--tls-private-key-file={}", p(&server_key)),
            format!("--client-ca-file={}", p(&ca)),
            format!("--service-account-key-file={}", p(&sa_pub)),
            format!("--service-account-signing-key-file={}", p(&sa_key)),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=RBAC".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            // kwok nodes send no heartbeats, so the node lifecycle controller is off; the taint
            // this plugin puts on new nodes would then never be lifted.
            "--disable-admission-plugins=TaintNodesByCondition".into(),
            // API Priority and Fairness stays on, as in production clusters: the operator's
            // requests are queued and limited as they would be there.
            // Off by default in 1.36; with them off the server silently drops these projected
            // volume sources, so the tests turn them on to judge every source we pass through.
            "--feature-gates=ClusterTrustBundle=true,ClusterTrustBundleProjection=true,PodCertificateRequest=true".into(),
            "--profiling=false".into(),
        ])?;
        cp.wait_ready()?;
        // The controller manager and the scheduler are clients of the API server alike: admin
        // credentials, no leader election, no serving port of their own.
        let client_of_apiserver = [
            format!("--kubeconfig={}", p(&kubeconfig)),
            format!("--authentication-kubeconfig={}", p(&kubeconfig)),
            format!("--authorization-kubeconfig={}", p(&kubeconfig)),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
            "--profiling=false".into(),
        ];
        let mut kcm = client_of_apiserver.to_vec();
        kcm.extend([
            format!("--service-account-private-key-file={}", p(&sa_key)),
            format!("--root-ca-file={}", p(&ca)),
            "--controllers=*,-node-lifecycle-controller,-node-ipam-controller,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller".into(),
            "--concurrent-gc-syncs=10".into(),
        ]);
        cp.spawn("kube-controller-manager", &kcm)?;
        cp.spawn("kube-scheduler", &client_of_apiserver)?;
        cp.spawn(
            "kwok",
            &[
                format!("--kubeconfig={}", p(&kubeconfig)),
                format!("--config={}", p(&stages)),
                "--manage-all-nodes=false".into(),
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
                "--manage-nodes-with-label-selector=".into(),
                "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom".into(),
                "--disregard-status-with-label-selector=".into(),
                "--cidr=10.244.0.0/16".into(),
                "--node-ip=10.1.0.1".into(),
                format!("--server-address=127.0.0.1:{}", free_port()?),
            ],
        )?;
        cp.seed()?;
        Ok(cp)
    }

    /// Starts `name` from the binary directory in a process group of its own, with a shell
    /// loop that ends it when this process exits.
    fn spawn(&self, name: &'static str, args: &[String]) -> Result<()> {
        let program = self.bin.join(name);
        let log = self.dir.path().join(format!("{name}.log"));
        let child = start_watched(&self.dir.path().join("owner.pid"), &program, args, &log)?;
        let mut procs = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        procs.push(Process {
            name,
            program,
            args: args.to_vec(),
            log,
            child,
        });
        Ok(())
    }

    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            if out.status.success() {
                return Ok(());
            }
            if let Some(dead) = self.exited() {
                return Err(Error::NotReady(
                    format!("{dead} exited while starting"),
                    self.logs(),
                ));
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady(
                    "kube-apiserver was not ready after 90s".into(),
                    self.logs(),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A component that has exited, if any.
    fn exited(&self) -> Option<&'static str> {
        let mut procs = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        procs
            .iter_mut()
            .find_map(|p| matches!(p.child.try_wait(), Ok(Some(_))).then_some(p.name))
    }

    /// The fake node kwok runs pods on, and volumes for claims to bind to.
    fn seed(&self) -> Result<()> {
        let mut objects = String::from(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: kwok-node-0\n  annotations:\n    kwok.x-k8s.io/node: fake\n  labels:\n    kubernetes.io/hostname: kwok-node-0\n    kubernetes.io/os: linux\n    kubernetes.io/arch: amd64\n    type: kwok\n",
        );
        for i in 0..VOLUMES {
            let _ = write!(
                objects,
                "---\napiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: testenv-pv-{i}\nspec:\n  capacity: {{storage: 1Ti}}\n  accessModes: [ReadWriteOnce, ReadWriteMany, ReadOnlyMany]\n  persistentVolumeReclaimPolicy: Retain\n  hostPath: {{path: /tmp/testenv-pv-{i}}}\n"
            );
        }
        let file = self.dir.path().join("seed.yaml");
        std::fs::write(&file, objects).map_err(io("writing seed.yaml"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.kubectl(&["apply", "--server-side", "-f", &file.display().to_string()]);
            if out.status.success() {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady(
                    format!("seeding failed: {}", String::from_utf8_lossy(&out.stderr)),
                    self.logs(),
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let out = self.kubectl(&[
            "wait",
            "--for=condition=Ready",
            "node/kwok-node-0",
            "--timeout=60s",
        ]);
        if !out.status.success() {
            return Err(Error::NotReady(
                format!(
                    "the kwok node is not Ready: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
                self.logs(),
            ));
        }
        Ok(())
    }

    /// The API server's address.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// An admin kubeconfig (client certificate in `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory of the control-plane binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// Leaves the control plane running after this process ends, and its directory in place.
    /// Returns a shell command that stops it and removes the directory.
    pub fn keep(mut self) -> Result<String> {
        // Written beside it and renamed over it: each component's watchdog reads the file every
        // half second, and one that read it while it was being rewritten (empty) would stop its
        // component (seen under load in CI).
        let owner = self.dir.path().join("owner.pid");
        let next = self.dir.path().join("owner.pid.next");
        std::fs::write(&next, "kept")
            .and_then(|()| std::fs::rename(&next, &owner))
            .map_err(io(format!("writing {}", owner.display())))?;
        let procs = std::mem::take(
            &mut *self
                .processes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        self.dir.disable_cleanup(true);
        let groups: Vec<String> = procs.iter().map(|p| format!("-{}", p.child.id())).collect();
        Ok(format!(
            "kill -TERM -- {} && sleep 3 && rm -rf {}",
            groups.join(" "),
            self.dir.path().display()
        ))
    }

    /// The directory holding the control plane's files and component logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs the matching kubectl as admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.bin.join("kubectl"))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("kubectl did not run: {e}"))
    }

    /// An admin client. Make one per test: a client belongs to the runtime that made it.
    pub async fn client(&self) -> Result<kube::Client> {
        Ok(kube::Client::try_from(self.admin_config().await?)?)
    }

    /// An admin client that reaches the API server at `server` (a [`Proxy`]'s address, say).
    pub async fn client_via(&self, server: &str) -> Result<kube::Client> {
        let mut config = self.admin_config().await?;
        config.cluster_url = server
            .parse()
            .map_err(|e| Error::Kubeconfig(format!("{server}: {e}")))?;
        Ok(kube::Client::try_from(config)?)
    }

    /// What [`Self::client`] connects with, for a client built otherwise.
    pub async fn admin_config(&self) -> Result<kube::Config> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// The API server's audit log: one JSON event per write request (reads are not logged).
    pub fn audit_log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// A token for the ServiceAccount `namespace/name` (TokenRequest, valid for an hour), as the
    /// kubelet would project it into a pod.
    pub async fn service_account_token(
        &self,
        admin: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<String> {
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![]),
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = sas
            .create_token_request(name, &PostParams::default(), &request)
            .await?;
        let token = serde_json::to_value(&token)
            .ok()
            .and_then(|v| {
                v.pointer("/status/token")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        Ok(token)
    }

    /// Writes to `path` a kubeconfig that acts as the ServiceAccount `namespace/name` (a token
    /// from TokenRequest, valid for an hour), for a process of its own (`host run`).
    pub async fn write_service_account_kubeconfig(
        &self,
        admin: &kube::Client,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<()> {
        let token = self.service_account_token(admin, namespace, name).await?;
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "test", "cluster": {
                "server": self.server(),
                "certificate-authority": self.ca_path() } }],
            "users": [{ "name": name, "user": { "token": token } }],
            "contexts": [{ "name": "test", "context": { "cluster": "test", "user": name } }],
            "current-context": "test",
        });
        std::fs::write(path, config.to_string())
            .map_err(io(format!("writing {}", path.display())))?;
        Ok(())
    }

    /// The cluster's CA certificate (PEM), as a pod finds it beside its token.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A client acting as the ServiceAccount `namespace/name`, with a token from TokenRequest.
    pub async fn service_account_client(
        &self,
        admin: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<kube::Client> {
        let config = self
            .service_account_config_via(admin, namespace, name, None, None)
            .await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// What [`Self::service_account_client`] connects with, reaching the API server at `server`
    /// (a [`Proxy`]'s address, say) and sending `user_agent`, which the audit log records.
    pub async fn service_account_config_via(
        &self,
        admin: &kube::Client,
        namespace: &str,
        name: &str,
        server: Option<&str>,
        user_agent: Option<&str>,
    ) -> Result<kube::Config> {
        let token = self.service_account_token(admin, namespace, name).await?;
        let mut config = self.admin_config().await?;
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        if let Some(server) = server {
            config.cluster_url = server
                .parse()
                .map_err(|e| Error::Kubeconfig(format!("{server}: {e}")))?;
        }
        if let Some(agent) = user_agent {
            config.headers.push((
                http::header::USER_AGENT,
                http::HeaderValue::from_str(agent).map_err(|e| Error::Kubeconfig(e.to_string()))?,
            ));
        }
        Ok(config)
    }

    /// A TCP proxy on loopback in front of the API server, which a test can cut.
    pub fn proxy(&self) -> Result<Proxy> {
        let upstream = self.server.trim_start_matches("https://").to_owned();
        Proxy::start(upstream)
    }

    /// Creates a namespace `<prefix>-<n>` of the test's own and returns its name.
    pub async fn namespace(&self, client: &kube::Client, prefix: &str) -> Result<String> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
                .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(name)
    }

    /// The last lines of every component's log.
    pub fn logs(&self) -> String {
        let procs = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = String::new();
        for p in procs.iter() {
            let text = std::fs::read_to_string(&p.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            let _ = writeln!(
                out,
                "----- {} ({}) -----\n{}",
                p.name,
                p.log.display(),
                tail.join("\n")
            );
        }
        out
    }

    /// A guard that prints every component's log if the test panics.
    pub fn logs_on_failure(&self) -> LogsOnFailure<'_> {
        LogsOnFailure(self)
    }

    /// Kills the API server and starts it again with the same flags (its data is in etcd).
    pub fn restart_apiserver(&self, down_for: Duration) -> Result<()> {
        {
            let mut procs = self
                .processes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(p) = procs.iter_mut().find(|p| p.name == "kube-apiserver") else {
                return Err(Error::Binaries("no kube-apiserver to restart".into()));
            };
            stop(&mut p.child);
            std::thread::sleep(down_for);
            p.child = start_watched(
                &self.dir.path().join("owner.pid"),
                &p.program,
                &p.args,
                &p.log,
            )?;
        }
        self.wait_ready()
    }
}

/// Prints the control plane's logs when dropped during a panic.
#[derive(Debug)]
pub struct LogsOnFailure<'a>(&'a ControlPlane);

impl Drop for LogsOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("control plane logs:\n{}", self.0.logs());
        }
    }
}

/// Removes the directories of control planes whose test process is gone (the shared one is a
/// static, never dropped, so its directory outlives the run).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("testenv-"))
        {
            continue;
        }
        let owner = std::fs::read_to_string(path.join("owner.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok());
        if let Some(pid) = owner
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn start_watched(owner: &Path, program: &Path, args: &[String], log: &Path) -> Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(format!("opening {}", log.display())))?;
    let err = out.try_clone().map_err(io("duplicating a log handle"))?;
    // The loop ends the component when the process named in owner.pid (the test binary) is
    // gone, whatever ended it; `kept` there ([`ControlPlane::keep`]) leaves it running. Asked
    // to stop (TERM), it gives the component 5 s, then kills it: an API server whose etcd is
    // already gone can hang in its graceful shutdown (one was found still running 45 minutes
    // after its test).
    let watchdog = r#"owner=$1; shift; "$@" & child=$!
trap 'kill $child 2>/dev/null; for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 $child 2>/dev/null || break; sleep 0.5; done; kill -9 $child 2>/dev/null; wait $child; exit 0' TERM INT
alive() { p=$(cat "$owner" 2>/dev/null); [ "$p" = kept ] || kill -0 "$p" 2>/dev/null; }
while alive && kill -0 "$child" 2>/dev/null; do sleep 0.5; done
kill $child 2>/dev/null; sleep 2; kill -9 $child 2>/dev/null; wait $child"#;
    std::os::unix::process::CommandExt::process_group(
        Command::new("bash")
            .arg("-c")
            .arg(watchdog)
            .arg("watchdog")
            .arg(owner)
            .arg(program)
            .args(args),
        0,
    )
    .stdin(Stdio::null())
    .stdout(out)
    .stderr(err)
    .spawn()
    .map_err(io(format!("starting {}", program.display())))
}

/// Ends a watched component's whole process group and reaps it.
fn stop(child: &mut Child) {
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let mut procs = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for p in procs.iter_mut().rev() {
            stop(&mut p.child);
        }
    }
}

/// A TCP proxy on loopback, for injecting a network partition between one client and the API
/// server: [`Proxy::cut`] closes every connection through it and refuses new ones (they are
/// accepted and closed at once) until [`Proxy::restore`]; [`Proxy::stall`] holds every byte the
/// client sends (a half-open partition: requests hang, while what the server sends, a watch's
/// events, still arrives); [`Proxy::black_hole`] loses every byte both ways and closes nothing.
#[derive(Debug)]
pub struct Proxy {
    addr: std::net::SocketAddr,
    state: std::sync::Arc<ProxyState>,
}

#[derive(Debug, Default)]
struct ProxyState {
    cut: std::sync::atomic::AtomicBool,
    stall: std::sync::atomic::AtomicBool,
    black_hole: std::sync::atomic::AtomicBool,
    stop: std::sync::atomic::AtomicBool,
    open: Mutex<Vec<std::net::TcpStream>>,
}

impl Proxy {
    fn start(upstream: String) -> Result<Self> {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io("binding the proxy"))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the proxy's address"))?;
        let state = std::sync::Arc::new(ProxyState::default());
        let shared = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                if shared.cut.load(Ordering::Relaxed) {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                // Copies `from` to `to` until either closes; while `hold` says so, holds what
                // it has read instead of writing it.
                let pipe = |from: &std::net::TcpStream, to: &std::net::TcpStream, hold: bool| {
                    let (mut from, mut to) = (from.try_clone().ok()?, to.try_clone().ok()?);
                    let state = shared.clone();
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            // A black hole loses every byte, both ways, and closes nothing.
                            if state.black_hole.load(Ordering::Relaxed) {
                                continue;
                            }
                            while hold
                                && state.stall.load(Ordering::Relaxed)
                                && !state.stop.load(Ordering::Relaxed)
                            {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                    Some(())
                };
                if pipe(&client, &server, true)
                    .and_then(|()| pipe(&server, &client, false))
                    .is_none()
                {
                    continue;
                }
                let mut open = shared
                    .open
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                open.extend([client, server]);
            }
        });
        Ok(Self { addr, state })
    }

    /// `https://127.0.0.1:<port>`, for a client (the API server's certificate names 127.0.0.1).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Cuts every connection through the proxy, and every new one, until restored.
    pub fn cut(&self) {
        self.state
            .cut
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut open = self
            .state
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for s in open.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Holds every byte clients send, on open connections and new ones, until restored: their
    /// requests hang, while the server's side of open connections still flows.
    pub fn stall(&self) {
        self.state
            .stall
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Loses every byte through the proxy, both ways, on open connections and new ones (which
    /// it still accepts), and closes none, until restored: a network that stops answering
    /// without a reset. Requests hang until their client gives up; none reaches the server.
    pub fn black_hole(&self) {
        self.state
            .black_hole
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Lets connections through again (those that lost bytes in a black hole are broken, and
    /// their clients make new ones).
    pub fn restore(&self) {
        self.state
            .black_hole
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.state
            .cut
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.state
            .stall
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.state
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // Wake the accept loop so that it sees `stop`.
        let _ = std::net::TcpStream::connect(self.addr);
    }
}
