//! The `datastore` plugin: HIP-0401's `Datastore` Kind, its facades (`SQL`, `KV`, `DocDB`, `S3`)
//! and the legacy `HanzoDatastore` (`v1alpha1`).
//!
//! A resource becomes a StatefulSet with one PersistentVolumeClaim template, a headless Service
//! `<name>-hs`, a ClusterIP Service `<name>` and one more per `serviceAliases` entry, and, as its
//! spec asks, KMSSecrets, a NetworkPolicy, a ServiceMonitor and a backup CronJob `<name>-backup`.

use std::collections::BTreeSet;

use guest_kit::render::{self, PortSpec, Workload};
use guest_kit::schema;
use guest_kit::spec;
use guest_kit::{
    Context, GroupVersionKind, KindInfo, ObservedChild, Plugin, PluginInfo, RenderError, Rendered,
    Resource, Result, Warning,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The plugin.
pub struct DatastorePlugin;

guest_kit::export_plugin!(DatastorePlugin);

/// (Kind, plural, short name, version, engine implied by the Kind).
const KINDS: [(&str, &str, &str, &str, Option<&str>); 6] = [
    ("Datastore", "datastores", "hds", "v1", None),
    ("SQL", "sqls", "sql", "v1", Some("postgresql")),
    ("KV", "kvs", "kv", "v1", Some("valkey")),
    ("DocDB", "docdbs", "docdb", "v1", Some("docdb")),
    ("S3", "s3s", "s3", "v1", Some("minio")),
    ("HanzoDatastore", "hanzodatastores", "", "v1alpha1", None),
];

/// What the datastore knows about one engine.
#[derive(Debug)]
pub struct Engine {
    /// `spec.type` value.
    pub name: &'static str,
    /// Default ports (name, number); `spec.ports` replaces them.
    pub ports: &'static [(&'static str, i64)],
    /// Where the data volume is mounted.
    pub data_path: &'static str,
    /// (secret key, variable) read from `credentialsSecret`.
    pub credentials: &'static [(&'static str, &'static str)],
    /// Fixed defaults of the container environment.
    pub env: &'static [(&'static str, &'static str)],
    /// Container args when the user gives none (`$(VAR)` refers to the environment).
    pub args: &'static [&'static str],
}

/// Every engine, by `spec.type`.
pub const ENGINES: [Engine; 6] = [
    Engine {
        name: "datastore",
        ports: &[("http", 8123), ("native", 9000)],
        data_path: "/var/lib/clickhouse",
        credentials: &[
            ("username", "CLICKHOUSE_USER"),
            ("password", "CLICKHOUSE_PASSWORD"),
        ],
        env: &[],
        args: &[],
    },
    Engine {
        name: "postgresql",
        ports: &[("postgresql", 5432)],
        data_path: "/var/lib/postgresql/data",
        credentials: &[
            ("username", "POSTGRES_USER"),
            ("password", "POSTGRES_PASSWORD"),
        ],
        env: &[("PGDATA", "/var/lib/postgresql/data/pgdata")],
        args: &[],
    },
    Engine {
        name: "valkey",
        ports: &[("valkey", 6379)],
        data_path: "/data",
        credentials: &[("password", "VALKEY_PASSWORD")],
        env: &[],
        args: &[],
    },
    Engine {
        name: "docdb",
        ports: &[("mongodb", 27017)],
        data_path: "/state",
        credentials: &[("url", "FERRETDB_POSTGRESQL_URL")],
        env: &[],
        args: &[],
    },
    Engine {
        name: "minio",
        ports: &[("s3", 9000), ("console", 9001)],
        data_path: "/data",
        credentials: &[
            ("accessKey", "MINIO_ROOT_USER"),
            ("secretKey", "MINIO_ROOT_PASSWORD"),
        ],
        env: &[],
        args: &["server", "/data", "--console-address", ":9001"],
    },
    Engine {
        name: "nats",
        ports: &[("client", 4222)],
        data_path: "/data",
        credentials: &[],
        env: &[],
        args: &["--jetstream", "--store_dir", "/data"],
    },
];

