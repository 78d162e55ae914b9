//! Renderers shared by the workload guests: the fields every workload Kind has and the objects
//! several of them emit.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::spec::{self, IntOrString};
use crate::{Context, RenderError, Resource, Result};

/// The value of `app.kubernetes.io/managed-by` on everything a guest renders.
pub const MANAGED_BY: &str = "wasm-operator";

/// `spec.image`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Registry and repository, for example `ghcr.io/hanzoai/example`.
    pub repository: String,
    /// Tag; the repository alone when absent (the registry's `latest`).
    #[serde(default)]
    pub tag: Option<String>,
    /// `Always`, `IfNotPresent` or `Never`.
    #[serde(default)]
    pub pull_policy: Option<String>,
}

impl ImageSpec {
    /// The image reference for a container.
    pub fn reference(&self) -> String {
        match self.tag.as_deref() {
            Some(tag) if !tag.is_empty() => format!("{}:{tag}", self.repository),
            _ => self.repository.clone(),
        }
    }

    fn validate(&self) -> Result<()> {
        if self.repository.trim().is_empty() {
            return Err(RenderError::new(
                "spec.image.repository",
                "must not be empty",
            ));
        }
        if let Some(p) = &self.pull_policy
            && !["Always", "IfNotPresent", "Never"].contains(&p.as_str())
        {
            return Err(RenderError::new(
                "spec.image.pullPolicy",
                format!("`{p}` is not one of Always, IfNotPresent, Never"),
            ));
        }
        Ok(())
    }
}

/// One item of `spec.ports`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortSpec {
    /// Port name (required when there is more than one port).
    #[serde(default)]
    pub name: Option<String>,
    /// The port the container listens on.
    pub container_port: i64,
    /// The port the Service exposes; the container port when absent.
    #[serde(default)]
    pub service_port: Option<i64>,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: Option<String>,
}

impl PortSpec {
    /// A named TCP port whose Service port is the container port.
    pub fn named(name: &str, port: i64) -> Self {
        Self {
            name: Some(name.to_owned()),
            container_port: port,
            service_port: None,
            protocol: None,
        }
    }

    /// The Service's port.
    pub fn service_port(&self) -> i64 {
        self.service_port.unwrap_or(self.container_port)
    }

    fn protocol(&self) -> &str {
        self.protocol.as_deref().unwrap_or("TCP")
    }
}

/// Checks `spec.ports`: valid numbers and names, names unique and present when there are several.
pub fn validate_ports(ports: &[PortSpec]) -> Result<()> {
    let mut names = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        spec::port_number(&format!("{field}.containerPort"), p.container_port)?;
        if let Some(sp) = p.service_port {
            spec::port_number(&format!("{field}.servicePort"), sp)?;
        }
        if !["TCP", "UDP", "SCTP"].contains(&p.protocol()) {
            return Err(RenderError::new(
                format!("{field}.protocol"),
                format!("`{}` is not one of TCP, UDP, SCTP", p.protocol()),
            ));
        }
        match &p.name {
            Some(name) => {
                spec::port_name(&format!("{field}.name"), name)?;
                if !names.insert(name.as_str()) {
                    return Err(RenderError::new(
                        format!("{field}.name"),
                        format!("`{name}` names two ports: port names must be unique"),
                    ));
                }
            }
            None if ports.len() > 1 => {
                return Err(RenderError::new(
                    format!("{field}.name"),
                    "is required when there is more than one port",
                ));
            }
            None => {}
        }
    }
    Ok(())
}

