//! The children as the operator sees them: one watch per child kind, the index of who controls
//! what, the applies in flight, and the resources waiting on an object they may not take.
//!
//! Every object of a child kind is watched, not only those carrying our label: an object that a
//! person made by hand, or that another resource controls, must be seen before anything is
//! applied over it (see `reconcile::plan`). Only objects of ours (of this shard, with shards) are
//! kept; any other is known by a hash of its name and version ([`Elsewhere`]) and read from the
//! API server when a render names it, so a busy cluster's other objects, and other shards'
//! children, cost about 30 bytes each.
//!
//! Ownership is the controller owner reference, never the label: anyone can copy a label, while
//! only the API server's garbage collector acts on owner references, so that is what decides
//! which objects a resource may prune.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc;
use kube::discovery::ApiResource;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};

use super::{FirstList, FirstListDone, LiveChild, Shared, lock, watch_health};
use crate::gvk::split_api_version;
use crate::ownership::OWNER_LABEL;

/// A child kind's key: `group/Kind`. Versions of one kind are one set of objects, so the
/// index, the watches and the record of applies are keyed without the version.
pub(crate) fn kind_key(api_version: &str, kind: &str) -> String {
    let (group, _) = split_api_version(api_version);
    format!("{group}/{kind}")
}

/// A child: its kind key ([`kind_key`]), namespace and name.
pub(crate) type ChildId = (String, String, String);

/// The uid in `o`'s controller owner reference, if it has one.
pub(crate) fn controller_uid(o: &LiveChild) -> Option<&str> {
    o.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

/// The key of a child in `Shared::applied` and [`Applies`]: its owner's uid, kind key and name.
pub(crate) fn applied_key(owner_uid: &str, kind_key: &str, name: &str) -> String {
    format!("{owner_uid}/{kind_key}/{name}")
}

/// What a child looked like after our last apply of it: the hash of what was applied, the
/// object's uid, and its generation (its resourceVersion, for kinds without one) in the apply's
/// answer. The uid tells our object from one made again by someone else under the same name,
/// which starts again at generation 1 and could otherwise pass for what we applied. Kept
/// in memory and in the owner's `status.children`, so that an operator that restarts finds what
/// it applied and writes nothing that has not changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Applied {
    pub hash: u64,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub resource_version: Option<String>,
}

impl Applied {
    /// Whether `live` is exactly what our apply left (its echo through the watch).
    pub(crate) fn is_echo(&self, live: &LiveChild) -> bool {
        self.resource_version.is_some() && live.metadata.resource_version == self.resource_version
    }

    /// The record as `status.children[].applied` holds it.
    pub(crate) fn to_status(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "hash": format!("{:016x}", self.hash) });
        if let Some(uid) = &self.uid {
            v["uid"] = uid.clone().into();
        }
        match (self.generation, &self.resource_version) {
            (Some(g), _) => v["generation"] = g.into(),
            (None, Some(rv)) => v["resourceVersion"] = rv.clone().into(),
            (None, None) => {}
        }
        v
    }

    /// The record read back from `status.children[].applied`.
    pub(crate) fn from_status(v: &serde_json::Value) -> Option<Self> {
        let hash = u64::from_str_radix(v.get("hash")?.as_str()?, 16).ok()?;
        Some(Self {
            hash,
            uid: v
                .get("uid")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
            generation: v.get("generation").and_then(serde_json::Value::as_i64),
            resource_version: v
                .get("resourceVersion")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
        })
    }
}

/// What the watch showed of a child while it was applied.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The resourceVersions it showed: the apply's own echo among them is no news, anything else
    /// is.
    pub versions: Vec<String>,
    /// Whether it showed the child deleted: then nothing is in place, whatever the apply said.
    pub deleted: bool,
}

