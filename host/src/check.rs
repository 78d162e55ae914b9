//! `host check`: what a plugin author runs before publishing a plugin, and what the operator
//! can run before serving one. Each check is a line of the report, passed, failed or skipped,
//! with what it saw:
//!
//! - `compile`: the bytes are a WebAssembly component that compiles;
//! - `contract`: it exports the reconciler of a 1.x version of the contract, with its types;
//! - `imports`: it imports nothing beyond what the sandbox gives;
//! - `describe`: `describe` returns a valid description under two API groups, the same each
//!   time, with no cluster-scoped child kind;
//! - `schemas`: every Kind's schema makes a structural CRD, under both groups;
//! - `render`: every example renders within the sandbox's limits, to declared children only,
//!   namespaced in the example's namespace, validly named;
//! - `pure`: each example renders to the same bytes in several fresh instances, and twice in one.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::plugin::{Anatomy, LoadFailure, Plugin, Runtime, Step};
use crate::registry::Registry;
use crate::types::{Context, PluginInfo, Resource};

/// The second API group a plugin is described under, besides the one in force.
pub const OTHER_GROUP: &str = "check.example.com";
/// How many fresh instances render each example for the `pure` check.
const INSTANCES: usize = 3;

/// One resource to render, and where it came from (`FILE: document N (Kind/name)`).
#[derive(Debug, Clone)]
pub struct Example {
    /// Where it came from, for the report.
    pub source: String,
    pub resource: Resource,
}

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    /// It did not: the plugin must not be served as it is.
    Fail,
    /// It could not be checked (an earlier check failed, or there was nothing to check).
    Skip,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Which check (`compile`, `contract`, `imports`, `describe`, `schemas`, `render`, `pure`).
    pub check: &'static str,
    pub outcome: Outcome,
    /// What it saw: for a failure, what is wrong and where.
    pub detail: String,
}

/// What `host check` found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The file (or reference) checked.
    pub source: String,
    /// What the component is, once it compiled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component: Option<Anatomy>,
    /// The contract version it exports (`1.0.0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract: Option<String>,
    /// Its name and version, from `describe`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The Kinds it serves (`Kind.group`, with versions) under the API group in force.
    pub kinds: Vec<String>,
    /// The child kinds it declares (`group/version Kind`).
    pub children: Vec<String>,
    /// Every check, in order.
    pub findings: Vec<Finding>,
    /// What the examples' renders warned of (contract 1.1): `FILE: field: message`. Warnings
    /// do not fail the check.
    pub warnings: Vec<String>,
    /// True when no check failed (false when the checks could not run).
    pub passed: bool,
    /// Why the checks could not run at all (the plugin or an example could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Report {
    fn new(source: &str) -> Self {
        Self {
            source: source.to_owned(),
            component: None,
            contract: None,
            plugin: None,
            kinds: Vec::new(),
            children: Vec::new(),
            findings: Vec::new(),
            warnings: Vec::new(),
            passed: true,
            error: None,
        }
    }

    /// The report of checks that could not run: `source` and why.
    pub fn not_run(source: &str, error: String) -> Self {
        Self {
            passed: false,
            error: Some(error),
            ..Self::new(source)
        }
    }

    fn add(&mut self, check: &'static str, outcome: Outcome, detail: impl Into<String>) {
        self.passed &= outcome != Outcome::Fail;
        self.findings.push(Finding {
            check,
            outcome,
            detail: detail.into(),
        });
    }

    fn skip_from(&mut self, checks: &[&'static str], why: &str) {
        for check in checks {
            self.add(check, Outcome::Skip, why);
        }
    }

    /// The report for a person: what the component is, then one line per check.
    pub fn text(&self) -> String {
        let mut out = format!("{}\n", self.source);
        let mut fact = |name: &str, value: String| {
            if !value.is_empty() {
                out.push_str(&format!("  {name:<9}{value}\n"));
            }
        };
        if let Some(c) = &self.component {
            fact("sha256", c.sha256.clone());
            fact("size", format!("{} bytes", c.size));
            fact("imports", c.imports.join(", "));
            fact("exports", c.exports.join(", "));
        }
        fact("contract", self.contract.clone().unwrap_or_default());
        fact("plugin", self.plugin.clone().unwrap_or_default());
        fact("kinds", self.kinds.join(", "));
        fact("children", self.children.join(", "));
        out.push('\n');
        for f in &self.findings {
            let mark = match f.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "SKIP",
            };
            let mut lines = f.detail.lines();
            out.push_str(&format!(
                "{mark}  {:<9} {}\n",
                f.check,
                lines.next().unwrap_or_default()
            ));
            for line in lines {
                out.push_str(&format!("                {line}\n"));
            }
        }
        for w in &self.warnings {
            out.push_str(&format!("WARN  {:<9} {w}\n", "render"));
        }
        let failed = self
            .findings
            .iter()
            .filter(|f| f.outcome == Outcome::Fail)
            .count();
        out.push_str(&if failed == 0 {
            "\npassed\n".to_owned()
        } else {
            format!("\n{failed} check(s) failed\n")
        });
        out
    }
}

