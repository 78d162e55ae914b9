//! Which plugin serves which Kind, and the checks every rendered object passes before anything
//! may use it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

use crate::error::{Error, MAX_ERROR_MESSAGE, Result};
use crate::gvk::split_api_version;
use crate::plugin::PluginError;
use crate::plugin::{BUILTINS, Plugin, Runtime};
use crate::schema::{SpecErrors, UnknownFields};
use crate::types::{Context, KindInfo, PluginInfo, Resource, Warning};
use crate::units::bounded;

/// Kinds that are not namespaced: a plugin may neither declare nor return them.
const CLUSTER_SCOPED: [(&str, &str); 23] = [
    ("", "Namespace"),
    ("", "Node"),
    ("", "PersistentVolume"),
    ("", "ComponentStatus"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ("apiregistration.k8s.io", "APIService"),
    ("storage.k8s.io", "StorageClass"),
    ("storage.k8s.io", "CSIDriver"),
    ("storage.k8s.io", "CSINode"),
    ("storage.k8s.io", "VolumeAttachment"),
    ("scheduling.k8s.io", "PriorityClass"),
    ("networking.k8s.io", "IngressClass"),
    ("node.k8s.io", "RuntimeClass"),
    ("certificates.k8s.io", "CertificateSigningRequest"),
    (
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
    ),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
    (
        "admissionregistration.k8s.io",
        "ValidatingAdmissionPolicyBinding",
    ),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"),
    ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
    ("cert-manager.io", "ClusterIssuer"),
];

/// Why a resource could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// No loaded plugin serves the Kind.
    NoPlugin {
        /// The resource's apiVersion.
        api_version: String,
        /// The resource's kind.
        kind: String,
        /// `Kind.group` of every Kind served.
        served: Vec<String>,
    },
    /// The Kind is served, but not at this version.
    VersionNotServed {
        /// The resource's apiVersion.
        api_version: String,
        /// The resource's kind.
        kind: String,
        versions: Vec<String>,
    },
    /// The spec does not fit the Kind's schema (see [`crate::schema`]).
    InvalidSpec(SpecErrors),
    /// The plugin failed or its output was refused.
    Plugin {
        /// The plugin's name.
        plugin: String,
        error: PluginError,
    },
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPlugin {
                api_version,
                kind,
                served,
            } => write!(
                f,
                "no plugin serves {kind} in {api_version} (served: {}); pass one with --plugin",
                served.join(", ")
            ),
            Self::VersionNotServed {
                api_version,
                kind,
                versions,
            } => write!(
                f,
                "{kind} is not served at {api_version}; served versions: {}",
                versions.join(", ")
            ),
            Self::InvalidSpec(e) => write!(f, "invalid spec: {e}"),
            Self::Plugin { plugin, error } => write!(f, "plugin {plugin}: {error}"),
        }
    }
}

impl RenderError {
    /// A short CamelCase reason, for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoPlugin { .. } | Self::VersionNotServed { .. } => "NoPlugin",
            Self::InvalidSpec(_) => "InvalidSpec",
            Self::Plugin { error, .. } => error.reason(),
        }
    }

    /// Whether rendering the same resource again, with nothing changed, may succeed (see
    /// [`PluginError::transient`]). A Kind or version no plugin serves stays so until the
    /// plugins or the resource change; so does a spec that does not fit its schema.
    pub fn transient(&self) -> bool {
        match self {
            Self::NoPlugin { .. } | Self::VersionNotServed { .. } | Self::InvalidSpec(_) => false,
            Self::Plugin { error, .. } => error.transient(),
        }
    }
}

/// Where a plugin given on the command line comes from.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    /// Bytes already read: a plugin pulled from a registry, named by its pinned reference.
    Wasm {
        /// What errors and logs call it (`oci://registry/repository@sha256:...`).
        name: String,
        wasm: Vec<u8>,
    },
    /// A plugin the store of pulled plugins keeps by digest: loaded from the compile cache
    /// without reading it when it was compiled before.
    Kept {
        /// What errors and logs call it (`oci://registry/repository@sha256:...`).
        name: String,
        kept: crate::oci::Kept,
        /// How to pull it again, and where to keep it, should the kept layer be unreadable or
        /// damaged when it must be read.
        refetch: Box<(crate::oci::Options, Option<crate::oci::Store>)>,
    },
}

/// The loaded plugins and the Kinds they serve.
#[derive(Debug, Clone)]
pub struct Registry {
    ctx: Context,
    plugins: Vec<Plugin>,
    kinds: BTreeMap<(String, String), usize>,
    /// The served Kinds (by group and Kind) whose spec schema a render checks specs against: not
    /// those whose schema names a Kubernetes type the host does not know (then `host crds`
    /// fails, naming it). The schema itself is the plugin's, shared, not copied here.
    checked: BTreeSet<(String, String)>,
}

