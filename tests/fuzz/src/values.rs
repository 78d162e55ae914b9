//! Values that tend to break validators: edge numbers, strings that other parsers read as
//! something else, names at and past their length limits, long and odd text.

use serde_json::{Map, Value, json};

use crate::rng::Rng;

/// Strings worth trying in any string field: enum members and valid values of the Kinds' fields
/// next to near misses, YAML 1.1 look-alikes, quantities that are not, and text that is hard to
/// print.
pub const STRINGS: &[&str] = &[
    "",
    " ",
    "a",
    "x",
    "web",
    "http",
    "metrics",
    "native",
    "data",
    "db",
    "default",
    "hanzo",
    "10Gi",
    "1Gi",
    "50Gi",
    "500m",
    "1",
    "0",
    "-1",
    "1e3",
    "1e400",
    "-1Gi",
    "fifty",
    "50GB",
    "50 Gi",
    "1..2",
    "Ki",
    "1e",
    "1E-3",
    "+1Ki",
    ".5",
    "2.",
    "0.0000001",
    "NaN",
    "nan",
    ".nan",
    "Infinity",
    "-Infinity",
    ".inf",
    "-.inf",
    "null",
    "~",
    "true",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "0644",
    "0o17",
    "0x1F",
    "0b101",
    "1_000",
    "12:30:00",
    "2024-01-01",
    "2001-12-14t21:59:43.10-05:00",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "@daily",
    "@every 5m",
    "0 3 * * *",
    "*/15 * * * 1-5",
    "* * * * * *",
    "CRON_TZ=UTC 0 3 * * *",
    "TZ= ",
    "CRON_TZ=",
    "Always",
    "IfNotPresent",
    "Never",
    "Sometimes",
    "TCP",
    "UDP",
    "SCTP",
    "tcp",
    "Prefix",
    "Exact",
    "ImplementationSpecific",
    "Retain",
    "Delete",
    "Keep",
    "Orphan",
    "Owner",
    "RollingUpdate",
    "Recreate",
    "BlueGreen",
    "HTTP",
    "HTTPS",
    "datastore",
    "clickhouse",
    "postgresql",
    "valkey",
    "docdb",
    "minio",
    "nats",
    "oracle",
    "Bad_Name",
    "UPPER",
    "-lead",
    "trail-",
    "a--b",
    "a..b",
    "a.b",
    ".a",
    "a.",
    "a/b",
    "a/b/c",
    "/",
    "example.com/key",
    "Example.COM/key",
    "app.kubernetes.io/name",
    "app.kubernetes.io/part-of",
    "kubernetes.io/hostname",
    "../../etc/passwd",
    "$(POD_NAME)",
    "${HOME}",
    "%s%s%n",
    "{{ .Values }}",
    "\u{0}",
    "\t",
    "\n",
    "line\nbreak",
    "'",
    "\"",
    "\\",
    "{}",
    "[]",
    ": ",
    "- ",
    "# comment",
    "&anchor",
    "*alias",
    "!!binary",
    "<<",
    "---",
    "...",
    "é",
    "名前",
    "🦀",
    "\u{202e}rtl",
    "\u{feff}",
    "\u{ffff}",
    "\u{85}",
    "\u{2028}",
    "a-very-long-port-name",
    "http--x",
    "8080",
    "65536",
    "50%",
    "101%",
    "-50%",
    "%",
    "1.5",
    "ghcr.io/hanzoai/api",
    "ghcr.io/hanzoai/api:v1@sha256:abc",
    "https://s3.example.com",
    "10.0.0.0/8",
    "/healthz",
    "*",
    "?",
];

