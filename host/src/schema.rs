//! A resource's spec checked against its Kind's schema before it is rendered, so that a field
//! the API server would refuse, prune or pass on as a value no child can hold is named as the
//! spec's field, not as a child's field the plugin copied it into.
//!
//! The schema is the structural OpenAPI v3 schema the Kind's CRD carries. A `$ref` to a
//! Kubernetes type is read through [`crate::kube_schema::inlined`], which holds each type once
//! for the process, as if it were inlined: a copy per Kind (every built-in Kind names the pod
//! template's types) held 12 MiB in a running operator. Checked: `type`, `enum`, `required`, fields the schema does not know (an error,
//! as `kubectl apply` with its default strict field validation makes it), `properties`,
//! `additionalProperties`, `items`, `x-kubernetes-int-or-string`,
//! `x-kubernetes-preserve-unknown-fields`, `nullable`, `minimum`/`maximum` (and their exclusive
//! forms), `minLength`/`maxLength`, `minItems`/`maxItems`, and the ranges of `format: int32`
//! and `int64`, which the API server does not check on custom resources but every Kubernetes
//! object a plugin copies the value into does. `pattern`, `anyOf`, `oneOf`, `allOf`, `not` and
//! CEL rules are left to the API server.
//!
//! As the API server does, a `null` is taken as the field being absent.

use serde_json::Value;

/// Why a spec does not fit its Kind's schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// The field, such as `spec.ports[0].containerPort`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// Every way a spec does not fit its Kind's schema, in the order of its fields: all of them at
/// once, so that one fix is not followed by the next refusal. The first [`PROBLEMS_KEPT`] are
/// kept, the rest only counted (the second field): a spec of a hundred thousand bad items costs
/// no more than one of a hundred.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecErrors(pub Vec<SpecError>, pub usize);

/// How many problems a message names before it counts the rest.
const PROBLEMS_SHOWN: usize = 10;
/// How many problems are kept; past that, they are counted.
pub const PROBLEMS_KEPT: usize = 100;

/// The problems found so far: the first [`PROBLEMS_KEPT`], and how many more.
#[derive(Default)]
struct Problems {
    kept: Vec<SpecError>,
    more: usize,
}

impl Problems {
    fn push(&mut self, problem: SpecError) {
        if self.kept.len() < PROBLEMS_KEPT {
            self.kept.push(problem);
        } else {
            self.more += 1;
        }
    }
}

impl SpecErrors {
    /// The first problem (there is always one).
    pub fn first(&self) -> &SpecError {
        &self.0[0]
    }
}

impl std::fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().take(PROBLEMS_SHOWN).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        let total = self.0.len() + self.1;
        if total > PROBLEMS_SHOWN {
            write!(f, "; and {} more", total - PROBLEMS_SHOWN)?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

/// How many known field names an unknown-field error lists.
const NAMES_SHOWN: usize = 12;

/// What to do with a field the schema does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownFields {
    /// Refuse it, as `kubectl apply` (strict field validation) does: for specs read from files.
    Refuse,
    /// Let it be: for resources read from the cluster, which the API server has already pruned
    /// against the CRD it holds; a field the plugin's schema lacks means the installed CRD is
    /// not the plugin's (a rollback, say), not that the user erred.
    Ignore,
}

/// Checks `value` (found at `path`, such as `spec`) against `schema`: every problem, or none.
pub fn check(
    schema: &Value,
    value: &Value,
    path: &str,
    unknown: UnknownFields,
) -> Result<(), SpecErrors> {
    let mut problems = Problems::default();
    walk(Node::of(schema), value, path, unknown, &mut problems);
    if problems.kept.is_empty() {
        Ok(())
    } else {
        Err(SpecErrors(problems.kept, problems.more))
    }
}

/// A node of a schema with its `$ref` to a Kubernetes type resolved: its own keys first, then
/// the type's, as [`crate::kube_schema::inline_refs`] merges them. An unknown type adds nothing
/// (the registry checks none of a Kind whose schema names one).
#[derive(Clone, Copy)]
struct Node<'a> {
    own: &'a Value,
    base: Option<&'a Value>,
}

impl<'a> Node<'a> {
    fn of(own: &'a Value) -> Self {
        let base = own
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(crate::kube_schema::inlined);
        Self { own, base }
    }

    fn get(self, key: &str) -> Option<&'a Value> {
        self.own
            .get(key)
            .or_else(|| self.base.and_then(|b| b.get(key)))
    }
}

