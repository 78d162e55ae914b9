//! What must hold for every input file, checked along the path `host render` takes: read, parse,
//! build each resource, render it through the registry, write the manifests.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use guest_kit::WireResource;
use host::documents::{self, Format};
use host::plugin::PluginError;
use host::registry::{Registry, RenderError};
use host::types::{Context, Resource};
use serde_json::Value;

/// A property that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// A short name, used in the corpus file's name: `host-panic`, `guest-trap`, ….
    pub kind: String,
    /// What happened, for a person.
    pub detail: String,
}

impl Failure {
    fn new(kind: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: kind.to_owned(),
            detail: detail.into(),
        }
    }
}

/// What one input file came to, when every property held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The file could not be read or parsed (with an error naming it).
    pub refused_file: bool,
    /// Documents parsed.
    pub documents: usize,
    /// Resources rendered.
    pub rendered: usize,
    /// Of those, resources whose spec the Kind's CRD accepts, so that every object rendered was
    /// judged as a Kubernetes object too.
    pub judged: usize,
    /// Resources refused (by the host or the plugin) with an error naming the field.
    pub refused: usize,
}

/// The longest field path and message (in characters) a render error may have: a condition, an
/// event and a line on a terminal must stay readable however long the value that caused it.
pub const MAX_FIELD: usize = 300;
/// See [`MAX_FIELD`].
pub const MAX_MESSAGE: usize = 1024;
/// Below this many bytes of spec, a plugin that runs out of time, memory or output space is a
/// bug: it amplified a small input. Above it, the sandbox's limits are the expected answer.
pub const LARGE_SPEC: usize = 256 << 10;
/// Rendered output up to this size is read back to check it means what was rendered.
const ROUND_TRIP_LIMIT: usize = 256 << 10;

/// The plugins, and the spec schema of each Kind they serve as its CRD has it.
#[derive(Debug)]
pub struct Checker {
    registry: Registry,
    schemas: BTreeMap<(String, String), Value>,
    strict: bool,
}

impl Checker {
    /// A checker of what `registry`'s plugins render. `strict` also judges what specs with
    /// invalid passed-through Kubernetes fields render (see [`crate::kube::conforms`]).
    pub fn new(registry: Registry, strict: bool) -> Self {
        let schemas = registry
            .kinds()
            .map(|(_, k)| {
                let schema = crate::kube::inline(k.spec_schema.clone()).unwrap_or(Value::Null);
                ((k.group.clone(), k.kind.clone()), schema)
            })
            .collect();
        Self {
            registry,
            schemas,
            strict,
        }
    }

    /// Checks the file at `path` (which error messages must name), catching a panic of the
    /// host. `progress` is called after the file is parsed and after each document: a file of
    /// many documents may take long, but no single step may.
    pub fn file(&self, path: &str, progress: &mut dyn FnMut()) -> Result<Outcome, Failure> {
        match catch_unwind(AssertUnwindSafe(|| file_inner(self, path, progress))) {
            Ok(result) => result,
            Err(payload) => Err(Failure::new("host-panic", panic_message(&*payload))),
        }
    }

    /// Whether the Kind's CRD would accept `resource`'s spec as it is.
    fn spec_conforms(&self, resource: &Resource) -> bool {
        let (group, _) = host::gvk::split_api_version(&resource.api_version);
        self.schemas
            .get(&(group.to_owned(), resource.kind.clone()))
            .is_some_and(|s| !s.is_null() && crate::kube::conforms(&resource.spec, s, self.strict))
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned())
}

