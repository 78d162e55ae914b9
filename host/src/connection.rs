//! The connections to the API server: kube's own request stack (base URI, credentials, extra
//! headers, retries of 429, 503 and 504, timeouts) over HTTP/2 where the server offers it, as
//! client-go connects.
//!
//! kube's default client speaks HTTP/1.1 only, so every watch holds a TCP and TLS connection of
//! its own, with its buffers, and every concurrent request opens another that the pool then
//! keeps. A replica watches each served Kind and each child Kind, in each namespace it watches,
//! for each shard it holds, and shard 0's holder each served Kind once more
//! (`operator::labeller`): dozens of connections. Over HTTP/2 they are streams of a few: the
//! requests share one ([`Cluster::client`]), and the watches fill others, at most
//! [`WATCHES_PER_CONNECTION`] each ([`Watches`]), because a server lets a connection carry only
//! so many streams at once and a watch never gives its stream back. HTTP/2 is negotiated by
//! ALPN (`h2`, else `http/1.1`), so a server or proxy without it is still reached, one
//! connection per request as before. A connection that stops answering is found by pings
//! within [`PING_INTERVAL`] plus [`PING_TIMEOUT`] (client-go's health check: 30 s and 15 s),
//! not when a watch's timeout ends: every request on it fails, and its watches start again on a
//! new one.
//!
//! The Leases (leader election, shards) keep kube's own HTTP/1.1 stack ([`Cluster::leases`]): a
//! renewal that misses its 4 s bound drops its connection with it, so the next one, 2 s later,
//! connects afresh (to another API server behind a load balancer, say), well within the 10 s
//! renew deadline; a shared connection would be found dead only by its pings, after 45 s.
//!
//! A config with a proxy (`proxy-url` in the kubeconfig, or `HTTPS_PROXY`) keeps kube's own
//! stack too, which refuses it as before: kube's proxy features are not built in.

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt as _;
use kube::client::retry::RetryPolicy;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// How long a connection may be silent before the client pings it.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for the cluster `config` names, over HTTP/2 where the server offers it: one
/// connection, shared by its requests; kube's own stack for a config with a proxy.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let tls = config.rustls_client_config()?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = config.tls_server_name.as_deref() {
        let name = rustls::pki_types::ServerName::try_from(name.to_owned())
            .map_err(kube::client::RustlsTlsError::InvalidServerName)
            .map_err(kube::Error::RustlsTls)?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    // kube's timeouts, as its own stack sets them: connecting (TCP and TLS), and each write.
    let mut connector = TimeoutConnector::new(https.enable_all_versions().wrap_connector(http));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        // A connection is not let go for lack of checkouts: a watch holds its stream for
        // minutes without one, and the pings and the server's GOAWAY end a connection that is
        // gone. (Over HTTP/1.1 the pool then keeps as many idle connections as were ever in use
        // at once.)
        .pool_idle_timeout(None)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // Each request in a debug span, each failure (an error, a 5xx) logged, as kube's does.
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// How many watches one connection carries at most. kube-apiserver lets a client open 100
/// streams at once on a connection (`--http2-max-streams-per-connection`, unset: 100), and a
/// request past that waits for a stream to close: a connection full of watches, which never
/// close, would leave the next one waiting for ever, and the requests queued behind it. Half
/// leaves room for a server configured lower than the default.
pub const WATCHES_PER_CONNECTION: usize = 50;

/// What the operator connects with: a client for its requests, one for its Leases, and the
/// connections of its watches.
#[derive(Clone)]
pub struct Cluster {
    /// Reads and writes.
    pub client: kube::Client,
    /// The Leases' reads and writes, over kube's own HTTP/1.1 stack (see the module's text).
    pub leases: kube::Client,
    /// Watches.
    pub watches: Watches,
}

impl Cluster {
    /// The connections of an operator connecting as `config` says.
    pub fn connect(config: kube::Config) -> Result<Self, kube::Error> {
        let client = client(config.clone())?;
        Ok(Self {
            leases: kube::Client::try_from(config.clone())?,
            watches: Watches::new(config, client.clone()),
            client,
        })
    }
}

/// A client that carries everything (as an embedding or a test connects). It must be kube's
/// own HTTP/1.1 client, where each watch has a connection of its own: on one HTTP/2
/// connection, the watches past the server's stream limit would wait for ever.
impl From<kube::Client> for Cluster {
    fn from(client: kube::Client) -> Self {
        Self {
            leases: client.clone(),
            watches: Watches::shared(client.clone()),
            client,
        }
    }
}

/// The connections the watches use, apart from the one requests use: a watch takes a place on
/// the first with fewer than [`WATCHES_PER_CONNECTION`] (a new connection when none has) and
/// holds it until it ends, so that no connection reaches the server's stream limit however
/// many Kinds, namespaces and shards a replica watches. Over HTTP/1.1 (a server without
/// HTTP/2) each watch has a connection of its own anyway.
#[derive(Clone)]
pub struct Watches(std::sync::Arc<WatchesInner>);