/// The problems of `value` (at `path`) against `schema`, added to `out`. A value of the wrong
/// type is one problem: what is inside it is not looked at.
fn walk(schema: Node<'_>, value: &Value, path: &str, unknown: UnknownFields, out: &mut Problems) {
    let mut fail = |message: String| {
        out.push(SpecError {
            field: path.to_owned(),
            message,
        });
    };
    if value.is_null() {
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let mut shown: Vec<String> = options.iter().take(NAMES_SHOWN).map(brief).collect();
        if options.len() > NAMES_SHOWN {
            shown.push(format!("and {} more", options.len() - NAMES_SHOWN));
        }
        return fail(format!(
            "must be one of {}, not {}",
            shown.join(", "),
            brief(value)
        ));
    }
    if flag(schema, "x-kubernetes-int-or-string") {
        return match value {
            Value::String(_) => check_string(schema, value, path, out),
            Value::Number(n) if whole(n) => check_number(schema, value, path, out),
            _ => fail(format!(
                "must be an integer or a string, not {}",
                describe(value)
            )),
        };
    }
    match (schema.get("type").and_then(Value::as_str), value) {
        (Some("string"), Value::String(_)) => check_string(schema, value, path, out),
        (Some("boolean"), Value::Bool(_)) => {}
        (Some("integer"), Value::Number(n)) if whole(n) => check_number(schema, value, path, out),
        (Some("number"), Value::Number(_)) => check_number(schema, value, path, out),
        (Some("array"), Value::Array(items)) => check_array(schema, items, path, unknown, out),
        (Some("object") | None, Value::Object(fields)) => {
            check_object(schema, fields, path, unknown, out);
        }
        // No type: any value (under `x-kubernetes-preserve-unknown-fields`).
        (None, _) => {}
        (Some(expected), _) => fail(format!(
            "must be {}, not {}",
            article(expected),
            describe(value)
        )),
    }
}

/// Whether `n` is an integer: the API server takes `1.0` where it wants one, as kubectl's YAML
/// reading does.
fn whole(n: &serde_json::Number) -> bool {
    n.is_i64()
        || n.is_u64()
        || n.as_f64()
            .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
}

fn check_object(
    schema: Node<'_>,
    fields: &serde_json::Map<String, Value>,
    path: &str,
    unknown: UnknownFields,
    out: &mut Problems,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let nullable = properties
            .and_then(|p| p.get(name))
            .is_some_and(|s| flag(Node::of(s), "nullable"));
        let absent = match fields.get(name) {
            None => true,
            Some(Value::Null) => !nullable,
            Some(_) => false,
        };
        if absent {
            out.push(SpecError {
                field: join(path, name),
                message: "is required".to_owned(),
            });
        }
    }
    let additional = schema.get("additionalProperties");
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields")
        || flag(schema, "x-kubernetes-embedded-resource");
    for (name, child) in fields {
        let at = join(path, name);
        match (properties.and_then(|p| p.get(name)), additional) {
            (Some(s), _) => walk(Node::of(s), child, &at, unknown, out),
            (None, Some(s @ Value::Object(_))) => walk(Node::of(s), child, &at, unknown, out),
            (None, Some(Value::Bool(true))) => {}
            (None, _) if preserve || unknown == UnknownFields::Ignore => {}
            (None, _) => {
                let mut known: Vec<&str> = properties
                    .into_iter()
                    .flat_map(|p| p.keys())
                    .map(String::as_str)
                    .collect();
                let more = known.len().saturating_sub(NAMES_SHOWN);
                known.truncate(NAMES_SHOWN);
                let listed = match (known.is_empty(), more) {
                    (true, _) => "it takes no fields".to_owned(),
                    (false, 0) => format!("known fields: {}", known.join(", ")),
                    (false, n) => format!("known fields: {}, and {n} more", known.join(", ")),
                };
                out.push(SpecError {
                    field: at,
                    message: format!("unknown field ({listed})"),
                });
            }
        }
    }
    let count = fields.values().filter(|v| !v.is_null()).count();
    bounds(
        schema,
        "minProperties",
        "maxProperties",
        count,
        "fields",
        path,
        out,
    );
}

fn check_array(
    schema: Node<'_>,
    items: &[Value],
    path: &str,
    unknown: UnknownFields,
    out: &mut Problems,
) {
    if let Some(item) = schema.get("items").filter(|i| i.is_object()) {
        for (i, v) in items.iter().enumerate() {
            walk(Node::of(item), v, &format!("{path}[{i}]"), unknown, out);
        }
    }
    bounds(
        schema,
        "minItems",
        "maxItems",
        items.len(),
        "items",
        path,
        out,
    );
}