/// The engine named by a `spec.type` value (`clickhouse` is an alias of `datastore`).
pub fn engine(type_: &str) -> Option<&'static Engine> {
    let name = if type_ == "clickhouse" {
        "datastore"
    } else {
        type_
    };
    ENGINES.iter().find(|e| e.name == name)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DatastoreOnly {
    #[serde(default, rename = "type")]
    type_: Option<String>,
    #[serde(default)]
    storage: Option<StorageSpec>,
    #[serde(default)]
    credentials_secret: Option<String>,
    #[serde(default)]
    backup: Option<BackupSpec>,
    #[serde(default)]
    service_aliases: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StorageSpec {
    #[serde(default)]
    storage_class_name: Option<String>,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    retention_policy: Option<String>,
    #[serde(default)]
    volume_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BackupSpec {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    schedule: Option<String>,
    #[serde(default)]
    s3_endpoint: Option<String>,
    #[serde(default)]
    s3_bucket: Option<String>,
    #[serde(default)]
    s3_credentials_secret: Option<String>,
    #[serde(default)]
    retention_days: Option<i64>,
    #[serde(default)]
    image: Option<String>,
}

/// The image that uploads backups, unless `spec.backup.image` says otherwise.
pub const DEFAULT_BACKUP_IMAGE: &str = "minio/mc:latest";

impl Plugin for DatastorePlugin {
    fn describe(ctx: &Context) -> PluginInfo {
        let mut children = GroupVersionKind::list(&[
            ("apps", "v1", "StatefulSet"),
            ("", "v1", "Service"),
            ("batch", "v1", "CronJob"),
            ("networking.k8s.io", "v1", "NetworkPolicy"),
            ("monitoring.coreos.com", "v1", "ServiceMonitor"),
        ]);
        children.push(GroupVersionKind::new(
            &format!("kms.{}", ctx.api_group),
            "v1",
            "KMSSecret",
        ));
        PluginInfo {
            name: "datastore".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: KindInfo::table(&ctx.api_group, &KINDS, &spec_schema(), &printer_columns())
                .into_iter()
                .map(|k| KindInfo {
                    status_schema: Some(status_schema()),
                    references: references(),
                    ..k
                })
                .collect(),
            children,
        }
    }

    fn render(resource: &Resource, ctx: &Context) -> Result<Vec<Value>> {
        render_datastore(resource, ctx)
    }

    fn render_reported(resource: &Resource, ctx: &Context) -> Result<Rendered> {
        render_datastore_reported(resource, ctx)
    }

    fn status(
        resource: &Resource,
        children: &[ObservedChild],
        ctx: &Context,
    ) -> Result<Map<String, Value>> {
        Ok(datastore_status(resource, children, ctx))
    }
}

/// The status fields a Datastore reports (contract 1.1): how clients reach it, where its
/// credentials are, and how many replicas are ready.
fn status_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "endpoint": schema::string("host:port of the client Service, in the cluster's DNS"),
            "credentialsSecret": schema::string("The Secret holding the credentials clients log in with (spec.credentialsSecret), when there is one"),
            "readyReplicas": schema::integer("Replicas of the StatefulSet that are ready"),
            "replicas": schema::integer("Replicas the StatefulSet asks for"),
        },
    })
}

