//! One namespace floods the operator, run as it ships (the image's binary) and as the chart runs
//! it (its flags, its memory limit, an empty compile cache as in a new pod):
//! Services at the largest sizes their CRD admits, resources of a plugin whose every render
//! grows to the memory cap, and others whose every render runs to the deadline (retried with
//! backoff, for ever), all there before the operator starts (as at a failover, when every
//! resource is rendered again). The operator stays alive and under its memory limit, and a plain
//! resource of another namespace reconciles within a minute.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::ControlPlane;

use crate::support::cluster::{
    WEB, apply, cluster, condition, get, http_get, install_crds, kubectl, kubectl_ok, poll, sum,
};

/// Resources of each kind in the flooding namespace, as in the report this test answers.
const FLOOD: usize = 48;

/// Resources whose renders run to the deadline, retried with backoff: each keeps one of the
/// calls in flight busy for the whole deadline, again and again.
const LOOPERS: usize = 16;

/// The `host` container's arguments and memory limit as the chart renders them by default.
fn chart_run() -> (Vec<String>, u64) {
    let rendered = crate::chart::template(&[]);
    let docs = host::documents::parse("chart", &rendered).expect("the chart renders YAML");
    let deployment = docs
        .iter()
        .map(|d| &d.value)
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart renders a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let limit = container["resources"]["limits"]["memory"]
        .as_str()
        .expect("the chart sets a memory limit");
    let limit = host::units::parse_bytes(limit).expect("a size");
    (args, u64::try_from(limit).unwrap())
}

/// The `maxItems` of a list in the spec of the installed CRD `crd`, by its path under `spec`.
fn max_items(cp: &ControlPlane, crd: &str, path: &[&str]) -> usize {
    let out = kubectl_ok(cp, &["get", "crd", crd, "-o", "json"]);
    let crd: Value = serde_json::from_str(&out).unwrap();
    let mut schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    for field in path {
        schema = &schema["properties"][field];
    }
    let max = schema["maxItems"]
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} has no maxItems: {schema}"));
    usize::try_from(max).unwrap()
}

/// A Service `name` with `hosts` Ingress hosts and `rules` path rules (every host gets every
/// rule: the Ingress holds their product).
fn wide_service(name: &str, hosts: usize, rules: usize) -> String {
    let hosts: Vec<String> = (0..hosts)
        .map(|i| format!("h{i}-{}.example.com", "x".repeat(40)))
        .collect();
    let rules: Vec<String> = (0..rules)
        .map(|i| format!("{{ path: /p{i}/{} }}", "y".repeat(40)))
        .collect();
    format!(
        "apiVersion: hanzo.ai/v1
kind: Service
metadata: {{ name: {name} }}
spec:
  image: {{ repository: ghcr.io/hanzoai/web, tag: v1 }}
  ports: [{{ name: http, containerPort: 8080 }}]
  ingress:
    hosts: [{}]
    pathRules: [{}]
",
        hosts.join(", "),
        rules.join(", ")
    )
}

fn hostile(name: &str, mode: &str) -> String {
    format!(
        "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {{ name: {name} }}\nspec: {{ mode: {mode} }}\n"
    )
}

/// The peak resident memory of process `pid` (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// How many resources of `what` (`plural.group`) in `ns`, named `prefix...`, have a `Ready`
/// condition.
fn reported(cp: &ControlPlane, ns: &str, what: &str, prefix: &str) -> usize {
    let (ok, out) = kubectl(cp, &["get", "-n", ns, what, "-o", "json"]);
    if !ok {
        return 0;
    }
    let list: Value = serde_json::from_str(&out).unwrap_or_default();
    list["items"].as_array().map_or(0, |items| {
        items
            .iter()
            .filter(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(prefix))
                    && !condition(o, "Ready").0.is_empty()
            })
            .count()
    })
}