/// `livenessProbe`, `readinessProbe`, `startupProbe`: a short form (`path` + `port` for an HTTP
/// GET, `exec.command`, `tcpSocket.port`) or any Kubernetes probe handler (`httpGet`, `grpc`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    /// HTTP GET path.
    #[serde(default)]
    pub path: Option<String>,
    /// HTTP GET port, by number or name; the first port when absent.
    #[serde(default)]
    pub port: Option<IntOrString>,
    /// `HTTP` or `HTTPS` for the HTTP GET.
    #[serde(default)]
    pub scheme: Option<String>,
    /// Kubernetes `exec` handler.
    #[serde(default)]
    pub exec: Option<Value>,
    /// Kubernetes `tcpSocket` handler.
    #[serde(default)]
    pub tcp_socket: Option<Value>,
    /// Kubernetes `httpGet` handler.
    #[serde(default)]
    pub http_get: Option<Value>,
    /// Kubernetes `grpc` handler.
    #[serde(default)]
    pub grpc: Option<Value>,
    /// Seconds before the first probe.
    #[serde(default)]
    pub initial_delay_seconds: Option<i64>,
    /// Seconds between probes.
    #[serde(default)]
    pub period_seconds: Option<i64>,
    /// Seconds before a probe times out.
    #[serde(default)]
    pub timeout_seconds: Option<i64>,
    /// Failures before the probe counts as failed.
    #[serde(default)]
    pub failure_threshold: Option<i64>,
    /// Successes before the probe counts as passed.
    #[serde(default)]
    pub success_threshold: Option<i64>,
}

impl ProbeSpec {
    /// The Kubernetes probe, with `default_port` for an HTTP GET that names none.
    pub fn to_probe(&self, field: &str, default_port: Option<&PortSpec>) -> Result<Value> {
        let mut probe = Map::new();
        let mut handlers = 0;
        if let Some(path) = &self.path {
            handlers += 1;
            let port = match (&self.port, default_port) {
                (Some(p), _) => p.to_value(),
                (None, Some(p)) => match &p.name {
                    Some(n) => Value::from(n.as_str()),
                    None => Value::from(p.container_port),
                },
                (None, None) => {
                    return Err(RenderError::new(
                        format!("{field}.port"),
                        "is required: there is no port in spec.ports to probe",
                    ));
                }
            };
            let mut get = json!({ "path": path, "port": port });
            if let Some(s) = &self.scheme {
                get["scheme"] = Value::from(s.as_str());
            }
            probe.insert("httpGet".into(), get);
        } else if self.port.is_some() {
            return Err(RenderError::new(
                format!("{field}.path"),
                "is required with `port` (an HTTP GET); for a TCP check use `tcpSocket.port`",
            ));
        }
        for (key, handler) in [
            ("exec", &self.exec),
            ("tcpSocket", &self.tcp_socket),
            ("httpGet", &self.http_get),
            ("grpc", &self.grpc),
        ] {
            if let Some(h) = handler {
                handlers += 1;
                probe.insert(key.into(), h.clone());
            }
        }
        if handlers != 1 {
            return Err(RenderError::new(
                field,
                "needs exactly one check: `path` (an HTTP GET), `exec.command`, `tcpSocket.port`, \
                 `httpGet` or `grpc`",
            ));
        }
        for (key, v) in [
            ("initialDelaySeconds", self.initial_delay_seconds),
            ("periodSeconds", self.period_seconds),
            ("timeoutSeconds", self.timeout_seconds),
            ("failureThreshold", self.failure_threshold),
            ("successThreshold", self.success_threshold),
        ] {
            if let Some(v) = v {
                spec::int32(&format!("{field}.{key}"), v)?;
                probe.insert(key.into(), Value::from(v));
            }
        }
        Ok(Value::Object(probe))
    }
}

/// The legacy `probes` block: Kubernetes probes under `readiness`, `liveness`, `startup`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LegacyProbes {
    /// A Kubernetes readiness probe.
    #[serde(default)]
    pub readiness: Option<Value>,
    /// A Kubernetes liveness probe.
    #[serde(default)]
    pub liveness: Option<Value>,
    /// A Kubernetes startup probe.
    #[serde(default)]
    pub startup: Option<Value>,
}

/// `spec.networkPolicy`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// On unless `false`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Extra allowed sources (Kubernetes NetworkPolicyPeer).
    #[serde(default)]
    pub allow_from: Vec<Value>,
    /// Allow every source (to the declared ports).
    #[serde(default)]
    pub allow_ingress: bool,
    /// Allow pods of the same namespace (default true).
    #[serde(default)]
    pub allow_intra_namespace: Option<bool>,
}

