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

/// Reads a file, or standard input for `-`. Text that is not UTF-8 is refused with the line and
/// column of the first byte that is not.
pub fn read(path: &str) -> Result<String> {
    let mut bytes = Vec::new();
    let result = if path == "-" {
        std::io::stdin().read_to_end(&mut bytes).map(drop)
    } else {
        std::fs::read(path).map(|b| bytes = b)
    };
    let fail = |source| Error::ReadInput {
        path: display(path),
        source,
    };
    result.map_err(fail)?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let line_start = bytes[..at]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        fail(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "not UTF-8: byte 0x{:02x} at line {line}, column {}",
                bytes[at],
                at - line_start + 1
            ),
        ))
    })
}

fn display(path: &str) -> String {
    if path == "-" {
        "<stdin>".to_owned()
    } else {
        path.to_owned()
    }
}

/// The values of multi-document YAML, or of JSON (one or more values, or an array), as
/// kubectl reads them, before any `List` is expanded; or why the text is neither.
pub fn values(text: &str) -> std::result::Result<Vec<Value>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        Ok(serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| format!("invalid JSON: {e}"))?
            .into_iter()
            .flat_map(|v| match v {
                Value::Array(items) => items,
                other => vec![other],
            })
            .collect())
    } else {
        // kubectl reads YAML 1.1: `defaultMode: 0644` is octal (420), not six hundred and
        // forty-four. Read it the same way, or file modes would silently change.
        let mut options = serde_saphyr::Options::default();
        options.legacy_octal_numbers = true;
        serde_saphyr::from_multiple_with_options::<Value>(text, options)
            .map_err(|e| format!("invalid YAML: {e}"))
    }
}

/// Parses multi-document YAML, or JSON (one or more values, or an array), into objects. A
/// `List` (`items`) is expanded; empty documents are skipped.
pub fn parse(path: &str, text: &str) -> Result<Vec<Document>> {
    let fail = |reason: String| Error::ParseInput {
        path: display(path),
        reason,
    };
    let values = values(text).map_err(fail)?;
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
                // Every item is rendered or refused: none may be dropped without a word.
                let items = match m.get("items") {
                    Some(Value::Array(items)) => items.as_slice(),
                    Some(Value::Null) => &[],
                    Some(other) => {
                        return Err(fail(format!(
                            "document {index}: `items` of a List must be a list, not {}",
                            kind_of(other)
                        )));
                    }
                    None => &[],
                };
                for (i, item) in items.iter().enumerate() {
                    if !item.is_object() {
                        return Err(fail(format!(
                            "document {index}: item {} of the List is not an object but {}",
                            i + 1,
                            kind_of(item)
                        )));
                    }
                    docs.push(Document {
                        index,
                        value: item.clone(),
                    });
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

/// Why a document is not a resource: which field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// The field, such as `metadata.namespace`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl FieldError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// Builds the resource a document describes. Errors name the field.
pub fn resource(value: &Value) -> std::result::Result<Resource, FieldError> {
    let str_field = |path: &[&str]| -> std::result::Result<Option<String>, FieldError> {
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
            _ => Err(FieldError::new(path.join("."), "must be a string")),
        }
    };
    let required = |path: &[&str]| {
        str_field(path)?.ok_or_else(|| FieldError::new(path.join("."), "is required"))
    };
    let api_version = required(&["apiVersion"])?;
    let kind = required(&["kind"])?;
    let name = required(&["metadata", "name"])?;
    // As kubectl reads it, an empty namespace is the default one.
    let namespace = str_field(&["metadata", "namespace"])?
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    if !is_namespace(&namespace) {
        return Err(FieldError::new(
            "metadata.namespace",
            format!(
                "`{}` is not a valid namespace: use at most 63 lower-case letters, digits and \
                 '-', starting and ending with a letter or digit",
                shown(&namespace)
            ),
        ));
    }
    let uid = str_field(&["metadata", "uid"])?.unwrap_or_default();
    let generation = value
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let map = |key: &str| -> std::result::Result<BTreeMap<String, String>, FieldError> {
        match value.get("metadata").and_then(|m| m.get(key)) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    _ => Err(FieldError::new(
                        format!("metadata.{key}.{}", shown(k)),
                        "must be a string",
                    )),
                })
                .collect(),
            Some(_) => Err(FieldError::new(
                format!("metadata.{key}"),
                "must be a map of strings",
            )),
        }
    };
    let labels = map("labels")?;
    let annotations = map("annotations")?;
    let spec = match value.get("spec") {
        None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
        Some(s @ Value::Object(_)) => s.clone(),
        Some(_) => return Err(FieldError::new("spec", "must be an object")),
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

/// A namespace name: a DNS-1123 label.
pub(crate) fn is_namespace(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A value from the input as an error shows it: on one line, and cut after 64 characters.
fn shown(s: &str) -> String {
    let line: String = s.chars().flat_map(char::escape_debug).collect();
    match line.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
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

    #[test]
    fn text_that_is_not_utf8_is_refused_where_it_breaks() {
        let dir = std::env::temp_dir().join(format!("documents-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.yaml");
        std::fs::write(&path, b"a: 1\nb: x\xffy\n").unwrap();
        let path = path.display().to_string();
        let e = read(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            e,
            format!("cannot read {path}: not UTF-8: byte 0xff at line 2, column 5")
        );
    }

    #[test]
    fn list_items_are_all_rendered_or_refused() {
        let docs = parse(
            "l.yaml",
            "kind: List\nitems: [{a: 1}, {b: 2}]\n---\nkind: List\nitems:\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        for (text, says) in [
            (
                "kind: List\nitems: 5\n",
                "l.yaml: document 1: `items` of a List must be a list, not a number",
            ),
            (
                "a: 1\n---\nkind: PodList\nitems: [{a: 1}, x]\n",
                "l.yaml: document 2: item 2 of the List is not an object but a string",
            ),
        ] {
            assert_eq!(parse("l.yaml", text).unwrap_err().to_string(), says);
        }
    }

    #[test]
    fn the_namespace_must_be_one() {
        let doc = |ns: &str| serde_json::json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a", "namespace": ns}});
        assert_eq!(resource(&doc("1-team")).unwrap().namespace, "1-team");
        assert_eq!(resource(&doc("")).unwrap().namespace, "default");
        for bad in [" ", "Team", "a_b", "-a", "a.b"] {
            let e = resource(&doc(bad)).unwrap_err();
            assert_eq!(e.field, "metadata.namespace", "{e}");
            assert!(e.problem.starts_with('`'), "{e}");
        }
        let e = resource(&doc(&"a\n".repeat(100))).unwrap_err().to_string();
        assert!(!e.contains('\n') && e.len() < 300, "{e}");
    }
}
