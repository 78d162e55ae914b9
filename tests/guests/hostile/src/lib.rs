//! A plugin that misbehaves on request (`spec.mode`), to prove that the host contains it.
//!
//! Modes: `ok` (one ConfigMap), `panic`, `loop`, `alloc` (grows memory without bound),
//! `huge-output` (more bytes than the host accepts), `many-manifests` (a million tiny ones, within
//! the byte cap), `other-namespace`, `undeclared-kind`, `no-namespace`, `bad-name`, `error` (a
//! typed render error), `long-error` (a 16 KiB field and a 64 KiB message, within the output cap),
//! `huge-error` (a 5 MiB message, over it), and `probe`, which reports in a ConfigMap what the
//! sandbox let it see: environment, arguments, clock, randomness, files; and `counter`, which
//! counts its renders in a ConfigMap: impure, as a second render in one instance shows.
//!
//! Contract 1.1 (each renders the `ok` ConfigMap with its mode): `warn` (one warning),
//! `many-warnings` (a hundred, each 4 KiB long), `undeclared-status` (status fields its schema
//! does not declare, one of them the host's `conditions`), `mistyped-status` (a declared field of
//! the wrong type) and `status-loop` (a status call that never returns).
//!
//! Waits, each of which then returns one ConfigMap: `sleep` (`std::thread::sleep` for 20 s),
//! `sleep-forever` (for `Duration::MAX`) and `poll` (`wasi:io/poll` on a 20 s
//! `subscribe-duration` and on a `subscribe-instant` 20 s from now, called directly, as std's
//! sleep does not use `poll`); and `wait-for-time`, which sleeps 1 ms at a time until the
//! monotonic clock has moved by 1 s.

use guest_kit::{
    Context, GroupVersionKind, KindInfo, Plugin, PluginInfo, Reference, ReferenceTarget,
    RenderError, Resource, Result,
};
use serde_json::{Value, json};

/// The plugin.
pub struct Hostile;

/// Renders so far in this instance, for `counter`.
static RENDERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

guest_kit::export_plugin!(Hostile);

fn config_map(resource: &Resource, name: &str, namespace: &str, data: Value) -> Value {
    let _ = resource;
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": namespace },
        "data": data,
    })
}