/// `spec.serviceMonitor`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// On unless `false`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The name of the Service port to scrape; the first named port when absent.
    #[serde(default, alias = "metricsPort")]
    pub port: Option<String>,
    /// The path to scrape (default `/metrics`).
    #[serde(default, alias = "metricsPath")]
    pub path: Option<String>,
    /// Scrape interval, for example `30s`.
    #[serde(default)]
    pub interval: Option<String>,
}

/// `spec.kmsSecrets[]` credentials reference.
#[derive(Debug, Clone, Deserialize)]
pub struct CredentialsRef {
    /// Secret name.
    pub name: String,
    /// Secret namespace; the resource's when absent.
    #[serde(default)]
    pub namespace: Option<String>,
}

/// One item of `spec.kmsSecrets`: a Kubernetes Secret that the KMS operator keeps filled.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KmsSecretRef {
    /// KMS API address.
    #[serde(default, rename = "hostAPI", alias = "hostApi")]
    pub host_api: Option<String>,
    /// KMS project.
    #[serde(default)]
    pub project_slug: Option<String>,
    /// KMS environment.
    #[serde(default)]
    pub env_slug: Option<String>,
    /// Path of the secrets in the project.
    #[serde(default)]
    pub secrets_path: Option<String>,
    /// Secret with the machine identity's credentials.
    #[serde(default)]
    pub credentials_ref: Option<CredentialsRef>,
    /// Seconds between syncs (default 60, minimum 10).
    #[serde(default)]
    pub resync_interval: Option<i64>,
    /// The Kubernetes Secret the KMS operator fills.
    #[serde(default)]
    pub managed_secret_name: Option<String>,
    /// Newer form: the KMSSecret's own name.
    #[serde(default)]
    pub name: Option<String>,
    /// Newer form: only these keys.
    #[serde(default)]
    pub keys: Vec<String>,
    /// Newer form: the Kubernetes Secret the KMS operator fills.
    #[serde(default)]
    pub secret_name: Option<String>,
    /// `Orphan` (default: the Secret outlives the KMSSecret) or `Owner`.
    #[serde(default)]
    pub creation_policy: Option<String>,
}

/// The fields every workload Kind shares (Service, Datastore and their facades).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// The container image.
    pub image: ImageSpec,
    /// Pod count.
    #[serde(default)]
    pub replicas: Option<i64>,
    /// Ports; `None` when not given (a guest may then use defaults).
    #[serde(default)]
    pub ports: Option<Vec<PortSpec>>,
    /// Kubernetes `env`, passed through unchanged.
    #[serde(default)]
    pub env: Option<Vec<Value>>,
    /// Kubernetes `envFrom`, passed through unchanged.
    #[serde(default)]
    pub env_from: Option<Vec<Value>>,
    /// Kubernetes `volumes`, passed through unchanged.
    #[serde(default)]
    pub volumes: Option<Vec<Value>>,
    /// Kubernetes `volumeMounts` of the main container, passed through unchanged.
    #[serde(default)]
    pub volume_mounts: Option<Vec<Value>>,
    /// Kubernetes `resources` of the main container.
    #[serde(default)]
    pub resources: Option<Value>,
    /// Liveness probe.
    #[serde(default)]
    pub liveness_probe: Option<ProbeSpec>,
    /// Readiness probe.
    #[serde(default)]
    pub readiness_probe: Option<ProbeSpec>,
    /// Startup probe.
    #[serde(default)]
    pub startup_probe: Option<ProbeSpec>,
    /// Legacy probes block.
    #[serde(default)]
    pub probes: Option<LegacyProbes>,
    /// KMS-managed secrets.
    #[serde(default)]
    pub kms_secrets: Vec<KmsSecretRef>,
    /// Extra containers, passed through unchanged.
    #[serde(default)]
    pub sidecars: Option<Vec<Value>>,
    /// Init containers, passed through unchanged.
    #[serde(default)]
    pub init_containers: Option<Vec<Value>>,
    /// Registry credentials.
    #[serde(default)]
    pub image_pull_secrets: Option<Vec<Value>>,
    /// Service account.
    #[serde(default)]
    pub service_account_name: Option<String>,
    /// Entrypoint override.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Arguments override.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// `app.kubernetes.io/part-of`.
    #[serde(default)]
    pub part_of: Option<String>,
    /// `app.kubernetes.io/component`.
    #[serde(default)]
    pub component: Option<String>,
    /// Labels for every object and the pod template.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the workload and its pod template.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Pod `nodeSelector`.
    #[serde(default)]
    pub node_selector: Option<Value>,
    /// Pod `tolerations`.
    #[serde(default)]
    pub tolerations: Option<Vec<Value>>,
    /// Pod `affinity`.
    #[serde(default)]
    pub affinity: Option<Value>,
    /// Pod `priorityClassName`.
    #[serde(default)]
    pub priority_class_name: Option<String>,
    /// Pod `securityContext`.
    #[serde(default)]
    pub security_context: Option<Value>,
    /// Main container `securityContext`.
    #[serde(default)]
    pub container_security_context: Option<Value>,
    /// Pod `enableServiceLinks`.
    #[serde(default)]
    pub enable_service_links: Option<bool>,
    /// Optional NetworkPolicy.
    #[serde(default)]
    pub network_policy: Option<NetworkPolicySpec>,
    /// Optional ServiceMonitor.
    #[serde(default)]
    pub service_monitor: Option<ServiceMonitorSpec>,
}

