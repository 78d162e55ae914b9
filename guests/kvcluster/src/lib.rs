//! The `kvcluster` plugin: the KV-Operator's `KVCluster` (`storage.mydatabase.io/v1alpha1`), a
//! Raft key-value store.
//!
//! A resource becomes a StatefulSet `<name>` of `spec.size` replicas with a volume for the WAL and
//! Raft data, and a headless Service `<name>-service`, shaped as the KV-Operator shaped them, so
//! that its clusters are taken over as they are. Every pod learns the seed's address before
//! it exists: `SEED_NODE_ADDR` is `<name>-0.<name>-service.<namespace>.svc.<domain>:50051`, so
//! replicas 1..N join replica 0.
//!
//! The Kind keeps its own group: `--api-group` does not move it.

use guest_kit::render::{self, MANAGED_BY};
use guest_kit::schema;
use guest_kit::spec;
use guest_kit::{
    Context, GroupVersionKind, KindInfo, ObservedChild, Plugin, PluginInfo, PrinterColumn,
    RenderError, Resource, Result,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The plugin.
pub struct KvClusterPlugin;

guest_kit::export_plugin!(KvClusterPlugin);

/// The Kind's group.
pub const GROUP: &str = "storage.mydatabase.io";
/// The gRPC port clients and joining nodes use (the seed's address names it).
pub const GRPC_PORT: i64 = 50051;
/// The Raft port between nodes.
pub const RAFT_PORT: i64 = 60051;
/// The metrics port.
pub const METRICS_PORT: i64 = 51051;
/// The image when `spec.image` is absent.
pub const DEFAULT_IMAGE: &str = "kv-storage:latest";
/// The claim template holding the WAL and Raft data, and where it is mounted.
pub const DATA_VOLUME: &str = "data-volume";
const DATA_PATH: &str = "/app/raft-data";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KvClusterSpec {
    size: i64,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    storage_size: Option<String>,
    #[serde(default)]
    storage_class_name: Option<String>,
    #[serde(default)]
    resources: Option<Value>,
}

impl Plugin for KvClusterPlugin {
    fn describe(_ctx: &Context) -> PluginInfo {
        let mut columns = vec![PrinterColumn::new(
            "Size",
            "integer",
            ".spec.size",
            "Nodes in the Raft group",
        )];
        columns.extend(render::standard_printer_columns());
        PluginInfo {
            name: "kvcluster".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec![KindInfo {
                group: GROUP.into(),
                versions: vec!["v1alpha1".into()],
                kind: "KVCluster".into(),
                plural: "kvclusters".into(),
                short_names: vec!["kvc".into()],
                engine: None,
                spec_schema: spec_schema(),
                printer_columns: columns,
                status_schema: Some(json!({
                    "type": "object",
                    "properties": {
                        "seedAddress": schema::string("host:port every node joins the Raft group through (replica 0)"),
                        "readyNodes": schema::integer("Nodes of the StatefulSet that are ready"),
                        "size": schema::integer("Nodes asked for (spec.size)"),
                    },
                })),
                // Its spec names no other object.
                references: Vec::new(),
            }],
            children: vec![
                GroupVersionKind::new("apps", "v1", "StatefulSet"),
                GroupVersionKind::new("", "v1", "Service"),
            ],
        }
    }

    fn render(resource: &Resource, ctx: &Context) -> Result<Vec<Value>> {
        render_kvcluster(resource, ctx)
    }

    fn status(
        resource: &Resource,
        children: &[ObservedChild],
        ctx: &Context,
    ) -> Result<Map<String, Value>> {
        let mut fields = Map::new();
        fields.insert("seedAddress".into(), seed_address(resource, ctx).into());
        if let Some(size) = resource.spec.get("size").and_then(Value::as_i64) {
            fields.insert("size".into(), size.into());
        }
        let ready = children
            .iter()
            .find(|c| c.kind == "StatefulSet" && c.name == resource.name)
            .map_or(0, |s| s.count("readyReplicas"));
        fields.insert("readyNodes".into(), ready.into());
        Ok(fields)
    }
}

/// Where every node joins the Raft group: replica 0, through the headless Service.
fn seed_address(resource: &Resource, ctx: &Context) -> String {
    format!(
        "{name}-0.{name}-service.{}.svc.{}:{GRPC_PORT}",
        resource.namespace,
        ctx.cluster_domain,
        name = resource.name
    )
}

/// Renders a KVCluster.
pub fn render_kvcluster(resource: &Resource, ctx: &Context) -> Result<Vec<Value>> {
    let name = &resource.name;
    spec::dns_label("metadata.name", name)?;
    if name.len() > 55 {
        return Err(RenderError::new(
            "metadata.name",
            "must be at most 55 characters: the headless Service is named <name>-service",
        ));
    }
    let s: KvClusterSpec = spec::parse(&resource.spec)?;
    if !(1..=1000).contains(&s.size) {
        return Err(RenderError::new(
            "spec.size",
            format!("{} must be between 1 and 1000", s.size),
        ));
    }
    let storage = s.storage_size.as_deref().unwrap_or("1Gi");
    spec::quantity("spec.storageSize", storage)?;
    let image = s.image.as_deref().unwrap_or(DEFAULT_IMAGE);
    if image.trim().is_empty() {
        return Err(RenderError::new("spec.image", "must not be empty"));
    }

    // The workload is the KV-Operator's, field for field (its public source): selector and pod
    // labels `app: <name>`, container `storage-node`, ports grpc, raft and metrics, claim
    // template `data-volume` at /app/raft-data. A KVCluster it made is taken over with no
    // immutable field changed and, unless the spec asks otherwise, no pod replaced
    // (docs/migration.md). The host's own labels go on the objects, not in the selector.
    let service = format!("{name}-service");
    let mut labels: Map<String, Value> = render::selector(name);
    labels.insert("app".into(), name.as_str().into());
    labels.insert("app.kubernetes.io/managed-by".into(), MANAGED_BY.into());
    let mut selector = Map::new();
    selector.insert("app".into(), name.as_str().into());
    let meta = |n: &str| json!({ "name": n, "namespace": resource.namespace, "labels": labels });
    let ports = [
        ("grpc", GRPC_PORT),
        ("raft", RAFT_PORT),
        ("metrics", METRICS_PORT),
    ];

    let seed_addr = seed_address(resource, ctx);
    let mut container = json!({
        "name": "storage-node",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": ports
            .iter()
            .map(|(n, p)| json!({ "name": n, "containerPort": p, "protocol": "TCP" }))
            .collect::<Vec<_>>(),
        "env": [
            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
            { "name": "NODE_ID", "value": "$(POD_NAME)" },
            { "name": "SEED_NODE_ID", "value": format!("{name}-0") },
            { "name": "SEED_NODE_ADDR", "value": seed_addr },
        ],
        "volumeMounts": [{ "name": DATA_VOLUME, "mountPath": DATA_PATH }],
    });
    if let Some(r) = &s.resources {
        container["resources"] = r.clone();
    }
    let mut claim = json!({ "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": storage } } });
    if let Some(c) = &s.storage_class_name {
        claim["storageClassName"] = c.as_str().into();
    }
    let statefulset = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(name),
        "spec": {
            "replicas": s.size,
            "serviceName": service,
            "selector": { "matchLabels": selector },
            "template": { "metadata": { "labels": selector }, "spec": { "containers": [container] } },
            "volumeClaimTemplates": [{ "metadata": { "name": DATA_VOLUME }, "spec": claim }],
        },
    });
    let headless = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(&service),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": selector,
            "ports": ports
                .iter()
                .map(|(n, p)| json!({ "name": n, "port": p, "targetPort": p, "protocol": "TCP" }))
                .collect::<Vec<_>>(),
        },
    });
    Ok(vec![statefulset, headless])
}

/// The OpenAPI schema of a KVCluster's spec.
pub fn spec_schema() -> Value {
    use schema::{integer, k8s, object, string};
    object(
        "A Raft key-value cluster.",
        &[
            ("size", integer("Number of nodes in the consensus group.")),
            (
                "image",
                string("The key-value store's image (default kv-storage:latest)."),
            ),
            (
                "storageSize",
                string("Size of each node's WAL and Raft volume (default 1Gi)."),
            ),
            ("storageClassName", string("Storage class of the volumes.")),
            ("resources", k8s("io.k8s.api.core.v1.ResourceRequirements")),
        ],
        &["size"],
    )
}