/// The status fields of a Datastore-shaped resource: its client endpoint and credentials Secret
/// (from its spec, as rendered), and its StatefulSet's replicas as the host observes them.
pub fn datastore_status(
    resource: &Resource,
    children: &[ObservedChild],
    ctx: &Context,
) -> Map<String, Value> {
    let mut fields = Map::new();
    let engine = spec::parse::<DatastoreOnly>(&resource.spec)
        .ok()
        .and_then(|own| {
            let engine = resolve_engine(resource, own.type_.as_deref()).ok()?;
            Some((own, engine))
        });
    if let Some((own, engine)) = engine {
        let port = Workload::parse(resource)
            .ok()
            .and_then(|w| w.ports.filter(|p| !p.is_empty()))
            .and_then(|p| p.first().map(PortSpec::service_port))
            .or_else(|| engine.ports.first().map(|(_, p)| *p));
        if let Some(port) = port {
            fields.insert(
                "endpoint".into(),
                format!(
                    "{}.{}.svc.{}:{port}",
                    resource.name, resource.namespace, ctx.cluster_domain
                )
                .into(),
            );
        }
        if let Some(secret) = own.credentials_secret {
            fields.insert("credentialsSecret".into(), secret.into());
        }
    }
    if let Some(sts) = children
        .iter()
        .find(|c| c.kind == "StatefulSet" && c.name == resource.name)
    {
        fields.insert("readyReplicas".into(), sts.count("readyReplicas").into());
        if let Some(replicas) = sts.replicas {
            fields.insert("replicas".into(), replicas.into());
        }
    }
    fields
}

fn printer_columns() -> Vec<guest_kit::PrinterColumn> {
    let mut cols = vec![guest_kit::PrinterColumn::new(
        "Type",
        "string",
        ".spec.type",
        "Engine",
    )];
    cols.extend(render::standard_printer_columns());
    cols
}

