//! Resources for every Kind: specs generated from the Kind's own OpenAPI schema (with the
//! Kubernetes types it names inlined, as its CRD has them), and the fixtures of `tests/data`
//! mutated.

use serde_json::{Map, Value, json};

use crate::rng::Rng;
use crate::values;

/// A Kind the plugins serve, with what the fuzzer needs to make resources of it.
#[derive(Debug, Clone)]
pub struct Kind {
    /// `group/version`.
    pub api_version: String,
    /// The Kind.
    pub kind: String,
    /// The spec's schema, `$ref`s inlined.
    pub schema: Value,
    /// The fixtures of this Kind (whole resources).
    pub fixtures: Vec<Value>,
}

/// How deep generated objects go before only required fields are filled in.
const MAX_DEPTH: usize = 7;

/// A resource of a random Kind: spec from the schema, or a fixture mutated (one of its own Kind's
/// or, now and then, another Kind's), with usually valid and sometimes broken metadata.
pub fn resource(rng: &mut Rng, kinds: &[Kind], all_fixtures: &[Value]) -> Value {
    let kind = rng.pick(kinds);
    let own = if kind.fixtures.is_empty() || rng.one_in(10) {
        all_fixtures
    } else {
        &kind.fixtures
    };
    let (spec, metadata) = if rng.percent(35) || own.is_empty() {
        (from_schema(rng, &kind.schema, 0), None)
    } else {
        let fixture = rng.pick(own);
        let mut spec = fixture.get("spec").cloned().unwrap_or_else(|| json!({}));
        for _ in 0..rng.between(1, 4) {
            mutate(rng, &mut spec, &kind.schema);
        }
        (spec, fixture.get("metadata").cloned())
    };
    let mut metadata =
        metadata.unwrap_or_else(|| json!({ "name": "fuzz", "namespace": "default" }));
    if rng.percent(20) {
        mutate_metadata(rng, &mut metadata);
    }
    let mut r = json!({
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": metadata,
        "spec": spec,
    });
    if rng.one_in(50) {
        r["spec"] = values::scalar(rng);
    }
    r
}

fn mutate_metadata(rng: &mut Rng, metadata: &mut Value) {
    let Some(m) = metadata.as_object_mut() else {
        return;
    };
    match rng.below(8) {
        0..=2 => {
            m.insert("name".into(), values::string(rng).into());
        }
        3 => {
            m.insert(
                "name".into(),
                values::label_of_len(*rng.pick(&[44, 45, 46, 55, 56, 60, 61, 63, 64])).into(),
            );
        }
        4 => {
            m.insert("namespace".into(), values::string(rng).into());
        }
        5 => {
            m.insert(
                (*rng.pick(&["labels", "annotations"])).to_owned(),
                json!({ values::string(rng): values::scalar(rng) }),
            );
        }
        6 => {
            m.insert(
                (*rng.pick(&["uid", "generation", "name", "namespace"])).to_owned(),
                values::scalar(rng),
            );
        }
        _ => {
            m.remove(*rng.pick(&["name", "namespace"]));
        }
    }
}

/// A value for `schema`: right type and shape most of the time, wrong type now and then.
pub fn from_schema(rng: &mut Rng, schema: &Value, depth: usize) -> Value {
    if rng.one_in(30) {
        return values::any(rng, 2);
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.is_empty()
        && rng.percent(85)
    {
        return rng.pick(options).clone();
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return if rng.one_in(2) {
            values::number(rng)
        } else {
            Value::String(values::string(rng))
        };
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array)
            && !options.is_empty()
        {
            let i = rng.below(options.len());
            return from_schema(rng, &options[i], depth);
        }
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts.first().and_then(Value::as_str).unwrap_or(""),
        _ if schema.get("properties").is_some() => "object",
        _ => "",
    };
    match ty {
        "string" => Value::String(values::string(rng)),
        "integer" | "number" => values::number(rng),
        "boolean" => Value::Bool(rng.one_in(2)),
        "array" => {
            let items = schema.get("items").cloned().unwrap_or(Value::Null);
            let n = if depth >= MAX_DEPTH { 0 } else { rng.count() };
            let n = if depth > 2 { n.min(5) } else { n };
            Value::Array(
                (0..n)
                    .map(|_| from_schema(rng, &items, depth + 1))
                    .collect(),
            )
        }
        "object" => object(rng, schema, depth),
        _ => values::any(rng, 2),
    }
}

fn object(rng: &mut Rng, schema: &Value, depth: usize) -> Value {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut m = Map::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        // Top level: about a third of the fields; deeper, fewer.
        let chance = 35 / (depth + 1);
        for (k, sub) in props {
            let wanted = if required.contains(&k.as_str()) {
                !rng.one_in(25)
            } else {
                depth < MAX_DEPTH && rng.percent(chance)
            };
            if wanted {
                m.insert(k.clone(), from_schema(rng, sub, depth + 1));
            }
        }
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        for _ in 0..rng.count().min(8) {
            m.insert(map_key(rng), from_schema(rng, extra, depth + 1));
        }
    }
    if rng.one_in(30) {
        m.insert(values::string(rng), values::scalar(rng));
    }
    Value::Object(m)
}