impl Workload {
    /// Parses the shared fields of `resource.spec` and checks them.
    pub fn parse(resource: &Resource) -> Result<Self> {
        let w: Self = spec::parse(&resource.spec)?;
        w.image.validate()?;
        // What becomes metadata must be what the API server takes, or the failure would only
        // show when a child is applied, blamed on the child's field instead of the spec's.
        spec::labels("spec.labels", &w.labels)?;
        for key in w.annotations.keys() {
            spec::label_key("spec.annotations", key)?;
        }
        for (field, value) in [
            ("spec.partOf", &w.part_of),
            ("spec.component", &w.component),
        ] {
            if let Some(v) = value {
                spec::label_value(field, v)?;
            }
        }
        if let Some(r) = w.replicas {
            if r < 0 {
                return Err(RenderError::new(
                    "spec.replicas",
                    format!("{r} must not be negative"),
                ));
            }
            spec::int32("spec.replicas", r)?;
        }
        if let Some(ports) = &w.ports {
            validate_ports(ports)?;
        }
        if let (
            Some(_),
            Some(LegacyProbes {
                readiness: Some(_), ..
            }),
        ) = (&w.readiness_probe, &w.probes)
        {
            return Err(RenderError::new(
                "spec.probes.readiness",
                "conflicts with spec.readinessProbe: set one of them",
            ));
        }
        if let (
            Some(_),
            Some(LegacyProbes {
                liveness: Some(_), ..
            }),
        ) = (&w.liveness_probe, &w.probes)
        {
            return Err(RenderError::new(
                "spec.probes.liveness",
                "conflicts with spec.livenessProbe: set one of them",
            ));
        }
        Ok(w)
    }

    /// The labels of every rendered object: the user's, then part-of/component, managed-by and
    /// the selector labels (which the user cannot override).
    pub fn labels(&self, resource: &Resource) -> Map<String, Value> {
        let mut labels: Map<String, Value> = self
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        if let Some(p) = &self.part_of {
            labels.insert("app.kubernetes.io/part-of".into(), p.as_str().into());
        }
        if let Some(c) = &self.component {
            labels.insert("app.kubernetes.io/component".into(), c.as_str().into());
        }
        labels.insert("app.kubernetes.io/managed-by".into(), MANAGED_BY.into());
        labels.extend(selector(&resource.name));
        labels
    }