/// Checks the component `wasm` (named `source` in the report) under `ctx`, rendering each of
/// `examples` with the runtime's limits.
pub fn check(
    runtime: &Runtime,
    wasm: &[u8],
    source: &str,
    ctx: &Context,
    examples: &[Example],
) -> Report {
    check_keeping(runtime, wasm, None, source, ctx, examples).0
}

/// [`check`], keeping the plugin it loaded when every check passed (the operator serves that
/// one: no second load). `sha256` is the bytes' sha256 in hex when a pull has checked it
/// against them, so they are not hashed again.
pub(crate) fn check_keeping(
    runtime: &Runtime,
    wasm: &[u8],
    sha256: Option<String>,
    source: &str,
    ctx: &Context,
    examples: &[Example],
) -> (Report, Option<Plugin>) {
    let sha256 = sha256.unwrap_or_else(|| crate::units::sha256_hex(wasm));
    let loaded = runtime.load_steps(wasm, sha256, source, ctx);
    let (report, plugin) = checked(Report::new(source), loaded, ctx, examples);
    let kept = plugin.filter(|_| report.passed);
    (report, kept)
}

/// The checks of [`check`] after the load, whose outcome is `loaded`; returns the report and
/// the plugin, when it loaded.
fn checked(
    mut report: Report,
    loaded: std::result::Result<(Plugin, Anatomy), LoadFailure>,
    ctx: &Context,
    examples: &[Example],
) -> (Report, Option<Plugin>) {
    let later = ["describe", "schemas", "render", "pure"];
    let plugin = match loaded {
        Ok((plugin, anatomy)) => {
            report.contract = anatomy.contract().map(str::to_owned);
            report.add(
                "compile",
                Outcome::Pass,
                format!("a component of {} bytes", anatomy.size),
            );
            report.add(
                "contract",
                Outcome::Pass,
                format!(
                    "exports wasm-operator:plugin/reconciler@{}{}{}",
                    report.contract.as_deref().unwrap_or("?"),
                    if plugin.reports() {
                        " and reporting (warnings and status, contract 1.1)"
                    } else {
                        ""
                    },
                    if plugin.admits() {
                        format!(
                            " and admission ({} reference(s) to Secrets, ConfigMaps and ServiceAccounts, contract 1.2)",
                            plugin
                                .info()
                                .kinds
                                .iter()
                                .map(|k| k.references.len())
                                .sum::<usize>()
                        )
                    } else {
                        String::new()
                    }
                ),
            );
            report.add(
                "imports",
                Outcome::Pass,
                format!(
                    "{} import(s), all given by the sandbox",
                    anatomy.imports.len()
                ),
            );
            report.component = Some(anatomy);
            plugin
        }
        Err(failure) => {
            report.contract = failure
                .anatomy
                .as_ref()
                .and_then(|a| a.contract().map(str::to_owned));
            report.component = failure.anatomy.clone();
            // The order the steps run in; a failure of the types is the contract's.
            let rank = |step: Step| match step {
                Step::Compile => 0,
                Step::Contract => 1,
                Step::Imports => 2,
                Step::Types => 3,
                Step::Describe => 4,
            };
            let failed_check = match failure.step {
                Step::Compile => "compile",
                Step::Contract | Step::Types => "contract",
                Step::Imports => "imports",
                Step::Describe => "describe",
            };
            let size = report.component.as_ref().map_or(0, |a| a.size);
            for (step, check, passed) in [
                (
                    Step::Compile,
                    "compile",
                    format!("a component of {size} bytes"),
                ),
                (
                    Step::Contract,
                    "contract",
                    "exports the reconciler".to_owned(),
                ),
                (
                    Step::Imports,
                    "imports",
                    "every import is given by the sandbox".to_owned(),
                ),
                (Step::Describe, "describe", String::new()),
            ] {
                if check == failed_check {
                    report.add(check, Outcome::Fail, failure.reason.clone());
                } else if rank(step) < rank(failure.step) {
                    report.add(check, Outcome::Pass, passed);
                } else {
                    report.add(check, Outcome::Skip, "not run: the plugin does not load");
                }
            }
            report.skip_from(&later[1..], "not run: the plugin does not load");
            return (report, None);
        }
    };
    let info = plugin.info();
    report.plugin = Some(format!("{} {}", info.name, info.version));
    report.kinds = info
        .kinds
        .iter()
        .map(|k| format!("{}.{} ({})", k.kind, k.group, k.versions.join(", ")))
        .collect();
    report.children = info
        .children
        .iter()
        .map(|c| {
            let gv = crate::gvk::api_version(&c.group, &c.version);
            format!("{gv} {}", c.kind)
        })
        .collect();

    let other = Context {
        api_group: if ctx.api_group == OTHER_GROUP {
            "example.org".to_owned()
        } else {
            OTHER_GROUP.to_owned()
        },
        cluster_domain: ctx.cluster_domain.clone(),
    };
    let described = describe(&plugin, info, ctx, &other);
    let other_info = match described {
        Ok((other_info, detail)) => {
            report.add("describe", Outcome::Pass, detail);
            other_info
        }
        Err(why) => {
            report.add("describe", Outcome::Fail, why);
            report.skip_from(&later[1..], "not run: `describe` failed");
            return (report, Some(plugin));
        }
    };
    match schemas(
        &plugin,
        &[(&ctx.api_group, info), (&other.api_group, &other_info)],
    ) {
        Ok(detail) => report.add("schemas", Outcome::Pass, detail),
        Err(why) => report.add("schemas", Outcome::Fail, why),
    }
    if examples.is_empty() {
        report.skip_from(
            &later[2..],
            "no examples given: name files of resources of the plugin's Kinds to render them",
        );
        return (report, Some(plugin));
    }
    let registry = match Registry::of(ctx.clone(), vec![plugin.clone()]) {
        Ok(r) => r,
        Err(e) => {
            report.add("render", Outcome::Fail, e.to_string());
            report.skip_from(&later[3..], "not run: no example rendered");
            return (report, Some(plugin));
        }
    };
    let mut rendered = Vec::new();
    let mut failed = Vec::new();
    for example in examples {
        match registry.render_reported(&example.resource) {
            Ok((_, warnings)) => {
                report
                    .warnings
                    .extend(warnings.iter().map(|w| format!("{}: {w}", example.source)));
                // A 1.1 plugin's status, from no children yet (what a resource just created
                // shows): only the fields its schema declares.
                match plugin.status(&example.resource, &[], ctx) {
                    Ok(_) => rendered.push(example),
                    Err(e) => {
                        failed.push(format!("{}: status: {}: {e}", example.source, e.reason()))
                    }
                }
            }
            Err(e) => failed.push(format!("{}: {}: {e}", example.source, e.reason())),
        }
    }
    if !rendered.is_empty() {
        report.add(
            "render",
            Outcome::Pass,
            format!(
                "{} example(s) rendered within the sandbox's limits, to declared children only",
                rendered.len()
            ),
        );
    }
    // One entry for each example that failed, each naming its file and resource.
    for failure in failed {
        report.add("render", Outcome::Fail, failure);
    }
    if rendered.is_empty() {
        report.skip_from(&later[3..], "not run: no example rendered");
        return (report, Some(plugin));
    }
    match pure(&plugin, ctx, &rendered) {
        Ok(detail) => report.add("pure", Outcome::Pass, detail),
        Err(why) => report.add("pure", Outcome::Fail, why),
    }
    (report, Some(plugin))
}

