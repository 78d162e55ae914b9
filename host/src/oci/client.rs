//! The OCI distribution API, as much of it as pushing and pulling one plugin needs: blobs
//! uploaded whole, manifests by tag or digest, anonymous, Basic and Bearer-token auth, redirects
//! for blobs served from elsewhere. Every byte read is bounded, and every call has a deadline.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{Credentials, Error, Reference};

/// A manifest is small; anything larger than this is not one.
pub(crate) const MAX_MANIFEST: usize = 4 << 20;

/// How a registry is reached.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// PEM certificates trusted besides the system's (a registry with a private CA).
    pub ca_file: Option<std::path::PathBuf>,
    /// Speak plain HTTP to every registry (else only to loopback ones that do not speak TLS).
    pub plain_http: bool,
    /// The credentials of each registry.
    pub credentials: Credentials,
    /// The Docker config JSON they come from, read again at each connection (a Secret
    /// rotated under a running operator takes effect).
    pub credentials_file: Option<std::path::PathBuf>,
    /// How long one request may take.
    pub timeout: Duration,
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// A client of one registry, for one repository.
pub struct Client {
    http: HyperClient<Https, Full<Bytes>>,
    reference: Reference,
    /// `https` or `http`.
    scheme: &'static str,
    /// The `Authorization` header that the registry accepted, once it asked for one (renewed
    /// when a token expires).
    auth: std::sync::Mutex<Option<HeaderValue>>,
    options: Options,
    /// Whether this client may push (the token's scope).
    push: bool,
}

/// A registry's answer, read whole.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Whether the registry itself gave it (not a host a redirect led to).
    pub at_home: bool,
}

impl Client {
    /// A client for `reference`'s repository; `push` asks for the right to push too. Finds out
    /// how to reach the registry (HTTPS, or plain HTTP for a loopback registry or when asked)
    /// and how to authenticate.
    pub async fn connect(
        reference: &Reference,
        options: &Options,
        push: bool,
    ) -> Result<Self, Error> {
        let tls = tls_config(options.ca_file.as_deref())?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        let mut options = options.clone();
        if let Some(path) = &options.credentials_file {
            options.credentials = Credentials::from_file(path)?;
        }
        let mut client = Self {
            http,
            reference: reference.clone(),
            scheme: if options.plain_http { "http" } else { "https" },
            auth: std::sync::Mutex::new(None),
            options,
            push,
        };
        let ping = "/v2/";
        let first = client
            .send(Method::GET, ping, HeaderMap::new(), Bytes::new(), 1 << 16)
            .await;
        let answer = match first {
            // A loopback registry that does not speak TLS is spoken to over plain HTTP; if it
            // does not answer that either, the TLS failure is the one to report.
            Err(tls @ Error::Unreachable { .. })
                if !client.options.plain_http && reference.is_loopback() =>
            {
                client.scheme = "http";
                match client
                    .send(Method::GET, ping, HeaderMap::new(), Bytes::new(), 1 << 16)
                    .await
                {
                    Ok(a) if a.status.is_success() || a.status == StatusCode::UNAUTHORIZED => a,
                    _ => return Err(tls),
                }
            }
            other => other?,
        };
        if answer.status == StatusCode::UNAUTHORIZED {
            client.authenticate(&answer.headers).await?;
        } else if !answer.status.is_success() {
            return Err(client.unexpected("GET /v2/", &answer));
        }
        Ok(client)
    }