/// The children being applied right now (keys from [`applied_key`]), each with what the watch
/// showed of it meanwhile, and how many batches of applies each namespace has in flight: the
/// reports of a namespace give way while it has some.
#[derive(Default)]
pub(crate) struct Applies {
    children: Mutex<BTreeMap<String, Seen>>,
    namespaces: Mutex<HashMap<String, usize>>,
    /// Woken when a namespace's last applies in flight end.
    pub quiet: tokio::sync::Notify,
}

/// Applies begun together in one namespace; see [`Applies::begin`].
pub(crate) struct Batch<'a> {
    applies: &'a Applies,
    /// Counted among the namespace's applies in flight until ended (`None`: ended, or never
    /// counted, having nothing to apply).
    namespace: Option<String>,
    keys: Vec<String>,
}

impl Applies {
    /// Marks `keys`, children in `namespace`, as being applied until the batch is finished or
    /// dropped.
    pub(crate) fn begin(&self, namespace: &str, keys: Vec<String>) -> Batch<'_> {
        if keys.is_empty() {
            return Batch {
                applies: self,
                namespace: None,
                keys,
            };
        }
        let mut children = lock(&self.children);
        for key in &keys {
            children.insert(key.clone(), Seen::default());
        }
        drop(children);
        *lock(&self.namespaces)
            .entry(namespace.to_owned())
            .or_default() += 1;
        Batch {
            applies: self,
            namespace: Some(namespace.to_owned()),
            keys,
        }
    }

    /// The namespaces with applies in flight now.
    pub(crate) fn busy_namespaces(&self) -> HashSet<String> {
        lock(&self.namespaces).keys().cloned().collect()
    }

    /// Records that the watch showed `key` at `resource_version`; false when `key` is not
    /// being applied.
    pub(crate) fn saw(&self, key: &str, resource_version: Option<&str>) -> bool {
        let mut children = lock(&self.children);
        let Some(seen) = children.get_mut(key) else {
            return false;
        };
        seen.versions.extend(resource_version.map(str::to_owned));
        true
    }

    /// Records that the watch showed `key` deleted, if it is being applied.
    pub(crate) fn saw_deleted(&self, key: &str) {
        if let Some(seen) = lock(&self.children).get_mut(key) {
            seen.deleted = true;
        }
    }

    fn end(&self, namespace: &str, keys: &[String]) -> BTreeMap<String, Seen> {
        let mut children = lock(&self.children);
        let ended = keys
            .iter()
            .filter_map(|k| children.remove_entry(k))
            .collect();
        drop(children);
        let mut namespaces = lock(&self.namespaces);
        if let Some(n) = namespaces.get_mut(namespace) {
            *n -= 1;
            if *n == 0 {
                namespaces.remove(namespace);
                self.quiet.notify_waiters();
            }
        }
        ended
    }
}

impl Batch<'_> {
    /// Ends the batch: what the watch showed of each child while it was applied.
    pub(crate) fn finish(mut self) -> BTreeMap<String, Seen> {
        match self.namespace.take() {
            Some(namespace) => self.applies.end(&namespace, &self.keys),
            None => BTreeMap::new(),
        }
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if let Some(namespace) = self.namespace.take() {
            self.applies.end(&namespace, &self.keys);
        }
    }
}

/// The children the watches show, by the uid of their controller owner reference, so that a
/// reconciliation finds its own without scanning every child.
#[derive(Debug, Default)]
pub(crate) struct OwnerIndex {
    /// Each owner's children, sorted: a resource has a few, and a `BTreeSet` of them took a
    /// whole B-tree node (about 800 bytes) per resource, 4 MiB at 5,000 resources. A child's
    /// id is one allocation that both maps share, as is an owner's uid: each map holding its
    /// own copies of the four strings was about 300 bytes more per child.
    by_owner: BTreeMap<Arc<str>, Vec<Arc<ChildId>>>,
    owner_of: BTreeMap<Arc<ChildId>, Arc<str>>,
}