/// The engine a resource runs: implied by a facade Kind, else `spec.type` (default `datastore`).
fn resolve_engine(resource: &Resource, type_: Option<&str>) -> Result<&'static Engine> {
    let implied = KINDS
        .iter()
        .find(|k| k.0 == resource.kind)
        .and_then(|k| k.4);
    let known = || {
        ENGINES
            .iter()
            .map(|e| e.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let named = match type_ {
        Some(t) => Some(engine(t).ok_or_else(|| {
            RenderError::new(
                "spec.type",
                format!(
                    "`{t}` is not an engine: expected one of {}, clickhouse",
                    known()
                ),
            )
        })?),
        None => None,
    };
    match (implied, named) {
        (Some(implied), Some(named)) if named.name != implied => Err(RenderError::new(
            "spec.type",
            format!(
                "`{}` contradicts the Kind: a {} always runs {implied}; remove spec.type or use a Datastore",
                type_.unwrap_or_default(),
                resource.kind
            ),
        )),
        (Some(implied), _) => Ok(engine(implied).expect("every facade names a known engine")),
        (None, Some(named)) => Ok(named),
        (None, None) => Ok(&ENGINES[0]),
    }
}

/// Renders a Datastore-shaped resource (its warnings dropped; see
/// [`render_datastore_reported`]).
pub fn render_datastore(resource: &Resource, ctx: &Context) -> Result<Vec<Value>> {
    Ok(render_datastore_reported(resource, ctx)?.objects)
}

/// Renders a Datastore-shaped resource: an optional part whose configuration is incomplete (a
/// backup without its S3 target) is left out with a warning, and the rest rendered.
pub fn render_datastore_reported(resource: &Resource, ctx: &Context) -> Result<Rendered> {
    let mut warnings = Vec::new();
    spec::dns_label("metadata.name", &resource.name)?;
    if resource.name.len() > 60 {
        return Err(RenderError::new(
            "metadata.name",
            "must be at most 60 characters: the headless Service is named <name>-hs",
        ));
    }
    let w = Workload::parse(resource)?;
    let own: DatastoreOnly = spec::parse(&resource.spec)?;
    let engine = resolve_engine(resource, own.type_.as_deref())?;
    let ports: Vec<PortSpec> = match &w.ports {
        Some(p) if !p.is_empty() => p.clone(),
        _ => engine
            .ports
            .iter()
            .map(|(n, p)| PortSpec::named(n, *p))
            .collect(),
    };
    let labels = w.labels(resource);
    let storage = own.storage.as_ref().ok_or_else(|| {
        RenderError::new(
            "spec.storage.size",
            "is required: a Datastore keeps its data on a volume",
        )
    })?;
    let size = storage.size.as_deref().ok_or_else(|| {
        RenderError::new(
            "spec.storage.size",
            "is required: a Datastore keeps its data on a volume",
        )
    })?;
    spec::quantity("spec.storage.size", size)?;
    let retention = storage.retention_policy.as_deref().unwrap_or("Retain");
    if !["Retain", "Delete"].contains(&retention) {
        return Err(RenderError::new(
            "spec.storage.retentionPolicy",
            format!("`{retention}` is not one of Retain, Delete"),
        ));
    }
    let volume = storage.volume_name.as_deref().unwrap_or("data");
    spec::dns_label("spec.storage.volumeName", volume)?;
    if let Some(s) = &own.credentials_secret {
        spec::dns_subdomain("spec.credentialsSecret", s)?;
    }

    let headless = format!("{}-hs", resource.name);
    let mut out = vec![statefulset(
        resource, &w, &own, engine, &ports, &labels, storage, size, retention, volume, &headless,
    )?];
    out.push(render::service(resource, &headless, &labels, &ports, true));
    out.push(render::service(
        resource,
        &resource.name,
        &labels,
        &ports,
        false,
    ));
    let mut names = BTreeSet::from([resource.name.clone(), headless]);
    for (i, alias) in own.service_aliases.iter().enumerate() {
        let field = format!("spec.serviceAliases[{i}]");
        spec::dns_label(&field, alias)?;
        if !names.insert(alias.clone()) {
            return Err(RenderError::new(
                field,
                format!("`{alias}` is already the name of a Service of this resource"),
            ));
        }
        out.push(render::service(resource, alias, &labels, &ports, false));
    }
    out.extend(render::kms_secrets(resource, ctx, &labels, &w.kms_secrets)?);
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
    if let Some(b) = own.backup.as_ref().filter(|b| b.enabled != Some(false)) {
        validate_backup(resource, b, engine)?;
        match missing_for_backup(b, &own) {
            missing if missing.is_empty() => {
                out.push(backup(resource, &w, &own, engine, &ports, &labels, b)?);
            }
            missing => warnings.push(Warning::new(
                "spec.backup",
                format!(
                    "is enabled but {} {} not set: the backup CronJob {}-backup is left out until {}",
                    missing.join(", "),
                    if missing.len() == 1 { "is" } else { "are" },
                    resource.name,
                    if missing.len() == 1 { "it is" } else { "they are" },
                ),
            )),
        }
    }
    Ok(Rendered {
        objects: out,
        warnings,
    })
}

/// Refuses what a backup's spec sets and cannot work (present and invalid is an error, even
/// while other fields are missing): a name too long for its CronJob, a schedule that is not a
/// cron expression, a bad Secret name, a retention under a day, an engine with no backup.
fn validate_backup(resource: &Resource, b: &BackupSpec, engine: &Engine) -> Result<()> {
    if resource.name.len() + "-backup".len() > 52 {
        return Err(RenderError::new(
            "metadata.name",
            "must be at most 45 characters with spec.backup: the CronJob <name>-backup is limited to 52",
        ));
    }
    if let Some(schedule) = &b.schedule {
        spec::cron("spec.backup.schedule", schedule)?;
    }
    if let Some(secret) = &b.s3_credentials_secret {
        spec::dns_subdomain("spec.backup.s3CredentialsSecret", secret)?;
    }
    let retention = b.retention_days.unwrap_or(7);
    if retention < 1 {
        return Err(RenderError::new(
            "spec.backup.retentionDays",
            format!("{retention} must be at least 1"),
        ));
    }
    if dump_script(engine).is_none() && engine.name != "minio" {
        let why = match engine.name {
            "docdb" => "back up the PostgreSQL database it stores its data in",
            _ => "use the engine's own replication or snapshots",
        };
        return Err(RenderError::new(
            "spec.backup",
            format!("is not supported for engine {}: {why}", engine.name),
        ));
    }
    Ok(())
}

/// The fields a backup needs that are not set (an incomplete backup is left out, with a
/// warning; one that is complete and invalid is an error).
fn missing_for_backup(b: &BackupSpec, own: &DatastoreOnly) -> Vec<&'static str> {
    [
        ("spec.backup.schedule", b.schedule.is_none()),
        ("spec.backup.s3Endpoint", b.s3_endpoint.is_none()),
        ("spec.backup.s3Bucket", b.s3_bucket.is_none()),
        (
            "spec.backup.s3CredentialsSecret",
            b.s3_credentials_secret.is_none(),
        ),
        ("spec.credentialsSecret", own.credentials_secret.is_none()),
    ]
    .into_iter()
    .filter(|(_, missing)| *missing)
    .map(|(field, _)| field)
    .collect()
}