/// `describe` under `ctx` again (it must give what it gave at load) and under `other`, each
/// description valid and with no cluster-scoped child kind. Returns the one under `other`.
fn describe(
    plugin: &Plugin,
    info: &PluginInfo,
    ctx: &Context,
    other: &Context,
) -> Result<(PluginInfo, String), String> {
    let again = plugin
        .describe(ctx)
        .map_err(|e| format!("under {}: {e}", ctx.api_group))?;
    if &again != info {
        return Err(format!(
            "under {} it described itself differently the second time: describe must be a pure \
             function of its context",
            ctx.api_group
        ));
    }
    let other_info = plugin
        .describe(other)
        .map_err(|e| format!("under {}: {e}", other.api_group))?;
    for (group, i) in [(&ctx.api_group, info), (&other.api_group, &other_info)] {
        if i.kinds.is_empty() {
            return Err(format!("under {group}: serves no Kind"));
        }
        crate::registry::check_children(i).map_err(|e| format!("under {group}: {e}"))?;
    }
    Ok((
        other_info,
        format!(
            "{} Kind(s) and {} child kind(s) under {}, valid under {} too",
            info.kinds.len(),
            info.children.len(),
            ctx.api_group,
            other.api_group
        ),
    ))
}

/// Every Kind's CRD, under each group, is one the API server would take as structural.
fn schemas(plugin: &Plugin, described: &[(&String, &PluginInfo)]) -> Result<String, String> {
    let mut problems = Vec::new();
    let mut count = 0;
    for (group, info) in described {
        for kind in &info.kinds {
            count += 1;
            let crd = match crate::crd::crd(plugin, kind) {
                Ok(crd) => crd,
                Err(e) => {
                    problems.push(format!("{}.{} (under {group}): {e}", kind.kind, kind.group));
                    continue;
                }
            };
            // The whole schema: the plugin's spec, and its status (contract 1.1).
            let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            for p in crate::kube_schema::structural_problems(schema, "openAPIV3Schema") {
                problems.push(format!("{}.{} (under {group}): {p}", kind.kind, kind.group));
            }
        }
    }
    if problems.is_empty() {
        Ok(format!(
            "{count} CRD schema(s), under both groups, are structural"
        ))
    } else {
        Err(problems.join("\n"))
    }
}