impl OwnerIndex {
    /// Records that `child` is controlled by the object with uid `owner` (or by nothing).
    pub(crate) fn set(&mut self, child: ChildId, owner: Option<&str>) {
        if self.owner_of.get(&child).map(|o| &**o) == owner {
            // Most changes of a child (its status) leave its controller as it was.
            return;
        }
        self.remove(&child);
        if let Some(owner) = owner {
            let owner = self
                .by_owner
                .get_key_value(owner)
                .map_or_else(|| Arc::from(owner), |(k, _)| k.clone());
            let child = Arc::new(child);
            let children = self
                .by_owner
                .entry(owner.clone())
                .or_insert_with(|| Vec::with_capacity(1));
            if let Err(at) = children.binary_search(&child) {
                children.insert(at, child.clone());
            }
            self.owner_of.insert(child, owner);
        }
    }

    pub(crate) fn remove(&mut self, child: &ChildId) {
        if let Some(owner) = self.owner_of.remove(child)
            && let Some(children) = self.by_owner.get_mut(&*owner)
        {
            if let Ok(at) = children.binary_search_by(|c| (**c).cmp(child)) {
                children.remove(at);
            }
            if children.is_empty() {
                self.by_owner.remove(&*owner);
            }
        }
    }

    /// Forgets every child of one kind in `namespace` (`None`: in every namespace), before a
    /// relist of its watch.
    pub(crate) fn clear_kind(&mut self, kind_key: &str, namespace: Option<&str>) {
        let gone: Vec<Arc<ChildId>> = self
            .owner_of
            .keys()
            .filter(|c| c.0 == kind_key && namespace.is_none_or(|n| n == c.1))
            .cloned()
            .collect();
        for child in &gone {
            self.remove(child);
        }
    }

    /// The children whose controller is `owner`.
    pub(crate) fn owned_by(&self, owner: &str) -> Vec<ChildId> {
        self.by_owner
            .get(owner)
            .map(|children| children.iter().map(|c| (**c).clone()).collect())
            .unwrap_or_default()
    }
}

/// A resource to reconcile: the `apiVersion/Kind` of its controller, its namespace and name.
pub(crate) type OwnerId = (String, String, String);

/// The resources that wanted an object they may not take (another controls it, or nobody), by
/// that object: when it changes or goes away, they are reconciled again at once.
#[derive(Debug, Default)]
pub(crate) struct Waiting(BTreeMap<ChildId, BTreeSet<OwnerId>>);

impl Waiting {
    /// Records that `owner` waits on `child`.
    pub(crate) fn wait(&mut self, child: ChildId, owner: OwnerId) {
        self.0.entry(child).or_default().insert(owner);
    }

    /// The objects of kind `kind_key` in `scope` (a namespace, or all) that resources wait on.
    pub(crate) fn on(&self, kind_key: &str, scope: Option<&str>) -> Vec<ChildId> {
        self.0
            .keys()
            .filter(|(kind, ns, _)| kind == kind_key && scope.is_none_or(|s| s == ns))
            .cloned()
            .collect()
    }

    /// The resources waiting on `child`, who stop waiting (a reconciliation that still finds
    /// it in the way waits again).
    pub(crate) fn take(&mut self, child: &ChildId) -> BTreeSet<OwnerId> {
        self.0.remove(child).unwrap_or_default()
    }
}

/// A controller's trigger: send a resource to reconcile it.
pub(crate) type Trigger = mpsc::UnboundedSender<ObjectRef<super::Served>>;

/// Each served Kind's controllers by `apiVersion/Kind`: its discovered resource, and the
/// trigger of each controller with the namespace it watches (`None`: all of them).
pub(crate) type Owners =
    Arc<Mutex<BTreeMap<String, (Arc<ApiResource>, Vec<(Option<String>, Trigger)>)>>>;