    /// The reference this client was made for.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// Answers the registry's challenge (`WWW-Authenticate`) with the credentials given for it.
    async fn authenticate(&self, headers: &HeaderMap) -> Result<(), Error> {
        let registry = self.reference.registry.clone();
        let challenge = headers
            .get(header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let basic = self.options.credentials.basic(&registry);
        let (scheme, params) = parse_challenge(&challenge);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                let Some(basic) = basic else {
                    return Err(Error::Unauthorized {
                        registry,
                        why: "it asks for a user name and password, and none is configured for it"
                            .into(),
                    });
                };
                self.set_auth(header_value(&format!("Basic {basic}"))?);
            }
            "bearer" => {
                let realm = params
                    .iter()
                    .find(|(k, _)| k == "realm")
                    .map(|(_, v)| v.clone());
                let Some(realm) = realm else {
                    return Err(Error::Unauthorized {
                        registry,
                        why: format!("its Bearer challenge names no realm: {challenge}"),
                    });
                };
                // A token service over plain HTTP would see the password in the clear.
                if realm.starts_with("http://")
                    && basic.is_some()
                    && !self.options.plain_http
                    && !self.reference.is_loopback()
                {
                    return Err(Error::Unauthorized {
                        registry,
                        why: format!(
                            "its token service {} is plain HTTP; credentials are not sent there (--plain-http allows it)",
                            without_query(&realm)
                        ),
                    });
                }
                // This client's scope, and any the registry's challenge names (a token that
                // lacked one): one `scope` parameter each, as the token protocol has it.
                let actions = if self.push { "pull,push" } else { "pull" };
                let mut scopes = vec![format!(
                    "repository:{}:{actions}",
                    self.reference.repository
                )];
                for (_, named) in params.iter().filter(|(k, _)| k == "scope") {
                    for scope in named.split_whitespace() {
                        if !scopes.iter().any(|s| s == scope) {
                            scopes.push(scope.to_owned());
                        }
                    }
                }
                let mut query: Vec<(String, String)> = scopes
                    .into_iter()
                    .map(|scope| ("scope".to_owned(), scope))
                    .collect();
                if let Some((_, service)) = params.iter().find(|(k, _)| k == "service") {
                    query.push(("service".to_owned(), service.clone()));
                }
                let url = format!(
                    "{realm}{}{}",
                    if realm.contains('?') { '&' } else { '?' },
                    query
                        .iter()
                        .map(|(k, v)| format!("{k}={}", encode(v)))
                        .collect::<Vec<_>>()
                        .join("&")
                );
                let mut headers = HeaderMap::new();
                if let Some(basic) = basic {
                    headers.insert(
                        header::AUTHORIZATION,
                        header_value(&format!("Basic {basic}"))?,
                    );
                }
                let answer = self
                    .request(Method::GET, &url, headers, Bytes::new(), 1 << 20)
                    .await?;
                if !answer.status.is_success() {
                    return Err(Error::Unauthorized {
                        registry,
                        why: format!(
                            "its token service ({realm}) answered {}: {}",
                            answer.status,
                            super::shown(&answer.body)
                        ),
                    });
                }
                let token: serde_json::Value =
                    serde_json::from_slice(&answer.body).map_err(|e| Error::Unauthorized {
                        registry: registry.clone(),
                        why: format!("its token service answered something that is not JSON: {e}"),
                    })?;
                let token = token
                    .get("token")
                    .or_else(|| token.get("access_token"))
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| Error::Unauthorized {
                        registry: registry.clone(),
                        why: "its token service gave no token".into(),
                    })?;
                self.set_auth(header_value(&format!("Bearer {token}"))?);
            }
            _ => {
                return Err(Error::Unauthorized {
                    registry,
                    why: format!(
                        "it asks for an authentication this host does not speak: {challenge:?}"
                    ),
                });
            }
        }
        Ok(())
    }

    fn set_auth(&self, auth: HeaderValue) {
        *self
            .auth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(auth);
    }

    fn auth(&self) -> Option<HeaderValue> {
        self.auth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sends a request to `path` on the registry (or to a full URL), with the credentials it
    /// accepted, reading at most `limit` bytes of the answer. Credentials refused after they
    /// were accepted (a token expired, or one without the scope this request needs) are asked
    /// for again, once, and the request sent again.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
        limit: usize,
    ) -> Result<Answer, Error> {
        let had = self.auth();
        let answer = self
            .send_once(method.clone(), path, headers.clone(), body.clone(), limit)
            .await?;
        // Only the registry's own challenge is answered: a host a redirect led to (a bucket, a
        // CDN) never gets to name a token service the credentials would go to.
        if answer.status != StatusCode::UNAUTHORIZED
            || !answer.at_home
            || had.is_none()
            || !answer.headers.contains_key(header::WWW_AUTHENTICATE)
        {
            return Ok(answer);
        }
        tracing::debug!(registry = %self.reference.registry, "credentials refused; asking again");
        self.authenticate(&answer.headers).await?;
        self.send_once(method, path, headers, body, limit).await
    }

    async fn send_once(
        &self,
        method: Method,
        path: &str,
        mut headers: HeaderMap,
        body: Bytes,
        limit: usize,
    ) -> Result<Answer, Error> {
        let url = if path.starts_with("http://") || path.starts_with("https://") {
            path.to_owned()
        } else {
            format!("{}://{}{path}", self.scheme, self.reference.registry)
        };
        // Credentials go to the registry itself, as it was reached, and nowhere else (an upload
        // Location on another host, or the same host over plain HTTP behind a TLS proxy).
        let home = format!("{}://{}", self.scheme, self.reference.registry);
        if let Some(auth) = self.auth()
            && authority(&url) == home
        {
            headers.insert(header::AUTHORIZATION, auth);
        }
        // Blobs may be served from elsewhere (a bucket): follow redirects, and send our
        // credentials to the registry alone.
        let mut url = url;
        for _ in 0..5 {
            let mut answer = self
                .request(method.clone(), &url, headers.clone(), body.clone(), limit)
                .await?;
            answer.at_home = authority(&url) == home;
            if !answer.status.is_redirection() {
                return Ok(answer);
            }
            let Some(location) = answer
                .headers
                .get(header::LOCATION)
                .and_then(|l| l.to_str().ok())
            else {
                return Ok(answer);
            };
            let next = resolve(&url, location);
            if authority(&next) != authority(&url) {
                headers.remove(header::AUTHORIZATION);
            }
            url = next;
        }
        Err(Error::Registry {
            registry: self.reference.registry.clone(),
            why: format!("too many redirects, the last to {}", without_query(&url)),
        })
    }

    /// One request, with the deadline, reading at most `limit` bytes of the answer.
    async fn request(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
        limit: usize,
    ) -> Result<Answer, Error> {
        let unreachable = |why: String| Error::Unreachable {
            registry: self.reference.registry.clone(),
            why,
        };
        let mut request = Request::builder().method(method).uri(url);
        for (k, v) in &headers {
            request = request.header(k, v);
        }
        request = request.header(
            header::USER_AGENT,
            concat!("wasm-operator/", env!("CARGO_PKG_VERSION")),
        );
        let request = request
            .body(Full::new(body))
            .map_err(|e| unreachable(format!("{}: {e}", without_query(url))))?;
        let call = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| unreachable(format!("{}: {}", without_query(url), chain(&e))))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, limit)
                .collect()
                .await
                .map_err(|e| Error::Registry {
                    registry: self.reference.registry.clone(),
                    why: format!(
                        "{url}: the answer was cut short or is larger than {limit} bytes: {e}"
                    ),
                })?
                .to_bytes();
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
                at_home: false,
            })
        };
        tokio::time::timeout(self.options.timeout, call)
            .await
            .map_err(|_| {
                unreachable(format!(
                    "{url}: no answer within {:?}",
                    self.options.timeout
                ))
            })?
    }

    /// The error for an answer that was not expected.
    pub(crate) fn unexpected(&self, what: &str, answer: &Answer) -> Error {
        match answer.status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Unauthorized {
                registry: self.reference.registry.clone(),
                why: format!("{what}: {} {}", answer.status, super::shown(&answer.body)),
            },
            _ => Error::Registry {
                registry: self.reference.registry.clone(),
                why: format!("{what}: {} {}", answer.status, super::shown(&answer.body)),
            },
        }
    }

    /// The path of the repository's `part` (`blobs`, `manifests`) named `name`.
    pub(crate) fn path(&self, part: &str, name: &str) -> String {
        format!("/v2/{}/{part}/{name}", self.reference.repository)
    }
}