#[allow(
    clippy::too_many_arguments,
    reason = "each argument is one resolved part of the spec"
)]
fn statefulset(
    resource: &Resource,
    w: &Workload,
    own: &DatastoreOnly,
    engine: &Engine,
    ports: &[PortSpec],
    labels: &Map<String, Value>,
    storage: &StorageSpec,
    size: &str,
    retention: &str,
    volume: &str,
    headless: &str,
) -> Result<Value> {
    let mut defaults: Vec<Value> = engine
        .env
        .iter()
        .map(|(k, v)| json!({ "name": k, "value": v }))
        .collect();
    if let Some(secret) = &own.credentials_secret {
        defaults.extend(
            engine
                .credentials
                .iter()
                .map(|(key, var)| render::env_from_secret(var, secret, key)),
        );
    }
    let env = render::merge_env(defaults, w.env.as_deref());
    let user_mounts_data = w.volume_mounts.iter().flatten().any(|m| {
        m.get("name").and_then(Value::as_str) == Some(volume)
            || m.get("mountPath").and_then(Value::as_str) == Some(engine.data_path)
    });
    let data_mount = if user_mounts_data {
        vec![]
    } else {
        vec![json!({ "name": volume, "mountPath": engine.data_path })]
    };
    let valkey_args;
    let default_args: Option<&[&str]> =
        if engine.name == "valkey" && own.credentials_secret.is_some() {
            valkey_args = ["valkey-server", "--requirepass", "$(VALKEY_PASSWORD)"];
            Some(&valkey_args)
        } else if engine.args.is_empty() {
            None
        } else {
            Some(engine.args)
        };
    let default_args: Option<Vec<String>> =
        default_args.map(|a| a.iter().map(|s| (*s).to_owned()).collect());
    let args = w.args.as_deref().or(default_args.as_deref());
    // No `env: []`: the API server drops empty lists, and what we send must come back.
    let env = if env.is_empty() {
        w.env.clone()
    } else {
        Some(env)
    };
    let main = w.container(
        &resource.name,
        ports,
        env,
        data_mount,
        w.command.as_deref(),
        args,
    )?;
    let mut claim_spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": size } },
    });
    if let Some(class) = &storage.storage_class_name {
        claim_spec["storageClassName"] = class.as_str().into();
    }
    Ok(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": w.metadata(resource, &resource.name, labels),
        "spec": {
            "replicas": w.replicas.unwrap_or(1),
            "serviceName": headless,
            "selector": { "matchLabels": render::selector(&resource.name) },
            "template": w.pod_template(labels, main, vec![]),
            "volumeClaimTemplates": [{ "metadata": { "name": volume }, "spec": claim_spec }],
            "persistentVolumeClaimRetentionPolicy": { "whenDeleted": retention, "whenScaled": "Retain" },
        },
    }))
}

/// How each engine is dumped: a script run in the datastore's own image, which has the
/// engine's client tools. Every value comes from the environment, never spliced into the script.
fn dump_script(engine: &Engine) -> Option<&'static str> {
    match engine.name {
        "postgresql" => Some(
            "set -eu\nexport PGUSER=\"$POSTGRES_USER\" PGPASSWORD=\"$POSTGRES_PASSWORD\"\n\
             pg_dumpall -h \"$DB_HOST\" -p \"$DB_PORT\" -f /backup/dump.sql\n",
        ),
        "valkey" => Some(
            "set -eu\nvalkey-cli -h \"$DB_HOST\" -p \"$DB_PORT\" -a \"$VALKEY_PASSWORD\" --no-auth-warning \
             --rdb /backup/dump.rdb\n",
        ),
        "datastore" => Some(
            "set -eu\nq() { clickhouse-client --host \"$DB_HOST\" --port \"$DB_PORT\" \
             --user \"$CLICKHOUSE_USER\" --password \"$CLICKHOUSE_PASSWORD\" --query \"$1\"; }\n\
             for t in $(q \"SELECT database || '.' || name FROM system.tables WHERE database NOT IN \
             ('system', 'INFORMATION_SCHEMA', 'information_schema') AND NOT is_temporary\"); do\n\
             \x20 q \"SHOW CREATE TABLE $t\" > \"/backup/$t.sql\"\n\
             \x20 q \"SELECT * FROM $t FORMAT Native\" > \"/backup/$t.native\"\n\
             done\n",
        ),
        _ => None,
    }
}