fn probe() -> Value {
    let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    let args: Vec<String> = std::env::args().collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs().to_string())
        .unwrap_or_else(|e| format!("error: {e}"));
    let instant = format!("{:?}", std::time::Instant::now().elapsed());
    // A randomly seeded hash shows whether the random source is fixed.
    let hash = {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one("probe").to_string()
    };
    let files = match std::fs::read_dir("/") {
        Ok(d) => format!("readable: {} entries", d.count()),
        Err(e) => format!("error: {e}"),
    };
    let etc = match std::fs::read_to_string("/etc/passwd") {
        Ok(_) => "readable".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    let net = match std::net::TcpStream::connect("127.0.0.1:1") {
        Ok(_) => "connected".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    json!({
        "env": env.join(","),
        "args": args.join(","),
        "now": now,
        "elapsed": instant,
        "hash": hash,
        "readDir": files,
        "readFile": etc,
        "connect": net,
    })
}

/// Waits through `wasi:io/poll` on the monotonic clock: 20 s by duration, then until 20 s past
/// the clock's reading.
fn poll() {
    #[cfg(target_family = "wasm")]
    {
        use wasip2::clocks::monotonic_clock;
        const TWENTY_SECONDS: u64 = 20_000_000_000;
        let by_duration = monotonic_clock::subscribe_duration(TWENTY_SECONDS);
        wasip2::io::poll::poll(&[&by_duration]);
        let by_instant = monotonic_clock::subscribe_instant(
            monotonic_clock::now().saturating_add(TWENTY_SECONDS),
        );
        wasip2::io::poll::poll(&[&by_instant]);
    }
}

impl Plugin for Hostile {
    fn describe(_ctx: &Context) -> PluginInfo {
        PluginInfo {
            name: "hostile".into(),
            version: if cfg!(feature = "next-version") {
                "0.0.1"
            } else {
                "0.0.0"
            }
            .into(),
            kinds: vec![KindInfo {
                group: "test.wasm-operator.dev".into(),
                versions: vec!["v1".into()],
                kind: "Hostile".into(),
                plural: if cfg!(feature = "climbing-plural") {
                    "../../../x"
                } else {
                    "hostiles"
                }
                .into(),
                short_names: vec![],
                engine: None,
                spec_schema: json!({ "type": "object", "properties": {
                    "mode": { "type": "string" },
                    "secretName": { "type": "string" },
                } }),
                printer_columns: vec![],
                status_schema: Some(
                    json!({ "type": "object", "properties": { "mode": { "type": "string" } } }),
                ),
                // Contract 1.2: a Secret it names (and never uses).
                references: vec![Reference::new("spec.secretName", ReferenceTarget::Secret)],
            }],
            // Two versions of one kind: the host must treat them as one child.
            children: vec![
                GroupVersionKind::new("", "v1", "ConfigMap"),
                GroupVersionKind::new("autoscaling", "v1", "HorizontalPodAutoscaler"),
                GroupVersionKind::new("autoscaling", "v2", "HorizontalPodAutoscaler"),
            ],
        }
    }

    fn render_reported(r: &Resource, ctx: &Context) -> Result<guest_kit::Rendered> {
        let objects = Self::render(r, ctx)?;
        let mode = r.spec.get("mode").and_then(Value::as_str).unwrap_or("ok");
        let warnings = match mode {
            "warn" => vec![guest_kit::Warning::new("spec.mode", "was asked to warn")],
            // More warnings than the host keeps, each longer than a condition holds.
            "many-warnings" => (0..100)
                .map(|i| guest_kit::Warning::new(format!("spec.w{i}"), "w".repeat(4096)))
                .collect(),
            _ => Vec::new(),
        };
        Ok(guest_kit::Rendered { objects, warnings })
    }

    fn status(
        r: &Resource,
        _children: &[guest_kit::ObservedChild],
        _ctx: &Context,
    ) -> Result<serde_json::Map<String, Value>> {
        let mode = r.spec.get("mode").and_then(Value::as_str).unwrap_or("ok");
        let mut fields = serde_json::Map::new();
        match mode {
            // A field its schema does not declare, and one the host owns.
            "undeclared-status" => {
                fields.insert("other".into(), 1.into());
                fields.insert("conditions".into(), json!([]));
            }
            // A declared field of the wrong type.
            "mistyped-status" => {
                fields.insert("mode".into(), 5.into());
            }
            "status-loop" => {
                let mut i: u64 = 0;
                loop {
                    i = std::hint::black_box(i.wrapping_add(1));
                }
            }
            _ => {
                fields.insert("mode".into(), mode.into());
            }
        }
        Ok(fields)
    }

    fn render(r: &Resource, _ctx: &Context) -> Result<Vec<Value>> {
        let mode = r.spec.get("mode").and_then(Value::as_str).unwrap_or("ok");
        let ns = r.namespace.as_str();
        Ok(match mode {
            "ok" if cfg!(feature = "next-version") => vec![config_map(
                r,
                &r.name,
                ns,
                json!({ "mode": "ok", "version": "next" }),
            )],
            "ok" => vec![config_map(r, &r.name, ns, json!({ "mode": "ok" }))],
            // Contract 1.1: warnings with a good render, and a status that misbehaves.
            "warn" | "many-warnings" | "undeclared-status" | "mistyped-status" | "status-loop" => {
                vec![config_map(r, &r.name, ns, json!({ "mode": mode }))]
            }
            // An autoscaling/v2 HPA, while the plugin also declares v1 (which the host may watch).
            "hpa-v2" => vec![json!({
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": { "name": r.name, "namespace": ns },
                "spec": {
                    "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": r.name },
                    "minReplicas": 1,
                    "maxReplicas": 2,
                },
            })],
            "probe" => vec![config_map(r, &r.name, ns, probe())],
            "counter" => {
                let n = RENDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                vec![config_map(
                    r,
                    &r.name,
                    ns,
                    json!({ "renders": n.to_string() }),
                )]
            }
            "panic" => panic!("hostile guest panicked on purpose"),
            "loop" => {
                let mut i: u64 = 0;
                loop {
                    i = std::hint::black_box(i.wrapping_add(1));
                }
            }
            "alloc" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "huge-output" => {
                let big = "x".repeat(1 << 20);
                (0..8)
                    .map(|i| config_map(r, &format!("{}-{i}", r.name), ns, json!({ "x": big })))
                    .collect()
            }
            "other-namespace" => vec![config_map(r, &r.name, "kube-system", json!({}))],
            "undeclared-kind" => vec![json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": { "name": "pwned" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
                "subjects": [{ "kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io" }],
            })],
            "no-namespace" => vec![json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": r.name },
                "data": {},
            })],
            "bad-name" => vec![config_map(r, "Not_A_Valid_Name", ns, json!({}))],
            "error" => return Err(RenderError::new("spec.mode", "was asked to fail")),
            // Built field by field: `RenderError::new` would shorten them, and a hostile guest
            // does not ask guest-kit to be polite.
            "long-error" => {
                return Err(RenderError {
                    field: format!("spec.{}", "f".repeat(16 << 10)),
                    message: "m".repeat(64 << 10),
                });
            }
            "huge-error" => {
                return Err(RenderError {
                    field: "spec.mode".into(),
                    message: "e".repeat(5 << 20),
                });
            }
            "many-manifests" => vec![json!({}); 1_000_000],
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(20));
                vec![config_map(r, &r.name, ns, json!({ "mode": "sleep" }))]
            }
            "sleep-forever" => {
                std::thread::sleep(std::time::Duration::MAX);
                vec![config_map(
                    r,
                    &r.name,
                    ns,
                    json!({ "mode": "sleep-forever" }),
                )]
            }
            "poll" => {
                poll();
                vec![config_map(r, &r.name, ns, json!({ "mode": "poll" }))]
            }
            "wait-for-time" => {
                let start = std::time::Instant::now();
                while start.elapsed() < std::time::Duration::from_secs(1) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                vec![config_map(
                    r,
                    &r.name,
                    ns,
                    json!({ "mode": "wait-for-time" }),
                )]
            }
            other => {
                return Err(RenderError::new(
                    "spec.mode",
                    format!("unknown mode `{other}`"),
                ));
            }
        })
    }
}