/// A watch of a child kind to start.
pub(crate) struct Writer {
    /// Its kind key ([`kind_key`]).
    pub kind: String,
    /// The resource (one of the kind's versions).
    pub ar: Arc<ApiResource>,
    /// The namespace watched, or `None` for all of them.
    pub namespace: Option<String>,
    /// The store to fill.
    pub writer: reflector::store::Writer<LiveChild>,
    /// Where the objects the store does not keep go.
    pub elsewhere: Arc<Mutex<Elsewhere>>,
    /// What says when it has listed.
    pub first_list: FirstList,
}

/// Whether a watch keeps `o` in its store: an object of ours (it carries our ownership label),
/// and with shards one of `shard`'s (its shard label names it). Any other object is known by
/// name only ([`Elsewhere`]).
fn kept(shard: Option<super::shard::Shard>, o: &LiveChild) -> bool {
    o.labels.get(OWNER_LABEL).is_some()
        && shard.is_none_or(|s| s.holds_child(o.labels.get(super::shard::SHARD_LABEL)))
}

/// The objects of a child kind, in one watch's scope, that its store does not keep (see
/// [`kept`]): objects that are not ours, and with shards the children of other shards. Each
/// is a keyed hash of its namespace and name and one of its resourceVersion (about 30 bytes in
/// the table, instead of an object): at 20,000 children over four shards, each replica keeps
/// 5,000 objects and 15,000 of these. They are what makes a create safe without keeping them
/// whole: a name found here is read from the API server before anything is applied to it
/// (`reconcile::read_name_only`), and so is a recorded child of a resource that moved here from
/// another shard. An object moving between the two enters one before it leaves the other (see
/// [`file`]); a reconciliation looks in the store, then here, so a move between its two looks
/// could hide it from that pair, which is why `read_name_only` and the plan each look again.
/// The hash is keyed per process, so names cannot be chosen to
/// collide; an accidental collision of two names (among billions) would make one look absent
/// when the other is deleted.
#[derive(Default)]
pub(crate) struct Elsewhere {
    key: std::hash::RandomState,
    /// The hash of each object's namespace and name, and of its resourceVersion.
    seen: HashMap<u64, u64>,
    /// A relist's objects until it is done, as kube's store buffers its own.
    listing: HashMap<u64, u64>,
}

impl Elsewhere {
    fn id(&self, namespace: &str, name: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.key, (namespace, name))
    }

    /// The hash of a resourceVersion, as [`Self::version`] gives it.
    pub(crate) fn version_of(&self, resource_version: Option<&str>) -> u64 {
        std::hash::BuildHasher::hash_one(&self.key, resource_version)
    }

    /// Whether an object `name` in `namespace` is here, and its version's hash.
    pub(crate) fn version(&self, namespace: &str, name: &str) -> Option<u64> {
        self.seen.get(&self.id(namespace, name)).copied()
    }

    fn entry(&self, o: &LiveChild) -> (u64, u64) {
        let meta = &o.metadata;
        (
            self.id(
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
            ),
            self.version_of(meta.resource_version.as_deref()),
        )
    }
}