    /// The main container's probes, short forms expanded.
    pub fn probes(&self, ports: &[PortSpec]) -> Result<Map<String, Value>> {
        let mut out = Map::new();
        let first = ports.first();
        for (key, short, legacy) in [
            (
                "livenessProbe",
                &self.liveness_probe,
                self.probes.as_ref().and_then(|p| p.liveness.as_ref()),
            ),
            (
                "readinessProbe",
                &self.readiness_probe,
                self.probes.as_ref().and_then(|p| p.readiness.as_ref()),
            ),
            (
                "startupProbe",
                &self.startup_probe,
                self.probes.as_ref().and_then(|p| p.startup.as_ref()),
            ),
        ] {
            if let Some(p) = short {
                out.insert(key.into(), p.to_probe(&format!("spec.{key}"), first)?);
            } else if let Some(p) = legacy {
                out.insert(key.into(), p.clone());
            }
        }
        Ok(out)
    }

    /// The main container: image, command, args, ports, `env` (as given), `envFrom`,
    /// `volumeMounts` (plus `extra_mounts`), resources, probes, security context.
    pub fn container(
        &self,
        name: &str,
        ports: &[PortSpec],
        env: Option<Vec<Value>>,
        extra_mounts: Vec<Value>,
        command: Option<&[String]>,
        args: Option<&[String]>,
    ) -> Result<Value> {
        let mut c = Map::new();
        c.insert("name".into(), name.into());
        c.insert("image".into(), self.image.reference().into());
        if let Some(p) = &self.image.pull_policy {
            c.insert("imagePullPolicy".into(), p.as_str().into());
        }
        if let Some(cmd) = command {
            c.insert("command".into(), json!(cmd));
        }
        if let Some(a) = args {
            c.insert("args".into(), json!(a));
        }
        if !ports.is_empty() {
            let list: Vec<Value> = ports
                .iter()
                .map(|p| {
                    let mut port =
                        json!({ "containerPort": p.container_port, "protocol": p.protocol() });
                    if let Some(n) = &p.name {
                        port["name"] = n.as_str().into();
                    }
                    port
                })
                .collect();
            c.insert("ports".into(), Value::Array(list));
        }
        if let Some(env) = env {
            c.insert("env".into(), Value::Array(env));
        }
        if let Some(ef) = &self.env_from {
            c.insert("envFrom".into(), Value::Array(ef.clone()));
        }
        let mut mounts = self.volume_mounts.clone().unwrap_or_default();
        mounts.extend(extra_mounts);
        if self.volume_mounts.is_some() || !mounts.is_empty() {
            c.insert("volumeMounts".into(), Value::Array(mounts));
        }
        if let Some(r) = &self.resources {
            c.insert("resources".into(), r.clone());
        }
        c.extend(self.probes(ports)?);
        if let Some(sc) = &self.container_security_context {
            c.insert("securityContext".into(), sc.clone());
        }
        Ok(Value::Object(c))
    }

    /// The pod template: labels, annotations, the main container then the sidecars, init
    /// containers, `volumes` (plus `extra_volumes`) and the pod-level options.
    pub fn pod_template(
        &self,
        labels: &Map<String, Value>,
        main: Value,
        extra_volumes: Vec<Value>,
    ) -> Value {
        let mut pod = Map::new();
        if let Some(ics) = &self.init_containers {
            pod.insert("initContainers".into(), Value::Array(ics.clone()));
        }
        let mut containers = vec![main];
        containers.extend(self.sidecars.clone().unwrap_or_default());
        pod.insert("containers".into(), Value::Array(containers));
        let mut volumes = self.volumes.clone().unwrap_or_default();
        volumes.extend(extra_volumes);
        if self.volumes.is_some() || !volumes.is_empty() {
            pod.insert("volumes".into(), Value::Array(volumes));
        }
        let options: [(&str, Option<Value>); 8] = [
            (
                "imagePullSecrets",
                self.image_pull_secrets.clone().map(Value::Array),
            ),
            (
                "serviceAccountName",
                self.service_account_name.as_deref().map(Value::from),
            ),
            ("nodeSelector", self.node_selector.clone()),
            ("tolerations", self.tolerations.clone().map(Value::Array)),
            ("affinity", self.affinity.clone()),
            (
                "priorityClassName",
                self.priority_class_name.as_deref().map(Value::from),
            ),
            ("securityContext", self.security_context.clone()),
            (
                "enableServiceLinks",
                self.enable_service_links.map(Value::from),
            ),
        ];
        for (key, value) in options {
            if let Some(v) = value {
                pod.insert(key.into(), v);
            }
        }
        let mut metadata = json!({ "labels": labels });
        if !self.annotations.is_empty() {
            metadata["annotations"] = json!(self.annotations);
        }
        json!({ "metadata": metadata, "spec": pod })
    }