/// Integers and floats at the edges of what each field takes.
pub fn number(rng: &mut Rng) -> Value {
    match rng.below(34) {
        0 => json!(0),
        1 => json!(1),
        2 => json!(-1),
        3 => json!(2),
        4 => json!(3),
        5 => json!(9),
        6 => json!(10),
        7 => json!(80),
        8 => json!(1000),
        9 => json!(1001),
        10 => json!(65535),
        11 => json!(65536),
        12 => json!(70000),
        13 => json!(i32::MAX),
        14 => json!(i32::MIN),
        15 => json!(i64::from(i32::MAX) + 1),
        16 => json!(i64::MAX),
        17 => json!(i64::MIN),
        18 => json!(u64::MAX),
        19 => json!(9_007_199_254_740_993_u64),
        20 => json!(1.5),
        21 => json!(-0.0),
        22 => json!(0.5),
        23 => json!(1e300),
        24 => json!(-1e300),
        25 => json!(f64::MIN_POSITIVE),
        26 => json!(100.0),
        27 => json!(8080),
        28 => json!(420),
        29 => json!(-65535),
        30 => json!(59),
        31 => json!(45),
        _ => json!(rng.next_u64() as i64 >> rng.below(64)),
    }
}

/// A DNS label of exactly `len` characters (`len` ≥ 1).
pub fn label_of_len(len: usize) -> String {
    let mut s = String::with_capacity(len);
    s.push('a');
    for i in 1..len {
        s.push(if i % 7 == 0 && i + 1 < len { '-' } else { 'b' });
    }
    s
}

/// Lengths around the limits the Kinds and Kubernetes put on names.
const NAME_LENGTHS: [usize; 16] = [
    1, 15, 16, 45, 46, 52, 53, 55, 56, 60, 61, 62, 63, 64, 253, 254,
];

/// A string: usually one of [`STRINGS`], else a name at a length limit, a long run, random
/// characters, or two joined.
pub fn string(rng: &mut Rng) -> String {
    match rng.below(20) {
        0..=11 => (*rng.pick(STRINGS)).to_owned(),
        12 | 13 => label_of_len(*rng.pick(&NAME_LENGTHS)),
        14 => {
            let unit = *rng.pick(&["x", "é", "🦀", "a-", "\\\"", "\n"]);
            unit.repeat(*rng.pick(&[100, 1_000, 10_000, 100_000]))
        }
        15 | 16 => random_chars(rng, 1, 24),
        _ => format!("{}{}", rng.pick(STRINGS), rng.pick(STRINGS)),
    }
}

/// Random characters, mostly ASCII.
pub fn random_chars(rng: &mut Rng, min: usize, max: usize) -> String {
    let len = rng.between(min, max);
    (0..len)
        .map(|_| match rng.below(10) {
            0..=6 => char::from(rng.between(0x20, 0x7e) as u8),
            7 => char::from(rng.below(0x20) as u8),
            _ => char::from_u32(rng.between(0x80, 0x2_0000) as u32).unwrap_or('\u{fffd}'),
        })
        .collect()
}

/// Keys of Kubernetes objects and of the Kinds' specs, for made-up objects.
const KEYS: &[&str] = &[
    "name",
    "value",
    "key",
    "port",
    "path",
    "image",
    "command",
    "args",
    "items",
    "spec",
    "metadata",
    "labels",
    "matchLabels",
    "containerPort",
    "servicePort",
    "protocol",
    "repository",
    "tag",
    "size",
    "enabled",
    "type",
    "replicas",
    "secretName",
    "mountPath",
    "valueFrom",
    "configMap",
    "emptyDir",
    "httpGet",
    "exec",
    "requests",
    "limits",
    "cpu",
    "memory",
    "unknownField",
    "",
    "x y",
    "<<",
    "🦀",
];

/// A scalar of any type.
pub fn scalar(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 | 3 => number(rng),
        _ => Value::String(string(rng)),
    }
}

/// Any JSON value, at most `depth` levels deep.
pub fn any(rng: &mut Rng, depth: usize) -> Value {
    if depth == 0 {
        return scalar(rng);
    }
    match rng.below(6) {
        0 | 1 => scalar(rng),
        2 => Value::Array(
            (0..rng.count().min(50))
                .map(|_| any(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.count().min(30) {
                let key = if rng.one_in(5) {
                    string(rng)
                } else {
                    (*rng.pick(KEYS)).to_owned()
                };
                m.insert(key, any(rng, depth - 1));
            }
            Value::Object(m)
        }
    }
}