fn file_inner(
    checker: &Checker,
    path: &str,
    progress: &mut dyn FnMut(),
) -> Result<Outcome, Failure> {
    let mut outcome = Outcome::default();
    // As `host render` does: read, parse, then each document on its own.
    let text = match documents::read(path) {
        Ok(text) => text,
        Err(e) => {
            names_file(&e.to_string(), path)?;
            outcome.refused_file = true;
            return Ok(outcome);
        }
    };
    let docs = match documents::parse(path, &text) {
        Ok(docs) => docs,
        Err(e) => {
            names_file(&e.to_string(), path)?;
            outcome.refused_file = true;
            return Ok(outcome);
        }
    };
    match count_documents(&text) {
        Some(Ok(n)) if n != docs.len() => {
            return Err(Failure::new(
                "dropped-documents",
                format!(
                    "the file holds {n} document(s) but {} were read",
                    docs.len()
                ),
            ));
        }
        Some(Err(why)) => return Err(Failure::new("dropped-documents", why)),
        _ => {}
    }
    outcome.documents = docs.len();
    for doc in &docs {
        progress();
        match documents::resource(&doc.value) {
            Err(e) => {
                field_ok(&e.field, &["apiVersion", "kind", "metadata", "spec"])
                    .and_then(|()| message_ok(&e.problem))
                    .map_err(|why| {
                        Failure::new(
                            "unnamed-field",
                            format!("document {}: `{e}`: {why}", doc.index),
                        )
                    })?;
                outcome.refused += 1;
            }
            Ok(resource) => match resource_render(checker, &resource)? {
                Some(judged) => {
                    outcome.rendered += 1;
                    outcome.judged += usize::from(judged);
                }
                None => outcome.refused += 1,
            },
        }
    }
    Ok(outcome)
}

/// How many documents `text` holds, counted without `documents::parse` (a `List` counts its
/// items; the values are read as `host render` reads them), or why it should have been refused;
/// `None` when the text cannot be read.
fn count_documents(text: &str) -> Option<Result<usize, String>> {
    let values = host::documents::values(text).ok()?;
    let mut n = 0;
    for (i, v) in values.iter().enumerate() {
        let is_list = v["kind"].as_str().is_some_and(|k| k.ends_with("List"));
        match (v, v.get("items")) {
            (Value::Null, _) => {}
            (Value::Object(_), Some(items)) if is_list => match items {
                Value::Array(a) => n += a.len(),
                Value::Null => {}
                _ => {
                    return Some(Err(format!(
                        "document {} is a List whose items are not a list, and it was not refused",
                        i + 1
                    )));
                }
            },
            _ => n += 1,
        }
    }
    Some(Ok(n))
}

/// A file-level error must name the file and where in it: a line or a document.
fn names_file(error: &str, path: &str) -> Result<(), Failure> {
    if !error.contains(path) {
        return Err(Failure::new(
            "unnamed-file",
            format!("the error does not name {path}: {}", clip(error)),
        ));
    }
    if !(error.contains("line ") || error.contains("document ")) {
        return Err(Failure::new(
            "unplaced-error",
            format!("the error names no line or document: {}", clip(error)),
        ));
    }
    Ok(())
}

/// Whether `field` is a field path under one of `roots`, of sane length.
fn field_ok(field: &str, roots: &[&str]) -> Result<(), String> {
    if field.is_empty() {
        return Err("no field is named".into());
    }
    let under = |root: &str| {
        field == root
            || field
                .strip_prefix(root)
                .is_some_and(|rest| rest.starts_with(['.', '[']))
    };
    if !roots.iter().any(|r| under(r)) {
        return Err(format!(
            "`{}` is not under {}",
            clip(field),
            roots.join(", ")
        ));
    }
    let chars = field.chars().count();
    if chars > MAX_FIELD {
        return Err(format!(
            "the field path is {chars} characters long (at most {MAX_FIELD})"
        ));
    }
    Ok(())
}

fn message_ok(message: &str) -> Result<(), String> {
    if message.trim().is_empty() {
        return Err("the message is empty".into());
    }
    let chars = message.chars().count();
    if chars > MAX_MESSAGE {
        return Err(format!(
            "the message is {chars} characters long (at most {MAX_MESSAGE})"
        ));
    }
    Ok(())
}

/// `s` on one line (control characters escaped) and at most 120 characters long, for reports.
fn clip(s: &str) -> String {
    let line: String = s
        .chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect();
    match line.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
}

/// The guest library compiled into this binary, called as the component export calls it.
type Native = fn(WireResource, &Context) -> guest_kit::Result<Vec<String>>;

