//! Plain Rust mirrors of the WIT records, so that a guest's logic needs no bindings to be tested.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// The custom resource being rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// For example `hanzo.ai/v1`.
    pub api_version: String,
    /// For example `Service`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid` (empty when rendering offline).
    pub uid: String,
    /// `metadata.generation` (0 when rendering offline).
    pub generation: i64,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// The resource's `spec` (an empty object when absent).
    pub spec: Value,
}

impl Resource {
    /// A resource with the given kind, name, namespace and spec, and empty metadata otherwise.
    pub fn new(api_version: &str, kind: &str, name: &str, namespace: &str, spec: Value) -> Self {
        Self {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            uid: String::new(),
            generation: 0,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            spec,
        }
    }

    /// A resource from its object as it is written in a file or held by the cluster
    /// (`apiVersion`, `kind`, `metadata`, `spec`), as the host passes it: for tests that render
    /// an example file natively. The namespace is `default` when none is given (or it is empty),
    /// as the host has it. `None` when `apiVersion`, `kind` or `metadata.name` is missing, or a
    /// field is of another type than the host accepts (a label that is not a string, a spec
    /// that is not an object).
    pub fn from_object(object: &Value) -> Option<Self> {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let metadata = &object["metadata"];
        let strings = |v: &Value| -> Option<BTreeMap<String, String>> {
            match v {
                Value::Null => Some(BTreeMap::new()),
                Value::Object(map) => map
                    .iter()
                    .map(|(k, v)| Some((k.clone(), text(v)?)))
                    .collect(),
                _ => None,
            }
        };
        let namespace = match &metadata["namespace"] {
            Value::Null => "default".to_owned(),
            Value::String(ns) if ns.is_empty() => "default".to_owned(),
            ns => text(ns)?,
        };
        Some(Self {
            api_version: text(&object["apiVersion"])?,
            kind: text(&object["kind"])?,
            name: text(&metadata["name"])?,
            namespace,
            uid: text(&metadata["uid"]).unwrap_or_default(),
            generation: metadata["generation"].as_i64().unwrap_or(0),
            labels: strings(&metadata["labels"])?,
            annotations: strings(&metadata["annotations"])?,
            spec: match &object["spec"] {
                Value::Null => Value::Object(Default::default()),
                spec @ Value::Object(_) => spec.clone(),
                _ => return None,
            },
        })
    }
}

/// Facts about the cluster the host runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// The API group in force, for example `hanzo.ai`.
    pub api_group: String,
    /// The cluster's DNS domain, for example `cluster.local`.
    pub cluster_domain: String,
}

impl Default for Context {
    fn default() -> Self {
        Self {
            api_group: "hanzo.ai".to_owned(),
            cluster_domain: "cluster.local".to_owned(),
        }
    }
}

/// Why a resource cannot be rendered: the field to blame and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderError {
    /// A path from the resource's root, such as `spec.ports[1].containerPort`; empty when no
    /// single field is to blame.
    pub field: String,
    /// What is wrong and, where it helps, what is expected.
    pub message: String,
}

impl RenderError {
    /// An error blamed on `field`.
    ///
    /// Both parts are made fit for a status condition, an event and one line of a terminal,
    /// whatever value caused the error: control characters are escaped, a quoted value (in
    /// backticks or double quotes) longer than [`RenderError::MAX_QUOTE`] characters is cut
    /// short, and so is a path segment (a map key from the spec) longer than that.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: short_path(&field.into()),
            message: short_message(&message.into()),
        }
    }

    /// The most characters of a quoted value or a path segment an error shows.
    pub const MAX_QUOTE: usize = 64;
    /// The most characters an error message has.
    pub const MAX_MESSAGE: usize = 512;
}

/// `s` with control characters escaped (`\n`), as one line.
fn one_line(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().collect()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        s.to_owned()
    }
}

/// The first `max` characters of `s`, and `…` when there were more.
fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn short_path(field: &str) -> String {
    let field = one_line(field);
    let segments: Vec<String> = field
        .split('.')
        .map(|s| clip(s, RenderError::MAX_QUOTE))
        .collect();
    clip(&segments.join("."), 4 * RenderError::MAX_QUOTE)
}

