//! A real OCI registry on loopback (distribution's `registry`, built by `scripts/registry`), for
//! tests that push and pull plugins: optionally behind a user name and password (htpasswd) and
//! TLS with a CA of its own, or behind distribution's token server (Bearer tokens, as most public
//! registries ask for).

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
    /// Ask for Bearer tokens from a token server (distribution's `token-server`, which checks
    /// `user` and grants its holder the repositories under `<user>/`), instead of Basic auth.
    pub token: bool,
}

/// A registry running on loopback, stopped and removed when dropped.
pub struct Registry {
    addr: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The token server, with `token`.
    token_server: Option<Child>,
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
        }
        let mut token_server = None;
        if options.token {
            if options.user.is_none() {
                return Err(Error::Binaries(
                    "a token server needs a user (RegistryOptions::user)".into(),
                ));
            }
            let (key, jwks) = token_signing_key()?;
            write(&dir.path().join("token-key.pem"), &key)?;
            write(&dir.path().join("jwks.json"), &jwks)?;
            let token_addr = format!("127.0.0.1:{}", free_port()?);
            write(
                &dir.path().join("owner.pid"),
                &std::process::id().to_string(),
            )?;
            token_server = Some(crate::start_watched(
                &dir.path().join("owner.pid"),
                &token_server_binary()?,
                &[
                    "-addr".to_owned(),
                    token_addr.clone(),
                    "-issuer".to_owned(),
                    TOKEN_ISSUER.to_owned(),
                    "-key".to_owned(),
                    path("token-key.pem"),
                    "-passwd".to_owned(),
                    path("htpasswd"),
                    "-realm".to_owned(),
                    "wasm-operator-test".to_owned(),
                ],
                &dir.path().join("token-server.log"),
            )?);
            wait_listening(&token_addr, "the token server", || {
                std::fs::read_to_string(dir.path().join("token-server.log")).unwrap_or_default()
            })?;
            config.push_str(&format!(
                "auth:\n  token:\n    realm: http://{token_addr}/token/\n    service: wasm-operator-test\n    issuer: {TOKEN_ISSUER}\n    jwks: {}\n",
                path("jwks.json")
            ));
        } else if options.user.is_some() {
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
            token_server,
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

    /// The token server's log, with [`RegistryOptions::token`].
    pub fn token_server_logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("token-server.log")).unwrap_or_default()
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
        if let Some(mut child) = self.token_server.take() {
            crate::stop(&mut child);
        }
    }
}

/// The issuer the token server names in its tokens, and the registry expects.
const TOKEN_ISSUER: &str = "wasm-operator-test-token-server";

/// distribution's token server: beside the registry (`scripts/registry` builds both).
fn token_server_binary() -> Result<PathBuf> {
    let registry = registry_binary()?;
    let binary = registry.with_file_name("token-server");
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(Error::Binaries(format!(
            "{} is missing: run scripts/registry (it builds the token server too)",
            binary.display()
        )))
    }
}

/// Waits until `addr` accepts connections.
fn wait_listening(addr: &str, what: &str, logs: impl Fn() -> String) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            return Err(Error::NotReady(
                format!("{what} did not listen within 30 s"),
                logs(),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The token server's signing key (a P-256 key, PEM, in the SEC 1 form it reads), and the
/// JSON Web Key Set the registry trusts it by. The token server names its key by libtrust's
/// key ID, so the key set does too.
fn token_signing_key() -> Result<(String, String)> {
    use base64::Engine as _;
    use sha2::Digest as _;
    let key = KeyPair::generate()?;
    let pkcs8 = key.serialized_der();
    // The private scalar: in the PKCS #8 form, the SEC 1 structure's OCTET STRING of 32 bytes
    // after its version (INTEGER 1).
    let marker = [0x02, 0x01, 0x01, 0x04, 0x20];
    let at = pkcs8
        .windows(marker.len())
        .position(|w| w == marker)
        .map(|i| i + marker.len())
        .filter(|i| i + 32 <= pkcs8.len())
        .ok_or_else(|| Error::Binaries("the test key is not a P-256 PKCS #8 key".into()))?;
    let scalar = &pkcs8[at..at + 32];
    let point = key.public_key_raw();
    if point.len() != 65 {
        return Err(Error::Binaries(
            "the test key's point is not uncompressed P-256".into(),
        ));
    }
    // ECPrivateKey ::= SEQUENCE { version 1, privateKey OCTET STRING, [0] prime256v1, [1] point }
    let mut sec1 = vec![0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20];
    sec1.extend_from_slice(scalar);
    sec1.extend_from_slice(&[
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0xa1, 0x44, 0x03,
        0x42, 0x00,
    ]);
    sec1.extend_from_slice(point);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&sec1);
    let mut pem = String::from("-----BEGIN EC PRIVATE KEY-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END EC PRIVATE KEY-----\n");
    // libtrust's key ID: the SHA-256 of the public key (DER), cut to 240 bits, in base32, in
    // twelve groups of four.
    let digest = sha2::Sha256::digest(rcgen::PublicKeyData::subject_public_key_info(&key));
    let id = base32(&digest[..30])
        .as_bytes()
        .chunks(4)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(":");
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let jwks = serde_json::json!({ "keys": [{
        "kty": "EC",
        "crv": "P-256",
        "x": url.encode(&point[1..33]),
        "y": url.encode(&point[33..65]),
        "kid": id,
        "use": "sig",
    }]});
    Ok((pem, jwks.to_string()))
}

/// RFC 4648 base32, without padding.
fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for b in bytes {
        buffer = (buffer << 8) | u32::from(*b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
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
