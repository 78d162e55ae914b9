//! Plugins as cluster resources, loaded live: a `Plugin` (`wasm-operator.dev/v1alpha1`,
//! cluster-scoped) names a component in an OCI registry by digest, with optional sandbox limits.
//! For each, without a restart, the operator pulls it (checked against its digest), compiles it
//! (the compile cache), runs the checks of `host check`, makes sure its ServiceAccount may do
//! what the plugin needs, installs or updates the CRDs of its Kinds (server-side apply, only
//! CRDs that are the Plugin's own), then serves its Kinds.
//!
//! A new digest swaps the plugin: renders in flight finish on the version they started with
//! (each holds the registry it began with), then every resource of its Kinds is reconciled with
//! the new one. A version that fails to pull, verify, check or load leaves the last good one
//! serving, and the Plugin's status says why. A Plugin deleted stops its controllers; its CRDs
//! and every resource of its Kinds stay.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::{
    Controllers, FirstList, FirstListDone, Settings, Shared, Unserved, discover, gvk_key, lock,
    watch_config, watch_health, write,
};
use crate::api::{CRD_OWNER, api_resource};
use crate::oci::{self, Reference};
use crate::ownership::FIELD_MANAGER;
use crate::plugin::{Limits, Plugin, Runtime};
use crate::registry::Registry;
use crate::types::Context;

mod access;
mod book;
mod install;
mod prepare;
mod standby;
mod status;

use book::{Ask, Book};
use prepare::*;
pub(crate) use standby::Standby;

/// What loading plugins live needs besides the operator's settings.
#[derive(Debug, Clone)]
pub struct Live {
    /// The engine, linker and compile cache plugins are loaded with (and the most any Plugin's
    /// limits may ask for).
    pub runtime: Runtime,
    /// How registries are reached.
    pub registries: oci::Options,
    /// Where pulled plugins are kept by digest.
    pub store: Option<oci::Store>,
    /// Which signatures a Plugin's image must carry (`--plugin-signatures`); none: any.
    pub signatures: Option<Arc<crate::signature::Policy>>,
}

/// How many signatures a Plugin's status names (the CRD's bound on `signature.signedBy`).
const SIGNED_BY_SHOWN: usize = 16;

/// A plugin loaded from a `Plugin` resource.
struct Loaded {
    /// The reference served, pinned.
    reference: Reference,
    /// The limits it was loaded with.
    limits: Limits,
    plugin: Plugin,
    /// What the signature policy said of it.
    signature: Option<crate::signature::Verdict>,
    /// `apiVersion/Kind` of each Kind it serves (controllers' keys).
    kinds: Vec<String>,
}

impl Loaded {
    /// What the Plugin's status says of what is served.
    fn status(&self) -> Value {
        let mut status = json!({
            "image": format!("{}{}", oci::SCHEME, self.reference),
            "digest": self.reference.digest,
            "sha256": format!("sha256:{}", self.plugin.sha256()),
            "plugin": format!("{} {}", self.plugin.name(), self.plugin.info().version),
            "kinds": self.plugin.info().kinds.iter().map(|k| format!("{}.{}", k.kind, k.group)).collect::<Vec<_>>(),
        });
        if let Some(verdict) = &self.signature {
            // Bounded as the CRD bounds them, else the API server refuses the whole status.
            let bounded = crate::operator::status::bounded_to;
            let mut signed_by: Vec<String> = verdict
                .signatures
                .iter()
                .map(|s| bounded(&format!("{} ({})", s.signer, s.format), 1024))
                .collect();
            if signed_by.len() > SIGNED_BY_SHOWN {
                let more = signed_by.len() - (SIGNED_BY_SHOWN - 1);
                signed_by.truncate(SIGNED_BY_SHOWN - 1);
                signed_by.push(format!("and {more} more"));
            }
            let signature = crate::api::PluginSignature {
                rule: bounded(&verdict.rule, 1024),
                signed_by,
                unverified: verdict.unverified.as_deref().map(|u| bounded(u, 4096)),
            };
            status["signature"] = serde_json::to_value(signature).unwrap_or_default();
        }
        status
    }
}

/// Why a Plugin is not served as asked.
#[derive(Debug)]
struct Refusal {
    /// Short CamelCase.
    reason: &'static str,
    message: String,
    /// Whether trying again may help (a registry down): retried with backoff.
    transient: bool,
}

