//! Monitoring as a platform team wires it: the metrics a running operator exports (scraped from
//! it on the control plane, linted by promtool), and the chart's alerts and Grafana dashboard,
//! whose every query must ask for series the operator exports, and whose alerts fire (promtool
//! test rules) on the series that say something is wrong.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::cluster::{Operator, WEB, apply, cluster, wait_ready};
use crate::support::root;

fn promtool() -> PathBuf {
    testenv::promtool().unwrap_or_else(|e| panic!("promtool: {e}"))
}

/// The metric names a PromQL expression selects: each name written before a `{` selector.
fn selected(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes: Vec<char> = expr.chars().collect();
    for (i, c) in bytes.iter().enumerate() {
        if *c != '{' {
            continue;
        }
        let name: String = bytes[..i]
            .iter()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '_' || **c == ':')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

/// The chart rendered with its alerts and dashboard, as documents.
fn rendered() -> Vec<Value> {
    let helm = testenv::helm().unwrap();
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let out = Command::new(helm)
        .args([
            "template",
            "wasm-operator",
            "charts/wasm-operator",
            "--namespace",
            "wasm-operator",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.dashboard.enabled=true",
        ])
        .current_dir(root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    host::documents::parse("chart", &String::from_utf8_lossy(&out.stdout))
        .unwrap()
        .into_iter()
        .map(|d| d.value)
        .collect()
}

/// Every query of the chart's alerts and dashboard, with where it is.
fn queries(docs: &[Value]) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("the PrometheusRule");
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            queries.push((
                format!("alert {}", r["alert"].as_str().unwrap()),
                r["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "wasm-operator-dashboard")
        .expect("the dashboard's ConfigMap");
    let json: Value =
        serde_json::from_str(dashboard["data"]["wasm-operator.json"].as_str().unwrap()).unwrap();
    for panel in json["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push((
                format!("panel {:?}", panel["title"].as_str().unwrap()),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alerts_and_the_dashboard_ask_for_what_the_operator_exports() {
    // What a running operator exports, having reconciled a Service.
    let cp = cluster();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "monitoring").await.unwrap();
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    apply(cp, &ns, WEB);
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    let scraped = op.scrape();
    let body = scraped
        .split_once("\r\n\r\n")
        .map_or(scraped.as_str(), |(_, b)| b)
        .to_owned();
    op.stop().await;
    // What it can export: each series name, whether it has samples yet or not (a family without
    // samples is left out of a scrape).
    let metrics = host::operator::metrics::Metrics::default();
    let names = metrics.series();
    // Those with samples are among them.
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        assert!(
            names.contains(&name),
            "{name} is exported but not listed by Metrics::series"
        );
    }
    // The series people look for, with values.
    for series in [
        "leader_election_master_status{name=\"wasm-operator\"} 1",
        "wasm_operator_build_info{",
        "wasm_operator_plugin_info{plugin=\"service\"",
        "workqueue_adds_total{name=\"services.hanzo.ai\"}",
        "workqueue_depth{name=\"services.hanzo.ai\"}",
        "workqueue_queue_duration_seconds_bucket{",
        "workqueue_work_duration_seconds_count{name=\"services.hanzo.ai\"}",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
    ] {
        assert!(body.contains(series), "no {series} in:\n{body}");
    }

    // promtool lints the exposition as Prometheus reads it (the text format: no Accept header).
    let mut lint = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        lint.stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
    }
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    // Every alert and panel selects series the operator exports.
    let docs = rendered();
    let mut missing = Vec::new();
    for (place, expr) in queries(&docs) {
        let selects = selected(&expr);
        assert!(!selects.is_empty(), "{place} selects nothing: {expr}");
        for name in selects {
            if !names.contains(&name) {
                missing.push(format!("{place}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "series the operator does not export:\n{}\nexported: {names:?}",
        missing.join("\n")
    );

    // The alerts pass promtool's checks, and fire when they should (tests/monitoring).
    let dir = tempfile::tempdir().unwrap();
    let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    let rules = serde_json::json!({ "groups": rule["spec"]["groups"] });
    std::fs::write(dir.path().join("rules.yaml"), rules.to_string()).unwrap();
    std::fs::copy(
        root().join("tests/monitoring/alerts-test.yaml"),
        dir.path().join("alerts-test.yaml"),
    )
    .unwrap();
    for args in [
        vec!["check", "rules", "rules.yaml"],
        vec!["test", "rules", "alerts-test.yaml"],
    ] {
        let out = Command::new(promtool())
            .args(&args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn queries_are_read_for_the_names_they_select() {
    assert_eq!(
        selected("sum by (le) (rate(a_b_bucket{x=\"1\"}[5m])) / c:d{y=\"{\"}"),
        ["a_b_bucket", "c:d"]
    );
}