fn native(plugin: &str) -> Option<Native> {
    match plugin {
        "service" => Some(guest_kit::render_wire::<guest_service::ServicePlugin>),
        "datastore" => Some(guest_kit::render_wire::<guest_datastore::DatastorePlugin>),
        "kvcluster" => Some(guest_kit::render_wire::<guest_kvcluster::KvClusterPlugin>),
        _ => None,
    }
}

/// Renders one resource and checks the result: `None` when it was refused, else whether its
/// objects were judged as Kubernetes objects.
fn resource_render(checker: &Checker, resource: &Resource) -> Result<Option<bool>, Failure> {
    let registry = &checker.registry;
    let spec_len = resource.spec.to_string().len();
    let result = registry.render(resource);
    let who = format!("{}/{}", resource.kind, clip(&resource.name));
    if let Ok((plugin, _)) = registry.lookup(&resource.api_version, &resource.kind) {
        differential(plugin.name(), resource, registry.context(), &result)?;
    }
    match result {
        Ok(objects) => {
            metadata(&objects)
                .map_err(|why| Failure::new("bad-metadata", format!("{who}: {why}")))?;
            serialize(&objects)
                .map_err(|why| Failure::new("bad-output", format!("{who}: {why}")))?;
            // A spec the CRD takes must not render an object the API server refuses: that
            // failure would name the child's field, not the spec's.
            let judged = checker.spec_conforms(resource);
            if judged {
                for (i, o) in objects.iter().enumerate() {
                    crate::kube::valid_object(o).map_err(|why| {
                        Failure::new(
                            "invalid-object",
                            format!(
                                "{who}: object {i} ({}): {}",
                                o["kind"].as_str().unwrap_or("?"),
                                clip(&why)
                            ),
                        )
                    })?;
                }
            }
            Ok(Some(judged))
        }
        Err(RenderError::NoPlugin { .. } | RenderError::VersionNotServed { .. }) => Ok(None),
        // The host refused the spec before the plugin saw it: it must name the spec's field.
        Err(RenderError::InvalidSpec(e)) => {
            // A structural refusal (a type, a required or unknown field, an enum) of a spec the
            // fuzzer's own reading of the CRD takes would stall a resource the API server took.
            let structural = [
                "is required",
                "unknown field",
                "must be one of",
                "must be an integer or a string",
                "must be a string,",
                "must be an integer,",
                "must be a number,",
                "must be a boolean,",
                "must be an array,",
                "must be an object,",
            ]
            .iter()
            .any(|m| e.0.iter().any(|p| p.message.contains(m)));
            if structural && checker.spec_conforms(resource) {
                return Err(Failure::new(
                    "false-refusal",
                    format!(
                        "{who}: the CRD takes this spec, the host refused it: `{}`",
                        clip(&e.to_string())
                    ),
                ));
            }
            e.0.iter()
                .try_for_each(|p| {
                    field_ok(&p.field, &["spec"]).and_then(|()| message_ok(&p.message))
                })
                .map_err(|why| {
                    Failure::new(
                        "unnamed-field",
                        format!("{who}: `{}`: {why}", clip(&e.to_string())),
                    )
                })?;
            Ok(None)
        }
        Err(RenderError::Plugin { plugin, error }) => {
            let fail = |kind: &str| {
                Err(Failure::new(
                    kind,
                    format!("{who}: plugin {plugin}: {error}"),
                ))
            };
            match &error {
                PluginError::Render { field, message } => {
                    // Guests blame a spec field, or the resource's name (which they check).
                    field_ok(field, &["spec", "metadata.name"])
                        .and_then(|()| message_ok(message))
                        .map_err(|why| {
                            Failure::new(
                                "unnamed-field",
                                format!("{who}: `{}`: {why}", clip(&error.to_string())),
                            )
                        })?;
                    Ok(None)
                }
                PluginError::Panic(_) => fail("guest-panic"),
                PluginError::Trap(_) => fail("guest-trap"),
                // The host's instance pool was full: not the guest's doing.
                PluginError::Busy(_) => Ok(None),
                PluginError::Deadline(_)
                | PluginError::Memory { .. }
                | PluginError::OutputTooLarge { .. }
                | PluginError::HandedTooMuch { .. }
                | PluginError::ErrorTooLarge { .. }
                | PluginError::TooManyValues { .. }
                | PluginError::TooManyManifests { .. }
                    if spec_len >= LARGE_SPEC =>
                {
                    Ok(None)
                }
                PluginError::Deadline(_)
                | PluginError::Memory { .. }
                | PluginError::OutputTooLarge { .. }
                | PluginError::HandedTooMuch { .. }
                | PluginError::ErrorTooLarge { .. }
                | PluginError::TooManyValues { .. }
                | PluginError::TooManyManifests { .. }
                | PluginError::OverBudget { .. } => fail("guest-limit"),
                PluginError::BadManifest { .. }
                | PluginError::BadDescription(_)
                | PluginError::BadStatus(_)
                | PluginError::Guard(_) => fail("guest-refused"),
            }
        }
    }
}