impl Refusal {
    fn stalled(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            transient: false,
        }
    }

    fn transient(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            transient: true,
        }
    }
}

/// A plugin pulled, checked and loaded, not yet served.
#[derive(Clone)]
pub(crate) struct Prepared {
    /// The reference pulled, pinned.
    reference: Reference,
    limits: Limits,
    plugin: Plugin,
    /// What the signature policy said of it.
    signature: Option<crate::signature::Verdict>,
}

/// What preparing the plugin of a Plugin came to: its name, the ticket of that preparation,
/// and the result.
type Outcome = (String, u64, Box<Result<Prepared, Refusal>>);

/// The state of live loading: the plugins given at start, and those loaded since.
struct Loader {
    shared: Arc<Shared>,
    settings: Settings,
    controllers: Arc<Controllers>,
    live: Live,
    /// The registry at start (built-in plugins and `--plugin`), which every registry served
    /// since extends.
    base: Arc<Registry>,
    loaded: BTreeMap<String, Loaded>,
    /// What this replica made ready while it stood by, taken as each Plugin is first synced.
    prefetched: BTreeMap<String, Prepared>,
    /// What was acted on, what is being prepared, failures and retries.
    book: Book<tokio::task::JoinHandle<()>>,
    /// Where what was prepared comes back.
    done: mpsc::UnboundedSender<Outcome>,
    retry: mpsc::UnboundedSender<String>,
}

/// Watches `Plugin` resources and serves what they name. Returns the task, and what says when
/// the watch has first listed.
pub(crate) fn serve(
    shared: Arc<Shared>,
    settings: Settings,
    controllers: Arc<Controllers>,
    live: Live,
    prefetched: BTreeMap<String, Prepared>,
) -> (tokio::task::JoinHandle<()>, FirstListDone) {
    let ar = api_resource();
    let place = shared.watches.place();
    let api: Api<DynamicObject> = Api::all_with(place.client(), &ar);
    let writer = reflector::store::Writer::<DynamicObject>::new(ar);
    let store = writer.as_reader();
    let (first_list, done) = FirstList::new();
    let health = shared.metrics.clone();
    let events = reflector::reflector(writer, watcher(api, watch_config()))
        .inspect(move |event| watch_health(&health, "plugins.wasm-operator.dev", event))
        .default_backoff();
    let (retry, retries) = mpsc::unbounded();
    let (finished, prepared) = mpsc::unbounded();
    let mut loader = Loader {
        base: shared.registry(),
        shared,
        settings,
        controllers,
        live,
        loaded: BTreeMap::new(),
        prefetched,
        book: Book::default(),
        done: finished,
        retry,
    };
    let task = tokio::spawn(async move {
        // The watch's place on its connection, held while the watch is.
        let _place = place;
        enum Item {
            Event(Box<Result<watcher::Event<DynamicObject>, watcher::Error>>),
            Retry(String),
            Prepared(String, u64, Box<Result<Prepared, Refusal>>),
        }
        let events = Box::pin(events.map(|e| Item::Event(Box::new(e))));
        let retries = retries.map(Item::Retry);
        let prepared = prepared.map(|(name, ticket, result)| Item::Prepared(name, ticket, result));
        let mut items = futures::stream::select(events, futures::stream::select(retries, prepared));
        // The first list is loaded whole (each Plugin served or refused) before the operator
        // says it has synced: a replica that becomes leader serves every Plugin before it
        // reports ready.
        let mut first_list = Some(first_list);
        let mut listed = false;
        while let Some(item) = items.next().await {
            match item {
                Item::Prepared(name, ticket, result) => {
                    loader.prepared(&store, &name, ticket, *result).await;
                }
                Item::Event(e) => loader.event(&store, *e, &mut listed).await,
                Item::Retry(name) => {
                    loader.book.retried(&name);
                    if let Some(o) = current(&store, &name) {
                        loader.sync(&o, true).await;
                    }
                }
            }
            if listed
                && !loader.book.is_preparing()
                && let Some(first) = first_list.take()
            {
                first.done();
            }
        }
    });
    (task, done)
}

/// The Plugin named `name`, as the watch shows it now.
fn current(store: &Store<DynamicObject>, name: &str) -> Option<Arc<DynamicObject>> {
    store.get(&reflector::ObjectRef::new_with(name, api_resource()))
}