impl Registry {
    /// Loads the built-in plugins (unless `builtins` is false), then each file of `extra`. A file
    /// plugin replaces a built-in one for the Kinds both serve; two files serving one Kind is an
    /// error.
    pub fn load(
        runtime: &Runtime,
        ctx: Context,
        builtins: bool,
        extra: &[PathBuf],
    ) -> Result<Self> {
        let mut registry = Self {
            ctx,
            plugins: Vec::new(),
            kinds: BTreeMap::new(),
            checked: BTreeSet::new(),
        };
        if builtins {
            for b in BUILTINS {
                let plugin = runtime.load_builtin(&b, &registry.ctx)?;
                registry.add(plugin, false)?;
            }
        }
        for path in extra {
            let plugin = runtime.load_file(path, &registry.ctx)?;
            registry.add(plugin, true)?;
        }
        Ok(registry)
    }

    /// As [`Registry::load`], with plugins from files or already in memory (pulled from a
    /// registry), in the order given: a later one replaces an earlier one for the Kinds it
    /// serves.
    pub fn load_sources(
        runtime: &Runtime,
        ctx: Context,
        builtins: bool,
        sources: &[Source],
    ) -> Result<Self> {
        let mut registry = Self::load(runtime, ctx, builtins, &[])?;
        for source in sources {
            let plugin = match source {
                Source::File(path) => runtime.load_file(path, &registry.ctx)?,
                Source::Wasm { name, wasm } => runtime.load(wasm, name, &registry.ctx)?,
                Source::Kept {
                    name,
                    kept,
                    refetch,
                } => runtime.load_by_digest(
                    &kept.sha256,
                    kept.size,
                    || {
                        let (options, store) = refetch.as_ref();
                        kept.read().or_else(|e| {
                            tracing::warn!(plugin = %name, "the kept copy cannot be used ({e}): pulling it again");
                            let failed = |reason: String| Error::Load {
                                plugin: name.clone(),
                                reason,
                            };
                            tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                                .map_err(|e| failed(e.to_string()))?
                                .block_on(crate::oci::pull(
                                    &kept.reference,
                                    options,
                                    store.as_ref(),
                                    true,
                                ))
                                .map(|pulled| pulled.wasm)
                                .map_err(|e| failed(e.to_string()))
                        })
                    },
                    name,
                    &registry.ctx,
                )?,
            };
            registry.add(plugin, true)?;
        }
        Ok(registry)
    }

    /// A registry of the given plugins alone, as loaded (`host check` renders through one).
    pub fn of(ctx: Context, plugins: Vec<Plugin>) -> Result<Self> {
        let mut registry = Self {
            ctx,
            plugins: Vec::new(),
            kinds: BTreeMap::new(),
            checked: BTreeSet::new(),
        };
        for plugin in plugins {
            registry.add(plugin, true)?;
        }
        Ok(registry)
    }

    /// This registry with `plugin` added, refused when it serves a Kind that another plugin
    /// here serves (whichever it is: a built-in plugin is not replaced this way). The operator
    /// builds the registry it serves from this way as plugins come and go.
    pub fn with(&self, plugin: Plugin) -> Result<Self> {
        let mut next = self.clone();
        next.add(plugin, false)?;
        Ok(next)
    }

    fn add(&mut self, plugin: Plugin, from_file: bool) -> Result<()> {
        check_children(plugin.info()).map_err(|reason| Error::Load {
            plugin: plugin.source().to_owned(),
            reason,
        })?;
        let index = self.plugins.len();
        for k in &plugin.info().kinds {
            let key = (k.group.clone(), k.kind.clone());
            if self.kinds.get(&key) == Some(&index) {
                return Err(Error::Load {
                    plugin: plugin.source().to_owned(),
                    reason: format!("describes {}.{} twice", k.kind, k.group),
                });
            }
            if let Some(&previous) = self.kinds.get(&key) {
                let other = &self.plugins[previous];
                if from_file && other.source().starts_with("built-in") {
                    tracing::info!(kind = %k.kind, group = %k.group, "plugin {} replaces {}", plugin.source(), other.source());
                } else {
                    return Err(Error::KindConflict {
                        kind: format!("{}.{}", k.kind, k.group),
                        first: other.source().to_owned(),
                        second: plugin.source().to_owned(),
                    });
                }
            }
            // Kept with its `$ref`s, which the check reads through the process's one copy of
            // each Kubernetes type.
            if crate::kube_schema::refs_known(&k.spec_schema) {
                self.checked.insert(key.clone());
            } else {
                self.checked.remove(&key);
            }
            self.kinds.insert(key, index);
        }
        self.plugins.push(plugin);
        Ok(())
    }