const UPLOAD_SCRIPT: &str = "set -eu\n\
mc alias set target \"$S3_ENDPOINT\" \"$S3_ACCESS_KEY\" \"$S3_SECRET_KEY\" >/dev/null\n\
dest=\"target/$S3_BUCKET/$BACKUP_PREFIX/$(date -u +%Y%m%dT%H%M%SZ)\"\n\
if [ -n \"${SOURCE_ENDPOINT:-}\" ]; then\n\
\x20 mc alias set source \"$SOURCE_ENDPOINT\" \"$MINIO_ROOT_USER\" \"$MINIO_ROOT_PASSWORD\" >/dev/null\n\
\x20 mc mirror source/ \"$dest/\"\n\
else\n\
\x20 mc cp --recursive /backup/ \"$dest/\"\n\
fi\n\
mc rm --recursive --force --older-than \"${RETENTION_DAYS}d\" \"target/$S3_BUCKET/$BACKUP_PREFIX/\"\n";

fn backup(
    resource: &Resource,
    w: &Workload,
    own: &DatastoreOnly,
    engine: &Engine,
    ports: &[PortSpec],
    labels: &Map<String, Value>,
    b: &BackupSpec,
) -> Result<Value> {
    validate_backup(resource, b, engine)?;
    let name = format!("{}-backup", resource.name);
    let required = |v: &Option<String>, field: &str| {
        v.clone().ok_or_else(|| {
            RenderError::new(
                format!("spec.backup.{field}"),
                "is required when backup is enabled",
            )
        })
    };
    let schedule = required(&b.schedule, "schedule")?;
    let endpoint = required(&b.s3_endpoint, "s3Endpoint")?;
    let bucket = required(&b.s3_bucket, "s3Bucket")?;
    let s3_secret = required(&b.s3_credentials_secret, "s3CredentialsSecret")?;
    let retention = b.retention_days.unwrap_or(7);
    let dump = dump_script(engine);
    let creds_secret = own.credentials_secret.as_deref().ok_or_else(|| {
        RenderError::new(
            "spec.credentialsSecret",
            "is required with spec.backup: the backup logs in with it",
        )
    })?;
    let creds: Vec<Value> = engine
        .credentials
        .iter()
        .map(|(key, var)| render::env_from_secret(var, creds_secret, key))
        .collect();
    // The port a client dumps through: the engine's native port when it has one, else the first.
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("native"))
        .or_else(|| ports.first())
        .map_or(0, PortSpec::service_port);
    let mut upload_env = vec![
        json!({ "name": "S3_ENDPOINT", "value": endpoint }),
        json!({ "name": "S3_BUCKET", "value": bucket }),
        json!({ "name": "BACKUP_PREFIX", "value": format!("{}/{}", resource.namespace, resource.name) }),
        json!({ "name": "RETENTION_DAYS", "value": retention.to_string() }),
        render::env_from_secret("S3_ACCESS_KEY", &s3_secret, "accessKey"),
        render::env_from_secret("S3_SECRET_KEY", &s3_secret, "secretKey"),
    ];
    let mut pod = json!({
        "restartPolicy": "Never",
        "volumes": [{ "name": "backup", "emptyDir": {} }],
    });
    let backup_mount = json!([{ "name": "backup", "mountPath": "/backup" }]);
    match dump {
        Some(script) => {
            let mut env = creds;
            env.push(json!({ "name": "DB_HOST", "value": resource.name }));
            env.push(json!({ "name": "DB_PORT", "value": port.to_string() }));
            pod["initContainers"] = json!([{
                "name": "dump",
                "image": w.image.reference(),
                "command": ["/bin/sh", "-c", script],
                "env": env,
                "volumeMounts": backup_mount,
            }]);
        }
        None => {
            upload_env.push(json!({ "name": "SOURCE_ENDPOINT", "value": format!("http://{}:{port}", resource.name) }));
            upload_env.extend(creds);
        }
    }
    pod["containers"] = json!([{
        "name": "upload",
        "image": b.image.as_deref().unwrap_or(DEFAULT_BACKUP_IMAGE),
        "command": ["/bin/sh", "-c", UPLOAD_SCRIPT],
        "env": upload_env,
        "volumeMounts": backup_mount,
    }]);
    if let Some(ips) = &w.image_pull_secrets {
        pod["imagePullSecrets"] = Value::Array(ips.clone());
    }
    // Backup pods must not match the datastore's selector, or its Services would route to them.
    let mut pod_labels = labels.clone();
    pod_labels.insert("app.kubernetes.io/name".into(), name.as_str().into());
    pod_labels.insert("app.kubernetes.io/component".into(), "backup".into());
    Ok(json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": render::metadata(resource, &name, labels),
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": { "spec": {
                "backoffLimit": 2,
                "template": { "metadata": { "labels": pod_labels }, "spec": pod },
            } },
        },
    }))
}

