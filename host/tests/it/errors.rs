//! Invalid specs are refused with the field to blame, never a trap.

use host::plugin::PluginError;
use host::registry::RenderError;

use crate::support::{registry, resource};

const SERVICE: &str =
    "apiVersion: hanzo.ai/v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec:\n";
const DATASTORE: &str =
    "apiVersion: hanzo.ai/v1\nkind: Datastore\nmetadata: {name: db, namespace: ns}\nspec:\n";

fn header(kind: &str) -> String {
    format!("apiVersion: hanzo.ai/v1\nkind: {kind}\nmetadata: {{name: db, namespace: ns}}\nspec:\n")
}

#[test]
fn invalid_specs_name_the_field() {
    let image = "  image: {repository: x}\n";
    let storage = "  storage: {size: 1Gi}\n";
    let cases: Vec<(String, &str, &str)> = vec![
        (format!("{SERVICE}  replicas: 1\n"), "spec.image", "is required"),
        (format!("{SERVICE}  image: {{tag: v1}}\n"), "spec.image.repository", "is required"),
        (format!("{SERVICE}  image: {{repository: ''}}\n"), "spec.image.repository", "must not be empty"),
        (format!("{SERVICE}  image: {{repository: x, pullPolicy: Sometimes}}\n"), "spec.image.pullPolicy", "Sometimes"),
        (format!("{SERVICE}{image}  replicas: many\n"), "spec.replicas", "must be an integer, not the string \"many\""),
        (format!("{SERVICE}{image}  replicas: -1\n"), "spec.replicas", "negative"),
        (format!("{SERVICE}{image}  ingress: {{hosts: [a.example]}}\n"), "spec.ingress", "needs a port"),
        (format!("{SERVICE}{image}  ports: [{{name: a, containerPort: 1}}, {{containerPort: 2}}]\n"), "spec.ports[1].name", "more than one port"),
        (format!("{SERVICE}{image}  ports: [{{name: a, containerPort: 70000}}]\n"), "spec.ports[0].containerPort", "1 to 65535"),
        (format!("{SERVICE}{image}  ports: [{{name: a, containerPort: 80}}]\n  ingress: {{pathRules: [{{port: b}}]}}\n"), "spec.ingress.pathRules[0].port", "`b`"),
        (format!("{SERVICE}{image}  autoscaling: {{minReplicas: 2}}\n"), "spec.autoscaling.maxReplicas", "is required"),
        (format!("{SERVICE}{image}  autoscaling: {{minReplicas: 5, maxReplicas: 2}}\n"), "spec.autoscaling.maxReplicas", "below minReplicas"),
        (format!("{SERVICE}{image}  pdb: {{minAvailable: 1, maxUnavailable: 1}}\n"), "spec.pdb.maxUnavailable", "set one"),
        (format!("{SERVICE}{image}  strategy: BlueGreen\n"), "spec.strategy", "BlueGreen"),
        (format!("{SERVICE}{image}  livenessProbe: {{port: 80}}\n"), "spec.livenessProbe.path", "tcpSocket"),
        (format!("{SERVICE}{image}  serviceMonitor: {{port: metrics}}\n  ports: [{{name: http, containerPort: 80}}]\n"), "spec.serviceMonitor.port", "metrics"),
        (format!("{SERVICE}{image}  kmsSecrets: [{{projectSlug: p}}]\n"), "spec.kmsSecrets[0].managedSecretName", "is required"),
        (format!("{SERVICE}{image}  kmsSecrets: [{{managedSecretName: s, resyncInterval: 5}}]\n"), "spec.kmsSecrets[0].resyncInterval", "minimum of 10"),
        (format!("{SERVICE}{image}  env: {{A: b}}\n"), "spec.env", "must be an array, not an object"),
        // Lists, maps and strings are bounded, those a render multiplies tightest.
        (format!("{SERVICE}{image}  ingress: {{hosts: [{}]}}\n", vec!["a.example"; 33].join(", ")), "spec.ingress.hosts", "at most 32 items"),
        (format!("{SERVICE}{image}  labels: {{team: {}}}\n", "x".repeat(64)), "spec.labels.team", "at most 63"),
        (format!("{SERVICE}{image}  env: [{}]\n", vec!["{name: A}"; 513].join(", ")), "spec.env", "at most 512 items"),
        (format!("{SERVICE}{image}  sidecars: [{{name: s, command: [{}]}}]\n", vec!["x"; 257].join(", ")), "spec.sidecars[0].command", "at most 256 items"),
        (format!("{DATASTORE}{image}{storage}  serviceAliases: [{}]\n", (0..17).map(|i| format!("a{i}")).collect::<Vec<_>>().join(", ")), "spec.serviceAliases", "at most 16 items"),
        (format!("{DATASTORE}{image}\n"), "spec.storage", "is required"),
        (format!("{DATASTORE}{image}  storage: {{size: fifty}}\n"), "spec.storage.size", "not a quantity"),
        (format!("{DATASTORE}{image}  storage: {{size: 50GB}}\n"), "spec.storage.size", "not a quantity"),
        (format!("{DATASTORE}{image}{storage}  type: oracle\n"), "spec.type", "must be one of \"datastore\""),
        (format!("{DATASTORE}{image}  storage: {{size: 1Gi, retentionPolicy: Keep}}\n"), "spec.storage.retentionPolicy", "Keep"),
        (format!("{DATASTORE}{image}{storage}  serviceAliases: [db]\n"), "spec.serviceAliases[0]", "already"),
        (format!("{DATASTORE}{image}{storage}  serviceAliases: [Bad_Alias]\n"), "spec.serviceAliases[0]", "DNS label"),
        (format!("{DATASTORE}{image}{storage}  backup: {{schedule: daily}}\n"), "spec.backup.schedule", "cron"),
        // A backup that lacks its S3 target or credentials is incomplete, not invalid: the rest
        // renders with a warning (cli::an_incomplete_optional_feature_renders_the_rest_with_a_warning).
        (format!("{DATASTORE}{image}{storage}  backup: {{schedule: '@daily', retentionDays: 0}}\n"), "spec.backup.retentionDays", "at least 1"),
        (format!("{}{image}{storage}  type: postgresql\n", header("KV")), "spec.type", "contradicts the Kind"),
        (format!("{}{image}{storage}  type: minio\n", header("SQL")), "spec.type", "contradicts the Kind"),
        (format!("{}{image}{storage}  credentialsSecret: c\n  backup: {{schedule: '@daily', s3Endpoint: e, s3Bucket: b, s3CredentialsSecret: c}}\n", header("DocDB")), "spec.backup", "not supported"),
        ("apiVersion: storage.mydatabase.io/v1alpha1\nkind: KVCluster\nmetadata: {name: kv}\nspec: {}\n".into(), "spec.size", "is required"),
        ("apiVersion: storage.mydatabase.io/v1alpha1\nkind: KVCluster\nmetadata: {name: kv}\nspec: {size: 0}\n".into(), "spec.size", "between 1 and 1000"),
        ("apiVersion: hanzo.ai/v1\nkind: Service\nmetadata: {name: Web_App}\nspec: {image: {repository: x}}\n".into(), "metadata.name", "DNS label"),
    ];
    let mut wrong = Vec::new();
    for (yaml, field, fragment) in cases {
        let r = resource(&yaml);
        // The host refuses what the Kind's schema refuses; the plugin the rest.
        let said: Option<Vec<(String, String)>> = match registry().render(&r) {
            Err(RenderError::Plugin {
                error: PluginError::Render { field, message },
                ..
            }) => Some(vec![(field, message)]),
            // Every problem of the spec at once: the one expected is among them.
            Err(RenderError::InvalidSpec(problems)) => Some(
                problems
                    .0
                    .into_iter()
                    .map(|p| (p.field, p.message))
                    .collect(),
            ),
            _ => None,
        };
        match said {
            Some(said) => {
                if !said
                    .iter()
                    .any(|(f, message)| f == field && message.contains(fragment))
                {
                    wrong.push(format!(
                        "for:\n{yaml}expected {field} (`{fragment}`), got {said:?}"
                    ));
                }
            }
            None => wrong.push(format!(
                "for:\n{yaml}expected a render error on {field}, got {:?}",
                registry().render(&r)
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn a_matching_facade_type_is_accepted() {
    let r = resource(&format!(
        "{}  image: {{repository: x}}\n  storage: {{size: 1Gi}}\n  type: valkey\n",
        header("KV")
    ));
    assert!(registry().render(&r).is_ok());
}

#[test]
fn unknown_kinds_and_versions_are_refused() {
    let r = resource("apiVersion: hanzo.ai/v1\nkind: Database\nmetadata: {name: a}\nspec: {}\n");
    let e = registry().render(&r).unwrap_err();
    assert!(matches!(e, RenderError::NoPlugin { .. }), "{e}");
    let r = resource("apiVersion: hanzo.ai/v2\nkind: Service\nmetadata: {name: a}\nspec: {}\n");
    let e = registry().render(&r).unwrap_err();
    assert!(
        e.to_string().contains("served versions: hanzo.ai/v1"),
        "{e}"
    );
}
