//! Parsing a resource's spec into typed structs, with errors that name the field.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{RenderError, Result};

/// Deserialises `spec` (the resource's `.spec`) into `T`. A type error names the field from the
/// resource's root (`spec.ports[0].containerPort`); a missing required field is reported on the
/// field itself (`spec.image.repository: is required`).
pub fn parse<T: DeserializeOwned>(spec: &Value) -> Result<T> {
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        let mut field = if path == "." {
            "spec".to_owned()
        } else {
            format!("spec.{path}")
        };
        let mut message = e.inner().to_string();
        if let Some(rest) = message.strip_prefix("missing field `")
            && let Some(name) = rest.strip_suffix('`')
        {
            field = format!("{field}.{name}");
            message = "is required".to_owned();
        }
        RenderError::new(field, message)
    })
}

/// How many levels of lists and maps a spec may nest (the spec itself is the first).
///
/// Fields passed through unchanged land a few levels deeper in the objects rendered (`env` in
/// `spec.template.spec.containers[0]`), and the host reads what a plugin returns with
/// `serde_json`'s limit of 128 levels: a spec deeper than this could be rendered, then refused
/// as a broken manifest with no field to blame. No Kubernetes type comes near; YAML input is
/// already read with this limit.
pub const MAX_NESTING: usize = 64;

/// Checks that `spec` nests at most [`MAX_NESTING`] levels; the error names the first field
/// below that.
pub fn nesting(spec: &Value) -> Result<()> {
    fn walk(v: &Value, depth: usize, path: &mut String) -> Option<String> {
        let children: Box<dyn Iterator<Item = (String, &Value)>> = match v {
            Value::Object(m) => Box::new(m.iter().map(|(k, c)| (format!(".{k}"), c))),
            Value::Array(a) => Box::new(a.iter().enumerate().map(|(i, c)| (format!("[{i}]"), c))),
            _ => return None,
        };
        if depth > MAX_NESTING {
            return Some(path.clone());
        }
        for (step, child) in children {
            let len = path.len();
            path.push_str(&step);
            if let Some(found) = walk(child, depth + 1, path) {
                return Some(found);
            }
            path.truncate(len);
        }
        None
    }
    match walk(spec, 1, &mut "spec".to_owned()) {
        None => Ok(()),
        Some(field) => Err(RenderError::new(
            field,
            format!("is nested more than {MAX_NESTING} levels deep in the spec"),
        )),
    }
}

/// An int or a string, as Kubernetes' `IntOrString` (ports by number or name, percentages).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A number.
    Int(i64),
    /// A name or a percentage.
    String(String),
}

impl IntOrString {
    /// The JSON form.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Int(i) => Value::from(*i),
            Self::String(s) => Value::from(s.as_str()),
        }
    }
}

/// Checks that `value` is a Kubernetes resource quantity (`50Gi`, `500m`, `1e3`, `1.5`).
pub fn quantity(field: &str, value: &str) -> Result<()> {
    let invalid = || {
        RenderError::new(
            field,
            format!(
                "`{value}` is not a quantity: expected a number with an optional suffix \
                 (Ki, Mi, Gi, Ti, Pi, Ei, m, k, M, G, T, P, E or an exponent), such as `10Gi`"
            ),
        )
    };
    let unsigned = value.strip_prefix(['+', '-']).unwrap_or(value);
    let number_len = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    let digits = number.chars().filter(char::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return Err(invalid());
    }
    let suffix_ok = match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        s if s.starts_with(['e', 'E']) => {
            let exp = s[1..].strip_prefix(['+', '-']).unwrap_or(&s[1..]);
            !exp.is_empty() && exp.chars().all(|c| c.is_ascii_digit())
        }
        _ => false,
    };
    if suffix_ok { Ok(()) } else { Err(invalid()) }
}

/// Checks that `value` is a DNS-1035 label (what a Service name must be): lower-case
/// alphanumerics and `-`, starting with a letter, ending with an alphanumeric, at most 63.
pub fn dns_label(field: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.starts_with(|c: char| c.is_ascii_lowercase())
        && value.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(RenderError::new(
            field,
            format!(
                "`{value}` is not a valid DNS label: use at most 63 lower-case letters, digits \
                 and '-', starting with a letter and ending with a letter or digit"
            ),
        ))
    }
}

