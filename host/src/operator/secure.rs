//! Metrics served securely, as controller-runtime's secure metrics serve them: over HTTPS, each
//! request authenticated by the API server (a TokenReview of its bearer token) and authorized by
//! it (a SubjectAccessReview of `get` on the non-resource URL `/metrics`). Whoever may read the
//! metrics is said by RBAC: a ClusterRole with `nonResourceURLs: ["/metrics"]`, `verbs: [get]`
//! (the chart's `<release>-metrics-reader`). The probes (`/healthz`, `/readyz`) stay plain HTTP on
//! their own address, for the kubelet.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest as _, Sha256};

/// How long an answer of the API server about a token is kept: a scrape every 30 s asks once a
/// minute at most.
const REMEMBERED: Duration = Duration::from_secs(60);
/// Reviews asked of the API server at once: requests with tokens never seen before (anyone who
/// reaches the port can send them) wait their turn rather than multiply the operator's own
/// requests to the API server.
const REVIEWS_IN_FLIGHT: usize = 2;
/// How many tokens' answers are kept at most (past that, the oldest go).
const REMEMBERED_TOKENS: usize = 256;
/// How long a client has to finish its TLS handshake and send its request's head.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Connections served at once; past that, a new one is closed at once (a scraper retries).
const CONNECTIONS: usize = 64;

/// Why the secure metrics could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The certificate or key given could not be read or used.
    #[error("the metrics certificate {path}: {reason}")]
    Certificate { path: String, reason: String },
}

/// The TLS configuration of the metrics server: the certificate and key in `dir` (`tls.crt`,
/// `tls.key`, as a cert-manager Secret mounts them), or a self-signed certificate made at start
/// for `names`, as controller-runtime makes one when given none.
pub fn tls_config(
    dir: Option<&std::path::Path>,
    names: &[String],
) -> Result<Arc<rustls::ServerConfig>, Error> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (certs, key) = match dir {
        Some(dir) => {
            let fail = |file: &str, reason: String| Error::Certificate {
                path: dir.join(file).display().to_string(),
                reason,
            };
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(dir.join("tls.crt"))
                    .map_err(|e| fail("tls.crt", e.to_string()))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| fail("tls.crt", e.to_string()))?;
            if certs.is_empty() {
                return Err(fail("tls.crt", "no certificate in it".to_owned()));
            }
            let key = PrivateKeyDer::from_pem_file(dir.join("tls.key"))
                .map_err(|e| fail("tls.key", e.to_string()))?;
            (certs, key)
        }
        None => {
            let fail = |reason: String| Error::Certificate {
                path: "(self-signed)".to_owned(),
                reason,
            };
            let signed = rcgen::generate_simple_self_signed(names.to_vec())
                .map_err(|e| fail(e.to_string()))?;
            let key = PrivateKeyDer::try_from(signed.signing_key.serialize_der())
                .map_err(|e| fail(e.to_owned()))?;
            (vec![signed.cert.der().clone()], key)
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| Error::Certificate {
            path: dir.map_or("(self-signed)".to_owned(), |d| d.display().to_string()),
            reason: e.to_string(),
        })?;
    Ok(Arc::new(config))
}

/// Who asks, as the API server answered for a token, and when that answer expires.
#[derive(Debug, Clone)]
struct Answer {
    /// `Ok`: allowed; `Err`: the status and why not.
    verdict: Result<(), (StatusCode, String)>,
    until: Instant,
}

/// The API server, asked who presents a token and whether they may read the metrics.
#[derive(Clone)]
pub struct Reviewer {
    client: kube::Client,
    asking: Arc<tokio::sync::Semaphore>,
    remembered: Arc<Mutex<HashMap<[u8; 32], Answer>>>,
}

impl std::fmt::Debug for Reviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reviewer").finish_non_exhaustive()
    }
}