/// The TLS settings: the system's roots, and those of `ca_file`.
pub fn tls_config(ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, Error> {
    let mut roots = rustls::RootCertStore::empty();
    // Roots that cannot be read are skipped: a registry that needs one fails with a TLS error.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        use rustls::pki_types::pem::PemObject as _;
        let bad = |why: String| Error::Ca {
            path: path.to_path_buf(),
            why,
        };
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let mut n = 0;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| bad(format!("not PEM certificates: {e}")))?;
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
            n += 1;
        }
        if n == 0 {
            return Err(bad("no certificate in it".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Ca {
            path: ca_file
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// `Bearer realm="...",service="..."` as its scheme and parameters.
fn parse_challenge(challenge: &str) -> (String, Vec<(String, String)>) {
    let (scheme, rest) = challenge
        .trim()
        .split_once(' ')
        .unwrap_or((challenge.trim(), ""));
    let mut params = Vec::new();
    let mut rest = rest.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_owned();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (quoted[..end].to_owned(), &quoted[end + 1..]),
                None => (quoted.to_owned(), ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (after[..end].trim().to_owned(), &after[end..]),
                None => (after.trim().to_owned(), ""),
            }
        };
        params.push((key, value));
        rest = next.trim_start_matches([',', ' ']);
    }
    (scheme.to_owned(), params)
}

/// `location` (absolute, or relative to `base`) as an absolute URL.
fn resolve(base: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        location.to_owned()
    } else if location.starts_with('/') {
        format!("{}{location}", authority(base))
    } else {
        let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
        format!("{dir}/{location}")
    }
}

/// `url` without its query, which may hold a signature or an upload's state: what errors, and
/// so statuses and logs, show of it.
fn without_query(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

/// The scheme and host of `url`.
fn authority(url: &str) -> &str {
    let origin_end = url.find("://").map_or(0, |i| i + 3);
    let host_end = url[origin_end..]
        .find('/')
        .map_or(url.len(), |i| origin_end + i);
    &url[..host_end]
}

/// Percent-encodes a query value.
pub(crate) fn encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header_value(v: &str) -> Result<HeaderValue, Error> {
    HeaderValue::from_str(v).map_err(|_| Error::Credentials {
        path: None,
        why: "a credential holds characters an HTTP header cannot".into(),
    })
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// `user:password` as the Basic scheme sends it.
pub(crate) fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_as_registries_send_them() {
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull""#,
        );
        assert_eq!(scheme, "Bearer");
        assert_eq!(
            params,
            vec![
                ("realm".into(), "https://auth.example.com/token".into()),
                ("service".into(), "registry.example.com".into()),
                ("scope".into(), "repository:a/b:pull".into()),
            ]
        );
        let (scheme, params) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(
            (scheme.as_str(), params[0].1.as_str()),
            ("Basic", "Registry Realm")
        );
    }

    #[test]
    fn redirects_resolve_and_credentials_stay_home() {
        let base = "https://r.example.com/v2/a/blobs/sha256:1";
        assert_eq!(resolve(base, "/x?y=1"), "https://r.example.com/x?y=1");
        assert_eq!(
            resolve(base, "https://bucket.example.net/b"),
            "https://bucket.example.net/b"
        );
        assert_ne!(authority(base), authority("https://bucket.example.net/b"));
        assert_eq!(authority(base), "https://r.example.com");
        assert_eq!(
            encode("repository:a/b:pull,push"),
            "repository%3Aa%2Fb%3Apull%2Cpush"
        );
    }
}