impl Loader {
    /// Acts on an event of the watch of `Plugin`s; `listed` turns true once a list is done.
    async fn event(
        &mut self,
        store: &Store<DynamicObject>,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
        listed: &mut bool,
    ) {
        match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                self.sync(&o, false).await;
            }
            Ok(watcher::Event::Delete(o)) => self.remove(&o.name_any()),
            Ok(watcher::Event::InitDone) => {
                // After a relist, what is loaded but no longer listed was deleted meanwhile.
                let gone: Vec<String> = self
                    .loaded
                    .keys()
                    .filter(|name| current(store, name).is_none())
                    .cloned()
                    .collect();
                for name in gone {
                    self.remove(&name);
                }
                // What a standby made ready for Plugins no longer listed is let go.
                self.prefetched
                    .retain(|name, _| current(store, name).is_some());
                *listed = true;
            }
            Ok(watcher::Event::Init) | Err(_) => {}
        }
    }

    /// Serves what the Plugin `o` asks for, or says in its status why not; `again` when it is
    /// a retry (else a generation already acted on is left alone). What takes long (pulling,
    /// compiling, checking) runs on its own, for each Plugin at once: a slow registry holds
    /// back only the Plugins it serves; the rest comes back as [`Loader::prepared`].
    async fn sync(&mut self, o: &DynamicObject, again: bool) {
        let name = o.name_any();
        let generation = o.metadata.generation.unwrap_or(0);
        if !self.book.is_news(&name, generation, again) {
            return;
        }
        let wanted = self.wanted(o);
        // What is being prepared for this very spec goes on; anything else being prepared for
        // the Plugin is no longer asked for.
        if self
            .book
            .keep_preparing(&name, wanted.as_ref().ok().map(|(_, _, ask)| ask))
        {
            return;
        }
        let (reference, limits, ask) = match wanted {
            Ok(w) => w,
            Err(refusal) => return self.settle(o, Err(refusal)).await,
        };
        if let Some(l) = self.loaded.get(&name)
            && l.reference.digest == reference.digest
            && l.limits == limits
        {
            return self.settle(o, Ok(false)).await;
        }
        // What a standby made ready while it waited for the Lease, if it is what is asked.
        if let Some(p) = self.prefetched.remove(&name)
            && p.reference.digest == reference.digest
            && p.limits == limits
        {
            tracing::info!(plugin = %name, image = %p.reference, "loaded while standing by");
            let result = self.serve_prepared(&name, p).await;
            return self.settle(o, result).await;
        }
        let (live, ctx, done) = (
            self.live.clone(),
            self.base.context().clone(),
            self.done.clone(),
        );
        self.book.prepare(&name, ask, |ticket| {
            let name = name.clone();
            tokio::spawn(async move {
                let result = prepare(&live, &ctx, &name, reference, limits).await;
                let _ = done.unbounded_send((name, ticket, Box::new(result)));
            })
        });
    }

    /// What the Plugin `o` asks for: the reference and limits, and the ask they make.
    fn wanted(&self, o: &DynamicObject) -> Result<(Reference, Limits, Ask), Refusal> {
        let spec = o.data.get("spec").cloned().unwrap_or(Value::Null);
        let (reference, limits) = wanted(&self.live, &spec)?;
        let ask = Ask {
            uid: o.metadata.uid.clone().unwrap_or_default(),
            digest: reference.digest.clone(),
            limits,
        };
        Ok((reference, limits, ask))
    }

    /// Goes on with a Plugin whose plugin was prepared (or could not be), if it still asks
    /// for what was prepared.
    async fn prepared(
        &mut self,
        store: &Store<DynamicObject>,
        name: &str,
        ticket: u64,
        result: Result<Prepared, Refusal>,
    ) {
        // A newer preparation may have replaced the one this result is from.
        let Some(asked) = self.book.finished(name, ticket) else {
            return;
        };
        // The Plugin as it is now must still ask for what was prepared (the same object, the
        // same image and limits).
        let Some(o) = current(store, name) else {
            return;
        };
        let still = self.wanted(&o).is_ok_and(|(_, _, ask)| ask == asked);
        if !still {
            self.sync(&o, true).await;
            return;
        }
        let result = match result {
            Ok(p) => self.serve_prepared(name, p).await,
            Err(refusal) => Err(refusal),
        };
        self.settle(&o, result).await;
    }

    /// Whether this pipeline writes what Plugins need written (their CRDs, admission policies
    /// and status): with shards, shard 0's alone, so that two replicas never write one; the
    /// others load and serve the same plugins.
    fn writes(&self) -> bool {
        self.shared.shard.is_none_or(|s| s.index == 0)
    }

    /// Records how serving the Plugin `o` went, in its status, and when to try again.
    async fn settle(&mut self, o: &DynamicObject, result: Result<bool, Refusal>) {
        let name = o.name_any();
        let generation = o.metadata.generation.unwrap_or(0);
        match result {
            Ok(changed) => {
                self.book.served(&name, generation);
                let loaded = &self.loaded[&name];
                if changed {
                    tracing::info!(plugin = %name, image = %loaded.reference, "serving");
                }
                let status = loaded.status();
                let message = format!(
                    "serving {} ({})",
                    loaded
                        .plugin
                        .info()
                        .kinds
                        .iter()
                        .map(|k| k.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    loaded.reference.digest.as_deref().unwrap_or_default()
                );
                self.write_status(o, generation, status, None, &message)
                    .await;
            }
            Err(refusal) => {
                let served = self.loaded.get(&name).map(|l| l.reference.to_string());
                let mut message = refusal.message.clone();
                match &served {
                    Some(r) => message.push_str(&format!("; still serving oci://{r}")),
                    None => message.push_str("; nothing of it is served"),
                }
                tracing::warn!(plugin = %name, reason = refusal.reason, "{message}");
                let wait = self.book.refused(&name, generation, refusal.transient);
                self.retry_later(&name, wait);
                // The status keeps saying what is served.
                let status = self
                    .loaded
                    .get(&name)
                    .map_or_else(|| json!({}), Loaded::status);
                self.write_status(o, generation, status, Some(&refusal), &message)
                    .await;
            }
        }
    }

    /// Asks for the Plugin `name` to be synced again after `wait`, unless that is asked already.
    fn retry_later(&mut self, name: &str, wait: Duration) {
        if !self.book.retry(name) {
            return;
        }
        let retry = self.retry.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = retry.unbounded_send(name);
        });
    }

    /// Serves a plugin prepared for the Plugin `name`, once the cluster allows it: checked
    /// against the other plugins' Kinds and the operator's rights, its CRDs installed, its
    /// children watched; then swapped in. Returns whether anything changed.
    async fn serve_prepared(&mut self, name: &str, prepared: Prepared) -> Result<bool, Refusal> {
        let Prepared {
            reference,
            limits,
            plugin,
            signature,
        } = prepared;
        // Every other plugin stays as it is; this one replaces its own last version only.
        let candidate = self.registry(Some((name, &plugin))).map_err(|e| match e {
            crate::Error::KindConflict { .. } => Refusal::stalled("KindConflict", e.to_string()),
            other => Refusal::stalled("LoadFailed", other.to_string()),
        })?;
        self.allowed(&plugin).await?;
        if !self.shared.fence.allows() {
            return Err(Refusal::transient(
                "NotLeading",
                "this replica does not hold the Lease",
            ));
        }
        // The plugin alone: what its CRDs and admission policies are made from.
        let own = Registry::of(self.base.context().clone(), vec![plugin.clone()])
            .map_err(|e| Refusal::stalled("LoadFailed", e.to_string()))?;
        self.install_crds(name, &own).await?;
        self.install_policies(&own).await?;
        // Its child kinds are watched (and listed), and its Kinds discovered, before anything
        // of it is served: every step that can fail comes before the swap.
        self.watch_children(&plugin);
        super::find_missing(&self.shared, &self.settings, &self.controllers).await;
        let mut kinds = Vec::new();
        for kind in &plugin.info().kinds {
            let gvk = GroupVersionKind::gvk(&kind.group, &kind.versions[0], &kind.kind);
            let key = format!("{}/{}/{}", kind.group, kind.versions[0], kind.kind);
            let ar = if self.controllers.serves(&key) {
                None
            } else {
                match discover(&self.shared.client, std::iter::once(gvk))
                    .await
                    .pop()
                {
                    Some(Ok((ar, _))) => Some(ar),
                    _ => {
                        return Err(Refusal::transient(
                            "CrdNotServed",
                            format!("the API server does not serve {key} yet"),
                        ));
                    }
                }
            };
            kinds.push((key, kind.clone(), ar));
        }

        // The swap, which cannot fail. Kinds the last version served and this one does not
        // are stopped first (a render of them would find no plugin); renders in flight keep
        // the registry they started with; then the Kinds are served, or all their resources
        // reconciled again with the new version.
        if let Some(previous) = self.loaded.get(name) {
            for key in previous
                .kinds
                .iter()
                .filter(|k| !kinds.iter().any(|(n, _, _)| n == *k))
            {
                self.controllers.stop_kind(&self.shared, key);
            }
        }
        *write(&self.shared.registry) = Arc::new(candidate);
        for (key, kind, ar) in &kinds {
            match ar {
                None => self.controllers.rescan(key),
                Some(ar) => {
                    self.controllers.start(
                        &self.shared,
                        &self.settings,
                        plugin.name(),
                        kind,
                        ar.clone(),
                    );
                }
            }
        }
        let source = format!("Plugin/{name}");
        if let Some(previous) = self.loaded.get(name) {
            self.shared
                .metrics
                .plugin_served(&previous.plugin, &source, false);
        }
        self.shared.metrics.plugin_served(&plugin, &source, true);
        self.loaded.insert(
            name.to_owned(),
            Loaded {
                reference,
                limits,
                plugin,
                signature,
                kinds: kinds.into_iter().map(|(key, _, _)| key).collect(),
            },
        );
        Ok(true)
    }

    /// The registry of the plugins at start and every Plugin loaded, with `with` (a Plugin's
    /// name and plugin) in place of that Plugin's last version.
    fn registry(&self, with: Option<(&str, &Plugin)>) -> crate::Result<Registry> {
        let mut registry = (*self.base).clone();
        for (name, l) in &self.loaded {
            if with.is_none_or(|(n, _)| n != name) {
                registry = registry.with(l.plugin.clone())?;
            }
        }
        if let Some((_, plugin)) = with {
            registry = registry.with(plugin.clone())?;
        }
        Ok(registry)
    }

    /// Makes sure the child kinds the plugin declares are looked for and watched (children of
    /// a kind not found are skipped, and said so in status, until the operator, which looks for
    /// them every few seconds, finds it).
    fn watch_children(&self, plugin: &Plugin) {
        let mut targets = write(&self.shared.targets);
        let mut missing = lock(&self.shared.missing);
        for child in &plugin.info().children {
            let api_version = crate::gvk::api_version(&child.group, &child.version);
            let key = gvk_key(&api_version, &child.kind);
            if targets.contains_key(&key) {
                continue;
            }
            targets.insert(
                key.clone(),
                Err(Unserved::LookingFor {
                    api_version,
                    kind: child.kind.clone(),
                }),
            );
            missing.push((
                key,
                GroupVersionKind::gvk(&child.group, &child.version, &child.kind),
            ));
        }
    }

    /// Stops serving the Plugin `name` (deleted): its controllers stop; its CRDs and resources
    /// stay.
    fn remove(&mut self, name: &str) {
        self.book.forget(name);
        self.prefetched.remove(name);
        self.shared
            .metrics
            .plugin_ready
            .remove(&crate::operator::metrics::PluginLabels {
                plugin: name.to_owned(),
            });
        let Some(gone) = self.loaded.remove(name) else {
            return;
        };
        self.shared
            .metrics
            .plugin_served(&gone.plugin, &format!("Plugin/{name}"), false);

        // A Plugin refused for claiming one of its Kinds may be served now.
        for other in self.book.retry_refused() {
            self.retry_later(&other, Duration::ZERO);
        }
        // Its controllers stop first: a render after the swap would find no plugin.
        for key in &gone.kinds {
            self.controllers.stop_kind(&self.shared, key);
        }
        match self.registry(None) {
            Ok(registry) => *write(&self.shared.registry) = Arc::new(registry),
            Err(e) => tracing::error!(plugin = %name, "the registry without it: {e}"),
        }
        tracing::info!(plugin = %name, image = %gone.reference, "no longer served (deleted); its CRDs and resources are left in place");
    }
}