struct WatchesInner {
    /// How to open another connection; none when every watch shares `fallback`.
    config: Option<kube::Config>,
    /// Used when another connection cannot be made (its credentials could not be read again):
    /// the requests' client.
    fallback: kube::Client,
    lines: std::sync::Mutex<Vec<std::sync::Arc<Line>>>,
}

/// One connection (a client of its own), and how many watches are on it.
struct Line {
    client: kube::Client,
    watches: std::sync::atomic::AtomicUsize,
}

impl Line {
    fn load(&self) -> usize {
        self.watches.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A watch's place on a connection: the connection's client, and the place given back when
/// this is dropped (with the watch's stream that owns it).
pub struct WatchPlace {
    client: kube::Client,
    line: Option<std::sync::Arc<Line>>,
}

impl WatchPlace {
    /// The client the watch uses.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }
}

impl Drop for WatchPlace {
    fn drop(&mut self) {
        if let Some(line) = &self.line {
            line.watches
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Watches {
    /// The watches of a replica connecting as `config` says; `fallback` is its requests' client.
    pub fn new(config: kube::Config, fallback: kube::Client) -> Self {
        Self(std::sync::Arc::new(WatchesInner {
            config: Some(config),
            fallback,
            lines: std::sync::Mutex::default(),
        }))
    }

    /// Watches that all use `client`.
    pub fn shared(client: kube::Client) -> Self {
        Self(std::sync::Arc::new(WatchesInner {
            config: None,
            fallback: client,
            lines: std::sync::Mutex::default(),
        }))
    }

    /// A place for one more watch: on the first connection with room, else on a new one.
    /// Should a new one fail (its credentials could not be read again), on the least loaded
    /// connection (or, with none, the requests'), with a warning.
    pub fn place(&self) -> WatchPlace {
        let Some(config) = &self.0.config else {
            return WatchPlace {
                client: self.0.fallback.clone(),
                line: None,
            };
        };
        let line = self.take_room().or_else(|| match client(config.clone()) {
            // Made outside the lock: reading credentials may run a command.
            Ok(client) => {
                let line = std::sync::Arc::new(Line {
                    client,
                    watches: std::sync::atomic::AtomicUsize::new(1),
                });
                self.lines().push(line.clone());
                Some(line)
            }
            Err(e) => {
                let least = self.lines().iter().min_by_key(|l| l.load()).cloned();
                if let Some(line) = &least {
                    line.watches
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                tracing::warn!(
                    "another connection for watches: {e}; the watch goes on {}",
                    if least.is_some() {
                        "the least loaded connection of the watches"
                    } else {
                        "the requests' connection"
                    }
                );
                least
            }
        });
        match line {
            Some(line) => WatchPlace {
                client: line.client.clone(),
                line: Some(line),
            },
            None => WatchPlace {
                client: self.0.fallback.clone(),
                line: None,
            },
        }
    }

    /// A place on the first connection with room for a watch, taken under the lock.
    fn take_room(&self) -> Option<std::sync::Arc<Line>> {
        let lines = self.lines();
        let line = lines.iter().find(|l| l.load() < WATCHES_PER_CONNECTION)?;
        line.watches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(line.clone())
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Vec<std::sync::Arc<Line>>> {
        self.0
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many clients of their own the watches have (each one connection; some may carry no
    /// watch now).
    pub fn connections(&self) -> usize {
        self.lines().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn watches_fill_a_connection_before_opening_another_and_reuse_freed_places() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let cluster = Cluster::connect(config).unwrap();
        let mut places: Vec<WatchPlace> = (0..WATCHES_PER_CONNECTION * 2 + 1)
            .map(|_| cluster.watches.place())
            .collect();
        assert_eq!(cluster.watches.connections(), 3);
        let on = |place: &WatchPlace| {
            let line = place.line.as_ref().unwrap();
            cluster
                .watches
                .0
                .lines
                .lock()
                .unwrap()
                .iter()
                .position(|l| std::sync::Arc::ptr_eq(l, line))
                .unwrap()
        };
        assert_eq!(on(&places[0]), 0);
        assert_eq!(on(&places[WATCHES_PER_CONNECTION]), 1);
        assert_eq!(on(&places[WATCHES_PER_CONNECTION * 2]), 2);
        // A watch that ends gives its place back: the next takes it, on the first connection.
        places.swap_remove(3);
        let next = cluster.watches.place();
        assert_eq!(on(&next), 0);
        assert_eq!(cluster.watches.connections(), 3);
    }

    #[tokio::test]
    async fn a_client_given_whole_carries_every_watch() {
        let client = client(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
        let cluster = Cluster::from(client);
        let places: Vec<WatchPlace> = (0..WATCHES_PER_CONNECTION * 2)
            .map(|_| cluster.watches.place())
            .collect();
        assert!(places.iter().all(|p| p.line.is_none()));
        assert_eq!(cluster.watches.connections(), 0);
    }
}