fn check_string(schema: Node<'_>, value: &Value, path: &str, out: &mut Problems) {
    let chars = value.as_str().map_or(0, |s| s.chars().count());
    bounds(
        schema,
        "minLength",
        "maxLength",
        chars,
        "characters",
        path,
        out,
    );
}

fn check_number(schema: Node<'_>, value: &Value, path: &str, out: &mut Problems) {
    let mut fail = |message: String| {
        out.push(SpecError {
            field: path.to_owned(),
            message,
        });
    };
    let range = match schema.get("format").and_then(Value::as_str) {
        Some("int32") => Some((i64::from(i32::MIN), i64::from(i32::MAX), "32")),
        Some("int64") => Some((i64::MIN, i64::MAX, "64")),
        _ => None,
    };
    let in_range = |n: &serde_json::Number, low: i64, high: i64| match n.as_i64() {
        Some(v) => (low..=high).contains(&v),
        None if n.is_u64() => false,
        // A whole float: compared as one (2^63 rounds to i64::MAX as f64, and is out).
        None => n
            .as_f64()
            .is_some_and(|f| f >= low as f64 && f < (high as f64) + 1.0),
    };
    if let (Some((low, high, bits)), Value::Number(n)) = (range, value)
        && whole(n)
        && !in_range(n, low, high)
    {
        return fail(format!(
            "{n} is out of range for a {bits}-bit integer ({low} to {high})"
        ));
    }
    let Some(v) = value.as_f64() else {
        return;
    };
    // (bound, its exclusive flag, which side of it is beyond, the words)
    let limits = [
        (
            "minimum",
            "exclusiveMinimum",
            -1.0,
            ["at least", "greater than"],
        ),
        ("maximum", "exclusiveMaximum", 1.0, ["at most", "less than"]),
    ];
    for (key, exclusive_key, side, words) in limits {
        let Some(bound) = schema.get(key).and_then(Value::as_f64) else {
            continue;
        };
        let exclusive = flag(schema, exclusive_key);
        let excess = side * (v - bound);
        if excess > 0.0 || (exclusive && excess == 0.0) {
            let op = words[usize::from(exclusive)];
            return fail(format!("must be {op} {bound}, not {value}"));
        }
    }
}

/// Checks a count against the schema's `min_key` and `max_key`.
fn bounds(
    schema: Node<'_>,
    min_key: &str,
    max_key: &str,
    count: usize,
    what: &str,
    path: &str,
    out: &mut Problems,
) {
    let get = |k: &str| schema.get(k).and_then(Value::as_u64);
    let count64 = count as u64;
    let message = match (get(min_key), get(max_key)) {
        (Some(min), _) if count64 < min => format!("must have at least {min} {what}, not {count}"),
        (_, Some(max)) if count64 > max => format!("must have at most {max} {what}, not {count}"),
        _ => return,
    };
    out.push(SpecError {
        field: path.to_owned(),
        message,
    });
}

fn flag(schema: Node<'_>, key: &str) -> bool {
    schema.get(key) == Some(&Value::Bool(true))
}

/// How many characters of a field's name a path shows.
const NAME_SHOWN: usize = 40;

/// `path` and the field `name` in it: `.name`, or `["name"]` for a name that needs quoting; a
/// long name is cut, so that a path stays readable whatever the input.
fn join(path: &str, name: &str) -> String {
    let simple = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let shown = if name.chars().count() > NAME_SHOWN {
        format!("{}…", name.chars().take(NAME_SHOWN).collect::<String>())
    } else {
        name.to_owned()
    };
    if simple {
        format!("{path}.{shown}")
    } else {
        format!("{path}[{}]", Value::String(shown))
    }
}