    /// The context every call gets.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The loaded plugins, built-in first.
    pub fn plugins(&self) -> &[Plugin] {
        &self.plugins
    }

    /// Every Kind served, with the plugin that serves it, sorted by group and Kind.
    pub fn kinds(&self) -> impl Iterator<Item = (&Plugin, &KindInfo)> {
        self.kinds.iter().filter_map(|((group, kind), &i)| {
            let plugin = &self.plugins[i];
            plugin.kind(group, kind).map(|k| (plugin, k))
        })
    }

    /// The plugin and Kind for an apiVersion and kind.
    pub fn lookup(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(&Plugin, &KindInfo), RenderError> {
        let (group, version) = split_api_version(api_version);
        let plugin = self
            .kinds
            .get(&(group.to_owned(), kind.to_owned()))
            .map(|&i| &self.plugins[i])
            .ok_or_else(|| RenderError::NoPlugin {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                served: self.kinds.keys().map(|(g, k)| format!("{k}.{g}")).collect(),
            })?;
        let info = plugin
            .kind(group, kind)
            .ok_or_else(|| RenderError::NoPlugin {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                served: vec![],
            })?;
        if !info.versions.iter().any(|v| v == version) {
            return Err(RenderError::VersionNotServed {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                versions: info
                    .versions
                    .iter()
                    .map(|v| format!("{group}/{v}"))
                    .collect(),
            });
        }
        Ok((plugin, info))
    }

    /// Checks a resource's spec against its Kind's schema (fields it does not know refused, as
    /// for a file), renders it through its plugin and checks every object it returns.
    pub fn render(&self, resource: &Resource) -> Result<Vec<Value>, RenderError> {
        Ok(self.render_reported(resource)?.0)
    }

    /// As [`Registry::render`], with the plugin's warnings (contract 1.1; none from a 1.0
    /// plugin).
    pub fn render_reported(
        &self,
        resource: &Resource,
    ) -> Result<(Vec<Value>, Vec<Warning>), RenderError> {
        self.render_checked(resource, UnknownFields::Refuse)
    }

    /// As [`Registry::render`], with `unknown` saying what to do with spec fields the Kind's
    /// schema does not know (the operator lets them be: the API server has pruned the
    /// resource against the CRD it holds).
    pub fn render_checked(
        &self,
        resource: &Resource,
        unknown: UnknownFields,
    ) -> Result<(Vec<Value>, Vec<Warning>), RenderError> {
        let (plugin, info) = self.lookup(&resource.api_version, &resource.kind)?;
        if self
            .checked
            .contains(&(info.group.clone(), info.kind.clone()))
        {
            crate::schema::check(&info.spec_schema, &resource.spec, "spec", unknown)
                .map_err(RenderError::InvalidSpec)?;
        }
        let fail = |error| RenderError::Plugin {
            plugin: plugin.name().to_owned(),
            error,
        };
        let (objects, warnings) = plugin.render_reported(resource, &self.ctx).map_err(fail)?;
        Ok((
            check_objects(plugin.info(), resource, objects).map_err(fail)?,
            warnings,
        ))
    }
}

/// Refuses a description that declares a cluster-scoped child kind.
pub fn check_children(info: &PluginInfo) -> std::result::Result<(), String> {
    for child in &info.children {
        if CLUSTER_SCOPED.contains(&(child.group.as_str(), child.kind.as_str())) {
            return Err(format!(
                "declares the cluster-scoped child kind {} ({}); plugins may only create namespaced objects",
                child.kind,
                if child.group.is_empty() {
                    "core"
                } else {
                    &child.group
                }
            ));
        }
    }
    Ok(())
}

/// Checks what a plugin rendered for `resource`: every object is of a kind the plugin declared,
/// namespaced, in the resource's namespace (filled in when absent), validly and uniquely named.
pub fn check_objects(
    info: &PluginInfo,
    resource: &Resource,
    mut objects: Vec<Value>,
) -> Result<Vec<Value>, PluginError> {
    let mut seen = BTreeSet::new();
    for (i, obj) in objects.iter_mut().enumerate() {
        // Names, kinds and namespaces come from the guest, as long as the output cap allows.
        let refuse = |why: String| {
            PluginError::Guard(bounded(
                format!("refused object {i}: {why}"),
                MAX_ERROR_MESSAGE,
            ))
        };
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if api_version.is_empty() || kind.is_empty() {
            return Err(refuse("it has no apiVersion or kind".into()));
        }
        let (group, version) = split_api_version(&api_version);
        let declared = info
            .children
            .iter()
            .any(|c| c.group == group && c.version == version && c.kind == kind);
        if !declared {
            let list: Vec<String> = info
                .children
                .iter()
                .map(|c| {
                    format!(
                        "{} {}",
                        crate::gvk::api_version(&c.group, &c.version),
                        c.kind
                    )
                })
                .collect();
            return Err(refuse(format!(
                "{kind} ({api_version}) is not a child kind the plugin declared ({})",
                list.join(", ")
            )));
        }
        if CLUSTER_SCOPED.contains(&(group, kind.as_str())) {
            return Err(refuse(format!("{kind} is cluster-scoped")));
        }
        let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
            return Err(refuse(format!("{kind} has no metadata")));
        };
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if guest_kit::spec::dns_subdomain("metadata.name", &name).is_err() {
            return Err(refuse(format!("{kind} has an invalid name `{name}`")));
        }
        match meta.get("namespace").and_then(Value::as_str) {
            None => {
                meta.insert("namespace".into(), resource.namespace.clone().into());
            }
            Some(ns) if ns == resource.namespace => {}
            Some(ns) => {
                return Err(refuse(format!(
                    "{kind} {name} is in namespace `{ns}`; a plugin may only write to the resource's own namespace `{}`",
                    resource.namespace
                )));
            }
        }
        if !seen.insert((group.to_owned(), kind.clone(), name.clone())) {
            return Err(refuse(format!("{kind} {name} is returned twice")));
        }
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::types::GroupVersionKind;

    fn plugin(error: PluginError) -> RenderError {
        RenderError::Plugin {
            plugin: "p".to_owned(),
            error,
        }
    }

    /// Every pipeline (one per shard held) and every Plugin resource's change clones the
    /// registry or adds to one: each shares each plugin's description, whose schemas weigh
    /// megabytes, and a clone still checks a spec against its Kind's schema.
    #[test]
    fn a_clone_shares_each_plugins_description_and_still_checks_specs() {
        let runtime = crate::plugin::Runtime::new(Default::default(), None).unwrap();
        let registry = Registry::load(&runtime, Default::default(), true, &[]).unwrap();
        let clone = registry.clone();
        assert!(!registry.plugins().is_empty());
        for (a, b) in registry.plugins().iter().zip(clone.plugins()) {
            assert!(std::ptr::eq(a.info(), b.info()), "{} copied", a.name());
        }
        let (plugin, service) = clone
            .kinds()
            .find(|(_, k)| k.kind == "Service")
            .expect("a Service Kind");
        // As the operator builds the registry it serves, a Plugin resource at a time.
        let built = Registry::load(&runtime, Default::default(), false, &[])
            .unwrap()
            .with(plugin.clone())
            .unwrap();
        assert!(std::ptr::eq(built.plugins()[0].info(), plugin.info()));
        let resource = Resource::new(
            &format!("{}/{}", service.group, service.versions[0]),
            "Service",
            "example",
            "hanzo",
            serde_json::json!({ "image": 7 }),
        );
        assert!(
            matches!(
                clone.render_checked(&resource, UnknownFields::Ignore),
                Err(RenderError::InvalidSpec(_))
            ),
            "a spec its schema refuses is refused"
        );
    }

    #[test]
    fn a_kind_or_version_no_plugin_serves_is_not_transient() {
        let no_plugin = RenderError::NoPlugin {
            api_version: "a/v1".to_owned(),
            kind: "K".to_owned(),
            served: vec![],
        };
        let no_version = RenderError::VersionNotServed {
            api_version: "a/v2".to_owned(),
            kind: "K".to_owned(),
            versions: vec!["a/v1".to_owned()],
        };
        assert!(!no_plugin.transient());
        assert!(!no_version.transient());
    }

    #[test]
    fn a_plugin_failure_is_transient_when_its_cause_is() {
        assert!(plugin(PluginError::Deadline(Duration::from_secs(1))).transient());
        assert!(plugin(PluginError::Busy("full".to_owned())).transient());
        assert!(!plugin(PluginError::Panic("boom".to_owned())).transient());
        assert!(!plugin(PluginError::Guard("refused".to_owned())).transient());
    }

    #[test]
    fn a_refusal_naming_a_huge_guest_string_is_cut() {
        let info = PluginInfo {
            name: "p".to_owned(),
            version: "0".to_owned(),
            kinds: vec![],
            children: vec![GroupVersionKind::new("", "v1", "ConfigMap")],
        };
        let resource = Resource::new("a/v1", "K", "r", "ns", serde_json::json!({}));
        let name = "X".repeat(1 << 20);
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": name },
        });
        let e = check_objects(&info, &resource, vec![object]).unwrap_err();
        let PluginError::Guard(message) = &e else {
            panic!("{e:?}")
        };
        assert!(message.starts_with("refused object 0: ConfigMap has an invalid name `XXX"));
        assert!(message.len() < MAX_ERROR_MESSAGE + 32, "{}", message.len());
        assert!(
            message.ends_with(" more bytes)"),
            "{}",
            &message[message.len() - 40..]
        );
    }
}
