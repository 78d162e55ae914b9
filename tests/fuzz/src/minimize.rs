//! Shrinks an input that fails while it still fails the same way, so that the corpus holds
//! inputs a person can read: JSON by dropping keys and items and shortening strings, anything
//! else by dropping lines.

use std::time::{Duration, Instant};

use serde_json::Value;

/// Shrinks `input` while `fails` holds for the smaller input, for at most `budget`.
pub fn minimize(input: &[u8], budget: Duration, fails: &mut dyn FnMut(&[u8]) -> bool) -> Vec<u8> {
    let start = Instant::now();
    let out_of_time = || start.elapsed() >= budget;
    match serde_json::from_slice::<Value>(input) {
        Ok(value) => {
            let pretty = serde_json::to_vec_pretty(&value).unwrap_or_default();
            if !fails(&pretty) {
                return input.to_vec();
            }
            let mut value = value;
            let mut progress = true;
            while progress && !out_of_time() {
                progress = false;
                let mut i = 0;
                while !out_of_time() {
                    let candidates = shrink_at(&value, i);
                    let Some(candidates) = candidates else { break };
                    let mut taken = false;
                    for candidate in candidates {
                        let bytes = serde_json::to_vec_pretty(&candidate).unwrap_or_default();
                        if fails(&bytes) {
                            value = candidate;
                            taken = true;
                            progress = true;
                            break;
                        }
                    }
                    if !taken {
                        i += 1;
                    }
                }
            }
            readable(&value, fails)
        }
        Err(_) => lines(input, &out_of_time, fails),
    }
}

/// Pretty JSON, unless indentation makes it much larger (deep nesting) or changes the verdict.
fn readable(value: &Value, fails: &mut dyn FnMut(&[u8]) -> bool) -> Vec<u8> {
    let pretty = serde_json::to_vec_pretty(value).unwrap_or_default();
    let mut compact = serde_json::to_vec(value).unwrap_or_default();
    compact.push(b'\n');
    if pretty.len() <= 4 * compact.len() && fails(&pretty) {
        pretty
    } else {
        compact
    }
}

/// Smaller versions of `value` that differ at its `index`-th node (pre-order), or `None` past
/// the last node.
fn shrink_at(value: &Value, index: usize) -> Option<Vec<Value>> {
    let mut count = 0;
    let mut out = None;
    visit(value, index, &mut count, &mut out, &mut Vec::new());
    out.map(|edits: Vec<Edit>| {
        edits
            .into_iter()
            .filter_map(|e| {
                let mut v = value.clone();
                apply(&mut v, &e).then_some(v)
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

#[derive(Debug)]
enum Edit {
    Remove(Vec<Step>),
    Replace(Vec<Step>, Value),
}

fn visit(
    v: &Value,
    index: usize,
    count: &mut usize,
    out: &mut Option<Vec<Edit>>,
    path: &mut Vec<Step>,
) {
    if out.is_some() {
        return;
    }
    if *count == index {
        let mut edits = Vec::new();
        if !path.is_empty() {
            edits.push(Edit::Remove(path.clone()));
        }
        match v {
            Value::String(s) if s.chars().count() > 1 => {
                let half: String = s.chars().take(s.chars().count() / 2).collect();
                edits.push(Edit::Replace(path.clone(), Value::String(half)));
            }
            Value::Array(a) if a.len() > 1 => {
                edits.push(Edit::Replace(
                    path.clone(),
                    Value::Array(a[..a.len() / 2].to_vec()),
                ));
            }
            _ => {}
        }
        *out = Some(edits);
        return;
    }
    *count += 1;
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                path.push(Step::Key(k.clone()));
                visit(child, index, count, out, path);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                path.push(Step::Index(i));
                visit(child, index, count, out, path);
                path.pop();
            }
        }
        _ => {}
    }
}

fn apply(v: &mut Value, edit: &Edit) -> bool {
    let (path, replacement) = match edit {
        Edit::Remove(p) => (p, None),
        Edit::Replace(p, r) => (p, Some(r)),
    };
    let Some((last, parent_path)) = path.split_last() else {
        if let Some(r) = replacement {
            *v = r.clone();
            return true;
        }
        return false;
    };
    let Some(parent) = parent_path.iter().try_fold(v, |v, s| match s {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    }) else {
        return false;
    };
    match (parent, last, replacement) {
        (Value::Object(m), Step::Key(k), None) => m.remove(k).is_some(),
        (Value::Array(a), Step::Index(i), None) if *i < a.len() => {
            a.remove(*i);
            true
        }
        (Value::Object(m), Step::Key(k), Some(r)) => m.insert(k.clone(), r.clone()).is_some(),
        (Value::Array(a), Step::Index(i), Some(r)) if *i < a.len() => {
            a[*i] = r.clone();
            true
        }
        _ => false,
    }
}

/// Drops runs of lines, halving the run length when nothing can go (delta debugging).
fn lines(
    input: &[u8],
    out_of_time: &dyn Fn() -> bool,
    fails: &mut dyn FnMut(&[u8]) -> bool,
) -> Vec<u8> {
    let mut current: Vec<&[u8]> = input.split_inclusive(|&b| b == b'\n').collect();
    let mut chunk = current.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        while i < current.len() && !out_of_time() {
            let mut candidate = current.clone();
            candidate.drain(i..(i + chunk).min(current.len()));
            if !candidate.is_empty() && fails(&candidate.concat()) {
                current = candidate;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 || out_of_time() {
            break;
        }
        chunk = chunk.div_ceil(2);
    }
    current.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shrinks_to_what_fails() {
        let input =
            br#"{"spec": {"a": [1, 2, 3], "b": "xxxxxxxx", "bad": "needle-and-more"}, "x": 1}"#;
        let mut fails = |b: &[u8]| String::from_utf8_lossy(b).contains("needle");
        let out = minimize(input, Duration::from_secs(5), &mut fails);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, serde_json::json!({"spec": {"bad": "needle-"}}));
    }

    #[test]
    fn text_shrinks_by_lines() {
        let input = b"a\nb\nneedle\nc\nd\n";
        let mut fails = |b: &[u8]| String::from_utf8_lossy(b).contains("needle");
        assert_eq!(
            minimize(input, Duration::from_secs(5), &mut fails),
            b"needle\n"
        );
    }
}
