//! The host's layers, bottom to top, and a test that keeps every import pointing down: a module
//! may use the modules of the layers below its own, never one of its own layer or above.
//! docs/architecture.md says the same in prose.

/// The modules of `host/src`, by layer, bottom first.
pub const LAYERS: &[&[&str]] = &[
    // Leaves: what everything shares.
    &["types", "units", "gvk", "connection"],
    // What the operator's objects are and how they are owned; Kubernetes schemas; registries.
    &["api", "ownership", "kube_schema", "oci"],
    &["error"],
    &["documents", "schema", "policy", "signature"],
    // The sandbox.
    &["plugin"],
    // Which plugin serves which Kind, and the checks of what they render.
    &["registry"],
    &["crd"],
    // The commands' libraries.
    &["check", "rbac", "publish", "scaffold"],
    &["diff", "operator"],
    &["dev"],
    // The command line: it parses and calls; nothing imports it.
    &["cli"],
];

#[cfg(test)]
mod tests {
    use super::LAYERS;
    use std::path::Path;

    /// The layer of `module`, if it is one of the crate's.
    fn layer(module: &str) -> Option<usize> {
        LAYERS.iter().position(|l| l.contains(&module))
    }

    /// The crate's modules that `source` names (`crate::x`, `crate::{x, y::z}`), outside its
    /// tests.
    fn imports(source: &str) -> Vec<String> {
        let code = source
            .find("#[cfg(test)]\nmod tests")
            .or_else(|| source.find("#[cfg(test)]\npub(crate) mod tests"))
            .map_or(source, |at| &source[..at]);
        let mut found = Vec::new();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level names of the group, up to its closing brace.
                let (mut depth, mut name, mut names) = (0, String::new(), Vec::new());
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => names.push(std::mem::take(&mut name)),
                        _ => name.push(c),
                    }
                }
                names.push(name);
                found.extend(names.iter().filter_map(|n| first_name(n)));
            } else if let Some(n) = first_name(rest) {
                found.push(n);
            }
        }
        found
    }

    fn first_name(text: &str) -> Option<String> {
        let name: String = text
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    }

    /// Every `.rs` file below `dir`.
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("host/src is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_module_is_in_a_layer_and_imports_only_the_layers_below() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut paths = Vec::new();
        files(&src, &mut paths);
        let mut wrong = Vec::new();
        for path in &paths {
            let relative = path.strip_prefix(&src).expect("below src");
            let top = relative
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .map(|c| c.trim_end_matches(".rs").to_owned())
                .expect("a file name");
            if matches!(top.as_str(), "lib" | "main" | "layers") {
                continue;
            }
            let Some(mine) = layer(&top) else {
                wrong.push(format!(
                    "{}: module `{top}` is in no layer",
                    relative.display()
                ));
                continue;
            };
            let source = std::fs::read_to_string(path).expect("readable");
            for import in imports(&source) {
                // The crate root re-exports (`crate::Error`) are named by their own modules.
                let Some(theirs) = layer(&import) else {
                    continue;
                };
                if import != top && theirs >= mine {
                    wrong.push(format!(
                        "{}: `{top}` (layer {mine}) imports `{import}` (layer {theirs})",
                        relative.display()
                    ));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "imports that do not point down:\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn imports_are_read_from_paths_and_groups() {
        let source = "use crate::a::b;\nuse crate::{c, d::{e, f}};\nfn x() { crate::g::h(); }\n\
                      #[cfg(test)]\nmod tests { use crate::z; }";
        assert_eq!(imports(source), ["a", "c", "d", "g"]);
    }
}
