//! The `service` plugin: HIP-0400's `Service` Kind, its facades (`IAM`, `KMS`, `LLM`, `Indexer`,
//! `Explorer`) and the legacy `HanzoService` (`v1alpha1`).
//!
//! A resource becomes a Deployment and, as its spec asks, a ClusterIP Service, an Ingress, a
//! HorizontalPodAutoscaler, a PodDisruptionBudget, a NetworkPolicy, a ServiceMonitor and one
//! KMSSecret per `kmsSecrets` item. `env`, `envFrom`, `volumes`, `volumeMounts`, `resources`,
//! `sidecars` and `initContainers` reach the pod template unchanged.

use std::collections::BTreeMap;

use guest_kit::render::{self, PortSpec, Workload};
use guest_kit::schema;
use guest_kit::spec::{self, IntOrString};
use guest_kit::{
    Context, GroupVersionKind, KindInfo, Plugin, PluginInfo, RenderError, Resource, Result,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The plugin.
pub struct ServicePlugin;

guest_kit::export_plugin!(ServicePlugin);

/// (Kind, plural, short name, version, engine) of every Kind this plugin serves.
const KINDS: [(&str, &str, &str, &str, Option<&str>); 7] = [
    ("Service", "services", "hsvc", "v1", None),
    ("IAM", "iams", "iam", "v1", None),
    ("KMS", "kmsapps", "kms", "v1", None),
    ("LLM", "llms", "llm", "v1", None),
    ("Indexer", "indexers", "idx", "v1", None),
    ("Explorer", "explorers", "exp", "v1", None),
    ("HanzoService", "hanzoservices", "", "v1alpha1", None),
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServiceOnly {
    #[serde(default)]
    ingress: Option<IngressSpec>,
    #[serde(default)]
    autoscaling: Option<AutoscalingSpec>,
    #[serde(default)]
    pdb: Option<PdbSpec>,
    #[serde(default)]
    strategy: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IngressSpec {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    ingress_class_name: Option<String>,
    #[serde(default)]
    tls: Option<bool>,
    #[serde(default)]
    cluster_issuer: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    path_rules: Vec<PathRule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PathRule {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    path_type: Option<String>,
    #[serde(default)]
    port: Option<IntOrString>,
    #[serde(default)]
    service_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AutoscalingSpec {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    min_replicas: Option<i64>,
    #[serde(default)]
    max_replicas: Option<i64>,
    #[serde(default, alias = "targetCpuUtilization")]
    target_cpu_utilization_percentage: Option<i64>,
    #[serde(default, alias = "targetMemoryUtilization")]
    target_memory_utilization_percentage: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PdbSpec {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    min_available: Option<IntOrString>,
    #[serde(default)]
    max_unavailable: Option<IntOrString>,
}

impl Plugin for ServicePlugin {
    fn describe(ctx: &Context) -> PluginInfo {
        let mut children = GroupVersionKind::list(&[
            ("apps", "v1", "Deployment"),
            ("", "v1", "Service"),
            ("networking.k8s.io", "v1", "Ingress"),
            ("autoscaling", "v2", "HorizontalPodAutoscaler"),
            ("policy", "v1", "PodDisruptionBudget"),
            ("networking.k8s.io", "v1", "NetworkPolicy"),
            ("monitoring.coreos.com", "v1", "ServiceMonitor"),
        ]);
        children.push(GroupVersionKind::new(
            &format!("kms.{}", ctx.api_group),
            "v1",
            "KMSSecret",
        ));
        PluginInfo {
            name: "service".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: KindInfo::table(&ctx.api_group, &KINDS, &spec_schema(), &printer_columns())
                .into_iter()
                .map(|k| KindInfo {
                    references: schema::workload_references(),
                    ..k
                })
                .collect(),
            children,
        }
    }

    fn render(resource: &Resource, ctx: &Context) -> Result<Vec<Value>> {
        render_service(resource, ctx)
    }
}

fn printer_columns() -> Vec<guest_kit::PrinterColumn> {
    let mut cols = vec![guest_kit::PrinterColumn {
        priority: 1,
        ..guest_kit::PrinterColumn::new(
            "Image",
            "string",
            ".spec.image.repository",
            "Image repository",
        )
    }];
    cols.extend(render::standard_printer_columns());
    cols
}

/// Renders a Service-shaped resource.
pub fn render_service(resource: &Resource, ctx: &Context) -> Result<Vec<Value>> {
    spec::dns_label("metadata.name", &resource.name)?;
    let w = Workload::parse(resource)?;
    let own: ServiceOnly = spec::parse(&resource.spec)?;
    let ports = w.ports.clone().unwrap_or_default();
    let labels = w.labels(resource);

    let autoscaling = own
        .autoscaling
        .as_ref()
        .filter(|a| a.enabled != Some(false));
    let mut out = vec![deployment(
        resource,
        &w,
        &own,
        &labels,
        &ports,
        autoscaling.is_some(),
    )?];
    if !ports.is_empty() {
        out.push(render::service(
            resource,
            &resource.name,
            &labels,
            &ports,
            false,
        ));
    }
    if let Some(ing) = own.ingress.as_ref().filter(|i| i.enabled != Some(false)) {
        out.push(ingress(resource, &labels, ing, &ports)?);
    }
    if let Some(a) = autoscaling {
        out.push(hpa(resource, &labels, a)?);
    }
    if let Some(p) = own.pdb.as_ref().filter(|p| p.enabled != Some(false)) {
        out.push(pdb(resource, &labels, p)?);
    }
    out.extend(render::network_policy(
        resource,
        &labels,
        w.network_policy.as_ref(),
        &ports,
    ));
    out.extend(render::service_monitor(
        resource,
        &labels,
        w.service_monitor.as_ref(),
        &ports,
    )?);
    out.extend(render::kms_secrets(resource, ctx, &labels, &w.kms_secrets)?);
    Ok(out)
}

fn deployment(
    resource: &Resource,
    w: &Workload,
    own: &ServiceOnly,
    labels: &Map<String, Value>,
    ports: &[PortSpec],
    autoscaled: bool,
) -> Result<Value> {
    let main = w.container(
        &resource.name,
        ports,
        w.env.clone(),
        vec![],
        w.command.as_deref(),
        w.args.as_deref(),
    )?;
    let mut spec = json!({
        "selector": { "matchLabels": render::selector(&resource.name) },
        "template": w.pod_template(labels, main, vec![]),
    });
    if !autoscaled {
        spec["replicas"] = w.replicas.unwrap_or(1).into();
    }
    if let Some(s) = &own.strategy {
        if !["RollingUpdate", "Recreate"].contains(&s.as_str()) {
            return Err(RenderError::new(
                "spec.strategy",
                format!("`{s}` is not one of RollingUpdate, Recreate"),
            ));
        }
        spec["strategy"] = json!({ "type": s });
    }
    Ok(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": w.metadata(resource, &resource.name, labels),
        "spec": spec,
    }))
}

fn ingress(
    resource: &Resource,
    labels: &Map<String, Value>,
    ing: &IngressSpec,
    ports: &[PortSpec],
) -> Result<Value> {
    for key in ing.annotations.keys() {
        spec::label_key("spec.ingress.annotations", key)?;
    }
    let Some(first) = ports.first() else {
        return Err(RenderError::new(
            "spec.ingress",
            "needs a port to route to: add one to spec.ports, or set spec.ingress.enabled: false",
        ));
    };
    let backend_port = |rule: Option<&PathRule>, field: &str| -> Result<Value> {
        let own_service = rule.and_then(|r| r.service_name.as_deref()).is_none();
        match rule.and_then(|r| r.port.as_ref()) {
            Some(IntOrString::Int(n)) => {
                spec::port_number(&format!("{field}.port"), *n)?;
                if own_service && !ports.iter().any(|p| p.service_port() == *n) {
                    return Err(RenderError::new(
                        format!("{field}.port"),
                        format!("{n} is not a servicePort of spec.ports"),
                    ));
                }
                Ok(json!({ "number": n }))
            }
            Some(IntOrString::String(name)) => {
                if own_service && !ports.iter().any(|p| p.name.as_deref() == Some(name)) {
                    return Err(RenderError::new(
                        format!("{field}.port"),
                        format!("`{name}` is not the name of a port in spec.ports"),
                    ));
                }
                Ok(json!({ "name": name }))
            }
            None => Ok(match &first.name {
                Some(n) => json!({ "name": n }),
                None => json!({ "number": first.service_port() }),
            }),
        }
    };
    let mut paths = Vec::new();
    if ing.path_rules.is_empty() {
        paths.push(json!({
            "path": "/",
            "pathType": "Prefix",
            "backend": { "service": { "name": resource.name, "port": backend_port(None, "")? } },
        }));
    }
    for (i, rule) in ing.path_rules.iter().enumerate() {
        let field = format!("spec.ingress.pathRules[{i}]");
        let path_type = rule.path_type.as_deref().unwrap_or("Prefix");
        if !["Prefix", "Exact", "ImplementationSpecific"].contains(&path_type) {
            return Err(RenderError::new(
                format!("{field}.pathType"),
                format!("`{path_type}` is not one of Prefix, Exact, ImplementationSpecific"),
            ));
        }
        paths.push(json!({
            "path": rule.path.as_deref().unwrap_or("/"),
            "pathType": path_type,
            "backend": { "service": {
                "name": rule.service_name.as_deref().unwrap_or(&resource.name),
                "port": backend_port(Some(rule), &field)?,
            } },
        }));
    }
    let rules: Vec<Value> = if ing.hosts.is_empty() {
        vec![json!({ "http": { "paths": paths } })]
    } else {
        ing.hosts
            .iter()
            .map(|h| json!({ "host": h, "http": { "paths": paths } }))
            .collect()
    };
    let mut spec = json!({ "rules": rules });
    if let Some(c) = &ing.ingress_class_name {
        spec["ingressClassName"] = c.as_str().into();
    }
    if ing.tls != Some(false) && !ing.hosts.is_empty() {
        spec["tls"] =
            json!([{ "hosts": ing.hosts, "secretName": format!("{}-tls", resource.name) }]);
    }
    let mut annotations: Map<String, Value> = ing
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    if let Some(issuer) = &ing.cluster_issuer {
        annotations.insert(
            "cert-manager.io/cluster-issuer".into(),
            issuer.as_str().into(),
        );
    }
    let mut metadata = render::metadata(resource, &resource.name, labels);
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    Ok(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": metadata,
        "spec": spec,
    }))
}

fn hpa(resource: &Resource, labels: &Map<String, Value>, a: &AutoscalingSpec) -> Result<Value> {
    let min = a.min_replicas.unwrap_or(1);
    spec::int32("spec.autoscaling.minReplicas", min)?;
    if min < 1 {
        return Err(RenderError::new(
            "spec.autoscaling.minReplicas",
            format!("{min} must be at least 1"),
        ));
    }
    let max = a.max_replicas.ok_or_else(|| {
        RenderError::new(
            "spec.autoscaling.maxReplicas",
            "is required when autoscaling is enabled",
        )
    })?;
    spec::int32("spec.autoscaling.maxReplicas", max)?;
    if max < min {
        return Err(RenderError::new(
            "spec.autoscaling.maxReplicas",
            format!("{max} is below minReplicas ({min})"),
        ));
    }
    let mut metrics = Vec::new();
    for (resource_name, target, field) in [
        (
            "cpu",
            a.target_cpu_utilization_percentage,
            "targetCPUUtilizationPercentage",
        ),
        (
            "memory",
            a.target_memory_utilization_percentage,
            "targetMemoryUtilizationPercentage",
        ),
    ] {
        if let Some(t) = target {
            spec::int32(&format!("spec.autoscaling.{field}"), t)?;
            if t < 1 {
                return Err(RenderError::new(
                    format!("spec.autoscaling.{field}"),
                    format!("{t} must be at least 1"),
                ));
            }
            metrics.push(json!({
                "type": "Resource",
                "resource": { "name": resource_name, "target": { "type": "Utilization", "averageUtilization": t } },
            }));
        }
    }
    if metrics.is_empty() {
        // What the HPA controller assumes when no metric is given, written out.
        metrics.push(json!({
            "type": "Resource",
            "resource": { "name": "cpu", "target": { "type": "Utilization", "averageUtilization": 80 } },
        }));
    }
    Ok(json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": render::metadata(resource, &resource.name, labels),
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": resource.name },
            "minReplicas": min,
            "maxReplicas": max,
            "metrics": metrics,
        },
    }))
}