/// Files one watch event in the store and in `elsewhere`: an object [`kept`] in the store,
/// any other in `elsewhere` (and out of the store: a child of a resource that moved to another
/// shard stops being kept here). An object moving from one to the other enters the second
/// before it leaves the first, so that it is in neither at no moment.
fn file(
    writer: &mut reflector::store::Writer<LiveChild>,
    elsewhere: &Mutex<Elsewhere>,
    shard: Option<super::shard::Shard>,
    event: &watcher::Event<LiveChild>,
) {
    use watcher::Event;
    match event {
        Event::Apply(o) if !kept(shard, o) => {
            let was_known = {
                let mut e = lock(elsewhere);
                let (id, version) = e.entry(o);
                e.seen.insert(id, version).is_some()
            };
            // Known here already, it is not in the store (each event leaves an object in one
            // of the two): the next version of another shard's child, the common case.
            if !was_known {
                // The store's key is the kind, namespace and name alone.
                let mut key = LiveChild::default();
                key.metadata.name.clone_from(&o.metadata.name);
                key.metadata.namespace.clone_from(&o.metadata.namespace);
                writer.apply_watcher_event(&Event::Delete(key));
            }
        }
        Event::InitApply(o) if !kept(shard, o) => {
            let mut e = lock(elsewhere);
            let (id, version) = e.entry(o);
            e.listing.insert(id, version);
        }
        Event::InitDone => {
            // The relist's objects are known before the store's are swapped in, and what the
            // relist did not show is forgotten after.
            {
                let Elsewhere { seen, listing, .. } = &mut *lock(elsewhere);
                seen.extend(listing.iter().map(|(id, version)| (*id, *version)));
            }
            writer.apply_watcher_event(event);
            let mut e = lock(elsewhere);
            e.seen = std::mem::take(&mut e.listing);
        }
        _ => {
            writer.apply_watcher_event(event);
            let mut e = lock(elsewhere);
            match event {
                Event::Apply(o) | Event::Delete(o) => {
                    let (id, _) = e.entry(o);
                    e.seen.remove(&id);
                }
                Event::Init => e.listing = HashMap::new(),
                Event::InitApply(_) | Event::InitDone => {}
            }
        }
    }
}