/// Cuts every quoted span (between backticks, or double quotes with `\` escapes inside) longer
/// than [`RenderError::MAX_QUOTE`], then the whole message at [`RenderError::MAX_MESSAGE`].
fn short_message(message: &str) -> String {
    let message = one_line(message);
    let mut out = String::with_capacity(message.len().min(RenderError::MAX_MESSAGE + 8));
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '`' && c != '"' {
            continue;
        }
        let mut quoted = String::new();
        let mut closed = false;
        while let Some(q) = chars.next() {
            if q == c {
                closed = true;
                break;
            }
            quoted.push(q);
            if c == '"' && q == '\\' {
                quoted.extend(chars.next());
            }
        }
        out.push_str(&clip(&quoted, RenderError::MAX_QUOTE));
        if closed {
            out.push(c);
        }
    }
    clip(&out, RenderError::MAX_MESSAGE)
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for RenderError {}

/// The result of rendering.
pub type Result<T, E = RenderError> = std::result::Result<T, E>;

/// Something a render left out, or did otherwise than the resource asks, while it rendered the
/// rest (contract 1.1): the host shows it on the resource without making it un-Ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The field concerned, as a path from the resource's root; empty when none is.
    pub field: String,
    /// What was left out or changed, and what would fix it.
    pub message: String,
}

impl Warning {
    /// A warning about `field`, made fit for a condition and one line as [`RenderError::new`]
    /// makes errors.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: short_path(&field.into()),
            message: short_message(&message.into()),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// What a render returns with warnings (contract 1.1).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rendered {
    /// The objects that should exist.
    pub objects: Vec<Value>,
    /// What was left out, and why.
    pub warnings: Vec<Warning>,
}

/// A child of the resource as the host observes it in the cluster (contract 1.1).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObservedChild {
    /// For example `apps/v1`.
    pub api_version: String,
    /// For example `StatefulSet`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.replicas`, for the kinds that have it.
    pub replicas: Option<i64>,
    /// The fields the host keeps of its status (`observedGeneration`, `readyReplicas`,
    /// `availableReplicas`, `updatedReplicas`): an empty object when it has none.
    pub status: Value,
}

impl ObservedChild {
    /// The fields of a child's status the host passes (its other fields are not read).
    pub const STATUS_FIELDS: [&'static str; 4] = [
        "observedGeneration",
        "readyReplicas",
        "availableReplicas",
        "updatedReplicas",
    ];

    /// A child from its object as the cluster reports it (`kubectl get -o yaml`), keeping what
    /// the host passes to `status()`: for tests of a plugin's status against an observed file.
    /// `None` when `apiVersion`, `kind` or `metadata.name` is missing, or one of the counts
    /// the host keeps is not an integer (the host refuses such an object).
    pub fn from_object(object: &Value) -> Option<Self> {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let mut status = serde_json::Map::new();
        for field in Self::STATUS_FIELDS {
            if let Some(count) = object["status"].get(field) {
                status.insert(field.to_owned(), count.as_i64()?.into());
            }
        }
        Some(Self {
            api_version: text(&object["apiVersion"])?,
            kind: text(&object["kind"])?,
            name: text(&object["metadata"]["name"])?,
            replicas: object["spec"]["replicas"].as_i64(),
            status: Value::Object(status),
        })
    }

    /// An integer field of its status; 0 when absent.
    pub fn count(&self, field: &str) -> i64 {
        self.status.get(field).and_then(Value::as_i64).unwrap_or(0)
    }
}

/// A group/version/kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct GroupVersionKind {
    /// The API group; empty for the core group.
    pub group: String,
    /// The version, for example `v1`.
    pub version: String,
    /// The kind, for example `Deployment`.
    pub kind: String,
}

impl GroupVersionKind {
    /// Builds a GVK from its parts.
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
        }
    }
}

/// An additional printer column of a Kind.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// JSONPath into the object, for example `.status.conditions[?(@.type=="Ready")].status`.
    pub json_path: String,
    /// Shown by `kubectl explain`-like tools.
    pub description: String,
    /// 0 shows in the default view; higher only with `-o wide`.
    pub priority: i32,
}

impl PrinterColumn {
    /// A column shown in the default view.
    pub fn new(name: &str, type_: &str, json_path: &str, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            type_: type_.to_owned(),
            json_path: json_path.to_owned(),
            description: description.to_owned(),
            priority: 0,
        }
    }
}

/// One Kind a plugin serves.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KindInfo {
    /// API group.
    pub group: String,
    /// Served versions; the first is the storage version.
    pub versions: Vec<String>,
    /// The Kind.
    pub kind: String,
    /// Lower-case plural.
    pub plural: String,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// For a facade Kind, the engine it implies.
    pub engine: Option<String>,
    /// OpenAPI v3 schema of `spec`; see the WIT docs for `$ref` to Kubernetes types.
    pub spec_schema: Value,
    /// Additional printer columns.
    pub printer_columns: Vec<PrinterColumn>,
    /// The OpenAPI v3 schema (type `object`, with `properties`) of the status fields the plugin
    /// computes for this Kind with [`Plugin::status`] (contract 1.1); `None`: none.
    pub status_schema: Option<Value>,
    /// The fields of its spec that name other objects of the resource's namespace (contract
    /// 1.2): the API server lets a resource name one only when its author may use it.
    pub references: Vec<Reference>,
}

