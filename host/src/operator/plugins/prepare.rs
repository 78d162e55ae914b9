//! Preparation: what a Plugin asks for (its image and limits, each at most the operator's own),
//! pulled, verified against its digest, compiled and checked as `host check` does.

use super::*;
use crate::api::{PluginLimits, PluginSpec};

/// The image a Plugin's `spec` names (pinned by digest), and the limits it asks for.
pub(super) fn wanted(live: &Live, spec: &Value) -> Result<(Reference, Limits), Refusal> {
    let spec: PluginSpec = serde_json::from_value(spec.clone())
        .map_err(|e| Refusal::stalled("InvalidSpec", format!("spec: {e}")))?;
    let reference = Reference::parse(&spec.image)
        .map_err(|e| Refusal::stalled("InvalidImage", format!("spec.image: {e}")))?;
    if reference.digest.is_none() {
        return Err(Refusal::stalled(
            "TagNotAllowed",
            format!(
                "spec.image: {} names no digest: pin it (`host push` and `host pull` print REF@sha256:...)",
                spec.image
            ),
        ));
    }
    Ok((reference, limits(live, spec.limits.as_ref())?))
}

/// The sandbox limits `spec.limits` asks for, within the operator's own.
pub(super) fn limits(live: &Live, asked: Option<&PluginLimits>) -> Result<Limits, Refusal> {
    let mut limits = live.runtime.limits();
    let Some(l) = asked else {
        return Ok(limits);
    };
    let bad = |field: &str, e: crate::units::Error| {
        Refusal::stalled("InvalidLimits", format!("spec.limits.{field}: {e}"))
    };
    if let Some(t) = &l.timeout {
        limits.deadline = crate::units::parse_duration(t).map_err(|e| bad("timeout", e))?;
    }
    if let Some(m) = &l.memory {
        limits.memory_bytes = crate::units::parse_bytes(m).map_err(|e| bad("memory", e))?;
    }
    if let Some(o) = &l.output {
        limits.output_bytes = crate::units::parse_bytes(o).map_err(|e| bad("output", e))?;
    }
    if let Some(n) = l.max_manifests.and_then(|n| usize::try_from(n).ok()) {
        limits.max_manifests = n;
    }
    Ok(live.runtime.with_limits(limits).limits())
}

/// Checks the plugin's signatures against the operator's policy (nothing of an artifact the
/// policy refuses is downloaded), pulls it (checked against its digest; kept in the store),
/// compiles it (the compile cache), runs the checks of `host check` and loads it under
/// `limits`. Nothing of the cluster is read or written.
pub(super) async fn prepare(
    live: &Live,
    ctx: &Context,
    name: &str,
    reference: Reference,
    limits: Limits,
) -> Result<Prepared, Refusal> {
    let signature = match &live.signatures {
        Some(policy) => Some(
            policy
                .check(&reference, &live.registries)
                .await
                .map_err(signature_refusal)?,
        ),
        None => None,
    };
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
        let (wasm, sha256, ctx) = (pulled.wasm, pulled.sha256, ctx.clone());
        // The plugin the checks loaded is the one served: one load, and the bytes hashed only
        // by the pull, which checked them against the layer's digest.
        tokio::task::spawn_blocking(move || {
            crate::check::check_keeping(&runtime, &wasm, Some(sha256), &source, &ctx, &[])
        })
        .await
        .map_err(|e| Refusal::transient("LoadFailed", e.to_string()))?
    };
    match plugin {
        Some(plugin) => Ok(Prepared {
            reference: pulled.reference,
            limits,
            plugin,
            signature,
        }),
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

/// Why the signature policy refused a Plugin's image, as its status says it.
fn signature_refusal(e: crate::signature::Error) -> Refusal {
    use crate::signature::Error;
    if e.is_transient() {
        return Refusal::transient("SignatureCheckFailed", e.to_string());
    }
    let reason = match &e {
        Error::NoRule { .. } => "NoSignatureRule",
        Error::Rule { source, .. } if matches!(**source, Error::Unsigned { .. }) => "Unsigned",
        Error::Rule { source, .. } if matches!(**source, Error::Untrusted { .. }) => {
            "UntrustedSignature"
        }
        _ => "SignatureCheckFailed",
    };
    Refusal::stalled(reason, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> Live {
        Live {
            runtime: Runtime::new(Limits::default(), None).expect("a runtime"),
            registries: oci::Options::default(),
            store: None,
            signatures: None,
        }
    }

    const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn a_plugin_names_its_image_by_digest_and_asks_for_limits_within_the_operators() {
        let live = live();
        let (reference, limits) = wanted(
            &live,
            &json!({
                "image": format!("oci://registry.example/plugins/site@{DIGEST}"),
                "limits": { "timeout": "500ms", "memory": "1Gi", "maxManifests": 10 },
            }),
        )
        .unwrap();
        assert_eq!(reference.digest.as_deref(), Some(DIGEST));
        assert_eq!(limits.deadline, Duration::from_millis(500));
        assert_eq!(limits.max_manifests, 10);
        // More memory than the operator's own is lowered to it.
        assert_eq!(limits.memory_bytes, Limits::default().memory_bytes);
        let (_, defaults) = wanted(
            &live,
            &json!({ "image": format!("registry.example/p@{DIGEST}") }),
        )
        .unwrap();
        assert_eq!(defaults, live.runtime.limits());
    }

    #[test]
    fn a_tag_a_bad_limit_or_a_spec_without_an_image_is_refused_for_good() {
        let live = live();
        let refused = |spec: Value| wanted(&live, &spec).unwrap_err();
        let tag = refused(json!({ "image": "registry.example/p:1.0" }));
        assert_eq!(tag.reason, "TagNotAllowed");
        let limit = refused(json!({
            "image": format!("registry.example/p@{DIGEST}"),
            "limits": { "timeout": "soon" },
        }));
        assert_eq!(limit.reason, "InvalidLimits");
        assert!(
            limit.message.contains("spec.limits.timeout"),
            "{}",
            limit.message
        );
        assert_eq!(refused(json!({})).reason, "InvalidSpec");
        for r in [tag, limit] {
            assert!(!r.transient, "{r:?}");
        }
    }
}