/// Kills the operator when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_flooding_the_operator_neither_takes_it_down_nor_holds_up_another() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let admin = cp.client().await.unwrap();
    let home = cp.namespace(&admin, "flood-op").await.unwrap();
    let flood = cp.namespace(&admin, "flood").await.unwrap();
    let quiet = cp.namespace(&admin, "quiet").await.unwrap();
    install_crds(cp, test_guests::HOSTILE);

    // The report's Service, 400 hosts by 400 path rules, is refused by the API server itself.
    let hosts = max_items(cp, "services.hanzo.ai", &["ingress", "hosts"]);
    let rules = max_items(cp, "services.hanzo.ai", &["ingress", "pathRules"]);
    assert!(
        hosts < 400 && rules < 400,
        "hosts ≤ {hosts}, rules ≤ {rules}"
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), wide_service("oversized", 400, 400)).unwrap();
    let (took, out) = kubectl(
        cp,
        &[
            "apply",
            "-n",
            &flood,
            "-f",
            &file.path().display().to_string(),
        ],
    );
    assert!(!took && out.contains("must have at most"), "{out}");

    // The flood: the largest Services the CRD admits, and renders that grow to the memory cap.
    let mut yaml = String::new();
    for i in 0..FLOOD {
        yaml.push_str(&wide_service(&format!("wide-{i}"), hosts, rules));
        yaml.push_str("---\n");
        yaml.push_str(&hostile(&format!("hoarder-{i}"), "alloc"));
        yaml.push_str("---\n");
        if i < LOOPERS {
            yaml.push_str(&hostile(&format!("looper-{i}"), "loop"));
            yaml.push_str("---\n");
        }
    }
    apply(cp, &flood, &yaml);

    let (chart_args, limit) = chart_run();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let args: Vec<String> = chart_args
        .into_iter()
        .filter(|a| {
            !a.starts_with("--metrics-addr")
                && !a.starts_with("--metrics-secure")
                && !a.starts_with("--health-probe-addr")
                && !a.starts_with("--log-format")
        })
        .chain([
            // Scraped here over plain HTTP (the secure metrics are the image test's).
            "--metrics-secure=false".into(),
            format!("--metrics-addr={metrics}"),
            format!("--lease-namespace={home}"),
            format!("--watch-namespace={flood},{quiet}"),
            format!("--plugin={}", test_guests::HOSTILE),
            "--identity=flood".into(),
        ])
        .collect();
    let log = tempfile::NamedTempFile::new().unwrap();
    // An empty cache, as in a new pod: every plugin is compiled at start, within the limit too.
    let cache = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let child = Command::new(crate::image::binary(bin.path()))
        .args(&args)
        .env("KUBECONFIG", cp.kubeconfig())
        .env("WASM_OPERATOR_CACHE", cache.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("host run starts");
    let pid = child.id();
    let mut operator = Running(child);
    let alive = |op: &mut Running| {
        let exited = op.0.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "the operator exited ({exited:?}): {}",
            std::fs::read_to_string(log.path()).unwrap_or_default()
        );
    };

    // A plain Service of another namespace, once the operator has started on the flood: its
    // first reconciliations of the flood have begun.
    poll(
        "the operator to begin on the flood",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            alive(&mut operator);
            let scraped = http_get(metrics, "/metrics");
            sum(&scraped, "controller_runtime_active_workers", None)
                + sum(&scraped, "controller_runtime_reconcile_total", None)
                > 0.0
        },
        || std::fs::read_to_string(log.path()).unwrap_or_default(),
    )
    .await;
    apply(cp, &quiet, WEB);
    let applied = Instant::now();
    poll(
        "the quiet namespace's Service to be Ready",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            alive(&mut operator);
            get(cp, &quiet, "services.hanzo.ai/web")
                .is_some_and(|o| condition(&o, "Ready").0 == "True")
        },
        || {
            format!(
                ": {:?}\n{}",
                get(cp, &quiet, "services.hanzo.ai/web"),
                std::fs::read_to_string(log.path()).unwrap_or_default()
            )
        },
    )
    .await;
    let quiet_took = applied.elapsed();

    // Every resource of the flood is rendered and reported on, the operator alive throughout.
    let started = Instant::now();
    let hostiles = "hostiles.test.wasm-operator.dev";
    let all = (FLOOD, FLOOD, LOOPERS);
    let counts = std::cell::Cell::new((0, 0, 0));
    poll(
        "every resource of the flood to be reported on",
        Duration::from_secs(300),
        Duration::from_secs(1),
        async || {
            alive(&mut operator);
            counts.set((
                reported(cp, &flood, "services.hanzo.ai", "wide-"),
                reported(cp, &flood, hostiles, "hoarder-"),
                reported(cp, &flood, hostiles, "looper-"),
            ));
            counts.get() == all
        },
        || format!(": {:?} of {all:?}", counts.get()),
    )
    .await;
    alive(&mut operator);
    let flood_took = started.elapsed() + quiet_took;
    assert_eq!(counts.get(), all, "not all reported in 300 s");
    let hoarder = get(cp, &flood, "hostiles.test.wasm-operator.dev/hoarder-0").unwrap();
    let (_, reason, message) = condition(&hoarder, "Ready");
    assert_eq!(reason, "PluginMemoryExceeded", "{message}");
    let ingress = get(cp, &flood, "ingress/wide-0").expect("the wide Service's Ingress");
    let paths: usize = ingress["spec"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["http"]["paths"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(paths, hosts * rules);

    let looper = get(cp, &flood, "hostiles.test.wasm-operator.dev/looper-0").unwrap();
    assert_eq!(condition(&looper, "Ready").1, "PluginTimeout");
    let scraped = http_get(metrics, "/metrics");
    let metric = |name: &str| {
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let (waits, waited) = (
        metric("wasm_operator_render_budget_wait_seconds_count"),
        metric("wasm_operator_render_budget_wait_seconds_sum"),
    );
    let timeouts = metric("wasm_operator_render_budget_timeouts_total");
    let peak = peak_rss(pid);
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    eprintln!(
        "| what | value |\n|---|---|\n\
         | flood | {FLOOD} Services ({hosts} hosts × {rules} path rules), {FLOOD} renders to the memory cap, {LOOPERS} to the deadline (retried) |\n\
         | quiet namespace's Service Ready after | {:.1} s |\n\
         | whole flood reported after | {:.1} s |\n\
         | plugin calls, their mean wait for the budget | {waits}, {:.2} s |\n\
         | reconciliations that left their slot after waiting 20 s | {timeouts} |\n\
         | operator peak RSS (VmHWM) | {:.1} MiB |\n\
         | chart memory limit | {:.1} MiB |\n\
         | peak / limit | {:.2} |",
        quiet_took.as_secs_f64(),
        flood_took.as_secs_f64(),
        waited / waits,
        mib(peak),
        mib(limit),
        peak as f64 / limit as f64,
    );
    assert!(peak > 0, "no VmHWM for {pid}");
    assert!(
        peak < limit,
        "peak RSS {:.1} MiB over the chart's limit {:.1} MiB",
        mib(peak),
        mib(limit)
    );
    drop(operator);
    let _ = home;
}