/// The component and the same library compiled natively (with debug assertions: overflow
/// checks) must agree, and the native call must not panic.
fn differential(
    plugin: &str,
    resource: &Resource,
    ctx: &Context,
    wasm: &Result<Vec<Value>, RenderError>,
) -> Result<(), Failure> {
    let Some(render) = native(plugin) else {
        return Ok(());
    };
    let wire = WireResource::from_resource(resource);
    let native = catch_unwind(AssertUnwindSafe(|| render(wire, ctx))).map_err(|p| {
        Failure::new(
            "native-panic",
            format!("{}: {}", resource.kind, panic_message(&*p)),
        )
    })?;
    let agree = match (&native, wasm) {
        (Ok(texts), Ok(objects)) => {
            let parsed: Vec<Value> = texts
                .iter()
                .map(|t| serde_json::from_str(t).unwrap_or(Value::Null))
                .collect();
            &parsed == objects
        }
        (
            Err(n),
            Err(RenderError::Plugin {
                error: PluginError::Render { field, message },
                ..
            }),
        ) => &n.field == field && &n.message == message,
        // The host refused the spec: the plugin was not called.
        (_, Err(RenderError::InvalidSpec(_))) => true,
        // The sandbox's limits apply to the component only.
        (
            _,
            Err(RenderError::Plugin {
                error:
                    PluginError::Deadline(_)
                    | PluginError::Memory { .. }
                    | PluginError::OutputTooLarge { .. },
                ..
            }),
        ) => true,
        _ => false,
    };
    if agree {
        Ok(())
    } else {
        let show = |r: String| clip(&r);
        Err(Failure::new(
            "native-mismatch",
            format!(
                "{}: natively {}, as a component {}",
                resource.kind,
                show(match &native {
                    Ok(t) => format!("{} objects", t.len()),
                    Err(e) => e.to_string(),
                }),
                show(match wasm {
                    Ok(o) => format!("{} objects", o.len()),
                    Err(e) => e.to_string(),
                })
            ),
        ))
    }
}