    /// The workload's own metadata (labels and the user's annotations).
    pub fn metadata(&self, resource: &Resource, name: &str, labels: &Map<String, Value>) -> Value {
        let mut m = json!({ "name": name, "namespace": resource.namespace, "labels": labels });
        if !self.annotations.is_empty() {
            m["annotations"] = json!(self.annotations);
        }
        m
    }
}

/// The selector labels of a resource's pods.
pub fn selector(name: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("app.kubernetes.io/instance".into(), name.into());
    m.insert("app.kubernetes.io/name".into(), name.into());
    m
}

/// Plain metadata: name, namespace, labels.
pub fn metadata(resource: &Resource, name: &str, labels: &Map<String, Value>) -> Value {
    json!({ "name": name, "namespace": resource.namespace, "labels": labels })
}

/// Merges an engine's default `env` with the user's: a user entry wins over a default of the
/// same name, defaults come first (so user values may refer to them as `$(NAME)`), and the
/// user's entries follow unchanged, in their order.
pub fn merge_env(defaults: Vec<Value>, user: Option<&[Value]>) -> Vec<Value> {
    let user = user.unwrap_or_default();
    let taken: BTreeSet<&str> = user
        .iter()
        .filter_map(|e| e.get("name")?.as_str())
        .collect();
    let mut env: Vec<Value> = defaults
        .into_iter()
        .filter(|d| {
            d.get("name")
                .and_then(Value::as_str)
                .is_none_or(|n| !taken.contains(n))
        })
        .collect();
    env.extend(user.iter().cloned());
    env
}

/// An env entry read from a Secret key.
pub fn env_from_secret(name: &str, secret: &str, key: &str) -> Value {
    json!({ "name": name, "valueFrom": { "secretKeyRef": { "name": secret, "key": key } } })
}

/// A Service selecting the resource's pods. `headless` makes it `clusterIP: None` and publishes
/// not-ready addresses, for peer discovery.
pub fn service(
    resource: &Resource,
    name: &str,
    labels: &Map<String, Value>,
    ports: &[PortSpec],
    headless: bool,
) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| {
            let mut port = json!({
                "port": p.service_port(),
                "targetPort": p.container_port,
                "protocol": p.protocol(),
            });
            if let Some(n) = &p.name {
                port["name"] = n.as_str().into();
            }
            port
        })
        .collect();
    let mut spec =
        json!({ "type": "ClusterIP", "selector": selector(&resource.name), "ports": ports });
    if headless {
        spec["clusterIP"] = "None".into();
        spec["publishNotReadyAddresses"] = true.into();
    }
    json!({ "apiVersion": "v1", "kind": "Service", "metadata": metadata(resource, name, labels), "spec": spec })
}

/// The NetworkPolicy of `spec.networkPolicy`: ingress to the resource's pods, on the declared
/// ports, from the namespace (unless `allowIntraNamespace: false`), from `allowFrom`, or from
/// anywhere with `allowIngress`. `None` when the block is absent or disabled.
pub fn network_policy(
    resource: &Resource,
    labels: &Map<String, Value>,
    spec: Option<&NetworkPolicySpec>,
    ports: &[PortSpec],
) -> Option<Value> {
    let spec = spec.filter(|s| s.enabled != Some(false))?;
    let port_list: Vec<Value> = ports
        .iter()
        .map(|p| json!({ "port": p.container_port, "protocol": p.protocol() }))
        .collect();
    let mut rule = Map::new();
    if !port_list.is_empty() {
        rule.insert("ports".into(), Value::Array(port_list));
    }
    let mut ingress = Vec::new();
    if spec.allow_ingress {
        ingress.push(Value::Object(rule));
    } else {
        let mut from = Vec::new();
        if spec.allow_intra_namespace != Some(false) {
            from.push(json!({ "podSelector": {} }));
        }
        from.extend(spec.allow_from.iter().cloned());
        if !from.is_empty() {
            rule.insert("from".into(), Value::Array(from));
            ingress.push(Value::Object(rule));
        }
    }
    Some(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(resource, &resource.name, labels),
        "spec": {
            "podSelector": { "matchLabels": selector(&resource.name) },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }))
}