impl Reviewer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            asking: Arc::new(tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT)),
            remembered: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Whether the bearer of `token` may `get` `path`: asked of the API server, remembered
    /// for a minute (by the token's hash).
    async fn review(&self, token: &str, path: &str) -> Result<(), (StatusCode, String)> {
        let key: [u8; 32] = Sha256::digest(format!("{path}\n{token}")).into();
        let now = Instant::now();
        if let Some(a) = super::lock(&self.remembered).get(&key)
            && a.until > now
        {
            return a.verdict.clone();
        }
        let verdict = match self.asking.acquire().await {
            Ok(_turn) => self.ask(token, path).await,
            Err(_) => Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "the metrics server is stopping".to_owned(),
            )),
        };
        // A failure to ask is not remembered: the next scrape asks again.
        if !matches!(&verdict, Err((StatusCode::SERVICE_UNAVAILABLE, _))) {
            let mut remembered = super::lock(&self.remembered);
            if remembered.len() >= REMEMBERED_TOKENS {
                remembered.retain(|_, a| a.until > now);
                if remembered.len() >= REMEMBERED_TOKENS {
                    remembered.clear();
                }
            }
            remembered.insert(
                key,
                Answer {
                    verdict: verdict.clone(),
                    until: now + REMEMBERED,
                },
            );
        }
        verdict
    }

    async fn ask(&self, token: &str, path: &str) -> Result<(), (StatusCode, String)> {
        let unavailable = |e: kube::Error| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot ask the API server: {e}"),
            )
        };
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = reviews
            .create(
                &PostParams::default(),
                &TokenReview {
                    spec: TokenReviewSpec {
                        token: token.to_owned(),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .map_err(unavailable)?;
        let status = review.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err((
                StatusCode::UNAUTHORIZED,
                format!(
                    "the token is not valid{}",
                    status.error.map(|e| format!(": {e}")).unwrap_or_default()
                ),
            ));
        }
        let user = status.user.unwrap_or_default();
        let name = user.username.clone().unwrap_or_default();
        let access: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = access
            .create(
                &PostParams::default(),
                &SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: user.username,
                        groups: user.groups,
                        uid: user.uid,
                        extra: user.extra,
                        non_resource_attributes: Some(NonResourceAttributes {
                            path: Some(path.to_owned()),
                            verb: Some("get".to_owned()),
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .map_err(unavailable)?;
        match answer.status {
            Some(s) if s.allowed => Ok(()),
            _ => Err((
                StatusCode::FORBIDDEN,
                format!(
                    "{name} may not get {path} (RBAC: nonResourceURLs [\"{path}\"], verbs [get])"
                ),
            )),
        }
    }
}

/// Lets a request through when its bearer token may `get` its path, as the API server says.
pub async fn authorize(State(reviewer): State<Reviewer>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let Some(token) = token else {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is needed (a ServiceAccount's, allowed to get /metrics)",
        )
            .into_response();
    };
    match reviewer.review(&token, request.uri().path()).await {
        Ok(()) => next.run(request).await,
        Err((status, why)) => (status, why).into_response(),
    }
}

/// Serves `app` over TLS on `addr` until `shutdown` resolves: each connection on its own task,
/// with a deadline for its handshake and request head, so that no client holds up the others.
/// On shutdown, the connections open finish the request in flight (for at most the handshake
/// deadline) and close.
pub async fn serve_tls(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let room = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    let (closing, closed) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            let (tcp, _) = tokio::select! {
                () = &mut shutdown => {
                    let _ = closing.send(true);
                    return;
                }
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("metrics server: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = room.clone().try_acquire_owned() else {
                continue;
            };
            let (acceptor, app, mut closed) = (acceptor.clone(), app.clone(), closed.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await
                else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HANDSHAKE)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                tokio::pin!(connection);
                tokio::select! {
                    _ = connection.as_mut() => {}
                    // Only `true` is ever sent; a sender gone means the server stopped too.
                    _ = closed.changed() => {
                        connection.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(HANDSHAKE, connection).await;
                    }
                }
            });
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_made_when_none_is_given_and_a_bad_one_is_named() {
        assert!(tls_config(None, &["localhost".to_owned()]).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let e = tls_config(Some(dir.path()), &[]).unwrap_err().to_string();
        assert!(e.contains("tls.crt"), "{e}");
        std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
        let e = tls_config(Some(dir.path()), &[]).unwrap_err().to_string();
        assert!(e.contains("tls.crt") && e.contains("no certificate"), "{e}");
        // A certificate and a key that is not its own.
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.path().join("tls.crt"), made.cert.pem()).unwrap();
        std::fs::write(dir.path().join("tls.key"), other.serialize_pem()).unwrap();
        assert!(tls_config(Some(dir.path()), &[]).is_err());
        std::fs::write(dir.path().join("tls.key"), made.signing_key.serialize_pem()).unwrap();
        assert!(tls_config(Some(dir.path()), &[]).is_ok());
    }
}