/// The metadata the guests build (not what they pass through) must be what the API server takes:
/// names, namespaces, label keys and values, annotation keys.
fn metadata(objects: &[Value]) -> Result<(), String> {
    for (i, o) in objects.iter().enumerate() {
        let at = |p: &str| format!("object {i} ({}) {p}", o["kind"].as_str().unwrap_or("?"));
        let meta = &o["metadata"];
        if let Some(ns) = meta.get("namespace").and_then(Value::as_str) {
            dns_label(ns)
                .map_err(|why| format!("{}: `{}` {why}", at("metadata.namespace"), clip(ns)))?;
        }
        for (path, m) in [
            ("metadata", meta),
            ("spec.template.metadata", &o["spec"]["template"]["metadata"]),
            (
                "spec.jobTemplate.spec.template.metadata",
                &o["spec"]["jobTemplate"]["spec"]["template"]["metadata"],
            ),
        ] {
            labels(&m["labels"])
                .map_err(|why| format!("{}: {why}", at(&format!("{path}.labels"))))?;
            if let Some(a) = m.get("annotations") {
                let Some(a) = a.as_object() else {
                    return Err(format!("{}: not a map", at(&format!("{path}.annotations"))));
                };
                for (k, v) in a {
                    qualified_name(k).map_err(|why| {
                        format!(
                            "{}: key `{}` {why}",
                            at(&format!("{path}.annotations")),
                            clip(k)
                        )
                    })?;
                    if !v.is_string() {
                        return Err(format!(
                            "{}: `{k}` is not a string",
                            at(&format!("{path}.annotations"))
                        ));
                    }
                }
            }
        }
        labels(&o["spec"]["selector"]["matchLabels"])
            .map_err(|why| format!("{}: {why}", at("spec.selector.matchLabels")))?;
    }
    Ok(())
}

fn labels(v: &Value) -> Result<(), String> {
    let Some(m) = v.as_object() else {
        return if v.is_null() {
            Ok(())
        } else {
            Err("not a map".into())
        };
    };
    for (k, v) in m {
        qualified_name(k).map_err(|why| format!("key `{}` {why}", clip(k)))?;
        let Some(s) = v.as_str() else {
            return Err(format!("the value of `{k}` is not a string"));
        };
        if !s.is_empty() {
            label_name(s).map_err(|why| format!("the value `{}` of `{k}` {why}", clip(s)))?;
        }
    }
    Ok(())
}

/// A label value or the name part of a key: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both
/// ends.
fn label_name(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err("is not a valid label name or value".into())
    }
}

/// A label or annotation key: an optional DNS subdomain prefix and `/`, then a name.
fn qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix
        && guest_kit::spec::dns_subdomain("", p).is_err()
    {
        return Err("has a prefix that is not a DNS subdomain".into());
    }
    label_name(name)
}

/// A namespace: a DNS-1123 label (a leading digit is fine).
fn dns_label(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err("is not a DNS label".into())
    }
}

/// Writing the manifests must work in both formats, and YAML output read back must be what was
/// written (`kubectl` reads it as we do: YAML 1.1).
fn serialize(objects: &[Value]) -> Result<(), String> {
    documents::write(objects, Format::Json).map_err(|e| format!("JSON output: {e}"))?;
    let yaml = documents::write(objects, Format::Yaml).map_err(|e| format!("YAML output: {e}"))?;
    if yaml.len() > ROUND_TRIP_LIMIT {
        return Ok(());
    }
    // Read as `documents::parse` reads (YAML 1.1 octals), without its limit on nesting: output
    // nests passed-through fields deeper than the input had them, and kubectl has no such limit.
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    if let Some(budget) = options.budget.as_mut() {
        budget.max_depth = 10_000;
    }
    let back: Vec<Value> = serde_saphyr::from_multiple_with_options(&yaml, options)
        .map_err(|e| format!("YAML output does not parse: {e}"))?;
    if let Some(where_) = difference(objects, &back) {
        return Err(format!("YAML output reads back differently: {where_}"));
    }
    Ok(())
}

/// Where two lists of objects first differ, and how.
fn difference(wrote: &[Value], read: &[Value]) -> Option<String> {
    if wrote.len() != read.len() {
        return Some(format!(
            "{} objects written, {} read",
            wrote.len(),
            read.len()
        ));
    }
    wrote
        .iter()
        .zip(read)
        .enumerate()
        .find_map(|(i, (a, b))| leaf_difference(a, b, &format!("object {i}")))
}

fn leaf_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
            x.iter().find_map(|(k, v)| match y.get(k) {
                Some(w) => leaf_difference(v, w, &format!("{at}.{k}")),
                None => Some(format!("{at}: key `{}` is missing", clip(k))),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (v, w))| leaf_difference(v, w, &format!("{at}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!(
            "{at}: wrote {}, read {}",
            clip(&a.to_string()),
            clip(&b.to_string())
        )),
    }
}