/// Watches every object of every served child kind, keeps the caches and the owner index that
/// reconciliation reads, and wakes the controller of a child's owner (and any resource waiting
/// on it) when the child changes.
pub(crate) fn watch_children(
    shared: &Arc<Shared>,
    writers: Vec<Writer>,
) -> Vec<(String, FirstListDone)> {
    let mut listed = Vec::new();
    for Writer {
        kind: kind_key,
        ar: child_ar,
        namespace: scope,
        mut writer,
        elsewhere,
        first_list,
    } in writers
    {
        let place = shared.watches.place();
        let (api, watch) =
            super::scoped::<LiveChild>(&place.client(), scope.as_deref(), &child_ar, &kind_key);
        let config = super::watch_config();
        listed.push((watch.clone(), first_list.subscribe()));
        let health = (shared.metrics.clone(), watch);
        let shard = shared.shard;
        // kube's `reflector`, but what the store does not keep goes to `elsewhere`.
        let stream = watcher(api, config)
            .inspect(move |event| {
                if let Ok(event) = event {
                    file(&mut writer, &elsewhere, shard, event);
                }
            })
            .inspect(first_list.observer())
            .inspect(move |event| watch_health(&health.0, &health.1, event))
            .default_backoff()
            // Until the pipeline stops: a shard lost or given back takes its watches with it
            // (they held its `Shared`, and their places on the connections, for ever).
            .take_until({
                let mut stopping = shared.stopping.subscribe();
                async move {
                    let _ = stopping.wait_for(|s| *s).await;
                }
            });
        let owners = shared.owners.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            // The watch's place on its connection, held while the watch is.
            let _place = place;
            let id = |o: &LiveChild| -> ChildId {
                (
                    kind_key.clone(),
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.metadata.name.clone().unwrap_or_default(),
                )
            };
            futures::pin_mut!(stream);
            // Until the watch's first list is done: the owners' own first list queues each of
            // them (a settled one after the changed ones, see `settling`), so a child listed
            // then wakes nobody; a later list (a relist) shows what changed while the watch was
            // down, and wakes its owner.
            let mut listed_once = false;
            while let Some(event) = stream.next().await {
                let first_list = !listed_once && matches!(&event, Ok(watcher::Event::InitApply(_)));
                let o = match event {
                    // A relist (after the API server went away, say) shows what changed meanwhile
                    // as InitApply: it wakes the owner as a change would.
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        let child = id(&o);
                        let controller = controller_uid(&o);
                        // The owner index lists what the store keeps: what prune may delete.
                        let kept = kept(shard, &o);
                        lock(&shared.owned).set(child.clone(), controller.filter(|_| kept));
                        wake(&owners, lock(&shared.waiting).take(&child));
                        if let Some(owner) = controller {
                            let key = applied_key(owner, &kind_key, &child.2);
                            // While we apply it, the reconciliation applying it decides (see
                            // `reconcile::apply`); the watch may show the result before the
                            // apply returns.
                            if shared
                                .applies
                                .saw(&key, o.metadata.resource_version.as_deref())
                            {
                                continue;
                            }
                            // Our own apply coming back through the watch: nothing to do.
                            let echo = lock(&shared.applied)
                                .get(&key)
                                .is_some_and(|r| r.is_echo(&o));
                            if echo {
                                continue;
                            }
                        }
                        o
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        let child = id(&o);
                        lock(&shared.owned).remove(&child);
                        wake(&owners, lock(&shared.waiting).take(&child));
                        // Gone: the next reconciliation of its owner must apply it again. An
                        // apply in flight must not record it as in place when it returns.
                        for owner in o.metadata.owner_references.iter().flatten() {
                            let key = applied_key(&owner.uid, &kind_key, &child.2);
                            shared.applies.saw_deleted(&key);
                            lock(&shared.applied).remove(&key);
                        }
                        o
                    }
                    Ok(watcher::Event::Init) => {
                        // A relist: deletions while the watch was down are not seen as such,
                        // so forget every apply of this kind (in every namespace: the records
                        // are not kept by namespace, and one more apply is harmless) and what
                        // this watch said of who controls what.
                        let infix = format!("/{kind_key}/");
                        lock(&shared.applied).retain(|k, _| !k.contains(&infix));
                        lock(&shared.owned).clear_kind(&kind_key, scope.as_deref());
                        continue;
                    }
                    Ok(watcher::Event::InitDone) => {
                        listed_once = true;
                        // A relist does not show what was deleted while the watch was down:
                        // the resources waiting on such an object are woken now.
                        let waited = lock(&shared.waiting).on(&kind_key, scope.as_deref());
                        let gone: Vec<ChildId> = {
                            let watched = super::read(&shared.watched);
                            let exists = |(_, ns, name): &ChildId| {
                                watched.get(&kind_key).is_none_or(|w| {
                                    w.get(ns, name).is_some() || w.name_only(ns, name).is_some()
                                })
                            };
                            waited.into_iter().filter(|c| !exists(c)).collect()
                        };
                        for child in gone {
                            wake(&owners, lock(&shared.waiting).take(&child));
                        }
                        continue;
                    }
                    // Counted and logged by `watch_health`.
                    Err(_) => continue,
                };
                if first_list {
                    continue;
                }
                let owner_refs = o.metadata.owner_references.iter().flatten();
                let namespace = o.metadata.namespace.clone().unwrap_or_default();
                // With shards, a resource is served only by the shard its hash names (one that
                // names another is moved there before anything is applied): a child of
                // another shard's resource wakes nobody here.
                let served_here =
                    |owner: &str| shard.is_none_or(|s| s.sharding.of(&namespace, owner) == s.index);
                let controllers = owner_refs
                    .filter(|r| r.controller == Some(true) && served_here(&r.name))
                    .map(|r| {
                        (
                            format!("{}/{}", r.api_version, r.kind),
                            namespace.clone(),
                            r.name.clone(),
                        )
                    })
                    .collect();
                wake(&owners, controllers);
            }
        });
    }
    listed
}