/// An `IntOrString` for a Kubernetes field, whose number is an `int32`.
fn int_or_string(field: &str, v: &IntOrString) -> Result<Value> {
    if let IntOrString::Int(n) = v {
        spec::int32(field, *n)?;
    }
    Ok(v.to_value())
}

fn pdb(resource: &Resource, labels: &Map<String, Value>, p: &PdbSpec) -> Result<Value> {
    let mut spec = json!({ "selector": { "matchLabels": render::selector(&resource.name) } });
    match (&p.min_available, &p.max_unavailable) {
        (Some(_), Some(_)) => {
            return Err(RenderError::new(
                "spec.pdb.maxUnavailable",
                "conflicts with spec.pdb.minAvailable: set one of them",
            ));
        }
        (Some(m), None) => spec["minAvailable"] = int_or_string("spec.pdb.minAvailable", m)?,
        (None, Some(m)) => spec["maxUnavailable"] = int_or_string("spec.pdb.maxUnavailable", m)?,
        (None, None) => spec["maxUnavailable"] = 1.into(),
    }
    Ok(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": render::metadata(resource, &resource.name, labels),
        "spec": spec,
    }))
}

/// The OpenAPI schema of a Service-shaped spec.
pub fn spec_schema() -> Value {
    use schema::{
        array, boolean, enumeration, int_or_string, integer, max_items, max_length, object, string,
        string_item, string_map,
    };
    let mut props = schema::workload_properties();
    props.extend([
        (
            "ingress",
            object(
                "An Ingress to the Service.",
                &[
                    ("enabled", boolean("On unless false.")),
                    // Every host gets every path rule: 32 by 32 keeps the Ingress small.
                    (
                        "hosts",
                        max_items(array("Host names.", string_item(253)), 32),
                    ),
                    ("ingressClassName", string("Ingress class.")),
                    (
                        "tls",
                        boolean("Terminate TLS with the secret <name>-tls (default true)."),
                    ),
                    (
                        "clusterIssuer",
                        string("cert-manager ClusterIssuer for the certificate."),
                    ),
                    ("annotations", string_map("Annotations of the Ingress.")),
                    (
                        "pathRules",
                        max_items(
                            array(
                                "Paths and their backends (default: / to the first port).",
                                object(
                                    "A path rule.",
                                    &[
                                        ("path", max_length(string("Path (default /)."), 256)),
                                        (
                                            "pathType",
                                            enumeration(
                                                "Path type (default Prefix).",
                                                &["Prefix", "Exact", "ImplementationSpecific"],
                                            ),
                                        ),
                                        ("port", int_or_string("Service port by number or name.")),
                                        (
                                            "serviceName",
                                            max_length(
                                                string(
                                                    "Backend Service (default: this resource's).",
                                                ),
                                                63,
                                            ),
                                        ),
                                    ],
                                    &[],
                                ),
                            ),
                            32,
                        ),
                    ),
                ],
                &[],
            ),
        ),
        (
            "autoscaling",
            object(
                "A HorizontalPodAutoscaler for the Deployment.",
                &[
                    ("enabled", boolean("On unless false.")),
                    ("minReplicas", integer("Lower bound (default 1).")),
                    ("maxReplicas", integer("Upper bound.")),
                    (
                        "targetCPUUtilizationPercentage",
                        integer("Average CPU utilisation target."),
                    ),
                    (
                        "targetMemoryUtilizationPercentage",
                        integer("Average memory utilisation target."),
                    ),
                    (
                        "targetCpuUtilization",
                        integer("Alias of targetCPUUtilizationPercentage."),
                    ),
                    (
                        "targetMemoryUtilization",
                        integer("Alias of targetMemoryUtilizationPercentage."),
                    ),
                ],
                &[],
            ),
        ),
        (
            "pdb",
            object(
                "A PodDisruptionBudget (default maxUnavailable 1).",
                &[
                    ("enabled", boolean("On unless false.")),
                    (
                        "minAvailable",
                        int_or_string("Pods that must stay available."),
                    ),
                    (
                        "maxUnavailable",
                        int_or_string("Pods that may be unavailable."),
                    ),
                ],
                &[],
            ),
        ),
        (
            "strategy",
            enumeration("Deployment strategy.", &["RollingUpdate", "Recreate"]),
        ),
    ]);
    object(
        "The desired state of a Service-shaped workload.",
        &props,
        &["image"],
    )
}