/// The ServiceMonitor of `spec.serviceMonitor`, scraping a named port of the Service `service`.
pub fn service_monitor(
    resource: &Resource,
    labels: &Map<String, Value>,
    spec: Option<&ServiceMonitorSpec>,
    ports: &[PortSpec],
) -> Result<Option<Value>> {
    let Some(spec) = spec.filter(|s| s.enabled != Some(false)) else {
        return Ok(None);
    };
    let names: Vec<&str> = ports.iter().filter_map(|p| p.name.as_deref()).collect();
    let port = match &spec.port {
        Some(p) if names.contains(&p.as_str()) => p.clone(),
        Some(p) => {
            return Err(RenderError::new(
                "spec.serviceMonitor.port",
                format!(
                    "`{p}` is not the name of a port in spec.ports (names: {})",
                    names.join(", ")
                ),
            ));
        }
        None => match names.first() {
            Some(n) => (*n).to_owned(),
            None => {
                return Err(RenderError::new(
                    "spec.serviceMonitor.port",
                    "is required: no port in spec.ports has a name to scrape",
                ));
            }
        },
    };
    let mut endpoint = json!({ "port": port, "path": spec.path.as_deref().unwrap_or("/metrics") });
    if let Some(i) = &spec.interval {
        endpoint["interval"] = i.as_str().into();
    }
    Ok(Some(json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(resource, &resource.name, labels),
        "spec": {
            "selector": { "matchLabels": selector(&resource.name) },
            "endpoints": [endpoint],
        },
    })))
}

/// One KMSSecret (`kms.<api-group>/v1`) per `spec.kmsSecrets` item, named after the item's
/// `name` or, failing that, the Secret it fills.
pub fn kms_secrets(
    resource: &Resource,
    ctx: &Context,
    labels: &Map<String, Value>,
    refs: &[KmsSecretRef],
) -> Result<Vec<Value>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let field = format!("spec.kmsSecrets[{i}]");
        let managed = r
            .managed_secret_name
            .as_deref()
            .or(r.secret_name.as_deref())
            .ok_or_else(|| {
                RenderError::new(
                    format!("{field}.managedSecretName"),
                    "is required: the name of the Secret the KMS operator fills (or `secretName`)",
                )
            })?;
        spec::dns_subdomain(&format!("{field}.managedSecretName"), managed)?;
        let name = r.name.as_deref().unwrap_or(managed);
        spec::dns_subdomain(&format!("{field}.name"), name)?;
        if !seen.insert(name.to_owned()) {
            return Err(RenderError::new(
                format!("{field}.name"),
                format!("`{name}` is used by two kmsSecrets items"),
            ));
        }
        let resync = r.resync_interval.unwrap_or(60);
        if resync < 10 {
            return Err(RenderError::new(
                format!("{field}.resyncInterval"),
                format!("{resync} is below the minimum of 10 seconds"),
            ));
        }
        let policy = r.creation_policy.as_deref().unwrap_or("Orphan");
        if !["Orphan", "Owner"].contains(&policy) {
            return Err(RenderError::new(
                format!("{field}.creationPolicy"),
                format!("`{policy}` is not one of Orphan, Owner"),
            ));
        }
        let mut scope = Map::new();
        for (k, v) in [("projectSlug", &r.project_slug), ("envSlug", &r.env_slug)] {
            if let Some(v) = v {
                scope.insert(k.into(), v.as_str().into());
            }
        }
        scope.insert(
            "secretsPath".into(),
            r.secrets_path.as_deref().unwrap_or("/").into(),
        );
        let mut universal = json!({ "secretsScope": scope });
        if let Some(c) = &r.credentials_ref {
            universal["credentialsRef"] = json!({
                "secretName": c.name,
                "secretNamespace": c.namespace.as_deref().unwrap_or(&resource.namespace),
            });
        }
        let mut spec = json!({
            "resyncInterval": resync,
            "authentication": { "universalAuth": universal },
            "managedKubeSecretReferences": [{
                "secretName": managed,
                "secretNamespace": resource.namespace,
                "creationPolicy": policy,
            }],
        });
        if let Some(h) = &r.host_api {
            spec["hostAPI"] = h.as_str().into();
        }
        let mut meta = metadata(resource, name, labels);
        if !r.keys.is_empty() {
            meta["annotations"] =
                json!({ format!("kms.{}/keys", ctx.api_group): r.keys.join(",") });
        }
        out.push(json!({
            "apiVersion": format!("kms.{}/v1", ctx.api_group),
            "kind": "KMSSecret",
            "metadata": meta,
            "spec": spec,
        }));
    }
    Ok(out)
}

