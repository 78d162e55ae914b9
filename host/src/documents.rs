//! Reading resources from YAML or JSON and writing manifests.

use std::collections::BTreeMap;
use std::io::Read;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::types::Resource;

/// One object of an input file, with its 1-based document number.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// Position in the file (items of a `List` share their list's number).
    pub index: usize,
    /// The object.
    pub value: Value,
}

/// Expands the command line's inputs: a directory stands for its `.yaml`, `.yml` and `.json`
/// files, sorted by name; `-` is standard input.
pub fn expand(inputs: &[String]) -> Result<Vec<String>> {
    let mut files = Vec::new();
    for input in inputs {
        let path = std::path::Path::new(input);
        if input != "-" && path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|source| Error::ReadInput {
                path: input.clone(),
                source,
            })?;
            let mut found: Vec<String> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
                })
                .map(|p| p.display().to_string())
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(input.clone());
        }
    }
    Ok(files)
}

/// Reads a file, or standard input for `-`.
pub fn read(path: &str) -> Result<String> {
    let mut text = String::new();
    let result = if path == "-" {
        std::io::stdin().read_to_string(&mut text).map(drop)
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    result.map_err(|source| Error::ReadInput {
        path: display(path),
        source,
    })?;
    Ok(text)
}

fn display(path: &str) -> String {
    if path == "-" {
        "<stdin>".to_owned()
    } else {
        path.to_owned()
    }
}

/// Parses multi-document YAML, or JSON (one or more values, or an array), into objects. A
/// `List` (`items`) is expanded; empty documents are skipped.
pub fn parse(path: &str, text: &str) -> Result<Vec<Document>> {
    let fail = |reason: String| Error::ParseInput {
        path: display(path),
        reason,
    };
    let trimmed = text.trim_start();
    let values: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| fail(format!("invalid JSON: {e}")))?
            .into_iter()
            .flat_map(|v| match v {
                Value::Array(items) => items,
                other => vec![other],
            })
            .collect()
    } else {
        {
            // kubectl reads YAML 1.1: `defaultMode: 0644` is octal (420), not six hundred and
            // forty-four. Read it the same way, or file modes would silently change.
            let mut options = serde_saphyr::Options::default();
            options.legacy_octal_numbers = true;
            serde_saphyr::from_multiple_with_options::<Value>(text, options)
                .map_err(|e| fail(format!("invalid YAML: {e}")))?
        }
    };
    let mut docs = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        let index = i + 1;
        match value {
            Value::Null => {}
            Value::Object(ref m)
                if m.get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List"))
                    && m.contains_key("items") =>
            {
                if let Some(Value::Array(items)) = m.get("items") {
                    docs.extend(items.iter().map(|item| Document {
                        index,
                        value: item.clone(),
                    }));
                }
            }
            Value::Object(_) => docs.push(Document { index, value }),
            other => {
                return Err(fail(format!(
                    "document {index} is not an object but {}",
                    kind_of(&other)
                )));
            }
        }
    }
    Ok(docs)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Builds the resource a document describes. Errors name the field.
pub fn resource(value: &Value) -> std::result::Result<Resource, String> {
    let str_field = |path: &[&str]| -> std::result::Result<Option<String>, String> {
        let mut v = value;
        for p in path {
            match v.get(p) {
                Some(next) => v = next,
                None => return Ok(None),
            }
        }
        match v {
            Value::String(s) => Ok(Some(s.clone())),
            Value::Null => Ok(None),
            _ => Err(format!("{}: must be a string", path.join("."))),
        }
    };
    let api_version = str_field(&["apiVersion"])?.ok_or("apiVersion: is required")?;
    let kind = str_field(&["kind"])?.ok_or("kind: is required")?;
    let name = str_field(&["metadata", "name"])?.ok_or("metadata.name: is required")?;
    let namespace = str_field(&["metadata", "namespace"])?.unwrap_or_else(|| "default".to_owned());
    let uid = str_field(&["metadata", "uid"])?.unwrap_or_default();
    let generation = value
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let map = |key: &str| -> std::result::Result<BTreeMap<String, String>, String> {
        match value.get("metadata").and_then(|m| m.get(key)) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    _ => Err(format!("metadata.{key}.{k}: must be a string")),
                })
                .collect(),
            Some(_) => Err(format!("metadata.{key}: must be a map of strings")),
        }
    };
    let labels = map("labels")?;
    let annotations = map("annotations")?;
    let spec = match value.get("spec") {
        None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
        Some(s @ Value::Object(_)) => s.clone(),
        Some(_) => return Err("spec: must be an object".into()),
    };
    Ok(Resource {
        api_version,
        kind,
        name,
        namespace,
        uid,
        generation,
        labels,
        annotations,
        spec,
    })
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Multi-document YAML.
    #[default]
    Yaml,
    /// A `v1` `List` in JSON.
    Json,
}

/// Writes objects as multi-document YAML or a JSON `List`.
pub fn write(objects: &[Value], format: Format) -> Result<String> {
    match format {
        Format::Yaml => {
            let mut out = String::new();
            for o in objects {
                out.push_str("---\n");
                out.push_str(
                    &serde_saphyr::to_string(o).map_err(|e| Error::Output(e.to_string()))?,
                );
            }
            Ok(out)
        }
        Format::Json => {
            let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": objects });
            let mut s =
                serde_json::to_string_pretty(&list).map_err(|e| Error::Output(e.to_string()))?;
            s.push('\n');
            Ok(s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_reads_numbers_as_kubectl_does() {
        let docs = parse(
            "t.yaml",
            "a: 0644\nb: 2\nc: \"0644\"\nd: 1.5\n---\ne: {m: 0400}\n",
        )
        .unwrap();
        assert_eq!(
            docs[0].value,
            serde_json::json!({"a": 420, "b": 2, "c": "0644", "d": 1.5})
        );
        assert_eq!(docs[1].value, serde_json::json!({"e": {"m": 256}}));
    }
}