/// The fields of a Datastore-shaped spec that name other objects of its namespace: the
/// workload's, the root credentials and the backup's S3 credentials.
fn references() -> Vec<guest_kit::Reference> {
    use guest_kit::{Reference, ReferenceTarget::Secret};
    let mut refs = schema::workload_references();
    refs.push(Reference::new("spec.credentialsSecret", Secret));
    refs.push(Reference::new("spec.backup.s3CredentialsSecret", Secret));
    refs
}

/// The OpenAPI schema of a Datastore-shaped spec.
pub fn spec_schema() -> Value {
    use schema::{array, boolean, enumeration, integer, max_items, object, string, string_item};
    let mut props = schema::workload_properties();
    props.extend([
        (
            "type",
            enumeration(
                "Engine: datastore (ClickHouse; alias clickhouse), postgresql, valkey, docdb, minio or nats. A facade Kind implies it.",
                &["datastore", "clickhouse", "postgresql", "valkey", "docdb", "minio", "nats"],
            ),
        ),
        (
            "storage",
            object(
                "The data volume: one PersistentVolumeClaim per replica.",
                &[
                    ("storageClassName", string("Storage class.")),
                    ("size", string("Size, a quantity such as 50Gi.")),
                    ("retentionPolicy", enumeration("Keep or delete the claims with the resource (default Retain).", &["Retain", "Delete"])),
                    ("volumeName", string("The claim template's name (default data); immutable once created.")),
                ],
                &["size"],
            ),
        ),
        ("credentialsSecret", string("Secret holding the root credentials.")),
        (
            "backup",
            object(
                "A CronJob that dumps the engine and uploads to S3.",
                &[
                    ("enabled", boolean("On unless false.")),
                    ("schedule", string("Cron schedule, such as 0 3 * * *.")),
                    ("s3Endpoint", string("S3 endpoint URL.")),
                    ("s3Bucket", string("S3 bucket.")),
                    ("s3CredentialsSecret", string("Secret with keys accessKey and secretKey.")),
                    ("retentionDays", integer("Days to keep backups (default 7).")),
                    ("image", string("Image with the MinIO client that uploads (default minio/mc:latest).")),
                ],
                &[],
            ),
        ),
        // Each alias is one more Service, with every port and label.
        ("serviceAliases", max_items(array("Extra ClusterIP Services with the same selector and ports.", string_item(63)), 16)),
    ]);
    object(
        "The desired state of a stateful workload.",
        &props,
        &["image", "storage"],
    )
}
