//! Preparation: what a Plugin asks for (its image and limits, each at most the operator's own),
//! pulled, verified against its digest, compiled and checked as `host check` does.

use super::*;

/// The image a Plugin's `spec` names (pinned by digest), and the limits it asks for.
pub(super) fn wanted(live: &Live, spec: &Value) -> Result<(Reference, Limits), Refusal> {
    let image = spec["image"].as_str().unwrap_or_default();
    let reference = Reference::parse(image)
        .map_err(|e| Refusal::stalled("InvalidImage", format!("spec.image: {e}")))?;
    if reference.digest.is_none() {
        return Err(Refusal::stalled(
            "TagNotAllowed",
            format!(
                "spec.image: {image} names no digest: pin it (`host push` and `host pull` print REF@sha256:...)"
            ),
        ));
    }
    Ok((reference, limits(live, spec)?))
}

/// The sandbox limits `spec.limits` asks for, within the operator's own.
pub(super) fn limits(live: &Live, spec: &Value) -> Result<Limits, Refusal> {
    let mut limits = live.runtime.limits();
    let l = &spec["limits"];
    let bad = |field: &str, e: crate::units::Error| {
        Refusal::stalled("InvalidLimits", format!("spec.limits.{field}: {e}"))
    };
    if let Some(t) = l["timeout"].as_str() {
        limits.deadline = crate::units::parse_duration(t).map_err(|e| bad("timeout", e))?;
    }
    if let Some(m) = l["memory"].as_str() {
        limits.memory_bytes = crate::units::parse_bytes(m).map_err(|e| bad("memory", e))?;
    }
    if let Some(o) = l["output"].as_str() {
        limits.output_bytes = crate::units::parse_bytes(o).map_err(|e| bad("output", e))?;
    }
    if let Some(n) = l["maxManifests"].as_u64() {
        limits.max_manifests = usize::try_from(n).unwrap_or(usize::MAX);
    }
    Ok(live.runtime.with_limits(limits).limits())
}

/// Pulls the plugin (checked against its digest; kept in the store), compiles it (the compile
/// cache), runs the checks of `host check` and loads it under `limits`. Nothing of the cluster
/// is read or written.
pub(super) async fn prepare(
    live: &Live,
    ctx: &Context,
    name: &str,
    reference: Reference,
    limits: Limits,
) -> Result<Prepared, Refusal> {
    let pulled = oci::pull(&reference, &live.registries, live.store.as_ref(), true)
        .await
        .map_err(|e| match e {
            oci::Error::Unreachable { .. } | oci::Error::Registry { .. } => {
                Refusal::transient("PullFailed", e.to_string())
            }
            other => Refusal::stalled("PullFailed", other.to_string()),
        })?;
    let source = format!("Plugin/{name} ({}{})", oci::SCHEME, pulled.reference);
    let runtime = live.runtime.with_limits(limits);
    let (report, plugin) = {
        let (wasm, ctx) = (pulled.wasm, ctx.clone());
        tokio::task::spawn_blocking(move || {
            let report = crate::check::check(&runtime, &wasm, &source, &ctx, &[]);
            let plugin = report.passed.then(|| runtime.load(&wasm, &source, &ctx));
            (report, plugin)
        })
        .await
        .map_err(|e| Refusal::transient("LoadFailed", e.to_string()))?
    };
    match plugin {
        Some(Ok(plugin)) => Ok(Prepared {
            reference: pulled.reference,
            limits,
            plugin,
        }),
        Some(Err(e)) => Err(Refusal::stalled("LoadFailed", e.to_string())),
        None => {
            let failed: Vec<String> = report
                .findings
                .iter()
                .filter(|f| f.outcome == crate::check::Outcome::Fail)
                .map(|f| format!("{}: {}", f.check, f.detail))
                .collect();
            Err(Refusal::stalled(
                "CheckFailed",
                format!("host check failed: {}", failed.join("; ")),
            ))
        }
    }
}