/// A key for a string map (labels, annotations, node selectors): valid ones and near misses.
fn map_key(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => (*rng.pick(&[
            "team",
            "tier",
            "app",
            "app.kubernetes.io/name",
            "example.com/owner",
        ]))
        .to_owned(),
        _ => values::string(rng),
    }
}

/// One step of a path into a value.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn paths(v: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(prefix.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(Step::Key(k.clone()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Step::Index(i));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, step| match step {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

/// The schema of the value at `path`, following properties, items and additionalProperties.
fn schema_at<'a>(schema: &'a Value, path: &[Step]) -> Option<&'a Value> {
    path.iter().try_fold(schema, |s, step| match step {
        Step::Key(k) => s
            .get("properties")
            .and_then(|p| p.get(k.as_str()))
            .or_else(|| s.get("additionalProperties").filter(|a| a.is_object())),
        Step::Index(_) => s.get("items"),
    })
}

/// One mutation somewhere in `spec`: delete, replace (with a value of the right shape, a scalar
/// of any type, or anything), grow a list, stretch a string, add a field, wrap or nest deeply.
pub fn mutate(rng: &mut Rng, spec: &mut Value, schema: &Value) {
    let mut all = Vec::new();
    paths(spec, &mut Vec::new(), &mut all);
    let path = rng.pick(&all).clone();
    let sub_schema = schema_at(schema, &path).cloned().unwrap_or(Value::Null);
    let op = rng.below(12);
    if op == 0 && !path.is_empty() {
        let (last, parent) = path.split_last().expect("not the root");
        if let Some(parent) = at_mut(spec, parent) {
            match (parent, last) {
                (Value::Object(m), Step::Key(k)) => {
                    m.remove(k);
                }
                (Value::Array(a), Step::Index(i)) if *i < a.len() => {
                    a.remove(*i);
                }
                _ => {}
            }
        }
        return;
    }
    let Some(node) = at_mut(spec, &path) else {
        return;
    };
    match op {
        1 | 2 => *node = from_schema(rng, &sub_schema, 1),
        3 => *node = values::scalar(rng),
        4 => *node = values::any(rng, 3),
        5 => match node {
            Value::Array(a) if !a.is_empty() => {
                let item = rng.pick(a).clone();
                // At most about 300 KB more: large, but not a test of the disk.
                let room = 300_000 / item.to_string().len().max(1);
                let n = (*rng.pick(&[1, 2, 10, 100, 1_000, 5_000])).min(room.max(1));
                a.extend(std::iter::repeat_n(item, n));
            }
            Value::Array(a) => a.push(from_schema(
                rng,
                sub_schema.get("items").unwrap_or(&Value::Null),
                1,
            )),
            other => *other = Value::Array(vec![other.clone()]),
        },
        6 => match node {
            Value::String(s) => {
                *s = match rng.below(6) {
                    0 => s.repeat(
                        (*rng.pick(&[2, 10, 1_000, 20_000]))
                            .min(200_000 / s.len().max(1))
                            .max(1),
                    ),
                    1 => s.to_uppercase(),
                    2 => String::new(),
                    3 => format!(" {s}"),
                    4 => format!("{s}{}", values::random_chars(rng, 1, 3)),
                    _ => format!("{s}{}", rng.pick(values::STRINGS)),
                }
            }
            other => *other = Value::String(values::string(rng)),
        },
        7 => *node = values::number(rng),
        8 => {
            if let Value::Object(m) = node {
                let key = match sub_schema.get("properties").and_then(Value::as_object) {
                    Some(props) if !props.is_empty() && !rng.one_in(4) => {
                        let keys: Vec<&String> = props.keys().collect();
                        (*rng.pick(&keys)).clone()
                    }
                    _ => values::string(rng),
                };
                let value = from_schema(
                    rng,
                    sub_schema
                        .get("properties")
                        .and_then(|p| p.get(key.as_str()))
                        .unwrap_or(&Value::Null),
                    1,
                );
                m.insert(key, value);
            } else {
                *node = values::scalar(rng);
            }
        }
        9 => {
            let depth = *rng.pick(&[2, 10, 60, 120, 126, 127, 128, 200]);
            let mut v = node.take();
            for _ in 0..depth {
                v = if rng.one_in(2) {
                    Value::Array(vec![v])
                } else {
                    json!({ "a": v })
                };
            }
            *node = v;
        }
        10 => {
            *node = match node.take() {
                Value::Array(a) => Value::Object(
                    a.into_iter()
                        .enumerate()
                        .map(|(i, v)| (i.to_string(), v))
                        .collect(),
                ),
                Value::Object(m) => Value::Array(m.into_iter().map(|(_, v)| v).collect()),
                other => json!({ "value": other }),
            }
        }
        _ => *node = Value::Null,
    }
}
