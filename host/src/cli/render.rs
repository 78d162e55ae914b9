//! `host render`: resources rendered offline, with no cluster, the manifests printed.

use std::process::ExitCode;

use clap::Args;

use serde_json::{Value, json};

use super::{Error, PluginArgs, emit};
use crate::documents::{self, Format};
use crate::operator::offline::{self, Observed};
use crate::types::Resource;

/// `host render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
    /// Children as the cluster reports them (`kubectl get -o yaml`): files or directories,
    /// repeatable. Each resource is then printed first, with the status the operator would write
    /// (each child ready or not as the operator judges it; a child not given is not ready; a 1.1
    /// plugin's `status()` fields from those observed), before its children.
    #[arg(long, value_name = "FILE|DIR")]
    pub observed: Vec<String>,
    /// YAML or JSON files of resources, or directories of them; `-` reads standard input.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<String>,
}

pub(super) fn run(args: &RenderArgs) -> Result<ExitCode, Error> {
    let observed = if args.observed.is_empty() {
        None
    } else {
        Some(observed(&args.observed)?)
    };
    let registry = args.plugins.registry()?;
    let mut objects = Vec::new();
    let mut failures = Vec::new();
    // Each child rendered, with its namespace, to tell observed objects that are none of them.
    let mut children: Vec<(String, serde_json::Value)> = Vec::new();
    super::each_resource(&args.files, |place, resource| {
        match resource {
            Err(e) => failures.push(format!("{place}: {e}")),
            Ok(resource) => {
                let place = format!("{place} ({}/{})", resource.kind, resource.name);
                match registry.render_reported(&resource) {
                    Ok((rendered, warnings)) => {
                        // What the plugin left out goes to stderr; the rest renders.
                        for w in &warnings {
                            eprintln!("warning: {place}: {w}");
                        }
                        if let Some(observed) = &observed {
                            match offline::status_of(
                                &registry, &resource, &rendered, &warnings, observed,
                            ) {
                                Ok(status) => objects.push(with_status(&resource, status)),
                                Err(e) => failures.push(format!("{place}: status: {e}")),
                            }
                        }
                        if observed.is_some() {
                            children.extend(
                                rendered
                                    .iter()
                                    .map(|c| (resource.namespace.clone(), c.clone())),
                            );
                        }
                        objects.extend(rendered);
                    }
                    Err(e) => failures.push(format!("{place}: {e}")),
                }
            }
        }
        Ok(())
    })?;
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("error: {f}");
        }
        eprintln!(
            "{} resource(s) could not be rendered; nothing was printed",
            failures.len()
        );
        return Ok(ExitCode::from(1));
    }
    if let Some(observed) = &observed {
        for object in observed.unmatched(children.iter().map(|(ns, c)| (ns.as_str(), c))) {
            eprintln!(
                "warning: --observed: {object} is no child rendered: its apiVersion, kind, namespace or name differ from what the plugin renders"
            );
        }
    }
    emit(&documents::write(&objects, args.output)?)?;
    Ok(ExitCode::SUCCESS)
}

/// The objects of the `--observed` files.
fn observed(files: &[String]) -> Result<Observed, Error> {
    let mut observed = Observed::default();
    for file in &documents::expand(files)? {
        let text = documents::read(file)?;
        for doc in documents::parse(file, &text)? {
            observed
                .add(doc.value)
                .map_err(|reason| Error::NotAResource {
                    place: format!("{file}: document {}", doc.index),
                    reason,
                })?;
        }
    }
    Ok(observed)
}

/// `resource` as an object, with `status`.
fn with_status(resource: &Resource, status: Value) -> Value {
    let mut metadata = json!({ "name": resource.name, "namespace": resource.namespace });
    if !resource.labels.is_empty() {
        metadata["labels"] = json!(resource.labels);
    }
    if !resource.annotations.is_empty() {
        metadata["annotations"] = json!(resource.annotations);
    }
    if resource.generation != 0 {
        metadata["generation"] = json!(resource.generation);
    }
    json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": metadata,
        "spec": resource.spec,
        "status": status,
    })
}