fn article(t: &str) -> String {
    match t {
        "integer" | "object" | "array" => format!("an {t}"),
        _ => format!("a {t}"),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(_) => "a boolean".to_owned(),
        Value::Number(n) if n.is_i64() || n.is_u64() => format!("the integer {n}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(_) => format!("the string {}", brief(v)),
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// `v` as JSON, cut to a readable length.
fn brief(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 60 {
        format!("{}…", text.chars().take(60).collect::<String>())
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["image"],
            "properties": {
                "image": {
                    "type": "object",
                    "required": ["repository"],
                    "properties": {
                        "repository": { "type": "string", "minLength": 1 },
                        "tag": { "type": "string" },
                        "pullPolicy": { "type": "string", "enum": ["Always", "IfNotPresent", "Never"] },
                    },
                },
                "replicas": { "type": "integer", "format": "int32", "minimum": 0 },
                "ports": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {
                            "containerPort": { "type": "integer", "format": "int32" },
                            "targetPort": { "x-kubernetes-int-or-string": true },
                        },
                    },
                },
                "labels": { "type": "object", "additionalProperties": { "type": "string" } },
                "extra": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                "ratio": { "type": "number", "exclusiveMaximum": true, "maximum": 1 },
            },
        })
    }

    fn err(spec: Value) -> (String, String) {
        let e = check(&schema(), &spec, "spec", UnknownFields::Refuse).expect_err("refused");
        let first = e.first().clone();
        (first.field, first.message)
    }

    #[test]
    fn a_kubernetes_type_named_by_ref_is_checked_as_if_inlined() {
        let schema = json!({
            "type": "object",
            "properties": {
                "sidecars": {
                    "type": "array",
                    "items": { "$ref": "#/definitions/io.k8s.api.core.v1.Container" },
                },
                // Its own keys come before the type's, as inlining merges them.
                "resources": {
                    "$ref": "#/definitions/io.k8s.api.core.v1.ResourceRequirements",
                    "maxProperties": 1,
                },
            },
        });
        let check = |spec: Value| check(&schema, &spec, "spec", UnknownFields::Refuse);
        assert_eq!(
            check(
                json!({ "sidecars": [{ "name": "a", "image": "b", "ports": [{ "containerPort": 80 }] }] })
            ),
            Ok(())
        );
        let e =
            check(json!({ "sidecars": [{ "name": "a", "ports": [{ "containerPort": "80" }] }] }))
                .expect_err("a string port refused");
        assert_eq!(e.first().field, "spec.sidecars[0].ports[0].containerPort");
        assert!(e.first().message.contains("must be an integer"), "{e}");
        let e = check(json!({ "sidecars": [{ "name": "a", "imag": "b" }] })).expect_err("refused");
        assert_eq!(e.first().field, "spec.sidecars[0].imag");
        let e =
            check(json!({ "resources": { "limits": {}, "requests": {} } })).expect_err("refused");
        assert_eq!(e.first().field, "spec.resources");
        assert!(e.first().message.contains("at most 1 fields"), "{e}");
    }

    #[test]
    fn a_spec_that_fits_passes() {
        let spec = json!({
            "image": { "repository": "nginx", "tag": null, "pullPolicy": "Always" },
            "replicas": 2,
            "ports": [{ "containerPort": 80, "targetPort": "http" }, { "targetPort": 8080 }],
            "labels": { "a": "b" },
            "extra": { "anything": [1, 2] },
            "ratio": 0.5,
        });
        assert_eq!(
            check(&schema(), &spec, "spec", UnknownFields::Refuse),
            Ok(())
        );
    }

    #[test]
    fn each_defect_names_its_field() {
        let image = json!({ "repository": "nginx" });
        let mut long_key = serde_json::Map::new();
        long_key.insert("x".repeat(1000), json!(1));
        let long_path = format!("spec.labels.{}…", "x".repeat(40));
        let cases = [
            (json!({}), "spec.image", "is required"),
            (
                json!({ "image": {} }),
                "spec.image.repository",
                "is required",
            ),
            (
                json!({ "image": { "repository": "" } }),
                "spec.image.repository",
                "at least 1 characters",
            ),
            (
                json!({ "image": { "repository": 5 } }),
                "spec.image.repository",
                "must be a string, not the integer 5",
            ),
            (
                json!({ "image": { "repository": "x", "pullPolicy": "Sometimes" } }),
                "spec.image.pullPolicy",
                "must be one of",
            ),
            (
                json!({ "image": image, "replicas": "two" }),
                "spec.replicas",
                "must be an integer, not the string \"two\"",
            ),
            (
                json!({ "image": image, "replicas": 1.5 }),
                "spec.replicas",
                "must be an integer, not the number 1.5",
            ),
            (
                json!({ "image": image, "replicas": -1 }),
                "spec.replicas",
                "must be at least 0",
            ),
            (
                json!({ "image": image, "replicas": 2_147_483_648_i64 }),
                "spec.replicas",
                "out of range for a 32-bit integer",
            ),
            (
                json!({ "image": image, "ports": [{ "containerPort": i64::MIN }] }),
                "spec.ports[0].containerPort",
                "out of range",
            ),
            (
                json!({ "image": image, "ports": [{ "targetPort": true }] }),
                "spec.ports[0].targetPort",
                "an integer or a string",
            ),
            (
                json!({ "image": image, "ports": [{}, {}, {}] }),
                "spec.ports",
                "at most 2 items",
            ),
            (
                json!({ "image": image, "labels": { "a": 1 } }),
                "spec.labels.a",
                "must be a string",
            ),
            (
                json!({ "image": image, "ratio": 1 }),
                "spec.ratio",
                "less than 1",
            ),
            (
                json!({ "image": image, "replica": 2 }),
                "spec.replica",
                "unknown field (known fields: extra, image, labels",
            ),
            (
                json!({ "image": image, "labels": { "a.b/c": 1 } }),
                "spec.labels[\"a.b/c\"]",
                "must be a string",
            ),
            (
                json!({ "image": image, "ports": {} }),
                "spec.ports",
                "must be an array, not an object",
            ),
            (
                json!({ "image": image, "labels": long_key }),
                long_path.as_str(),
                "must be a string",
            ),
        ];
        for (spec, field, message) in cases {
            let (f, m) = err(spec.clone());
            assert_eq!(f, field, "{spec}: {m}");
            assert!(m.contains(message), "{spec}: {m}");
        }
    }

    #[test]
    fn what_the_api_server_takes_passes() {
        let ok = |schema: Value, v: Value| {
            assert_eq!(
                check(&schema, &v, "spec", UnknownFields::Refuse),
                Ok(()),
                "{schema} {v}"
            );
        };
        // A whole float is an integer, as kubectl reads YAML.
        ok(json!({ "type": "integer", "format": "int32" }), json!(2.0));
        ok(json!({ "x-kubernetes-int-or-string": true }), json!(8080.0));
        // A null in a nullable field is kept, and counts as present.
        ok(
            json!({ "type": "object", "required": ["a"], "properties": { "a": { "type": "string", "nullable": true } } }),
            json!({ "a": null }),
        );
        // No type: anything.
        ok(
            json!({ "x-kubernetes-preserve-unknown-fields": true, "properties": { "a": { "type": "string" } } }),
            json!(5),
        );
        let e = check(
            &json!({ "type": "integer", "format": "int32" }),
            &json!(3e9),
            "spec.n",
            UnknownFields::Refuse,
        )
        .expect_err("refused");
        assert!(e.first().message.contains("out of range"), "{e}");
    }

    #[test]
    fn unknown_fields_may_be_let_be() {
        let spec = json!({ "image": { "repository": "x", "digest": "sha256:0" }, "replica": 1 });
        assert_eq!(
            check(&schema(), &spec, "spec", UnknownFields::Ignore),
            Ok(())
        );
        assert!(check(&schema(), &spec, "spec", UnknownFields::Refuse).is_err());
    }

    #[test]
    fn the_uint64_above_int64_is_out_of_range_too() {
        let s = json!({ "type": "integer", "format": "int64" });
        let e = check(&s, &json!(u64::MAX), "spec.n", UnknownFields::Refuse).expect_err("refused");
        assert!(
            e.first()
                .message
                .contains("out of range for a 64-bit integer"),
            "{e}"
        );
    }

    #[test]
    fn every_problem_is_said_at_once() {
        let spec = json!({
            "image": { "pullPolicy": "Sometimes" },
            "replicas": -1,
            "ports": [{ "containerPort": "80" }, {}, {}],
            "replica": 1,
        });
        let e = check(&schema(), &spec, "spec", UnknownFields::Refuse).expect_err("refused");
        let mut fields: Vec<&str> = e.0.iter().map(|p| p.field.as_str()).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "spec.image.pullPolicy",
                "spec.image.repository",
                "spec.ports",
                "spec.ports[0].containerPort",
                "spec.replica",
                "spec.replicas",
            ],
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("spec.image.repository: is required; "),
            "{e}"
        );
    }

    #[test]
    fn problems_past_the_first_hundred_are_counted_not_kept() {
        let schema = json!({ "type": "array", "items": { "type": "integer" } });
        let spec = Value::Array(vec![json!("x"); 5000]);
        let e = check(&schema, &spec, "spec.n", UnknownFields::Refuse).expect_err("refused");
        assert_eq!((e.0.len(), e.1), (PROBLEMS_KEPT, 5000 - PROBLEMS_KEPT));
        assert!(e.to_string().ends_with("; and 4990 more"), "{e}");
    }
}
