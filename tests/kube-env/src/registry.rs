//! A real OCI registry on loopback (distribution's `registry`, built by `scripts/registry`), for
//! tests that push and pull plugins: optionally behind a user name and password (htpasswd) and
//! TLS with a CA of its own.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

use crate::{Error, Result, free_port, io};

/// The `registry` binary: `$REGISTRY`, else what `scripts/registry` prints (it builds
/// distribution's registry from the Go module proxy the first time, and caches it).
pub fn registry_binary() -> Result<PathBuf> {
    crate::built("REGISTRY", "scripts/registry")
}

/// How a test registry is set up.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// A user name and password it asks for (Basic auth, htpasswd).
    pub user: Option<(String, String)>,
    /// Serve HTTPS with a certificate from a CA of its own ([`Registry::ca`]).
    pub tls: bool,
}

/// A registry running on loopback, stopped and removed when dropped.
pub struct Registry {
    addr: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
    options: RegistryOptions,
}

impl Registry {
    /// Starts a registry and waits until it answers.
    pub fn start(options: RegistryOptions) -> Result<Self> {
        let binary = registry_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("registry-")
            .tempdir()
            .map_err(io("creating the registry's directory"))?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let path = |name: &str| dir.path().join(name).display().to_string();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  secret: test-only\n",
            path("data")
        );
        if options.tls {
            let (ca, cert, key) = certificates()?;
            write(&dir.path().join("ca.pem"), &ca)?;
            write(&dir.path().join("cert.pem"), &cert)?;
            write(&dir.path().join("key.pem"), &key)?;
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                path("cert.pem"),
                path("key.pem")
            ));
        }
        if let Some((user, password)) = &options.user {
            let hash = bcrypt::hash(password, 4)
                .map_err(|e| Error::Binaries(format!("hashing the test password: {e}")))?;
            write(&dir.path().join("htpasswd"), &format!("{user}:{hash}\n"))?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: wasm-operator-test\n    path: {}\n",
                path("htpasswd")
            ));
        }
        write(&dir.path().join("config.yml"), &config)?;
        // The watchdog's owner: this process (the registry ends when it does).
        write(
            &dir.path().join("owner.pid"),
            &std::process::id().to_string(),
        )?;
        let child = crate::start_watched(
            &dir.path().join("owner.pid"),
            &binary,
            &["serve".to_owned(), path("config.yml")],
            &dir.path().join("registry.log"),
        );
        let mut registry = Self {
            addr,
            dir,
            child: Some(child?),
            options,
        };
        registry.wait_ready()?;
        Ok(registry)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&self.addr).is_err() {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(Error::NotReady(
                    format!("the registry exited ({status})"),
                    self.logs(),
                ));
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady(
                    "the registry did not listen within 30 s".into(),
                    self.logs(),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Its address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The CA that signed its certificate (PEM), when it serves HTTPS.
    pub fn ca(&self) -> Option<PathBuf> {
        self.options.tls.then(|| self.dir.path().join("ca.pem"))
    }

    /// Where it keeps the blob with `digest` (`sha256:...`), to damage it in a test.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2.min(hex.len())])
            .join(hex)
            .join("data")
    }

    /// Its log.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Stops it (a registry that is down); its files stay until it is dropped.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::stop(&mut child);
        }
    }

    /// Starts it again on the same address and storage.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        let binary = registry_binary()?;
        let config = self.dir.path().join("config.yml").display().to_string();
        self.child = Some(crate::start_watched(
            &self.dir.path().join("owner.pid"),
            &binary,
            &["serve".to_owned(), config],
            &self.dir.path().join("registry.log"),
        )?);
        self.wait_ready()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

/// A CA, and a certificate for 127.0.0.1 and localhost that it signed (PEM; the key too).
fn certificates() -> Result<(String, String, String)> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "registry-test-ca");
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let cert = params.signed_by(&key, &issuer)?;
    Ok((ca.pem(), cert.pem(), key.serialize_pem()))
}
