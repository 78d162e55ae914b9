//! The watches: of the served Kinds and of every child kind, each a reflector whose first list
//! is awaited before anything is applied over it, and whose health is reported.

use super::*;

/// A child kind (`group/Kind`) that the cluster serves: the version watched, and its objects.
pub(crate) struct Watched {
    pub ar: Arc<ApiResource>,
    /// One watch per scope ([`Settings::scopes`]): all namespaces, or each watched namespace.
    pub parts: Vec<WatchedPart>,
}

/// The watch of one child kind in one scope.
pub(crate) struct WatchedPart {
    /// The namespace watched, or `None` for all of them.
    pub namespace: Option<String>,
    /// Turns true once the watch has listed: until then, the store cannot say that an object
    /// does not exist.
    pub listed: FirstListDone,
    /// The objects of this kind in the scope that are ours (of this shard, with shards), as
    /// much of each as reconciliation reads (see `children`).
    pub store: Store<LiveChild>,
    /// Every other object of this kind in the scope, by name only.
    pub elsewhere: Arc<Mutex<children::Elsewhere>>,
}

impl Watched {
    /// The watches of the child kind `kind` on `ar`, one per scope: what fills them, and what
    /// reads them.
    pub(super) fn new(
        kind: &str,
        ar: &ApiResource,
        scopes: &[Option<String>],
    ) -> (Vec<children::Writer>, Self) {
        let ar = Arc::new(ar.clone());
        let mut writers = Vec::new();
        let mut parts = Vec::new();
        for scope in scopes {
            let writer = reflector::store::Writer::<LiveChild>::new(ar.clone());
            let store = writer.as_reader();
            let (first_list, listed) = FirstList::new();
            let elsewhere = Arc::new(Mutex::new(children::Elsewhere::default()));
            parts.push(WatchedPart {
                namespace: scope.clone(),
                listed,
                store,
                elsewhere: elsewhere.clone(),
            });
            writers.push(children::Writer {
                kind: kind.to_owned(),
                ar: ar.clone(),
                namespace: scope.clone(),
                writer,
                elsewhere,
                first_list,
            });
        }
        (writers, Self { ar, parts })
    }

    /// The watch that sees `namespace`.
    pub(super) fn part(&self, namespace: &str) -> Option<&WatchedPart> {
        self.parts
            .iter()
            .find(|p| p.namespace.as_deref().is_none_or(|ns| ns == namespace))
    }

    /// The object `name` in `namespace`, as its watch shows it.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<Arc<LiveChild>> {
        self.part(namespace)?
            .store
            .get(&reflector::ObjectRef::new_with(name, self.ar.clone()).within(namespace))
    }

    /// The version (a hash) of the object `name` in `namespace` that the watch knows by name
    /// only (not ours, or another shard's): see [`children::Elsewhere`].
    pub(crate) fn name_only(&self, namespace: &str, name: &str) -> Option<u64> {
        lock(&self.part(namespace)?.elsewhere).version(namespace, name)
    }

    /// Whether the watch that sees `namespace` has listed.
    pub(crate) fn listed(&self, namespace: &str) -> bool {
        self.part(namespace).is_some_and(|p| *p.listed.borrow())
    }
}

/// The API of `ar` in `scope` (a namespace, or all of them), and the name of a watch of it for
/// logs and health: `name`, with the namespace when there is one.
pub(crate) fn scoped<K>(
    client: &kube::Client,
    scope: Option<&str>,
    ar: &K::DynamicType,
    name: &str,
) -> (Api<K>, String)
where
    K: kube::Resource<Scope = kube::core::DynamicResourceScope>,
{
    match scope {
        Some(ns) => (
            Api::namespaced_with(client.clone(), ns, ar),
            format!("{name} in {ns}"),
        ),
        None => (Api::all_with(client.clone(), ar), name.to_owned()),
    }
}

/// Says when a watch's first list has reached its store. (`Store::wait_until_ready` wakes only
/// the last of several waiters, and the controller already waits on its own store.)
pub(crate) struct FirstList(tokio::sync::watch::Sender<bool>);

/// Turns true once the watch's first list is in its store.
pub(crate) type FirstListDone = tokio::sync::watch::Receiver<bool>;

impl FirstList {
    pub(crate) fn new() -> (Self, FirstListDone) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (Self(tx), rx)
    }

    /// Says the first list is done (for a watch read without a reflector's `inspect`).
    pub(crate) fn done(self) {
        self.0.send_replace(true);
    }

    /// Another receiver of the same signal.
    pub(crate) fn subscribe(&self) -> FirstListDone {
        self.0.subscribe()
    }

    /// For `inspect` after the reflector, which has applied each event to the store by then.
    pub(crate) fn observer<K>(self) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) {
        move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                self.0.send_replace(true);
            }
        }
    }
}

/// Counts and logs a watch's errors (the watch retries them with backoff), and notes when it
/// works again, for `/readyz`.
pub(crate) fn watch_health<K>(
    metrics: &Metrics,
    watch: &str,
    event: &Result<watcher::Event<K>, watcher::Error>,
) {
    match event {
        // `Init` comes before a list is tried: it says nothing of whether the list works.
        Ok(watcher::Event::Init) => {}
        Ok(_) => metrics.watch_ok(watch),
        Err(e) => {
            metrics.watch_error(watch);
            tracing::warn!(%watch, "watch failed (retrying with backoff): {e}");
        }
    }
}

/// How long reconciliation waits for every watch's first list before it starts anyway.
pub(super) const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// How every watch lists: at the most recent version (no `resourceVersion`), in pages of 500
/// (kube's default page size, kept here on purpose).
///
/// Not at `resourceVersion=0` ("any version"): the API server ignores `limit` for those and
/// answers with every object in one response, which a watch holds whole while it takes the
/// objects one by one: at 10,000 resources, tens of MiB for a moment at each start and relist.
/// A list at the most recent version honours `limit`. Since Kubernetes 1.31
/// (`ConsistentListFromCache`, with an etcd that answers progress requests) the API server
/// serves its first page from the watch cache, and since 1.34 (`ListFromCacheSnapshot`) the
/// next pages too; older servers read the pages from etcd.
pub(crate) fn watch_config() -> watcher::Config {
    watcher::Config::default().page_size(500)
}