/// A field of a Kind's spec that names another object of the resource's namespace, which the
/// render hands to what it creates (contract 1.2). The operator would use that object with its
/// own rights; the host has the API server refuse a resource whose author could not use it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reference {
    /// The field holding the name, from the resource's root: `spec.`, then field names, with
    /// `[]` after a list's name for each of its items (`spec.envFrom[].secretRef.name`).
    pub path: String,
    /// What it names.
    pub target: ReferenceTarget,
}

/// What kind of object a spec field names, and so what its author must be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ReferenceTarget {
    /// A Secret (`get`).
    Secret,
    /// A ConfigMap (`get`).
    ConfigMap,
    /// A ServiceAccount the pods run as (`create` on `serviceaccounts/token`: act as it).
    ServiceAccount,
}

impl Reference {
    /// A reference at `path` to a `target`.
    pub fn new(path: &str, target: ReferenceTarget) -> Self {
        Self {
            path: path.to_owned(),
            target,
        }
    }
}

impl KindInfo {
    /// One Kind per row of (kind, plural, short name or "", version, engine), in `group`, all
    /// sharing one spec schema and one set of printer columns.
    pub fn table(
        group: &str,
        rows: &[(&str, &str, &str, &str, Option<&str>)],
        schema: &Value,
        columns: &[PrinterColumn],
    ) -> Vec<Self> {
        rows.iter()
            .map(|(kind, plural, short, version, engine)| Self {
                group: group.to_owned(),
                versions: vec![(*version).to_owned()],
                kind: (*kind).to_owned(),
                plural: (*plural).to_owned(),
                short_names: if short.is_empty() {
                    vec![]
                } else {
                    vec![(*short).to_owned()]
                },
                engine: engine.map(str::to_owned),
                spec_schema: schema.clone(),
                printer_columns: columns.to_vec(),
                status_schema: None,
                references: Vec::new(),
            })
            .collect()
    }
}

impl GroupVersionKind {
    /// One per (group, version, kind) row.
    pub fn list(rows: &[(&str, &str, &str)]) -> Vec<Self> {
        rows.iter().map(|(g, v, k)| Self::new(g, v, k)).collect()
    }
}

/// What the host needs to know about a plugin.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PluginInfo {
    /// Short name for logs and errors.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// The Kinds it serves.
    pub kinds: Vec<KindInfo>,
    /// Every kind `render` may return.
    pub children: Vec<GroupVersionKind>,
}

/// What a guest implements. Every function must be pure.
pub trait Plugin {
    /// Describes the plugin under `ctx` (its Kinds may live in the API group in force).
    fn describe(ctx: &Context) -> PluginInfo;
    /// Renders `resource` into the objects that should exist for it.
    fn render(resource: &Resource, ctx: &Context) -> Result<Vec<Value>>;
    /// Renders `resource` with warnings (contract 1.1): what the host calls. By default,
    /// [`Plugin::render`] with none; a plugin that leaves out an optional part it cannot render
    /// safely overrides this, and has `render` return its objects.
    fn render_reported(resource: &Resource, ctx: &Context) -> Result<Rendered> {
        Ok(Rendered {
            objects: Self::render(resource, ctx)?,
            warnings: Vec::new(),
        })
    }
    /// The status fields of `resource` (contract 1.1), from its children as the host observes
    /// them: the fields its Kind's [`KindInfo::status_schema`] declares. By default, none.
    fn status(
        resource: &Resource,
        children: &[ObservedChild],
        ctx: &Context,
    ) -> Result<serde_json::Map<String, Value>> {
        let _ = (resource, children, ctx);
        Ok(serde_json::Map::new())
    }
}

/// A resource as it crosses the component boundary: the WIT `resource` record, with the spec as
/// JSON text and labels and annotations as pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireResource {
    /// For example `hanzo.ai/v1`.
    pub api_version: String,
    /// For example `Service`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.labels`.
    pub labels: Vec<(String, String)>,
    /// `metadata.annotations`.
    pub annotations: Vec<(String, String)>,
    /// The spec as a JSON document.
    pub spec: String,
}