/// Checks that `value` is a DNS-1123 subdomain (what most object names must be).
pub fn dns_subdomain(field: &str, value: &str) -> Result<()> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    if value.len() <= 253 && value.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(RenderError::new(
            field,
            format!(
                "`{value}` is not a valid name: use at most 253 lower-case letters, digits, '-' \
                 and '.', starting and ending with a letter or digit"
            ),
        ))
    }
}

/// Checks that `value` is a port name (IANA service name: at most 15 lower-case letters, digits
/// and '-', with at least one letter, no leading, trailing or double '-').
pub fn port_name(field: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 15
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && value.chars().any(|c| c.is_ascii_lowercase())
        && !value.starts_with('-')
        && !value.ends_with('-')
        && !value.contains("--");
    if ok {
        Ok(())
    } else {
        Err(RenderError::new(
            field,
            format!(
                "`{value}` is not a valid port name: at most 15 lower-case letters, digits and \
                 '-', with at least one letter"
            ),
        ))
    }
}

/// Checks that `value` is a cron schedule as a CronJob takes it: five fields, or a macro such as
/// `@daily`, optionally after a `CRON_TZ=` or `TZ=` prefix.
pub fn cron(field: &str, value: &str) -> Result<()> {
    let body = value.trim();
    let body = match body.split_once(' ') {
        Some((tz, rest)) if tz.starts_with("CRON_TZ=") || tz.starts_with("TZ=") => rest.trim(),
        _ => body,
    };
    let macros = [
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
    ];
    let field_ok = |f: &str| {
        f.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '*' | '/' | ',' | '-' | '?'))
    };
    let fields: Vec<&str> = body.split_whitespace().collect();
    if macros.contains(&body) || (fields.len() == 5 && fields.iter().all(|f| field_ok(f))) {
        Ok(())
    } else {
        Err(RenderError::new(
            field,
            format!(
                "`{value}` is not a cron schedule: expected five fields (minute hour day month \
                 weekday), such as `0 3 * * *`, or a macro such as `@daily`"
            ),
        ))
    }
}

/// The name part of a label key, or a label value: at most 63 letters, digits, `-`, `_` and
/// `.`, starting and ending with a letter or digit.
fn label_name_ok(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks that `key` is a label or annotation key: a name of at most 63 letters, digits, `-`,
/// `_` and `.` (starting and ending with a letter or digit), optionally after a DNS subdomain
/// prefix and `/`, such as `app.kubernetes.io/name`. The error is blamed on `field`, the map.
pub fn label_key(field: &str, key: &str) -> Result<()> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| !p.is_empty() && dns_subdomain(field, p).is_ok());
    if prefix_ok && label_name_ok(name) {
        Ok(())
    } else {
        Err(RenderError::new(
            field,
            format!(
                "`{key}` is not a valid key: use at most 63 letters, digits, '-', '_' and '.', \
                 starting and ending with a letter or digit, optionally after a DNS prefix and \
                 '/', such as `example.com/team`"
            ),
        ))
    }
}

/// Checks that `value` is a label value: empty, or at most 63 letters, digits, `-`, `_` and `.`,
/// starting and ending with a letter or digit.
pub fn label_value(field: &str, value: &str) -> Result<()> {
    if value.is_empty() || label_name_ok(value) {
        Ok(())
    } else {
        Err(RenderError::new(
            field,
            format!(
                "`{value}` is not a valid label value: use at most 63 letters, digits, '-', '_' \
                 and '.', starting and ending with a letter or digit"
            ),
        ))
    }
}

/// Checks a map of labels: every key a label key, every value a label value.
pub fn labels<'a>(
    field: &str,
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<()> {
    for (k, v) in labels {
        label_key(field, k)?;
        label_value(&format!("{field}.{k}"), v)?;
    }
    Ok(())
}

/// Checks that `value` fits the `int32` a Kubernetes field holds (replicas, probe timings,
/// autoscaling bounds, `IntOrString` numbers).
pub fn int32(field: &str, value: i64) -> Result<i32> {
    i32::try_from(value).map_err(|_| {
        RenderError::new(
            field,
            format!(
                "{value} is out of range: Kubernetes takes {} to {}",
                i32::MIN,
                i32::MAX
            ),
        )
    })
}