/// Each example renders to the same bytes in [`INSTANCES`] fresh instances, and twice in one.
fn pure(plugin: &Plugin, ctx: &Context, examples: &[&Example]) -> Result<String, String> {
    let mut slowest = Duration::ZERO;
    for example in examples {
        let mut first: Option<Vec<String>> = None;
        for instance in 1..=INSTANCES {
            let started = Instant::now();
            let out = plugin
                .render_text(&example.resource, ctx)
                .map_err(|e| format!("{}: in instance {instance}: {e}", example.source))?;
            slowest = slowest.max(started.elapsed());
            match &first {
                None => first = Some(out),
                Some(first) if *first != out => {
                    return Err(format!(
                        "{}: fresh instance {instance} rendered other bytes than instance 1 ({})",
                        example.source,
                        difference(first, &out)
                    ));
                }
                Some(_) => {}
            }
        }
        let mut session = plugin
            .session()
            .map_err(|e| format!("{}: {e}", example.source))?;
        let once = session
            .render_text(&example.resource, ctx)
            .map_err(|e| format!("{}: {e}", example.source))?;
        let twice = session
            .render_text(&example.resource, ctx)
            .map_err(|e| format!("{}: {e}", example.source))?;
        if once != twice {
            return Err(format!(
                "{}: a second render in the same instance gave other bytes ({}): the plugin keeps \
                 state between calls",
                example.source,
                difference(&once, &twice)
            ));
        }
    }
    Ok(format!(
        "the same bytes from {INSTANCES} fresh instances and twice from one, for each example \
         (slowest render {:.1} ms)",
        slowest.as_secs_f64() * 1000.0
    ))
}