impl WireResource {
    /// The boundary form of `resource`: what the host sends.
    pub fn from_resource(resource: &Resource) -> Self {
        let pairs = |m: &BTreeMap<String, String>| -> Vec<(String, String)> {
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        Self {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            name: resource.name.clone(),
            namespace: resource.namespace.clone(),
            uid: resource.uid.clone(),
            generation: resource.generation,
            labels: pairs(&resource.labels),
            annotations: pairs(&resource.annotations),
            spec: resource.spec.to_string(),
        }
    }
}

/// The whole of a guest's `render` export, on any target: parses the spec, calls
/// [`Plugin::render`] and serialises each object. The component export is this function over
/// the WIT records; calling it natively gives the same bytes, which is what the render benchmark
/// compares the component against.
pub fn render_wire<P: Plugin>(resource: WireResource, ctx: &Context) -> Result<Vec<String>> {
    let objects = P::render(&resource.parse()?, ctx)?;
    Ok(objects.iter().map(Value::to_string).collect())
}

/// As [`render_wire`], through [`Plugin::render_reported`]: the `render` export of contract 1.1.
pub fn render_wire_reported<P: Plugin>(
    resource: WireResource,
    ctx: &Context,
) -> Result<(Vec<String>, Vec<Warning>)> {
    let rendered = P::render_reported(&resource.parse()?, ctx)?;
    Ok((
        rendered.objects.iter().map(Value::to_string).collect(),
        rendered.warnings,
    ))
}

impl WireResource {
    /// The resource, its spec parsed (and its nesting bounded).
    pub fn parse(self) -> Result<Resource> {
        let resource = self;
        let spec = serde_json::from_str(&resource.spec)
            .map_err(|e| RenderError::new("spec", format!("is not valid JSON: {e}")))?;
        crate::spec::nesting(&spec)?;
        Ok(Resource {
            api_version: resource.api_version,
            kind: resource.kind,
            name: resource.name,
            namespace: resource.namespace,
            uid: resource.uid,
            generation: resource.generation,
            labels: resource.labels.into_iter().collect(),
            annotations: resource.annotations.into_iter().collect(),
            spec,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_stay_short_and_on_one_line() {
        let long = "x".repeat(100_000);
        let e = RenderError::new(
            format!("spec.labels.{long}"),
            format!("`{long}` is not a quantity"),
        );
        assert_eq!(e.field, format!("spec.labels.{}…", "x".repeat(64)));
        assert_eq!(
            e.message,
            format!("`{}…` is not a quantity", "x".repeat(64))
        );
        let e = RenderError::new(
            "spec.replicas",
            format!("invalid type: string \"a\\\"{long}\", expected i64"),
        );
        assert!(e.message.ends_with("…\", expected i64"), "{}", e.message);
        let e = RenderError::new("spec.x", "`a\nb` is bad\tnews");
        assert_eq!(e.message, "`a\\nb` is bad\\tnews");
        let e = RenderError::new("spec.x", "y".repeat(2_000));
        assert_eq!(e.message.chars().count(), RenderError::MAX_MESSAGE + 1);
        let short = RenderError::new("spec.ports[0].name", "`http` names two ports");
        assert_eq!(
            short.to_string(),
            "spec.ports[0].name: `http` names two ports"
        );
    }
}

#[cfg(test)]
mod from_object_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_resource_from_its_object_is_what_the_host_passes() {
        let r = Resource::from_object(&json!({
            "apiVersion": "example.com/v1", "kind": "Site",
            "metadata": { "name": "a", "namespace": "", "labels": { "team": "x" }, "generation": 3 },
        }))
        .unwrap();
        assert_eq!((r.name.as_str(), r.namespace.as_str()), ("a", "default"));
        assert_eq!(r.labels["team"], "x");
        assert_eq!(r.generation, 3);
        assert_eq!(r.spec, json!({}));
        for wrong in [
            json!({ "kind": "Site", "metadata": { "name": "a" } }),
            json!({ "apiVersion": "v1", "kind": "Site", "metadata": { "name": "a", "labels": { "n": 1 } } }),
            json!({ "apiVersion": "v1", "kind": "Site", "metadata": { "name": "a" }, "spec": [1] }),
        ] {
            assert_eq!(Resource::from_object(&wrong), None, "{wrong}");
        }
    }

    #[test]
    fn an_observed_child_keeps_the_counts_the_host_keeps() {
        let child = ObservedChild::from_object(&json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "db" },
            "spec": { "replicas": 3 },
            "status": { "readyReplicas": 2, "currentRevision": "db-1" },
        }))
        .unwrap();
        assert_eq!(child.replicas, Some(3));
        assert_eq!(child.status, json!({ "readyReplicas": 2 }));
        let wrong = json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "db" },
            "status": { "readyReplicas": "two" },
        });
        assert_eq!(ObservedChild::from_object(&wrong), None);
    }
}
