//! Input files for `host render`: the YAML fixtures and their JSON forms damaged line by line and
//! byte by byte, and whole documents built to hurt a parser (deep nesting, alias bombs, many
//! documents, huge scalars, random bytes).

use crate::rng::Rng;

/// Snippets inserted at random places: YAML syntax, tags, directives, separators, line breaks
/// and encodings.
const SNIPPETS: &[&[u8]] = &[
    b"---\n",
    b"...\n",
    b"--- !!map\n",
    b"--- |\n",
    b"%YAML 1.1\n",
    b"%YAML 2.0\n",
    b"%TAG ! tag:example.com,2000:\n",
    b"? [a, b]\n: c\n",
    b"? {a: b}\n: c\n",
    b"<<: *a\n",
    b"<<: [*a, *b]\n",
    b"&a ",
    b"*a",
    b"*undefined",
    b"!!binary ",
    b"!!str ",
    b"!!int ",
    b"!!float ",
    b"!!null ",
    b"!!set ",
    b"!!omap ",
    b"!custom ",
    b"!<tag:yaml.org,2002:str> ",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b": ",
    b"- ",
    b"|\n",
    b">-\n",
    b"|+2\n",
    b"'",
    b"\"",
    b"\"\\x",
    b"\"\\u12",
    b"#",
    b"\t",
    b"\r\n",
    b"\r",
    b"\xef\xbb\xbf",
    b"\0",
    b"\xc2\x85",
    b"\xe2\x80\xa8",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"~",
    b"null: x\n",
    b"1: a\n",
    b"true: a\n",
    b"? \n",
    b"kind: List\nitems:\n",
    b"items: 5\n",
    b"items: [1, two]\n",
    b"spec: 5\n",
    b"spec: [a]\n",
    b"metadata: []\n",
    b"metadata: {name: 5}\n",
    b"apiVersion: 5\n",
    b"kind: ~\n",
];

/// Scalars that parsers disagree on.
const SCALARS: &[&str] = &[
    "0644",
    "0o17",
    "0x1F",
    "0b101",
    "1e400",
    "-1e400",
    ".inf",
    "-.inf",
    ".nan",
    "NaN",
    "~",
    "null",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "2001-12-14t21:59:43.10-05:00",
    "2024-01-01",
    "12:30:00",
    "!!binary aGVsbG8=",
    "!!str 5",
    "!!int x",
    "!!float abc",
    "[]",
    "{}",
    "\"unterminated",
    "'unterminated",
    "1_000",
    "+12",
    "-0",
    "123456789012345678901234567890",
    "-9223372036854775809",
    "18446744073709551616",
    "18446744073709551615",
    "*undefined",
    "&x",
    "|",
    ">",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "'🦀'",
    "fifty",
    "-1Gi",
    "",
];