/// Where two renders part: the first manifest that differs, or their counts.
fn difference(a: &[String], b: &[String]) -> String {
    if a.len() != b.len() {
        return format!("{} manifest(s), then {}", a.len(), b.len());
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
    format!("manifest {i} differs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_the_manifest() {
        let a = vec!["{}".to_owned(), "{\"a\":1}".to_owned()];
        let b = vec!["{}".to_owned(), "{\"a\":2}".to_owned()];
        assert_eq!(difference(&a, &b), "manifest 1 differs");
        assert_eq!(difference(&a, &b[..1]), "2 manifest(s), then 1");
    }

    #[test]
    fn a_check_keeps_the_plugin_it_loaded_only_when_everything_passed() {
        let runtime = Runtime::new(Default::default(), None).unwrap();
        let ctx = Context::default();
        let b = &crate::plugin::BUILTINS[2];
        // A digest given is taken as the bytes' own (a pull checked it), not computed again:
        // one that is not theirs shows it.
        let given = "ab".repeat(32);
        let (report, kept) =
            check_keeping(&runtime, b.wasm, Some(given.clone()), b.name, &ctx, &[]);
        assert!(report.passed, "{}", report.text());
        assert_eq!(kept.expect("kept").sha256(), given);
        assert_eq!(report.component.map(|c| c.sha256), Some(given));
        let (_, kept) = check_keeping(&runtime, b.wasm, None, b.name, &ctx, &[]);
        assert_eq!(kept.expect("kept").sha256(), b.sha256);
        // Loaded, but an example fails to render: nothing is kept.
        let foreign = crate::documents::resource(&serde_json::json!({
            "apiVersion": "example.org/v1", "kind": "Nothing", "metadata": {"name": "a"}
        }))
        .unwrap();
        let example = Example {
            source: "foreign.yaml".to_owned(),
            resource: foreign,
        };
        let (report, kept) = check_keeping(&runtime, b.wasm, None, b.name, &ctx, &[example]);
        assert!(!report.passed);
        assert!(kept.is_none());
        let (report, kept) = check_keeping(&runtime, b"not wasm", None, "x.wasm", &ctx, &[]);
        assert!(!report.passed);
        assert!(kept.is_none());
    }

    #[test]
    fn a_failed_load_skips_what_follows_and_fails_the_report() {
        let runtime = Runtime::new(Default::default(), None).unwrap();
        let report = check(&runtime, b"not wasm", "x.wasm", &Context::default(), &[]);
        assert!(!report.passed);
        assert_eq!(report.findings[0].check, "compile");
        assert_eq!(report.findings[0].outcome, Outcome::Fail);
        assert!(report.findings[0].detail.contains("no \\0asm header"));
        let checks: Vec<&str> = report.findings.iter().map(|f| f.check).collect();
        assert_eq!(
            checks,
            [
                "compile", "contract", "imports", "describe", "schemas", "render", "pure"
            ]
        );
        assert!(
            report.findings[1..]
                .iter()
                .all(|f| f.outcome == Outcome::Skip)
        );
    }
}