/// The printer columns every workload Kind shows: readiness, its message and age.
pub fn standard_printer_columns() -> Vec<crate::PrinterColumn> {
    use crate::PrinterColumn;
    vec![
        PrinterColumn::new(
            "Ready",
            "string",
            ".status.conditions[?(@.type==\"Ready\")].status",
            "Whether every child is ready",
        ),
        PrinterColumn::new(
            "Status",
            "string",
            ".status.conditions[?(@.type==\"Ready\")].message",
            "What the operator last observed",
        ),
        PrinterColumn::new(
            "Age",
            "date",
            ".metadata.creationTimestamp",
            "Time since creation",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_env_wins_and_keeps_its_order() {
        let defaults = vec![
            json!({"name": "A", "value": "1"}),
            json!({"name": "B", "value": "2"}),
        ];
        let user = vec![
            json!({"name": "C", "value": "3"}),
            json!({"name": "A", "value": "x"}),
        ];
        let env = merge_env(defaults, Some(&user));
        assert_eq!(
            env,
            vec![
                json!({"name": "B", "value": "2"}),
                json!({"name": "C", "value": "3"}),
                json!({"name": "A", "value": "x"}),
            ]
        );
    }

    #[test]
    fn probes_take_one_handler() {
        let port = PortSpec::named("http", 8080);
        let p: ProbeSpec = serde_json::from_value(json!({"path": "/healthz"})).unwrap();
        assert_eq!(
            p.to_probe("f", Some(&port)).unwrap(),
            json!({"httpGet": {"path": "/healthz", "port": "http"}})
        );
        let p: ProbeSpec = serde_json::from_value(json!({"port": 8080})).unwrap();
        assert_eq!(p.to_probe("f", Some(&port)).unwrap_err().field, "f.path");
        let p: ProbeSpec =
            serde_json::from_value(json!({"path": "/", "exec": {"command": ["true"]}})).unwrap();
        assert_eq!(p.to_probe("f", Some(&port)).unwrap_err().field, "f");
        let p: ProbeSpec = serde_json::from_value(json!({})).unwrap();
        assert!(p.to_probe("f", None).is_err());
    }

    #[test]
    fn ports_need_names_when_several() {
        let ports = vec![
            PortSpec::named("a", 1),
            PortSpec {
                name: None,
                ..PortSpec::named("b", 2)
            },
        ];
        assert_eq!(
            validate_ports(&ports).unwrap_err().field,
            "spec.ports[1].name"
        );
        let ports = vec![PortSpec::named("a", 1), PortSpec::named("a", 2)];
        assert!(
            validate_ports(&ports)
                .unwrap_err()
                .message
                .contains("unique")
        );
        let ports = vec![PortSpec::named("a", 70000)];
        assert_eq!(
            validate_ports(&ports).unwrap_err().field,
            "spec.ports[0].containerPort"
        );
    }
}