/// A random mutation of `text`, a fixture or a JSON rendering of one.
pub fn mutate(rng: &mut Rng, text: &mut Vec<u8>, others: &[Vec<u8>]) {
    let lines = line_starts(text);
    match rng.below(16) {
        0 => {
            let at = rng.below(text.len() + 1);
            text.truncate(at);
        }
        1 => {
            // Delete a line.
            let (a, b) = line_at(text, &lines, rng.below(lines.len()));
            text.drain(a..b);
        }
        2 => {
            // Duplicate a line: duplicate keys, repeated list items.
            let (a, b) = line_at(text, &lines, rng.below(lines.len()));
            let line = text[a..b].to_vec();
            splice(text, b, &line);
        }
        3 => {
            // Move a line elsewhere.
            let (a, b) = line_at(text, &lines, rng.below(lines.len()));
            let line: Vec<u8> = text.drain(a..b).collect();
            let at = rng.below(text.len() + 1);
            splice(text, at, &line);
        }
        4 => {
            // Indentation damage: one space more or less, or a tab.
            let start = lines[rng.below(lines.len())];
            match rng.below(3) {
                0 => splice(text, start, b" "),
                1 if text.get(start) == Some(&b' ') => {
                    text.remove(start);
                }
                _ => splice(text, start, b"\t"),
            }
        }
        5 | 6 => {
            let at = if rng.one_in(2) {
                lines[rng.below(lines.len())]
            } else {
                rng.below(text.len() + 1)
            };
            let snippet = *rng.pick(SNIPPETS);
            splice(text, at, snippet);
        }
        7 | 8 => replace_scalar(rng, text, &lines),
        9 => {
            if !text.is_empty() {
                let at = rng.below(text.len());
                text[at] ^= 1 << rng.below(8);
            }
        }
        10 => {
            let at = rng.below(text.len() + 1);
            text.insert(at, *rng.pick(b"{}[]:,-&*!|>'\"#%@`?\n \t\\"));
        }
        11 => {
            // CRLF line ends, or a byte-order mark.
            if rng.one_in(2) {
                *text = String::from_utf8_lossy(text)
                    .replace('\n', "\r\n")
                    .into_bytes();
            } else {
                splice(text, 0, b"\xef\xbb\xbf");
            }
        }
        12 => {
            // Another document after this one, with or without a separator.
            let other = rng.pick(others).clone();
            if rng.one_in(2) {
                text.extend_from_slice(b"\n---\n");
            }
            text.extend_from_slice(&other);
        }
        13 => {
            // An anchor on one value and an alias, or a merge key, elsewhere.
            let (a, _) = line_at(text, &lines, rng.below(lines.len()));
            if let Some(colon) = text[a..].iter().position(|&b| b == b':') {
                splice(text, a + colon + 1, b" &a");
                let lines = line_starts(text);
                let at = lines[rng.below(lines.len())];
                let snippet: &[u8] = match rng.below(3) {
                    0 => b"  alias: *a\n",
                    1 => b"  <<: *a\n",
                    _ => b"*a\n",
                };
                splice(text, at, snippet);
            }
        }
        14 => {
            // Repeat a line many times: large maps and lists.
            let (a, b) = line_at(text, &lines, rng.below(lines.len()));
            let line = text[a..b].to_vec();
            let room = 256_000 / line.len().max(1);
            let n = (*rng.pick(&[10, 1_000, 30_000])).min(room.max(1));
            let block = line.repeat(n);
            splice(text, b, &block);
        }
        _ => {
            // Delete a byte range.
            if !text.is_empty() {
                let a = rng.below(text.len());
                let b = (a + rng.between(1, 40)).min(text.len());
                text.drain(a..b);
            }
        }
    }
}

fn line_starts(text: &[u8]) -> Vec<usize> {
    let mut starts = vec![0];
    starts.extend(
        text.iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i + 1),
    );
    starts
}

/// The byte range of line `i`, with its line break.
fn line_at(text: &[u8], starts: &[usize], i: usize) -> (usize, usize) {
    let a = starts[i].min(text.len());
    let b = starts
        .get(i + 1)
        .copied()
        .unwrap_or(text.len())
        .min(text.len());
    (a, b.max(a))
}

fn splice(text: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let at = at.min(text.len());
    text.splice(at..at, bytes.iter().copied());
}

/// Replaces the value after a `: ` on some line with a scalar from [`SCALARS`].
fn replace_scalar(rng: &mut Rng, text: &mut Vec<u8>, lines: &[usize]) {
    let (a, b) = line_at(text, lines, rng.below(lines.len()));
    let Some(colon) = text[a..b].windows(2).position(|w| w == b": ") else {
        return;
    };
    let start = a + colon + 2;
    let end = text[start..b]
        .iter()
        .position(|&c| c == b'\n' || c == b',' || c == b'}')
        .map_or(b, |p| start + p);
    let scalar = rng.pick(SCALARS).as_bytes().to_vec();
    text.splice(start..end, scalar);
}