/// Checks that a port number is in 1..=65535.
pub fn port_number(field: &str, value: i64) -> Result<()> {
    if (1..=65535).contains(&value) {
        Ok(())
    } else {
        Err(RenderError::new(
            field,
            format!("{value} is not a port number: expected 1 to 65535"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code, reason = "fields exist to be parsed")]
    struct Image {
        repository: String,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code, reason = "fields exist to be parsed")]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        image: Image,
        #[serde(default)]
        ports: Vec<Port>,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code, reason = "fields exist to be parsed")]
    #[serde(rename_all = "camelCase")]
    struct Port {
        container_port: i64,
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse::<Spec>(&json!({"image": {}})).unwrap_err();
        assert_eq!(e.field, "spec.image.repository");
        assert_eq!(e.message, "is required");
        let e = parse::<Spec>(&json!({"image": {"repository": "x"}, "ports": [{"containerPort": 1}, {"containerPort": "x"}]}))
            .unwrap_err();
        assert_eq!(e.field, "spec.ports[1].containerPort");
        let e = parse::<Spec>(&json!({})).unwrap_err();
        assert_eq!(e.field, "spec.image");
    }

    #[test]
    fn nesting_is_bounded() {
        let mut deep = json!(1);
        // The spec is level 1, `a` level 2: 63 lists fill the rest.
        for _ in 0..MAX_NESTING - 1 {
            deep = json!([deep]);
        }
        assert!(nesting(&json!({ "a": deep.clone() })).is_ok());
        let e = nesting(&json!({ "a": { "b": deep } })).unwrap_err();
        // `spec.a.b` and 62 `[0]`, the last segment cut short as every long one is.
        assert!(e.field.starts_with("spec.a.b[0][0][0]"), "{}", e.field);
        assert!(e.field.ends_with('…'), "{}", e.field);
        assert!(
            e.message.contains("nested more than 64 levels"),
            "{}",
            e.message
        );
    }

    #[test]
    fn quantities() {
        for ok in [
            "50Gi", "1", "500m", "1.5", "1e3", "1E-3", "+1Ki", ".5", "2.",
        ] {
            assert!(quantity("f", ok).is_ok(), "{ok}");
        }
        for bad in ["", "Gi", "fifty", "50 Gi", "50GB", "1..2", "1e", "-"] {
            assert!(quantity("f", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert!(dns_label("f", "my-app1").is_ok());
        for bad in ["", "1app", "App", "app-", "a_b", &"a".repeat(64)] {
            assert!(dns_label("f", bad).is_err(), "{bad}");
        }
        assert!(dns_subdomain("f", "a.b-c.1").is_ok());
        assert!(dns_subdomain("f", "a..b").is_err());
        assert!(port_name("f", "http-2").is_ok());
        for bad in ["8080", "http--x", "a-very-long-port-name", "HTTP"] {
            assert!(port_name("f", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn labels_and_annotation_keys() {
        for ok in [
            "team",
            "app.kubernetes.io/name",
            "a_b.c-D",
            "x/y",
            &"a".repeat(63),
        ] {
            assert!(label_key("f", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "-a",
            "a b",
            "Bad.Prefix/x",
            "a/b/c",
            &"a".repeat(64),
        ] {
            assert_eq!(
                label_key("spec.labels", bad).unwrap_err().field,
                "spec.labels",
                "{bad}"
            );
        }
        for ok in ["", "v1", "a.b_c-D"] {
            assert!(label_value("f", ok).is_ok(), "{ok}");
        }
        for bad in [" ", "-a", "a/b", "TZ= ", &"a".repeat(64)] {
            assert!(label_value("f", bad).is_err(), "{bad}");
        }
        let m: std::collections::BTreeMap<String, String> =
            [("team".to_owned(), "a b".to_owned())].into();
        assert_eq!(
            labels("spec.labels", &m).unwrap_err().field,
            "spec.labels.team"
        );
    }

    #[test]
    fn int32_fields() {
        assert_eq!(int32("f", 3).unwrap(), 3);
        assert_eq!(int32("f", i64::from(i32::MIN)).unwrap(), i32::MIN);
        let e = int32("spec.replicas", 4_625_439_230_389).unwrap_err();
        assert_eq!(e.field, "spec.replicas");
        assert!(
            e.message.starts_with("4625439230389 is out of range"),
            "{}",
            e.message
        );
    }

    #[test]
    fn schedules() {
        for ok in [
            "0 3 * * *",
            "*/15 * * * 1-5",
            "@daily",
            "CRON_TZ=UTC 0 3 * * *",
        ] {
            assert!(cron("f", ok).is_ok(), "{ok}");
        }
        for bad in ["", "0 3 * *", "daily", "0 3 * * * *"] {
            assert!(cron("f", bad).is_err(), "{bad}");
        }
    }
}