/// Asks the controller of each of `resources` (those of a Kind we serve) to reconcile it.
pub(crate) fn wake(owners: &Owners, resources: BTreeSet<OwnerId>) {
    if resources.is_empty() {
        return;
    }
    let map = lock(owners);
    for (kind, namespace, name) in resources {
        let Some((ar, controllers)) = map.get(&kind) else {
            continue;
        };
        // The controller watching the resource's namespace (a resource's children are in its
        // own namespace).
        let watching = controllers
            .iter()
            .find(|(scope, _)| scope.as_deref().is_none_or(|ns| ns == namespace));
        if let Some((_, tx)) = watching {
            let _ = tx.unbounded_send(super::Served::reference(ar, &namespace, &name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(kind: &str, name: &str) -> ChildId {
        (format!("apps/{kind}"), "ns".into(), name.into())
    }

    #[test]
    fn the_owner_index_follows_controllers_deletions_and_relists() {
        let mut index = OwnerIndex::default();
        // Kept sorted and once each, in whatever order the watches show them.
        index.set(child("Service", "web"), Some("uid-1"));
        index.set(child("Deployment", "web"), Some("uid-1"));
        index.set(child("Service", "web"), Some("uid-1"));
        index.set(child("Deployment", "db"), Some("uid-2"));
        index.set(child("Deployment", "stray"), None);
        assert_eq!(
            index.owned_by("uid-1"),
            vec![child("Deployment", "web"), child("Service", "web")]
        );
        // A controller reference moved to another owner moves the child.
        index.set(child("Deployment", "web"), Some("uid-2"));
        assert_eq!(index.owned_by("uid-1"), vec![child("Service", "web")]);
        index.remove(&child("Service", "web"));
        assert!(index.owned_by("uid-1").is_empty());
        // A relist of one kind forgets that kind only.
        index.set(child("Service", "db"), Some("uid-2"));
        index.clear_kind("apps/Deployment", None);
        assert_eq!(index.owned_by("uid-2"), vec![child("Service", "db")]);
        // A relist of one namespace's watch forgets that namespace only.
        let elsewhere = (
            "apps/Service".to_owned(),
            "other".to_owned(),
            "db".to_owned(),
        );
        index.set(elsewhere.clone(), Some("uid-3"));
        index.clear_kind("apps/Service", Some("ns"));
        assert!(index.owned_by("uid-2").is_empty());
        assert_eq!(index.owned_by("uid-3"), vec![elsewhere]);
    }

    #[test]
    fn versions_of_one_kind_share_a_key() {
        assert_eq!(
            kind_key("autoscaling/v1", "HorizontalPodAutoscaler"),
            kind_key("autoscaling/v2", "HorizontalPodAutoscaler")
        );
        assert_eq!(kind_key("v1", "Service"), "/Service");
        assert_ne!(kind_key("v1", "Service"), kind_key("apps/v1", "Service"));
    }

    #[test]
    fn only_the_controller_reference_makes_an_owner() {
        let live = |refs: serde_json::Value| -> LiveChild {
            serde_json::from_value(serde_json::json!({ "metadata": { "ownerReferences": refs } }))
                .unwrap()
        };
        let r = |uid: &str, controller: bool| serde_json::json!({ "apiVersion": "v1", "kind": "X", "name": "x", "uid": uid, "controller": controller });
        assert_eq!(controller_uid(&live(serde_json::json!([]))), None);
        assert_eq!(
            controller_uid(&live(serde_json::json!([r("a", false)]))),
            None
        );
        assert_eq!(
            controller_uid(&live(serde_json::json!([r("a", false), r("b", true)]))),
            Some("b")
        );
    }

    #[test]
    fn the_store_keeps_this_shards_children_and_knows_the_rest_by_name() {
        use super::super::shard::{SHARD_LABEL, Shard, ShardBy, Sharding};
        let ar = Arc::new(ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()));
        let mut writer = reflector::store::Writer::<LiveChild>::new(ar.clone());
        let store = writer.as_reader();
        let elsewhere = Mutex::new(Elsewhere::default());
        let shard = Some(Shard {
            sharding: Sharding {
                count: 2,
                by: ShardBy::Name,
            },
            index: 1,
        });
        let object = |name: &str, rv: &str, labels: serde_json::Value| -> LiveChild {
            serde_json::from_value(serde_json::json!({ "metadata": {
                "name": name, "namespace": "ns", "resourceVersion": rv, "labels": labels } }))
            .unwrap()
        };
        let in_store = |name: &str| {
            store
                .get(&ObjectRef::new_with(name, ar.clone()).within("ns"))
                .is_some()
        };
        let known = |name: &str| lock(&elsewhere).version("ns", name);
        let mine = serde_json::json!({ OWNER_LABEL: "u", SHARD_LABEL: "1" });
        let theirs = serde_json::json!({ OWNER_LABEL: "u", SHARD_LABEL: "0" });
        let mut file = |event| file(&mut writer, &elsewhere, shard, &event);
        use watcher::Event;
        file(Event::Init);
        file(Event::InitApply(object("mine", "1", mine.clone())));
        file(Event::InitApply(object("theirs", "2", theirs.clone())));
        file(Event::InitApply(object("hand", "3", serde_json::json!({}))));
        // Nothing is known before the list is done, as in kube's store.
        assert!(known("hand").is_none());
        file(Event::InitDone);
        assert!(in_store("mine") && !in_store("theirs") && !in_store("hand"));
        assert!(known("mine").is_none());
        let version = |rv| lock(&elsewhere).version_of(Some(rv));
        assert_eq!(known("theirs"), Some(version("2")));
        assert_eq!(known("hand"), Some(version("3")));
        // A new version of an object known by name is known as that version.
        file(Event::Apply(object("hand", "4", serde_json::json!({}))));
        assert_eq!(known("hand"), Some(version("4")));
        // A child that moves to another shard leaves the store; one that comes here, enters it.
        file(Event::Apply(object("mine", "5", theirs.clone())));
        file(Event::Apply(object("theirs", "6", mine.clone())));
        assert!(!in_store("mine") && known("mine") == Some(version("5")));
        assert!(in_store("theirs") && known("theirs").is_none());
        // A deleted object is forgotten, wherever it was.
        file(Event::Delete(object("hand", "7", serde_json::json!({}))));
        file(Event::Delete(object("theirs", "8", mine)));
        assert!(known("hand").is_none() && !in_store("theirs"));
        // A relist forgets what it does not list again.
        file(Event::Init);
        file(Event::InitDone);
        assert!(known("mine").is_none() && store.is_empty());
        // Without shards, every object of ours is kept.
        assert!(kept(None, &object("x", "1", theirs)));
        assert!(!kept(None, &object("x", "1", serde_json::json!({}))));
    }

    #[test]
    fn an_apply_record_survives_the_round_trip_through_status() {
        for record in [
            Applied {
                hash: u64::MAX,
                uid: Some("u-1".into()),
                generation: Some(3),
                resource_version: Some("9".into()),
            },
            Applied {
                hash: 7,
                uid: None,
                generation: None,
                resource_version: Some("9".into()),
            },
        ] {
            let back = Applied::from_status(&record.to_status()).unwrap();
            assert_eq!(back.hash, record.hash);
            assert_eq!(back.generation, record.generation);
            if record.generation.is_none() {
                assert_eq!(back.resource_version, record.resource_version);
            }
        }
        assert_eq!(
            Applied::from_status(&serde_json::json!({ "hash": "zz" })),
            None
        );
    }

    #[test]
    fn waiting_resources_are_woken_once() {
        let mut waiting = Waiting::default();
        let owner = (
            "hanzo.ai/v1/Service".to_owned(),
            "ns".to_owned(),
            "web".to_owned(),
        );
        waiting.wait(child("Service", "web"), owner.clone());
        waiting.wait(child("Service", "web"), owner.clone());
        // What a relist looks for, by kind and scope.
        assert_eq!(
            waiting.on("apps/Service", None),
            vec![child("Service", "web")]
        );
        assert_eq!(
            waiting.on("apps/Service", Some("ns")),
            vec![child("Service", "web")]
        );
        assert!(waiting.on("apps/Service", Some("other")).is_empty());
        assert!(waiting.on("apps/Deployment", None).is_empty());
        assert_eq!(
            waiting.take(&child("Service", "web")),
            BTreeSet::from([owner])
        );
        assert!(waiting.take(&child("Service", "web")).is_empty());
    }
}