/// A document built to stress a parser, around a valid resource.
pub fn generate(rng: &mut Rng) -> Vec<u8> {
    const HEAD: &str =
        "apiVersion: hanzo.ai/v1\nkind: Service\nmetadata: {name: web, namespace: ns}\n";
    match rng.below(10) {
        0 => {
            // Random bytes, mostly printable.
            let len = rng.below(600);
            (0..len)
                .map(|_| {
                    if rng.one_in(8) {
                        rng.below(256) as u8
                    } else {
                        *rng.pick(b"abcdefghijklmnopqrstuvwxyz0123456789 :-{}[],'\"\n\t#&*!|>%@?~.")
                    }
                })
                .collect()
        }
        1 => {
            // Deeply nested flow collections, closed or not.
            let depth = *rng.pick(&[63, 64, 65, 127, 128, 129, 1_000, 100_000]);
            let (open, close) = if rng.one_in(2) {
                ("[", "]")
            } else {
                ("{a: ", "}")
            };
            let closed = !rng.one_in(4);
            let json = rng.one_in(3);
            let mut s = if json {
                String::new()
            } else {
                format!("{HEAD}spec:\n  image: {{repository: x}}\n  env: ")
            };
            let (open, close) = if json && open == "{a: " {
                ("{\"a\": ", "}")
            } else {
                (open, close)
            };
            s.push_str(&open.repeat(depth));
            s.push('1');
            if closed {
                s.push_str(&close.repeat(depth));
            }
            s.push('\n');
            s.into_bytes()
        }
        2 => {
            // Deeply nested block mappings.
            let depth = *rng.pick(&[60, 65, 200, 2_000]);
            let mut s = format!("{HEAD}spec:\n  image: {{repository: x}}\n  affinity:\n");
            for i in 0..depth {
                s.push_str(&" ".repeat(4 + i));
                s.push_str("a:\n");
            }
            s.push_str(&" ".repeat(4 + depth));
            s.push_str("b: 1\n");
            s.into_bytes()
        }
        3 => {
            // An alias bomb: each level repeats the one before `width` times.
            let levels = rng.between(2, 12);
            let width = rng.between(2, 12);
            let mut s = format!("{HEAD}spec:\n  image: {{repository: x}}\n  x0: &a0 [\"lol\"]\n");
            for l in 1..=levels {
                let refs = vec![format!("*a{}", l - 1); width].join(", ");
                s.push_str(&format!("  x{l}: &a{l} [{refs}]\n"));
            }
            s.push_str(&format!("  args: *a{levels}\n"));
            s.into_bytes()
        }
        4 => {
            // Many documents, empty or not.
            let n = *rng.pick(&[2, 100, 1_024, 1_025, 5_000]);
            let doc = if rng.one_in(2) {
                format!("{HEAD}spec: {{image: {{repository: x}}}}\n")
            } else {
                String::new()
            };
            let mut s = String::new();
            for _ in 0..n {
                s.push_str("---\n");
                s.push_str(&doc);
            }
            s.into_bytes()
        }
        5 => {
            // One huge scalar.
            let size = *rng.pick(&[70_000, 1 << 20, 3 << 20]);
            let field = rng.pick(&["image: {repository: ", "storageSize: ", "labels: {a: "]);
            let mut s = format!("{HEAD}spec:\n  {field}");
            s.push_str(&"x".repeat(size));
            if field.ends_with("{a: ") || field.starts_with("image") {
                s.push('}');
            }
            s.push('\n');
            s.into_bytes()
        }
        6 => {
            // A map with many keys.
            let n = *rng.pick(&[100, 1_000, 10_000]);
            let mut s = format!("{HEAD}spec:\n  image: {{repository: x}}\n  labels:\n");
            for i in 0..n {
                s.push_str(&format!("    k{i}: v\n"));
            }
            s.into_bytes()
        }
        7 => {
            // Anchors across documents, and merge keys.
            let s = match rng.below(3) {
                0 => format!("--- &r\n{HEAD}spec: {{image: {{repository: x}}}}\n--- *r\n"),
                1 => format!(
                    "base: &b {{image: {{repository: x}}, replicas: 2}}\n---\n{HEAD}spec:\n  <<: *b\n  replicas: 3\n"
                ),
                _ => format!("{HEAD}spec:\n  <<: [*x, *y]\n"),
            };
            s.into_bytes()
        }
        8 => {
            // JSON with numbers and structures serde_json and YAML treat differently.
            let value = *rng.pick(&[
                "1e400",
                "-1e400",
                "NaN",
                "Infinity",
                "-0",
                "18446744073709551616",
                "1.0e-400",
                "0x10",
                "01",
                "1.",
                ".5",
                "\"\\ud800\"",
                "[1,]",
                "{\"a\":1,}",
                "true false",
            ]);
            format!(
                "{{\"apiVersion\":\"hanzo.ai/v1\",\"kind\":\"Service\",\"metadata\":{{\"name\":\"web\"}},\"spec\":{{\"image\":{{\"repository\":\"x\"}},\"replicas\":{value}}}}}"
            )
            .into_bytes()
        }
        _ => {
            // Lists: `kind: List` with odd items, and JSON arrays of documents.
            let s = match rng.below(5) {
                0 => "apiVersion: v1\nkind: List\nitems: 5\n".to_owned(),
                1 => "apiVersion: v1\nkind: List\nitems: [1, two, null, []]\n".to_owned(),
                2 => "apiVersion: v1\nkind: ServiceList\nitems:\n  - apiVersion: hanzo.ai/v1\n    kind: List\n    items: [{}]\n  - {kind: Service}\n".to_owned(),
                3 => "[[{\"kind\":\"Service\"}], null, 5, \"x\"]".to_owned(),
                _ => "{\"kind\":\"List\",\"items\":{\"a\":{}}}".to_owned(),
            };
            s.into_bytes()
        }
    }
}
